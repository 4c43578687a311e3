//! Fleet staging: the workers of one pull onto several nodes feed each
//! other. What the operator tells a worker about its peers ([`PeerOptions`],
//! the `--peer-*` flags), the secret they share, and the small wire protocol
//! between two stagers ([`wire`]), so that the server and the client are
//! written against one definition.
//!
//! Every worker owns a share of the dataset ([`PeerGroup::owner`]: the same
//! key hash as `--shard`), reads that share from the object store and serves
//! it; it fetches every other object from the object's owner, or from a
//! member standing in for an owner it bypassed ([`PeerGroup::sources`]). What a peer
//! serves is verified against the object store's checksum, exactly as a
//! direct read is, so a peer can make a transfer slower, never wrong.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// The port workers serve their peers on, unless told otherwise.
pub const DEFAULT_PEER_PORT: u16 = 9466;
/// The environment variable that carries the pod's IP (downward API) for
/// `--peer-listen`: the operator sets it, the flag names it as `$(POD_IP)`.
pub const POD_IP_ENV: &str = "POD_IP";
/// The environment variable that carries the peers' shared secret. A secret
/// is never a flag: flags show in `ps` and in the pod spec.
pub const PEER_TOKEN_ENV: &str = "FERRY_PEER_TOKEN";
/// The key of the peers' secret in the Secret the operator creates per
/// DataStage.
pub const PEER_TOKEN_KEY: &str = "token";
/// How long a worker waits for a peer that makes no progress, or does not
/// answer, before it reads that peer's share from the store.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a finished worker keeps serving peers that are still running.
pub const DEFAULT_PEER_LINGER: Duration = Duration::from_secs(600);

/// How a worker takes part in fleet staging. Without `--peer-group` a worker
/// has no peers and reads everything from the store.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
pub struct PeerOptions {
    /// Workers that stage this dataset together (comma-separated names; this
    /// worker is --worker); each reads its share from the store and the
    /// rest from the others.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', requires_all = ["worker", "peer_listen"]))]
    pub peer_group: Vec<String>,
    /// The members of --peer-group that read the dataset from the store
    /// between them (comma-separated; all of them by default). A worker
    /// that joins a running fleet is not one: the others divided the
    /// dataset among themselves before it came, so it reads from them what
    /// they read, and from the store what it takes over of theirs (objects
    /// they have not started) and what a peer that is bypassed or has
    /// exited leaves.
    #[cfg_attr(feature = "cli", arg(long, value_delimiter = ',', requires = "peer_group"))]
    pub peer_owners: Vec<String>,
    /// Serve this worker's staged objects to its peers on this address
    /// (the pod's own, never a wildcard: peers only). Requests must carry
    /// the secret in FERRY_PEER_TOKEN.
    #[cfg_attr(feature = "cli", arg(long, value_name = "ADDR"))]
    pub peer_listen: Option<SocketAddr>,
    /// A peer's address, NAME=HOST:PORT (repeatable). In a DataStage the
    /// addresses come from its status instead (with --report-to).
    #[cfg_attr(feature = "cli", arg(long = "peer", value_name = "NAME=ADDR"))]
    pub peers: Vec<PeerAddress>,
    /// Cap on bytes per second served to peers (e.g. 500MiB), so peers do
    /// not take the node's link from its own training job; unlimited by default.
    #[cfg_attr(feature = "cli", arg(long))]
    pub peer_serve_bandwidth: Option<ByteSize>,
    /// Read a peer's share from the store once the peer has not answered,
    /// or has made no progress, for this long.
    #[cfg_attr(feature = "cli", arg(long, default_value = "30s", value_parser = humantime::parse_duration))]
    pub peer_timeout: Duration,
    /// Once done, keep serving peers that are still running for at most this long.
    #[cfg_attr(feature = "cli", arg(long, default_value = "10m", value_parser = humantime::parse_duration))]
    pub peer_linger: Duration,
    /// Serve and ask peers over mutual TLS with the files in this directory
    /// (ca.crt, tls.crt, tls.key: a DataStage's peer Secret): only a worker
    /// whose certificate that CA signed is answered, and only such a peer
    /// is trusted. Without it peer traffic is plain HTTP with the secret.
    #[cfg_attr(feature = "cli", arg(long, value_name = "DIR"))]
    pub peer_tls: Option<PathBuf>,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self {
            peer_group: Vec::new(),
            peer_owners: Vec::new(),
            peer_listen: None,
            peers: Vec::new(),
            peer_serve_bandwidth: None,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            peer_linger: DEFAULT_PEER_LINGER,
            peer_tls: None,
        }
    }
}

