//! Real servers for Ferry's tests.
//!
//! [`S3Server::minio`] starts the pinned MinIO (installed into the cache by
//! `hack/tools.sh`) on a free loopback port with a throw-away data
//! directory, waits until it reports healthy, and stops it when dropped, so
//! every test gets its own server and leaks no process. [`S3Server::moto`]
//! does the same with moto's S3 server, which accepts object keys MinIO
//! refuses (`..` segments), for the path-traversal tests.
//!
//! [`GcsServer`] does the same with fake-gcs-server, [`AzuriteServer`] with
//! Azurite's blob service, [`RegistryServer`] with the distribution
//! project's OCI registry, [`HubServer`] with olah, a self-hosted Hugging
//! Face Hub, and [`Store`] puts MinIO, fake-gcs-server or
//! Azurite behind one interface for tests that run against every backend.
//!
//! Binaries are found through `FERRY_MINIO_BIN` / `FERRY_MOTO_BIN`, else by
//! asking `hack/tools.sh path`, which installs them on first use.

mod azure;
mod entra;
mod gcs;
mod hub;
mod peer_tls;
mod proxy;
mod registry;

pub use azure::{AZURITE_ACCOUNT, AZURITE_KEY, AzuriteServer};
pub use entra::EntraServer;
pub use gcs::{Backend, GcsServer, Store};
pub use hub::{HUB_ORG, HubServer, LFS_FROM};
pub use peer_tls::PeerCa;
pub use proxy::CorruptingProxy;
pub use registry::{REGISTRY_PASSWORD, REGISTRY_USER, RegistryServer};

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_s3::config::{Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use aws_smithy_http_client::tls;
use ferry_contract::layout::STATE_DIR;

/// How long a server may take to become healthy.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// Waits until a server just spawned as `child` answers GET `path` on
/// `port` as `ready` wants; panics with its log if it exits first or is
/// not ready within [`START_DEADLINE`].
fn wait_until_ready(
    child: &mut Child,
    name: &str,
    port: u16,
    path: &str,
    ready: impl Fn(Option<u16>) -> bool,
    log_tail: impl Fn() -> String,
) {
    wait_until(child, name, || ready(http_get_status(port, path)), log_tail);
}

/// Waits until a TLS server just spawned as `child` answers GET `url`
/// (any status) over a connection that trusts only `ca_pem`. Accepting
/// connections is not enough: the server may listen before it serves TLS,
/// and the handshake with this CA, made for this server alone, tells it
/// from another process that holds the port (seen: "tls handshake eof" on
/// the first request of a test).
fn wait_until_serving_https(child: &mut Child, name: &str, url: &str, ca_pem: &[u8], log_tail: impl Fn() -> String) {
    let ca = reqwest::Certificate::from_pem(ca_pem).expect("the test CA is PEM");
    let answers = || {
        // Its own thread and runtime: the caller may be inside a runtime.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                    let client = reqwest::Client::builder()
                        .add_root_certificate(ca.clone())
                        .timeout(Duration::from_secs(2))
                        .build()
                        .expect("an HTTP client");
                    runtime.block_on(async { client.get(url).send().await.is_ok() })
                })
                .join()
                .expect("the readiness probe panicked")
        })
    };
    wait_until(child, name, answers, log_tail);
}

/// Polls `ready` until it holds; panics with the server's log if `child`
/// exits first or [`START_DEADLINE`] passes.
fn wait_until(child: &mut Child, name: &str, ready: impl Fn() -> bool, log_tail: impl Fn() -> String) {
    let deadline = Instant::now() + START_DEADLINE;
    while !ready() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited with {status} during start-up:\n{}", log_tail());
        }
        assert!(Instant::now() < deadline, "{name} not up within {START_DEADLINE:?}:\n{}", log_tail());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The longest one request of a test client may take: a server that
/// accepts a connection and never answers fails the test with a timeout
/// instead of stalling the suite (the SDK has no read timeout of its own).
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(120);

/// The repository root (this crate lives in `testkit/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit has a parent").to_path_buf()
}

