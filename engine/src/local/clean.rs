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

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::manifest::{ManifestCursor, ManifestEntry};
use super::paths::{KeyPath, key_to_path};
use super::staging::FileStamp;
use ferry_contract::layout::{STATE_DIR, TEMP_DIR};

/// Errors of a clean-up.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    /// A transfer still holds its lock on the directory.
    #[error("a transfer is still running into '{0}'; stop it first")]
    Busy(PathBuf),
    /// Objects of the shared-objects directory could not be collected.
    #[error("cannot remove unused objects from '{path}': {source}")]
    SharedObjects {
        /// The shared-objects directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
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
    /// Staged files kept because they changed since they were staged: the
    /// first [`KEPT_LISTED`] in path order.
    pub kept: Vec<String>,
    /// Files kept that `kept` does not list.
    #[serde(skip_serializing_if = "is_zero")]
    pub kept_not_listed: u64,
    /// Directories removed because the clean-up left them empty.
    pub directories_removed: u64,
    /// What the shared-objects directory let go once the files were removed
    /// (`bytes_freed` counts files other directories may still link).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_objects: Option<super::shared_objects::Collected>,
}

/// How many kept files a [`CleanReport`] names; the rest are counted.
pub const KEPT_LISTED: usize = 1000;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Removes what pulls staged into `root` (every version of a versioned
/// directory, see [`super::versions`]); with the pulls' `shared_objects`
/// directory, then the objects there that no directory links any more.
///
/// # Errors
/// [`CleanError::Busy`] while a transfer runs into `root`;
/// [`CleanError::Remove`] when a file or the state directory cannot be
/// removed; [`CleanError::SharedObjects`] when the shared objects cannot
/// be collected.
pub fn clean(root: &Path, shared_objects: Option<&Path>) -> Result<CleanReport, CleanError> {
    if super::staging::live_runs(root) > 0 {
        return Err(CleanError::Busy(root.to_owned()));
    }
    let mut report = CleanReport::default();
    // A versioned directory: its versions, their link and their objects.
    if super::versions::VersionedDir::exists(root) {
        let versions = super::versions::VersionedDir::new(root);
        if super::staging::live_runs(&versions.building()) > 0 {
            return Err(CleanError::Busy(root.to_owned()));
        }
        let (files, bytes) = versions.remove_all().map_err(|error| CleanError::Remove {
            path: versions.versions_dir().to_owned(),
            source: std::io::Error::other(error.to_string()),
        })?;
        report.files_removed += files;
        report.bytes_freed += bytes;
    }
    let mut remover = Remover::new(root, Directories::Remove);
    // Manifests from before they were sorted are sorted here first; the
    // scratch files go with the state directory below.
    let scratch = root.join(STATE_DIR).join(TEMP_DIR).join(format!("clean-{}", std::process::id()));
    let manifest = ManifestCursor::open(root, &scratch)
        .map_err(|source| CleanError::ReadManifest { path: root.join(STATE_DIR), source })?;
    for entry in manifest {
        match remover.remove(&entry)? {
            Removal::Removed => {
                report.files_removed += 1;
                report.bytes_freed += entry.size;
            }
            // In path order: the list is the first ones.
            Removal::Changed if report.kept.len() < KEPT_LISTED => report.kept.push(entry.path),
            Removal::Changed => report.kept_not_listed += 1,
            Removal::Missing | Removal::Unsafe => {}
        }
    }
    let state = root.join(STATE_DIR);
    match std::fs::remove_dir_all(&state) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(CleanError::Remove { path: state, source }),
    }
    report.directories_removed = remover.finish();
    if let Some(shared) = shared_objects {
        let collected = super::shared_objects::collect_garbage(shared)
            .map_err(|source| CleanError::SharedObjects { path: shared.to_owned(), source })?;
        report.shared_objects = Some(collected);
    }
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

/// Whether a [`Remover`] removes the directories its removals leave empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Directories {
    /// Always (a clean-up, which no transfer runs beside).
    Remove,
    /// Only while no run but the caller's own is staging into the root: a
    /// run may be about to put a file into such a directory, and its cache
    /// of the directories it made would not notice the directory going.
    /// Asked before each one; once another run is seen, no more go.
    UnlessAnotherRun,
    /// Never (another run was seen).
    Keep,
}

/// Removes staged files one manifest entry at a time, only while they are
/// exactly what was staged, and then the directories the removals leave
/// empty. Shared by `clean` and by a pull's `--delete-removed`, so both
/// judge "unchanged since staged" the same way.
///
/// Entries come in path order, in which every directory's files are
/// contiguous (they share its path and a `/`), so the directories still to
/// be tried are only those above the last file removed: a stack, not a set
/// of every directory, and memory does not grow with the tree. When a
/// removal leaves a directory's range, the directory is tried (it goes if
/// it is empty), deepest first.
#[derive(Debug)]
pub struct Remover<'r> {
    root: &'r Path,
    /// Directories above the last file removed, shallowest first.
    open: Vec<PathBuf>,
    directories: Directories,
    directories_removed: u64,
}

