//! From what the workers did to the DataStage's status: phase, conditions
//! (per the Kubernetes API conventions), totals, one entry per worker, the
//! snapshot every node holds, and what the last sync changed. Pure
//! functions with an injected clock, unit-tested without a cluster.
//!
//! A worker's outcome is kept in its status entry together with the run it
//! belongs to, so it survives its Job and pods (`ttlSecondsAfterFinished`).
//!
//! An entry's `peerAddress` is the worker's own (it applies it with its own
//! field manager); the operator never writes it, so that an address read a
//! moment ago cannot overwrite the one a restarted worker just published.

use std::collections::BTreeMap;

use ferry_contract::Reason;
use ferry_contract::summary::{Changes, Summary};
use ferry_crds::plan::Direction;
use ferry_crds::{
    DataStage, DataStageStatus, Fanout, ObjectsAndBytes, Phase, SnapshotStatus, SyncChanges, Totals, WorkerStatus,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt as _;

use crate::runs::Run;
use crate::worker::Worker;
use ferry_crds::names::WORKER as WORKER_LABEL;

// The condition types and the operator's reasons are part of the
// DataStage API: the end-to-end tests and users' tooling read them too.
pub use ferry_crds::conditions::{reasons, types};

/// Passes in a row that may end with different snapshots before the
/// DataStage fails with `SnapshotsDiffer`.
pub const MAX_SNAPSHOT_RETRIES: i64 = 3;

/// What a worker's pods said.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Report {
    /// Nothing yet.
    #[default]
    Nothing,
    /// The summary of its last finished pods (one per shard, combined);
    /// boxed, as it is many times the size of the other variants.
    Summary(Box<Summary>),
    /// Text instead of a summary: the end of a log, or why a pod was refused.
    Message(String),
}

/// What was observed of one worker in the current run.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The worker.
    pub worker: Worker,
    /// Its Job in the current run, if it exists.
    pub job: Option<Job>,
    /// What its pods said.
    pub report: Report,
    /// How many of its completion indexes left a summary ([`pod_report`]).
    pub summaries: usize,
    /// While the worker has work left: why the node it is pinned to, or
    /// its running pod is bound to, cannot run it now (not Ready, or
    /// deleted); `None` when it can.
    pub node_trouble: Option<String>,
    /// Why its Job cannot create its pods, in the Job controller's words
    /// (its `FailedCreate` Event); `None` while it can, or has.
    pub pods_refused: Option<String>,
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

/// Label (and, on older clusters, annotation) that carries an Indexed Job
/// pod's completion index.
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// What `worker`'s pods reported: for each completion index (one for a
/// single-pod Job, one per shard of an Indexed Job) the most recently
/// finished pod's summary, combined over the shards; or, failing that, the
/// last lines of the message, in order. With it, how many of those
/// indexes left a summary: a Complete Job's count is every index once the
/// watch of pods has caught up with the watch of Jobs.
pub fn pod_report(pods: &[Pod], worker: &str) -> (Report, usize) {
    let latest = latest_endings(pods, worker);
    if latest.is_empty() {
        // A pod refused by the node (or still waiting) explains itself in its status.
        let mut own = pods.iter().filter(|p| p.labels().get(WORKER_LABEL).map(String::as_str) == Some(worker));
        let report = own.find_map(|p| p.status.as_ref()?.message.clone()).map_or(Report::Nothing, Report::Message);
        return (report, 0);
    }
    let (mut summaries, mut logs) = (Vec::new(), Vec::new());
    for message in &latest {
        match serde_json::from_str::<Summary>(message) {
            Ok(summary) => summaries.push(summary),
            Err(_) => logs.push(message),
        }
    }
    let reported = summaries.len();
    if let Some(message) = logs.first() {
        let lines: Vec<&str> = message.lines().filter(|l| !l.trim().is_empty()).collect();
        return (Report::Message(lines[lines.len().saturating_sub(3)..].join(" / ")), reported);
    }
    let report = Summary::combine(summaries).map_or(Report::Nothing, |summary| Report::Summary(Box::new(summary)));
    (report, reported)
}

/// The termination message of the most recently finished pod of each of
/// `worker`'s completion indexes.
fn latest_endings(pods: &[Pod], worker: &str) -> Vec<String> {
    let own = pods.iter().filter(|p| p.labels().get(WORKER_LABEL).map(String::as_str) == Some(worker));
    let mut latest: BTreeMap<Option<&String>, (&Time, String)> = BTreeMap::new();
    for pod in own {
        let Some(terminated) = finished(pod) else { continue };
        let Some(at) = terminated.finished_at.as_ref() else { continue };
        let index = pod.labels().get(COMPLETION_INDEX).or_else(|| pod.annotations().get(COMPLETION_INDEX));
        if latest.get(&index).is_none_or(|(seen, _)| seen.0 < at.0) {
            latest.insert(index, (at, terminated.message.clone().unwrap_or_default()));
        }
    }
    latest.into_values().map(|(_, message)| message).collect()
}

/// How a worker pod ended: its stager container's end, or, when an init
/// container (the hostPath prepare step) failed and the stager never ran,
/// that one's.
fn finished(pod: &Pod) -> Option<&ContainerStateTerminated> {
    let status = pod.status.as_ref()?;
    let failed_init = status.init_container_statuses.iter().flatten().filter_map(ended).find(|t| t.exit_code != 0);
    failed_init.or_else(|| ended(status.container_statuses.as_ref()?.first()?))
}

