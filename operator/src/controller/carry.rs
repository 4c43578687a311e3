//! Carrying out a run: choose it ([`choose_run`]), start the workers it
//! lacks in their home ([`start_workers`]), observe them and fold their
//! reports into the status ([`fold`]), then the steps that follow a run
//! (versions, eviction) and when to look again ([`next_look`]).

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_crds::names;
use ferry_crds::plan::{Direction, Plan};
use ferry_crds::{DataStage, DataStageStatus, Fanout, Phase, WorkerStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use super::error::Error;
use super::evicting::{Evicting, evict, evicts_or_was_evicted, in_use};
use super::prepare::{Blocked, missing_ca_bundle, missing_secret, needs_cleanup, node_cache, node_cache_refusal};
use super::versioning::{Versioning, advance_versions, versions_jobs_at_work};
use super::writes::{FIELD_MANAGER, create_job, delete_job, now, publish, update_status, write_blocked};
use crate::cache::Caches;
use crate::context::Context;
use crate::disks::AfterRefusal;
use crate::home::Home;
use crate::jobs::{WorkerDefaults, build_job};
use crate::metrics::DataStageProgress;
use crate::runs::{self, Run};
use crate::schedule::Schedule;
use crate::status::{self, Inputs, Observed, reasons};
use crate::worker::Worker;

/// How often a DataStage a StagingQuota or a full disk holds back looks
/// for room (in the operator's caches: a check costs no request).
const ROOM_RECHECK: Duration = Duration::from_secs(10);

/// How long a worker Job may be without pods before the operator asks the
/// Job controller's Events why.
const PODS_PATIENCE: Duration = Duration::from_secs(5);

/// The home of `ds`'s workers with its owner in place (the anchor in the
/// workers' namespace, made on first need), and the defaults its Jobs are
/// built with.
pub(super) async fn settle(ds: &DataStage, ctx: &Context, plan: &Plan<'_>) -> Result<(Home, WorkerDefaults), Error> {
    let mut defaults = ctx.config.worker_defaults();
    defaults.node_cache = node_cache(plan, ctx).map(|cache| cache.spec.clone());
    let mut home = defaults.home(ds, plan);
    if home.elsewhere() && home.owner.is_none() {
        let uid = home.datastage.uid.clone();
        let remembered = ctx.anchors.lock().expect("anchors").get(&uid).cloned();
        let owner = match remembered {
            Some(owner) => owner,
            None => {
                let owner = make_anchor(ctx, &home).await?;
                ctx.remember_anchor(&uid, owner.clone());
                owner
            }
        };
        home.owner = Some(owner);
    }
    defaults.anchor = home.owner.clone().filter(|_| home.elsewhere());
    Ok((home, defaults))
}

/// Creates `home`'s anchor, or finds the one made before; its owner
/// reference.
async fn make_anchor(
    ctx: &Context,
    home: &Home,
) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference, Error> {
    let anchor = home.anchor().expect("a home elsewhere has an anchor");
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &home.namespace);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    let made = match api.create(&params, &anchor).await {
        Ok(made) => made,
        Err(kube::Error::Api(status)) if status.is_already_exists() => api.get(&home.prefix).await?,
        Err(error) => return Err(error.into()),
    };
    // The prefix holds a hash of the uid; a different uid here would be
    // a collision of hashes, which the uid label check below turns into
    // a wait rather than a shared anchor.
    if !home.holds(&made.metadata) {
        return Err(Error::Taken(format!("ConfigMap {}/{}", home.namespace, home.prefix)));
    }
    Ok(Home::anchor_owner(&made).expect("an anchor from the API has a name and uid"))
}

