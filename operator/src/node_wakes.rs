//! Which Node watch events wake DataStages. A node that appears, one whose
//! labels, taints, cordon or readiness change (what decides whether a
//! placement matches it and whether its workers can run), and one that is
//! deleted. Status heartbeats, which change a node every few seconds, wake
//! nothing.
//!
//! kube-runtime's `predicate_filter` cannot be used here: a deleted node
//! carries the same labels and conditions it had, so a predicate over them
//! takes the deletion for "nothing changed" and drops it. A DataStage pinned
//! to that node then learned of the deletion only when something else woke
//! it (the pod garbage collector, a minute later, or the periodic requeue).

use std::collections::{HashMap, HashSet};
use std::hash::{Hash as _, Hasher as _};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::runtime::watcher::Event;

/// The last fingerprint of every node seen, to tell a change from a
/// heartbeat, and the names listed since a watch restarted, to find the
/// nodes deleted while it was down.
#[derive(Debug, Default)]
pub struct NodeWakes {
    fingerprints: HashMap<String, u64>,
    relisted: Option<HashSet<String>>,
}

impl NodeWakes {
    /// The nodes `event` should wake the DataStages of. A node deleted
    /// while the watch was down shows only as missing from the next
    /// listing; it is returned, by name alone, once that listing is done.
    pub fn on(&mut self, event: Event<Node>) -> Vec<Node> {
        match event {
            Event::Init => {
                self.relisted = Some(HashSet::new());
                Vec::new()
            }
            Event::InitApply(node) => {
                if let Some(listed) = &mut self.relisted {
                    listed.insert(node.name_any());
                }
                self.applied(node)
            }
            Event::Apply(node) => self.applied(node),
            Event::InitDone => {
                let Some(listed) = self.relisted.take() else { return Vec::new() };
                let gone: Vec<String> =
                    self.fingerprints.keys().filter(|name| !listed.contains(*name)).cloned().collect();
                for name in &gone {
                    self.fingerprints.remove(name);
                }
                gone.into_iter().map(named).collect()
            }
            Event::Delete(node) => {
                self.fingerprints.remove(&node.name_any());
                vec![node]
            }
        }
    }

    fn applied(&mut self, node: Node) -> Vec<Node> {
        let fingerprint = placement_fingerprint(&node);
        if self.fingerprints.insert(node.name_any(), fingerprint) == Some(fingerprint) {
            Vec::new()
        } else {
            vec![node]
        }
    }
}

/// A Node object with only its name: what waking needs of a deleted one.
fn named(name: String) -> Node {
    Node { metadata: ObjectMeta { name: Some(name), ..ObjectMeta::default() }, ..Node::default() }
}

/// What of a node decides whether a placement matches it (labels, taints,
/// whether it is cordoned) and whether its workers can run (Ready).
///
/// Not the labels that say which copies a node holds (`data.ferry.dev/`):
/// each pull puts its own there as it finishes, and when those woke every
/// DataStage on the node, each of a burst of 1,000 pulls onto one node was
/// woken by the other 999 finishing. A placement that selects on them is
/// woken by its requeue instead.
fn placement_fingerprint(node: &Node) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for label in node.labels().iter().filter(|(key, _)| !key.starts_with(ferry_crds::names::NODE_DATA_PREFIX)) {
        label.hash(&mut hasher);
    }
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.unschedulable).hash(&mut hasher);
    for taint in spec.and_then(|s| s.taints.as_ref()).into_iter().flatten() {
        (&taint.key, &taint.value, &taint.effect).hash(&mut hasher);
    }
    crate::cache::ready_condition(node).map(|c| &c.status).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, ready: &str, heartbeat: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"zone": "a"}},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}]}}))
        .unwrap()
    }

    fn names(nodes: Vec<Node>) -> Vec<String> {
        nodes.iter().map(kube::ResourceExt::name_any).collect()
    }

    #[test]
    fn changes_and_deletions_wake_and_heartbeats_do_not() {
        let mut wakes = NodeWakes::default();
        assert_eq!(names(wakes.on(Event::Apply(node("a", "True", "2026-01-01T00:00:00Z")))), ["a"], "new");
        assert!(wakes.on(Event::Apply(node("a", "True", "2026-01-01T00:00:10Z"))).is_empty(), "a heartbeat");
        assert_eq!(names(wakes.on(Event::Apply(node("a", "False", "2026-01-01T00:00:20Z")))), ["a"], "not Ready");
        // Deleted with the very labels and conditions it last had.
        assert_eq!(names(wakes.on(Event::Delete(node("a", "False", "2026-01-01T00:00:20Z")))), ["a"], "deleted");
        assert_eq!(names(wakes.on(Event::Apply(node("a", "False", "2026-01-01T00:00:20Z")))), ["a"], "back");
    }

    #[test]
    fn a_copy_label_wakes_nothing_and_any_other_label_does() {
        let mut wakes = NodeWakes::default();
        let mut labelled = node("a", "True", "2026-01-01T00:00:00Z");
        wakes.on(Event::Apply(labelled.clone()));
        let labels = labelled.metadata.labels.get_or_insert_default();
        labels.insert(format!("{}team-a.pull", ferry_crds::names::NODE_DATA_PREFIX), "uid-1".into());
        assert!(wakes.on(Event::Apply(labelled.clone())).is_empty(), "a copy's label");
        labelled.metadata.labels.get_or_insert_default().insert("disk".into(), "nvme".into());
        assert_eq!(names(wakes.on(Event::Apply(labelled))), ["a"], "a label placements select on");
    }

    #[test]
    fn a_node_missing_from_a_new_listing_was_deleted_while_the_watch_was_down() {
        let mut wakes = NodeWakes::default();
        for name in ["a", "b", "c"] {
            wakes.on(Event::Apply(node(name, "True", "2026-01-01T00:00:00Z")));
        }
        assert!(wakes.on(Event::Init).is_empty());
        assert!(wakes.on(Event::InitApply(node("a", "True", "2026-01-01T00:01:00Z"))).is_empty(), "unchanged");
        assert_eq!(names(wakes.on(Event::InitApply(node("c", "False", "2026-01-01T00:01:00Z")))), ["c"]);
        assert_eq!(names(wakes.on(Event::InitDone)), ["b"], "b was not listed");
        assert!(wakes.on(Event::InitDone).is_empty(), "a second InitDone without a listing wakes nothing");
    }
}
