//! The distribution project's registry, for the stager's `oci://` tests,
//! with Basic auth (htpasswd) so that credentials are checked. Test-side
//! writes are the distribution API's own requests (a blob uploaded in one
//! go, the manifest rewritten with one more layer), independent of the
//! code under test; `oras` pushes where a test wants the common client's
//! artifacts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest as _, Sha256};

use crate::{free_port, log_tail, tool_path, wait_until_ready};

/// The user the test registry admits.
pub const REGISTRY_USER: &str = "ferry";
/// Its password.
pub const REGISTRY_PASSWORD: &str = "ferry-test-password";
/// `REGISTRY_PASSWORD`'s bcrypt hash (cost 4), as htpasswd holds it.
const REGISTRY_PASSWORD_BCRYPT: &str = "$2b$04$dUpvo8IiHmx3O1hFW2P8PuzjEpPX2FxQA11eSmSoj9JP.n9iDzfBm";

/// The media type of an OCI image manifest.
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A running registry, stopped on drop.
#[derive(Debug)]
pub struct RegistryServer {
    child: Child,
    /// `127.0.0.1:PORT`, as references name the registry.
    pub host: String,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl RegistryServer {
    /// Starts the pinned registry on a free loopback port, storing in a
    /// temporary directory, admitting [`REGISTRY_USER`].
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        std::fs::write(dir.path().join("htpasswd"), format!("{REGISTRY_USER}:{REGISTRY_PASSWORD_BCRYPT}\n"))
            .expect("htpasswd");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {host}\nauth:\n  htpasswd:\n    realm: ferry-test\n    path: {}\n",
            dir.path().join("data").display(),
            dir.path().join("htpasswd").display(),
        );
        std::fs::write(dir.path().join("config.yml"), config).expect("config");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let child = Command::new(tool_path("registry"))
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            // Tracing would reach for an OpenTelemetry collector.
            .env("OTEL_TRACES_EXPORTER", "none")
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start registry");
        let mut server = Self { child, endpoint: format!("http://{host}"), host, dir, http: reqwest::Client::new() };
        let docker = server.docker_config();
        std::fs::create_dir_all(&docker).expect("docker config dir");
        let auth = BASE64.encode(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
        let config = serde_json::json!({"auths": {server.host.clone(): {"auth": auth}}});
        std::fs::write(docker.join("config.json"), config.to_string()).expect("docker config");
        let log = server.dir.path().join("server.log");
        // 401: it listens, and asks for credentials.
        wait_until_ready(&mut server.child, "registry", port, "/v2/", |s| s.is_some(), || log_tail(&log));
        server
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join("server.log"))
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.http.request(method, url).basic_auth(REGISTRY_USER, Some(REGISTRY_PASSWORD))
    }

    /// Uploads a blob in one request; returns its digest.
    async fn upload_blob(&self, repository: &str, data: Vec<u8>) -> String {
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&data)));
        let started = self
            .request(reqwest::Method::POST, &format!("{}/v2/{repository}/blobs/uploads/", self.endpoint))
            .send()
            .await
            .expect("start upload");
        assert_eq!(started.status(), 202, "start upload to {repository}: {}", started.text().await.unwrap_or_default());
        let location = started.headers()["location"].to_str().unwrap().to_owned();
        let url = if location.starts_with('/') { format!("{}{location}", self.endpoint) } else { location };
        let separator = if url.contains('?') { '&' } else { '?' };
        let finished = self
            .request(reqwest::Method::PUT, &format!("{url}{separator}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .body(data)
            .send()
            .await
            .expect("finish upload");
        assert_eq!(finished.status(), 201, "upload to {repository}: {}", finished.text().await.unwrap_or_default());
        digest
    }

    /// The manifest `reference` names, when there is one.
    pub async fn manifest(&self, repository: &str, reference: &str) -> Option<serde_json::Value> {
        let response = self
            .request(reqwest::Method::GET, &format!("{}/v2/{repository}/manifests/{reference}", self.endpoint))
            .header("accept", MANIFEST)
            .send()
            .await
            .expect("get manifest");
        if response.status() == 404 {
            return None;
        }
        assert!(response.status().is_success(), "manifest {repository}:{reference}: {}", response.status());
        Some(response.json().await.expect("a manifest"))
    }

    /// The digest of the manifest `reference` names.
    pub async fn manifest_digest(&self, repository: &str, reference: &str) -> String {
        let response = self
            .request(reqwest::Method::HEAD, &format!("{}/v2/{repository}/manifests/{reference}", self.endpoint))
            .header("accept", MANIFEST)
            .send()
            .await
            .expect("head manifest");
        assert!(response.status().is_success(), "manifest {repository}:{reference}: {}", response.status());
        response.headers()["docker-content-digest"].to_str().unwrap().to_owned()
    }

    /// Writes `manifest` as `repository:tag`; returns its digest.
    async fn put_manifest(&self, repository: &str, tag: &str, manifest: &serde_json::Value) -> String {
        let body = serde_json::to_vec(manifest).unwrap();
        let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
        let response = self
            .request(reqwest::Method::PUT, &format!("{}/v2/{repository}/manifests/{tag}", self.endpoint))
            .header("content-type", MANIFEST)
            .body(body)
            .send()
            .await
            .expect("put manifest");
        assert_eq!(
            response.status(),
            201,
            "manifest {repository}:{tag}: {}",
            response.text().await.unwrap_or_default()
        );
        digest
    }

    /// Adds (or replaces) the layer titled `title` in `repository:tag`,
    /// creating the artifact when it does not exist; returns the new
    /// manifest's digest. The tag moves to the new manifest, as a push does.
    pub async fn put(&self, repository: &str, tag: &str, title: &str, data: Vec<u8>) -> String {
        let size = data.len();
        let digest = self.upload_blob(repository, data).await;
        let mut manifest = match self.manifest(repository, tag).await {
            Some(manifest) => manifest,
            None => {
                let config = self.upload_blob(repository, b"{}".to_vec()).await;
                serde_json::json!({
                    "schemaVersion": 2,
                    "mediaType": MANIFEST,
                    "artifactType": "application/vnd.ferry.test.v1",
                    "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config, "size": 2},
                    "layers": [],
                })
            }
        };
        let layers = manifest["layers"].as_array_mut().expect("layers");
        layers.retain(|layer| layer["annotations"]["org.opencontainers.image.title"] != title);
        layers.push(serde_json::json!({
            "mediaType": "application/octet-stream",
            "digest": digest,
            "size": size,
            "annotations": {"org.opencontainers.image.title": title},
        }));
        self.put_manifest(repository, tag, &manifest).await
    }

    /// Reads the layer titled `title` of `repository:tag`.
    pub async fn get(&self, repository: &str, tag: &str, title: &str) -> Vec<u8> {
        let manifest = self.manifest(repository, tag).await.unwrap_or_else(|| panic!("no {repository}:{tag}"));
        let layer = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|layer| layer["annotations"]["org.opencontainers.image.title"] == title)
            .unwrap_or_else(|| panic!("no layer {title} in {repository}:{tag}"))
            .clone();
        let url = format!("{}/v2/{repository}/blobs/{}", self.endpoint, layer["digest"].as_str().unwrap());
        let response = self.request(reqwest::Method::GET, &url).send().await.expect("get blob");
        assert!(response.status().is_success(), "blob of {title}: {}", response.status());
        response.bytes().await.unwrap().to_vec()
    }

    /// Every layer's title and size in `repository:tag`.
    pub async fn list(&self, repository: &str, tag: &str) -> Vec<(String, u64)> {
        let Some(manifest) = self.manifest(repository, tag).await else { return Vec::new() };
        let mut layers: Vec<(String, u64)> = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["annotations"]["org.opencontainers.image.title"].as_str().unwrap().to_owned(),
                    l["size"].as_u64().unwrap(),
                )
            })
            .collect();
        layers.sort();
        layers
    }

    /// Pushes the files under `dir` (relative paths) as `reference` with
    /// `oras push`, the common client; returns oras's output.
    pub fn oras_push(&self, reference: &str, dir: &Path, files: &[&str]) -> String {
        let output = Command::new(tool_path("oras"))
            .current_dir(dir)
            .args(["push", "--plain-http", "--disable-path-validation", "-u", REGISTRY_USER, "-p", REGISTRY_PASSWORD])
            .arg(format!("{}/{reference}", self.host))
            .args(files)
            .output()
            .expect("run oras");
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "oras push {reference}: {text}");
        text
    }

    /// A Docker config directory holding this registry's credentials, as
    /// `DOCKER_CONFIG` names it (written at start).
    pub fn docker_config(&self) -> PathBuf {
        self.dir.path().join("docker")
    }

    /// `.dockerconfigjson` of a `kubernetes.io/dockerconfigjson` Secret for
    /// this registry.
    pub fn docker_config_json(&self) -> String {
        std::fs::read_to_string(self.docker_config().join("config.json")).expect("docker config")
    }

    /// Environment for a stager that should talk to this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("FERRY_ENDPOINT_URL", self.endpoint.clone()),
            ("DOCKER_CONFIG", self.docker_config().display().to_string()),
        ]
    }
}

impl Drop for RegistryServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
