//! Versioned pulls (`spec.updateStrategy: Versioned`): when to switch the
//! nodes to a new version, and when the previous one may go.
//!
//! Workers build each new version beside the current one and stop
//! (`pull --versions build`). Once a run has succeeded with one snapshot on
//! every worker, the operator runs a short *switch* Job per place (node, or
//! the claim) that makes it current (`ferry-stager switch`), keeping the
//! versions pods may still read; only when every place has switched does
//! the status name it current, so a pod the gate lets through after that
//! gets it on any node. The gate records on each pod the versions it
//! lifted it with ([`PodVersions`]); the previous version is removed from
//! every place (a *prune* Job) once no unfinished pod may read it.
//!
//! The steps are decided from the status and the pods alone by
//! [`next_step`], so that a restarted operator resumes where the last one
//! was; the Jobs are named by run and step, so a step's Job is never taken
//! for another's.

use std::collections::BTreeMap;

use ferry_contract::SnapshotDigest;
use ferry_contract::cli::{LogFormat, ProgressMode, StagerCli, StagerCommand};
use ferry_crds::plan::Plan;
use ferry_crds::{DataStage, DataStageStatus, Phase, VersionsStatus};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use serde::{Deserialize, Serialize};

use crate::home::Home;
use crate::jobs::{DataLayout, ShortJob, WorkerDefaults, data_layout};
use crate::webhook::wiring::DataRequest;
use crate::worker::Worker;

/// Label on switch and prune Jobs (value: the place they act on).
pub const VERSIONS_LABEL: &str = ferry_crds::names::VERSIONS;

/// Annotation the gate sets on a pod as it lifts its gate: the version of
/// each versioned DataStage that was current then (JSON, name → digest).
pub const POD_VERSIONS_ANNOTATION: &str = ferry_crds::names::POD_VERSIONS;

/// The versions a pod was let through with, by DataStage name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodVersions(pub BTreeMap<String, String>);

impl PodVersions {
    /// What `pod` was let through with; empty when the gate recorded
    /// nothing (or something unreadable).
    pub fn of(pod: &Pod) -> Self {
        pod.annotations().get(POD_VERSIONS_ANNOTATION).and_then(|v| serde_json::from_str(v).ok()).unwrap_or_default()
    }

    /// The versions current now of the versioned DataStages in `found`.
    pub fn current<'a>(found: impl IntoIterator<Item = &'a DataStage>) -> Self {
        Self(
            found
                .into_iter()
                .filter(|ds| ds.spec.versioned())
                .filter_map(|ds| Some((ds.name_any(), current(ds)?.to_owned())))
                .collect(),
        )
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a map of strings serializes")
    }
}

fn current(ds: &DataStage) -> Option<&str> {
    ds.status.as_ref()?.versions.as_ref()?.current.as_deref()
}

/// Whether an unfinished pod wired to `ds` may read a version other than
/// the current one: it was let through with another, or with none recorded
/// (let through before versions were tracked, or not by the gate).
pub fn older_version_in_use<'a>(ds: &DataStage, pods: impl IntoIterator<Item = &'a Pod>) -> bool {
    let namespace = ds.namespace();
    let name = ds.name_any();
    let current = current(ds);
    pods.into_iter().any(|pod| {
        let finished = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let wired = pod.namespace() == namespace
            && DataRequest::of(pod).ok().flatten().is_some_and(|request| request.names.contains(&name));
        // A pod not on a node yet has mounted nothing; the gate records
        // what it lets through.
        let placed = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        !finished && wired && placed && PodVersions::of(pod).0.get(&name).map(String::as_str) != current
    })
}

/// What a versioned DataStage's places must do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Idle,
    /// Make `to` current, keeping `keep` (pods may read them).
    Switch {
        /// The version the run staged.
        to: SnapshotDigest,
        /// Versions to keep beside it.
        keep: Vec<SnapshotDigest>,
    },
    /// Remove every version but `current`.
    Prune {
        /// The current version.
        current: SnapshotDigest,
    },
}

impl Step {
    /// The stager's command for this step on a place laid out as `layout`.
    pub fn cli(&self, layout: &DataLayout) -> Option<StagerCli> {
        let (to, keep) = match self {
            Step::Idle => return None,
            Step::Switch { to, keep } => (to.clone(), keep.clone()),
            Step::Prune { current } => (current.clone(), Vec::new()),
        };
        let command = StagerCommand::Switch {
            directory: layout.data.clone().into(),
            to,
            keep,
            shared_objects: layout.shared_objects.clone().map(Into::into),
        };
        Some(StagerCli { command, log_format: LogFormat::Json, progress: ProgressMode::Never })
    }

    fn suffix(&self) -> &'static str {
        match self {
            Step::Idle => "",
            Step::Switch { .. } => "switch",
            Step::Prune { .. } => "prune",
        }
    }
}

