//! Azurite, the Azure Blob Storage emulator, for the stager's `az://`
//! tests. Test-side requests (create a container, put and read a blob) are
//! plain HTTP of their own, signed with the store's Shared Key signer,
//! which Azurite checks.
//!
//! [`AzuriteServer::start_entra`] serves HTTPS and checks bearer tokens
//! (`--oauth basic`: audience, issuer and lifetime; Azurite takes a bearer
//! over HTTPS only), for Entra ID credentials; [`EntraServer`] issues them.

use std::path::PathBuf;
use std::process::{Child, Command};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::{free_port, log_tail, tool_path, wait_until_ready};

/// Azurite's development account (public, the same in every Azurite).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// The development account's key (public, the same in every Azurite).
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// A running Azurite blob service, stopped on drop.
#[derive(Debug)]
pub struct AzuriteServer {
    child: Child,
    /// `http://127.0.0.1:PORT/devstoreaccount1`: the account's endpoint
    /// (`https://` from [`AzuriteServer::start_entra`]).
    pub endpoint: String,
    /// The CA that signed the server's certificate, when it serves HTTPS.
    pub ca_file: Option<PathBuf>,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl AzuriteServer {
    /// Starts the pinned Azurite on a free loopback port, storing in a
    /// temporary directory.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts Azurite over HTTPS (a certificate for 127.0.0.1 from a test
    /// CA, [`AzuriteServer::ca_file`]) that also takes Entra ID bearer
    /// tokens, checking their audience, issuer and lifetime (not their
    /// signature: it has no tenant's keys).
    pub fn start_entra() -> Self {
        Self::start_with(true)
    }

    fn start_with(entra: bool) -> Self {
        let binary = tool_path("azurite-blob");
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let data = dir.path().join("data");
        let mut command = Command::new(binary);
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(&data)
            // Telemetry would reach for Azure Monitor, and keeps the
            // process alive past its first SIGTERM.
            .args(["--skipApiVersionCheck", "--loose", "--disableTelemetry", "--silent"]);
        let ca_file = entra.then(|| {
            let certs = dir.path().join("certs");
            std::fs::create_dir(&certs).expect("certs dir");
            let ca_file = crate::write_test_certificates(&certs, &[]);
            command.arg("--cert").arg(certs.join("public.crt")).arg("--key").arg(certs.join("private.key"));
            command.args(["--oauth", "basic"]);
            ca_file
        });
        let child = command.stdout(log.try_clone().expect("dup log")).stderr(log).spawn().expect("start azurite-blob");
        let scheme = if entra { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{port}/{AZURITE_ACCOUNT}");
        let mut http = reqwest::Client::builder();
        if let Some(ca_file) = &ca_file {
            let pem = std::fs::read(ca_file).expect("read the test CA");
            http = http.add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("the test CA is PEM"));
        }
        let http = http.build().expect("an HTTP client");
        let mut server = Self { child, endpoint, ca_file, dir, http };
        let log = server.dir.path().join("server.log");
        if let Some(ca_file) = &server.ca_file {
            let ca_pem = std::fs::read(ca_file).expect("read the test CA");
            let url = format!("{}?comp=list", server.endpoint);
            crate::wait_until_serving_https(&mut server.child, "azurite-blob", &url, &ca_pem, || log_tail(&log));
        } else {
            // Any answer (an unauthenticated request is refused) means it listens.
            let path = format!("/{AZURITE_ACCOUNT}?comp=list");
            wait_until_ready(&mut server.child, "azurite-blob", port, &path, |s| s.is_some(), || log_tail(&log));
        }
        server
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join("server.log"))
    }

