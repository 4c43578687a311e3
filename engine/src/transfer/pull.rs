//! Pull: every object under a prefix, into a local directory.
//!
//! The listing runs in its own task and feeds pages through a small bounded
//! channel, so the first GETs start after the first page and a slow consumer
//! holds the lister back instead of buffering the whole listing. Each
//! selected object becomes a task (bounded by [`Engine::objects_in_flight`]);
//! an object up to one part is one GET, a larger one is a sliding window of
//! ranged GETs. Every byte is written once, at its offset, into a
//! preallocated temporary file; the file is verified and then renamed to its
//! final name, and recorded in the manifest.
//!
//! An object no larger than one write buffer is received into memory,
//! verified there and then created, written and renamed in one call on a
//! blocking thread. With 10,000 × 64 KiB objects, the three hops to other
//! threads that the general path makes per object (create the file, hash it,
//! rename it) were a sixth of the pull's CPU in context switches and
//! wake-ups; a file that fails verification is then never created either.
//!
//! A pull also accounts for what it changed: each object it copies is
//! *added* (no earlier run had staged its path) or *updated*, and every
//! object in place, copied or reused, goes into the snapshot of the dataset
//! version it staged. With `--delete-removed`, files earlier runs staged
//! from objects that have since left the store are removed at the end (see
//! [`crate::local::prune`]).

use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;

use super::behind::HashBehind;
use super::capacity::{CapacityError, SpaceLedger, is_disk_full};
use super::listing::list_all;
use super::ranges::{download_range_size, plan_ranges};
use super::readback::Received;
use super::receive::{
    ObjectError, again_on_mismatch, check_received, ended_early, expect_announced, more_than_announced, next_chunk,
    part_layout,
};
use super::tally::{Summary, Verified};
use super::verify::{Digester, RangeDigest, Wanted};
use super::{
    Engine, ObjectTasks, REQUEST_OVERHEAD, RequestSlot, TransferError, VerifyMode, dooms_the_run, join_objects,
    object_slot,
};
use crate::fleet::LandingGuard;
use crate::local::manifest::{ManifestCursor, ManifestEntry, ManifestWriter, Sought};
use crate::local::partial::{self, PartialHeader, PartialObject, RangeRecord};
use crate::local::paths::{KeyPath, RelPath, key_to_path, relative_key};
use crate::local::prune::{Departed, prune};
use crate::local::shared_objects::{ObjectIdentity, SharedObjects};
use crate::local::sorted::{RunWriter, SortedRun};
use crate::local::staging::{FileStamp, StagingArea, TempFile, write_chunks_at};
use crate::metrics::{Direction, ObjectResult, Operation};
use crate::store::md5_from_etag;
use crate::store::{Integrity, ObjectMeta, StoreError, StoredChecksum};

/// An object selected for this run, with its destination path.
#[derive(Debug, Clone)]
struct Planned {
    object: ObjectMeta,
    /// The path below the destination, which is also the key relative to
    /// the prefix (the one selection and the snapshot use).
    rel: RelPath,
    /// Whether an earlier run had staged something at `rel`: copying it
    /// now is an update, not an addition.
    known: bool,
}

impl Planned {
    /// The store's version of the object, as the snapshot records it.
    fn version(&self) -> &str {
        self.object.etag.as_deref().unwrap_or_default()
    }
}

/// Name of this run's manifest file: one per shard, so sharded workers that
/// share a directory never write the same file.
pub fn manifest_name(engine: &Engine) -> String {
    match engine.config.selection.shard() {
        Some(shard) => format!("manifest-shard-{}-of-{}.jsonl", shard.index, shard.count),
        None => "manifest.jsonl".to_owned(),
    }
}

/// Copies every selected object under `prefix` into `destination`; with
/// `delete_removed`, then removes what earlier runs staged from objects in
/// this run's selection that are no longer in the store.
///
/// Per-object failures are counted in the summary; the run continues.
///
/// # Errors
/// Run-level failures: the listing fails, the bucket is missing, the
/// credentials are refused, the destination cannot be prepared.
pub async fn pull(
    engine: Arc<Engine>,
    prefix: &str,
    destination: &Path,
    delete_removed: bool,
) -> Result<Summary, TransferError> {
    let started = Instant::now();
    let source_uri = format!("{}/{prefix}", engine.store.describe());
    let Opened { staging, scratch, mut manifest, writer, mut ledger } =
        open_destination(&engine, prefix, destination).await?;
    tracing::info!(source = %source_uri, destination = %destination.display(), "pull started");

    let (pages_tx, mut pages) = mpsc::channel(2);
    let lister = tokio::spawn(list_all(Arc::clone(&engine), prefix.to_owned(), pages_tx));
    let copies = Copies {
        objects_in_flight: Arc::new(Semaphore::new(engine.objects_in_flight())),
        peer_waiters: Arc::new(Semaphore::new(PEER_WAITERS)),
        staging: Arc::clone(&staging),
        writer: Arc::clone(&writer),
    };
    let mut tasks = ObjectTasks::new();
    let mut turns = Turns::default();
    let mut listed = Listed {
        departed: Departed::new(&scratch.join("departed.jsonl"), prefix, &engine.config.selection)
            .map_err(TransferError::Manifest)?,
        out_of_order: false,
        dataset_bytes: 0,
    };

    let outcome: Result<(), TransferError> = async {
        while let Some(page) = pages.recv().await {
            let page = page.map_err(|source| TransferError::List { uri: source_uri.clone(), source })?;
            let last_page = page.next.is_none();
            let mut to_copy = select(&engine, prefix, destination, page.objects, &mut manifest, &mut listed, &writer)?;
            // Like free space, the quota is checked before any of the page
            // starts: a dataset of one page is refused before any write.
            if let Some(quota) = engine.config.dataset_quota.filter(|quota| listed.dataset_bytes > *quota) {
                return Err(TransferError::Quota {
                    dataset_bytes: listed.dataset_bytes,
                    quota,
                    listing_finished: last_page,
                });
            }
            if let Some(ledger) = &mut ledger {
                charge(&engine, ledger, &to_copy, last_page)?;
            }
            // In a fleet, this worker's own share goes first: its peers are
            // waiting for it, and what it waits for is theirs.
            if let Some(fleet) = &engine.fleet {
                to_copy.sort_by_key(|planned| from_a_peer(&engine, fleet, planned));
            }
            for planned in to_copy {
                copies.start(&engine, planned, &mut tasks, &mut turns).await?;
            }
        }
        engine.tally.listing_finished();
        join_objects(&mut tasks).await
    }
    .await;
    lister.abort();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(copies);
    let writer = sole_owner(writer).await;
    let staging = sole_owner(staging).await;
    // Only a finished listing tells what left the store: after a failed
    // listing every object not listed yet would look removed, and after a
    // run with failures the data in place is not a complete version to
    // reconcile against. Such runs remove nothing.
    let complete = outcome.is_ok() && engine.tally.complete();
    let reconcile = delete_removed && complete && !listed.out_of_order;
    let finished =
        settle(&engine, prefix, destination, complete, reconcile, manifest, listed.departed, writer, &scratch).await;
    staging.close();
    outcome?;
    finished?;
    let mut summary = engine.tally.summary(
        super::tally::Operation::Pull,
        source_uri,
        destination.display().to_string(),
        started.elapsed(),
    );
    if let Some(fleet) = &engine.fleet {
        summary.peers = fleet.counts();
    }
    summary.concurrency = Some(engine.concurrency_used());
    summary.throttled = engine.metrics.throttles();
    summary.disk = ledger.as_ref().and_then(SpaceLedger::measure_now);
    if let Some(snapshot) = summary.snapshot.as_mut() {
        snapshot.revision = engine.store.revision();
    }
    Ok(summary)
}