impl<'r> Remover<'r> {
    /// A remover for files staged below `root`.
    pub fn new(root: &'r Path, directories: Directories) -> Self {
        Self { root, open: Vec::new(), directories, directories_removed: 0 }
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
                self.close_directories_not_above(&path);
                // What is left open is above `path`; open the rest of its
                // directories below the root.
                let top = self.open.last().map(PathBuf::as_path);
                let below_top: Vec<PathBuf> = path
                    .ancestors()
                    .skip(1)
                    .take_while(|dir| *dir != root && Some(*dir) != top)
                    .map(Path::to_owned)
                    .collect();
                self.open.extend(below_top.into_iter().rev());
                Ok(Removal::Removed)
            }
            Ok(_) => Ok(Removal::Changed),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Removal::Missing),
            Err(source) => Err(CleanError::Remove { path, source }),
        }
    }

    /// Tries the directories left open that are not above `path`, deepest
    /// first: removals have left their range for good.
    fn close_directories_not_above(&mut self, path: &Path) {
        while self.open.last().is_some_and(|dir| !path.starts_with(dir)) {
            let dir = self.open.pop().expect("checked above");
            self.try_directory(&dir);
        }
    }

    /// Removes `dir` if it is empty and directories may go; a directory
    /// that still holds something is simply not empty and stays.
    fn try_directory(&mut self, dir: &Path) {
        if self.directories == Directories::UnlessAnotherRun && super::staging::live_runs(self.root) > 1 {
            tracing::info!("another run is staging into the directory: directories emptied by removals are kept");
            self.directories = Directories::Keep;
        }
        if self.directories != Directories::Keep && std::fs::remove_dir(dir).is_ok() {
            self.directories_removed += 1;
        }
    }

    /// Tries the directories still open, never the root; returns how many
    /// directories the removals emptied and removed.
    pub fn finish(mut self) -> u64 {
        while let Some(dir) = self.open.pop() {
            self.try_directory(&dir);
        }
        self.directories_removed
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
    use crate::local::manifest::{ManifestCursor, ManifestWriter};

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

        let report = clean(root, None).unwrap();
        assert_eq!((report.files_removed, report.bytes_freed), (2, 7));
        assert_eq!(report.kept, ["edited.bin"]);
        assert!(!root.join(STATE_DIR).exists());
        assert!(!root.join("train/a").exists(), "emptied directories go");
        assert_eq!(std::fs::read(root.join("train/b/mine.txt")).unwrap(), b"user data");
        assert_eq!(std::fs::read(root.join("edited.bin")).unwrap(), b"after, longer");
        assert!(root.exists());
    }

    #[test]
    fn directories_are_tried_as_removals_leave_them_and_only_empty_ones_go() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let writer = manifest_writer(root);
        // Names around '/' in byte order ("a.b" < "a/..." < "a0"), deep
        // chains, a directory with a user's file, one with a changed file.
        for rel in ["a.b", "a/x/1", "a/x/y/z/2", "a/x2/3", "a0/4", "b/user/5", "b/kept/6", "c/d/e/f/g/7"] {
            stage(root, &writer, rel, rel.as_bytes());
        }
        writer.finish(None).unwrap();
        std::fs::write(root.join("b/user/mine"), b"user data").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("b/kept/6"), b"edited").unwrap();

        let mut remover = Remover::new(root, Directories::Remove);
        let mut deepest = 0;
        for entry in ManifestCursor::open(root, &root.join(STATE_DIR).join("scratch")).unwrap() {
            remover.remove(&entry).unwrap();
            deepest = deepest.max(remover.open.len());
        }
        assert_eq!(deepest, 5, "only the directories above one file are held");
        assert_eq!(remover.finish(), 11, "a/x/y/z a/x/y a/x a/x2 a a0, and c's five");
        let mut left: Vec<String> = walkdir::WalkDir::new(root)
            .min_depth(1)
            .into_iter()
            .filter_entry(|e| e.file_name() != STATE_DIR)
            .flatten()
            .map(|e| e.path().strip_prefix(root).unwrap().display().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["b", "b/kept", "b/kept/6", "b/user", "b/user/mine"]);
    }

    #[test]
    fn a_report_names_the_first_thousand_files_kept_and_counts_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let writer = manifest_writer(root);
        let rels: Vec<String> = (0..KEPT_LISTED + 5).map(|n| format!("d/{n:05}")).collect();
        for rel in &rels {
            stage(root, &writer, rel, b"staged");
        }
        writer.finish(None).unwrap();
        for rel in &rels {
            std::fs::write(root.join(rel), b"edited since").unwrap();
        }
        let report = clean(root, None).unwrap();
        assert_eq!(report.kept, rels[..KEPT_LISTED], "the first ones, in path order");
        assert_eq!(report.kept_not_listed, 5);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["kept_not_listed"], 5);
        let none_omitted = serde_json::to_value(CleanReport::default()).unwrap();
        assert!(none_omitted.get("kept_not_listed").is_none(), "the report's shape is as before when all are listed");
    }

    #[test]
    fn a_directory_never_staged_into_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep"), b"x").unwrap();
        assert_eq!(clean(dir.path(), None).unwrap(), CleanReport::default());
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
        let report = clean(root, None).unwrap();
        assert_eq!(report.kept, ["sub/x.bin"]);
        assert_eq!(std::fs::read(outside.path().join("sub/x.bin")).unwrap(), b"precious");
    }

    #[test]
    fn a_running_transfer_blocks_the_clean_up() {
        let dir = tempfile::tempdir().unwrap();
        let area = crate::local::staging::StagingArea::open(dir.path()).unwrap();
        assert!(matches!(clean(dir.path(), None), Err(CleanError::Busy(_))));
        area.close();
        assert!(clean(dir.path(), None).is_ok());
    }
}
