//! The OCI backend against a real registry (the distribution project's,
//! with Basic auth), through the trait the engine uses: an artifact pushed
//! by `oras` is listed by its titles, read whole and in ranges, verified
//! against its digests; a moved tag is a new manifest; a missing tag,
//! repository or blob, wrong credentials and writes each end as the engine
//! expects.

use std::time::Duration;

use bytes::Bytes;
use ferry_store::oci::{OciOptions, OciStore, Reference, RegistryCredentials};
use ferry_store::{Integrity, ObjectStore, StoreError, StoredChecksum};
use ferry_testkit::{REGISTRY_PASSWORD, REGISTRY_USER, RegistryServer, pattern};
use futures::TryStreamExt as _;
use sha2::{Digest as _, Sha256};

const MIB: usize = 1 << 20;

fn store(server: &RegistryServer, reference: &str, password: Option<&str>) -> OciStore {
    let options = OciOptions {
        endpoint_url: Some(server.endpoint.clone()),
        credentials: password
            .map(|password| RegistryCredentials::Basic { username: REGISTRY_USER.into(), password: password.into() }),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
    };
    let reference: Reference = format!("{}/{reference}", server.host).parse().unwrap();
    OciStore::connect(reference, &options).expect("a store")
}

async fn read(store: &OciStore, key: &str, range: Option<std::ops::Range<u64>>) -> Result<Vec<u8>, StoreError> {
    let response = store.get(key, range, None).await?;
    let chunks: Vec<Bytes> = response.body.try_collect().await?;
    Ok(chunks.concat())
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_pushed_by_oras_is_listed_read_and_verified_by_its_digests() {
    let server = RegistryServer::start();
    let dir = tempfile::tempdir().unwrap();
    let large = pattern(1, 3 * MIB + 5);
    std::fs::create_dir_all(dir.path().join("shards")).unwrap();
    std::fs::write(dir.path().join("shards/model-00001.safetensors"), &large).unwrap();
    std::fs::write(dir.path().join("config.json"), b"{\"layers\": 2}").unwrap();
    server.oras_push("models/demo:v1", dir.path(), &["config.json", "shards/model-00001.safetensors"]);
    let oci = store(&server, "models/demo:v1", Some(REGISTRY_PASSWORD));

    let page = oci.list_page("", None).await.unwrap();
    let listed: Vec<(&str, u64)> = page.objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(listed, [("config.json", 13), ("shards/model-00001.safetensors", large.len() as u64)]);
    assert!(page.next.is_none());
    let etag = page.objects[1].etag.clone().unwrap();
    assert_eq!(etag, format!("sha256:{}", hex::encode(sha256(&large))), "the ETag is the layer's digest");
    let under: Vec<String> = oci.list_page("shards/", None).await.unwrap().objects.into_iter().map(|o| o.key).collect();
    assert_eq!(under, ["shards/model-00001.safetensors"]);

    let (meta, integrity) = oci.head("shards/model-00001.safetensors").await.unwrap();
    assert_eq!(meta.size, large.len() as u64);
    assert_eq!(integrity, Some(Integrity::Whole(StoredChecksum::Sha256(sha256(&large)))));
    let whole = oci.get("config.json", None, Some(&page.objects[0].etag.clone().unwrap())).await.unwrap();
    assert_eq!(whole.checksum, Some(Integrity::Whole(StoredChecksum::Sha256(sha256(b"{\"layers\": 2}")))));
    let range = (MIB as u64 - 3)..(2 * MIB as u64 + 9);
    let ranged = read(&oci, "shards/model-00001.safetensors", Some(range.clone())).await.unwrap();
    assert!(ranged == large[range.start as usize..range.end as usize], "a range across a MiB boundary");
    assert!(matches!(oci.get("config.json", None, Some("sha256:0000")).await, Err(StoreError::Changed)));
    assert!(matches!(oci.head("missing.bin").await, Err(StoreError::NotFound)));

    // The tag moves to a manifest with one layer changed: a new store (a
    // new run) sees the new digest, the unchanged layer keeps its own.
    std::fs::write(dir.path().join("config.json"), b"{\"layers\": 3}").unwrap();
    server.oras_push("models/demo:v1", dir.path(), &["config.json", "shards/model-00001.safetensors"]);
    let moved = store(&server, "models/demo:v1", Some(REGISTRY_PASSWORD)).list_page("", None).await.unwrap();
    assert_ne!(moved.objects[0].etag, page.objects[0].etag);
    assert_eq!(moved.objects[1].etag, page.objects[1].etag);
    assert_eq!(
        read(&oci, "config.json", None).await.unwrap(),
        b"{\"layers\": 2}",
        "a run reads the manifest it began with"
    );

    // By digest: the same artifact, immutable.
    let digest = server.manifest_digest("models/demo", "v1").await;
    let pinned = store(&server, &format!("models/demo@{digest}"), Some(REGISTRY_PASSWORD));
    assert_eq!(read(&pinned, "config.json", None).await.unwrap(), b"{\"layers\": 3}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_artifacts_wrong_credentials_and_writes_are_refused_as_the_engine_expects() {
    let server = RegistryServer::start();
    server.put("data/set", "v1", "a.bin", b"a".to_vec()).await;

    let missing_tag = store(&server, "data/set:v9", Some(REGISTRY_PASSWORD)).list_page("", None).await;
    assert!(
        matches!(&missing_tag, Err(StoreError::NoSuchBucket { bucket }) if bucket.ends_with("data/set:v9")),
        "{missing_tag:?}"
    );
    let missing_repository = store(&server, "nothing/here:v1", Some(REGISTRY_PASSWORD)).list_page("", None).await;
    assert!(matches!(missing_repository, Err(StoreError::NoSuchBucket { .. })), "{missing_repository:?}");

    let wrong = store(&server, "data/set:v1", Some("wrong")).list_page("", None).await;
    assert!(matches!(&wrong, Err(StoreError::AccessDenied { .. })), "{wrong:?}");
    let anonymous = store(&server, "data/set:v1", None).list_page("", None).await;
    assert!(matches!(&anonymous, Err(StoreError::NoCredentials(m)) if m.contains(&server.host)), "{anonymous:?}");

    // A directory `oras push` packed into one tar layer is refused, not
    // written as a file of the directory's name.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("weights")).unwrap();
    std::fs::write(dir.path().join("weights/w.bin"), b"w").unwrap();
    server.oras_push("data/packed:v1", dir.path(), &["weights"]);
    let packed = store(&server, "data/packed:v1", Some(REGISTRY_PASSWORD)).list_page("", None).await;
    assert!(
        matches!(&packed, Err(StoreError::Rejected { code, message }) if code == "UnsupportedLayer" && message.contains("weights")),
        "{packed:?}"
    );

    let oci = store(&server, "data/set:v1", Some(REGISTRY_PASSWORD));
    assert_eq!(read(&oci, "a.bin", None).await.unwrap(), b"a");
    for refused in
        [oci.put("b.bin", Bytes::from_static(b"b"), 0).await.map(|_| ()), oci.list_uploads("").await.map(|_| ())]
    {
        assert!(matches!(&refused, Err(StoreError::Rejected { code, .. }) if code == "ReadOnlyStore"), "{refused:?}");
    }
}