/// Mutual TLS between the workers of one DataStage. The operator issues,
/// per DataStage, a CA and one certificate it signs (for [`SERVER_NAME`],
/// usable to serve and to ask) and keeps them in the DataStage's peer
/// Secret under these keys; a worker mounts them as the files of its
/// `--peer-tls` directory. The CA is the DataStage's identity: a worker
/// answers and trusts only certificates it signed, so a pod of another
/// DataStage, or one with no certificate, is refused at the handshake.
pub mod tls {
    /// The CA certificates a worker trusts (PEM; the current CA first).
    pub const CA_FILE: &str = "ca.crt";
    /// The certificate a worker serves and asks with (PEM).
    pub const CERT_FILE: &str = "tls.crt";
    /// That certificate's private key (PEM).
    pub const KEY_FILE: &str = "tls.key";
    /// The name in every peer certificate, checked in place of the address
    /// a worker connects to: pod IPs are not known when the certificate is
    /// issued, and the CA, not the name, says who belongs.
    pub const SERVER_NAME: &str = "peer.ferry.dev";
}

/// One peer's name and address: `NAME=HOST:PORT` on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAddress {
    /// The peer's worker name (a member of the peer group).
    pub name: String,
    /// Where it serves.
    pub addr: SocketAddr,
}

/// A `--peer` value that is not `NAME=HOST:PORT`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid peer '{0}': expected NAME=IP:PORT, e.g. node-a=10.0.0.7:9466")]
pub struct PeerAddressError(pub String);

impl std::str::FromStr for PeerAddress {
    type Err = PeerAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, addr) = s.split_once('=').ok_or_else(|| PeerAddressError(s.to_owned()))?;
        let addr = addr.parse().map_err(|_| PeerAddressError(s.to_owned()))?;
        if name.is_empty() {
            return Err(PeerAddressError(s.to_owned()));
        }
        Ok(Self { name: name.to_owned(), addr })
    }
}

impl std::fmt::Display for PeerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.name, self.addr)
    }
}

/// The workers of one dataset, in the order that assigns shares: every
/// member computes the same owner for every key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerGroup {
    members: Vec<String>,
}

impl PeerGroup {
    /// A group of these workers; order and duplicates do not matter.
    pub fn new(members: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        Self { members }
    }

    /// The members, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Which member reads `relative_key` from the store and serves it: the
    /// key's FNV-1a hash modulo the group's size, like `--shard`.
    pub fn owner(&self, relative_key: &str) -> Option<&str> {
        self.round_from(crate::hash::fnv1a(relative_key.as_bytes()), None).next()
    }

    /// The members the worker `me` may read `relative_key` from, in the
    /// order it asks them: the owner, then the members after it in the
    /// group's order up to `me` (every member, for a worker outside the
    /// group: one that joined a running fleet). Empty for the owner.
    ///
    /// The ones after the owner stand in for it where `me` has bypassed it
    /// and they have not: they read it from the store once, instead of
    /// every worker that bypassed the owner reading it. A worker asks only
    /// members before itself in this order, which is the same on every
    /// worker, so no two workers ever wait on each other for one object,
    /// whatever each has bypassed.
    pub fn sources(&self, relative_key: &str, me: &str) -> Vec<&str> {
        self.round_from(crate::hash::fnv1a(relative_key.as_bytes()), Some(me)).collect()
    }

