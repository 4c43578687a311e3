//! Azure Blob Storage (`az://CONTAINER/PREFIX`) through the Blob REST API,
//! on the same pooled hyper + rustls client as the S3 data path.
//!
//! The account is the endpoint's: `https://ACCOUNT.blob.core.windows.net`
//! by default, or any URL ending in the account's path (Azurite's
//! `http://127.0.0.1:10000/devstoreaccount1`). The container is the bucket.
//!
//! How the trait maps (docs/design/stores.md has the protocol facts):
//! * a listing is List Blobs, 5,000 a page; a read is Get Blob with
//!   `x-ms-range` and `If-Match`, and a ranged answer must be a 206 whose
//!   `Content-Range` starts where asked (an emulator answers a range it
//!   cannot parse with the whole blob);
//! * a whole-object write is Put Blob; a multipart upload is Put Block per
//!   part and one Put Block List that commits them at once, so nothing is
//!   visible before. Azure has no upload ids: the id is made here and is
//!   the prefix of every block id of the upload (`ID-NNNNNN-CRC32C`,
//!   base64, all of one length as the service requires), so an interrupted
//!   upload's blocks are found again in the blob's uncommitted block list,
//!   each with the CRC32C of what it holds (a block list reports no
//!   checksum, and a resumed push keeps only parts whose CRC32C matches the
//!   local file's; the service checked the block's CRC64 on upload). There is
//!   nothing to abort: uncommitted blocks expire (after a week on the
//!   service), and a commit keeps only the blocks it names;
//! * every write carries the body's CRC-64/NVME in `x-ms-content-crc64`,
//!   Azure's own CRC64, which the service checks, and a blob Ferry writes
//!   keeps the whole content's CRC32C as metadata (`x-ms-meta-crc32c`);
//!   reads verify against that CRC32C (combinable across ranges, so no
//!   read-back) or else the blob's `Content-MD5`, which Put Blob always
//!   sets and a block-list commit never does.
//!
//! Credentials, first found: a SAS token (`AZURE_STORAGE_SAS_TOKEN`),
//! Shared Key (`AZURE_STORAGE_ACCOUNT` and `AZURE_STORAGE_KEY`), an Entra
//! ID token for a service principal or a workload identity (`AZURE_TENANT_ID`,
//! `AZURE_CLIENT_ID` and `AZURE_CLIENT_SECRET` or
//! `AZURE_FEDERATED_TOKEN_FILE`, see [`crate::entra`]), else anonymous
//! (public containers).

pub mod entra;

use std::ops::Range;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;

use ferry_contract::options::{
    AZURE_STORAGE_ACCOUNT_ENV as ACCOUNT_ENV, AZURE_STORAGE_KEY_ENV as KEY_ENV,
    AZURE_STORAGE_SAS_TOKEN_ENV as SAS_TOKEN_ENV,
};

use crate::http::{
    Failed, HttpClient, body_stream, check_range, client_for, content_length, encode_uri, exchange, header_text,
    header_value, range_header, read_body, strip_quotes,
};
use crate::xml::{element, elements, error_document, escape, unescape};
use crate::{
    GetResponse, Integrity, ListPage, ListedPart, ObjectMeta, ObjectStore, PendingUpload, RetryReason, StoreError,
    StoredChecksum, UploadedPart,
};
use entra::{EntraIdentity, EntraTokens};

/// The REST API version every request names.
const API_VERSION: &str = "2021-08-06";

/// HTTP dates as Azure writes and reads them (`Fri, 27 Nov 2026 17:50:46 GMT`).
const HTTP_DATE: &str = "%a, %d %b %Y %H:%M:%S GMT";

/// The headers every request carries: its date (`x-ms-date`, which Shared
/// Key signs) and the API version. Public so that test servers' own
/// requests name the same version.
pub fn standard_headers() -> Vec<(&'static str, String)> {
    let date = jiff::Timestamp::now().strftime(HTTP_DATE).to_string();
    vec![("x-ms-date", date), ("x-ms-version", API_VERSION.to_owned())]
}

