//! The Azure Blob backend against a real Azurite, through the trait the
//! engine uses: listing, HEAD, whole and ranged reads under If-Match, whole
//! writes and block uploads (invisible until committed, found again after
//! an interruption), and the error categories for a replaced blob, a
//! missing blob or container and a wrong key. Test-side reads and writes
//! are requests of the test server's own.

use std::time::Duration;

use bytes::Bytes;
use ferry_store::azure::{AzureCredentials, AzureOptions, AzureStore};
use ferry_store::{Integrity, ObjectStore, StoreError, StoredChecksum};
use ferry_testkit::{AZURITE_ACCOUNT, AZURITE_KEY, AzuriteServer, pattern};
use futures::TryStreamExt as _;
use md5::{Digest as _, Md5};

const MIB: usize = 1 << 20;

fn store(server: &AzuriteServer, container: &str, key: &str) -> AzureStore {
    use base64::Engine as _;
    let options = AzureOptions {
        endpoint_url: Some(server.endpoint.clone()),
        credentials: AzureCredentials::SharedKey {
            account: AZURITE_ACCOUNT.to_owned(),
            key: base64::engine::general_purpose::STANDARD.decode(key).unwrap(),
        },
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(30),
    };
    AzureStore::connect(container, &options).expect("a store")
}

