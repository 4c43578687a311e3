//! Checksums that cannot be computed range by range as bytes stream past,
//! computed over the received object once it is complete: SHAs of
//! single-part objects, and checksums of per-part checksums (S3's composite
//! checksums and multipart ETags).
//!
//! A checksum of per-part checksums is `H(H(part 1) ‖ H(part 2) ‖ …)`, so
//! checking one needs the part boundaries the uploader chose. They are not
//! in the listing, and ranges are cut without regard to them, so the parts
//! are hashed from the received bytes (a read from the page cache, a tenth
//! of a hash's cost) once their sizes are known (one HEAD with `partNumber`
//! per part, see `pull.rs`). MD5 parts of a file go to the SIMD hasher as
//! independent messages, as different files do (`md5.rs`); the others are
//! hashed on a blocking thread.
//!
//! A mistake here can only make a good object fail (and be downloaded again,
//! then reported), never let a bad one pass: that would need the bytes to
//! hash to exactly the stored value.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use bytes::Bytes;
use md5::Digest as _;

use super::md5::Md5Hasher;
use super::tally::VerifyMeter;
use crate::store::{Integrity, PartAlgorithm, PartsChecksum, StoredChecksum};

/// Bytes read per step from a file being hashed.
const CHUNK: usize = 1 << 20;

