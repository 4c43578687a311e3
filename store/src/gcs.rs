//! Google Cloud Storage (`gs://`) through the official `google-cloud-storage`
//! crate, for reading and writing object data, and GCS's JSON API for what
//! that crate only offers over gRPC (listing, metadata, compose, delete).
//!
//! * The object's **generation** plays the role of S3's ETag: listing
//!   records it, ranged reads carry `ifGenerationMatch`, so an object
//!   overwritten mid-copy fails with [`StoreError::Changed`] instead of
//!   mixing two versions; the manifest reuses files by size + generation.
//! * **Integrity**: GCS keeps a CRC32C for every object, composite ones
//!   included. Whole reads return it with the data; ranged reads are checked
//!   by the engine against the CRC32C from metadata, combined from the
//!   per-range CRCs. Uploads send the CRC32C, and the store refuses a
//!   mismatch.
//! * **Large uploads** are parallel composite uploads: parts are written as
//!   temporary objects under `.ferry-uploads/<id>/` at the bucket root
//!   (outside any dataset prefix), composed into the destination (32 sources
//!   per compose, in rounds for more), checked against the whole file's
//!   CRC32C, and deleted. An aborted upload deletes its parts. Each part
//!   carries the destination key in its custom metadata, so the uploads
//!   pending under a prefix, and an upload's parts, are found by listing
//!   `.ferry-uploads/` (an upload with no part written yet has nothing to
//!   find or to remove).
//! * The crate's own retries, read resumption and checksumming are off: the
//!   engine retries (counted by reason) and verifies every byte itself.
//!
//! Credentials: Application Default Credentials (GKE Workload Identity, a
//! service-account key through `GOOGLE_APPLICATION_CREDENTIALS`, metadata
//! server), or none at all (`anonymous`) for public buckets and emulators.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use google_cloud_auth::credentials::{CacheableResource, Credentials};
use google_cloud_storage::client::Storage;
use google_cloud_storage::model_ext::ReadRange;
use serde::Deserialize;

use super::{
    GetResponse, Integrity, ListPage, ObjectMeta, ObjectStore, RetryReason, StoreError, StoredChecksum, UploadedPart,
};
use super::{ListedPart, PendingUpload};

/// The public GCS endpoint.
const GCS_ENDPOINT: &str = "https://storage.googleapis.com";
/// Most sources one compose request accepts.
const COMPOSE_LIMIT: usize = 32;
/// Where parts of composite uploads live until they are composed.
const UPLOADS_PREFIX: &str = ".ferry-uploads/";
/// The custom metadata entry of a part that names the key it is for.
const UPLOAD_KEY_METADATA: &str = "ferry-upload-key";

/// How to reach GCS.
#[derive(Clone, Debug, Default)]
pub struct GcsOptions {
    /// A custom endpoint (an emulator, a private endpoint), e.g. `http://127.0.0.1:4443`.
    pub endpoint_url: Option<String>,
    /// Send no credentials (public buckets, emulators).
    pub anonymous: bool,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one metadata request (listing, compose, delete).
    pub request_timeout: Duration,
}

/// A GCS bucket.
#[derive(Clone, Debug)]
pub struct GcsStore {
    bucket: String,
    data: Option<Storage>,
    json: reqwest::Client,
    endpoint: String,
    credentials: Credentials,
    /// Why no client could be built (e.g. no credentials found), reported on first use.
    unusable: Option<String>,
    /// Time allowed for a data request until its response arrives (a read's
    /// headers, a write's acknowledgement). The data client has no setting
    /// for it, so the engine's is applied around each call; a stalled body
    /// is the engine's stall timeout's to catch.
    request_timeout: Duration,
}

impl GcsStore {
    /// Builds the clients. Failing to find credentials is not an error here:
    /// it is reported by the first request, like every other store problem.
    pub async fn connect(bucket: &str, options: &GcsOptions) -> Self {
        let endpoint = options.endpoint_url.clone().unwrap_or_else(|| GCS_ENDPOINT.to_owned());
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        let (credentials, mut unusable) = if options.anonymous {
            (google_cloud_auth::credentials::anonymous::Builder::new().build(), None)
        } else {
            match google_cloud_auth::credentials::Builder::default().build() {
                Ok(credentials) => (credentials, None),
                Err(error) => (
                    google_cloud_auth::credentials::anonymous::Builder::new().build(),
                    Some(format!("{error}; set GOOGLE_APPLICATION_CREDENTIALS or use workload identity")),
                ),
            }
        };
        let json = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            .timeout(options.request_timeout)
            .build()
            .expect("an HTTP client with timeouts builds");
        let data = Storage::builder()
            .with_endpoint(&endpoint)
            .with_credentials(credentials.clone())
            .with_retry_policy(google_cloud_gax::retry_policy::NeverRetry)
            .with_read_resume_policy(google_cloud_storage::read_resume_policy::NeverResume)
            // Parts are bounded by the engine's memory budget: one request each.
            .with_resumable_upload_threshold(usize::MAX)
            .build()
            .await;
        let data = match data {
            Ok(client) => Some(client),
            Err(error) => {
                unusable.get_or_insert_with(|| format!("cannot build a GCS client: {error}"));
                None
            }
        };
        let request_timeout = options.request_timeout;
        Self { bucket: bucket.to_owned(), data, json, endpoint, credentials, unusable, request_timeout }
    }

