//! Pure builders: from a DataStage's [`Plan`], one of its workers and the
//! current run to the Job that carries it out, as typed Kubernetes objects
//! (a misspelled field is a compile error, not a field the API server
//! silently drops). No client here, so every shape is unit-tested without a
//! cluster.
//!
//! A node-local volume (a NodeCache's directory, an admin's hostPath) gets
//! a worker per matching node, pinned to the node by name, in the workers'
//! namespace ([`crate::home`]); a claim is shared, so it gets one worker,
//! in the DataStage's namespace. Either way `spec.workers` > 1 makes the
//! worker an Indexed Job whose pods each copy one shard (`--shards N`; the
//! pod's index comes from the Job). With fanout PeerToPeer the node's
//! worker also serves its peers and is told who they are
//! ([`crate::peers`]).
//!
//! Nothing a DataStage says chooses what runs with more rights than its
//! author has: the one step that runs as root always runs the operator's
//! own image on the directory Ferry laid out, and `spec.image` reaches
//! only the unprivileged transfer container, and only when the admin
//! allows it.

use std::collections::BTreeMap;

use ferry_contract::cli::{
    Concurrency, LogFormat, MAX_CONCURRENCY, Owner, ProgressMode, Purpose, StagerCli, StagerCommand, TransferOptions,
    WebIdentityOptions,
};
use ferry_contract::hub::HF_TOKEN_ENV;
use ferry_contract::layout::SHARED_OBJECTS_DIR;
use ferry_contract::options::{
    AZURE_CLIENT_ID_ENV, AZURE_CLIENT_SECRET_ENV, AZURE_STORAGE_ACCOUNT_ENV, AZURE_STORAGE_KEY_ENV,
    AZURE_STORAGE_SAS_TOKEN_ENV, AZURE_TENANT_ID_ENV, DOCKER_CONFIG_ENV,
};
use ferry_contract::{ByteSize, ExitStatus, Scheme};
use ferry_crds::names;
use ferry_crds::plan::{Direction, Plan, Volume as PlanVolume};
use ferry_crds::{DataStage, DataStageSpec, Fanout, NodeCacheSpec, Sharing, WebIdentityCredentials};
use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern,
    PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HostPathVolumeSource, KeyToPath, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodSecurityContext, PodSpec, PodTemplateSpec,
    ProjectedVolumeSource, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt as _;

use crate::delivery::WEB_IDENTITY_TOKEN_FILE;
use crate::home::{Home, qualified_endpoint};
pub use crate::worker::{Worker, plan_workers};

/// Where the volume is mounted in worker pods.
pub const DATA_MOUNT: &str = "/ferry/data";
/// Where a pull that shares its objects mounts the node directory that
/// holds them and its own (see [`data_layout`]).
pub const SHARED_MOUNT: &str = "/ferry/node";
/// Where a `gs://` credentials Secret (`key.json`) is mounted in worker pods.
pub const GCS_KEY_MOUNT: &str = "/var/run/secrets/ferry/gcs";
/// Where an `oci://` credentials Secret (`.dockerconfigjson`) is mounted in
/// worker pods, as the `config.json` of a Docker config directory.
pub const REGISTRY_CONFIG_MOUNT: &str = "/var/run/secrets/ferry/registry";
/// Where a web identity's projected service-account token is mounted in
/// worker pods, as the file [`WEB_IDENTITY_TOKEN_FILE`] (the key the
/// operator delivers it under).
pub const WEB_IDENTITY_MOUNT: &str = "/var/run/secrets/ferry/web-identity";
/// Where a DataStage's `caBundle` is mounted in worker pods, as the file
/// `ca.pem` that `SSL_CERT_FILE` names.
pub const CA_BUNDLE_MOUNT: &str = "/var/run/ferry/ca";
/// Where the kubelet reads a container's termination message.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// The name of the stager container in every pod the operator creates.
pub const STAGER_CONTAINER: &str = "stager";
/// The init container that readies a hostPath for the worker user
/// ([`prepare_container`]).
pub const PREPARE_CONTAINER: &str = "prepare";
/// Who worker pods run as: the images' non-root user. What a pull stages
/// belongs to it (files 0644, directories 0755: any user reads them).
pub const WORKER_USER: Owner = Owner { uid: 65532, gid: 65532 };
/// The only capabilities of the one step that runs as root: changing an
/// entry's owner, reaching entries whatever their mode while doing so, and
/// opening another user's directories to readers (all three are in the
/// `baseline` Pod Security level's list).
pub const PREPARE_CAPABILITIES: [&str; 3] = ["CHOWN", "DAC_OVERRIDE", "FOWNER"];
/// Name of the worker container port that serves the stager's metrics
/// (what a PodMonitor selects).
pub const METRICS_PORT_NAME: &str = "metrics";

/// The Job name of a worker in run `run`: `<prefix>-<worker>-r<run>`,
/// the prefix being the DataStage's name in its own namespace
/// ([`Home::prefix`]). An Indexed Job of `pods` pods names each pod's
/// host `<job>-<index>`, and the API server refuses the Job unless the
/// largest of those is a DNS label too: the name leaves room for it.
pub fn job_name(home: &Home, worker: &Worker, run: i64, pods: u32) -> String {
    let index_room = if pods > 1 { 1 + (pods - 1).to_string().len() } else { 0 };
    home.name_within(&worker.name, &format!("-r{run}"), crate::home::MAX_NAME - index_room)
}

/// The name of the clean-up Job of a worker.
pub fn cleanup_job_name(home: &Home, worker: &Worker) -> String {
    home.name(&worker.name, "-clean")
}

/// What worker pods get from the operator's configuration unless their
/// DataStage says otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerDefaults {
    /// The stager image (`spec.image` overrides it).
    pub image: String,
    /// The ServiceAccount (`spec.serviceAccountName` overrides it); `None`:
    /// the namespace's `default`.
    pub service_account: Option<String>,
    /// Where transfer workers serve Prometheus metrics; `None`: nowhere.
    pub metrics_port: Option<u16>,
    /// The share of a StoreBudget the workers about to start get (they
    /// follow later changes through the DataStage's status); `None`: no
    /// budget covers their store.
    pub store_share: Option<ferry_contract::StoreShare>,
    /// The room the namespace's StagingQuotas leave each worker about to
    /// start, by worker name (`--dataset-quota`); a worker not named here
    /// is not limited.
    pub dataset_quotas: BTreeMap<String, u64>,
    /// What other DataStages' pulls on each worker's node still write, by
    /// worker name (`--capacity-claimed`); a worker not named here has no
    /// claim to count.
    pub capacity_claims: BTreeMap<String, ferry_contract::CapacityClaims>,
    /// Node directories Ferry owns whole, in which pulls share their
    /// objects (see [`data_layout`]); empty: no pull shares.
    pub shared_host_paths: Vec<String>,
    /// Whether PeerToPeer workers speak mutual TLS with the certificates
    /// of the DataStage's peer Secret; false where that Secret predates
    /// peer TLS (see [`crate::peers`]).
    pub peer_tls: bool,
    /// The peer groups of the run's existing worker Jobs: a worker none of
    /// them names (a node labelled into a running DataStage) reads from
    /// them what they read (see [`crate::peers::options`]).
    pub peers_running: Vec<Vec<String>>,
    /// The namespace the workers of node-local volumes run in.
    pub workers_namespace: String,
    /// The owner, in the workers' namespace, of what is made there for the
    /// DataStage at hand: its anchor ([`crate::home`]); `None` before the
    /// anchor exists (only in tests: the controller creates it first).
    pub anchor: Option<OwnerReference>,
    /// The NodeCache the DataStage names, as the controller found it.
    pub node_cache: Option<NodeCacheSpec>,
    /// What `spec.image` may name besides [`WorkerDefaults::image`] (the
    /// operator's `--allowed-images`).
    pub allowed_images: Vec<String>,
}

impl WorkerDefaults {
    /// Defaults with only an image: no ServiceAccount, no metrics port,
    /// workers in the namespace `ferry-workers`.
    pub fn image(image: &str) -> Self {
        Self {
            image: image.to_owned(),
            service_account: None,
            metrics_port: None,
            store_share: None,
            dataset_quotas: BTreeMap::new(),
            capacity_claims: BTreeMap::new(),
            shared_host_paths: Vec::new(),
            peer_tls: true,
            peers_running: Vec::new(),
            workers_namespace: "ferry-workers".into(),
            anchor: None,
            node_cache: None,
            allowed_images: Vec::new(),
        }
    }

    /// Where `ds`'s workers by `plan` live.
    pub fn home(&self, ds: &DataStage, plan: &Plan<'_>) -> Home {
        Home::of(ds, plan, &self.workers_namespace, self.anchor.clone())
    }

    /// The image of the transfer container: `spec.image` when the admin
    /// allows it (admission refuses it otherwise; this keeps a DataStage
    /// from before the rule on the operator's own), else the operator's.
    pub fn transfer_image(&self, spec: &DataStageSpec) -> String {
        spec.image
            .clone()
            .filter(|image| image == &self.image || image_allowed(&self.allowed_images, image))
            .unwrap_or_else(|| self.image.clone())
    }
}

/// Whether `allowed` (exact references, or prefixes ending in `*`) allows
/// `image`.
pub fn image_allowed(allowed: &[String], image: &str) -> bool {
    allowed.iter().any(|allowed| match allowed.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => image == allowed,
    })
}

/// Where a worker's pods find its data: which node directory (or claim)
/// is mounted where, the paths in the container of the data and, for a
/// pull that shares, of the shared objects, and the data's directory on
/// the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataLayout {
    /// Node-local volumes: the node directory the pods mount, and where.
    pub node_mount: Option<(String, String)>,
    /// Node-local volumes: the data's directory on the node (what a pod
    /// that reads it mounts, through Ferry's PersistentVolume).
    pub node_data: Option<String>,
    /// The data directory in the container.
    pub data: String,
    /// The shared-objects directory in the container.
    pub shared_objects: Option<String>,
}

