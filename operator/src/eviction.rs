//! Evicting copies of DataStages that no pod uses, to make room on a node
//! for a pull that waits there.
//!
//! A DataStage that allows it (`spec.capacity.eviction:
//! WhenSpaceIsNeeded`) may lose its copy on a node when another pull waits
//! for room there (`InsufficientCapacity`, see [`crate::disks`]). The copies
//! that may go are those whose run finished staging on that node's
//! filesystem and that no pod uses there: no pod of the DataStage runs on
//! that node, and none waits unplaced (a gated pod may land anywhere).
//! They go least recently used first, and only as many as make the room
//! the waiting pull lacks; when all of them together would not, none goes.
//!
//! Both sides reach the same choice from the caches alone: the waiting
//! DataStage names its victims in its message and wakes them; each victim,
//! in its own reconciliation, finds itself chosen, marks its entry for that
//! node evicted (from then on the node does not count as holding the data,
//! so no pod is sent there), and runs its clean-up Job there. Only the
//! owner of a status writes it, and only the owner creates its Jobs. When
//! the clean-up succeeds, the node counts as cleaned ([`crate::disks`]'s
//! sign of room) and the waiting pull starts again.
//!
//! With `spec.capacity.idleSeconds` a copy also goes once no pod used it
//! for that long, room needed or not.
//!
//! An evicted copy is staged again when a pod waits for it: a gated pod of a
//! DataStage that no node holds any more, or a pod on a node whose copy was
//! evicted (its init container waits there). That is a new run, which
//! stages every node again (nodes that kept the data list it and copy
//! nothing).
//!
//! Pure functions over the DataStages and pods the caches hold.

use std::collections::{BTreeMap, BTreeSet};

use ferry_crds::{DataStage, EvictionPolicy, NodeCache, WorkerStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt as _;

use crate::webhook::wiring::{DataRequest, GATED_LABEL};

/// How stale a copy's `lastUsedTime` may get while pods use it: the
/// operator writes it at most this often per DataStage.
pub const USE_RESOLUTION: std::time::Duration = std::time::Duration::from_secs(300);

/// Where the pods that read DataStages are, from the pods the caches hold
/// (every pod labelled with a DataStage), and the eviction policy each
/// NodeCache sets for the DataStages in it that set none.
#[derive(Debug, Default)]
pub struct InUse {
    /// Per NodeCache: its `spec.eviction`, where it has one.
    node_cache_evictions: BTreeMap<String, EvictionPolicy>,
    /// Per (namespace, DataStage): the nodes its unfinished pods run on.
    on_nodes: BTreeMap<(String, String), BTreeSet<String>>,
    /// DataStages an unfinished pod wants that is not on a node yet.
    unplaced: BTreeSet<(String, String)>,
    /// DataStages a pod waits for behind its scheduling gate.
    gated: BTreeSet<(String, String)>,
}

impl InUse {
    /// Reads the pods: Ferry's own workers and clean-ups (which ask for no
    /// data, see [`DataRequest::of`]) and finished pods use nothing.
    pub fn of<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Self {
        let mut in_use = InUse::default();
        for pod in pods {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            let Ok(Some(request)) = DataRequest::of(pod) else { continue };
            let namespace = pod.namespace().unwrap_or_default();
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            let gated = pod.labels().contains_key(GATED_LABEL);
            for name in request.names {
                let key = (namespace.clone(), name);
                match &node {
                    Some(node) => {
                        in_use.on_nodes.entry(key).or_default().insert(node.clone());
                    }
                    None => {
                        if gated {
                            in_use.gated.insert(key.clone());
                        }
                        in_use.unplaced.insert(key);
                    }
                }
            }
        }
        in_use
    }

    /// With the eviction policies of `caches`.
    #[must_use]
    pub fn with_node_caches<'a>(mut self, caches: impl IntoIterator<Item = &'a NodeCache>) -> Self {
        self.node_cache_evictions =
            caches.into_iter().filter_map(|cache| Some((cache.name_any(), cache.spec.eviction?))).collect();
        self
    }

    /// Whether `ds` allows its copies to be evicted: its own
    /// `spec.capacity.eviction`, else its NodeCache's.
    pub fn evictable(&self, ds: &DataStage) -> bool {
        let cache = ds.spec.destination.volume.as_ref().and_then(|v| v.node_cache.as_deref());
        evictable(ds, cache.and_then(|name| self.node_cache_evictions.get(name).copied()))
    }

    /// Whether a pod of `ds` runs on `node`, or may land there.
    pub fn uses(&self, ds: &DataStage, node: &str) -> bool {
        let key = key(ds);
        self.unplaced.contains(&key) || self.on_nodes.get(&key).is_some_and(|nodes| nodes.contains(node))
    }

    /// Whether a pod waits for `ds`'s data where no copy is: behind its
    /// gate while no node holds it, or on a node whose copy was evicted
    /// (an init container running `ferry-stager wait`).
    pub fn waits_for(&self, ds: &DataStage) -> bool {
        let key = key(ds);
        if self.gated.contains(&key) && evicted_everywhere(ds) {
            return true;
        }
        let Some(nodes) = self.on_nodes.get(&key) else { return false };
        let Some(status) = ds.status.as_ref() else { return false };
        status.staged_copies().any(|w| w.evicted.is_some() && w.node.as_ref().is_some_and(|node| nodes.contains(node)))
    }
}