/// A complete object's bytes, where they were received.
#[derive(Clone, Copy, Debug)]
pub enum Received<'a> {
    /// In a file, from offset 0.
    File(&'a Arc<File>),
    /// In memory, in order.
    Memory(&'a [Bytes]),
}

/// What the received bytes hash to, in the form of `expected`: a SHA of the
/// whole, or the checksum of the parts' checksums for the part sizes
/// `layout` (which must add up to the object's size). `None` for a kind this
/// module does not compute (CRCs and whole MD5s are checked elsewhere).
///
/// # Errors
/// Reading the file failed.
pub async fn digest(
    md5: &Md5Hasher,
    received: Received<'_>,
    expected: &Integrity,
    layout: &[u64],
) -> io::Result<Option<Integrity>> {
    match expected {
        Integrity::Whole(StoredChecksum::Sha1(_)) => {
            let hash = hash_range(received, 0, layout.iter().sum(), PartAlgorithm::Sha1.into(), md5.meter()).await?;
            Ok(hash.try_into().ok().map(|d| Integrity::Whole(StoredChecksum::Sha1(d))))
        }
        Integrity::Whole(StoredChecksum::Sha256(_)) => {
            let hash = hash_range(received, 0, layout.iter().sum(), PartAlgorithm::Sha256.into(), md5.meter()).await?;
            Ok(hash.try_into().ok().map(|d| Integrity::Whole(StoredChecksum::Sha256(d))))
        }
        Integrity::Whole(StoredChecksum::GitBlob(_)) => {
            let size = layout.iter().sum();
            let hash = hash_range(received, 0, size, Hasher::git_blob(size), md5.meter()).await?;
            Ok(hash.try_into().ok().map(|d| Integrity::Whole(StoredChecksum::GitBlob(d))))
        }
        Integrity::Whole(_) => Ok(None),
        Integrity::Parts(PartsChecksum { algorithm: PartAlgorithm::Md5, parts, .. })
            if matches!(received, Received::Memory([_])) =>
        {
            // One contiguous buffer (an object read into memory): its MD5
            // parts are independent messages, hashed together in SIMD lanes
            // on a blocking thread rather than one by one on the runtime.
            let Received::Memory([whole]) = received else { unreachable!("matched above") };
            let (whole, layout, meter) = (whole.clone(), layout.to_vec(), Arc::clone(md5.meter()));
            let digests = tokio::task::spawn_blocking(move || meter.time(|| md5_of_parts(&whole, &layout)))
                .await
                .expect("hashing parts panicked");
            Ok(Some(of_parts(PartAlgorithm::Md5, &digests, *parts)))
        }
        Integrity::Parts(PartsChecksum { algorithm, parts, .. }) => {
            let offsets = layout.iter().scan(0u64, |offset, len| {
                let start = *offset;
                *offset += len;
                Some((start, *len))
            });
            let hashes = offsets.map(|(start, len)| async move {
                match received {
                    Received::File(file) => part_digest(md5, file, start, len, *algorithm).await,
                    Received::Memory(_) => hash_range(received, start, len, (*algorithm).into(), md5.meter()).await,
                }
            });
            let part_digests = futures::future::try_join_all(hashes).await?;
            Ok(Some(of_parts(*algorithm, &part_digests, *parts)))
        }
    }
}

/// The MD5 of each part of `whole`, the parts `layout` long in order
/// (which must add up to at most its length).
fn md5_of_parts(whole: &[u8], layout: &[u64]) -> Vec<Vec<u8>> {
    let mut parts = Vec::with_capacity(layout.len());
    let mut start = 0usize;
    for len in layout {
        let end = start + *len as usize;
        parts.push(&whole[start..end]);
        start = end;
    }
    let mut digests = vec![[0u8; 16]; parts.len()];
    md5_many::md5_many(&parts, &mut digests);
    digests.into_iter().map(|d| d.to_vec()).collect()
}

/// The checksum of per-part checksums, from the parts' checksums in order.
pub fn of_parts(algorithm: PartAlgorithm, part_digests: &[Vec<u8>], parts: u32) -> Integrity {
    Integrity::Parts(PartsChecksum { algorithm, digest: hash(algorithm, [part_digests.concat().as_slice()]), parts })
}

/// Hashes one part of a file as soon as it is written, so that hashing
/// overlaps the download of the parts after it (see `pull.rs`).
///
/// # Errors
/// Reading the file failed.
pub async fn part_digest(
    md5: &Md5Hasher,
    file: &Arc<File>,
    start: u64,
    len: u64,
    algorithm: PartAlgorithm,
) -> io::Result<Vec<u8>> {
    match algorithm {
        PartAlgorithm::Md5 => Ok(md5.digest_range(Arc::clone(file), start, len).await?.to_vec()),
        _ => hash_range(Received::File(file), start, len, algorithm.into(), md5.meter()).await,
    }
}

/// Hashes `len` bytes from `start` of what was received, its cost counted
/// in `meter`.
async fn hash_range(
    received: Received<'_>,
    start: u64,
    len: u64,
    mut hasher: Hasher,
    meter: &Arc<VerifyMeter>,
) -> io::Result<Vec<u8>> {
    match received {
        Received::Memory(chunks) => Ok(meter.time(|| {
            for piece in slices(chunks, start, len) {
                hasher.update(piece);
            }
            hasher.finish()
        })),
        Received::File(file) => {
            let (file, meter) = (Arc::clone(file), Arc::clone(meter));
            tokio::task::spawn_blocking(move || {
                meter.read_back(len);
                meter.time(|| hash_file_range(&file, start, len, hasher))
            })
            .await
            .expect("hashing a file panicked")
        }
    }
}

fn hash_file_range(file: &File, start: u64, len: u64, mut hasher: Hasher) -> io::Result<Vec<u8>> {
    let mut buffer = vec![0; len.min(CHUNK as u64) as usize];
    let mut done = 0u64;
    while done < len {
        let step = (len - done).min(buffer.len() as u64) as usize;
        file.read_exact_at(&mut buffer[..step], start + done)?;
        hasher.update(&buffer[..step]);
        done += step as u64;
    }
    Ok(hasher.finish())
}

/// The pieces of `chunks` (one object, in order) that cover `len` bytes from `start`.
fn slices(chunks: &[Bytes], start: u64, len: u64) -> impl Iterator<Item = &[u8]> {
    let end = start + len;
    chunks
        .iter()
        .scan(0u64, |offset, chunk| {
            let chunk_start = *offset;
            *offset += chunk.len() as u64;
            Some((chunk_start, chunk))
        })
        .filter_map(move |(chunk_start, chunk)| {
            let chunk_end = chunk_start + chunk.len() as u64;
            let (from, to) = (start.max(chunk_start), end.min(chunk_end));
            (from < to).then(|| &chunk[(from - chunk_start) as usize..(to - chunk_start) as usize])
        })
}

/// Hashes the concatenation of `pieces`; CRCs come out big-endian, as S3
/// writes them.
fn hash<'a>(algorithm: PartAlgorithm, pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut hasher = Hasher::new(algorithm);
    for piece in pieces {
        hasher.update(piece);
    }
    hasher.finish()
}

/// One running hash of any part algorithm, or of a git blob.
enum Hasher {
    Crc32c(u32),
    Crc32(crc32fast::Hasher),
    Sha1(sha1::Sha1),
    Sha256(sha2::Sha256),
    Md5(md5::Md5),
}

impl From<PartAlgorithm> for Hasher {
    fn from(algorithm: PartAlgorithm) -> Self {
        Hasher::new(algorithm)
    }
}

impl Hasher {
    fn new(algorithm: PartAlgorithm) -> Self {
        match algorithm {
            PartAlgorithm::Crc32c => Hasher::Crc32c(0),
            PartAlgorithm::Crc32 => Hasher::Crc32(crc32fast::Hasher::new()),
            PartAlgorithm::Sha1 => Hasher::Sha1(sha1::Sha1::new()),
            PartAlgorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
            PartAlgorithm::Md5 => Hasher::Md5(md5::Md5::new()),
        }
    }

