//! The part of a [`super::Catalog`] that does not fit in its memory:
//! entries written to disk in key order and found again by key.
//!
//! A worker stages its share in about key order (it lists the store in key
//! order), so entries leave memory by replacement selection: the smallest
//! key above the last one written goes next. Commits that arrive out of
//! order by less than what the memory holds still make a single sorted run;
//! a new run starts only when every entry held sorts below the last one
//! written. Each run keeps in memory the first key of every block of
//! [`BLOCK`] bytes, so a lookup reads one block per run, and memory grows
//! with the count only by one key per block (about 1 byte per entry).
//!
//! Run files are unlinked as soon as they are opened: they go with the
//! process however it ends, and take their disk space with them.
//!
//! An entry on disk is four fields back to back: the key, the path and the
//! ETag, each as a little-endian `u32` length and its bytes, then the size
//! as a little-endian `u64`. Paths are written as bytes, so a path that is
//! not UTF-8 comes back as it was.

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// An entry: one object a worker holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Where the file is.
    pub path: PathBuf,
    /// The version (ETag) it is.
    pub etag: String,
    /// Its size.
    pub size: u64,
}

/// Bytes of entries per indexed block: a lookup reads at most this much.
pub const BLOCK: u64 = 64 << 10;

/// Bytes of entries gathered before they are written out.
const WRITE_BUFFER: usize = 64 << 10;

/// One file of entries in ascending key order (no key twice).
#[derive(Debug)]
pub struct Run {
    file: File,
    /// The first key of every block, and where that block starts.
    blocks: Vec<(String, u64)>,
    /// Bytes of entries in the run: on disk, then in `pending`.
    len: u64,
    /// Bytes on disk (the start of `pending`).
    written: u64,
    /// Entries not written yet: the write buffer, or what a full disk
    /// refused (kept, and written with the next entries).
    pending: Vec<u8>,
    /// The last key appended.
    last: String,
}

impl Run {
    /// An empty run in a new unlinked file in `dir` (created if need be).
    ///
    /// # Errors
    /// The directory or the file cannot be made.
    pub fn create(dir: &Path, number: usize) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("catalog.{}.{number}.run", std::process::id()));
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        std::fs::remove_file(&path)?;
        let pending = Vec::with_capacity(WRITE_BUFFER + (8 << 10));
        Ok(Self { file, blocks: Vec::new(), len: 0, written: 0, pending, last: String::new() })
    }

    /// The last key appended (`None` before the first).
    pub fn last_key(&self) -> Option<&str> {
        (!self.blocks.is_empty()).then_some(self.last.as_str())
    }

    /// Bytes this run holds in memory: its index and unwritten entries.
    #[cfg(test)]
    pub fn resident_bytes(&self) -> usize {
        let index: usize = self.blocks.iter().map(|(key, _)| key.len() + std::mem::size_of::<(String, u64)>()).sum();
        index + self.pending.capacity()
    }

    /// Appends the entry for `key`, which must sort above the last key.
    ///
    /// # Errors
    /// The buffered entries could not be written out (a full disk). They
    /// are kept in memory, found by lookups, and written out with the next
    /// ones: nothing is lost.
    pub fn append(&mut self, key: &str, held: &Held) -> io::Result<()> {
        debug_assert!(self.last_key().is_none_or(|last| key > last), "run entries must ascend");
        if self.blocks.last().is_none_or(|(_, start)| self.len - start >= BLOCK) {
            self.blocks.push((key.to_owned(), self.len));
        }
        let before = self.pending.len();
        encode(&mut self.pending, key, held);
        self.len += (self.pending.len() - before) as u64;
        self.last.clear();
        self.last.push_str(key);
        if self.pending.len() >= WRITE_BUFFER { self.write_pending() } else { Ok(()) }
    }

    fn write_pending(&mut self) -> io::Result<()> {
        self.file.write_all_at(&self.pending, self.written)?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The entry for `key`, if this run has one.
    ///
    /// # Errors
    /// The block could not be read back.
    pub fn get(&self, key: &str) -> io::Result<Option<Held>> {
        let Some((first, _)) = self.blocks.first() else { return Ok(None) };
        if key < first.as_str() || key > self.last.as_str() {
            return Ok(None);
        }
        let block = self.blocks.partition_point(|(first, _)| first.as_str() <= key) - 1;
        let start = self.blocks[block].1;
        let end = self.blocks.get(block + 1).map_or(self.len, |(_, start)| *start);
        let bytes = self.read(start, end)?;
        find(&bytes, key.as_bytes())
    }

    /// Bytes `start..end` of the run, from disk and from `pending`.
    fn read(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; (end - start) as usize];
        let on_disk = (self.written.clamp(start, end) - start) as usize;
        self.file.read_exact_at(&mut bytes[..on_disk], start)?;
        let (from, buffered) = ((start.max(self.written) - self.written) as usize, bytes.len() - on_disk);
        bytes[on_disk..].copy_from_slice(&self.pending[from..from + buffered]);
        Ok(bytes)
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("keys, paths and ETags are far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(bytes);
}

fn encode(out: &mut Vec<u8>, key: &str, held: &Held) {
    put_bytes(out, key.as_bytes());
    put_bytes(out, held.path.as_os_str().as_bytes());
    put_bytes(out, held.etag.as_bytes());
    out.extend_from_slice(&held.size.to_le_bytes());
}

/// Reads entries from the front of a block.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a catalog run ends inside an entry"));
        }
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(taken)
    }

    fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes"));
        self.take(len as usize)
    }

    fn size(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("eight bytes")))
    }
}

