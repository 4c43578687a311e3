//! The S3 data path: GET, PUT and UploadPart
//! as plain HTTP requests on hyper 1 and hyper-util's pooled client, signed
//! with `aws-sigv4`.
//!
//! It is the same stack the SDK sends its requests on (hyper, hyper-rustls
//! with the aws-lc-rs provider and the platform's roots), without the SDK's
//! orchestrator around each request: no interceptors, no endpoint rules
//! engine per request (the bucket's URL is resolved once, by the SDK's
//! resolver), no output structs, and no checksum of the response body
//! (the engine verifies what it reads itself). Bodies are never signed
//! (UNSIGNED-PAYLOAD): the store checks the engine's CRC32C in
//! `x-amz-checksum-crc32c` instead. GET bodies stream.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings, UriPathNormalizationMode,
    sign,
};
use aws_sigv4::sign::v4;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::credentials::CachedCredentials;
use super::{
    CHECKSUM_MODE_ENABLED, CHECKSUM_MODE_HEADER, CRC32C_HEADER, ChecksumHeaders, DataPathSetup, GetResponse,
    RetryReason, StoreError, classify_response, encode_crc, encode_uri, integrity, range_header, strip_quotes,
};

/// The most of an error response's body that is read for its code.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// How long an idle pooled connection is kept (hyper-util's default).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// One bucket's data requests over hyper.
pub(super) struct HyperDataPath {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    bucket: String,
    /// The bucket's URL, without a trailing slash.
    bucket_url: String,
    region: String,
    credentials: Arc<CachedCredentials>,
    request_timeout: Duration,
    settings: SigningSettings,
}

