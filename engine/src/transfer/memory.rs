//! Objects read into memory and written from it, for callers that keep the
//! data themselves (the Python package's `read`, `read_many` and `write`):
//! the same request budget, retries, ranges and verification as a pull or a
//! push, with no local file in between.
//!
//! A read starts with one plain GET. It brings a small object whole, and for
//! every object its size, ETag and whole-object checksum. An object larger
//! than one download range is then fetched as ranges in parallel, each
//! conditional on that ETag, straight into disjoint pieces of one
//! allocation that are joined again without a copy: the caller gets one
//! contiguous buffer, filled once. Each range maps its piece's pages in one
//! call before fetching (`prefault.rs`) instead of a fault per page.
//!
//! A write of up to `multipart_threshold` bytes is one PUT carrying its
//! CRC32C; a larger one is a multipart upload whose parts are slices of the
//! caller's buffer (no copy), or of a file read as they are sent, each with
//! its CRC32C, aborted if any part fails.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use md5::Digest as _;

use super::ranges::{download_range_size, plan_ranges, upload_part_size};
use super::readback::Received;
use super::receive::{
    ObjectError, again_on_mismatch, check_received, ended_early, expect_announced, more_than_announced, next_chunk,
};
use super::tally::Verified;
use super::verify::{Digester, RangeDigest, Wanted};
use super::{Engine, VerifyMode};
use crate::metrics::{Direction, ObjectResult, Operation};
use crate::store::{GetResponse, Integrity, ObjectMeta, StoredChecksum, UploadedPart};

/// Reads the whole object at `key` into one buffer, verified as a pull
/// verifies a file (`verify` of the engine's configuration).
///
/// # Errors
/// The store's error after retries, or a checksum mismatch on every attempt.
pub async fn read(engine: &Arc<Engine>, key: &str) -> Result<Bytes, ObjectError> {
    let read = again_on_mismatch(engine, key, || read_once(engine, key)).await;
    engine.metrics.object(if read.is_ok() { ObjectResult::Transferred } else { ObjectResult::Failed });
    read
}

/// Reads `range` of the object at `key`. A part of an object cannot be
/// checked against a whole-object checksum: only its length is.
///
/// # Errors
/// The store's error after retries.
pub async fn read_range(engine: &Arc<Engine>, key: &str, range: Range<u64>) -> Result<Bytes, ObjectError> {
    let len = range.end.saturating_sub(range.start);
    if len == 0 {
        return Ok(Bytes::new());
    }
    let ranges: Vec<Range<u64>> =
        plan_ranges(len, download_range_size(len, engine.config.part_size, engine.range_spread()))
            .into_iter()
            .map(|r| r.start + range.start..r.end + range.start)
            .collect();
    let (bytes, _) = fetch_into_one_buffer(engine, key, ranges, None, Wanted::default()).await?;
    engine.metrics.object(ObjectResult::Transferred);
    Ok(bytes)
}

/// Writes `data` as the object at `key`, replacing any object there.
/// Returns the new object's ETag, when the store gave one.
///
/// # Errors
/// The store's error after retries.
pub async fn write(engine: &Arc<Engine>, key: &str, data: Bytes) -> Result<Option<String>, ObjectError> {
    write_from(engine, key, data.len() as u64, Source::Memory(data)).await
}

/// Requests one object may have in flight (the budget decides how many
/// actually run).
fn concurrency(engine: &Engine) -> usize {
    engine.config.concurrency.max(1)
}

/// What the first, plain GET of a read found.
enum FirstRead {
    /// The object fitted one range and came whole.
    Whole { object: ObjectMeta, bytes: Bytes, digest: RangeDigest, checksum: Option<Integrity> },
    /// The object is larger: its ranges are fetched next.
    Large { object: ObjectMeta, checksum: Option<Integrity> },
}

