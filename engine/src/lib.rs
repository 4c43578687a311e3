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
//! * [`store`] is the object-storage trait (the `ferry-store` crate, whose
//!   backends the front ends choose);
//! * [`local`] is everything that touches the local filesystem;
//! * [`selection`] decides which objects a run copies;
//! * [`metrics`] is what a run counts of itself;
//! * [`options`] turns the options every front end takes into a configured
//!   run;
//! * [`runtime`] builds the tokio runtime every front end runs it on.

pub mod fleet;
pub mod local;
pub mod metrics;
pub mod options;
pub mod runtime;
pub mod selection;
pub mod store;
pub mod transfer;

pub use ferry_contract::ObjectLocation;

pub use ferry_store::{UNTRUSTED_CERTIFICATE_HINT, error_chain};
