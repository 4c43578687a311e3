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

use ferry_contract::cli::COMPLETION_INDEX_ENV;
pub use ferry_contract::cli::{LogFormat, StagerCli as Cli, StagerCommand as Command, TransferOptions};
use ferry_contract::{ExitStatus, Shard};

use crate::ObjectLocation;
use crate::metrics::Metrics;
use crate::progress::Progress;
use crate::selection::Selection;
use crate::store::ObjectStore;
use crate::store::gcs::{GcsOptions, GcsStore};
use crate::store::s3::{S3Options, S3Store};
use crate::transfer::capacity::CapacityCheck;
use crate::transfer::tally::{Failure, Operation, Summary, one_line};
use crate::transfer::{Engine, RetryPolicy, TransferConfig, TransferError, pull, push};
/// The shard this process copies: `--shard I/N`, or with `--shards N` the
/// index an Indexed Job gives its pod in `$JOB_COMPLETION_INDEX`.
///
/// # Errors
/// `--shards` without a usable completion index.
fn shard(options: &TransferOptions) -> Result<Option<Shard>, TransferError> {
    let Some(count) = options.shards else { return Ok(options.shard) };
    let index = std::env::var(COMPLETION_INDEX_ENV).unwrap_or_default();
    format!("{index}/{count}").parse().map(Some).map_err(|_| {
        TransferError::Config(format!(
            "--shards {count} takes this pod's shard from ${COMPLETION_INDEX_ENV} (set by an Indexed Job), which is '{index}'; run it in an Indexed Job or use --shard INDEX/{count}"
        ))
    })
}

/// The part size of a run: `--part-size`, else the engine's default.
fn part_size(options: &TransferOptions) -> u64 {
    options.part_size.as_ref().map_or(TransferConfig::default().part_size, |s| s.bytes())
}

/// The engine's configuration from the command line.
fn config(options: &TransferOptions) -> Result<TransferConfig, TransferError> {
    let selection = Selection::new(&options.include, &options.exclude, shard(options)?)
        .map_err(|e| TransferError::Config(e.to_string()))?;
    let part_size = part_size(options);
    Ok(TransferConfig {
        concurrency: options.concurrency as usize,
        part_size,
        // A part size the user chose is taken as the range size too.
        grow_ranges: options.part_size.is_none(),
        multipart_threshold: options.multipart_threshold.as_ref().map_or(part_size, |s| s.bytes()),
        write_buffer: options.write_buffer.bytes(),
        memory_limit: options.memory_limit.bytes(),
        verify: options.verify,
        retry: RetryPolicy { max_attempts: options.max_attempts, ..RetryPolicy::default() },
        stall_timeout: options.stall_timeout,
        max_bandwidth: options.max_bandwidth.as_ref().map(|s| s.bytes()),
        selection,
        capacity: (!options.no_capacity_check).then(|| CapacityCheck::with_reserve(options.capacity_reserve.bytes())),
    })
}

/// The store a location names, configured from the command line.
async fn store(options: &TransferOptions, location: &ObjectLocation) -> Arc<dyn ObjectStore> {
    if location.scheme == "gs" {
        // The emulator convention of Google's own client libraries.
        let emulator = std::env::var("STORAGE_EMULATOR_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .map(|host| if host.contains("://") { host } else { format!("http://{host}") });
        let gcs = GcsOptions {
            endpoint_url: options.endpoint_url.clone().or_else(|| emulator.clone()),
            anonymous: options.anonymous || emulator.is_some(),
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
        };
        return Arc::new(GcsStore::connect(&location.bucket, &gcs).await);
    }
    let s3 = S3Options {
        endpoint_url: options.endpoint_url.clone(),
        // S3-compatible servers rarely care about the region; defaulting
        // it here spares a lookup in instance metadata that cannot succeed.
        region: options.region.clone().or_else(|| options.endpoint_url.as_ref().map(|_| "us-east-1".to_owned())),
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
    };
    Arc::new(S3Store::connect(&location.bucket, &s3).await)
}

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match &cli.command {
        Command::Pull { source, destination, options } => {
            transfer(&cli, Transfer::Pull { source, destination }, options).await
        }
        Command::Push { source, destination, options } => {
            if options.delete_removed {
                eprintln!("ferry-stager: push failed: --delete-removed applies to pulls only");
                return ExitStatus::Usage.into();
            }
            if part_size(options) < 5 << 20 {
                eprintln!("ferry-stager: push failed: --part-size must be at least 5MiB, the smallest part S3 accepts");
                return ExitStatus::Usage.into();
            }
            transfer(&cli, Transfer::Push { source, destination }, options).await
        }
        Command::Wait { target, node, snapshot, timeout } => {
            match crate::wait::wait(target, node.as_deref(), snapshot.as_deref(), *timeout).await {
                Ok(()) => ExitStatus::Success.into(),
                Err(error) => {
                    eprintln!("ferry-stager: wait failed: {}", crate::error_chain(&error));
                    ExitStatus::Incomplete.into()
                }
            }
        }
        Command::Clean { directory } => match crate::local::clean::clean(directory) {
            Ok(report) => {
                println!("{}", serde_json::to_string(&report).expect("the report serializes"));
                eprintln!(
                    "ferry-stager: removed {} staged files ({} bytes) from '{}'; kept {} changed since staged",
                    report.files_removed,
                    report.bytes_freed,
                    directory.display(),
                    report.kept.len()
                );
                ExitStatus::Success.into()
            }
            Err(error) => {
                eprintln!("ferry-stager: clean failed: {}", crate::error_chain(&error));
                ExitStatus::Incomplete.into()
            }
        },
    }
}

