//! What production S3 stores ask of a client beyond the test suite's plain
//! HTTP and static keys:
//!
//! * HTTPS with a private CA, as on-premises MinIO and Ceph usually are:
//!   the stager trusts the CA named by `SSL_CERT_FILE`, moves a tree both
//!   ways byte for byte with verification on, and without that CA refuses
//!   the server's certificate: the run fails, says why, and leaves no file.
//! * Temporary credentials with a session token (assumed roles, IRSA).
//! * Azure without a key: an Entra ID token for a service principal or a
//!   workload identity, which Azure takes over HTTPS only.

use crate::common;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use common::{Run, command, run, write_tree};
use ferry_testkit::{AzuriteServer, EntraServer, REQUEST_DEADLINE, S3Server, Store, pattern, read_tree};
use tempfile::TempDir;

/// A stager command with `env` added.
fn with_env(server: &Store, env: &[(&str, &OsStr)], args: &[&str]) -> Command {
    let mut command = command(server, args);
    command.envs(env.iter().copied());
    command
}

/// Pushes `src` to `uri` (5 MiB parts) and pulls it back into a new
/// directory, both with `env`; returns the pull and its directory.
fn round_trip(server: &Store, env: &[(&str, &OsStr)], src: &Path, uri: &str) -> (Run, TempDir) {
    run(with_env(server, env, &["push", src.to_str().unwrap(), uri, "--part-size", "5MiB"])).assert_ok();
    let dst = tempfile::tempdir().unwrap();
    let pull = run(with_env(server, env, &["pull", uri, dst.path().to_str().unwrap()]));
    pull.assert_ok();
    (pull, dst)
}

#[test]
fn the_stager_trusts_the_ca_it_is_given_and_refuses_an_unknown_one() {
    let server = S3Server::minio_tls();
    let ca_file = server.ca_file.clone().expect("a TLS server has a CA");
    let server = Store::S3(server);
    tokio::runtime::Runtime::new().unwrap().block_on(server.create_bucket("tls"));
    // A multipart object of an odd size, a small one and an empty one.
    let files: BTreeMap<String, Vec<u8>> = [
        ("shards/large.bin".to_owned(), pattern(3, (11 << 20) + 5)),
        ("small.txt".to_owned(), b"over tls".to_vec()),
        ("empty".to_owned(), Vec::new()),
    ]
    .into();
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &files);

    let uri = server.uri("tls/tree");
    let (pull, dst) = round_trip(&server, &[("SSL_CERT_FILE", ca_file.as_os_str())], src.path(), &uri);
    assert_eq!(pull.summary["verified"]["checksum"].as_u64(), Some(3), "{:#}", pull.summary);
    assert!(read_tree(dst.path()) == files, "the tree differs after the round trip over TLS");

    // The platform's roots do not include the test CA: the handshake is
    // refused, the run fails with the reason, and nothing is written.
    let untrusting = tempfile::tempdir().unwrap();
    let mut pull = with_env(&server, &[], &["pull", &uri, untrusting.path().to_str().unwrap()]);
    pull.env_remove("SSL_CERT_FILE").env_remove("SSL_CERT_DIR");
    let refused = run(pull);
    assert_ne!(refused.code(), 0, "a server with an unknown CA was trusted:\n{}", refused.stderr);
    assert!(
        refused.stderr.to_ascii_lowercase().contains("certificate"),
        "the failure does not say the certificate was refused:\n{}",
        refused.stderr
    );
    assert!(read_tree(untrusting.path()).is_empty(), "a refused run left files behind");
}

