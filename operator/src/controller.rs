//! The DataStage controller. `reconcile` is a pipeline:
//! read → validate → build Jobs → server-side apply → aggregate status.
//! Invalid specs wait for a change; missing Secrets and nodes are retried so
//! that fixing the cause recovers without re-applying; API errors requeue
//! with jittered backoff.
//!
//! A pull with `reclaimPolicy: Delete` carries a finalizer. When it is
//! deleted, its workers are stopped first (so nothing writes any more), then
//! one clean-up Job per worker runs `ferry-stager clean` on the same volume
//! and node, and only when all succeeded is the finalizer removed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_crds::{DataStage, DataStageStatus, Phase, ReclaimPolicy};
use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Resource as _, ResourceExt as _};
use serde_json::json;

use crate::config::OperatorConfig;
use crate::jobs::{
    CLEANUP_LABEL, DATASTAGE_LABEL, Direction, WORKER_LABEL, Worker, build_cleanup_job, build_job, per_node,
    plan_workers, sides,
};
use crate::metrics::{DataStageProgress, Metrics};
use crate::status::{self, Observed, StagerSummary, reasons};

/// The one field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = "ferry.dev/operator";
/// The finalizer of DataStages whose data is removed on deletion.
pub const CLEANUP_FINALIZER: &str = "ferry.dev/cleanup";

/// Errors of one reconciliation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// A static category for metrics and events: the API's status reason
    /// where there is one (a `Forbidden` says the RBAC is short), else
    /// whether the API server could be reached at all. Always one of
    /// [`crate::metrics::RECONCILE_ERROR_REASONS`].
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(status)) => match status.code {
                401 => "Unauthorized",
                403 => "Forbidden",
                404 => "NotFound",
                409 => "Conflict",
                422 => "Invalid",
                429 => "TooManyRequests",
                500..=599 => "ServerError",
                _ => "KubeApi",
            },
            Error::Kube(kube::Error::HyperError(_) | kube::Error::Service(_)) => "Unreachable",
            Error::Kube(_) => "KubeApi",
        }
    }
}

/// Shared state, built once at start-up.
pub struct Context {
    /// API client.
    pub client: kube::Client,
    /// Parsed configuration.
    pub config: OperatorConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: Recorder,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("config", &self.config).finish_non_exhaustive()
    }
}

/// Why a spec cannot be carried out as written.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

