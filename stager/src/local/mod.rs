//! Everything that touches the local filesystem: mapping keys to safe paths,
//! the staging area where files are written before they are renamed into
//! place, the manifest of what has been staged, and walking a directory for
//! a push, and removing what was staged.

pub mod clean;
pub mod manifest;
pub mod paths;
pub mod staging;
pub mod walk;

/// Name of the directory, directly under the destination, that holds the
/// manifest and in-progress temporary files. Keys that would land in it are
/// refused.
pub const STATE_DIR: &str = ".ferry";
