//! Lifts the `ferry.dev/data-ready` scheduling gate of pods the webhook
//! wired, once all their DataStages are ready, and pins node-local data
//! with a required node affinity to the nodes that hold it; the real
//! scheduler then places the pod there and nowhere else.
//!
//! Kubernetes allows narrowing a gated pod's node affinity (setting it, or
//! adding requirements to every existing term), so the affinity and the
//! gate go in one patch, conditional on the pod's resourceVersion.
//!
//! A pod that cannot be given its data stays gated and says why: the
//! annotation `ferry.dev/waiting-for` (shown by `kubectl describe pod`)
//! and an Event (Warning for a missing, failed or unmountable DataStage).
//! To give up, delete the pod, or remove the gate by hand.
//!
//! Only the leader runs this (see [`crate::leader`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::DataStage;
use ferry_crds::readiness::DataReadiness;
use futures::StreamExt as _;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Resource as _, ResourceExt as _};
use serde_json::{Value, json};

use crate::context::Context;
use crate::versions::{POD_VERSIONS_ANNOTATION, PodVersions};
use crate::watch_backoff::WatchBackoff;
use crate::webhook::wiring::{DATA_READY_GATE, DataRequest, GATED_LABEL, UNMOUNTED_ANNOTATION};

/// Annotation saying what a gated pod waits for.
pub const WAITING_FOR_ANNOTATION: &str = "ferry.dev/waiting-for";

/// Why the gate controller could not act on a pod.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
}

/// What to do with a gated pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateDecision {
    /// Lift the gate; `Some(nodes)`: the pod may run only there.
    Lift(Option<BTreeSet<String>>),
    /// Keep it gated.
    Hold {
        /// CamelCase Event reason.
        reason: &'static str,
        /// For a person: what the pod waits for, or what to fix.
        message: String,
        /// Whether it waits for something that will not come by itself.
        warning: bool,
    },
}

/// Decides for a pod asking for `request`, given each named DataStage
/// (`None`: it does not exist) and which were not mounted at admission.
pub fn decide(request: &DataRequest, found: &[Option<&DataStage>], unmounted: &BTreeSet<String>) -> GateDecision {
    let hold = |reason, message: String, warning| GateDecision::Hold { reason, message, warning };
    let mut nodes: Option<BTreeSet<String>> = None;
    let mut waiting = Vec::new();
    for (name, ds) in request.names.iter().zip(found) {
        let Some(ds) = ds else {
            return hold(
                "DataStageNotFound",
                format!("DataStage {name} does not exist in this namespace: create it, or delete this pod"),
                true,
            );
        };
        if unmounted.contains(name) {
            return hold(
                "DataStageNotMounted",
                format!(
                    "DataStage {name} did not exist when this pod was created, so its volume is not mounted: delete this pod (its controller recreates it)"
                ),
                true,
            );
        }
        match ds.data_readiness() {
            DataReadiness::Ready(None) => {}
            DataReadiness::Ready(Some(holding)) => {
                nodes = Some(match nodes {
                    None => holding,
                    Some(so_far) => so_far.intersection(&holding).cloned().collect(),
                });
            }
            DataReadiness::Waiting(what) => waiting.push(what),
            DataReadiness::Failed(why) => {
                return hold("DataStageFailed", format!("DataStage {name} failed: {why}"), true);
            }
        }
    }
    if !waiting.is_empty() {
        return hold("WaitingForData", waiting.join("; "), false);
    }
    match nodes {
        Some(nodes) if nodes.is_empty() => hold(
            "NoNodeHoldsAllData",
            format!(
                "no node holds the data of all of {}: give the DataStages overlapping placements",
                request.names.join(", ")
            ),
            true,
        ),
        nodes => GateDecision::Lift(nodes),
    }
}

