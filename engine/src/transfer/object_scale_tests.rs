//! Resident memory against the object count: pulls of a synthetic store
//! (see [`crate::store::synthetic`]) of growing size, each in a process of
//! its own (an allocator keeps what it freed, so one process cannot measure
//! several sizes), first run, re-run with nothing to copy, and a re-run
//! after objects changed and left with `--delete-removed`; then pushes of
//! the directory that made back to the store, first run and re-run (which
//! finds everything in place); and a fleet worker's first run into a
//! directory of its own, in a group of one, so that every object is its
//! own share and goes into the catalog it serves its peers from.
//!
//! The default run compares 20,000 and 100,000 objects (below about
//! 20,000, the sort's 4 MiB and the adaptive concurrency have not filled up
//! yet, which would flatter the smaller count). Set
//! `FERRY_OBJECT_SCALE=10000,100000,1000000` for the figures in
//! docs/reliability.md, and `FERRY_OBJECT_SCALE_EMPTY=1` to make the first
//! version of every object empty (10,000,000 files of a few bytes need
//! 40 GB of 4 KiB blocks; empty ones need only their inodes).
//!
//! The same children also measure large objects whose only checksum is an
//! MD5, hashed behind their downloads: one in flight against 64.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use ferry_contract::peers::PeerOptions;
use serde::{Deserialize, Serialize};

use super::{Engine, TransferConfig, pull::pull, push::push};
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::store::synthetic::SyntheticStore;

/// Set in the child process: what to pull.
const CHILD: &str = "FERRY_OBJECT_SCALE_CHILD";

/// Peak resident memory may grow this much from the smallest count to the
/// largest; the manifest alone used to take about 0.6 KB per object.
const ALLOWED_GROWTH: u64 = 8 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    count: u64,
    epoch: u32,
    dir: String,
    delete_removed: bool,
    push: bool,
    empty: bool,
    fleet: bool,
    /// MiB of each object of a store of large MD5-only objects; 0: the
    /// small objects of the synthetic store.
    md5_only_mib: usize,
}

#[derive(Debug, Serialize, Deserialize)]
struct Measured {
    peak_rss_bytes: u64,
    seconds: f64,
    cpu_seconds: f64,
    transferred: u64,
    skipped: u64,
    added: u64,
    updated: u64,
    removed: u64,
    complete: bool,
    concurrency_peak: u32,
    /// Threads in the process at the end (the runtime's blocking pool is
    /// bounded, see `crate::runtime`).
    threads: u64,
    /// Objects verified against an MD5.
    verified_md5: u64,
    /// The most downloads hashed behind at once.
    hashed_behind_peak: usize,
}

/// User plus system CPU time of this process, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and
    // stime are the 12th and 13th, in clock ticks of 1/100 s.
    let after_name = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// The child's side: one pull, measured, printed as one JSON line.
