//! Versioned pulls (`updateStrategy: Versioned`): once a run succeeded with
//! one snapshot, a switch Job per place makes it current; once no pod may
//! read the previous version, a prune Job per place removes it. What to do
//! is decided by [`crate::versions::next_step`]; here its Jobs are made and
//! followed.

use ferry_crds::plan::Plan;
use ferry_crds::{DataStage, DataStageStatus, Phase, names};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt as _};

use super::error::Error;
use super::writes::{create_job, delete_job, publish};
use crate::cache::Caches;
use crate::context::Context;
use crate::home::Home;
use crate::jobs::WorkerDefaults;
use crate::runs::Run;
use crate::status::{self, reasons};
use crate::worker::Worker;

/// Whether a switch or prune Job of `ds` has not finished.
pub(super) fn versions_jobs_at_work(ctx: &Context, home: &Home) -> bool {
    Caches::of_home(&ctx.caches.jobs, home, names::VERSIONS)
        .iter()
        .any(|job| !status::job_phase(Some(job)).is_finished())
}

/// What a versioned pull's next step (see [`crate::versions`]) leaves to
/// do once the status that records it is written.
#[derive(Default)]
pub(super) struct Versioning {
    /// Switch or prune Jobs to create.
    create: Vec<Job>,
    /// Jobs of a step every place completed, to delete.
    delete: Vec<String>,
    /// Events to publish: (type, reason, note).
    events: Vec<(EventType, &'static str, String)>,
    /// A step is under way.
    pub pending: bool,
}

/// Decides the next step of a versioned pull and follows its Jobs, one
/// per place: a switch once the run succeeded with one snapshot (the
/// DataStage stays Running until every place switched, so the gate lets
/// no pod through before), a prune once no pod may read the previous
/// version. Records in `status` what completed.
///
/// Long on purpose: deciding the step, creating its Jobs and reading them
/// back are one exchange per place; the decision itself is pure and lives
/// in [`crate::versions::next_step`].
pub(super) async fn advance_versions(
    ds: &DataStage,
    ctx: &Context,
    (plan, home, defaults): (&Plan<'_>, &Home, &WorkerDefaults),
    workers: &[Worker],
    run: &Run,
    status: &mut DataStageStatus,
    now: &Time,
) -> Versioning {
    use crate::versions::Step;
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
    let existing = Caches::of_home(&ctx.caches.jobs, home, names::VERSIONS);
    // A switch goes to the places not on the version yet; a prune to all.
    let targets: Vec<&Worker> = places
        .iter()
        .copied()
        .filter(|worker| to.as_ref().is_none_or(|to| !crate::versions::place_holds(status, &worker.name, to)))
        .collect();
    let (mut done, mut failed) = (Vec::new(), Vec::new());
    for worker in &targets {
        let Some(job) = crate::versions::build_job(ds, plan, worker, run.number, &step, defaults) else { continue };
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
    pub(super) async fn carry_out(&self, ds: &DataStage, ctx: &Context, home: &Home) -> Result<(), Error> {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &home.namespace);
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