/// How to reach a storage account.
#[derive(Clone, Debug)]
pub struct AzureOptions {
    /// The account's blob endpoint, e.g. `http://127.0.0.1:10000/devstoreaccount1`;
    /// default `https://ACCOUNT.blob.core.windows.net`.
    pub endpoint_url: Option<String>,
    /// How requests are authorised.
    pub credentials: AzureCredentials,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one request until its response headers arrive.
    pub request_timeout: Duration,
}

/// How requests are authorised.
#[derive(Clone)]
pub enum AzureCredentials {
    /// An account key: every request is signed (Shared Key).
    SharedKey {
        /// The storage account's name.
        account: String,
        /// The account key, decoded from its base64.
        key: Vec<u8>,
    },
    /// A shared access signature, appended to every request's query.
    Sas {
        /// The account, when known (for the default endpoint).
        account: Option<String>,
        /// The token, without a leading `?`.
        token: String,
    },
    /// An Entra ID identity: every request carries a bearer token for it.
    Entra {
        /// The account, when known (for the default endpoint).
        account: Option<String>,
        /// The identity and how it proves itself.
        identity: EntraIdentity,
    },
    /// No credentials (a public container).
    Anonymous {
        /// The account, when known (for the default endpoint).
        account: Option<String>,
    },
}

impl std::fmt::Debug for AzureCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key or the token.
        match self {
            AzureCredentials::SharedKey { account, .. } => write!(f, "SharedKey({account})"),
            AzureCredentials::Sas { account, .. } => write!(f, "Sas({account:?})"),
            AzureCredentials::Entra { account, identity } => write!(f, "{identity:?}({account:?})"),
            AzureCredentials::Anonymous { account } => write!(f, "Anonymous({account:?})"),
        }
    }
}

impl AzureCredentials {
    /// The credentials the environment names: `AZURE_STORAGE_SAS_TOKEN`,
    /// else `AZURE_STORAGE_KEY` (with `AZURE_STORAGE_ACCOUNT`), else an
    /// Entra ID identity ([`EntraIdentity::from_env`]), else none.
    ///
    /// # Errors
    /// A key that is not base64, a key without an account, or an Entra
    /// secret without its tenant and client.
    pub fn from_env() -> Result<Self, StoreError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        Self::from_values(var(ACCOUNT_ENV), var(KEY_ENV), var(SAS_TOKEN_ENV), EntraIdentity::from_env()?)
    }

    /// The credentials an account, a key, a SAS token and an Entra identity
    /// name: the token first, then the key (with the account), then the
    /// identity, else none.
    ///
    /// # Errors
    /// A key that is not base64, or a key without an account.
    pub fn from_values(
        account: Option<String>,
        key: Option<String>,
        sas_token: Option<String>,
        entra: Option<EntraIdentity>,
    ) -> Result<Self, StoreError> {
        if let Some(token) = sas_token {
            return Ok(AzureCredentials::Sas { account, token: token.trim().trim_start_matches('?').to_owned() });
        }
        match (key, account) {
            (Some(key), Some(account)) => {
                let key = BASE64.decode(key.trim()).map_err(|_| {
                    StoreError::NoCredentials(format!("{KEY_ENV} is not base64 (copy the account key whole)"))
                })?;
                Ok(AzureCredentials::SharedKey { account, key })
            }
            (Some(_), None) => Err(StoreError::NoCredentials(format!(
                "{KEY_ENV} is set without {ACCOUNT_ENV}, the account it belongs to"
            ))),
            (None, account) => Ok(match entra {
                Some(identity) => AzureCredentials::Entra { account, identity },
                None => AzureCredentials::Anonymous { account },
            }),
        }
    }

    /// The same account without credentials (a public container).
    pub fn anonymous(self) -> Self {
        AzureCredentials::Anonymous { account: self.account().map(str::to_owned) }
    }

    fn account(&self) -> Option<&str> {
        match self {
            AzureCredentials::SharedKey { account, .. } => Some(account),
            AzureCredentials::Sas { account, .. }
            | AzureCredentials::Entra { account, .. }
            | AzureCredentials::Anonymous { account } => account.as_deref(),
        }
    }
}

/// A container.
pub struct AzureStore {
    client: HttpClient,
    /// `ENDPOINT/CONTAINER`, without a trailing slash.
    container_url: String,
    /// The URL path of the container (`/devstoreaccount1/data`), as Shared
    /// Key's canonical resource names it.
    container_path: String,
    container: String,
    credentials: AzureCredentials,
    /// Bearer tokens, for [`AzureCredentials::Entra`].
    tokens: Option<EntraTokens>,
    request_timeout: Duration,
}