#[test]
#[ignore = "run by the tests below, each measurement in a process of its own"]
fn object_scale_child() {
    let request: Request = serde_json::from_str(&std::env::var(CHILD).expect("only run as a child")).unwrap();
    let runtime = crate::runtime::builder().build().unwrap();
    let started = Instant::now();
    let hashed_behind_peak = Arc::new(AtomicUsize::new(0));
    let summary = runtime.block_on(async {
        let store = match request.md5_only_mib {
            0 => SyntheticStore::new(request.count, request.epoch),
            // Slowed to about 64 MB/s a request, so that downloads overlap
            // as they do over a network instead of finishing one by one.
            mib => {
                SyntheticStore::large_md5_only(request.count, mib << 20).trickled(std::time::Duration::from_millis(1))
            }
        };
        let store = Arc::new(if request.empty { store.empty() } else { store });
        let metrics = Arc::new(Metrics::new());
        let engine = if request.fleet {
            let options = PeerOptions { peer_group: vec!["worker".into()], ..PeerOptions::default() };
            let (_, directory) = tokio::sync::watch::channel(BTreeMap::new());
            let fleet = Fleet::new("worker", &options, Some("secret".into()), directory, Arc::clone(&metrics))
                .unwrap()
                .expect("a group");
            Engine::in_fleet(store as _, TransferConfig::default(), metrics, fleet).unwrap()
        } else {
            Engine::new(store as _, TransferConfig::default(), metrics).unwrap()
        };
        // How many downloads are hashed behind at once, sampled.
        let (watched, peak) = (Arc::clone(&engine), Arc::clone(&hashed_behind_peak));
        let watch = tokio::spawn(async move {
            loop {
                peak.fetch_max(watched.md5.following(), Ordering::Relaxed);
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
        });
        let summary = if request.push {
            push(engine, Path::new(&request.dir), "p/").await.unwrap()
        } else {
            pull(engine, "p/", Path::new(&request.dir), request.delete_removed).await.unwrap()
        };
        watch.abort();
        summary
    });
    let changes = summary.changes.unwrap_or_default();
    let measured = Measured {
        peak_rss_bytes: super::tally::peak_rss_bytes().unwrap_or(0),
        seconds: started.elapsed().as_secs_f64(),
        cpu_seconds: cpu_seconds(),
        transferred: summary.objects.transferred,
        skipped: summary.objects.skipped,
        added: changes.added.objects,
        updated: changes.updated.objects,
        removed: changes.removed.objects,
        complete: summary.complete,
        concurrency_peak: summary.concurrency.map_or(0, |c| c.peak),
        threads: super::tally::process_status("Threads").unwrap_or(0),
        verified_md5: summary.verified.md5,
        hashed_behind_peak: hashed_behind_peak.load(Ordering::Relaxed),
    };
    println!("OBJECT_SCALE {}", serde_json::to_string(&measured).unwrap());
}

fn run_child(request: &Request) -> Measured {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "transfer::object_scale_tests::object_scale_child", "--ignored", "--nocapture"])
        .env(CHILD, serde_json::to_string(request).unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("OBJECT_SCALE ")).unwrap_or_else(|| {
        panic!("the child printed no result:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr))
    });
    serde_json::from_str(line).unwrap()
}

/// Which directory a run stages into or pushes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tree {
    /// What the plain pulls made, in directories of 1,000 files.
    Pulled,
    /// The fleet worker's own.
    Fleet,
    /// One directory of as many files as objects, made by the test.
    Flat,
}

