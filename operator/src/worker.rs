//! The workers of a DataStage: one per node of a node-local volume, one
//! for a claim. What the Job builders, the peers, the status and the
//! quotas all speak of, in a module of its own that imports none of them.

use ferry_crds::plan::Plan;

/// One worker of a DataStage: one Job (of `spec.workers` pods).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// Its name: the node for per-node workers, `shared` for a claim.
    pub name: String,
    /// The node it is pinned to (per-node workers).
    pub node: Option<String>,
}

impl Worker {
    /// The worker of a node.
    pub fn on_node(node: &str) -> Self {
        Self { name: node.to_owned(), node: Some(node.to_owned()) }
    }

    /// The one worker of a claim.
    pub fn shared() -> Self {
        Self { name: "shared".to_owned(), node: None }
    }
}

/// The workers of a plan, given the names of the nodes its placement
/// accepts (ignored for a claim).
pub fn plan_workers(plan: &Plan<'_>, matching_nodes: &[String]) -> Vec<Worker> {
    if plan.per_node() { matching_nodes.iter().map(|n| Worker::on_node(n)).collect() } else { vec![Worker::shared()] }
}