/// One copy, either way.
#[derive(Clone, Copy, Debug)]
enum Transfer<'a> {
    Pull { source: &'a ObjectLocation, destination: &'a Path },
    Push { source: &'a Path, destination: &'a ObjectLocation },
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
        Transfer::Push { source, destination } => (source.display().to_string(), destination.to_string()),
    };
    let (summary, status) = match execute(cli, job, options).await {
        Ok(summary) => {
            eprintln!("ferry-stager: {}", one_line(&summary));
            let status = if summary.complete { ExitStatus::Success } else { ExitStatus::Incomplete };
            (summary, status)
        }
        Err(error) => {
            let message = crate::error_chain(&error);
            eprintln!("ferry-stager: {operation:?} failed: {message}");
            let failed = Summary {
                operation,
                source,
                destination,
                complete: false,
                peak_rss_bytes: crate::transfer::tally::peak_rss_bytes(),
                failures: vec![Failure { key: String::new(), error: message }],
                reason: Some(error.reason()),
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

async fn execute(cli: &Cli, job: Transfer<'_>, options: &TransferOptions) -> Result<Summary, TransferError> {
    let config = config(options)?;
    let metrics = Arc::new(Metrics::new());
    if let Some(addr) = options.metrics_addr {
        let bound = crate::metrics::serve(addr, Arc::clone(&metrics))
            .await
            .map_err(|e| TransferError::Config(format!("cannot serve metrics on {addr}: {e}")))?;
        tracing::info!(%bound, "serving metrics on /metrics");
    }
    let location = match job {
        Transfer::Pull { source, .. } => source,
        Transfer::Push { destination, .. } => destination,
    };
    let store = store(options, location).await;
    let engine = Engine::new(store, config, metrics)?;
    let progress = Progress::start(cli.progress, Arc::clone(&engine.tally));
    let reporter = match (&options.report_to, &options.worker) {
        (Some(target), Some(worker)) => {
            let (namespace, name) = target
                .split_once('/')
                .ok_or_else(|| TransferError::Config(format!("--report-to {target}: expected NAMESPACE/NAME")))?;
            let target = crate::report::ReportTarget {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                worker: worker.clone(),
                node: options.node_name.clone(),
            };
            Some(tokio::spawn(crate::report::report(target, Arc::clone(&engine.tally))))
        }
        _ => None,
    };
    let result = match job {
        Transfer::Pull { source, destination } => {
            pull::pull(engine, &source.prefix, destination, options.delete_removed).await
        }
        Transfer::Push { source, destination } => push::push(engine, source, &destination.prefix).await,
    };
    if let Some(progress) = progress {
        progress.finish();
    }
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    result
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[test]
    fn shards_come_from_the_flag_or_the_completion_index() {
        let options = |args: &[&str]| {
            let cli = Cli::parse_from(["ferry-stager", "pull", "s3://b/p", "/d"].iter().chain(args));
            let Command::Pull { options, .. } = cli.command else { unreachable!() };
            options
        };
        assert_eq!(shard(&options(&["--shard", "1/3"])).unwrap(), Some(Shard { index: 1, count: 3 }));
        assert_eq!(shard(&options(&[])).unwrap(), None);
        // No Indexed Job around the test: the message says what is missing.
        if std::env::var_os(COMPLETION_INDEX_ENV).is_none() {
            let error = shard(&options(&["--shards", "3"])).unwrap_err().to_string();
            assert!(error.contains("JOB_COMPLETION_INDEX"), "{error}");
        }
    }
}
