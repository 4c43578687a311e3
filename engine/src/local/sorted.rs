//! Records kept on disk in key order, so that state which grows with the
//! object count (a manifest of ten million files) is read and written in
//! bounded memory.
//!
//! Three parts, all over JSON lines:
//! - [`SortedWriter`] takes records in any order and writes them out sorted
//!   by key, holding at most a fixed number of bytes. It uses replacement
//!   selection: a heap of the records held, of which the smallest that is
//!   not below the last one written goes out when the heap is full. Input
//!   whose disorder fits in the heap (a pull's records arrive in listing
//!   order, give or take the objects in flight) comes out as a single run;
//!   anything else as several sorted runs, merged when read.
//! - [`RunWriter`] writes records that already come in key order.
//! - [`Merged`] reads several sorted streams as one, and resolves equal keys
//!   by precedence: the stream given later wins, and within a stream the
//!   record written later. That is the rule a manifest has always had
//!   (later files and later lines win).
//!
//! Spilled runs live in a scratch directory of the caller's (a run's own
//! temporary directory), so a killed process leaves nothing that the next
//! run's sweep does not remove.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufRead as _, BufReader, BufWriter, Write as _};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bytes of records a [`SortedWriter`] holds before it writes some out.
pub const SORT_MEMORY: usize = 4 << 20;

/// Read buffer per stream being merged.
const READ_BUFFER: usize = 64 << 10;

/// Runs merged at once; more are merged in passes, so the readers' buffers
/// stay bounded however disordered the input was.
const MERGE_FAN_IN: usize = 32;

/// The last key of a sequence that must not go down: a sorted file being
/// written or read, or a cursor being moved.
#[derive(Debug, Default)]
pub struct Ascending(Option<String>);

impl Ascending {
    /// Moves on to `key`. Returns false, and stays where it was, when `key`
    /// sorts below the last key.
    pub fn advance(&mut self, key: &str) -> bool {
        match &mut self.0 {
            Some(last) if key < last.as_str() => false,
            Some(last) => {
                // The allocation is reused: this runs once per record.
                last.clear();
                last.push_str(key);
                true
            }
            None => {
                self.0 = Some(key.to_owned());
                true
            }
        }
    }

    /// The last key, if any.
    pub fn last(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

/// A record with a sort key.
pub trait Keyed: Serialize + DeserializeOwned + Send + 'static {
    /// The key records are sorted and matched by.
    fn sort_key(&self) -> &str;
    /// About how many bytes the record takes in memory.
    fn resident_bytes(&self) -> usize;
}

/// One record and where it came from, ordered by (run, key, arrival).
struct Held<T> {
    run: u32,
    arrival: u64,
    record: T,
}

impl<T: Keyed> Held<T> {
    fn rank(&self) -> (u32, &str, u64) {
        (self.run, self.record.sort_key(), self.arrival)
    }
}

impl<T: Keyed> PartialEq for Held<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl<T: Keyed> Eq for Held<T> {}
impl<T: Keyed> PartialOrd for Held<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T: Keyed> Ord for Held<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank().cmp(&other.rank())
    }
}

/// Sorts records by key in bounded memory; see the module header.
pub struct SortedWriter<T: Keyed> {
    dir: PathBuf,
    name: String,
    memory: usize,
    held: BinaryHeap<Reverse<Held<T>>>,
    held_bytes: usize,
    arrivals: u64,
    /// The run being written, its number and the last key written to it.
    current: Option<(u32, RunWriter<T>)>,
    /// The next run number for a record below the last key written.
    next_run: u32,
    runs: Vec<SortedRun<T>>,
}

impl<T: Keyed> std::fmt::Debug for SortedWriter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SortedWriter")
            .field("dir", &self.dir)
            .field("held", &self.held.len())
            .field("runs", &self.runs.len())
            .finish()
    }
}

impl<T: Keyed> SortedWriter<T> {
    /// A writer that spills runs named after `name` into `dir` (created
    /// when the first run is written) and holds about `memory` bytes.
    pub fn new(dir: &Path, name: &str, memory: usize) -> Self {
        Self {
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            memory,
            held: BinaryHeap::new(),
            held_bytes: 0,
            arrivals: 0,
            current: None,
            next_run: 0,
            runs: Vec::new(),
        }
    }

