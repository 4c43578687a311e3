//! Pushes run again over what killed pushes left, against an in-memory
//! store: which parts a resumed upload keeps and which it sends, which
//! uploads are aborted, which files are skipped. (The conformance suite
//! kills the real binary against real servers; here a killed run is built
//! by hand, part by part.)

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Engine, RetryPolicy, TransferConfig, push::push, tally::Summary};
use crate::local::push_state::{PushState, StartedUpload};
use crate::local::walk::mtime_ns;
use crate::metrics::Metrics;
use crate::store::ObjectStore as _;
use crate::store::memory::{Fault, MemoryStore};
use ferry_contract::layout::{PUSH_STATE_DIR, STATE_DIR};

const MIB: usize = 1 << 20;
const PART: usize = 5 * MIB;
/// Where every push of these tests goes: `mem://test` + the prefix `p/`.
const DESTINATION: &str = "mem://test/p/";

fn engine(store: &Arc<MemoryStore>) -> Arc<Engine> {
    let config = TransferConfig {
        concurrency: 4,
        part_size: PART as u64,
        multipart_threshold: PART as u64,
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        ..TransferConfig::default()
    };
    Engine::new(Arc::clone(store) as _, config, Arc::new(Metrics::new())).unwrap()
}

fn data(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

/// One push of `dir` to `p/` with a fresh engine (a run of its own).
async fn push_all(store: &Arc<MemoryStore>, dir: &Path) -> Summary {
    let summary = push(engine(store), dir, "p/").await.unwrap();
    assert!(summary.complete, "{summary:?}");
    summary
}

/// What a push killed after sending `parts` of the file `rel` leaves: an
/// upload in the store holding those parts, recorded in the push state
/// with the file's stamp and `part_size`. Returns the upload's id.
async fn killed_push(store: &MemoryStore, dir: &Path, rel: &str, part_size: usize, parts: &[(u32, &[u8])]) -> String {
    let key = format!("p/{rel}");
    let upload_id = store.create_multipart(&key).await.unwrap();
    for (number, body) in parts {
        let crc = crc32c::crc32c(body);
        store.upload_part(&key, &upload_id, *number, Bytes::copy_from_slice(body), crc).await.unwrap();
    }
    let (size, mtime_ns) = match std::fs::metadata(dir.join(rel)) {
        Ok(meta) => (meta.len(), mtime_ns(&meta)),
        Err(_) => (1, 1),
    };
    let upload = StartedUpload { key, upload_id: upload_id.clone(), size, mtime_ns, part_size: part_size as u64 };
    PushState::open(dir, DESTINATION).unwrap().upload_started(upload);
    upload_id
}

fn set_mtime(path: &Path, seconds: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)).unwrap();
}

#[tokio::test]
async fn a_resumed_upload_sends_only_the_parts_the_store_lacks() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    let big = data(1, 2 * PART + MIB + 1);
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let upload_id = killed_push(&store, dir.path(), "big", PART, &[(1, &big[..PART]), (2, &big[PART..2 * PART])]).await;
    let before = store.calls();

    let engine = engine(&store);
    let summary = push(Arc::clone(&engine), dir.path(), "p/").await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!((summary.resumed.objects, summary.resumed.bytes), (1, 2 * PART as u64));
    assert_eq!(summary.bytes.transferred, (MIB + 1) as u64, "only the missing part is sent");
    let after = store.calls();
    assert_eq!(after.parts - before.parts, 1);
    assert_eq!(after.creates, before.creates, "the earlier upload is continued, not started again");
    assert!(!store.upload_is_open(&upload_id));
    assert_eq!(store.object("p/big").unwrap(), big);
    assert_eq!(store.open_uploads(), 0);
    let exposition = engine.metrics.encode();
    let series = format!("ferry_stager_resumed_bytes_total{{direction=\"upload\"}} {}", 2 * PART);
    assert!(exposition.contains(&series), "{exposition}");
}

