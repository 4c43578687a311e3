//! Walking a directory for a push: every regular file below the root, as a
//! key-ready relative path, streamed so uploads start before the walk ends.
//!
//! Files come in the byte order of their keys, the order a store lists
//! them in, which is what lets a re-run compare the walk with the push
//! state and the store's listing by merging. That needs each directory's
//! entries sorted before the first is visited. A directory's entries are
//! read and sorted in memory up to [`DIRECTORY_MEMORY`] bytes of them; a
//! larger one (a flat directory of ten million files) is sorted on disk
//! with [`SortedWriter`] in a scratch directory, so the walk's memory does
//! not grow with the size of a directory, only with its depth.
//!
//! Symlinks are not followed out of the root: a link to a file inside the
//! root is uploaded with the target's content under the link's name; a link
//! that leads outside, or to a directory, is refused and reported. A name
//! that is not UTF-8 cannot become a key: such a file, or a directory with
//! everything below it, is refused as one entry.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::paths::{RelPath, path_to_key};
use super::sorted::{Keyed, Merged, SortedRun, SortedWriter};
use ferry_contract::layout::STATE_DIR;

/// Bytes of entries of one directory held in memory; a directory with more
/// is sorted on disk. A directory of 10,000 files of ImageNet-like names
/// takes about 0.7 MiB.
pub const DIRECTORY_MEMORY: usize = 1 << 20;

/// A file to upload.
#[derive(Debug, Clone)]
pub struct LocalFile {
    /// Where to read it from (the symlink's target for links).
    pub path: PathBuf,
    /// Its path relative to the root; becomes the key below the prefix.
    pub rel: RelPath,
    /// Size in bytes when walked.
    pub size: u64,
    /// Modification time when walked, in nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// A file's modification time in nanoseconds since the epoch, the unit the
/// push state records.
pub fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime() * 1_000_000_000 + meta.mtime_nsec()
}

/// An entry that cannot be uploaded.
#[derive(Debug, Clone)]
pub struct Refused {
    /// The entry, relative to the root.
    pub name: String,
    /// Why.
    pub reason: String,
}

/// What a directory entry is, as its directory reports it (symlinks not
/// followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Kind {
    #[serde(rename = "d")]
    Directory,
    #[serde(rename = "f")]
    File,
    #[serde(rename = "l")]
    Symlink,
    #[serde(rename = "o")]
    Other,
}

impl Kind {
    fn of(file_type: std::fs::FileType) -> Self {
        if file_type.is_dir() {
            Self::Directory
        } else if file_type.is_file() {
            Self::File
        } else if file_type.is_symlink() {
            Self::Symlink
        } else {
            Self::Other
        }
    }
}

/// One entry of a directory, as it is sorted (and, for a large directory,
/// written to disk).
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    /// The name, followed by `/` for a directory: a depth-first walk then
    /// yields files in the byte order of their keys. (Sorting plain names
    /// would walk `a/b` before `a.b`, but `.` sorts before `/`.) A symlink
    /// to a directory is not followed, so it sorts as a plain name.
    #[serde(rename = "k")]
    key: String,
    #[serde(rename = "t")]
    kind: Kind,
}

impl Entry {
    fn new(name: &str, kind: Kind) -> Self {
        let mut key = String::with_capacity(name.len() + 1);
        key.push_str(name);
        if kind == Kind::Directory {
            key.push('/');
        }
        Self { key, kind }
    }

    fn name(&self) -> &str {
        if self.kind == Kind::Directory { &self.key[..self.key.len() - 1] } else { &self.key }
    }
}

impl Keyed for Entry {
    fn sort_key(&self) -> &str {
        &self.key
    }

    fn resident_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.key.capacity()
    }
}

/// The sorted entries of one open directory.
enum Listing {
    Memory(std::vec::IntoIter<Entry>),
    /// Sorted on disk; the runs are removed when the directory is left.
    Disk {
        merged: Merged<Entry>,
        runs: Vec<SortedRun<Entry>>,
    },
}

impl Iterator for Listing {
    type Item = std::io::Result<Entry>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Self::Memory(entries) => entries.next().map(Ok),
            Self::Disk { merged, .. } => merged.next(),
        }
    }
}

impl Drop for Listing {
    fn drop(&mut self) {
        if let Self::Disk { runs, .. } = self {
            for run in runs.drain(..) {
                run.remove();
            }
        }
    }
}

/// Where large directories are sorted: made when the first one is met,
/// removed with everything in it when the walk ends.
struct Scratch {
    dir: Option<PathBuf>,
    state: ScratchState,
    /// Names of the sorts made so far, so that no two share run files.
    sorts: u64,
}

