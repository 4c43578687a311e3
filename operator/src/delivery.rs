//! What reaches workers that run in the workers' namespace from the
//! DataStage's namespace: the store's credentials, the store's CA bundle
//! and a web identity token. A pod cannot read a Secret or ConfigMap of
//! another namespace, and the tenant must not be able to read or replace
//! what Ferry's workers trust, so the operator reads them in the
//! DataStage's namespace, with its own rights there, and copies them next
//! to the workers, owned by the DataStage's anchor ([`crate::home`]):
//!
//! * of the credentials Secret, only the keys the store's workers read
//!   ([`credential_keys`]); the copy is refreshed as each run starts, so a
//!   rotated key reaches the next workers;
//! * of the CA bundle, the one key named, as [`CA_FILE`];
//! * for `credentials.webIdentity`, a token the operator requests for the
//!   DataStage's service account (TokenRequest), for an audience the admin
//!   allows ([`crate::admission`]), renewed at half its lifetime while
//!   workers run. No pod of the tenant's ever holds it, and no pod of
//!   Ferry's ever holds a token of Ferry's own for another audience.
//!
//! Pure builders, and the requests that use them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use ferry_contract::Scheme;
use ferry_contract::hub::HF_TOKEN_ENV;
use ferry_contract::options::{
    AZURE_CLIENT_ID_ENV, AZURE_CLIENT_SECRET_ENV, AZURE_STORAGE_ACCOUNT_ENV, AZURE_STORAGE_KEY_ENV,
    AZURE_STORAGE_SAS_TOKEN_ENV, AZURE_TENANT_ID_ENV,
};
use ferry_crds::plan::Plan;
use ferry_crds::{DataStage, WebIdentityCredentials, names};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::home::Home;

/// The operator's copy of the DataStage's credentials Secret.
pub const CREDENTIALS: &str = "credentials";
/// The operator's copy of the DataStage's CA bundle.
pub const CA_BUNDLE: &str = "ca-bundle";
/// The web identity token the operator requested for the DataStage.
pub const WEB_IDENTITY: &str = "web-identity";
/// The token's key in [`WEB_IDENTITY`], and so its file where worker pods
/// mount it.
pub const WEB_IDENTITY_TOKEN_FILE: &str = "token";
/// The file (and key of the copy) the CA bundle is in.
pub const CA_FILE: &str = "ca.pem";

/// The service account whose token a web identity exchanges when the
/// DataStage names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Why something the DataStage names cannot reach its workers.
#[derive(Debug, PartialEq, Eq)]
pub struct Undelivered {
    /// CamelCase reason for the DataStage's condition.
    pub reason: &'static str,
    /// What to do, for a person.
    pub message: String,
}

/// Why delivering failed for a reason that may pass (the API server).
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// The API server refused or could not be reached.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// The keys of a credentials Secret that workers of `scheme` read: the
/// copy holds only these.
pub fn credential_keys(scheme: Scheme) -> &'static [&'static str] {
    match scheme {
        Scheme::S3 => &["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"],
        Scheme::Gcs => &["key.json"],
        Scheme::Azure => &[
            AZURE_STORAGE_ACCOUNT_ENV,
            AZURE_STORAGE_KEY_ENV,
            AZURE_STORAGE_SAS_TOKEN_ENV,
            AZURE_TENANT_ID_ENV,
            AZURE_CLIENT_ID_ENV,
            AZURE_CLIENT_SECRET_ENV,
        ],
        Scheme::Oci => &[".dockerconfigjson"],
        Scheme::Hf => &[HF_TOKEN_ENV],
    }
}

