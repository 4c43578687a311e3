//! The DataStage controller. `reconcile` is a pipeline, a file per stage:
//!
//! * [`prepare`]: plan → validate ([`crate::admission`]) → place: what a
//!   run needs that can stop it before any Job.
//! * [`carry`]: choose the run (a spec change, a schedule, room found),
//!   start the workers it lacks in their home ([`crate::home`]), observe
//!   them and fold their reports into the status.
//! * [`claims`]: the volume and claim through which pods read node-local
//!   data, and the node labels that place those pods ([`crate::volumes`]).
//! * [`versioning`] and [`evicting`]: the switch and prune Jobs of
//!   versioned pulls, and the clean-up of evicted copies.
//! * [`cleanup`]: the deletion of a DataStage whose data goes with it.
//! * [`writes`]: the status and finalizer applies, and Events.
//!
//! Invalid specs wait for a change; missing Secrets and nodes are retried
//! so that fixing the cause recovers without re-applying; API errors
//! requeue with jittered backoff. Nodes are watched, so a node that joins
//! or starts matching a placement is staged without a retry loop.
//!
//! With fanout PeerToPeer the DataStage's peer Secret is created before its
//! first Jobs. A worker's Job is created once and never applied again, so
//! a node that joins later gets its own Job with the peer group as it is
//! then, and running workers are left alone.

mod carry;
mod claims;
mod cleanup;
mod error;
mod evicting;
mod prepare;
mod versioning;
mod writes;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_crds::{DataStage, names};
use futures::StreamExt as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};

pub use carry::{departed, jobs_on_deleted_nodes, workers_to_start};
pub use cleanup::cleanup_targets;
pub use error::Error;
pub use prepare::{needs_cleanup, per_node_workers};
pub use writes::{FIELD_MANAGER, applies_nothing};

use crate::cache::CacheWriters;
use crate::context::Context;
use crate::home::DataStageKey;
use crate::watch_backoff::WatchBackoff;

