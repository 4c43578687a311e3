//! One copy per node: a store of object files that every directory pulled
//! onto the same filesystem shares through hard links.
//!
//! Two DataStages of the same objects (two teams, two namespaces, a model
//! staged for prefill and decode pods) used to hold two copies on one disk.
//! With a shared-objects directory on the destination's filesystem, a pull
//! links each file it commits into `DIR/objects/`, under a name made from
//! what identifies the object in its store without reading it (the store,
//! its endpoint, the key, the ETag and the size), and a pull that finds an
//! object there links it into place instead of fetching it. Each
//! destination still holds its own directory entry, so removing one
//! DataStage's files (a clean-up, a re-sync that replaces a file) leaves
//! every other directory whole.
//!
//! Reference counts are link counts: an object file that only the store
//! still names (`st_nlink == 1`) is garbage, and [`collect_garbage`] removes
//! exactly those. No count is kept anywhere else, so none can disagree with
//! the disk after a crash.
//!
//! Nothing here ever writes into an existing file: a linked file is one
//! inode in several directories, and any write would change every one of
//! them. Pulls only ever create new files and rename them into place, so a
//! re-sync of one directory replaces its entry and leaves the shared inode
//! to the others. Sharing needs one filesystem *and* one mount (`link(2)`
//! refuses to cross mount points even of the same filesystem): where it
//! cannot link, a pull says so once and fetches as it would without it.

use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The directory, below the shared-objects directory, that holds the
/// object files (`objects/ab/cdef…`), so that the directory can grow other
/// parts later (trees of versions) without a migration.
pub const OBJECTS_DIR: &str = "objects";

/// What identifies an object's content in its store, without reading it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectIdentity<'a> {
    /// The store and where it is reached (`s3://bucket|https://endpoint`):
    /// one bucket name on two servers holds different objects.
    pub scope: &'a str,
    /// The object's full key.
    pub key: &'a str,
    /// The version the store gives the content (its ETag).
    pub version: &'a str,
    /// The size in bytes.
    pub size: u64,
}

impl ObjectIdentity<'_> {
    /// The file name this identity gets: the SHA-256 of its parts, in hex,
    /// below a directory of its first two digits (so no directory holds
    /// more than 1/256th of the objects).
    fn relative_path(&self) -> PathBuf {
        let mut hasher = Sha256::new();
        for part in [self.scope.as_bytes(), self.key.as_bytes(), self.version.as_bytes()] {
            // Length-prefixed, so no two different identities hash the
            // same bytes.
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        hasher.update(self.size.to_le_bytes());
        let hex = hex_digits(&hasher.finalize());
        Path::new(OBJECTS_DIR).join(&hex[..2]).join(&hex[2..])
    }
}