/// The Jobs of a run: creates the missing ones of workers that have not
/// finished this run, deletes those of other runs, and aggregates.
pub(super) async fn carry_out(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    schedule: Option<&Schedule>,
    workers: &[Worker],
) -> Result<Action, Error> {
    let now = now();
    let (home, defaults) = settle(ds, ctx, plan).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);
    let mut existing = Caches::of_home(&ctx.caches.jobs, &home, names::WORKER);
    let awaited = ctx.caches.created.fill_in(&home.datastage, &mut existing);
    let in_use = evicts_or_was_evicted(ds, ctx, plan).then(|| in_use(ctx));
    let (run, room_found) = match choose_run(ds, ctx, workers, &existing, schedule, in_use.as_ref(), &now).await? {
        Chosen::Run(run, room_found) => (run, room_found),
        Chosen::Held(action) => return Ok(action),
    };
    retire_other_runs(&jobs, &mut existing, run.number).await?;
    retire_jobs_of_deleted_nodes(ds, ctx, &home, &mut existing).await?;
    retire_strays(ds, ctx, &home).await?;
    let started = match start_workers(ds, ctx, plan, (&home, defaults.clone()), workers, &run, &mut existing).await? {
        Started::Done(started) => started,
        Started::Stopped(action) => return Ok(action),
    };
    publish_run_started(ds, ctx, &run, room_found.as_deref()).await;
    for (job_name, worker) in &started.created {
        let node = worker.node.as_deref().map(|n| format!(" on node {n}")).unwrap_or_default();
        let note = format!("created Job {job_name}{node} for run {}", run.number);
        publish(ctx, ds, EventType::Normal, reasons::WORKER_CREATED, note, "Create").await;
    }
    if let Some(error) = started.failed {
        return Err(error);
    }
    let mut status = fold(ds, ctx, (plan, &home), workers, existing, &run, schedule, &now).await;
    for entry in status.workers.iter_mut() {
        if let Some(message) = started.held_by_quota.get(&entry.name) {
            entry.reason = Some(ferry_contract::Reason::QuotaExceeded.to_string());
            entry.message = Some(message.clone());
        }
    }
    if status.run != Some(run.number) {
        let note = status.conditions.first().map(|c| c.message.clone()).unwrap_or_default();
        publish(ctx, ds, EventType::Normal, reasons::RESYNCING, note, "Sync").await;
    }
    let versioning = if ds.spec.versioned() && plan.direction == Direction::Pull {
        advance_versions(ds, ctx, (plan, &home, &defaults), workers, &run, &mut status, &now).await
    } else {
        Versioning::default()
    };
    let evicting = match &in_use {
        Some(in_use) => evict(ds, ctx, (plan, &home, &defaults), in_use, &mut status, &now).await,
        None => Evicting::default(),
    };
    let token_due = super::claims::renew_token(ds, ctx, plan, &home, &status).await?;
    let phase = status.phase.unwrap_or(Phase::Pending);
    let next_sync = status.next_sync_time.clone();
    let resync = status.run != Some(run.number);
    ctx.metrics.observe(&home.datastage.namespace, &home.datastage.name, Some(DataStageProgress::of(&status)));
    // Nodes that no longer hold a copy lose their label before the
    // status says so and before an evicted copy's clean-up starts.
    super::claims::label_nodes(ds, ctx, &status).await?;
    update_status(ds, ctx, status).await?;
    evicting.carry_out(ds, ctx, &home).await?;
    versioning.carry_out(ds, ctx, &home).await?;
    let look =
        Look { resync, versioning: &versioning, evicting: &evicting, held: !started.held_by_quota.is_empty(), awaited };
    // A web identity token is renewed in time, whatever else waits.
    let delay = match (next_look(&look, phase, next_sync.as_ref(), &now), token_due) {
        (Some(delay), Some(due)) => Some(delay.min(due)),
        (delay, due) => delay.or(due),
    };
    Ok(delay.map_or_else(Action::await_change, Action::requeue))
}

/// What a reconciliation learnt that decides when to look again.
struct Look<'a> {
    resync: bool,
    versioning: &'a Versioning,
    evicting: &'a Evicting,
    held: bool,
    awaited: bool,
}

