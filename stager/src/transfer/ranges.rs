//! The range planner: how an object of a given size is split into requests.
//!
//! Objects up to one part take one GET; larger ones are split into
//! consecutive ranges of `part_size` bytes (the last may be shorter), which
//! the scheduler fetches concurrently from the shared request budget.
//! Multipart uploads use the same plan, widened when needed so a file never
//! needs more than S3's 10,000 parts.

use std::ops::Range;

/// S3's limit on the number of parts of a multipart upload.
pub const MAX_UPLOAD_PARTS: u64 = 10_000;

/// Splits `0..size` into consecutive ranges of at most `part_size` bytes.
/// An empty object needs no request, so it has no range.
pub fn plan_ranges(size: u64, part_size: u64) -> Vec<Range<u64>> {
    let part_size = part_size.max(1);
    (0..size.div_ceil(part_size))
        .map(|i| {
            let start = i * part_size;
            start..(start + part_size).min(size)
        })
        .collect()
}

/// The part size for uploading `size` bytes: `part_size`, or larger (in
/// whole MiB) when `part_size` would need more than 10,000 parts.
pub fn upload_part_size(size: u64, part_size: u64) -> u64 {
    const MIB: u64 = 1 << 20;
    let minimum = size.div_ceil(MAX_UPLOAD_PARTS).div_ceil(MIB) * MIB;
    part_size.max(minimum)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn boundaries_around_one_part() {
        assert!(plan_ranges(0, 8).is_empty());
        assert_eq!(plan_ranges(7, 8), vec![0..7]);
        assert_eq!(plan_ranges(8, 8), vec![0..8]);
        assert_eq!(plan_ranges(9, 8), vec![0..8, 8..9]);
    }

    #[test]
    fn huge_uploads_widen_parts_to_stay_under_the_part_limit() {
        let five_tib = 5u64 << 40;
        let part = upload_part_size(five_tib, 8 << 20);
        assert!(plan_ranges(five_tib, part).len() as u64 <= MAX_UPLOAD_PARTS);
        assert_eq!(upload_part_size(1 << 30, 8 << 20), 8 << 20);
    }

    proptest! {
        /// Ranges are non-empty, no longer than a part, contiguous and cover
        /// the object exactly.
        #[test]
        fn ranges_tile_the_object(size in 0u64..1_000_000, part in 1u64..100_000) {
            let ranges = plan_ranges(size, part);
            let mut next = 0;
            for range in &ranges {
                prop_assert_eq!(range.start, next);
                prop_assert!(range.end > range.start);
                prop_assert!(range.end - range.start <= part);
                next = range.end;
            }
            prop_assert_eq!(next, size);
            prop_assert_eq!(ranges.len() as u64, size.div_ceil(part));
        }
    }
}