impl std::fmt::Debug for AzureStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureStore")
            .field("container_url", &self.container_url)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

impl AzureStore {
    /// A client for `container`.
    ///
    /// # Errors
    /// [`StoreError::NoCredentials`] without an endpoint and an account to
    /// make one from; [`StoreError::Rejected`] for an endpoint that is no
    /// URL or, over https, no TLS roots.
    pub fn connect(container: &str, options: &AzureOptions) -> Result<Self, StoreError> {
        let endpoint = match (&options.endpoint_url, options.credentials.account()) {
            (Some(endpoint), _) => endpoint.trim_end_matches('/').to_owned(),
            (None, Some(account)) => format!("https://{account}.blob.core.windows.net"),
            (None, None) => {
                return Err(StoreError::NoCredentials(
                    "no storage account: set AZURE_STORAGE_ACCOUNT or the endpoint URL".into(),
                ));
            }
        };
        let client = client_for(&endpoint, options.connect_timeout)?;
        let tokens = match &options.credentials {
            AzureCredentials::Entra { identity, .. } => {
                Some(EntraTokens::new(identity.clone(), options.connect_timeout, options.request_timeout)?)
            }
            _ => None,
        };
        let uri: http::Uri = endpoint.parse().expect("client_for parsed it");
        let container_path = format!("{}/{container}", uri.path().trim_end_matches('/'));
        Ok(Self {
            client,
            container_url: format!("{endpoint}/{container}"),
            container_path,
            container: container.to_owned(),
            credentials: options.credentials.clone(),
            tokens,
            request_timeout: options.request_timeout,
        })
    }

