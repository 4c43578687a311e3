//! What a worker can serve its peers: the objects it holds in place,
//! verified, each at one version, and whether its run has ended.
//!
//! Only a pull's commit puts an object here (after verification and the
//! rename into place) or the pull's finding that an earlier run's file is
//! still the listed version. Besides, an object fetched in ranges, and one
//! of one range this worker reads from the store for its peers, is
//! *landing* ([`Catalog::landing`]) from its first byte until it is
//! committed or abandoned: peers read the ranges already written from the
//! file being written, so a large object flows through the fleet while it
//! is still arriving. Such bytes are not verified yet, and nor are any
//! peer's to its reader: every reader checks the whole object against the
//! store's checksum before its own rename. Ranges this worker reads from a
//! peer are not passed on while landing ([`Catalog::reading_from_a_peer`]).
//! Waiters (a peer's long poll, a range not written yet) are woken on every
//! change.
//!
//! Memory does not grow with the object count: past [`MEMORY`] bytes of
//! entries, those with the smallest keys go to disk in key order
//! ([`super::spill`]), into the run's scratch directory
//! ([`Catalog::spill_into`]). Peers ask for about the keys this worker
//! staged last (every worker lists the store in the same order), which are
//! still in memory; a peer that lags behind is answered from disk, one
//! block read per lookup.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::Bound::{Excluded, Unbounded};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_contract::peers::wire::{ObjectQuery, PeerState, WaitAnswer};
use tokio::sync::watch;

pub use super::spill::Held;
use super::spill::Run;

/// Bytes of entries a catalog holds in memory before it writes some to
/// disk. Enough for the thousands of objects a pull has in flight to
/// commit out of order without starting a new run on disk.
pub const MEMORY: usize = 2 << 20;

/// An object a worker is fetching in ranges now.
#[derive(Clone, Debug)]
pub struct Landing {
    /// The file being written (a temporary or partial file, renamed into
    /// place once verified: the handle reads the same bytes either way).
    pub file: Arc<File>,
    /// The object's size.
    pub size: u64,
    /// Ranges written so far, start → end, merged and not overlapping.
    written: BTreeMap<u64, u64>,
}

impl Landing {
    /// Whether `start..end` is written.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        start >= end || self.written.range(..=start).next_back().is_some_and(|(_, written_end)| *written_end >= end)
    }

    /// Where the written bytes from `offset` on end (`offset` itself when
    /// the byte there is not written yet).
    pub fn written_until(&self, offset: u64) -> u64 {
        match self.written.range(..=offset).next_back() {
            Some((_, end)) if *end > offset => *end,
            _ => offset,
        }
    }

    /// Adds `start..end` to what is written, merging neighbours.
    fn add(&mut self, mut start: u64, mut end: u64) {
        if let Some((&before, &before_end)) = self.written.range(..=start).next_back()
            && before_end >= start
        {
            start = before;
            end = end.max(before_end);
        }
        while let Some((&next, &next_end)) = self.written.range(start..).next()
            && next <= end
        {
            self.written.remove(&next);
            end = end.max(next_end);
        }
        self.written.insert(start, end);
    }
}

impl PartialEq for Landing {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.file, &other.file) && self.size == other.size && self.written == other.written
    }
}

impl Eq for Landing {}

/// An object landing, by key.
#[derive(Debug)]
struct LandingEntry {
    /// Which landing (an object retried after a mismatch lands anew).
    id: u64,
    etag: String,
    landing: Landing,
    /// Ranges this worker reads from a peer rather than the store: not
    /// passed on while landing ([`ferry_contract::peers::wire::SECOND_HAND`]).
    /// Kept here, not in [`Landing`], which is copied for every chunk served.
    from_peers: Vec<(u64, u64)>,
}

/// Whether a worker holds a version of an object, will, or will not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    /// In place, verified.
    Held(Held),
    /// Being fetched in ranges; what is written can be read.
    Landing(Landing),
    /// Not yet; the run goes on.
    NotYet,
    /// Never in this run: it ended, or it holds another version.
    Never,
}

/// The objects a worker holds, keyed by object key.
#[derive(Debug)]
pub struct Catalog {
    entries: Mutex<Entries>,
    /// Objects being fetched in ranges: at most the objects in flight.
    landing: Mutex<HashMap<String, LandingEntry>>,
    next_landing: AtomicU64,
    bytes_done: AtomicU64,
    finished: AtomicBool,
    complete: AtomicBool,
    changed: watch::Sender<u64>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Entries::new(MEMORY)),
            landing: Mutex::default(),
            next_landing: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            complete: AtomicBool::new(false),
            changed: watch::Sender::new(0),
        }
    }
}

