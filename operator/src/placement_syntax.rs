//! Whether `spec.placement` is what the API server accepts in a pod: its
//! label keys and values, tolerations and node affinity terms, by the
//! rules Kubernetes validates a pod with.
//!
//! The CRD copies these fields from Kubernetes' own types, whose schema
//! says nothing of their syntax, so a DataStage with `nodeSelector:
//! {zone: "é"}` was admitted and every worker Job made from it refused:
//! the DataStage sat with no status while the operator retried. Judged at
//! admission instead (see [`crate::admission`]), the author is told which
//! field to fix. What is not checked here (pod affinity, a rule a newer
//! API server adds) still ends in a condition: the controller reports a
//! worker Job the API server refuses as `InvalidWorkerJob`.

use ferry_crds::Placement;
use k8s_openapi::api::core::v1::{NodeAffinity, NodeSelectorRequirement, NodeSelectorTerm, Toleration};

/// The longest label value, and the longest name part of a label key.
const MAX_NAME_PART: usize = 63;
/// The longest prefix of a label key (a DNS subdomain).
const MAX_PREFIX: usize = 253;

/// The first field of `placement` the API server would refuse in a pod,
/// as `(path, what is wrong)`.
pub fn placement_error(placement: &Placement) -> Option<(String, String)> {
    let base = "spec.placement";
    for (key, value) in placement.node_selector.iter().flatten() {
        let at = format!("{base}.nodeSelector[{key:?}]");
        if let Err(why) = label_key(key).and_then(|()| label_value(value)) {
            return Some((at, why));
        }
    }
    for (i, toleration) in placement.tolerations.iter().flatten().enumerate() {
        if let Err(why) = valid_toleration(toleration) {
            return Some((format!("{base}.tolerations[{i}]"), why));
        }
    }
    let node_affinity = placement.affinity.as_ref().and_then(|a| a.node_affinity.as_ref());
    node_affinity.and_then(|affinity| node_affinity_error(affinity, &format!("{base}.affinity.nodeAffinity")))
}

fn node_affinity_error(affinity: &NodeAffinity, at: &str) -> Option<(String, String)> {
    if let Some(required) = &affinity.required_during_scheduling_ignored_during_execution {
        let at = format!("{at}.requiredDuringSchedulingIgnoredDuringExecution");
        if required.node_selector_terms.is_empty() {
            return Some((format!("{at}.nodeSelectorTerms"), "must name at least one term".into()));
        }
        for (i, term) in required.node_selector_terms.iter().enumerate() {
            if let Some(error) = term_error(term, &format!("{at}.nodeSelectorTerms[{i}]")) {
                return Some(error);
            }
        }
    }
    for (i, preferred) in affinity.preferred_during_scheduling_ignored_during_execution.iter().flatten().enumerate() {
        let at = format!("{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}]");
        if !(1..=100).contains(&preferred.weight) {
            return Some((format!("{at}.weight"), format!("is {}; it must be from 1 to 100", preferred.weight)));
        }
        if let Some(error) = term_error(&preferred.preference, &format!("{at}.preference")) {
            return Some(error);
        }
    }
    None
}

fn term_error(term: &NodeSelectorTerm, at: &str) -> Option<(String, String)> {
    for (i, requirement) in term.match_expressions.iter().flatten().enumerate() {
        let at = format!("{at}.matchExpressions[{i}]");
        if let Err(why) = label_key(&requirement.key).and_then(|()| requirement_values(requirement)) {
            return Some((at, why));
        }
    }
    for (i, field) in term.match_fields.iter().flatten().enumerate() {
        let at = format!("{at}.matchFields[{i}]");
        let values = field.values.as_deref().unwrap_or_default();
        if field.key != "metadata.name" {
            return Some((at, format!("key {:?}: the only field a node is matched by is metadata.name", field.key)));
        }
        if !matches!(field.operator.as_str(), "In" | "NotIn") || values.len() != 1 {
            return Some((at, "metadata.name takes operator In or NotIn and exactly one value".into()));
        }
    }
    None
}

/// The values a node selector requirement's operator takes.
fn requirement_values(requirement: &NodeSelectorRequirement) -> Result<(), String> {
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => {
            Err(format!("operator {} needs at least one value", requirement.operator))
        }
        "In" | "NotIn" => values.iter().try_for_each(|v| label_value(v)),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Err(format!("operator {} takes no values", requirement.operator))
        }
        "Exists" | "DoesNotExist" => Ok(()),
        "Gt" | "Lt" if values.len() == 1 && values[0].parse::<i64>().is_ok() => Ok(()),
        "Gt" | "Lt" => Err(format!("operator {} takes exactly one integer value", requirement.operator)),
        other => Err(format!("operator {other:?} is not one of In, NotIn, Exists, DoesNotExist, Gt, Lt")),
    }
}