enum ScratchState {
    NotNeededYet,
    Made,
    /// It could not be made: large directories are sorted in memory.
    Unavailable,
}

impl Scratch {
    /// A sort on disk of its own that holds `memory` bytes, if the scratch
    /// directory is there or can be made. When it is unavailable this is
    /// asked for every entry past `memory`, so it answers `None` before
    /// doing anything else.
    fn sorter(&mut self, memory: usize) -> Option<SortedWriter<Entry>> {
        let dir = self.dir()?.to_path_buf();
        self.sorts += 1;
        Some(SortedWriter::new(&dir, &format!("directory-{}", self.sorts), memory))
    }

    fn dir(&mut self) -> Option<&Path> {
        let dir = self.dir.as_deref()?;
        if matches!(self.state, ScratchState::NotNeededYet) {
            self.state = match std::fs::create_dir_all(dir) {
                Ok(()) => ScratchState::Made,
                Err(error) => {
                    tracing::warn!(
                        dir = %dir.display(),
                        %error,
                        "cannot sort large directories on disk: their entries are sorted in memory"
                    );
                    ScratchState::Unavailable
                }
            };
        }
        matches!(self.state, ScratchState::Made).then_some(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let (Some(dir), ScratchState::Made) = (&self.dir, &self.state) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A directory being walked: its path and the entries not visited yet.
struct Open {
    path: PathBuf,
    listing: Listing,
}

/// Walks `root`, sending each file (or refusal) to `emit`, in the byte
/// order of their keys; stops early when `emit` returns false. Directories
/// too large to sort in memory are sorted in `scratch` (made when needed,
/// removed at the end); without one, or when it cannot be made, they are
/// sorted in memory. Runs on a blocking thread.
///
/// # Errors
/// Fails when the root cannot be read.
pub fn walk(
    root: &Path,
    scratch: Option<PathBuf>,
    emit: impl FnMut(Result<LocalFile, Refused>) -> bool,
) -> std::io::Result<()> {
    walk_with_memory(root, scratch, DIRECTORY_MEMORY, emit)
}

fn walk_with_memory(
    root: &Path,
    scratch: Option<PathBuf>,
    directory_memory: usize,
    mut emit: impl FnMut(Result<LocalFile, Refused>) -> bool,
) -> std::io::Result<()> {
    let canonical_root = root.canonicalize()?;
    let mut scratch = Scratch { dir: scratch, state: ScratchState::NotNeededYet, sorts: 0 };
    let mut refusals = Vec::new();
    let listing = read_directory(root, root, &mut scratch, directory_memory, &mut refusals)?;
    let mut open = vec![Open { path: root.to_path_buf(), listing }];
    loop {
        for refused in refusals.drain(..) {
            if !emit(Err(refused)) {
                return Ok(());
            }
        }
        let at_root = open.len() == 1;
        let Some(directory) = open.last_mut() else { return Ok(()) };
        let entry = match directory.listing.next() {
            Some(Ok(entry)) => entry,
            Some(Err(error)) => {
                let name = relative_name(root, &directory.path);
                let reason = format!("the directory's sorted entries cannot be read back: {error}");
                refusals.push(Refused { name, reason });
                open.pop();
                continue;
            }
            None => {
                open.pop();
                continue;
            }
        };
        if at_root && entry.name() == STATE_DIR {
            continue;
        }
        let path = directory.path.join(entry.name());
        let Some(rel) = path.strip_prefix(root).ok().and_then(path_to_key) else { continue };
        let refuse = |reason: &str| Err(Refused { name: rel.to_string(), reason: reason.to_owned() });
        let item = match entry.kind {
            Kind::Directory => {
                match read_directory(root, &path, &mut scratch, directory_memory, &mut refusals) {
                    Ok(listing) => open.push(Open { path, listing }),
                    Err(error) => refusals.push(Refused { name: rel.to_string(), reason: error.to_string() }),
                }
                continue;
            }
            Kind::Symlink => match path.canonicalize() {
                Ok(target) if !target.starts_with(&canonical_root) => {
                    refuse("symlink leads outside the directory being pushed")
                }
                Ok(target) => match std::fs::metadata(&target) {
                    Ok(meta) if meta.is_file() => {
                        Ok(LocalFile { path: target, rel, size: meta.len(), mtime_ns: mtime_ns(&meta) })
                    }
                    Ok(_) => refuse("symlink to a directory or special file"),
                    Err(e) => refuse(&e.to_string()),
                },
                Err(e) => refuse(&format!("dangling symlink: {e}")),
            },
            Kind::File => match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_file() => Ok(LocalFile { path, rel, size: meta.len(), mtime_ns: mtime_ns(&meta) }),
                Ok(_) => refuse("not a regular file"),
                Err(e) => refuse(&e.to_string()),
            },
            Kind::Other => refuse("not a regular file"),
        };
        if !emit(item) {
            return Ok(());
        }
    }
}

/// `path` relative to `root`, for a refusal.
fn relative_name(root: &Path, path: &Path) -> String {
    path.strip_prefix(root).unwrap_or(path).display().to_string()
}

/// Reads the entries of `dir` and sorts them: in memory while they take up
/// to `memory` bytes, on disk past that. Entries that cannot be walked
/// (unreadable, not UTF-8) go to `refusals`.
fn read_directory(
    root: &Path,
    dir: &Path,
    scratch: &mut Scratch,
    memory: usize,
    refusals: &mut Vec<Refused>,
) -> std::io::Result<Listing> {
    let mut held = Vec::new();
    let mut held_bytes = 0;
    let mut sorter: Option<SortedWriter<Entry>> = None;
    for entry in std::fs::read_dir(dir)? {
        let entry = match entry {
            Ok(entry) => entry,
            Err(error) => {
                let reason = format!("an entry of this directory cannot be read: {error}");
                refusals.push(Refused { name: relative_name(root, dir), reason });
                continue;
            }
        };
        let name = relative_name(root, &entry.path());
        let kind = match entry.file_type() {
            Ok(file_type) => Kind::of(file_type),
            Err(error) => {
                refusals.push(Refused { name, reason: error.to_string() });
                continue;
            }
        };
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            let reason = if kind == Kind::Directory {
                "the directory name is not valid UTF-8, so nothing below it can become an object key"
            } else {
                "the file name is not valid UTF-8, so it cannot become an object key"
            };
            refusals.push(Refused { name, reason: reason.to_owned() });
            continue;
        };
        let entry = Entry::new(file_name, kind);
        if let Some(sorter) = &mut sorter {
            sorter.push(entry)?;
            continue;
        }
        held_bytes += entry.resident_bytes();
        held.push(entry);
        if held_bytes > memory
            && let Some(mut on_disk) = scratch.sorter(memory)
        {
            for entry in std::mem::take(&mut held) {
                on_disk.push(entry)?;
            }
            sorter = Some(on_disk);
        }
    }
    let Some(sorter) = sorter else {
        held.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        return Ok(Listing::Memory(held.into_iter()));
    };
    let runs = sorter.into_few_runs()?;
    match Merged::of_runs(&runs) {
        Ok(merged) => Ok(Listing::Disk { merged, runs }),
        Err(error) => {
            for run in runs {
                run.remove();
            }
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_contract::layout::{PUSH_STATE_DIR, TEMP_DIR};

    #[test]
    fn walk_lists_files_skips_state_and_refuses_links_out() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("d/e")).unwrap();
        std::fs::create_dir_all(root.path().join(STATE_DIR).join(TEMP_DIR)).unwrap();
        std::fs::write(root.path().join("d/e/f.txt"), b"x").unwrap();
        std::fs::write(root.path().join(STATE_DIR).join("manifest.jsonl"), b"").unwrap();
        std::fs::create_dir_all(root.path().join(STATE_DIR).join(PUSH_STATE_DIR)).unwrap();
        std::fs::write(root.path().join(STATE_DIR).join(PUSH_STATE_DIR).join("0123456789abcdef.jsonl"), b"").unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("out")).unwrap();
        std::os::unix::fs::symlink(root.path().join("d/e/f.txt"), root.path().join("in")).unwrap();
        let mut files = Vec::new();
        let mut refused = Vec::new();
        walk(root.path(), None, |item| {
            match item {
                Ok(f) => files.push(f.rel.to_string()),
                Err(r) => refused.push(r.name),
            }
            true
        })
        .unwrap();
        assert_eq!(files, vec!["d/e/f.txt", "in"]);
        assert_eq!(refused, vec!["out"]);
    }

