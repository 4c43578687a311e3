//! Versions of a pulled directory, switched for readers in one rename.
//!
//! A pull updates a plain directory in place, file by file: a reader that
//! opens two files during a re-sync can get one of each version. A
//! versioned directory `DIR` never changes what a reader already has:
//!
//! ```text
//! DIR/current -> .ferry-versions/trees/DIGEST     what readers mount
//! DIR/.ferry-versions/trees/DIGEST/               one complete version per snapshot digest
//! DIR/.ferry-versions/building/                   the version a pull is building (never read)
//! DIR/.ferry-versions/objects/ab/cdef…            the files, hard-linked into every tree that holds them
//! ```
//!
//! A pull builds into `building/` exactly as it would into a plain
//! directory, with the versions' objects as its shared-objects directory
//! (see [`super::shared_objects`]): a file an earlier version holds is a
//! `link(2)`, so a version that changed 1% of the objects takes 1% more
//! room, and a change back to a version still on disk copies nothing.
//! [`VersionedDir::switch`] then seals the tree (renames `building/` to
//! `trees/DIGEST`, after checking its manifests add up to that digest),
//! renames a new link over `current`, and removes the trees neither current
//! nor kept.
//!
//! Crash safety: a tree exists under its digest only once complete (a
//! rename), and is renamed aside before it is removed; the link is the old
//! one or the new one. A process killed at any step leaves a directory the
//! next [`VersionedDir::switch`] (or pull) completes. A pod mounts `current`
//! through the kubelet, which resolves the link when the container starts,
//! so a running pod keeps its version whole (`tests/e2e/tests/e2e/real_nodes.rs`).

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use ferry_contract::layout::{
    CURRENT_LINK, STATE_DIR, TEMP_DIR, VERSION_BUILDING as BUILDING, VERSION_TREES as TREES, VERSIONS_DIR,
};
use ferry_contract::versions::SnapshotDigest;
use ferry_contract::{Snapshot, SnapshotBuilder};
use serde::Serialize;

use super::manifest::ManifestCursor;
use super::shared_objects::{Collected, collect_garbage};

/// What the tree in `building/` is being built from: a build from other
/// inputs starts it afresh, since the pull keeps files that its selection
/// leaves out, and those must not end up in another version.
const BUILDING_INPUTS: &str = "building.inputs";
/// The prefix of a tree renamed aside to be removed.
const REMOVING: &str = ".removing-";
/// The link made beside `current` and renamed over it.
const NEXT_LINK: &str = ".current.next";

/// Why versions could not be built or switched.
#[derive(Debug, thiserror::Error)]
pub enum VersionsError {
    /// A filesystem call failed.
    #[error("{what} '{path}': {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Neither a tree nor a finished build of the version asked for.
    #[error(
        "'{dir}' holds no version {digest}: it was never built there, or was removed; stage it again (a pull with --versions)"
    )]
    NoSuchVersion {
        /// The versioned directory.
        dir: PathBuf,
        /// The version asked for.
        digest: SnapshotDigest,
    },
    /// The tree being built is not the version asked for.
    #[error(
        "the version being built in '{dir}' is {found}, not {wanted}: a pull changed it after {wanted} was staged; switch to what the latest pull staged"
    )]
    NotWhatWasBuilt {
        /// The versioned directory.
        dir: PathBuf,
        /// The version asked for.
        wanted: SnapshotDigest,
        /// What the manifests of the build add up to.
        found: String,
    },
    /// A pull still writes the version being built.
    #[error("a pull is still building a version in '{0}'; switch once it has finished")]
    Busy(PathBuf),
    /// `current` is something Ferry did not make.
    #[error("'{0}' is not a link to one of Ferry's versions; move it away, Ferry will not replace it")]
    NotALink(PathBuf),
}

impl VersionsError {
    fn io(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Self + use<> {
        let path = path.to_owned();
        move |source| Self::Io { what, path, source }
    }
}

/// What a switch did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Switched {
    /// The version current before, if any.
    pub from: Option<SnapshotDigest>,
    /// The version current now.
    pub to: Option<SnapshotDigest>,
    /// Whether the tree was sealed by this switch (built by the last pull);
    /// `false` when it was already on disk (nothing copied).
    pub sealed: bool,
    /// Versions removed.
    pub removed: Vec<String>,
    /// Object files no version links any more, removed.
    pub collected: Collected,
}

