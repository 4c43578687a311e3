//! Fleet staging: the workers of one pull onto several nodes feed each
//! other, so the dataset leaves the object store about once instead of once
//! per node.
//!
//! Every worker owns a share of the keys ([`PeerGroup::owner`]), reads it
//! from the store, and serves what it has in place on its peer port
//! ([`server`]). For every other key it asks the owner to say when it holds
//! the listed version ([`Fleet::await_ready`], a long poll that holds no
//! request slot), then reads the bytes from the owner through
//! [`PeerStore`], the store the engine sees. Two rules keep peers from ever
//! making a run worse than reading the store directly:
//!
//! - **Integrity**: a peer's bytes go through the same verification as the
//!   store's, against the checksum the *store* lists or reports. A peer whose
//!   bytes do not match is dropped and the object read from the store.
//! - **Liveness**: a peer that does not answer, refuses, or makes no
//!   progress for `--peer-timeout` is dropped, and its share read from the
//!   store. The worst case is a direct read.
//!
//! Where a worker bypassed an owner, it does not read that owner's share
//! from the store at once: it asks the members after the owner in the
//! group's order, up to itself ([`PeerGroup::sources`],
//! [`PeerGroup::block_sources`]). The first of them reads the share from
//! the store in the owner's place, and the rest from it, so a node that
//! dies costs the store one more copy of its share, not one per node.
//! Every worker asks only members before itself in one shared order, so
//! none waits on another that waits on it. A worker passes on, while it
//! lands, only bytes it read from the store itself ([`SECOND_HAND`]):
//! bytes a peer got wrong are caught by that peer's readers and blamed on
//! it, not on a worker that relayed them.
//!
//! A worker that joins a running fleet owns nothing, but takes over, as it
//! asks about them, the objects of its owners' shares and the blocks of
//! their large objects that they have not started ([`handover`]): what
//! nobody has read yet is divided anew.
//!
//! A read of a peer's block first waits, holding no request slot, for the
//! peer to start on it ([`PeerStore`]'s `ready`): two workers waiting in
//! their slots for each other's blocks could hold every slot they have.
//!
//! A finished worker keeps serving ([`Fleet::linger`]) until every peer is
//! complete, gone, or `--peer-linger` has passed.

pub mod catalog;
mod handover;
mod peer_store;
mod permitted;
pub mod server;
mod spill;
pub mod tls;
mod waits;

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

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferry_contract::PeerCounts;
use ferry_contract::peers::wire::{
    OBJECT_PATH, ObjectQuery, PROTOCOL, PeerState, SECOND_HAND, SPEAKER_HEADER, STATE_PATH, Speaker, TAKEN_OVER,
    WAIT_PATH, WAIT_SECONDS, WaitAnswer, WaitRequest,
};
use ferry_contract::peers::{PEER_TOKEN_ENV, PeerGroup, PeerOptions};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::{Metrics, PeerFailure};
use crate::transfer::pacing::Pacer;

pub use catalog::Catalog;
pub use peer_store::PeerStore;

/// The addresses of the peers, by worker name, as discovery learns them:
/// fixed (`--peer`) or from the DataStage's status.
pub type Directory = watch::Receiver<BTreeMap<String, SocketAddr>>;

/// Fleet options that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FleetError {
    /// No shared secret.
    #[error("--peer-group needs the peers' shared secret in {PEER_TOKEN_ENV}")]
    NoToken,
    /// This worker is not in its own group.
    #[error("--peer-group must include this worker ('{0}')")]
    NotAMember(String),
    /// An owner that is not in the group.
    #[error("--peer-owners may name only members of --peer-group ('{0}' is not one)")]
    OwnerNotAMember(String),
    /// The `--peer-tls` files cannot be used.
    #[error("{0}")]
    Tls(String),
}

/// What one peer has shown of itself so far.
#[derive(Debug)]
struct PeerHealth {
    /// Bypassed for the rest of the run.
    dropped: bool,
    /// Its `bytes_done` when last heard from.
    bytes_done: u64,
    /// When it last answered with more bytes done than before (or first
    /// answered at all).
    progressed: Instant,
    /// Known to have exited ([`Fleet::exited`]): neither asked nor waited for.
    exited: bool,
    /// Bypassed because it did not answer or broke off, at the address it
    /// had then: [`Fleet::linger`] does not wait for it again there.
    unreachable_at: Option<Option<SocketAddr>>,
    /// Where it was last seen running: it answered this worker's wait
    /// requests there, or asked this worker something while serving there.
    /// A peer seen there whose port is closed now has exited:
    /// [`Fleet::linger`] stops waiting for it at once instead of after the
    /// timeout.
    seen_at: Option<SocketAddr>,
}

