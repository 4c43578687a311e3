//! StagingQuotas: the bytes a namespace's pulls may hold, per node and in
//! all (see [`ferry_crds::StagingQuota`]).
//!
//! What a DataStage holds is what its workers reported: per worker, the
//! bytes its dataset selected (a failed worker: only the bytes it put in
//! place). Before a pull's workers start, the operator works out the room
//! each quota leaves it, per worker, from what the namespace's other
//! DataStages hold, and passes the smallest to the worker as
//! `--dataset-quota`; the worker counts its whole dataset as it lists it and
//! refuses with `QuotaExceeded` before writing a page that goes over. A
//! worker the quota already leaves no room, or less than its last refused
//! run showed the dataset needs, does not start: the DataStage waits with
//! reason `QuotaExceeded` and a message naming the quota, and starts again
//! once there is room (a quota raised, a DataStage deleted).
//!
//! What the operator cannot see is a dataset nobody has listed yet: two
//! pulls that start together are each checked against what the other had
//! reported then, so together they may go over a quota by what they list
//! in their first seconds. Each one alone never does.
//!
//! Every few seconds [`run`] writes each quota's status: what its
//! namespace holds in all and on its fullest node, and how many DataStages
//! wait for room (`kubectl get squota`).
//!
//! Pure functions over the caches, unit-tested without a cluster; [`run`]
//! is the one loop.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::Reason;
use ferry_crds::plan::Direction;
use ferry_crds::{DataStage, Phase, StagingQuota, StagingQuotaStatus, WorkerStatus};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::json;

use crate::context::Context;

use crate::worker::Worker;
use ferry_contract::size::human_bytes;

/// What the other DataStages of a namespace hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes on each node (pulls onto a hostPath).
    pub per_node: BTreeMap<String, u64>,
    /// Bytes everywhere: every node's, and every claim's.
    pub total: u64,
}

/// The bytes a worker's entry says its place holds.
fn held(worker: &WorkerStatus) -> u64 {
    let done = u64::try_from(worker.bytes_done).unwrap_or(0);
    let selected = u64::try_from(worker.bytes_total).unwrap_or(0);
    // A failed worker (refused by a quota, say) holds what it put in place;
    // any other is on its way to holding all it selected.
    if worker.phase == Some(Phase::Failed) { done } else { done.max(selected) }
}

/// What `datastages` hold, pushes excepted (they write to the store).
pub fn usage<'a>(datastages: impl IntoIterator<Item = &'a DataStage>) -> Usage {
    let mut usage = Usage::default();
    for ds in datastages {
        let Ok(plan) = ds.spec.plan() else { continue };
        if plan.direction != Direction::Pull {
            continue;
        }
        for worker in ds.status.iter().flat_map(|s| &s.workers) {
            let bytes = held(worker);
            usage.total = usage.total.saturating_add(bytes);
            if let (true, Some(node)) = (plan.per_node(), &worker.node) {
                let on_node = usage.per_node.entry(node.clone()).or_default();
                *on_node = on_node.saturating_add(bytes);
            }
        }
    }
    usage
}

/// What the quotas allow the workers about to start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowance {
    /// The room each worker that may start gets (`--dataset-quota`), by
    /// worker name; absent: no quota applies.
    pub room: BTreeMap<String, u64>,
    /// The workers that wait, each with why (naming the quota).
    pub held: BTreeMap<String, String>,
}

impl Allowance {
    /// The first held worker's message, for a condition.
    pub fn first_hold(&self) -> Option<&str> {
        self.held.values().next().map(String::as_str)
    }
}

/// Which limit of a quota leaves a worker least room, with what it
/// counted, for the message of a worker it holds back.
enum Limit<'a> {
    /// `bytesPerNode`, on the worker's node.
    PerNode { limit: u64, held: u64, node: &'a str },
    /// `bytes`, split over the DataStage's places.
    InAll { limit: u64, held: u64, places: usize },
}

impl Limit<'_> {
    fn describe(&self, quota: &str, namespace: &str) -> String {
        match self {
            Limit::PerNode { limit, held, node } => format!(
                "StagingQuota {quota} allows {} per node (bytesPerNode) and other DataStages of namespace {namespace} hold {} on node {node}",
                human_bytes(*limit),
                human_bytes(*held)
            ),
            Limit::InAll { limit, held, places } => format!(
                "StagingQuota {quota} allows {} in all (bytes), other DataStages of namespace {namespace} hold {}, and this one holds a copy in each of {} places",
                human_bytes(*limit),
                human_bytes(*held),
                places.max(&1)
            ),
        }
    }
}

