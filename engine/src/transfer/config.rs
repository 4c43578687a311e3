//! What a run is told: its [`TransferConfig`] (built from the command
//! line's options in `crate::options`) and how it retries a request.

use std::path::PathBuf;
use std::time::Duration;

use ferry_contract::VerifyMode;

use super::capacity::CapacityCheck;
use crate::selection::Selection;

/// Bounds for retrying one request.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts including the first.
    pub max_attempts: u32,
    /// Backoff before the second attempt (doubled each time, then jittered).
    pub base_delay: Duration,
    /// Upper bound of one backoff.
    pub max_delay: Duration,
    /// No retry starts after this much time since the first attempt.
    pub max_elapsed: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(5),
            max_elapsed: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// "Full jitter" backoff before attempt `attempt + 1`: uniform in
    /// `0..=min(max_delay, base * 2^(attempt-1))`, so clients that failed
    /// together do not retry together.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.base_delay.saturating_mul(1u32 << attempt.saturating_sub(1).min(16));
        let cap = exp.min(self.max_delay);
        cap.mul_f64(rand::random::<f64>())
    }
}

/// Everything that shapes a run, parsed once from the command line.
#[derive(Clone, Debug)]
pub struct TransferConfig {
    /// Requests in flight across all objects; with `adaptive`, the most the
    /// run may reach.
    pub concurrency: usize,
    /// Whether the number of requests in flight follows the measured
    /// throughput (starting at [`adaptive::ADAPTIVE_START_CONCURRENCY`])
    /// instead of staying at `concurrency`.
    pub adaptive: bool,
    /// Part size for uploads; range size for downloads, the smallest one when
    /// `grow_ranges` is set.
    pub part_size: u64,
    /// Let download ranges grow beyond `part_size` for objects larger than
    /// `concurrency` parts (see [`ranges::download_range_size`]).
    pub grow_ranges: bool,
    /// Files larger than this are uploaded as multipart uploads.
    pub multipart_threshold: u64,
    /// Bytes buffered per request before they are written to disk.
    pub write_buffer: u64,
    /// Upper bound for the data buffers of the whole run.
    pub memory_limit: u64,
    /// Verification before rename.
    pub verify: VerifyMode,
    /// Retry bounds.
    pub retry: RetryPolicy,
    /// Abort a body that delivers no byte for this long.
    pub stall_timeout: Duration,
    /// Cap on bytes per second for the whole run.
    pub max_bandwidth: Option<u64>,
    /// Cap on requests per second to the store for the whole run.
    pub max_request_rate: Option<u64>,
    /// This worker's share of a store budget at the start; it tightens the
    /// two caps above and may change during the run ([`Engine::follow_share`]).
    pub store_share: Option<ferry_contract::StoreShare>,
    /// Which objects to copy.
    pub selection: Selection,
    /// How a pull checks its destination's free space; `None` for no check.
    pub capacity: Option<CapacityCheck>,
    /// The most bytes a pull's dataset may hold, all shards together.
    pub dataset_quota: Option<u64>,
    /// Where a pull shares its files with the other directories pulled onto
    /// its filesystem (see [`crate::local::shared_objects`]), if anywhere.
    pub shared_objects: Option<SharedObjectsDir>,
}

/// A pull's shared-objects directory, and what tells its objects from
/// another store's of the same bucket name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedObjectsDir {
    /// The directory, on the destination's filesystem.
    pub dir: PathBuf,
    /// The endpoint the store is reached at, when it is not the default.
    pub endpoint: Option<String>,
}

impl Default for TransferConfig {
    /// What a run does when told nothing: the options' defaults, so the
    /// engine's defaults and the command line's cannot differ.
    fn default() -> Self {
        Self::from_options(&ferry_contract::TransferOptions::default()).expect("the default options are valid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_jittered_and_capped() {
        let policy = RetryPolicy::default();
        for attempt in 1..20 {
            let delay = policy.backoff(attempt);
            assert!(delay <= policy.max_delay);
            assert!(delay <= policy.base_delay * 2u32.pow(attempt.min(16) - 1));
        }
    }
}
