//! Runs one pod as local processes, the way a kubelet would run its
//! containers: volumes prepared, environment resolved, init containers in
//! order, then the containers, with restart policy, deadline, termination
//! messages and a status the Job controller understands. A container with
//! an HTTP readiness probe is ready once the probe answers 2xx or 3xx, so a
//! Service sends nothing to a server that is still starting.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, ResourceExt as _};
use rustix::process::{Pid, Signal, kill_process_group};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::images::ImageMap;
use super::network::{bind_to_pod, pod_ip};
use super::paths::{PathMap, node_path};

/// What every pod runner of one node shares.
pub struct AgentContext {
    /// Admin client (the agent is trusted test infrastructure).
    pub client: kube::Client,
    /// Node name.
    pub node: String,
    /// `<root>/<node>`: the node's local disk.
    pub node_dir: PathBuf,
    /// Image → program.
    pub images: ImageMap,
    /// API server URL, for pod kubeconfigs.
    pub server: String,
    /// CA bundle for the API server, for pod kubeconfigs.
    pub ca_pem: Vec<u8>,
    /// Process groups of running containers, killed if the agent is dropped
    /// without a shutdown (a panicking test), so no process outlives it.
    pub process_groups: Mutex<HashSet<u32>>,
}

/// Termination messages are cut to this size, as the kubelet does.
const MAX_TERMINATION_MESSAGE: usize = 4096;

/// Why a pod cannot start (yet or ever).
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    /// The agent cannot emulate something the pod asks for: the pod fails.
    #[error("{0}")]
    Unsupported(String),
    /// Something the pod needs is missing (a Secret, a bound volume): retried.
    #[error("{0}")]
    NotReady(String),
}

/// A container's state, as reported in `containerStatuses`.
#[derive(Clone, Debug)]
enum State {
    Waiting { reason: String, message: Option<String> },
    Running { started: Time },
    Terminated { code: i32, reason: String, message: String, started: Time, finished: Time },
}

#[derive(Clone, Debug)]
struct ContainerReport {
    name: String,
    image: String,
    state: State,
    restarts: u32,
    /// Its HTTP readiness probe, if it has one.
    probe: Option<HttpProbe>,
    /// Whether that probe last passed (without a probe: while running).
    probe_passed: bool,
}

/// A readiness probe by HTTP GET, resolved against the container's ports.
#[derive(Clone, Debug)]
struct HttpProbe {
    port: u16,
    path: String,
    period: Duration,
    initial_delay: Duration,
}

impl HttpProbe {
    /// The container's `readinessProbe.httpGet`, its named port looked up.
    fn of(container: &Container) -> Option<Self> {
        let probe = container.readiness_probe.as_ref()?;
        let get = probe.http_get.as_ref()?;
        let port = match &get.port {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(port) => u16::try_from(*port).ok()?,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())?,
        };
        let seconds = |s: Option<i32>, default: i32| Duration::from_secs(s.unwrap_or(default).max(0) as u64);
        Some(Self {
            port,
            path: get.path.clone().unwrap_or_else(|| "/".into()),
            period: seconds(probe.period_seconds, 10).clamp(Duration::from_millis(500), Duration::from_secs(2)),
            initial_delay: seconds(probe.initial_delay_seconds, 0),
        })
    }

    /// One probe of the server at `ip`: an answer of 2xx or 3xx, within a
    /// second, passes, as the kubelet's HTTP prober judges it.
    async fn passes(&self, ip: std::net::Ipv4Addr) -> bool {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let probe = async {
            let mut stream = tokio::net::TcpStream::connect((ip, self.port)).await.ok()?;
            let request =
                format!("GET {} HTTP/1.0\r\nHost: {ip}:{}\r\nUser-Agent: kube-probe\r\n\r\n", self.path, self.port);
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await.ok()?;
            let code: u16 = std::str::from_utf8(&head[9..12]).ok()?.parse().ok()?;
            Some((200..400).contains(&code))
        };
        tokio::time::timeout(Duration::from_secs(1), probe).await.ok().flatten().unwrap_or(false)
    }
}

impl ContainerReport {
    /// Running, and past its readiness probe if it has one.
    fn ready(&self) -> bool {
        matches!(self.state, State::Running { .. }) && (self.probe.is_none() || self.probe_passed)
    }