fn ended(status: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    status.state.as_ref()?.terminated.as_ref()
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

/// The three conditions for a phase with one reason and message.
pub(crate) fn conditions(ds: &DataStage, phase: Phase, reason: &str, message: &str, now: &Time) -> Vec<Condition> {
    let existing = ds.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let generation = ds.metadata.generation;
    let failed = phase == Phase::Failed;
    vec![
        condition(existing, types::READY, phase == Phase::Succeeded, reason, message, generation, now),
        condition(
            existing,
            types::PROGRESSING,
            matches!(phase, Phase::Pending | Phase::Running),
            reason,
            message,
            generation,
            now,
        ),
        condition(
            existing,
            types::FAILED,
            failed,
            if failed { reason } else { reasons::NONE },
            if failed { message } else { "" },
            generation,
            now,
        ),
    ]
}

/// The status of a DataStage that cannot proceed: `phase` with a Failed
/// (`failed` = true) or a waiting Progressing condition carrying `reason`.
/// What earlier runs recorded (workers, snapshot, syncs) is kept.
pub fn blocked(ds: &DataStage, phase: Phase, failed: bool, reason: &str, message: &str, now: &Time) -> DataStageStatus {
    let previous = ds.status.clone().unwrap_or_default();
    let phase = if failed { Phase::Failed } else { phase };
    DataStageStatus {
        phase: Some(phase),
        observed_generation: ds.metadata.generation,
        conditions: conditions(ds, phase, reason, message, now),
        next_sync_time: None,
        ..previous
    }
}

/// A worker's status entry in the current run: from its Job and report
/// while they say something; from its recorded entry once it finished and
/// nothing new is said (its Job gone after finishing, or its pods gone
/// before its Job: ttlSecondsAfterFinished deletes in the foreground); a
/// fresh Pending entry otherwise.
fn worker_entry(observed: &Observed, recorded: Option<&WorkerStatus>, run: i64, fanout: Fanout) -> WorkerStatus {
    let nothing_new = observed.job.is_none() || !matches!(observed.report, Report::Summary(_));
    if nothing_new && let Some(done) = recorded.filter(|w| w.finished_run(run)) {
        return WorkerStatus { peer_address: None, ..done.clone() };
    }
    let phase = job_phase(observed.job.as_ref());
    let mut entry = WorkerStatus {
        name: observed.worker.name.clone(),
        node: observed.worker.node.clone(),
        phase: Some(phase),
        run: Some(run),
        ..WorkerStatus::default()
    };
    match &observed.report {
        Report::Summary(summary) => {
            entry.throttled_requests = Some(summary.throttled as i64).filter(|n| *n > 0);
            entry.bytes_done = summary.bytes_in_place() as i64;
            entry.bytes_total = summary.bytes.selected as i64;
            entry.bytes_failed = summary.bytes.failed as i64;
            entry.objects_done = summary.objects.done() as i64;
            entry.objects_total = summary.objects.selected as i64;
            entry.objects_failed = summary.objects.failed as i64;
            if phase == Phase::Running {
                entry.throughput_bytes_per_second = summary.throughput_bytes_per_second as i64;
            }
            entry.snapshot = summary.snapshot.as_ref().map(|s| s.digest.clone());
            entry.revision = summary.snapshot.as_ref().and_then(|s| s.revision.clone());
            entry.reason = summary.reason.map(|r| r.to_string());
            // What a quota refused is the whole dataset the worker selected,
            // as far as it listed: the operator waits for room for that much.
            if let Some(dataset) = summary.dataset_bytes.filter(|_| summary.reason == Some(Reason::QuotaExceeded)) {
                entry.bytes_total = dataset as i64;
            }
            entry.disk = summary.disk.clone();
            entry.message = summary_message(summary);
            if fanout == Fanout::PeerToPeer {
                fold_peer_counts(&mut entry, summary);
            }
        }
        Report::Message(message) => entry.message = Some(message.clone()),
        Report::Nothing => {}
    }
    // Until its final summary exists, a running worker's own live entry
    // (written by the stager) is the best knowledge of its progress.
    if !matches!(observed.report, Report::Summary(_))
        && let Some(live) = recorded.filter(|w| w.run == Some(run))
    {
        entry.bytes_done = live.bytes_done;
        entry.bytes_total = live.bytes_total;
        entry.objects_done = live.objects_done;
        entry.objects_total = live.objects_total;
        entry.throughput_bytes_per_second = live.throughput_bytes_per_second;
        // Only a fleet's counts: copying a Direct run's would make the
        // operator keep whatever an earlier PeerToPeer run left there.
        if fanout == Fanout::PeerToPeer {
            entry.bytes_from_peers = live.bytes_from_peers;
            entry.bytes_served = live.bytes_served;
            entry.peer_failures = live.peer_failures;
        }
    }
    // The last measurement of the worker's disk stands until a new summary
    // brings another: the operator counts on it to know the node's room.
    if entry.disk.is_none() {
        entry.disk = recorded.and_then(|w| w.disk.clone());
    }
    // Pods' last use outlives runs; an eviction holds for the run it
    // evicted (a new run stages the node again).
    entry.last_used_time = recorded.and_then(|w| w.last_used_time.clone());
    // What a node's `current` names outlives runs too (an eviction clears it).
    entry.current_version = recorded.and_then(|w| w.current_version.clone());
    entry.evicted = recorded.filter(|w| w.run == Some(run)).and_then(|w| w.evicted.clone());
    entry
}

/// How long a Complete Job's worker waits for its pods' summaries before
/// it is judged with what the operator has.
pub const SUMMARY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether a Complete Job's pods have not all shown their summaries yet,
/// and it completed less than [`SUMMARY_PATIENCE`] ago. Jobs and pods come
/// through separate watches: under load the Job's Complete can arrive
/// first, and a DataStage judged then would say Succeeded with nothing
/// counted. The pod's update wakes the DataStage when it arrives.
fn awaiting_summaries(observed: &Observed, now: &Time) -> bool {
    let Some(status) = observed.job.as_ref().and_then(|j| j.status.as_ref()) else { return false };
    let pods = usize::try_from(status.succeeded.unwrap_or(1)).unwrap_or(1).max(1);
    if observed.summaries >= pods {
        return false;
    }
    status
        .completion_time
        .as_ref()
        .is_some_and(|done| now.0.duration_since(done.0).as_secs_f64() < SUMMARY_PATIENCE.as_secs_f64())
}

/// What fleet staging did in a worker's run, from its summary: bytes from
/// peers and from the store (what it copied less what peers gave it),
/// bytes served, peers dropped.
fn fold_peer_counts(entry: &mut WorkerStatus, summary: &Summary) {
    let peers = summary.peers;
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    entry.bytes_from_peers = Some(count(peers.bytes_from_peers));
    entry.bytes_from_store = Some(count(summary.bytes.transferred.saturating_sub(peers.bytes_from_peers)));
    entry.bytes_served = Some(count(peers.bytes_served));
    entry.peer_failures = Some(count(peers.peer_failures));
}

/// The first failure of a summary, in a line.
fn summary_message(summary: &Summary) -> Option<String> {
    let first = summary.failures.first()?;
    Some(if first.key.is_empty() {
        first.error.clone()
    } else {
        format!("{} objects failed; first: {}: {}", summary.objects.failed, first.key, first.error)
    })
}

/// The phase of a DataStage from its workers' phases.
fn overall_phase(workers: &[WorkerStatus]) -> Phase {
    let phases: Vec<Phase> = workers.iter().filter_map(|w| w.phase).collect();
    let succeeded = phases.iter().filter(|p| **p == Phase::Succeeded).count();
    if phases.contains(&Phase::Failed) {
        Phase::Failed
    } else if !phases.is_empty() && succeeded == phases.len() {
        Phase::Succeeded
    } else if phases.contains(&Phase::Running) || succeeded > 0 {
        Phase::Running
    } else {
        Phase::Pending
    }
}

/// Totals over the workers of the current run.
fn totals(workers: &[WorkerStatus], previous: Option<&Totals>, phase: Phase, run_is_new: bool, now: &Time) -> Totals {
    let mut totals = Totals::default();
    for w in workers {
        totals.bytes_total += w.bytes_total;
        totals.bytes_done += w.bytes_done;
        totals.bytes_failed += w.bytes_failed;
        totals.objects_total += w.objects_total;
        totals.objects_done += w.objects_done;
        totals.objects_failed += w.objects_failed;
        totals.throughput_bytes_per_second += w.throughput_bytes_per_second;
    }
    totals.bytes_from_peers = sum_known(workers.iter().map(|w| w.bytes_from_peers));
    totals.bytes_from_store = sum_known(workers.iter().map(|w| w.bytes_from_store));
    let previous = previous.filter(|_| !run_is_new).cloned().unwrap_or_default();
    totals.start_time = previous.start_time.or_else(|| (phase != Phase::Pending).then(|| now.clone()));
    totals.completion_time = match phase {
        Phase::Succeeded | Phase::Failed => previous.completion_time.or_else(|| Some(now.clone())),
        _ => None,
    };
    if totals.throughput_bytes_per_second > 0 {
        totals.eta_seconds = Some((totals.bytes_total - totals.bytes_done).max(0) / totals.throughput_bytes_per_second);
    }
    totals
}

/// The sum of the values that are known; `None` when none is.
fn sum_known(values: impl Iterator<Item = Option<i64>>) -> Option<i64> {
    values.flatten().reduce(i64::saturating_add)
}

/// Bytes per second over a finished run: what it moved over how long it took.
fn average_rate(totals: &Totals) -> i64 {
    let (Some(start), Some(end)) = (&totals.start_time, &totals.completion_time) else { return 0 };
    let seconds = end.0.duration_since(start.0).as_secs_f64();
    if seconds <= 0.0 { 0 } else { (totals.bytes_done as f64 / seconds) as i64 }
}

/// Whether every worker holds one snapshot: `Some(true)` if they agree,
/// `Some(false)` if two differ, `None` when a worker reported none.
fn snapshots_agree(workers: &[WorkerStatus]) -> Option<bool> {
    let digests: Option<Vec<&str>> = workers.iter().map(|w| w.snapshot.as_deref()).collect();
    let digests = digests?;
    Some(digests.windows(2).all(|pair| pair[0] == pair[1]))
}

/// What the run's workers changed, summed (from the summaries of this
/// reconciliation; `None` when no worker reported changes).
fn sync_changes(observed: &[Observed]) -> Option<SyncChanges> {
    let mut total: Option<Changes> = None;
    for o in observed {
        if let Report::Summary(summary) = &o.report
            && let Some(changes) = &summary.changes
        {
            let sum = total.get_or_insert_with(Changes::default);
            for (into, from) in [
                (&mut sum.added, changes.added),
                (&mut sum.updated, changes.updated),
                (&mut sum.removed, changes.removed),
            ] {
                into.objects += from.objects;
                into.bytes += from.bytes;
            }
        }
    }
    let amount =
        |a: ferry_contract::summary::Amount| ObjectsAndBytes { objects: a.objects as i64, bytes: a.bytes as i64 };
    total.map(|c| SyncChanges { added: amount(c.added), updated: amount(c.updated), removed: amount(c.removed) })
}

/// Everything the aggregation needs besides the DataStage.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The current run.
    pub run: &'a Run,
    /// Which way data moves.
    pub direction: Direction,
    /// Whether the workers feed each other (their entries then count what
    /// came from peers and from the store).
    pub fanout: Fanout,
    /// The workers of the current run, as observed.
    pub observed: &'a [Observed],
    /// Now.
    pub now: &'a Time,
}

