//! The stager's command line as types. The stager parses it
//! ([`StagerCli`] is its `clap` definition) and the operator renders it
//! ([`StagerCli::to_args`]), so a flag cannot be spelled two ways: a
//! property test checks that parsing what `to_args` writes gives back the
//! same value for every field.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::location::ObjectLocation;
pub use crate::options::*;
pub use crate::ownership::{Owner, Purpose};

/// Parallel, verified, resumable copies between object storage and local disks.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(name = "ferry-stager", version, about, max_term_width = 100)]
pub struct StagerCli {
    /// What to do.
    #[command(subcommand)]
    pub command: StagerCommand,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text", env = "FERRY_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Progress bar: auto draws one when stderr is a terminal.
    #[arg(long, global = true, value_enum, default_value = "auto")]
    pub progress: ProgressMode,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// When to draw the progress bar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProgressMode {
    /// When stderr is a terminal.
    Auto,
    /// Always: a bar on a terminal, periodic log lines otherwise.
    Always,
    /// Never.
    Never,
}

/// The stager's subcommands.
#[derive(Clone, Debug, PartialEq, Subcommand)]
pub enum StagerCommand {
    /// Copy every object under s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or the files of
    /// oci://REGISTRY/REPOSITORY:TAG into DIR (keys become relative paths).
    Pull {
        /// Source, e.g. s3://datasets/imagenet/train
        source: ObjectLocation,
        /// Destination directory (created if missing).
        destination: PathBuf,
        /// How to copy.
        #[command(flatten)]
        options: TransferOptions,
    },
    /// Copy every file below DIR to s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX (relative paths become keys).
    Push {
        /// Source directory.
        source: PathBuf,
        /// Destination, e.g. s3://checkpoints/run-42
        destination: ObjectLocation,
        /// Fail (reason SourceEmpty, exit 4) when no file below the source is selected, instead of succeeding with nothing pushed.
        #[arg(long)]
        require_files: bool,
        /// How to copy.
        #[command(flatten)]
        options: TransferOptions,
    },
    /// Wait until a DataStage's data is in place on this node (for init containers).
    Wait {
        /// The DataStage, as NAMESPACE/NAME.
        target: String,
        /// This node's name [default: $NODE_NAME]; without one, wait for the whole DataStage.
        #[arg(long, env = "NODE_NAME")]
        node: Option<String>,
        /// Wait until the data in place is this snapshot (its digest, from the DataStage's status.snapshot).
        #[arg(long, value_name = "DIGEST")]
        snapshot: Option<String>,
        /// Give up after this long (e.g. 30m); default: wait indefinitely.
        #[arg(long, value_parser = humantime::parse_duration)]
        timeout: Option<Duration>,
    },
    /// Remove what earlier pulls staged into DIR (files changed since are kept).
    Clean {
        /// The directory pulls staged into.
        directory: PathBuf,
        /// The pulls' shared-objects directory: objects no directory links any more are removed from it too.
        #[arg(long, value_name = "DIR")]
        shared_objects: Option<PathBuf>,
    },
    /// Make version DIGEST of a versioned DIR current (one rename: a reader sees the old version or the new one, whole), then remove the versions neither current nor kept.
    Switch {
        /// The versioned directory (what `pull --versions` staged into).
        directory: PathBuf,
        /// The version to make current: its snapshot digest (built by `pull --versions build`, or already held).
        #[arg(long, value_name = "DIGEST")]
        to: crate::versions::SnapshotDigest,
        /// Versions to keep beside it (pods may still read them); every other one is removed.
        #[arg(long, value_name = "DIGEST")]
        keep: Vec<crate::versions::SnapshotDigest>,
        /// The shared-objects directory the versions link into, when not the directory's own.
        #[arg(long, value_name = "DIR")]
        shared_objects: Option<PathBuf>,
    },
    /// Make a node-local DIR usable by the unprivileged worker user before it runs (needs CAP_CHOWN, CAP_DAC_OVERRIDE and CAP_FOWNER, nothing else; symlinks are never followed).
    Prepare {
        /// The directory (created if missing).
        directory: PathBuf,
        /// What the worker will do there: pull hands it the whole tree (directories readable by all); push only its state directory (.ferry), leaving the files to push as they are.
        #[arg(long = "for", value_enum)]
        purpose: Purpose,
        /// The worker's user and group.
        #[arg(long, value_name = "UID:GID")]
        owner: Owner,
        /// A pull's shared-objects directory, created if missing and handed to the worker (the directory and its objects/ only: the objects in it are the workers' already).
        #[arg(long, value_name = "DIR")]
        shared_objects: Option<PathBuf>,
    },
}