    fn data(&self) -> Result<&Storage, StoreError> {
        match (&self.data, &self.unusable) {
            (Some(client), None) => Ok(client),
            (_, Some(why)) => Err(StoreError::NoCredentials(why.clone())),
            (None, None) => Err(StoreError::NoCredentials("no GCS client".into())),
        }
    }

    /// `projects/_/buckets/BUCKET`, as the crate names buckets.
    /// Runs a data-client call within the request timeout.
    async fn timed<T>(&self, what: &str, call: impl std::future::Future<Output = T>) -> Result<T, StoreError> {
        tokio::time::timeout(self.request_timeout, call).await.map_err(|_| {
            StoreError::transient(
                RetryReason::Timeout,
                format!("no response to the {what} within {:?}", self.request_timeout),
            )
        })
    }

    fn bucket_path(&self) -> String {
        format!("projects/_/buckets/{}", self.bucket)
    }

    fn object_url(&self, key: &str) -> String {
        format!("{}/storage/v1/b/{}/o/{}", self.endpoint, self.bucket, encode(key))
    }

    /// A JSON API request with the credentials' headers.
    async fn request(&self, method: reqwest::Method, url: &str) -> Result<reqwest::RequestBuilder, StoreError> {
        if let Some(why) = &self.unusable {
            return Err(StoreError::NoCredentials(why.clone()));
        }
        let headers = match self.credentials.headers(http::Extensions::new()).await {
            Ok(CacheableResource::New { data, .. }) => data,
            Ok(CacheableResource::NotModified) => http::HeaderMap::new(),
            Err(error) if error.is_transient() => {
                return Err(StoreError::transient(RetryReason::Connection, crate::error_chain(&error)));
            }
            Err(error) => return Err(StoreError::NoCredentials(crate::error_chain(&error))),
        };
        Ok(self.json.request(method, url).headers(headers))
    }

    /// Sends a JSON API request and decodes a successful answer.
    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        request: reqwest::RequestBuilder,
        not_found: NotFound,
    ) -> Result<T, StoreError> {
        let response = request.send().await.map_err(transport_error)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(transport_error)?;
        if !(200..300).contains(&status) {
            return Err(classify_status(status, &String::from_utf8_lossy(&body), &self.bucket, not_found));
        }
        serde_json::from_slice(&body).map_err(|error| StoreError::Rejected {
            code: "InvalidResponse".into(),
            message: format!("cannot decode the store's answer: {error}"),
        })
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let request = self.request(reqwest::Method::DELETE, &self.object_url(key)).await?;
        let response = request.send().await.map_err(transport_error)?;
        match response.status().as_u16() {
            200..300 | 404 => Ok(()),
            status => {
                let body = response.text().await.unwrap_or_default();
                Err(classify_status(status, &body, &self.bucket, NotFound::Object))
            }
        }
    }

    async fn compose(&self, sources: &[String], destination: &str) -> Result<JsonObject, StoreError> {
        let url = format!("{}/compose", self.object_url(destination));
        let body = serde_json::json!({
            "sourceObjects": sources.iter().map(|name| serde_json::json!({"name": name})).collect::<Vec<_>>(),
            "destination": {"contentType": "application/octet-stream"},
        });
        let request = self.request(reqwest::Method::POST, &url).await?.json(&body);
        self.send(request, NotFound::Object).await
    }

    /// A part's name holds no key: it must stay short and plain whatever
    /// the key is, and the upload id is unique per object.
    fn part_name(upload_id: &str, number: u32) -> String {
        format!("{UPLOADS_PREFIX}{upload_id}/{number:06}")
    }
}

/// Which "not found" a 404 means for the request that got it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotFound {
    Bucket,
    Object,
}

