//! Engine tests with injected faults: retries, verification and cleanup
//! behave as promised when the store misbehaves, and the bandwidth cap holds
//! back requests. (The same paths run against real servers in `tests/`; here
//! failures happen on demand.)

use std::sync::Arc;
use std::time::Duration;

use super::capacity::{CapacityCheck, FreeSpace};
use super::{Engine, Reason, RetryPolicy, TransferConfig, pull::pull, push::push};
use crate::metrics::Metrics;
use crate::store::memory::{Fault, MemoryStore};
use ferry_contract::layout::{PARTIAL_DIR, STATE_DIR, TEMP_DIR};

const MIB: usize = 1 << 20;

fn engine(store: &Arc<MemoryStore>) -> Arc<Engine> {
    let config = TransferConfig {
        concurrency: 4,
        part_size: 5 * MIB as u64,
        multipart_threshold: 5 * MIB as u64,
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        ..TransferConfig::default()
    };
    Engine::new(Arc::clone(store) as _, config, Arc::new(Metrics::new())).unwrap()
}

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[tokio::test]
async fn throttled_and_truncated_gets_are_retried_and_counted() {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/small", data(1, 1000));
    store.insert("p/large", data(2, 12 * MIB));
    store.fail_gets("p/small", [Fault::Throttle, Fault::Truncate]);
    store.fail_gets("p/large", [Fault::Throttle]);
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&store);
    let summary = pull(Arc::clone(&engine), "p/", dir.path(), false).await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.retries, 3);
    assert_eq!(summary.bytes.transferred, (12 * MIB + 1000) as u64, "retried bytes are not double counted");
    let exposition = engine.metrics.encode();
    assert!(exposition.contains("ferry_stager_retries_total{reason=\"throttled\"} 2"), "{exposition}");
    assert!(exposition.contains("ferry_stager_retries_total{reason=\"truncated_body\"} 1"), "{exposition}");
    assert_eq!(std::fs::read(dir.path().join("large")).unwrap(), data(2, 12 * MIB));
}

#[tokio::test]
async fn a_store_that_throttles_longer_than_the_attempts_allow_is_waited_out_but_a_fault_is_not() {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/busy", data(4, 1000));
    store.insert("p/broken", data(5, 1000));
    // Twice the attempts in throttles: "later", not "no".
    store.fail_gets("p/busy", std::iter::repeat_n(Fault::Throttle, 12));
    // The same number of truncated bodies uses up the attempts.
    store.fail_gets("p/broken", std::iter::repeat_n(Fault::Truncate, 12));
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&store);
    let summary = pull(Arc::clone(&engine), "p/", dir.path(), false).await.unwrap();
    assert_eq!(std::fs::read(dir.path().join("busy")).unwrap(), data(4, 1000));
    assert!(!dir.path().join("broken").exists());
    assert_eq!((summary.objects.transferred, summary.objects.failed), (1, 1), "{summary:?}");
    assert_eq!(summary.throttled, 12, "every throttle retried and counted: {summary:?}");
}

#[tokio::test]
async fn a_corrupt_body_is_downloaded_again() {
    let store = Arc::new(MemoryStore::default());
    store.insert("obj", data(3, 4096));
    store.fail_gets("obj", [Fault::Corrupt]);
    let dir = tempfile::tempdir().unwrap();
    let summary = pull(engine(&store), "", dir.path(), false).await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.verified.checksum, 1);
    assert_eq!(std::fs::read(dir.path().join("obj")).unwrap(), data(3, 4096));
}

#[tokio::test]
async fn a_persistent_mismatch_fails_the_object_and_leaves_no_file() {
    let store = Arc::new(MemoryStore::default());
    store.insert("bad", data(4, 4096));
    store.insert("good", data(5, 4096));
    // Every attempt at "bad" is corrupted.
    store.fail_gets("bad", std::iter::repeat_n(Fault::Corrupt, 3));
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(&store);
    let summary = pull(engine, "", dir.path(), false).await.unwrap();
    assert!(!summary.complete);
    assert_eq!(summary.objects.failed, 1);
    assert_eq!(summary.failures[0].key, "bad");
    assert!(summary.failures[0].error.contains("checksum mismatch"), "{:?}", summary.failures);
    assert!(!dir.path().join("bad").exists(), "a file that failed verification never appears");
    assert_eq!(std::fs::read(dir.path().join("good")).unwrap(), data(5, 4096));
    assert_eq!(std::fs::read_dir(dir.path().join(STATE_DIR).join(TEMP_DIR)).unwrap().count(), 0);
}

