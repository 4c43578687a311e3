//! Real nodes: the kubelet of the control plane's version with containerd,
//! runc and the CNI bridge plugin, running Ferry's images as containers with
//! their user ids, read-only roots, capabilities, hostPath volumes and pod
//! networks, as a user's cluster would.
//!
//! Each node is `tests/e2e/real-node.sh` in a mount namespace of its own,
//! in which `<node dir>/mnt` is `/mnt`: two nodes on one machine keep their
//! hostPaths apart, and a test reads a node's disk at
//! [`crate::Cluster::node_dir`] as with the process-based nodes. Pods get
//! addresses from a bridge per node (`10.244.<n>.0/24`), routed to each
//! other in the test run's network namespace (`hack/netns.sh`), so peers
//! talk pod to pod and nothing leaves the machine.
//!
//! There is no kube-proxy and no cluster DNS: the one Service pods need,
//! the API server's, is answered by a [`Forward`] on its ClusterIP
//! ([`API_SERVICE_ADDRESS`]), and stores the tests start are reached at
//! [`HOST_ADDRESS`]. The test machine has no `CAP_SYS_RESOURCE`, so
//! containerd is told not to lower a container's OOM score below its own
//! (`restrict_oom_score_adj`); everything else is as a node does it.
//!
//! Not for: the scenarios that are faster on process-based nodes
//! ([`crate::agent`]); see `tests/e2e/README.md` for which run where.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_testkit::{repo_root, tool_path};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::task::JoinHandle;

use crate::control_plane::{ControlPlane, ControlPlaneError};
use crate::process::ManagedProcess;

/// This machine as pods on real nodes see it (an address on `lo` in the
/// test run's network namespace): object stores the tests start are
/// reached there ([`Forward`]).
pub const HOST_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 1);
/// The `kubernetes` Service's ClusterIP (the first address of the
/// control plane's service range), on `lo` in the test run's namespace.
pub const API_SERVICE_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// The tag of every image the real nodes import (`hack/images.sh` tags
/// with the workspace version, which is the chart's appVersion).
pub const IMAGE_TAG: &str = env!("CARGO_PKG_VERSION");

/// A Ferry image (`ferry-stager`, `ferry-operator`) as `hack/images.sh`
/// names it.
pub fn ferry_image(name: &str) -> String {
    format!("ghcr.io/ferry-dev/{name}:{IMAGE_TAG}")
}

/// The e2e harness's own images (`pause`, `shell`), named `localhost/`
/// so no runtime would try a registry for them.
pub fn test_image(name: &str) -> String {
    format!("localhost/ferry-e2e-{name}:{IMAGE_TAG}")
}

/// `<target>/images`, where `hack/images.sh` writes the archives.
pub fn images_dir() -> PathBuf {
    let release = crate::process::workspace_binary("ferry-stager");
    release.parent().and_then(Path::parent).map_or_else(|| PathBuf::from("target/images"), |t| t.join("images"))
}

/// The archives a real node imports: Ferry's images and the test images.
///
/// # Errors
/// Names the missing archive and the command that builds it.
pub fn image_archives() -> Result<Vec<PathBuf>, ControlPlaneError> {
    let dir = images_dir();
    ["ferry-operator", "ferry-stager", "ferry-e2e-pause", "ferry-e2e-shell"]
        .into_iter()
        .map(|name| {
            let archive = dir.join(format!("{name}.oci.tar"));
            if archive.exists() {
                Ok(archive)
            } else {
                Err(ControlPlaneError::NotReady {
                    component: "real nodes".into(),
                    detail: format!("{} is missing: run hack/images.sh --test-images", archive.display()),
                    log: String::new(),
                })
            }
        })
        .collect()
}

/// Whether real nodes can run here: root, and the network namespace of
/// `hack/netns.sh` (pods' routes and the two addresses above).
pub fn supported() -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("real nodes need root (containerd, runc, mounts and cgroups)".into());
    }
    if std::env::var_os("FERRY_IN_NETNS").is_none() {
        return Err("real nodes need the network namespace of hack/netns.sh".into());
    }
    Ok(())
}

/// One running real node; dropping it stops the kubelet, containerd and
/// every container it ran.
#[derive(Debug)]
pub struct RealNode {
    name: String,
    runtime: PathBuf,
    cgroup: String,
    process: Option<ManagedProcess>,
}

