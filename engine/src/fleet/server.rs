//! The peer port: serves this worker's verified objects to the other
//! workers of its dataset ([`ferry_contract::peers::wire`]).
//!
//! Every request must carry the dataset's shared secret; anything else is
//! answered 401 before a path is looked at, so a pod outside the dataset
//! learns nothing, not even which keys exist. Only files the catalog holds
//! (verified and renamed into place) are served, at the version asked for.
//! Served bytes are paced by `--peer-serve-bandwidth`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ferry_contract::peers::wire::{
    OBJECT_PATH, ObjectQuery, PROTOCOL, SPEAKER_HEADER, STATE_PATH, Speaker, WAIT_MAX_OBJECTS, WAIT_PATH, WAIT_SECONDS,
    WaitRequest,
};
use futures::StreamExt as _;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};

use super::Fleet;
use super::catalog::Holding;

/// Bytes read from disk per chunk of a response.
const CHUNK: usize = 256 * 1024;

/// Starts serving on `addr` until `shutdown` completes (a worker's process
/// serves until it exits: `std::future::pending()`); returns the address
/// bound (a port of 0 picks one).
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // Named on every request this worker sends from now on: a peer that
    // hears from it knows where it serves.
    let _ = fleet.serves_at.set(bound);
    let app = axum::Router::new()
        .route(STATE_PATH, axum::routing::get(state))
        .route(WAIT_PATH, axum::routing::post(wait))
        .route(OBJECT_PATH, axum::routing::get(object))
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&fleet), authorized))
        .with_state(fleet);
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(%error, "peer server stopped");
        }
    });
    Ok(bound)
}

/// Lets through only requests that carry the dataset's secret and speak
/// this protocol version, and notes who asked (see [`Speaker`]).
async fn authorized(
    State(fleet): State<Arc<Fleet>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !presented.is_some_and(|token| same_secret(token.as_bytes(), fleet.token.as_bytes())) {
        fleet.refused();
        return (StatusCode::UNAUTHORIZED, "this port serves only the workers of one DataStage\n").into_response();
    }
    let asker = request.headers().get(SPEAKER_HEADER).and_then(|v| v.to_str().ok()?.parse::<Speaker>().ok());
    let mut response = match asker {
        Some(asker) if asker.compatible() => {
            fleet.asked_by(&asker);
            next.run(request).await
        }
        other => {
            let theirs =
                other.map_or_else(|| "none (a release before versions)".to_owned(), |s| format!("v{}", s.protocol));
            let why = format!(
                "this worker speaks peer protocol v{PROTOCOL}, the asker {theirs}: the workers of one DataStage must run one Ferry release\n"
            );
            (StatusCode::BAD_REQUEST, why).into_response()
        }
    };
    if let Ok(me) = fleet.speaker().to_string().parse() {
        response.headers_mut().insert(SPEAKER_HEADER, me);
    }
    response
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn state(State(fleet): State<Arc<Fleet>>) -> Response {
    axum::Json(fleet.catalog.state()).into_response()
}

async fn wait(State(fleet): State<Arc<Fleet>>, axum::Json(request): axum::Json<WaitRequest>) -> Response {
    if request.objects.len() > WAIT_MAX_OBJECTS {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    let _open = fleet.metrics.peer_wait_open();
    let patience = Duration::from_secs(WAIT_SECONDS);
    axum::Json(fleet.catalog.wait_for_any(&request.objects, patience).await).into_response()
}

async fn object(State(fleet): State<Arc<Fleet>>, Query(query): Query<ObjectQuery>, headers: HeaderMap) -> Response {
    let Holding::Held(held) = fleet.catalog.holding(&query.key, &query.etag) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let range = match headers.get(header::RANGE).map(|v| v.to_str().ok().and_then(|v| parse_range(v, held.size))) {
        None => None,
        Some(Some(range)) => Some(range),
        Some(None) => return StatusCode::RANGE_NOT_SATISFIABLE.into_response(),
    };
    let (start, end) = range.unwrap_or((0, held.size));
    let mut file = match tokio::fs::File::open(&held.path).await {
        Ok(file) => file,
        // Removed or replaced since: the asker reads the store.
        Err(_) => return StatusCode::NOT_FOUND.into_response(),
    };
    if file.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return StatusCode::NOT_FOUND.into_response();
    }
    let remaining = end - start;
    let body = futures::stream::unfold((file, remaining, fleet), |(mut file, remaining, fleet)| async move {
        if remaining == 0 {
            return None;
        }
        let mut chunk = vec![0; CHUNK.min(remaining as usize)];
        match file.read(&mut chunk).await {
            Ok(0) => Some((Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)), (file, 0, fleet))),
            Ok(n) => {
                chunk.truncate(n);
                fleet.serving(n as u64).await;
                Some((Ok(bytes::Bytes::from(chunk)), (file, remaining - n as u64, fleet)))
            }
            Err(error) => Some((Err(error), (file, 0, fleet))),
        }
    })
    .boxed();
    let status = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, remaining.into());
    if let Ok(etag) = format!("\"{}\"", held.etag).parse() {
        headers.insert(header::ETAG, etag);
    }
    if range.is_some()
        && let Ok(value) = format!("bytes {start}-{}/{}", end.saturating_sub(1), held.size).parse()
    {
        headers.insert(header::CONTENT_RANGE, value);
    }
    response
}

/// `bytes=A-B` (inclusive) as a half-open range within `size`.
fn parse_range(value: &str, size: u64) -> Option<(u64, u64)> {
    let (first, last) = value.strip_prefix("bytes=")?.split_once('-')?;
    let first: u64 = first.trim().parse().ok()?;
    let end = match last.trim() {
        "" => size,
        last => last.parse::<u64>().ok()?.saturating_add(1).min(size),
    };
    (first < end).then_some((first, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_read_as_http_writes_them() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=90-200", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"ab", b"abc"));
        assert!(!same_secret(b"", b"abc"));
    }
}
