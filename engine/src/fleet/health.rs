//! What one worker knows of its peers' health: which it bypasses for the
//! rest of the run and why, which are making progress, where each was seen
//! running, and which have exited.
//!
//! Kept apart from the asking ([`super::ask`]) and the serving
//! ([`super::server`]), which both report to it: a peer that answers,
//! stalls, refuses or asks something is noted here, and every decision to
//! ask a peer or wait for it reads it back. Bypassing a peer is counted
//! once, in the run's failures and in the metrics it is handed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::{Metrics, PeerFailure};

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
    /// Known to have exited ([`PeerHealthMap::exited`]): neither asked nor
    /// waited for.
    exited: bool,
    /// Bypassed because it did not answer or broke off, at the address it
    /// had then: lingering does not wait for it again there.
    unreachable_at: Option<Option<SocketAddr>>,
    /// Where it was last seen running: it answered this worker's wait
    /// requests there, or asked this worker something while serving there.
    /// A peer seen there whose port is closed now has exited: lingering
    /// stops waiting for it at once instead of after the timeout.
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

/// The health of every peer one worker has heard from or about.
#[derive(Debug)]
pub(super) struct PeerHealthMap {
    peers: Mutex<HashMap<String, PeerHealth>>,
    /// How long a peer may show no progress before it is bypassed
    /// (`--peer-timeout`).
    timeout: Duration,
    /// Peers bypassed for a failure in this run.
    failures: AtomicU64,
    metrics: Arc<Metrics>,
}

