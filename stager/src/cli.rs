//! Running a parsed command line: wiring a run together and choosing the
//! exit code. The command line itself (flags, defaults, exit codes) is
//! defined once in `ferry_contract`, which the operator renders from.
//!
//! Exit codes ([`ExitStatus`]): 0 when every selected object is in place
//! and verified; 1 when the run finished but some objects failed or were
//! refused; 3 when the run could not proceed at all and another attempt
//! might; 4 when it could not proceed and retrying without a change cannot
//! help; 2 for usage errors. The operator's Jobs fail at once on 2 and 4.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use ferry_contract::ExitStatus;
pub use ferry_contract::cli::{LogFormat, StagerCli as Cli, StagerCommand as Command, TransferOptions};
use ferry_contract::versions::VersionsMode;
use ferry_engine::ObjectLocation;
use ferry_engine::local::versions::{Switched, VersionedDir, VersionsError};
use ferry_engine::metrics::Metrics;
use ferry_engine::options;
use ferry_engine::transfer::tally::{Failure, Operation, Summary, one_line};
use ferry_engine::transfer::{Engine, TransferConfig, TransferError, pull, push};

use crate::progress::Progress;

/// How long a budgeted worker waits for its first report's answer (and the
/// store budget share it carries) before its first request to the store.
const FIRST_SHARE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match &cli.command {
        Command::Pull { source, destination, options } => {
            transfer(&cli, Transfer::Pull { source, destination }, options).await
        }
        Command::Push { source, destination, require_files, options } => {
            if let Err(error) = options::check_push(options) {
                eprintln!("ferry-stager: push failed: {error}");
                return ExitStatus::Usage.into();
            }
            transfer(&cli, Transfer::Push { source, destination, require_files: *require_files }, options).await
        }
        Command::Wait { target, node, snapshot, timeout } => {
            match crate::wait::wait(target, node.as_deref(), snapshot.as_deref(), *timeout).await {
                Ok(()) => ExitStatus::Success.into(),
                Err(error) => {
                    eprintln!("ferry-stager: wait failed: {}", ferry_engine::error_chain(&error));
                    ExitStatus::Incomplete.into()
                }
            }
        }
        Command::Clean { directory, shared_objects } => {
            match ferry_engine::local::clean::clean(directory, shared_objects.as_deref()) {
                Ok(report) => {
                    println!("{}", serde_json::to_string(&report).expect("the report serializes"));
                    eprintln!(
                        "ferry-stager: removed {} staged files ({} bytes) from '{}'; kept {} changed since staged",
                        report.files_removed,
                        report.bytes_freed,
                        directory.display(),
                        report.kept.len() as u64 + report.kept_not_listed
                    );
                    if let (Some(shared), Some(collected)) = (shared_objects, report.shared_objects) {
                        eprintln!(
                            "ferry-stager: removed {} objects ({} bytes) no directory links any more from '{}'; {} still linked",
                            collected.objects_removed,
                            collected.bytes_freed,
                            shared.display(),
                            collected.objects_kept
                        );
                    }
                    ExitStatus::Success.into()
                }
                Err(error) => {
                    eprintln!("ferry-stager: clean failed: {}", ferry_engine::error_chain(&error));
                    ExitStatus::Incomplete.into()
                }
            }
        }
        Command::Switch { directory, to, keep, shared_objects } => {
            let versions = VersionedDir::new(directory);
            match versions.switch(to, keep, shared_objects.as_deref()) {
                Ok(switched) => {
                    println!("{}", serde_json::to_string(&switched).expect("the report serializes"));
                    announce_switch(directory, &switched);
                    ExitStatus::Success.into()
                }
                Err(error) => {
                    eprintln!("ferry-stager: switch failed: {}", ferry_engine::error_chain(&error));
                    match error {
                        // Another attempt finds the same directory.
                        VersionsError::NoSuchVersion { .. }
                        | VersionsError::NotWhatWasBuilt { .. }
                        | VersionsError::NotALink(_) => ExitStatus::RunRefused.into(),
                        VersionsError::Busy(_) | VersionsError::Io { .. } => ExitStatus::RunFailed.into(),
                    }
                }
            }
        }
        Command::Prepare { directory, purpose, owner, shared_objects } => {
            let shared = shared_objects.as_deref();
            match ferry_engine::local::ownership::prepare(directory, *purpose, *owner, shared) {
                Ok(prepared) => {
                    eprintln!(
                        "ferry-stager: '{}' ready for the worker ({owner}) to {purpose:?}: {} of {} entries handed over",
                        directory.display(),
                        prepared.changed,
                        prepared.entries
                    );
                    ExitStatus::Success.into()
                }
                // Without the capabilities, or with a link where the state
                // belongs, another attempt cannot help.
                Err(error) => {
                    eprintln!("ferry-stager: prepare failed: {}", ferry_engine::error_chain(&error));
                    ExitStatus::RunRefused.into()
                }
            }
        }
    }
}

