//! The operator end to end on the real control plane: a DataStage applied
//! with the API is carried out by stager Jobs on every matching node, its
//! status says so, and problems a user can fix show up as conditions that
//! recover once fixed.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_crds::{DataStage, Phase};
use ferry_e2e::{Cluster, create_namespace, object_store, start_operator, wait_for};
use ferry_testkit::{S3Server, pattern, read_tree};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt as _};
use serde_json::json;

struct Setup {
    cluster: Cluster,
    s3: S3Server,
    files: BTreeMap<String, Vec<u8>>,
    datastages: Api<DataStage>,
    secrets: Api<Secret>,
    _logs: tempfile::TempDir,
    operator: ferry_e2e::process::ManagedProcess,
}

async fn setup(namespace: &str) -> Setup {
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    let mut files = BTreeMap::new();
    for i in 0..30u64 {
        files.insert(format!("train/{i:03}.bin"), pattern(i, 50_000 + i as usize * 100));
    }
    files.insert("weights.bin".into(), pattern(7, 12 << 20));
    for (key, data) in &files {
        s3.put("datasets", &format!("demo/{key}"), data.clone()).await;
    }
    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch("datastages.ferry.dev", &PatchParams::apply("ferry.dev/e2e-tests"), &Patch::Apply(DataStage::crd()))
        .await
        .unwrap();
    wait_for(&cluster, "the CRD", Duration::from_secs(30), || {
        let crds = crds.clone();
        async move {
            let crd = crds.get("datastages.ferry.dev").await.ok()?;
            crd.status?.conditions?.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await;
    create_namespace(&cluster, namespace, &[]).await;
    let logs = tempfile::tempdir().unwrap();
    let (operator, _) = start_operator(&cluster, logs.path());
    Setup {
        datastages: Api::namespaced(client.clone(), namespace),
        secrets: Api::namespaced(client, namespace),
        cluster,
        s3,
        files,
        _logs: logs,
        operator,
    }
}

impl Setup {
    async fn create_secret(&self) {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": self.s3.access_key, "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}});
        self.secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    }

    async fn apply(&self, name: &str, host_path: &str) {
        let ds: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name},
            "spec": {
                "source": {"uri": "s3://datasets/demo", "endpoint": self.s3.endpoint, "credentials": {"name": "s3"}},
                "destination": {"volume": {"hostPath": host_path}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            },
        }))
        .unwrap();
        self.datastages.create(&PostParams::default(), &ds).await.unwrap();
    }

    /// Waits until `check` holds for the DataStage's status; on timeout the
    /// failure shows the status and the operator's log.
    async fn wait_status(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&ferry_crds::DataStageStatus) -> bool,
    ) -> ferry_crds::DataStageStatus {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let status = self.datastages.get(name).await.ok().and_then(|d| d.status);
            if let Some(status) = status.as_ref().filter(|s| check(s)) {
                return status.clone();
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "timed out waiting for {name} to be {what}\nstatus: {}\n--- operator ---\n{}\n{}",
                    serde_json::to_string_pretty(&status).unwrap(),
                    self.operator.log_tail(40),
                    self.cluster.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn condition<'a>(
    status: &'a ferry_crds::DataStageStatus,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == kind)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_stages_the_dataset_onto_every_node_and_reports_ready() {
    let setup = setup("pull").await;
    setup.create_secret().await;
    setup.apply("demo", "/mnt/ferry/demo").await;
    let status = setup.wait_status("demo", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;

    let ready = condition(&status, "Ready").expect("a Ready condition");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", "Staged"));
    assert_eq!(status.nodes.as_deref(), Some("2/2"));
    assert_eq!(status.progress.as_deref(), Some("100%"));
    let totals = status.totals.clone().unwrap();
    let bytes: usize = setup.files.values().map(Vec::len).sum();
    assert_eq!(totals.bytes_done as usize, 2 * bytes, "each node holds the whole dataset");
    assert_eq!(totals.objects_done as usize, 2 * setup.files.len());
    assert_eq!(status.workers.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(), ["node-a", "node-b"]);
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/demo")), setup.files, "node-a's copy is byte-identical");
        assert_eq!(read_tree(&b.join("mnt/ferry/demo")), setup.files, "node-b's copy is byte-identical");
    }
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_secret_is_a_condition_that_recovers_once_the_secret_exists() {
    let setup = setup("secret").await;
    setup.apply("waiting", "/mnt/ferry/waiting").await;
    let status = setup
        .wait_status("waiting", "waiting for its Secret", |s| {
            condition(s, "Progressing").is_some_and(|c| c.reason == "SecretNotFound")
        })
        .await;
    assert_eq!(status.phase, Some(Phase::Pending));
    assert!(condition(&status, "Progressing").unwrap().message.contains("Secret 's3'"));

    setup.create_secret().await;
    setup.wait_status("waiting", "Succeeded after the Secret appeared", |s| s.phase == Some(Phase::Succeeded)).await;
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_path_outside_the_allow_list_is_refused_with_a_condition() {
    let setup = setup("refused").await;
    setup.create_secret().await;
    setup.apply("elsewhere", "/etc/ferry").await;
    let status = setup.wait_status("elsewhere", "Failed", |s| s.phase == Some(Phase::Failed)).await;
    let failed = condition(&status, "Failed").unwrap();
    assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", "HostPathNotAllowed"));
    assert!(failed.message.contains("/mnt/ferry"), "{}", failed.message);
    setup.cluster.stop().await;
}
