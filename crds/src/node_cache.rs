//! The `NodeCache` API (cluster-scoped): where on the nodes Ferry may keep
//! node-local data, declared by the cluster admin in the way a
//! StorageClass names where volumes come from. A DataStage names a cache
//! (`volume.nodeCache`), never a node path: Ferry lays each DataStage out
//! below the cache's root as `ROOT/NAMESPACE/NAME`, so no two namespaces
//! can name each other's directories, and pods read the data through a
//! PersistentVolumeClaim Ferry binds for them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::EvictionPolicy;

/// A directory on the nodes that Ferry owns, and who may stage into it.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "NodeCache",
    plural = "nodecaches",
    shortname = "ncache",
    category = "ferry",
    derive = "PartialEq",
    doc = "A NodeCache is a directory on the nodes that Ferry owns: DataStages that name it stage into ROOT/NAMESPACE/NAME there, and pods read their data through a claim Ferry binds.",
    printcolumn = r#"{"name":"Root","type":"string","jsonPath":".spec.root"}"#,
    printcolumn = r#"{"name":"Sharing","type":"string","jsonPath":".spec.sharing"}"#,
    printcolumn = r#"{"name":"Eviction","type":"string","jsonPath":".spec.eviction"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeCacheSpec {
    /// The directory on every node, e.g. `/var/lib/ferry/nvme`: one
    /// filesystem per node, and only Ferry's (its workers create, link and
    /// remove files anywhere below it). Immutable: data staged below the
    /// old root would be left behind.
    #[schemars(length(min = 2, max = 1024))]
    #[x_kube(validation = Rule::new(r"self.startsWith('/') && !self.matches('(^|/)[.][.]?(/|$)') && !self.contains('//')").message("root must be an absolute directory other than '/', without '.', '..' or '//'"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("root is immutable: what is staged below it would be left behind; create another NodeCache"))]
    pub root: String,

    /// Which namespaces may stage here, by their labels. Unset: every
    /// namespace. A DataStage in another namespace is refused at
    /// admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Which DataStages on a node share their files when they stage the
    /// same objects: `Namespace` (default), `Cluster` or `None`. The schema
    /// shows [`Sharing`]'s description here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,

    /// The eviction policy of the DataStages here that set no
    /// `spec.capacity.eviction` of their own: `Never` (default) or
    /// `WhenSpaceIsNeeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionPolicy>,
}

/// Which DataStages share one file per object on a node. Sharing links
/// each staged file into a store of object files below the root, named by
/// what identifies the object in its store (the store as the workers reach
/// it, the key, its version and size), and links files found there instead
/// of fetching them. `Namespace` (default): only DataStages of one
/// namespace share (`ROOT/NAMESPACE/.ferry-shared`), so no tenant can
/// place a file another tenant's pull links. `Cluster`: every DataStage on
/// the node shares (`ROOT/.ferry-shared`); choose it where every namespace
/// trusts every other not to serve a store of the same name. `None`:
/// every DataStage takes its own room.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Sharing {
    /// Within a namespace.
    #[default]
    Namespace,
    /// Across namespaces.
    Cluster,
    /// Not at all.
    None,
}

impl NodeCacheSpec {
    /// The sharing in effect.
    pub fn sharing(&self) -> Sharing {
        self.sharing.unwrap_or_default()
    }

    /// The root without a trailing slash.
    pub fn root(&self) -> &str {
        let trimmed = self.root.trim_end_matches('/');
        if trimmed.is_empty() { "/" } else { trimmed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_cache_round_trips_in_camel_case_and_defaults_to_sharing_within_a_namespace() {
        let spec: NodeCacheSpec = serde_json::from_value(serde_json::json!({
            "root": "/var/lib/ferry/nvme/",
            "namespaceSelector": {"matchLabels": {"team": "ml"}},
            "eviction": "WhenSpaceIsNeeded",
        }))
        .unwrap();
        assert_eq!((spec.root(), spec.sharing()), ("/var/lib/ferry/nvme", Sharing::Namespace));
        assert_eq!(spec.eviction, Some(EvictionPolicy::WhenSpaceIsNeeded));
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["namespaceSelector"]["matchLabels"]["team"], "ml");
        assert!(json.get("sharing").is_none());
    }
}