/// The next step of `ds`, whose status for run `run` is `status` (the
/// aggregate of its workers), on `places` (the workers whose node or claim
/// holds the data), given whether a pod may read an older version (see
/// [`older_version_in_use`]). A place whose `current` is not the staged
/// version (a new version, a node that joined, a copy staged again after
/// an eviction) is switched.
pub fn next_step(status: &DataStageStatus, run: i64, places: &[&str], older_in_use: bool) -> Step {
    let versions = status.versions.clone().unwrap_or_default();
    let run_done = status.run == Some(run) && status.phase == Some(Phase::Succeeded);
    let staged = status.snapshot.as_ref().and_then(|s| s.digest.parse::<SnapshotDigest>().ok());
    let digest = |text: &Option<String>| text.as_deref().and_then(|d| d.parse::<SnapshotDigest>().ok());
    let (current, previous) = (digest(&versions.current), digest(&versions.previous));
    let behind = |to: &SnapshotDigest| places.iter().any(|place| !place_holds(status, place, to));
    match staged {
        Some(to) if run_done && (current.as_ref() != Some(&to) || behind(&to)) => {
            let kept_previous = previous.filter(|_| versions.previous_kept == Some(true));
            let mut keep: Vec<SnapshotDigest> = current.into_iter().chain(kept_previous).filter(|d| d != &to).collect();
            keep.sort();
            keep.dedup();
            Step::Switch { to, keep }
        }
        _ if run_done && versions.previous_kept == Some(true) && !older_in_use => {
            current.map_or(Step::Idle, |current| Step::Prune { current })
        }
        _ => Step::Idle,
    }
}

/// Whether `place`'s `current` names `version`, as its last switch left it.
pub fn place_holds(status: &DataStageStatus, place: &str, version: &SnapshotDigest) -> bool {
    status.workers.iter().find(|w| w.name == place).and_then(|w| w.current_version.as_deref()) == Some(version.as_str())
}

/// `status` after `step` completed on every place at `now`, with `source`
/// the source the run staged.
pub fn completed(status: &mut DataStageStatus, step: &Step, source: &str, now: &Time) {
    let versions = status.versions.get_or_insert_with(VersionsStatus::default);
    match step {
        Step::Idle => {}
        // A place that joined caught up with the current version.
        Step::Switch { to, .. } if versions.current.as_deref() == Some(to.as_str()) => {}
        Step::Switch { to, .. } => {
            if let Some(old) = versions.current.take() {
                versions.previous = Some(old);
                versions.previous_source = versions.current_source.take();
                versions.previous_kept = Some(true);
            }
            versions.current = Some(to.to_string());
            versions.current_source = Some(source.to_owned());
            versions.switch_time = Some(now.clone());
        }
        Step::Prune { .. } => versions.previous_kept = Some(false),
    }
}

/// The name of `step`'s Job on `worker`'s place in run `run`.
pub fn job_name(home: &Home, worker: &Worker, run: i64, step: &Step) -> String {
    home.name(&worker.name, &format!("-r{run}-{}", step.suffix()))
}

