//! Handing a node-local directory to the unprivileged worker user.
//!
//! A kubelet creates a missing hostPath directory as root, mode 0755, and
//! does not apply `fsGroup` to hostPath volumes, so a worker running as a
//! non-root user cannot write its first file there; a push's source may
//! belong to whichever user the training job ran as. The worker Job's init
//! container runs [`prepare`] as root with only `CAP_CHOWN`,
//! `CAP_DAC_OVERRIDE` and `CAP_FOWNER`, and the worker then runs
//! unprivileged:
//!
//! * for a pull, every entry of the tree becomes the worker's, so it can
//!   replace, verify and remove what it staged, and every directory allows
//!   at least `rwxr-xr-x`, so training pods of any user reach what it
//!   stages (contents and file modes are left as they are: another user's
//!   0600 file stays private);
//! * for a push, only the state directory (`.ferry`) becomes the worker's;
//!   the files to push keep their owners and the worker reads them as any
//!   other user would.
//!
//! The walk never follows a symbolic link: every step is relative to an
//! open directory (`openat` with `O_NOFOLLOW`, `fchownat` with
//! `AT_SYMLINK_NOFOLLOW`), so a link planted in the tree, or a directory
//! swapped for one during the walk, cannot make a root process change
//! anything outside it. Not for: volumes whose ownership the kubelet
//! already manages (`fsGroup`).

use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use ferry_contract::ownership::{Owner, Purpose};
use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, Uid};
use rustix::io::Errno;

use ferry_contract::layout::STATE_DIR;

/// What [`prepare`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Prepared {
    /// Entries looked at (the directory itself included).
    pub entries: u64,
    /// Entries whose owner was changed.
    pub changed: u64,
}

/// Why a directory could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// The directory could not be created.
    #[error("cannot create '{path}'")]
    Create {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An entry could not be read or handed over.
    #[error("cannot {action} '{path}' (this step needs CAP_CHOWN, CAP_DAC_OVERRIDE and CAP_FOWNER)")]
    Entry {
        /// What was being done.
        action: &'static str,
        /// The entry.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state directory (or the shared-objects directory) is a symbolic link
    /// (or not a directory): it is refused rather than followed.
    #[error("'{0}' is not a directory; remove it (Ferry keeps its own files there and never follows a link)")]
    StateNotDirectory(PathBuf),
}

/// Makes `directory` usable by a worker running as `owner` for `purpose`
/// (see the module documentation). Creates the directory when it is
/// missing. With a pull's `shared_objects` directory (see
/// [`super::shared_objects`]), creates that too and hands over the
/// directory and its `objects/`, not what is in them: every object there
/// was written by a worker already, and a walk of every object of the node
/// on every run would cost what the store saves.
///
/// # Errors
/// When the directory cannot be created or an entry cannot be read or
/// handed over (typically: run without the capabilities it needs). An
/// entry that disappears during the walk is not an error.
pub fn prepare(
    directory: &Path,
    purpose: Purpose,
    owner: Owner,
    shared_objects: Option<&Path>,
) -> Result<Prepared, OwnershipError> {
    std::fs::create_dir_all(directory)
        .map_err(|source| OwnershipError::Create { path: directory.to_owned(), source })?;
    // What a pull stages is read by training pods of any user: directories
    // that hide it from them (another user's 0700) are opened to readers.
    let open_to_readers = purpose == Purpose::Pull;
    let mut walk = Walk { owner, open_to_readers, prepared: Prepared::default() };
    // The directory itself is the volume's mount point, which the caller
    // names: following it is intended.
    let root =
        open_directory(CWD, directory, OFlags::empty()).map_err(|errno| entry_error("open", directory, errno))?;
    match purpose {
        Purpose::Pull => {
            walk.own_open(&root, directory)?;
            walk.tree(&root, directory)?;
            if let Some(shared) = shared_objects {
                walk.shared_objects(shared)?;
            }
        }
        Purpose::Push => {
            let state = directory.join(STATE_DIR);
            match rustix::fs::mkdirat(&root, STATE_DIR, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(errno) => return Err(entry_error("create", &state, errno)),
            }
            let state_fd = match open_directory(&root, STATE_DIR, OFlags::NOFOLLOW) {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) => return Err(OwnershipError::StateNotDirectory(state)),
                Err(errno) => return Err(entry_error("open", &state, errno)),
            };
            walk.own_open(&state_fd, &state)?;
            walk.tree(&state_fd, &state)?;
        }
    }
    Ok(walk.prepared)
}

