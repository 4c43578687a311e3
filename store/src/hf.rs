//! Hugging Face Hub repositories (`hf://[datasets/|spaces/]ORG/REPO[@REVISION]`),
//! pull only, through the Hub's HTTP API on the same pooled hyper client
//! as S3, Azure and OCI.
//!
//! The revision (a branch, a tag or a commit; `main` when none is named) is
//! resolved to its commit once per store (`/api/{kind}/{id}/revision/{rev}`),
//! and everything after that names the commit: the listing and every file
//! read come from one commit even if the branch moves meanwhile, and the
//! next run resolves the branch anew. The listing is the repository's
//! whole tree at that commit (`/api/{kind}/{id}/tree/{commit}?recursive=true`,
//! paged by the `Link: <…>; rel="next"` header the Hub sends), read once.
//!
//! Every file carries what it is verified against in that listing, so no
//! request is spent on it: a file kept in LFS its SHA-256 (`lfs.oid`), a
//! file kept in git its blob id (`oid`, a SHA-1 of git's header and the
//! bytes). That id is also the file's ETag, so a re-sync copies only files
//! whose content changed.
//!
//! A file is read from `/{kind/}{id}/resolve/{commit}/{path}`, ranged where
//! the engine asks. The Hub answers LFS files with a redirect to its
//! storage (a presigned URL on another host): redirects are followed, the
//! range kept, and the token (`Authorization: Bearer`) is sent to the
//! endpoint's own host only, never to another.
//!
//! Errors: the Hub names what is missing in `X-Error-Code` (`RepoNotFound`,
//! `RevisionNotFound`, `EntryNotFound`, `GatedRepo`) and says why in
//! `X-Error-Message` or a JSON `{"error": …}`; both are passed on.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use ferry_contract::HubRepo;
use ferry_contract::hub::{HF_TOKEN_ENV, is_commit_id};
use http::{HeaderMap, Method, Request};
use http_body_util::Full;
use serde::Deserialize;

use crate::http::{
    Failed, HttpClient, authority_of, body_stream, check_range, client_for, content_length, encode_uri, exchange,
    header_text, header_value, is_redirect, range_header, read_body, redirect_target,
};
use crate::{
    GetResponse, Integrity, ListPage, ListedPart, ObjectMeta, ObjectStore, PendingUpload, RetryReason, StoreError,
    StoredChecksum, UploadedPart,
};

/// The most of one page of a listing, or of a revision's answer, that is read.
const API_BODY_LIMIT: usize = 32 << 20;

/// How many redirects a file read follows (the Hub uses one; a renamed
/// repository adds one).
const MAX_REDIRECTS: usize = 5;

/// How many objects one page of [`ObjectStore::list_page`] holds.
const LIST_PAGE: usize = 1000;

/// How a store reaches the Hub.
#[derive(Clone)]
pub struct HubOptions {
    /// The Hub's URL: `https://huggingface.co`, a mirror or a private hub.
    pub endpoint_url: String,
    /// An access token, sent to the endpoint's host only.
    pub token: Option<String>,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long a request may wait for its response headers.
    pub request_timeout: Duration,
}

impl std::fmt::Debug for HubOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubOptions")
            .field("endpoint_url", &self.endpoint_url)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// One file of the commit.
#[derive(Clone, Debug)]
struct HubFile {
    size: u64,
    /// The git blob id, or for an LFS file its SHA-256: the ETag.
    oid: String,
    integrity: Option<Integrity>,
}

/// The commit a revision resolved to, and its files by path.
#[derive(Debug)]
struct Snapshot {
    commit: String,
    files: BTreeMap<String, HubFile>,
}

/// A repository on the Hub at one commit.
pub struct HubStore {
    client: HttpClient,
    /// The endpoint, without a trailing slash.
    base: String,
    /// `scheme://host[:port]` of the endpoint: the only one the token goes to.
    authority: String,
    repo: HubRepo,
    token: Option<String>,
    snapshot: tokio::sync::OnceCell<Snapshot>,
    request_timeout: Duration,
}

impl std::fmt::Debug for HubStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubStore")
            .field("base", &self.base)
            .field("repo", &self.repo)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// What the Hub says of a revision.
#[derive(Deserialize)]
struct RevisionInfo {
    sha: String,
}

/// One entry of a tree listing.
#[derive(Deserialize)]
struct TreeEntry {
    #[serde(rename = "type")]
    kind: String,
    path: String,
    #[serde(default)]
    oid: String,
    #[serde(default)]
    size: u64,
    lfs: Option<LfsInfo>,
}