/// The copy, at `home`, of `source` (the DataStage's credentials Secret):
/// only the keys workers of `scheme` read.
pub fn credentials_copy(home: &Home, scheme: Scheme, source: &Secret) -> Secret {
    let keys = credential_keys(scheme);
    let mut data: BTreeMap<String, ByteString> = source
        .data
        .iter()
        .flatten()
        .filter(|(key, _)| keys.contains(&key.as_str()))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    // A Secret written with stringData is read back as data; one created
    // but not yet read back may carry only stringData.
    for (key, value) in source.string_data.iter().flatten() {
        if keys.contains(&key.as_str()) {
            data.entry(key.clone()).or_insert_with(|| ByteString(value.as_bytes().to_vec()));
        }
    }
    Secret {
        metadata: home.metadata(home.held(CREDENTIALS), (names::HOLDS, CREDENTIALS)),
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The copy, at `home`, of the CA bundle `pem`.
pub fn ca_bundle_copy(home: &Home, pem: &str) -> ConfigMap {
    ConfigMap {
        metadata: home.metadata(home.held(CA_BUNDLE), (names::HOLDS, CA_BUNDLE)),
        data: Some(BTreeMap::from([(CA_FILE.to_owned(), pem.to_owned())])),
        ..ConfigMap::default()
    }
}

/// The Secret, at `home`, holding a web identity `token` that expires at
/// `expires`.
pub fn token_secret(home: &Home, token: &str, expires: SystemTime) -> Secret {
    let mut metadata = home.metadata(home.held(WEB_IDENTITY), (names::HOLDS, WEB_IDENTITY));
    let expires = k8s_openapi::jiff::Timestamp::try_from(expires).unwrap_or(k8s_openapi::jiff::Timestamp::MAX);
    metadata.annotations = Some(BTreeMap::from([(names::TOKEN_EXPIRES.to_owned(), expires.to_string())]));
    Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(WEB_IDENTITY_TOKEN_FILE.to_owned(), ByteString(token.as_bytes().to_vec()))])),
        ..Secret::default()
    }
}

/// When the token of a token Secret (as [`token_secret`] wrote it) should
/// be renewed: half its lifetime before it expires, so the kubelet has
/// time to bring the new one to running pods (a Secret volume is updated
/// within its sync period, about a minute). `None`: no expiry recorded,
/// renew now.
pub fn renew_at(secret: &Secret, lifetime: Duration) -> Option<SystemTime> {
    let expires = secret.annotations().get(names::TOKEN_EXPIRES)?;
    let expires: k8s_openapi::jiff::Timestamp = expires.parse().ok()?;
    let expires = SystemTime::from(expires);
    Some(expires.checked_sub(lifetime / 2).unwrap_or(SystemTime::UNIX_EPOCH))
}

/// The lifetime of the DataStage's web identity tokens.
pub fn token_lifetime(identity: &WebIdentityCredentials) -> Duration {
    let seconds = identity.expiration_seconds.unwrap_or(WebIdentityCredentials::DEFAULT_EXPIRATION_SECONDS);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(3600))
}

