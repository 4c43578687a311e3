//! The webhook's HTTPS endpoint: `POST /mutate-pods` answers the API
//! server's AdmissionReviews of pods with the patch [`super::wiring`]
//! builds; `POST /validate-datastages` judges DataStages as the controller
//! would ([`crate::admission`]), so that what the admin does not allow is
//! refused at `kubectl apply` with the message that says who may.
//!
//! The certificate is swapped in place ([`ServingCertificate`]): a renewal
//! reaches new connections at once, without a restart or a dropped request.

use std::sync::{Arc, RwLock};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use ferry_crds::DataStage;
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use super::wiring::{DataRequest, wire};
use crate::certs::{Bundle, CertError};
use crate::metrics::Metrics;

/// The path the pod webhook configuration names.
pub const MUTATE_PODS_PATH: &str = "/mutate-pods";
/// The path the DataStage webhook configuration names.
pub const VALIDATE_DATASTAGES_PATH: &str = "/validate-datastages";

/// The certificate the server presents, replaceable while it serves.
#[derive(Debug, Default)]
pub struct ServingCertificate {
    /// The certificate's PEM (to tell a renewal) and the pair served.
    current: RwLock<Option<(String, Arc<CertifiedKey>)>>,
}

impl ServingCertificate {
    /// Serves `bundle`'s pair from now on (no-op when it is the same).
    ///
    /// # Errors
    /// When the pair does not parse or does not match.
    pub fn load(&self, bundle: &Bundle) -> Result<bool, CertError> {
        if self.pem().as_deref() == Some(bundle.cert.as_str()) {
            return Ok(false);
        }
        let unparsable = |detail: String| CertError::Unparsable { what: "serving pair", detail };
        use rustls::pki_types::pem::PemObject as _;
        let chain = rustls::pki_types::CertificateDer::pem_slice_iter(bundle.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| unparsable(e.to_string()))?;
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(bundle.key.as_bytes())
            .map_err(|e| unparsable(e.to_string()))?;
        let provider = rustls::crypto::aws_lc_rs::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| unparsable(e.to_string()))?;
        *self.current.write().expect("not poisoned") = Some((bundle.cert.clone(), Arc::new(certified)));
        Ok(true)
    }

    /// The serving certificate's PEM, once loaded.
    pub fn pem(&self) -> Option<String> {
        self.current.read().expect("not poisoned").as_ref().map(|(pem, _)| pem.clone())
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().expect("not poisoned").as_ref().map(|(_, key)| Arc::clone(key))
    }
}

#[derive(Clone)]
struct Handler {
    client: kube::Client,
    metrics: Arc<Metrics>,
    config: Arc<crate::config::OperatorConfig>,
}

/// Binds `addr` and serves admissions over TLS with `certificate` until
/// the process exits; returns the bound address.
///
/// # Errors
/// When the address cannot be bound.
pub async fn serve(
    addr: std::net::SocketAddr,
    certificate: Arc<ServingCertificate>,
    client: kube::Client,
    (metrics, config): (Arc<Metrics>, Arc<crate::config::OperatorConfig>),
) -> std::io::Result<std::net::SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let app = axum::Router::new()
        .route(MUTATE_PODS_PATH, post(mutate_pods))
        .route(VALIDATE_DATASTAGES_PATH, post(validate_datastages))
        .with_state(Handler { client, metrics, config });
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, "webhook accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = acceptor.clone();
            let app = app.clone();
            // Each connection on its own task: a slow handshake holds up
            // nobody else, and a stalled one is dropped after 10 s.
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(std::time::Duration::from_secs(10), acceptor.accept(tcp));
                let tls = match handshake.await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => return tracing::debug!(%peer, %error, "webhook TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "webhook TLS handshake timed out"),
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
                if let Err(error) = connection.await {
                    tracing::debug!(%peer, %error, "webhook connection ended");
                }
            });
        }
    });
    Ok(bound)
}

async fn mutate_pods(
    State(handler): State<Handler>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            handler.metrics.webhook_admission("invalid");
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let (outcome, response) = match admit(&handler.client, &request).await {
        Ok(None) => ("ignored", response),
        Ok(Some(patch)) if patch.0.is_empty() => ("unchanged", response),
        Ok(Some(patch)) => match response.clone().with_patch(patch) {
            Ok(patched) => ("mutated", patched),
            Err(error) => ("denied", response.deny(error.to_string())),
        },
        Err(message) => ("denied", response.deny(message)),
    };
    handler.metrics.webhook_admission(outcome);
    let pod = request.object.as_ref().map(|p| p.metadata.generate_name.clone().or(p.metadata.name.clone()));
    tracing::info!(namespace = ?request.namespace, pod = ?pod.flatten(), outcome, "pod admission");
    Json(response.into_review())
}

