//! The DataStage controller. `reconcile` is a pipeline:
//! plan → validate → place → choose the run → apply its Jobs → observe →
//! aggregate status. Invalid specs wait for a change; missing Secrets and
//! nodes are retried so that fixing the cause recovers without re-applying;
//! API errors requeue with jittered backoff. Nodes are watched, so a node
//! that joins or starts matching a placement is staged without a retry
//! loop.
//!
//! With fanout PeerToPeer the DataStage's peer Secret is created before its
//! first Jobs. A worker's Job is created once and never applied again, so
//! a node that joins later gets its own Job with the peer group as it is
//! then, and running workers are left alone.
//!
//! A pull with `reclaimPolicy: Delete` carries a finalizer. When it is
//! deleted, its workers are stopped first (so nothing writes any more), then
//! one clean-up Job per worker runs `ferry-stager clean` on the same volume
//! and node, and only when all succeeded is the finalizer removed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_contract::Scheme;
use ferry_crds::plan::{Direction, Plan};
use ferry_crds::{DataStage, DataStageStatus, Fanout, Phase, ReclaimPolicy, WorkerStatus};
use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Resource as _, ResourceExt as _};

use crate::cache::{CacheWriters, Caches};
use crate::config::OperatorConfig;
use crate::disks::AfterRefusal;
use crate::events::EventPublisher;
use crate::jobs::{
    CLEANUP_LABEL, DATASTAGE_LABEL, RUN_LABEL, WORKER_LABEL, Worker, build_cleanup_job, build_job, plan_workers,
};
use crate::metrics::{DataStageProgress, Metrics};
use crate::runs::{self, Run};
use crate::schedule::Schedule;
use crate::status::{self, Inputs, Observed, reasons};
use crate::watch_backoff::WatchBackoff;

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
    /// Publishes Events, folding repeats into series.
    pub events: EventPublisher,
    /// Nodes, and the Jobs and Pods of DataStages, as the watches last saw them.
    pub caches: Caches,
    /// Where Ferry removed staged data: a sign of room for DataStages a
    /// full disk holds back.
    pub cleaned: crate::disks::Cleaned,
    /// DataStages to reconcile now that no watch event of their own would
    /// wake: the copies a waiting pull chose to evict, the DataStages a
    /// gated pod waits for.
    pub wakes: Wakes,
}

/// Asks for reconciliations of other DataStages than the one at hand.
pub struct Wakes {
    sender: futures::channel::mpsc::UnboundedSender<ObjectRef<DataStage>>,
    receiver: std::sync::Mutex<Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<DataStage>>>>,
}

impl Default for Wakes {
    fn default() -> Self {
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        Wakes { sender, receiver: std::sync::Mutex::new(Some(receiver)) }
    }
}

impl Wakes {
    /// Reconciles DataStage `name` in `namespace` soon.
    pub fn wake(&self, namespace: &str, name: &str) {
        // Closed only when the controller stops, and then nothing is to wake.
        let _ = self.sender.unbounded_send(ObjectRef::new(name).within(namespace));
    }

    /// The stream of wakes, for the controller (taken once).
    fn take(&self) -> Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<DataStage>>> {
        self.receiver.lock().expect("not poisoned").take()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The smallest part of a multipart upload S3 accepts.
const MIN_UPLOAD_PART: u64 = 5 << 20;

/// Why a spec cannot be carried out as written.
#[derive(Debug, PartialEq, Eq)]
pub struct Invalid {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

/// Checks what the schema cannot: the operator's hostPath allow-list,
/// options the chosen store does not support, and the schedule. Returns
/// the parsed schedule, if any.
///
/// # Errors
/// [`Invalid`] with a reason and a message a user can act on.
pub fn validate(ds: &DataStage, plan: &Plan<'_>, config: &OperatorConfig) -> Result<Option<Schedule>, Invalid> {
    let name = ds.name_any();
    if name.len() > ferry_crds::MAX_NAME_LENGTH {
        return Err(Invalid {
            reason: reasons::NAME_TOO_LONG,
            message: format!(
                "metadata.name is {} characters; Ferry labels the DataStage's Jobs and pods with it, and a label value holds at most {}: recreate it with a shorter name",
                name.len(),
                ferry_crds::MAX_NAME_LENGTH
            ),
        });
    }
    if let ferry_crds::plan::Volume::HostPath(path) = plan.volume
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
    if plan.store.anonymous == Some(true) && plan.location.scheme == Scheme::S3 {
        return Err(Invalid {
            reason: reasons::UNSUPPORTED_STORE,
            message:
                "anonymous applies to gs://, az:// and oci:// only; for s3:// give credentials or rely on the pod's identity"
                    .into(),
        });
    }
    let part_size = ds.spec.transfer.as_ref().and_then(|t| t.part_size.as_ref());
    if plan.direction == Direction::Push
        && let Some(size) = part_size.filter(|s| s.bytes() < MIN_UPLOAD_PART)
    {
        return Err(Invalid {
            reason: reasons::INVALID_TRANSFER,
            message: format!(
                "transfer.partSize {size} is below 5MiB, the smallest part S3 accepts in an upload; use 5Mi or more"
            ),
        });
    }
    let Some(expression) = ds.spec.schedule.as_deref() else { return Ok(None) };
    Schedule::parse(expression, ds.spec.time_zone.as_deref())
        .map(Some)
        .map_err(|error| Invalid { reason: reasons::INVALID_SCHEDULE, message: format!("spec.schedule: {error}") })
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// One reconciliation of one DataStage.
async fn reconcile(ds: Arc<DataStage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let (namespace, name) = (ds.namespace().unwrap_or_default(), ds.name_any());
    tracing::debug!(%namespace, %name, generation = ds.metadata.generation, "reconciling");
    let result = reconcile_inner(&ds, &ctx).await;
    match &result {
        Ok(action) => tracing::debug!(%namespace, %name, ?action, elapsed = ?started.elapsed(), "reconciled"),
        Err(error) => tracing::debug!(%namespace, %name, %error, elapsed = ?started.elapsed(), "reconcile failed"),
    }
    ctx.metrics.reconciled(result.as_ref().map(|_| ()).map_err(Error::category), started.elapsed());
    result
}

/// Why a reconciliation stops before any Job: the status to write and
/// when to look again.
struct Blocked {
    phase: Phase,
    failed: bool,
    reason: &'static str,
    message: String,
    retry: Option<Duration>,
}

impl From<Invalid> for Blocked {
    fn from(invalid: Invalid) -> Self {
        Blocked { phase: Phase::Failed, failed: true, reason: invalid.reason, message: invalid.message, retry: None }
    }
}

async fn reconcile_inner(ds: &DataStage, ctx: &Context) -> Result<Action, Error> {
    ctx.caches.ready().await;
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
    match prepare(ds, ctx).await? {
        Ok((plan, schedule, workers)) => carry_out(ds, ctx, &plan, schedule.as_ref(), &workers).await,
        Err(blocked) => {
            // A placement that matches nothing because its node was deleted
            // leaves that node's Job behind; so can any other block.
            let mut jobs = Caches::of_datastage(&ctx.caches.jobs, &namespace, &name, WORKER_LABEL);
            retire_jobs_of_deleted_nodes(ds, ctx, &mut jobs).await?;
            write_blocked(ds, ctx, blocked).await
        }
    }
}

/// Records why the DataStage cannot proceed, and when to look again.
async fn write_blocked(ds: &DataStage, ctx: &Context, blocked: Blocked) -> Result<Action, Error> {
    let status = status::blocked(ds, blocked.phase, blocked.failed, blocked.reason, &blocked.message, &now());
    update_status(ds, ctx, status).await?;
    Ok(blocked.retry.map_or_else(Action::await_change, Action::requeue))
}

/// Everything a run needs that can stop it, but the credentials Secret
/// (checked only when workers start): the plan, the schedule, and the
/// workers the cluster's nodes allow.
async fn prepare<'a>(
    ds: &'a DataStage,
    ctx: &Context,
) -> Result<Result<(Plan<'a>, Option<Schedule>, Vec<Worker>), Blocked>, Error> {
    let plan = match ds.spec.plan() {
        Ok(plan) => plan,
        Err(incomplete) => {
            return Ok(Err(Invalid { reason: reasons::INCOMPLETE_SPEC, message: incomplete.to_string() }.into()));
        }
    };
    let schedule = match validate(ds, &plan, &ctx.config) {
        Ok(schedule) => schedule,
        Err(invalid) => return Ok(Err(invalid.into())),
    };
    let workers = match place(ds, &plan, ctx) {
        Ok(workers) => workers,
        Err(blocked) => return Ok(Err(blocked)),
    };
    Ok(Ok((plan, schedule, workers)))
}

/// The credentials Secret, when the spec names one that does not exist.
async fn missing_secret(ds: &DataStage, plan: &Plan<'_>, ctx: &Context) -> Result<Option<Blocked>, Error> {
    // A web identity has no Secret: a refused token shows up as the
    // workers' AccessDenied.
    let Some(secret) = plan.store.credentials.as_ref().and_then(|c| c.name.as_ref()) else { return Ok(None) };
    let namespace = ds.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    // The check is a courtesy, not a gate: where the operator may not read
    // Secrets (the chart grants it only in the namespaces it was told
    // DataStages use) it goes ahead, and a missing Secret shows up as the
    // worker pod's failure instead.
    let missing = match secrets.get_metadata_opt(secret).await {
        Ok(found) => found.is_none(),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::debug!(%namespace, %secret, "may not read Secrets here; not checking");
            false
        }
        Err(error) => return Err(error.into()),
    };
    if !missing {
        return Ok(None);
    }
    let keys = match plan.location.scheme {
        Scheme::Gcs => "key key.json (a service-account key)",
        Scheme::S3 => "keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        Scheme::Azure => {
            "keys AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY (or AZURE_STORAGE_SAS_TOKEN, or AZURE_TENANT_ID, \
             AZURE_CLIENT_ID and AZURE_CLIENT_SECRET)"
        }
        Scheme::Oci => "type kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)",
    };
    Ok(Some(Blocked {
        phase: Phase::Pending,
        failed: false,
        reason: reasons::SECRET_NOT_FOUND,
        message: format!(
            "Secret '{secret}' (spec credentials) does not exist in namespace {namespace}; create it with {keys}"
        ),
        retry: Some(Duration::from_secs(5)),
    }))
}

/// The CA bundle, when the spec names a ConfigMap or key that does not
/// exist: the worker pods would wait for the volume with no word in the
/// DataStage's status. Like the Secret check, a courtesy where the operator
/// may read ConfigMaps.
async fn missing_ca_bundle(ds: &DataStage, plan: &Plan<'_>, ctx: &Context) -> Result<Option<Blocked>, Error> {
    let Some(reference) = &plan.store.ca_bundle else { return Ok(None) };
    let namespace = ds.namespace().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &namespace);
    let key = reference.key_or_default();
    let problem = match config_maps.get_opt(&reference.name).await {
        Ok(Some(found)) if found.data.as_ref().is_some_and(|data| data.contains_key(key)) => return Ok(None),
        Ok(Some(_)) => format!("ConfigMap '{}' (spec caBundle) has no key {key}", reference.name),
        Ok(None) => format!("ConfigMap '{}' (spec caBundle) does not exist in namespace {namespace}", reference.name),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            tracing::debug!(%namespace, config_map = %reference.name, "may not read ConfigMaps here; not checking");
            return Ok(None);
        }
        Err(error) => return Err(error.into()),
    };
    Ok(Some(Blocked {
        phase: Phase::Pending,
        failed: false,
        reason: reasons::CA_BUNDLE_NOT_FOUND,
        message: format!(
            "{problem}; create it with the PEM certificates of the CA that signed the store's certificate"
        ),
        retry: Some(Duration::from_secs(5)),
    }))
}