#[derive(Deserialize)]
struct LfsInfo {
    oid: String,
    size: u64,
}

impl HubStore {
    /// A client for `repo` on the Hub `options` name.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] for an endpoint that is no URL or, over
    /// https, no TLS roots.
    pub fn connect(repo: HubRepo, options: &HubOptions) -> Result<Self, StoreError> {
        let base = options.endpoint_url.trim_end_matches('/').to_owned();
        let client = client_for(&base, options.connect_timeout)?;
        let authority = authority_of(&base).ok_or_else(|| StoreError::Rejected {
            code: "InvalidEndpoint".into(),
            message: format!("'{base}' is not an http or https URL"),
        })?;
        Ok(Self {
            client,
            base,
            authority,
            repo,
            token: options.token.clone().filter(|t| !t.is_empty()),
            snapshot: tokio::sync::OnceCell::new(),
            request_timeout: options.request_timeout,
        })
    }

    async fn snapshot(&self) -> Result<&Snapshot, StoreError> {
        self.snapshot.get_or_try_init(|| self.resolve()).await
    }

    /// The revision's commit, then the commit's whole tree.
    async fn resolve(&self) -> Result<Snapshot, StoreError> {
        let api = format!("/api/{}/{}", self.repo.kind.plural(), self.repo.id);
        let path = format!("{api}/revision/{}", encode_uri(self.repo.revision(), false));
        let body = self.api_body(&path, "the revision").await?;
        let info: RevisionInfo = serde_json::from_slice(&body).map_err(|e| StoreError::Rejected {
            code: "InvalidResponse".into(),
            message: format!(
                "{}: the Hub's answer about revision '{}' is unreadable: {e}",
                self.describe(),
                self.repo.revision()
            ),
        })?;
        if !is_commit_id(&info.sha) {
            return Err(StoreError::Rejected {
                code: "InvalidResponse".into(),
                message: format!(
                    "{}: revision '{}' resolved to '{}', which is no commit",
                    self.describe(),
                    self.repo.revision(),
                    info.sha
                ),
            });
        }
        if self.repo.is_commit() && self.repo.revision() != info.sha {
            return Err(StoreError::Rejected {
                code: "InvalidResponse".into(),
                message: format!(
                    "{}: the Hub answered commit {} for commit {}",
                    self.describe(),
                    info.sha,
                    self.repo.revision()
                ),
            });
        }
        let mut files = BTreeMap::new();
        let mut next = Some(format!("{}{api}/tree/{}?recursive=true", self.base, info.sha));
        while let Some(url) = next.take() {
            let response = self.send_following(&url, &[], Missing::Repository).await?;
            next = next_link(response.headers());
            let body = read_body(response, self.request_timeout, API_BODY_LIMIT, "a tree listing").await?;
            let entries: Vec<TreeEntry> = serde_json::from_slice(&body).map_err(|e| StoreError::Rejected {
                code: "InvalidResponse".into(),
                message: format!("{}: the Hub's tree listing is unreadable: {e}", self.describe()),
            })?;
            for entry in entries.into_iter().filter(|e| e.kind == "file") {
                let file = match entry.lfs {
                    Some(lfs) => HubFile { size: lfs.size, integrity: sha256_of(&lfs.oid), oid: lfs.oid },
                    None => HubFile { size: entry.size, integrity: git_blob_of(&entry.oid), oid: entry.oid },
                };
                files.insert(entry.path, file);
            }
        }
        tracing::debug!(repo = %self.repo, commit = %info.sha, files = files.len(), "resolved the revision");
        Ok(Snapshot { commit: info.sha, files })
    }

    /// The body of an API answer at `path` under the endpoint.
    async fn api_body(&self, path: &str, what: &str) -> Result<Bytes, StoreError> {
        let response = self.send_following(&format!("{}{path}", self.base), &[], Missing::Repository).await?;
        read_body(response, self.request_timeout, API_BODY_LIMIT, what).await
    }

