//! The operator's configuration: parsed once at start-up from flags (or
//! their environment variables), checked ([`OperatorConfig::check`]) and
//! shared read-only through the context.
//!
//! Everything here that widens what a DataStage's author may do is the
//! cluster admin's to set: the namespaces that may name raw hostPaths,
//! the images `spec.image` may name, the audiences a web identity token
//! may be requested for, and whether its STS may be plain HTTP. The
//! defaults grant none of it.

use std::net::SocketAddr;

use crate::jobs::WorkerDefaults;

/// A configuration the operator refuses to start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// An allowed hostPath prefix that is empty or relative would allow
    /// every path (every absolute path starts with the empty prefix).
    #[error(
        "--allowed-host-paths has the entry '{0}', which is not an absolute directory: an empty entry (what `--allowed-host-paths=` or the chart's `allowedHostPaths: []` gives) would allow every path on the node. List absolute directories, or name no --host-path-namespaces to allow no hostPath"
    )]
    HostPathPrefix(String),
}

/// Flags of `ferry-operator`.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "ferry-operator", version, about = "The DataStage controller")]
pub struct OperatorConfig {
    /// Image of the stager that worker Jobs run. A DataStage's `spec.image`
    /// replaces it in the transfer container only, and only when
    /// `--allowed-images` allows it; the step that readies a node
    /// directory (which runs as root) always runs this one.
    #[arg(long, env = "FERRY_STAGER_IMAGE", default_value = "ghcr.io/ferry-dev/ferry-stager:0.1.0")]
    pub stager_image: String,

    /// Images a DataStage's `spec.image` may name, comma-separated; an
    /// entry ending in `*` allows every image that starts with what comes
    /// before it (`registry.example/ferry/*`). Empty (the default):
    /// `spec.image` is refused.
    #[arg(long, env = "FERRY_ALLOWED_IMAGES", value_delimiter = ',')]
    pub allowed_images: Vec<String>,

    /// Namespace in which the workers of node-local DataStages (a
    /// `nodeCache` or a `hostPath`) run, with the Secrets the operator
    /// gives them. No tenant should be able to create pods there: its Pod
    /// Security level must admit hostPath volumes (privileged). Default:
    /// the operator's own namespace.
    #[arg(long, env = "FERRY_WORKERS_NAMESPACE")]
    pub workers_namespace: Option<String>,

    /// Namespaces whose DataStages may name a raw `hostPath`,
    /// comma-separated (the cluster admin's own); `*` allows every
    /// namespace, for a cluster whose pod authors all hold node root
    /// anyway. Default: none; tenants name a NodeCache.
    #[arg(long, env = "FERRY_HOST_PATH_NAMESPACES", value_delimiter = ',')]
    pub host_path_namespaces: Vec<String>,

    /// Directories under which those DataStages may use hostPath volumes,
    /// comma-separated absolute paths (an empty entry is refused at start).
    /// A hostPath elsewhere is refused at admission.
    #[arg(long, env = "FERRY_ALLOWED_HOST_PATHS", value_delimiter = ',', default_value = "/mnt,/data")]
    pub allowed_host_paths: Vec<String>,

    /// Node directories Ferry owns whole, comma-separated (empty: none). A
    /// pull whose (admin) hostPath lies below one mounts that directory and
    /// shares its files with every other such pull on the node through
    /// `DIR/.ferry-shared`, so DataStages of the same objects take their
    /// space once. Each must be one filesystem on every node, and only
    /// Ferry's: its workers may write anywhere in it. (NodeCaches say for
    /// themselves whether they share; keep their roots out of this list,
    /// the default NodeCache's `/var/lib/ferry` included.)
    #[arg(long, env = "FERRY_SHARED_HOST_PATHS", value_delimiter = ',')]
    pub shared_host_paths: Vec<String>,

    /// Audiences the operator requests web identity tokens for,
    /// comma-separated: a DataStage's `credentials.webIdentity.audience`
    /// must be one of them. The token is sent to the STS the DataStage
    /// names, so list only the audiences of the stores your tenants use.
    #[arg(long, env = "FERRY_WEB_IDENTITY_AUDIENCES", value_delimiter = ',', default_value = "sts.amazonaws.com")]
    pub web_identity_audiences: Vec<String>,

    /// Let web identities be exchanged at STS endpoints over plain HTTP
    /// (a store inside the cluster without TLS). Off: an `http://` STS is
    /// refused, as the token would cross the network in the clear.
    #[arg(long, env = "FERRY_ALLOW_HTTP_STS")]
    pub allow_http_sts: bool,

    /// Address of the health (`/healthz`, `/readyz`) and `/metrics` endpoint.
    #[arg(long, env = "FERRY_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,

    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "FERRY_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Namespace of the leader-election Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// ServiceAccount of worker pods: in the workers' namespace, the one
    /// all node-local workers run as; in a DataStage's namespace, the one
    /// a claim's workers run as when the DataStage names none (the Helm
    /// chart creates `ferry-stager` in both, allowed to report progress).
    /// Without it workers run as their namespace's `default` account.
    #[arg(long, env = "FERRY_STAGER_SERVICE_ACCOUNT")]
    pub stager_service_account: Option<String>,

