//! Removing what earlier pulls staged into a directory (`ferry-stager
//! clean`), which is how a DataStage with `reclaimPolicy: Delete` frees a
//! node's disk.
//!
//! Only files recorded in the manifests are removed, and only while they are
//! still exactly what was staged (same size and mtime): a file someone
//! replaced or edited since is theirs now and is kept. Files Ferry never
//! wrote are never touched. Then the state directory goes, and directories
//! left empty by the removals. The directory itself stays (in a pod it is a
//! mount point).
//!
//! [`Remover`] is that judgement for one file at a time; a pull's
//! `--delete-removed` ([`super::prune`]) uses it too, so the two never
//! disagree about what "unchanged since staged" means.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::STATE_DIR;
use super::manifest::{ManifestCursor, ManifestEntry};
use super::paths::{KeyPath, key_to_path};
use super::staging::FileStamp;

/// Errors of a clean-up.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    /// A transfer still holds its lock on the directory.
    #[error("a transfer is still running into '{0}'; stop it first")]
    Busy(PathBuf),
    /// The manifests could not be read (sorting an old one needs room).
    #[error("cannot read the manifests in '{path}': {source}")]
    ReadManifest {
        /// The state directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Removing failed.
    #[error("cannot remove '{path}': {source}")]
    Remove {
        /// What could not be removed.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// What a clean-up did.
#[derive(Debug, Default, PartialEq, Eq, Serialize)]
pub struct CleanReport {
    /// Staged files removed.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_freed: u64,
    /// Staged files kept because they changed since they were staged.
    pub kept: Vec<String>,
    /// Directories removed because the clean-up left them empty.
    pub directories_removed: u64,
}

/// Removes what pulls staged into `root`.
///
/// # Errors
/// [`CleanError::Busy`] while a transfer runs into `root`;
/// [`CleanError::Remove`] when a file or the state directory cannot be removed.
pub fn clean(root: &Path) -> Result<CleanReport, CleanError> {
    if super::staging::live_runs(root) > 0 {
        return Err(CleanError::Busy(root.to_owned()));
    }
    let mut report = CleanReport::default();
    let mut remover = Remover::new(root);
    // Manifests from before they were sorted are sorted here first; the
    // scratch files go with the state directory below.
    let scratch = root.join(STATE_DIR).join("tmp").join(format!("clean-{}", std::process::id()));
    let manifest = ManifestCursor::open(root, &scratch)
        .map_err(|source| CleanError::ReadManifest { path: root.join(STATE_DIR), source })?;
    for entry in manifest {
        match remover.remove(&entry)? {
            Removal::Removed => {
                report.files_removed += 1;
                report.bytes_freed += entry.size;
            }
            Removal::Changed => report.kept.push(entry.path),
            Removal::Missing | Removal::Unsafe => {}
        }
    }
    let state = root.join(STATE_DIR);
    match std::fs::remove_dir_all(&state) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(CleanError::Remove { path: state, source }),
    }
    report.directories_removed = remover.remove_emptied_directories();
    report.kept.sort();
    Ok(report)
}

/// What became of one staged file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// It was exactly what was staged, and is gone now.
    Removed,
    /// It changed since it was staged (or a directory on its way became a
    /// symlink): it is someone else's now, and stays.
    Changed,
    /// It was not there any more.
    Missing,
    /// The manifest entry does not name a safe path below the root; nothing
    /// was looked at.
    Unsafe,
}

/// Removes staged files one manifest entry at a time, only while they are
/// exactly what was staged, and remembers their directories so that those
/// the removals leave empty can go too. Shared by `clean` and by a pull's
/// `--delete-removed`, so both judge "unchanged since staged" the same way.
#[derive(Debug)]
pub struct Remover<'r> {
    root: &'r Path,
    parents: BTreeSet<PathBuf>,
}

impl<'r> Remover<'r> {
    /// A remover for files staged below `root`.
    pub fn new(root: &'r Path) -> Self {
        Self { root, parents: BTreeSet::new() }
    }

