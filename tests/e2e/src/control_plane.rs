//! A real Kubernetes control plane on loopback: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler, built from pinned sources by
//! `hack/tools.sh` and started here with fresh credentials.
//!
//! The API server runs with RBAC authorization and the PodSecurity admission
//! plugin, a freshly generated service-account signing key, and a serving
//! certificate it generates itself. An admin token (group `system:masters`)
//! is written into a kubeconfig; the controller manager and scheduler use
//! it too. There is no kubelet: [`crate::agent`] stands in for one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_testkit::{free_port, tool_path};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::process::ManagedProcess;

/// How long the control plane may take to become ready.
const READY_DEADLINE: Duration = Duration::from_secs(120);

/// How long a node may go without a heartbeat before the controller
/// manager marks it NotReady (its default is 50 s): short, so a test of a
/// lost node stays short, and four of the agents' heartbeats long.
pub const NODE_GRACE_PERIOD: Duration = Duration::from_secs(20);

/// How far the control plane's Go programs let their heap grow past what
/// is live before collecting, in percent (Go's default is 100). The e2e
/// suite is CPU-bound on two cores, five control planes at once, and the
/// API server is most of each scenario's CPU: with 400, one scenario's API
/// server used 3.0-3.1 CPU s instead of 3.7-4.0 and the scenario 6.1-6.6
/// instead of 7.0-7.3, for a larger heap between collections.
const GO_GC_PERCENT: &str = "400";

/// Why the control plane could not be brought up.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A file or process could not be created.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A component did not become ready in time or exited.
    #[error("{component} is not ready: {detail}\n--- last log lines of {component} ---\n{log}")]
    NotReady {
        /// The component.
        component: String,
        /// What was seen.
        detail: String,
        /// The tail of its log.
        log: String,
    },
    /// The kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    let what = what.into();
    move |source| ControlPlaneError::Io { what, source }
}

/// A running control plane. Dropping it stops every component.
#[derive(Debug)]
pub struct ControlPlane {
    /// `https://127.0.0.1:PORT`
    pub server: String,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The CA bundle that verifies the API server.
    pub ca_pem: Vec<u8>,
    dir: PathBuf,
    // Stopped in reverse order of start by `stop` (and by drop, in field order).
    processes: Vec<ManagedProcess>,
}

impl ControlPlane {
    /// Starts all four components under `dir` and waits until the API server
    /// is ready and the controllers have created the default service account.
    ///
    /// # Errors
    /// Fails with the relevant log tail when a component does not come up.
    pub async fn start(dir: &Path) -> Result<Self, ControlPlaneError> {
        let pki = dir.join("pki");
        let logs = dir.join("logs");
        for d in [&pki, &logs, &dir.join("etcd")] {
            std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
        }
        generate_service_account_key(&pki)?;
        let token = format!("{:032x}", rand::random::<u128>());
        std::fs::write(pki.join("tokens.csv"), format!("{token},ferry-admin,ferry-admin,system:masters\n"))
            .map_err(io("writing the token file"))?;

        let mut processes = Vec::new();
        let (etcd_port, peer_port) = (free_port(), free_port());
        let mut etcd = go_command("etcd");
        etcd.args(["--name", "ferry-e2e", "--data-dir"])
            .arg(dir.join("etcd"))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!("--initial-cluster=ferry-e2e=http://127.0.0.1:{peer_port}"))
            .args(["--log-level", "warn", "--quota-backend-bytes", "1073741824"]);
        processes.push(ManagedProcess::spawn("etcd", etcd, &logs.join("etcd.log")).map_err(io("starting etcd"))?);
        wait_for(&mut processes[0], || http_ok(etcd_port, "/health")).await?;