/// How soon to reconcile the DataStage again; `None`: when it changes.
fn next_look(look: &Look<'_>, phase: Phase, next_sync: Option<&Time>, now: &Time) -> Option<Duration> {
    Some(match (phase, next_sync) {
        _ if look.resync => Duration::from_millis(500),
        // Switch and prune Jobs are watched; this guards a missed event.
        _ if look.versioning.pending => Duration::from_secs(5),
        // A clean-up Job of an evicted copy is not watched: look again soon.
        _ if look.evicting.pending => Duration::from_secs(2),
        // Keep lastUsedTime current while pods use the data, and evict an
        // idle copy when its time comes.
        _ if look.evicting.in_use || look.evicting.next_idle.is_some() => {
            let next_idle = look.evicting.next_idle.unwrap_or(Duration::MAX).max(Duration::from_secs(1));
            let refresh = if look.evicting.in_use { crate::eviction::USE_RESOLUTION } else { Duration::MAX };
            next_idle.min(refresh)
        }
        // Room appears when a quota is raised (watched) or another
        // DataStage shrinks or goes (not watched for this).
        _ if look.held => ROOM_RECHECK,
        // Jobs, their pods and the workers' reports are watched and wake
        // the DataStage; the requeue only guards against a missed event,
        // or a Job taken as created that the cache has not shown yet, or a
        // Job whose pods are refused (asked about again).
        (Phase::Pending | Phase::Running, _) if look.awaited => {
            crate::cache::CreatedJobs::PATIENCE + Duration::from_secs(1)
        }
        (Phase::Pending, _) => Duration::from_secs(10),
        (Phase::Running, _) => Duration::from_secs(60),
        // Wake up for the next scheduled sync (changes wake it earlier).
        (_, Some(next)) => {
            let wait = next.0.duration_since(now.0).as_secs_f64().clamp(0.2, 3600.0);
            Duration::from_secs_f64(wait)
        }
        _ => return None,
    })
}

/// The run chosen, or the DataStage held back for room.
enum Chosen {
    /// Carry out this run; with what room was found, when that started it.
    Run(Run, Option<String>),
    /// Held back (the status says why); look again then.
    Held(Action),
}

/// The current run: the one the spec and schedule call for, or the next
/// when a run refused for room (by a StagingQuota, a full disk) or evicted
/// may start again now; or a hold while it may not.
async fn choose_run(
    ds: &DataStage,
    ctx: &Context,
    workers: &[Worker],
    existing: &[Job],
    schedule: Option<&Schedule>,
    in_use: Option<&crate::eviction::InUse>,
    now: &Time,
) -> Result<Chosen, Error> {
    let mut run = runs::current(ds, schedule, now.0);
    // A run a StagingQuota refused starts again, once its Jobs are over,
    // when the quota leaves its dataset room; until then the DataStage
    // waits, saying why.
    let this_run = run.number.to_string();
    let run_over = existing
        .iter()
        .filter(|job| job.labels().get(names::RUN) == Some(&this_run))
        .all(|job| status::job_phase(Some(job)).is_finished());
    if run.started.is_none() && run_over && crate::quotas::refused_in(ds, run.number) {
        let refused = run.number;
        let need = |worker: &Worker| crate::quotas::refused_need(ds, &worker.name, refused);
        let allowance = quota_allowance(ds, ctx, workers, workers.len(), need);
        if let Some(message) = allowance.first_hold() {
            let action = hold(ds, ctx, ferry_contract::Reason::QuotaExceeded, message.to_owned(), None).await?;
            return Ok(Chosen::Held(action));
        }
        run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::RoomInQuota) };
    }
    // An evicted copy is staged again once a pod waits for it.
    if run.started.is_none() && run_over && in_use.is_some_and(|in_use| in_use.waits_for(ds)) {
        run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::PodWaiting) };
    }
    // A run a full disk refused waits the same way, and starts again when
    // one of its nodes may have room (crate::disks says when), which
    // evicting idle copies of other DataStages may make (crate::eviction).
    let refused =
        if run.started.is_none() && run_over { crate::disks::refused_for_room(ds, run.number) } else { Vec::new() };
    if refused.is_empty() {
        return Ok(Chosen::Run(run, None));
    }
    let datastages = ctx.caches.datastages.state();
    let disks = crate::disks::Disks::measured_by(datastages.iter().map(|other| &**other));
    let seconds = u64::try_from(now.0.as_second()).unwrap_or_default();
    match crate::disks::after_refusal(&refused, &disks, &ctx.cleaned, seconds) {
        Some(AfterRefusal::Wait(mut message)) => {
            let fresh;
            let in_use = match in_use {
                Some(in_use) => in_use,
                None => {
                    fresh = self::in_use(ctx);
                    &fresh
                }
            };
            let plan = crate::eviction::plan_for(ds, &refused, datastages.iter().map(|d| &**d), in_use);
            for victim in &plan.victims {
                ctx.wakes.wake(&victim.namespace, &victim.name);
            }
            if !plan.notes.is_empty() {
                message = format!("{message}; {}", plan.notes.join("; "));
            }
            let action = hold(ds, ctx, ferry_contract::Reason::InsufficientCapacity, message, None).await?;
            Ok(Chosen::Held(action))
        }
        Some(AfterRefusal::LookAgain(why)) => {
            let run = Run { number: run.number + 1, inputs: run.inputs, started: Some(runs::Trigger::RoomOnDisk) };
            Ok(Chosen::Run(run, Some(why)))
        }
        None => Ok(Chosen::Run(run, None)),
    }
}

