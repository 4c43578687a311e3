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
    if line.contains("invalid peer certificate") {
        // rustls names the problem (UnknownIssuer, NotValidForName…) but
        // not the fix, which differs by how the stager was started.
        line.push_str(UNTRUSTED_CERTIFICATE_HINT);
    }
    line
}

/// What an HTTPS store's untrusted certificate adds to its error.
/// Short: a failure's text is cut at 240 bytes in the summary, and the
/// chain before it already takes about 140.
pub const UNTRUSTED_CERTIFICATE_HINT: &str = " (an untrusted CA: set caBundle, or SSL_CERT_FILE for the CLI)";

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

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("dispatch failure")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn an_untrusted_certificate_says_how_to_trust_its_ca() {
        let tls = Outer(std::io::Error::other("invalid peer certificate: UnknownIssuer"));
        let line = super::error_chain(&tls);
        assert!(line.starts_with("dispatch failure: invalid peer certificate: UnknownIssuer"), "{line}");
        assert!(line.ends_with(super::UNTRUSTED_CERTIFICATE_HINT), "{line}");
        let refused = Outer(std::io::Error::other("connection refused"));
        assert_eq!(super::error_chain(&refused), "dispatch failure: connection refused");
    }
}