    fn json(&self) -> Value {
        let state = match &self.state {
            State::Waiting { reason, message } => json!({"waiting": {"reason": reason, "message": message}}),
            State::Running { started } => json!({"running": {"startedAt": started}}),
            State::Terminated { code, reason, message, started, finished } => json!({"terminated": {
                "exitCode": code, "reason": reason, "message": message, "startedAt": started, "finishedAt": finished,
            }}),
        };
        json!({
            "name": self.name,
            "image": self.image,
            "imageID": format!("ferry-e2e://{}", self.image),
            "containerID": format!("ferry-e2e://{}", self.name),
            "ready": self.ready(),
            "started": matches!(self.state, State::Running { .. }),
            "restartCount": self.restarts,
            "state": state,
        })
    }
}

/// A container ready to start: program, arguments, environment, paths.
#[derive(Debug)]
struct Prepared {
    name: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: PathBuf,
    termination_log: PathBuf,
    fallback_to_logs: bool,
    log: PathBuf,
}

/// How many times a pod status update is tried, half a second apart: a
/// minute, longer than any API server or etcd restart in the tests.
const STATUS_ATTEMPTS: u32 = 120;

/// Runs `pod` until it is finished or `stop` turns true (deletion).
pub async fn run(ctx: Arc<AgentContext>, pod: Pod, mut stop: watch::Receiver<bool>) {
    let mut runner = PodRunner::new(ctx, &pod);
    let prepared = loop {
        match runner.prepare(&pod).await {
            Ok(prepared) => break prepared,
            Err(PodError::Unsupported(message)) => {
                tracing::warn!(pod = %runner.name, %message, "refusing pod");
                runner.phase = "Failed";
                runner.reason = Some("Unsupported".into());
                runner.message = Some(message.clone());
                runner.refused = Some(message);
                runner.report().await;
                return;
            }
            Err(PodError::NotReady(message)) => {
                for c in runner.init.iter_mut().chain(runner.main.iter_mut()) {
                    c.state =
                        State::Waiting { reason: "CreateContainerConfigError".into(), message: Some(message.clone()) };
                }
                runner.report().await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.changed() => { runner.finish_deleted(&[]).await; return; }
                }
            }
        }
    };
    runner.execute(prepared, stop).await;
}

