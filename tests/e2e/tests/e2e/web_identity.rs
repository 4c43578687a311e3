//! Keys nowhere: the stager exchanges a Kubernetes service-account token at
//! MinIO's STS (`AssumeRoleWithWebIdentity`), and MinIO trusts the tokens
//! because it verifies them against the API server's own issuer: its OpenID
//! discovery document and signing keys, fetched over HTTPS with the API
//! server's CA. This is what EKS's IRSA does with AWS STS, on parts that run
//! here.
//!
//! 1. A token the API server issues (TokenRequest) pulls byte-identical.
//! 2. Tokens that live 20 s, rotated every 5 s as a kubelet rotates a
//!    projected token, carry a pull that keeps sending requests for nearly
//!    twice as long: the stager
//!    exchanges again before its keys expire, reading the file anew.
//! 3. A token for another audience, an expired token and a role the store
//!    does not know are each refused with `AccessDenied`, nothing staged.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ferry_contract::{ExitStatus, Reason, Summary};
use ferry_e2e::control_plane::ControlPlane;
use ferry_e2e::{store_trusting_issuer, workspace_binary};
use ferry_testkit::{S3Server, pattern, read_tree};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// The audience MinIO expects: its OpenID client id.
const AUDIENCE: &str = "ferry-e2e-store";
/// How long the rotated tokens of step 2 live.
const SHORT_LIFE: Duration = Duration::from_secs(20);
/// How often step 2 writes a new token: a quarter of its life.
const ROTATE_EVERY: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread")]
async fn a_service_account_token_is_exchanged_at_the_stores_sts_and_again_before_the_keys_expire() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = ControlPlane::start(&dir.path().join("cluster")).await.unwrap();
    let client = control_plane.client().await.unwrap();
    let store = store_trusting_issuer(&control_plane, &client, AUDIENCE).await;
    let role = store.openid_role_arn.clone().unwrap();
    store.create_bucket("models").await;
    // Odd sizes: one across several ranges, one of a single byte, one empty.
    // Step 2's 24 objects of 300 KiB under `many/` make requests all
    // through its pull, each signed with the keys of its moment.
    let mut dataset =
        vec![("shard-0".to_owned(), 7 * 1024 * 1024 + 13), ("config.json".into(), 1), ("empty".into(), 0)];
    dataset.extend((0..24).map(|i| (format!("many/{i:02}"), 300 * 1024 + i)));
    for (key, len) in &dataset {
        store.put("models", &format!("llama/{key}"), pattern(*len as u64, *len)).await;
    }
    let expected: std::collections::BTreeMap<String, Vec<u8>> =
        dataset.iter().map(|(key, len)| (key.clone(), pattern(*len as u64, *len))).collect();
    let many: std::collections::BTreeMap<String, Vec<u8>> =
        expected.iter().filter(|(key, _)| key.starts_with("many/")).map(|(k, v)| (k.clone(), v.clone())).collect();
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");

    // 1. A token from the API server, exchanged for keys.
    let issued = issue_token(&accounts, AUDIENCE).await;
    let token_file = dir.path().join("token");
    write_atomically(&token_file, &issued);
    let pull = Pull { store: &store, role: &role, token_file: &token_file, dir: dir.path() };
    let (output, summary) = pull.run("issued", &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(read_tree(&dir.path().join("issued")), expected, "byte-identical");
    assert!(summary.complete);

    // 2. Short-lived tokens, rotated while a pull outlives each of them.
    let key = control_plane.dir().join("pki/sa.key");
    let short_lived = {
        let (key, issued) = (key.clone(), issued.clone());
        move || {
            let now = unix_now();
            mint(&issued, &key, |claims| {
                claims["iat"] = json!(now);
                claims["nbf"] = json!(now);
                claims["exp"] = json!(now + SHORT_LIFE.as_secs());
            })
        }
    };
    // The pull starts with a short-lived token, never the issued one.
    write_atomically(&token_file, &short_lived());
    let rotate = {
        let token_file = token_file.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        let rotation = std::thread::spawn(move || {
            let mut rotations = 1;
            loop {
                std::thread::sleep(ROTATE_EVERY);
                if stopped.load(std::sync::atomic::Ordering::SeqCst) {
                    return rotations;
                }
                write_atomically(&token_file, &short_lived());
                rotations += 1;
            }
        });
        (stop, rotation)
    };
    let started = Instant::now();
    // 7 MiB at 192 KiB/s, two requests at a time: about 37 s, nearly
    // twice a token's life, with a new request every 3 s.
    let (output, _) = pull.run("rotated", &["--include", "many/*", "--max-bandwidth", "192KiB", "--concurrency", "2"]);
    let took = started.elapsed();
    rotate.0.store(true, std::sync::atomic::Ordering::SeqCst);
    let rotations = rotate.1.join().unwrap();
    assert!(output.status.success(), "a pull across token rotations failed: {}", stderr(&output));
    assert_eq!(read_tree(&dir.path().join("rotated")), many, "byte-identical");
    assert!(took > SHORT_LIFE + Duration::from_secs(10), "the pull outlived its first keys: {took:?}");
    let exchanges = stderr(&output).matches("exchanged the web identity token").count();
    assert!(exchanges >= 3, "{exchanges} exchanges in {took:?} ({rotations} tokens written): {}", stderr(&output));

    // 3. Refusals: nothing staged, and the reason says so.
    let elsewhere = issue_token(&accounts, "another-audience").await;
    let now = unix_now();
    let expired = mint(&issued, &key, |claims| {
        claims["iat"] = json!(now - 700);
        claims["nbf"] = json!(now - 700);
        claims["exp"] = json!(now - 100);
    });
    for (case, token, role, expected_message) in [
        ("wrong-audience", &elsewhere, role.as_str(), "must match configured OpenID Client ID"),
        ("expired", &expired, role.as_str(), "expired"),
        ("unknown-role", &issued, "arn:minio:iam:::role/unknown", "arn:minio:iam:::role/unknown"),
    ] {
        write_atomically(&token_file, token);
        let pull = Pull { role, ..pull };
        let (output, summary) = pull.run(case, &[]);
        assert_eq!(
            output.status.code().and_then(ExitStatus::from_code),
            Some(ExitStatus::RunRefused),
            "{case}: {}",
            stderr(&output)
        );
        assert_eq!(summary.reason, Some(Reason::AccessDenied), "{case}: {summary:?}");
        let said = stderr(&output);
        assert!(said.contains("STS refused the web identity token"), "{case}: {said}");
        assert!(said.to_lowercase().contains(&expected_message.to_lowercase()), "{case}: {said}");
        assert!(read_tree(&dir.path().join(case)).is_empty(), "{case}: nothing staged");
    }
}

