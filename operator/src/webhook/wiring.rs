//! How a training pod asks for staged data, and what the webhook adds to it
//! (pure, unit-tested without a cluster).
//!
//! A pod opts in with `ferry.dev/datastage: NAME` as a label (one
//! DataStage) or as an annotation (`a,b`: several), in its own namespace.
//! It gets, per DataStage, the volume the data is staged onto mounted
//! read-only in every container, at `ferry.dev/mount-path` (default
//! `/data`; with several DataStages, `<mount-path>/<name>`): for
//! node-local data the claim `ferry-NAME` Ferry binds in the namespace to
//! its volume on the nodes ([`crate::volumes`]), never a hostPath, so the
//! pod passes Pod Security's `restricted` level; for a claim, that claim.
//! And one
//! scheduling gate, `ferry.dev/data-ready`, which the operator lifts once
//! every DataStage is ready. The label `ferry.dev/data-gated=true` lets the
//! operator watch only the pods it gated.
//!
//! A DataStage that does not exist at admission cannot be mounted (a pod's
//! volumes are fixed at creation): the pod is still gated, its annotation
//! `ferry.dev/unmounted` names it, and the operator says so in an Event.

use std::collections::BTreeSet;

use ferry_crds::DataStage;
use ferry_crds::plan::{Direction, Volume};
use json_patch::{AddOperation, Patch, PatchOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;
use serde_json::{Value, json};

use ferry_crds::names;

/// Label or annotation naming the DataStage(s) a pod reads (annotation:
/// comma-separated). The operator's own workers carry it as a label too,
/// with [`names::WORKER`]; those are never wired.
pub const DATASTAGE_KEY: &str = names::DATASTAGE;
/// Annotation: where the data appears in the pod's containers.
pub const MOUNT_PATH_ANNOTATION: &str = names::MOUNT_PATH;
/// Where the data appears when the pod does not say.
pub const DEFAULT_MOUNT_PATH: &str = "/data";
/// The scheduling gate held until the data is ready.
pub const DATA_READY_GATE: &str = names::DATA_READY_GATE;
/// Label on pods the webhook gated, so the operator watches only those.
pub const GATED_LABEL: &str = names::GATED;
/// Annotation naming DataStages that did not exist at admission.
pub const UNMOUNTED_ANNOTATION: &str = names::UNMOUNTED;

/// Why a pod cannot be admitted as it is; the message says what to fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WiringError {
    /// The label or annotation names no valid DataStage.
    #[error("{DATASTAGE_KEY} names no DataStage ('{0}'): give a DataStage name, or several separated by commas")]
    NoNames(String),
    /// The mount path is not absolute.
    #[error("{MOUNT_PATH_ANNOTATION} must be an absolute path, got '{0}'")]
    RelativeMountPath(String),
    /// A container already mounts something where the data would go.
    #[error("container {container} already mounts {path}: set the annotation {MOUNT_PATH_ANNOTATION} to a free path")]
    MountPathTaken {
        /// The container.
        container: String,
        /// The path.
        path: String,
    },
    /// The DataStage pushes data; there is nothing to read.
    #[error("DataStage {0} is a push (volume to object storage): name a pull DataStage")]
    Push(String),
    /// The DataStage's spec has no volume to mount.
    #[error("DataStage {0} names no volume to mount")]
    NoVolume(String),
}

/// What a pod asks for, read from its labels and annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataRequest {
    /// DataStage names, in the order given, without repeats.
    pub names: Vec<String>,
    /// Base mount path.
    pub mount_path: String,
}