/// Path of a pinned external tool: `$FERRY_<TOOL>_BIN`, else installed by `hack/tools.sh`.
pub fn tool_path(tool: &str) -> PathBuf {
    let var = format!("FERRY_{}_BIN", tool.to_ascii_uppercase().replace('-', "_"));
    if let Ok(path) = std::env::var(&var) {
        return PathBuf::from(path);
    }
    let output = Command::new(repo_root().join("hack/tools.sh"))
        .args(["path", tool])
        .stderr(Stdio::inherit())
        .output()
        .expect("run hack/tools.sh");
    assert!(output.status.success(), "hack/tools.sh path {tool} failed");
    PathBuf::from(String::from_utf8(output.stdout).expect("utf-8 path").trim())
}

/// A free TCP port on 127.0.0.1, never one this process or another test
/// process still running handed out before, and never one the kernel hands
/// out by itself.
///
/// The port is free when asked for and bound later by the server a test
/// starts; whatever else wants a port in between must not get it. Two
/// servers of one kind on one port pass for one: the second fails to bind,
/// but the readiness probe already had its answer from the first, and the
/// test talks to another test's server until that test ends and stops it
/// (a stager suite run failed "connection refused" listing an Azurite
/// container it had just filled, 2026-12-07). The tests of a binary start
/// their servers on threads of one process, so remembering every port
/// handed out keeps them apart; the test processes run side by side (e2e
/// scenarios, each in its own, beside the stager's suite and the engine's
/// tests) share one loopback, so each port is also claimed by a lock on a
/// file named after it, held until the process exits (the kernel drops it
/// then, even after a crash; the empty files stay, at most one per port).
///
/// Neither keeps out the kernel: a port drawn from its ephemeral range is
/// the next local port of any connection or `bind(0)` on the machine once
/// the probe lets it go, and with hundreds of connections open (the suites
/// copy with many at once) one took olah's port before olah bound it (CI,
/// 2026-12-07: "address already in use" on port 44255). So ports come from
/// [`TEST_PORTS`], below the ephemeral range, which only explicit binds
/// reach; the kernel's own draw is the fallback where that range is
/// unknown or overlaps.
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeMap<u16, Option<std::fs::File>>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let claims = std::env::temp_dir().join("ferry-test-ports");
    // Without the directory (a read-only temporary directory) the process's
    // own memory still keeps its tests apart.
    let _ = std::fs::create_dir_all(&claims);
    let outside_ephemeral = ephemeral_ports().is_some_and(|ephemeral| clear_of(&ephemeral));
    loop {
        let port = if outside_ephemeral {
            let port = rand::random_range(TEST_PORTS);
            // Something that is no test (or a test's leftover) may hold it.
            if TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            port
        } else {
            TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind an ephemeral port").port()
        };
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if handed_out.contains_key(&port) {
            continue;
        }
        match claim_port(&claims, port) {
            PortClaim::Held(file) => handed_out.insert(port, Some(file)),
            PortClaim::Unavailable => handed_out.insert(port, None),
            PortClaim::Taken => continue,
        };
        return port;
    }
}

/// Where [`free_port`] draws from: below Linux's default ephemeral range
/// (32768–60999) and above the ports servers take by default (the
/// kubelets of the real nodes listen from 10250).
const TEST_PORTS: std::ops::Range<u16> = 16_384..32_768;