#[tokio::test]
async fn md5_only_objects_are_verified_in_memory_and_on_disk_and_corruption_is_caught() {
    let store = Arc::new(MemoryStore::default());
    // One object small enough to be received into memory (hashed as it
    // streams), one larger than the write buffer (read back and hashed by
    // the hasher thread), one corrupted on every attempt.
    store.insert_md5_only("small", data(8, 4096));
    store.insert_md5_only("larger", data(9, 3 * MIB));
    store.insert_md5_only("bad", data(10, 4096));
    store.fail_gets("small", [Fault::Corrupt]);
    store.fail_gets("larger", [Fault::Corrupt]);
    store.fail_gets("bad", std::iter::repeat_n(Fault::Corrupt, 3));
    let dir = tempfile::tempdir().unwrap();
    let summary = pull(engine(&store), "", dir.path(), false).await.unwrap();
    assert_eq!(summary.verified.checksum, 2, "{summary:?}");
    assert_eq!(summary.retries, 4, "one retry each for small and larger, two for bad");
    assert_eq!(summary.objects.failed, 1);
    assert!(summary.failures[0].error.contains("checksum mismatch"), "{:?}", summary.failures);
    assert_eq!(std::fs::read(dir.path().join("small")).unwrap(), data(8, 4096));
    assert_eq!(std::fs::read(dir.path().join("larger")).unwrap(), data(9, 3 * MIB));
    assert!(!dir.path().join("bad").exists(), "a file that failed verification never appears");
}

#[tokio::test]
async fn a_byte_flipped_in_a_middle_range_is_caught_by_a_crc_and_by_an_md5_and_fetched_again() {
    let store = Arc::new(MemoryStore::default());
    // Five ranges of 5 MiB each: the CRC combined from the ranges' CRCs,
    // the MD5 hashed from the file behind the ranges as they land.
    let len = 23 * MIB + 7;
    store.insert("crc", data(11, len));
    store.insert_md5_only("md5", data(12, len));
    let in_the_third_range = (12 * MIB + 3) as u64;
    store.fail_gets("crc", [Fault::CorruptAt(in_the_third_range)]);
    store.fail_gets("md5", [Fault::CorruptAt(in_the_third_range)]);
    let dir = tempfile::tempdir().unwrap();
    let summary = pull(engine(&store), "", dir.path(), false).await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.retries, 2, "one fetch again each: {summary:?}");
    assert_eq!((summary.verified.crc32c, summary.verified.md5), (1, 1), "{summary:?}");
    assert_eq!(std::fs::read(dir.path().join("crc")).unwrap(), data(11, len));
    assert_eq!(std::fs::read(dir.path().join("md5")).unwrap(), data(12, len));
    // The MD5 object was hashed from its file on both tries, every byte
    // once each; the CRC object's bytes were never read back.
    assert_eq!(summary.verify_cost.read_back_bytes, 2 * len as u64, "{summary:?}");
    assert!(summary.verify_cost.cpu_seconds > 0.0, "{summary:?}");
}

#[tokio::test]
async fn a_failed_multipart_upload_is_aborted() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), data(6, 12 * MIB)).unwrap();
    store.fail_uploads([Fault::Reject]);
    let summary = push(engine(&store), dir.path(), "ckpt/").await.unwrap();
    assert!(!summary.complete);
    assert_eq!(store.calls().aborts, 1);
    assert_eq!(store.open_uploads(), 0);
    assert!(store.object("ckpt/big").is_none());
}