impl Catalog {
    /// A catalog that holds about `memory` bytes of entries in memory.
    #[cfg(test)]
    fn with_memory(memory: usize) -> Self {
        let catalog = Self::default();
        catalog.hold_in_memory(memory);
        catalog
    }

    /// Holds about `memory` bytes of entries in memory from now on (an
    /// empty catalog: what it held is forgotten).
    #[cfg(test)]
    pub(crate) fn hold_in_memory(&self, memory: usize) {
        *self.lock() = Entries::new(memory);
    }

    /// Sorted runs written to disk so far.
    #[cfg(test)]
    pub(crate) fn runs_on_disk(&self) -> usize {
        self.lock().runs.len()
    }

    /// Lets entries beyond [`MEMORY`] go to files in `dir` (a run's scratch
    /// directory). Until then, and if `dir` cannot be written, they stay
    /// in memory.
    pub fn spill_into(&self, dir: PathBuf) {
        self.lock().spill_dir = Some(dir);
    }

    /// Records that version `etag` of `key` is in place at `path`. Every
    /// object is kept, not only this worker's share: a worker that joins
    /// later sees a larger group, in which a key may have another owner.
    pub fn hold(&self, key: &str, path: PathBuf, etag: &str, size: u64) {
        self.lock().insert(key, Held { path, etag: etag.to_owned(), size });
        self.bytes_done.fetch_add(size, Relaxed);
        self.changed.send_modify(|n| *n += 1);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().expect("catalog lock poisoned")
    }

