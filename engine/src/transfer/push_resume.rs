//! What a push keeps of earlier, interrupted pushes, and what it cleans up
//! after them, on top of the push state ([`crate::local::push_state`]).
//!
//! * **Skip**: a file recorded as pushed whose size and mtime still match,
//!   and whose object the store still lists with the recorded size and
//!   ETag, is not uploaded again. The destination is listed page by page
//!   in step with the walk (both come in key order), not whole before the
//!   first upload, so a re-run holds a page or three of it, however many
//!   objects the prefix has.
//! * **Resume**: a file whose recorded unfinished upload was started for
//!   this very version of it (size, mtime) with the same part size keeps
//!   the parts the store lists with the size and CRC32C of the local part
//!   (re-read and checksummed: the record is never trusted alone); the
//!   others are sent.
//! * **Clean up**: recorded uploads no file resumes (changed, removed, not
//!   selected, other part size) are aborted; after a push with no failure,
//!   the uploads still pending under the destination are listed and those
//!   that are Ferry's are aborted (see [`Resume::finish`]).
//!
//! One push of a directory to a destination at a time: a second one waits
//! for the first to end (see [`PushState`]'s lock), then skips what it sent.
//!
//! Aborts that fail are warnings: a push never fails for its clean-up.
//! Without a state (a read-only source) nothing is skipped or resumed, and
//! the clean-up after a successful push still runs for the keys it wrote.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::mpsc;

use super::receive::ObjectError;
use super::{Engine, dooms_the_run};
use crate::local::push_state::{PushState, PushStateError, PushedFile, StartedUpload};
use crate::local::sorted::Ascending;
use crate::local::staging::FileStamp;
use crate::local::walk::LocalFile;
use crate::metrics::Operation;
use crate::store::{ListPage, ListedPart, ObjectMeta, StoreError};

/// How often a push waiting for another push of its directory to the same
/// destination tries the state's lock again.
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// The multipart upload a file's parts go to.
#[derive(Debug)]
pub struct MultipartStart {
    /// The upload's id.
    pub upload_id: Arc<str>,
    /// Parts the store already holds (a resumed upload), by number.
    pub held: HashMap<u32, ListedPart>,
}

/// The resume side of one push.
#[derive(Debug)]
pub struct Resume {
    /// `None` when the source directory cannot hold a state.
    state: Option<PushState>,
    /// The objects under the prefix, read in step with the walk; listed
    /// only when an earlier run recorded pushed files.
    in_store: tokio::sync::Mutex<Option<Destination>>,
    /// Keys this run uploaded in parts: an upload for one of them that
    /// started before this run is one a killed run could not record.
    multipart_keys: Mutex<HashSet<String>>,
    /// When this run started.
    started: SystemTime,
}

impl Resume {
    /// Loads the state of earlier pushes from `source` to `destination` and,
    /// when it records pushed files, starts listing what the store holds
    /// under `prefix`. A source that cannot hold a state is warned about
    /// once and pushed without resume.
    pub async fn prepare(engine: &Arc<Engine>, source: &Path, destination: &str, prefix: &str) -> Self {
        let started = SystemTime::now();
        let state = match Self::open_state(source, destination).await {
            Ok(state) => Some(state),
            Err(error) => {
                tracing::warn!(%error, "pushing without resume: a killed push will send its files again");
                None
            }
        };
        let in_store = match &state {
            Some(state) if state.has_pushed() => Some(Destination::list(engine, prefix)),
            _ => None,
        };
        Self { state, in_store: tokio::sync::Mutex::new(in_store), multipart_keys: Mutex::default(), started }
    }

    /// Opens the push state, waiting while another push of `source` to
    /// `destination` holds it: that one's end is this one's start, and
    /// what it pushed this one then skips. Waiting is polling, so a push
    /// cancelled while it waits leaves nothing behind.
    async fn open_state(source: &Path, destination: &str) -> Result<PushState, PushStateError> {
        let mut told = false;
        loop {
            let (source, destination) = (source.to_path_buf(), destination.to_owned());
            let opened = tokio::task::spawn_blocking(move || PushState::open(&source, &destination))
                .await
                .expect("opening the push state panicked");
            match opened {
                Err(PushStateError::Busy { path }) => {
                    if !told {
                        tracing::warn!(lock = %path.display(), "another push of this directory to this destination is running: waiting for it to end");
                        told = true;
                    }
                    tokio::time::sleep(BUSY_POLL).await;
                }
                opened => return opened,
            }
        }
    }

    /// Where the walk may sort directories too large for memory: in the
    /// push state's scratch directory, so that a killed run's files go when
    /// the next run starts. `None` for a source that cannot hold a state.
    pub fn walk_scratch(&self) -> Option<PathBuf> {
        self.state.as_ref().map(|state| state.scratch_dir().join("walk"))
    }

