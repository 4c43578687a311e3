//! Pulls run again over what earlier pulls staged, against an in-memory
//! store: what each run says it changed, the snapshot it reports, and what
//! `--delete-removed` removes, including after runs that must not remove
//! anything. (The conformance suite runs the same story against real
//! servers; here objects come and go, and requests fail, on demand.)

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::summary::{Amount, Changes, Snapshot};

use super::{Engine, RetryPolicy, TransferConfig, pull::pull, tally::Summary};
use crate::metrics::Metrics;
use crate::selection::{Selection, Shard};
use crate::store::memory::{Fault, MemoryStore};

fn engine(store: &Arc<MemoryStore>, selection: Selection) -> Arc<Engine> {
    let config = TransferConfig {
        concurrency: 4,
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        selection,
        ..TransferConfig::default()
    };
    Engine::new(Arc::clone(store) as _, config, Arc::new(Metrics::new())).unwrap()
}

/// One pull of `p/` into `dir` with a fresh engine (a run of its own).
async fn pull_all(store: &Arc<MemoryStore>, dir: &Path, delete_removed: bool) -> Summary {
    pull(engine(store, Selection::all()), "p/", dir, delete_removed).await.unwrap()
}

async fn pull_shard(store: &Arc<MemoryStore>, dir: &Path, index: u32, count: u32) -> Summary {
    let selection = Selection::new(&[], &[], Some(Shard { index, count })).unwrap();
    pull(engine(store, selection), "p/", dir, true).await.unwrap()
}

/// `p/a` (10 B) and `p/b` (20 B) staged, then `p/b` removed from the store.
async fn staged_a_and_b_then_b_removed() -> (Arc<MemoryStore>, tempfile::TempDir) {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/a", vec![1; 10]);
    store.insert("p/b", vec![2; 20]);
    let dir = tempfile::tempdir().unwrap();
    pull_all(&store, dir.path(), true).await;
    store.remove("p/b");
    (store, dir)
}

fn amount(objects: u64, bytes: u64) -> Amount {
    Amount { objects, bytes }
}

fn changes(summary: &Summary) -> Changes {
    summary.changes.expect("a pull reports its changes")
}

fn snapshot(summary: &Summary) -> Snapshot {
    summary.snapshot.clone().expect("a complete pull reports its snapshot")
}

#[tokio::test]
async fn a_resync_counts_what_it_added_and_updated_and_removes_only_when_asked() {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/a", vec![1; 10]);
    store.insert("p/b", vec![2; 20]);
    store.insert("p/gone/deep/c", vec![3; 30]);
    store.insert("other/x", vec![9; 90]);
    let dir = tempfile::tempdir().unwrap();

    let first = pull_all(&store, dir.path(), true).await;
    assert_eq!(changes(&first), Changes { added: amount(3, 60), ..Changes::default() });
    assert_eq!((snapshot(&first).objects, snapshot(&first).bytes), (3, 60));

    // One object changes, one arrives, one leaves the store.
    store.insert("p/a", vec![4; 11]);
    store.insert("p/new", vec![5; 50]);
    store.remove("p/gone/deep/c");

    let without = pull_all(&store, dir.path(), false).await;
    assert!(without.complete, "{without:?}");
    let expected = Changes { added: amount(1, 50), updated: amount(1, 11), removed: Amount::default() };
    assert_eq!(changes(&without), expected);
    assert!(dir.path().join("gone/deep/c").exists(), "nothing is removed without --delete-removed");

    // The run without the flag kept the file in the manifest, so this one can remove it.
    let with = pull_all(&store, dir.path(), true).await;
    assert_eq!(changes(&with), Changes { removed: amount(1, 30), ..Changes::default() });
    assert_eq!((with.objects.transferred, with.objects.skipped), (0, 3));
    assert!(!dir.path().join("gone").exists(), "directories emptied by the removal go too");
    assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), vec![4; 11]);
    assert_eq!(snapshot(&with), snapshot(&without), "the same objects in place are the same snapshot");

    let again = pull_all(&store, dir.path(), true).await;
    assert_eq!(changes(&again), Changes::default());
    assert!(dir.path().exists());
}