/// Whether [`TEST_PORTS`] and the kernel's `ephemeral` range share no port.
fn clear_of(ephemeral: &std::ops::RangeInclusive<u16>) -> bool {
    *ephemeral.start() >= TEST_PORTS.end || *ephemeral.end() < TEST_PORTS.start
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`), if
/// it can be read.
fn ephemeral_ports() -> Option<std::ops::RangeInclusive<u16>> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_port_range(&text)
}

/// Parses `ip_local_port_range`: two numbers separated by white space.
fn parse_port_range(text: &str) -> Option<std::ops::RangeInclusive<u16>> {
    let mut bounds = text.split_whitespace().map(str::parse::<u16>);
    let (Some(Ok(low)), Some(Ok(high)), None) = (bounds.next(), bounds.next(), bounds.next()) else { return None };
    Some(low..=high)
}

/// What [`claim_port`] found.
#[derive(Debug)]
enum PortClaim {
    /// The port is this process's while the file stays open.
    Held(std::fs::File),
    /// Another process (or another open of the file) holds it.
    Taken,
    /// Claims cannot be made here (no directory, no locks).
    Unavailable,
}

/// Claims `port` among test processes by locking the file named after it
/// in `claims`.
fn claim_port(claims: &Path, port: u16) -> PortClaim {
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(claims.join(port.to_string()));
    let Ok(file) = file else { return PortClaim::Unavailable };
    match file.try_lock() {
        Ok(()) => PortClaim::Held(file),
        Err(std::fs::TryLockError::WouldBlock) => PortClaim::Taken,
        Err(std::fs::TryLockError::Error(_)) => PortClaim::Unavailable,
    }
}

/// Which S3-compatible server runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// MinIO, the reference S3-compatible server.
    Minio,
    /// moto's S3 server (accepts hostile keys).
    Moto,
    /// A store this process did not start (`S3Server::external`).
    External,
}

/// A running S3-compatible server, stopped on drop.
#[derive(Debug)]
pub struct S3Server {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    /// Access key accepted by the server.
    pub access_key: String,
    /// Secret key accepted by the server.
    pub secret_key: String,
    /// Which server this is.
    pub flavor: Flavor,
    /// The PEM of the CA that signed the server's certificate, when it
    /// serves HTTPS ([`S3Server::minio_tls`]).
    pub ca_file: Option<PathBuf>,
    /// The role whose `AssumeRoleWithWebIdentity` MinIO's STS answers, when
    /// it trusts an OpenID provider ([`S3Server::minio_trusting`]).
    pub openid_role_arn: Option<String>,
    dir: tempfile::TempDir,
    // MinIO's command line, to start it again on the same port and data.
    command: Option<Command>,
}

/// An OpenID provider (a Kubernetes API server's service-account issuer)
/// that MinIO's STS trusts.
#[derive(Clone, Copy, Debug)]
pub struct OpenIdProvider<'a> {
    /// `https://…/.well-known/openid-configuration`
    pub config_url: &'a str,
    /// The audience a token must carry.
    pub client_id: &'a str,
    /// The PEM of the CA that signed the provider's serving certificate.
    pub ca_pem: &'a [u8],
}

/// The role ARN MinIO gives an OpenID provider with a role policy: its
/// resource is the unpadded URL-safe base64 of the SHA-1 of the client id,
/// so that it stays the same across restarts (MinIO's `openid.go`); the
/// region is empty when the server has none configured.
fn minio_role_arn(client_id: &str) -> String {
    use base64::Engine as _;
    use sha1::Digest as _;
    let resource = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha1::Sha1::digest(client_id.as_bytes()));
    format!("arn:minio:iam:::role/{resource}")
}

impl S3Server {
    /// Starts MinIO with a fresh data directory.
    pub fn minio() -> Self {
        Self::start_minio(false, &[])
    }

    /// Starts MinIO serving HTTPS only, with a certificate for 127.0.0.1
    /// signed by a CA made for this server alone, whose PEM is
    /// [`S3Server::ca_file`]. [`S3Server::client`] trusts that CA;
    /// [`S3Server::env`] does not hand it to other processes, so a test says
    /// how each of them learns of it.
    pub fn minio_tls() -> Self {
        Self::start_minio(true, &[])
    }

    /// [`S3Server::minio_tls`] whose certificate also names `addresses`
    /// (where other hosts, e.g. pods, reach it through a forwarder).
    pub fn minio_tls_also_for(addresses: &[std::net::IpAddr]) -> Self {
        Self::start_minio(true, addresses)
    }

    /// Starts MinIO whose STS trusts `provider`'s service-account tokens
    /// (`AssumeRoleWithWebIdentity`) under one role with the `readwrite`
    /// policy: [`S3Server::openid_role_arn`] names it.
    pub fn minio_trusting(provider: &OpenIdProvider<'_>) -> Self {
        Self::start_minio_with(false, &[], Some(provider), None)
    }