fn hex_digits(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A shared-objects directory as one pull uses it.
#[derive(Debug)]
pub struct SharedObjects {
    dir: PathBuf,
    scope: String,
    /// Cleared the first time a link fails for a reason that every later
    /// link would fail for too (another mount, a filesystem without hard
    /// links): the run then fetches without trying again.
    usable: AtomicBool,
}

impl SharedObjects {
    /// Opens (creating when missing) the shared-objects directory `dir` for
    /// a pull into `destination` of objects from `scope`. `None`, with a
    /// warning, when it cannot be used (not creatable, or on another
    /// filesystem than the destination): the pull then shares nothing, which
    /// costs disk space but never a file.
    pub fn open(dir: &Path, scope: String, destination: &Path) -> Option<Self> {
        let same_filesystem = || -> io::Result<bool> {
            std::fs::create_dir_all(dir.join(OBJECTS_DIR))?;
            Ok(std::fs::metadata(dir)?.dev() == std::fs::metadata(destination)?.dev())
        };
        let why_not = match same_filesystem() {
            Ok(true) => return Some(Self { dir: dir.to_owned(), scope, usable: AtomicBool::new(true) }),
            Ok(false) => "it is on another filesystem than the destination".to_owned(),
            Err(error) => error.to_string(),
        };
        tracing::warn!(
            shared_objects = %dir.display(),
            destination = %destination.display(),
            reason = %why_not,
            "cannot use the shared-objects directory; this pull shares nothing"
        );
        None
    }

    /// The store and endpoint objects of this pull come from.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The path the object `identity` has in the store, whether or not it is
    /// there.
    pub fn path_of(&self, identity: &ObjectIdentity<'_>) -> PathBuf {
        self.dir.join(identity.relative_path())
    }

    /// The store's file for `identity` when it holds one of the right size,
    /// to link into place instead of fetching.
    pub fn find(&self, identity: &ObjectIdentity<'_>) -> Option<PathBuf> {
        if !self.usable.load(Ordering::Relaxed) {
            return None;
        }
        let path = self.path_of(identity);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        (meta.file_type().is_file() && meta.len() == identity.size).then_some(path)
    }

    /// Adds the committed file `staged` to the store as `identity`. When
    /// the store holds another file of that identity already (another pull
    /// fetched the same object at the same time), `staged` becomes a link
    /// to that one instead, through the unused name `spare` in the same
    /// filesystem, so that the two take the space of one; returns whether
    /// it did (the file in place is then another inode, with that one's
    /// mtime). Failing to share is never an error of the pull: the file is
    /// in place either way.
    pub fn keep(&self, identity: &ObjectIdentity<'_>, staged: &Path, spare: &Path) -> bool {
        if !self.usable.load(Ordering::Relaxed) {
            return false;
        }
        let path = self.path_of(identity);
        let linked = std::fs::hard_link(staged, &path).or_else(|error| match error.kind() {
            io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().expect("below objects/"))?;
                std::fs::hard_link(staged, &path)
            }
            _ => Err(error),
        });
        match linked {
            Ok(()) => false,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                match self.take_stored(&path, staged, spare) {
                    Ok(replaced) => replaced,
                    Err(error) => {
                        self.link_failed(&error, staged);
                        false
                    }
                }
            }
            Err(error) => {
                self.link_failed(&error, staged);
                false
            }
        }
    }

    /// Replaces `staged` with a link to the store's `stored` file when that
    /// is another inode of the object's size.
    fn take_stored(&self, stored: &Path, staged: &Path, spare: &Path) -> io::Result<bool> {
        let (theirs, ours) = (std::fs::symlink_metadata(stored)?, std::fs::symlink_metadata(staged)?);
        let other_copy = theirs.file_type().is_file()
            && theirs.len() == ours.len()
            && (theirs.dev(), theirs.ino()) != (ours.dev(), ours.ino());
        if !other_copy {
            return Ok(false);
        }
        std::fs::hard_link(stored, spare)?;
        let renamed = std::fs::rename(spare, staged);
        let _ = std::fs::remove_file(spare);
        renamed.map(|()| true)
    }

    /// Removes the objects no directory links any more (see
    /// [`collect_garbage`]).
    ///
    /// # Errors
    /// As [`collect_garbage`].
    pub fn collect_garbage(&self) -> io::Result<Collected> {
        collect_garbage(&self.dir)
    }

    /// Notes a link that failed. Failures every later link would share
    /// (another mount, no hard links there) stop sharing for this run.
    pub fn link_failed(&self, error: &io::Error, path: &Path) {
        use rustix::io::Errno;
        let for_good = matches!(Errno::from_io_error(error), Some(Errno::XDEV | Errno::PERM | Errno::MLINK))
            || error.kind() == io::ErrorKind::Unsupported;
        if for_good && self.usable.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                shared_objects = %self.dir.display(),
                path = %path.display(),
                %error,
                "cannot link into the shared-objects directory; this pull shares nothing more"
            );
        } else if !for_good {
            tracing::debug!(path = %path.display(), %error, "not shared");
        }
    }
}

/// What [`collect_garbage`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Collected {
    /// Object files no directory linked any more, removed.
    pub objects_removed: u64,
    /// Their bytes, now free.
    pub bytes_freed: u64,
    /// Object files still linked from some directory.
    pub objects_kept: u64,
}

