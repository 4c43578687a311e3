//! The `object_store` data path (`FERRY_S3_DATA_PATH=object_store`): GET,
//! PUT and UploadPart through the `object_store` crate's S3 client
//! (reqwest on hyper, rustls with aws-lc-rs).
//!
//! It is configured to do what the engine's SDK client does and no more:
//! the bucket URL the SDK's endpoint resolver gives (so addressing is the
//! same), the SDK chain's credentials (bridged through the shared
//! [`CachedCredentials`]), its own retries off (the engine retries and
//! counts), no overall request timeout (a long GET streams for as long as
//! it needs; the engine's stall timeout watches it) and unsigned payloads
//! (a signed one would cost a SHA-256 pass over every byte it sends).
//!
//! What it cannot do, and the engine gets instead:
//! * a CRC32C with a PUT or a part: `object_store` sends only checksums it
//!   computes itself, SHA-256 or CRC64NVME, and none of those here, so the
//!   store does not check uploaded bytes against the engine's CRC32C, and
//!   the SDK starts and completes this path's multipart uploads without a
//!   checksum (a store promised a CRC32C refuses parts without one: MinIO
//!   answers "checksum missing, want CRC32C"). A pull verifies such objects
//!   against their ETags instead (the MD5 of a single PUT, the MD5 of part
//!   MD5s of a multipart upload, which needs a HEAD per part);
//! * the response headers of a GET beyond size and ETag: a connector around
//!   its reqwest client copies the checksum headers into the response's
//!   extensions, which `object_store` hands back with the result, so a
//!   whole-object read is verified against the same checksum as on the
//!   other paths;
//! * keys its `Path` cannot represent (empty, `.` or `..` segments, control
//!   characters, a leading or trailing `/`): refused, not rewritten.
//!
//! If-Match is supported (`GetOptions::if_match`). Its own credential
//! sources (static keys, `AWS_*` environment variables, web identity, ECS
//! and EC2 metadata) are not used: the bridge gives it everything the SDK
//! chain supports, profiles and SSO included.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, HeaderValue, Method};
use object_store::aws::{AmazonS3, AmazonS3Builder, AwsCredential};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::multipart::MultipartStore as _;
use object_store::path::Path;
use object_store::{
    ClientOptions, CredentialProvider, GetOptions, GetRange, ObjectStore as _, PutOptions, PutPayload, RetryConfig,
};

use super::credentials::CachedCredentials;
use super::{
    CHECKSUM_HEADERS, CHECKSUM_MODE_ENABLED, CHECKSUM_MODE_HEADER, ChecksumHeaders, DataPathSetup, GetResponse,
    RetryReason, StoreError, classify_response, integrity, strip_quotes,
};

/// One bucket's data requests through `object_store`.
pub(super) struct ObjectStoreDataPath {
    store: AmazonS3,
    bucket: String,
    request_timeout: Duration,
}

impl std::fmt::Debug for ObjectStoreDataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreDataPath").field("store", &self.store.to_string()).finish_non_exhaustive()
    }
}

impl ObjectStoreDataPath {
    /// A client for the bucket `setup` describes.
    pub(super) fn new(setup: &DataPathSetup<'_>) -> Result<Self, String> {
        let mut default_headers = HeaderMap::new();
        // Signed with every request (object_store signs its default
        // headers): S3 sends a GET's checksum headers only when asked.
        default_headers.insert(CHECKSUM_MODE_HEADER, HeaderValue::from_static(CHECKSUM_MODE_ENABLED));
        let client_options = ClientOptions::new()
            .with_allow_http(setup.bucket_url.starts_with("http://"))
            .with_connect_timeout(setup.options.connect_timeout)
            .with_timeout_disabled()
            .with_default_headers(default_headers);
        let retry = RetryConfig { max_retries: 0, retry_timeout: Duration::ZERO, ..RetryConfig::default() };
        let store = AmazonS3Builder::new()
            .with_bucket_name(setup.bucket)
            .with_region(&setup.region)
            // The URL already names the bucket (in its path or its host),
            // which is what object_store takes a virtual-hosted endpoint for.
            .with_endpoint(&setup.bucket_url)
            .with_virtual_hosted_style_request(true)
            .with_credentials(Arc::new(SdkCredentials(Arc::clone(&setup.credentials))))
            .with_unsigned_payload(true)
            .with_retry(retry)
            .with_client_options(client_options)
            .with_http_connector(ChecksumHeaderTap)
            .build()
            .map_err(|e| crate::error_chain(&e))?;
        Ok(Self { store, bucket: setup.bucket.to_owned(), request_timeout: setup.options.request_timeout })
    }

