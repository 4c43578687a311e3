//! Push: every file below a local directory, into a bucket prefix.
//!
//! The directory is walked on a blocking thread that streams files into a
//! bounded channel, so uploads start at once. A file up to the multipart
//! threshold is read into memory and sent as one PUT; a larger one becomes a
//! multipart upload whose parts are read, checksummed and sent concurrently
//! through a sliding window. Every request carries a CRC32C the store
//! verifies, and a multipart upload is completed with the whole file's
//! CRC32C (combined from the parts), so the object ends up with a
//! full-object checksum that later pulls verify. A multipart upload that
//! fails is aborted.
//!
//! What a killed push leaves is for the next run ([`super::push_resume`]):
//! files still in the store as pushed are skipped, unfinished uploads of
//! unchanged files keep the parts the store holds, and what is not resumed
//! is aborted.

use std::fs::File;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::push_resume::{MultipartStart, Resume};
use super::ranges::{plan_ranges, upload_part_size};
use super::receive::ObjectError;
use super::tally::{Summary, Verified, VerifiedKind};
use super::{Engine, ObjectTasks, REQUEST_OVERHEAD, TransferError, dooms_the_run, join_objects, room_for_an_object};
use crate::local::push_state::StartedUpload;
use crate::local::staging::FileStamp;
use crate::local::walk::{LocalFile, walk};
use crate::metrics::{Direction, ObjectResult, Operation};
use crate::store::UploadedPart;

/// Logged (warn) when the store refuses to assemble an upload with parts an
/// earlier run sent; the file is then sent again whole. Tests read the log
/// for it.
pub const REFUSED_RESUMED_ASSEMBLY: &str = "the store refused to assemble a resumed upload; sending the file again";

/// Logged (debug) for a part an earlier run sent whose size or CRC32C is not
/// this part's, so it is sent again. Tests read the log for it.
pub const UNFIT_HELD_PART: &str = "an earlier run's part is not this one's";

/// What every file of one push shares.
#[derive(Debug)]
struct PushRun {
    engine: Arc<Engine>,
    resume: Resume,
}

/// What the store holds after a file was uploaded.
#[derive(Debug)]
struct Written {
    /// The file as it was read.
    stamp: FileStamp,
    /// The new object's ETag, when the store gave one.
    etag: Option<String>,
    /// CRC32C of the whole file.
    crc32c: u32,
}

