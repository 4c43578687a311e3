//! The controller's pure parts, tested without a cluster.

use ferry_crds::{DataStage, DataStageStatus, Fanout, Phase, ReclaimPolicy, WorkerStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use serde_json::json;

use super::writes::now;
use super::*;
use crate::jobs::build_job;
use crate::status::reasons;
use crate::worker::Worker;

const WORKER_LABEL: &str = ferry_crds::names::WORKER;

fn ds(host_path: &str, uri: &str) -> DataStage {
    serde_json::from_value(json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "n", "uid": "u"},
        "spec": {"source": {"uri": uri}, "destination": {"volume": {"hostPath": host_path}}},
    }))
    .unwrap()
}

#[test]
fn api_errors_are_categorised_by_status_into_the_pre_registered_reasons() {
    let api = |code: u16| {
        Error::Kube(kube::Error::Api(
            serde_json::from_value(json!({"status": "Failure", "message": "m", "reason": "r", "code": code})).unwrap(),
        ))
    };
    assert_eq!(api(403).category(), "Forbidden");
    assert_eq!(api(409).category(), "Conflict");
    assert_eq!(api(503).category(), "ServerError");
    for code in [400, 401, 403, 404, 409, 422, 429, 500, 504] {
        assert!(crate::metrics::RECONCILE_ERROR_REASONS.contains(&api(code).category()), "{code}");
    }
}

#[test]
fn only_pulls_with_reclaim_delete_are_cleaned_and_only_where_nodes_remain() {
    let mut pull = ds("/mnt/x", "s3://b/p");
    assert!(!needs_cleanup(&pull), "Retain is the default");
    pull.spec.reclaim_policy = Some(ReclaimPolicy::Delete);
    assert!(needs_cleanup(&pull));
    let mut push = pull.clone();
    std::mem::swap(&mut push.spec.source, &mut push.spec.destination);
    assert!(!needs_cleanup(&push), "a push's volume is the user's source");

    pull.status = Some(
        serde_json::from_value(json!({"workers": [
        {"name": "node-a", "node": "node-a"}, {"name": "node-gone", "node": "node-gone"}]}))
        .unwrap(),
    );
    let targets = cleanup_targets(&pull, &["node-a".to_owned(), "node-b".to_owned()]);
    assert_eq!(targets, [Worker::on_node("node-a")]);
}

#[test]
fn a_push_from_a_host_path_needs_exactly_one_node_and_a_pull_takes_them_all() {
    let mut push = ds("/mnt/x", "s3://b/p");
    std::mem::swap(&mut push.spec.source, &mut push.spec.destination);
    let plan = push.spec.plan().unwrap();
    let nodes = ["a".to_owned(), "b".to_owned()];
    let refused = per_node_workers(&plan, &nodes).unwrap_err();
    assert_eq!(refused.reason, reasons::AMBIGUOUS_PUSH_SOURCE);
    assert!(refused.message.contains("matches 2 nodes (a, b)"), "{}", refused.message);
    assert_eq!(per_node_workers(&plan, &nodes[..1]), Ok(vec![Worker::on_node("a")]));
    let pull = ds("/mnt/x", "s3://b/p");
    assert_eq!(per_node_workers(&pull.spec.plan().unwrap(), &nodes).unwrap().len(), 2);
    assert_eq!(per_node_workers(&pull.spec.plan().unwrap(), &[]).unwrap_err().reason, reasons::NO_MATCHING_NODES);
}

#[test]
fn a_node_that_joins_gets_a_job_with_the_larger_group_and_running_jobs_are_left_alone() {
    use crate::jobs::WorkerDefaults;
    let pull = ds("/mnt/x", "s3://b/p");
    let plan = pull.spec.plan().unwrap();
    assert_eq!(plan.fanout, Fanout::PeerToPeer);
    let defaults = WorkerDefaults::image("stager:1");
    let group_of = |job: &Job| {
        let args = job.spec.clone().unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
        args.into_iter().find(|a| a.starts_with("--peer-group=")).unwrap()
    };
    let before = per_node_workers(&plan, &["a".to_owned(), "b".to_owned()]).unwrap();
    let running: Vec<Job> = before.iter().map(|w| build_job(&pull, &plan, w, &before, 1, &defaults)).collect();
    assert!(running.iter().all(|job| group_of(job) == "--peer-group=a,b"));

    // Node c joins: only it gets a Job, naming all three.
    let after = per_node_workers(&plan, &["a".to_owned(), "b".to_owned(), "c".to_owned()]).unwrap();
    let starting = workers_to_start(&after, &running, &[], 1);
    assert_eq!(starting, [&Worker::on_node("c")]);
    assert_eq!(group_of(&build_job(&pull, &plan, starting[0], &after, 1, &defaults)), "--peer-group=a,b,c");

    // A worker that finished the run is not started again once its Job is gone;
    // a new run starts every worker afresh.
    let finished =
        WorkerStatus { name: "a".into(), run: Some(1), phase: Some(Phase::Succeeded), ..WorkerStatus::default() };
    let recorded = [finished];
    assert_eq!(workers_to_start(&after, &running[1..], &recorded, 1), [&Worker::on_node("c")]);
    assert_eq!(workers_to_start(&after, &[], &recorded, 2).len(), 3);
}

