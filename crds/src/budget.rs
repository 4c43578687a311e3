//! The `StoreBudget` API (cluster-scoped): how many requests and bytes per
//! second all of Ferry's workers together may send to one bucket. The
//! operator splits it equally among the workers running against that
//! bucket, re-splits as they start and finish, and shows the split here
//! and in each DataStage's `status.storeBudget`.

use ferry_contract::{ByteSize, StoreShare};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A cap on what Ferry's workers together send to one bucket.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "StoreBudget",
    plural = "storebudgets",
    shortname = "sbudget",
    category = "ferry",
    status = "StoreBudgetStatus",
    derive = "PartialEq",
    doc = "A StoreBudget caps the requests and bytes per second all of Ferry's workers together send to one bucket; the operator splits it among the workers running against it.",
    printcolumn = r#"{"name":"Store","type":"string","jsonPath":".spec.uri"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Requests/s","type":"integer","jsonPath":".spec.requestsPerSecond"}"#,
    printcolumn = r#"{"name":"Bandwidth","type":"string","jsonPath":".spec.bandwidth"}"#,
    printcolumn = r#"{"name":"Workers","type":"integer","jsonPath":".status.workers"}"#,
    printcolumn = r#"{"name":"Share","type":"string","jsonPath":".status.share"}"#,
    printcolumn = r#"{"name":"Throttled","type":"integer","jsonPath":".status.throttledRequests"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.requestsPerSecond) || has(self.bandwidth)").message("a StoreBudget caps requestsPerSecond, bandwidth or both: set at least one"))]
pub struct StoreBudgetSpec {
    /// The bucket, written as DataStages write their `uri` but without a
    /// prefix: `s3://BUCKET` or `gs://BUCKET`. Every DataStage whose store
    /// is this bucket at this endpoint shares the budget, whatever its prefix.
    #[x_kube(validation = Rule::new("self.matches('^(s3|gs|az)://[^/]+/?$')").message("uri is a bucket: s3://BUCKET, gs://BUCKET or az://CONTAINER, with no prefix"))]
    pub uri: String,

    /// The store's endpoint, spelled as the DataStages spell their
    /// `endpoint` (e.g. `http://minio.storage:9000`); leave it out for AWS
    /// S3 and GCS themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Requests per second (listing, reads, uploads and retries) all
    /// workers together may send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub requests_per_second: Option<i32>,

    /// Bytes per second all workers together may move, e.g. `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<ByteSize>,
}

impl StoreBudgetSpec {
    /// What each of `workers` may use.
    pub fn share(&self, workers: u32) -> StoreShare {
        StoreShare::split(
            self.requests_per_second.and_then(|rate| u32::try_from(rate).ok()),
            self.bandwidth.as_ref().map(ByteSize::bytes),
            workers,
        )
    }

    /// Whether a DataStage's store, bucket `bucket` of scheme `scheme` at
    /// `endpoint`, falls under this budget. Endpoints compare without a
    /// trailing slash and without case.
    pub fn covers(&self, scheme: ferry_contract::Scheme, bucket: &str, endpoint: Option<&str>) -> bool {
        let normal = |endpoint: Option<&str>| endpoint.map(|e| e.trim_end_matches('/').to_ascii_lowercase());
        let own: Option<ferry_contract::ObjectLocation> = self.uri.parse().ok();
        own.is_some_and(|own| own.scheme == scheme && own.bucket == bucket)
            && normal(self.endpoint.as_deref()) == normal(endpoint)
    }
}

/// How the budget is split now.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoreBudgetStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// DataStages with workers running against the bucket now.
    #[serde(default)]
    pub data_stages: i64,

    /// Workers (pods) running against the bucket now: the budget is split
    /// among them.
    #[serde(default)]
    pub workers: i64,

    /// Each worker's share, e.g. `requests=25,bytes=1048576` per second
    /// (`unlimited` when the budget caps nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<String>,

    /// Requests the store throttled (SlowDown, 429, 503) in the current
    /// runs of those DataStages, as their workers reported them.
    #[serde(default)]
    pub throttled_requests: i64,

    /// `Ready`: the budget is being applied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A DataStage's part of a StoreBudget (`status.storeBudget`), written by
/// the operator and read back by its workers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DataStageBudget {
    /// The StoreBudget; absent once none applies any more (deleted, or its
    /// bucket or endpoint changed), and then workers drop their share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,

    /// Workers the budget is split among now, over every DataStage
    /// against the bucket.
    #[serde(default)]
    pub workers: i64,

    /// What each of this DataStage's workers may use.
    #[serde(default)]
    pub share: StoreShare,
}

#[cfg(test)]
mod tests {
    use ferry_contract::Scheme;

    use super::*;

    fn spec(uri: &str, endpoint: Option<&str>) -> StoreBudgetSpec {
        StoreBudgetSpec {
            uri: uri.into(),
            endpoint: endpoint.map(Into::into),
            requests_per_second: Some(100),
            bandwidth: Some("1Mi".parse().unwrap()),
        }
    }

    #[test]
    fn a_budget_covers_its_bucket_at_its_endpoint_whatever_the_spelling_of_either() {
        let budget = spec("s3://data/", Some("http://MinIO:9000/"));
        assert!(budget.covers(Scheme::S3, "data", Some("http://minio:9000")));
        assert!(!budget.covers(Scheme::S3, "data", None), "another endpoint, another store");
        assert!(!budget.covers(Scheme::Gcs, "data", Some("http://minio:9000")));
        assert!(!budget.covers(Scheme::S3, "data2", Some("http://minio:9000")));
        assert!(spec("gs://data", None).covers(Scheme::Gcs, "data", None));
    }

    #[test]
    fn a_budget_splits_requests_and_bytes_among_its_workers() {
        let share = spec("s3://d", None).share(4);
        assert_eq!(share, StoreShare { requests_per_second: Some(25), bytes_per_second: Some(262_144) });
    }
}
