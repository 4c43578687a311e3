//! An in-memory [`ObjectStore`] with fault injection, for unit tests of the
//! engine's retries, verification and cleanup. The integration tests run
//! against real servers; this exists to make failures happen on demand.

use std::collections::{BTreeMap, VecDeque};
use std::ops::{Bound, Range};
use std::sync::Mutex;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;
use md5::{Digest as _, Md5};

use super::{
    GetResponse, Integrity, ListPage, ObjectMeta, ObjectStore, RetryReason, StoreError, StoredChecksum, UploadedPart,
};
use super::{ListedPart, PendingUpload};

/// A fault to inject into the next matching request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Fail the request with a throttling error.
    Throttle,
    /// Deliver only the first half of the body, then end it.
    Truncate,
    /// Flip one byte of the body.
    Corrupt,
    /// Flip the byte at this offset of the object, in the first request
    /// whose range holds it (requests for other ranges pass it by).
    CorruptAt(u64),
    /// Fail the request with a permanent error.
    Reject,
}

/// What the store saw, for assertions.
#[derive(Debug, Default, Clone)]
pub struct Calls {
    /// GET requests.
    pub gets: usize,
    /// Bytes the GET requests asked for (what a store bills as egress).
    pub get_bytes: u64,
    /// Multipart uploads aborted.
    pub aborts: usize,
    /// Multipart uploads completed.
    pub completes: usize,
    /// Parts stored by `upload_part`.
    pub parts: usize,
    /// Multipart uploads started.
    pub creates: usize,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, (Bytes, Option<StoredChecksum>)>,
    uploads: BTreeMap<String, Upload>,
    uploads_started: usize,
    get_faults: BTreeMap<String, VecDeque<Fault>>,
    upload_faults: VecDeque<Fault>,
    complete_faults: VecDeque<Fault>,
    calls: Calls,
    /// Time every GET waits before it answers, like a store a round trip away.
    get_latency: Option<std::time::Duration>,
    /// Time every 64 KiB of a GET's body takes, like a slow link.
    chunk_delay: Option<std::time::Duration>,
    /// Keys per listing page, when not the default two.
    page_size: Option<usize>,
}

/// An unfinished multipart upload.
#[derive(Debug)]
struct Upload {
    key: String,
    initiated: SystemTime,
    parts: BTreeMap<u32, Bytes>,
}

/// The in-memory store.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
}

fn etag_of(data: &[u8]) -> String {
    hex::encode(Md5::digest(data))
}

impl MemoryStore {
    /// Adds an object with a full-object CRC32C.
    pub fn insert(&self, key: &str, data: Vec<u8>) {
        let crc = crc32c::crc32c(&data);
        self.state.lock().unwrap().objects.insert(key.into(), (Bytes::from(data), Some(StoredChecksum::Crc32c(crc))));
    }

    /// Adds an object whose only checksum is its MD5 (its ETag), like a
    /// single PUT that sent no checksum.
    pub fn insert_md5_only(&self, key: &str, data: Vec<u8>) {
        let md5 = Md5::digest(&data).into();
        self.state.lock().unwrap().objects.insert(key.into(), (Bytes::from(data), Some(StoredChecksum::Md5(md5))));
    }

    /// Deletes an object, as another client would.
    pub fn remove(&self, key: &str) {
        self.state.lock().unwrap().objects.remove(key);
    }

    /// Queues faults for the next GETs of `key`, in order.
    pub fn fail_gets(&self, key: &str, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().get_faults.entry(key.into()).or_default().extend(faults);
    }

    /// Makes every GET wait `latency` before it answers.
    pub fn delay_gets(&self, latency: std::time::Duration) {
        self.state.lock().unwrap().get_latency = Some(latency);
    }

    /// Makes every GET's body arrive 64 KiB per `delay`.
    pub fn trickle_gets(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().chunk_delay = Some(delay);
    }

    /// Lists `keys` per page instead of two: a listing that keeps ahead of
    /// the objects, as a real store's pages of a thousand do.
    pub fn list_in_pages_of(&self, keys: usize) {
        self.state.lock().unwrap().page_size = Some(keys.max(1));
    }

    /// Queues faults for the next part uploads, in order.
    pub fn fail_uploads(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().upload_faults.extend(faults);
    }