    fn lock_landing(&self) -> std::sync::MutexGuard<'_, HashMap<String, LandingEntry>> {
        self.landing.lock().expect("landing lock poisoned")
    }

    /// Records that version `etag` of `key` (`size` bytes) is being written
    /// to `file`, with the `written` ranges already there (an earlier run's,
    /// resumed). Returns the landing's id, for [`Catalog::landed`] and
    /// [`Catalog::unland`].
    pub fn landing(&self, key: &str, etag: &str, size: u64, file: Arc<File>, written: &[(u64, u64)]) -> u64 {
        let id = self.next_landing.fetch_add(1, Relaxed);
        let mut landing = Landing { file, size, written: BTreeMap::new() };
        for (start, end) in written {
            landing.add(*start, *end);
        }
        let entry = LandingEntry { id, etag: etag.to_owned(), landing, from_peers: Vec::new() };
        self.lock_landing().insert(key.to_owned(), entry);
        self.changed.send_modify(|n| *n += 1);
        id
    }

    /// Whether version `etag` of `key` is landing here, served as it lands.
    pub fn is_landing(&self, key: &str, etag: &str) -> bool {
        self.lock_landing().get(key).is_some_and(|entry| entry.etag == etag)
    }

    /// Bytes `start..end` of landing `id` of `key` are written.
    pub fn landed(&self, key: &str, id: u64, start: u64, end: u64) {
        if let Some(entry) = self.lock_landing().get_mut(key).filter(|entry| entry.id == id) {
            entry.landing.add(start, end);
        }
        self.bytes_done.fetch_add(end.saturating_sub(start), Relaxed);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Bytes `range` of version `etag` of `key`, landing, are read from a
    /// peer (`from_a_peer`), or no longer (it goes to another source: the
    /// peer failed, or the range is read from the store again). Marked
    /// before the request, so before any of its bytes land.
    pub fn reading_from_a_peer(&self, key: &str, etag: &str, range: &std::ops::Range<u64>, from_a_peer: bool) {
        let mut landing = self.lock_landing();
        let Some(entry) = landing.get_mut(key).filter(|entry| entry.etag == etag) else { return };
        let (marks, mark) = (&mut entry.from_peers, (range.start, range.end));
        match marks.iter().position(|m| *m == mark) {
            None if from_a_peer => marks.push(mark),
            Some(at) if !from_a_peer => {
                marks.swap_remove(at);
            }
            _ => {}
        }
    }

    /// Where the bytes of `key` landing in `file` from `offset` on, up to
    /// `until`, stop being ones this worker reads from the store: the
    /// first byte in `offset..until` of a range it reads from a peer
    /// (`offset` itself when that byte is one), or `until`.
    pub fn from_the_store_until(&self, key: &str, file: &Arc<File>, offset: u64, until: u64) -> u64 {
        let landing = self.lock_landing();
        let Some(entry) = landing.get(key).filter(|entry| Arc::ptr_eq(&entry.landing.file, file)) else { return until };
        entry
            .from_peers
            .iter()
            .filter(|(start, end)| *start < until && *end > offset)
            .map(|(start, _)| (*start).max(offset))
            .min()
            .unwrap_or(until)
    }

    /// Landing `id` of `key` ended: committed (then [`Catalog::hold`] came
    /// first) or abandoned.
    pub fn unland(&self, key: &str, id: u64) {
        let mut landing = self.lock_landing();
        if landing.get(key).is_some_and(|entry| entry.id == id) {
            landing.remove(key);
        }
        drop(landing);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Waits for changes: a subscription wakes on every hold, landed range
    /// and end of a run.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The landing of version `etag` of `key`, if it is landing.
    fn landing_of(landing: &HashMap<String, LandingEntry>, key: &str, etag: &str) -> Option<Landing> {
        landing.get(key).filter(|entry| entry.etag == etag).map(|entry| entry.landing.clone())
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
        // Read before the lookup: a run that had finished then committed
        // everything it ever will, so a miss is final.
        let finished = self.finished.load(Relaxed);
        let found = self.lock().get(key);
        let landing = Self::landing_of(&self.lock_landing(), key, etag);
        Self::judge(key, etag, found, landing, finished)
    }

    /// What a lookup of `key` says about version `etag`.
    fn judge(
        key: &str,
        etag: &str,
        found: std::io::Result<Option<Held>>,
        landing: Option<Landing>,
        finished: bool,
    ) -> Holding {
        match found {
            Ok(Some(held)) if held.etag == etag => Holding::Held(held),
            // Landing anew: the version in place (an earlier run's) is
            // being replaced by the one asked for.
            _ if landing.is_some() => Holding::Landing(landing.expect("just checked")),
            // Another version: this worker listed the store at another
            // moment; the asker reads the store.
            Ok(Some(_)) => Holding::Never,
            Ok(None) if finished => Holding::Never,
            Ok(None) => Holding::NotYet,
            Err(error) => {
                // The asker reads the store instead.
                tracing::warn!(%error, %key, "the peer catalog cannot read its entries back");
                Holding::Never
            }
        }
    }

    /// Which of `objects` are settled (held, or never to be), by index.
    pub(crate) fn settled(&self, objects: &[ObjectQuery]) -> WaitAnswer {
        let finished = self.finished.load(Relaxed);
        let mut answer = WaitAnswer { state: self.state(), ..WaitAnswer::default() };
        let entries = self.lock();
        let landing = self.lock_landing();
        for (index, object) in (0u32..).zip(objects) {
            let landing = Self::landing_of(&landing, &object.key, &object.etag);
            match Self::judge(&object.key, &object.etag, entries.get(&object.key), landing, finished) {
                Holding::Held(_) => answer.held.push(index),
                Holding::Landing(_) => answer.landing.push(index),
                Holding::Never => answer.never.push(index),
                Holding::NotYet => {}
            }
        }
        answer
    }

    /// Waits up to `patience` until any of `objects` is held or known never
    /// to be; answers which are settled. It answers at once rather than
    /// gather more: the asker's next request follows within a round trip,
    /// and a fleet of small objects ran 2.6 times longer with a 10 ms
    /// gathering delay (each worker's listing waits on its peers' answers).
    pub async fn wait_for_any(&self, objects: &[ObjectQuery], patience: Duration) -> WaitAnswer {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let answer = self.settled(objects);
            if answer.settles_any() {
                return answer;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                // Timed out, or the catalog is gone with the run.
                _ => return self.settled(objects),
            }
        }
    }
}

/// The entries: the newest in memory, the rest in sorted runs on disk.
#[derive(Debug)]
struct Entries {
    recent: BTreeMap<String, Held>,
    /// About how many bytes `recent` takes.
    recent_bytes: usize,
    /// How many bytes `recent` may take before some go to disk.
    memory: usize,
    spill_dir: Option<PathBuf>,
    /// Oldest first; only the last one is still appended to.
    runs: Vec<Run>,
    /// A write to disk failed (told once; the entries stayed in memory).
    spill_failed: bool,
}

