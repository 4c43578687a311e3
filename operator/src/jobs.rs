//! Pure builders: from a DataStage (and the nodes it may use) to the worker
//! Jobs that carry it out. No client here, so every shape is unit-tested
//! without a cluster.
//!
//! A hostPath volume is node-local, so a DataStage with one gets one Job
//! per matching node, pinned to it. A claim is shared, so it gets one
//! Indexed Job whose `JOB_COMPLETION_INDEX` picks the stager's `--shard`.

use std::collections::BTreeMap;

use ferry_crds::{DataStage, DataStageSpec, Location, VerifyMode};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;

/// Label on every child object: the owning DataStage's name.
pub const DATASTAGE_LABEL: &str = "ferry.dev/datastage";
/// Label on every child object: the worker's name.
pub const WORKER_LABEL: &str = "ferry.dev/worker";
/// Label on clean-up Jobs: the worker whose data they remove.
pub const CLEANUP_LABEL: &str = "ferry.dev/cleanup";
/// Where the volume is mounted in worker pods.
pub const DATA_MOUNT: &str = "/ferry/data";
/// Where a `gs://` credentials Secret (`key.json`) is mounted in worker pods.
pub const GCS_KEY_MOUNT: &str = "/var/run/secrets/ferry/gcs";
/// Which node label pins a per-node worker.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Which way data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Object storage → volume.
    Pull,
    /// Volume → object storage.
    Push,
}

/// One worker of a DataStage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// Its name: the node for per-node workers, `shared` for a claim.
    pub name: String,
    /// The node it is pinned to (per-node workers).
    pub node: Option<String>,
}

/// The direction and the object-storage and volume sides of a spec.
pub fn sides(spec: &DataStageSpec) -> (Direction, &Location, &Location) {
    if spec.source.uri.is_some() {
        (Direction::Pull, &spec.source, &spec.destination)
    } else {
        (Direction::Push, &spec.destination, &spec.source)
    }
}

/// Whether the DataStage needs one worker per node (a hostPath volume is
/// node-local), so that planning it needs the cluster's nodes.
pub fn per_node(spec: &DataStageSpec) -> bool {
    let (_, _, volume_side) = sides(spec);
    volume_side.volume.as_ref().is_some_and(|v| v.host_path.is_some())
}

