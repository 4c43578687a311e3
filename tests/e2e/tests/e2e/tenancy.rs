//! The tenant boundary, with the chart installed as an admin installs it:
//! two tenant namespaces that enforce Pod Security's `restricted` level,
//! `team-a` staging its data, and `team-b`, a tenant who wants more than
//! its own, trying each way a DataStage or a pod of its namespace might
//! reach further (as a user with the rights a tenant has, not as admin):
//!
//! 1. its own image beside node data; a hostPath of team-a's directory;
//! 2. a token for the API server's audience, and one sent over plain HTTP;
//! 3. a push and a pull named like team-a's, to read or overwrite its data;
//! 4. objects of the same names from a store of its own, to be linked
//!    into team-a's pulls;
//! 5. (the allow-list) an empty `allowedHostPaths`, refused before it can
//!    allow everything;
//! 7. a Secret planted where peers look, a forged worker pod and status, a
//!    flood of connections to a worker's peer port.
//!
//! Each is refused (at admission or by RBAC, naming who may) or harmless,
//! while team-a's data stays byte-identical and its DataStage unaffected.
//! And 6: a DataStage whose workers cannot be created says so, with the Job
//! controller's own words, instead of waiting as if they ran.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::Duration;

use ferry_contract::layout::STATE_DIR;
use ferry_crds::{DataStage, Phase, names};
use ferry_e2e::chart::{CHART_WORKERS_NS, SYSTEM_NS, helm_install, image_values};
use ferry_e2e::tools::Tools;
use ferry_e2e::{Cluster, create_namespace, object_store, wait_for};
use ferry_testkit::{pattern, read_tree, repo_root};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";
/// A namespace the admin did not give Ferry.
const TEAM_C: &str = "team-c";
/// The NodeCache the chart makes here, and its root on every node.
const CACHE: &str = "local";
const ROOT: &str = "mnt/ferry";
const RESTRICTED: [(&str, &str); 2] =
    [("pod-security.kubernetes.io/enforce", "restricted"), ("pod-security.kubernetes.io/enforce-version", "latest")];
/// The audience of the API server's own tokens in this harness.
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

fn datastage(name: &str, spec: Value) -> DataStage {
    serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap()
}

/// A client acting as `user` (in `system:authenticated`), the way a
/// tenant's kubeconfig would.
async fn acting_as(cluster: &Cluster, user: &str) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.unwrap();
    config.auth_info.impersonate = Some(user.to_owned());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    kube::Client::try_from(config).unwrap()
}

/// What a tenant may do in its own namespace: DataStages, pods, Jobs,
/// Secrets, ConfigMaps and claims (as the `edit` role), and, as some
/// tenant admins grant, write DataStage status.
async fn grant_tenant(client: &kube::Client, namespace: &str, user: &str) {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "tenant", "namespace": namespace},
        "rules": [
            {"apiGroups": ["ferry.dev"], "resources": ["datastages", "datastages/status"], "verbs": ["*"]},
            {"apiGroups": [""], "resources": ["pods", "secrets", "configmaps", "persistentvolumeclaims", "serviceaccounts"], "verbs": ["*"]},
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["*"]},
        ]}))
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "tenant", "namespace": namespace},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"}}))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), namespace).create(&PostParams::default(), &role).await.unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), namespace).create(&PostParams::default(), &binding).await.unwrap();
}

/// The refusal of a create, as the API server words it.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The status of DataStage `name` once `done` holds for it.
async fn status_when(
    cluster: &Cluster,
    stages: &Api<DataStage>,
    name: &str,
    what: &str,
    done: impl Fn(&ferry_crds::DataStageStatus) -> bool,
) -> ferry_crds::DataStageStatus {
    wait_for(cluster, &format!("{name}: {what}"), Duration::from_secs(180), || {
        let stages = stages.clone();
        let done = &done;
        async move { stages.get(name).await.ok()?.status.filter(|s| done(s)) }
    })
    .await
}

