//! Room on the nodes' disks, and when a DataStage a full disk refused
//! starts again.
//!
//! A pull measures its destination's filesystem and, when what it has to
//! write with its reserve does not fit, is refused before it writes
//! (`InsufficientCapacity`, with the measurement and its need in the
//! summary: [`DiskSpace`]). The operator keeps each worker's last
//! measurement in its status, so it knows, for every node filesystem Ferry
//! stages onto, how large it is and what was free when a worker last looked.
//!
//! A refused run whose need could fit the filesystem does not fail: the
//! DataStage waits, `Pending` with reason `InsufficientCapacity` and a
//! message that says what it needs and what is free, and a new run starts
//! once there is reason to think there is room on one of its refused nodes:
//! - a newer measurement of that filesystem (another DataStage's worker)
//!   shows as much free as the refused worker needed;
//! - Ferry removed staged data on that node (a DataStage deleted with
//!   `reclaimPolicy: Delete`) after the refusal;
//! - [`LOOK_AGAIN_AFTER`] passed since the refusal: room freed by anything
//!   else than Ferry is only seen by looking.
//!
//! The new run measures again: a node that still has no room refuses again
//! at the cost of a listing. A need larger than the filesystem itself fails
//! the DataStage as before: no amount of waiting makes it fit.
//!
//! Before a pull's worker starts, the operator also tells it what the
//! running pulls of other DataStages on its node still have to write, by
//! the filesystem each reported when it started (`--capacity-claimed`): the
//! worker counts the claim on its own filesystem as taken, so two
//! DataStages staging onto one disk at once do not both count on the same
//! free space. A worker that has not reported yet (it is still starting)
//! claims nothing.
//!
//! Pure functions over the DataStages the caches hold, with the clock and
//! the cleaned nodes passed in.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use ferry_contract::{CapacityClaims, DiskSpace, Reason};
use ferry_crds::{DataStage, Phase, WorkerStatus};

/// How long a DataStage refused for room waits before it looks again
/// without a sign of room.
pub const LOOK_AGAIN_AFTER: Duration = Duration::from_secs(300);

/// The latest measurement of each node filesystem Ferry stages onto, keyed
/// by node (empty for a worker on no particular node) and filesystem.
#[derive(Debug, Default)]
pub struct Disks<'a> {
    latest: BTreeMap<(&'a str, &'a str), &'a DiskSpace>,
}

impl<'a> Disks<'a> {
    /// What the finished workers of `datastages` last measured (a running
    /// worker's measurement is from before it wrote).
    pub fn measured_by(datastages: impl IntoIterator<Item = &'a DataStage>) -> Self {
        let mut latest: BTreeMap<(&str, &str), &DiskSpace> = BTreeMap::new();
        let workers = datastages.into_iter().filter_map(|ds| ds.status.as_ref()).flat_map(|s| &s.workers);
        for worker in workers.filter(|w| w.phase.is_some_and(Phase::is_finished)) {
            let Some(disk) = &worker.disk else { continue };
            let key = (worker.node.as_deref().unwrap_or_default(), disk.filesystem.as_str());
            let newest = latest.get(&key).is_none_or(|known| disk.measured_at > known.measured_at);
            if newest {
                latest.insert(key, disk);
            }
        }
        Self { latest }
    }

    /// The latest measurement of `filesystem` on `node`.
    pub fn latest(&self, node: &str, filesystem: &str) -> Option<&'a DiskSpace> {
        self.latest.get(&(node, filesystem)).copied()
    }
}

/// Nodes on which Ferry removed staged data, and when (seconds since the
/// Unix epoch), since the operator started.
#[derive(Debug, Default)]
pub struct Cleaned(Mutex<BTreeMap<String, u64>>);

impl Cleaned {
    /// Records that staged data on `node` ("" for a claim) is gone now.
    pub fn record(&self, node: &str, now: u64) {
        self.0.lock().expect("not poisoned").insert(node.to_owned(), now);
    }

    /// When staged data on `node` was last removed.
    pub fn last(&self, node: &str) -> Option<u64> {
        self.0.lock().expect("not poisoned").get(node).copied()
    }
}

