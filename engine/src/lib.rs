//! `ferry-engine` moves datasets between object storage and local disks, fast
//! and safely: parallel ranged transfers under one request budget, bounded
//! memory, checksums verified before a file appears under its final name,
//! and re-runs that copy only what is missing.
//!
//! It is the layer every front end shares: the `ferry-stager` command line,
//! the `ferry` Python package and, through `ferry-contract`, the operator's
//! view of a run. It knows nothing of Kubernetes or of command lines. The
//! library is organised by what things are:
//! * [`transfer`] is the engine proper (scheduler, budgets, retries, pull
//!   and push);
//! * [`store`] is the object-storage trait and its S3 and GCS backends;
//! * [`local`] is everything that touches the local filesystem;
//! * [`selection`] decides which objects a run copies;
//! * [`metrics`] is what a run counts of itself;
//! * [`options`] turns the options every front end takes into a configured
//!   run.

pub mod fleet;
pub mod local;
pub mod metrics;
pub mod options;
pub mod selection;
pub mod store;
pub mod transfer;

pub use ferry_contract::ObjectLocation;

/// An error and its sources as one line ("a: b: c"), skipping a source whose
/// text its parent already repeats. Used for exit messages and summaries,
/// where `Debug` dumps would bury the cause.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    for cause in sources(error) {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
    }
    line
}

/// An error's source, then that one's source, and so on.
fn sources<'a>(error: &'a dyn std::error::Error) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(error.source(), |cause| cause.source())
}

/// An error and every error under it: where a client library's error wraps
/// the one that says what happened (a timeout, a checksum failure).
pub(crate) fn causes<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::once(error).chain(sources(error))
}
