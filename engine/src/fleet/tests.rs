//! Workers of one fleet against an in-memory store, each with its own
//! directory and its own peer port on loopback: the dataset is read from the
//! store about once, every node ends with all of it, and peers that are
//! gone or lie cost time, never bytes on disk.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ferry_contract::Summary;
use ferry_contract::peers::{PeerOptions, wire};
use tokio::sync::watch;

use super::tls::PeerTls;
use super::{Fleet, server};
use crate::metrics::Metrics;
use crate::store::memory::MemoryStore;
use crate::transfer::{Engine, RetryPolicy, TransferConfig, pull::pull};

const TOKEN: &str = "the-datastage-secret";

/// Objects of assorted sizes under `p/`, some larger than one range.
fn dataset() -> (Arc<MemoryStore>, BTreeMap<String, Vec<u8>>) {
    let store = Arc::new(MemoryStore::default());
    let mut objects = BTreeMap::new();
    for i in 0..24u32 {
        let size = match i % 4 {
            0 => 0,
            1 => 1 + i as usize * 37,
            2 => 70_000 + i as usize,
            _ => (2 << 20) + 3 * i as usize,
        };
        let data: Vec<u8> = (0..size).map(|b| (b as u32 * 31 + i) as u8).collect();
        store.insert(&format!("p/dir{}/obj-{i}", i % 3), data.clone());
        objects.insert(format!("dir{}/obj-{i}", i % 3), data);
    }
    (store, objects)
}

fn total(objects: &BTreeMap<String, Vec<u8>>) -> u64 {
    objects.values().map(|d| d.len() as u64).sum()
}

/// The names `name(0)`, `name(1)`, … that the group of `members` gives
/// `owner` to read from the store, in order.
fn keys_owned_by(members: &[&str], owner: &'static str, name: impl Fn(u32) -> String) -> impl Iterator<Item = String> {
    let group = ferry_contract::PeerGroup::new(members.iter().copied());
    (0..).map(name).filter(move |key| group.owner(key) == Some(owner))
}

/// `len` bytes that do not repeat with any range or write buffer; `shift`
/// makes objects differ.
fn patterned(len: u32, shift: u32) -> Vec<u8> {
    (0..len).map(|b| (b.wrapping_mul(2_654_435_761) >> shift) as u8).collect()
}

/// The bytes `member` of the group of `members` reads from the store: the
/// objects of one range it owns, and its blocks of larger ones (of the
/// [`config`]'s part size; objects are under `p/`).
fn share(objects: &BTreeMap<String, Vec<u8>>, members: &[&str], member: &str) -> u64 {
    let group = ferry_contract::PeerGroup::new(members.iter().copied());
    let block = config().part_size;
    let mut bytes = 0;
    for (rel, data) in objects {
        let size = data.len() as u64;
        if size <= block {
            bytes += if group.owner(rel) == Some(member) { size } else { 0 };
            continue;
        }
        for (index, start) in (0..).zip((0..size).step_by(block as usize)) {
            if group.block_owner(&format!("p/{rel}"), index) == Some(member) {
                bytes += block.min(size - start);
            }
        }
    }
    bytes
}

fn config() -> TransferConfig {
    TransferConfig {
        concurrency: 4,
        part_size: 1 << 20,
        retry: RetryPolicy { base_delay: Duration::from_millis(1), ..RetryPolicy::default() },
        ..TransferConfig::default()
    }
}

fn options(group: &[&str]) -> PeerOptions {
    PeerOptions {
        peer_group: group.iter().map(|s| (*s).to_owned()).collect(),
        // Above the long poll's 5 s, as the default is: a peer that answers
        // "not yet" must have had time to make progress.
        peer_timeout: Duration::from_secs(10),
        peer_linger: Duration::from_secs(20),
        ..PeerOptions::default()
    }
}

/// A worker `me` of `group`, serving on a loopback port it publishes in `directory`.
async fn worker(
    store: &Arc<MemoryStore>,
    me: &str,
    group: &[&str],
    directory: &watch::Sender<BTreeMap<String, SocketAddr>>,
) -> (Arc<Engine>, Arc<Fleet>) {
    worker_until(store, me, group, directory, std::future::pending()).await
}

/// [`worker`] whose port closes when `shutdown` completes, as when its process exits.
async fn worker_until(
    store: &Arc<MemoryStore>,
    me: &str,
    group: &[&str],
    directory: &watch::Sender<BTreeMap<String, SocketAddr>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Arc<Engine>, Arc<Fleet>) {
    worker_with(store, me, &options(group), directory, shutdown).await
}

/// [`worker_until`] with these peer options.
async fn worker_with(
    store: &Arc<MemoryStore>,
    me: &str,
    options: &PeerOptions,
    directory: &watch::Sender<BTreeMap<String, SocketAddr>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Arc<Engine>, Arc<Fleet>) {
    worker_configured(store, me, options, config(), directory, shutdown).await
}