impl Entries {
    fn new(memory: usize) -> Self {
        Self {
            recent: BTreeMap::new(),
            recent_bytes: 0,
            memory,
            spill_dir: None,
            runs: Vec::new(),
            spill_failed: false,
        }
    }

    /// About what one entry held in memory takes: the key's and the
    /// entry's allocations and its share of the tree's nodes.
    fn resident(key: &str, held: &Held) -> usize {
        key.len()
            + held.path.as_os_str().len()
            + held.etag.len()
            + 3 * 16
            + std::mem::size_of::<String>()
            + std::mem::size_of::<Held>()
            + 16
    }

    fn insert(&mut self, key: &str, held: Held) {
        self.recent_bytes += Self::resident(key, &held);
        if let Some(old) = self.recent.insert(key.to_owned(), held) {
            self.recent_bytes -= Self::resident(key, &old);
        }
        if self.recent_bytes > self.memory {
            self.spill();
        }
    }

    /// Writes entries to disk until half the memory is free: each time the
    /// smallest key above the current run's last, or, when none is left,
    /// the smallest of all into a new run.
    fn spill(&mut self) {
        let Some(dir) = self.spill_dir.clone() else { return };
        while self.recent_bytes > self.memory / 2 {
            let next_in_run = self.runs.last().and_then(Run::last_key).and_then(|last| {
                self.recent.range::<str, _>((Excluded(last), Unbounded)).next().map(|(key, _)| key.clone())
            });
            let key = match next_in_run {
                Some(key) => key,
                None => {
                    match Run::create(&dir, self.runs.len()) {
                        Ok(run) => self.runs.push(run),
                        Err(error) => return self.spill_failed(&error),
                    }
                    self.recent.keys().next().expect("over its memory, so not empty").clone()
                }
            };
            let (key, held) = self.recent.remove_entry(&key).expect("a key just found");
            self.recent_bytes -= Self::resident(&key, &held);
            let appended = self.runs.last_mut().expect("a run to append to").append(&key, &held);
            if let Err(error) = appended {
                return self.spill_failed(&error);
            }
        }
    }

    fn spill_failed(&mut self, error: &std::io::Error) {
        if !self.spill_failed {
            self.spill_failed = true;
            tracing::warn!(%error, "the peer catalog cannot write to disk: it keeps its entries in memory");
        }
    }

    /// The entry for `key`, the newest if there are several.
    ///
    /// # Errors
    /// A run on disk cannot be read back.
    fn get(&self, key: &str) -> std::io::Result<Option<Held>> {
        if let Some(held) = self.recent.get(key) {
            return Ok(Some(held.clone()));
        }
        for run in self.runs.iter().rev() {
            if let Some(held) = run.get(key)? {
                return Ok(Some(held));
            }
        }
        Ok(None)
    }

