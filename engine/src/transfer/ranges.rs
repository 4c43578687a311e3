//! The range planner: how an object of a given size is split into requests.
//!
//! Objects up to one part take one GET; larger ones are split into
//! consecutive ranges (the last may be shorter), which the scheduler fetches
//! concurrently from the shared request budget. Ranges are `part_size` for
//! objects up to `concurrency` parts and grow beyond that (see
//! [`download_range_size`]). Multipart uploads use the same tiling with the
//! part size, widened when needed so a file never needs more than S3's
//! 10,000 parts.

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

/// The largest range a download asks for in one request.
///
/// A 64 MiB range streams for well under a second on any link that makes
/// ranges worth having, so a retry re-fetches little, and it is 8 requests
/// where 8 MiB ranges would be 64.
pub const MAX_DOWNLOAD_RANGE: u64 = 64 << 20;

/// The range size for downloading an object of `size` bytes.
///
/// Every range costs a request: signing, a round trip before the first byte,
/// and on the server a metadata lookup and a seek. Measured against MinIO,
/// 8 MiB ranges (256 requests per GiB) cost a large download about a third
/// of its speed next to rclone's four streams per object. So ranges start at
/// `part_size` and grow with the object, to `size / concurrency` rounded up
/// to a MiB: a lone object still has one range for every request slot, so
/// it keeps the whole budget busy, while a large one needs at most
/// `concurrency` requests, until ranges reach [`MAX_DOWNLOAD_RANGE`].
/// Memory does not grow with the range: a request buffers at most
/// `--write-buffer` bytes whatever its length.
pub fn download_range_size(size: u64, part_size: u64, concurrency: usize) -> u64 {
    const MIB: u64 = 1 << 20;
    let spread = size.div_ceil(concurrency.max(1) as u64).div_ceil(MIB) * MIB;
    part_size.max(spread.min(MAX_DOWNLOAD_RANGE))
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

    #[test]
    fn download_ranges_stay_at_the_part_size_until_the_object_fills_the_budget() {
        const MIB: u64 = 1 << 20;
        // 256 MiB over 32 slots: 8 MiB ranges are already one per slot.
        assert_eq!(download_range_size(256 * MIB, 8 * MIB, 32), 8 * MIB);
        // Single-GET objects are untouched.
        assert_eq!(download_range_size(8 * MIB, 8 * MIB, 32), 8 * MIB);
        assert_eq!(download_range_size(0, 8 * MIB, 32), 8 * MIB);
    }

    #[test]
    fn large_downloads_use_one_range_per_request_slot_up_to_the_cap() {
        const MIB: u64 = 1 << 20;
        assert_eq!(download_range_size(1 << 30, 8 * MIB, 32), 32 * MIB);
        assert_eq!(download_range_size(1 << 30, 8 * MIB, 64), 16 * MIB);
        assert_eq!(download_range_size(10 << 30, 8 * MIB, 64), MAX_DOWNLOAD_RANGE);
        // Rounded up to whole MiB, never below the requested part size.
        assert_eq!(download_range_size(1000 * MIB + 1, 8 * MIB, 100), 11 * MIB);
        assert_eq!(download_range_size(10 << 30, 128 * MIB, 64), 128 * MIB);
    }

    proptest! {
        /// A download never needs more ranges than it needs requests to
        /// fill the budget, unless ranges are at the cap; never fewer than
        /// the part size gives, relative to the cap.
        #[test]
        fn download_range_size_bounds_the_request_count(
            size in 0u64..(1 << 40), part in (1u64 << 20)..(256 << 20), concurrency in 1usize..512,
        ) {
            let range = download_range_size(size, part, concurrency);
            prop_assert!(range >= part);
            prop_assert!(range <= part.max(MAX_DOWNLOAD_RANGE));
            if range < MAX_DOWNLOAD_RANGE && range > part {
                prop_assert!(size.div_ceil(range) <= concurrency as u64);
            }
        }

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