impl PeerHealth {
    fn new() -> Self {
        Self {
            dropped: false,
            bytes_done: 0,
            progressed: Instant::now(),
            exited: false,
            unreachable_at: None,
            seen_at: None,
        }
    }
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

/// One worker's side of fleet staging.
#[derive(Debug)]
pub struct Fleet {
    me: String,
    group: PeerGroup,
    /// The members that read the dataset from the store between them
    /// (`--peer-owners`; the whole group unless this worker joined a
    /// running fleet): they own every key and block.
    owners: PeerGroup,
    token: String,
    /// Mutual TLS on the peer port and to peers (`--peer-tls`); plain HTTP
    /// without.
    tls: Option<tls::PeerTls>,
    /// Where this worker's peer port listens, once [`server::serve`] bound it.
    serves_at: OnceLock<SocketAddr>,
    timeout: Duration,
    linger: Duration,
    /// What this worker holds and serves.
    pub catalog: Catalog,
    directory: Directory,
    http: reqwest::Client,
    health: Mutex<HashMap<String, PeerHealth>>,
    /// Keys a peer has said it holds, and which peer.
    ready: Mutex<HashMap<String, String>>,
    /// Objects fetched in ranges: the peers that served ranges of each (in
    /// flight), to bypass if the whole does not match the store's checksum.
    served_ranges: Mutex<HashMap<String, BTreeSet<String>>>,
    /// Objects waited for from peers.
    waits: waits::Waits,
    serve_limit: Option<Pacer>,
    metrics: Arc<Metrics>,
    bytes_from_peers: AtomicU64,
    objects_from_peers: AtomicU64,
    bytes_served: AtomicU64,
    peer_failures: AtomicU64,
    /// Set by [`Fleet::alone`]: peers cannot find this worker, so it
    /// neither asks them nor lingers for them.
    alone: AtomicBool,
    /// Objects of this worker's share that joiners took over.
    handover: Mutex<handover::Handover>,
    /// The prefix the run lists: owners are decided by keys relative to it.
    prefix: OnceLock<String>,
    /// The size of the blocks a large object is fetched in, the same on
    /// every worker: which blocks this worker reads from the store
    /// ([`PeerStore`]), and so may hand over.
    block: OnceLock<u64>,
}

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
    /// This worker (`me`) in the group `options` names, with the peers'
    /// shared `token` and their addresses from `directory`. `None` when the
    /// options name no group.
    ///
    /// # Errors
    /// No token, `me` is not in the group, or the `--peer-tls` files
    /// cannot be used.
    pub fn new(
        me: &str,
        options: &PeerOptions,
        token: Option<String>,
        directory: Directory,
        metrics: Arc<Metrics>,
    ) -> Result<Option<Arc<Self>>, FleetError> {
        if options.peer_group.is_empty() {
            return Ok(None);
        }
        let token = token.filter(|t| !t.is_empty()).ok_or(FleetError::NoToken)?;
        let group = PeerGroup::new(options.peer_group.iter().cloned());
        if !group.members().iter().any(|m| m == me) {
            return Err(FleetError::NotAMember(me.to_owned()));
        }
        if let Some(stranger) = options.peer_owners.iter().find(|o| !group.members().contains(o)) {
            return Err(FleetError::OwnerNotAMember(stranger.clone()));
        }
        let owners = if options.peer_owners.is_empty() {
            group.clone()
        } else {
            PeerGroup::new(options.peer_owners.iter().cloned())
        };
        let tls = match &options.peer_tls {
            Some(dir) => Some(tls::PeerTls::load(dir).map_err(|e| FleetError::Tls(e.to_string()))?),
            None => None,
        };
        let mut http =
            reqwest::Client::builder().no_proxy().connect_timeout(Duration::from_secs(2).min(options.peer_timeout));
        if let Some(tls) = &tls {
            http = http.tls_backend_preconfigured(tls.client.clone());
        }
        let http = http.build().map_err(|e| FleetError::Tls(format!("--peer-tls: {e}")))?;
        Ok(Some(Arc::new(Self {
            me: me.to_owned(),
            group,
            owners,
            token,
            tls,
            serves_at: OnceLock::new(),
            timeout: options.peer_timeout,
            linger: options.peer_linger,
            catalog: Catalog::default(),
            directory,
            http,
            health: Mutex::default(),
            ready: Mutex::default(),
            served_ranges: Mutex::default(),
            waits: waits::Waits::default(),
            serve_limit: options.peer_serve_bandwidth.as_ref().map(|b| Pacer::new(Some(b.bytes()))),
            metrics,
            bytes_from_peers: AtomicU64::new(0),
            objects_from_peers: AtomicU64::new(0),
            bytes_served: AtomicU64::new(0),
            peer_failures: AtomicU64::new(0),
            alone: AtomicBool::new(false),
            handover: Mutex::default(),
            prefix: OnceLock::new(),
            block: OnceLock::new(),
        })))
    }

