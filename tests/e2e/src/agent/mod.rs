//! A node agent: test infrastructure that plays the kubelet for nodes that
//! exist only as directories on this machine.
//!
//! It registers a Node object, keeps it Ready (status heartbeats and a node
//! Lease), watches the pods the scheduler binds to it, and runs each as
//! local processes ([`pod`]). Node-local storage is a real directory,
//! `<root>/<node>/`, so tests can inspect what landed on which node. What it
//! cannot emulate (unknown images, unsupported volume types, exec probes) is
//! refused with a pod condition, never faked. It does not enforce security
//! contexts or resource limits: Pod Security admission in the API server
//! still judges every pod, but processes run as the test's user.

pub mod images;
pub mod network;
pub mod paths;
pub mod pod;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use pod::AgentContext;

/// Field manager of everything the agent writes.
const FIELD_MANAGER: &str = "ferry.dev/e2e-node-agent";
/// How often the node's lease and Ready condition are renewed: well inside
/// the controller manager's node grace period
/// ([`crate::control_plane::NODE_GRACE_PERIOD`]), so a busy machine does
/// not make a node look lost.
const HEARTBEAT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for AgentContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentContext")
            .field("node", &self.node)
            .field("node_dir", &self.node_dir)
            .finish_non_exhaustive()
    }
}

struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// A running node agent; [`NodeAgent::shutdown`] stops it and its pods.
pub struct NodeAgent {
    ctx: Arc<AgentContext>,
    tasks: Vec<JoinHandle<()>>,
    pods: Arc<Mutex<HashMap<String, Running>>>,
}

impl std::fmt::Debug for NodeAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAgent").field("node", &self.ctx.node).finish_non_exhaustive()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        for group in self.ctx.process_groups.lock().expect("groups lock").drain() {
            if let Some(pid) = rustix::process::Pid::from_raw(group as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

impl NodeAgent {
    /// Registers the node and starts serving it.
    ///
    /// # Errors
    /// Fails when the Node cannot be registered.
    pub async fn start(ctx: AgentContext, labels: &[(&str, &str)]) -> Result<Self, kube::Error> {
        std::fs::create_dir_all(&ctx.node_dir).map_err(|e| kube::Error::Service(Box::new(e)))?;
        let ctx = Arc::new(ctx);
        register(&ctx, labels).await?;
        let pods = Arc::new(Mutex::new(HashMap::new()));
        let heartbeat = tokio::spawn(heartbeat(Arc::clone(&ctx)));
        let watch = tokio::spawn(watch_pods(Arc::clone(&ctx), Arc::clone(&pods)));
        Ok(Self { ctx, tasks: vec![heartbeat, watch], pods })
    }

    /// The node's name.
    pub fn node(&self) -> &str {
        &self.ctx.node
    }

    /// Stops the node as a crash or a power cut does: heartbeats stop, every
    /// pod process is killed, and nothing of it is reported. The Node and its
    /// pods stay as they were until the node lifecycle controller notices
    /// (NotReady) or a new agent for the node starts.
    pub fn crash(self) {
        for (_, run) in self.pods.lock().expect("pods lock").drain() {
            run.task.abort();
        }
        // Dropping aborts the heartbeat and the watch and kills the process
        // groups.
    }

    /// Stops watching and kills every pod process of this node.
    pub async fn shutdown(self) {
        let running: Vec<Running> = self.pods.lock().expect("pods lock").drain().map(|(_, r)| r).collect();
        for run in running {
            let _ = run.stop.send(true);
            let _ = tokio::time::timeout(Duration::from_secs(10), run.task).await;
        }
    }
}

async fn register(ctx: &AgentContext, labels: &[(&str, &str)]) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut label_map = serde_json::Map::new();
    label_map.insert("kubernetes.io/hostname".into(), ctx.node.clone().into());
    label_map.insert("kubernetes.io/os".into(), "linux".into());
    label_map.insert("kubernetes.io/arch".into(), "amd64".into());
    for (key, value) in labels {
        label_map.insert((*key).into(), (*value).into());
    }
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": ctx.node, "labels": label_map},
        "spec": {},
    });
    nodes.patch(&ctx.node, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&node)).await?;
    report_ready(ctx).await
}

async fn report_ready(ctx: &AgentContext) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |kind: &str, status: &str, reason: &str| json!({"type": kind, "status": status, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    let resources = json!({"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": ctx.node}],
        "nodeInfo": {
            "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "ferry-e2e://processes",
            "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "v1.36.3", "machineID": "",
            "operatingSystem": "linux", "osImage": "ferry e2e node agent", "systemUUID": "",
        },
    }});
    nodes.patch_status(&ctx.node, &PatchParams::default(), &Patch::Merge(&status)).await?;
    Ok(())
}

/// Renews the node lease and the Ready condition so the node lifecycle
/// controller never taints the node.
async fn heartbeat(ctx: Arc<AgentContext>) {
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), "kube-node-lease");
    loop {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": ctx.node},
            "spec": {
                "holderIdentity": ctx.node,
                "leaseDurationSeconds": 40,
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now()),
            },
        });
        if let Err(error) =
            leases.patch(&ctx.node, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&lease)).await
        {
            tracing::debug!(node = %ctx.node, %error, "lease renewal failed");
        }
        if let Err(error) = report_ready(&ctx).await {
            tracing::debug!(node = %ctx.node, %error, "node status update failed");
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// Starts a runner for each new pod bound to this node and stops runners of
/// pods being deleted.
async fn watch_pods(ctx: Arc<AgentContext>, pods: Arc<Mutex<HashMap<String, Running>>>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    // Renewed every minute, as the operator's are: a watch resumed on an
    // API server whose etcd restarted can stay open and silent.
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node)).timeout(60);
    let mut finished: HashSet<String> = HashSet::new();
    let mut events = watcher(api, config).boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(watcher::Event::Delete(pod)) => {
                if let Some(run) = pods.lock().expect("pods lock").remove(&pod.uid().unwrap_or_default()) {
                    let _ = run.stop.send(true);
                }
                continue;
            }
            Ok(_) => continue,
            Err(error) => {
                tracing::debug!(node = %ctx.node, %error, "pod watch error; the watcher retries");
                continue;
            }
        };
        let uid = pod.uid().unwrap_or_default();
        let deleting = pod.metadata.deletion_timestamp.is_some();
        let mut running = pods.lock().expect("pods lock");
        running.retain(|uid, run| {
            if run.task.is_finished() {
                finished.insert(uid.clone());
                false
            } else {
                true
            }
        });
        match running.get(&uid) {
            Some(run) if deleting => {
                let _ = run.stop.send(true);
            }
            Some(_) => {}
            None if deleting => {
                // Finished or never started: nothing runs, confirm the deletion.
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &pod.namespace().unwrap_or_default());
                let name = pod.name_any();
                tokio::spawn(async move { pod::delete_now(&api, &name, &uid).await });
            }
            None => {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
                if finished.contains(&uid) || phase == "Succeeded" || phase == "Failed" {
                    continue;
                }
                if phase == "Running" && !pod::restarts_always(&pod) {
                    // An earlier agent of this node ran it and crashed: its
                    // processes are gone, and a kubelet back from a reboot
                    // fails such a pod rather than run it again.
                    finished.insert(uid);
                    tokio::spawn(pod::report_lost(Arc::clone(&ctx), pod));
                    continue;
                }
                let (stop, stopped) = watch::channel(false);
                let task = tokio::spawn(pod::run(Arc::clone(&ctx), pod, stopped));
                running.insert(uid, Running { stop, task });
            }
        }
    }
}
