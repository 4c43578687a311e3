//! The operator's Prometheus metrics, every name defined here
//! (`ferry_operator_` prefix, base units, bounded labels).
//!
//! Per-DataStage series (`ferry_operator_datastage_*`) carry the
//! DataStage's namespace and name, as kube-state-metrics does for its
//! objects: one series per DataStage and state, removed when it is
//! deleted, never one per object or file. Throughput per node comes from the
//! stagers' own metrics, labelled by the scrape (see the chart's PodMonitor).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use ferry_crds::Phase;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: String,
    state: &'static str,
}

/// What the metrics show of one StoreBudget's split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetFigures {
    /// Workers the budget is split among.
    pub workers: i64,
    /// DataStages those workers belong to.
    pub datastages: i64,
    /// Each worker's requests per second (0: not capped).
    pub share_requests_per_second: i64,
    /// Each worker's bytes per second (0: not capped).
    pub share_bytes_per_second: i64,
    /// Throttled requests the workers reported.
    pub throttled_requests: i64,
}

impl BudgetFigures {
    /// Every state, as labelled.
    fn states(&self) -> [(&'static str, i64); 5] {
        [
            ("workers", self.workers),
            ("datastages", self.datastages),
            ("share_requests_per_second", self.share_requests_per_second),
            ("share_bytes_per_second", self.share_bytes_per_second),
            ("throttled_requests", self.throttled_requests),
        ]
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DataStageLabels {
    namespace: String,
    datastage: String,
    state: &'static str,
}

/// What the metrics show of one DataStage: its phase and its totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataStageProgress {
    /// Its phase.
    pub phase: Phase,
    /// Bytes selected over all workers.
    pub bytes_total: i64,
    /// Bytes in place.
    pub bytes_done: i64,
    /// Objects selected.
    pub objects_total: i64,
    /// Objects in place.
    pub objects_done: i64,
    /// Objects that failed.
    pub objects_failed: i64,
    /// Bytes the workers received from peers instead of the store (0
    /// without fanout PeerToPeer: nothing was saved).
    pub bytes_from_peers: i64,
}

impl DataStageProgress {
    /// The phase and totals of a computed status.
    pub fn of(status: &ferry_crds::DataStageStatus) -> Self {
        let totals = status.totals.clone().unwrap_or_default();
        Self {
            phase: status.phase.unwrap_or(Phase::Pending),
            bytes_total: totals.bytes_total,
            bytes_done: totals.bytes_done,
            objects_total: totals.objects_total,
            objects_done: totals.objects_done,
            objects_failed: totals.objects_failed,
            bytes_from_peers: totals.bytes_from_peers.unwrap_or(0),
        }
    }
}

/// Every reason a reconciliation can fail with (the controller's error
/// categories). Their series exist from the start at 0, so a dashboard
/// shows "no errors" rather than "no data".
pub const RECONCILE_ERROR_REASONS: [&str; 9] = [
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "Invalid",
    "TooManyRequests",
    "ServerError",
    "Unreachable",
    "KubeApi",
];

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Operator metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    errors: Family<ReasonLabels, Counter>,
    duration: Histogram,
    queue_wait: Histogram,
    by_phase: Family<PhaseLabels, Gauge>,
    staged_bytes: Gauge,
    datastage_bytes: Family<DataStageLabels, Gauge>,
    datastage_objects: Family<DataStageLabels, Gauge>,
    known: Mutex<BTreeMap<(String, String), DataStageProgress>>,
    admissions: Family<OutcomeLabels, Counter>,
    gates: Family<OutcomeLabels, Counter>,
    certificate_expiry: Gauge,
    budgets: Family<BudgetLabels, Gauge>,
    evictions: Counter,
    evicted_bytes: Counter,
}

/// What the pod webhook did with one admission.
pub const ADMISSION_OUTCOMES: [&str; 5] = ["mutated", "unchanged", "ignored", "denied", "invalid"];
/// What the gate controller did with one gated pod.
pub const GATE_OUTCOMES: [&str; 2] = ["lifted", "held"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ferry_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let duration = reconcile_histogram();
        let queue_wait = reconcile_histogram();
        let errors = Family::<ReasonLabels, Counter>::default();
        let by_phase = Family::<PhaseLabels, Gauge>::default();
        let staged_bytes = Gauge::default();
        let datastage_bytes = Family::<DataStageLabels, Gauge>::default();
        let datastage_objects = Family::<DataStageLabels, Gauge>::default();
        registry.register("reconciles", "Reconciliations, by result", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Failed reconciliations, by reason (Forbidden, Conflict, Unreachable, ...)",
            errors.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Time spent in one reconciliation",
            Unit::Seconds,
            duration.clone(),
        );
        registry.register_with_unit(
            "queue_wait",
            "Time from a DataStage change reaching the operator to the start of the reconciliation that sees it",
            Unit::Seconds,
            queue_wait.clone(),
        );
        registry.register("datastages", "DataStages, by phase", by_phase.clone());
        registry.register_with_unit("staged", "Bytes in place over all DataStages", Unit::Bytes, staged_bytes.clone());
        registry.register_with_unit(
            "datastage",
            "Bytes of one DataStage, by state (total: selected, done: in place, from_peers: received from peers instead of the store)",
            Unit::Bytes,
            datastage_bytes.clone(),
        );
        registry.register(
            "datastage_objects",
            "Objects of one DataStage, by state (total, done, failed)",
            datastage_objects.clone(),
        );
        let admissions = Family::<OutcomeLabels, Counter>::default();
        let gates = Family::<OutcomeLabels, Counter>::default();
        let certificate_expiry = Gauge::default();
        registry.register("webhook_admissions", "Pod admissions the webhook answered, by outcome", admissions.clone());
        registry.register("gated_pods", "Gated pods the operator looked at, by outcome (lifted, held)", gates.clone());
        registry.register_with_unit(
            "webhook_certificate_expiry_timestamp",
            "When the webhook's serving certificate expires (Unix time; 0 before one is loaded)",
            Unit::Seconds,
            certificate_expiry.clone(),
        );
        let budgets = Family::<BudgetLabels, Gauge>::default();
        registry.register(
            "store_budget",
            "One StoreBudget's split, by state (workers, datastages, share_requests_per_second and share_bytes_per_second per worker with 0 for no cap, throttled_requests the workers reported)",
            budgets.clone(),
        );
        let (evictions, evicted_bytes) = (Counter::default(), Counter::default());
        registry.register(
            "evictions",
            "Copies of DataStages the operator evicted from nodes to make room",
            evictions.clone(),
        );
        registry.register_with_unit(
            "evicted",
            "Bytes of the copies the operator evicted from nodes",
            Unit::Bytes,
            evicted_bytes.clone(),
        );
        for outcome in ADMISSION_OUTCOMES {
            let _ = admissions.get_or_create(&OutcomeLabels { outcome });
        }
        for outcome in GATE_OUTCOMES {
            let _ = gates.get_or_create(&OutcomeLabels { outcome });
        }
        for result in ["ok", "error"] {
            let _ = reconciles.get_or_create(&ResultLabels { result });
        }
        for phase in [Phase::Pending, Phase::Running, Phase::Succeeded, Phase::Failed] {
            let _ = by_phase.get_or_create(&PhaseLabels { phase: phase_name(phase) });
        }
        for reason in RECONCILE_ERROR_REASONS {
            let _ = errors.get_or_create(&ReasonLabels { reason });
        }
        Self {
            registry,
            reconciles,
            errors,
            duration,
            queue_wait,
            by_phase,
            staged_bytes,
            datastage_bytes,
            datastage_objects,
            known: Mutex::default(),
            admissions,
            gates,
            certificate_expiry,
            budgets,
            evictions,
            evicted_bytes,
        }
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
    }
}

