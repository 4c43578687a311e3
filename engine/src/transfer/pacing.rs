//! Caps on a rate, for sharing a link or a store politely: bytes per
//! second (`--max-bandwidth`, `--peer-serve-bandwidth`) and requests per
//! second (`--max-request-rate`).
//!
//! Pacing, not a token bucket: callers take turns in arrival order, and
//! each waits the time its units take at the rate, after the previous one's
//! time ended. The cap holds over any window longer than one turn. The rate
//! may change while callers wait (a share of a store's budget, split again
//! as workers come and go, or lowered while the store throttles): the
//! caller whose turn it is rechecks it every [`RECHECK`], so a raised rate
//! frees the queue at once. (Reserving every caller's time up front, as
//! this pacer first did, kept a queue formed under a low rate waiting for
//! the low rate's times.)

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// How often a waiting caller looks at the rate again.
pub const RECHECK: Duration = Duration::from_millis(50);

/// Paces a flow of units (bytes, requests) to a rate, or lets it through.
#[derive(Debug)]
pub struct Pacer {
    /// Units per second; 0 is no cap.
    per_second: AtomicU64,
    /// Held by the caller whose turn it is: a fair (FIFO) queue.
    turn: tokio::sync::Mutex<()>,
    /// When the last turn's time ended.
    last_end: Mutex<Option<Instant>>,
}

impl Pacer {
    /// A cap of `per_second` units per second; `None` lets everything through.
    pub fn new(per_second: Option<u64>) -> Self {
        let pacer =
            Self { per_second: AtomicU64::new(0), turn: tokio::sync::Mutex::new(()), last_end: Mutex::new(None) };
        pacer.set_rate(per_second);
        pacer
    }

    /// Changes the cap, for the caller waiting now and every later one.
    pub fn set_rate(&self, per_second: Option<u64>) {
        self.per_second.store(per_second.map_or(0, |rate| rate.max(1)), Relaxed);
    }

    /// The cap, if there is one.
    pub fn rate(&self) -> Option<u64> {
        Some(self.per_second.load(Relaxed)).filter(|rate| *rate > 0)
    }

    /// Waits until `units` may pass.
    pub async fn take(&self, units: u64) {
        if self.rate().is_none() {
            return;
        }
        let _turn = self.turn.lock().await;
        let start = {
            let now = Instant::now();
            self.last_end.lock().expect("pacer lock poisoned").map_or(now, |end| end.max(now))
        };
        loop {
            let Some(rate) = self.rate() else { return };
            let end = start + Duration::from_secs_f64(units as f64 / rate as f64);
            let now = Instant::now();
            if now >= end {
                *self.last_end.lock().expect("pacer lock poisoned") = Some(end);
                return;
            }
            tokio::time::sleep_until(end.min(now + RECHECK)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn units_are_paced_to_the_rate() {
        let limit = Pacer::new(Some(1000));
        let started = Instant::now();
        for _ in 0..5 {
            limit.take(500).await;
        }
        let elapsed = started.elapsed();
        assert!(elapsed >= Duration::from_millis(2500) && elapsed < Duration::from_millis(2600), "{elapsed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_rate_applies_to_what_comes_after_it_and_none_lets_everything_through() {
        let limit = Pacer::new(None);
        let started = Instant::now();
        for _ in 0..1000 {
            limit.take(1).await;
        }
        assert_eq!(started.elapsed(), Duration::ZERO, "no cap, no wait");
        limit.set_rate(Some(10));
        let started = Instant::now();
        for _ in 0..10 {
            limit.take(1).await;
        }
        let at_ten = started.elapsed();
        assert!(at_ten >= Duration::from_millis(1000) && at_ten < Duration::from_millis(1100), "{at_ten:?}");
        limit.set_rate(Some(100));
        let started = Instant::now();
        for _ in 0..10 {
            limit.take(1).await;
        }
        let at_hundred = started.elapsed();
        assert!(at_hundred >= Duration::from_millis(100) && at_hundred < Duration::from_millis(150), "{at_hundred:?}");
        assert_eq!(limit.rate(), Some(100));
        limit.set_rate(None);
        assert_eq!(limit.rate(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_raised_while_callers_wait_frees_them_at_once() {
        let limit = std::sync::Arc::new(Pacer::new(Some(1)));
        let started = Instant::now();
        let waiting: Vec<_> = (0..5)
            .map(|_| {
                let limit = std::sync::Arc::clone(&limit);
                tokio::spawn(async move { limit.take(1).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
        limit.set_rate(Some(1000));
        for caller in waiting {
            caller.await.unwrap();
        }
        let elapsed = started.elapsed();
        assert!(elapsed < Duration::from_millis(300), "five turns reserved at 1/s done in {elapsed:?}");
    }
}
