//! A Hugging Face Hub for the stager's `hf://` tests: olah, a self-hosted
//! Hub, serving git repositories this module writes, behind a front that
//! does what the Hub's edge does and an offline olah does not.
//!
//! olah answers the Hub's API (`revision`, `tree`, `paths-info`) and file
//! routes (`resolve`) from the repositories under its `mirrors-path`,
//! reading LFS files from each repository's `.git/lfs/objects`. Offline it
//! has no access control and ignores `Range`, and it serves every file
//! itself. The Hub does neither: it answers a file kept in LFS with a
//! redirect to its storage, which honours ranges, and it refuses a gated
//! repository without the right token. So the front, a small HTTP proxy on
//! its own port, does those two things and passes everything else to olah
//! unchanged:
//!
//! - a `resolve` of an LFS file gets `302 Found` to the file's object in a
//!   MinIO bucket that anyone may read (the storage, on another host:port,
//!   as the Hub's is), with the headers the Hub sends with it
//!   (`X-Linked-Size`, `X-Linked-Etag`, `X-Repo-Commit`). The storage is
//!   reached through a gate that refuses any request with an
//!   `Authorization` header, as S3 refuses one on a presigned URL ("only
//!   one auth mechanism allowed"), which MinIO on a public bucket does not:
//!   a client that forwarded its Hub token there fails the read;
//! - a repository made gated ([`HubServer::gate`]) answers `401` without a
//!   token and `403` with another one, with the Hub's `X-Error-Code:
//!   GatedRepo`.
//!
//! Repositories are `models/ferry/NAME` (a [`crate::Store`] bucket is one);
//! a file of at least [`LFS_FROM`] bytes, or any `*.safetensors`, is kept in
//! LFS, as the Hub keeps large files; each [`HubServer::put`] is a commit
//! on `main`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest as _;

use crate::{S3Server, free_port, log_tail, tool_path, wait_until_ready};

/// The organisation every test repository belongs to.
pub const HUB_ORG: &str = "ferry";

/// Files at least this large are kept in LFS.
pub const LFS_FROM: usize = 1 << 20;

/// The bucket of the storage that LFS files are redirected to.
const LFS_BUCKET: &str = "lfs";

/// An LFS object: its SHA-256 (hex) and size.
type LfsObject = (String, u64);

/// What an LFS pointer file starts with.
const LFS_POINTER: &str = "version https://git-lfs.github.com/spec/v1\n";

/// A running olah with its front and storage, stopped on drop.
#[derive(Debug)]
pub struct HubServer {
    olah: Child,
    dir: tempfile::TempDir,
    storage: S3Server,
    storage_ready: tokio::sync::OnceCell<()>,
    /// `http://127.0.0.1:PORT` of the gate before the storage.
    storage_gate: String,
    front: Arc<Front>,
    stop: Arc<AtomicBool>,
    /// `http://127.0.0.1:PORT` of the front: the Hub's endpoint.
    pub endpoint: String,
    /// `http://127.0.0.1:PORT` of olah itself, for a client that should see
    /// it without the front.
    pub olah_endpoint: String,
    /// Every file's size by repository, as the test wrote them.
    sizes: Mutex<BTreeMap<String, BTreeMap<String, u64>>>,
}

/// What the front knows and does.
#[derive(Debug)]
struct Front {
    mirrors: PathBuf,
    /// `127.0.0.1:PORT` of olah.
    olah: String,
    /// `http://HOST:PORT` LFS files are redirected to (MinIO, or a proxy before it).
    storage: Mutex<String>,
    /// The token of each gated repository, by `models/ORG/REPO`.
    gated: Mutex<HashMap<String, String>>,
    /// The LFS object of a file at a commit (`None`: kept in git), by
    /// (repository directory, commit, path).
    lfs: Mutex<HashMap<(PathBuf, String, String), Option<LfsObject>>>,
    /// The path of every `resolve` request, in order.
    resolved: Mutex<Vec<String>>,
}