/// The entry for `key` in `block`, skipping the others' fields unread.
fn find(block: &[u8], key: &[u8]) -> io::Result<Option<Held>> {
    let mut cursor = Cursor(block);
    while !cursor.0.is_empty() {
        let this = cursor.bytes()?;
        let (path, etag, size) = (cursor.bytes()?, cursor.bytes()?, cursor.size()?);
        if this == key {
            let etag = String::from_utf8(etag.to_vec()).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            return Ok(Some(Held { path: PathBuf::from(OsStr::from_bytes(path)), etag, size }));
        }
        if this > key {
            break;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: u64) -> Held {
        Held { path: PathBuf::from(format!("/data/d/{n:08}.bin")), etag: format!("\"etag-{n}\""), size: n }
    }

    #[test]
    fn every_entry_is_found_whether_written_out_or_still_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = Run::create(dir.path(), 0).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the run file is unlinked at once");
        // Enough entries for several blocks and write-outs, and a tail
        // still in the write buffer.
        let keys: Vec<String> = (0..5_000).map(|n| format!("train/{:08}.JPEG", n * 2)).collect();
        for (n, key) in keys.iter().enumerate() {
            run.append(key, &held(n as u64)).unwrap();
        }
        assert!(run.blocks.len() > 4, "{} blocks", run.blocks.len());
        assert!(!run.pending.is_empty() && run.written > 0);
        for (n, key) in keys.iter().enumerate() {
            assert_eq!(run.get(key).unwrap(), Some(held(n as u64)), "{key}");
        }
        // Keys between, before and after the run's.
        for absent in ["train/00000001.JPEG", "train/00004999.JPEG", "a", "train/", "z", "train/00009998.JPEGx"] {
            assert_eq!(run.get(absent).unwrap(), None, "{absent}");
        }
        assert_eq!(run.last_key(), Some("train/00009998.JPEG"));
    }

    #[test]
    fn paths_that_are_not_utf8_come_back_as_they_were() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = Run::create(dir.path(), 0).unwrap();
        let strange = Held { path: PathBuf::from(OsStr::from_bytes(b"/d/\xff\xfe")), etag: "e".into(), size: 1 };
        run.append("k", &strange).unwrap();
        run.write_pending().unwrap();
        assert_eq!(run.get("k").unwrap(), Some(strange));
    }
}
