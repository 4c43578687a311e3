//! Ferry's end-to-end harness: a real Kubernetes control plane
//! ([`control_plane`]) plus node agents that run pods as local processes
//! ([`agent`]), brought up together by [`Cluster::start`] for Rust tests and
//! by the `ferry-cluster` binary for a shell. See `tests/e2e/README.md`.

pub mod agent;
pub mod chart;
pub mod control_plane;
pub mod process;
pub mod real_node;
pub mod tools;

pub use agent::network::pod_network_routed;
pub use process::workspace_binary;

use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::images::ImageMap;
use agent::{AgentContext, NodeAgent};
use control_plane::{ControlPlane, ControlPlaneError};

/// The nodes every cluster has, with the label `ferry.dev/e2e-node=<name>`.
pub const NODES: [&str; 2] = ["node-a", "node-b"];

/// The namespace the operator started by [`start_operator`] runs the
/// workers of node-local DataStages in ([`install_crd`] creates it).
pub const WORKERS_NS: &str = "ferry-workers";

/// The cluster a test runs against: by default a local control plane with
/// node agents; with `FERRY_E2E_KUBECONFIG` set, an existing cluster (kind, a
/// cloud cluster) whose nodes carry the `ferry.dev/e2e-node` labels. Stop it
/// with [`Cluster::stop`]; dropping it also stops every local process.
#[derive(Debug)]
pub struct Cluster {
    local: Option<LocalCluster>,
    kubeconfig: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

#[derive(Debug)]
struct LocalCluster {
    // Fields drop in this order: real nodes (their kubelets, then what they
    // ran) before the control plane they report to.
    real_nodes: Vec<real_node::RealNode>,
    forwards: Vec<real_node::Forward>,
    control_plane: ControlPlane,
    agents: Vec<NodeAgent>,
    nodes_root: PathBuf,
}

impl Cluster {
    /// Starts a local cluster in a fresh temporary directory, or connects to
    /// the cluster named by `FERRY_E2E_KUBECONFIG`.
    ///
    /// # Errors
    /// Fails when a component does not come up; the error carries its log tail.
    pub async fn start() -> Result<Self, ControlPlaneError> {
        if let Some(kubeconfig) = std::env::var_os("FERRY_E2E_KUBECONFIG") {
            return Ok(Self { local: None, kubeconfig: PathBuf::from(kubeconfig), _dir: None });
        }
        let dir = temporary_dir("ferry-e2e-")?;
        let cluster = Self::start_in(dir.path()).await?;
        Ok(cluster.owning(dir))
    }

    /// Removes `dir` when the cluster goes, unless FERRY_E2E_KEEP_CLUSTER_DIR
    /// asks to keep the logs of every component and pod for a post-mortem.
    fn owning(mut self, dir: tempfile::TempDir) -> Self {
        if std::env::var_os("FERRY_E2E_KEEP_CLUSTER_DIR").is_some() {
            eprintln!("keeping the cluster directory {}", dir.keep().display());
        } else {
            self._dir = Some(dir);
        }
        self
    }

    /// Starts a local cluster whose state lives in `dir` (kept after stop).
    ///
    /// # Errors
    /// Fails when a component does not come up.
    pub async fn start_in(dir: &Path) -> Result<Self, ControlPlaneError> {
        let control_plane = ControlPlane::start(&dir.join("control-plane")).await?;
        let nodes_root = dir.join("nodes");
        let mut agents = Vec::new();
        for node in NODES {
            agents.push(start_agent(&control_plane, &nodes_root, node).await?);
        }
        Ok(Self::local(control_plane, agents, Vec::new(), Vec::new(), nodes_root))
    }

