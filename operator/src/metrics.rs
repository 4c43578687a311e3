//! The operator's Prometheus metrics, every name defined here
//! (`ferry_operator_` prefix, base units, bounded labels).

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

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Operator metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    duration: Histogram,
    by_phase: Family<PhaseLabels, Gauge>,
    staged_bytes: Gauge,
    phases: Mutex<BTreeMap<String, (Phase, i64)>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ferry_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let duration = reconcile_histogram();
        let by_phase = Family::<PhaseLabels, Gauge>::default();
        let staged_bytes = Gauge::default();
        registry.register("reconciles", "Reconciliations, by result", reconciles.clone());
        registry.register_with_unit(
            "reconcile_duration",
            "Time spent in one reconciliation",
            Unit::Seconds,
            duration.clone(),
        );
        registry.register("datastages", "DataStages, by phase", by_phase.clone());
        registry.register_with_unit("staged", "Bytes in place over all DataStages", Unit::Bytes, staged_bytes.clone());
        for result in ["ok", "error"] {
            let _ = reconciles.get_or_create(&ResultLabels { result });
        }
        Self { registry, reconciles, duration, by_phase, staged_bytes, phases: Mutex::default() }
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
    /// Records one reconciliation.
    pub fn reconciled(&self, ok: bool, elapsed: Duration) {
        self.reconciles.get_or_create(&ResultLabels { result: if ok { "ok" } else { "error" } }).inc();
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Records the phase and staged bytes of one DataStage (`None` when deleted).
    pub fn observe(&self, key: &str, state: Option<(Phase, i64)>) {
        let mut phases = self.phases.lock().expect("metrics lock");
        match state {
            Some(state) => phases.insert(key.to_owned(), state),
            None => phases.remove(key),
        };
        for phase in [Phase::Pending, Phase::Running, Phase::Succeeded, Phase::Failed] {
            let count = phases.values().filter(|(p, _)| *p == phase).count() as i64;
            self.by_phase.get_or_create(&PhaseLabels { phase: phase_name(phase) }).set(count);
        }
        self.staged_bytes.set(phases.values().map(|(_, bytes)| *bytes).sum());
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