/// What a pull holds of its destination while it runs.
struct Opened {
    staging: Arc<StagingArea>,
    /// This run's scratch directory.
    scratch: std::path::PathBuf,
    /// Earlier runs' manifests, read in step with the listing.
    manifest: ManifestCursor,
    writer: Arc<ManifestWriter>,
    /// The free-space account, when the run checks capacity.
    ledger: Option<SpaceLedger>,
}

/// Prepares `destination` for a pull: its staging area (which sweeps dead
/// runs' temporary files), the fleet's catalog and the shared objects,
/// earlier runs' manifests and this run's, and the free-space account.
async fn open_destination(engine: &Engine, prefix: &str, destination: &Path) -> Result<Opened, TransferError> {
    let staging = {
        let destination = destination.to_path_buf();
        Arc::new(
            tokio::task::spawn_blocking(move || StagingArea::open(&destination))
                .await
                .expect("staging setup panicked")?,
        )
    };
    let scratch = staging.scratch_dir();
    if let Some(fleet) = &engine.fleet {
        fleet.catalog.spill_into(scratch.join("catalog"));
        fleet.listing(prefix);
    }
    if let Some(wanted) = &engine.config.shared_objects {
        let scope = format!("{}|{}", engine.store.identity(), wanted.endpoint.as_deref().unwrap_or("default"));
        let (dir, root) = (wanted.dir.clone(), destination.to_path_buf());
        let opened = tokio::task::spawn_blocking(move || SharedObjects::open(&dir, scope, &root))
            .await
            .expect("opening the shared objects panicked");
        if let Some(shared) = opened {
            let _ = engine.shared_objects.set(Arc::new(shared));
        }
    }
    // Earlier runs' manifests, read in step with the listing: both come in
    // key order, so nothing of them is held in memory. Opening may sort a
    // manifest written before manifests were sorted, once.
    let manifest = {
        let (root, scratch) = (destination.to_path_buf(), scratch.clone());
        tokio::task::spawn_blocking(move || ManifestCursor::open(&root, &scratch))
            .await
            .expect("opening the manifest panicked")
            .map_err(TransferError::Manifest)?
    };
    let writer =
        Arc::new(ManifestWriter::open(destination, &manifest_name(engine), &scratch).map_err(TransferError::Manifest)?);
    // Measured after the staging area swept dead runs' temporary files, and
    // before this run writes anything.
    let ledger = engine.config.capacity.clone().and_then(|check| SpaceLedger::open(check, destination));
    if let Some(ledger) = &ledger {
        engine.tally.measured(ledger.found());
    }
    Ok(Opened { staging, scratch, manifest, writer, ledger })
}

/// What the listing has told so far, beyond the objects to copy.
struct Listed<'a> {
    /// Entries of earlier runs the listing went past: candidates for removal.
    departed: Departed<'a>,
    /// Whether the store listed a key out of order (then nothing is removed).
    out_of_order: bool,
    /// The whole dataset's bytes, every shard's objects included, so that
    /// the shards of one dataset all count the same total against its quota.
    dataset_bytes: u64,
}

/// The objects of one listed page this run copies; those already in place
/// are recorded, counted and held for peers as they are.
fn select(
    engine: &Engine,
    prefix: &str,
    destination: &Path,
    objects: Vec<ObjectMeta>,
    manifest: &mut ManifestCursor,
    listed: &mut Listed<'_>,
    writer: &ManifestWriter,
) -> Result<Vec<Planned>, TransferError> {
    let mut to_copy = Vec::new();
    for object in objects {
        if engine.config.dataset_quota.is_some()
            && engine.config.selection.in_dataset(relative_key(&object.key, prefix))
        {
            listed.dataset_bytes = listed.dataset_bytes.saturating_add(object.size);
        }
        // Every listed key moves the manifest on, refused and unselected
        // ones too: an object still in the store has not left it. Entries
        // gone past are departure candidates.
        let relative = relative_key(&object.key, prefix);
        let earlier = match manifest.seek(relative, |entry| listed.departed.passed(entry)) {
            Ok(Sought::Found(entry)) => Some(entry),
            Ok(Sought::Absent) => None,
            Ok(Sought::OutOfOrder) => {
                if !listed.out_of_order {
                    tracing::warn!(key = %object.key.escape_debug(), "the store lists keys out of order: objects listed out of order are copied again, and nothing is removed this run");
                }
                listed.out_of_order = true;
                None
            }
            Err(error) => return Err(TransferError::Manifest(error)),
        };
        // A file an earlier run staged from an object this run's include or
        // exclude leaves out stays where it is, and in the manifest: a
        // clean-up (a DataStage deleted with reclaimPolicy Delete) removes
        // it, and the shared objects it links are not kept alive by a file
        // nothing knows.
        if let Some(entry) = earlier.as_ref().filter(|_| engine.config.selection.deselects(relative)) {
            writer.record(entry.clone(), false).map_err(TransferError::Manifest)?;
        }
        let Some(planned) = plan_object(engine, earlier.is_some(), prefix, object) else { continue };
        if let Some(entry) = earlier.filter(|entry| entry.reusable(destination, &planned.rel, &planned.object)) {
            writer.record(entry, false).map_err(TransferError::Manifest)?;
            if let (Some(fleet), Some(etag)) = (&engine.fleet, &planned.object.etag) {
                let path = destination.join(planned.rel.as_str());
                fleet.catalog.hold(&planned.object.key, path, etag, planned.object.size);
            }
            engine.tally.skipped(planned.object.size);
            engine.tally.in_place(planned.rel.as_str(), planned.version(), planned.object.size);
            engine.metrics.object(ObjectResult::Skipped);
            continue;
        }
        to_copy.push(planned);
    }
    Ok(to_copy)
}

/// Charges a page's copies to the free-space account before any of them
/// starts, so a dataset of one page is refused before its first byte is
/// written. An object the shared objects hold is linked, and takes no room.
fn charge(
    engine: &Engine,
    ledger: &mut SpaceLedger,
    to_copy: &[Planned],
    last_page: bool,
) -> Result<(), TransferError> {
    let shared = engine.shared_objects.get();
    let linkable = |planned: &Planned| {
        shared.is_some_and(|shared| {
            shared_identity(shared, planned).is_some_and(|identity| shared.find(&identity).is_some())
        })
    };
    to_copy
        .iter()
        .filter(|planned| !linkable(planned))
        .for_each(|planned| ledger.charge(&planned.rel, planned.object.size));
    Ok(ledger.check(last_page)?)
}

