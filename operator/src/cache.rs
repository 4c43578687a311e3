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
//!
//! Jobs and Pods are watched in every namespace, or, when the operator
//! watches one namespace, in that one and the workers' namespace: one
//! store per watch ([`Watched`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Pod, PodSpec};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::{Resource as _, ResourceExt as _};
use tokio::sync::OnceCell;

use crate::home::{DataStageKey, Home};

/// The objects of one kind that one or more watches keep (a store each).
#[derive(Clone)]
pub struct Watched<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    stores: Vec<Store<K>>,
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Watched<K> {
    /// The objects of every store that `keep` keeps.
    pub fn state_filter(&self, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(|store| store.state_filter(|object| keep(object))).collect()
    }

    /// Every object of every store.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.stores.iter().flat_map(Store::state).collect()
    }

    /// Objects held, over all stores.
    pub fn len(&self) -> usize {
        self.stores.iter().map(Store::len).sum()
    }

    /// Whether no store holds anything.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until every store holds its first listing.
    pub async fn wait_until_ready(&self) {
        for store in &self.stores {
            // A writer is dropped only when the controller stops.
            let _ = store.wait_until_ready().await;
        }
    }
}

/// The read side of the caches, shared by every reconciliation.
#[derive(Clone)]
pub struct Caches {
    /// Every Node: labels, taints, whether it is cordoned, and its Ready
    /// condition.
    pub nodes: Store<Node>,
    /// Jobs labelled with a DataStage (workers and clean-ups): labels,
    /// owners and status.
    pub jobs: Watched<Job>,
    /// Pods labelled with a DataStage: labels, annotations, node and status
    /// (termination messages carry the workers' summaries); training pods
    /// that read a DataStage carry the label too.
    pub pods: Watched<Pod>,
    /// Every DataStage the controller watches, as its watch last saw it.
    pub datastages: Store<ferry_crds::DataStage>,
    /// Every StoreBudget (see [`crate::budgets`]). Not waited for by
    /// [`Caches::ready`]: a cluster without the StoreBudget CRD stages
    /// all the same, unbudgeted.
    pub budgets: Store<ferry_crds::StoreBudget>,
    /// Every StagingQuota (see [`crate::quotas`]). Waited for at most
    /// [`QUOTA_LIST_PATIENCE`] by [`Caches::ready`]: a cluster without the
    /// StagingQuota CRD stages all the same, unlimited.
    pub quotas: Store<ferry_crds::StagingQuota>,
    /// Every NodeCache: where node-local DataStages are laid out. Waited
    /// for by [`Caches::ready`] only as long as the StagingQuotas: a
    /// cluster without the CRD stages onto claims and hostPaths.
    pub node_caches: Store<ferry_crds::NodeCache>,
    /// Worker Jobs this process created that the Job cache may not show
    /// yet.
    pub created: Arc<CreatedJobs>,
    /// What the Job controller's Events said of Jobs without pods, by the
    /// Job's uid.
    pub pods_refused: Arc<Recent<Option<String>>>,
    /// Node labels this process set or removed, by node and label.
    pub node_labels: Arc<Recent<Option<String>>>,
    /// Set once all three hold their first listing; see [`Caches::ready`].
    listed: Arc<OnceCell<()>>,
}

/// Worker Jobs this process created, until the Job cache shows them
/// (controller-runtime calls these "expectations").
///
/// A Job's watch event can trail its DataStage's: the status written right
/// after the create wakes the DataStage again, and a reconciliation that
/// finds no Job in the cache creates it again, gets AlreadyExists and reads
/// it. At 1,000 DataStages created at once that was 1.1 to 1.7 Job creates
/// per DataStage, each repeat with a read and a repeated peer Secret create,
/// all in the burst when the API server has least to spare.
///
/// Kept per DataStage, so a reconciliation looks at its own DataStage's
/// Jobs only; those of DataStages never reconciled again (deleted) are
/// swept out by age, at most once a second.
#[derive(Debug, Default)]
pub struct CreatedJobs(Mutex<CreatedJobsBook>);

