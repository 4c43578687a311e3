//! Waiting for peers, many objects per request.
//!
//! A pull waits for thousands of objects from its peers at once. Each
//! waiting task registers its object here and sleeps; one task per peer
//! ([`super::Fleet::await_ready`] starts it) asks that peer about the
//! objects waited for from it, up to [`WAIT_MAX_OBJECTS`] per request and
//! first in key order (the order every worker lists, so the order the peer
//! stages its share in), and wakes the waiters each answer settles. Two
//! workers so keep one long poll between them however many objects are
//! waited for; one poll per object kept about 2,100 connections open
//! between two workers and cost two requests per small object.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use ferry_contract::peers::wire::{ObjectQuery, WAIT_MAX_OBJECTS, WaitRequest};
use tokio::sync::oneshot;

/// Whether to read an object from the peer (`true`) or from the store.
pub type FromPeer = bool;

/// The objects waited for, by peer.
#[derive(Debug, Default)]
pub struct Waits {
    peers: Mutex<HashMap<String, PeerWaits>>,
}

#[derive(Debug, Default)]
struct PeerWaits {
    /// Objects waited for from this peer, by key.
    pending: BTreeMap<String, Pending>,
    /// A task is asking this peer.
    asking: bool,
}

#[derive(Debug)]
struct Pending {
    /// The version waited for.
    etag: String,
    waiters: Vec<oneshot::Sender<FromPeer>>,
}

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PeerWaits>> {
        self.peers.lock().expect("waits lock poisoned")
    }

    /// Registers a wait for version `etag` of `key` from `peer`. Returns
    /// what will tell the waiter, and whether the caller must start asking
    /// the peer (no task does).
    pub fn add(&self, peer: &str, key: &str, etag: &str) -> (oneshot::Receiver<FromPeer>, bool) {
        let (tell, told) = oneshot::channel();
        let mut peers = self.lock();
        let waits = peers.entry(peer.to_owned()).or_default();
        let pending = waits
            .pending
            .entry(key.to_owned())
            .or_insert_with(|| Pending { etag: etag.to_owned(), waiters: Vec::new() });
        if pending.etag != etag {
            // Another version of a key already waited for: one run lists a
            // key once, so this is not expected; the store settles it.
            let _ = tell.send(false);
            return (told, false);
        }
        pending.waiters.push(tell);
        let start_asking = !std::mem::replace(&mut waits.asking, true);
        (told, start_asking)
    }

    /// What to ask `peer` next: the first objects in key order that
    /// someone still waits for. `None` when nobody waits for anything from
    /// it; the asking task then ends, and the next wait starts another.
    pub fn next_request(&self, peer: &str) -> Option<WaitRequest> {
        let mut peers = self.lock();
        let waits = peers.get_mut(peer)?;
        // A waiter whose task ended (its run failed or was cancelled) no
        // longer listens.
        waits.pending.retain(|_, pending| {
            pending.waiters.retain(|waiter| !waiter.is_closed());
            !pending.waiters.is_empty()
        });
        if waits.pending.is_empty() {
            waits.asking = false;
            return None;
        }
        let objects = waits
            .pending
            .iter()
            .take(WAIT_MAX_OBJECTS)
            .map(|(key, pending)| ObjectQuery { key: key.clone(), etag: pending.etag.clone() })
            .collect();
        Some(WaitRequest { objects })
    }

    /// Tells the waiters for `key` from `peer` where to read it.
    pub fn settle(&self, peer: &str, key: &str, from_peer: FromPeer) {
        let pending = self.lock().get_mut(peer).and_then(|waits| waits.pending.remove(key));
        for waiter in pending.into_iter().flat_map(|pending| pending.waiters) {
            let _ = waiter.send(from_peer);
        }
    }

    /// Tells everyone waiting for `peer` to read from the store, and stops
    /// asking it: it was dropped.
    pub fn give_up(&self, peer: &str) {
        let pending = match self.lock().get_mut(peer) {
            Some(waits) => {
                waits.asking = false;
                std::mem::take(&mut waits.pending)
            }
            None => return,
        };
        for waiter in pending.into_values().flat_map(|pending| pending.waiters) {
            let _ = waiter.send(false);
        }
    }

    /// Objects waited for from `peer` now.
    #[cfg(test)]
    pub fn pending(&self, peer: &str) -> usize {
        self.lock().get(peer).map_or(0, |waits| waits.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_task_asks_each_peer_first_in_key_order_until_nobody_waits() {
        let waits = Waits::default();
        let (told_b, start) = waits.add("node-a", "p/b", "e");
        assert!(start, "the first wait starts asking");
        let (told_a, start) = waits.add("node-a", "p/a", "e");
        assert!(!start, "one task asks node-a");
        let (_told_c, start) = waits.add("node-c", "p/c", "e");
        assert!(start, "and one asks node-c");
        let (told_again, start) = waits.add("node-a", "p/a", "e");
        assert!(!start);

        let request = waits.next_request("node-a").unwrap();
        let keys: Vec<&str> = request.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["p/a", "p/b"], "key order, each key once");
        waits.settle("node-a", "p/a", true);
        assert_eq!((told_a.blocking_recv(), told_again.blocking_recv()), (Ok(true), Ok(true)));
        waits.settle("node-a", "p/b", false);
        assert_eq!(told_b.blocking_recv(), Ok(false));
        assert!(waits.next_request("node-a").is_none(), "nobody waits: the task ends");
        let (_told, start) = waits.add("node-a", "p/d", "e");
        assert!(start, "the next wait starts another");
    }

    #[test]
    fn a_request_names_at_most_the_limit_and_forgets_who_stopped_waiting() {
        let waits = Waits::default();
        let mut told: Vec<_> = (0..WAIT_MAX_OBJECTS + 10).map(|i| waits.add("p", &format!("k{i:05}"), "e").0).collect();
        assert_eq!(waits.next_request("p").unwrap().objects.len(), WAIT_MAX_OBJECTS);
        // The first 20 waiters' tasks ended.
        told.drain(..20);
        let request = waits.next_request("p").unwrap();
        assert_eq!(request.objects.len(), WAIT_MAX_OBJECTS - 10);
        assert_eq!(request.objects[0].key, "k00020");
        assert_eq!(waits.pending("p"), WAIT_MAX_OBJECTS - 10);
        drop(told);
        assert!(waits.next_request("p").is_none());
    }

    #[test]
    fn giving_up_on_a_peer_sends_every_waiter_to_the_store() {
        let waits = Waits::default();
        let (told_1, _) = waits.add("p", "k1", "e");
        let (told_2, _) = waits.add("p", "k2", "e");
        let (other_version, start) = waits.add("p", "k1", "f");
        assert!(!start);
        assert_eq!(other_version.blocking_recv(), Ok(false), "another version is read from the store");
        waits.give_up("p");
        assert_eq!((told_1.blocking_recv(), told_2.blocking_recv()), (Ok(false), Ok(false)));
        let (_told, start) = waits.add("p", "k3", "e");
        assert!(start, "whoever waits next asks again (and finds the peer dropped)");
    }
}
