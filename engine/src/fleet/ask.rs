//! The asking side of fleet staging: one worker's requests to its peers.
//!
//! Waits for objects a peer holds or is landing ([`Fleet::await_ready`],
//! one long poll per peer however many objects are waited for), requests
//! for their bytes ([`Fleet::fetch`], read through
//! [`super::PeerStore`]), and a finished worker's polls of its peers'
//! state while it lingers to serve them ([`Fleet::linger`]). Every answer,
//! silence and refusal is reported to the peers' health
//! ([`super::health`]), which decides whether a peer is still asked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use ferry_contract::peers::wire::{
    OBJECT_PATH, ObjectQuery, PROTOCOL, PeerState, SECOND_HAND, SPEAKER_HEADER, STATE_PATH, Speaker, TAKEN_OVER,
    WAIT_PATH, WAIT_SECONDS, WaitAnswer, WaitRequest,
};
use tokio::time::Instant;

use super::{Fleet, tls};
use crate::metrics::PeerFailure;

/// How one wait request to a peer went.
enum Asked {
    /// It answered (and is making progress).
    Answer(WaitAnswer),
    /// Nothing listens at its address yet: ask again shortly.
    Again,
    /// It was dropped.
    Dropped,
}

/// What a peer's state endpoint said.
enum Heard {
    /// Its state.
    State(PeerState),
    /// Nothing listens at its address.
    Closed,
    /// No usable answer (a timeout, an error status, no address yet).
    Nothing,
}

/// Whether a peer answered with success; if not, how its failure counts and why.
fn answered_ok(response: &reqwest::Response) -> Result<(), (PeerFailure, String)> {
    let status = response.status();
    if status.is_success() {
        return Ok(());
    }
    let server = response.headers().get(SPEAKER_HEADER).and_then(|v| v.to_str().ok()?.parse::<Speaker>().ok());
    match server {
        Some(server) if !server.compatible() => Err((
            PeerFailure::Refused,
            format!(
                "it speaks peer protocol v{}, this worker v{PROTOCOL}: the workers of one DataStage must run one Ferry release",
                server.protocol
            ),
        )),
        _ if status == reqwest::StatusCode::UNAUTHORIZED => {
            Err((PeerFailure::Refused, "it refused this worker's secret (401)".to_owned()))
        }
        _ => Err((PeerFailure::Unreachable, format!("it answered {status}"))),
    }
}

/// Whether a request failed because nothing listens at the peer's address
/// (yet, or any more), rather than because it refused this worker: a TLS
/// handshake that failed is a refusal, which asking again will not mend.
fn nothing_listens(error: &reqwest::Error) -> bool {
    error.is_connect() && !tls::is_tls_failure(error)
}

/// How a request that got no answer counts, and why.
fn unanswered(error: &reqwest::Error) -> (PeerFailure, String) {
    if tls::is_tls_failure(error) {
        let why = format!(
            "the TLS handshake failed ({error:#}): the workers of one DataStage must hold certificates of its CA"
        );
        (PeerFailure::Refused, why)
    } else {
        (PeerFailure::Unreachable, error.to_string())
    }
}

/// How soon a peer whose port refused a connection is asked again.
const CONNECT_RETRY: Duration = Duration::from_millis(250);

/// What a peer answered a request for bytes.
#[derive(Debug)]
pub(crate) enum PeerAnswer<T> {
    /// The bytes.
    Bytes(T),
    /// It reads them from another peer itself ([`SECOND_HAND`]): read them
    /// from the next source.
    Elsewhere,
    /// The asker, a worker that joined, takes this block over
    /// ([`TAKEN_OVER`]): it reads it from the store, and nobody else.
    TakenOver,
}

