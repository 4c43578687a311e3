//! Live progress into the DataStage's status (`--report-to NS/NAME
//! --worker NAME`): while a stager runs inside a worker pod it writes its
//! own entry of `status.workers` every few seconds, by server-side apply
//! with a field manager of its own (`ferry.dev/stager-<worker>`), so
//! workers never overwrite each other and `kubectl get dstage` moves during
//! a transfer. The operator folds the entries into totals.
//!
//! Reporting is best effort: a worker without permission (`patch` on
//! `datastages/status`) or without API access copies data all the same and
//! says so once in its log.
//!
//! The same round trip brings the worker its share of a StoreBudget: the
//! status the API server answers a report with carries the operator's
//! `status.storeBudget`, and the worker follows it. A worker that cannot
//! reach the API keeps the share it has.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_contract::PeerCounts;
use ferry_crds::{DataStage, DataStageStatus, WorkerStatus};
use kube::Api;
use kube::Resource as _;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use ferry_engine::transfer::Engine;

use crate::peers::Peering;

/// How often a worker writes its progress.
const INTERVAL: Duration = Duration::from_secs(2);

/// Where and as whom to report.
#[derive(Clone, Debug)]
pub struct ReportTarget {
    /// The DataStage's namespace.
    pub namespace: String,
    /// The DataStage's name.
    pub name: String,
    /// This worker's entry name.
    pub worker: String,
    /// The node this worker runs on.
    pub node: Option<String>,
}

/// The status fragment a worker applies (pure, unit-tested): its own
/// entry's progress counters, and the disk it found (so that pulls on the
/// same node count what it still writes), and nothing else. The phase, run and snapshot
/// of an entry are the operator's to write, from the worker's Job and its
/// final summary, so a late progress report cannot undo a finished one.
pub fn worker_patch(
    target: &ReportTarget,
    snapshot: &ferry_engine::transfer::tally::Snapshot,
    rate: f64,
    budget: (u64, Option<ferry_contract::StoreShare>),
    peers: Option<(SocketAddr, PeerCounts)>,
    disk: Option<ferry_contract::DiskSpace>,
) -> serde_json::Value {
    let (throttled, share) = budget;
    let mut entry = WorkerStatus {
        disk,
        store_share: share,
        throttled_requests: Some(throttled as i64).filter(|n| *n > 0),
        name: target.worker.clone(),
        node: target.node.clone(),
        bytes_done: snapshot.bytes_done as i64,
        bytes_total: snapshot.bytes_selected as i64,
        objects_done: snapshot.objects_done as i64,
        objects_total: snapshot.objects_selected as i64,
        throughput_bytes_per_second: rate as i64,
        ..WorkerStatus::default()
    };
    if let Some((address, counts)) = peers {
        entry.peer_address = Some(address.to_string());
        entry.bytes_from_peers = Some(counts.bytes_from_peers as i64);
        entry.bytes_served = Some(counts.bytes_served as i64);
        entry.peer_failures = Some(counts.peer_failures as i64);
    }
    let status = DataStageStatus { workers: vec![entry], ..DataStageStatus::default() };
    json!({
        "apiVersion": DataStage::api_version(&()),
        "kind": DataStage::kind(&()),
        "metadata": {"name": target.name, "namespace": target.namespace},
        "status": status,
    })
}

