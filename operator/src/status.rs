//! From what the workers did to the DataStage's status: phase, conditions
//! (per the Kubernetes API conventions), totals and one entry per worker.
//! Pure functions with an injected clock, unit-tested without a cluster.

use ferry_crds::{DataStage, DataStageStatus, Phase, Totals, WorkerStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::Deserialize;

use crate::jobs::Worker;

/// Condition types.
pub mod types {
    /// Every worker finished and the data is in place.
    pub const READY: &str = "Ready";
    /// Workers are being created or are copying.
    pub const PROGRESSING: &str = "Progressing";
    /// The DataStage cannot succeed without a change.
    pub const FAILED: &str = "Failed";
}

/// CamelCase condition reasons.
pub mod reasons {
    /// All data is staged and verified.
    pub const STAGED: &str = "Staged";
    /// Workers are running.
    pub const WORKERS_RUNNING: &str = "WorkersRunning";
    /// Workers are created but not yet running.
    pub const WAITING_FOR_WORKERS: &str = "WaitingForWorkers";
    /// No node matches the placement.
    pub const NO_MATCHING_NODES: &str = "NoMatchingNodes";
    /// A worker failed for good.
    pub const WORKER_FAILED: &str = "WorkerFailed";
    /// The credentials Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The hostPath is outside the operator's allow-list.
    pub const HOST_PATH_NOT_ALLOWED: &str = "HostPathNotAllowed";
    /// The spec asks the store for something it does not support.
    pub const UNSUPPORTED_STORE: &str = "UnsupportedStore";
    /// The stager's reasons for a run that could not proceed, which become
    /// condition reasons as they are: `BucketNotFound`, `AccessDenied`,
    /// `NoCredentials`, `EndpointUnreachable`, `StoreUnavailable`,
    /// `StoreRejected`, `DestinationUnusable`, `SourceUnreadable`,
    /// `InvalidConfiguration`. A Job whose pod ran with one and will be
    /// retried shows it on Progressing; a failed Job shows it on Failed.
    pub const FROM_STAGER: [&str; 9] = [
        "BucketNotFound",
        "AccessDenied",
        "NoCredentials",
        "EndpointUnreachable",
        "StoreUnavailable",
        "StoreRejected",
        "DestinationUnusable",
        "SourceUnreadable",
        "InvalidConfiguration",
    ];
    /// Nothing is wrong.
    pub const NONE: &str = "AsExpected";
}

/// The stager's JSON summary, as far as the operator reads it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct StagerSummary {
    /// Every selected object is in place and verified.
    #[serde(default)]
    pub complete: bool,
    /// Object counts.
    #[serde(default)]
    pub objects: Counts,
    /// Byte counts.
    #[serde(default)]
    pub bytes: Counts,
    /// Bytes per second over the run.
    #[serde(default)]
    pub throughput_bytes_per_second: f64,
    /// Failures, first ones.
    #[serde(default)]
    pub failures: Vec<SummaryFailure>,
    /// Why the run could not proceed at all (CamelCase, e.g. `BucketNotFound`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// Counts in a summary.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Counts {
    /// Selected.
    #[serde(default)]
    pub selected: i64,
    /// Transferred this run.
    #[serde(default)]
    pub transferred: i64,
    /// Already in place.
    #[serde(default)]
    pub skipped: i64,
    /// Failed.
    #[serde(default)]
    pub failed: i64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.selected += other.selected;
        self.transferred += other.transferred;
        self.skipped += other.skipped;
        self.failed += other.failed;
    }
}

impl StagerSummary {
    /// One summary for the shards of an Indexed Job (one summary per
    /// completion index): objects, bytes and throughput add up because the
    /// shards ran side by side; it is complete only when every shard is; the
    /// first shard with a reason gives it, and failures are listed in shard
    /// order. `None` for no shards.
    pub fn combine(shards: Vec<StagerSummary>) -> Option<StagerSummary> {
        let mut shards = shards.into_iter();
        let mut total = shards.next()?;
        for shard in shards {
            total.complete &= shard.complete;
            total.objects.add(&shard.objects);
            total.bytes.add(&shard.bytes);
            total.throughput_bytes_per_second += shard.throughput_bytes_per_second;
            total.reason = total.reason.take().or(shard.reason);
            total.failures.extend(shard.failures);
        }
        Some(total)
    }
}

/// One failure in a summary.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct SummaryFailure {
    /// The key (empty for run-level failures).
    #[serde(default)]
    pub key: String,
    /// Why.
    #[serde(default)]
    pub error: String,
}

