//! The manifest: what has been staged into a directory, so a re-run decides
//! reuse on content (size and ETag from the store, size and mtime on disk),
//! not on file names.
//!
//! A manifest file is JSON lines sorted by path, after a header line that
//! says so. A run appends one line per committed file to a journal beside it
//! as it goes (flushed per file, so a killed run still records what it
//! finished), and at the end writes the new manifest, sorted, and drops the
//! journal. Sharded workers staging into one directory each keep their own
//! file (`manifest-shard-I-of-N.jsonl`); every manifest in the state
//! directory is read, so a re-run with different sharding still reuses data.
//!
//! Nothing here holds the manifest in memory: earlier runs' files are read
//! as one stream in path order ([`ManifestCursor`]), which a pull walks in
//! step with its listing (keys come from the store in the same order), and
//! the new manifest is sorted on disk as it is written
//! ([`super::sorted::SortedWriter`]). Files without the header (written
//! before manifests were sorted, or a journal) are sorted once on the way in.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead as _, BufReader, BufWriter, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::paths::RelPath;
use super::sorted::{Ascending, JsonLines, Keyed, Merged, RunWriter, SORT_MEMORY, SortedRun, SortedWriter, Stream};
use super::staging::FileStamp;
use crate::store::ObjectMeta;
use ferry_contract::layout::STATE_DIR;

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

impl Keyed for ManifestEntry {
    fn sort_key(&self) -> &str {
        &self.path
    }

    fn resident_bytes(&self) -> usize {
        // The struct, the heap's slot and four strings' allocations.
        let strings =
            self.path.len() + self.key.len() + self.etag.len() + self.checksum.as_ref().map_or(0, String::len);
        std::mem::size_of::<Self>() + 16 + 4 * 16 + strings
    }
}

impl ManifestEntry {
    /// Whether the file on disk is still exactly what was staged from
    /// `object`: same size and ETag in the store, same size and mtime on
    /// disk.
    pub fn reusable(&self, root: &Path, rel: &RelPath, object: &ObjectMeta) -> bool {
        let Some(etag) = object.etag.as_deref() else { return false };
        if self.size != object.size || self.etag != etag {
            return false;
        }
        FileStamp::of(&rel.under(root)).is_ok_and(|stamp| stamp.size == self.size && stamp.mtime_ns == self.mtime_ns)
    }
}

/// The first line of a manifest file whose entries are sorted by path.
/// Earlier versions skip it: it does not parse as an entry.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    ferry_manifest: u32,
}

/// The format [`Header`] names: entries sorted by path.
const SORTED_FORMAT: u32 = 2;

/// Extension of a manifest file.
const MANIFEST_EXTENSION: &str = "jsonl";

/// Extension of a run's journal beside its manifest file. Not `jsonl`, so
/// that earlier versions, which read every `*.jsonl`, do not read it with
/// the wrong precedence.
const JOURNAL_EXTENSION: &str = "journal";

/// Whether `path` starts with the sorted format's header.
fn is_sorted(path: &Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let mut first = String::new();
    if BufReader::new(file).take(256).read_line(&mut first).is_err() {
        return false;
    }
    serde_json::from_str::<Header>(&first).is_ok_and(|header| header.ferry_manifest == SORTED_FORMAT)
}

/// What [`ManifestCursor::seek`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Sought {
    /// An earlier run staged this path.
    Found(ManifestEntry),
    /// No earlier run staged it.
    Absent,
    /// The path sorts below one sought before, so the cursor has gone past
    /// it: the listing is not in key order. Whether an earlier run staged
    /// it is not known.
    OutOfOrder,
}

/// Every manifest in a directory's state directory, read as one stream in
/// path order. Torn or malformed lines (a run killed mid-write) are
/// skipped: they only cost a re-copy.
#[derive(Debug)]
pub struct ManifestCursor {
    entries: Merged<ManifestEntry>,
    sought: Ascending,
}

