//! What every part of the operator shares, built once at start-up: the API
//! client, the configuration, metrics and Events, the caches the watches
//! fill, and the little the operator remembers between reconciliations
//! (the anchors it made, when tokens are due, what to wake or sweep).
//!
//! Its own module, imported by the controller, the budget and quota loops,
//! the gates and the sweeper alike, and importing none of them: shared
//! state is not the reconciler's to own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ferry_crds::DataStage;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt as _;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::ObjectRef;

use crate::cache::{CacheWriters, Caches};
use crate::config::OperatorConfig;
use crate::events::EventPublisher;
use crate::home::Home;
use crate::metrics::Metrics;
use crate::starting::StartingWorkers;

/// Shared state, built once at start-up.
pub struct Context {
    /// API client.
    pub client: kube::Client,
    /// Parsed configuration.
    pub config: OperatorConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events, folding repeats into series.
    pub events: EventPublisher,
    /// Nodes, and the Jobs and Pods of DataStages, as the watches last saw them.
    pub caches: Caches,
    /// Workers whose store budget share was decided and whose Jobs are
    /// being created (see [`StartingWorkers`]).
    pub starting: Arc<StartingWorkers>,
    /// Where Ferry removed staged data: a sign of room for DataStages a
    /// full disk holds back.
    pub cleaned: crate::disks::Cleaned,
    /// DataStages to reconcile now that no watch event of their own would
    /// wake: the copies a waiting pull chose to evict, the DataStages a
    /// gated pod waits for.
    pub wakes: Wakes,
    /// The anchors made in the workers' namespace, by DataStage uid (see
    /// [`crate::home`]): looked up once per process, not per Job.
    pub anchors: Mutex<HashMap<String, OwnerReference>>,
    /// When each DataStage's web identity token is due for renewal, by
    /// uid ([`crate::delivery`]).
    pub tokens: Mutex<HashMap<String, SystemTime>>,
    /// Wakes the sweeper ([`crate::sweeper`]) when a DataStage is deleted.
    pub sweeps: tokio::sync::Notify,
    /// When each DataStage's change not yet reconciled arrived, for the
    /// queue wait metric ([`crate::queue_wait`]).
    pub arrivals: crate::queue_wait::ArrivalTimes,
}

/// Asks for reconciliations of other DataStages than the one at hand.
pub struct Wakes {
    sender: futures::channel::mpsc::UnboundedSender<ObjectRef<DataStage>>,
    receiver: Mutex<Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<DataStage>>>>,
}

impl Default for Wakes {
    fn default() -> Self {
        let (sender, receiver) = futures::channel::mpsc::unbounded();
        Wakes { sender, receiver: Mutex::new(Some(receiver)) }
    }
}

impl Wakes {
    /// Reconciles DataStage `name` in `namespace` soon.
    pub fn wake(&self, namespace: &str, name: &str) {
        // Closed only when the controller stops, and then nothing is to wake.
        let _ = self.sender.unbounded_send(ObjectRef::new(name).within(namespace));
    }

    /// The stream of wakes, for the controller (taken once).
    pub fn take(&self) -> Option<futures::channel::mpsc::UnboundedReceiver<ObjectRef<DataStage>>> {
        self.receiver.lock().expect("not poisoned").take()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Context {
    /// Where `ds`'s workers live, with the anchor this process knows of
    /// (`None` when its spec has no plan).
    pub fn home(&self, ds: &DataStage) -> Option<Home> {
        let plan = ds.spec.plan().ok()?;
        let anchor = ds.uid().and_then(|uid| self.anchors.lock().expect("anchors").get(&uid).cloned());
        Some(Home::of(ds, &plan, self.config.workers_namespace(), anchor))
    }

    /// Remembers the anchor of the DataStage of uid `uid`.
    pub fn remember_anchor(&self, uid: &str, owner: OwnerReference) {
        self.anchors.lock().expect("anchors").insert(uid.to_owned(), owner);
    }

    /// Forgets what is remembered of the DataStage of uid `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        self.anchors.lock().expect("anchors").remove(uid);
        self.tokens.lock().expect("tokens").remove(uid);
    }
}

/// Builds the context once at start-up, and the writers the controller
/// fills its caches with (one watch each of Jobs and Pods).
pub fn context(client: kube::Client, config: OperatorConfig, metrics: Arc<Metrics>) -> (Arc<Context>, CacheWriters) {
    context_with(client, config, metrics, 1)
}

/// [`context`] with `scopes` watches each of Jobs and Pods (see
/// [`crate::controller::watch_scopes`]).
pub fn context_with(
    client: kube::Client,
    config: OperatorConfig,
    metrics: Arc<Metrics>,
    scopes: usize,
) -> (Arc<Context>, CacheWriters) {
    let reporter = Reporter { controller: "ferry-operator".into(), instance: std::env::var("HOSTNAME").ok() };
    let events = EventPublisher::new(client.clone(), reporter);
    let (caches, writers) = crate::cache::new_with(scopes);
    let context = Context {
        client,
        config,
        metrics,
        events,
        caches,
        starting: Arc::default(),
        cleaned: Default::default(),
        wakes: Wakes::default(),
        anchors: Mutex::default(),
        tokens: Mutex::default(),
        sweeps: tokio::sync::Notify::new(),
        arrivals: Default::default(),
    };
    (Arc::new(context), writers)
}