/// Checks what the schema cannot: the operator's hostPath allow-list and
/// options the chosen store does not support.
///
/// # Errors
/// [`Invalid`] with a reason and a message a user can act on.
pub fn validate(ds: &DataStage, config: &OperatorConfig) -> Result<(), Invalid> {
    let (_, store, volume) = sides(&ds.spec);
    if let Some(path) = volume.volume.as_ref().and_then(|v| v.host_path.as_deref())
        && !config.host_path_allowed(path)
    {
        return Err(Invalid {
            reason: reasons::HOST_PATH_NOT_ALLOWED,
            message: format!(
                "hostPath {path} is outside the directories this operator may write ({}); use one of them or ask the cluster admin to allow it",
                config.allowed_host_paths.join(", ")
            ),
        });
    }
    if store.anonymous == Some(true) && store.uri.as_deref().is_some_and(|u| u.starts_with("s3://")) {
        return Err(Invalid {
            reason: reasons::UNSUPPORTED_STORE,
            message: "anonymous applies to gs:// only; for s3:// give credentials or rely on the pod's identity".into(),
        });
    }
    Ok(())
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One reconciliation of one DataStage.
async fn reconcile(ds: Arc<DataStage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_inner(&ds, &ctx).await;
    ctx.metrics.reconciled(result.as_ref().map(|_| ()).map_err(Error::category), started.elapsed());
    result
}

async fn reconcile_inner(ds: &DataStage, ctx: &Context) -> Result<Action, Error> {
    let namespace = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    if ds.metadata.deletion_timestamp.is_some() {
        ctx.metrics.observe(&namespace, &name, None);
        return if has_finalizer(ds) { clean_up(ds, ctx).await } else { Ok(Action::await_change()) };
    }
    let wants_finalizer = needs_cleanup(ds);
    if wants_finalizer != has_finalizer(ds) {
        set_finalizer(ds, ctx, wants_finalizer).await?;
    }

    if let Err(invalid) = validate(ds, &ctx.config) {
        let status = status::blocked(ds, Phase::Failed, true, invalid.reason, &invalid.message, &now());
        update_status(ds, ctx, status).await?;
        return Ok(Action::await_change());
    }

    let (_, store, _) = sides(&ds.spec);
    if let Some(secret) = &store.credentials {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        // The check is a courtesy, not a gate: where the operator may not
        // read Secrets (the chart grants it only in the namespaces it was
        // told DataStages use) it goes ahead, and a missing Secret shows up
        // as the worker pod's failure instead.
        let missing = match secrets.get_metadata_opt(&secret.name).await {
            Ok(found) => found.is_none(),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                tracing::debug!(%namespace, secret = %secret.name, "may not read Secrets here; not checking");
                false
            }
            Err(error) => return Err(error.into()),
        };
        if missing {
            let keys = if store.uri.as_deref().is_some_and(|u| u.starts_with("gs://")) {
                "key key.json (a service-account key)"
            } else {
                "keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            };
            let message = format!(
                "Secret '{}' (spec credentials) does not exist in namespace {namespace}; create it with {keys}",
                secret.name
            );
            let status = status::blocked(ds, Phase::Pending, false, reasons::SECRET_NOT_FOUND, &message, &now());
            update_status(ds, ctx, status).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
    }

    // Only per-node staging depends on the nodes; a claim needs no listing.
    let nodes = if per_node(&ds.spec) {
        Api::<Node>::all(ctx.client.clone()).list(&ListParams::default()).await?.items
    } else {
        Vec::new()
    };
    let workers = plan_workers(&ds.spec, &nodes);
    if workers.is_empty() {
        let message = "no schedulable node matches spec.placement.nodeSelector; label a node or change the selector";
        let status = status::blocked(ds, Phase::Pending, false, reasons::NO_MATCHING_NODES, message, &now());
        update_status(ds, ctx, status).await?;
        return Ok(Action::requeue(Duration::from_secs(15)));
    }

    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    for worker in &workers {
        let job = build_job(ds, worker, &ctx.config.worker_defaults());
        let job_name = job.name_any();
        // Existing Jobs are left alone: their pod template is immutable and
        // the spec's inputs to it (source, destination) are immutable too.
        if jobs.get_metadata_opt(&job_name).await?.is_none() {
            jobs.patch(&job_name, &apply, &Patch::Apply(&job)).await?;
            let node = worker.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_default();
            publish(ctx, ds, EventType::Normal, "WorkerCreated", format!("created Job {job_name}{node}"), "Create")
                .await;
        }
    }

    let selector = format!("{DATASTAGE_LABEL}={name}");
    let existing_jobs = jobs.list(&ListParams::default().labels(&selector)).await?.items;
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &namespace)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    let observed: Vec<Observed> = workers
        .iter()
        .map(|worker| {
            let job = existing_jobs.iter().find(|j| j.labels().get(WORKER_LABEL) == Some(&worker.name)).cloned();
            let (summary, message) = last_report(&pods, &worker.name);
            Observed { worker: Some(worker.clone()), job, summary, message }
        })
        .collect();
    let status = status::aggregate(ds, &observed, &now());
    let phase = status.phase.unwrap_or(Phase::Pending);
    ctx.metrics.observe(&namespace, &name, Some(DataStageProgress::of(&status)));
    update_status(ds, ctx, status).await?;
    Ok(match phase {
        Phase::Pending | Phase::Running => Action::requeue(Duration::from_secs(3)),
        Phase::Succeeded | Phase::Failed => Action::await_change(),
    })
}

/// Label (and, on older clusters, annotation) that carries an Indexed Job
/// pod's completion index.
const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// What the worker's pods reported: for each completion index (one for a
/// per-node Job, one per shard of an Indexed Job) the most recently
/// finished pod's summary, combined over the shards; or, failing that, a
/// message.
fn last_report(pods: &[Pod], worker: &str) -> (Option<StagerSummary>, Option<String>) {
    let mut latest: BTreeMap<Option<String>, (&Time, String)> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.labels().get(WORKER_LABEL).map(String::as_str) == Some(worker)) {
        let Some(terminated) = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref()?.first()?.state.as_ref()?.terminated.as_ref())
        else {
            continue;
        };
        let Some(at) = terminated.finished_at.as_ref() else { continue };
        let index = pod.labels().get(COMPLETION_INDEX).or_else(|| pod.annotations().get(COMPLETION_INDEX)).cloned();
        let message = terminated.message.clone().unwrap_or_default();
        match latest.get(&index) {
            Some((seen, _)) if seen.0 >= at.0 => {}
            _ => {
                latest.insert(index, (at, message));
            }
        }
    }
    if latest.is_empty() {
        // A pod refused by the node (or still waiting) explains itself in its status.
        let message = pods
            .iter()
            .filter(|p| p.labels().get(WORKER_LABEL).map(String::as_str) == Some(worker))
            .find_map(|p| p.status.as_ref()?.message.clone());
        return (None, message);
    }
    let mut summaries = Vec::new();
    for (_, message) in latest.into_values() {
        match serde_json::from_str::<StagerSummary>(&message) {
            Ok(summary) => summaries.push(summary),
            Err(_) => return (None, Some(message.lines().rev().take(3).collect::<Vec<_>>().join(" / "))),
        }
    }
    (StagerSummary::combine(summaries), None)
}

