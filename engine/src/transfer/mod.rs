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
pub mod buffers;
pub mod capacity;
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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::local::staging::StagingError;
use crate::metrics::{GaugeGuard, Metrics, Operation};
use crate::selection::Selection;
use crate::store::{ObjectStore, StoreError};
use capacity::{CapacityCheck, CapacityError, is_disk_full};
use tally::Tally;

/// Memory the engine keeps aside for everything that is not a data buffer:
/// the runtime, listing pages, connection state.
pub const MEMORY_RESERVE: u64 = 32 << 20;
/// What one request costs beyond its data buffer (HTTP and TLS buffers).
pub const REQUEST_OVERHEAD: u64 = 256 << 10;
/// Memory is accounted in these units so the semaphore's u32 permits cover
/// terabytes.
const MEMORY_UNIT: u64 = 4 << 10;

pub use ferry_contract::{Reason, VerifyMode};

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

/// A run-level failure: nothing more can be done.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The configuration cannot work (e.g. memory limit below one part).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Listing the source failed.
    #[error("cannot list {uri}: {source}")]
    List {
        /// What was being listed.
        uri: String,
        /// Why it failed.
        #[source]
        source: StoreError,
    },
    /// The store refused the whole run (bucket missing, credentials wrong,
    /// endpoint unreachable).
    #[error("cannot reach {uri}: {source}")]
    Store {
        /// The bucket.
        uri: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The destination cannot be prepared.
    #[error(transparent)]
    Staging(#[from] crate::local::staging::StagingError),
    /// The local source of a push is unusable.
    #[error("cannot read '{path}': {source}")]
    Source {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A push that must push something found no file to select.
    #[error(
        "'{path}' holds no file to push (a directory the node created because it did not exist looks like this: check the path)"
    )]
    SourceEmpty {
        /// The source directory.
        path: PathBuf,
    },
    /// The manifest cannot be written.
    #[error("cannot write the manifest: {0}")]
    Manifest(#[source] std::io::Error),
    /// The destination has no room for the run, or ran out of it.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// The dataset holds more than its quota allows.
    #[error(
        "the dataset holds {}{} (all shards together), more than its quota of {} (--dataset-quota; a DataStage's comes from its namespace's StagingQuotas): raise the quota, free it, or stage less (include, exclude)",
        if *listing_finished { "" } else { "at least " },
        tally::human_bytes(*dataset_bytes),
        tally::human_bytes(*quota)
    )]
    Quota {
        /// Bytes of the dataset listed so far.
        dataset_bytes: u64,
        /// The quota.
        quota: u64,
        /// Whether every object had been listed: if not, the dataset is larger.
        listing_finished: bool,
    },
}

impl TransferError {
    /// A CamelCase name of why the run could not proceed, for status
    /// conditions (e.g. `BucketNotFound`, `AccessDenied`, `EndpointUnreachable`).
    pub fn reason(&self) -> Reason {
        match self {
            TransferError::Config(_) => Reason::InvalidConfiguration,
            TransferError::List { source, .. } | TransferError::Store { source, .. } => source.reason(),
            TransferError::Capacity(_) => Reason::InsufficientCapacity,
            TransferError::Quota { .. } => Reason::QuotaExceeded,
            // Creating the state directory or writing the manifest fails
            // the same way on a full disk.
            TransferError::Staging(StagingError::Prepare { source, .. }) | TransferError::Manifest(source)
                if is_disk_full(source) =>
            {
                Reason::InsufficientCapacity
            }
            TransferError::Staging(_) | TransferError::Manifest(_) => Reason::DestinationUnusable,
            TransferError::Source { .. } => Reason::SourceUnreadable,
            TransferError::SourceEmpty { .. } => Reason::SourceEmpty,
        }
    }

    /// What a pull refused for room found of its destination's filesystem,
    /// and needed of it.
    pub fn disk(&self) -> Option<&ferry_contract::DiskSpace> {
        match self {
            TransferError::Capacity(CapacityError::Insufficient { disk, .. }) => Some(disk),
            _ => None,
        }
    }