/// Temporary credentials carry a session token that every request must
/// sign (IRSA on EKS, assumed roles): with credentials MinIO's STS issued
/// for an assumed role, the stager signs the token and moves the tree
/// both ways.
#[test]
fn the_stager_signs_the_session_token_of_temporary_credentials() {
    let server = S3Server::minio();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (access_key, secret_key, session_token) = runtime.block_on(assume_role(&server));
    let server = Store::S3(server);
    runtime.block_on(server.create_bucket("sts"));
    let files: BTreeMap<String, Vec<u8>> =
        [("part.bin".to_owned(), pattern(9, (6 << 20) + 1)), ("one.txt".to_owned(), b"1".to_vec())].into();
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &files);

    let uri = server.uri("sts/tree");
    let temporary = [
        ("AWS_ACCESS_KEY_ID", OsStr::new(&access_key)),
        ("AWS_SECRET_ACCESS_KEY", OsStr::new(&secret_key)),
        ("AWS_SESSION_TOKEN", OsStr::new(&session_token)),
    ];
    let (_, dst) = round_trip(&server, &temporary, src.path(), &uri);
    assert!(read_tree(dst.path()) == files, "the tree differs after a round trip with a session token");

    // The token is checked: without it the same keys are refused.
    let tokenless_dst = tempfile::tempdir().unwrap();
    let refused = run(with_env(&server, &temporary[..2], &["pull", &uri, tokenless_dst.path().to_str().unwrap()]));
    assert_ne!(refused.code(), 0, "temporary keys worked without their session token");
    assert!(refused.stderr.contains("InvalidTokenId"), "refused for another reason:\n{}", refused.stderr);
}

/// Temporary credentials from MinIO's STS (AssumeRole, signed with the root keys).
async fn assume_role(server: &S3Server) -> (String, String, String) {
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&server.endpoint)
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            &server.access_key,
            &server.secret_key,
            None,
            None,
            "test",
        ))
        // A server that never answers fails the test instead of stalling it.
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder().operation_attempt_timeout(REQUEST_DEADLINE).build(),
        )
        .load()
        .await;
    let assumed = aws_sdk_sts::Client::new(&config)
        .assume_role()
        .role_arn("arn:aws:iam::123456789012:role/ferry-staging")
        .role_session_name("ferry-test")
        .send()
        .await
        .expect("MinIO's STS issues temporary credentials");
    let credentials = assumed.credentials().expect("AssumeRole returns credentials");
    (
        credentials.access_key_id().to_owned(),
        credentials.secret_access_key().to_owned(),
        credentials.session_token().to_owned(),
    )
}

