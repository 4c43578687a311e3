//! Reliability and scale on the real control plane (docs/reliability.md):
//! many DataStages at once, and stagings that go on through crashes of the
//! operator, the API server, etcd, the object store and worker pods.
//!
//! Each scenario runs small by default (it is part of `hack/test.sh`) and
//! at full size with `FERRY_LONG=1`. The figures a run measures are printed
//! as one `reliability:` JSON line per scenario, which the report quotes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::long;

use ferry_contract::Reason;
use ferry_crds::conditions::reasons;
use ferry_crds::names::DATASTAGE as DATASTAGE_LABEL;
use ferry_crds::names::DataStageKey;
use ferry_crds::{DataStage, Phase};
use ferry_e2e::process::ManagedProcess;
use ferry_e2e::{
    Cluster, NODES, OPERATOR_EXITED, create_namespace, install_crd, object_store, start_operator,
    start_operator_restarted, wait_for, wait_for_telling,
};
use ferry_testkit::{S3Server, pattern, read_tree};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use kube::{Api, ResourceExt as _};
use serde_json::json;

/// How a [`Bench`] starts its operator.
type StartOperator = fn(&Cluster, &std::path::Path, &str) -> (ManagedProcess, String);

/// A cluster with the CRD, an operator, and a store holding `files` under
/// `s3://datasets/data/`.
struct Bench {
    cluster: Cluster,
    s3: S3Server,
    client: kube::Client,
    files: BTreeMap<String, Vec<u8>>,
    logs: tempfile::TempDir,
    operator: ManagedProcess,
    operator_metrics: String,
}

impl Bench {
    async fn start(files: BTreeMap<String, Vec<u8>>) -> Self {
        Self::start_with(files, start_operator).await
    }

    /// [`Bench::start`] with the operator started by `operator`.
    async fn start_with(files: BTreeMap<String, Vec<u8>>, operator: StartOperator) -> Self {
        let s3 = object_store();
        s3.create_bucket("datasets").await;
        for (key, data) in &files {
            s3.put("datasets", &format!("data/{key}"), data.clone()).await;
        }
        let cluster = Cluster::start().await.expect("cluster");
        let client = cluster.client().await.unwrap();
        install_crd(&cluster).await;
        let logs = tempfile::tempdir().unwrap();
        let (operator, operator_metrics) = operator(&cluster, logs.path(), "operator-1");
        Self { cluster, s3, client, files, logs, operator, operator_metrics }
    }