fn key(ds: &DataStage) -> (String, String) {
    (ds.namespace().unwrap_or_default(), ds.name_any())
}

/// One copy chosen for eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Its DataStage's namespace.
    pub namespace: String,
    /// Its DataStage's name.
    pub name: String,
    /// The node it is evicted from.
    pub node: String,
    /// What it holds there.
    pub bytes: u64,
    /// For a person: which pull needs the room.
    pub message: String,
}

/// What a pull refused for room can expect of eviction.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Copies to evict now.
    pub victims: Vec<Victim>,
    /// For the waiting DataStage's message: what eviction does for it, or
    /// why it cannot help (empty when no copy on its nodes may be evicted).
    pub notes: Vec<String>,
}

/// The copies to evict for `waiting` (a DataStage refused for room, with
/// `refused` its refused workers from [`crate::disks::refused_for_room`])
/// among `datastages` (every DataStage the caches hold), given where pods
/// use them.
pub fn plan_for<'a>(
    waiting: &DataStage,
    refused: &[&WorkerStatus],
    datastages: impl IntoIterator<Item = &'a DataStage> + Clone,
    in_use: &InUse,
) -> Plan {
    let mut plan = Plan::default();
    let who = format!("{}/{}", waiting.namespace().unwrap_or_default(), waiting.name_any());
    for worker in refused {
        let (Some(node), Some(disk)) = (worker.node.as_deref(), worker.disk.as_ref()) else { continue };
        let Some(needed) = disk.needed_bytes else { continue };
        let shortfall = (needed + disk.claimed_bytes.unwrap_or(0)).saturating_sub(disk.free_bytes);
        // Copies already marked and still being removed will free their
        // bytes: counting them keeps one shortfall from evicting twice.
        let (mut coming, mut evicting) = (0, Vec::new());
        let mut candidates = Vec::new();
        for ds in datastages.clone() {
            if key(ds) == key(waiting) {
                continue;
            }
            let Some(entry) = copy_on(ds, node, &disk.filesystem) else { continue };
            let bytes = u64::try_from(entry.bytes_done).unwrap_or(0);
            match &entry.evicted {
                Some(eviction) if !eviction.removed => {
                    coming += bytes;
                    evicting.push(format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any()));
                }
                Some(_) => {}
                None if in_use.evictable(ds) && !in_use.uses(ds, node) => {
                    candidates.push((last_used(ds, entry), ds, bytes))
                }
                None => {}
            }
        }
        // The note names every copy that goes, so that it reads the same
        // before and after they are marked (a changed message is a new
        // Event).
        let makes_room = |names: &[String]| format!("evicting {} from node {node} makes the room", names.join(", "));
        if coming >= shortfall && coming > 0 {
            plan.notes.push(makes_room(&evicting));
            continue;
        }
        candidates.sort_by_key(|(used, ds, _)| (*used, ds.namespace(), ds.name_any()));
        let available: u64 = candidates.iter().map(|(_, _, bytes)| bytes).sum();
        if candidates.is_empty() {
            continue;
        }
        if coming + available < shortfall {
            plan.notes.push(format!(
                "evicting every idle copy on node {node} would free only {} of the {} it lacks, so none is evicted",
                human(coming + available),
                human(shortfall)
            ));
            continue;
        }
        let mut freed = coming;
        let mut chosen = evicting;
        for (_, ds, bytes) in candidates {
            if freed >= shortfall {
                break;
            }
            freed += bytes;
            let (namespace, name) = key(ds);
            chosen.push(format!("{namespace}/{name}"));
            plan.victims.push(Victim {
                namespace,
                name,
                node: node.to_owned(),
                bytes,
                message: format!("evicted from node {node} to make room for {who}, which needs {}", human(shortfall)),
            });
        }
        plan.notes.push(makes_room(&chosen));
    }
    plan
}

