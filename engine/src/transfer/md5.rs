//! MD5 of downloaded files, many files at a time.
//!
//! MD5 is the only checksum S3 keeps for an object uploaded in one PUT
//! without a checksum header (its ETag is the MD5), so verifying such an
//! object means hashing every byte with it. One MD5 stream is a chain of
//! dependent 64-byte blocks: the best scalar code runs at about 0.7 GB/s,
//! 1.5 CPU seconds per GiB. Measured on a 2-core machine pulling 8 MiB
//! objects, that was four fifths of Ferry's CPU and made the pull three times
//! slower than a size-only check. Different files are independent chains,
//! though, so one SIMD register can advance 8 (AVX2) or 16 (AVX-512) of them
//! at once: `md5-many` does that, picked at run time for the CPU, several
//! times faster per core than one stream.
//!
//! So a file whose checksum is an MD5 is hashed from the page cache as it is
//! written (a copy, a tenth of MD5's cost), by a hasher thread that advances
//! up to [`LANES`] files together, chunk by chunk. A file fetched as
//! concurrent ranges is followed: the thread hashes it as far as the ranges
//! have landed in order, so the hash keeps pace with the download instead of
//! starting after it, and nothing is held in memory for it (ranges that land
//! ahead wait on disk for the ones before). It also hashes the bytes as they
//! are on disk, not as they arrived. Not for small objects, which are received into memory and
//! MD5-hashed as they stream past (see `pull.rs`), nor for CRCs: those are
//! cheap, computed as bytes stream past and combined across ranges (see
//! `verify.rs`).
//!
//! Lanes pay only when several are busy: one SIMD round costs the same for
//! one message as for sixteen, so files still being written wait a little
//! for one another to fill a round, and a round with fewer than
//! [`SIMD_FROM`] messages runs the single-stream code instead. Profiled on
//! 10,000 × 64 KiB, when those still came here, the lanes' kernel was 12%
//! of the pull's CPU with mostly one or two files per round.
//!
//! A bug in the hasher could only make good files fail verification (and be
//! downloaded again, then reported), never let a bad file pass: that would
//! need it to produce exactly the stored MD5 for different bytes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use std::time::{Duration, Instant};

use md5_many::{Md5Many, Md5State};
use tokio::sync::oneshot;

use super::tally::VerifyMeter;

/// Files one hasher thread advances together: AVX-512's 16 lanes twice over,
/// which md5-many interleaves for instruction-level parallelism.
pub const LANES: usize = 32;
/// Bytes read per file per round. `LANES` of them are the thread's only
/// buffers (2 MiB), which come out of the engine's reserve.
const CHUNK: usize = 64 << 10;
/// Rounds with fewer messages than this hash each one with the scalar code.
const SIMD_FROM: usize = 2;
/// Messages md5-many's fast kernel takes at once: AVX-512's 16 lanes (two
/// rounds of AVX2's 8, four of NEON's 4). [`LANES`] is two groups.
const GROUP: usize = 16;
/// How long files still being written wait for others to fill a round:
/// on the benchmark's 16 × 64 MiB single-part objects, rounds of a few
/// files each spent 0.5 to 0.9 CPU seconds a GiB, against 0.23 for full
/// ones; a wait of 20 ms left the pull 45% slower than `--verify size`,
/// one of 60 ms 30%.
const GATHER: Duration = Duration::from_millis(60);

/// One file to hash.
struct Job {
    file: Arc<File>,
    /// Where the bytes to hash begin in the file.
    start: u64,
    len: u64,
    /// For a file still being written: how many bytes from `start` are in
    /// it so far. `None`: all `len` are.
    written: Option<Arc<AtomicU64>>,
    done: Answer,
}

/// Where a job's digest goes, and where it is awaited.
type Answer = oneshot::Sender<io::Result<[u8; 16]>>;
type Answered = oneshot::Receiver<io::Result<[u8; 16]>>;

/// What a hasher thread is told.
enum Message {
    /// Hash this.
    Hash(Job),
    /// A followed file grew, or its follower was dropped: look again.
    Moved,
}

/// The hasher threads, started on first use (a push or a pull of objects
/// with CRCs never needs them).
#[derive(Debug, Default)]
pub struct Md5Hasher {
    threads: OnceLock<Vec<mpsc::Sender<Message>>>,
    next: AtomicUsize,
    /// Where the threads count their time and the bytes they read back.
    meter: Arc<VerifyMeter>,
    /// Downloads hashed behind now (see [`Md5Hasher::following`]).
    following: Arc<AtomicUsize>,
}