    /// A file this run does not select keeps what earlier runs recorded of it.
    pub fn not_selected(&self, file: &LocalFile) {
        if let Some(state) = &self.state {
            state.keep(file.rel.as_str());
        }
    }

    /// Whether `file` is, unchanged, the object the store holds at `key`,
    /// as an earlier run pushed it: then it need not be sent again. Files
    /// are to be asked about in key order (the walk's).
    pub async fn still_in_store(&self, file: &LocalFile, key: &str) -> bool {
        let Some(state) = &self.state else { return false };
        let listed = match self.in_store.lock().await.as_mut() {
            Some(destination) => destination.seek(key).await,
            None => None,
        };
        let Some(record) = state.pushed(file.rel.as_str()) else { return false };
        let unchanged = record.key == key && record.size == file.size && record.mtime_ns == file.mtime_ns;
        let listed = listed.is_some_and(|object| object.size == record.size && object.etag == Some(record.etag));
        if unchanged && listed {
            state.keep(file.rel.as_str());
        }
        unchanged && listed
    }

    /// Takes the uploads earlier runs left open for `key`.
    pub fn claim(&self, key: &str) -> Vec<StartedUpload> {
        self.state.as_ref().map(|state| state.claim(key)).unwrap_or_default()
    }

    /// Resumes the claimed upload started for this version of the file with
    /// this part size, if the store still has it, and aborts the other
    /// claimed ones; otherwise starts a new upload and records it before
    /// any part is sent.
    ///
    /// # Errors
    /// Creating the upload failed, or listing parts failed with an error
    /// that dooms the run.
    pub async fn start_or_resume(
        &self,
        engine: &Engine,
        key: &str,
        stamp: FileStamp,
        part_size: u64,
        claimed: Vec<StartedUpload>,
    ) -> Result<MultipartStart, ObjectError> {
        self.multipart_keys.lock().expect("keys lock poisoned").insert(key.to_owned());
        let (mut fitting, mut stale): (Vec<_>, Vec<_>) =
            claimed.into_iter().partition(|upload| upload.fits(stamp.size, stamp.mtime_ns, part_size));
        let candidate = fitting.pop();
        stale.append(&mut fitting);
        self.abort_recorded(engine, stale).await;
        if let Some(upload) = candidate {
            match engine.retrying(Operation::ListParts, || engine.store.list_parts(key, &upload.upload_id)).await {
                Ok(parts) => {
                    tracing::debug!(%key, upload_id = %upload.upload_id, parts = parts.len(), "resuming an earlier run's upload");
                    let held = parts.into_iter().map(|part| (part.number, part)).collect();
                    return Ok(MultipartStart { upload_id: Arc::from(upload.upload_id), held });
                }
                // Completed, aborted or expired meanwhile: nothing to keep, nothing to abort.
                Err(StoreError::NotFound) => self.aborted(key, &upload.upload_id),
                Err(error) if dooms_the_run(&error) => return Err(error.into()),
                Err(error) => {
                    tracing::warn!(%key, %error, "cannot list the parts of an earlier upload; sending the file again");
                    self.abort_recorded(engine, vec![upload]).await;
                }
            }
        }
        let upload_id = engine.retrying(Operation::CreateMultipart, || engine.store.create_multipart(key)).await?;
        if let Some(state) = &self.state {
            let (size, mtime_ns) = (stamp.size, stamp.mtime_ns);
            state.upload_started(StartedUpload {
                key: key.to_owned(),
                upload_id: upload_id.clone(),
                size,
                mtime_ns,
                part_size,
            });
        }
        Ok(MultipartStart { upload_id: Arc::from(upload_id), held: HashMap::new() })
    }

    /// Aborts uploads earlier runs recorded; one that cannot be aborted
    /// stays recorded for the next run.
    pub async fn abort_recorded(&self, engine: &Engine, uploads: Vec<StartedUpload>) {
        for upload in uploads {
            self.abort(engine, &upload.key, &upload.upload_id, "an earlier run's upload").await;
        }
    }

    async fn abort(&self, engine: &Engine, key: &str, upload_id: &str, whose: &'static str) {
        match engine.retrying(Operation::AbortMultipart, || engine.store.abort_multipart(key, upload_id)).await {
            Ok(()) | Err(StoreError::NotFound) => {
                tracing::debug!(%key, %upload_id, whose, "aborted");
                self.aborted(key, upload_id);
            }
            Err(error) => {
                tracing::warn!(%key, %upload_id, %error, whose, "cannot abort an unfinished upload; the next push tries again");
            }
        }
    }

    /// The upload was completed.
    pub fn completed(&self, key: &str, upload_id: &str) {
        if let Some(state) = &self.state {
            state.upload_completed(key, upload_id);
        }
    }