#[test]
fn a_departed_node_keeps_its_entry_but_the_operator_never_writes_a_peer_address() {
    let mut pull = ds("/mnt/x", "s3://b/p");
    pull.status = Some(
        serde_json::from_value(json!({"workers": [
            {"name": "gone", "node": "gone", "peerAddress": "10.0.0.9:9466", "bytesDone": 5}]}))
        .unwrap(),
    );
    let plan = pull.spec.plan().unwrap();
    let departed_entries = departed(&pull, &[Worker::on_node("a")], &plan, &[]);
    assert_eq!((departed_entries[0].name.as_str(), departed_entries[0].bytes_done), ("gone", 5));
    assert_eq!(departed_entries[0].peer_address, None);
    assert_eq!(departed_entries[0].phase, None, "as recorded, without a Job");

    // A worker left to run on a node that stopped matching (cordoned):
    // its entry follows its Job to the end, not before.
    let job = |conditions: serde_json::Value| -> Job {
        serde_json::from_value(json!({"metadata": {"name": "d-gone-r1", "labels": {WORKER_LABEL: "gone"}},
            "status": {"active": 1, "startTime": "2026-01-01T00:00:00Z", "conditions": conditions}}))
        .unwrap()
    };
    let running = departed(&pull, &[Worker::on_node("a")], &plan, &[job(json!([]))]);
    assert_eq!(running[0].phase, None, "a running Job changes nothing");
    let done = job(json!([{"type": "Complete", "status": "True"}]));
    let finished = departed(&pull, &[Worker::on_node("a")], &plan, &[done]);
    assert_eq!(finished[0].phase, Some(Phase::Succeeded));
    assert!(finished[0].message.as_deref().is_some_and(|m| m.contains("no longer matches")), "still marked");
}

#[test]
fn only_jobs_pinned_to_nodes_that_no_longer_exist_are_retired() {
    use crate::jobs::WorkerDefaults;
    let pull = ds("/mnt/x", "s3://b/p");
    let plan = pull.spec.plan().unwrap();
    let workers = per_node_workers(&plan, &["a".to_owned(), "b".to_owned(), "c".to_owned()]).unwrap();
    let defaults = WorkerDefaults::image("stager:1");
    let mut jobs: Vec<Job> = workers.iter().map(|w| build_job(&pull, &plan, w, &workers, 1, &defaults)).collect();
    // c's Job is being deleted already; a claim's worker has no node.
    jobs[2].metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    let recorded: Vec<WorkerStatus> = serde_json::from_value(json!([
        {"name": "a", "node": "a"}, {"name": "b", "node": "b"}, {"name": "c", "node": "c"}]))
    .unwrap();
    let exists = |node: &str| node == "a";
    assert_eq!(
        jobs_on_deleted_nodes(&recorded, &jobs, exists),
        [(jobs[1].name_any(), "b".to_owned())],
        "b is gone; a exists; c's Job is going already"
    );
    assert!(jobs_on_deleted_nodes(&[], &jobs, exists).is_empty(), "no recorded node, no retirement");
    assert!(jobs_on_deleted_nodes(&recorded, &jobs, |_| true).is_empty(), "cordoned or relabelled: left alone");
}

#[test]
fn a_status_is_applied_unless_the_datastage_shows_exactly_it_but_the_workers_own_addresses() {
    let computed: DataStageStatus = serde_json::from_value(json!({
        "phase": "Running", "run": 2,
        "workers": [{"name": "a", "node": "a", "bytesDone": 10, "run": 2}]}))
    .unwrap();
    assert!(!applies_nothing(&computed, None), "a DataStage without status gets one");
    let mut shown = computed.clone();
    shown.workers[0].peer_address = Some("10.0.0.1:9466".into());
    assert!(applies_nothing(&computed, Some(&shown)), "the worker's address is not the operator's to write");
    shown.workers[0].bytes_done = 11;
    assert!(!applies_nothing(&computed, Some(&shown)));
    let mut scheduled = computed.clone();
    scheduled.next_sync_time = Some(now());
    assert!(!applies_nothing(&computed, Some(&scheduled)), "a field the operator drops must be removed");
}
