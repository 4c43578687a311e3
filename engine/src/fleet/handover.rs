//! A group that grows: what an owner hands over to a worker that joins a
//! running fleet.
//!
//! The owners divide the dataset among themselves when they start; a
//! worker that joins later owns nothing ([`ferry_contract::PeerOptions::peer_owners`])
//! and asks the owners for everything. Without more, it only copies what
//! they read and the run takes as long as it would have without it. So an
//! owner, asked by a joiner about an object of its own share that it has
//! not started, hands the object over when dividing it between the two
//! gives it to the joiner ([`ferry_contract::PeerGroup::owner`] of the
//! pair): the joiner reads it from the store, the owner reads it from the
//! joiner (and serves it to its other peers as it would have), and the
//! store is still read once.
//!
//! Whether the owner has started an object is decided under one lock with
//! the handing over: the owner's pull calls [`Handover::keep`] for each
//! object of its own share once the object's first request has its slot
//! (not when the object is listed or spawned: with `concurrency: auto`
//! hundreds of objects wait for a request slot at once, and a joiner may
//! take any of them), and hands over only objects after the greatest key
//! kept. Listings come sorted by key and slots are given in turn, so that
//! is about every object not yet started; an object whose turn comes after
//! a later key's (or that was listed out of order) is kept by the owner,
//! never read twice.
//!
//! A large object, fetched in blocks, is started by every worker at once
//! (each reads its own blocks from the store and the others' from their
//! owners), so a joiner could take none of it over whole. Its blocks are
//! handed over one by one instead: a joiner asks an owner for a block, and
//! the owner hands it over ([`ferry_contract::peers::wire::TAKEN_OVER`])
//! when it has not started that block, for about one block in `owners + 1`
//! of those (so that the joiner, which takes from every owner, is left
//! with about as much to read as each of them). The owner starts a block
//! when the block's request has its slot ([`Handover::keep_block`]). Its
//! blocks take slots in any order, so each block is decided on its own:
//! the blocks started are remembered while the object is in flight (a
//! few thousand offsets for the largest objects), not only the furthest.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash as _, Hasher as _};

use ferry_contract::PeerGroup;

/// The most objects one owner has handed over and not yet staged: a
/// joiner that races far ahead of its owners does not grow this without
/// bound (it reads the rest from them as they stage it).
const MAX_HANDED_OVER: usize = 65_536;

/// Of one worker's own share, which objects went to joiners.
#[derive(Debug, Default)]
pub struct Handover {
    /// The greatest key of its own share this worker has started (or
    /// taken from a joiner), in its listing's order.
    last_kept: Option<String>,
    /// Objects handed over, by key: to the worker named.
    handed: HashMap<String, String>,
    /// Of the objects this worker fetches in blocks, by key: the blocks
    /// it started, and those handed over.
    blocks: HashMap<String, Blocks>,
    /// How many blocks are handed over, of every object in `blocks`.
    handed_blocks: usize,
}

/// Of one object fetched in blocks, the blocks this worker reads from the
/// store that it started, and those that went to joiners.
#[derive(Debug, Default)]
struct Blocks {
    /// Blocks started, by their first byte's offset.
    started: HashSet<u64>,
    /// Blocks handed over, by their first byte's offset: to the worker named.
    handed: HashMap<u64, String>,
}

impl Handover {
    /// This worker is about to start `key`, of its own share: the joiner
    /// it was handed over to, to read it from; otherwise nobody may take
    /// it any more.
    pub fn keep(&mut self, key: &str) -> Option<String> {
        if self.last_kept.as_deref().is_none_or(|last| key > last) {
            self.last_kept = Some(key.to_owned());
        }
        self.handed.get(key).cloned()
    }

    /// Whether `joiner` takes over `key` (at `relative_key`), of the share
    /// of `me`, which does not hold it: when `me` has not started it and
    /// dividing it between the two gives it to the joiner. Once handed
    /// over, it stays the joiner's.
    pub fn hand_over(&mut self, me: &str, key: &str, relative_key: &str, joiner: &str) -> bool {
        let takes = self.would_hand_over(me, key, relative_key, joiner);
        if takes {
            self.handed.entry(key.to_owned()).or_insert_with(|| joiner.to_owned());
        }
        takes
    }