    /// The upload was aborted, or the store no longer has it.
    pub fn aborted(&self, key: &str, upload_id: &str) {
        if let Some(state) = &self.state {
            state.upload_aborted(key, upload_id);
        }
    }

    /// `file` is now the object at `key`, which the store gave `etag`.
    pub fn pushed(&self, file: &LocalFile, key: &str, stamp: FileStamp, etag: Option<String>, crc32c: u32) {
        let (Some(state), Some(etag)) = (&self.state, etag) else { return };
        let (size, mtime_ns) = (stamp.size, stamp.mtime_ns);
        state.file_pushed(PushedFile { path: file.rel.to_string(), key: key.to_owned(), size, mtime_ns, etag, crc32c });
    }

    /// Ends a run whose walk finished: aborts the recorded uploads no file
    /// claimed; after a run with no failure, aborts every upload still
    /// pending under `prefix` that is Ferry's (recorded, or for a key this
    /// or an earlier run wrote and started before this run); then rewrites
    /// the state compactly.
    pub async fn finish(self, engine: &Engine, prefix: &str) {
        if let Some(state) = &self.state {
            self.abort_recorded(engine, state.unclaimed()).await;
        }
        if engine.tally.complete() {
            self.sweep(engine, prefix).await;
        }
        if let Some(state) = self.state {
            let finished = tokio::task::spawn_blocking(move || state.finish()).await.expect("push state panicked");
            if let Err(error) = finished {
                tracing::warn!(%error, "the next push may send again what this one skipped or kept");
            }
        }
    }

    async fn sweep(&self, engine: &Engine, prefix: &str) {
        let ours = std::mem::take(&mut *self.multipart_keys.lock().expect("keys lock poisoned"));
        if ours.is_empty() && self.state.as_ref().is_none_or(|state| !state.knows_any_key()) {
            return;
        }
        let pending = match engine.retrying(Operation::ListUploads, || engine.store.list_uploads(prefix)).await {
            Ok(pending) => pending,
            Err(error) => {
                tracing::warn!(%error, "cannot list unfinished uploads; a bucket lifecycle rule will reclaim any left");
                return;
            }
        };
        // Keys earlier runs wrote, asked for all pending uploads at once:
        // the state is read from disk, once.
        let asked: HashSet<String> = pending.iter().map(|upload| upload.key.clone()).collect();
        let known = self.state.as_ref().map(|state| state.known_keys(asked)).unwrap_or_default();
        for upload in pending {
            let recorded = self.state.as_ref().is_some_and(|state| state.is_open(&upload.upload_id));
            let before_this_run = upload.initiated.is_some_and(|initiated| initiated < self.started);
            let our_key = ours.contains(&upload.key) || known.contains(&upload.key);
            if recorded || (before_this_run && our_key) {
                self.abort(engine, &upload.key, &upload.upload_id, "a pending upload of an earlier run").await;
            }
        }
    }
}

/// The destination's listing, read as a cursor: pages come from a lister
/// task through a channel of two, so the listing runs a little ahead of the
/// walk and no further.
#[derive(Debug)]
struct Destination {
    pages: mpsc::Receiver<Result<ListPage, StoreError>>,
    page: std::vec::IntoIter<ObjectMeta>,
    /// The next object not yet passed.
    head: Option<ObjectMeta>,
    sought: Ascending,
    /// The listing ended (finished or failed).
    ended: bool,
}

impl Destination {
    /// Starts listing `prefix`.
    fn list(engine: &Arc<Engine>, prefix: &str) -> Self {
        let (pages_tx, pages) = mpsc::channel(2);
        tokio::spawn(super::listing::list_all(Arc::clone(engine), prefix.to_owned(), pages_tx));
        Self { pages, page: Vec::new().into_iter(), head: None, sought: Ascending::default(), ended: false }
    }

    /// The object at `key`, if the store lists one. Keys must be asked in
    /// increasing order: one below the last is answered `None` (a walk out
    /// of key order costs re-uploads, never a wrong skip). A listing that
    /// fails costs the same for every file after it: it is sent again.
    async fn seek(&mut self, key: &str) -> Option<ObjectMeta> {
        if !self.sought.advance(key) {
            return None;
        }
        loop {
            if self.head.is_none() {
                self.head = self.page.next();
            }
            match &self.head {
                Some(object) if object.key.as_str() < key => self.head = None,
                Some(object) if object.key == key => return self.head.take(),
                Some(_) => return None,
                None if self.ended => return None,
                None => match self.pages.recv().await {
                    Some(Ok(page)) => self.page = page.objects.into_iter(),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "cannot list the destination; the files not compared yet are sent again");
                        self.ended = true;
                    }
                    None => self.ended = true,
                },
            }
        }
    }
}