    /// Port on which worker pods serve their Prometheus metrics (the
    /// container port is named `metrics`); 0 turns it off.
    #[arg(long, env = "FERRY_STAGER_METRICS_PORT", default_value_t = 9464)]
    pub stager_metrics_port: u16,

    /// How long a leader's Lease lasts without renewal (renewed every third of it).
    #[arg(long, env = "FERRY_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: std::time::Duration,

    /// Address of the pod-wiring admission webhook (HTTPS); unset turns
    /// the webhook off. Every replica serves it; only the leader lifts
    /// scheduling gates.
    #[arg(long, env = "FERRY_WEBHOOK_ADDR")]
    pub webhook_addr: Option<SocketAddr>,

    /// Who issues the webhook's certificate: `operator` (a CA and serving
    /// certificate the operator creates, renews and publishes in the
    /// webhook configuration's caBundle) or `external` (cert-manager, or
    /// anyone, writes the Secret; the operator only reads it).
    #[arg(long, env = "FERRY_WEBHOOK_CERTS", value_enum, default_value = "operator")]
    pub webhook_certs: WebhookCerts,

    /// Secret, in the operator's namespace, holding the webhook's certificates.
    #[arg(long, env = "FERRY_WEBHOOK_SECRET", default_value = "ferry-webhook-tls")]
    pub webhook_secret: String,

    /// Service, in the operator's namespace, through which the API server
    /// calls the webhook (its DNS names go into the serving certificate).
    #[arg(long, env = "FERRY_WEBHOOK_SERVICE", default_value = "ferry-webhook")]
    pub webhook_service: String,

    /// MutatingWebhookConfiguration (pods) whose caBundle the operator keeps current.
    #[arg(long, env = "FERRY_WEBHOOK_CONFIGURATION", default_value = "ferry-pod-data")]
    pub webhook_configuration: String,

    /// ValidatingWebhookConfiguration (DataStages) whose caBundle the
    /// operator keeps current.
    #[arg(long, env = "FERRY_WEBHOOK_VALIDATING_CONFIGURATION", default_value = "ferry-datastages")]
    pub webhook_validating_configuration: String,

    /// Lifetime of the serving certificates the operator issues (renewed
    /// with a third left).
    #[arg(long, env = "FERRY_WEBHOOK_CERT_LIFETIME", default_value = "90d", value_parser = humantime::parse_duration)]
    pub webhook_cert_lifetime: std::time::Duration,

    /// Lifetime of the CA the operator issues (renewed with a third left).
    #[arg(long, env = "FERRY_WEBHOOK_CA_LIFETIME", default_value = "3650d", value_parser = humantime::parse_duration)]
    pub webhook_ca_lifetime: std::time::Duration,
}

/// Who issues the webhook's certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WebhookCerts {
    /// The operator: its own CA, renewed in time, caBundle kept current.
    Operator,
    /// Someone else (cert-manager): the operator reads the Secret only.
    External,
}

impl OperatorConfig {
    /// A configuration for unit tests.
    pub fn test() -> Self {
        Self {
            stager_image: "ghcr.io/ferry-dev/ferry-stager:test".into(),
            allowed_images: Vec::new(),
            workers_namespace: Some("ferry-workers".into()),
            host_path_namespaces: vec!["admin".into()],
            allowed_host_paths: vec!["/mnt".into(), "/data".into()],
            shared_host_paths: vec!["/var/lib/ferry".into()],
            web_identity_audiences: vec!["sts.amazonaws.com".into()],
            allow_http_sts: false,
            http_addr: ([127, 0, 0, 1], 0).into(),
            watch_namespace: None,
            stager_service_account: None,
            stager_metrics_port: 9464,
            leader_election_namespace: "default".into(),
            lease_duration: std::time::Duration::from_secs(15),
            webhook_addr: None,
            webhook_certs: WebhookCerts::Operator,
            webhook_secret: "ferry-webhook-tls".into(),
            webhook_service: "ferry-webhook".into(),
            webhook_configuration: "ferry-pod-data".into(),
            webhook_validating_configuration: "ferry-datastages".into(),
            webhook_cert_lifetime: std::time::Duration::from_secs(90 * 86_400),
            webhook_ca_lifetime: std::time::Duration::from_secs(3650 * 86_400),
        }
    }

    /// What worker pods get unless their DataStage says otherwise.
    pub fn worker_defaults(&self) -> WorkerDefaults {
        WorkerDefaults {
            image: self.stager_image.clone(),
            service_account: self.stager_service_account.clone().filter(|s| !s.is_empty()),
            metrics_port: Some(self.stager_metrics_port).filter(|p| *p != 0),
            store_share: None,
            dataset_quotas: std::collections::BTreeMap::new(),
            capacity_claims: std::collections::BTreeMap::new(),
            shared_host_paths: self.shared_host_paths.iter().filter(|p| !p.is_empty()).cloned().collect(),
            peer_tls: true,
            peers_running: Vec::new(),
            workers_namespace: self.workers_namespace().to_owned(),
            anchor: None,
            node_cache: None,
            allowed_images: self.allowed_images.clone(),
        }
    }

