//! S3 and S3-compatible stores (MinIO, Ceph, R2, GCS's XML API) through
//! `aws-sdk-s3`.
//!
//! The SDK's own retries are switched off: the engine retries with its own
//! policy so every retry is counted by reason. Request checksums are computed
//! by the engine (it already holds the bytes), so the SDK's checksum
//! calculation and payload signing are switched off too: the store verifies
//! the CRC32C header instead of a SHA-256 of the payload, which would cost a
//! second pass over every byte.
//!
//! # The data path
//!
//! Data requests (GET, whole or ranged, PUT and UploadPart) go through a
//! lean client on hyper 1 and hyper-util's pooled client
//! (`s3/hyper_path.rs`), the same stack and rustls (aws-lc-rs) provider the
//! SDK runs on, signed with `aws-sigv4` (UNSIGNED-PAYLOAD, the engine's
//! CRC32C in `x-amz-checksum-crc32c`). Listing, HEAD, `part_size` and the
//! multipart control requests (create, complete, abort, list) go through
//! `aws-sdk-s3`. The bucket's URL is resolved once, by the SDK's own
//! endpoint resolver, so addressing (path style for custom endpoints,
//! virtual hosts on AWS) matches the SDK's; credentials come from the same
//! SDK configuration chain and are cached until shortly before they expire.
//!
//! Why this path: it spends the least CPU per request and is level per
//! byte with the SDK and the `object_store` crate's S3 client, measured
//! under the same scheduler, budgets and verification (docs/benchmarks.md,
//! "HTTP stack"). Those two data paths were benchmark ablations and are
//! gone; their figures stay in docs/benchmarks.md. The SDK's orchestrator
//! (interceptors, the endpoint rules engine, identity-cache lookup and
//! signing, deserialisation of every modelled header) costs per request
//! what the data requests of a bulk copy have most of.
//!
//! Every response reaches the engine as the same [`GetResponse`]: content
//! length, the ETag without quotes, the [`Integrity`] of a whole-object
//! read (one header parser, `integrity`) and errors in the same
//! [`StoreError`] categories (`classify_status` on the status and the S3
//! error code).

mod answers;
mod credentials;
mod hyper_path;
mod web_identity;

pub use web_identity::WebIdentity;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::endpoint::{DefaultResolver, Params as EndpointParams, ResolveEndpoint as _};
use aws_sdk_s3::config::{
    Region, RequestChecksumCalculation, ResponseChecksumValidation, retry::RetryConfig, timeout::TimeoutConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, ChecksumType, CompletedMultipartUpload, CompletedPart, ServerSideEncryption,
};
use bytes::Bytes;

use super::{GetResponse, Integrity, ListPage, ObjectMeta, ObjectStore, RetryReason, StoreError, UploadedPart};
use super::{ListedPart, PendingUpload};
use crate::http::strip_quotes;
use answers::{ChecksumHeaders, classify_status, decode_crc, encode_crc, integrity};

/// How to reach an S3-compatible store.
#[derive(Clone, Debug, Default)]
pub struct S3Options {
    /// A custom endpoint (MinIO, a private endpoint); enables path-style addressing.
    pub endpoint_url: Option<String>,
    /// The region; defaults to the AWS configuration chain, then `us-east-1`.
    pub region: Option<String>,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one request until its response headers arrive.
    pub request_timeout: Duration,
    /// Credentials from a token exchanged at STS, instead of the SDK chain's.
    pub web_identity: Option<WebIdentity>,
}

/// How the SDK client addresses a bucket, beyond its region and endpoint.
#[derive(Clone, Copy, Debug, Default)]
struct Addressing {
    path_style: bool,
    fips: bool,
    dual_stack: bool,
}

/// The bucket's URL, without a trailing slash, as the SDK's own endpoint
/// resolver gives it: `<endpoint>/<bucket>` in path style, a virtual host
/// (`https://<bucket>.s3.<region>.amazonaws.com`) on AWS. Resolved once per
/// store, where the SDK runs its rules engine for every request.
async fn resolve_bucket_url(
    bucket: &str,
    region: &str,
    endpoint: Option<&str>,
    addressing: Addressing,
) -> Result<String, String> {
    let mut params = EndpointParams::builder()
        .bucket(bucket)
        .region(region)
        .force_path_style(addressing.path_style)
        .use_fips(addressing.fips)
        .use_dual_stack(addressing.dual_stack);
    if let Some(endpoint) = endpoint {
        params = params.endpoint(endpoint);
    }
    let params = params.build().map_err(|e| e.to_string())?;
    let resolved = DefaultResolver::new().resolve_endpoint(&params).await.map_err(|e| crate::error_chain(&*e))?;
    Ok(resolved.url().trim_end_matches('/').to_owned())
}

