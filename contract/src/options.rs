//! What a transfer can be told, without the command line around it: the
//! options (the CLI's flags, the Python package's keyword arguments), their
//! defaults, verification modes and shards. The `cli` feature adds the
//! `clap` definition the stager parses and the operator renders from
//! ([`crate::cli`]); the engine and the Python package use these types
//! without it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::peers::PeerOptions;
use crate::size::{ByteSize, CapacityReserve};

/// The fewest requests an adaptive run keeps in flight.
pub const ADAPTIVE_MIN_CONCURRENCY: u32 = 4;
/// Requests in flight when an adaptive run starts, before it has measured
/// anything.
pub const ADAPTIVE_START_CONCURRENCY: u32 = 8;
/// The most requests an adaptive run puts in flight.
pub const ADAPTIVE_MAX_CONCURRENCY: u32 = 256;
/// The most requests in flight that can be asked for.
pub const MAX_CONCURRENCY: u32 = 4096;
/// Bound on a worker's transfer buffers unless told otherwise.
pub const DEFAULT_MEMORY_LIMIT: &str = "256MiB";
/// Free space a pull leaves on its destination's filesystem unless told
/// otherwise: room for the manifest, the partial records and whatever else
/// writes there meanwhile.
pub const DEFAULT_CAPACITY_RESERVE: &str = "64MiB";
/// Environment variable an Indexed Job sets to a pod's completion index;
/// with `--shards N` it picks the pod's shard.
pub const COMPLETION_INDEX_ENV: &str = "JOB_COMPLETION_INDEX";

/// How much checking a pull does before a file is renamed into place.
/// In a DataStage it is written `None`, `Size` or `Checksum`; on the
/// command line in lower case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum VerifyMode {
    /// Trust the transport (bodies are still length-checked by HTTP).
    None,
    /// Check every file's size against the store's.
    Size,
    /// Check size, and the store's checksum (CRC32C/CRC32, or the MD5 ETag of
    /// a single-part object) whenever it offers one.
    #[default]
    Checksum,
}

