//! What a worker can serve its peers: the objects it holds in place,
//! verified, each at one version, and whether its run has ended.
//!
//! Only a pull's commit puts an object here (after verification and the
//! rename into place) or the pull's finding that an earlier run's file is
//! still the listed version; a partial or unverified file is never served.
//! Waiters (a peer's long poll) are woken on every change.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use ferry_contract::peers::wire::PeerState;
use tokio::sync::watch;

/// One object a worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Where the file is.
    pub path: PathBuf,
    /// The version (ETag) it is.
    pub etag: String,
    /// Its size.
    pub size: u64,
}

/// Whether a worker holds a version of an object, will, or will not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// In place, verified.
    Held(Held),
    /// Not yet; the run goes on.
    NotYet,
    /// Never in this run: it ended, or it holds another version.
    Never,
}

/// The objects a worker holds, keyed by object key.
#[derive(Debug)]
pub struct Catalog {
    objects: Mutex<HashMap<String, Held>>,
    bytes_done: AtomicU64,
    finished: AtomicBool,
    complete: AtomicBool,
    changed: watch::Sender<u64>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self {
            objects: Mutex::default(),
            bytes_done: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            changed: watch::Sender::new(0),
        }
    }
}

impl Catalog {
    /// Records that version `etag` of `key` is in place at `path`.
    pub fn hold(&self, key: &str, path: PathBuf, etag: &str, size: u64) {
        let held = Held { path, etag: etag.to_owned(), size };
        self.objects.lock().expect("catalog lock poisoned").insert(key.to_owned(), held);
        self.bytes_done.fetch_add(size, Relaxed);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Records that the run ended: `complete` when every object is in place.
    pub fn finish(&self, complete: bool) {
        self.complete.store(complete, Relaxed);
        self.finished.store(true, Relaxed);
        self.changed.send_modify(|n| *n += 1);
    }

    /// What this worker tells its peers about itself.
    pub fn state(&self) -> PeerState {
        PeerState {
            complete: self.complete.load(Relaxed),
            finished: self.finished.load(Relaxed),
            bytes_done: self.bytes_done.load(Relaxed),
        }
    }

    /// Whether version `etag` of `key` is here, will be, or will not.
    pub fn holding(&self, key: &str, etag: &str) -> Holding {
        match self.objects.lock().expect("catalog lock poisoned").get(key) {
            Some(held) if held.etag == etag => Holding::Held(held.clone()),
            // Another version: this worker listed the store at another
            // moment; the asker reads the store.
            Some(_) => Holding::Never,
            None if self.finished.load(Relaxed) => Holding::Never,
            None => Holding::NotYet,
        }
    }

    /// Waits up to `patience` for version `etag` of `key` to be held or
    /// known never to be.
    pub async fn wait_for(&self, key: &str, etag: &str, patience: Duration) -> Holding {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let holding = self.holding(key, etag);
            if holding != Holding::NotYet {
                return holding;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the catalog is gone with the run.
                _ => return self.holding(key, etag),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_waiter_is_answered_when_the_object_lands_or_the_run_ends() {
        let catalog = Arc::new(Catalog::default());
        assert_eq!(catalog.holding("a", "e1"), Holding::NotYet);
        let waiting = tokio::spawn({
            let catalog = Arc::clone(&catalog);
            async move { catalog.wait_for("a", "e1", Duration::from_secs(10)).await }
        });
        tokio::task::yield_now().await;
        catalog.hold("a", "/d/a".into(), "e1", 3);
        assert!(matches!(waiting.await.unwrap(), Holding::Held(Held { size: 3, .. })));
        assert_eq!(catalog.holding("a", "e2"), Holding::Never, "another version is never served");
        assert_eq!(catalog.wait_for("b", "e", Duration::from_millis(10)).await, Holding::NotYet);
        catalog.finish(false);
        assert_eq!(catalog.holding("b", "e"), Holding::Never);
        assert_eq!(catalog.state(), PeerState { complete: false, finished: true, bytes_done: 3 });
    }
}
