//! The operator end to end on the real control plane: a DataStage applied
//! with the API is carried out by stager Jobs on every matching node, its
//! status says so, and problems a user can fix show up as conditions that
//! recover once fixed.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use ferry_crds::conditions::reasons;
use ferry_crds::names;
use ferry_crds::{DataStage, Phase};
use ferry_e2e::{
    Cluster, create_namespace, datastage_jobs, datastage_pods, install_crd, let_workers_report, object_store,
    start_operator, wait_for, worker_job,
};
use ferry_testkit::{S3Server, pattern, read_tree};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

struct Setup {
    cluster: Cluster,
    s3: S3Server,
    files: BTreeMap<String, Vec<u8>>,
    datastages: Api<DataStage>,
    secrets: Api<Secret>,
    _logs: tempfile::TempDir,
    operator: ferry_e2e::process::ManagedProcess,
    /// Port of the operator's `/metrics`.
    operator_port: u16,
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
    install_crd(&cluster).await;
    create_namespace(&cluster, namespace, &[]).await;
    let logs = tempfile::tempdir().unwrap();
    let (operator, url) = start_operator(&cluster, logs.path(), "operator-1");
    let operator_port = url.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the operator's port");
    Setup {
        datastages: Api::namespaced(client.clone(), namespace),
        secrets: Api::namespaced(client, namespace),
        cluster,
        s3,
        files,
        _logs: logs,
        operator,
        operator_port,
    }
}

