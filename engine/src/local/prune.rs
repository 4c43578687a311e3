//! A pull's `--delete-removed`: which staged files belong to objects that
//! left the store, and removing them.
//!
//! The candidates are manifest entries (written by earlier runs, any shard's
//! manifest) in the pull's own scope: staged from a key below the same
//! prefix, and selected by the same include/exclude globs and shard, so
//! shards sharing a directory never remove each other's files and a pull of
//! one prefix never judges what another prefix staged. As the listing goes
//! by, every listed key is struck off ([`Departed::listed`]); what is left
//! when the listing has finished has left the store.
//!
//! Removing reuses `clean`'s judgement ([`Remover`]): a file goes only while
//! it has the size and mtime it was staged with, files changed since are
//! kept and logged, and files Ferry did not write are never candidates.
//!
//! This module does not decide *whether* to remove: a pull removes nothing
//! unless its listing finished and every object is in place (see `pull`).

use std::collections::HashMap;
use std::path::Path;

use super::clean::{Removal, Remover};
use super::manifest::{Manifest, ManifestEntry};
use crate::selection::Selection;

/// The manifest entries in one pull's scope whose objects the listing has
/// not shown (yet), by relative path.
#[derive(Debug)]
pub struct Departed<'m> {
    unseen: HashMap<&'m str, &'m ManifestEntry>,
}

impl<'m> Departed<'m> {
    /// The entries of `manifest` in the scope of a pull of `prefix` with
    /// `selection`. An entry is in scope when its key is `prefix` followed
    /// by exactly its path (the relative key the listing will show for it)
    /// and `selection` selects that relative key.
    pub fn new(manifest: &'m Manifest, prefix: &str, selection: &Selection) -> Self {
        let unseen = manifest
            .entries()
            .filter(|entry| entry.key.strip_prefix(prefix) == Some(entry.path.as_str()))
            .filter(|entry| selection.selects(&entry.path))
            .map(|entry| (entry.path.as_str(), entry))
            .collect();
        Self { unseen }
    }

    /// The listing showed an object at `relative_key` (the key with the
    /// prefix stripped), whether or not it can be staged: an object still
    /// in the store has not left it, even when its key is refused.
    pub fn listed(&mut self, relative_key: &str) {
        self.unseen.remove(relative_key);
    }

    /// Entries not listed so far.
    pub fn len(&self) -> usize {
        self.unseen.len()
    }

    /// Whether every entry in scope has been listed.
    pub fn is_empty(&self) -> bool {
        self.unseen.is_empty()
    }

    /// The entries never listed, in path order.
    pub fn into_entries(self) -> Vec<ManifestEntry> {
        let mut entries: Vec<ManifestEntry> = self.unseen.into_values().cloned().collect();
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        entries
    }
}

/// What removing the files of departed objects did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Files removed.
    pub files_removed: u64,
    /// Their bytes.
    pub bytes_removed: u64,
    /// Files kept because they changed since they were staged.
    pub kept: Vec<String>,
    /// Entries whose file could not be examined or removed: the manifest
    /// keeps them, so a later run tries again.
    pub retained: Vec<ManifestEntry>,
    /// Directories removed because the removals left them empty.
    pub directories_removed: u64,
}