/// Aggregates the workers of the current run into the DataStage's status.
///
/// Long on purpose: one pass in the order the status's fields depend on
/// each other (workers, phase, totals, reason and message, conditions,
/// snapshot), each step reading what the ones before settled; the steps
/// with rules of their own are the functions it calls.
pub fn aggregate(ds: &DataStage, inputs: &Inputs<'_>) -> DataStageStatus {
    let previous = ds.status.clone().unwrap_or_default();
    let run = inputs.run.number;
    let run_is_new = previous.run != Some(run);
    let recorded = |name: &str| previous.workers.iter().find(|w| w.name == name);
    let workers: Vec<WorkerStatus> =
        inputs.observed.iter().map(|o| worker_entry(o, recorded(&o.worker.name), run, inputs.fanout)).collect();
    let mut phase = overall_phase(&workers);
    // The workers' entries say their Jobs finished (so no Job is made again
    // if they expire now); the DataStage is not done until it has counted.
    // A run judged already is not reopened: its pods may go before its Jobs.
    let judged = !run_is_new && previous.phase.is_some_and(Phase::is_finished);
    if phase == Phase::Succeeded && !judged && inputs.observed.iter().any(|o| awaiting_summaries(o, inputs.now)) {
        phase = Phase::Running;
    }
    let finished_now = phase.is_finished() && !judged;
    let mut totals = totals(&workers, previous.totals.as_ref(), phase, run_is_new, inputs.now);

    let mut status = DataStageStatus {
        observed_generation: ds.metadata.generation,
        run: Some(run),
        run_inputs: Some(inputs.run.inputs.clone()),
        snapshot_retries: previous.snapshot_retries.filter(|_| inputs.run.started.is_none()),
        last_sync: previous.last_sync.clone(),
        last_sync_time: previous.last_sync_time.clone(),
        snapshot: previous.snapshot.clone(),
        versions: previous.versions.clone(),
        ..DataStageStatus::default()
    };
    // Workers refused for room they could have make the run wait, not fail
    // (the controller holds the DataStage once the others are over): a pod
    // gated on it keeps waiting instead of being told it failed.
    let waits_for_room = phase == Phase::Failed && crate::disks::only_waiting_for_room(&workers);
    if waits_for_room {
        let others_run = workers.iter().any(|w| matches!(w.phase, Some(Phase::Running | Phase::Pending)));
        phase = if others_run { Phase::Running } else { Phase::Pending };
    }
    let (mut reason, mut message) = phase_reason(phase, &workers, &totals);
    // The stager's refusal says what to lower and names no interface; the
    // DataStage says where its reserve is set.
    if reason == Reason::InsufficientCapacity.as_str() && !waits_for_room {
        message = format!("{message}; the reserve is {}", crate::disks::CAPACITY_RESERVE_FIELD);
    }
    if waits_for_room {
        reason = Reason::InsufficientCapacity.as_str();
        let refused = workers.iter().filter(|w| w.phase == Some(Phase::Failed));
        message =
            crate::disks::waiting_message(refused.filter_map(|w| Some((crate::disks::place(w), w.disk.as_ref()?))));
    }
    if matches!(phase, Phase::Pending | Phase::Running)
        && let Some((worker, trouble)) =
            inputs.observed.iter().find_map(|o| Some((&o.worker.name, o.node_trouble.as_deref()?)))
    {
        // Said before a stager's reason: it is why nothing moves now.
        reason = reasons::NODE_NOT_READY;
        message = format!(
            "worker {worker}: {trouble}; its pod goes on when the node is back, or its Job starts another pod once the node is deleted"
        );
    }
    if matches!(phase, Phase::Pending | Phase::Running)
        && let Some((job, refused)) = inputs.observed.iter().find_map(|o| {
            Some((o.job.as_ref().and_then(|j| j.metadata.name.clone()).unwrap_or_default(), o.pods_refused.as_deref()?))
        })
    {
        // Nothing at all moves: no pod exists to say anything.
        reason = reasons::PODS_NOT_CREATED;
        message = format!(
            "worker Job {job} cannot create its pods: {refused}. Once that is fixed the Job creates them (it keeps trying)"
        );
    }

    if phase == Phase::Succeeded && inputs.direction == Direction::Pull {
        match snapshots_agree(&workers) {
            Some(true) => {
                let first = &workers[0];
                status.snapshot = Some(SnapshotStatus {
                    objects: first.objects_total,
                    bytes: first.bytes_total,
                    digest: first.snapshot.clone().unwrap_or_default(),
                    revision: first.revision.clone(),
                });
                status.snapshot_retries = None;
            }
            Some(false) => {
                let retries = status.snapshot_retries.unwrap_or(0);
                let listed: Vec<String> =
                    workers.iter().map(|w| format!("{}={}", w.name, short(w.snapshot.as_deref()))).collect();
                if retries < MAX_SNAPSHOT_RETRIES {
                    // Another pass: each worker lists again and moves only what differs.
                    status.run = Some(run + 1);
                    status.snapshot_retries = Some(retries + 1);
                    phase = Phase::Running;
                    reason = reasons::RESYNCING;
                    message = format!(
                        "workers staged different versions of the dataset ({}); the store changed while they listed it, so every worker syncs again (pass {} of {MAX_SNAPSHOT_RETRIES})",
                        listed.join(", "),
                        retries + 1
                    );
                } else {
                    phase = Phase::Failed;
                    reason = reasons::SNAPSHOTS_DIFFER;
                    message = format!(
                        "workers still hold different versions of the dataset after {MAX_SNAPSHOT_RETRIES} passes ({}): the store keeps changing; the next spec change or scheduled sync tries again",
                        listed.join(", ")
                    );
                }
            }
            None => {}
        }
    }
    if finished_now && phase.is_finished() {
        status.last_sync_time = Some(inputs.now.clone());
        status.last_sync = sync_changes(inputs.observed).or(status.last_sync);
    }
    if phase == Phase::Succeeded || phase == Phase::Failed {
        totals.throughput_bytes_per_second = 0;
        totals.eta_seconds = None;
    }
    // An evicted copy is not held: NODES counts only the nodes that hold it.
    let succeeded = workers.iter().filter(|w| w.phase == Some(Phase::Succeeded) && w.evicted.is_none()).count();
    status.progress = if totals.bytes_total > 0 {
        Some(format!("{}%", totals.bytes_done * 100 / totals.bytes_total))
    } else {
        (phase == Phase::Succeeded).then(|| "100%".to_owned())
    };
    // A finished run shows its average; a running one its current rate.
    let rate = if phase == Phase::Succeeded { average_rate(&totals) } else { totals.throughput_bytes_per_second };
    status.throughput = Some(human_rate(rate));
    status.nodes = Some(format!("{succeeded}/{}", workers.len()));
    status.phase = Some(phase);
    status.conditions = conditions(ds, phase, reason, &message, inputs.now);
    status.totals = Some(totals);
    status.workers = workers;
    status
}

