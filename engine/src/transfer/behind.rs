//! Checksums that cannot be combined from per-range digests, computed from
//! a file behind its download, as each piece lands.
//!
//! An object's MD5 (a single-part ETag) is one chain over all its bytes, and
//! a multipart object's part checksums are one per part: neither can be put
//! together from the CRC-style digests of concurrent ranges. So every piece
//! a range task writes (a write buffer, see `pull.rs`) is reported here the
//! moment it is in the page cache, and:
//! - for an MD5, the hasher ([`super::md5`]) follows the file as far as the
//!   written bytes reach without a gap from its start, so the hash keeps
//!   pace with the download instead of starting after it;
//! - for parts, each is a message of its own: an MD5 part is followed from
//!   its start as a file is, and other kinds of part (SHAs, CRCs of parts)
//!   are hashed as soon as all their bytes are written, whatever order the
//!   ranges land in.
//!
//! Either way the bytes are hashed as they are on disk, not as they
//! arrived, and nothing is held in memory for them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;

use super::Engine;
use super::md5::{LaneShare, Md5Follower};
use super::readback;
use crate::store::{Integrity, PartAlgorithm, PartsChecksum, StoredChecksum};

/// The byte spans of a file that are written, merged where they touch.
#[derive(Debug, Default)]
struct Written {
    /// start → end of each span; no two overlap or touch.
    spans: BTreeMap<u64, u64>,
}

impl Written {
    /// Adds `start..end`, and returns the span it is now part of.
    fn add(&mut self, mut start: u64, mut end: u64) -> (u64, u64) {
        // The span that starts at or before `start` and reaches it.
        if let Some((&before, &before_end)) = self.spans.range(..=start).next_back()
            && before_end >= start
        {
            start = before;
            end = end.max(before_end);
            self.spans.remove(&before);
        }
        // Spans that start inside the new one are swallowed.
        while let Some((&next, &next_end)) = self.spans.range(start..=end).next() {
            end = end.max(next_end);
            self.spans.remove(&next);
        }
        self.spans.insert(start, end);
        (start, end)
    }

    /// How far the file is written without a gap from its start.
    fn prefix(&self) -> u64 {
        self.spans.get(&0).copied().unwrap_or(0)
    }
}

/// What is hashed behind one object's download; shared by its range tasks,
/// which report every piece they write (see [`HashBehind::written`]).
pub(super) struct HashBehind {
    state: Mutex<State>,
    /// Whether it shares the MD5 lanes (an MD5, or MD5 parts), fixed when made.
    in_order: bool,
}

struct State {
    written: Written,
    what: Behind,
}

enum Behind {
    /// The object's MD5, which the hasher follows as the written prefix grows.
    Md5(Md5Follower),
    /// Per-part checksums, each part hashed once it is complete.
    Parts(PartHashes),
}

/// The parts of a multipart object, each a checksum of its own: MD5 parts
/// followed as they are written, as files are (many parts, of this object
/// and others, fill the lanes together), others hashed once complete.
struct PartHashes {
    engine: Arc<Engine>,
    file: Arc<File>,
    checksum: PartsChecksum,
    /// (start, end) of every part, in order.
    parts: Vec<(u64, u64)>,
    /// Where each part's hash stands.
    hashes: Vec<PartHash>,
    /// Complete parts not handed to a hashing task yet.
    ready: Vec<usize>,
    tasks: JoinSet<(usize, io::Result<Vec<u8>>)>,
    /// MD5 parts share the hasher's lanes with followed files.
    lanes: Option<LaneShare>,
    /// A follower that could not be started (the hasher thread is gone).
    failed: Option<io::Error>,
}

enum PartHash {
    /// No byte of the part has been written.
    Waiting,
    /// An MD5 part, followed as its bytes are written.
    Following(Md5Follower),
    /// Complete, and handed to a hashing task (or about to be).
    Taken,
}

impl HashBehind {
    /// Hashes the MD5 of the `size` bytes of `file` behind its download.
    ///
    /// # Errors
    /// A hasher thread that is gone.
    pub(super) fn md5(engine: &Engine, file: &Arc<File>, size: u64) -> io::Result<Self> {
        let follower = engine.md5.follow(Arc::clone(file), size)?;
        Ok(Self::new(Behind::Md5(follower)))
    }

    /// Hashes the parts `layout` (their sizes, in order) behind the download.
    /// MD5 parts share the lanes with other followed files: they, too, fill
    /// best when the object lands in order.
    pub(super) fn parts(engine: &Arc<Engine>, file: &Arc<File>, checksum: PartsChecksum, layout: &[u64]) -> Self {
        let parts: Vec<(u64, u64)> = layout
            .iter()
            .scan(0u64, |offset, len| {
                let start = *offset;
                *offset += len;
                Some((start, *offset))
            })
            .collect();
        Self::new(Behind::Parts(PartHashes {
            engine: Arc::clone(engine),
            file: Arc::clone(file),
            lanes: (checksum.algorithm == PartAlgorithm::Md5).then(|| engine.md5.share()),
            checksum,
            hashes: parts.iter().map(|_| PartHash::Waiting).collect(),
            parts,
            ready: Vec::new(),
            tasks: JoinSet::new(),
            failed: None,
        }))
    }