/// The bytes the worker named `name` showed its dataset needs when a quota
/// refused it in run `run`: at least that much (a refused listing may have
/// stopped early).
pub fn refused_need(ds: &DataStage, name: &str, run: i64) -> Option<u64> {
    ds.status
        .iter()
        .flat_map(|s| &s.workers)
        .find(|w| w.name == name && w.run == Some(run) && w.reason.as_deref() == Some(Reason::QuotaExceeded.as_str()))
        .map(|w| u64::try_from(w.bytes_total).unwrap_or(0))
}

/// Whether a quota refused a worker of run `run`: it failed with
/// `QuotaExceeded` (a worker held back before it started is Pending).
pub fn refused_in(ds: &DataStage, run: i64) -> bool {
    ds.status.iter().flat_map(|s| &s.workers).any(|w| {
        w.run == Some(run)
            && w.phase == Some(Phase::Failed)
            && w.reason.as_deref() == Some(Reason::QuotaExceeded.as_str())
    })
}

/// The room `quotas` leave each of `starting` (workers of `ds`, whose run
/// has `places` workers in all), given what the namespace's `others` hold;
/// `need` is what a worker's dataset is known to need, if anything.
pub fn allowance(
    ds: &DataStage,
    starting: &[Worker],
    places: usize,
    others: &Usage,
    quotas: &[&StagingQuota],
    need: impl Fn(&Worker) -> Option<u64>,
) -> Allowance {
    let mut result = Allowance::default();
    let per_node = ds.spec.plan().is_ok_and(|plan| plan.per_node());
    let namespace = ds.namespace().unwrap_or_default();
    for worker in starting {
        // The tightest limit for this worker; it is put in words only if
        // it holds the worker back.
        let mut tightest: Option<(u64, &StagingQuota, Limit)> = None;
        for quota in quotas {
            if let (Some(limit), Some(node), true) = (&quota.spec.bytes_per_node, &worker.node, per_node) {
                let held = others.per_node.get(node).copied().unwrap_or(0);
                let room = limit.bytes().saturating_sub(held);
                if tightest.as_ref().is_none_or(|(r, _, _)| room < *r) {
                    tightest = Some((room, quota, Limit::PerNode { limit: limit.bytes(), held, node }));
                }
            }
            if let Some(limit) = &quota.spec.bytes {
                // Every place holds the whole dataset.
                let room = limit.bytes().saturating_sub(others.total) / places.max(1) as u64;
                if tightest.as_ref().is_none_or(|(r, _, _)| room < *r) {
                    tightest = Some((room, quota, Limit::InAll { limit: limit.bytes(), held: others.total, places }));
                }
            }
        }
        let Some((room, quota, limit)) = tightest else { continue };
        let needed = need(worker);
        let fits = room > 0 && needed.is_none_or(|needed| needed <= room);
        if fits {
            result.room.insert(worker.name.clone(), room);
            continue;
        }
        let what = limit.describe(&quota.name_any(), &namespace);
        let place = worker.node.as_deref().map_or_else(String::new, |node| format!(" on node {node}"));
        let needs =
            needed.map_or_else(String::new, |n| format!("the dataset needs at least {}{place} but ", human_bytes(n)));
        result.held.insert(
            worker.name.clone(),
            format!(
                "{needs}{what}, which leaves {}: raise the quota or delete DataStages of namespace {namespace} that hold data there; this one starts when there is room",
                human_bytes(room)
            ),
        );
    }
    result
}

/// Which StagingQuota watch events wake their namespace's DataStages: a
/// quota that appears, whose spec changes (a new generation), or that goes.
/// The status the operator writes every few seconds wakes nothing: with
/// many DataStages in a namespace every write would reconcile them all.
/// (kube-runtime's `predicate_filter` on the generation would also drop a
/// deletion, which is exactly when room appears.)
#[derive(Debug, Default)]
pub struct QuotaWakes {
    generations: BTreeMap<(String, String), Option<i64>>,
    relisted: Option<std::collections::BTreeSet<(String, String)>>,
}

