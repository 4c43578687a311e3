//! What Ferry's operator and stager tell each other, as types both sides
//! use: what a transfer can be told ([`options`]) and, with the `cli`
//! feature, the stager's command line over it (`cli`), the sizes it takes ([`size`],
//! the same grammar the DataStage CRD admits), its exit codes ([`exit`]),
//! the reasons it gives for a run that could not proceed ([`reason`]), what
//! it found of its destination's filesystem ([`disk`]) and the summary it
//! leaves behind ([`summary`]).
//!
//! Nothing here talks to Kubernetes or to a store: the crate is small so
//! that the CRD types, the operator, the engine and the Python package can
//! all depend on it; only the `cli` feature brings in `clap`.

pub mod budget;
#[cfg(feature = "cli")]
pub mod cli;
pub mod disk;
pub mod exit;
pub mod hash;
pub mod location;
pub mod options;
pub mod ownership;
pub mod peers;
pub mod reason;
pub mod size;
pub mod summary;

pub use budget::StoreShare;
#[cfg(feature = "cli")]
pub use cli::{StagerCli, StagerCommand};
pub use disk::{CapacityClaims, DiskSpace};
pub use exit::ExitStatus;
pub use location::ObjectLocation;
pub use options::{Shard, TransferOptions, VerifyMode};
pub use peers::{PeerCounts, PeerGroup, PeerOptions};
pub use reason::Reason;
pub use size::{ByteSize, CapacityReserve};
pub use summary::{Snapshot, SnapshotBuilder, Summary};