/// What every object task of a pull shares.
struct Copies {
    /// Object tasks that may hold a request or a file at once.
    objects_in_flight: Arc<Semaphore>,
    /// Tasks that may wait for a peer at once (see [`PEER_WAITERS`]).
    peer_waiters: Arc<Semaphore>,
    staging: Arc<StagingArea>,
    writer: Arc<ManifestWriter>,
}

impl Copies {
    /// Starts the task that copies `planned`, once it has a slot.
    async fn start(
        &self,
        engine: &Arc<Engine>,
        planned: Planned,
        tasks: &mut ObjectTasks,
        turns: &mut Turns,
    ) -> Result<(), TransferError> {
        if let Some(fleet) = engine.fleet.as_ref().filter(|fleet| from_a_peer(engine, fleet, &planned)) {
            // Waiting for a peer holds no object slot, so this worker's own
            // share never queues behind its peers'.
            let waiter = object_slot(&self.peer_waiters, tasks).await?;
            let (engine, staging, writer) = (Arc::clone(engine), Arc::clone(&self.staging), Arc::clone(&self.writer));
            let (fleet, slots) = (Arc::clone(fleet), Arc::clone(&self.objects_in_flight));
            tasks.spawn(async move {
                let permit = after_the_peer(&fleet, &planned, waiter, &slots).await;
                let result = pull_object(&engine, &staging, &writer, planned, None).await;
                drop(permit);
                result
            });
            return Ok(());
        }
        let permit = object_slot(&self.objects_in_flight, tasks).await?;
        // An object of this worker's own share, in a fleet, starts when its
        // first request has a slot, in listing order: until then a worker
        // that joined the fleet may take it over.
        let turn = (engine.fleet.is_some() && whole_from_a_peer(engine, &planned)).then(|| turns.next());
        let (engine, staging, writer) = (Arc::clone(engine), Arc::clone(&self.staging), Arc::clone(&self.writer));
        let (waiters, slots) = (Arc::clone(&self.peer_waiters), Arc::clone(&self.objects_in_flight));
        tasks.spawn(async move {
            let mut permit = permit;
            let mut first = None;
            if let (Some(fleet), Some(turn)) = (&engine.fleet, turn) {
                let slot = turn.request(&engine).await;
                if fleet.taken_over(&planned.object.key) {
                    // Read from the joiner, once it holds it.
                    drop((slot, permit));
                    let waiter = waiters.acquire_owned().await.expect("never closed");
                    permit = after_the_peer(fleet, &planned, waiter, &slots).await;
                } else {
                    first = Some(slot);
                }
            }
            let result = pull_object(&engine, &staging, &writer, planned, first).await;
            drop(permit);
            result
        });
        Ok(())
    }
}

/// What follows the copies: partial downloads no object needs swept (after
/// a complete run), the fleet told, objects that left the store removed
/// (when `reconcile`), this run's manifest written with what was not
/// removed, and shared objects no directory links any more collected.
#[expect(clippy::too_many_arguments, reason = "the pull's state at its end, handed over once")]
async fn settle(
    engine: &Engine,
    prefix: &str,
    destination: &Path,
    complete: bool,
    reconcile: bool,
    manifest: ManifestCursor,
    mut departed: Departed<'_>,
    writer: ManifestWriter,
    scratch: &Path,
) -> Result<(), TransferError> {
    if complete {
        // Every selected object is in place: a partial left is of an object
        // this dataset no longer needs (changed, deselected, removed).
        // Sharded workers sharing the directory sweep only their own.
        let (root, prefix, shard) = (destination.to_path_buf(), prefix.to_owned(), engine.config.selection.shard());
        let owned = move |key: &str| shard.is_none_or(|shard| shard.owns(relative_key(key, &prefix)));
        let swept = tokio::task::spawn_blocking(move || partial::sweep(&root, owned)).await.expect("sweeping panicked");
        if swept > 0 {
            tracing::info!(removed = swept, "removed partial downloads no object needs any more");
        }
    }
    if let Some(fleet) = &engine.fleet {
        fleet.finish(complete);
    }
    // Entries past the last key listed: objects that left the store, or,
    // after a failed listing, not listed yet.
    let departed = manifest.drain(|entry| departed.passed(entry)).and_then(|()| departed.finish());
    // A listing out of key order may still show an object the manifest
    // has gone past: what it went past is not known to have left.
    let carried = match departed {
        Ok(departed) if reconcile => {
            remove_departed(engine, destination, departed, scratch.join("retained.jsonl")).await
        }
        other => other,
    };
    // What was not removed stays in the manifest (a run with failures, or
    // without `--delete-removed`, would otherwise forget those files, and a
    // later `--delete-removed` or `clean` could not remove them).
    let finished = match carried {
        Ok(carried) => tokio::task::spawn_blocking(move || writer.finish(Some(carried)))
            .await
            .expect("writing the manifest panicked"),
        Err(error) => Err(error),
    }
    .map_err(TransferError::Manifest);
    // Files this run replaced or removed may have been the last names of
    // shared objects besides the store's.
    let changes = engine.tally.changes();
    if let Some(shared) = engine.shared_objects.get().cloned()
        && changes.updated.objects + changes.removed.objects > 0
    {
        match tokio::task::spawn_blocking(move || shared.collect_garbage()).await.expect("collecting panicked") {
            Ok(collected) if collected.objects_removed > 0 => {
                tracing::info!(
                    removed = collected.objects_removed,
                    bytes = collected.bytes_freed,
                    "removed shared objects no directory links any more"
                );
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%error, "cannot remove unused shared objects; the next clean-up will"),
        }
    }
    finished
}

/// Objects waiting for a peer at once: enough for a page of a listing, so
/// that a worker lists on while its peers catch up.
const PEER_WAITERS: usize = 2048;

/// Whether `planned` is to be read, whole, from the peer that owns it. An
/// object of several ranges is not: every worker fetches it, each block
/// from the store or from the peer that owns the block, so every worker
/// shares the reading and the serving of a large object.
fn from_a_peer(engine: &Engine, fleet: &crate::fleet::Fleet, planned: &Planned) -> bool {
    whole_from_a_peer(engine, planned) && fleet.owner_elsewhere(planned.rel.as_str()).is_some()
}

/// Whether `planned` could be read whole from a peer: a version to ask
/// for, and of one range (a larger object goes block by block).
fn whole_from_a_peer(engine: &Engine, planned: &Planned) -> bool {
    planned.object.etag.is_some() && planned.object.size <= engine.config.part_size
}

/// Hands out turns in the order objects are spawned (listing order): a
/// request slot is taken in turn, not in the order the runtime first polls
/// the tasks, which on several threads is any order. So every object of
/// this worker's own share after the greatest key started is not started,
/// which is what a worker that joins may take over ([`crate::fleet::Fleet::taken_over`]).
#[derive(Default)]
struct Turns {
    /// Closed once the object spawned last has its slot.
    last: Option<oneshot::Receiver<()>>,
}