#[tokio::test]
async fn throttled_part_uploads_are_retried_and_the_object_is_complete() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), data(7, 12 * MIB + 1)).unwrap();
    store.fail_uploads([Fault::Throttle, Fault::Throttle]);
    let summary = push(engine(&store), dir.path(), "").await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.retries, 2);
    assert_eq!(store.calls().completes, 1);
    assert_eq!(store.object("big").unwrap(), data(7, 12 * MIB + 1));
}

#[tokio::test]
async fn the_bandwidth_cap_holds_back_the_gets_of_small_objects_not_only_their_writes() {
    // 16 × 64 KiB at 1 MiB/s: about a second. Small objects are received
    // into memory; if only their disk writes were paced, every GET would be
    // done within milliseconds, the whole dataset read at full speed.
    let store = Arc::new(MemoryStore::default());
    for i in 0..16 {
        store.insert(&format!("o{i:02}"), data(i, 64 << 10));
    }
    let config = TransferConfig {
        concurrency: 2,
        max_bandwidth: Some(1 << 20),
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        ..TransferConfig::default()
    };
    let engine = Engine::new(Arc::clone(&store) as _, config, Arc::new(Metrics::new())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pulling = tokio::spawn({
        let destination = dir.path().to_path_buf();
        async move { pull(engine, "", &destination, false).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = store.calls().gets;
    // 300 ms at 1 MiB/s is under 5 objects' worth, plus the two requests
    // whose slots are waiting.
    assert!(early <= 8, "{early} of 16 GETs done after 300 ms at 1 MiB/s");
    let summary = pulling.await.unwrap().unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(store.calls().gets, 16);
}

/// A destination filesystem with 7 MiB free, in 4 KiB blocks.
fn seven_mib_free(_: &std::path::Path) -> std::io::Result<Option<FreeSpace>> {
    Ok(Some(FreeSpace { available: 7 * MIB as u64, block_size: 4096, total: 64 * MIB as u64, device: 0 }))
}

#[tokio::test]
async fn a_pull_that_does_not_fit_fails_before_writing_and_only_what_reuse_leaves_is_counted() {
    let store = Arc::new(MemoryStore::default());
    let config = TransferConfig {
        capacity: Some(CapacityCheck { probe: seven_mib_free, ..CapacityCheck::with_reserve("1MiB".parse().unwrap()) }),
        ..TransferConfig::default()
    };
    let engine = || Engine::new(Arc::clone(&store) as _, config.clone(), Arc::new(Metrics::new())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    store.insert("a", data(11, 3 * MIB));
    store.insert("b", data(12, 3 * MIB));
    let summary = pull(engine(), "", dir.path(), false).await.unwrap();
    assert!(summary.complete, "6 MiB and the 1 MiB reserve fit in 7 MiB: {summary:?}");

    // The same free space again (the probe says so), but "a" and "b" are in
    // place: only "c" is to be written.
    store.insert("c", data(13, 3 * MIB));
    let summary = pull(engine(), "", dir.path(), false).await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.objects.transferred, 1);

    // "d" does not fit alone. The memory store lists two objects a page, so
    // it comes with "c" (in place) in a full page, which may not be the last.
    store.insert("d", data(14, 7 * MIB));
    let error = pull(engine(), "", dir.path(), false).await.unwrap_err();
    assert_eq!(error.reason(), Reason::InsufficientCapacity);
    // Freeing space needs no change to the run; the refusal says how much
    // it needs, for the operator to wait for.
    assert!(!error.is_permanent(), "{error}");
    let disk = error.disk().expect("the refusal reports the disk");
    assert_eq!((disk.free_bytes, disk.size_bytes), (7 * MIB as u64, 64 * MIB as u64));
    assert!(disk.needed_bytes.is_some_and(|n| n >= 8 * MIB as u64) && disk.could_ever_fit(), "{disk:?}");
    let message = crate::error_chain(&error);
    assert!(
        message.contains("has 7.0 MiB free but this run still needs at least 7.0 MiB (+ 1.0 MiB reserve, 1MiB)"),
        "{message}"
    );
    assert!(!dir.path().join("d").exists(), "nothing was written");
    assert_eq!(std::fs::read_dir(dir.path().join(STATE_DIR).join(TEMP_DIR)).unwrap().count(), 0);
    assert_eq!(partial_files(dir.path()), 0);
    assert_eq!(store.calls().gets, 3, "no GET for what does not fit");

    // Without the check the same pull goes ahead (the probe is not asked).
    let unchecked = TransferConfig { capacity: None, ..config.clone() };
    let engine = Engine::new(Arc::clone(&store) as _, unchecked, Arc::new(Metrics::new())).unwrap();
    assert!(pull(engine, "", dir.path(), false).await.unwrap().complete);
}

#[tokio::test]
async fn a_dataset_over_its_quota_is_refused_before_writing_and_every_shard_counts_the_whole() {
    let store = Arc::new(MemoryStore::default());
    store.insert("a", data(21, 2 * MIB));
    store.insert("b", data(22, 2 * MIB));
    store.insert("skip/c", data(23, 8 * MIB));
    let quota = |bytes: usize, shard: Option<&str>| TransferConfig {
        dataset_quota: Some(bytes as u64),
        selection: crate::selection::Selection::new(&[], &["skip/*".into()], shard.map(|s| s.parse().unwrap()))
            .unwrap(),
        ..TransferConfig::default()
    };
    let engine = |config| Engine::new(Arc::clone(&store) as _, config, Arc::new(Metrics::new())).unwrap();
    // 4 MiB selected (the excluded 8 MiB do not count) fit a 4 MiB quota.
    let dir = tempfile::tempdir().unwrap();
    assert!(pull(engine(quota(4 * MIB, None)), "", dir.path(), false).await.unwrap().complete);

    // Objects already in place count too: the quota is on what the
    // dataset holds, not on what a run writes.
    store.insert("d", data(24, MIB));
    let error = pull(engine(quota(4 * MIB, None)), "", dir.path(), false).await.unwrap_err();
    assert_eq!(error.reason(), Reason::QuotaExceeded);
    assert!(error.is_permanent(), "only a new quota helps");
    let message = error.to_string();
    // The memory store lists two objects a page: "d" comes in a full one,
    // which may not be the last.
    assert!(message.contains("holds at least 5.0 MiB"), "{message}");
    assert!(message.contains("quota of 4.0 MiB"), "{message}");
    assert!(!dir.path().join("d").exists(), "nothing was written");

    // Each shard of a fresh destination counts the whole dataset: both
    // refuse, though each one's share would fit.
    for shard in ["0/2", "1/2"] {
        let dir = tempfile::tempdir().unwrap();
        let gets = store.calls().gets;
        let error = pull(engine(quota(3 * MIB, Some(shard))), "", dir.path(), false).await.unwrap_err();
        assert_eq!(error.reason(), Reason::QuotaExceeded, "shard {shard}");
        assert_eq!(store.calls().gets, gets, "shard {shard} read nothing");
    }
}

fn partial_files(root: &std::path::Path) -> usize {
    std::fs::read_dir(root.join(STATE_DIR).join(PARTIAL_DIR)).map_or(0, |entries| entries.count())
}

#[tokio::test]
async fn the_request_rate_cap_spaces_a_runs_requests_however_many_slots_it_has() {
    // 40 objects of 1 KiB at 20 requests per second: about two seconds,
    // though 16 requests could be in flight at once.
    let store = Arc::new(MemoryStore::default());
    for i in 0..40 {
        store.insert(&format!("o{i:02}"), data(i, 1 << 10));
    }
    let config = TransferConfig { concurrency: 16, max_request_rate: Some(20), ..TransferConfig::default() };
    let engine = Engine::new(Arc::clone(&store) as _, config, Arc::new(Metrics::new())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let pulling = tokio::spawn({
        let destination = dir.path().to_path_buf();
        async move { pull(engine, "", &destination, false).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = store.calls().gets;
    // Half a second at 20 per second is 10 requests, and the listing is one.
    assert!(early <= 11, "{early} of 40 GETs done after 500 ms at 20 requests/s");
    let summary = pulling.await.unwrap().unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(store.calls().gets, 40);
    assert!(started.elapsed() >= Duration::from_millis(1900), "{:?}", started.elapsed());
}
