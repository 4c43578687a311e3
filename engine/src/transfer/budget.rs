//! The global limit on requests in flight and on buffer memory that every
//! request of a run takes its share of (see the engine's overview in
//! [`super`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::TransferError;
use super::{adaptive, throttle};
use crate::metrics::{GaugeGuard, Metrics};

/// Memory the engine keeps aside for everything that is not a data buffer:
/// the runtime, listing pages, connection state, the binary's own resident
/// pages, and what the allocator holds freed but not yet returned. Measured
/// on Azure pulls at `--memory-limit 96MiB` on a loaded 2-core machine: the
/// binary's pages 14 MiB; the live heap at most 62 MiB with the buffers'
/// budget in use, while resident anonymous memory reached 85 MiB, about 20
/// MiB held freed. At 32 MiB such a pull reached 99 MiB resident.
pub const MEMORY_RESERVE: u64 = 48 << 20;
/// What one request costs beyond its data buffer: the two read buffers of
/// its connection that the chunks it holds sit in partly (see
/// [`ferry_store::READ_BUFFER_MAX`]), and TLS and header buffers.
pub const REQUEST_OVERHEAD: u64 = 2 * ferry_store::READ_BUFFER_MAX as u64 + (64 << 10);
/// Memory is accounted in these units so the semaphore's u32 permits cover
/// terabytes.
const MEMORY_UNIT: u64 = 4 << 10;

/// The global request and memory budget.
#[derive(Debug, Clone)]
pub struct Budget {
    requests: Arc<adaptive::RequestLimit>,
    memory: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// With adaptive concurrency, whether its controller still has to be
    /// started (by the first request, which runs inside the runtime).
    controller_pending: Arc<AtomicBool>,
    /// The most requests an adaptive run may reach.
    ceiling: usize,
    /// The request-rate cap: requests start no faster than it allows
    /// (`--max-request-rate`, a store budget share, and with adaptive
    /// concurrency what throttling taught; see [`throttle`]).
    pub request_rate: Arc<throttle::RateControl>,
}

/// A request slot; frees itself and the in-flight gauge on drop.
#[derive(Debug)]
pub struct RequestSlot {
    permit: Option<OwnedSemaphorePermit>,
    limit: Arc<adaptive::RequestLimit>,
    _in_flight: GaugeGuard,
}

impl Drop for RequestSlot {
    fn drop(&mut self) {
        if let Some(permit) = self.permit.take() {
            self.limit.release(permit);
        }
    }
}

impl Budget {
    /// A budget of `concurrency` requests and `memory_limit` bytes; with
    /// `adaptive`, `concurrency` is the most the number of requests may
    /// reach, and it starts lower (see [`adaptive`]).
    ///
    /// # Errors
    /// Fails when the memory limit cannot hold one buffer of `largest_buffer`.
    pub fn new(
        concurrency: usize,
        adaptive: bool,
        memory_limit: u64,
        largest_buffer: u64,
        max_request_rate: Option<u64>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, TransferError> {
        let needed = MEMORY_RESERVE + largest_buffer + REQUEST_OVERHEAD;
        if memory_limit < needed {
            return Err(TransferError::Config(format!(
                "--memory-limit {} is below the {} MiB one buffer of {} MiB needs; raise it or lower --part-size",
                memory_limit,
                needed.div_ceil(1 << 20),
                largest_buffer.div_ceil(1 << 20)
            )));
        }
        let units = ((memory_limit - MEMORY_RESERVE) / MEMORY_UNIT).min(u64::from(u32::MAX >> 4)) as usize;
        let start = adaptive::first_limit(concurrency, adaptive);
        metrics.set_concurrency_limit(start);
        Ok(Self {
            requests: Arc::new(adaptive::RequestLimit::new(start)),
            memory: Arc::new(Semaphore::new(units)),
            controller_pending: Arc::new(AtomicBool::new(adaptive)),
            ceiling: concurrency.max(1),
            request_rate: Arc::new(throttle::RateControl::new(max_request_rate, adaptive, Arc::clone(&metrics))),
            metrics,
        })
    }

    /// Waits for a request slot (and, under a request-rate cap, for the
    /// request's turn: paced before the slot, so no slot idles while it
    /// waits, and again if the cap came down while it waited for the slot,
    /// so that a queue formed under the old cap does not burst through).
    pub async fn request(&self) -> RequestSlot {
        if self.controller_pending.load(Relaxed) && self.controller_pending.swap(false, Relaxed) {
            let floor = adaptive::ADAPTIVE_MIN_CONCURRENCY as usize;
            let climber = adaptive::Climber::new(self.requests.limit(), floor, self.ceiling);
            tokio::spawn(adaptive::run_controller(Arc::downgrade(&self.requests), Arc::clone(&self.metrics), climber));
        }
        let permit = loop {
            self.request_rate.take().await;
            // Read after the turn: a decrease while the request queued for
            // its turn already paced it.
            let lowered = self.request_rate.lowered();
            let permit = self.requests.acquire().await;
            if self.request_rate.lowered() == lowered {
                break permit;
            }
            self.requests.release(permit);
        };
        RequestSlot {
            permit: Some(permit),
            limit: Arc::clone(&self.requests),
            _in_flight: self.metrics.request_started(),
        }
    }

    /// The number of requests allowed in flight now, and the most so far.
    pub fn request_limit(&self) -> (usize, usize) {
        (self.requests.limit(), self.requests.peak())
    }

    /// Waits until `bytes` of buffer memory are available.
    pub async fn memory(&self, bytes: u64) -> OwnedSemaphorePermit {
        let units = u32::try_from(bytes.div_ceil(MEMORY_UNIT)).unwrap_or(u32::MAX);
        Arc::clone(&self.memory).acquire_many_owned(units).await.expect("memory budget is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_limit_below_one_part_is_refused_with_advice() {
        let err = Budget::new(8, false, 40 << 20, 16 << 20, None, Arc::new(Metrics::new())).unwrap_err();
        assert!(err.to_string().contains("--part-size"), "{err}");
        assert!(Budget::new(8, false, 256 << 20, 8 << 20, None, Arc::new(Metrics::new())).is_ok());
    }
}
