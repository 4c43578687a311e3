//! Ferry in real containers on real nodes: two kubelets with containerd
//! and runc ([`ferry_e2e::real_node`]) run the images `hack/images.sh`
//! built, with their user ids, read-only roots, dropped capabilities,
//! hostPath volumes, projected service-account tokens and pod networks.
//!
//! One cluster serves every step (starting one is the slow part), each step
//! with its own DataStage and directories:
//!
//! Everything a tenant does happens in namespace `ml`, which enforces Pod
//! Security's `restricted` level: no pod there mounts a hostPath or runs as
//! root. Ferry's workers run in the chart's workers' namespace, and pods
//! read node-local data through the claim Ferry binds.
//!
//! 1. `helm install` with the chart's default images: the operator runs as
//!    its Deployment's pod and the webhook answers the API server.
//! 2. A pull onto the NodeCache `local` (`/mnt/ferry`), landing at
//!    `/mnt/ferry/ml/data`: not there on node-a, and on node-b owned by
//!    another user with their files in it. Both nodes end byte-identical
//!    to the bucket, fed peer to peer between the two pod networks; a
//!    re-run copies nothing. A second DataStage of the same objects links
//!    them from the namespace's shared objects. A versioned DataStage
//!    whose source is edited under a pod reading it in a loop: the pod
//!    reads only its version, a pod started after the switch the new one,
//!    a change back copies nothing, and a version leaves the node once no
//!    pod that started with it runs.
//! 3. A training Job wired by the label, running as a user of its own,
//!    reads every staged file through the claim; a pod using the
//!    init-container form (`ferry-stager wait` with its projected token,
//!    the claim in its volumes) does too.
//! 4. A push of a checkpoint a training pod wrote into a claim of its own.
//! 5. A pull from a store behind HTTPS with a private CA, named by
//!    `caBundle` (copied beside the workers); without it a clear failure;
//!    a missing ConfigMap waits.
//! 6. A pull with no keys anywhere (`credentials.webIdentity`): tokens of
//!    the namespace's account, requested by the operator and exchanged at a
//!    store that trusts the cluster's issuer; a token for an audience the
//!    admin did not allow is refused at admission.
//! 7. A gated model from the Hugging Face Hub, its token from a Secret,
//!    onto both nodes peer to peer.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use ferry_contract::layout::{CURRENT_LINK, SHARED_OBJECTS_DIR, VERSION_TREES, VERSIONS_DIR};
use ferry_crds::{DataStage, Phase};
use ferry_e2e::real_node::{self, ferry_image, test_image};
use ferry_e2e::tools::Tools;
use ferry_e2e::{Cluster, create_namespace, job_succeeded, object_store, store_trusting_issuer, wait_for};
use ferry_testkit::{pattern, read_tree, repo_root};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const SYSTEM_NS: &str = "ferry-system";
const DATA_NS: &str = "ml";
/// Where the chart's NodeCache lays out namespace `ml` on every node.
const CACHE_DIR: &str = "mnt/ferry/ml";
/// Pod Security's `restricted` level, enforced on every namespace but the
/// workers'.
const RESTRICTED: [(&str, &str); 2] =
    [("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")];
/// The training job's user: neither root nor the worker's.
const TRAINER_UID: i64 = 1000;

