//! The command line: parsing, wiring a run together, and the exit code.
//!
//! Exit codes: 0 when every selected object is in place and verified; 1 when
//! the run finished but some objects failed or were refused; 3 when the run
//! could not proceed at all (bucket missing, credentials refused, endpoint
//! unreachable, destination unusable) and another attempt might; 4 when it
//! could not proceed and retrying without a change cannot help (credentials
//! refused, bucket missing, invalid configuration); 2 for usage errors. The
//! operator's Jobs fail at once on 2 and 4 instead of retrying.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::location::ObjectLocation;
use crate::metrics::Metrics;
use crate::progress::{Progress, ProgressMode};
use crate::selection::{Selection, Shard};
use crate::store::ObjectStore;
use crate::store::gcs::{GcsOptions, GcsStore};
use crate::store::s3::{S3Options, S3Store};
use crate::transfer::tally::{Failure, Summary};
use crate::transfer::{Engine, RetryPolicy, TransferConfig, TransferError, VerifyMode, pull, push};

/// Parallel, verified, resumable copies between object storage and local disks.
#[derive(Debug, Parser)]
#[command(name = "ferry-stager", version, about, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text", env = "FERRY_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Progress bar: auto draws one when stderr is a terminal.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    progress: ProgressMode,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Copy every object under s3://BUCKET/PREFIX or gs://BUCKET/PREFIX into DIR (keys become relative paths).
    Pull {
        /// Source, e.g. s3://datasets/imagenet/train
        source: ObjectLocation,
        /// Destination directory (created if missing).
        destination: PathBuf,
        #[command(flatten)]
        options: TransferArgs,
    },
    /// Wait until a DataStage's data is in place on this node (for init containers).
    Wait {
        /// The DataStage, as NAMESPACE/NAME.
        target: String,
        /// This node's name [default: $NODE_NAME]; without one, wait for the whole DataStage.
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// Give up after this long (e.g. 30m); default: wait indefinitely.
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
    },
    /// Remove what earlier pulls staged into DIR (files changed since are kept).
    Clean {
        /// The directory pulls staged into.
        directory: PathBuf,
    },
    /// Copy every file below DIR to s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (relative paths become keys).
    Push {
        /// Source directory.
        source: PathBuf,
        /// Destination, e.g. s3://checkpoints/run-42
        destination: ObjectLocation,
        #[command(flatten)]
        options: TransferArgs,
    },
}

#[derive(Debug, Args)]
struct TransferArgs {
    /// S3-compatible endpoint, e.g. http://minio:9000 (enables path-style addressing);
    /// for gs://, a GCS endpoint such as an emulator's.
    #[arg(long, env = "FERRY_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// gs:// only: send no credentials (public buckets, emulators). Implied by
    /// STORAGE_EMULATOR_HOST, which also sets the endpoint.
    #[arg(long, env = "FERRY_ANONYMOUS")]
    anonymous: bool,
    /// Region; default from the AWS configuration chain (us-east-1 with --endpoint-url).
    #[arg(long, env = "AWS_REGION")]
    region: Option<String>,
    /// Requests in flight, shared by all objects.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    /// Part size for uploads and range size for downloads (e.g. 16MiB) [default: 8MiB, with
    /// download ranges growing for objects larger than concurrency x 8MiB, up to 64MiB].
    #[arg(long, value_parser = parse_size)]
    part_size: Option<u64>,
    /// Files above this size are uploaded as multipart uploads [default: the part size].
    #[arg(long, value_parser = parse_size)]
    multipart_threshold: Option<u64>,
    /// Only copy keys matching this glob (relative to the prefix; `*` crosses `/`). Repeatable.
    #[arg(long)]
    include: Vec<String>,
    /// Skip keys matching this glob. Repeatable; wins over --include.
    #[arg(long)]
    exclude: Vec<String>,
    /// Copy only partition INDEX of COUNT (e.g. 0/3), for sharding one transfer over workers.
    #[arg(long, value_name = "INDEX/COUNT")]
    shard: Option<Shard>,
    /// How to verify pulled files before they are renamed into place.
    #[arg(long, value_enum, default_value = "checksum")]
    verify: VerifyMode,
    /// Upper bound for transfer buffers (e.g. 256MiB).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    memory_limit: u64,
    /// Bytes buffered per download request between disk writes.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    write_buffer: u64,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9464).
    #[arg(long)]
    metrics_addr: Option<SocketAddr>,
    /// Write a JSON summary (objects, bytes, seconds, throughput, failures) here.
    #[arg(long)]
    summary_file: Option<PathBuf>,
    /// Cap on bytes per second for the whole run (e.g. 200MiB); unlimited by default.
    #[arg(long, value_parser = parse_size)]
    max_bandwidth: Option<u64>,
    /// Write live progress into this DataStage's status (NAMESPACE/NAME), as worker --worker.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "worker")]
    report_to: Option<String>,
    /// This worker's name in the DataStage's status (with --report-to).
    #[arg(long)]
    worker: Option<String>,
    /// This worker's node, reported with its progress.
    #[arg(long, env = "NODE_NAME", hide = true)]
    node_name: Option<String>,
    /// Attempts per request, including the first.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=100))]
    max_attempts: u32,
    /// Time allowed to connect to the store.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Time allowed for one request until its response headers arrive.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// Abort (and retry) a response body that delivers no data for this long.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    stall_timeout: Duration,
}

/// Parses sizes like `8MiB`, `64k`, `1G` or plain bytes (binary units).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let value: u64 = digits.parse().map_err(|_| format!("'{text}' is not a size like 8MiB or 1048576"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("unknown unit in '{text}'; use KiB, MiB, GiB or TiB")),
    };
    value.checked_mul(multiplier).filter(|&v| v > 0).ok_or_else(|| format!("'{text}' is out of range"))
}

