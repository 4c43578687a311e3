//! The `DataStage` API, group `ferry.dev`, version `v1alpha1`: the types
//! only. Every field's doc comment is what `kubectl explain datastage.spec…`
//! shows, so they are written for users. Validation lives in the schema
//! (bounds, enums, CEL rules with messages that name the field), so bad
//! input is refused at admission without a webhook.
//!
//! This crate has no client and no runtime: the operator and the stager
//! depend on it, and `crdgen` turns it into `crds/generated/*.yaml`.

use std::collections::BTreeMap;

pub mod budget;
pub mod conditions;
pub mod names;
pub mod node_cache;
pub mod plan;
pub mod quota;
pub mod readiness;
pub mod reference;

pub use budget::{DataStageBudget, StoreBudget, StoreBudgetSpec, StoreBudgetStatus};
pub use ferry_contract::{ByteSize, CapacityReserve, StoreShare, VerifyMode};
use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
pub use node_cache::{NodeCache, NodeCacheSpec, Sharing};
pub use quota::{StagingQuota, StagingQuotaSpec, StagingQuotaStatus};
use serde::{Deserialize, Serialize};

/// The longest DataStage name: its Jobs and pods carry it as a label
/// value, which holds at most 63 characters (the schema's rule on
/// `metadata.name` says the same).
pub const MAX_NAME_LENGTH: usize = 63;

/// Stages a dataset between object storage and node-local volumes: a pull
/// (object storage → volume) or a push (volume → object storage).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "DataStage",
    plural = "datastages",
    shortname = "dstage",
    category = "ferry",
    namespaced,
    status = "DataStageStatus",
    derive = "PartialEq",
    validation = Rule::new("size(self.metadata.name) <= 63").message("metadata.name must be at most 63 characters: Ferry labels the DataStage's Jobs and pods with it, and a label value holds at most 63"),
    doc = "A DataStage copies a dataset between object storage and node-local volumes, on every matching node or sharded over workers.",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Throughput","type":"string","jsonPath":".status.throughput"}"#,
    printcolumn = r#"{"name":"Nodes","type":"string","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.source.uri) || has(self.destination.uri)").message("one of spec.source and spec.destination must be object storage (set its uri)"))]
#[x_kube(validation = Rule::new("!(has(self.source.uri) && has(self.destination.uri))").message("one of spec.source and spec.destination must be a volume: Ferry stages between object storage and volumes, not bucket to bucket"))]
#[x_kube(validation = Rule::new("!has(self.reclaimPolicy) || self.reclaimPolicy == 'Retain' || has(self.source.uri)").message("reclaimPolicy Delete removes what a pull staged; a push's source volume is never deleted: use Retain"))]
#[x_kube(validation = Rule::new("!has(self.destination.uri) || !self.destination.uri.startsWith('oci://')").message("oci:// is a source only: Ferry pulls OCI artifacts and does not push them; push to s3://, gs:// or az://"))]
#[x_kube(validation = Rule::new("!has(self.destination.uri) || !self.destination.uri.startsWith('hf://')").message("hf:// is a source only: Ferry pulls from the Hugging Face Hub and does not push to it; push to s3://, gs:// or az://"))]
#[x_kube(validation = Rule::new("!has(self.schedule) || has(self.source.uri)").message("spec.schedule re-syncs a pull; a push runs once: remove schedule, or create a new DataStage per upload"))]
#[x_kube(validation = Rule::new("!has(self.timeZone) || has(self.schedule)").message("spec.timeZone applies to spec.schedule: set schedule too"))]
#[x_kube(validation = Rule::new("!has(self.fanout) || self.fanout != 'PeerToPeer' || has(self.source.uri)").message("spec.fanout PeerToPeer applies to pulls (the nodes feed each other what they download); a push reads one volume: remove fanout or set it to Direct"))]
#[x_kube(validation = Rule::new("!has(self.fanout) || self.fanout != 'PeerToPeer' || !has(self.destination.volume) || !has(self.destination.volume.persistentVolumeClaim)").message("spec.fanout PeerToPeer stages one copy per node onto a nodeCache or hostPath; a persistentVolumeClaim holds one shared copy: remove fanout or set it to Direct"))]
#[x_kube(validation = Rule::new("!has(self.capacity) || has(self.source.uri)").message("spec.capacity is about the destination volume of a pull; a push writes to object storage: remove capacity"))]
#[x_kube(validation = Rule::new("!has(self.capacity) || !has(self.capacity.idleSeconds) || (has(self.capacity.eviction) && self.capacity.eviction == 'WhenSpaceIsNeeded')").message("spec.capacity.idleSeconds evicts copies no pod used for that long; it needs spec.capacity.eviction: WhenSpaceIsNeeded"))]
#[x_kube(validation = Rule::new("!has(self.capacity) || !has(self.capacity.eviction) || self.capacity.eviction == 'Never' || (has(self.destination.volume) && (has(self.destination.volume.hostPath) || has(self.destination.volume.nodeCache)))").message("spec.capacity.eviction removes a node's copy of a pull onto a nodeCache or hostPath; a persistentVolumeClaim holds the only copy: remove eviction or set it to Never"))]
#[x_kube(validation = Rule::new("!has(self.fanout) || self.fanout != 'PeerToPeer' || !has(self.workers) || self.workers <= 1").message("spec.fanout PeerToPeer runs one worker pod per node: remove spec.workers (or set it to 1), or set fanout to Direct"))]
#[x_kube(validation = Rule::new("self.source == oldSelf.source || (has(self.updateStrategy) && self.updateStrategy == 'Versioned' && has(self.source.uri))").message("spec.source is immutable unless spec.updateStrategy is Versioned (which stages the new source beside the current version and switches when every node holds it); create a new DataStage to stage other data"))]
#[x_kube(validation = Rule::new("(has(self.updateStrategy) ? self.updateStrategy : 'InPlace') == (has(oldSelf.updateStrategy) ? oldSelf.updateStrategy : 'InPlace')").message("spec.updateStrategy is immutable: the two strategies lay the volume out differently; create a new DataStage"))]
#[x_kube(validation = Rule::new("!has(self.updateStrategy) || self.updateStrategy == 'InPlace' || has(self.source.uri)").message("spec.updateStrategy Versioned applies to pulls (versions of what is staged onto the volume); a push writes to object storage: remove updateStrategy"))]
#[serde(rename_all = "camelCase")]
pub struct DataStageSpec {
    /// Where the data comes from: object storage (`uri`) for a pull, a
    /// volume for a push. Immutable, except for a pull with
    /// `updateStrategy: Versioned`, which stages the new source as a new
    /// version (its object-storage fields may change; it stays a pull). A
    /// push from a node-local volume (`nodeCache`, `hostPath`) reads one
    /// node's directory: `placement` must select exactly one node (the
    /// DataStage waits with reason `AmbiguousPushSource` while it selects
    /// several), so two nodes never race to write the same keys.
    pub source: Location,

