//! Workers about to start, counted for store budgets before their Jobs
//! exist (see [`crate::budgets`]): DataStages that start together each
//! count the others' new workers.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Workers per DataStage (namespace, name).
pub type WorkerCounts = BTreeMap<(String, String), u32>;

/// Workers whose share was decided and whose Jobs are being created, per
/// DataStage: counted with the running ones until their Jobs are recorded
/// as created ([`crate::cache::CreatedJobs`]).
///
/// Deciding a share and counting the workers it was decided for happen
/// under one lock, so DataStages that start at the same moment see each
/// other: without it, each reconciliation counted the Jobs that existed,
/// created its own a round trip later, and several started their workers
/// as if they were alone against the bucket.
#[derive(Debug, Default)]
pub struct StartingWorkers(std::sync::Mutex<WorkerCounts>);

/// `workers` of one DataStage counted as starting, until dropped.
#[derive(Debug)]
pub struct Starting {
    book: Arc<StartingWorkers>,
    datastage: (String, String),
    workers: u32,
}

impl StartingWorkers {
    /// The workers starting now, per DataStage.
    pub fn counts(&self) -> WorkerCounts {
        self.0.lock().expect("starting workers").clone()
    }

    /// Decides with `decide`, from the workers starting now, what `workers`
    /// new workers of `datastage` get, and counts them as starting until
    /// the returned [`Starting`] is dropped. `None` from `decide` counts
    /// nobody.
    pub fn reserve<T>(
        self: &Arc<Self>,
        datastage: (String, String),
        workers: u32,
        decide: impl FnOnce(&WorkerCounts) -> Option<T>,
    ) -> Option<(T, Starting)> {
        let mut book = self.0.lock().expect("starting workers");
        let decided = decide(&book)?;
        let count = book.entry(datastage.clone()).or_default();
        *count = count.saturating_add(workers);
        Some((decided, Starting { book: Arc::clone(self), datastage, workers }))
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        let mut book = self.book.0.lock().expect("starting workers");
        if let Some(count) = book.get_mut(&self.datastage) {
            *count = count.saturating_sub(self.workers);
            if *count == 0 {
                book.remove(&self.datastage);
            }
        }
    }
}