impl HubServer {
    /// Starts olah offline on a free port, MinIO for LFS storage and the
    /// front.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mirrors = dir.path().join("mirrors");
        std::fs::create_dir_all(mirrors.join("models").join(HUB_ORG)).expect("mirrors dir");
        let port = free_port();
        // Offline: every answer from the mirrors, none from an upstream
        // (the upstream named is a closed port, so nothing leaves).
        let config = format!(
            "[basic]\nhost = \"127.0.0.1\"\nport = {port}\nrepos-path = \"{repos}\"\nmirrors-path = [\"{mirrors}\"]\n\
             hf-scheme = \"http\"\nhf-netloc = \"127.0.0.1:9\"\nhf-lfs-netloc = \"127.0.0.1:9\"\n\
             mirror-scheme = \"http\"\nmirror-netloc = \"127.0.0.1:{port}\"\nmirror-lfs-netloc = \"127.0.0.1:{port}\"\n\
             [accessibility]\noffline = true\n",
            repos = dir.path().join("repos").display(),
            mirrors = mirrors.display(),
        );
        std::fs::write(dir.path().join("olah.toml"), config).expect("olah config");
        let log = std::fs::File::create(dir.path().join("server.log")).expect("log file");
        let olah = Command::new(tool_path("olah"))
            .arg("-c")
            .arg(dir.path().join("olah.toml"))
            .arg("--log-path")
            .arg(dir.path().join("logs"))
            .current_dir(dir.path())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("start olah");
        let storage = S3Server::minio();
        let front = Arc::new(Front {
            mirrors,
            olah: format!("127.0.0.1:{port}"),
            storage: Mutex::default(),
            gated: Mutex::default(),
            lfs: Mutex::default(),
            resolved: Mutex::default(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::clone(&front);
        let endpoint = listen(&stop, move |client| serving.serve(client));
        let minio = storage.endpoint.trim_start_matches("http://").to_owned();
        let storage_gate = listen(&stop, move |client| gate_storage(&minio, client));
        *front.storage.lock().unwrap() = storage_gate.clone();
        let mut server = Self {
            olah,
            dir,
            storage,
            storage_ready: tokio::sync::OnceCell::new(),
            storage_gate,
            front,
            stop,
            endpoint,
            olah_endpoint: format!("http://127.0.0.1:{port}"),
            sizes: Mutex::default(),
        };
        let log = server.dir.path().join("server.log");
        // Any answer means it is up (an unknown repository is a 401).
        wait_until_ready(
            &mut server.olah,
            "olah",
            port,
            "/api/models/ferry/none/revision/main",
            |s| s.is_some(),
            || log_tail(&log),
        );
        server
    }

    /// The last lines of olah's log, for failure messages.
    pub fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join("server.log"))
    }

    /// The git repository of `models/ferry/NAME`.
    pub fn repo_dir(&self, name: &str) -> PathBuf {
        self.front.mirrors.join("models").join(HUB_ORG).join(name)
    }

    /// `ferry/NAME`.
    pub fn repo_id(name: &str) -> String {
        format!("{HUB_ORG}/{name}")
    }

    /// Creates `models/ferry/NAME` with one empty commit on `main`, unless it exists.
    pub fn create_repo(&self, name: &str) {
        let dir = self.repo_dir(name);
        if dir.join(".git").exists() {
            return;
        }
        std::fs::create_dir_all(&dir).expect("repository dir");
        git(&dir, &["init", "-q", "-b", "main"]);
        git(&dir, &["commit", "-q", "--allow-empty", "-m", "created"]);
        self.sizes.lock().unwrap().entry(name.to_owned()).or_default();
    }

    /// Writes `key` into repository `name` and commits it on `main`: in
    /// LFS (its object in the repository and in the storage) when large or
    /// a `*.safetensors`, else in git.
    pub async fn put(&self, name: &str, key: &str, body: Vec<u8>) {
        self.write(name, key, body).await;
        git(&self.repo_dir(name), &["commit", "-q", "--allow-empty", "-m", &format!("put {key}")]);
    }

    /// Writes every file of `files` into repository `name`, then commits
    /// them on `main` in one commit (a dataset of many files).
    pub async fn put_all(&self, name: &str, files: impl IntoIterator<Item = (String, Vec<u8>)>) {
        for (key, body) in files {
            self.write(name, &key, body).await;
        }
        git(&self.repo_dir(name), &["commit", "-q", "--allow-empty", "-m", "put files"]);
    }