impl Fleet {
    /// Waits until the owner of `key` (at `relative_key` below the prefix)
    /// holds version `etag`, or, where this worker bypassed the owner, a
    /// peer that stands in for it (([`sources`](ferry_contract::peers::PeerGroup::sources))); returns whether
    /// one does, so the object is read from it. `false`: read it from the
    /// store (this worker owns it, the peer asked will not have it, or
    /// every peer it could ask was bypassed).
    pub async fn await_ready(self: &Arc<Self>, relative_key: &str, key: &str, etag: &str) -> bool {
        // One of its own that a joiner took over: from the joiner alone.
        let joiner = self.lock_handover().taken_by(key).map(str::to_owned);
        let sources = match &joiner {
            Some(joiner) => vec![joiner.as_str()],
            None => self.owners.sources(relative_key, &self.me),
        };
        for peer in sources {
            if self.health.is_dropped(peer) {
                continue;
            }
            let (told, start_asking) = self.waits.add(peer, key, etag);
            if start_asking {
                tokio::spawn(Arc::clone(self).ask(peer.to_owned()));
            }
            // A sender dropped unanswered (the runtime shutting down): the store.
            if told.await.unwrap_or(false) {
                return true;
            }
            // Told it never will while it runs on: the store. Bypassed
            // meanwhile: the next source.
            if !self.health.is_dropped(peer) {
                return false;
            }
        }
        false
    }

    /// Asks `peer` about the objects waited for from it until nobody waits,
    /// or it is dropped (then everyone waiting for it reads the store).
    async fn ask(self: Arc<Self>, peer: String) {
        while let Some(request) = self.waits.next_request(&peer) {
            if self.health.is_dropped(&peer) {
                break;
            }
            match self.ask_once(&peer, &request).await {
                Asked::Answer(answer) => {
                    let object = |index: &u32| request.objects.get(*index as usize);
                    // Recorded before any waiter is told, under one lock.
                    // Objects landing are read from the peer as they land.
                    let from_peer: Vec<&ObjectQuery> =
                        answer.held.iter().chain(&answer.landing).filter_map(object).collect();
                    self.ready
                        .lock()
                        .expect("ready lock poisoned")
                        .extend(from_peer.iter().map(|held| (held.key.clone(), peer.clone())));
                    for held in from_peer {
                        self.waits.settle(&peer, &held.key, true);
                    }
                    // Taken over: this worker reads it from the store,
                    // and the peer reads it from this one.
                    for never in answer.never.iter().chain(&answer.taken_over).filter_map(object) {
                        self.waits.settle(&peer, &never.key, false);
                    }
                }
                Asked::Again => tokio::time::sleep(CONNECT_RETRY).await,
                Asked::Dropped => break,
            }
        }
        if self.health.is_dropped(&peer) {
            self.waits.give_up(&peer);
        }
    }

    /// One wait request to `peer`.
    async fn ask_once(&self, peer: &str, request: &WaitRequest) -> Asked {
        let Some(addr) = self.address(peer).await else {
            self.drop_peer(peer, PeerFailure::Unreachable, "its address was never published");
            return Asked::Dropped;
        };
        self.metrics.peer_wait_request();
        let asked = self
            .request(reqwest::Method::POST, addr, WAIT_PATH)
            .json(request)
            .timeout(Duration::from_secs(WAIT_SECONDS) + self.timeout)
            .send()
            .await;
        let response = match asked {
            Ok(response) => response,
            // Nothing listens there yet (a peer still starting) or any
            // more (one being replaced, which publishes a new address):
            // ask again until the peer has been silent for the timeout.
            Err(error) if nothing_listens(&error) && self.health.still_patient(peer) => return Asked::Again,
            Err(error) => {
                let (failure, why) = unanswered(&error);
                self.drop_peer(peer, failure, &why);
                return Asked::Dropped;
            }
        };
        if let Err((failure, why)) = answered_ok(&response) {
            self.drop_peer(peer, failure, &why);
            return Asked::Dropped;
        }
        let answer = match response.json::<WaitAnswer>().await {
            Ok(answer) => answer,
            Err(error) => {
                self.drop_peer(peer, PeerFailure::Unreachable, &format!("its answer did not read: {error}"));
                return Asked::Dropped;
            }
        };
        // An object settled is progress; otherwise its bytes must grow.
        let progress = if answer.settles_any() { None } else { Some(answer.state.bytes_done) };
        self.health.seen(peer, addr);
        if !self.health.heard_from(peer, progress) {
            self.drop_peer(peer, PeerFailure::Stalled, "it made no progress");
            return Asked::Dropped;
        }
        Asked::Answer(answer)
    }