/// Server-side applies the status (only apiVersion, kind and status) and
/// records an Event on every transition: a change of phase or of the reason
/// the DataStage is (not) ready.
async fn update_status(ds: &DataStage, ctx: &Context, status: DataStageStatus) -> Result<(), Error> {
    let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let ready_reason = |s: Option<&DataStageStatus>| s.and_then(|s| s.conditions.first()).map(|c| c.reason.clone());
    let before = (ds.status.as_ref().and_then(|s| s.phase), ready_reason(ds.status.as_ref()));
    let after = (status.phase, ready_reason(Some(&status)));
    let ready = status.conditions.first().map(|c| (c.reason.clone(), c.message.clone()));
    let patch = json!({"apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "status": status});
    api.patch_status(&ds.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    if before != after
        && let (Some(phase), Some((reason, message))) = (after.0, ready)
    {
        // Warnings for what a user must act on; waiting is normal.
        let warning = phase == Phase::Failed
            || reasons::FROM_STAGER.contains(&reason.as_str())
            || [reasons::SECRET_NOT_FOUND, reasons::NO_MATCHING_NODES].contains(&reason.as_str());
        let kind = if warning { EventType::Warning } else { EventType::Normal };
        publish(ctx, ds, kind, &reason, message, &format!("{phase:?}")).await;
    }
    Ok(())
}

/// Records an Event on the DataStage; failing to is logged, not fatal.
async fn publish(ctx: &Context, ds: &DataStage, kind: EventType, reason: &str, note: String, action: &str) {
    let event =
        Event { type_: kind, reason: reason.to_owned(), note: Some(note), action: action.to_owned(), secondary: None };
    if let Err(error) = ctx.recorder.publish(&event, &ds.object_ref(&())).await {
        tracing::warn!(%error, "could not record an event");
    }
}

/// Whether deleting this DataStage must remove staged data: a pull into a
/// volume with `reclaimPolicy: Delete`. A push's volume is the user's source
/// and is never cleaned.
pub fn needs_cleanup(ds: &DataStage) -> bool {
    let (direction, _, _) = sides(&ds.spec);
    ds.spec.reclaim_policy == Some(ReclaimPolicy::Delete) && direction == Direction::Pull
}

fn has_finalizer(ds: &DataStage) -> bool {
    ds.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
}

/// Adds or removes the operator's finalizer. Server-side apply treats
/// finalizers as a set, so the operator's entry is its own and other
/// controllers' finalizers are untouched.
async fn set_finalizer(ds: &DataStage, ctx: &Context, present: bool) -> Result<(), Error> {
    let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let finalizers: Vec<&str> = if present { vec![CLEANUP_FINALIZER] } else { Vec::new() };
    let patch = json!({
        "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
        "metadata": {"name": ds.name_any(), "finalizers": finalizers},
    });
    api.patch(&ds.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Where a deleted DataStage's data lies: one entry per worker in its
/// status (which outlives nodes changing labels), except on nodes that no
/// longer exist: their disks went with them, and a Job for them would wait
/// forever.
pub fn cleanup_targets(ds: &DataStage, existing_nodes: &[String]) -> Vec<Worker> {
    let per_node = per_node(&ds.spec);
    ds.status
        .iter()
        .flat_map(|s| &s.workers)
        .map(|w| Worker { name: w.name.clone(), node: w.node.clone().filter(|_| per_node) })
        .filter(|w| w.node.as_ref().is_none_or(|n| existing_nodes.contains(n)))
        .collect()
}

/// The deletion of a DataStage with `reclaimPolicy: Delete`: stop the
/// workers, run `ferry-stager clean` where they staged, then let it go.
async fn clean_up(ds: &DataStage, ctx: &Context) -> Result<Action, Error> {
    let namespace = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);

    // 1. Nothing may still write into the directories being cleaned.
    let workers = ListParams::default().labels(&format!("{DATASTAGE_LABEL}={name},{WORKER_LABEL}"));
    let running = jobs.list_metadata(&workers).await?.items;
    for job in running.iter().filter(|j| j.metadata.deletion_timestamp.is_none()) {
        jobs.delete(&job.name_any(), &DeleteParams::foreground()).await?;
    }
    if !running.is_empty() || !pods.list_metadata(&workers).await?.items.is_empty() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 2. One clean-up Job per place data was staged.
    let nodes: Vec<String> = if per_node(&ds.spec) {
        Api::<Node>::all(ctx.client.clone())
            .list_metadata(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|n| n.name_any())
            .collect()
    } else {
        Vec::new()
    };
    let targets = cleanup_targets(ds, &nodes);
    let mut done = 0;
    for target in &targets {
        let job = build_cleanup_job(ds, target, &ctx.config.worker_defaults());
        let job_name = job.name_any();
        let Some(existing) = jobs.get_opt(&job_name).await? else {
            jobs.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &job).await?;
            let node = target.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_default();
            publish(
                ctx,
                ds,
                EventType::Normal,
                "CleanupStarted",
                format!("removing staged data{node} (Job {job_name})"),
                "Delete",
            )
            .await;
            continue;
        };
        match status::job_phase(Some(&existing)) {
            Phase::Succeeded => done += 1,
            Phase::Failed => {
                let message = format!(
                    "Job {job_name} could not remove the staged data; see its pod's log. Fix the cause and delete the Job to retry, or remove finalizer {CLEANUP_FINALIZER} to keep the data"
                );
                publish(ctx, ds, EventType::Warning, "CleanupFailed", message, "Delete").await;
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
            Phase::Pending | Phase::Running => {}
        }
    }
    if done < targets.len() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 3. Done: the clean-up Jobs go, then the DataStage.
    let cleanups = ListParams::default().labels(&format!("{DATASTAGE_LABEL}={name},{CLEANUP_LABEL}"));
    for job in jobs.list_metadata(&cleanups).await?.items {
        jobs.delete(&job.name_any(), &DeleteParams::background()).await?;
    }
    publish(
        ctx,
        ds,
        EventType::Normal,
        "CleanedUp",
        format!("removed the staged data from {} places", targets.len()),
        "Delete",
    )
    .await;
    set_finalizer(ds, ctx, false).await?;
    Ok(Action::await_change())
}

/// Requeues failed reconciliations with jitter so many failing objects do
/// not retry in lockstep.
fn error_policy(ds: Arc<DataStage>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(datastage = %ds.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_millis(2000 + rand::random::<u64>() % 3000))
}

/// Runs the controller until the process is stopped.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let (datastages, jobs) = match &ctx.config.watch_namespace {
        Some(ns) => (Api::<DataStage>::namespaced(client.clone(), ns), Api::<Job>::namespaced(client.clone(), ns)),
        None => (Api::<DataStage>::all(client.clone()), Api::<Job>::all(client.clone())),
    };
    Controller::new(datastages, watcher::Config::default())
        .owns(jobs, watcher::Config::default().labels(DATASTAGE_LABEL))
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile loop");
            }
        })
        .await;
}