/// Eight digits of a digest, for messages.
fn short(digest: Option<&str>) -> &str {
    digest.map_or("none", |d| &d[..d.len().min(8)])
}

/// The Ready/Progressing reason and message for a phase.
fn phase_reason(phase: Phase, workers: &[WorkerStatus], totals: &Totals) -> (&'static str, String) {
    let stager_reason = known_reason;
    match phase {
        Phase::Succeeded => (
            reasons::STAGED,
            format!(
                "{} objects ({} bytes) staged by {} workers",
                totals.objects_done,
                totals.bytes_done,
                workers.len()
            ),
        ),
        Phase::Failed => {
            // A failed worker's own reason (BucketNotFound, ...) says more than WorkerFailed.
            let reason = workers
                .iter()
                .filter(|w| w.phase == Some(Phase::Failed))
                .find_map(stager_reason)
                .unwrap_or(reasons::WORKER_FAILED);
            (reason, failure_message(workers))
        }
        Phase::Running | Phase::Pending => {
            // A worker that is being retried after a run that could not proceed.
            let retrying = workers
                .iter()
                .filter(|w| matches!(w.phase, Some(Phase::Running | Phase::Pending)))
                .find_map(|w| stager_reason(w).map(|r| (r, w)));
            match retrying {
                Some((reason, worker)) => {
                    (reason, format!("retrying {}: {}", worker.name, worker.message.clone().unwrap_or_default()))
                }
                None if phase == Phase::Running => {
                    let done = workers.iter().filter(|w| w.phase == Some(Phase::Succeeded)).count();
                    (reasons::WORKERS_RUNNING, format!("{done} of {} workers finished", workers.len()))
                }
                None => (reasons::WAITING_FOR_WORKERS, format!("waiting for {} workers to start", workers.len())),
            }
        }
    }
}

/// The stager's reason recorded for a worker, when it is one this build knows.
fn known_reason(worker: &WorkerStatus) -> Option<&'static str> {
    let recorded = worker.reason.as_deref()?;
    Reason::ALL.iter().map(|r| r.as_str()).find(|known| *known == recorded)
}

