//! `ferry-stager wait NAMESPACE/DATASTAGE`: block until a DataStage's data
//! is in place on this node, so a training pod's init container can reuse
//! data staged once per node instead of copying it again.
//!
//! "In place on this node" means, for a hostPath DataStage, that the worker
//! for this node (`--node`, usually `NODE_NAME` from the downward API) has
//! Succeeded: a node without a worker never gets the data, so once the
//! DataStage has finished without one the wait fails and says so. For a
//! shared claim, or without a node, the whole DataStage must be Ready.
//! A copy evicted from this node to make room is not in place: the wait
//! goes on until it is staged again. With `--snapshot DIGEST` the data must
//! also be that version of the dataset. A Failed DataStage or worker ends the wait with its message.
//! The pod needs `get` on `datastages.ferry.dev` in that namespace.

use std::time::{Duration, Instant};

use ferry_crds::{DataStage, Phase};
use kube::Api;

/// Why waiting ended without the data.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The argument is not `NAMESPACE/NAME`.
    #[error("expected NAMESPACE/DATASTAGE, got '{0}'")]
    Target(String),
    /// No cluster configuration (no KUBECONFIG, not in a pod).
    #[error("cannot reach the Kubernetes API: {0}")]
    Client(#[source] kube::Error),
    /// The DataStage failed.
    #[error("DataStage {target} failed: {message}")]
    Failed {
        /// `namespace/name`.
        target: String,
        /// Its Failed condition's message.
        message: String,
    },
    /// `--timeout` passed.
    #[error("DataStage {target} was not ready within {timeout:?} (last seen: {last})")]
    Timeout {
        /// `namespace/name`.
        target: String,
        /// The limit.
        timeout: Duration,
        /// What was seen last.
        last: String,
    },
}

/// What one look at the DataStage says.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The data is in place for this node.
    Ready,
    /// Not yet; the text says what was seen.
    Waiting(String),
    /// It failed; the text says why.
    Failed(String),
}

/// Judges a DataStage for `node` and, when given, the `snapshot` digest
/// the data must have (pure, unit-tested).
pub fn verdict(ds: Option<&DataStage>, node: Option<&str>, snapshot: Option<&str>) -> Verdict {
    let Some(ds) = ds else { return Verdict::Waiting("the DataStage does not exist yet".into()) };
    let Some(status) = ds.status.as_ref() else { return Verdict::Waiting("no status yet".into()) };
    let failed_message = || ds.failure_message();
    let per_node = ds.spec.plan().is_ok_and(|plan| plan.per_node());
    let (phase, digest, what) = match node.filter(|_| per_node) {
        Some(node) => match status.workers.iter().find(|w| w.node.as_deref() == Some(node)) {
            Some(worker) if worker.evicted.is_some() => {
                let why = worker.evicted.as_ref().map(|e| e.message.as_str()).unwrap_or_default();
                return Verdict::Waiting(format!(
                    "the copy on {node} was {why}; it stages again once a pod labelled with the DataStage waits for it here"
                ));
            }
            Some(worker) => (worker.phase, worker.snapshot.as_deref(), format!("the worker on {node}")),
            None if status.phase.is_some_and(Phase::is_finished) => {
                let nodes: Vec<&str> = status.workers.iter().filter_map(|w| w.node.as_deref()).collect();
                return Verdict::Failed(format!(
                    "node {node} is not one the DataStage stages onto ({}): run this pod on one of them, or widen spec.placement so that {node} matches",
                    nodes.join(", ")
                ));
            }
            None => return Verdict::Waiting(format!("no worker on {node} yet (DataStage is {:?})", status.phase)),
        },
        None => (status.phase, status.snapshot.as_ref().map(|s| s.digest.as_str()), "the DataStage".to_owned()),
    };
    match phase {
        Some(Phase::Succeeded) => match snapshot {
            Some(wanted) if digest != Some(wanted) => {
                Verdict::Waiting(format!("{what} holds snapshot {}, not {wanted}", digest.unwrap_or("(unknown)")))
            }
            _ => Verdict::Ready,
        },
        Some(Phase::Failed) if node.is_some() && per_node => Verdict::Failed(
            status
                .workers
                .iter()
                .find(|w| w.node.as_deref() == node)
                .and_then(|w| w.message.clone())
                .unwrap_or_else(failed_message),
        ),
        Some(Phase::Failed) => Verdict::Failed(failed_message()),
        phase => Verdict::Waiting(format!("{what} is {phase:?}")),
    }
}