impl Setup {
    async fn create_secret(&self) {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": self.s3.access_key, "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}});
        self.secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    }

    /// The dataset again under `s3://datasets/<prefix>`: the same bytes
    /// as other objects (other keys), which nothing on a node shares with
    /// the `demo` copies, so that each DataStage takes room of its own.
    async fn upload_as(&self, prefix: &str) {
        for (key, data) in &self.files {
            self.s3.put("datasets", &format!("{prefix}/{key}"), data.clone()).await;
        }
    }

    fn store(&self, uri: &str) -> serde_json::Value {
        json!({"uri": uri, "endpoint": self.s3.endpoint, "credentials": {"name": "s3"}})
    }

    async fn apply(&self, name: &str, host_path: &str) {
        self.apply_spec(
            name,
            json!({
                "source": self.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": host_path}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            }),
        )
        .await;
    }

    async fn apply_spec(&self, name: &str, spec: serde_json::Value) {
        let ds: DataStage = serde_json::from_value(
            json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": name}, "spec": spec}),
        )
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

/// Type and reason of each occurrence of an Event about DataStage `name`,
/// oldest first (the operator folds repeats into one Event with a series).
async fn event_reasons(client: &kube::Client, namespace: &str, name: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let mut events: Vec<Event> = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    events
        .into_iter()
        .flat_map(|e| {
            let count = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
            std::iter::repeat_n((e.type_.unwrap_or_default(), e.reason.unwrap_or_default()), count)
        })
        .collect()
}

/// The value of the first sample of `series` (name and labels, as exposed).
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Creates a ServiceAccount, Role or RoleBinding given as JSON in `namespace`.
async fn create_object(client: &kube::Client, namespace: &str, manifest: serde_json::Value) {
    use k8s_openapi::api::{core::v1::ServiceAccount, rbac::v1::Role, rbac::v1::RoleBinding};
    use kube::api::{ApiResource, DynamicObject};
    let resource = match manifest["kind"].as_str() {
        Some("ServiceAccount") => ApiResource::erase::<ServiceAccount>(&()),
        Some("Role") => ApiResource::erase::<Role>(&()),
        Some("RoleBinding") => ApiResource::erase::<RoleBinding>(&()),
        other => panic!("create_object does not know kind {other:?}"),
    };
    let object: DynamicObject = serde_json::from_value(manifest).unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
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

    // Every transition left an Event.
    let client = setup.cluster.client().await.unwrap();
    let seen: Vec<String> = event_reasons(&client, "pull", "demo").await.into_iter().map(|(_, r)| r).collect();
    for expected in [reasons::WORKER_CREATED, reasons::STAGED] {
        assert!(seen.iter().any(|r| r == expected), "no {expected} event in {seen:?}");
    }
    assert_eq!(seen.iter().filter(|r| *r == reasons::WORKER_CREATED).count(), 2, "one per node: {seen:?}");

    // The operator's own metrics tell the same story.
    let (code, metrics) = ferry_testkit::http_get(setup.operator_port, "/metrics").expect("the operator answers");
    assert_eq!(code, 200);
    assert!(sample(&metrics, "ferry_operator_reconciles_total{result=\"ok\"}").unwrap_or(0.0) >= 2.0, "{metrics}");
    assert_eq!(sample(&metrics, "ferry_operator_datastages{phase=\"Succeeded\"}"), Some(1.0), "{metrics}");
    assert_eq!(sample(&metrics, "ferry_operator_staged_bytes"), Some((2 * bytes) as f64), "{metrics}");
    assert!(sample(&metrics, "ferry_operator_reconcile_duration_seconds_count").unwrap_or(0.0) >= 2.0, "{metrics}");
    // The new DataStage waited for its first reconciliation, and was timed.
    assert!(sample(&metrics, "ferry_operator_queue_wait_seconds_count").unwrap_or(0.0) >= 1.0, "{metrics}");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn store_problems_fail_with_a_specific_reason_an_event_and_no_retries() {
    let setup = setup("problems").await;
    setup.create_secret().await;
    let wrong = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "wrong"},
        "stringData": {"AWS_ACCESS_KEY_ID": setup.s3.access_key, "AWS_SECRET_ACCESS_KEY": "not-the-secret"}});
    setup.secrets.create(&PostParams::default(), &serde_json::from_value(wrong).unwrap()).await.unwrap();
    let dead_endpoint = format!("http://127.0.0.1:{}", ferry_testkit::free_port());
    let on_node_a = json!({"nodeSelector": {"ferry.dev/e2e-node": "node-a"}});
    let cases = [
        (
            "badcreds",
            json!({"uri": "s3://datasets/demo", "endpoint": setup.s3.endpoint, "credentials": {"name": "wrong"}}),
            "AccessDenied",
            "check the credentials",
        ),
        (
            "nobucket",
            setup.store("s3://no-such-bucket/demo"),
            "BucketNotFound",
            "bucket 'no-such-bucket' does not exist",
        ),
        (
            "unreachable",
            json!({"uri": "s3://datasets/demo", "endpoint": dead_endpoint, "credentials": {"name": "s3"}}),
            "EndpointUnreachable",
            "connection",
        ),
    ];
    for (name, source, _, _) in &cases {
        let mut spec = json!({"source": source, "destination": {"volume": {"hostPath": format!("/mnt/ferry/{name}")}},
                              "placement": on_node_a});
        if *name == "unreachable" {
            // An unreachable endpoint may come back, so it is retried; once is enough here.
            spec["backoffLimit"] = json!(0);
        }
        setup.apply_spec(name, spec).await;
    }
    let client = setup.cluster.client().await.unwrap();
    for (name, _, reason, words) in cases {
        let status = setup.wait_status(name, "Failed", |s| s.phase == Some(Phase::Failed)).await;
        let failed = condition(&status, "Failed").unwrap();
        assert_eq!((failed.status.as_str(), failed.reason.as_str()), ("True", reason), "{name}: {failed:?}");
        assert!(failed.message.contains(words), "{name}: {}", failed.message);
        let events = event_reasons(&client, "problems", name).await;
        assert!(events.contains(&("Warning".to_owned(), reason.to_owned())), "{name}: {events:?}");
        // Retrying cannot fix credentials or a bucket: one pod, not backoffLimit + 1.
        let job = worker_job(&client, "problems", name, "node-a", 1).await.unwrap();
        assert_eq!(
            job.metadata.namespace.as_deref(),
            Some(ferry_e2e::WORKERS_NS),
            "node-local workers run in Ferry's namespace"
        );
        assert_eq!(job.status.and_then(|s| s.failed), Some(1), "{name}: the Job failed after one pod");
    }
    setup.cluster.stop().await;
}

/// What `du -sk` counts below `dir`, in bytes: blocks in use, each file
/// linked from several directories once.
fn disk_usage(dir: &Path) -> u64 {
    let out = std::process::Command::new("du").arg("-sk").arg(dir).output().expect("run du");
    assert!(out.status.success(), "du: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().next().and_then(|kib| kib.parse::<u64>().ok()).expect("du prints KiB first") * 1024
}

/// Two DataStages of one dataset on a node share one copy (their pulls
/// link the same files under the shared host path); deleting one with
/// `reclaimPolicy: Delete` removes its directory only, and the other stays
/// byte-identical, still holding the shared objects.
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_datastage_collects_its_jobs_and_reclaim_delete_removes_the_staged_data() {
    use k8s_openapi::api::batch::v1::Job;
    let setup = setup("reclaim").await;
    setup.create_secret().await;
    setup.apply("kept", "/mnt/ferry/kept").await;
    let mut wiped = json!({
        "source": setup.store("s3://datasets/demo"),
        "destination": {"volume": {"hostPath": "/mnt/ferry/wiped"}},
        "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
    });
    wiped["reclaimPolicy"] = json!("Delete");
    setup.apply_spec("wiped", wiped).await;
    for name in ["kept", "wiped"] {
        setup.wait_status(name, "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    }
    let finalizers = |name: &'static str| {
        let datastages = setup.datastages.clone();
        async move { datastages.get(name).await.unwrap().metadata.finalizers.unwrap_or_default() }
    };
    assert_eq!(finalizers("wiped").await, ["ferry.dev/cleanup"]);
    assert!(finalizers("kept").await.is_empty(), "Retain needs no finalizer");
    // A file of the user's own beside the staged data must survive the clean-up.
    let node_a = setup.cluster.node_dir("node-a");
    let one_copy: u64 = setup.files.values().map(|data| data.len() as u64).sum();
    if let Some(node_a) = &node_a {
        let used = disk_usage(&node_a.join("mnt/ferry"));
        println!("two DataStages of {one_copy} bytes take {used} bytes on node-a");
        assert!(used < one_copy + one_copy / 5, "one copy of {one_copy} bytes, but {used} bytes in use");
        std::fs::write(node_a.join("mnt/ferry/wiped/mine.txt"), b"not Ferry's").unwrap();
    }

    let client = setup.cluster.client().await.unwrap();
    for name in ["kept", "wiped"] {
        setup.datastages.delete(name, &Default::default()).await.unwrap();
    }
    // Jobs in the workers' namespace have no owner there but their
    // DataStage's anchor, which the operator removes once it is gone.
    let jobs: Api<Job> = Api::namespaced(client.clone(), ferry_e2e::WORKERS_NS);
    wait_for(&setup.cluster, "both DataStages and all their Jobs to be gone", Duration::from_secs(120), || {
        let (datastages, jobs) = (setup.datastages.clone(), jobs.clone());
        async move {
            let left = datastages.list(&Default::default()).await.ok()?.items.len();
            let selector = format!("{}=reclaim", names::DATASTAGE_NAMESPACE);
            let jobs = jobs.list(&kube::api::ListParams::default().labels(&selector)).await.ok()?.items.len();
            (left == 0 && jobs == 0).then_some(())
        }
    })
    .await;
    let reasons: Vec<String> = event_reasons(&client, "reclaim", "wiped").await.into_iter().map(|(_, r)| r).collect();
    assert!(reasons.iter().any(|r| r == "CleanedUp"), "{reasons:?}");
    if let (Some(a), Some(b)) = (node_a, setup.cluster.node_dir("node-b")) {
        for node in [&a, &b] {
            assert_eq!(read_tree(&node.join("mnt/ferry/kept")), setup.files, "Retain keeps the data");
        }
        assert_eq!(
            read_tree(&a.join("mnt/ferry/wiped")),
            BTreeMap::from([("mine.txt".to_owned(), b"not Ferry's".to_vec())]),
            "Delete removes what was staged and only that"
        );
        assert!(read_tree(&b.join("mnt/ferry/wiped")).is_empty());
        assert!(!b.join("mnt/ferry/wiped/.ferry").exists());
        // The shared objects are still the kept copy's: nothing went twice.
        let used = disk_usage(&a.join("mnt/ferry"));
        assert!(used >= one_copy && used < one_copy + one_copy / 5, "{used} bytes left for one copy of {one_copy}");
    }
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operator_killed_mid_transfer_is_replaced_without_duplicate_jobs() {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::Pod;
    let mut setup = setup("restart").await;
    setup.create_secret().await;
    setup
        .apply_spec(
            "slow",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/slow"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                // About 6 seconds per node: the operator dies while both copy.
                "transfer": {"maxBandwidth": "2MiB"},
            }),
        )
        .await;
    setup.wait_status("slow", "Running", |s| s.phase == Some(Phase::Running)).await;
    let client = setup.cluster.client().await.unwrap();
    let uids = |jobs: Vec<Job>| -> BTreeMap<String, String> {
        jobs.into_iter().map(|j| (j.metadata.name.unwrap(), j.metadata.uid.unwrap())).collect()
    };
    let before = uids(datastage_jobs(&client, "restart", "slow", names::WORKER).await);
    assert_eq!(before.len(), 2);

    setup.operator.signal_group(rustix::process::Signal::KILL);
    setup.operator.stop(Duration::from_secs(1));
    let (replacement, _) = start_operator(&setup.cluster, setup._logs.path(), "operator-2");
    setup.operator = replacement;
    let status =
        setup.wait_status("slow", "Succeeded under the new operator", |s| s.phase == Some(Phase::Succeeded)).await;

    assert_eq!(
        uids(datastage_jobs(&client, "restart", "slow", names::WORKER).await),
        before,
        "the same Jobs, no new ones"
    );
    let pods: Vec<Pod> = datastage_pods(&client, "restart", "slow", names::WORKER).await;
    assert_eq!(pods.len(), 2, "each worker ran once");
    assert_eq!(status.totals.unwrap().bytes_done as usize, 2 * setup.files.values().map(Vec::len).sum::<usize>());
    if let Some(a) = setup.cluster.node_dir("node-a") {
        assert_eq!(read_tree(&a.join("mnt/ferry/slow")), setup.files);
    }
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gcs_source_is_staged_onto_every_node() {
    let setup = setup("gcs").await;
    let gcs = ferry_testkit::GcsServer::start();
    gcs.create_bucket("datasets").await;
    for (key, data) in &setup.files {
        gcs.put("datasets", &format!("demo/{key}"), data.clone()).await;
    }
    setup
        .apply_spec(
            "from-gcs",
            json!({
                // The emulator checks no credentials; a real bucket would name a key Secret or use Workload Identity.
                "source": {"uri": "gs://datasets/demo", "endpoint": gcs.endpoint, "anonymous": true},
                "destination": {"volume": {"hostPath": "/mnt/ferry/from-gcs"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            }),
        )
        .await;
    let status = setup.wait_status("from-gcs", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(status.nodes.as_deref(), Some("2/2"));
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/from-gcs")), setup.files, "node-a's copy is byte-identical");
        assert_eq!(read_tree(&b.join("mnt/ferry/from-gcs")), setup.files, "node-b's copy is byte-identical");
    }
    setup.cluster.stop().await;
}

/// Azurite checks every request's Shared Key signature, so the account key
/// from the Secret is what lets the workers in.
#[tokio::test(flavor = "multi_thread")]
async fn an_azure_source_is_staged_onto_every_node_with_the_key_from_its_secret() {
    use ferry_contract::options::{AZURE_STORAGE_ACCOUNT_ENV, AZURE_STORAGE_KEY_ENV};
    let setup = setup("azure").await;
    let azure = ferry_testkit::AzuriteServer::start();
    azure.create_container("models").await;
    for (key, data) in &setup.files {
        azure.put("models", &format!("demo/{key}"), data.clone()).await;
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "azure"},
        "stringData": {AZURE_STORAGE_ACCOUNT_ENV: ferry_testkit::AZURITE_ACCOUNT, AZURE_STORAGE_KEY_ENV: ferry_testkit::AZURITE_KEY}});
    setup.secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    setup
        .apply_spec(
            "from-azure",
            json!({
                "source": {"uri": "az://models/demo", "endpoint": azure.endpoint, "credentials": {"name": "azure"}},
                "destination": {"volume": {"hostPath": "/mnt/ferry/from-azure"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            }),
        )
        .await;
    let status = setup.wait_status("from-azure", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(status.nodes.as_deref(), Some("2/2"));
    let bytes: usize = setup.files.values().map(Vec::len).sum();
    assert_eq!(status.totals.unwrap().bytes_done as usize, 2 * bytes, "each node copied the dataset once");
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/from-azure")), setup.files, "node-a's copy is byte-identical");
        assert_eq!(read_tree(&b.join("mnt/ferry/from-azure")), setup.files, "node-b's copy is byte-identical");
    }
    setup.cluster.stop().await;
}

/// An OCI artifact (each file a layer named by its title) with registry
/// credentials from a `kubernetes.io/dockerconfigjson` Secret; the tag then
/// moves to a manifest with one layer changed, and the next sync copies
/// that layer only, on both nodes.
#[tokio::test(flavor = "multi_thread")]
async fn an_oci_artifact_is_staged_onto_every_node_and_a_moved_tag_resyncs_only_the_changed_layer() {
    let setup = setup("oci").await;
    let registry = ferry_testkit::RegistryServer::start();
    for (key, data) in &setup.files {
        registry.put("models/demo", "v1", key, data.clone()).await;
    }
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "registry"}, "stringData": {".dockerconfigjson": registry.docker_config_json()}});
    setup.secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();
    let uri = format!("oci://{}/models/demo:v1", registry.host);
    setup
        .apply_spec(
            "from-oci",
            json!({
                "source": {"uri": uri, "endpoint": registry.endpoint, "credentials": {"name": "registry"}},
                "destination": {"volume": {"hostPath": "/mnt/ferry/from-oci"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                "schedule": "*/3 * * * * *",
                // Suspended while the tag moves (see the scheduled test).
                "suspend": true,
            }),
        )
        .await;
    let first = setup.wait_status("from-oci", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(first.nodes.as_deref(), Some("2/2"));
    // Summed over the two workers.
    assert_eq!(first.last_sync.clone().unwrap().added.objects as usize, 2 * setup.files.len());
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node) {
            assert_eq!(read_tree(&dir.join("mnt/ferry/from-oci")), setup.files, "{node}'s copy is byte-identical");
        }
    }

    // The tag moves: one layer rewritten, the others the same blobs.
    let changed = pattern(97, 4321);
    registry.put("models/demo", "v1", "train/003.bin", changed.clone()).await;
    let resume = json!({"spec": {"suspend": false}});
    setup.datastages.patch("from-oci", &PatchParams::default(), &Patch::Merge(&resume)).await.unwrap();
    let synced = setup
        .wait_status("from-oci", "a sync of the moved tag", |s| {
            s.phase == Some(Phase::Succeeded) && s.run.is_some_and(|run| run > first.run.unwrap())
        })
        .await;
    let changes = synced.last_sync.unwrap();
    assert_eq!(
        (changes.added.objects, changes.updated.objects, changes.removed.objects, changes.updated.bytes),
        (0, 2, 0, 2 * 4321),
        "only the changed layer moved, on each node: {changes:?}"
    );
    let mut expected = setup.files.clone();
    expected.insert("train/003.bin".into(), changed);
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node) {
            assert_eq!(read_tree(&dir.join("mnt/ferry/from-oci")), expected, "{node} holds the new manifest's files");
        }
    }
    setup.cluster.stop().await;
}

/// A model from the Hugging Face Hub (olah behind the testkit's front),
/// gated, with its token from a Secret: staged onto both nodes, which feed
/// each other (PeerToPeer), as `Versioned`; the status names the commit.
/// The branch then moves (one file rewritten) and the next scheduled sync
/// stages the new commit as a new version, copying only that file, and
/// switches both nodes to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hub_model_is_staged_onto_every_node_with_peers_and_a_moved_branch_becomes_a_new_version() {
    let setup = setup("hf").await;
    let hub = ferry_testkit::HubServer::start();
    for (key, data) in &setup.files {
        hub.put("demo", key, data.clone()).await;
    }
    hub.gate("demo", "hf_e2e_token");
    setup.secrets.create(&PostParams::default(), &ferry_e2e::hub_token_secret("hf", "hf_e2e_token")).await.unwrap();
    setup
        .apply_spec(
            "from-hf",
            json!({
                "source": {"uri": "hf://ferry/demo", "endpoint": hub.endpoint, "credentials": {"name": "hf"}},
                "destination": {"volume": {"hostPath": "/mnt/ferry/from-hf"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                "fanout": "PeerToPeer",
                "updateStrategy": "Versioned",
                "schedule": "*/3 * * * * *",
                // Suspended while the branch moves (see the scheduled test).
                "suspend": true,
            }),
        )
        .await;
    let first = setup.wait_status("from-hf", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(first.nodes.as_deref(), Some("2/2"));
    let snapshot = first.snapshot.clone().unwrap();
    assert_eq!(snapshot.revision, Some(hub.commit("demo", "main")), "the commit read: {first:?}");
    let d1 = first.versions.clone().and_then(|v| v.current).expect("a current version");
    assert_eq!(d1, snapshot.digest);
    assert!(first.totals.clone().unwrap().bytes_from_peers.unwrap_or(0) > 0, "the nodes fed each other: {first:?}");
    let current = |node: &str| setup.cluster.node_dir(node).map(|dir| dir.join("mnt/ferry/from-hf/current"));
    for node in ["node-a", "node-b"] {
        if let Some(dir) = current(node) {
            assert_eq!(read_tree(&dir), setup.files, "{node}'s copy is byte-identical");
        }
    }

    let changed = pattern(98, 54_321);
    hub.put("demo", "train/004.bin", changed.clone()).await;
    let resume = json!({"spec": {"suspend": false}});
    setup.datastages.patch("from-hf", &PatchParams::default(), &Patch::Merge(&resume)).await.unwrap();
    let moved = setup
        .wait_status("from-hf", "the moved branch's version", |s| {
            s.phase == Some(Phase::Succeeded)
                && s.versions.as_ref().and_then(|v| v.current.as_deref()).is_some_and(|c| c != d1)
        })
        .await;
    assert_eq!(moved.snapshot.clone().unwrap().revision, Some(hub.commit("demo", "main")), "{moved:?}");
    let versions = moved.versions.clone().unwrap();
    assert_eq!(versions.previous.as_deref(), Some(d1.as_str()), "{moved:?}");
    let mut expected = setup.files.clone();
    expected.insert("train/004.bin".into(), changed);
    for node in ["node-a", "node-b"] {
        if let Some(dir) = current(node) {
            assert_eq!(read_tree(&dir), expected, "{node} switched to the new commit's files");
        }
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

/// A reserve no volume can leave is refused on every node before a byte is
/// written, with a message that names the DataStage field to change; an
/// edit to a percentage starts a new run that stages.
#[tokio::test(flavor = "multi_thread")]
async fn a_reserve_the_volume_cannot_leave_is_refused_naming_the_field_and_lowering_it_stages() {
    let setup = setup("reserve").await;
    setup.create_secret().await;
    setup
        .apply_spec(
            "reserved",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/reserved"}},
                "capacity": {"reserve": "999999T"},
            }),
        )
        .await;
    let refused = setup
        .wait_status("reserved", "refused for capacity on a node", |s| {
            s.workers.iter().any(|w| w.reason.as_deref() == Some("InsufficientCapacity"))
        })
        .await;
    let worker = refused.workers.iter().find(|w| w.reason.as_deref() == Some("InsufficientCapacity")).unwrap();
    let message = worker.message.as_deref().unwrap_or_default();
    assert!(message.contains("reserve, 999999T)"), "the stager says what the reserve is: {message}");
    // The stager names no interface; the operator's condition names the field.
    setup
        .wait_status("reserved", "the refusal in a condition", |s| {
            s.conditions
                .iter()
                .any(|c| c.reason == "InsufficientCapacity" && c.message.contains("spec.capacity.reserve"))
        })
        .await;
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node).map(|d| d.join("mnt/ferry/reserved")).filter(|d| d.exists()) {
            let staged = read_tree(&dir);
            assert!(staged.is_empty(), "{node}: nothing is written before the check: {:?}", staged.keys());
        }
    }

    let patch = json!({"spec": {"capacity": {"reserve": "1%"}}});
    setup.datastages.patch("reserved", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let staged = setup
        .wait_status("reserved", "run 2 Succeeded", |s| s.run == Some(2) && s.phase == Some(Phase::Succeeded))
        .await;
    assert!(staged.workers.iter().all(|w| w.reason.as_deref() != Some("InsufficientCapacity")), "{:?}", staged.workers);
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node) {
            assert!(read_tree(&dir.join("mnt/ferry/reserved")) == setup.files, "{node} holds the dataset");
        }
    }
    setup.cluster.stop().await;
}