    /// Where the data goes: a volume for a pull, object storage (`uri`) for
    /// a push. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.destination is immutable; create a new DataStage to stage elsewhere"))]
    pub destination: Location,

    /// Only copy keys matching one of these globs (relative to the prefix;
    /// `*` matches across `/`). Empty means everything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,

    /// Skip keys matching any of these globs. Wins over `include`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,

    /// How the stager moves bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transfer: Option<TransferSettings>,

    /// Which nodes run workers. With a node-local volume (`nodeCache`,
    /// `hostPath`), workers run on every node that matches the node selector and the required node affinity
    /// and whose taints the tolerations allow, staging onto each node's
    /// local disk; nodes that start matching later are staged too, and a
    /// node that stops matching keeps its data (or has it removed, with
    /// `reclaimPolicy: Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,

    /// Worker pods per place, each copying one shard of the dataset (an
    /// Indexed Job): for a claim, N pods fill the shared volume together;
    /// for a node-local volume, N pods on every node fill that node's directory
    /// together, so each node still gets the whole dataset. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub workers: Option<i32>,

    /// How a pull treats its destination volume's free space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<CapacityPolicy>,

    /// How the nodes of a pull onto a node-local volume get the dataset: from each
    /// other (`PeerToPeer`) or each from the store (`Direct`). The schema
    /// shows [`Fanout`]'s description here, which says it all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fanout: Option<Fanout>,

    /// What happens to staged data when the DataStage is deleted: `Retain`
    /// (default) keeps it; `Delete` (pulls only) removes the files it staged
    /// from every node or the claim before the DataStage goes; files
    /// changed since, and files Ferry did not write, are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,

    /// Delete finished worker Jobs this many seconds after they finish. The
    /// outcome stays in the status: a deleted Job is not run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,

    /// Retries of a failed worker pod before its Job fails. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub backoff_limit: Option<i32>,

    /// Fail a worker that runs longer than this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<i64>,

    /// CPU and memory for each worker pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Stager image, overriding the operator's default: honoured only for
    /// images the cluster admin allows (the operator's `--allowed-images`,
    /// the chart's `stager.allowedImages`), and refused at admission
    /// otherwise. Steps that run with more rights than the transfer (the
    /// one that readies a node directory) always run the operator's own
    /// image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,

    /// A service account of this namespace: with `credentials.webIdentity`,
    /// the account whose token the operator requests and the workers
    /// exchange at the STS (default: `default`); with a
    /// persistentVolumeClaim, the account the worker pods (which run in
    /// this namespace) run as, whose identity reaches the store when no
    /// `credentials` are given (IRSA, GKE Workload Identity). Workers of
    /// node-local volumes run in Ferry's own namespace and never as an
    /// account of this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,

    /// Re-sync on this schedule, in cron syntax as a CronJob's: five fields
    /// (minute hour day-of-month month day-of-week), an optional leading
    /// seconds field, or a macro such as `@daily`. Each sync is a new run
    /// that copies only objects that are new or changed in the store and
    /// removes files Ferry staged from objects that left it (files changed
    /// since they were staged, and files Ferry did not write, stay). Every
    /// file is replaced by an atomic rename: a reader that has a file open
    /// keeps reading the version it opened. Pulls only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[^ ]+( +[^ ]+){4,5})$')").message("spec.schedule must be five cron fields (minute hour day-of-month month day-of-week), six with a leading seconds field, or a macro such as @daily"))]
    #[x_kube(validation = Rule::new(r"!self.contains('TZ=')").message("spec.schedule cannot carry a time zone: set spec.timeZone instead"))]
    pub schedule: Option<String>,

    /// Time zone of `schedule`, an IANA name such as `Europe/Berlin`.
    /// Default: UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,

    /// Pause scheduled syncs (a run already going finishes). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,

    /// How a pull brings a new version of its data onto the volume (a
    /// scheduled re-sync that finds changes, a changed include or exclude,
    /// or, with `Versioned`, a changed source). Immutable. The schema shows
    /// [`UpdateStrategy`]'s description here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_strategy: Option<UpdateStrategy>,
}