    /// The files `walk_with_memory` yields, failing on any refusal.
    fn walked_files(root: &Path, scratch: Option<PathBuf>, memory: usize) -> Vec<String> {
        let mut walked = Vec::new();
        walk_with_memory(root, scratch, memory, |item| {
            walked.push(item.unwrap().rel.to_string());
            true
        })
        .unwrap();
        walked
    }

    /// Files named so that creation order is not key order, in `dir`.
    fn make_files(dir: &Path, count: u32) -> Vec<String> {
        std::fs::create_dir_all(dir).unwrap();
        let names: Vec<String> = (0..count).map(|i| format!("{:08x}", i.wrapping_mul(2_654_435_761))).collect();
        for name in &names {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        names
    }

    #[test]
    fn a_directory_larger_than_its_memory_is_sorted_on_disk_and_the_runs_go() {
        let root = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let scratch_dir = scratch.path().join("walk");
        // A flat directory with a large directory inside it, so that two
        // sorts on disk are open at once, and names around `/`.
        let mut expected: Vec<String> = make_files(root.path(), 3000);
        expected.extend(make_files(&root.path().join("a"), 2000).into_iter().map(|n| format!("a/{n}")));
        for name in ["a.b", "a0", "a-b"] {
            std::fs::write(root.path().join(name), b"x").unwrap();
            expected.push(name.to_owned());
        }
        expected.sort();

        let mut walked = Vec::new();
        let mut most_runs = 0;
        walk_with_memory(root.path(), Some(scratch_dir.clone()), 16 << 10, |item| {
            let runs = std::fs::read_dir(&scratch_dir).map_or(0, Iterator::count);
            most_runs = most_runs.max(runs);
            walked.push(item.unwrap().rel.to_string());
            true
        })
        .unwrap();
        assert_eq!(walked, expected);
        assert!(most_runs >= 2, "both directories were sorted on disk ({most_runs} runs at most)");
        assert!(!scratch_dir.exists(), "the scratch directory goes with the walk");

        // Without a scratch directory, or one that cannot be made, the same
        // walk sorts in memory.
        assert_eq!(walked_files(root.path(), None, 16 << 10), expected);
        let not_a_directory = root.path().join("a0").join("walk");
        assert_eq!(walked_files(root.path(), Some(not_a_directory), 16 << 10), expected);
    }

    #[test]
    fn a_walk_stopped_early_leaves_no_runs() {
        let root = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let scratch_dir = scratch.path().join("walk");
        make_files(root.path(), 2000);
        let mut seen = 0;
        walk_with_memory(root.path(), Some(scratch_dir.clone()), 4 << 10, |_| {
            seen += 1;
            seen < 10
        })
        .unwrap();
        assert_eq!(seen, 10);
        assert!(!scratch_dir.exists());
    }

    #[test]
    fn names_that_are_not_utf8_are_refused_once_each() {
        use std::os::unix::ffi::OsStrExt as _;
        let root = tempfile::tempdir().unwrap();
        let strange = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::create_dir_all(root.path().join(strange).join("below")).unwrap();
        std::fs::write(root.path().join(strange).join("below/1"), b"x").unwrap();
        std::fs::write(root.path().join(strange).join("2"), b"x").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::write(root.path().join("d").join(strange), b"x").unwrap();
        std::fs::write(root.path().join("d/ok"), b"x").unwrap();
        let (mut files, mut refused) = (Vec::new(), Vec::new());
        walk(root.path(), None, |item| {
            match item {
                Ok(f) => files.push(f.rel.to_string()),
                Err(r) => refused.push((r.name, r.reason)),
            }
            true
        })
        .unwrap();
        assert_eq!(files, vec!["d/ok"]);
        assert_eq!(refused.len(), 2, "{refused:?}");
        assert!(refused.iter().any(|(name, reason)| name == "caf\u{fffd}" && reason.contains("nothing below it")));
        assert!(refused.iter().any(|(name, reason)| name == "d/caf\u{fffd}" && reason.contains("file name")));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
        /// Any tree over names that sort around `/` walks in exactly the
        /// byte order of its keys.
        #[test]
        fn files_come_in_the_byte_order_of_their_keys(
            paths in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "a.b", "a-b", "a0", "é", "b"]), 1..4),
                1..12,
            ),
        ) {
            let root = tempfile::tempdir().unwrap();
            let mut expected = std::collections::BTreeSet::new();
            for segments in paths {
                let rel = segments.join("/");
                let path = root.path().join(&rel);
                // A path whose prefix is already a file (or the reverse) cannot be made.
                if std::fs::create_dir_all(path.parent().unwrap()).is_err() || path.is_dir() {
                    continue;
                }
                if std::fs::write(&path, b"x").is_ok() {
                    expected.insert(rel);
                }
            }
            let expected: Vec<String> = expected.into_iter().collect();
            proptest::prop_assert_eq!(&walked_files(root.path(), None, DIRECTORY_MEMORY), &expected);
            // Every directory sorted on disk, in runs of a few entries.
            let scratch = tempfile::tempdir().unwrap();
            let on_disk = walked_files(root.path(), Some(scratch.path().join("walk")), 64);
            proptest::prop_assert_eq!(on_disk, expected);
        }
    }
}
