//! Pulls of the same objects into two directories of one filesystem that
//! share a shared-objects directory: the second pull links what the first
//! fetched, each directory stays whole when the other is re-synced or
//! cleaned, and objects go once no directory links them.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::summary::Amount;

use super::capacity::{CapacityCheck, FreeSpace};
use super::{Engine, RetryPolicy, SharedObjectsDir, TransferConfig, pull::pull, tally::Summary};
use crate::local::clean::clean;
use crate::local::shared_objects::OBJECTS_DIR;
use crate::metrics::Metrics;
use crate::store::memory::MemoryStore;

/// Small parts, so that the large object below is fetched in ranges (the
/// partial-object path) and the small ones in memory.
const PART: u64 = 1 << 20;

fn engine(store: &Arc<MemoryStore>, shared: &Path) -> Arc<Engine> {
    Engine::new(Arc::clone(store) as _, config(Some(shared)), Arc::new(Metrics::new())).unwrap()
}

fn config(shared: Option<&Path>) -> TransferConfig {
    TransferConfig {
        concurrency: 4,
        part_size: PART,
        grow_ranges: false,
        write_buffer: 64 << 10,
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        shared_objects: shared.map(|dir| SharedObjectsDir { dir: dir.to_owned(), endpoint: None }),
        ..TransferConfig::default()
    }
}

async fn pull_into(store: &Arc<MemoryStore>, shared: &Path, dir: &Path, delete_removed: bool) -> Summary {
    pull(engine(store, shared), "p/", dir, delete_removed).await.unwrap()
}

/// Every object file in the shared directory.
fn objects(shared: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for fan in std::fs::read_dir(shared.join(OBJECTS_DIR)).unwrap() {
        for object in std::fs::read_dir(fan.unwrap().path()).unwrap() {
            found.push(object.unwrap().path());
        }
    }
    found.sort();
    found
}

/// The bytes the tree below `root` takes, each inode once (as `du` counts).
fn bytes_on_disk(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                total += meta.len();
            }
        }
    }
    total
}

fn dataset(store: &MemoryStore) -> u64 {
    let large = vec![7u8; (3 * PART + 5) as usize];
    let sizes = [10u64, 20, large.len() as u64];
    store.insert("p/a", vec![1; 10]);
    store.insert("p/dir/b", vec![2; 20]);
    store.insert("p/large", large);
    sizes.iter().sum()
}

#[tokio::test]
async fn a_second_directory_links_what_the_first_fetched_and_each_survives_the_other() {
    let store = Arc::new(MemoryStore::default());
    let total = dataset(&store);
    let node = tempfile::tempdir().unwrap();
    let (shared, first, second) = (node.path().join(".shared"), node.path().join("first"), node.path().join("second"));

    let fetched = pull_into(&store, &shared, &first, true).await;
    assert!(fetched.complete, "{fetched:?}");
    assert_eq!(fetched.bytes.transferred, total);
    assert_eq!(fetched.shared, Amount::default());
    assert_eq!(objects(&shared).len(), 3, "every fetched object is kept for others");

    let linked = pull_into(&store, &shared, &second, true).await;
    assert!(linked.complete, "{linked:?}");
    assert_eq!(linked.bytes.transferred, 0, "nothing fetched: {linked:?}");
    assert_eq!(linked.shared, Amount { objects: 3, bytes: total });
    assert_eq!(linked.objects.skipped, 3);
    assert_eq!(linked.changes.unwrap().added, Amount { objects: 3, bytes: total });
    assert_eq!(linked.snapshot, fetched.snapshot, "the same version is in place");
    for rel in ["a", "dir/b", "large"] {
        let (one, two) = (std::fs::metadata(first.join(rel)).unwrap(), std::fs::metadata(second.join(rel)).unwrap());
        assert_eq!((one.dev(), one.ino()), (two.dev(), two.ino()), "{rel} is one file");
        assert_eq!(one.nlink(), 3, "{rel}: two directories and the store");
    }
    // What both take is one copy (and their manifests).
    let used = bytes_on_disk(node.path());
    assert!(used >= total && used < total + 16 * 1024, "{used} bytes on disk for {total} bytes of data");

    // A run again over a directory that is already complete links nothing.
    let again = pull_into(&store, &shared, &second, true).await;
    assert_eq!((again.shared, again.objects.skipped, again.bytes.transferred), (Amount::default(), 3, 0));

    // One object changes in the store; only the first directory re-syncs.
    store.insert("p/a", vec![9; 11]);
    let resynced = pull_into(&store, &shared, &first, true).await;
    assert_eq!(resynced.bytes.transferred, 11);
    assert_eq!(std::fs::read(first.join("a")).unwrap(), vec![9; 11]);
    assert_eq!(std::fs::read(second.join("a")).unwrap(), vec![1; 10], "the other directory keeps its version");
    assert_eq!(objects(&shared).len(), 4, "the old version is still linked by the second directory");

    // Cleaning the first leaves the second whole, and its old version of
    // `a` (still linked by the second) stays in the store.
    let report = clean(&first, Some(&shared)).unwrap();
    assert_eq!(report.files_removed, 3);
    let collected = report.shared_objects.unwrap();
    assert_eq!((collected.objects_removed, collected.bytes_freed, collected.objects_kept), (1, 11, 3));
    assert_eq!(std::fs::read(second.join("a")).unwrap(), vec![1; 10]);
    assert_eq!(std::fs::read(second.join("dir/b")).unwrap(), vec![2; 20]);
    assert_eq!(std::fs::read(second.join("large")).unwrap(), vec![7u8; (3 * PART + 5) as usize]);

    // The second re-syncs: its `a` is replaced, and the old object, linked
    // by no directory any more, is removed at the end of that run.
    let caught_up = pull_into(&store, &shared, &second, true).await;
    assert_eq!(caught_up.changes.unwrap().updated.objects, 1);
    assert_eq!(objects(&shared).len(), 3);

    let last = clean(&second, Some(&shared)).unwrap().shared_objects.unwrap();
    assert_eq!((last.objects_removed, last.objects_kept), (3, 0));
    assert!(objects(&shared).is_empty());
    assert!(bytes_on_disk(node.path()) < 1024, "nothing is left but empty directories");
}