impl std::fmt::Debug for HyperDataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HyperDataPath")
            .field("bucket_url", &self.bucket_url)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl HyperDataPath {
    /// A pooled client for the bucket `setup` describes.
    pub(super) fn new(setup: &DataPathSetup<'_>) -> Result<Self, String> {
        let mut http = HttpConnector::new();
        // hyper-rustls wraps it, and takes the https URLs itself.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(setup.options.connect_timeout));
        // The provider the SDK's own client uses, named rather than left to
        // the process default, which is ambiguous when two are compiled in.
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let builder = match HttpsConnectorBuilder::new().with_provider_and_native_roots(provider) {
            Ok(builder) => builder,
            // A plain-HTTP endpoint (MinIO in a test, a sidecar) needs no
            // roots, and a minimal image may have none.
            Err(_) if setup.bucket_url.starts_with("http://") => HttpsConnectorBuilder::new().with_tls_config(
                rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| e.to_string())?
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            ),
            Err(error) => return Err(format!("no TLS root certificates: {error}")),
        };
        let connector = builder.https_or_http().enable_http1().wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_timer(TokioTimer::new())
            .build(connector);
        let mut settings = SigningSettings::default();
        // What S3 wants, as the SDK's S3 signer sets it: the key is encoded
        // once and never normalised (`a/../b` and `a//b` are keys), and the
        // payload hash is sent as `x-amz-content-sha256`.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        Ok(Self {
            client,
            bucket: setup.bucket.to_owned(),
            bucket_url: setup.bucket_url.clone(),
            region: setup.region.clone(),
            credentials: Arc::clone(&setup.credentials),
            request_timeout: setup.options.request_timeout,
            settings,
        })
    }

    /// Reads an object, or a range of it, while its ETag is `if_match`.
    pub(super) async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let mut headers = Vec::with_capacity(2);
        match &range {
            Some(range) => headers.push((http::header::RANGE, header_value(&range_header(range))?)),
            // Ask for the object's checksum headers (as the SDK path's
            // checksum mode does); a ranged response's would describe the
            // whole object, so they are not asked for there.
            None => headers.push((CHECKSUM_MODE.clone(), HeaderValue::from_static(CHECKSUM_MODE_ENABLED))),
        }
        if let Some(etag) = if_match {
            headers.push((http::header::IF_MATCH, header_value(&format!("\"{etag}\""))?));
        }
        let response = self.send(Method::GET, self.url(key, None), headers, Bytes::new()).await?;
        let checksum =
            if range.is_some() { None } else { integrity(&ChecksumHeaders::from_headers(response.headers())) };
        let etag = etag_of(&response);
        let content_length = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let body = response.into_body().into_data_stream().map(|chunk| chunk.map_err(body_error)).boxed();
        Ok(GetResponse { content_length, etag, checksum, body })
    }

    /// Writes a whole object; the store checks `crc32c`.
    pub(super) async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        let headers = vec![(CHECKSUM_CRC32C.clone(), header_value(&encode_crc(crc32c))?)];
        let response = self.send(Method::PUT, self.url(key, None), headers, body).await?;
        Ok(etag_of(&response))
    }

    /// Uploads part `number` of an upload; the store checks `crc32c`.
    pub(super) async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        let query = format!("partNumber={number}&uploadId={}", encode_uri(upload_id, false));
        let headers = vec![(CHECKSUM_CRC32C.clone(), header_value(&encode_crc(crc32c))?)];
        let response = self.send(Method::PUT, self.url(key, Some(&query)), headers, body).await?;
        Ok(etag_of(&response))
    }

    fn url(&self, key: &str, query: Option<&str>) -> String {
        let mut url = format!("{}/{}", self.bucket_url, encode_uri(key, true));
        if let Some(query) = query {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// Signs and sends one request; a response that is not a success is
    /// read for its error code and returned as the error.
    async fn send(
        &self,
        method: Method,
        url: String,
        headers: Vec<(http::HeaderName, HeaderValue)>,
        body: Bytes,
    ) -> Result<Response<Incoming>, StoreError> {
        let credentials = self.credentials.get().await?;
        let mut request = Request::builder()
            .method(method)
            .uri(&url)
            .body(Full::new(body))
            .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
        request.headers_mut().extend(headers);
        let params = v4::SigningParams::builder()
            .identity(&credentials.identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(self.settings.clone())
            .build()
            .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
        let params = aws_sigv4::http_request::SigningParams::V4(params);
        let signable = SignableRequest::new(
            request.method().as_str(),
            url.as_str(),
            request.headers().iter().filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?))),
            SignableBody::UnsignedPayload,
        )
        .and_then(|signable| sign(signable, &params))
        .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: crate::error_chain(&e) })?;
        let (instructions, _signature) = signable.into_parts();
        instructions.apply_to_request_http1x(&mut request);

        let response = tokio::time::timeout(self.request_timeout, self.client.request(request))
            .await
            .map_err(|_| {
                StoreError::transient(
                    RetryReason::Timeout,
                    format!("no response within {:?} from {}", self.request_timeout, self.bucket_url),
                )
            })?
            .map_err(dispatch_error)?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        // An error body is small; one that does not arrive is still an
        // error of this status.
        let body =
            tokio::time::timeout(self.request_timeout, Limited::new(response.into_body(), ERROR_BODY_LIMIT).collect())
                .await
                .ok()
                .and_then(Result::ok)
                .map(|collected| collected.to_bytes())
                .unwrap_or_default();
        Err(classify_response(status, &String::from_utf8_lossy(&body), &self.bucket))
    }
}

static CHECKSUM_MODE: http::HeaderName = http::HeaderName::from_static(CHECKSUM_MODE_HEADER);
static CHECKSUM_CRC32C: http::HeaderName = http::HeaderName::from_static(CRC32C_HEADER);

fn header_value(value: &str) -> Result<HeaderValue, StoreError> {
    HeaderValue::from_str(value).map_err(|_| StoreError::Rejected {
        code: "InvalidRequest".into(),
        message: format!("not a header value: {value}"),
    })
}

fn etag_of<B>(response: &Response<B>) -> Option<String> {
    response.headers().get(http::header::ETAG).and_then(|v| v.to_str().ok()).map(strip_quotes)
}

/// A request that got no response: the connection failed, or timed out.
fn dispatch_error(error: hyper_util::client::legacy::Error) -> StoreError {
    let reason = if timed_out(&error) { RetryReason::Timeout } else { RetryReason::Connection };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// A body that broke off: the connection dropped or stalled mid-body.
fn body_error(error: hyper::Error) -> StoreError {
    let reason =
        if error.is_timeout() || timed_out(&error) { RetryReason::Timeout } else { RetryReason::TruncatedBody };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// Whether an I/O timeout is among the causes (a connect timeout is one).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::causes(error)
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut))
}