/// What was observed of one worker.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The worker.
    pub worker: Option<Worker>,
    /// Its Job, if it exists yet.
    pub job: Option<Job>,
    /// The summary from its last finished pod's termination message.
    pub summary: Option<StagerSummary>,
    /// A message from the pod when there is no summary (logs, refusal).
    pub message: Option<String>,
}

/// The phase of one worker Job.
pub fn job_phase(job: Option<&Job>) -> Phase {
    let Some(status) = job.and_then(|j| j.status.as_ref()) else { return Phase::Pending };
    let condition = |kind: &str| status.conditions.iter().flatten().any(|c| c.type_ == kind && c.status == "True");
    if condition("Complete") {
        Phase::Succeeded
    } else if condition("Failed") {
        Phase::Failed
    } else if status.active.unwrap_or(0) > 0 || status.start_time.is_some() {
        // Started and not yet judged: pods may have finished while the Job
        // controller has not written Complete yet; that is still running.
        Phase::Running
    } else {
        Phase::Pending
    }
}

/// Formats bytes per second for `kubectl get`.
pub fn human_rate(bytes_per_second: i64) -> String {
    const UNITS: [&str; 4] = ["B/s", "KiB/s", "MiB/s", "GiB/s"];
    let mut value = bytes_per_second.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.0} {}", UNITS[unit])
}