async fn read_once(engine: &Arc<Engine>, key: &str) -> Result<Bytes, ObjectError> {
    let first = engine.retrying(Operation::Get, || first_read(engine, key)).await?;
    let (object, bytes, digests, checksum, ranged) = match first {
        FirstRead::Whole { object, bytes, digest, checksum } => (object, bytes, vec![digest], checksum, false),
        FirstRead::Large { object, checksum } => {
            let range_size = download_range_size(object.size, engine.config.part_size, engine.range_spread());
            let wanted = Wanted::for_checksum(checksum.as_ref());
            let if_match = object.etag.clone();
            let ranges = plan_ranges(object.size, range_size);
            let (bytes, digests) = fetch_into_one_buffer(engine, key, ranges, if_match, wanted).await?;
            (object, bytes, digests, checksum, true)
        }
    };
    verify(engine, &object, &bytes, checksum.as_ref(), &digests, ranged).await?;
    Ok(bytes)
}

/// One attempt of the first GET: a small object is read whole; a large one
/// only tells its size, ETag and checksum (its body is dropped unread).
async fn first_read(engine: &Arc<Engine>, key: &str) -> Result<FirstRead, ObjectError> {
    let response = engine.store.get(key, None, None).await?;
    let size = response.content_length;
    let checksum = if engine.config.verify == VerifyMode::Checksum { response.checksum.clone() } else { None };
    let object = ObjectMeta { key: key.to_owned(), size, etag: response.etag.clone(), last_modified: None };
    if size > download_range_size(size, engine.config.part_size, engine.range_spread()) {
        return Ok(FirstRead::Large { object, checksum });
    }
    let wanted = Wanted::for_checksum(checksum.as_ref()).with_md5_for(checksum.as_ref());
    let mut buffer = BytesMut::zeroed(size as usize);
    let digest = stream_into(engine, response, &mut buffer, 0, wanted).await?;
    Ok(FirstRead::Whole { object, bytes: buffer.freeze(), digest, checksum })
}

