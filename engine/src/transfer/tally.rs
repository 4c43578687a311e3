//! Counters of one run, read live by the progress bar and turned into the
//! JSON summary at the end.
//!
//! A pull also counts what it changed in its destination (added, updated,
//! removed) and builds the snapshot of what it staged; both are sums, so
//! the counters stay atomics and the snapshot one short lock per object,
//! never a list of objects.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_contract::summary::{Amount, Changes, SnapshotBuilder};
pub use ferry_contract::summary::{
    Counts, Failure, Operation, Resumed, Summary, VerifiedCounts, VerifiedKind, VerifyCost,
};

/// Failures kept in full for the summary; the count is always exact.
const FAILURES_KEPT: usize = 1000;

/// Live counters. All methods are cheap and lock-free except failure records.
#[derive(Debug, Default)]
pub struct Tally {
    objects_selected: AtomicU64,
    objects_transferred: AtomicU64,
    objects_skipped: AtomicU64,
    objects_failed: AtomicU64,
    bytes_selected: AtomicU64,
    bytes_transferred: AtomicU64,
    bytes_skipped: AtomicU64,
    bytes_failed: AtomicU64,
    verified: [AtomicU64; VerifiedKind::ALL.len()],
    resumed: AmountCounter,
    shared: AmountCounter,
    retries: AtomicU64,
    requests: AtomicU64,
    listing_done: std::sync::atomic::AtomicBool,
    failures: Mutex<Vec<Failure>>,
    added: AmountCounter,
    updated: AmountCounter,
    removed: AmountCounter,
    staged: Mutex<SnapshotBuilder>,
    /// A pull's destination filesystem as the run found it, before writing.
    disk: Mutex<Option<ferry_contract::DiskSpace>>,
    /// What verifying cost, counted where the hashing happens.
    pub verify: Arc<VerifyMeter>,
}

/// The cost of verification, counted by whatever hashes: the digests
/// computed as bytes stream past, the MD5 lanes, the read-back hashes.
///
/// Time is measured around the hashing steps, which compute and read from
/// the page cache without waiting for anything, so their time is time on a
/// core (a preempted step counts a little more than its CPU time).
#[derive(Debug, Default)]
pub struct VerifyMeter {
    nanos: AtomicU64,
    read_back: AtomicU64,
}

impl VerifyMeter {
    /// Runs one hashing step and counts its time.
    pub fn time<R>(&self, step: impl FnOnce() -> R) -> R {
        let started = Instant::now();
        let result = step();
        self.spent(started.elapsed());
        result
    }

