//! Which nodes a per-node DataStage stages onto: the nodes the scheduler
//! itself would accept for its workers. A node matches when it is
//! schedulable, has every `nodeSelector` label, satisfies the required
//! node affinity, and carries no `NoSchedule`/`NoExecute` taint the
//! tolerations do not allow. Pure functions over the Node objects, so the
//! rules are unit-tested without a cluster.
//!
//! A node that stops reporting keeps matching: the node lifecycle
//! controller's `not-ready` and `unreachable` taints are ignored, because
//! the node's disk, and the data on it, are still there. The DataStage
//! reports `NodeNotReady` while it lasts instead of dropping the node from
//! its workers or blocking; a node that is deleted stops matching.
//!
//! Not here: preferred affinity (a preference never excludes a node) and
//! pod (anti-)affinity, which concern other pods, not the node's disk.

use std::collections::BTreeMap;

use ferry_crds::Placement;
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};
use kube::ResourceExt as _;

/// Taints the node lifecycle controller puts on a node that is not Ready
/// (see the module header).
const NODE_DOWN_TAINTS: [&str; 2] = ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"];

/// The names of the nodes in `nodes` that `placement` accepts, sorted.
pub fn matching_nodes<'a>(placement: Option<&Placement>, nodes: impl IntoIterator<Item = &'a Node>) -> Vec<String> {
    let default = Placement::default();
    let placement = placement.unwrap_or(&default);
    let mut names: Vec<String> =
        nodes.into_iter().filter(|node| accepts(placement, node)).map(|node| node.name_any()).collect();
    names.sort();
    names
}

/// Whether a worker with `placement` could run on `node`.
pub fn accepts(placement: &Placement, node: &Node) -> bool {
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return false;
    }
    let labels = node.labels();
    let selector_ok = placement.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let required = placement
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    // Terms are ORed; an empty list of terms matches nothing, as in the scheduler.
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, labels, &node.name_any())));
    let tolerations = placement.tolerations.as_deref().unwrap_or_default();
    let taints_ok = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .filter(|t| !NODE_DOWN_TAINTS.contains(&t.key.as_str()))
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)));
    selector_ok && affinity_ok && taints_ok
}

/// A term matches when all its expressions and fields do; a term with
/// neither matches nothing (the scheduler's rule).
fn term_matches(term: &NodeSelectorTerm, labels: &BTreeMap<String, String>, name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions.iter().all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| r.key == "metadata.name" && requirement_matches(r, Some(name)))
}

fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |text: Option<&str>| text.and_then(|t| t.parse::<i64>().ok());
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|w| w == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|w| w != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => matches!((number(value), number(values.first().map(String::as_str))), (Some(a), Some(b)) if a > b),
        "Lt" => matches!((number(value), number(values.first().map(String::as_str))), (Some(a), Some(b)) if a < b),
        _ => false,
    }
}

/// The scheduler's toleration rule: an empty key with `Exists` tolerates
/// every taint; otherwise keys must be equal, the effect equal or empty,
/// and the value equal unless the operator is `Exists`.
fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
    let exists = toleration.operator.as_deref() == Some("Exists");
    let key = toleration.key.as_deref().unwrap_or_default();
    if key.is_empty() {
        return exists && effect_ok;
    }
    key == taint.key
        && effect_ok
        && (exists || toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, labels: serde_json::Value, spec: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec})).unwrap()
    }

    fn placement(value: serde_json::Value) -> Placement {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn required_node_affinity_narrows_the_nodes() {
        let nodes = [
            node("a", json!({"gpu": "h100", "rank": "3"}), json!({})),
            node("b", json!({"gpu": "a100", "rank": "9"}), json!({})),
            node("c", json!({}), json!({})),
        ];
        let affinity = |expressions: serde_json::Value| {
            placement(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}}))
        };
        let names = |p: &Placement| matching_nodes(Some(p), &nodes);
        assert_eq!(names(&affinity(json!([{"key": "gpu", "operator": "In", "values": ["h100"]}]))), ["a"]);
        assert_eq!(names(&affinity(json!([{"key": "gpu", "operator": "NotIn", "values": ["h100"]}]))), ["b", "c"]);
        assert_eq!(names(&affinity(json!([{"key": "gpu", "operator": "Exists"}]))), ["a", "b"]);
        assert_eq!(names(&affinity(json!([{"key": "gpu", "operator": "DoesNotExist"}]))), ["c"]);
        assert_eq!(names(&affinity(json!([{"key": "rank", "operator": "Gt", "values": ["5"]}]))), ["b"]);
        let by_name =
            placement(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["c"]}]},
                                  {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]}]}}}}));
        assert_eq!(names(&by_name), ["b", "c"], "terms are ORed");
    }

    #[test]
    fn taints_exclude_nodes_unless_tolerated_and_cordoned_nodes_are_skipped() {
        let nodes = [
            node("plain", json!({}), json!({})),
            node(
                "gpu",
                json!({}),
                json!({"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}),
            ),
            node("soft", json!({}), json!({"taints": [{"key": "x", "effect": "PreferNoSchedule"}]})),
            node("cordoned", json!({}), json!({"unschedulable": true})),
        ];
        assert_eq!(matching_nodes(None, &nodes), ["plain", "soft"]);
        let tolerant = placement(
            json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}),
        );
        assert_eq!(matching_nodes(Some(&tolerant), &nodes), ["gpu", "plain", "soft"]);
        let wrong_value =
            placement(json!({"tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]}));
        assert_eq!(matching_nodes(Some(&wrong_value), &nodes), ["plain", "soft"]);
        let everything = placement(json!({"tolerations": [{"operator": "Exists"}]}));
        assert_eq!(matching_nodes(Some(&everything), &nodes), ["gpu", "plain", "soft"]);
    }

    #[test]
    fn a_node_that_is_not_ready_still_matches_so_its_data_is_not_given_up() {
        let down = |key: &str| {
            node(
                "down",
                json!({}),
                json!({"taints": [{"key": key, "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute"}]}),
            )
        };
        for key in NODE_DOWN_TAINTS {
            assert_eq!(matching_nodes(None, &[down(key)]), ["down"], "{key}");
        }
        let other = node("other", json!({}), json!({"taints": [{"key": "x", "effect": "NoExecute"}]}));
        assert!(matching_nodes(None, &[other]).is_empty(), "other taints still exclude");
    }

    #[test]
    fn the_node_selector_and_affinity_must_both_hold() {
        let nodes =
            [node("a", json!({"pool": "gpu", "zone": "1"}), json!({})), node("b", json!({"pool": "gpu"}), json!({}))];
        let both = placement(json!({"nodeSelector": {"pool": "gpu"}, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "zone", "operator": "Exists"}]}]}}}}));
        assert_eq!(matching_nodes(Some(&both), &nodes), ["a"]);
    }
}