/// Polls until the data is in place for `node` (and is `snapshot`, when given).
///
/// # Errors
/// A failed DataStage, a timeout, or no access to the API.
pub async fn wait(
    target: &str,
    node: Option<&str>,
    snapshot: Option<&str>,
    timeout: Option<Duration>,
) -> Result<(), WaitError> {
    let (namespace, name) = target.split_once('/').ok_or_else(|| WaitError::Target(target.to_owned()))?;
    let client = kube::Client::try_default().await.map_err(WaitError::Client)?;
    let api: Api<DataStage> = Api::namespaced(client, namespace);
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let ds = match api.get_opt(name).await {
            Ok(ds) => ds,
            Err(error) => {
                last = format!("API error: {error}");
                None
            }
        };
        match verdict(ds.as_ref(), node, snapshot) {
            Verdict::Ready => {
                tracing::info!(datastage = %target, node, "data is in place");
                return Ok(());
            }
            Verdict::Failed(message) => return Err(WaitError::Failed { target: target.to_owned(), message }),
            Verdict::Waiting(seen) if !last.starts_with("API error") || ds.is_some() => {
                if seen != last {
                    tracing::info!(datastage = %target, %seen, "waiting");
                }
                last = seen;
            }
            Verdict::Waiting(_) => {}
        }
        if let Some(timeout) = timeout
            && started.elapsed() > timeout
        {
            return Err(WaitError::Timeout { target: target.to_owned(), timeout, last });
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(status: serde_json::Value) -> DataStage {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "n"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_node_waits_for_its_own_worker_only() {
        let d = ds(serde_json::json!({"phase": "Running", "workers": [
            {"name": "a", "node": "a", "phase": "Succeeded"}, {"name": "b", "node": "b", "phase": "Running"}]}));
        assert_eq!(verdict(Some(&d), Some("a"), None), Verdict::Ready);
        assert!(matches!(verdict(Some(&d), Some("b"), None), Verdict::Waiting(_)));
        assert!(matches!(verdict(Some(&d), None, None), Verdict::Waiting(_)));
        assert!(matches!(verdict(None, Some("a"), None), Verdict::Waiting(_)));
    }

    #[test]
    fn a_node_without_a_worker_is_never_ready_and_fails_once_the_datastage_finished() {
        let running =
            ds(serde_json::json!({"phase": "Running", "workers": [{"name": "a", "node": "a", "phase": "Running"}]}));
        assert!(matches!(verdict(Some(&running), Some("b"), None), Verdict::Waiting(_)));
        let done = ds(
            serde_json::json!({"phase": "Succeeded", "workers": [{"name": "a", "node": "a", "phase": "Succeeded"}]}),
        );
        let Verdict::Failed(message) = verdict(Some(&done), Some("b"), None) else { panic!("node b has no data") };
        assert!(message.contains("node b is not one the DataStage stages onto (a)"), "{message}");
        assert_eq!(verdict(Some(&done), Some("a"), None), Verdict::Ready);
    }

    #[test]
    fn an_evicted_copy_is_not_in_place() {
        let d =
            ds(serde_json::json!({"phase": "Succeeded", "workers": [{"name": "a", "node": "a", "phase": "Succeeded",
            "evicted": {"time": "2026-01-01T00:00:00Z", "message": "evicted from node a to make room for n/x"}}]}));
        let verdict = verdict(Some(&d), Some("a"), None);
        assert!(matches!(&verdict, Verdict::Waiting(m) if m.contains("was evicted from node a")), "{verdict:?}");
    }

    #[test]
    fn a_snapshot_wait_holds_until_that_version_is_in_place() {
        let d = ds(serde_json::json!({"phase": "Succeeded", "snapshot": {"objects": 1, "bytes": 1, "digest": "aa"},
            "workers": [{"name": "a", "node": "a", "phase": "Succeeded", "snapshot": "aa"}]}));
        assert_eq!(verdict(Some(&d), Some("a"), Some("aa")), Verdict::Ready);
        assert!(matches!(verdict(Some(&d), Some("a"), Some("bb")), Verdict::Waiting(_)));
        assert_eq!(verdict(Some(&d), None, Some("aa")), Verdict::Ready);
        assert!(matches!(verdict(Some(&d), None, Some("bb")), Verdict::Waiting(_)));
    }

    #[test]
    fn a_failed_worker_ends_the_wait_with_its_message() {
        let d = ds(serde_json::json!({"phase": "Failed", "workers": [
            {"name": "a", "node": "a", "phase": "Failed", "message": "bucket 'b' does not exist"}]}));
        assert_eq!(verdict(Some(&d), Some("a"), None), Verdict::Failed("bucket 'b' does not exist".into()));
        let whole = ds(serde_json::json!({"phase": "Succeeded"}));
        assert_eq!(verdict(Some(&whole), None, None), Verdict::Ready);
    }
}
