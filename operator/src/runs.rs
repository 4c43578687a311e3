//! Runs: each pass of a DataStage's workers over the dataset. A DataStage
//! has one current run, numbered in `status.run`; its worker Jobs carry the
//! number in their names, and a finished run's outcome lives in the status,
//! so a Job deleted after it finished (`ttlSecondsAfterFinished`) is never
//! run again.
//!
//! A new run starts when the DataStage is created, when a spec change
//! alters what a run does (a new digest of the run's inputs), when the
//! schedule comes due after a finished run, or when the workers of a pull
//! finished with different snapshots of the dataset (decided in
//! [`crate::status`]), or when a StagingQuota that refused a run leaves
//! room for it, or a node's disk that refused it may have room (decided in
//! [`crate::controller`] from [`crate::quotas`] and [`crate::disks`]), or a
//! pod waits for data that was evicted from every node
//! ([`crate::eviction`]). Pure functions with the clock passed in.

use ferry_crds::{DataStage, DataStageSpec, Phase};
use k8s_openapi::jiff::Timestamp;

use crate::schedule::Schedule;

/// Spec fields that do not change what a run does: editing them updates
/// `observedGeneration` without starting a new run.
const NOT_RUN_INPUTS: [&str; 5] = ["schedule", "timeZone", "suspend", "reclaimPolicy", "ttlSecondsAfterFinished"];

/// Why a run started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The DataStage is new.
    Created,
    /// A spec change altered what a run does.
    SpecChanged,
    /// The schedule came due.
    Scheduled,
    /// A StagingQuota that refused the last run leaves its dataset room now.
    RoomInQuota,
    /// A node's disk that had no room for the last run may have it now.
    RoomOnDisk,
    /// A pod waits for data that was evicted from every node.
    PodWaiting,
}

impl Trigger {
    /// The Event reason that announces the run.
    pub fn reason(self) -> &'static str {
        match self {
            Trigger::Created => "RunStarted",
            Trigger::SpecChanged => "SpecChanged",
            Trigger::Scheduled => "ScheduledSync",
            Trigger::RoomInQuota => "RoomInQuota",
            Trigger::RoomOnDisk => "RoomOnDisk",
            Trigger::PodWaiting => "PodWaiting",
        }
    }
}

/// The run a reconciliation works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// Its number.
    pub number: i64,
    /// The digest of the spec fields it runs from.
    pub inputs: String,
    /// Set when this reconciliation starts it.
    pub started: Option<Trigger>,
}

/// A digest of every spec field that changes what a run does: 16 hex
/// digits of FNV-1a over the spec's JSON without [`NOT_RUN_INPUTS`].
pub fn run_inputs(spec: &DataStageSpec) -> String {
    let mut value = serde_json::to_value(spec).expect("a spec serializes");
    if let Some(fields) = value.as_object_mut() {
        for field in NOT_RUN_INPUTS {
            fields.remove(field);
        }
        // Whether and when copies may be evicted changes no run either; a
        // capacity left empty by their removal goes too, so that the digest
        // is the one the spec had before the fields existed.
        if let Some(capacity) = fields.get_mut("capacity").and_then(|c| c.as_object_mut()) {
            let removed = capacity.remove("eviction").is_some() | capacity.remove("idleSeconds").is_some();
            if removed && capacity.is_empty() {
                fields.remove("capacity");
            }
        }
    }
    // serde_json's maps are sorted by key, so equal specs give equal text.
    format!("{:016x}", ferry_contract::hash::fnv1a(value.to_string().as_bytes()))
}

/// Whether the DataStage's current run has finished (for good or not).
pub fn finished(ds: &DataStage) -> bool {
    ds.status.as_ref().and_then(|s| s.phase).is_some_and(Phase::is_finished)
}

/// The run to work on now.
pub fn current(ds: &DataStage, schedule: Option<&Schedule>, now: Timestamp) -> Run {
    let inputs = run_inputs(&ds.spec);
    let status = ds.status.as_ref();
    let Some(number) = status.and_then(|s| s.run) else {
        return Run { number: 1, inputs, started: Some(Trigger::Created) };
    };
    if status.and_then(|s| s.run_inputs.as_deref()) != Some(inputs.as_str()) {
        return Run { number: number + 1, inputs, started: Some(Trigger::SpecChanged) };
    }
    let due = next_sync(ds, schedule).is_some_and(|next| next <= now);
    if finished(ds) && due {
        return Run { number: number + 1, inputs, started: Some(Trigger::Scheduled) };
    }
    Run { number, inputs, started: None }
}