/// One `ferry-stager pull` of `s3://models/llama` with a web identity.
#[derive(Clone, Copy)]
struct Pull<'a> {
    store: &'a S3Server,
    role: &'a str,
    token_file: &'a Path,
    dir: &'a Path,
}

impl Pull<'_> {
    fn run(&self, name: &str, extra: &[&str]) -> (Output, Summary) {
        let destination = self.dir.join(name);
        let summary_file = self.dir.join(format!("{name}.json"));
        let output = Command::new(workspace_binary("ferry-stager"))
            .args(["--progress", "never", "pull", "s3://models/llama"])
            .arg(&destination)
            .args(["--endpoint-url", &self.store.endpoint, "--sts-endpoint", &self.store.endpoint])
            .args(["--role-arn", self.role, "--web-identity-token-file"])
            .arg(self.token_file)
            .arg("--summary-file")
            .arg(&summary_file)
            .args(extra)
            // No other credentials to fall back on.
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env_remove("AWS_PROFILE")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let summary = std::fs::read(&summary_file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_else(|| panic!("{name}: no summary: {}", stderr(&output)));
        (output, summary)
    }
}

/// A token for the `default` service account with `audience`, from the
/// API server (the TokenRequest API a kubelet uses for projected tokens).
async fn issue_token(accounts: &Api<ServiceAccount>, audience: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_owned()]),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = accounts.create_token_request("default", &PostParams::default(), &request).await.unwrap();
    issued.status.and_then(|status| status.token).expect("the API server issues a token")
}

/// `token` with its claims changed by `edit`, signed again with the
/// issuer's key (`openssl`, RS256): what the API server would issue with
/// other times, which its TokenRequest API does not allow (at least 10
/// minutes, never in the past).
fn mint(token: &str, key: &Path, edit: impl FnOnce(&mut Value)) -> String {
    let mut parts = token.split('.');
    let (header, claims) = (parts.next().unwrap(), parts.next().unwrap());
    let mut claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
    edit(&mut claims);
    let signed = format!("{header}.{}", URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap()));
    let mut openssl = Command::new("openssl")
        .args(["dgst", "-sha256", "-sign"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    openssl.stdin.take().unwrap().write_all(signed.as_bytes()).unwrap();
    let signature = openssl.wait_with_output().unwrap();
    assert!(signature.status.success(), "openssl dgst -sign failed");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature.stdout))
}

/// Replaces `path` by a rename, as the kubelet updates a projected token:
/// a reader sees the old token or the new one, never half of one.
fn write_atomically(path: &Path, token: &str) {
    let next = PathBuf::from(format!("{}.next", path.display()));
    std::fs::write(&next, token).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
