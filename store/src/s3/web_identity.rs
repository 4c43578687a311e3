//! Credentials from a web identity: an OpenID token (a projected Kubernetes
//! service-account token, or EKS's IRSA token) exchanged at an STS endpoint
//! with `AssumeRoleWithWebIdentity` for temporary keys.
//!
//! The SDK's own `WebIdentityTokenCredentialsProvider` does the same, but
//! it insists that the response's `AssumedRoleUser.Arn` parses as an AWS
//! ARN, and S3-compatible stores (MinIO's STS among them) send it empty: the
//! exchange succeeds and the provider fails it. So the exchange is the STS
//! client's own call, made here, and the answer is read for what a signer
//! needs (keys, session token, expiry).
//!
//! The token file is read anew at every exchange, since the kubelet rotates
//! it; the caches in front of this provider (the SDK client's identity cache
//! and [`super::credentials`]) ask again before the keys expire.

use std::path::PathBuf;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{self, ProvideCredentials, future};
use aws_sdk_sts::error::{ProvideErrorMetadata as _, SdkError};
use ferry_contract::options::WebIdentityOptions;

use crate::StoreError;

/// Where the token is and what to exchange it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebIdentity {
    /// The file holding the token.
    pub token_file: PathBuf,
    /// The role to assume.
    pub role_arn: String,
    /// The STS endpoint; `None` is AWS STS in the client's region.
    pub sts_endpoint: Option<String>,
    /// The session name the store records.
    pub session_name: Option<String>,
}

impl WebIdentity {
    /// The web identity the options describe: both a token file and a role,
    /// else none (a role alone may belong to a profile the SDK chain reads).
    pub fn from_options(options: &WebIdentityOptions) -> Option<Self> {
        Some(Self {
            token_file: options.web_identity_token_file.clone()?,
            role_arn: options.role_arn.clone()?,
            sts_endpoint: options.sts_endpoint.clone(),
            session_name: options.role_session_name.clone(),
        })
    }
}

/// The STS refused the exchange: the token (its signature, audience or
/// expiry) or the role is not accepted. Found in a request's error chain,
/// it makes the failure `AccessDenied` rather than "no credentials".
#[derive(Debug, thiserror::Error)]
#[error("STS refused the web identity token for role {role_arn}: {message}")]
pub struct WebIdentityRefused {
    /// The STS error code, e.g. `InvalidIdentityToken`, `AccessDenied`.
    pub code: String,
    /// The STS message.
    pub message: String,
    /// The role that was asked for.
    pub role_arn: String,
}

/// Exchanges the token at every call; put a cache in front of it.
#[derive(Debug)]
pub(crate) struct WebIdentityProvider {
    identity: WebIdentity,
    sts: aws_sdk_sts::Client,
}

impl WebIdentityProvider {
    /// A provider that exchanges at `identity`'s endpoint, with the HTTP
    /// client, region and timeouts of `shared` (an SDK configuration
    /// without credentials: the exchange is not signed).
    pub(crate) fn new(identity: WebIdentity, shared: &aws_config::SdkConfig) -> Self {
        let mut config = aws_sdk_sts::config::Builder::from(shared);
        if let Some(endpoint) = &identity.sts_endpoint {
            config = config.endpoint_url(endpoint);
        }
        Self { identity, sts: aws_sdk_sts::Client::from_conf(config.build()) }
    }