/// When the next scheduled sync starts: the schedule's first time after
/// the last sync finished, unless there is no schedule, it is suspended,
/// or no sync has finished yet.
pub fn next_sync(ds: &DataStage, schedule: Option<&Schedule>) -> Option<Timestamp> {
    if ds.spec.suspend == Some(true) {
        return None;
    }
    let last = ds.status.as_ref()?.last_sync_time.as_ref()?;
    schedule?.next_after(last.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(spec: serde_json::Value, status: serde_json::Value) -> DataStage {
        serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage", "metadata": {"name": "d", "namespace": "n"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    fn spec() -> serde_json::Value {
        json!({"source": {"uri": "s3://b/p"}, "destination": {"volume": {"hostPath": "/mnt/x"}}})
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn a_new_datastage_starts_run_one_and_a_finished_one_stays_finished() {
        let fresh = ds(spec(), json!({}));
        assert_eq!(current(&fresh, None, at("2026-01-01T00:00:00Z")).started, Some(Trigger::Created));
        let inputs = run_inputs(&fresh.spec);
        let done = ds(
            spec(),
            json!({"phase": "Succeeded", "run": 1, "runInputs": inputs, "lastSyncTime": "2026-01-01T00:00:00Z"}),
        );
        let run = current(&done, None, at("2030-01-01T00:00:00Z"));
        assert_eq!((run.number, run.started), (1, None), "no schedule: finished is final");
    }

    #[test]
    fn only_edits_that_change_a_run_start_a_new_one() {
        let base = ds(spec(), json!({}));
        let inputs = run_inputs(&base.spec);
        let status = json!({"phase": "Succeeded", "run": 4, "runInputs": inputs});
        let mut edited = spec();
        edited["reclaimPolicy"] = "Delete".into();
        edited["ttlSecondsAfterFinished"] = 5.into();
        edited["suspend"] = true.into();
        edited["capacity"] = json!({"eviction": "WhenSpaceIsNeeded", "idleSeconds": 600});
        assert_eq!(current(&ds(edited, status.clone()), None, at("2026-01-01T00:00:00Z")).started, None);
        let mut edited = spec();
        edited["include"] = json!(["*.tar"]);
        let run = current(&ds(edited, status), None, at("2026-01-01T00:00:00Z"));
        assert_eq!((run.number, run.started), (5, Some(Trigger::SpecChanged)));
    }

    #[test]
    fn a_schedule_starts_the_next_run_once_due_unless_suspended() {
        let schedule = Schedule::parse("*/10 * * * * *", None).unwrap();
        let mut scheduled = spec();
        scheduled["schedule"] = "*/10 * * * * *".into();
        let inputs = run_inputs(&ds(scheduled.clone(), json!({})).spec);
        let status =
            json!({"phase": "Succeeded", "run": 2, "runInputs": inputs, "lastSyncTime": "2026-01-01T00:00:03Z"});
        let d = ds(scheduled.clone(), status.clone());
        assert_eq!(next_sync(&d, Some(&schedule)), Some(at("2026-01-01T00:00:10Z")));
        assert_eq!(current(&d, Some(&schedule), at("2026-01-01T00:00:09Z")).started, None);
        let run = current(&d, Some(&schedule), at("2026-01-01T00:00:10Z"));
        assert_eq!((run.number, run.started), (3, Some(Trigger::Scheduled)));

        let mut running = status.clone();
        running["phase"] = "Running".into();
        assert_eq!(current(&ds(scheduled.clone(), running), Some(&schedule), at("2026-01-01T00:01:00Z")).started, None);
        scheduled["suspend"] = true.into();
        let suspended = ds(scheduled, status);
        assert_eq!(next_sync(&suspended, Some(&schedule)), None);
        assert_eq!(current(&suspended, Some(&schedule), at("2026-01-01T00:01:00Z")).started, None);
    }
}