/// Options of a pull or a push.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct TransferOptions {
    /// S3-compatible endpoint, e.g. http://minio:9000 (enables path-style addressing);
    /// for gs://, a GCS endpoint such as an emulator's; for az://, the account's blob endpoint
    /// (default https://ACCOUNT.blob.core.windows.net); for oci://, the registry's URL, e.g.
    /// http://HOST:PORT for one without TLS.
    #[cfg_attr(feature = "cli", arg(long, env = "FERRY_ENDPOINT_URL"))]
    pub endpoint_url: Option<String>,
    /// gs://, az:// and oci:// only: send no credentials (public buckets, containers and
    /// repositories, emulators). Implied by
    /// STORAGE_EMULATOR_HOST, which also sets the endpoint.
    #[cfg_attr(feature = "cli", arg(long, env = "FERRY_ANONYMOUS"))]
    pub anonymous: bool,
    /// Region; default from the AWS configuration chain (us-east-1 with --endpoint-url).
    #[cfg_attr(feature = "cli", arg(long, env = "AWS_REGION"))]
    pub region: Option<String>,
    /// s3:// only: credentials from an OpenID token exchanged at STS.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub web_identity: WebIdentityOptions,
    /// Requests in flight, shared by all objects: a number, or `auto` to start at 8 and
    /// follow the throughput the run measures (between 4 and 256; halved when the store
    /// throttles).
    #[cfg_attr(feature = "cli", arg(long, default_value = "auto"))]
    pub concurrency: Concurrency,
    /// Part size for uploads and range size for downloads (e.g. 16MiB) [default: 8MiB, with
    /// download ranges growing for objects larger than concurrency x 8MiB, up to 64MiB].
    #[cfg_attr(feature = "cli", arg(long))]
    pub part_size: Option<ByteSize>,
    /// Files above this size are uploaded as multipart uploads [default: the part size].
    #[cfg_attr(feature = "cli", arg(long))]
    pub multipart_threshold: Option<ByteSize>,
    /// Only copy keys matching this glob (relative to the prefix; `*` crosses `/`). Repeatable.
    #[cfg_attr(feature = "cli", arg(long))]
    pub include: Vec<String>,
    /// Skip keys matching this glob. Repeatable; wins over --include.
    #[cfg_attr(feature = "cli", arg(long))]
    pub exclude: Vec<String>,
    /// Copy only partition INDEX of COUNT (e.g. 0/3), for sharding one transfer over workers.
    #[cfg_attr(feature = "cli", arg(long, value_name = "INDEX/COUNT", conflicts_with = "shards"))]
    pub shard: Option<Shard>,
    /// Copy only this pod's partition of COUNT, its index taken from $JOB_COMPLETION_INDEX
    /// (the pods of an Indexed Job).
    #[cfg_attr(feature = "cli", arg(long, value_name = "COUNT", value_parser = clap::value_parser!(u32).range(1..=1000)))]
    pub shards: Option<u32>,
    /// How to verify pulled files before they are renamed into place.
    #[cfg_attr(feature = "cli", arg(long, value_enum, default_value = "checksum"))]
    pub verify: VerifyMode,
    /// Upper bound for transfer buffers (e.g. 256MiB).
    #[cfg_attr(feature = "cli", arg(long, default_value = DEFAULT_MEMORY_LIMIT))]
    pub memory_limit: ByteSize,
    /// Bytes buffered per download request between disk writes.
    #[cfg_attr(feature = "cli", arg(long, default_value = "1MiB"))]
    pub write_buffer: ByteSize,
    /// Pull only: remove files that earlier pulls staged from objects no longer in the
    /// store (files changed since they were staged, and files Ferry did not write, stay).
    #[cfg_attr(feature = "cli", arg(long))]
    pub delete_removed: bool,
    /// Pull only: keep versions instead of updating DIR in place. The run builds the new
    /// version beside the current one (files already held by a kept version are linked,
    /// not fetched); readers mount DIR/current, a link that changes in one rename, so a
    /// reader sees one version whole. `switch` makes it current when complete; `build`
    /// leaves that to `ferry-stager switch` (the operator's choice, once every node holds it).
    #[cfg_attr(feature = "cli", arg(long, value_enum, value_name = "WHEN"))]
    pub versions: Option<crate::versions::VersionsMode>,
    /// Pull only: free space to leave on the destination's filesystem beyond what the run
    /// writes, a size or a percentage of the filesystem's size (10%); a pull that would
    /// not leave it fails before writing (InsufficientCapacity).
    #[cfg_attr(feature = "cli", arg(long, default_value = DEFAULT_CAPACITY_RESERVE))]
    pub capacity_reserve: CapacityReserve,
    /// Pull only: skip the free-space check (a full disk still ends the run with
    /// InsufficientCapacity).
    #[cfg_attr(feature = "cli", arg(long))]
    pub no_capacity_check: bool,
    /// Pull only: the most bytes the selected dataset may hold at the destination, all
    /// shards together (e.g. 40GiB); a larger one fails with QuotaExceeded as soon as its
    /// listing shows it, before the first page that exceeds it is written. The operator
    /// sets it from the namespace's StagingQuotas.
    #[cfg_attr(feature = "cli", arg(long, value_name = "SIZE"))]
    pub dataset_quota: Option<ByteSize>,
    /// Pull only: bytes other pulls on this node are still to write, by filesystem
    /// (FILESYSTEM=BYTES,... with the device number as MAJOR:MINOR); the claim on the
    /// destination's filesystem counts as taken in the free-space check. The operator
    /// sets it from the running workers of other DataStages on the node.
    #[cfg_attr(feature = "cli", arg(long, value_name = "FS=BYTES,..."))]
    pub capacity_claimed: Option<crate::disk::CapacityClaims>,
    /// Pull only: a directory on the destination's filesystem where pulls share their
    /// files: an object another pull on this filesystem staged is linked into place
    /// instead of fetched, so it takes its space once. The operator sets it for hostPath
    /// pulls (ROOT/.ferry-shared below their allowed root).
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub shared_objects: Option<PathBuf>,
    /// Serve Prometheus metrics on this address (e.g. 0.0.0.0:9464).
    #[cfg_attr(feature = "cli", arg(long))]
    pub metrics_addr: Option<SocketAddr>,
    /// Write a JSON summary (objects, bytes, seconds, throughput, failures) here.
    #[cfg_attr(feature = "cli", arg(long))]
    pub summary_file: Option<PathBuf>,
    /// Write the summary as compact JSON that fits a pod's termination message (4 KiB) here.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PATH"))]
    pub termination_log: Option<PathBuf>,
    /// Cap on bytes per second for the whole run (e.g. 200MiB); unlimited by default.
    #[cfg_attr(feature = "cli", arg(long))]
    pub max_bandwidth: Option<ByteSize>,
    /// Cap on requests per second to the store for the whole run (listing, reads,
    /// uploads, every retry); unlimited by default.
    #[cfg_attr(feature = "cli", arg(long, value_name = "PER_SECOND", value_parser = clap::value_parser!(u32).range(1..)))]
    pub max_request_rate: Option<u32>,
    /// This worker's share of a StoreBudget, per second (set by the operator;
    /// as workers come and go it follows the share in the DataStage's status,
    /// read back with --report-to). Tightens --max-request-rate and --max-bandwidth, never loosens them.
    #[cfg_attr(feature = "cli", arg(long, value_name = "requests=N,bytes=N"))]
    pub store_share: Option<crate::budget::StoreShare>,
    /// Write live progress into this DataStage's status (NAMESPACE/NAME), as worker --worker.
    #[cfg_attr(feature = "cli", arg(long, value_name = "NAMESPACE/NAME", requires = "worker"))]
    pub report_to: Option<String>,
    /// This worker's name in the DataStage's status (with --report-to).
    #[cfg_attr(feature = "cli", arg(long))]
    pub worker: Option<String>,
    /// This worker's node, reported with its progress.
    #[cfg_attr(feature = "cli", arg(long, env = "NODE_NAME", hide = true))]
    pub node_name: Option<String>,
    /// Attempts per request, including the first.
    #[cfg_attr(feature = "cli", arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=100)))]
    pub max_attempts: u32,
    /// Time allowed to connect to the store.
    #[cfg_attr(feature = "cli", arg(long, default_value = "5s", value_parser = humantime::parse_duration))]
    pub connect_timeout: Duration,
    /// Time allowed for one request until its response headers arrive.
    #[cfg_attr(feature = "cli", arg(long, default_value = "60s", value_parser = humantime::parse_duration))]
    pub request_timeout: Duration,
    /// Abort (and retry) a response body that delivers no data for this long.
    #[cfg_attr(feature = "cli", arg(long, default_value = "30s", value_parser = humantime::parse_duration))]
    pub stall_timeout: Duration,
    /// Fleet staging: the peers this worker feeds and is fed by.
    #[cfg_attr(feature = "cli", command(flatten))]
    pub peers: PeerOptions,
}