/// What [`CreatedJobs`] holds: per DataStage (namespace and name), the
/// Jobs created and when.
#[derive(Debug, Default)]
struct CreatedJobsBook {
    by_datastage: HashMap<(String, String), Vec<(Instant, Job)>>,
    last_sweep: Option<Instant>,
}

impl CreatedJobs {
    /// How long a created Job is taken as existing without the cache
    /// showing it. A Job deleted by hand this soon after its creation, and
    /// before a reconciliation saw it in the cache, is made again only
    /// once this has passed: the DataStage is requeued for then.
    pub const PATIENCE: Duration = Duration::from_secs(15);

    /// How often the Jobs of every DataStage are checked for age.
    const SWEEP_EVERY: Duration = Duration::from_secs(1);

    /// Remembers `job`, just created for the DataStage its labels name.
    pub fn record(&self, job: &Job) {
        let mut job = job.clone();
        slim_job(&mut job);
        let Some(datastage) = DataStageKey::from_labels(job.metadata.namespace.as_deref(), job.labels()) else {
            return;
        };
        let key = (datastage.namespace, datastage.name);
        let mut book = self.0.lock().expect("created Jobs");
        book.sweep();
        let jobs = book.by_datastage.entry(key).or_default();
        jobs.retain(|(_, known)| known.metadata.name != job.metadata.name);
        jobs.push((Instant::now(), job));
    }

    /// Adds to `cached`, the cache's Jobs of `datastage`, those created
    /// here that it does not show yet, and says whether it added any.
    /// Forgets this DataStage's Jobs that the cache shows, and everyone's
    /// older than [`CreatedJobs::PATIENCE`].
    pub fn fill_in(&self, datastage: &DataStageKey, cached: &mut Vec<Job>) -> bool {
        let mut book = self.0.lock().expect("created Jobs");
        book.sweep();
        let key = (datastage.namespace.clone(), datastage.name.clone());
        let Some(jobs) = book.by_datastage.get_mut(&key) else { return false };
        jobs.retain(|(at, job)| {
            at.elapsed() < Self::PATIENCE && !cached.iter().any(|shown| shown.metadata.name == job.metadata.name)
        });
        let missing: Vec<Job> = jobs.iter().map(|(_, job)| job.clone()).collect();
        if missing.is_empty() {
            book.by_datastage.remove(&key);
        }
        let added = !missing.is_empty();
        cached.extend(missing);
        added
    }

    /// How many Jobs are remembered, over all DataStages.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().expect("created Jobs").by_datastage.values().map(Vec::len).sum()
    }

    /// Whether no Job is remembered.
    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl CreatedJobsBook {
    /// Forgets the Jobs older than [`CreatedJobs::PATIENCE`], of every
    /// DataStage, if the last sweep was over a second ago.
    fn sweep(&mut self) {
        if self.last_sweep.is_some_and(|at| at.elapsed() < CreatedJobs::SWEEP_EVERY) {
            return;
        }
        self.last_sweep = Some(Instant::now());
        self.by_datastage.retain(|_, jobs| {
            jobs.retain(|(at, _)| at.elapsed() < CreatedJobs::PATIENCE);
            !jobs.is_empty()
        });
    }
}