/// A directory pulled with versions.
#[derive(Clone, Debug)]
pub struct VersionedDir {
    dir: PathBuf,
    versions: PathBuf,
}

impl VersionedDir {
    /// The versioned directory `dir` (nothing is read or made yet).
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_owned(), versions: dir.join(VERSIONS_DIR) }
    }

    /// Whether `dir` holds versions.
    pub fn exists(dir: &Path) -> bool {
        dir.join(VERSIONS_DIR).is_dir()
    }

    /// `DIR` itself.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `DIR/.ferry-versions`: the shared-objects directory of its pulls
    /// unless they are given a node-wide one.
    pub fn versions_dir(&self) -> &Path {
        &self.versions
    }

    /// Where a pull builds the next version.
    pub fn building(&self) -> PathBuf {
        self.versions.join(BUILDING)
    }

    /// Where version `digest` lives once complete.
    pub fn tree(&self, digest: &SnapshotDigest) -> PathBuf {
        self.versions.join(TREES).join(digest.as_str())
    }

    /// Makes the directories a build needs and returns where to build. A
    /// build left by a pull of other `inputs` (source, selection) is
    /// discarded first; one of the same inputs is resumed.
    ///
    /// # Errors
    /// When the directories cannot be made or the old build removed.
    pub fn prepare_build(&self, inputs: &str) -> Result<PathBuf, VersionsError> {
        let trees = self.versions.join(TREES);
        std::fs::create_dir_all(&trees).map_err(VersionsError::io("cannot create", &trees))?;
        let building = self.building();
        let recorded = self.versions.join(BUILDING_INPUTS);
        let same = std::fs::read_to_string(&recorded).is_ok_and(|found| found == inputs);
        if !same && building.exists() {
            tracing::info!(building = %building.display(), "discarding a version built from other inputs");
            remove_aside(&building, &self.versions.join(format!("{REMOVING}{BUILDING}")))?;
        }
        if !same {
            write_synced(&recorded, inputs.as_bytes()).map_err(VersionsError::io("cannot write", &recorded))?;
        }
        Ok(building)
    }

    /// The version `current` names, if any.
    ///
    /// # Errors
    /// When `current` is not a link to a tree.
    pub fn current(&self) -> Result<Option<SnapshotDigest>, VersionsError> {
        let link = self.dir.join(CURRENT_LINK);
        let target = match std::fs::read_link(&link) {
            Ok(target) => target,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) if error.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                return Err(VersionsError::NotALink(link));
            }
            Err(source) => return Err(VersionsError::Io { what: "cannot read", path: link, source }),
        };
        let digest = target
            .strip_prefix(Path::new(VERSIONS_DIR).join(TREES))
            .ok()
            .and_then(|rest| rest.to_str())
            .and_then(|rest| rest.parse().ok());
        digest.map(Some).ok_or(VersionsError::NotALink(link))
    }

    /// The versions on disk, complete ones only.
    ///
    /// # Errors
    /// When the trees cannot be listed.
    pub fn held(&self) -> Result<Vec<SnapshotDigest>, VersionsError> {
        let trees = self.versions.join(TREES);
        let entries = match std::fs::read_dir(&trees) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(VersionsError::Io { what: "cannot list", path: trees, source }),
        };
        let mut held: Vec<SnapshotDigest> =
            entries.flatten().filter_map(|entry| entry.file_name().to_str()?.parse().ok()).collect();
        held.sort();
        Ok(held)
    }

    /// Makes version `to` current and removes every version neither `to`
    /// nor in `keep`, then the objects no version links any more (in
    /// `shared_objects` when the versions link into a node-wide store, else
    /// in their own). `to` is the tree on disk, or else the finished build,
    /// which is sealed first if its manifests add up to `to`. Idempotent;
    /// safe to run again after a crash at any point.
    ///
    /// # Errors
    /// See [`VersionsError`]; on an error, `current` is the old version or
    /// the new one.
    pub fn switch(
        &self,
        to: &SnapshotDigest,
        keep: &[SnapshotDigest],
        shared_objects: Option<&Path>,
    ) -> Result<Switched, VersionsError> {
        let building = self.building();
        if super::staging::live_runs(&building) > 0 {
            return Err(VersionsError::Busy(self.dir.clone()));
        }
        let from = self.current()?;
        let tree = self.tree(to);
        let mut sealed = false;
        if !tree.is_dir() {
            if !building.is_dir() {
                return Err(VersionsError::NoSuchVersion { dir: self.dir.clone(), digest: to.clone() });
            }
            let found = digest_of(&building).map_err(VersionsError::io("cannot read the manifests of", &building))?;
            if found.digest != to.as_str() {
                return Err(VersionsError::NotWhatWasBuilt {
                    dir: self.dir.clone(),
                    wanted: to.clone(),
                    found: found.digest,
                });
            }
            sync_dir(&building).map_err(VersionsError::io("cannot sync", &building))?;
            std::fs::rename(&building, &tree).map_err(VersionsError::io("cannot seal", &tree))?;
            sync_dir(&self.versions.join(TREES)).map_err(VersionsError::io("cannot sync", &tree))?;
            sealed = true;
        }
        if from.as_ref() != Some(to) {
            self.point_current_at(to)?;
        }
        let mut removed = Vec::new();
        let trees = self.versions.join(TREES);
        let entries = std::fs::read_dir(&trees).map_err(VersionsError::io("cannot list", &trees))?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if let Some(aside) = name.strip_prefix(REMOVING) {
                // Left by a removal that was killed: finish it.
                remove_tree(&path)?;
                tracing::debug!(version = aside, "finished removing a version");
                continue;
            }
            let wanted = name.parse::<SnapshotDigest>().is_ok_and(|d| &d == to || keep.contains(&d));
            if !wanted {
                remove_aside(&path, &trees.join(format!("{REMOVING}{name}")))?;
                removed.push(name);
            }
        }
        // A build that was sealed is gone; one of a version already on disk
        // (a change back) is not needed.
        if building.exists() {
            remove_aside(&building, &self.versions.join(format!("{REMOVING}{BUILDING}")))?;
        }
        let store = shared_objects.unwrap_or(&self.versions);
        let collected = collect_garbage(store).map_err(VersionsError::io("cannot collect the objects of", store))?;
        Ok(Switched { from, to: Some(to.clone()), sealed, removed, collected })
    }

    /// Renames a new link to `to`'s tree over `current`: a reader that
    /// resolves `current` gets the old tree or the new one.
    fn point_current_at(&self, to: &SnapshotDigest) -> Result<(), VersionsError> {
        let link = self.dir.join(CURRENT_LINK);
        if let Ok(meta) = std::fs::symlink_metadata(&link)
            && !meta.file_type().is_symlink()
        {
            return Err(VersionsError::NotALink(link));
        }
        let next = self.dir.join(NEXT_LINK);
        match std::fs::remove_file(&next) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(VersionsError::Io { what: "cannot remove", path: next, source }),
        }
        // Relative, so the link means the same wherever DIR is mounted (the
        // node's path, a worker's mount, a pod's).
        let target = Path::new(VERSIONS_DIR).join(TREES).join(to.as_str());
        std::os::unix::fs::symlink(&target, &next).map_err(VersionsError::io("cannot create", &next))?;
        std::fs::rename(&next, &link).map_err(VersionsError::io("cannot switch", &link))?;
        sync_dir(&self.dir).map_err(VersionsError::io("cannot sync", &self.dir))
    }

    /// Removes every version, the link and the objects (a clean-up):
    /// `(files, bytes)` removed, each object file counted once.
    ///
    /// # Errors
    /// When something cannot be removed.
    pub fn remove_all(&self) -> Result<(u64, u64), VersionsError> {
        let link = self.dir.join(CURRENT_LINK);
        if std::fs::symlink_metadata(&link).is_ok_and(|meta| meta.file_type().is_symlink()) {
            std::fs::remove_file(&link).map_err(VersionsError::io("cannot remove", &link))?;
        }
        let _ = std::fs::remove_file(self.dir.join(NEXT_LINK));
        let (files, bytes) = count_objects(&self.versions.join(super::shared_objects::OBJECTS_DIR));
        let aside = self.dir.join(format!("{REMOVING}{VERSIONS_DIR}"));
        if self.versions.exists() {
            remove_aside(&self.versions, &aside)?;
        } else if aside.exists() {
            remove_tree(&aside)?;
        }
        Ok((files, bytes))
    }
}