/// The layout of a worker of `ds` by `plan`.
///
/// A NodeCache lays every DataStage out at `ROOT/NAMESPACE/NAME`. A pull
/// that shares mounts the directory that holds both its own and the
/// shared objects (`ROOT/NAMESPACE` when the cache shares within a
/// namespace, `ROOT` across namespaces) at [`SHARED_MOUNT`]: hard links
/// need one mount of one filesystem. Anything else mounts its own
/// directory at [`DATA_MOUNT`].
///
/// An admin's hostPath strictly below one of `shared_host_paths` (the
/// longest that holds it) shares through that path's [`SHARED_OBJECTS_DIR`]
/// in the same way. A push reads a directory as it is, and a claim is one
/// copy already: neither shares.
pub fn data_layout(ds: &DataStage, plan: &Plan<'_>, defaults: &WorkerDefaults) -> DataLayout {
    let own = |dir: String| DataLayout {
        node_mount: Some((dir.clone(), DATA_MOUNT.into())),
        node_data: Some(dir),
        data: DATA_MOUNT.into(),
        shared_objects: None,
    };
    let shared = |mounted: String, rel: &str| DataLayout {
        node_data: Some(format!("{}/{rel}", mounted.trim_end_matches('/'))),
        node_mount: Some((mounted, SHARED_MOUNT.into())),
        data: format!("{SHARED_MOUNT}/{rel}"),
        shared_objects: Some(format!("{SHARED_MOUNT}/{SHARED_OBJECTS_DIR}")),
    };
    match plan.volume {
        PlanVolume::Claim { .. } => {
            DataLayout { node_mount: None, node_data: None, data: DATA_MOUNT.into(), shared_objects: None }
        }
        PlanVolume::NodeCache(_) => {
            let root = defaults.node_cache.as_ref().map_or("/var/lib/ferry", NodeCacheSpec::root).trim_end_matches('/');
            let (namespace, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
            let sharing = defaults.node_cache.as_ref().map(NodeCacheSpec::sharing).unwrap_or_default();
            match sharing {
                _ if plan.direction == Direction::Push => own(format!("{root}/{namespace}/{name}")),
                Sharing::None => own(format!("{root}/{namespace}/{name}")),
                Sharing::Namespace => shared(format!("{root}/{namespace}"), &name),
                Sharing::Cluster => {
                    shared(if root.is_empty() { "/".into() } else { root.to_owned() }, &format!("{namespace}/{name}"))
                }
            }
        }
        PlanVolume::HostPath(path) => {
            if plan.direction != Direction::Pull {
                return own(path.to_owned());
            }
            // The longest shared path that holds the directory (or is it).
            let holds = |root: &&String| {
                let root = root.trim_end_matches('/');
                path == root || path.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'))
            };
            let Some(root) =
                defaults.shared_host_paths.iter().filter(|root| !root.is_empty()).filter(holds).max_by_key(|r| r.len())
            else {
                return own(path.to_owned());
            };
            let root = root.trim_end_matches('/').to_owned();
            let rel = path[root.len()..].trim_matches('/');
            // The CEL rules refuse '..'; the shared path itself, an empty or '.'
            // component, or a directory inside shared objects shares nothing.
            if rel.is_empty() || rel.split('/').any(|part| matches!(part, "" | "." | ".." | SHARED_OBJECTS_DIR)) {
                return own(path.to_owned());
            }
            shared(if root.is_empty() { "/".into() } else { root }, rel)
        }
    }
}

/// The stager's transfer options for a spec: what the user tuned, and the
/// shard count when a worker has several pods.
pub fn transfer_options(spec: &DataStageSpec, plan: &Plan<'_>) -> TransferOptions {
    let mut options = TransferOptions {
        endpoint_url: plan.store.endpoint.clone(),
        anonymous: plan.store.anonymous == Some(true),
        region: plan.store.region.clone(),
        include: spec.include.clone(),
        exclude: spec.exclude.clone(),
        shards: Some(plan.pods_per_worker).filter(|n| *n > 1),
        // A pull removes what left the store: a re-run (a spec change, a
        // scheduled sync) mirrors the dataset, not its history.
        delete_removed: plan.direction == Direction::Pull,
        termination_log: Some(TERMINATION_LOG.into()),
        web_identity: web_identity_options(plan),
        ..TransferOptions::default()
    };
    if let Some(transfer) = &spec.transfer {
        if let Some(concurrency) = transfer.concurrency {
            options.concurrency = Concurrency::Fixed(concurrency.clamp(1, MAX_CONCURRENCY as i32) as u32);
        }
        options.part_size = transfer.part_size.clone();
        if let Some(limit) = &transfer.memory_limit {
            options.memory_limit = limit.clone();
        }
        options.max_bandwidth = transfer.max_bandwidth.clone();
        options.max_request_rate = transfer.max_request_rate.and_then(|rate| u32::try_from(rate).ok());
        if let Some(verify) = transfer.verify {
            options.verify = verify;
        }
    }
    if let Some(reserve) = spec.capacity.as_ref().and_then(|capacity| capacity.reserve.clone()) {
        options.capacity_reserve = reserve;
    }
    options
}

/// What the stager exchanges a web identity's token for, and where: the
/// token file the pod projects ([`credentials`]), the role, and the STS
/// (by default the store's own endpoint, where S3-compatible stores serve
/// it; without one, AWS STS in the region).
fn web_identity_options(plan: &Plan<'_>) -> WebIdentityOptions {
    let Some(identity) = plan.store.credentials.as_ref().and_then(|c| c.web_identity.as_ref()) else {
        return WebIdentityOptions::default();
    };
    WebIdentityOptions {
        web_identity_token_file: Some(format!("{WEB_IDENTITY_MOUNT}/{WEB_IDENTITY_TOKEN_FILE}").into()),
        role_arn: Some(identity.role_arn.clone()),
        sts_endpoint: identity.sts_endpoint.clone().or_else(|| plan.store.endpoint.clone()),
        role_session_name: None,
    }
}

/// The stager's command line for `worker` of `ds`, whose peers (with fanout
/// PeerToPeer) are `group`: the plan's workers as the Job is created. The
/// one thing it cannot say is `--peer-listen`, the pod's own IP:
/// [`build_job`] adds it ([`crate::peers::listen_on_pod_ip`]).
pub fn stager_cli(
    ds: &DataStage,
    plan: &Plan<'_>,
    worker: &Worker,
    group: &[Worker],
    defaults: &WorkerDefaults,
) -> StagerCli {
    let mut options = transfer_options(&ds.spec, plan);
    if plan.fanout == Fanout::PeerToPeer {
        let serve_bandwidth = ds.spec.transfer.as_ref().and_then(|t| t.peer_serve_bandwidth.clone());
        options.peers =
            crate::peers::options(worker, group, &defaults.peers_running, serve_bandwidth, defaults.peer_tls);
    }
    let home = defaults.home(ds, plan);
    if home.elsewhere() {
        // Workers in the workers' namespace resolve a Service name in
        // their own namespace; the DataStage meant one of its.
        let qualify = |endpoint: &mut Option<String>| {
            if let Some(endpoint) = endpoint.as_mut() {
                *endpoint = qualified_endpoint(endpoint, &home.datastage.namespace);
            }
        };
        qualify(&mut options.endpoint_url);
        qualify(&mut options.web_identity.sts_endpoint);
    }
    // Running workers write their own entry of the DataStage's status.
    options.report_to = Some(format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any()));
    options.worker = Some(worker.name.clone());
    options.metrics_addr = defaults.metrics_port.map(|port| ([0, 0, 0, 0], port).into());
    options.store_share = defaults.store_share;
    if plan.direction == Direction::Pull {
        // A size of more than 15 digits is written in KiB, rounded down.
        options.dataset_quota = defaults
            .dataset_quotas
            .get(&worker.name)
            .and_then(|bytes| ByteSize::from_bytes(*bytes).or_else(|_| ByteSize::from_bytes(bytes >> 10 << 10)).ok());
        options.capacity_claimed = defaults.capacity_claims.get(&worker.name).filter(|c| !c.is_empty()).cloned();
        // The operator switches once every worker holds the new version.
        options.versions = ds.spec.versioned().then_some(ferry_contract::VersionsMode::Build);
    }
    let layout = data_layout(ds, plan, defaults);
    options.shared_objects = layout.shared_objects.map(Into::into);
    let location = plan.location.clone();
    let command = match plan.direction {
        Direction::Pull => StagerCommand::Pull { source: location, destination: layout.data.into(), options },
        // The node creates a hostPath that does not exist (DirectoryOrCreate,
        // which a pull needs): pushing it must fail, not succeed with nothing.
        Direction::Push => {
            StagerCommand::Push { source: DATA_MOUNT.into(), destination: location, require_files: true, options }
        }
    };
    StagerCli { command, log_format: LogFormat::Json, progress: ProgressMode::Always }
}

/// The command line of a clean-up pod.
pub fn cleanup_cli(layout: &DataLayout) -> StagerCli {
    StagerCli {
        command: StagerCommand::Clean {
            directory: layout.data.clone().into(),
            shared_objects: layout.shared_objects.clone().map(Into::into),
        },
        log_format: LogFormat::Json,
        progress: ProgressMode::Never,
    }
}

/// Labels of a DataStage's Jobs and their pods: the home's, the stager's
/// app name, `role`, and the run.
pub(crate) fn labels(home: &Home, role: (&str, &str), run: Option<i64>) -> BTreeMap<String, String> {
    let mut labels = home.labels(role);
    labels.insert(names::STAGER_APP.0.to_owned(), names::STAGER_APP.1.to_owned());
    if let Some(run) = run {
        labels.insert(names::RUN.to_owned(), run.to_string());
    }
    labels
}

/// The data volume and its mount.
fn data_volume(plan: &Plan<'_>, layout: &DataLayout) -> (Volume, VolumeMount) {
    let mut volume = Volume { name: "data".into(), ..Volume::default() };
    let mut mount = VolumeMount { name: "data".into(), mount_path: DATA_MOUNT.into(), ..VolumeMount::default() };
    match (plan.volume, &layout.node_mount) {
        (PlanVolume::Claim { name, sub_path }, _) => {
            volume.persistent_volume_claim =
                Some(PersistentVolumeClaimVolumeSource { claim_name: name.to_owned(), read_only: None });
            mount.sub_path = sub_path.map(str::to_owned);
        }
        (_, Some((host_dir, mount_path))) => {
            mount.mount_path.clone_from(mount_path);
            volume.host_path =
                Some(HostPathVolumeSource { path: host_dir.clone(), type_: Some("DirectoryOrCreate".into()) });
        }
        (_, None) => unreachable!("a node-local volume's layout mounts a node directory"),
    }
    (volume, mount)
}

/// Whether the workers' own identity is the credential for an `az://`
/// store: no Secret and not anonymous, and the workers run in the
/// DataStage's namespace, as its service account (a claim's). Their pods
/// then carry [`names::AZURE_WORKLOAD_IDENTITY`] (see `ferry_store::azure::entra`);
/// on a cluster without the webhook the label does nothing. Workers in the
/// workers' namespace never ask for an identity: it would be Ferry's, not
/// the tenant's.
fn azure_pod_identity(plan: &Plan<'_>, home: &Home) -> bool {
    plan.location.scheme == Scheme::Azure
        && plan.store.credentials.is_none()
        && plan.store.anonymous != Some(true)
        && !home.elsewhere()
}

