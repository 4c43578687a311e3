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
//! * [`metrics`] and [`progress`] are what a run shows of itself.

pub mod cli;
pub mod local;
pub mod location;
pub mod metrics;
pub mod progress;
pub mod selection;
pub mod store;
pub mod transfer;

pub use location::ObjectLocation;