/// Removes the files of `departed` entries below `root` that are unchanged
/// since they were staged, then the directories that left empty, unless
/// another run is staging into `root` (the caller's own run holds one lock):
/// it may be about to rename a file into such a directory, and its cache of
/// directories it made would not notice the directory going.
pub fn prune(root: &Path, departed: Vec<ManifestEntry>) -> Pruned {
    let mut pruned = Pruned::default();
    let mut remover = Remover::new(root);
    for entry in departed {
        match remover.remove(&entry) {
            Ok(Removal::Removed) => {
                tracing::debug!(path = %entry.path, key = %entry.key, "removed: its object left the store");
                pruned.files_removed += 1;
                pruned.bytes_removed += entry.size;
            }
            Ok(Removal::Changed) => {
                tracing::warn!(path = %entry.path, key = %entry.key, "kept: its object left the store, but the file changed since it was staged");
                pruned.kept.push(entry.path);
            }
            Ok(Removal::Missing | Removal::Unsafe) => {}
            Err(error) => {
                tracing::warn!(path = %entry.path, error = %crate::error_chain(&error), "cannot remove a file whose object left the store; a later run tries again");
                pruned.retained.push(entry);
            }
        }
    }
    if super::staging::live_runs(root) <= 1 {
        pruned.directories_removed = remover.remove_emptied_directories();
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::STATE_DIR;
    use crate::local::manifest::ManifestWriter;
    use crate::local::staging::FileStamp;
    use crate::selection::Shard;

    /// Stages `files` (relative path → content) under `root` as a pull of
    /// `prefix` would have, and returns the manifest that records them.
    fn staged(root: &Path, prefix: &str, files: &[(&str, &[u8])]) -> Manifest {
        std::fs::create_dir_all(root.join(STATE_DIR)).unwrap();
        let writer = ManifestWriter::open(root, "manifest.jsonl").unwrap();
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
        writer.finish().unwrap();
        Manifest::load(root)
    }

    fn paths(entries: &[ManifestEntry]) -> Vec<&str> {
        entries.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn only_entries_of_the_same_prefix_and_selection_are_candidates() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = staged(dir.path(), "data/", &[("a.bin", b"a"), ("b.txt", b"b"), ("sub/c.bin", b"c")]);
        let everything = Departed::new(&manifest, "data/", &Selection::all());
        assert_eq!(everything.len(), 3);
        let other_prefix = Departed::new(&manifest, "other/", &Selection::all());
        assert!(other_prefix.is_empty(), "what another prefix staged is not this pull's to judge");
        let bins = Selection::new(&["*.bin".into()], &[], None).unwrap();
        assert_eq!(paths(&Departed::new(&manifest, "data/", &bins).into_entries()), ["a.bin", "sub/c.bin"]);

        // Shards of one dataset split the candidates exactly as they split the objects.
        let mut seen = Vec::new();
        for index in 0..3 {
            let shard = Selection::new(&[], &[], Some(Shard { index, count: 3 })).unwrap();
            for entry in Departed::new(&manifest, "data/", &shard).into_entries() {
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
        let manifest = staged(dir.path(), "data/", &[("a.bin", b"a"), ("sub/c.bin", b"c")]);
        let mut departed = Departed::new(&manifest, "data/", &Selection::all());
        departed.listed("sub/c.bin");
        departed.listed("data/a.bin"); // a full key is not the relative key of a.bin
        assert_eq!(paths(&departed.into_entries()), ["a.bin"]);
    }

    #[test]
    fn unchanged_files_go_changed_ones_stay_and_emptied_directories_go() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let manifest =
            staged(root, "", &[("gone/deep/a.bin", b"aaaa"), ("edited.bin", b"before"), ("shared/b.bin", b"bb")]);
        std::fs::write(root.join("shared/mine.txt"), b"user data").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(root.join("edited.bin"), b"after, longer").unwrap();

        let pruned = prune(root, Departed::new(&manifest, "", &Selection::all()).into_entries());
        assert_eq!((pruned.files_removed, pruned.bytes_removed), (2, 6));
        assert_eq!(pruned.kept, ["edited.bin"]);
        assert!(pruned.retained.is_empty());
        assert_eq!(pruned.directories_removed, 2, "gone/deep and gone");
        assert!(!root.join("gone").exists());
        assert_eq!(std::fs::read(root.join("shared/mine.txt")).unwrap(), b"user data");
        assert_eq!(std::fs::read(root.join("edited.bin")).unwrap(), b"after, longer");
        assert!(root.join(STATE_DIR).is_dir(), "pruning leaves Ferry's state alone");
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
        assert_eq!(prune(dir.path(), vec![entry]), Pruned::default());
        assert!(outside.path().join("victim").exists());
    }

    #[test]
    fn a_file_that_cannot_be_examined_stays_in_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let manifest = staged(root, "", &[("was-a-dir/a.bin", b"a"), ("plain.bin", b"p")]);
        // Its directory became a regular file: looking at the file fails
        // with something other than "not found".
        std::fs::remove_dir_all(root.join("was-a-dir")).unwrap();
        std::fs::write(root.join("was-a-dir"), b"now a file").unwrap();
        let pruned = prune(root, Departed::new(&manifest, "", &Selection::all()).into_entries());
        assert_eq!(paths(&pruned.retained), ["was-a-dir/a.bin"]);
        assert_eq!(pruned.files_removed, 1);
        assert_eq!(std::fs::read(root.join("was-a-dir")).unwrap(), b"now a file");
    }
}
