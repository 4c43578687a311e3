//! Where bytes reach the disk: once, at their final offset, in a temporary
//! file that is renamed into place only after it is complete and verified.
//!
//! Temporary files live in `DIR/.ferry/tmp/<run>/`, on the same filesystem
//! as their destination so the final rename is atomic. Each run holds an
//! exclusive lock on `DIR/.ferry/tmp/<run>.lock`; a later run that can take
//! that lock knows the owner is gone (killed, crashed) and deletes its
//! leftovers. Sharded workers writing into one shared directory each hold
//! their own lock and never touch each other's files.
//!
//! Not durable against power loss: files are not fsynced, because staging
//! targets caches that can be re-staged, and fsync per small file would cost
//! more than the copy. A killed process never leaves a partial file under a
//! final name.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use super::STATE_DIR;
use super::partial::PartialObject;
use super::paths::{DirMaker, RelPath};

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
        let tmp = state.join("tmp");
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
        Ok(Self {
            root: root.to_path_buf(),
            run_dir,
            lock_path,
            _lock: lock,
            dirs: DirMaker::new(root.to_path_buf()),
            next_id: AtomicU64::new(0),
        })
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

    /// Creates an empty temporary file, preallocated to `size` bytes so the
    /// filesystem can lay it out contiguously and a full disk fails early.
    ///
    /// # Errors
    /// Fails when the file cannot be created or space cannot be reserved.
    pub fn temp_file(&self, size: u64) -> io::Result<TempFile> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let path = self.run_dir.join(format!("{id}.part"));
        let file = OpenOptions::new().write(true).read(true).create_new(true).open(&path)?;
        let temp = TempFile { path, file: Arc::new(file), committed: false };
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

    /// Moves a complete, verified temporary file to its final name.
    ///
    /// # Errors
    /// Fails when a parent cannot be created safely or the rename fails.
    pub fn commit(&self, mut temp: TempFile, rel: &RelPath, mtime: Option<SystemTime>) -> io::Result<FileStamp> {
        let stamp = self.commit_file(&temp.path, &temp.file, rel, mtime)?;
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

    fn commit_file(&self, path: &Path, file: &File, rel: &RelPath, mtime: Option<SystemTime>) -> io::Result<FileStamp> {
        if let Some(mtime) = mtime {
            file.set_modified(mtime)?;
        }
        self.dirs.ensure_parents(rel)?;
        let target = rel.under(&self.root);
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            return Err(io::Error::other(format!("'{}' exists and is a directory", target.display())));
        }
        // rename() replaces a symlink at the target itself, never its referent.
        std::fs::rename(path, &target)?;
        FileStamp::of(&target)
    }

    /// Removes this run's temporary directory.
    pub fn close(self) {
        let _ = std::fs::remove_dir_all(&self.run_dir);
        let _ = std::fs::remove_file(&self.lock_path);
    }
}

/// A file being written; deleted when dropped uncommitted.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
    file: Arc<File>,
    committed: bool,
}

impl TempFile {
    /// A shared handle for positional writes from several tasks.
    pub fn handle(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }

    /// The temporary path (for reading back during verification).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.path);
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

/// How many runs hold their lock on `root`'s staging area right now.
pub fn live_runs(root: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(root.join(STATE_DIR).join("tmp")) else { return 0 };
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

    #[test]
    fn files_appear_under_their_name_only_when_committed() {
        let dir = tempfile::tempdir().unwrap();
        let area = StagingArea::open(dir.path()).unwrap();
        let temp = area.temp_file(4).unwrap();
        write_chunks_at(&temp.handle(), &[bytes::Bytes::from_static(b"data")], 0).unwrap();
        assert!(!dir.path().join("a/b.bin").exists());
        area.commit(temp, &rel("a/b.bin"), None).unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b.bin")).unwrap(), b"data");

        let dropped = area.temp_file(4).unwrap();
        let path = dropped.path().to_path_buf();
        drop(dropped);
        assert!(!path.exists());
        area.close();
        assert_eq!(std::fs::read_dir(dir.path().join(".ferry/tmp")).unwrap().count(), 0);
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
        let tmp = dir.path().join(".ferry/tmp");
        std::fs::create_dir_all(tmp.join("dead")).unwrap();
        std::fs::write(tmp.join("dead/0.part"), b"half").unwrap();
        File::create(tmp.join("dead.lock")).unwrap();
        let live = StagingArea::open(dir.path()).unwrap();
        assert!(!tmp.join("dead").exists());
        let live_file = live.temp_file(1).unwrap();
        let second = StagingArea::open(dir.path()).unwrap();
        assert!(live_file.path().exists(), "a run holding its lock keeps its files");
        second.close();
        drop(live_file);
        live.close();
    }
}
