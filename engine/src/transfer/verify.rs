//! Checksums computed as bytes stream past, and the comparison with what the
//! store says the object should be.
//!
//! CRCs are computed per range and combined (CRC64NVME, CRC32C and CRC32
//! can be concatenated arithmetically), so an object fetched as 128
//! concurrent ranges is verified against one whole-object checksum without a
//! second pass. MD5 cannot be combined, and is expensive: a file whose only
//! checksum is an MD5 ETag is hashed from the page cache as its ranges land
//! in order, together with others in SIMD lanes (see `md5.rs`). Only a small object
//! received into memory in one piece is MD5-hashed as it streams past: it is
//! one range, and a hand-off to the hasher would cost it more than hashing.
//! SHAs and checksums of per-part checksums are read back too (see
//! `readback.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tally::VerifyMeter;
use crate::store::{Integrity, StoredChecksum};

/// What a range's bytes hashed to.
#[derive(Clone, Debug)]
pub struct RangeDigest {
    /// Offset of the range in the object.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// CRC32C of the range, when the object's checksum is a CRC32C.
    pub crc32c: Option<u32>,
    /// CRC32 of the range, when the object's checksum is a CRC32.
    pub crc32: Option<crc32fast::Hasher>,
    /// CRC64NVME of the range, when the object's checksum is one.
    pub crc64nvme: Option<u64>,
    /// MD5 of the range, when it was asked for (whole objects only: MD5s
    /// cannot be combined).
    pub md5: Option<[u8; 16]>,
}

/// Which digests to compute while streaming.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted {
    /// Compute CRC32C. Only when the store has one to compare with: even
    /// with the CPU's CRC instruction it was 14% of a large download's CPU.
    pub crc32c: bool,
    /// Compute CRC32.
    pub crc32: bool,
    /// Compute CRC64NVME.
    pub crc64nvme: bool,
    /// Compute MD5.
    pub md5: bool,
}

impl Wanted {
    /// The digests that can be checked against `checksum` as ranges stream past.
    pub fn for_checksum(checksum: Option<&Integrity>) -> Self {
        let whole = checksum.and_then(Integrity::whole);
        Self {
            crc32c: matches!(whole, Some(StoredChecksum::Crc32c(_))),
            crc32: matches!(whole, Some(StoredChecksum::Crc32(_))),
            crc64nvme: matches!(whole, Some(StoredChecksum::Crc64Nvme(_))),
            md5: false,
        }
    }

    /// Also MD5, when `checksum` is one (for a whole object in one piece).
    pub fn with_md5_for(self, checksum: Option<&Integrity>) -> Self {
        Self { md5: matches!(checksum, Some(Integrity::Whole(StoredChecksum::Md5(_)))), ..self }
    }
}

/// Running digests of one range.
#[derive(Debug)]
pub struct Digester {
    crc32c: Option<u32>,
    crc32: Option<crc32fast::Hasher>,
    crc64nvme: Option<crc_fast::Digest>,
    md5: Option<md5_many::Md5State>,
    /// Where the time spent hashing is counted, when anything is hashed.
    meter: Option<Arc<VerifyMeter>>,
    spent: Duration,
}

impl Digester {
    /// Starts digests for the wanted algorithms, their time counted in `meter`.
    pub fn new(wanted: Wanted, meter: &Arc<VerifyMeter>) -> Self {
        let any = wanted.crc32c || wanted.crc32 || wanted.crc64nvme || wanted.md5;
        Self {
            crc32c: wanted.crc32c.then_some(0),
            crc32: wanted.crc32.then(crc32fast::Hasher::new),
            crc64nvme: wanted.crc64nvme.then(|| crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme)),
            md5: wanted.md5.then(md5_many::Md5State::new),
            meter: any.then(|| Arc::clone(meter)),
            spent: Duration::ZERO,
        }
    }

    /// Feeds bytes in order.
    pub fn update(&mut self, bytes: &[u8]) {
        if self.meter.is_none() {
            return;
        }
        let started = Instant::now();
        if let Some(crc) = &mut self.crc32c {
            *crc = crc32c::crc32c_append(*crc, bytes);
        }
        if let Some(h) = &mut self.crc32 {
            h.update(bytes);
        }
        if let Some(h) = &mut self.crc64nvme {
            h.update(bytes);
        }
        if let Some(md5) = &mut self.md5 {
            md5.update(bytes);
        }
        self.spent += started.elapsed();
    }

    /// The digests of everything fed.
    pub fn finish(self, offset: u64, len: u64) -> RangeDigest {
        if let Some(meter) = &self.meter {
            meter.spent(self.spent);
        }
        RangeDigest {
            offset,
            len,
            crc32c: self.crc32c,
            crc32: self.crc32,
            crc64nvme: self.crc64nvme.map(|h| h.finalize()),
            md5: self.md5.map(|md5| md5.finalize()),
        }
    }
}

/// Combines per-range CRC32Cs (in any order) into the object's CRC32C, if
/// all were computed.
pub fn combine_crc32c(digests: &[RangeDigest]) -> Option<u32> {
    let mut sorted: Vec<&RangeDigest> = digests.iter().collect();
    sorted.sort_by_key(|d| d.offset);
    sorted.iter().try_fold(0, |acc, d| Some(crc32c::crc32c_combine(acc, d.crc32c?, d.len as usize)))
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

/// Combines per-range CRC64NVMEs into the object's, if all were computed.
pub fn combine_crc64nvme(digests: &[RangeDigest]) -> Option<u64> {
    let mut sorted: Vec<&RangeDigest> = digests.iter().collect();
    sorted.sort_by_key(|d| d.offset);
    let mut ranges = sorted.into_iter();
    let first = ranges.next().map_or(Some(crc64nvme_of_nothing()), |d| d.crc64nvme)?;
    ranges.try_fold(first, |acc, d| {
        Some(crc_fast::checksum_combine(crc_fast::CrcAlgorithm::Crc64Nvme, acc, d.crc64nvme?, d.len))
    })
}

fn crc64nvme_of_nothing() -> u64 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, &[])
}

