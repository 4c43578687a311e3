//! The first stage of a reconciliation: what a DataStage means, whether
//! the admin allows what it asks ([`crate::admission`]), and which nodes
//! its workers go to. Whatever stops it here is written as a condition and
//! no Job is made.

use std::time::Duration;

use ferry_crds::plan::{Direction, Plan, Volume};
use ferry_crds::{DataStage, Phase, ReclaimPolicy};
use kube::ResourceExt as _;

use super::error::Error;
use crate::admission::{Facts, Invalid};
use crate::context::Context;
use crate::schedule::Schedule;
use crate::status::reasons;
use crate::worker::{Worker, plan_workers};

/// Why a reconciliation stops before any Job: the status to write and
/// when to look again.
pub(super) struct Blocked {
    pub phase: Phase,
    pub failed: bool,
    pub reason: &'static str,
    pub message: String,
    pub retry: Option<Duration>,
}

impl From<Invalid> for Blocked {
    fn from(invalid: Invalid) -> Self {
        Blocked { phase: Phase::Failed, failed: true, reason: invalid.reason, message: invalid.message, retry: None }
    }
}

impl Blocked {
    /// A wait for something someone can fix (a missing Secret, a namespace
    /// the chart was not told of): looked at again in 5 s.
    pub fn waiting(reason: &'static str, message: String) -> Self {
        Blocked { phase: Phase::Pending, failed: false, reason, message, retry: Some(Duration::from_secs(5)) }
    }
}

/// Everything a run needs that can stop it, but what the DataStage's
/// namespace holds (checked only when workers start): the plan, the
/// schedule, and the workers the cluster's nodes allow.
pub(super) fn prepare<'a>(
    ds: &'a DataStage,
    ctx: &Context,
) -> Result<(Plan<'a>, Option<Schedule>, Vec<Worker>), Blocked> {
    let plan = match ds.spec.plan() {
        Ok(plan) => plan,
        Err(incomplete) => {
            return Err(Invalid { reason: reasons::INCOMPLETE_SPEC, message: incomplete.to_string() }.into());
        }
    };
    let node_cache = node_cache(&plan, ctx);
    // The namespace's labels are read when workers start (a request); here
    // a NodeCache's selector is not judged.
    let facts = Facts { node_cache: node_cache.as_deref(), namespace_labels: None };
    let schedule = crate::admission::validate(ds, &plan, &ctx.config, &facts)?;
    let workers = place(ds, &plan, ctx)?;
    Ok((plan, schedule, workers))
}

/// The NodeCache `plan` names, as the cache shows it.
pub(super) fn node_cache(plan: &Plan<'_>, ctx: &Context) -> Option<std::sync::Arc<ferry_crds::NodeCache>> {
    let Volume::NodeCache(name) = plan.volume else { return None };
    ctx.caches.node_caches.get(&kube::runtime::reflector::ObjectRef::new(name))
}

/// Whether the NodeCache `plan` names admits `ds`'s namespace, by the
/// namespace's labels (read now); `Ok(None)` when it does, or names none.
pub(super) async fn node_cache_refusal(
    ds: &DataStage,
    plan: &Plan<'_>,
    ctx: &Context,
) -> Result<Option<Blocked>, Error> {
    let Some(cache) = node_cache(plan, ctx) else { return Ok(None) };
    if cache.spec.namespace_selector.is_none() {
        return Ok(None);
    }
    let namespace = ds.namespace().unwrap_or_default();
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(ctx.client.clone());
    let labels = namespaces.get_metadata(&namespace).await?.metadata.labels.unwrap_or_default();
    let facts = Facts { node_cache: Some(&cache), namespace_labels: Some(&labels) };
    Ok(crate::admission::validate(ds, plan, &ctx.config, &facts).err().map(Blocked::from))
}

/// The workers of the DataStage: one per matching node for a node-local
/// volume (exactly one for a push), one for a claim.
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
                "a push from a node-local volume reads one node's directory, but spec.placement matches {} nodes ({}); narrow it to one, e.g. with nodeSelector kubernetes.io/hostname",
                matching.len(),
                matching.join(", ")
            ),
        });
    }
    Ok(plan_workers(plan, matching))
}

/// The credentials Secret of a claim's workers (which read it themselves,
/// in the DataStage's namespace), when the spec names one that does not
/// exist. Workers elsewhere get theirs delivered ([`crate::delivery`]).
pub(super) async fn missing_secret(ds: &DataStage, plan: &Plan<'_>, ctx: &Context) -> Result<Option<Blocked>, Error> {
    // A web identity has no Secret: a refused token shows up as the
    // workers' AccessDenied.
    let Some(secret) = plan.store.credentials.as_ref().and_then(|c| c.name.as_ref()) else { return Ok(None) };
    let namespace = ds.namespace().unwrap_or_default();
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> = kube::Api::namespaced(ctx.client.clone(), &namespace);
    // The check is a courtesy, not a gate: where the operator may not read
    // Secrets it goes ahead, and a missing Secret shows up as the worker
    // pod's failure instead.
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
    let keys = crate::delivery::credential_keys(plan.location.scheme).join(", ");
    Ok(Some(Blocked::waiting(
        reasons::SECRET_NOT_FOUND,
        format!("Secret '{secret}' (spec credentials) does not exist in namespace {namespace}; create it with {keys}"),
    )))
}

/// The CA bundle of a claim's workers, when the spec names a ConfigMap or
/// key that does not exist: the worker pods would wait for the volume with
/// no word in the DataStage's status. Like the Secret check, a courtesy
/// where the operator may read ConfigMaps.
pub(super) async fn missing_ca_bundle(
    ds: &DataStage,
    plan: &Plan<'_>,
    ctx: &Context,
) -> Result<Option<Blocked>, Error> {
    let Some(reference) = &plan.store.ca_bundle else { return Ok(None) };
    let namespace = ds.namespace().unwrap_or_default();
    let config_maps: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(ctx.client.clone(), &namespace);
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
    Ok(Some(Blocked::waiting(
        reasons::CA_BUNDLE_NOT_FOUND,
        format!("{problem}; create it with the PEM certificates of the CA that signed the store's certificate"),
    )))
}

/// Whether deleting this DataStage must remove staged data: a pull into a
/// volume with `reclaimPolicy: Delete`. A push's volume is the user's source
/// and is never cleaned.
pub fn needs_cleanup(ds: &DataStage) -> bool {
    ds.spec.reclaim_policy == Some(ReclaimPolicy::Delete)
        && ds.spec.plan().is_ok_and(|plan| plan.direction == Direction::Pull)
}