    /// Whether another attempt without a change cannot succeed.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A quota changes only with a new run (the operator's, or the
            // user's command line).
            TransferError::Config(_) | TransferError::SourceEmpty { .. } | TransferError::Quota { .. } => true,
            TransferError::List { source, .. } | TransferError::Store { source, .. } => source.is_permanent(),
            // A need larger than the whole filesystem never fits. Any other
            // refusal may fit once space is freed, which needs no change to
            // the run: a Job retries it a few times, then the operator
            // waits for room from the need the summary reports.
            TransferError::Capacity(CapacityError::Insufficient { disk, .. }) => !disk.could_ever_fit(),
            // A disk that filled up under the run (other writers) may have
            // room again a moment later, and the next attempt resumes.
            TransferError::Staging(_)
            | TransferError::Manifest(_)
            | TransferError::Source { .. }
            | TransferError::Capacity(CapacityError::DiskFull { .. }) => false,
        }
    }
}

/// Errors that may be worth another attempt.
pub trait Retryable {
    /// The retry category, or `None` when retrying cannot help.
    fn retry_reason(&self) -> Option<crate::store::RetryReason>;
}

impl Retryable for StoreError {
    fn retry_reason(&self) -> Option<crate::store::RetryReason> {
        StoreError::retry_reason(self)
    }
}

/// Whether a store error dooms every object of the run, not just one.
pub fn dooms_the_run(error: &StoreError) -> bool {
    match error {
        StoreError::NoSuchBucket { .. } | StoreError::NoCredentials(_) => true,
        StoreError::AccessDenied { code, .. } => {
            matches!(code.as_str(), "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken" | "InvalidToken")
        }
        StoreError::Transient { reason, .. } => *reason == crate::store::RetryReason::Connection,
        _ => false,
    }
}

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
const DISK_SLOTS_PER_CORE: usize = 8;

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
            disk_slots: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, usize::from) * DISK_SLOTS_PER_CORE,
            ),
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

    #[test]
    fn a_full_disk_is_insufficient_capacity_wherever_it_is_met_and_other_disk_errors_are_not() {
        let full = || std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let prepare = |source| TransferError::Staging(StagingError::Prepare { path: "/d/.ferry".into(), source });
        let filled_up = TransferError::Capacity(CapacityError::DiskFull {
            destination: "/d".into(),
            key: "k".into(),
            what: "writing to disk",
            source: full(),
        });
        for error in [filled_up, TransferError::Manifest(full()), prepare(full())] {
            assert_eq!(error.reason(), Reason::InsufficientCapacity, "{error}");
            assert!(!error.is_permanent(), "{error}");
        }
        for error in [TransferError::Manifest(denied()), prepare(denied())] {
            assert_eq!(error.reason(), Reason::DestinationUnusable, "{error}");
        }
    }

    #[test]
    fn a_refusal_for_room_is_final_only_when_the_need_is_larger_than_the_filesystem() {
        let refused = |needed: u64| {
            TransferError::Capacity(CapacityError::Insufficient {
                destination: "/d".into(),
                needed: needed - 2,
                reserve: 2,
                reserve_rule: "2".parse().unwrap(),
                listing_finished: true,
                disk: ferry_contract::DiskSpace {
                    filesystem: "0:52".into(),
                    size_bytes: 100,
                    free_bytes: 10,
                    needed_bytes: Some(needed),
                    claimed_bytes: None,
                    measured_at: 1,
                },
            })
        };
        for (needed, never_fits) in [(11, false), (100, false), (101, true)] {
            let error = refused(needed);
            assert_eq!(error.reason(), Reason::InsufficientCapacity);
            assert_eq!(error.is_permanent(), never_fits, "{needed} of 100: {error}");
            assert_eq!(error.disk().and_then(|d| d.needed_bytes), Some(needed));
        }
    }

    #[test]
    fn a_memory_limit_below_one_part_is_refused_with_advice() {
        let err = Budget::new(8, false, 40 << 20, 16 << 20, None, Arc::new(Metrics::new())).unwrap_err();
        assert!(err.to_string().contains("--part-size"), "{err}");
        assert!(Budget::new(8, false, 256 << 20, 8 << 20, None, Arc::new(Metrics::new())).is_ok());
    }
}