impl QuotaWakes {
    /// The quotas `event` should wake the namespaces of. One deleted while
    /// the watch was down shows only as missing from the next listing, and
    /// is returned by namespace and name once that listing is done.
    pub fn on(&mut self, event: kube::runtime::watcher::Event<StagingQuota>) -> Vec<StagingQuota> {
        use kube::runtime::watcher::Event;
        let key = |quota: &StagingQuota| (quota.namespace().unwrap_or_default(), quota.name_any());
        match event {
            Event::Init => {
                self.relisted = Some(Default::default());
                Vec::new()
            }
            Event::InitApply(quota) | Event::Apply(quota) => {
                if let Some(listed) = &mut self.relisted {
                    listed.insert(key(&quota));
                }
                let generation = quota.metadata.generation;
                if self.generations.insert(key(&quota), generation) == Some(generation) {
                    Vec::new()
                } else {
                    vec![quota]
                }
            }
            Event::InitDone => {
                let Some(listed) = self.relisted.take() else { return Vec::new() };
                let gone: Vec<(String, String)> =
                    self.generations.keys().filter(|key| !listed.contains(*key)).cloned().collect();
                gone.into_iter()
                    .map(|(namespace, name)| {
                        self.generations.remove(&(namespace.clone(), name.clone()));
                        let mut quota = StagingQuota::new(&name, Default::default());
                        quota.metadata.namespace = Some(namespace);
                        quota
                    })
                    .collect()
            }
            Event::Delete(quota) => {
                self.generations.remove(&key(&quota));
                vec![quota]
            }
        }
    }
}

/// Whether `ds` waits for room in a quota.
fn waiting_for_room(ds: &DataStage) -> bool {
    ds.status.as_ref().is_some_and(|s| {
        s.phase == Some(Phase::Pending) && s.conditions.iter().any(|c| c.reason == Reason::QuotaExceeded.as_str())
    })
}

/// The status of a quota over `datastages`, those of its namespace.
pub fn quota_status<'a>(datastages: impl IntoIterator<Item = &'a DataStage> + Clone) -> StagingQuotaStatus {
    let held = usage(datastages.clone());
    let fullest = held.per_node.iter().max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)));
    let on_node = fullest.map(|(node, bytes)| format!(", {} on {node}", human_bytes(*bytes))).unwrap_or_default();
    StagingQuotaStatus {
        used_bytes: i64::try_from(held.total).unwrap_or(i64::MAX),
        used_bytes_on_fullest_node: fullest.map_or(0, |(_, bytes)| i64::try_from(*bytes).unwrap_or(i64::MAX)),
        fullest_node: fullest.map(|(node, _)| node.clone()),
        used: Some(format!("{} in all{on_node}", human_bytes(held.total))),
        waiting_data_stages: datastages.into_iter().filter(|ds| waiting_for_room(ds)).count() as i64,
    }
}

/// The field manager of quota statuses.
pub const FIELD_MANAGER: &str = ferry_crds::names::QUOTAS_MANAGER;

/// How often quota statuses are brought up to date.
const PERIOD: Duration = Duration::from_secs(5);