/// Reports until aborted, following the StoreBudget share each answer
/// carries; in a fleet, also publishes this worker's peer address and
/// learns the others' from the same DataStage. `first_answer` hears when
/// the first report was answered (or failed); it is dropped unheard when
/// the API cannot be reached.
pub async fn report(
    target: ReportTarget,
    engine: Arc<Engine>,
    peering: Option<Arc<Peering>>,
    first_answer: tokio::sync::oneshot::Sender<()>,
) {
    let Some((api, params)) = status_api(&target).await else { return };
    let mut first_answer = Some(first_answer);
    let tally = Arc::clone(&engine.tally);
    let mut warned = false;
    let mut previous = (Instant::now(), 0u64);
    // Peers need this worker's address at once, and a budgeted worker the
    // share its peers' starts left it; progress can wait.
    let mut first = peering.is_some() || engine.config.store_share.is_some();
    let mut alone = false;
    loop {
        if !std::mem::take(&mut first) {
            tokio::time::sleep(INTERVAL).await;
        }
        let snapshot = tally.snapshot();
        let elapsed = previous.0.elapsed().as_secs_f64().max(1e-3);
        let rate = snapshot.bytes_done.saturating_sub(previous.1) as f64 / elapsed;
        previous = (Instant::now(), snapshot.bytes_done);
        let peers = peering.as_ref().map(|p| (p.address, p.fleet.counts()));
        let budget = (engine.metrics.throttles(), engine.store_share());
        let patch = worker_patch(&target, &snapshot, rate, budget, peers, tally.disk());
        let published = api.patch_status(&target.name, &params, &Patch::Apply(&patch)).await;
        match &published {
            Ok(ds) => {
                if let Some(share) = budget_share(ds) {
                    engine.follow_share(share);
                }
            }
            Err(error) if !warned => {
                tracing::warn!(%error, datastage = %target.name, "cannot report progress (needs patch on datastages/status)");
                warned = true;
            }
            Err(_) => {}
        }
        if let Some(first_answer) = first_answer.take() {
            // Heard by nobody when the worker stopped waiting (or never did).
            let _ = first_answer.send(());
        }
        let Some(peering) = peering.as_ref().filter(|_| !alone) else { continue };
        let discovered = match published {
            Ok(_) => api.get(&target.name).await,
            Err(error) => Err(error),
        };
        match discovered {
            Ok(ds) => {
                if peering.learned(published_peers(&ds, &target.worker)) {
                    tracing::debug!(peers = ?peering.directory.borrow(), "learned peer addresses");
                }
                peering.exited(&exited_peers(&ds, &target.worker));
            }
            // Peers find each other only through this DataStage: without
            // the right to write or read it, waiting for them is in vain.
            Err(kube::Error::Api(status)) if status.is_forbidden() => {
                peering.alone("this worker may not publish its peer address or read its peers' (needs get on datastages and patch on datastages/status)");
                alone = true;
            }
            Err(error) => tracing::debug!(%error, "cannot exchange peer addresses"),
        }
    }
}

/// The StoreBudget share the operator wrote into the DataStage's status:
/// `None` when it wrote none (keep the share this worker has: the operator
/// may not have counted a worker that just started), `Some(None)` when it
/// says no budget applies any more.
pub fn budget_share(ds: &DataStage) -> Option<Option<ferry_contract::StoreShare>> {
    let budget = ds.status.as_ref()?.store_budget.as_ref()?;
    Some(budget.name.as_ref().map(|_| budget.share))
}

/// The DataStage API and this worker's field manager, when the API can be reached.
async fn status_api(target: &ReportTarget) -> Option<(Api<DataStage>, PatchParams)> {
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(error) => {
            tracing::warn!(%error, "cannot reach the Kubernetes API; progress will not be reported");
            return None;
        }
    };
    let params = PatchParams::apply(&format!("ferry.dev/stager-{}", target.worker)).force();
    Some((Api::namespaced(client, &target.namespace), params))
}

/// A fleet worker's last word, once it stops serving: its entry without its
/// peer address and counts. Server-side apply removes the fields this
/// worker's field manager no longer sets, so no later run or late joiner
/// finds an address nobody listens at (the operator keeps the run's counts
/// from the summary). Best effort: an error only costs a stale address.
pub async fn withdraw(target: &ReportTarget, engine: &Engine) {
    let Some((api, params)) = status_api(target).await else { return };
    let budget = (engine.metrics.throttles(), engine.store_share());
    let patch = worker_patch(target, &engine.tally.snapshot(), 0.0, budget, None, engine.tally.disk());
    if let Err(error) = api.patch_status(&target.name, &params, &Patch::Apply(&patch)).await {
        tracing::debug!(%error, "cannot withdraw the peer address");
    }
}

/// The peer addresses other workers published in the DataStage's status.
pub fn published_peers(ds: &DataStage, me: &str) -> Vec<(String, SocketAddr)> {
    let workers = ds.status.as_ref().map(|s| s.workers.as_slice()).unwrap_or_default();
    workers
        .iter()
        .filter(|w| w.name != me)
        .filter_map(|w| Some((w.name.clone(), w.peer_address.as_deref()?.parse().ok()?)))
        .collect()
}