/// The patch that lifts the gate (keeping other gates), pins `nodes`,
/// records the `versions` of versioned DataStages current now (see
/// [`crate::versions::PodVersions`]) and drops the gated label, conditional
/// on `pod`'s resourceVersion.
///
/// The API server accepts one node name per `metadata.name` field
/// selector, so a pod without node affinity gets one term per node (terms
/// are ORed). A pod with terms of its own can only have each term narrowed
/// (requirements are ANDed): by its node when there is one, else by the
/// nodes' `kubernetes.io/hostname` labels, `hostnames`.
pub fn lift_patch(
    pod: &Pod,
    nodes: Option<&BTreeSet<String>>,
    hostnames: &BTreeSet<String>,
    versions: &PodVersions,
) -> Patch {
    let pointer = |path: &str| PointerBuf::parse(path).expect("a valid pointer");
    let spec = pod.spec.clone().unwrap_or_default();
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: pointer("/metadata/resourceVersion"),
        value: json!(pod.resource_version()),
    })];
    let gates: Vec<Value> = spec
        .scheduling_gates
        .iter()
        .flatten()
        .filter(|g| g.name != DATA_READY_GATE)
        .map(|g| json!({"name": g.name}))
        .collect();
    ops.push(if gates.is_empty() {
        PatchOperation::Remove(RemoveOperation { path: pointer("/spec/schedulingGates") })
    } else {
        PatchOperation::Replace(ReplaceOperation { path: pointer("/spec/schedulingGates"), value: Value::Array(gates) })
    });
    if let Some(nodes) = nodes {
        let affinity = spec.affinity.as_ref();
        let node_affinity = affinity.and_then(|a| a.node_affinity.as_ref());
        let required = node_affinity.and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
        let add = |path: &str, value: Value| PatchOperation::Add(AddOperation { path: pointer(path), value });
        let by_name = |node: &String| json!({"key": "metadata.name", "operator": "In", "values": [node]});
        let terms: Vec<Value> = nodes.iter().map(|node| json!({"matchFields": [by_name(node)]})).collect();
        let term = json!({"nodeSelectorTerms": terms});
        match required.filter(|r| !r.node_selector_terms.is_empty()) {
            Some(required) => {
                let single = (nodes.len() == 1).then(|| nodes.iter().next()).flatten();
                for (index, existing) in required.node_selector_terms.iter().enumerate() {
                    let base = format!(
                        "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/{index}"
                    );
                    let (field, present, requirement) = match single {
                        Some(node) => ("matchFields", existing.match_fields.is_some(), by_name(node)),
                        None => (
                            "matchExpressions",
                            existing.match_expressions.is_some(),
                            json!({"key": HOSTNAME_LABEL, "operator": "In", "values": hostnames}),
                        ),
                    };
                    ops.push(if present {
                        add(&format!("{base}/{field}/-"), requirement)
                    } else {
                        add(&format!("{base}/{field}"), json!([requirement]))
                    });
                }
            }
            None if node_affinity.is_some() => {
                ops.push(add("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution", term));
            }
            None if affinity.is_some() => {
                ops.push(add(
                    "/spec/affinity/nodeAffinity",
                    json!({"requiredDuringSchedulingIgnoredDuringExecution": term}),
                ));
            }
            None => ops.push(add(
                "/spec/affinity",
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term}}),
            )),
        }
    }
    let labels = PointerBuf::parse("/metadata/labels").expect("a valid pointer").with_trailing_token(GATED_LABEL);
    ops.push(PatchOperation::Remove(RemoveOperation { path: labels }));
    if pod.annotations().contains_key(WAITING_FOR_ANNOTATION) {
        let path = pointer("/metadata/annotations").with_trailing_token(WAITING_FOR_ANNOTATION);
        ops.push(PatchOperation::Remove(RemoveOperation { path }));
    }
    if !versions.0.is_empty() {
        let value = json!(versions.to_annotation());
        ops.push(if pod.metadata.annotations.is_some() {
            let path = pointer("/metadata/annotations").with_trailing_token(POD_VERSIONS_ANNOTATION);
            PatchOperation::Add(AddOperation { path, value })
        } else {
            let path = pointer("/metadata/annotations");
            PatchOperation::Add(AddOperation { path, value: json!({ POD_VERSIONS_ANNOTATION: value }) })
        });
    }
    Patch(ops)
}

/// The node label narrowing a pod's own node-affinity terms to several nodes.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Whether lifting `pod` onto `nodes` narrows terms of its own by hostname.
fn needs_hostnames(pod: &Pod, nodes: &BTreeSet<String>) -> bool {
    let has_terms = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
        .is_some_and(|r| !r.node_selector_terms.is_empty());
    has_terms && nodes.len() > 1
}

