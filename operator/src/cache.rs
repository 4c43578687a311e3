//! What the operator knows of the cluster between reconciliations: Nodes,
//! and the Jobs and Pods of DataStages, each kept current by one watch.
//!
//! A reconciliation reads these caches instead of listing: with a thousand
//! DataStages, each woken every few seconds while it runs, per-reconcile
//! lists of Nodes, Jobs and Pods were most of the operator's API requests
//! and the API server's work. The watches also wake the DataStage a Job or
//! Pod belongs to, so a finished worker is seen at once rather than on the
//! next poll.
//!
//! Cached objects are slimmed to what the controller reads (labels, owners,
//! status, a pod's node; for Nodes labels, taints, cordon and the Ready
//! condition): a Job's pod template or a Node's image list would otherwise
//! be most of the operator's memory.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Pod, PodSpec};
use kube::Resource as _;
use kube::runtime::reflector::{self, Store, store::Writer};
use tokio::sync::OnceCell;

/// The read side of the caches, shared by every reconciliation.
#[derive(Clone)]
pub struct Caches {
    /// Every Node: labels, taints, whether it is cordoned, and its Ready
    /// condition.
    pub nodes: Store<Node>,
    /// Jobs labelled with a DataStage (workers and clean-ups): labels,
    /// owners and status.
    pub jobs: Store<Job>,
    /// Pods labelled with a DataStage: labels, annotations, node and status
    /// (termination messages carry the workers' summaries).
    pub pods: Store<Pod>,
    /// Set once all three hold their first listing; see [`Caches::ready`].
    listed: Arc<OnceCell<()>>,
}

/// The write side, consumed by the watches that fill the caches.
pub struct CacheWriters {
    /// Fills [`Caches::nodes`].
    pub nodes: Writer<Node>,
    /// Fills [`Caches::jobs`].
    pub jobs: Writer<Job>,
    /// Fills [`Caches::pods`].
    pub pods: Writer<Pod>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("nodes", &self.nodes.len())
            .field("jobs", &self.jobs.len())
            .field("pods", &self.pods.len())
            .finish()
    }
}

/// Empty caches and the writers that will fill them.
pub fn new() -> (Caches, CacheWriters) {
    let (nodes, node_writer) = reflector::store();
    let (jobs, job_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let listed = Arc::default();
    (Caches { nodes, jobs, pods, listed }, CacheWriters { nodes: node_writer, jobs: job_writer, pods: pod_writer })
}

impl Caches {
    /// Waits until every cache holds its first full listing, so that no
    /// reconciliation mistakes "not listed yet" for "none" (no matching
    /// node, no Job: a duplicate).
    ///
    /// Many reconciliations wait here at once when an operator takes over a
    /// cluster that already has DataStages. A `Store`'s own readiness wakes
    /// only the waiter that polled it last (it is a oneshot receiver, which
    /// keeps one waker), so the others would wait forever: one DataStage of
    /// several was never reconciled after a leader change. Hence exactly one
    /// waiter per store, behind a `OnceCell` that wakes everyone.
    pub async fn ready(&self) {
        self.listed
            .get_or_init(|| async {
                // A writer is dropped only when the controller stops, and then
                // no reconciliation runs either.
                let _ = tokio::join!(
                    self.nodes.wait_until_ready(),
                    self.jobs.wait_until_ready(),
                    self.pods.wait_until_ready()
                );
            })
            .await;
    }

    /// The Jobs and Pods of DataStage `name` in `namespace` that carry
    /// `role_label` (a worker or a clean-up).
    pub fn of_datastage<K>(store: &Store<K>, namespace: &str, name: &str, role_label: &str) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        store
            .state_filter(|object| {
                let labels = object.meta().labels.as_ref();
                object.meta().namespace.as_deref() == Some(namespace)
                    && labels.and_then(|l| l.get(crate::jobs::DATASTAGE_LABEL)).map(String::as_str) == Some(name)
                    && labels.is_some_and(|l| l.contains_key(role_label))
            })
            .iter()
            .map(|object| (**object).clone())
            .collect()
    }

    /// Why node `name` cannot run a worker's pod now, in words for a
    /// condition message; `None` while it is Ready.
    pub fn node_trouble(&self, name: &str) -> Option<String> {
        let Some(node) = self.nodes.get(&kube::runtime::reflector::ObjectRef::new(name)) else {
            return Some(format!("node {name} does not exist (deleted)"));
        };
        let ready = ready_condition(&node);
        if ready.is_some_and(|c| c.status == "True") {
            return None;
        }
        let mut trouble = format!("node {name} is not Ready");
        if let Some(since) = ready.and_then(|c| c.last_transition_time.as_ref()) {
            trouble += &format!(" since {}", since.0);
        }
        if let Some(why) = ready.and_then(|c| c.message.as_deref().or(c.reason.as_deref())).filter(|m| !m.is_empty()) {
            trouble += &format!(" ({why})");
        }
        Some(trouble)
    }
}

/// A node's Ready condition, if it reported one.
pub fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

/// A Job as the controller reads it: no pod template, no managed fields.
pub fn slim_job(job: &mut Job) {
    job.spec = None;
    job.meta_mut().managed_fields = None;
}

