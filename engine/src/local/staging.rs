//! Where bytes reach the disk: once, at their final offset, in a temporary
//! file that is renamed into place only after it is complete and verified.
//!
//! Where the filesystem can (`O_TMPFILE`: ext4, XFS, Btrfs, tmpfs), a file
//! is made without a name in its final directory and linked to its name
//! when complete: a killed process leaves nothing behind, and committing
//! locks only that directory. Otherwise, and to replace a file that
//! exists (a link cannot), temporary files have names in
//! `DIR/.ferry/tmp/<run>/`, on the destination's filesystem, and are
//! renamed into place. That rename crosses directories, which Linux
//! serialises per filesystem: with hundreds of small files in flight it
//! was the whole pull's bottleneck (every writer queued in `rename`).
//!
//! Each run holds an exclusive lock on `DIR/.ferry/tmp/<run>.lock`; a later
//! run that can take that lock knows the owner is gone (killed, crashed)
//! and deletes its leftovers. Sharded workers writing into one shared
//! directory each hold their own lock and never touch each other's files.
//!
//! Not durable against power loss: files are not fsynced, because staging
//! targets caches that can be re-staged, and fsync per small file would cost
//! more than the copy. A killed process never leaves a partial file under a
//! final name.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::partial::PartialObject;
use super::paths::{DirMaker, RelPath};
use ferry_contract::layout::{STATE_DIR, TEMP_DIR};

/// Files at or below this size are not preallocated: one write does it.
const PREALLOCATE_ABOVE: u64 = 1 << 20;

/// Name of the scratch directory inside a run's temporary directory.
const SCRATCH_DIR: &str = "scratch";

/// Why the destination cannot be prepared.
#[derive(Debug, thiserror::Error)]
pub enum StagingError {
    /// The destination or its state directory could not be created or used.
    #[error("cannot prepare destination '{path}': {source}")]
    Prepare {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The state directory is a symlink, which could redirect writes.
    #[error("'{0}' is a symlink; remove it (Ferry keeps its state in a real directory)")]
    StateIsSymlink(PathBuf),
}

/// Size and modification time of a committed file, as the manifest records them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i64,
}

impl FileStamp {
    /// Reads the stamp of the file at `path` without following a symlink.
    ///
    /// # Errors
    /// Returns the error from `lstat`.
    pub fn of(path: &Path) -> io::Result<Self> {
        let meta = std::fs::symlink_metadata(path)?;
        if !meta.file_type().is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        Ok(Self::of_metadata(&meta))
    }

    /// The stamp in metadata already read.
    pub fn of_metadata(meta: &std::fs::Metadata) -> Self {
        Self { size: meta.len(), mtime_ns: super::walk::mtime_ns(meta) }
    }
}

/// The destination directory, prepared for a run.
#[derive(Debug)]
pub struct StagingArea {
    root: PathBuf,
    run_dir: PathBuf,
    lock_path: PathBuf,
    _lock: File,
    dirs: DirMaker,
    next_id: AtomicU64,
    /// Whether files start without a name (probed once, when opened).
    unnamed: bool,
}

impl StagingArea {
    /// Creates the destination if needed, removes leftovers of dead runs and
    /// claims a temporary directory for this run.
    ///
    /// # Errors
    /// Fails when the destination cannot be created or written.
    pub fn open(root: &Path) -> Result<Self, StagingError> {
        fn prepare(path: &Path) -> impl FnOnce(io::Error) -> StagingError + '_ {
            move |source| StagingError::Prepare { path: path.to_path_buf(), source }
        }
        std::fs::create_dir_all(root).map_err(prepare(root))?;
        let state = root.join(STATE_DIR);
        let tmp = state.join(TEMP_DIR);
        for dir in [&state, &tmp] {
            real_dir(dir)?;
        }
        sweep_dead_runs(&tmp);

