//! Everything that touches the local filesystem: mapping keys to safe paths,
//! the staging area where files are written before they are renamed into
//! place, the manifest of what has been staged, large objects downloaded
//! part way and kept across runs, walking a directory for a push and the
//! state that lets a push resume, removing what was staged, removing what
//! a pull staged from objects that left the store, the store of objects
//! that directories on one filesystem share, and versions of a directory.

pub mod clean;
pub mod manifest;
pub mod ownership;
pub mod partial;
pub mod paths;
pub mod prune;
pub mod push_state;
pub mod shared_objects;
pub mod sorted;
pub mod staging;
pub mod versions;
pub mod walk;