impl RealNode {
    /// Starts node `name` (the `index`-th, from 1: its pod subnet is
    /// `10.244.<index>.0/24`) with its disk at `node_dir`, imports
    /// `images`, and waits until its Node is Ready.
    ///
    /// # Errors
    /// Fails with the kubelet's and containerd's log tails when the node
    /// does not become Ready within two minutes.
    pub async fn start(
        control_plane: &ControlPlane,
        node_dir: &Path,
        name: &str,
        index: u8,
        images: &[PathBuf],
    ) -> Result<Self, ControlPlaneError> {
        let runtime = node_dir.join("runtime");
        let io = |what: &str| {
            let what = format!("{what} for real node {name}");
            move |source| ControlPlaneError::Io { what, source }
        };
        std::fs::create_dir_all(runtime.join("containerd")).map_err(io("creating the runtime directory"))?;
        std::fs::create_dir_all(runtime.join("cni")).map_err(io("creating the CNI directory"))?;
        let cgroup = format!("ferry-e2e-{}-{name}", std::process::id());
        let config = NodeConfig { name, index, runtime: &runtime, cgroup: &cgroup };
        std::fs::write(runtime.join("containerd.toml"), config.containerd()).map_err(io("writing containerd.toml"))?;
        std::fs::write(runtime.join("cni/10-ferry.conflist"), config.cni()).map_err(io("writing the CNI config"))?;
        std::fs::write(runtime.join("kubelet.json"), config.kubelet()).map_err(io("writing the kubelet config"))?;
        std::fs::copy(&control_plane.kubeconfig, runtime.join("kubeconfig")).map_err(io("copying the kubeconfig"))?;

        let mut command = Command::new("unshare");
        command
            .args(["--mount", "--propagation", "private"])
            .arg(repo_root().join("tests/e2e/real-node.sh"))
            .arg(&runtime)
            .arg(&cgroup)
            .arg(format!("--hostname-override={name}"))
            .arg(format!("--node-ip={HOST_ADDRESS}"))
            .arg(format!("--node-labels=ferry.dev/e2e-node={name}"))
            .arg("--v=1")
            .env("FERRY_CONTAINERD_BIN", tool_path("containerd"))
            .env("FERRY_CTR_BIN", tool_path("ctr"))
            .env("FERRY_KUBELET_BIN", tool_path("kubelet"))
            .env("FERRY_NODE_IMAGES", images.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":"))
            .env("FERRY_DISK_DIR", node_dir);
        let process = ManagedProcess::spawn(&format!("real node {name}"), command, &runtime.join("kubelet.log"))
            .map_err(io("starting"))?;
        let mut node = Self { name: name.to_owned(), runtime, cgroup, process: Some(process) };
        node.wait_ready(control_plane).await?;
        Ok(node)
    }

    async fn wait_ready(&mut self, control_plane: &ControlPlane) -> Result<(), ControlPlaneError> {
        let nodes: Api<Node> = Api::all(control_plane.client().await?);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = nodes.get_opt(&self.name).await.ok().flatten().is_some_and(|node| {
                node.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if ready {
                return Ok(());
            }
            let exited = self.process.as_mut().and_then(ManagedProcess::try_wait);
            if exited.is_some() || Instant::now() > deadline {
                return Err(ControlPlaneError::NotReady {
                    component: format!("real node {}", self.name),
                    detail: exited.map_or_else(|| "not Ready after 120 s".into(), |s| format!("exited: {s}")),
                    log: self.log_tails(40),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The last lines of the kubelet's and containerd's logs, and of every
    /// container's (the kubelet's `podLogsDir`).
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for log in ["kubelet.log", "containerd.log"] {
            out += &format!("\n--- {} {log} ---\n{}", self.name, tail(&self.runtime.join(log), lines));
        }
        let mut containers = Vec::new();
        collect_files(&self.runtime.join("pod-logs"), &mut containers);
        containers.sort();
        for log in containers {
            let shown = log.strip_prefix(self.runtime.join("pod-logs")).unwrap_or(&log).display().to_string();
            out += &format!("\n--- {} container log {shown} ---\n{}", self.name, tail(&log, lines));
        }
        out
    }

    /// Stops the kubelet and containerd, kills every container and shim the
    /// node started (found by their cgroups and by the containerd socket in
    /// their command line), and removes the node's cgroups.
    fn tear_down(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(5));
        }
        let socket = self.runtime.join("containerd").display().to_string();
        for _ in 0..50 {
            let mut pids = cgroup_pids(&self.cgroup);
            pids.extend(processes_mentioning(&socket));
            if pids.is_empty() {
                break;
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    rustix::process::kill_process(pid, rustix::process::Signal::KILL).ok();
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            remove_cgroup_tree(&hierarchy.path().join(&self.cgroup));
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.tear_down();
    }
}

/// What one node's configuration files say.
struct NodeConfig<'a> {
    name: &'a str,
    index: u8,
    runtime: &'a Path,
    cgroup: &'a str,
}

impl NodeConfig<'_> {
    fn socket(&self) -> PathBuf {
        self.runtime.join("containerd/containerd.sock")
    }

    /// containerd 2's configuration (version 3): this node's state,
    /// Debian's runc, the CNI plugins, the pause image built here.
    fn containerd(&self) -> String {
        let rt = self.runtime.display();
        let socket = self.socket();
        let runc = tool_path("runc");
        let cni = tool_path("cni-plugins");
        let pause = test_image("pause");
        format!(
            r#"version = 3
root = "{rt}/containerd/root"
state = "{rt}/containerd/state"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  # No CAP_SYS_RESOURCE on the test machine: a container's OOM score may
  # not go below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni}"]
    conf_dir = "{rt}/cni"
"#,
            socket = socket.display(),
            runc = runc.display(),
            cni = cni.display(),
        )
    }

    /// A bridge per node with addresses from `10.244.<index>.0/24` and a
    /// default route through it.
    fn cni(&self) -> String {
        let name = format!("ferry-{}", self.name);
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [{
                "type": "bridge",
                // Linux caps interface names at 15 bytes.
                "bridge": &name[..name.len().min(15)],
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": format!("10.244.{}.0/24", self.index)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.runtime.join("cni-ipam"),
                },
            }],
        })
        .to_string()
    }

    /// The kubelet's configuration: cgroup v1 accepted, its own cgroup root
    /// and port, pod logs in the node's directory, no eviction by disk (the
    /// test machine's disk is shared by every node).
    fn kubelet(&self) -> String {
        serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "failSwapOn": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.cgroup),
            "address": HOST_ADDRESS.to_string(),
            "port": 10250 + u16::from(self.index),
            "healthzPort": 0,
            "readOnlyPort": 0,
            "podLogsDir": self.runtime.join("pod-logs"),
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": format!("unix://{}", self.socket().display()),
            "resolvConf": "",
            "enforceNodeAllocatable": [],
            "evictionHard": {"memory.available": "100Mi"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": false,
            "oomScoreAdj": 0,
            "localStorageCapacityIsolation": false,
        })
        .to_string()
    }
}