/// The store's credentials: environment variables (`s3://`, `az://`), and for `gs://` a key
/// file volume. Without a Secret the pod's own identity (IRSA, GKE
/// Workload Identity, instance role) is the credential. Workers in the
/// workers' namespace read the copy the operator made there of the
/// DataStage's Secret ([`crate::delivery`]), and the web identity token it
/// requested for the DataStage's service account; a claim's workers read
/// the Secret itself and project their own account's token.
///
/// Long on purpose: one arm per store, each the variables or the volume
/// that store's client reads; a table more than a procedure.
fn credentials(plan: &Plan<'_>, home: &Home) -> (Vec<EnvVar>, Option<(Volume, VolumeMount)>) {
    let Some(credentials) = &plan.store.credentials else { return (Vec::new(), None) };
    if credentials.web_identity.is_some() && home.elsewhere() {
        let volume = Volume {
            name: "web-identity".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(home.held(crate::delivery::WEB_IDENTITY)),
                items: Some(vec![KeyToPath {
                    key: WEB_IDENTITY_TOKEN_FILE.into(),
                    path: WEB_IDENTITY_TOKEN_FILE.into(),
                    mode: None,
                }]),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        };
        let mount = read_only_mount(&volume, WEB_IDENTITY_MOUNT);
        return (Vec::new(), Some((volume, mount)));
    }
    if let Some(identity) = &credentials.web_identity {
        // The token is the only credential on the pod; the stager's flags
        // (transfer_options) say what to exchange it for.
        let volume = Volume {
            name: "web-identity".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        audience: Some(
                            identity
                                .audience
                                .clone()
                                .unwrap_or_else(|| WebIdentityCredentials::DEFAULT_AUDIENCE.into()),
                        ),
                        expiration_seconds: Some(
                            identity.expiration_seconds.unwrap_or(WebIdentityCredentials::DEFAULT_EXPIRATION_SECONDS),
                        ),
                        path: WEB_IDENTITY_TOKEN_FILE.into(),
                    }),
                    ..VolumeProjection::default()
                }]),
                ..ProjectedVolumeSource::default()
            }),
            ..Volume::default()
        };
        let mount = read_only_mount(&volume, WEB_IDENTITY_MOUNT);
        return (Vec::new(), Some((volume, mount)));
    }
    let Some(secret) = &credentials.name else { return (Vec::new(), None) };
    let copy = home.held(crate::delivery::CREDENTIALS);
    let secret = if home.elsewhere() { &copy } else { secret };
    match plan.location.scheme {
        // A service-account key: Application Default Credentials read the file.
        Scheme::Gcs => {
            let env = EnvVar {
                name: "GOOGLE_APPLICATION_CREDENTIALS".into(),
                value: Some(format!("{GCS_KEY_MOUNT}/key.json")),
                ..EnvVar::default()
            };
            let volume = Volume {
                name: "gcs-key".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.to_owned()),
                    items: Some(vec![KeyToPath { key: "key.json".into(), path: "key.json".into(), mode: None }]),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            };
            let mount = read_only_mount(&volume, GCS_KEY_MOUNT);
            (vec![env], Some((volume, mount)))
        }
        Scheme::S3 => {
            let keys = [("AWS_ACCESS_KEY_ID", false), ("AWS_SECRET_ACCESS_KEY", false), ("AWS_SESSION_TOKEN", true)];
            (secret_env(secret, &keys), None)
        }
        // A Docker config: the stager reads DOCKER_CONFIG/config.json, the
        // key `kubectl create secret docker-registry` writes.
        Scheme::Oci => {
            let env = EnvVar {
                name: DOCKER_CONFIG_ENV.into(),
                value: Some(REGISTRY_CONFIG_MOUNT.into()),
                ..EnvVar::default()
            };
            let volume = Volume {
                name: "registry-config".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret.to_owned()),
                    items: Some(vec![KeyToPath {
                        key: ".dockerconfigjson".into(),
                        path: "config.json".into(),
                        mode: None,
                    }]),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            };
            let mount = read_only_mount(&volume, REGISTRY_CONFIG_MOUNT);
            (vec![env], Some((volume, mount)))
        }
        // The account is required (it names the default endpoint); a key,
        // a SAS token or a service principal (tenant, client id and secret),
        // whichever the Secret holds, authorises.
        Scheme::Azure => {
            let keys = [
                (AZURE_STORAGE_ACCOUNT_ENV, false),
                (AZURE_STORAGE_KEY_ENV, true),
                (AZURE_STORAGE_SAS_TOKEN_ENV, true),
                (AZURE_TENANT_ID_ENV, true),
                (AZURE_CLIENT_ID_ENV, true),
                (AZURE_CLIENT_SECRET_ENV, true),
            ];
            (secret_env(secret, &keys), None)
        }
        // A Hub access token, under the name the Hub's own client reads.
        Scheme::Hf => (secret_env(secret, &[(HF_TOKEN_ENV, false)]), None),
    }
}

/// Each of `keys` (a name, and whether the Secret may lack it) as the
/// variable of the same name, read from the Secret.
fn secret_env(secret: &str, keys: &[(&str, bool)]) -> Vec<EnvVar> {
    keys.iter()
        .map(|&(key, optional)| EnvVar {
            name: key.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.to_owned(),
                    key: key.into(),
                    optional: Some(optional),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
        .collect()
}

/// The store's private CA, when the spec names one: the ConfigMap key as a
/// file, and `SSL_CERT_FILE` pointing at it (the stager's TLS, every data
/// path, trusts that bundle instead of the image's system CAs). Workers in
/// the workers' namespace read the operator's copy of it
/// ([`crate::delivery`]), which holds it as [`crate::delivery::CA_FILE`].
fn ca_bundle(plan: &Plan<'_>, home: &Home) -> Option<(EnvVar, Volume, VolumeMount)> {
    let reference = plan.store.ca_bundle.as_ref()?;
    let file = crate::delivery::CA_FILE;
    let env =
        EnvVar { name: "SSL_CERT_FILE".into(), value: Some(format!("{CA_BUNDLE_MOUNT}/{file}")), ..EnvVar::default() };
    let (name, key) = if home.elsewhere() {
        (home.held(crate::delivery::CA_BUNDLE), file.to_owned())
    } else {
        (reference.name.clone(), reference.key_or_default().to_owned())
    };
    let volume = Volume {
        name: "ca-bundle".into(),
        config_map: Some(ConfigMapVolumeSource {
            name,
            items: Some(vec![KeyToPath { key, path: file.into(), mode: None }]),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mount = read_only_mount(&volume, CA_BUNDLE_MOUNT);
    Some((env, volume, mount))
}

/// `volume` mounted read-only at `path`: what a worker reads but never writes.
fn read_only_mount(volume: &Volume, path: &str) -> VolumeMount {
    VolumeMount { name: volume.name.clone(), mount_path: path.into(), read_only: Some(true), ..VolumeMount::default() }
}

/// `NODE_NAME` from the downward API, which the stager reports with its progress.
fn node_name_env() -> EnvVar {
    EnvVar {
        name: "NODE_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: "spec.nodeName".into(), api_version: None }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

/// Required node affinity to one node by its name (the `metadata.name`
/// field), not by the `kubernetes.io/hostname` label, which some providers
/// set to something else.
pub fn pinned_to(node: &str) -> NodeAffinity {
    NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec![node.to_owned()]),
                }]),
                match_expressions: None,
            }],
        }),
        preferred_during_scheduling_ignored_during_execution: None,
    }
}

/// The command line of the init container that readies a hostPath.
pub fn prepare_cli(plan: &Plan<'_>, layout: &DataLayout) -> StagerCli {
    let purpose = match plan.direction {
        Direction::Pull => Purpose::Pull,
        Direction::Push => Purpose::Push,
    };
    StagerCli {
        command: StagerCommand::Prepare {
            directory: layout.data.clone().into(),
            purpose,
            owner: WORKER_USER,
            shared_objects: layout.shared_objects.clone().map(Into::into),
        },
        log_format: LogFormat::Json,
        progress: ProgressMode::Never,
    }
}

/// The init container of a node-local worker. A kubelet creates a missing
/// hostPath as root (0755) and `fsGroup` does not apply to hostPaths, so
/// the unprivileged worker could not write its first file there. This one
/// step runs as root with [`PREPARE_CAPABILITIES`] only, hands the
/// directory to [`WORKER_USER`] (a pull: the whole tree, its directories
/// readable by all; a push: its state directory, the files keep their
/// owners) and exits. It runs `image`, the operator's own stager image,
/// whatever the DataStage's `spec.image` says.
fn prepare_container(plan: &Plan<'_>, layout: &DataLayout, image: &str, mount: VolumeMount) -> Container {
    Container {
        name: PREPARE_CONTAINER.into(),
        image: Some(image.to_owned()),
        args: Some(literal(prepare_cli(plan, layout).to_args())),
        volume_mounts: Some(vec![mount]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        security_context: Some(SecurityContext {
            run_as_user: Some(0),
            run_as_group: Some(0),
            run_as_non_root: Some(false),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(PREPARE_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
            }),
            ..SecurityContext::default()
        }),
        ..Container::default()
    }
}

/// The images of a worker pod: the transfer container's, and the
/// operator's own for the step that runs as root.
struct Images<'a> {
    transfer: &'a str,
    privileged: &'a str,
}

/// A pod spec running the stager with `args` on `worker`'s node (or where
/// the placement allows), the data volume mounted as `layout` says, locked
/// down, as the service account its home calls for.
fn stager_pod(
    ds: &DataStage,
    plan: &Plan<'_>,
    (layout, home): (&DataLayout, &Home),
    worker: &Worker,
    images: &Images<'_>,
    (args, defaults): (Vec<String>, &WorkerDefaults),
) -> PodSpec {
    let placement = ds.spec.placement.clone().unwrap_or_default();
    let (volume, mount) = data_volume(plan, layout);
    // A per-node worker is pinned to its node (placement already chose it,
    // and tolerations still apply); a shared worker goes wherever the
    // placement lets the scheduler put it.
    let (node_selector, affinity) = match &worker.node {
        Some(node) => (None, Some(Affinity { node_affinity: Some(pinned_to(node)), ..Affinity::default() })),
        None => (placement.node_selector.clone(), placement.affinity.clone()),
    };
    // In the workers' namespace, Ferry's own account; in the DataStage's
    // (a claim), the one the DataStage names, whose identity is its own.
    let service_account = if home.elsewhere() {
        defaults.service_account.clone()
    } else {
        ds.spec.service_account_name.clone().or_else(|| defaults.service_account.clone())
    };
    PodSpec {
        restart_policy: Some("Never".into()),
        service_account_name: service_account,
        node_selector,
        affinity,
        tolerations: placement.tolerations.clone(),
        init_containers: plan
            .volume
            .node_local()
            .then(|| vec![prepare_container(plan, layout, images.privileged, mount.clone())]),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(i64::from(WORKER_USER.uid)),
            run_as_group: Some(i64::from(WORKER_USER.gid)),
            // Claims: the kubelet hands the volume to this group.
            fs_group: Some(i64::from(WORKER_USER.gid)),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
            ..PodSecurityContext::default()
        }),
        containers: vec![Container {
            name: STAGER_CONTAINER.into(),
            image: Some(images.transfer.to_owned()),
            args: Some(args),
            volume_mounts: Some(vec![mount]),
            termination_message_policy: Some("FallbackToLogsOnError".into()),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
                ..SecurityContext::default()
            }),
            ..Container::default()
        }],
        volumes: Some(vec![volume]),
        ..PodSpec::default()
    }
}