/// One copy, either way.
#[derive(Clone, Copy, Debug)]
enum Transfer<'a> {
    Pull { source: &'a ObjectLocation, destination: &'a Path },
    Push { source: &'a Path, destination: &'a ObjectLocation, require_files: bool },
}

impl Transfer<'_> {
    fn operation(self) -> Operation {
        match self {
            Transfer::Pull { .. } => Operation::Pull,
            Transfer::Push { .. } => Operation::Push,
        }
    }
}

async fn transfer(cli: &Cli, job: Transfer<'_>, options: &TransferOptions) -> ExitCode {
    let operation = job.operation();
    let (source, destination) = match job {
        Transfer::Pull { source, destination } => (source.to_string(), destination.display().to_string()),
        Transfer::Push { source, destination, .. } => (source.display().to_string(), destination.to_string()),
    };
    let (summary, status) = match execute(cli, job, options).await {
        Ok(summary) => {
            eprintln!("ferry-stager: {}", one_line(&summary));
            let status = if summary.complete { ExitStatus::Success } else { ExitStatus::Incomplete };
            (summary, status)
        }
        Err(error) => {
            let message = ferry_engine::error_chain(&error);
            eprintln!("ferry-stager: {operation:?} failed: {message}");
            let failed = Summary {
                operation,
                source,
                destination,
                complete: false,
                peak_rss_bytes: ferry_engine::transfer::tally::peak_rss_bytes(),
                failures: vec![Failure { key: String::new(), error: message }],
                reason: Some(error.reason()),
                dataset_bytes: match &error {
                    TransferError::Quota { dataset_bytes, .. } => Some(*dataset_bytes),
                    _ => None,
                },
                disk: error.disk().cloned(),
                ..Summary::default()
            };
            (failed, if error.is_permanent() { ExitStatus::RunRefused } else { ExitStatus::RunFailed })
        }
    };
    write_summary(options.summary_file.as_ref(), &summary);
    if let Some(path) = &options.termination_log {
        write_file(path, summary.termination_message().as_bytes());
    }
    status.into()
}