    /// Whether [`Handover::hand_over`] would hand `key` to `joiner` now,
    /// changing nothing.
    pub fn would_hand_over(&self, me: &str, key: &str, relative_key: &str, joiner: &str) -> bool {
        if let Some(to) = self.handed.get(key) {
            return to == joiner;
        }
        let started = self.last_kept.as_deref().is_some_and(|last| key <= last);
        !started
            && self.handed.len() < MAX_HANDED_OVER
            && PeerGroup::new([me, joiner]).owner(relative_key) == Some(joiner)
    }

    /// The worker `key` was handed over to, if it was.
    pub fn taken_by(&self, key: &str) -> Option<&str> {
        self.handed.get(key).map(String::as_str)
    }

    /// This worker is about to read the block at `start` of `key` (one it
    /// reads from the store) in a request that has its slot: the joiner it
    /// was handed over to, to read it from; otherwise nobody may take it
    /// any more.
    pub fn keep_block(&mut self, key: &str, start: u64) -> Option<String> {
        let blocks = self.blocks.entry(key.to_owned()).or_default();
        blocks.started.insert(start);
        blocks.handed.get(&start).cloned()
    }

    /// Whether `joiner` takes over the block at `start` of `key`, which
    /// this worker (one of `owners`) reads from the store and has neither
    /// written nor started: when it falls to the joiner (about one block
    /// in `owners + 1`). Once handed over, it stays the joiner's.
    pub fn hand_over_block(&mut self, key: &str, start: u64, joiner: &str, owners: usize) -> bool {
        let room = self.handed_blocks < MAX_HANDED_OVER;
        let blocks = self.blocks.entry(key.to_owned()).or_default();
        if let Some(to) = blocks.handed.get(&start) {
            return to == joiner;
        }
        let takes = !blocks.started.contains(&start) && room && falls_to_the_joiner(joiner, key, start, owners);
        if takes {
            blocks.handed.insert(start, joiner.to_owned());
            self.handed_blocks += 1;
        }
        takes
    }

    /// `key` is staged, or failed for good: forgotten.
    pub fn settled(&mut self, key: &str) {
        self.handed.remove(key);
        if let Some(blocks) = self.blocks.remove(key) {
            self.handed_blocks -= blocks.handed.len();
        }
    }
}

