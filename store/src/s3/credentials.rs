//! Credentials for the data paths that bypass the SDK, from the SDK's own
//! configuration chain (environment, profile, web identity / IRSA,
//! container and instance metadata, SSO, `credential_process`).
//!
//! The SDK client caches what its provider returns in an identity cache
//! that only its own requests use; the provider itself may go to the
//! network (metadata, STS) every time it is asked. So the hyper and
//! `object_store` data paths share this cache: the provider is asked once,
//! and again only when the credentials are about to expire, by one request
//! while the others wait for its answer.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use aws_sdk_s3::config::{ProvideCredentials as _, SharedCredentialsProvider};
use aws_smithy_runtime_api::client::identity::Identity;

use crate::StoreError;

/// How long before they expire credentials are replaced, at most (the SDK's
/// identity cache uses a similar margin).
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Credentials resolved once and kept until shortly before they expire.
pub(super) struct CachedCredentials {
    provider: Option<SharedCredentialsProvider>,
    current: RwLock<Option<Arc<Resolved>>>,
    /// Held by the one request that asks the provider.
    refresh: tokio::sync::Mutex<()>,
}

/// Credentials as the signers want them.
pub(super) struct Resolved {
    /// The keys (and session token), as `aws-sigv4` takes them.
    pub(super) identity: Identity,
    /// When to ask the provider again; never for credentials that do not expire.
    refresh_at: Option<SystemTime>,
}

impl std::fmt::Debug for CachedCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedCredentials").field("provider", &self.provider).finish_non_exhaustive()
    }
}

impl CachedCredentials {
    /// A cache in front of the SDK configuration's provider (none: every
    /// request fails with [`StoreError::NoCredentials`], as the SDK's would).
    pub(super) fn new(provider: Option<SharedCredentialsProvider>) -> Self {
        Self { provider, current: RwLock::new(None), refresh: tokio::sync::Mutex::new(()) }
    }

    /// The current credentials, from the cache unless they are about to expire.
    pub(super) async fn get(&self) -> Result<Arc<Resolved>, StoreError> {
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let _refreshing = self.refresh.lock().await;
        // Another request may have refreshed them while this one waited.
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let provider = self.provider.as_ref().ok_or_else(|| {
            StoreError::NoCredentials("no credentials provider is configured for the S3 client".to_owned())
        })?;
        let credentials = provider.provide_credentials().await.map_err(|e| {
            super::web_identity::access_denied(&e).unwrap_or_else(|| StoreError::NoCredentials(crate::error_chain(&e)))
        })?;
        let refresh_at = credentials.expiry().map(|expiry| refresh_time(SystemTime::now(), expiry));
        let resolved = Arc::new(Resolved { identity: Identity::from(credentials), refresh_at });
        *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::clone(&resolved));
        Ok(resolved)
    }

    fn fresh(&self) -> Option<Arc<Resolved>> {
        let current = self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        current.as_ref().filter(|resolved| resolved.refresh_at.is_none_or(|at| SystemTime::now() < at)).map(Arc::clone)
    }
}

/// When credentials that expire at `expiry` should be replaced: the margin
/// before it, or half their remaining life when that is shorter (so
/// short-lived credentials are not fetched for every request).
fn refresh_time(now: SystemTime, expiry: SystemTime) -> SystemTime {
    let life = expiry.duration_since(now).unwrap_or_default();
    expiry - REFRESH_MARGIN.min(life / 2)
}

#[cfg(test)]
mod tests {
    use aws_sdk_s3::config::Credentials;

    use super::*;

    #[test]
    fn credentials_are_replaced_before_they_expire_but_not_for_every_request() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = now + Duration::from_secs(3600);
        assert_eq!(refresh_time(now, hour), hour - REFRESH_MARGIN);
        let soon = now + Duration::from_secs(60);
        assert_eq!(refresh_time(now, soon), now + Duration::from_secs(30));
        assert_eq!(refresh_time(now, now - Duration::from_secs(1)), now - Duration::from_secs(1));
    }

    #[tokio::test]
    async fn the_provider_is_asked_once_while_the_credentials_last() {
        use std::sync::atomic::{AtomicUsize, Ordering};

        #[derive(Debug, Default)]
        struct Counting(Arc<AtomicUsize>);
        impl aws_sdk_s3::config::ProvideCredentials for Counting {
            fn provide_credentials<'a>(&'a self) -> aws_credential_types::provider::future::ProvideCredentials<'a>
            where
                Self: 'a,
            {
                self.0.fetch_add(1, Ordering::SeqCst);
                let expiry = SystemTime::now() + Duration::from_secs(3600);
                aws_credential_types::provider::future::ProvideCredentials::ready(Ok(Credentials::new(
                    "key",
                    "secret",
                    None,
                    Some(expiry),
                    "test",
                )))
            }
        }
        let calls = Arc::new(AtomicUsize::new(0));
        let cache = CachedCredentials::new(Some(SharedCredentialsProvider::new(Counting(Arc::clone(&calls)))));
        for _ in 0..5 {
            assert_eq!(cache.get().await.unwrap().identity.data::<Credentials>().unwrap().access_key_id(), "key");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let none = CachedCredentials::new(None);
        assert!(matches!(none.get().await, Err(StoreError::NoCredentials(_))));
    }
}