fn succeeded(status: &ferry_crds::DataStageStatus) -> bool {
    status.phase == Some(Phase::Succeeded)
}

/// Every file below `dir` with its inode and link count, for a failure's
/// message.
fn listing(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            found.extend(listing(&entry.path()));
        } else {
            found.push(format!("{} ino {} links {}", entry.path().display(), meta.ino(), meta.nlink()));
        }
    }
    found
}

/// (device, inode) of every data file below `dir` (not the stager's own
/// records in `.ferry`, which each copy keeps for itself).
fn inodes(dir: &Path) -> BTreeSet<(u64, u64)> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() && entry.file_name() == STATE_DIR {
            continue;
        }
        if meta.is_dir() {
            found.extend(inodes(&entry.path()));
        } else {
            found.insert((meta.dev(), meta.ino()));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_that_wants_more_than_its_data_is_refused_or_harmless_and_the_other_tenant_is_unaffected() {
    assert!(
        ferry_e2e::pod_network_routed(),
        "the DataStage webhook answers behind its Service: run the e2e tests under hack/netns.sh (hack/test.sh does)"
    );
    raise_open_file_limit();
    // team-a's store, and a store team-b runs itself.
    let store_a = object_store();
    store_a.create_bucket("datasets").await;
    store_a.create_bucket("b-uploads").await;
    let mut dataset = BTreeMap::new();
    for i in 0..8u64 {
        dataset.insert(format!("train/{i:02}.bin"), pattern(500 + i, 300_000 + i as usize * 7));
    }
    dataset.insert("model.bin".to_owned(), pattern(599, (6 << 20) + 3));
    for (key, body) in &dataset {
        store_a.put("datasets", &format!("real/{key}"), body.clone()).await;
    }
    let store_b = ferry_testkit::S3Server::minio();
    store_b.create_bucket("datasets").await;
    for key in dataset.keys() {
        // The same names, other bytes.
        store_b.put("datasets", &format!("real/{key}"), b"team-b was here".to_vec()).await;
    }

    let cluster = Cluster::start().await.expect("cluster");
    let admin = cluster.client().await.unwrap();
    let tools = Tools::new(cluster.kubeconfig());
    for namespace in [SYSTEM_NS, TEAM_A, TEAM_B, TEAM_C] {
        create_namespace(&cluster, namespace, &RESTRICTED).await;
    }
    let mut values = image_values();
    values.extend(
        [
            "dataStageNamespaces={team-a,team-b}",
            "leaseDuration=4s",
            "nodeCaches[0].name=local",
            "nodeCaches[0].root=/mnt/ferry",
        ]
        .map(String::from),
    );
    helm_install(&tools, &cluster, &values);
    for (namespace, store) in [(TEAM_A, &store_a), (TEAM_B, &store_b), (TEAM_C, &store_a)] {
        let secret: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": store.secret_key}}))
        .unwrap();
        Api::<Secret>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &secret).await.unwrap();
    }
    grant_tenant(&admin, TEAM_B, "mallory").await;
    let mallory = acting_as(&cluster, "mallory").await;
    let a_stages: Api<DataStage> = Api::namespaced(admin.clone(), TEAM_A);
    let b_stages: Api<DataStage> = Api::namespaced(mallory.clone(), TEAM_B);
    let source_a = json!({"uri": "s3://datasets/real", "endpoint": store_a.endpoint, "credentials": {"name": "s3"}});
    let source_b = json!({"uri": "s3://datasets/real", "endpoint": store_b.endpoint, "credentials": {"name": "s3"}});
    let on_cache = json!({"volume": {"nodeCache": CACHE}});

    // team-a stages its data onto both nodes, peer to peer, slowly enough
    // for the flood below to meet a worker that serves.
    let mut data = json!({"source": source_a, "destination": on_cache, "fanout": "PeerToPeer",
        "transfer": {"maxBandwidth": "1MiB"}});
    a_stages.create(&PostParams::default(), &datastage("data", data.clone())).await.unwrap();

    // 7c. A flood of connections to a worker's peer port (its pod IP is no
    //     secret: any pod can scan for it). The port keeps at most 512 and
    //     closes the rest as they come.
    let serving = status_when(&cluster, &a_stages, "data", "a worker serving its peers", |s| {
        s.workers.iter().any(|w| w.peer_address.is_some())
    })
    .await;
    let address: std::net::SocketAddr =
        serving.workers.iter().find_map(|w| w.peer_address.clone()).unwrap().parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..600 {
        match tokio::net::TcpStream::connect(address).await {
            Ok(stream) => flood.push(stream),
            Err(_) => break,
        }
    }
    // Those past the cap (the last ones opened) are closed at once.
    let mut closed = 0;
    let past_cap = flood.len().saturating_sub(512);
    for stream in flood.iter_mut().rev().take(past_cap) {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), tokio::io::AsyncReadExt::read(stream, &mut byte));
        if matches!(read.await, Ok(Ok(0) | Err(_))) {
            closed += 1;
        }
    }
    assert!(
        flood.len() == 600 && closed + 8 >= past_cap,
        "the port closed {closed} of the {past_cap} connections past its cap"
    );
    let staged = status_when(&cluster, &a_stages, "data", "Succeeded under the flood", succeeded).await;
    drop(flood);
    let a_dir = |node: &str, name: &str| cluster.node_dir(node).map(|d| d.join(ROOT).join(TEAM_A).join(name));
    for node in ["node-a", "node-b"] {
        if let Some(dir) = a_dir(node, "data") {
            assert!(read_tree(&dir) == dataset, "{node}: team-a's data differs from its store");
        }
    }
    let a_inodes = a_dir("node-a", "data").map(|d| inodes(&d));
    let snapshot = staged.snapshot.clone().unwrap();
    assert_eq!(staged.claim_name.as_deref(), Some("ferry-data"), "pods read it through a claim in team-a");

    // 1. Its own image beside node data; team-a's directory as a hostPath.
    let own_image = json!({"source": source_b, "destination": on_cache, "image": "evil.example/root-shell:1"});
    let refused = refusal(b_stages.create(&PostParams::default(), &datastage("own-image", own_image)).await);
    assert!(refused.contains("spec.image") && refused.contains("stager.allowedImages"), "{refused}");
    let dir_of_a = format!("/{ROOT}/{TEAM_A}/data");
    for (what, spec) in [
        (
            "a push of team-a's directory",
            json!({"source": {"volume": {"hostPath": dir_of_a}},
            "destination": {"uri": "s3://b-uploads/stolen", "endpoint": store_a.endpoint, "credentials": {"name": "s3"}}}),
        ),
        (
            "a pull over team-a's directory",
            json!({"source": source_b, "destination": {"volume": {"hostPath": dir_of_a}}}),
        ),
        ("the node cache's root", json!({"source": source_b, "destination": {"volume": {"hostPath": "/mnt/ferry"}}})),
    ] {
        let refused = refusal(b_stages.create(&PostParams::default(), &datastage("by-path", spec)).await);
        assert!(refused.contains("volume.hostPath is for the cluster admin's namespaces only"), "{what}: {refused}");
    }
    // No pod of its own in the workers' namespace either.
    let shell: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "beside"},
        "spec": {"containers": [{"name": "sh", "image": ferry_e2e::image("ferry-e2e-shell"), "command": ["sh", "-c", "true"]}]}}))
    .unwrap();
    let refused =
        refusal(Api::<Pod>::namespaced(mallory.clone(), CHART_WORKERS_NS).create(&PostParams::default(), &shell).await);
    assert!(refused.contains("forbidden"), "{refused}");

    // 2. A token for the API server's audience; one sent over plain HTTP.
    for (audience, sts, wants) in [
        (API_AUDIENCE, "https://sts.example", "is not one the cluster admin allows tokens for"),
        ("sts.amazonaws.com", "http://sts.evil.example", "is not https://"),
    ] {
        let spec = json!({"source": {"uri": "s3://datasets/real", "endpoint": "https://s3.example",
            "credentials": {"webIdentity": {"roleArn": "arn:aws:iam::1:role/x", "audience": audience, "stsEndpoint": sts}}},
            "destination": on_cache});
        let refused = refusal(b_stages.create(&PostParams::default(), &datastage("token", spec)).await);
        assert!(refused.contains(wants), "{audience} at {sts}: {refused}");
    }

    // 3. A push and a pull named like team-a's: each in team-b's own
    //    directory. The push finds nothing there (and uploads nothing); the
    //    pull lands beside, never over, team-a's files.
    let push = json!({"source": on_cache, "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}},
        "destination": {"uri": "s3://b-uploads/stolen", "endpoint": store_a.endpoint, "credentials": {"name": "s3"}}});
    b_stages.create(&PostParams::default(), &datastage("data", push)).await.unwrap();
    let pushed =
        status_when(&cluster, &b_stages, "data", "the push to end", |s| s.phase.is_some_and(Phase::is_finished)).await;
    assert_eq!(pushed.phase, Some(Phase::Failed), "nothing of team-b's to push: {pushed:?}");
    assert!(store_a.list("b-uploads", "").await.is_empty(), "nothing of team-a's reached team-b's bucket");

    // 4. The same object names from team-b's own store, onto its nodes.
    b_stages
        .create(&PostParams::default(), &datastage("copy", json!({"source": source_b, "destination": on_cache})))
        .await
        .unwrap();
    status_when(&cluster, &b_stages, "copy", "Succeeded", succeeded).await;
    let b_dir = cluster.node_dir("node-a").map(|d| d.join(ROOT).join(TEAM_B).join("copy"));
    if let Some(b_dir) = &b_dir {
        assert_eq!(read_tree(b_dir).get("model.bin").map(Vec::as_slice), Some(&b"team-b was here"[..]));
    }
    // team-a's next pull of its objects links its own copies, not team-b's.
    a_stages
        .create(
            &PostParams::default(),
            &datastage(
                "again",
                json!({"source": source_a, "destination": on_cache,
            "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}}),
            ),
        )
        .await
        .unwrap();
    let again = status_when(&cluster, &a_stages, "again", "Succeeded", succeeded).await;
    if let (Some(again_dir), Some(a_inodes), Some(b_dir)) = (a_dir("node-a", "again"), &a_inodes, &b_dir) {
        assert!(read_tree(&again_dir) == dataset, "team-a's second copy is team-a's data");
        let again_inodes = inodes(&again_dir);
        assert!(
            again_inodes.is_subset(a_inodes),
            "linked from team-a's own shared objects: {again_inodes:?} not within {a_inodes:?}; on node-a: {:?}",
            cluster.node_dir("node-a").map(|d| listing(&d.join(ROOT)))
        );
        assert!(inodes(b_dir).is_disjoint(a_inodes), "nothing of team-b's shares an inode with team-a's");
        assert_eq!(again.totals.unwrap().bytes_from_store.unwrap_or(0), 0, "nothing read again");
    }

    // 7a. A planted peer Secret: team-b may not write where peers look, and
    //     what it writes in its own namespace no worker reads.
    let planted: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "data-peers"}, "stringData": {"token": "known-to-mallory"}}))
    .unwrap();
    let refused = refusal(
        Api::<Secret>::namespaced(mallory.clone(), CHART_WORKERS_NS).create(&PostParams::default(), &planted).await,
    );
    assert!(refused.contains("forbidden"), "{refused}");
    Api::<Secret>::namespaced(mallory.clone(), TEAM_B).create(&PostParams::default(), &planted).await.unwrap();
    let worker_jobs: Vec<Job> = ferry_e2e::datastage_jobs(&admin, TEAM_A, "data", names::WORKER).await;
    for job in &worker_jobs {
        assert_eq!(job.namespace().as_deref(), Some(CHART_WORKERS_NS));
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        let secrets: Vec<String> =
            pod.volumes.iter().flatten().filter_map(|v| v.secret.as_ref()?.secret_name.clone()).collect();
        assert!(secrets.iter().all(|s| s != "data-peers"), "{secrets:?}");
    }

    // 7b. A forged worker: a pod of team-b labelled as the worker of its
    //     own failing pull, claiming success; and a status written by hand.
    let failing = json!({"source": {"uri": "s3://no-such-bucket/x", "endpoint": store_b.endpoint,
        "credentials": {"name": "s3"}}, "destination": on_cache, "backoffLimit": 0,
        "placement": {"nodeSelector": {"ferry.dev/e2e-node": "node-a"}}});
    b_stages.create(&PostParams::default(), &datastage("forged", failing)).await.unwrap();
    let summary = r#"{"objects":{"selected":1,"transferred":1},"bytes":{"selected":1,"transferred":1},"snapshot":{"objects":1,"bytes":1,"digest":"f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"}}"#;
    let forger: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "forger",
        "labels": {names::DATASTAGE: "forged", names::WORKER: "node-a", names::RUN: "1"}},
        "spec": {"restartPolicy": "Never", "nodeName": "node-a",
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "stager", "image": ferry_e2e::image("ferry-e2e-shell"),
                "command": ["sh", "-c", "printf %s \"$SUMMARY\" > /dev/termination-log"],
                "env": [{"name": "SUMMARY", "value": summary}],
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}))
    .unwrap();
    Api::<Pod>::namespaced(mallory.clone(), TEAM_B).create(&PostParams::default(), &forger).await.unwrap();
    let forged = status_when(&cluster, &b_stages, "forged", "to fail", |s| s.phase == Some(Phase::Failed)).await;
    let reason = forged.conditions.iter().find(|c| c.type_ == "Failed").map(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some("BucketNotFound"), "its own worker's verdict, not the forger's: {forged:?}");
    let forged_status = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "forged"},
        "status": {"phase": "Succeeded", "workers": [{"name": "node-a", "node": "node-a", "phase": "Succeeded",
            "disk": {"sizeBytes": 1, "freeBytes": 0, "measuredAt": 1}}]}});
    let refused = refusal(
        b_stages.patch_status("forged", &PatchParams::apply("mallory").force(), &Patch::Apply(&forged_status)).await,
    );
    assert!(refused.contains("only Ferry writes the status of a DataStage"), "{refused}");
    let refused = refusal(
        Api::<DataStage>::namespaced(mallory.clone(), TEAM_A)
            .patch_status("data", &PatchParams::apply("mallory").force(), &Patch::Apply(&forged_status))
            .await,
    );
    assert!(refused.contains("forbidden"), "{refused}");

    // 6. Workers that cannot be created say so: a claim's workers as an
    //    account that does not exist; and a namespace Ferry was not given.
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none", "resources": {"requests": {"storage": "1Gi"}}}}))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(admin.clone(), TEAM_A)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    a_stages
        .create(
            &PostParams::default(),
            &datastage(
                "no-account",
                json!({"source": source_a,
            "destination": {"volume": {"persistentVolumeClaim": {"claimName": "scratch"}}},
            "serviceAccountName": "nobody"}),
            ),
        )
        .await
        .unwrap();
    let stuck = status_when(&cluster, &a_stages, "no-account", "to say its pods are not created", |s| {
        s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "WorkerPodsNotCreated")
    })
    .await;
    let message = &stuck.conditions.iter().find(|c| c.type_ == "Ready").unwrap().message;
    assert!(message.contains("nobody") && message.contains("cannot create its pods"), "{message}");
    let c_stages: Api<DataStage> = Api::namespaced(admin.clone(), TEAM_C);
    c_stages
        .create(&PostParams::default(), &datastage("elsewhere", json!({"source": source_a, "destination": on_cache})))
        .await
        .unwrap();
    let waiting = status_when(&cluster, &c_stages, "elsewhere", "to say Ferry is not enabled there", |s| {
        s.conditions.iter().any(|c| c.reason == "NamespaceNotEnabled")
    })
    .await;
    let message = &waiting.conditions.iter().find(|c| c.reason == "NamespaceNotEnabled").unwrap().message;
    assert!(message.contains("dataStageNamespaces") && message.contains(TEAM_C), "{message}");

    // team-a's DataStage was never touched: its data, its snapshot, its phase.
    let after = a_stages.get("data").await.unwrap().status.unwrap();
    assert_eq!((after.phase, after.snapshot), (Some(Phase::Succeeded), Some(snapshot)));
    for node in ["node-a", "node-b"] {
        if let Some(dir) = a_dir(node, "data") {
            assert!(read_tree(&dir) == dataset, "{node}: team-a's data changed");
        }
    }
    if let (Some(dir), Some(before)) = (a_dir("node-a", "data"), a_inodes) {
        assert_eq!(inodes(&dir), before, "not a file of team-a's was replaced");
    }
    // An edit after creation: team-a's DataStage goes on as before.
    data["transfer"] = json!({"concurrency": 4});
    a_stages.patch("data", &PatchParams::default(), &Patch::Merge(json!({"spec": data}))).await.unwrap();
    let rerun = status_when(&cluster, &a_stages, "data", "run 2", |s| s.run == Some(2) && succeeded(s)).await;
    assert_eq!(rerun.totals.unwrap().bytes_from_store.unwrap_or(0), 0, "a re-run copies nothing");
    // When it goes, what it left outside its namespace goes too.
    a_stages.delete("data", &Default::default()).await.unwrap();
    let anchors: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(admin.clone(), CHART_WORKERS_NS);
    wait_for(&cluster, "team-a's anchor, Jobs and volume to go with it", Duration::from_secs(120), || {
        let (anchors, admin) = (anchors.clone(), admin.clone());
        async move {
            let selector = format!("{}={TEAM_A},{}=data", names::DATASTAGE_NAMESPACE, names::DATASTAGE);
            let left = anchors.list(&ListParams::default().labels(&selector)).await.ok()?.items;
            let volumes = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(admin.clone())
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items;
            let jobs = ferry_e2e::datastage_jobs(&admin, TEAM_A, "data", names::WORKER).await;
            (left.is_empty() && volumes.is_empty() && jobs.is_empty()).then_some(())
        }
    })
    .await;
    cluster.stop().await;
}