    /// Starts a local cluster whose nodes are real ([`real_node`]: a
    /// kubelet, containerd and runc each, running the images
    /// `hack/images.sh --test-images` built), in a fresh temporary
    /// directory. Needs root and `hack/netns.sh` ([`real_node::supported`]).
    ///
    /// # Errors
    /// Fails when a component or a node does not come up.
    pub async fn start_with_real_nodes() -> Result<Self, ControlPlaneError> {
        let dir = temporary_dir("ferry-e2e-real-")?;
        let cluster = Self::start_with_real_nodes_in(dir.path()).await?;
        Ok(cluster.owning(dir))
    }

    /// [`Cluster::start_with_real_nodes`] with its state in `dir` (kept
    /// after stop).
    ///
    /// # Errors
    /// Fails when a component or a node does not come up.
    pub async fn start_with_real_nodes_in(dir: &Path) -> Result<Self, ControlPlaneError> {
        real_node::supported().map_err(|detail| ControlPlaneError::NotReady {
            component: "real nodes".into(),
            detail,
            log: String::new(),
        })?;
        let images = real_node::image_archives()?;
        let control_plane = ControlPlane::start(&dir.join("control-plane")).await?;
        // Pods reach the API server at the `kubernetes` Service's address.
        let api_port = control_plane.server.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()).unwrap_or(443);
        let api = real_node::Forward::start(
            (real_node::API_SERVICE_ADDRESS, 443).into(),
            (std::net::Ipv4Addr::LOCALHOST, api_port).into(),
        )
        .await
        .map_err(|source| ControlPlaneError::Io { what: "forwarding the kubernetes Service".into(), source })?;
        let nodes_root = dir.join("nodes");
        let mut real_nodes = Vec::new();
        for (index, node) in (1u8..).zip(NODES) {
            real_nodes
                .push(real_node::RealNode::start(&control_plane, &nodes_root.join(node), node, index, &images).await?);
        }
        Ok(Self::local(control_plane, Vec::new(), real_nodes, vec![api], nodes_root))
    }

    fn local(
        control_plane: ControlPlane,
        agents: Vec<NodeAgent>,
        real_nodes: Vec<real_node::RealNode>,
        forwards: Vec<real_node::Forward>,
        nodes_root: PathBuf,
    ) -> Self {
        let kubeconfig = control_plane.kubeconfig.clone();
        let local = LocalCluster { control_plane, agents, real_nodes, forwards, nodes_root };
        Self { local: Some(local), kubeconfig, _dir: None }
    }

    /// Makes a server this test started on loopback reachable from pods on
    /// real nodes, at [`real_node::HOST_ADDRESS`] and the same port; returns
    /// that address. `None` on an external cluster.
    ///
    /// # Errors
    /// When the port is taken on that address.
    pub async fn reachable_from_pods(
        &mut self,
        server: std::net::SocketAddr,
    ) -> std::io::Result<Option<std::net::SocketAddr>> {
        let Some(local) = self.local.as_mut() else { return Ok(None) };
        let listen = (real_node::HOST_ADDRESS, server.port()).into();
        local.forwards.push(real_node::Forward::start(listen, server).await?);
        Ok(Some(listen))
    }

    /// Crashes `node`: its agent stops heartbeating and its pods' processes
    /// die, unreported, as in a power cut. The controller manager marks the
    /// node NotReady after its grace period ([`control_plane::NODE_GRACE_PERIOD`]).
    /// False when there is no such running node (or no local cluster).
    pub fn crash_node(&mut self, node: &str) -> bool {
        let Some(local) = self.local.as_mut() else { return false };
        let Some(at) = local.agents.iter().position(|a| a.node() == node) else { return false };
        local.agents.remove(at).crash();
        true
    }

    /// Brings a crashed `node` back with a fresh agent: it reports Ready
    /// again, fails the pods its previous agent was running, as a rebooted
    /// kubelet does, and runs what is bound to it from then on.
    ///
    /// # Errors
    /// Fails when the node cannot register again.
    pub async fn restart_node(&mut self, node: &str) -> Result<(), ControlPlaneError> {
        let Some(local) = self.local.as_mut() else { return Ok(()) };
        let agent = start_agent(&local.control_plane, &local.nodes_root, node).await?;
        local.agents.push(agent);
        Ok(())
    }