async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, GateError> {
    let gated = pod
        .spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .is_some_and(|g| g.iter().any(|g| g.name == DATA_READY_GATE));
    let namespace = pod.namespace().unwrap_or_default();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &namespace);
    let request = match DataRequest::of(&pod) {
        Ok(Some(request)) if gated => request,
        // Lifted by hand, or the opt-in removed: nothing left to watch.
        _ => {
            let patch = json!({"metadata": {"labels": {GATED_LABEL: null}}});
            pods.patch(&pod.name_any(), &PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
            return Ok(Action::await_change());
        }
    };
    let found = crate::webhook::look_up_datastages(&ctx.client, &namespace, &request.names).await?;
    let found: Vec<Option<&DataStage>> = found.iter().map(Option::as_ref).collect();
    let unmounted: BTreeSet<String> = pod
        .annotations()
        .get(UNMOUNTED_ANNOTATION)
        .map(|v| v.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    match decide(&request, &found, &unmounted) {
        GateDecision::Lift(nodes) => {
            let mut hostnames = BTreeSet::new();
            if let Some(nodes) = nodes.as_ref().filter(|n| needs_hostnames(&pod, n)) {
                let listed = ctx.caches.nodes.state();
                for node in listed.iter().filter(|n| nodes.contains(&n.name_any())) {
                    hostnames.insert(node.labels().get(HOSTNAME_LABEL).cloned().unwrap_or_else(|| node.name_any()));
                }
            }
            let versions = PodVersions::current(found.iter().flatten().copied());
            let patch = lift_patch(&pod, nodes.as_ref(), &hostnames, &versions);
            match pods.patch(&pod.name_any(), &PatchParams::default(), &kube::api::Patch::<()>::Json(patch)).await {
                Ok(_) => {}
                // A stale view (the test operation failed): the watch brings the new one.
                Err(kube::Error::Api(status)) if status.code == 422 && status.message.contains("test") => {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                Err(error) => return Err(error.into()),
            }
            ctx.metrics.gated_pod("lifted");
            let note = match &nodes {
                Some(nodes) => format!("data ready on {}", nodes.iter().cloned().collect::<Vec<_>>().join(", ")),
                None => "data ready".to_owned(),
            };
            tracing::info!(pod = %pod.name_any(), %namespace, %note, "lifted the data-ready gate");
            publish(&ctx, &pod, EventType::Normal, "DataReady", format!("{note}; scheduling gate lifted")).await;
            Ok(Action::await_change())
        }
        GateDecision::Hold { reason, message, warning } => {
            ctx.metrics.gated_pod("held");
            // Data evicted from every node stages again for a pod that
            // waits: its DataStage sees the pod when it is reconciled.
            for ds in found.iter().flatten().filter(|ds| crate::eviction::evicted_everywhere(ds)) {
                ctx.wakes.wake(&namespace, &ds.name_any());
            }
            if pod.annotations().get(WAITING_FOR_ANNOTATION) != Some(&message) {
                let patch = json!({"metadata": {"annotations": {WAITING_FOR_ANNOTATION: message}}});
                pods.patch(&pod.name_any(), &PatchParams::default(), &kube::api::Patch::Merge(&patch)).await?;
                let kind = if warning { EventType::Warning } else { EventType::Normal };
                publish(&ctx, &pod, kind, reason, message).await;
            }
            // DataStage changes wake the pod; the slow requeue only guards against a missed one.
            Ok(Action::requeue(Duration::from_secs(120)))
        }
    }
}

async fn publish(ctx: &Context, pod: &Pod, kind: EventType, reason: &str, note: String) {
    let event =
        Event { type_: kind, reason: reason.into(), note: Some(note), action: "Schedule".into(), secondary: None };
    if let Err(error) = ctx.events.publish(&event, &pod.object_ref(&())).await {
        tracing::warn!(%error, pod = %pod.name_any(), "cannot publish an Event");
    }
}

fn error_policy(pod: Arc<Pod>, error: &GateError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(pod = %pod.name_any(), %error, "gate reconcile failed");
    Action::requeue(Duration::from_millis(1000 + rand::random::<u64>() % 2000))
}

/// Runs the gate controller until the process stops: it watches only pods
/// labelled gated, and wakes them when a DataStage they name changes.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (pods, datastages) = match &ctx.config.watch_namespace {
        Some(ns) => (Api::<Pod>::namespaced(client.clone(), ns), Api::<DataStage>::namespaced(client, ns)),
        None => (Api::<Pod>::all(client.clone()), Api::<DataStage>::all(client)),
    };
    // The operator's watch backoff, not kube's: gated pods wait on these
    // watches after an API server restart too.
    let (gated, writer) = reflector::store();
    let gated_pods = watcher(pods, watcher::Config::default().labels(&format!("{GATED_LABEL}=true")))
        .backoff(WatchBackoff::default())
        .reflect(writer)
        .applied_objects();
    let datastage_changes =
        watcher(datastages, watcher::Config::default()).backoff(WatchBackoff::default()).touched_objects();
    Controller::for_stream(gated_pods, gated.clone())
        .trigger_backoff(WatchBackoff::default())
        .watches_stream(datastage_changes, move |ds| {
            let (namespace, name) = (ds.namespace(), ds.name_any());
            gated
                .state()
                .into_iter()
                .filter(|pod| pod.namespace() == namespace)
                .filter(|pod| DataRequest::of(pod).ok().flatten().is_some_and(|r| r.names.contains(&name)))
                .map(|pod| ObjectRef::from_obj(&*pod))
                .collect::<Vec<_>>()
        })
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "gate loop");
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &str, volume: Value, status: Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": "n", "generation": 1},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": volume}},
            "status": status,
        }))
        .unwrap()
    }

    fn on_nodes(name: &str, nodes: &[&str]) -> DataStage {
        let workers: Vec<Value> = nodes
            .iter()
            .map(|n| json!({"name": n, "node": n, "phase": "Succeeded", "run": 1, "snapshot": "s"}))
            .collect();
        stage(
            name,
            json!({"hostPath": "/mnt/x"}),
            json!({"phase": "Succeeded", "observedGeneration": 1, "run": 1,
                   "snapshot": {"objects": 1, "bytes": 1, "digest": "s"}, "workers": workers}),
        )
    }

    fn request(names: &[&str]) -> DataRequest {
        DataRequest { names: names.iter().map(|n| (*n).to_owned()).collect(), mount_path: "/data".into() }
    }

    fn nodes(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| (*n).to_owned()).collect())
    }

    #[test]
    fn several_datastages_lift_onto_the_nodes_holding_all_of_them() {
        let (a, b) = (on_nodes("a", &["n1", "n2"]), on_nodes("b", &["n2", "n3"]));
        let claim = stage(
            "c",
            json!({"persistentVolumeClaim": {"claimName": "c"}}),
            json!({"phase": "Succeeded", "observedGeneration": 1}),
        );
        let none = BTreeSet::new();
        assert_eq!(
            decide(&request(&["a", "b", "c"]), &[Some(&a), Some(&b), Some(&claim)], &none),
            GateDecision::Lift(nodes(&["n2"]))
        );
        assert_eq!(decide(&request(&["c"]), &[Some(&claim)], &none), GateDecision::Lift(None));
        let disjoint = on_nodes("d", &["n9"]);
        assert!(matches!(
            decide(&request(&["a", "d"]), &[Some(&a), Some(&disjoint)], &none),
            GateDecision::Hold { reason: "NoNodeHoldsAllData", warning: true, .. }
        ));
    }

    #[test]
    fn missing_unmounted_failed_and_running_datastages_hold_the_pod() {
        let none = BTreeSet::new();
        let a = on_nodes("a", &["n1"]);
        assert!(matches!(
            decide(&request(&["a", "gone"]), &[Some(&a), None], &none),
            GateDecision::Hold { reason: "DataStageNotFound", warning: true, .. }
        ));
        assert!(matches!(
            decide(&request(&["a"]), &[Some(&a)], &BTreeSet::from(["a".to_owned()])),
            GateDecision::Hold { reason: "DataStageNotMounted", warning: true, .. }
        ));
        let failed = stage(
            "f",
            json!({"hostPath": "/mnt/x"}),
            json!({"phase": "Failed", "observedGeneration": 1, "conditions": [{"type": "Failed", "status": "True",
                "reason": "AccessDenied", "message": "access denied to s3://b", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
        );
        assert_eq!(
            decide(&request(&["f"]), &[Some(&failed)], &none),
            GateDecision::Hold {
                reason: "DataStageFailed",
                message: "DataStage f failed: access denied to s3://b".into(),
                warning: true
            }
        );
        let running = stage("r", json!({"hostPath": "/mnt/x"}), json!({"phase": "Running", "observedGeneration": 1}));
        assert!(matches!(
            decide(&request(&["r"]), &[Some(&running)], &none),
            GateDecision::Hold { reason: "WaitingForData", warning: false, .. }
        ));
    }

    fn lifted(pod: Value, nodes: Option<&BTreeSet<String>>) -> Value {
        let parsed: Pod = serde_json::from_value(pod.clone()).unwrap();
        let mut out = pod;
        json_patch::patch(
            &mut out,
            &lift_patch(
                &parsed,
                nodes,
                &BTreeSet::from(["host-1".to_owned(), "host-2".to_owned()]),
                &PodVersions::default(),
            ),
        )
        .unwrap();
        out
    }

    #[test]
    fn lifting_keeps_other_gates_and_pins_the_nodes() {
        let pod = json!({"metadata": {"name": "p", "resourceVersion": "7",
                "labels": {"ferry.dev/data-gated": "true", "app": "t"}, "annotations": {"ferry.dev/waiting-for": "x"}},
            "spec": {"containers": [], "schedulingGates": [{"name": "ferry.dev/data-ready"}, {"name": "other"}]}});
        let out = lifted(pod, nodes(&["n1", "n2"]).as_ref());
        assert_eq!(out["spec"]["schedulingGates"], json!([{"name": "other"}]));
        // One node per field selector (the API server allows no more): one term each.
        assert_eq!(
            out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]})
        );
        assert_eq!(out["metadata"]["labels"], json!({"app": "t"}));
        assert_eq!(out["metadata"]["annotations"], json!({}));
    }

    #[test]
    fn lifting_records_the_versions_current_now_with_or_without_annotations() {
        let versions = PodVersions(std::collections::BTreeMap::from([("llama".to_owned(), "ab".repeat(16))]));
        for annotations in [None, Some(json!({"team": "a"}))] {
            let mut pod = json!({"metadata": {"name": "p", "resourceVersion": "7", "labels": {"ferry.dev/data-gated": "true"}},
                "spec": {"containers": [], "schedulingGates": [{"name": "ferry.dev/data-ready"}]}});
            if let Some(annotations) = &annotations {
                pod["metadata"]["annotations"] = annotations.clone();
            }
            let parsed: Pod = serde_json::from_value(pod.clone()).unwrap();
            json_patch::patch(&mut pod, &lift_patch(&parsed, None, &BTreeSet::new(), &versions)).unwrap();
            let patched: Pod = serde_json::from_value(pod.clone()).unwrap();
            assert_eq!(PodVersions::of(&patched), versions, "{pod}");
            if annotations.is_some() {
                assert_eq!(pod["metadata"]["annotations"]["team"], "a");
            }
        }
    }

    #[test]
    fn lifting_narrows_every_existing_node_selector_term() {
        let pod = json!({"metadata": {"name": "p", "resourceVersion": "7", "labels": {"ferry.dev/data-gated": "true"}},
            "spec": {"containers": [], "schedulingGates": [{"name": "ferry.dev/data-ready"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["bad"]}]}]}}}}});
        let pod_with_terms = pod.clone();
        let out = lifted(pod, nodes(&["n1"]).as_ref());
        let terms = &out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        let pin = json!({"key": "metadata.name", "operator": "In", "values": ["n1"]});
        assert_eq!(terms[0]["matchFields"], json!([pin]));
        assert_eq!(terms[0]["matchExpressions"], json!([{"key": "gpu", "operator": "Exists"}]));
        assert_eq!(terms[1]["matchFields"][1], pin);
        assert!(out["spec"].get("schedulingGates").is_none());
        // Several nodes narrow a pod's own terms by hostname label.
        let out = lifted(pod_with_terms.clone(), nodes(&["n1", "n2"]).as_ref());
        let terms = &out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
        let by_host = json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-1", "host-2"]});
        assert_eq!(terms[0]["matchExpressions"][1], by_host);
        assert_eq!(terms[1]["matchExpressions"], json!([by_host]));
        assert!(needs_hostnames(&serde_json::from_value(pod_with_terms).unwrap(), &nodes(&["n1", "n2"]).unwrap()));

        // A claim (anywhere) leaves the affinity alone; a stale pod fails the test op.
        let pod = json!({"metadata": {"name": "p", "resourceVersion": "7", "labels": {"ferry.dev/data-gated": "true"}},
            "spec": {"containers": [], "schedulingGates": [{"name": "ferry.dev/data-ready"}]}});
        assert!(lifted(pod.clone(), None)["spec"].get("affinity").is_none());
        let parsed: Pod = serde_json::from_value(pod.clone()).unwrap();
        let mut newer = pod;
        newer["metadata"]["resourceVersion"] = json!("8");
        assert!(
            json_patch::patch(&mut newer, &lift_patch(&parsed, None, &BTreeSet::new(), &PodVersions::default()))
                .is_err()
        );
    }
}
