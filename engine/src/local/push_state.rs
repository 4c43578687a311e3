//! The push state: what earlier pushes of one directory to one destination
//! started and finished, so that a re-run resumes the multipart uploads a
//! killed run left, aborts those it will not resume, and skips files the
//! store already holds.
//!
//! One JSON-lines file per destination, `.ferry/push/<FNV-1a of the
//! destination URI>.jsonl` in the source directory, so pushes of one
//! directory to two places never mix. Records are appended and flushed as
//! they happen; an upload's id right after the store returned it, before any
//! part is sent, so a kill at any later moment leaves the upload findable.
//! A torn line (a kill mid-write) is skipped. At the end of a run the file is
//! rewritten with only what is still true.
//!
//! Nothing here grows with the number of files. On opening, the records of
//! pushed files are sorted by path on disk (in `<file>.scratch/`), and the
//! push asks about files in the walk's order, which is path order, so a
//! cursor answers it. What this run pushes or keeps is sorted on disk too.
//! Only the uploads left open are held in memory: they are bounded by the
//! bytes in flight when a run was killed, not by the files.
//!
//! The file sits in a subdirectory so that a pull into the same directory,
//! whose manifest loader reads every `*.jsonl` directly in `.ferry/`, never
//! reads it. This module only remembers: every record is checked against the
//! store before it is acted on (see `transfer::push`).
//!
//! One push of a directory to a destination at a time: the state holds an
//! exclusive lock on `<hash>.lock` beside the file for as long as it lives.
//! Two pushes sharing one journal would claim each other's open uploads,
//! sweep them as an earlier run's, and remove each other's scratch files;
//! a second one is refused with [`PushStateError::Busy`] (the push waits and
//! tries again). The lock is a file of its own because the state file is
//! replaced at the end of a run, and the kernel drops it with a killed run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufRead as _, BufReader, BufWriter, Write as _};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::sorted::{Keyed, Merged, SORT_MEMORY, SortedRun, SortedWriter};
use ferry_contract::layout::{PUSH_STATE_DIR, STATE_DIR};

/// Why the push state cannot be kept.
#[derive(Debug, thiserror::Error)]
pub enum PushStateError {
    /// Another push of this directory to this destination holds the state.
    #[error("another push of this directory to this destination is running (it holds '{path}')")]
    Busy {
        /// The lock file.
        path: PathBuf,
    },
    /// The state file cannot be created or opened (e.g. a read-only source).
    #[error("cannot open the push state '{path}': {source}")]
    Open {
        /// The state file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The state file cannot be written.
    #[error("cannot write the push state '{path}': {source}")]
    Write {
        /// The state file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A multipart upload the store started for one version of a file, not
/// known to be completed or aborted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedUpload {
    /// The key it writes.
    pub key: String,
    /// The store's id for it.
    pub upload_id: String,
    /// The file's size when the upload started.
    pub size: u64,
    /// The file's mtime when the upload started, in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The size of every part but the last.
    pub part_size: u64,
}

impl StartedUpload {
    /// Whether this upload's parts are parts of this version of the file,
    /// cut the same way: only then can they be kept.
    pub fn fits(&self, size: u64, mtime_ns: i64, part_size: u64) -> bool {
        (self.size, self.mtime_ns, self.part_size) == (size, mtime_ns, part_size)
    }
}

/// A file the store was left holding, as the store described it then.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushedFile {
    /// Path relative to the source directory.
    pub path: String,
    /// The key it was written to.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The file's mtime when it was read, in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// The ETag (GCS: the generation) the store gave the new object.
    pub etag: String,
    /// CRC32C of the whole file.
    pub crc32c: u32,
}

impl Keyed for PushedFile {
    fn sort_key(&self) -> &str {
        &self.path
    }

    fn resident_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + 16 + 3 * 16 + self.path.len() + self.key.len() + self.etag.len()
    }
}

/// One line of the state file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
enum Record {
    UploadStarted(StartedUpload),
    UploadCompleted { key: String, upload_id: String },
    UploadAborted { key: String, upload_id: String },
    Pushed(PushedFile),
}