    fn new(what: Behind) -> Self {
        let in_order = match &what {
            Behind::Md5(_) => true,
            Behind::Parts(parts) => parts.lanes.is_some(),
        };
        Self { state: Mutex::new(State { written: Written::default(), what }), in_order }
    }

    /// Whether the object's ranges should land in order (see `fetch_ranges`
    /// in `pull.rs`): it shares the MD5 lanes.
    pub(super) fn in_order(&self) -> bool {
        self.in_order
    }

    /// Bytes `start..end` are in the file: hash what is now complete.
    pub(super) fn written(&self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut state = self.state.lock().expect("never poisoned: nothing panics holding it");
        let State { written, what } = &mut *state;
        let span = written.add(start, end);
        match what {
            Behind::Md5(follower) => follower.written(written.prefix()),
            Behind::Parts(parts) => parts.written(span),
        }
    }

    /// The object's checksum, once every byte is hashed.
    ///
    /// # Errors
    /// A byte never written, or one that could not be read back.
    pub(super) async fn finish(self) -> io::Result<Integrity> {
        let state = self.state.into_inner().expect("never poisoned: nothing panics holding it");
        match state.what {
            Behind::Md5(follower) => Ok(Integrity::Whole(StoredChecksum::Md5(follower.finish().await?))),
            Behind::Parts(parts) => parts.finish().await,
        }
    }
}

impl PartHashes {
    /// The span `start..end` is written: each part it reaches hashes as much
    /// of itself as is now written from its start.
    fn written(&mut self, (start, end): (u64, u64)) {
        let first = self.parts.partition_point(|&(_, part_end)| part_end <= start);
        for index in first..self.parts.len() {
            let (part_start, part_end) = self.parts[index];
            if part_start >= end {
                break;
            }
            if part_start < start {
                // Its first bytes are not in this span.
                continue;
            }
            let covered = end.min(part_end) - part_start;
            if self.lanes.is_some() {
                self.follow(index, covered);
            } else if covered == part_end - part_start
                && matches!(std::mem::replace(&mut self.hashes[index], PartHash::Taken), PartHash::Waiting)
            {
                self.ready.push(index);
            }
        }
        if self.checksum.algorithm != PartAlgorithm::Md5 {
            self.dispatch();
        }
    }

    /// MD5 part `index` is written `covered` bytes from its start.
    fn follow(&mut self, index: usize, covered: u64) {
        let (start, end) = self.parts[index];
        if let PartHash::Waiting = self.hashes[index] {
            match self.engine.md5.follow_range(Arc::clone(&self.file), start, end - start) {
                Ok(follower) => self.hashes[index] = PartHash::Following(follower),
                Err(error) => {
                    self.failed.get_or_insert(error);
                    return;
                }
            }
        }
        if let PartHash::Following(follower) = &self.hashes[index] {
            follower.written(covered);
        }
    }

    fn dispatch(&mut self) {
        for index in self.ready.drain(..) {
            let (start, end) = self.parts[index];
            let (engine, file, algorithm) = (Arc::clone(&self.engine), Arc::clone(&self.file), self.checksum.algorithm);
            self.tasks.spawn(async move {
                (index, readback::part_digest(&engine.md5, &file, start, end - start, algorithm).await)
            });
        }
    }

