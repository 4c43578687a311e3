//! How pods read node-local data without a hostPath: a PersistentVolume
//! Ferry manages and a claim bound to it in the DataStage's namespace
//! (pure builders; the controller applies them).
//!
//! Pod Security's `restricted` and `baseline` levels refuse hostPath
//! volumes in a pod and admit any claim, so a training pod of a tenant
//! namespace mounts the claim `ferry-NAME` and never names a node path.
//! The volume is a `local` volume of the data's directory on the nodes
//! (`ROOT/NAMESPACE/NAME`, or its `current` link for a versioned pull)
//! with the mount option `ro`, so no pod that mounts it, whatever it asks,
//! can change a byte the workers staged (files another DataStage shares
//! through hard links among them); it is pre-bound to its claim, so no
//! other claim, in any namespace, can bind it.
//!
//! A local volume's node affinity cannot change once it exists, and the
//! nodes that hold a copy do (nodes join, copies are evicted). So it
//! requires a node label instead ([`node_label`]), which the operator sets
//! on the nodes that hold a copy and removes from those that no longer do:
//! the scheduler then places a pod that mounts the claim only where the
//! data is, with or without the webhook's gate.
//!
//! Decided against a CSI driver of Ferry's own (docs/design/tenancy.md): a
//! node plugin on every node and a gRPC server for what the kubelet's
//! local volume plugin already does, with placement still to be solved.

use std::collections::{BTreeMap, BTreeSet};

use ferry_crds::plan::{Direction, Plan};
use ferry_crds::{DataStage, DataStageStatus, names};
use k8s_openapi::api::core::v1::{
    LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource as _, ResourceExt as _};

use crate::home::{DataStageKey, bounded_name};
use crate::jobs::DataLayout;

/// The size a Ferry volume and its claim declare. A local volume has no
/// size of its own (it is a directory); `status.totals` says how much the
/// data takes.
pub const NOMINAL_SIZE: &str = "1Mi";

/// The access mode of a pull's volume: many pods, read only.
pub const READ_ONLY_MANY: &str = "ReadOnlyMany";

/// The name of the claim through which pods read `datastage`'s data, in
/// its namespace.
pub fn claim_name(datastage: &str) -> String {
    format!("ferry-{datastage}")
}

/// The name of `key`'s PersistentVolume (cluster-scoped, so the namespace
/// and a part of the uid are in it).
pub fn volume_name(key: &DataStageKey) -> String {
    let uid: String = key.uid.chars().filter(char::is_ascii_alphanumeric).take(8).collect();
    bounded_name(&format!("ferry-{}-{}", key.namespace, key.name), &format!("-{uid}"))
}

/// The node label that says a node holds `key`'s copy: its key
/// (`data.ferry.dev/NAMESPACE.NAME`, shortened with a hash when long) and
/// its value, the DataStage's uid (so a DataStage created again under the
/// name is never taken to be on its predecessor's nodes).
pub fn node_label(key: &DataStageKey) -> (String, String) {
    let name = bounded_name(&format!("{}.{}", key.namespace, key.name), "");
    (format!("{}{name}", names::NODE_DATA_PREFIX), key.uid.clone())
}

/// Whether pods read `plan`'s data through a Ferry volume: a pull onto a
/// node-local volume.
pub fn reads_through_volume(plan: &Plan<'_>) -> bool {
    plan.direction == Direction::Pull && plan.per_node()
}

/// The PersistentVolume of `ds`'s data, laid out as `layout`: `None` when
/// pods do not read it through one ([`reads_through_volume`]).
pub fn persistent_volume(ds: &DataStage, plan: &Plan<'_>, layout: &DataLayout) -> Option<PersistentVolume> {
    if !reads_through_volume(plan) {
        return None;
    }
    let key = DataStageKey::of(ds);
    let dir = layout.node_data.as_deref()?.trim_end_matches('/');
    // A versioned pull's pods read the link to the current version, which
    // the kubelet resolves as it mounts the volume for a new pod.
    let path = match ds.spec.versioned() {
        true => format!("{dir}/{}", ferry_contract::layout::CURRENT_LINK),
        false => dir.to_owned(),
    };
    let (label, uid) = node_label(&key);
    Some(PersistentVolume {
        metadata: ObjectMeta { name: Some(volume_name(&key)), labels: Some(labels(&key)), ..ObjectMeta::default() },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity(NOMINAL_SIZE.into()))])),
            access_modes: Some(vec![READ_ONLY_MANY.into()]),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            storage_class_name: Some(String::new()),
            volume_mode: Some("Filesystem".into()),
            mount_options: Some(vec!["ro".into()]),
            local: Some(LocalVolumeSource { path, fs_type: None }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: label,
                            operator: "In".into(),
                            values: Some(vec![uid]),
                        }]),
                        match_fields: None,
                    }],
                }),
            }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(key.namespace.clone()),
                name: Some(claim_name(&key.name)),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