    /// Starts MinIO serving at most `requests` S3 requests at a time
    /// (`MINIO_API_REQUESTS_MAX`): the rest it answers with 503 SlowDown
    /// or 429, as a store that throttles its clients.
    pub fn minio_limited(requests: u32) -> Self {
        Self::start_minio_with(false, &[], None, Some(requests))
    }

    fn start_minio(tls: bool, addresses: &[std::net::IpAddr]) -> Self {
        Self::start_minio_with(tls, addresses, None, None)
    }

    fn start_minio_with(
        tls: bool,
        addresses: &[std::net::IpAddr],
        openid: Option<&OpenIdProvider<'_>>,
        requests_max: Option<u32>,
    ) -> Self {
        let binary = tool_path("minio");
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let console = free_port();
        let (access_key, secret_key) = ("ferry-test".to_owned(), "ferry-test-secret".to_owned());
        let certs = dir.path().join("certs");
        std::fs::create_dir_all(&certs).expect("certs dir");
        let ca_file = tls.then(|| write_test_certificates(&certs, addresses));
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let mut command = Command::new(binary);
        command
            .arg("server")
            .arg(dir.path().join("data"))
            .args(["--address", &format!("127.0.0.1:{port}")])
            .args(["--console-address", &format!("127.0.0.1:{console}")])
            // Without its own certificates MinIO would pick up ~/.minio/certs.
            .arg("--certs-dir")
            .arg(&certs)
            .arg("--quiet")
            .env("MINIO_ROOT_USER", &access_key)
            .env("MINIO_ROOT_PASSWORD", &secret_key)
            .env("MINIO_BROWSER", "off")
            .env("MINIO_UPDATE", "off")
            // Its own Prometheus metrics without a token: tests read what it sent.
            .env("MINIO_PROMETHEUS_AUTH_TYPE", "public");
        if let Some(requests) = requests_max {
            command.env("MINIO_API_REQUESTS_MAX", requests.to_string());
        }
        if let Some(provider) = openid {
            // MinIO fetches the discovery document and the keys over HTTPS
            // and trusts the CAs in `certs/CAs` besides the system's.
            std::fs::create_dir_all(certs.join("CAs")).expect("certs/CAs");
            std::fs::write(certs.join("CAs/openid-provider.pem"), provider.ca_pem).expect("write the provider's CA");
            command
                .env("MINIO_IDENTITY_OPENID_CONFIG_URL", provider.config_url)
                .env("MINIO_IDENTITY_OPENID_CLIENT_ID", provider.client_id)
                .env("MINIO_IDENTITY_OPENID_ROLE_POLICY", "readwrite");
        }
        let child = command.stdout(log.try_clone().expect("dup log")).stderr(log).spawn().expect("start minio");
        let scheme = if tls { "https" } else { "http" };
        let mut server = Self {
            child: Some(child),
            endpoint: format!("{scheme}://127.0.0.1:{port}"),
            access_key,
            secret_key,
            flavor: Flavor::Minio,
            ca_file,
            openid_role_arn: openid.map(|provider| minio_role_arn(provider.client_id)),
            dir,
            command: Some(command),
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        if self.ca_file.is_some() {
            self.wait_serving_s3();
        } else {
            let port = self.endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("the endpoint's port");
            // `live` answers as soon as the process listens; requests fail
            // with XMinioServerNotInitialized until `cluster` (write quorum)
            // is healthy, which takes seconds longer on a loaded machine.
            self.wait_healthy(port, "/minio/health/live");
            self.wait_healthy(port, "/minio/health/cluster");
        }
    }

    /// Kills MinIO (SIGKILL: connections drop mid-request), keeps it down
    /// for `down`, and starts it again on the same port and data, waiting
    /// until it serves: a store that crashes and comes back.
    ///
    /// # Panics
    /// For servers other than MinIO, or when it does not come back.
    pub fn restart(&mut self, down: Duration) {
        let command = self.command.as_mut().expect("only MinIO started here can be restarted");
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        std::thread::sleep(down);
        let log = std::fs::OpenOptions::new().append(true).open(self.dir.path().join("server.log")).expect("log");
        let child = command.stdout(log.try_clone().expect("dup log")).stderr(log).spawn().expect("restart minio");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Starts moto's S3 server.
    pub fn moto() -> Self {
        let binary = tool_path("moto");
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start moto_server");
        let mut server = Self {
            child: Some(child),
            endpoint: format!("http://127.0.0.1:{port}"),
            access_key: "testing".into(),
            secret_key: "testing".into(),
            flavor: Flavor::Moto,
            ca_file: None,
            openid_role_arn: None,
            dir,
            command: None,
        };
        server.wait_healthy(port, "/moto-api/");
        server
    }

    /// A store reached at `endpoint` that something else runs (for e2e tests
    /// against a real cluster, whose pods cannot reach this machine's loopback).
    pub fn external(endpoint: &str, access_key: &str, secret_key: &str) -> Self {
        Self {
            child: None,
            endpoint: endpoint.to_owned(),
            access_key: access_key.to_owned(),
            secret_key: secret_key.to_owned(),
            flavor: Flavor::External,
            ca_file: None,
            openid_role_arn: None,
            dir: tempfile::tempdir().expect("temp dir"),
            command: None,
        }
    }

    fn wait_healthy(&mut self, port: u16, path: &str) {
        let deadline = Instant::now() + START_DEADLINE;
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("{:?} exited with {status} during start-up:\n{}", self.flavor, self.log_tail());
            }
            if http_get_status(port, path) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{:?} not healthy within {START_DEADLINE:?}:\n{}", self.flavor, self.log_tail());
    }

    /// Waits until S3 requests succeed over TLS (the health endpoints
    /// speak HTTPS too, which [`http_get`] does not). The client runs on a
    /// runtime of its own thread, so this works inside a test's runtime too.
    fn wait_serving_s3(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        let client = self.client();
        let ready = move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async {
                while Instant::now() < deadline {
                    if client.list_buckets().send().await.is_ok() {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                false
            })
        };
        let ready = std::thread::spawn(ready).join().expect("the readiness thread panicked");
        if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
            panic!("{:?} exited with {status} during start-up:\n{}", self.flavor, self.log_tail());
        }
        assert!(ready, "{:?} not serving S3 over TLS within {START_DEADLINE:?}:\n{}", self.flavor, self.log_tail());
    }