/// Adds `--flag=value` when there is a value; the `=` keeps a value that
/// starts with `-` (a glob, a worker name) from being read as a flag.
fn option(args: &mut Vec<String>, flag: &str, value: Option<impl ToString>) {
    if let Some(value) = value {
        args.push(format!("{flag}={}", value.to_string()));
    }
}

/// Adds `--flag` when set.
fn switch(args: &mut Vec<String>, flag: &str, on: bool) {
    if on {
        args.push(flag.to_owned());
    }
}

fn value_name(value: impl ValueEnum) -> String {
    value.to_possible_value().expect("no skipped variants").get_name().to_owned()
}

impl StagerCli {
    /// The arguments (without the program name) that parse back into
    /// `self`. Every option is written out, defaults included, so the
    /// stager's defaults cannot drift from what the operator meant.
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        option(&mut args, "--log-format", Some(value_name(self.log_format)));
        option(&mut args, "--progress", Some(value_name(self.progress)));
        // Options first, then `--` and the positionals, so that no value
        // (a path, a URI) is ever taken for a flag.
        let positionals = match &self.command {
            StagerCommand::Pull { source, destination, options } => {
                args.push("pull".to_owned());
                options.write_args(&mut args);
                vec![source.to_string(), destination.display().to_string()]
            }
            StagerCommand::Push { source, destination, require_files, options } => {
                args.push("push".to_owned());
                switch(&mut args, "--require-files", *require_files);
                options.write_args(&mut args);
                vec![source.display().to_string(), destination.to_string()]
            }
            StagerCommand::Wait { target, node, snapshot, timeout } => {
                args.push("wait".to_owned());
                option(&mut args, "--node", node.as_ref());
                option(&mut args, "--snapshot", snapshot.as_ref());
                option(&mut args, "--timeout", timeout.map(humantime::format_duration));
                vec![target.clone()]
            }
            StagerCommand::Clean { directory, shared_objects } => {
                args.push("clean".to_owned());
                option(&mut args, "--shared-objects", shared_objects.as_ref().map(|p| p.display().to_string()));
                vec![directory.display().to_string()]
            }
            StagerCommand::Switch { directory, to, keep, shared_objects } => {
                args.push("switch".to_owned());
                option(&mut args, "--to", Some(to));
                for digest in keep {
                    option(&mut args, "--keep", Some(digest));
                }
                option(&mut args, "--shared-objects", shared_objects.as_ref().map(|p| p.display().to_string()));
                vec![directory.display().to_string()]
            }
            StagerCommand::Prepare { directory, purpose, owner, shared_objects } => {
                args.push("prepare".to_owned());
                option(&mut args, "--for", Some(value_name(*purpose)));
                option(&mut args, "--owner", Some(owner));
                option(&mut args, "--shared-objects", shared_objects.as_ref().map(|p| p.display().to_string()));
                vec![directory.display().to_string()]
            }
        };
        args.push("--".to_owned());
        args.extend(positionals);
        args
    }
}

