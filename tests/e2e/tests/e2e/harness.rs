//! The harness itself, proven: a real control plane comes up and down
//! cleanly; a Job runs a real stager pull through the real Job controller and
//! scheduler onto the node it was pinned to; Pod Security admission refuses
//! a violating pod; deleting a Job garbage-collects its pods and stops their
//! processes.

use std::time::Duration;

use ferry_e2e::{Cluster, create_namespace, image, object_store, wait_for};
use ferry_testkit::{pattern, read_tree};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

fn job(value: serde_json::Value) -> Job {
    serde_json::from_value(value).expect("valid Job")
}

fn process_alive(pid: u32) -> bool {
    // A zombie has exited; only its entry remains until it is reaped.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_harness_comes_up_and_down_cleanly_three_times() {
    if std::env::var_os("FERRY_E2E_KUBECONFIG").is_some() {
        eprintln!("skipped: this test starts its own control plane");
        return;
    }
    for round in 1..=3 {
        let cluster = Cluster::start().await.unwrap_or_else(|e| panic!("round {round}: {e}"));
        let nodes: Api<Node> = Api::all(cluster.client().await.unwrap());
        let ready = |node: &Node| {
            node.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        wait_for(&cluster, "both nodes Ready", Duration::from_secs(30), || {
            let nodes = nodes.clone();
            async move {
                let list = nodes.list(&ListParams::default()).await.ok()?;
                (list.items.len() == 2 && list.items.iter().all(ready)).then_some(())
            }
        })
        .await;
        let control_plane = cluster.control_plane().expect("a local cluster");
        let pids = control_plane.pids();
        let dir = control_plane.dir().to_path_buf();
        cluster.stop().await;
        for pid in pids {
            assert!(!process_alive(pid), "round {round}: process {pid} outlived the harness");
        }
        assert!(!dir.exists(), "round {round}: {} was left behind", dir.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_runs_a_stager_pull_on_the_node_it_is_pinned_to() {
    let s3 = object_store();
    s3.create_bucket("datasets").await;
    let mut files = std::collections::BTreeMap::new();
    for i in 0..20 {
        files.insert(format!("shards/{i:03}.bin"), pattern(i, 100_000 + i as usize));
    }
    files.insert("big.bin".to_owned(), pattern(99, 20 << 20));
    for (key, data) in &files {
        s3.put("datasets", &format!("imagenet/{key}"), data.clone()).await;
    }

    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    create_namespace(&cluster, "staging", &[]).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "staging");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}});
    secrets.create(&PostParams::default(), &serde_json::from_value(secret).unwrap()).await.unwrap();

    let jobs: Api<Job> = Api::namespaced(client.clone(), "staging");
    let pull = job(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pull-imagenet"},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"ferry.dev/e2e-node": "node-b"},
            "containers": [{
                "name": "stager",
                "image": image("ferry-stager"),
                "args": ["pull", "s3://datasets/imagenet", "/data/imagenet", "--endpoint-url", s3.endpoint,
                         "--summary-file", "/data/summary.json", "--log-format", "json"],
                "envFrom": [{"secretRef": {"name": "s3"}}],
                "env": [{"name": "AWS_REGION", "value": "us-east-1"}],
                "volumeMounts": [{"name": "local", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "local", "hostPath": {"path": "/mnt/ferry", "type": "DirectoryOrCreate"}}],
        }}},
    }));
    jobs.create(&PostParams::default(), &pull).await.unwrap();
    wait_for(&cluster, "the Job to complete", Duration::from_secs(120), || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get("pull-imagenet").await.ok()?;
            let conditions = job.status?.conditions?;
            assert!(
                !conditions.iter().any(|c| c.type_ == "Failed" && c.status == "True"),
                "the Job failed: {conditions:?}"
            );
            conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True").then_some(())
        }
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client, "staging");
    let pod = pods.list(&ListParams::default().labels("job-name=pull-imagenet")).await.unwrap().items.remove(0);
    assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("node-b"));
    // On a real cluster the nodes' disks are out of reach; the Job's success
    // (the stager exits 0 only when every object is in place and verified)
    // and its placement are what can be checked from here.
    if let (Some(node_b), Some(node_a)) = (cluster.node_dir("node-b"), cluster.node_dir("node-a")) {
        assert_eq!(
            read_tree(&node_b.join("mnt/ferry/imagenet")),
            files,
            "node-b's disk holds the dataset, byte for byte"
        );
        assert!(!node_a.join("mnt").exists(), "nothing landed on node-a");
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(node_b.join("mnt/ferry/summary.json")).unwrap()).unwrap();
        assert_eq!(summary["objects"]["transferred"], json!(files.len()));
    }
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_security_admission_refuses_a_pod_that_violates_restricted() {
    let cluster = Cluster::start().await.expect("cluster");
    create_namespace(&cluster, "locked", &[("pod-security.kubernetes.io/enforce", "restricted")]).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client().await.unwrap(), "locked");
    // (Privileged containers are already refused by --allow-privileged=false;
    // this pod is valid and only Pod Security admission stands in its way.)
    let violating: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root"},
        "spec": {"containers": [{"name": "sh", "image": image("ferry-e2e-shell"), "command": ["sh", "-c", "true"],
                                  "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}],
                 "volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
    }))
    .unwrap();
    let error = pods.create(&PostParams::default(), &violating).await.expect_err("the pod must be refused");
    let kube::Error::Api(status) = error else { panic!("unexpected error: {error}") };
    assert_eq!(status.code, 403, "{status:?}");
    assert!(status.message.contains("violates PodSecurity \"restricted:latest\""), "{}", status.message);
    for violation in ["allowPrivilegeEscalation != false", "NET_ADMIN", "hostPath", "runAsUser=0", "seccompProfile"] {
        assert!(status.message.contains(violation), "missing {violation:?} in {}", status.message);
    }

    let compliant: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ok"},
        "spec": {"restartPolicy": "Never",
                 "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "sh", "image": image("ferry-e2e-shell"), "command": ["sh", "-c", "true"],
                                  "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &compliant).await.expect("a restricted-compliant pod is admitted");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_job_collects_its_pods_and_stops_their_processes() {
    let cluster = Cluster::start().await.expect("cluster");
    let client = cluster.client().await.unwrap();
    create_namespace(&cluster, "gc", &[]).await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "gc");
    let sleeper = job(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sleeper"},
        "spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "sh", "image": image("ferry-e2e-shell"),
                             // `$$$$` is `$$` after Kubernetes' own `$(VAR)` expansion.
                             "command": ["sh", "-c", "echo $$$$ > \"$PIDFILE\"; exec sleep 600"],
                             "env": [{"name": "PIDFILE", "value": "/work/pid"}],
                             "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
            "volumes": [{"name": "work", "emptyDir": {}}],
        }}},
    }));
    jobs.create(&PostParams::default(), &sleeper).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "gc");
    let (node, uid) = wait_for(&cluster, "the pod to run", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let pod = pods.list(&ListParams::default().labels("job-name=sleeper")).await.ok()?.items.pop()?;
            let running = pod.status.as_ref()?.phase.as_deref() == Some("Running");
            running.then(|| (pod.spec.unwrap().node_name.unwrap(), pod.metadata.uid.unwrap()))
        }
    })
    .await;
    // The process is only visible when the node is this machine.
    let pid: Option<u32> = match cluster.node_dir(&node) {
        Some(node_dir) => {
            let pid_file = node_dir.join("pods").join(&uid).join("volumes/work/pid");
            let pid = wait_for(&cluster, "the pid file", Duration::from_secs(30), || {
                let text = std::fs::read_to_string(&pid_file).ok();
                async move { text?.trim().parse().ok() }
            })
            .await;
            assert!(process_alive(pid));
            Some(pid)
        }
        None => None,
    };

    jobs.delete("sleeper", &DeleteParams::background()).await.unwrap();
    wait_for(&cluster, "the garbage collector to remove the pod", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move { pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(()) }
    })
    .await;
    if let Some(pid) = pid {
        wait_for(&cluster, "the process to stop", Duration::from_secs(10), || async move {
            (!process_alive(pid)).then_some(())
        })
        .await;
    }
    cluster.stop().await;
}