impl Md5Hasher {
    /// A hasher whose cost is counted in `meter` (a run's, for its summary).
    pub fn metered(meter: Arc<VerifyMeter>) -> Self {
        Self { meter, ..Self::default() }
    }

    /// Where this hasher's cost is counted.
    pub fn meter(&self) -> &Arc<VerifyMeter> {
        &self.meter
    }

    /// How many downloads are hashed behind now (each holds a
    /// [`LaneShare`]): they share the lanes, which fill best when each of
    /// them lands in order.
    pub fn following(&self) -> usize {
        self.following.load(Ordering::Relaxed)
    }

    /// Counts a download as hashed behind until the share is dropped.
    pub fn share(&self) -> LaneShare {
        self.following.fetch_add(1, Ordering::Relaxed);
        LaneShare(Arc::clone(&self.following))
    }

    /// MD5 of the first `len` bytes of `file`.
    ///
    /// # Errors
    /// Read errors (including a file shorter than `len`), or a hasher thread
    /// that is gone.
    pub async fn digest(&self, file: Arc<File>, len: u64) -> io::Result<[u8; 16]> {
        self.digest_range(file, 0, len).await
    }

    /// MD5 of the `len` bytes of `file` from `start`. The parts of one
    /// multipart object are independent MD5s, so they share the lanes as
    /// different files do.
    ///
    /// # Errors
    /// As [`Md5Hasher::digest`].
    pub async fn digest_range(&self, file: Arc<File>, start: u64, len: u64) -> io::Result<[u8; 16]> {
        let (_, result) = self.submit(|done| Job { file, start, len, written: None, done })?;
        result.await.map_err(|_| gone())?
    }

    /// Hashes the first `len` bytes of a file that is still being written,
    /// as far as [`Md5Follower::written`] says it is, so that the hash keeps
    /// pace with the download instead of starting after it: an object
    /// fetched as concurrent ranges is hashed in passing wherever the ranges
    /// before have landed, in the same lanes as every other file.
    ///
    /// # Errors
    /// A hasher thread that is gone.
    pub fn follow(&self, file: Arc<File>, len: u64) -> io::Result<Md5Follower> {
        self.follow_range(file, 0, len)
    }

    /// [`Md5Hasher::follow`] for the `len` bytes from `start` (a part of a
    /// multipart object, which is a message of its own); what is written is
    /// counted from `start`.
    ///
    /// # Errors
    /// A hasher thread that is gone.
    pub fn follow_range(&self, file: Arc<File>, start: u64, len: u64) -> io::Result<Md5Follower> {
        let written = Arc::new(AtomicU64::new(0));
        let shared = Arc::clone(&written);
        let (thread, result) = self.submit(|done| Job { file, start, len, written: Some(shared), done })?;
        Ok(Md5Follower { written, len, thread, result: Some(result), _share: self.share() })
    }

    /// Hands a job to a hasher thread: the thread, and the answer to await.
    fn submit(&self, job: impl FnOnce(Answer) -> Job) -> io::Result<(mpsc::Sender<Message>, Answered)> {
        let threads = self.threads.get_or_init(|| spawn_threads(&self.meter));
        // Round robin: files are alike enough that this balances.
        let thread = &threads[self.next.fetch_add(1, Ordering::Relaxed) % threads.len()];
        let (done, result) = oneshot::channel();
        thread.send(Message::Hash(job(done))).map_err(|_| gone())?;
        Ok((thread.clone(), result))
    }
}

fn gone() -> io::Error {
    io::Error::other("the MD5 hasher thread stopped")
}

/// A file being hashed while it is written (see [`Md5Hasher::follow`]).
/// Dropped before [`Md5Follower::finish`], the hash is abandoned.
#[derive(Debug)]
pub struct Md5Follower {
    written: Arc<AtomicU64>,
    len: u64,
    thread: mpsc::Sender<Message>,
    result: Option<Answered>,
    _share: LaneShare,
}

/// One download in [`Md5Hasher::following`]'s count, until dropped.
#[derive(Debug)]
pub struct LaneShare(Arc<AtomicUsize>);

impl Drop for LaneShare {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Md5Follower {
    /// The first `until` bytes of the file are written: the hasher may read
    /// them. Never moves back.
    pub fn written(&self, until: u64) {
        let until = until.min(self.len);
        if self.written.fetch_max(until, Ordering::AcqRel) < until {
            let _ = self.thread.send(Message::Moved);
        }
    }

