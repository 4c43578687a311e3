//! The admission webhooks: training pods that name a DataStage get its
//! volume mounted and a scheduling gate at admission, so they need no init
//! container and no Role of their own; DataStages are judged
//! ([`crate::admission`]) so that what the admin does not allow is refused
//! at `kubectl apply`.
//!
//! * [`wiring`]: what a pod asks for and the patch it gets (pure).
//! * [`server`]: the HTTPS endpoint the API server calls.
//! * [`crate::certs`]: its CA and serving certificate (pure).
//!
//! Every replica serves the webhook (the API server picks any endpoint of
//! the Service) and keeps its certificate current: [`keep_certificates`]
//! reads the Secret, renews what is due (operator-issued certificates
//! only), publishes the CA bundle in the webhook configuration and loads
//! the serving pair. Replicas that race to renew are ordered by the
//! Secret's resourceVersion: one write wins, the others read it next round.

pub mod server;
pub mod wiring;

pub use server::look_up_datastages;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use futures::stream::BoxStream;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::certs::{self, Bundle, CertError, Lifetimes, Purpose};
use crate::config::{OperatorConfig, WebhookCerts};
use crate::metrics::Metrics;
use server::ServingCertificate;

/// Why one round of certificate keeping failed (the next round retries).
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Api(#[from] kube::Error),
    /// Certificates could not be read or issued.
    #[error(transparent)]
    Cert(#[from] CertError),
    /// `external` certificates, but nobody has written the Secret yet.
    #[error("Secret {0} does not exist yet (waiting for its issuer, e.g. cert-manager)")]
    NoSecret(String),
}

/// Starts the webhook: binds its address, then keeps its certificate
/// current in the background. Handshakes fail until the first certificate
/// is loaded (a fraction of a second with operator-issued ones); `current`
/// turns true once one is served and its CA published, which is when the
/// operator may say it is ready: a DataStage created before then would be
/// refused by an API server that does not trust the webhook yet.
///
/// # Errors
/// When the address cannot be bound.
pub async fn start(
    client: kube::Client,
    config: &OperatorConfig,
    addr: std::net::SocketAddr,
    metrics: Arc<Metrics>,
    current: Arc<AtomicBool>,
) -> std::io::Result<std::net::SocketAddr> {
    let certificate = Arc::new(ServingCertificate::default());
    let shared = (Arc::clone(&metrics), Arc::new(config.clone()));
    let bound = server::serve(addr, Arc::clone(&certificate), client.clone(), shared).await?;
    tokio::spawn(keep_certificates(client, config.clone(), certificate, metrics, current));
    Ok(bound)
}

/// How often certificates are looked at: often enough that a renewal, or a
/// caBundle a `helm upgrade` reset, is put right within seconds.
fn check_interval(config: &OperatorConfig) -> Duration {
    (config.webhook_cert_lifetime / 20).clamp(Duration::from_secs(1), Duration::from_secs(30))
}

/// Keeps the served certificate and the published CA bundle current,
/// forever; `current` is true from the first round that made them so.
pub async fn keep_certificates(
    client: kube::Client,
    config: OperatorConfig,
    certificate: Arc<ServingCertificate>,
    metrics: Arc<Metrics>,
    current: Arc<AtomicBool>,
) {
    let interval = check_interval(&config);
    let mut configurations = configuration_changes(&client, &config);
    loop {
        match keep_once(&client, &config, &certificate).await {
            Ok(Current::Renewed(not_after)) => {
                metrics.certificate_expires(not_after);
                current.store(true, Ordering::Relaxed);
            }
            Ok(Current::Unchanged) => current.store(true, Ordering::Relaxed),
            Ok(Current::LostRace) => continue,
            Err(error) => tracing::warn!(%error, "webhook certificate not current"),
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            Some(()) = configurations.next() => {}
        }
    }
}

/// A tick each time one of the webhook configurations is created or
/// changed: Helm creates them after the operator may have started, and a
/// `helm upgrade` empties their caBundle; either must be put right at once,
/// not at the next round, or the API server refuses every DataStage.
fn configuration_changes(client: &kube::Client, config: &OperatorConfig) -> BoxStream<'static, ()> {
    use kube::runtime::{WatchStreamExt as _, watcher};
    let named = |name: &str| watcher::Config::default().fields(&format!("metadata.name={name}"));
    let pods = watcher(Api::<MutatingWebhookConfiguration>::all(client.clone()), named(&config.webhook_configuration));
    let datastages = watcher(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        named(&config.webhook_validating_configuration),
    );
    let pods = pods.default_backoff().filter_map(|event| std::future::ready(event.ok().map(|_| ())));
    let datastages = datastages.default_backoff().filter_map(|event| std::future::ready(event.ok().map(|_| ())));
    futures::stream::select(pods, datastages).boxed()
}

/// What one round of [`keep_once`] left.
enum Current {
    /// A newly loaded serving certificate, valid until then.
    Renewed(SystemTime),
    /// The same certificate as before, its CA published.
    Unchanged,
    /// Another replica stored a certificate first: what this one published
    /// is not the one that will be served, so look again at once.
    LostRace,
}

