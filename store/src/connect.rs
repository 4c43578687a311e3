//! From a location and the options every front end takes to a configured
//! store: the one place a [`Scheme`] picks a backend.

use std::sync::Arc;

use ferry_contract::{ObjectLocation, Scheme, TransferOptions};

use crate::{ObjectStore, StoreError};

/// The store a location names, configured from the options.
///
/// # Errors
/// A scheme whose backend this build was compiled without (its cargo
/// feature is off), or a store that cannot be addressed (see each
/// backend's `connect`).
pub async fn connect(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    match location.scheme {
        Scheme::S3 => s3(options, location).await,
        Scheme::Gcs => gcs(options, location).await,
        Scheme::Azure => azure(options, location).await,
        Scheme::Oci => oci(options, location).await,
        Scheme::Hf => hf(options, location).await,
    }
}

#[cfg(feature = "s3")]
async fn s3(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use crate::s3::{S3Options, S3Store, WebIdentity};
    let s3 = S3Options {
        endpoint_url: options.endpoint_url.clone(),
        // S3-compatible servers rarely care about the region; defaulting
        // it here spares a lookup in instance metadata that cannot succeed.
        region: options.region.clone().or_else(|| options.endpoint_url.as_ref().map(|_| "us-east-1".to_owned())),
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
        web_identity: WebIdentity::from_options(&options.web_identity),
    };
    Ok(Arc::new(S3Store::connect(&location.bucket, &s3).await?))
}

#[cfg(feature = "gcs")]
async fn gcs(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use crate::gcs::{GcsOptions, GcsStore};
    // The emulator convention of Google's own client libraries.
    let emulator = std::env::var("STORAGE_EMULATOR_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .map(|host| if host.contains("://") { host } else { format!("http://{host}") });
    let gcs = GcsOptions {
        endpoint_url: options.endpoint_url.clone().or_else(|| emulator.clone()),
        anonymous: options.anonymous || emulator.is_some(),
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
    };
    Ok(Arc::new(GcsStore::connect(&location.bucket, &gcs).await))
}

#[cfg(feature = "azure")]
async fn azure(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use crate::azure::{AzureCredentials, AzureOptions, AzureStore};
    let credentials = AzureCredentials::from_env()?;
    let credentials = if options.anonymous { credentials.anonymous() } else { credentials };
    let azure = AzureOptions {
        endpoint_url: options.endpoint_url.clone(),
        credentials,
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
    };
    Ok(Arc::new(AzureStore::connect(&location.bucket, &azure)?))
}

#[cfg(feature = "oci")]
async fn oci(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use crate::oci::{OciOptions, OciStore, Reference, RegistryCredentials};
    // An oci:// location's bucket is the whole reference.
    let reference: Reference = location.bucket.parse().map_err(|error: crate::oci::InvalidReference| {
        StoreError::Rejected { code: "InvalidReference".into(), message: error.to_string() }
    })?;
    let credentials =
        if options.anonymous { None } else { RegistryCredentials::from_docker_config(&reference.registry)? };
    let oci = OciOptions {
        endpoint_url: options.endpoint_url.clone(),
        credentials,
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
    };
    Ok(Arc::new(OciStore::connect(reference, &oci)?))
}

#[cfg(feature = "hf")]
async fn hf(options: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use crate::hf::{HubOptions, HubStore, token_from_env};
    use ferry_contract::hub::{DEFAULT_ENDPOINT, HF_ENDPOINT_ENV};
    // An hf:// location's bucket is the repository at its revision.
    let repo = location.bucket.parse().map_err(|error: ferry_contract::hub::InvalidHubRepo| StoreError::Rejected {
        code: "InvalidRepository".into(),
        message: error.to_string(),
    })?;
    // The Hub's own client's conventions: HF_ENDPOINT, HF_TOKEN.
    let endpoint_url = options
        .endpoint_url
        .clone()
        .or_else(|| std::env::var(HF_ENDPOINT_ENV).ok().filter(|e| !e.is_empty()))
        .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
    let hub = HubOptions {
        endpoint_url,
        token: if options.anonymous { None } else { token_from_env() },
        connect_timeout: options.connect_timeout,
        request_timeout: options.request_timeout,
    };
    Ok(Arc::new(HubStore::connect(repo, &hub)?))
}

#[cfg(not(feature = "hf"))]
async fn hf(_: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(not_compiled(location, "hf"))
}

#[cfg(not(feature = "oci"))]
async fn oci(_: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(not_compiled(location, "oci"))
}

#[cfg(not(feature = "azure"))]
async fn azure(_: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(not_compiled(location, "azure"))
}

#[cfg(not(feature = "s3"))]
async fn s3(_: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(not_compiled(location, "s3"))
}

#[cfg(not(feature = "gcs"))]
async fn gcs(_: &TransferOptions, location: &ObjectLocation) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(not_compiled(location, "gcs"))
}

/// A build without the backend a location needs.
#[cfg(not(all(feature = "s3", feature = "gcs", feature = "azure", feature = "oci", feature = "hf")))]
fn not_compiled(location: &ObjectLocation, feature: &str) -> StoreError {
    StoreError::Rejected {
        code: "UnsupportedScheme".into(),
        message: format!("this build has no {}:// store (the ferry-store feature '{feature}' is off)", location.scheme),
    }
}
