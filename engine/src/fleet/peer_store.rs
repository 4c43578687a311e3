//! The object store a worker in a fleet sees: reads of keys a peer said it
//! holds go to that peer, ranged reads of a large object to the peer that
//! owns the block, or one standing in for an owner this worker bypassed
//! ([`ferry_contract::PeerGroup::block_sources`]), everything else
//! (listings, HEADs, part sizes, writes, blocks this worker owns, and any
//! read no peer can serve) to the real store.
//!
//! A peer's response never supplies what it is verified against: a
//! whole-object read carries a checksum from the store, a CRC its HEAD
//! reports (objects from a MiB up) or the MD5 its listing's ETag is, as a
//! GET from the store would have carried one; ranged reads are verified
//! against the store's HEAD by the pull itself.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt as _;

use super::Fleet;
use crate::metrics::PeerFailure;
use crate::store::{
    GetResponse, Integrity, ListPage, ListedPart, ObjectMeta, ObjectStore, PendingUpload, RetryReason, StoreError,
    StoredChecksum,
};

/// The size from which a whole object read from a peer is verified against
/// a CRC the store's HEAD reports rather than its MD5 ETag: a HEAD per
/// object is worth it where hashing MD5 takes longer than the request.
const HEAD_FOR_A_CRC_FROM: u64 = 1024 * 1024;

/// The real store, with reads routed to peers where they can serve them.
#[derive(Debug)]
pub struct PeerStore {
    inner: Arc<dyn ObjectStore>,
    fleet: Arc<Fleet>,
    /// The size of the blocks peers own of a large object: the pull's
    /// range size, the same on every worker of a DataStage.
    block: u64,
}

impl PeerStore {
    /// `inner` with reads routed to `fleet`'s peers; large objects are
    /// fetched in ranges of `block` bytes.
    pub fn new(inner: Arc<dyn ObjectStore>, fleet: Arc<Fleet>, block: u64) -> Self {
        Self { inner, fleet, block: block.max(1) }
    }

    /// The response of `peer` for `key`, with its body counted and watched
    /// for stalls, or why it cannot serve.
    async fn read_from_peer(
        &self,
        peer: &str,
        addr: std::net::SocketAddr,
        key: &str,
        etag: &str,
        range: Option<&Range<u64>>,
    ) -> Result<Option<GetResponse>, StoreError> {
        let response = match self.fleet.fetch(peer, addr, key, etag, range).await {
            Ok(Some(response)) => response,
            Ok(None) => return Ok(None),
            Err((failure, why)) => {
                self.fleet.drop_peer(peer, failure, &why);
                return Err(StoreError::transient(RetryReason::ServerError, why));
            }
        };
        let content_length = response.content_length().unwrap_or(0);
        // The store's own checksum for a whole object: never the peer's word.
        let checksum = match range {
            Some(_) => None,
            None => self.trusted_checksum(key, etag, content_length).await?,
        };
        let fleet = Arc::clone(&self.fleet);
        let (peer, timeout) = (peer.to_owned(), self.fleet.timeout);
        let body = futures::stream::unfold(Some(response), move |response| {
            let (fleet, peer) = (Arc::clone(&fleet), peer.clone());
            async move {
                let mut response = response?;
                let chunk = loop {
                    match tokio::time::timeout(timeout, response.chunk()).await {
                        Ok(Ok(Some(chunk))) => break chunk,
                        Ok(Ok(None)) => return None,
                        Ok(Err(error)) => {
                            fleet.drop_peer(&peer, PeerFailure::Unreachable, &error.to_string());
                            return Some((Err(StoreError::transient(RetryReason::TruncatedBody, error)), None));
                        }
                        // A range it is still fetching arrives as fast as
                        // its own link brings it, in write-sized pieces:
                        // on a slow link, slower than the timeout per piece.
                        // Stalled is a peer whose whole run stopped.
                        Err(_) if fleet.still_working(&peer, addr).await => {}
                        Err(_) => {
                            fleet.drop_peer(&peer, PeerFailure::Stalled, "its response stalled");
                            let error = StoreError::transient(RetryReason::Timeout, format!("peer {peer} stalled"));
                            return Some((Err(error), None));
                        }
                    }
                };
                fleet.received(chunk.len() as u64);
                Some((Ok::<Bytes, StoreError>(chunk), Some(response)))
            }
        })
        .boxed();
        Ok(Some(GetResponse { content_length, etag: Some(etag.to_owned()), checksum, body }))
    }