/// What the downloaded ranges hash to, in the algorithm of the `expected`
/// CRC; `None` for a hash (which ranges cannot give, see `md5.rs` and
/// `readback.rs`) or a CRC that was not computed for every range.
pub fn combined_crc(expected: StoredChecksum, digests: &[RangeDigest]) -> Option<StoredChecksum> {
    match expected {
        StoredChecksum::Crc64Nvme(_) => combine_crc64nvme(digests).map(StoredChecksum::Crc64Nvme),
        StoredChecksum::Crc32c(_) => combine_crc32c(digests).map(StoredChecksum::Crc32c),
        StoredChecksum::Crc32(_) => combine_crc32(digests).map(StoredChecksum::Crc32),
        StoredChecksum::Md5(_) | StoredChecksum::Sha1(_) | StoredChecksum::Sha256(_) | StoredChecksum::GitBlob(_) => {
            None
        }
    }
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
                let mut d = Digester::new(wanted, &Arc::default());
                d.update(bytes);
                d.finish(offset as u64, bytes.len() as u64)
            })
            .collect()
    }

    proptest! {
        /// Combining range CRCs gives the CRC of the whole, wherever the cut.
        #[test]
        fn range_crcs_combine_to_the_whole_object_crc(data in proptest::collection::vec(any::<u8>(), 0..4096), cut in 0usize..4096) {
            let digests = digest_ranges(&data, cut, Wanted { crc32c: true, crc32: true, crc64nvme: true, md5: false });
            prop_assert_eq!(combine_crc32c(&digests), Some(crc32c::crc32c(&data)));
            prop_assert_eq!(combine_crc32(&digests), Some(crc32fast::hash(&data)));
            prop_assert_eq!(combine_crc64nvme(&digests), Some(crc_fast::checksum(crc_fast::CrcAlgorithm::Crc64Nvme, &data)));
        }
    }

    #[test]
    fn an_md5_is_never_taken_from_range_crcs() {
        let digests =
            digest_ranges(b"hello world", 5, Wanted { crc32c: true, crc32: true, crc64nvme: true, md5: false });
        assert_eq!(combined_crc(StoredChecksum::Md5([0; 16]), &digests), None);
        let crc = crc32c::crc32c(b"hello world");
        assert_eq!(combined_crc(StoredChecksum::Crc32c(0), &digests), Some(StoredChecksum::Crc32c(crc)));
    }

    proptest! {
        /// A streamed MD5 is the MD5 of the whole, however the bytes arrive.
        #[test]
        fn a_streamed_md5_matches_one_shot_md5(data in proptest::collection::vec(any::<u8>(), 0..4096), piece in 1usize..200) {
            let md5 = Wanted::default().with_md5_for(Some(&Integrity::Whole(StoredChecksum::Md5([0; 16]))));
            let mut digester = Digester::new(md5, &Arc::default());
            for bytes in data.chunks(piece) {
                digester.update(bytes);
            }
            let expected: [u8; 16] = <md5::Md5 as md5::Digest>::digest(&data).into();
            prop_assert_eq!(digester.finish(0, data.len() as u64).md5, Some(expected));
        }
    }

    #[test]
    fn hashing_time_is_counted_when_something_is_hashed_and_only_then() {
        let meter = Arc::new(VerifyMeter::default());
        let data = vec![7u8; 4 << 20];
        let mut nothing = Digester::new(Wanted::default(), &meter);
        nothing.update(&data);
        nothing.finish(0, data.len() as u64);
        assert!(meter.cost().is_none(), "{:?}", meter.cost());
        let mut crc = Digester::new(Wanted { crc32: true, ..Wanted::default() }, &meter);
        crc.update(&data);
        crc.finish(0, data.len() as u64);
        assert!(meter.cost().cpu_seconds > 0.0, "{:?}", meter.cost());
        assert_eq!(meter.cost().read_back_bytes, 0, "streamed past, nothing read back");
    }

    #[test]
    fn a_crc_that_was_not_computed_is_never_taken_for_a_match() {
        let digests = digest_ranges(b"hello world", 5, Wanted::default());
        assert_eq!(combined_crc(StoredChecksum::Crc32c(0), &digests), None);
        assert_eq!(combined_crc(StoredChecksum::Crc32(0), &digests), None);
        assert_eq!(combined_crc(StoredChecksum::Crc64Nvme(0), &digests), None);
    }

    /// The check value of CRC-64/NVME (the catalogue's "123456789" test),
    /// so the algorithm is the one S3 computes, not a neighbour.
    #[test]
    fn crc64nvme_is_the_catalogued_algorithm() {
        let digests = digest_ranges(b"123456789", 4, Wanted { crc64nvme: true, ..Wanted::default() });
        assert_eq!(combine_crc64nvme(&digests), Some(0xae8b_1486_0a79_9888));
        assert_eq!(combine_crc64nvme(&[]), Some(crc64nvme_of_nothing()));
    }
}