/// The workers a DataStage needs, given the cluster's nodes.
pub fn plan_workers(spec: &DataStageSpec, nodes: &[Node]) -> Vec<Worker> {
    if !per_node(spec) {
        return vec![Worker { name: "shared".into(), node: None }];
    }
    let selector = spec.placement.as_ref().and_then(|p| p.node_selector.clone()).unwrap_or_default();
    let mut workers: Vec<Worker> = nodes
        .iter()
        .filter(|node| !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
        .filter(|node| {
            let labels = node.labels();
            selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        })
        .map(|node| Worker { name: node.name_any(), node: Some(node.name_any()) })
        .collect();
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    workers
}

/// The Job name of a worker: `<datastage>-<worker>`, cut to 63 characters.
pub fn job_name(datastage: &str, worker: &Worker) -> String {
    let mut name = format!("{datastage}-{}", worker.name);
    name.truncate(63);
    name.trim_end_matches('-').to_owned()
}

/// The stager's command line for `worker` of DataStage `namespace/name`.
pub fn stager_args_for(spec: &DataStageSpec, namespace: &str, name: &str, worker: &Worker) -> Vec<String> {
    let mut args = stager_args(spec);
    // Running workers write their own entry of the DataStage's status.
    args.extend(["--report-to".to_owned(), format!("{namespace}/{name}"), "--worker".to_owned(), worker.name.clone()]);
    args
}

/// The stager's command line for a spec.
pub fn stager_args(spec: &DataStageSpec) -> Vec<String> {
    let (direction, store, _) = sides(spec);
    let uri = store.uri.clone().unwrap_or_default();
    let mut args = match direction {
        Direction::Pull => vec!["pull".to_owned(), uri, DATA_MOUNT.to_owned()],
        Direction::Push => vec!["push".to_owned(), DATA_MOUNT.to_owned(), uri],
    };
    if let Some(endpoint) = &store.endpoint {
        args.extend(["--endpoint-url".to_owned(), endpoint.clone()]);
    }
    if store.anonymous == Some(true) {
        args.push("--anonymous".to_owned());
    }
    if let Some(region) = &store.region {
        args.extend(["--region".to_owned(), region.clone()]);
    }
    for glob in &spec.include {
        args.extend(["--include".to_owned(), glob.clone()]);
    }
    for glob in &spec.exclude {
        args.extend(["--exclude".to_owned(), glob.clone()]);
    }
    if let Some(transfer) = &spec.transfer {
        if let Some(concurrency) = transfer.concurrency {
            args.extend(["--concurrency".to_owned(), concurrency.to_string()]);
        }
        if let Some(part) = &transfer.part_size {
            args.extend(["--part-size".to_owned(), part.clone()]);
        }
        if let Some(limit) = &transfer.memory_limit {
            args.extend(["--memory-limit".to_owned(), limit.clone()]);
        }
        if let Some(rate) = &transfer.max_bandwidth {
            args.extend(["--max-bandwidth".to_owned(), rate.clone()]);
        }
        if let Some(verify) = transfer.verify {
            let mode = match verify {
                VerifyMode::None => "none",
                VerifyMode::Size => "size",
                VerifyMode::Checksum => "checksum",
            };
            args.extend(["--verify".to_owned(), mode.to_owned()]);
        }
    }
    if spec.workers.unwrap_or(1) > 1 {
        args.extend(["--shard".to_owned(), format!("$(JOB_COMPLETION_INDEX)/{}", spec.workers.unwrap_or(1))]);
    }
    // The summary becomes the pod's termination message, which the operator reads.
    args.extend([
        "--summary-file".to_owned(),
        "/dev/termination-log".to_owned(),
        "--log-format".to_owned(),
        "json".to_owned(),
        "--progress".to_owned(),
        "always".to_owned(),
    ]);
    args
}

/// What a Job of a DataStage does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Copies data (a worker); owned by the DataStage.
    Transfer,
    /// Removes staged data after the DataStage was deleted (`reclaimPolicy:
    /// Delete`). Not owned: the garbage collector must not race it while
    /// the DataStage is going away; the operator deletes it when done.
    Cleanup,
}

/// Name of the worker container port that serves the stager's metrics
/// (what a PodMonitor selects).
pub const METRICS_PORT_NAME: &str = "metrics";

/// What worker pods get from the operator's configuration unless their
/// DataStage says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerDefaults {
    /// The stager image (`spec.image` overrides it).
    pub image: String,
    /// The ServiceAccount (`spec.serviceAccountName` overrides it); `None`:
    /// the namespace's `default`.
    pub service_account: Option<String>,
    /// Where transfer workers serve Prometheus metrics; `None`: nowhere.
    pub metrics_port: Option<u16>,
}

impl WorkerDefaults {
    /// Defaults with only an image: no ServiceAccount, no metrics port.
    pub fn image(image: &str) -> Self {
        Self { image: image.to_owned(), service_account: None, metrics_port: None }
    }
}

/// The worker Job for `worker`, owned by the DataStage.
pub fn build_job(ds: &DataStage, worker: &Worker, defaults: &WorkerDefaults) -> Job {
    pod_job(ds, worker, defaults, Role::Transfer)
}

/// The Job that removes what `worker` staged, for `reclaimPolicy: Delete`.
pub fn build_cleanup_job(ds: &DataStage, worker: &Worker, defaults: &WorkerDefaults) -> Job {
    pod_job(ds, worker, defaults, Role::Cleanup)
}

/// The name of the clean-up Job of a worker: the worker Job's name, cut to
/// leave room for `-clean`.
pub fn cleanup_job_name(datastage: &str, worker: &Worker) -> String {
    let mut name = job_name(datastage, worker);
    name.truncate(57);
    format!("{}-clean", name.trim_end_matches('-'))
}

