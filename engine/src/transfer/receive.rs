//! What every transfer of one object shares, whichever way it goes: why it
//! failed ([`ObjectError`]), the whole object again after a checksum
//! mismatch ([`again_on_mismatch`]), a response body held to the length it
//! announced ([`expect_announced`], [`next_chunk`]), and the received bytes
//! checked against the store's checksum ([`check_received`]). The pull
//! ([`super::pull`]), the in-memory reads and writes ([`super::memory`]) and
//! the push ([`super::push`]) build on it.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;

use super::readback::{self, Received};
use super::tally::{Verified, VerifiedKind};
use super::verify::{RangeDigest, combined_crc};
use super::{Engine, Reason, VerifyMode};
use crate::metrics::Operation;
use crate::store::{Integrity, ObjectMeta, RetryReason, StoreError, StoredChecksum};

/// A checksum mismatch re-downloads the whole object this many times in all.
const MISMATCH_ATTEMPTS: u32 = 3;

/// Why one object could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The local disk failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes do not hash to the store's checksum.
    #[error("checksum mismatch: the store has {expected}, the downloaded bytes have {actual}")]
    Mismatch {
        /// The store's checksum.
        expected: Integrity,
        /// What the bytes hash to.
        actual: Integrity,
    },
    /// The file on disk is not the object's size.
    #[error("size mismatch: the store has {expected} bytes, {actual} were written")]
    Size {
        /// The store's size.
        expected: u64,
        /// The written size.
        actual: u64,
    },
}