/// The worker Job for `worker` in run `run`, in its home ([`Home`]): owned
/// by the DataStage in its namespace, by its anchor in the workers'. With
/// fanout PeerToPeer its peers are `group`, the plan's workers now: a Job's
/// pod template cannot change, so a node that joins later gets a Job with
/// the larger group while the earlier Jobs keep theirs.
pub fn build_job(
    ds: &DataStage,
    plan: &Plan<'_>,
    worker: &Worker,
    group: &[Worker],
    run: i64,
    defaults: &WorkerDefaults,
) -> Job {
    let spec = &ds.spec;
    let home = defaults.home(ds, plan);
    let transfer_image = defaults.transfer_image(spec);
    let images = Images { transfer: &transfer_image, privileged: &defaults.image };
    let peer_to_peer = plan.fanout == Fanout::PeerToPeer;
    let cli = stager_cli(ds, plan, worker, group, defaults);
    // The members its worker divides the dataset with, for a worker that
    // comes later to read (crate::peers::options).
    let dividing = match &cli.command {
        StagerCommand::Pull { options, .. } if options.peers.peer_owners.is_empty() => options.peers.peer_group.clone(),
        StagerCommand::Pull { options, .. } => options.peers.peer_owners.clone(),
        _ => Vec::new(),
    };
    let mut args = literal(cli.to_args());
    if peer_to_peer {
        args = crate::peers::listen_on_pod_ip(args);
    }
    let layout = data_layout(ds, plan, defaults);
    let mut pod = stager_pod(ds, plan, (&layout, &home), worker, &images, (args, defaults));
    let container = &mut pod.containers[0];
    let (mut env, key_file) = credentials(plan, &home);
    env.push(node_name_env());
    let peer_secret = crate::peers::secret_name(&home);
    if peer_to_peer {
        env.extend(crate::peers::pod_env(&peer_secret));
    }
    let ca = ca_bundle(plan, &home);
    env.extend(ca.as_ref().map(|(ssl_cert_file, _, _)| ssl_cert_file.clone()));
    container.env = Some(env);
    container.resources = spec.resources.clone();
    let peer_tls = (peer_to_peer && defaults.peer_tls).then(|| crate::peers::tls_volume(&peer_secret));
    for (volume, mount) in key_file.into_iter().chain(ca.map(|(_, volume, mount)| (volume, mount))).chain(peer_tls) {
        container.volume_mounts.get_or_insert_with(Vec::new).push(mount);
        pod.volumes.get_or_insert_with(Vec::new).push(volume);
    }
    // Transfer workers serve metrics on a named port for a PodMonitor to
    // find, and their peers on another.
    let mut ports = Vec::new();
    if let Some(port) = defaults.metrics_port {
        ports.push(ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    if peer_to_peer {
        ports.push(crate::peers::container_port());
    }
    pod.containers[0].ports = Some(ports).filter(|p| !p.is_empty());
    let labels = labels(&home, (names::WORKER, &worker.name), Some(run));
    let mut pod_labels = labels.clone();
    if azure_pod_identity(plan, &home) {
        pod_labels.insert(names::AZURE_WORKLOAD_IDENTITY.to_owned(), "true".to_owned());
    }
    let pods = i32::try_from(plan.pods_per_worker).unwrap_or(1);
    let name = job_name(&home, worker, run, pods.unsigned_abs());
    Job {
        metadata: ObjectMeta {
            labels: Some(labels.clone()),
            annotations: (!dividing.is_empty()).then(|| BTreeMap::from([crate::peers::group_annotation(&dividing)])),
            ..home.metadata(name, (names::WORKER, &worker.name))
        },
        spec: Some(JobSpec {
            completion_mode: Some(if pods > 1 { "Indexed" } else { "NonIndexed" }.into()),
            completions: Some(pods),
            parallelism: Some(pods),
            backoff_limit: Some(spec.backoff_limit.unwrap_or(3)),
            active_deadline_seconds: spec.active_deadline_seconds,
            ttl_seconds_after_finished: spec.ttl_seconds_after_finished,
            pod_failure_policy: Some(failure_policy(&pod)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(pod_labels), ..ObjectMeta::default() }),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        status: None,
    }
}

/// Exit codes no retry can fix fail the Job at once, the stager's and (on
/// a hostPath) the prepare step's, which fails for good when it lacks its
/// capabilities or finds a link where the state directory belongs; a pod
/// evicted or preempted did nothing wrong and is not counted. The API
/// server refuses a rule naming a container the pod does not have.
fn failure_policy(pod: &PodSpec) -> PodFailurePolicy {
    let fail_on_permanent_exit = |container: &str| PodFailurePolicyRule {
        action: "FailJob".into(),
        on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
            container_name: Some(container.into()),
            operator: "In".into(),
            values: ExitStatus::permanent_codes(),
        }),
        on_pod_conditions: None,
    };
    let init = pod.init_containers.iter().flatten().map(|c| c.name.as_str());
    let mut rules: Vec<_> = std::iter::once(STAGER_CONTAINER).chain(init).map(fail_on_permanent_exit).collect();
    rules.push(PodFailurePolicyRule {
        action: "Ignore".into(),
        on_exit_codes: None,
        on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
            type_: "DisruptionTarget".into(),
            status: Some("True".into()),
        }]),
    });
    PodFailurePolicy { rules }
}

/// Arguments as the stager must receive them, whatever they contain.
/// Kubernetes expands `$(VAR)` in a container's args from its environment,
/// which holds the store's credentials and the peer token: a spec string
/// such as `s3://bucket/$(AWS_SECRET_ACCESS_KEY)` would otherwise send a
/// Secret to whoever runs the endpoint, and `$$` would lose a `$`. `$$` is
/// the escape of a literal `$`.
pub fn literal(args: Vec<String>) -> Vec<String> {
    args.into_iter().map(|arg| arg.replace('$', "$$")).collect()
}

/// The Job that removes what `worker` staged, for `reclaimPolicy: Delete`.
/// Not owned by the DataStage: the garbage collector must not race it
/// while the DataStage is going away; the operator deletes it when done.
pub fn build_cleanup_job(ds: &DataStage, plan: &Plan<'_>, worker: &Worker, defaults: &WorkerDefaults) -> Job {
    let layout = data_layout(ds, plan, defaults);
    let home = defaults.home(ds, plan);
    let short = ShortJob {
        name: cleanup_job_name(&home, worker),
        labels: labels(&home, (names::CLEANUP, &worker.name), None),
        owned: false,
    };
    short.build(ds, plan, &layout, worker, &cleanup_cli(&layout), defaults)
}

/// A short Job the operator runs on a worker's place besides the transfer
/// (a clean-up, a version switch): the operator's own stager image on the
/// workers' volume and node, no credentials, three retries within ten
/// minutes.
pub(crate) struct ShortJob {
    /// The Job's name.
    pub name: String,
    /// The Job's and its pod's labels.
    pub labels: BTreeMap<String, String>,
    /// Whether the DataStage owns it (its changes then wake the
    /// DataStage). In the workers' namespace the anchor owns every Job: it
    /// goes only once the DataStage is gone, clean-ups done.
    pub owned: bool,
}

impl ShortJob {
    /// The Job running `cli` on `worker`'s place, laid out as `layout`.
    pub(crate) fn build(
        self,
        ds: &DataStage,
        plan: &Plan<'_>,
        layout: &DataLayout,
        worker: &Worker,
        cli: &StagerCli,
        defaults: &WorkerDefaults,
    ) -> Job {
        let home = defaults.home(ds, plan);
        let images = Images { transfer: &defaults.image, privileged: &defaults.image };
        let pod = stager_pod(ds, plan, (layout, &home), worker, &images, (literal(cli.to_args()), defaults));
        let owner = if home.elsewhere() || self.owned { home.owner.clone() } else { None };
        Job {
            metadata: ObjectMeta {
                name: Some(self.name),
                namespace: Some(home.namespace.clone()),
                labels: Some(self.labels.clone()),
                owner_references: owner.map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            spec: Some(JobSpec {
                backoff_limit: Some(3),
                active_deadline_seconds: Some(600),
                ttl_seconds_after_finished: Some(300),
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta { labels: Some(self.labels), ..ObjectMeta::default() }),
                    spec: Some(pod),
                },
                ..JobSpec::default()
            }),
            status: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use serde_json::json;
    use std::path::Path;

    fn datastage(spec: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "imagenet", "namespace": "ml", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn pull_to_host_path() -> DataStage {
        datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "endpoint": "http://minio:9000", "credentials": {"name": "s3"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
            "placement": {"nodeSelector": {"pool": "gpu"}},
            "include": ["*.tar"],
            "transfer": {"concurrency": 16, "verify": "Size", "partSize": "8Mi", "maxRequestRate": 250},
        }))
    }

