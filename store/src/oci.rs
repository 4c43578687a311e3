//! OCI registries (`oci://REGISTRY/REPOSITORY:TAG`, or `…@sha256:DIGEST`),
//! pull only, through the distribution API on the same pooled hyper client
//! as S3 and Azure.
//!
//! An artifact is a manifest whose layers are files. Each layer named by an
//! `org.opencontainers.image.title` annotation (as ORAS writes them; a
//! ModelPack `org.cncf.model.filepath` too) is the object of that key, its
//! size the layer's, its ETag the layer's digest and its checksum the
//! digest's SHA-256, which every layer has. Layers without a name (a
//! container image's) are skipped, as ORAS skips them.
//!
//! The manifest is resolved once per store, so every object of a run comes
//! from one manifest even if the tag moves meanwhile; the next run resolves
//! the tag anew, and the engine copies only layers whose digest changed.
//! A layer is read by digest (`/v2/REPO/blobs/DIGEST`), ranged where the
//! engine asks, following a redirect to the registry's storage (without the
//! registry's credentials) where it answers with one.
//!
//! Auth follows Docker's conventions: the registry host's entry in
//! `$DOCKER_CONFIG/config.json` (`~/.docker/config.json` by default):
//! `auth` (base64 `user:password`), `username` and `password`, or
//! `identitytoken`. A request goes out without credentials first and
//! answers the registry's challenge: Basic, or a Bearer token from the
//! realm it names, for `repository:REPO:pull`. No entry: anonymous (public
//! repositories). Credential helpers (`credsStore`) are not run.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::http::{
    Failed, HttpClient, body_stream, check_range, client_for, content_length, encode_uri, exchange, header_text,
    header_value, is_redirect, range_header, read_body, redirect_target,
};
use crate::{
    GetResponse, Integrity, ListPage, ListedPart, ObjectMeta, ObjectStore, PendingUpload, RetryReason, StoreError,
    StoredChecksum, UploadedPart,
};

/// The manifest media types asked for: OCI and Docker image manifests, and
/// indexes, only so that an index is recognised and refused clearly.
const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.oci.image.index.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";

/// The annotations that name a layer's file, in the order they are read.
const TITLE_ANNOTATIONS: [&str; 2] = ["org.opencontainers.image.title", "org.cncf.model.filepath"];

/// The annotation `oras push` puts on a directory it packed into one tar
/// layer (`true`): the layer is an archive, not the file its title names.
const UNPACK_ANNOTATION: &str = "io.deis.oras.content.unpack";

/// The most of a manifest that is read (the distribution project's limit).
const MANIFEST_LIMIT: usize = 4 << 20;

/// A repository and the manifest it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `models/llama3`.
    pub repository: String,
    /// A tag (`v1`) or a digest (`sha256:…`).
    pub reference: String,
}

impl Reference {
    /// Whether the reference is a digest (immutable) rather than a tag.
    pub fn is_digest(&self) -> bool {
        self.reference.contains(':')
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let separator = if self.is_digest() { '@' } else { ':' };
        write!(f, "{}/{}{separator}{}", self.registry, self.repository, self.reference)
    }
}

/// A reference that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST]")]
pub struct InvalidReference(String);

impl FromStr for Reference {
    type Err = InvalidReference;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidReference(text.to_owned());
        let (registry, rest) = text.split_once('/').ok_or_else(invalid)?;
        let (repository, reference) = match rest.split_once('@') {
            Some((repository, digest)) => {
                let hex = digest.strip_prefix("sha256:").ok_or_else(invalid)?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err(invalid());
                }
                (repository, digest.to_owned())
            }
            None => match rest.rsplit_once(':') {
                Some((repository, tag)) if !tag.contains('/') => (repository, tag.to_owned()),
                // Docker's default.
                _ => (rest, "latest".to_owned()),
            },
        };
        let name_ok = |part: &str| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && part.as_bytes()[0].is_ascii_alphanumeric()
        };
        let tag_ok = reference.contains(':')
            || (!reference.is_empty()
                && reference.len() <= 128
                && reference.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
        if registry.is_empty() || !repository.split('/').all(name_ok) || !tag_ok {
            return Err(invalid());
        }
        Ok(Self { registry: registry.to_owned(), repository: repository.to_owned(), reference })
    }
}