/// An S3 bucket.
#[derive(Clone, Debug)]
pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    data: Arc<hyper_path::HyperDataPath>,
}

impl S3Store {
    /// Builds a client from the standard AWS configuration chain (environment,
    /// profile, web identity / IRSA, container and instance metadata).
    ///
    /// # Errors
    /// [`StoreError::Rejected`] when the bucket cannot be addressed at the
    /// endpoint, or an https endpoint finds no TLS root certificates.
    pub async fn connect(bucket: &str, options: &S3Options) -> Result<Self, StoreError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = &options.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(endpoint) = &options.endpoint_url {
            loader = loader.endpoint_url(endpoint);
        }
        if let Some(identity) = &options.web_identity {
            // The exchange is not signed: its client needs no credentials,
            // only the region (AWS STS is regional) and an HTTP client.
            let mut sts = aws_config::defaults(BehaviorVersion::latest()).no_credentials();
            if let Some(region) = &options.region {
                sts = sts.region(Region::new(region.clone()));
            }
            let provider = web_identity::WebIdentityProvider::new(identity.clone(), &sts.load().await);
            loader = loader.credentials_provider(provider);
        }
        let shared = loader.load().await;
        Self::from_sdk_config(bucket, options, &shared).await
    }

    /// Builds a client from an SDK configuration the caller loaded (tests
    /// give one with static keys); `options` adds the timeouts and the
    /// addressing a custom endpoint implies.
    ///
    /// # Errors
    /// As [`S3Store::connect`].
    pub async fn from_sdk_config(
        bucket: &str,
        options: &S3Options,
        shared: &aws_config::SdkConfig,
    ) -> Result<Self, StoreError> {
        let mut config = aws_sdk_s3::config::Builder::from(shared)
            .retry_config(RetryConfig::disabled())
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(options.connect_timeout)
                    .operation_attempt_timeout(options.request_timeout)
                    .build(),
            )
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if shared.region().is_none() {
            config = config.region(Region::from_static("us-east-1"));
        }
        let path_style = options.endpoint_url.is_some() || shared.endpoint_url().is_some();
        if path_style {
            // Custom endpoints are almost always S3-compatible servers that
            // do not serve virtual-hosted bucket names.
            config = config.force_path_style(true);
        }
        let config = config.build();
        let data = Self::data_client(bucket, options, shared, &config, path_style).await.map_err(|detail| {
            StoreError::Rejected { code: "InvalidEndpoint".into(), message: format!("S3 data requests: {detail}") }
        })?;
        Ok(Self { client: aws_sdk_s3::Client::from_conf(config), bucket: bucket.to_owned(), data: Arc::new(data) })
    }

    /// The data path's client, configured as the SDK client is: the same
    /// region, credentials chain and bucket URL.
    async fn data_client(
        bucket: &str,
        options: &S3Options,
        shared: &aws_config::SdkConfig,
        config: &aws_sdk_s3::Config,
        path_style: bool,
    ) -> Result<hyper_path::HyperDataPath, String> {
        let region = config.region().map_or_else(|| "us-east-1".to_owned(), |r| r.as_ref().to_owned());
        let endpoint = options.endpoint_url.as_deref().or(shared.endpoint_url());
        let addressing = Addressing {
            path_style,
            fips: shared.use_fips().unwrap_or(false),
            dual_stack: shared.use_dual_stack().unwrap_or(false),
        };
        let bucket_url = resolve_bucket_url(bucket, &region, endpoint, addressing).await?;
        let setup = hyper_path::DataPathSetup {
            bucket,
            bucket_url,
            region,
            credentials: Arc::new(credentials::CachedCredentials::new(shared.credentials_provider())),
            connect_timeout: options.connect_timeout,
            request_timeout: options.request_timeout,
        };
        hyper_path::HyperDataPath::new(&setup)
    }

    fn map_error<E>(&self, err: SdkError<E, aws_smithy_runtime_api::http::Response>) -> StoreError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        classify(err, &self.bucket)
    }
}