/// The migration of a release's DataStages from before the workers'
/// namespace (docs/upgrading.md), as the upgrade finds them: node-local
/// DataStages whose worker Jobs ran in their own namespaces, staged onto
/// hostPaths. In a namespace the admin keeps for hostPaths the DataStage
/// goes on, its workers moved to the workers' namespace and its data used
/// again; in a tenant's it is refused, saying what to change, its old
/// workers stopped, and deleting it keeps its data (no privileged clean-up
/// on a path the release refuses). Re-created as the message says, onto a
/// NodeCache, it stages.
#[tokio::test(flavor = "multi_thread")]
async fn datastages_from_before_the_workers_namespace_go_on_in_the_admins_namespaces_and_are_refused_in_tenants() {
    use ferry_e2e::{NODE_CACHE, WORKERS_NS, cache_dir, install_crd, start_operator_with};
    const ADMIN: &str = "platform";
    const TENANT: &str = "legacy-team";
    let store = object_store();
    store.create_bucket("datasets").await;
    let mut dataset = BTreeMap::new();
    for i in 0..5u64 {
        dataset.insert(format!("shard-{i}.bin"), pattern(700 + i, 200_000 + i as usize * 13));
    }
    for (key, body) in &dataset {
        store.put("datasets", &format!("legacy/{key}"), body.clone()).await;
    }
    let cluster = Cluster::start().await.expect("cluster");
    let admin = cluster.client().await.unwrap();
    install_crd(&cluster).await;
    for namespace in [ADMIN, TENANT] {
        create_namespace(&cluster, namespace, &[]).await;
        let secret: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": store.access_key, "AWS_SECRET_ACCESS_KEY": store.secret_key}}))
        .unwrap();
        Api::<Secret>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &secret).await.unwrap();
    }
    // What the earlier release left, mid-run: each DataStage on a hostPath
    // with its clean-up finalizer, its status naming node-a, its worker Job
    // (still running) in its own namespace, and a file on node-a.
    let source = json!({"uri": "s3://datasets/legacy", "endpoint": store.endpoint, "credentials": {"name": "s3"}});
    let on_node_a = json!({"nodeSelector": {"ferry.dev/e2e-node": "node-a"}});
    for namespace in [ADMIN, TENANT] {
        let path = format!("/mnt/ferry/{namespace}/legacy");
        let mut old: DataStage = datastage(
            "legacy",
            json!({"source": source, "placement": on_node_a,
            "destination": {"volume": {"hostPath": path}}, "reclaimPolicy": "Delete"}),
        );
        old.metadata.finalizers = Some(vec![names::CLEANUP_FINALIZER.to_owned()]);
        let stages: Api<DataStage> = Api::namespaced(admin.clone(), namespace);
        let old = stages.create(&PostParams::default(), &old).await.unwrap();
        let status = json!({"status": {"phase": "Running", "run": 1,
            "workers": [{"name": "node-a", "node": "node-a", "phase": "Running", "run": 1}]}});
        stages.patch_status("legacy", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        let job: Job = serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "legacy-node-a-r1",
                "labels": {names::DATASTAGE: "legacy", names::WORKER: "node-a", names::RUN: "1",
                    "app.kubernetes.io/managed-by": "ferry-operator"},
                "ownerReferences": [{"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "name": "legacy",
                    "uid": old.uid().unwrap(), "controller": true, "blockOwnerDeletion": true}]},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {names::DATASTAGE: "legacy", names::WORKER: "node-a", names::RUN: "1"}},
                "spec": {"restartPolicy": "Never", "nodeName": "node-a",
                    "containers": [{"name": "stager", "image": ferry_e2e::image("ferry-e2e-shell"),
                        "command": ["sh", "-c", "sleep 600"]}]}}}}))
        .unwrap();
        Api::<Job>::namespaced(admin.clone(), namespace).create(&PostParams::default(), &job).await.unwrap();
        if let Some(node) = cluster.node_dir("node-a") {
            let dir = node.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("kept.txt"), b"staged by the earlier release").unwrap();
        }
    }

    // A training Job of the tenant's that asks for the data by the label:
    // not a worker, whatever the upgrade does.
    let training: Job = serde_json::from_value(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "labels": {names::DATASTAGE: "legacy"}},
        "spec": {"suspend": true, "template": {"metadata": {"labels": {names::DATASTAGE: "legacy"}},
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "train", "image": ferry_e2e::image("ferry-e2e-shell"), "command": ["true"]}]}}}}))
    .unwrap();
    Api::<Job>::namespaced(admin.clone(), TENANT).create(&PostParams::default(), &training).await.unwrap();

    // The upgrade: this release, with hostPaths for the admin's namespace.
    let logs = tempfile::tempdir().unwrap();
    let (_operator, _) =
        start_operator_with(&cluster, logs.path(), "operator-1", &[("FERRY_HOST_PATH_NAMESPACES", ADMIN)]);
    let admins: Api<DataStage> = Api::namespaced(admin.clone(), ADMIN);
    let tenants: Api<DataStage> = Api::namespaced(admin.clone(), TENANT);

    // The admin's goes on: its old Job retired, a worker in the workers'
    // namespace, the dataset staged beside what was there.
    status_when(&cluster, &admins, "legacy", "Succeeded", succeeded).await;
    let jobs = ferry_e2e::datastage_jobs(&admin, ADMIN, "legacy", names::WORKER).await;
    assert!(
        jobs.iter().all(|j| j.namespace().as_deref() == Some(WORKERS_NS)),
        "the old Job in {ADMIN} is retired: {:?}",
        jobs.iter().map(|j| (j.namespace(), j.name_any())).collect::<Vec<_>>()
    );
    if let Some(node) = cluster.node_dir("node-a") {
        let staged = read_tree(&node.join("mnt/ferry/platform/legacy"));
        assert!(dataset.iter().all(|(k, v)| staged.get(k) == Some(v)), "the admin's DataStage staged its data");
    }

    // The tenant's is refused, saying what to change; its old Job stops.
    let refused = status_when(&cluster, &tenants, "legacy", "refused", |s| s.phase == Some(Phase::Failed)).await;
    let failed = refused.conditions.iter().find(|c| c.type_ == "Failed").unwrap();
    assert_eq!(failed.reason, "HostPathNotAllowed");
    assert!(
        failed.message.contains("volume.nodeCache") && failed.message.contains("hostPathNamespaces"),
        "{}",
        failed.message
    );
    let tenant_jobs: Api<Job> = Api::namespaced(admin.clone(), TENANT);
    wait_for(&cluster, "the tenant's old worker Job to be retired", Duration::from_secs(60), || {
        let tenant_jobs = tenant_jobs.clone();
        async move { tenant_jobs.get_opt("legacy-node-a-r1").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(tenant_jobs.get_opt("train").await.unwrap().is_some(), "the tenant's training Job stays");
    // Deleting it keeps its data: no clean-up Job runs on that path.
    tenants.delete("legacy", &Default::default()).await.unwrap();
    wait_for(&cluster, "the refused DataStage to go", Duration::from_secs(60), || {
        let tenants = tenants.clone();
        async move { tenants.get_opt("legacy").await.ok()?.is_none().then_some(()) }
    })
    .await;
    assert!(ferry_e2e::datastage_jobs(&admin, TENANT, "legacy", names::CLEANUP).await.is_empty());
    if let Some(node) = cluster.node_dir("node-a") {
        assert_eq!(
            std::fs::read(node.join("mnt/ferry/legacy-team/legacy/kept.txt")).unwrap(),
            b"staged by the earlier release",
            "the refused DataStage's data stays for the admin"
        );
    }
    // Re-created as the message says, onto a NodeCache: staged.
    tenants
        .create(
            &PostParams::default(),
            &datastage(
                "legacy",
                json!({"source": source, "placement": on_node_a,
            "destination": {"volume": {"nodeCache": NODE_CACHE}}}),
            ),
        )
        .await
        .unwrap();
    let staged = status_when(&cluster, &tenants, "legacy", "Succeeded on the NodeCache", succeeded).await;
    assert_eq!(staged.claim_name.as_deref(), Some("ferry-legacy"));
    if let Some(dir) = cache_dir(&cluster, "node-a", TENANT, "legacy") {
        assert!(read_tree(&dir) == dataset, "the tenant's data, in its NodeCache directory");
    }
    cluster.stop().await;
}

/// 5. An empty allow-list: the chart refuses the value, and the operator
/// refuses to start with the flag it once rendered.
#[test]
fn an_empty_host_path_allow_list_is_refused_before_it_can_allow_every_path() {
    let tools = Tools::new(Path::new("/nonexistent"));
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(values.path(), "allowedHostPaths: []\n").unwrap();
    let chart = repo_root().join("charts/ferry");
    let error = tools
        .helm(&["template", "ferry", chart.to_str().unwrap(), "-f", values.path().to_str().unwrap()])
        .expect_err("helm renders an empty allow-list");
    assert!(error.contains("allowedHostPaths") && error.contains("minItems"), "{error}");
    let output = std::process::Command::new(ferry_e2e::workspace_binary("ferry-operator"))
        .args(["--allowed-host-paths="])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("run ferry-operator");
    assert!(!output.status.success(), "the operator started with an empty allow-list");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("would allow every path"), "{stderr}");
}

/// Opens the test's descriptor limit to its hard limit: the flood holds
/// hundreds of sockets.
fn raise_open_file_limit() {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit { current: limit.maximum, maximum: limit.maximum };
    let _ = rustix::process::setrlimit(rustix::process::Resource::Nofile, raised);
}