impl TransferArgs {
    fn part_size(&self) -> u64 {
        self.part_size.unwrap_or(TransferConfig::default().part_size)
    }

    fn config(&self) -> Result<TransferConfig, TransferError> {
        let selection = Selection::new(&self.include, &self.exclude, self.shard)
            .map_err(|e| TransferError::Config(e.to_string()))?;
        let part_size = self.part_size();
        Ok(TransferConfig {
            concurrency: self.concurrency as usize,
            part_size,
            // A part size the user chose is taken as the range size too.
            grow_ranges: self.part_size.is_none(),
            multipart_threshold: self.multipart_threshold.unwrap_or(part_size),
            write_buffer: self.write_buffer,
            memory_limit: self.memory_limit,
            verify: self.verify,
            retry: RetryPolicy { max_attempts: self.max_attempts, ..RetryPolicy::default() },
            stall_timeout: self.stall_timeout,
            max_bandwidth: self.max_bandwidth,
            selection,
        })
    }

    async fn store(&self, location: &ObjectLocation) -> Arc<dyn ObjectStore> {
        if location.scheme == "gs" {
            // The emulator convention of Google's own client libraries.
            let emulator = std::env::var("STORAGE_EMULATOR_HOST")
                .ok()
                .filter(|h| !h.is_empty())
                .map(|host| if host.contains("://") { host } else { format!("http://{host}") });
            let options = GcsOptions {
                endpoint_url: self.endpoint_url.clone().or_else(|| emulator.clone()),
                anonymous: self.anonymous || emulator.is_some(),
                connect_timeout: self.connect_timeout,
                request_timeout: self.request_timeout,
            };
            return Arc::new(GcsStore::connect(&location.bucket, &options).await);
        }
        let options = S3Options {
            endpoint_url: self.endpoint_url.clone(),
            // S3-compatible servers rarely care about the region; defaulting
            // it here spares a lookup in instance metadata that cannot succeed.
            region: self.region.clone().or_else(|| self.endpoint_url.as_ref().map(|_| "us-east-1".to_owned())),
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
        };
        Arc::new(S3Store::connect(&location.bucket, &options).await)
    }
}

/// Exit code when the run could not proceed at all.
const EXIT_RUN_FAILED: u8 = 3;
/// Exit code when the run could not proceed and retrying cannot help.
const EXIT_RUN_REFUSED: u8 = 4;

/// Runs the parsed command and returns the process exit code.
pub async fn run(cli: Cli) -> ExitCode {
    match &cli.command {
        Command::Pull { source, destination, options } => {
            transfer(&cli, Transfer::Pull { source, destination }, options).await
        }
        Command::Push { source, destination, options } => {
            if options.part_size() < 5 << 20 {
                eprintln!("ferry-stager: push failed: --part-size must be at least 5MiB, the smallest part S3 accepts");
                return ExitCode::from(2);
            }
            transfer(&cli, Transfer::Push { source, destination }, options).await
        }
        Command::Wait { target, node, timeout } => match crate::wait::wait(target, node.as_deref(), *timeout).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("ferry-stager: wait failed: {}", crate::error_chain(&error));
                ExitCode::FAILURE
            }
        },
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
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("ferry-stager: clean failed: {}", crate::error_chain(&error));
                ExitCode::FAILURE
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
    fn operation(self) -> &'static str {
        match self {
            Transfer::Pull { .. } => "pull",
            Transfer::Push { .. } => "push",
        }
    }
}

async fn transfer(cli: &Cli, job: Transfer<'_>, options: &TransferArgs) -> ExitCode {
    let operation = job.operation();
    let (source_text, destination_text) = match job {
        Transfer::Pull { source, destination } => (source.to_string(), destination.display().to_string()),
        Transfer::Push { source, destination } => (source.display().to_string(), destination.to_string()),
    };
    let summary = match execute(cli, job, options).await {
        Ok(summary) => summary,
        Err(error) => {
            let message = crate::error_chain(&error);
            eprintln!("ferry-stager: {operation} failed: {message}");
            let failed = Summary {
                operation: operation.to_owned(),
                source: source_text,
                destination: destination_text,
                complete: false,
                objects: crate::transfer::tally::ObjectCounts { selected: 0, transferred: 0, skipped: 0, failed: 0 },
                bytes: crate::transfer::tally::ByteCounts { selected: 0, transferred: 0, skipped: 0 },
                verified: crate::transfer::tally::VerifiedCounts { checksum: 0, size_only: 0 },
                retries: 0,
                seconds: 0.0,
                throughput_bytes_per_second: 0.0,
                peak_rss_bytes: crate::transfer::tally::peak_rss_bytes(),
                failures: vec![Failure { key: String::new(), error: message }],
                reason: Some(error.reason().to_owned()),
            };
            write_summary(options.summary_file.as_ref(), &failed);
            return ExitCode::from(if error.is_permanent() { EXIT_RUN_REFUSED } else { EXIT_RUN_FAILED });
        }
    };
    write_summary(options.summary_file.as_ref(), &summary);
    eprintln!("ferry-stager: {}", summary.one_line());
    if summary.complete { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

async fn execute(cli: &Cli, job: Transfer<'_>, options: &TransferArgs) -> Result<Summary, TransferError> {
    let config = options.config()?;
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
    let store = options.store(location).await;
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
        Transfer::Pull { source, destination } => pull::pull(engine, &source.prefix, destination).await,
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
    let json = serde_json::to_vec_pretty(summary).expect("summary serializes");
    if let Err(error) = std::fs::write(path, json) {
        eprintln!("ferry-stager: cannot write summary to '{}': {error}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8MiB"), Ok(8 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("8XB").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("MiB").is_err());
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
