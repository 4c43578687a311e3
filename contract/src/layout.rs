//! The names Ferry gives what it keeps on a disk beside the data: the
//! engine writes them, the operator mounts and refuses them, the stager and
//! the tests look for them. Spelled here once.
//!
//! ```text
//! ROOT/                      a NodeCache's root or a shared host path
//! ├── .ferry-shared/         SHARED_OBJECTS_DIR: one copy of each object, linked
//! └── DIR/                   a pulled directory
//!     ├── .ferry/            STATE_DIR: the manifest, and
//!     │   ├── tmp/           TEMP_DIR: temporary files of runs
//!     │   ├── partial/       PARTIAL_DIR: objects fetched in part, to resume
//!     │   └── push/          PUSH_STATE_DIR: a push's progress (in its source)
//!     ├── .ferry-versions/   VERSIONS_DIR (versioned pulls)
//!     │   ├── trees/DIGEST/  VERSION_TREES: each complete version
//!     │   └── building/      VERSION_BUILDING: the version being built
//!     └── current ->         CURRENT_LINK: the tree pods read now
//! ```
//!
//! See `docs/node-disks.md` for who owns what, and
//! `docs/design/node-cache.md` for why versions are laid out this way.

/// The directory, directly under a destination, that holds the manifest
/// and in-progress files (and, in a push's source, the push state). Keys
/// that would land in it are refused, and a push's walk skips it.
pub const STATE_DIR: &str = ".ferry";

/// Below [`STATE_DIR`]: temporary files of a run, swept when a run starts.
pub const TEMP_DIR: &str = "tmp";

/// Below [`STATE_DIR`]: objects fetched in part, kept for a resume.
pub const PARTIAL_DIR: &str = "partial";

/// Below [`STATE_DIR`] of a push's source: what each push has uploaded.
pub const PUSH_STATE_DIR: &str = "push";

/// The shared-objects directory, directly below a shared host path or a
/// NodeCache's root (or namespace directory): one copy of each object that
/// directories of the same objects link.
pub const SHARED_OBJECTS_DIR: &str = ".ferry-shared";

/// The directory below a versioned `DIR` that holds its trees, the tree
/// being built and the objects they link.
pub const VERSIONS_DIR: &str = ".ferry-versions";

/// Below [`VERSIONS_DIR`]: each complete version, named by its snapshot
/// digest.
pub const VERSION_TREES: &str = "trees";

/// Below [`VERSIONS_DIR`]: the version being built.
pub const VERSION_BUILDING: &str = "building";

/// The symbolic link below a versioned `DIR` that names the current tree;
/// pods mount `DIR/current`.
pub const CURRENT_LINK: &str = "current";

#[cfg(test)]
mod tests {
    use super::*;

    /// These names are on users' disks: a release that renames one must
    /// migrate what an older one wrote, so a rename fails here first.
    #[test]
    fn the_names_on_disk_are_the_ones_earlier_releases_wrote() {
        assert_eq!(
            [STATE_DIR, TEMP_DIR, PARTIAL_DIR, PUSH_STATE_DIR, SHARED_OBJECTS_DIR],
            [".ferry", "tmp", "partial", "push", ".ferry-shared"]
        );
        assert_eq!(
            [VERSIONS_DIR, VERSION_TREES, VERSION_BUILDING, CURRENT_LINK],
            [".ferry-versions", "trees", "building", "current"]
        );
    }
}