#[tokio::test(flavor = "multi_thread")]
async fn ferry_runs_in_real_containers_on_real_nodes() {
    if let Err(why) = real_node::supported() {
        panic!("{why}: run the e2e tests as root under hack/netns.sh (hack/test.sh does)");
    }
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    s3.create_bucket("checkpoints").await;
    let dataset = sample_dataset();
    for (key, body) in &dataset {
        s3.put("datasets", &format!("real/{key}"), body.clone()).await;
    }

    let mut cluster = Cluster::start_with_real_nodes().await.unwrap_or_else(|e| panic!("real nodes: {e}"));
    let endpoint = endpoint_for_pods(&mut cluster, &s3.endpoint).await;
    let client = cluster.client().await.unwrap();

    // 1. The chart, as a user installs it, with the images built here.
    let tools = Tools::new(cluster.kubeconfig());
    create_namespace(&cluster, SYSTEM_NS, &RESTRICTED).await;
    // The tenant's namespace: restricted too (the chart makes the workers'
    // namespace, privileged, for itself).
    create_namespace(&cluster, DATA_NS, &RESTRICTED).await;
    let chart = repo_root().join("charts/ferry");
    tools
        .helm(&[
            "install",
            "ferry",
            chart.to_str().unwrap(),
            "--namespace",
            SYSTEM_NS,
            "--wait",
            "--timeout",
            "3m",
            "--set",
            "dataStageNamespaces={ml}",
            "--set",
            "nodeCaches[0].name=local",
            "--set",
            "nodeCaches[0].root=/mnt/ferry",
            "--set",
            "webIdentity.audiences={ferry-e2e-store}",
            "--set",
            "webIdentity.allowHttpSts=true",
        ])
        .unwrap_or_else(|e| panic!("helm install:\n{e}\n{}", cluster.diagnostics()));
    let operator = running_pod(&cluster, &client, SYSTEM_NS, "app.kubernetes.io/name=ferry-operator").await;
    let container = &operator.spec.as_ref().unwrap().containers[0];
    assert_eq!(container.image.as_deref(), Some(ferry_image("ferry-operator").as_str()), "the chart's default image");
    assert!(operator.spec.as_ref().unwrap().node_name.as_deref().is_some_and(|n| n.starts_with("node-")));
    let secret: Secret =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}}))
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), DATA_NS).create(&PostParams::default(), &secret).await.unwrap();

    // 2. A pull onto both nodes: nothing there on node-a; on node-b a
    //    directory holding another user's files.
    let b_dir = cluster.node_dir("node-b").unwrap().join(CACHE_DIR).join("data");
    std::fs::create_dir_all(b_dir.join("images")).unwrap();
    std::fs::write(b_dir.join("notes-of-another-user.txt"), b"not Ferry's").unwrap();
    std::fs::write(b_dir.join("images/000.jpg"), b"a stale copy another user left").unwrap();
    for (path, mode) in [("images", 0o700), ("images/000.jpg", 0o600), ("notes-of-another-user.txt", 0o600)] {
        let path = b_dir.join(path);
        rustix::fs::chown(&path, Some(uid(TRAINER_UID)), Some(gid(TRAINER_UID))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    assert!(!cluster.node_dir("node-a").unwrap().join(CACHE_DIR).join("data").exists());
    let stages: Api<DataStage> = Api::namespaced(client.clone(), DATA_NS);
    let spec = json!({
        "source": {"uri": "s3://datasets/real", "endpoint": endpoint, "credentials": {"name": "s3"}},
        "destination": {"volume": {"nodeCache": "local"}},
        "fanout": "PeerToPeer",
        "transfer": {"partSize": "5MiB", "concurrency": 4},
    });
    stages.create(&PostParams::default(), &datastage("data", spec)).await.unwrap();
    let status = finished(&cluster, &stages, "data", 1).await;
    let totals = status.totals.clone().unwrap();
    assert_eq!(totals.objects_done as usize, 2 * dataset.len(), "every object on both nodes: {status:?}");
    assert!(totals.bytes_from_peers.unwrap_or(0) > 0, "the nodes fed each other between pod networks: {totals:?}");
    assert_eq!(status.claim_name.as_deref(), Some("ferry-data"), "pods read it through this claim");
    for node in ["node-a", "node-b"] {
        let dir = cluster.node_dir(node).unwrap().join(CACHE_DIR).join("data");
        let staged = read_tree(&dir);
        for (key, body) in &dataset {
            assert!(staged.get(key) == Some(body), "{node}: {key} differs from the bucket");
        }
        // What the worker wrote is its user's, readable by every user.
        let meta = std::fs::metadata(dir.join("weights/model.bin")).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (65532, 0o644), "{node}");
        assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 65532, "{node}: the directory was handed to the worker");
    }
    assert_eq!(std::fs::read(b_dir.join("notes-of-another-user.txt")).unwrap(), b"not Ferry's", "nothing is lost");

    // A re-run (a new run input) copies nothing.
    stages
        .patch("data", &PatchParams::default(), &Patch::Merge(json!({"spec": {"transfer": {"concurrency": 8}}})))
        .await
        .unwrap();
    let rerun = finished(&cluster, &stages, "data", 2).await;
    let changes = rerun.last_sync.clone().unwrap();
    assert_eq!((changes.added.objects, changes.updated.objects), (0, 0), "{rerun:?}");
    assert_eq!(rerun.totals.unwrap().bytes_from_store.unwrap_or(0), 0, "nothing read from the store again");

    // 2b. A second DataStage of the same objects on node-a links the
    //     first one's files through the namespace's shared objects: one
    //     copy on the disk, nothing read from the store, every file the
    //     worker's.
    let again = json!({
        "source": {"uri": "s3://datasets/real", "endpoint": endpoint, "credentials": {"name": "s3"}},
        "destination": {"volume": {"nodeCache": "local"}},
        "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
    });
    stages.create(&PostParams::default(), &datastage("again", again)).await.unwrap();
    let linked = finished(&cluster, &stages, "again", 1).await;
    assert_eq!(linked.totals.clone().unwrap().bytes_from_store.unwrap_or(0), 0, "all linked: {linked:?}");
    let node_a = cluster.node_dir("node-a").unwrap().join(CACHE_DIR);
    assert!(read_tree(&node_a.join("again")) == read_tree(&node_a.join("data")), "the same files");
    let (one, two) = (
        std::fs::metadata(node_a.join("data/weights/model.bin")).unwrap(),
        std::fs::metadata(node_a.join("again/weights/model.bin")).unwrap(),
    );
    assert_eq!(one.ino(), two.ino(), "one file in two directories");
    let shared = std::fs::metadata(node_a.join(SHARED_OBJECTS_DIR).join("objects")).unwrap();
    assert_eq!((shared.uid(), shared.mode() & 0o777), (65532, 0o755), "the shared objects are the worker's");

    // 2c. Versions (`updateStrategy: Versioned`): a source edited while a
    //     pod reads the data in a loop. The pod reads only the version it
    //     started with; a pod started after the switch reads the new one;
    //     a change back to a version still on the node copies nothing; a
    //     version leaves the node once no pod that started with it runs.
    let versions = [("v1", "one", pattern(81, (3 << 20) + 5)), ("v2", "two", pattern(82, (3 << 20) + 5))];
    for (prefix, marker, weights) in &versions {
        s3.put("datasets", &format!("model/{prefix}/version"), format!("{marker}\n").into_bytes()).await;
        s3.put("datasets", &format!("model/{prefix}/weights.bin"), weights.clone()).await;
        s3.put("datasets", &format!("model/{prefix}/config.json"), b"{}".to_vec()).await;
    }
    let sha = |data: &[u8]| {
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), data).unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8(out.stdout).unwrap().split_whitespace().next().unwrap().to_owned()
    };
    let (v1_sha, v2_sha) = (sha(&versions[0].2), sha(&versions[1].2));
    let source = |prefix: &str| json!({"uri": format!("s3://datasets/model/{prefix}"), "endpoint": endpoint, "credentials": {"name": "s3"}});
    let model = json!({
        "source": source("v1"),
        "destination": {"volume": {"nodeCache": "local"}},
        "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
        "updateStrategy": "Versioned",
    });
    stages.create(&PostParams::default(), &datastage("model", model)).await.unwrap();
    let first = finished(&cluster, &stages, "model", 1).await;
    let d1 = first.versions.clone().and_then(|v| v.current).expect("a current version");
    assert_eq!(Some(&d1), first.snapshot.as_ref().map(|s| &s.digest));
    let model_dir = node_a.join("model");
    let tree = |digest: &str| model_dir.join(VERSIONS_DIR).join(VERSION_TREES).join(digest);
    assert_eq!(
        std::fs::read_link(model_dir.join(CURRENT_LINK)).unwrap(),
        Path::new(VERSIONS_DIR).join(VERSION_TREES).join(&d1)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), DATA_NS);
    // Reads until deleted: the restricted level admits no hostPath to
    // signal it through.
    let reader = "while true; do cat /data/version; /bin/busybox sha256sum /data/weights.bin; sleep 0.2; done";
    pods.create(&PostParams::default(), &wired_pod("reader", reader)).await.unwrap();
    wait_for(&cluster, "the reader to read the first version", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move { pods.logs("reader", &Default::default()).await.ok().filter(|log| log.contains("one")) }
    })
    .await;
    let edit = |prefix: &str| Patch::Merge(json!({"spec": {"source": source(prefix)}}));
    let switched_to = |status: &ferry_crds::DataStageStatus| {
        let versions = status.versions.clone().unwrap_or_default();
        (versions.current.unwrap_or_default(), versions.previous.unwrap_or_default(), versions.previous_kept)
    };

    stages.patch("model", &PatchParams::default(), &edit("v2")).await.unwrap();
    let second = finished(&cluster, &stages, "model", 2).await;
    let d2 = second.snapshot.clone().unwrap().digest;
    assert_eq!(switched_to(&second), (d2.clone(), d1.clone(), Some(true)), "v1 stays: the reader uses it");
    assert!(tree(&d1).is_dir() && tree(&d2).is_dir());
    pods.create(
        &PostParams::default(),
        &wired_pod("after-switch", "cat /data/version; /bin/busybox sha256sum /data/weights.bin"),
    )
    .await
    .unwrap();
    let after = pod_log_once_done(&cluster, &pods, "after-switch").await;
    assert_eq!(after.lines().collect::<Vec<_>>(), ["two", &format!("{v2_sha}  /data/weights.bin")], "{after}");

    // Back to v1 while the reader keeps it: switched without copying.
    stages.patch("model", &PatchParams::default(), &edit("v1")).await.unwrap();
    let third = finished(&cluster, &stages, "model", 3).await;
    assert_eq!(third.totals.clone().unwrap().bytes_from_store.unwrap_or(0), 0, "nothing read: {third:?}");
    assert_eq!(switched_to(&third), (d1.clone(), d2.clone(), Some(true)));
    // No pod started with v2 runs any more: it leaves the node.
    let stage_status = |name: &'static str| {
        let stages = stages.clone();
        async move { stages.get(name).await.ok()?.status }
    };
    wait_for(&cluster, "v2 to be removed", Duration::from_secs(120), || async {
        stage_status("model").await.filter(|s| switched_to(s).2 == Some(false))
    })
    .await;
    assert!(!tree(&d2).exists() && tree(&d1).is_dir());

    // Forward to v2 again; v1 stays while the reader runs, and goes after.
    stages.patch("model", &PatchParams::default(), &edit("v2")).await.unwrap();
    let fourth = finished(&cluster, &stages, "model", 4).await;
    assert_eq!(switched_to(&fourth), (d2.clone(), d1.clone(), Some(true)));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(tree(&d1).is_dir(), "v1 is kept while the reader runs");
    let read = pods.logs("reader", &Default::default()).await.unwrap();
    pods.delete("reader", &kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
    let lines: Vec<&str> = read.lines().collect();
    assert!(lines.len() > 20, "the reader read through four switches: {read}");
    let v1_line = format!("{v1_sha}  /data/weights.bin");
    assert!(lines.iter().all(|line| *line == "one" || *line == v1_line), "the reader saw another version:\n{read}");
    wait_for(&cluster, "v1 to be removed once its reader ended", Duration::from_secs(120), || async {
        stage_status("model").await.filter(|s| switched_to(s).2 == Some(false))
    })
    .await;
    assert!(!tree(&d1).exists() && tree(&d2).is_dir());
    assert_eq!(read_tree(&model_dir.join(CURRENT_LINK)).get("version").map(Vec::as_slice), Some(&b"two\n"[..]));

    // A node that joins gets the current version; only it switches.
    let everywhere = Patch::Merge(json!({"spec": {"placement": null}}));
    stages.patch("model", &PatchParams::default(), &everywhere).await.unwrap();
    let fifth = finished(&cluster, &stages, "model", 5).await;
    assert_eq!(switched_to(&fifth), (d2.clone(), d1.clone(), Some(false)), "no new version: {fifth:?}");
    let on_b = cluster.node_dir("node-b").unwrap().join(CACHE_DIR).join("model");
    assert_eq!(
        std::fs::read_link(on_b.join(CURRENT_LINK)).unwrap(),
        Path::new(VERSIONS_DIR).join(VERSION_TREES).join(&d2)
    );
    assert_eq!(read_tree(&on_b.join(CURRENT_LINK)), read_tree(&model_dir.join(CURRENT_LINK)));
    assert!(fifth.workers.iter().all(|w| w.current_version.as_deref() == Some(d2.as_str())), "{fifth:?}");

    // 3. Training pods read what was staged, as a user of their own.
    let expected = checksums(&cluster.node_dir("node-a").unwrap().join(CACHE_DIR).join("data"), &dataset);
    let jobs: Api<Job> = Api::namespaced(client.clone(), DATA_NS);
    let trainer = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"ferry.dev/datastage": "data"}},
            "spec": training_pod(&expected, None)}}});
    jobs.create(&PostParams::default(), &serde_json::from_value(trainer).unwrap()).await.unwrap();
    job_succeeded(&cluster, &client, DATA_NS, "train").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), DATA_NS);
    let waiting = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits"},
        "spec": training_pod(&expected, Some("node-b"))});
    pods.create(&PostParams::default(), &serde_json::from_value(waiting).unwrap()).await.unwrap();
    wait_for(&cluster, "the pod with the wait init container to succeed", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let phase = pods.get("waits").await.ok()?.status?.phase?;
            assert_ne!(phase, "Failed", "the pod that waits in its init container failed");
            (phase == "Succeeded").then_some(())
        }
    })
    .await;

    // 3b. What the claim costs a pod's start, against the hostPath it
    //     replaces (docs/design/tenancy.md): measured, not asserted.
    let (host_path_ms, claim_ms) = pod_start_medians(&cluster, &client).await;
    println!(
        "pod create to Succeeded on node-a, median of {POD_START_SAMPLES} each: hostPath {host_path_ms} ms, Ferry's claim {claim_ms} ms"
    );

    // 4. A checkpoint a training pod (user 1000) writes into a claim of
    //    its own (a local volume the admin made on node-a), pushed by a
    //    DataStage of the claim: its workers run in the namespace, as
    //    restricted as the trainer.
    let ckpt = cluster.node_dir("node-a").unwrap().join("mnt/ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    rustix::fs::chown(&ckpt, Some(uid(TRAINER_UID)), Some(gid(TRAINER_UID))).unwrap();
    create_local_claim(&client, DATA_NS, "ckpt", "/mnt/ckpt", "node-a").await;
    let model_size = (6 << 20) + 3;
    let writer = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "save"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": true, "runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "train", "image": test_image("shell"),
                "command": ["/bin/busybox", "sh", "-c",
                    format!("mkdir -p /ckpt/step-1 && /bin/busybox yes ferry | /bin/busybox head -c {model_size} > /ckpt/step-1/model.bin && echo '{{}}' > /ckpt/step-1/meta.json")],
                "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true}}],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]}}}});
    let jobs: Api<Job> = Api::namespaced(client.clone(), DATA_NS);
    jobs.create(&PostParams::default(), &serde_json::from_value(writer).unwrap()).await.unwrap();
    job_succeeded(&cluster, &client, DATA_NS, "save").await;
    let checkpoint: BTreeMap<String, Vec<u8>> = objects([
        ("step-1/model.bin", b"ferry\n".iter().copied().cycle().take(model_size).collect()),
        ("step-1/meta.json", b"{}\n".to_vec()),
    ]);
    assert!(read_tree(&ckpt) == checkpoint, "the trainer wrote its checkpoint");
    let push = json!({
        "source": {"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
        "destination": {"uri": "s3://checkpoints/run-1", "endpoint": endpoint, "credentials": {"name": "s3"}},
    });
    stages.create(&PostParams::default(), &datastage("ckpt", push)).await.unwrap();
    finished(&cluster, &stages, "ckpt", 1).await;
    for (key, body) in &checkpoint {
        assert!(s3.get("checkpoints", &format!("run-1/{key}")).await == *body, "{key} pushed whole");
    }
    let meta = std::fs::metadata(ckpt.join("step-1/model.bin")).unwrap();
    assert_eq!(meta.uid(), TRAINER_UID as u32, "a push leaves the files' owner as it was");

    // 5. A store behind HTTPS with a private CA: named by caBundle, the
    //    workers trust it; without it they fail, saying how to fix it; a
    //    ConfigMap that does not exist keeps the DataStage waiting.
    let tls = ferry_testkit::S3Server::minio_tls_also_for(&[real_node::HOST_ADDRESS.into()]);
    tls.create_bucket("private").await;
    let secured: BTreeMap<String, Vec<u8>> =
        objects([("a.bin", pattern(91, 3 << 20)), ("b/c.txt", b"behind a private CA".to_vec())]);
    for (key, body) in &secured {
        tls.put("private", &format!("set/{key}"), body.clone()).await;
    }
    let tls_endpoint = endpoint_for_pods(&mut cluster, &tls.endpoint).await;
    let ca_pem = std::fs::read_to_string(tls.ca_file.as_ref().unwrap()).unwrap();
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "store-ca"},
        "data": {"root.pem": ca_pem}});
    Api::<ConfigMap>::namespaced(client.clone(), DATA_NS)
        .create(&PostParams::default(), &serde_json::from_value(config_map).unwrap())
        .await
        .unwrap();
    let tls_secret: Secret =
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls-s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": tls.access_key, "AWS_SECRET_ACCESS_KEY": tls.secret_key}}))
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), DATA_NS).create(&PostParams::default(), &tls_secret).await.unwrap();
    // Each lands at /mnt/ferry/ml/NAME on node-b.
    let private_pull = |ca_bundle: Option<Value>| {
        let mut source =
            json!({"uri": "s3://private/set", "endpoint": tls_endpoint, "credentials": {"name": "tls-s3"}});
        if let Some(reference) = ca_bundle {
            source["caBundle"] = reference;
        }
        json!({"source": source, "destination": {"volume": {"nodeCache": "local"}},
               "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-b"}}})
    };
    let trusted = private_pull(Some(json!({"name": "store-ca", "key": "root.pem"})));
    stages.create(&PostParams::default(), &datastage("private", trusted)).await.unwrap();
    let untrusted = private_pull(None);
    stages.create(&PostParams::default(), &datastage("untrusted", untrusted)).await.unwrap();
    let unnamed = private_pull(Some(json!({"name": "no-such-ca"})));
    stages.create(&PostParams::default(), &datastage("unnamed", unnamed)).await.unwrap();
    finished(&cluster, &stages, "private", 1).await;
    let staged = read_tree(&cluster.node_dir("node-b").unwrap().join(CACHE_DIR).join("private"));
    for (key, body) in &secured {
        assert!(staged.get(key) == Some(body), "{key} differs from the HTTPS bucket");
    }
    let condition = |name: &'static str, found: fn(&Condition) -> bool| {
        let stages = stages.clone();
        async move { stages.get(name).await.ok()?.status?.conditions.into_iter().find(found) }
    };
    let refused = wait_for(&cluster, "the untrusted pull to fail", Duration::from_secs(180), || {
        condition("untrusted", |c| c.type_ == "Failed" && c.status == "True")
    })
    .await;
    assert!(
        refused.message.contains("UnknownIssuer") && refused.message.contains("caBundle"),
        "the failure names the cause and the fix: {refused:?}"
    );
    let waiting = wait_for(&cluster, "the DataStage naming no ConfigMap to wait", Duration::from_secs(60), || {
        condition("unnamed", |c| c.reason == "CABundleNotFound")
    })
    .await;
    assert!(waiting.message.contains("ConfigMap 'no-such-ca'") && waiting.message.contains(DATA_NS), "{waiting:?}");

    // 6. Keys nowhere: a store whose STS trusts the cluster's
    //    service-account issuer. Each worker's kubelet projects a token with
    //    the store's audience, which the stager exchanges for keys; onto
    //    both nodes, peer to peer. A token for another audience is refused.
    let control_plane = cluster.control_plane().expect("a local control plane");
    let keyless = store_trusting_issuer(control_plane, &client, "ferry-e2e-store").await;
    keyless.create_bucket("models").await;
    let model: BTreeMap<String, Vec<u8>> =
        objects([("weights.bin", pattern(92, (6 << 20) + 5)), ("config.json", b"{\"layers\": 2}".to_vec())]);
    for (key, body) in &model {
        keyless.put("models", &format!("small/{key}"), body.clone()).await;
    }
    let keyless_endpoint = endpoint_for_pods(&mut cluster, &keyless.endpoint).await;
    let role = keyless.openid_role_arn.clone().unwrap();
    let keyless_pull = |audience: &str| {
        json!({"source": {"uri": "s3://models/small", "endpoint": keyless_endpoint,
                          "credentials": {"webIdentity": {"roleArn": role, "audience": audience}}},
               "destination": {"volume": {"nodeCache": "local"}},
               "fanout": "PeerToPeer"})
    };
    stages.create(&PostParams::default(), &datastage("keyless", keyless_pull("ferry-e2e-store"))).await.unwrap();
    // A token for an audience the admin did not list never leaves the
    // cluster: refused at admission, saying who may allow it.
    let refused = stages
        .create(&PostParams::default(), &datastage("elsewhere", keyless_pull("another-store")))
        .await
        .expect_err("a token for another audience");
    assert!(refused.to_string().contains("webIdentity.audiences"), "{refused}");
    finished(&cluster, &stages, "keyless", 1).await;
    for node in ["node-a", "node-b"] {
        let staged = read_tree(&cluster.node_dir(node).unwrap().join(CACHE_DIR).join("keyless"));
        assert!(staged == model, "{node}: the keyless pull differs from the bucket");
    }

    // 7. A gated model from the Hugging Face Hub (olah behind the
    //    testkit's front, its LFS files redirected to storage), its token
    //    from a Secret, onto both nodes peer to peer by the chart's
    //    operator and stager image: byte for byte, at the commit the
    //    status names. Pods reach the Hub and its storage through
    //    forwarders, so the redirects name the forwarded storage.
    let hub = ferry_testkit::HubServer::start();
    let hub_endpoint = endpoint_for_pods(&mut cluster, &hub.endpoint).await;
    hub.redirect_storage_to(&endpoint_for_pods(&mut cluster, &hub.storage_endpoint()).await);
    let hub_model: BTreeMap<String, Vec<u8>> = objects([
        ("config.json", br#"{"hidden_size": 64}"#.to_vec()),
        ("model-00001-of-00002.safetensors", pattern(93, (7 << 20) + 11)),
        ("model-00002-of-00002.safetensors", pattern(94, (5 << 20) + 1)),
        ("tokenizer/vocab.txt", b"a\nb\nc\n".to_vec()),
    ]);
    hub.put_all("nodes-model", hub_model.clone()).await;
    hub.gate("nodes-model", "hf_nodes_token");
    let token = ferry_e2e::hub_token_secret("hf", "hf_nodes_token");
    Api::<Secret>::namespaced(client.clone(), DATA_NS).create(&PostParams::default(), &token).await.unwrap();
    let from_hub = json!({
        "source": {"uri": "hf://ferry/nodes-model", "endpoint": hub_endpoint, "credentials": {"name": "hf"}},
        "destination": {"volume": {"nodeCache": "local"}},
        "fanout": "PeerToPeer",
        "transfer": {"partSize": "5MiB", "concurrency": 4},
    });
    stages.create(&PostParams::default(), &datastage("hub-model", from_hub)).await.unwrap();
    let staged = finished(&cluster, &stages, "hub-model", 1).await;
    let totals = staged.totals.clone().unwrap();
    assert_eq!(totals.objects_done as usize, 2 * hub_model.len(), "every file on both nodes: {staged:?}");
    assert!(totals.bytes_from_peers.unwrap_or(0) > 0, "the nodes fed each other: {totals:?}");
    let revision = staged.snapshot.as_ref().and_then(|s| s.revision.clone());
    assert_eq!(revision, Some(hub.commit("nodes-model", "main")), "the status names the commit");
    for node in ["node-a", "node-b"] {
        let on_node = read_tree(&cluster.node_dir(node).unwrap().join(CACHE_DIR).join("hub-model"));
        assert!(on_node == hub_model, "{node}: the model differs from the Hub's");
    }

    cluster.stop().await;
}