    /// A GET of `url`, following redirects; the token goes only to the
    /// endpoint's own host. A failure comes back classified.
    async fn send_following(
        &self,
        url: &str,
        headers: &[(&str, String)],
        missing: Missing,
    ) -> Result<http::Response<hyper::body::Incoming>, StoreError> {
        let mut url = url.to_owned();
        for _ in 0..=MAX_REDIRECTS {
            let token = self.token.as_deref().filter(|_| authority_of(&url).as_deref() == Some(&self.authority));
            let mut request = Request::builder().method(Method::GET).uri(&url);
            for (name, value) in headers {
                request = request.header(*name, header_value(value)?);
            }
            if let Some(token) = token {
                request = request.header("authorization", header_value(&format!("Bearer {token}"))?);
            }
            let request = request
                .body(Full::new(Bytes::new()))
                .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
            let failed = match exchange(&self.client, request, self.request_timeout, &url).await? {
                Ok(response) => return Ok(response),
                Err(failed) => failed,
            };
            if !is_redirect(&failed) {
                return Err(self.classify(&failed, missing));
            }
            url = redirect_target(&failed, &url)?;
        }
        Err(StoreError::Rejected {
            code: "TooManyRedirects".into(),
            message: format!("more than {MAX_REDIRECTS} redirects, last to {url}"),
        })
    }

    /// The file a key names.
    async fn file(&self, key: &str) -> Result<(&str, &HubFile), StoreError> {
        let snapshot = self.snapshot().await?;
        Ok((&snapshot.commit, snapshot.files.get(key).ok_or(StoreError::NotFound)?))
    }

    /// Maps an error answer to the engine's categories, with the Hub's own
    /// code and message.
    fn classify(&self, failed: &Failed, missing: Missing) -> StoreError {
        let code = header_text(&failed.headers, "x-error-code").unwrap_or_default().to_owned();
        let message = hub_message(&failed.headers, &failed.body).unwrap_or_else(|| format!("HTTP {}", failed.status));
        match (failed.status, code.as_str()) {
            (401 | 403, _) => {
                let hint = if self.token.is_some() {
                    "; the token was refused or lacks access to this repository".to_owned()
                } else {
                    format!(
                        "; a gated or private repository needs a token: set {HF_TOKEN_ENV} (the {HF_TOKEN_ENV} key of a DataStage's credentials Secret)"
                    )
                };
                let code = if code.is_empty() { failed.status.to_string() } else { code };
                StoreError::AccessDenied { code, message: format!("{}: {message}{hint}", self.describe()) }
            }
            (404, "EntryNotFound") => StoreError::NotFound,
            (404, "RevisionNotFound") => StoreError::Rejected {
                code,
                message: format!("{} has no revision '{}': {message}", self.describe(), self.repo.revision()),
            },
            (404, _) if missing == Missing::File => StoreError::NotFound,
            (404, _) => StoreError::NoSuchBucket { bucket: self.describe() },
            (429, _) => StoreError::transient(RetryReason::Throttled, message),
            (500..=599, _) => {
                StoreError::transient(RetryReason::ServerError, format!("HTTP {}: {message}", failed.status))
            }
            (status, _) => {
                StoreError::Rejected { code: if code.is_empty() { status.to_string() } else { code }, message }
            }
        }
    }

    fn read_only(&self) -> StoreError {
        StoreError::Rejected {
            code: "ReadOnlyStore".into(),
            message: format!(
                "{} is a source only: Ferry pulls from the Hugging Face Hub but does not push to it",
                self.describe()
            ),
        }
    }
}

/// What a failed request was after, for what a 404 without a code means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    Repository,
    File,
}

/// The URL of the `rel="next"` entry of a `Link` header.
fn next_link(headers: &HeaderMap) -> Option<String> {
    headers.get_all("link").iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).find_map(|link| {
        let (target, params) = link.trim().split_once(';')?;
        let is_next = params.split(';').any(|p| matches!(p.trim(), "rel=\"next\"" | "rel=next"));
        let url = target.trim().strip_prefix('<')?.strip_suffix('>')?;
        is_next.then(|| url.to_owned())
    })
}

/// The Hub's own words for an error: `X-Error-Message`, else the body's
/// `error`, else the body.
fn hub_message(headers: &HeaderMap, body: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        error: String,
    }
    header_text(headers, "x-error-message")
        .map(str::to_owned)
        .or_else(|| serde_json::from_str::<ErrorBody>(body).ok().map(|e| e.error))
        .or_else(|| Some(body.trim().chars().take(300).collect::<String>()).filter(|b| !b.is_empty()))
}

fn sha256_of(hex_digest: &str) -> Option<Integrity> {
    let bytes = hex::decode(hex_digest).ok()?;
    Some(Integrity::Whole(StoredChecksum::Sha256(bytes.try_into().ok()?)))
}