struct Walk {
    owner: Owner,
    /// Give every directory at least `rwxr-xr-x`.
    open_to_readers: bool,
    prepared: Prepared,
}

/// The least a directory of a pull's destination allows: the worker
/// writes, everyone reads and traverses.
const READABLE_DIRECTORY: u32 = 0o755;

impl Walk {
    /// Creates and hands over a shared-objects directory and its
    /// `objects/`, refusing a link in the place of either.
    fn shared_objects(&mut self, shared: &Path) -> Result<(), OwnershipError> {
        std::fs::create_dir_all(shared).map_err(|source| OwnershipError::Create { path: shared.to_owned(), source })?;
        let open = |at: &OwnedFd, name: &str, path: &Path| match open_directory(at, name, OFlags::NOFOLLOW) {
            Ok(fd) => Ok(fd),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(OwnershipError::StateNotDirectory(path.to_owned())),
            Err(errno) => Err(entry_error("open", path, errno)),
        };
        let parent = shared.parent().unwrap_or(Path::new("/"));
        let parent_fd =
            open_directory(CWD, parent, OFlags::empty()).map_err(|errno| entry_error("open", parent, errno))?;
        let name = shared.file_name().and_then(|n| n.to_str()).unwrap_or(".");
        let shared_fd = open(&parent_fd, name, shared)?;
        self.own_open(&shared_fd, shared)?;
        let objects = shared.join(super::shared_objects::OBJECTS_DIR);
        match rustix::fs::mkdirat(&shared_fd, super::shared_objects::OBJECTS_DIR, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(errno) => return Err(entry_error("create", &objects, errno)),
        }
        let objects_fd = open(&shared_fd, super::shared_objects::OBJECTS_DIR, &objects)?;
        self.own_open(&objects_fd, &objects)
    }

    fn wanted(&self) -> (Uid, Gid) {
        (Uid::from_raw(self.owner.uid), Gid::from_raw(self.owner.gid))
    }

    /// Hands an open directory over (and opens it to readers when asked),
    /// unless it already is as wanted. Through the descriptor: no path is
    /// resolved again, so nothing swapped in meanwhile is touched.
    fn own_open(&mut self, fd: &OwnedFd, path: &Path) -> Result<(), OwnershipError> {
        self.prepared.entries += 1;
        let stat = rustix::fs::fstat(fd).map_err(|errno| entry_error("inspect", path, errno))?;
        let mut changed = false;
        if (stat.st_uid, stat.st_gid) != (self.owner.uid, self.owner.gid) {
            let (uid, gid) = self.wanted();
            rustix::fs::fchown(fd, Some(uid), Some(gid))
                .map_err(|errno| entry_error("change the owner of", path, errno))?;
            changed = true;
        }
        let mode = stat.st_mode & 0o7777;
        if self.open_to_readers && mode & READABLE_DIRECTORY != READABLE_DIRECTORY {
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode | READABLE_DIRECTORY))
                .map_err(|errno| entry_error("open to readers", path, errno))?;
            changed = true;
        }
        self.prepared.changed += u64::from(changed);
        Ok(())
    }

    /// Hands every entry below the open directory `dir` over, depth first.
    fn tree(&mut self, dir: &OwnedFd, path: &Path) -> Result<(), OwnershipError> {
        let names = entry_names(dir).map_err(|errno| entry_error("list", path, errno))?;
        for name in names {
            let child = path.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.as_bytes()));
            let stat = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => continue,
                Err(errno) => return Err(entry_error("inspect", &child, errno)),
            };
            if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
                // Swapped for a link (or removed) since the stat: not followed.
                let sub = match open_directory(dir, name.as_c_str(), OFlags::NOFOLLOW) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => continue,
                    Err(errno) => return Err(entry_error("open", &child, errno)),
                };
                self.own_open(&sub, &child)?;
                self.tree(&sub, &child)?;
                continue;
            }
            self.prepared.entries += 1;
            if (stat.st_uid, stat.st_gid) != (self.owner.uid, self.owner.gid) {
                let (uid, gid) = self.wanted();
                match rustix::fs::chownat(dir, name.as_c_str(), Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(()) => self.prepared.changed += 1,
                    Err(Errno::NOENT) => continue,
                    Err(errno) => return Err(entry_error("change the owner of", &child, errno)),
                }
            }
        }
        Ok(())
    }
}

