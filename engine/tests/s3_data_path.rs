//! The S3 data path (hyper + SigV4, see `ferry_store::s3`) against a real
//! MinIO: it carries a push and a pull of a small tree through the engine
//! (an empty file, a few bytes, and a multipart object of an odd size) byte
//! for byte with verification on, and hands the engine what the SDK's
//! requests do: content length, ETag, the checksum of a whole-object read
//! (the one HEAD, an SDK request, reports), and the same error categories
//! for a replaced object under If-Match, a missing key, refused credentials
//! and an endpoint nobody listens on.
//!
//! The store is built from an SDK configuration with the test server's
//! static keys, so nothing here depends on this process's environment.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region, SharedCredentialsProvider};
use bytes::Bytes;
use ferry_contract::TransferOptions;
use ferry_engine::metrics::Metrics;
use ferry_engine::store::s3::{S3Options, S3Store};
use ferry_engine::store::{GetResponse, Integrity, ObjectStore, RetryReason, StoreError, StoredChecksum};
use ferry_engine::transfer::{Engine, TransferConfig, pull::pull, push::push};
use ferry_testkit::{S3Server, pattern, read_tree};
use futures::TryStreamExt as _;

const MIB: usize = 1 << 20;
const BUCKET: &str = "ablation";

/// A store on `endpoint`.
async fn connect(endpoint: &str, access_key: &str, secret_key: &str) -> S3Store {
    let shared = aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            access_key, secret_key, None, None, "test",
        )))
        .build();
    let options = S3Options {
        endpoint_url: Some(endpoint.to_owned()),
        region: Some("us-east-1".to_owned()),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
        web_identity: None,
    };
    S3Store::from_sdk_config(BUCKET, &options, &shared).await.expect("the data path is set up")
}

fn write_tree(root: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (rel, data) in files {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, data).unwrap();
    }
}

async fn body(response: GetResponse) -> Vec<u8> {
    let chunks: Vec<Bytes> = response.body.try_collect().await.expect("read the body");
    chunks.concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_path_carries_a_verified_round_trip_and_reports_errors_as_the_sdk_does() {
    let server = S3Server::minio();
    server.create_bucket(BUCKET).await;
    let store: Arc<dyn ObjectStore> = Arc::new(connect(&server.endpoint, &server.access_key, &server.secret_key).await);

    // Push then pull, through the engine, with a part size that splits the
    // large file into 5 MiB, 5 MiB and 2 MiB + 7 B.
    let files: BTreeMap<String, Vec<u8>> = [
        ("empty.bin".to_owned(), Vec::new()),
        ("tiny.txt".to_owned(), b"ferry".to_vec()),
        ("nested/large.bin".to_owned(), pattern(7, 12 * MIB + 7)),
    ]
    .into();
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &files);
    let options = TransferOptions { part_size: Some("5MiB".parse().unwrap()), ..TransferOptions::default() };
    let engine = |store: &Arc<dyn ObjectStore>| {
        Engine::new(Arc::clone(store), TransferConfig::from_options(&options).unwrap(), Arc::new(Metrics::new()))
            .unwrap()
    };
    let pushed = push(engine(&store), src.path(), "ds/").await.expect("push");
    assert_eq!(pushed.objects.transferred, 3, "{pushed:#?}");
    assert_eq!(pushed.objects.failed, 0, "{pushed:#?}");
    // Checked with a client of its own, not the code under test.
    assert!(server.get(BUCKET, "ds/nested/large.bin").await == files["nested/large.bin"]);

    let dst = tempfile::tempdir().unwrap();
    let pulled = pull(engine(&store), "ds/", dst.path(), false).await.expect("pull");
    assert_eq!(pulled.objects.transferred, 3, "{pulled:#?}");
    assert_eq!(pulled.objects.failed, 0, "{pulled:#?}");
    assert_eq!(pulled.verified.checksum, 3, "every object verified against a checksum: {pulled:#?}");
    assert!(read_tree(dst.path()) == files, "the tree differs after the round trip");

    // A whole-object read reports the checksum HEAD (always the SDK) does.
    for key in ["ds/empty.bin", "ds/tiny.txt", "ds/nested/large.bin"] {
        let (meta, head) = store.head(key).await.unwrap();
        let response = store.get(key, None, None).await.unwrap();
        assert_eq!(response.content_length, meta.size, "{key}");
        assert_eq!(response.etag, meta.etag, "{key}");
        assert_eq!(response.checksum, head, "{key}");
        assert!(response.checksum.is_some(), "{key}: no checksum to verify against");
    }
    // A PUT and the parts carry the engine's CRC32C, and the store keeps it.
    let (_, tiny) = store.head("ds/tiny.txt").await.unwrap();
    let (_, large) = store.head("ds/nested/large.bin").await.unwrap();
    assert_eq!(tiny, Some(Integrity::Whole(StoredChecksum::Crc32c(crc32c::crc32c(b"ferry")))));
    let whole = crc32c::crc32c(&files["nested/large.bin"]);
    assert_eq!(large, Some(Integrity::Whole(StoredChecksum::Crc32c(whole))));

    // A ranged read under If-Match, then the object replaced under it.
    let key = "ds/nested/large.bin";
    let etag = store.head(key).await.unwrap().0.etag.expect("an ETag");
    let range = 5 * MIB as u64 - 3..5 * MIB as u64 + 4096;
    let response = store.get(key, Some(range.clone()), Some(&etag)).await.unwrap();
    assert_eq!(response.content_length, range.end - range.start);
    assert_eq!(response.etag.as_deref(), Some(etag.as_str()));
    assert_eq!(response.checksum, None, "a ranged read's checksum headers describe the whole object");
    assert!(body(response).await == files["nested/large.bin"][range.start as usize..range.end as usize]);
    server.put(BUCKET, key, b"replaced".to_vec()).await;
    let changed = store.get(key, Some(0..4), Some(&etag)).await.unwrap_err();
    assert!(matches!(changed, StoreError::Changed), "{changed:?}");

    // A missing key, whole or ranged.
    let missing = store.get("ds/missing.bin", None, None).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound), "{missing:?}");
    let missing = store.get("ds/missing.bin", Some(0..10), None).await.unwrap_err();
    assert!(matches!(missing, StoreError::NotFound), "{missing:?}");

    // Refused credentials, on a read and on a write.
    let wrong = connect(&server.endpoint, &server.access_key, "not-the-secret").await;
    let denied = wrong.get("ds/tiny.txt", None, None).await.unwrap_err();
    assert!(matches!(&denied, StoreError::AccessDenied { code, .. } if code == "SignatureDoesNotMatch"), "{denied:?}");
    let denied = wrong.put("ds/denied.txt", Bytes::from_static(b"no"), crc32c::crc32c(b"no")).await.unwrap_err();
    assert!(matches!(denied, StoreError::AccessDenied { .. }), "{denied:?}");

    // Nobody listening: a connection failure, worth retrying.
    let port = ferry_testkit::free_port();
    let nowhere = connect(&format!("http://127.0.0.1:{port}"), "key", "secret").await;
    let refused = nowhere.get("ds/tiny.txt", None, None).await.unwrap_err();
    assert_eq!(refused.retry_reason(), Some(RetryReason::Connection), "{refused:?}");
}