/// [`worker_with`] whose engine runs with `config`.
async fn worker_configured(
    store: &Arc<MemoryStore>,
    me: &str,
    options: &PeerOptions,
    config: TransferConfig,
    directory: &watch::Sender<BTreeMap<String, SocketAddr>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (Arc<Engine>, Arc<Fleet>) {
    let metrics = Arc::new(Metrics::new());
    let fleet = Fleet::new(me, options, Some(TOKEN.into()), directory.subscribe(), Arc::clone(&metrics))
        .unwrap()
        .expect("a group");
    let addr = server::serve(Arc::clone(&fleet), "127.0.0.1:0".parse().unwrap(), shutdown).await.unwrap();
    directory.send_modify(|peers| {
        peers.insert(me.to_owned(), addr);
    });
    let engine = Engine::in_fleet(Arc::clone(store) as _, config, metrics, Arc::clone(&fleet)).unwrap();
    (engine, fleet)
}

fn assert_staged(dir: &Path, objects: &BTreeMap<String, Vec<u8>>) {
    for (rel, data) in objects {
        let on_disk = std::fs::read(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        assert!(on_disk == *data, "{rel} differs from the store's bytes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_read_the_dataset_from_the_store_once_and_each_ends_with_all_of_it() {
    three_workers_stage_the_dataset(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_with_certificates_of_one_ca_stage_the_dataset_over_mutual_tls() {
    let (ca, dir) = (ferry_testkit::PeerCa::new(), tempfile::tempdir().unwrap());
    ca.write_peer_dir(dir.path());
    let fleets = three_workers_stage_the_dataset(Some(dir.path())).await;
    assert!(fleets.iter().all(|fleet| fleet.tls.is_some()));
}

/// Three workers (with `--peer-tls` at `tls`) stage [`dataset`]: the store
/// is read once, every node has all of it, no peer is bypassed.
async fn three_workers_stage_the_dataset(tls: Option<&Path>) -> Vec<Arc<Fleet>> {
    let (store, objects) = dataset();
    let group = ["node-a", "node-b", "node-c"];
    let directory = watch::Sender::new(BTreeMap::new());
    let dirs: Vec<_> = group.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let options = PeerOptions { peer_tls: tls.map(Path::to_path_buf), ..options(&group) };
    let mut workers = Vec::new();
    for me in group {
        workers.push(worker_with(&store, me, &options, &directory, std::future::pending()).await);
    }
    let fleets: Vec<Arc<Fleet>> = workers.iter().map(|(_, fleet)| Arc::clone(fleet)).collect();
    for (summary, dir) in stage_all(workers, &dirs).await.into_iter().zip(&dirs) {
        assert!(summary.complete, "{summary:?}");
        assert!(summary.peers.objects_from_peers > 0, "{:?}", summary.peers);
        assert_eq!(summary.peers.peer_failures, 0, "{:?}", summary.peers);
        assert_staged(dir.path(), &objects);
    }
    let read = store.calls().get_bytes;
    assert_eq!(read, total(&objects), "the store was read {read} bytes for a {} B dataset", total(&objects));
    fleets
}

/// Runs every worker's pull into its directory, then its linger, all at
/// once; their summaries, in order.
async fn stage_all(workers: Vec<(Arc<Engine>, Arc<Fleet>)>, dirs: &[tempfile::TempDir]) -> Vec<Summary> {
    let runs = workers.into_iter().zip(dirs).map(|((engine, fleet), dir)| {
        let dir = dir.path().to_path_buf();
        tokio::spawn(async move {
            let summary = pull(engine, "p/", &dir, false).await.unwrap();
            fleet.linger().await;
            summary
        })
    });
    futures::future::join_all(runs).await.into_iter().map(Result::unwrap).collect()
}

/// How many requests and handshakes `fleet`'s port refused.
fn refused_at(fleet: &Fleet) -> u64 {
    let text = fleet.metrics.encode();
    let line = text.lines().find(|l| l.starts_with("ferry_stager_peer_refused_requests_total ")).expect("the series");
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_tls_peer_port_answers_only_clients_with_a_certificate_of_its_ca_and_the_secret() {
    let (store, _) = dataset();
    let (ca, other_ca) = (ferry_testkit::PeerCa::new(), ferry_testkit::PeerCa::new());
    let dir = tempfile::tempdir().unwrap();
    ca.write_peer_dir(dir.path());
    let options = PeerOptions { peer_tls: Some(dir.path().to_path_buf()), ..options(&["node-a"]) };
    let directory = watch::Sender::new(BTreeMap::new());
    let (_engine, fleet) = worker_with(&store, "node-a", &options, &directory, std::future::pending()).await;
    let addr = directory.borrow()["node-a"];
    let speaker = wire::Speaker::new("node-b", None).to_string();
    let state = |scheme: &str, client: &reqwest::Client| {
        client
            .get(format!("{scheme}://{addr}{}", wire::STATE_PATH))
            .bearer_auth(TOKEN)
            .header(wire::SPEAKER_HEADER, &speaker)
            .send()
    };
    // Plain HTTP gets no HTTP answer at all: the port speaks only TLS.
    let plain = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(state("http", &plain).await.is_err(), "plain HTTP was answered");
    // TLS without a certificate, or with another CA's (another
    // DataStage's), even one for the peer name and with the secret: refused.
    let (other_cert, other_key) = other_ca.issue(ferry_contract::peers::tls::SERVER_NAME);
    let anonymous = reqwest::Client::builder().no_proxy().tls_danger_accept_invalid_certs(true).build().unwrap();
    let other = reqwest::Client::builder()
        .no_proxy()
        .tls_danger_accept_invalid_certs(true)
        .identity(reqwest::Identity::from_pem(format!("{other_cert}{other_key}").as_bytes()).unwrap())
        .build()
        .unwrap();
    for (client, who) in [(&anonymous, "no certificate"), (&other, "another CA's certificate")] {
        let before = refused_at(&fleet);
        assert!(state("https", client).await.is_err(), "{who} was answered");
        // The port counts the refusal once the handshake has failed there.
        for _ in 0..100 {
            if refused_at(&fleet) > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(refused_at(&fleet), before + 1, "{who}");
    }
    // A worker of the same DataStage (the same CA) is answered, and still
    // only with the secret.
    let member = PeerTls::load(dir.path()).unwrap();
    let member = reqwest::Client::builder().no_proxy().tls_backend_preconfigured(member.client).build().unwrap();
    assert_eq!(state("https", &member).await.unwrap().status(), 200);
    let without_secret = member.get(format!("https://{addr}{}", wire::STATE_PATH)).send().await.unwrap();
    assert_eq!(without_secret.status(), 401);
    // And a worker with another CA's files does not trust this one.
    let other_dir = tempfile::tempdir().unwrap();
    other_ca.write_peer_dir(other_dir.path());
    let stranger = PeerTls::load(other_dir.path()).unwrap();
    let stranger = reqwest::Client::builder().no_proxy().tls_backend_preconfigured(stranger.client).build().unwrap();
    let error = state("https", &stranger).await.unwrap_err();
    assert!(super::tls::is_tls_failure(&error), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_to_the_peer_port_is_capped_and_serving_resumes_once_it_ends() {
    let ca = ferry_testkit::PeerCa::new();
    let dir = tempfile::tempdir().unwrap();
    ca.write_peer_dir(dir.path());
    let options = PeerOptions { peer_tls: Some(dir.path().to_path_buf()), ..options(&["node-a"]) };
    let metrics = Arc::new(Metrics::new());
    let fleet =
        Fleet::new("node-a", &options, Some(TOKEN.into()), watch::Sender::new(BTreeMap::new()).subscribe(), metrics)
            .unwrap()
            .expect("a group");
    // A small cap, so the test holds few descriptors; the port's is
    // server::MAX_CONNECTIONS.
    const CAP: usize = 16;
    let addr = server::serve_capped(Arc::clone(&fleet), "127.0.0.1:0".parse().unwrap(), std::future::pending(), CAP)
        .await
        .unwrap();
    // Connections that never handshake, as a tenant's flood would open.
    let mut flood = Vec::new();
    for _ in 0..CAP {
        flood.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Past the cap a connection is closed at once: its read ends without a
    // byte, rather than the port holding a task and a handshake for it.
    let refused_before = refused_at(&fleet);
    let mut over = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut over, &mut byte)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "the connection over the cap was held open: {read:?}");
    assert!(refused_at(&fleet) > refused_before, "the refusal is counted");
    // Once the flood's connections close, a member is served again.
    drop(flood);
    let member = PeerTls::load(dir.path()).unwrap();
    let member = reqwest::Client::builder().no_proxy().tls_backend_preconfigured(member.client).build().unwrap();
    let speaker = wire::Speaker::new("node-b", None).to_string();
    let mut status = None;
    for _ in 0..100 {
        let answer = member
            .get(format!("https://{addr}{}", wire::STATE_PATH))
            .bearer_auth(TOKEN)
            .header(wire::SPEAKER_HEADER, &speaker)
            .send()
            .await;
        if let Ok(answer) = answer {
            status = Some(answer.status());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, Some(reqwest::StatusCode::OK));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_with_certificates_of_different_cas_bypass_each_other_at_once() {
    let (store, objects) = dataset();
    let group = ["node-a", "node-b"];
    let directory = watch::Sender::new(BTreeMap::new());
    let mut runs = Vec::new();
    let mut dirs = Vec::new();
    for me in group {
        let tls = tempfile::tempdir().unwrap();
        ferry_testkit::PeerCa::new().write_peer_dir(tls.path());
        let options = PeerOptions { peer_tls: Some(tls.path().to_path_buf()), ..options(&group) };
        let (engine, fleet) = worker_with(&store, me, &options, &directory, std::future::pending()).await;
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().to_path_buf();
        dirs.push((dir, tls));
        runs.push(tokio::spawn(async move {
            let summary = pull(engine, "p/", &target, false).await.unwrap();
            fleet.linger().await;
            summary
        }));
    }
    let started = tokio::time::Instant::now();
    for (run, (dir, _)) in runs.into_iter().zip(&dirs) {
        let summary = run.await.unwrap();
        assert!(summary.complete, "{summary:?}");
        assert_eq!((summary.peers.peer_failures, summary.peers.bytes_from_peers), (1, 0), "{:?}", summary.peers);
        assert_staged(dir.path(), &objects);
    }
    // Neither waited out the peer timeout (10 s) for the other, staging or
    // lingering: a failed handshake is a refusal, not a port still closed.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_serves_corrupted_bytes_is_dropped_and_the_object_read_from_the_store() {
    let (store, objects) = dataset();
    let group = ["node-a", "node-b"];
    // node-a staged everything earlier; then a byte of one of its files
    // rotted on disk, size and time unchanged, so node-a still offers it.
    let dir_a = tempfile::tempdir().unwrap();
    pull(Engine::new(Arc::clone(&store) as _, config(), Arc::new(Metrics::new())).unwrap(), "p/", dir_a.path(), false)
        .await
        .unwrap();
    let probe = ferry_contract::PeerGroup::new(group);
    let rotted = objects
        .iter()
        .find(|(rel, data)| probe.owner(rel) == Some("node-a") && data.len() > 1000)
        .map(|(rel, _)| dir_a.path().join(rel))
        .expect("node-a owns a large object");
    let mtime = std::fs::metadata(&rotted).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&rotted).unwrap();
    bytes[500] ^= 0x5a;
    std::fs::write(&rotted, &bytes).unwrap();
    std::fs::File::options().write(true).open(&rotted).unwrap().set_modified(mtime).unwrap();

    let directory = watch::Sender::new(BTreeMap::new());
    let (engine_a, fleet_a) = worker(&store, "node-a", &group, &directory).await;
    let (engine_b, fleet_b) = worker(&store, "node-b", &group, &directory).await;
    let dir_b = tempfile::tempdir().unwrap();
    let (a, b) = tokio::join!(
        async {
            pull(engine_a, "p/", dir_a.path(), false).await.unwrap();
            fleet_a.linger().await;
        },
        async {
            let summary = pull(engine_b, "p/", dir_b.path(), false).await.unwrap();
            fleet_b.linger().await;
            summary
        },
    );
    let () = a;
    assert!(b.complete, "{b:?}");
    assert_eq!(b.peers.peer_failures, 1, "{:?}", b.peers);
    assert_staged(dir_b.path(), &objects);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_is_gone_or_never_answers_costs_a_deadline_not_the_run() {
    let (store, objects) = dataset();
    // node-b's published address refuses connections; node-c's accepts
    // and never says a word.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            open.push(socket);
        }
    });
    let directory = watch::Sender::new(BTreeMap::from([("node-b".into(), closed), ("node-c".into(), silent_addr)]));
    let (engine, fleet) = worker(&store, "node-a", &["node-a", "node-b", "node-c"], &directory).await;
    let dir = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let summary = pull(engine, "p/", dir.path(), false).await.unwrap();
    let lingering = std::time::Instant::now();
    fleet.linger().await;
    let lingered = lingering.elapsed();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.peers.peer_failures, 2, "{:?}", summary.peers);
    assert_eq!(summary.peers.objects_from_peers, 0);
    assert_staged(dir.path(), &objects);
    // The silent peer costs one long poll plus the timeout: bounded,
    // whatever the dataset. Both were bypassed as unreachable at the
    // addresses they still have, so lingering does not wait the timeout
    // (10 s) for them again.
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());
    assert!(lingered < Duration::from_secs(5), "lingered {lingered:?} for peers found unreachable");

    // One of them comes back at a new address (a replaced pod): that one
    // is waited for again, until it has been silent for the timeout.
    let replaced = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    directory.send_modify(|peers| {
        peers.insert("node-b".into(), replaced);
    });
    let lingering = std::time::Instant::now();
    fleet.linger().await;
    assert!(lingering.elapsed() >= Duration::from_secs(9), "waited {:?} for the replaced peer", lingering.elapsed());
}

/// The model-shape finding (docs/benchmarks.md): of workers that finish
/// at different times, the first ones exit once the rest are complete; a
/// worker that then lingers must not wait the peer timeout for one whose
/// port closed after it answered all run long.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_answered_and_then_exited_is_not_waited_for() {
    let (store, objects) = dataset();
    let pair = ["node-a", "node-b"];
    let directory = watch::Sender::new(BTreeMap::new());
    let (stop_a, stopped_a) = tokio::sync::oneshot::channel::<()>();
    let (engine_a, _fleet_a) = worker_until(&store, "node-a", &pair, &directory, async {
        stopped_a.await.ok();
    })
    .await;
    let addr_a = directory.borrow()["node-a"];
    let (engine_b, fleet_b) = worker(&store, "node-b", &pair, &directory).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(pull(engine_a, "p/", dir_a.path(), false), pull(engine_b, "p/", dir_b.path(), false));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.complete && b.complete, "{a:?} {b:?}");
    assert!(b.peers.objects_from_peers > 0, "node-b was served by node-a: {:?}", b.peers);

    // node-a exits: its port closes at the address it answered from, and
    // nobody has told node-b (discovery may not have seen it yet).
    lingers_briefly_once_it_exits(stop_a, addr_a, &fleet_b).await;
    assert_staged(dir_b.path(), &objects);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_only_asked_and_then_exited_is_not_waited_for() {
    // Every object is node-a's: node-a never asks node-b anything, and
    // node-b never answers node-a. Only node-b's requests show node-a that
    // node-b was running (what most workers of a fleet with a few large
    // objects are: they own nothing).
    let pair = ["node-a", "node-b"];
    let group = ferry_contract::PeerGroup::new(pair);
    let store = Arc::new(MemoryStore::default());
    let mut objects = BTreeMap::new();
    for i in (0..40u32).filter(|i| group.owner(&format!("k{i}")) == Some("node-a")).take(6) {
        let data = vec![i as u8; 1000 + i as usize];
        store.insert(&format!("p/k{i}"), data.clone());
        objects.insert(format!("k{i}"), data);
    }
    let directory = watch::Sender::new(BTreeMap::new());
    let (engine_a, fleet_a) = worker(&store, "node-a", &pair, &directory).await;
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let (engine_b, _fleet_b) = worker_until(&store, "node-b", &pair, &directory, async {
        stopped_b.await.ok();
    })
    .await;
    let addr_b = directory.borrow()["node-b"];
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(pull(engine_a, "p/", dir_a.path(), false), pull(engine_b, "p/", dir_b.path(), false));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.complete && b.complete, "{a:?} {b:?}");
    assert_eq!(b.peers.objects_from_peers, objects.len() as u64, "{:?}", b.peers);
    assert_staged(dir_b.path(), &objects);

    // node-b exits before node-a starts to linger.
    lingers_briefly_once_it_exits(stop_b, addr_b, &fleet_a).await;
}

/// Stops the peer serving at `addr` (through `stop`), waits for its port to
/// close, and asserts that `lingering` then stops lingering well before the
/// peer timeout (10 s).
async fn lingers_briefly_once_it_exits(stop: tokio::sync::oneshot::Sender<()>, addr: SocketAddr, lingering: &Fleet) {
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while tokio::net::TcpStream::connect(addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the peer's port closes");
    let started = std::time::Instant::now();
    lingering.linger().await;
    let lingered = started.elapsed();
    assert!(lingered < Duration::from_secs(5), "lingered {lingered:?}, not the 10 s timeout, for a peer that exited");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_large_object_flows_to_peers_range_by_range_while_its_owner_still_fetches_it() {
    // One object of 24 ranges, from a store that takes 150 ms per request:
    // each worker reads the blocks it owns (every other one) from the
    // store, four at a time, and the rest from the other as they land.
    let pair = ["node-a", "node-b"];
    let rel = keys_owned_by(&pair, "node-a", |i| format!("model-{i}.safetensors")).next().unwrap();
    let key = format!("p/{rel}");
    let data = patterned(24 << 20, 13);
    let store = Arc::new(MemoryStore::default());
    store.insert(&key, data.clone());
    let etag = crate::store::ObjectStore::head(&*store, &key).await.unwrap().0.etag.unwrap();
    store.delay_gets(Duration::from_millis(150));
    let objects = BTreeMap::from([(rel, data.clone())]);

    let directory = watch::Sender::new(BTreeMap::new());
    let (engine_a, fleet_a) = worker(&store, "node-a", &pair, &directory).await;
    let (engine_b, fleet_b) = worker(&store, "node-b", &pair, &directory).await;
    // Whether node-b had bytes of the object from node-a while node-a was
    // still fetching it, sampled.
    let overlapped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampling = tokio::spawn({
        let (fleet_a, fleet_b, overlapped, key) =
            (Arc::clone(&fleet_a), Arc::clone(&fleet_b), overlapped.clone(), key.clone());
        async move {
            loop {
                let landing = matches!(fleet_a.catalog.holding(&key, &etag), super::catalog::Holding::Landing(_));
                if landing && fleet_b.counts().bytes_from_peers > 0 {
                    overlapped.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(pull(engine_a, "p/", dir_a.path(), false), pull(engine_b, "p/", dir_b.path(), false));
    sampling.abort();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.complete && b.complete, "{a:?} {b:?}");
    assert_staged(dir_a.path(), &objects);
    assert_staged(dir_b.path(), &objects);
    assert_eq!(a.peers.peer_failures + b.peers.peer_failures, 0, "{:?} {:?}", a.peers, b.peers);
    // Each read its own blocks from the store and the other's from the other.
    let (of_a, of_b) = (share(&objects, &pair, "node-a"), share(&objects, &pair, "node-b"));
    assert_eq!(of_a + of_b, data.len() as u64);
    assert!(of_a > 0 && of_b > 0, "both own blocks: {of_a} {of_b}");
    assert_eq!((a.peers.bytes_from_peers, b.peers.bytes_from_peers), (of_b, of_a), "{:?} {:?}", a.peers, b.peers);
    assert_eq!(store.calls().get_bytes, data.len() as u64, "the store sent it once");
    assert!(
        overlapped.load(std::sync::atomic::Ordering::Relaxed),
        "node-b received no range before node-a had the whole object"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_of_one_range_flows_to_peers_while_its_owner_still_fetches_it() {
    // An object smaller than one range, from a store whose body arrives
    // 64 KiB per 40 ms (0.6 s in all): its owner reads it in one GET, and
    // the other worker reads it from the owner's file as each write lands,
    // not after the owner has the whole object.
    let pair = ["node-a", "node-b"];
    let rel = keys_owned_by(&pair, "node-a", |i| format!("shard-{i}.bin")).next().unwrap();
    let key = format!("p/{rel}");
    let data = patterned(960 << 10, 11);
    assert!((data.len() as u64) < config().part_size);
    let store = Arc::new(MemoryStore::default());
    store.insert(&key, data.clone());
    let etag = crate::store::ObjectStore::head(&*store, &key).await.unwrap().0.etag.unwrap();
    store.trickle_gets(Duration::from_millis(40));
    let objects = BTreeMap::from([(rel, data.clone())]);

    let directory = watch::Sender::new(BTreeMap::new());
    // Written to disk, and so served, 128 KiB at a time.
    let config = TransferConfig { write_buffer: 128 << 10, ..config() };
    let (engine_a, fleet_a) =
        worker_configured(&store, "node-a", &options(&pair), config.clone(), &directory, std::future::pending()).await;
    let (engine_b, fleet_b) =
        worker_configured(&store, "node-b", &options(&pair), config, &directory, std::future::pending()).await;
    // The most node-b had from node-a while node-a was still fetching it.
    let overlapped = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampling = tokio::spawn({
        let (fleet_a, fleet_b, overlapped) = (Arc::clone(&fleet_a), Arc::clone(&fleet_b), overlapped.clone());
        async move {
            loop {
                let landing = matches!(fleet_a.catalog.holding(&key, &etag), super::catalog::Holding::Landing(_));
                if landing {
                    overlapped.fetch_max(fleet_b.counts().bytes_from_peers, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(pull(engine_a, "p/", dir_a.path(), false), pull(engine_b, "p/", dir_b.path(), false));
    sampling.abort();
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a.complete && b.complete, "{a:?} {b:?}");
    assert_staged(dir_a.path(), &objects);
    assert_staged(dir_b.path(), &objects);
    assert_eq!(a.peers.peer_failures + b.peers.peer_failures, 0, "{:?} {:?}", a.peers, b.peers);
    assert_eq!(b.peers.bytes_from_peers, data.len() as u64, "{:?}", b.peers);
    assert_eq!(store.calls().get_bytes, data.len() as u64, "the store sent it once");
    let early = overlapped.load(std::sync::atomic::Ordering::Relaxed);
    assert!(early >= data.len() as u64 / 4, "node-b had only {early} B while node-a was fetching");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_reading_an_object_as_it_lands_is_not_disturbed_by_its_owners_retried_request() {
    // The owner's first read of the object is throttled after 200 ms, while
    // the peer already waits on the object landing. The request is retried
    // within the same landing (only a mismatch lands an object anew), so the
    // peer goes on reading from the owner instead of bypassing it and
    // reading the store itself.
    let pair = ["node-a", "node-b"];
    let rel = keys_owned_by(&pair, "node-a", |i| format!("shard-{i}.bin")).next().unwrap();
    let key = format!("p/{rel}");
    let data = patterned(960 << 10, 9);
    let store = Arc::new(MemoryStore::default());
    store.insert(&key, data.clone());
    store.fail_gets(&key, [crate::store::memory::Fault::Throttle]);
    store.delay_gets(Duration::from_millis(200));
    store.trickle_gets(Duration::from_millis(20));
    let objects = BTreeMap::from([(rel, data.clone())]);
    let directory = watch::Sender::new(BTreeMap::new());
    let config = TransferConfig { write_buffer: 128 << 10, ..config() };
    let mut workers = Vec::new();
    for me in pair {
        workers.push(
            worker_configured(&store, me, &options(&pair), config.clone(), &directory, std::future::pending()).await,
        );
    }
    let dirs: Vec<_> = pair.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let summaries = stage_all(workers, &dirs).await;
    let (a, b) = (&summaries[0], &summaries[1]);
    assert!(a.complete && b.complete, "{a:?} {b:?}");
    assert_staged(dirs[1].path(), &objects);
    assert!(a.retries > 0, "the owner's read was not retried: {a:?}");
    assert_eq!(a.peers.peer_failures + b.peers.peer_failures, 0, "{:?} {:?}", a.peers, b.peers);
    assert_eq!(b.peers.bytes_from_peers, data.len() as u64, "{:?}", b.peers);
    // The owner's two reads, none by node-b.
    assert_eq!(store.calls().gets, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_whole_object_from_a_peer_is_verified_against_the_stores_crc_where_it_has_one() {
    // Three objects a peer serves whole: one below a MiB (its MD5 ETag, no
    // request), one of a MiB with a CRC32C the store's HEAD reports (cheaper
    // to hash than MD5), and one of a MiB whose only checksum is its MD5.
    let pair = ["node-a", "node-b"];
    let mut owned_by_a = keys_owned_by(&pair, "node-a", |i| format!("obj-{i}"));
    let store = Arc::new(MemoryStore::default());
    let mut objects = BTreeMap::new();
    for (size, md5_only) in [(70_000, false), (1 << 20, false), (1 << 20, true)] {
        let rel = owned_by_a.next().unwrap();
        let data = patterned(size, 7);
        if md5_only {
            store.insert_md5_only(&format!("p/{rel}"), data.clone());
        } else {
            store.insert(&format!("p/{rel}"), data.clone());
        }
        objects.insert(rel, data);
    }
    let directory = watch::Sender::new(BTreeMap::new());
    let workers =
        vec![worker(&store, "node-a", &pair, &directory).await, worker(&store, "node-b", &pair, &directory).await];
    let dirs: Vec<_> = pair.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let summaries = stage_all(workers, &dirs).await;
    let (a, b) = (&summaries[0], &summaries[1]);
    assert_staged(dirs[1].path(), &objects);
    assert_eq!(b.peers.objects_from_peers, 3, "{:?}", b.peers);
    assert_eq!((a.verified.crc32c, a.verified.md5), (2, 1), "from the store: {:?}", a.verified);
    assert_eq!((b.verified.crc32c, b.verified.md5), (1, 2), "from the peer: {:?}", b.verified);
}

/// A request for version `e1` of `p/big` (the whole object) to the peer port at `addr`.
fn landing_request(addr: SocketAddr) -> reqwest::RequestBuilder {
    let query = wire::ObjectQuery { key: "p/big".into(), etag: "e1".into() };
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{addr}{}", wire::OBJECT_PATH))
        .query(&query)
        .bearer_auth(TOKEN)
        .header(wire::SPEAKER_HEADER, wire::Speaker::new("node-b", None).to_string())
}

/// Reads `range` of version `e1` of `p/big` from the peer port at `addr`.
async fn read_landing(addr: SocketAddr, range: &'static str) -> (reqwest::StatusCode, reqwest::Result<bytes::Bytes>) {
    let response = landing_request(addr).header(reqwest::header::RANGE, range).send().await.unwrap();
    (response.status(), response.bytes().await)
}

/// A lone worker's peer port, with version `e1` of `p/big` (300 bytes,
/// [`LandingAtPort::bytes`]) landing there, its first `written` bytes written.
struct LandingAtPort {
    fleet: Arc<Fleet>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    bytes: Vec<u8>,
    file: Arc<std::fs::File>,
    guard: super::LandingGuard,
}

async fn landing_at_port(written: usize) -> LandingAtPort {
    let (store, _) = dataset();
    let directory = watch::Sender::new(BTreeMap::new());
    // node-b, which asks, is a member: one that joined the fleet could be
    // handed a block not written yet instead (`wire::TAKEN_OVER`).
    let (_engine, fleet) = worker(&store, "node-a", &["node-a", "node-b"], &directory).await;
    let addr = directory.borrow()["node-a"];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("landing");
    let bytes: Vec<u8> = (0..300u32).map(|b| b as u8).collect();
    std::fs::write(&path, &bytes[..written]).unwrap();
    let file = Arc::new(std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap());
    let guard = fleet.landing("p/big", "e1", 300, Arc::clone(&file), &[(0, written as u64)]);
    LandingAtPort { fleet, addr, dir, path, bytes, file, guard }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_streams_a_landing_object_as_it_is_written_and_breaks_off_if_it_is_abandoned() {
    let LandingAtPort { fleet, addr, dir, bytes, file, guard, .. } = landing_at_port(100).await;

    let (status, body) = read_landing(addr, "bytes=10-99").await;
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[10..100].to_vec().into()));
    assert_eq!(read_landing(addr, "bytes=300-").await.0, 416);

    // Not all written yet: the rest follows as it is.
    let later = tokio::spawn(read_landing(addr, "bytes=90-199"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!later.is_finished(), "the body ended before the range was written");
    std::os::unix::fs::FileExt::write_all_at(&*file, &bytes[100..150], 100).unwrap();
    guard.written(100, 150);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!later.is_finished(), "the body ended with half the range written");
    std::os::unix::fs::FileExt::write_all_at(&*file, &bytes[150..200], 150).unwrap();
    guard.written(150, 200);
    let (status, body) = later.await.unwrap();
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[90..200].to_vec().into()));

    // Abandoned (its bytes did not match) and landing anew in another
    // file: what the first never wrote is never sent; the body breaks off.
    let waiting = tokio::spawn(read_landing(addr, "bytes=150-299"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(guard);
    let again = std::fs::File::create(dir.path().join("again")).unwrap();
    let _again = fleet.landing("p/big", "e1", 300, Arc::new(again), &[]);
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("not the timeout").unwrap();
    assert_eq!(status, 206);
    assert!(body.is_err(), "a body of {:?} bytes", body.map(|b| b.len()));
    drop(_again);
    fleet.finish(false);
    assert_eq!(read_landing(addr, "bytes=0-9").await.0, 404, "the run ended without it");
}

#[tokio::test]
async fn a_worker_that_cannot_find_its_peers_gives_up_on_them_at_once() {
    let (store, objects) = dataset();
    // node-b never publishes an address: the wait for it would last the
    // peer timeout, unless discovery says it cannot work.
    let directory = watch::Sender::new(BTreeMap::new());
    let (engine, fleet) = worker(&store, "node-a", &["node-a", "node-b"], &directory).await;
    let started = std::time::Instant::now();
    let giving_up = {
        let (fleet, directory) = (Arc::clone(&fleet), directory.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            fleet.alone("may not read the DataStage");
            directory.send_modify(|_| {});
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let summary = pull(engine, "p/", dir.path(), false).await.unwrap();
    fleet.linger().await;
    giving_up.await.unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.peers.peer_failures, 1);
    assert_staged(dir.path(), &objects);
    assert!(started.elapsed() < Duration::from_secs(5), "waited {:?}, not the 10 s timeout", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joins_a_running_fleet_takes_over_what_its_owners_have_not_started_and_the_store_is_read_once() {
    // The two owners read the store at 512 KiB/s, one object at a time:
    // about four seconds each for their shares.
    let one_at_a_time = TransferConfig { concurrency: 1, max_bandwidth: Some(512 << 10), ..config() };
    a_joiner_takes_over_part_of(60, one_at_a_time).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joiner_takes_over_objects_its_owners_hold_in_their_object_window_before_their_requests_have_a_slot() {
    // With adaptive concurrency up to 32, an owner takes 64 objects into
    // its window at once, its whole share here, but its requests start at
    // 8 at a time (at 512 KiB/s, again about four seconds a share): an
    // object waiting for a request slot is not started yet.
    let adaptive = TransferConfig { concurrency: 32, adaptive: true, max_bandwidth: Some(512 << 10), ..config() };
    a_joiner_takes_over_part_of(120, adaptive).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joiner_takes_over_blocks_of_large_objects_that_its_owners_have_not_started() {
    // Two objects of 1.875 MiB in blocks of 64 KiB: every worker starts
    // both at once, so a joiner can take over only blocks. The owners read
    // theirs one at a time at 512 KiB/s, as above.
    let in_blocks = TransferConfig { concurrency: 1, max_bandwidth: Some(512 << 10), part_size: 64 << 10, ..config() };
    a_joiner_takes_over_part_of(2, in_blocks).await;
}

/// Two owners (configured as `owners`) stage `count` objects, 3.75 MiB in
/// all, and a third worker (of the same part size) joins once they have
/// read a twentieth of it: it takes over part of what they had not
/// started, every node ends with the dataset, and the store is read
/// exactly once.
async fn a_joiner_takes_over_part_of(count: u32, owners: TransferConfig) {
    let joiner_config = TransferConfig { part_size: owners.part_size, ..config() };
    let store = Arc::new(MemoryStore::default());
    // The whole listing at once: what the owners start is paced by their
    // requests, not by pages that wait for a request slot.
    store.list_in_pages_of(1000);
    let mut objects = BTreeMap::new();
    for i in 0..count {
        let data = patterned((60 << 16) / count, i % 7);
        store.insert(&format!("p/obj-{i:03}"), data.clone());
        objects.insert(format!("obj-{i:03}"), data);
    }
    let directory = watch::Sender::new(BTreeMap::new());
    let pair = ["node-a", "node-b"];
    let pair_options = options(&pair);
    let owner = |me| worker_configured(&store, me, &pair_options, owners.clone(), &directory, std::future::pending());
    let ((engine_a, fleet_a), (engine_b, fleet_b)) = tokio::join!(owner("node-a"), owner("node-b"));
    let dirs = Arc::new([(); 3].map(|()| tempfile::tempdir().unwrap()));
    let owners = {
        let dirs = Arc::clone(&dirs);
        tokio::spawn(async move { stage_all(vec![(engine_a, fleet_a), (engine_b, fleet_b)], &dirs[..2]).await })
    };
    // node-c joins the running fleet: its group names all three, but only
    // the two that divided the dataset before it came own any of it.
    while store.calls().get_bytes < total(&objects) / 20 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let trio = ["node-a", "node-b", "node-c"];
    let joiner = PeerOptions { peer_owners: pair.map(str::to_owned).to_vec(), ..options(&trio) };
    let (engine_c, fleet_c) =
        worker_configured(&store, "node-c", &joiner, joiner_config, &directory, std::future::pending()).await;
    let joined = stage_all(vec![(engine_c, fleet_c)], &dirs[2..]).await.remove(0);
    let mut summaries = owners.await.unwrap();
    summaries.push(joined);
    for (summary, dir) in summaries.iter().zip(dirs.iter()) {
        assert!(summary.complete && summary.peers.peer_failures == 0, "{summary:?}");
        assert_staged(dir.path(), &objects);
    }
    // node-c read from the store what the owners had not started and
    // dividing gave it (about half of what was left), and the owners read
    // it from node-c: the store was read exactly once.
    let joined = &summaries[2];
    let from_store = joined.bytes.transferred - joined.peers.bytes_from_peers;
    assert!(from_store >= total(&objects) / 5, "node-c took over {from_store} B of {} B", total(&objects));
    let from_the_joiner: u64 = summaries[..2].iter().map(|s| s.peers.bytes_from_peers).sum();
    assert!(from_the_joiner >= from_store, "the owners read {from_the_joiner} B from their peers");
    let read = store.calls().get_bytes;
    assert_eq!(read, total(&objects), "the store was read {read} bytes for a {} B dataset", total(&objects));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_owner_on_a_slow_link_that_starts_a_block_late_is_waited_for_while_it_makes_progress() {
    let store = Arc::new(MemoryStore::default());
    let data: Vec<u8> = (0..6u32 << 20).map(|b| (b % 251) as u8).collect();
    store.insert("p/model.bin", data.clone());
    let objects = BTreeMap::from([("model.bin".to_owned(), data)]);
    let group = ["node-a", "node-b"];
    let options = PeerOptions { peer_timeout: Duration::from_secs(2), ..options(&group) };
    let directory = watch::Sender::new(BTreeMap::new());
    // node-a fetches its 1 MiB blocks one at a time at 1 MiB/s: its last
    // one starts landing seconds after node-b asked for it, past the 2 s
    // peer timeout, while node-a makes progress all along.
    let slow = TransferConfig { concurrency: 1, max_bandwidth: Some(1 << 20), ..config() };
    let (engine_a, fleet_a) =
        worker_configured(&store, "node-a", &options, slow, &directory, std::future::pending()).await;
    let (engine_b, fleet_b) = worker_with(&store, "node-b", &options, &directory, std::future::pending()).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = tokio::join!(
        async {
            let summary = pull(engine_a, "p/", dir_a.path(), false).await.unwrap();
            fleet_a.linger().await;
            summary
        },
        async {
            let summary = pull(engine_b, "p/", dir_b.path(), false).await.unwrap();
            fleet_b.linger().await;
            summary
        },
    );
    for (summary, dir) in [(&a, &dir_a), (&b, &dir_b)] {
        assert!(summary.complete && summary.peers.peer_failures == 0, "{summary:?}");
        assert_staged(dir.path(), &objects);
    }
    let read = store.calls().get_bytes;
    assert_eq!(read, total(&objects), "the store was read {read} bytes for a {} B dataset", total(&objects));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_owners_that_read_blocks_one_at_a_time_never_hold_their_slot_waiting_for_each_other() {
    // Sixteen objects of 16 blocks each, every worker reading one block at
    // a time: waiting for the other's block inside that one request slot,
    // each would sooner or later wait for a block the other cannot start
    // (it waits, in its slot, for one of this worker's), until the peer
    // timeout bypassed one of them.
    let store = Arc::new(MemoryStore::default());
    let mut objects = BTreeMap::new();
    for i in 0..16 {
        let data = patterned(16 << 16, i);
        store.insert(&format!("p/shard-{i}"), data.clone());
        objects.insert(format!("shard-{i}"), data);
    }
    // The default 10 s peer timeout: a slow machine is not taken for a
    // stalled peer, and the wait, once it forms, lasts until the timeout.
    let options = options(&["node-a", "node-b"]);
    let one_at_a_time = TransferConfig { concurrency: 1, part_size: 64 << 10, ..config() };
    let directory = watch::Sender::new(BTreeMap::new());
    let worker =
        |me| worker_configured(&store, me, &options, one_at_a_time.clone(), &directory, std::future::pending());
    let (a, b) = tokio::join!(worker("node-a"), worker("node-b"));
    let dirs = [(); 2].map(|()| tempfile::tempdir().unwrap());
    let summaries = stage_all(vec![a, b], &dirs).await;
    for (summary, dir) in summaries.iter().zip(&dirs) {
        assert!(summary.complete && summary.peers.peer_failures == 0, "{summary:?}");
        assert_staged(dir.path(), &objects);
    }
    let read = store.calls().get_bytes;
    assert_eq!(read, total(&objects), "the store was read {read} bytes for a {} B dataset", total(&objects));
}

#[tokio::test]
async fn owners_outside_the_group_are_refused() {
    let options = PeerOptions { peer_owners: vec!["node-z".into()], ..options(&["node-a", "node-b"]) };
    let directory = watch::Sender::new(BTreeMap::new());
    let refused = Fleet::new("node-a", &options, Some(TOKEN.into()), directory.subscribe(), Arc::new(Metrics::new()));
    assert_eq!(refused.unwrap_err(), super::FleetError::OwnerNotAMember("node-z".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joins_later_is_fed_by_peers_that_linger_and_not_kept_waiting_by_ones_that_exited() {
    let (store, objects) = dataset();
    let directory = watch::Sender::new(BTreeMap::new());
    let pair = ["node-a", "node-b"];
    let (dir_a, dir_b, dir_c) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (engine_a, fleet_a) = worker(&store, "node-a", &pair, &directory).await;
    let (engine_b, fleet_b) = worker(&store, "node-b", &pair, &directory).await;
    let (a, b) = tokio::join!(pull(engine_a, "p/", dir_a.path(), false), pull(engine_b, "p/", dir_b.path(), false));
    assert!(a.unwrap().complete && b.unwrap().complete);

    // node-c joins as the first two finish: its group names all three, and
    // the two that finished learn its address and keep serving until it is
    // complete.
    let trio = ["node-a", "node-b", "node-c"];
    let (engine_c, fleet_c) = worker(&store, "node-c", &trio, &directory).await;
    let lingering =
        [Arc::clone(&fleet_a), Arc::clone(&fleet_b)].map(|fleet| tokio::spawn(async move { fleet.linger().await }));
    let before = store.calls().get_bytes;
    let summary = pull(engine_c, "p/", dir_c.path(), false).await.unwrap();
    fleet_c.linger().await;
    for linger in lingering {
        tokio::time::timeout(Duration::from_secs(10), linger).await.expect("done once node-c is").unwrap();
    }
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.peers.peer_failures, 0, "{:?}", summary.peers);
    assert_staged(dir_c.path(), &objects);
    let own = share(&objects, &trio, "node-c");
    assert_eq!(store.calls().get_bytes - before, own, "node-c read only its own share from the store");
    assert_eq!(summary.peers.bytes_from_peers, total(&objects) - own);

    // node-d joins after everyone exited: their addresses are stale. Told
    // they exited, it reads everything from the store at once instead of
    // waiting out the peer timeout (10 s here).
    let stale = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let late = watch::Sender::new(BTreeMap::from([("node-a".into(), stale), ("node-b".into(), stale)]));
    let (engine_d, fleet_d) = worker(&store, "node-d", &["node-a", "node-b", "node-d"], &late).await;
    fleet_d.exited("node-a");
    fleet_d.exited("node-b");
    let dir_d = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let summary = pull(engine_d, "p/", dir_d.path(), false).await.unwrap();
    fleet_d.linger().await;
    assert!(summary.complete, "{summary:?}");
    assert_eq!((summary.peers.peer_failures, summary.peers.bytes_from_peers), (0, 0), "exiting is not failing");
    assert_staged(dir_d.path(), &objects);
    assert!(started.elapsed() < Duration::from_secs(5), "waited {:?} for peers that had exited", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_whose_catalog_went_to_disk_serves_a_node_that_joins_later() {
    let (store, objects) = dataset();
    let directory = watch::Sender::new(BTreeMap::new());
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // node-a stages everything alone, keeping about four entries in memory.
    let (engine_a, fleet_a) = worker(&store, "node-a", &["node-a"], &directory).await;
    fleet_a.catalog.hold_in_memory(1 << 10);
    assert!(pull(engine_a, "p/", dir_a.path(), false).await.unwrap().complete);
    assert!(fleet_a.catalog.runs_on_disk() > 0, "most entries went to disk");
    let lingering = tokio::spawn({
        let fleet_a = Arc::clone(&fleet_a);
        async move { fleet_a.linger().await }
    });

    let pair = ["node-a", "node-b"];
    let (engine_b, fleet_b) = worker(&store, "node-b", &pair, &directory).await;
    let before = store.calls().get_bytes;
    let summary = pull(engine_b, "p/", dir_b.path(), false).await.unwrap();
    fleet_b.linger().await;
    tokio::time::timeout(Duration::from_secs(10), lingering).await.expect("done once node-b is").unwrap();
    assert!(summary.complete, "{summary:?}");
    assert_eq!(summary.peers.peer_failures, 0, "{:?}", summary.peers);
    assert_staged(dir_b.path(), &objects);
    let from_a = share(&objects, &pair, "node-a");
    assert_eq!(summary.peers.bytes_from_peers, from_a, "node-a's share came from node-a");
    assert_eq!(store.calls().get_bytes - before, total(&objects) - from_a);
}

#[tokio::test]
async fn the_peer_port_refuses_requests_without_the_secret_or_in_another_protocol() {
    let (store, _) = dataset();
    let directory = watch::Sender::new(BTreeMap::new());
    let (_engine, fleet) = worker(&store, "node-a", &["node-a"], &directory).await;
    fleet.catalog.hold("p/x", "/nonexistent".into(), "e", 1);
    let addr = directory.borrow()["node-a"];
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{addr}{}", wire::WAIT_PATH);
    let asked = wire::WaitRequest { objects: vec![wire::ObjectQuery { key: "p/x".into(), etag: "e".into() }] };
    for token in [None, Some("wrong"), Some("the-datastage-secre")] {
        let mut request = client.post(&url).json(&asked);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(request.send().await.unwrap().status(), 401, "{token:?}");
    }
    // The secret, but no speaker (a release before versions) or another
    // version: refused with both versions named, and the server's own.
    let next = wire::Speaker { protocol: wire::PROTOCOL + 1, name: "node-b".into(), serves_at: None };
    for (speaker, theirs) in [(None, "none".to_owned()), (Some(next.to_string()), format!("v{}", wire::PROTOCOL + 1))] {
        let mut request = client.post(&url).json(&asked).bearer_auth(TOKEN);
        if let Some(speaker) = &speaker {
            request = request.header(wire::SPEAKER_HEADER, speaker);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 400, "{speaker:?}");
        let server: wire::Speaker = response.headers()[wire::SPEAKER_HEADER].to_str().unwrap().parse().unwrap();
        assert_eq!(server, wire::Speaker::new("node-a", Some(addr)));
        let why = response.text().await.unwrap();
        assert!(why.contains(&format!("peer protocol v{}, the asker {theirs}", wire::PROTOCOL)), "{why}");
    }
    let speaker = wire::Speaker::new("node-b", None).to_string();
    let response =
        client.post(&url).json(&asked).bearer_auth(TOKEN).header(wire::SPEAKER_HEADER, &speaker).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<wire::WaitAnswer>().await.unwrap().held, vec![0]);
    // A request over the limit is refused, not served.
    let too_many = wire::WaitRequest { objects: vec![asked.objects[0].clone(); wire::WAIT_MAX_OBJECTS + 1] };
    let response = client
        .post(&url)
        .json(&too_many)
        .bearer_auth(TOKEN)
        .header(wire::SPEAKER_HEADER, &speaker)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_a_peer_served_that_then_fails_to_land_is_forgotten_with_the_failure() {
    let (store, objects) = dataset();
    let group = ["node-a", "node-b"];
    let directory = watch::Sender::new(BTreeMap::new());
    let (engine_a, fleet_a) = worker(&store, "node-a", &group, &directory).await;
    let (engine_b, fleet_b) = worker(&store, "node-b", &group, &directory).await;
    // An object node-a owns, so node-b reads it from node-a; a non-empty
    // directory where its file belongs makes node-b's rename fail.
    let blocked = objects
        .iter()
        .find(|(rel, data)| !data.is_empty() && fleet_b.owner_elsewhere(rel) == Some("node-a"))
        .map(|(rel, _)| rel.clone())
        .expect("node-a owns a non-empty object");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::create_dir_all(dir_b.path().join(&blocked).join("in-the-way")).unwrap();

    let (path_a, path_b) = (dir_a.path().to_path_buf(), dir_b.path().to_path_buf());
    let (fleet_a2, fleet_b2) = (Arc::clone(&fleet_a), Arc::clone(&fleet_b));
    let run_a = tokio::spawn(async move {
        let summary = pull(engine_a, "p/", &path_a, false).await.unwrap();
        fleet_a2.linger().await;
        summary
    });
    let run_b = tokio::spawn(async move {
        let summary = pull(engine_b, "p/", &path_b, false).await.unwrap();
        fleet_b2.linger().await;
        summary
    });
    let (summary_a, summary_b) = (run_a.await.unwrap(), run_b.await.unwrap());
    assert!(summary_a.complete, "{summary_a:?}");
    assert_eq!(summary_b.objects.failed, 1, "{summary_b:?}");
    assert_eq!(summary_b.failures[0].key, format!("p/{blocked}"), "{summary_b:?}");
    assert!(summary_b.peers.objects_from_peers > 0, "{:?}", summary_b.peers);
    let left = fleet_b.ready.lock().unwrap().clone();
    assert!(left.is_empty(), "node-b still remembers peers for {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_waits_for_hundreds_of_objects_with_a_few_requests() {
    let store = Arc::new(MemoryStore::default());
    let mut objects = BTreeMap::new();
    for i in 0..600u32 {
        let data = format!("small object {i}").into_bytes();
        store.insert(&format!("p/d{}/o{i:04}", i % 7), data.clone());
        objects.insert(format!("d{}/o{i:04}", i % 7), data);
    }
    let pair = ["node-a", "node-b"];
    let directory = watch::Sender::new(BTreeMap::new());
    let (mut runs, mut dirs, mut servers) = (Vec::new(), Vec::new(), Vec::new());
    for me in pair {
        let (engine, fleet) = worker(&store, me, &pair, &directory).await;
        servers.push(Arc::clone(&fleet));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        dirs.push(dir);
        runs.push(tokio::spawn(async move {
            let summary = pull(engine, "p/", &path, false).await.unwrap();
            fleet.linger().await;
            (summary, fleet.metrics.peer_wait_requests())
        }));
    }
    // The most long polls each worker held open at once, sampled.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampling = tokio::spawn({
        let done = Arc::clone(&done);
        async move {
            let mut most = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for fleet in &servers {
                    most = most.max(fleet.metrics.peer_waits_open());
                }
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            most
        }
    });
    for (run, dir) in runs.into_iter().zip(&dirs) {
        let (summary, wait_requests) = run.await.unwrap();
        assert!(summary.complete, "{summary:?}");
        assert_eq!(summary.peers.peer_failures, 0, "{:?}", summary.peers);
        assert_staged(dir.path(), &objects);
        let from_peer = summary.peers.objects_from_peers;
        assert!(from_peer >= 200, "about half the objects came from the peer: {from_peer}");
        // Each answer carries what settled close together (how much
        // depends on the machine's speed, so only printed).
        println!("{wait_requests} wait requests for {from_peer} objects from the peer");
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    // One long poll per object would hold hundreds open at once.
    let most_open = sampling.await.unwrap();
    assert!((1..=1).contains(&most_open), "a worker held {most_open} long polls open at once for its one peer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_share_of_an_owner_that_is_gone_is_read_from_the_store_once_by_a_peer_standing_in_for_it() {
    let (store, objects) = dataset();
    let group = ["node-a", "node-b", "node-c", "node-d"];
    // node-d never comes: its published address refuses connections, as a
    // node's whose pod died. The three others bypass it after the timeout.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let directory = watch::Sender::new(BTreeMap::from([("node-d".to_owned(), gone)]));
    let options = PeerOptions { peer_timeout: Duration::from_secs(3), ..options(&group) };
    let mut workers = Vec::new();
    for me in &group[..3] {
        workers.push(worker_with(&store, me, &options, &directory, std::future::pending()).await);
    }
    let dirs = [(); 3].map(|()| tempfile::tempdir().unwrap());
    let summaries = stage_all(workers, &dirs).await;
    for (summary, dir) in summaries.iter().zip(&dirs) {
        assert!(summary.complete, "{summary:?}");
        assert_eq!(summary.peers.peer_failures, 1, "only node-d was bypassed: {:?}", summary.peers);
        assert_staged(dir.path(), &objects);
    }
    // Each of node-d's objects and blocks is read from the store by the
    // member after it in the group's order, and by the others from that
    // one: about once, not once by each of the three.
    let (read, dataset, gone_share) = (store.calls().get_bytes, total(&objects), share(&objects, &group, "node-d"));
    assert!(
        gone_share > 0 && read < dataset + gone_share / 2,
        "the store was read {read} bytes for a {dataset} B dataset; node-d's share is {gone_share} B"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_passes_on_only_ranges_read_from_the_store_until_the_object_is_verified() {
    let LandingAtPort { fleet, addr, dir: _dir, path, bytes, file, guard } = landing_at_port(0).await;

    // The whole object is answered at once, before a byte is written: its
    // body follows the writer however long the store keeps it waiting
    // (only ranges are ever read from a peer).
    let whole = tokio::time::timeout(Duration::from_secs(2), landing_request(addr).send()).await;
    let whole = whole.expect("answered before a byte was written").unwrap();
    assert_eq!(whole.status(), 200);

    // A range read from a peer is marked before its first byte lands: a
    // request waiting for that byte is refused once it does.
    let waiting = tokio::spawn(read_landing(addr, "bytes=100-199"));
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "answered before the range was written");
    std::os::unix::fs::FileExt::write_all_at(&*file, &bytes, 0).unwrap();
    guard.written(0, 300);
    assert_eq!(waiting.await.unwrap().0.as_u16(), wire::SECOND_HAND);
    // The whole object follows the writer up to the bytes read from a
    // peer, and waits there until it is verified.
    let whole = tokio::spawn(whole.bytes());
    assert_eq!(read_landing(addr, "bytes=150-").await.0.as_u16(), wire::SECOND_HAND);
    let (status, body) = read_landing(addr, "bytes=0-99").await;
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[..100].to_vec().into()));
    let (status, body) = read_landing(addr, "bytes=200-").await;
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[200..].to_vec().into()));

    // That peer failed before sending a byte and the range went to the
    // store: passed on.
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), false);
    assert_eq!(read_landing(addr, "bytes=100-199").await.0, 206);

    // Verified whole and in place, every byte is passed on, whatever its source.
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), true);
    assert!(!whole.is_finished(), "bytes read from a peer were passed on before the object was verified");
    fleet.catalog.hold("p/big", path, "e1", 300);
    drop(guard);
    let (status, body) = read_landing(addr, "bytes=100-199").await;
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[100..200].to_vec().into()));
    assert_eq!(whole.await.unwrap().unwrap(), bytes, "the whole object, once verified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_resumed_from_an_earlier_run_is_passed_on_only_up_to_bytes_this_worker_reads_from_a_peer() {
    // The first 100 bytes were written by an earlier run: not marked.
    let LandingAtPort { fleet, addr, dir: _dir, path, bytes, file, guard } = landing_at_port(100).await;

    // The rest of the block is read from a peer: a range that takes it in
    // is refused as a whole, though its first byte is this worker's own.
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), true);
    assert_eq!(read_landing(addr, "bytes=0-199").await.0.as_u16(), wire::SECOND_HAND);
    assert_eq!(read_landing(addr, "bytes=50-").await.0.as_u16(), wire::SECOND_HAND);
    let (status, body) = read_landing(addr, "bytes=0-99").await;
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[..100].to_vec().into()));

    // A range answered before this worker turned to a peer for part of it:
    // what it reads from the peer waits until the object is verified.
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), false);
    let answered = tokio::spawn(read_landing(addr, "bytes=0-199"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    fleet.catalog.reading_from_a_peer("p/big", "e1", &(100..200), true);
    std::os::unix::fs::FileExt::write_all_at(&*file, &bytes[100..], 100).unwrap();
    guard.written(100, 300);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!answered.is_finished(), "bytes read from a peer were passed on before the object was verified");
    fleet.catalog.hold("p/big", path, "e1", 300);
    drop(guard);
    let (status, body) = answered.await.unwrap();
    assert_eq!((status, body.unwrap()), (reqwest::StatusCode::PARTIAL_CONTENT, bytes[..200].to_vec().into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_served_as_it_lands_from_the_store_is_read_from_the_store_whatever_a_peer_says_meanwhile() {
    use crate::store::ObjectStore as _;
    use futures::TryStreamExt as _;
    let (store, objects) = dataset();
    let directory = watch::Sender::new(BTreeMap::new());
    let (_a, fleet_a) = worker(&store, "node-a", &["node-a", "node-b"], &directory).await;
    let (_b, fleet_b) = worker(&store, "node-b", &["node-a", "node-b"], &directory).await;
    let (rel, data) = objects.iter().find(|(_, data)| !data.is_empty() && data.len() < (1 << 20)).unwrap();
    let key = format!("p/{rel}");
    let etag = store.head(&key).await.unwrap().0.etag.unwrap();
    // node-a holds other bytes under the version's name: whoever reads
    // from it gets them.
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, vec![0xAA; data.len()]).unwrap();
    fleet_a.catalog.hold(&key, wrong, &etag, data.len() as u64);

    // node-b's pull found no peer holding the object, so it reads it from
    // the store and serves it as it lands; node-a's word comes after.
    let file = Arc::new(tempfile::tempfile_in(dir.path()).unwrap());
    let _landing = fleet_b.landing(&key, &etag, data.len() as u64, file, &[]);
    fleet_b.ready.lock().unwrap().insert(key.clone(), "node-a".to_owned());

    let peer_store = super::PeerStore::new(store.clone(), Arc::clone(&fleet_b), config().part_size);
    let response = peer_store.get(&key, None, Some(&etag)).await.unwrap();
    let body: Vec<bytes::Bytes> = response.body.try_collect().await.unwrap();
    assert_eq!(body.concat(), *data, "read from the store, not from the peer");
    assert_eq!(fleet_b.counts().bytes_from_peers, 0);
}