impl Default for TransferOptions {
    /// What the command line means when no option is given.
    fn default() -> Self {
        Self {
            endpoint_url: None,
            anonymous: false,
            region: None,
            web_identity: WebIdentityOptions::default(),
            concurrency: Concurrency::Adaptive,
            part_size: None,
            multipart_threshold: None,
            include: Vec::new(),
            exclude: Vec::new(),
            shard: None,
            shards: None,
            verify: VerifyMode::Checksum,
            memory_limit: DEFAULT_MEMORY_LIMIT.parse().expect("a valid default"),
            write_buffer: "1MiB".parse().expect("a valid default"),
            delete_removed: false,
            versions: None,
            capacity_reserve: DEFAULT_CAPACITY_RESERVE.parse().expect("a valid default"),
            no_capacity_check: false,
            dataset_quota: None,
            capacity_claimed: None,
            shared_objects: None,
            metrics_addr: None,
            summary_file: None,
            termination_log: None,
            max_bandwidth: None,
            max_request_rate: None,
            store_share: None,
            report_to: None,
            worker: None,
            node_name: None,
            max_attempts: 6,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(30),
            peers: PeerOptions::default(),
        }
    }
}

/// The token file's variable, as the AWS SDKs and EKS's webhook name it.
pub const WEB_IDENTITY_TOKEN_FILE_ENV: &str = "AWS_WEB_IDENTITY_TOKEN_FILE";
/// The role's variable.
pub const ROLE_ARN_ENV: &str = "AWS_ROLE_ARN";
/// The STS endpoint's variable (the SDKs' service-specific endpoint).
pub const STS_ENDPOINT_ENV: &str = "AWS_ENDPOINT_URL_STS";
/// The session name's variable.
pub const ROLE_SESSION_NAME_ENV: &str = "AWS_ROLE_SESSION_NAME";

