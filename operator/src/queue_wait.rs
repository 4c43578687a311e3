//! How long a DataStage change waits before a reconciliation sees it: from
//! the moment the DataStage watch hands the operator a changed object to
//! the start of the reconciliation that reads it. This is the operator's
//! own share of a user's "create → Job" wait (the rest is the API server
//! delivering the watch event and answering the requests the
//! reconciliation makes), and what grows first when the operator spends
//! its reconcile slots on DataStages it already holds.
//!
//! The same measure as controller-runtime's `workqueue_queue_duration_seconds`,
//! kept here because kube-runtime's scheduler does not expose one, for the
//! changes a user waits on: a new DataStage or an edited spec
//! (`metadata.generation` ahead of `status.observedGeneration`). The
//! operator's own status writes and the wakes by Jobs, Pods and Nodes are
//! not timed: they would count the rest of the reconciliation that caused
//! them, which the reconcile duration metric already shows.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use ferry_crds::DataStage;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

/// When each DataStage's oldest change not yet seen by a reconciliation
/// arrived. Holds one entry per DataStage waiting in the queue, none once
/// its reconciliation started or it was deleted.
#[derive(Debug, Default)]
pub struct ArrivalTimes {
    waiting: Mutex<HashMap<ObjectRef<DataStage>, Instant>>,
}

impl ArrivalTimes {
    /// The watch delivered `ds` now: stamped if its spec holds a change
    /// the operator has not acted on. A change arriving while an earlier
    /// one still waits keeps the earlier time: the wait is the oldest
    /// unseen change's.
    pub fn arrived(&self, ds: &DataStage) {
        let observed = ds.status.as_ref().and_then(|s| s.observed_generation);
        if observed.is_none() || observed != ds.metadata.generation {
            self.lock().entry(ObjectRef::from_obj(ds)).or_insert_with(Instant::now);
        }
    }

    /// A reconciliation of `key` starts: how long its oldest unseen change
    /// waited, if one did.
    pub fn picked_up(&self, key: &ObjectRef<DataStage>) -> Option<Duration> {
        self.lock().remove(key).map(|at| at.elapsed())
    }

    /// `key` was deleted: a change that arrived before the deletion will
    /// not be reconciled, and must not be remembered.
    pub fn forget(&self, key: &ObjectRef<DataStage>) {
        self.lock().remove(key);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<DataStage>, Instant>> {
        // The map holds plain times: a panic elsewhere cannot leave it
        // half-updated, so a poisoned lock is still good to use.
        self.waiting.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectRef<DataStage> {
        ObjectRef::new(name).within("ml")
    }

    /// DataStage `namespace/name` at `generation`, its status having observed `observed`.
    fn datastage(namespace: &str, name: &str, generation: i64, observed: Option<i64>) -> DataStage {
        let mut ds = DataStage::new(name, ferry_crds::DataStageSpec::default());
        ds.metadata.namespace = Some(namespace.into());
        ds.metadata.generation = Some(generation);
        if let Some(observed) = observed {
            ds.status = Some(ferry_crds::DataStageStatus { observed_generation: Some(observed), ..Default::default() });
        }
        ds
    }

    #[tokio::test(start_paused = true)]
    async fn the_wait_runs_from_the_oldest_unseen_change_and_is_taken_once() {
        let times = ArrivalTimes::default();
        times.arrived(&datastage("ml", "data", 1, None));
        tokio::time::advance(Duration::from_millis(300)).await;
        // A second change while the first waits does not restart the clock.
        times.arrived(&datastage("ml", "data", 2, None));
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(times.picked_up(&key("data")), Some(Duration::from_millis(500)));
        // Taken: the next reconciliation, woken by something else, is not timed.
        assert_eq!(times.picked_up(&key("data")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn datastages_wait_apart_and_a_deleted_one_is_forgotten() {
        let times = ArrivalTimes::default();
        times.arrived(&datastage("ml", "a", 1, None));
        tokio::time::advance(Duration::from_millis(100)).await;
        times.arrived(&datastage("ml", "b", 2, Some(1)));
        times.arrived(&datastage("other", "a", 1, None));
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(times.picked_up(&key("b")), Some(Duration::from_millis(50)));
        times.forget(&key("a"));
        assert_eq!(times.picked_up(&key("a")), None);
        assert_eq!(times.picked_up(&ObjectRef::new("a").within("other")), Some(Duration::from_millis(50)));
        assert!(times.lock().is_empty(), "nothing is left once every wait was taken or forgotten");
    }

    #[tokio::test(start_paused = true)]
    async fn a_datastage_whose_spec_the_operator_acted_on_is_not_timed() {
        let times = ArrivalTimes::default();
        // The operator's own status write, or any change of a generation
        // its status already observed.
        times.arrived(&datastage("ml", "data", 3, Some(3)));
        assert_eq!(times.picked_up(&key("data")), None);
    }
}