    /// Sends one request to `key` (or the container, for `None`) with the
    /// `query` parameters (unencoded), signed as the credentials say; a
    /// failure comes back classified.
    async fn send(
        &self,
        method: Method,
        key: Option<&str>,
        query: &[(&str, &str)],
        headers: Vec<(&'static str, String)>,
        body: Bytes,
    ) -> Result<http::Response<hyper::body::Incoming>, StoreError> {
        let (mut url, path) = match key {
            Some(key) => {
                let encoded = encode_uri(key, true);
                (format!("{}/{encoded}", self.container_url), format!("{}/{encoded}", self.container_path))
            }
            None => (self.container_url.clone(), self.container_path.clone()),
        };
        let mut pairs: Vec<String> =
            query.iter().map(|(name, value)| format!("{name}={}", encode_uri(value, false))).collect();
        if let AzureCredentials::Sas { token, .. } = &self.credentials {
            pairs.push(token.clone());
        }
        if !pairs.is_empty() {
            url.push('?');
            url.push_str(&pairs.join("&"));
        }
        let mut request = Request::builder().method(method.clone()).uri(&url);
        let mut all = standard_headers();
        all.extend(headers);
        if (method == Method::PUT || method == Method::POST) || !body.is_empty() {
            all.push(("content-length", body.len().to_string()));
        }
        if let AzureCredentials::SharedKey { account, key } = &self.credentials {
            all.push(("authorization", shared_key_authorization(key, method.as_str(), account, &path, query, &all)));
        }
        if let Some(tokens) = &self.tokens {
            all.push(("authorization", tokens.authorization().await?));
        }
        for (name, value) in &all {
            request = request.header(*name, header_value(value)?);
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
        match exchange(&self.client, request, self.request_timeout, &self.container_url).await? {
            Ok(response) => Ok(response),
            Err(failed) => Err(classify(&failed, &self.container)),
        }
    }

    /// One page of blobs under `prefix`; with `uncommitted`, blobs that
    /// only have uncommitted blocks are listed too.
    async fn list(
        &self,
        prefix: &str,
        marker: Option<&str>,
        uncommitted: bool,
    ) -> Result<(Vec<ObjectMeta>, Option<String>), StoreError> {
        let mut query = vec![("comp", "list"), ("restype", "container"), ("maxresults", "5000")];
        if !prefix.is_empty() {
            query.push(("prefix", prefix));
        }
        if let Some(marker) = marker {
            query.push(("marker", marker));
        }
        if uncommitted {
            query.push(("include", "uncommittedblobs"));
        }
        let response = self.send(Method::GET, None, &query, Vec::new(), Bytes::new()).await?;
        let body = read_text(response, self.request_timeout).await?;
        let blobs = elements(&body, "Blob").into_iter().filter_map(listed_blob).collect();
        let next = element(&body, "NextMarker").map(unescape).filter(|m| !m.is_empty());
        Ok((blobs, next))
    }

    /// The uncommitted blocks of `key`: (block id, size) in upload order.
    async fn uncommitted_blocks(&self, key: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let query = [("comp", "blocklist"), ("blocklisttype", "uncommitted")];
        let response = self.send(Method::GET, Some(key), &query, Vec::new(), Bytes::new()).await?;
        let body = read_text(response, self.request_timeout).await?;
        let Some(uncommitted) = element(&body, "UncommittedBlocks") else { return Ok(Vec::new()) };
        Ok(elements(uncommitted, "Block")
            .into_iter()
            .filter_map(|block| {
                let name = unescape(element(block, "Name")?);
                let size = element(block, "Size")?.parse().ok()?;
                Some((name, size))
            })
            .collect())
    }
}

/// A blob as List Blobs describes it (one `<Blob>` element's inside).
fn listed_blob(blob: &str) -> Option<ObjectMeta> {
    let key = unescape(element(blob, "Name")?);
    let properties = element(blob, "Properties")?;
    let size = element(properties, "Content-Length")?.parse().ok()?;
    let etag = element(properties, "Etag").map(|e| strip_quotes(&unescape(e)));
    let last_modified = element(properties, "Last-Modified").and_then(parse_http_date);
    Some(ObjectMeta { key, size, etag, last_modified })
}

#[async_trait]
impl ObjectStore for AzureStore {
    fn describe(&self) -> String {
        format!("az://{}", self.container)
    }

    fn identity(&self) -> String {
        // The endpoint names the account, by host or by path.
        format!("az://{}", self.container_url)
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let (blobs, next) = self.list(prefix, token.as_deref(), false).await?;
        Ok(ListPage { objects: blobs, next })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let response = self.send(Method::HEAD, Some(key), &[], Vec::new(), Bytes::new()).await?;
        let headers = response.headers();
        let meta = ObjectMeta {
            key: key.to_owned(),
            size: content_length(headers),
            etag: header_text(headers, "etag").map(strip_quotes),
            last_modified: header_text(headers, "last-modified").and_then(parse_http_date),
        };
        Ok((meta, integrity(headers)))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let mut headers = Vec::with_capacity(2);
        if let Some(range) = &range {
            headers.push(("x-ms-range", range_header(range)));
        }
        if let Some(etag) = if_match {
            headers.push(("if-match", format!("\"{etag}\"")));
        }
        let response = self.send(Method::GET, Some(key), &[], headers, Bytes::new()).await?;
        if let Some(range) = &range {
            check_range(&response, range, key)?;
        }
        let response_headers = response.headers();
        let checksum = if range.is_some() { None } else { integrity(response_headers) };
        let etag = header_text(response_headers, "etag").map(strip_quotes);
        let content_length = content_length(response_headers);
        Ok(GetResponse { content_length, etag, checksum, body: body_stream(response) })
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        let headers = vec![
            ("x-ms-blob-type", "BlockBlob".to_owned()),
            ("x-ms-content-crc64", content_crc64(&body)),
            (CRC32C_METADATA, crc32c_text(crc32c)),
        ];
        let response = self.send(Method::PUT, Some(key), &[], headers, body).await?;
        Ok(header_text(response.headers(), "etag").map(strip_quotes))
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        let _ = key;
        // 16 hex digits: block ids stay well under Azure's 64 bytes.
        Ok(format!("{:016x}", rand::random::<u64>()))
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        let block_id = block_id(upload_id, number, crc32c);
        let query = [("comp", "block"), ("blockid", block_id.as_str())];
        let headers = vec![("x-ms-content-crc64", content_crc64(&body))];
        self.send(Method::PUT, Some(key), &query, headers, body).await?;
        Ok(UploadedPart { number, etag: block_id, crc32c })
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        let _ = upload_id;
        let mut list = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><BlockList>");
        for part in &parts {
            list.push_str(&format!("<Latest>{}</Latest>", escape(&part.etag)));
        }
        list.push_str("</BlockList>");
        let body = Bytes::from(list);
        let headers = vec![("x-ms-content-crc64", content_crc64(&body)), (CRC32C_METADATA, crc32c_text(crc32c))];
        let response = self.send(Method::PUT, Some(key), &[("comp", "blocklist")], headers, body).await?;
        Ok(header_text(response.headers(), "etag").map(strip_quotes))
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        // Nothing to call: uncommitted blocks are never visible, expire on
        // their own, and a later commit keeps only the blocks it names.
        let _ = (key, upload_id);
        Ok(())
    }

    async fn list_parts(&self, key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        // Azure keeps no upload, so none can be gone: an id with no block
        // (yet) lists none, and a re-run goes on with the upload a killed
        // run recorded. Were it "not found", the re-run would start another
        // id, and the killed run's blocks that land after its listing would
        // be stranded under an id no later run resumes.
        let blocks = match self.uncommitted_blocks(key).await {
            Err(StoreError::NotFound) => Vec::new(),
            blocks => blocks?,
        };
        let mut parts: Vec<ListedPart> = blocks
            .into_iter()
            .filter_map(|(id, size)| {
                let (number, crc32c) = part_of(&id, upload_id)?;
                Some(ListedPart { number, size, etag: id, crc32c: Some(crc32c) })
            })
            .collect();
        parts.sort_by_key(|part| part.number);
        parts.dedup_by_key(|part| part.number);
        Ok(parts)
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let mut uploads = Vec::new();
        let mut marker = None;
        loop {
            let (blobs, next) = self.list(prefix, marker.as_deref(), true).await?;
            for blob in blobs {
                let blocks = match self.uncommitted_blocks(&blob.key).await {
                    Ok(blocks) => blocks,
                    Err(StoreError::NotFound) => continue,
                    Err(error) => return Err(error),
                };
                let mut ids: Vec<String> = blocks.iter().filter_map(|(id, _)| upload_of(id)).collect();
                ids.sort();
                ids.dedup();
                uploads.extend(ids.into_iter().map(|upload_id| PendingUpload {
                    key: blob.key.clone(),
                    upload_id,
                    initiated: None,
                }));
            }
            match next {
                Some(next) => marker = Some(next),
                None => return Ok(uploads),
            }
        }
    }
}

/// The metadata header that keeps a blob's CRC32C, as Ferry wrote it.
const CRC32C_METADATA: &str = "x-ms-meta-crc32c";

/// A CRC32C as the metadata and block ids spell it: 8 hex digits.
fn crc32c_text(crc32c: u32) -> String {
    format!("{crc32c:08x}")
}

/// The block id of part `number` of upload `upload_id`, whose bytes have
/// `crc32c`: base64 of `ID-NNNNNN-CCCCCCCC`, the same length for every
/// part of an upload.
fn block_id(upload_id: &str, number: u32, crc32c: u32) -> String {
    BASE64.encode(format!("{upload_id}-{number:06}-{}", crc32c_text(crc32c)))
}

/// A block id of Ferry's, decoded: the upload, the part number and the
/// part's CRC32C; `None` for other writers' ids.
fn decode_block_id(block_id: &str) -> Option<(String, u32, u32)> {
    let decoded = String::from_utf8(BASE64.decode(block_id).ok()?).ok()?;
    let mut fields = decoded.split('-');
    let (upload, number, crc32c) = (fields.next()?, fields.next()?, fields.next()?);
    let hex = |text: &str, len: usize| text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit());
    if fields.next().is_some() || !hex(upload, 16) || number.len() != 6 || !hex(crc32c, 8) {
        return None;
    }
    Some((upload.to_owned(), number.parse().ok()?, u32::from_str_radix(crc32c, 16).ok()?))
}

/// The part number and CRC32C a block id of upload `upload_id` stands for.
fn part_of(block_id: &str, upload_id: &str) -> Option<(u32, u32)> {
    decode_block_id(block_id).filter(|(upload, ..)| upload == upload_id).map(|(_, number, crc32c)| (number, crc32c))
}

/// The upload a block id of Ferry's belongs to; `None` for other writers'.
fn upload_of(block_id: &str) -> Option<String> {
    decode_block_id(block_id).map(|(upload, ..)| upload)
}

/// `x-ms-content-crc64`: the body's CRC-64/NVME (Azure's CRC64), its 8
/// bytes little-endian, in base64.
fn content_crc64(body: &[u8]) -> String {
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc64Nvme);
    digest.update(body);
    BASE64.encode(digest.finalize().to_le_bytes())
}