/// What starting the run's missing workers did.
#[derive(Default)]
struct StartedWorkers {
    /// Jobs this call created, with their workers.
    created: Vec<(String, Worker)>,
    /// The first create that failed.
    failed: Option<Error>,
    /// Workers a StagingQuota holds back, with why.
    held_by_quota: BTreeMap<String, String>,
}

/// Started workers, or a stop before any (the status says why).
enum Started {
    Done(StartedWorkers),
    Stopped(Action),
}

/// Creates the Jobs of the workers of `run` that have none and have not
/// finished it, with everything they need first: what the admin allows
/// checked against the namespace, the DataStage's credentials delivered
/// to their home, the volume pods will read, the peer Secret, the room
/// quotas leave and the store budget's share.
///
/// Long on purpose: the order of those steps is the point (each must hold
/// before the next is asked of the API server, and the comments inside say
/// why); each step with rules of its own is a function it calls.
async fn start_workers(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    (home, mut defaults): (&Home, WorkerDefaults),
    workers: &[Worker],
    run: &Run,
    existing: &mut Vec<Job>,
) -> Result<Started, Error> {
    let recorded = ds.status.as_ref().map(|s| s.workers.as_slice()).unwrap_or_default();
    let mut starting: Vec<Worker> =
        workers_to_start(workers, existing, recorded, run.number).into_iter().cloned().collect();
    let mut started = StartedWorkers::default();
    if starting.is_empty() {
        return Ok(Started::Done(started));
    }
    // A versioned pull's workers build where a switch or prune Job still
    // at work would move their directory away: they start after it.
    if ds.spec.versioned() && versions_jobs_at_work(ctx, home) {
        return Ok(Started::Stopped(Action::requeue(Duration::from_secs(2))));
    }
    // A new DataStage waits for its Jobs as long as the requests made
    // before them one after another, each queued behind all else the API
    // server does: the namespace's checks, the deliveries, the peer
    // Secret, then every Job at once, and the Events only after them.
    //
    // What the DataStage's namespace holds is checked only here: a Secret
    // deleted under running workers shows in their pods, and a running
    // DataStage costs no request for it.
    if let Some(blocked) = refusal_before_start(ds, ctx, plan, home).await? {
        publish_run_started(ds, ctx, run, None).await;
        return Ok(Started::Stopped(write_blocked(ds, ctx, blocked).await?));
    }
    let need = |worker: &Worker| crate::quotas::refused_need(ds, &worker.name, run.number);
    let allowance = quota_allowance(ds, ctx, &starting, workers.len(), need);
    if !allowance.held.is_empty() {
        let nothing_else = existing.is_empty() && !workers.iter().any(|w| finished_in(recorded, w, run.number));
        if let (true, Some(message)) = (nothing_else && allowance.room.is_empty(), allowance.first_hold()) {
            let action = hold(ds, ctx, ferry_contract::Reason::QuotaExceeded, message.to_owned(), Some(run)).await?;
            return Ok(Started::Stopped(action));
        }
        // Workers the quota has room for start; the others wait, each
        // entry saying why.
        starting.retain(|worker| !allowance.held.contains_key(&worker.name));
        started.held_by_quota = allowance.held;
    }
    let (jobs_plan, peer_tls) = with_peer_secret(ds, ctx, plan, home).await?;
    defaults.peer_tls = peer_tls;
    // Workers that join a run others are in read from them what they read.
    defaults.peers_running = crate::peers::running_groups(existing);
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
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);
    let jobs = &jobs;
    let defaults = &defaults;
    let jobs_plan = &jobs_plan;
    let creating = starting.iter().map(|worker| {
        let job = build_job(ds, jobs_plan, worker, workers, run.number, defaults);
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
                started.created.extend(new.map(|worker| (job.name_any(), worker.clone())));
                existing.push(job);
            }
            Err(error) => started.failed = started.failed.or(Some(error)),
        }
    }
    drop(counted_until_recorded);
    // Refusals that a retry cannot change end the reconciliation with a
    // condition that says why.
    if let Some(Error::Kube(kube::Error::Api(status))) = &started.failed
        && started.created.is_empty()
    {
        let blocked = match status.code {
            // The chart grants Job creation only where Ferry is enabled: a
            // claim DataStage in another namespace says so instead of
            // retrying silently.
            403 => {
                let refused = crate::delivery::not_permitted("create worker Jobs", &home.prefix, &home.namespace);
                Some(Blocked::waiting(refused.reason, refused.message))
            }
            // A Job the API server finds invalid stays invalid until the
            // spec changes (an edit wakes the DataStage): retrying would spin.
            422 => Some(Blocked::from(invalid_worker_job(&status.message))),
            _ => None,
        };
        if let Some(blocked) = blocked {
            return Ok(Started::Stopped(write_blocked(ds, ctx, blocked).await?));
        }
    }
    Ok(Started::Done(started))
}