    /// Removes the file `entry` records if it still has the size and mtime
    /// it was staged with.
    ///
    /// # Errors
    /// [`CleanError::Remove`] when the file cannot be examined or removed.
    pub fn remove(&mut self, entry: &ManifestEntry) -> Result<Removal, CleanError> {
        let root = self.root;
        // The manifest is a file on disk: never follow it outside `root`.
        let Ok(KeyPath::File(rel)) = key_to_path(&entry.path) else {
            tracing::warn!(path = %entry.path, "manifest entry is not a safe relative path; ignored");
            return Ok(Removal::Unsafe);
        };
        let path = rel.under(root);
        if through_a_symlink(root, &path) {
            tracing::warn!(path = %entry.path, "a directory on the way is a symlink now; file kept");
            return Ok(Removal::Changed);
        }
        match FileStamp::of(&path) {
            Ok(stamp) if stamp.size == entry.size && stamp.mtime_ns == entry.mtime_ns => {
                std::fs::remove_file(&path).map_err(|source| CleanError::Remove { path: path.clone(), source })?;
                self.parents.extend(path.ancestors().skip(1).take_while(|p| *p != root).map(Path::to_owned));
                Ok(Removal::Removed)
            }
            Ok(_) => Ok(Removal::Changed),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Removal::Missing),
            Err(source) => Err(CleanError::Remove { path, source }),
        }
    }

    /// Removes the directories that held removed files and are empty now,
    /// never the root; returns how many went.
    pub fn remove_emptied_directories(self) -> u64 {
        // Deepest first, so a parent is tried after its children; a directory
        // that still holds something is simply not empty and stays.
        let mut parents: Vec<PathBuf> = self.parents.into_iter().collect();
        parents.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        parents.into_iter().filter(|dir| std::fs::remove_dir(dir).is_ok()).count() as u64
    }
}

/// Whether a directory between `root` and `path` is a symlink, which could
/// lead a removal outside `root`.
fn through_a_symlink(root: &Path, path: &Path) -> bool {
    path.ancestors()
        .skip(1)
        .take_while(|p| *p != root)
        .any(|dir| std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::manifest::ManifestWriter;

    fn manifest_writer(root: &Path) -> ManifestWriter {
        std::fs::create_dir_all(root.join(STATE_DIR)).unwrap();
        ManifestWriter::open(root, "manifest.jsonl", &root.join(STATE_DIR).join("scratch")).unwrap()
    }

    fn stage(root: &Path, writer: &ManifestWriter, rel: &str, data: &[u8]) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, data).unwrap();
        let stamp = FileStamp::of(&path).unwrap();
        let entry = ManifestEntry {
            path: rel.into(),
            key: format!("prefix/{rel}"),
            size: stamp.size,
            etag: "\"e\"".into(),
            checksum: None,
            mtime_ns: stamp.mtime_ns,
        };
        writer.record(entry, true).unwrap();
    }

    #[test]
    fn staged_files_go_and_everything_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let writer = manifest_writer(root);
        stage(root, &writer, "train/a/0.bin", b"zero");
        stage(root, &writer, "train/b/1.bin", b"one");
        stage(root, &writer, "edited.bin", b"before");
        writer.finish(None).unwrap();
        std::fs::write(root.join("train/b/mine.txt"), b"user data").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("edited.bin"), b"after, longer").unwrap();

        let report = clean(root).unwrap();
        assert_eq!((report.files_removed, report.bytes_freed), (2, 7));
        assert_eq!(report.kept, ["edited.bin"]);
        assert!(!root.join(STATE_DIR).exists());
        assert!(!root.join("train/a").exists(), "emptied directories go");
        assert_eq!(std::fs::read(root.join("train/b/mine.txt")).unwrap(), b"user data");
        assert_eq!(std::fs::read(root.join("edited.bin")).unwrap(), b"after, longer");
        assert!(root.exists());
    }

    #[test]
    fn a_directory_never_staged_into_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep"), b"x").unwrap();
        assert_eq!(clean(dir.path()).unwrap(), CleanReport::default());
        assert!(dir.path().join("keep").exists());
    }

    #[test]
    fn a_directory_swapped_for_a_symlink_does_not_lead_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = dir.path();
        let writer = manifest_writer(root);
        stage(root, &writer, "sub/x.bin", b"precious");
        writer.finish(None).unwrap();
        // The same file (same size and mtime) now lives outside, reached through a link.
        std::fs::rename(root.join("sub"), outside.path().join("sub")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("sub"), root.join("sub")).unwrap();
        let report = clean(root).unwrap();
        assert_eq!(report.kept, ["sub/x.bin"]);
        assert_eq!(std::fs::read(outside.path().join("sub/x.bin")).unwrap(), b"precious");
    }

    #[test]
    fn a_running_transfer_blocks_the_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let area = crate::local::staging::StagingArea::open(dir.path()).unwrap();
        assert!(matches!(clean(dir.path()), Err(CleanError::Busy(_))));
        area.close();
        assert!(clean(dir.path()).is_ok());
    }
}