/// The workers of the DataStage: one per matching node for a hostPath
/// (exactly one for a push), one for a claim.
fn place(ds: &DataStage, plan: &Plan<'_>, ctx: &Context) -> Result<Vec<Worker>, Blocked> {
    if !plan.per_node() {
        return Ok(plan_workers(plan, &[]));
    }
    let nodes = ctx.caches.nodes.state();
    let matching = crate::placement::matching_nodes(ds.spec.placement.as_ref(), nodes.iter().map(|n| &**n));
    per_node_workers(plan, &matching).map_err(|invalid| Blocked {
        phase: Phase::Pending,
        failed: false,
        reason: invalid.reason,
        message: invalid.message,
        retry: None,
    })
}

/// The per-node workers for the nodes a placement matches: one per node
/// for a pull, exactly one node for a push (two nodes pushing one prefix
/// would race to write the same keys).
///
/// # Errors
/// [`Invalid`] when no node matches, or several match a push; the
/// DataStage waits (nodes are watched) until that changes.
pub fn per_node_workers(plan: &Plan<'_>, matching: &[String]) -> Result<Vec<Worker>, Invalid> {
    if matching.is_empty() {
        return Err(Invalid {
            reason: reasons::NO_MATCHING_NODES,
            message: "no schedulable node matches spec.placement (nodeSelector, required node affinity, taints without a toleration); label a node or change the placement".into(),
        });
    }
    if plan.direction == Direction::Push && matching.len() > 1 {
        return Err(Invalid {
            reason: reasons::AMBIGUOUS_PUSH_SOURCE,
            message: format!(
                "a push from hostPath reads one node's directory, but spec.placement matches {} nodes ({}); narrow it to one, e.g. with nodeSelector kubernetes.io/hostname",
                matching.len(),
                matching.join(", ")
            ),
        });
    }
    Ok(plan_workers(plan, matching))
}