/// The other workers whose entry says they finished the DataStage's
/// current run: their processes have exited, and nothing will answer at
/// their addresses.
pub fn exited_peers(ds: &DataStage, me: &str) -> Vec<String> {
    let Some(status) = ds.status.as_ref() else { return Vec::new() };
    let Some(run) = status.run else { return Vec::new() };
    status.workers.iter().filter(|w| w.name != me && w.finished_run(run)).map(|w| w.name.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_keeps_its_share_until_the_operator_writes_one_and_drops_it_when_told() {
        let ds = |status: serde_json::Value| -> DataStage {
            serde_json::from_value(json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
                "metadata": {"name": "d", "namespace": "ml"},
                "spec": {"source": {"uri": "s3://b"}, "destination": {"volume": {"hostPath": "/mnt/d"}}},
                "status": status}))
            .unwrap()
        };
        assert_eq!(budget_share(&ds(json!({}))), None, "no word from the operator: keep the share");
        let shared = ds(json!({"storeBudget": {"name": "minio", "workers": 4, "share": {"requestsPerSecond": 25}}}));
        let share = ferry_contract::StoreShare { requests_per_second: Some(25), bytes_per_second: None };
        assert_eq!(budget_share(&shared), Some(Some(share)));
        let dropped = ds(json!({"storeBudget": {"workers": 4, "share": {}}}));
        assert_eq!(budget_share(&dropped), Some(None), "no budget applies any more");
    }

    #[test]
    fn a_worker_writes_only_its_own_entry() {
        let target = ReportTarget {
            namespace: "ml".into(),
            name: "d".into(),
            worker: "node-a".into(),
            node: Some("node-a".into()),
        };
        let snapshot = ferry_engine::transfer::tally::Snapshot {
            objects_selected: 10,
            objects_done: 4,
            bytes_selected: 1000,
            bytes_done: 400,
            listing_done: true,
        };
        let patch = worker_patch(&target, &snapshot, 123.0, (0, None), None, None);
        let workers = patch["status"]["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0]["name"], "node-a");
        assert_eq!(workers[0]["bytesDone"], 400);
        assert_eq!(workers[0]["throughputBytesPerSecond"], 123);
        assert!(patch.get("spec").is_none(), "a worker never touches the spec");
        assert!(workers[0].get("phase").is_none(), "the phase is the operator's");
        assert_eq!(patch["apiVersion"], "ferry.dev/v1alpha1");
        assert!(workers[0].get("peerAddress").is_none(), "no peers, no address");
        assert!(workers[0].get("throttledRequests").is_none(), "nothing throttled, nothing said");
        assert!(workers[0].get("storeShare").is_none(), "no budget, no share");
        let share = ferry_contract::StoreShare { requests_per_second: Some(3), bytes_per_second: None };
        let budgeted = worker_patch(&target, &snapshot, 0.0, (7, Some(share)), None, None);
        assert_eq!(budgeted["status"]["workers"][0]["throttledRequests"], 7);
        assert_eq!(budgeted["status"]["workers"][0]["storeShare"], json!({"requestsPerSecond": 3}));
        assert!(workers[0].get("disk").is_none(), "no measurement, nothing said");
        let disk = ferry_contract::DiskSpace {
            filesystem: "0:52".into(),
            size_bytes: 9,
            free_bytes: 8,
            needed_bytes: None,
            claimed_bytes: None,
            measured_at: 5,
        };
        let measured = worker_patch(&target, &snapshot, 0.0, (0, None), None, Some(disk));
        assert_eq!(
            measured["status"]["workers"][0]["disk"],
            json!({"filesystem": "0:52", "sizeBytes": 9, "freeBytes": 8, "measuredAt": 5})
        );
    }

    #[test]
    fn a_fleet_worker_publishes_its_address_and_reads_the_others() {
        let target = ReportTarget { namespace: "ml".into(), name: "d".into(), worker: "node-a".into(), node: None };
        let counts = PeerCounts { bytes_from_peers: 7, bytes_served: 9, ..PeerCounts::default() };
        let address: SocketAddr = "10.224.3.4:9466".parse().unwrap();
        let patch = worker_patch(&target, &Default::default(), 0.0, (0, None), Some((address, counts)), None);
        let entry = &patch["status"]["workers"][0];
        assert_eq!(entry["peerAddress"], "10.224.3.4:9466");
        assert_eq!(entry["bytesFromPeers"], 7);
        assert_eq!(entry["bytesServed"], 9);

        // What the API server returns once every worker has applied its entry.
        let mut ds: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": "ml"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/data"}}},
        }))
        .unwrap();
        let mut status: DataStageStatus = serde_json::from_value(patch["status"].clone()).unwrap();
        status.workers.push(WorkerStatus {
            name: "node-b".into(),
            peer_address: Some("10.224.9.9:9466".into()),
            ..WorkerStatus::default()
        });
        status.workers.push(WorkerStatus { name: "node-c".into(), ..WorkerStatus::default() });
        ds.status = Some(status);
        assert_eq!(published_peers(&ds, "node-a"), vec![("node-b".to_owned(), "10.224.9.9:9466".parse().unwrap())]);

        // node-b finished run 2 and exited; node-c's finished entry is of
        // run 1, before the current run began.
        let status = ds.status.as_mut().unwrap();
        status.run = Some(2);
        let finished = |run| (Some(run), Some(ferry_crds::Phase::Succeeded));
        (status.workers[1].run, status.workers[1].phase) = finished(2);
        (status.workers[2].run, status.workers[2].phase) = finished(1);
        assert_eq!(exited_peers(&ds, "node-a"), ["node-b"]);
        assert_eq!(exited_peers(&ds, "node-b"), Vec::<String>::new(), "never itself");
    }
}