    /// The MD5 of the file's `len` bytes, once they are all written and hashed.
    ///
    /// # Errors
    /// Read errors, a hasher thread that is gone, or a file never written
    /// to its end.
    pub async fn finish(mut self) -> io::Result<[u8; 16]> {
        if self.written.load(Ordering::Acquire) < self.len {
            return Err(io::Error::other("the file was never completely written"));
        }
        let result = self.result.take().expect("taken only here");
        result.await.map_err(|_| gone())?
    }
}

impl Drop for Md5Follower {
    fn drop(&mut self) {
        // The answer's receiver goes first, so the thread, woken, sees the
        // job abandoned and lets it go.
        if self.result.take().is_some() {
            let _ = self.thread.send(Message::Moved);
        }
    }
}

/// One thread per 8 cores: with SIMD lanes one thread hashes several GB/s,
/// so a small machine needs one, and a large one with a fast network still
/// does not wait for MD5.
fn spawn_threads(meter: &Arc<VerifyMeter>) -> Vec<mpsc::Sender<Message>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..cores.div_ceil(8))
        .map(|i| {
            let (jobs, queue) = mpsc::channel();
            let meter = Arc::clone(meter);
            std::thread::Builder::new()
                .name(format!("ferry-md5-{i}"))
                .spawn(move || hash_files(&queue, &meter))
                .expect("cannot start an MD5 hasher thread");
            jobs
        })
        .collect()
}

/// A file being hashed.
struct Lane {
    job: Job,
    state: Md5State,
    /// Bytes hashed so far.
    offset: u64,
}

impl Lane {
    /// How many bytes from `offset` can be read now.
    fn readable(&self) -> u64 {
        let written = self.job.written.as_ref().map_or(self.job.len, |w| w.load(Ordering::Acquire).min(self.job.len));
        written - self.offset
    }

    /// Whether a round can take this file: it has a whole chunk to read,
    /// or it is complete and has its last bytes to read, or none (an empty
    /// file, answered in the round). A file still being written waits for
    /// a whole chunk, so every message in the lanes is a chunk long.
    fn can_advance(&self) -> bool {
        let readable = self.readable();
        readable >= CHUNK as u64 || (self.awaited() && (readable > 0 || self.offset == self.job.len))
    }

    /// Whether the file is complete, so its digest is (or is about to be)
    /// awaited: a followed file written to its end, or any other.
    fn awaited(&self) -> bool {
        self.job.written.as_ref().is_none_or(|written| written.load(Ordering::Acquire) >= self.job.len)
    }
}