/// The condition message of a DataStage held back, `Pending`, for `reason`.
fn held_for<'a>(status: &'a ferry_crds::DataStageStatus, reason: ferry_contract::Reason) -> Option<&'a str> {
    (status.phase == Some(Phase::Pending))
        .then(|| status.conditions.iter().find(|c| c.reason == reason.as_str()))
        .flatten()
        .map(|c| c.message.as_str())
}

/// The condition message of a DataStage a full disk holds back.
fn disk_hold(status: &ferry_crds::DataStageStatus) -> Option<&str> {
    held_for(status, ferry_contract::Reason::InsufficientCapacity)
}

/// A 32 MiB filesystem of its own as each node's hostPath root
/// (`/mnt/ferry`), or `None` (the test is skipped, saying why) where the
/// nodes are not the process-based ones or tmpfs cannot be mounted.
fn small_disks(setup: &Setup, nodes: &[&str]) -> Option<Vec<ferry_testkit::SmallFilesystem>> {
    let mut disks = Vec::new();
    for node in nodes {
        let Some(dir) = setup.cluster.node_dir(node) else {
            eprintln!("SKIP: this test needs the process-based nodes, whose disks it can mount");
            return None;
        };
        match ferry_testkit::SmallFilesystem::mount_on(&dir.join("mnt/ferry"), "32m") {
            Ok(disk) => disks.push(disk),
            Err(why) => {
                eprintln!("SKIP: this test mounts a tmpfs as each node's disk (run it as root): {why}");
                return None;
            }
        }
    }
    Some(disks)
}

/// Each node's hostPath root is a small filesystem of its own: a copy that
/// does not fit beside another waits (not Failed), saying what it needs and
/// what is free, with nothing written; deleting the first DataStage frees
/// the room and the second starts again by itself.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_that_does_not_fit_beside_another_waits_for_room_and_stages_once_the_other_is_deleted() {
    let setup = setup("disks").await;
    let nodes = ["node-a", "node-b"];
    let Some(disks) = small_disks(&setup, &nodes) else { return };
    setup.create_secret().await;
    // Copies of other objects: copies of the same ones would share.
    for name in ["first", "second"] {
        setup.upload_as(name).await;
    }
    let copy = |name: &str, reserve: &str| {
        json!({
            "source": setup.store(&format!("s3://datasets/{name}")),
            "destination": {"volume": {"hostPath": format!("/mnt/ferry/{name}")}},
            "capacity": {"reserve": reserve},
            "reclaimPolicy": "Delete",
            // A refused worker's Job would retry with backoff first (space
            // freed by others a moment later); here it gives up at once.
            "backoffLimit": 0,
        })
    };

    // 13.5 MiB of 32 MiB: the first copy fits, and its workers report the
    // disk they left.
    setup.apply_spec("first", copy("first", "0")).await;
    let first = setup.wait_status("first", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let dataset: u64 = setup.files.values().map(|f| f.len() as u64).sum();
    for worker in &first.workers {
        let disk = worker.disk.as_ref().unwrap_or_else(|| panic!("{} reports its disk: {worker:?}", worker.name));
        assert_eq!(disk.size_bytes, 32 << 20, "{disk:?}");
        assert!(disk.free_bytes <= (32 << 20) - dataset && disk.needed_bytes.is_none(), "{disk:?}");
    }

    // The second copy with an 8 MiB reserve needs 21.5 MiB where 18.5 MiB
    // are left: refused before writing on both nodes, and it waits.
    setup.apply_spec("second", copy("second", "8MiB")).await;
    let held = setup.wait_status("second", "waiting for room", |s| disk_hold(s).is_some()).await;
    let message = disk_hold(&held).unwrap();
    assert!(message.starts_with("waiting for room: node node-"), "{message}");
    assert!(
        message.contains("needs 21.5 MiB free (its reserve included) where 18.5 MiB of 32.0 MiB is free"),
        "{message}"
    );
    assert!(message.contains("spec.capacity.reserve"), "{message}");
    assert_eq!(held.run, Some(1));
    for worker in &held.workers {
        assert_eq!(worker.reason.as_deref(), Some("InsufficientCapacity"), "{worker:?}");
        let disk = worker.disk.as_ref().expect("the refusal's numbers");
        assert!(disk.needed_bytes.is_some_and(|n| n > disk.free_bytes), "{disk:?}");
    }
    for node in nodes {
        let dir = setup.cluster.node_dir(node).unwrap().join("mnt/ferry/second");
        assert!(!dir.exists() || read_tree(&dir).is_empty(), "{node}: nothing written before the check");
    }
    // Still waiting a while later, without another run.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let still = setup.datastages.get("second").await.unwrap().status.unwrap();
    assert!(disk_hold(&still).is_some() && still.run == Some(1), "{still:?}");

    // Deleting the first copy removes its data from both nodes; the second
    // starts again by itself and stages byte-identical.
    setup.datastages.delete("first", &Default::default()).await.unwrap();
    let staged =
        setup.wait_status("second", "run 2 Succeeded", |s| s.run == Some(2) && s.phase == Some(Phase::Succeeded)).await;
    assert!(staged.conditions.iter().all(|c| c.reason != "InsufficientCapacity"), "{:?}", staged.conditions);
    for node in nodes {
        let root = setup.cluster.node_dir(node).unwrap().join("mnt/ferry");
        assert!(read_tree(&root.join("second")) == setup.files, "{node} holds the second copy");
        assert!(!root.join("first").exists() || read_tree(&root.join("first")).is_empty(), "{node}: first removed");
    }
    let client = setup.cluster.client().await.unwrap();
    let events = event_reasons(&client, "disks", "second").await;
    assert!(events.iter().any(|(kind, reason)| kind == "Warning" && reason == "InsufficientCapacity"), "{events:?}");
    assert!(events.iter().any(|(_, reason)| reason == "RoomOnDisk"), "{events:?}");
    setup.cluster.stop().await;
    drop(disks);
}