#[test]
fn resident_memory_does_not_grow_with_the_object_count() {
    let counts: Vec<u64> = std::env::var("FERRY_OBJECT_SCALE")
        .map(|v| v.split(',').map(|n| n.trim().parse().expect("FERRY_OBJECT_SCALE: counts, comma-separated")).collect())
        .unwrap_or_else(|_| vec![20_000, 100_000]);
    let empty = std::env::var("FERRY_OBJECT_SCALE_EMPTY").is_ok_and(|v| v == "1");
    // (name, store version, --delete-removed, push, directory)
    let phases = [
        ("first run", 1, false, false, Tree::Pulled),
        ("re-run, nothing to copy", 1, false, false, Tree::Pulled),
        ("re-run, changed", 2, true, false, Tree::Pulled),
        ("push, first run", 2, false, true, Tree::Pulled),
        ("push, re-run", 2, false, true, Tree::Pulled),
        ("fleet worker, first run", 1, false, false, Tree::Fleet),
        ("push, one flat directory", 1, false, true, Tree::Flat),
    ];
    let mut peaks: Vec<Vec<u64>> = vec![Vec::new(); phases.len()];
    println!("| objects | run | peak RSS | wall | CPU | µs CPU/object | objects/s | peak concurrency | threads |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for &count in &counts {
        let (dir, fleet_dir, flat_dir) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for i in 0..count {
            std::fs::write(flat_dir.path().join(format!("{:016x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))), b"")
                .unwrap();
        }
        let changed_store = SyntheticStore::new(count, 2);
        let gone = (0..count).filter(|i| !changed_store.exists(*i)).count() as u64;
        let changed = (0..count).filter(|i| changed_store.exists(*i) && changed_store.changed(*i)).count() as u64;
        for (phase, &(name, epoch, delete_removed, push, tree)) in phases.iter().enumerate() {
            let fleet = tree == Tree::Fleet;
            let dir = match tree {
                Tree::Pulled => dir.path(),
                Tree::Fleet => fleet_dir.path(),
                Tree::Flat => flat_dir.path(),
            };
            let dir = dir.display().to_string();
            let request = Request { count, epoch, dir, delete_removed, push, empty, fleet, md5_only_mib: 0 };
            let measured = run_child(&request);
            assert!(measured.complete, "{count} objects, {name}: {measured:?}");
            match phase {
                0 | 5 => assert_eq!((measured.added, measured.transferred), (count, count), "{name}"),
                1 => assert_eq!((measured.skipped, measured.transferred), (count, 0), "{name}"),
                3 => assert_eq!((measured.skipped, measured.transferred), (0, count - gone), "{name}"),
                4 => assert_eq!((measured.skipped, measured.transferred), (count - gone, 0), "{name}"),
                6 => assert_eq!((measured.skipped, measured.transferred), (0, count), "{name}"),
                _ => assert_eq!(
                    (measured.updated, measured.removed, measured.skipped),
                    (changed, gone, count - gone - changed),
                    "{name}"
                ),
            }
            println!(
                "| {count} | {name} | {:.1} MiB | {:.1} s | {:.1} s | {:.1} | {:.0} | {} | {} |",
                measured.peak_rss_bytes as f64 / f64::from(1 << 20),
                measured.seconds,
                measured.cpu_seconds,
                measured.cpu_seconds * 1e6 / count as f64,
                count as f64 / measured.seconds,
                measured.concurrency_peak,
                measured.threads,
            );
            peaks[phase].push(measured.peak_rss_bytes);
        }
        let files = |dir: &Path| {
            walkdir::WalkDir::new(dir)
                .into_iter()
                .filter_entry(|e| e.file_name() != ferry_contract::layout::STATE_DIR)
                .flatten()
                .filter(|e| e.file_type().is_file())
                .count() as u64
        };
        assert_eq!(files(dir.path()), count - gone, "exactly the objects in the store are on disk");
        assert_eq!(files(fleet_dir.path()), count, "the fleet worker staged every object of version 1");
    }
    for ((name, ..), peaks) in phases.iter().zip(&peaks) {
        let (smallest, largest) = (peaks[0], *peaks.last().unwrap());
        assert!(
            largest <= smallest + ALLOWED_GROWTH,
            "{name}: peak RSS grew from {smallest} B at {} objects to {largest} B at {}",
            counts[0],
            counts.last().unwrap()
        );
    }
}

/// Objects whose only checksum is an MD5 are hashed behind their downloads
/// from the page cache, nothing held in memory for them: 64 in flight at
/// once (each 16 MiB, 1 GiB in all) take no more memory than one.
#[test]
fn md5_only_objects_hashed_behind_take_no_more_memory_for_64_in_flight_than_for_one() {
    const MIB_EACH: usize = 16;
    let measure = |count: u64| {
        let dir = tempfile::tempdir().unwrap();
        let request = Request {
            count,
            epoch: 1,
            dir: dir.path().display().to_string(),
            delete_removed: false,
            push: false,
            empty: false,
            fleet: false,
            md5_only_mib: MIB_EACH,
        };
        let measured = run_child(&request);
        assert!(measured.complete, "{count} objects: {measured:?}");
        assert_eq!(measured.verified_md5, count, "every object verified against its MD5: {measured:?}");
        measured
    };
    let one = measure(1);
    let many = measure(64);
    println!(
        "MD5-only objects of {MIB_EACH} MiB: peak RSS {:.1} MiB for one, {:.1} MiB for 64 ({} hashed behind at once)",
        one.peak_rss_bytes as f64 / f64::from(1 << 20),
        many.peak_rss_bytes as f64 / f64::from(1 << 20),
        many.hashed_behind_peak
    );
    assert!(many.hashed_behind_peak >= 48, "most of the 64 objects in flight at once: {many:?}");
    assert!(
        many.peak_rss_bytes <= one.peak_rss_bytes + (16 << 20),
        "peak RSS {} B with 64 objects in flight, {} B with one",
        many.peak_rss_bytes,
        one.peak_rss_bytes
    );
}
