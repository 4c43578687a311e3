//! What a DataStage spec means, decided once: which way data moves, which
//! store and which volume, how many worker pods share each place, and
//! whether the nodes feed each other. The
//! operator's Job builders and status aggregation, and the stager's `wait`,
//! read a [`Plan`] instead of asking the spec "is this a push? is this a
//! hostPath?" each on their own.
//!
//! Not here: which nodes match (that needs the cluster's nodes; see the
//! operator's placement module).

use ferry_contract::{ObjectLocation, location::LocationError};

use crate::{DataStageSpec, Fanout, Location};

/// Which way data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Object storage → volume.
    Pull,
    /// Volume → object storage.
    Push,
}

/// The volume side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Volume<'a> {
    /// A directory Ferry lays out on each node below the named NodeCache's
    /// root: node-local, so every matching node gets its own workers (a
    /// pull) or one node is read (a push).
    NodeCache(&'a str),
    /// A directory on each node that the cluster admin named: node-local,
    /// as a NodeCache's.
    HostPath(&'a str),
    /// A directory in a claim: shared, so one set of workers serves it.
    Claim {
        /// The claim's name.
        name: &'a str,
        /// The directory within it.
        sub_path: Option<&'a str>,
    },
}

/// One interpretation of a spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan<'a> {
    /// Which way data moves.
    pub direction: Direction,
    /// The object-storage side (its `uri`, endpoint, credentials).
    pub store: &'a Location,
    /// The store's URI, as the spec spells it.
    pub uri: &'a str,
    /// The store's URI, parsed: its scheme, bucket and prefix.
    pub location: ObjectLocation,
    /// The volume side.
    pub volume: Volume<'a>,
    /// Worker pods per place (per node for a hostPath, for the claim
    /// otherwise), each copying one shard.
    pub pods_per_worker: u32,
    /// Whether the workers feed each other: [`Fanout::PeerToPeer`] only
    /// where it can work (a pull onto hostPaths, one pod per node), what
    /// the spec defaults to there; [`Fanout::Direct`] everywhere else.
    pub fanout: Fanout,
}

/// A spec the API server should have refused: only an object written
/// before the schema's rules existed can have one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IncompleteSpec {
    /// A side is missing.
    #[error(
        "the spec does not name one object store and one volume (nodeCache, persistentVolumeClaim or hostPath); fix spec.source and spec.destination"
    )]
    Sides,
    /// The store's URI does not parse.
    #[error("{0}; fix the uri in spec.source or spec.destination")]
    Uri(#[from] LocationError),
}

impl<'a> Plan<'a> {
    /// Whether each node gets its own workers (a NodeCache's directory and
    /// a hostPath are node-local).
    pub fn per_node(&self) -> bool {
        self.volume.node_local()
    }
}

impl Volume<'_> {
    /// Whether the volume is a directory on each node (a NodeCache's or a
    /// hostPath), rather than one claim.
    pub fn node_local(&self) -> bool {
        matches!(self, Volume::NodeCache(_) | Volume::HostPath(_))
    }
}

impl DataStageSpec {
    /// Whether this is a pull that keeps versions (`updateStrategy:
    /// Versioned`): pods mount `DIR/current`, and new versions are switched
    /// to whole.
    pub fn versioned(&self) -> bool {
        self.source.uri.is_some() && self.update_strategy == Some(crate::UpdateStrategy::Versioned)
    }

    /// What this spec means.
    ///
    /// # Errors
    /// [`IncompleteSpec`] when a side is missing.
    pub fn plan(&self) -> Result<Plan<'_>, IncompleteSpec> {
        let (direction, store, volume_side) = if self.source.uri.is_some() {
            (Direction::Pull, &self.source, &self.destination)
        } else {
            (Direction::Push, &self.destination, &self.source)
        };
        let uri = store.uri.as_deref().ok_or(IncompleteSpec::Sides)?;
        let location: ObjectLocation = uri.parse()?;
        let volume = volume_side.volume.as_ref().ok_or(IncompleteSpec::Sides)?;
        let volume = match (&volume.node_cache, &volume.host_path, &volume.persistent_volume_claim) {
            (Some(cache), None, None) => Volume::NodeCache(cache),
            (None, Some(path), None) => Volume::HostPath(path),
            (None, None, Some(claim)) => Volume::Claim { name: &claim.claim_name, sub_path: claim.sub_path.as_deref() },
            _ => return Err(IncompleteSpec::Sides),
        };
        let pods_per_worker = self.workers.unwrap_or(1).clamp(1, 1000) as u32;
        // Peers are nodes that each hold a whole copy and one process each
        // to serve it. Admission refuses PeerToPeer anywhere else; should
        // one get through, Direct still stages the data.
        let peers_possible = direction == Direction::Pull && volume.node_local() && pods_per_worker == 1;
        let fanout = match self.fanout {
            Some(Fanout::PeerToPeer) | None if peers_possible => Fanout::PeerToPeer,
            _ => Fanout::Direct,
        };
        Ok(Plan { direction, store, uri, location, volume, pods_per_worker, fanout })
    }
}

