//! Why a stager run could not proceed, as one CamelCase word: the stager
//! writes it into its summary, and the operator puts it on the DataStage's
//! conditions and Events as it is.

use serde::{Deserialize, Serialize};

/// Why a run could not proceed at all. Serialized as the variant's name,
/// which is also the condition reason the operator shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// The bucket does not exist.
    BucketNotFound,
    /// An object disappeared between listing and reading it.
    ObjectNotFound,
    /// The store refused the credentials or the request.
    AccessDenied,
    /// No credentials could be found.
    NoCredentials,
    /// An object changed while it was copied.
    ObjectChanged,
    /// The endpoint could not be reached or timed out.
    EndpointUnreachable,
    /// The store answered with errors that may pass.
    StoreUnavailable,
    /// The store rejected a request for good.
    StoreRejected,
    /// The destination directory cannot be prepared or written.
    DestinationUnusable,
    /// The destination filesystem has less free space than the run still
    /// needs, or filled up during it.
    InsufficientCapacity,
    /// The dataset holds more bytes than the destination's quota leaves it
    /// (`--dataset-quota`, which the operator sets from StagingQuotas).
    QuotaExceeded,
    /// The source directory of a push cannot be read.
    SourceUnreadable,
    /// The source directory of a push holds no file to push, where the
    /// run was told to require one (the operator's pushes: a hostPath that
    /// does not exist is created empty by the node).
    SourceEmpty,
    /// The run's options do not make sense together.
    InvalidConfiguration,
    /// An object's bytes did not match the store's checksum (or size) on
    /// every attempt.
    ChecksumMismatch,
    /// A reason this build does not know (a newer stager's).
    #[serde(other)]
    Unknown,
}

impl Reason {
    /// Every reason a stager reports, `Unknown` excepted.
    pub const ALL: [Reason; 15] = [
        Reason::BucketNotFound,
        Reason::ObjectNotFound,
        Reason::AccessDenied,
        Reason::NoCredentials,
        Reason::ObjectChanged,
        Reason::EndpointUnreachable,
        Reason::StoreUnavailable,
        Reason::StoreRejected,
        Reason::DestinationUnusable,
        Reason::InsufficientCapacity,
        Reason::QuotaExceeded,
        Reason::SourceUnreadable,
        Reason::SourceEmpty,
        Reason::InvalidConfiguration,
        Reason::ChecksumMismatch,
    ];

    /// The CamelCase word, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BucketNotFound => "BucketNotFound",
            Reason::ObjectNotFound => "ObjectNotFound",
            Reason::AccessDenied => "AccessDenied",
            Reason::NoCredentials => "NoCredentials",
            Reason::ObjectChanged => "ObjectChanged",
            Reason::EndpointUnreachable => "EndpointUnreachable",
            Reason::StoreUnavailable => "StoreUnavailable",
            Reason::StoreRejected => "StoreRejected",
            Reason::DestinationUnusable => "DestinationUnusable",
            Reason::InsufficientCapacity => "InsufficientCapacity",
            Reason::QuotaExceeded => "QuotaExceeded",
            Reason::SourceUnreadable => "SourceUnreadable",
            Reason::SourceEmpty => "SourceEmpty",
            Reason::InvalidConfiguration => "InvalidConfiguration",
            Reason::ChecksumMismatch => "ChecksumMismatch",
            Reason::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_serialize_as_their_names_and_unknown_ones_are_kept_apart() {
        for reason in Reason::ALL {
            let json = serde_json::to_string(&reason).unwrap();
            assert_eq!(json, format!("\"{}\"", reason.as_str()));
            assert_eq!(serde_json::from_str::<Reason>(&json).unwrap(), reason);
        }
        assert_eq!(serde_json::from_str::<Reason>("\"SomethingNew\"").unwrap(), Reason::Unknown);
    }
}