/// Writes every StagingQuota's status that changed, every [`PERIOD`],
/// until the process stops.
pub async fn run(ctx: Arc<Context>) {
    ctx.caches.ready().await;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let quotas = ctx.caches.quotas.state();
        if quotas.is_empty() {
            continue;
        }
        let datastages = ctx.caches.datastages.state();
        for quota in quotas {
            let namespace = quota.namespace();
            let in_namespace = datastages.iter().filter(|ds| ds.namespace() == namespace).map(|ds| &**ds);
            let status = quota_status(in_namespace);
            if quota.status.as_ref() == Some(&status) {
                continue;
            }
            let (name, namespace) = (quota.name_any(), namespace.unwrap_or_default());
            let patch = json!({
                "apiVersion": StagingQuota::api_version(&()), "kind": StagingQuota::kind(&()),
                "metadata": {"name": name, "namespace": namespace}, "status": status,
            });
            let api: Api<StagingQuota> = Api::namespaced(ctx.client.clone(), &namespace);
            if let Err(error) = api.patch_status(&name, &params, &Patch::Apply(&patch)).await {
                tracing::warn!(%error, %namespace, quota = %name, "cannot write the StagingQuota's status");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(name: &str, destination: serde_json::Value, workers: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name, "namespace": "team"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": destination},
            "status": {"workers": workers},
        }))
        .unwrap()
    }

    fn host_path() -> serde_json::Value {
        json!({"volume": {"hostPath": "/mnt/d"}})
    }

    fn quota(name: &str, spec: serde_json::Value) -> StagingQuota {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "StagingQuota",
            "metadata": {"name": name, "namespace": "team"}, "spec": spec,
        }))
        .unwrap()
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn what_datastages_hold_is_what_their_workers_selected_or_a_failed_one_put_in_place() {
        let a = ds(
            "a",
            host_path(),
            json!([
                {"name": "n1", "node": "n1", "phase": "Succeeded", "bytesDone": 5 * MIB, "bytesTotal": 5 * MIB},
                {"name": "n2", "node": "n2", "phase": "Running", "bytesDone": MIB, "bytesTotal": 5 * MIB},
                {"name": "n3", "node": "n3", "phase": "Failed", "bytesDone": MIB, "bytesTotal": 9 * MIB},
            ]),
        );
        let claim = ds(
            "c",
            json!({"volume": {"persistentVolumeClaim": {"claimName": "pvc"}}}),
            json!([{"name": "shared", "node": "n1", "phase": "Succeeded", "bytesDone": 2 * MIB, "bytesTotal": 2 * MIB}]),
        );
        let push: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "p", "namespace": "team"},
            "spec": {"source": {"volume": {"hostPath": "/mnt/out"}}, "destination": {"uri": "s3://b/out"}},
            "status": {"workers": [{"name": "n1", "node": "n1", "phase": "Succeeded", "bytesDone": 50 * MIB, "bytesTotal": 50 * MIB}]},
        }))
        .unwrap();
        let usage = usage([&a, &claim, &push]);
        assert_eq!(
            usage.per_node,
            BTreeMap::from([("n1".into(), 5 * MIB), ("n2".into(), 5 * MIB), ("n3".into(), MIB)])
        );
        assert_eq!(usage.total, 13 * MIB, "the claim counts in all, on no node; the push not at all");
    }

    #[test]
    fn each_worker_gets_the_tightest_room_and_one_without_room_waits_naming_the_quota() {
        let new = ds("new", host_path(), json!([]));
        let others = Usage { per_node: BTreeMap::from([("n1".into(), 6 * MIB)]), total: 6 * MIB };
        let per_node = quota("disk", json!({"bytesPerNode": "10Mi"}));
        let in_all = quota("all", json!({"bytes": "20Mi"}));
        let workers = [Worker::on_node("n1"), Worker::on_node("n2")];
        let given = allowance(&new, &workers, 2, &others, &[&per_node, &in_all], |_| None);
        // n1: 10 - 6 = 4 MiB per node; n2: (20 - 6) / 2 = 7 MiB in all, tighter than 10.
        assert_eq!(given.room, BTreeMap::from([("n1".into(), 4 * MIB), ("n2".into(), 7 * MIB)]));
        assert!(given.held.is_empty());

        let full = Usage { per_node: BTreeMap::from([("n1".into(), 10 * MIB)]), total: 10 * MIB };
        let given = allowance(&new, &workers, 2, &full, &[&per_node], |_| None);
        assert_eq!(given.room, BTreeMap::from([("n2".into(), 10 * MIB)]));
        let message = given.held.get("n1").unwrap();
        assert!(message.contains("StagingQuota disk allows 10.0 MiB per node (bytesPerNode)"), "{message}");
        assert!(message.contains("hold 10.0 MiB on node n1"), "{message}");
        assert!(message.contains("which leaves 0 B"), "{message}");
    }

    #[test]
    fn a_dataset_known_to_need_more_than_the_room_waits_and_starts_once_the_quota_grows() {
        let new = ds("new", host_path(), json!([]));
        let workers = [Worker::on_node("n1")];
        let needs_12 = |_: &Worker| Some(12 * MIB);
        let small = quota("disk", json!({"bytesPerNode": "10Mi"}));
        let held = allowance(&new, &workers, 1, &Usage::default(), &[&small], needs_12);
        let message = held.first_hold().unwrap();
        assert!(
            message.starts_with("the dataset needs at least 12.0 MiB on node n1 but StagingQuota disk"),
            "{message}"
        );
        let raised = quota("disk", json!({"bytesPerNode": "12Mi"}));
        let fits = allowance(&new, &workers, 1, &Usage::default(), &[&raised], needs_12);
        assert_eq!(fits.room, BTreeMap::from([("n1".into(), 12 * MIB)]));
    }

    #[test]
    fn without_a_quota_no_worker_is_limited_and_a_claim_has_no_per_node_limit() {
        let claim = ds("c", json!({"volume": {"persistentVolumeClaim": {"claimName": "pvc"}}}), json!([]));
        let given = allowance(&claim, &[Worker::shared()], 1, &Usage::default(), &[], |_| None);
        assert!(given.room.is_empty() && given.held.is_empty());
        let per_node = quota("disk", json!({"bytesPerNode": "1Mi"}));
        let given = allowance(&claim, &[Worker::shared()], 1, &Usage::default(), &[&per_node], |_| None);
        assert!(given.room.is_empty() && given.held.is_empty(), "{given:?}");
    }

    #[test]
    fn a_quotas_status_shows_the_namespace_in_all_on_its_fullest_node_and_who_waits() {
        let a = ds(
            "a",
            host_path(),
            json!([
                {"name": "n1", "node": "n1", "phase": "Succeeded", "bytesDone": 3 * MIB, "bytesTotal": 3 * MIB},
                {"name": "n2", "node": "n2", "phase": "Succeeded", "bytesDone": 3 * MIB, "bytesTotal": 3 * MIB},
            ]),
        );
        let mut waiting =
            ds("w", host_path(), json!([{"name": "n2", "node": "n2", "phase": "Succeeded", "bytesTotal": MIB}]));
        waiting.status = Some(
            serde_json::from_value(json!({
                "phase": "Pending",
                "workers": [{"name": "n2", "node": "n2", "phase": "Succeeded", "bytesTotal": MIB}],
                "conditions": [{"type": "Progressing", "status": "True", "reason": "QuotaExceeded", "message": "m",
                                "lastTransitionTime": "2026-11-26T00:00:00Z"}],
            }))
            .unwrap(),
        );
        let status = quota_status([&a, &waiting]);
        assert_eq!((status.used_bytes, status.used_bytes_on_fullest_node), (7 * MIB as i64, 4 * MIB as i64));
        assert_eq!(status.fullest_node.as_deref(), Some("n2"));
        assert_eq!(status.used.as_deref(), Some("7.0 MiB in all, 4.0 MiB on n2"));
        assert_eq!(status.waiting_data_stages, 1);
        let empty = quota_status(std::iter::empty::<&DataStage>());
        assert_eq!((empty.used.as_deref(), empty.fullest_node), (Some("0 B in all"), None));
    }

    #[test]
    fn a_quota_wakes_its_namespace_when_it_comes_changes_or_goes_but_not_for_its_status() {
        use kube::runtime::watcher::Event;
        let at = |generation: i64, used: i64| {
            let mut quota = quota("disk", json!({"bytesPerNode": "1Gi"}));
            quota.metadata.generation = Some(generation);
            quota.status = Some(StagingQuotaStatus { used_bytes: used, ..Default::default() });
            quota
        };
        let mut wakes = QuotaWakes::default();
        assert_eq!(wakes.on(Event::Apply(at(1, 0))).len(), 1, "new");
        assert!(wakes.on(Event::Apply(at(1, 5))).is_empty(), "its status");
        assert_eq!(wakes.on(Event::Apply(at(2, 5))).len(), 1, "its spec");
        assert_eq!(wakes.on(Event::Delete(at(2, 5))).len(), 1, "gone");
        assert_eq!(wakes.on(Event::Apply(at(1, 0))).len(), 1, "back");
        // Deleted while the watch was down: missing from the next listing.
        wakes.on(Event::Init);
        assert!(
            wakes
                .on(Event::InitDone)
                .iter()
                .map(|q| (q.namespace(), q.name_any()))
                .eq([(Some("team".to_owned()), "disk".to_owned())])
        );
        assert!(wakes.on(Event::InitDone).is_empty(), "only once");
    }

    #[test]
    fn a_refused_worker_of_the_run_says_what_its_dataset_needs() {
        let refused = ds(
            "r",
            host_path(),
            json!([{"name": "n1", "node": "n1", "phase": "Failed", "run": 2, "reason": "QuotaExceeded", "bytesTotal": 12 * MIB}]),
        );
        assert_eq!(refused_need(&refused, "n1", 2), Some(12 * MIB));
        assert_eq!(refused_need(&refused, "n1", 3), None, "another run");
        assert!(refused_in(&refused, 2) && !refused_in(&refused, 1));
        let held = ds(
            "h",
            host_path(),
            json!([{"name": "n1", "node": "n1", "phase": "Pending", "run": 2, "reason": "QuotaExceeded"}]),
        );
        assert!(!refused_in(&held, 2), "held back before it started: it starts when there is room");
    }
}