/// Removes every object file of the shared-objects directory `dir` that no
/// directory links any more (its only name is the store's), and the
/// fan-out directories that leaves empty. A pull that links an object in
/// the same instant either linked it first (it stays) or finds it gone and
/// fetches it.
///
/// # Errors
/// When the store cannot be listed or a file cannot be removed. A missing
/// directory holds nothing to collect.
pub fn collect_garbage(dir: &Path) -> io::Result<Collected> {
    let mut collected = Collected::default();
    let objects = dir.join(OBJECTS_DIR);
    let fans = match std::fs::read_dir(&objects) {
        Ok(fans) => fans,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(collected),
        Err(error) => return Err(error),
    };
    for fan in fans {
        let fan = fan?;
        if !fan.file_type()?.is_dir() {
            continue;
        }
        let fan_path = fan.path();
        for object in std::fs::read_dir(&fan_path)? {
            let object = object?;
            let meta = match object.metadata() {
                Ok(meta) => meta,
                Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            if is_garbage(&meta) {
                match std::fs::remove_file(object.path()) {
                    Ok(()) => {
                        collected.objects_removed += 1;
                        collected.bytes_freed += meta.len();
                    }
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => return Err(error),
                }
            } else if meta.file_type().is_file() {
                collected.objects_kept += 1;
            }
        }
        // Fails while the fan-out directory holds anything: that is the check.
        let _ = std::fs::remove_dir(&fan_path);
    }
    Ok(collected)
}

/// A regular file whose only name is the store's.
fn is_garbage(meta: &Metadata) -> bool {
    meta.file_type().is_file() && meta.nlink() == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(key: &str) -> ObjectIdentity<'_> {
        ObjectIdentity { scope: "s3://b|http://minio", key, version: "etag-1", size: 3 }
    }

    #[test]
    fn an_identity_names_one_file_and_every_part_of_it_counts() {
        let one = identity("data/a").relative_path();
        assert_eq!(one, identity("data/a").relative_path());
        assert!(one.starts_with(OBJECTS_DIR));
        for other in [
            ObjectIdentity { scope: "s3://b|http://other", ..identity("data/a") },
            identity("data/b"),
            ObjectIdentity { version: "etag-2", ..identity("data/a") },
            ObjectIdentity { size: 4, ..identity("data/a") },
        ] {
            assert_ne!(one, other.relative_path(), "{other:?}");
        }
        // The length prefix: moving a byte from one part to the next is
        // another identity.
        let shifted = ObjectIdentity { scope: "ab", key: "c", version: "", size: 0 };
        let unshifted = ObjectIdentity { scope: "a", key: "bc", version: "", size: 0 };
        assert_ne!(shifted.relative_path(), unshifted.relative_path());
    }

    #[test]
    fn a_kept_file_is_found_by_the_next_pull_and_collected_once_no_directory_links_it() {
        let root = tempfile::tempdir().unwrap();
        let (first, second) = (root.path().join("first"), root.path().join("second"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        let store = SharedObjects::open(&root.path().join(".shared"), "scope".into(), &first).unwrap();
        let id = ObjectIdentity { scope: store.scope(), ..identity("data/a") };
        assert_eq!(store.find(&id), None);

        std::fs::write(first.join("a"), b"abc").unwrap();
        let spare = root.path().join("spare");
        assert!(!store.keep(&id, &first.join("a"), &spare));
        assert!(!store.keep(&id, &first.join("a"), &spare), "twice is once");
        let found = store.find(&id).expect("kept");
        // A copy fetched at the same time becomes a link to the stored one.
        std::fs::write(second.join("a"), b"abc").unwrap();
        assert!(store.keep(&id, &second.join("a"), &spare));
        assert!(!spare.exists());
        assert_eq!(std::fs::metadata(second.join("a")).unwrap().ino(), std::fs::metadata(&found).unwrap().ino());
        assert_eq!(std::fs::metadata(second.join("a")).unwrap().nlink(), 3);
        // A wrong size is not the object.
        assert_eq!(store.find(&ObjectIdentity { size: 4, ..id.clone() }), None);

        std::fs::remove_file(first.join("a")).unwrap();
        let kept = collect_garbage(&root.path().join(".shared")).unwrap();
        assert_eq!(kept, Collected { objects_removed: 0, bytes_freed: 0, objects_kept: 1 });
        assert_eq!(std::fs::read(second.join("a")).unwrap(), b"abc");

        std::fs::remove_file(second.join("a")).unwrap();
        let collected = collect_garbage(&root.path().join(".shared")).unwrap();
        assert_eq!(collected, Collected { objects_removed: 1, bytes_freed: 3, objects_kept: 0 });
        assert_eq!(store.find(&id), None);
        // The fan-out directory it left empty went with it.
        assert_eq!(std::fs::read_dir(root.path().join(".shared").join(OBJECTS_DIR)).unwrap().count(), 0);
        assert_eq!(collect_garbage(&root.path().join("missing")).unwrap(), Collected::default());
    }
}
