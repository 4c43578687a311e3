//! The stager's account of one run: the JSON `--summary-file` writes, and
//! in compact form the pod's termination message, which the operator reads
//! back into the DataStage's status.

use serde::{Deserialize, Serialize};

use crate::disk::DiskSpace;
use crate::hash::{FNV_OFFSET, fnv1a_from};
use crate::peers::PeerCounts;
use crate::reason::Reason;

/// The kubelet keeps at most this many bytes of a termination message.
pub const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Longest error text kept per failure in a termination message.
const FAILURE_TEXT_LIMIT: usize = 240;

/// Which way a run copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Object storage → directory.
    #[default]
    Pull,
    /// Directory → object storage.
    Push,
}

/// What one run did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// `pull` or `push`.
    pub operation: Operation,
    /// Where data came from.
    pub source: String,
    /// Where data went.
    pub destination: String,
    /// True when every selected object is in place and verified.
    pub complete: bool,
    /// Object counts.
    pub objects: Counts,
    /// Byte counts.
    pub bytes: Counts,
    /// How transferred objects were verified.
    #[serde(default)]
    pub verified: VerifiedCounts,
    /// What verifying them cost.
    #[serde(default, skip_serializing_if = "VerifyCost::is_none")]
    pub verify_cost: VerifyCost,
    /// What this run kept of interrupted earlier runs' work.
    #[serde(default, skip_serializing_if = "Resumed::is_none")]
    pub resumed: Resumed,
    /// Requests retried.
    #[serde(default)]
    pub retries: u64,
    /// Requests sent to the store, every attempt counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub requests: u64,
    /// Of the retried requests, those the store throttled (SlowDown, 429, 503).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled: u64,
    /// Wall-clock duration of the run.
    #[serde(default)]
    pub seconds: f64,
    /// Bytes transferred per second of the run.
    #[serde(default)]
    pub throughput_bytes_per_second: f64,
    /// Peak resident memory of the process, where the platform reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// The first failures (by key), each in one line.
    #[serde(default)]
    pub failures: Vec<Failure>,
    /// Failures counted in `objects.failed` but not listed in `failures`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures_omitted: u64,
    /// Why the run could not proceed at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// A pull its quota refused (`QuotaExceeded`): the whole dataset's bytes
    /// as far as it was listed, all shards together, so at least this much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_bytes: Option<u64>,
    /// A pull: its destination's filesystem, measured when the run ended,
    /// or, for a run refused for room, when it was refused (with what it
    /// needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskSpace>,
    /// What this run changed in the destination compared with what was
    /// staged there before (pulls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Changes>,
    /// The version of the dataset this run staged (pulls that completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// Fleet staging: bytes from peers instead of the store, bytes served.
    #[serde(default, skip_serializing_if = "PeerCounts::is_none")]
    pub peers: PeerCounts,
    /// Objects a pull linked from its shared-objects directory (another
    /// pull on that filesystem had staged them) instead of fetching them;
    /// also counted as skipped.
    #[serde(default, skip_serializing_if = "Amount::is_none")]
    pub shared: Amount,
    /// Requests the run kept in flight (for shards combined: the first
    /// shard's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<ConcurrencyUsed>,
}

/// How many requests a run kept in flight, as `--concurrency` had it choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct ConcurrencyUsed {
    /// Whether the number followed the measured throughput (`auto`).
    pub adaptive: bool,
    /// The number in force when the run ended.
    pub last: u32,
    /// The highest number in force during the run.
    pub peak: u32,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Resumed {
    fn is_none(&self) -> bool {
        *self == Resumed::default()
    }
}

/// Object or byte counts of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Selected by the run.
    pub selected: u64,
    /// Copied by this run.
    pub transferred: u64,
    /// Already in place.
    pub skipped: u64,
    /// Failed.
    #[serde(default)]
    pub failed: u64,
}

impl Counts {
    /// In place: copied or already there.
    pub fn done(&self) -> u64 {
        self.transferred + self.skipped
    }

    fn add(&mut self, other: &Counts) {
        self.selected += other.selected;
        self.transferred += other.transferred;
        self.skipped += other.skipped;
        self.failed += other.failed;
    }
}