#[cfg(test)]
mod tests {
    use ferry_contract::Scheme;

    use super::*;

    fn spec(value: serde_json::Value) -> DataStageSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_plan_names_direction_store_volume_and_pods() {
        let pull = spec(serde_json::json!({
            "source": {"uri": "gs://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}, "workers": 3}));
        let plan = pull.plan().unwrap();
        assert_eq!((plan.direction, plan.location.scheme, plan.uri), (Direction::Pull, Scheme::Gcs, "gs://b/p"));
        assert_eq!((plan.volume, plan.pods_per_worker), (Volume::HostPath("/mnt/x"), 3));
        assert!(plan.per_node());

        let push = spec(serde_json::json!({
            "source": {"volume": {"persistentVolumeClaim": {"claimName": "c", "subPath": "s"}}},
            "destination": {"uri": "s3://b/p"}}));
        let plan = push.plan().unwrap();
        assert_eq!((plan.direction, plan.location.scheme), (Direction::Push, Scheme::S3));
        assert_eq!(plan.volume, Volume::Claim { name: "c", sub_path: Some("s") });
        assert!(!plan.per_node());
        assert_eq!(plan.pods_per_worker, 1);

        let neither = spec(serde_json::json!({"source": {"uri": "s3://b/p"}, "destination": {}}));
        assert_eq!(neither.plan(), Err(IncompleteSpec::Sides));

        let cache = spec(serde_json::json!({
            "source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}}));
        let plan = cache.plan().unwrap();
        assert_eq!((plan.volume, plan.per_node(), plan.fanout), (Volume::NodeCache("nvme"), true, Fanout::PeerToPeer));
        let both = spec(serde_json::json!({
            "source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme", "hostPath": "/mnt/x"}}}));
        assert_eq!(both.plan(), Err(IncompleteSpec::Sides), "admission refuses two volumes; so does the plan");

        // Admission refuses it; an object from before the rule still gets
        // a message that names the field, not a guessed store.
        let unknown = spec(serde_json::json!({
            "source": {"uri": "ftp://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}}));
        let error = unknown.plan().unwrap_err();
        assert!(matches!(error, IncompleteSpec::Uri(_)), "{error:?}");
        assert!(error.to_string().contains("'ftp://b/p'") && error.to_string().contains("spec.source"), "{error}");
    }

    #[test]
    fn nodes_feed_each_other_by_default_only_on_a_one_pod_per_node_pull_onto_host_paths() {
        let fanout = |value: serde_json::Value| spec(value).plan().unwrap().fanout;
        let host_path = serde_json::json!({"volume": {"hostPath": "/mnt/x"}});
        let claim = serde_json::json!({"volume": {"persistentVolumeClaim": {"claimName": "c"}}});
        let store = serde_json::json!({"uri": "s3://b/p"});
        let pull = serde_json::json!({"source": store, "destination": host_path});
        assert_eq!(fanout(pull.clone()), Fanout::PeerToPeer);
        let mut one_pod = pull.clone();
        one_pod["workers"] = 1.into();
        assert_eq!(fanout(one_pod), Fanout::PeerToPeer);
        let mut direct = pull.clone();
        direct["fanout"] = "Direct".into();
        assert_eq!(fanout(direct), Fanout::Direct);

        let mut sharded = pull;
        sharded["workers"] = 3.into();
        assert_eq!(fanout(sharded.clone()), Fanout::Direct);
        // Admission refuses these; a plan still never asks peers of them.
        sharded["fanout"] = "PeerToPeer".into();
        assert_eq!(fanout(sharded), Fanout::Direct);
        let claim_pull = serde_json::json!({"source": store, "destination": claim, "fanout": "PeerToPeer"});
        assert_eq!(fanout(claim_pull), Fanout::Direct);
        let push = serde_json::json!({"source": host_path, "destination": store});
        assert_eq!(fanout(push), Fanout::Direct);
    }
}