    /// Writes and stages one file of [`HubServer::put`].
    async fn write(&self, name: &str, key: &str, body: Vec<u8>) {
        self.create_repo(name);
        let dir = self.repo_dir(name);
        let path = dir.join(key);
        let size = body.len() as u64;
        std::fs::create_dir_all(path.parent().expect("a file has a parent")).expect("file's directory");
        if body.len() >= LFS_FROM || key.ends_with(".safetensors") {
            let sha = hex::encode(sha2::Sha256::digest(&body));
            let object = dir.join(".git/lfs/objects").join(&sha[..2]).join(&sha[2..4]).join(&sha);
            std::fs::create_dir_all(object.parent().expect("object dir")).expect("LFS object dir");
            std::fs::write(&object, &body).expect("LFS object");
            std::fs::write(&path, format!("{LFS_POINTER}oid sha256:{sha}\nsize {}\n", body.len())).expect("pointer");
            self.storage_bucket().await;
            self.storage.put(LFS_BUCKET, &sha, body).await;
        } else {
            std::fs::write(&path, &body).expect("file");
        }
        git(&dir, &["add", "--", key]);
        self.sizes.lock().unwrap().entry(name.to_owned()).or_default().insert(key.to_owned(), size);
    }

    /// Removes `key` from repository `name` in a commit on `main`.
    pub fn delete(&self, name: &str, key: &str) {
        git(&self.repo_dir(name), &["rm", "-q", "--", key]);
        git(&self.repo_dir(name), &["commit", "-q", "-m", &format!("delete {key}")]);
        self.sizes.lock().unwrap().entry(name.to_owned()).or_default().remove(key);
    }

    /// Points branch or tag `reference` of repository `name` at `main`'s
    /// commit (a tag is moved if it exists); returns the commit.
    pub fn tag(&self, name: &str, reference: &str) -> String {
        git(&self.repo_dir(name), &["tag", "-f", reference, "main"]);
        self.commit(name, "main")
    }

    /// The commit `revision` of repository `name` names.
    pub fn commit(&self, name: &str, revision: &str) -> String {
        let out = git(&self.repo_dir(name), &["rev-parse", "--verify", &format!("{revision}^{{commit}}")]);
        String::from_utf8(out).expect("utf-8").trim().to_owned()
    }

    /// Reads `key` of repository `name` at `main`, as the test wrote it.
    pub async fn get(&self, name: &str, key: &str) -> Vec<u8> {
        let dir = self.repo_dir(name);
        let blob = git(&dir, &["cat-file", "blob", &format!("main:{key}")]);
        match lfs_pointer(&blob) {
            Some((sha, _)) => std::fs::read(dir.join(".git/lfs/objects").join(&sha[..2]).join(&sha[2..4]).join(&sha))
                .expect("LFS object"),
            None => blob,
        }
    }

    /// Every file and size of repository `name` under `prefix`.
    pub fn list(&self, name: &str, prefix: &str) -> Vec<(String, u64)> {
        let sizes = self.sizes.lock().unwrap();
        let files = sizes.get(name).into_iter().flatten();
        files.filter(|(key, _)| key.starts_with(prefix)).map(|(k, s)| (k.clone(), *s)).collect()
    }

    /// Makes repository `name` gated: readable with `token` only.
    pub fn gate(&self, name: &str, token: &str) {
        let repo = format!("models/{}", Self::repo_id(name));
        self.front.gated.lock().unwrap().insert(repo, token.to_owned());
    }

    /// Where LFS files are redirected to: the gate before MinIO.
    pub fn storage_endpoint(&self) -> String {
        self.storage_gate.clone()
    }

    /// The URL of `data`'s object in the storage (through its gate), as
    /// it is kept in LFS.
    pub fn storage_url_of(&self, data: &[u8]) -> String {
        format!("{}/{LFS_BUCKET}/{}", self.storage_gate, hex::encode(sha2::Sha256::digest(data)))
    }

    /// Redirects LFS reads to `endpoint` instead (a proxy before the storage).
    pub fn redirect_storage_to(&self, endpoint: &str) {
        *self.front.storage.lock().unwrap() = endpoint.trim_end_matches('/').to_owned();
    }

    /// The paths of the `resolve` requests the front saw, in order.
    pub fn resolved(&self) -> Vec<String> {
        self.front.resolved.lock().unwrap().clone()
    }

