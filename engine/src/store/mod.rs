//! The stager's own view of object storage.
//!
//! The transfer engine speaks only to [`ObjectStore`]: list a prefix page by
//! page, read a whole object or a byte range, write an object in one request
//! or as a multipart upload, and find what an interrupted multipart upload
//! left (its parts, the uploads still pending under a prefix) so a push can
//! resume it or abort it. Errors are semantic ([`StoreError`]) so that the
//! retry policy, the exit message and the metrics never look at a
//! backend-specific type. Backends (S3 today) live in submodules and keep
//! their SDK types to themselves.
//!
//! This module is not a general-purpose object-store abstraction: it offers
//! exactly the operations a bulk copy needs.

pub mod gcs;
#[cfg(test)]
pub mod memory;
pub mod s3;
#[cfg(test)]
pub mod synthetic;

use std::fmt;
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_contract::summary::VerifiedKind;
use futures::stream::BoxStream;

/// What an object store tells us about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The full key, including the listed prefix.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The entity tag, without surrounding quotes.
    pub etag: Option<String>,
    /// Last modification time, when the store reports it.
    pub last_modified: Option<SystemTime>,
}

/// A whole-object checksum the store keeps and can be verified against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredChecksum {
    /// CRC64NVME of the whole object (S3's default for new uploads).
    Crc64Nvme(u64),
    /// CRC32C (Castagnoli) of the whole object.
    Crc32c(u32),
    /// CRC32 (IEEE) of the whole object.
    Crc32(u32),
    /// MD5 of the whole object, known from the ETag of a single-part upload.
    Md5([u8; 16]),
    /// SHA-1 of a single-part object.
    Sha1([u8; 20]),
    /// SHA-256 of a single-part object.
    Sha256([u8; 32]),
}

impl StoredChecksum {
    /// What verifying against it counts as in the summary.
    pub fn kind(&self) -> VerifiedKind {
        match self {
            StoredChecksum::Crc64Nvme(_) => VerifiedKind::Crc64nvme,
            StoredChecksum::Crc32c(_) => VerifiedKind::Crc32c,
            StoredChecksum::Crc32(_) => VerifiedKind::Crc32,
            StoredChecksum::Md5(_) => VerifiedKind::Md5,
            StoredChecksum::Sha1(_) | StoredChecksum::Sha256(_) => VerifiedKind::Sha,
        }
    }

    /// The short name used in logs and summaries.
    pub fn algorithm(&self) -> &'static str {
        match self {
            StoredChecksum::Crc64Nvme(_) => "crc64nvme",
            StoredChecksum::Crc32c(_) => "crc32c",
            StoredChecksum::Crc32(_) => "crc32",
            StoredChecksum::Md5(_) => "md5",
            StoredChecksum::Sha1(_) => "sha1",
            StoredChecksum::Sha256(_) => "sha256",
        }
    }

    /// Whether it can be computed range by range as bytes stream past and
    /// combined (the CRCs); the others are hashed over the bytes in order.
    pub fn is_combinable(&self) -> bool {
        matches!(self, StoredChecksum::Crc64Nvme(_) | StoredChecksum::Crc32c(_) | StoredChecksum::Crc32(_))
    }
}

impl fmt::Display for StoredChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let algorithm = self.algorithm();
        match self {
            StoredChecksum::Crc64Nvme(v) => write!(f, "{algorithm}:{v:016x}"),
            StoredChecksum::Crc32c(v) | StoredChecksum::Crc32(v) => write!(f, "{algorithm}:{v:08x}"),
            StoredChecksum::Md5(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
            StoredChecksum::Sha1(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
            StoredChecksum::Sha256(d) => write!(f, "{algorithm}:{}", hex::encode(d)),
        }
    }
}

/// The hash a multipart object's per-part checksums are taken with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartAlgorithm {
    /// CRC32C per part (a composite checksum).
    Crc32c,
    /// CRC32 per part (a composite checksum).
    Crc32,
    /// SHA-1 per part (a composite checksum).
    Sha1,
    /// SHA-256 per part (a composite checksum).
    Sha256,
    /// MD5 per part: the multipart ETag.
    Md5,
}

impl PartAlgorithm {
    /// The short name used in logs.
    pub fn name(&self) -> &'static str {
        match self {
            PartAlgorithm::Crc32c => "crc32c",
            PartAlgorithm::Crc32 => "crc32",
            PartAlgorithm::Sha1 => "sha1",
            PartAlgorithm::Sha256 => "sha256",
            PartAlgorithm::Md5 => "md5",
        }
    }
}

/// A checksum of a multipart object's per-part checksums: S3's composite
/// checksums (`x-amz-checksum-crc32c: <base64>-N`) and multipart ETags
/// (`<hex md5>-N`). Verifying one needs the part boundaries, which only the
/// store knows ([`ObjectStore::part_size`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartsChecksum {
    /// How each part, and then the list of part checksums, is hashed.
    pub algorithm: PartAlgorithm,
    /// The hash of the concatenated part checksums (big-endian for CRCs).
    pub digest: Vec<u8>,
    /// How many parts the object was uploaded in.
    pub parts: u32,
}