    /// A signed request to `path` under the account (`/CONTAINER[/KEY]`,
    /// already percent-encoded) with unencoded `query` parameters.
    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&'static str, String)],
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        let mut all = ferry_store::azure::standard_headers();
        all.extend(headers.iter().cloned());
        if !body.is_empty() || method == reqwest::Method::PUT {
            all.push(("content-length", body.len().to_string()));
        }
        let key = BASE64.decode(AZURITE_KEY).expect("the development key is base64");
        let authorization = ferry_store::azure::shared_key_authorization(
            &key,
            method.as_str(),
            AZURITE_ACCOUNT,
            &format!("/{AZURITE_ACCOUNT}{path}"),
            query,
            &all,
        );
        let mut request = self.http.request(method, format!("{}{path}", self.endpoint)).query(query).body(body);
        for (name, value) in all {
            request = request.header(name, value);
        }
        request.header("authorization", authorization)
    }

    /// Creates a container.
    pub async fn create_container(&self, name: &str) {
        let response = self
            .request(reqwest::Method::PUT, &format!("/{name}"), &[("restype", "container")], &[], Vec::new())
            .send()
            .await
            .expect("create container");
        assert!(response.status().is_success(), "create container {name}: {}", response.status());
    }

    /// Writes one blob in one request.
    pub async fn put(&self, container: &str, key: &str, body: Vec<u8>) {
        let path = blob_path(container, key);
        let response = self
            .request(reqwest::Method::PUT, &path, &[], &[("x-ms-blob-type", "BlockBlob".to_owned())], body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e}"));
        assert!(response.status().is_success(), "put {key}: {}", response.status());
    }

    /// Reads one blob.
    pub async fn get(&self, container: &str, key: &str) -> Vec<u8> {
        let path = blob_path(container, key);
        let response = self.request(reqwest::Method::GET, &path, &[], &[], Vec::new()).send().await.expect("get blob");
        assert!(response.status().is_success(), "get {key}: {}", response.status());
        response.bytes().await.expect("read body").to_vec()
    }

    /// Deletes one blob.
    pub async fn delete(&self, container: &str, key: &str) {
        let path = blob_path(container, key);
        let response = self.request(reqwest::Method::DELETE, &path, &[], &[], Vec::new()).send().await.expect("delete");
        assert!(response.status().is_success(), "delete {key}: {}", response.status());
    }

    /// Every committed blob's name and size under `prefix`.
    pub async fn list(&self, container: &str, prefix: &str) -> Vec<(String, u64)> {
        self.list_blobs(container, prefix, &[]).await.into_iter().map(|blob| (blob.name, blob.size)).collect()
    }

    /// The blobs under `prefix` with blocks uploaded but not committed:
    /// uploads in flight or left by a killed writer.
    pub async fn pending_uploads(&self, container: &str, prefix: &str) -> Vec<String> {
        self.uncommitted_bytes(container, prefix).await.into_iter().map(|(blob, _)| blob).collect()
    }

    /// Each blob under `prefix` that has uncommitted blocks, with their
    /// bytes: what a killed writer left for a re-run to keep.
    pub async fn uncommitted_bytes(&self, container: &str, prefix: &str) -> Vec<(String, u64)> {
        let mut pending = Vec::new();
        for blob in self.list_blobs(container, prefix, &[("include", "uncommittedblobs")]).await {
            let query = [("comp", "blocklist"), ("blocklisttype", "uncommitted")];
            let response = self
                .request(reqwest::Method::GET, &blob_path(container, &blob.name), &query, &[], Vec::new())
                .send()
                .await
                .expect("get block list");
            assert!(response.status().is_success(), "block list of {}: {}", blob.name, response.status());
            let text = response.text().await.expect("block list");
            let blocks: Vec<&str> = text.split("<Block>").skip(1).collect();
            if !blocks.is_empty() {
                let bytes = blocks.iter().filter_map(|b| between(b, "<Size>", "</Size>")?.parse::<u64>().ok()).sum();
                pending.push((blob.name, bytes));
            }
        }
        pending
    }

    /// List Blobs, every page, with extra query parameters.
    async fn list_blobs(&self, container: &str, prefix: &str, extra: &[(&str, &str)]) -> Vec<Blob> {
        let mut blobs = Vec::new();
        let mut marker = String::new();
        loop {
            let mut query = vec![("restype", "container"), ("comp", "list"), ("prefix", prefix)];
            query.extend_from_slice(extra);
            if !marker.is_empty() {
                query.push(("marker", &marker));
            }
            let response = self
                .request(reqwest::Method::GET, &format!("/{container}"), &query, &[], Vec::new())
                .send()
                .await
                .expect("list blobs");
            assert!(response.status().is_success(), "list {container}: {}", response.status());
            let text = response.text().await.expect("listing");
            for blob in text.split("<Blob>").skip(1) {
                let name = unescape(between(blob, "<Name>", "</Name>").unwrap_or_default());
                let size = between(blob, "<Content-Length>", "</Content-Length>").and_then(|s| s.parse().ok());
                blobs.push(Blob { name, size: size.unwrap_or(0) });
            }
            match between(&text, "<NextMarker>", "</NextMarker>").filter(|m| !m.is_empty()) {
                Some(next) => marker = next.to_owned(),
                None => return blobs,
            }
        }
    }

    /// Environment for a stager that should talk to this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("FERRY_ENDPOINT_URL", self.endpoint.clone()),
            ("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT.to_owned()),
            ("AZURE_STORAGE_KEY", AZURITE_KEY.to_owned()),
        ]
    }
}

/// A listed blob.
struct Blob {
    name: String,
    size: u64,
}

/// `/CONTAINER/KEY`, each segment of the key percent-encoded, dots too, so
/// that `..` and `.` reach the server as names instead of being resolved by
/// the URL parser.
fn blob_path(container: &str, key: &str) -> String {
    let segments: Vec<String> = key
        .split('/')
        .map(|segment| match segment {
            "." => "%2E".to_owned(),
            ".." => "%2E%2E".to_owned(),
            other => crate::gcs::encode(other),
        })
        .collect();
    format!("/{container}/{}", segments.join("/"))
}

/// The text between the first `start` and the `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    text[from..].find(end).map(|to| &text[from..from + to])
}

/// XML's five predefined entities, decoded.
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

impl Drop for AzuriteServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