/// Fetches `ranges` (contiguous, in order) into one buffer, each range into
/// its own piece of it, at most `concurrency` at a time.
async fn fetch_into_one_buffer(
    engine: &Arc<Engine>,
    key: &str,
    ranges: Vec<Range<u64>>,
    if_match: Option<String>,
    wanted: Wanted,
) -> Result<(Bytes, Vec<RangeDigest>), ObjectError> {
    let total: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    let mut rest = BytesMut::zeroed(total as usize);
    let mut pieces = Vec::with_capacity(ranges.len());
    for range in &ranges {
        pieces.push((range.clone(), rest.split_to((range.end - range.start) as usize)));
    }
    let (key, if_match): (Arc<str>, Option<Arc<str>>) = (Arc::from(key), if_match.map(Arc::from));
    let fetched: Vec<(BytesMut, RangeDigest)> = futures::stream::iter(pieces)
        .map(|(range, piece)| {
            let (engine, key, if_match) = (Arc::clone(engine), Arc::clone(&key), if_match.clone());
            // A task per range, so ranges are received on every core.
            tokio::spawn(async move { fetch_range_into(&engine, &key, range, if_match, piece, wanted).await })
        })
        .buffered(concurrency(engine))
        .map(|joined| joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let mut digests = Vec::with_capacity(fetched.len());
    let mut joined: Option<BytesMut> = None;
    for (piece, digest) in fetched {
        digests.push(digest);
        // Pieces split off one allocation, rejoined in order: no copy.
        match &mut joined {
            None => joined = Some(piece),
            Some(buffer) => buffer.unsplit(piece),
        }
    }
    Ok((joined.unwrap_or_default().freeze(), digests))
}

/// Fetches one range into `piece` (exactly its length), with retries.
async fn fetch_range_into(
    engine: &Arc<Engine>,
    key: &str,
    range: Range<u64>,
    if_match: Option<Arc<str>>,
    piece: BytesMut,
    wanted: Wanted,
) -> Result<(BytesMut, RangeDigest), ObjectError> {
    let piece = super::prefault::prefaulted(piece).await;
    // The piece is lent to each attempt and back, so a retry refills it.
    let piece = tokio::sync::Mutex::new(piece);
    let digest = engine
        .retrying(Operation::Get, || async {
            let mut piece = piece.lock().await;
            let response = engine.store.get(key, Some(range.clone()), if_match.as_deref()).await?;
            stream_into(engine, response, &mut piece, range.start, wanted).await
        })
        .await?;
    Ok((piece.into_inner(), digest))
}

/// Streams a response's body into `buffer`, which must be exactly as long as
/// the body; digests what it receives.
async fn stream_into(
    engine: &Engine,
    response: GetResponse,
    buffer: &mut BytesMut,
    offset: u64,
    wanted: Wanted,
) -> Result<RangeDigest, ObjectError> {
    let len = buffer.len() as u64;
    expect_announced(response.content_length, len)?;
    let mut digester = Digester::new(wanted, &engine.tally.verify);
    let mut body = response.body;
    let mut filled = 0usize;
    while let Some(chunk) = next_chunk(&mut body, engine.config.stall_timeout).await? {
        let Some(target) = buffer.get_mut(filled..filled + chunk.len()) else {
            return Err(more_than_announced().into());
        };
        target.copy_from_slice(&chunk);
        digester.update(&chunk);
        filled += chunk.len();
    }
    if filled as u64 != len {
        return Err(ended_early(filled as u64, len).into());
    }
    engine.pace(len).await;
    engine.tally.bytes(len);
    engine.metrics.add_bytes(Direction::Download, len);
    Ok(digester.finish(offset, len))
}

/// Checks the bytes as a pull checks a file. An MD5 of a whole object read
/// in several ranges cannot be combined from theirs: it is taken over the
/// buffer, on a blocking thread.
async fn verify(
    engine: &Engine,
    object: &ObjectMeta,
    bytes: &Bytes,
    expected: Option<&Integrity>,
    digests: &[RangeDigest],
    ranged: bool,
) -> Result<Verified, ObjectError> {
    if let (true, VerifyMode::Checksum, Some(Integrity::Whole(StoredChecksum::Md5(md5)))) =
        (ranged, engine.config.verify, expected)
    {
        let whole = bytes.clone();
        let actual: [u8; 16] =
            tokio::task::spawn_blocking(move || md5::Md5::digest(&whole).into()).await.expect("hashing panicked");
        if actual != *md5 {
            return Err(ObjectError::Mismatch {
                expected: Integrity::Whole(StoredChecksum::Md5(*md5)),
                actual: Integrity::Whole(StoredChecksum::Md5(actual)),
            });
        }
        return Ok(Verified::As(StoredChecksum::Md5(*md5).kind()));
    }
    let chunks = [bytes.clone()];
    check_received(engine, object, Received::Memory(&chunks), expected, digests, None).await
}

/// Where the bytes of a write come from.
#[derive(Clone, Debug)]
enum Source {
    /// The caller's buffer: parts are slices of it.
    Memory(Bytes),
    /// A file: parts are read from it as they are sent, under the engine's
    /// memory budget.
    File(Arc<std::fs::File>),
}

impl Source {
    /// The bytes of `range`, and the memory budget they hold while sent.
    async fn part(
        &self,
        engine: &Engine,
        range: Range<u64>,
    ) -> Result<(Bytes, Option<tokio::sync::OwnedSemaphorePermit>), ObjectError> {
        match self {
            Source::Memory(data) => Ok((data.slice(range.start as usize..range.end as usize), None)),
            Source::File(file) => {
                let len = range.end - range.start;
                let memory = engine.budget.memory(len + super::REQUEST_OVERHEAD).await;
                let file = Arc::clone(file);
                let bytes = tokio::task::spawn_blocking(move || -> std::io::Result<Bytes> {
                    use std::os::unix::fs::FileExt as _;
                    let mut buffer = vec![0; len as usize];
                    file.read_exact_at(&mut buffer, range.start)?;
                    Ok(Bytes::from(buffer))
                })
                .await
                .expect("reading a part panicked")
                .map_err(ObjectError::io_error("reading the file"))?;
                Ok((bytes, Some(memory)))
            }
        }
    }
}

/// Writes the file at `path` as the object at `key`: one PUT when it is
/// small, else a multipart upload whose parts are read as they are sent,
/// so memory stays within the engine's limit whatever the file's size.
/// Returns the new object's ETag, when the store gave one.
///
/// # Errors
/// The file cannot be read, or the store's error after retries.
pub async fn write_file(
    engine: &Arc<Engine>,
    path: &std::path::Path,
    key: &str,
) -> Result<Option<String>, ObjectError> {
    let opened = std::fs::File::open(path).and_then(|file| Ok((file.metadata()?.len(), file)));
    let (size, file) = opened.map_err(ObjectError::io_error("opening the file"))?;
    write_from(engine, key, size, Source::File(Arc::new(file))).await
}

/// Writes `size` bytes from `source`: one PUT up to `multipart_threshold`,
/// else a multipart upload. Counts the object.
async fn write_from(engine: &Arc<Engine>, key: &str, size: u64, source: Source) -> Result<Option<String>, ObjectError> {
    let written = if size <= engine.config.multipart_threshold {
        let (body, _memory) = source.part(engine, 0..size).await?;
        let crc = crc32c::crc32c(&body);
        engine.pace(size).await;
        engine.retrying(Operation::Put, || engine.store.put(key, body.clone(), crc)).await.map_err(ObjectError::from)
    } else {
        write_multipart(engine, key, size, source).await
    };
    match &written {
        Ok(_) => {
            engine.tally.bytes(size);
            engine.metrics.add_bytes(Direction::Upload, size);
            engine.metrics.object(ObjectResult::Transferred);
        }
        Err(_) => engine.metrics.object(ObjectResult::Failed),
    }
    written
}

/// Uploads `size` bytes from `source` in parts, at most `concurrency` at a
/// time; aborts the upload if any part fails.
async fn write_multipart(
    engine: &Arc<Engine>,
    key: &str,
    size: u64,
    source: Source,
) -> Result<Option<String>, ObjectError> {
    let ranges = plan_ranges(size, upload_part_size(size, engine.config.part_size));
    let upload_id: Arc<str> =
        Arc::from(engine.retrying(Operation::CreateMultipart, || engine.store.create_multipart(key)).await?);
    let key_arc: Arc<str> = Arc::from(key);
    let uploaded: Result<Option<String>, ObjectError> = async {
        let mut parts: Vec<(UploadedPart, u64)> = futures::stream::iter(ranges.into_iter().enumerate())
            .map(|(index, range)| {
                let (engine, key, upload_id, source) =
                    (Arc::clone(engine), Arc::clone(&key_arc), Arc::clone(&upload_id), source.clone());
                tokio::spawn(async move {
                    let (body, _memory) = source.part(&engine, range).await?;
                    let len = body.len() as u64;
                    let crc = crc32c::crc32c(&body);
                    let number = index as u32 + 1;
                    engine.pace(len).await;
                    let part = engine
                        .retrying(Operation::UploadPart, || {
                            engine.store.upload_part(&key, &upload_id, number, body.clone(), crc)
                        })
                        .await?;
                    Ok::<_, ObjectError>((part, len))
                })
            })
            .buffer_unordered(concurrency(engine))
            .map(|joined| joined.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<Result<_, _>>()?;
        parts.sort_by_key(|(part, _)| part.number);
        let whole = parts.iter().fold(0, |acc, (part, len)| crc32c::crc32c_combine(acc, part.crc32c, *len as usize));
        let parts: Vec<UploadedPart> = parts.into_iter().map(|(part, _)| part).collect();
        let etag = engine
            .retrying(Operation::CompleteMultipart, || {
                engine.store.complete_multipart(key, &upload_id, parts.clone(), whole)
            })
            .await?;
        Ok(etag)
    }
    .await;
    if uploaded.is_err() {
        let aborted =
            engine.retrying(Operation::AbortMultipart, || engine.store.abort_multipart(key, &upload_id)).await;
        if let Err(abort_error) = aborted {
            tracing::warn!(%key, upload_id = %upload_id, %abort_error, "could not abort the failed multipart upload");
        }
    }
    uploaded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::{Fault, MemoryStore};
    use crate::transfer::Reason;
    use crate::transfer::TransferConfig;

    fn engine(store: Arc<MemoryStore>, config: TransferConfig) -> Arc<Engine> {
        Engine::new(store, config, Arc::new(crate::metrics::Metrics::new())).unwrap()
    }

    fn data(len: usize) -> Bytes {
        (0..len).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>().into()
    }

    fn small_parts() -> TransferConfig {
        TransferConfig { part_size: 1 << 20, multipart_threshold: 1 << 20, concurrency: 4, ..TransferConfig::default() }
    }

    #[tokio::test]
    async fn what_is_written_reads_back_byte_for_byte_small_large_and_empty() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store), small_parts());
        for (key, len) in [("empty", 0), ("small", 1000), ("one-part", 1 << 20), ("ranged", (5 << 20) + 17)] {
            let written = data(len);
            write(&engine, key, written.clone()).await.unwrap();
            let read_back = read(&engine, key).await.unwrap();
            assert_eq!(read_back, written, "{key}");
        }
        let part = read_range(&engine, "ranged", 3..(2 << 20) + 5).await.unwrap();
        assert_eq!(part, data((5 << 20) + 17).slice(3..(2 << 20) + 5));
    }

    #[tokio::test]
    async fn a_large_object_comes_back_as_one_buffer_filled_in_place() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store), small_parts());
        let written = data(9 << 20);
        write(&engine, "big", written.clone()).await.unwrap();
        let read_back = read(&engine, "big").await.unwrap();
        assert_eq!(read_back.len(), written.len());
        assert_eq!(read_back, written);
    }

    #[tokio::test]
    async fn bytes_that_do_not_match_the_stored_checksum_fail_with_checksum_mismatch() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store), small_parts());
        for (key, len) in [("small", 1000usize), ("ranged", 3 << 20)] {
            write(&engine, key, data(len)).await.unwrap();
            // Every GET of the key flips a byte, on every attempt.
            store.fail_gets(key, std::iter::repeat_n(Fault::Corrupt, 100));
            let error = read(&engine, key).await.unwrap_err();
            assert_eq!(error.reason(), Reason::ChecksumMismatch, "{key}: {error}");
        }
    }

    #[tokio::test]
    async fn a_corrupted_or_truncated_range_is_fetched_again_and_the_read_succeeds() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store), small_parts());
        let written = data(3 << 20);
        write(&engine, "ranged", written.clone()).await.unwrap();
        store.fail_gets("ranged", [Fault::Throttle, Fault::Truncate, Fault::Corrupt]);
        assert_eq!(read(&engine, "ranged").await.unwrap(), written);
    }

    #[tokio::test]
    async fn a_file_is_written_in_parts_and_reads_back() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store), small_parts());
        let dir = tempfile::tempdir().unwrap();
        for (name, len) in [("small", 10usize), ("parts", (3 << 20) + 1)] {
            let path = dir.path().join(name);
            std::fs::write(&path, data(len)).unwrap();
            write_file(&engine, &path, name).await.unwrap();
            assert_eq!(read(&engine, name).await.unwrap(), data(len), "{name}");
        }
        assert_eq!(store.calls().completes, 1);
        let error = write_file(&engine, &dir.path().join("absent"), "absent").await.unwrap_err();
        assert_eq!(error.reason(), Reason::DestinationUnusable, "{error}");
    }

    #[tokio::test]
    async fn a_missing_object_says_so() {
        let store = Arc::new(MemoryStore::default());
        let engine = engine(store, small_parts());
        let error = read(&engine, "nothing-here").await.unwrap_err();
        assert_eq!(error.reason(), Reason::ObjectNotFound, "{error}");
    }
}
