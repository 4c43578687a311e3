//! Large objects downloaded part way, kept across runs so a pull killed at
//! 90% of a 100 GB checkpoint fetches the last 10%, not all of it again.
//!
//! A partial object is two files in `DIR/.ferry/partial/`, named after the
//! hash of its path: `<name>.part`, the object's bytes at their offsets, and
//! `<name>.ranges`, one JSON line saying which object (key, ETag or
//! generation, size) and which digests were computed, then one line per
//! piece written (a write buffer's worth of a range), with its digests. A
//! piece is recorded only after all its bytes are in the file, so a kill at
//! any moment leaves records that are true. A later run reuses the recorded
//! pieces only when the first line is the same (same object version, same
//! digests, same boot of the machine: after a reboot the page cache that
//! held unsynced bytes is gone, so nothing recorded before it is trusted),
//! and fetches only what they do not cover, however this run cuts ranges.
//! The whole object's checksum is still checked over every byte at the end;
//! a mismatch discards the partial and the object is downloaded from the
//! start.
//!
//! Each partial is locked while a run works on it: two runs never write one.
//! Partials of objects a complete run no longer needs are removed by it.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::paths::RelPath;
use ferry_contract::layout::{PARTIAL_DIR, STATE_DIR};

/// Which object a partial holds, and how it was cut: the first line of its
/// record. A partial is resumed only when every field is the same.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialHeader {
    /// The object's key.
    pub key: String,
    /// The object's ETag or generation when the download started.
    pub version: String,
    /// The object's size.
    pub size: u64,
    /// Which digests each range record carries, e.g. `crc32c`.
    pub digests: String,
    /// The machine's boot id when the ranges were written.
    pub boot: String,
}

/// One range written completely, with the digests computed as it arrived.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeRecord {
    /// Offset of the range in the object.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// CRC32C of the range, if computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
    /// CRC32 of the range, if computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<u32>,
    /// CRC64NVME of the range, if computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc64nvme: Option<u64>,
}

/// A partial object opened (and locked) by this run.
#[derive(Debug)]
pub struct PartialObject {
    part_path: PathBuf,
    record_path: PathBuf,
    file: Arc<File>,
    record: Mutex<File>,
    /// Ranges an earlier run completed, to be kept.
    done: Vec<RangeRecord>,
}

impl PartialObject {
    /// Opens the partial for the object at `name` (a stable name for its
    /// path), keeping what an earlier run recorded if `header` matches, else
    /// starting it empty. `None` when another run holds it.
    ///
    /// # Errors
    /// The state directory or the files cannot be created or written.
    pub fn open(root: &Path, name: &str, header: &PartialHeader) -> io::Result<Option<Self>> {
        let dir = root.join(STATE_DIR).join(PARTIAL_DIR);
        std::fs::create_dir_all(&dir)?;
        if std::fs::symlink_metadata(&dir)?.file_type().is_symlink() {
            // Writes through it could land anywhere.
            return Err(io::Error::other(format!("'{}' is a symlink", dir.display())));
        }
        let part_path = dir.join(format!("{name}.part"));
        let record_path = dir.join(format!("{name}.ranges"));
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&part_path)?;
        if file.try_lock().is_err() {
            return Ok(None);
        }
        let done = match read_record(&record_path) {
            Some((recorded, ranges)) if recorded == *header && file.metadata()?.len() == header.size => ranges,
            _ => Vec::new(),
        };
        let record = if done.is_empty() {
            file.set_len(0)?;
            preallocate(&file, header.size)?;
            let mut record = File::create(&record_path)?;
            writeln!(record, "{}", serde_json::to_string(header).map_err(io::Error::other)?)?;
            record
        } else {
            OpenOptions::new().append(true).open(&record_path)?
        };
        Ok(Some(Self { part_path, record_path, file: Arc::new(file), record: Mutex::new(record), done }))
    }

    /// A shared handle for positional writes.
    pub fn handle(&self) -> Arc<File> {
        Arc::clone(&self.file)
    }

    /// The ranges an earlier run completed.
    pub fn done(&self) -> &[RangeRecord] {
        &self.done
    }

    /// Records that a range is completely in the file. No fsync: a killed
    /// process loses nothing the kernel holds, and a lost machine changes
    /// the boot id, which voids the record.
    ///
    /// # Errors
    /// The record cannot be written.
    pub fn record(&self, range: &RangeRecord) -> io::Result<()> {
        let line = format!("{}\n", serde_json::to_string(range).map_err(io::Error::other)?);
        self.record.lock().expect("partial record lock poisoned").write_all(line.as_bytes())
    }

    /// The bytes' path, to rename into place once verified.
    pub fn part_path(&self) -> &Path {
        &self.part_path
    }

    /// Forgets the record once the bytes have moved to their final name.
    pub fn finished(self) {
        let _ = std::fs::remove_file(&self.record_path);
    }

    /// Removes the partial: its bytes are wrong, the next attempt starts over.
    pub fn discard(self) {
        let _ = std::fs::remove_file(&self.record_path);
        let _ = std::fs::remove_file(&self.part_path);
    }
}

/// Reserves `size` bytes so the filesystem lays the file out contiguously
/// and a full disk fails before the download, as for temporary files.
fn preallocate(file: &File, size: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::NOSPC) => Err(io::Error::from(io::ErrorKind::StorageFull)),
        // Filesystems without fallocate still work, just without the reservation.
        Err(_) => file.set_len(size),
    }
}