/// `InPlace` (default): files are replaced one by one, each by an atomic
/// rename; a reader that opens several files during a sync can get some of
/// each version. `Versioned`: the new version is staged beside the current
/// one (files it shares with a version on the node are hard links, not
/// copies), and once every node holds it, each node switches in one rename
/// of the link `DIR/current`. Pods the webhook wires mount `DIR/current`:
/// a running pod keeps reading the version it started with, whole; a pod
/// started after the switch gets the new one. The previous version is kept
/// while a pod that started before the switch runs, then removed; a change
/// back to a version still on the nodes copies nothing. Status:
/// `status.versions`. Pulls only.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpdateStrategy {
    /// Replace files one by one, each atomically.
    #[default]
    InPlace,
    /// Stage each version beside the current one and switch whole.
    Versioned,
}

/// One side of a transfer: object storage or a volume, never both.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("has(self.uri) != has(self.volume)").message("set exactly one of uri (object storage) or volume"))]
#[x_kube(validation = Rule::new("has(self.uri) || !(has(self.endpoint) || has(self.region) || has(self.credentials) || has(self.anonymous))").message("endpoint, region, credentials and anonymous apply to object storage: set uri too"))]
#[x_kube(validation = Rule::new("!(has(self.anonymous) && self.anonymous && has(self.credentials))").message("anonymous sends no credentials: remove credentials or anonymous"))]
#[x_kube(validation = Rule::new("has(self.uri) || !has(self.caBundle)").message("caBundle is the CA of an object store's HTTPS certificate: set uri too"))]
#[x_kube(validation = Rule::new("!has(self.credentials) || !has(self.credentials.webIdentity) || (has(self.uri) && self.uri.startsWith('s3://'))").message("credentials.webIdentity exchanges a token at an S3 STS: use it with an s3:// uri (for gs://, a Secret or the workers' serviceAccountName)"))]
#[serde(rename_all = "camelCase")]
pub struct Location {
    /// Object storage location: `s3://bucket/prefix`, `gs://bucket/prefix`
    /// or `az://container/prefix` (Azure Blob; the account is the
    /// credentials Secret's `AZURE_STORAGE_ACCOUNT`, or the endpoint's);
    /// for a pull, also `oci://registry/repository:tag` (or `@sha256:…`):
    /// each layer of the artifact named by its title annotation is a file;
    /// or a Hugging Face Hub repository, `hf://ORG/REPO` (a model),
    /// `hf://datasets/ORG/REPO` or `hf://spaces/ORG/REPO`, optionally
    /// `@REVISION` (a branch, tag or commit; default `main`) and a path in
    /// it: a run copies one commit's files, and the status shows the commit.
    /// The prefix names a directory: `s3://b/data` means keys under `data/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // Bounded, so that the API server's estimate of the rule's cost fits.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new(r"self.matches('^(s3|gs|az)://[a-z0-9][a-z0-9._-]*[a-z0-9](/.*)?$') || self.matches('^oci://[a-z0-9.-]+(:[0-9]+)?/[a-z0-9]+([._/-][a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[a-f0-9]{64})?$') || self.matches('^hf://((datasets|spaces|models)/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}(@[^/@ ]+)?(/.*)?$')").message("uri must look like s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, oci://registry/repository:tag or hf://org/repo@revision"))]
    pub uri: Option<String>,

    /// Endpoint URL: an S3-compatible server (MinIO, a private endpoint),
    /// e.g. `http://minio.storage:9000`, or for `gs://` a GCS endpoint (an
    /// emulator, Private Service Connect), or for `az://` the account's
    /// blob endpoint (`http://azurite:10000/devstoreaccount1`), or for
    /// `oci://` the registry's URL (`http://registry:5000` for one without
    /// TLS), or for `hf://` a Hub mirror or private hub (`HF_ENDPOINT`).
    /// Default: the provider's public endpoint (`https://huggingface.co`
    /// for `hf://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^https?://')").message("endpoint must be an http:// or https:// URL"))]
    pub endpoint: Option<String>,

    /// Region of the bucket. Default: from the environment, else us-east-1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,

    /// How workers authenticate to the store: a Secret of keys (`name`) or
    /// a web identity (`webIdentity`). The operator reads the Secret in the
    /// DataStage's namespace and gives it to this DataStage's workers only.
    /// Without it, workers of a persistentVolumeClaim use whatever identity
    /// `serviceAccountName` carries (EKS's IRSA webhook, GKE Workload
    /// Identity; for `az://` their pods are labelled
    /// `azure.workload.identity/use: "true"` so that Azure Workload
    /// Identity's webhook injects its federated token), and workers of a
    /// node-local volume carry no identity of this namespace: only public
    /// data, or what the admin granted Ferry's own workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("has(self.name) != has(self.webIdentity)").message("credentials: set exactly one of name (a Secret of keys) or webIdentity"))]
    pub credentials: Option<StoreCredentials>,

    /// `gs://`, `az://`, `oci://` and `hf://` only: send no credentials at
    /// all (public buckets, containers and repositories, emulators).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymous: Option<bool>,

    /// The CA that signed the store's HTTPS certificate (an on-premises
    /// MinIO or Ceph with a private CA): a key of a ConfigMap in the
    /// DataStage's namespace holding PEM certificates. Workers trust only
    /// these for the store, instead of the image's system CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<ConfigMapKeyReference>,

    /// A volume: a NodeCache, a claim, or (for the cluster admin) a path
    /// on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<VolumeLocation>,
}