    /// Records held in memory now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Adds a record. A later record with the same key replaces an earlier
    /// one.
    ///
    /// # Errors
    /// Fails when a run cannot be written. The record is kept all the same
    /// (in memory, over the limit), and the next call tries again: a disk
    /// that was full for a moment loses nothing.
    pub fn push(&mut self, record: T) -> io::Result<()> {
        let below_written =
            self.current.as_ref().and_then(|(_, run)| run.order.last()).is_some_and(|last| record.sort_key() < last);
        let run = match &self.current {
            Some((number, _)) if below_written => number + 1,
            Some((number, _)) => *number,
            None => self.next_run,
        };
        self.held_bytes += record.resident_bytes();
        self.arrivals += 1;
        self.held.push(Reverse(Held { run, arrival: self.arrivals, record }));
        while self.held_bytes > self.memory {
            self.write_smallest()?;
        }
        Ok(())
    }

    /// Writes the smallest record held to its run, starting that run (and
    /// closing the one before) when it is a new one.
    fn write_smallest(&mut self) -> io::Result<()> {
        let Some(Reverse(smallest)) = self.held.peek() else { return Ok(()) };
        let run = smallest.run;
        if self.current.as_ref().is_none_or(|(number, _)| *number != run) {
            if let Some((_, finished)) = self.current.take() {
                self.runs.push(finished.finish()?);
            }
            std::fs::create_dir_all(&self.dir)?;
            let path = self.dir.join(format!("{}.{run}.run", self.name));
            self.current = Some((run, RunWriter::create(&path)?));
            self.next_run = run + 1;
        }
        let (_, writer) = self.current.as_mut().expect("a run was just opened");
        writer.write(&smallest.record)?;
        let Reverse(written) = self.held.pop().expect("peeked above");
        self.held_bytes -= written.record.resident_bytes();
        Ok(())
    }

    /// Writes out everything held and returns the sorted runs, oldest
    /// first.
    ///
    /// # Errors
    /// Fails when a run cannot be written.
    pub fn into_runs(mut self) -> io::Result<Vec<SortedRun<T>>> {
        while !self.held.is_empty() {
            self.write_smallest()?;
        }
        if let Some((_, last)) = self.current.take() {
            self.runs.push(last.finish()?);
        }
        Ok(self.runs)
    }

    /// Like [`Self::into_runs`], with the runs merged down to few enough
    /// to be read at once, oldest first.
    ///
    /// # Errors
    /// Fails when a run cannot be written or read back.
    pub fn into_few_runs(self) -> io::Result<Vec<SortedRun<T>>> {
        let (dir, name) = (self.dir.clone(), self.name.clone());
        merge_down(&dir, &name, self.into_runs()?)
    }

    /// Everything pushed, sorted by key, one record per key.
    ///
    /// # Errors
    /// Fails when a run cannot be written or read back.
    pub fn into_sorted(self) -> io::Result<Merged<T>> {
        Merged::of_runs(&self.into_few_runs()?)
    }
}

/// Merges runs in passes of [`MERGE_FAN_IN`] until that many are left. Runs
/// merged are adjacent, so later runs keep their precedence.
fn merge_down<T: Keyed>(dir: &Path, name: &str, mut runs: Vec<SortedRun<T>>) -> io::Result<Vec<SortedRun<T>>> {
    let mut pass = 0;
    while runs.len() > MERGE_FAN_IN {
        pass += 1;
        let mut merged = Vec::new();
        for (group, chunk) in runs.chunks(MERGE_FAN_IN).enumerate() {
            let streams = chunk.iter().map(SortedRun::stream).collect::<io::Result<Vec<_>>>()?;
            let mut out = RunWriter::create(&dir.join(format!("{name}.pass{pass}.{group}.run")))?;
            for record in Merged::new(streams)? {
                out.write(&record?)?;
            }
            merged.push(out.finish()?);
        }
        for run in runs {
            run.remove();
        }
        runs = merged;
    }
    Ok(runs)
}

/// A file of records in key order.
#[derive(Debug)]
pub struct SortedRun<T> {
    path: PathBuf,
    _records: PhantomData<fn() -> T>,
}

impl<T: Keyed> SortedRun<T> {
    /// Its records, in order.
    ///
    /// # Errors
    /// Fails when the file cannot be opened.
    pub fn stream(&self) -> io::Result<JsonLines<T>> {
        JsonLines::open(&self.path, false)
    }