/// Objects by their key relative to a prefix.
fn objects<const N: usize>(pairs: [(&str, Vec<u8>); N]) -> BTreeMap<String, Vec<u8>> {
    pairs.into_iter().map(|(key, body)| (key.to_owned(), body)).collect()
}

/// A loopback `endpoint` (`http://127.0.0.1:PORT`) as pods reach it, through a forwarder on
/// the host.
async fn endpoint_for_pods(cluster: &mut Cluster, endpoint: &str) -> String {
    let (scheme, address) = endpoint.split_once("://").expect("an endpoint URL");
    let address: SocketAddr = address.parse().expect("a loopback endpoint");
    let seen_by_pods = cluster.reachable_from_pods(address).await.expect("forward the store").expect("a local cluster");
    format!("{scheme}://{seen_by_pods}")
}

/// Objects of odd sizes: one above the part size (ranged reads), small
/// ones, an empty one, a deep one.
fn sample_dataset() -> BTreeMap<String, Vec<u8>> {
    let mut objects = BTreeMap::new();
    objects.insert("weights/model.bin".to_owned(), pattern(1, (9 << 20) + 7));
    for i in 0..12u64 {
        objects.insert(format!("images/{i:03}.jpg"), pattern(10 + i, 1000 * i as usize + 13));
    }
    objects.insert("empty".to_owned(), Vec::new());
    objects.insert("a/b/c/deep.txt".to_owned(), b"deep".to_vec());
    objects
}

