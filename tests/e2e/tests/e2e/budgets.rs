//! Many DataStages, one bucket, a store that throttles: 20 DataStages, each
//! staging onto both nodes (40 workers), pull one dataset from a MinIO that
//! serves at most [`STORE_REQUESTS_MAX`] requests at a time and answers the
//! rest with SlowDown. Three rounds on the same cluster and data:
//! - **budget**: a StoreBudget caps the bucket; the operator splits it
//!   among the running workers, who follow their share. Throttled requests
//!   stay below 1% and every DataStage succeeds.
//! - **auto**: no budget, adaptive concurrency: the workers back off when
//!   throttled (a throttle is not a failed attempt) and every DataStage
//!   succeeds.
//! - **fixed** (`FERRY_LONG=1` only): no budget, a fixed 8 requests in
//!   flight per worker: the uncoordinated baseline, reported.
//!
//! Each round prints the time until all 20 finished, the requests the
//! workers sent and how many the store throttled, from the workers' own
//! summaries (their pods' termination messages). `FERRY_LONG=1` stages
//! ten times the objects and adds the fixed round.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::long;

use clap::Parser as _;
use ferry_contract::{StagerCli, StagerCommand, Summary};
use ferry_crds::{DataStage, Phase, StoreBudget};
use ferry_e2e::{Cluster, create_namespace, install_crd, let_workers_report, start_operator_with, wait_for};
use ferry_testkit::{S3Server, pattern, read_tree};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::{Value, json};

/// DataStages per round; each stages onto both nodes.
const DATASTAGES: usize = 20;
/// Requests MinIO serves at once.
const STORE_REQUESTS_MAX: u32 = 8;
/// Requests per second all workers together may send under the budget.
const BUDGET_REQUESTS_PER_SECOND: i32 = 80;
/// Objects in the dataset: 30, or 300 in the long version.
fn objects() -> u64 {
    if long() { 300 } else { 30 }
}
const NAMESPACE: &str = "ml";

/// What one round measured.
#[derive(Debug, Default)]
struct Round {
    seconds: f64,
    succeeded: usize,
    failed: usize,
    requests: u64,
    throttled: u64,
    /// Throttled requests per DataStage, for those that saw any.
    throttled_by_datastage: BTreeMap<String, u64>,
}

impl Round {
    fn throttled_fraction(&self) -> f64 {
        self.throttled as f64 / self.requests.max(1) as f64
    }
}

struct Setup {
    cluster: Cluster,
    client: kube::Client,
    s3: S3Server,
    files: BTreeMap<String, Vec<u8>>,
    operator: ferry_e2e::process::ManagedProcess,
    _logs: tempfile::TempDir,
}