/// Exit codes of the stager that no retry can fix (usage error, store
/// refused the run): its Job fails at once instead of burning retries.
const STAGER_EXIT_PERMANENT: [i32; 2] = [2, 4];

fn pod_job(ds: &DataStage, worker: &Worker, defaults: &WorkerDefaults, role: Role) -> Job {
    let spec = &ds.spec;
    let name = ds.name_any();
    let (_, store, volume_side) = sides(spec);
    let mut labels = BTreeMap::from([
        (DATASTAGE_LABEL.to_owned(), name.clone()),
        ("app.kubernetes.io/name".to_owned(), "ferry-stager".to_owned()),
        ("app.kubernetes.io/managed-by".to_owned(), "ferry-operator".to_owned()),
    ]);
    match role {
        Role::Transfer => labels.insert(WORKER_LABEL.to_owned(), worker.name.clone()),
        Role::Cleanup => labels.insert(CLEANUP_LABEL.to_owned(), worker.name.clone()),
    };

    let volume = match volume_side.volume.as_ref() {
        Some(v) if v.host_path.is_some() => {
            json!({"name": "data", "hostPath": {"path": v.host_path, "type": "DirectoryOrCreate"}})
        }
        Some(v) => json!({"name": "data", "persistentVolumeClaim": {
            "claimName": v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone()).unwrap_or_default()}}),
        None => json!({"name": "data", "emptyDir": {}}),
    };
    let sub_path =
        volume_side.volume.as_ref().and_then(|v| v.persistent_volume_claim.as_ref()).and_then(|c| c.sub_path.clone());
    let mut mount = json!({"name": "data", "mountPath": DATA_MOUNT});
    if let Some(sub_path) = sub_path {
        mount["subPath"] = sub_path.into();
    }

    let gcs = store.uri.as_deref().is_some_and(|u| u.starts_with("gs://"));
    let mut env = Vec::new();
    let mut volumes = vec![volume];
    let mut mounts = vec![mount];
    match &store.credentials {
        // A service-account key: Application Default Credentials read the file.
        Some(secret) if gcs => {
            env.push(json!({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": format!("{GCS_KEY_MOUNT}/key.json")}));
            volumes.push(json!({"name": "gcs-key", "secret": {"secretName": secret.name, "items": [{"key": "key.json", "path": "key.json"}]}}));
            mounts.push(json!({"name": "gcs-key", "mountPath": GCS_KEY_MOUNT, "readOnly": true}));
        }
        Some(secret) => {
            for (key, optional) in
                [("AWS_ACCESS_KEY_ID", false), ("AWS_SECRET_ACCESS_KEY", false), ("AWS_SESSION_TOKEN", true)]
            {
                env.push(json!({"name": key, "valueFrom": {"secretKeyRef": {"name": secret.name, "key": key, "optional": optional}}}));
            }
        }
        // Without a Secret the pod's own identity (IRSA, GKE Workload
        // Identity, instance role) is the credential.
        None => {}
    }

    let placement = spec.placement.clone().unwrap_or_default();
    // A per-node worker is pinned to its node (the placement already chose
    // it); a shared-volume worker goes wherever the placement allows.
    let node_selector = match &worker.node {
        Some(node) => Some(json!({HOSTNAME_LABEL: node})),
        None => placement.node_selector.as_ref().map(|s| json!(s)),
    };
    let completions = match role {
        Role::Transfer => spec.workers.filter(|_| worker.node.is_none()).unwrap_or(1).max(1),
        Role::Cleanup => 1,
    };
    // Transfer workers serve metrics on a named port for a PodMonitor to
    // find; the wildcard address because the pod IP is the pod's own.
    let metrics_port = defaults.metrics_port.filter(|_| role == Role::Transfer);
    let mut transfer_args = stager_args_for(spec, &ds.namespace().unwrap_or_default(), &name, worker);
    if let Some(port) = metrics_port {
        transfer_args.push(format!("--metrics-addr=0.0.0.0:{port}"));
    }
    let ports = metrics_port.map(|port| json!([{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}]));
    let (job_name, args, env, owners, backoff_limit, deadline, ttl, failure_policy) = match role {
        Role::Transfer => (
            job_name(&name, worker),
            transfer_args,
            env_with_node(env),
            json!([ds.controller_owner_ref(&()).expect("a DataStage from the API has a name and uid")]),
            spec.backoff_limit.unwrap_or(3),
            spec.active_deadline_seconds,
            spec.ttl_seconds_after_finished,
            json!({"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "stager", "operator": "In", "values": STAGER_EXIT_PERMANENT}},
                // A pod evicted or preempted did nothing wrong: do not count it.
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            ]}),
        ),
        Role::Cleanup => (
            cleanup_job_name(&name, worker),
            vec!["clean".to_owned(), DATA_MOUNT.to_owned(), "--log-format".to_owned(), "json".to_owned()],
            Vec::new(),
            serde_json::Value::Null,
            3,
            Some(600),
            Some(300),
            serde_json::Value::Null,
        ),
    };
    let job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": ds.namespace(),
            "labels": labels,
            "ownerReferences": owners,
        },
        "spec": {
            "completionMode": if completions > 1 { "Indexed" } else { "NonIndexed" },
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": deadline,
            "ttlSecondsAfterFinished": ttl,
            "podFailurePolicy": failure_policy,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": spec.service_account_name.clone().or_else(|| defaults.service_account.clone()),
                    "nodeSelector": node_selector,
                    "tolerations": placement.tolerations,
                    "affinity": if worker.node.is_none() { serde_json::to_value(&placement.affinity).unwrap_or_default() } else { serde_json::Value::Null },
                    "securityContext": {
                        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        "name": "stager",
                        "image": spec.image.clone().unwrap_or_else(|| defaults.image.clone()),
                        "args": args,
                        "ports": ports,
                        "env": env,
                        "resources": spec.resources,
                        "volumeMounts": mounts,
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }],
                    "volumes": volumes,
                },
            },
        },
    });
    serde_json::from_value(strip_nulls(job)).expect("the Job template is a valid Job")
}