impl ManifestCursor {
    /// Opens every manifest (and journal) in `root`'s state directory.
    /// Files are read in name order, each manifest followed by its journal;
    /// of entries for one path, the one read last wins. Files that are not
    /// sorted are sorted first, spilling into `scratch`.
    ///
    /// # Errors
    /// Fails when an unsorted file cannot be sorted (the scratch directory
    /// cannot be written).
    pub fn open(root: &Path, scratch: &Path) -> io::Result<Self> {
        let mut files: BTreeMap<String, [Option<PathBuf>; 2]> = BTreeMap::new();
        if let Ok(dir) = std::fs::read_dir(root.join(STATE_DIR)) {
            for path in dir.flatten().map(|e| e.path()) {
                let (Some(stem), Some(extension)) = (path.file_stem(), path.extension()) else { continue };
                let base_name = format!("{}.{MANIFEST_EXTENSION}", stem.to_string_lossy());
                let slot = match extension.to_str() {
                    Some(MANIFEST_EXTENSION) => 0,
                    Some(JOURNAL_EXTENSION) => 1,
                    _ => continue,
                };
                files.entry(base_name).or_default()[slot] = Some(path);
            }
        }
        let mut streams: Vec<Stream<ManifestEntry>> = Vec::new();
        for (number, path) in files.into_values().flatten().flatten().enumerate() {
            if is_sorted(&path) {
                match JsonLines::open(&path, true) {
                    Ok(lines) => streams.push(Box::new(until_failure(lines, path))),
                    Err(error) => {
                        tracing::warn!(file = %path.display(), %error, "cannot read a manifest; its files are copied again")
                    }
                }
                continue;
            }
            let Ok(lines) = JsonLines::<ManifestEntry>::open(&path, false) else { continue };
            let mut sorter = SortedWriter::new(scratch, &format!("manifest-{number}"), SORT_MEMORY);
            for entry in until_failure(lines, path) {
                sorter.push(entry?)?;
            }
            for run in sorter.into_few_runs()? {
                let stream = run.stream()?;
                streams.push(Box::new(until_failure(stream, run.path().to_path_buf())));
            }
        }
        Ok(Self { entries: Merged::new(streams)?, sought: Ascending::default() })
    }

    /// Moves on to `path`: every entry below it is handed to `passed`, and
    /// the entry at `path`, if any, is returned. Paths must be sought in
    /// increasing order; one below the last is [`Sought::OutOfOrder`].
    ///
    /// # Errors
    /// Whatever `passed` returns.
    pub fn seek<E>(&mut self, path: &str, passed: impl FnMut(ManifestEntry) -> Result<(), E>) -> Result<Sought, E> {
        if !self.sought.advance(path) {
            return Ok(Sought::OutOfOrder);
        }
        Ok(self.entries.seek(path, passed)?.map_or(Sought::Absent, Sought::Found))
    }

    /// Hands every entry not sought yet to `passed`.
    ///
    /// # Errors
    /// Whatever `passed` returns.
    pub fn drain<E>(mut self, passed: impl FnMut(ManifestEntry) -> Result<(), E>) -> Result<(), E> {
        self.try_for_each(passed)
    }
}

impl Iterator for ManifestCursor {
    type Item = ManifestEntry;

    fn next(&mut self) -> Option<ManifestEntry> {
        // The streams end at their first read error instead of failing.
        self.entries.next()?.ok()
    }
}

/// `lines` until the first read error, which is logged: what follows it
/// is unknown, as if the file ended there, and only costs re-copies.
fn until_failure<I>(lines: I, path: PathBuf) -> impl Iterator<Item = io::Result<ManifestEntry>> + Send
where
    I: Iterator<Item = io::Result<ManifestEntry>> + Send,
{
    lines
        .map_while(move |line| {
            line.map_err(|error| tracing::warn!(file = %path.display(), %error, "a manifest cannot be read to its end"))
                .ok()
        })
        .map(Ok)
}

/// Records what a run puts in place, journals what it copies, and writes
/// the new manifest at the end.
#[derive(Debug)]
pub struct ManifestWriter {
    path: PathBuf,
    journal_path: PathBuf,
    state: Mutex<WriterState>,
}

#[derive(Debug)]
struct WriterState {
    journal: BufWriter<File>,
    entries: SortedWriter<ManifestEntry>,
}

impl ManifestWriter {
    /// Opens the manifest `name` in `root`'s state directory, appending to
    /// its journal, and sorts this run's entries in `scratch`.
    ///
    /// # Errors
    /// Fails when the journal cannot be opened.
    pub fn open(root: &Path, name: &str, scratch: &Path) -> io::Result<Self> {
        let path = root.join(STATE_DIR).join(name);
        let journal_path = path.with_extension(JOURNAL_EXTENSION);
        let journal = std::fs::OpenOptions::new().create(true).append(true).open(&journal_path)?;
        let entries = SortedWriter::new(scratch, "manifest-new", SORT_MEMORY);
        Ok(Self { path, journal_path, state: Mutex::new(WriterState { journal: BufWriter::new(journal), entries }) })
    }

