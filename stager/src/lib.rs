//! `ferry-stager` moves datasets between object storage and local disks, fast
//! and safely: parallel ranged transfers under one request budget, bounded
//! memory, checksums verified before a file appears under its final name,
//! and re-runs that copy only what is missing.
//!
//! The library is organised by what things are:
//! * [`cli`] parses the command line and wires a run together;
//! * [`transfer`] is the engine (scheduler, budgets, retries, pull and push);
//! * [`store`] is the object-storage trait and its S3 backend;
//! * [`local`] is everything that touches the local filesystem;
//! * [`selection`] decides which objects a run copies;
//! * [`metrics`] and [`progress`] are what a run shows of itself;
//! * [`wait`] blocks an init container until a DataStage is ready on its node.

pub mod cli;
pub mod local;
pub mod metrics;
pub mod progress;
pub mod report;
pub mod selection;
pub mod store;
pub mod transfer;
pub mod wait;

pub use ferry_contract::ObjectLocation;

/// An error and its sources as one line ("a: b: c"), skipping a source whose
/// text its parent already repeats. Used for exit messages and summaries,
/// where `Debug` dumps would bury the cause.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}