        let run = format!("{}-{:08x}", std::process::id(), rand::random::<u32>());
        let lock_path = tmp.join(format!("{run}.lock"));
        let lock = File::create(&lock_path).map_err(prepare(&lock_path))?;
        lock.lock().map_err(prepare(&lock_path))?;
        let run_dir = tmp.join(&run);
        std::fs::create_dir(&run_dir).map_err(prepare(&run_dir))?;
        let scratch = run_dir.join(SCRATCH_DIR);
        std::fs::create_dir(&scratch).map_err(prepare(&scratch))?;
        let unnamed = unnamed_files_link(&run_dir);
        Ok(Self {
            root: root.to_path_buf(),
            run_dir,
            lock_path,
            _lock: lock,
            dirs: DirMaker::new(root.to_path_buf()),
            next_id: AtomicU64::new(0),
            unnamed,
        })
    }

    /// The same area, with every temporary file named (as on a filesystem
    /// without `O_TMPFILE`).
    #[cfg(test)]
    pub(crate) fn named_only(self) -> Self {
        Self { unnamed: false, ..self }
    }

    /// The destination directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A directory of this run's for its own scratch files (sorted runs of
    /// the manifest), swept with the rest when the run is gone.
    pub fn scratch_dir(&self) -> PathBuf {
        self.run_dir.join(SCRATCH_DIR)
    }

    /// Creates an empty temporary file for `rel`, preallocated to `size`
    /// bytes so the filesystem can lay it out contiguously and a full disk
    /// fails early. `rel`'s parent directories are made now: an unnamed
    /// file is made in its final directory.
    ///
    /// # Errors
    /// Fails when a parent cannot be created safely, or the file cannot be
    /// created, or space cannot be reserved.
    pub fn temp_file(&self, rel: &RelPath, size: u64) -> io::Result<TempFile> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let unnamed = if self.unnamed { self.unnamed_file(rel)? } else { None };
        let temp = match unnamed {
            Some(file) => TempFile { id, name: None, file: Arc::new(file), committed: false },
            None => {
                let path = self.named_path(id);
                let file = OpenOptions::new().write(true).read(true).create_new(true).open(&path)?;
                TempFile { id, name: Some(path), file: Arc::new(file), committed: false }
            }
        };
        if size > PREALLOCATE_ABOVE {
            match rustix::fs::fallocate(&*temp.file, rustix::fs::FallocateFlags::empty(), 0, size) {
                Ok(()) => {}
                Err(rustix::io::Errno::NOSPC) => return Err(io::Error::from(io::ErrorKind::StorageFull)),
                // Filesystems without fallocate still work, just without the reservation.
                Err(_) => temp.file.set_len(size)?,
            }
        }
        Ok(temp)
    }

    /// A file without a name in `rel`'s directory, or `None` where that
    /// directory's filesystem makes none (another mount below the root).
    fn unnamed_file(&self, rel: &RelPath) -> io::Result<Option<File>> {
        self.dirs.ensure_parents(rel)?;
        let target = rel.under(&self.root);
        match open_unnamed(target.parent().unwrap_or(&self.root)) {
            Ok(file) => Ok(Some(file)),
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// An unused name in this run's directory (on the destination's
    /// filesystem), for a link made only to be renamed over a file.
    pub fn spare_path(&self) -> PathBuf {
        self.named_path(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    fn named_path(&self, id: u64) -> PathBuf {
        self.run_dir.join(format!("{id}.part"))
    }

    /// Moves a complete, verified temporary file to its final name.
    ///
    /// # Errors
    /// Fails when a parent cannot be created safely or the rename fails.
    pub fn commit(&self, mut temp: TempFile, rel: &RelPath, mtime: Option<SystemTime>) -> io::Result<FileStamp> {
        let stamp = match temp.name.as_deref() {
            Some(path) => self.commit_file(path, &temp.file, rel, mtime)?,
            None => {
                let target = self.prepare_target(&temp.file, rel, mtime)?;
                self.link_unnamed(&temp, &target)?;
                FileStamp::of(&target)?
            }
        };
        temp.committed = true;
        Ok(stamp)
    }

    /// Moves a complete, verified partial object (kept across runs, see
    /// [`super::partial`]) to its final name.
    ///
    /// # Errors
    /// As [`StagingArea::commit`].
    pub fn commit_partial(
        &self,
        partial: PartialObject,
        rel: &RelPath,
        mtime: Option<SystemTime>,
    ) -> io::Result<FileStamp> {
        let stamp = self.commit_file(partial.part_path(), &partial.handle(), rel, mtime)?;
        partial.finished();
        Ok(stamp)
    }

    /// Puts a hard link to `object` (a file of the shared-objects store,
    /// see [`super::shared_objects`]) at `rel`, replacing what is there
    /// atomically. The object's inode is shared: its mtime is left as it
    /// is, since every other directory's manifest recorded it.
    ///
    /// # Errors
    /// Fails when a parent cannot be created safely or the link fails
    /// (another mount, a filesystem without hard links: the caller fetches
    /// instead).
    pub fn commit_link(&self, object: &Path, rel: &RelPath) -> io::Result<FileStamp> {
        self.dirs.ensure_parents(rel)?;
        let target = rel.under(&self.root);
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other(format!("'{}' exists and is a directory", target.display())));
        }
        match std::fs::hard_link(object, &target) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                // A name in the run's directory first, renamed over the old
                // file: readers see the old file or the new, never neither.
                let named = self.spare_path();
                std::fs::hard_link(object, &named)?;
                let renamed = std::fs::rename(&named, &target);
                // rename(2) of two names of one inode does nothing and
                // leaves both: the temporary name must go either way.
                let _ = std::fs::remove_file(&named);
                renamed?;
            }
            Err(error) => return Err(error),
        }
        FileStamp::of(&target)
    }

    fn commit_file(&self, path: &Path, file: &File, rel: &RelPath, mtime: Option<SystemTime>) -> io::Result<FileStamp> {
        let target = self.prepare_target(file, rel, mtime)?;
        // rename() replaces a symlink at the target itself, never its referent.
        std::fs::rename(path, &target)?;
        FileStamp::of(&target)
    }

    /// Stamps `file` with `mtime` and makes `rel`'s parents; the path it
    /// goes to, which must not be a directory.
    fn prepare_target(&self, file: &File, rel: &RelPath, mtime: Option<SystemTime>) -> io::Result<PathBuf> {
        if let Some(mtime) = mtime {
            file.set_modified(mtime)?;
        }
        self.dirs.ensure_parents(rel)?;
        let target = rel.under(&self.root);
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other(format!("'{}' exists and is a directory", target.display())));
        }
        Ok(target)
    }

    /// Gives an unnamed file its name. A name that exists (a file updated,
    /// or a symlink, which is replaced itself, never its referent) cannot
    /// be linked over: the file gets a name in the run's directory first
    /// and is renamed over it, atomically.
    fn link_unnamed(&self, temp: &TempFile, target: &Path) -> io::Result<()> {
        match link_unnamed_to(&temp.file, target) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::EXIST) => {
                let named = self.named_path(temp.id);
                link_unnamed_to(&temp.file, &named)?;
                std::fs::rename(&named, target).inspect_err(|_| {
                    let _ = std::fs::remove_file(&named);
                })
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Removes this run's temporary directory.
    pub fn close(self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// A file being written; gone when dropped uncommitted.
#[derive(Debug)]
pub struct TempFile {
    id: u64,
    /// Its name in the run's directory; none for a file made without one,
    /// which the filesystem frees with its last descriptor.
    name: Option<PathBuf>,
    file: Arc<File>,
    committed: bool,
}

impl TempFile {
    /// A shared handle for positional writes from several tasks.
    pub fn handle(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(name) = &self.name
            && !self.committed
        {
            let _ = std::fs::remove_file(name);
        }
    }
}

/// Writes `chunks`, back to back, at `offset` with vectored writes, so
/// bytes go from the network buffers to the page cache without a copy in
/// between.
///
/// # Errors
/// Returns the error from `pwritev`; a zero-length write is `WriteZero`.
pub fn write_chunks_at(file: &File, chunks: &[bytes::Bytes], mut offset: u64) -> io::Result<()> {
    let mut index = 0; // first chunk not fully written
    let mut skip = 0; // bytes of that chunk already written
    while index < chunks.len() {
        let slices: Vec<io::IoSlice<'_>> = std::iter::once(&chunks[index][skip..])
            .chain(chunks[index + 1..].iter().map(|c| &c[..]))
            .take(1024) // IOV_MAX
            .map(io::IoSlice::new)
            .collect();
        let mut written = match rustix::io::pwritev(file, &slices, offset) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        offset += written as u64;
        while index < chunks.len() && written > 0 {
            let left = chunks[index].len() - skip;
            if written >= left {
                written -= left;
                index += 1;
                skip = 0;
            } else {
                skip += written;
                written = 0;
            }
        }
        while index < chunks.len() && chunks[index].len() == skip {
            index += 1;
            skip = 0;
        }
    }
    Ok(())
}

fn real_dir(dir: &Path) -> Result<(), StagingError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(StagingError::StateIsSymlink(dir.to_path_buf())),
        Ok(_) => Ok(()),
        Err(_) => match std::fs::create_dir(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            Err(source) => Err(StagingError::Prepare { path: dir.to_path_buf(), source }),
        },
    }
}