/// Whether the block at `start` of `key` falls to `joiner` rather than to
/// the one of `owners` that reads it: for about one block in `owners + 1`,
/// spread over the object by a hash. Only the owner decides, so the hash
/// need not be the same in another process or release.
fn falls_to_the_joiner(joiner: &str, key: &str, start: u64, owners: usize) -> bool {
    let mut hasher = std::hash::DefaultHasher::new();
    (joiner, key, start).hash(&mut hasher);
    hasher.finish().is_multiple_of(owners as u64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys `p/0000` to `p/0099`, in listing order.
    fn keys() -> Vec<String> {
        (0..100).map(|n| format!("p/{n:04}")).collect()
    }

    fn rel(key: &str) -> &str {
        key.strip_prefix("p/").unwrap()
    }

    #[test]
    fn a_joiner_takes_half_of_what_the_owner_has_not_started_and_nothing_it_has() {
        let mut handover = Handover::default();
        let keys = keys();
        for key in &keys[..40] {
            assert_eq!(handover.keep(key), None);
        }
        let taken: Vec<&String> =
            keys.iter().filter(|key| handover.hand_over("node-a", key, rel(key), "node-j")).collect();
        // None of the forty started; of the sixty left, those that dividing
        // between the two gives the joiner: about half.
        assert!(taken.iter().all(|key| **key > keys[39]), "{taken:?}");
        assert!((20..=40).contains(&taken.len()), "{} of 60", taken.len());
        let pair = PeerGroup::new(["node-a", "node-j"]);
        assert!(taken.iter().all(|key| pair.owner(rel(key)) == Some("node-j")));
        // The owner reads each one taken from the joiner, and keeps the rest.
        for key in &keys[40..] {
            let from = handover.keep(key);
            assert_eq!(from.is_some(), taken.contains(&key), "{key}");
            assert_eq!(handover.taken_by(key), from.as_deref());
        }
        // Nothing more is handed over once the owner has kept it all.
        assert!(keys.iter().all(|key| !handover.hand_over("node-a", key, rel(key), "node-j") || taken.contains(&key)));
    }

    #[test]
    fn an_object_handed_over_stays_with_its_joiner_until_it_is_staged() {
        let mut handover = Handover::default();
        let key = keys().into_iter().find(|key| PeerGroup::new(["node-a", "node-j"]).owner(rel(key)) == Some("node-j"));
        let key = key.unwrap();
        assert!(handover.hand_over("node-a", &key, rel(&key), "node-j"));
        assert!(handover.hand_over("node-a", &key, rel(&key), "node-j"), "asked again: still its");
        assert!(!handover.hand_over("node-a", &key, rel(&key), "node-k"), "not another joiner's");
        assert_eq!(handover.keep(&key).as_deref(), Some("node-j"));
        handover.settled(&key);
        assert_eq!(handover.taken_by(&key), None);
        assert!(!handover.hand_over("node-a", &key, rel(&key), "node-j"), "kept by then");
    }

    #[test]
    fn a_joiner_takes_about_one_block_in_owners_plus_one_of_those_not_started_and_none_started() {
        const BLOCK: u64 = 8 << 20;
        let mut handover = Handover::default();
        // This owner (one of two) read blocks 0 to 99 of its own; blocks
        // up to 999 are left.
        for block in 0..100 {
            assert_eq!(handover.keep_block("p/model", block * BLOCK), None);
        }
        let taken: Vec<u64> =
            (0..1000).filter(|block| handover.hand_over_block("p/model", block * BLOCK, "node-j", 2)).collect();
        assert!(taken.iter().all(|block| *block >= 100), "{taken:?}");
        assert!((240..=360).contains(&taken.len()), "{} of 900, about a third", taken.len());
        // Spread over what is left, not bunched at one end.
        assert!(taken.iter().filter(|block| **block < 550).count() > taken.len() / 3, "{taken:?}");
        // The owner reads each one taken from the joiner and keeps the rest;
        // nothing more is handed over once it has started them all.
        for block in 100..1000 {
            let from = handover.keep_block("p/model", block * BLOCK);
            assert_eq!(from.is_some(), taken.contains(&block), "block {block}");
        }
        assert!(handover.hand_over_block("p/model", taken[0] * BLOCK, "node-j", 2), "still its");
        assert!(!handover.hand_over_block("p/model", taken[0] * BLOCK, "node-k", 2), "not another joiner's");
        let kept = (100..1000).filter(|block| !taken.contains(block));
        assert!(kept.collect::<Vec<_>>().iter().all(|b| !handover.hand_over_block("p/model", b * BLOCK, "node-j", 2)));
        // Another object's blocks are its own; a staged object's are forgotten.
        assert!((0..30).any(|block| handover.hand_over_block("p/other", block * BLOCK, "node-j", 2)));
        handover.settled("p/model");
        handover.settled("p/other");
        assert_eq!((handover.blocks.len(), handover.handed_blocks), (0, 0));
    }

    #[test]
    fn blocks_started_in_any_order_are_kept_and_every_other_one_may_go() {
        let mut handover = Handover::default();
        // Requests take their slots in any order: blocks 50 and 7 started,
        // the ones between did not.
        handover.keep_block("p/model", 50);
        handover.keep_block("p/model", 7);
        assert!(!handover.hand_over_block("p/model", 50, "node-j", 1));
        assert!(!handover.hand_over_block("p/model", 7, "node-j", 1));
        // With one owner, about half of the others go.
        let taken = (0..200)
            .filter(|start| ![7, 50].contains(start))
            .filter(|start| handover.hand_over_block("p/model", *start, "node-j", 1))
            .count();
        assert!((70..=130).contains(&taken), "{taken} of 198");
        assert!((8..50).any(|start| handover.keep_block("p/model", start).is_some()), "some between went");
    }

    #[test]
    fn an_object_listed_out_of_order_is_never_handed_over_once_a_later_one_is_kept() {
        let mut handover = Handover::default();
        let keys = keys();
        handover.keep(&keys[50]);
        // keys[10] was not kept, but comes before one that was: it may be
        // in flight (a listing out of order), so the owner keeps it.
        assert!(keys[..=50].iter().all(|key| !handover.hand_over("node-a", key, rel(key), "node-j")));
    }
}
