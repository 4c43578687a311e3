//! The `StagingQuota` API (namespaced): how many bytes the DataStages of
//! one namespace may hold on node disks, per node and in all. A cluster
//! admin creates it in a tenant's namespace (RBAC keeps tenants from
//! editing it, as with a ResourceQuota); the operator checks every pull
//! against it before its workers start, and its workers refuse a dataset
//! that turns out larger than the room left.

use ferry_contract::ByteSize;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A limit on the bytes a namespace's DataStages hold.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "StagingQuota",
    plural = "stagingquotas",
    shortname = "squota",
    category = "ferry",
    namespaced,
    status = "StagingQuotaStatus",
    derive = "PartialEq",
    doc = "A StagingQuota limits the bytes the DataStages of its namespace may hold on node disks and claims, per node and in all. A pull that would go over it waits, with a condition naming the quota, until there is room.",
    printcolumn = r#"{"name":"Per node","type":"string","jsonPath":".spec.bytesPerNode"}"#,
    printcolumn = r#"{"name":"In all","type":"string","jsonPath":".spec.bytes"}"#,
    printcolumn = r#"{"name":"Used","type":"string","jsonPath":".status.used"}"#,
    printcolumn = r#"{"name":"Waiting","type":"integer","jsonPath":".status.waitingDataStages"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.bytesPerNode) || has(self.bytes)").message("a StagingQuota limits bytesPerNode, bytes or both: set at least one"))]
pub struct StagingQuotaSpec {
    /// The most bytes the namespace's pulls onto a hostPath may hold
    /// together on any one node, e.g. `500Gi`: every DataStage's copy on
    /// that node counts, whatever its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_node: Option<ByteSize>,

    /// The most bytes the namespace's pulls may hold in all, e.g. `2Ti`: a
    /// pull onto a hostPath counts once per node it holds a copy on, a pull
    /// onto a persistentVolumeClaim once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<ByteSize>,
}

/// What the namespace's pulls hold now, as the operator last counted it
/// (every few seconds) from what their workers reported.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StagingQuotaStatus {
    /// Bytes held in all.
    #[serde(default)]
    pub used_bytes: i64,
    /// Bytes held on the node that holds most.
    #[serde(default)]
    pub used_bytes_on_fullest_node: i64,
    /// That node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fullest_node: Option<String>,
    /// The same for people, e.g. `26.9 MiB in all, 13.5 MiB on node-a`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used: Option<String>,
    /// DataStages of the namespace waiting for room (reason `QuotaExceeded`).
    #[serde(default)]
    pub waiting_data_stages: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quota_round_trips_in_camel_case() {
        let spec: StagingQuotaSpec =
            serde_json::from_value(serde_json::json!({"bytesPerNode": "500Gi", "bytes": "2Ti"})).unwrap();
        assert_eq!(spec.bytes_per_node.as_ref().map(ByteSize::bytes), Some(500 << 30));
        assert_eq!(spec.bytes.as_ref().map(ByteSize::bytes), Some(2 << 40));
        let json = serde_json::to_value(StagingQuotaSpec { bytes: None, ..spec }).unwrap();
        assert_eq!(json, serde_json::json!({"bytesPerNode": "500Gi"}));
    }
}