impl fmt::Display for PartsChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}-{}", self.algorithm.name(), hex::encode(&self.digest), self.parts)
    }
}

/// What an object can be verified against, best first when a store offers
/// several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Integrity {
    /// A checksum of the whole object.
    Whole(StoredChecksum),
    /// A checksum of per-part checksums.
    Parts(PartsChecksum),
}

impl Integrity {
    /// What verifying against it counts as in the summary.
    pub fn kind(&self) -> VerifiedKind {
        match self {
            Integrity::Whole(checksum) => checksum.kind(),
            Integrity::Parts(PartsChecksum { algorithm: PartAlgorithm::Md5, .. }) => VerifiedKind::EtagMultipart,
            Integrity::Parts(_) => VerifiedKind::Composite,
        }
    }

    /// The whole-object checksum, if it is one.
    pub fn whole(&self) -> Option<&StoredChecksum> {
        match self {
            Integrity::Whole(checksum) => Some(checksum),
            Integrity::Parts(_) => None,
        }
    }
}

impl fmt::Display for Integrity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Integrity::Whole(checksum) => checksum.fmt(f),
            Integrity::Parts(parts) => parts.fmt(f),
        }
    }
}

/// One page of a listing.
#[derive(Debug, Default)]
pub struct ListPage {
    /// Objects in this page, in key order.
    pub objects: Vec<ObjectMeta>,
    /// Token for the next page; `None` on the last page.
    pub next: Option<String>,
}

/// Headers of a GET response, plus its body as a stream of chunks.
pub struct GetResponse {
    /// Number of body bytes the store announced.
    pub content_length: u64,
    /// The object's ETag, without quotes.
    pub etag: Option<String>,
    /// What the object can be verified against, when the store said so
    /// with this response (whole-object reads only).
    pub checksum: Option<Integrity>,
    /// The body. Errors in the stream are already mapped to [`StoreError`].
    pub body: BoxStream<'static, Result<Bytes, StoreError>>,
}

impl fmt::Debug for GetResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetResponse")
            .field("content_length", &self.content_length)
            .field("etag", &self.etag)
            .field("checksum", &self.checksum)
            .finish_non_exhaustive()
    }
}

/// A part that has been uploaded as part of a multipart upload.
#[derive(Clone, Debug)]
pub struct UploadedPart {
    /// 1-based part number.
    pub number: u32,
    /// The part's ETag as returned by the store.
    pub etag: String,
    /// CRC32C of the part.
    pub crc32c: u32,
}

/// Why a request to the store failed, in terms the engine acts on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The bucket does not exist.
    #[error("bucket '{bucket}' does not exist")]
    NoSuchBucket {
        /// The bucket that was named.
        bucket: String,
    },
    /// The object does not exist (any more).
    #[error("object not found")]
    NotFound,
    /// The credentials were refused or lack permission.
    #[error("access denied ({code}): {message}; check the credentials and the bucket policy")]
    AccessDenied {
        /// The store's error code, e.g. `InvalidAccessKeyId`.
        code: String,
        /// The store's message.
        message: String,
    },
    /// No credentials could be found at all.
    #[error("no credentials: {0}")]
    NoCredentials(String),
    /// The object changed between listing and reading (ETag no longer matches).
    #[error("object changed while it was being copied")]
    Changed,
    /// A failure that is worth retrying.
    #[error("{reason}: {detail}")]
    Transient {
        /// The retry category, used for metrics and backoff.
        reason: RetryReason,
        /// What happened.
        detail: String,
    },
    /// The store rejected the request for a reason retrying will not fix.
    #[error("{code}: {message}")]
    Rejected {
        /// The store's error code or HTTP status.
        code: String,
        /// The store's message.
        message: String,
    },
}