/// The Job that carries out `step` on `worker`'s place: the operator's
/// stager image, the same volume and node as the workers, no credentials,
/// in the workers' home. Owned there (by the DataStage, or its anchor), so
/// its changes wake it.
pub fn build_job(
    ds: &DataStage,
    plan: &Plan<'_>,
    worker: &Worker,
    run: i64,
    step: &Step,
    defaults: &WorkerDefaults,
) -> Option<Job> {
    let layout = data_layout(ds, plan, defaults);
    let cli = step.cli(&layout)?;
    let home = defaults.home(ds, plan);
    let short = ShortJob {
        name: job_name(&home, worker, run, step),
        labels: crate::jobs::labels(&home, (VERSIONS_LABEL, &worker.name), Some(run)),
        owned: true,
    };
    Some(short.build(ds, plan, &layout, worker, &cli, defaults))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_crds::SnapshotStatus;
    use serde_json::json;

    const D1: &str = "11111111111111111111111111111111";
    const D2: &str = "22222222222222222222222222222222";
    const D3: &str = "33333333333333333333333333333333";

    fn digest(text: &str) -> SnapshotDigest {
        text.parse().unwrap()
    }

    /// The status of run `run` on node `n1`, whose `current` is the
    /// DataStage's current version.
    fn status(run: i64, phase: Phase, staged: &str, versions: Option<VersionsStatus>) -> DataStageStatus {
        let on_n1 = versions.as_ref().and_then(|v| v.current.clone());
        DataStageStatus {
            run: Some(run),
            phase: Some(phase),
            snapshot: Some(SnapshotStatus { objects: 1, bytes: 1, digest: staged.into(), revision: None }),
            versions,
            workers: vec![ferry_crds::WorkerStatus {
                name: "n1".into(),
                current_version: on_n1,
                ..ferry_crds::WorkerStatus::default()
            }],
            ..DataStageStatus::default()
        }
    }

    const PLACES: &[&str] = &["n1"];

    fn versions(current: &str, previous: Option<&str>, kept: bool) -> Option<VersionsStatus> {
        Some(VersionsStatus {
            current: Some(current.into()),
            previous: previous.map(Into::into),
            previous_kept: previous.map(|_| kept),
            ..VersionsStatus::default()
        })
    }

    #[test]
    fn a_finished_run_switches_keeping_what_pods_may_read_then_prunes_once_nobody_can() {
        // The first version: nothing to keep.
        let first = status(1, Phase::Succeeded, D1, None);
        assert_eq!(next_step(&first, 1, PLACES, false), Step::Switch { to: digest(D1), keep: vec![] });
        // Not before the run is over, nor for an older run.
        assert_eq!(next_step(&status(1, Phase::Running, D1, None), 1, PLACES, false), Step::Idle);
        assert_eq!(next_step(&first, 2, PLACES, false), Step::Idle);

        let mut now = status(2, Phase::Succeeded, D2, versions(D1, None, false));
        assert_eq!(next_step(&now, 2, PLACES, false), Step::Switch { to: digest(D2), keep: vec![digest(D1)] });
        completed(&mut now, &Step::Switch { to: digest(D2), keep: vec![] }, "s3://m/v2", &Time(jiff::Timestamp::now()));
        now.workers[0].current_version = Some(D2.into());
        let recorded = now.versions.clone().unwrap();
        assert_eq!(
            (recorded.current.as_deref(), recorded.previous.as_deref(), recorded.previous_kept),
            (Some(D2), Some(D1), Some(true))
        );
        assert_eq!(recorded.current_source.as_deref(), Some("s3://m/v2"));
        // Kept while a pod may read it, pruned after.
        assert_eq!(next_step(&now, 2, PLACES, true), Step::Idle);
        assert_eq!(next_step(&now, 2, PLACES, false), Step::Prune { current: digest(D2) });
        completed(&mut now, &Step::Prune { current: digest(D2) }, "s3://m/v2", &Time(jiff::Timestamp::now()));
        assert_eq!(next_step(&now, 2, PLACES, false), Step::Idle);
    }

    #[test]
    fn a_switch_before_the_previous_went_keeps_both() {
        let now = status(3, Phase::Succeeded, D3, versions(D2, Some(D1), true));
        assert_eq!(
            next_step(&now, 3, PLACES, true),
            Step::Switch { to: digest(D3), keep: vec![digest(D1), digest(D2)] }
        );
        // Back to the kept previous version: it is the target, not kept.
        let back = status(3, Phase::Succeeded, D1, versions(D2, Some(D1), true));
        assert_eq!(next_step(&back, 3, PLACES, true), Step::Switch { to: digest(D1), keep: vec![digest(D2)] });
        // A re-sync that found nothing new switches nothing.
        let same = status(3, Phase::Succeeded, D2, versions(D2, Some(D1), false));
        assert_eq!(next_step(&same, 3, PLACES, false), Step::Idle);
        // ... but a node that joined, or was staged again after an
        // eviction, has no `current` yet: it is switched, and the versions
        // stay as they were.
        let step = next_step(&same, 3, &["n1", "n2"], false);
        assert_eq!(step, Step::Switch { to: digest(D2), keep: vec![] });
        let mut caught_up = same.clone();
        completed(&mut caught_up, &step, "s3://m/v2", &Time(jiff::Timestamp::now()));
        assert_eq!(caught_up.versions, same.versions);
    }

    fn pod(annotation: Option<&str>, node: Option<&str>, phase: &str) -> Pod {
        let mut annotations = serde_json::Map::new();
        if let Some(value) = annotation {
            annotations.insert(POD_VERSIONS_ANNOTATION.into(), json!(value));
        }
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"ferry.dev/datastage": "llama"}, "annotations": annotations},
            "spec": {"containers": [{"name": "c"}], "nodeName": node},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_holds_an_older_version_unless_it_was_let_through_with_the_current_one() {
        let ds: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "llama", "namespace": "ns"},
            "spec": {"source": {"uri": "s3://m/v2"}, "destination": {"volume": {"hostPath": "/mnt/ferry/llama"}}, "updateStrategy": "Versioned"},
            "status": {"versions": {"current": D2}},
        }))
        .unwrap();
        let with = |v: &str| PodVersions(BTreeMap::from([("llama".to_owned(), v.to_owned())])).to_annotation();
        assert!(older_version_in_use(&ds, [&pod(Some(&with(D1)), Some("n1"), "Running")]));
        assert!(older_version_in_use(&ds, [&pod(None, Some("n1"), "Running")]), "unknown counts as older");
        assert!(!older_version_in_use(&ds, [&pod(Some(&with(D2)), Some("n1"), "Running")]));
        assert!(!older_version_in_use(&ds, [&pod(Some(&with(D1)), Some("n1"), "Succeeded")]));
        assert!(!older_version_in_use(&ds, [&pod(None, None, "Pending")]), "not on a node: mounted nothing");
        assert_eq!(PodVersions::current([&ds]).0.get("llama").map(String::as_str), Some(D2));
    }
}
