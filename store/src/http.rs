//! The HTTP plumbing the lean clients share (the S3 data path, Azure
//! Blob): one pooled hyper 1 client over rustls with the aws-lc-rs provider
//! and the platform's roots, the same stack the AWS SDK runs on, and the
//! one mapping of transport failures to [`StoreError`] categories.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::{RetryReason, StoreError};

/// The most of an error response's body that is read for its code.
const ERROR_BODY_LIMIT: usize = 64 << 10;

/// How long an idle pooled connection is kept (hyper-util's default).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// A pooled client for http and https URLs.
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A pooled client. `plain_http`: the endpoint is `http://`, which needs no
/// TLS roots (MinIO or Azurite in a test, a sidecar), and a minimal image
/// may have none.
pub(crate) fn pooled_client(connect_timeout: Duration, plain_http: bool) -> Result<HttpClient, String> {
    let mut http = HttpConnector::new();
    // hyper-rustls wraps it, and takes the https URLs itself.
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    // The provider the SDK's own client uses, named rather than left to
    // the process default, which is ambiguous when two are compiled in.
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let builder = match HttpsConnectorBuilder::new().with_provider_and_native_roots(provider) {
        Ok(builder) => builder,
        Err(_) if plain_http => HttpsConnectorBuilder::new().with_tls_config(
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        ),
        Err(error) => return Err(format!("no TLS root certificates: {error}")),
    };
    let connector = builder.https_or_http().enable_http1().wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new())
        .http1_max_buf_size(crate::READ_BUFFER_MAX)
        .pool_idle_timeout(POOL_IDLE)
        .pool_timer(TokioTimer::new())
        .build(connector))
}

/// A pooled client for `endpoint`, or why there is none: an endpoint that
/// is no URL, or over https no TLS roots (`InvalidEndpoint`).
pub(crate) fn client_for(endpoint: &str, connect_timeout: Duration) -> Result<HttpClient, StoreError> {
    let invalid = |message: String| StoreError::Rejected { code: "InvalidEndpoint".into(), message };
    let uri: http::Uri = endpoint.parse().map_err(|_| invalid(format!("'{endpoint}' is not a URL")))?;
    pooled_client(connect_timeout, uri.scheme_str() == Some("http")).map_err(invalid)
}

/// That a ranged read got the range it asked for: a 206 whose
/// `Content-Range` starts where asked. A server that does not take a range
/// answers with the whole object (200), which must never reach the engine
/// as the range.
pub(crate) fn check_range(response: &Response<Incoming>, range: &Range<u64>, key: &str) -> Result<(), StoreError> {
    let start = header_text(response.headers(), "content-range")
        .and_then(|r| r.strip_prefix("bytes "))
        .and_then(|r| r.split('-').next())
        .and_then(|s| s.parse::<u64>().ok());
    if response.status().as_u16() == 206 && start == Some(range.start) {
        return Ok(());
    }
    Err(StoreError::transient(
        RetryReason::ServerError,
        format!("asked for {} of '{key}', got HTTP {} without that range", range_header(range), response.status()),
    ))
}

/// Whether a failed response is a redirect to follow.
pub(crate) fn is_redirect(failed: &Failed) -> bool {
    matches!(failed.status, 301 | 302 | 303 | 307 | 308)
}

/// Where the redirect `failed`, the answer to a request for `from`, points:
/// its `Location`, a path taken as on `from`'s host.
pub(crate) fn redirect_target(failed: &Failed, from: &str) -> Result<String, StoreError> {
    let location = header_text(&failed.headers, "location").ok_or_else(|| StoreError::Rejected {
        code: failed.status.to_string(),
        message: format!("a redirect without a Location from {from}"),
    })?;
    Ok(if location.starts_with('/') {
        format!("{}{location}", authority_of(from).unwrap_or_default())
    } else {
        location.to_owned()
    })
}

/// `scheme://host[:port]` of an http(s) URL, lower-cased: what tells one
/// server from another (where credentials may go).
pub(crate) fn authority_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme, "http" | "https") {
        return None;
    }
    let host = rest.split(['/', '?', '#']).next().filter(|h| !h.is_empty())?;
    Some(format!("{}://{}", scheme.to_ascii_lowercase(), host.to_ascii_lowercase()))
}

