//! A large read buffer's pages, faulted in before its bytes arrive.
//!
//! The kernel gives a fresh allocation its pages on first touch, one fault
//! per 4 KiB page: for a 1 GiB object read into memory that is 262,144
//! faults, each a trip through the fault handler, which profiled at a
//! quarter of the CPU such a read took. `MADV_POPULATE_WRITE` (Linux 5.14)
//! maps a whole range in one call. Each range of a large read does that for
//! its own piece of the buffer just before fetching into it, on a blocking
//! thread, so pieces are mapped in parallel and beside other ranges'
//! transfers. Where the kernel cannot, the pages fault in as before.
//!
//! (Transparent huge pages map 2 MiB a fault, but on the virtual machines
//! measured the kernel then had to find, zero and back 2 MiB blocks, which
//! made the same read take twice the CPU.)
//!
//! This is the engine's only module with `unsafe` code: `madvise` takes a
//! raw address range.
#![allow(unsafe_code)]

use bytes::BytesMut;

/// Below this a buffer's faults are not worth a system call.
const AT_LEAST: usize = 1 << 20;

/// The base page size the range is aligned to (4 KiB on the platforms
/// Ferry ships for; a larger page only makes the range a little shorter).
const PAGE: usize = 4096;

/// `piece` with its pages mapped, on a blocking thread; a small one as it is.
pub(super) async fn prefaulted(piece: BytesMut) -> BytesMut {
    if piece.len() < AT_LEAST {
        return piece;
    }
    tokio::task::spawn_blocking(move || {
        let mut piece = piece;
        prefault(&mut piece);
        piece
    })
    .await
    .expect("prefaulting panicked")
}

/// Maps every whole page of `buffer` now. Its bytes are left as they are.
fn prefault(buffer: &mut [u8]) {
    let Some((first, len)) = whole_pages(buffer.as_mut_ptr() as usize, buffer.len()) else { return };
    // SAFETY: [first, first + len) lies inside `buffer`, which this function
    // borrows mutably; populating for write maps those pages writable and
    // never changes what they hold.
    let populated = unsafe { rustix::mm::madvise(first as *mut _, len, rustix::mm::Advice::LinuxPopulateWrite) };
    if let Err(error) = populated {
        tracing::debug!(%error, "read buffer not prefaulted");
    }
}

/// The whole pages inside `[start, start + len)`: the first one's address
/// and their length, or `None` when there is not one.
fn whole_pages(start: usize, len: usize) -> Option<(usize, usize)> {
    let first = start.checked_next_multiple_of(PAGE)?;
    let end = start.checked_add(len)? / PAGE * PAGE;
    (end > first).then(|| (first, end - first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_pages_inside_the_buffer_are_named() {
        assert_eq!(whole_pages(8 * PAGE, 3 * PAGE), Some((8 * PAGE, 3 * PAGE)));
        assert_eq!(whole_pages(PAGE + 1, 3 * PAGE), Some((2 * PAGE, 2 * PAGE)));
        assert_eq!(whole_pages(PAGE + 1, PAGE), None);
        assert_eq!(whole_pages(usize::MAX - PAGE, PAGE), None);
    }

    #[test]
    fn prefaulting_keeps_the_bytes() {
        let mut buffer: Vec<u8> = (0..3 * AT_LEAST + 5).map(|i| (i % 251) as u8).collect();
        let before = buffer.clone();
        prefault(&mut buffer);
        assert_eq!(buffer, before);
        let mut zeroed = vec![0u8; 2 * AT_LEAST];
        prefault(&mut zeroed);
        assert!(zeroed.iter().all(|&b| b == 0));
    }
}
