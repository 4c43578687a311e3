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
//! So a file whose checksum is an MD5 is hashed once it is written, read back
//! from the page cache (a copy, a tenth of MD5's cost), by a hasher thread
//! that takes up to [`LANES`] files at once and advances them together, chunk
//! by chunk. It also hashes the bytes as they are on disk, not as they
//! arrived. Not for small objects, which are received into memory and
//! MD5-hashed as they stream past (see `pull.rs`), nor for CRCs: those are
//! cheap, computed as bytes stream past and combined across ranges (see
//! `verify.rs`).
//!
//! Lanes pay only when several are busy: one SIMD round costs the same for
//! one message as for sixteen, so a round with fewer than [`SIMD_FROM`]
//! messages (files finishing one by one) runs the single-stream code
//! instead. Profiled on 10,000 × 64 KiB, when those still came here, the
//! lanes' kernel was 12% of the pull's CPU with mostly one or two files per
//! round.
//!
//! A bug in the hasher could only make good files fail verification (and be
//! downloaded again, then reported), never let a bad file pass: that would
//! need it to produce exactly the stored MD5 for different bytes.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, mpsc};

use md5_many::{Md5Many, Md5State};
use tokio::sync::oneshot;

/// Files one hasher thread advances together: AVX-512's 16 lanes twice over,
/// which md5-many interleaves for instruction-level parallelism.
pub const LANES: usize = 32;
/// Bytes read per file per round. `LANES` of them are the thread's only
/// buffers (2 MiB), which come out of the engine's reserve.
const CHUNK: usize = 64 << 10;
/// Rounds with fewer messages than this hash each one with the scalar code.
const SIMD_FROM: usize = 4;

/// One file to hash.
struct Job {
    file: Arc<File>,
    /// Where the bytes to hash begin in the file.
    start: u64,
    len: u64,
    done: oneshot::Sender<io::Result<[u8; 16]>>,
}

/// The hasher threads, started on first use (a push or a pull of objects
/// with CRCs never needs them).
#[derive(Debug, Default)]
pub struct Md5Hasher {
    threads: OnceLock<Vec<mpsc::Sender<Job>>>,
    next: AtomicUsize,
}

impl Md5Hasher {
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
        let threads = self.threads.get_or_init(spawn_threads);
        // Round robin: files are alike enough that this balances.
        let thread = &threads[self.next.fetch_add(1, Ordering::Relaxed) % threads.len()];
        let (done, result) = oneshot::channel();
        let gone = || io::Error::other("the MD5 hasher thread stopped");
        thread.send(Job { file, start, len, done }).map_err(|_| gone())?;
        result.await.map_err(|_| gone())?
    }
}

/// One thread per 8 cores: with SIMD lanes one thread hashes several GB/s,
/// so a small machine needs one, and a large one with a fast network still
/// does not wait for MD5.
fn spawn_threads() -> Vec<mpsc::Sender<Job>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (0..cores.div_ceil(8))
        .map(|i| {
            let (jobs, queue) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("ferry-md5-{i}"))
                .spawn(move || hash_files(&queue))
                .expect("cannot start an MD5 hasher thread");
            jobs
        })
        .collect()
}

/// A file being hashed.
struct Lane {
    job: Job,
    state: Md5State,
    offset: u64,
    buffer: Vec<u8>,
}

/// The thread: waits for a file when idle, otherwise takes in whatever has
/// queued up (to `LANES` files) between rounds, so files that finish
/// downloading together are hashed together. Ends when the engine is gone.
fn hash_files(queue: &mpsc::Receiver<Job>) {
    let engine = Md5Many::new();
    let mut lanes: Vec<Lane> = Vec::with_capacity(LANES);
    let mut states: Vec<Md5State> = Vec::with_capacity(LANES);
    let new_lane = |job| Lane { job, state: Md5State::new(), offset: 0, buffer: Vec::with_capacity(CHUNK) };
    loop {
        if lanes.is_empty() {
            match queue.recv() {
                Ok(job) => lanes.push(new_lane(job)),
                Err(mpsc::RecvError) => return,
            }
        }
        while lanes.len() < LANES {
            match queue.try_recv() {
                Ok(job) => lanes.push(new_lane(job)),
                Err(_) => break,
            }
        }

        // Read the next chunk of every file; a file that cannot be read is
        // answered with the error and leaves.
        let mut failed = Vec::new();
        for (index, lane) in lanes.iter_mut().enumerate() {
            let left = lane.job.len - lane.offset;
            lane.buffer.resize(usize::try_from(left).map_or(CHUNK, |left| left.min(CHUNK)), 0);
            if let Err(error) = lane.job.file.read_exact_at(&mut lane.buffer, lane.job.start + lane.offset) {
                failed.push((index, error));
            }
        }
        // Highest index first, so the lower indices stay valid while removing.
        for (index, error) in failed.into_iter().rev() {
            let _ = lanes.swap_remove(index).job.done.send(Err(error));
        }

        if lanes.len() < SIMD_FROM {
            for lane in &mut lanes {
                lane.state.update(&lane.buffer);
            }
        } else {
            states.clear();
            states.extend(lanes.iter().map(|lane| lane.state));
            let inputs: Vec<&[u8]> = lanes.iter().map(|lane| lane.buffer.as_slice()).collect();
            engine.update_many(&mut states, &inputs);
            for (lane, state) in lanes.iter_mut().zip(&states) {
                lane.state = *state;
            }
        }

        let mut finished = Vec::new();
        for (index, lane) in lanes.iter_mut().enumerate() {
            lane.offset += lane.buffer.len() as u64;
            if lane.offset == lane.job.len {
                finished.push(index);
            }
        }
        for index in finished.into_iter().rev() {
            let lane = lanes.swap_remove(index);
            // The caller may have given up (its task was cancelled).
            let _ = lane.job.done.send(Ok(lane.state.finalize()));
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
    async fn a_file_shorter_than_announced_is_an_error_not_a_digest() {
        let hasher = Md5Hasher::default();
        let error = hasher.digest(file_with(b"short"), 100).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        // The thread carries on with the next file.
        let digest = hasher.digest(file_with(b"hello world"), 11).await.unwrap();
        assert_eq!(digest, <[u8; 16]>::from(Md5::digest(b"hello world")));
    }
}