/// A pull that fits only once an idle copy goes evicts it: the idle
/// DataStage's copies are marked (its nodes stop holding the data), removed
/// by its clean-up Jobs, counted in a metric and announced by Events; a copy
/// a running pod reads is never chosen, though it is older. The evicted
/// DataStage stages again when a pod waits for it, once there is room.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_copy_is_evicted_for_a_pull_that_needs_its_room_and_stages_again_when_a_pod_waits_for_it() {
    let setup = setup("evict").await;
    let nodes = ["node-a", "node-b"];
    let Some(disks) = small_disks(&setup, &nodes) else { return };
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "evict");
    // Copies of other objects: copies of the same ones would share.
    for name in ["busy", "idle", "new"] {
        setup.upload_as(name).await;
    }
    let copy = |name: &str, eviction: &str| {
        json!({
            "source": setup.store(&format!("s3://datasets/{name}")),
            "destination": {"volume": {"hostPath": format!("/mnt/ferry/{name}")}},
            "capacity": {"reserve": "0", "eviction": eviction},
            "reclaimPolicy": "Delete",
            "backoffLimit": 0,
        })
    };
    let reader = |name: &str, datastage: &str, node: Option<&str>| {
        let mut labels = json!({"ferry.dev/datastage": datastage});
        let mut spec = json!({"containers": [{"name": "train", "image": ferry_e2e::image("ferry-e2e-shell"),
            "command": ["sh", "-c", "sleep 600"]}], "terminationGracePeriodSeconds": 1});
        match node {
            Some(node) => spec["nodeName"] = node.into(),
            // As the webhook leaves a pod whose data is not ready.
            None => {
                labels["ferry.dev/data-gated"] = "true".into();
                spec["schedulingGates"] = json!([{"name": "ferry.dev/data-ready"}]);
            }
        }
        serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(
            json!({"metadata": {"name": name, "labels": labels}, "spec": spec}),
        )
        .unwrap()
    };
    let holds = |name: &str, node: &str| {
        let dir = setup.cluster.node_dir(node).unwrap().join("mnt/ferry").join(name);
        dir.exists() && read_tree(&dir) == setup.files
    };

    // Two copies of 13.5 MiB on each 32 MiB disk; the older one is read
    // by a running pod on each node.
    setup.apply_spec("busy", copy("busy", "WhenSpaceIsNeeded")).await;
    setup.wait_status("busy", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    for node in nodes {
        pods.create(&PostParams::default(), &reader(&format!("reader-{node}"), "busy", Some(node))).await.unwrap();
    }
    setup.apply_spec("idle", copy("idle", "WhenSpaceIsNeeded")).await;
    setup.wait_status("idle", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;

    // A third copy finds 5 MiB free: only evicting "idle" makes its room.
    setup.apply_spec("new", copy("new", "Never")).await;
    let evicted = setup
        .wait_status("idle", "both copies evicted and removed", |s| {
            s.workers.len() == 2 && s.workers.iter().all(|w| w.evicted.as_ref().is_some_and(|e| e.removed))
        })
        .await;
    for worker in &evicted.workers {
        let message = &worker.evicted.as_ref().unwrap().message;
        assert!(message.contains("to make room for evict/new"), "{message}");
    }
    let staged = setup.wait_status("new", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert!(staged.run.is_some_and(|run| run >= 2), "it was refused first: {staged:?}");
    for node in nodes {
        assert!(holds("new", node) && holds("busy", node), "{node} holds new and busy");
        let idle = setup.cluster.node_dir(node).unwrap().join("mnt/ferry/idle");
        assert!(!idle.exists() || read_tree(&idle).is_empty(), "{node}: the idle copy is gone");
    }
    let busy = setup.datastages.get("busy").await.unwrap().status.unwrap();
    assert!(busy.workers.iter().all(|w| w.evicted.is_none() && w.last_used_time.is_some()), "{:?}", busy.workers);
    let new_events = event_reasons(&client, "evict", "new").await;
    assert!(new_events.iter().any(|(_, reason)| reason == "RoomOnDisk"), "{new_events:?}");
    let idle_events = event_reasons(&client, "evict", "idle").await;
    assert_eq!(idle_events.iter().filter(|(_, reason)| reason == "Evicted").count(), 2, "{idle_events:?}");
    let (_, metrics) = ferry_testkit::http_get(setup.operator_port, "/metrics").expect("the operator answers");
    assert!(metrics.contains("ferry_operator_evictions_total 2"), "{metrics}");
    let evicted_bytes =
        format!("ferry_operator_evicted_bytes_total {}", 2 * setup.files.values().map(Vec::len).sum::<usize>());
    assert!(metrics.contains(&evicted_bytes), "{evicted_bytes} in {metrics}");

    // A pod waits for "idle": it stages again, but "new" is not evictable
    // and "busy" is read, so it waits for room until "new" goes.
    pods.create(&PostParams::default(), &reader("wants-idle", "idle", None)).await.unwrap();
    let held = setup.wait_status("idle", "waiting for room", |s| disk_hold(s).is_some()).await;
    assert!(held.run.is_some_and(|run| run >= 2), "{held:?}");
    setup.datastages.delete("new", &Default::default()).await.unwrap();
    setup
        .wait_status("idle", "staged again", |s| {
            s.phase == Some(Phase::Succeeded) && s.workers.iter().all(|w| w.evicted.is_none())
        })
        .await;
    for node in nodes {
        assert!(holds("idle", node) && holds("busy", node), "{node} holds idle again, and busy");
    }
    let idle_events = event_reasons(&client, "evict", "idle").await;
    for reason in ["PodWaiting", "RoomOnDisk"] {
        assert!(idle_events.iter().any(|(_, r)| r == reason), "{reason} in {idle_events:?}");
    }
    setup.cluster.stop().await;
    drop(disks);
}

/// With `idleSeconds`, a copy no pod uses goes by itself: the node a pod
/// reads on keeps its copy until the pod is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_copy_no_pod_used_for_its_idle_seconds_is_evicted_by_itself() {
    let setup = setup("idle").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "idle");
    let reader = json!({"metadata": {"name": "reader", "labels": {"ferry.dev/datastage": "corpus"}},
        "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 1, "containers": [{"name": "train",
            "image": ferry_e2e::image("ferry-e2e-shell"), "command": ["sh", "-c", "sleep 600"]}]}});
    pods.create(&PostParams::default(), &serde_json::from_value(reader).unwrap()).await.unwrap();
    let spec = json!({
        "source": setup.store("s3://datasets/demo"),
        "destination": {"volume": {"hostPath": "/mnt/ferry/corpus"}},
        "capacity": {"eviction": "WhenSpaceIsNeeded", "idleSeconds": 5},
    });
    setup.apply_spec("corpus", spec).await;
    let holds = |node: &str| {
        setup.cluster.node_dir(node).is_none_or(|dir| read_tree(&dir.join("mnt/ferry/corpus")) == setup.files)
    };
    let evicted_on = |status: &ferry_crds::DataStageStatus, node: &str| {
        status.workers.iter().any(|w| w.name == node && w.evicted.as_ref().is_some_and(|e| e.removed))
    };
    let status = setup.wait_status("corpus", "node-b's copy evicted", |s| evicted_on(s, "node-b")).await;
    assert_eq!((status.phase, status.nodes.as_deref()), (Some(Phase::Succeeded), Some("1/2")), "{status:?}");
    let message = &status.workers.iter().find(|w| w.name == "node-b").unwrap().evicted.as_ref().unwrap().message;
    assert!(message.contains("no pod used it for 5 s (spec.capacity.idleSeconds)"), "{message}");
    assert!(holds("node-a") && !evicted_on(&status, "node-a"), "the read copy stays: {status:?}");
    if let Some(dir) = setup.cluster.node_dir("node-b") {
        assert!(read_tree(&dir.join("mnt/ferry/corpus")).is_empty(), "node-b's copy is gone");
    }

    // The pod goes: node-a's copy follows once idle.
    pods.delete("reader", &Default::default()).await.unwrap();
    let status = setup.wait_status("corpus", "node-a's copy evicted", |s| evicted_on(s, "node-a")).await;
    assert_eq!(status.nodes.as_deref(), Some("0/2"));
    let events = event_reasons(&client, "idle", "corpus").await;
    assert_eq!(events.iter().filter(|(_, reason)| reason == "Evicted").count(), 2, "{events:?}");
    setup.cluster.stop().await;
}