/// What a DataStage's workers in `home` need delivered before they start.
/// Returns when the web identity token should be renewed, if it has one.
///
/// # Errors
/// [`DeliveryError`] for an API error that may pass; `Ok(Err(_))` for what
/// the DataStage's author or the admin must fix.
pub async fn deliver(
    client: &kube::Client,
    ds: &DataStage,
    plan: &Plan<'_>,
    home: &Home,
) -> Result<Result<Option<SystemTime>, Undelivered>, DeliveryError> {
    if !home.elsewhere() {
        return Ok(Ok(None));
    }
    let namespace = ds.namespace().unwrap_or_default();
    let credentials = plan.store.credentials.as_ref();
    if let Some(name) = credentials.and_then(|c| c.name.as_deref()) {
        let source = match read::<Secret>(client, &namespace, name).await? {
            Read::Found(secret) => secret,
            Read::Missing => return Ok(Err(secret_not_found(plan, name, &namespace))),
            Read::Forbidden => return Ok(Err(not_permitted("read Secret", name, &namespace))),
        };
        let copy = credentials_copy(home, plan.location.scheme, &source);
        if copy.data.as_ref().is_none_or(BTreeMap::is_empty) {
            return Ok(Err(secret_not_found(plan, name, &namespace)));
        }
        apply(client, &home.namespace, &copy).await?;
    }
    if let Some(reference) = &plan.store.ca_bundle {
        let key = reference.key_or_default();
        let problem = match read::<ConfigMap>(client, &namespace, &reference.name).await? {
            Read::Found(found) => match found.data.as_ref().and_then(|data| data.get(key)) {
                Some(pem) => {
                    apply(client, &home.namespace, &ca_bundle_copy(home, pem)).await?;
                    None
                }
                None => Some(format!("ConfigMap '{}' (spec caBundle) has no key {key}", reference.name)),
            },
            Read::Missing => {
                Some(format!("ConfigMap '{}' (spec caBundle) does not exist in namespace {namespace}", reference.name))
            }
            Read::Forbidden => return Ok(Err(not_permitted("read ConfigMap", &reference.name, &namespace))),
        };
        if let Some(problem) = problem {
            return Ok(Err(Undelivered {
                reason: crate::status::reasons::CA_BUNDLE_NOT_FOUND,
                message: format!(
                    "{problem}; create it with the PEM certificates of the CA that signed the store's certificate"
                ),
            }));
        }
    }
    match credentials.and_then(|c| c.web_identity.as_ref()) {
        Some(identity) => request_token(client, ds, identity, home).await,
        None => Ok(Ok(None)),
    }
}

/// Requests a token for the DataStage's service account and stores it
/// next to its workers; returns when to renew it.
///
/// # Errors
/// As [`deliver`].
pub async fn request_token(
    client: &kube::Client,
    ds: &DataStage,
    identity: &WebIdentityCredentials,
    home: &Home,
) -> Result<Result<Option<SystemTime>, Undelivered>, DeliveryError> {
    let namespace = ds.namespace().unwrap_or_default();
    let account = ds.spec.service_account_name.as_deref().unwrap_or(DEFAULT_SERVICE_ACCOUNT);
    let lifetime = token_lifetime(identity);
    let audience = identity.audience.clone().unwrap_or_else(|| WebIdentityCredentials::DEFAULT_AUDIENCE.into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience]),
            expiration_seconds: Some(i64::try_from(lifetime.as_secs()).unwrap_or(3600)),
            bound_object_ref: None,
        }),
        ..TokenRequest::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let issued = match accounts.create_token_request(account, &PostParams::default(), &request).await {
        Ok(issued) => issued,
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Ok(Err(Undelivered {
                reason: crate::status::reasons::SERVICE_ACCOUNT_NOT_FOUND,
                message: format!(
                    "ServiceAccount '{account}' (spec serviceAccountName, whose token credentials.webIdentity exchanges) does not exist in namespace {namespace}; create it, or name another"
                ),
            }));
        }
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Ok(Err(not_permitted("request a token of ServiceAccount", account, &namespace)));
        }
        Err(error) => return Err(error.into()),
    };
    let status = issued.status.unwrap_or_default();
    let expires = status.expiration_timestamp.map_or_else(|| SystemTime::now() + lifetime, |t| SystemTime::from(t.0));
    let secret = token_secret(home, status.token.as_deref().unwrap_or_default(), expires);
    apply(client, &home.namespace, &secret).await?;
    Ok(Ok(renew_at(&secret, lifetime)))
}

/// What one read of an object in the DataStage's namespace found.
enum Read<K> {
    Found(K),
    Missing,
    Forbidden,
}

async fn read<K>(client: &kube::Client, namespace: &str, name: &str) -> Result<Read<K>, DeliveryError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(found)) => Ok(Read::Found(found)),
        Ok(None) => Ok(Read::Missing),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Read::Forbidden),
        Err(error) => Err(error.into()),
    }
}