    /// Environment for a stager that should read this Hub.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("FERRY_ENDPOINT_URL", self.endpoint.clone())]
    }

    /// The storage bucket, made readable by anyone (as the Hub's signed
    /// URLs are to whoever holds them), on first use.
    async fn storage_bucket(&self) {
        self.storage_ready
            .get_or_init(|| async {
                self.storage.create_bucket(LFS_BUCKET).await;
                let policy = format!(
                    r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"AWS":["*"]}},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::{LFS_BUCKET}/*"]}}]}}"#
                );
                self.storage
                    .client()
                    .put_bucket_policy()
                    .bucket(LFS_BUCKET)
                    .policy(policy)
                    .send()
                    .await
                    .expect("make the LFS bucket readable");
            })
            .await;
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for endpoint in [&self.endpoint, &self.storage_gate] {
            let _ = TcpStream::connect(endpoint.trim_start_matches("http://"));
        }
        let _ = self.olah.kill();
        let _ = self.olah.wait();
    }
}

/// Serves each connection to a new loopback port with `serve` on a thread
/// of its own, until `stop`; returns `http://127.0.0.1:PORT`.
fn listen(stop: &Arc<AtomicBool>, serve: impl Fn(TcpStream) -> std::io::Result<()> + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let endpoint = format!("http://{}", listener.local_addr().expect("local address"));
    let (serve, stopped) = (Arc::new(serve), Arc::clone(stop));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            if stopped.load(Ordering::Relaxed) {
                return;
            }
            let Ok(client) = client else { continue };
            let serve = Arc::clone(&serve);
            std::thread::spawn(move || {
                let _ = serve(client);
            });
        }
    });
    endpoint
}

/// The storage's gate: refuses a request that carries credentials of its
/// own, passes the others to `storage` (`host:port`).
fn gate_storage(storage: &str, mut client: TcpStream) -> std::io::Result<()> {
    let (head, reader) = read_head(&client)?;
    if head.header("authorization").is_some() {
        let body = "<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed</Message></Error>";
        write!(
            client,
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return client.shutdown(Shutdown::Both);
    }
    forward(storage, &head, reader, client)
}

/// Reads a request's first line and headers from `client`; the reader
/// holds what follows (a body).
fn read_head(client: &TcpStream) -> std::io::Result<(RequestHead, BufReader<TcpStream>)> {
    client.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default().to_owned(), parts.next().unwrap_or_default().to_owned());
    let mut headers = Vec::new();
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
        if let Some((name, value)) = header.trim_end().split_once(':') {
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    Ok((RequestHead { method, target, headers }, reader))
}

/// Passes the request to `upstream` (`host:port`) and its answer back, on
/// a connection that closes after it.
fn forward(
    upstream: &str,
    head: &RequestHead,
    mut reader: BufReader<TcpStream>,
    mut client: TcpStream,
) -> std::io::Result<()> {
    let mut server = TcpStream::connect(upstream)?;
    let mut out = format!("{} {} HTTP/1.1\r\n", head.method, head.target);
    for (name, value) in &head.headers {
        if !name.eq_ignore_ascii_case("connection") && !name.eq_ignore_ascii_case("keep-alive") {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    server.write_all(out.as_bytes())?;
    let body_len: u64 = head.header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
    if body_len > 0 {
        std::io::copy(&mut (&mut reader).take(body_len), &mut server)?;
    }
    std::io::copy(&mut server, &mut client)?;
    client.shutdown(Shutdown::Both)
}

/// Runs git in `dir` as the tests' author; panics with its words if it fails.
fn git(dir: &Path, args: &[&str]) -> Vec<u8> {
    let output = Command::new("git")
        .args(["-c", "user.name=ferry-tests", "-c", "user.email=tests@ferry.invalid", "-c", "commit.gpgsign=false"])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run git");
    assert!(output.status.success(), "git {args:?} in {}: {}", dir.display(), String::from_utf8_lossy(&output.stderr));
    output.stdout
}

/// The object id and size an LFS pointer file names.
fn lfs_pointer(blob: &[u8]) -> Option<LfsObject> {
    let text = std::str::from_utf8(blob).ok()?.strip_prefix(LFS_POINTER)?;
    let sha = text.lines().find_map(|l| l.strip_prefix("oid sha256:"))?.to_owned();
    let size = text.lines().find_map(|l| l.strip_prefix("size "))?.parse().ok()?;
    Some((sha, size))
}

/// `%XX` escapes decoded (paths as clients write them).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request's first line and headers.
struct RequestHead {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl RequestHead {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// What a request's path names: the repository (`models/ORG/REPO`) and,
/// for a file, the revision and the file's path.
fn route(path: &str) -> Option<(String, Option<(String, String)>)> {
    let path = path.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_start_matches('/').splitn(8, '/').collect();
    if segments.first() == Some(&"api") {
        let [_, kind, org, repo, ..] = segments.as_slice() else { return None };
        return Some((format!("{kind}/{org}/{repo}"), None));
    }
    let (kind, rest) = match segments.first().copied() {
        Some(kind @ ("models" | "datasets" | "spaces")) => (kind, &segments[1..]),
        _ => ("models", &segments[..]),
    };
    let [org, repo, "resolve", revision, ..] = rest else { return None };
    let (_, file) = path.split_once(&format!("/resolve/{revision}/"))?;
    Some((format!("{kind}/{org}/{repo}"), Some((percent_decode(revision), percent_decode(file)))))
}

impl Front {
    /// Answers one request on `client` and closes it.
    fn serve(&self, mut client: TcpStream) -> std::io::Result<()> {
        let (head, reader) = read_head(&client)?;
        if let Some((repo, file)) = route(&head.target) {
            if let Some(token) = self.gated.lock().unwrap().get(&repo).cloned() {
                let sent = head.header("authorization").and_then(|a| a.strip_prefix("Bearer "));
                if sent != Some(token.as_str()) {
                    let status = if sent.is_none() { "401 Unauthorized" } else { "403 Forbidden" };
                    let message = format!(
                        "Access to model {} is restricted. You must have access to it and be authenticated to access it. Please log in.",
                        repo.trim_start_matches("models/")
                    );
                    let body = format!("{{\"error\":\"{message}\"}}");
                    write!(
                        client,
                        "HTTP/1.1 {status}\r\nX-Error-Code: GatedRepo\r\nX-Error-Message: {message}\r\n\
                         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )?;
                    return client.shutdown(Shutdown::Both);
                }
            }
            if let Some((revision, path)) = file {
                self.resolved.lock().unwrap().push(path.clone());
                if let Some((commit, sha, size)) = self.lfs_object(&repo, &revision, &path) {
                    let storage = self.storage.lock().unwrap().clone();
                    write!(
                        client,
                        "HTTP/1.1 302 Found\r\nLocation: {storage}/{LFS_BUCKET}/{sha}\r\nX-Repo-Commit: {commit}\r\n\
                         X-Linked-Size: {size}\r\nX-Linked-Etag: \"{sha}\"\r\nETag: \"{sha}\"\r\n\
                         Content-Length: 0\r\nConnection: close\r\n\r\n"
                    )?;
                    return client.shutdown(Shutdown::Both);
                }
            }
        }
        forward(&self.olah, &head, reader, client)
    }

    /// The commit and LFS object (SHA-256, size) of `path` at `revision` of
    /// `repo`, when the file is kept in LFS.
    fn lfs_object(&self, repo: &str, revision: &str, path: &str) -> Option<(String, String, u64)> {
        let dir = self.mirrors.join(repo);
        let run = |args: &[&str]| {
            let output = Command::new("git").args(args).current_dir(&dir).stdin(Stdio::null()).output().ok()?;
            output.status.success().then_some(output.stdout)
        };
        let commit = run(&["rev-parse", "--verify", "-q", &format!("{revision}^{{commit}}")])?;
        let commit = String::from_utf8(commit).ok()?.trim().to_owned();
        let key = (dir.clone(), commit.clone(), path.to_owned());
        if let Some(known) = self.lfs.lock().unwrap().get(&key) {
            return known.clone().map(|(sha, size)| (commit, sha, size));
        }
        let blob = run(&["cat-file", "blob", &format!("{commit}:{path}")])?;
        let object = lfs_pointer(&blob);
        self.lfs.lock().unwrap().insert(key, object.clone());
        object.map(|(sha, size)| (commit, sha, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_the_repository_and_the_file() {
        assert_eq!(route("/api/models/ferry/x/revision/main"), Some(("models/ferry/x".into(), None)));
        assert_eq!(
            route("/ferry/x/resolve/0123/dir/with%20space.bin?download=true"),
            Some(("models/ferry/x".into(), Some(("0123".into(), "dir/with space.bin".into()))))
        );
        assert_eq!(
            route("/datasets/ferry/d/resolve/main/a.txt"),
            Some(("datasets/ferry/d".into(), Some(("main".into(), "a.txt".into()))))
        );
        assert_eq!(route("/ferry/x"), None);
    }

    #[test]
    fn pointers_name_their_object() {
        let pointer = format!("{LFS_POINTER}oid sha256:{}\nsize 12\n", "ab".repeat(32));
        assert_eq!(lfs_pointer(pointer.as_bytes()), Some(("ab".repeat(32), 12)));
        assert_eq!(lfs_pointer(b"plain content"), None);
        assert_eq!(percent_decode("a%20b%C3%BC%2"), "a bü%2");
    }
}