#[tokio::test]
async fn a_run_with_failures_removes_nothing_and_the_next_complete_run_does() {
    let (store, dir) = staged_a_and_b_then_b_removed().await;
    store.insert("p/c", vec![3; 30]);
    store.fail_gets("p/c", [Fault::Reject]);
    let failed = pull_all(&store, dir.path(), true).await;
    assert!(!failed.complete);
    assert_eq!(failed.snapshot, None, "a partial run staged no version of the dataset");
    assert_eq!(changes(&failed).removed, Amount::default());
    assert!(dir.path().join("b").exists(), "an incomplete run removes nothing");

    let complete = pull_all(&store, dir.path(), true).await;
    assert!(complete.complete, "{complete:?}");
    assert_eq!(changes(&complete), Changes { added: amount(1, 30), removed: amount(1, 20), ..Changes::default() });
    assert!(!dir.path().join("b").exists());
}

#[tokio::test]
async fn a_refused_key_makes_the_run_incomplete_so_nothing_is_removed() {
    let (store, dir) = staged_a_and_b_then_b_removed().await;
    store.insert("p/x/../b", vec![6; 60]);
    let run = pull_all(&store, dir.path(), true).await;
    assert!(!run.complete);
    assert!(run.failures[0].error.contains("refused"), "{:?}", run.failures);
    assert_eq!(changes(&run).removed, Amount::default());
    assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), vec![2; 20]);
}

#[tokio::test]
async fn shards_remove_only_their_own_files_and_their_snapshots_add_up() {
    let store = Arc::new(MemoryStore::default());
    for i in 0..40u8 {
        store.insert(&format!("p/f{i:02}"), vec![i; 100 + usize::from(i)]);
    }
    let shared = tempfile::tempdir().unwrap();
    for index in 0..2 {
        pull_shard(&store, shared.path(), index, 2).await;
    }
    let gone: Vec<String> = (0..40).step_by(4).map(|i| format!("f{i:02}")).collect();
    for name in &gone {
        store.remove(&format!("p/{name}"));
    }
    let owner = |name: &str| (0..2).find(|&index| Shard { index, count: 2 }.owns(name)).unwrap();
    let owned_by_0 = gone.iter().filter(|name| owner(name) == 0).count() as u64;
    assert!(owned_by_0 > 0 && owned_by_0 < gone.len() as u64, "both shards own removed objects");

    let shard0 = pull_shard(&store, shared.path(), 0, 2).await;
    assert_eq!(changes(&shard0).removed.objects, owned_by_0);
    for name in &gone {
        assert_eq!(shared.path().join(name).exists(), owner(name) == 1, "{name}: shard 0 removes only its own");
    }
    let shard1 = pull_shard(&store, shared.path(), 1, 2).await;
    assert_eq!(changes(&shard1).removed.objects, gone.len() as u64 - owned_by_0);
    assert!(gone.iter().all(|name| !shared.path().join(name).exists()));

    let whole_dir = tempfile::tempdir().unwrap();
    let whole = pull_all(&store, whole_dir.path(), true).await;
    assert_eq!(Snapshot::combine([&snapshot(&shard0), &snapshot(&shard1)]), Some(snapshot(&whole)));
}

#[tokio::test]
async fn snapshots_are_equal_exactly_when_the_objects_are() {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/a", vec![1; 10]);
    store.insert("p/sub/b", vec![2; 20]);
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = snapshot(&pull_all(&store, one.path(), false).await);
    let copied = snapshot(&pull_all(&store, two.path(), false).await);
    let reused = snapshot(&pull_all(&store, one.path(), false).await);
    assert_eq!(first, copied, "two destinations, the same data");
    assert_eq!(first, reused, "copied or reused, the same data");

    store.insert("p/a", vec![7; 10]);
    let changed = snapshot(&pull_all(&store, one.path(), false).await);
    assert_ne!(changed.digest, first.digest, "same size, new content: a new version");
    assert_eq!((changed.objects, changed.bytes), (first.objects, first.bytes));
}

#[tokio::test]
async fn a_file_a_narrower_selection_leaves_out_stays_known_and_a_clean_up_removes_it() {
    let store = Arc::new(MemoryStore::default());
    store.insert("p/a", vec![1; 10]);
    store.insert("p/b", vec![2; 20]);
    let dir = tempfile::tempdir().unwrap();
    pull_all(&store, dir.path(), true).await;
    // Only `a` now: `b` is neither copied nor removed (it is still in the
    // store), and stays in the manifest.
    let only_a = Selection::new(&["a".to_owned()], &[], None).unwrap();
    let narrower = pull(engine(&store, only_a), "p/", dir.path(), true).await.unwrap();
    assert_eq!(changes(&narrower), Changes::default());
    assert_eq!(std::fs::read(dir.path().join("b")).unwrap(), vec![2; 20]);
    let report = crate::local::clean::clean(dir.path(), None).unwrap();
    assert_eq!(report.files_removed, 2, "{report:?}");
    assert!(!dir.path().join("b").exists());
}