/// The write side, consumed by the watches that fill the caches.
pub struct CacheWriters {
    /// Fills [`Caches::nodes`].
    pub nodes: Writer<Node>,
    /// Fill [`Caches::jobs`], one per watched namespace (or one for all).
    pub jobs: Vec<Writer<Job>>,
    /// Fill [`Caches::pods`], likewise.
    pub pods: Vec<Writer<Pod>>,
    /// Fills [`Caches::datastages`].
    pub datastages: Writer<ferry_crds::DataStage>,
    /// Fills [`Caches::budgets`].
    pub budgets: Writer<ferry_crds::StoreBudget>,
    /// Fills [`Caches::quotas`].
    pub quotas: Writer<ferry_crds::StagingQuota>,
    /// Fills [`Caches::node_caches`].
    pub node_caches: Writer<ferry_crds::NodeCache>,
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

/// Answers and writes of the last few seconds, by key, so that the many
/// reconciliations of one DataStage in a burst (each status write wakes
/// it) do not ask or write again what a moment ago they asked or wrote and
/// the watches have not shown yet. Seen in a burst of 1,000 DataStages:
/// 30,805 lists of Events for Jobs waiting for pods, and 11,654 patches of
/// node labels (about ten per DataStage, each re-sending a Node that holds
/// every copy's label). An entry stands for [`Recent::FOR`].
#[derive(Debug)]
pub struct Recent<V>(Mutex<HashMap<String, (Instant, V)>>);

impl<V> Default for Recent<V> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<V: Clone + PartialEq> Recent<V> {
    /// How long an entry stands.
    pub const FOR: Duration = Duration::from_secs(15);

    /// What was remembered for `key` less than [`Recent::FOR`] ago.
    pub fn get(&self, key: &str) -> Option<V> {
        let book = self.0.lock().expect("recent");
        book.get(key).filter(|(at, _)| at.elapsed() < Self::FOR).map(|(_, value)| value.clone())
    }

    /// Whether `value` is what was remembered for `key` less than
    /// [`Recent::FOR`] ago.
    pub fn holds(&self, key: &str, value: &V) -> bool {
        self.get(key).is_some_and(|known| known == *value)
    }