impl DataRequest {
    /// What `pod` asks for: `Ok(None)` when it does not opt in, or is one
    /// of Ferry's own pods (a worker, or a clean-up that removes staged
    /// data: wired, it would wait behind the gate for the data it removes).
    ///
    /// # Errors
    /// When the label or annotation is present but unusable.
    pub fn of(pod: &Pod) -> Result<Option<Self>, WiringError> {
        let labels = pod.metadata.labels.as_ref();
        let annotations = pod.metadata.annotations.as_ref();
        if labels.is_some_and(|l| {
            l.contains_key(names::WORKER) || l.contains_key(names::CLEANUP) || l.contains_key(names::VERSIONS)
        }) {
            return Ok(None);
        }
        let label = labels.and_then(|l| l.get(DATASTAGE_KEY));
        let annotation = annotations.and_then(|a| a.get(DATASTAGE_KEY));
        if label.is_none() && annotation.is_none() {
            return Ok(None);
        }
        let mut names = Vec::new();
        for name in label.into_iter().chain(annotation).flat_map(|v| v.split(',')).map(str::trim) {
            if !name.is_empty() && !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        if names.is_empty() {
            return Err(WiringError::NoNames(annotation.or(label).cloned().unwrap_or_default()));
        }
        let mount_path =
            annotations.and_then(|a| a.get(MOUNT_PATH_ANNOTATION)).map_or(DEFAULT_MOUNT_PATH, String::as_str);
        if !mount_path.starts_with('/') {
            return Err(WiringError::RelativeMountPath(mount_path.to_owned()));
        }
        let mount_path = if mount_path == "/" { "/".to_owned() } else { mount_path.trim_end_matches('/').to_owned() };
        Ok(Some(Self { names, mount_path }))
    }

    /// Where DataStage `name` appears in the containers.
    pub fn mount_path_of(&self, name: &str) -> String {
        if self.names.len() == 1 {
            self.mount_path.clone()
        } else {
            format!("{}/{name}", self.mount_path.trim_end_matches('/'))
        }
    }
}

/// The pod volume name for DataStage `name`: a DNS label, stable, distinct
/// per DataStage (names may hold dots and run to 253 characters).
pub fn volume_name(name: &str) -> String {
    let readable = format!("ferry-{}", name.replace('.', "-"));
    if readable.len() <= 63 && !name.contains('.') {
        return readable;
    }
    let hash = ferry_contract::hash::fnv1a(name.as_bytes());
    format!("{}-{hash:016x}", &readable[..readable.len().min(46)].trim_end_matches('-'))
}

/// The JSON patch that wires `pod` to its DataStages (`found[i]` is the
/// DataStage named `request.names[i]`, if it exists). Idempotent: a pod
/// already wired (a re-invocation) gets an empty patch.
///
/// # Errors
/// When a DataStage cannot be mounted or a container's mount collides.
pub fn wire(pod: &Pod, request: &DataRequest, found: &[Option<&DataStage>]) -> Result<Patch, WiringError> {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut ops = Vec::new();
    let existing_volumes: BTreeSet<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let mut unmounted = Vec::new();
    for (name, ds) in request.names.iter().zip(found) {
        let Some(ds) = ds else {
            unmounted.push(name.as_str());
            continue;
        };
        let volume = volume_name(name);
        if existing_volumes.contains(volume.as_str()) {
            continue;
        }
        let plan = ds.spec.plan().map_err(|_| WiringError::NoVolume(name.clone()))?;
        if plan.direction == Direction::Push {
            return Err(WiringError::Push(name.clone()));
        }
        // A versioned pull's pods mount the link to the current version,
        // which the kubelet resolves as the container starts.
        let current = ds.spec.versioned().then_some(ferry_contract::layout::CURRENT_LINK);
        let (source, sub_path) = match plan.volume {
            // Node-local data: the claim Ferry binds in the pod's namespace
            // to its volume on the nodes that hold a copy, read-only (and
            // its volume mounts read-only whatever a pod asks). Its path is
            // the version link for a versioned pull: no subPath.
            Volume::HostPath(_) | Volume::NodeCache(_) => {
                let claim = crate::volumes::claim_name(&ds.name_any());
                (json!({"persistentVolumeClaim": {"claimName": claim, "readOnly": true}}), None)
            }
            Volume::Claim { name: claim, sub_path } => {
                let sub_path = match (current, sub_path) {
                    (Some(link), Some(sub)) => Some(format!("{}/{link}", sub.trim_end_matches('/'))),
                    (Some(link), None) => Some(link.to_owned()),
                    (None, sub) => sub.map(str::to_owned),
                };
                (json!({"persistentVolumeClaim": {"claimName": claim, "readOnly": true}}), sub_path)
            }
        };
        let mut volume_json = json!({"name": volume});
        merge(&mut volume_json, source);
        volumes.push(volume_json);
        let mut mount = json!({"name": volume, "mountPath": request.mount_path_of(name), "readOnly": true});
        if let Some(sub_path) = sub_path {
            mount["subPath"] = json!(sub_path);
        }
        mounts.push(mount);
    }

    for (field, containers) in
        [("containers", Some(&spec.containers)), ("initContainers", spec.init_containers.as_ref())]
    {
        for (index, container) in containers.into_iter().flatten().enumerate() {
            let taken: BTreeSet<&str> =
                container.volume_mounts.iter().flatten().map(|m| m.mount_path.trim_end_matches('/')).collect();
            if let Some(clash) = mounts.iter().find(|m| taken.contains(m["mountPath"].as_str().unwrap_or_default())) {
                return Err(WiringError::MountPathTaken {
                    container: container.name.clone(),
                    path: clash["mountPath"].as_str().unwrap_or_default().to_owned(),
                });
            }
            let base = format!("/spec/{field}/{index}/volumeMounts");
            append_all(&mut ops, &base, container.volume_mounts.is_some(), &mounts);
        }
    }
    append_all(&mut ops, "/spec/volumes", spec.volumes.is_some(), &volumes);

    let gated = spec.scheduling_gates.iter().flatten().any(|g| g.name == DATA_READY_GATE);
    if !gated {
        append_all(
            &mut ops,
            "/spec/schedulingGates",
            spec.scheduling_gates.is_some(),
            &[json!({"name": DATA_READY_GATE})],
        );
        let labels = pod.metadata.labels.is_some();
        set_key(&mut ops, "/metadata/labels", labels, GATED_LABEL, "true");
        if !unmounted.is_empty() {
            let annotations = pod.metadata.annotations.is_some();
            set_key(&mut ops, "/metadata/annotations", annotations, UNMOUNTED_ANNOTATION, &unmounted.join(","));
        }
    }
    Ok(Patch(ops))
}

fn merge(into: &mut Value, from: Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        into.extend(from);
    }
}