/// Wires one run together and carries it out.
///
/// Long on purpose: the run's wiring in the order it happens (config,
/// versions, metrics, store, fleet, engine, progress, reporting, the
/// transfer, then what follows it), each step taking what the ones before
/// made; split, the values would be threaded through helpers in the same
/// order.
async fn execute(cli: &Cli, job: Transfer<'_>, options: &TransferOptions) -> Result<Summary, TransferError> {
    if let Transfer::Push { destination, .. } = job {
        options::check_push_destination(destination)?;
    }
    let mut config = TransferConfig::from_options(options)?;
    // A versioned pull builds beside the current version, linking what the
    // versions already hold (their own objects, or the node's shared ones).
    let versioned = match (job, options.versions) {
        (Transfer::Pull { source, destination }, Some(mode)) => {
            if mode == VersionsMode::Switch && config.selection.shard().is_some() {
                return Err(TransferError::Config(
                    "--versions switch needs the whole dataset: a shard cannot tell whether the version is complete; use --versions build and `ferry-stager switch` once every shard is done".into(),
                ));
            }
            let versions = VersionedDir::new(destination);
            let inputs = format!("{source}\n{:?}\n{:?}\n{:?}", options.include, options.exclude, options.endpoint_url);
            let building = tokio::task::spawn_blocking({
                let versions = versions.clone();
                move || versions.prepare_build(&inputs)
            })
            .await
            .expect("preparing the build panicked")
            .map_err(|error| TransferError::Config(ferry_engine::error_chain(&error)))?;
            if config.shared_objects.is_none() {
                config.shared_objects = Some(ferry_engine::transfer::SharedObjectsDir {
                    dir: versions.versions_dir().to_owned(),
                    endpoint: options.endpoint_url.clone(),
                });
            }
            Some((versions, building, mode))
        }
        _ => None,
    };
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = options.metrics_addr {
        let bound = crate::metrics_endpoint::serve(addr, Arc::clone(&metrics))
            .await
            .map_err(|e| TransferError::Config(format!("cannot serve metrics on {addr}: {e}")))?;
        tracing::info!(%bound, "serving metrics on /metrics");
    }
    let location = match job {
        Transfer::Pull { source, .. } => source,
        Transfer::Push { destination, .. } => destination,
    };
    let store = ferry_store::connect(options, location)
        .await
        .map_err(|source| TransferError::Store { uri: location.to_string(), source })?;
    // Fleet staging is for pulls: a push reads one node's directory.
    let peering = match job {
        Transfer::Pull { .. } => crate::peers::start(options, &metrics).await?.map(Arc::new),
        Transfer::Push { .. } => None,
    };
    let engine = match &peering {
        Some(peering) => Engine::in_fleet(store, config, metrics, Arc::clone(&peering.fleet))?,
        None => Engine::new(store, config, metrics)?,
    };
    let progress = Progress::start(cli.progress, Arc::clone(&engine.tally));
    // The engine moves into the transfer; reporting needs it after.
    let engine_for_report = Arc::clone(&engine);
    let report_target = match (&options.report_to, &options.worker) {
        (Some(target), Some(worker)) => {
            let (namespace, name) = target
                .split_once('/')
                .ok_or_else(|| TransferError::Config(format!("--report-to {target}: expected NAMESPACE/NAME")))?;
            Some(crate::report::ReportTarget {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                worker: worker.clone(),
                node: options.node_name.clone(),
            })
        }
        _ => None,
    };
    let (first_answer, first_answered) = tokio::sync::oneshot::channel();
    let reporter = report_target
        .clone()
        .map(|target| tokio::spawn(crate::report::report(target, Arc::clone(&engine), peering.clone(), first_answer)));
    // A budgeted worker takes the split as it stands before its first
    // request: the share on its command line was decided when its Job was
    // made, and DataStages that started since may have lowered it. The
    // first report brings it back; a slow API only delays the start.
    let budgeted = reporter.is_some() && engine.config.store_share.is_some();
    if budgeted && tokio::time::timeout(FIRST_SHARE_PATIENCE, first_answered).await.is_err() {
        tracing::warn!(
            patience = ?FIRST_SHARE_PATIENCE,
            "no word on the store budget share from the Kubernetes API; starting with the one this worker was given"
        );
    }
    let mut result = match job {
        Transfer::Pull { source, destination } => match &versioned {
            // The build is a directory of its own that only this version
            // fills: what left the store leaves it.
            Some((versions, building, mode)) => {
                pull::pull(engine, &source.prefix, building, true).await.and_then(|summary| {
                    if *mode == VersionsMode::Switch {
                        switch_after_build(versions, &summary, options.shared_objects.as_deref())?;
                    }
                    Ok(summary)
                })
            }
            None => pull::pull(engine, &source.prefix, destination, options.delete_removed).await,
        },
        Transfer::Push { source, destination, require_files } => {
            push::push(engine, source, &destination.prefix).await.and_then(|summary| {
                // Refused files make the run incomplete on their own.
                if require_files && summary.objects.selected == 0 && summary.objects.failed == 0 {
                    Err(TransferError::SourceEmpty { path: source.to_path_buf() })
                } else {
                    Ok(summary)
                }
            })
        }
    };
    if let Some(progress) = progress {
        progress.finish();
    }
    // Peers still staging read from this worker until they are done.
    if let (Some(peering), Ok(summary)) = (&peering, &mut result) {
        peering.fleet.linger().await;
        summary.peers = peering.fleet.counts();
    }
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    if let (Some(_), Some(target)) = (&peering, &report_target) {
        crate::report::withdraw(target, &engine_for_report).await;
    }
    result
}

/// `pull --versions switch`: makes the version just built current, keeping
/// the one it replaces (a reader may still have it open).
fn switch_after_build(versions: &VersionedDir, summary: &Summary, shared: Option<&Path>) -> Result<(), TransferError> {
    let Some(snapshot) = summary.snapshot.as_ref().filter(|_| summary.complete) else {
        tracing::warn!("the version is incomplete: the current one stays");
        return Ok(());
    };
    let refused = |error: VersionsError| TransferError::Config(ferry_engine::error_chain(&error));
    let digest = snapshot
        .digest
        .parse()
        .map_err(|e: ferry_contract::versions::NotADigest| TransferError::Config(e.to_string()))?;
    let keep: Vec<_> = versions.current().map_err(refused)?.into_iter().collect();
    let switched = versions.switch(&digest, &keep, shared).map_err(refused)?;
    announce_switch(versions.dir(), &switched);
    Ok(())
}

/// Says on stderr what a switch did to `directory`.
fn announce_switch(directory: &Path, switched: &Switched) {
    let name = |digest: &Option<ferry_contract::SnapshotDigest>| {
        digest.as_ref().map_or_else(|| "nothing".to_owned(), ToString::to_string)
    };
    eprintln!(
        "ferry-stager: '{}' current: {} (was {}){}; removed {} versions, {} objects ({} bytes) no version links any more",
        directory.display(),
        name(&switched.to),
        name(&switched.from),
        if switched.sealed { "" } else { ", already on disk: nothing copied" },
        switched.removed.len(),
        switched.collected.objects_removed,
        switched.collected.bytes_freed
    );
}

fn write_summary(path: Option<&PathBuf>, summary: &Summary) {
    let Some(path) = path else { return };
    write_file(path, &serde_json::to_vec_pretty(summary).expect("summary serializes"));
}

fn write_file(path: &Path, contents: &[u8]) {
    if let Err(error) = std::fs::write(path, contents) {
        eprintln!("ferry-stager: cannot write summary to '{}': {error}", path.display());
    }
}