/// The patch for the pod in `request`, `None` when it does not ask for
/// data, or why it is refused.
async fn admit(client: &kube::Client, request: &AdmissionRequest<Pod>) -> Result<Option<json_patch::Patch>, String> {
    let Some(pod) = request.object.as_ref() else { return Ok(None) };
    let Some(data) = DataRequest::of(pod).map_err(|e| e.to_string())? else { return Ok(None) };
    let namespace = request.namespace.clone().unwrap_or_default();
    let found = look_up_datastages(client, &namespace, &data.names).await.map_err(|e| {
        format!("cannot read the DataStages {} in {namespace} to wire this pod: {e}", data.names.join(", "))
    })?;
    let found: Vec<Option<&DataStage>> = found.iter().map(Option::as_ref).collect();
    wire(pod, &data, &found).map(Some).map_err(|e| e.to_string())
}

async fn validate_datastages(
    State(handler): State<Handler>,
    Json(review): Json<AdmissionReview<DataStage>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DataStage> = match review.try_into() {
        Ok(request) => request,
        Err(error) => {
            handler.metrics.webhook_admission("invalid");
            return Json(AdmissionResponse::invalid(error.to_string()).into_review());
        }
    };
    let response = AdmissionResponse::from(&request);
    let (outcome, response) = match judge(&handler, &request).await {
        Ok(()) => ("allowed", response),
        Err(message) => ("denied", response.deny(message)),
    };
    handler.metrics.webhook_admission(outcome);
    let name = request.object.as_ref().map(kube::ResourceExt::name_any);
    tracing::info!(namespace = ?request.namespace, datastage = ?name, outcome, "DataStage admission");
    Json(response.into_review())
}

/// Whether the DataStage in `request` may be created (or its spec changed
/// to what it asks), by [`crate::admission::validate`]; why not otherwise.
async fn judge(handler: &Handler, request: &AdmissionRequest<DataStage>) -> Result<(), String> {
    let Some(ds) = request.object.as_ref() else { return Ok(()) };
    // Metadata and status changes (a finalizer going) are never refused:
    // a DataStage made before a rule must stay deletable.
    if request.old_object.as_ref().is_some_and(|old| old.spec == ds.spec) {
        return Ok(());
    }
    let Ok(plan) = ds.spec.plan() else { return Ok(()) };
    let namespace = request.namespace.clone().unwrap_or_default();
    let mut ds = ds.clone();
    ds.metadata.namespace = Some(namespace.clone());
    let node_cache = match plan.volume {
        ferry_crds::plan::Volume::NodeCache(name) => {
            let caches = kube::Api::<ferry_crds::NodeCache>::all(handler.client.clone());
            caches
                .get_opt(name)
                .await
                .map_err(|e| format!("cannot read NodeCache {name} to judge this DataStage: {e}"))?
        }
        _ => None,
    };
    let labels = match &node_cache {
        Some(cache) if cache.spec.namespace_selector.is_some() => {
            let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(handler.client.clone());
            let found = namespaces
                .get_metadata(&namespace)
                .await
                .map_err(|e| format!("cannot read namespace {namespace} to judge this DataStage: {e}"))?;
            Some(found.metadata.labels.unwrap_or_default())
        }
        _ => None,
    };
    let facts = crate::admission::Facts { node_cache: node_cache.as_ref(), namespace_labels: labels.as_ref() };
    crate::admission::validate(&ds, &plan, &handler.config, &facts).map(|_| ()).map_err(|invalid| invalid.message)
}

/// The DataStages `names` in `namespace`, in order (`None`: it does not
/// exist): what both the webhook and the gate controller judge a pod by.
///
/// # Errors
/// When the API server refuses or cannot be reached.
pub async fn look_up_datastages(
    client: &kube::Client,
    namespace: &str,
    names: &[String],
) -> Result<Vec<Option<ferry_crds::DataStage>>, kube::Error> {
    let api = kube::Api::<ferry_crds::DataStage>::namespaced(client.clone(), namespace);
    let mut found = Vec::with_capacity(names.len());
    for name in names {
        found.push(api.get_opt(name).await?);
    }
    Ok(found)
}