/// How to reach a registry.
#[derive(Clone, Debug)]
pub struct OciOptions {
    /// The registry's base URL, e.g. `http://127.0.0.1:5000` for a local
    /// registry without TLS; default `https://REGISTRY`.
    pub endpoint_url: Option<String>,
    /// Credentials for the registry; `None`: anonymous.
    pub credentials: Option<RegistryCredentials>,
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one request until its response headers arrive.
    pub request_timeout: Duration,
}

/// Credentials for one registry, as a Docker config holds them.
#[derive(Clone, PartialEq, Eq)]
pub enum RegistryCredentials {
    /// A user name and a password (or an access token used as one).
    Basic {
        /// The user name.
        username: String,
        /// The password.
        password: String,
    },
    /// An OAuth2 refresh token (`identitytoken`), exchanged at the token
    /// service.
    IdentityToken(String),
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password or the token.
        match self {
            RegistryCredentials::Basic { username, .. } => write!(f, "Basic({username})"),
            RegistryCredentials::IdentityToken(_) => f.write_str("IdentityToken"),
        }
    }
}

pub use ferry_contract::options::DOCKER_CONFIG_ENV;

/// A Docker `config.json`: only what authenticates.
#[derive(Debug, Default, Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Debug, Default, Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
}

impl RegistryCredentials {
    /// The credentials `$DOCKER_CONFIG/config.json` (else
    /// `~/.docker/config.json`) holds for `registry`; none when there is no
    /// such file or no entry for the registry.
    ///
    /// # Errors
    /// A file that exists but cannot be read or parsed, or an entry whose
    /// `auth` is not base64 of `user:password`.
    pub fn from_docker_config(registry: &str) -> Result<Option<Self>, StoreError> {
        let dir = std::env::var_os(DOCKER_CONFIG_ENV)
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".docker")));
        let Some(path) = dir.map(|dir| dir.join("config.json")) else { return Ok(None) };
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(StoreError::NoCredentials(format!("cannot read {}: {error}", path.display())));
            }
        };
        Self::from_config_text(&text, registry)
            .map_err(|message| StoreError::NoCredentials(format!("{}: {message}", path.display())))
    }

    /// The entry for `registry` in a Docker config's text. Keys may be a
    /// bare host or a URL (`https://index.docker.io/v1/`).
    fn from_config_text(text: &str, registry: &str) -> Result<Option<Self>, String> {
        let config: DockerConfig = serde_json::from_str(text).map_err(|e| format!("not a Docker config: {e}"))?;
        let host_of = |key: &str| {
            let key = key.split_once("://").map_or(key, |(_, rest)| rest);
            key.split('/').next().unwrap_or_default().to_owned()
        };
        let Some(entry) = config.auths.iter().find(|(key, _)| host_of(key) == registry).map(|(_, entry)| entry) else {
            return Ok(None);
        };
        if let Some(token) = entry.identitytoken.as_ref().filter(|t| !t.is_empty()) {
            return Ok(Some(RegistryCredentials::IdentityToken(token.clone())));
        }
        if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some(RegistryCredentials::Basic { username: username.clone(), password: password.clone() }));
        }
        let Some(auth) = entry.auth.as_ref().filter(|a| !a.is_empty()) else { return Ok(None) };
        let decoded = BASE64.decode(auth.trim()).ok().and_then(|bytes| String::from_utf8(bytes).ok());
        let (username, password) = decoded
            .as_deref()
            .and_then(|pair| pair.split_once(':'))
            .ok_or_else(|| format!("the auth of {registry} is not base64 of user:password"))?;
        Ok(Some(RegistryCredentials::Basic { username: username.to_owned(), password: password.to_owned() }))
    }
}

/// A layer: what a key reads.
#[derive(Clone, Debug)]
struct Layer {
    digest: String,
    size: u64,
}