    /// Which member reads block `block` (the `--part-size` range with that
    /// index) of an object fetched in ranges from the store and serves it,
    /// by the object's full key: its blocks go round the members, starting
    /// at a member the key picks, so every member reads and serves about an
    /// equal share of every large object. (Owning whole objects, 4 objects
    /// on 8 nodes left half the nodes idle and, once, one node the source
    /// of the whole dataset for every peer.)
    pub fn block_owner(&self, key: &str, block: u64) -> Option<&str> {
        self.round_from(self.first_for_block(key, block), None).next()
    }

    /// The members the worker `me` may read block `block` of `key` from, in
    /// the order it asks them: the block's owner, then the members after it
    /// up to `me`, as [`PeerGroup::sources`] orders them for a whole object.
    pub fn block_sources(&self, key: &str, block: u64, me: &str) -> Vec<&str> {
        self.round_from(self.first_for_block(key, block), Some(me)).collect()
    }

    /// Where the owners of `key`'s blocks start round the group: its blocks
    /// go round the members from a member the key picks.
    fn first_for_block(&self, key: &str, block: u64) -> u64 {
        let size = self.members.len().max(1) as u64;
        crate::hash::fnv1a(key.as_bytes()) % size + block % size
    }

    /// The members from the one at `start` (modulo the group's size) on, in
    /// order, round the group, stopping before `me` (all of them for none).
    fn round_from(&self, start: u64, me: Option<&str>) -> impl Iterator<Item = &str> {
        let size = self.members.len();
        let start = start.checked_rem(size as u64).unwrap_or(0) as usize;
        let me = me.and_then(|me| self.members.iter().position(|member| member == me));
        (0..size)
            .map(move |step| (start + step) % size)
            .take_while(move |at| Some(*at) != me)
            .map(|at| self.members[at].as_str())
    }
}

/// The HTTP protocol between two workers of one dataset. Every request
/// carries `Authorization: Bearer <secret>`; any other is answered 401.
/// Every request also names its asker in [`SPEAKER_HEADER`] (a
/// [`Speaker`]), and every answer past the secret check names the server
/// the same way, so that two workers of different releases find out at
/// their first exchange, and say so, instead of misreading each other.
pub mod wire {
    use std::net::SocketAddr;

    use serde::{Deserialize, Serialize};

    /// The version of this protocol. A server answers a request of another
    /// version (or without a [`SPEAKER_HEADER`]: a release before versions)
    /// with 400 and its own [`Speaker`]; the asker then bypasses it and
    /// says which versions met. Version 1 had no speaker header; version 2
    /// passed on any range it had written, whatever its source ([`SECOND_HAND`]);
    /// version 3 handed nothing over to a worker that joined
    /// ([`WaitAnswer::taken_over`]); version 4 handed over whole objects
    /// only, never blocks of a large one ([`TAKEN_OVER`]).
    pub const PROTOCOL: u32 = 5;
    /// The header that carries a [`Speaker`].
    pub const SPEAKER_HEADER: &str = "ferry-peer";