impl StoreError {
    /// The retry category of this error, or `None` when retrying cannot help.
    pub fn retry_reason(&self) -> Option<RetryReason> {
        match self {
            StoreError::Transient { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// A CamelCase name of what went wrong, for status conditions: the
    /// operator shows it as the reason a DataStage failed.
    pub fn reason(&self) -> ferry_contract::Reason {
        use ferry_contract::Reason;
        match self {
            StoreError::NoSuchBucket { .. } => Reason::BucketNotFound,
            StoreError::NotFound => Reason::ObjectNotFound,
            StoreError::AccessDenied { .. } => Reason::AccessDenied,
            StoreError::NoCredentials(_) => Reason::NoCredentials,
            StoreError::Changed => Reason::ObjectChanged,
            StoreError::Transient { reason: RetryReason::Connection | RetryReason::Timeout, .. } => {
                Reason::EndpointUnreachable
            }
            StoreError::Transient { reason: RetryReason::ChecksumMismatch, .. } => Reason::ChecksumMismatch,
            StoreError::Transient { .. } => Reason::StoreUnavailable,
            StoreError::Rejected { .. } => Reason::StoreRejected,
        }
    }

    /// Whether running again without a change (credentials, bucket, spec)
    /// cannot succeed, so a supervisor should not retry.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            StoreError::NoSuchBucket { .. }
                | StoreError::AccessDenied { .. }
                | StoreError::NoCredentials(_)
                | StoreError::Rejected { .. }
        )
    }

    /// A transient error of the given category.
    pub fn transient(reason: RetryReason, detail: impl fmt::Display) -> Self {
        StoreError::Transient { reason, detail: detail.to_string() }
    }
}

/// Categories of retryable failure; label values of `ferry_stager_retries_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// The store asked us to slow down (503 SlowDown, 429).
    Throttled,
    /// A 5xx response.
    ServerError,
    /// A request or a body stalled past its timeout.
    Timeout,
    /// Connecting failed or the connection was reset.
    Connection,
    /// The body ended before the announced length.
    TruncatedBody,
    /// The downloaded bytes did not match the store's checksum.
    ChecksumMismatch,
}

impl RetryReason {
    /// All reasons, for pre-registering metric series.
    pub const ALL: [RetryReason; 6] = [
        RetryReason::Throttled,
        RetryReason::ServerError,
        RetryReason::Timeout,
        RetryReason::Connection,
        RetryReason::TruncatedBody,
        RetryReason::ChecksumMismatch,
    ];

    /// The metric label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            RetryReason::Throttled => "throttled",
            RetryReason::ServerError => "server_error",
            RetryReason::Timeout => "timeout",
            RetryReason::Connection => "connection",
            RetryReason::TruncatedBody => "truncated_body",
            RetryReason::ChecksumMismatch => "checksum_mismatch",
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operations a bulk copy needs from an object store.
///
/// Implementations do not retry: the engine owns retries so they are counted,
/// bounded and shared across backends.
#[async_trait]
pub trait ObjectStore: Send + Sync + fmt::Debug {
    /// The bucket, as `scheme://bucket`, for messages.
    fn describe(&self) -> String;

    /// Lists one page of objects whose keys start with `prefix`.
    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError>;

    /// Reads an object's size, ETag and what it can be verified against.
    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError>;

    /// The size of part `number` (1-based) of a multipart object, as it was
    /// uploaded, while its ETag is still `if_match`. Stores without
    /// multipart objects never report a [`PartsChecksum`], so are never asked.
    async fn part_size(&self, key: &str, number: u32, if_match: Option<&str>) -> Result<u64, StoreError> {
        let _ = (key, number, if_match);
        Err(StoreError::Rejected {
            code: "NotImplemented".into(),
            message: format!("{} does not keep multipart objects", self.describe()),
        })
    }

    /// Reads an object, or the byte `range` of it. With `if_match`, the read
    /// fails with [`StoreError::Changed`] when the ETag differs.
    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError>;

    /// The bytes this store returned for `key` did not match its checksum.
    /// A store that routes reads elsewhere (a peer) stops trusting that
    /// source; a plain store has nothing to do.
    fn distrust(&self, key: &str) {
        let _ = key;
    }

    /// Writes a whole object in one request; the store verifies `crc32c`.
    /// Returns the new object's ETag as listings report it, when the store
    /// gave one.
    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError>;

    /// Starts a multipart upload with CRC32C checksums; returns its id.
    async fn create_multipart(&self, key: &str) -> Result<String, StoreError>;

    /// Uploads one part; the store verifies `crc32c`.
    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError>;

    /// Completes a multipart upload; `crc32c` is the whole object's CRC32C.
    /// Returns the new object's ETag as listings report it, when the store
    /// gave one.
    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError>;

    /// Abandons a multipart upload so its parts stop costing storage.
    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError>;

    /// Lists the parts an unfinished multipart upload holds, every page, in
    /// part order, so an interrupted push can keep them.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when the upload no longer exists (completed,
    /// aborted, or expired by a lifecycle rule).
    async fn list_parts(&self, key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError>;

    /// Lists every unfinished multipart upload whose key starts with
    /// `prefix`, every page.
    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError>;
}

/// A part an unfinished multipart upload already holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedPart {
    /// 1-based part number.
    pub number: u32,
    /// Size in bytes.
    pub size: u64,
    /// The part's ETag, without quotes, as completing the upload needs it.
    pub etag: String,
    /// The part's CRC32C, when the store kept one.
    pub crc32c: Option<u32>,
}

/// A multipart upload that was started and neither completed nor aborted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingUpload {
    /// The key the upload writes.
    pub key: String,
    /// The upload's id.
    pub upload_id: String,
    /// When it was started, by the store's clock, when the store says.
    pub initiated: Option<SystemTime>,
}
