//! Object keys become relative paths, and only safe ones do.
//!
//! A key is data from the store, so it is treated as hostile: a key with a
//! `..` or `.` segment, an empty segment (`a//b`), a leading `/`, a NUL byte,
//! a segment too long for a filesystem, or one that would land in Ferry's
//! own state directory is refused, never written. Parent directories are
//! created one component at a time without following symlinks, so a symlink
//! planted inside the destination cannot redirect a write outside it.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ferry_contract::layout::STATE_DIR;

/// Longest file name most Linux filesystems accept.
const MAX_SEGMENT_BYTES: usize = 255;

/// A validated path relative to the destination, with `/` separators.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RelPath(String);

impl RelPath {
    /// The path as a `/`-separated string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The absolute path of this entry under `root`.
    pub fn under(&self, root: &Path) -> PathBuf {
        let mut path = root.to_path_buf();
        path.extend(self.0.split('/'));
        path
    }

    /// The parent directory's components, outermost first.
    fn parent_segments(&self) -> impl Iterator<Item = &str> {
        let mut segments: Vec<&str> = self.0.split('/').collect();
        segments.pop();
        segments.into_iter()
    }
}

impl std::fmt::Display for RelPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a key relative to the listed prefix maps to.
#[derive(Debug, PartialEq, Eq)]
pub enum KeyPath {
    /// A regular file at this path.
    File(RelPath),
    /// A zero-byte "folder" marker (`dir/`), which holds no data.
    DirectoryMarker,
}

/// Why a key cannot be written under the destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeKey {
    /// The key equals the prefix: it names no file under the destination.
    #[error("the key names no file below the prefix")]
    Empty,
    /// Starts with `/`.
    #[error("absolute keys are refused")]
    Absolute,
    /// Has a `.` or `..` segment.
    #[error("a '{0}' path segment could escape the destination")]
    DotSegment(&'static str),
    /// Has an empty segment (`a//b`).
    #[error("an empty path segment ('//') is ambiguous")]
    EmptySegment,
    /// Contains a NUL byte.
    #[error("a NUL byte cannot appear in a file name")]
    Nul,
    /// A segment is longer than a file name may be.
    #[error("a path segment is longer than {MAX_SEGMENT_BYTES} bytes")]
    TooLong,
    /// Would land inside Ferry's state directory.
    #[error("the key would overwrite Ferry's own '{STATE_DIR}' directory")]
    Reserved,
}

/// Strips `prefix` from `key`: the part that becomes the relative path.
pub fn relative_key<'k>(key: &'k str, prefix: &str) -> &'k str {
    key.strip_prefix(prefix).unwrap_or(key)
}

/// Maps a key relative to the listed prefix to a safe relative path.
///
/// # Errors
/// [`UnsafeKey`] names the reason a key is refused.
pub fn key_to_path(relative: &str) -> Result<KeyPath, UnsafeKey> {
    if relative.is_empty() {
        return Err(UnsafeKey::Empty);
    }
    if relative.contains('\0') {
        return Err(UnsafeKey::Nul);
    }
    if relative.starts_with('/') {
        return Err(UnsafeKey::Absolute);
    }
    let (body, marker) = match relative.strip_suffix('/') {
        Some(body) => (body, true),
        None => (relative, false),
    };
    for segment in body.split('/') {
        match segment {
            "" => return Err(UnsafeKey::EmptySegment),
            "." => return Err(UnsafeKey::DotSegment(".")),
            ".." => return Err(UnsafeKey::DotSegment("..")),
            s if s.len() > MAX_SEGMENT_BYTES => return Err(UnsafeKey::TooLong),
            _ => {}
        }
    }
    if body.split('/').next() == Some(STATE_DIR) {
        return Err(UnsafeKey::Reserved);
    }
    if marker {
        return Ok(KeyPath::DirectoryMarker);
    }
    Ok(KeyPath::File(RelPath(body.to_owned())))
}