fn uid(id: i64) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(id as u32)
}

fn gid(id: i64) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(id as u32)
}

fn datastage(name: &str, spec: Value) -> DataStage {
    serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// The status of DataStage `name` once run `run` has Succeeded.
async fn finished(cluster: &Cluster, stages: &Api<DataStage>, name: &str, run: i64) -> ferry_crds::DataStageStatus {
    wait_for(cluster, &format!("DataStage {name} run {run} to succeed"), Duration::from_secs(240), || {
        let stages = stages.clone();
        async move {
            let status = stages.get(name).await.ok()?.status?;
            if status.run != Some(run) {
                return None;
            }
            assert_ne!(status.phase, Some(Phase::Failed), "DataStage {name} failed: {status:?}");
            (status.phase == Some(Phase::Succeeded)).then_some(status)
        }
    })
    .await
}

async fn running_pod(cluster: &Cluster, client: &kube::Client, namespace: &str, selector: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(cluster, &format!("a running pod {selector}"), Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&kube::api::ListParams::default().labels(selector)).await.ok()?;
            list.items.into_iter().find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await
}

/// `sha256sum -c` input for every object, as a trainer finds it under
/// `/data`, computed by this machine's sha256sum over node-a's copy (which
/// the test has compared with the bucket byte for byte).
fn checksums(dir: &Path, dataset: &BTreeMap<String, Vec<u8>>) -> String {
    let keys: Vec<&str> = dataset.keys().map(String::as_str).collect();
    let output = std::process::Command::new("sha256sum").args(&keys).current_dir(dir).output().expect("sha256sum");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().lines().map(|l| l.replacen("  ", "  /data/", 1) + "\n").collect()
}

/// A pod running `script` as the trainer's user, wired by the webhook to
/// DataStage `model` at `/data` (so placed where its data is).
fn wired_pod(name: &str, script: &str) -> Pod {
    let mut spec = training_pod("", None);
    spec["containers"][0]["command"] = json!(["/bin/busybox", "sh", "-c", script]);
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"ferry.dev/datastage": "model"}}, "spec": spec}))
    .unwrap()
}