#[tokio::test]
async fn a_listed_part_whose_crc_differs_from_the_file_is_sent_again() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    let big = data(2, 3 * PART);
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let wrong = data(3, PART);
    killed_push(&store, dir.path(), "big", PART, &[(1, &big[..PART]), (2, &wrong), (3, &big[2 * PART..])]).await;
    let before = store.calls();

    let summary = push_all(&store, dir.path()).await;
    assert_eq!(summary.resumed.bytes, 2 * PART as u64, "{summary:?}");
    assert_eq!(summary.bytes.transferred, PART as u64);
    assert_eq!(store.calls().parts - before.parts, 1);
    assert_eq!(store.object("p/big").unwrap(), big);
}

#[tokio::test]
async fn uploads_the_re_run_does_not_resume_are_aborted() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    let (changed, other_parts) = (data(4, 2 * PART + 7), data(5, 2 * PART + 9));
    std::fs::write(dir.path().join("changed"), &changed).unwrap();
    std::fs::write(dir.path().join("other-parts"), &other_parts).unwrap();
    set_mtime(&dir.path().join("changed"), 1_000_000);
    let stale = [
        killed_push(&store, dir.path(), "changed", PART, &[(1, &changed[..PART])]).await,
        killed_push(&store, dir.path(), "other-parts", 2 * PART, &[(1, &other_parts[..2 * PART])]).await,
        killed_push(&store, dir.path(), "removed", PART, &[(1, &data(6, PART))]).await,
    ];
    // Same size, new content, new mtime: the recorded upload is of another version.
    let changed = data(7, changed.len());
    std::fs::write(dir.path().join("changed"), &changed).unwrap();
    set_mtime(&dir.path().join("changed"), 2_000_000);

    let summary = push_all(&store, dir.path()).await;
    assert_eq!(summary.resumed.objects, 0, "{summary:?}");
    assert_eq!(summary.bytes.transferred, (changed.len() + other_parts.len()) as u64);
    for upload_id in &stale {
        assert!(!store.upload_is_open(upload_id), "{upload_id} was left behind");
    }
    assert_eq!(store.calls().aborts, 3);
    assert_eq!(store.open_uploads(), 0);
    assert_eq!(store.object("p/changed").unwrap(), changed);
    assert_eq!(store.object("p/other-parts").unwrap(), other_parts);
}

#[tokio::test]
async fn an_unchanged_file_still_in_the_store_is_skipped_and_anything_else_sent_again() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), data(8, 1000)).unwrap();
    std::fs::write(dir.path().join("b"), data(9, 2 * PART + 1)).unwrap();
    std::fs::write(dir.path().join("c"), data(10, 3000)).unwrap();
    assert_eq!(push_all(&store, dir.path()).await.objects.transferred, 3);
    // A run killed while appending leaves a torn line: it costs nothing.
    let state_file = dir.path().join(STATE_DIR).join(PUSH_STATE_DIR).join(PushState::file_name(DESTINATION));
    let mut torn = std::fs::read(&state_file).unwrap();
    torn.extend_from_slice(b"{\"record\":\"pushed\",\"pa");
    std::fs::write(&state_file, torn).unwrap();

    let second = push_all(&store, dir.path()).await;
    assert_eq!((second.objects.transferred, second.objects.skipped), (0, 3), "{second:?}");
    assert_eq!(second.bytes.transferred, 0);

    // Another client replaces a's object; c is touched locally.
    store.insert("p/a", data(11, 1000));
    set_mtime(&dir.path().join("c"), 3_000_000);
    let third = push_all(&store, dir.path()).await;
    assert_eq!((third.objects.transferred, third.objects.skipped), (2, 1), "{third:?}");
    assert_eq!(store.object("p/a").unwrap(), data(8, 1000));

    store.remove("p/b");
    let fourth = push_all(&store, dir.path()).await;
    assert_eq!((fourth.objects.transferred, fourth.objects.skipped), (1, 2), "{fourth:?}");
    assert_eq!(store.object("p/b").unwrap(), data(9, 2 * PART + 1));
}

