//! What Ferry's operator and stager tell each other, as types both sides
//! use: what a transfer can be told ([`options`]) and, with the `cli`
//! feature, the stager's command line over it (`cli`), the sizes it takes ([`size`],
//! the same grammar the DataStage CRD admits), its exit codes ([`exit`]),
//! the reasons it gives for a run that could not proceed ([`reason`]), what
//! it found of its destination's filesystem ([`disk`]), the summary it
//! leaves behind ([`summary`]) and the layout of versioned directories
//! ([`versions`]).
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
pub mod hub;
pub mod layout;
pub mod location;
pub mod options;
pub mod ownership;
pub mod peers;
pub mod reason;
pub mod size;
pub mod summary;
pub mod versions;

pub use budget::StoreShare;
#[cfg(feature = "cli")]
pub use cli::{StagerCli, StagerCommand};
pub use disk::{CapacityClaims, DiskSpace};
pub use exit::ExitStatus;
pub use hub::{HubRepo, RepoKind};
pub use location::{ObjectLocation, Scheme};
pub use options::{Shard, TransferOptions, VerifyMode};
pub use peers::{PeerCounts, PeerGroup, PeerOptions};
pub use reason::Reason;
pub use size::{ByteSize, CapacityReserve};
pub use summary::{Snapshot, SnapshotBuilder, Summary, VerifyCost};
pub use versions::{SnapshotDigest, VersionsMode};

/// Makes a schema's unsigned integer formats ones the Kubernetes API server
/// knows. schemars writes `uint64` and `uint32`, which the API server
/// accepts but warns about at every `kubectl apply` of the CRD ("unrecognized
/// format"); the value range stays checked by the `minimum: 0` beside it.
/// Used as a container transform on contract types that appear in a CRD.
pub fn kubernetes_integer_formats(schema: &mut schemars::Schema) {
    if let Some(format) = schema.get_mut("format")
        && matches!(format.as_str(), Some("uint64" | "uint32"))
    {
        *format = "int64".into();
    }
    for keyword in ["properties", "items", "anyOf", "oneOf", "allOf"] {
        let Some(value) = schema.get_mut(keyword) else { continue };
        let children: Vec<&mut serde_json::Value> = match value {
            serde_json::Value::Object(map) if keyword == "properties" => map.values_mut().collect(),
            serde_json::Value::Array(list) => list.iter_mut().collect(),
            other => vec![other],
        };
        for child in children {
            if let Ok(child) = <&mut schemars::Schema>::try_from(child) {
                kubernetes_integer_formats(child);
            }
        }
    }
}