/// What a transferred object was verified against. The label values of
/// `ferry_stager_verified_total` and the fields of [`VerifiedCounts`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifiedKind {
    /// A full-object CRC64NVME (S3's default for new uploads).
    Crc64nvme,
    /// A full-object CRC32C (what Ferry's pushes and GCS keep).
    Crc32c,
    /// A full-object CRC32.
    Crc32,
    /// A SHA-1 or SHA-256 of a single-part object.
    Sha,
    /// The MD5 a single-part object's ETag is.
    Md5,
    /// A checksum of per-part checksums (a multipart upload with CRC32C,
    /// CRC32, SHA-1 or SHA-256), checked part by part.
    Composite,
    /// The ETag of a multipart upload without checksums (the MD5 of the
    /// parts' MD5s), with the part layout read from the store.
    EtagMultipart,
    /// Its size only: the object carries no checksum at all, or `--verify size`.
    SizeOnly,
}

impl VerifiedKind {
    /// Every kind, for pre-registering metric series.
    pub const ALL: [VerifiedKind; 8] = [
        VerifiedKind::Crc64nvme,
        VerifiedKind::Crc32c,
        VerifiedKind::Crc32,
        VerifiedKind::Sha,
        VerifiedKind::Md5,
        VerifiedKind::Composite,
        VerifiedKind::EtagMultipart,
        VerifiedKind::SizeOnly,
    ];

    /// The label value, spelled as the summary's field.
    pub fn as_str(&self) -> &'static str {
        match self {
            VerifiedKind::Crc64nvme => "crc64nvme",
            VerifiedKind::Crc32c => "crc32c",
            VerifiedKind::Crc32 => "crc32",
            VerifiedKind::Sha => "sha",
            VerifiedKind::Md5 => "md5",
            VerifiedKind::Composite => "composite",
            VerifiedKind::EtagMultipart => "etag_multipart",
            VerifiedKind::SizeOnly => "size_only",
        }
    }
}

/// How transferred objects were verified: `checksum` counts every object
/// checked against any checksum, the kinds say against which.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifiedCounts {
    /// Against a checksum from the store, of any kind below.
    pub checksum: u64,
    /// By size only: the object carries no checksum at all, or `--verify size`.
    pub size_only: u64,
    /// Full-object CRC64NVME.
    #[serde(default)]
    pub crc64nvme: u64,
    /// Full-object CRC32C.
    #[serde(default)]
    pub crc32c: u64,
    /// Full-object CRC32.
    #[serde(default)]
    pub crc32: u64,
    /// SHA-1 or SHA-256 of a single-part object.
    #[serde(default)]
    pub sha: u64,
    /// The MD5 of a single-part upload's ETag.
    #[serde(default)]
    pub md5: u64,
    /// Composite (per-part) checksums of multipart uploads.
    #[serde(default)]
    pub composite: u64,
    /// Multipart ETags.
    #[serde(default)]
    pub etag_multipart: u64,
}

impl VerifiedCounts {
    /// Counts `n` objects verified as `kind`.
    pub fn add(&mut self, kind: VerifiedKind, n: u64) {
        let field = match kind {
            VerifiedKind::SizeOnly => {
                self.size_only += n;
                return;
            }
            VerifiedKind::Crc64nvme => &mut self.crc64nvme,
            VerifiedKind::Crc32c => &mut self.crc32c,
            VerifiedKind::Crc32 => &mut self.crc32,
            VerifiedKind::Sha => &mut self.sha,
            VerifiedKind::Md5 => &mut self.md5,
            VerifiedKind::Composite => &mut self.composite,
            VerifiedKind::EtagMultipart => &mut self.etag_multipart,
        };
        *field += n;
        self.checksum += n;
    }

    /// Objects counted as `kind`.
    pub fn get(&self, kind: VerifiedKind) -> u64 {
        match kind {
            VerifiedKind::Crc64nvme => self.crc64nvme,
            VerifiedKind::Crc32c => self.crc32c,
            VerifiedKind::Crc32 => self.crc32,
            VerifiedKind::Sha => self.sha,
            VerifiedKind::Md5 => self.md5,
            VerifiedKind::Composite => self.composite,
            VerifiedKind::EtagMultipart => self.etag_multipart,
            VerifiedKind::SizeOnly => self.size_only,
        }
    }
}

