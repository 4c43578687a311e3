//! What lets pods read node-local data and what keeps workers' tokens
//! fresh, applied from the controller: the PersistentVolume and claim of a
//! pull onto a node-local volume ([`crate::volumes`]), made before its
//! first workers start; the node labels that say which nodes hold a copy,
//! kept in step with the status; and the web identity token of workers in
//! the workers' namespace, renewed at half its lifetime while they run.

use std::time::{Duration, SystemTime};

use ferry_crds::plan::Plan;
use ferry_crds::{DataStage, DataStageStatus, Phase};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use super::error::Error;
use super::prepare::{Blocked, node_cache};
use super::writes::FIELD_MANAGER;
use crate::context::Context;
use crate::home::{DataStageKey, Home};
use crate::jobs::data_layout;
use crate::status::reasons;
use crate::volumes::{self, claim_is_ours, needs_rebinding, reads_through_volume};

/// Makes the volume and claim through which pods read `ds`'s data, when
/// they read it through one; or says why it cannot (a claim of that name
/// that is not Ferry's, a namespace the operator may not make claims in).
pub(super) async fn make_volume(ds: &DataStage, ctx: &Context, plan: &Plan<'_>) -> Result<Option<Blocked>, Error> {
    if !reads_through_volume(plan) {
        return Ok(None);
    }
    let mut defaults = ctx.config.worker_defaults();
    defaults.node_cache = node_cache(plan, ctx).map(|cache| cache.spec.clone());
    let layout = data_layout(ds, plan, &defaults);
    let Some(volume) = volumes::persistent_volume(ds, plan, &layout) else { return Ok(None) };
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    let name = volume.name_any();
    let persistent_volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let found = persistent_volumes.get_opt(&name).await?;
    match &found {
        None => match persistent_volumes.create(&params, &volume).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_already_exists() => {}
            Err(error) => return Err(error.into()),
        },
        // Its claim was deleted and made again: free the volume for it.
        Some(found) if needs_rebinding(Some(found)) => {
            let patch = json!({"spec": {"claimRef": {"uid": null, "resourceVersion": null}}});
            persistent_volumes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        Some(_) => {}
    }
    let namespace = ds.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let claim = volumes::claim(ds);
    let claim_name = claim.name_any();
    match claims.get_opt(&claim_name).await {
        Ok(Some(found)) if claim_is_ours(ds, &found) => Ok(None),
        Ok(Some(_)) => Ok(Some(Blocked::waiting(
            reasons::CLAIM_NAME_TAKEN,
            format!(
                "PersistentVolumeClaim {claim_name} in namespace {namespace} was not made by Ferry for this DataStage; pods read its data through a claim of that name: delete or rename the claim"
            ),
        ))),
        Ok(None) => match claims.create(&params, &claim).await {
            Ok(_) => Ok(None),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(None),
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let refused = crate::delivery::not_permitted("create PersistentVolumeClaim", &claim_name, &namespace);
                Ok(Some(Blocked::waiting(refused.reason, refused.message)))
            }
            Err(error) => Err(error.into()),
        },
        Err(kube::Error::Api(status)) if status.code == 403 => {
            let refused = crate::delivery::not_permitted("read PersistentVolumeClaim", &claim_name, &namespace);
            Ok(Some(Blocked::waiting(refused.reason, refused.message)))
        }
        Err(error) => Err(error.into()),
    }
}

/// Sets `ds`'s node label on the nodes that hold a copy by `status` and
/// removes it from the others (a patch per node that changes).
pub(super) async fn label_nodes(ds: &DataStage, ctx: &Context, status: &DataStageStatus) -> Result<(), Error> {
    let Ok(plan) = ds.spec.plan() else { return Ok(()) };
    if !reads_through_volume(&plan) {
        return Ok(());
    }
    let key = DataStageKey::of(ds);
    let holders = volumes::holders(ds, status);
    let nodes = ctx.caches.nodes.state();
    let named: Vec<(String, Option<&std::collections::BTreeMap<String, String>>)> =
        nodes.iter().map(|node| (node.name_any(), node.metadata.labels.as_ref())).collect();
    let changes = volumes::label_changes(&key, &holders, named.iter().map(|(name, labels)| (name.as_str(), *labels)));
    let (label, _) = volumes::node_label(&key);
    let api: Api<Node> = Api::all(ctx.client.clone());
    for (node, value) in changes {
        // Set a moment ago and not in the Node cache yet: not sent again.
        let written = format!("{node}\n{label}");
        if ctx.caches.node_labels.holds(&written, &value) {
            continue;
        }
        let patch = json!({"metadata": {"labels": {label.as_str(): value}}});
        match api.patch(&node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => ctx.caches.node_labels.remember(&written, value),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Renews the web identity token of `ds`'s workers elsewhere while a run
/// goes on, when it is due; returns how soon to look again for it.
pub(super) async fn renew_token(
    ds: &DataStage,
    ctx: &Context,
    plan: &Plan<'_>,
    home: &Home,
    status: &DataStageStatus,
) -> Result<Option<Duration>, Error> {
    let Some(identity) = plan.store.credentials.as_ref().and_then(|c| c.web_identity.as_ref()) else {
        return Ok(None);
    };
    let running = matches!(status.phase, Some(Phase::Pending | Phase::Running));
    if !home.elsewhere() || !running {
        return Ok(None);
    }
    let uid = ds.uid().unwrap_or_default();
    let now = SystemTime::now();
    let due = ctx.tokens.lock().expect("tokens").get(&uid).copied();
    let due = match due {
        Some(due) if due > now => due,
        _ => match crate::delivery::request_token(&ctx.client, ds, identity, home).await? {
            Ok(renew) => {
                let renew = renew.unwrap_or(now + crate::delivery::token_lifetime(identity) / 2);
                ctx.tokens.lock().expect("tokens").insert(uid, renew);
                renew
            }
            // The account went: the workers' token runs out and they say so.
            Err(undelivered) => {
                tracing::warn!(reason = undelivered.reason, message = %undelivered.message, "cannot renew a web identity token");
                return Ok(Some(Duration::from_secs(30)));
            }
        },
    };
    Ok(Some(due.duration_since(now).unwrap_or_default().max(Duration::from_secs(1))))
}