    /// Remembers `value` for `key`, and forgets entries that no longer
    /// stand.
    pub fn remember(&self, key: &str, value: V) {
        let mut book = self.0.lock().expect("recent");
        book.retain(|_, (at, _)| at.elapsed() < Self::FOR);
        book.insert(key.to_owned(), (Instant::now(), value));
    }
}

/// Empty caches and the writers that will fill them, with `scopes`
/// watches each of Jobs and Pods (at least one).
pub fn new_with(scopes: usize) -> (Caches, CacheWriters) {
    let (nodes, node_writer) = reflector::store();
    let (job_stores, job_writers): (Vec<_>, Vec<_>) = (0..scopes.max(1)).map(|_| reflector::store()).unzip();
    let (pod_stores, pod_writers): (Vec<_>, Vec<_>) = (0..scopes.max(1)).map(|_| reflector::store()).unzip();
    let (datastages, datastage_writer) = reflector::store();
    let (budgets, budget_writer) = reflector::store();
    let (quotas, quota_writer) = reflector::store();
    let (node_caches, node_cache_writer) = reflector::store();
    let (created, pods_refused, node_labels, listed) = (Arc::default(), Arc::default(), Arc::default(), Arc::default());
    let (jobs, pods) = (Watched { stores: job_stores }, Watched { stores: pod_stores });
    (
        Caches {
            nodes,
            jobs,
            pods,
            datastages,
            budgets,
            quotas,
            node_caches,
            created,
            pods_refused,
            node_labels,
            listed,
        },
        CacheWriters {
            nodes: node_writer,
            jobs: job_writers,
            pods: pod_writers,
            datastages: datastage_writer,
            budgets: budget_writer,
            quotas: quota_writer,
            node_caches: node_cache_writer,
        },
    )
}

/// Empty caches with one watch of Jobs and one of Pods.
pub fn new() -> (Caches, CacheWriters) {
    new_with(1)
}

/// How long [`Caches::ready`] waits for the first listing of StagingQuotas,
/// once per process, before it goes on without them.
pub const QUOTA_LIST_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

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
                // Workers started before the quotas are listed would run
                // unlimited; a cluster without their CRD never lists them.
                let quotas = tokio::time::timeout(QUOTA_LIST_PATIENCE, self.quotas.wait_until_ready());
                let node_caches = tokio::time::timeout(QUOTA_LIST_PATIENCE, self.node_caches.wait_until_ready());
                let _ = tokio::join!(
                    self.nodes.wait_until_ready(),
                    self.jobs.wait_until_ready(),
                    self.pods.wait_until_ready(),
                    quotas,
                    node_caches
                );
            })
            .await;
    }

    /// The Jobs or Pods made for the DataStage at `home` there that carry
    /// `role_label` (a worker, a clean-up, a version switch): never a
    /// tenant's pod labelled alike in its own namespace when the workers
    /// run elsewhere ([`Home::holds`]).
    pub fn of_home<K>(watched: &Watched<K>, home: &Home, role_label: &str) -> Vec<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        watched
            .state_filter(|object| {
                home.holds(object.meta()) && object.meta().labels.as_ref().is_some_and(|l| l.contains_key(role_label))
            })
            .iter()
            .map(|object| (**object).clone())
            .collect()
    }

    /// The worker Jobs a release that ran node-local workers in the
    /// DataStage's own namespace made for it (the controller retires
    /// them): in that namespace, labelled as its workers and owned by it,
    /// as that release made them. A tenant's own Job labelled
    /// `ferry.dev/datastage` (how a training Job asks for the data) is
    /// none: it has no worker label, and the DataStage does not own it.
    pub fn strays(&self, home: &Home) -> Vec<Job> {
        if !home.elsewhere() {
            return Vec::new();
        }
        let key = &home.datastage;
        self.jobs
            .state_filter(|job| {
                let meta = job.meta();
                let labels = meta.labels.as_ref();
                meta.namespace.as_deref() == Some(key.namespace.as_str())
                    && labels.and_then(|l| l.get(ferry_crds::names::DATASTAGE)) == Some(&key.name)
                    && labels.is_some_and(|l| {
                        l.contains_key(ferry_crds::names::WORKER)
                            && !l.contains_key(ferry_crds::names::DATASTAGE_NAMESPACE)
                    })
                    && meta.owner_references.iter().flatten().any(|owner| owner.uid == key.uid)
            })
            .iter()
            .map(|job| (**job).clone())
            .collect()
    }

    /// Whether node `name` exists (the Node cache shows it).
    pub fn node_exists(&self, name: &str) -> bool {
        self.nodes.get(&kube::runtime::reflector::ObjectRef::new(name)).is_some()
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

/// The annotation `kubectl apply` keeps a whole copy of the object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A DataStage as the controller reads it: everything but its managed
/// fields and the copy `kubectl apply` keeps. Measured with a heap profile
/// at 1,000 DataStages, the managed fields were half of what the
/// DataStage cache held (12 of 23 MiB): the status is server-side applied
/// field by field, and each worker entry adds its own. The operator never
/// reads them; it applies with force under its one field manager.
pub fn slim_datastage(ds: &mut ferry_crds::DataStage) {
    let meta = ds.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// A Job as the controller reads it: of its spec only its parallelism
/// (the workers it runs, for store budgets); no managed fields.
pub fn slim_job(job: &mut Job) {
    let parallelism = job.spec.as_ref().and_then(|s| s.parallelism);
    job.spec = parallelism.map(|parallelism| JobSpec { parallelism: Some(parallelism), ..JobSpec::default() });
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
    use std::collections::BTreeMap;

    #[test]
    fn what_was_asked_or_written_a_moment_ago_is_remembered_per_key() {
        let asked = Recent::<Option<String>>::default();
        assert_eq!(asked.get("job-1"), None, "never asked");
        asked.remember("job-1", Some("pods \"x\" is forbidden".into()));
        asked.remember("job-2", None);
        assert_eq!(asked.get("job-1"), Some(Some("pods \"x\" is forbidden".into())));
        assert_eq!(asked.get("job-2"), Some(None), "no Event is an answer too");
        assert_eq!(asked.get("job-3"), None);
        assert!(asked.holds("job-2", &None) && !asked.holds("job-2", &Some("x".into())));
    }

    #[test]
    fn created_jobs_fill_in_for_their_datastage_until_the_cache_shows_them() {
        let job = |namespace: &str, name: &str, datastage: &str| -> Job {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace,
                "labels": {ferry_crds::names::DATASTAGE: datastage}},
                "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}))
            .unwrap()
        };
        let created = CreatedJobs::default();
        created.record(&job("team-a", "d-node-a-r1", "d"));
        created.record(&job("team-b", "d-node-a-r1", "d"));
        created.record(&job("team-a", "e-node-a-r1", "e"));

        let key = |namespace: &str, name: &str| DataStageKey {
            namespace: namespace.into(),
            name: name.into(),
            uid: String::new(),
        };
        let mut cached = Vec::new();
        assert!(created.fill_in(&key("team-a", "d"), &mut cached), "not in the cache yet");
        assert_eq!(cached.iter().map(|j| j.name_any()).collect::<Vec<_>>(), ["d-node-a-r1"], "its own only");
        assert!(cached[0].spec.is_none(), "kept slim");

        // Once the cache shows it, it is forgotten; the others stay.
        let mut cached = vec![job("team-a", "d-node-a-r1", "d")];
        assert!(!created.fill_in(&key("team-a", "d"), &mut cached));
        assert_eq!(cached.len(), 1, "not doubled");
        let mut cached = Vec::new();
        assert!(!created.fill_in(&key("team-a", "d"), &mut cached), "forgotten");
        assert!(
            created.fill_in(&key("team-b", "d"), &mut cached) && created.fill_in(&key("team-a", "e"), &mut Vec::new())
        );
        assert_eq!(created.len(), 2);
    }

    #[test]
    fn created_jobs_of_datastages_never_reconciled_again_are_swept_out_by_age() {
        let job = |name: &str, datastage: &str| -> Job {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "team-a",
                "labels": {ferry_crds::names::DATASTAGE: datastage}}}))
            .unwrap()
        };
        let created = CreatedJobs::default();
        created.record(&job("gone-r1", "gone"));
        created.record(&job("kept-r1", "kept"));
        created.record(&job("kept-r1", "kept"));
        assert_eq!(created.len(), 2, "a Job recorded twice is remembered once");

        // Age the deleted DataStage's Job past the patience, as if 16 s had
        // passed, and let the next sweep run.
        {
            let mut book = created.0.lock().unwrap();
            let aged = Instant::now().checked_sub(CreatedJobs::PATIENCE + Duration::from_secs(1)).unwrap();
            book.by_datastage.get_mut(&("team-a".into(), "gone".into())).unwrap()[0].0 = aged;
            book.last_sweep = None;
        }
        let kept = DataStageKey { namespace: "team-a".into(), name: "kept".into(), uid: String::new() };
        assert!(created.fill_in(&kept, &mut Vec::new()), "another DataStage's reconcile");
        assert_eq!(created.len(), 1, "the aged one is swept out; the young one stays");
        assert!(!created.is_empty());
    }

    #[test]
    fn slimmed_objects_keep_what_the_controller_reads_and_nothing_big() {
        let mut job: Job = serde_json::from_value(json!({
            "metadata": {"name": "j", "labels": {"ferry.dev/datastage": "d"},
                         "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "name": "d", "uid": "u", "controller": true}],
                         "managedFields": [{"manager": "ferry.dev/operator"}]},
            "spec": {"parallelism": 3, "template": {"spec": {"containers": [{"name": "c", "args": ["--a", "--b"]}]}}},
            "status": {"succeeded": 1},
        }))
        .unwrap();
        slim_job(&mut job);
        let spec = job.spec.clone().unwrap();
        assert_eq!(spec.parallelism, Some(3), "the workers it runs, for store budgets");
        assert!(spec.template.spec.is_none() && job.metadata.managed_fields.is_none(), "no pod template");
        assert_eq!(job.status.unwrap().succeeded, Some(1));
        assert_eq!(job.metadata.owner_references.unwrap()[0].name, "d", "owners map a Job to its DataStage");

        let mut ds: ferry_crds::DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "annotations": {LAST_APPLIED: "{}", "team": "a"},
                         "managedFields": [{"manager": "ferry.dev/operator"}]},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/ferry/d"}}},
        }))
        .unwrap();
        let spec = ds.spec.clone();
        slim_datastage(&mut ds);
        assert!(ds.metadata.managed_fields.is_none());
        assert_eq!(
            ds.metadata.annotations.unwrap().into_keys().collect::<Vec<_>>(),
            ["team"],
            "others' annotations stay"
        );
        assert_eq!(ds.spec, spec, "the spec is what the controller reads");

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
        writers.jobs[0].apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.pods[0].apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.quotas.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.node_caches.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        for waiter in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                .await
                .expect("a waiter was never woken")
                .unwrap();
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_without_staging_quotas_is_waited_for_only_so_long() {
        let (caches, mut writers) = new();
        let waiter = tokio::spawn({
            let caches = caches.clone();
            async move { caches.ready().await }
        });
        writers.nodes.apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.jobs[0].apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        writers.pods[0].apply_watcher_event(&kube::runtime::watcher::Event::InitDone);
        tokio::time::sleep(QUOTA_LIST_PATIENCE / 2).await;
        assert!(!waiter.is_finished(), "the quotas may still come");
        tokio::time::sleep(QUOTA_LIST_PATIENCE).await;
        assert!(waiter.is_finished(), "no StagingQuota CRD: the caches are ready without it");
        // Once ready, always ready: later reconciliations do not wait.
        tokio::time::timeout(std::time::Duration::from_millis(1), caches.ready()).await.unwrap();
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
    fn a_datastages_objects_are_found_in_its_home_by_its_labels_and_role() {
        let (caches, mut writers) = new();
        let ds: ferry_crds::DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": "a", "uid": "u-d"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}},
        }))
        .unwrap();
        let home = Home::of(&ds, &ds.spec.plan().unwrap(), "ferry-workers", None);
        let job = |ns: &str, name: &str, labels: BTreeMap<String, String>| -> Job {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns, "labels": labels}})).unwrap()
        };
        let owned = |mut job: Job| -> Job {
            job.metadata.owner_references = Some(vec![
                serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1",
                "kind": "DataStage", "name": "d", "uid": "u-d", "controller": true}))
                .unwrap(),
            ]);
            job
        };
        let training = BTreeMap::from([(ferry_crds::names::DATASTAGE.to_owned(), "d".to_owned())]);
        let ours = home.labels((ferry_crds::names::WORKER, "node-a"));
        let mut cleanup = home.labels((ferry_crds::names::CLEANUP, "node-a"));
        cleanup.remove(ferry_crds::names::WORKER);
        let forged = BTreeMap::from([
            (ferry_crds::names::DATASTAGE.to_owned(), "d".to_owned()),
            (ferry_crds::names::WORKER.to_owned(), "node-a".to_owned()),
        ]);
        for object in [
            job("ferry-workers", "worker", ours),
            job("ferry-workers", "cleanup", cleanup),
            // A tenant's look-alike in its own namespace: never a worker,
            // and not the DataStage's to retire either.
            job("a", "forged", forged.clone()),
            // What a release before the workers' namespace made: a stray.
            owned(job("a", "before", forged)),
            // A training Job asking for the data, owned by it or not.
            job("a", "train", training.clone()),
            owned(job("a", "train-owned", training)),
        ] {
            writers.jobs[0].apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        let found = Caches::of_home(&caches.jobs, &home, ferry_crds::names::WORKER);
        assert_eq!(found.iter().map(|j| j.name_any()).collect::<Vec<_>>(), ["worker"]);
        let strays = caches.strays(&home);
        assert_eq!(strays.iter().map(|j| j.name_any()).collect::<Vec<_>>(), ["before"]);
    }
}