/// A Pod as the controller reads it: of its spec only the node it was
/// bound to (to tell when that node is lost); no managed fields.
pub fn slim_pod(pod: &mut Pod) {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = node_name.map(|node_name| PodSpec { node_name: Some(node_name), ..PodSpec::default() });
    pod.meta_mut().managed_fields = None;
}

/// A Node as placement and the worker status read it: labels, taints,
/// cordon, and the Ready condition without its heartbeat time; no images,
/// addresses or other conditions, no managed fields.
pub fn slim_node(node: &mut Node) {
    let ready = ready_condition(node).cloned().map(|ready| NodeCondition { last_heartbeat_time: None, ..ready });
    node.status = ready.map(|ready| NodeStatus { conditions: Some(vec![ready]), ..NodeStatus::default() });
    node.meta_mut().managed_fields = None;
    node.meta_mut().annotations = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn slimmed_objects_keep_what_the_controller_reads_and_nothing_big() {
        let mut job: Job = serde_json::from_value(json!({
            "metadata": {"name": "j", "labels": {"ferry.dev/datastage": "d"},
                         "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "name": "d", "uid": "u", "controller": true}],
                         "managedFields": [{"manager": "ferry.dev/operator"}]},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["--a", "--b"]}]}}},
            "status": {"succeeded": 1},
        }))
        .unwrap();
        slim_job(&mut job);
        assert!(job.spec.is_none() && job.metadata.managed_fields.is_none());
        assert_eq!(job.status.unwrap().succeeded, Some(1));
        assert_eq!(job.metadata.owner_references.unwrap()[0].name, "d", "owners map a Job to its DataStage");

        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"a": "b"}, "annotations": {"x": "y"}},
            "spec": {"unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {"images": [{"names": ["a-large-image"]}], "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
            ]},
        }))
        .unwrap();
        slim_node(&mut node);
        let status = node.status.as_ref().unwrap();
        assert!(status.images.is_none(), "images are most of a node's size");
        let conditions = status.conditions.as_ref().unwrap();
        assert_eq!((conditions.len(), conditions[0].type_.as_str()), (1, "Ready"), "only Ready is read");
        assert!(conditions[0].last_heartbeat_time.is_none(), "heartbeats change nothing the controller reads");
        assert_eq!(node.spec.as_ref().unwrap().taints.as_ref().unwrap().len(), 1, "taints decide placement");
        assert_eq!(node.metadata.labels.unwrap()["a"], "b");
    }

    #[tokio::test]
    async fn every_reconciliation_waiting_for_the_caches_is_woken_when_they_are_listed() {
        let (caches, mut writers) = new();
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let caches = caches.clone();
                tokio::spawn(async move { caches.ready().await })
            })
            .collect();
        // Let every waiter register before the listings complete.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for waiter in &waiters {
            assert!(!waiter.is_finished(), "nothing is listed yet");
        }
        writers.nodes.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.jobs.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.pods.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("a waiter was never woken")
                .unwrap();
        }
    }

    #[test]
    fn a_pod_keeps_its_node_and_a_node_that_is_not_ready_or_gone_is_trouble() {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {"nodeName": "a", "containers": [{"name": "c", "args": ["--x"]}]},
        }))
        .unwrap();
        slim_pod(&mut pod);
        let spec = pod.spec.unwrap();
        assert_eq!((spec.node_name.as_deref(), spec.containers.len()), (Some("a"), 0));

        let (caches, mut writers) = new();
        let node = |name: &str, ready: &str| -> Node {
            serde_json::from_value(json!({"metadata": {"name": name}, "status": {"conditions": [
                {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
                 "message": "Kubelet stopped posting node status.", "lastTransitionTime": "2026-11-24T10:00:00Z"}]}}))
            .unwrap()
        };
        for object in [node("a", "True"), node("b", "Unknown")] {
            writers.nodes.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        assert_eq!(caches.node_trouble("a"), None);
        assert_eq!(
            caches.node_trouble("b").as_deref(),
            Some("node b is not Ready since 2026-11-24T10:00:00Z (Kubelet stopped posting node status.)")
        );
        assert_eq!(caches.node_trouble("c").as_deref(), Some("node c does not exist (deleted)"));
    }

    #[test]
    fn a_datastages_objects_are_found_by_namespace_name_and_role() {
        let (caches, mut writers) = new();
        let job = |ns: &str, ds: &str, role: &str| -> Job {
            serde_json::from_value(json!({"metadata": {
                "name": format!("{ds}-{role}"), "namespace": ns,
                "labels": {"ferry.dev/datastage": ds, role: "x"}}}))
            .unwrap()
        };
        for object in [
            job("a", "d", "ferry.dev/worker"),
            job("b", "d", "ferry.dev/worker"),
            job("a", "e", "ferry.dev/worker"),
            job("a", "d", "ferry.dev/cleanup"),
        ] {
            writers.jobs.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        let found = Caches::of_datastage(&caches.jobs, "a", "d", crate::jobs::WORKER_LABEL);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].metadata.name.as_deref(), Some("d-ferry.dev/worker"));
    }
}