    /// The local control plane; `None` on an external cluster.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.local.as_ref().map(|l| &l.control_plane)
    }

    /// The local control plane, to restart its components; `None` on an
    /// external cluster.
    pub fn control_plane_mut(&mut self) -> Option<&mut ControlPlane> {
        self.local.as_mut().map(|l| &mut l.control_plane)
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// An admin client.
    ///
    /// # Errors
    /// Fails when the kubeconfig cannot be loaded.
    pub async fn client(&self) -> Result<kube::Client, ControlPlaneError> {
        control_plane::client_from(&self.kubeconfig).await
    }

    /// The directory that is `node`'s local disk (hostPath `/x` on that node
    /// is `node_dir(node)/x`); `None` on an external cluster, whose disks
    /// this machine cannot see.
    pub fn node_dir(&self, node: &str) -> Option<PathBuf> {
        self.local.as_ref().map(|l| l.nodes_root.join(node))
    }

    /// Logs of every component, for a failing test's report.
    pub fn diagnostics(&self) -> String {
        match &self.local {
            Some(local) => {
                let real: String = local.real_nodes.iter().map(|n| n.log_tails(20)).collect();
                format!("{}{}{real}", local.control_plane.log_tails(30), pod_log_tails(&local.nodes_root, 20))
            }
            None => format!("external cluster ({}): inspect it with kubectl", self.kubeconfig.display()),
        }
    }

    /// A short table of what the cluster holds: every DataStage with its
    /// phase and conditions, every Job and Pod with their state, and the
    /// last Warning events. It tells at a glance which step a stuck test
    /// waits on (no Job, a Job without a Pod, a Pod never started…).
    pub async fn state(&self) -> String {
        use k8s_openapi::api::batch::v1::Job;
        use k8s_openapi::api::core::v1::{Event, Pod};
        use kube::ResourceExt as _;
        use kube::api::{Api, ListParams};
        let Ok(client) = self.client().await else { return "\n--- state: no client ---".into() };
        let mut out = String::from("\n--- state ---");
        let datastages = Api::<ferry_crds::DataStage>::all(client.clone()).list(&ListParams::default()).await;
        for ds in datastages.map(|l| l.items).unwrap_or_default() {
            let status = ds.status.clone().unwrap_or_default();
            let conditions: Vec<String> = status
                .conditions
                .iter()
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            out += &format!(
                "\ndatastage {}/{} created {:?} rv {:?} gen {} observed {:?} phase {:?} [{}]",
                ds.namespace().unwrap_or_default(),
                ds.name_any(),
                ds.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
                ds.metadata.resource_version,
                ds.metadata.generation.unwrap_or_default(),
                status.observed_generation,
                status.phase,
                conditions.join("; ")
            );
        }
        for job in
            Api::<Job>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
        {
            let s = job.status.clone().unwrap_or_default();
            out += &format!(
                "\njob {}/{} active {:?} succeeded {:?} failed {:?}",
                job.namespace().unwrap_or_default(),
                job.name_any(),
                s.active,
                s.succeeded,
                s.failed
            );
        }
        for pod in
            Api::<Pod>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
        {
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
            let deleting = pod.metadata.deletion_timestamp.is_some();
            out += &format!(
                "\npod {}/{} node {node:?} phase {phase:?}{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any(),
                if deleting { " (deleting)" } else { "" }
            );
        }
        let events = Api::<Event>::all(client).list(&ListParams::default().fields("type=Warning")).await;
        let events = events.map(|l| l.items).unwrap_or_default();
        for event in events.iter().rev().take(15).rev() {
            out += &format!(
                "\nwarning {}/{}: {} {}",
                event.involved_object.kind.clone().unwrap_or_default(),
                event.involved_object.name.clone().unwrap_or_default(),
                event.reason.clone().unwrap_or_default(),
                event.message.clone().unwrap_or_default()
            );
        }
        out
    }

    /// Stops the agents (killing their pods), then the control plane.
    pub async fn stop(self) {
        let Self { local, _dir, .. } = self;
        if let Some(LocalCluster { control_plane, agents, real_nodes, forwards, .. }) = local {
            for agent in agents {
                tokio::time::timeout(Duration::from_secs(20), agent.shutdown()).await.ok();
            }
            drop(real_nodes);
            drop(forwards);
            control_plane.stop();
        }
        drop(_dir);
    }
}