    /// The configuration as the operator runs with it: lists whose empty
    /// entries mean nothing (`--allowed-images=` allows no image) lose
    /// them; what would grant more than the admin meant is refused.
    ///
    /// # Errors
    /// [`ConfigError`] naming the flag and the fix.
    pub fn checked(mut self) -> Result<Self, ConfigError> {
        for list in [
            &mut self.host_path_namespaces,
            &mut self.allowed_images,
            &mut self.web_identity_audiences,
            &mut self.shared_host_paths,
        ] {
            list.retain(|entry| !entry.trim().is_empty());
        }
        // An empty prefix is not "none": every absolute path starts with it.
        if let Some(bad) = self.allowed_host_paths.iter().find(|p| !p.starts_with('/') || p.contains("..")) {
            return Err(ConfigError::HostPathPrefix(bad.clone()));
        }
        Ok(self)
    }

    /// The namespace the workers of node-local DataStages run in.
    pub fn workers_namespace(&self) -> &str {
        self.workers_namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(&self.leader_election_namespace)
    }

    /// Whether `path` (absolute) lies under an allowed prefix.
    pub fn host_path_allowed(&self, path: &str) -> bool {
        self.allowed_host_paths.iter().any(|prefix| {
            let prefix = prefix.trim_end_matches('/');
            // "/" trims to "", and then every absolute path is below it: the
            // admin allowed the whole node.
            path == prefix || path.starts_with(&format!("{prefix}/"))
        })
    }

    /// Whether DataStages of `namespace` may name a raw hostPath.
    pub fn host_paths_allowed_in(&self, namespace: &str) -> bool {
        self.host_path_namespaces.iter().any(|n| n == "*" || n == namespace)
    }

    /// Whether `spec.image` may be `image`.
    pub fn image_allowed(&self, image: &str) -> bool {
        image == self.stager_image || crate::jobs::image_allowed(&self.allowed_images, image)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_are_allowed_only_under_a_prefix() {
        let config = OperatorConfig::test();
        assert!(config.host_path_allowed("/mnt/nvme/data"));
        assert!(config.host_path_allowed("/mnt"));
        assert!(!config.host_path_allowed("/mntx/data"));
        assert!(!config.host_path_allowed("/etc"));
    }

    #[test]
    fn an_empty_or_relative_host_path_prefix_is_refused_at_start() {
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            OperatorConfig::try_parse_from(std::iter::once("ferry-operator").chain(args.iter().copied())).unwrap()
        };
        assert!(parse(&[]).checked().is_ok(), "the defaults start");
        // What the chart rendered for `allowedHostPaths: []`.
        let empty = parse(&["--allowed-host-paths="]);
        assert_eq!(empty.allowed_host_paths, [""], "clap gives one empty entry");
        let refused = empty.checked().unwrap_err();
        assert_eq!(refused, ConfigError::HostPathPrefix(String::new()));
        assert!(refused.to_string().contains("would allow every path"));
        let relative = parse(&["--allowed-host-paths=/mnt,data"]);
        assert_eq!(relative.checked().unwrap_err(), ConfigError::HostPathPrefix("data".into()));
        // Elsewhere an empty list is none: no namespace, no image, no audience.
        let none =
            parse(&["--host-path-namespaces=", "--allowed-images=", "--web-identity-audiences="]).checked().unwrap();
        assert!(none.host_path_namespaces.is_empty() && none.allowed_images.is_empty());
        assert!(none.web_identity_audiences.is_empty() && !none.host_paths_allowed_in(""));
    }

    #[test]
    fn only_the_admins_namespaces_name_host_paths_and_only_allowed_images_run() {
        let mut config = OperatorConfig::test();
        assert!(config.host_paths_allowed_in("admin") && !config.host_paths_allowed_in("team-a"));
        config.host_path_namespaces = vec!["*".into()];
        assert!(config.host_paths_allowed_in("team-a"), "'*': a cluster without tenants");
        assert!(config.image_allowed(&config.stager_image.clone()), "the operator's own image");
        assert!(!config.image_allowed("evil.example/root-shell:1"));
        config.allowed_images = vec!["registry.example/ferry/*".into(), "other.example/stager:2".into()];
        assert!(config.image_allowed("registry.example/ferry/stager:9"));
        assert!(!config.image_allowed("registry.example/ferryx/stager:9"));
        assert!(config.image_allowed("other.example/stager:2") && !config.image_allowed("other.example/stager:3"));
        assert_eq!(config.workers_namespace(), "ferry-workers");
        config.workers_namespace = None;
        assert_eq!(config.workers_namespace(), "default", "the operator's own namespace");
    }
}