/// Maps an SDK error to the engine's categories.
fn classify<E>(err: SdkError<E, aws_smithy_runtime_api::http::Response>, bucket: &str) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let detail = crate::error_chain(&err);
    match &err {
        SdkError::TimeoutError(_) => StoreError::transient(RetryReason::Timeout, detail),
        SdkError::DispatchFailure(failure) => {
            if let Some(denied) = web_identity::access_denied(&err) {
                // The credentials were refused before the request was sent.
                denied
            } else if failure.is_timeout() {
                StoreError::transient(RetryReason::Timeout, detail)
            } else if failure.is_user() || detail.contains("credentials") {
                // Identity resolution fails before any byte is sent.
                StoreError::NoCredentials(detail)
            } else {
                StoreError::transient(RetryReason::Connection, detail)
            }
        }
        SdkError::ResponseError(_) => StoreError::transient(RetryReason::Connection, detail),
        SdkError::ServiceError(service) => {
            let status = service.raw().status().as_u16();
            let code = service.err().code().unwrap_or_default().to_owned();
            let message = service.err().message().unwrap_or_default().to_owned();
            classify_status(status, &code, &message, bucket)
        }
        SdkError::ConstructionFailure(_) => {
            if detail.contains("credentials") {
                StoreError::NoCredentials(detail)
            } else {
                StoreError::Rejected { code: "InvalidRequest".into(), message: detail }
            }
        }
        _ => StoreError::Rejected { code: "Unknown".into(), message: detail },
    }
}

/// The [`ChecksumHeaders`] of a HeadObject or GetObject output (the two
/// are different types with the same accessors).
macro_rules! checksum_headers {
    ($output:expr) => {
        ChecksumHeaders {
            crc64nvme: $output.checksum_crc64_nvme(),
            crc32c: $output.checksum_crc32_c(),
            crc32: $output.checksum_crc32(),
            sha1: $output.checksum_sha1(),
            sha256: $output.checksum_sha256(),
            checksum_type: $output.checksum_type().map(ChecksumType::as_str),
            etag: $output.e_tag(),
            encryption: $output.server_side_encryption().map(ServerSideEncryption::as_str),
            customer_key: $output.sse_customer_algorithm().is_some(),
        }
    };
}

#[async_trait]
impl ObjectStore for S3Store {
    fn describe(&self) -> String {
        format!("s3://{}", self.bucket)
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let output = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(prefix)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        let objects = output
            .contents()
            .iter()
            .filter_map(|object| {
                Some(ObjectMeta {
                    key: object.key()?.to_owned(),
                    size: u64::try_from(object.size().unwrap_or(0)).unwrap_or(0),
                    etag: object.e_tag().map(strip_quotes),
                    last_modified: object.last_modified().and_then(|t| std::time::SystemTime::try_from(*t).ok()),
                })
            })
            .collect();
        let next = if output.is_truncated().unwrap_or(false) {
            output.next_continuation_token().map(str::to_owned)
        } else {
            None
        };
        Ok(ListPage { objects, next })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let output = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .checksum_mode(ChecksumMode::Enabled)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        let meta = ObjectMeta {
            key: key.to_owned(),
            size: u64::try_from(output.content_length().unwrap_or(0)).unwrap_or(0),
            etag: output.e_tag().map(strip_quotes),
            last_modified: output.last_modified().and_then(|t| std::time::SystemTime::try_from(*t).ok()),
        };
        let checksum = integrity(&checksum_headers!(output));
        Ok((meta, checksum))
    }

