//! Whether a DataStage's data can be read by a training pod, and where: the
//! one judgement the operator's scheduling gate (and anything else that
//! waits for data) makes from a DataStage's status alone.
//!
//! A pull onto node-local volumes is ready once its current run has
//! Succeeded: the pod may then run on any node whose worker holds the
//! current snapshot and was not evicted from it. A pull onto a claim is ready anywhere once it has
//! Succeeded. A status that still describes an older spec (its
//! `observedGeneration` lags) says nothing about the current one, and a
//! push has no data for a pod to read.

use std::collections::BTreeSet;

use kube::ResourceExt as _;

use crate::plan::Direction;
use crate::{DataStage, DataStageStatus, Phase, WorkerStatus};

/// What a pod that wants a DataStage's data should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataReadiness {
    /// The data is in place: on these nodes (node-local volumes), or on any
    /// node (`None`: a claim, which the pod mounts wherever it runs).
    Ready(Option<BTreeSet<String>>),
    /// Not yet; the text says what was seen, for a person.
    Waiting(String),
    /// It will not be: the text says why and what to do.
    Failed(String),
}

impl DataStage {
    /// Judges where, if anywhere, this DataStage's data is ready (pure).
    pub fn data_readiness(&self) -> DataReadiness {
        let Ok(plan) = self.spec.plan() else {
            return DataReadiness::Failed("its spec names no object store and volume".into());
        };
        if plan.direction == Direction::Push {
            return DataReadiness::Failed(
                "it is a push (volume to object storage): there is no data for a pod to read; name a pull DataStage"
                    .into(),
            );
        }
        let Some(status) = self.status.as_ref() else { return DataReadiness::Waiting("no status yet".into()) };
        if status.observed_generation != self.metadata.generation {
            return DataReadiness::Waiting("the operator has not yet acted on its latest spec".into());
        }
        match status.phase {
            Some(Phase::Succeeded) if plan.per_node() => {
                let staged: Vec<&WorkerStatus> = status.staged_copies().collect();
                let nodes: BTreeSet<String> =
                    staged.iter().filter(|w| w.evicted.is_none()).filter_map(|w| w.node.clone()).collect();
                if nodes.is_empty() && !staged.is_empty() {
                    DataReadiness::Waiting(format!(
                        "DataStage {} was evicted from every node to make room; it stages again for a pod that waits for it",
                        self.name_any()
                    ))
                } else if nodes.is_empty() {
                    DataReadiness::Failed("it succeeded but no node holds its current snapshot".into())
                } else {
                    DataReadiness::Ready(Some(nodes))
                }
            }
            Some(Phase::Succeeded) => DataReadiness::Ready(None),
            Some(Phase::Failed) => DataReadiness::Failed(self.failure_message()),
            phase => {
                let progress = status.progress.as_deref().map(|p| format!(", {p}")).unwrap_or_default();
                let phase = phase.map_or("Pending".to_owned(), |p| format!("{p:?}"));
                DataReadiness::Waiting(format!("DataStage {} is {phase}{progress}", self.name_any()))
            }
        }
    }

    /// The message of its `Failed` condition, or a generic one.
    pub fn failure_message(&self) -> String {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Failed" && c.status == "True"))
            .map_or_else(|| "failed".to_owned(), |c| c.message.clone())
    }
}

