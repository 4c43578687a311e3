//! What a DataStage leaves outside its namespace when it goes, removed:
//! its anchor in the workers' namespace (and with it, by the garbage
//! collector, its Jobs, their pods and the Secrets made for them), its
//! PersistentVolume, and its label on the nodes that held a copy. No
//! owner reference can cross a namespace, so the operator does this
//! itself: at once when a DataStage's deletion is seen, and every minute
//! for what an operator that was down missed. Its claim, in its own
//! namespace, is owned by it and goes with it.
//!
//! Only what carries the uid of no DataStage the operator knows is
//! removed, and only once the DataStages are listed, so a DataStage that
//! exists never loses its objects to a sweep. The data on the nodes stays
//! (a PersistentVolume of Ferry's is `Retain`): `reclaimPolicy: Delete`
//! removes it before the DataStage goes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferry_crds::names;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use crate::context::Context;

/// How often the sweeper looks, besides when a deletion wakes it.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Sweeps until the process stops.
pub async fn run(ctx: Arc<Context>) {
    ctx.caches.ready().await;
    let _ = ctx.caches.datastages.wait_until_ready().await;
    loop {
        if let Err(error) = sweep(&ctx).await {
            tracing::warn!(%error, "sweeping what deleted DataStages left failed; trying again");
        }
        tokio::select! {
            () = ctx.sweeps.notified() => {}
            () = tokio::time::sleep(SWEEP_EVERY) => {}
        }
    }
}

/// Whether an object labelled with DataStage `namespace` and `uid` was
/// left by a DataStage that is gone: one of the namespaces this operator
/// watches, and a uid none of `live` has.
pub fn left_behind(namespace: Option<&str>, uid: Option<&str>, live: &BTreeSet<String>, watched: Option<&str>) -> bool {
    let ours = match (watched, namespace) {
        (None, _) => true,
        (Some(watched), Some(namespace)) => watched == namespace,
        (Some(_), None) => false,
    };
    ours && uid.is_some_and(|uid| !uid.is_empty() && !live.contains(uid))
}

/// The node labels of Ferry's whose DataStage is gone.
pub fn stale_node_labels(
    labels: &BTreeMap<String, String>,
    live: &BTreeSet<String>,
    watched: Option<&str>,
) -> Vec<String> {
    labels
        .iter()
        .filter(|(key, _)| key.starts_with(names::NODE_DATA_PREFIX))
        .filter(|(key, value)| {
            // With one watched namespace, only labels that name it are this
            // operator's to judge.
            let named = key.trim_start_matches(names::NODE_DATA_PREFIX).split_once('.').map(|(ns, _)| ns);
            let ours = watched.is_none_or(|watched| named == Some(watched));
            ours && !live.contains(*value)
        })
        .map(|(key, _)| key.clone())
        .collect()
}

async fn sweep(ctx: &Context) -> Result<(), kube::Error> {
    // What might be left is read first, the DataStages known second: an
    // anchor, volume or label is made by a reconciliation of a DataStage
    // that the cache held already, so whatever the reads below find was
    // made for a DataStage the snapshot after them holds, unless it went.
    // (Read the other way round, a DataStage created between the two had
    // its new anchor taken for a gone one's, and its Jobs collected.)
    let anchors: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ctx.config.workers_namespace());
    let found_anchors = anchors.list(&ListParams::default().labels(names::ANCHOR)).await?.items;
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let found_volumes = volumes.list(&ListParams::default().labels(names::DATASTAGE_UID)).await?.items;
    let found_nodes = ctx.caches.nodes.state();
    let live: BTreeSet<String> = ctx.caches.datastages.state().iter().filter_map(|ds| ds.uid()).collect();
    let watched = ctx.config.watch_namespace.as_deref();
    let labelled = |object: &kube::core::ObjectMeta| {
        let labels = object.labels.as_ref();
        let namespace = labels.and_then(|l| l.get(names::DATASTAGE_NAMESPACE)).map(String::as_str);
        let uid = labels.and_then(|l| l.get(names::DATASTAGE_UID)).map(String::as_str);
        left_behind(namespace, uid, &live, watched)
    };

    for anchor in found_anchors {
        if labelled(&anchor.metadata) && anchor.metadata.deletion_timestamp.is_none() {
            tracing::info!(anchor = %anchor.name_any(), "removing what a deleted DataStage left in the workers' namespace");
            ignore_gone(anchors.delete(&anchor.name_any(), &DeleteParams::background()).await)?;
        }
    }

    for volume in found_volumes {
        if labelled(&volume.metadata) && volume.metadata.deletion_timestamp.is_none() {
            tracing::info!(volume = %volume.name_any(), "removing a deleted DataStage's PersistentVolume");
            ignore_gone(volumes.delete(&volume.name_any(), &DeleteParams::default()).await)?;
        }
    }

    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for node in found_nodes {
        let stale = stale_node_labels(node.labels(), &live, watched);
        if stale.is_empty() {
            continue;
        }
        let labels: serde_json::Map<String, serde_json::Value> =
            stale.into_iter().map(|key| (key, serde_json::Value::Null)).collect();
        let patch = json!({"metadata": {"labels": labels}});
        ignore_gone(nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await)?;
    }
    Ok(())
}

fn ignore_gone<T>(result: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_no_known_datastage_owns_is_left_behind() {
        let live = BTreeSet::from(["u-1".to_owned()]);
        assert!(!left_behind(Some("a"), Some("u-1"), &live, None), "a DataStage that exists keeps its objects");
        assert!(left_behind(Some("a"), Some("u-0"), &live, None));
        assert!(!left_behind(Some("a"), None, &live, None), "no uid: not Ferry's to judge");
        assert!(!left_behind(Some("b"), Some("u-0"), &live, Some("a")), "another operator's namespace");
        assert!(left_behind(Some("a"), Some("u-0"), &live, Some("a")));

        let labels = BTreeMap::from([
            ("data.ferry.dev/a.kept".to_owned(), "u-1".to_owned()),
            ("data.ferry.dev/a.gone".to_owned(), "u-0".to_owned()),
            ("data.ferry.dev/b.gone".to_owned(), "u-2".to_owned()),
            ("kubernetes.io/hostname".to_owned(), "n".to_owned()),
        ]);
        assert_eq!(stale_node_labels(&labels, &live, None), ["data.ferry.dev/a.gone", "data.ferry.dev/b.gone"]);
        assert_eq!(stale_node_labels(&labels, &live, Some("a")), ["data.ferry.dev/a.gone"]);
    }
}