    /// Reads an object, or a range of it, while its ETag is `if_match`.
    pub(super) async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let path = path(key)?;
        let ranged = range.is_some();
        let options = GetOptions {
            if_match: if_match.map(|etag| format!("\"{etag}\"")),
            range: range.map(GetRange::Bounded),
            ..GetOptions::default()
        };
        let result = self.within_timeout(self.store.get_opts(&path, options)).await?;
        let checksum = if ranged {
            None
        } else {
            result
                .extensions
                .get::<TappedHeaders>()
                .and_then(|tapped| integrity(&ChecksumHeaders::from_headers(&tapped.0)))
        };
        let content_length = result.range.end - result.range.start;
        let etag = result.meta.e_tag.as_deref().map(strip_quotes);
        let body = result.into_stream().map(|chunk| chunk.map_err(body_error)).boxed();
        Ok(GetResponse { content_length, etag, checksum, body })
    }

    /// Writes a whole object (without a checksum the store could check).
    pub(super) async fn put(&self, key: &str, body: Bytes) -> Result<Option<String>, StoreError> {
        let path = path(key)?;
        let result =
            self.within_timeout(self.store.put_opts(&path, PutPayload::from(body), PutOptions::default())).await?;
        Ok(result.e_tag.as_deref().map(strip_quotes))
    }

    /// Uploads part `number` of an upload the SDK started (without a
    /// checksum the store could check).
    pub(super) async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
    ) -> Result<Option<String>, StoreError> {
        let path = path(key)?;
        // object_store numbers parts from 0 and sends index + 1.
        let index = usize::try_from(number.saturating_sub(1)).unwrap_or(usize::MAX);
        let upload_id = upload_id.to_owned();
        let part = self.within_timeout(self.store.put_part(&path, &upload_id, index, PutPayload::from(body))).await?;
        Ok(Some(strip_quotes(&part.content_id)))
    }

    /// Runs a request until its response headers arrive, within the
    /// request timeout, and maps its error.
    async fn within_timeout<T>(&self, request: impl Future<Output = object_store::Result<T>>) -> Result<T, StoreError> {
        tokio::time::timeout(self.request_timeout, request)
            .await
            .map_err(|_| {
                StoreError::transient(RetryReason::Timeout, format!("no response within {:?}", self.request_timeout))
            })?
            .map_err(|e| classify(&e, &self.bucket))
    }
}

/// The key as an object_store path, when it is one unchanged.
fn path(key: &str) -> Result<Path, StoreError> {
    match Path::parse(key) {
        Ok(path) if path.as_ref() == key => Ok(path),
        _ => Err(StoreError::Rejected {
            code: "InvalidKey".into(),
            message: format!("the object_store data path cannot address the key '{key}'"),
        }),
    }
}

