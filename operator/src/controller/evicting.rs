//! Eviction (`spec.capacity.eviction: WhenSpaceIsNeeded`): where pods use
//! a DataStage (`lastUsedTime`), the copies that waiting pulls chose to
//! evict ([`crate::eviction`]), and the clean-up Job that removes each.

use std::time::Duration;

use ferry_crds::plan::Plan;
use ferry_crds::{DataStage, DataStageStatus, Phase, names};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use super::error::Error;
use super::writes::FIELD_MANAGER;
use super::writes::{delete_job, publish};
use crate::cache::Caches;
use crate::context::Context;
use crate::home::Home;
use crate::jobs::{WorkerDefaults, build_cleanup_job};
use crate::status::{self, reasons};
use crate::worker::Worker;

/// Whether `ds` may be evicted or has been: only then does its
/// reconciliation read where pods use it.
pub(super) fn evicts_or_was_evicted(ds: &DataStage, ctx: &Context, plan: &Plan<'_>) -> bool {
    let cache_default = super::prepare::node_cache(plan, ctx).and_then(|cache| cache.spec.eviction);
    crate::eviction::evictable(ds, cache_default)
        || ds.status.iter().flat_map(|s| &s.workers).any(|w| w.evicted.is_some())
}

/// Where pods use DataStages, from the pod cache, and the NodeCaches'
/// eviction policies.
pub(super) fn in_use(ctx: &Context) -> crate::eviction::InUse {
    let pods = ctx.caches.pods.state();
    let caches = ctx.caches.node_caches.state();
    crate::eviction::InUse::of(pods.iter().map(|pod| &**pod)).with_node_caches(caches.iter().map(|c| &**c))
}

/// What eviction leaves to do once the status that records it is written.
#[derive(Default)]
pub(super) struct Evicting {
    /// Clean-up Jobs to create: (node, Job).
    create: Vec<(String, Job)>,
    /// Clean-up Jobs of copies now removed, to delete.
    delete: Vec<String>,
    /// An eviction is under way.
    pub pending: bool,
    /// A pod uses the data somewhere.
    pub in_use: bool,
    /// When the next copy comes to its `idleSeconds`.
    pub next_idle: Option<Duration>,
}

/// Records in `status` where pods use `ds` (`lastUsedTime`), marks the
/// copies waiting pulls chose to evict, and follows each eviction's
/// clean-up Job: what to create or delete once `status` is written.
pub(super) async fn evict(
    ds: &DataStage,
    ctx: &Context,
    (plan, home, defaults): (&Plan<'_>, &Home, &WorkerDefaults),
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
    let cleanups = Caches::of_home(&ctx.caches.jobs, home, names::CLEANUP);
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
        let job = build_cleanup_job(ds, plan, &target, defaults);
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
    pub(super) async fn carry_out(&self, ds: &DataStage, ctx: &Context, home: &Home) -> Result<(), Error> {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);
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
pub(super) async fn start_cleanup(
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
