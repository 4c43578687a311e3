//! `ferry-stager wait NAMESPACE/DATASTAGE`: block until a DataStage's data
//! is in place on this node, so a training pod's init container can reuse
//! data staged once per node instead of copying it again.
//!
//! "In place on this node" means the DataStage's worker for this node
//! (`--node`, usually `NODE_NAME` from the downward API) has Succeeded; for
//! a shared claim, or without a node, that the whole DataStage has. A
//! Failed DataStage or worker ends the wait with its message. The pod needs
//! `get` on `datastages.ferry.dev` in that namespace.

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

/// Judges a DataStage for `node` (pure, unit-tested).
pub fn verdict(ds: Option<&DataStage>, node: Option<&str>) -> Verdict {
    let Some(ds) = ds else { return Verdict::Waiting("the DataStage does not exist yet".into()) };
    let Some(status) = ds.status.as_ref() else { return Verdict::Waiting("no status yet".into()) };
    let failed_message = || {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .map(|c| c.message.clone())
            .unwrap_or_else(|| "failed".into())
    };
    if let Some(node) = node
        && let Some(worker) = status.workers.iter().find(|w| w.node.as_deref() == Some(node))
    {
        return match worker.phase {
            Some(Phase::Succeeded) => Verdict::Ready,
            Some(Phase::Failed) => Verdict::Failed(worker.message.clone().unwrap_or_else(failed_message)),
            phase => Verdict::Waiting(format!("worker on {node} is {phase:?}")),
        };
    }
    match status.phase {
        Some(Phase::Succeeded) => Verdict::Ready,
        Some(Phase::Failed) => Verdict::Failed(failed_message()),
        phase => Verdict::Waiting(format!("DataStage is {phase:?}")),
    }
}

/// Polls until the data is in place for `node`.
///
/// # Errors
/// A failed DataStage, a timeout, or no access to the API.
pub async fn wait(target: &str, node: Option<&str>, timeout: Option<Duration>) -> Result<(), WaitError> {
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
        match verdict(ds.as_ref(), node) {
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
        assert_eq!(verdict(Some(&d), Some("a")), Verdict::Ready);
        assert!(matches!(verdict(Some(&d), Some("b")), Verdict::Waiting(_)));
        assert!(matches!(verdict(Some(&d), None), Verdict::Waiting(_)));
        assert!(matches!(verdict(None, Some("a")), Verdict::Waiting(_)));
    }

    #[test]
    fn a_failed_worker_ends_the_wait_with_its_message() {
        let d = ds(serde_json::json!({"phase": "Failed", "workers": [
            {"name": "a", "node": "a", "phase": "Failed", "message": "bucket 'b' does not exist"}]}));
        assert_eq!(verdict(Some(&d), Some("a")), Verdict::Failed("bucket 'b' does not exist".into()));
        let whole = ds(serde_json::json!({"phase": "Succeeded"}));
        assert_eq!(verdict(Some(&whole), None), Verdict::Ready);
    }
}