    /// Bytes held in memory.
    #[cfg(test)]
    fn resident_bytes(&self) -> usize {
        self.recent_bytes + self.runs.iter().map(Run::resident_bytes).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn query(key: &str, etag: &str) -> ObjectQuery {
        ObjectQuery { key: key.into(), etag: etag.into() }
    }

    #[tokio::test]
    async fn a_waiter_is_answered_when_any_object_lands_or_the_run_ends() {
        let catalog = Arc::new(Catalog::default());
        assert_eq!(catalog.holding("a", "e1"), Holding::NotYet);
        let asked = vec![query("b", "e"), query("a", "e1"), query("c", "e")];
        let waiting = tokio::spawn({
            let (catalog, asked) = (Arc::clone(&catalog), asked.clone());
            async move { catalog.wait_for_any(&asked, Duration::from_secs(10)).await }
        });
        tokio::task::yield_now().await;
        catalog.hold("a", "/d/a".into(), "e1", 3);
        let answer = waiting.await.unwrap();
        assert_eq!((answer.held, answer.never), (vec![1], vec![]));
        assert_eq!(answer.state.bytes_done, 3);
        catalog.hold("c", "/d/c".into(), "e", 1);
        let answer = catalog.wait_for_any(&asked, Duration::from_secs(10)).await;
        assert_eq!((answer.held, answer.never), (vec![1, 2], vec![]), "everything settled, in one answer");
        assert!(matches!(catalog.holding("a", "e1"), Holding::Held(Held { size: 3, .. })));
        assert_eq!(catalog.holding("a", "e2"), Holding::Never, "another version is never served");

        let nothing = catalog.wait_for_any(&[query("b", "e")], Duration::from_millis(10)).await;
        assert!(!nothing.settles_any(), "the long poll ends with nothing settled");
        let mixed = [query("b", "e"), query("a", "e2"), query("c", "e")];
        let answer = catalog.wait_for_any(&mixed, Duration::from_secs(10)).await;
        assert_eq!((answer.held, answer.never), (vec![2], vec![1]), "answered at once");

        catalog.finish(false);
        assert_eq!(catalog.holding("b", "e"), Holding::Never);
        let answer = catalog.wait_for_any(&[query("b", "e")], Duration::from_secs(10)).await;
        assert_eq!(answer.never, vec![0], "a finished run never will");
        assert_eq!(catalog.state(), PeerState { complete: false, finished: true, bytes_done: 4 });
    }

    fn entry(n: u64) -> (String, PathBuf, String) {
        let key = format!("imagenet/train/n{:08}/n{n:08}_{n}.JPEG", n / 1300);
        (key.clone(), PathBuf::from(format!("/data/{key}")), format!("\"{n:032x}\""))
    }

    #[test]
    fn past_its_memory_a_catalog_goes_to_disk_and_still_answers_for_every_object() {
        let dir = tempfile::tempdir().unwrap();
        let memory = 64 << 10;
        let catalog = Catalog::with_memory(memory);
        catalog.spill_into(dir.path().join("scratch"));
        // Commits in about key order: objects in flight finish out of
        // order within windows of 64, and a few stragglers (a large
        // object) commit long after the keys around them.
        let count = 20_000_u64;
        let mut order: Vec<u64> = (0..count).filter(|n| n % 997 != 5).collect();
        for window in order.chunks_mut(64) {
            window.reverse();
        }
        order.extend((0..count).filter(|n| n % 997 == 5));
        for &n in &order {
            let (key, path, etag) = entry(n);
            catalog.hold(&key, path, &etag, n);
            // The entries, the write buffer and the index.
            let resident = catalog.lock().resident_bytes();
            assert!(resident <= memory + 2 * (64 << 10) + (8 << 10), "{resident} bytes resident after {n}");
        }
        let entries = catalog.lock();
        assert!(entries.recent.len() < 1_000, "{} entries left in memory", entries.recent.len());
        assert!(entries.runs.len() <= 2, "{} runs: commits in about key order make one", entries.runs.len());
        drop(entries);
        for n in 0..count {
            let (key, path, etag) = entry(n);
            assert_eq!(catalog.holding(&key, &etag), Holding::Held(Held { path, etag, size: n }), "{key}");
            assert_eq!(catalog.holding(&key, "\"another\""), Holding::Never, "{key}");
        }
        assert_eq!(catalog.holding("imagenet/train/absent", "e"), Holding::NotYet);
        assert_eq!(catalog.holding("zzz", "e"), Holding::NotYet);
        catalog.finish(true);
        assert_eq!(catalog.holding("imagenet/train/absent", "e"), Holding::Never);
        assert_eq!(catalog.state().bytes_done, (0..count).sum::<u64>());
    }

    #[test]
    fn a_catalog_that_cannot_write_to_disk_keeps_every_entry_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let catalog = Catalog::with_memory(4 << 10);
        catalog.spill_into(not_a_dir.join("scratch"));
        for n in 0..500 {
            let (key, path, etag) = entry(n);
            catalog.hold(&key, path, &etag, n);
        }
        assert!(catalog.lock().runs.is_empty());
        for n in 0..500 {
            let (key, _, etag) = entry(n);
            assert!(matches!(catalog.holding(&key, &etag), Holding::Held(_)), "{key}");
        }
    }

    #[test]
    fn a_newer_version_held_in_memory_wins_over_an_older_one_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::with_memory(4 << 10);
        catalog.spill_into(dir.path().to_path_buf());
        for n in 0..200 {
            let (key, path, etag) = entry(n);
            catalog.hold(&key, path, &etag, n);
        }
        let (key, path, old) = entry(0);
        assert!(!catalog.lock().recent.contains_key(&key), "the first entry went to disk");
        catalog.hold(&key, path, "\"new\"", 7);
        assert!(matches!(catalog.holding(&key, "\"new\""), Holding::Held(Held { size: 7, .. })));
        assert_eq!(catalog.holding(&key, &old), Holding::Never);
    }
}