    /// Counts time spent hashing, measured by the caller.
    pub fn spent(&self, time: Duration) {
        self.nanos.fetch_add(u64::try_from(time.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// Counts bytes read back from a written file to hash them.
    pub fn read_back(&self, bytes: u64) {
        self.read_back.fetch_add(bytes, Relaxed);
    }

    /// What was counted.
    pub fn cost(&self) -> VerifyCost {
        VerifyCost {
            cpu_seconds: Duration::from_nanos(self.nanos.load(Relaxed)).as_secs_f64(),
            read_back_bytes: self.read_back.load(Relaxed),
        }
    }
}

/// Objects and bytes, counted lock-free.
#[derive(Debug, Default)]
struct AmountCounter {
    objects: AtomicU64,
    bytes: AtomicU64,
}

impl AmountCounter {
    fn add(&self, objects: u64, bytes: u64) {
        self.objects.fetch_add(objects, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    fn load(&self) -> Amount {
        Amount { objects: self.objects.load(Relaxed), bytes: self.bytes.load(Relaxed) }
    }
}

/// How a transferred object was verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// Against a checksum of this kind (or by size only).
    As(VerifiedKind),
    /// Not verified (--verify none).
    Unverified,
}

/// A point-in-time copy of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Objects selected so far.
    pub objects_selected: u64,
    /// Objects finished: transferred, skipped or failed.
    pub objects_done: u64,
    /// Bytes selected so far.
    pub bytes_selected: u64,
    /// Bytes in place (transferred or skipped).
    pub bytes_done: u64,
    /// Whether the full set is known (listing or walk finished).
    pub listing_done: bool,
}

impl Tally {
    /// An object entered the run.
    pub fn selected(&self, size: u64) {
        self.objects_selected.fetch_add(1, Relaxed);
        self.bytes_selected.fetch_add(size, Relaxed);
    }

    /// Bytes reached their destination (called as data flows).
    pub fn bytes(&self, n: u64) {
        self.bytes_transferred.fetch_add(n, Relaxed);
    }

    /// Takes back bytes of an attempt that failed and will be redone.
    pub fn unbytes(&self, n: u64) {
        self.bytes_transferred.fetch_sub(n, Relaxed);
    }

    /// An object was copied and verified.
    pub fn transferred(&self, verified: Verified) {
        self.objects_transferred.fetch_add(1, Relaxed);
        if let Verified::As(kind) = verified {
            let index = VerifiedKind::ALL.iter().position(|k| *k == kind).expect("ALL lists every kind");
            self.verified[index].fetch_add(1, Relaxed);
        }
    }

    /// An object was finished from where an earlier run stopped, keeping
    /// `bytes` that run had already copied and verified.
    pub fn resumed(&self, bytes: u64) {
        self.resumed.add(1, bytes);
    }

    /// An object was put in place by a link to the copy in the pull's
    /// shared-objects directory: in place without a transfer, so skipped too.
    pub fn linked(&self, size: u64) {
        self.skipped(size);
        self.shared.add(1, size);
    }

    /// An object was already in place.
    pub fn skipped(&self, size: u64) {
        self.objects_skipped.fetch_add(1, Relaxed);
        self.bytes_skipped.fetch_add(size, Relaxed);
    }

    /// An object of `size` bytes failed (or was refused). Refused objects
    /// are counted as selected too: the user asked for them.
    pub fn failed(&self, key: impl Into<String>, size: u64, error: impl std::fmt::Display) {
        self.objects_failed.fetch_add(1, Relaxed);
        self.bytes_failed.fetch_add(size, Relaxed);
        let mut failures = self.failures.lock().expect("failures lock poisoned");
        if failures.len() < FAILURES_KEPT {
            failures.push(Failure { key: key.into(), error: error.to_string() });
        }
    }

    /// A pull staged an object whose path no earlier run had staged.
    pub fn added(&self, size: u64) {
        self.added.add(1, size);
    }

    /// A pull staged an object again over what an earlier run had staged
    /// at its path (the store's version changed, or the file did).
    pub fn updated(&self, size: u64) {
        self.updated.add(1, size);
    }

    /// A pull removed `objects` staged files of `bytes` in all, because
    /// their objects left the store.
    pub fn removed(&self, objects: u64, bytes: u64) {
        self.removed.add(objects, bytes);
    }

    /// A selected object is in place (copied or already there): it is part
    /// of the snapshot this pull stages. `key` is relative to the prefix,
    /// `version` the store's ETag or generation.
    pub fn in_place(&self, key: &str, version: &str, size: u64) {
        self.staged.lock().expect("snapshot lock poisoned").add(key, version, size);
    }

    /// Whether no object has failed so far: once the run has finished,
    /// every selected object is in place and verified.
    pub fn complete(&self) -> bool {
        self.objects_failed.load(Relaxed) == 0
    }

    /// What a pull changed in its destination so far.
    pub fn changes(&self) -> Changes {
        Changes { added: self.added.load(), updated: self.updated.load(), removed: self.removed.load() }
    }

    /// A request was retried.
    pub fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
    }

    /// A request was sent to the store.
    pub fn requested(&self) {
        self.requests.fetch_add(1, Relaxed);
    }

    /// The destination's filesystem as a pull found it before writing.
    pub fn measured(&self, disk: ferry_contract::DiskSpace) {
        *self.disk.lock().expect("not poisoned") = Some(disk);
    }

    /// What [`Tally::measured`] recorded, for live reports: while the run
    /// writes, others on the node count what it still has to write.
    pub fn disk(&self) -> Option<ferry_contract::DiskSpace> {
        self.disk.lock().expect("not poisoned").clone()
    }

    /// The set of objects is complete.
    pub fn listing_finished(&self) {
        self.listing_done.store(true, Relaxed);
    }

    /// Current progress.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            objects_selected: self.objects_selected.load(Relaxed),
            objects_done: self.objects_transferred.load(Relaxed)
                + self.objects_skipped.load(Relaxed)
                + self.objects_failed.load(Relaxed),
            bytes_selected: self.bytes_selected.load(Relaxed),
            bytes_done: self.bytes_transferred.load(Relaxed) + self.bytes_skipped.load(Relaxed),
            listing_done: self.listing_done.load(Relaxed),
        }
    }

    /// The final summary. A pull's carries what it changed, and, when every
    /// selected object of a finished listing is in place, the snapshot of
    /// what it staged: a partial run has staged no version of the dataset.
    pub fn summary(&self, operation: Operation, source: String, destination: String, elapsed: Duration) -> Summary {
        let transferred = self.bytes_transferred.load(Relaxed);
        let seconds = elapsed.as_secs_f64();
        let mut failures = self.failures.lock().expect("failures lock poisoned").clone();
        failures.sort_by(|a, b| a.key.cmp(&b.key));
        let complete = self.complete();
        let pull = operation == Operation::Pull;
        let snapshot = (pull && complete && self.listing_done.load(Relaxed))
            .then(|| self.staged.lock().expect("snapshot lock poisoned").finish());
        Summary {
            operation,
            source,
            destination,
            complete,
            objects: Counts {
                selected: self.objects_selected.load(Relaxed),
                transferred: self.objects_transferred.load(Relaxed),
                skipped: self.objects_skipped.load(Relaxed),
                failed: self.objects_failed.load(Relaxed),
            },
            bytes: Counts {
                selected: self.bytes_selected.load(Relaxed),
                transferred,
                skipped: self.bytes_skipped.load(Relaxed),
                failed: self.bytes_failed.load(Relaxed),
            },
            verified: VerifiedKind::ALL.iter().zip(&self.verified).fold(
                VerifiedCounts::default(),
                |mut counts, (kind, n)| {
                    counts.add(*kind, n.load(Relaxed));
                    counts
                },
            ),
            resumed: {
                let Amount { objects, bytes } = self.resumed.load();
                Resumed { objects, bytes }
            },
            retries: self.retries.load(Relaxed),
            requests: self.requests.load(Relaxed),
            seconds,
            throughput_bytes_per_second: if seconds > 0.0 { transferred as f64 / seconds } else { 0.0 },
            peak_rss_bytes: peak_rss_bytes(),
            failures_omitted: self.objects_failed.load(Relaxed).saturating_sub(failures.len() as u64),
            failures,
            changes: pull.then(|| self.changes()),
            snapshot,
            shared: self.shared.load(),
            verify_cost: self.verify.cost(),
            ..Summary::default()
        }
    }
}