impl Setup {
    async fn start() -> Self {
        let s3 = S3Server::minio_limited(STORE_REQUESTS_MAX);
        s3.create_bucket("shared").await;
        let mut files = BTreeMap::new();
        for i in 0..objects() {
            // Odd sizes around 64 KiB: the count of requests is what matters.
            files.insert(format!("{i:03}.bin"), pattern(900 + i, 65_536 + 37 * i as usize));
        }
        for (key, data) in &files {
            s3.put("shared", &format!("set/{key}"), data.clone()).await;
        }
        let cluster = Cluster::start().await.expect("cluster");
        let client = cluster.client().await.unwrap();
        install_crd(&cluster).await;
        create_namespace(&cluster, NAMESPACE, &[]).await;
        // Workers report their progress and read back their share.
        let_workers_report(&cluster, NAMESPACE).await;
        let secret: Secret = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key}}))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), NAMESPACE).create(&PostParams::default(), &secret).await.unwrap();
        let logs = tempfile::tempdir().unwrap();
        // Every DataStage pulls the same objects to load the store: with
        // shared objects on the node, all but the first would link them.
        let (operator, _) =
            start_operator_with(&cluster, logs.path(), "operator-1", &[("FERRY_SHARED_HOST_PATHS", "")]);
        Self { cluster, client, s3, files, operator, _logs: logs }
    }

    /// Creates the round's DataStages at once, waits until every one has
    /// finished, and sums what its workers said. `during` runs every poll
    /// while they stage.
    async fn round(&self, name: &str, transfer: Value, mut during: impl FnMut(&[DataStage])) -> Round {
        let datastages: Api<DataStage> = Api::namespaced(self.client.clone(), NAMESPACE);
        let started = Instant::now();
        let creates = (0..DATASTAGES).map(|i| {
            let datastages = datastages.clone();
            let ds: DataStage = serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
                "metadata": {"name": format!("{name}-{i:02}"), "labels": {"round": name}},
                "spec": {"source": {"uri": "s3://shared/set", "endpoint": self.s3.endpoint, "credentials": {"name": "s3"}},
                    "destination": {"volume": {"hostPath": format!("/mnt/ferry/{name}-{i:02}")}},
                    "transfer": transfer}}))
            .unwrap();
            async move { datastages.create(&PostParams::default(), &ds).await.unwrap() }
        });
        futures::future::join_all(creates).await;
        let in_round = ListParams::default().labels(&format!("round={name}"));
        let deadline = started + Duration::from_secs(300);
        let finished = loop {
            let listed = datastages.list(&in_round).await.map(|l| l.items).unwrap_or_default();
            during(&listed);
            let phases: Vec<Phase> =
                listed.iter().filter_map(|ds| ds.status.as_ref()?.phase).filter(|p| p.is_finished()).collect();
            if phases.len() == DATASTAGES {
                break phases;
            }
            assert!(
                Instant::now() < deadline,
                "round {name}: {} of {DATASTAGES} DataStages finished in 300 s\n--- operator ---\n{}\n{}",
                phases.len(),
                self.operator.log_tail(40),
                self.cluster.diagnostics()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let mut round = Round {
            seconds: started.elapsed().as_secs_f64(),
            succeeded: finished.iter().filter(|p| **p == Phase::Succeeded).count(),
            failed: finished.iter().filter(|p| **p == Phase::Failed).count(),
            ..Round::default()
        };
        // Node-local workers run in the workers' namespace, labelled with
        // their DataStage's namespace.
        let of_namespace = format!("ferry.dev/worker,{}={NAMESPACE}", ferry_crds::names::DATASTAGE_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ferry_e2e::WORKERS_NS);
        let workers = pods.list(&ListParams::default().labels(&of_namespace)).await.unwrap().items;
        for pod in workers.iter().filter(|p| p.labels()["ferry.dev/datastage"].starts_with(&format!("{name}-"))) {
            let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
            for terminated in statuses.iter().filter_map(|c| c.state.as_ref()?.terminated.as_ref()) {
                let summary: Summary = serde_json::from_str(terminated.message.as_deref().unwrap_or("{}"))
                    .unwrap_or_else(|e| {
                        panic!("pod {}: not a summary ({e}): {:?}", pod.name_any(), terminated.message)
                    });
                round.requests += summary.requests;
                round.throttled += summary.throttled;
                if summary.throttled > 0 {
                    *round.throttled_by_datastage.entry(pod.labels()["ferry.dev/datastage"].clone()).or_default() +=
                        summary.throttled;
                }
            }
        }
        println!(
            "round {name:6}: {DATASTAGES} DataStages x 2 nodes in {:5.1} s, {:3} succeeded, {:5} requests, {:5} throttled ({:.2}%) {:?}",
            round.seconds,
            round.succeeded,
            round.requests,
            round.throttled,
            100.0 * round.throttled_fraction(),
            round.throttled_by_datastage
        );
        round
    }

    /// Each node's copy of the round's first DataStage matches the bucket.
    fn assert_staged(&self, name: &str) {
        for node in ["node-a", "node-b"] {
            if let Some(root) = self.cluster.node_dir(node) {
                let staged = read_tree(&root.join(format!("mnt/ferry/{name}-00")));
                assert!(staged == self.files, "{node}: {name}-00 is not byte-identical to the bucket");
            }
        }
    }

    /// The requests per second each of the round's DataStages' workers
    /// started with: the `--store-share` of its worker Jobs.
    async fn starting_shares(&self, name: &str) -> BTreeMap<String, u32> {
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), ferry_e2e::WORKERS_NS);
        let of_namespace = format!("ferry.dev/worker,{}={NAMESPACE}", ferry_crds::names::DATASTAGE_NAMESPACE);
        let mut started = BTreeMap::new();
        for job in jobs.list(&ListParams::default().labels(&of_namespace)).await.unwrap().items {
            let datastage = job.labels()["ferry.dev/datastage"].clone();
            if !datastage.starts_with(&format!("{name}-")) {
                continue;
            }
            let args = job.spec.and_then(|s| s.template.spec).and_then(|s| s.containers[0].args.clone());
            // As the kubelet expands them: the pod's IP where the peers listen.
            let pod_ip = format!("$({})", ferry_contract::peers::POD_IP_ENV);
            let args = args.unwrap_or_default().into_iter().map(|arg| arg.replace(&pod_ip, "10.0.0.1"));
            let cli = StagerCli::try_parse_from(std::iter::once("ferry-stager".to_owned()).chain(args))
                .expect("the operator's arguments parse");
            let StagerCommand::Pull { options, .. } = cli.command else { panic!("{datastage}: a pull") };
            if let Some(rate) = options.store_share.and_then(|s| s.requests_per_second) {
                started.insert(datastage, rate);
            }
        }
        started
    }

    async fn delete_round(&self, name: &str) {
        let datastages: Api<DataStage> = Api::namespaced(self.client.clone(), NAMESPACE);
        let in_round = ListParams::default().labels(&format!("round={name}"));
        datastages.delete_collection(&DeleteParams::default(), &in_round).await.unwrap();
        wait_for(&self.cluster, "the round's DataStages to be deleted", Duration::from_secs(120), || {
            let (datastages, in_round) = (datastages.clone(), in_round.clone());
            async move { datastages.list(&in_round).await.ok().filter(|l| l.items.is_empty()).map(|_| ()) }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_datastages_share_a_throttling_bucket_within_a_budget_and_back_off_without_one() {
    let setup = Setup::start().await;
    let budgets: Api<StoreBudget> = Api::all(setup.client.clone());
    let budget: StoreBudget = serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "StoreBudget",
        "metadata": {"name": "shared"},
        "spec": {"uri": "s3://shared", "endpoint": format!("{}/", setup.s3.endpoint),
            "requestsPerSecond": BUDGET_REQUESTS_PER_SECOND}}))
    .unwrap();
    budgets.create(&PostParams::default(), &budget).await.unwrap();

    // 1. With the budget.
    let mut most_workers = 0;
    let mut shares_seen = 0;
    let mut seen = std::collections::BTreeSet::new();
    let mut followed = BTreeMap::new();
    let budgeted = setup
        .round("budget", json!({}), |listed| {
            for ds in listed {
                let Some(share) = ds.status.as_ref().and_then(|s| s.store_budget.as_ref()) else { continue };
                assert_eq!(share.name.as_deref(), Some("shared"), "{}: {share:?}", ds.name_any());
                let per_worker = share.share.requests_per_second.unwrap();
                assert!(
                    i64::from(per_worker) * share.workers <= i64::from(BUDGET_REQUESTS_PER_SECOND),
                    "{}: {per_worker}/s for each of {} workers is over the budget",
                    ds.name_any(),
                    share.workers
                );
                most_workers = most_workers.max(share.workers);
                shares_seen += 1;
                seen.insert((share.workers, per_worker));
                // The lowest share its workers said they follow.
                for worker in &ds.status.as_ref().unwrap().workers {
                    if let Some(rate) = worker.store_share.and_then(|s| s.requests_per_second) {
                        let lowest = followed.entry(ds.name_any()).or_insert(rate);
                        *lowest = rate.min(*lowest);
                    }
                }
            }
        })
        .await;
    println!("splits seen (workers, requests/s each): {seen:?}");
    assert_eq!(budgeted.succeeded, DATASTAGES, "{budgeted:?}");
    // Workers follow the split as it changes: those that started first,
    // with the share of the few workers counted then (their Job's
    // --store-share), came down to the share of many.
    let started = setup.starting_shares("budget").await;
    println!("the share each DataStage's workers started with: {started:?}");
    let came_down: Vec<&String> = followed
        .iter()
        .filter(|(ds, lowest)| started.get(*ds).is_some_and(|first| *lowest < first))
        .map(|(ds, _)| ds)
        .collect();
    assert!(
        !came_down.is_empty(),
        "no worker was seen following a lower share than it started with; started {started:?}, followed {followed:?}"
    );
    assert!(most_workers > 2, "the budget was split among many workers at once (at most {most_workers} seen)");
    assert!(shares_seen > DATASTAGES, "DataStages showed their share while they ran ({shares_seen} sightings)");
    assert!(budgeted.requests >= DATASTAGES as u64 * 2 * objects(), "{budgeted:?}");
    assert!(
        budgeted.throttled_fraction() < 0.01,
        "under the budget the store throttled {} of {} requests; throttled per DataStage {:?}, \
         the share each started with {started:?}",
        budgeted.throttled,
        budgeted.requests,
        budgeted.throttled_by_datastage
    );
    setup.assert_staged("budget");
    let idle = wait_for(&setup.cluster, "the budget to show no workers", Duration::from_secs(30), || {
        let budgets = budgets.clone();
        async move { budgets.get("shared").await.ok()?.status.filter(|s| s.workers == 0) }
    })
    .await;
    assert_eq!(idle.conditions[0].reason, "Split");
    assert!(idle.throttled_requests as u64 <= budgeted.throttled, "{idle:?}");
    setup.delete_round("budget").await;
    budgets.delete("shared", &DeleteParams::default()).await.unwrap();

    // 2. Without: adaptive workers back off together and all succeed.
    let auto = setup.round("auto", json!({}), |_| {}).await;
    assert_eq!(auto.succeeded, DATASTAGES, "without a budget every DataStage still succeeds: {auto:?}");
    setup.assert_staged("auto");
    setup.delete_round("auto").await;

    println!(
        "finish all {DATASTAGES}: budget {:.1} s ({:.2}% throttled), auto {:.1} s ({:.1}%)",
        budgeted.seconds,
        100.0 * budgeted.throttled_fraction(),
        auto.seconds,
        100.0 * auto.throttled_fraction(),
    );
    // 3. The uncoordinated baseline: fixed concurrency, reported beside the
    // two above. It asserts nothing, so it runs in the long version only,
    // where its figures are worth a third of the scenario's time.
    if long() {
        let fixed = setup.round("fixed", json!({"concurrency": 8}), |_| {}).await;
        println!(
            "fixed 8: finish all {DATASTAGES} {:.1} s ({:.1}% throttled, {} failed)",
            fixed.seconds,
            100.0 * fixed.throttled_fraction(),
            fixed.failed
        );
    }
    setup.cluster.stop().await;
}
