//! `ferry-store`: the stager's own view of object storage.
//!
//! The transfer engine speaks only to [`ObjectStore`]: list a prefix page by
//! page, read a whole object or a byte range, write an object in one request
//! or as a multipart upload, and find what an interrupted multipart upload
//! left (its parts, the uploads still pending under a prefix) so a push can
//! resume it or abort it. Errors are semantic ([`StoreError`]) so that the
//! retry policy, the exit message and the metrics never look at a
//! backend-specific type, and what an object is verified against is an
//! [`Integrity`] whatever store keeps it.
//!
//! Each backend lives behind a cargo feature (`s3`, `gcs`, `azure`, `oci`,
//! `hf`) and keeps its
//! SDK types to itself; [`connect()`] builds the one a location's scheme
//! names. The engine depends on this crate without features: on the trait
//! and the integrity types only.
//!
//! This crate is not a general-purpose object-store abstraction: it offers
//! exactly the operations a bulk copy needs.

#[cfg(feature = "azure")]
pub mod azure;
mod connect;
#[cfg(feature = "gcs")]
pub mod gcs;
#[cfg(feature = "hf")]
pub mod hf;
#[cfg(any(feature = "s3", feature = "azure", feature = "oci", feature = "hf"))]
mod http;
pub mod integrity;
#[cfg(feature = "oci")]
pub mod oci;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(any(feature = "s3", feature = "azure"))]
mod xml;

pub use connect::connect;

/// The largest read buffer of one connection of the lean HTTP clients (S3
/// data, Azure Blob, OCI, Hugging Face). A received body chunk is a slice
/// of it and keeps all of it alive, so the engine's budget counts two per
/// request beyond the bytes it holds: those its first and last chunks sit
/// in. hyper's own default lets it grow to about 400 KiB.
pub const READ_BUFFER_MAX: usize = 128 << 10;
pub use integrity::{Integrity, PartAlgorithm, PartsChecksum, StoredChecksum, md5_from_etag};

use std::fmt;
use std::ops::Range;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
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

    /// What tells this store's objects from another's of the same names,
    /// for sharing files between pulls on a node: with the endpoint the
    /// workers reach, the bucket, or for Azure the account and container
    /// (one container name in two accounts holds different blobs, and the
    /// default endpoint does not say which account).
    fn identity(&self) -> String {
        self.describe()
    }

    /// The revision the store's objects are read at, once a listing has
    /// fixed it: the commit of a Hub repository. `None` for stores whose
    /// objects have no common revision.
    fn revision(&self) -> Option<String> {
        None
    }

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

    /// Waits until a read of `range` of version `if_match` of `key` would
    /// not wait on another reader's progress, before the read takes one of
    /// the engine's request slots. A store that routes reads to peers waits
    /// here for a peer to start on a block: a read that waited inside its
    /// slot would hold the slot the peer may be waiting for on this side.
    /// A plain store is ready at once.
    async fn ready(&self, key: &str, range: &Range<u64>, if_match: Option<&str>) {
        let _ = (key, range, if_match);
    }

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
    /// aborted, or expired by a lifecycle rule). A store that keeps no
    /// upload of its own (GCS, Azure) lists no parts instead.
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

/// An error and its sources as one line ("a: b: c"), skipping a source whose
/// text its parent already repeats. Used for exit messages and summaries,
/// where `Debug` dumps would bury the cause.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    for cause in sources(error) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    if line.contains("invalid peer certificate") {
        // rustls names the problem (UnknownIssuer, NotValidForName…) but
        // not the fix, which differs by how the stager was started.
        line.push_str(UNTRUSTED_CERTIFICATE_HINT);
    }
    line
}

/// What an HTTPS store's untrusted certificate adds to its error.
/// Short: a failure's text is cut at 240 bytes in the summary, and the
/// chain before it already takes about 140.
pub const UNTRUSTED_CERTIFICATE_HINT: &str = " (an untrusted CA: set caBundle, or SSL_CERT_FILE for the CLI)";

/// An error's source, then that one's source, and so on.
fn sources<'a>(error: &'a dyn std::error::Error) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(error.source(), |cause| cause.source())
}

/// An error and every error under it: where a client library's error wraps
/// the one that says what happened (a timeout, a checksum failure).
pub fn causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::once(error).chain(sources(error))
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("dispatch failure")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_untrusted_certificate_says_how_to_trust_its_ca() {
        let tls = Outer(std::io::Error::other("invalid peer certificate: UnknownIssuer"));
        let line = super::error_chain(&tls);
        assert!(line.starts_with("dispatch failure: invalid peer certificate: UnknownIssuer"), "{line}");
        assert!(line.ends_with(super::UNTRUSTED_CERTIFICATE_HINT), "{line}");
        let refused = Outer(std::io::Error::other("connection refused"));
        assert_eq!(super::error_chain(&refused), "dispatch failure: connection refused");
    }
}
