//! The deletion of a DataStage with `reclaimPolicy: Delete` (pulls only):
//! it carries a finalizer; when it is deleted, its workers are stopped
//! first (so nothing writes any more), then one clean-up Job per place runs
//! `ferry-stager clean` on the same volume and node, and only when all
//! succeeded is the finalizer removed.

use std::time::Duration;

use ferry_crds::names::{CLEANUP, CLEANUP_FINALIZER, WORKER};
use ferry_crds::{DataStage, Phase};
use k8s_openapi::api::batch::v1::Job;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use super::carry::settle;
use super::error::Error;
use super::evicting::start_cleanup;
use super::writes::{delete_job, now, publish, set_finalizer};
use crate::cache::Caches;
use crate::context::Context;
use crate::jobs::build_cleanup_job;
use crate::status;
use crate::status::reasons;
use crate::worker::Worker;

pub(super) fn has_finalizer(ds: &DataStage) -> bool {
    ds.finalizers().iter().any(|f| f == CLEANUP_FINALIZER)
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
pub(super) async fn clean_up(ds: &DataStage, ctx: &Context) -> Result<Action, Error> {
    let Ok(plan) = ds.spec.plan() else {
        // Nothing was ever staged from a spec without a volume.
        set_finalizer(ds, ctx, false).await?;
        return Ok(Action::await_change());
    };
    // A DataStage this release refuses (a hostPath from before, in a
    // namespace that may no longer name one) gets no privileged clean-up
    // Job on the path it names: its data stays for the admin to remove.
    let namespace = ds.namespace().unwrap_or_default();
    if let Some(refused) = crate::admission::host_path_refusal(&plan, &namespace, &ctx.config) {
        let message = format!(
            "kept the staged data, not cleaned: {} (the cluster admin can remove it from the nodes)",
            refused.message
        );
        publish(ctx, ds, EventType::Warning, reasons::CLEANUP_REFUSED, message, "Delete").await;
        set_finalizer(ds, ctx, false).await?;
        return Ok(Action::await_change());
    }
    let (home, defaults) = settle(ds, ctx, &plan).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);

    // 1. Nothing may still write into the directories being cleaned.
    let running = Caches::of_home(&ctx.caches.jobs, &home, WORKER);
    for job in running.iter().filter(|j| j.metadata.deletion_timestamp.is_none()) {
        match jobs.delete(&job.name_any(), &DeleteParams::foreground()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    if !running.is_empty() || !Caches::of_home(&ctx.caches.pods, &home, WORKER).is_empty() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    // 2. One clean-up Job per place data was staged.
    let nodes: Vec<String> =
        if plan.per_node() { ctx.caches.nodes.state().iter().map(|n| n.name_any()).collect() } else { Vec::new() };
    let targets = cleanup_targets(ds, &nodes);
    let cleanups = Caches::of_home(&ctx.caches.jobs, &home, CLEANUP);
    let mut done = 0;
    let mut confirmed = false;
    for target in &targets {
        let job = build_cleanup_job(ds, &plan, target, &defaults);
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
