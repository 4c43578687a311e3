//! Recycled data buffers.
//!
//! Uploads allocate the same part-sized buffers over and over. Freed multi-MiB blocks are not
//! reliably given back to the OS by glibc's allocator, and a push measured
//! 1.5x its `--memory-limit` in resident memory while its live buffers never
//! exceeded the limit. Reusing buffers keeps resident memory at the peak of
//! what the budget lets live at once.

use std::sync::Mutex;

/// A free list of byte buffers.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A buffer of exactly `len` initialised bytes, reused when one fits.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let reused = {
            let mut free = self.free.lock().expect("buffer pool poisoned");
            let fit =
                free.iter().position(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2).max(64 << 10));
            fit.map(|i| free.swap_remove(i))
        };
        let mut buffer = reused.unwrap_or_else(|| Vec::with_capacity(len));
        buffer.resize(len, 0);
        buffer
    }

    /// Returns a buffer for reuse. The budget bounds how many buffers are
    /// live at once, so the free list never holds more than that peak.
    pub fn give(&self, buffer: Vec<u8>) {
        if buffer.capacity() > 0 {
            self.free.lock().expect("buffer pool poisoned").push(buffer);
        }
    }

    /// Returns the allocation behind `bytes` when nobody else holds it.
    pub fn give_bytes(&self, bytes: bytes::Bytes) {
        if let Ok(unique) = bytes.try_into_mut() {
            self.give(Vec::from(unique));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_reused_when_they_fit() {
        let pool = BufferPool::default();
        let first = pool.take(1 << 20);
        let address = first.as_ptr();
        pool.give(first);
        let again = pool.take(1 << 20);
        assert_eq!(again.as_ptr(), address);
        assert_eq!(again.len(), 1 << 20);
        pool.give_bytes(bytes::Bytes::from(again));
        let recycled = pool.take(1 << 20);
        assert_eq!(recycled.as_ptr(), address, "unique Bytes give their allocation back");
        pool.give(recycled);
        let larger = pool.take(8 << 20);
        assert_ne!(larger.as_ptr(), address, "a too-small buffer is not reused");
        let small_again = pool.take(1 << 20);
        assert_eq!(small_again.as_ptr(), address);
        drop((larger, small_again));
    }
}