impl ObjectError {
    /// Why the object could not be read or written, as the run-level
    /// reasons name it.
    pub fn reason(&self) -> Reason {
        match self {
            ObjectError::Store(error) => error.reason(),
            ObjectError::Mismatch { .. } | ObjectError::Size { .. } => Reason::ChecksumMismatch,
            ObjectError::Io { .. } => Reason::DestinationUnusable,
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io_error(what: &'static str) -> impl FnOnce(std::io::Error) -> Self {
        move |source| ObjectError::Io { what, source }
    }
}

impl super::Retryable for ObjectError {
    fn retry_reason(&self) -> Option<RetryReason> {
        match self {
            ObjectError::Store(e) => e.retry_reason(),
            _ => None,
        }
    }
}

/// Runs `attempt`, the transfer of one whole object, again when its bytes
/// do not hash to the store's checksum: up to [`MISMATCH_ATTEMPTS`] in all,
/// each repeat counted as a retry.
pub(super) async fn again_on_mismatch<T, F, Fut>(engine: &Engine, key: &str, mut attempt: F) -> Result<T, ObjectError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ObjectError>>,
{
    let mut attempts = 1;
    loop {
        match attempt().await {
            Err(ObjectError::Mismatch { expected, actual }) if attempts < MISMATCH_ATTEMPTS => {
                // A store that read these bytes from a peer stops trusting it.
                engine.store.distrust(key);
                tracing::warn!(%key, %expected, %actual, attempt = attempts, "checksum mismatch; downloading again");
                engine.metrics.retry(RetryReason::ChecksumMismatch);
                engine.tally.retried();
                attempts += 1;
            }
            other => return other,
        }
    }
}

/// Checks the received bytes against the object: their size, then (with
/// `--verify checksum`) what the store says they hash to, when it says so.
pub(super) async fn check_received(
    engine: &Engine,
    object: &ObjectMeta,
    received: Received<'_>,
    expected: Option<&Integrity>,
    digests: &[RangeDigest],
    precomputed: Option<Integrity>,
) -> Result<Verified, ObjectError> {
    if engine.config.verify == VerifyMode::None {
        return Ok(Verified::Unverified);
    }
    let size = object.size;
    let actual_size = match received {
        // One fstat of a file just written: no need for a blocking thread.
        Received::File(file) => file.metadata().map_err(ObjectError::io_error("checking the size"))?.len(),
        Received::Memory(chunks) => chunks.iter().map(|c| c.len() as u64).sum(),
    };
    if actual_size != size {
        return Err(ObjectError::Size { expected: size, actual: actual_size });
    }
    let Some(expected) = expected else { return Ok(Verified::As(VerifiedKind::SizeOnly)) };
    let not_computed = |what: &str| ObjectError::Io {
        what: "verifying",
        source: std::io::Error::other(format!("the {what} was not computed")),
    };
    let actual = match expected {
        Integrity::Whole(crc) if crc.is_combinable() => {
            Integrity::Whole(combined_crc(*crc, digests).ok_or_else(|| not_computed("CRC of every range"))?)
        }
        // Hashed behind the download (see `HashBehind`).
        Integrity::Parts(_) | Integrity::Whole(StoredChecksum::Md5(_)) if precomputed.is_some() => {
            precomputed.expect("checked")
        }
        Integrity::Whole(StoredChecksum::Md5(_)) => Integrity::Whole(StoredChecksum::Md5(match received {
            Received::File(file) => engine
                .md5
                .digest(Arc::clone(file), size)
                .await
                .map_err(ObjectError::io_error("reading back for MD5"))?,
            Received::Memory(_) => digests.first().and_then(|d| d.md5).ok_or_else(|| not_computed("MD5"))?,
        })),
        Integrity::Parts(parts) => {
            let layout = part_layout(engine, object, parts.parts).await?;
            readback::digest(&engine.md5, received, expected, &layout)
                .await
                .map_err(ObjectError::io_error("reading back for the part checksums"))?
                .ok_or_else(|| not_computed("part checksum"))?
        }
        Integrity::Whole(_) => readback::digest(&engine.md5, received, expected, &[size])
            .await
            .map_err(ObjectError::io_error("reading back for the checksum"))?
            .ok_or_else(|| not_computed("checksum"))?,
    };
    if actual != *expected {
        return Err(ObjectError::Mismatch { expected: expected.clone(), actual });
    }
    Ok(Verified::As(expected.kind()))
}

/// The sizes of the parts a multipart object was uploaded in, one HEAD with
/// `partNumber` per part (as many at a time as ranges are fetched), each
/// conditional on the listed ETag so a replaced object is noticed.
pub(super) async fn part_layout(engine: &Engine, object: &ObjectMeta, parts: u32) -> Result<Vec<u64>, ObjectError> {
    let key = object.key.as_str();
    let if_match = object.etag.as_deref();
    let sizes: Vec<u64> = futures::stream::iter(1..=parts)
        .map(|number| engine.retrying(Operation::Head, move || engine.store.part_size(key, number, if_match)))
        .buffered(engine.config.concurrency.max(1))
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    let total: u64 = sizes.iter().sum();
    if total != object.size {
        return Err(StoreError::Rejected {
            code: "InconsistentParts".into(),
            message: format!("the parts of '{key}' add up to {total} bytes, the object has {}", object.size),
        }
        .into());
    }
    Ok(sizes)
}

/// A GET must announce the `len` bytes it asked for.
pub(super) fn expect_announced(announced: u64, len: u64) -> Result<(), StoreError> {
    if announced == len {
        return Ok(());
    }
    Err(StoreError::transient(
        RetryReason::TruncatedBody,
        format!("expected {len} bytes, the store announced {announced}"),
    ))
}

/// The next chunk of a response body, `None` at its end. A body that
/// delivers nothing for `stall` fails as a timeout, which is retried.
pub(super) async fn next_chunk(
    body: &mut BoxStream<'static, Result<Bytes, StoreError>>,
    stall: std::time::Duration,
) -> Result<Option<Bytes>, StoreError> {
    match tokio::time::timeout(stall, body.next()).await {
        Err(_) => Err(StoreError::transient(RetryReason::Timeout, format!("no data for {stall:?}"))),
        Ok(chunk) => chunk.transpose(),
    }
}

/// A body that sent more than its announced length.
pub(super) fn more_than_announced() -> StoreError {
    StoreError::transient(RetryReason::TruncatedBody, "more bytes than announced")
}

/// A body that ended after `received` of its `len` announced bytes.
pub(super) fn ended_early(received: u64, len: u64) -> StoreError {
    StoreError::transient(RetryReason::TruncatedBody, format!("body ended after {received} of {len} bytes"))
}
