//! The manifest: what has been staged into a directory, so a re-run decides
//! reuse on content (size and ETag from the store, size and mtime on disk),
//! not on file names.
//!
//! Each run appends one JSON line per committed file as it goes, so a killed
//! run still records what it finished, and rewrites its manifest compactly
//! at the end. Sharded workers staging into one directory each keep their
//! own file (`manifest-shard-I-of-N.jsonl`); every manifest in the state
//! directory is read, so a re-run with different sharding still reuses data.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead as _, BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::STATE_DIR;
use super::paths::RelPath;
use super::staging::FileStamp;
use crate::store::ObjectMeta;

/// One staged file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// Path relative to the destination.
    pub path: String,
    /// The object key it came from.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// The store's ETag for the object.
    pub etag: String,
    /// The checksum it was verified against, e.g. `crc32c:1a2b3c4d`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// The file's mtime after staging, in nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// Everything earlier runs recorded, by relative path.
#[derive(Debug, Default)]
pub struct Manifest {
    entries: HashMap<String, ManifestEntry>,
}

impl Manifest {
    /// Reads every manifest in `root`'s state directory. Torn or malformed
    /// lines (a run killed mid-write) are skipped: they only cost a re-copy.
    pub fn load(root: &Path) -> Self {
        let mut entries = HashMap::new();
        let Ok(dir) = std::fs::read_dir(root.join(STATE_DIR)) else { return Self { entries } };
        let mut files: Vec<PathBuf> =
            dir.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "jsonl")).collect();
        files.sort();
        for file in files {
            let Ok(file) = File::open(&file) else { continue };
            for line in BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                if let Ok(entry) = serde_json::from_str::<ManifestEntry>(&line) {
                    entries.insert(entry.path.clone(), entry);
                }
            }
        }
        Self { entries }
    }

    /// Every entry loaded, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = &ManifestEntry> {
        self.entries.values()
    }

    /// The entry for the relative path `path`, if an earlier run staged it.
    pub fn get(&self, path: &str) -> Option<&ManifestEntry> {
        self.entries.get(path)
    }

    /// Number of entries loaded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was loaded.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for `rel` if the file on disk is still exactly what was
    /// staged from this object: same size and ETag in the store, same size
    /// and mtime on disk.
    pub fn reusable(&self, root: &Path, rel: &RelPath, object: &ObjectMeta) -> Option<&ManifestEntry> {
        let entry = self.entries.get(rel.as_str())?;
        let etag = object.etag.as_deref()?;
        if entry.size != object.size || entry.etag != etag {
            return None;
        }
        let stamp = FileStamp::of(&rel.under(root)).ok()?;
        (stamp.size == entry.size && stamp.mtime_ns == entry.mtime_ns).then_some(entry)
    }
}

/// Appends entries as files are committed and compacts at the end.
#[derive(Debug)]
pub struct ManifestWriter {
    path: PathBuf,
    state: Mutex<WriterState>,
}

#[derive(Debug)]
struct WriterState {
    journal: BufWriter<File>,
    entries: Vec<ManifestEntry>,
}

impl ManifestWriter {
    /// Opens (appending) the manifest file `name` in `root`'s state directory.
    ///
    /// # Errors
    /// Fails when the file cannot be opened.
    pub fn open(root: &Path, name: &str) -> io::Result<Self> {
        let path = root.join(STATE_DIR).join(name);
        let journal = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(Self { path, state: Mutex::new(WriterState { journal: BufWriter::new(journal), entries: Vec::new() }) })
    }

    /// Records a file that is in place (newly staged or reused).
    ///
    /// # Errors
    /// Fails when the journal cannot be written.
    pub fn record(&self, entry: ManifestEntry, newly_staged: bool) -> io::Result<()> {
        let mut state = self.state.lock().expect("manifest lock poisoned");
        let line = newly_staged.then(|| serde_json::to_vec(&entry)).transpose().map_err(io::Error::other)?;
        // Kept for the rewrite at the end even when the journal cannot take
        // it: on a disk that filled up, the failed run frees its temporary
        // files before that rewrite, and the file is in place all the same.
        state.entries.push(entry);
        if let Some(mut line) = line {
            line.push(b'\n');
            state.journal.write_all(&line)?;
            // Flushed per file so a killed run keeps what it finished.
            state.journal.flush()?;
        }
        Ok(())
    }

    /// Rewrites the manifest with exactly the entries of this run.
    ///
    /// # Errors
    /// Fails when the new manifest cannot be written or renamed.
    pub fn finish(self) -> io::Result<()> {
        let state = self.state.into_inner().expect("manifest lock poisoned");
        drop(state.journal);
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut out = BufWriter::new(File::create(&tmp)?);
        for entry in &state.entries {
            serde_json::to_writer(&mut out, entry).map_err(io::Error::other)?;
            out.write_all(b"\n")?;
        }
        out.into_inner().map_err(|e| e.into_error())?;
        std::fs::rename(&tmp, &self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::paths::{KeyPath, key_to_path};

    #[test]
    fn reuse_requires_same_etag_size_and_untouched_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        std::fs::write(dir.path().join("a.bin"), b"hello").unwrap();
        let KeyPath::File(rel) = key_to_path("a.bin").unwrap() else { panic!() };
        let stamp = FileStamp::of(&dir.path().join("a.bin")).unwrap();
        let writer = ManifestWriter::open(dir.path(), "manifest.jsonl").unwrap();
        let entry = ManifestEntry {
            path: "a.bin".into(),
            key: "p/a.bin".into(),
            size: 5,
            etag: "e1".into(),
            checksum: None,
            mtime_ns: stamp.mtime_ns,
        };
        writer.record(entry, true).unwrap();
        // A torn line from a killed writer must not hide the good ones.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(".ferry/manifest.jsonl"))
            .unwrap()
            .write_all(b"{\"path\":\"b")
            .unwrap();
        let manifest = Manifest::load(dir.path());
        assert_eq!(manifest.len(), 1);
        let object =
            |etag: &str, size| ObjectMeta { key: "p/a.bin".into(), size, etag: Some(etag.into()), last_modified: None };
        assert!(manifest.reusable(dir.path(), &rel, &object("e1", 5)).is_some());
        assert!(manifest.reusable(dir.path(), &rel, &object("e2", 5)).is_none(), "changed in the store");
        std::fs::write(dir.path().join("a.bin"), b"HELLO, changed").unwrap();
        assert!(manifest.reusable(dir.path(), &rel, &object("e1", 5)).is_none(), "changed on disk");
        writer.finish().unwrap();
        assert_eq!(Manifest::load(dir.path()).len(), 1);
    }
}