    /// The peer that reads `relative_key` from the store, when not this worker.
    pub fn owner_elsewhere(&self, relative_key: &str) -> Option<&str> {
        self.owners.owner(relative_key).filter(|owner| *owner != self.me)
    }

    /// The run lists `prefix` (told once, by the pull, before it asks or
    /// serves anything).
    pub fn listing(&self, prefix: &str) {
        let _ = self.prefix.set(prefix.to_owned());
    }

    /// The first request for `key`, of this worker's own share, has its
    /// slot: whether a joiner took the object over, so that it is read from
    /// the joiner ([`Fleet::await_ready`]). From now on nobody may.
    pub fn taken_over(&self, key: &str) -> bool {
        self.lock_handover().keep(key).is_some()
    }

    /// The answer at once to `asker`'s wait for `objects` when it takes
    /// over any of them ([`handover`]): only a worker outside the owners
    /// (one that joined) takes any, and only of this worker's share that it
    /// neither holds nor has started. `None`: it takes none.
    fn hand_over(&self, asker: &str, objects: &[ObjectQuery]) -> Option<WaitAnswer> {
        let prefix = self.prefix.get()?;
        if !self.joined(asker) {
            return None;
        }
        let takes = |handover: &handover::Handover, object: &ObjectQuery| {
            let rel = crate::local::paths::relative_key(&object.key, prefix);
            self.owners.owner(rel) == Some(self.me.as_str())
                && handover.would_hand_over(&self.me, &object.key, rel, asker)
        };
        // Most of what a joiner asks about is started already: the catalog
        // is looked up (once more, besides the wait itself) only when some
        // object could be taken over.
        let any = {
            let handover = self.lock_handover();
            objects.iter().any(|object| takes(&handover, object))
        };
        if !any {
            return None;
        }
        let mut answer = self.catalog.settled(objects);
        let answered: BTreeSet<u32> = answer.held.iter().chain(&answer.landing).chain(&answer.never).copied().collect();
        let mut handover = self.lock_handover();
        answer.taken_over = (0u32..)
            .zip(objects)
            .filter(|(index, object)| {
                let rel = crate::local::paths::relative_key(&object.key, prefix);
                !answered.contains(index)
                    && takes(&handover, object)
                    && handover.hand_over(&self.me, &object.key, rel, asker)
            })
            .map(|(index, _)| index)
            .collect();
        drop(handover);
        if answer.taken_over.is_empty() {
            return None;
        }
        tracing::debug!(joiner = asker, objects = answer.taken_over.len(), "handed over objects not started yet");
        Some(answer)
    }

    /// Whether `asker` takes over the block of `key` at `start`, which this
    /// worker reads from the store and has not written ([`handover`]):
    /// only a worker outside the owners (one that joined) takes any, and
    /// only blocks this worker has not started.
    pub(crate) fn hand_over_block(&self, asker: &str, key: &str, start: u64) -> bool {
        let Some(block) = self.block.get() else { return false };
        if !self.joined(asker) || self.is_dropped(asker) {
            return false;
        }
        if !self.block_sources(key, start / block).is_empty() {
            return false;
        }
        let taken = self.lock_handover().hand_over_block(key, start, asker, self.owners.members().len());
        if taken {
            tracing::debug!(joiner = asker, key, start, "a block not started yet is the joiner's to read");
        }
        taken
    }