/// What the DataStage's namespace must hold before its workers start, or
/// why they may not: the NodeCache's leave for the namespace, the Secret,
/// CA bundle and web identity delivered to a home elsewhere (or checked
/// for a claim's workers, which read them themselves), and the volume
/// and claim pods will read the data through.
async fn refusal_before_start(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    home: &Home,
) -> Result<Option<Blocked>, Error> {
    if let Some(blocked) = node_cache_refusal(ds, plan, ctx).await? {
        return Ok(Some(blocked));
    }
    if home.elsewhere() {
        match crate::delivery::deliver(&ctx.client, ds, plan, home).await? {
            Ok(renew) => {
                if let (Some(renew), Some(uid)) = (renew, ds.uid()) {
                    ctx.tokens.lock().expect("tokens").insert(uid, renew);
                }
            }
            Err(undelivered) => return Ok(Some(Blocked::waiting(undelivered.reason, undelivered.message))),
        }
    } else {
        let missing = match missing_secret(ds, plan, ctx).await? {
            Some(blocked) => Some(blocked),
            None => missing_ca_bundle(ds, plan, ctx).await?,
        };
        if missing.is_some() {
            return Ok(missing);
        }
    }
    super::claims::make_volume(ds, ctx, plan).await
}

/// Observes the run's workers and folds them, with what left the
/// placement, into the status the DataStage gets.
#[allow(clippy::too_many_arguments)]
async fn fold(
    ds: &DataStage,
    ctx: &Context,
    (plan, home): (&Plan<'_>, &Home),
    workers: &[Worker],
    existing: Vec<Job>,
    run: &Run,
    schedule: Option<&Schedule>,
    now: &Time,
) -> DataStageStatus {
    let departed_entries = departed(ds, workers, plan, &existing);
    let observed = observe(ctx, home, workers, existing, run).await;
    let inputs = Inputs { run, direction: plan.direction, fanout: plan.fanout, observed: &observed, now };
    let mut status = status::aggregate(ds, &inputs);
    status.workers.extend(departed_entries);
    status.claim_name = crate::volumes::reads_through_volume(plan).then(|| crate::volumes::claim_name(&ds.name_any()));
    if status.phase.is_some_and(Phase::is_finished) && status.run == Some(run.number) {
        let last = status.last_sync_time.as_ref().map_or(now.0, |t| t.0);
        status.next_sync_time =
            schedule.filter(|_| ds.spec.suspend != Some(true)).and_then(|s| s.next_after(last)).map(Time);
    }
    status
}

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

/// What a DataStage says when the API server refuses its worker Job as
/// invalid (`message`, the API server's words): the fields the operator
/// does not judge itself are copied into the Job from the spec.
fn invalid_worker_job(message: &str) -> crate::admission::Invalid {
    crate::admission::Invalid {
        reason: reasons::INVALID_WORKER_JOB,
        message: format!(
            "the API server refuses the worker Job built from this spec: {message}; fix the DataStage field it comes from (the Job copies spec.placement, spec.resources and the transfer settings) and the DataStage runs again"
        ),
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
        .filter(|worker| !existing.iter().any(|j| j.labels().get(names::WORKER) == Some(&worker.name)))
        .filter(|worker| !finished_in(recorded, worker, run))
        .collect()
}

/// The plan to create Jobs from, and whether its workers speak TLS to
/// their peers. With fanout PeerToPeer the DataStage's peer Secret must
/// exist first: worker pods read it as they start. It is created once, in
/// the workers' home, with a token and the DataStage's peer CA and
/// certificate, and never changed while workers use it (see
/// [`crate::peers`]). What stands under its name and is not the operator's
/// own for this DataStage, or holds no current certificates, is replaced
/// when no worker of the run is left to use it; until then the new workers
/// read everything from the store: peers make staging cheaper, never
/// possible, and never talk without mutual TLS.
async fn with_peer_secret<'a>(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'a>,
    home: &Home,
) -> Result<(Plan<'a>, bool), Error> {
    if plan.fanout != Fanout::PeerToPeer {
        return Ok((plan.clone(), false));
    }
    let name = crate::peers::secret_name(home);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &home.namespace);
    let direct = |note: String| async move {
        publish(ctx, ds, EventType::Warning, "PeersUnavailable", note, "Create").await;
        Ok((Plan { fanout: Fanout::Direct, ..plan.clone() }, false))
    };
    let now = std::time::SystemTime::now();
    let existing = match secrets.get_opt(&name).await {
        Ok(existing) => existing,
        Err(kube::Error::Api(status)) if status.is_forbidden() => {
            let note = format!(
                "the operator may not read Secret {name} in namespace {}, which peers need; these workers read everything from the store (fanout Direct)",
                home.namespace
            );
            return direct(note).await;
        }
        Err(error) => return Err(error.into()),
    };
    if let Some(existing) = existing {
        if crate::peers::usable_secret(home, &existing, now) {
            return Ok((plan.clone(), true));
        }
        let in_use = !Caches::of_home(&ctx.caches.pods, home, names::WORKER).is_empty();
        if in_use {
            let note = format!(
                "Secret {name} is not a peer Secret the operator made for this DataStage with current certificates; these workers read everything from the store (fanout Direct), and the operator replaces it once no worker runs"
            );
            return direct(note).await;
        }
        match secrets.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
        let note = format!(
            "replaced Secret {name}: it was not a peer Secret the operator made for this DataStage with current certificates"
        );
        publish(ctx, ds, EventType::Warning, "PeerSecretReplaced", note, "Create").await;
    }
    let certificates = match crate::peers::new_certificates(now) {
        Ok(certificates) => certificates,
        Err(error) => return direct(format!(
            "cannot issue the peer certificates ({error}); these workers read everything from the store (fanout Direct)"
        ))
        .await,
    };
    let secret = crate::peers::build_secret(home, &crate::peers::new_token(), &certificates);
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match secrets.create(&params, &secret).await {
        Ok(_) => Ok((plan.clone(), true)),
        // Created just now by a reconcile that raced this one: it is ours
        // only if it says so.
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let raced = secrets.get(&name).await?;
            let usable = crate::peers::usable_secret(home, &raced, now);
            if usable {
                Ok((plan.clone(), true))
            } else {
                direct(format!("Secret {name} changed under the operator")).await
            }
        }
        Err(kube::Error::Api(status)) if status.is_forbidden() => {
            direct(format!("the operator may not create Secret {name} in namespace {}", home.namespace)).await
        }
        Err(error) => Err(error.into()),
    }
}