/// One reconciliation of one DataStage.
async fn reconcile(ds: Arc<DataStage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    if let Some(waited) = ctx.arrivals.picked_up(&ObjectRef::from_obj(&*ds)) {
        ctx.metrics.queue_waited(waited);
    }
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

async fn reconcile_inner(ds: &DataStage, ctx: &Context) -> Result<Action, Error> {
    ctx.caches.ready().await;
    let namespace = ds.namespace().unwrap_or_default();
    let name = ds.name_any();
    if ds.metadata.deletion_timestamp.is_some() {
        ctx.metrics.observe(&namespace, &name, None);
        return if cleanup::has_finalizer(ds) { cleanup::clean_up(ds, ctx).await } else { Ok(Action::await_change()) };
    }
    let wants_finalizer = needs_cleanup(ds);
    if wants_finalizer != cleanup::has_finalizer(ds) {
        writes::set_finalizer(ds, ctx, wants_finalizer).await?;
    }
    match prepare::prepare(ds, ctx) {
        Ok((plan, schedule, workers)) => carry::carry_out(ds, ctx, &plan, schedule.as_ref(), &workers).await,
        Err(blocked) => {
            // A placement that matches nothing because its node was deleted
            // leaves that node's Job behind; so can any other block. And a
            // DataStage from before the workers' namespace that this release
            // refuses (a hostPath outside the admin's namespaces) must not
            // keep its old workers writing the node from its namespace.
            if let Some(home) = ctx.home(ds) {
                let mut jobs = crate::cache::Caches::of_home(&ctx.caches.jobs, &home, names::WORKER);
                carry::retire_jobs_of_deleted_nodes(ds, ctx, &home, &mut jobs).await?;
                carry::retire_strays(ds, ctx, &home).await?;
            }
            writes::write_blocked(ds, ctx, blocked).await
        }
    }
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

/// DataStages reconciled at once. kube's default is no limit: a burst of
/// 1,000 DataStages created together then ran 1,000 reconciles side by
/// side, each holding its requests' responses and connection buffers, and
/// the operator's memory peaked at 136 MiB. A reconcile waits mostly on the
/// API server, which serves a few dozen requests at a time anyway, so a
/// bounded number keeps the throughput and bounds the memory.
const RECONCILES_AT_ONCE: u16 = 16;

/// The namespaces Jobs and Pods are watched in: every namespace, or the
/// watched one and the workers' (`None`: all).
pub fn watch_scopes(config: &crate::config::OperatorConfig) -> Vec<Option<String>> {
    match &config.watch_namespace {
        None => vec![None],
        Some(watched) => {
            let mut scopes = vec![Some(watched.clone())];
            let workers = config.workers_namespace().to_owned();
            if &workers != watched {
                scopes.push(Some(workers));
            }
            scopes
        }
    }
}

/// The DataStage a Job or Pod of Ferry's belongs to, by its labels.
fn owner_of<K: kube::Resource>(object: &K) -> Option<ObjectRef<DataStage>> {
    let meta = object.meta();
    let key = DataStageKey::from_labels(meta.namespace.as_deref(), meta.labels.as_ref()?)?;
    Some(ObjectRef::new(&key.name).within(&key.namespace))
}

/// Runs the controller until the process is stopped. `writers` fill the
/// context's caches from the same watches that wake the DataStages.
pub async fn run(ctx: Arc<Context>, writers: CacheWriters) {
    let client = ctx.client.clone();
    let datastages = match &ctx.config.watch_namespace {
        Some(ns) => Api::<DataStage>::namespaced(client.clone(), ns),
        None => Api::<DataStage>::all(client.clone()),
    };
    let watches = watcher::Config::default().timeout(WATCH_SECONDS);
    let sweeping = Arc::clone(&ctx);
    let arriving = Arc::clone(&ctx);
    let datastage_changes = watcher(datastages, watches.clone())
        .map(move |event| {
            // A deleted DataStage's objects outside its namespace go at once.
            if let Ok(watcher::Event::Delete(ds)) = &event {
                if let Some(uid) = ds.uid() {
                    sweeping.forget(&uid);
                }
                sweeping.arrivals.forget(&ObjectRef::from_obj(ds));
                sweeping.sweeps.notify_one();
            }
            event
        })
        .modify(crate::cache::slim_datastage)
        .backoff(WatchBackoff::default())
        .reflect(writers.datastages)
        .applied_objects()
        .inspect(move |change| {
            if let Ok(ds) = change {
                arriving.arrivals.arrived(ds);
            }
        });
    // The controller backs off again on every error its watches pass on,
    // and while it waits it reads none of them: kube's default there (up
    // to 30 s) stopped every trigger at once.
    let controller = Controller::for_stream(datastage_changes, ctx.caches.datastages.clone())
        .with_config(controller::Config::default().concurrency(RECONCILES_AT_ONCE))
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
    // NodeCaches wake the DataStages that name them: one that was missing
    // may exist now.
    let named = controller.store();
    let node_cache_changes = watcher(Api::<ferry_crds::NodeCache>::all(client.clone()), watches.clone())
        .backoff(WatchBackoff::default())
        .reflect(writers.node_caches)
        .filter_map(|event| async move {
            match event {
                Ok(watcher::Event::Apply(cache) | watcher::Event::Delete(cache)) => Some(Ok(cache)),
                Ok(_) => None,
                Err(error) => {
                    tracing::debug!(%error, "NodeCache watch (is the NodeCache CRD installed?)");
                    None
                }
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
    let owned = watches.clone().labels(names::DATASTAGE);
    let scopes = watch_scopes(&ctx.config);
    let api = |scope: &Option<String>| match scope {
        Some(ns) => (Api::<Job>::namespaced(client.clone(), ns), Api::<Pod>::namespaced(client.clone(), ns)),
        None => (Api::<Job>::all(client.clone()), Api::<Pod>::all(client.clone())),
    };
    let mut job_streams = Vec::new();
    let mut pod_streams = Vec::new();
    for ((scope, job_writer), pod_writer) in scopes.iter().zip(writers.jobs).zip(writers.pods) {
        let (jobs, pods) = api(scope);
        job_streams.push(
            watcher(jobs, owned.clone())
                .modify(crate::cache::slim_job)
                .backoff(WatchBackoff::default())
                .reflect(job_writer)
                .touched_objects()
                .boxed(),
        );
        // A pod's termination message carries its worker's summary.
        pod_streams.push(
            watcher(pods, owned.clone())
                .modify(crate::cache::slim_pod)
                .backoff(WatchBackoff::default())
                .reflect(pod_writer)
                .touched_objects()
                .boxed(),
        );
    }
    let job_changes = futures::stream::select_all(job_streams);
    let pod_changes = futures::stream::select_all(pod_streams);
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
        // Jobs in the workers' namespace cannot be owned by a DataStage
        // (owners are of the same namespace): their labels say whose they are.
        .watches_stream(job_changes, |job| owner_of(&job))
        .watches_stream(pod_changes, |pod| {
            // A training pod names its DataStage by the same label.
            owner_of(&pod).or_else(|| {
                let name = pod.labels().get(names::DATASTAGE)?;
                Some(ObjectRef::<DataStage>::new(name).within(&pod.namespace()?))
            })
        })
        .watches_stream(node_cache_changes, move |cache| {
            let cache = cache.name_any();
            named
                .state()
                .into_iter()
                .filter(|ds| {
                    ds.spec.plan().is_ok_and(|plan| plan.volume == ferry_crds::plan::Volume::NodeCache(&cache))
                })
                .map(|ds| ObjectRef::from_obj(&*ds))
                .collect::<Vec<_>>()
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
                woken.extend(owner_of(&*pod));
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
    tokio::join!(
        reconciling,
        budget_changes,
        crate::budgets::run(Arc::clone(&ctx)),
        crate::quotas::run(Arc::clone(&ctx)),
        crate::sweeper::run(ctx)
    );
}