    /// Where the run is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes the file.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes records that come in key order to a file of JSON lines.
#[derive(Debug)]
pub struct RunWriter<T> {
    path: PathBuf,
    out: BufWriter<File>,
    order: Ascending,
    _records: PhantomData<fn(T)>,
}

impl<T: Keyed> RunWriter<T> {
    /// Creates (or truncates) `path`.
    ///
    /// # Errors
    /// Fails when the file cannot be created.
    pub fn create(path: &Path) -> io::Result<Self> {
        Self::with_first_line(path, None)
    }

    /// Creates (or truncates) `path` and writes `first_line` (a header) to it.
    ///
    /// # Errors
    /// Fails when the file cannot be created or written.
    pub fn with_first_line(path: &Path, first_line: Option<&[u8]>) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(READ_BUFFER, File::create(path)?);
        if let Some(line) = first_line {
            out.write_all(line)?;
            out.write_all(b"\n")?;
        }
        Ok(Self { path: path.to_path_buf(), out, order: Ascending::default(), _records: PhantomData })
    }

    /// Appends `record`, which must not sort below the last one.
    ///
    /// # Errors
    /// Fails when the file cannot be written, or when `record` is out of
    /// order (a bug in the caller; the file would not be sorted).
    pub fn write(&mut self, record: &T) -> io::Result<()> {
        let key = record.sort_key();
        if !self.order.advance(key) {
            return Err(io::Error::other(format!(
                "record '{key}' written out of key order to {}",
                self.path.display()
            )));
        }
        serde_json::to_writer(&mut self.out, record).map_err(io::Error::other)?;
        self.out.write_all(b"\n")
    }

    /// Flushes the file to the OS and returns it as a run.
    ///
    /// # Errors
    /// Fails when the flush fails.
    pub fn finish(self) -> io::Result<SortedRun<T>> {
        self.out.into_inner().map_err(io::IntoInnerError::into_error)?;
        Ok(SortedRun { path: self.path, _records: PhantomData })
    }

    /// Flushes and syncs the file to disk, for a file that replaces another
    /// by rename.
    ///
    /// # Errors
    /// Fails when the flush or the sync fails.
    pub fn finish_durably(self) -> io::Result<PathBuf> {
        let file = self.out.into_inner().map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        Ok(self.path)
    }
}

/// Records read from a file of JSON lines. Lines that do not parse as a
/// record (a header, a line torn by a killed writer) are skipped. With
/// `in_order`, so are records below the one before them: a file that says
/// it is sorted is believed only as far as it is.
#[derive(Debug)]
pub struct JsonLines<T> {
    lines: io::Lines<BufReader<File>>,
    /// `None` when the order is not checked.
    order: Option<Ascending>,
    skipped_out_of_order: u64,
    _records: PhantomData<fn() -> T>,
}

impl<T: Keyed> JsonLines<T> {
    /// Opens `path`; `check_order` as described above.
    ///
    /// # Errors
    /// Fails when the file cannot be opened.
    pub fn open(path: &Path, check_order: bool) -> io::Result<Self> {
        let lines = BufReader::with_capacity(READ_BUFFER, File::open(path)?).lines();
        let order = check_order.then(Ascending::default);
        Ok(Self { lines, order, skipped_out_of_order: 0, _records: PhantomData })
    }

    /// Records skipped because they were out of order.
    pub fn skipped_out_of_order(&self) -> u64 {
        self.skipped_out_of_order
    }
}

impl<T: Keyed> Iterator for JsonLines<T> {
    type Item = io::Result<T>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let line = match self.lines.next()? {
                Ok(line) => line,
                // Bytes that are not UTF-8 are a torn or damaged line.
                Err(error) if error.kind() == io::ErrorKind::InvalidData => continue,
                Err(error) => return Some(Err(error)),
            };
            let Ok(record) = serde_json::from_str::<T>(&line) else { continue };
            if self.order.as_mut().is_some_and(|order| !order.advance(record.sort_key())) {
                self.skipped_out_of_order += 1;
                continue;
            }
            return Some(Ok(record));
        }
    }
}

/// A sorted stream of records.
pub type Stream<T> = Box<dyn Iterator<Item = io::Result<T>> + Send>;

