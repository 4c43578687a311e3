//! fake-gcs-server, the GCS emulator, for the stager's `gs://` tests, and
//! [`Store`]: one handle over every backend so a test can be written once
//! and run against each (the conformance suite).

use std::process::{Child, Command};

use crate::{AzuriteServer, HubServer, RegistryServer, S3Server, free_port, log_tail, tool_path, wait_until_ready};

/// A running fake-gcs-server (in-memory backend), stopped on drop.
#[derive(Debug)]
pub struct GcsServer {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub endpoint: String,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl GcsServer {
    /// Starts the pinned fake-gcs-server on a free loopback port.
    pub fn start() -> Self {
        let binary = tool_path("fake-gcs-server");
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = Command::new(binary)
            .args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string(), "-backend", "memory"])
            // Upload sessions must point back at this address, not the real service.
            .args(["-public-host", &format!("127.0.0.1:{port}"), "-external-url", &endpoint])
            .args(["-log-level", "warn"])
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start fake-gcs-server");
        let mut server = Self { child, endpoint, dir, http: reqwest::Client::new() };
        let log = server.dir.path().join("server.log");
        let ready = |status| status == Some(200);
        wait_until_ready(&mut server.child, "fake-gcs-server", port, "/storage/v1/b", ready, || log_tail(&log));
        server
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join("server.log"))
    }

    /// Creates a bucket.
    pub async fn create_bucket(&self, name: &str) {
        let response = self
            .http
            .post(format!("{}/storage/v1/b", self.endpoint))
            .json(&serde_json::json!({"name": name}))
            .send()
            .await
            .expect("create bucket");
        assert!(response.status().is_success(), "create bucket {name}: {}", response.status());
    }

    /// Uploads one object in one request.
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) {
        let response = self
            .http
            .post(format!("{}/upload/storage/v1/b/{bucket}/o", self.endpoint))
            .query(&[("uploadType", "media"), ("name", key)])
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        assert!(response.status().is_success(), "put {key}: {}", response.status());
    }

    /// Reads one object.
    pub async fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let response = self
            .http
            .get(format!("{}/storage/v1/b/{bucket}/o/{}", self.endpoint, encode(key)))
            .query(&[("alt", "media")])
            .send()
            .await
            .expect("get object");
        assert!(response.status().is_success(), "get {key}: {}", response.status());
        response.bytes().await.expect("read body").to_vec()
    }

    /// Every key and size under `prefix`.
    pub async fn list(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        let objects = self.list_objects(bucket, prefix).await;
        objects
            .iter()
            .map(|object| (object["name"].as_str().unwrap_or_default().to_owned(), object_size(object)))
            .collect()
    }

    /// The parts of composite uploads not yet composed (objects
    /// `.ferry-uploads/<id>/<number>`), each with the key its custom
    /// metadata names and its size.
    pub async fn upload_parts(&self, bucket: &str) -> Vec<(String, u64)> {
        let objects = self.list_objects(bucket, ".ferry-uploads/").await;
        objects
            .iter()
            .filter(|object| {
                // Intermediate compose results are not parts.
                let last = object["name"].as_str().and_then(|name| name.rsplit('/').next()).unwrap_or_default();
                !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit())
            })
            .map(|object| {
                let key = object["metadata"]["ferry-upload-key"].as_str().unwrap_or_default();
                (key.to_owned(), object_size(object))
            })
            .collect()
    }

    /// The JSON API's object resources under `prefix`, every page.
    async fn list_objects(&self, bucket: &str, prefix: &str) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("prefix", prefix.to_owned())];
            if let Some(token) = &token {
                query.push(("pageToken", token.clone()));
            }
            let mut page: serde_json::Value = self
                .http
                .get(format!("{}/storage/v1/b/{bucket}/o", self.endpoint))
                .query(&query)
                .send()
                .await
                .expect("list")
                .json()
                .await
                .expect("list answer");
            if let Some(items) = page["items"].as_array_mut() {
                out.append(items);
            }
            match page["nextPageToken"].as_str().filter(|t| !t.is_empty()) {
                Some(next) => token = Some(next.to_owned()),
                None => return out,
            }
        }
    }

    /// Environment for a stager that should talk to this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("FERRY_ENDPOINT_URL", self.endpoint.clone()), ("FERRY_ANONYMOUS", "true".into())]
    }
}