/// An object as the JSON API describes it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonObject {
    name: String,
    #[serde(default, deserialize_with = "number_string")]
    size: u64,
    #[serde(default, deserialize_with = "number_string")]
    generation: u64,
    #[serde(default)]
    crc32c: Option<String>,
    #[serde(default)]
    updated: Option<String>,
    /// Custom metadata (a temporary part's destination key).
    #[serde(default)]
    metadata: Option<HashMap<String, String>>,
    #[serde(default)]
    time_created: Option<String>,
}

impl JsonObject {
    fn meta(&self) -> ObjectMeta {
        ObjectMeta {
            key: self.name.clone(),
            size: self.size,
            etag: Some(self.generation.to_string()),
            last_modified: self.updated.as_deref().and_then(parse_rfc3339),
        }
    }

    fn checksum(&self) -> Option<StoredChecksum> {
        self.crc32c.as_deref().and_then(decode_crc32c).map(StoredChecksum::Crc32c)
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonList {
    #[serde(default)]
    items: Vec<JsonObject>,
    #[serde(default)]
    next_page_token: Option<String>,
}

/// The JSON API writes 64-bit numbers as strings.
fn number_string<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Number {
        Text(String),
        Plain(u64),
    }
    match Number::deserialize(deserializer)? {
        Number::Plain(n) => Ok(n),
        Number::Text(text) => text.parse().map_err(serde::de::Error::custom),
    }
}

/// GCS writes CRC32C as the base64 of its 4 big-endian bytes.
fn decode_crc32c(text: &str) -> Option<u32> {
    let bytes: [u8; 4] = BASE64.decode(text).ok()?.try_into().ok()?;
    Some(u32::from_be_bytes(bytes))
}

fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let timestamp: jiff::Timestamp = text.parse().ok()?;
    Some(std::time::SystemTime::from(timestamp))
}

/// Percent-encodes an object name for a URL path segment.
fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for byte in key.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn transport_error(error: reqwest::Error) -> StoreError {
    let reason = if error.is_timeout() { RetryReason::Timeout } else { RetryReason::Connection };
    StoreError::transient(reason, crate::error_chain(&error))
}

/// Maps an HTTP status and the JSON API's error body to a store error.
fn classify_status(status: u16, body: &str, bucket: &str, not_found: NotFound) -> StoreError {
    let message = serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().take(200).collect());
    match status {
        404 if not_found == NotFound::Bucket || message.to_ascii_lowercase().contains("bucket") => {
            StoreError::NoSuchBucket { bucket: bucket.to_owned() }
        }
        404 => StoreError::NotFound,
        412 => StoreError::Changed,
        401 | 403 => StoreError::AccessDenied { code: format!("HTTP {status}"), message },
        408 => StoreError::transient(RetryReason::Timeout, format!("HTTP 408 {message}")),
        429 => StoreError::transient(RetryReason::Throttled, format!("HTTP 429 {message}")),
        500..=599 => StoreError::transient(RetryReason::ServerError, format!("HTTP {status} {message}")),
        _ => StoreError::Rejected { code: format!("HTTP {status}"), message },
    }
}

/// Maps an error of the `google-cloud-storage` crate.
fn classify(error: &google_cloud_storage::Error, bucket: &str) -> StoreError {
    if let Some(status) = error.http_status_code() {
        let body = error.http_payload().map(|b| String::from_utf8_lossy(b).into_owned()).unwrap_or_default();
        let body = if body.is_empty() { error.to_string() } else { body };
        return classify_status(status, &body, bucket, NotFound::Object);
    }
    let detail = crate::error_chain(error);
    if error.is_timeout() {
        StoreError::transient(RetryReason::Timeout, detail)
    } else if error.is_authentication() {
        StoreError::NoCredentials(detail)
    } else if error.is_connect() || error.is_io() || error.is_transport() {
        StoreError::transient(RetryReason::Connection, detail)
    } else {
        StoreError::Rejected { code: "Unknown".into(), message: detail }
    }
}