/// Copies every selected file below `source` to `prefix` in the store.
///
/// # Errors
/// Run-level failures: the source is not a readable directory, the bucket is
/// missing, the credentials are refused, the endpoint is unreachable.
pub async fn push(engine: Arc<Engine>, source: &Path, prefix: &str) -> Result<Summary, TransferError> {
    let started = Instant::now();
    let destination_uri = format!("{}/{prefix}", engine.store.describe());
    let meta =
        std::fs::metadata(source).map_err(|e| TransferError::Source { path: source.to_path_buf(), source: e })?;
    if !meta.is_dir() {
        return Err(TransferError::Source {
            path: source.to_path_buf(),
            source: std::io::Error::other("not a directory"),
        });
    }
    preflight(&engine, prefix).await?;
    let resume = Resume::prepare(&engine, source, &destination_uri, prefix).await;
    tracing::info!(source = %source.display(), destination = %destination_uri, "push started");
    let walk_scratch = resume.walk_scratch();
    let run = Arc::new(PushRun { engine: Arc::clone(&engine), resume });

    let (files_tx, mut files) = mpsc::channel(1024);
    let root = source.to_path_buf();
    // A thread of its own, not the runtime's bounded blocking pool: the
    // walk waits for room in the channel, which only object tasks that may
    // need that pool make (see `crate::runtime`).
    let (walked_tx, walked) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ferry-walk".into())
        .spawn(move || {
            let walked = walk(&root, walk_scratch, |item| files_tx.blocking_send(item).is_ok());
            let _ = walked_tx.send(walked);
        })
        .map_err(|e| TransferError::Source { path: source.to_path_buf(), source: e })?;
    let mut tasks = ObjectTasks::new();

    let outcome: Result<(), TransferError> = async {
        while let Some(item) = files.recv().await {
            let file = match item {
                Ok(file) => file,
                Err(refused) => {
                    tracing::warn!(path = %refused.name, reason = %refused.reason, "refusing file");
                    engine.tally.selected(0);
                    engine.tally.failed(refused.name, 0, format!("refused: {}", refused.reason));
                    engine.metrics.object(ObjectResult::Refused);
                    continue;
                }
            };
            if !engine.config.selection.selects(file.rel.as_str()) {
                run.resume.not_selected(&file);
                continue;
            }
            engine.tally.selected(file.size);
            let key = format!("{prefix}{}", file.rel);
            if run.resume.still_in_store(&file, &key).await {
                engine.tally.skipped(file.size);
                engine.metrics.object(ObjectResult::Skipped);
                continue;
            }
            // Each object reads its file into memory before its request
            // waits for a slot, so objects in flight follow the requests
            // allowed now: with the adaptive ceiling's 512 objects behind 8
            // requests, a push of small files peaked at 26 MiB idle and 39
            // beside CPU hogs, against 15 either way now.
            room_for_an_object(&mut tasks, || engine.objects_in_flight_now()).await?;
            let run = Arc::clone(&run);
            tasks.spawn(async move { push_file(&run, file, key).await });
        }
        engine.tally.listing_finished();
        join_objects(&mut tasks).await
    }
    .await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    outcome?;
    walked
        .await
        .expect("walk panicked")
        .map_err(|e| TransferError::Source { path: source.to_path_buf(), source: e })?;
    // Every task is gone, so this is the last reference.
    let run = Arc::into_inner(run).expect("all tasks joined");
    run.resume.finish(&engine, prefix).await;
    let mut summary = engine.tally.summary(
        super::tally::Operation::Push,
        source.display().to_string(),
        destination_uri,
        started.elapsed(),
    );
    summary.concurrency = Some(engine.concurrency_used());
    summary.throttled = engine.metrics.throttles();
    Ok(summary)
}

/// One cheap request before anything is read, so a missing bucket, wrong
/// credentials or an unreachable endpoint end the run at once with one clear
/// message. Credentials that may write but not list are allowed through.
async fn preflight(engine: &Engine, prefix: &str) -> Result<(), TransferError> {
    match engine.retrying(Operation::List, || engine.store.list_page(prefix, None)).await {
        Ok(_) => Ok(()),
        Err(source) if dooms_the_run(&source) => Err(TransferError::Store { uri: engine.store.describe(), source }),
        Err(error) => {
            tracing::debug!(%error, "cannot list the destination; continuing with uploads");
            Ok(())
        }
    }
}

/// Uploads one file. Returns `Err` only for errors that doom the whole run.
async fn push_file(run: &Arc<PushRun>, file: LocalFile, key: String) -> Result<(), TransferError> {
    let engine = &run.engine;
    let claimed = run.resume.claim(&key);
    let result = upload(run, &file, &key, claimed).await;
    match result {
        Ok(written) => {
            run.resume.pushed(&file, &key, written.stamp, written.etag, written.crc32c);
            // The store checked every request's CRC32C, and the object's.
            engine.tally.transferred(Verified::As(VerifiedKind::Crc32c));
            engine.metrics.verified(VerifiedKind::Crc32c);
            engine.metrics.object(ObjectResult::Transferred);
            tracing::debug!(%key, size = file.size, "uploaded");
        }
        Err(ObjectError::Store(source)) if dooms_the_run(&source) => {
            return Err(TransferError::Store { uri: engine.store.describe(), source });
        }
        Err(error) => {
            tracing::warn!(path = %file.rel, %error, "file failed");
            engine.tally.failed(file.rel.to_string(), file.size, &error);
            engine.metrics.object(ObjectResult::Failed);
        }
    }
    Ok(())
}