    /// Bytes MinIO says it sent in answers to S3 requests since it started
    /// (`minio_s3_traffic_sent_bytes` of its node metrics), a count
    /// independent of any client's; `None` for other servers. MinIO updates
    /// it every few seconds.
    pub async fn bytes_sent(&self) -> Option<u64> {
        if self.flavor != Flavor::Minio {
            return None;
        }
        let url = format!("{}/minio/v2/metrics/node", self.endpoint);
        let text = reqwest::Client::new().get(url).send().await.ok()?.text().await.ok()?;
        let line = text.lines().find(|l| l.starts_with("minio_s3_traffic_sent_bytes{"))?;
        let value: f64 = line.rsplit(' ').next()?.parse().ok()?;
        Some(value as u64)
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// An SDK client for setting up and checking test data (not the code under test).
    pub fn client(&self) -> aws_sdk_s3::Client {
        let mut config = aws_sdk_s3::Config::builder()
            .behavior_version(aws_sdk_s3::config::BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .force_path_style(true)
            .credentials_provider(Credentials::new(&self.access_key, &self.secret_key, None, None, "testkit"))
            .timeout_config(
                aws_sdk_s3::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .operation_attempt_timeout(REQUEST_DEADLINE)
                    .build(),
            );
        if let Some(ca_file) = &self.ca_file {
            let ca = std::fs::read(ca_file).expect("read the test CA");
            let trust = tls::TrustStore::empty().with_pem_certificate(ca);
            let http = aws_smithy_http_client::Builder::new()
                .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
                .tls_context(tls::TlsContext::builder().with_trust_store(trust).build().expect("TLS context"))
                .build_https();
            config = config.http_client(http);
        }
        aws_sdk_s3::Client::from_conf(config.build())
    }

    /// Creates a bucket.
    pub async fn create_bucket(&self, name: &str) {
        self.client().create_bucket().bucket(name).send().await.expect("create bucket");
    }

    /// Uploads one object with a single PUT.
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) {
        self.client()
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(ByteStream::from(body))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
    }

    /// Reads one object.
    pub async fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let output = self.client().get_object().bucket(bucket).key(key).send().await.expect("get object");
        output.body.collect().await.expect("read body").into_bytes().to_vec()
    }