/// Removes a scratch directory when dropped.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The state of pushes of one directory to one destination: what earlier
/// runs left, and the journal of this run.
#[derive(Debug)]
pub struct PushState {
    path: PathBuf,
    /// What earlier runs recorded as pushed, sorted by path, on disk.
    earlier: Vec<SortedRun<PushedFile>>,
    /// How many files earlier runs recorded as pushed.
    earlier_count: u64,
    /// Keys of every upload the loaded state named, open or not.
    upload_keys: HashSet<String>,
    inner: Mutex<Inner>,
    /// Held for its `Drop`: the sorted records go when the state does.
    scratch: Scratch,
    /// Held for its lock: no other push opens this state while it lives.
    /// Declared last, so it is released after the scratch files are gone.
    _lock: File,
}

#[derive(Debug)]
struct Inner {
    /// `None` once a write failed: the run goes on without a journal.
    journal: Option<BufWriter<File>>,
    /// Earlier runs' records, read in path order as the walk asks.
    cursor: Option<Merged<PushedFile>>,
    /// The path last asked about, and the record found for it, if any.
    sought: Option<(String, Option<PushedFile>)>,
    /// Uploads earlier runs left open that no file of this run has claimed, by key.
    unclaimed: HashMap<String, Vec<StartedUpload>>,
    /// Every upload open as far as this state knows, by id.
    open: BTreeMap<String, StartedUpload>,
    /// Pushed records that are still true (kept or pushed by this run).
    current: SortedWriter<PushedFile>,
    /// Why `current` lost records, if it did: the state written at the end
    /// would forget them, so none is written.
    current_failed: Option<io::Error>,
}

impl PushState {
    /// The state file's name for `destination` (e.g. `s3://bucket/prefix/`).
    pub fn file_name(destination: &str) -> String {
        format!("{:016x}.jsonl", ferry_contract::hash::fnv1a(destination.as_bytes()))
    }

