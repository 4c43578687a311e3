//! Counters of one run, read live by the progress bar and turned into the
//! JSON summary at the end.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub use ferry_contract::summary::{Counts, Failure, Operation, Summary, VerifiedCounts};

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
    verified_checksum: AtomicU64,
    verified_size: AtomicU64,
    retries: AtomicU64,
    listing_done: std::sync::atomic::AtomicBool,
    failures: Mutex<Vec<Failure>>,
}

/// How a transferred object was verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// Against a checksum from the store.
    Checksum,
    /// By size only (the store offered no usable checksum, or --verify size).
    Size,
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
        match verified {
            Verified::Checksum => self.verified_checksum.fetch_add(1, Relaxed),
            Verified::Size => self.verified_size.fetch_add(1, Relaxed),
            Verified::Unverified => 0,
        };
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

    /// A request was retried.
    pub fn retried(&self) {
        self.retries.fetch_add(1, Relaxed);
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

    /// The final summary.
    pub fn summary(&self, operation: Operation, source: String, destination: String, elapsed: Duration) -> Summary {
        let transferred = self.bytes_transferred.load(Relaxed);
        let seconds = elapsed.as_secs_f64();
        let mut failures = self.failures.lock().expect("failures lock poisoned").clone();
        failures.sort_by(|a, b| a.key.cmp(&b.key));
        Summary {
            operation,
            source,
            destination,
            complete: self.objects_failed.load(Relaxed) == 0,
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
            verified: VerifiedCounts {
                checksum: self.verified_checksum.load(Relaxed),
                size_only: self.verified_size.load(Relaxed),
            },
            retries: self.retries.load(Relaxed),
            seconds,
            throughput_bytes_per_second: if seconds > 0.0 { transferred as f64 / seconds } else { 0.0 },
            peak_rss_bytes: peak_rss_bytes(),
            failures_omitted: self.objects_failed.load(Relaxed).saturating_sub(failures.len() as u64),
            failures,
            ..Summary::default()
        }
    }
}

/// The process's peak resident set size (Linux `VmHWM`), for the summary:
/// the memory limit is a promise, and this is the evidence.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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
    match summary.failures.first() {
        Some(first) => format!("{head}; first failure: {}: {}", first.key, first.error),
        None => head,
    }
}

/// Formats a byte count with binary units.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_with_a_failure_is_incomplete_and_says_why() {
        let tally = Tally::default();
        tally.selected(10);
        tally.selected(5);
        tally.bytes(10);
        tally.transferred(Verified::Checksum);
        tally.failed("b", 5, "checksum mismatch");
        let summary = tally.summary(Operation::Pull, "s3://b/p/".into(), "/d".into(), Duration::from_secs(2));
        assert!(!summary.complete);
        assert_eq!((summary.objects.failed, summary.bytes.failed), (1, 5));
        assert!(one_line(&summary).contains("first failure: b: checksum mismatch"));
        assert_eq!(summary.throughput_bytes_per_second, 5.0);
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
