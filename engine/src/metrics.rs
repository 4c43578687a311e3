//! The stager's Prometheus metrics: every name is defined here, once.
//!
//! Names follow the Prometheus conventions (`ferry_stager_` prefix, base
//! units, `_total` counters, `_seconds` histograms). Labels are bounded
//! enumerations (direction, result, operation, reason); there are no
//! per-object or per-key labels, so cardinality does not grow with the
//! dataset. The CLI serves the exposition at `--metrics-addr` on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use ferry_contract::summary::VerifiedKind;

use crate::store::RetryReason;

/// Which way bytes moved.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Direction {
    /// Object storage to local disk.
    Download,
    /// Local disk to object storage.
    Upload,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Download => "download",
            Direction::Upload => "upload",
        }
    }
}

/// How an object ended, label `result` of `ferry_stager_objects_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum ObjectResult {
    /// Copied and verified.
    Transferred,
    /// Already in place and verified by an earlier run.
    Skipped,
    /// Failed after retries.
    Failed,
    /// Refused before any byte moved (unsafe key, unreadable file).
    Refused,
}

impl ObjectResult {
    fn as_str(self) -> &'static str {
        match self {
            ObjectResult::Transferred => "transferred",
            ObjectResult::Skipped => "skipped",
            ObjectResult::Failed => "failed",
            ObjectResult::Refused => "refused",
        }
    }
}

/// The store operation a request performed, label `operation`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Operation {
    /// A page of a listing.
    List,
    /// Reading an object's metadata.
    Head,
    /// A GET of a whole object or a range.
    Get,
    /// A single-request upload.
    Put,
    /// Starting a multipart upload.
    CreateMultipart,
    /// Uploading one part.
    UploadPart,
    /// Completing a multipart upload.
    CompleteMultipart,
    /// Aborting a multipart upload.
    AbortMultipart,
    /// Listing the parts an unfinished multipart upload already has.
    ListParts,
    /// Listing unfinished multipart uploads under a prefix.
    ListUploads,
}

impl Operation {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::List => "list",
            Operation::Head => "head",
            Operation::Get => "get",
            Operation::Put => "put",
            Operation::CreateMultipart => "create_multipart",
            Operation::UploadPart => "upload_part",
            Operation::CompleteMultipart => "complete_multipart",
            Operation::AbortMultipart => "abort_multipart",
            Operation::ListParts => "list_parts",
            Operation::ListUploads => "list_uploads",
        }
    }
}

/// Why a peer was bypassed, label `reason` of `ferry_stager_peer_failures_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum PeerFailure {
    /// It did not answer, or broke off a response.
    Unreachable,
    /// It made no progress, or its response stalled, for `--peer-timeout`.
    Stalled,
    /// Its bytes did not match the store's checksum.
    Mismatch,
    /// It refused this worker's secret, protocol version or certificate.
    Refused,
}

impl PeerFailure {
    /// All of them, for pre-registering metric series.
    pub const ALL: [PeerFailure; 4] =
        [PeerFailure::Unreachable, PeerFailure::Stalled, PeerFailure::Mismatch, PeerFailure::Refused];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerFailure::Unreachable => "unreachable",
            PeerFailure::Stalled => "stalled",
            PeerFailure::Mismatch => "mismatch",
            PeerFailure::Refused => "refused",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Label values of `ferry_stager_peer_bytes_total`.
const PEER_RECEIVED: &str = "received";
const PEER_SERVED: &str = "served";

fn duration_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The stager's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    bytes: Family<DirectionLabels, Counter>,
    objects: Family<ResultLabels, Counter>,
    request_duration: Family<OperationLabels, Histogram, fn() -> Histogram>,
    retries: Family<ReasonLabels, Counter>,
    verified: Family<KindLabels, Counter>,
    resumed: Family<DirectionLabels, Counter>,
    in_flight: Gauge,
    peer_bytes: Family<DirectionLabels, Counter>,
    peer_failures: Family<ReasonLabels, Counter>,
    peer_refused: Counter,
    peer_waits: Counter,
    peer_waits_open: Gauge,
    concurrency_limit: Gauge,
    request_rate_cap: Gauge,
    share_requests: Gauge,
    share_bytes: Gauge,
    /// What adaptive concurrency judges a limit by, readable without the
    /// label lookups of the families above.
    flow: Flow,
}