/// Builds the context once at start-up.
pub fn context(client: kube::Client, config: OperatorConfig, metrics: Arc<Metrics>) -> Arc<Context> {
    let reporter = Reporter { controller: "ferry-operator".into(), instance: std::env::var("HOSTNAME").ok() };
    let recorder = Recorder::new(client.clone(), reporter);
    Arc::new(Context { client, config, metrics, recorder })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(host_path: &str, uri: &str) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "n"},
            "spec": {"source": {"uri": uri}, "destination": {"volume": {"hostPath": host_path}}},
        }))
        .unwrap()
    }

    fn finished_pod(index: &str, finished: &str, bytes: i64) -> Pod {
        let summary = json!({"complete": true, "bytes": {"selected": bytes, "transferred": bytes}}).to_string();
        serde_json::from_value(json!({
            "metadata": {"name": format!("p-{index}-{finished}"), "labels": {WORKER_LABEL: "shared", COMPLETION_INDEX: index}},
            "status": {"containerStatuses": [{"name": "stager", "image": "s", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "finishedAt": finished, "message": summary}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn every_shard_counts_once_with_its_latest_pod() {
        let pods = [
            finished_pod("0", "2026-01-01T00:00:01Z", 7),
            // Shard 1 was retried: only its second pod counts.
            finished_pod("1", "2026-01-01T00:00:02Z", 1),
            finished_pod("1", "2026-01-01T00:00:05Z", 5),
        ];
        let (summary, message) = last_report(&pods, "shared");
        assert_eq!(message, None);
        assert_eq!(summary.unwrap().bytes.transferred, 12);
    }

    #[test]
    fn api_errors_are_categorised_by_status_into_the_pre_registered_reasons() {
        let api = |code: u16| {
            Error::Kube(kube::Error::Api(
                serde_json::from_value(json!({"status": "Failure", "message": "m", "reason": "r", "code": code}))
                    .unwrap(),
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
        assert_eq!(targets, [Worker { name: "node-a".into(), node: Some("node-a".into()) }]);
    }

    #[test]
    fn host_paths_outside_the_allow_list_are_refused_with_advice() {
        let config = OperatorConfig::test();
        assert_eq!(validate(&ds("/mnt/x", "s3://b/p"), &config), Ok(()));
        let invalid = validate(&ds("/etc/x", "s3://b/p"), &config).unwrap_err();
        assert_eq!(invalid.reason, reasons::HOST_PATH_NOT_ALLOWED);
        assert!(invalid.message.contains("/mnt, /data"), "{}", invalid.message);
        assert_eq!(validate(&ds("/mnt/x", "gs://b/p"), &config), Ok(()));
        let mut anonymous_s3 = ds("/mnt/x", "s3://b/p");
        anonymous_s3.spec.source.anonymous = Some(true);
        assert_eq!(validate(&anonymous_s3, &config).unwrap_err().reason, reasons::UNSUPPORTED_STORE);
    }
}