/// The log of pod `name` once it has succeeded.
async fn pod_log_once_done(cluster: &Cluster, pods: &Api<Pod>, name: &str) -> String {
    wait_for(cluster, &format!("{name} to end"), Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            let phase = pods.get(name).await.ok()?.status?.phase?;
            assert_ne!(phase, "Failed", "{name} failed");
            (phase == "Succeeded").then_some(())?;
            pods.logs(name, &Default::default()).await.ok()
        }
    })
    .await
}

/// A trainer: user 1000, restricted-compliant, checking every staged file
/// under `/data`. With `wait_on`, it is pinned there and mounts the claim
/// Ferry binds itself, and an init container (`ferry-stager wait`, with the
/// pod's projected token) holds it until the data is on its node; without,
/// the webhook wires it by its label.
fn training_pod(expected: &str, wait_on: Option<&str>) -> Value {
    let trainer = json!({"name": "train", "image": test_image("shell"),
        "command": ["/bin/busybox", "sh", "-c", "printf %s \"$EXPECTED\" | /bin/busybox sha256sum -c -"],
        "env": [{"name": "EXPECTED", "value": expected}],
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true}});
    let mut spec = json!({
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": true, "runAsUser": TRAINER_UID, "runAsGroup": TRAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [trainer],
    });
    if let Some(node) = wait_on {
        spec["nodeSelector"] = json!({"ferry.dev/e2e-node": node});
        spec["serviceAccountName"] = json!("ferry-stager");
        spec["initContainers"] = json!([{"name": "wait", "image": ferry_image("ferry-stager"),
            "args": ["wait", format!("{DATA_NS}/data"), "--timeout", "2m"],
            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true}}]);
        spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data", "readOnly": true}]);
        spec["volumes"] =
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": "ferry-data", "readOnly": true}}]);
    }
    spec
}

