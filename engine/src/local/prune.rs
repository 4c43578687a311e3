//! A pull's `--delete-removed`: which staged files belong to objects that
//! left the store, and removing them.
//!
//! The candidates are manifest entries (written by earlier runs, any shard's
//! manifest) in the pull's own scope: staged from a key below the same
//! prefix, and selected by the same include/exclude globs and shard, so
//! shards sharing a directory never remove each other's files and a pull of
//! one prefix never judges what another prefix staged. The pull walks the
//! manifest in step with its listing (both in key order), and every entry
//! the listing goes past without showing its object is a candidate
//! ([`Departed::passed`]). Candidates go to a file in path order, not to
//! memory: a dataset can lose millions of objects at once.
//!
//! Removing reuses `clean`'s judgement ([`Remover`]): a file goes only while
//! it has the size and mtime it was staged with, files changed since are
//! kept and logged, and files Ferry did not write are never candidates.
//!
//! This module does not decide *whether* to remove: a pull removes nothing
//! unless its listing finished in key order and every object is in place
//! (see `pull`).

use std::io;
use std::path::Path;

use super::clean::{Directories, Removal, Remover};
use super::manifest::ManifestEntry;
use super::sorted::{RunWriter, SortedRun};
use crate::selection::Selection;

/// The manifest entries in one pull's scope whose objects the listing went
/// past without showing, in path order, on disk.
#[derive(Debug)]
pub struct Departed<'s> {
    prefix: String,
    selection: &'s Selection,
    entries: RunWriter<ManifestEntry>,
    count: u64,
}

impl<'s> Departed<'s> {
    /// Candidates of a pull of `prefix` with `selection`, written to the
    /// file `path`.
    ///
    /// # Errors
    /// Fails when the file cannot be created.
    pub fn new(path: &Path, prefix: &str, selection: &'s Selection) -> io::Result<Self> {
        Ok(Self { prefix: prefix.to_owned(), selection, entries: RunWriter::create(path)?, count: 0 })
    }

    /// The listing went past `entry` without showing its object. It is a
    /// candidate when it is in scope: its key is the prefix followed by
    /// exactly its path (the relative key the listing would have shown),
    /// and the selection selects that relative key. Entries out of scope
    /// are not this pull's to judge, or to keep in its manifest.
    ///
    /// # Errors
    /// Fails when the candidate cannot be written.
    pub fn passed(&mut self, entry: ManifestEntry) -> io::Result<()> {
        let in_scope = entry.key.strip_prefix(self.prefix.as_str()) == Some(entry.path.as_str())
            && self.selection.selects(&entry.path);
        if !in_scope {
            return Ok(());
        }
        self.count += 1;
        self.entries.write(&entry)
    }

    /// Candidates so far.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The candidates, in path order.
    ///
    /// # Errors
    /// Fails when the file cannot be flushed.
    pub fn finish(self) -> io::Result<SortedRun<ManifestEntry>> {
        self.entries.finish()
    }
}

/// What removing the files of departed objects did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Files removed.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Files kept because they changed since they were staged (each is
    /// logged).
    pub kept: u64,
    /// Entries whose file could not be examined or removed: they go to
    /// `retained`, for the manifest to keep, so a later run tries again.
    pub retained: u64,
    /// Directories removed because the removals left them empty.
    pub directories_removed: u64,
}