/// How workers authenticate to a store.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoreCredentials {
    /// A Secret in the DataStage's namespace with the store's keys: for
    /// `s3://`, `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (optionally
    /// `AWS_SESSION_TOKEN`); for `gs://`, `key.json` holding a
    /// service-account key; for `az://`, `AZURE_STORAGE_ACCOUNT` with
    /// `AZURE_STORAGE_KEY` (the account key), `AZURE_STORAGE_SAS_TOKEN`, or
    /// a service principal's `AZURE_TENANT_ID`, `AZURE_CLIENT_ID` and
    /// `AZURE_CLIENT_SECRET`; for `oci://`, a `kubernetes.io/dockerconfigjson` Secret (`kubectl
    /// create secret docker-registry`); for `hf://`, `HF_TOKEN` (a Hub
    /// access token, sent to the Hub's own host only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub name: Option<String>,

    /// `s3://` only: no keys anywhere. The operator requests a token of
    /// `spec.serviceAccountName` (default `default`) for this audience
    /// (TokenRequest), gives it to this DataStage's workers and renews it
    /// before it expires; they exchange it at the store's STS
    /// (`AssumeRoleWithWebIdentity`) for short-lived keys, again before
    /// they expire. The store must trust the cluster's service-account
    /// issuer (its OpenID discovery document and keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_identity: Option<WebIdentityCredentials>,
}

/// A role assumed with the workers' service-account token.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebIdentityCredentials {
    /// The role to assume, e.g. `arn:aws:iam::123456789012:role/datasets`
    /// or, for MinIO, the `arn:minio:iam:::role/…` it prints for its
    /// OpenID provider.
    #[schemars(length(min = 1, max = 2048))]
    pub role_arn: String,

    /// The audience of the token: the client id the STS's identity
    /// provider expects (for AWS IAM OIDC providers usually
    /// `sts.amazonaws.com`), one of those the cluster admin allows
    /// (`--web-identity-audiences`; refused at admission otherwise, so a
    /// token for the API server or another service never leaves the
    /// cluster). Default: `sts.amazonaws.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub audience: Option<String>,

    /// The STS endpoint that exchanges the token. Default: the location's
    /// `endpoint` when it has one (S3-compatible stores such as MinIO and
    /// Ceph serve STS there), else AWS STS in the region. It must be
    /// `https://` unless the cluster admin allows plain HTTP
    /// (`--allow-http-sts`): the token travels to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"self.matches('^https?://')").message("webIdentity.stsEndpoint must be an http:// or https:// URL"))]
    pub sts_endpoint: Option<String>,

    /// Lifetime of the projected token in seconds; the kubelet renews it
    /// after 80% of it. Default 3600; at least 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 86400))]
    pub expiration_seconds: Option<i64>,
}

impl WebIdentityCredentials {
    /// The audience when none is given: what AWS IAM OIDC providers expect.
    pub const DEFAULT_AUDIENCE: &'static str = "sts.amazonaws.com";
    /// The token's lifetime when none is given.
    pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
}

/// A key of a ConfigMap in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyReference {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the PEM certificates. Default: `ca.crt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl ConfigMapKeyReference {
    /// The key the certificates are under.
    pub fn key_or_default(&self) -> &str {
        self.key.as_deref().unwrap_or("ca.crt")
    }
}

/// A volume: exactly one of `nodeCache`, `persistentVolumeClaim` or
/// `hostPath`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(validation = Rule::new("[has(self.hostPath), has(self.persistentVolumeClaim), has(self.nodeCache)].filter(x, x).size() == 1").message("set exactly one of volume.nodeCache, volume.persistentVolumeClaim or volume.hostPath"))]
#[serde(rename_all = "camelCase")]
pub struct VolumeLocation {
    /// A NodeCache (`kubectl get nodecaches`): a directory on every node
    /// that the cluster admin gave Ferry. The data lands at
    /// `ROOT/NAMESPACE/NAME` on each node the placement selects, and pods
    /// read it through the claim `status.claimName`, which Ferry binds in
    /// this namespace (the webhook mounts it for pods labelled with the
    /// DataStage). The cache's `namespaceSelector` says which namespaces
    /// may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub node_cache: Option<String>,

    /// For the cluster admin: an absolute directory on each node, e.g.
    /// `/mnt/nvme/datasets/imagenet`, under a prefix the operator allows
    /// (`--allowed-host-paths`), in a namespace the admin named
    /// (`--host-path-namespaces`, the chart's `hostPathNamespaces`);
    /// refused at admission elsewhere. Tenants name a `nodeCache` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')").message("volume.hostPath must be an absolute path without '..'"))]
    pub host_path: Option<String>,

    /// A PersistentVolumeClaim in the DataStage's namespace. Its workers
    /// run in this namespace (a claim can be mounted only there), as
    /// `spec.serviceAccountName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<ClaimLocation>,
}

/// A directory within a PersistentVolumeClaim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLocation {
    /// Name of the claim.
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: String,

    /// Directory within the volume. Default: its root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(r"!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')").message("persistentVolumeClaim.subPath must be relative and without '..'"))]
    #[schemars(length(max = 1024))]
    pub sub_path: Option<String>,
}

/// Tuning of the stager; defaults suit most transfers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TransferSettings {
    /// Requests in flight per worker, shared by all objects. Unset: adaptive, 8 at first, 4 to 256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4096))]
    pub concurrency: Option<i32>,

    /// Range size for downloads and part size for uploads, e.g. `8MiB`
    /// (binary units K, M, G, T, optionally followed by i and/or B: `8Mi`,
    /// `8M` and `8MiB` are the same). Uploads need at least 5MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part_size: Option<ByteSize>,

    /// How staged files are verified before they appear. Default `Checksum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyMode>,

    /// Bound on each worker's transfer buffers, e.g. `256MiB`. Default 256MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<ByteSize>,

    /// Cap on each worker's bytes per second, e.g. `200MiB`, to leave
    /// bandwidth for training traffic. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bandwidth: Option<ByteSize>,

    /// Cap on each worker's requests per second to the store (listing,
    /// reads, uploads, retries), to share a store that throttles (S3's
    /// `SlowDown`, MinIO's `MINIO_API_REQUESTS_MAX`). Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub max_request_rate: Option<i32>,

    /// With `fanout: PeerToPeer`: cap on the bytes per second each worker
    /// serves to its peers, e.g. `500MiB`, so feeding other nodes does not
    /// take this node's link from its training job. Default: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_serve_bandwidth: Option<ByteSize>,
}