fn temporary_dir(prefix: &str) -> Result<tempfile::TempDir, ControlPlaneError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| ControlPlaneError::Io { what: "creating the cluster directory".into(), source })
}

/// Waits until Job `namespace/name` has succeeded; panics at once when it
/// fails.
pub async fn job_succeeded(cluster: &Cluster, client: &kube::Client, namespace: &str, name: &str) {
    let jobs: kube::Api<k8s_openapi::api::batch::v1::Job> = kube::Api::namespaced(client.clone(), namespace);
    wait_for(cluster, &format!("Job {namespace}/{name} to succeed"), Duration::from_secs(180), || {
        let jobs = jobs.clone();
        async move {
            let status = jobs.get(name).await.ok()?.status?;
            assert_eq!(status.failed.unwrap_or(0), 0, "Job {name} failed: {status:?}");
            (status.succeeded.unwrap_or(0) == 1).then_some(())
        }
    })
    .await;
}

/// Starts the agent of `node`, whose disk is `<nodes_root>/<node>`.
async fn start_agent(
    control_plane: &ControlPlane,
    nodes_root: &Path,
    node: &str,
) -> Result<NodeAgent, ControlPlaneError> {
    let ctx = AgentContext {
        client: control_plane.client().await?,
        node: node.to_owned(),
        node_dir: nodes_root.join(node),
        images: ImageMap::workspace(),
        server: control_plane.server.clone(),
        ca_pem: control_plane.ca_pem.clone(),
        process_groups: std::sync::Mutex::default(),
    };
    NodeAgent::start(ctx, &[("ferry.dev/e2e-node", node)]).await.map_err(|e| ControlPlaneError::NotReady {
        component: format!("node agent {node}"),
        detail: e.to_string(),
        log: String::new(),
    })
}

/// The last `lines` of every container's output on the local nodes
/// (`<node>/pods/<uid>/containers/<name>/output.log`), oldest pod first.
fn pod_log_tails(nodes_root: &Path, lines: usize) -> String {
    let mut logs: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for node in std::fs::read_dir(nodes_root).into_iter().flatten().flatten() {
        for pod in std::fs::read_dir(node.path().join("pods")).into_iter().flatten().flatten() {
            for container in std::fs::read_dir(pod.path().join("containers")).into_iter().flatten().flatten() {
                let log = container.path().join("output.log");
                if let Ok(modified) = std::fs::metadata(&log).and_then(|m| m.modified()) {
                    logs.push((modified, log));
                }
            }
        }
    }
    logs.sort();
    logs.iter()
        .map(|(_, log)| {
            let shown = log.strip_prefix(nodes_root).unwrap_or(log);
            format!("\n--- pod log {} ---\n{}", shown.display(), tail_above_debug(log, lines))
        })
        .collect()
}

