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
use http::{HeaderValue, Method, Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;

use super::answers::{
    CHECKSUM_MODE_ENABLED, CHECKSUM_MODE_HEADER, CRC32C_HEADER, ChecksumHeaders, classify_response, encode_crc,
    integrity,
};
use super::credentials::CachedCredentials;
use crate::http::{
    HttpClient, body_stream, content_length, encode_uri, exchange, header_value, pooled_client, range_header,
    strip_quotes,
};
use crate::{GetResponse, StoreError};

/// What the data path shares with the SDK's view of a bucket,
/// resolved once when the store connects.
pub(super) struct DataPathSetup<'a> {
    pub(super) bucket: &'a str,
    /// The bucket's URL without a trailing slash, as the SDK's endpoint
    /// resolver gives it (path style: `<endpoint>/<bucket>`).
    pub(super) bucket_url: String,
    /// The region requests are signed for.
    pub(super) region: String,
    pub(super) credentials: Arc<CachedCredentials>,
    /// Time allowed to establish a connection.
    pub(super) connect_timeout: std::time::Duration,
    /// Time allowed for one request.
    pub(super) request_timeout: std::time::Duration,
}

/// One bucket's data requests over hyper.
pub(super) struct HyperDataPath {
    client: HttpClient,
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
        let client = pooled_client(setup.connect_timeout, setup.bucket_url.starts_with("http://"))?;
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
            request_timeout: setup.request_timeout,
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
        let content_length = content_length(response.headers());
        Ok(GetResponse { content_length, etag, checksum, body: body_stream(response) })
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

        match exchange(&self.client, request, self.request_timeout, &self.bucket_url).await? {
            Ok(response) => Ok(response),
            Err(failed) => Err(classify_response(failed.status, &failed.body, &self.bucket)),
        }
    }
}

static CHECKSUM_MODE: http::HeaderName = http::HeaderName::from_static(CHECKSUM_MODE_HEADER);
static CHECKSUM_CRC32C: http::HeaderName = http::HeaderName::from_static(CRC32C_HEADER);

fn etag_of<B>(response: &Response<B>) -> Option<String> {
    response.headers().get(http::header::ETAG).and_then(|v| v.to_str().ok()).map(strip_quotes)
}
