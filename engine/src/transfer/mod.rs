//! The transfer engine: one scheduler shared by every object of a run.
//!
//! * [`Budget`] is the global limit on requests in flight and on buffer
//!   memory. Every request of every object — a small object's single GET, a
//!   range of a large one, an upload part — takes a request slot for each
//!   attempt and gives it back while it backs off, so a 10 GiB object and ten
//!   thousand 64 KiB objects share the same pipe fairly (the semaphore is
//!   FIFO).
//!   With `--concurrency auto` (the default) the number of request slots
//!   follows the throughput the run measures ([`adaptive`]).
//! * [`Engine::retrying`] runs one request with bounded, jittered
//!   exponential backoff and records its duration and retries.
//! * [`pull`] and [`push`] are the two directions ([`push_resume`] is what
//!   a push keeps of, and cleans up after, interrupted ones; [`capacity`]
//!   is whether a pull's destination has room); [`tally`] counts what
//!   happened and produces the run summary.

pub mod adaptive;
mod behind;
mod budget;
pub mod buffers;
pub mod capacity;
mod config;
mod error;
#[cfg(test)]
mod fault_tests;
mod listing;
pub mod md5;
pub mod memory;
#[cfg(test)]
mod object_scale_tests;
pub mod pacing;
mod prefault;
pub mod pull;
pub mod push;
pub mod push_resume;
#[cfg(test)]
mod push_resume_tests;
pub mod ranges;
pub mod readback;
pub mod receive;
#[cfg(test)]
mod resync_tests;
#[cfg(test)]
mod shared_objects_tests;
pub mod tally;
pub mod throttle;
pub mod verify;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Metrics, Operation};
use crate::store::ObjectStore;
use tally::Tally;

pub use budget::{Budget, MEMORY_RESERVE, REQUEST_OVERHEAD, RequestSlot};
pub use config::{RetryPolicy, SharedObjectsDir, TransferConfig};
pub use error::{Retryable, TransferError, dooms_the_run};
pub use ferry_contract::{Reason, VerifyMode};

/// Object tasks of a run: each returns `Err` only for an error that dooms
/// the whole run (the store refuses every request, the disk is full).
pub type ObjectTasks = tokio::task::JoinSet<Result<(), TransferError>>;

/// Waits for room for one more object task, reaping finished tasks while
/// it waits so that a run-dooming error stops the run at once.
///
/// # Errors
/// The first run-dooming error of a finished task.
pub async fn object_slot(
    slots: &Arc<Semaphore>,
    tasks: &mut ObjectTasks,
) -> Result<OwnedSemaphorePermit, TransferError> {
    loop {
        tokio::select! {
            permit = Arc::clone(slots).acquire_owned() => return Ok(permit.expect("never closed")),
            Some(joined) = tasks.join_next() => check_fatal(joined)?,
        }
    }
}

/// Waits until fewer than `limit()` object tasks are unfinished, reaping
/// finished ones (a limit that rises meanwhile is seen when the next one
/// ends).
///
/// # Errors
/// The first run-dooming error of a finished task.
pub async fn room_for_an_object(tasks: &mut ObjectTasks, limit: impl Fn() -> usize) -> Result<(), TransferError> {
    while tasks.len() >= limit() {
        let Some(joined) = tasks.join_next().await else { break };
        check_fatal(joined)?;
    }
    Ok(())
}

/// Waits for every object task; stops at the first run-dooming error.
///
/// # Errors
/// The first run-dooming error.
pub async fn join_objects(tasks: &mut ObjectTasks) -> Result<(), TransferError> {
    while let Some(joined) = tasks.join_next().await {
        check_fatal(joined)?;
    }
    Ok(())
}

/// Passes on a task's run-dooming error, and its panic.
fn check_fatal(joined: Result<Result<(), TransferError>, tokio::task::JoinError>) -> Result<(), TransferError> {
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Ok(()),
    }
}

/// The shared state of one run.
#[derive(Debug)]
pub struct Engine {
    /// Where objects live.
    pub store: Arc<dyn ObjectStore>,
    /// The run's configuration.
    pub config: TransferConfig,
    /// Request and memory budget.
    pub budget: Budget,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Counters for progress and the summary.
    pub tally: Arc<Tally>,
    /// The `--max-bandwidth` pacer.
    pub bandwidth: pacing::Pacer,
    /// Recycled data buffers.
    pub buffers: buffers::BufferPool,
    /// Hashes files whose checksum is an MD5, many at once.
    pub md5: md5::Md5Hasher,
    /// This boot of the machine: partial downloads recorded in another are
    /// not trusted (see `local/partial.rs`).
    pub boot_id: String,
    /// The peers of a pull staged by a fleet of workers, if any.
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// The shared-objects directory a pull links its files into and finds
    /// others' in, once the pull has opened it (see
    /// [`crate::local::shared_objects`]).
    pub shared_objects: std::sync::OnceLock<Arc<crate::local::shared_objects::SharedObjects>>,
    /// Slots for file operations: a pull's creations and commits, a push's
    /// opens, reads of small files and stamps (see [`Engine::on_disk`]).
    disk_slots: tokio::sync::Semaphore,
    /// The store budget share this run follows now, if any.
    share: std::sync::Mutex<Option<ferry_contract::StoreShare>>,
}