/// A resolved manifest: its digest and its named layers by key.
#[derive(Debug)]
struct Artifact {
    layers: BTreeMap<String, Layer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestDocument {
    media_type: Option<String>,
    #[serde(default)]
    layers: Vec<Descriptor>,
    manifests: Option<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    size: u64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// A repository at one manifest.
pub struct OciStore {
    client: HttpClient,
    /// `https://REGISTRY` or the endpoint, without a trailing slash.
    base: String,
    reference: Reference,
    credentials: Option<RegistryCredentials>,
    /// The `Authorization` value the registry last accepted.
    authorization: tokio::sync::RwLock<Option<String>>,
    artifact: tokio::sync::OnceCell<Artifact>,
    request_timeout: Duration,
}

impl std::fmt::Debug for OciStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciStore")
            .field("base", &self.base)
            .field("reference", &self.reference)
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

/// What a 404 means for a request: its manifest (the repository or the
/// tag) or a blob is missing.
#[derive(Clone, Copy, Debug)]
enum Missing {
    Artifact,
    Blob,
}

/// A registry's `WWW-Authenticate` challenge.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    Basic,
    Bearer { realm: String, service: Option<String>, scope: Option<String> },
}

impl Challenge {
    /// `Basic realm="…"` or `Bearer realm="…",service="…",scope="…"`.
    fn parse(header: &str) -> Option<Self> {
        let (scheme, params) = header.trim().split_once(' ').unwrap_or((header.trim(), ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let mut found = BTreeMap::new();
        let mut rest = params.trim();
        while let Some((name, after)) = rest.split_once('=') {
            let name = name.trim().trim_start_matches(',').trim().to_ascii_lowercase();
            let after = after.trim_start();
            let (value, remaining) = match after.strip_prefix('"') {
                Some(quoted) => {
                    let end = quoted.find('"')?;
                    (&quoted[..end], &quoted[end + 1..])
                }
                None => after.split_once(',').map_or((after, ""), |(value, rest)| (value, rest)),
            };
            found.insert(name, value.to_owned());
            rest = remaining.trim_start().trim_start_matches(',');
        }
        Some(Challenge::Bearer {
            realm: found.remove("realm")?,
            service: found.remove("service"),
            scope: found.remove("scope"),
        })
    }
}

impl OciStore {
    /// A client for `reference`.
    ///
    /// # Errors
    /// [`StoreError::Rejected`] for an endpoint that is no URL or, over
    /// https, no TLS roots.
    pub fn connect(reference: Reference, options: &OciOptions) -> Result<Self, StoreError> {
        let base = match &options.endpoint_url {
            Some(endpoint) => endpoint.trim_end_matches('/').to_owned(),
            None => format!("https://{}", reference.registry),
        };
        let client = client_for(&base, options.connect_timeout)?;
        Ok(Self {
            client,
            base,
            reference,
            credentials: options.credentials.clone(),
            authorization: tokio::sync::RwLock::new(None),
            artifact: tokio::sync::OnceCell::new(),
            request_timeout: options.request_timeout,
        })
    }

    /// A GET of `path` under the registry (`/v2/…`), authorised as the
    /// registry asks, following one redirect; a failure comes back classified.
    async fn get_path(
        &self,
        path: &str,
        headers: &[(&str, String)],
        missing: Missing,
    ) -> Result<http::Response<hyper::body::Incoming>, StoreError> {
        let url = format!("{}{path}", self.base);
        for attempt in 0..2 {
            let authorization = self.authorization.read().await.clone();
            let failed = match self.send(&url, headers, authorization.as_deref()).await? {
                Ok(response) => return Ok(response),
                Err(failed) => failed,
            };
            match failed.status {
                401 if attempt == 0 => {
                    let challenge = header_text(&failed.headers, "www-authenticate").and_then(Challenge::parse);
                    let Some(challenge) = challenge else { return Err(self.classify(&failed, missing)) };
                    let value = self.authorize(&challenge).await?;
                    *self.authorization.write().await = Some(value);
                }
                _ if is_redirect(&failed) => {
                    let target = redirect_target(&failed, &url)?;
                    // The registry's storage (a presigned URL): never the registry's credentials.
                    return match self.send(&target, headers, None).await? {
                        Ok(response) => Ok(response),
                        Err(failed) => Err(self.classify(&failed, missing)),
                    };
                }
                _ => return Err(self.classify(&failed, missing)),
            }
        }
        Err(StoreError::AccessDenied {
            code: "UNAUTHORIZED".into(),
            message: format!("{} refused the credentials it asked for", self.reference.registry),
        })
    }

    /// One GET with `authorization`.
    async fn send(
        &self,
        url: &str,
        headers: &[(&str, String)],
        authorization: Option<&str>,
    ) -> Result<Result<http::Response<hyper::body::Incoming>, Failed>, StoreError> {
        let mut request = Request::builder().method(Method::GET).uri(url);
        for (name, value) in headers {
            request = request.header(*name, header_value(value)?);
        }
        if let Some(authorization) = authorization {
            request = request.header("authorization", header_value(authorization)?);
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
        exchange(&self.client, request, self.request_timeout, url).await
    }

    /// The `Authorization` value that answers `challenge`.
    async fn authorize(&self, challenge: &Challenge) -> Result<String, StoreError> {
        let registry = &self.reference.registry;
        let basic =
            |username: &str, password: &str| format!("Basic {}", BASE64.encode(format!("{username}:{password}")));
        match (challenge, &self.credentials) {
            (Challenge::Basic, Some(RegistryCredentials::Basic { username, password })) => {
                Ok(basic(username, password))
            }
            (Challenge::Basic, _) => Err(StoreError::NoCredentials(format!(
                "{registry} asks for a user name and password, and the Docker config ({DOCKER_CONFIG_ENV}) has none for it"
            ))),
            (Challenge::Bearer { realm, service, scope }, credentials) => {
                let scope = scope.clone().unwrap_or_else(|| format!("repository:{}:pull", self.reference.repository));
                let mut query = vec![("scope", scope.as_str())];
                if let Some(service) = service {
                    query.push(("service", service.as_str()));
                }
                let token_request = match credentials {
                    Some(RegistryCredentials::IdentityToken(token)) => {
                        query.extend([
                            ("grant_type", "refresh_token"),
                            ("refresh_token", token),
                            ("client_id", "ferry"),
                        ]);
                        let form: Vec<String> =
                            query.iter().map(|(n, v)| format!("{n}={}", encode_uri(v, false))).collect();
                        Request::builder()
                            .method(Method::POST)
                            .uri(realm.as_str())
                            .header("content-type", "application/x-www-form-urlencoded")
                            .body(Full::new(Bytes::from(form.join("&"))))
                    }
                    other => {
                        let pairs: Vec<String> =
                            query.iter().map(|(n, v)| format!("{n}={}", encode_uri(v, false))).collect();
                        let separator = if realm.contains('?') { '&' } else { '?' };
                        let mut request = Request::builder()
                            .method(Method::GET)
                            .uri(format!("{realm}{separator}{}", pairs.join("&")));
                        if let Some(RegistryCredentials::Basic { username, password }) = other {
                            request = request.header("authorization", header_value(&basic(username, password))?);
                        }
                        request.body(Full::new(Bytes::new()))
                    }
                }
                .map_err(|e| StoreError::Rejected { code: "InvalidRequest".into(), message: e.to_string() })?;
                let response = match exchange(&self.client, token_request, self.request_timeout, realm).await? {
                    Ok(response) => response,
                    Err(failed) if matches!(failed.status, 401 | 403) => {
                        return Err(StoreError::AccessDenied {
                            code: "UNAUTHORIZED".into(),
                            message: format!(
                                "the token service of {registry} ({realm}) refused: {}",
                                failed.body.trim()
                            ),
                        });
                    }
                    Err(failed) => return Err(self.classify(&failed, Missing::Artifact)),
                };
                #[derive(Deserialize)]
                struct TokenAnswer {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let body = read_body(response, self.request_timeout, 64 << 10, "a token answer").await?;
                let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| StoreError::Rejected {
                    code: "InvalidTokenResponse".into(),
                    message: format!("the token service of {registry} answered no token: {e}"),
                })?;
                let token = answer.token.or(answer.access_token).ok_or_else(|| StoreError::Rejected {
                    code: "InvalidTokenResponse".into(),
                    message: format!("the token service of {registry} answered no token"),
                })?;
                Ok(format!("Bearer {token}"))
            }
        }
    }

    /// The manifest, fetched and checked once.
    async fn artifact(&self) -> Result<&Artifact, StoreError> {
        self.artifact.get_or_try_init(|| self.resolve()).await
    }

    async fn resolve(&self) -> Result<Artifact, StoreError> {
        let path =
            format!("/v2/{}/manifests/{}", self.reference.repository, encode_uri(&self.reference.reference, false));
        let headers = [("accept", MANIFEST_ACCEPT.to_owned())];
        let response = self.get_path(&path, &headers, Missing::Artifact).await?;
        let body = read_body(response, self.request_timeout, MANIFEST_LIMIT, "a manifest").await?;
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        if self.reference.is_digest() && digest != self.reference.reference {
            return Err(StoreError::transient(
                RetryReason::ChecksumMismatch,
                format!("the manifest of {} has digest {digest}", self.reference),
            ));
        }
        let document: ManifestDocument = serde_json::from_slice(&body).map_err(|e| StoreError::Rejected {
            code: "InvalidManifest".into(),
            message: format!("{} is not an image manifest: {e}", self.reference),
        })?;
        if document.manifests.is_some()
            || document.media_type.as_deref().is_some_and(|t| t.contains("index") || t.contains("list"))
        {
            return Err(StoreError::Rejected {
                code: "ManifestIsAnIndex".into(),
                message: format!(
                    "{} is an index of manifests (one per platform); name one of them by digest (REPOSITORY@sha256:…)",
                    self.reference
                ),
            });
        }
        let mut layers = BTreeMap::new();
        let mut unnamed = 0;
        for layer in document.layers {
            let Some(key) = TITLE_ANNOTATIONS.iter().find_map(|a| layer.annotations.get(*a)) else {
                unnamed += 1;
                continue;
            };
            if layer.annotations.get(UNPACK_ANNOTATION).is_some_and(|v| v == "true") {
                return Err(StoreError::Rejected {
                    code: "UnsupportedLayer".into(),
                    message: format!(
                        "layer '{key}' of {} is a directory packed into one archive (oras push DIR); Ferry copies files and does not unpack archives: push the directory's files (oras push DIR/*)",
                        self.reference
                    ),
                });
            }
            let previous = layers.insert(key.clone(), Layer { digest: layer.digest, size: layer.size });
            if previous.is_some() {
                return Err(StoreError::Rejected {
                    code: "InvalidManifest".into(),
                    message: format!("{} names two layers '{key}'", self.reference),
                });
            }
        }
        if unnamed > 0 {
            tracing::warn!(reference = %self.reference, unnamed, "skipping layers without a file name (no title annotation)");
        }
        tracing::debug!(reference = %self.reference, %digest, layers = layers.len(), "resolved the manifest");
        Ok(Artifact { layers })
    }

    /// The layer a key names.
    async fn layer(&self, key: &str) -> Result<Layer, StoreError> {
        self.artifact().await?.layers.get(key).cloned().ok_or(StoreError::NotFound)
    }

    /// Maps an error response to the engine's categories; a 404 means what
    /// was `missing`.
    fn classify(&self, failed: &Failed, missing: Missing) -> StoreError {
        let (code, message) = registry_error(&failed.body);
        let message = if message.is_empty() { format!("HTTP {}", failed.status) } else { message };
        match failed.status {
            404 => match missing {
                Missing::Artifact => StoreError::NoSuchBucket { bucket: self.reference.to_string() },
                Missing::Blob => StoreError::NotFound,
            },
            401 | 403 => StoreError::AccessDenied { code, message },
            429 => StoreError::transient(RetryReason::Throttled, message),
            500..=599 => StoreError::transient(RetryReason::ServerError, format!("{code}: {message}")),
            status => StoreError::Rejected { code: if code.is_empty() { status.to_string() } else { code }, message },
        }
    }

    fn read_only(&self) -> StoreError {
        StoreError::Rejected {
            code: "ReadOnlyStore".into(),
            message: format!(
                "oci://{} is a source only: Ferry pulls OCI artifacts but does not push them",
                self.reference
            ),
        }
    }
}

/// The first error of a registry's `{"errors": [{"code", "message"}]}`.
fn registry_error(body: &str) -> (String, String) {
    #[derive(Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Vec<RegistryError>,
    }
    #[derive(Deserialize)]
    struct RegistryError {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    serde_json::from_str::<Errors>(body)
        .ok()
        .and_then(|e| e.errors.into_iter().next())
        .map(|e| (e.code, e.message))
        .unwrap_or_default()
}

/// What a layer is verified against: its digest, when it is a SHA-256.
fn layer_integrity(digest: &str) -> Option<Integrity> {
    let bytes = hex::decode(digest.strip_prefix("sha256:")?).ok()?;
    Some(Integrity::Whole(StoredChecksum::Sha256(bytes.try_into().ok()?)))
}

#[async_trait]
impl ObjectStore for OciStore {
    fn describe(&self) -> String {
        format!("oci://{}", self.reference)
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let _ = token;
        let objects = self
            .artifact()
            .await?
            .layers
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(key, layer)| ObjectMeta {
                key: key.clone(),
                size: layer.size,
                etag: Some(layer.digest.clone()),
                last_modified: None,
            })
            .collect();
        Ok(ListPage { objects, next: None })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let layer = self.layer(key).await?;
        let integrity = layer_integrity(&layer.digest);
        let meta = ObjectMeta { key: key.to_owned(), size: layer.size, etag: Some(layer.digest), last_modified: None };
        Ok((meta, integrity))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let layer = self.layer(key).await?;
        if if_match.is_some_and(|etag| etag != layer.digest) {
            return Err(StoreError::Changed);
        }
        let mut headers = Vec::with_capacity(1);
        if let Some(range) = &range {
            headers.push(("range", range_header(range)));
        }
        let path = format!("/v2/{}/blobs/{}", self.reference.repository, layer.digest);
        let response = self.get_path(&path, &headers, Missing::Blob).await?;
        if let Some(range) = &range {
            check_range(&response, range, key)?;
        }
        let checksum = if range.is_some() { None } else { layer_integrity(&layer.digest) };
        let content_length = content_length(response.headers());
        Ok(GetResponse { content_length, etag: Some(layer.digest), checksum, body: body_stream(response) })
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
    fn references_parse_as_docker_writes_them() {
        let parsed: Reference = "registry.example/models/llama3:v1".parse().unwrap();
        assert_eq!(
            (parsed.registry.as_str(), parsed.repository.as_str(), parsed.reference.as_str()),
            ("registry.example", "models/llama3", "v1")
        );
        let local: Reference = "127.0.0.1:5000/demo".parse().unwrap();
        assert_eq!((local.registry.as_str(), local.reference.as_str()), ("127.0.0.1:5000", "latest"));
        let digest = format!("sha256:{}", "ab".repeat(32));
        let pinned: Reference = format!("r.example/m@{digest}").parse().unwrap();
        assert!(pinned.is_digest());
        assert_eq!(pinned.to_string(), format!("r.example/m@{digest}"));
        assert_eq!(parsed.to_string(), "registry.example/models/llama3:v1");
        for bad in ["registry.example", "r.example/Models:v1", "r.example/m@sha256:abc", "r.example/m:", "r.example//m"]
        {
            assert!(bad.parse::<Reference>().is_err(), "{bad}");
        }
    }

    #[test]
    fn challenges_are_read_with_their_parameters() {
        assert_eq!(Challenge::parse("Basic realm=\"ferry\""), Some(Challenge::Basic));
        let bearer =
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull""#;
        assert_eq!(
            Challenge::parse(bearer),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(
            Challenge::parse("Bearer realm=\"https://t.example/\""),
            Some(Challenge::Bearer { realm: "https://t.example/".into(), service: None, scope: None })
        );
        assert_eq!(Challenge::parse("Negotiate"), None);
        assert_eq!(Challenge::parse("Bearer service=\"x\""), None, "a Bearer challenge names its realm");
    }

    #[test]
    fn docker_configs_give_credentials_by_host() {
        let auth = BASE64.encode("ferry:s3cret:with-colon");
        let text = format!(
            r#"{{"auths": {{"https://r.example/v1/": {{"auth": "{auth}"}}, "t.example": {{"identitytoken": "refresh"}},
               "u.example": {{"username": "u", "password": "p"}}, "bad.example": {{"auth": "%%%"}}}}, "credsStore": "desktop"}}"#
        );
        let basic = |u: &str, p: &str| Some(RegistryCredentials::Basic { username: u.into(), password: p.into() });
        assert_eq!(RegistryCredentials::from_config_text(&text, "r.example"), Ok(basic("ferry", "s3cret:with-colon")));
        assert_eq!(
            RegistryCredentials::from_config_text(&text, "t.example"),
            Ok(Some(RegistryCredentials::IdentityToken("refresh".into())))
        );
        assert_eq!(RegistryCredentials::from_config_text(&text, "u.example"), Ok(basic("u", "p")));
        assert_eq!(RegistryCredentials::from_config_text(&text, "other.example"), Ok(None));
        assert!(RegistryCredentials::from_config_text(&text, "bad.example").unwrap_err().contains("not base64"));
        assert!(RegistryCredentials::from_config_text("not json", "r.example").is_err());
        assert_eq!(format!("{:?}", basic("ferry", "s3cret")), "Some(Basic(ferry))", "never the password");
    }

    #[test]
    fn registry_errors_and_layer_digests_are_read() {
        let body = r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":"unknown tag=v9"}]}"#;
        assert_eq!(registry_error(body), ("MANIFEST_UNKNOWN".into(), "manifest unknown".into()));
        assert_eq!(registry_error("not json"), (String::new(), String::new()));
        let digest = format!("sha256:{}", "0f".repeat(32));
        assert_eq!(layer_integrity(&digest), Some(Integrity::Whole(StoredChecksum::Sha256([0x0f; 32]))));
        assert_eq!(layer_integrity("sha512:00"), None);
    }
}