/// Server-side applies `object` in `namespace` with the operator's field
/// manager.
async fn apply<K>(client: &kube::Client, namespace: &str, object: &K) -> Result<(), DeliveryError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let mut object = object.clone();
    // An apply carries apiVersion and kind.
    let value = serde_json::to_value(&object).map_err(kube::Error::SerdeError)?;
    let mut value = value;
    value["apiVersion"] = serde_json::Value::String(K::api_version(&()).into_owned());
    value["kind"] = serde_json::Value::String(K::kind(&()).into_owned());
    let name = object.meta_mut().name.clone().unwrap_or_default();
    api.patch(&name, &PatchParams::apply(names::OPERATOR_MANAGER).force(), &Patch::Apply(&value)).await?;
    Ok(())
}

fn secret_not_found(plan: &Plan<'_>, secret: &str, namespace: &str) -> Undelivered {
    Undelivered {
        reason: crate::status::reasons::SECRET_NOT_FOUND,
        message: format!(
            "Secret '{secret}' (spec credentials) does not exist in namespace {namespace}, or holds none of the keys {}; create it with them",
            credential_keys(plan.location.scheme).join(", ")
        ),
    }
}

/// The refusal of a namespace the chart was not told of.
pub fn not_permitted(what: &str, name: &str, namespace: &str) -> Undelivered {
    Undelivered {
        reason: crate::status::reasons::NAMESPACE_NOT_ENABLED,
        message: format!(
            "the operator may not {what} '{name}' in namespace {namespace}: Ferry is not enabled there; the cluster admin adds the namespace to the chart's dataStageNamespaces"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn home() -> Home {
        let ds: DataStage = serde_json::from_value(json!({
            "apiVersion": "ferry.dev/v1alpha1", "kind": "DataStage",
            "metadata": {"name": "imagenet", "namespace": "team-a", "uid": "u-1"},
            "spec": {"source": {"uri": "s3://b/p"}, "destination": {"volume": {"nodeCache": "nvme"}}},
        }))
        .unwrap();
        Home::of(&ds, &ds.spec.plan().unwrap(), "ferry-workers", None)
    }

    #[test]
    fn a_credentials_copy_holds_only_the_keys_the_workers_read() {
        let source: Secret = serde_json::from_value(json!({"metadata": {"name": "s3", "namespace": "team-a"},
            "data": {"AWS_ACCESS_KEY_ID": "a2V5", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0", "unrelated": "eA=="},
            "stringData": {"AWS_SESSION_TOKEN": "t"}}))
        .unwrap();
        let copy = credentials_copy(&home(), Scheme::S3, &source);
        assert_eq!(copy.metadata.namespace.as_deref(), Some("ferry-workers"));
        let name = copy.metadata.name.clone().unwrap();
        assert!(name.starts_with("team-a-imagenet-") && name.ends_with("-credentials"), "{name}");
        let data = copy.data.unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]
        );
        assert_eq!(data["AWS_SECRET_ACCESS_KEY"].0, b"secret");
        assert_eq!(copy.metadata.labels.unwrap()[names::DATASTAGE_NAMESPACE], "team-a");
        let gcs = credentials_copy(&home(), Scheme::Gcs, &source);
        assert!(gcs.data.unwrap().is_empty(), "no key.json: nothing to copy");
    }

    #[test]
    fn a_token_is_renewed_at_half_its_lifetime() {
        let expires = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let secret = token_secret(&home(), "t0ken", expires);
        assert_eq!(secret.data.as_ref().unwrap()[WEB_IDENTITY_TOKEN_FILE].0, b"t0ken");
        assert_eq!(renew_at(&secret, Duration::from_secs(3600)), Some(expires - Duration::from_secs(1800)));
        let mut unannotated = secret;
        unannotated.metadata.annotations = None;
        assert_eq!(renew_at(&unannotated, Duration::from_secs(3600)), None);
        let copy = ca_bundle_copy(&home(), "-----BEGIN CERTIFICATE-----");
        assert_eq!(copy.data.unwrap()[CA_FILE], "-----BEGIN CERTIFICATE-----");
    }
}