/// What the running pull workers of `others` on `node` still have to write,
/// by the filesystem they reported.
pub fn claims_on<'a>(node: &str, others: impl IntoIterator<Item = &'a DataStage>) -> CapacityClaims {
    let mut claims = CapacityClaims::default();
    let workers = others.into_iter().filter_map(|ds| ds.status.as_ref()).flat_map(|s| &s.workers);
    for worker in workers.filter(|w| w.node.as_deref() == Some(node) && w.phase == Some(Phase::Running)) {
        if let Some(disk) = &worker.disk {
            let remaining = worker.bytes_total.saturating_sub(worker.bytes_done);
            claims.add(&disk.filesystem, u64::try_from(remaining).unwrap_or_default());
        }
    }
    claims
}

/// What a run refused for room calls for.
#[derive(Debug, PartialEq, Eq)]
pub enum AfterRefusal {
    /// Wait: no node it was refused on shows room yet. The message says
    /// what is needed where.
    Wait(String),
    /// Start a new run: the message says where room appeared.
    LookAgain(String),
}

/// The workers of `run` refused for room with a need that could fit their
/// filesystem; empty when any worker of the run was refused with a need
/// that can never fit (the run fails as it is).
pub fn refused_for_room(ds: &DataStage, run: i64) -> Vec<&WorkerStatus> {
    let workers = ds.status.iter().flat_map(|s| &s.workers).filter(|w| w.run == Some(run));
    let refused: Vec<&WorkerStatus> = workers.filter(|w| refused_with_a_need(w)).collect();
    if refused.iter().any(|w| w.disk.as_ref().is_some_and(|d| !d.could_ever_fit())) {
        return Vec::new();
    }
    refused
}

/// Whether `worker` failed because its destination lacked room, saying
/// what it needed.
fn refused_with_a_need(worker: &WorkerStatus) -> bool {
    worker.phase == Some(Phase::Failed)
        && worker.reason.as_deref() == Some(Reason::InsufficientCapacity.as_str())
        && worker.disk.as_ref().is_some_and(|d| d.needed_bytes.is_some())
}

/// Whether every failed worker of `workers` (one run's) was refused for
/// room it could have: the run waits for room rather than failing.
pub fn only_waiting_for_room(workers: &[WorkerStatus]) -> bool {
    let mut failed = workers.iter().filter(|w| w.phase == Some(Phase::Failed)).peekable();
    failed.peek().is_some()
        && failed.all(|w| refused_with_a_need(w) && w.disk.as_ref().is_some_and(DiskSpace::could_ever_fit))
}

/// The DataStage field a capacity refusal's remedy names.
pub const CAPACITY_RESERVE_FIELD: &str = "spec.capacity.reserve";

/// What a run refused for room waits for: where it needs how much, as
/// each worker in `waiting` (place, measurement) found it.
pub fn waiting_message<'a>(waiting: impl IntoIterator<Item = (String, &'a DiskSpace)>) -> String {
    let places: Vec<String> = waiting.into_iter().map(|(place, disk)| format!("{place} {}", disk.describe())).collect();
    format!(
        "waiting for room: {}; starts again when Ferry frees space there or another worker finds room, else looks again every {}, or lower {}",
        places.join("; "),
        humanize(LOOK_AGAIN_AFTER),
        CAPACITY_RESERVE_FIELD
    )
}

/// Where a worker is, for messages: its node, or its name.
pub fn place(worker: &WorkerStatus) -> String {
    match worker.node.as_deref() {
        Some(node) if !node.is_empty() => format!("node {node}"),
        _ => format!("worker {}", worker.name),
    }
}

/// Whether the `refused` workers of a run (from [`refused_for_room`]) wait
/// or look again, knowing the measurements in `disks`, where Ferry cleaned
/// up, and the time `now` (seconds since the Unix epoch). `None` when none
/// was refused.
pub fn after_refusal(
    refused: &[&WorkerStatus],
    disks: &Disks<'_>,
    cleaned: &Cleaned,
    now: u64,
) -> Option<AfterRefusal> {
    let mut waiting = Vec::new();
    for worker in refused {
        let Some(disk) = &worker.disk else { continue };
        let node = worker.node.as_deref().unwrap_or_default();
        let place = place(worker);
        let needed = disk.needed_bytes.unwrap_or_default();
        if let Some(newer) = disks.latest(node, &disk.filesystem).filter(|d| d.measured_at > disk.measured_at)
            && newer.free_bytes >= needed
        {
            return Some(AfterRefusal::LookAgain(format!(
                "{place} measured {} free, as much as the run needs",
                ferry_contract::size::human_bytes(newer.free_bytes)
            )));
        }
        if cleaned.last(node).is_some_and(|at| at >= disk.measured_at) {
            return Some(AfterRefusal::LookAgain(format!("Ferry removed staged data on {place}")));
        }
        if now >= disk.measured_at.saturating_add(LOOK_AGAIN_AFTER.as_secs()) {
            return Some(AfterRefusal::LookAgain(format!(
                "{} passed since {place} had no room",
                humanize(LOOK_AGAIN_AFTER)
            )));
        }
        waiting.push((place, disk));
    }
    (!waiting.is_empty()).then(|| AfterRefusal::Wait(waiting_message(waiting)))
}