/// Appends `items` to the array at `path`, creating it when absent.
fn append_all(ops: &mut Vec<PatchOperation>, path: &str, exists: bool, items: &[Value]) {
    if items.is_empty() {
        return;
    }
    if !exists {
        ops.push(add(path, Value::Array(items.to_vec())));
        return;
    }
    for item in items {
        ops.push(add(&format!("{path}/-"), item.clone()));
    }
}

/// Sets `key` in the string map at `path`, creating the map when absent.
fn set_key(ops: &mut Vec<PatchOperation>, path: &str, exists: bool, key: &str, value: &str) {
    if exists {
        let pointer = PointerBuf::parse(path).expect("a valid pointer").with_trailing_token(key);
        ops.push(PatchOperation::Add(AddOperation { path: pointer, value: json!(value) }));
    } else {
        ops.push(add(path, json!({ key: value })));
    }
}

fn add(path: &str, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path: PointerBuf::parse(path).expect("a valid pointer"), value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn stage(name: &str, volume: Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name, "namespace": "n"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": volume}},
        }))
        .unwrap()
    }

    fn applied(pod_json: &Value, patch: &Patch) -> Value {
        let mut out = pod_json.clone();
        json_patch::patch(&mut out, patch).unwrap();
        out
    }

    #[test]
    fn pods_opt_in_by_label_or_annotation_and_workers_never_do() {
        let plain = pod(json!({"metadata": {"name": "p"}}));
        assert_eq!(DataRequest::of(&plain), Ok(None));
        let labelled = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a"}}}));
        assert_eq!(DataRequest::of(&labelled).unwrap().unwrap().names, ["a"]);
        let both = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a"},
            "annotations": {"ferry.dev/datastage": "b, a,c", "ferry.dev/mount-path": "/mnt/in/"}}}));
        let request = DataRequest::of(&both).unwrap().unwrap();
        assert_eq!(
            (request.names, request.mount_path.as_str()),
            (vec!["a".to_owned(), "b".into(), "c".into()], "/mnt/in")
        );
        let request = DataRequest::of(&both).unwrap().unwrap();
        assert_eq!(request.mount_path_of("b"), "/mnt/in/b");
        let worker = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a", "ferry.dev/worker": "node-a"}}}));
        assert_eq!(DataRequest::of(&worker), Ok(None));
        let cleanup = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a", "ferry.dev/cleanup": "node-a"}}}));
        assert_eq!(DataRequest::of(&cleanup), Ok(None));
        let empty = pod(json!({"metadata": {"annotations": {"ferry.dev/datastage": " , "}}}));
        assert!(matches!(DataRequest::of(&empty), Err(WiringError::NoNames(_))));
        let relative = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a"},
            "annotations": {"ferry.dev/mount-path": "data"}}}));
        assert!(matches!(DataRequest::of(&relative), Err(WiringError::RelativeMountPath(_))));
    }

    #[test]
    fn a_pod_gets_read_only_mounts_in_every_container_and_one_gate() {
        let pod_json = json!({"metadata": {"name": "p", "annotations": {"ferry.dev/datastage": "local,shared"}},
            "spec": {"containers": [{"name": "train", "image": "i", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}],
                     "initContainers": [{"name": "prep", "image": "i"}],
                     "volumes": [{"name": "x", "emptyDir": {}}]}});
        let p = pod(pod_json.clone());
        let request = DataRequest::of(&p).unwrap().unwrap();
        let local = stage("local", json!({"nodeCache": "nvme"}));
        let shared = stage("shared", json!({"persistentVolumeClaim": {"claimName": "c", "subPath": "ds"}}));
        let patch = wire(&p, &request, &[Some(&local), Some(&shared)]).unwrap();
        let out = applied(&pod_json, &patch);
        // Node-local data through the claim Ferry binds: no hostPath in a
        // tenant's pod, so Pod Security's restricted level admits it.
        assert_eq!(
            out["spec"]["volumes"][1],
            json!({"name": "ferry-local", "persistentVolumeClaim": {"claimName": "ferry-local", "readOnly": true}})
        );
        let admin = stage("admin", json!({"hostPath": "/mnt/local"}));
        let admins = applied(&pod_json, &wire(&p, &request, &[Some(&admin), Some(&shared)]).unwrap());
        assert_eq!(
            admins["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"], "ferry-admin",
            "an admin's hostPath too"
        );
        assert_eq!(
            out["spec"]["volumes"][2],
            json!({"name": "ferry-shared", "persistentVolumeClaim": {"claimName": "c", "readOnly": true}})
        );
        for container in [&out["spec"]["containers"][0], &out["spec"]["initContainers"][0]] {
            let mounts = container["volumeMounts"].as_array().unwrap();
            assert!(mounts.contains(&json!({"name": "ferry-local", "mountPath": "/data/local", "readOnly": true})));
            assert!(mounts.contains(
                &json!({"name": "ferry-shared", "mountPath": "/data/shared", "readOnly": true, "subPath": "ds"})
            ));
        }
        assert_eq!(out["spec"]["schedulingGates"], json!([{"name": "ferry.dev/data-ready"}]));
        assert_eq!(out["metadata"]["labels"], json!({"ferry.dev/data-gated": "true"}));

        // Wiring the result again changes nothing (webhook re-invocation).
        let again = pod(out.clone());
        assert_eq!(wire(&again, &request, &[Some(&local), Some(&shared)]).unwrap(), Patch(vec![]));
    }

    #[test]
    fn a_versioned_pull_is_mounted_through_its_current_link() {
        let pod_json = json!({"metadata": {"name": "p", "annotations": {"ferry.dev/datastage": "local,shared,bare"}},
            "spec": {"containers": [{"name": "train", "image": "i"}]}});
        let p = pod(pod_json.clone());
        let request = DataRequest::of(&p).unwrap().unwrap();
        let versioned = |mut ds: DataStage| {
            ds.spec.update_strategy = Some(ferry_crds::UpdateStrategy::Versioned);
            ds
        };
        let local = versioned(stage("local", json!({"nodeCache": "nvme"})));
        let shared = versioned(stage("shared", json!({"persistentVolumeClaim": {"claimName": "c", "subPath": "ds"}})));
        let bare = versioned(stage("bare", json!({"persistentVolumeClaim": {"claimName": "c"}})));
        let out = applied(&pod_json, &wire(&p, &request, &[Some(&local), Some(&shared), Some(&bare)]).unwrap());
        // Ferry's volume is the link itself: no subPath.
        assert_eq!(out["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"], "ferry-local");
        let mounts = &out["spec"]["containers"][0]["volumeMounts"];
        assert_eq!(mounts[0].get("subPath"), None);
        assert_eq!(
            (mounts[1]["subPath"].as_str(), mounts[2]["subPath"].as_str()),
            (Some("ds/current"), Some("current"))
        );
        // A versions Job's pod asks for no data, like a worker's.
        let job_pod =
            pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "a", "ferry.dev/versions": "node-a"}}}));
        assert_eq!(DataRequest::of(&job_pod), Ok(None));
    }

    #[test]
    fn a_missing_datastage_is_gated_and_named_but_not_mounted() {
        let pod_json = json!({"metadata": {"labels": {"ferry.dev/datastage": "gone", "app": "t"}},
            "spec": {"containers": [{"name": "c", "image": "i"}], "schedulingGates": [{"name": "other"}]}});
        let p = pod(pod_json.clone());
        let out = applied(&pod_json, &wire(&p, &DataRequest::of(&p).unwrap().unwrap(), &[None]).unwrap());
        assert_eq!(out["spec"]["schedulingGates"], json!([{"name": "other"}, {"name": "ferry.dev/data-ready"}]));
        assert_eq!(out["metadata"]["annotations"], json!({"ferry.dev/unmounted": "gone"}));
        assert_eq!(out["metadata"]["labels"]["ferry.dev/data-gated"], "true");
        assert!(out["spec"].get("volumes").is_none());
    }

    #[test]
    fn collisions_and_pushes_are_refused_with_what_to_fix() {
        let p = pod(json!({"metadata": {"labels": {"ferry.dev/datastage": "d"}},
            "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": [{"name": "v", "mountPath": "/data/"}]}]}}));
        let request = DataRequest::of(&p).unwrap().unwrap();
        let ds = stage("d", json!({"hostPath": "/mnt/d"}));
        let error = wire(&p, &request, &[Some(&ds)]).unwrap_err();
        assert_eq!(error, WiringError::MountPathTaken { container: "c".into(), path: "/data".into() });
        assert!(error.to_string().contains("ferry.dev/mount-path"));

        let mut push = stage("d", json!({"hostPath": "/mnt/d"}));
        std::mem::swap(&mut push.spec.source, &mut push.spec.destination);
        assert_eq!(wire(&p, &request, &[Some(&push)]).unwrap_err(), WiringError::Push("d".into()));
    }

    #[test]
    fn volume_names_are_dns_labels_and_distinct() {
        assert_eq!(volume_name("demo-v1"), "ferry-demo-v1");
        let dotted = volume_name("demo.v1");
        assert_ne!(dotted, volume_name("demo-v1"));
        let long = volume_name(&"x".repeat(253));
        for name in [dotted, long] {
            assert!(name.len() <= 63 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{name}");
        }
    }
}