/// Maps an `object_store` error to the engine's categories: transport
/// failures by their kind, error responses by their status and the S3 error
/// code in the body it quotes.
fn classify(error: &object_store::Error, bucket: &str) -> StoreError {
    let detail = crate::error_chain(error);
    if let Some(kind) = http_error_kind(error) {
        let reason = match kind {
            HttpErrorKind::Timeout => RetryReason::Timeout,
            HttpErrorKind::Decode => RetryReason::TruncatedBody,
            _ => RetryReason::Connection,
        };
        return StoreError::transient(reason, detail);
    }
    let status = match error {
        object_store::Error::NotFound { .. } => Some(404),
        object_store::Error::Precondition { .. } => Some(412),
        object_store::Error::NotModified { .. } => Some(304),
        object_store::Error::AlreadyExists { .. } => Some(409),
        object_store::Error::PermissionDenied { .. } => Some(403),
        object_store::Error::Unauthenticated { .. } => Some(401),
        _ => quoted_status(&detail),
    };
    match status {
        Some(status) => classify_response(status, &detail, bucket),
        None => StoreError::Rejected { code: "ObjectStore".into(), message: detail },
    }
}

/// The status object_store quotes in its message for an error response
/// ("... status code: 503 Service Unavailable: <body>"); it does not expose
/// the status of a response it has no variant for otherwise.
fn quoted_status(detail: &str) -> Option<u16> {
    let (_, after) = detail.split_once("status code: ")?;
    after.get(..3)?.parse().ok()
}

fn http_error_kind(error: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    crate::causes(error).find_map(|cause| cause.downcast_ref::<HttpError>()).map(HttpError::kind)
}

/// A body that broke off: the connection dropped or stalled mid-body.
fn body_error(error: object_store::Error) -> StoreError {
    let reason = match http_error_kind(&error) {
        Some(HttpErrorKind::Timeout) => RetryReason::Timeout,
        _ => RetryReason::TruncatedBody,
    };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// The SDK chain's credentials, as object_store asks for them (once per
/// request; the cache answers).
#[derive(Debug)]
struct SdkCredentials(Arc<CachedCredentials>);

#[async_trait]
impl CredentialProvider for SdkCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let resolved = self
            .0
            .get()
            .await
            .map_err(|e| object_store::Error::Unauthenticated { path: String::new(), source: Box::new(e) })?;
        let credentials = &resolved.credentials;
        Ok(Arc::new(AwsCredential {
            key_id: credentials.access_key_id().to_owned(),
            secret_key: credentials.secret_access_key().to_owned(),
            token: credentials.session_token().map(str::to_owned),
        }))
    }
}

/// Builds object_store's own reqwest client and wraps it in [`TapService`].
#[derive(Debug)]
struct ChecksumHeaderTap;

impl HttpConnector for ChecksumHeaderTap {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(TapService(ReqwestConnector::default().connect(options)?)))
    }
}

/// The checksum headers of a successful GET, as [`TapService`] keeps them.
#[derive(Clone, Debug)]
struct TappedHeaders(HeaderMap);

/// Copies a successful GET's checksum headers into the response's
/// extensions, which object_store returns with the `GetResult`.
#[derive(Debug)]
struct TapService(HttpClient);

#[async_trait]
impl HttpService for TapService {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let get = request.method() == Method::GET;
        let mut response = self.0.execute(request).await?;
        if get && response.status().is_success() {
            let mut kept = HeaderMap::new();
            for name in CHECKSUM_HEADERS {
                if let Some(value) = response.headers().get(name) {
                    kept.insert(name, value.clone());
                }
            }
            response.extensions_mut().insert(TappedHeaders(kept));
        }
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_object_store_would_rewrite_are_refused() {
        assert!(path("data/file.bin").is_ok());
        assert!(path("names/emoji 🚀 rocket.txt").is_ok());
        for key in ["a//b", "/leading", "trailing/", "a/../b", "a/./b", "bell\u{7}"] {
            assert!(matches!(path(key), Err(StoreError::Rejected { .. })), "{key}");
        }
    }

    #[test]
    fn a_quoted_status_is_found_in_the_message() {
        let detail = "Generic S3 error: Error performing GET http://h/b/k in 1ms - Server returned non-2xx status code: 503 Service Unavailable: <Error><Code>SlowDown</Code></Error>";
        assert_eq!(quoted_status(detail), Some(503));
        assert_eq!(classify_response(503, detail, "b").retry_reason(), Some(RetryReason::Throttled));
        assert_eq!(quoted_status("no status here"), None);
    }
}