#[tokio::test]
async fn an_unusable_shared_directory_costs_space_not_files() {
    let store = Arc::new(MemoryStore::default());
    let total = dataset(&store);
    let node = tempfile::tempdir().unwrap();
    // A file where the directory should be: nothing can be created there.
    let blocked = node.path().join("blocked");
    std::fs::write(&blocked, b"").unwrap();
    let (first, second) = (node.path().join("first"), node.path().join("second"));
    for dir in [&first, &second] {
        let summary = pull_into(&store, &blocked, dir, false).await;
        assert!(summary.complete, "{summary:?}");
        assert_eq!((summary.bytes.transferred, summary.shared), (total, Amount::default()));
    }
    assert_eq!(std::fs::read(second.join("dir/b")).unwrap(), vec![2; 20]);
}

#[tokio::test]
async fn an_object_of_the_right_identity_but_another_size_is_fetched_not_linked() {
    let store = Arc::new(MemoryStore::default());
    dataset(&store);
    let node = tempfile::tempdir().unwrap();
    let (shared, first, second) = (node.path().join(".shared"), node.path().join("first"), node.path().join("second"));
    pull_into(&store, &shared, &first, false).await;
    // Someone truncates a stored object: it is no longer what its name says.
    let victim = objects(&shared).into_iter().find(|p| std::fs::metadata(p).unwrap().len() == 20).unwrap();
    std::fs::remove_file(&victim).unwrap();
    std::fs::write(&victim, b"short").unwrap();
    let summary = pull_into(&store, &shared, &second, false).await;
    assert_eq!(summary.shared.objects, 2);
    assert_eq!(summary.bytes.transferred, 20);
    assert_eq!(std::fs::read(second.join("dir/b")).unwrap(), vec![2; 20]);
}

/// 5 MiB free on a disk of 64 MiB, whatever is written.
fn five_mib_free(_: &Path) -> std::io::Result<Option<FreeSpace>> {
    Ok(Some(FreeSpace { available: 5 << 20, block_size: 4096, total: 64 << 20, device: 7 << 8 | 3 }))
}

#[tokio::test]
async fn what_the_shared_objects_hold_takes_no_room_in_the_free_space_check() {
    let store = Arc::new(MemoryStore::default());
    let total = dataset(&store);
    let node = tempfile::tempdir().unwrap();
    let shared = node.path().join(".shared");
    pull_into(&store, &shared, &node.path().join("first"), false).await;

    // A 2 MiB reserve: the ~3 MiB dataset and the reserve do not fit in
    // 5 MiB, but linking it needs no room.
    let checked = |shared: Option<&Path>| {
        let capacity =
            Some(CapacityCheck { probe: five_mib_free, ..CapacityCheck::with_reserve("2MiB".parse().unwrap()) });
        let config = TransferConfig { capacity, ..config(shared) };
        Engine::new(Arc::clone(&store) as _, config, Arc::new(Metrics::new())).unwrap()
    };
    let linked = pull(checked(Some(&shared)), "p/", &node.path().join("second"), false).await.unwrap();
    assert_eq!(linked.shared, Amount { objects: 3, bytes: total });
    let refused = pull(checked(None), "p/", &node.path().join("third"), false).await.unwrap_err();
    assert_eq!(refused.reason(), ferry_contract::Reason::InsufficientCapacity, "{refused}");
}

#[tokio::test]
async fn two_pulls_of_the_same_objects_at_the_same_time_end_with_one_copy() {
    let store = Arc::new(MemoryStore::default());
    dataset(&store);
    let node = tempfile::tempdir().unwrap();
    let (shared, first, second) = (node.path().join(".shared"), node.path().join("first"), node.path().join("second"));
    let (one, two) =
        tokio::join!(pull_into(&store, &shared, &first, false), pull_into(&store, &shared, &second, false));
    assert!(one.complete && two.complete, "{one:?} {two:?}");
    for rel in ["a", "dir/b", "large"] {
        let (a, b) = (std::fs::metadata(first.join(rel)).unwrap(), std::fs::metadata(second.join(rel)).unwrap());
        assert_eq!(a.ino(), b.ino(), "{rel}: whichever stored it first, the other links it");
        assert_eq!(a.nlink(), 3, "{rel}");
    }
    assert_eq!(objects(&shared).len(), 3);
    // The manifests recorded the files as they are now: a re-run reuses
    // every one, and a clean-up removes them.
    let again = pull_into(&store, &shared, &second, false).await;
    assert_eq!((again.objects.skipped, again.bytes.transferred), (3, 0));
    assert_eq!(clean(&second, Some(&shared)).unwrap().files_removed, 3);
}