/// The last `lines` lines of a log that are not DEBUG or TRACE records: a
/// debug-level operator otherwise fills its tail with HTTP client chatter.
fn tail_above_debug(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let kept: Vec<&str> =
        text.lines().filter(|l| !l.contains(r#""level":"DEBUG""#) && !l.contains(r#""level":"TRACE""#)).collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

/// The image to use for one of Ferry's images (`ferry-stager`,
/// `ferry-operator`) or the test shell (`ferry-e2e-shell`):
/// `FERRY_E2E_IMAGE_<NAME>` (upper case, `-` as `_`) when set, so a real
/// cluster can run real images; otherwise a name the node agent maps.
pub fn image(name: &str) -> String {
    let var = format!("FERRY_E2E_IMAGE_{}", name.to_ascii_uppercase().replace('-', "_"));
    std::env::var(var).unwrap_or_else(|_| format!("ghcr.io/ferry-dev/{name}:dev"))
}

/// The object store pods will read: a fresh local MinIO, or the store named
/// by `FERRY_E2E_S3_ENDPOINT` (with `FERRY_E2E_S3_ACCESS_KEY` and
/// `FERRY_E2E_S3_SECRET_KEY`) when pods run on a real cluster and cannot
/// reach this machine's loopback.
pub fn object_store() -> ferry_testkit::S3Server {
    match std::env::var("FERRY_E2E_S3_ENDPOINT") {
        Ok(endpoint) => ferry_testkit::S3Server::external(
            &endpoint,
            &std::env::var("FERRY_E2E_S3_ACCESS_KEY").unwrap_or_default(),
            &std::env::var("FERRY_E2E_S3_SECRET_KEY").unwrap_or_default(),
        ),
        Err(_) => ferry_testkit::S3Server::minio(),
    }
}

/// Polls `check` until it returns `Some`, or panics after `deadline` with
/// `what` and the cluster's diagnostics. Tests wait on conditions, never on
/// bare sleeps.
pub async fn wait_for<T, F, Fut>(cluster: &Cluster, what: &str, deadline: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_telling(cluster, what, deadline, async || String::new(), check).await
}

/// [`wait_for`] whose report on a time-out starts with what `also` says
/// then: the objects the wait was about, the log of a process the cluster
/// does not know of (an operator run beside it).
pub async fn wait_for_telling<T, F, Fut>(
    cluster: &Cluster,
    what: &str,
    deadline: Duration,
    also: impl AsyncFn() -> String,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if started.elapsed() > deadline {
            // What the caller adds comes first, then the objects' state, then
            // the components' logs: a CI log that is cut in the middle keeps a
            // report's first lines and its backtrace, not what lies between.
            panic!(
                "timed out after {deadline:?} waiting for {what}\n{}{}\n{}",
                also().await,
                cluster.state().await,
                cluster.diagnostics()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies the generated CRDs (DataStage, StoreBudget, StagingQuota,
/// NodeCache) and waits until the API server serves them (condition
/// Established); then readies what an operator of [`start_operator`]
/// needs: the workers' namespace, whose accounts may report the progress
/// of any DataStage (as the chart's stager ClusterRole allows), and a
/// NodeCache `e2e` at `/mnt/ferry-cache`.
///
/// # Panics
/// When the API server refuses a CRD or does not establish it in 30 s.
pub async fn install_crd(cluster: &Cluster) {
    install_crds_only(cluster).await;
    create_namespace(cluster, WORKERS_NS, &[("pod-security.kubernetes.io/enforce", "privileged")]).await;
    let client = cluster.client().await.expect("client");
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Patch, PatchParams};
    let role: ClusterRole = serde_json::from_value(serde_json::json!({"metadata": {"name": "ferry-e2e-stager"},
        "rules": [{"apiGroups": ["ferry.dev"], "resources": ["datastages"], "verbs": ["get"]},
                  {"apiGroups": ["ferry.dev"], "resources": ["datastages/status"], "verbs": ["patch"]}]}))
    .expect("a ClusterRole");
    let binding: ClusterRoleBinding =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "ferry-e2e-stager"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": WORKERS_NS}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ferry-e2e-stager"}}))
        .expect("a ClusterRoleBinding");
    let apply = PatchParams::apply("ferry.dev/e2e-tests");
    kube::Api::<ClusterRole>::all(client.clone())
        .patch("ferry-e2e-stager", &apply, &Patch::Apply(&role))
        .await
        .expect("ClusterRole");
    kube::Api::<ClusterRoleBinding>::all(client.clone())
        .patch("ferry-e2e-stager", &apply, &Patch::Apply(&binding))
        .await
        .expect("ClusterRoleBinding");
    let cache: ferry_crds::NodeCache = serde_json::from_value(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "NodeCache", "metadata": {"name": NODE_CACHE},
        "spec": {"root": NODE_CACHE_ROOT}}))
    .expect("a NodeCache");
    kube::Api::<ferry_crds::NodeCache>::all(client)
        .patch(NODE_CACHE, &apply, &Patch::Apply(&cache))
        .await
        .expect("NodeCache");
}