impl Turns {
    /// The turn of the object spawned next.
    fn next(&mut self) -> Turn {
        let (done, after) = oneshot::channel();
        Turn { after: self.last.replace(after), done }
    }
}

/// One object's turn to take its first request slot.
struct Turn {
    /// Closed once the object before it has its slot.
    after: Option<oneshot::Receiver<()>>,
    /// Dropped once this one has.
    done: oneshot::Sender<()>,
}

impl Turn {
    /// Waits for the object before to have its slot, then for one.
    async fn request(self, engine: &Engine) -> RequestSlot {
        if let Some(after) = self.after {
            // Closed either way: taken, or that task is gone.
            let _ = after.await;
        }
        let slot = engine.budget.request().await;
        drop(self.done);
        slot
    }
}

/// Waits until the peer `planned` is read from holds it (or is given up
/// on), then for an object slot, and lets the next waiter for a peer in:
/// the slot to pull it in.
async fn after_the_peer(
    fleet: &Arc<crate::fleet::Fleet>,
    planned: &Planned,
    waiter: OwnedSemaphorePermit,
    slots: &Arc<Semaphore>,
) -> OwnedSemaphorePermit {
    let etag = planned.object.etag.as_deref().unwrap_or_default();
    fleet.await_ready(planned.rel.as_str(), &planned.object.key, etag).await;
    let permit = Arc::clone(slots).acquire_owned().await.expect("never closed");
    drop(waiter);
    permit
}