/// Size and mtime, to notice a file that changes while it is uploaded.
fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    Ok(FileStamp::of_metadata(&std::fs::metadata(path)?))
}

/// The file changed between the two stamps.
fn changed() -> ObjectError {
    ObjectError::Io {
        what: "uploading",
        source: std::io::Error::other("the file changed while it was being uploaded; run the push again"),
    }
}

/// Uploads one file; `claimed` are the uploads earlier runs left for its
/// key, resumed when one fits this version of the file, else aborted.
async fn upload(
    run: &Arc<PushRun>,
    file: &LocalFile,
    key: &str,
    mut claimed: Vec<StartedUpload>,
) -> Result<Written, ObjectError> {
    let engine = &run.engine;
    if file.size <= engine.config.multipart_threshold {
        run.resume.abort_recorded(engine, std::mem::take(&mut claimed)).await;
        if let Some(written) = upload_small(engine, file, key).await? {
            return Ok(written);
        }
    }
    let path = file.path.clone();
    let (handle, before) = engine
        .on_disk(move || -> std::io::Result<_> {
            let handle = File::open(&path)?;
            Ok((Arc::new(handle), stamp(&path)?))
        })
        .await
        .map_err(ObjectError::io_error("opening the file"))?;
    let size = before.size;

    let (etag, crc32c) = if size <= engine.config.multipart_threshold {
        run.resume.abort_recorded(engine, claimed).await;
        let _memory = engine.budget.memory(size + REQUEST_OVERHEAD).await;
        let (body, crc) = read_part(engine, Arc::clone(&handle), 0, size).await?;
        (put_whole(engine, key, body, crc).await?, crc)
    } else {
        match upload_multipart(run, &handle, key, before, claimed).await {
            Err(MultipartFailure { error, kept_parts: true }) if !dooms(&error) => {
                // The kept parts are another process's: a killed run's
                // requests can still be landing while this one assembles
                // them. The store judged the assembly, so the file is sent
                // again whole, into an upload of this run's alone.
                tracing::warn!(%key, %error, "{REFUSED_RESUMED_ASSEMBLY}");
                upload_multipart(run, &handle, key, before, Vec::new()).await.map_err(|failure| failure.error)?
            }
            result => result.map_err(|failure| failure.error)?,
        }
    };

    let path = file.path.clone();
    let after =
        engine.on_disk(move || stamp(&path)).await.map_err(ObjectError::io_error("checking the file after upload"))?;
    if after != before {
        return Err(changed());
    }
    Ok(Written { stamp: before, etag, crc32c })
}

/// Uploads a file of at most one part with a single hop to a blocking
/// thread (open, stamp, read and CRC32C together) instead of three: with
/// 10,000 × 64 KiB files the hops were the largest cost the client itself
/// added per file. The stamp after the upload is an fstat of the open file,
/// so it notices writes to the file that was read, but not a new file renamed
/// over its path meanwhile (the general path stats the path): what was sent
/// is then still one whole version of the file.
/// Returns `None`, having sent nothing, when the file is no longer the size
/// the walk saw; the general path then takes it.
async fn upload_small(engine: &Arc<Engine>, file: &LocalFile, key: &str) -> Result<Option<Written>, ObjectError> {
    let size = file.size;
    let _memory = engine.budget.memory(size + REQUEST_OVERHEAD).await;
    let mut buffer = engine.buffers.take(size as usize);
    let path = file.path.clone();
    // Through the engine's disk slots, as a pull's file operations are:
    // one blocking thread per object in flight (512 at the most) grew the
    // process by a thread stack and an allocator arena each (a push of
    // 100,000 files ended with 516 threads and 8 MiB more than one of
    // 20,000).
    let read = engine
        .on_disk(move || -> std::io::Result<_> {
            let handle = File::open(&path)?;
            let before = FileStamp::of_metadata(&handle.metadata()?);
            if before.size != size {
                return Ok(None);
            }
            handle.read_exact_at(&mut buffer, 0)?;
            let crc = crc32c::crc32c(&buffer);
            Ok(Some((handle, before, Bytes::from(buffer), crc)))
        })
        .await
        .map_err(ObjectError::io_error("reading the file"))?;
    let Some((handle, before, body, crc)) = read else { return Ok(None) };
    let etag = put_whole(engine, key, body, crc).await?;
    // One fstat of an open file: no need for a blocking thread.
    let after =
        FileStamp::of_metadata(&handle.metadata().map_err(ObjectError::io_error("checking the file after upload"))?);
    if after != before {
        return Err(changed());
    }
    Ok(Some(Written { stamp: before, etag, crc32c: crc }))
}