/// The header and the complete range records of a record file; a torn last
/// line (a kill while writing it) is ignored.
fn read_record(path: &Path) -> Option<(PartialHeader, Vec<RangeRecord>)> {
    let reader = io::BufReader::new(File::open(path).ok()?);
    let mut lines = reader.lines();
    let header: PartialHeader = serde_json::from_str(&lines.next()?.ok()?).ok()?;
    let mut ranges: Vec<RangeRecord> =
        lines.map_while(Result::ok).map_while(|line| serde_json::from_str(&line).ok()).collect();
    // Retried writes may overlap earlier ones: keep pieces that do not, so
    // their digests combine; a gap left is fetched again.
    ranges.sort_by_key(|r| (r.offset, std::cmp::Reverse(r.len)));
    let mut end = 0;
    ranges.retain(|r| {
        let keep = r.offset >= end && r.offset + r.len <= header.size;
        if keep {
            end = r.offset + r.len;
        }
        keep
    });
    Some((header, ranges))
}

/// The name of the partial of the object staged at `rel`: stable across
/// runs, and flat, whatever the depth of the path.
pub fn name_for(rel: &RelPath) -> String {
    format!("{:016x}", ferry_contract::hash::fnv1a(rel.as_str().as_bytes()))
}

/// Bytes each partial below `root` holds on disk, by name. They are
/// preallocated, so a run that resumes one, or starts it over, writes into
/// space the partial already has.
pub fn allocated(root: &Path) -> HashMap<String, u64> {
    let Ok(entries) = std::fs::read_dir(root.join(STATE_DIR).join(PARTIAL_DIR)) else { return HashMap::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let name = path.file_stem()?.to_str()?.to_owned();
            let meta = entry.metadata().ok().filter(|_| path.extension().is_some_and(|e| e == "part"))?;
            Some((name, meta.blocks().saturating_mul(512)))
        })
        .collect()
}

/// This boot of the machine, or empty where it cannot be told.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|id| id.trim().to_owned()).unwrap_or_default()
}

/// Removes every partial of an object `owned` by the caller that no run
/// holds: after a complete pull, none of them is of an object still to be
/// copied.
pub fn sweep(root: &Path, owned: impl Fn(&str) -> bool) -> usize {
    let dir = root.join(STATE_DIR).join(PARTIAL_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "part") {
            continue;
        }
        let record = path.with_extension("ranges");
        if read_record(&record).is_some_and(|(header, _)| !owned(&header.key)) {
            continue;
        }
        let Ok(file) = OpenOptions::new().write(true).open(&path) else { continue };
        if file.try_lock().is_ok() {
            let _ = std::fs::remove_file(&record);
            if std::fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    // Record files whose bytes are gone (renamed into place before the
    // record could be removed).
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "ranges") && !path.with_extension("part").exists() {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: &str) -> PartialHeader {
        PartialHeader {
            key: "ckpt/model.bin".into(),
            version: version.into(),
            size: 100,
            digests: "crc32c".into(),
            boot: boot_id(),
        }
    }

    fn range(offset: u64, len: u64) -> RangeRecord {
        RangeRecord { offset, len, crc32c: Some(offset as u32), crc32: None, crc64nvme: None }
    }

    #[test]
    fn recorded_ranges_survive_a_run_and_only_for_the_same_object_version() {
        let dir = tempfile::tempdir().unwrap();
        let first = PartialObject::open(dir.path(), "a", &header("e1")).unwrap().unwrap();
        assert!(first.done().is_empty());
        first.record(&range(40, 40)).unwrap();
        first.record(&range(0, 40)).unwrap();
        // A kill while writing the third record leaves half a line.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(STATE_DIR).join(PARTIAL_DIR).join("a.ranges"))
            .unwrap()
            .write_all(b"{\"offset\":80,\"le")
            .unwrap();
        drop(first);

        let again = PartialObject::open(dir.path(), "a", &header("e1")).unwrap().unwrap();
        assert_eq!(again.done(), &[range(0, 40), range(40, 40)]);
        drop(again);

        let changed = PartialObject::open(dir.path(), "a", &header("e2")).unwrap().unwrap();
        assert!(changed.done().is_empty(), "a new version of the object starts over");
        drop(changed);
        let rebooted = PartialHeader { boot: "another-boot".into(), ..header("e2") };
        assert!(PartialObject::open(dir.path(), "a", &rebooted).unwrap().unwrap().done().is_empty());
    }

    #[test]
    fn a_partial_held_by_a_run_is_neither_shared_nor_swept() {
        let dir = tempfile::tempdir().unwrap();
        let held = PartialObject::open(dir.path(), "a", &header("e1")).unwrap().unwrap();
        assert!(PartialObject::open(dir.path(), "a", &header("e1")).unwrap().is_none());
        let left = PartialObject::open(dir.path(), "b", &header("e1")).unwrap().unwrap();
        drop(left);
        let other = PartialHeader { key: "someone-elses".into(), ..header("e1") };
        drop(PartialObject::open(dir.path(), "c", &other).unwrap().unwrap());
        assert_eq!(sweep(dir.path(), |key| key != "someone-elses"), 1, "only the partial no run holds goes");
        assert!(dir.path().join(STATE_DIR).join(PARTIAL_DIR).join("c.part").exists(), "another shard's partial stays");
        assert!(held.part_path().exists());
        held.discard();
        assert_eq!(sweep(dir.path(), |_| true), 1);
        assert_eq!(std::fs::read_dir(dir.path().join(STATE_DIR).join(PARTIAL_DIR)).unwrap().count(), 0);
    }
}