    /// Loads the state of pushes from `source` to `destination` and opens
    /// its journal for appending, creating the state directory if needed.
    ///
    /// # Errors
    /// [`PushStateError::Busy`] while another push of `source` to
    /// `destination` holds the state. [`PushStateError::Open`] when the
    /// state directory or file cannot be created or opened, e.g. because
    /// the source directory is read-only, or the earlier records cannot be
    /// sorted.
    pub fn open(source: &Path, destination: &str) -> Result<Self, PushStateError> {
        let dir = source.join(STATE_DIR).join(PUSH_STATE_DIR);
        let path = dir.join(Self::file_name(destination));
        let lock_path = path.with_extension("lock");
        let lock = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path))
            .map_err(|source| PushStateError::Open { path: lock_path.clone(), source })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Err(PushStateError::Busy { path: lock_path }),
            Err(std::fs::TryLockError::Error(source)) => return Err(PushStateError::Open { path: lock_path, source }),
        }
        let open_error = |source| PushStateError::Open { path: path.clone(), source };
        let mut file =
            std::fs::OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(open_error)?;
        // A killed run's scratch files are of no use to this one.
        let scratch = Scratch(path.with_extension("scratch"));
        let _ = std::fs::remove_dir_all(&scratch.0);
        std::fs::create_dir(&scratch.0).map_err(open_error)?;

        let (open, earlier, earlier_count, upload_keys) = Self::replay(&file, &scratch.0).map_err(open_error)?;
        let length = file.metadata().map_err(open_error)?.len();
        let mut last = [0u8];
        if length > 0 && file.read_at(&mut last, length - 1).map_err(open_error)? == 1 && last[0] != b'\n' {
            // A torn last line: what this run appends starts a line of its own.
            file.write_all(b"\n").map_err(open_error)?;
        }
        let mut unclaimed: HashMap<String, Vec<StartedUpload>> = HashMap::new();
        for upload in open.values() {
            unclaimed.entry(upload.key.clone()).or_default().push(upload.clone());
        }
        let cursor = Some(Merged::of_runs(&earlier).map_err(open_error)?);
        let inner = Inner {
            journal: Some(BufWriter::new(file)),
            cursor,
            sought: None,
            unclaimed,
            open,
            current: SortedWriter::new(&scratch.0, "current", SORT_MEMORY),
            current_failed: None,
        };
        Ok(Self { path, earlier, earlier_count, upload_keys, inner: Mutex::new(inner), scratch, _lock: lock })
    }

    /// Replays the records in order: what is open at the end (in memory),
    /// and what was pushed (sorted into `scratch`, the last record of a
    /// path winning). Lines that do not parse (a torn last line) are
    /// skipped: they cost at most a re-upload or an upload left to the
    /// final sweep.
    #[allow(clippy::type_complexity)]
    fn replay(
        file: &File,
        scratch: &Path,
    ) -> io::Result<(BTreeMap<String, StartedUpload>, Vec<SortedRun<PushedFile>>, u64, HashSet<String>)> {
        let (mut open, mut upload_keys) = (BTreeMap::new(), HashSet::new());
        let mut pushed = SortedWriter::new(scratch, "earlier", SORT_MEMORY);
        let mut count = 0;
        for line in BufReader::with_capacity(64 << 10, file).split(b'\n') {
            match serde_json::from_slice::<Record>(&line?) {
                Ok(Record::UploadStarted(upload)) => {
                    upload_keys.insert(upload.key.clone());
                    open.insert(upload.upload_id.clone(), upload);
                }
                Ok(Record::UploadCompleted { key, upload_id } | Record::UploadAborted { key, upload_id }) => {
                    upload_keys.insert(key);
                    open.remove(&upload_id);
                }
                Ok(Record::Pushed(file)) => {
                    count += 1;
                    pushed.push(file)?;
                }
                Err(_) => {}
            }
        }
        Ok((open, pushed.into_few_runs()?, count, upload_keys))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("push state lock poisoned")
    }

    /// A directory of this run's own for temporary files, removed when the
    /// state is dropped and, should the process be killed, when the next
    /// run opens the state.
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch.0
    }

    /// Whether an earlier run recorded any pushed file.
    pub fn has_pushed(&self) -> bool {
        self.earlier_count > 0
    }

    /// Moves the cursor to `path` and returns what an earlier run recorded
    /// for it, if this run has not kept it yet. Paths asked in increasing
    /// order cost one pass over the records in all; a path below the last
    /// one starts a new pass.
    fn seek<'i>(&self, inner: &'i mut Inner, path: &str) -> &'i mut Option<PushedFile> {
        let same = inner.sought.as_ref().is_some_and(|(last, _)| last == path);
        if !same {
            let behind = inner.sought.as_ref().is_some_and(|(last, _)| path < last.as_str());
            if behind {
                inner.cursor = Merged::of_runs(&self.earlier)
                    .inspect_err(|error| tracing::warn!(%error, "cannot read the push state again"))
                    .ok();
            }
            let found = inner.cursor.as_mut().and_then(|cursor| {
                let skip = |_| Ok::<_, std::convert::Infallible>(());
                cursor.seek(path, skip).unwrap_or_else(|never| match never {})
            });
            inner.sought = Some((path.to_owned(), found));
        }
        &mut inner.sought.as_mut().expect("just set").1
    }

    /// What an earlier run recorded for the file at `path`, if anything.
    pub fn pushed(&self, path: &str) -> Option<PushedFile> {
        let mut inner = self.lock();
        self.seek(&mut inner, path).clone()
    }

    /// Carries an earlier run's record for `path` into this run's state:
    /// the file was not selected, or is still in the store as pushed.
    pub fn keep(&self, path: &str) {
        let mut inner = self.lock();
        if let Some(file) = self.seek(&mut inner, path).take() {
            Self::record_current(&mut inner, file);
        }
    }

    fn record_current(inner: &mut Inner, file: PushedFile) {
        if let Err(error) = inner.current.push(file)
            && inner.current_failed.is_none()
        {
            tracing::warn!(%error, "cannot keep this push's state on disk; the next push sends what it would have skipped");
            inner.current_failed = Some(error);
        }
    }

    /// Takes the uploads earlier runs left open for `key`: the caller
    /// resumes one of them or aborts them.
    pub fn claim(&self, key: &str) -> Vec<StartedUpload> {
        self.lock().unclaimed.remove(key).unwrap_or_default()
    }

    /// Takes every upload earlier runs left that no file of this run
    /// claimed (their files are gone, or were not selected).
    pub fn unclaimed(&self) -> Vec<StartedUpload> {
        self.lock().unclaimed.drain().flat_map(|(_, uploads)| uploads).collect()
    }

    /// Whether `upload_id` is an upload this state knows to be open.
    pub fn is_open(&self, upload_id: &str) -> bool {
        self.lock().open.contains_key(upload_id)
    }

    /// Which of `keys` an earlier run started an upload for or pushed to:
    /// one pass over the earlier records, however many keys are asked.
    pub fn known_keys(&self, keys: HashSet<String>) -> HashSet<String> {
        let (mut known, mut unknown): (HashSet<String>, HashSet<String>) =
            keys.into_iter().partition(|key| self.upload_keys.contains(key));
        if unknown.is_empty() {
            return known;
        }
        match Merged::of_runs(&self.earlier) {
            Ok(records) => {
                for record in records.map_while(Result::ok) {
                    if let Some(key) = unknown.take(&record.key) {
                        known.insert(key);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot read the push state again"),
        }
        known
    }

    /// Whether an earlier run started an upload for `key` or pushed to it.
    pub fn knows_key(&self, key: &str) -> bool {
        !self.known_keys(HashSet::from([key.to_owned()])).is_empty()
    }

    /// Whether earlier runs left any record of an upload or a pushed file.
    pub fn knows_any_key(&self) -> bool {
        self.earlier_count > 0 || !self.upload_keys.is_empty()
    }

    /// Records an upload the store just started, before any part is sent.
    pub fn upload_started(&self, upload: StartedUpload) {
        let mut inner = self.lock();
        inner.open.insert(upload.upload_id.clone(), upload.clone());
        self.append(&mut inner, &Record::UploadStarted(upload));
    }

    /// Records an upload that was completed: nothing of it is left to abort.
    pub fn upload_completed(&self, key: &str, upload_id: &str) {
        let mut inner = self.lock();
        inner.open.remove(upload_id);
        self.append(&mut inner, &Record::UploadCompleted { key: key.to_owned(), upload_id: upload_id.to_owned() });
    }

    /// Records an upload that was aborted, or that the store no longer has.
    pub fn upload_aborted(&self, key: &str, upload_id: &str) {
        let mut inner = self.lock();
        inner.open.remove(upload_id);
        self.append(&mut inner, &Record::UploadAborted { key: key.to_owned(), upload_id: upload_id.to_owned() });
    }

    /// Records a file the store now holds.
    pub fn file_pushed(&self, file: PushedFile) {
        let mut inner = self.lock();
        self.append(&mut inner, &Record::Pushed(file.clone()));
        Self::record_current(&mut inner, file);
    }

    /// Appends one record and flushes it, so a kill right after keeps it.
    /// The first failure is reported once; the run goes on without a
    /// journal (what it does is still recorded for [`PushState::finish`]).
    fn append(&self, inner: &mut Inner, record: &Record) {
        let Some(journal) = inner.journal.as_mut() else { return };
        let mut line = serde_json::to_vec(record).expect("records serialize");
        line.push(b'\n');
        if let Err(source) = journal.write_all(&line).and_then(|()| journal.flush()) {
            let error = PushStateError::Write { path: self.path.clone(), source };
            tracing::warn!(%error, "the push goes on, but a killed run may not resume what follows");
            inner.journal = None;
        }
    }

    /// Rewrites the state with only what is still true: the files pushed or
    /// kept by this run, and the uploads still open (an abort that failed is
    /// tried again by the next run). Call it only after a run whose walk
    /// finished, since files the run never looked at lose their records.
    ///
    /// # Errors
    /// [`PushStateError::Write`] when the new state cannot be written or
    /// renamed, or this run's records could not all be kept: then the
    /// journal stays as it is, which loses nothing.
    pub fn finish(self) -> Result<(), PushStateError> {
        let inner = self.inner.into_inner().expect("push state lock poisoned");
        drop(inner.journal);
        let write_error = |source| PushStateError::Write { path: self.path.clone(), source };
        if let Some(error) = inner.current_failed {
            return Err(write_error(error));
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut out = BufWriter::new(File::create(&tmp).map_err(write_error)?);
        let pushed = inner.current.into_sorted().map_err(write_error)?;
        let mut write = |record: &Record| {
            serde_json::to_writer(&mut out, record).map_err(io::Error::from)?;
            out.write_all(b"\n")
        };
        for file in pushed {
            write(&Record::Pushed(file.map_err(write_error)?)).map_err(write_error)?;
        }
        for upload in inner.open.into_values() {
            write(&Record::UploadStarted(upload)).map_err(write_error)?;
        }
        out.into_inner().map_err(|e| write_error(e.into_error()))?;
        std::fs::rename(&tmp, &self.path).map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upload(key: &str, id: &str) -> StartedUpload {
        StartedUpload { key: key.into(), upload_id: id.into(), size: 12, mtime_ns: 7, part_size: 5 }
    }

    fn pushed(path: &str) -> PushedFile {
        PushedFile {
            path: path.into(),
            key: format!("p/{path}"),
            size: 3,
            mtime_ns: 9,
            etag: "e".into(),
            crc32c: 0xdead_beef,
        }
    }

    #[test]
    fn one_push_at_a_time_holds_a_state() {
        let dir = tempfile::tempdir().unwrap();
        let first = PushState::open(dir.path(), "s3://b/p/").unwrap();
        first.file_pushed(pushed("a"));
        let sorting = first.scratch_dir().join("sorting");
        std::fs::write(&sorting, b"runs").unwrap();

        let second = PushState::open(dir.path(), "s3://b/p/").unwrap_err();
        assert!(
            matches!(&second, PushStateError::Busy { path } if path.extension() == Some("lock".as_ref())),
            "{second:?}"
        );
        assert!(second.to_string().contains("another push of this directory to this destination"), "{second}");
        assert!(sorting.exists(), "the refused open leaves the first push's scratch files alone");
        // Another destination is another state.
        drop(PushState::open(dir.path(), "s3://b/q/").unwrap());

        first.finish().unwrap();
        let after = PushState::open(dir.path(), "s3://b/p/").unwrap();
        assert_eq!(after.pushed("a"), Some(pushed("a")));
    }

    #[test]
    fn a_torn_last_line_costs_only_itself() {
        let dir = tempfile::tempdir().unwrap();
        let state = PushState::open(dir.path(), "s3://b/p/").unwrap();
        state.upload_started(upload("p/a", "u1"));
        state.upload_started(upload("p/b", "u2"));
        state.upload_completed("p/b", "u2");
        state.file_pushed(pushed("b"));
        drop(state);
        let file = dir.path().join(STATE_DIR).join(PUSH_STATE_DIR).join(PushState::file_name("s3://b/p/"));
        std::fs::OpenOptions::new().append(true).open(&file).unwrap().write_all(b"{\"record\":\"upload_sta").unwrap();

        let again = PushState::open(dir.path(), "s3://b/p/").unwrap();
        assert_eq!(again.claim("p/a"), vec![upload("p/a", "u1")]);
        assert!(again.claim("p/b").is_empty(), "completed uploads are not open");
        assert_eq!(again.pushed("b"), Some(pushed("b")));
        assert!(again.knows_key("p/a") && again.knows_key("p/b") && !again.knows_key("p/c"));
        // Appending after the torn line starts a line of its own.
        again.upload_aborted("p/a", "u1");
        drop(again);
        let third = PushState::open(dir.path(), "s3://b/p/").unwrap();
        assert!(third.claim("p/a").is_empty(), "{:?}", std::fs::read_to_string(&file));
    }

    #[test]
    fn finishing_keeps_only_what_is_still_true() {
        let dir = tempfile::tempdir().unwrap();
        let state = PushState::open(dir.path(), "gs://b/p/").unwrap();
        for path in ["kept", "gone", "again"] {
            state.file_pushed(pushed(path));
        }
        state.upload_started(upload("p/x", "open"));
        state.upload_started(upload("p/y", "done"));
        state.upload_completed("p/y", "done");
        state.finish().unwrap();

        let state = PushState::open(dir.path(), "gs://b/p/").unwrap();
        state.keep("kept");
        state.file_pushed(PushedFile { etag: "e2".into(), ..pushed("again") });
        assert_eq!(state.unclaimed(), vec![upload("p/x", "open")]);
        state.finish().unwrap();

        let file = dir.path().join(STATE_DIR).join(PUSH_STATE_DIR).join(PushState::file_name("gs://b/p/"));
        let lines = std::fs::read_to_string(file).unwrap();
        assert_eq!(lines.lines().count(), 3, "{lines}");
        let state = PushState::open(dir.path(), "gs://b/p/").unwrap();
        assert_eq!(state.pushed("kept"), Some(pushed("kept")));
        assert_eq!(state.pushed("again").map(|f| f.etag), Some("e2".into()));
        assert_eq!(state.pushed("gone"), None, "a file the run never saw is gone");
        assert!(state.is_open("open"), "an upload not yet aborted stays recorded");
        assert!(!state.is_open("done"));
    }

    #[test]
    fn many_records_are_found_in_walk_order_and_out_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let state = PushState::open(dir.path(), "s3://b/p/").unwrap();
        // More than the sort holds in memory, in the order uploads finish.
        let paths: Vec<String> = (0..40_000u32).map(|i| format!("d{:02}/f{:05}", i % 89, i)).collect();
        for path in &paths {
            state.file_pushed(pushed(path));
        }
        drop(state); // killed: only the journal has them
        let state = PushState::open(dir.path(), "s3://b/p/").unwrap();
        let mut sorted = paths.clone();
        sorted.sort();
        for path in sorted.iter().step_by(7) {
            assert_eq!(state.pushed(path).map(|f| f.path), Some(path.clone()));
            state.keep(path);
            assert_eq!(state.pushed(path), None, "kept: this run holds it now");
        }
        // Behind the cursor: a new pass over the records finds it all the same.
        assert_eq!(state.pushed(&sorted[1]).map(|f| f.path), Some(sorted[1].clone()));
        assert!(state.knows_key("p/d88/f00088") && !state.knows_key("p/d88"));
        state.finish().unwrap();
        let state = PushState::open(dir.path(), "s3://b/p/").unwrap();
        assert_eq!(state.earlier_count, sorted.len().div_ceil(7) as u64, "what was kept, once each");
        assert!(sorted.iter().step_by(7).all(|path| state.pushed(path).is_some()));
        let scratch = state.scratch.0.clone();
        assert!(scratch.is_dir());
        drop(state);
        assert!(!scratch.exists(), "scratch files go with the run");
    }

    #[test]
    fn two_destinations_keep_two_states() {
        let dir = tempfile::tempdir().unwrap();
        PushState::open(dir.path(), "s3://b/one/").unwrap().file_pushed(pushed("f"));
        let other = PushState::open(dir.path(), "s3://b/two/").unwrap();
        assert!(!other.has_pushed());
        assert!(PushState::open(dir.path(), "s3://b/one/").unwrap().has_pushed());
    }

    #[test]
    fn a_state_directory_that_cannot_be_created_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        // A file where the state directory should be: fails even for root,
        // which a read-only permission would not stop.
        std::fs::write(dir.path().join(STATE_DIR), b"").unwrap();
        assert!(matches!(PushState::open(dir.path(), "s3://b/p/"), Err(PushStateError::Open { .. })));
    }
}