#[async_trait]
impl ObjectStore for GcsStore {
    fn describe(&self) -> String {
        format!("gs://{}", self.bucket)
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let url = format!("{}/storage/v1/b/{}/o", self.endpoint, self.bucket);
        let mut query = vec![
            ("prefix", prefix.to_owned()),
            ("maxResults", "1000".to_owned()),
            ("fields", "items(name,size,generation,crc32c,updated),nextPageToken".to_owned()),
        ];
        if let Some(token) = token {
            query.push(("pageToken", token));
        }
        let request = self.request(reqwest::Method::GET, &url).await?.query(&query);
        let page: JsonList = self.send(request, NotFound::Bucket).await?;
        let mut objects: Vec<ObjectMeta> = page.items.iter().map(JsonObject::meta).collect();
        // Keys arrive in lexicographic order; sorting keeps that promise
        // even for servers that do not.
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(ListPage { objects, next: page.next_page_token.filter(|t| !t.is_empty()) })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let request = self.request(reqwest::Method::GET, &self.object_url(key)).await?;
        let object: JsonObject = self.send(request, NotFound::Object).await?;
        Ok((object.meta(), object.checksum().map(Integrity::Whole)))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let mut read = self.data()?.read_object(self.bucket_path(), key).compute_crc32c(false);
        if let Some(range) = &range {
            read = read.set_read_range(ReadRange::segment(range.start, range.end - range.start));
        }
        if let Some(generation) = if_match.and_then(|g| g.parse::<i64>().ok()) {
            read = read.set_if_generation_match(generation);
        }
        let response = self.timed("read", read.send()).await?.map_err(|e| classify(&e, &self.bucket))?;
        let object = response.object();
        let size = u64::try_from(object.size).unwrap_or(0);
        let content_length = match &range {
            Some(range) => range.end.min(size).saturating_sub(range.start),
            None => size,
        };
        let checksum =
            object.checksums.as_ref().and_then(|c| c.crc32c).map(|crc| Integrity::Whole(StoredChecksum::Crc32c(crc)));
        let bucket = self.bucket.clone();
        let stream = futures::stream::unfold(Some(response), move |state| {
            let bucket = bucket.clone();
            async move {
                let mut response = state?;
                match response.next().await {
                    Some(Ok(chunk)) => Some((Ok(chunk), Some(response))),
                    Some(Err(error)) => {
                        let mapped = match classify(&error, &bucket) {
                            StoreError::Rejected { message, .. } => {
                                StoreError::transient(RetryReason::TruncatedBody, message)
                            }
                            other => other,
                        };
                        Some((Err(mapped), None))
                    }
                    None => None,
                }
            }
        });
        Ok(GetResponse {
            content_length,
            etag: Some(object.generation.to_string()),
            checksum: if range.is_none() { checksum } else { None },
            body: Box::pin(stream),
        })
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        let write =
            self.data()?.write_object(self.bucket_path(), key, body).with_known_crc32c(crc32c).send_unbuffered();
        let object = self.timed("write", write).await?.map_err(|e| classify(&e, &self.bucket))?;
        Ok(Some(object.generation.to_string()))
    }

    async fn create_multipart(&self, _key: &str) -> Result<String, StoreError> {
        // Nothing to ask the store: parts are plain objects named after the id.
        Ok(format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>()))
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        self.data()?
            .write_object(self.bucket_path(), Self::part_name(upload_id, number), body)
            .with_known_crc32c(crc32c)
            .set_metadata([(UPLOAD_KEY_METADATA, key)])
            .send_unbuffered()
            .await
            .map_err(|e| classify(&e, &self.bucket))?;
        Ok(UploadedPart { number, etag: String::new(), crc32c })
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        mut parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        parts.sort_by_key(|p| p.number);
        let mut sources: Vec<String> = parts.iter().map(|p| Self::part_name(upload_id, p.number)).collect();
        let mut created = Vec::new();
        // Compose in rounds of at most 32 sources until one round makes the object.
        let mut round = 0;
        let composed = loop {
            if sources.len() <= COMPOSE_LIMIT {
                break self.compose(&sources, key).await;
            }
            round += 1;
            let mut next = Vec::new();
            for (i, group) in sources.chunks(COMPOSE_LIMIT).enumerate() {
                let name = format!("{UPLOADS_PREFIX}{upload_id}/r{round}-{i:06}");
                self.compose(group, &name).await?;
                created.push(name.clone());
                next.push(name);
            }
            sources = next;
        };
        let composed = composed?;
        self.abort_multipart(key, upload_id).await?;
        match composed.checksum() {
            Some(StoredChecksum::Crc32c(stored)) if stored == crc32c => Ok(Some(composed.generation.to_string())),
            stored => {
                // The object is wrong: remove it rather than leave bad bytes under the name.
                self.delete(key).await?;
                Err(StoreError::transient(
                    RetryReason::ChecksumMismatch,
                    format!("composed object has CRC32C {stored:?}, the file has {crc32c:08x}"),
                ))
            }
        }
    }

    async fn abort_multipart(&self, _key: &str, upload_id: &str) -> Result<(), StoreError> {
        let prefix = format!("{UPLOADS_PREFIX}{upload_id}/");
        let mut token = None;
        loop {
            let page = self.list_page(&prefix, token).await?;
            for object in &page.objects {
                self.delete(&object.key).await?;
            }
            match page.next {
                Some(next) => token = Some(next),
                None => return Ok(()),
            }
        }
    }

    async fn list_parts(&self, _key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        // No store-side upload exists to be gone: an id without parts
        // simply lists none.
        let prefix = format!("{UPLOADS_PREFIX}{upload_id}/");
        let mut parts: Vec<ListedPart> = (self.list_parts_below(&prefix).await?)
            .into_iter()
            .filter_map(|part| {
                // Only `NNNNNN`: intermediate compose results are not parts.
                let suffix = part.name.strip_prefix(&prefix)?;
                if !suffix.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                let number = suffix.parse().ok()?;
                Some(ListedPart {
                    number,
                    size: part.size,
                    etag: part.generation.to_string(),
                    crc32c: part.crc32c.as_deref().and_then(decode_crc32c),
                })
            })
            .collect();
        parts.sort_by_key(|part| part.number);
        Ok(parts)
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let mut uploads: BTreeMap<String, PendingUpload> = BTreeMap::new();
        for part in self.list_parts_below(UPLOADS_PREFIX).await? {
            let Some((upload_id, _)) = part.name.strip_prefix(UPLOADS_PREFIX).and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            let upload = uploads.entry(upload_id.to_owned()).or_insert_with(|| PendingUpload {
                key: String::new(),
                upload_id: upload_id.to_owned(),
                initiated: None,
            });
            if let Some(key) = part.metadata.as_ref().and_then(|m| m.get(UPLOAD_KEY_METADATA)) {
                upload.key.clone_from(key);
            }
            let created = part.time_created.as_deref().and_then(parse_rfc3339);
            upload.initiated = match (upload.initiated, created) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        // Parts that name no key (written before parts carried one) cannot
        // be told apart by destination: they are left to a lifecycle rule.
        Ok(uploads.into_values().filter(|u| !u.key.is_empty() && u.key.starts_with(prefix)).collect())
    }
}

