//! `hf://` against olah, a self-hosted Hugging Face Hub, behind the front
//! `ferry_testkit::HubServer` puts before it (LFS files redirected to
//! their storage, gated repositories): what is particular to the Hub. The
//! pull tests every store passes run against it in `conformance.rs`.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use common::{command, leftover_temp_files, stager};
use ferry_testkit::{Backend, CorruptingProxy, HubServer, LFS_FROM, Store, pattern, read_tree, tool_path};

const MIB: usize = 1 << 20;

/// A model as the Hub keeps one: small files in git (a config, a
/// tokenizer in a directory, an empty file), weights in LFS (one large
/// enough to be read in ranges), names with a space and non-ASCII.
fn model() -> BTreeMap<String, Vec<u8>> {
    [
        ("config.json", br#"{"architectures": ["TinyForCausalLM"], "hidden_size": 64}"#.to_vec()),
        ("tokenizer/vocab.txt", pattern(1, 300 << 10)),
        ("tokenizer/empty.txt", Vec::new()),
        ("model.safetensors", pattern(2, 3 * MIB + 7)),
        ("weights/shard 1 of 1 – ü.bin", pattern(3, 21 * MIB + 3)),
        ("README.md", b"# tiny\n".to_vec()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

async fn hub_with(files: &BTreeMap<String, Vec<u8>>, repo: &str) -> (Store, String) {
    let server = Store::start(Backend::Hub);
    let Store::Hub(hub) = &server else { unreachable!("a Hub") };
    for (key, data) in files {
        hub.put(repo, key, data.clone()).await;
    }
    let uri = server.uri(repo);
    (server, uri)
}

fn hub(server: &Store) -> &HubServer {
    let Store::Hub(hub) = server else { unreachable!("a Hub") };
    hub
}

/// What `hf download REPO --local-dir DIR` wrote, without its own
/// metadata (`.cache/huggingface`).
fn hf_download(endpoint: &str, repo: &str, revision: &str, token: Option<&str>) -> BTreeMap<String, Vec<u8>> {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(tool_path("hf"));
    cmd.args(["download", repo, "--revision", revision, "--local-dir"])
        .arg(dir.path())
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HOME", home.path())
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env_remove("HF_TOKEN");
    if let Some(token) = token {
        cmd.env("HF_TOKEN", token);
    }
    let output = cmd.output().expect("run hf download");
    assert!(output.status.success(), "hf download: {}", String::from_utf8_lossy(&output.stderr));
    let mut files = read_tree(dir.path());
    files.retain(|path, _| !path.starts_with(".cache/"));
    files
}

/// A pull writes what the Hub's own client writes, byte for byte, with
/// every file verified against the hash the Hub lists for it (the LFS
/// SHA-256, the git blob id), reading the Hub through `HF_ENDPOINT`.
#[tokio::test(flavor = "multi_thread")]
async fn a_pull_writes_what_hf_download_writes_and_verifies_every_file() {
    let files = model();
    let (server, uri) = hub_with(&files, "tiny").await;
    let endpoint = hub(&server).endpoint.clone();
    let dst = tempfile::tempdir().unwrap();
    let mut cmd = command(&server, &["pull", &uri, dst.path().to_str().unwrap(), "--part-size", "4MiB"]);
    cmd.env_remove("FERRY_ENDPOINT_URL").env("HF_ENDPOINT", &endpoint);
    let pull = common::run(cmd);
    pull.assert_ok();
    assert_eq!(read_tree(dst.path()), files);
    assert_eq!(pull.summary["verified"]["checksum"].as_u64(), Some(files.len() as u64), "{:#}", pull.summary);
    assert_eq!(pull.summary["verified"]["sha"].as_u64(), Some(files.len() as u64), "{:#}", pull.summary);
    assert_eq!(hf_download(&endpoint, "ferry/tiny", "main", None), files, "the same files as the Hub's client");
    // The large file came from the storage in ranges, through the redirect.
    let large = files.keys().filter(|k| files[*k].len() >= LFS_FROM).count();
    assert!(large >= 2, "the model has LFS files");

    // A path inside the repository is a prefix.
    let dst = tempfile::tempdir().unwrap();
    let sub = format!("{uri}/tokenizer");
    let pull = stager(&server, &["pull", &sub, dst.path().to_str().unwrap()]);
    pull.assert_ok();
    let expected: BTreeMap<String, Vec<u8>> =
        files.iter().filter_map(|(k, v)| k.strip_prefix("tokenizer/").map(|k| (k.to_owned(), v.clone()))).collect();
    assert_eq!(read_tree(dst.path()), expected);
}

/// A pull reads one commit: a branch resolved once; a later pull of the
/// moved branch fetches only the file whose content changed, and a pull
/// pinned to the old commit or to a tag still gets the old bytes.
#[tokio::test(flavor = "multi_thread")]
async fn a_moved_branch_resyncs_only_what_changed_and_a_commit_stays_pinned() {
    let files = model();
    let (server, uri) = hub_with(&files, "moving").await;
    let hub = hub(&server);
    let first = hub.tag("moving", "v1");
    let dst = tempfile::tempdir().unwrap();
    let dir = dst.path().to_str().unwrap();
    stager(&server, &["pull", &uri, dir]).assert_ok();

    let changed = pattern(9, 3 * MIB + 7);
    hub.put("moving", "model.safetensors", changed.clone()).await;
    let before = hub.resolved().len();
    let again = stager(&server, &["pull", &uri, dir]);
    again.assert_ok();
    assert_eq!((again.transferred(), again.skipped()), (1, files.len() as u64 - 1), "{:#}", again.summary);
    let moved = hub.commit("moving", "main");
    assert_ne!(moved, first);
    assert_eq!(again.summary["snapshot"]["revision"].as_str(), Some(moved.as_str()), "the commit read");
    assert_eq!(hub.resolved()[before..], ["model.safetensors".to_owned()], "only the changed file is read");
    let mut now = files.clone();
    now.insert("model.safetensors".into(), changed);
    assert_eq!(read_tree(dst.path()), now);

    for pinned in [format!("{uri}@{first}"), format!("{uri}@v1")] {
        let old = tempfile::tempdir().unwrap();
        stager(&server, &["pull", &pinned, old.path().to_str().unwrap()]).assert_ok();
        assert_eq!(read_tree(old.path()), files, "{pinned}");
    }
}

/// A gated repository: without a token, or with another one, the pull
/// ends at once with AccessDenied and the Hub's words; with its token it
/// completes, and the token never reaches the storage the Hub redirects
/// to (which refuses a request carrying one).
#[tokio::test(flavor = "multi_thread")]
async fn a_gated_repository_needs_its_token_which_stays_with_the_hub() {
    let files = model();
    let (server, uri) = hub_with(&files, "gated").await;
    let hub = hub(&server);
    hub.gate("gated", "hf_right");
    let dst = tempfile::tempdir().unwrap();
    let dir = dst.path().to_str().unwrap();

    let mut cmd = command(&server, &["pull", &uri, dir]);
    cmd.env_remove("HF_TOKEN");
    let anonymous = common::run(cmd);
    assert_eq!(
        (anonymous.code(), anonymous.summary["reason"].as_str()),
        (4, Some("AccessDenied")),
        "{}",
        anonymous.stderr
    );
    assert!(
        anonymous.stderr.contains("is restricted") && anonymous.stderr.contains("HF_TOKEN"),
        "{}",
        anonymous.stderr
    );
    let mut cmd = command(&server, &["pull", &uri, dir]);
    cmd.env("HF_TOKEN", "hf_wrong");
    let wrong = common::run(cmd);
    assert_eq!((wrong.code(), wrong.summary["reason"].as_str()), (4, Some("AccessDenied")), "{}", wrong.stderr);
    assert!(wrong.stderr.contains("token was refused"), "{}", wrong.stderr);
    assert!(read_tree(dst.path()).is_empty(), "nothing was written");

    // The storage takes no bearer token: a client that forwarded it there
    // would fail to read the LFS files.
    let (_, data) = files.iter().find(|(_, d)| d.len() >= LFS_FROM).unwrap();
    let object = hub.storage_url_of(data);
    let http = reqwest::Client::new();
    assert!(http.get(&object).send().await.unwrap().status().is_success());
    let leaked = http.get(&object).bearer_auth("hf_right").send().await.unwrap().status();
    assert!(leaked.is_client_error(), "the storage refuses a bearer token: {leaked}");

    let mut cmd = command(&server, &["pull", &uri, dir]);
    cmd.env("HF_TOKEN", "hf_right");
    let allowed = common::run(cmd);
    allowed.assert_ok();
    assert_eq!(read_tree(dst.path()), files);
    assert_eq!(hf_download(&hub.endpoint, "ferry/gated", "main", Some("hf_right")), files);
}

/// A byte changed on the way, in a file kept in git and in an LFS file
/// read from the storage in ranges: every file fails its hash, is fetched
/// again and reported, and none appears.
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_byte_from_the_hub_or_its_storage_is_caught() {
    const MARKER: &[u8] = b"<ferry-corrupt-this-byte>";
    let mut small = pattern(5, 200 << 10);
    small[1000..1000 + MARKER.len()].copy_from_slice(MARKER);
    let mut large = pattern(6, 13 * MIB + 5);
    large[7 * MIB + 11..7 * MIB + 11 + MARKER.len()].copy_from_slice(MARKER);
    let files: BTreeMap<String, Vec<u8>> = [("small.json".to_owned(), small), ("large.bin".to_owned(), large)].into();
    let (server, uri) = hub_with(&files, "flipped").await;
    let hub = hub(&server);
    let before_hub = CorruptingProxy::start(&hub.endpoint, MARKER);
    let before_storage = CorruptingProxy::start(&hub.storage_endpoint(), MARKER);
    hub.redirect_storage_to(&before_storage.endpoint);
    let dst = tempfile::tempdir().unwrap();
    let mut cmd = command(&server, &["pull", &uri, dst.path().to_str().unwrap(), "--part-size", "4MiB"]);
    cmd.env("FERRY_ENDPOINT_URL", &before_hub.endpoint);
    let corrupted = common::run(cmd);
    assert_eq!(corrupted.code(), 1, "{}\n{:#}", corrupted.stderr, corrupted.summary);
    assert_eq!(corrupted.summary["objects"]["failed"].as_u64(), Some(2), "{:#}", corrupted.summary);
    for failure in corrupted.summary["failures"].as_array().unwrap() {
        assert!(failure["error"].as_str().unwrap().contains("checksum mismatch"), "{failure}");
    }
    assert!(before_hub.corrupted() >= 1 && before_storage.corrupted() >= 1);
    assert!(read_tree(dst.path()).is_empty(), "no corrupted file appears");
    assert_eq!(leftover_temp_files(dst.path()), Vec::<String>::new());
}

/// What the Hub does not have is named: an unknown repository, revision or
/// path; and a push is refused before anything is read.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_repository_or_revision_and_a_push_end_with_their_reason() {
    let files: BTreeMap<String, Vec<u8>> = [("a.txt".to_owned(), b"a".to_vec())].into();
    let (server, uri) = hub_with(&files, "present").await;
    let dst = tempfile::tempdir().unwrap();
    let dir = dst.path().to_str().unwrap();
    for missing in [server.uri("absent"), format!("{uri}@no-such-branch")] {
        let run = stager(&server, &["pull", &missing, dir]);
        assert_eq!(run.code(), 4, "{missing}: {}", run.stderr);
        assert!(run.stderr.contains("not found") || run.stderr.contains("Not Found"), "{missing}: {}", run.stderr);
    }
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("f.bin"), b"x").unwrap();
    let push = stager(&server, &["push", src.path().to_str().unwrap(), &uri]);
    assert_eq!((push.code(), push.summary["reason"].as_str()), (4, Some("InvalidConfiguration")), "{}", push.stderr);
    assert!(read_tree(Path::new(dir)).is_empty());
}
