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
//! status; for Nodes labels, taints and cordon): a Job's pod template or a
//! Node's image list would otherwise be most of the operator's memory.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Resource as _;
use std::sync::Arc;

use kube::runtime::reflector::{self, Store, store::Writer};
use tokio::sync::OnceCell;

/// The read side of the caches, shared by every reconciliation.
#[derive(Clone)]
pub struct Caches {
    /// Every Node: labels, taints and whether it is cordoned.
    pub nodes: Store<Node>,
    /// Jobs labelled with a DataStage (workers and clean-ups): labels,
    /// owners and status.
    pub jobs: Store<Job>,
    /// Pods labelled with a DataStage: labels, annotations and status
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
}

/// A Job as the controller reads it: no pod template, no managed fields.
pub fn slim_job(job: &mut Job) {
    job.spec = None;
    job.meta_mut().managed_fields = None;
}

/// A Pod as the controller reads it: no spec, no managed fields.
pub fn slim_pod(pod: &mut Pod) {
    pod.spec = None;
    pod.meta_mut().managed_fields = None;
}

/// A Node as placement reads it: labels, taints, cordon; no status
/// (images, conditions, addresses), no managed fields.
pub fn slim_node(node: &mut Node) {
    node.status = None;
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
            "status": {"images": [{"names": ["a-large-image"]}]},
        }))
        .unwrap();
        slim_node(&mut node);
        assert!(node.status.is_none());
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
