//! The peer port: serves this worker's verified objects to the other
//! workers of its dataset ([`ferry_contract::peers::wire`]).
//!
//! With `--peer-tls` the port speaks only TLS and completes a handshake
//! only with a client whose certificate the DataStage's CA signed
//! ([`super::tls`]). Every request must also carry the dataset's shared
//! secret; anything else is answered 401 before a path is looked at, so a
//! pod outside the dataset learns nothing, not even which keys exist. Only objects the catalog
//! holds (verified and renamed into place) or has landing (the ranges
//! written so far, of those read from the store) are served, at the
//! version asked for.
//! Served bytes are paced by `--peer-serve-bandwidth`. At most
//! [`MAX_CONNECTIONS`] connections are open at once; more are closed as
//! they come, so a flood of connections costs a task and a descriptor
//! each only up to the cap, and the peers refused read from the store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ferry_contract::peers::wire::{
    OBJECT_PATH, ObjectQuery, PROTOCOL, SECOND_HAND, SPEAKER_HEADER, STATE_PATH, Speaker, TAKEN_OVER, WAIT_MAX_OBJECTS,
    WAIT_PATH, WAIT_SECONDS, WaitRequest,
};
use futures::StreamExt as _;
use std::os::unix::fs::FileExt as _;

use super::Fleet;
use super::catalog::Holding;
use super::permitted::Permitted;
use super::tls::TlsListener;

/// Bytes read from disk per chunk of a response.
const CHUNK: usize = 256 * 1024;

/// Connections the peer port holds open at once. A fleet's peers keep a
/// few each (their clients pool them); a fleet of 256 nodes with two each
/// stays below it.
pub const MAX_CONNECTIONS: usize = 512;

/// The peer port without TLS, capped as [`TlsListener`] is.
struct CappedTcp {
    tcp: tokio::net::TcpListener,
    open: Arc<tokio::sync::Semaphore>,
    refused: Arc<Fleet>,
}

impl axum::serve::Listener for CappedTcp {
    type Io = Permitted<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, from) = match self.tcp.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "peer port: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            match Arc::clone(&self.open).try_acquire_owned() {
                Ok(permit) => return (Permitted::new(stream, permit), from),
                Err(_) => {
                    tracing::debug!(%from, "peer port: too many connections open; closing this one");
                    self.refused.refused();
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

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
    serve_capped(fleet, addr, shutdown, MAX_CONNECTIONS).await
}

/// [`serve`] with at most `cap` connections open at once.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve_capped(
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    cap: usize,
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
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&fleet), authorized));
    let tls = fleet.tls.as_ref().map(|tls| Arc::clone(&tls.server));
    let app = app.with_state(fleet.clone());
    let open = Arc::new(tokio::sync::Semaphore::new(cap));
    match tls {
        Some(config) => {
            let refused = Arc::clone(&fleet);
            let listener = TlsListener::new(listener, config, open, move |_| refused.refused())?;
            spawn_serving(listener, app, shutdown);
        }
        None => spawn_serving(CappedTcp { tcp: listener, open, refused: Arc::clone(&fleet) }, app, shutdown),
    }
    Ok(bound)
}

/// Serves `app` on `listener` in a task of its own until `shutdown`.
fn spawn_serving<L>(listener: L, app: axum::Router, shutdown: impl std::future::Future<Output = ()> + Send + 'static)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(%error, "peer server stopped");
        }
    });
}