/// Sends `body` as one PUT with its CRC32C, paced, and recycles its buffer.
/// Returns the ETag the store gave the object.
async fn put_whole(engine: &Engine, key: &str, body: Bytes, crc: u32) -> Result<Option<String>, ObjectError> {
    let size = body.len() as u64;
    engine.pace(size).await;
    let put = engine.retrying(Operation::Put, || engine.store.put(key, body.clone(), crc)).await;
    engine.buffers.give_bytes(body);
    let etag = put?;
    engine.tally.bytes(size);
    engine.metrics.add_bytes(Direction::Upload, size);
    Ok(etag)
}

/// Reads `len` bytes at `offset` and their CRC32C on a blocking thread.
async fn read_part(engine: &Engine, handle: Arc<File>, offset: u64, len: u64) -> Result<(Bytes, u32), ObjectError> {
    let mut buf = engine.buffers.take(len as usize);
    tokio::task::spawn_blocking(move || -> std::io::Result<(Bytes, u32)> {
        handle.read_exact_at(&mut buf, offset)?;
        let crc = crc32c::crc32c(&buf);
        Ok((Bytes::from(buf), crc))
    })
    .await
    .expect("read panicked")
    .map_err(ObjectError::io_error("reading the file"))
}

/// A multipart upload that failed, and whether the store refused to
/// complete it with parts an earlier run sent.
struct MultipartFailure {
    error: ObjectError,
    kept_parts: bool,
}

impl From<ObjectError> for MultipartFailure {
    fn from(error: ObjectError) -> Self {
        Self { error, kept_parts: false }
    }
}

fn dooms(error: &ObjectError) -> bool {
    matches!(error, ObjectError::Store(source) if dooms_the_run(source))
}

