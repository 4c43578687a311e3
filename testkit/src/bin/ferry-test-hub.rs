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
//! "commit": …}`, and serves until its standard input closes.

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
    // Until the caller closes our standard input.
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
}