    /// Every key and size under `prefix`.
    pub async fn list(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut pages = self.client().list_objects_v2().bucket(bucket).prefix(prefix).into_paginator().send();
        while let Some(page) = pages.next().await {
            for object in page.expect("list").contents() {
                out.push((object.key().unwrap_or_default().to_owned(), object.size().unwrap_or(0) as u64));
            }
        }
        out
    }

    /// Environment for a process that should talk to this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret_key.clone()),
            ("AWS_REGION", "us-east-1".into()),
            ("FERRY_ENDPOINT_URL", self.endpoint.clone()),
            // Keep the SDK away from any profile or metadata service on the machine.
            ("AWS_CONFIG_FILE", "/dev/null".into()),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let Some(child) = self.child.as_mut() else { return };
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Writes a CA and a serving certificate for 127.0.0.1 and localhost into
/// the existing directory `certs` as MinIO reads them (`public.crt`,
/// `private.key`), and the CA's PEM beside them; returns the CA's path.
fn write_test_certificates(certs: &Path, addresses: &[std::net::IpAddr]) -> PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign the CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().expect("server key");
    let mut server_params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server parameters");
    server_params.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
    server_params.subject_alt_names.extend(addresses.iter().map(|address| SanType::IpAddress(*address)));
    let server_cert = server_params.signed_by(&server_key, &issuer).expect("sign the server certificate");
    std::fs::write(certs.join("public.crt"), server_cert.pem()).expect("write public.crt");
    std::fs::write(certs.join("private.key"), server_key.serialize_pem()).expect("write private.key");
    let ca_file = certs.join("test-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).expect("write the CA");
    ca_file
}

/// The last 40 lines of a server's log file, for failure messages.
fn log_tail(log: &Path) -> String {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Status code of `GET path` on 127.0.0.1:port, or `None` when nothing answers.
fn http_get_status(port: u16, path: &str) -> Option<u16> {
    http_get(port, path).map(|(status, _)| status)
}

/// `GET path` on 127.0.0.1:port (HTTP/1.0, so the server closes the
/// connection): the status code and the body, or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, body)| body.to_owned());
    Some((status, body))
}

/// Deterministic pseudo-random bytes (xorshift64*): reproducible test data
/// without a dependency and fast enough for hundreds of MiB.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A size-limited tmpfs, unmounted when dropped, so a failing test does
/// not leave it mounted: a destination disk that fills up. Mounting needs
/// root (or CAP_SYS_ADMIN); tests that cannot mount say so and skip.
#[derive(Debug)]
pub struct SmallFilesystem {
    dir: PathBuf,
    /// The directory mounted on, when this created it.
    _temp: Option<tempfile::TempDir>,
}

impl SmallFilesystem {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it) on a new
    /// temporary directory.
    ///
    /// # Errors
    /// Why it could not mount (not root).
    pub fn mount(size: &str) -> Result<Self, String> {
        let temp = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut mounted = Self::mount_on(temp.path(), size)?;
        mounted._temp = Some(temp);
        Ok(mounted)
    }

    /// Mounts a tmpfs of `size` on `dir`, created if missing.
    ///
    /// # Errors
    /// Why it could not mount (not root).
    pub fn mount_on(dir: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !mounted.status.success() {
            return Err(String::from_utf8_lossy(&mounted.stderr).trim().to_owned());
        }
        Ok(Self { dir: dir.to_path_buf(), _temp: None })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Changes the size, keeping the contents: space freed for a rerun.
    ///
    /// # Panics
    /// When the remount fails.
    pub fn resize(&self, size: &str) {
        let status = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.dir).status();
        assert!(status.is_ok_and(|s| s.success()), "cannot resize the tmpfs to {size}");
    }