/// Bytes moved and throttled requests, as plain counters.
#[derive(Debug, Default)]
struct Flow {
    bytes: AtomicU64,
    throttles: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    ///
    /// Long on purpose: one registration per metric, a list read top to
    /// bottom; split, it would only scatter the names a dashboard looks for.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ferry_stager");
        let bytes = Family::<DirectionLabels, Counter>::default();
        let objects = Family::<ResultLabels, Counter>::default();
        let request_duration =
            Family::<OperationLabels, Histogram, fn() -> Histogram>::new_with_constructor(duration_histogram);
        let retries = Family::<ReasonLabels, Counter>::default();
        let verified = Family::<KindLabels, Counter>::default();
        let resumed = Family::<DirectionLabels, Counter>::default();
        let in_flight = Gauge::default();
        let peer_bytes = Family::<DirectionLabels, Counter>::default();
        let peer_failures = Family::<ReasonLabels, Counter>::default();
        let peer_refused = Counter::default();
        let peer_waits = Counter::default();
        let peer_waits_open = Gauge::default();
        let concurrency_limit = Gauge::default();
        let request_rate_cap = Gauge::default();
        let share_requests = Gauge::default();
        let share_bytes = Gauge::default();
        registry.register_with_unit(
            "transferred",
            "Bytes written to their destination (disk for downloads, the store for uploads)",
            Unit::Bytes,
            bytes.clone(),
        );
        registry.register("objects", "Objects finished, by result", objects.clone());
        registry.register_with_unit(
            "request_duration",
            "Duration of store requests, including the body, by operation",
            Unit::Seconds,
            request_duration.clone(),
        );
        registry.register("retries", "Store requests retried, by reason", retries.clone());
        registry.register(
            "verified_objects",
            "Objects transferred, by what they were verified against",
            verified.clone(),
        );
        registry.register_with_unit(
            "resumed",
            "Bytes an interrupted earlier run had copied and this run kept instead of copying again",
            Unit::Bytes,
            resumed.clone(),
        );
        registry.register("requests_in_flight", "Store requests currently in flight", in_flight.clone());
        registry.register(
            "concurrency_limit",
            "Store requests allowed in flight at once (with --concurrency auto, what the run chose last)",
            concurrency_limit.clone(),
        );
        registry.register(
            "request_rate_cap",
            "Store requests per second the run may start now: the lowest of --max-request-rate, its store budget \
             share and the rate throttling taught it (0: no cap)",
            request_rate_cap.clone(),
        );
        registry.register(
            "store_share_requests_per_second",
            "This worker's share of its store's budget: requests per second (0: no budget caps requests)",
            share_requests.clone(),
        );
        registry.register(
            "store_share_bytes_per_second",
            "This worker's share of its store's budget: bytes per second (0: no budget caps bandwidth)",
            share_bytes.clone(),
        );
        registry.register_with_unit(
            "peer",
            "Fleet staging: bytes received from peers instead of the store, and bytes served to peers",
            Unit::Bytes,
            peer_bytes.clone(),
        );
        registry.register(
            "peer_failures",
            "Fleet staging: peers bypassed (their share read from the store), by reason",
            peer_failures.clone(),
        );
        registry.register(
            "peer_refused_requests",
            "Fleet staging: requests to the peer port without the DataStage's secret, and TLS handshakes without its certificate",
            peer_refused.clone(),
        );
        registry.register(
            "peer_wait_requests",
            "Fleet staging: long polls sent to peers, each about many objects waited for",
            peer_waits.clone(),
        );
        registry.register(
            "peer_waits_open",
            "Fleet staging: peers' long polls this worker holds open now (one per peer waiting for it)",
            peer_waits_open.clone(),
        );
        // Pre-create label sets so every series exists from the first scrape.
        for result in [ObjectResult::Transferred, ObjectResult::Skipped, ObjectResult::Failed, ObjectResult::Refused] {
            let _ = objects.get_or_create(&ResultLabels { result: result.as_str() });
        }
        for reason in RetryReason::ALL {
            let _ = retries.get_or_create(&ReasonLabels { reason: reason.as_str() });
        }
        for kind in VerifiedKind::ALL {
            let _ = verified.get_or_create(&KindLabels { kind: kind.as_str() });
        }
        for direction in [Direction::Download, Direction::Upload] {
            let _ = resumed.get_or_create(&DirectionLabels { direction: direction.as_str() });
        }
        for direction in [PEER_RECEIVED, PEER_SERVED] {
            let _ = peer_bytes.get_or_create(&DirectionLabels { direction });
        }
        for failure in PeerFailure::ALL {
            let _ = peer_failures.get_or_create(&ReasonLabels { reason: failure.as_str() });
        }
        Self {
            registry,
            bytes,
            objects,
            request_duration,
            retries,
            verified,
            resumed,
            in_flight,
            peer_bytes,
            peer_failures,
            peer_refused,
            peer_waits,
            peer_waits_open,
            concurrency_limit,
            request_rate_cap,
            share_requests,
            share_bytes,
            flow: Flow::default(),
        }
    }

    /// Counts bytes received from a peer.
    pub fn peer_bytes_received(&self, bytes: u64) {
        self.peer_bytes.get_or_create(&DirectionLabels { direction: PEER_RECEIVED }).inc_by(bytes);
    }

    /// Counts bytes served to a peer.
    pub fn peer_bytes_served(&self, bytes: u64) {
        self.peer_bytes.get_or_create(&DirectionLabels { direction: PEER_SERVED }).inc_by(bytes);
    }

    /// Counts a peer bypassed.
    pub fn peer_failure(&self, failure: PeerFailure) {
        self.peer_failures.get_or_create(&ReasonLabels { reason: failure.as_str() }).inc();
    }

    /// Counts a wait request sent to a peer.
    pub fn peer_wait_request(&self) {
        self.peer_waits.inc();
    }

    /// Wait requests sent to peers so far.
    pub fn peer_wait_requests(&self) -> u64 {
        self.peer_waits.get()
    }

    /// Counts a peer's long poll held open until the guard is dropped.
    pub fn peer_wait_open(&self) -> GaugeGuard {
        GaugeGuard::up(&self.peer_waits_open)
    }

    /// Peers' long polls held open now.
    pub fn peer_waits_open(&self) -> i64 {
        self.peer_waits_open.get()
    }

    /// Counts a request to the peer port without the secret.
    pub fn peer_request_refused(&self) {
        self.peer_refused.inc();
    }

    /// Counts bytes that reached their destination.
    pub fn add_bytes(&self, direction: Direction, bytes: u64) {
        self.bytes.get_or_create(&DirectionLabels { direction: direction.as_str() }).inc_by(bytes);
        self.flow.bytes.fetch_add(bytes, Relaxed);
    }

    /// Bytes that reached their destination so far, both directions.
    pub fn bytes_moved(&self) -> u64 {
        self.flow.bytes.load(Relaxed)
    }

    /// Requests the store throttled so far.
    pub fn throttles(&self) -> u64 {
        self.flow.throttles.load(Relaxed)
    }

    /// Store requests in flight now.
    pub fn requests_in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// Records the number of requests allowed in flight.
    pub fn set_concurrency_limit(&self, limit: usize) {
        self.concurrency_limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    /// Records the request-rate cap in force (`None`: no cap).
    pub fn set_request_rate_cap(&self, cap: Option<u64>) {
        self.request_rate_cap.set(cap.map_or(0, |cap| i64::try_from(cap).unwrap_or(i64::MAX)));
    }

    /// Records this worker's share of a store budget.
    pub fn set_store_share(&self, share: &ferry_contract::StoreShare) {
        self.share_requests.set(share.requests_per_second.map_or(0, i64::from));
        self.share_bytes.set(share.bytes_per_second.map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX)));
    }

    /// Counts a finished object.
    pub fn object(&self, result: ObjectResult) {
        self.objects.get_or_create(&ResultLabels { result: result.as_str() }).inc();
    }

    /// Records one request attempt's duration.
    pub fn observe_request(&self, operation: Operation, elapsed: Duration) {
        self.request_duration
            .get_or_create(&OperationLabels { operation: operation.as_str() })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a transferred object by what it was verified against.
    pub fn verified(&self, kind: VerifiedKind) {
        self.verified.get_or_create(&KindLabels { kind: kind.as_str() }).inc();
    }

    /// Counts bytes an earlier run had copied that this run kept.
    pub fn resumed(&self, direction: Direction, bytes: u64) {
        self.resumed.get_or_create(&DirectionLabels { direction: direction.as_str() }).inc_by(bytes);
    }

    /// Counts a retry.
    pub fn retry(&self, reason: RetryReason) {
        self.retries.get_or_create(&ReasonLabels { reason: reason.as_str() }).inc();
        if reason == RetryReason::Throttled {
            self.flow.throttles.fetch_add(1, Relaxed);
        }
    }

    /// Marks a request as in flight until the guard is dropped.
    pub fn request_started(&self) -> GaugeGuard {
        GaugeGuard::up(&self.in_flight)
    }

    /// The registry every metric is in, for a server that exposes it.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The exposition in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// One unit of a gauge (a request in flight, a long poll open), taken
/// back when dropped.
#[derive(Debug)]
pub struct GaugeGuard {
    gauge: Gauge,
}

impl GaugeGuard {
    fn up(gauge: &Gauge) -> Self {
        gauge.inc();
        // A clone shares the gauge's value.
        Self { gauge: gauge.clone() }
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn exposition_uses_base_units_and_the_stager_prefix() {
        let metrics = Arc::new(Metrics::new());
        metrics.add_bytes(Direction::Download, 42);
        metrics.object(ObjectResult::Transferred);
        metrics.observe_request(Operation::Get, Duration::from_millis(3));
        metrics.retry(RetryReason::Throttled);
        metrics.verified(VerifiedKind::EtagMultipart);
        metrics.resumed(Direction::Upload, 7);
        metrics.peer_bytes_received(5);
        metrics.peer_failure(PeerFailure::Mismatch);
        metrics.set_concurrency_limit(24);
        metrics.set_request_rate_cap(Some(80));
        let guard = metrics.request_started();
        let text = metrics.encode();
        assert_eq!((metrics.bytes_moved(), metrics.throttles(), metrics.requests_in_flight()), (42, 1, 1));
        drop(guard);
        for needle in [
            "ferry_stager_transferred_bytes_total{direction=\"download\"} 42",
            "ferry_stager_objects_total{result=\"transferred\"} 1",
            "ferry_stager_objects_total{result=\"failed\"} 0",
            "ferry_stager_request_duration_seconds_count{operation=\"get\"} 1",
            "ferry_stager_retries_total{reason=\"throttled\"} 1",
            "ferry_stager_requests_in_flight 1",
            "ferry_stager_concurrency_limit 24",
            "ferry_stager_request_rate_cap 80",
            "ferry_stager_verified_objects_total{kind=\"etag_multipart\"} 1",
            "ferry_stager_verified_objects_total{kind=\"crc64nvme\"} 0",
            "ferry_stager_resumed_bytes_total{direction=\"upload\"} 7",
            "ferry_stager_peer_bytes_total{direction=\"received\"} 5",
            "ferry_stager_peer_bytes_total{direction=\"served\"} 0",
            "ferry_stager_peer_failures_total{reason=\"mismatch\"} 1",
            "ferry_stager_peer_wait_requests_total 0",
            "ferry_stager_peer_waits_open 0",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