/// How a pull treats its destination volume's free space.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPolicy {
    /// Free space to leave on the destination's filesystem beyond what the
    /// pull writes: a size (`64MiB`; `0` for none) or a whole percentage of
    /// the filesystem's size below 100 (`10%`), which suits volumes of
    /// different sizes. A pull that would not leave it waits with reason
    /// `InsufficientCapacity` before writing anything. Default 64MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<CapacityReserve>,

    /// Whether the operator may evict this DataStage's copies. The schema
    /// shows [`EvictionPolicy`]'s description here, which says it all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionPolicy>,

    /// With `eviction: WhenSpaceIsNeeded`: also evict a node's copy once no
    /// pod has used it for this many seconds (counted from the last use, or
    /// from when it was staged), room needed or not. Unset: only when space
    /// is needed. Editing it starts no run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub idle_seconds: Option<i64>,
}

/// Whether the operator may remove this DataStage's copy from a node to
/// make room for another pull there: `Never` (default) or
/// `WhenSpaceIsNeeded`. Only a copy no pod uses there (running on that
/// node, or waiting to be placed) is evicted, least recently used first,
/// and only when evicting makes enough room. An evicted node stops counting
/// as holding the data (pods are not sent there) and is staged again when a
/// pod waits for the DataStage. Editing it starts no run.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EvictionPolicy {
    /// Never: the copy stays until the DataStage is deleted.
    #[default]
    Never,
    /// When another pull on the node needs the room and no pod there uses
    /// this copy.
    WhenSpaceIsNeeded,
}

/// The operator's removal of a worker's copy from its node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Eviction {
    /// When the operator decided it: from then on the node does not count
    /// as holding the data.
    pub time: Time,
    /// Why, for a person (which DataStage needed the room).
    pub message: String,
    /// Whether the copy is gone (its clean-up Job succeeded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// What happens to staged data when the DataStage is deleted.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReclaimPolicy {
    /// Keep the data.
    #[default]
    Retain,
    /// Remove the data from every node.
    Delete,
}

/// How a pull onto the nodes' local disks (`nodeCache`, `hostPath`) gets the dataset
/// to every node. `PeerToPeer`: the workers read the dataset from the
/// store about once between them, each its own share, and fetch the rest
/// from each other; every byte from a peer is verified against the store's
/// checksum, and a peer that is slow, unreachable or serves wrong bytes is
/// bypassed and its share read from the store, so peers can make a pull
/// slower, never wrong or stuck. Workers serve their peers on port 9466
/// over mutual TLS, only to holders of a certificate the operator issues
/// for the DataStage and keeps in the workers' namespace. `Direct`: every
/// node reads everything from the store. Default: `PeerToPeer` for a pull
/// onto a node-local volume with one pod per node
/// (`workers` unset or 1), `Direct` otherwise; `PeerToPeer` cannot be set
/// for a push, a persistentVolumeClaim, or `workers` > 1.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fanout {
    /// The workers read the dataset from the store about once between them
    /// and feed each other, every byte verified against the store's
    /// checksum.
    PeerToPeer,
    /// Every node reads everything from the store.
    Direct,
}

/// Which nodes run workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Only nodes with all these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Tolerations for the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Affinity for the worker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
}

/// Lifecycle phase of a DataStage.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Accepted; workers are not running yet (or are waiting on something).
    Pending,
    /// Workers are copying.
    Running,
    /// Every worker finished and every object is in place and verified.
    Succeeded,
    /// A worker failed for good, or the spec cannot be carried out.
    Failed,
}

impl Phase {
    /// Whether the run is over, for good or not.
    pub fn is_finished(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

impl WorkerStatus {
    /// Whether this entry records a finished `run` (its Job may be gone).
    pub fn finished_run(&self, run: i64) -> bool {
        self.run == Some(run) && self.phase.is_some_and(Phase::is_finished)
    }
}

/// Observed state of a DataStage.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataStageStatus {
    /// Pending, Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,

    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Progressing` and `Failed`, with CamelCase reasons and
    /// messages a person can act on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Totals over all workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub totals: Option<Totals>,

    /// One entry per worker (per node, or per shard). Each worker writes
    /// its own entry while it runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub workers: Vec<WorkerStatus>,

    /// Bytes done over bytes total, e.g. `42%` (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// Current throughput over all workers, e.g. `512 MiB/s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throughput: Option<String>,

    /// Workers finished over workers, e.g. `1/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<String>,

    /// The current run: 1 for the first, one more for each spec change
    /// that alters what a run does and for each scheduled sync. Worker Jobs
    /// carry it in their names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<i64>,

    /// A digest of the spec fields the current run was started from: a
    /// spec change that alters them starts a new run; one that does not
    /// (schedule, suspend, reclaimPolicy, ttlSecondsAfterFinished) does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_inputs: Option<String>,

    /// When the last sync (run) finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,

    /// When the next scheduled sync starts (with `schedule`, unless
    /// suspended; set while no run is going).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_sync_time: Option<Time>,

    /// What the last sync changed on the volume, summed over workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<SyncChanges>,

    /// The version of the dataset in place: set when every worker holds the
    /// same one (a pull is Ready only then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotStatus>,

    /// Runs started in a row because the workers of a pull finished with
    /// different snapshots (the bucket changed while they listed it). After
    /// 3 the DataStage fails with `SnapshotsDiffer` until the next spec
    /// change or scheduled sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_retries: Option<i64>,

    /// `updateStrategy: Versioned`: the version pods get now and the one
    /// before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<VersionsStatus>,

    /// A pull onto a node-local volume: the PersistentVolumeClaim in this
    /// namespace through which pods read the data (read-only; its volume
    /// is on the nodes that hold a copy, so a pod that mounts it is placed
    /// on one). The webhook mounts it for pods labelled with the
    /// DataStage; the init-container form names it in the pod's volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,

    /// While workers run against a bucket with a StoreBudget: the budget,
    /// and each worker's share of it now. The operator writes it as workers
    /// start and finish; every worker reads it back while it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_budget: Option<DataStageBudget>,
}

/// Objects and bytes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectsAndBytes {
    /// Objects.
    pub objects: i64,
    /// Bytes.
    pub bytes: i64,
}