async fn read(
    store: &AzureStore,
    key: &str,
    range: Option<std::ops::Range<u64>>,
    if_match: Option<&str>,
) -> Result<Vec<u8>, StoreError> {
    let response = store.get(key, range, if_match).await?;
    let chunks: Vec<Bytes> = response.body.try_collect().await?;
    Ok(chunks.concat())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_is_listed_read_and_written_as_the_engine_needs() {
    let server = AzuriteServer::start();
    server.create_container("data").await;
    let large = pattern(5, 3 * MIB + 7);
    server.put("data", "ds/large.bin", large.clone()).await;
    server.put("data", "ds/a & b+ü.txt", b"hello".to_vec()).await;
    server.put("data", "other/x", b"x".to_vec()).await;
    let azure = store(&server, "data", AZURITE_KEY);

    // A listing under a prefix, in key order, with sizes and ETags.
    let page = azure.list_page("ds/", None).await.unwrap();
    let listed: Vec<(&str, u64)> = page.objects.iter().map(|o| (o.key.as_str(), o.size)).collect();
    assert_eq!(listed, [("ds/a & b+ü.txt", 5), ("ds/large.bin", large.len() as u64)]);
    assert!(page.next.is_none());
    assert!(page.objects.iter().all(|o| o.etag.is_some() && o.last_modified.is_some()), "{page:?}");

    // HEAD and a whole read report the blob's MD5, and it is the content's.
    let (meta, integrity) = azure.head("ds/large.bin").await.unwrap();
    assert_eq!(meta.size, large.len() as u64);
    let md5: [u8; 16] = Md5::digest(&large).into();
    assert_eq!(integrity, Some(Integrity::Whole(StoredChecksum::Md5(md5))));
    let whole = azure.get("ds/large.bin", None, None).await.unwrap();
    assert_eq!((whole.content_length, whole.checksum.clone()), (large.len() as u64, integrity));
    assert!(read(&azure, "ds/large.bin", None, None).await.unwrap() == large);
    assert_eq!(read(&azure, "ds/a & b+ü.txt", None, None).await.unwrap(), b"hello");

    // A ranged read under If-Match, then the blob replaced under it.
    let etag = meta.etag.expect("an ETag");
    let range = MIB as u64 - 3..2 * MIB as u64 + 11;
    let ranged = azure.get("ds/large.bin", Some(range.clone()), Some(&etag)).await.unwrap();
    assert_eq!((ranged.content_length, ranged.checksum), (range.end - range.start, None));
    let bytes = read(&azure, "ds/large.bin", Some(range.clone()), Some(&etag)).await.unwrap();
    assert!(bytes == large[range.start as usize..range.end as usize]);
    server.put("data", "ds/large.bin", b"replaced".to_vec()).await;
    let changed = azure.get("ds/large.bin", Some(0..4), Some(&etag)).await.unwrap_err();
    assert!(matches!(changed, StoreError::Changed), "{changed:?}");

    // Missing blob, missing container, wrong key.
    assert!(matches!(azure.get("ds/missing", None, None).await.unwrap_err(), StoreError::NotFound));
    assert!(matches!(azure.head("ds/missing").await.unwrap_err(), StoreError::NotFound));
    let nowhere = store(&server, "nothing-here", AZURITE_KEY);
    let missing = nowhere.list_page("", None).await.unwrap_err();
    assert!(matches!(&missing, StoreError::NoSuchBucket { bucket } if bucket == "nothing-here"), "{missing:?}");
    assert_eq!(missing.reason(), ferry_contract::Reason::BucketNotFound);
    let wrong_key = store(&server, "data", "d3Jvbmcga2V5IGZvciB0aGUgZGV2IGFjY291bnQ=");
    let denied = wrong_key.list_page("", None).await.unwrap_err();
    assert!(matches!(denied, StoreError::AccessDenied { .. }), "{denied:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_are_invisible_until_committed_and_are_found_again_after_an_interruption() {
    let server = AzuriteServer::start();
    server.create_container("uploads").await;
    let azure = store(&server, "uploads", AZURITE_KEY);

    // A whole write: the store checks its CRC64, the blob reads back. (The
    // trait's CRC32C is for stores that take one; Azure does not.)
    let etag = azure.put("ds/tiny.txt", Bytes::from_static(b"tiny"), 0).await.unwrap();
    assert!(etag.is_some());
    assert_eq!(server.get("uploads", "ds/tiny.txt").await, b"tiny");

    // Two parts of three, then an interruption: nothing is visible, and
    // the upload and its parts are found again.
    let data = pattern(9, 2 * 5 * MIB + 123);
    let parts: Vec<Bytes> = data.chunks(5 * MIB).map(Bytes::copy_from_slice).collect();
    let upload = azure.create_multipart("ds/big.bin").await.unwrap();
    let mut uploaded = Vec::new();
    for (index, part) in parts.iter().take(2).enumerate() {
        uploaded.push(azure.upload_part("ds/big.bin", &upload, index as u32 + 1, part.clone(), 0).await.unwrap());
    }
    assert!(matches!(azure.head("ds/big.bin").await.unwrap_err(), StoreError::NotFound), "visible before its commit");
    assert!(azure.list_page("ds/", None).await.unwrap().objects.iter().all(|o| o.key != "ds/big.bin"));
    let pending = azure.list_uploads("ds/").await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!((pending[0].key.as_str(), pending[0].upload_id.as_str()), ("ds/big.bin", upload.as_str()));
    let listed = azure.list_parts("ds/big.bin", &upload).await.unwrap();
    let numbers: Vec<(u32, u64)> = listed.iter().map(|p| (p.number, p.size)).collect();
    assert_eq!(numbers, [(1, 5 * MIB as u64), (2, 5 * MIB as u64)]);
    // No upload to be gone: an id with no block lists none, on a blob
    // with blocks of another upload as on one that does not exist.
    assert!(azure.list_parts("ds/big.bin", "0000000000000000").await.unwrap().is_empty());
    assert!(azure.list_parts("ds/none.bin", &upload).await.unwrap().is_empty());

    // The resumed upload sends the last part and commits all three.
    uploaded.push(azure.upload_part("ds/big.bin", &upload, 3, parts[2].clone(), 0).await.unwrap());
    let committed = azure.complete_multipart("ds/big.bin", &upload, uploaded, 0).await.unwrap();
    assert!(committed.is_some());
    assert!(server.get("uploads", "ds/big.bin").await == data);
    assert!(azure.list_uploads("ds/").await.unwrap().is_empty(), "a committed upload is no longer pending");
}