    /// Who sent a request or an answer: the protocol version it speaks,
    /// its worker name, and where it serves its peers. Written
    /// `v5 node-a@10.0.0.7:9466` (the address is left out while unknown).
    ///
    /// A request is evidence that its asker was running and serving where
    /// it says: a worker that has finished waits for its peers to finish,
    /// and a peer that asked it something and whose port is closed now has
    /// exited, rather than not started yet.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Speaker {
        /// The version of this protocol it speaks ([`PROTOCOL`]).
        pub protocol: u32,
        /// Its worker name.
        pub name: String,
        /// Its peer port's address, once bound.
        pub serves_at: Option<SocketAddr>,
    }

    impl Speaker {
        /// This release's speaker named `name`, serving at `serves_at`.
        pub fn new(name: &str, serves_at: Option<SocketAddr>) -> Self {
            Self { protocol: PROTOCOL, name: name.to_owned(), serves_at }
        }

        /// Whether it speaks this release's protocol.
        pub fn compatible(&self) -> bool {
            self.protocol == PROTOCOL
        }
    }

    impl std::fmt::Display for Speaker {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "v{} {}", self.protocol, self.name)?;
            match self.serves_at {
                Some(addr) => write!(f, "@{addr}"),
                None => Ok(()),
            }
        }
    }

    /// A [`SPEAKER_HEADER`] value that does not read as a [`Speaker`].
    #[derive(Debug, thiserror::Error, PartialEq, Eq)]
    #[error("invalid {SPEAKER_HEADER} header '{0}': expected vVERSION NAME[@IP:PORT], e.g. v5 node-a@10.0.0.7:9466")]
    pub struct SpeakerError(pub String);

    impl std::str::FromStr for Speaker {
        type Err = SpeakerError;

        fn from_str(s: &str) -> Result<Self, Self::Err> {
            let invalid = || SpeakerError(s.to_owned());
            let (version, who) = s.strip_prefix('v').and_then(|rest| rest.split_once(' ')).ok_or_else(invalid)?;
            let protocol = version.parse().map_err(|_| invalid())?;
            let (name, serves_at) = match who.split_once('@') {
                Some((name, addr)) => (name, Some(addr.parse().map_err(|_| invalid())?)),
                None => (who, None),
            };
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(invalid());
            }
            Ok(Self { protocol, name: name.to_owned(), serves_at })
        }
    }

    /// `GET`: the serving worker's [`PeerState`] as JSON.
    pub const STATE_PATH: &str = "/v1/state";
    /// `POST` a [`WaitRequest`] as JSON: the asker waits for the objects it
    /// reads from this worker, many per request, so two workers keep one
    /// long poll between them, not one per object. Answered 200 with a
    /// [`WaitAnswer`] once the worker holds, or will never hold, any of
    /// them, or when the long poll ([`WAIT_SECONDS`]) ends with none (ask
    /// again, and judge from `bytes_done` whether it is still making
    /// progress); 413 when the request names more than [`WAIT_MAX_OBJECTS`].
    pub const WAIT_PATH: &str = "/v1/wait";
    /// `GET ?key=K&etag=E` with an optional `Range: bytes=A-B`: the bytes
    /// of version `E` of `K` (200 or 206), or 404 when the worker does not
    /// hold that version. Of an object it is fetching now
    /// ([`WaitAnswer::landing`]), the body follows the writer; a range is
    /// answered once its first byte is written, or 404 when that is not
    /// within the asker's `--peer-timeout` (the worker's own, which the
    /// workers of one DataStage share), or [`SECOND_HAND`] when any of it
    /// comes from another peer, or [`TAKEN_OVER`] when the asker joined
    /// the fleet and takes the block over. Bytes the worker turns to
    /// another peer for after the answer started are sent once the object
    /// is verified.
    pub const OBJECT_PATH: &str = "/v1/object";
    /// The answer to an [`OBJECT_PATH`] request for bytes of an object
    /// landing that the worker is reading from another peer, not from the
    /// store: it passes on only what it read from the store itself, or
    /// verified whole, so that bytes a peer got wrong are caught at that
    /// peer's readers and blamed on it alone. Not a failure: the asker
    /// reads the range from its next source
    /// ([`super::PeerGroup::block_sources`]) or the store.
    pub const SECOND_HAND: u16 = 409;
    /// The answer to an [`OBJECT_PATH`] request for a range of an object
    /// landing, from a worker that joined the fleet, when the range is a
    /// block the worker has not started and hands over: the asker reads it
    /// from the store itself, and the worker reads it from the asker once
    /// it gets to that block (so the store is still read once). The asker
    /// asks nobody else for it.
    pub const TAKEN_OVER: u16 = 410;
    /// The longest a wait request is held before it is answered with
    /// nothing ready.
    pub const WAIT_SECONDS: u64 = 5;
    /// The most objects one wait request may name.
    pub const WAIT_MAX_OBJECTS: usize = 512;

    /// What a worker tells its peers about itself.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct PeerState {
        /// It has every object of the dataset in place: its run finished
        /// with no failures. It serves until its peers are done too.
        pub complete: bool,
        /// Its run ended, complete or not: what it does not hold now it
        /// never will.
        pub finished: bool,
        /// Bytes it has written in this run: objects in place and ranges
        /// of objects being fetched. Rises while it makes progress; a
        /// measure of progress, not of what it holds.
        pub bytes_done: u64,
    }

    /// The body of a [`WAIT_PATH`] request.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    pub struct WaitRequest {
        /// The objects waited for, each at the version the asker lists.
        pub objects: Vec<ObjectQuery>,
    }

    /// The answer to a [`WAIT_PATH`] request: which of the objects asked
    /// about are settled, by their index in [`WaitRequest::objects`].
    /// Objects in neither list are not held yet: ask again.
    #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub struct WaitAnswer {
        /// Held at the version asked for, verified and in place: read them
        /// from this worker.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub held: Vec<u32>,
        /// Being fetched now, at the version asked for: read them from this
        /// worker, range by range as they land (a range not written yet is
        /// answered when it is). Verified against the store's checksum for
        /// the whole object by the reader, as every peer's bytes are.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub landing: Vec<u32>,
        /// Never held in this run (it finished without them, or holds
        /// another version): read them from the store.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub never: Vec<u32>,
        /// Of the worker's own share, not started yet, handed over to the
        /// asker, a worker that joined after the owners divided the
        /// dataset: the asker reads them from the store, and the worker
        /// reads them from the asker. So what nobody has read yet is
        /// divided anew with whoever joins, and the store is still read
        /// once.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub taken_over: Vec<u32>,
        /// The worker's state when it answered.
        pub state: PeerState,
    }

    impl WaitAnswer {
        /// Whether anything asked about is settled.
        pub fn settles_any(&self) -> bool {
            !self.held.is_empty() || !self.landing.is_empty() || !self.never.is_empty() || !self.taken_over.is_empty()
        }
    }

    /// An object asked about: the query of [`OBJECT_PATH`], and an entry of
    /// a [`WaitRequest`].
    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    pub struct ObjectQuery {
        /// The object's key in the store.
        pub key: String,
        /// The version the asker lists in the store (its ETag).
        pub etag: String,
    }
}