/// One round; returns the expiry of a newly loaded serving certificate.
async fn keep_once(
    client: &kube::Client,
    config: &OperatorConfig,
    certificate: &ServingCertificate,
) -> Result<Current, WebhookError> {
    let namespace = &config.leader_election_namespace;
    let secrets = Api::<Secret>::namespaced(client.clone(), namespace);
    let secret = secrets.get_opt(&config.webhook_secret).await?;
    let stored = secret.as_ref().and_then(|s| s.data.as_ref()).map(Bundle::from_secret_data);
    let bundle = match config.webhook_certs {
        WebhookCerts::External => match stored {
            Some(bundle) => bundle?,
            None => return Err(WebhookError::NoSecret(config.webhook_secret.clone())),
        },
        WebhookCerts::Operator => {
            let names = certs::service_names(&config.webhook_service, namespace);
            let lifetimes = Lifetimes { ca: config.webhook_ca_lifetime, serving: config.webhook_cert_lifetime };
            let current = stored.and_then(Result::ok);
            match certs::renew(Purpose::Webhook, current.as_ref(), &names, lifetimes, SystemTime::now())? {
                None => {
                    let bundle = current.expect("renew issues when there is nothing");
                    publish_ca_bundle(client, config, &bundle.ca_bundle).await?;
                    bundle
                }
                Some(renewed) => {
                    // Trust first, serve second: the API server must know a
                    // new CA before any replica presents what it signed.
                    publish_ca_bundle(client, config, &renewed.ca_bundle).await?;
                    if !store(&secrets, secret, config, &renewed).await? {
                        return Ok(Current::LostRace);
                    }
                    tracing::info!(secret = %config.webhook_secret, "issued a webhook serving certificate");
                    renewed
                }
            }
        }
    };
    if certificate.load(&bundle)? {
        let validity = certs::validity_of(&bundle.cert)?;
        tracing::info!(not_after = ?validity.not_after, "serving the webhook with a new certificate");
        return Ok(Current::Renewed(validity.not_after));
    }
    Ok(Current::Unchanged)
}

/// Writes `bundle` into the Secret, conditional on the version read;
/// `false` when another replica wrote first.
async fn store(
    secrets: &Api<Secret>,
    existing: Option<Secret>,
    config: &OperatorConfig,
    bundle: &Bundle,
) -> Result<bool, WebhookError> {
    let data: std::collections::BTreeMap<String, ByteString> = bundle.to_secret_data();
    let result = match existing {
        // The chart creates the Secret empty (so Helm owns and removes it)
        // and the operator only fills it in; its type is left as it is.
        Some(mut secret) => {
            secret.data = Some(data);
            secrets.replace(&config.webhook_secret, &PostParams::default(), &secret).await
        }
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(config.webhook_secret.clone()),
                    labels: Some([("app.kubernetes.io/managed-by".to_owned(), "ferry-operator".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..Secret::default()
            };
            secrets.create(&PostParams::default(), &secret).await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Sets `caBundle` on this operator's webhooks (those calling its Service)
/// in both configurations, the pods' and the DataStages'; a configuration
/// not installed is not an error (the chart may have the webhook off).
async fn publish_ca_bundle(
    client: &kube::Client,
    config: &OperatorConfig,
    ca_bundle: &str,
) -> Result<(), WebhookError> {
    let wanted = ByteString(ca_bundle.as_bytes().to_vec());
    let ours = |service: Option<&k8s_openapi::api::admissionregistration::v1::ServiceReference>| {
        service.is_some_and(|s| s.name == config.webhook_service && s.namespace == config.leader_election_namespace)
    };
    let pods = Api::<MutatingWebhookConfiguration>::all(client.clone());
    if let Some(mut configuration) = pods.get_opt(&config.webhook_configuration).await? {
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if ours(webhook.client_config.service.as_ref()) && webhook.client_config.ca_bundle.as_ref() != Some(&wanted)
            {
                webhook.client_config.ca_bundle = Some(wanted.clone());
                changed = true;
            }
        }
        if changed {
            replace(&pods, &config.webhook_configuration, &configuration).await?;
        }
    } else {
        tracing::debug!(name = %config.webhook_configuration, "no pod webhook configuration to publish the CA in");
    }
    let datastages = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    if let Some(mut configuration) = datastages.get_opt(&config.webhook_validating_configuration).await? {
        let mut changed = false;
        for webhook in configuration.webhooks.iter_mut().flatten() {
            if ours(webhook.client_config.service.as_ref()) && webhook.client_config.ca_bundle.as_ref() != Some(&wanted)
            {
                webhook.client_config.ca_bundle = Some(wanted.clone());
                changed = true;
            }
        }
        if changed {
            replace(&datastages, &config.webhook_validating_configuration, &configuration).await?;
        }
    } else {
        tracing::debug!(name = %config.webhook_validating_configuration, "no DataStage webhook configuration to publish the CA in");
    }
    Ok(())
}

/// Replaces a webhook configuration; another replica's write first is fine.
async fn replace<K>(api: &Api<K>, name: &str, configuration: &K) -> Result<(), WebhookError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.replace(name, &PostParams::default(), configuration).await {
        Ok(_) => tracing::info!(%name, "published the webhook CA bundle"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    Ok(())
}