/// A whole response body within `timeout`, at most `limit` bytes; `what`
/// names it in errors (`a listing`).
pub(crate) async fn read_body(
    response: Response<Incoming>,
    timeout: Duration,
    limit: usize,
    what: &str,
) -> Result<Bytes, StoreError> {
    let collected = tokio::time::timeout(timeout, Limited::new(response.into_body(), limit).collect())
        .await
        .map_err(|_| StoreError::transient(RetryReason::Timeout, format!("{what} stalled past {timeout:?}")))?
        .map_err(|error| match error.downcast::<hyper::Error>() {
            Ok(error) => body_error(*error),
            // Longer than the limit.
            Err(error) => StoreError::transient(RetryReason::TruncatedBody, format!("{what}: {error}")),
        })?;
    Ok(collected.to_bytes())
}

/// A response that is not a success: its status, headers and (the start
/// of) its body, for the backend to classify.
#[derive(Debug)]
pub(crate) struct Failed {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

/// Sends one request within `timeout` (until the response headers); a
/// response that is not a success comes back as [`Failed`].
pub(crate) async fn exchange(
    client: &HttpClient,
    request: Request<Full<Bytes>>,
    timeout: Duration,
    target: &str,
) -> Result<Result<Response<Incoming>, Failed>, StoreError> {
    let response = tokio::time::timeout(timeout, client.request(request))
        .await
        .map_err(|_| {
            StoreError::transient(RetryReason::Timeout, format!("no response within {timeout:?} from {target}"))
        })?
        .map_err(dispatch_error)?;
    if response.status().is_success() {
        return Ok(Ok(response));
    }
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    // An error body is small; one that does not arrive is still an error
    // of this status.
    let body = tokio::time::timeout(timeout, Limited::new(response.into_body(), ERROR_BODY_LIMIT).collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    Ok(Err(Failed { status, headers, body: String::from_utf8_lossy(&body).into_owned() }))
}

/// A response's body as the engine reads it, with failures mid-body mapped.
pub(crate) fn body_stream(response: Response<Incoming>) -> BoxStream<'static, Result<Bytes, StoreError>> {
    response.into_body().into_data_stream().map(|chunk| chunk.map_err(body_error)).boxed()
}

/// The `Content-Length` a response announced, 0 when it announced none.
pub(crate) fn content_length(headers: &HeaderMap) -> u64 {
    headers.get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// A header's value as text, when it has one.
pub(crate) fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A header value, or the request is refused before it is sent.
pub(crate) fn header_value(value: &str) -> Result<HeaderValue, StoreError> {
    HeaderValue::from_str(value).map_err(|_| StoreError::Rejected {
        code: "InvalidRequest".into(),
        message: format!("not a header value: {value}"),
    })
}

/// A request that got no response: the connection failed, or timed out.
pub(crate) fn dispatch_error(error: hyper_util::client::legacy::Error) -> StoreError {
    let reason = if timed_out(&error) { RetryReason::Timeout } else { RetryReason::Connection };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// A body that broke off: the connection dropped or stalled mid-body.
pub(crate) fn body_error(error: hyper::Error) -> StoreError {
    let reason =
        if error.is_timeout() || timed_out(&error) { RetryReason::Timeout } else { RetryReason::TruncatedBody };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// Whether an I/O timeout is among the causes (a connect timeout is one).
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    crate::causes(error)
        .any(|cause| cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut))
}

/// Percent-encodes a key or a query value (RFC 3986 unreserved characters
/// kept; `/` kept in paths), once: keys are never normalised, so `a//b` and
/// `a/../b` stay the keys they are.
pub(crate) fn encode_uri(value: &str, keep_slash: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 16);
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            b'/' if keep_slash => out.push('/'),
            _ => {
                let _ = write!(out, "%{byte:02X}");
            }
        }
    }
    out
}

/// The `Range` header for a half-open byte range.
pub(crate) fn range_header(range: &Range<u64>) -> String {
    format!("bytes={}-{}", range.start, range.end.saturating_sub(1))
}

/// An ETag without its quotes.
pub(crate) fn strip_quotes(etag: &str) -> String {
    etag.trim_matches('"').to_owned()
}