    async fn part_size(&self, key: &str, number: u32, if_match: Option<&str>) -> Result<u64, StoreError> {
        let output = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .part_number(i32::try_from(number).unwrap_or(i32::MAX))
            .set_if_match(if_match.map(|etag| format!("\"{etag}\"")))
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        u64::try_from(output.content_length().unwrap_or(-1)).map_err(|_| StoreError::Rejected {
            code: "MissingContentLength".into(),
            message: format!("the store did not say how large part {number} of '{key}' is"),
        })
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        self.data.get(key, range, if_match).await
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        self.data.put(key, body, crc32c).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        let etag = self.data.upload_part(key, upload_id, number, body, crc32c).await?;
        let etag = etag.ok_or_else(|| StoreError::Rejected {
            code: "MissingETag".into(),
            message: format!("the store accepted part {number} without returning its ETag"),
        })?;
        Ok(UploadedPart { number, etag, crc32c })
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        let output = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .checksum_algorithm(ChecksumAlgorithm::Crc32C)
            .checksum_type(ChecksumType::FullObject)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        output.upload_id().map(str::to_owned).ok_or_else(|| StoreError::Rejected {
            code: "MissingUploadId".into(),
            message: "the store started a multipart upload without returning its id".into(),
        })
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        let parts = parts
            .into_iter()
            .map(|part| {
                CompletedPart::builder()
                    .part_number(i32::try_from(part.number).unwrap_or(i32::MAX))
                    .e_tag(format!("\"{}\"", part.etag))
                    .checksum_crc32_c(encode_crc(part.crc32c))
                    .build()
            })
            .collect();
        let output = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .checksum_type(ChecksumType::FullObject)
            .checksum_crc32_c(encode_crc(crc32c))
            .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(parts)).build())
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        Ok(output.e_tag().map(strip_quotes))
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .send()
            .await
            .map_err(|e| self.map_error(e))?;
        Ok(())
    }

    async fn list_parts(&self, key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        let mut parts = Vec::new();
        let mut marker = None;
        loop {
            let output = self
                .client
                .list_parts()
                .bucket(&self.bucket)
                .key(key)
                .upload_id(upload_id)
                .set_part_number_marker(marker)
                .send()
                .await
                .map_err(|e| self.map_error(e))?;
            parts.extend(output.parts().iter().filter_map(|part| {
                Some(ListedPart {
                    number: u32::try_from(part.part_number()?).ok()?,
                    size: u64::try_from(part.size()?).ok()?,
                    etag: part.e_tag().map(strip_quotes)?,
                    crc32c: part.checksum_crc32_c().and_then(decode_crc),
                })
            }));
            marker = output.next_part_number_marker().map(str::to_owned);
            if !output.is_truncated().unwrap_or(false) || marker.is_none() {
                parts.sort_by_key(|part| part.number);
                return Ok(parts);
            }
        }
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let uploads = self.list_uploads_page_by_page(prefix).await?;
        if !uploads.is_empty() || prefix.is_empty() {
            return Ok(uploads);
        }
        // MinIO matches the prefix of ListMultipartUploads against whole
        // keys only, so a directory-like prefix finds nothing there; all of
        // the bucket's uploads, filtered here, is the same answer from
        // either kind of server, at the price of one more listing when
        // nothing is pending.
        let mut all = self.list_uploads_page_by_page("").await?;
        all.retain(|upload| upload.key.starts_with(prefix));
        Ok(all)
    }
}

impl S3Store {
    async fn list_uploads_page_by_page(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let mut uploads = Vec::new();
        let (mut key_marker, mut upload_id_marker) = (None, None);
        loop {
            let output = self
                .client
                .list_multipart_uploads()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_key_marker(key_marker)
                .set_upload_id_marker(upload_id_marker)
                .send()
                .await
                .map_err(|e| self.map_error(e))?;
            uploads.extend(output.uploads().iter().filter_map(|upload| {
                Some(PendingUpload {
                    key: upload.key()?.to_owned(),
                    upload_id: upload.upload_id()?.to_owned(),
                    initiated: upload.initiated().and_then(|t| std::time::SystemTime::try_from(*t).ok()),
                })
            }));
            key_marker = output.next_key_marker().filter(|m| !m.is_empty()).map(str::to_owned);
            upload_id_marker = output.next_upload_id_marker().filter(|m| !m.is_empty()).map(str::to_owned);
            if !output.is_truncated().unwrap_or(false) || key_marker.is_none() {
                return Ok(uploads);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::http::{encode_uri, range_header};

    use super::*;

    #[test]
    fn a_transient_checksum_mismatch_is_reported_as_one() {
        let error = StoreError::transient(RetryReason::ChecksumMismatch, "body checksum mismatch");
        assert_eq!(error.reason(), ferry_contract::Reason::ChecksumMismatch);
    }

    #[tokio::test]
    async fn the_data_path_addresses_a_bucket_as_the_sdk_does() {
        let path_style = Addressing { path_style: true, ..Addressing::default() };
        let minio = resolve_bucket_url("data", "us-east-1", Some("http://127.0.0.1:9000"), path_style).await;
        assert_eq!(minio.unwrap(), "http://127.0.0.1:9000/data");
        let aws = resolve_bucket_url("data", "eu-west-1", None, Addressing::default()).await;
        assert_eq!(aws.unwrap(), "https://data.s3.eu-west-1.amazonaws.com");
        // A name that is no DNS label is addressed in path style even on AWS.
        let dotted = resolve_bucket_url("my.data", "eu-west-1", None, Addressing::default()).await;
        assert_eq!(dotted.unwrap(), "https://s3.eu-west-1.amazonaws.com/my.data");
        let fips = Addressing { fips: true, ..Addressing::default() };
        assert_eq!(
            resolve_bucket_url("data", "us-east-1", None, fips).await.unwrap(),
            "https://data.s3-fips.us-east-1.amazonaws.com"
        );
    }

    #[test]
    fn keys_are_encoded_once_with_their_slashes_kept() {
        assert_eq!(encode_uri("dir/a b+ü~.txt", true), "dir/a%20b%2B%C3%BC~.txt");
        assert_eq!(encode_uri("id/with=", false), "id%2Fwith%3D");
        assert_eq!(range_header(&(5..10)), "bytes=5-9");
    }
}