fn git_blob_of(hex_id: &str) -> Option<Integrity> {
    let bytes = hex::decode(hex_id).ok()?;
    Some(Integrity::Whole(StoredChecksum::GitBlob(bytes.try_into().ok()?)))
}

/// The token the environment gives (`HF_TOKEN`), when it gives one.
pub fn token_from_env() -> Option<String> {
    std::env::var(HF_TOKEN_ENV).ok().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty())
}

#[async_trait]
impl ObjectStore for HubStore {
    fn describe(&self) -> String {
        format!("hf://{}", self.repo)
    }

    fn revision(&self) -> Option<String> {
        self.snapshot.get().map(|s| s.commit.clone())
    }

    /// The endpoint and the repository without its revision: a mirror may
    /// hold other bytes than the Hub under the same names, and two
    /// revisions of one repository share every file whose id is the same
    /// (the id is the ETag, which tells versions apart).
    fn identity(&self) -> String {
        format!("{}/{}{}", self.base, self.repo.kind.url_prefix(), self.repo.id)
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let snapshot = self.snapshot().await?;
        let start = token.unwrap_or_else(|| prefix.to_owned());
        let mut objects = Vec::with_capacity(LIST_PAGE);
        let from = (std::ops::Bound::Included(start.as_str()), std::ops::Bound::Unbounded);
        for (key, file) in snapshot.files.range::<str, _>(from) {
            if !key.starts_with(prefix) {
                break;
            }
            if objects.len() == LIST_PAGE {
                return Ok(ListPage { objects, next: Some(key.clone()) });
            }
            objects.push(ObjectMeta {
                key: key.clone(),
                size: file.size,
                etag: Some(file.oid.clone()),
                last_modified: None,
            });
        }
        Ok(ListPage { objects, next: None })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let (_, file) = self.file(key).await?;
        let meta =
            ObjectMeta { key: key.to_owned(), size: file.size, etag: Some(file.oid.clone()), last_modified: None };
        Ok((meta, file.integrity.clone()))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let (commit, file) = self.file(key).await?;
        if if_match.is_some_and(|etag| etag != file.oid) {
            return Err(StoreError::Changed);
        }
        let mut headers = Vec::with_capacity(1);
        if let Some(range) = &range {
            headers.push(("range", range_header(range)));
        }
        let url = format!(
            "{}/{}{}/resolve/{commit}/{}",
            self.base,
            self.repo.kind.url_prefix(),
            self.repo.id,
            encode_uri(key, true)
        );
        let response = self.send_following(&url, &headers, Missing::File).await?;
        if let Some(range) = &range {
            check_range(&response, range, key)?;
        }
        // olah streams files chunked, without a Content-Length: then what
        // is expected is what was asked for (chunked framing says where the
        // body ends, and the engine counts what arrives).
        let announced = response.headers().contains_key(http::header::CONTENT_LENGTH);
        let content_length = if announced {
            content_length(response.headers())
        } else {
            range.as_ref().map_or(file.size, |r| r.end - r.start)
        };
        let checksum = if range.is_some() { None } else { file.integrity.clone() };
        Ok(GetResponse { content_length, etag: Some(file.oid.clone()), checksum, body: body_stream(response) })
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        let _ = (key, body, crc32c);
        Err(self.read_only())
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        let _ = key;
        Err(self.read_only())
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        let _ = (key, upload_id, number, body, crc32c);
        Err(self.read_only())
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        let _ = (key, upload_id, parts, crc32c);
        Err(self.read_only())
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        let _ = (key, upload_id);
        Err(self.read_only())
    }