/// An Azure storage account's name, as the Azure CLI and SDKs read it; a
/// DataStage's credentials Secret for `az://` holds keys of these names.
pub const AZURE_STORAGE_ACCOUNT_ENV: &str = "AZURE_STORAGE_ACCOUNT";
/// The account's key (base64, as the portal shows it): requests are signed.
pub const AZURE_STORAGE_KEY_ENV: &str = "AZURE_STORAGE_KEY";
/// A shared access signature, used instead of a key when set.
pub const AZURE_STORAGE_SAS_TOKEN_ENV: &str = "AZURE_STORAGE_SAS_TOKEN";

/// The Microsoft Entra ID tenant of a service principal or a workload
/// identity: `az://` requests then carry an Entra token instead of a key.
/// These are the names the Azure SDKs read and that Azure Workload
/// Identity's webhook injects into a pod.
pub const AZURE_TENANT_ID_ENV: &str = "AZURE_TENANT_ID";
/// The application (client) id of the service principal or managed identity.
pub const AZURE_CLIENT_ID_ENV: &str = "AZURE_CLIENT_ID";
/// A service principal's client secret.
pub const AZURE_CLIENT_SECRET_ENV: &str = "AZURE_CLIENT_SECRET";
/// A file holding a federated token (Workload Identity's projected
/// service-account token), read anew for every exchange.
pub const AZURE_FEDERATED_TOKEN_FILE_ENV: &str = "AZURE_FEDERATED_TOKEN_FILE";
/// The Entra ID authority; default `https://login.microsoftonline.com/`.
pub const AZURE_AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";

/// The directory of the Docker `config.json` whose `auths` an `oci://`
/// pull authenticates with (Docker's and ORAS's own variable).
pub const DOCKER_CONFIG_ENV: &str = "DOCKER_CONFIG";

/// Credentials for an S3 store from a web identity: an OpenID token (a
/// projected Kubernetes service-account token) that the stager exchanges at
/// the store's STS (`AssumeRoleWithWebIdentity`) for temporary credentials,
/// and again before they expire, reading the file anew each time (the
/// kubelet rotates it). The flags fall back to the variables EKS's pod
/// identity webhook (IRSA) sets, so such pods need no flag at all.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct WebIdentityOptions {
    /// s3:// only: a file holding an OpenID token to exchange at STS for credentials
    /// (needs --role-arn).
    #[cfg_attr(feature = "cli", arg(long, env = WEB_IDENTITY_TOKEN_FILE_ENV, value_name = "PATH", requires = "role_arn"))]
    pub web_identity_token_file: Option<PathBuf>,
    /// The role to assume with --web-identity-token-file.
    #[cfg_attr(feature = "cli", arg(long, env = ROLE_ARN_ENV))]
    pub role_arn: Option<String>,
    /// The STS endpoint that exchanges the token, e.g. an S3-compatible store's own URL
    /// [default: AWS STS in the region].
    #[cfg_attr(feature = "cli", arg(long, env = STS_ENDPOINT_ENV, value_name = "URL"))]
    pub sts_endpoint: Option<String>,
    /// The session name the store records for the assumed role [default: ferry-stager-<time>].
    #[cfg_attr(feature = "cli", arg(long, env = ROLE_SESSION_NAME_ENV))]
    pub role_session_name: Option<String>,
}

impl WebIdentityOptions {
    /// What the environment says, as the command line reads it when no
    /// flag is given (for callers without one: the Python package).
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|value: &String| !value.is_empty());
        Self {
            web_identity_token_file: var(WEB_IDENTITY_TOKEN_FILE_ENV).map(PathBuf::from),
            role_arn: var(ROLE_ARN_ENV),
            sts_endpoint: var(STS_ENDPOINT_ENV),
            role_session_name: var(ROLE_SESSION_NAME_ENV),
        }
    }
}