/// The condition message of a DataStage a StagingQuota holds back.
fn quota_hold(status: &ferry_crds::DataStageStatus) -> Option<&str> {
    held_for(status, ferry_contract::Reason::QuotaExceeded)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_over_its_staging_quota_waits_naming_it_and_runs_once_it_is_raised() {
    use ferry_crds::StagingQuota;
    let setup = setup("quota").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    let quotas: Api<StagingQuota> = Api::namespaced(client.clone(), "quota");
    let quota = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "StagingQuota", "metadata": {"name": "disk"},
        "spec": {"bytesPerNode": "20Mi"}});
    quotas.create(&PostParams::default(), &serde_json::from_value(quota).unwrap()).await.unwrap();
    let set_quota = |per_node: &'static str| {
        let quotas = quotas.clone();
        async move {
            let patch = json!({"spec": {"bytesPerNode": per_node}});
            quotas.patch("disk", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    };
    let dataset: usize = setup.files.values().map(Vec::len).sum();
    let nodes = ["node-a", "node-b"];
    let staged_on_every_node = |name: &str| {
        for node in nodes {
            if let Some(dir) = setup.cluster.node_dir(node) {
                assert!(read_tree(&dir.join("mnt/ferry").join(name)) == setup.files, "{node} holds {name}");
            }
        }
    };

    // 13.5 MiB per node fits a quota of 20 MiB per node; each worker is
    // told the room it has.
    setup.apply("first", "/mnt/ferry/first").await;
    setup.wait_status("first", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    staged_on_every_node("first");
    let job = worker_job(&client, "quota", "first", "node-a", 1).await.unwrap();
    let args = job.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap_or_default();
    assert!(args.iter().any(|arg| arg == "--dataset-quota=20MiB"), "{args:?}");
    // The quota's status shows what the namespace holds (`kubectl get squota`).
    let quota_status = |check: fn(&ferry_crds::StagingQuotaStatus, i64) -> bool| {
        let quotas = quotas.clone();
        async move {
            let status = quotas.get("disk").await.ok()?.status?;
            check(&status, dataset as i64).then_some(status)
        }
    };
    let used = wait_for(&setup.cluster, "the quota's status to count the first copy", Duration::from_secs(30), || {
        quota_status(|s, dataset| s.used_bytes == 2 * dataset && s.used_bytes_on_fullest_node == dataset)
    })
    .await;
    assert_eq!(
        used.used.as_deref(),
        Some("26.9 MiB in all, 13.5 MiB on node-a"),
        "ties go to the first node by name: {used:?}"
    );

    // A second copy leaves 6.5 MiB of room on each node: its workers find
    // the dataset larger, write nothing, and it waits naming the quota.
    setup.apply("second", "/mnt/ferry/second").await;
    let held = setup.wait_status("second", "held by the quota", |s| quota_hold(s).is_some()).await;
    let message = quota_hold(&held).unwrap();
    assert!(message.contains("StagingQuota disk allows 20.0 MiB per node (bytesPerNode)"), "{message}");
    assert!(message.contains("the dataset needs at least 13.5 MiB"), "{message} ({dataset} bytes)");
    for node in nodes {
        if let Some(dir) = setup.cluster.node_dir(node).map(|d| d.join("mnt/ferry/second")).filter(|d| d.exists()) {
            assert!(read_tree(&dir).is_empty(), "{node}: the refused dataset wrote nothing");
        }
    }

    // Raised, the quota has room: the refused run starts again and stages.
    set_quota("40Mi").await;
    let staged =
        setup.wait_status("second", "run 2 Succeeded", |s| s.run == Some(2) && s.phase == Some(Phase::Succeeded)).await;
    assert!(staged.conditions.iter().all(|c| c.reason != "QuotaExceeded"), "{:?}", staged.conditions);
    staged_on_every_node("second");

    // A quota the namespace already fills holds a new DataStage back before
    // any worker starts, with a Warning; raising it lets it run.
    set_quota("20Mi").await;
    setup.apply("third", "/mnt/ferry/third").await;
    let held = setup.wait_status("third", "held before it starts", |s| quota_hold(s).is_some()).await;
    let message = quota_hold(&held).unwrap();
    assert!(message.contains("hold 26.9 MiB on node node-"), "{message}");
    assert!(message.contains("which leaves 0 B"), "{message}");
    let third_jobs = datastage_jobs(&client, "quota", "third", names::WORKER).await;
    assert!(third_jobs.is_empty(), "no worker starts: {:?}", third_jobs.len());
    let events = event_reasons(&client, "quota", "third").await;
    assert!(events.iter().any(|(kind, reason)| kind == "Warning" && reason == "QuotaExceeded"), "{events:?}");
    wait_for(&setup.cluster, "the quota's status to count the waiting DataStage", Duration::from_secs(30), || {
        quota_status(|s, _| s.waiting_data_stages == 1)
    })
    .await;
    set_quota("60Mi").await;
    setup.wait_status("third", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    staged_on_every_node("third");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_uploads_a_node_directory_that_a_pull_brings_back_identical() {
    let setup = setup("push").await;
    let Some(node_a) = setup.cluster.node_dir("node-a") else {
        eprintln!("skipped: needs to write a node's disk directly");
        return;
    };
    setup.create_secret().await;
    let outbox = node_a.join("mnt/ferry/outbox");
    for (rel, data) in &setup.files {
        let path = outbox.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
    setup
        .apply_spec(
            "upload",
            json!({
                "source": {"volume": {"hostPath": "/mnt/ferry/outbox"}},
                "destination": setup.store("s3://datasets/pushed"),
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
            }),
        )
        .await;
    setup.wait_status("upload", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let listed: BTreeMap<String, u64> = setup.s3.list("datasets", "pushed/").await.into_iter().collect();
    let expected: BTreeMap<String, u64> =
        setup.files.iter().map(|(k, v)| (format!("pushed/{k}"), v.len() as u64)).collect();
    assert_eq!(listed, expected);

    setup
        .apply_spec(
            "download",
            json!({
                "source": setup.store("s3://datasets/pushed"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/inbox"}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
            }),
        )
        .await;
    setup.wait_status("download", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let node_b = setup.cluster.node_dir("node-b").unwrap();
    assert_eq!(read_tree(&node_b.join("mnt/ferry/inbox")), setup.files, "the round trip is byte-identical");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pull_onto_a_shared_claim_is_sharded_over_three_workers() {
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let setup = setup("shards").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "shared-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": "/mnt/ferry/shared"}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual", "volumeName": "shared-pv",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "shards")
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();

    setup
        .apply_spec(
            "sharded",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"persistentVolumeClaim": {"claimName": "shared", "subPath": "demo"}}},
                "workers": 3,
                // A hostPath-backed volume is only "shared" on one node of this harness.
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
            }),
        )
        .await;
    let status = setup.wait_status("sharded", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let job = Api::<Job>::namespaced(client.clone(), "shards").get("sharded-shared-r1").await.unwrap();
    let job_status = job.status.unwrap();
    assert_eq!(job_status.succeeded, Some(3), "three indexed workers completed");
    assert_eq!(job.spec.unwrap().completion_mode.as_deref(), Some("Indexed"));
    assert_eq!(status.workers.len(), 1);
    if let Some(node_b) = setup.cluster.node_dir("node-b") {
        let staged = read_tree(&node_b.join("mnt/ferry/shared/demo"));
        let missing: Vec<&String> = setup.files.keys().filter(|k| !staged.contains_key(*k)).collect();
        let extra: Vec<&String> = staged.keys().filter(|k| !setup.files.contains_key(*k)).collect();
        assert!(missing.is_empty() && extra.is_empty(), "missing {missing:?}, extra {extra:?}");
        assert_eq!(staged, setup.files, "the shards add up to the dataset");
    }

    // A quota on the namespace's bytes in all, which the first copy fills
    // but for 6.5 MiB: every shard of a second copy counts the whole
    // dataset, so all three refuse it (none writes its smaller share), and
    // the DataStage waits naming the quota until the quota goes.
    let quotas: Api<ferry_crds::StagingQuota> = Api::namespaced(client.clone(), "shards");
    let quota = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "StagingQuota", "metadata": {"name": "team"},
        "spec": {"bytes": "20Mi"}});
    quotas.create(&PostParams::default(), &serde_json::from_value(quota).unwrap()).await.unwrap();
    setup
        .apply_spec(
            "again",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"persistentVolumeClaim": {"claimName": "shared", "subPath": "again"}}},
                "workers": 3,
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}},
            }),
        )
        .await;
    let held = setup.wait_status("again", "held by the quota", |s| quota_hold(s).is_some()).await;
    let message = quota_hold(&held).unwrap();
    assert!(message.contains("the dataset needs at least 13.5 MiB"), "{message}");
    assert!(message.contains("StagingQuota team allows 20.0 MiB in all (bytes)"), "{message}");
    if let Some(dir) = setup.cluster.node_dir("node-b").map(|d| d.join("mnt/ferry/shared/again")) {
        assert!(read_tree(&dir).is_empty(), "no shard wrote its share");
    }
    quotas.delete("team", &Default::default()).await.unwrap();
    setup.wait_status("again", "run 2 Succeeded", |s| s.run == Some(2) && s.phase == Some(Phase::Succeeded)).await;
    if let Some(node_b) = setup.cluster.node_dir("node-b") {
        assert_eq!(read_tree(&node_b.join("mnt/ferry/shared/again")), setup.files);
    }
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_training_pod_waits_in_its_init_container_until_its_node_has_the_data() {
    use k8s_openapi::api::core::v1::Pod;
    let setup = setup("train").await;
    let client = setup.cluster.client().await.unwrap();
    // The trainer's identity may read DataStages, nothing more.
    for manifest in [
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer", "namespace": "train"}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "read-datastages", "namespace": "train"},
               "rules": [{"apiGroups": ["ferry.dev"], "resources": ["datastages"], "verbs": ["get"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "trainer", "namespace": "train"},
               "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": "train"}],
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-datastages"}}),
    ] {
        create_object(&client, "train", manifest).await;
    }
    // The training pod comes first: it must wait for data that does not exist yet.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
        "spec": {
            "serviceAccountName": "trainer", "restartPolicy": "Never",
            "nodeSelector": {"ferry.dev/e2e-node": "node-b"},
            "initContainers": [{"name": "wait", "image": ferry_e2e::image("ferry-stager"),
                "args": ["wait", "train/demo", "--timeout", "2m"],
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}],
            "containers": [{"name": "train", "image": ferry_e2e::image("ferry-e2e-shell"),
                // Paths reach the script through env (the agent maps values, not script text).
                "command": ["sh", "-c", "test -s \"$DATA/weights.bin\" && n=$$(ls \"$DATA/train\" | wc -l) && test \"$n\" -eq 30"],
                "env": [{"name": "DATA", "value": "/data"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "hostPath": {"path": "/mnt/ferry/demo"}}],
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "train");
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let phase = |pod: &Pod| pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(phase(&pods.get("trainer").await.unwrap()), "Pending", "the init container keeps waiting");

    setup.create_secret().await;
    setup.apply("demo", "/mnt/ferry/demo").await;
    wait_for(&setup.cluster, "the training pod to succeed", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("trainer").await.ok()?;
            assert_ne!(phase(&pod), "Failed", "the trainer did not see its data: {:?}", pod.status);
            (phase(&pod) == "Succeeded").then_some(())
        }
    })
    .await;
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_elect_one_leader_and_the_other_takes_over_when_it_dies() {
    use k8s_openapi::api::coordination::v1::Lease;
    let mut setup = setup("leader").await;
    setup.create_secret().await;
    let (mut second, _) = start_operator(&setup.cluster, setup._logs.path(), "operator-2");
    let client = setup.cluster.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let holder = |leases: Api<Lease>| async move {
        leases.get_opt("ferry-operator-leader").await.ok().flatten()?.spec?.holder_identity
    };
    let first_leader = wait_for(&setup.cluster, "a leader", Duration::from_secs(30), || holder(leases.clone())).await;

    setup.apply("first", "/mnt/ferry/first").await;
    setup.wait_status("first", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let jobs = datastage_jobs(&client, "leader", "first", names::WORKER).await;
    assert_eq!(jobs.len(), 2, "one Job per node, not one per replica");

    // Kill the leader; the standby takes the expired Lease.
    if first_leader.starts_with("operator-1-") {
        setup.operator.stop(Duration::from_secs(1));
    } else {
        second.stop(Duration::from_secs(1));
    }
    let successor = wait_for(&setup.cluster, "a new leader", Duration::from_secs(30), || {
        let leases = leases.clone();
        let first_leader = first_leader.clone();
        async move { holder(leases).await.filter(|h| *h != first_leader) }
    })
    .await;
    assert_ne!(successor.split('-').take(2).collect::<Vec<_>>(), first_leader.split('-').take(2).collect::<Vec<_>>());
    setup.apply("second", "/mnt/ferry/second").await;
    setup.wait_status("second", "Succeeded under the new leader", |s| s.phase == Some(Phase::Succeeded)).await;
    drop(second);
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_moves_in_the_status_while_a_worker_runs() {
    let setup = setup("progress").await;
    setup.create_secret().await;
    let_workers_report(&setup.cluster, "progress").await;
    setup
        .apply_spec(
            "slow",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/slow"}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
                // About 4 seconds for this dataset: long enough to be seen moving.
                "transfer": {"maxBandwidth": "4MiB"},
            }),
        )
        .await;
    let midway = setup
        .wait_status("slow", "Running with partial progress", |s| {
            let percent: Option<u32> = s.progress.as_deref().and_then(|p| p.trim_end_matches('%').parse().ok());
            s.phase == Some(Phase::Running) && percent.is_some_and(|p| (1..100).contains(&p))
        })
        .await;
    let totals = midway.totals.clone().unwrap();
    assert!(totals.bytes_done > 0 && totals.bytes_done < totals.bytes_total, "{totals:?}");
    assert!(totals.throughput_bytes_per_second > 0, "{totals:?}");
    assert_eq!(midway.workers[0].node.as_deref(), Some("node-a"));
    setup.wait_status("slow", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    setup.cluster.stop().await;
}

/// Merges `labels` (a null value removes one) into node `name`'s labels.
async fn label_node(client: &kube::Client, name: &str, labels: serde_json::Value) {
    use k8s_openapi::api::core::v1::Node;
    Api::<Node>::all(client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": labels}})))
        .await
        .expect("label the node");
}

/// Names of the DataStage's worker Jobs that exist now.
async fn worker_jobs(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    let jobs = datastage_jobs(client, namespace, name, names::WORKER).await;
    jobs.into_iter().filter(|j| j.metadata.deletion_timestamp.is_none()).filter_map(|j| j.metadata.name).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_staging_stays_finished_after_its_jobs_expire_and_an_edit_starts_a_new_run() {
    let setup = setup("ttl").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    setup
        .apply_spec(
            "expiring",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/ttl"}},
                "ttlSecondsAfterFinished": 1,
            }),
        )
        .await;
    let done = setup.wait_status("expiring", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(done.run, Some(1));
    // The TTL controller deletes the finished Jobs; nothing may bring them back.
    wait_for(&setup.cluster, "the TTL controller to delete the Jobs", Duration::from_secs(60), || {
        let client = client.clone();
        async move { worker_jobs(&client, "ttl", "expiring").await.is_empty().then_some(()) }
    })
    .await;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(worker_jobs(&client, "ttl", "expiring").await.is_empty(), "a finished run's Jobs were created again");
        let status = setup.datastages.get("expiring").await.unwrap().status.unwrap();
        assert_eq!((status.phase, status.run), (Some(Phase::Succeeded), Some(1)), "the staging ran again");
    }

    // An edit that changes what a run does starts run 2, with the new selection.
    let patch = json!({"spec": {"include": ["train/00*"]}});
    setup.datastages.patch("expiring", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let second = setup
        .wait_status("expiring", "run 2 Succeeded", |s| s.run == Some(2) && s.phase == Some(Phase::Succeeded))
        .await;
    let generation = setup.datastages.get("expiring").await.unwrap().metadata.generation;
    assert_eq!(second.observed_generation, generation);
    assert_eq!(second.totals.unwrap().objects_done, 2 * 10, "train/000..009 on each node");
    // An edit that does not change a run moves observedGeneration only.
    let patch = json!({"spec": {"ttlSecondsAfterFinished": 30}});
    setup.datastages.patch("expiring", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let generation = setup.datastages.get("expiring").await.unwrap().metadata.generation;
    let third =
        setup.wait_status("expiring", "the new generation observed", |s| s.observed_generation == generation).await;
    assert_eq!((third.run, third.phase), (Some(2), Some(Phase::Succeeded)));
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn several_workers_per_node_fill_each_node_pinned_by_name_whatever_its_hostname_label() {
    let setup = setup("shards").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    // Some providers set kubernetes.io/hostname to something else than the node's name.
    label_node(&client, "node-b", json!({"kubernetes.io/hostname": "ip-10-0-0-7.internal"})).await;
    setup
        .apply_spec(
            "sharded",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/sharded"}},
                "workers": 2,
                "transfer": {"partSize": "8Mi", "memoryLimit": "64Mi"},
            }),
        )
        .await;
    let status = setup.wait_status("sharded", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(status.nodes.as_deref(), Some("2/2"));
    let bytes: usize = setup.files.values().map(Vec::len).sum();
    assert_eq!(status.totals.unwrap().bytes_done as usize, 2 * bytes, "both shards of both nodes counted");
    assert!(status.snapshot.is_some(), "both nodes hold one snapshot");
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node) {
            assert_eq!(read_tree(&dir.join("mnt/ferry/sharded")), setup.files, "{node} holds the whole dataset");
        }
    }
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_datastage_resyncs_only_what_changed_and_counts_it() {
    let setup = setup("sync").await;
    setup.create_secret().await;
    setup
        .apply_spec(
            "nightly",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/nightly"}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
                "schedule": "*/3 * * * * *",
                // Suspended while the bucket is changed: a sync every 3 s
                // would otherwise end between two changes, or run again
                // before the first one's status is read.
                "suspend": true,
            }),
        )
        .await;
    // A suspended schedule still stages once when created.
    let first = setup.wait_status("nightly", "the first sync", |s| s.phase == Some(Phase::Succeeded)).await;
    let first_run = first.run.unwrap();
    assert_eq!(first.next_sync_time, None, "suspended: no next sync {first:?}");
    let added = first.last_sync.clone().unwrap().added;
    assert_eq!(added.objects as usize, setup.files.len());

    // The bucket changes: one object new, one rewritten, one gone. Then the
    // schedule resumes and its next sync sees all three.
    setup.s3.put("datasets", "demo/train/new.bin", pattern(99, 1234)).await;
    setup.s3.put("datasets", "demo/train/001.bin", pattern(98, 777)).await;
    setup.s3.client().delete_object().bucket("datasets").key("demo/train/002.bin").send().await.unwrap();
    let resume = json!({"spec": {"suspend": false}});
    setup.datastages.patch("nightly", &PatchParams::default(), &Patch::Merge(&resume)).await.unwrap();
    setup.wait_status("nightly", "resumed", |s| s.next_sync_time.is_some()).await;
    let synced = setup
        .wait_status("nightly", "a sync that saw the change", |s| {
            s.phase == Some(Phase::Succeeded) && s.run.is_some_and(|run| run > first_run)
        })
        .await;
    let changes = synced.last_sync.clone().unwrap();
    assert_eq!(
        (changes.added.objects, changes.updated.objects, changes.removed.objects),
        (1, 1, 1),
        "only the changes moved: {changes:?}"
    );
    assert_eq!((changes.added.bytes, changes.updated.bytes), (1234, 777));
    assert!(synced.run.unwrap() > first_run);
    let mut expected = setup.files.clone();
    expected.insert("train/new.bin".into(), pattern(99, 1234));
    expected.insert("train/001.bin".into(), pattern(98, 777));
    expected.remove("train/002.bin");
    if let Some(dir) = setup.cluster.node_dir("node-a") {
        assert_eq!(read_tree(&dir.join("mnt/ferry/nightly")), expected, "the node mirrors the bucket");
    }
    // And a sync after that finds nothing to do.
    let quiet_run = synced.run.unwrap() + 1;
    let quiet = setup
        .wait_status("nightly", "a sync with nothing to change", |s| {
            s.run.unwrap_or(0) >= quiet_run && s.phase == Some(Phase::Succeeded)
        })
        .await;
    let changes = quiet.last_sync.unwrap();
    assert_eq!((changes.added.objects, changes.updated.objects, changes.removed.objects), (0, 0, 0));

    // Suspended: no more runs.
    let patch = json!({"spec": {"suspend": true}});
    setup.datastages.patch("nightly", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let suspended = setup
        .wait_status("nightly", "suspended", |s| s.next_sync_time.is_none() && s.phase == Some(Phase::Succeeded))
        .await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let later = setup.datastages.get("nightly").await.unwrap().status.unwrap();
    assert_eq!(later.run, suspended.run, "a suspended schedule starts no run");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_that_staged_different_versions_converge_on_one_snapshot() {
    let setup = setup("snapshot").await;
    setup.create_secret().await;
    let client = setup.cluster.client().await.unwrap();
    // node-b does not match at first: node-a lists the bucket alone.
    label_node(&client, "node-b", json!({"ferry.dev/pool": "later"})).await;
    label_node(&client, "node-a", json!({"ferry.dev/pool": "data"})).await;
    setup
        .apply_spec(
            "converge",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/converge"}},
                "placement": {"nodeSelector": {"ferry.dev/pool": "data"}},
            }),
        )
        .await;
    let alone = setup.wait_status("converge", "node-a done", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(alone.nodes.as_deref(), Some("1/1"));
    let old = alone.snapshot.clone().unwrap();

    // The bucket changes, then node-b starts matching: it lists the new version.
    setup.s3.put("datasets", "demo/train/003.bin", pattern(1003, 4321)).await;
    label_node(&client, "node-b", json!({"ferry.dev/pool": "data"})).await;
    let both = setup
        .wait_status("converge", "both nodes on one snapshot", |s| {
            s.phase == Some(Phase::Succeeded)
                && s.workers.len() == 2
                && s.snapshot.as_ref().is_some_and(|x| x.digest != old.digest)
        })
        .await;
    assert_eq!(both.nodes.as_deref(), Some("2/2"), "the new node is staged and counted");
    let digest = &both.snapshot.as_ref().unwrap().digest;
    assert!(both.workers.iter().all(|w| w.snapshot.as_ref() == Some(digest)), "{:?}", both.workers);
    let mut expected = setup.files.clone();
    expected.insert("train/003.bin".into(), pattern(1003, 4321));
    for node in ["node-a", "node-b"] {
        if let Some(dir) = setup.cluster.node_dir(node) {
            assert_eq!(read_tree(&dir.join("mnt/ferry/converge")), expected, "{node} holds the new version");
        }
    }
    let reasons: Vec<String> =
        event_reasons(&client, "snapshot", "converge").await.into_iter().map(|(_, r)| r).collect();
    assert!(reasons.iter().any(|r| r == "Resyncing"), "{reasons:?}");

    // A node that stops matching keeps its data and is reported.
    label_node(&client, "node-b", json!({"ferry.dev/pool": null})).await;
    let reported = setup
        .wait_status("converge", "node-b reported as departed", |s| {
            s.workers
                .iter()
                .any(|w| w.name == "node-b" && w.message.as_deref().is_some_and(|m| m.contains("no longer matches")))
        })
        .await;
    assert_eq!(reported.nodes.as_deref(), Some("1/1"));
    if let Some(dir) = setup.cluster.node_dir("node-b") {
        assert_eq!(read_tree(&dir.join("mnt/ferry/converge")), expected, "Retain keeps node-b's data");
    }
    setup.cluster.stop().await;
}

/// Fleet staging over a proxy that counts what MinIO sends: the demo
/// dataset as seen through it.
fn counted_store(proxy: &ferry_testkit::CorruptingProxy) -> serde_json::Value {
    json!({"uri": "s3://datasets/demo", "endpoint": proxy.endpoint, "credentials": {"name": "s3"}})
}

/// A counting proxy: the marker never occurs in the dataset.
fn egress_counter(setup: &Setup) -> ferry_testkit::CorruptingProxy {
    ferry_testkit::CorruptingProxy::start(&setup.s3.endpoint, b"\xfe\xed\xfa\xce-not-in-the-data")
}

#[tokio::test(flavor = "multi_thread")]
async fn two_nodes_read_the_dataset_from_the_store_about_once_and_only_their_peers_may_read_them() {
    let setup = setup("fleet").await;
    setup.create_secret().await;
    let_workers_report(&setup.cluster, "fleet").await;
    let proxy = egress_counter(&setup);
    let sent_before = setup.s3.bytes_sent().await;
    setup
        .apply_spec(
            "fleet",
            json!({
                "source": counted_store(&proxy),
                "destination": {"volume": {"hostPath": "/mnt/ferry/fleet"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                // Slow enough that the peer port can be tried while it serves.
                "transfer": {"maxBandwidth": "1MiB"},
            }),
        )
        .await;
    // A worker's peer port speaks only mutual TLS with certificates of the
    // DataStage's CA, which the operator issued into the peer Secret.
    let serving =
        setup.wait_status("fleet", "serving peers", |s| s.workers.iter().any(|w| w.peer_address.is_some())).await;
    let address = serving.workers.iter().find_map(|w| w.peer_address.clone()).unwrap();
    let kube_client = setup.cluster.client().await.unwrap();
    let peer_secrets: Api<Secret> = Api::namespaced(kube_client, ferry_e2e::WORKERS_NS);
    let selector = format!("{}=fleet,{}=peers", names::DATASTAGE, names::HOLDS);
    let listed = peer_secrets.list(&kube::api::ListParams::default().labels(&selector)).await.unwrap().items;
    assert_eq!(listed.len(), 1, "one peer Secret, in the workers' namespace, where no tenant reads it");
    let peer_secret = listed[0].data.clone().unwrap();
    let text = |key: &str| String::from_utf8(peer_secret[key].0.clone()).unwrap();
    use ferry_contract::peers::{PEER_TOKEN_KEY, tls, wire};
    let state = |scheme: &str, client: &reqwest::Client| {
        client
            .get(format!("{scheme}://{address}{}", wire::STATE_PATH))
            .bearer_auth(text(PEER_TOKEN_KEY))
            .header(wire::SPEAKER_HEADER, wire::Speaker::new("e2e-test", None).to_string())
    };
    let client = |identity: Option<(String, String)>, ca: Option<&str>| {
        let mut builder = reqwest::Client::builder().no_proxy();
        builder = match ca {
            // The name is the peer name, not the address dialled.
            Some(ca) => builder
                .tls_certs_only([reqwest::Certificate::from_pem(ca.as_bytes()).unwrap()])
                .tls_danger_accept_invalid_hostnames(true),
            None => builder.tls_danger_accept_invalid_certs(true),
        };
        if let Some((cert, key)) = identity {
            builder = builder.identity(reqwest::Identity::from_pem(format!("{cert}{key}").as_bytes()).unwrap());
        }
        builder.build().unwrap()
    };
    // Plain HTTP gets no HTTP answer: what crosses the wire is TLS.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(state("http", &plain).send().await.is_err(), "the peer port answered plain HTTP");
    // Without a certificate, or with another DataStage's (another CA's),
    // even with the token: refused at the handshake.
    let other_datastage = ferry_testkit::PeerCa::new().issue(tls::SERVER_NAME);
    for (identity, who) in [(None, "no certificate"), (Some(other_datastage), "another DataStage's certificate")] {
        let sent = state("https", &client(identity, None)).send().await;
        assert!(sent.is_err(), "a client with {who} was answered: {sent:?}");
    }
    // With the DataStage's own certificate it is answered, and it proves
    // itself with the same CA; the token is still required.
    let member = client(Some((text(tls::CERT_FILE), text(tls::KEY_FILE))), Some(&text(tls::CA_FILE)));
    assert_eq!(state("https", &member).send().await.unwrap().status(), 200, "a worker's own certificate");
    let url = format!("https://{address}{}", wire::STATE_PATH);
    assert_eq!(member.get(&url).send().await.unwrap().status(), 401, "the certificate without the token");
    // So is a pod in another namespace: it succeeds only when its TLS
    // handshake is refused (curl's 35 or 56), not on a closed port (7), a
    // timeout (28) or any HTTP answer.
    create_namespace(&setup.cluster, "outsider", &[]).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(setup.cluster.client().await.unwrap(), "outsider");
    let probe = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "probe", "image": ferry_e2e::image("ferry-e2e-shell"),
            // `$$` is `$` after Kubernetes' own `$(VAR)` expansion.
            "command": ["sh", "-c", "curl -sk -o /dev/null \"$URL\"; rc=$$?; echo \"curl exited $$rc\"; test $$rc = 35 || test $$rc = 56"],
            "env": [{"name": "URL", "value": url}],
        }]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &probe).await.unwrap();
    let phase = wait_for(&setup.cluster, "the probe pod to finish", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let phase = pods.get("probe").await.ok()?.status?.phase?;
            ["Succeeded", "Failed"].contains(&phase.as_str()).then_some(phase)
        }
    })
    .await;
    assert_eq!(
        phase,
        "Succeeded",
        "a pod outside the DataStage was not refused at the TLS handshake\n{}",
        setup.cluster.diagnostics()
    );

    let status = setup.wait_status("fleet", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let bytes: u64 = setup.files.values().map(|f| f.len() as u64).sum();
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/fleet")), setup.files, "node-a's copy is byte-identical");
        assert_eq!(read_tree(&b.join("mnt/ferry/fleet")), setup.files, "node-b's copy is byte-identical");
    }
    // MinIO sent the dataset about once (plus listings and headers), not twice.
    let sent = proxy.bytes_sent();
    assert!(sent < bytes + bytes / 20 + (256 << 10), "MinIO sent {sent} bytes for a {bytes}-byte dataset on two nodes");
    // And so does MinIO's own count, once it has caught up (it updates it
    // every few seconds).
    if setup.s3.flavor == ferry_testkit::Flavor::Minio {
        let before = sent_before.expect("MinIO serves its metrics");
        let mut sent_by_minio = 0;
        for _ in 0..60 {
            sent_by_minio = setup.s3.bytes_sent().await.unwrap_or(0).saturating_sub(before);
            if sent_by_minio >= bytes {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(
            (bytes..bytes + bytes / 20 + (256 << 10)).contains(&sent_by_minio),
            "MinIO's own metrics: it sent {sent_by_minio} bytes for a {bytes}-byte dataset on two nodes"
        );
    }
    // The workers say the same.
    let totals = status.totals.unwrap();
    let (from_store, from_peers) = (totals.bytes_from_store.unwrap_or(0), totals.bytes_from_peers.unwrap_or(0));
    assert!(from_peers > 0 && from_store + from_peers == 2 * bytes as i64, "{from_store} + {from_peers}");
    assert!(from_store <= bytes as i64 + bytes as i64 / 20, "{from_store} bytes from the store");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_labelled_into_a_running_datastage_is_fed_by_its_peer_and_the_store_is_read_once() {
    let setup = setup("fleetjoin").await;
    setup.create_secret().await;
    let_workers_report(&setup.cluster, "fleetjoin").await;
    let client = setup.cluster.client().await.unwrap();
    label_node(&client, "node-a", json!({"ferry.dev/pool": "join"})).await;
    let proxy = egress_counter(&setup);
    setup
        .apply_spec(
            "join",
            json!({
                "source": counted_store(&proxy),
                "destination": {"volume": {"hostPath": "/mnt/ferry/join"}},
                "placement": {"nodeSelector": {"ferry.dev/pool": "join"}},
                // node-a is still copying when node-b joins: about 55 s for
                // the 14 MB dataset, while node-b starts in a few. (Had
                // node-a exited first, node-b would read the store.)
                "transfer": {"maxBandwidth": "256KiB"},
            }),
        )
        .await;
    let copying = setup
        .wait_status("join", "node-a copying and serving", |s| {
            s.workers.iter().any(|w| w.name == "node-a" && w.peer_address.is_some() && w.bytes_done > 0)
        })
        .await;
    label_node(&client, "node-b", json!({"ferry.dev/pool": "join"})).await;
    let status = setup
        .wait_status("join", "both nodes staged", |s| s.phase == Some(Phase::Succeeded) && s.workers.len() == 2)
        .await;
    assert_eq!(status.run, copying.run, "node-b joined the run node-a was in: {status:?}");
    // node-b's Job names node-a as the one that reads from the store.
    let args: Vec<Vec<String>> = datastage_jobs(&client, "fleetjoin", "join", names::WORKER)
        .await
        .into_iter()
        .filter_map(|job| job.spec?.template.spec?.containers.into_iter().next()?.args)
        .collect();
    assert!(args.iter().any(|a| a.contains(&"--peer-owners=node-a".to_owned())), "{args:?}");
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/join")), setup.files, "node-a's copy is byte-identical");
        assert_eq!(read_tree(&b.join("mnt/ferry/join")), setup.files, "node-b's copy is byte-identical");
    }
    let bytes: u64 = setup.files.values().map(|f| f.len() as u64).sum();
    let sent = proxy.bytes_sent();
    assert!(sent <= bytes + bytes / 20 + (256 << 10), "the store sent {sent} bytes for a {bytes}-byte dataset");
    // node-b had from node-a all that it did not take over. It takes over
    // objects node-a has not started (read from the store by node-b, and
    // by node-a from node-b), and this dataset's 31 objects are all in
    // flight at node-a at once, so there is none to take: the engine's
    // fleet tests cover taking over.
    let joined = status.workers.iter().find(|w| w.name == "node-b").unwrap();
    let (from_store, from_peers) = (joined.bytes_from_store.unwrap_or(0), joined.bytes_from_peers.unwrap_or(0));
    assert!(from_peers > 0 && from_store + from_peers == bytes as i64, "node-b: {joined:?}");
    let owner = status.workers.iter().find(|w| w.name == "node-a").unwrap();
    assert_eq!(owner.bytes_from_peers.unwrap_or(0), from_store, "node-a had from node-b what it took over: {owner:?}");
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_transfer_neither_stops_its_peer_nor_loses_its_own_copy() {
    let setup = setup("fleetkill").await;
    setup.create_secret().await;
    let_workers_report(&setup.cluster, "fleetkill").await;
    setup
        .apply_spec(
            "killed",
            json!({
                "source": setup.store("s3://datasets/demo"),
                "destination": {"volume": {"hostPath": "/mnt/ferry/killed"}},
                "placement": {"nodeSelector": {"kubernetes.io/os": "linux"}},
                "transfer": {"maxBandwidth": "2MiB"},
            }),
        )
        .await;
    setup
        .wait_status("killed", "copying on node-b", |s| {
            s.workers.iter().any(|w| w.name == "node-b" && w.bytes_done > 0)
        })
        .await;
    let victim = std::process::Command::new("pgrep")
        .args(["-f", "--", "report-to=fleetkill/killed --worker=node-b"])
        .output()
        .unwrap();
    let pids = String::from_utf8_lossy(&victim.stdout).split_whitespace().map(str::to_owned).collect::<Vec<_>>();
    assert!(!pids.is_empty(), "node-b's stager is running");
    for pid in &pids {
        std::process::Command::new("kill").args(["-KILL", pid]).status().unwrap();
    }
    let status = setup.wait_status("killed", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    if let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) {
        assert_eq!(read_tree(&a.join("mnt/ferry/killed")), setup.files, "node-a finished without its peer");
        assert_eq!(read_tree(&b.join("mnt/ferry/killed")), setup.files, "node-b's next pod finished the copy");
    }
    assert_eq!(status.nodes.as_deref(), Some("2/2"));
    setup.cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_whose_copy_rotted_cannot_corrupt_the_other_node() {
    let setup = setup("fleetrot").await;
    setup.create_secret().await;
    let_workers_report(&setup.cluster, "fleetrot").await;
    let spec = |placement: serde_json::Value| {
        json!({
            "source": setup.store("s3://datasets/demo"),
            "destination": {"volume": {"hostPath": "/mnt/ferry/rot"}},
            "placement": placement,
        })
    };
    setup.apply_spec("seed", spec(json!({"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}))).await;
    setup.wait_status("seed", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    let (Some(a), Some(b)) = (setup.cluster.node_dir("node-a"), setup.cluster.node_dir("node-b")) else {
        // Nodes on a real cluster: their disks are not this machine's to rot.
        setup.cluster.stop().await;
        return;
    };
    // A byte of a file node-a will serve rots on its disk; size and time
    // stay, so node-a still believes it holds the object.
    let group = ferry_contract::PeerGroup::new(["node-a", "node-b"]);
    let (rel, _) = setup.files.iter().find(|(rel, _)| group.owner(rel) == Some("node-a")).expect("node-a owns a key");
    let path = a.join("mnt/ferry/rot").join(rel);
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();
    std::fs::File::options().write(true).open(&path).unwrap().set_modified(mtime).unwrap();

    setup.apply_spec("fleet", spec(json!({"nodeSelector": {"kubernetes.io/os": "linux"}}))).await;
    let status = setup.wait_status("fleet", "Succeeded", |s| s.phase == Some(Phase::Succeeded)).await;
    assert_eq!(read_tree(&b.join("mnt/ferry/rot")), setup.files, "node-b has the store's bytes");
    let node_b = status.workers.iter().find(|w| w.name == "node-b").unwrap();
    assert!(node_b.peer_failures.unwrap_or(0) >= 1, "node-b dropped the peer that served rotten bytes: {node_b:?}");
    setup.cluster.stop().await;
}
