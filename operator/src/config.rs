//! The operator's configuration: parsed once at start-up from flags (or
//! their environment variables) and shared read-only through the context.

use std::net::SocketAddr;

use crate::jobs::WorkerDefaults;

/// Flags of `ferry-operator`.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "ferry-operator", version, about = "The DataStage controller")]
pub struct OperatorConfig {
    /// Image of the stager that worker Jobs run (a DataStage's `spec.image` overrides it).
    #[arg(long, env = "FERRY_STAGER_IMAGE", default_value = "ghcr.io/ferry-dev/ferry-stager:0.1.0")]
    pub stager_image: String,

    /// Directories under which DataStages may use hostPath volumes,
    /// comma-separated. A hostPath elsewhere is refused with a condition.
    #[arg(long, env = "FERRY_ALLOWED_HOST_PATHS", value_delimiter = ',', default_value = "/mnt,/data,/var/lib/ferry")]
    pub allowed_host_paths: Vec<String>,

    /// Node directories Ferry owns whole, comma-separated (empty: none). A
    /// pull whose hostPath lies below one mounts that directory and shares
    /// its files with every other such pull on the node through
    /// `DIR/.ferry-shared`, so DataStages of the same objects take their
    /// space once. Each must be one filesystem on every node, and only
    /// Ferry's: its workers may write anywhere in it.
    #[arg(long, env = "FERRY_SHARED_HOST_PATHS", value_delimiter = ',', default_value = "/var/lib/ferry")]
    pub shared_host_paths: Vec<String>,

    /// Address of the health (`/healthz`, `/readyz`) and `/metrics` endpoint.
    #[arg(long, env = "FERRY_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,

    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "FERRY_WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,

    /// Namespace of the leader-election Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,

    /// ServiceAccount of worker pods whose DataStage names none (the Helm
    /// chart creates `ferry-stager`, allowed to report progress). Without it
    /// workers run as their namespace's `default` account.
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

    /// MutatingWebhookConfiguration whose caBundle the operator keeps current.
    #[arg(long, env = "FERRY_WEBHOOK_CONFIGURATION", default_value = "ferry-pod-data")]
    pub webhook_configuration: String,

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
            allowed_host_paths: vec!["/mnt".into(), "/data".into()],
            shared_host_paths: vec!["/var/lib/ferry".into()],
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
        }
    }

    /// Whether `path` (absolute) lies under an allowed prefix.
    pub fn host_path_allowed(&self, path: &str) -> bool {
        self.allowed_host_paths.iter().any(|prefix| {
            let prefix = prefix.trim_end_matches('/');
            path == prefix || path.starts_with(&format!("{prefix}/"))
        })
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
}