/// Keyless Azure: with a service principal's secret, and then with a
/// workload identity's federated token, the stager gets an Entra ID token
/// for Azure Storage (one exchange per run, however many requests) and
/// moves a tree both ways over HTTPS; Azurite checks each bearer's
/// audience, issuer and lifetime. A wrong secret ends the run with Entra's
/// reason and no file.
#[test]
fn an_azure_service_principal_or_workload_identity_gets_a_token_the_store_accepts() {
    let azurite = AzuriteServer::start_entra();
    let ca_file = azurite.ca_file.clone().expect("an HTTPS Azurite has a CA");
    let entra = EntraServer::start();
    let server = Store::Azure(azurite);
    tokio::runtime::Runtime::new().unwrap().block_on(server.create_bucket("keyless"));
    let files: BTreeMap<String, Vec<u8>> = [
        ("weights/shard-0.safetensors".to_owned(), pattern(21, (9 << 20) + 3)),
        ("config.json".to_owned(), b"{}".to_vec()),
    ]
    .into();
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &files);
    let uri = server.uri("keyless/model");

    let service_principal = |args: &[&str]| {
        keyless(&server, &entra, &ca_file, ("AZURE_CLIENT_SECRET", OsStr::new(&entra.client_secret)), args)
    };
    service_principal(&["push", src.path().to_str().unwrap(), &uri, "--part-size", "5MiB"]).assert_ok();
    assert_eq!(entra.issued(), 1, "a run exchanges once and keeps the token for every request");
    let dst = tempfile::tempdir().unwrap();
    let pull = service_principal(&["pull", &uri, dst.path().to_str().unwrap()]);
    pull.assert_ok();
    assert_eq!(pull.summary["verified"]["checksum"].as_u64(), Some(2), "{:#}", pull.summary);
    assert!(read_tree(dst.path()) == files, "the tree differs after a round trip with a service principal");

    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("azure-identity-token");
    std::fs::write(&token_file, &entra.federated_token).unwrap();
    let dst = tempfile::tempdir().unwrap();
    let proof = ("AZURE_FEDERATED_TOKEN_FILE", token_file.as_os_str());
    keyless(&server, &entra, &ca_file, proof, &["pull", &uri, dst.path().to_str().unwrap()]).assert_ok();
    assert!(read_tree(dst.path()) == files, "the tree differs after a pull with a workload identity");
    assert_eq!(entra.issued(), 3);

    // Entra refuses a wrong secret; the run says so and writes nothing.
    let refused_dst = tempfile::tempdir().unwrap();
    let wrong = ("AZURE_CLIENT_SECRET", OsStr::new("not-the-secret"));
    let refused = keyless(&server, &entra, &ca_file, wrong, &["pull", &uri, refused_dst.path().to_str().unwrap()]);
    assert_ne!(refused.code(), 0, "a wrong client secret was accepted");
    assert!(refused.stderr.contains("AADSTS7000215"), "refused for another reason:\n{}", refused.stderr);
    assert!(read_tree(refused_dst.path()).is_empty(), "a refused run left files behind");

    // An authority that does not answer is named as what failed, not
    // mistaken for the store.
    let unreachable_dst = tempfile::tempdir().unwrap();
    let proof = ("AZURE_CLIENT_SECRET", OsStr::new(&entra.client_secret));
    let mut unreachable =
        keyless_command(&server, &entra, &ca_file, proof, &["pull", &uri, unreachable_dst.path().to_str().unwrap()]);
    unreachable.env("AZURE_AUTHORITY_HOST", "http://127.0.0.1:9/").args(["--max-attempts", "1"]);
    let unreachable = run(unreachable);
    assert_ne!(unreachable.code(), 0, "a pull without a token succeeded");
    assert!(
        unreachable.stderr.contains("Entra ID token endpoint http://127.0.0.1:9/"),
        "the failure does not name the token endpoint:\n{}",
        unreachable.stderr
    );

    // Without the identity the container is not readable: the token was
    // what let the runs in.
    let anonymous_dst = tempfile::tempdir().unwrap();
    let mut anonymous = with_env(&server, &[("SSL_CERT_FILE", ca_file.as_os_str())], &["pull", &uri]);
    anonymous.arg(anonymous_dst.path()).env_remove("AZURE_STORAGE_KEY");
    let anonymous = run(anonymous);
    assert_ne!(anonymous.code(), 0, "the container was readable without credentials:\n{}", anonymous.stderr);
}

/// A stager run against an HTTPS Azurite with an Entra identity: the
/// account name stays (it names the endpoint's account), the key goes, so
/// the identity's token is the only credential.
fn keyless(server: &Store, entra: &EntraServer, ca_file: &Path, proof: (&str, &OsStr), args: &[&str]) -> Run {
    run(keyless_command(server, entra, ca_file, proof, args))
}

/// The command [`keyless`] runs.
fn keyless_command(
    server: &Store,
    entra: &EntraServer,
    ca_file: &Path,
    proof: (&str, &OsStr),
    args: &[&str],
) -> Command {
    let mut command = with_env(
        server,
        &[
            ("SSL_CERT_FILE", ca_file.as_os_str()),
            ("AZURE_TENANT_ID", OsStr::new(&entra.tenant)),
            ("AZURE_CLIENT_ID", OsStr::new(&entra.client_id)),
            ("AZURE_AUTHORITY_HOST", OsStr::new(&entra.authority_host)),
            proof,
        ],
        args,
    );
    command.env_remove("AZURE_STORAGE_KEY");
    command
}