fn human(bytes: u64) -> String {
    ferry_contract::size::human_bytes(bytes)
}

/// Whether `ds` allows its copies to be evicted: its own
/// `spec.capacity.eviction`, else `cache_default`, the policy of the
/// NodeCache it stages into.
pub fn evictable(ds: &DataStage, cache_default: Option<EvictionPolicy>) -> bool {
    ds.spec.capacity.as_ref().and_then(|c| c.eviction).or(cache_default) == Some(EvictionPolicy::WhenSpaceIsNeeded)
}

/// `ds`'s entry on `node` when it is a staged copy of its current run on
/// `filesystem`.
fn copy_on<'a>(ds: &'a DataStage, node: &str, filesystem: &str) -> Option<&'a WorkerStatus> {
    ds.status
        .as_ref()?
        .staged_copies()
        .find(|w| w.node.as_deref() == Some(node) && w.disk.as_ref().is_some_and(|d| d.filesystem == filesystem))
}

/// When the copy was last used, in seconds since the epoch: a pod's last
/// use, else when its DataStage last finished a sync (never used: as old
/// as the data).
fn last_used(ds: &DataStage, entry: &WorkerStatus) -> i64 {
    let status = ds.status.as_ref();
    entry
        .last_used_time
        .as_ref()
        .or_else(|| status.and_then(|s| s.last_sync_time.as_ref()))
        .map_or(0, |t| t.0.as_second())
}

/// Every DataStage that waits for room now, with its refused workers.
pub fn waiting<'a>(datastages: impl IntoIterator<Item = &'a DataStage>) -> Vec<(&'a DataStage, Vec<&'a WorkerStatus>)> {
    datastages
        .into_iter()
        .filter_map(|ds| {
            let run = ds.status.as_ref()?.run?;
            let refused = crate::disks::refused_for_room(ds, run);
            (!refused.is_empty()).then_some((ds, refused))
        })
        .collect()
}

/// The copies of `ds` that the DataStages waiting for room chose: node and
/// message, one per node.
pub fn chosen<'a>(
    ds: &DataStage,
    datastages: impl IntoIterator<Item = &'a DataStage> + Clone,
    in_use: &InUse,
) -> BTreeMap<String, Victim> {
    let mut mine = BTreeMap::new();
    if !in_use.evictable(ds) {
        return mine;
    }
    let (namespace, name) = key(ds);
    for (waiter, refused) in waiting(datastages.clone()) {
        for victim in plan_for(waiter, &refused, datastages.clone(), in_use).victims {
            if victim.namespace == namespace && victim.name == name {
                mine.entry(victim.node.clone()).or_insert(victim);
            }
        }
    }
    mine
}