    /// A SHA-1 that has taken git's header for a blob of `size` bytes, so
    /// that the content makes it the blob's id.
    fn git_blob(size: u64) -> Self {
        let mut sha1 = sha1::Sha1::new();
        sha1.update(format!("blob {size}\0").as_bytes());
        Hasher::Sha1(sha1)
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, bytes),
            Hasher::Crc32(h) => h.update(bytes),
            Hasher::Sha1(h) => h.update(bytes),
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Md5(h) => h.update(bytes),
        }
    }

    fn finish(self) -> Vec<u8> {
        match self {
            Hasher::Crc32c(crc) => crc.to_be_bytes().to_vec(),
            Hasher::Crc32(h) => h.finalize().to_be_bytes().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Md5(h) => h.finalize().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(2_654_435_761) >> 5) as u8).collect()
    }

    fn parts_of(algorithm: PartAlgorithm, data: &[u8], layout: &[u64]) -> PartsChecksum {
        let mut offset = 0;
        let mut concatenated = Vec::new();
        for len in layout {
            concatenated.extend(hash(algorithm, [&data[offset..offset + *len as usize]]));
            offset += *len as usize;
        }
        PartsChecksum { algorithm, digest: hash(algorithm, [concatenated.as_slice()]), parts: layout.len() as u32 }
    }

    /// The multipart ETag of a known upload, computed independently: two
    /// parts "hello " and "world".
    #[test]
    fn a_multipart_etag_is_the_md5_of_the_parts_md5s() {
        let parts = parts_of(PartAlgorithm::Md5, b"hello world", &[6, 5]);
        let mut md5s = md5::Md5::digest(b"hello ").to_vec();
        md5s.extend(md5::Md5::digest(b"world"));
        assert_eq!(parts.digest, md5::Md5::digest(&md5s).to_vec());
    }

    #[tokio::test]
    async fn parts_hash_alike_from_a_file_and_from_memory_and_a_changed_byte_shows() {
        let bytes = data(3 * CHUNK + 1234);
        let layout = [CHUNK as u64 + 7, CHUNK as u64 + 7, (CHUNK + 1234 - 14) as u64];
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let file = Arc::new(file);
        // Memory chunks cut elsewhere than the parts.
        let chunks: Vec<Bytes> = bytes.chunks(100_003).map(Bytes::copy_from_slice).collect();
        // And in one piece, as an object read into memory is.
        let whole = [Bytes::from(bytes.clone())];
        let hasher = Md5Hasher::default();
        for algorithm in [
            PartAlgorithm::Crc32c,
            PartAlgorithm::Crc32,
            PartAlgorithm::Sha1,
            PartAlgorithm::Sha256,
            PartAlgorithm::Md5,
        ] {
            let expected = Integrity::Parts(parts_of(algorithm, &bytes, &layout));
            for received in [Received::File(&file), Received::Memory(&chunks), Received::Memory(&whole)] {
                let actual = digest(&hasher, received, &expected, &layout).await.unwrap();
                assert_eq!(actual.as_ref(), Some(&expected), "{algorithm:?} {received:?}");
            }
            let mut changed = bytes.clone();
            changed[CHUNK + 9] ^= 1;
            let changed = Integrity::Parts(parts_of(algorithm, &changed, &layout));
            for received in [Received::File(&file), Received::Memory(&whole)] {
                let actual = digest(&hasher, received, &changed, &layout).await.unwrap();
                assert_ne!(actual.as_ref(), Some(&changed), "{algorithm:?} {received:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_whole_sha_is_of_the_whole_object() {
        let bytes = data(5000);
        let chunks = vec![Bytes::copy_from_slice(&bytes[..10]), Bytes::copy_from_slice(&bytes[10..])];
        let sha: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        let expected = Integrity::Whole(StoredChecksum::Sha256(sha));
        let actual = digest(&Md5Hasher::default(), Received::Memory(&chunks), &expected, &[5000]).await.unwrap();
        assert_eq!(actual, Some(expected));
        let crc = Integrity::Whole(StoredChecksum::Crc32c(0));
        assert_eq!(digest(&Md5Hasher::default(), Received::Memory(&chunks), &crc, &[5000]).await.unwrap(), None);
    }

    /// The id `git hash-object` gives "hello world", from memory and from a
    /// file; a changed byte gives another.
    #[tokio::test]
    async fn a_git_blob_id_is_what_git_computes() {
        let id: [u8; 20] = hex::decode("95d09f2b10159347eece71399a7e2e907ea3df4f").unwrap().try_into().unwrap();
        let expected = Integrity::Whole(StoredChecksum::GitBlob(id));
        let chunks = [Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
        let hasher = Md5Hasher::default();
        assert_eq!(digest(&hasher, Received::Memory(&chunks), &expected, &[11]).await.unwrap(), Some(expected.clone()));
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(b"hello world").unwrap();
        let file = Arc::new(file);
        assert_eq!(digest(&hasher, Received::File(&file), &expected, &[11]).await.unwrap(), Some(expected.clone()));
        let changed = [Bytes::from_static(b"hello World")];
        assert_ne!(digest(&hasher, Received::Memory(&changed), &expected, &[11]).await.unwrap(), Some(expected));
    }
}