/// The head record of one stream, ordered by (key, stream).
struct Head<T> {
    stream: usize,
    record: T,
}

impl<T: Keyed> Head<T> {
    fn rank(&self) -> (&str, usize) {
        (self.record.sort_key(), self.stream)
    }
}

impl<T: Keyed> PartialEq for Head<T> {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl<T: Keyed> Eq for Head<T> {}
impl<T: Keyed> PartialOrd for Head<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<T: Keyed> Ord for Head<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank().cmp(&other.rank())
    }
}

/// Several sorted streams read as one sorted stream with one record per key:
/// of records with equal keys, the one from the stream given last wins, and
/// within a stream the one read last.
pub struct Merged<T: Keyed> {
    streams: Vec<Stream<T>>,
    heads: BinaryHeap<Reverse<Head<T>>>,
}

impl<T: Keyed> std::fmt::Debug for Merged<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Merged").field("streams", &self.streams.len()).finish()
    }
}

impl<T: Keyed> Merged<T> {
    /// Merges the records of `runs`, read from their files, oldest (lowest
    /// precedence) first.
    ///
    /// # Errors
    /// Fails when a run cannot be opened or its first record read.
    pub fn of_runs(runs: &[SortedRun<T>]) -> io::Result<Self> {
        Self::new(runs.iter().map(SortedRun::stream).collect::<io::Result<Vec<_>>>()?)
    }

    /// Merges `streams`, lowest precedence first.
    ///
    /// # Errors
    /// Fails when a stream fails on its first record.
    pub fn new<S>(streams: Vec<S>) -> io::Result<Self>
    where
        S: Iterator<Item = io::Result<T>> + Send + 'static,
    {
        let streams: Vec<Stream<T>> = streams.into_iter().map(|s| Box::new(s) as Stream<T>).collect();
        let mut merged = Self { heads: BinaryHeap::with_capacity(streams.len()), streams };
        for stream in 0..merged.streams.len() {
            merged.advance(stream)?;
        }
        Ok(merged)
    }

    /// Reads the next record of `stream` into the heads.
    fn advance(&mut self, stream: usize) -> io::Result<()> {
        if let Some(record) = self.streams[stream].next().transpose()? {
            self.heads.push(Reverse(Head { stream, record }));
        }
        Ok(())
    }

    /// The key of the next record, without taking it.
    pub fn peek_key(&self) -> Option<&str> {
        self.heads.peek().map(|Reverse(head)| head.record.sort_key())
    }

    /// Moves on to `key`: every record below it is handed to `passed`, and
    /// the record at `key`, if any, is returned. A record that cannot be
    /// read is skipped.
    ///
    /// # Errors
    /// Whatever `passed` returns.
    pub fn seek<E>(&mut self, key: &str, mut passed: impl FnMut(T) -> Result<(), E>) -> Result<Option<T>, E> {
        while self.peek_key().is_some_and(|next| next < key) {
            if let Some(Ok(record)) = self.next() {
                passed(record)?;
            }
        }
        Ok(if self.peek_key() == Some(key) { self.next().and_then(Result::ok) } else { None })
    }
}

impl<T: Keyed> Iterator for Merged<T> {
    type Item = io::Result<T>;