/// The process's peak resident set size (Linux `VmHWM`), for the summary:
/// the memory limit is a promise, and this is the evidence.
pub fn peak_rss_bytes() -> Option<u64> {
    Some(process_status("VmHWM")? * 1024)
}

/// The number a field of `/proc/self/status` holds (`VmHWM` in KiB,
/// `Threads`, ...).
pub fn process_status(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.strip_prefix(field).is_some_and(|rest| rest.starts_with(':')))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// One line for humans about a run.
pub fn one_line(summary: &Summary) -> String {
    let rate = human_bytes(summary.throughput_bytes_per_second as u64);
    let operation = match summary.operation {
        Operation::Pull => "pull",
        Operation::Push => "push",
    };
    let head = format!(
        "{operation} {}: {} of {} objects transferred, {} skipped, {} failed; {} in {:.1}s ({rate}/s), {} retries",
        if summary.complete { "complete" } else { "incomplete" },
        summary.objects.transferred,
        summary.objects.selected,
        summary.objects.skipped,
        summary.objects.failed,
        human_bytes(summary.bytes.transferred),
        summary.seconds,
        summary.retries,
    );
    let head = match summary.concurrency {
        Some(used) if used.adaptive => {
            format!("{head}; concurrency auto: {} requests at the end, at most {}", used.last, used.peak)
        }
        _ => head,
    };
    let head = match summary.verify_cost {
        cost if cost.is_none() => head,
        cost => format!(
            "{head}; verified {} against checksums in {:.2} CPU s of hashing, {} read back",
            summary.verified.checksum,
            cost.cpu_seconds,
            human_bytes(cost.read_back_bytes)
        ),
    };
    match summary.failures.first() {
        Some(first) => format!("{head}; first failure: {}: {}", first.key, first.error),
        None => head,
    }
}

/// Formats a byte count with binary units (the operator's messages use it too).
pub use ferry_contract::size::human_bytes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_a_failure_is_incomplete_and_says_why() {
        let tally = Tally::default();
        tally.selected(10);
        tally.selected(5);
        tally.bytes(10);
        tally.transferred(Verified::As(VerifiedKind::Crc32c));
        tally.failed("b", 5, "checksum mismatch");
        let summary = tally.summary(Operation::Pull, "s3://b/p/".into(), "/d".into(), Duration::from_secs(2));
        assert!(!summary.complete);
        assert_eq!((summary.objects.failed, summary.bytes.failed), (1, 5));
        assert!(one_line(&summary).contains("first failure: b: checksum mismatch"));
        assert_eq!(summary.throughput_bytes_per_second, 5.0);
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }

    #[test]
    fn a_pull_reports_its_changes_and_a_snapshot_only_when_complete() {
        let tally = Tally::default();
        tally.added(10);
        tally.updated(5);
        tally.updated(7);
        tally.removed(3, 300);
        tally.in_place("a", "e1", 10);
        tally.in_place("b", "e2", 5);
        let summary = |tally: &Tally, operation| tally.summary(operation, "s".into(), "d".into(), Duration::ZERO);

        // The listing is not finished: nothing says every object was seen.
        assert_eq!(summary(&tally, Operation::Pull).snapshot, None);
        tally.listing_finished();
        let pulled = summary(&tally, Operation::Pull);
        let changes = pulled.changes.unwrap();
        assert_eq!((changes.added.objects, changes.added.bytes), (1, 10));
        assert_eq!((changes.updated.objects, changes.updated.bytes), (2, 12));
        assert_eq!((changes.removed.objects, changes.removed.bytes), (3, 300));
        let mut expected = SnapshotBuilder::default();
        expected.add("b", "e2", 5);
        expected.add("a", "e1", 10);
        assert_eq!(pulled.snapshot, Some(expected.finish()));

        let pushed = summary(&tally, Operation::Push);
        assert_eq!((pushed.changes, pushed.snapshot), (None, None), "a push stages no dataset version");

        tally.failed("c", 1, "boom");
        assert_eq!(summary(&tally, Operation::Pull).snapshot, None, "an incomplete pull has no snapshot");
    }
}
