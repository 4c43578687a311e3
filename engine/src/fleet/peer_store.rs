//! The object store a worker in a fleet sees: reads of keys a peer said it
//! holds go to that peer, ranged reads of a large object to the peer that
//! owns the block, or one standing in for an owner this worker bypassed
//! ([`ferry_contract::PeerGroup::block_sources`]), everything else
//! (listings, HEADs, part sizes, writes, blocks this worker owns, and any
//! read no peer can serve) to the real store. A block this worker owns
//! that a worker which joined the fleet took over is read from that
//! worker ([`super::handover`]).
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
use super::ask::PeerAnswer;
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
    ///
    /// Its fleet's server judges by the same block size which blocks this
    /// worker reads from the store, and so may hand over to a joiner.
    pub fn new(inner: Arc<dyn ObjectStore>, fleet: Arc<Fleet>, block: u64) -> Self {
        let block = block.max(1);
        let _ = fleet.block.set(block);
        Self { inner, fleet, block }
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
    ) -> Result<PeerAnswer<GetResponse>, StoreError> {
        let response = match self.fleet.fetch(reqwest::Method::GET, peer, addr, key, etag, range).await {
            Ok(PeerAnswer::Bytes(response)) => response,
            Ok(PeerAnswer::Elsewhere) => return Ok(PeerAnswer::Elsewhere),
            Ok(PeerAnswer::TakenOver) => return Ok(PeerAnswer::TakenOver),
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
        Ok(PeerAnswer::Bytes(GetResponse { content_length, etag: Some(etag.to_owned()), checksum, body }))
    }

    /// Block `range` of `key`, one this worker reads from the store, from
    /// the joiner that took it over, if one did ([`Fleet::block_taken_over`]).
    /// The joiner read it from the store, so this worker passes it on as
    /// its own. `None`: from the store (no joiner took it, or the joiner
    /// cannot serve it).
    async fn read_from_the_joiner(&self, key: &str, etag: &str, range: &Range<u64>) -> Option<GetResponse> {
        let joiner = self.fleet.block_taken_over(key, range.start)?;
        let addr = self.fleet.address(&joiner).await?;
        match self.read_from_peer(&joiner, addr, key, etag, Some(range)).await {
            Ok(PeerAnswer::Bytes(response)) => {
                self.fleet.serving_range(key, &joiner);
                Some(response)
            }
            _ => None,
        }
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

    fn identity(&self) -> String {
        self.inner.identity()
    }

    fn revision(&self) -> Option<String> {
        self.inner.revision()
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
                Ok(PeerAnswer::Bytes(response)) => return Ok(response),
                // The peer is dropped, or reads it from elsewhere itself:
                // the store.
                Ok(PeerAnswer::Elsewhere | PeerAnswer::TakenOver) | Err(StoreError::Transient { .. }) => {}
                Err(other) => return Err(other),
            }
        } else if let Some(range) = &range {
            // A block of a large object: from its owner, or from a peer
            // standing in for an owner this worker bypassed.
            let sources = self.fleet.block_sources(key, range.start / self.block);
            // One this worker reads from the store: from a joiner that took
            // it over, if one did. Asked here, in the request's slot: until
            // now a joiner could take it.
            if sources.is_empty()
                && let Some(response) = self.read_from_the_joiner(key, etag, range).await
            {
                return Ok(response);
            }
            for peer in sources {
                let Some(addr) = self.fleet.address(&peer).await else {
                    // Not when it was dropped meanwhile for another reason.
                    if !self.fleet.health.is_dropped(&peer) {
                        self.fleet.drop_peer(&peer, PeerFailure::Unreachable, "its address was never published");
                    }
                    continue;
                };
                let catalog = &self.fleet.catalog;
                catalog.reading_from_a_peer(key, etag, range, true);
                match self.read_from_peer(&peer, addr, key, etag, Some(range)).await {
                    Ok(PeerAnswer::Bytes(response)) => {
                        self.fleet.serving_range(key, &peer);
                        return Ok(response);
                    }
                    // This worker joined the fleet and takes the block over:
                    // from the store, which nobody else reads it from.
                    Ok(PeerAnswer::TakenOver) => break,
                    // It reads this block from a peer itself, or it is
                    // dropped now: the next source.
                    Ok(PeerAnswer::Elsewhere) | Err(StoreError::Transient { .. }) => {
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

    /// A block of a large object that a peer serves: waits until the peer
    /// has it landing (or says where to read it instead) before the read
    /// takes a request slot. Both workers wait for each other's blocks: had
    /// they waited in their slots, each could hold every slot of its own
    /// while the block it waits for waits for one, until the peer timeout
    /// bypassed the other and its blocks were read from the store twice.
    /// What the answer says is asked again by the read itself, at once.
    async fn ready(&self, key: &str, range: &Range<u64>, if_match: Option<&str>) {
        let Some(etag) = if_match else { return };
        if self.fleet.source_for(key).is_some() {
            return;
        }
        for peer in self.fleet.block_sources(key, range.start / self.block) {
            let Some(addr) = self.fleet.address(&peer).await else { return };
            match self.fleet.fetch(reqwest::Method::HEAD, &peer, addr, key, etag, Some(range)).await {
                // It reads this block from a peer itself: the next source.
                Ok(PeerAnswer::Elsewhere) => {}
                // It has it, it is this worker's, or the read finds out
                // what went wrong.
                Ok(PeerAnswer::Bytes(_) | PeerAnswer::TakenOver) | Err(_) => return,
            }
        }
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