/// Builds a [`RelPath`] from a path found on disk below the push root.
///
/// # Errors
/// Returns `None` for names that are not UTF-8 or not plain components.
pub fn path_to_key(relative: &Path) -> Option<RelPath> {
    let mut parts = Vec::new();
    for component in relative.components() {
        match component {
            std::path::Component::Normal(name) => parts.push(name.to_str()?),
            _ => return None,
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(RelPath(parts.join("/")))
}

/// Directories a [`DirMaker`] remembers having checked, at most.
const KNOWN_DIRECTORIES: usize = 1 << 16;

/// Creates parent directories under a root without following symlinks.
#[derive(Debug)]
pub struct DirMaker {
    root: PathBuf,
    known: Mutex<HashSet<PathBuf>>,
}

impl DirMaker {
    /// A maker for directories below `root`, which must already exist.
    pub fn new(root: PathBuf) -> Self {
        Self { root, known: Mutex::new(HashSet::new()) }
    }

    /// Makes sure every parent directory of `rel` exists as a real directory.
    ///
    /// # Errors
    /// Fails when a component is a symlink or a non-directory, or creation fails.
    pub fn ensure_parents(&self, rel: &RelPath) -> io::Result<()> {
        let mut dir = self.root.clone();
        for segment in rel.parent_segments() {
            dir.push(segment);
            if self.known.lock().expect("dir cache poisoned").contains(&dir) {
                continue;
            }
            match std::fs::symlink_metadata(&dir) {
                Ok(meta) if meta.file_type().is_dir() => {}
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(io::Error::other(format!(
                        "'{}' is a symlink; refusing to follow it out of the destination",
                        dir.display()
                    )));
                }
                Ok(_) => {
                    return Err(io::Error::other(format!("'{}' exists and is not a directory", dir.display())));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => match std::fs::create_dir(&dir) {
                    Ok(()) => {}
                    // Another task created it between our check and create.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        if !std::fs::symlink_metadata(&dir)?.file_type().is_dir() {
                            return Err(io::Error::other(format!("'{}' is not a directory", dir.display())));
                        }
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            }
            let mut known = self.known.lock().expect("dir cache poisoned");
            // Only a cache: forgetting costs a `symlink_metadata` per
            // directory met again, and keeps a tree of millions of
            // directories from holding all their paths.
            if known.len() >= KNOWN_DIRECTORIES {
                known.clear();
            }
            known.insert(dir.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn file(p: &str) -> KeyPath {
        KeyPath::File(RelPath(p.to_owned()))
    }

    #[test]
    fn ordinary_keys_map_to_relative_paths() {
        assert_eq!(key_to_path("a.bin"), Ok(file("a.bin")));
        assert_eq!(key_to_path("dir/sub/a b ü.bin"), Ok(file("dir/sub/a b ü.bin")));
        assert_eq!(key_to_path("..a/b.."), Ok(file("..a/b..")));
        assert_eq!(key_to_path("dir/"), Ok(KeyPath::DirectoryMarker));
    }

    #[test]
    fn keys_that_could_escape_or_confuse_are_refused() {
        assert_eq!(key_to_path("../etc/passwd"), Err(UnsafeKey::DotSegment("..")));
        assert_eq!(key_to_path("a/../../b"), Err(UnsafeKey::DotSegment("..")));
        assert_eq!(key_to_path("a/./b"), Err(UnsafeKey::DotSegment(".")));
        assert_eq!(key_to_path("/etc/passwd"), Err(UnsafeKey::Absolute));
        assert_eq!(key_to_path("a//b"), Err(UnsafeKey::EmptySegment));
        assert_eq!(key_to_path("a\0b"), Err(UnsafeKey::Nul));
        assert_eq!(key_to_path(""), Err(UnsafeKey::Empty));
        assert_eq!(key_to_path(".ferry/manifest.jsonl"), Err(UnsafeKey::Reserved));
        assert_eq!(key_to_path(&"x".repeat(256)), Err(UnsafeKey::TooLong));
    }

    #[test]
    fn the_prefix_is_stripped_from_keys() {
        assert_eq!(relative_key("data/train/a", "data/"), "train/a");
        assert_eq!(relative_key("a", ""), "a");
    }

    #[test]
    fn parents_are_created_but_symlinks_are_not_followed() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let maker = DirMaker::new(root.path().to_path_buf());
        let KeyPath::File(ok) = key_to_path("a/b/c.bin").unwrap() else { panic!() };
        maker.ensure_parents(&ok).unwrap();
        assert!(root.path().join("a/b").is_dir());
        let KeyPath::File(bad) = key_to_path("link/x/c.bin").unwrap() else { panic!() };
        let err = maker.ensure_parents(&bad).unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    proptest! {
        /// Whatever the key, an accepted one stays strictly below the root.
        #[test]
        fn accepted_keys_never_leave_the_root(key in "[a-z./\\\\\\x00 ]{0,24}") {
            if let Ok(KeyPath::File(rel)) = key_to_path(&key) {
                let root = Path::new("/dest");
                let path = rel.under(root);
                prop_assert!(path.starts_with(root));
                prop_assert!(path != root);
                for component in path.strip_prefix(root).unwrap().components() {
                    prop_assert!(matches!(component, std::path::Component::Normal(_)), "{key:?}");
                }
            }
        }
    }
}
