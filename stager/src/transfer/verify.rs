//! Checksums computed as bytes stream past, and the comparison with what the
//! store says the object should be.
//!
//! CRCs are computed per range and combined (CRC32C and CRC32 can be
//! concatenated arithmetically), so an object fetched as 128 concurrent
//! ranges is verified against one whole-object checksum without a second
//! pass. MD5 cannot be combined: a single-GET object is hashed in flight; a
//! multi-range object whose only checksum is an MD5 ETag is read back once
//! from the page cache.

use std::io::Read as _;
use std::path::Path;

use md5::{Digest as _, Md5};

use crate::store::StoredChecksum;

/// What a range's bytes hashed to.
#[derive(Clone, Debug)]
pub struct RangeDigest {
    /// Offset of the range in the object.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// CRC32C of the range.
    pub crc32c: u32,
    /// CRC32 of the range, when the object's checksum is a CRC32.
    pub crc32: Option<crc32fast::Hasher>,
    /// MD5 of the range, when it is the whole object and MD5 is needed.
    pub md5: Option<[u8; 16]>,
}

/// Which digests to compute while streaming.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted {
    /// Compute CRC32 (CRC32C is always computed: it costs almost nothing).
    pub crc32: bool,
    /// Compute MD5.
    pub md5: bool,
}

/// Running digests of one range.
#[derive(Debug)]
pub struct Digester {
    crc32c: u32,
    crc32: Option<crc32fast::Hasher>,
    md5: Option<Md5>,
}

impl Digester {
    /// Starts digests for the wanted algorithms.
    pub fn new(wanted: Wanted) -> Self {
        Self { crc32c: 0, crc32: wanted.crc32.then(crc32fast::Hasher::new), md5: wanted.md5.then(Md5::new) }
    }

    /// Feeds bytes in order.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc32c = crc32c::crc32c_append(self.crc32c, bytes);
        if let Some(h) = &mut self.crc32 {
            h.update(bytes);
        }
        if let Some(h) = &mut self.md5 {
            h.update(bytes);
        }
    }

    /// The digests of everything fed.
    pub fn finish(self, offset: u64, len: u64) -> RangeDigest {
        RangeDigest { offset, len, crc32c: self.crc32c, crc32: self.crc32, md5: self.md5.map(|h| h.finalize().into()) }
    }
}

/// Combines per-range CRC32Cs (in any order) into the object's CRC32C.
pub fn combine_crc32c(digests: &[RangeDigest]) -> u32 {
    let mut sorted: Vec<&RangeDigest> = digests.iter().collect();
    sorted.sort_by_key(|d| d.offset);
    sorted.iter().fold(0, |acc, d| crc32c::crc32c_combine(acc, d.crc32c, d.len as usize))
}

/// Combines per-range CRC32s into the object's CRC32, if all were computed.
pub fn combine_crc32(digests: &[RangeDigest]) -> Option<u32> {
    let mut sorted: Vec<&RangeDigest> = digests.iter().collect();
    sorted.sort_by_key(|d| d.offset);
    let mut whole = crc32fast::Hasher::new();
    for digest in sorted {
        whole.combine(digest.crc32.as_ref()?);
    }
    Some(whole.finalize())
}

/// MD5 of a file, read sequentially.
///
/// # Errors
/// Returns read errors.
pub fn md5_file(path: &Path) -> std::io::Result<[u8; 16]> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// What the downloaded bytes hashed to, in the expected checksum's algorithm.
///
/// `read_back` is called only for an MD5 that could not be computed in flight.
///
/// # Errors
/// Returns read errors from `read_back`.
pub fn actual_checksum(
    expected: StoredChecksum,
    digests: &[RangeDigest],
    read_back: impl FnOnce() -> std::io::Result<[u8; 16]>,
) -> std::io::Result<StoredChecksum> {
    Ok(match expected {
        StoredChecksum::Crc32c(_) => StoredChecksum::Crc32c(combine_crc32c(digests)),
        StoredChecksum::Crc32(_) => StoredChecksum::Crc32(
            combine_crc32(digests).ok_or_else(|| std::io::Error::other("CRC32 was not computed for every range"))?,
        ),
        StoredChecksum::Md5(_) => match digests {
            [single] if single.md5.is_some() => StoredChecksum::Md5(single.md5.unwrap_or_default()),
            [] => StoredChecksum::Md5(Md5::digest(b"").into()),
            _ => StoredChecksum::Md5(read_back()?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn digest_ranges(data: &[u8], cut: usize, wanted: Wanted) -> Vec<RangeDigest> {
        let cut = cut.min(data.len());
        [(0, &data[..cut]), (cut, &data[cut..])]
            .into_iter()
            .rev() // completion order is arbitrary
            .map(|(offset, bytes)| {
                let mut d = Digester::new(wanted);
                d.update(bytes);
                d.finish(offset as u64, bytes.len() as u64)
            })
            .collect()
    }

    proptest! {
        /// Combining range CRCs gives the CRC of the whole, wherever the cut.
        #[test]
        fn range_crcs_combine_to_the_whole_object_crc(data in proptest::collection::vec(any::<u8>(), 0..4096), cut in 0usize..4096) {
            let digests = digest_ranges(&data, cut, Wanted { crc32: true, md5: false });
            prop_assert_eq!(combine_crc32c(&digests), crc32c::crc32c(&data));
            prop_assert_eq!(combine_crc32(&digests), Some(crc32fast::hash(&data)));
        }
    }

    #[test]
    fn md5_of_a_multi_range_object_is_read_back() {
        let digests = digest_ranges(b"hello world", 5, Wanted::default());
        let expected = StoredChecksum::Md5(Md5::digest(b"hello world").into());
        let actual = actual_checksum(expected, &digests, || Ok(Md5::digest(b"hello world").into())).unwrap();
        assert_eq!(actual, expected);
    }
}