    async fn list_parts(&self, key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        let _ = (key, upload_id);
        Err(self.read_only())
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let _ = prefix;
        Err(self.read_only())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_goes_to_the_endpoints_own_authority_only() {
        assert_eq!(authority_of("https://HuggingFace.co/acme/tiny/resolve/x/a"), Some("https://huggingface.co".into()));
        assert_eq!(authority_of("http://127.0.0.1:8090/api?x=1"), Some("http://127.0.0.1:8090".into()));
        assert_ne!(authority_of("https://huggingface.co.evil.example/x"), authority_of("https://huggingface.co/x"));
        assert_ne!(
            authority_of("http://huggingface.co/x"),
            authority_of("https://huggingface.co/x"),
            "not over plain http"
        );
        assert_ne!(authority_of("https://huggingface.co:8443/x"), authority_of("https://huggingface.co/x"));
        assert_eq!(authority_of("ftp://h/x"), None);
        assert_eq!(authority_of("https:///x"), None);
    }

    #[test]
    fn the_next_page_is_the_links_rel_next() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "link",
            "<https://huggingface.co/api/models/a/b/tree/c?recursive=true&cursor=ZXk>; rel=\"next\"".parse().unwrap(),
        );
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://huggingface.co/api/models/a/b/tree/c?recursive=true&cursor=ZXk")
        );
        headers.insert("link", "<https://h/p1>; rel=\"prev\", <https://h/p3>; rel=next".parse().unwrap());
        assert_eq!(next_link(&headers).as_deref(), Some("https://h/p3"));
        headers.insert("link", "<https://h/p1>; rel=\"prev\"".parse().unwrap());
        assert_eq!(next_link(&headers), None);
    }

    #[test]
    fn the_hubs_words_are_passed_on() {
        let mut headers = HeaderMap::new();
        assert_eq!(
            hub_message(&headers, r#"{"error":"Repository Not Found for url"}"#).as_deref(),
            Some("Repository Not Found for url")
        );
        assert_eq!(hub_message(&headers, "plain words\n").as_deref(), Some("plain words"));
        assert_eq!(hub_message(&headers, ""), None);
        headers.insert("x-error-message", "Access to model acme/gated is restricted.".parse().unwrap());
        assert_eq!(
            hub_message(&headers, r#"{"error":"x"}"#).as_deref(),
            Some("Access to model acme/gated is restricted.")
        );
    }

    #[test]
    fn listed_ids_become_checksums() {
        assert_eq!(
            git_blob_of("95d09f2b10159347eece71399a7e2e907ea3df4f"),
            Some(Integrity::Whole(StoredChecksum::GitBlob(
                hex::decode("95d09f2b10159347eece71399a7e2e907ea3df4f").unwrap().try_into().unwrap()
            )))
        );
        assert_eq!(sha256_of(&"ab".repeat(32)), Some(Integrity::Whole(StoredChecksum::Sha256([0xab; 32]))));
        assert_eq!(sha256_of("ab"), None);
        assert_eq!(git_blob_of("not hex"), None);
    }

    fn store(token: Option<&str>) -> HubStore {
        let options = HubOptions {
            endpoint_url: "http://127.0.0.1:9/".into(),
            token: token.map(str::to_owned),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
        };
        HubStore::connect("datasets/acme/corpus@v2".parse().unwrap(), &options).unwrap()
    }

    #[test]
    fn errors_say_what_is_missing_and_how_to_get_in() {
        let failed = |status, code: &str| {
            let mut headers = HeaderMap::new();
            if !code.is_empty() {
                headers.insert("x-error-code", code.parse().unwrap());
            }
            Failed { status, headers, body: r#"{"error":"the Hub says so"}"#.into() }
        };
        let anonymous = store(None);
        let denied = anonymous.classify(&failed(401, "GatedRepo"), Missing::Repository);
        assert!(matches!(&denied, StoreError::AccessDenied { code, .. } if code == "GatedRepo"), "{denied:?}");
        assert!(
            denied.to_string().contains("set HF_TOKEN") && denied.to_string().contains("the Hub says so"),
            "{denied}"
        );
        let refused = store(Some("hf_x")).classify(&failed(403, ""), Missing::File);
        assert!(refused.to_string().contains("the token was refused"), "{refused}");
        assert!(matches!(
            anonymous.classify(&failed(404, "RepoNotFound"), Missing::Repository),
            StoreError::NoSuchBucket { bucket } if bucket == "hf://datasets/acme/corpus@v2"
        ));
        let revision = anonymous.classify(&failed(404, "RevisionNotFound"), Missing::Repository);
        assert!(
            matches!(&revision, StoreError::Rejected { code, message } if code == "RevisionNotFound" && message.contains("no revision 'v2'")),
            "{revision:?}"
        );
        assert!(matches!(anonymous.classify(&failed(404, "EntryNotFound"), Missing::Repository), StoreError::NotFound));
        assert!(matches!(anonymous.classify(&failed(404, ""), Missing::File), StoreError::NotFound));
        assert_eq!(anonymous.classify(&failed(429, ""), Missing::File).retry_reason(), Some(RetryReason::Throttled));
        assert_eq!(anonymous.classify(&failed(502, ""), Missing::File).retry_reason(), Some(RetryReason::ServerError));
        assert!(!format!("{:?}", store(Some("hf_secret"))).contains("hf_secret"), "never the token");
    }
}