/// The NodeCache [`install_crd`] makes.
pub const NODE_CACHE: &str = "e2e";
/// Its root on every node.
pub const NODE_CACHE_ROOT: &str = "/mnt/ferry-cache";

/// Where a DataStage `name` of `namespace` lands on `node` in the
/// [`NODE_CACHE`]: `ROOT/NAMESPACE/NAME`.
pub fn cache_dir(cluster: &Cluster, node: &str, namespace: &str, name: &str) -> Option<PathBuf> {
    Some(cluster.node_dir(node)?.join(NODE_CACHE_ROOT.trim_start_matches('/')).join(namespace).join(name))
}

/// The Jobs made for DataStage `name` of `namespace` with `role_label`,
/// wherever its workers run (the workers' namespace for node-local
/// volumes, its own for a claim), found by their labels.
///
/// # Panics
/// When the API server cannot be asked.
pub async fn datastage_jobs(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    role_label: &str,
) -> Vec<k8s_openapi::api::batch::v1::Job> {
    datastage_objects(client, namespace, name, role_label).await
}

/// The pods made for DataStage `name` of `namespace` with `role_label`,
/// as [`datastage_jobs`].
///
/// # Panics
/// When the API server cannot be asked.
pub async fn datastage_pods(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    role_label: &str,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    datastage_objects(client, namespace, name, role_label).await
}

async fn datastage_objects<K>(client: &kube::Client, namespace: &str, name: &str, role_label: &str) -> Vec<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    use ferry_crds::names;
    use kube::api::ListParams;
    let labelled = |extra: &str| format!("{}={name},{role_label}{extra}", names::DATASTAGE);
    let elsewhere = kube::Api::<K>::namespaced(client.clone(), WORKERS_NS)
        .list(&ListParams::default().labels(&labelled(&format!(",{}={namespace}", names::DATASTAGE_NAMESPACE))))
        .await
        .expect("list in the workers' namespace")
        .items;
    let own = kube::Api::<K>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&labelled(&format!(",!{}", names::DATASTAGE_NAMESPACE))))
        .await
        .expect("list in the DataStage's namespace")
        .items;
    elsewhere.into_iter().chain(own).collect()
}

/// Applies the generated CRDs only, and waits until they are served.
///
/// # Panics
/// As [`install_crd`].
pub async fn install_crds_only(cluster: &Cluster) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(cluster.client().await.expect("client"));
    for crd in ferry_crds::crds() {
        let name = crd.metadata.name.clone().expect("a generated CRD has a name");
        crds.patch(&name, &PatchParams::apply("ferry.dev/e2e-tests"), &Patch::Apply(crd))
            .await
            .expect("the generated CRD is accepted");
        wait_for(cluster, "the CRD to be established", Duration::from_secs(30), || {
            let (crds, name) = (crds.clone(), name.clone());
            async move {
                let crd = crds.get(&name).await.ok()?;
                crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
            }
        })
        .await;
    }
}

