//! An [`ObjectStore`] of any number of small objects that are a function of
//! their index, for measuring the engine at object counts no server here
//! can hold (ten million keys). Nothing is stored: listing a page makes
//! 1,000 keys, a GET makes the body from the key. It takes single-request
//! writes as a sink: the CRC32C is checked and the ETag returned is the
//! body's MD5, which is what its listing reports for the same body, so a
//! push of a directory pulled from it finds everything in place on a
//! re-run.
//!
//! Keys are `{prefix}d{i / 1000:05}/o{i % 1000:03}.bin`, so byte order is
//! index order and a continuation token is the next index. A dataset can
//! change between runs by rule, not by state: in epoch 2, every 1,009th
//! object has a new version and every 997th is gone.
//!
//! With [`SyntheticStore::empty`], the objects of the first version are
//! empty (new versions are not): ten million files then fit a disk as
//! inodes, where a few bytes each would take a 4 KiB block each (40 GB).
//!
//! With [`SyntheticStore::large_md5_only`], every object is one large body
//! (held once, and served as slices of it) whose only checksum is its MD5,
//! as after a single PUT without a checksum header: for measuring what a
//! pull holds while many such objects are hashed behind their downloads.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use md5::{Digest as _, Md5};

use super::{
    GetResponse, Integrity, ListPage, ListedPart, ObjectMeta, ObjectStore, PendingUpload, StoreError, StoredChecksum,
    UploadedPart,
};

/// Objects per directory, and per listing page.
const FANOUT: u64 = 1000;

/// The synthetic store.
#[derive(Debug, Clone)]
pub struct SyntheticStore {
    count: u64,
    epoch: u32,
    empty: bool,
    large: Option<Arc<Large>>,
    /// How long each chunk of a GET's body takes, if it is held back.
    trickle: Option<std::time::Duration>,
}

/// The one body of every object of a [`SyntheticStore::large_md5_only`] store.
#[derive(Debug)]
struct Large {
    body: Bytes,
    md5: [u8; 16],
}

/// Bytes per chunk of a GET's body, as a real body arrives in pieces.
const CHUNK: usize = 64 << 10;

impl SyntheticStore {
    /// `count` objects as they are in `epoch` (1 or 2).
    pub fn new(count: u64, epoch: u32) -> Self {
        Self { count, epoch, empty: false, large: None, trickle: None }
    }

    /// `count` objects of the same `size` bytes, whose only checksum is
    /// their MD5 (their ETag).
    pub fn large_md5_only(count: u64, size: usize) -> Self {
        let body: Bytes = (0..size).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let md5 = Md5::digest(&body).into();
        Self { large: Some(Arc::new(Large { body, md5 })), ..Self::new(count, 1) }
    }

    /// The same store with the first version of every object empty.
    #[must_use]
    pub fn empty(self) -> Self {
        Self { empty: true, ..self }
    }

    /// The same store with every 64 KiB of a GET's body taking `delay`, like
    /// a slow link: downloads then overlap as they would over a network.
    #[must_use]
    pub fn trickled(self, delay: std::time::Duration) -> Self {
        Self { trickle: Some(delay), ..self }
    }

    /// The key of object `index` below `prefix`.
    pub fn key(prefix: &str, index: u64) -> String {
        format!("{prefix}d{:05}/o{:03}.bin", index / FANOUT, index % FANOUT)
    }

    /// Whether object `index` exists in this epoch.
    pub fn exists(&self, index: u64) -> bool {
        index < self.count && !(self.epoch >= 2 && index.is_multiple_of(997))
    }

    /// Whether object `index` has a newer version than in epoch 1.
    pub fn changed(&self, index: u64) -> bool {
        self.epoch >= 2 && index.is_multiple_of(1009)
    }

    /// The body of object `index`: its index and version, a few bytes
    /// (nothing for a first version, in an [`empty`](Self::empty) store).
    pub fn body(&self, index: u64) -> Bytes {
        if let Some(large) = &self.large {
            return large.body.clone();
        }
        let changed = self.changed(index);
        if self.empty && !changed {
            return Bytes::new();
        }
        Bytes::from(format!("{index}:{}", u32::from(changed) + 1))
    }

    fn index_of(key: &str) -> Option<u64> {
        let (dir, file) = key.rsplit_once("/o")?;
        let dir: u64 = dir.rsplit_once('d')?.1.parse().ok()?;
        let file: u64 = file.strip_suffix(".bin")?.parse().ok()?;
        Some(dir * FANOUT + file)
    }

    fn meta(&self, key: String, index: u64) -> ObjectMeta {
        let body = self.body(index);
        ObjectMeta { key, size: body.len() as u64, etag: Some(self.etag(&body)), last_modified: None }
    }

    /// The ETag of `body`, an object's: its MD5, hashed once for large ones.
    fn etag(&self, body: &[u8]) -> String {
        hex::encode(self.large.as_ref().map_or_else(|| Md5::digest(body).into(), |large| large.md5))
    }