/// Adds `NODE_NAME` (downward API), which the stager reports with its progress.
fn env_with_node(mut env: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    env.push(json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}));
    env
}

/// Drops `null` members so optional fields are simply absent.
fn strip_nulls(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => serde_json::Value::Object(
            map.into_iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k, strip_nulls(v))).collect(),
        ),
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datastage(spec: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "imagenet", "namespace": "ml", "uid": "u-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn node(name: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}),
        )
        .unwrap()
    }

    fn pull_to_host_path() -> DataStage {
        datastage(json!({
            "source": {"uri": "s3://datasets/imagenet", "endpoint": "http://minio:9000", "credentials": {"name": "s3"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
            "placement": {"nodeSelector": {"pool": "gpu"}},
            "include": ["*.tar"],
            "transfer": {"concurrency": 16, "verify": "Size"},
        }))
    }

    #[test]
    fn a_host_path_pull_gets_one_pinned_job_per_matching_node() {
        let ds = pull_to_host_path();
        let nodes =
            [node("a", json!({"pool": "gpu"})), node("b", json!({"pool": "cpu"})), node("c", json!({"pool": "gpu"}))];
        let workers = plan_workers(&ds.spec, &nodes);
        assert_eq!(workers.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["a", "c"]);

        let job = build_job(&ds, &workers[1], &WorkerDefaults::image("stager:1"));
        assert_eq!(job.metadata.name.as_deref(), Some("imagenet-c"));
        assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0].kind, "DataStage");
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()[HOSTNAME_LABEL], "c");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let security = pod.security_context.unwrap();
        assert_eq!(security.run_as_non_root, Some(true));
        assert_eq!(security.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some("stager:1"));
        let context = container.security_context.clone().unwrap();
        assert_eq!(context.read_only_root_filesystem, Some(true));
        assert_eq!(context.allow_privilege_escalation, Some(false));
        assert_eq!(context.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        let args = container.args.clone().unwrap();
        assert_eq!(&args[..3], ["pull", "s3://datasets/imagenet", DATA_MOUNT]);
        for pair in [
            ["--endpoint-url", "http://minio:9000"],
            ["--include", "*.tar"],
            ["--concurrency", "16"],
            ["--verify", "size"],
        ] {
            assert!(args.windows(2).any(|w| w == pair), "{pair:?} missing in {args:?}");
        }
        let env = container.env.clone().unwrap();
        let secret_keys: Vec<_> =
            env.iter().filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref()).map(|r| r.key.clone()).collect();
        assert_eq!(secret_keys, ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]);
        assert_eq!(pod.volumes.unwrap()[0].host_path.as_ref().unwrap().path, "/mnt/ferry/imagenet");
    }

    #[test]
    fn workers_get_the_operators_service_account_and_metrics_port_unless_the_spec_names_its_own() {
        let defaults = WorkerDefaults {
            image: "stager:1".into(),
            service_account: Some("ferry-stager".into()),
            metrics_port: Some(9464),
        };
        let worker = Worker { name: "a".into(), node: Some("a".into()) };
        let mut ds = pull_to_host_path();
        let pod = build_job(&ds, &worker, &defaults).spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("ferry-stager"));
        let container = &pod.containers[0];
        let port = &container.ports.as_ref().unwrap()[0];
        assert_eq!((port.name.as_deref(), port.container_port), (Some(METRICS_PORT_NAME), 9464));
        assert!(container.args.as_ref().unwrap().contains(&"--metrics-addr=0.0.0.0:9464".to_owned()));

        ds.spec.service_account_name = Some("trainer".into());
        let pod = build_job(&ds, &worker, &defaults).spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("trainer"));

        // Clean-up Jobs move no data: nothing to scrape.
        let pod = build_cleanup_job(&ds, &worker, &defaults).spec.unwrap().template.spec.unwrap();
        assert!(pod.containers[0].ports.is_none());
        assert!(!pod.containers[0].args.as_ref().unwrap().iter().any(|a| a.starts_with("--metrics-addr")));

        let pod = build_job(&ds, &worker, &WorkerDefaults::image("stager:1")).spec.unwrap().template.spec.unwrap();
        assert!(pod.containers[0].ports.is_none());
    }

    #[test]
    fn a_refused_run_fails_the_job_at_once_and_an_eviction_is_not_counted() {
        let ds = pull_to_host_path();
        let job =
            build_job(&ds, &Worker { name: "a".into(), node: Some("a".into()) }, &WorkerDefaults::image("stager:1"));
        let rules = job.spec.unwrap().pod_failure_policy.unwrap().rules;
        assert_eq!(rules[0].action, "FailJob");
        let codes = rules[0].on_exit_codes.as_ref().unwrap();
        assert_eq!((codes.container_name.as_deref(), codes.values.as_slice()), (Some("stager"), &[2, 4][..]));
        assert_eq!(rules[1].action, "Ignore");
    }

    #[test]
    fn a_cleanup_job_runs_clean_on_the_same_volume_and_node_without_credentials() {
        let ds = pull_to_host_path();
        let worker =
            Worker { name: "node-with-a-rather-long-name-that-goes-on-and-on-and-on".into(), node: Some("n".into()) };
        let job = build_cleanup_job(&ds, &worker, &WorkerDefaults::image("stager:1"));
        let name = job.metadata.name.clone().unwrap();
        assert!(name.ends_with("-clean") && name.len() <= 63, "{name}");
        assert!(job.metadata.owner_references.is_none(), "not collected while the DataStage goes away");
        assert_eq!(job.metadata.labels.as_ref().unwrap()[CLEANUP_LABEL], worker.name);
        assert!(!job.metadata.labels.as_ref().unwrap().contains_key(WORKER_LABEL));
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()[HOSTNAME_LABEL], "n");
        assert_eq!(pod.containers[0].args.clone().unwrap()[..2], ["clean", DATA_MOUNT]);
        assert!(pod.containers[0].env.clone().unwrap_or_default().is_empty(), "no store, no credentials");
        assert_eq!(pod.volumes.unwrap()[0].host_path.as_ref().unwrap().path, "/mnt/ferry/imagenet");
        assert_eq!(pod.security_context.unwrap().run_as_non_root, Some(true));
    }

    #[test]
    fn a_claim_gets_one_indexed_job_sharded_by_completion_index() {
        let ds = datastage(json!({
            "source": {"uri": "s3://datasets/imagenet"},
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "shared", "subPath": "imagenet"}}},
            "workers": 3,
            "placement": {"nodeSelector": {"pool": "storage"}},
        }));
        let workers = plan_workers(&ds.spec, &[]);
        assert_eq!(workers, [Worker { name: "shared".into(), node: None }]);
        let job = build_job(&ds, &workers[0], &WorkerDefaults::image("stager:1")).spec.unwrap();
        assert_eq!(job.completion_mode.as_deref(), Some("Indexed"));
        assert_eq!((job.completions, job.parallelism), (Some(3), Some(3)));
        let pod = job.template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()["pool"], "storage");
        let args = pod.containers[0].args.clone().unwrap();
        assert!(args.windows(2).any(|w| w == ["--shard", "$(JOB_COMPLETION_INDEX)/3"]), "{args:?}");
        assert_eq!(pod.containers[0].volume_mounts.clone().unwrap()[0].sub_path.as_deref(), Some("imagenet"));
        let env = pod.containers[0].env.clone().unwrap_or_default();
        assert!(env.iter().all(|e| e.name != "AWS_ACCESS_KEY_ID"), "no Secret: the pod's identity is used");
    }

    #[test]
    fn a_gcs_source_gets_its_key_file_mounted_or_goes_anonymous() {
        let ds = datastage(json!({
            "source": {"uri": "gs://datasets/imagenet", "credentials": {"name": "gcs"}},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
        }));
        let worker = Worker { name: "a".into(), node: Some("a".into()) };
        let pod = build_job(&ds, &worker, &WorkerDefaults::image("stager:1")).spec.unwrap().template.spec.unwrap();
        let env = pod.containers[0].env.clone().unwrap();
        let adc = env.iter().find(|e| e.name == "GOOGLE_APPLICATION_CREDENTIALS").unwrap();
        assert_eq!(adc.value.as_deref(), Some("/var/run/secrets/ferry/gcs/key.json"));
        assert!(env.iter().all(|e| !e.name.starts_with("AWS_")));
        let volumes = pod.volumes.unwrap();
        assert_eq!(volumes[1].secret.as_ref().unwrap().secret_name.as_deref(), Some("gcs"));
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        assert_eq!((mounts[1].mount_path.as_str(), mounts[1].read_only), (GCS_KEY_MOUNT, Some(true)));

        let emulator = datastage(json!({
            "source": {"uri": "gs://datasets/imagenet", "endpoint": "http://gcs:4443", "anonymous": true},
            "destination": {"volume": {"hostPath": "/mnt/ferry/imagenet"}},
        }));
        let args = stager_args(&emulator.spec);
        assert!(args.windows(2).any(|w| w == ["--endpoint-url", "http://gcs:4443"]), "{args:?}");
        assert!(args.contains(&"--anonymous".to_owned()), "{args:?}");
    }

    #[test]
    fn a_push_reads_the_volume_and_writes_the_bucket() {
        let ds = datastage(json!({
            "source": {"volume": {"hostPath": "/mnt/ckpt"}},
            "destination": {"uri": "s3://checkpoints/run-1"},
        }));
        let args = stager_args(&ds.spec);
        assert_eq!(&args[..3], ["push", DATA_MOUNT, "s3://checkpoints/run-1"]);
    }
}