/// An object resource's size (the JSON API writes it as a string).
fn object_size(object: &serde_json::Value) -> u64 {
    object["size"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

impl Drop for GcsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn encode(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The backends of the conformance suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// MinIO through `s3://`.
    Minio,
    /// fake-gcs-server through `gs://`.
    FakeGcs,
    /// Azurite through `az://`.
    Azurite,
    /// The distribution registry through `oci://`: read only, and an
    /// artifact has no prefixes, so only pull tests on a whole bucket run
    /// against it (a bucket is a repository, its objects the layers of the
    /// tag `latest`).
    Registry,
    /// olah, a self-hosted Hugging Face Hub, through `hf://`: read only;
    /// a bucket is a repository (`ferry/BUCKET`), a prefix a directory in it.
    Hub,
}

/// A running store of either backend, with the same test-side operations.
#[derive(Debug)]
pub enum Store {
    /// An S3-compatible server.
    S3(S3Server),
    /// A GCS emulator.
    Gcs(GcsServer),
    /// An Azure Blob emulator.
    Azure(AzuriteServer),
    /// An OCI registry.
    Registry(RegistryServer),
    /// A Hugging Face Hub (boxed: it holds a MinIO and a front beside olah).
    Hub(Box<HubServer>),
}

/// The tag a [`Store::Registry`] bucket's objects are layers of.
const TAG: &str = "latest";

impl Store {
    /// Starts a fresh server of `backend`.
    pub fn start(backend: Backend) -> Self {
        match backend {
            Backend::Minio => Store::S3(S3Server::minio()),
            Backend::FakeGcs => Store::Gcs(GcsServer::start()),
            Backend::Azurite => Store::Azure(AzuriteServer::start()),
            Backend::Registry => Store::Registry(RegistryServer::start()),
            Backend::Hub => Store::Hub(Box::new(HubServer::start())),
        }
    }

    /// `s3://PATH`, `gs://PATH` or `az://PATH`; for a registry, the
    /// artifact `oci://HOST/PATH:latest` (a path with a prefix names
    /// another repository, not a part of one).
    pub fn uri(&self, path: &str) -> String {
        let scheme = match self {
            Store::S3(_) => ferry_contract::Scheme::S3,
            Store::Gcs(_) => ferry_contract::Scheme::Gcs,
            Store::Azure(_) => ferry_contract::Scheme::Azure,
            Store::Registry(r) => {
                return format!("{}://{}/{}:{TAG}", ferry_contract::Scheme::Oci, r.host, path.trim_end_matches('/'));
            }
            Store::Hub(_) => return format!("{}://{}/{path}", ferry_contract::Scheme::Hf, crate::HUB_ORG),
        };
        format!("{scheme}://{path}")
    }

    /// Creates a bucket.
    pub async fn create_bucket(&self, name: &str) {
        match self {
            Store::S3(s) => s.create_bucket(name).await,
            Store::Gcs(g) => g.create_bucket(name).await,
            Store::Azure(a) => a.create_container(name).await,
            // A repository comes into being with its first artifact.
            Store::Registry(_) => {}
            Store::Hub(h) => h.create_repo(name),
        }
    }

    /// Uploads one object (not through the code under test).
    pub async fn put(&self, bucket: &str, key: &str, body: Vec<u8>) {
        match self {
            Store::S3(s) => s.put(bucket, key, body).await,
            Store::Gcs(g) => g.put(bucket, key, body).await,
            Store::Azure(a) => a.put(bucket, key, body).await,
            Store::Registry(r) => drop(r.put(bucket, TAG, key, body).await),
            Store::Hub(h) => h.put(bucket, key, body).await,
        }
    }

    /// Reads one object.
    pub async fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        match self {
            Store::S3(s) => s.get(bucket, key).await,
            Store::Gcs(g) => g.get(bucket, key).await,
            Store::Azure(a) => a.get(bucket, key).await,
            Store::Registry(r) => r.get(bucket, TAG, key).await,
            Store::Hub(h) => h.get(bucket, key).await,
        }
    }

    /// Every key and size under `prefix`.
    pub async fn list(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        match self {
            Store::S3(s) => s.list(bucket, prefix).await,
            Store::Gcs(g) => g.list(bucket, prefix).await,
            Store::Azure(a) => a.list(bucket, prefix).await,
            Store::Registry(r) => {
                r.list(bucket, TAG).await.into_iter().filter(|(key, _)| key.starts_with(prefix)).collect()
            }
            Store::Hub(h) => h.list(bucket, prefix),
        }
    }

    /// Environment for a stager that should talk to this store.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::S3(s) => s.env(),
            Store::Gcs(g) => g.env(),
            Store::Azure(a) => a.env(),
            Store::Registry(r) => r.env(),
            Store::Hub(h) => h.env(),
        }
    }
}