    /// The checksum of the parts' checksums, once every part is hashed.
    async fn finish(mut self) -> io::Result<Integrity> {
        if let Some(error) = self.failed.take() {
            return Err(error);
        }
        // An empty part has no byte whose write would start its follower.
        for index in 0..self.parts.len() {
            let (start, end) = self.parts[index];
            if start == end && self.lanes.is_some() {
                self.follow(index, 0);
            }
        }
        self.dispatch();
        let mut digests = vec![Vec::new(); self.parts.len()];
        for (index, hash) in std::mem::take(&mut self.hashes).into_iter().enumerate() {
            match hash {
                PartHash::Waiting => return Err(io::Error::other("a part was never completely written")),
                PartHash::Following(follower) => digests[index] = follower.finish().await?.to_vec(),
                PartHash::Taken => {}
            }
        }
        while let Some(joined) = self.tasks.join_next().await {
            let (index, digest) = joined.map_err(io::Error::other)?;
            digests[index] = digest?;
        }
        Ok(readback::of_parts(self.checksum.algorithm, &digests, self.checksum.parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;
    use crate::store::memory::MemoryStore;
    use crate::transfer::TransferConfig;
    use md5::{Digest as _, Md5};
    use std::os::unix::fs::FileExt as _;

    fn engine() -> Arc<Engine> {
        let store = Arc::new(MemoryStore::default());
        Engine::new(store as _, TransferConfig::default(), Arc::new(Metrics::new())).unwrap()
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8).collect()
    }

    /// Writes `bytes` into a file in the pieces `cuts` makes, in the order
    /// `order` gives, telling `behind` of each piece as a range task does.
    fn land_out_of_order(bytes: &[u8], cuts: &[usize], order: &[usize], behind: &HashBehind, file: &File) {
        for &piece in order {
            let (start, end) = (cuts[piece], cuts[piece + 1]);
            file.write_all_at(&bytes[start..end], start as u64).unwrap();
            behind.written(start as u64, end as u64);
        }
    }

    // Pieces of odd sizes, across the hasher's 64 KiB chunks and the parts'
    // boundaries, landing last-first, middle-first and in between.
    const CUTS: [usize; 9] = [0, 1, 65_535, 70_000, 200_001, 262_144, 300_000, 500_000, 524_291];
    const ORDER: [usize; 8] = [7, 3, 5, 0, 6, 2, 4, 1];

    #[tokio::test]
    async fn an_md5_behind_ranges_that_land_out_of_order_is_the_md5_of_the_bytes() {
        let engine = engine();
        let bytes = data(CUTS[8]);
        let file = Arc::new(tempfile::tempfile().unwrap());
        let behind = HashBehind::md5(&engine, &file, bytes.len() as u64).unwrap();
        assert!(behind.in_order());
        assert_eq!(engine.md5.following(), 1);
        land_out_of_order(&bytes, &CUTS, &ORDER, &behind, &file);
        let expected = Integrity::Whole(StoredChecksum::Md5(Md5::digest(&bytes).into()));
        assert_eq!(behind.finish().await.unwrap(), expected);
        assert_eq!(engine.md5.following(), 0, "a finished download leaves the count");
    }

    #[tokio::test]
    async fn md5_parts_behind_ranges_that_land_out_of_order_are_the_multipart_etag() {
        let engine = engine();
        let bytes = data(CUTS[8]);
        // Parts of 131,072 bytes and a shorter last one; the pieces cut them.
        let layout = [131_072, 131_072, 131_072, 131_075];
        let expected = {
            let mut at = 0;
            let digests: Vec<Vec<u8>> = layout
                .iter()
                .map(|&len| {
                    at += len;
                    Md5::digest(&bytes[at - len..at]).to_vec()
                })
                .collect();
            readback::of_parts(PartAlgorithm::Md5, &digests, 4)
        };
        let checksum = match &expected {
            Integrity::Parts(parts) => parts.clone(),
            Integrity::Whole(_) => unreachable!(),
        };
        let layout: Vec<u64> = layout.iter().map(|&len| len as u64).collect();
        let file = Arc::new(tempfile::tempfile().unwrap());
        let behind = HashBehind::parts(&engine, &file, checksum.clone(), &layout);
        assert!(behind.in_order(), "MD5 parts share the lanes");
        land_out_of_order(&bytes, &CUTS, &ORDER, &behind, &file);
        assert_eq!(behind.finish().await.unwrap(), expected);

        // One piece never written: an error, not a checksum of what is there.
        let file = Arc::new(tempfile::tempfile().unwrap());
        let behind = HashBehind::parts(&engine, &file, checksum, &layout);
        land_out_of_order(&bytes, &CUTS, &ORDER[1..], &behind, &file);
        assert!(behind.finish().await.is_err());
    }

    #[tokio::test]
    async fn sha_parts_are_hashed_once_complete_whatever_the_order() {
        let engine = engine();
        let bytes = data(CUTS[8]);
        let layout = [262_144u64, 262_147];
        let digests: Vec<Vec<u8>> =
            [&bytes[..262_144], &bytes[262_144..]].iter().map(|part| sha2::Sha256::digest(part).to_vec()).collect();
        let expected = readback::of_parts(PartAlgorithm::Sha256, &digests, 2);
        let Integrity::Parts(checksum) = expected.clone() else { unreachable!() };
        let file = Arc::new(tempfile::tempfile().unwrap());
        let behind = HashBehind::parts(&engine, &file, checksum, &layout);
        assert!(!behind.in_order(), "only MD5 shares the lanes");
        land_out_of_order(&bytes, &CUTS, &ORDER, &behind, &file);
        assert_eq!(behind.finish().await.unwrap(), expected);
    }

    #[test]
    fn written_spans_merge_where_they_touch_or_overlap() {
        let mut written = Written::default();
        assert_eq!(written.add(10, 20), (10, 20));
        assert_eq!(written.prefix(), 0);
        assert_eq!(written.add(30, 40), (30, 40));
        // Touching on the left, overlapping on the right: one span.
        assert_eq!(written.add(20, 32), (10, 40));
        assert_eq!(written.add(0, 5), (0, 5));
        assert_eq!(written.prefix(), 5);
        // Inside an existing span: nothing changes.
        assert_eq!(written.add(12, 15), (10, 40));
        assert_eq!(written.add(5, 10), (0, 40));
        assert_eq!(written.prefix(), 40);
        assert_eq!(written.spans.len(), 1);
        // A span that swallows several.
        assert_eq!(written.add(50, 60), (50, 60));
        assert_eq!(written.add(70, 80), (70, 80));
        assert_eq!(written.add(45, 90), (45, 90));
        assert_eq!(written.spans, BTreeMap::from([(0, 40), (45, 90)]));
    }
}