/// What a whole blob is verified against: the CRC32C Ferry kept in its
/// metadata, else its Content-MD5.
fn integrity(headers: &http::HeaderMap) -> Option<Integrity> {
    let crc32c =
        header_text(headers, CRC32C_METADATA).filter(|t| t.len() == 8).and_then(|t| u32::from_str_radix(t, 16).ok());
    if let Some(crc32c) = crc32c {
        return Some(Integrity::Whole(StoredChecksum::Crc32c(crc32c)));
    }
    let bytes = BASE64.decode(header_text(headers, "content-md5")?).ok()?;
    Some(Integrity::Whole(StoredChecksum::Md5(bytes.try_into().ok()?)))
}

/// An HTTP date (`Fri, 27 Nov 2026 17:50:46 GMT`).
fn parse_http_date(text: &str) -> Option<SystemTime> {
    let parsed = jiff::fmt::strtime::parse(HTTP_DATE, text.trim()).ok()?;
    let timestamp = parsed.to_datetime().ok()?.to_zoned(jiff::tz::TimeZone::UTC).ok()?.timestamp();
    Some(SystemTime::from(timestamp))
}

/// A response body as text (listings and block lists).
async fn read_text(response: http::Response<hyper::body::Incoming>, timeout: Duration) -> Result<String, StoreError> {
    let body = read_body(response, timeout, usize::MAX, "a listing").await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The `Authorization` header of a request under Shared Key: `SharedKey
/// ACCOUNT:SIGNATURE`, the signature an HMAC-SHA256, with the account key,
/// of the verb, eleven standard headers (`Content-Length` empty when 0),
/// the `x-ms-` headers sorted, and the canonical resource: `/ACCOUNT` and
/// the URL `path` as sent (percent-encoded), then each query parameter,
/// lower-cased and sorted, with its value unencoded. Public so that test
/// servers' own requests are signed the way the service checks.
pub fn shared_key_authorization(
    key: &[u8],
    method: &str,
    account: &str,
    path: &str,
    query: &[(&str, &str)],
    headers: &[(&str, String)],
) -> String {
    use hmac::Mac as _;
    let header =
        |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).unwrap_or("");
    let mut text = String::from(method);
    for name in [
        "content-encoding",
        "content-language",
        "content-length",
        "content-md5",
        "content-type",
        "date",
        "if-modified-since",
        "if-match",
        "if-none-match",
        "if-unmodified-since",
        "range",
    ] {
        let value = header(name);
        text.push('\n');
        text.push_str(if name == "content-length" && value == "0" { "" } else { value });
    }
    text.push('\n');
    let mut ms: Vec<(String, &str)> = headers
        .iter()
        .filter(|(n, _)| n.to_ascii_lowercase().starts_with("x-ms-"))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
        .collect();
    ms.sort();
    for (name, value) in ms {
        text.push_str(&format!("{name}:{value}\n"));
    }
    text.push_str(&format!("/{account}{path}"));
    let mut params: Vec<(String, &str)> = query.iter().map(|(n, v)| (n.to_ascii_lowercase(), *v)).collect();
    params.sort();
    for (name, value) in params {
        text.push_str(&format!("\n{name}:{value}"));
    }
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(text.as_bytes());
    format!("SharedKey {account}:{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// Maps an error response to the engine's categories.
fn classify(failed: &Failed, container: &str) -> StoreError {
    let (body_code, message) = error_document(&failed.body);
    let code = header_text(&failed.headers, "x-ms-error-code").map(str::to_owned).unwrap_or(body_code);
    let message = if message.is_empty() { format!("HTTP {}", failed.status) } else { message };
    match (failed.status, code.as_str()) {
        (404, "ContainerNotFound") => StoreError::NoSuchBucket { bucket: container.to_owned() },
        (404, _) => StoreError::NotFound,
        (412, _) => StoreError::Changed,
        (401 | 403, _) => StoreError::AccessDenied { code, message },
        (400, "Md5Mismatch" | "Crc64Mismatch") => StoreError::transient(RetryReason::ChecksumMismatch, message),
        (429, _) | (503, "ServerBusy") => StoreError::transient(RetryReason::Throttled, message),
        (500..=599, _) => StoreError::transient(RetryReason::ServerError, format!("{code}: {message}")),
        _ => StoreError::Rejected { code: if code.is_empty() { failed.status.to_string() } else { code }, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_of_one_name_in_two_accounts_is_two_stores_to_share_between() {
        let store = |endpoint: Option<&str>, account: &str| {
            let options = AzureOptions {
                endpoint_url: endpoint.map(str::to_owned),
                credentials: AzureCredentials::Anonymous { account: Some(account.into()) },
                connect_timeout: Duration::from_secs(1),
                request_timeout: Duration::from_secs(1),
            };
            AzureStore::connect("models", &options).unwrap()
        };
        let (one, two) = (store(None, "teama"), store(None, "teamb"));
        assert_eq!(one.describe(), two.describe(), "messages name the container");
        assert_ne!(one.identity(), two.identity(), "sharing tells the accounts apart");
        assert!(one.identity().contains("teama"), "{}", one.identity());
        let azurite = store(Some("http://127.0.0.1:10000/devstoreaccount1"), "devstoreaccount1");
        assert!(azurite.identity().contains("devstoreaccount1/models"), "{}", azurite.identity());
    }

    #[test]
    fn credentials_prefer_a_sas_token_then_a_key_then_an_entra_identity_and_say_what_is_wrong() {
        let some = |v: &str| Some(v.to_owned());
        let entra = || EntraIdentity::from_values(some("t"), some("c"), some("s"), None, None).unwrap();
        let sas = AzureCredentials::from_values(some("acct"), some("a2V5"), some("?sv=1&sig=x"), entra()).unwrap();
        assert!(matches!(&sas, AzureCredentials::Sas { token, .. } if token == "sv=1&sig=x"), "{sas:?}");
        let key = AzureCredentials::from_values(some("acct"), some("a2V5"), None, entra()).unwrap();
        assert!(matches!(&key, AzureCredentials::SharedKey { key, .. } if key == b"key"), "{key:?}");
        assert!(matches!(key.clone().anonymous(), AzureCredentials::Anonymous { account: Some(a) } if a == "acct"));
        let identity = AzureCredentials::from_values(some("acct"), None, None, entra()).unwrap();
        assert!(matches!(&identity, AzureCredentials::Entra { account: Some(a), .. } if a == "acct"), "{identity:?}");
        assert!(matches!(identity.clone().anonymous(), AzureCredentials::Anonymous { account: Some(_) }));
        let none = AzureCredentials::from_values(None, None, None, None).unwrap();
        assert!(matches!(none, AzureCredentials::Anonymous { account: None }));
        let error = |r: Result<AzureCredentials, StoreError>| r.unwrap_err().to_string();
        assert!(
            error(AzureCredentials::from_values(some("acct"), some("not base64!"), None, None)).contains("not base64")
        );
        assert!(
            error(AzureCredentials::from_values(None, some("a2V5"), None, None))
                .contains("without AZURE_STORAGE_ACCOUNT")
        );
        // Neither a key, a token nor a client secret is ever printed.
        assert_eq!(
            format!("{sas:?} {key:?} {identity:?}"),
            "Sas(Some(\"acct\")) SharedKey(acct) Entra(tenant t, client c, client secret)(Some(\"acct\"))"
        );
    }

    #[test]
    fn block_ids_name_their_upload_part_and_checksum_and_are_one_length() {
        let id = block_id("00112233aabbccdd", 7, 0xE306_9283);
        assert_eq!(part_of(&id, "00112233aabbccdd"), Some((7, 0xE306_9283)));
        assert_eq!(part_of(&id, "ffffffffffffffff"), None);
        assert_eq!(upload_of(&id).as_deref(), Some("00112233aabbccdd"));
        assert_eq!(block_id("00112233aabbccdd", 1, 0).len(), block_id("00112233aabbccdd", 10_000, u32::MAX).len());
        assert!(block_id("00112233aabbccdd", 99_999, u32::MAX).len() <= 64, "Azure's limit for a block id");
        for foreign in ["someone-else's", "00112233aabbccdd-000001", "00112233aabbccdd-000001-xyz00000"] {
            assert_eq!(upload_of(&BASE64.encode(foreign)), None, "{foreign}");
        }
    }

    #[test]
    fn a_blob_is_verified_against_ferrys_crc32c_else_its_md5() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(integrity(&headers), None);
        headers.insert("content-md5", BASE64.encode([7u8; 16]).parse().unwrap());
        assert_eq!(integrity(&headers), Some(Integrity::Whole(StoredChecksum::Md5([7; 16]))));
        headers.insert(CRC32C_METADATA, crc32c_text(0xE306_9283).parse().unwrap());
        assert_eq!(integrity(&headers), Some(Integrity::Whole(StoredChecksum::Crc32c(0xE306_9283))));
        headers.insert(CRC32C_METADATA, "not-hex!".parse().unwrap());
        assert_eq!(
            integrity(&headers),
            Some(Integrity::Whole(StoredChecksum::Md5([7; 16]))),
            "bad metadata is ignored"
        );
    }

    #[test]
    fn the_crc64_header_is_crc64_nvme_little_endian() {
        // CRC-64/NVME("123456789") = 0xAE8B14860A799888.
        assert_eq!(content_crc64(b"123456789"), BASE64.encode(0xAE8B_1486_0A79_9888u64.to_le_bytes()));
    }

    #[test]
    fn the_string_to_sign_is_shared_keys() {
        // Create Container on Azurite, with its public development key; the
        // expected value is HMAC-SHA256 over the documented string to sign,
        // computed apart from this code (and the request is accepted by
        // Azurite in tests/azure.rs).
        let key = BASE64
            .decode("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
            .unwrap();
        let headers = [
            ("x-ms-version", API_VERSION.to_owned()),
            ("x-ms-date", "Fri, 27 Nov 2026 17:50:00 GMT".to_owned()),
            ("content-length", "0".to_owned()),
        ];
        let path = "/devstoreaccount1/ctr1";
        assert_eq!(
            shared_key_authorization(&key, "PUT", "devstoreaccount1", path, &[("restype", "container")], &headers),
            "SharedKey devstoreaccount1:4sQoih52NAhYDy1D25dsa9Ay3WZaSu4DCw5WS6PMtm8="
        );
    }

    #[test]
    fn errors_are_classified_by_status_and_code() {
        let failed = |status, code: &str| Failed {
            status,
            headers: [(http::HeaderName::from_static("x-ms-error-code"), code.parse().unwrap())].into_iter().collect(),
            body: String::new(),
        };
        assert!(
            matches!(classify(&failed(404, "ContainerNotFound"), "c"), StoreError::NoSuchBucket { bucket } if bucket == "c")
        );
        assert!(matches!(classify(&failed(404, "BlobNotFound"), "c"), StoreError::NotFound));
        assert!(matches!(classify(&failed(412, "ConditionNotMet"), "c"), StoreError::Changed));
        assert!(matches!(classify(&failed(403, "AuthenticationFailed"), "c"), StoreError::AccessDenied { .. }));
        assert_eq!(classify(&failed(503, "ServerBusy"), "c").retry_reason(), Some(RetryReason::Throttled));
        assert_eq!(classify(&failed(400, "Crc64Mismatch"), "c").retry_reason(), Some(RetryReason::ChecksumMismatch));
    }

    #[test]
    fn listings_are_read_with_their_properties() {
        let blob = "<Name>p/a&amp;b.bin</Name><Properties><Last-Modified>Fri, 27 Nov 2026 17:50:46 GMT</Last-Modified><Etag>0x21704942EC9F440</Etag><Content-Length>70</Content-Length></Properties>";
        let listed = listed_blob(blob).unwrap();
        assert_eq!(
            (listed.key.as_str(), listed.size, listed.etag.as_deref()),
            ("p/a&b.bin", 70, Some("0x21704942EC9F440"))
        );
        assert!(listed.last_modified.is_some());
    }
}
