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
//!
//! Where each part lives: asking peers (waits, bytes, lingering) in
//! [`ask`], serving them in [`server`], what this worker knows of each
//! peer's health in [`health`], what it holds in [`catalog`], and taking
//! over a share in [`handover`]. This file holds the [`Fleet`] they share
//! and what the pull calls.

mod ask;
pub mod catalog;
mod handover;
mod health;
mod peer_store;
mod permitted;
pub mod server;
mod spill;
pub mod tls;
mod waits;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ferry_contract::PeerCounts;
use ferry_contract::peers::wire::{ObjectQuery, Speaker, WaitAnswer};
use ferry_contract::peers::{PEER_TOKEN_ENV, PeerGroup, PeerOptions};
use tokio::sync::watch;

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
    /// What this worker knows of each peer's health.
    health: health::PeerHealthMap,
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
            health: health::PeerHealthMap::new(options.peer_timeout, Arc::clone(&metrics)),
            ready: Mutex::default(),
            served_ranges: Mutex::default(),
            waits: waits::Waits::default(),
            serve_limit: options.peer_serve_bandwidth.as_ref().map(|b| Pacer::new(Some(b.bytes()))),
            metrics,
            bytes_from_peers: AtomicU64::new(0),
            objects_from_peers: AtomicU64::new(0),
            bytes_served: AtomicU64::new(0),
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
        if !self.joined(asker) || self.health.is_dropped(asker) {
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
        self.lock_handover().keep_block(key, start).filter(|joiner| !self.health.is_dropped(joiner))
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
        sources.into_iter().filter(|peer| !self.health.is_dropped(peer)).map(str::to_owned).collect()
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
            peer_failures: self.health.failures(),
        }
    }

    /// The peer that said it holds `key`, and where it is, unless dropped
    /// since. None: this worker reads `key` from the store.
    pub(crate) fn source_for(&self, key: &str) -> Option<(String, SocketAddr)> {
        let peer = self.ready.lock().expect("ready lock poisoned").get(key).cloned()?;
        if self.health.is_dropped(&peer) {
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
        if !self.health.is_dropped(&peer) {
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

    /// A request from `asker` reached this worker's peer port.
    fn asked_by(&self, asker: &Speaker) {
        if let Some(addr) = asker.serves_at
            && asker.name != self.me
        {
            self.health.seen(&asker.name, addr);
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
        if peer != self.me {
            self.health.exited(peer);
        }
    }

    /// Bypasses `peer` for the rest of the run (once), at the address
    /// discovery has for it now.
    fn drop_peer(&self, peer: &str, failure: PeerFailure, why: &str) {
        let addr = self.directory.borrow().get(peer).copied();
        self.health.drop_peer(peer, addr, failure, why);
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