    /// Queues faults for the next multipart completions, in order.
    pub fn fail_completes(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().unwrap().complete_faults.extend(faults);
    }

    /// A copy of an object's bytes.
    pub fn object(&self, key: &str) -> Option<Vec<u8>> {
        self.state.lock().unwrap().objects.get(key).map(|(b, _)| b.to_vec())
    }

    /// What happened so far.
    pub fn calls(&self) -> Calls {
        self.state.lock().unwrap().calls.clone()
    }

    /// Multipart uploads neither completed nor aborted.
    pub fn open_uploads(&self) -> usize {
        self.state.lock().unwrap().uploads.len()
    }

    /// Whether the multipart upload `upload_id` is still neither completed
    /// nor aborted.
    pub fn upload_is_open(&self, upload_id: &str) -> bool {
        self.state.lock().unwrap().uploads.contains_key(upload_id)
    }

    fn injected(fault: &Fault) -> Option<StoreError> {
        match fault {
            Fault::Throttle => Some(StoreError::transient(RetryReason::Throttled, "SlowDown (injected)")),
            Fault::Reject => Some(StoreError::Rejected { code: "Injected".into(), message: "permanent".into() }),
            _ => None,
        }
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    fn describe(&self) -> String {
        "mem://test".into()
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        let state = self.state.lock().unwrap();
        // Each page starts where the last one ended rather than scanning
        // from the first key, so listing many objects stays linear.
        let start = match token {
            Some(token) if token.as_str() >= prefix => Bound::Excluded(token),
            _ => Bound::Included(prefix.to_owned()),
        };
        // Two objects per page unless told otherwise, so pagination is exercised.
        let objects: Vec<ObjectMeta> = state
            .objects
            .range::<String, _>((start, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(state.page_size.unwrap_or(2))
            .map(|(k, (data, _))| ObjectMeta {
                key: k.clone(),
                size: data.len() as u64,
                etag: Some(etag_of(data)),
                last_modified: None,
            })
            .collect();
        let next = (objects.len() == 2).then(|| objects[1].key.clone());
        Ok(ListPage { objects, next })
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        let state = self.state.lock().unwrap();
        let (data, checksum) = state.objects.get(key).ok_or(StoreError::NotFound)?;
        let meta =
            ObjectMeta { key: key.into(), size: data.len() as u64, etag: Some(etag_of(data)), last_modified: None };
        Ok((meta, checksum.map(Integrity::Whole)))
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let (data, checksum, fault, latency, chunk_delay) = {
            let mut state = self.state.lock().unwrap();
            state.calls.gets += 1;
            let (data, checksum) = state.objects.get(key).cloned().ok_or(StoreError::NotFound)?;
            let asked = range.clone().unwrap_or(0..data.len() as u64);
            let fault = state.get_faults.get_mut(key).and_then(|faults| match faults.front() {
                Some(Fault::CorruptAt(at)) if !asked.contains(at) => None,
                _ => faults.pop_front(),
            });
            (data, checksum, fault, state.get_latency, state.chunk_delay)
        };
        if let Some(latency) = latency {
            tokio::time::sleep(latency).await;
        }
        if let Some(error) = fault.as_ref().and_then(Self::injected) {
            return Err(error);
        }
        let etag = etag_of(&data);
        if if_match.is_some_and(|m| m != etag) {
            return Err(StoreError::Changed);
        }
        let whole = range.is_none();
        let range = range.unwrap_or(0..data.len() as u64);
        self.state.lock().unwrap().calls.get_bytes += range.end - range.start;
        let mut body = data.slice(range.start as usize..range.end as usize).to_vec();
        let content_length = body.len() as u64;
        match fault {
            Some(Fault::Corrupt) if !body.is_empty() => body[0] ^= 0xff,
            Some(Fault::CorruptAt(at)) => body[(at - range.start) as usize] ^= 0xff,
            Some(Fault::Truncate) => body.truncate(body.len() / 2),
            _ => {}
        }
        // Several chunks, as a real body arrives.
        let chunks: Vec<Result<Bytes, StoreError>> =
            body.chunks(64 << 10).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let body = futures::stream::iter(chunks).then(move |chunk| async move {
            if let Some(delay) = chunk_delay {
                tokio::time::sleep(delay).await;
            }
            chunk
        });
        Ok(GetResponse {
            content_length,
            etag: Some(etag),
            checksum: if whole { checksum.map(Integrity::Whole) } else { None },
            body: body.boxed(),
        })
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        if crc32c::crc32c(&body) != crc32c {
            return Err(StoreError::Rejected { code: "BadDigest".into(), message: "CRC32C mismatch".into() });
        }
        let etag = etag_of(&body);
        self.state.lock().unwrap().objects.insert(key.into(), (body, Some(StoredChecksum::Crc32c(crc32c))));
        Ok(Some(etag))
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        let mut state = self.state.lock().unwrap();
        // Unique per upload, as real stores' ids are.
        state.uploads_started += 1;
        state.calls.creates += 1;
        let id = format!("upload-{}-{key}", state.uploads_started);
        let upload = Upload { key: key.to_owned(), initiated: SystemTime::now(), parts: BTreeMap::new() };
        state.uploads.insert(id.clone(), upload);
        Ok(id)
    }

    async fn upload_part(
        &self,
        _key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<UploadedPart, StoreError> {
        let mut state = self.state.lock().unwrap();
        if let Some(error) = state.upload_faults.pop_front().as_ref().and_then(Self::injected) {
            return Err(error);
        }
        if crc32c::crc32c(&body) != crc32c {
            return Err(StoreError::Rejected { code: "BadDigest".into(), message: "CRC32C mismatch".into() });
        }
        let etag = etag_of(&body);
        state.uploads.get_mut(upload_id).ok_or(StoreError::NotFound)?.parts.insert(number, body);
        state.calls.parts += 1;
        Ok(UploadedPart { number, etag, crc32c })
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        let mut state = self.state.lock().unwrap();
        if let Some(error) = state.complete_faults.pop_front().as_ref().and_then(Self::injected) {
            return Err(error);
        }
        let uploaded = state.uploads.remove(upload_id).ok_or(StoreError::NotFound)?;
        let mut data = Vec::new();
        for part in &parts {
            let stored = uploaded.parts.get(&part.number).ok_or(StoreError::NotFound)?;
            if etag_of(stored) != part.etag {
                return Err(StoreError::Rejected { code: "InvalidPart".into(), message: "ETag mismatch".into() });
            }
            data.extend_from_slice(stored);
        }
        if crc32c::crc32c(&data) != crc32c {
            return Err(StoreError::Rejected { code: "BadDigest".into(), message: "whole-object CRC32C".into() });
        }
        state.calls.completes += 1;
        let etag = etag_of(&data);
        state.objects.insert(key.into(), (Bytes::from(data), Some(StoredChecksum::Crc32c(crc32c))));
        Ok(Some(etag))
    }

    async fn abort_multipart(&self, _key: &str, upload_id: &str) -> Result<(), StoreError> {
        let mut state = self.state.lock().unwrap();
        state.calls.aborts += 1;
        state.uploads.remove(upload_id);
        Ok(())
    }

    async fn list_parts(&self, _key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        let state = self.state.lock().unwrap();
        let upload = state.uploads.get(upload_id).ok_or(StoreError::NotFound)?;
        Ok(upload
            .parts
            .iter()
            .map(|(number, body)| ListedPart {
                number: *number,
                size: body.len() as u64,
                etag: etag_of(body),
                crc32c: Some(crc32c::crc32c(body)),
            })
            .collect())
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .uploads
            .iter()
            .filter(|(_, upload)| upload.key.starts_with(prefix))
            .map(|(id, upload)| PendingUpload {
                key: upload.key.clone(),
                upload_id: id.clone(),
                initiated: Some(upload.initiated),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pages_hold_two_keys_of_the_prefix_and_continue_after_the_last() {
        let store = MemoryStore::default();
        for key in ["a/1", "a/2", "a/3", "a0", "b/1", "0"] {
            store.insert(key, key.as_bytes().to_vec());
        }
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let page = store.list_page("a/", token).await.unwrap();
            assert!(page.objects.len() <= 2);
            keys.extend(page.objects.into_iter().map(|o| o.key));
            token = page.next;
            if token.is_none() {
                break;
            }
        }
        assert_eq!(keys, ["a/1", "a/2", "a/3"]);
        let everything = store.list_page("", Some("a0".into())).await.unwrap();
        assert_eq!(everything.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["b/1"]);
    }
}