    /// Records a file that is in place (newly staged or reused).
    ///
    /// # Errors
    /// Fails when the journal or the sort's spill cannot be written.
    pub fn record(&self, entry: ManifestEntry, newly_staged: bool) -> io::Result<()> {
        let mut state = self.state.lock().expect("manifest lock poisoned");
        let line = newly_staged.then(|| serde_json::to_vec(&entry)).transpose().map_err(io::Error::other)?;
        // Kept for the manifest written at the end even when the journal
        // or the spill cannot take it (the sorter holds on to it): on a
        // disk that filled up, the failed run frees its temporary files
        // before that, and the file is in place all the same.
        let kept = state.entries.push(entry);
        if let Some(mut line) = line {
            line.push(b'\n');
            state.journal.write_all(&line)?;
            // Flushed per file so a killed run keeps what it finished.
            state.journal.flush()?;
        }
        kept
    }

    /// Writes the manifest: exactly this run's entries, and below them
    /// `carried` (entries of earlier runs this run keeps, in path order).
    /// The journal goes once the manifest is in place.
    ///
    /// # Errors
    /// Fails when the new manifest cannot be written or renamed.
    pub fn finish(self, carried: Option<SortedRun<ManifestEntry>>) -> io::Result<()> {
        let state = self.state.into_inner().expect("manifest lock poisoned");
        drop(state.journal);
        let mut streams = Vec::new();
        if let Some(carried) = &carried {
            streams.push(carried.stream()?);
        }
        for run in state.entries.into_few_runs()? {
            streams.push(run.stream()?);
        }
        let tmp = self.path.with_extension("jsonl.tmp");
        let header = serde_json::to_vec(&Header { ferry_manifest: SORTED_FORMAT }).map_err(io::Error::other)?;
        let mut out = RunWriter::with_first_line(&tmp, Some(&header))?;
        for entry in Merged::new(streams)? {
            out.write(&entry?)?;
        }
        out.finish_durably()?;
        std::fs::rename(&tmp, &self.path)?;
        match std::fs::remove_file(&self.journal_path) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::paths::{KeyPath, key_to_path};

    fn entry(path: &str, etag: &str) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            key: format!("p/{path}"),
            size: 1,
            etag: etag.into(),
            checksum: None,
            mtime_ns: 0,
        }
    }

    fn everything(root: &Path) -> Vec<(String, String)> {
        let scratch = tempfile::tempdir().unwrap();
        ManifestCursor::open(root, scratch.path()).unwrap().map(|e| (e.path, e.etag)).collect()
    }

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(p, e)| ((*p).to_owned(), (*e).to_owned())).collect()
    }

    #[test]
    fn reuse_requires_same_etag_size_and_untouched_file() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        std::fs::write(dir.path().join("a.bin"), b"hello").unwrap();
        let KeyPath::File(rel) = key_to_path("a.bin").unwrap() else { panic!() };
        let stamp = FileStamp::of(&dir.path().join("a.bin")).unwrap();
        let writer = ManifestWriter::open(dir.path(), "manifest.jsonl", scratch.path()).unwrap();
        let staged = ManifestEntry { size: 5, mtime_ns: stamp.mtime_ns, etag: "e1".into(), ..entry("a.bin", "") };
        writer.record(staged, true).unwrap();
        // A torn line from a killed writer must not hide the good ones.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(STATE_DIR).join("manifest.journal"))
            .unwrap()
            .write_all(b"{\"path\":\"b")
            .unwrap();
        let mut cursor = ManifestCursor::open(dir.path(), scratch.path()).unwrap();
        let Sought::Found(found) = cursor.seek("a.bin", |_| Ok::<_, ()>(())).unwrap() else { panic!("not found") };
        assert_eq!(cursor.count(), 0);
        let object =
            |etag: &str, size| ObjectMeta { key: "p/a.bin".into(), size, etag: Some(etag.into()), last_modified: None };
        assert!(found.reusable(dir.path(), &rel, &object("e1", 5)));
        assert!(!found.reusable(dir.path(), &rel, &object("e2", 5)), "changed in the store");
        std::fs::write(dir.path().join("a.bin"), b"HELLO, changed").unwrap();
        assert!(!found.reusable(dir.path(), &rel, &object("e1", 5)), "changed on disk");
        writer.finish(None).unwrap();
        assert_eq!(everything(dir.path()), pairs(&[("a.bin", "e1")]));
        assert!(
            !dir.path().join(STATE_DIR).join("manifest.journal").exists(),
            "the journal goes once the manifest is written"
        );
        assert!(is_sorted(&dir.path().join(STATE_DIR).join("manifest.jsonl")));
    }

    #[test]
    fn a_manifest_written_before_sorting_is_read_whole_with_its_last_lines_winning() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        // The earlier format: unsorted, appended to by a killed run, torn.
        let lines: Vec<String> = [entry("z", "1"), entry("b", "1"), entry("a", "1"), entry("b", "2")]
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        std::fs::write(dir.path().join(STATE_DIR).join("manifest.jsonl"), format!("{}\n{{\"path", lines.join("\n")))
            .unwrap();
        assert_eq!(everything(dir.path()), pairs(&[("a", "1"), ("b", "2"), ("z", "1")]));
    }

    #[test]
    fn journals_win_over_their_manifest_and_later_files_over_earlier_ones() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        // A finished run of shard 0, and one of the unsharded pull.
        for (name, entries) in [
            ("manifest-shard-0-of-2.jsonl", vec![entry("a", "shard"), entry("c", "shard")]),
            ("manifest.jsonl", vec![entry("c", "plain"), entry("d", "plain")]),
        ] {
            let writer = ManifestWriter::open(dir.path(), name, scratch.path()).unwrap();
            entries.into_iter().rev().for_each(|e| writer.record(e, true).unwrap());
            writer.finish(None).unwrap();
        }
        // A later shard-0 run killed after copying a new version of `a`.
        let killed = ManifestWriter::open(dir.path(), "manifest-shard-0-of-2.jsonl", scratch.path()).unwrap();
        killed.record(entry("a", "journal"), true).unwrap();
        drop(killed);
        assert_eq!(everything(dir.path()), pairs(&[("a", "journal"), ("c", "plain"), ("d", "plain")]));
    }

    #[test]
    fn the_cursor_hands_over_what_it_passes_and_notices_keys_out_of_order() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        let writer = ManifestWriter::open(dir.path(), "manifest.jsonl", scratch.path()).unwrap();
        ["a", "b", "c", "d"].iter().for_each(|p| writer.record(entry(p, "1"), true).unwrap());
        writer.finish(None).unwrap();
        let mut cursor = ManifestCursor::open(dir.path(), scratch.path()).unwrap();
        let mut passed = Vec::new();
        let mut seek = |cursor: &mut ManifestCursor, path: &str| {
            cursor
                .seek(path, |e| {
                    passed.push(e.path);
                    Ok::<_, ()>(())
                })
                .unwrap()
        };
        assert_eq!(seek(&mut cursor, "b"), Sought::Found(entry("b", "1")));
        assert_eq!(seek(&mut cursor, "bb"), Sought::Absent);
        assert_eq!(seek(&mut cursor, "a"), Sought::OutOfOrder);
        assert_eq!(seek(&mut cursor, "d"), Sought::Found(entry("d", "1")));
        assert_eq!(passed, ["a", "c"]);
    }

    #[test]
    fn the_new_manifest_holds_this_runs_entries_over_carried_ones_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(STATE_DIR)).unwrap();
        let mut carried = RunWriter::create(&scratch.path().join("carried")).unwrap();
        carried.write(&entry("b", "old")).unwrap();
        carried.write(&entry("x", "old")).unwrap();
        let writer = ManifestWriter::open(dir.path(), "manifest.jsonl", scratch.path()).unwrap();
        // Far more than the sort holds in memory, in the order copies finish.
        let mut paths: Vec<String> = (0..50_000).map(|i| format!("d{:03}/f{:05}", i % 97, i)).collect();
        paths.push("b".into());
        for path in &paths {
            writer.record(entry(path, "new"), false).unwrap();
        }
        writer.finish(Some(carried.finish().unwrap())).unwrap();
        let written = everything(dir.path());
        paths.push("x".into());
        paths.sort();
        assert_eq!(written.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), paths);
        assert!(written.iter().all(|(p, etag)| (p == "x") == (etag == "old")), "b is this run's");
    }
}
