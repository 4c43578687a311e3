//! Microsoft Entra ID tokens for Azure Storage, so that `az://` needs no
//! key: a service principal's client secret, or a federated token (Azure
//! Workload Identity: the pod's projected service-account token), exchanged
//! at the tenant's token endpoint for an access token to
//! `https://storage.azure.com/.default` (OAuth 2.0 client credentials).
//!
//! The variables are the ones the Azure SDKs read and Workload Identity's
//! webhook injects (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`,
//! `AZURE_CLIENT_SECRET` or `AZURE_FEDERATED_TOKEN_FILE`,
//! `AZURE_AUTHORITY_HOST`), so a pod set up for any Azure SDK needs nothing
//! more. An access token is kept until five minutes before it expires (or
//! half its life, when that is shorter); the federated token file is read
//! anew for every exchange, because the kubelet rotates it.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;

use ferry_contract::options::{
    AZURE_AUTHORITY_HOST_ENV, AZURE_CLIENT_ID_ENV, AZURE_CLIENT_SECRET_ENV, AZURE_FEDERATED_TOKEN_FILE_ENV,
    AZURE_TENANT_ID_ENV,
};

use crate::StoreError;
use crate::http::{HttpClient, client_for, encode_uri, exchange, read_body};

/// The authority when `AZURE_AUTHORITY_HOST` names none (Azure's public cloud).
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com/";

/// What every token is asked for: Azure Storage, with the roles the
/// identity holds on it.
const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

/// How long before its expiry an access token is replaced.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// An identity in a tenant, and how it proves itself.
#[derive(Clone, PartialEq, Eq)]
pub struct EntraIdentity {
    /// The tenant (directory) id.
    pub tenant_id: String,
    /// The application (client) id.
    pub client_id: String,
    /// The proof.
    pub proof: EntraProof,
    /// The authority's URL, with a trailing slash.
    pub authority_host: String,
}

/// How an identity proves itself to the token endpoint.
#[derive(Clone, PartialEq, Eq)]
pub enum EntraProof {
    /// A service principal's client secret.
    ClientSecret(String),
    /// A file holding a federated token (a JWT the tenant trusts through a
    /// federated identity credential), sent as the client assertion.
    FederatedTokenFile(PathBuf),
}

impl std::fmt::Debug for EntraProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        match self {
            EntraProof::ClientSecret(_) => f.write_str("client secret"),
            EntraProof::FederatedTokenFile(path) => write!(f, "federated token {}", path.display()),
        }
    }
}

impl std::fmt::Debug for EntraIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Entra(tenant {}, client {}, {:?})", self.tenant_id, self.client_id, self.proof)
    }
}

impl EntraIdentity {
    /// The identity the environment names, if it names one: a tenant, a
    /// client and a secret or a federated token file. A client secret wins
    /// over a token file, as in the Azure SDKs' environment credential.
    ///
    /// # Errors
    /// A secret or token file without the tenant and client it belongs to.
    pub fn from_env() -> Result<Option<Self>, StoreError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Self::from_values(
            var(AZURE_TENANT_ID_ENV),
            var(AZURE_CLIENT_ID_ENV),
            var(AZURE_CLIENT_SECRET_ENV),
            var(AZURE_FEDERATED_TOKEN_FILE_ENV).map(PathBuf::from),
            var(AZURE_AUTHORITY_HOST_ENV),
        )
    }

    /// The identity these values name (see [`EntraIdentity::from_env`]).
    ///
    /// # Errors
    /// A secret or token file without the tenant and client it belongs to.
    pub fn from_values(
        tenant_id: Option<String>,
        client_id: Option<String>,
        client_secret: Option<String>,
        federated_token_file: Option<PathBuf>,
        authority_host: Option<String>,
    ) -> Result<Option<Self>, StoreError> {
        let proof = match (client_secret, federated_token_file) {
            (Some(secret), _) => EntraProof::ClientSecret(secret),
            (None, Some(file)) => EntraProof::FederatedTokenFile(file),
            (None, None) => return Ok(None),
        };
        let (Some(tenant_id), Some(client_id)) = (tenant_id, client_id) else {
            let what = match proof {
                EntraProof::ClientSecret(_) => AZURE_CLIENT_SECRET_ENV,
                EntraProof::FederatedTokenFile(_) => AZURE_FEDERATED_TOKEN_FILE_ENV,
            };
            return Err(StoreError::NoCredentials(format!(
                "{what} is set, but not both {AZURE_TENANT_ID_ENV} and {AZURE_CLIENT_ID_ENV}: name the tenant and \
                 the application (client) id it belongs to"
            )));
        };
        let mut authority_host = authority_host.unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_owned());
        if !authority_host.ends_with('/') {
            authority_host.push('/');
        }
        Ok(Some(Self { tenant_id, client_id, proof, authority_host }))
    }

    /// The tenant's token endpoint (OAuth 2.0, v2).
    pub fn token_url(&self) -> String {
        format!("{}{}/oauth2/v2.0/token", self.authority_host, encode_uri(&self.tenant_id, false))
    }

    /// The form the token endpoint is sent, given the federated token when
    /// the proof is one.
    fn token_form(&self, federated_token: Option<&str>) -> String {
        let mut pairs = vec![
            ("grant_type", "client_credentials"),
            ("client_id", self.client_id.as_str()),
            ("scope", STORAGE_SCOPE),
        ];
        match (&self.proof, federated_token) {
            (EntraProof::ClientSecret(secret), _) => pairs.push(("client_secret", secret)),
            (EntraProof::FederatedTokenFile(_), token) => pairs.extend([
                ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
                ("client_assertion", token.unwrap_or_default()),
            ]),
        }
        pairs.iter().map(|(name, value)| format!("{name}={}", encode_uri(value, false))).collect::<Vec<_>>().join("&")
    }
}