/// The snapshot the manifests below `tree` add up to: the same sum the
/// pull that wrote them reported.
pub fn digest_of(tree: &Path) -> io::Result<Snapshot> {
    // Manifests from before they were sorted are sorted here first.
    let scratch = tree.join(STATE_DIR).join(TEMP_DIR).join(format!("digest-{}", std::process::id()));
    let mut snapshot = SnapshotBuilder::default();
    let summed = ManifestCursor::open(tree, &scratch).map(|entries| {
        for entry in entries {
            snapshot.add(&entry.path, &entry.etag, entry.size);
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    summed.map(|()| snapshot.finish())
}

/// Renames `path` to `aside`, then removes it: a tree is gone from its
/// name at once, whole, however far the removal gets.
fn remove_aside(path: &Path, aside: &Path) -> Result<(), VersionsError> {
    if aside.exists() {
        remove_tree(aside)?;
    }
    std::fs::rename(path, aside).map_err(VersionsError::io("cannot move aside", path))?;
    remove_tree(aside)
}

fn remove_tree(path: &Path) -> Result<(), VersionsError> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(VersionsError::Io { what: "cannot remove", path: path.to_owned(), source }),
    }
}

fn count_objects(objects: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0, 0);
    for fan in std::fs::read_dir(objects).into_iter().flatten().flatten() {
        for object in std::fs::read_dir(fan.path()).into_iter().flatten().flatten() {
            if let Ok(meta) = object.metadata()
                && meta.is_file()
            {
                files += 1;
                bytes += meta.size();
            }
        }
    }
    (files, bytes)
}