    /// The request for the block of `key` at `start`, which this worker
    /// reads from the store, has its slot: the joiner that took it over, to
    /// read it from (unless that joiner has been bypassed since). From now
    /// on nobody may take it.
    pub(crate) fn block_taken_over(&self, key: &str, start: u64) -> Option<String> {
        self.lock_handover().keep_block(key, start).filter(|joiner| !self.is_dropped(joiner))
    }

    /// Whether `asker` is a worker that joined the fleet: neither this
    /// worker nor one of the owners, so it may take things over.
    fn joined(&self, asker: &str) -> bool {
        asker != self.me && !self.owners.members().iter().any(|m| m == asker)
    }

    fn lock_handover(&self) -> std::sync::MutexGuard<'_, handover::Handover> {
        self.handover.lock().expect("handover lock poisoned")
    }

    /// The peers to ask for block `block` of `key` (an object fetched in
    /// ranges), in order, none bypassed: its owner, then those that stand
    /// in for an owner this worker bypassed ([`PeerGroup::block_sources`]).
    /// Empty when this worker reads it from the store.
    pub fn block_sources(&self, key: &str, block: u64) -> Vec<String> {
        let sources = self.owners.block_sources(key, block, &self.me);
        sources.into_iter().filter(|peer| !self.is_dropped(peer)).map(str::to_owned).collect()
    }

    /// `peer` is serving a range of `key`: remembered until the object is
    /// staged or abandoned, in case the whole does not match.
    fn serving_range(&self, key: &str, peer: &str) {
        self.served_ranges
            .lock()
            .expect("served lock poisoned")
            .entry(key.to_owned())
            .or_default()
            .insert(peer.to_owned());
    }

    /// What fleet staging did in this run so far.
    pub fn counts(&self) -> PeerCounts {
        PeerCounts {
            bytes_from_peers: self.bytes_from_peers.load(Relaxed),
            objects_from_peers: self.objects_from_peers.load(Relaxed),
            bytes_served: self.bytes_served.load(Relaxed),
            peer_failures: self.peer_failures.load(Relaxed),
        }
    }

    /// Waits until the owner of `key` (at `relative_key` below the prefix)
    /// holds version `etag`, or, where this worker bypassed the owner, a
    /// peer that stands in for it ([`PeerGroup::sources`]); returns whether
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
            if self.is_dropped(peer) {
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
            if !self.is_dropped(peer) {
                return false;
            }
        }
        false
    }

    /// Asks `peer` about the objects waited for from it until nobody waits,
    /// or it is dropped (then everyone waiting for it reads the store).
    async fn ask(self: Arc<Self>, peer: String) {
        while let Some(request) = self.waits.next_request(&peer) {
            if self.is_dropped(&peer) {
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
        if self.is_dropped(&peer) {
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
            Err(error) if nothing_listens(&error) && self.still_patient(peer) => return Asked::Again,
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
        self.seen(peer, addr);
        if !self.heard_from(peer, progress) {
            self.drop_peer(peer, PeerFailure::Stalled, "it made no progress");
            return Asked::Dropped;
        }
        Asked::Answer(answer)
    }

    /// The peer that said it holds `key`, and where it is, unless dropped
    /// since. None: this worker reads `key` from the store.
    pub(crate) fn source_for(&self, key: &str) -> Option<(String, SocketAddr)> {
        let peer = self.ready.lock().expect("ready lock poisoned").get(key).cloned()?;
        if self.is_dropped(&peer) {
            return None;
        }
        let addr = self.directory.borrow().get(&peer).copied()?;
        Some((peer, addr))
    }

    /// Records that `key` is staged; counts it when a peer's bytes made it.
    pub fn staged(&self, key: &str) {
        self.served_ranges.lock().expect("served lock poisoned").remove(key);
        self.lock_handover().settled(key);
        let Some(peer) = self.ready.lock().expect("ready lock poisoned").remove(key) else { return };
        if !self.is_dropped(&peer) {
            self.objects_from_peers.fetch_add(1, Relaxed);
        }
    }

    /// `key` failed for good in this run: forget which peer said it held
    /// it, as [`Fleet::staged`] does for one that made it, so a run with
    /// many failures does not keep an entry for each.
    pub fn abandoned(&self, key: &str) {
        self.ready.lock().expect("ready lock poisoned").remove(key);
        self.lock_handover().settled(key);
        self.served_ranges.lock().expect("served lock poisoned").remove(key);
    }

    /// The bytes of `key` did not match the store's checksum: drop the
    /// peer that served them, so the next attempt reads the store. Of an
    /// object fetched in ranges from several peers, which range was wrong
    /// is not known (the store has one checksum for the whole): every peer
    /// that served a range of it is bypassed.
    pub fn distrust(&self, key: &str) {
        let mut peers = self.served_ranges.lock().expect("served lock poisoned").remove(key).unwrap_or_default();
        peers.extend(self.ready.lock().expect("ready lock poisoned").get(key).cloned());
        for peer in peers {
            self.drop_peer(
                &peer,
                PeerFailure::Mismatch,
                &format!("its bytes of {key} do not match the store's checksum"),
            );
        }
    }

    /// Counts bytes received from a peer.
    fn received(&self, bytes: u64) {
        self.bytes_from_peers.fetch_add(bytes, Relaxed);
        self.metrics.peer_bytes_received(bytes);
    }

    /// Paces and counts bytes served to a peer.
    async fn serving(&self, bytes: u64) {
        if let Some(limit) = &self.serve_limit {
            limit.take(bytes).await;
        }
        self.bytes_served.fetch_add(bytes, Relaxed);
        self.metrics.peer_bytes_served(bytes);
    }

    /// Counts a request refused for want of the secret.
    fn refused(&self) {
        self.metrics.peer_request_refused();
    }

    fn is_dropped(&self, peer: &str) -> bool {
        self.health.lock().expect("health lock poisoned").get(peer).is_some_and(|h| h.dropped)
    }

    /// Bypasses `peer` for the rest of the run (once).
    fn drop_peer(&self, peer: &str, failure: PeerFailure, why: &str) {
        let addr = self.directory.borrow().get(peer).copied();
        let mut health = self.health.lock().expect("health lock poisoned");
        let entry = health.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        // A peer that refused this worker (its secret, version or
        // certificate) cannot be served by it either: not waited for.
        if matches!(failure, PeerFailure::Unreachable | PeerFailure::Refused) {
            entry.unreachable_at = Some(addr);
        }
        if !entry.dropped {
            entry.dropped = true;
            self.peer_failures.fetch_add(1, Relaxed);
            self.metrics.peer_failure(failure);
            tracing::warn!(%peer, reason = failure.as_str(), %why, "bypassing a peer: its share is read from the store");
        }
    }

    /// Notes an answer from `peer`; returns false when it has shown no
    /// progress for longer than the timeout.
    fn heard_from(&self, peer: &str, bytes_done: Option<u64>) -> bool {
        let now = Instant::now();
        let mut health = self.health.lock().expect("health lock poisoned");
        let entry = health.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        match bytes_done {
            Some(done) if done > entry.bytes_done => {
                entry.bytes_done = done;
                entry.progressed = now;
            }
            // A whole object was ready: progress.
            None => entry.progressed = now,
            Some(_) => {}
        }
        now.duration_since(entry.progressed) <= self.timeout
    }

    /// Notes that `peer` was running and serving at `addr`: it answered
    /// this worker there, or asked this worker something from there.
    fn seen(&self, peer: &str, addr: SocketAddr) {
        let mut health = self.health.lock().expect("health lock poisoned");
        health.entry(peer.to_owned()).or_insert_with(PeerHealth::new).seen_at = Some(addr);
    }

    /// A request from `asker` reached this worker's peer port.
    fn asked_by(&self, asker: &Speaker) {
        if let Some(addr) = asker.serves_at
            && asker.name != self.me
        {
            self.seen(&asker.name, addr);
        }
    }

    /// Whether `peer` was seen running during the run at `addr`, where it is now.
    fn seen_there(&self, peer: &str, addr: Option<SocketAddr>) -> bool {
        let health = self.health.lock().expect("health lock poisoned");
        addr.is_some() && health.get(peer).is_some_and(|h| h.seen_at == addr)
    }

    /// How this worker names itself on the wire.
    fn speaker(&self) -> Speaker {
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

    /// Whether `peer` made progress within the timeout (without counting
    /// this as news from it).
    fn still_patient(&self, peer: &str) -> bool {
        self.heard_from(peer, Some(0))
    }

    /// Where `peer` serves, waiting up to the timeout for discovery to learn it.
    async fn address(&self, peer: &str) -> Option<SocketAddr> {
        let mut directory = self.directory.clone();
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.is_dropped(peer) {
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
    async fn fetch(
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
                Ok(Err(error)) if nothing_listens(&error) && self.still_patient(peer) => {
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
    async fn still_working(&self, peer: &str, addr: SocketAddr) -> bool {
        match self.peer_state(addr).await {
            Heard::State(state) => !state.finished && self.heard_from(peer, Some(state.bytes_done)),
            Heard::Closed | Heard::Nothing => false,
        }
    }

    /// Serves the ranges of version `etag` of `key` (`size` bytes) to peers
    /// as they are written to `file`, from now until the returned guard is
    /// dropped (after the object is committed and [`Catalog::hold`] knows
    /// it, or when it is abandoned). `written`: ranges already there.
    pub fn landing(
        self: &Arc<Self>,
        key: &str,
        etag: &str,
        size: u64,
        file: Arc<std::fs::File>,
        written: &[(u64, u64)],
    ) -> LandingGuard {
        let id = self.catalog.landing(key, etag, size, file, written);
        LandingGuard { fleet: Arc::clone(self), key: key.to_owned(), id }
    }

    /// Records that this worker's run ended: `complete` when it holds the
    /// whole dataset.
    pub fn finish(&self, complete: bool) {
        self.catalog.finish(complete);
    }

    /// Gives up on peers for the rest of the run, when discovery cannot
    /// work (this worker may not publish its address or read theirs): every
    /// other member is bypassed at once, rather than each after the
    /// timeout, and [`Fleet::linger`] returns at once, since no peer can
    /// find this worker. Whoever writes the directory then marks it
    /// changed, so that reads waiting for an address notice.
    pub fn alone(&self, why: &str) {
        self.alone.store(true, Relaxed);
        for peer in self.group.members().iter().filter(|m| **m != self.me) {
            self.drop_peer(peer, PeerFailure::Unreachable, why);
        }
    }

    /// Stops asking `peer` and waiting for it: it exited (discovery saw
    /// its run finish), so its share is read from the store at once rather
    /// than after the timeout. Not a failure: nothing went wrong. This is
    /// how a node that joins after the others finished is staged without
    /// waiting for them.
    pub fn exited(&self, peer: &str) {
        if peer == self.me {
            return;
        }
        let mut health = self.health.lock().expect("health lock poisoned");
        let entry = health.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        if !entry.exited {
            entry.exited = true;
            entry.dropped = true;
            tracing::info!(%peer, "a peer has exited: what it owns is read from the store");
        }
    }

    fn has_exited(&self, peer: &str) -> bool {
        self.health.lock().expect("health lock poisoned").get(peer).is_some_and(|h| h.exited)
    }

    fn was_unreachable_at(&self, peer: &str, addr: Option<SocketAddr>) -> bool {
        self.health.lock().expect("health lock poisoned").get(peer).is_some_and(|h| h.unreachable_at == Some(addr))
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
                if !new || *peer == self.me || self.has_exited(peer) {
                    continue;
                }
                let addr = directory.get(peer).copied();
                if self.was_unreachable_at(peer, addr) {
                    settled.insert(peer.clone(), addr);
                } else {
                    // One that answered during the run at this address is
                    // known to have been there: a closed port now means it
                    // exited, not that it has yet to start.
                    waiting.insert(peer.clone(), (Instant::now(), self.seen_there(peer, addr)));
                }
            }
            waiting.retain(|peer, _| !self.has_exited(peer));
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
                    Heard::Closed if *answered || self.seen_there(peer, addr) => done.push(peer.clone()),
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

/// An object this worker is fetching and serves to peers as it lands
/// ([`Fleet::landing`]); no longer once dropped.
#[derive(Debug)]
pub struct LandingGuard {
    fleet: Arc<Fleet>,
    key: String,
    id: u64,
}

impl LandingGuard {
    /// Bytes `start..end` are written.
    pub fn written(&self, start: u64, end: u64) {
        self.fleet.catalog.landed(&self.key, self.id, start, end);
    }
}

impl Drop for LandingGuard {
    fn drop(&mut self) {
        self.fleet.catalog.unland(&self.key, self.id);
    }
}