/// Deletes the Jobs of runs other than `run` (their pods go with them)
/// and drops them from `jobs`.
async fn retire_other_runs(api: &Api<Job>, jobs: &mut Vec<Job>, run: i64) -> Result<(), Error> {
    let current = run.to_string();
    for job in jobs.iter().filter(|j| j.labels().get(names::RUN) != Some(&current)) {
        if job.metadata.deletion_timestamp.is_none() {
            delete_job(api, &job.name_any()).await?;
        }
    }
    jobs.retain(|j| j.labels().get(names::RUN) == Some(&current));
    Ok(())
}

/// Deletes the worker Jobs a release before the workers' namespace made
/// for this node-local DataStage in its own namespace: the workers run in
/// their home now, and two workers must never write one node's directory.
pub(super) async fn retire_strays(ds: &DataStage, ctx: &Context, home: &Home) -> Result<(), Error> {
    let strays = ctx.caches.strays(home);
    if strays.is_empty() {
        return Ok(());
    }
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &home.datastage.namespace);
    for job in strays.iter().filter(|j| j.metadata.deletion_timestamp.is_none()) {
        if delete_job(&api, &job.name_any()).await? {
            let note = format!(
                "deleted Job {}: this release runs the workers of node-local volumes in namespace {}, not in the DataStage's",
                job.name_any(),
                home.namespace
            );
            publish(ctx, ds, EventType::Normal, reasons::WORKER_DELETED, note, "Delete").await;
        }
    }
    Ok(())
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
pub(super) async fn retire_jobs_of_deleted_nodes(
    ds: &DataStage,
    ctx: &Context,
    home: &Home,
    jobs: &mut Vec<Job>,
) -> Result<(), Error> {
    let recorded = ds.status.as_ref().map(|s| s.workers.as_slice()).unwrap_or_default();
    let gone = jobs_on_deleted_nodes(recorded, jobs, |node| ctx.caches.node_exists(node));
    if gone.is_empty() {
        return Ok(());
    }
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);
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
            let worker = job.labels().get(names::WORKER)?;
            let node = recorded.iter().find(|w| &w.name == worker)?.node.as_deref()?;
            (!node_exists(node)).then(|| (job.name_any(), node.to_owned()))
        })
        .collect()
}