/// The price of the guarantee: what checking the bytes against the store's
/// checksums took, beyond copying them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VerifyCost {
    /// Seconds of CPU spent hashing: checksums computed as bytes stream
    /// past, and hashes of bytes read back from the files written (shards
    /// combined: their sum).
    pub cpu_seconds: f64,
    /// Bytes read back from the files written to hash them (MD5s, SHAs,
    /// per-part checksums), from the page cache as they land.
    #[serde(default)]
    pub read_back_bytes: u64,
}

impl VerifyCost {
    /// Nothing was hashed (`--verify size`, objects without checksums).
    pub fn is_none(&self) -> bool {
        self.cpu_seconds == 0.0 && self.read_back_bytes == 0
    }

    /// Adds another run's (a shard's) cost.
    pub fn add(&mut self, other: &VerifyCost) {
        self.cpu_seconds += other.cpu_seconds;
        self.read_back_bytes += other.read_back_bytes;
    }
}

/// Work an earlier, interrupted run had done that this run kept instead of
/// copying again: verified ranges of a partial download, parts of an
/// unfinished multipart upload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resumed {
    /// Objects finished from where an earlier run stopped.
    pub objects: u64,
    /// Bytes not copied again (ranges or parts already in place).
    pub bytes: u64,
}

/// One object that did not make it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The object key (pull) or relative path (push); empty for a failure
    /// of the whole run.
    pub key: String,
    /// Why, in one line.
    pub error: String,
}

/// Objects and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    /// Objects.
    pub objects: u64,
    /// Bytes.
    pub bytes: u64,
}

impl Amount {
    fn is_none(&self) -> bool {
        *self == Amount::default()
    }

    fn add(&mut self, other: &Amount) {
        self.objects += other.objects;
        self.bytes += other.bytes;
    }
}

/// What a pull changed in its destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    /// Objects staged that were not there before.
    pub added: Amount,
    /// Objects staged again because the store's version changed.
    pub updated: Amount,
    /// Files removed because their object left the store (`--delete-removed`).
    pub removed: Amount,
}

impl Changes {
    fn add(&mut self, other: &Changes) {
        self.added.add(&other.added);
        self.updated.add(&other.updated);
        self.removed.add(&other.removed);
    }
}

/// One version of a dataset: how many objects, how many bytes, and a
/// digest of every (key, version, size). Two nodes hold the same data
/// exactly when their snapshots are equal. The digest is a sum of
/// per-object hashes, so shards of one dataset combine by addition in any
/// order ([`Snapshot::combine`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Objects.
    pub objects: u64,
    /// Bytes.
    pub bytes: u64,
    /// 32 hex digits.
    pub digest: String,
    /// The revision of the source the data was read at, where the source
    /// has one: the commit of an `hf://` repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Builds a [`Snapshot`] one object at a time, in any order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotBuilder {
    objects: u64,
    bytes: u64,
    sum: u128,
}

impl SnapshotBuilder {
    /// Adds one object: its key relative to the prefix, the store's version
    /// of it (ETag or generation) and its size.
    pub fn add(&mut self, key: &str, version: &str, size: u64) {
        self.objects += 1;
        self.bytes += size;
        self.sum = self.sum.wrapping_add(entry_hash(key, version, size));
    }

    /// The snapshot of everything added.
    pub fn finish(&self) -> Snapshot {
        Snapshot { objects: self.objects, bytes: self.bytes, digest: format!("{:032x}", self.sum), revision: None }
    }
}

impl Snapshot {
    /// The snapshot of the union of disjoint parts (the shards of one
    /// dataset). `None` when a part's digest is malformed.
    pub fn combine<'a>(parts: impl IntoIterator<Item = &'a Snapshot>) -> Option<Snapshot> {
        let mut total = SnapshotBuilder::default();
        // The parts' revision when they agree on one.
        let mut revision: Option<Option<&String>> = None;
        for part in parts {
            total.objects += part.objects;
            total.bytes += part.bytes;
            total.sum = total.sum.wrapping_add(u128::from_str_radix(&part.digest, 16).ok()?);
            revision = match revision {
                None => Some(part.revision.as_ref()),
                Some(seen) if seen == part.revision.as_ref() => Some(seen),
                Some(_) => Some(None),
            };
        }
        Some(Snapshot { revision: revision.flatten().cloned(), ..total.finish() })
    }
}