    /// How this worker names itself on the wire.
    pub(super) fn speaker(&self) -> Speaker {
        Speaker::new(&self.me, self.serves_at.get().copied())
    }

    /// A request to the peer at `addr`, with the secret and this worker's
    /// name, over TLS when this worker has certificates.
    fn request(&self, method: reqwest::Method, addr: SocketAddr, path: &str) -> reqwest::RequestBuilder {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.http
            .request(method, format!("{scheme}://{addr}{path}"))
            .bearer_auth(&self.token)
            .header(SPEAKER_HEADER, self.speaker().to_string())
    }

    /// Where `peer` serves, waiting up to the timeout for discovery to learn it.
    pub(super) async fn address(&self, peer: &str) -> Option<SocketAddr> {
        let mut directory = self.directory.clone();
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.health.is_dropped(peer) {
                return None;
            }
            if let Some(addr) = directory.borrow_and_update().get(peer).copied() {
                return Some(addr);
            }
            match tokio::time::timeout_at(deadline, directory.changed()).await {
                Ok(Ok(())) => {}
                _ => return directory.borrow().get(peer).copied(),
            }
        }
    }

    /// Asks `peer` at `addr` for the bytes of version `etag` of `key` (a
    /// `range` of it), with `method` GET: its response, or where to read
    /// them instead. With HEAD: the same answer without the bytes, once the
    /// peer would send them.
    pub(super) async fn fetch(
        &self,
        method: reqwest::Method,
        peer: &str,
        addr: SocketAddr,
        key: &str,
        etag: &str,
        range: Option<&std::ops::Range<u64>>,
    ) -> Result<PeerAnswer<reqwest::Response>, (PeerFailure, String)> {
        let mut request =
            self.request(method, addr, OBJECT_PATH).query(&ObjectQuery { key: key.to_owned(), etag: etag.to_owned() });
        if let Some(range) = range {
            request = request.header(reqwest::header::RANGE, format!("bytes={}-{}", range.start, range.end - 1));
        }
        // A block is asked for as soon as this worker starts the object,
        // perhaps before its owner's port is up: ask again until the owner
        // has been silent for the timeout, as a wait request does.
        // The answer starts once the object is there or landing, which the
        // peer waits for up to the timeout; the body is watched for stalls
        // chunk by chunk ([`PeerStore`]).
        let patience = self.timeout + Duration::from_secs(WAIT_SECONDS);
        loop {
            let sent = request.try_clone().expect("a body-less request clones").send();
            let response = match tokio::time::timeout(patience, sent).await {
                Ok(Ok(response)) => response,
                Ok(Err(error)) if nothing_listens(&error) && self.health.still_patient(peer) => {
                    tokio::time::sleep(CONNECT_RETRY).await;
                    continue;
                }
                Ok(Err(error)) => return Err(unanswered(&error)),
                Err(_) => return Err((PeerFailure::Unreachable, format!("it did not answer within {patience:?}"))),
            };
            match response.status().as_u16() {
                200 | 206 => return Ok(PeerAnswer::Bytes(response)),
                SECOND_HAND => return Ok(PeerAnswer::Elsewhere),
                TAKEN_OVER if range.is_some() => return Ok(PeerAnswer::TakenOver),
                // The block did not start landing there within the
                // timeout: an owner on a slow link that is busy with its
                // other blocks. Ask again while its run goes on and makes
                // progress, as a wait request does; bypassing it would
                // read its blocks from the store twice.
                404 if range.is_some() && self.still_working(peer, addr).await => {}
                status => return Err((PeerFailure::Unreachable, format!("it answered {status} for {key}"))),
            }
        }
    }

    /// Whether `peer` (at `addr`) is still in its run and has made progress
    /// within the timeout, by its state.
    pub(super) async fn still_working(&self, peer: &str, addr: SocketAddr) -> bool {
        match self.peer_state(addr).await {
            Heard::State(state) => !state.finished && self.health.heard_from(peer, Some(state.bytes_done)),
            Heard::Closed | Heard::Nothing => false,
        }
    }

    /// Keeps this (finished) worker serving until every peer is complete,
    /// has been unreachable for the timeout, or the linger time is up. A
    /// peer already bypassed as unreachable in the run (its node died or
    /// was deleted) is not waited for again, unless it shows up at a new
    /// address (a replaced pod).
    pub async fn linger(&self) {
        if self.alone.load(Relaxed) {
            return;
        }
        let deadline = Instant::now() + self.linger;
        // Per peer: when it last answered, and whether it ever did (here,
        // or to a wait request at the address it has now). The group, and
        // whoever discovery found besides: a node that joined later is fed
        // too.
        let mut waiting: BTreeMap<String, (Instant, bool)> = BTreeMap::new();
        // Peers no longer waited for, at the address they had then: one
        // that comes back at a new address (a replaced pod) is waited for
        // again.
        let mut settled: BTreeMap<String, Option<SocketAddr>> = BTreeMap::new();
        while Instant::now() < deadline {
            let directory = self.directory.borrow().clone();
            for peer in self.group.members().iter().chain(directory.keys()) {
                let at_same_address = settled.get(peer).is_some_and(|addr| *addr == directory.get(peer).copied());
                let new = !waiting.contains_key(peer) && !at_same_address;
                if !new || *peer == self.me || self.health.has_exited(peer) {
                    continue;
                }
                let addr = directory.get(peer).copied();
                if self.health.was_unreachable_at(peer, addr) {
                    settled.insert(peer.clone(), addr);
                } else {
                    // One that answered during the run at this address is
                    // known to have been there: a closed port now means it
                    // exited, not that it has yet to start.
                    waiting.insert(peer.clone(), (Instant::now(), self.health.seen_there(peer, addr)));
                }
            }
            waiting.retain(|peer, _| !self.health.has_exited(peer));
            if waiting.is_empty() {
                break;
            }
            let mut done = Vec::new();
            for (peer, (last_seen, answered)) in &mut waiting {
                let addr = self.directory.borrow().get(peer).copied();
                let heard = match addr {
                    Some(addr) => self.peer_state(addr).await,
                    None => Heard::Nothing,
                };
                match heard {
                    Heard::State(state) if state.complete => done.push(peer.clone()),
                    Heard::State(_) => (*last_seen, *answered) = (Instant::now(), true),
                    // It was running there before (it answered, or asked
                    // this worker something, perhaps since the last poll)
                    // and its port is closed now: it exited (done, or
                    // killed and replaced by a new pod with a new address);
                    // nobody is there to serve.
                    Heard::Closed if *answered || self.health.seen_there(peer, addr) => done.push(peer.clone()),
                    Heard::Closed | Heard::Nothing if last_seen.elapsed() > self.timeout => {
                        tracing::info!(%peer, "no longer waiting for a peer that does not answer");
                        done.push(peer.clone());
                    }
                    Heard::Closed | Heard::Nothing => {}
                }
            }
            for peer in done {
                waiting.remove(&peer);
                let addr = self.directory.borrow().get(&peer).copied();
                settled.insert(peer, addr);
            }
            if !waiting.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if !waiting.is_empty() {
            tracing::info!(peers = ?waiting.keys().collect::<Vec<_>>(), "stopped serving: --peer-linger is up");
        }
    }

    async fn peer_state(&self, addr: SocketAddr) -> Heard {
        let sent = self.request(reqwest::Method::GET, addr, STATE_PATH).timeout(Duration::from_secs(2)).send().await;
        let response = match sent {
            Ok(response) if response.status().is_success() => response,
            Err(error) if nothing_listens(&error) => return Heard::Closed,
            _ => return Heard::Nothing,
        };
        response.json().await.map_or(Heard::Nothing, Heard::State)
    }
}