/// A condition, keeping `lastTransitionTime` from `existing` when the
/// status did not change (a transition is a change of status, nothing else).
pub fn condition(
    existing: &[Condition],
    kind: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let since = existing
        .iter()
        .find(|c| c.type_ == kind && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: kind.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// The status of a DataStage that cannot proceed: `phase` with a Failed
/// (`failed` = true) or a waiting Progressing condition carrying `reason`.
pub fn blocked(ds: &DataStage, phase: Phase, failed: bool, reason: &str, message: &str, now: &Time) -> DataStageStatus {
    let existing = ds.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let generation = ds.metadata.generation;
    DataStageStatus {
        phase: Some(phase),
        observed_generation: generation,
        conditions: vec![
            condition(&existing, types::READY, false, reason, message, generation, now),
            condition(&existing, types::PROGRESSING, !failed, reason, message, generation, now),
            condition(
                &existing,
                types::FAILED,
                failed,
                if failed { reason } else { reasons::NONE },
                if failed { message } else { "" },
                generation,
                now,
            ),
        ],
        ..DataStageStatus::default()
    }
}

/// Aggregates the workers into the DataStage's status.
pub fn aggregate(ds: &DataStage, observed: &[Observed], now: &Time) -> DataStageStatus {
    let existing = ds.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let generation = ds.metadata.generation;
    let mut workers = Vec::new();
    // The stager's reason (if its last run could not proceed), per worker.
    let mut stager_reasons: Vec<Option<&'static str>> = Vec::new();
    let mut totals = Totals::default();
    let previous_workers = ds.status.as_ref().map(|s| s.workers.clone()).unwrap_or_default();
    for o in observed {
        let phase = job_phase(o.job.as_ref());
        let name = o.worker.as_ref().map(|w| w.name.clone()).unwrap_or_default();
        // Until its final summary exists, a running worker's own live entry
        // (written by the stager) is the best knowledge of its progress.
        let live = previous_workers.iter().find(|w| w.name == name).filter(|_| o.summary.is_none());
        let summary = o.summary.clone().unwrap_or_else(|| StagerSummary {
            objects: Counts {
                selected: live.map_or(0, |w| w.objects_total),
                transferred: live.map_or(0, |w| w.objects_done),
                ..Counts::default()
            },
            bytes: Counts {
                selected: live.map_or(0, |w| w.bytes_total),
                transferred: live.map_or(0, |w| w.bytes_done),
                ..Counts::default()
            },
            throughput_bytes_per_second: live.map_or(0.0, |w| w.throughput_bytes_per_second as f64),
            ..StagerSummary::default()
        });
        let done = summary.bytes.transferred + summary.bytes.skipped;
        let message = match (&o.message, summary.failures.first()) {
            (_, Some(f)) if f.key.is_empty() => Some(f.error.clone()),
            (_, Some(f)) => Some(format!("{} objects failed; first: {}: {}", summary.objects.failed, f.key, f.error)),
            (Some(m), None) => Some(m.clone()),
            (None, None) => None,
        };
        let worker = WorkerStatus {
            name,
            node: o.worker.as_ref().and_then(|w| w.node.clone()),
            phase: Some(phase),
            bytes_done: done,
            bytes_total: summary.bytes.selected,
            objects_done: summary.objects.transferred + summary.objects.skipped,
            objects_total: summary.objects.selected,
            throughput_bytes_per_second: if phase == Phase::Running {
                summary.throughput_bytes_per_second as i64
            } else {
                0
            },
            message,
        };
        totals.bytes_total += worker.bytes_total;
        totals.bytes_done += worker.bytes_done;
        totals.objects_total += worker.objects_total;
        totals.objects_done += worker.objects_done;
        totals.objects_failed += summary.objects.failed;
        totals.throughput_bytes_per_second += worker.throughput_bytes_per_second;
        stager_reasons.push(
            o.summary
                .as_ref()
                .and_then(|s| s.reason.as_deref())
                .and_then(|r| reasons::FROM_STAGER.iter().copied().find(|known| *known == r)),
        );
        workers.push(worker);
    }
    let phases: Vec<Phase> = workers.iter().filter_map(|w| w.phase).collect();
    let succeeded = phases.iter().filter(|p| **p == Phase::Succeeded).count();
    let phase = if phases.contains(&Phase::Failed) {
        Phase::Failed
    } else if !phases.is_empty() && succeeded == phases.len() {
        Phase::Succeeded
    } else if phases.contains(&Phase::Running) || succeeded > 0 {
        Phase::Running
    } else {
        Phase::Pending
    };
    let previous = ds.status.as_ref().and_then(|s| s.totals.clone()).unwrap_or_default();
    totals.start_time = previous.start_time.or_else(|| (phase != Phase::Pending).then(|| now.clone()));
    totals.completion_time = match phase {
        Phase::Succeeded | Phase::Failed => previous.completion_time.or_else(|| Some(now.clone())),
        _ => None,
    };
    if totals.throughput_bytes_per_second > 0 {
        totals.eta_seconds = Some((totals.bytes_total - totals.bytes_done).max(0) / totals.throughput_bytes_per_second);
    }

    // A failed worker's own reason (BucketNotFound, ...) says more than WorkerFailed.
    let failed_reason = workers
        .iter()
        .zip(&stager_reasons)
        .find_map(|(w, r)| (w.phase == Some(Phase::Failed)).then_some(*r).flatten())
        .unwrap_or(reasons::WORKER_FAILED);
    // A worker that is being retried after a run that could not proceed.
    let retrying = workers.iter().zip(&stager_reasons).find_map(|(w, r)| {
        matches!(w.phase, Some(Phase::Running | Phase::Pending)).then(|| r.map(|r| (r, w))).flatten()
    });
    let (ready_reason, ready_message) = match phase {
        Phase::Succeeded => (
            reasons::STAGED,
            format!(
                "{} objects ({} bytes) staged by {} workers",
                totals.objects_done,
                totals.bytes_done,
                workers.len()
            ),
        ),
        Phase::Failed => (failed_reason, failure_message(&workers)),
        Phase::Running | Phase::Pending if retrying.is_some() => {
            let (reason, worker) = retrying.expect("checked");
            (
                reason,
                format!(
                    "retrying {}: {}",
                    worker.name,
                    worker.message.clone().unwrap_or_else(|| "its last run could not proceed".into())
                ),
            )
        }
        Phase::Running => (reasons::WORKERS_RUNNING, format!("{succeeded} of {} workers finished", workers.len())),
        Phase::Pending => (reasons::WAITING_FOR_WORKERS, format!("waiting for {} workers to start", workers.len())),
    };
    let failed = phase == Phase::Failed;
    let conditions = vec![
        condition(&existing, types::READY, phase == Phase::Succeeded, ready_reason, &ready_message, generation, now),
        condition(
            &existing,
            types::PROGRESSING,
            matches!(phase, Phase::Pending | Phase::Running),
            ready_reason,
            &ready_message,
            generation,
            now,
        ),
        condition(
            &existing,
            types::FAILED,
            failed,
            if failed { failed_reason } else { reasons::NONE },
            if failed { &ready_message } else { "" },
            generation,
            now,
        ),
    ];
    let progress = if totals.bytes_total > 0 {
        Some(format!("{}%", totals.bytes_done * 100 / totals.bytes_total))
    } else if phase == Phase::Succeeded {
        Some("100%".into())
    } else {
        None
    };
    DataStageStatus {
        phase: Some(phase),
        observed_generation: generation,
        conditions,
        progress,
        throughput: Some(human_rate(totals.throughput_bytes_per_second)),
        nodes: Some(format!("{succeeded}/{}", workers.len())),
        totals: Some(totals),
        workers,
    }
}

fn failure_message(workers: &[WorkerStatus]) -> String {
    let failed: Vec<&WorkerStatus> = workers.iter().filter(|w| w.phase == Some(Phase::Failed)).collect();
    let first = failed.first().map(|w| format!("{}: {}", w.name, w.message.clone().unwrap_or_else(|| "failed".into())));
    format!("{} of {} workers failed; {}", failed.len(), workers.len(), first.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    #[test]
    fn shard_summaries_add_up_and_are_complete_only_together() {
        let shard = |bytes: i64, complete: bool, reason: Option<&str>| StagerSummary {
            complete,
            objects: Counts { selected: 2, transferred: 2, ..Counts::default() },
            bytes: Counts { selected: bytes, transferred: bytes, ..Counts::default() },
            throughput_bytes_per_second: 10.0,
            reason: reason.map(String::from),
            ..StagerSummary::default()
        };
        let total = StagerSummary::combine(vec![shard(100, true, None), shard(50, true, None)]).unwrap();
        assert_eq!((total.bytes.transferred, total.objects.selected), (150, 4));
        assert_eq!(total.throughput_bytes_per_second, 20.0);
        assert!(total.complete);
        let total = StagerSummary::combine(vec![shard(1, true, None), shard(1, false, Some("AccessDenied"))]).unwrap();
        assert!(!total.complete);
        assert_eq!(total.reason.as_deref(), Some("AccessDenied"));
        assert_eq!(StagerSummary::combine(Vec::new()), None);
    }

    use super::*;
    use serde_json::json;

    fn ds() -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": "n", "generation": 2},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}},
        }))
        .unwrap()
    }

    fn job(status: serde_json::Value) -> Job {
        serde_json::from_value(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "status": status}),
        )
        .unwrap()
    }

    fn worker(name: &str) -> Option<Worker> {
        Some(Worker { name: name.into(), node: Some(name.into()) })
    }

    fn summary(selected: i64, done: i64) -> Option<StagerSummary> {
        serde_json::from_value(json!({"complete": true, "objects": {"selected": 2, "transferred": 2},
                                      "bytes": {"selected": selected, "transferred": done}, "throughput_bytes_per_second": 1048576.0}))
        .ok()
    }

    fn time(s: &str) -> Time {
        serde_json::from_value(json!(s)).unwrap()
    }

    #[test]
    fn all_workers_complete_means_ready_with_totals() {
        let complete = job(json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}));
        let observed = vec![
            Observed { worker: worker("a"), job: Some(complete.clone()), summary: summary(100, 100), message: None },
            Observed { worker: worker("b"), job: Some(complete), summary: summary(100, 100), message: None },
        ];
        let status = aggregate(&ds(), &observed, &time("2026-01-01T00:00:00Z"));
        assert_eq!(status.phase, Some(Phase::Succeeded));
        assert_eq!(status.nodes.as_deref(), Some("2/2"));
        assert_eq!(status.progress.as_deref(), Some("100%"));
        let ready = status.conditions.iter().find(|c| c.type_ == types::READY).unwrap();
        assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reasons::STAGED));
        assert_eq!(ready.observed_generation, Some(2));
        assert_eq!(status.totals.unwrap().bytes_done, 200);
    }

    #[test]
    fn a_failed_worker_fails_the_datastage_and_says_why() {
        let failed = job(json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}));
        let mut bad = StagerSummary::default();
        bad.failures.push(SummaryFailure { key: String::new(), error: "bucket 'x' does not exist".into() });
        let observed = vec![Observed { worker: worker("a"), job: Some(failed), summary: Some(bad), message: None }];
        let status = aggregate(&ds(), &observed, &time("2026-01-01T00:00:00Z"));
        assert_eq!(status.phase, Some(Phase::Failed));
        let failed = status.conditions.iter().find(|c| c.type_ == types::FAILED).unwrap();
        assert_eq!(failed.status, "True");
        assert!(failed.message.contains("bucket 'x' does not exist"), "{}", failed.message);
    }

    #[test]
    fn the_stagers_reason_names_the_failure_and_a_retry() {
        let refused = StagerSummary {
            reason: Some("BucketNotFound".into()),
            failures: vec![SummaryFailure { key: String::new(), error: "bucket 'x' does not exist".into() }],
            ..StagerSummary::default()
        };
        let failed = job(json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}));
        let observed =
            vec![Observed { worker: worker("a"), job: Some(failed), summary: Some(refused.clone()), message: None }];
        let status = aggregate(&ds(), &observed, &time("2026-01-01T00:00:00Z"));
        let condition = status.conditions.iter().find(|c| c.type_ == types::FAILED).unwrap();
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "BucketNotFound"));

        let mut unreachable = refused;
        unreachable.reason = Some("EndpointUnreachable".into());
        let retrying = job(json!({"active": 1, "failed": 1, "startTime": "2026-01-01T00:00:00Z"}));
        let observed =
            vec![Observed { worker: worker("a"), job: Some(retrying), summary: Some(unreachable), message: None }];
        let status = aggregate(&ds(), &observed, &time("2026-01-01T00:00:00Z"));
        assert_eq!(status.phase, Some(Phase::Running));
        let progressing = status.conditions.iter().find(|c| c.type_ == types::PROGRESSING).unwrap();
        assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("True", "EndpointUnreachable"));
        assert!(progressing.message.starts_with("retrying a: "), "{}", progressing.message);

        let strange = StagerSummary { reason: Some("Made Up".into()), ..StagerSummary::default() };
        let failed = job(json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}));
        let observed = vec![Observed { worker: worker("a"), job: Some(failed), summary: Some(strange), message: None }];
        let status = aggregate(&ds(), &observed, &time("2026-01-01T00:00:00Z"));
        let condition = status.conditions.iter().find(|c| c.type_ == types::FAILED).unwrap();
        assert_eq!(condition.reason, reasons::WORKER_FAILED, "only known CamelCase reasons pass through");
    }

    #[test]
    fn transition_times_change_only_on_a_real_transition() {
        let first = time("2026-01-01T00:00:00Z");
        let later = time("2026-01-01T00:05:00Z");
        let running = job(json!({"active": 1}));
        let observed =
            vec![Observed { worker: worker("a"), job: Some(running), summary: summary(100, 40), message: None }];
        let mut d = ds();
        d.status = Some(aggregate(&d, &observed, &first));
        assert_eq!(d.status.as_ref().unwrap().progress.as_deref(), Some("40%"));
        let again = aggregate(&d, &observed, &later);
        let progressing = again.conditions.iter().find(|c| c.type_ == types::PROGRESSING).unwrap();
        assert_eq!(progressing.last_transition_time, first, "still progressing: no transition");
        let done = job(json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}));
        let finished =
            vec![Observed { worker: worker("a"), job: Some(done), summary: summary(100, 100), message: None }];
        let end = aggregate(&d, &finished, &later);
        let ready = end.conditions.iter().find(|c| c.type_ == types::READY).unwrap();
        assert_eq!(ready.last_transition_time, later);
    }

    #[test]
    fn a_started_job_whose_pods_finished_is_running_until_judged() {
        let between = job(json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1}));
        assert_eq!(job_phase(Some(&between)), Phase::Running);
        assert_eq!(job_phase(Some(&job(json!({})))), Phase::Pending);
    }

    #[test]
    fn a_running_worker_counts_with_its_live_entry() {
        let mut d = ds();
        d.status = Some(serde_json::from_value(json!({"workers": [
            {"name": "a", "bytesDone": 30, "bytesTotal": 100, "objectsDone": 1, "objectsTotal": 3, "throughputBytesPerSecond": 10}]}))
        .unwrap());
        let observed =
            vec![Observed { worker: worker("a"), job: Some(job(json!({"active": 1}))), summary: None, message: None }];
        let status = aggregate(&d, &observed, &time("2026-01-01T00:00:00Z"));
        assert_eq!(status.progress.as_deref(), Some("30%"));
        let totals = status.totals.unwrap();
        assert_eq!((totals.bytes_done, totals.throughput_bytes_per_second, totals.eta_seconds), (30, 10, Some(7)));
    }

    #[test]
    fn blocked_datastages_carry_the_reason() {
        let status = blocked(
            &ds(),
            Phase::Pending,
            false,
            reasons::SECRET_NOT_FOUND,
            "create Secret 's3'",
            &time("2026-01-01T00:00:00Z"),
        );
        let progressing = status.conditions.iter().find(|c| c.type_ == types::PROGRESSING).unwrap();
        assert_eq!(progressing.reason, reasons::SECRET_NOT_FOUND);
        assert_eq!(status.phase, Some(Phase::Pending));
    }
}