impl GcsStore {
    /// Every object below `prefix` with what resuming and sweeping uploads
    /// need to know of it, every page.
    async fn list_parts_below(&self, prefix: &str) -> Result<Vec<JsonObject>, StoreError> {
        let url = format!("{}/storage/v1/b/{}/o", self.endpoint, self.bucket);
        let mut parts = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![
                ("prefix", prefix.to_owned()),
                ("maxResults", "1000".to_owned()),
                ("fields", "items(name,size,generation,crc32c,metadata,timeCreated),nextPageToken".to_owned()),
            ];
            if let Some(token) = token.take() {
                query.push(("pageToken", token));
            }
            let request = self.request(reqwest::Method::GET, &url).await?.query(&query);
            let page: JsonList = self.send(request, NotFound::Bucket).await?;
            parts.extend(page.items);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next),
                None => return Ok(parts),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_numbers_decode_as_the_json_api_writes_them() {
        // crc32c("hello world") = 0xc99465aa, written as base64 of big-endian bytes.
        assert_eq!(decode_crc32c("yZRlqg=="), Some(0xc994_65aa));
        assert_eq!(decode_crc32c("not base64"), None);
        let object: JsonObject =
            serde_json::from_str(r#"{"name":"a/b","size":"12","generation":"1700000000000001","crc32c":"yZRlqg=="}"#)
                .unwrap();
        assert_eq!((object.size, object.meta().etag.as_deref()), (12, Some("1700000000000001")));
        assert_eq!(object.checksum(), Some(StoredChecksum::Crc32c(0xc994_65aa)));
    }

    #[test]
    fn names_are_percent_encoded_as_one_path_segment() {
        assert_eq!(encode("a/b c+d.bin"), "a%2Fb%20c%2Bd.bin");
    }

    #[test]
    fn statuses_map_to_what_the_engine_understands() {
        let missing_bucket = r#"{"error":{"code":404,"message":"The specified bucket does not exist."}}"#;
        assert!(matches!(classify_status(404, missing_bucket, "b", NotFound::Object), StoreError::NoSuchBucket { .. }));
        assert!(matches!(classify_status(404, "", "b", NotFound::Bucket), StoreError::NoSuchBucket { .. }));
        assert!(matches!(classify_status(404, "No such object", "b", NotFound::Object), StoreError::NotFound));
        assert!(matches!(classify_status(412, "", "b", NotFound::Object), StoreError::Changed));
        assert!(matches!(classify_status(403, "", "b", NotFound::Object), StoreError::AccessDenied { .. }));
        assert_eq!(classify_status(503, "", "b", NotFound::Object).retry_reason(), Some(RetryReason::ServerError));
        assert_eq!(classify_status(429, "", "b", NotFound::Object).retry_reason(), Some(RetryReason::Throttled));
    }
}