impl TransferOptions {
    fn write_args(&self, args: &mut Vec<String>) {
        let o = self;
        option(args, "--endpoint-url", o.endpoint_url.as_ref());
        switch(args, "--anonymous", o.anonymous);
        option(args, "--region", o.region.as_ref());
        let w = &o.web_identity;
        option(args, "--web-identity-token-file", w.web_identity_token_file.as_ref().map(|p| p.display().to_string()));
        option(args, "--role-arn", w.role_arn.as_ref());
        option(args, "--sts-endpoint", w.sts_endpoint.as_ref());
        option(args, "--role-session-name", w.role_session_name.as_ref());
        option(args, "--concurrency", Some(o.concurrency));
        option(args, "--part-size", o.part_size.as_ref());
        option(args, "--multipart-threshold", o.multipart_threshold.as_ref());
        for glob in &o.include {
            option(args, "--include", Some(glob));
        }
        for glob in &o.exclude {
            option(args, "--exclude", Some(glob));
        }
        option(args, "--shard", o.shard);
        option(args, "--shards", o.shards);
        option(args, "--verify", Some(value_name(o.verify)));
        option(args, "--memory-limit", Some(&o.memory_limit));
        option(args, "--write-buffer", Some(&o.write_buffer));
        switch(args, "--delete-removed", o.delete_removed);
        option(args, "--versions", o.versions.map(value_name));
        option(args, "--capacity-reserve", Some(&o.capacity_reserve));
        switch(args, "--no-capacity-check", o.no_capacity_check);
        option(args, "--dataset-quota", o.dataset_quota.as_ref());
        option(args, "--shared-objects", o.shared_objects.as_ref().map(|p| p.display().to_string()));
        option(args, "--capacity-claimed", o.capacity_claimed.as_ref());
        option(args, "--metrics-addr", o.metrics_addr);
        option(args, "--summary-file", o.summary_file.as_ref().map(|p| p.display().to_string()));
        option(args, "--termination-log", o.termination_log.as_ref().map(|p| p.display().to_string()));
        option(args, "--max-bandwidth", o.max_bandwidth.as_ref());
        option(args, "--max-request-rate", o.max_request_rate);
        option(args, "--store-share", o.store_share);
        option(args, "--report-to", o.report_to.as_ref());
        option(args, "--worker", o.worker.as_ref());
        option(args, "--node-name", o.node_name.as_ref());
        option(args, "--max-attempts", Some(o.max_attempts));
        option(args, "--connect-timeout", Some(humantime::format_duration(o.connect_timeout)));
        option(args, "--request-timeout", Some(humantime::format_duration(o.request_timeout)));
        option(args, "--stall-timeout", Some(humantime::format_duration(o.stall_timeout)));
        let p = &o.peers;
        if !p.peer_group.is_empty() {
            option(args, "--peer-group", Some(p.peer_group.join(",")));
        }
        if !p.peer_owners.is_empty() {
            option(args, "--peer-owners", Some(p.peer_owners.join(",")));
        }
        option(args, "--peer-listen", p.peer_listen);
        for peer in &p.peers {
            option(args, "--peer", Some(peer));
        }
        option(args, "--peer-serve-bandwidth", p.peer_serve_bandwidth.as_ref());
        option(args, "--peer-timeout", Some(humantime::format_duration(p.peer_timeout)));
        option(args, "--peer-linger", Some(humantime::format_duration(p.peer_linger)));
        option(args, "--peer-tls", p.peer_tls.as_ref().map(|d| d.display().to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::StoreShare;
    use crate::disk::CapacityClaims;
    use crate::peers::{PeerAddress, PeerOptions};
    use crate::size::{ByteSize, CapacityReserve};
    use crate::versions::VersionsMode;
    use clap::{CommandFactory as _, FromArgMatches as _};
    use proptest::prelude::*;
    use std::net::SocketAddr;

    #[test]
    fn the_cli_definition_is_consistent() {
        StagerCli::command().debug_assert();
    }

    /// Parses like the stager does, but ignoring the environment: a
    /// variable set on the test machine must not stand in for a flag.
    fn parse(args: &[String]) -> Result<StagerCli, clap::Error> {
        let command =
            StagerCli::command().mut_args(|arg| arg.env(None)).mut_subcommands(|sub| sub.mut_args(|arg| arg.env(None)));
        let matches =
            command.try_get_matches_from(std::iter::once("ferry-stager".to_owned()).chain(args.iter().cloned()))?;
        StagerCli::from_arg_matches(&matches)
    }

    fn size() -> impl Strategy<Value = ByteSize> {
        ("[1-9][0-9]{0,5}", prop_oneof!["", "k", "Ki", "KiB", "M", "Mi", "MiB", "MB", "G", "GiB", "T"])
            .prop_map(|(digits, unit)| format!("{digits}{unit}").parse().unwrap())
    }

    fn duration() -> impl Strategy<Value = Duration> {
        (0u64..100_000, 0u32..1000).prop_map(|(s, ms)| Duration::from_secs(s) + Duration::from_millis(u64::from(ms)))
    }

    fn text() -> impl Strategy<Value = String> {
        // Values as users write them, including ones that look like flags.
        "[-a-zA-Z0-9_./*?{},:=]{1,20}"
    }

    fn location() -> impl Strategy<Value = ObjectLocation> {
        (
            proptest::sample::select(crate::Scheme::ALL.to_vec()),
            "[a-z0-9][a-z0-9.-]{1,10}[a-z0-9]",
            "([a-z0-9_]{1,8}/){0,3}",
        )
            .prop_map(|(scheme, bucket, prefix)| match scheme {
                crate::Scheme::Oci => format!("oci://{bucket}:5000/{prefix}model:v1").parse().unwrap(),
                crate::Scheme::Hf => {
                    // A repository name the Hub allows: no `..`, `--` or
                    // dot or dash at either end.
                    let name: String = bucket.chars().filter(char::is_ascii_alphanumeric).collect();
                    format!("hf://datasets/acme/{name}@v1/{prefix}").parse().unwrap()
                }
                _ => format!("{scheme}://{bucket}/{prefix}").parse().unwrap(),
            })
    }

    fn options() -> impl Strategy<Value = TransferOptions> {
        let store = (
            proptest::option::of("https?://[a-z]{1,8}:[0-9]{2,4}"),
            any::<bool>(),
            proptest::option::of("[a-z]{2}-[a-z]{4}-[1-9]"),
        );
        let tuning = (
            prop_oneof![Just(Concurrency::Adaptive), (1u32..=MAX_CONCURRENCY).prop_map(Concurrency::Fixed)],
            proptest::option::of(size()),
            proptest::option::of(size()),
            proptest::collection::vec(text(), 0..3),
            proptest::collection::vec(text(), 0..3),
            prop_oneof![
                Just((None, None)),
                (1u32..50)
                    .prop_flat_map(|count| (0..count).prop_map(move |index| (Some(Shard { index, count }), None))),
                (1u32..=1000).prop_map(|count| (None, Some(count))),
            ],
            prop_oneof![Just(VerifyMode::None), Just(VerifyMode::Size), Just(VerifyMode::Checksum)],
            size(),
            size(),
            any::<bool>(),
            proptest::option::of(prop_oneof![Just(VersionsMode::Build), Just(VersionsMode::Switch)]),
        );
        let reporting = (
            proptest::option::of((any::<[u8; 4]>(), 1u16..).prop_map(|(ip, port)| SocketAddr::from((ip, port)))),
            proptest::option::of("/[a-z/]{1,20}"),
            proptest::option::of("/[a-z/]{1,20}"),
            proptest::option::of(size()),
            proptest::option::of(("[a-z0-9-]{1,10}", "[a-z0-9-]{1,10}").prop_map(|(n, d)| format!("{n}/{d}"))),
            proptest::option::of("[a-z0-9-]{1,20}"),
            proptest::option::of("[a-z0-9-]{1,20}"),
        );
        let share = (proptest::option::of(1u32..), proptest::option::of(1u64..))
            .prop_map(|(requests_per_second, bytes_per_second)| StoreShare { requests_per_second, bytes_per_second });
        let retries =
            (1u32..=100, duration(), duration(), duration(), proptest::option::of(1u32..), proptest::option::of(share));
        let reserve = prop_oneof![
            size().prop_map(|size| CapacityReserve::Size(Some(size))),
            Just(CapacityReserve::Size(None)),
            (0u8..100).prop_map(CapacityReserve::Percent),
        ];
        let claims = proptest::collection::btree_map("[0-9]{1,3}:[0-9]{1,3}", 1u64.., 1..4).prop_map(|map| {
            let mut claims = CapacityClaims::default();
            map.iter().for_each(|(filesystem, bytes)| claims.add(filesystem, *bytes));
            claims
        });
        let capacity = (
            reserve,
            any::<bool>(),
            proptest::option::of(size()),
            proptest::option::of(claims),
            proptest::option::of("/[a-z0-9./-]{1,20}"),
        );
        let fleet = (
            proptest::collection::vec("[a-z0-9-]{1,10}", 0..4),
            proptest::collection::vec(
                ("[a-z0-9-]{1,10}", any::<[u8; 4]>(), 1u16..)
                    .prop_map(|(name, ip, port)| PeerAddress { name, addr: SocketAddr::from((ip, port)) }),
                0..3,
            ),
            proptest::option::of(size()),
            duration(),
            duration(),
            proptest::option::of("/[a-z0-9/]{1,20}"),
        );
        let web_identity = (
            proptest::option::of("/[a-z/]{1,20}"),
            proptest::option::of("arn:[a-z]{1,5}:iam::[0-9]{0,12}:role/[a-zA-Z0-9_-]{1,20}"),
            proptest::option::of("https?://[a-z0-9.]{1,20}(:[0-9]{1,5})?"),
            proptest::option::of("[a-zA-Z0-9_=,.@-]{2,20}"),
        );
        let all = (store, tuning, reporting, retries, capacity, fleet, web_identity);
        all.prop_map(|(store, tuning, reporting, retries, capacity, fleet, web_identity)| {
            let (endpoint_url, anonymous, region) = store;
            let (web_identity_token_file, role_arn, sts_endpoint, role_session_name) = web_identity;
            // --web-identity-token-file needs --role-arn.
            let role_arn =
                if web_identity_token_file.is_some() { role_arn.or_else(|| Some("r".into())) } else { role_arn };
            let web_identity = WebIdentityOptions {
                web_identity_token_file: web_identity_token_file.map(PathBuf::from),
                role_arn,
                sts_endpoint,
                role_session_name,
            };
            let (
                concurrency,
                part_size,
                multipart_threshold,
                include,
                exclude,
                (shard, shards),
                verify,
                memory_limit,
                write_buffer,
                delete_removed,
                versions,
            ) = tuning;
            let (metrics_addr, summary_file, termination_log, max_bandwidth, report_to, worker, node_name) = reporting;
            // --report-to needs --worker.
            let (peer_group, peers, peer_serve_bandwidth, peer_timeout, peer_linger, peer_tls) = fleet;
            // --report-to and --peer-group need --worker; --peer-group needs --peer-listen.
            let grouped = !peer_group.is_empty();
            // --peer-owners needs --peer-group: some of its members.
            let peer_owners: Vec<String> = peer_group.iter().skip(1).cloned().collect();
            let worker = if report_to.is_some() || grouped { worker.or_else(|| Some("w".into())) } else { worker };
            let peer_listen = grouped.then(|| SocketAddr::from(([10, 0, 0, 7], 9466)));
            let (max_attempts, connect_timeout, request_timeout, stall_timeout, max_request_rate, store_share) =
                retries;
            let (capacity_reserve, no_capacity_check, dataset_quota, capacity_claimed, shared_objects) = capacity;
            TransferOptions {
                endpoint_url,
                anonymous,
                region,
                web_identity,
                concurrency,
                part_size,
                multipart_threshold,
                include,
                exclude,
                shard,
                shards,
                verify,
                memory_limit,
                write_buffer,
                delete_removed,
                versions,
                capacity_reserve,
                no_capacity_check,
                dataset_quota,
                capacity_claimed,
                shared_objects: shared_objects.map(PathBuf::from),
                metrics_addr,
                summary_file: summary_file.map(PathBuf::from),
                termination_log: termination_log.map(PathBuf::from),
                max_bandwidth,
                max_request_rate,
                store_share,
                report_to,
                worker,
                node_name,
                max_attempts,
                connect_timeout,
                request_timeout,
                stall_timeout,
                peers: PeerOptions {
                    peer_group,
                    peer_owners,
                    peer_listen,
                    peers,
                    peer_serve_bandwidth,
                    peer_timeout,
                    peer_linger,
                    peer_tls: peer_tls.map(PathBuf::from),
                },
            }
        })
    }

    fn command() -> impl Strategy<Value = StagerCommand> {
        prop_oneof![
            (location(), "/[a-z0-9/]{1,20}", options()).prop_map(|(source, destination, options)| {
                StagerCommand::Pull { source, destination: destination.into(), options }
            }),
            ("/[a-z0-9/]{1,20}", location(), any::<bool>(), options()).prop_map(
                |(source, destination, require_files, options)| StagerCommand::Push {
                    source: source.into(),
                    destination,
                    require_files,
                    options
                }
            ),
            (
                "[a-z0-9-]{1,10}/[a-z0-9-]{1,10}",
                proptest::option::of("[a-z0-9-]{1,20}"),
                proptest::option::of("[0-9a-f]{32}"),
                proptest::option::of(duration())
            )
                .prop_map(|(target, node, snapshot, timeout)| StagerCommand::Wait {
                    target,
                    node,
                    snapshot,
                    timeout
                }),
            ("/[a-z0-9/]{1,20}", proptest::option::of("/[a-z0-9/.-]{1,20}")).prop_map(|(directory, shared)| {
                StagerCommand::Clean { directory: directory.into(), shared_objects: shared.map(PathBuf::from) }
            }),
            (
                "/[a-z0-9/]{1,20}",
                "[0-9a-f]{32}",
                proptest::collection::vec("[0-9a-f]{32}", 0..3),
                proptest::option::of("/[a-z0-9/.-]{1,20}")
            )
                .prop_map(|(directory, to, keep, shared)| StagerCommand::Switch {
                    directory: directory.into(),
                    to: to.parse().unwrap(),
                    keep: keep.iter().map(|d| d.parse().unwrap()).collect(),
                    shared_objects: shared.map(PathBuf::from),
                }),
            (
                "/[a-z0-9/]{1,20}",
                prop_oneof![Just(Purpose::Pull), Just(Purpose::Push)],
                any::<(u32, u32)>(),
                proptest::option::of("/[a-z0-9/.-]{1,20}")
            )
                .prop_map(|(directory, purpose, (uid, gid), shared)| StagerCommand::Prepare {
                    directory: directory.into(),
                    purpose,
                    owner: Owner { uid, gid },
                    shared_objects: shared.map(PathBuf::from),
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// parse(to_args(a)) == a, for every field of every subcommand.
        #[test]
        fn every_command_line_parses_back_into_what_rendered_it(
            command in command(),
            log_format in prop_oneof![Just(LogFormat::Text), Just(LogFormat::Json)],
            progress in prop_oneof![Just(ProgressMode::Auto), Just(ProgressMode::Always), Just(ProgressMode::Never)],
        ) {
            let cli = StagerCli { command, log_format, progress };
            let args = cli.to_args();
            let parsed = parse(&args).map_err(|e| TestCaseError::fail(format!("{args:?}: {e}")))?;
            prop_assert_eq!(parsed, cli);
        }
    }

    #[test]
    fn defaults_are_what_an_empty_command_line_means() {
        let parsed = parse(&["pull".into(), "s3://b/p".into(), "/d".into()]).unwrap();
        let StagerCommand::Pull { options, .. } = parsed.command else { panic!("a pull") };
        assert_eq!(options, TransferOptions::default());
    }
}
