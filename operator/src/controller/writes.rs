//! What a reconciliation writes: the status (server-side applied, only
//! apiVersion, kind and status, and only when it changes something), the
//! finalizer, the Events of transitions, and the Jobs it creates and
//! deletes, all as the one [`FIELD_MANAGER`].

use ferry_crds::{DataStage, DataStageStatus, Phase, names};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource as _, ResourceExt as _};

use super::error::Error;
use super::prepare::Blocked;
use crate::context::Context;
use crate::status::{self, reasons};

/// The one field manager of everything the operator applies.
pub const FIELD_MANAGER: &str = names::OPERATOR_MANAGER;

/// The time a condition or an Event is stamped with.
pub(super) fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Records why the DataStage cannot proceed, and when to look again.
pub(super) async fn write_blocked(ds: &DataStage, ctx: &Context, blocked: Blocked) -> Result<Action, Error> {
    let status = status::blocked(ds, blocked.phase, blocked.failed, blocked.reason, &blocked.message, &now());
    update_status(ds, ctx, status).await?;
    Ok(blocked.retry.map_or_else(Action::await_change, Action::requeue))
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
pub(super) async fn update_status(ds: &DataStage, ctx: &Context, status: DataStageStatus) -> Result<(), Error> {
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
                reasons::NAMESPACE_NOT_ENABLED,
                reasons::SERVICE_ACCOUNT_NOT_FOUND,
                reasons::PODS_NOT_CREATED,
                reasons::CLAIM_NAME_TAKEN,
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
pub(super) async fn publish(ctx: &Context, ds: &DataStage, kind: EventType, reason: &str, note: String, action: &str) {
    let event =
        Event { type_: kind, reason: reason.to_owned(), note: Some(note), action: action.to_owned(), secondary: None };
    if let Err(error) = ctx.events.publish(&event, &ds.object_ref(&())).await {
        tracing::warn!(%error, "could not record an event");
    }
}

/// Adds or removes the operator's finalizer. Server-side apply treats
/// finalizers as a set, so the operator's entry is its own and other
/// controllers' finalizers are untouched.
pub(super) async fn set_finalizer(ds: &DataStage, ctx: &Context, present: bool) -> Result<(), Error> {
    let api: Api<DataStage> = Api::namespaced(ctx.client.clone(), &ds.namespace().unwrap_or_default());
    if !present {
        // Removed by position, whoever set it: an apply that leaves it out
        // releases only this manager's claim, and a finalizer another
        // manager also applied (an earlier release's, a manifest's) would
        // hold the DataStage for ever. The test guards against a list
        // that changed since the cache saw it.
        let Some(at) = ds.finalizers().iter().position(|f| f == ferry_crds::names::CLEANUP_FINALIZER) else {
            return Ok(());
        };
        let path = format!("/metadata/finalizers/{at}");
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "test", "path": path, "value": ferry_crds::names::CLEANUP_FINALIZER},
            {"op": "remove", "path": path},
        ]))
        .expect("a JSON patch");
        api.patch(&ds.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
        return Ok(());
    }
    let finalizers = vec![ferry_crds::names::CLEANUP_FINALIZER.to_owned()];
    let patch = MetadataPatch {
        api_version: DataStage::api_version(&()),
        kind: DataStage::kind(&()),
        metadata: ObjectMeta { name: Some(ds.name_any()), finalizers: Some(finalizers), ..ObjectMeta::default() },
    };
    api.patch(&ds.name_any(), &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Creates a worker's Job, and says whether this call created it. The cache
/// may not show a Job created a moment ago (its watch event can trail the
/// DataStage's), so one that already exists is taken as it is, if it was
/// made for the same DataStage (its labels say so): one Job per worker and
/// run, one Event.
pub(super) async fn create_job(jobs: &Api<Job>, job: &Job) -> Result<(Job, bool), Error> {
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match jobs.create(&params, job).await {
        Ok(created) => Ok((created, true)),
        Err(kube::Error::Api(status)) if status.is_already_exists() => {
            let found = jobs.get(&job.name_any()).await?;
            let uid = |job: &Job| job.labels().get(names::DATASTAGE_UID).cloned();
            if uid(&found) != uid(job) {
                return Err(Error::Taken(format!("Job {}", job.name_any())));
            }
            Ok((found, false))
        }
        Err(error) => Err(error.into()),
    }
}

/// Deletes Job `name` and, in the background, its pods. Returns whether this
/// call deleted it: false when it was gone already.
pub(super) async fn delete_job(api: &Api<Job>, name: &str) -> Result<bool, Error> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(error) => Err(error.into()),
    }
}