/// What the token endpoint answers.
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: u64,
}

/// What the token endpoint answers when it refuses (`AADSTS…` codes).
#[derive(Deserialize)]
struct TokenRefusal {
    error: String,
    #[serde(default)]
    error_description: String,
}

/// An access token and when to replace it, from the endpoint's answer.
fn parse_answer(body: &[u8], received: Instant) -> Result<(String, Instant), StoreError> {
    let answer: TokenAnswer = serde_json::from_slice(body).map_err(|e| StoreError::Rejected {
        code: "InvalidTokenResponse".into(),
        message: format!("the Entra ID token endpoint answered no access token: {e}"),
    })?;
    let lifetime = Duration::from_secs(answer.expires_in);
    let keep = if lifetime > 2 * REFRESH_MARGIN { lifetime - REFRESH_MARGIN } else { lifetime / 2 };
    Ok((answer.access_token, received + keep))
}

/// Access tokens for one identity, fetched when needed and shared by every
/// request of a store.
pub(crate) struct EntraTokens {
    identity: EntraIdentity,
    client: HttpClient,
    request_timeout: Duration,
    current: Mutex<Option<(String, Instant)>>,
}

impl EntraTokens {
    /// A token source for `identity`.
    ///
    /// # Errors
    /// An authority that is no URL, or over https no TLS roots.
    pub(crate) fn new(
        identity: EntraIdentity,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> Result<Self, StoreError> {
        let client = client_for(&identity.authority_host, connect_timeout)?;
        Ok(Self { identity, client, request_timeout, current: Mutex::new(None) })
    }

    /// The `Authorization` value for a request now: the kept token while it
    /// is fresh, else a new one. Concurrent requests wait for one exchange.
    pub(crate) async fn authorization(&self) -> Result<String, StoreError> {
        let mut current = self.current.lock().await;
        if let Some((token, replace_at)) = current.as_ref()
            && Instant::now() < *replace_at
        {
            return Ok(format!("Bearer {token}"));
        }
        let (token, replace_at) = self.exchange().await?;
        let value = format!("Bearer {token}");
        *current = Some((token, replace_at));
        Ok(value)
    }

    async fn exchange(&self) -> Result<(String, Instant), StoreError> {
        let identity = &self.identity;
        let federated = match &identity.proof {
            EntraProof::ClientSecret(_) => None,
            EntraProof::FederatedTokenFile(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| {
                        StoreError::NoCredentials(format!(
                            "the federated token file {} ({AZURE_FEDERATED_TOKEN_FILE_ENV}) cannot be read: {e}",
                            path.display()
                        ))
                    })?
                    .trim()
                    .to_owned(),
            ),
        };
        let url = identity.token_url();
        let request = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(identity.token_form(federated.as_deref()))))
            .map_err(|e| StoreError::Rejected { code: "InvalidEndpoint".into(), message: e.to_string() })?;
        let received = Instant::now();
        // A transport failure names the token endpoint: the store's own
        // endpoint may be fine, and the message must say which one is not.
        let answered =
            exchange(&self.client, request, self.request_timeout, &url).await.map_err(|error| match error {
                StoreError::Transient { reason, detail } => {
                    StoreError::Transient { reason, detail: format!("Entra ID token endpoint {url}: {detail}") }
                }
                other => other,
            })?;
        match answered {
            Ok(response) => {
                let body = read_body(response, self.request_timeout, 64 << 10, "a token answer").await?;
                parse_answer(&body, received)
            }
            Err(failed) => {
                // Entra answers 400 or 401 with a JSON error for a wrong
                // secret, an untrusted assertion or an unknown client: the
                // identity is refused, which retrying does not change.
                let (code, detail) = match serde_json::from_str::<TokenRefusal>(&failed.body) {
                    Ok(refusal) => (refusal.error, refusal.error_description),
                    Err(_) => (format!("HTTP {}", failed.status), failed.body.trim().to_owned()),
                };
                let message = format!(
                    "Entra ID ({url}) refused client {} of tenant {}: {code}: {detail}",
                    identity.client_id, identity.tenant_id
                );
                if failed.status >= 500 || failed.status == 429 {
                    Err(StoreError::transient(crate::RetryReason::ServerError, message))
                } else {
                    Err(StoreError::AccessDenied { code, message })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some(value: &str) -> Option<String> {
        Some(value.to_owned())
    }

    #[test]
    fn the_environment_names_a_secret_or_a_token_file_with_its_tenant_and_client() {
        let secret =
            EntraIdentity::from_values(some("t"), some("c"), some("s"), Some("/f".into()), None).unwrap().unwrap();
        assert_eq!(secret.proof, EntraProof::ClientSecret("s".into()), "a secret wins, as in the Azure SDKs");
        assert_eq!(secret.token_url(), "https://login.microsoftonline.com/t/oauth2/v2.0/token");
        let federated =
            EntraIdentity::from_values(some("t"), some("c"), None, Some("/f".into()), some("http://127.0.0.1:1"))
                .unwrap()
                .unwrap();
        assert_eq!(federated.proof, EntraProof::FederatedTokenFile("/f".into()));
        assert_eq!(federated.token_url(), "http://127.0.0.1:1/t/oauth2/v2.0/token");
        assert!(EntraIdentity::from_values(some("t"), some("c"), None, None, None).unwrap().is_none());
        let error = EntraIdentity::from_values(None, some("c"), some("s"), None, None).unwrap_err().to_string();
        assert!(error.contains("AZURE_CLIENT_SECRET is set, but not both AZURE_TENANT_ID"), "{error}");
        assert_eq!(format!("{secret:?}"), "Entra(tenant t, client c, client secret)");
    }

    #[test]
    fn the_token_form_asks_for_storage_with_the_secret_or_the_federated_assertion() {
        let secret = EntraIdentity::from_values(some("t"), some("app id"), some("a&b"), None, None).unwrap().unwrap();
        assert_eq!(
            secret.token_form(None),
            "grant_type=client_credentials&client_id=app%20id&scope=https%3A%2F%2Fstorage.azure.com%2F.default\
             &client_secret=a%26b"
        );
        let federated =
            EntraIdentity::from_values(some("t"), some("c"), None, Some("/f".into()), None).unwrap().unwrap();
        assert_eq!(
            federated.token_form(Some("e.y.j")),
            "grant_type=client_credentials&client_id=c&scope=https%3A%2F%2Fstorage.azure.com%2F.default\
             &client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer\
             &client_assertion=e.y.j"
        );
    }

    #[test]
    fn a_token_is_kept_until_shortly_before_it_expires() {
        let now = Instant::now();
        let (token, replace_at) =
            parse_answer(br#"{"access_token":"x","expires_in":3599,"token_type":"Bearer"}"#, now).unwrap();
        assert_eq!(token, "x");
        assert_eq!(replace_at - now, Duration::from_secs(3599 - 300));
        let (_, short) = parse_answer(br#"{"access_token":"x","expires_in":120}"#, now).unwrap();
        assert_eq!(short - now, Duration::from_secs(60), "half the life of a short token");
        let error = parse_answer(br#"{"error":"x"}"#, now).unwrap_err().to_string();
        assert!(error.contains("no access token"), "{error}");
    }
}