/// The copies of `ds` that no pod used for its `spec.capacity.idleSeconds`
/// by `now` (seconds since the epoch), by node; and when the next of the
/// others comes due, if one will.
pub fn idle_copies(ds: &DataStage, in_use: &InUse, now: i64) -> (BTreeMap<String, Victim>, Option<i64>) {
    let mut due = BTreeMap::new();
    let mut next = None;
    let idle_seconds = ds.spec.capacity.as_ref().and_then(|c| c.idle_seconds).filter(|_| in_use.evictable(ds));
    let (Some(idle_seconds), Some(status)) = (idle_seconds, ds.status.as_ref()) else { return (due, next) };
    let (namespace, name) = key(ds);
    for entry in status.staged_copies() {
        let Some(node) = entry.node.as_deref() else { continue };
        if entry.evicted.is_some() || in_use.uses(ds, node) {
            continue;
        }
        let at = last_used(ds, entry).saturating_add(idle_seconds);
        if at > now {
            next = Some(next.map_or(at, |n: i64| n.min(at)));
            continue;
        }
        due.insert(
            node.to_owned(),
            Victim {
                namespace: namespace.clone(),
                name: name.clone(),
                node: node.to_owned(),
                bytes: u64::try_from(entry.bytes_done).unwrap_or(0),
                message: format!(
                    "evicted from node {node}: no pod used it for {idle_seconds} s (spec.capacity.idleSeconds)"
                ),
            },
        );
    }
    (due, next)
}