impl Metrics {
    /// Counts one copy of `bytes` the operator decided to evict.
    pub fn evicted(&self, bytes: u64) {
        self.evictions.inc();
        self.evicted_bytes.inc_by(bytes);
    }

    /// Counts one admission by its outcome (one of [`ADMISSION_OUTCOMES`]).
    pub fn webhook_admission(&self, outcome: &'static str) {
        self.admissions.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Counts one look at a gated pod (one of [`GATE_OUTCOMES`]).
    pub fn gated_pod(&self, outcome: &'static str) {
        self.gates.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Records when the serving certificate now in use expires.
    pub fn certificate_expires(&self, at: std::time::SystemTime) {
        let seconds = at.duration_since(std::time::SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs();
        self.certificate_expiry.set(i64::try_from(seconds).unwrap_or(i64::MAX));
    }

    /// Records one reconciliation: `Err` carries the error's static category.
    pub fn reconciled(&self, outcome: Result<(), &'static str>, elapsed: Duration) {
        self.reconciles.get_or_create(&ResultLabels { result: if outcome.is_ok() { "ok" } else { "error" } }).inc();
        if let Err(reason) = outcome {
            self.errors.get_or_create(&ReasonLabels { reason }).inc();
        }
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Records how long a DataStage change waited for its reconciliation
    /// ([`crate::queue_wait`]).
    pub fn queue_waited(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }

    /// Records the phase and totals of DataStage `namespace/name`; `None`
    /// when it is deleted, which removes its series.
    pub fn observe(&self, namespace: &str, name: &str, progress: Option<DataStageProgress>) {
        let mut known = self.known.lock().expect("metrics lock");
        let key = (namespace.to_owned(), name.to_owned());
        let labels = |state: &'static str| DataStageLabels {
            namespace: namespace.to_owned(),
            datastage: name.to_owned(),
            state,
        };
        match progress {
            Some(progress) => {
                known.insert(key, progress);
                self.datastage_bytes.get_or_create(&labels("total")).set(progress.bytes_total);
                self.datastage_bytes.get_or_create(&labels("done")).set(progress.bytes_done);
                self.datastage_bytes.get_or_create(&labels("from_peers")).set(progress.bytes_from_peers);
                self.datastage_objects.get_or_create(&labels("total")).set(progress.objects_total);
                self.datastage_objects.get_or_create(&labels("done")).set(progress.objects_done);
                self.datastage_objects.get_or_create(&labels("failed")).set(progress.objects_failed);
            }
            None => {
                known.remove(&key);
                for state in ["total", "done", "from_peers"] {
                    self.datastage_bytes.remove(&labels(state));
                }
                for state in ["total", "done", "failed"] {
                    self.datastage_objects.remove(&labels(state));
                }
            }
        }
        for phase in [Phase::Pending, Phase::Running, Phase::Succeeded, Phase::Failed] {
            let count = known.values().filter(|p| p.phase == phase).count() as i64;
            self.by_phase.get_or_create(&PhaseLabels { phase: phase_name(phase) }).set(count);
        }
        self.staged_bytes.set(known.values().map(|p| p.bytes_done).sum());
    }

    /// Records StoreBudget `name`'s split; `None` when it is deleted, which
    /// removes its series.
    pub fn observe_budget(&self, name: &str, figures: Option<BudgetFigures>) {
        for (state, value) in figures.unwrap_or_default().states() {
            let labels = BudgetLabels { budget: name.to_owned(), state };
            match figures {
                Some(_) => {
                    self.budgets.get_or_create(&labels).set(value);
                }
                None => {
                    self.budgets.remove(&labels);
                }
            }
        }
    }

    /// The exposition for a scrape that sent `accept`: content type and body.
    pub fn render(&self, accept: Option<&str>) -> (&'static str, String) {
        ferry_exposition::render(&self.registry, accept)
    }

    /// The exposition in OpenMetrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(phase: Phase, done: i64) -> DataStageProgress {
        DataStageProgress {
            phase,
            bytes_total: 100,
            bytes_done: done,
            objects_total: 4,
            objects_done: 2,
            objects_failed: 0,
            bytes_from_peers: done / 2,
        }
    }

    #[test]
    fn datastage_series_follow_the_datastage_and_go_with_it() {
        let metrics = Metrics::default();
        metrics.observe("ml", "imagenet", Some(progress(Phase::Running, 40)));
        metrics.observe("ml", "coco", Some(progress(Phase::Succeeded, 100)));
        let text = metrics.encode();
        assert!(
            text.contains(r#"ferry_operator_datastage_bytes{namespace="ml",datastage="imagenet",state="done"} 40"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ferry_operator_datastage_objects{namespace="ml",datastage="imagenet",state="total"} 4"#)
        );
        assert!(text.contains(r#"ferry_operator_datastages{phase="Running"} 1"#));
        assert!(
            text.contains(
                r#"ferry_operator_datastage_bytes{namespace="ml",datastage="imagenet",state="from_peers"} 20"#
            ),
            "{text}"
        );
        assert!(text.contains("ferry_operator_staged_bytes 140"));

        metrics.observe("ml", "imagenet", None);
        let text = metrics.encode();
        assert!(!text.contains(r#"datastage="imagenet""#), "{text}");
        assert!(text.contains(r#"ferry_operator_datastages{phase="Running"} 0"#));
        assert!(text.contains("ferry_operator_staged_bytes 100"));
    }

    #[test]
    fn failed_reconciliations_are_counted_by_reason() {
        let metrics = Metrics::default();
        metrics.reconciled(Ok(()), Duration::from_millis(3));
        metrics.reconciled(Err("Forbidden"), Duration::from_millis(3));
        let text = metrics.encode();
        assert!(text.contains(r#"ferry_operator_reconciles_total{result="error"} 1"#), "{text}");
        assert!(text.contains(r#"ferry_operator_reconcile_errors_total{reason="Forbidden"} 1"#), "{text}");
        assert!(text.contains("ferry_operator_reconcile_duration_seconds_count 2"));
    }

    #[test]
    fn queue_waits_are_a_histogram_of_their_own() {
        let metrics = Metrics::default();
        metrics.queue_waited(Duration::from_millis(3));
        metrics.queue_waited(Duration::from_millis(700));
        let text = metrics.encode();
        assert!(text.contains("ferry_operator_queue_wait_seconds_count 2"), "{text}");
        assert!(text.contains(r#"ferry_operator_queue_wait_seconds_bucket{le="0.004"} 1"#), "{text}");
        assert!(text.contains(r#"ferry_operator_queue_wait_seconds_bucket{le="1.024"} 2"#), "{text}");
        assert!(text.contains("ferry_operator_reconcile_duration_seconds_count 0"), "{text}");
    }
}