/// 128 bits from two differently seeded FNV-1a passes, each finished with
/// a SplitMix64 mix so nearby keys spread over the whole range. Stable
/// across builds and machines: every node must compute the same value.
fn entry_hash(key: &str, version: &str, size: u64) -> u128 {
    let fnv = |seed: u64| {
        let parts: [&[u8]; 5] = [key.as_bytes(), &[0], version.as_bytes(), &[0], &size.to_le_bytes()];
        splitmix(parts.iter().fold(seed, |hash, part| fnv1a_from(hash, part)))
    };
    (u128::from(fnv(FNV_OFFSET)) << 64) | u128::from(fnv(0x8422_2325_cbf2_9ce4))
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Summary {
    /// Bytes of the selection that are in place at the end: copied in this
    /// run, already there, or kept from an earlier run that stopped in the
    /// middle of an object (counted in `resumed`, not in `bytes`).
    pub fn bytes_in_place(&self) -> u64 {
        self.bytes.done() + self.resumed.bytes
    }

    /// One summary for the shards of one worker (an Indexed Job's pods,
    /// one summary per completion index): counts add up because the shards
    /// ran side by side; complete only when every shard is; the first
    /// shard with a reason gives it; snapshots combine when every shard has
    /// one. `None` for no shards.
    pub fn combine(shards: Vec<Summary>) -> Option<Summary> {
        let mut shards = shards.into_iter();
        let mut total = shards.next()?;
        for shard in shards {
            total.complete &= shard.complete;
            total.objects.add(&shard.objects);
            total.bytes.add(&shard.bytes);
            for kind in VerifiedKind::ALL {
                total.verified.add(kind, shard.verified.get(kind));
            }
            total.verify_cost.add(&shard.verify_cost);
            total.resumed.objects += shard.resumed.objects;
            total.shared.add(&shard.shared);
            total.resumed.bytes += shard.resumed.bytes;
            total.retries += shard.retries;
            total.requests += shard.requests;
            total.seconds = total.seconds.max(shard.seconds);
            total.throughput_bytes_per_second += shard.throughput_bytes_per_second;
            total.reason = total.reason.or(shard.reason);
            // Every shard counts the whole dataset: the furthest listing says most.
            total.dataset_bytes = total.dataset_bytes.max(shard.dataset_bytes);
            // Shards share one destination: a refusal's need says most,
            // else the latest measurement.
            total.disk = match (total.disk.take(), shard.disk) {
                (Some(a), Some(b)) => {
                    Some(if (b.needed_bytes, b.measured_at) > (a.needed_bytes, a.measured_at) { b } else { a })
                }
                (a, b) => a.or(b),
            };
            total.failures.extend(shard.failures);
            total.failures_omitted += shard.failures_omitted;
            total.changes = match (total.changes, shard.changes) {
                (Some(mut a), Some(b)) => {
                    a.add(&b);
                    Some(a)
                }
                (a, b) => a.or(b),
            };
            total.snapshot = match (&total.snapshot, &shard.snapshot) {
                (Some(a), Some(b)) => Snapshot::combine([a, b]),
                _ => None,
            };
        }
        Some(total)
    }

    /// The summary as compact JSON of at most [`TERMINATION_MESSAGE_LIMIT`]
    /// bytes, for a pod's termination message: error texts are cut to a
    /// line, and failures that do not fit are dropped from the end and
    /// counted in `failures_omitted`, so the message always parses and its
    /// counts are always exact.
    pub fn termination_message(&self) -> String {
        let mut compact = self.clone();
        for failure in &mut compact.failures {
            truncate_chars(&mut failure.key, FAILURE_TEXT_LIMIT);
            truncate_chars(&mut failure.error, FAILURE_TEXT_LIMIT);
        }
        let render = |s: &Summary| serde_json::to_string(s).expect("a summary serializes");
        let mut text = render(&compact);
        if text.len() <= TERMINATION_MESSAGE_LIMIT {
            return text;
        }
        // Fewer failures until it fits (each dropped one is counted).
        let all = std::mem::take(&mut compact.failures);
        let listed = all.len();
        let (mut low, mut high) = (0, listed);
        while low < high {
            let keep = (low + high).div_ceil(2);
            compact.failures = all[..keep].to_vec();
            compact.failures_omitted = self.failures_omitted + (listed - keep) as u64;
            if render(&compact).len() <= TERMINATION_MESSAGE_LIMIT { low = keep } else { high = keep - 1 }
        }
        compact.failures = all[..low].to_vec();
        compact.failures_omitted = self.failures_omitted + (listed - low) as u64;
        text = render(&compact);
        // Only very long locations are left: cut them too.
        let mut limit = 1024;
        while text.len() > TERMINATION_MESSAGE_LIMIT && limit > 0 {
            truncate_chars(&mut compact.source, limit);
            truncate_chars(&mut compact.destination, limit);
            limit /= 2;
            text = render(&compact);
        }
        text
    }
}

/// Cuts `text` to at most `limit` bytes on a character boundary, marking
/// the cut with an ellipsis.
fn truncate_chars(text: &mut String, limit: usize) {
    if text.len() <= limit {
        return;
    }
    let mut end = limit.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn summary(failures: Vec<Failure>, source: String) -> Summary {
        Summary {
            operation: Operation::Pull,
            source,
            destination: "/ferry/data".into(),
            complete: failures.is_empty(),
            objects: Counts { selected: 10, transferred: 5, skipped: 2, failed: failures.len() as u64 },
            bytes: Counts { selected: 1000, transferred: 500, skipped: 200, failed: 300 },
            reason: Some(Reason::AccessDenied),
            failures,
            concurrency: Some(ConcurrencyUsed { adaptive: true, last: 24, peak: 32 }),
            verify_cost: VerifyCost { cpu_seconds: 0.25, read_back_bytes: 4096 },
            ..Summary::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the failures and locations, the termination message
        /// fits, parses back, and keeps the exact counts.
        #[test]
        fn the_termination_message_always_fits_and_counts_every_failure(
            failures in proptest::collection::vec(("\\PC{0,300}", "\\PC{0,600}"), 0..1200),
            source in "\\PC{0,3000}",
        ) {
            let failures: Vec<Failure> = failures.into_iter().map(|(key, error)| Failure { key, error }).collect();
            let full = summary(failures, source);
            let message = full.termination_message();
            prop_assert!(message.len() <= TERMINATION_MESSAGE_LIMIT, "{} bytes", message.len());
            let back: Summary = serde_json::from_str(&message).unwrap();
            prop_assert_eq!(back.objects, full.objects);
            prop_assert_eq!(back.bytes, full.bytes);
            prop_assert_eq!(back.failures.len() as u64 + back.failures_omitted, full.failures.len() as u64);
            for (kept, original) in back.failures.iter().zip(&full.failures) {
                prop_assert!(original.key.starts_with(kept.key.trim_end_matches('…')));
            }
        }
    }

    #[test]
    fn bytes_kept_from_an_interrupted_run_count_as_in_place() {
        let summary = Summary {
            bytes: Counts { selected: 100, transferred: 30, skipped: 10, failed: 0 },
            resumed: Resumed { objects: 1, bytes: 60 },
            ..Summary::default()
        };
        assert_eq!(summary.bytes.done(), 40);
        assert_eq!(summary.bytes_in_place(), 100);
    }

    #[test]
    fn a_short_summary_is_sent_whole() {
        let full = summary(vec![Failure { key: "a".into(), error: "boom".into() }], "s3://b/p/".into());
        let back: Summary = serde_json::from_str(&full.termination_message()).unwrap();
        assert_eq!(back, full);
    }

    #[test]
    fn shards_refused_by_a_quota_combine_to_the_furthest_count_of_the_dataset() {
        let refused = |dataset_bytes| Summary {
            reason: Some(Reason::QuotaExceeded),
            dataset_bytes: Some(dataset_bytes),
            ..Summary::default()
        };
        let combined = Summary::combine(vec![refused(5), refused(9), Summary::default()]).unwrap();
        assert_eq!(combined.dataset_bytes, Some(9));
        let json = serde_json::to_string(&combined).unwrap();
        assert_eq!(serde_json::from_str::<Summary>(&json).unwrap(), combined);
        let plain = serde_json::to_value(Summary::default()).unwrap();
        assert!(plain.get("dataset_bytes").is_none(), "{plain}");
        assert!(plain.get("verify_cost").is_none(), "nothing hashed, nothing said: {plain}");
    }

    #[test]
    fn shards_on_one_destination_combine_to_the_largest_need_else_the_latest_measurement() {
        let disk = |needed_bytes, measured_at| Summary {
            disk: Some(DiskSpace {
                filesystem: "0:52".into(),
                size_bytes: 100,
                free_bytes: 40,
                needed_bytes,
                claimed_bytes: None,
                measured_at,
            }),
            ..Summary::default()
        };
        let refused = Summary::combine(vec![disk(None, 9), disk(Some(60), 5), disk(Some(50), 7), Summary::default()]);
        assert_eq!(refused.unwrap().disk.unwrap().needed_bytes, Some(60));
        let measured = Summary::combine(vec![disk(None, 5), Summary::default(), disk(None, 9)]).unwrap();
        assert_eq!(measured.disk.as_ref().unwrap().measured_at, 9);
        let json = measured.termination_message();
        assert!(
            json.contains(r#""disk":{"filesystem":"0:52","sizeBytes":100,"freeBytes":40,"measuredAt":9}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Summary>(&json).unwrap(), measured);
    }
    #[test]
    fn snapshots_do_not_depend_on_order_and_shards_combine() {
        let objects = [("a", "e1", 1), ("b/c", "e2", 20), ("d", "e3", 300)];
        let mut forward = SnapshotBuilder::default();
        objects.iter().for_each(|(k, v, s)| forward.add(k, v, *s));
        let mut backward = SnapshotBuilder::default();
        objects.iter().rev().for_each(|(k, v, s)| backward.add(k, v, *s));
        assert_eq!(forward.finish(), backward.finish());
        assert_eq!(forward.finish().objects, 3);
        assert_eq!(forward.finish().bytes, 321);

        let (mut shard0, mut shard1) = (SnapshotBuilder::default(), SnapshotBuilder::default());
        shard0.add("a", "e1", 1);
        shard1.add("b/c", "e2", 20);
        shard1.add("d", "e3", 300);
        assert_eq!(Snapshot::combine([&shard0.finish(), &shard1.finish()]), Some(forward.finish()));
        // Shards read at one revision keep it; at two, the whole has none.
        let at = |builder: &SnapshotBuilder, revision: &str| Snapshot {
            revision: Some(revision.into()),
            ..builder.finish()
        };
        let combined = Snapshot::combine([&at(&shard0, "c1"), &at(&shard1, "c1")]).unwrap();
        assert_eq!((combined.revision.as_deref(), &combined.digest), (Some("c1"), &forward.finish().digest));
        assert_eq!(Snapshot::combine([&at(&shard0, "c1"), &at(&shard1, "c2")]).unwrap().revision, None);
        assert_eq!(Snapshot::combine([&at(&shard0, "c1"), &shard1.finish()]).unwrap().revision, None);
        let json = serde_json::to_string(&combined).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&json).unwrap(), combined, "{json}");
        assert!(!serde_json::to_string(&forward.finish()).unwrap().contains("revision"), "absent when unknown");

        let mut changed = SnapshotBuilder::default();
        [("a", "e1", 1), ("b/c", "e2-new", 20), ("d", "e3", 300)].iter().for_each(|(k, v, s)| changed.add(k, v, *s));
        assert_ne!(changed.finish().digest, forward.finish().digest, "a new version is a new snapshot");
    }

    #[test]
    fn shard_summaries_add_up_and_are_complete_only_together() {
        let shard = |bytes: u64, complete: bool, reason: Option<Reason>| Summary {
            complete,
            objects: Counts { selected: 2, transferred: 2, ..Counts::default() },
            bytes: Counts { selected: bytes, transferred: bytes, ..Counts::default() },
            throughput_bytes_per_second: 10.0,
            reason,
            verify_cost: VerifyCost { cpu_seconds: bytes as f64 / 100.0, read_back_bytes: bytes },
            ..Summary::default()
        };
        let total = Summary::combine(vec![shard(100, true, None), shard(50, true, None)]).unwrap();
        assert_eq!((total.bytes.transferred, total.objects.selected), (150, 4));
        assert_eq!(total.verify_cost, VerifyCost { cpu_seconds: 1.5, read_back_bytes: 150 });
        assert_eq!(total.throughput_bytes_per_second, 20.0);
        assert!(total.complete);
        let total = Summary::combine(vec![shard(1, true, None), shard(1, false, Some(Reason::AccessDenied))]).unwrap();
        assert!(!total.complete);
        assert_eq!(total.reason, Some(Reason::AccessDenied));
        assert_eq!(Summary::combine(Vec::new()), None);
    }
}