/// The entry names of an open directory, without `.` and `..`. Read
/// whole before any is visited, so a directory open at each level is all
/// the walk holds.
fn entry_names(dir: &OwnedFd) -> Result<Vec<std::ffi::CString>, Errno> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name: &CStr = entry.file_name();
        if name.to_bytes() != b"." && name.to_bytes() != b".." {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

fn open_directory<Fd: AsFd, P: rustix::path::Arg>(dir: Fd, path: P, extra: OFlags) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(dir, path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | extra, Mode::empty())
}

fn entry_error(action: &'static str, path: &Path, errno: Errno) -> OwnershipError {
    OwnershipError::Entry { action, path: path.to_owned(), source: errno.into() }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;
    use ferry_contract::layout::SHARED_OBJECTS_DIR;

    /// Who the tests hand entries to: the worker's user when they run as
    /// root (as CI does), so the change of owner is real; otherwise the
    /// test's own user, which needs no privilege.
    fn worker() -> Owner {
        // What a file this process creates gets: its effective user and group.
        let probe = tempfile::NamedTempFile::new().unwrap();
        let me = owner_of(probe.path());
        if me.uid == 0 { Owner { uid: 65532, gid: 65532 } } else { me }
    }

    fn owner_of(path: &Path) -> Owner {
        let meta = std::fs::symlink_metadata(path).unwrap();
        Owner { uid: meta.uid(), gid: meta.gid() }
    }

    #[test]
    fn a_missing_directory_is_created_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("a/b");
        let prepared = prepare(&target, Purpose::Pull, worker(), None).unwrap();
        assert!(target.is_dir());
        assert_eq!(prepared.entries, 1);
        assert_eq!(owner_of(&target), worker());
        assert_eq!(prepare(&target, Purpose::Pull, worker(), None).unwrap(), Prepared { entries: 1, changed: 0 });
    }

    #[test]
    fn a_pull_gets_its_shared_objects_directory_made_and_handed_over_but_never_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let (target, shared) = (root.path().join("team/data"), root.path().join(SHARED_OBJECTS_DIR));
        let prepared = prepare(&target, Purpose::Pull, worker(), Some(&shared)).unwrap();
        // The destination, the shared directory and its objects/.
        assert_eq!(prepared.entries, 3);
        for dir in [&target, &shared, &shared.join("objects")] {
            assert_eq!(owner_of(dir), worker(), "{}", dir.display());
            assert_eq!(std::fs::metadata(dir).unwrap().mode() & 0o755, 0o755, "{}", dir.display());
        }
        // What is in objects/ is not walked.
        std::fs::create_dir_all(shared.join("objects/ab")).unwrap();
        assert_eq!(prepare(&target, Purpose::Pull, worker(), Some(&shared)).unwrap().entries, 3);

        let elsewhere = tempfile::tempdir().unwrap();
        let planted = root.path().join(".planted");
        std::os::unix::fs::symlink(elsewhere.path(), &planted).unwrap();
        let error = prepare(&target, Purpose::Pull, worker(), Some(&planted)).unwrap_err();
        assert!(matches!(error, OwnershipError::StateNotDirectory(_)), "{error}");
        assert!(!elsewhere.path().join("objects").exists());
    }

    #[test]
    fn a_pull_walks_the_whole_tree_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("x/y")).unwrap();
        std::fs::write(dir.path().join("x/y/file"), b"1").unwrap();
        std::fs::write(outside.path().join("secret"), b"2").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("x/link")).unwrap();
        std::fs::write(outside.path().join("inside-link-target"), b"3").unwrap();
        let before = owner_of(&outside.path().join("secret"));
        let prepared = prepare(dir.path(), Purpose::Pull, worker(), None).unwrap();
        // root, x, x/y, x/y/file, x/link: the link's target is not entered.
        assert_eq!(prepared.entries, 5);
        for entry in ["", "x", "x/y", "x/y/file", "x/link"] {
            assert_eq!(owner_of(&dir.path().join(entry)), worker(), "{entry}");
        }
        assert_eq!(owner_of(&outside.path().join("secret")), before, "nothing behind the link changes");
        assert_eq!(owner_of(outside.path()), before);
        assert_eq!(
            prepare(dir.path(), Purpose::Pull, worker(), None).unwrap().changed,
            0,
            "a second run changes nothing"
        );
    }

    #[test]
    fn a_pull_opens_private_directories_to_readers_and_leaves_file_modes() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("private/deeper")).unwrap();
        std::fs::write(dir.path().join("private/secret"), b"1").unwrap();
        let set = |path: &str, mode: u32| {
            std::fs::set_permissions(dir.path().join(path), std::fs::Permissions::from_mode(mode)).unwrap();
        };
        set("private/secret", 0o600);
        set("private/deeper", 0o700);
        set("private", 0o711);
        prepare(dir.path(), Purpose::Pull, worker(), None).unwrap();
        let mode = |path: &str| std::fs::metadata(dir.path().join(path)).unwrap().mode() & 0o7777;
        assert_eq!((mode("private"), mode("private/deeper")), (0o755, 0o755));
        assert_eq!(mode("private/secret"), 0o600, "a file's mode is its owner's business");
        assert_eq!(prepare(dir.path(), Purpose::Pull, worker(), None).unwrap().changed, 0);
    }

    #[test]
    fn a_push_creates_and_walks_only_the_state_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ckpt")).unwrap();
        std::fs::write(dir.path().join("ckpt/model.bin"), b"weights").unwrap();
        let file_owner = owner_of(&dir.path().join("ckpt/model.bin"));
        let prepared = prepare(dir.path(), Purpose::Push, worker(), None).unwrap();
        assert!(dir.path().join(STATE_DIR).is_dir());
        assert_eq!(prepared.entries, 1, "only .ferry itself");
        assert_eq!(prepare(dir.path(), Purpose::Push, worker(), None).unwrap().changed, 0);
        assert_eq!(owner_of(&dir.path().join(STATE_DIR)), worker());
        assert_eq!(owner_of(&dir.path().join("ckpt/model.bin")), file_owner, "the files to push keep their owner");
        assert_eq!(owner_of(&dir.path().join("ckpt")), file_owner);
    }

    #[test]
    fn a_state_directory_that_is_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(STATE_DIR)).unwrap();
        let error = prepare(dir.path(), Purpose::Push, worker(), None).unwrap_err();
        assert!(matches!(error, OwnershipError::StateNotDirectory(_)), "{error}");
        assert!(error.to_string().contains("never follows a link"));
    }

    #[test]
    fn handing_over_to_another_user_without_privilege_says_what_it_needs() {
        if worker().uid == 65532 {
            return; // root may: the other tests cover that side
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"1").unwrap();
        let error = prepare(dir.path(), Purpose::Pull, Owner { uid: 65532, gid: 65532 }, None).unwrap_err();
        assert!(error.to_string().contains("CAP_CHOWN"), "{error}");
    }
}
