//! Helpers shared by the stager's integration tests: run the real binary
//! against a real server and read its summary.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ferry_contract::layout::{STATE_DIR, TEMP_DIR};
use ferry_testkit::Store;

/// The stager binary built for these tests.
pub const STAGER: &str = env!("CARGO_BIN_EXE_ferry-stager");

/// The outcome of one stager run.
#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stderr: String,
    pub summary: serde_json::Value,
    pub elapsed: Duration,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    pub fn transferred(&self) -> u64 {
        self.summary["objects"]["transferred"].as_u64().expect("summary has objects.transferred")
    }

    pub fn skipped(&self) -> u64 {
        self.summary["objects"]["skipped"].as_u64().expect("summary has objects.skipped")
    }

    pub fn assert_ok(&self) {
        assert_eq!(self.code(), 0, "stager failed:\n{}\nsummary: {:#}", self.stderr, self.summary);
    }
}

/// A stager command talking to `server`.
pub fn command(server: &Store, args: &[&str]) -> Command {
    let mut cmd = Command::new(STAGER);
    cmd.args(args).arg("--progress").arg("never").envs(server.env()).env("RUST_LOG", "warn");
    cmd
}

/// Runs the stager to completion.
pub fn stager(server: &Store, args: &[&str]) -> Run {
    run(command(server, args))
}

/// The longest one stager run of these tests may take: the largest moves
/// tens of MiB over loopback in seconds, so a run still going after this
/// is stuck, and the test fails with what it printed instead of stalling
/// the suite.
pub const RUN_DEADLINE: Duration = Duration::from_secs(300);

/// Runs a prepared stager command to completion, with a summary file.
///
/// # Panics
/// When the run is still going after [`RUN_DEADLINE`] (it is killed first).
pub fn run(mut cmd: Command) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let summary_path = dir.path().join("summary.json");
    let stderr_path = dir.path().join("stderr");
    cmd.arg("--summary-file").arg(&summary_path);
    // stderr goes to a file, not a pipe: waiting with a deadline must not
    // also have to drain a pipe the child could fill.
    let stderr_file = std::fs::File::create(&stderr_path).unwrap();
    let started = Instant::now();
    let mut child = cmd.stdout(Stdio::null()).stderr(stderr_file).spawn().expect("run ferry-stager");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for ferry-stager") {
            break status;
        }
        if started.elapsed() > RUN_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read(&stderr_path).unwrap_or_default();
            panic!(
                "ferry-stager ran past {RUN_DEADLINE:?} and was killed: {cmd:?}\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = started.elapsed();
    let summary = std::fs::read(&summary_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let stderr = std::fs::read(&stderr_path).unwrap();
    Run { status, stderr: String::from_utf8_lossy(&stderr).into_owned(), summary, elapsed }
}

/// Writes `files` (relative path → content) below `root`.
pub fn write_tree(root: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (rel, data) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
}

/// Uploads `files` under `prefix` with the test client (independent of the stager).
pub async fn put_tree(server: &Store, bucket: &str, prefix: &str, files: &BTreeMap<String, Vec<u8>>) {
    for (rel, data) in files {
        server.put(bucket, &format!("{prefix}{rel}"), data.clone()).await;
    }
}

/// Deletes one object with a client of its own (independent of the stager).
pub async fn delete(server: &Store, bucket: &str, key: &str) {
    match server {
        Store::S3(s3) => {
            s3.client()
                .delete_object()
                .bucket(bucket)
                .key(key)
                .send()
                .await
                .unwrap_or_else(|e| panic!("delete {key}: {e:?}"));
        }
        Store::Gcs(gcs) => {
            let encoded: String = key
                .bytes()
                .map(|b| match b {
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            let url = format!("{}/storage/v1/b/{bucket}/o/{encoded}", gcs.endpoint);
            let response =
                reqwest::Client::new().delete(url).send().await.unwrap_or_else(|e| panic!("delete {key}: {e}"));
            assert!(response.status().is_success(), "delete {key}: {}", response.status());
        }
        Store::Azure(azure) => azure.delete(bucket, key).await,
        Store::Registry(_) => unreachable!("no registry test deletes a layer"),
        Store::Hub(hub) => hub.delete(bucket, key),
    }
}

/// `count` small files with varied sizes, named `dir/NNNN.bin`.
pub fn small_files(dir: &str, count: usize, seed: u64) -> BTreeMap<String, Vec<u8>> {
    (0..count)
        .map(|i| (format!("{dir}/{i:04}.bin"), ferry_testkit::pattern(seed + i as u64, 512 + (i * 37) % 4096)))
        .collect()
}

/// Files left in the run's temporary area (should be none after a run).
pub fn leftover_temp_files(root: &Path) -> Vec<String> {
    let tmp = root.join(STATE_DIR).join(TEMP_DIR);
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&tmp) {
        for entry in entries.flatten() {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out
}