    /// What the store says version `etag` of `key` (`size` bytes) is
    /// verified against. An MD5 ETag needs no request, but MD5 hashes at
    /// well under a tenth of a hardware CRC's speed: from [`HEAD_FOR_A_CRC_FROM`] up,
    /// the store's HEAD is asked for a CRC first, as a GET from the store
    /// would have carried one.
    async fn trusted_checksum(&self, key: &str, etag: &str, size: u64) -> Result<Option<Integrity>, StoreError> {
        let md5 = crate::store::md5_from_etag(etag).map(Integrity::Whole);
        if md5.is_some() && size < HEAD_FOR_A_CRC_FROM {
            return Ok(md5);
        }
        let (meta, checksum) = self.inner.head(key).await?;
        if meta.etag.as_deref() != Some(etag) {
            return Err(StoreError::Changed);
        }
        Ok(match checksum {
            Some(
                crc @ Integrity::Whole(
                    StoredChecksum::Crc64Nvme(_) | StoredChecksum::Crc32c(_) | StoredChecksum::Crc32(_),
                ),
            ) => Some(crc),
            other => md5.or(other),
        })
    }
}

#[async_trait]
impl ObjectStore for PeerStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn list_page(&self, prefix: &str, token: Option<String>) -> Result<ListPage, StoreError> {
        self.inner.list_page(prefix, token).await
    }

    async fn head(&self, key: &str) -> Result<(ObjectMeta, Option<Integrity>), StoreError> {
        self.inner.head(key).await
    }

    async fn part_size(&self, key: &str, number: u32, if_match: Option<&str>) -> Result<u64, StoreError> {
        self.inner.part_size(key, number, if_match).await
    }

    async fn get(
        &self,
        key: &str,
        range: Option<Range<u64>>,
        if_match: Option<&str>,
    ) -> Result<GetResponse, StoreError> {
        let Some(etag) = if_match else { return self.inner.get(key, range, if_match).await };
        // A whole object a peer said it holds, unless the pull decided to
        // read it from the store and serve it as it lands (a peer that
        // answered since must not slip second-hand bytes in).
        let landing_from_the_store = range.is_none() && self.fleet.catalog.is_landing(key, etag);
        if let Some((peer, addr)) = self.fleet.source_for(key).filter(|_| !landing_from_the_store) {
            match self.read_from_peer(&peer, addr, key, etag, range.as_ref()).await {
                Ok(Some(response)) => return Ok(response),
                // The peer is dropped, or reads it from elsewhere itself:
                // the store.
                Ok(None) | Err(StoreError::Transient { .. }) => {}
                Err(other) => return Err(other),
            }
        } else if let Some(range) = &range {
            // A block of a large object: from its owner, or from a peer
            // standing in for an owner this worker bypassed.
            for peer in self.fleet.block_sources(key, range.start / self.block) {
                let Some(addr) = self.fleet.address(&peer).await else {
                    // Not when it was dropped meanwhile for another reason.
                    if !self.fleet.is_dropped(&peer) {
                        self.fleet.drop_peer(&peer, PeerFailure::Unreachable, "its address was never published");
                    }
                    continue;
                };
                let catalog = &self.fleet.catalog;
                catalog.reading_from_a_peer(key, etag, range, true);
                match self.read_from_peer(&peer, addr, key, etag, Some(range)).await {
                    Ok(Some(response)) => {
                        self.fleet.serving_range(key, &peer);
                        return Ok(response);
                    }
                    // It reads this block from a peer itself, or it is
                    // dropped now: the next source.
                    Ok(None) | Err(StoreError::Transient { .. }) => {
                        catalog.reading_from_a_peer(key, etag, range, false)
                    }
                    Err(other) => {
                        catalog.reading_from_a_peer(key, etag, range, false);
                        return Err(other);
                    }
                }
            }
            // From the store: whatever an earlier attempt at this range read
            // from a peer is written over, so it is passed on again.
            self.fleet.catalog.reading_from_a_peer(key, etag, range, false);
        }
        self.inner.get(key, range, if_match).await
    }

    fn distrust(&self, key: &str) {
        self.fleet.distrust(key);
    }

    async fn put(&self, key: &str, body: Bytes, crc32c: u32) -> Result<Option<String>, StoreError> {
        self.inner.put(key, body, crc32c).await
    }

    async fn create_multipart(&self, key: &str) -> Result<String, StoreError> {
        self.inner.create_multipart(key).await
    }

    async fn upload_part(
        &self,
        key: &str,
        upload_id: &str,
        number: u32,
        body: Bytes,
        crc32c: u32,
    ) -> Result<crate::store::UploadedPart, StoreError> {
        self.inner.upload_part(key, upload_id, number, body, crc32c).await
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<crate::store::UploadedPart>,
        crc32c: u32,
    ) -> Result<Option<String>, StoreError> {
        self.inner.complete_multipart(key, upload_id, parts, crc32c).await
    }

    async fn abort_multipart(&self, key: &str, upload_id: &str) -> Result<(), StoreError> {
        self.inner.abort_multipart(key, upload_id).await
    }

    async fn list_parts(&self, key: &str, upload_id: &str) -> Result<Vec<ListedPart>, StoreError> {
        self.inner.list_parts(key, upload_id).await
    }

    async fn list_uploads(&self, prefix: &str) -> Result<Vec<PendingUpload>, StoreError> {
        self.inner.list_uploads(prefix).await
    }
}