fn failure_message(workers: &[WorkerStatus]) -> String {
    let failed: Vec<&WorkerStatus> = workers.iter().filter(|w| w.phase == Some(Phase::Failed)).collect();
    let first = failed.first().map(|w| format!("{}: {}", w.name, w.message.clone().unwrap_or_else(|| "failed".into())));
    format!("{} of {} workers failed; {}", failed.len(), workers.len(), first.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runs::Trigger;
    use ferry_contract::PeerCounts;
    use ferry_contract::summary::{Amount, Counts, Failure, Snapshot};
    use serde_json::json;

    fn ds(status: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "d", "namespace": "n", "generation": 2},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}},
            "status": status,
        }))
        .unwrap()
    }

    fn job(status: serde_json::Value) -> Option<Job> {
        serde_json::from_value(
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}, "status": status}),
        )
        .ok()
    }

    fn complete() -> Option<Job> {
        job(
            json!({"succeeded": 1, "startTime": "2026-01-01T00:00:00Z", "conditions": [{"type": "Complete", "status": "True"}]}),
        )
    }

    fn failed() -> Option<Job> {
        job(json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True"}]}))
    }

    fn summary(bytes: u64, digest: &str) -> Report {
        Report::Summary(Box::new(Summary {
            complete: true,
            objects: Counts { selected: 2, transferred: 2, ..Counts::default() },
            bytes: Counts { selected: bytes, transferred: bytes, ..Counts::default() },
            throughput_bytes_per_second: 1048576.0,
            changes: Some(Changes { added: Amount { objects: 2, bytes }, ..Changes::default() }),
            snapshot: Some(Snapshot {
                objects: 2,
                bytes,
                digest: digest.into(),
                revision: Some(format!("commit-{digest}")),
            }),
            ..Summary::default()
        }))
    }

    fn observed(name: &str, job: Option<Job>, report: Report) -> Observed {
        let summaries = usize::from(matches!(report, Report::Summary(_)));
        Observed { worker: Worker::on_node(name), job, report, summaries, node_trouble: None, pods_refused: None }
    }

    fn time(s: &str) -> Time {
        serde_json::from_value(json!(s)).unwrap()
    }

    fn run(number: i64) -> Run {
        Run { number, inputs: "i".into(), started: None }
    }

    fn aggregate_at(d: &DataStage, run: &Run, observed: &[Observed], now: &str) -> DataStageStatus {
        aggregate(d, &Inputs { run, direction: Direction::Pull, fanout: Fanout::Direct, observed, now: &time(now) })
    }

    fn condition_of<'a>(status: &'a DataStageStatus, kind: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == kind).unwrap()
    }

    /// Seen under a burst of a thousand DataStages: the Job's Complete
    /// reached the operator before its pod's summary, and the DataStage
    /// said Succeeded with nothing counted.
    #[test]
    fn a_complete_job_whose_summaries_are_not_in_yet_is_still_running_for_a_while() {
        let d = ds(json!({"run": 1, "phase": "Running"}));
        let done_at = |shards: i64| {
            job(
                json!({"succeeded": shards, "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z",
                       "conditions": [{"type": "Complete", "status": "True"}]}),
            )
        };
        let early = aggregate_at(&d, &run(1), &[observed("a", done_at(1), Report::Nothing)], "2026-01-01T00:01:10Z");
        assert_eq!(early.phase, Some(Phase::Running), "{early:?}");
        // The worker's own entry says its Job finished: were the Job to
        // expire now, it is not made again.
        assert!(early.workers[0].finished_run(1), "{early:?}");
        // Its summary arrives: judged at once, with the counts.
        let arrived =
            aggregate_at(&d, &run(1), &[observed("a", done_at(1), summary(10, "aa"))], "2026-01-01T00:01:11Z");
        assert_eq!(arrived.phase, Some(Phase::Succeeded));
        assert_eq!(arrived.workers[0].bytes_done, 10);
        // An Indexed Job of three shards with two summaries in still waits.
        let mut two_of_three = observed("a", done_at(3), summary(10, "aa"));
        two_of_three.summaries = 2;
        let partial = aggregate_at(&d, &run(1), &[two_of_three], "2026-01-01T00:01:10Z");
        assert_eq!(partial.phase, Some(Phase::Running));
        // A summary that never comes (its pod deleted) does not hold the
        // DataStage for ever.
        let late = aggregate_at(&d, &run(1), &[observed("a", done_at(1), Report::Nothing)], "2026-01-01T00:01:31Z");
        assert_eq!(late.phase, Some(Phase::Succeeded));
    }

    #[test]
    fn all_workers_complete_with_one_snapshot_means_ready_with_totals_and_the_average_rate() {
        let mut d = ds(
            json!({"run": 1, "phase": "Running", "totals": {"objectsTotal": 0, "objectsDone": 0, "objectsFailed": 0,
            "bytesTotal": 0, "bytesDone": 0, "bytesFailed": 0, "throughputBytesPerSecond": 0, "startTime": "2026-01-01T00:00:00Z"}}),
        );
        d.status.as_mut().unwrap().run_inputs = Some("i".into());
        let observed =
            [observed("a", complete(), summary(1 << 20, "aa")), observed("b", complete(), summary(1 << 20, "aa"))];
        let status = aggregate_at(&d, &run(1), &observed, "2026-01-01T00:00:02Z");
        assert_eq!(status.phase, Some(Phase::Succeeded));
        assert_eq!((status.nodes.as_deref(), status.progress.as_deref()), (Some("2/2"), Some("100%")));
        let ready = condition_of(&status, types::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str(), ready.observed_generation),
            ("True", reasons::STAGED, Some(2))
        );
        assert_eq!(status.totals.as_ref().unwrap().bytes_done, 2 << 20);
        assert_eq!(status.throughput.as_deref(), Some("1 MiB/s"), "2 MiB in 2 s, not 0 B/s");
        assert_eq!(status.snapshot.as_ref().map(|s| s.digest.as_str()), Some("aa"));
        assert_eq!(
            status.snapshot.as_ref().and_then(|s| s.revision.as_deref()),
            Some("commit-aa"),
            "the source's revision"
        );
        let sync = status.last_sync.clone().unwrap();
        assert_eq!((sync.added.objects, sync.added.bytes), (4, 2 << 20));
        assert_eq!(status.last_sync_time, Some(time("2026-01-01T00:00:02Z")));
        assert!(status.workers.iter().all(|w| w.run == Some(1) && w.snapshot.as_deref() == Some("aa")));
    }

    #[test]
    fn a_finished_worker_whose_job_was_deleted_stays_finished() {
        let first = aggregate_at(
            &ds(json!({})),
            &run(1),
            &[observed("a", complete(), summary(100, "aa"))],
            "2026-01-01T00:00:01Z",
        );
        let mut d = ds(json!({}));
        d.status = Some(first);
        // ttlSecondsAfterFinished deleted the Job and its pods.
        let later = aggregate_at(&d, &run(1), &[observed("a", None, Report::Nothing)], "2026-01-01T01:00:00Z");
        assert_eq!(later.phase, Some(Phase::Succeeded));
        assert_eq!(later.workers[0].bytes_done, 100);
        assert_eq!(later.last_sync_time, Some(time("2026-01-01T00:00:01Z")), "no new sync happened");
        // A new run does not inherit the finished entry.
        let next = aggregate_at(&d, &run(2), &[observed("a", None, Report::Nothing)], "2026-01-01T01:00:00Z");
        assert_eq!(next.phase, Some(Phase::Pending));
    }

    /// Seen in CI: ttlSecondsAfterFinished deletes a Job in the foreground,
    /// its pods first, so for a moment the Job stands with no pod and no
    /// summary. An edit reconciled then must not reopen the finished run
    /// (it said Running, and would say Succeeded, with its Event, again)
    /// nor drop what the summary recorded.
    #[test]
    fn a_finished_run_whose_pods_go_before_its_job_stays_finished_with_its_counts() {
        let completed =
            job(json!({"succeeded": 1, "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:01:00Z",
                   "conditions": [{"type": "Complete", "status": "True"}]}));
        let mut d = ds(json!({}));
        let judged =
            aggregate_at(&d, &run(2), &[observed("a", completed.clone(), summary(100, "aa"))], "2026-01-01T00:01:01Z");
        assert_eq!(judged.phase, Some(Phase::Succeeded));
        d.status = Some(judged.clone());
        let edited = aggregate_at(&d, &run(2), &[observed("a", completed, Report::Nothing)], "2026-01-01T00:01:02Z");
        assert_eq!(edited.phase, Some(Phase::Succeeded), "{edited:?}");
        assert_eq!(edited.workers, judged.workers, "the summary's counts and snapshot stay");
        assert_eq!(edited.last_sync_time, judged.last_sync_time, "no new sync happened");
    }

    #[test]
    fn an_eviction_and_a_last_use_stay_with_the_entry_and_an_evicted_node_does_not_count_as_holding() {
        let both = [observed("a", complete(), summary(100, "aa")), observed("b", complete(), summary(100, "aa"))];
        let mut d = ds(json!({}));
        d.status = Some(aggregate_at(&d, &run(1), &both, "2026-01-01T00:00:01Z"));
        assert_eq!(d.status.as_ref().unwrap().nodes.as_deref(), Some("2/2"));
        let workers = &mut d.status.as_mut().unwrap().workers;
        workers[0].evicted =
            Some(ferry_crds::Eviction { time: time("2026-01-02T00:00:00Z"), message: "m".into(), removed: false });
        workers[1].last_used_time = Some(time("2026-01-02T00:00:00Z"));
        // The Jobs still exist: the entries are rebuilt from them.
        let later = aggregate_at(&d, &run(1), &both, "2026-01-03T00:00:00Z");
        assert!(later.workers[0].evicted.is_some() && later.workers[1].last_used_time.is_some(), "{later:?}");
        assert_eq!((later.phase, later.nodes.as_deref()), (Some(Phase::Succeeded), Some("1/2")));
        // A new run stages the node again, and keeps the last use.
        let next = aggregate_at(
            &d,
            &run(2),
            &[observed("a", None, Report::Nothing), observed("b", None, Report::Nothing)],
            "2026-01-03T00:00:00Z",
        );
        assert!(next.workers[0].evicted.is_none() && next.workers[1].last_used_time.is_some(), "{next:?}");
    }

    #[test]
    fn a_worker_refused_for_room_it_could_have_makes_the_run_wait_not_fail() {
        let refused = |needed: u64| {
            let disk = ferry_contract::DiskSpace {
                filesystem: "8:1".into(),
                size_bytes: 32 << 20,
                free_bytes: 10 << 20,
                needed_bytes: Some(needed),
                claimed_bytes: None,
                measured_at: 100,
            };
            Report::Summary(Box::new(Summary {
                reason: Some(Reason::InsufficientCapacity),
                disk: Some(disk),
                ..Summary::default()
            }))
        };
        let running = job(json!({"active": 1}));
        let d = ds(json!({}));
        let both = [observed("a", failed(), refused(20 << 20)), observed("b", running, Report::Nothing)];
        let status = aggregate_at(&d, &run(1), &both, "2026-01-01T00:00:01Z");
        let condition = condition_of(&status, "Progressing");
        assert_eq!((status.phase, condition.reason.as_str()), (Some(Phase::Running), "InsufficientCapacity"));
        assert!(
            condition.message.starts_with(
                "waiting for room: node a needs 20.0 MiB free (its reserve included) where 10.0 MiB of 32.0 MiB is free"
            ),
            "{}",
            condition.message
        );
        let alone = aggregate_at(&d, &run(1), &both[..1], "2026-01-01T00:00:01Z");
        assert_eq!(alone.phase, Some(Phase::Pending));
        // A need larger than the filesystem is a failure: no wait helps.
        let too_big = aggregate_at(&d, &run(1), &[observed("a", failed(), refused(40 << 20))], "2026-01-01T00:00:01Z");
        assert_eq!(too_big.phase, Some(Phase::Failed));
    }

    #[test]
    fn workers_that_staged_different_snapshots_sync_again_then_fail() {
        let observed = [observed("a", complete(), summary(100, "aa")), observed("b", complete(), summary(100, "bb"))];
        let status = aggregate_at(&ds(json!({"run": 1, "runInputs": "i"})), &run(1), &observed, "2026-01-01T00:00:01Z");
        assert_eq!((status.phase, status.run, status.snapshot_retries), (Some(Phase::Running), Some(2), Some(1)));
        assert_eq!(condition_of(&status, types::PROGRESSING).reason, reasons::RESYNCING);
        assert_eq!(status.snapshot, None, "Ready only once every node holds one snapshot");

        let exhausted = ds(json!({"run": 4, "runInputs": "i", "snapshotRetries": MAX_SNAPSHOT_RETRIES}));
        let status = aggregate_at(&exhausted, &run(4), &observed, "2026-01-01T00:00:01Z");
        assert_eq!((status.phase, status.run), (Some(Phase::Failed), Some(4)));
        assert_eq!(condition_of(&status, types::FAILED).reason, reasons::SNAPSHOTS_DIFFER);

        // A new spec or a scheduled sync starts counting afresh.
        let fresh = Run { number: 5, inputs: "i".into(), started: Some(Trigger::Scheduled) };
        let status = aggregate_at(&exhausted, &fresh, &observed, "2026-01-01T00:00:01Z");
        assert_eq!(status.snapshot_retries, Some(1));
    }

    #[test]
    fn a_failed_worker_fails_the_datastage_with_the_stagers_reason_and_bytes_failed() {
        let refused = Report::Summary(Box::new(Summary {
            reason: Some(Reason::BucketNotFound),
            failures: vec![Failure { key: String::new(), error: "bucket 'x' does not exist".into() }],
            ..Summary::default()
        }));
        let status = aggregate_at(&ds(json!({})), &run(1), &[observed("a", failed(), refused)], "2026-01-01T00:00:00Z");
        assert_eq!(status.phase, Some(Phase::Failed));
        let condition = condition_of(&status, types::FAILED);
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "BucketNotFound"));
        assert!(condition.message.contains("bucket 'x' does not exist"), "{}", condition.message);

        let partial = Report::Summary(Box::new(Summary {
            objects: Counts { selected: 3, transferred: 2, failed: 1, ..Counts::default() },
            bytes: Counts { selected: 30, transferred: 20, failed: 10, ..Counts::default() },
            failures: vec![Failure { key: "k".into(), error: "checksum mismatch".into() }],
            ..Summary::default()
        }));
        let status = aggregate_at(&ds(json!({})), &run(1), &[observed("a", failed(), partial)], "2026-01-01T00:00:00Z");
        let totals = status.totals.clone().unwrap();
        assert_eq!((totals.objects_failed, totals.bytes_failed), (1, 10));
        assert_eq!(condition_of(&status, types::FAILED).reason, reasons::WORKER_FAILED);
    }

    #[test]
    fn a_worker_retried_after_a_run_that_could_not_proceed_says_so() {
        let unreachable = Report::Summary(Box::new(Summary {
            reason: Some(Reason::EndpointUnreachable),
            failures: vec![Failure { key: String::new(), error: "connection refused".into() }],
            ..Summary::default()
        }));
        let retrying = job(json!({"active": 1, "failed": 1, "startTime": "2026-01-01T00:00:00Z"}));
        let status =
            aggregate_at(&ds(json!({})), &run(1), &[observed("a", retrying, unreachable)], "2026-01-01T00:00:00Z");
        assert_eq!(status.phase, Some(Phase::Running));
        let progressing = condition_of(&status, types::PROGRESSING);
        assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("True", "EndpointUnreachable"));
        assert!(progressing.message.starts_with("retrying a: connection refused"), "{}", progressing.message);
    }

    #[test]
    fn a_worker_on_a_node_that_is_not_ready_says_so_until_the_node_is_back() {
        let retrying = job(json!({"active": 1, "failed": 1, "startTime": "2026-01-01T00:00:00Z"}));
        let capacity =
            Report::Summary(Box::new(Summary { reason: Some(Reason::InsufficientCapacity), ..Summary::default() }));
        let mut lost = observed("a", retrying.clone(), capacity.clone());
        lost.node_trouble = Some("node a is not Ready since 2026-01-01T00:00:00Z".into());
        let status = aggregate_at(&ds(json!({})), &run(1), &[lost], "2026-01-01T00:00:05Z");
        assert_eq!(status.phase, Some(Phase::Running), "the worker may go on when the node returns");
        let progressing = condition_of(&status, types::PROGRESSING);
        assert_eq!(progressing.reason, reasons::NODE_NOT_READY, "before the stager's older reason");
        assert!(progressing.message.starts_with("worker a: node a is not Ready since"), "{}", progressing.message);
        let back = aggregate_at(&ds(json!({})), &run(1), &[observed("a", retrying, capacity)], "2026-01-01T00:00:09Z");
        assert_eq!(condition_of(&back, types::PROGRESSING).reason, "InsufficientCapacity");
        let mut finished = observed("a", failed(), Report::Nothing);
        finished.node_trouble = Some("node a does not exist (deleted)".into());
        let status = aggregate_at(&ds(json!({})), &run(1), &[finished], "2026-01-01T00:00:09Z");
        assert_eq!(condition_of(&status, types::FAILED).reason, reasons::WORKER_FAILED, "a finished phase says why");
    }

    #[test]
    fn transition_times_change_only_on_a_real_transition() {
        let running = job(json!({"active": 1}));
        let live = json!({"run": 1, "workers": [{"name": "a", "run": 1, "bytesDone": 40, "bytesTotal": 100, "objectsDone": 1, "objectsTotal": 3, "throughputBytesPerSecond": 10}]});
        let mut d = ds(live);
        d.status =
            Some(aggregate_at(&d, &run(1), &[observed("a", running.clone(), Report::Nothing)], "2026-01-01T00:00:00Z"));
        assert_eq!(d.status.as_ref().unwrap().progress.as_deref(), Some("40%"));
        let totals = d.status.as_ref().unwrap().totals.clone().unwrap();
        assert_eq!((totals.throughput_bytes_per_second, totals.eta_seconds), (10, Some(6)));
        let again = aggregate_at(&d, &run(1), &[observed("a", running, Report::Nothing)], "2026-01-01T00:05:00Z");
        assert_eq!(condition_of(&again, types::PROGRESSING).last_transition_time, time("2026-01-01T00:00:00Z"));
        let end = aggregate_at(&d, &run(1), &[observed("a", complete(), summary(100, "aa"))], "2026-01-01T00:05:00Z");
        assert_eq!(condition_of(&end, types::READY).last_transition_time, time("2026-01-01T00:05:00Z"));
    }

    fn with_peers(transferred: u64, bytes_from_peers: u64, bytes_served: u64, peer_failures: u64) -> Report {
        let Report::Summary(mut summary) = summary(transferred, "aa") else { unreachable!() };
        summary.peers = PeerCounts { bytes_from_peers, objects_from_peers: 1, bytes_served, peer_failures };
        Report::Summary(summary)
    }

    fn aggregate_peers(d: &DataStage, observed: &[Observed], now: &str) -> DataStageStatus {
        aggregate(
            d,
            &Inputs { run: &run(1), direction: Direction::Pull, fanout: Fanout::PeerToPeer, observed, now: &time(now) },
        )
    }

    #[test]
    fn a_running_workers_peer_counts_are_copied_only_in_a_fleet() {
        // An entry a PeerToPeer run left, now read back in run 1 again.
        let d = ds(json!({"run": 1, "workers": [
            {"name": "a", "run": 1, "bytesDone": 7, "bytesFromPeers": 5, "bytesServed": 4, "peerFailures": 1}]}));
        let running = [observed("a", job(json!({"active": 1})), Report::Nothing)];
        let now = time("2026-01-01T00:00:01Z");
        let entry = |fanout| {
            let inputs = Inputs { run: &run(1), direction: Direction::Pull, fanout, observed: &running, now: &now };
            aggregate(&d, &inputs).workers.remove(0)
        };
        let fleet = entry(Fanout::PeerToPeer);
        assert_eq!(
            (fleet.bytes_done, fleet.bytes_from_peers, fleet.bytes_served, fleet.peer_failures),
            (7, Some(5), Some(4), Some(1))
        );
        let direct = entry(Fanout::Direct);
        assert_eq!(direct.bytes_done, 7);
        assert_eq!((direct.bytes_from_peers, direct.bytes_served, direct.peer_failures), (None, None, None));
    }

    #[test]
    fn peer_to_peer_entries_count_bytes_from_peers_and_from_the_store_and_totals_sum_them() {
        let observed = [
            observed("a", complete(), with_peers(100, 30, 70, 0)),
            observed("b", complete(), with_peers(100, 70, 30, 1)),
        ];
        let status = aggregate_peers(&ds(json!({})), &observed, "2026-01-01T00:00:01Z");
        let a = &status.workers[0];
        assert_eq!(
            (a.bytes_from_peers, a.bytes_from_store, a.bytes_served, a.peer_failures),
            (Some(30), Some(70), Some(70), Some(0))
        );
        assert_eq!(status.workers[1].peer_failures, Some(1));
        let totals = status.totals.clone().unwrap();
        assert_eq!((totals.bytes_from_peers, totals.bytes_from_store), (Some(100), Some(100)));

        let direct = aggregate_at(&ds(json!({})), &run(1), &observed, "2026-01-01T00:00:01Z");
        assert!(direct.workers.iter().all(|w| w.bytes_from_peers.is_none() && w.bytes_served.is_none()));
        let totals = direct.totals.unwrap();
        assert_eq!((totals.bytes_from_peers, totals.bytes_from_store), (None, None), "no peers, nothing to say");
    }

    #[test]
    fn an_entry_keeps_its_peer_counts_but_the_operator_never_writes_its_address() {
        // The worker published its address and live counts while it ran.
        let live = json!({"run": 1, "workers": [{"name": "a", "run": 1, "bytesDone": 40, "bytesTotal": 100,
            "objectsDone": 1, "objectsTotal": 2, "peerAddress": "10.0.0.7:9466", "bytesFromPeers": 10}]});
        let running = job(json!({"active": 1}));
        let status = aggregate_peers(&ds(live), &[observed("a", running, Report::Nothing)], "2026-01-01T00:00:01Z");
        assert_eq!((status.workers[0].bytes_from_peers, status.workers[0].peer_address.as_deref()), (Some(10), None));
        assert_eq!(status.totals.unwrap().bytes_from_peers, Some(10));

        // Finished, and its Job deleted: the counts stay, the address is still not the operator's.
        let mut d = ds(json!({}));
        let mut finished =
            aggregate_peers(&d, &[observed("a", complete(), with_peers(100, 30, 70, 0))], "2026-01-01T00:00:02Z");
        finished.workers[0].peer_address = Some("10.0.0.7:9466".into());
        d.status = Some(finished);
        let later = aggregate_peers(&d, &[observed("a", None, Report::Nothing)], "2026-01-01T01:00:00Z");
        assert_eq!(later.workers[0].bytes_from_peers, Some(30));
        assert_eq!(later.workers[0].peer_address, None);
        assert_eq!(later.totals.unwrap().bytes_from_store, Some(70));
    }

    #[test]
    fn a_started_job_whose_pods_finished_is_running_until_judged() {
        let between = job(json!({"startTime": "2026-01-01T00:00:00Z", "succeeded": 1}));
        assert_eq!(job_phase(between.as_ref()), Phase::Running);
        assert_eq!(job_phase(job(json!({})).as_ref()), Phase::Pending);
    }

    fn finished_pod(index: &str, finished: &str, message: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{index}-{finished}"), "labels": {WORKER_LABEL: "shared", COMPLETION_INDEX: index}},
            "status": {"containerStatuses": [{"name": "stager", "image": "s", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "finishedAt": finished, "message": message}}}]},
        }))
        .unwrap()
    }

    fn summary_text(bytes: u64) -> String {
        let Report::Summary(summary) = summary(bytes, "aa") else { unreachable!() };
        summary.termination_message()
    }

    #[test]
    fn every_shard_counts_once_with_its_latest_pod() {
        let pods = [
            finished_pod("0", "2026-01-01T00:00:01Z", &summary_text(7)),
            // Shard 1 was retried: only its second pod counts.
            finished_pod("1", "2026-01-01T00:00:02Z", &summary_text(1)),
            finished_pod("1", "2026-01-01T00:00:05Z", &summary_text(5)),
        ];
        let (Report::Summary(summary), reported) = pod_report(&pods, "shared") else { panic!("a summary") };
        assert_eq!(summary.bytes.transferred, 12);
        assert_eq!(reported, 2, "one summary per shard");
    }

    #[test]
    fn a_log_instead_of_a_summary_keeps_its_last_lines_in_order() {
        let log = "error: invalid value 'x' for '--shard'\n\nFor more information, try '--help'.\n";
        let pods = [finished_pod("0", "2026-01-01T00:00:01Z", log)];
        assert_eq!(
            pod_report(&pods, "shared"),
            (Report::Message("error: invalid value 'x' for '--shard' / For more information, try '--help'.".into()), 0)
        );
    }

    #[test]
    fn a_failed_prepare_step_explains_a_worker_whose_stager_never_ran() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {WORKER_LABEL: "shared"}},
            "status": {
                "initContainerStatuses": [{"name": "prepare", "image": "s", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 4, "finishedAt": "2026-01-01T00:00:01Z",
                        "message": "ferry-stager: prepare failed: cannot change the owner of '/ferry/data'"}}}],
                "containerStatuses": [{"name": "stager", "image": "s", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}}}]},
        }))
        .unwrap();
        assert_eq!(
            pod_report(&[pod], "shared"),
            (Report::Message("ferry-stager: prepare failed: cannot change the owner of '/ferry/data'".into()), 0)
        );
    }

    #[test]
    fn blocked_datastages_carry_the_reason_and_keep_what_runs_recorded() {
        let d = ds(json!({"run": 3, "snapshot": {"objects": 1, "bytes": 1, "digest": "aa"}}));
        let status = blocked(
            &d,
            Phase::Pending,
            false,
            reasons::SECRET_NOT_FOUND,
            "create Secret 's3'",
            &time("2026-01-01T00:00:00Z"),
        );
        assert_eq!(condition_of(&status, types::PROGRESSING).reason, reasons::SECRET_NOT_FOUND);
        assert_eq!((status.phase, status.run), (Some(Phase::Pending), Some(3)));
        assert_eq!(status.snapshot.unwrap().digest, "aa");
    }
}