/// What fleet staging did in one run: how much came from peers instead of
/// the store, and what this worker served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub struct PeerCounts {
    /// Bytes received from peers (and verified against the store's checksum).
    pub bytes_from_peers: u64,
    /// Objects received from peers.
    pub objects_from_peers: u64,
    /// Bytes this worker served to its peers.
    pub bytes_served: u64,
    /// Peers dropped: unreachable, stalled beyond the deadline, or caught
    /// serving bytes that did not match the store's checksum.
    pub peer_failures: u64,
}

impl PeerCounts {
    /// Nothing came from or went to peers.
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn peer_addresses_round_trip_and_bad_ones_are_refused() {
        let peer: PeerAddress = "node-a=10.0.0.7:9466".parse().unwrap();
        assert_eq!(peer.name, "node-a");
        assert_eq!(peer.to_string().parse::<PeerAddress>().unwrap(), peer);
        for bad in ["node-a", "=10.0.0.7:1", "a=10.0.0.7", "a=host:1"] {
            assert!(bad.parse::<PeerAddress>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_worker_asks_the_owner_then_the_members_between_it_and_the_owner() {
        let group = PeerGroup::new(["a", "b", "c", "d"]);
        let owner = group.owner("k").unwrap();
        let at = group.members().iter().position(|m| m == owner).unwrap();
        let nth = |n: usize| group.members()[(at + n) % 4].as_str();
        assert!(group.sources("k", nth(0)).is_empty(), "the owner reads the store");
        assert_eq!(group.sources("k", nth(1)), [nth(0)]);
        assert_eq!(group.sources("k", nth(3)), [nth(0), nth(1), nth(2)]);
        assert_eq!(group.sources("k", "e"), [nth(0), nth(1), nth(2), nth(3)]);
        // Blocks go round from the key's first owner, one member per block.
        let first = group.block_owner("k", 0).unwrap();
        let at = group.members().iter().position(|m| m == first).unwrap();
        assert_eq!(group.block_owner("k", 5), Some(group.members()[(at + 5) % 4].as_str()));
        assert_eq!(group.block_sources("k", 1, first).len(), 3, "all but itself: it owns the block before");
        assert!(PeerGroup::new(Vec::<String>::new()).block_sources("k", 1, "a").is_empty());
    }

    #[test]
    fn wire_state_round_trips_as_json() {
        let state = wire::PeerState { complete: true, finished: true, bytes_done: 42 };
        let json = serde_json::to_string(&state).unwrap();
        assert_eq!(json, r#"{"complete":true,"finished":true,"bytesDone":42}"#);
        assert_eq!(serde_json::from_str::<wire::PeerState>(&json).unwrap(), state);
    }

    #[test]
    fn wait_requests_and_answers_round_trip_as_json() {
        let request = wire::WaitRequest {
            objects: vec![
                wire::ObjectQuery { key: "p/a".into(), etag: "\"e1\"".into() },
                wire::ObjectQuery { key: "p/é b".into(), etag: "e2-3".into() },
            ],
        };
        let json = serde_json::to_string(&request).unwrap();
        assert_eq!(json, r#"{"objects":[{"key":"p/a","etag":"\"e1\""},{"key":"p/é b","etag":"e2-3"}]}"#);
        assert_eq!(serde_json::from_str::<wire::WaitRequest>(&json).unwrap(), request);

        let state = wire::PeerState { complete: false, finished: false, bytes_done: 7 };
        let answer = wire::WaitAnswer { held: vec![1], landing: vec![2], never: vec![0], taken_over: vec![3], state };
        let json = serde_json::to_string(&answer).unwrap();
        assert_eq!(
            json,
            r#"{"held":[1],"landing":[2],"never":[0],"takenOver":[3],"state":{"complete":false,"finished":false,"bytesDone":7}}"#
        );
        assert_eq!(serde_json::from_str::<wire::WaitAnswer>(&json).unwrap(), answer);
        assert!(answer.settles_any());
        let only_landing = wire::WaitAnswer { landing: vec![0], state, ..wire::WaitAnswer::default() };
        assert!(only_landing.settles_any(), "an object landing is read from the peer now");
        let only_taken = wire::WaitAnswer { taken_over: vec![0], state, ..wire::WaitAnswer::default() };
        assert!(only_taken.settles_any(), "an object taken over is read from the store now");

        // Nothing settled: only the state goes over the wire.
        let waiting = wire::WaitAnswer { state, ..wire::WaitAnswer::default() };
        let json = serde_json::to_string(&waiting).unwrap();
        assert_eq!(json, r#"{"state":{"complete":false,"finished":false,"bytesDone":7}}"#);
        assert_eq!(serde_json::from_str::<wire::WaitAnswer>(&json).unwrap(), waiting);
        assert!(!waiting.settles_any());
    }

    #[test]
    fn speakers_round_trip_and_bad_ones_are_refused() {
        let speaker = wire::Speaker::new("node-a", Some("10.0.0.7:9466".parse().unwrap()));
        assert_eq!(speaker.to_string(), format!("v{} node-a@10.0.0.7:9466", wire::PROTOCOL));
        assert_eq!(speaker.to_string().parse::<wire::Speaker>().unwrap(), speaker);
        assert!(speaker.compatible());
        let starting = wire::Speaker::new("node-b", None);
        assert_eq!(starting.to_string().parse::<wire::Speaker>().unwrap(), starting);
        let ipv6: wire::Speaker = "v2 n@[fd00::7]:9466".parse().unwrap();
        assert_eq!(ipv6.serves_at, Some("[fd00::7]:9466".parse().unwrap()));
        // The next release reads as itself, and as not compatible.
        let next: wire::Speaker = format!("v{} node-c", wire::PROTOCOL + 1).parse().unwrap();
        assert!(!next.compatible());
        for bad in ["", "node-a", "2 node-a", "v2", "vx node-a", "v2 ", "v2 a@host:1", "v2 a b", "v2 @10.0.0.1:1"] {
            assert!(bad.parse::<wire::Speaker>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        /// Any speaker a worker can be reads back as itself.
        #[test]
        fn any_speaker_round_trips(
            protocol in 0u32..1000,
            name in "[a-z0-9][a-z0-9.-]{0,40}",
            // An address as a pod has one: no IPv6 flow label or scope.
            addr in proptest::option::of((any::<std::net::IpAddr>(), any::<u16>())),
        ) {
            let serves_at = addr.map(std::net::SocketAddr::from);
            let speaker = wire::Speaker { protocol, name, serves_at };
            prop_assert_eq!(speaker.to_string().parse::<wire::Speaker>().unwrap(), speaker);
        }

        /// Whichever members two workers have bypassed, neither ever asks
        /// the other for an object or block the other asks it for: a worker
        /// asks only members before itself in one order every worker
        /// shares, starting at the owner. A worker outside the group (one
        /// that joined a running fleet) may ask every member, and none asks it.
        #[test]
        fn no_two_workers_ask_each_other_for_the_same_bytes(
            names in proptest::collection::btree_set("[a-z]{1,6}", 1..17),
            key in "[a-z0-9/]{1,30}",
            block in 0u64..1000,
        ) {
            let group = PeerGroup::new(names.clone());
            for me in &names {
                let (whole, blocks) = (group.sources(&key, me), group.block_sources(&key, block, me));
                for (asked, owner) in [(&whole, group.owner(&key)), (&blocks, group.block_owner(&key, block))] {
                    prop_assert_eq!(asked.is_empty(), owner == Some(me.as_str()), "only the owner asks nobody");
                    prop_assert!(asked.first().is_none_or(|first| Some(*first) == owner), "the owner is asked first");
                    prop_assert!(!asked.contains(&me.as_str()));
                }
                for other in whole.iter().filter(|o| *o != me) {
                    prop_assert!(!group.sources(&key, other).contains(&me.as_str()), "{me} and {other} ask each other");
                }
                for other in blocks.iter().filter(|o| *o != me) {
                    prop_assert!(!group.block_sources(&key, block, other).contains(&me.as_str()));
                }
            }
            let joiner = group.block_sources(&key, block, "a-joiner-with-a-long-name");
            prop_assert_eq!(joiner.len(), names.len(), "a joiner may ask every member");
            prop_assert_eq!(joiner.first().copied(), group.block_owner(&key, block));
        }

        /// The blocks of a large object are shared out evenly: of any
        /// run of blocks, each member owns the same number, give or take one.
        #[test]
        fn every_member_owns_an_even_share_of_a_large_object(
            names in proptest::collection::btree_set("[a-z]{1,6}", 1..17),
            key in "[a-z0-9/]{1,30}",
            first in 0u64..1000,
            blocks in 1u64..200,
        ) {
            let group = PeerGroup::new(names.clone());
            let mut owned = std::collections::BTreeMap::<&str, u64>::new();
            for block in first..first + blocks {
                *owned.entry(group.block_owner(&key, block).unwrap()).or_default() += 1;
            }
            let fewest = if owned.len() < names.len() { 0 } else { *owned.values().min().unwrap() };
            let most = *owned.values().max().unwrap();
            prop_assert!(most - fewest <= 1, "{owned:?}");
            prop_assert_eq!(owned.values().sum::<u64>(), blocks);
        }

        /// Every member computes the same owner whatever order it was told
        /// the group in, and the owners split keys between all members.
        #[test]
        fn every_member_agrees_on_the_owner(
            mut names in proptest::collection::btree_set("[a-z]{1,6}", 1..8).prop_map(|s| s.into_iter().collect::<Vec<_>>()),
            keys in proptest::collection::vec("[a-z0-9/]{1,20}", 1..50),
        ) {
            let group = PeerGroup::new(names.clone());
            names.reverse();
            let reversed = PeerGroup::new(names.clone());
            for key in &keys {
                let owner = group.owner(key).unwrap();
                prop_assert_eq!(Some(owner), reversed.owner(key));
                prop_assert!(names.iter().any(|n| n == owner));
            }
        }
    }
}