impl DataStageStatus {
    /// The entries whose worker staged the current run's snapshot (on a
    /// node, or the shard of a claim): Succeeded in the current run, with
    /// the snapshot the status names, if it names one. An evicted copy is
    /// one of them (its `evicted` says it is gone).
    pub fn staged_copies(&self) -> impl Iterator<Item = &WorkerStatus> {
        let current = self.snapshot.as_ref().map(|s| s.digest.as_str());
        self.workers.iter().filter(move |w| {
            w.phase == Some(Phase::Succeeded)
                && w.run == self.run
                && (current.is_none() || w.snapshot.as_deref() == current)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(volume: serde_json::Value, status: serde_json::Value) -> DataStage {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": "n", "generation": 2},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": volume}},
            "status": status,
        }))
        .unwrap()
    }

    fn worker(node: &str, phase: &str, run: i64, snapshot: &str) -> serde_json::Value {
        serde_json::json!({"name": node, "node": node, "phase": phase, "run": run, "snapshot": snapshot})
    }

    #[test]
    fn node_local_data_is_ready_on_the_nodes_holding_the_current_snapshot() {
        let ds = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Succeeded", "observedGeneration": 2, "run": 3,
                "snapshot": {"objects": 1, "bytes": 1, "digest": "new"},
                "workers": [worker("a", "Succeeded", 3, "new"), worker("b", "Succeeded", 2, "old"),
                            worker("c", "Succeeded", 3, "old"), worker("d", "Succeeded", 3, "new")]}),
        );
        let nodes = BTreeSet::from(["a".to_owned(), "d".to_owned()]);
        assert_eq!(ds.data_readiness(), DataReadiness::Ready(Some(nodes)));
    }

    #[test]
    fn an_evicted_node_does_not_hold_the_data_and_a_datastage_evicted_everywhere_waits() {
        let evicted = |node: &str| {
            let mut w = worker(node, "Succeeded", 3, "new");
            w["evicted"] = serde_json::json!({"time": "2026-01-01T00:00:00Z", "message": "room for n/other"});
            w
        };
        let partly = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Succeeded", "observedGeneration": 2, "run": 3,
                "snapshot": {"objects": 1, "bytes": 1, "digest": "new"},
                "workers": [evicted("a"), worker("b", "Succeeded", 3, "new")]}),
        );
        assert_eq!(partly.data_readiness(), DataReadiness::Ready(Some(BTreeSet::from(["b".to_owned()]))));
        let everywhere = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Succeeded", "observedGeneration": 2, "run": 3,
                "snapshot": {"objects": 1, "bytes": 1, "digest": "new"},
                "workers": [evicted("a"), evicted("b")]}),
        );
        assert!(
            matches!(everywhere.data_readiness(), DataReadiness::Waiting(m) if m.contains("evicted from every node"))
        );
    }

    #[test]
    fn a_claim_is_ready_anywhere_once_succeeded() {
        let ds = stage(
            serde_json::json!({"persistentVolumeClaim": {"claimName": "c"}}),
            serde_json::json!({"phase": "Succeeded", "observedGeneration": 2}),
        );
        assert_eq!(ds.data_readiness(), DataReadiness::Ready(None));
    }

    #[test]
    fn running_stale_failed_and_push_stages_are_not_ready() {
        let running = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Running", "observedGeneration": 2, "progress": "1/4 objects"}),
        );
        assert_eq!(running.data_readiness(), DataReadiness::Waiting("DataStage d is Running, 1/4 objects".into()));

        let stale = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Succeeded", "observedGeneration": 1,
                "workers": [worker("a", "Succeeded", 1, "x")]}),
        );
        assert!(matches!(stale.data_readiness(), DataReadiness::Waiting(_)));

        let failed = stage(
            serde_json::json!({"hostPath": "/mnt/d"}),
            serde_json::json!({"phase": "Failed", "observedGeneration": 2, "conditions": [{
                "type": "Failed", "status": "True", "reason": "BucketNotFound", "message": "bucket b does not exist",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        assert_eq!(failed.data_readiness(), DataReadiness::Failed("bucket b does not exist".into()));

        let mut push = stage(serde_json::json!({"hostPath": "/mnt/d"}), serde_json::json!({"phase": "Succeeded"}));
        std::mem::swap(&mut push.spec.source, &mut push.spec.destination);
        assert!(matches!(push.data_readiness(), DataReadiness::Failed(m) if m.contains("push")));
    }
}