    /// The anchor's owner reference, as the controller finds it.
    fn anchor() -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "ml-imagenet-anchor".into(),
            uid: "anchor-uid".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }
    }

    /// Defaults with the anchor in place, as the controller builds Jobs.
    fn anchored(image: &str) -> WorkerDefaults {
        WorkerDefaults { anchor: Some(anchor()), ..WorkerDefaults::image(image) }
    }

    /// What the DataStage's home calls an object it holds for the workers.
    fn held(ds: &DataStage, what: &str) -> String {
        WorkerDefaults::image("s:1").home(ds, &ds.spec.plan().unwrap()).held(what)
    }

    fn pod(job: &Job) -> PodSpec {
        job.spec.clone().unwrap().template.spec.unwrap()
    }

    /// The pod's IP in tests.
    const POD_IP: &str = "10.0.0.7";

    /// The stager's view of a container's arguments: what it would parse
    /// once the kubelet expanded `$(POD_IP)`, as it does for a variable the
    /// container's environment defines (here from the downward API).
    fn parsed(pod: &PodSpec) -> StagerCli {
        let container = &pod.containers[0];
        let has_pod_ip = container.env.iter().flatten().any(|e| {
            e.name == crate::peers::POD_IP_ENV
                && e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str())
                    == Some("status.podIP")
        });
        let env: BTreeMap<&str, &str> =
            if has_pod_ip { BTreeMap::from([(crate::peers::POD_IP_ENV, POD_IP)]) } else { BTreeMap::new() };
        let args = container.args.clone().unwrap().into_iter().map(|arg| kubelet_expand(&arg, &env));
        StagerCli::try_parse_from(std::iter::once("ferry-stager".to_owned()).chain(args)).unwrap()
    }

    /// What the kubelet makes of an argument: `$$` is a `$`, `$(NAME)` the
    /// value of a variable the container defines, anything else as written.
    fn kubelet_expand(arg: &str, env: &BTreeMap<&str, &str>) -> String {
        let mut out = String::new();
        let mut rest = arg;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            rest = &rest[at..];
            if let Some(after) = rest.strip_prefix("$$") {
                out.push('$');
                rest = after;
            } else if let Some((name, after)) = rest.strip_prefix("$(").and_then(|r| r.split_once(')'))
                && let Some(value) = env.get(name)
            {
                out.push_str(value);
                rest = after;
            } else {
                out.push('$');
                rest = &rest[1..];
            }
        }
        out + rest
    }

    #[test]
    fn spec_strings_reach_the_stager_as_written_and_never_expand_a_variable() {
        let mut ds = pull_to_host_path();
        ds.spec.source.uri = Some("s3://datasets/$(AWS_SECRET_ACCESS_KEY)/a$$b$".into());
        let plan = ds.spec.plan().unwrap();
        let workers = plan_workers(&plan, &["a".to_owned()]);
        let job = build_job(&ds, &plan, &workers[0], &workers, 1, &WorkerDefaults::image("stager:1"));
        let container = &pod(&job).containers[0];
        assert!(container.env.iter().flatten().any(|e| e.name == "AWS_SECRET_ACCESS_KEY"), "the secret is in the env");
        let mut env: BTreeMap<&str, &str> = BTreeMap::from([("AWS_SECRET_ACCESS_KEY", "hunter2")]);
        env.insert(crate::peers::POD_IP_ENV, POD_IP);
        let expanded: Vec<String> = container.args.clone().unwrap().iter().map(|a| kubelet_expand(a, &env)).collect();
        assert!(expanded.iter().all(|a| !a.contains("hunter2")), "{expanded:?}");
        assert!(expanded.iter().any(|a| a == "s3://datasets/$(AWS_SECRET_ACCESS_KEY)/a$$b$/"), "{expanded:?}");
        assert!(expanded.iter().any(|a| a == &format!("--peer-listen={POD_IP}:9466")), "the pod's IP still expands");
    }

    #[test]
    fn a_capacity_reserve_reaches_the_stager_as_written_and_the_default_when_unset() {
        let mut ds = pull_to_host_path();
        let reserve_of = |ds: &DataStage| transfer_options(&ds.spec, &ds.spec.plan().unwrap()).capacity_reserve;
        assert_eq!(reserve_of(&ds).to_string(), ferry_contract::options::DEFAULT_CAPACITY_RESERVE);
        ds.spec.capacity =
            Some(ferry_crds::CapacityPolicy { reserve: Some("10%".parse().unwrap()), ..Default::default() });
        assert_eq!(reserve_of(&ds), ferry_contract::CapacityReserve::Percent(10));
        let plan = ds.spec.plan().unwrap();
        let workers = plan_workers(&plan, &["a".to_owned()]);
        let job = build_job(&ds, &plan, &workers[0], &workers, 1, &WorkerDefaults::image("stager:1"));
        let StagerCommand::Pull { options, .. } = parsed(&pod(&job)).command else { panic!("a pull") };
        assert_eq!(options.capacity_reserve.to_string(), "10%");
    }

    #[test]
    fn a_host_path_pull_gets_one_job_per_node_in_the_workers_namespace_pinned_by_node_name() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let workers = plan_workers(&plan, &["a".to_owned(), "c".to_owned()]);
        let job = build_job(&ds, &plan, &workers[1], &workers, 7, &anchored("stager:1"));
        let name = job.metadata.name.clone().unwrap();
        assert!(name.starts_with("ml-imagenet-") && name.ends_with("-c-r7"), "{name}");
        assert_eq!(job.metadata.namespace.as_deref(), Some("ferry-workers"), "never the DataStage's namespace");
        let labels = job.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[names::RUN], "7");
        assert_eq!((labels[names::DATASTAGE_NAMESPACE].as_str(), labels[names::DATASTAGE_UID].as_str()), ("ml", "u-1"));
        assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0], anchor(), "its anchor owns it");
        let pod = pod(&job);
        // Pinned by the node's name, not its hostname label.
        assert_eq!(pod.node_selector, None);
        let terms = pod
            .affinity
            .clone()
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        let field = &terms.node_selector_terms[0].match_fields.as_ref().unwrap()[0];
        assert_eq!(
            (field.key.as_str(), field.operator.as_str(), field.values.as_deref()),
            ("metadata.name", "In", Some(&["c".to_owned()][..]))
        );
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        assert_eq!(pod.security_context.clone().unwrap().run_as_non_root, Some(true));
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("stager:1"));
        let context = container.security_context.clone().unwrap();
        assert_eq!(context.read_only_root_filesystem, Some(true));
        assert_eq!(context.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        let env = container.env.clone().unwrap();
        // The operator's copy of the Secret, next to the workers: a pod
        // cannot read a Secret of another namespace.
        let copy = held(&ds, crate::delivery::CREDENTIALS);
        let secret_keys: Vec<_> = env
            .iter()
            .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
            .filter(|r| r.name == copy)
            .map(|r| r.key.clone())
            .collect();
        assert_eq!(secret_keys, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]);
        assert_eq!(pod.service_account_name, None, "Ferry's own account (none configured here), never the tenant's");
        assert_eq!(pod.volumes.clone().unwrap()[0].host_path.as_ref().unwrap().path, "/mnt/ferry/imagenet");

        let StagerCommand::Pull { source, destination, options } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!((source.to_string(), destination), ("s3://datasets/imagenet/".to_owned(), DATA_MOUNT.into()));
        assert_eq!(
            options.endpoint_url.as_deref(),
            Some("http://minio.ml:9000"),
            "the Service of the DataStage's namespace"
        );
        assert_eq!(
            (options.include.as_slice(), options.concurrency),
            (&["*.tar".to_owned()][..], Concurrency::Fixed(16))
        );
        assert_eq!(options.verify, ferry_contract::VerifyMode::Size);
        assert_eq!(options.part_size.map(|s| s.bytes()), Some(8 << 20), "8Mi reaches the stager as a size it parses");
        assert_eq!(options.max_request_rate, Some(250));
        assert_eq!(options.termination_log.as_deref(), Some(std::path::Path::new(TERMINATION_LOG)));
        assert_eq!(options.report_to.as_deref(), Some("ml/imagenet"));
        assert!(options.delete_removed, "a re-sync removes what left the store");
        assert_eq!(options.shards, None);
    }

    #[test]
    fn a_peer_to_peer_worker_serves_on_its_pod_ip_with_the_datastages_secret_and_knows_its_group() {
        let mut ds = pull_to_host_path();
        ds.spec.transfer.as_mut().unwrap().peer_serve_bandwidth = Some("500Mi".parse().unwrap());
        let plan = ds.spec.plan().unwrap();
        assert_eq!(plan.fanout, Fanout::PeerToPeer, "the default for a pull onto hostPaths");
        let workers = plan_workers(&plan, &["c".to_owned(), "a".to_owned(), "b".to_owned()]);
        let defaults = WorkerDefaults { metrics_port: Some(9464), ..WorkerDefaults::image("stager:1") };
        let pod = pod(&build_job(&ds, &plan, &workers[2], &workers, 1, &defaults));
        let container = &pod.containers[0];

        let args = container.args.clone().unwrap();
        let listen: Vec<_> = args.iter().filter(|a| a.starts_with("--peer-listen")).collect();
        assert_eq!(listen, ["--peer-listen=$(POD_IP):9466"]);
        let StagerCommand::Pull { options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(options.peers.peer_group, ["a", "b", "c"]);
        assert_eq!(options.peers.peer_listen, Some(format!("{POD_IP}:9466").parse().unwrap()));
        assert_eq!(options.peers.peer_serve_bandwidth.map(|s| s.bytes()), Some(500 << 20));
        assert_eq!(options.peers.peer_timeout, ferry_contract::peers::DEFAULT_PEER_TIMEOUT);
        // Peers find each other's addresses in the status each writes.
        assert_eq!((options.worker.as_deref(), options.report_to.as_deref()), (Some("b"), Some("ml/imagenet")));

        let env = container.env.clone().unwrap();
        let from = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value_from.clone()).unwrap();
        assert_eq!(from("POD_IP").field_ref.unwrap().field_path, "status.podIP");
        let token = from(ferry_contract::peers::PEER_TOKEN_ENV).secret_key_ref.unwrap();
        let peers = held(&ds, crate::peers::HOLDS_PEERS);
        assert_eq!((token.name.as_str(), token.key.as_str()), (peers.as_str(), "token"));
        assert!(args.iter().all(|a| !a.contains("token")), "the secret is never a flag");
        // The certificate files from the same Secret, where --peer-tls says.
        let tls_dir = options.peers.peer_tls.clone().unwrap();
        let mount = container.volume_mounts.iter().flatten().find(|m| tls_dir == Path::new(&m.mount_path)).unwrap();
        let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).unwrap();
        assert_eq!(volume.secret.as_ref().unwrap().secret_name.as_deref(), Some(peers.as_str()));

        let ports: Vec<_> =
            container.ports.iter().flatten().map(|p| (p.name.clone().unwrap(), p.container_port)).collect();
        assert_eq!(ports, [(METRICS_PORT_NAME.to_owned(), 9464), (crate::peers::PEER_PORT_NAME.to_owned(), 9466)]);
    }

    #[test]
    fn a_node_that_joins_running_workers_reads_from_them_what_they_read() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let defaults = WorkerDefaults::image("stager:1");
        let first = plan_workers(&plan, &["a".to_owned(), "b".to_owned()]);
        let running: Vec<Job> = first.iter().map(|w| build_job(&ds, &plan, w, &first, 1, &defaults)).collect();
        // The group each Job was created with reads back from the Job alone.
        assert_eq!(crate::peers::running_groups(&running), [["a", "b"], ["a", "b"]]);
        // Node c joins: its group names all three, and the two running
        // workers, whose groups do not name it, are its owners.
        let all = plan_workers(&plan, &["a".to_owned(), "b".to_owned(), "c".to_owned()]);
        let joining = WorkerDefaults { peers_running: crate::peers::running_groups(&running), ..defaults };
        let joiner = build_job(&ds, &plan, &all[2], &all, 1, &joining);
        let StagerCommand::Pull { options, .. } = parsed(&pod(&joiner)).command else { panic!("a pull") };
        assert_eq!(
            (options.peers.peer_group, options.peers.peer_owners),
            (vec!["a".into(), "b".into(), "c".into()], vec!["a".into(), "b".into()])
        );
        // Its Job records the members it divides with, not its group: a
        // member created after it must not count it among the owners.
        assert_eq!(crate::peers::running_groups(&[joiner]), [["a", "b"]]);
    }

    #[test]
    fn a_direct_worker_has_no_peers_port_address_or_secret() {
        let mut ds = pull_to_host_path();
        ds.spec.fanout = Some(Fanout::Direct);
        ds.spec.transfer.as_mut().unwrap().peer_serve_bandwidth = Some("500Mi".parse().unwrap());
        let plan = ds.spec.plan().unwrap();
        let workers = plan_workers(&plan, &["a".to_owned(), "b".to_owned()]);
        let pod = pod(&build_job(&ds, &plan, &workers[0], &workers, 1, &WorkerDefaults::image("stager:1")));
        let container = &pod.containers[0];
        let args = container.args.clone().unwrap();
        assert!(args.iter().all(|a| !a.starts_with("--peer-group") && !a.contains("$(")), "{args:?}");
        let StagerCommand::Pull { options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(options.peers, ferry_contract::PeerOptions::default());
        let env = container.env.clone().unwrap();
        assert!(env.iter().all(|e| e.name != "POD_IP" && e.name != ferry_contract::peers::PEER_TOKEN_ENV));
        assert_eq!(container.ports, None);
        assert!(pod.volumes.iter().flatten().all(|v| v.secret.is_none()), "no peer certificates");
    }

    #[test]
    fn several_workers_per_node_are_an_indexed_job_per_node_each_pod_a_shard() {
        let mut ds = pull_to_host_path();
        ds.spec.workers = Some(3);
        let plan = ds.spec.plan().unwrap();
        let job = build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1"));
        let spec = job.spec.clone().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((spec.completions, spec.parallelism), (Some(3), Some(3)));
        let StagerCommand::Pull { options, .. } = parsed(&pod(&job)).command else { panic!("a pull") };
        assert_eq!((options.shards, options.shard), (Some(3), None), "the index comes from the Indexed Job");
        let args = pod(&job).containers[0].args.clone().unwrap();
        assert!(args.iter().all(|a| !a.contains("$(")), "no variable expansion is relied on: {args:?}");
    }

    #[test]
    fn workers_start_with_their_store_budget_share_on_the_command_line() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let share = ferry_contract::StoreShare { requests_per_second: Some(12), bytes_per_second: Some(4096) };
        let defaults = WorkerDefaults { store_share: Some(share), ..WorkerDefaults::image("stager:1") };
        let share_of = |defaults: &WorkerDefaults| {
            let job = build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, defaults);
            let StagerCommand::Pull { options, .. } = parsed(&pod(&job)).command else { panic!("a pull") };
            options.store_share
        };
        assert_eq!(share_of(&defaults), Some(share));
        assert_eq!(share_of(&WorkerDefaults::image("stager:1")), None);
    }

    #[test]
    fn a_pulls_workers_get_the_room_their_quota_leaves_them_and_others_none() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let rooms = BTreeMap::from([("a".to_owned(), 3 << 20), ("b".to_owned(), (1 << 50) + 1)]);
        let defaults = WorkerDefaults { dataset_quotas: rooms, ..WorkerDefaults::image("stager:1") };
        let quota_of = |node: &str| {
            let job = build_job(&ds, &plan, &Worker::on_node(node), &[], 1, &defaults);
            let StagerCommand::Pull { options, .. } = parsed(&pod(&job)).command else { panic!("a pull") };
            options.dataset_quota.map(|size| size.bytes())
        };
        assert_eq!(quota_of("a"), Some(3 << 20));
        assert_eq!(quota_of("b"), Some(1 << 50), "16 digits: rounded down to whole KiB");
        assert_eq!(quota_of("c"), None, "no quota names it");
    }

    #[test]
    fn a_pulls_workers_are_told_what_others_on_their_node_still_write() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let mut claims = ferry_contract::CapacityClaims::default();
        claims.add("259:1", 5 << 20);
        let defaults = WorkerDefaults {
            capacity_claims: BTreeMap::from([("a".to_owned(), claims.clone()), ("b".to_owned(), Default::default())]),
            ..WorkerDefaults::image("stager:1")
        };
        let claims_of = |node: &str| {
            let job = build_job(&ds, &plan, &Worker::on_node(node), &[], 1, &defaults);
            let args = pod(&job).containers[0].args.clone().unwrap_or_default();
            let StagerCommand::Pull { options, .. } = parsed(&pod(&job)).command else { panic!("a pull") };
            (options.capacity_claimed, args.iter().any(|arg| arg.starts_with("--capacity-claimed")))
        };
        assert_eq!(claims_of("a"), (Some(claims), true));
        assert_eq!(claims_of("b"), (None, false), "nothing claimed, no flag");
        assert_eq!(claims_of("c"), (None, false));
    }

    #[test]
    fn workers_get_the_operators_service_account_and_metrics_port_unless_the_spec_names_its_own() {
        let defaults = WorkerDefaults {
            service_account: Some("ferry-stager".into()),
            metrics_port: Some(9464),
            ..WorkerDefaults::image("stager:1")
        };
        let worker = Worker::on_node("a");
        let mut ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &worker, &[], 1, &defaults));
        assert_eq!(pod.service_account_name.as_deref(), Some("ferry-stager"));
        let port = &pod.containers[0].ports.as_ref().unwrap()[0];
        assert_eq!((port.name.as_deref(), port.container_port), (Some(METRICS_PORT_NAME), 9464));
        let StagerCommand::Pull { options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(options.metrics_addr, Some(([0, 0, 0, 0], 9464).into()));

        let clean = build_cleanup_job(&ds, &plan, &worker, &defaults);
        assert!(
            super::tests::pod(&clean).containers[0].ports.is_none(),
            "clean-up Jobs move no data: nothing to scrape"
        );

        // A node-local DataStage's workers run as Ferry's own account in
        // Ferry's namespace, whatever account it names; a claim's run in
        // its namespace as the account it names.
        ds.spec.service_account_name = Some("trainer".into());
        let plan = ds.spec.plan().unwrap();
        let node_local = super::tests::pod(&build_job(&ds, &plan, &worker, &[], 1, &defaults));
        assert_eq!(node_local.service_account_name.as_deref(), Some("ferry-stager"));
        ds.spec.destination.volume =
            Some(serde_json::from_value(json!({"persistentVolumeClaim": {"claimName": "c"}})).unwrap());
        let plan = ds.spec.plan().unwrap();
        let trainer = super::tests::pod(&build_job(&ds, &plan, &Worker::shared(), &[], 1, &defaults));
        assert_eq!(trainer.service_account_name.as_deref(), Some("trainer"));
    }

    #[test]
    fn a_refused_run_fails_the_job_at_once_and_an_eviction_is_not_counted() {
        let ds = pull_to_host_path();
        let job =
            build_job(&ds, &ds.spec.plan().unwrap(), &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("s:1"));
        let rules = job.spec.unwrap().pod_failure_policy.unwrap().rules;
        assert_eq!(rules[0].action, "FailJob");
        let codes = rules[0].on_exit_codes.as_ref().unwrap();
        assert_eq!((codes.container_name.as_deref(), codes.values.as_slice()), (Some(STAGER_CONTAINER), &[2, 4][..]));
        // A prepare step without its capabilities cannot succeed on a retry.
        let codes = rules[1].on_exit_codes.as_ref().unwrap();
        assert_eq!(rules[1].action, "FailJob");
        assert_eq!((codes.container_name.as_deref(), codes.values.as_slice()), (Some(PREPARE_CONTAINER), &[2, 4][..]));
        assert_eq!(rules[2].action, "Ignore");
    }

    #[test]
    fn a_cleanup_job_runs_clean_on_the_same_volume_and_node_without_credentials() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let worker =
            Worker { name: "node-with-a-rather-long-name-that-goes-on-and-on-and-on".into(), node: Some("n".into()) };
        let job = build_cleanup_job(&ds, &plan, &worker, &anchored("stager:1"));
        let name = job.metadata.name.clone().unwrap();
        assert!(name.ends_with("-clean") && name.len() <= 63, "{name}");
        // Its anchor goes only once the DataStage is gone, clean-ups done.
        assert_eq!(
            job.metadata.owner_references.as_ref().unwrap()[0],
            anchor(),
            "not collected while the DataStage goes away"
        );
        assert_eq!(job.metadata.labels.as_ref().unwrap()[names::CLEANUP], worker.name);
        let claim = datastage(json!({"source": {"uri": "s3://datasets/imagenet"},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}}}));
        let claim_job = build_cleanup_job(&claim, &claim.spec.plan().unwrap(), &Worker::shared(), &anchored("s:1"));
        assert!(
            claim_job.metadata.owner_references.is_none(),
            "in the DataStage's namespace: not collected while it goes"
        );
        let pod = pod(&job);
        assert!(matches!(parsed(&pod).command, StagerCommand::Clean { .. }));
        assert!(pod.containers[0].env.clone().unwrap_or_default().is_empty(), "no store, no credentials");
        assert_eq!(pod.volumes.unwrap()[0].host_path.as_ref().unwrap().path, "/mnt/ferry/imagenet");
    }

    #[test]
    fn a_pull_below_a_shared_host_path_mounts_it_whole_and_shares_its_objects_there() {
        let defaults = WorkerDefaults {
            shared_host_paths: vec!["/mnt".into(), "/mnt/ferry/".into()],
            ..WorkerDefaults::image("stager:1")
        };
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let worker = Worker::on_node("a");
        let pull = pod(&build_job(&ds, &plan, &worker, &[], 1, &defaults));
        // The longest shared path that holds the directory is mounted.
        let volume = &pull.volumes.clone().unwrap()[0];
        assert_eq!(volume.host_path.as_ref().unwrap().path, "/mnt/ferry");
        assert_eq!(pull.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path, SHARED_MOUNT);
        let StagerCommand::Pull { destination, options, .. } = parsed(&pull).command else { panic!("a pull") };
        assert_eq!(destination.to_str(), Some("/ferry/node/imagenet"));
        assert_eq!(options.shared_objects.as_deref(), Some(std::path::Path::new("/ferry/node/.ferry-shared")));
        let (prepare, _) = prepare_step(&pull);
        assert_eq!(
            prepare.command,
            StagerCommand::Prepare {
                directory: "/ferry/node/imagenet".into(),
                purpose: Purpose::Pull,
                owner: WORKER_USER,
                shared_objects: Some("/ferry/node/.ferry-shared".into()),
            }
        );
        // Its clean-up removes the objects no directory links any more.
        let clean = pod(&build_cleanup_job(&ds, &plan, &worker, &defaults));
        assert_eq!(clean.volumes.clone().unwrap()[0].host_path.as_ref().unwrap().path, "/mnt/ferry");
        assert_eq!(
            parsed(&clean).command,
            StagerCommand::Clean {
                directory: "/ferry/node/imagenet".into(),
                shared_objects: Some("/ferry/node/.ferry-shared".into())
            }
        );

        // Nothing else shares: a push, the shared path itself, a directory
        // inside the shared objects, a path outside, a claim.
        let unshared = [
            json!({"source": {"volume": {"hostPath": "/mnt/ferry/ckpt"}}, "destination": {"uri": "s3://c/run"}}),
            json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"hostPath": "/mnt/ferry"}}}),
            json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"hostPath": "/mnt/ferry/.ferry-shared/x"}}}),
            json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"hostPath": "/data/x"}}}),
            json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}}}),
        ];
        for spec in unshared {
            let ds = datastage(spec.clone());
            let plan = ds.spec.plan().unwrap();
            let layout = data_layout(&ds, &plan, &defaults);
            assert_eq!((layout.data.as_str(), layout.shared_objects), (DATA_MOUNT, None), "{spec}");
        }
        let layout = data_layout(&ds, &plan, &WorkerDefaults::image("s:1"));
        assert_eq!(layout.shared_objects, None, "no shared paths, no sharing");
    }

    #[test]
    fn a_node_cache_lays_a_datastage_out_by_namespace_and_name_and_shares_as_it_says() {
        let pull = datastage(json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        let plan = pull.spec.plan().unwrap();
        let with = |sharing: Option<Sharing>| WorkerDefaults {
            node_cache: Some(NodeCacheSpec {
                root: "/var/lib/ferry/nvme/".into(),
                sharing,
                ..NodeCacheSpec::default()
            }),
            ..WorkerDefaults::image("s:1")
        };
        let within = data_layout(&pull, &plan, &with(None));
        assert_eq!(
            within.node_mount,
            Some(("/var/lib/ferry/nvme/ml".into(), SHARED_MOUNT.into())),
            "its namespace only"
        );
        assert_eq!(within.node_data.as_deref(), Some("/var/lib/ferry/nvme/ml/imagenet"));
        assert_eq!(
            (within.data.as_str(), within.shared_objects.as_deref()),
            ("/ferry/node/imagenet", Some("/ferry/node/.ferry-shared"))
        );
        let across = data_layout(&pull, &plan, &with(Some(Sharing::Cluster)));
        assert_eq!(across.node_mount, Some(("/var/lib/ferry/nvme".into(), SHARED_MOUNT.into())));
        assert_eq!(
            (across.data.as_str(), across.node_data.as_deref()),
            ("/ferry/node/ml/imagenet", Some("/var/lib/ferry/nvme/ml/imagenet"))
        );
        let alone = data_layout(&pull, &plan, &with(Some(Sharing::None)));
        assert_eq!(
            alone.node_mount,
            Some(("/var/lib/ferry/nvme/ml/imagenet".into(), DATA_MOUNT.into())),
            "its own directory"
        );
        assert_eq!(alone.shared_objects, None);
        let push =
            datastage(json!({"source": {"volume": {"nodeCache": "nvme"}}, "destination": {"uri": "s3://c/run"}}));
        let pushed = data_layout(&push, &push.spec.plan().unwrap(), &with(None));
        assert_eq!(
            (pushed.node_data.as_deref(), pushed.shared_objects),
            (Some("/var/lib/ferry/nvme/ml/imagenet"), None)
        );

        // The worker mounts what the layout says, with the root step readying it.
        let job = build_job(&pull, &plan, &Worker::on_node("a"), &[], 1, &with(None));
        let pod = pod(&job);
        assert_eq!(pod.volumes.as_ref().unwrap()[0].host_path.as_ref().unwrap().path, "/var/lib/ferry/nvme/ml");
        assert_eq!(pod.init_containers.as_ref().map(Vec::len), Some(1));
    }

    /// A pull onto a NodeCache named `name`, and the home of its workers.
    fn home_of(name: &str) -> Home {
        let mut ds =
            datastage(json!({"source": {"uri": "s3://d/x"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        ds.metadata.name = Some(name.to_owned());
        WorkerDefaults::image("s:1").home(&ds, &ds.spec.plan().unwrap())
    }

    #[test]
    fn long_names_stay_valid_and_distinct() {
        let home = home_of(&"a".repeat(63));
        let one = job_name(&home, &Worker::on_node("node-1"), 12, 1);
        let two = job_name(&home, &Worker::on_node("node-2"), 12, 1);
        assert!(one.len() <= 63 && two.len() <= 63 && one.ends_with("-r12"), "{one}");
        assert_ne!(one, two);
    }

    /// The API server refuses an Indexed Job whose name and largest index
    /// (`<job>-<index>`, its last pod's hostname) are not a DNS label.
    #[test]
    fn an_indexed_jobs_name_leaves_room_for_its_largest_pod_index() {
        let home = home_of(&"n".repeat(63));
        for pods in [1u32, 2, 10, 11, 100, 101, 1000] {
            let name = job_name(&home, &Worker::on_node("node-1"), 1, pods);
            let hostname = if pods > 1 { format!("{name}-{}", pods - 1) } else { name.clone() };
            assert!(hostname.len() <= 63, "{pods} pods: {hostname} ({} characters)", hostname.len());
            assert!(name.ends_with("-r1"), "{name}");
        }
        // A short name is left as it is.
        let short = home_of("ml");
        assert_eq!(job_name(&short, &Worker::shared(), 3, 8), short.name("shared", "-r3"));
    }

    #[test]
    fn the_root_step_runs_the_operators_image_whatever_spec_image_says_and_only_an_allowed_image_transfers() {
        let mut ds = pull_to_host_path();
        ds.spec.image = Some("evil.example/root-shell:1".into());
        let plan = ds.spec.plan().unwrap();
        let refused = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("ferry:1")));
        assert_eq!(
            refused.containers[0].image.as_deref(),
            Some("ferry:1"),
            "an image the admin did not allow never runs"
        );
        assert_eq!(refused.init_containers.as_ref().unwrap()[0].image.as_deref(), Some("ferry:1"));
        let allowing =
            WorkerDefaults { allowed_images: vec!["evil.example/*".into()], ..WorkerDefaults::image("ferry:1") };
        let allowed = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &allowing));
        assert_eq!(
            allowed.containers[0].image.as_deref(),
            Some("evil.example/root-shell:1"),
            "the transfer, unprivileged"
        );
        let prepare = &allowed.init_containers.as_ref().unwrap()[0];
        assert_eq!(prepare.image.as_deref(), Some("ferry:1"), "the step that runs as root is always the operator's");
        assert!(prepare.command.is_none() && prepare.args.as_ref().is_some_and(|a| a.iter().any(|a| a == "prepare")));
    }

    /// The prepare init container's command line, parsed as the stager would.
    fn prepare_step(pod: &PodSpec) -> (StagerCli, SecurityContext) {
        let init = pod.init_containers.as_ref().expect("a hostPath worker has an init container");
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].name, PREPARE_CONTAINER);
        assert_eq!(init[0].image, pod.containers[0].image, "the stager image does it");
        assert_eq!(init[0].volume_mounts, pod.containers[0].volume_mounts.as_ref().map(|m| vec![m[0].clone()]));
        let args = init[0].args.clone().unwrap();
        let cli = StagerCli::try_parse_from(std::iter::once("ferry-stager".to_owned()).chain(args)).unwrap();
        (cli, init[0].security_context.clone().unwrap())
    }

    #[test]
    fn a_host_path_is_handed_to_the_worker_by_a_root_step_with_three_capabilities() {
        let ds = pull_to_host_path();
        let plan = ds.spec.plan().unwrap();
        let pull_pod = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let (cli, context) = prepare_step(&pull_pod);
        assert_eq!(
            cli.command,
            StagerCommand::Prepare {
                directory: DATA_MOUNT.into(),
                purpose: Purpose::Pull,
                owner: WORKER_USER,
                shared_objects: None
            }
        );
        assert_eq!((context.run_as_user, context.run_as_non_root), (Some(0), Some(false)));
        assert_eq!(context.allow_privilege_escalation, Some(false));
        assert_eq!(context.read_only_root_filesystem, Some(true));
        let capabilities = context.capabilities.unwrap();
        assert_eq!(
            (capabilities.drop.unwrap(), capabilities.add.unwrap()),
            (vec!["ALL".to_owned()], vec!["CHOWN".to_owned(), "DAC_OVERRIDE".to_owned(), "FOWNER".to_owned()])
        );
        assert_eq!(context.privileged, None);
        // The worker itself stays the unprivileged user the step handed the directory to.
        let pod_context = pull_pod.security_context.clone().unwrap();
        assert_eq!(
            (pod_context.run_as_user, pod_context.run_as_group),
            (Some(i64::from(WORKER_USER.uid)), Some(i64::from(WORKER_USER.gid)))
        );
        assert_eq!(pull_pod.containers[0].security_context.clone().unwrap().run_as_user, None);

        let push = datastage(json!({
            "source": {"volume": {"hostPath": "/mnt/ckpt"}},
            "destination": {"uri": "s3://checkpoints/run-1"},
        }));
        let plan = push.spec.plan().unwrap();
        let push_pod = pod(&build_job(&push, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let StagerCommand::Prepare { purpose, .. } = prepare_step(&push_pod).0.command else { panic!("prepare") };
        assert_eq!(purpose, Purpose::Push, "a push's files keep their owners");
    }

    #[test]
    fn a_claim_gets_one_indexed_job_sharded_by_completion_index() {
        let ds = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet"},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "shared", "subPath": "imagenet"}}},
            "workers": 3,
            "placement": {"nodeSelector": {"pool": "storage"}},
        }));
        let plan = ds.spec.plan().unwrap();
        let workers = plan_workers(&plan, &[]);
        assert_eq!(workers, [Worker::shared()]);
        let job = build_job(&ds, &plan, &workers[0], &workers, 1, &WorkerDefaults::image("stager:1"));
        let spec = job.spec.clone().unwrap();
        assert_eq!(spec.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((spec.completions, spec.parallelism), (Some(3), Some(3)));
        let pod = pod(&job);
        assert_eq!(pod.node_selector.clone().unwrap()["pool"], "storage");
        assert_eq!(pod.containers[0].volume_mounts.clone().unwrap()[0].sub_path.as_deref(), Some("imagenet"));
        assert_eq!(pod.init_containers, None, "the kubelet applies fsGroup to a claim: no root step");
        let rules = spec.pod_failure_policy.clone().unwrap().rules;
        let named: Vec<_> = rules.iter().filter_map(|r| r.on_exit_codes.as_ref()?.container_name.clone()).collect();
        assert_eq!(named, [STAGER_CONTAINER], "the API server refuses a rule for a container the pod lacks");
        let StagerCommand::Pull { options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(options.shards, Some(3));
        let env = pod.containers[0].env.clone().unwrap_or_default();
        assert!(env.iter().all(|e| e.name != "AWS_ACCESS_KEY_ID"), "no Secret: the pod's identity is used");
    }

    #[test]
    fn a_web_identity_projects_a_token_with_its_audience_and_tells_the_stager_what_to_exchange_it_for() {
        let claim = json!({"persistentVolumeClaim": {"claimName": "c"}});
        let ds = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "endpoint": "https://minio.storage:9000",
                       "credentials": {"webIdentity": {"roleArn": "arn:minio:iam:::role/datasets",
                                                       "audience": "minio", "expirationSeconds": 900}}},
            "destination": {"volume": claim},
        }));
        let plan = ds.spec.plan().unwrap();
        let worker = pod(&build_job(&ds, &plan, &Worker::shared(), &[], 1, &WorkerDefaults::image("stager:1")));
        let env = worker.containers[0].env.clone().unwrap();
        assert!(env.iter().all(|e| !e.name.starts_with("AWS_")), "no keys, and the flags say the rest: {env:?}");
        let volume = worker.volumes.clone().unwrap().into_iter().find(|v| v.name == "web-identity").unwrap();
        let token = volume.projected.unwrap().sources.unwrap()[0].service_account_token.clone().unwrap();
        assert_eq!(
            (token.audience.as_deref(), token.expiration_seconds, token.path.as_str()),
            (Some("minio"), Some(900), WEB_IDENTITY_TOKEN_FILE)
        );
        let mounts = worker.containers[0].volume_mounts.clone().unwrap();
        let mount = mounts.iter().find(|m| m.name == "web-identity").unwrap();
        assert_eq!((mount.mount_path.as_str(), mount.read_only), (WEB_IDENTITY_MOUNT, Some(true)));
        let StagerCommand::Pull { options, .. } = parsed(&worker).command else { panic!("a pull") };
        assert_eq!(
            options.web_identity,
            WebIdentityOptions {
                web_identity_token_file: Some(format!("{WEB_IDENTITY_MOUNT}/{WEB_IDENTITY_TOKEN_FILE}").into()),
                role_arn: Some("arn:minio:iam:::role/datasets".into()),
                sts_endpoint: Some("https://minio.storage:9000".into()),
                role_session_name: None,
            },
            "the store's endpoint is its STS unless the spec names another"
        );

        let aws = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "region": "eu-west-1",
                       "credentials": {"webIdentity": {"roleArn": "arn:aws:iam::123456789012:role/datasets"}}},
            "destination": {"volume": claim},
        }));
        let plan = aws.spec.plan().unwrap();
        let worker = pod(&build_job(&aws, &plan, &Worker::shared(), &[], 1, &WorkerDefaults::image("stager:1")));
        let volume = worker.volumes.clone().unwrap().into_iter().find(|v| v.name == "web-identity").unwrap();
        let token = volume.projected.unwrap().sources.unwrap()[0].service_account_token.clone().unwrap();
        assert_eq!(
            (token.audience.as_deref(), token.expiration_seconds),
            (Some(WebIdentityCredentials::DEFAULT_AUDIENCE), Some(WebIdentityCredentials::DEFAULT_EXPIRATION_SECONDS))
        );
        let StagerCommand::Pull { options, .. } = parsed(&worker).command else { panic!("a pull") };
        assert_eq!(options.web_identity.sts_endpoint, None, "AWS STS in the region");

        // Workers in Ferry's namespace never project a token of their own
        // account: they read the one the operator requested for the
        // DataStage's account, from a Secret beside them.
        let mut node_local = ds.clone();
        node_local.spec.destination.volume = Some(serde_json::from_value(json!({"nodeCache": "nvme"})).unwrap());
        let plan = node_local.spec.plan().unwrap();
        let worker = pod(&build_job(&node_local, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("s:1")));
        let volume = worker.volumes.clone().unwrap().into_iter().find(|v| v.name == "web-identity").unwrap();
        assert!(volume.projected.is_none());
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name, Some(held(&node_local, crate::delivery::WEB_IDENTITY)));
        let StagerCommand::Pull { options, .. } = parsed(&worker).command else { panic!("a pull") };
        assert_eq!(
            options.web_identity.web_identity_token_file,
            Some(format!("{WEB_IDENTITY_MOUNT}/{WEB_IDENTITY_TOKEN_FILE}").into())
        );
    }

    #[test]
    fn a_private_ca_is_mounted_read_only_and_named_by_ssl_cert_file_only_when_asked() {
        let ds = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "endpoint": "https://minio.storage:9000",
                       "credentials": {"name": "s3"}, "caBundle": {"name": "storage-ca", "key": "root.pem"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
        }));
        let plan = ds.spec.plan().unwrap();
        let worker = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let env = worker.containers[0].env.clone().unwrap();
        let ssl_cert_file = env.iter().find(|e| e.name == "SSL_CERT_FILE").unwrap().value.clone().unwrap();
        let volume = worker.volumes.clone().unwrap().into_iter().find(|v| v.name == "ca-bundle").unwrap();
        let config_map = volume.config_map.unwrap();
        assert_eq!(config_map.name, held(&ds, crate::delivery::CA_BUNDLE), "the operator's copy beside the workers");
        let item = &config_map.items.unwrap()[0];
        assert_eq!(
            (item.key.as_str(), format!("{CA_BUNDLE_MOUNT}/{}", item.path)),
            (crate::delivery::CA_FILE, ssl_cert_file),
            "SSL_CERT_FILE names the key's file in the mount"
        );
        let mounts = worker.containers[0].volume_mounts.clone().unwrap();
        let mount = mounts.iter().find(|m| m.name == "ca-bundle").unwrap();
        assert_eq!((mount.mount_path.as_str(), mount.read_only), (CA_BUNDLE_MOUNT, Some(true)));
        let prepare = &worker.init_containers.as_ref().unwrap()[0];
        assert!(prepare.env.is_none(), "the root step talks to no store");

        let default_key = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "caBundle": {"name": "storage-ca"}},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}},
        }));
        let plan = default_key.spec.plan().unwrap();
        let worker = pod(&build_job(&default_key, &plan, &Worker::shared(), &[], 1, &WorkerDefaults::image("s:1")));
        let volume = worker.volumes.unwrap().into_iter().find(|v| v.name == "ca-bundle").unwrap();
        let config_map = volume.config_map.unwrap();
        assert_eq!(
            (config_map.name.as_str(), config_map.items.unwrap()[0].key.as_str()),
            ("storage-ca", "ca.crt"),
            "a claim's workers read it themselves"
        );

        let plain = pull_to_host_path();
        let plan = plain.spec.plan().unwrap();
        let worker = pod(&build_job(&plain, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("s:1")));
        assert!(worker.containers[0].env.clone().unwrap().iter().all(|e| e.name != "SSL_CERT_FILE"));
        assert!(worker.volumes.unwrap().iter().all(|v| v.name != "ca-bundle"));
    }

    #[test]
    fn a_gcs_source_gets_its_key_file_mounted_or_goes_anonymous() {
        let ds = datastage(json!({
            "source": {"uri": "gs://datasets/imagenet", "credentials": {"name": "gcs"}},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}},
        }));
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &Worker::shared(), &[], 1, &WorkerDefaults::image("stager:1")));
        let env = pod.containers[0].env.clone().unwrap();
        let adc = env.iter().find(|e| e.name == "GOOGLE_APPLICATION_CREDENTIALS").unwrap();
        assert_eq!(adc.value.as_deref(), Some("/var/run/secrets/ferry/gcs/key.json"));
        assert!(env.iter().all(|e| !e.name.starts_with("AWS_")));
        assert_eq!(pod.volumes.clone().unwrap()[1].secret.as_ref().unwrap().secret_name.as_deref(), Some("gcs"));
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        assert_eq!((mounts[1].mount_path.as_str(), mounts[1].read_only), (GCS_KEY_MOUNT, Some(true)));

        let emulator = datastage(json!({
            "source": {"uri": "gs://datasets/imagenet", "endpoint": "http://gcs:4443", "anonymous": true},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
        }));
        let options = transfer_options(&emulator.spec, &emulator.spec.plan().unwrap());
        assert_eq!(options.endpoint_url.as_deref(), Some("http://gcs:4443"));
        assert!(options.anonymous);
    }

    #[test]
    fn an_azure_source_reads_its_account_and_key_or_token_from_the_secret() {
        let ds = datastage(json!({
            "source": {"uri": "az://models/llama", "endpoint": "http://azurite:10000/devstoreaccount1", "credentials": {"name": "azure"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/llama"}},
        }));
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let from_secret: Vec<(String, String, Option<bool>)> = pod.containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .filter(|e| e.name.starts_with("AZURE_"))
            .filter_map(|e| {
                let selector = e.value_from?.secret_key_ref?;
                Some((e.name, format!("{}/{}", selector.name, selector.key), selector.optional))
            })
            .collect();
        let expected = [
            (AZURE_STORAGE_ACCOUNT_ENV, false),
            (AZURE_STORAGE_KEY_ENV, true),
            (AZURE_STORAGE_SAS_TOKEN_ENV, true),
            (AZURE_TENANT_ID_ENV, true),
            (AZURE_CLIENT_ID_ENV, true),
            (AZURE_CLIENT_SECRET_ENV, true),
        ]
        .map(|(key, optional)| {
            (key.to_owned(), format!("{}/{key}", held(&ds, crate::delivery::CREDENTIALS)), Some(optional))
        });
        assert_eq!(from_secret, expected, "from the operator's copy beside the workers");
        let peer_tls = crate::peers::tls_volume("peers").0.name;
        let volumes: Vec<_> = pod.volumes.iter().flatten().filter(|v| v.name != peer_tls).collect();
        assert_eq!(volumes.len(), 1, "no key file: only the data volume (besides the peer certificates)");
        let StagerCommand::Pull { source, options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(source.scheme, Scheme::Azure);
        assert_eq!(options.endpoint_url.as_deref(), Some("http://azurite.ml:10000/devstoreaccount1"));
    }

    #[test]
    fn an_azure_source_without_a_secret_asks_for_the_pods_workload_identity_in_its_own_namespace_only() {
        let claim = json!({"persistentVolumeClaim": {"claimName": "c"}});
        let job_on = |source: serde_json::Value, volume: &serde_json::Value| {
            let ds = datastage(json!({"source": source, "destination": {"volume": volume}}));
            let plan = ds.spec.plan().unwrap();
            let worker = plan_workers(&plan, &["a".to_owned()]).remove(0);
            build_job(&ds, &plan, &worker, &[], 1, &WorkerDefaults::image("s:1"))
        };
        let job_for = |source: serde_json::Value| job_on(source, &claim);
        let label = |job: &Job| {
            let template = job.spec.as_ref().unwrap().template.metadata.as_ref().unwrap();
            template.labels.as_ref().unwrap().get(names::AZURE_WORKLOAD_IDENTITY).cloned()
        };
        let keyless = job_for(json!({"uri": "az://models/llama"}));
        assert_eq!(label(&keyless).as_deref(), Some("true"), "the webhook acts on pods with the label");
        assert!(
            !keyless.metadata.labels.as_ref().unwrap().contains_key(names::AZURE_WORKLOAD_IDENTITY),
            "only the pod template carries it"
        );
        // Workers in the workers' namespace would get Ferry's identity, not the tenant's.
        let node_local = job_on(json!({"uri": "az://models/llama"}), &json!({"nodeCache": "nvme"}));
        assert_eq!(label(&node_local), None);
        assert_eq!(label(&job_for(json!({"uri": "az://models/llama", "credentials": {"name": "azure"}}))), None);
        assert_eq!(label(&job_for(json!({"uri": "az://models/llama", "anonymous": true}))), None);
        assert_eq!(label(&job_for(json!({"uri": "s3://models/llama"}))), None);
    }

    #[test]
    fn an_oci_source_mounts_its_docker_config_secret() {
        let ds = datastage(json!({
            "source": {"uri": "oci://registry.example/models/llama:v1", "credentials": {"name": "pull-secret"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/llama"}},
        }));
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let env = pod.containers[0].env.clone().unwrap();
        let config = env.iter().find(|e| e.name == DOCKER_CONFIG_ENV).unwrap();
        assert_eq!(config.value.as_deref(), Some(REGISTRY_CONFIG_MOUNT));
        let volume = pod.volumes.clone().unwrap().into_iter().find(|v| v.name == "registry-config").unwrap();
        let secret = volume.secret.unwrap();
        assert_eq!(secret.secret_name, Some(held(&ds, crate::delivery::CREDENTIALS)), "the operator's copy");
        let item = &secret.items.unwrap()[0];
        assert_eq!((item.key.as_str(), item.path.as_str()), (".dockerconfigjson", "config.json"));
        let StagerCommand::Pull { source, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(source.to_string(), "oci://registry.example/models/llama:v1");
    }

    #[test]
    fn a_hub_source_reads_its_token_from_the_secret_copy_and_keeps_its_revision() {
        let ds = datastage(json!({
            "source": {"uri": "hf://datasets/acme/corpus@v2/train", "credentials": {"name": "hf"}, "endpoint": "http://hub-mirror:8090"},
            "destination": {"volume": {"hostPath": "/mnt/ferry/corpus"}},
        }));
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let env = pod.containers[0].env.clone().unwrap();
        let token = env.iter().find(|e| e.name == HF_TOKEN_ENV).expect("HF_TOKEN");
        let from = token.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
        assert_eq!(
            (from.name.as_str(), from.key.as_str()),
            (held(&ds, crate::delivery::CREDENTIALS).as_str(), HF_TOKEN_ENV)
        );
        assert_eq!(crate::delivery::credential_keys(Scheme::Hf), [HF_TOKEN_ENV], "the copy holds the token only");
        let StagerCommand::Pull { source, options, .. } = parsed(&pod).command else { panic!("a pull") };
        assert_eq!(source.to_string(), "hf://datasets/acme/corpus@v2/train/");
        // A short host is the DataStage namespace's service, wherever the workers run.
        assert_eq!(options.endpoint_url.as_deref(), Some("http://hub-mirror.ml:8090"));
    }

    #[test]
    fn a_push_reads_the_volume_and_writes_the_bucket_and_removes_nothing() {
        let ds = datastage(json!({
            "source": {"volume": {"hostPath": "/mnt/ckpt"}},
            "destination": {"uri": "s3://checkpoints/run-1"},
        }));
        let plan = ds.spec.plan().unwrap();
        let pod = pod(&build_job(&ds, &plan, &Worker::on_node("a"), &[], 1, &WorkerDefaults::image("stager:1")));
        let StagerCommand::Push { source, destination, require_files, options } = parsed(&pod).command else {
            panic!("a push")
        };
        assert!(require_files, "a push from a volume that may have been created empty must push something");
        assert_eq!((source, destination.to_string()), (DATA_MOUNT.into(), "s3://checkpoints/run-1/".to_owned()));
        assert!(!options.delete_removed);
    }
}