/// The claim, in `ds`'s namespace, bound to its volume, owned by the
/// DataStage so that it goes with it.
pub fn claim(ds: &DataStage) -> PersistentVolumeClaim {
    let key = DataStageKey::of(ds);
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim_name(&key.name)),
            namespace: Some(key.namespace.clone()),
            labels: Some(labels(&key)),
            owner_references: ds.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec![READ_ONLY_MANY.into()]),
            storage_class_name: Some(String::new()),
            volume_name: Some(volume_name(&key)),
            volume_mode: Some("Filesystem".into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), Quantity(NOMINAL_SIZE.into()))])),
                limits: None,
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

fn labels(key: &DataStageKey) -> BTreeMap<String, String> {
    BTreeMap::from([
        (names::DATASTAGE.to_owned(), key.name.clone()),
        (names::DATASTAGE_NAMESPACE.to_owned(), key.namespace.clone()),
        (names::DATASTAGE_UID.to_owned(), key.uid.clone()),
        (names::MANAGED_BY.0.to_owned(), names::MANAGED_BY.1.to_owned()),
    ])
}

/// The nodes that hold a copy of `ds`'s data a pod can read now, by its
/// status: a worker there finished a run with a snapshot (an earlier one
/// while a re-sync runs: the files stay in place), was not evicted, and,
/// for a versioned pull, switched the node to a version.
pub fn holders(ds: &DataStage, status: &DataStageStatus) -> BTreeSet<String> {
    let versioned = ds.spec.versioned();
    status
        .workers
        .iter()
        .filter(|w| w.snapshot.is_some() && w.evicted.is_none())
        .filter(|w| !versioned || w.current_version.is_some())
        .filter_map(|w| w.node.clone())
        .collect()
}

/// The node label changes that make exactly `holders` carry `key`'s label,
/// given each node's labels: `(node, Some(value))` to set it, `(node,
/// None)` to remove it.
pub fn label_changes<'a>(
    key: &DataStageKey,
    holders: &BTreeSet<String>,
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a BTreeMap<String, String>>)>,
) -> Vec<(String, Option<String>)> {
    let (label, uid) = node_label(key);
    nodes
        .into_iter()
        .filter_map(|(node, labels)| {
            let has = labels.and_then(|l| l.get(&label));
            let wanted = holders.contains(node);
            match (wanted, has) {
                (true, Some(value)) if *value == uid => None,
                (true, _) => Some((node.to_owned(), Some(uid.clone()))),
                // Another uid's label (a predecessor's) goes too.
                (false, Some(_)) => Some((node.to_owned(), None)),
                (false, None) => None,
            }
        })
        .collect()
}

/// Whether a Ferry volume `found` must be applied again: missing, or its
/// claim was deleted and created again (the volume still names the old
/// claim's uid, and would stay Released).
pub fn needs_rebinding(found: Option<&PersistentVolume>) -> bool {
    found.is_none_or(|pv| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
            && pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|c| c.uid.is_some())
    })
}