/// What a sync changed on the volume, summed over workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SyncChanges {
    /// Objects staged that were not there before.
    pub added: ObjectsAndBytes,
    /// Objects staged again because they changed in the store.
    pub updated: ObjectsAndBytes,
    /// Files removed because their objects left the store.
    pub removed: ObjectsAndBytes,
}

/// One version of the dataset.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// Objects in it.
    pub objects: i64,
    /// Bytes in it.
    pub bytes: i64,
    /// A digest of every object's key, version (ETag or generation) and
    /// size: equal digests mean identical datasets. `ferry-stager wait
    /// --snapshot DIGEST` waits for it.
    pub digest: String,
    /// The revision of the source it was read at, where the source has one:
    /// for `hf://`, the commit the branch or tag named pointed at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// The versions of a `Versioned` pull on its nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VersionsStatus {
    /// The version pods get now (its snapshot digest): current on every
    /// node that holds the data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// The source `current` was staged from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_source: Option<String>,
    /// The version before `current`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// The source `previous` was staged from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_source: Option<String>,
    /// Whether `previous` is still on the nodes: kept while a pod that
    /// started before the switch runs, then removed (a change back to it
    /// while it is kept copies nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_kept: Option<bool>,
    /// When `current` became current on every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_time: Option<Time>,
}

/// Totals over all workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Objects selected.
    pub objects_total: i64,
    /// Objects in place (copied or already staged).
    pub objects_done: i64,
    /// Objects that failed.
    pub objects_failed: i64,
    /// Bytes selected.
    pub bytes_total: i64,
    /// Bytes in place.
    pub bytes_done: i64,
    /// Bytes of objects that failed.
    pub bytes_failed: i64,
    /// Current bytes per second.
    pub throughput_bytes_per_second: i64,
    /// Estimated seconds to completion at the current throughput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// When the first worker started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the last worker finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Fleet staging (`fanout: PeerToPeer`): bytes the workers of this run
    /// received from their peers instead of the store, summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_from_peers: Option<i64>,
    /// Fleet staging: bytes the workers of this run copied from the store
    /// (what they copied less what came from peers), summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_from_store: Option<i64>,
}

/// Progress of one worker.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WorkerStatus {
    /// Worker name: the node for per-node staging, `shard-N` for shards.
    pub name: String,
    /// The node it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Pending, Running, Succeeded or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Bytes in place.
    #[serde(default)]
    pub bytes_done: i64,
    /// Bytes selected.
    #[serde(default)]
    pub bytes_total: i64,
    /// Objects in place.
    #[serde(default)]
    pub objects_done: i64,
    /// Objects selected.
    #[serde(default)]
    pub objects_total: i64,
    /// Objects that failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub objects_failed: i64,
    /// Bytes of objects that failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bytes_failed: i64,
    /// Current bytes per second.
    #[serde(default)]
    pub throughput_bytes_per_second: i64,
    /// What the worker last said (an error, or the summary).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Why its last pod could not proceed (`BucketNotFound`,
    /// `AccessDenied`, ...), as the stager said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The run its phase refers to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<i64>,
    /// Digest of the dataset version this worker staged (pulls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// The revision of the source that version was read at, where the
    /// source has one (the commit of an `hf://` repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Fleet staging: written by the worker itself, where it serves its
    /// peers, `IP:PORT`. Peers read it here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_address: Option<String>,
    /// Fleet staging: bytes this worker received from its peers instead of
    /// the store, each verified against the store's checksum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_from_peers: Option<i64>,
    /// Fleet staging: bytes this worker copied from the store (what it
    /// copied less what came from peers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_from_store: Option<i64>,
    /// Fleet staging: bytes this worker served to its peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_served: Option<i64>,
    /// Fleet staging: peers this worker stopped asking (unreachable,
    /// stalled, or serving bytes that did not match the store's checksum);
    /// it read their share from the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_failures: Option<i64>,
    /// Requests the store throttled (SlowDown, 429, 503) in this worker's
    /// run so far; written by the worker itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttled_requests: Option<i64>,
    /// The share of a StoreBudget this worker follows now; written by the
    /// worker itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_share: Option<ferry_contract::StoreShare>,
    /// The destination's filesystem on this node as the worker last
    /// measured it: its size, what was free, and, when the worker was
    /// refused for room, what it needed. The operator learns from it what
    /// room Ferry's destinations have on each node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<ferry_contract::DiskSpace>,
    /// When a pod on this node last used this copy, as the operator saw
    /// it (to within a few minutes): eviction takes the least recently
    /// used copy first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_time: Option<Time>,
    /// `updateStrategy: Versioned`: the version `current` names on this
    /// worker's node (or the claim), as the last switch there left it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// Set once the operator evicted this node's copy to make room (see
    /// `spec.capacity.eviction`); the node does not hold the data since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted: Option<Eviction>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// The CRD as YAML, exactly as `crdgen` writes it.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt as _;
    generated(&DataStage::crd())
}

