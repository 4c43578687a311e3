//! A Hugging Face Hub for benchmarks and tests outside Rust: olah behind
//! the testkit's front ([`ferry_testkit::HubServer`]: LFS files redirected
//! to ranged storage, as the Hub does), serving the files of a directory as
//! one repository.
//!
//! ```text
//! ferry-test-hub DIR NAME
//! ```
//!
//! commits every file under DIR as `ferry/NAME` on `main` (files from 1 MiB
//! on in LFS), prints one JSON line, `{"endpoint": …, "repo": "ferry/NAME",
//! "commit": …}`, and serves until its standard input closes or it is
//! told to stop (SIGTERM, SIGINT).

use std::io::{BufRead as _, Write as _};
use std::path::Path;

use ferry_testkit::HubServer;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, name] = args.as_slice() else {
        eprintln!("usage: ferry-test-hub DIR NAME");
        std::process::exit(2);
    };
    let hub = HubServer::start();
    let files = ferry_testkit::read_tree(Path::new(dir));
    hub.put_all(name, files).await;
    let line = serde_json::json!({
        "endpoint": hub.endpoint,
        "repo": HubServer::repo_id(name),
        "commit": hub.commit(name, "main"),
    });
    println!("{line}");
    std::io::stdout().flush().expect("stdout");
    // Until the caller closes our standard input, or signals: either way
    // `hub` is dropped on the way out, which stops olah and MinIO (a
    // process killed by a signal's default action would leave them).
    let input = tokio::task::spawn_blocking(|| {
        for line in std::io::stdin().lock().lines() {
            if line.is_err() {
                break;
            }
        }
    });
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM");
    tokio::select! {
        _ = input => {}
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(hub);
    // Not a return: the runtime would wait for the thread still reading
    // standard input after a signal.
    std::process::exit(0);
}