/// The thread: takes in every job queued, and in each round reads the next
/// chunk of up to [`LANES`] files that have bytes to hash and advances them
/// together. Files still being written wait, without a lane, until they
/// grow; the thread sleeps when no file can advance. Ends when the engine
/// and every follower are gone.
///
/// Long on purpose: the loop and the state it keeps across rounds (lanes,
/// buffers, the partial round's timer) are one unit; split, that state
/// would be handed to a helper and back every round.
fn hash_files(queue: &mpsc::Receiver<Message>, meter: &VerifyMeter) {
    let engine = Md5Many::new();
    let mut lanes: Vec<Lane> = Vec::new();
    let mut buffers: Vec<Vec<u8>> = (0..LANES).map(|_| Vec::with_capacity(CHUNK)).collect();
    let mut states: Vec<Md5State> = Vec::with_capacity(LANES);
    let take = |message, lanes: &mut Vec<Lane>| {
        if let Message::Hash(job) = message {
            lanes.push(Lane { job, state: Md5State::new(), offset: 0 });
        }
    };
    // When a partial round may go ahead (see below).
    let mut gathering: Option<Instant> = None;
    loop {
        // A job whose caller gave up (its task was cancelled, its follower
        // dropped) leaves.
        lanes.retain(|lane| !lane.job.done.is_closed());
        let ready = lanes.iter().filter(|lane| lane.can_advance()).count();
        if ready == 0 {
            match queue.recv() {
                Ok(message) => take(message, &mut lanes),
                Err(mpsc::RecvError) => return,
            }
            continue;
        }
        // A round costs the same for one file as for a group of them, and
        // hashing keeps ahead of a download: files still being written wait
        // for one another to fill a group, unless a digest is awaited now
        // (a complete file) or nothing else could join. A partial round goes
        // ahead at most every `GATHER`, so that followed files still make
        // progress; whatever is left when they complete is hashed at once.
        let awaited = lanes.iter().any(|lane| lane.can_advance() && lane.awaited());
        let more_coming = lanes.iter().any(|lane| !lane.can_advance() && !lane.awaited());
        if ready < GROUP && !awaited && more_coming {
            let until = *gathering.get_or_insert_with(|| Instant::now() + GATHER);
            let left = until.saturating_duration_since(Instant::now());
            if !left.is_zero()
                && let Ok(message) = queue.recv_timeout(left)
            {
                take(message, &mut lanes);
                continue;
            }
        }
        gathering = None;
        while let Ok(message) = queue.try_recv() {
            take(message, &mut lanes);
        }

        let started = Instant::now();
        // This round's files: the first with bytes to read, each given its
        // next chunk; a file that cannot be read is answered with the error
        // and leaves. Whole groups when there are enough files: a round of
        // 20 would be padded to 32, with 12 lanes hashing copies, where one
        // of 16 wastes none and the other 4 go next.
        let size = match ready {
            ready if ready >= 2 * GROUP => 2 * GROUP,
            ready if ready >= GROUP => GROUP,
            ready => ready,
        };
        let mut round: Vec<usize> = Vec::with_capacity(LANES);
        let mut failed = Vec::new();
        for (index, lane) in lanes.iter().enumerate() {
            if round.len() == size {
                break;
            }
            if !lane.can_advance() {
                continue;
            }
            let readable = lane.readable();
            let buffer = &mut buffers[round.len()];
            buffer.resize(usize::try_from(readable).map_or(CHUNK, |readable| readable.min(CHUNK)), 0);
            match lane.job.file.read_exact_at(buffer, lane.job.start + lane.offset) {
                Ok(()) => round.push(index),
                Err(error) => failed.push((index, error)),
            }
        }

        // Whole chunks go to the lanes together, a file's last bytes (less
        // than a chunk) through the scalar code.
        let (whole, last): (Vec<usize>, Vec<usize>) = (0..round.len()).partition(|&at| buffers[at].len() == CHUNK);
        if whole.len() < SIMD_FROM {
            for &at in whole.iter().chain(&last) {
                lanes[round[at]].state.update(&buffers[at]);
            }
        } else {
            // md5-many's fast kernel takes exactly one or two SIMD groups of
            // equal, block-aligned messages; any other count goes through
            // its general path, which profiled slower than the scalar code.
            // So a round is filled up to a group with copies of its first
            // message, whose digests are dropped: a round of 5 files costs
            // what one of 16 does, not five scalar passes.
            let width = if whole.len() <= GROUP { GROUP } else { 2 * GROUP };
            states.clear();
            states.extend(whole.iter().map(|&at| lanes[round[at]].state));
            states.resize(width, Md5State::new());
            let mut inputs: Vec<&[u8]> = whole.iter().map(|&at| buffers[at].as_slice()).collect();
            inputs.resize(width, buffers[whole[0]].as_slice());
            engine.update_many(&mut states, &inputs);
            for (&at, state) in whole.iter().zip(&states) {
                lanes[round[at]].state = *state;
            }
            for &at in &last {
                lanes[round[at]].state.update(&buffers[at]);
            }
        }
        for (&index, buffer) in round.iter().zip(&buffers) {
            lanes[index].offset += buffer.len() as u64;
            meter.read_back(buffer.len() as u64);
        }
        meter.spent(started.elapsed());

        // Answer the files that failed or are complete, highest index first
        // so the lower indices stay valid while removing. Lanes keep their
        // order otherwise: with more files to hash than lanes, the earliest
        // go first and reach their commit soonest.
        let mut leaving: Vec<(usize, Option<io::Error>)> = failed.into_iter().map(|(i, e)| (i, Some(e))).collect();
        leaving.extend(round.iter().filter(|&&i| lanes[i].offset == lanes[i].job.len).map(|&i| (i, None)));
        leaving.sort_by_key(|(index, _)| std::cmp::Reverse(*index));
        for (index, error) in leaving {
            let lane = lanes.remove(index);
            // The caller may have given up (its task was cancelled).
            let _ = lane.job.done.send(error.map_or_else(|| Ok(lane.state.finalize()), Err));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use md5::{Digest as _, Md5};
    use std::io::Write as _;

    fn file_with(data: &[u8]) -> Arc<File> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(data).unwrap();
        Arc::new(file)
    }

    fn data(seed: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 7).wrapping_add(seed) as u8).collect()
    }

    #[tokio::test]
    async fn many_files_of_mixed_sizes_hash_like_one_stream_md5() {
        let hasher = Md5Hasher::default();
        // Sizes around block and chunk boundaries, more files than lanes.
        let sizes = [0, 1, 55, 56, 63, 64, 65, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17, 1 << 20];
        let files: Vec<Vec<u8>> = (0..3 * LANES).map(|i| data(i, sizes[i % sizes.len()])).collect();
        let digests =
            futures::future::join_all(files.iter().map(|bytes| hasher.digest(file_with(bytes), bytes.len() as u64)))
                .await;
        for (bytes, digest) in files.iter().zip(digests) {
            let expected: [u8; 16] = Md5::digest(bytes).into();
            assert_eq!(digest.unwrap(), expected, "{} bytes", bytes.len());
        }
    }

    #[tokio::test]
    async fn ranges_of_one_file_hash_like_their_bytes() {
        let hasher = Md5Hasher::default();
        let bytes = data(7, 5 * CHUNK + 3);
        let file = file_with(&bytes);
        let cuts = [0, 1, CHUNK - 1, 2 * CHUNK + 5, 5 * CHUNK + 3];
        let digests = futures::future::join_all(
            cuts.windows(2).map(|w| hasher.digest_range(Arc::clone(&file), w[0] as u64, (w[1] - w[0]) as u64)),
        )
        .await;
        for (w, digest) in cuts.windows(2).zip(digests) {
            assert_eq!(digest.unwrap(), <[u8; 16]>::from(Md5::digest(&bytes[w[0]..w[1]])));
        }
    }

    #[tokio::test]
    async fn a_file_written_out_of_order_hashes_as_its_prefix_grows() {
        let hasher = Md5Hasher::default();
        let bytes = data(3, 7 * CHUNK + 11);
        let file = Arc::new(tempfile::tempfile().unwrap());
        file.set_len(bytes.len() as u64).unwrap();
        let follower = hasher.follow(Arc::clone(&file), bytes.len() as u64).unwrap();
        // Pieces land out of order, of sizes that cut chunks and blocks; the
        // follower is told only the prefix that is complete.
        let cuts = [0, 1, CHUNK + 5, 2 * CHUNK, 4 * CHUNK + 63, 7 * CHUNK + 11];
        let mut landed = vec![false; cuts.len() - 1];
        for piece in [3, 1, 4, 0, 2] {
            file.write_all_at(&bytes[cuts[piece]..cuts[piece + 1]], cuts[piece] as u64).unwrap();
            landed[piece] = true;
            let prefix = landed.iter().take_while(|&&l| l).count();
            follower.written(cuts[prefix] as u64);
            // Let the thread read what it may while the rest is unwritten.
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(follower.finish().await.unwrap(), <[u8; 16]>::from(Md5::digest(&bytes)));
    }

    #[tokio::test]
    async fn a_followed_file_that_waits_holds_up_no_other_file() {
        let hasher = Md5Hasher::default();
        let waiting = hasher.follow(file_with(&data(1, CHUNK)), CHUNK as u64).unwrap();
        waiting.written(10);
        let bytes = data(2, 3 * CHUNK);
        let digest = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            hasher.digest(file_with(&bytes), bytes.len() as u64),
        )
        .await
        .expect("a complete file is hashed while another waits");
        assert_eq!(digest.unwrap(), <[u8; 16]>::from(Md5::digest(&bytes)));
        // Abandoned half-way, it leaves; one never completely written is an
        // error, not a digest of what was there.
        drop(waiting);
        let short = hasher.follow(file_with(&bytes), bytes.len() as u64).unwrap();
        short.written(CHUNK as u64);
        assert!(short.finish().await.is_err());
        let after = hasher.digest(file_with(b"hello world"), 11).await.unwrap();
        assert_eq!(after, <[u8; 16]>::from(Md5::digest(b"hello world")));
    }

    #[tokio::test]
    async fn a_file_shorter_than_announced_is_an_error_not_a_digest() {
        let hasher = Md5Hasher::default();
        let error = hasher.digest(file_with(b"short"), 100).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        // The thread carries on with the next file.
        let digest = hasher.digest(file_with(b"hello world"), 11).await.unwrap();
        assert_eq!(digest, <[u8; 16]>::from(Md5::digest(b"hello world")));
    }
}