/// The name of the volume a claim of Ferry's is bound to, to tell the
/// claim is ours: labelled with `ds`'s uid.
pub fn claim_is_ours(ds: &DataStage, found: &PersistentVolumeClaim) -> bool {
    found.labels().get(names::DATASTAGE_UID) == ds.uid().as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{WorkerDefaults, data_layout};
    use serde_json::json;

    fn datastage(spec: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "imagenet", "namespace": "team-a", "uid": "0a1b2c3d-4e5f-6789-abcd-ef0123456789"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn cache_defaults() -> WorkerDefaults {
        WorkerDefaults {
            node_cache: Some(ferry_crds::NodeCacheSpec { root: "/var/lib/ferry".into(), ..Default::default() }),
            ..WorkerDefaults::image("stager:1")
        }
    }

    #[test]
    fn a_node_cache_pull_is_read_through_a_read_only_local_volume_on_the_nodes_that_hold_it() {
        let ds = datastage(json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        let plan = ds.spec.plan().unwrap();
        let layout = data_layout(&ds, &plan, &cache_defaults());
        let pv = persistent_volume(&ds, &plan, &layout).unwrap();
        let spec = pv.spec.clone().unwrap();
        assert_eq!(spec.local.unwrap().path, "/var/lib/ferry/team-a/imagenet");
        assert_eq!(spec.mount_options.unwrap(), ["ro"], "no pod can write what was staged");
        assert_eq!(spec.access_modes.unwrap(), [READ_ONLY_MANY]);
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"), "deleting it deletes no data");
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(
            (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()),
            (Some("team-a"), Some("ferry-imagenet"))
        );
        let term = &spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0];
        let requirement = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!(requirement.key, "data.ferry.dev/team-a.imagenet");
        assert_eq!(requirement.values.as_deref(), Some(&["0a1b2c3d-4e5f-6789-abcd-ef0123456789".to_owned()][..]));
        assert_eq!(pv.metadata.name.as_deref(), Some("ferry-team-a-imagenet-0a1b2c3d"));

        let claim = claim(&ds);
        let claim_spec = claim.spec.clone().unwrap();
        assert_eq!(claim_spec.volume_name.as_deref(), pv.metadata.name.as_deref());
        assert_eq!(claim_spec.storage_class_name.as_deref(), Some(""), "no default StorageClass takes it");
        assert_eq!(claim.metadata.owner_references.as_ref().unwrap()[0].kind, "DataStage");
        assert!(claim_is_ours(&ds, &claim));

        let versioned = datastage(json!({"source": {"uri": "s3://b/p"},
            "destination": {"volume": {"nodeCache": "nvme"}}, "updateStrategy": "Versioned"}));
        let plan = versioned.spec.plan().unwrap();
        let layout = data_layout(&versioned, &plan, &cache_defaults());
        let path = persistent_volume(&versioned, &plan, &layout).unwrap().spec.unwrap().local.unwrap().path;
        assert_eq!(path, "/var/lib/ferry/team-a/imagenet/current");

        for other in [
            json!({"source": {"volume": {"nodeCache": "nvme"}}, "destination": {"uri": "s3://b/p"}}),
            json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"persistentVolumeClaim": {"claimName": "c"}}}}),
        ] {
            let ds = datastage(other);
            let plan = ds.spec.plan().unwrap();
            assert!(persistent_volume(&ds, &plan, &data_layout(&ds, &plan, &cache_defaults())).is_none());
        }
    }

    #[test]
    fn the_label_follows_the_copies_and_an_old_uid_is_removed() {
        let ds = datastage(json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        let status: DataStageStatus = serde_json::from_value(json!({"workers": [
            {"name": "a", "node": "a", "snapshot": "s"},
            {"name": "b", "node": "b", "snapshot": "s", "evicted": {"time": "2026-01-01T00:00:00Z", "message": "m"}},
            {"name": "c", "node": "c"},
        ]}))
        .unwrap();
        let holders = holders(&ds, &status);
        assert_eq!(holders, BTreeSet::from(["a".to_owned()]));
        let key = DataStageKey::of(&ds);
        let (label, uid) = node_label(&key);
        let with = |value: &str| BTreeMap::from([(label.clone(), value.to_owned())]);
        let (a, b, c, d) = (with("other-uid"), with(&uid), BTreeMap::new(), with(&uid));
        let changes =
            label_changes(&key, &holders, [("a", Some(&a)), ("b", Some(&b)), ("c", Some(&c)), ("d", Some(&d))]);
        assert_eq!(changes, [("a".into(), Some(uid.clone())), ("b".into(), None), ("d".into(), None)]);
        let long = DataStageKey { namespace: "n".repeat(63), name: "d".repeat(63), uid: "u".into() };
        let (label, _) = node_label(&long);
        assert!(label.len() - names::NODE_DATA_PREFIX.len() <= 63, "{label}");
    }
}
