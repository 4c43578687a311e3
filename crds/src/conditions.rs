//! The condition types of a DataStage's status and the operator's own
//! CamelCase reasons, per the Kubernetes API conventions. They are part of
//! the API: the operator writes them, and the end-to-end tests, `kubectl
//! wait --for=condition=…` and users' alerts read them, so each is spelled
//! here once. A stager's failure reasons (`ferry_contract::Reason`) pass
//! through a condition as they are.

/// Condition types.
pub mod types {
    /// Every worker finished and the data is in place.
    pub const READY: &str = "Ready";
    /// Workers are being created or are copying.
    pub const PROGRESSING: &str = "Progressing";
    /// The DataStage cannot succeed without a change.
    pub const FAILED: &str = "Failed";
}

/// The operator's own CamelCase condition reasons; a stager's reasons
/// (`ferry_contract::Reason`) pass through as they are.
pub mod reasons {
    /// Event only: a worker's Job was created.
    pub const WORKER_CREATED: &str = "WorkerCreated";
    /// Event only: a worker's Job was deleted because its node no longer
    /// exists.
    pub const WORKER_DELETED: &str = "WorkerDeleted";
    /// All data is staged and verified.
    pub const STAGED: &str = "Staged";
    /// Workers are running.
    pub const WORKERS_RUNNING: &str = "WorkersRunning";
    /// Workers are created but not yet running.
    pub const WAITING_FOR_WORKERS: &str = "WaitingForWorkers";
    /// No node matches the placement.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// A push from a hostPath matches more than one node.
    pub const AMBIGUOUS_PUSH_SOURCE: &str = "AmbiguousPushSource";
    /// A worker failed for good.
    pub const WORKER_FAILED: &str = "WorkerFailed";
    /// The credentials Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The ConfigMap (or its key) that `caBundle` names does not exist.
    pub const CA_BUNDLE_NOT_FOUND: &str = "CABundleNotFound";
    /// The hostPath is outside the operator's allow-list, or the
    /// DataStage's namespace is not one of the admin's.
    pub const HOST_PATH_NOT_ALLOWED: &str = "HostPathNotAllowed";
    /// A deleted DataStage's data was kept: its clean-up would touch a
    /// hostPath this release refuses.
    pub const CLEANUP_REFUSED: &str = "CleanupRefused";
    /// The NodeCache the DataStage names does not exist.
    pub const NODE_CACHE_NOT_FOUND: &str = "NodeCacheNotFound";
    /// The NodeCache's namespaceSelector leaves the namespace out.
    pub const NODE_CACHE_NOT_ALLOWED: &str = "NodeCacheNotAllowed";
    /// `spec.image` is not one the admin allows.
    pub const IMAGE_NOT_ALLOWED: &str = "ImageNotAllowed";
    /// The web identity's audience is not one the admin allows.
    pub const AUDIENCE_NOT_ALLOWED: &str = "AudienceNotAllowed";
    /// The web identity's STS is plain HTTP and the admin does not allow it.
    pub const INSECURE_STS: &str = "InsecureSTSEndpoint";
    /// The web identity's service account does not exist.
    pub const SERVICE_ACCOUNT_NOT_FOUND: &str = "ServiceAccountNotFound";
    /// The operator may not act in the DataStage's namespace (the chart
    /// was not told of it).
    pub const NAMESPACE_NOT_ENABLED: &str = "NamespaceNotEnabled";
    /// A worker Job cannot create its pods (a missing service account, a
    /// Pod Security level, a quota): the Job's own message says why.
    pub const PODS_NOT_CREATED: &str = "WorkerPodsNotCreated";
    /// A claim named `ferry-NAME` that Ferry did not make is in the way.
    pub const CLAIM_NAME_TAKEN: &str = "ClaimNameTaken";
    /// The spec asks the store for something it does not support.
    pub const UNSUPPORTED_STORE: &str = "UnsupportedStore";
    /// The transfer settings cannot work for this direction (a push's parts below 5MiB).
    pub const INVALID_TRANSFER: &str = "InvalidTransfer";
    /// `spec.schedule` or `spec.timeZone` does not parse.
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    /// `spec.placement` holds what the API server refuses in a pod (a label
    /// key or value, a toleration, a node affinity term).
    pub const INVALID_PLACEMENT: &str = "InvalidPlacement";
    /// The API server refused the worker Job Ferry built from the spec, for
    /// a rule the operator does not check itself: its message says which.
    pub const INVALID_WORKER_JOB: &str = "InvalidWorkerJob";
    /// The spec lacks a store or a volume (written before the schema's rules).
    pub const INCOMPLETE_SPEC: &str = "IncompleteSpec";
    /// The DataStage's name is longer than a label value may be (63),
    /// and its Jobs and pods are labelled with it. The schema refuses such
    /// names; this catches those created before it did.
    pub const NAME_TOO_LONG: &str = "NameTooLong";
    /// A worker with work left is on a node that is not Ready (or was deleted).
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    /// Workers finished with different snapshots; they run again.
    pub const RESYNCING: &str = "Resyncing";
    /// Workers kept finishing with different snapshots.
    pub const SNAPSHOTS_DIFFER: &str = "SnapshotsDiffer";
    /// Event: a node's copy was evicted to make room for another pull.
    pub const EVICTED: &str = "Evicted";
    /// Event: the clean-up Job of an evicted copy failed.
    pub const EVICTION_FAILED: &str = "EvictionFailed";
    /// A versioned pull's nodes are switching to the version its run staged.
    pub const SWITCHING: &str = "SwitchingVersion";
    /// Every node of a versioned pull switched to a new version.
    pub const SWITCHED: &str = "VersionSwitched";
    /// A node could not switch to the new version (its Job failed).
    pub const SWITCH_FAILED: &str = "VersionSwitchFailed";
    /// The previous version left every node: no pod could read it any more.
    pub const VERSION_REMOVED: &str = "VersionRemoved";
    /// Nothing is wrong.
    pub const NONE: &str = "AsExpected";
}