    /// Namespace `name` with the store's credentials in Secret `s3`.
    async fn namespace(&self, name: &str) {
        create_namespace(&self.cluster, name, &[]).await;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
            "stringData": {"AWS_ACCESS_KEY_ID": self.s3.access_key, "AWS_SECRET_ACCESS_KEY": self.s3.secret_key}});
        Api::<Secret>::namespaced(self.client.clone(), name)
            .create(&PostParams::default(), &serde_json::from_value(secret).unwrap())
            .await
            .unwrap();
    }

    /// A pull of the dataset onto `node` at `/mnt/ferry/<namespace>/<name>`.
    fn pull(&self, namespace: &str, name: &str, node: &str) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "source": {"uri": "s3://datasets/data", "endpoint": self.s3.endpoint, "credentials": {"name": "s3"}},
                "destination": {"volume": {"hostPath": format!("/mnt/ferry/{namespace}/{name}")}},
                "placement": {"nodeSelector": {"ferry.dev/e2e-node": node}},
            },
        }))
        .unwrap()
    }

    /// A pull of the dataset onto `node` at `host_path`, capped at
    /// `bandwidth` bytes per second so that it is still running when a
    /// fault strikes.
    fn slow_pull(&self, namespace: &str, name: &str, node: &str, host_path: &str, bandwidth: u64) -> DataStage {
        let mut ds = serde_json::to_value(self.pull(namespace, name, node)).unwrap();
        ds["spec"]["destination"]["volume"]["hostPath"] = json!(host_path);
        ds["spec"]["transfer"] = json!({"maxBandwidth": bandwidth.to_string()});
        serde_json::from_value(ds).unwrap()
    }

    /// How many times the operator exited by itself and was started again
    /// ([`start_operator_restarted`]). Panics on an exit other than the
    /// operator's own, saying why (status 1): a panic or a signal is a crash.
    fn operator_exits(&self) -> usize {
        let log = std::fs::read_to_string(self.operator.log_path()).unwrap_or_default();
        let exits: Vec<&str> = log.lines().filter_map(|l| l.strip_prefix(OPERATOR_EXITED)).map(str::trim).collect();
        assert!(
            exits.iter().all(|status| *status == "1"),
            "the operator crashed (exit statuses {exits:?}):\n{}",
            self.operator.log_tail(60)
        );
        exits.len()
    }

    /// Waits until DataStage `namespace/name` shows `reason` on its
    /// Progressing condition, and returns that condition's message.
    async fn wait_progressing_reason(&self, namespace: &str, name: &str, reason: &str, deadline: Duration) -> String {
        let api: Api<DataStage> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("{namespace}/{name} to report {reason}");
        wait_for(&self.cluster, &what, deadline, || {
            let api = api.clone();
            async move {
                let status = api.get(name).await.ok()?.status?;
                let progressing = status.conditions.iter().find(|c| c.type_ == "Progressing")?;
                (progressing.status == "True" && progressing.reason == reason).then(|| progressing.message.clone())
            }
        })
        .await
    }

    /// Waits until a worker pod of DataStage `name` runs in `namespace`,
    /// and returns that pod's name.
    async fn wait_worker_running(&self, namespace: &str, name: &str) -> String {
        let what = format!("a worker of {namespace}/{name} running");
        // Which step it waits on (no Job, a Job without a pod, a pod not
        // started), and whether the operator is there to take the next one.
        let children_and_operator = async || {
            let children = self.children(namespace, name).await;
            format!("--- {namespace}/{name} ---\n{children}\n--- operator ---\n{}", self.operator.log_tail(40))
        };
        wait_for_telling(&self.cluster, &what, Duration::from_secs(120), children_and_operator, || {
            let client = self.client.clone();
            async move {
                let pods: Vec<Pod> =
                    ferry_e2e::datastage_pods(&client, namespace, name, ferry_crds::names::WORKER).await;
                pods.iter().find(|p| is_running(p)).map(|p| p.name_any())
            }
        })
        .await
    }

    /// Every DataStage of `stages`, once all have finished: panics with the
    /// unfinished ones' status after `deadline`.
    async fn wait_finished(&self, stages: &[(String, String)], deadline: Duration) -> Vec<DataStage> {
        // From a watch, not a LIST every half second: a consistent LIST of
        // 1,000 DataStages is a read of all of them from etcd, re-encoded,
        // and at that rate it took a share of the API server's two cores
        // that the scale figures then counted against the operator. The
        // watch is renewed every 50 s, like the operator's, so a watch
        // left silent by an etcd restart does not stop the wait.
        let (reader, writer) = reflector::store::<DataStage>();
        let config = watcher::Config::default().timeout(50);
        let watch = watcher(Api::<DataStage>::all(self.client.clone()), config)
            .default_backoff()
            .reflect(writer)
            .for_each(|_| async {});
        // Aborted when the wait returns or panics: no watch is left behind.
        let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(watch));
        let started = Instant::now();
        loop {
            let wanted: Vec<DataStage> = reader
                .state()
                .into_iter()
                .filter(|d| stages.contains(&(d.namespace().unwrap_or_default(), d.name_any())))
                .map(|d| (*d).clone())
                .collect();
            let unfinished: Vec<&DataStage> =
                wanted.iter().filter(|d| !phase(d).is_some_and(Phase::is_finished)).collect();
            if wanted.len() == stages.len() && unfinished.is_empty() {
                return wanted;
            }
            if started.elapsed() > deadline {
                let mut shown = Vec::new();
                for d in unfinished.iter().take(5) {
                    let (namespace, name) = (d.namespace().unwrap_or_default(), d.name_any());
                    shown.push(format!(
                        "{namespace}/{name}: {}\n{}",
                        json!(d.status),
                        self.children(&namespace, &name).await
                    ));
                }
                if let Ok(keep) = std::env::var("FERRY_E2E_KEEP_LOGS") {
                    let _ = std::fs::copy(self.operator.log_path(), keep);
                }
                panic!(
                    "{} of {} DataStages unfinished after {deadline:?}, e.g.\n{}\n--- operator ---\n{}\n{}",
                    unfinished.len() + stages.len() - wanted.len(),
                    stages.len(),
                    shown.join("\n"),
                    self.operator.log_tail(40),
                    self.cluster.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// When each step towards DataStage `namespace/name`'s first running
    /// worker happened, in seconds after the DataStage was created (the API
    /// server's timestamps, to the second): its Job made by the operator,
    /// the pod by the Job controller, the pod bound by the scheduler, its
    /// container started on the node. Names the component a slow start
    /// waited on.
    async fn worker_timeline(&self, namespace: &str, name: &str) -> serde_json::Value {
        let api: Api<DataStage> = Api::namespaced(self.client.clone(), namespace);
        let created = api.get(name).await.ok().and_then(|d| d.metadata.creation_timestamp);
        let jobs: Vec<Job> = ferry_e2e::datastage_jobs(&self.client, namespace, name, ferry_crds::names::WORKER).await;
        let pods: Vec<Pod> = ferry_e2e::datastage_pods(&self.client, namespace, name, ferry_crds::names::WORKER).await;
        let pod = pods.iter().find(|p| is_running(p));
        let status = pod.and_then(|p| p.status.as_ref());
        let scheduled = status.and_then(|s| {
            let conditions = s.conditions.as_ref()?;
            conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "True")?.last_transition_time.clone()
        });
        let started = status.and_then(|s| s.start_time.clone());
        let after = |time: Option<Time>| -> Option<i64> { Some(time?.0.duration_since(created.as_ref()?.0).as_secs()) };
        json!({
            "job": after(jobs.iter().filter_map(|j| j.metadata.creation_timestamp.clone()).min_by_key(|t| t.0)),
            "pod": after(pod.and_then(|p| p.metadata.creation_timestamp.clone())),
            "scheduled": after(scheduled),
            "started": after(started),
        })
    }

    /// The Jobs and pods of a DataStage in a line each, for failure reports.
    async fn children(&self, namespace: &str, name: &str) -> String {
        let jobs: Vec<Job> = ferry_e2e::datastage_jobs(&self.client, namespace, name, DATASTAGE_LABEL).await;
        let pods: Vec<Pod> = ferry_e2e::datastage_pods(&self.client, namespace, name, DATASTAGE_LABEL).await;
        let mut lines = Vec::new();
        for job in jobs {
            lines.push(format!("  job {}: {}", job.name_any(), json!(job.status)));
        }
        for pod in pods {
            let status = pod.status.as_ref();
            lines.push(format!(
                "  pod {}: phase {:?}, deleting {}, finalizers {:?}, containers {}",
                pod.name_any(),
                status.and_then(|s| s.phase.clone()),
                pod.metadata.deletion_timestamp.is_some(),
                pod.metadata.finalizers,
                json!(status.and_then(|s| s.container_statuses.clone()))
            ));
        }
        lines.join("\n")
    }

    /// Asserts that every DataStage succeeded with a status that counts the
    /// whole dataset, that its node holds the dataset byte for byte at
    /// `/mnt/ferry/<namespace>/<name>`, and that it has exactly one Job (one
    /// worker, one run).
    async fn assert_staged_once(&self, finished: &[DataStage]) {
        let at = |namespace: &str, name: &str| format!("mnt/ferry/{namespace}/{name}");
        self.assert_staged_once_at(finished, at).await;
    }

    /// [`Bench::assert_staged_once`] with the data at `at(namespace, name)`
    /// below the node's root.
    async fn assert_staged_once_at(&self, finished: &[DataStage], at: impl Fn(&str, &str) -> String) {
        let bytes: u64 = self.files.values().map(|f| f.len() as u64).sum();
        let jobs = Api::<Job>::all(self.client.clone()).list(&ListParams::default().labels(DATASTAGE_LABEL)).await;
        let mut jobs_per_stage: HashMap<(String, String), usize> = HashMap::new();
        for job in jobs.unwrap().items {
            let Some(stage) = DataStageKey::from_labels(job.metadata.namespace.as_deref(), job.labels()) else {
                continue;
            };
            *jobs_per_stage.entry((stage.namespace, stage.name)).or_default() += 1;
        }
        for ds in finished {
            let (namespace, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
            let status = ds.status.as_ref().unwrap();
            assert_eq!(status.phase, Some(Phase::Succeeded), "{namespace}/{name}: {}", json!(status));
            let worker = &status.workers[..];
            assert_eq!(worker.len(), 1, "{namespace}/{name}: one worker: {}", json!(status));
            assert_eq!(
                (worker[0].objects_done, worker[0].bytes_done),
                (self.files.len() as i64, bytes as i64),
                "{namespace}/{name}: the status counts the whole dataset"
            );
            let node = worker[0].node.as_deref().unwrap();
            let staged = read_tree(&self.cluster.node_dir(node).unwrap().join(at(&namespace, &name)));
            assert!(staged == self.files, "{namespace}/{name}: the data on {node} differs from the store");
            assert_eq!(jobs_per_stage.get(&(namespace.clone(), name.clone())), Some(&1), "{namespace}/{name}: Jobs");
        }
    }

    /// The operator's `/metrics`.
    async fn operator_metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.operator_metrics)).await.unwrap().text().await.unwrap()
    }

    /// Requests the API server has served, by verb and resource
    /// (`resource/subresource`), from its own metrics.
    async fn api_requests(&self) -> BTreeMap<(String, String), f64> {
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = self.client.request_text(request).await.expect("the API server's metrics");
        let mut counts = BTreeMap::new();
        for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
            let Some((labels, value)) = line.rsplit_once(' ') else { continue };
            let label = |name: &str| {
                let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
                Some(labels[start..].split('"').next()?.to_owned())
            };
            let (Some(verb), Some(resource)) = (label("verb"), label("resource")) else { continue };
            let resource = match label("subresource").filter(|s| !s.is_empty()) {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource,
            };
            *counts.entry((verb, resource)).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
        counts
    }
}

fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn phase(ds: &DataStage) -> Option<Phase> {
    ds.status.as_ref()?.phase
}

/// The highest resident memory of process `pid` so far, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The `q` quantile of a Prometheus histogram as the upper bound of the
/// bucket it falls in (what `histogram_quantile` would interpolate within).
fn histogram_quantile(exposition: &str, name: &str, q: f64) -> Option<f64> {
    bucket_quantile(&histogram_buckets(exposition, name), q)
}

/// The cumulative buckets of histogram `name` in `exposition`, as (upper
/// bound, count) by bound.
fn histogram_buckets(exposition: &str, name: &str) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&format!("{name}_bucket{{le=\""))?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// Histogram `name` of what was observed between two expositions of the
/// same process: `after`'s buckets less `before`'s.
fn histogram_between(before: &str, after: &str, name: &str) -> Vec<(f64, f64)> {
    let before = histogram_buckets(before, name);
    histogram_buckets(after, name)
        .into_iter()
        .map(|(le, n)| (le, n - before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1)))
        .collect()
}

/// The upper bound of the bucket holding the `q` quantile of cumulative
/// `buckets`; `None` when nothing was observed.
fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets.iter().find(|(_, count)| *count >= q * total).map(|(le, _)| *le)
}

/// The sum of every series of counter `name` (all label values).
fn counter_sum(exposition: &str, name: &str) -> f64 {
    exposition
        .lines()
        .filter(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .filter_map(|line| line.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// The `q` quantile of `values` (nearest rank).
fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

/// Requests of `after` less those of `before`, by verb and resource,
/// leaving out those that did not change.
fn delta(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(key, n)| (key.clone(), n - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// When each DataStage's first Job appeared, watched from outside.
fn watch_job_creation(client: kube::Client) -> Arc<Mutex<HashMap<(String, String), Instant>>> {
    let seen: Arc<Mutex<HashMap<(String, String), Instant>>> = Arc::default();
    let record = Arc::clone(&seen);
    tokio::spawn(async move {
        let jobs = watcher(Api::<Job>::all(client), watcher::Config::default().labels(DATASTAGE_LABEL))
            .default_backoff()
            .applied_objects();
        jobs.try_for_each(|job| {
            if let Some(stage) = DataStageKey::from_labels(job.metadata.namespace.as_deref(), job.labels()) {
                record.lock().unwrap().entry((stage.namespace, stage.name)).or_insert_with(Instant::now);
            }
            async { Ok(()) }
        })
        .await
        .ok();
    });
    seen
}

/// A small dataset of odd sizes: empty, one byte, around a page, and a
/// few tens of KiB.
fn small_dataset() -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for (i, size) in [0usize, 1, 4095, 4097, 65_537, 30_001].into_iter().enumerate() {
        files.insert(format!("part-{i}/shard.bin"), pattern(i as u64, size));
    }
    files
}

/// [`small_dataset`] and `shards` more objects of 256 KiB and a few bytes
/// (patterns from `seed` on), for stagings that run long enough at
/// [`SLOW_BANDWIDTH`] for a fault to strike mid-transfer.
fn sharded_dataset(shards: u64, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let mut files = small_dataset();
    for i in 0..shards {
        files.insert(format!("shards/{i:03}.bin"), pattern(seed + i, (256 << 10) + i as usize));
    }
    files
}

/// The bandwidth cap per worker of the stagings that faults strike.
const SLOW_BANDWIDTH: u64 = 3 << 20;

/// The most reconciliations per paced DataStage while N are held: its own
/// (its creation, its status writes, its Job's and pod's changes, its
/// workers' reports: 17.8 with the long burst alone on 2026-12-07, 10.2
/// beside two other long scenarios, as a slow machine coalesces more
/// events) and any of the held ones. A held DataStage woken by a paced
/// one's events (its node, its namespace) adds N / P, or N / 2P, per such
/// event of every paced DataStage: tens to hundreds more at either size.
const PACED_RECONCILES: f64 = 30.0;

/// DataStages created at once, spread over namespaces and both nodes: every
/// one completes with its data, one Job each, while the operator's memory,
/// its reconcile latency, the time from create to Job and the API requests
/// per DataStage are measured. 100 by default, 1,000 with `FERRY_LONG=1`.
///
/// The time from create to Job is measured twice. In the burst, all of
/// them at once (32 creates in flight), which measures how fast the whole
/// control plane drains a queue. Then, with every one of them held and
/// their stagings finished, a paced series of further DataStages, one every
/// quarter second: the latency a user sees applying a DataStage to an
/// operator that holds N, which is what the goal (p99 ≤ 1 s) is about:
/// reported, with the operator's share of it (its queue wait). What is
/// asserted holds on any machine: the operator's memory, and how many
/// reconciliations it ran per paced DataStage while it held the others
/// ([`PACED_RECONCILES`]).
#[tokio::test(flavor = "multi_thread")]
async fn datastages_created_at_once_all_complete_with_bounded_operator_memory_and_no_lists_per_reconcile() {
    let (count, probes): (usize, usize) = if long() { (1000, 100) } else { (100, 20) };
    let per_namespace = 20;
    let bench = Bench::start(small_dataset()).await;
    let namespaces: Vec<String> = (0..count.div_ceil(per_namespace)).map(|i| format!("team-{i:02}")).collect();
    for namespace in &namespaces {
        bench.namespace(namespace).await;
    }
    let burst: Vec<(String, String)> =
        (0..count).map(|i| (namespaces[i / per_namespace].clone(), format!("shard-{i:04}"))).collect();
    let paced: Vec<(String, String)> =
        (0..probes).map(|i| (namespaces[i % namespaces.len()].clone(), format!("probe-{i:03}"))).collect();
    let create = |i: usize, stage: &(String, String)| {
        let (namespace, name) = stage.clone();
        let ds = bench.pull(&namespace, &name, NODES[i % NODES.len()]);
        let api: Api<DataStage> = Api::namespaced(bench.client.clone(), &namespace);
        async move {
            api.create(&PostParams::default(), &ds).await.expect("create");
            ((namespace, name), Instant::now())
        }
    };
    let job_seen = watch_job_creation(bench.client.clone());
    let requests_before = bench.api_requests().await;
    let started = Instant::now();

    let created: HashMap<(String, String), Instant> = futures::stream::iter(burst.iter().enumerate())
        .map(|(i, stage)| create(i, stage))
        .buffer_unordered(32)
        .collect()
        .await;
    let creating = started.elapsed();

    let deadline = Duration::from_secs(if long() { 1800 } else { 420 });
    let all_have_jobs = || burst.iter().all(|stage| job_seen.lock().unwrap().contains_key(stage));
    while !all_have_jobs() && started.elapsed() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut finished = bench.wait_finished(&burst, deadline).await;
    let elapsed = started.elapsed();
    // The paced series starts once the burst has run down: while its
    // stagers start and report, the control plane is still draining (in
    // runs that started the series when every burst DataStage had its Job,
    // the first few paced creates waited 1 to 4 s, and the test's own
    // creates were as slow).
    let before_paced = bench.operator_metrics().await;
    let mut probed = HashMap::new();
    for (i, stage) in paced.iter().enumerate() {
        let (stage, at) = create(i, stage).await;
        probed.insert(stage, at);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    finished.extend(bench.wait_finished(&paced, deadline).await);
    let after_paced = bench.operator_metrics().await;
    let stages: Vec<(String, String)> = burst.iter().chain(&paced).cloned().collect();
    bench.assert_staged_once(&finished).await;

    let requests = delta(&requests_before, &bench.api_requests().await);
    let metrics = bench.operator_metrics().await;
    let rss = peak_rss(bench.operator.id());
    // How long each DataStage waited for its Job: infinite for one that got none.
    let waits = |created: &HashMap<(String, String), Instant>| -> Vec<(String, Instant, f64)> {
        let seen = job_seen.lock().unwrap();
        created
            .iter()
            .map(|(key, at)| {
                let waited =
                    seen.get(key).map_or(f64::INFINITY, |job| job.saturating_duration_since(*at).as_secs_f64());
                (key.1.clone(), *at, waited)
            })
            .collect()
    };
    let quantiles = |waits: &[(String, Instant, f64)]| {
        let mut seconds: Vec<f64> = waits.iter().map(|w| w.2).collect();
        (quantile(&mut seconds, 0.5), quantile(&mut seconds, 0.99))
    };
    let paced_waits = waits(&probed);
    let ((p50, p99), (paced_p50, paced_p99)) = (quantiles(&waits(&created)), quantiles(&paced_waits));
    // The paced DataStages that waited over a second, by when they were
    // created (seconds after the first of them): one stall, or spread out.
    let paced_over_a_second: Vec<(String, f64, f64)> = {
        let first = paced_waits.iter().map(|w| w.1).min();
        let mut slow: Vec<(String, f64, f64)> = paced_waits
            .iter()
            .filter(|(_, _, waited)| *waited > 1.0)
            .filter_map(|(name, at, waited)| {
                Some((name.clone(), at.saturating_duration_since(first?).as_secs_f64(), *waited))
            })
            .collect();
        slow.sort_by(|a, b| a.1.total_cmp(&b.1));
        slow
    };
    let reconcile = |q| histogram_quantile(&metrics, "ferry_operator_reconcile_duration_seconds", q);
    // The operator's own share of the paced waits, and what holding N
    // made it do meanwhile: from its metrics just before the first paced
    // create and once every paced DataStage had finished.
    let paced_queue_wait = histogram_between(&before_paced, &after_paced, "ferry_operator_queue_wait_seconds");
    let queue_wait_p99 = bucket_quantile(&paced_queue_wait, 0.99);
    let queue_waits_timed = paced_queue_wait.last().map_or(0.0, |b| b.1);
    let reconciles = |exposition: &str| counter_sum(exposition, "ferry_operator_reconciles_total");
    let paced_reconciles = (reconciles(&after_paced) - reconciles(&before_paced)) / probes as f64;
    let per_stage = |verb: &str, resource: &str| {
        requests.get(&(verb.to_owned(), resource.to_owned())).copied().unwrap_or(0.0) / stages.len() as f64
    };
    let lists_of_children = ["jobs", "pods", "nodes"]
        .iter()
        .map(|r| requests.get(&("LIST".to_owned(), (*r).to_owned())).copied().unwrap_or(0.0))
        .sum::<f64>();
    let total: f64 = requests.values().sum();
    let report = json!({
        "scenario": "scale", "datastages": count, "paced_datastages": probes, "namespaces": namespaces.len(),
        "create_seconds": creating.as_secs_f64(), "burst_all_succeeded_seconds": elapsed.as_secs_f64(),
        "operator_peak_rss_mib": rss as f64 / f64::from(1 << 20),
        "create_to_job_seconds": {"p50": p50, "p99": p99},
        "paced_create_to_job_seconds": {"p50": paced_p50, "p99": paced_p99},
        "paced_over_a_second": paced_over_a_second,
        "reconcile_seconds_bucket": {"p50": reconcile(0.5), "p99": reconcile(0.99)},
        "paced_window": {
            "queue_wait_seconds_bucket": {"p50": bucket_quantile(&paced_queue_wait, 0.5), "p99": queue_wait_p99},
            "queue_waits_timed": queue_waits_timed,
            "reconciles_per_paced_datastage": paced_reconciles,
        },
        "api_requests_per_datastage": {
            "all_clients": total / stages.len() as f64,
            "datastage_status_patches": per_stage("APPLY", "datastages/status"),
            "job_creates": per_stage("POST", "jobs"),
            "lists_of_jobs_pods_nodes_total": lists_of_children,
        },
        "api_requests_by_verb_and_resource": requests.iter().map(|((v, r), n)| (format!("{v} {r}"), *n)).collect::<BTreeMap<_, _>>(),
    });
    println!("reliability: {report}");

    // The goals (docs/reliability.md), as far as they hold on any machine.
    // Memory is the operator's alone. The waits are reported, not
    // asserted: a user's create → Job wait with N held is mostly the API
    // server's (1.1 cores of two during the paced series, the operator 0.25),
    // and even the operator's queue wait is one once its reconcile slots
    // wait on a starved API server (p99 32 ms alone, over 8 s beside two
    // other long scenarios, on 2026-12-07). What holding N may not do,
    // on any machine, is make the operator reconcile the DataStages it holds.
    assert!(rss <= 100 << 20, "operator peak RSS {} MiB at {count} DataStages", rss >> 20);
    assert!(p99.is_finite() && paced_p99.is_finite(), "every DataStage got a Job");
    assert!(queue_waits_timed >= probes as f64, "every paced create was timed in the queue: {queue_waits_timed}");
    assert!(
        paced_reconciles <= PACED_RECONCILES,
        "{paced_reconciles:.1} reconciliations per paced DataStage while {count} were held"
    );
    // Watches and caches only: the Jobs, Pods and Nodes are listed when a
    // watch starts (by every component), not per reconciliation. Before the
    // caches each reconcile listed all three, several times per DataStage.
    assert!(lists_of_children < 30.0, "{lists_of_children} lists of Jobs, Pods and Nodes for {count} DataStages");
}

/// A node deleted for good mid-staging, as an administrator removes a dead
/// machine (`kubectl delete node`), then a node of that name registering
/// again, as a replacement machine does. The placement policy
/// (docs/reliability.md): a deleted node stops matching.
/// - A DataStage spread over every node finishes on the nodes left: the
///   deleted node's worker is kept in the status, marked as no longer
///   matching, and not counted.
/// - A DataStage pinned to that node waits with `NoMatchingNodes`, saying
///   what to do, and is staged, byte for byte, once the node is back.
///
/// With either, no Job is left behind for a node that is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_deleted_for_good_stops_matching_and_a_node_registering_again_is_staged() {
    let mut bench = Bench::start(sharded_dataset(48, 500)).await;
    bench.namespace("gone").await;
    let api: Api<DataStage> = Api::namespaced(bench.client.clone(), "gone");
    let pinned = bench.slow_pull("gone", "pinned", "node-b", "/mnt/ferry/gone/pinned", SLOW_BANDWIDTH);
    let mut spread = bench.slow_pull("gone", "spread", "node-b", "/mnt/ferry/gone/spread", SLOW_BANDWIDTH);
    spread.spec.placement = None;
    for ds in [&pinned, &spread] {
        api.create(&PostParams::default(), ds).await.unwrap();
    }
    // Both copy onto node-b (and the spread one onto node-a too) when it dies.
    let of_gone = ListParams::default().labels(&format!("{}=gone", ferry_crds::names::DATASTAGE_NAMESPACE));
    let pods: Api<Pod> = Api::namespaced(bench.client.clone(), ferry_e2e::WORKERS_NS);
    wait_for(&bench.cluster, "three workers running", Duration::from_secs(120), || {
        let (pods, of_gone) = (pods.clone(), of_gone.clone());
        async move {
            let listed = pods.list(&of_gone).await.ok()?;
            (listed.items.iter().filter(|p| is_running(p)).count() == 3).then_some(())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(bench.cluster.crash_node("node-b"));
    Api::<k8s_openapi::api::core::v1::Node>::all(bench.client.clone())
        .delete("node-b", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();

    // The pinned one waits, and says why and what to do. The deletion
    // itself wakes it: within 30 s, before the pod garbage collector (40 s)
    // or the periodic requeue (60 s) would.
    let message =
        bench.wait_progressing_reason("gone", "pinned", reasons::NO_MATCHING_NODES, Duration::from_secs(30)).await;
    assert!(message.contains("spec.placement"), "{message}");
    let pinned_reported = deleted.elapsed();
    // The spread one finishes on node-a alone.
    let spread_done = bench.wait_finished(&[("gone".into(), "spread".into())], Duration::from_secs(180)).await;
    let status = spread_done[0].status.clone().unwrap();
    assert_eq!(status.phase, Some(Phase::Succeeded), "{}", json!(status));
    let departed = status.workers.iter().find(|w| w.node.as_deref() == Some("node-b")).expect("node-b's entry kept");
    assert!(
        departed.message.as_deref().is_some_and(|m| m.contains("no longer matches")),
        "marked: {}",
        json!(departed)
    );
    let spread_on_a = read_tree(&bench.cluster.node_dir("node-a").unwrap().join("mnt/ferry/gone/spread"));
    assert!(spread_on_a == bench.files, "node-a holds the dataset byte for byte");
    let spread_finished = deleted.elapsed();
    // Nothing is left running or waiting for a node that does not exist.
    let jobs: Api<Job> = Api::namespaced(bench.client.clone(), ferry_e2e::WORKERS_NS);
    let left_for_b = wait_for(&bench.cluster, "no Job left for node-b", Duration::from_secs(60), || {
        let (jobs, of_gone) = (jobs.clone(), of_gone.clone());
        async move {
            let listed = jobs.list(&of_gone).await.ok()?;
            let for_b: Vec<String> =
                listed.items.iter().map(|j| j.name_any()).filter(|n| n.contains("node-b")).collect();
            for_b.is_empty().then_some(for_b)
        }
    })
    .await;
    assert!(left_for_b.is_empty());
    // An Event says so for each; it follows the deletion it reports.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(bench.client.clone(), "gone");
    for name in ["pinned", "spread"] {
        let about = ListParams::default().fields(&format!("involvedObject.name={name}"));
        let what = format!("{name}: an Event saying its node-b Job was deleted");
        wait_for(&bench.cluster, &what, Duration::from_secs(15), || {
            let (events, about) = (events.clone(), about.clone());
            async move {
                let listed = events.list(&about).await.ok()?;
                listed.items.iter().any(|e| e.reason.as_deref() == Some(reasons::WORKER_DELETED)).then_some(())
            }
        })
        .await;
    }

    // A machine of that name registers: the pinned one is staged there,
    // and the spread one stages it too, as a node that joined.
    bench.cluster.restart_node("node-b").await.unwrap();
    let stages = [("gone".to_owned(), "pinned".to_owned()), ("gone".to_owned(), "spread".to_owned())];
    let finished = bench.wait_finished(&stages, Duration::from_secs(240)).await;
    let pinned_done: Vec<DataStage> = finished.iter().filter(|d| d.name_any() == "pinned").cloned().collect();
    bench.assert_staged_once(&pinned_done).await;
    let spread = finished.iter().find(|d| d.name_any() == "spread").unwrap().status.clone().unwrap();
    assert_eq!(spread.phase, Some(Phase::Succeeded));
    for node in ["node-a", "node-b"] {
        let staged = read_tree(&bench.cluster.node_dir(node).unwrap().join("mnt/ferry/gone/spread"));
        assert!(staged == bench.files, "{node} holds the spread dataset byte for byte");
        let entry = spread.workers.iter().find(|w| w.node.as_deref() == Some(node)).unwrap();
        assert!(entry.message.is_none() && entry.phase == Some(Phase::Succeeded), "{}", json!(entry));
    }
    println!(
        "reliability: {}",
        json!({"scenario": "node deleted", "pinned_reported_seconds": pinned_reported.as_secs_f64(),
               "spread_finished_on_the_rest_seconds": spread_finished.as_secs_f64(), "pinned_waited_with": message})
    );
}

/// Stagings that go on while every component crashes: the operator killed
/// five times at random moments, the API server and etcd killed and
/// restarted, the object store killed mid-transfer, a worker pod deleted.
/// Every DataStage ends Succeeded with its data byte for byte, one Job each,
/// and a status that counts all of it.
#[tokio::test(flavor = "multi_thread")]
async fn stagings_go_on_through_crashes_of_every_component() {
    let per_wave: usize = if long() { 20 } else { 4 };
    // Large enough that transfers are in flight when things crash: a
    // multipart object and many small ones.
    let mut files = small_dataset();
    for i in 0..40u64 {
        files.insert(format!("many/{i:03}.bin"), pattern(100 + i, 20_000 + i as usize * 37));
    }
    files.insert("big/weights.bin".into(), pattern(7, (12 << 20) + 3));
    // An operator that cannot renew its Lease while the API server is down
    // exits, and its pod's kubelet starts it again: so here too.
    let mut bench = Bench::start_with(files, start_operator_restarted).await;
    for namespace in ["faults-a", "faults-b"] {
        bench.namespace(namespace).await;
    }
    let mut stages = Vec::new();
    let mut rng_state = 0x5eed_u64;
    let mut next_random = move |below: u64| {
        rng_state = rng_state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (rng_state >> 33) % below
    };
    let wave = |bench: &Bench, round: usize| {
        let created: Vec<(String, String, DataStage)> = (0..per_wave)
            .map(|i| {
                let namespace = ["faults-a", "faults-b"][i % 2].to_owned();
                let name = format!("wave{round}-{i}");
                let ds = bench.pull(&namespace, &name, NODES[(i + round) % NODES.len()]);
                (namespace, name, ds)
            })
            .collect();
        created
    };
    let create = |bench: &Bench, batch: Vec<(String, String, DataStage)>| {
        let client = bench.client.clone();
        async move {
            let mut names = Vec::new();
            for (namespace, name, ds) in batch {
                let api: Api<DataStage> = Api::namespaced(client.clone(), &namespace);
                // The API server may be down at this moment: try until it takes it.
                loop {
                    match api.create(&PostParams::default(), &ds).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(status)) if status.is_already_exists() => break,
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                }
                names.push((namespace, name));
            }
            names
        }
    };
    let mut log = Vec::new();

    // 1. The operator killed five times at random moments while waves arrive.
    for round in 0..5 {
        stages.extend(create(&bench, wave(&bench, round)).await);
        tokio::time::sleep(Duration::from_millis(next_random(3000))).await;
        bench.operator.signal_group(rustix::process::Signal::KILL);
        bench.operator.stop(Duration::ZERO);
        log.push(format!("operator killed ({} DataStages so far)", stages.len()));
        tokio::time::sleep(Duration::from_millis(next_random(1500))).await;
        bench.operator.restart(Duration::ZERO).unwrap();
    }

    // 2. The API server killed and back after two seconds, then etcd.
    // After etcd restarts, watches that clients resumed on the restarted
    // API server can stay open and silent until their timeout
    // (docs/reliability.md): the operator, and the node agent that stands
    // in for the kubelet here, renew theirs every minute. The operator's
    // watches back off 5 s at most between tries through both restarts.
    stages.extend(create(&bench, wave(&bench, 5)).await);
    for component in ["kube-apiserver", "etcd"] {
        tokio::time::sleep(Duration::from_millis(500 + next_random(1500))).await;
        let restarted = bench.cluster.control_plane_mut().unwrap().restart(component, Duration::from_secs(2)).await;
        restarted.unwrap_or_else(|e| panic!("{component} did not come back: {e}"));
        log.push(format!("{component} killed and restarted"));
    }

    // 3. The store killed mid-transfer and back after three seconds.
    let after_restarts = Instant::now();
    stages.extend(create(&bench, wave(&bench, 6)).await);
    bench.wait_worker_running("faults-a", "wave6-0").await;
    let first_worker_after_restarts = after_restarts.elapsed();
    let first_worker_timeline = bench.worker_timeline("faults-a", "wave6-0").await;
    tokio::task::block_in_place(|| bench.s3.restart(Duration::from_secs(3)));
    log.push("MinIO killed mid-transfer and restarted".into());

    // 4. A running worker's pod deleted: its Job starts another.
    stages.extend(create(&bench, wave(&bench, 7)).await);
    let victim = bench.wait_worker_running("faults-a", "wave7-0").await;
    let pods: Api<Pod> = Api::namespaced(bench.client.clone(), ferry_e2e::WORKERS_NS);
    pods.delete(&victim, &DeleteParams::default()).await.unwrap();
    log.push(format!("worker pod {victim} deleted"));

    let deadline = Duration::from_secs(if long() { 1800 } else { 300 });
    let finished = bench.wait_finished(&stages, deadline).await;
    bench.assert_staged_once(&finished).await;
    let metrics = bench.operator_metrics().await;
    println!(
        "reliability: {}",
        json!({"scenario": "faults", "datastages": stages.len(), "faults": log,
               "operator_exits": bench.operator_exits(),
               "first_worker_after_restarts_seconds": first_worker_after_restarts.as_secs_f64(),
               "first_worker_after_restarts_timeline": first_worker_timeline,
               "operator_reconcile_errors_since_last_restart": metrics.lines()
                   .filter(|l| l.starts_with("ferry_operator_reconcile_errors_total"))
                   .collect::<Vec<_>>()})
    );
    drop(bench.logs);
}

/// A node that goes away mid-staging and a destination disk that fills up:
/// each is reported on the DataStage while it lasts (NodeNotReady,
/// InsufficientCapacity), and staging completes, byte for byte, with one
/// Job, once the node is back or there is room again. One DataStage each by
/// default, four with `FERRY_LONG=1`.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_node_and_a_full_disk_are_reported_and_staging_completes_once_they_are_fixed() {
    let per_fault: usize = if long() { 4 } else { 1 };
    // 24 MiB in 96 objects at 3 MiB/s per worker: each transfer runs for
    // about eight seconds, and objects are still to start (and to reserve
    // their space) when the disk fills up.
    let mut bench = Bench::start(sharded_dataset(96, 300)).await;
    bench.namespace("faults").await;
    let api: Api<DataStage> = Api::namespaced(bench.client.clone(), "faults");
    let mut log = Vec::new();

    // 1. node-b crashes while its workers copy: no heartbeats, processes
    // gone. The DataStages say NodeNotReady; when the node comes back (a
    // reboot), its kubelet fails the lost pods and the Jobs start new ones,
    // which resume.
    let lost: Vec<String> = (0..per_fault).map(|i| format!("lost-{i}")).collect();
    for name in &lost {
        let ds = bench.slow_pull("faults", name, "node-b", &format!("/mnt/ferry/faults/{name}"), SLOW_BANDWIDTH);
        api.create(&PostParams::default(), &ds).await.unwrap();
    }
    for name in &lost {
        bench.wait_worker_running("faults", name).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(bench.cluster.crash_node("node-b"));
    let crashed = Instant::now();
    let grace = ferry_e2e::control_plane::NODE_GRACE_PERIOD;
    let message = bench.wait_progressing_reason("faults", &lost[0], reasons::NODE_NOT_READY, grace * 3).await;
    assert!(message.contains("node node-b is not Ready"), "{message}");
    let reported = crashed.elapsed();
    // An Event says so too. The operator publishes it once the status that
    // shows the condition is written, so it may come a moment after.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(bench.client.clone(), "faults");
    let about_the_first = ListParams::default().fields(&format!("involvedObject.name={}", lost[0]));
    wait_for(&bench.cluster, "a NodeNotReady Event", Duration::from_secs(15), || {
        let (events, about_the_first) = (events.clone(), about_the_first.clone());
        async move {
            let listed = events.list(&about_the_first).await.ok()?;
            listed.items.iter().any(|e| e.reason.as_deref() == Some(reasons::NODE_NOT_READY)).then_some(())
        }
    })
    .await;
    bench.cluster.restart_node("node-b").await.unwrap();
    log.push(format!("node-b crashed; NodeNotReady reported after {:.1} s; node restarted", reported.as_secs_f64()));

    // 2. node-a's disk fills up under the workers (another tenant's file):
    // they end with InsufficientCapacity and their Jobs retry; once the
    // file is gone they finish, keeping what was written.
    let disk = bench.cluster.node_dir("node-a").unwrap().join("mnt/ferry/small");
    // Room for the data and the stager's default 64 MiB reserve.
    let small = match ferry_testkit::SmallFilesystem::mount_on(&disk, &format!("{}m", 64 + 32 * per_fault + 8)) {
        Ok(small) => Some(small),
        Err(why) => {
            eprintln!("SKIP the full-disk part: it needs to mount a tmpfs (run it as root): {why}");
            None
        }
    };
    let full: Vec<String> =
        if small.is_some() { (0..per_fault).map(|i| format!("full-{i}")).collect() } else { Vec::new() };
    for name in &full {
        let ds = bench.slow_pull("faults", name, "node-a", &format!("/mnt/ferry/small/{name}"), SLOW_BANDWIDTH);
        api.create(&PostParams::default(), &ds).await.unwrap();
    }
    if let Some(small) = &small {
        for name in &full {
            bench.wait_worker_running("faults", name).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let filled = small.fill("filler");
        let message = bench
            .wait_progressing_reason("faults", &full[0], Reason::InsufficientCapacity.as_str(), Duration::from_secs(90))
            .await;
        assert!(message.starts_with("retrying"), "{message}");
        std::fs::remove_file(small.path().join("filler")).unwrap();
        log.push(format!("node-a's disk filled up ({} MiB more) mid-transfer, then freed", filled >> 20));
    }

    let mut stages: Vec<(String, String)> = lost.iter().map(|n| ("faults".to_owned(), n.clone())).collect();
    let lost_stages = stages.len();
    stages.extend(full.iter().map(|n| ("faults".to_owned(), n.clone())));
    let finished = bench.wait_finished(&stages, Duration::from_secs(if long() { 600 } else { 300 })).await;
    let (on_lost_node, on_full_disk): (Vec<DataStage>, Vec<DataStage>) =
        finished.into_iter().partition(|d| lost.contains(&d.name_any()));
    assert_eq!(on_lost_node.len(), lost_stages);
    bench.assert_staged_once(&on_lost_node).await;
    bench.assert_staged_once_at(&on_full_disk, |_, name| format!("mnt/ferry/small/{name}")).await;
    println!("reliability: {}", json!({"scenario": "node and disk", "datastages": stages.len(), "faults": log}));
    drop(small);
}