fn write_synced(path: &Path, contents: &[u8]) -> io::Result<()> {
    let next = path.with_extension("next");
    std::fs::write(&next, contents)?;
    std::fs::File::open(&next)?.sync_all()?;
    std::fs::rename(&next, path)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::manifest::{ManifestEntry, ManifestWriter};

    fn digest(snapshot: &Snapshot) -> SnapshotDigest {
        snapshot.digest.parse().unwrap()
    }

    /// Builds a version in `building/` as a pull would: files, hard links
    /// into the objects, and a manifest.
    fn build(dir: &VersionedDir, inputs: &str, files: &[(&str, &str)]) -> Snapshot {
        let building = dir.prepare_build(inputs).unwrap();
        std::fs::create_dir_all(building.join(ferry_contract::layout::STATE_DIR)).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let writer = ManifestWriter::open(&building, "manifest.jsonl", scratch.path()).unwrap();
        let mut snapshot = SnapshotBuilder::default();
        for (path, contents) in files {
            let etag = format!("{:x}", ferry_contract::hash::fnv1a(contents.as_bytes()));
            let object = dir.versions_dir().join("objects").join(&etag[..2]).join(&etag);
            std::fs::create_dir_all(object.parent().unwrap()).unwrap();
            if !object.exists() {
                std::fs::write(&object, contents).unwrap();
            }
            let _ = std::fs::remove_file(building.join(path));
            std::fs::hard_link(&object, building.join(path)).unwrap();
            let entry = ManifestEntry {
                path: (*path).to_owned(),
                key: format!("p/{path}"),
                size: contents.len() as u64,
                etag: etag.clone(),
                checksum: None,
                mtime_ns: 0,
            };
            writer.record(entry, true).unwrap();
            snapshot.add(path, &etag, contents.len() as u64);
        }
        writer.finish(None).unwrap();
        snapshot.finish()
    }

    fn read(dir: &Path, name: &str) -> String {
        std::fs::read_to_string(dir.join(CURRENT_LINK).join(name)).unwrap()
    }

    #[test]
    fn a_switch_seals_the_build_points_current_at_it_and_keeps_what_it_is_told() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        let v1 = build(&dir, "s3://b/p", &[("a", "one"), ("b", "bee")]);
        let switched = dir.switch(&digest(&v1), &[], None).unwrap();
        assert!(switched.sealed && switched.from.is_none());
        assert_eq!(read(root.path(), "a"), "one");
        assert_eq!(dir.current().unwrap(), Some(digest(&v1)));

        // v2 changes one file: the other is the same inode in both trees.
        let v2 = build(&dir, "s3://b/p", &[("a", "two"), ("b", "bee")]);
        let switched = dir.switch(&digest(&v2), &[digest(&v1)], None).unwrap();
        assert_eq!(switched.from, Some(digest(&v1)));
        assert_eq!(read(root.path(), "a"), "two");
        let inode = |v: &Snapshot| std::fs::metadata(dir.tree(&digest(v)).join("b")).unwrap().ino();
        assert_eq!(inode(&v1), inode(&v2), "an unchanged file is linked, not copied");
        assert_eq!(dir.held().unwrap(), {
            let mut both = vec![digest(&v1), digest(&v2)];
            both.sort();
            both
        });

        // Back to v1, which is still there: nothing is built.
        let back = dir.switch(&digest(&v1), &[digest(&v2)], None).unwrap();
        assert!(!back.sealed && back.removed.is_empty());
        assert_eq!(read(root.path(), "a"), "one");

        // Dropping v2 removes its tree and the object only it linked.
        let pruned = dir.switch(&digest(&v1), &[], None).unwrap();
        assert_eq!(pruned.removed, vec![digest(&v2).to_string()]);
        assert_eq!(pruned.collected.objects_removed, 1, "'two' went; 'one' and 'bee' stay");
        assert_eq!(dir.held().unwrap(), vec![digest(&v1)]);
        assert_eq!(read(root.path(), "b"), "bee");
    }

    #[test]
    fn a_build_that_is_not_the_version_asked_for_is_never_made_current() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        let v1 = build(&dir, "s3://b/p", &[("a", "one")]);
        dir.switch(&digest(&v1), &[], None).unwrap();
        build(&dir, "s3://b/p", &[("a", "two")]);
        let other: SnapshotDigest = "0123456789abcdef0123456789abcdef".parse().unwrap();
        assert!(matches!(dir.switch(&other, &[], None), Err(VersionsError::NotWhatWasBuilt { .. })));
        assert_eq!(read(root.path(), "a"), "one", "current is untouched");
        std::fs::remove_dir_all(dir.building()).unwrap();
        assert!(matches!(dir.switch(&other, &[], None), Err(VersionsError::NoSuchVersion { .. })));
    }

    #[test]
    fn a_build_from_other_inputs_starts_afresh_and_one_from_the_same_resumes() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        build(&dir, "s3://b/p include=*", &[("a", "one"), ("b", "bee")]);
        assert!(dir.prepare_build("s3://b/p include=*").unwrap().join("b").exists(), "resumed");
        assert!(!dir.prepare_build("s3://b/p include=a").unwrap().join("b").exists(), "discarded");
    }

    #[test]
    fn every_crash_point_leaves_the_old_version_or_the_new_one_and_the_next_switch_completes() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        let v1 = build(&dir, "i", &[("a", "one")]);
        dir.switch(&digest(&v1), &[], None).unwrap();
        let v2 = build(&dir, "i", &[("a", "two")]);

        // Killed after sealing, before the link: v1 is current, v2 complete.
        std::fs::rename(dir.building(), dir.tree(&digest(&v2))).unwrap();
        assert_eq!(read(root.path(), "a"), "one");
        // Killed after making the next link, before renaming it.
        std::os::unix::fs::symlink("garbage", root.path().join(NEXT_LINK)).unwrap();
        assert_eq!(read(root.path(), "a"), "one");
        // Killed while removing v1 (renamed aside, half gone).
        let switched = dir.switch(&digest(&v2), &[digest(&v1)], None).unwrap();
        assert!(!switched.sealed);
        let aside = dir.versions_dir().join(TREES).join(format!("{REMOVING}{}", digest(&v1)));
        std::fs::rename(dir.tree(&digest(&v1)), &aside).unwrap();
        std::fs::remove_file(aside.join("a")).unwrap();
        assert_eq!(dir.held().unwrap(), vec![digest(&v2)], "a tree set aside is no version");
        let finished = dir.switch(&digest(&v2), &[], None).unwrap();
        assert!(!aside.exists() && finished.removed.is_empty());
        assert_eq!(read(root.path(), "a"), "two");
    }

    #[test]
    fn current_must_be_a_link_ferry_made() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        let v1 = build(&dir, "i", &[("a", "one")]);
        std::fs::create_dir(root.path().join(CURRENT_LINK)).unwrap();
        assert!(matches!(dir.switch(&digest(&v1), &[], None), Err(VersionsError::NotALink(_))));
        std::fs::remove_dir(root.path().join(CURRENT_LINK)).unwrap();
        std::os::unix::fs::symlink("/etc", root.path().join(CURRENT_LINK)).unwrap();
        assert!(matches!(dir.current(), Err(VersionsError::NotALink(_))));
    }

    #[test]
    fn removing_all_takes_the_link_the_trees_and_the_objects() {
        let root = tempfile::tempdir().unwrap();
        let dir = VersionedDir::new(root.path());
        let v1 = build(&dir, "i", &[("a", "one"), ("b", "bee")]);
        dir.switch(&digest(&v1), &[], None).unwrap();
        assert_eq!(dir.remove_all().unwrap(), (2, 6));
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
    }
}