/// Lets through only requests that carry the dataset's secret and speak
/// this protocol version, and notes who asked (see [`Speaker`]).
async fn authorized(
    State(fleet): State<Arc<Fleet>>,
    mut request: axum::extract::Request,
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
            // Handlers that need to know who asked read it from here.
            request.extensions_mut().insert(asker);
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

async fn wait(
    State(fleet): State<Arc<Fleet>>,
    axum::Extension(asker): axum::Extension<Speaker>,
    axum::Json(request): axum::Json<WaitRequest>,
) -> Response {
    if request.objects.len() > WAIT_MAX_OBJECTS {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    // A worker that joined takes over what this one has not started.
    if let Some(answer) = fleet.hand_over(&asker.name, &request.objects) {
        return axum::Json(answer).into_response();
    }
    let _open = fleet.metrics.peer_wait_open();
    let patience = Duration::from_secs(WAIT_SECONDS);
    axum::Json(fleet.catalog.wait_for_any(&request.objects, patience).await).into_response()
}

async fn object(
    State(fleet): State<Arc<Fleet>>,
    axum::Extension(asker): axum::Extension<Speaker>,
    Query(query): Query<ObjectQuery>,
    headers: HeaderMap,
) -> Response {
    // Of an object landing, what is not written yet is sent as it is: the
    // body follows the writer (see `Following`).
    // A block of a large object is asked for as soon as the asker starts
    // it, perhaps before this worker has: wait for it to start, as long as
    // a peer may make no progress.
    let deadline = tokio::time::Instant::now() + fleet.timeout;
    let mut changes = fleet.catalog.changes();
    let holding = loop {
        match fleet.catalog.holding(&query.key, &query.etag) {
            Holding::NotYet => {
                if !matches!(tokio::time::timeout_at(deadline, changes.changed()).await, Ok(Ok(()))) {
                    return StatusCode::NOT_FOUND.into_response();
                }
            }
            holding => break holding,
        }
    };
    let (file, size, landing) = match holding {
        Holding::Held(held) => match tokio::task::spawn_blocking(move || std::fs::File::open(held.path)).await {
            Ok(Ok(file)) => (Arc::new(file), held.size, None),
            // Removed or replaced since: the asker reads the store.
            _ => return StatusCode::NOT_FOUND.into_response(),
        },
        Holding::Landing(landing) => (Arc::clone(&landing.file), landing.size, Some(landing)),
        // It ended without it, or holds another version.
        Holding::NotYet | Holding::Never => return StatusCode::NOT_FOUND.into_response(),
    };
    let range = match headers.get(header::RANGE).map(|v| v.to_str().ok().and_then(|v| parse_range(v, size))) {
        None => None,
        Some(Some(range)) => Some(range),
        Some(None) => return StatusCode::RANGE_NOT_SATISFIABLE.into_response(),
    };
    let (start, end) = range.unwrap_or((0, size));
    // A block of an object landing that is not written yet, asked for by a
    // worker that joined the fleet: it takes it over if this worker reads
    // it from the store and has not started it (see `handover`).
    if let Some(landing) = landing.as_ref().filter(|_| range.is_some() && start < end)
        && landing.written_until(start) == start
        && fleet.hand_over_block(&asker.name, &query.key, start)
    {
        return StatusCode::from_u16(TAKEN_OVER).expect("a valid status").into_response();
    }
    let landing = landing.is_some();
    // Only ranges are ever read from a peer while landing (a block of a
    // large object); a whole object's request is answered at once and its
    // body follows the writer, however long the store keeps it waiting.
    if landing && range.is_some() && start < end {
        match first_byte_landed(&fleet, &query, &file, start..end, deadline).await {
            FirstByte::FromTheStore => {}
            FirstByte::FromAPeer => return StatusCode::from_u16(SECOND_HAND).expect("a valid status").into_response(),
            FirstByte::NotInTime => return StatusCode::NOT_FOUND.into_response(),
        }
    }
    let following = Following { fleet, query, file, landing, offset: start, end, changes: None };
    let body = futures::stream::unfold(following, |mut following| async move {
        match following.next_chunk().await {
            Ok(None) => None,
            Ok(Some(chunk)) => Some((Ok(chunk), following)),
            Err(error) => {
                following.offset = following.end;
                Some((Err(error), following))
            }
        }
    })
    .boxed();
    let status = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, (end - start).into());
    if range.is_some()
        && let Ok(value) = format!("bytes {start}-{}/{size}", end.saturating_sub(1)).parse()
    {
        headers.insert(header::CONTENT_RANGE, value);
    }
    response
}

/// Where the bytes asked for of an object landing come from.
enum FirstByte {
    /// The store, as far as this worker knows when the first is written
    /// (or the object is in place now, verified): they are served.
    FromTheStore,
    /// Some from another peer: not passed on ([`SECOND_HAND`]).
    FromAPeer,
    /// The first was not written by the deadline.
    NotInTime,
}

/// Waits until the first byte of `range` of `file`, landing as version
/// `query.etag` of `query.key`, is written, and says where the range comes
/// from. Only then is the source of its first byte known: this worker
/// marks a range read from a peer before asking for it, so before its
/// first byte lands. Waiting here never closes a circle: a range comes
/// from a peer only before this worker in the order every worker shares
/// ([`ferry_contract::PeerGroup::block_sources`]).
async fn first_byte_landed(
    fleet: &Fleet,
    query: &ObjectQuery,
    file: &Arc<std::fs::File>,
    range: std::ops::Range<u64>,
    deadline: tokio::time::Instant,
) -> FirstByte {
    let mut changes = fleet.catalog.changes();
    loop {
        changes.borrow_and_update();
        match fleet.catalog.holding(&query.key, &query.etag) {
            Holding::Landing(landing) if Arc::ptr_eq(&landing.file, file) => {
                if landing.written_until(range.start) > range.start {
                    // The whole range: a piece resumed from an earlier run
                    // is not marked, and the rest of its block may be.
                    let own_until = fleet.catalog.from_the_store_until(&query.key, file, range.start, range.end);
                    return if own_until < range.end { FirstByte::FromAPeer } else { FirstByte::FromTheStore };
                }
            }
            // Verified and in place: whatever its source, it is the store's.
            Holding::Held(_) => return FirstByte::FromTheStore,
            // Abandoned, or landing anew: the body says so (see `Following`).
            _ => return FirstByte::FromTheStore,
        }
        if !matches!(tokio::time::timeout_at(deadline, changes.changed()).await, Ok(Ok(()))) {
            return FirstByte::NotInTime;
        }
    }
}

/// The body of an object response: `offset..end` of `file`, a chunk at a
/// time. Of an object landing, each chunk is sent once written (bytes this
/// worker reads from a peer, once the object is verified): the stream
/// waits for the writer, up to the peer timeout per chunk, and ends with an
/// error if the landing is abandoned (the asker then reads the store). Once
/// the object is committed, the rest is read from the same file, renamed.
struct Following {
    fleet: Arc<Fleet>,
    query: ObjectQuery,
    file: Arc<std::fs::File>,
    /// Still landing when last looked at.
    landing: bool,
    offset: u64,
    end: u64,
    changes: Option<tokio::sync::watch::Receiver<u64>>,
}

impl Following {
    async fn next_chunk(&mut self) -> std::io::Result<Option<bytes::Bytes>> {
        if self.offset >= self.end {
            return Ok(None);
        }
        let readable_until = loop {
            if !self.landing {
                break self.end;
            }
            // Subscribed before looking, so no write is missed.
            let changes = self.changes.get_or_insert_with(|| self.fleet.catalog.changes());
            changes.borrow_and_update();
            match self.fleet.catalog.holding(&self.query.key, &self.query.etag) {
                Holding::Held(_) => self.landing = false,
                Holding::Landing(landing) if Arc::ptr_eq(&landing.file, &self.file) => {
                    let written = landing.written_until(self.offset).min(self.end);
                    // Bytes this worker reads from a peer are passed on
                    // once verified (it may start reading part of the
                    // range from one after this request was answered).
                    let (key, file) = (&self.query.key, &self.file);
                    let until = self.fleet.catalog.from_the_store_until(key, file, self.offset, written);
                    if until > self.offset {
                        break until;
                    }
                    let patience = self.fleet.timeout;
                    if !matches!(tokio::time::timeout(patience, changes.changed()).await, Ok(Ok(()))) {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the object being fetched made no progress",
                        ));
                    }
                }
                // Committed, and not yet recorded as held: a moment.
                Holding::NotYet => {
                    let patience = self.fleet.timeout;
                    if !matches!(tokio::time::timeout(patience, changes.changed()).await, Ok(Ok(()))) {
                        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the object was never held"));
                    }
                }
                // Landing anew (its bytes did not match) or never to be.
                _ => return Err(std::io::Error::other("the object being fetched was abandoned")),
            }
        };
        let len = CHUNK.min((readable_until - self.offset) as usize);
        let (file, offset) = (Arc::clone(&self.file), self.offset);
        let chunk = tokio::task::spawn_blocking(move || {
            let mut chunk = vec![0; len];
            let n = file.read_at(&mut chunk, offset)?;
            chunk.truncate(n);
            Ok::<_, std::io::Error>(chunk)
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined)))?;
        if chunk.is_empty() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.offset += chunk.len() as u64;
        self.fleet.serving(chunk.len() as u64).await;
        Ok(Some(bytes::Bytes::from(chunk)))
    }
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
