//! What Ferry's operator and stager tell each other, as types both sides
//! use: the stager's command line ([`cli`]), the sizes it takes ([`size`],
//! the same grammar the DataStage CRD admits), its exit codes ([`exit`]),
//! the reasons it gives for a run that could not proceed ([`reason`]) and
//! the summary it leaves behind ([`summary`]).
//!
//! Nothing here talks to Kubernetes or to a store: the crate is small so
//! that the CRD types, the operator and the stager can all depend on it.

pub mod cli;
pub mod exit;
pub mod hash;
pub mod location;
pub mod reason;
pub mod size;
pub mod summary;

pub use cli::{Shard, StagerCli, StagerCommand, TransferOptions, VerifyMode};
pub use exit::ExitStatus;
pub use location::ObjectLocation;
pub use reason::Reason;
pub use size::ByteSize;
pub use summary::{Snapshot, SnapshotBuilder, Summary};