/// Workers of a claim run as their namespace's default ServiceAccount
/// (those of node-local volumes run in [`WORKERS_NS`], see
/// [`install_crd`]); lets it do what the chart's stager Role allows: write
/// its progress (and read back its StoreBudget share) and, in a fleet,
/// read its peers' addresses.
///
/// # Panics
/// When the Role or RoleBinding cannot be created.
pub async fn let_workers_report(cluster: &Cluster, namespace: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::PostParams;
    let client = cluster.client().await.expect("client");
    let role: Role = serde_json::from_value(serde_json::json!({"metadata": {"name": "stager"},
        "rules": [{"apiGroups": ["ferry.dev"], "resources": ["datastages"], "verbs": ["get"]},
                  {"apiGroups": ["ferry.dev"], "resources": ["datastages/status"], "verbs": ["patch"]}]}))
    .expect("a Role");
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({"metadata": {"name": "stager"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "stager"}}))
    .expect("a RoleBinding");
    kube::Api::<Role>::namespaced(client.clone(), namespace).create(&PostParams::default(), &role).await.expect("Role");
    kube::Api::<RoleBinding>::namespaced(client, namespace)
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
}

/// Secret `name` holding a Hugging Face `token` under the key the
/// operator hands to workers as `HF_TOKEN`.
pub fn hub_token_secret(name: &str, token: &str) -> k8s_openapi::api::core::v1::Secret {
    serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {ferry_contract::hub::HF_TOKEN_ENV: token}}))
    .expect("a Secret")
}

/// Creates namespace `name` with `labels`, and waits for its default
/// service account (pods cannot be created before it exists).
///
/// # Panics
/// When the namespace cannot be created.
pub async fn create_namespace(cluster: &Cluster, name: &str, labels: &[(&str, &str)]) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use kube::api::{Patch, PatchParams};
    let client = cluster.client().await.expect("client");
    let labels: serde_json::Map<String, serde_json::Value> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).into())).collect();
    let namespace =
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    kube::Api::<Namespace>::all(client.clone())
        .patch(name, &PatchParams::apply("ferry.dev/e2e-tests"), &Patch::Apply(&namespace))
        .await
        .expect("create namespace");
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client, name);
    wait_for(cluster, "the default service account", Duration::from_secs(30), || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok().flatten() }
    })
    .await;
}

/// A store that trusts the control plane's service-account issuer (MinIO
/// whose STS answers `AssumeRoleWithWebIdentity` for tokens with
/// `audience`), and what that takes of the cluster: anyone may read the
/// issuer's discovery document and keys, as in clusters whose tokens a store
/// verifies (the role exists by default, the binding does not).
///
/// # Panics
/// When the binding cannot be created.
pub async fn store_trusting_issuer(
    control_plane: &ControlPlane,
    client: &kube::Client,
    audience: &str,
) -> ferry_testkit::S3Server {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let public_discovery: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "service-account-issuer-discovery"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:service-account-issuer-discovery"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}],
    }))
    .expect("a ClusterRoleBinding");
    kube::Api::<ClusterRoleBinding>::all(client.clone())
        .create(&kube::api::PostParams::default(), &public_discovery)
        .await
        .expect("publish the issuer's discovery document");
    let config_url = format!("{}/.well-known/openid-configuration", control_plane.server);
    ferry_testkit::S3Server::minio_trusting(&ferry_testkit::OpenIdProvider {
        config_url: &config_url,
        client_id: audience,
        ca_pem: &control_plane.ca_pem,
    })
}

/// The operator running as a process against `cluster` with the admin
/// kubeconfig (the Helm chart's ServiceAccount and RBAC come with the chart).
/// Returns the process and the URL of its HTTP endpoint.
///
/// # Panics
/// When the binary cannot start.
pub fn start_operator(cluster: &Cluster, log_dir: &Path, name: &str) -> (process::ManagedProcess, String) {
    start_operator_with(cluster, log_dir, name, &[])
}