/// Whether a file made without a name in `dir` can be linked to one
/// there: the filesystem takes `O_TMPFILE` and `/proc` is mounted (the
/// link goes through the descriptor's `/proc/self/fd` entry, which needs
/// no privilege, where `AT_EMPTY_PATH` would).
fn unnamed_files_link(dir: &Path) -> bool {
    let Ok(file) = open_unnamed(dir) else { return false };
    let probe = dir.join("probe.link");
    let linked = link_unnamed_to(&file, &probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    linked
}

/// A new file without a name in `dir` (`O_TMPFILE`), read-write, with the
/// mode a created file gets (0666 less the umask).
fn open_unnamed(dir: &Path) -> rustix::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
    rustix::fs::open(dir, flags, Mode::from_raw_mode(0o666)).map(File::from)
}

/// Gives the unnamed `file` the name `to`, which must not exist.
fn link_unnamed_to(file: &File, to: &Path) -> rustix::io::Result<()> {
    use rustix::fs::{AtFlags, CWD};
    let fd_path = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(CWD, fd_path.as_str(), CWD, to, AtFlags::SYMLINK_FOLLOW)
}

/// How many runs hold their lock on `root`'s staging area right now.
pub fn live_runs(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root.join(STATE_DIR).join(TEMP_DIR)) else { return 0 };
    entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "lock"))
        .filter(|path| OpenOptions::new().write(true).open(path).is_ok_and(|lock| lock.try_lock().is_err()))
        .count()
}

