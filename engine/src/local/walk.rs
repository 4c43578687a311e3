//! Walking a directory for a push: every regular file below the root, as a
//! key-ready relative path, streamed so uploads start before the walk ends.
//!
//! Symlinks are not followed out of the root: a link to a file inside the
//! root is uploaded with the target's content under the link's name; a link
//! that leads outside, or to a directory, is refused and reported.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use super::STATE_DIR;
use super::paths::{RelPath, path_to_key};

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

/// Orders the entries of one directory so that a depth-first walk yields
/// files in the byte order of their keys, the order a store lists them in:
/// a directory sorts as its name followed by `/`. (Sorting plain names
/// would walk `a/b` before `a.b`, but `.` sorts before `/`.) A symlink to a
/// directory is not followed, so it sorts as a plain name.
fn key_order(a: &walkdir::DirEntry, b: &walkdir::DirEntry) -> std::cmp::Ordering {
    use std::os::unix::ffi::OsStrExt as _;
    let key = |entry: &walkdir::DirEntry| {
        let name = entry.file_name().as_bytes();
        let slash: &[u8] = if entry.file_type().is_dir() { b"/" } else { b"" };
        name.iter().chain(slash).copied().collect::<Vec<u8>>()
    };
    key(a).cmp(&key(b))
}

/// Walks `root`, sending each file (or refusal) to `emit`, in the byte
/// order of their keys; stops early when
/// `emit` returns false. Runs on a blocking thread.
pub fn walk(root: &Path, mut emit: impl FnMut(Result<LocalFile, Refused>) -> bool) -> std::io::Result<()> {
    let canonical_root = root.canonicalize()?;
    let mut entries = walkdir::WalkDir::new(root).follow_links(false).sort_by(key_order).into_iter();
    while let Some(entry) = entries.next() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                let name = e.path().map(|p| p.display().to_string()).unwrap_or_default();
                if !emit(Err(Refused { name, reason: e.to_string() })) {
                    return Ok(());
                }
                continue;
            }
        };
        let Ok(relative) = entry.path().strip_prefix(root) else { continue };
        if entry.depth() == 1 && relative.as_os_str() == STATE_DIR {
            if entry.file_type().is_dir() {
                entries.skip_current_dir();
            }
            continue;
        }
        if entry.file_type().is_dir() {
            continue;
        }
        let name = relative.display().to_string();
        let refuse = |reason: &str| Err(Refused { name: name.clone(), reason: reason.to_owned() });
        let Some(rel) = path_to_key(relative) else {
            if !emit(refuse("the file name is not valid UTF-8, so it cannot become an object key")) {
                return Ok(());
            }
            continue;
        };
        let item = if entry.file_type().is_symlink() {
            match entry.path().canonicalize() {
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
            }
        } else if entry.file_type().is_file() {
            match entry.metadata() {
                Ok(meta) => {
                    Ok(LocalFile { path: entry.path().to_path_buf(), rel, size: meta.len(), mtime_ns: mtime_ns(&meta) })
                }
                Err(e) => refuse(&e.to_string()),
            }
        } else {
            refuse("not a regular file")
        };
        if !emit(item) {
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_lists_files_skips_state_and_refuses_links_out() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("d/e")).unwrap();
        std::fs::create_dir_all(root.path().join(".ferry/tmp")).unwrap();
        std::fs::write(root.path().join("d/e/f.txt"), b"x").unwrap();
        std::fs::write(root.path().join(".ferry/manifest.jsonl"), b"").unwrap();
        std::fs::create_dir_all(root.path().join(".ferry/push")).unwrap();
        std::fs::write(root.path().join(".ferry/push/0123456789abcdef.jsonl"), b"").unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("out")).unwrap();
        std::os::unix::fs::symlink(root.path().join("d/e/f.txt"), root.path().join("in")).unwrap();
        let mut files = Vec::new();
        let mut refused = Vec::new();
        walk(root.path(), |item| {
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
            let mut walked = Vec::new();
            walk(root.path(), |item| {
                walked.push(item.unwrap().rel.to_string());
                true
            })
            .unwrap();
            proptest::prop_assert_eq!(walked, expected.into_iter().collect::<Vec<_>>());
        }
    }
}