fn humanize(duration: Duration) -> String {
    format!("{} minutes", duration.as_secs() / 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIB: u64 = 1 << 20;
    const REFUSED_AT: u64 = 1_764_000_000;

    fn disk(fs: &str, free: u64, needed: Option<u64>, at: u64) -> DiskSpace {
        DiskSpace {
            filesystem: fs.into(),
            size_bytes: 40 * MIB,
            free_bytes: free,
            needed_bytes: needed,
            claimed_bytes: None,
            measured_at: at,
        }
    }

    fn worker(name: &str, run: i64, phase: Phase, reason: Option<Reason>, disk: Option<DiskSpace>) -> WorkerStatus {
        WorkerStatus {
            name: name.into(),
            node: Some(name.into()),
            phase: Some(phase),
            run: Some(run),
            reason: reason.map(|r| r.to_string()),
            disk,
            ..WorkerStatus::default()
        }
    }

    fn datastage(name: &str, workers: Vec<WorkerStatus>) -> DataStage {
        let mut ds: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/ferry/x"}}},
        }))
        .unwrap();
        ds.status = Some(ferry_crds::DataStageStatus { workers, ..Default::default() });
        ds
    }

    fn refused(node: &str, needed: u64) -> WorkerStatus {
        let disk = disk("0:52", 26 * MIB, Some(needed), REFUSED_AT);
        worker(node, 2, Phase::Failed, Some(Reason::InsufficientCapacity), Some(disk))
    }

    #[test]
    fn only_refusals_with_a_need_that_could_fit_wait_for_room() {
        let ds = datastage(
            "d",
            vec![
                refused("node-a", 30 * MIB),
                worker("node-b", 2, Phase::Succeeded, None, Some(disk("0:53", 20 * MIB, None, REFUSED_AT))),
                // A disk that filled up under the run has no need to wait for.
                worker("node-c", 2, Phase::Failed, Some(Reason::InsufficientCapacity), None),
            ],
        );
        let names: Vec<&str> = refused_for_room(&ds, 2).iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["node-a"]);
        assert!(refused_for_room(&ds, 3).is_empty(), "another run's refusals do not count");
        let never = datastage("d", vec![refused("node-a", 30 * MIB), refused("node-b", 41 * MIB)]);
        assert!(refused_for_room(&never, 2).is_empty(), "a need larger than the filesystem fails the run");
    }

    #[test]
    fn a_refused_run_waits_saying_what_it_needs_until_a_sign_of_room() {
        let ds = datastage("d", vec![refused("node-a", 30 * MIB)]);
        let refused = refused_for_room(&ds, 2);
        let cleaned = Cleaned::default();
        let shortly = REFUSED_AT + 10;

        // Only its own measurement: it waits, with the numbers.
        let alone = Disks::measured_by([&ds]);
        let Some(AfterRefusal::Wait(message)) = after_refusal(&refused, &alone, &cleaned, shortly) else {
            panic!("waits")
        };
        assert!(
            message.starts_with("waiting for room: node node-a needs 30.0 MiB free (its reserve included) where 26.0 MiB of 40.0 MiB is free;"),
            "{message}"
        );
        assert!(message.contains("spec.capacity.reserve"), "{message}");

        // A newer measurement of the same filesystem on the same node with
        // too little room, of another filesystem, or on another node: still waits.
        let others = |fs: &str, node: &str, free: u64| {
            let mut w = worker(node, 1, Phase::Succeeded, None, Some(disk(fs, free, None, REFUSED_AT + 5)));
            w.name = "other".into();
            datastage("other", vec![w])
        };
        for other in
            [others("0:52", "node-a", 29 * MIB), others("0:99", "node-a", 39 * MIB), others("0:52", "node-b", 39 * MIB)]
        {
            let disks = Disks::measured_by([&ds, &other]);
            assert!(matches!(after_refusal(&refused, &disks, &cleaned, shortly), Some(AfterRefusal::Wait(_))));
        }
        // Room measured on that filesystem after the refusal: look again.
        let roomy = others("0:52", "node-a", 30 * MIB);
        let disks = Disks::measured_by([&ds, &roomy]);
        let Some(AfterRefusal::LookAgain(why)) = after_refusal(&refused, &disks, &cleaned, shortly) else {
            panic!("room")
        };
        assert_eq!(why, "node node-a measured 30.0 MiB free, as much as the run needs");
        // The same room measured before the refusal is old news.
        let mut stale = roomy.clone();
        stale.status.as_mut().unwrap().workers[0].disk.as_mut().unwrap().measured_at = REFUSED_AT - 1;
        let disks = Disks::measured_by([&ds, &stale]);
        assert!(matches!(after_refusal(&refused, &disks, &cleaned, shortly), Some(AfterRefusal::Wait(_))));

        // Ferry cleaned up on another node, then on this one.
        cleaned.record("node-b", REFUSED_AT + 1);
        assert!(matches!(after_refusal(&refused, &alone, &cleaned, shortly), Some(AfterRefusal::Wait(_))));
        cleaned.record("node-a", REFUSED_AT + 1);
        assert_eq!(
            after_refusal(&refused, &alone, &cleaned, shortly),
            Some(AfterRefusal::LookAgain("Ferry removed staged data on node node-a".into()))
        );

        // With no sign at all, it looks again after a while.
        let later = REFUSED_AT + LOOK_AGAIN_AFTER.as_secs();
        let Some(AfterRefusal::LookAgain(why)) = after_refusal(&refused, &alone, &Cleaned::default(), later) else {
            panic!("looks again")
        };
        assert_eq!(why, "5 minutes passed since node node-a had no room");
        assert_eq!(after_refusal(&[], &alone, &cleaned, later), None);
    }

    #[test]
    fn running_pulls_on_the_node_claim_what_they_still_write_by_filesystem() {
        let running = |node: &str, fs: &str, total: i64, done: i64| WorkerStatus {
            bytes_total: total,
            bytes_done: done,
            ..worker(node, 1, Phase::Running, None, Some(disk(fs, 30 * MIB, None, REFUSED_AT)))
        };
        let a = datastage("a", vec![running("node-a", "0:52", 20, 5), running("node-b", "0:52", 100, 0)]);
        let b = datastage("b", vec![running("node-a", "0:52", 7, 0), running("node-a", "0:60", 9, 1)]);
        let finished =
            datastage("c", vec![worker("node-a", 1, Phase::Succeeded, None, Some(disk("0:52", MIB, None, 1)))]);
        let unmeasured =
            datastage("d", vec![WorkerStatus { bytes_total: 50, ..worker("node-a", 1, Phase::Running, None, None) }]);
        let claims = claims_on("node-a", [&a, &b, &finished, &unmeasured]);
        assert_eq!(claims.to_string(), "0:52=22,0:60=8");
        assert_eq!(claims_on("node-b", [&a]).to_string(), "0:52=100");
        assert!(claims_on("node-c", [&a, &b]).is_empty());
        // A running worker's measurement is from before it wrote: not a sign of room.
        let disks = Disks::measured_by([&a]);
        assert_eq!(disks.latest("node-a", "0:52"), None);
    }

    #[test]
    fn the_latest_measurement_of_a_node_filesystem_wins_whoever_made_it() {
        let early =
            datastage("a", vec![worker("node-a", 1, Phase::Succeeded, None, Some(disk("0:52", MIB, None, 10)))]);
        let late =
            datastage("b", vec![worker("node-a", 1, Phase::Succeeded, None, Some(disk("0:52", 9 * MIB, None, 20)))]);
        for order in [[&early, &late], [&late, &early]] {
            let disks = Disks::measured_by(order);
            assert_eq!(disks.latest("node-a", "0:52").map(|d| d.free_bytes), Some(9 * MIB));
            assert_eq!(disks.latest("node-b", "0:52"), None);
        }
    }
}
