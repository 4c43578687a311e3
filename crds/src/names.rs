//! The names Ferry's parts agree on: labels, annotations, finalizers,
//! field managers and scheduling gates on the objects the operator, its
//! workers and the webhook make or read. Each is spelled here once; the
//! operator, the stager, the webhook and the end-to-end tests import it,
//! with [`DataStageKey`], the DataStage those labels name.
//!
//! Not here: condition and failure reasons (`ferry_contract::Reason` and
//! the operator's, [`crate::conditions`]), which are about what happened,
//! not about which object is whose.

use std::collections::BTreeMap;

use kube::ResourceExt as _;

use crate::DataStage;

/// Label on every object made for a DataStage, and on training pods that
/// read one (one DataStage; an annotation of the same key names several,
/// comma-separated): the DataStage's name.
pub const DATASTAGE: &str = "ferry.dev/datastage";
/// Label on objects made for a DataStage outside its namespace (worker
/// Jobs in the workers' namespace, their Secrets, its PersistentVolume):
/// the DataStage's namespace.
pub const DATASTAGE_NAMESPACE: &str = "ferry.dev/datastage-namespace";
/// Label on every object made for a DataStage: its uid, so that a
/// DataStage created again under the same name never takes its
/// predecessor's objects for its own.
pub const DATASTAGE_UID: &str = "ferry.dev/datastage-uid";
/// Label on worker Jobs and pods: the worker's name (a node, `shared`).
pub const WORKER: &str = "ferry.dev/worker";
/// Label on worker Jobs and pods: the run they belong to.
pub const RUN: &str = "ferry.dev/run";
/// Label on clean-up Jobs and pods: the worker whose data they remove.
pub const CLEANUP: &str = "ferry.dev/cleanup";
/// Label on switch and prune Jobs and pods: the place they act on.
pub const VERSIONS: &str = "ferry.dev/versions";
/// Label on the one ConfigMap per DataStage in the workers' namespace that
/// owns everything made for it there (see the operator's `home` module).
pub const ANCHOR: &str = "ferry.dev/anchor";
/// Label on Secrets and ConfigMaps the operator copies or issues for a
/// DataStage's workers: what they hold (`credentials`, `ca-bundle`,
/// `web-identity`, `peers`).
pub const HOLDS: &str = "ferry.dev/holds";

/// `app.kubernetes.io/managed-by` on what the operator makes.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ferry-operator");
/// `app.kubernetes.io/name` on worker Jobs and pods.
pub const STAGER_APP: (&str, &str) = ("app.kubernetes.io/name", "ferry-stager");

/// Annotation on a training pod: where the data appears in its containers.
pub const MOUNT_PATH: &str = "ferry.dev/mount-path";
/// The scheduling gate the webhook puts on a training pod until its data is
/// ready.
pub const DATA_READY_GATE: &str = "ferry.dev/data-ready";
/// Label on pods the webhook gated, so the operator watches only those.
pub const GATED: &str = "ferry.dev/data-gated";
/// Annotation naming DataStages that did not exist when a pod was admitted.
pub const UNMOUNTED: &str = "ferry.dev/unmounted";
/// Annotation saying what a gated pod waits for.
pub const WAITING_FOR: &str = "ferry.dev/waiting-for";
/// Annotation the gate sets on a pod as it lifts its gate: the version of
/// each versioned DataStage current then (JSON, name → digest).
pub const POD_VERSIONS: &str = "ferry.dev/versions";
/// Annotation on a fleet worker's Job: the members it divides the dataset
/// with, for a worker that joins later.
pub const PEER_GROUP: &str = "ferry.dev/peer-group";
/// Annotation on the web-identity token Secret: when its token expires
/// (RFC 3339), so the operator renews it in time.
pub const TOKEN_EXPIRES: &str = "ferry.dev/token-expires";

/// Prefix of the node labels the operator sets on nodes that hold a
/// DataStage's copy (value: the DataStage's uid); the PersistentVolume
/// through which pods read it requires the label, so the scheduler places
/// pods only where the data is.
pub const NODE_DATA_PREFIX: &str = "data.ferry.dev/";

/// The finalizer of DataStages whose data is removed on deletion.
pub const CLEANUP_FINALIZER: &str = "ferry.dev/cleanup";

/// The field manager of everything the operator applies.
pub const OPERATOR_MANAGER: &str = "ferry.dev/operator";
/// The field manager of StoreBudget status.
pub const BUDGETS_MANAGER: &str = "ferry.dev/operator-budgets";
/// The field manager of StagingQuota status.
pub const QUOTAS_MANAGER: &str = "ferry.dev/operator-quotas";

/// The field manager a worker reports its own status entry with.
pub fn worker_manager(worker: &str) -> String {
    format!("ferry.dev/stager-{worker}")
}

/// Azure Workload Identity's label asking its webhook to give a pod its
/// service account's federated identity.
pub const AZURE_WORKLOAD_IDENTITY: &str = "azure.workload.identity/use";

/// Every label and annotation key of Ferry's own above, for tests that
/// check no two are spelled alike by mistake.
pub const FERRY_KEYS: [&str; 19] = [
    DATASTAGE,
    DATASTAGE_NAMESPACE,
    DATASTAGE_UID,
    WORKER,
    RUN,
    CLEANUP,
    VERSIONS,
    ANCHOR,
    HOLDS,
    MOUNT_PATH,
    DATA_READY_GATE,
    GATED,
    UNMOUNTED,
    WAITING_FOR,
    POD_VERSIONS,
    PEER_GROUP,
    TOKEN_EXPIRES,
    CLEANUP_FINALIZER,
    OPERATOR_MANAGER,
];

/// A DataStage as the objects made for it name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DataStageKey {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

impl DataStageKey {
    /// The key of `ds`.
    pub fn of(ds: &DataStage) -> Self {
        Self { namespace: ds.namespace().unwrap_or_default(), name: ds.name_any(), uid: ds.uid().unwrap_or_default() }
    }

    /// The key an object made for a DataStage carries in its labels, with
    /// the namespace the object is in when it names none (a claim's Jobs,
    /// and those of releases before the workers' namespace).
    pub fn from_labels(object_namespace: Option<&str>, labels: &BTreeMap<String, String>) -> Option<Self> {
        let name = labels.get(DATASTAGE)?.clone();
        let namespace = labels.get(DATASTAGE_NAMESPACE).map(String::as_str).or(object_namespace)?.to_owned();
        let uid = labels.get(DATASTAGE_UID).cloned().unwrap_or_default();
        Some(Self { namespace, name, uid })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_qualified_by_ferrys_domain_and_only_deliberate_ones_coincide() {
        for key in FERRY_KEYS {
            assert!(key.starts_with("ferry.dev/"), "{key}");
            let name = key.trim_start_matches("ferry.dev/");
            assert!(!name.is_empty() && name.len() <= 63, "{key}: a label name holds at most 63 characters");
        }
        // A label and the finalizer, on different kinds of field; the
        // versions label (Jobs) and the pod annotation (training pods).
        let mut seen = std::collections::BTreeMap::new();
        for key in FERRY_KEYS {
            *seen.entry(key).or_insert(0) += 1;
        }
        let doubled: Vec<&str> = seen.into_iter().filter(|(_, n)| *n > 1).map(|(k, _)| k).collect();
        assert_eq!(doubled, ["ferry.dev/cleanup", "ferry.dev/versions"]);
        assert!(NODE_DATA_PREFIX.ends_with('/') && !NODE_DATA_PREFIX.starts_with("ferry.dev/"));
        assert_eq!(worker_manager("node-a"), "ferry.dev/stager-node-a");
    }
}