/// The Jobs of a run: creates the missing ones of workers that have not
/// finished this run, deletes those of other runs, and aggregates.
async fn carry_out(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    schedule: Option<&Schedule>,
    workers: &[Worker],
) -> Result<Action, Error> {
    let namespace = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    let now = now();
    let mut run = runs::current(ds, schedule, now.0);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut existing = Caches::of_datastage(&ctx.caches.jobs, &namespace, &name, WORKER_LABEL);
    let awaited = ctx.caches.created.fill_in(&namespace, &name, &mut existing);
    // A run a StagingQuota refused starts again, once its Jobs are over,
    // when the quota leaves its dataset room; until then the DataStage
    // waits, saying why.
    let this_run = run.number.to_string();
    let run_over = existing
        .iter()
        .filter(|job| job.labels().get(RUN_LABEL) == Some(&this_run))
        .all(|job| status::job_phase(Some(job)).is_finished());
    if run.started.is_none() && run_over && crate::quotas::refused_in(ds, run.number) {
        let refused = run.number;
        let need = |worker: &Worker| crate::quotas::refused_need(ds, &worker.name, refused);
        let allowance = quota_allowance(ds, ctx, workers, workers.len(), need);
        if let Some(message) = allowance.first_hold() {
            return hold(ds, ctx, ferry_contract::Reason::QuotaExceeded, message.to_owned(), None).await;
        }
        run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::RoomInQuota) };
    }
    // An evicted copy is staged again once a pod waits for it.
    let in_use = evicts_or_was_evicted(ds).then(|| in_use(ctx));
    if run.started.is_none() && run_over && in_use.as_ref().is_some_and(|in_use| in_use.waits_for(ds)) {
        run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::PodWaiting) };
    }
    // A run a full disk refused waits the same way, and starts again when
    // one of its nodes may have room (crate::disks says when), which
    // evicting idle copies of other DataStages may make (crate::eviction).
    let mut room_found = None;
    let refused =
        if run.started.is_none() && run_over { crate::disks::refused_for_room(ds, run.number) } else { Vec::new() };
    if !refused.is_empty() {
        let datastages = ctx.caches.datastages.state();
        let disks = crate::disks::Disks::measured_by(datastages.iter().map(|other| &**other));
        let seconds = u64::try_from(now.0.as_second()).unwrap_or_default();
        match crate::disks::after_refusal(&refused, &disks, &ctx.cleaned, seconds) {
            Some(AfterRefusal::Wait(mut message)) => {
                let in_use = in_use.unwrap_or_else(|| self::in_use(ctx));
                let plan = crate::eviction::plan_for(ds, &refused, datastages.iter().map(|d| &**d), &in_use);
                for victim in &plan.victims {
                    ctx.wakes.wake(&victim.namespace, &victim.name);
                }
                if !plan.notes.is_empty() {
                    message = format!("{message}; {}", plan.notes.join("; "));
                }
                return hold(ds, ctx, ferry_contract::Reason::InsufficientCapacity, message, None).await;
            }
            Some(AfterRefusal::LookAgain(why)) => {
                run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::RoomOnDisk) };
                room_found = Some(why);
            }
            None => {}
        }
    }
    retire_other_runs(&jobs, &mut existing, run.number).await?;
    retire_jobs_of_deleted_nodes(ds, ctx, &mut existing).await?;
    let recorded = ds.status.as_ref().map(|s| s.workers.as_slice()).unwrap_or_default();
    let mut starting: Vec<Worker> =
        workers_to_start(workers, &existing, recorded, run.number).into_iter().cloned().collect();
    let (mut created, mut failed) = (Vec::new(), None);
    let mut held_by_quota = BTreeMap::new();
    // A versioned pull's workers build where a switch or prune Job still
    // at work would move their directory away: they start after it.
    if !starting.is_empty() && ds.spec.versioned() && versions_jobs_at_work(ds, ctx) {
        return Ok(Action::requeue(Duration::from_secs(2)));
    }
    if !starting.is_empty() {
        // A new DataStage waits for its Jobs as long as the requests made
        // before them one after another, each queued behind all else the
        // API server does: the Secret check, the peer Secret, then every
        // Job at once, and the Events only after them.
        //
        // The credentials are checked only here: a Secret deleted under
        // running workers shows in their pods, and a running DataStage
        // costs no request for it.
        let missing = match missing_secret(ds, plan, ctx).await? {
            Some(blocked) => Some(blocked),
            None => missing_ca_bundle(ds, plan, ctx).await?,
        };
        if let Some(blocked) = missing {
            publish_run_started(ds, ctx, &run, room_found.as_deref()).await;
            return write_blocked(ds, ctx, blocked).await;
        }
        let need = |worker: &Worker| crate::quotas::refused_need(ds, &worker.name, run.number);
        let allowance = quota_allowance(ds, ctx, &starting, workers.len(), need);
        if !allowance.held.is_empty() {
            let nothing_else = existing.is_empty() && !workers.iter().any(|w| finished_in(recorded, w, run.number));
            if let (true, Some(message)) = (nothing_else && allowance.room.is_empty(), allowance.first_hold()) {
                return hold(ds, ctx, ferry_contract::Reason::QuotaExceeded, message.to_owned(), Some(&run)).await;
            }
            // Workers the quota has room for start; the others wait, each
            // entry saying why.
            starting.retain(|worker| !allowance.held.contains_key(&worker.name));
            held_by_quota = allowance.held;
        }
        let (jobs_plan, peer_tls) = with_peer_secret(ds, ctx, plan).await?;
        let mut defaults = ctx.config.worker_defaults();
        defaults.peer_tls = peer_tls;
        // Workers that join a run others are in read from them what they read.
        defaults.peers_running = crate::peers::running_groups(&existing);
        defaults.dataset_quotas = allowance.room;
        if plan.direction == Direction::Pull {
            defaults.capacity_claims = capacity_claims(ds, ctx, &starting);
        }
        let new_pods = starting.len() * plan.pods_per_worker as usize;
        // The new workers count against their budget from here until their
        // Jobs are recorded below, so DataStages starting now count them.
        let budget_share = crate::budgets::share_for_new_workers(ctx, ds, u32::try_from(new_pods).unwrap_or(u32::MAX));
        let (store_share, counted_until_recorded) = budget_share.unzip();
        defaults.store_share = store_share;
        let jobs = &jobs;
        let creating = starting.iter().map(|worker| {
            let job = build_job(ds, &jobs_plan, worker, workers, run.number, &defaults);
            async move { create_job(jobs, &job).await.map(|(job, new)| (job, new.then_some(worker))) }
        });
        // Every Job made gets its Event, even when another's create failed:
        // the next reconciliation finds it in place and publishes none.
        for result in futures::future::join_all(creating).await {
            match result {
                Ok((job, new)) => {
                    if new.is_some() {
                        ctx.caches.created.record(&job);
                    }
                    created.extend(new.map(|worker| (job.name_any(), worker)));
                    existing.push(job);
                }
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        drop(counted_until_recorded);
    }
    publish_run_started(ds, ctx, &run, room_found.as_deref()).await;
    for (job_name, worker) in created {
        let node = worker.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_default();
        let note = format!("created Job {job_name}{node} for run {}", run.number);
        publish(ctx, ds, EventType::Normal, reasons::WORKER_CREATED, note, "Create").await;
    }
    if let Some(error) = failed {
        return Err(error);
    }
    let departed_entries = departed(ds, workers, plan, &existing);
    let observed = observe(ctx, ds, workers, existing, &run);
    let inputs = Inputs { run: &run, direction: plan.direction, fanout: plan.fanout, observed: &observed, now: &now };
    let mut status = status::aggregate(ds, &inputs);
    status.workers.extend(departed_entries);
    for entry in status.workers.iter_mut() {
        if let Some(message) = held_by_quota.get(&entry.name) {
            entry.reason = Some(ferry_contract::Reason::QuotaExceeded.to_string());
            entry.message = Some(message.clone());
        }
    }
    if status.phase.is_some_and(Phase::is_finished) && status.run == Some(run.number) {
        let last = status.last_sync_time.as_ref().map_or(now.0, |t| t.0);
        status.next_sync_time =
            schedule.filter(|_| ds.spec.suspend != Some(true)).and_then(|s| s.next_after(last)).map(Time);
    }
    if status.run != Some(run.number) {
        let note = status.conditions.first().map(|c| c.message.clone()).unwrap_or_default();
        publish(ctx, ds, EventType::Normal, reasons::RESYNCING, note, "Sync").await;
    }
    let versioning = if ds.spec.versioned() && plan.direction == Direction::Pull {
        advance_versions(ds, ctx, plan, workers, &run, &mut status, &now).await
    } else {
        Versioning::default()
    };
    let evicting = match &in_use {
        Some(in_use) => evict(ds, ctx, plan, in_use, &mut status, &now).await,
        None => Evicting::default(),
    };
    let phase = status.phase.unwrap_or(Phase::Pending);
    let next_sync = status.next_sync_time.clone();
    let resync = status.run != Some(run.number);
    ctx.metrics.observe(&namespace, &name, Some(DataStageProgress::of(&status)));
    update_status(ds, ctx, status).await?;
    evicting.carry_out(ds, ctx).await?;
    versioning.carry_out(ds, ctx).await?;
    Ok(match (phase, next_sync) {
        _ if resync => Action::requeue(Duration::from_millis(500)),
        // Switch and prune Jobs are watched; this guards a missed event.
        _ if versioning.pending => Action::requeue(Duration::from_secs(5)),
        // A clean-up Job of an evicted copy is not watched: look again soon.
        _ if evicting.pending => Action::requeue(Duration::from_secs(2)),
        // Keep lastUsedTime current while pods use the data, and evict an
        // idle copy when its time comes.
        _ if evicting.in_use || evicting.next_idle.is_some() => {
            let next_idle = evicting.next_idle.unwrap_or(Duration::MAX).max(Duration::from_secs(1));
            let refresh = if evicting.in_use { crate::eviction::USE_RESOLUTION } else { Duration::MAX };
            Action::requeue(next_idle.min(refresh))
        }
        // Room appears when a quota is raised (watched) or another
        // DataStage shrinks or goes (not watched for this).
        _ if !held_by_quota.is_empty() => Action::requeue(ROOM_RECHECK),
        // Jobs, their pods and the workers' reports are watched and wake
        // the DataStage; the requeue only guards against a missed event,
        // or a Job taken as created that the cache has not shown yet.
        (Phase::Pending | Phase::Running, _) if awaited => {
            Action::requeue(crate::cache::CreatedJobs::PATIENCE + Duration::from_secs(1))
        }
        (Phase::Pending | Phase::Running, _) => Action::requeue(Duration::from_secs(60)),
        // Wake up for the next scheduled sync (changes wake it earlier).
        (_, Some(next)) => {
            let wait = next.0.duration_since(now.0).as_secs_f64().clamp(0.2, 3600.0);
            Action::requeue(Duration::from_secs_f64(wait))
        }
        _ => Action::await_change(),
    })
}

/// Whether a switch or prune Job of `ds` has not finished.
fn versions_jobs_at_work(ds: &DataStage, ctx: &Context) -> bool {
    let namespace = ds.namespace().unwrap_or_default();
    Caches::of_datastage(&ctx.caches.jobs, &namespace, &ds.name_any(), crate::versions::VERSIONS_LABEL)
        .iter()
        .any(|job| !status::job_phase(Some(job)).is_finished())
}

/// What a versioned pull's next step (see [`crate::versions`]) leaves to
/// do once the status that records it is written.
#[derive(Default)]
struct Versioning {
    /// Switch or prune Jobs to create.
    create: Vec<Job>,
    /// Jobs of a step every place completed, to delete.
    delete: Vec<String>,
    /// Events to publish: (type, reason, note).
    events: Vec<(EventType, &'static str, String)>,
    /// A step is under way.
    pending: bool,
}

/// Decides the next step of a versioned pull and follows its Jobs, one
/// per place: a switch once the run succeeded with one snapshot (the
/// DataStage stays Running until every place switched, so the gate lets
/// no pod through before), a prune once no pod may read the previous
/// version. Records in `status` what completed.
async fn advance_versions(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    workers: &[Worker],
    run: &Run,
    status: &mut DataStageStatus,
    now: &Time,
) -> Versioning {
    use crate::versions::{Step, VERSIONS_LABEL};
    let mut versioning = Versioning::default();
    let older_in_use = {
        let pods = ctx.caches.pods.state();
        crate::versions::older_version_in_use(ds, pods.iter().map(|pod| &**pod))
    };
    // Every place that holds the run's data: an evicted copy has none.
    let evicted = |worker: &Worker| status.workers.iter().any(|w| w.name == worker.name && w.evicted.is_some());
    let places: Vec<&Worker> = workers.iter().filter(|worker| !evicted(worker)).collect();
    let names: Vec<&str> = places.iter().map(|worker| worker.name.as_str()).collect();
    let step = crate::versions::next_step(status, run.number, &names, older_in_use);
    let (to, what) = match &step {
        Step::Idle => return versioning,
        Step::Switch { to, .. } => (Some(to.clone()), format!("version {}", &to.as_str()[..8])),
        Step::Prune { .. } => (None, "previous version".to_owned()),
    };
    let namespace = ds.namespace().unwrap_or_default();
    let existing = Caches::of_datastage(&ctx.caches.jobs, &namespace, &ds.name_any(), VERSIONS_LABEL);
    let defaults = ctx.config.worker_defaults();
    // A switch goes to the places not on the version yet; a prune to all.
    let targets: Vec<&Worker> = places
        .iter()
        .copied()
        .filter(|worker| to.as_ref().is_none_or(|to| !crate::versions::place_holds(status, &worker.name, to)))
        .collect();
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for worker in &targets {
        let Some(job) = crate::versions::build_job(ds, plan, worker, run.number, &step, &defaults) else { continue };
        match existing.iter().find(|found| found.name_any() == job.name_any()) {
            None => versioning.create.push(job),
            Some(found) => match status::job_phase(Some(found)) {
                Phase::Succeeded => {
                    done.push(found.name_any());
                    // What the place's `current` names now.
                    if let Some(entry) = status.workers.iter_mut().find(|w| w.name == worker.name) {
                        entry.current_version = to.as_ref().map(ToString::to_string).or(entry.current_version.take());
                    }
                }
                Phase::Failed => failed.push(found.name_any()),
                Phase::Pending | Phase::Running => {}
            },
        }
    }
    // A place's switch is recorded in its entry, so its Job may go; a
    // prune's Jobs go when every place pruned.
    if matches!(step, Step::Switch { .. }) || done.len() == targets.len() {
        versioning.delete.clone_from(&done);
    }
    if done.len() == targets.len() {
        let before = status.versions.clone().unwrap_or_default();
        let note = match &step {
            Step::Switch { to, .. } if before.current.as_deref() == Some(to.as_str()) => {
                // A place that joined (or came back) caught up.
                let names: Vec<&str> = targets.iter().map(|w| w.name.as_str()).collect();
                Some(format!("{} now on the current version {to}", names.join(", ")))
            }
            Step::Switch { to, .. } => Some(format!(
                "{} nodes switched to version {to} of {}; {}",
                places.len(),
                plan.uri,
                before.current.as_ref().map_or_else(
                    || "the first version".to_owned(),
                    |old| format!("version {old} stays while pods that started before use it")
                )
            )),
            Step::Prune { .. } | Step::Idle => Some(format!(
                "removed version {} from {} nodes: no pod that started with it runs",
                before.previous.clone().unwrap_or_default(),
                places.len()
            )),
        };
        crate::versions::completed(status, &step, plan.uri, now);
        let reason = if matches!(step, Step::Switch { .. }) { reasons::SWITCHED } else { reasons::VERSION_REMOVED };
        versioning.events.extend(note.map(|note| (EventType::Normal, reason, note)));
        return versioning;
    }
    versioning.pending = failed.is_empty();
    if let Some(job) = failed.first() {
        let message = format!(
            "Job {job} could not switch its node to {what}; the nodes keep what they had (see the Job's pod log); delete the Job to try again"
        );
        versioning.events.push((EventType::Warning, reasons::SWITCH_FAILED, message.clone()));
        if matches!(step, Step::Switch { .. }) {
            status.phase = Some(Phase::Failed);
            status.conditions = status::conditions(ds, Phase::Failed, reasons::SWITCH_FAILED, &message, now);
        }
    } else if matches!(step, Step::Switch { .. }) {
        // Not ready until every place holds the version as current.
        let switched = places.len() - targets.len() + done.len();
        let message = format!("switching to {what}: {switched} of {} nodes done", places.len());
        status.phase = Some(Phase::Running);
        status.conditions = status::conditions(ds, Phase::Running, reasons::SWITCHING, &message, now);
    }
    versioning
}

impl Versioning {
    /// Creates the step's Jobs, deletes those of a completed step and
    /// publishes its Events.
    async fn carry_out(&self, ds: &DataStage, ctx: &Context) -> Result<(), Error> {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
        for job in &self.create {
            create_job(&jobs, job).await?;
        }
        for (kind, reason, note) in &self.events {
            publish(ctx, ds, kind.clone(), reason, note.clone(), "Switch").await;
        }
        for name in &self.delete {
            delete_job(&jobs, name).await?;
        }
        Ok(())
    }
}

/// Whether `ds` may be evicted or has been: only then does its
/// reconciliation read where pods use it.
fn evicts_or_was_evicted(ds: &DataStage) -> bool {
    crate::eviction::evictable(ds) || ds.status.iter().flat_map(|s| &s.workers).any(|w| w.evicted.is_some())
}

/// Where pods use DataStages, from the pod cache.
fn in_use(ctx: &Context) -> crate::eviction::InUse {
    let pods = ctx.caches.pods.state();
    crate::eviction::InUse::of(pods.iter().map(|pod| &**pod))
}

/// What eviction leaves to do once the status that records it is written.
#[derive(Default)]
struct Evicting {
    /// Clean-up Jobs to create: (node, Job).
    create: Vec<(String, Job)>,
    /// Clean-up Jobs of copies now removed, to delete.
    delete: Vec<String>,
    /// An eviction is under way.
    pending: bool,
    /// A pod uses the data somewhere.
    in_use: bool,
    /// When the next copy comes to its `idleSeconds`.
    next_idle: Option<Duration>,
}

/// Records in `status` where pods use `ds` (`lastUsedTime`), marks the
/// copies waiting pulls chose to evict, and follows each eviction's
/// clean-up Job: what to create or delete once `status` is written.
async fn evict(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    in_use: &crate::eviction::InUse,
    status: &mut DataStageStatus,
    now: &Time,
) -> Evicting {
    let mut evicting = Evicting::default();
    let datastages = ctx.caches.datastages.state();
    let mut chosen = crate::eviction::chosen(ds, datastages.iter().map(|d| &**d), in_use);
    let (idle, next_idle) = crate::eviction::idle_copies(ds, in_use, now.0.as_second());
    for (node, victim) in idle {
        chosen.entry(node).or_insert(victim);
    }
    evicting.next_idle = next_idle.map(|at| Duration::from_secs(u64::try_from(at - now.0.as_second()).unwrap_or(0)));
    let namespace = ds.namespace().unwrap_or_default();
    let cleanups = Caches::of_datastage(&ctx.caches.jobs, &namespace, &ds.name_any(), CLEANUP_LABEL);
    let run = status.run;
    for entry in status.workers.iter_mut() {
        let Some(node) = entry.node.clone() else { continue };
        if in_use.uses(ds, &node) {
            evicting.in_use = true;
            let stale = entry.last_used_time.as_ref().is_none_or(|t| {
                now.0.duration_since(t.0).as_secs_f64() >= crate::eviction::USE_RESOLUTION.as_secs_f64()
            });
            if stale {
                entry.last_used_time = Some(now.clone());
            }
        }
        if entry.evicted.is_none()
            && entry.run == run
            && let Some(victim) = chosen.get(&node)
        {
            let eviction = ferry_crds::Eviction { time: now.clone(), message: victim.message.clone(), removed: false };
            entry.evicted = Some(eviction);
            // Its clean-up removes every version and the link.
            entry.current_version = None;
            ctx.metrics.evicted(victim.bytes);
            let note = format!("{} ({})", victim.message, ferry_contract::size::human_bytes(victim.bytes));
            publish(ctx, ds, EventType::Normal, reasons::EVICTED, note, "Evict").await;
        }
        let Some(eviction) = entry.evicted.as_mut().filter(|e| !e.removed) else { continue };
        let target = Worker { name: entry.name.clone(), node: Some(node.clone()) };
        let job = build_cleanup_job(ds, plan, &target, &ctx.config.worker_defaults());
        match cleanups.iter().find(|j| j.name_any() == job.name_any()) {
            None => {
                evicting.pending = true;
                evicting.create.push((node, job));
            }
            Some(existing) => match status::job_phase(Some(existing)) {
                Phase::Succeeded => {
                    eviction.removed = true;
                    let seconds = u64::try_from(now.0.as_second()).unwrap_or_default();
                    ctx.cleaned.record(&node, seconds);
                    evicting.delete.push(existing.name_any());
                }
                Phase::Failed => {
                    let message = format!(
                        "Job {} could not remove the evicted copy on node {node}; see its pod's log, and delete the Job to try again",
                        existing.name_any()
                    );
                    publish(ctx, ds, EventType::Warning, reasons::EVICTION_FAILED, message, "Evict").await;
                }
                Phase::Pending | Phase::Running => evicting.pending = true,
            },
        }
    }
    evicting
}

impl Evicting {
    /// Creates and deletes the clean-up Jobs of evicted copies.
    async fn carry_out(&self, ds: &DataStage, ctx: &Context) -> Result<(), Error> {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
        for (node, job) in &self.create {
            let note = format!("removing the evicted copy on node {node} (Job {})", job.name_any());
            start_cleanup(ds, ctx, &jobs, job, note, "Evict").await?;
        }
        for name in &self.delete {
            delete_job(&jobs, name).await?;
        }
        Ok(())
    }
}

/// Creates a clean-up Job and announces it (`CleanupStarted`, `note`); one
/// created a moment ago that the cache has not shown yet is left as it is,
/// unannounced.
async fn start_cleanup(
    ds: &DataStage,
    ctx: &Context,
    jobs: &Api<Job>,
    job: &Job,
    note: String,
    action: &str,
) -> Result<(), Error> {
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match jobs.create(&params, job).await {
        Ok(_) => {
            publish(ctx, ds, EventType::Normal, "CleanupStarted", note, action).await;
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// How often a DataStage a StagingQuota or a full disk holds back looks
/// for room (in the operator's caches: a check costs no request).
const ROOM_RECHECK: Duration = Duration::from_secs(10);

/// The room the StagingQuotas of `ds`'s namespace leave each of `starting`
/// (of `places` workers in the run), from what the namespace's other
/// DataStages hold as the caches show them; `need` is what a worker's
/// dataset is known to need.
fn quota_allowance(
    ds: &DataStage,
    ctx: &Context,
    starting: &[Worker],
    places: usize,
    need: impl Fn(&Worker) -> Option<u64>,
) -> crate::quotas::Allowance {
    let namespace = ds.namespace();
    let quotas = ctx.caches.quotas.state();
    let quotas: Vec<&ferry_crds::StagingQuota> =
        quotas.iter().filter(|quota| quota.namespace() == namespace).map(|quota| &**quota).collect();
    if quotas.is_empty() {
        return crate::quotas::Allowance::default();
    }
    let datastages = ctx.caches.datastages.state();
    let others = datastages
        .iter()
        .filter(|other| other.namespace() == namespace && other.metadata.uid != ds.metadata.uid)
        .map(|other| &**other);
    crate::quotas::allowance(ds, starting, places, &crate::quotas::usage(others), &quotas, need)
}

/// What other DataStages' running pulls still write on the node of each of
/// `starting`, by worker name (workers on no node get none).
fn capacity_claims(
    ds: &DataStage,
    ctx: &Context,
    starting: &[Worker],
) -> BTreeMap<String, ferry_contract::CapacityClaims> {
    let datastages = ctx.caches.datastages.state();
    let others: Vec<&DataStage> =
        datastages.iter().filter(|other| other.metadata.uid != ds.metadata.uid).map(|other| &**other).collect();
    starting
        .iter()
        .filter_map(|worker| {
            let node = worker.node.as_deref()?;
            Some((worker.name.clone(), crate::disks::claims_on(node, others.iter().copied())))
        })
        .collect()
}

/// Holds the DataStage back for room, in a StagingQuota (`QuotaExceeded`)
/// or on a node's disk (`InsufficientCapacity`): no worker starts; the
/// status and a Warning say what is needed and what would make room. With
/// `run`, the run that waits (its start is announced once it starts).
async fn hold(
    ds: &DataStage,
    ctx: &Context,
    reason: ferry_contract::Reason,
    message: String,
    run: Option<&Run>,
) -> Result<Action, Error> {
    let reason = reason.as_str();
    // Announced when the hold begins or its reason changes, not at every
    // look for room.
    let conditions = ds.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    if !conditions.iter().any(|c| c.reason == reason && c.message == message) {
        let waiting = run.map_or_else(String::new, |run| format!("run {} waits: ", run.number));
        publish(ctx, ds, EventType::Warning, reason, format!("{waiting}{message}"), "Sync").await;
    }
    let blocked = Blocked { phase: Phase::Pending, failed: false, reason, message, retry: Some(ROOM_RECHECK) };
    write_blocked(ds, ctx, blocked).await
}

/// The Event of a run that starts with this reconciliation; `why` adds
/// what prompted it.
async fn publish_run_started(ds: &DataStage, ctx: &Context, run: &Run, why: Option<&str>) {
    if let Some(trigger) = run.started {
        let why = why.map(|why| format!(": {why}")).unwrap_or_default();
        let message = format!("run {} started ({}){why}", run.number, trigger.reason());
        publish(ctx, ds, EventType::Normal, trigger.reason(), message, "Sync").await;
    }
}

/// Creates a worker's Job, and says whether this call created it. The cache
/// may not show a Job created a moment ago (its watch event can trail the
/// DataStage's), so one that already exists is taken as it is: one Job per
/// worker and run, one Event.
async fn create_job(jobs: &Api<Job>, job: &Job) -> Result<(Job, bool), Error> {
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match jobs.create(&params, job).await {
        Ok(created) => Ok((created, true)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok((jobs.get(&job.name_any()).await?, false)),
        Err(error) => Err(error.into()),
    }
}

/// Whether `worker`'s entry says it finished `run` (its Job may be gone:
/// `ttlSecondsAfterFinished`, or deleted by hand).
fn finished_in(recorded: &[WorkerStatus], worker: &Worker, run: i64) -> bool {
    recorded.iter().any(|w| w.name == worker.name && w.finished_run(run))
}

/// The workers that get a Job now: those without one in the current run
/// (`existing`, the run's Jobs) that have not finished it. A Job that
/// exists is never applied again: its pod template cannot change, and with
/// fanout PeerToPeer it names the peer group as it was when the Job was
/// created. A node that joins later gets a Job naming the group as it is
/// then; the running workers keep theirs and learn the newcomer's address
/// from the status.
pub fn workers_to_start<'a>(
    workers: &'a [Worker],
    existing: &[Job],
    recorded: &[WorkerStatus],
    run: i64,
) -> Vec<&'a Worker> {
    workers
        .iter()
        .filter(|worker| !existing.iter().any(|j| j.labels().get(WORKER_LABEL) == Some(&worker.name)))
        .filter(|worker| !finished_in(recorded, worker, run))
        .collect()
}

/// The plan to create Jobs from, and whether its workers speak TLS to
/// their peers. With fanout PeerToPeer the DataStage's peer Secret must
/// exist first: worker pods read it as they start. It is created once, with
/// a token and the DataStage's peer CA and certificate, and never changed
/// (see [`crate::peers`]); one from a release before peer TLS holds no
/// certificates, and its workers talk plain HTTP with the token, which an
/// event says until the Secret is deleted. Where the operator may not
/// create or read Secrets (a namespace the chart was not told of), the new
/// workers read everything from the store: peers make staging cheaper,
/// never possible.
async fn with_peer_secret<'a>(ds: &DataStage, ctx: &Context, plan: &Plan<'a>) -> Result<(Plan<'a>, bool), Error> {
    if plan.fanout != Fanout::PeerToPeer {
        return Ok((plan.clone(), false));
    }
    let namespace = ds.namespace().unwrap_or_default();
    let name = crate::peers::secret_name(&ds.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let direct = |note: String| async move {
        publish(ctx, ds, EventType::Warning, "PeersUnavailable", note, "Create").await;
        Ok((Plan { fanout: Fanout::Direct, ..plan.clone() }, false))
    };
    let forbidden = |verb: &str| {
        format!(
            "the operator may not {verb} Secret {name} in namespace {namespace}, which peers need; these workers read everything from the store (fanout Direct). Add the namespace to the chart's dataStageNamespaces"
        )
    };
    let now = std::time::SystemTime::now();
    let existing = match secrets.get_opt(&name).await {
        Ok(existing) => existing,
        Err(kube::Error::Api(status)) if status.is_forbidden() => return direct(forbidden("read")).await,
        Err(error) => return Err(error.into()),
    };
    if let Some(existing) = existing {
        let tls = crate::peers::holds_certificates(existing.data.as_ref(), now);
        if !tls {
            let note = format!(
                "peer Secret {name} holds no current peer certificates (it predates peer TLS, or they expired): these workers talk to their peers over plain HTTP with its token. Delete the Secret between runs and the operator issues new ones"
            );
            publish(ctx, ds, EventType::Warning, "PeersWithoutTLS", note, "Create").await;
        }
        return Ok((plan.clone(), tls));
    }
    let certificates = match crate::peers::new_certificates(now) {
        Ok(certificates) => certificates,
        Err(error) => return direct(format!(
            "cannot issue the peer certificates ({error}); these workers read everything from the store (fanout Direct)"
        ))
        .await,
    };
    let secret = crate::peers::build_secret(ds, &crate::peers::new_token(), &certificates);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match secrets.create(&params, &secret).await {
        // Created here, or just now by a reconcile that raced this one
        // (with certificates too: only this release creates).
        Ok(_) => Ok((plan.clone(), true)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok((plan.clone(), true)),
        Err(kube::Error::Api(status)) if status.is_forbidden() => direct(forbidden("create")).await,
        Err(error) => Err(error.into()),
    }
}

/// Deletes the Jobs of runs other than `run` (their pods go with them)
/// and drops them from `jobs`.
async fn retire_other_runs(api: &Api<Job>, jobs: &mut Vec<Job>, run: i64) -> Result<(), Error> {
    let current = run.to_string();
    for job in jobs.iter().filter(|j| j.labels().get(RUN_LABEL) != Some(&current)) {
        if job.metadata.deletion_timestamp.is_none() {
            delete_job(api, &job.name_any()).await?;
        }
    }
    jobs.retain(|j| j.labels().get(RUN_LABEL) == Some(&current));
    Ok(())
}

/// Deletes Job `name` and, in the background, its pods. Returns whether this
/// call deleted it: false when it was gone already.
async fn delete_job(api: &Api<Job>, name: &str) -> Result<bool, Error> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Deletes, from `jobs` and the cluster, the worker Jobs pinned to nodes
/// that no longer exist, with an Event each. A deleted node stops matching
/// the placement (docs/reliability.md), and its Job could only wait: the
/// pod garbage collector deletes the pod bound to the gone node, and the Job
/// makes another that no node can take, Pending for ever. A node of that
/// name that registers again matches again and gets a new Job, which
/// resumes from what is on its disk.
///
/// Only a node that is gone retires a Job: a running worker on a node that
/// is cordoned or relabelled is left to finish.
async fn retire_jobs_of_deleted_nodes(ds: &DataStage, ctx: &Context, jobs: &mut Vec<Job>) -> Result<(), Error> {
    let recorded = ds.status.as_ref().map(|s| s.workers.as_slice()).unwrap_or_default();
    let gone = jobs_on_deleted_nodes(recorded, jobs, |node| ctx.caches.node_exists(node));
    if gone.is_empty() {
        return Ok(());
    }
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    for (job, node) in &gone {
        if delete_job(&api, job).await? {
            let note = format!(
                "deleted Job {job}: node {node} no longer exists; a node of that name that registers again gets a new one"
            );
            publish(ctx, ds, EventType::Normal, reasons::WORKER_DELETED, note, "Delete").await;
        }
    }
    jobs.retain(|job| !gone.iter().any(|(name, _)| job.metadata.name.as_ref() == Some(name)));
    Ok(())
}

/// The worker Jobs among `jobs`, not being deleted already, whose worker's
/// recorded node is not one `node_exists` knows, with that node: (Job,
/// node). A Job whose worker has no recorded node (a claim's, or one not
/// reported yet) is never among them.
pub fn jobs_on_deleted_nodes(
    recorded: &[WorkerStatus],
    jobs: &[Job],
    node_exists: impl Fn(&str) -> bool,
) -> Vec<(String, String)> {
    jobs.iter()
        .filter(|job| job.metadata.deletion_timestamp.is_none())
        .filter_map(|job| {
            let worker = job.labels().get(WORKER_LABEL)?;
            let node = recorded.iter().find(|w| &w.name == worker)?.node.as_deref()?;
            (!node_exists(node)).then(|| (job.name_any(), node.to_owned()))
        })
        .collect()
}

/// The current run's Jobs and pods, per worker.
fn observe(ctx: &Context, ds: &DataStage, workers: &[Worker], jobs: Vec<Job>, run: &Run) -> Vec<Observed> {
    let current = run.number.to_string();
    let mut pods =
        Caches::of_datastage(&ctx.caches.pods, &ds.namespace().unwrap_or_default(), &ds.name_any(), WORKER_LABEL);
    pods.retain(|pod| pod.labels().get(RUN_LABEL) == Some(&current));
    workers
        .iter()
        .map(|worker| {
            let job = jobs.iter().find(|j| j.labels().get(WORKER_LABEL) == Some(&worker.name)).cloned();
            // The node a worker is pinned to, or the one its running pod is
            // bound to, while the worker has work left.
            let node_trouble = (!status::job_phase(job.as_ref()).is_finished())
                .then(|| {
                    let bound = pods
                        .iter()
                        .filter(|pod| pod.labels().get(WORKER_LABEL) == Some(&worker.name) && !is_finished(pod))
                        .filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref());
                    worker.node.as_deref().into_iter().chain(bound).find_map(|node| ctx.caches.node_trouble(node))
                })
                .flatten();
            Observed { worker: worker.clone(), job, report: status::pod_report(&pods, &worker.name), node_trouble }
        })
        .collect()
}

/// Whether a pod has ended (Succeeded or Failed).
fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Entries of nodes that staged earlier but no longer match the placement:
/// kept (their data is still there, and `reclaimPolicy: Delete` removes it
/// when the DataStage goes), marked, and not counted. A worker left to run
/// there (its node cordoned or relabelled) shows how its Job, among the
/// current run's `jobs`, ended.
pub fn departed(ds: &DataStage, workers: &[Worker], plan: &Plan<'_>, jobs: &[Job]) -> Vec<WorkerStatus> {
    if !plan.per_node() {
        return Vec::new();
    }
    let fate = if needs_cleanup(ds) {
        "its data is removed when the DataStage is deleted (reclaimPolicy Delete)"
    } else {
        "its data stays there (reclaimPolicy Retain)"
    };
    ds.status
        .iter()
        .flat_map(|s| &s.workers)
        .filter(|w| !workers.iter().any(|p| p.name == w.name))
        .map(|w| WorkerStatus {
            phase: jobs
                .iter()
                .find(|job| job.labels().get(WORKER_LABEL) == Some(&w.name))
                .map(|job| status::job_phase(Some(job)))
                .filter(|phase| phase.is_finished())
                .or(w.phase),
            message: Some(format!("node no longer matches spec.placement; {fate}")),
            throughput_bytes_per_second: 0,
            // The worker's own field: the operator never applies it.
            peer_address: None,
            ..w.clone()
        })
        .collect()
}

/// A server-side apply of a DataStage's status: apiVersion, kind and
/// status only, so the operator never claims a spec field.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusPatch<'a> {
    api_version: std::borrow::Cow<'static, str>,
    kind: std::borrow::Cow<'static, str>,
    status: &'a DataStageStatus,
}

impl<'a> StatusPatch<'a> {
    fn new(status: &'a DataStageStatus) -> Self {
        Self { api_version: DataStage::api_version(&()), kind: DataStage::kind(&()), status }
    }
}

/// A server-side apply of a DataStage's metadata (its finalizers).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct MetadataPatch {
    api_version: std::borrow::Cow<'static, str>,
    kind: std::borrow::Cow<'static, str>,
    metadata: ObjectMeta,
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
    if applies_nothing(&status, ds.status.as_ref()) {
        return Ok(());
    }
    let patch = StatusPatch::new(&status);
    api.patch_status(&ds.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    if before != after
        && let (Some(phase), Some((reason, message))) = (after.0, ready)
    {
        // Warnings for what a user must act on; waiting is normal.
        let warning = phase == Phase::Failed
            || ferry_contract::Reason::ALL.iter().any(|r| r.as_str() == reason)
            || [
                reasons::SECRET_NOT_FOUND,
                reasons::CA_BUNDLE_NOT_FOUND,
                reasons::NO_MATCHING_NODES,
                reasons::AMBIGUOUS_PUSH_SOURCE,
            ]
            .contains(&reason.as_str());
        let kind = if warning { EventType::Warning } else { EventType::Normal };
        publish(ctx, ds, kind, &reason, message, &format!("{phase:?}")).await;
    }
    Ok(())
}

/// Whether applying `status` would change nothing the DataStage already
/// shows, so the request can be spared: a running DataStage is reconciled
/// on every progress report of every worker. The operator never writes a
/// worker's peer address (the worker's own field), so that is left out of
/// the comparison; every other field of the operator's apply is compared,
/// and a field it omits must be absent too, else the apply would remove it.
pub fn applies_nothing(status: &DataStageStatus, current: Option<&DataStageStatus>) -> bool {
    let Some(current) = current else { return false };
    let without_peer_addresses = |s: &DataStageStatus| {
        let mut s = s.clone();
        s.workers.iter_mut().for_each(|w| w.peer_address = None);
        s
    };
    without_peer_addresses(status) == without_peer_addresses(current)
}

/// Records an Event on the DataStage; failing to is logged, not fatal.
async fn publish(ctx: &Context, ds: &DataStage, kind: EventType, reason: &str, note: String, action: &str) {
    let event =
        Event { type_: kind, reason: reason.to_owned(), note: Some(note), action: action.to_owned(), secondary: None };
    if let Err(error) = ctx.events.publish(&event, &ds.object_ref(&())).await {
        tracing::warn!(%error, "could not record an event");
    }
}

/// Whether deleting this DataStage must remove staged data: a pull into a
/// volume with `reclaimPolicy: Delete`. A push's volume is the user's source
/// and is never cleaned.
pub fn needs_cleanup(ds: &DataStage) -> bool {
    ds.spec.reclaim_policy == Some(ReclaimPolicy::Delete)
        && ds.spec.plan().is_ok_and(|plan| plan.direction == Direction::Pull)
}

fn has_finalizer(ds: &DataStage) -> bool {
    ds.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
}

/// Adds or removes the operator's finalizer. Server-side apply treats
/// finalizers as a set, so the operator's entry is its own and other
/// controllers' finalizers are untouched.
async fn set_finalizer(ds: &DataStage, ctx: &Context, present: bool) -> Result<(), Error> {
    let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let finalizers = if present { vec![CLEANUP_FINALIZER.to_owned()] } else { Vec::new() };
    let patch = MetadataPatch {
        api_version: DataStage::api_version(&()),
        kind: DataStage::kind(&()),
        metadata: ObjectMeta { name: Some(ds.name_any()), finalizers: Some(finalizers), ..ObjectMeta::default() },
    };
    api.patch(&ds.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Whether the DataStage is still there, being deleted, with the clean-up
/// finalizer, asked of the API server rather than the cache. A
/// reconciliation can run from a cached copy just after the clean-up
/// finished, its Jobs were deleted and the finalizer went; without this it
/// started the clean-up again, and its Jobs (not owned, so that the garbage
/// collector does not race them) lingered after the DataStage was gone.
async fn still_cleaning(ds: &DataStage, ctx: &Context) -> Result<bool, Error> {
    let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    let live = api.get_opt(&ds.name_any()).await?;
    Ok(live.is_some_and(|live| live.uid() == ds.uid() && has_finalizer(&live)))
}

/// Where a deleted DataStage's data lies: one entry per worker in its
/// status (which outlives nodes changing labels), except on nodes that no
/// longer exist: their disks went with them, and a Job for them would wait
/// forever.
pub fn cleanup_targets(ds: &DataStage, existing_nodes: &[String]) -> Vec<Worker> {
    let per_node = ds.spec.plan().is_ok_and(|plan| plan.per_node());
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

    // 1. Nothing may still write into the directories being cleaned.
    let running = Caches::of_datastage(&ctx.caches.jobs, &namespace, &name, WORKER_LABEL);
    for job in running.iter().filter(|j| j.metadata.deletion_timestamp.is_none()) {
        match jobs.delete(&job.name_any(), &DeleteParams::foreground()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    if !running.is_empty() || !Caches::of_datastage(&ctx.caches.pods, &namespace, &name, WORKER_LABEL).is_empty() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 2. One clean-up Job per place data was staged.
    let Ok(plan) = ds.spec.plan() else {
        // Nothing was ever staged from a spec without a volume.
        set_finalizer(ds, ctx, false).await?;
        return Ok(Action::await_change());
    };
    let nodes: Vec<String> =
        if plan.per_node() { ctx.caches.nodes.state().iter().map(|n| n.name_any()).collect() } else { Vec::new() };
    let targets = cleanup_targets(ds, &nodes);
    let cleanups = Caches::of_datastage(&ctx.caches.jobs, &namespace, &name, CLEANUP_LABEL);
    let mut done = 0;
    let mut confirmed = false;
    for target in &targets {
        let job = build_cleanup_job(ds, &plan, target, &ctx.config.worker_defaults());
        let job_name = job.name_any();
        let Some(existing) = cleanups.iter().find(|j| j.name_any() == job_name) else {
            if !confirmed {
                if !still_cleaning(ds, ctx).await? {
                    return Ok(Action::await_change());
                }
                confirmed = true;
            }
            let node = target.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_default();
            start_cleanup(ds, ctx, &jobs, &job, format!("removing staged data{node} (Job {job_name})"), "Delete")
                .await?;
            continue;
        };
        match status::job_phase(Some(existing)) {
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
    for job in &cleanups {
        delete_job(&jobs, &job.name_any()).await?;
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
    let seconds = u64::try_from(now().0.as_second()).unwrap_or_default();
    for target in &targets {
        ctx.cleaned.record(target.node.as_deref().unwrap_or_default(), seconds);
    }
    set_finalizer(ds, ctx, false).await?;
    Ok(Action::await_change())
}

/// Requeues failed reconciliations with jitter so many failing objects do
/// not retry in lockstep.
fn error_policy(ds: Arc<DataStage>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(datastage = %ds.name_any(), category = error.category(), %error, "reconcile failed");
    Action::requeue(Duration::from_millis(2000 + rand::random::<u64>() % 3000))
}

/// How long one watch call lasts before it is made again from the last
/// resource version it saw. A watch can stay open and silent: seen on the
/// API server right after it and etcd restarted, when watches resumed from
/// before the restart delivered nothing until their timeout. The caches
/// are all the controller reads, so this bounds how stale they can get;
/// a re-watch is one cheap request, not a list.
const WATCH_SECONDS: u32 = 60;

/// Runs the controller until the process is stopped. `writers` fill the
/// context's caches from the same watches that wake the DataStages.
pub async fn run(ctx: Arc<Context>, writers: CacheWriters) {
    let client = ctx.client.clone();
    let (datastages, jobs, pods) = match &ctx.config.watch_namespace {
        Some(ns) => (
            Api::<DataStage>::namespaced(client.clone(), ns),
            Api::<Job>::namespaced(client.clone(), ns),
            Api::<Pod>::namespaced(client.clone(), ns),
        ),
        None => {
            (Api::<DataStage>::all(client.clone()), Api::<Job>::all(client.clone()), Api::<Pod>::all(client.clone()))
        }
    };
    let watches = watcher::Config::default().timeout(WATCH_SECONDS);
    let datastage_changes = watcher(datastages, watches.clone())
        .modify(crate::cache::slim_datastage)
        .backoff(WatchBackoff::default())
        .reflect(writers.datastages)
        .applied_objects();
    // The controller backs off again on every error its watches pass on,
    // and while it waits it reads none of them: kube's default there (up
    // to 30 s) stopped every trigger at once.
    let controller = Controller::for_stream(datastage_changes, ctx.caches.datastages.clone())
        .trigger_backoff(WatchBackoff::default());
    // StoreBudgets wake no DataStage: the budget loop reads them each period.
    let budget_changes = watcher(Api::<ferry_crds::StoreBudget>::all(client.clone()), watches.clone())
        .backoff(WatchBackoff::default())
        .reflect(writers.budgets)
        .for_each(|event| async move {
            if let Err(error) = event {
                tracing::debug!(%error, "StoreBudget watch (is the StoreBudget CRD installed?)");
            }
        });
    // A StagingQuota's change wakes its namespace's pulls: one it held back
    // may fit now, and the room of workers yet to start is worked out anew.
    let quotas = match &ctx.config.watch_namespace {
        Some(ns) => Api::<ferry_crds::StagingQuota>::namespaced(client.clone(), ns),
        None => Api::<ferry_crds::StagingQuota>::all(client.clone()),
    };
    let mut quota_wakes = crate::quotas::QuotaWakes::default();
    let quota_changes = watcher(quotas, watches.clone())
        .backoff(WatchBackoff::default())
        .reflect(writers.quotas)
        .flat_map(move |event| {
            let woken: Vec<Result<ferry_crds::StagingQuota, watcher::Error>> = match event {
                Ok(event) => quota_wakes.on(event).into_iter().map(Ok).collect(),
                Err(error) => {
                    tracing::debug!(%error, "StagingQuota watch (is the StagingQuota CRD installed?)");
                    Vec::new()
                }
            };
            futures::stream::iter(woken)
        });
    let datastages = controller.store();
    let in_namespace = datastages.clone();
    let pods_on_nodes = ctx.caches.pods.clone();
    let owned = watches.clone().labels(DATASTAGE_LABEL);
    let job_changes = watcher(jobs, owned.clone())
        .modify(crate::cache::slim_job)
        .backoff(WatchBackoff::default())
        .reflect(writers.jobs)
        .touched_objects();
    // A pod's termination message carries its worker's summary.
    let pod_changes = watcher(pods, owned)
        .modify(crate::cache::slim_pod)
        .backoff(WatchBackoff::default())
        .reflect(writers.pods)
        .touched_objects();
    // A node's labels, taints, cordon, readiness and existence decide
    // whether it matches or can run a worker; its status heartbeats do not
    // (see `node_wakes`).
    let mut node_wakes = crate::node_wakes::NodeWakes::default();
    let node_changes = watcher(Api::<Node>::all(client), watches)
        .modify(crate::cache::slim_node)
        .backoff(WatchBackoff::default())
        .reflect(writers.nodes)
        .flat_map(move |event| {
            let woken: Vec<Result<Node, watcher::Error>> = match event {
                Ok(event) => node_wakes.on(event).into_iter().map(Ok).collect(),
                Err(error) => vec![Err(error)],
            };
            futures::stream::iter(woken)
        });
    let woken = ctx.wakes.take().expect("the controller runs once per process");
    let reconciling = controller
        .reconcile_on(woken)
        .owns_stream(job_changes)
        .watches_stream(pod_changes, |pod| {
            let name = pod.labels().get(DATASTAGE_LABEL)?;
            Some(ObjectRef::<DataStage>::new(name).within(&pod.namespace()?))
        })
        .watches_stream(quota_changes, move |quota| {
            let namespace = quota.namespace();
            in_namespace
                .state()
                .into_iter()
                .filter(|ds| ds.namespace() == namespace)
                .map(|ds| ObjectRef::from_obj(&*ds))
                .collect::<Vec<_>>()
        })
        .watches_stream(node_changes, move |node| {
            // DataStages placed per node, and those with a worker on it.
            let name = node.name_any();
            let mut woken: Vec<ObjectRef<DataStage>> = datastages
                .state()
                .into_iter()
                .filter(|ds| ds.spec.plan().is_ok_and(|plan| plan.per_node()))
                .map(|ds| ObjectRef::from_obj(&*ds))
                .collect();
            for pod in pods_on_nodes.state() {
                if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(name.as_str()) {
                    continue;
                }
                if let (Some(ds), Some(namespace)) = (pod.labels().get(DATASTAGE_LABEL), pod.namespace()) {
                    woken.push(ObjectRef::new(ds).within(&namespace));
                }
            }
            woken.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            woken.dedup();
            woken
        })
        .run(reconcile, error_policy, Arc::clone(&ctx))
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile loop");
            }
        });
    tokio::join!(reconciling, budget_changes, crate::budgets::run(Arc::clone(&ctx)), crate::quotas::run(ctx));
}

/// Builds the context once at start-up, and the writers [`run`] fills its
/// caches with.
pub fn context(client: kube::Client, config: OperatorConfig, metrics: Arc<Metrics>) -> (Arc<Context>, CacheWriters) {
    let reporter = Reporter { controller: "ferry-operator".into(), instance: std::env::var("HOSTNAME").ok() };
    let events = EventPublisher::new(client.clone(), reporter);
    let (caches, writers) = crate::cache::new();
    let (cleaned, wakes) = (Default::default(), Default::default());
    (Arc::new(Context { client, config, metrics, events, caches, cleaned, wakes }), writers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert_eq!(targets, [Worker::on_node("node-a")]);
    }

    #[test]
    fn host_paths_outside_the_allow_list_are_refused_with_advice() {
        let config = OperatorConfig::test();
        let check = |d: &DataStage| validate(d, &d.spec.plan().unwrap(), &config).map(|s| s.is_some());
        assert_eq!(check(&ds("/mnt/x", "s3://b/p")), Ok(false));
        let invalid = check(&ds("/etc/x", "s3://b/p")).unwrap_err();
        assert_eq!(invalid.reason, reasons::HOST_PATH_NOT_ALLOWED);
        assert!(invalid.message.contains("/mnt, /data"), "{}", invalid.message);
        assert_eq!(check(&ds("/mnt/x", "gs://b/p")), Ok(false));
        let mut anonymous_s3 = ds("/mnt/x", "s3://b/p");
        anonymous_s3.spec.source.anonymous = Some(true);
        assert_eq!(check(&anonymous_s3).unwrap_err().reason, reasons::UNSUPPORTED_STORE);
        let mut anonymous_azure = ds("/mnt/x", "az://public/p");
        anonymous_azure.spec.source.anonymous = Some(true);
        assert_eq!(check(&anonymous_azure), Ok(false), "a public container");
        let mut small_parts: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "n"},
            "spec": {"source": {"volume": {"hostPath": "/mnt/x"}}, "destination": {"uri": "s3://b/p"},
                     "transfer": {"partSize": "4Mi"}}}))
        .unwrap();
        assert_eq!(check(&small_parts).unwrap_err().reason, reasons::INVALID_TRANSFER);
        small_parts.spec.transfer.as_mut().unwrap().part_size = Some("5Mi".parse().unwrap());
        assert_eq!(check(&small_parts), Ok(false));
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

    #[test]
    fn a_name_too_long_for_a_label_fails_with_advice_instead_of_retrying() {
        let config = OperatorConfig::test();
        let mut long = ds("/mnt/x", "s3://b/p");
        long.metadata.name = Some("x".repeat(ferry_crds::MAX_NAME_LENGTH));
        assert_eq!(validate(&long, &long.spec.plan().unwrap(), &config), Ok(None));
        long.metadata.name = Some("x".repeat(ferry_crds::MAX_NAME_LENGTH + 1));
        let invalid = validate(&long, &long.spec.plan().unwrap(), &config).unwrap_err();
        assert_eq!(invalid.reason, reasons::NAME_TOO_LONG);
        assert!(invalid.message.contains("metadata.name is 64 characters"), "{}", invalid.message);
    }

    #[test]
    fn a_schedule_that_does_not_parse_is_refused_with_advice() {
        let config = OperatorConfig::test();
        let mut scheduled = ds("/mnt/x", "s3://b/p");
        scheduled.spec.schedule = Some("*/5 * * * * *".into());
        assert_eq!(validate(&scheduled, &scheduled.spec.plan().unwrap(), &config).map(|s| s.is_some()), Ok(true));
        scheduled.spec.schedule = Some("61 * * * *".into());
        let invalid = validate(&scheduled, &scheduled.spec.plan().unwrap(), &config).unwrap_err();
        assert_eq!(invalid.reason, reasons::INVALID_SCHEDULE);
        assert!(invalid.message.contains("minute 61"), "{}", invalid.message);
        scheduled.spec.schedule = Some("@daily".into());
        scheduled.spec.time_zone = Some("Mars/Base".into());
        let invalid = validate(&scheduled, &scheduled.spec.plan().unwrap(), &config).unwrap_err();
        assert!(invalid.message.contains("Mars/Base"), "{}", invalid.message);
    }
}
