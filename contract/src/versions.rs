//! Versions of a pulled directory: the names both the stager (which builds
//! and switches versions) and the operator (which mounts `DIR/current` into
//! pods and tells workers when to switch) must agree on.
//!
//! A versioned directory `DIR` holds each complete version as a tree below
//! [`VERSIONS_DIR`](crate::layout::VERSIONS_DIR), named by its snapshot
//! digest, and a symbolic link [`CURRENT_LINK`](crate::layout::CURRENT_LINK)
//! to the tree pods read now. See `docs/design/node-cache.md`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What a versioned pull does once its tree is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum VersionsMode {
    /// Build the new version beside the current one and stop: `ferry-stager
    /// switch` makes it current (the operator does once every node holds it).
    Build,
    /// Build the new version, then make it current at once (one machine, the CLI).
    Switch,
}

/// A dataset version's snapshot digest (32 lowercase hex digits, as
/// [`crate::Snapshot::digest`]): the name of its tree on disk, so nothing
/// else may pass for one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotDigest(String);

/// A string that is not a snapshot digest.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("'{0}' is not a snapshot digest (32 lowercase hex digits, as status.snapshot.digest shows)")]
pub struct NotADigest(String);

impl SnapshotDigest {
    /// The digest's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SnapshotDigest {
    type Err = NotADigest;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let hex = text.len() == 32 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if hex { Ok(Self(text.to_owned())) } else { Err(NotADigest(text.to_owned())) }
    }
}

impl TryFrom<String> for SnapshotDigest {
    type Error = NotADigest;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl From<SnapshotDigest> for String {
    fn from(digest: SnapshotDigest) -> Self {
        digest.0
    }
}

impl fmt::Display for SnapshotDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_snapshot_digest_looks_like_names_a_tree() {
        let digest = crate::SnapshotBuilder::default().finish().digest;
        assert_eq!(digest.parse::<SnapshotDigest>().unwrap().to_string(), digest);
        for bad in ["", "..", "../../etc", "ABCDEF0123456789abcdef0123456789", "abc", &format!("{digest}0")] {
            assert!(bad.parse::<SnapshotDigest>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&digest.parse::<SnapshotDigest>().unwrap()).unwrap();
        assert_eq!(serde_json::from_str::<SnapshotDigest>(&json).unwrap().as_str(), digest);
        assert!(serde_json::from_str::<SnapshotDigest>("\"../x\"").is_err());
    }
}