struct PodRunner {
    ctx: Arc<AgentContext>,
    api: Api<Pod>,
    name: String,
    uid: String,
    dir: PathBuf,
    restart_policy: String,
    deadline: Option<Duration>,
    grace: Duration,
    started: Time,
    phase: &'static str,
    reason: Option<String>,
    message: Option<String>,
    refused: Option<String>,
    init: Vec<ContainerReport>,
    main: Vec<ContainerReport>,
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

impl PodRunner {
    fn new(ctx: Arc<AgentContext>, pod: &Pod) -> Self {
        let namespace = pod.namespace().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let report = |c: &Container| ContainerReport {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            state: State::Waiting { reason: "PodInitializing".into(), message: None },
            restarts: 0,
            probe: HttpProbe::of(c),
            probe_passed: false,
        };
        let uid = pod.uid().unwrap_or_default();
        Self {
            api: Api::namespaced(ctx.client.clone(), &namespace),
            dir: ctx.node_dir.join("pods").join(&uid),
            name: format!("{namespace}/{}", pod.name_any()),
            uid,
            restart_policy: spec.restart_policy.clone().unwrap_or_else(|| "Always".into()),
            deadline: spec.active_deadline_seconds.map(|s| Duration::from_secs(s.max(0) as u64)),
            grace: Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).clamp(0, 5) as u64),
            started: now(),
            phase: "Pending",
            reason: None,
            message: None,
            refused: None,
            init: spec.init_containers.iter().flatten().map(report).collect(),
            main: spec.containers.iter().map(report).collect(),
            ctx,
        }
    }

    /// Patches the pod's status with everything known so far.
    async fn report(&self) {
        let all_running = !self.main.is_empty() && self.main.iter().all(ContainerReport::ready);
        let initialized = self.init.iter().all(|c| matches!(c.state, State::Terminated { code: 0, .. }));
        let condition = |kind: &str, ok: bool, reason: Option<&str>| {
            json!({"type": kind, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now(),
                   "reason": reason, "message": if ok { None } else { self.message.clone() }})
        };
        let mut conditions = vec![
            condition("PodScheduled", true, None),
            condition("Initialized", initialized, None),
            condition("ContainersReady", all_running, None),
            condition("Ready", all_running, self.refused.as_ref().map(|_| "Unsupported")),
        ];
        if let Some(refusal) = &self.refused {
            conditions.push(json!({"type": "FerryAgentUnsupported", "status": "True", "lastTransitionTime": now(),
                                   "reason": "Unsupported", "message": refusal}));
        }
        let status = json!({"status": {
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip(&self.uid).to_string(),
            "podIPs": [{"ip": pod_ip(&self.uid).to_string()}],
            "startTime": self.started,
            "conditions": conditions,
            "initContainerStatuses": self.init.iter().map(ContainerReport::json).collect::<Vec<_>>(),
            "containerStatuses": self.main.iter().map(ContainerReport::json).collect::<Vec<_>>(),
        }});
        let name = self.name.split('/').nth(1).unwrap_or_default();
        // Retried while the API server is away (restarted, or its etcd), as
        // a kubelet's status manager keeps syncing: a lost update of a
        // finished container would leave its pod Running for ever.
        for attempt in 1..=STATUS_ATTEMPTS {
            match self.api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await {
                Ok(_) => return,
                // Refused (the pod is gone, or the update is invalid):
                // another try would be refused too.
                Err(kube::Error::Api(response)) if response.code < 500 && response.code != 429 => {
                    tracing::debug!(pod = %self.name, error = %response, "status update refused");
                    return;
                }
                Err(error) => {
                    tracing::debug!(pod = %self.name, %error, attempt, "status update failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// Resolves volumes, identity and environment for every container.
    async fn prepare(&mut self, pod: &Pod) -> Result<Vec<Prepared>, PodError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let namespace = pod.namespace().unwrap_or_default();
        std::fs::create_dir_all(&self.dir).map_err(|e| PodError::NotReady(format!("creating pod directory: {e}")))?;

        let mut volumes: BTreeMap<String, PathBuf> = BTreeMap::new();
        for volume in spec.volumes.iter().flatten() {
            let host = self.volume(&namespace, pod, volume).await?;
            volumes.insert(volume.name.clone(), host);
        }
        let kubeconfig = if spec.automount_service_account_token == Some(false) {
            None
        } else {
            Some(self.identity(pod, &namespace).await?)
        };

        let mut prepared = Vec::new();
        for container in spec.init_containers.iter().flatten().chain(spec.containers.iter()) {
            prepared.push(self.container(pod, &namespace, container, &volumes, kubeconfig.as_deref()).await?);
        }
        Ok(prepared)
    }

    /// The host directory behind one volume.
    async fn volume(&self, namespace: &str, pod: &Pod, volume: &Volume) -> Result<PathBuf, PodError> {
        let node_root = &self.ctx.node_dir;
        let own = self.dir.join("volumes").join(&volume.name);
        let make = |dir: PathBuf| -> Result<PathBuf, PodError> {
            std::fs::create_dir_all(&dir)
                .map_err(|e| PodError::NotReady(format!("creating {}: {e}", dir.display())))?;
            Ok(dir)
        };
        if volume.empty_dir.is_some() {
            return make(own);
        }
        if let Some(host_path) = &volume.host_path {
            return match host_path.type_.as_deref().unwrap_or("") {
                "" | "Directory" | "DirectoryOrCreate" => make(node_path(node_root, &host_path.path)),
                other => Err(PodError::Unsupported(format!(
                    "volume '{}': hostPath type {other} is not emulated (only directories)",
                    volume.name
                ))),
            };
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), namespace);
            let pvc =
                claims.get_opt(&claim.claim_name).await.ok().flatten().ok_or_else(|| {
                    PodError::NotReady(format!("persistentvolumeclaim '{}' not found", claim.claim_name))
                })?;
            let pv_name = pvc.spec.and_then(|s| s.volume_name).filter(|n| !n.is_empty()).ok_or_else(|| {
                PodError::NotReady(format!("persistentvolumeclaim '{}' is not bound yet", claim.claim_name))
            })?;
            let pv = Api::<PersistentVolume>::all(self.ctx.client.clone())
                .get(&pv_name)
                .await
                .map_err(|e| PodError::NotReady(format!("persistentvolume '{pv_name}': {e}")))?;
            let spec = pv.spec.unwrap_or_default();
            let path = spec.local.map(|l| l.path).or(spec.host_path.map(|h| h.path)).ok_or_else(|| {
                PodError::Unsupported(format!("persistentvolume '{pv_name}' is neither local nor hostPath"))
            })?;
            return make(node_path(node_root, &path));
        }
        if let Some(config_map) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), namespace);
            let found = api.get_opt(&config_map.name).await.ok().flatten();
            let Some(found) = found else {
                return if config_map.optional == Some(true) {
                    make(own)
                } else {
                    Err(PodError::NotReady(format!("configmap '{}' not found", config_map.name)))
                };
            };
            let dir = make(own)?;
            for (key, value) in found.data.unwrap_or_default() {
                write_file(&dir.join(key), value.as_bytes())?;
            }
            return Ok(dir);
        }
        if let Some(secret) = &volume.secret {
            let name = secret.secret_name.clone().unwrap_or_default();
            let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
            let found = api
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .ok_or_else(|| PodError::NotReady(format!("secret '{name}' not found")))?;
            let dir = make(own)?;
            let data = found.data.unwrap_or_default();
            match &secret.items {
                // As the kubelet does: only the listed keys, each at its path.
                Some(items) => {
                    for item in items {
                        let value = data
                            .get(&item.key)
                            .ok_or_else(|| PodError::NotReady(format!("secret '{name}' has no key '{}'", item.key)))?;
                        write_file(&dir.join(&item.path), &value.0)?;
                    }
                }
                None => {
                    for (key, value) in data {
                        write_file(&dir.join(key), &value.0)?;
                    }
                }
            }
            return Ok(dir);
        }
        if let Some(projected) = &volume.projected {
            // The service-account volume the API server injects: token, CA, namespace.
            let dir = make(own)?;
            for source in projected.sources.iter().flatten() {
                if let Some(token) = &source.service_account_token {
                    let value = self.token(pod, namespace).await?;
                    write_file(&dir.join(&token.path), value.as_bytes())?;
                } else if let Some(config_map) = &source.config_map {
                    if config_map.name == "kube-root-ca.crt" {
                        write_file(&dir.join("ca.crt"), &self.ctx.ca_pem)?;
                    }
                } else if let Some(downward) = &source.downward_api {
                    for item in downward.items.iter().flatten() {
                        let value =
                            field_value(pod, item.field_ref.as_ref().map(|f| f.field_path.as_str()).unwrap_or(""))
                                .unwrap_or_default();
                        write_file(&dir.join(&item.path), value.as_bytes())?;
                    }
                } else {
                    return Err(PodError::Unsupported(format!(
                        "volume '{}': this projected source is not emulated",
                        volume.name
                    )));
                }
            }
            return Ok(dir);
        }
        Err(PodError::Unsupported(format!(
            "volume '{}': only emptyDir, hostPath, persistentVolumeClaim, configMap, secret and the service-account projection are emulated",
            volume.name
        )))
    }

    /// A token for the pod's service account, bound to the pod.
    async fn token(&self, pod: &Pod, namespace: &str) -> Result<String, PodError> {
        let account =
            pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into());
        let accounts: Api<ServiceAccount> = Api::namespaced(self.ctx.client.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: None,
                expiration_seconds: Some(3600),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                }),
            }),
            ..Default::default()
        };
        let response = accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| PodError::NotReady(format!("token for serviceaccount '{account}': {e}")))?;
        Ok(response.status.and_then(|s| s.token).unwrap_or_default())
    }

    /// A kubeconfig carrying the pod's service-account token, so any client
    /// that honours KUBECONFIG (kube-rs's `Config::infer`, kubectl) acts as
    /// the pod's service account and RBAC applies.
    async fn identity(&self, pod: &Pod, namespace: &str) -> Result<PathBuf, PodError> {
        let token = self.token(pod, namespace).await?;
        let path = self.dir.join("kubeconfig");
        crate::control_plane::write_kubeconfig(&path, &self.ctx.server, &self.ctx.ca_pem, &token, Some(namespace))
            .map_err(|e| PodError::NotReady(format!("writing kubeconfig: {e}")))?;
        Ok(path)
    }

    async fn container(
        &self,
        pod: &Pod,
        namespace: &str,
        container: &Container,
        volumes: &BTreeMap<String, PathBuf>,
        kubeconfig: Option<&Path>,
    ) -> Result<Prepared, PodError> {
        let image = container.image.clone().unwrap_or_default();
        let (image_name, program) = self.ctx.images.resolve(&image).map_err(PodError::Unsupported)?;
        for (what, set) in [
            ("lifecycle hooks", container.lifecycle.is_some()),
            ("startup probes", container.startup_probe.is_some()),
            (
                "exec probes",
                container
                    .liveness_probe
                    .as_ref()
                    .or(container.readiness_probe.as_ref())
                    .is_some_and(|p| p.exec.is_some()),
            ),
        ] {
            if set {
                return Err(PodError::Unsupported(format!("container '{}': {what} are not emulated", container.name)));
            }
        }
        let container_dir = self.dir.join("containers").join(&container.name);
        std::fs::create_dir_all(&container_dir).map_err(|e| PodError::NotReady(e.to_string()))?;

        let mut paths = PathMap::default();
        for mount in container.volume_mounts.iter().flatten() {
            let base = volumes.get(&mount.name).ok_or_else(|| {
                PodError::Unsupported(format!("container '{}' mounts unknown volume '{}'", container.name, mount.name))
            })?;
            let host = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) if sub.split('/').any(|s| s == "..") => {
                    return Err(PodError::Unsupported(format!("subPath '{sub}' escapes its volume")));
                }
                Some(sub) => base.join(sub),
                None => base.clone(),
            };
            std::fs::create_dir_all(&host).map_err(|e| PodError::NotReady(e.to_string()))?;
            paths.add(&mount.mount_path, host);
        }
        let termination_path =
            container.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into());
        let termination_log = container_dir.join("termination-log");
        let _ = std::fs::remove_file(&termination_log);
        paths.add(&termination_path, termination_log.clone());

        let mut env: Vec<(String, String)> = Vec::new();
        for source in container.env_from.iter().flatten() {
            let prefix = source.prefix.clone().unwrap_or_default();
            if let Some(cm) = &source.config_map_ref {
                let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), namespace);
                match api.get_opt(&cm.name).await.ok().flatten() {
                    Some(found) => {
                        env.extend(found.data.unwrap_or_default().into_iter().map(|(k, v)| (format!("{prefix}{k}"), v)))
                    }
                    None if cm.optional == Some(true) => {}
                    None => return Err(PodError::NotReady(format!("configmap '{}' not found", cm.name))),
                }
            }
            if let Some(secret) = &source.secret_ref {
                let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
                match api.get_opt(&secret.name).await.ok().flatten() {
                    Some(found) => env.extend(
                        found
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (format!("{prefix}{k}"), String::from_utf8_lossy(&v.0).into_owned())),
                    ),
                    None if secret.optional == Some(true) => {}
                    None => return Err(PodError::NotReady(format!("secret '{}' not found", secret.name))),
                }
            }
        }
        for var in container.env.iter().flatten() {
            let value = match (&var.value, &var.value_from) {
                (Some(value), _) => expand(value, &env),
                (None, None) => String::new(),
                (None, Some(from)) => {
                    if let Some(field) = &from.field_ref {
                        field_value(pod, &field.field_path).ok_or_else(|| {
                            PodError::Unsupported(format!(
                                "env {}: fieldRef {} is not emulated",
                                var.name, field.field_path
                            ))
                        })?
                    } else if let Some(key) = &from.secret_key_ref {
                        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), namespace);
                        let value = api
                            .get_opt(&key.name)
                            .await
                            .ok()
                            .flatten()
                            .and_then(|s| s.data)
                            .and_then(|d| d.get(&key.key).cloned());
                        match value {
                            Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                            None if key.optional == Some(true) => continue,
                            None => {
                                return Err(PodError::NotReady(format!(
                                    "secret '{}' or its key '{}' not found",
                                    key.name, key.key
                                )));
                            }
                        }
                    } else if let Some(key) = &from.config_map_key_ref {
                        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), namespace);
                        let value = api
                            .get_opt(&key.name)
                            .await
                            .ok()
                            .flatten()
                            .and_then(|c| c.data)
                            .and_then(|d| d.get(&key.key).cloned());
                        match value {
                            Some(v) => v,
                            None if key.optional == Some(true) => continue,
                            None => {
                                return Err(PodError::NotReady(format!(
                                    "configmap '{}' or its key '{}' not found",
                                    key.name, key.key
                                )));
                            }
                        }
                    } else {
                        return Err(PodError::Unsupported(format!("env {}: this valueFrom is not emulated", var.name)));
                    }
                }
            };
            env.retain(|(k, _)| k != &var.name);
            env.push((var.name.clone(), value));
        }
        let ip = pod_ip(&pod.uid().unwrap_or_default());
        let mut env: Vec<(String, String)> =
            env.into_iter().map(|(k, v)| (k, bind_to_pod(&paths.translate(&v), ip))).collect();
        if let Some(kubeconfig) = kubeconfig {
            env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
        }
        env.push(("HOME".into(), container_dir.display().to_string()));
        env.push(("PATH".into(), std::env::var("PATH").unwrap_or_default()));
        env.push(("HOSTNAME".into(), pod.name_any()));

        let program_name = program.file_name().and_then(|n| n.to_str()).unwrap_or(image_name);
        let mut argv = vec![program.display().to_string()];
        match container.command.as_deref() {
            None | Some([]) => {}
            Some([first, rest @ ..]) => {
                let base = first.rsplit('/').next().unwrap_or(first);
                if base != image_name && base != program_name {
                    return Err(PodError::Unsupported(format!(
                        "container '{}': command '{first}' is not the program of image '{image}'",
                        container.name
                    )));
                }
                argv.extend(rest.iter().map(|a| bind_to_pod(&paths.translate(&expand(a, &env)), ip)));
            }
        }
        argv.extend(container.args.iter().flatten().map(|a| bind_to_pod(&paths.translate(&expand(a, &env)), ip)));
        let working_dir = match container.working_dir.as_deref() {
            Some(dir) => paths
                .host_path(dir)
                .ok_or_else(|| PodError::Unsupported(format!("workingDir '{dir}' is not on a mounted volume")))?,
            None => container_dir.clone(),
        };
        Ok(Prepared {
            name: container.name.clone(),
            argv,
            env,
            working_dir,
            termination_log,
            fallback_to_logs: container.termination_message_policy.as_deref() == Some("FallbackToLogsOnError"),
            log: container_dir.join("output.log"),
        })
    }

    /// Runs init containers, then containers, until done, deleted or past the deadline.
    async fn execute(&mut self, prepared: Vec<Prepared>, mut stop: watch::Receiver<bool>) {
        let started = Instant::now();
        let (init, main) = prepared.split_at(self.init.len());
        let mut backoff = Duration::from_millis(500);
        // Init containers, in order; each must succeed.
        for (index, container) in init.iter().enumerate() {
            loop {
                let outcome = self.run_to_exit(true, index, container, &mut stop, started).await;
                match outcome {
                    Exit::Code(0) => break,
                    Exit::Code(_) if self.restart_policy == "Never" => {
                        self.phase = "Failed";
                        self.report().await;
                        return;
                    }
                    Exit::Code(_) => {
                        self.init[index].restarts += 1;
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                    Exit::Stopped => return self.finish_deleted(&[]).await,
                    Exit::Deadline => return self.fail_deadline().await,
                }
            }
        }
        // Containers, concurrently; polled, which keeps the logic plain.
        let mut children: Vec<Option<(tokio::process::Child, Time)>> = Vec::new();
        for (index, container) in main.iter().enumerate() {
            children.push(self.start(false, index, container));
        }
        self.phase = "Running";
        self.report().await;
        let mut last_probe: Vec<Option<Instant>> = vec![None; main.len()];
        loop {
            let mut changed = false;
            let mut all_done = true;
            for (index, slot) in children.iter_mut().enumerate() {
                let Some((child, since)) = slot else { continue };
                all_done = false;
                let Ok(Some(status)) = child.try_wait() else { continue };
                let code = status.code().unwrap_or(137);
                self.record_exit(false, index, &main[index], code, since.clone());
                changed = true;
                *slot = None;
                let restart = self.restart_policy == "Always" || (self.restart_policy == "OnFailure" && code != 0);
                if restart {
                    self.main[index].restarts += 1;
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    *slot = self.start(false, index, &main[index]);
                }
            }
            if all_done {
                let failed = self.main.iter().any(|c| !matches!(c.state, State::Terminated { code: 0, .. }));
                self.phase = if failed { "Failed" } else { "Succeeded" };
                self.report().await;
                return;
            }
            changed |= self.probe_readiness(&mut last_probe).await;
            if changed {
                self.report().await;
            }
            if *stop.borrow() {
                let groups: Vec<u32> = children.iter().flatten().filter_map(|(c, _)| c.id()).collect();
                return self.finish_deleted(&groups).await;
            }
            if self.deadline.is_some_and(|d| started.elapsed() > d) {
                for (child, _) in children.iter().flatten() {
                    kill_group(child.id(), Signal::KILL);
                }
                return self.fail_deadline().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.changed() => {}
            }
        }
    }

    /// Probes each running container whose probe is due; `true` when one's
    /// readiness changed. A container started again starts unready.
    async fn probe_readiness(&mut self, last_probe: &mut [Option<Instant>]) -> bool {
        let ip = pod_ip(&self.uid);
        let mut changed = false;
        for (report, last) in self.main.iter_mut().zip(last_probe.iter_mut()) {
            let Some(probe) = report.probe.clone() else { continue };
            let State::Running { started } = &report.state else {
                changed |= std::mem::replace(&mut report.probe_passed, false);
                *last = None;
                continue;
            };
            let running_for = k8s_openapi::jiff::Timestamp::now().duration_since(started.0);
            let due = last.is_none_or(|at| at.elapsed() >= probe.period);
            if running_for.as_secs_f64() < probe.initial_delay.as_secs_f64() || !due {
                continue;
            }
            *last = Some(Instant::now());
            let passed = probe.passes(ip).await;
            changed |= passed != report.probe_passed;
            report.probe_passed = passed;
        }
        changed
    }

    fn start(&mut self, init: bool, index: usize, container: &Prepared) -> Option<(tokio::process::Child, Time)> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&container.log).ok()?;
        let mut command = tokio::process::Command::new(&container.argv[0]);
        command
            .args(&container.argv[1..])
            .env_clear()
            .envs(container.env.iter().cloned())
            .current_dir(&container.working_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().ok()?)
            .stderr(log)
            .kill_on_drop(true)
            .process_group(0);
        let report = if init { &mut self.init[index] } else { &mut self.main[index] };
        match command.spawn() {
            Ok(child) => {
                if let Some(id) = child.id() {
                    self.ctx.process_groups.lock().expect("groups lock").insert(id);
                }
                let since = now();
                report.state = State::Running { started: since.clone() };
                tracing::info!(pod = %self.name, container = %container.name, pid = child.id(), "started");
                Some((child, since))
            }
            Err(error) => {
                report.state = State::Terminated {
                    code: 128,
                    reason: "StartError".into(),
                    message: format!("{}: {error}", container.argv[0]),
                    started: now(),
                    finished: now(),
                };
                None
            }
        }
    }

    fn record_exit(&mut self, init: bool, index: usize, container: &Prepared, code: i32, started: Time) {
        let mut message = std::fs::read(&container.termination_log).unwrap_or_default();
        if message.is_empty() && code != 0 && container.fallback_to_logs {
            message = crate::process::tail(&container.log, 80).into_bytes();
        }
        let start = message.len().saturating_sub(MAX_TERMINATION_MESSAGE);
        let message = String::from_utf8_lossy(&message[start..]).into_owned();
        let report = if init { &mut self.init[index] } else { &mut self.main[index] };
        report.state = State::Terminated {
            code,
            reason: if code == 0 { "Completed".into() } else { "Error".into() },
            message,
            started,
            finished: now(),
        };
        tracing::info!(pod = %self.name, container = %container.name, code, "exited");
    }

    async fn run_to_exit(
        &mut self,
        init: bool,
        index: usize,
        container: &Prepared,
        stop: &mut watch::Receiver<bool>,
        started: Instant,
    ) -> Exit {
        let Some((mut child, since)) = self.start(init, index, container) else { return Exit::Code(128) };
        self.report().await;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let code = status.code().unwrap_or(137);
                self.record_exit(init, index, container, code, since);
                self.report().await;
                return Exit::Code(code);
            }
            if *stop.borrow() {
                let id = child.id();
                self.finish_deleted(&id.into_iter().collect::<Vec<_>>()).await;
                return Exit::Stopped;
            }
            if self.deadline.is_some_and(|d| started.elapsed() > d) {
                kill_group(child.id(), Signal::KILL);
                return Exit::Deadline;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.changed() => {}
            }
        }
    }

    async fn fail_deadline(&mut self) {
        self.phase = "Failed";
        self.reason = Some("DeadlineExceeded".into());
        self.message = Some("Pod was active on the node longer than the specified deadline".into());
        self.report().await;
    }

    /// Stops the pod's processes (SIGTERM, then SIGKILL after the grace
    /// period) and removes the pod object, as a kubelet confirms deletion.
    async fn finish_deleted(&mut self, groups: &[u32]) {
        for &group in groups {
            kill_group(Some(group), Signal::TERM);
        }
        if !groups.is_empty() {
            tokio::time::sleep(self.grace).await;
        }
        for &group in groups {
            kill_group(Some(group), Signal::KILL);
        }
        tracing::info!(pod = %self.name, "stopped for deletion");
        // A kubelet moves a deleted pod that had not finished to phase
        // Failed before it confirms the deletion. A Job with a
        // podFailurePolicy (podReplacementPolicy Failed) replaces a pod only
        // once it is terminal, so without this its deleted pod would hang
        // on the Job's tracking finalizer and never be replaced.
        for report in self.init.iter_mut().chain(self.main.iter_mut()) {
            if let State::Running { started } = &report.state {
                let started = started.clone();
                report.state = State::Terminated {
                    code: 137,
                    reason: "Error".into(),
                    message: String::new(),
                    started,
                    finished: now(),
                };
            }
        }
        self.phase = "Failed";
        self.report().await;
        delete_now(&self.api, self.name.split('/').nth(1).unwrap_or_default(), &self.uid).await;
    }
}