/// [`start_operator`] with `env` set besides (or instead of) its own
/// variables.
///
/// # Panics
/// When the binary cannot start.
pub fn start_operator_with(
    cluster: &Cluster,
    log_dir: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> (process::ManagedProcess, String) {
    spawn_operator(std::process::Command::new(workspace_binary("ferry-operator")), cluster, log_dir, name, env)
}

/// What [`start_operator_restarted`] writes to the operator's log each time
/// the operator exits, before its exit status.
pub const OPERATOR_EXITED: &str = "ferry-operator exited with status";

/// [`start_operator`] started again a second after it exits by itself, as
/// the kubelet restarts the container of the chart's Deployment. The
/// operator exits when it cannot renew its Lease (an API server down for
/// longer than the Lease lasts), so a test that restarts the API server
/// needs what a cluster would do then. Each exit is logged with its status
/// ([`OPERATOR_EXITED`]), for the test to judge; a kill of the process
/// group stops the loop with the operator.
///
/// # Panics
/// When the binary cannot start.
pub fn start_operator_restarted(cluster: &Cluster, log_dir: &Path, name: &str) -> (process::ManagedProcess, String) {
    let mut command = std::process::Command::new("sh");
    command
        .arg("-c")
        .arg(format!(r#"while :; do "$1"; echo "{OPERATOR_EXITED} $?"; sleep 1; done"#))
        .arg("ferry-operator")
        .arg(workspace_binary("ferry-operator"));
    spawn_operator(command, cluster, log_dir, name, &[])
}

/// Starts `command` (the operator's binary, or something that runs it) with
/// the operator's environment for `cluster` and `env` besides.
fn spawn_operator(
    mut command: std::process::Command,
    cluster: &Cluster,
    log_dir: &Path,
    name: &str,
    env: &[(&str, &str)],
) -> (process::ManagedProcess, String) {
    let port = ferry_testkit::free_port();
    command
        .env("KUBECONFIG", cluster.kubeconfig())
        // The replica's name, as a pod's HOSTNAME; it prefixes its leader-election identity.
        .env("HOSTNAME", name)
        .env("FERRY_LEASE_DURATION", "4s")
        .env("FERRY_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("FERRY_STAGER_IMAGE", image("ferry-stager"))
        .env("FERRY_WORKERS_NAMESPACE", WORKERS_NS)
        // The tests of the operator's logic stage onto hostPaths from
        // namespaces of their own; the tenant boundary has tests of its own.
        .env("FERRY_HOST_PATH_NAMESPACES", "*")
        .env("FERRY_ALLOWED_HOST_PATHS", "/mnt/ferry")
        // The stores the tests start speak plain HTTP.
        .env("FERRY_ALLOW_HTTP_STS", "true")
        // Every pull below it shares its objects, as the chart's default
        // directory does: the tests stage the same dataset many times.
        .env("FERRY_SHARED_HOST_PATHS", "/mnt/ferry")
        // FERRY_E2E_OPERATOR_LOG overrides the filter when a test needs to see more.
        .env(
            "RUST_LOG",
            std::env::var("FERRY_E2E_OPERATOR_LOG")
                .unwrap_or_else(|_| "info,kube_runtime=warn,kube_client=warn".into()),
        )
        .envs(env.iter().copied());
    let operator = process::ManagedProcess::spawn(name, command, &log_dir.join(format!("{name}.log")))
        .expect("start ferry-operator");
    (operator, format!("http://127.0.0.1:{port}"))
}

/// The Job of DataStage `name`'s worker `worker` in run `run`, wherever
/// its workers run ([`datastage_jobs`]).
///
/// # Panics
/// When the API server cannot be asked.
pub async fn worker_job(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    worker: &str,
    run: i64,
) -> Option<k8s_openapi::api::batch::v1::Job> {
    use ferry_crds::names;
    use kube::ResourceExt as _;
    let run = run.to_string();
    datastage_jobs(client, namespace, name, names::WORKER).await.into_iter().find(|job| {
        job.labels().get(names::WORKER) == Some(&worker.to_owned()) && job.labels().get(names::RUN) == Some(&run)
    })
}