        let mut attempts = 0;
        let (cert, kubeconfig, client, server, ca_pem) = loop {
            attempts += 1;
            let api_port = free_port();
            let mut apiserver = go_command("kube-apiserver");
            apiserver
                .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_port}"))
                .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
                .arg(format!("--secure-port={api_port}"))
                .arg(format!("--cert-dir={}", pki.display()))
                .arg(format!("--token-auth-file={}", pki.join("tokens.csv").display()))
                .arg(format!("--service-account-key-file={}", pki.join("sa.pub").display()))
                .arg(format!("--service-account-signing-key-file={}", pki.join("sa.key").display()))
                .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
                // The issuer's discovery document names its keys where a store
                // on this host reaches them: an OpenID-trusting store (MinIO's
                // STS) verifies service-account tokens with them.
                .arg(format!("--service-account-jwks-uri=https://127.0.0.1:{api_port}/openid/v1/jwks"))
                .arg("--authorization-mode=RBAC")
                .arg("--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,PodSecurity,DefaultStorageClass")
                .arg("--service-cluster-ip-range=10.96.0.0/16")
                // No kube-proxy here: the API server reaches webhook Services
                // through their endpoints, as clusters without ClusterIP
                // routing on the control plane do.
                .arg("--enable-aggregator-routing=true")
                // Real nodes register by name only; reach their kubelets (logs)
                // at the address they report.
                .arg("--kubelet-preferred-address-types=InternalIP")
                .arg("--allow-privileged=false")
                .arg("--enable-priority-and-fairness=false")
                .arg("--profiling=false")
                .arg("--v=1");
            processes.push(
                ManagedProcess::spawn("kube-apiserver", apiserver, &logs.join("kube-apiserver.log"))
                    .map_err(io("starting kube-apiserver"))?,
            );
            let server = format!("https://127.0.0.1:{api_port}");
            // The API server writes its self-signed serving certificate (and the
            // CA that signed it) into --cert-dir at start-up: the certificate
            // file is created empty and then filled, and the key is written
            // after it. Reading the certificate as soon as the file exists can
            // catch it empty on a loaded machine, and a client trusting nothing
            // never sees the server ready; so wait for the key and a complete
            // certificate.
            let (cert, key) = (pki.join("apiserver.crt"), pki.join("apiserver.key"));
            wait_for(&mut processes[1], || key.exists() && complete_pem(&cert)).await?;
            let ca_pem = std::fs::read(&cert).map_err(io("reading the serving certificate"))?;
            let kubeconfig = dir.join("kubeconfig");
            write_kubeconfig(&kubeconfig, &server, &ca_pem, &token, None).map_err(io("writing the kubeconfig"))?;
            let client = client_from(&kubeconfig).await?;
            let probe = client.clone();
            let started = wait_for_async(&mut processes[1], || {
                let client = probe.clone();
                async move { ready(&client).await }
            })
            .await;
            match started {
                Ok(()) => break (cert, kubeconfig, client, server, ca_pem),
                // A port found free can be taken by another process (an
                // outgoing connection's ephemeral port) before the API
                // server binds it; seen under load as "bind: address
                // already in use". That start is made again on another
                // port; any other failure is the API server's.
                Err(ControlPlaneError::NotReady { log, .. })
                    if log.contains("address already in use") && attempts < BIND_ATTEMPTS =>
                {
                    processes.pop();
                }
                Err(error) => return Err(with_readiness(error, &client).await),
            }
        };

        let kubeconfig_arg = format!("--kubeconfig={}", kubeconfig.display());
        let mut controller_manager = go_command("kube-controller-manager");
        controller_manager
            .arg(&kubeconfig_arg)
            .args(["--leader-elect=false", "--bind-address=127.0.0.1"])
            .arg(format!("--secure-port={}", free_port()))
            .arg(format!("--service-account-private-key-file={}", pki.join("sa.key").display()))
            .arg(format!("--root-ca-file={}", cert.display()))
            .arg("--use-service-account-credentials=false")
            .arg("--controllers=*")
            .arg("--cluster-name=ferry-e2e")
            .arg(format!("--node-monitor-grace-period={}s", NODE_GRACE_PERIOD.as_secs()))
            .arg("--v=1");
        processes.push(
            ManagedProcess::spawn(
                "kube-controller-manager",
                controller_manager,
                &logs.join("kube-controller-manager.log"),
            )
            .map_err(io("starting kube-controller-manager"))?,
        );
        let mut scheduler = go_command("kube-scheduler");
        scheduler
            .arg(&kubeconfig_arg)
            .args(["--leader-elect=false", "--bind-address=127.0.0.1"])
            .arg(format!("--secure-port={}", free_port()))
            .arg("--v=1");
        processes.push(
            ManagedProcess::spawn("kube-scheduler", scheduler, &logs.join("kube-scheduler.log"))
                .map_err(io("starting kube-scheduler"))?,
        );
        // The service-account controller creates `default` in every namespace;
        // seeing it means the controller manager is at work.
        wait_for_async(&mut processes[2], || {
            let client = client.clone();
            async move {
                let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
                    kube::Api::namespaced(client, "default");
                accounts.get_opt("default").await.ok().flatten().is_some()
            }
        })
        .await?;
        Ok(Self { server, kubeconfig, ca_pem, dir: dir.to_path_buf(), processes })
    }

    /// An admin client.
    ///
    /// # Errors
    /// Fails when the kubeconfig cannot be loaded.
    pub async fn client(&self) -> Result<kube::Client, ControlPlaneError> {
        client_from(&self.kubeconfig).await
    }

    /// The last lines of every component's log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| format!("--- {} ({}) ---\n{}", p.name(), p.log_path().display(), p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Process ids of the running components (etcd first).
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(ManagedProcess::id).collect()
    }

    /// Kills `component` (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager` or `kube-scheduler`) with SIGKILL, waits
    /// `down`, starts it again with the same flags and data, and waits
    /// until the API server answers ready again: what a crash and a
    /// supervisor's restart look like to everything else.
    ///
    /// # Errors
    /// Fails when there is no such component or it does not come back.
    pub async fn restart(&mut self, component: &str, down: Duration) -> Result<(), ControlPlaneError> {
        let Some(index) = self.processes.iter().position(|p| p.name() == component) else {
            return Err(ControlPlaneError::NotReady {
                component: component.to_owned(),
                detail: "no such component".into(),
                log: String::new(),
            });
        };
        self.processes[index].stop(Duration::ZERO);
        tokio::time::sleep(down).await;
        self.processes[index].restart(Duration::ZERO).map_err(io(format!("restarting {component}")))?;
        let client = self.client().await?;
        let api_server = self.processes.iter().position(|p| p.name() == "kube-apiserver").unwrap_or(index);
        wait_for_async(&mut self.processes[api_server], || {
            let client = client.clone();
            async move { ready(&client).await }
        })
        .await
    }

    /// The working directory (certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops every component, last started first, and waits for each to exit.
    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
    }
}

