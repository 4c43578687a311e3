//! `ferry-stager` is the command line over [`ferry_engine`]: it parses the
//! flags the operator renders (defined once in `ferry_contract`), wires a run
//! together, shows its progress and metrics, and reports to Kubernetes.
//!
//! * [`cli`] parses the command line, wires a run together and picks the
//!   exit code;
//! * [`progress`] is the progress a run shows on a terminal or in logs;
//! * [`metrics_endpoint`] exposes the engine's metrics over HTTP;
//! * [`peers`] serves a fleet's peers and keeps their addresses;
//! * [`report`] writes a run's outcome where the operator reads it;
//! * [`wait`] blocks an init container until a DataStage is ready on its node.

pub mod cli;
pub mod metrics_endpoint;
pub mod peers;
pub mod progress;
pub mod report;
pub mod wait;