    async fn exchange(&self) -> provider::Result {
        let path = &self.identity.token_file;
        let token = tokio::fs::read_to_string(path).await.map_err(|error| {
            CredentialsError::invalid_configuration(format!(
                "cannot read the web identity token {}: {error}",
                path.display()
            ))
        })?;
        let session = self.identity.session_name.clone().unwrap_or_else(default_session_name);
        let response = self
            .sts
            .assume_role_with_web_identity()
            .role_arn(&self.identity.role_arn)
            .role_session_name(session)
            .web_identity_token(token.trim())
            .send()
            .await;
        let output = match response {
            Ok(output) => output,
            Err(SdkError::ServiceError(refusal)) => {
                let error = refusal.err();
                tracing::warn!(role = %self.identity.role_arn, code = error.code().unwrap_or_default(),
                    message = error.message().unwrap_or_default(), "STS refused the web identity token");
                return Err(CredentialsError::provider_error(WebIdentityRefused {
                    code: error.code().unwrap_or("AccessDenied").to_owned(),
                    message: error.message().unwrap_or_default().to_owned(),
                    role_arn: self.identity.role_arn.clone(),
                }));
            }
            Err(other) => return Err(CredentialsError::provider_error(other)),
        };
        let keys = output.credentials.ok_or_else(|| {
            CredentialsError::unhandled("the STS answered AssumeRoleWithWebIdentity without credentials")
        })?;
        let expiry = SystemTime::try_from(keys.expiration)
            .map_err(|_| CredentialsError::unhandled("the STS answered an expiry out of range"))?;
        let lifetime = expiry.duration_since(SystemTime::now()).unwrap_or_default();
        tracing::info!(role = %self.identity.role_arn, expires_in_s = lifetime.as_secs(),
            "exchanged the web identity token for credentials");
        Ok(Credentials::new(
            keys.access_key_id,
            keys.secret_access_key,
            Some(keys.session_token),
            Some(expiry),
            "WebIdentity",
        ))
    }
}

impl ProvideCredentials for WebIdentityProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.exchange())
    }
}

/// A session name STS accepts (`[\w+=,.@-]{2,64}`), unique per exchange.
fn default_session_name() -> String {
    let millis = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis();
    format!("ferry-stager-{millis}")
}

/// `AccessDenied` with the STS's code and message, when the STS refused
/// the exchange that `error` came from.
pub(super) fn access_denied(error: &(dyn std::error::Error + 'static)) -> Option<StoreError> {
    refusal(error).map(|refused| StoreError::AccessDenied { code: refused.code.clone(), message: refused.to_string() })
}

/// The STS refusal under `error`, if the request failed because of one.
fn refusal<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a WebIdentityRefused> {
    crate::causes(error).find_map(|cause| cause.downcast_ref::<WebIdentityRefused>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_web_identity_needs_both_a_token_file_and_a_role() {
        let full = WebIdentityOptions {
            web_identity_token_file: Some("/var/run/secrets/token".into()),
            role_arn: Some("arn:aws:iam::123456789012:role/reader".into()),
            sts_endpoint: Some("https://minio:9000".into()),
            role_session_name: None,
        };
        let identity = WebIdentity::from_options(&full).unwrap();
        assert_eq!(identity.sts_endpoint.as_deref(), Some("https://minio:9000"));
        let role_only = WebIdentityOptions { web_identity_token_file: None, ..full.clone() };
        assert_eq!(WebIdentity::from_options(&role_only), None, "a role alone is the SDK chain's (a profile)");
        let token_only = WebIdentityOptions { role_arn: None, ..full };
        assert_eq!(WebIdentity::from_options(&token_only), None);
    }

    #[test]
    fn a_refusal_is_found_under_the_errors_that_wrap_it() {
        let refused = WebIdentityRefused {
            code: "InvalidIdentityToken".into(),
            message: "audience".into(),
            role_arn: "arn:minio:iam:::role/x".into(),
        };
        let wrapped = CredentialsError::provider_error(refused);
        assert_eq!(refusal(&wrapped).map(|r| r.code.as_str()), Some("InvalidIdentityToken"));
        let other = CredentialsError::not_loaded("nothing here");
        assert!(refusal(&other).is_none());
    }

    #[test]
    fn session_names_are_what_sts_accepts() {
        let name = default_session_name();
        assert!((2..=64).contains(&name.len()));
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "+=,.@-_".contains(c)));
    }
}