/// Removes the files of `departed` entries (in path order) below `root`
/// that are unchanged since they were staged, and the directories that
/// leaves empty as the removals move past them, unless another run is
/// staging into `root` (the caller's own run holds one lock): it may be
/// about to rename a file into such a directory, and its cache of
/// directories it made would not notice the directory going. Entries whose
/// files cannot be examined or removed are written to `retained`.
///
/// # Errors
/// Fails when `departed` cannot be read or `retained` written.
pub fn prune(
    root: &Path,
    departed: impl IntoIterator<Item = io::Result<ManifestEntry>>,
    retained: &mut RunWriter<ManifestEntry>,
) -> io::Result<Pruned> {
    let mut pruned = Pruned::default();
    let mut remover = Remover::new(root, Directories::UnlessAnotherRun);
    for entry in departed {
        let entry = entry?;
        match remover.remove(&entry) {
            Ok(Removal::Removed) => {
                tracing::debug!(path = %entry.path, key = %entry.key, "removed: its object left the store");
                pruned.files_removed += 1;
                pruned.bytes_removed += entry.size;
            }
            Ok(Removal::Changed) => {
                tracing::warn!(path = %entry.path, key = %entry.key, "kept: its object left the store, but the file changed since it was staged");
                pruned.kept += 1;
            }
            Ok(Removal::Missing | Removal::Unsafe) => {}
            Err(error) => {
                tracing::warn!(path = %entry.path, error = %crate::error_chain(&error), "cannot remove a file whose object left the store; a later run tries again");
                pruned.retained += 1;
                retained.write(&entry)?;
            }
        }
    }
    pruned.directories_removed = remover.finish();
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::manifest::{ManifestCursor, ManifestWriter};
    use crate::local::staging::{FileStamp, StagingArea};
    use crate::selection::Shard;
    use ferry_contract::layout::STATE_DIR;

    /// Stages `files` (relative path → content) under `root` as a pull of
    /// `prefix` would have, with a manifest that records them.
    fn staged(root: &Path, prefix: &str, files: &[(&str, &[u8])]) {
        std::fs::create_dir_all(root.join(STATE_DIR)).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let writer = ManifestWriter::open(root, "manifest.jsonl", scratch.path()).unwrap();
        for (rel, data) in files {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, data).unwrap();
            let stamp = FileStamp::of(&path).unwrap();
            let entry = ManifestEntry {
                path: (*rel).into(),
                key: format!("{prefix}{rel}"),
                size: stamp.size,
                etag: "e".into(),
                checksum: None,
                mtime_ns: stamp.mtime_ns,
            };
            writer.record(entry, true).unwrap();
        }
        writer.finish(None).unwrap();
    }

    /// The candidates of a pull of `prefix` with `selection` into `root`
    /// whose listing showed the relative keys `listed` (in order).
    fn departed(root: &Path, prefix: &str, selection: &Selection, listed: &[&str]) -> Vec<ManifestEntry> {
        let scratch = tempfile::tempdir().unwrap();
        let mut cursor = ManifestCursor::open(root, scratch.path()).unwrap();
        let mut departed = Departed::new(&scratch.path().join("departed"), prefix, selection).unwrap();
        for key in listed {
            cursor.seek(key, |entry| departed.passed(entry)).unwrap();
        }
        cursor.drain(|entry| departed.passed(entry)).unwrap();
        let count = departed.len();
        let entries: Vec<ManifestEntry> = departed.finish().unwrap().stream().unwrap().map(Result::unwrap).collect();
        assert_eq!(entries.len() as u64, count);
        entries
    }

    fn paths(entries: &[ManifestEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.path.as_str()).collect()
    }

    /// Prunes `entries`; returns what it did and the entries it retained.
    fn pruned(root: &Path, entries: Vec<ManifestEntry>) -> (Pruned, Vec<ManifestEntry>) {
        let scratch = tempfile::tempdir().unwrap();
        let mut retained = RunWriter::create(&scratch.path().join("retained")).unwrap();
        let pruned = prune(root, entries.into_iter().map(Ok), &mut retained).unwrap();
        let retained = retained.finish().unwrap().stream().unwrap().map(Result::unwrap).collect();
        (pruned, retained)
    }

    #[test]
    fn only_entries_of_the_same_prefix_and_selection_are_candidates() {
        let dir = tempfile::tempdir().unwrap();
        staged(dir.path(), "data/", &[("a.bin", b"a"), ("b.txt", b"b"), ("sub/c.bin", b"c")]);
        assert_eq!(departed(dir.path(), "data/", &Selection::all(), &[]).len(), 3);
        assert!(
            departed(dir.path(), "other/", &Selection::all(), &[]).is_empty(),
            "what another prefix staged is not this pull's to judge"
        );
        let bins = Selection::new(&["*.bin".into()], &[], None).unwrap();
        assert_eq!(paths(&departed(dir.path(), "data/", &bins, &[])), ["a.bin", "sub/c.bin"]);

        // Shards of one dataset split the candidates exactly as they split the objects.
        let mut seen = Vec::new();
        for index in 0..3 {
            let shard = Selection::new(&[], &[], Some(Shard { index, count: 3 })).unwrap();
            for entry in departed(dir.path(), "data/", &shard, &[]) {
                assert!(shard.selects(&entry.path));
                seen.push(entry.path);
            }
        }
        seen.sort();
        assert_eq!(seen, ["a.bin", "b.txt", "sub/c.bin"]);
    }

    #[test]
    fn listed_keys_are_struck_off_by_their_key_relative_to_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        staged(dir.path(), "data/", &[("a.bin", b"a"), ("sub/c.bin", b"c")]);
        // A full key is not the relative key of a.bin.
        assert_eq!(paths(&departed(dir.path(), "data/", &Selection::all(), &["data/a.bin", "sub/c.bin"])), ["a.bin"]);
    }

    #[test]
    fn keys_that_sort_around_a_directory_are_matched_exactly() {
        let dir = tempfile::tempdir().unwrap();
        // Byte order: "a-x" < "a.b" < "a/b" < "a0"; a walk of directories
        // would give "a/b" before "a.b".
        staged(dir.path(), "", &[("a/b", b"1"), ("a.b", b"2"), ("a-x", b"3"), ("a0", b"4"), ("é", b"5")]);
        assert_eq!(paths(&departed(dir.path(), "", &Selection::all(), &["a-x", "a/b", "é"])), ["a.b", "a0"]);
    }

    #[test]
    fn unchanged_files_go_changed_ones_stay_and_emptied_directories_go() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        staged(root, "", &[("gone/deep/a.bin", b"aaaa"), ("edited.bin", b"before"), ("shared/b.bin", b"bb")]);
        std::fs::write(root.join("shared/mine.txt"), b"user data").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("edited.bin"), b"after, longer").unwrap();

        let (pruned, retained) = pruned(root, departed(root, "", &Selection::all(), &[]));
        assert_eq!((pruned.files_removed, pruned.bytes_removed), (2, 6));
        assert_eq!(pruned.kept, 1, "edited.bin");
        assert!(retained.is_empty());
        assert_eq!(pruned.directories_removed, 2, "gone/deep and gone");
        assert!(!root.join("gone").exists());
        assert_eq!(std::fs::read(root.join("shared/mine.txt")).unwrap(), b"user data");
        assert_eq!(std::fs::read(root.join("edited.bin")).unwrap(), b"after, longer");
        assert!(root.join(STATE_DIR).is_dir(), "pruning leaves Ferry's state alone");
    }

    #[test]
    fn while_another_run_stages_beside_emptied_directories_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        staged(root, "", &[("a/1.bin", b"1"), ("b/2.bin", b"2")]);
        let (own, other) = (StagingArea::open(root).unwrap(), StagingArea::open(root).unwrap());
        let (beside, _) = pruned(root, departed(root, "", &Selection::all(), &[]));
        assert_eq!((beside.files_removed, beside.directories_removed), (2, 0));
        assert!(root.join("a").is_dir() && root.join("b").is_dir());
        other.close();
        // Alone again: a later pass removes what it empties.
        staged(root, "", &[("c/3.bin", b"3")]);
        let (alone, _) = pruned(root, departed(root, "", &Selection::all(), &[]));
        assert_eq!((alone.files_removed, alone.directories_removed), (1, 1));
        assert!(!root.join("c").exists());
        own.close();
    }

    #[test]
    fn entries_naming_unsafe_paths_remove_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), b"x").unwrap();
        let stamp = FileStamp::of(&outside.path().join("victim")).unwrap();
        // A tampered manifest pointing out of the destination, at a file
        // with exactly the recorded size and mtime.
        let name = outside.path().file_name().unwrap().to_str().unwrap();
        let escape = format!("../{name}/victim");
        assert!(dir.path().join(&escape).exists(), "both temporary directories share a parent");
        let entry = ManifestEntry {
            path: escape.clone(),
            key: escape,
            size: stamp.size,
            etag: "e".into(),
            checksum: None,
            mtime_ns: stamp.mtime_ns,
        };
        assert_eq!(pruned(dir.path(), vec![entry]), (Pruned::default(), vec![]));
        assert!(outside.path().join("victim").exists());
    }

    #[test]
    fn a_file_that_cannot_be_examined_stays_in_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        staged(root, "", &[("was-a-dir/a.bin", b"a"), ("plain.bin", b"p")]);
        // Its directory became a regular file: looking at the file fails
        // with something other than "not found".
        std::fs::remove_dir_all(root.join("was-a-dir")).unwrap();
        std::fs::write(root.join("was-a-dir"), b"now a file").unwrap();
        let (pruned, retained) = pruned(root, departed(root, "", &Selection::all(), &[]));
        assert_eq!(paths(&retained), ["was-a-dir/a.bin"]);
        assert_eq!((pruned.files_removed, pruned.retained), (1, 1));
        assert_eq!(std::fs::read(root.join("was-a-dir")).unwrap(), b"now a file");
    }
}