#[tokio::test]
async fn a_successful_push_aborts_unrecorded_uploads_of_its_keys_and_no_others() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), data(12, 2 * PART)).unwrap();
    // A run killed between starting an upload and recording it, and uploads
    // that are someone else's: another key under the prefix, and the same
    // name outside it.
    let unrecorded = store.create_multipart("p/big").await.unwrap();
    let strangers = [store.create_multipart("p/not-ours").await.unwrap(), store.create_multipart("big").await.unwrap()];

    push_all(&store, dir.path()).await;
    assert!(!store.upload_is_open(&unrecorded), "the orphan of a killed run is aborted");
    for upload_id in &strangers {
        assert!(store.upload_is_open(upload_id), "{upload_id} is not this push's to abort");
    }
    assert_eq!(store.open_uploads(), strangers.len());
}

#[tokio::test]
async fn a_source_that_cannot_hold_state_is_pushed_without_resume() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), data(13, 1000)).unwrap();
    std::fs::write(dir.path().join("big"), data(14, 2 * PART)).unwrap();
    // A file where the state directory would go: no state, whoever runs it.
    std::fs::write(dir.path().join(STATE_DIR), b"").unwrap();
    let unrecorded = store.create_multipart("p/big").await.unwrap();

    assert_eq!(push_all(&store, dir.path()).await.objects.transferred, 2);
    let again = push_all(&store, dir.path()).await;
    assert_eq!((again.objects.transferred, again.objects.skipped), (2, 0), "nothing records what was pushed");
    assert!(!store.upload_is_open(&unrecorded), "the clean-up of its own keys needs no state");
    assert_eq!(store.object("p/big").unwrap(), data(14, 2 * PART));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pushes_of_one_directory_at_once_send_it_once() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    for i in 0..40u8 {
        std::fs::write(dir.path().join(format!("f{i:02}")), data(i, 64 << 10)).unwrap();
    }
    std::fs::write(dir.path().join("big"), data(99, 2 * PART + 3)).unwrap();

    let (first, second) = tokio::join!(push(engine(&store), dir.path(), "p/"), push(engine(&store), dir.path(), "p/"));
    let (first, second) = (first.unwrap(), second.unwrap());
    assert!(first.complete && second.complete, "{first:?} {second:?}");
    // The second waits for the first to end, then finds everything sent.
    let mut sent = [first.objects.transferred, second.objects.transferred];
    sent.sort_unstable();
    assert_eq!(sent, [0, 41], "{first:?} {second:?}");
    assert_eq!(first.objects.skipped + second.objects.skipped, 41);
    assert_eq!(store.calls().creates, 1, "one multipart upload for the big file");
    assert_eq!(store.open_uploads(), 0);
    assert_eq!(store.object("p/big").unwrap(), data(99, 2 * PART + 3));
}

#[tokio::test]
async fn a_resumed_upload_the_store_refuses_to_complete_is_sent_again_whole() {
    // A killed run's requests can still land while the next run assembles
    // its parts; whatever the store then refuses, the file is not lost.
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    let big = data(4, 3 * PART);
    std::fs::write(dir.path().join("big"), &big).unwrap();
    let upload_id = killed_push(&store, dir.path(), "big", PART, &[(1, &big[..PART])]).await;
    store.fail_completes([Fault::Reject]);
    let before = store.calls();

    let summary = push_all(&store, dir.path()).await;
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.resumed.bytes, 0, "nothing of the refused upload counts as kept: {summary:?}");
    assert_eq!(summary.bytes.transferred, 3 * PART as u64, "the whole file, once: {summary:?}");
    let after = store.calls();
    assert_eq!((after.parts - before.parts, after.creates - before.creates), (2 + 3, 1));
    assert!(!store.upload_is_open(&upload_id));
    assert_eq!(store.open_uploads(), 0);
    assert_eq!(store.object("p/big").unwrap(), big);
}

#[tokio::test]
async fn a_fresh_upload_the_store_refuses_to_complete_fails_once() {
    let store = Arc::new(MemoryStore::default());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), data(5, 2 * PART)).unwrap();
    store.fail_completes([Fault::Reject]);

    let summary = push(engine(&store), dir.path(), "p/").await.unwrap();
    assert!(!summary.complete, "{summary:?}");
    assert_eq!(store.calls().creates, 1, "no second upload without kept parts");
    assert_eq!(store.open_uploads(), 0);
}