/// Whether a pod's containers are restarted whatever their exit
/// (restartPolicy Always, the default).
pub fn restarts_always(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always") == "Always"
}

/// Reports a pod whose processes died with an earlier agent of this node
/// as a kubelet back from a reboot does: Failed, each container that had
/// not finished terminated with 137 and ContainerStatusUnknown. A Job
/// then counts the failure and starts another pod.
pub async fn report_lost(ctx: Arc<AgentContext>, pod: Pod) {
    let mut runner = PodRunner::new(ctx, &pod);
    let finished_init: Vec<String> = pod
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0))
        .map(|c| c.name)
        .collect();
    let since = pod.status.as_ref().and_then(|s| s.start_time.clone()).unwrap_or_else(now);
    for report in runner.init.iter_mut().chain(runner.main.iter_mut()) {
        let completed = finished_init.contains(&report.name);
        report.state = State::Terminated {
            code: if completed { 0 } else { 137 },
            reason: if completed { "Completed".into() } else { "ContainerStatusUnknown".into() },
            message: if completed {
                String::new()
            } else {
                "The container could not be located when the pod was terminated".into()
            },
            started: since.clone(),
            finished: now(),
        };
    }
    runner.phase = "Failed";
    runner.started = since;
    tracing::info!(pod = %runner.name, "lost with the node's previous agent");
    runner.report().await;
}