/// Pods of each kind [`pod_start_medians`] times.
const POD_START_SAMPLES: usize = 7;

/// The median time, in milliseconds, from creating a pod on node-a that
/// lists the staged data and exits to its phase `Succeeded`: with the data
/// mounted as a hostPath (in a privileged namespace of the test's own, as
/// before the workers' namespace) and through the claim `ferry-data`
/// Ferry binds (in the tenant's restricted one). Alternated, so both see
/// the same machine.
async fn pod_start_medians(cluster: &Cluster, client: &kube::Client) -> (u128, u128) {
    const HOST_NS: &str = "pod-start";
    create_namespace(cluster, HOST_NS, &[("pod-security.kubernetes.io/enforce", "privileged")]).await;
    let pod = |name: &str, volume: Value| -> Pod {
        let mut spec = training_pod("", None);
        spec["containers"][0]["command"] = json!(["/bin/busybox", "ls", "/data"]);
        spec["containers"][0]["volumeMounts"] = json!([{"name": "data", "mountPath": "/data", "readOnly": true}]);
        spec["nodeSelector"] = json!({"ferry.dev/e2e-node": "node-a"});
        spec["volumes"] = json!([volume]);
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}))
            .unwrap()
    };
    let host_path = json!({"name": "data", "hostPath": {"path": format!("/{CACHE_DIR}/data"), "type": "Directory"}});
    let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "ferry-data", "readOnly": true}});
    let mut times: [Vec<u128>; 2] = [Vec::new(), Vec::new()];
    for i in 0..POD_START_SAMPLES {
        for (kind, (namespace, volume)) in [(HOST_NS, &host_path), (DATA_NS, &claim)].into_iter().enumerate() {
            let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
            let name = format!("start-{i}");
            let started = std::time::Instant::now();
            pods.create(&PostParams::default(), &pod(&name, volume.clone())).await.unwrap();
            wait_for(cluster, &format!("{namespace}/{name} to succeed"), Duration::from_secs(60), || {
                let pods = pods.clone();
                let name = name.clone();
                async move {
                    let phase = pods.get(&name).await.ok()?.status?.phase?;
                    assert_ne!(phase, "Failed", "{namespace}/{name} failed");
                    (phase == "Succeeded").then_some(())
                }
            })
            .await;
            times[kind].push(started.elapsed().as_millis());
            pods.delete(&name, &Default::default()).await.unwrap();
        }
    }
    let median = |mut v: Vec<u128>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let [host, claimed] = times;
    (median(host), median(claimed))
}

/// A claim `name` in `namespace` bound to a local PersistentVolume of
/// `path` on `node`, as an admin provisions a scratch volume for a team.
async fn create_local_claim(client: &kube::Client, namespace: &str, name: &str, path: &str, node: &str) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("{namespace}-{name}")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "scratch",
            "persistentVolumeReclaimPolicy": "Retain", "local": {"path": path},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "ferry.dev/e2e-node", "operator": "In", "values": [node]}]}]}}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "scratch",
            "volumeName": format!("{namespace}-{name}"), "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
}