/// Whether every node that staged `ds`'s current run has had its copy
/// evicted (so no node holds the data).
pub fn evicted_everywhere(ds: &DataStage) -> bool {
    let Some(status) = ds.status.as_ref() else { return false };
    let mut staged = status.staged_copies().peekable();
    staged.peek().is_some() && staged.all(|w| w.evicted.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIB: u64 = 1 << 20;

    fn stage(name: &str, eviction: Option<&str>, status: serde_json::Value) -> DataStage {
        let mut spec = json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/ferry/x"}}});
        if let Some(policy) = eviction {
            spec["capacity"] = json!({"eviction": policy});
        }
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": "team", "uid": name},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn disk(free: u64, needed: Option<u64>) -> serde_json::Value {
        let mut d = json!({"filesystem": "8:1", "sizeBytes": 64 * MIB, "freeBytes": free, "measuredAt": 100});
        if let Some(needed) = needed {
            d["neededBytes"] = needed.into();
        }
        d
    }

    fn held(node: &str, bytes: u64, used: Option<&str>) -> serde_json::Value {
        let mut w = json!({"name": node, "node": node, "phase": "Succeeded", "run": 1,
            "bytesDone": bytes, "disk": disk(0, None)});
        if let Some(used) = used {
            w["lastUsedTime"] = used.into();
        }
        w
    }

    fn idle(name: &str, node: &str, bytes: u64, used: &str) -> DataStage {
        stage(
            name,
            Some("WhenSpaceIsNeeded"),
            json!({"run": 1, "phase": "Succeeded", "workers": [held(node, bytes, Some(used))]}),
        )
    }

    fn waiter(node: &str, free: u64, needed: u64) -> DataStage {
        stage(
            "new",
            None,
            json!({"run": 2, "phase": "Pending", "workers": [{
            "name": node, "node": node, "phase": "Failed", "run": 2, "reason": "InsufficientCapacity",
            "disk": disk(free, Some(needed))}]}),
        )
    }

    fn pod(datastage: &str, node: Option<&str>, gated: bool, phase: &str) -> Pod {
        let mut labels = json!({"ferry.dev/datastage": datastage});
        if gated {
            labels["ferry.dev/data-gated"] = "true".into();
        }
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "team", "labels": labels},
            "spec": {"nodeName": node, "containers": []}, "status": {"phase": phase}}))
        .unwrap()
    }

    fn plan(waiting: &DataStage, all: &[DataStage], in_use: &InUse) -> Plan {
        let refused = crate::disks::refused_for_room(waiting, 2);
        plan_for(waiting, &refused, all.iter(), in_use)
    }

    fn names(plan: &Plan) -> Vec<&str> {
        plan.victims.iter().map(|v| v.name.as_str()).collect()
    }

    #[test]
    fn a_node_cache_sets_the_eviction_policy_of_the_datastages_in_it_that_set_none() {
        let in_cache = |name: &str, eviction: Option<&str>| {
            let mut ds = idle(name, "node-a", 8 * MIB, "2026-01-01T00:00:00Z");
            ds.spec.destination.volume.as_mut().unwrap().host_path = None;
            ds.spec.destination.volume.as_mut().unwrap().node_cache = Some("nvme".into());
            ds.spec.capacity.as_mut().unwrap().eviction = eviction.map(|e| serde_json::from_value(json!(e)).unwrap());
            ds
        };
        let cache = |eviction: &str| -> NodeCache {
            serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "NodeCache",
                "metadata": {"name": "nvme"}, "spec": {"root": "/var/lib/ferry/nvme", "eviction": eviction}}))
            .unwrap()
        };
        let all = [in_cache("follows", None), in_cache("never", Some("Never")), waiter("node-a", 0, 4 * MIB)];
        let evicting = InUse::default().with_node_caches([&cache("WhenSpaceIsNeeded")]);
        assert_eq!(names(&plan(&all[2], &all, &evicting)), ["follows"], "its own Never wins over the cache's");
        let keeping = InUse::default().with_node_caches([&cache("Never")]);
        assert!(names(&plan(&all[2], &all, &keeping)).is_empty());
        assert!(names(&plan(&all[2], &all, &InUse::default())).is_empty(), "no policy anywhere: Never");
        assert!(evictable(&all[0], Some(EvictionPolicy::WhenSpaceIsNeeded)) && !evictable(&all[0], None));
    }

    #[test]
    fn the_least_recently_used_copies_go_first_and_only_as_many_as_make_the_room() {
        let new = waiter("a", 10 * MIB, 24 * MIB);
        let all = vec![
            new.clone(),
            idle("recent", "a", 20 * MIB, "2026-03-01T00:00:00Z"),
            idle("old", "a", 8 * MIB, "2026-01-01T00:00:00Z"),
            idle("older", "a", 4 * MIB, "2025-12-01T00:00:00Z"),
            idle("elsewhere", "b", 40 * MIB, "2020-01-01T00:00:00Z"),
        ];
        let plan = plan(&new, &all, &InUse::default());
        assert_eq!(names(&plan), ["older", "old", "recent"], "14 MiB short: 4 + 8 is not enough");
        assert!(plan.victims[0].message.contains("to make room for team/new"), "{:?}", plan.victims[0]);
        let plan_b = super::plan_for(&new, &crate::disks::refused_for_room(&new, 2), all.iter(), &InUse::default());
        assert_eq!(plan_b, plan, "the same caches give the same choice");
        let enough = waiter("a", 20 * MIB, 24 * MIB);
        assert_eq!(
            names(&super::plan_for(
                &enough,
                &crate::disks::refused_for_room(&enough, 2),
                all.iter(),
                &InUse::default()
            )),
            ["older"]
        );
    }

    #[test]
    fn copies_in_use_copies_that_never_allowed_it_and_copies_being_staged_stay() {
        let new = waiter("a", 0, 8 * MIB);
        let running = stage(
            "running",
            Some("WhenSpaceIsNeeded"),
            json!({"run": 1, "phase": "Running",
            "workers": [{"name": "a", "node": "a", "phase": "Running", "run": 1, "bytesDone": 50 * MIB, "disk": disk(0, None)}]}),
        );
        let kept = stage("kept", None, json!({"run": 1, "phase": "Succeeded", "workers": [held("a", 50 * MIB, None)]}));
        let used = idle("used", "a", 50 * MIB, "2020-01-01T00:00:00Z");
        let wanted = idle("wanted", "a", 50 * MIB, "2020-01-01T00:00:00Z");
        let other_fs = {
            let mut ds = idle("otherfs", "a", 50 * MIB, "2020-01-01T00:00:00Z");
            ds.status.as_mut().unwrap().workers[0].disk.as_mut().unwrap().filesystem = "8:2".into();
            ds
        };
        let all = vec![new.clone(), running, kept, used, wanted, other_fs];
        let pods = [
            pod("used", Some("a"), false, "Running"),
            pod("wanted", None, true, "Pending"),
            pod("kept", Some("a"), false, "Succeeded"),
        ];
        let in_use = InUse::of(pods.iter());
        assert!(!in_use.waits_for(&all[4]), "a gated pod waits for data only where no node holds it");
        assert_eq!(plan(&new, &all, &in_use), Plan::default());
        // The pod that used "used" finished: its copy may go.
        let pods = [pod("used", Some("a"), false, "Succeeded")];
        assert_eq!(names(&plan(&new, &all, &InUse::of(pods.iter()))), ["used"]);
        // A pod on another node does not hold this node's copy.
        let pods = [pod("used", Some("b"), false, "Running"), pod("wanted", Some("b"), false, "Running")];
        assert_eq!(names(&plan(&new, &all, &InUse::of(pods.iter()))), ["used"]);
    }

    #[test]
    fn a_copy_unused_for_its_idle_seconds_goes_and_the_others_say_when_they_will() {
        let at = |text: &str| text.parse::<k8s_openapi::jiff::Timestamp>().unwrap().as_second();
        let mut ds = stage(
            "d",
            Some("WhenSpaceIsNeeded"),
            json!({"run": 1, "phase": "Succeeded",
            "lastSyncTime": "2026-01-01T00:00:00Z",
            "workers": [held("a", MIB, Some("2026-01-01T01:00:00Z")), held("b", MIB, None), held("c", MIB, None)]}),
        );
        ds.spec.capacity.as_mut().unwrap().idle_seconds = Some(3600);
        let reading = [pod("d", Some("c"), false, "Running")];
        let in_use = InUse::of(reading.iter());
        let (due, next) = idle_copies(&ds, &in_use, at("2026-01-01T01:30:00Z"));
        assert_eq!(due.keys().collect::<Vec<_>>(), ["b"], "b was staged an hour and a half ago, never used");
        assert!(due["b"].message.contains("no pod used it for 3600 s"), "{:?}", due["b"]);
        assert_eq!(next, Some(at("2026-01-01T02:00:00Z")), "a was used an hour later; c is in use");
        let (due, next) = idle_copies(&ds, &in_use, at("2026-01-01T02:00:00Z"));
        assert_eq!((due.len(), next), (2, None));
        ds.spec.capacity.as_mut().unwrap().eviction = Some(EvictionPolicy::Never);
        assert_eq!(idle_copies(&ds, &in_use, at("2030-01-01T00:00:00Z")), (BTreeMap::new(), None));
    }

    #[test]
    fn nothing_goes_when_evicting_everything_would_not_make_the_room() {
        let new = waiter("a", 0, 30 * MIB);
        let all = vec![new.clone(), idle("small", "a", 10 * MIB, "2020-01-01T00:00:00Z")];
        let plan = plan(&new, &all, &InUse::default());
        assert!(plan.victims.is_empty());
        assert!(plan.notes[0].contains("would free only 10.0 MiB of the 30.0 MiB"), "{:?}", plan.notes);
    }

    #[test]
    fn a_copy_being_removed_counts_so_one_shortfall_evicts_once_and_the_victim_sees_its_choice() {
        let new = waiter("a", 0, 8 * MIB);
        let mut marked = idle("first", "a", 10 * MIB, "2020-01-01T00:00:00Z");
        let all = vec![new.clone(), marked.clone(), idle("second", "a", 10 * MIB, "2021-01-01T00:00:00Z")];
        assert_eq!(names(&plan(&new, &all, &InUse::default())), ["first"]);
        let mine = chosen(&all[1], all.iter(), &InUse::default());
        assert_eq!(mine.keys().collect::<Vec<_>>(), ["a"]);
        assert!(chosen(&all[2], all.iter(), &InUse::default()).is_empty());

        marked.status.as_mut().unwrap().workers[0].evicted =
            Some(serde_json::from_value(json!({"time": "2026-01-01T00:00:00Z", "message": "m"})).unwrap());
        let all = vec![new.clone(), marked.clone(), all[2].clone()];
        let plan = plan(&new, &all, &InUse::default());
        assert!(plan.victims.is_empty(), "{plan:?}");
        assert_eq!(plan.notes, ["evicting team/first from node a makes the room"], "as before it was marked");
        assert!(!evicted_everywhere(&all[2]));
        assert!(evicted_everywhere(&marked));
        let gated = [pod("first", None, true, "Pending")];
        assert!(InUse::of(gated.iter()).waits_for(&marked) && !InUse::of(gated.iter()).waits_for(&all[2]));
        let on_node = [pod("first", Some("a"), false, "Pending")];
        assert!(InUse::of(on_node.iter()).waits_for(&marked), "a pod on the evicted node waits there");
        let elsewhere = [pod("first", Some("b"), false, "Running")];
        assert!(!InUse::of(elsewhere.iter()).waits_for(&marked));
    }
}