    fn next(&mut self) -> Option<Self::Item> {
        let Reverse(first) = self.heads.pop()?;
        let mut winner = first;
        if let Err(error) = self.advance(winner.stream) {
            return Some(Err(error));
        }
        while self.heads.peek().is_some_and(|Reverse(next)| next.record.sort_key() == winner.record.sort_key()) {
            let Reverse(next) = self.heads.pop().expect("peeked");
            let stream = next.stream;
            // Heads of equal keys come out by stream, and a stream's own
            // records in the order it had them: the last one seen wins.
            winner = next;
            if let Err(error) = self.advance(stream) {
                return Some(Err(error));
            }
        }
        Some(Ok(winner.record))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde::Deserialize;

    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct Rec {
        k: String,
        v: u32,
    }

    impl Keyed for Rec {
        fn sort_key(&self) -> &str {
            &self.k
        }
        fn resident_bytes(&self) -> usize {
            48 + self.k.len()
        }
    }

    fn rec(k: &str, v: u32) -> Rec {
        Rec { k: k.to_owned(), v }
    }

    fn sorted(dir: &Path, memory: usize, records: &[Rec]) -> (Vec<Rec>, usize) {
        let mut writer = SortedWriter::new(dir, "t", memory);
        let mut most_held = 0;
        for record in records {
            writer.push(record.clone()).unwrap();
            most_held = most_held.max(writer.held());
        }
        let out = writer.into_sorted().unwrap().collect::<io::Result<Vec<_>>>().unwrap();
        (out, most_held)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any input, duplicates included, comes out as a `BTreeMap` with
        /// last-wins inserts would give it, holding no more than allowed.
        #[test]
        fn any_order_sorts_like_a_map_where_the_last_write_wins(
            keys in proptest::collection::vec("[a-c./é-]{0,3}", 0..400),
            memory in 100usize..2000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let records: Vec<Rec> = keys.iter().enumerate().map(|(i, k)| rec(k, i as u32)).collect();
            let model: BTreeMap<String, Rec> = records.iter().map(|r| (r.k.clone(), r.clone())).collect();
            let (out, most_held) = sorted(dir.path(), memory, &records);
            prop_assert_eq!(out, model.into_values().collect::<Vec<_>>());
            prop_assert!(most_held <= memory / 48 + 1, "held {most_held} records with room for {}", memory / 48);
        }
    }

    #[test]
    fn nearly_sorted_input_is_one_run() {
        let dir = tempfile::tempdir().unwrap();
        // Sorted but for neighbours up to 8 places apart, with room for 32.
        let mut records: Vec<Rec> = (0..10_000).map(|i| rec(&format!("k{i:06}"), i)).collect();
        for chunk in records.chunks_mut(8) {
            chunk.reverse();
        }
        let mut writer = SortedWriter::new(dir.path(), "t", 32 * 58);
        for record in records {
            writer.push(record).unwrap();
        }
        assert_eq!(writer.into_runs().unwrap().len(), 1);
    }

    #[test]
    fn many_runs_are_merged_in_passes() {
        let dir = tempfile::tempdir().unwrap();
        // Descending input makes a run per heap-full: 3,000 records, 30 held.
        let records: Vec<Rec> = (0..3000).rev().map(|i| rec(&format!("k{i:05}"), i)).collect();
        let (out, _) = sorted(dir.path(), 30 * 54, &records);
        assert_eq!(out.len(), 3000);
        assert!(out.windows(2).all(|w| w[0].k < w[1].k));
        assert!(std::fs::read_dir(dir.path()).unwrap().count() <= MERGE_FAN_IN, "earlier passes' runs are removed");
    }

    #[test]
    fn later_streams_win_and_unordered_or_torn_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let older = dir.path().join("older");
        std::fs::write(
            &older,
            "{\"k\":\"a\",\"v\":1}\n{\"k\":\"b\",\"v\":1}\n{\"k\":\"a0\",\"v\":1}\n{\"k\":\"c\",\"v\":1}\n",
        )
        .unwrap();
        let newer = dir.path().join("newer");
        std::fs::write(&newer, "{\"header\":2}\n{\"k\":\"b\",\"v\":2}\n{\"k\":\"b\",\"v\":3}\n{\"k\":\"d\",\"v\"")
            .unwrap();
        let mut older_lines = JsonLines::<Rec>::open(&older, true).unwrap();
        let records: Vec<Rec> = (&mut older_lines).map(Result::unwrap).collect();
        assert_eq!(older_lines.skipped_out_of_order(), 1, "a0 comes after b");
        let merged = Merged::new(vec![records.into_iter().map(Ok), vec![rec("b", 3)].into_iter().map(Ok)]).unwrap();
        let out: Vec<Rec> = merged.map(Result::unwrap).collect();
        assert_eq!(out, [rec("a", 1), rec("b", 3), rec("c", 1)]);
        let newer: Vec<Rec> = JsonLines::open(&newer, true).unwrap().map(Result::unwrap).collect();
        assert_eq!(newer, [rec("b", 2), rec("b", 3)], "the header and the torn tail are skipped");
    }

    #[test]
    fn a_run_writer_refuses_records_out_of_order() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = RunWriter::create(&dir.path().join("r")).unwrap();
        writer.write(&rec("b", 0)).unwrap();
        writer.write(&rec("b", 1)).unwrap();
        assert!(writer.write(&rec("a", 2)).is_err());
    }
}