    /// What the store keeps as `body`'s checksum.
    fn checksum(&self, body: &[u8]) -> Integrity {
        Integrity::Whole(match &self.large {
            Some(large) => StoredChecksum::Md5(large.md5),
            None => StoredChecksum::Crc32c(crc32c::crc32c(body)),
        })
    }

    fn read_only() -> StoreError {
        StoreError::Rejected {
            code: "NotImplemented".into(),
            message: "the synthetic store takes no multipart uploads".into(),
        }
    }
}

#[async_trait]
impl ObjectStore for SyntheticStore {
    fn describe(&self) -> String {
        "synthetic://objects".into()
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let start: u64 = token.as_deref().map_or(Ok(0), str::parse).map_err(|_| StoreError::NotFound)?;
        let end = (start + FANOUT).min(self.count);
        let objects = (start..end).filter(|i| self.exists(*i)).map(|i| self.meta(Self::key(prefix, i), i)).collect();
        Ok(ListPage { objects, next: (end < self.count).then(|| end.to_string()) })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let index = Self::index_of(key).filter(|i| self.exists(*i)).ok_or(StoreError::NotFound)?;
        Ok((self.meta(key.to_owned(), index), Some(self.checksum(&self.body(index)))))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let index = Self::index_of(key).filter(|i| self.exists(*i)).ok_or(StoreError::NotFound)?;
        let body = self.body(index);
        let etag = self.etag(&body);
        if if_match.is_some_and(|m| m != etag) {
            return Err(StoreError::Changed);
        }
        let checksum = range.is_none().then(|| self.checksum(&body));
        let body = match range {
            Some(range) => body.slice(range.start as usize..range.end as usize),
            None => body,
        };
        let chunks: Vec<Result<Bytes, StoreError>> =
            (0..body.len()).step_by(CHUNK).map(|at| Ok(body.slice(at..(at + CHUNK).min(body.len())))).collect();
        let trickle = self.trickle;
        let chunks = futures::stream::iter(chunks).then(move |chunk| async move {
            if let Some(delay) = trickle {
                tokio::time::sleep(delay).await;
            }
            chunk
        });
        Ok(GetResponse { content_length: body.len() as u64, etag: Some(etag), checksum, body: chunks.boxed() })
    }

    async fn put(&self, _key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        if crc32c::crc32c(&body) != crc32c {
            return Err(StoreError::Rejected { code: "BadDigest".into(), message: "CRC32C mismatch".into() });
        }
        Ok(Some(hex::encode(Md5::digest(&body))))
    }

    async fn create_multipart(&self, _key: &str) -> Result<String, StoreError> {
        Err(Self::read_only())
    }

    async fn upload_part(
        &self,
        _key: &str,
        _upload_id: &str,
        _number: u32,
        _body: Bytes,
        _crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        Err(Self::read_only())
    }

    async fn complete_multipart(
        &self,
        _key: &str,
        _upload_id: &str,
        _parts: Vec<UploadedPart>,
        _crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        Err(Self::read_only())
    }

    async fn abort_multipart(&self, _key: &str, _upload_id: &str) -> Result<(), StoreError> {
        Err(Self::read_only())
    }

    async fn list_parts(&self, _key: &str, _upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        Err(StoreError::NotFound)
    }

    async fn list_uploads(&self, _prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pages_are_sorted_continue_and_follow_the_epoch() {
        let store = SyntheticStore::new(2500, 2);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let page = store.list_page("p/", token).await.unwrap();
            keys.extend(page.objects.into_iter().map(|o| o.key));
            match page.next {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "byte order");
        let gone = (0..2500u64).filter(|i| i.is_multiple_of(997)).count();
        assert_eq!(keys.len(), 2500 - gone);
        assert_eq!(keys[0], "p/d00000/o001.bin", "object 0 is gone in epoch 2");
        let response = store.get("p/d00001/o009.bin", None, None).await.unwrap();
        let body: Vec<Bytes> = response.body.map(Result::unwrap).collect().await;
        assert_eq!(body.concat(), b"1009:2");
        assert!(matches!(store.head("p/d00000/o997.bin").await, Err(StoreError::NotFound)));
    }

    #[tokio::test]
    async fn an_empty_store_changes_its_objects_from_nothing_to_a_new_version() {
        let first = SyntheticStore::new(2500, 1).empty();
        let second = SyntheticStore::new(2500, 2).empty();
        let page = first.list_page("p/", Some("1000".into())).await.unwrap();
        assert!(page.objects.iter().all(|o| o.size == 0), "first versions are empty");
        assert_eq!(second.body(1009).as_ref(), b"1009:2", "a new version is not");
        assert!(second.body(1010).is_empty());
        let (meta, _) = second.head("p/d00001/o009.bin").await.unwrap();
        assert_ne!(meta.etag, page.objects[9].etag, "so a re-run sees the change");
    }
}