/// File creations and commits in flight per core. Each is a blocking call,
/// and small objects finish their requests faster than the filesystem
/// takes their files: unbounded, every object slot (512) held a thread
/// queued on the same directory's lock, the kernel spent most of its time
/// spinning on that lock and every thread kept its own allocator arena.
pub const DISK_SLOTS_PER_CORE: usize = 8;

/// The cores this process may run on.
#[must_use]
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

impl Engine {
    /// Builds an engine, checking that the configuration can work.
    ///
    /// # Errors
    /// Fails when the memory limit is too small for one part.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        config: TransferConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, TransferError> {
        Self::build(store, config, metrics, None)
    }

    /// Builds the engine of one worker of a fleet: reads of keys a peer
    /// holds go to that peer (see [`crate::fleet`]).
    ///
    /// # Errors
    /// As [`Engine::new`].
    pub fn in_fleet(
        store: Arc<dyn ObjectStore>,
        config: TransferConfig,
        metrics: Arc<Metrics>,
        fleet: Arc<crate::fleet::Fleet>,
    ) -> Result<Arc<Self>, TransferError> {
        let store = Arc::new(crate::fleet::PeerStore::new(store, Arc::clone(&fleet), config.part_size));
        Self::build(store, config, metrics, Some(fleet))
    }

    fn build(
        store: Arc<dyn ObjectStore>,
        config: TransferConfig,
        metrics: Arc<Metrics>,
        fleet: Option<Arc<crate::fleet::Fleet>>,
    ) -> Result<Arc<Self>, TransferError> {
        let largest = config.part_size.max(config.multipart_threshold).max(config.write_buffer);
        let budget = Budget::new(
            config.concurrency,
            config.adaptive,
            config.memory_limit,
            largest,
            config.max_request_rate,
            Arc::clone(&metrics),
        )?;
        let bandwidth = pacing::Pacer::new(config.max_bandwidth);
        let tally = Arc::new(Tally::default());
        let md5 = md5::Md5Hasher::metered(Arc::clone(&tally.verify));
        let engine = Arc::new(Self {
            store,
            config,
            budget,
            metrics,
            tally,
            bandwidth,
            buffers: buffers::BufferPool::default(),
            md5,
            boot_id: crate::local::partial::boot_id(),
            fleet,
            shared_objects: std::sync::OnceLock::new(),
            disk_slots: tokio::sync::Semaphore::new(cores() * DISK_SLOTS_PER_CORE),
            share: std::sync::Mutex::new(None),
        });
        engine.follow_share(engine.config.store_share);
        Ok(engine)
    }

    /// Takes `share` as this worker's part of its store's budget from now
    /// on (`None`: no budget), within the run's own caps. Requests and
    /// bytes already waiting their turn wait for the new rate.
    pub fn follow_share(&self, share: Option<ferry_contract::StoreShare>) {
        *self.share.lock().expect("share lock poisoned") = share.filter(|s| !s.is_unlimited());
        let share = share.unwrap_or_default();
        let (requests, bytes) = share.within(self.config.max_request_rate, self.config.max_bandwidth);
        let bandwidth_changed = self.bandwidth.rate() != bytes;
        if self.budget.request_rate.set(requests) | bandwidth_changed {
            tracing::info!(%share, requests_per_second = ?requests, bytes_per_second = ?bytes, "following a store budget share");
        }
        self.bandwidth.set_rate(bytes);
        self.metrics.set_store_share(&share);
    }

    /// The store budget share this run follows now, if any.
    pub fn store_share(&self) -> Option<ferry_contract::StoreShare> {
        *self.share.lock().expect("share lock poisoned")
    }

    /// Runs `work`, a file creation or commit, on the blocking pool once one
    /// of the run's disk slots is free.
    pub(crate) async fn on_disk<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let _slot = self.disk_slots.acquire().await.expect("never closed");
        tokio::task::spawn_blocking(work).await.expect("a file operation panicked")
    }

    /// Objects allowed in flight at once: enough to keep every request slot
    /// busy while some objects are being verified or renamed.
    pub fn objects_in_flight(&self) -> usize {
        self.config.concurrency.max(1) * 2
    }

    /// Objects allowed in flight now: as [`Self::objects_in_flight`], for
    /// the requests allowed now, which an adaptive run raises as it climbs
    /// from far below its ceiling.
    ///
    /// An adaptive run raises its limit only while every request slot
    /// stays taken, so a push whose reads take as long as its requests
    /// (a slow source volume) may stay at its first limit. One more object
    /// per disk slot would keep the reading objects out of that count, but
    /// measured, it let the allocator keep up to 12 MiB more under CPU
    /// contention (pushes of 20,000 empty files: 15-28 MiB against 15-16).
    pub fn objects_in_flight_now(&self) -> usize {
        self.budget.request_limit().0.max(1) * 2
    }

    /// How many requests the run has kept in flight, for its summary.
    pub fn concurrency_used(&self) -> ferry_contract::summary::ConcurrencyUsed {
        let (last, peak) = self.budget.request_limit();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        ferry_contract::summary::ConcurrencyUsed {
            adaptive: self.config.adaptive,
            last: count(last),
            peak: count(peak),
        }
    }

    /// The request count that sizes download ranges (see
    /// [`ranges::download_range_size`]): the fixed concurrency, or with
    /// adaptive concurrency its starting point, so a large object is split
    /// into as few ranges as a run that starts there needs, not into one
    /// per slot of the ceiling.
    pub fn range_spread(&self) -> usize {
        adaptive::first_limit(self.config.concurrency, self.config.adaptive)
    }

    /// Waits until `bytes` may move under `--max-bandwidth` (at once without it).
    pub async fn pace(&self, bytes: u64) {
        self.bandwidth.take(bytes).await;
    }

    /// Runs `attempt` until it succeeds, fails permanently, or the retry
    /// policy is exhausted. Each attempt holds a request slot; backoff does not.
    ///
    /// # Errors
    /// The last attempt's error.
    pub async fn retrying<T, E, F, Fut>(&self, operation: Operation, attempt: F) -> Result<T, E>
    where
        E: Retryable + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.retrying_from(None, operation, attempt).await
    }

    /// [`Engine::retrying`], whose first attempt runs in `taken`, a slot the
    /// caller took before (to decide something once its request's turn had
    /// come), when given.
    ///
    /// # Errors
    /// The last attempt's error.
    pub async fn retrying_from<T, E, F, Fut>(
        &self,
        mut taken: Option<RequestSlot>,
        operation: Operation,
        mut attempt: F,
    ) -> Result<T, E>
    where
        E: Retryable + std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let policy = &self.config.retry;
        let first = Instant::now();
        // A throttled attempt says "later", not "no": it does not use up
        // one of the request's attempts, only time (`max_elapsed` still
        // bounds it). Its backoff grows like any other, so runs that share
        // a store that throttles them back off together instead of failing
        // their objects while the store is busy.
        let (mut attempts, mut refused) = (0, 0);
        loop {
            attempts += 1;
            let slot = match taken.take() {
                Some(slot) => slot,
                None => self.budget.request().await,
            };
            self.tally.requested();
            let started = Instant::now();
            let result = attempt().await;
            self.metrics.observe_request(operation, started.elapsed());
            drop(slot);
            let reason = result.as_ref().err().and_then(Retryable::retry_reason);
            let throttled = reason == Some(crate::store::RetryReason::Throttled);
            self.budget.request_rate.answered(throttled, tokio::time::Instant::from_std(started));
            let error = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            let Some(reason) = reason else { return Err(error) };
            let delay = policy.backoff(attempts);
            if reason == crate::store::RetryReason::Throttled {
                refused += 1;
            }
            if attempts - refused >= policy.max_attempts || first.elapsed() + delay > policy.max_elapsed {
                return Err(error);
            }
            self.metrics.retry(reason);
            self.tally.retried();
            tracing::debug!(operation = operation.as_str(), %reason, attempts, ?delay, %error, "retrying");
            tokio::time::sleep(delay).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Object tasks started behind `room_for_an_object` never exceed the
    /// limit the closure gives, and follow it when it rises. On one thread,
    /// so that every task started is polled before any sleep can end.
    #[tokio::test]
    async fn objects_in_flight_follow_a_limit_that_changes() {
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let limit = Arc::new(AtomicUsize::new(3));
        let mut tasks = ObjectTasks::new();
        for i in 0..60 {
            if i == 30 {
                assert_eq!(most.load(Ordering::SeqCst), 3, "the first limit was filled, never passed");
                limit.store(7, Ordering::SeqCst);
            }
            room_for_an_object(&mut tasks, || limit.load(Ordering::SeqCst)).await.unwrap();
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            tasks.spawn(async move {
                most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            });
        }
        join_objects(&mut tasks).await.unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 7, "the raised limit was filled, never passed");
    }
}