/// Deletes temporary directories whose owning run no longer holds its lock.
fn sweep_dead_runs(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(lock) = OpenOptions::new().write(true).open(&path) else { continue };
        if lock.try_lock().is_ok() {
            let run_dir = path.with_extension("");
            let removed = std::fs::remove_dir_all(&run_dir);
            tracing::info!(dir = %run_dir.display(), ok = removed.is_ok(), "removed temporary files of an interrupted run");
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::paths::{KeyPath, key_to_path};

    fn rel(p: &str) -> RelPath {
        match key_to_path(p).unwrap() {
            KeyPath::File(r) => r,
            KeyPath::DirectoryMarker => panic!(),
        }
    }

    /// The areas to test: files made unnamed where this filesystem can, and
    /// named ones as elsewhere.
    fn areas(root: &Path) -> Vec<StagingArea> {
        let unnamed = StagingArea::open(root).unwrap();
        assert!(unnamed.unnamed || !cfg!(target_os = "linux"), "tests run where O_TMPFILE works");
        vec![unnamed, StagingArea::open(root).unwrap().named_only()]
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn files_appear_under_their_name_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        for (i, area) in areas(dir.path()).into_iter().enumerate() {
            let name = format!("a/{i}.bin");
            let temp = area.temp_file(&rel(&name), 4).unwrap();
            write_chunks_at(&temp.handle(), &[bytes::Bytes::from_static(b"data")], 0).unwrap();
            assert!(!dir.path().join(&name).exists());
            let stamp = area.commit(temp, &rel(&name), None).unwrap();
            assert_eq!(std::fs::read(dir.path().join(&name)).unwrap(), b"data");
            assert_eq!(stamp.size, 4);

            let dropped = area.temp_file(&rel("a/dropped.bin"), 4).unwrap();
            drop(dropped);
            area.close();
        }
        assert_eq!(entries(&dir.path().join("a")), ["0.bin", "1.bin"], "nothing of the dropped files");
        assert_eq!(std::fs::read_dir(dir.path().join(STATE_DIR).join(TEMP_DIR)).unwrap().count(), 0);
    }

    #[test]
    fn a_commit_replaces_a_file_or_a_symlink_but_never_what_the_symlink_points_at() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("victim"), b"keep").unwrap();
        for area in areas(dir.path()) {
            std::fs::write(dir.path().join("old.bin"), b"old").unwrap();
            let _ = std::fs::remove_file(dir.path().join("link.bin"));
            std::os::unix::fs::symlink(outside.path().join("victim"), dir.path().join("link.bin")).unwrap();
            for name in ["old.bin", "link.bin"] {
                let temp = area.temp_file(&rel(name), 3).unwrap();
                write_chunks_at(&temp.handle(), &[bytes::Bytes::from_static(b"new")], 0).unwrap();
                area.commit(temp, &rel(name), None).unwrap();
                let meta = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
                assert!(meta.file_type().is_file(), "{name} is a file now");
                assert_eq!(std::fs::read(dir.path().join(name)).unwrap(), b"new");
            }
            area.close();
        }
        assert_eq!(std::fs::read(outside.path().join("victim")).unwrap(), b"keep");
        assert_eq!(entries(dir.path()), [STATE_DIR, "link.bin", "old.bin"]);
    }

    #[test]
    fn a_directory_in_the_way_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for area in areas(dir.path()) {
            std::fs::create_dir_all(dir.path().join("taken")).unwrap();
            let temp = area.temp_file(&rel("taken"), 1).unwrap();
            let error = area.commit(temp, &rel("taken"), None).unwrap_err();
            assert!(error.to_string().contains("is a directory"), "{error}");
            area.close();
        }
    }

    #[test]
    fn chunks_are_written_back_to_back_at_the_offset() {
        let dir = tempfile::tempdir().unwrap();
        let file =
            File::options().read(true).write(true).create(true).truncate(true).open(dir.path().join("f")).unwrap();
        let chunks: Vec<bytes::Bytes> =
            [&b"ab"[..], b"", b"cde", b"f"].iter().map(|c| bytes::Bytes::copy_from_slice(c)).collect();
        write_chunks_at(&file, &chunks, 3).unwrap();
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), b"\0\0\0abcdef");
    }

    #[test]
    fn leftovers_of_a_dead_run_are_swept_but_a_live_run_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(STATE_DIR).join(TEMP_DIR);
        std::fs::create_dir_all(tmp.join("dead")).unwrap();
        std::fs::write(tmp.join("dead/0.part"), b"half").unwrap();
        File::create(tmp.join("dead.lock")).unwrap();
        let live = StagingArea::open(dir.path()).unwrap().named_only();
        assert!(!tmp.join("dead").exists());
        let live_file = live.temp_file(&rel("a.bin"), 1).unwrap();
        let second = StagingArea::open(dir.path()).unwrap();
        assert!(live_file.name.as_ref().unwrap().exists(), "a run holding its lock keeps its files");
        second.close();
        drop(live_file);
        live.close();
    }
}