    /// Writes zeros to `name` until the filesystem is full; returns how
    /// many bytes fitted. Another tenant filling the disk.
    ///
    /// # Panics
    /// On a write error other than "no space left".
    pub fn fill(&self, name: &str) -> u64 {
        let mut file = std::fs::File::create(self.dir.join(name)).expect("create the filler");
        let chunk = vec![0u8; 64 << 10];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => return written,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => return written,
                Err(e) => panic!("filling {}: {e}", self.dir.display()),
            }
        }
    }
}

impl Drop for SmallFilesystem {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(&self.dir).status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!("could not unmount the tmpfs at {}", self.dir.display());
        }
    }
}

/// Every regular file below `root` (excluding Ferry's `.ferry` state), as
/// relative path → content. For comparing trees byte for byte. Symlinks are
/// neither followed nor listed.
pub fn read_tree(root: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn visit(root: &Path, dir: &Path, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read dir") {
            let entry = entry.expect("dir entry");
            let path = entry.path();
            let rel = path.strip_prefix(root).expect("below root").to_string_lossy().into_owned();
            if rel == STATE_DIR {
                continue;
            }
            let kind = entry.file_type().expect("file type");
            if kind.is_symlink() {
                continue;
            } else if kind.is_dir() {
                visit(root, &path, out);
            } else {
                out.insert(rel, std::fs::read(&path).expect("read file"));
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    visit(root, root, &mut out);
    out
}

#[cfg(test)]
mod tests {
    /// A thousand draws of the kernel's ephemeral ports repeat one almost
    /// surely (the birthday bound over about 28,000 ports): `free_port`
    /// must not hand that one out again.
    /// Another test process's claim is an open file locked: a second open
    /// stands for it (locks belong to the open, not the process).
    #[test]
    fn a_port_claimed_by_another_process_is_not_claimed_again_until_it_exits() {
        let claims = tempfile::tempdir().unwrap();
        let first = super::claim_port(claims.path(), 40_000);
        assert!(matches!(first, super::PortClaim::Held(_)), "{first:?}");
        assert!(matches!(super::claim_port(claims.path(), 40_000), super::PortClaim::Taken));
        assert!(matches!(super::claim_port(claims.path(), 40_001), super::PortClaim::Held(_)), "another port is free");
        drop(first);
        assert!(matches!(super::claim_port(claims.path(), 40_000), super::PortClaim::Held(_)), "released on exit");
    }

    #[test]
    fn the_kernels_port_range_is_read_as_proc_writes_it() {
        assert_eq!(super::parse_port_range("32768\t60999\n"), Some(32_768..=60_999));
        assert_eq!(super::parse_port_range("1024 65535"), Some(1_024..=65_535));
        assert_eq!(super::parse_port_range("32768"), None);
        assert_eq!(super::parse_port_range("32768 60999 1"), None);
        assert_eq!(super::parse_port_range("low high"), None);
    }

    /// Where the kernel's range leaves room, no port handed out is one it
    /// could give a connection or a `bind(0)`.
    #[test]
    fn free_port_stays_out_of_the_kernels_ephemeral_range() {
        assert!(super::clear_of(&(32_768..=60_999)), "Linux's default range");
        assert!(!super::clear_of(&(1_024..=65_535)));
        assert!(!super::clear_of(&(20_000..=25_000)));
        let Some(ephemeral) = super::ephemeral_ports().filter(super::clear_of) else { return };
        for _ in 0..100 {
            let port = super::free_port();
            assert!(!ephemeral.contains(&port), "port {port} is in the ephemeral range {ephemeral:?}");
            assert!(super::TEST_PORTS.contains(&port), "port {port}");
        }
    }

    #[test]
    fn free_port_never_hands_out_a_port_twice() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..1000 {
            let port = super::free_port();
            assert!(seen.insert(port), "port {port} handed out twice");
        }
    }
}