/// Uploads a file in parts into a new upload, or into the claimed one that
/// fits it, keeping the parts the store holds with this part's size and
/// CRC32C. Returns the object's ETag and the whole file's CRC32C.
///
/// Long on purpose: the parts in flight, the progress they add and take
/// back, and the abort-or-keep decision on failure share one upload's
/// state, which this function owns from start to completion.
async fn upload_multipart(
    run: &Arc<PushRun>,
    handle: &Arc<File>,
    key: &str,
    stamp: FileStamp,
    claimed: Vec<StartedUpload>,
) -> Result<(Option<String>, u32), MultipartFailure> {
    let engine = &run.engine;
    let part_size = upload_part_size(stamp.size, engine.config.part_size);
    let ranges = plan_ranges(stamp.size, part_size);
    let MultipartStart { upload_id, held } = run.resume.start_or_resume(engine, key, stamp, part_size, claimed).await?;
    let held = Arc::new(held);
    let key_arc: Arc<str> = Arc::from(key);
    // Bytes of parts already sent, taken back from the progress if the upload fails.
    let uploaded_bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));

    let uploaded: Result<(Option<String>, u32, u64), MultipartFailure> = async {
        let window = engine.config.concurrency.clamp(1, ranges.len());
        let mut pending = ranges.into_iter().enumerate();
        let mut tasks = JoinSet::new();
        let spawn = |tasks: &mut JoinSet<_>, (index, range): (usize, std::ops::Range<u64>)| {
            let (engine, handle, key, upload_id, progress, held) = (
                Arc::clone(engine),
                Arc::clone(handle),
                Arc::clone(&key_arc),
                Arc::clone(&upload_id),
                Arc::clone(&uploaded_bytes),
                Arc::clone(&held),
            );
            tasks.spawn(async move {
                let len = range.end - range.start;
                let _memory = engine.budget.memory(len + REQUEST_OVERHEAD).await;
                let (body, crc) = read_part(&engine, handle, range.start, len).await?;
                let number = index as u32 + 1;
                // A part an earlier run sent is kept only when its bytes are
                // this part's: same size, same CRC32C of what is on disk now.
                match held.get(&number) {
                    Some(kept) if kept.size == len && kept.crc32c == Some(crc) => {
                        engine.buffers.give_bytes(body);
                        let part = UploadedPart { number, etag: kept.etag.clone(), crc32c: crc };
                        return Ok::<_, ObjectError>((part, len, true));
                    }
                    Some(unfit) => {
                        tracing::debug!(%key, part = number, held = ?unfit, size = len, crc32c = crc, "{UNFIT_HELD_PART}");
                    }
                    None => {}
                }
                engine.pace(len).await;
                let part = engine
                    .retrying(Operation::UploadPart, || {
                        engine.store.upload_part(&key, &upload_id, number, body.clone(), crc)
                    })
                    .await;
                engine.buffers.give_bytes(body);
                let part = part.inspect_err(|error| {
                    tracing::warn!(%key, part = number, crc32c = crc, %error, "the store refused a part");
                })?;
                engine.tally.bytes(len);
                progress.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                engine.metrics.add_bytes(Direction::Upload, len);
                Ok((part, len, false))
            });
        };
        for item in pending.by_ref().take(window) {
            spawn(&mut tasks, item);
        }
        let mut parts = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let done = match joined {
                Ok(result) => result?,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            parts.push(done);
            if let Some(item) = pending.next() {
                spawn(&mut tasks, item);
            }
        }
        parts.sort_by_key(|(part, _, _)| part.number);
        let whole = parts.iter().fold(0, |acc, (part, len, _)| crc32c::crc32c_combine(acc, part.crc32c, *len as usize));
        let kept_bytes: u64 = parts.iter().filter(|(_, _, kept)| *kept).map(|(_, len, _)| len).sum();
        let kept: Vec<u32> = parts.iter().filter(|(_, _, kept)| *kept).map(|(part, _, _)| part.number).collect();
        let parts: Vec<UploadedPart> = parts.into_iter().map(|(part, _, _)| part).collect();
        let etag = engine
            .retrying(Operation::CompleteMultipart, || {
                engine.store.complete_multipart(key, &upload_id, parts.clone(), whole)
            })
            .await
            .map_err(|error| {
                // What the store was told, to tell a refused whole-object
                // checksum from a refused part.
                let sent = parts.len() - kept.len();
                tracing::warn!(%key, %upload_id, crc32c = whole, sent, ?kept, %error, "the store refused to complete an upload");
                MultipartFailure { error: error.into(), kept_parts: !kept.is_empty() }
            })?;
        Ok((etag, whole, kept_bytes))
    }
    .await;

    match uploaded {
        Ok((etag, whole, kept_bytes)) => {
            run.resume.completed(key, &upload_id);
            if kept_bytes > 0 {
                engine.tally.resumed(kept_bytes);
                engine.metrics.resumed(Direction::Upload, kept_bytes);
            }
            Ok((etag, whole))
        }
        Err(failure) => {
            engine.tally.unbytes(uploaded_bytes.load(std::sync::atomic::Ordering::Relaxed));
            let aborted =
                engine.retrying(Operation::AbortMultipart, || engine.store.abort_multipart(key, &upload_id)).await;
            match aborted {
                Ok(()) => run.resume.aborted(key, &upload_id),
                Err(abort_error) => {
                    tracing::warn!(%key, upload_id = %upload_id, %abort_error, "could not abort the failed multipart upload; the next push tries again");
                }
            }
            Err(failure)
        }
    }
}