impl PeerHealthMap {
    pub(super) fn new(timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self { peers: Mutex::default(), timeout, failures: AtomicU64::new(0), metrics }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, PeerHealth>> {
        self.peers.lock().expect("health lock poisoned")
    }

    /// Whether `peer` is bypassed for the rest of the run.
    pub(super) fn is_dropped(&self, peer: &str) -> bool {
        self.lock().get(peer).is_some_and(|h| h.dropped)
    }

    /// Bypasses `peer`, now at `addr`, for the rest of the run: counted and
    /// logged once, however many requests fail after the first.
    pub(super) fn drop_peer(&self, peer: &str, addr: Option<SocketAddr>, failure: PeerFailure, why: &str) {
        let mut peers = self.lock();
        let entry = peers.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        // A peer that refused this worker (its secret, version or
        // certificate) cannot be served by it either: not waited for.
        if matches!(failure, PeerFailure::Unreachable | PeerFailure::Refused) {
            entry.unreachable_at = Some(addr);
        }
        if !entry.dropped {
            entry.dropped = true;
            self.failures.fetch_add(1, Relaxed);
            self.metrics.peer_failure(failure);
            tracing::warn!(%peer, reason = failure.as_str(), %why, "bypassing a peer: its share is read from the store");
        }
    }

    /// Notes an answer from `peer` (`None`: a whole object was ready, which
    /// is progress); returns false when it has shown no progress for longer
    /// than the timeout.
    pub(super) fn heard_from(&self, peer: &str, bytes_done: Option<u64>) -> bool {
        let now = Instant::now();
        let mut peers = self.lock();
        let entry = peers.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        match bytes_done {
            Some(done) if done > entry.bytes_done => {
                entry.bytes_done = done;
                entry.progressed = now;
            }
            None => entry.progressed = now,
            Some(_) => {}
        }
        now.duration_since(entry.progressed) <= self.timeout
    }

    /// Whether `peer` made progress within the timeout (without counting
    /// this as news from it).
    pub(super) fn still_patient(&self, peer: &str) -> bool {
        self.heard_from(peer, Some(0))
    }

    /// Notes that `peer` was running and serving at `addr`: it answered
    /// this worker there, or asked this worker something from there.
    pub(super) fn seen(&self, peer: &str, addr: SocketAddr) {
        self.lock().entry(peer.to_owned()).or_insert_with(PeerHealth::new).seen_at = Some(addr);
    }

    /// Whether `peer` was seen running during the run at `addr`, where it is now.
    pub(super) fn seen_there(&self, peer: &str, addr: Option<SocketAddr>) -> bool {
        addr.is_some() && self.lock().get(peer).is_some_and(|h| h.seen_at == addr)
    }

    /// Notes that `peer` exited: bypassed from now on, but not a failure.
    pub(super) fn exited(&self, peer: &str) {
        let mut peers = self.lock();
        let entry = peers.entry(peer.to_owned()).or_insert_with(PeerHealth::new);
        if !entry.exited {
            entry.exited = true;
            entry.dropped = true;
            tracing::info!(%peer, "a peer has exited: what it owns is read from the store");
        }
    }

    /// Whether `peer` is known to have exited.
    pub(super) fn has_exited(&self, peer: &str) -> bool {
        self.lock().get(peer).is_some_and(|h| h.exited)
    }

    /// Whether `peer` was bypassed as unreachable (or refusing) at `addr`.
    pub(super) fn was_unreachable_at(&self, peer: &str, addr: Option<SocketAddr>) -> bool {
        self.lock().get(peer).is_some_and(|h| h.unreachable_at == Some(addr))
    }

    /// How many peers were bypassed for a failure in this run.
    pub(super) fn failures(&self) -> u64 {
        self.failures.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(timeout: Duration) -> PeerHealthMap {
        PeerHealthMap::new(timeout, Arc::new(Metrics::default()))
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_peer_bypassed_twice_counts_as_one_failure() {
        let health = map(Duration::from_secs(5));
        assert!(!health.is_dropped("b"));
        health.drop_peer("b", Some(addr(1)), PeerFailure::Stalled, "it made no progress");
        health.drop_peer("b", Some(addr(1)), PeerFailure::Mismatch, "its bytes do not match");
        assert!(health.is_dropped("b"));
        assert!(!health.is_dropped("c"));
        assert_eq!(health.failures(), 1);
    }

    #[test]
    fn only_an_unreachable_or_refusing_peer_is_remembered_at_its_address() {
        let health = map(Duration::from_secs(5));
        health.drop_peer("b", Some(addr(1)), PeerFailure::Mismatch, "its bytes do not match");
        assert!(!health.was_unreachable_at("b", Some(addr(1))));
        health.drop_peer("c", Some(addr(2)), PeerFailure::Refused, "401");
        assert!(health.was_unreachable_at("c", Some(addr(2))));
        // A replaced pod at a new address is another matter.
        assert!(!health.was_unreachable_at("c", Some(addr(3))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_is_patient_while_its_bytes_grow_and_not_after_the_timeout_without() {
        let health = map(Duration::from_secs(5));
        assert!(health.heard_from("b", Some(10)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(health.heard_from("b", Some(20)), "more bytes done is progress");
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(health.heard_from("b", Some(20)), "within the timeout of the last progress");
        assert!(health.still_patient("b"));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!health.heard_from("b", Some(15)), "fewer bytes done is no progress");
        assert!(!health.still_patient("b"));
        assert!(health.heard_from("b", None), "a whole object ready is progress");
    }

    #[test]
    fn an_exited_peer_is_bypassed_but_is_no_failure() {
        let health = map(Duration::from_secs(5));
        health.exited("b");
        health.exited("b");
        assert!(health.is_dropped("b") && health.has_exited("b"));
        assert_eq!(health.failures(), 0);
    }

    #[test]
    fn a_peer_is_seen_only_at_the_address_it_was_seen_at() {
        let health = map(Duration::from_secs(5));
        assert!(!health.seen_there("b", Some(addr(1))));
        health.seen("b", addr(1));
        assert!(health.seen_there("b", Some(addr(1))));
        assert!(!health.seen_there("b", Some(addr(2))));
        assert!(!health.seen_there("b", None));
    }
}