/// How a container run ended.
enum Exit {
    Code(i32),
    Stopped,
    Deadline,
}

/// Deletes a pod object with no grace period, as the kubelet does once the
/// pod's processes are gone.
pub async fn delete_now(api: &Api<Pod>, name: &str, uid: &str) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(uid.to_owned()), resource_version: None }),
        ..DeleteParams::default()
    };
    if let Err(error) = api.delete(name, &params).await {
        tracing::debug!(%name, %error, "final delete failed (already gone?)");
    }
}

fn kill_group(id: Option<u32>, signal: Signal) {
    if let Some(pid) = id.and_then(|id| Pid::from_raw(id as i32)) {
        let _ = kill_process_group(pid, signal);
    }
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), PodError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| PodError::NotReady(e.to_string()))?;
    }
    std::fs::write(path, data).map_err(|e| PodError::NotReady(format!("writing {}: {e}", path.display())))
}

/// Values of the downward-API fields the agent supports.
fn field_value(pod: &Pod, field: &str) -> Option<String> {
    let meta = &pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        let key = field.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.as_ref().and_then(|m| m.get(key).cloned()).unwrap_or_default())
    };
    match field {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => pod.spec.as_ref().and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => Some(pod_ip(&meta.uid.clone().unwrap_or_default()).to_string()),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        f if f.starts_with("metadata.labels['") => lookup(&meta.labels, "metadata.labels['"),
        f if f.starts_with("metadata.annotations['") => lookup(&meta.annotations, "metadata.annotations['"),
        _ => None,
    }
}

/// Kubernetes `$(VAR)` expansion of env values, commands and arguments
/// (`$$` escapes; unknown references stay as written).
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(pos) = rest.find('$') {
        out.push_str(&rest[..pos]);
        let after = &rest[pos + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(body) = after.strip_prefix('(')
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&rest[pos..pos + 3 + end]),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_references_expand_like_the_kubelet() {
        let env = vec![("JOB_COMPLETION_INDEX".to_owned(), "2".to_owned())];
        assert_eq!(expand("--shard=$(JOB_COMPLETION_INDEX)/3", &env), "--shard=2/3");
        assert_eq!(expand("$$(JOB_COMPLETION_INDEX)", &env), "$(JOB_COMPLETION_INDEX)");
        assert_eq!(expand("$(MISSING) $", &env), "$(MISSING) $");
    }
}
