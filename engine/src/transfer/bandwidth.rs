//! An optional cap on the bytes per second a run moves (`--max-bandwidth`),
//! for sharing a link politely with training traffic.
//!
//! Pacing, not a token bucket: each caller reserves the time its bytes take
//! at the configured rate, after everything reserved before it, and sleeps
//! until then. Requests therefore share the rate fairly in arrival order and
//! the cap holds over any window longer than one buffer.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Paces byte flows to a rate.
#[derive(Debug)]
pub struct BandwidthLimit {
    bytes_per_second: f64,
    next_free: Mutex<Option<Instant>>,
}

impl BandwidthLimit {
    /// A limit of `bytes_per_second`.
    pub fn new(bytes_per_second: u64) -> Self {
        Self { bytes_per_second: bytes_per_second.max(1) as f64, next_free: Mutex::new(None) }
    }

    /// Waits until `bytes` may pass.
    pub async fn take(&self, bytes: u64) {
        let cost = Duration::from_secs_f64(bytes as f64 / self.bytes_per_second);
        let until = {
            let now = Instant::now();
            let mut next = self.next_free.lock().expect("bandwidth lock poisoned");
            let start = next.map_or(now, |t| t.max(now));
            *next = Some(start + cost);
            start + cost
        };
        tokio::time::sleep_until(until).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bytes_are_paced_to_the_rate() {
        let limit = BandwidthLimit::new(1000);
        let started = Instant::now();
        for _ in 0..5 {
            limit.take(500).await;
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(2500) && elapsed < Duration::from_millis(2600), "{elapsed:?}");
    }
}