/// How many requests a run keeps in flight.
///
/// A fixed number suits no workload everywhere: against a store on the
/// same machine 8 large ranges beat 32, against a distant one a hundred
/// small objects in flight are needed to hide the round trips. So by
/// default a run adapts (see the engine's `transfer::adaptive`); a number
/// pins it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Concurrency {
    /// Start at [`ADAPTIVE_START_CONCURRENCY`] and follow the measured
    /// throughput between [`ADAPTIVE_MIN_CONCURRENCY`] and
    /// [`ADAPTIVE_MAX_CONCURRENCY`].
    #[default]
    Adaptive,
    /// Exactly this many, 1 to [`MAX_CONCURRENCY`].
    Fixed(u32),
}

impl Concurrency {
    /// The most requests the run may have in flight at once: what sizes
    /// windows and ranges.
    pub fn ceiling(self) -> u32 {
        match self {
            Concurrency::Adaptive => ADAPTIVE_MAX_CONCURRENCY,
            Concurrency::Fixed(n) => n,
        }
    }
}

/// A `--concurrency` value that is neither `auto` nor a number of requests.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid concurrency '{0}': expected auto or a number from 1 to {MAX_CONCURRENCY}")]
pub struct ConcurrencyError(pub String);

impl std::str::FromStr for Concurrency {
    type Err = ConcurrencyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Concurrency::Adaptive);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=MAX_CONCURRENCY).contains(&n) => Ok(Concurrency::Fixed(n)),
            _ => Err(ConcurrencyError(s.to_owned())),
        }
    }
}

impl std::fmt::Display for Concurrency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Concurrency::Adaptive => f.write_str("auto"),
            Concurrency::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// One partition of a dataset: worker `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Zero-based index of this worker.
    pub index: u32,
    /// Number of workers.
    pub count: u32,
}

/// A `--shard` value that is not `INDEX/COUNT` with `INDEX < COUNT`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid shard '{0}': expected INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/3")]
pub struct ShardError(pub String);

impl std::str::FromStr for Shard {
    type Err = ShardError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ShardError(s.to_owned());
        let (index, count) = s.split_once('/').ok_or_else(err)?;
        let index: u32 = index.trim().parse().map_err(|_| err())?;
        let count: u32 = count.trim().parse().map_err(|_| err())?;
        if count == 0 || index >= count {
            return Err(err());
        }
        Ok(Shard { index, count })
    }
}

impl Shard {
    /// Whether `relative_key` (the key below the prefix, the path below the
    /// directory) belongs to this shard: FNV-1a of the key modulo the
    /// count, stable across runs, versions and machines, so N shards see
    /// disjoint sets whose union is everything.
    pub fn owns(&self, relative_key: &str) -> bool {
        crate::hash::fnv1a(relative_key.as_bytes()) % u64::from(self.count) == u64::from(self.index)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrency_is_auto_or_a_number_of_requests_and_prints_as_it_parses() {
        assert_eq!("auto".parse(), Ok(Concurrency::Adaptive));
        assert_eq!("AUTO".parse(), Ok(Concurrency::Adaptive));
        assert_eq!(" 8 ".parse(), Ok(Concurrency::Fixed(8)));
        assert_eq!("4096".parse(), Ok(Concurrency::Fixed(4096)));
        for bad in ["0", "4097", "-1", "", "eight", "8.5"] {
            let error = bad.parse::<Concurrency>().unwrap_err();
            assert!(error.to_string().contains("auto or a number from 1 to 4096"), "{error}");
        }
        for value in [Concurrency::Adaptive, Concurrency::Fixed(1), Concurrency::Fixed(4096)] {
            assert_eq!(value.to_string().parse(), Ok(value));
        }
        assert_eq!(TransferOptions::default().concurrency, Concurrency::Adaptive);
        assert_eq!(Concurrency::Adaptive.ceiling(), ADAPTIVE_MAX_CONCURRENCY);
        assert_eq!(Concurrency::Fixed(8).ceiling(), 8);
    }
}