/// Writes a kubeconfig for `server` with a bearer token.
///
/// # Errors
/// Returns write errors.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca_pem: &[u8],
    token: &str,
    namespace: Option<&str>,
) -> std::io::Result<()> {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut context = serde_json::json!({ "cluster": "ferry-e2e", "user": "user" });
    if let Some(namespace) = namespace {
        context["namespace"] = namespace.into();
    }
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "ferry-e2e", "cluster": { "server": server, "certificate-authority-data": ca } }],
        "users": [{ "name": "user", "user": { "token": token } }],
        "contexts": [{ "name": "ferry-e2e", "context": context }],
        "current-context": "ferry-e2e",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&config).expect("kubeconfig serializes"))
}

/// A client from a kubeconfig file.
///
/// # Errors
/// Fails when the file cannot be read or used.
pub async fn client_from(path: &Path) -> Result<kube::Client, ControlPlaneError> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| ControlPlaneError::Kubeconfig(e.to_string()))
}

/// How long one readiness probe may take: a probe that hangs must not eat
/// the whole start-up deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /readyz` answers 200 (`ok`).
async fn ready(client: &kube::Client) -> bool {
    readyz(client, "/readyz").await.is_ok_and(|body| body.trim() == "ok")
}

async fn readyz(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path).body(Vec::new()).expect("static request");
    match tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request)).await {
        Ok(Ok(body)) => Ok(body),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}

/// Adds what `/readyz?verbose` says (the checks that fail, or why it could
/// not be asked) to an API server that did not become ready.
async fn with_readiness(error: ControlPlaneError, client: &kube::Client) -> ControlPlaneError {
    let ControlPlaneError::NotReady { component, detail, log } = error else { return error };
    let seen = match readyz(client, "/readyz?verbose").await {
        Ok(body) => body.lines().filter(|line| !line.starts_with("[+]")).collect::<Vec<_>>().join("; "),
        Err(error) => error,
    };
    ControlPlaneError::NotReady { component, detail: format!("{detail}; /readyz?verbose: {seen}"), log }
}

/// A command for one of the control plane's programs (all written in Go),
/// collecting garbage less often ([`GO_GC_PERCENT`]).
fn go_command(tool: &str) -> Command {
    let mut command = Command::new(tool_path(tool));
    command.env("GOGC", GO_GC_PERCENT);
    command
}

/// The file holds at least one PEM block and ends with a complete one.
fn complete_pem(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| text.trim_end().ends_with("-----END CERTIFICATE-----"))
}

fn generate_service_account_key(pki: &Path) -> Result<(), ControlPlaneError> {
    let key = pki.join("sa.key");
    let run = |args: &[&str]| -> Result<(), ControlPlaneError> {
        let output = Command::new("openssl").args(args).output().map_err(io("running openssl"))?;
        if !output.status.success() {
            return Err(ControlPlaneError::Io {
                what: format!("openssl {}", args.join(" ")),
                source: std::io::Error::other(String::from_utf8_lossy(&output.stderr).into_owned()),
            });
        }
        Ok(())
    };
    let key_str = key.to_str().expect("utf-8 path");
    run(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", key_str])?;
    run(&["pkey", "-in", key_str, "-pubout", "-out", pki.join("sa.pub").to_str().expect("utf-8 path")])
}

fn http_ok(port: u16, path: &str) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200")
}

/// Starts of the API server made when its port was taken before it bound it.
const BIND_ATTEMPTS: u32 = 3;

async fn wait_for(process: &mut ManagedProcess, mut check: impl FnMut() -> bool) -> Result<(), ControlPlaneError> {
    wait_for_async(process, || std::future::ready(check())).await
}

async fn wait_for_async<F, Fut>(process: &mut ManagedProcess, mut check: F) -> Result<(), ControlPlaneError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + READY_DEADLINE;
    loop {
        if let Some(status) = process.try_wait() {
            return Err(ControlPlaneError::NotReady {
                component: process.name().to_owned(),
                detail: format!("exited with {status}"),
                log: process.log_tail(40),
            });
        }
        if check().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(ControlPlaneError::NotReady {
                component: process.name().to_owned(),
                detail: format!("not ready within {READY_DEADLINE:?}"),
                log: process.log_tail(40),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