/// The current run's Jobs and pods, per worker, and why a Job that has no
/// pod could not make one (asked of its Events only then).
async fn observe(ctx: &Context, home: &Home, workers: &[Worker], jobs: Vec<Job>, run: &Run) -> Vec<Observed> {
    let current = run.number.to_string();
    let mut pods = Caches::of_home(&ctx.caches.pods, home, names::WORKER);
    pods.retain(|pod| pod.labels().get(names::RUN) == Some(&current));
    let mut observed = Vec::with_capacity(workers.len());
    for worker in workers {
        let job = jobs.iter().find(|j| j.labels().get(names::WORKER) == Some(&worker.name)).cloned();
        let unfinished = !status::job_phase(job.as_ref()).is_finished();
        let own: Vec<&Pod> = pods.iter().filter(|pod| pod.labels().get(names::WORKER) == Some(&worker.name)).collect();
        // The node a worker is pinned to, or the one its running pod is
        // bound to, while the worker has work left.
        let node_trouble = unfinished
            .then(|| {
                let bound = own
                    .iter()
                    .filter(|pod| !is_finished(pod))
                    .filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref());
                worker.node.as_deref().into_iter().chain(bound).find_map(|node| ctx.caches.node_trouble(node))
            })
            .flatten();
        let pods_refused = match &job {
            Some(job) if unfinished && own.is_empty() && waited_for_pods(job) => {
                let uid = job.uid().unwrap_or_default();
                match ctx.caches.pods_refused.get(&uid) {
                    Some(known) => known,
                    None => {
                        let why = pods_refused(ctx, job).await;
                        ctx.caches.pods_refused.remember(&uid, why.clone());
                        why
                    }
                }
            }
            _ => None,
        };
        let (report, summaries) = status::pod_report(&pods, &worker.name);
        observed.push(Observed { worker: worker.clone(), job, report, summaries, node_trouble, pods_refused });
    }
    observed
}

/// Whether `job` has existed long enough without pods to ask why.
fn waited_for_pods(job: &Job) -> bool {
    let Some(created) = job.metadata.creation_timestamp.as_ref() else { return false };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(created.0);
    age.as_secs_f64() >= PODS_PATIENCE.as_secs_f64()
}

/// The Job controller's last word on why `job` has no pods (its latest
/// `FailedCreate` Event), if it said one.
async fn pods_refused(ctx: &Context, job: &Job) -> Option<String> {
    use k8s_openapi::api::core::v1::Event;
    let namespace = job.namespace()?;
    let uid = job.uid()?;
    let events: Api<Event> = Api::namespaced(ctx.client.clone(), &namespace);
    let selector = format!("involvedObject.uid={uid},reason=FailedCreate");
    let listed = match events.list(&kube::api::ListParams::default().fields(&selector)).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::debug!(%error, job = %job.name_any(), "cannot read the Job's Events");
            return None;
        }
    };
    listed
        .items
        .into_iter()
        .max_by_key(|event| event.last_timestamp.as_ref().or(event.first_timestamp.as_ref()).map(|t| t.0))
        .and_then(|event| event.message)
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
                .find(|job| job.labels().get(names::WORKER) == Some(&w.name))
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