/// A TCP forwarder: what kube-proxy would do for one Service, and how pods
/// reach a server the test started on loopback. Stops when dropped.
#[derive(Debug)]
pub struct Forward {
    task: JoinHandle<()>,
}

impl Forward {
    /// Accepts on `listen` and joins each connection to `target`.
    ///
    /// # Errors
    /// When `listen` cannot be bound.
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await.ok();
                    }
                });
            }
        });
        Ok(Self { task })
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { collect_files(&path, out) } else { out.push(path) }
    }
}

/// Every process in the node's cgroups (the containers), in any hierarchy.
fn cgroup_pids(cgroup: &str) -> Vec<i32> {
    let mut procs = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let mut files = Vec::new();
        collect_named(&hierarchy.path().join(cgroup), "cgroup.procs", &mut files);
        for file in files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            procs.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    procs.sort_unstable();
    procs.dedup();
    procs
}

fn collect_named(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_named(&path, name, out);
        } else if entry.file_name() == name {
            out.push(path);
        }
    }
}

/// Processes whose command line contains `text` (a node's shims name its
/// containerd socket).
fn processes_mentioning(text: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(text))
        })
        .collect()
}

/// Removes a cgroup directory and those below it, deepest first (a cgroup
/// directory is removed with rmdir, its files go with it).
fn remove_cgroup_tree(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path());
        }
    }
    std::fs::remove_dir(dir).ok();
}