/// `shared` once every other reference is gone. Object tasks are joined
/// before this, but a task aborted after a run-dooming failure may have
/// left a blocking call running (a write, a rename) that holds a reference
/// until it returns; those are short.
async fn sole_owner<T>(mut shared: Arc<T>) -> T {
    loop {
        match Arc::try_unwrap(shared) {
            Ok(owned) => return owned,
            Err(still_shared) => shared = still_shared,
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Removes the files of objects that left the store (unless changed since
/// staged) and counts them; returns the entries whose files could not be
/// removed (written to `retained`), for the manifest to keep.
async fn remove_departed(
    engine: &Engine,
    destination: &Path,
    departed: SortedRun<ManifestEntry>,
    retained: std::path::PathBuf,
) -> std::io::Result<SortedRun<ManifestEntry>> {
    let root = destination.to_path_buf();
    let (pruned, retained) = tokio::task::spawn_blocking(move || {
        let mut retained = RunWriter::create(&retained)?;
        let pruned = prune(&root, departed.stream()?, &mut retained)?;
        Ok::<_, std::io::Error>((pruned, retained.finish()?))
    })
    .await
    .expect("pruning panicked")?;
    engine.tally.removed(pruned.files_removed, pruned.bytes_removed);
    if pruned != Default::default() {
        tracing::info!(
            removed = pruned.files_removed,
            bytes = pruned.bytes_removed,
            kept = pruned.kept,
            retained = pruned.retained,
            directories = pruned.directories_removed,
            "removed files whose objects left the store"
        );
    }
    Ok(retained)
}

/// Applies the selection and the key-to-path mapping; records refusals.
fn plan_object(engine: &Engine, known: bool, prefix: &str, object: ObjectMeta) -> Option<Planned> {
    let relative = relative_key(&object.key, prefix);
    if !engine.config.selection.selects(relative) {
        return None;
    }
    match key_to_path(relative) {
        Ok(KeyPath::File(rel)) => {
            engine.tally.selected(object.size);
            Some(Planned { object, rel, known })
        }
        Ok(KeyPath::DirectoryMarker) => None,
        Err(reason) => {
            tracing::warn!(key = %object.key.escape_debug(), %reason, "refusing unsafe key");
            engine.tally.selected(object.size);
            engine.tally.failed(object.key.escape_debug().to_string(), object.size, format!("refused: {reason}"));
            engine.metrics.object(ObjectResult::Refused);
            None
        }
    }
}

/// Stages one object, retrying the whole object on a checksum mismatch; its
/// first request runs in `first`, when given.
/// Returns `Err` only for errors that doom the whole run: the store refuses
/// every request, or the disk is full (every other object would fail too,
/// and the run is to say why, not list a thousand failed keys).
async fn pull_object(
    engine: &Arc<Engine>,
    staging: &Arc<StagingArea>,
    writer: &Arc<ManifestWriter>,
    planned: Planned,
    mut first: Option<RequestSlot>,
) -> Result<(), TransferError> {
    if link_shared(engine, staging, writer, &planned).await {
        return Ok(());
    }
    let attempt = || download(engine, staging, writer, &planned, first.take());
    let result = again_on_mismatch(engine, &planned.object.key, attempt).await;
    let key = planned.object.key.clone();
    match result {
        Ok(verified) => {
            placed(engine, staging, &planned);
            engine.tally.transferred(verified);
            if let Verified::As(kind) = verified {
                engine.metrics.verified(kind);
            }
            engine.metrics.object(ObjectResult::Transferred);
            tracing::debug!(%key, size = planned.object.size, "staged");
        }
        Err(ObjectError::Store(source)) if dooms_the_run(&source) => {
            return Err(TransferError::Store { uri: engine.store.describe(), source });
        }
        Err(ObjectError::Io { what, source }) if is_disk_full(&source) => {
            let destination = staging.root().to_path_buf();
            return Err(CapacityError::DiskFull { destination, key, what, source }.into());
        }
        Err(error) => {
            tracing::warn!(%key, %error, "object failed");
            if let Some(fleet) = &engine.fleet {
                fleet.abandoned(&key);
            }
            engine.tally.failed(key, planned.object.size, &error);
            engine.metrics.object(ObjectResult::Failed);
        }
    }
    Ok(())
}

/// The object's identity in the shared-objects directory, when the pull
/// has one and the object has a version to tell its content by.
fn shared_identity<'a>(shared: &'a SharedObjects, planned: &'a Planned) -> Option<ObjectIdentity<'a>> {
    let version = planned.object.etag.as_deref()?;
    Some(ObjectIdentity { scope: shared.scope(), key: &planned.object.key, version, size: planned.object.size })
}

/// Puts the object in place by linking the copy another pull on this
/// filesystem staged, when the shared-objects directory holds it; `false`
/// when it does not, or the link fails (the caller fetches).
async fn link_shared(
    engine: &Arc<Engine>,
    staging: &Arc<StagingArea>,
    writer: &Arc<ManifestWriter>,
    planned: &Planned,
) -> bool {
    let Some(shared) = engine.shared_objects.get().cloned() else { return false };
    let (area, writer, planned) = (Arc::clone(staging), Arc::clone(writer), planned.clone());
    let linked = engine
        .on_disk(move || {
            let identity = shared_identity(&shared, &planned)?;
            let object = shared.find(&identity)?;
            let committed =
                commit_and_record(&writer, &planned, None, None, || area.commit_link(&object, &planned.rel));
            match committed {
                Ok(()) => Some(planned),
                Err(error) => {
                    if let ObjectError::Io { source, .. } = &error {
                        shared.link_failed(source, &object);
                    }
                    None
                }
            }
        })
        .await;
    let Some(planned) = linked else { return false };
    placed(engine, staging, &planned);
    engine.tally.linked(planned.object.size);
    engine.metrics.object(ObjectResult::Skipped);
    tracing::debug!(key = %planned.object.key, size = planned.object.size, "linked from the shared objects");
    true
}

/// Accounts for an object this run put in place, fetched or linked: the
/// fleet may serve it and stops waiting for it, and it is an addition or an
/// update in the version staged.
fn placed(engine: &Engine, staging: &StagingArea, planned: &Planned) {
    let size = planned.object.size;
    if let Some(fleet) = &engine.fleet {
        if let Some(etag) = &planned.object.etag {
            let path = staging.root().join(planned.rel.as_str());
            fleet.catalog.hold(&planned.object.key, path, etag, size);
        }
        fleet.staged(&planned.object.key);
    }
    if planned.known {
        engine.tally.updated(size)
    } else {
        engine.tally.added(size)
    }
    engine.tally.in_place(planned.rel.as_str(), planned.version(), size);
}

/// Downloads, verifies, commits and records one object; its first request
/// runs in `first`, when given.
///
/// Long on purpose: what is expected of the object (its checksum, its part
/// layout, a partial download to resume) decides how its ranges are hashed
/// as they land, and the file, the hashes and the resume record are one
/// object's state until it is renamed into place.
async fn download(
    engine: &Arc<Engine>,
    staging: &Arc<StagingArea>,
    writer: &Arc<ManifestWriter>,
    planned: &Planned,
    mut first: Option<RequestSlot>,
) -> Result<Verified, ObjectError> {
    let object = &planned.object;
    let size = object.size;
    let verify = engine.config.verify;
    let config = &engine.config;
    // In a fleet, ranges are the blocks peers own (`PeerGroup::block_owner`).
    let range_size = if config.grow_ranges && engine.fleet.is_none() {
        download_range_size(size, config.part_size, engine.range_spread())
    } else {
        config.part_size
    };
    let ranges = plan_ranges(size, range_size);
    let key: Arc<str> = Arc::from(object.key.as_str());
    let if_match: Option<Arc<str>> = object.etag.as_deref().map(Arc::from);
    if ranges.len() > 1 {
        // A slot taken before is for the one request of an object of one
        // range: held while its ranges wait for slots, it could hold the last.
        first = None;
    }
    if ranges.len() == 1 && size <= config.write_buffer {
        return download_in_memory(engine, staging, writer, planned, key, if_match, first).await;
    }

    // A multi-range object's checksum comes from a HEAD (ranged responses do
    // not carry it); a single GET carries its own; an empty object needs a
    // HEAD unless its ETag is the MD5 of nothing.
    let mut expected = None;
    if verify == VerifyMode::Checksum {
        if ranges.len() > 1 {
            let (meta, checksum) = engine.retrying(Operation::Head, || engine.store.head(&key)).await?;
            if meta.size != size || (object.etag.is_some() && meta.etag != object.etag) {
                return Err(StoreError::Changed.into());
            }
            expected = checksum;
        } else if ranges.is_empty() {
            let empty_md5 = object.etag.as_deref().and_then(md5_from_etag).filter(|md5| *md5 == MD5_OF_NOTHING);
            expected = match empty_md5 {
                Some(md5) => Some(Integrity::Whole(md5)),
                // Another ETag (a GCS generation, a multipart or SSE-KMS
                // ETag): ask for the stored checksum.
                None => engine.retrying_from(first.take(), Operation::Head, || engine.store.head(&key)).await?.1,
            };
        }
    }

    // Per-part checksums of an object fetched in ranges are hashed part by
    // part as soon as each part is written, behind the download of the rest;
    // an MD5 of the whole as far as the ranges have landed in order.
    let mut part_layout_of = None;
    if let Some(Integrity::Parts(parts)) = &expected
        && ranges.len() > 1
    {
        let layout = part_layout(engine, &planned.object, parts.parts).await?;
        part_layout_of = Some((parts.clone(), layout));
    }
    let wanted = Wanted::for_checksum(expected.as_ref());
    let landing = land(engine, staging, planned, ranges.len() > 1, wanted).await?;
    let file = landing.handle();
    let kept = landing.kept();
    // In a fleet, peers read an object of several ranges, and one of one
    // range (past a write buffer, so of several writes) that this worker
    // reads from the store (its own, or one it stands in for), from this
    // file as it lands instead of waiting for the whole object. One that
    // fits a write buffer went to memory above: it lands in one write, just
    // before its commit.
    let landed = match (&engine.fleet, &object.etag) {
        (Some(fleet), Some(etag))
            if ranges.len() > 1 || (ranges.len() == 1 && fleet.source_for(&object.key).is_none()) =>
        {
            let written: Vec<(u64, u64)> = kept.iter().map(|piece| (piece.offset, piece.offset + piece.len)).collect();
            Some(Arc::new(fleet.landing(&object.key, etag, size, Arc::clone(&file), &written)))
        }
        _ => None,
    };
    let mut precomputed = None;
    let resumed: u64 = kept.iter().map(|d| d.len).sum();
    let digests = match ranges.as_slice() {
        [] => Vec::new(),
        [whole] => {
            let sink = Sink::File(FileSink::new(&file, None, landed.clone()));
            let asking = Asking::Whole(first.take());
            let fetched = fetch_range(engine, &key, whole.clone(), asking, if_match, sink, wanted).await?;
            if verify == VerifyMode::Checksum {
                expected = fetched.checksum.clone();
            }
            fetched.digests
        }
        _ => {
            let missing = missing_ranges(ranges, &kept);
            let behind = match (part_layout_of.take(), &expected) {
                (Some((parts, layout)), _) => Some(HashBehind::parts(engine, &file, parts, &layout)),
                (None, Some(Integrity::Whole(StoredChecksum::Md5(_)))) => {
                    Some(HashBehind::md5(engine, &file, size).map_err(ObjectError::io_error("hashing the MD5"))?)
                }
                _ => None,
            };
            if let Some(behind) = &behind {
                kept.iter().for_each(|piece| behind.written(piece.offset, piece.offset + piece.len));
            }
            let behind = behind.map(Arc::new);
            let sink = FileSink { behind: behind.clone(), ..FileSink::new(&file, landing.partial(), landed.clone()) };
            let mut digests = fetch_ranges(engine, &key, missing, if_match, sink, wanted).await?;
            if let Some(behind) = behind {
                // Every range task, and with it every other handle, is done.
                let behind = Arc::into_inner(behind).expect("the range tasks have finished");
                precomputed =
                    Some(behind.finish().await.map_err(ObjectError::io_error("hashing behind the download"))?);
            }
            digests.extend(kept);
            digests
        }
    };

    let received = Received::File(&file);
    let verified =
        match check_received(engine, &planned.object, received, expected.as_ref(), &digests, precomputed).await {
            Ok(verified) => verified,
            Err(mismatch @ ObjectError::Mismatch { .. }) => {
                // Some byte is wrong, kept or new: the next attempt starts over.
                landing.discard();
                return Err(mismatch);
            }
            Err(other) => return Err(other),
        };

    let (staging, writer, planned) = (Arc::clone(staging), Arc::clone(writer), planned.clone());
    let shared = engine.shared_objects.get().cloned();
    engine
        .on_disk(move || {
            let (rel, mtime) = (&planned.rel, planned.object.last_modified);
            let keep_in =
                shared.as_deref().map(|shared| Keep { shared, root: staging.root(), spare: staging.spare_path() });
            commit_and_record(&writer, &planned, expected.as_ref(), keep_in, || match landing {
                Landing::Temp(temp) => staging.commit(temp, rel, mtime),
                Landing::Partial(partial) => {
                    let partial = Arc::into_inner(partial).expect("every range task has finished");
                    staging.commit_partial(partial, rel, mtime)
                }
            })
        })
        .await?;
    if resumed > 0 {
        tracing::info!(key = %object.key, resumed, "finished an object an earlier run had started");
        engine.tally.resumed(resumed);
        engine.metrics.resumed(Direction::Download, resumed);
    }
    Ok(verified)
}

/// Where a committed file is shared: the pull's shared objects, the
/// destination, and a spare name for a link (see [`SharedObjects::keep`]).
struct Keep<'a> {
    shared: &'a SharedObjects,
    root: &'a Path,
    spare: std::path::PathBuf,
}

/// Moves a verified file into place (`commit`) and records it in the
/// manifest, on the blocking thread that moves it: a run aborted meanwhile
/// (another object filled the disk) cannot leave a complete file that the
/// manifest does not know, which the next run would copy again.
fn commit_and_record(
    writer: &ManifestWriter,
    planned: &Planned,
    checksum: Option<&Integrity>,
    keep_in: Option<Keep<'_>>,
    commit: impl FnOnce() -> std::io::Result<FileStamp>,
) -> Result<(), ObjectError> {
    let mut stamp = commit().map_err(ObjectError::io_error("moving the file into place"))?;
    // Shared before it is recorded: a run killed in between finds it in the
    // shared objects next time, and links it instead of fetching it.
    if let Some(Keep { shared, root, spare }) = keep_in
        && let Some(identity) = shared_identity(shared, planned)
    {
        let path = planned.rel.under(root);
        if shared.keep(&identity, &path, &spare) {
            // Now the copy another pull stored: its stamp is the one to record.
            stamp = FileStamp::of(&path).map_err(ObjectError::io_error("reading the linked file"))?;
        }
    }
    // Without an ETag there is nothing to match a later listing against.
    let Some(etag) = &planned.object.etag else { return Ok(()) };
    let entry = ManifestEntry {
        path: planned.rel.as_str().to_owned(),
        key: planned.object.key.clone(),
        size: stamp.size,
        etag: etag.clone(),
        checksum: checksum.map(|c| c.to_string()),
        mtime_ns: stamp.mtime_ns,
    };
    writer.record(entry, true).map_err(ObjectError::io_error("recording the manifest"))
}

/// Where an object's bytes are written until it is verified.
enum Landing {
    /// A temporary file of this run, deleted unless committed.
    Temp(TempFile),
    /// A partial object kept across runs (large objects with a version).
    Partial(Arc<PartialObject>),
}

impl Landing {
    fn handle(&self) -> Arc<File> {
        match self {
            Landing::Temp(temp) => temp.handle(),
            Landing::Partial(partial) => partial.handle(),
        }
    }

    /// The partial, for range tasks to record what they wrote.
    fn partial(&self) -> Option<Arc<PartialObject>> {
        match self {
            Landing::Partial(partial) => Some(Arc::clone(partial)),
            Landing::Temp(_) => None,
        }
    }

    /// The pieces an earlier run completed, as digests.
    fn kept(&self) -> Vec<RangeDigest> {
        let Landing::Partial(partial) = self else { return Vec::new() };
        partial
            .done()
            .iter()
            .map(|r| RangeDigest {
                offset: r.offset,
                len: r.len,
                crc32c: r.crc32c,
                crc32: r.crc32.map(|crc| crc32fast::Hasher::new_with_initial_len(crc, r.len)),
                crc64nvme: r.crc64nvme,
                md5: None,
            })
            .collect()
    }

    fn discard(self) {
        match self {
            Landing::Temp(temp) => drop(temp),
            Landing::Partial(partial) => {
                if let Some(partial) = Arc::into_inner(partial) {
                    partial.discard();
                }
            }
        }
    }
}

/// Opens where the object's bytes go: for an object of several ranges with a
/// version to match, its partial (resuming what an earlier run recorded);
/// otherwise, or when another run holds that partial, a temporary file.
async fn land(
    engine: &Engine,
    staging: &Arc<StagingArea>,
    planned: &Planned,
    several_ranges: bool,
    wanted: Wanted,
) -> Result<Landing, ObjectError> {
    let size = planned.object.size;
    let staging = Arc::clone(staging);
    let header = planned.object.etag.as_ref().filter(|_| several_ranges).map(|version| PartialHeader {
        key: planned.object.key.clone(),
        version: version.clone(),
        size,
        digests: format!("crc32c={},crc32={},crc64nvme={}", wanted.crc32c, wanted.crc32, wanted.crc64nvme),
        boot: engine.boot_id.clone(),
    });
    let name = partial::name_for(&planned.rel);
    let rel = planned.rel.clone();
    engine
        .on_disk(move || -> std::io::Result<Landing> {
            if let Some(header) = header
                && let Some(partial) = PartialObject::open(staging.root(), &name, &header)?
            {
                return Ok(Landing::Partial(Arc::new(partial)));
            }
            staging.temp_file(&rel, size).map(Landing::Temp)
        })
        .await
        .map_err(ObjectError::io_error("creating a temporary file"))
}

/// Downloads a small object (one GET, at most one write buffer) into
/// memory, verifies it there, then writes, renames and stamps it in one
/// blocking call.
async fn download_in_memory(
    engine: &Arc<Engine>,
    staging: &Arc<StagingArea>,
    writer: &Arc<ManifestWriter>,
    planned: &Planned,
    key: Arc<str>,
    if_match: Option<Arc<str>>,
    first: Option<RequestSlot>,
) -> Result<Verified, ObjectError> {
    let size = planned.object.size;
    let whole = 0..size;
    // What to compute is learnt from the response itself (a full GET carries the checksum).
    let fetched =
        fetch_range(engine, &key, whole, Asking::Whole(first), if_match, Sink::Memory, Wanted::default()).await?;
    let (chunks, memory) = fetched.held.expect("a memory sink holds its bytes");
    let expected = if engine.config.verify == VerifyMode::Checksum { fetched.checksum } else { None };
    let verified =
        check_received(engine, &planned.object, Received::Memory(&chunks), expected.as_ref(), &fetched.digests, None)
            .await?;

    let checked = engine.config.verify != VerifyMode::None;
    let (staging, writer, planned) = (Arc::clone(staging), Arc::clone(writer), planned.clone());
    let shared = engine.shared_objects.get().cloned();
    engine
        .on_disk(move || -> Result<(), ObjectError> {
            let temp =
                staging.temp_file(&planned.rel, size).map_err(ObjectError::io_error("creating a temporary file"))?;
            let file = temp.handle();
            write_chunks_at(&file, &chunks, 0).map_err(ObjectError::io_error("writing to disk"))?;
            drop(chunks);
            drop(memory);
            if checked {
                let written = file.metadata().map_err(ObjectError::io_error("checking the size"))?.len();
                if written != size {
                    return Err(ObjectError::Size { expected: size, actual: written });
                }
            }
            let keep_in =
                shared.as_deref().map(|shared| Keep { shared, root: staging.root(), spare: staging.spare_path() });
            commit_and_record(&writer, &planned, expected.as_ref(), keep_in, || {
                staging.commit(temp, &planned.rel, planned.object.last_modified)
            })
        })
        .await?;
    engine.tally.bytes(size);
    engine.metrics.add_bytes(Direction::Download, size);
    Ok(verified)
}

/// The MD5 of zero bytes: the ETag of an empty single-part object.
const MD5_OF_NOTHING: StoredChecksum = StoredChecksum::Md5([
    0xd4, 0x1d, 0x8c, 0xd9, 0x8f, 0x00, 0xb2, 0x04, 0xe9, 0x80, 0x09, 0x98, 0xec, 0xf8, 0x42, 0x7e,
]);

/// Where a range's bytes go as they arrive.
#[derive(Clone)]
enum Sink {
    /// Written into a file at the range's offset, a write buffer at a time.
    File(FileSink),
    /// Kept in memory (the range must fit one write buffer), with the memory
    /// budget they take.
    Memory,
}

/// A file that ranges are written into, and who is told of each write.
#[derive(Clone)]
struct FileSink {
    file: Arc<File>,
    /// The partial download that records each write, if the file is one.
    partial: Option<Arc<PartialObject>>,
    /// The fleet's record of the object as it lands, if peers read it.
    landed: Option<Arc<LandingGuard>>,
    /// What is hashed behind the download, if anything (see `behind.rs`).
    behind: Option<Arc<HashBehind>>,
}

impl FileSink {
    fn new(file: &Arc<File>, partial: Option<Arc<PartialObject>>, landed: Option<Arc<LandingGuard>>) -> Self {
        Self { file: Arc::clone(file), partial, landed, behind: None }
    }
}

/// What one range delivered.
struct Fetched {
    /// Digests of the range's pieces, in order (one per write for a file).
    digests: Vec<RangeDigest>,
    /// What the response says the object hashes to (full reads only).
    checksum: Option<Integrity>,
    /// A memory sink's bytes, and the memory budget that holds them.
    held: Option<(Vec<Bytes>, OwnedSemaphorePermit)>,
}

/// Fetches the ranges of one object through a sliding window, so a huge
/// object keeps at most `concurrency` range tasks alive. The first failure
/// cancels the rest.
///
/// An object whose MD5s are followed as it lands ([`HashBehind::in_order`]) keeps only its
/// share of the request budget in flight, split evenly between the files
/// followed now (one range at least). Its ranges then land nearly in order,
/// so the hasher reads each one right behind the download, and the budget
/// goes to other files' next bytes instead: the MD5 lanes advance many
/// files together, and they fill only when many files grow at once.
/// Measured on 16 × 64 MiB single-part objects, fetching every object's
/// ranges at once left one or two files readable at a time, each hashed
/// in rounds of mostly empty lanes after its download. A lone followed
/// object still has the whole budget.
async fn fetch_ranges(
    engine: &Arc<Engine>,
    key: &Arc<str>,
    ranges: Vec<Range<u64>>,
    if_match: Option<Arc<str>>,
    sink: FileSink,
    wanted: Wanted,
) -> Result<Vec<RangeDigest>, ObjectError> {
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let most = engine.config.concurrency.clamp(1, ranges.len());
    let in_order = sink.behind.as_deref().is_some_and(HashBehind::in_order);
    let window = || {
        if in_order {
            let share = engine.budget.request_limit().0 / engine.md5.following().max(1);
            share.clamp(1, most)
        } else {
            most
        }
    };
    let mut pending = ranges.into_iter();
    let mut tasks = JoinSet::new();
    let spawn = |tasks: &mut JoinSet<_>, range: Range<u64>| {
        let (engine, key, if_match, sink) = (Arc::clone(engine), Arc::clone(key), if_match.clone(), sink.clone());
        tasks.spawn(async move {
            fetch_range(&engine, &key, range, Asking::Range, if_match, Sink::File(sink), wanted).await
        });
    };
    for range in pending.by_ref().take(window()) {
        spawn(&mut tasks, range);
    }
    let mut digests = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let fetched = match joined {
            Ok(result) => result?,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        digests.extend(fetched.digests);
        // At least one more, so the object always moves; more when the
        // window has grown (the budget grew, or other files finished).
        let room = window().saturating_sub(tasks.len()).max(1);
        for range in pending.by_ref().take(room) {
            spawn(&mut tasks, range);
        }
    }
    Ok(digests)
}

/// The parts of `ranges` that the `kept` pieces (sorted, not overlapping)
/// do not cover: what a resumed download still has to fetch.
fn missing_ranges(ranges: Vec<Range<u64>>, kept: &[RangeDigest]) -> Vec<Range<u64>> {
    if kept.is_empty() {
        return ranges;
    }
    let mut missing = Vec::new();
    for range in ranges {
        let mut cursor = range.start;
        for piece in kept.iter().filter(|k| k.offset < range.end && k.offset + k.len > range.start) {
            if piece.offset > cursor {
                missing.push(cursor..piece.offset);
            }
            cursor = cursor.max(piece.offset + piece.len);
        }
        if cursor < range.end {
            missing.push(cursor..range.end);
        }
    }
    missing
}

/// How a GET asks for its bytes.
enum Asking {
    /// A range of the object, with a Range header.
    Range,
    /// The whole object, without one (its response carries the store's
    /// checksum); its first attempt in the slot given, when one is.
    Whole(Option<RequestSlot>),
}

/// Fetches `range` of the object, as `asking` says, into `sink`, with retries.
async fn fetch_range(
    engine: &Arc<Engine>,
    key: &Arc<str>,
    range: Range<u64>,
    asking: Asking,
    if_match: Option<Arc<str>>,
    sink: Sink,
    wanted: Wanted,
) -> Result<Fetched, ObjectError> {
    let (whole, first) = match asking {
        Asking::Range => (false, None),
        Asking::Whole(first) => (true, first),
    };
    if !whole {
        engine.store.ready(key, &range, if_match.as_deref()).await;
    }
    engine
        .retrying_from(first, Operation::Get, || {
            fetch_attempt(
                Arc::clone(engine),
                Arc::clone(key),
                range.clone(),
                whole,
                if_match.clone(),
                sink.clone(),
                wanted,
            )
        })
        .await
}

/// One attempt: GET, stream into a bounded buffer, write at offsets (or keep
/// the bytes, for a memory sink).
async fn fetch_attempt(
    engine: Arc<Engine>,
    key: Arc<str>,
    range: Range<u64>,
    whole: bool,
    if_match: Option<Arc<str>>,
    sink: Sink,
    wanted: Wanted,
) -> Result<Fetched, ObjectError> {
    let len = range.end - range.start;
    let capacity = engine.config.write_buffer.min(len).max(1);
    let memory = engine.budget.memory(capacity + REQUEST_OVERHEAD).await;
    let response = engine.store.get(&key, (!whole).then(|| range.clone()), if_match.as_deref()).await?;
    expect_announced(response.content_length, len)?;
    let checksum = if whole && engine.config.verify == VerifyMode::Checksum { response.checksum } else { None };
    // A whole-object read learns its checksum from the response itself; an
    // MD5 is hashed in flight only when the bytes stay in memory (see
    // `verify.rs`). One written to a file is hashed once it is complete,
    // together with other complete files: followed as it lands, with only
    // as many files streaming as requests (8 at first), the lanes ran half
    // empty, and 128 × 8 MiB objects took 1.48 CPU s per GiB against 1.26.
    let wanted = match (whole, &sink) {
        (true, Sink::Memory) => Wanted::for_checksum(checksum.as_ref()).with_md5_for(checksum.as_ref()),
        (true, Sink::File(..)) => Wanted::for_checksum(checksum.as_ref()),
        (false, _) => wanted,
    };

    // One digest per piece written (they combine), so a piece is recorded,
    // with its digest, as soon as it is on disk.
    let mut digester = Digester::new(wanted, &engine.tally.verify);
    let mut pieces: Vec<RangeDigest> = Vec::new();
    let mut body = response.body;
    // Chunks are held (not copied) until a write buffer's worth has arrived,
    // then written with one vectored write.
    let mut pending: Vec<Bytes> = Vec::new();
    // A memory sink copies into one buffer of the object's size instead: a
    // chunk keeps the whole read buffer it arrived in alive (up to
    // [`ferry_store::READ_BUFFER_MAX`], shared with the responses after it), and a small
    // object waiting for a disk thread would hold that against the budget's
    // `len`, not its size. A write buffer's chunks are let go as soon as
    // they are written, so a file sink holds them as they are.
    let mut copied = matches!(sink, Sink::Memory).then(|| BytesMut::with_capacity(len as usize));
    let mut pending_len = 0u64;
    let mut flushed = 0u64;
    let mut received = 0u64;
    let stall = engine.config.stall_timeout;
    let streamed: Result<(), ObjectError> = async {
        while let Some(chunk) = next_chunk(&mut body, stall).await? {
            received += chunk.len() as u64;
            if received > len {
                return Err(more_than_announced().into());
            }
            digester.update(&chunk);
            pending_len += chunk.len() as u64;
            match copied.as_mut() {
                Some(copied) => copied.extend_from_slice(&chunk),
                None => pending.push(chunk),
            }
            if let Sink::File(to) = &sink
                && pending_len >= capacity
            {
                flush(&engine, &to.file, &mut pending, range.start + flushed).await?;
                let piece = std::mem::replace(&mut digester, Digester::new(wanted, &engine.tally.verify))
                    .finish(range.start + flushed, pending_len);
                flushed += std::mem::take(&mut pending_len);
                piece_written(to, &piece)?;
                pieces.push(piece);
            }
        }
        match &sink {
            Sink::File(to) if pending_len > 0 => {
                flush(&engine, &to.file, &mut pending, range.start + flushed).await?;
                let piece = std::mem::replace(&mut digester, Digester::new(wanted, &engine.tally.verify))
                    .finish(range.start + flushed, pending_len);
                flushed += std::mem::take(&mut pending_len);
                piece_written(to, &piece)?;
                pieces.push(piece);
            }
            // Paced here, inside the request, as a flush is: the request
            // slot is held while waiting, so `--max-bandwidth` bounds what
            // is read from the network, not only what reaches the disk.
            Sink::Memory => {
                engine.pace(pending_len).await;
                pieces.push(
                    std::mem::replace(&mut digester, Digester::new(wanted, &engine.tally.verify))
                        .finish(range.start, len),
                );
            }
            Sink::File(..) => {}
        }
        if received != len {
            return Err(ended_early(received, len).into());
        }
        Ok(())
    }
    .await;
    if let Err(error) = streamed {
        engine.tally.unbytes(flushed);
        return Err(error);
    }
    let held = copied.map(|copied| (vec![copied.freeze()], memory));
    Ok(Fetched { digests: pieces, checksum, held })
}

/// A piece is written: recorded in the partial object, if the file is one,
/// told to peers reading the object as it lands, and hashed behind.
fn piece_written(to: &FileSink, piece: &RangeDigest) -> Result<(), ObjectError> {
    if let Some(landed) = &to.landed {
        landed.written(piece.offset, piece.offset + piece.len);
    }
    if let Some(behind) = &to.behind {
        behind.written(piece.offset, piece.offset + piece.len);
    }
    let Some(partial) = &to.partial else { return Ok(()) };
    let record = RangeRecord {
        offset: piece.offset,
        len: piece.len,
        crc32c: piece.crc32c,
        crc32: piece.crc32.clone().map(crc32fast::Hasher::finalize),
        crc64nvme: piece.crc64nvme,
    };
    partial.record(&record).map_err(ObjectError::io_error("recording a downloaded range"))
}

/// Writes the pending chunks at `offset` and empties the list. The write
/// goes to the page cache and is done in place: handing each write to
/// another thread cost more (wake-ups, context switches) than it saved.
async fn flush(engine: &Engine, file: &File, pending: &mut Vec<Bytes>, offset: u64) -> Result<(), ObjectError> {
    let n: u64 = pending.iter().map(|c| c.len() as u64).sum();
    engine.pace(n).await;
    write_chunks_at(file, pending, offset).map_err(ObjectError::io_error("writing to disk"))?;
    pending.clear();
    engine.tally.bytes(n);
    engine.metrics.add_bytes(Direction::Download, n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(offset: u64, len: u64) -> RangeDigest {
        RangeDigest { offset, len, crc32c: None, crc32: None, crc64nvme: None, md5: None }
    }

    #[test]
    fn a_resumed_download_fetches_exactly_what_the_kept_pieces_do_not_cover() {
        let ranges = vec![0..10, 10..20, 20..25];
        assert_eq!(missing_ranges(ranges.clone(), &[]), ranges);
        // Pieces cut by another run's plan: across range boundaries.
        let kept = [piece(0, 4), piece(8, 5), piece(13, 2), piece(20, 5)];
        assert_eq!(missing_ranges(ranges, &kept), vec![4..8, 15..20]);
        let everything = [piece(0, 25)];
        assert!(missing_ranges(vec![0..10, 10..25], &everything).is_empty());
    }
}