fn valid_toleration(toleration: &Toleration) -> Result<(), String> {
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration.operator.as_deref().unwrap_or_default();
    let value = toleration.value.as_deref().unwrap_or_default();
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if key.is_empty() {
        if operator != "Exists" {
            return Err("a toleration without a key matches every taint only with operator Exists".into());
        }
    } else {
        label_key(key)?;
    }
    match operator {
        "" | "Equal" => label_value(value)?,
        "Exists" if !value.is_empty() => return Err("operator Exists takes no value".into()),
        "Exists" => {}
        other => return Err(format!("operator {other:?} is not Equal or Exists")),
    }
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!("effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"));
    }
    if toleration.toleration_seconds.is_some() && effect != "NoExecute" {
        return Err("tolerationSeconds applies to effect NoExecute only".into());
    }
    Ok(())
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of
/// at most 63 alphanumerics, `-`, `_` and `.`, alphanumeric at both ends.
pub fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !dns_subdomain(prefix)
    {
        return Err(format!(
            "key {key:?}: the part before / must be a lowercase DNS subdomain (such as example.com) of at most {MAX_PREFIX} characters"
        ));
    }
    if name.is_empty() || !label_name(name) {
        return Err(format!(
            "key {key:?}: the name must be 1 to {MAX_NAME_PART} letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`,
/// alphanumeric at both ends.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || label_name(value) {
        return Ok(());
    }
    Err(format!(
        "value {value:?} must be at most {MAX_NAME_PART} letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
    ))
}

fn label_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    name.len() <= MAX_NAME_PART
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.iter().all(inner)
}

fn dns_subdomain(name: &str) -> bool {
    let label = |part: &str| {
        let bytes = part.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes.iter().all(|b| alnum(b) || *b == b'-')
    };
    !name.is_empty() && name.len() <= MAX_PREFIX && name.split('.').all(label)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn placement(value: serde_json::Value) -> Placement {
        serde_json::from_value(value).unwrap()
    }

    fn error(value: serde_json::Value) -> Option<String> {
        placement_error(&placement(value)).map(|(at, why)| format!("{at}: {why}"))
    }

    #[test]
    fn label_keys_and_values_follow_the_api_servers_rules() {
        for good in ["zone", "topology.kubernetes.io/zone", "a", "A-b_c.d", "ferry.dev/e2e-node", &"k".repeat(63)] {
            assert_eq!(label_key(good), Ok(()), "{good}");
        }
        for bad in
            ["", "/", "a/", "/a", "é", "-a", "a-", "UPPER.example/x", "a b", "<script>", &"k".repeat(64), "a/b/c"]
        {
            assert!(label_key(bad).is_err(), "{bad}");
        }
        assert!(label_key(&format!("{}/x", "a".repeat(254))).is_err());
        for good in ["", "a", "Node-1", "1.2_3", &"v".repeat(63)] {
            assert_eq!(label_value(good), Ok(()), "{good}");
        }
        for bad in ["é", " ", "-", "a-", "/mnt/ferry/", &"v".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_placement_the_api_server_takes_passes() {
        let ok = json!({
            "nodeSelector": {"ferry.dev/e2e-node": "node-a", "pool": ""},
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "team", "value": "ml", "effect": "NoExecute", "tolerationSeconds": 30},
                {"operator": "Exists"}
            ],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["nvme"]},
                                          {"key": "cores", "operator": "Gt", "values": ["8"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}
                ]
            }}
        });
        assert_eq!(error(ok), None);
        assert_eq!(error(json!({})), None);
    }

    #[test]
    fn what_the_api_server_would_refuse_is_named_with_its_path() {
        let cases = [
            (json!({"nodeSelector": {"zone": "é"}}), "spec.placement.nodeSelector[\"zone\"]: value \"é\""),
            (json!({"nodeSelector": {"<x>": "a"}}), "spec.placement.nodeSelector[\"<x>\"]: key \"<x>\""),
            (json!({"tolerations": [{"key": "<script>alert(1)</script>"}]}), "spec.placement.tolerations[0]: key"),
            (
                json!({"tolerations": [{"key": "/mnt/ferry/", "operator": "Exists"}]}),
                "spec.placement.tolerations[0]: key",
            ),
            (json!({"tolerations": [{"value": "x"}]}), "without a key"),
            (json!({"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}), "takes no value"),
            (json!({"tolerations": [{"key": "a", "operator": "Gt"}]}), "is not Equal or Exists"),
            (json!({"tolerations": [{"key": "a", "effect": "Sometimes"}]}), "effect \"Sometimes\""),
            (json!({"tolerations": [{"key": "a", "tolerationSeconds": 5}]}), "NoExecute only"),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}),
                "nodeSelectorTerms: must name at least one term",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "In"}]}]}}}}),
                "matchExpressions[0]: operator In needs at least one value",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "a", "operator": "Lt", "values": ["x"]}]}]}}}}),
                "exactly one integer",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["x"]}]}]}}}}),
                "matchFields[0]: key \"metadata.labels\"",
            ),
            (
                json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 0, "preference": {}}]}}}),
                "preferredDuringSchedulingIgnoredDuringExecution[0].weight: is 0",
            ),
        ];
        for (spec, expected) in cases {
            let got = error(spec.clone()).unwrap_or_else(|| panic!("{spec} passed"));
            assert!(got.contains(expected), "{spec}: {got}");
        }
    }
}