/// The StoreBudget CRD as YAML, as committed.
pub fn store_budget_crd_yaml() -> String {
    use kube::CustomResourceExt as _;
    generated(&StoreBudget::crd())
}

/// The StagingQuota CRD as YAML, as committed.
pub fn staging_quota_crd_yaml() -> String {
    use kube::CustomResourceExt as _;
    generated(&StagingQuota::crd())
}

/// The NodeCache CRD as YAML, as committed.
pub fn node_cache_crd_yaml() -> String {
    use kube::CustomResourceExt as _;
    generated(&NodeCache::crd())
}

/// Every CRD this crate defines, for a harness or installer that applies them all.
pub fn crds() -> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> {
    use kube::CustomResourceExt as _;
    vec![DataStage::crd(), StoreBudget::crd(), StagingQuota::crd(), NodeCache::crd()]
}

fn generated(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> String {
    let yaml = serde_yaml::to_string(crd).expect("the CRD serializes");
    format!("# Generated by `cargo run -p ferry-crds --bin crdgen`; do not edit.\n{yaml}")
}

/// Where the generated CRD lives, relative to the repository root.
pub const CRD_PATH: &str = "crds/generated/ferry.dev_datastages.yaml";

/// Every place the generated CRD is committed, relative to the repository
/// root: [`CRD_PATH`] for `kubectl apply`, and the Helm chart's `crds/`
/// (Helm installs what is there before the templates, and never deletes it).
pub const CRD_PATHS: [&str; 2] = [CRD_PATH, "charts/ferry/crds/ferry.dev_datastages.yaml"];

/// Where the generated StoreBudget CRD lives, relative to the repository root.
pub const STORE_BUDGET_CRD_PATH: &str = "crds/generated/ferry.dev_storebudgets.yaml";

/// Every place the StoreBudget CRD is committed, as [`CRD_PATHS`].
pub const STORE_BUDGET_CRD_PATHS: [&str; 2] = [STORE_BUDGET_CRD_PATH, "charts/ferry/crds/ferry.dev_storebudgets.yaml"];

/// Where the generated StagingQuota CRD lives, relative to the repository root.
pub const STAGING_QUOTA_CRD_PATH: &str = "crds/generated/ferry.dev_stagingquotas.yaml";

/// Every place the StagingQuota CRD is committed, as [`CRD_PATHS`].
pub const STAGING_QUOTA_CRD_PATHS: [&str; 2] =
    [STAGING_QUOTA_CRD_PATH, "charts/ferry/crds/ferry.dev_stagingquotas.yaml"];

/// Where the generated NodeCache CRD lives, relative to the repository root.
pub const NODE_CACHE_CRD_PATH: &str = "crds/generated/ferry.dev_nodecaches.yaml";

/// Every place the NodeCache CRD is committed, as [`CRD_PATHS`].
pub const NODE_CACHE_CRD_PATHS: [&str; 2] = [NODE_CACHE_CRD_PATH, "charts/ferry/crds/ferry.dev_nodecaches.yaml"];

/// Every committed CRD file and what it must hold.
pub fn committed_crds() -> Vec<(&'static str, String)> {
    let datastage = crd_yaml();
    let budget = store_budget_crd_yaml();
    let quota = staging_quota_crd_yaml();
    let node_cache = node_cache_crd_yaml();
    CRD_PATHS
        .iter()
        .map(|p| (*p, datastage.clone()))
        .chain(STORE_BUDGET_CRD_PATHS.iter().map(|p| (*p, budget.clone())))
        .chain(STAGING_QUOTA_CRD_PATHS.iter().map(|p| (*p, quota.clone())))
        .chain(NODE_CACHE_CRD_PATHS.iter().map(|p| (*p, node_cache.clone())))
        .collect()
}

/// Every committed generated file and what it must hold: the CRDs, and
/// the API reference made from them.
pub fn committed_files() -> Vec<(&'static str, String)> {
    let mut files = committed_crds();
    files.push((reference::API_REFERENCE_PATH, reference::markdown(&crds())));
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_committed_crd_copy_matches_the_types() {
        for (relative, expected) in committed_files() {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(relative);
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                committed == expected,
                "{relative} is out of date: run `cargo run -p ferry-crds --bin crdgen` and commit the result"
            );
        }
    }

    #[test]
    fn the_admission_rules_accept_exactly_the_schemes_the_stores_speak() {
        // URI rules spell schemes as `^(s3|gs|…)://` or `^oci://`. The
        // DataStage's must name every scheme of the contract (one missing
        // would be refused at admission though the stager speaks it), and
        // no rule may name one the contract lacks.
        fn schemes(yaml: &str) -> std::collections::BTreeSet<&str> {
            yaml.split("self.matches('^")
                .skip(1)
                .filter_map(|rest| rest.split_once("://").map(|(schemes, _)| schemes))
                .filter(|schemes| !schemes.contains('\''))
                .flat_map(|schemes| schemes.trim_start_matches('(').trim_end_matches(')').split('|'))
                // Not a URI rule (`^https?://` for endpoints).
                .filter(|scheme| scheme.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
                .collect()
        }
        let contract: std::collections::BTreeSet<&str> =
            ferry_contract::Scheme::ALL.iter().map(|s| s.as_str()).collect();
        let datastage = crd_yaml();
        assert_eq!(schemes(&datastage), contract);
        for (relative, yaml) in committed_crds() {
            assert!(schemes(&yaml).is_subset(&contract), "{relative}: {:?}", schemes(&yaml));
        }
        for scheme in ferry_contract::Scheme::ALL {
            assert!(datastage.contains(&format!("{scheme}://")), "the uri message names {scheme}://");
        }
    }

    #[test]
    fn every_integer_format_is_one_the_api_server_knows() {
        // Others (schemars' uint64) are accepted but warned about at every
        // `kubectl apply`, which users read as something wrong.
        fn formats(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(format) = map.get("format").and_then(|f| f.as_str())
                        && map.get("type").and_then(|t| t.as_str()) == Some("integer")
                        && !matches!(format, "int32" | "int64")
                    {
                        found.push(format!("{path}: {format}"));
                    }
                    for (key, child) in map {
                        formats(child, &format!("{path}/{key}"), found);
                    }
                }
                serde_json::Value::Array(list) => list.iter().for_each(|child| formats(child, path, found)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        for crd in crds() {
            formats(&serde_json::to_value(&crd).unwrap(), &crd.metadata.name.clone().unwrap_or_default(), &mut found);
        }
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn the_crd_carries_names_columns_and_validation() {
        let yaml = crd_yaml();
        for needle in [
            "name: datastages.ferry.dev",
            "- dstage",
            "- ferry",
            "name: Throughput",
            "subresources:",
            "rule: self == oldSelf",
            "message: set exactly one of uri (object storage) or volume",
            "x-kubernetes-list-map-keys:",
        ] {
            assert!(yaml.contains(needle), "missing {needle:?} in\n{yaml}");
        }
    }

    #[test]
    fn the_defaults_kubectl_explain_states_are_the_stagers() {
        use ferry_contract::cli::{
            ADAPTIVE_MAX_CONCURRENCY, ADAPTIVE_MIN_CONCURRENCY, ADAPTIVE_START_CONCURRENCY, DEFAULT_MEMORY_LIMIT,
        };
        let yaml = crd_yaml();
        assert!(yaml.contains(&format!(
            "Requests in flight per worker, shared by all objects. Unset: adaptive, {ADAPTIVE_START_CONCURRENCY} at first, {ADAPTIVE_MIN_CONCURRENCY} to {ADAPTIVE_MAX_CONCURRENCY}."
        )), "{yaml}");
        assert!(yaml.contains(&format!("Default {DEFAULT_MEMORY_LIMIT}.")));
    }

    #[test]
    fn peer_to_peer_where_it_cannot_work_is_refused_at_admission_naming_the_field() {
        let yaml = crd_yaml();
        for needle in [
            "rule: '!has(self.fanout) || self.fanout != ''PeerToPeer'' || has(self.source.uri)'",
            "message: 'spec.fanout PeerToPeer applies to pulls",
            "message: 'spec.fanout PeerToPeer stages one copy per node onto a nodeCache or hostPath",
            "message: 'spec.fanout PeerToPeer runs one worker pod per node",
            "- PeerToPeer",
            "- Direct",
            "peerServeBandwidth:",
            "peerAddress:",
            "bytesFromStore:",
        ] {
            assert!(yaml.contains(needle), "missing {needle:?}");
        }
    }

    #[test]
    fn fleet_staging_fields_round_trip_in_camel_case() {
        let spec: DataStageSpec = serde_json::from_value(serde_json::json!({
            "source": {"uri": "s3://datasets/imagenet"},
            "destination": {"volume": {"hostPath": "/mnt/nvme/imagenet"}},
            "fanout": "PeerToPeer",
            "transfer": {"peerServeBandwidth": "500Mi"},
        }))
        .unwrap();
        assert_eq!(spec.fanout, Some(Fanout::PeerToPeer));
        let bandwidth = spec.transfer.as_ref().and_then(|t| t.peer_serve_bandwidth.as_ref());
        assert_eq!(bandwidth.map(ByteSize::bytes), Some(500 << 20));

        let worker: WorkerStatus = serde_json::from_value(serde_json::json!({
            "name": "node-a", "peerAddress": "10.0.0.7:9466", "bytesFromPeers": 3, "bytesServed": 4, "peerFailures": 1,
        }))
        .unwrap();
        assert_eq!(worker.peer_address.as_deref(), Some("10.0.0.7:9466"));
        assert_eq!((worker.bytes_from_peers, worker.bytes_served, worker.peer_failures), (Some(3), Some(4), Some(1)));
        let json = serde_json::to_value(WorkerStatus { name: "a".into(), ..WorkerStatus::default() }).unwrap();
        assert!(json.get("peerAddress").is_none() && json.get("bytesFromPeers").is_none(), "{json}");
    }

    #[test]
    fn a_pull_spec_round_trips_in_camel_case() {
        let spec: DataStageSpec = serde_json::from_value(serde_json::json!({
            "source": {"uri": "s3://datasets/imagenet", "endpoint": "http://minio:9000", "credentials": {"name": "s3"}},
            "destination": {"volume": {"hostPath": "/mnt/nvme/imagenet"}},
            "transfer": {"concurrency": 32, "partSize": "16Mi", "verify": "Checksum"},
            "reclaimPolicy": "Delete",
        }))
        .unwrap();
        assert_eq!(spec.reclaim_policy, Some(ReclaimPolicy::Delete));
        let transfer = spec.transfer.as_ref().unwrap();
        assert_eq!(transfer.part_size.as_ref().map(ByteSize::bytes), Some(16 << 20));
        assert_eq!(transfer.verify, Some(VerifyMode::Checksum));
        assert_eq!(spec.destination.volume.unwrap().host_path.as_deref(), Some("/mnt/nvme/imagenet"));
    }
}
