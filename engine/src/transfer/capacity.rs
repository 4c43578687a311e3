//! Whether a pull's destination has room for what the pull still has to
//! write, and whether a failed write means it ran out of room.
//!
//! A pull measures its destination's free space once, after leftovers of
//! dead runs are gone and before its first write, and charges against it
//! every object it is about to copy: what reuse leaves to write, rounded up
//! to whole blocks, less what a partial an earlier run left already holds
//! (partials are preallocated, so resuming or restarting one writes into
//! space it has). The run must leave its reserve free besides (a size, or a
//! share of the filesystem: `--capacity-reserve`). The objects of a
//! listing page are charged before any of them is started, so
//! a dataset listed in one page (S3 and GCS list 1,000 objects a page) is
//! refused before its first byte is written; a longer listing stops as soon
//! as what it has listed no longer fits.
//!
//! A disk that fills up anyway (other writers, a filesystem that reports
//! more than it can hold) ends the run with the same reason: see
//! [`is_disk_full`]. Files are written under temporary names and renamed
//! only when complete, so that leaves nothing under a final name, and what
//! was completed is reused by the next run.
//!
//! Not for pushes: they write to the store. Not a quota check: a limit the
//! filesystem does not report (a project quota, thin provisioning) is only
//! noticed when a write fails.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use std::time::{SystemTime, UNIX_EPOCH};

use ferry_contract::{CapacityClaims, CapacityReserve, DiskSpace};

use crate::local::partial;
use crate::local::paths::RelPath;
use crate::transfer::tally::human_bytes;

/// What a filesystem has room for, as far as it says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeSpace {
    /// Bytes an unprivileged writer may still allocate.
    pub available: u64,
    /// The unit space is allocated in: a file takes whole blocks.
    pub block_size: u64,
    /// The filesystem's size, which a reserve in percent is a share of.
    pub total: u64,
    /// The device number of the filesystem (`st_dev`), which tells
    /// destinations that share one apart from those that do not.
    pub device: u64,
}

/// Measures the free space of the filesystem holding a directory; `None`
/// when the filesystem does not report its size (some FUSE and virtual
/// filesystems), so no check is possible. Tests inject their own.
pub type FreeSpaceProbe = fn(&Path) -> io::Result<Option<FreeSpace>>;

/// The free space `statvfs` reports for unprivileged writers (`f_bavail`
/// blocks of `f_frsize` bytes): the blocks kept for root are not counted,
/// even when the stager runs as root, so a node's own services keep them.
///
/// # Errors
/// The error from `statvfs`.
pub fn statvfs_free_space(path: &Path) -> io::Result<Option<FreeSpace>> {
    let stats = rustix::fs::statvfs(path)?;
    if stats.f_blocks == 0 {
        return Ok(None);
    }
    let block_size = stats.f_frsize.max(1);
    Ok(Some(FreeSpace {
        available: stats.f_bavail.saturating_mul(block_size),
        block_size,
        total: stats.f_blocks.saturating_mul(block_size),
        device: rustix::fs::stat(path)?.st_dev,
    }))
}

impl FreeSpace {
    /// The filesystem's name in reports and claims: its device number as
    /// `MAJOR:MINOR`.
    pub fn filesystem(&self) -> String {
        format!("{}:{}", rustix::fs::major(self.device), rustix::fs::minor(self.device))
    }

    /// The measurement as the stager reports it, taken now; `needed` for a
    /// refusal.
    pub fn report(&self, needed: Option<u64>, claimed: Option<u64>) -> DiskSpace {
        let measured_at = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
        DiskSpace {
            filesystem: self.filesystem(),
            size_bytes: self.total,
            free_bytes: self.available,
            needed_bytes: needed,
            claimed_bytes: claimed,
            measured_at,
        }
    }
}

/// How a pull checks its destination's free space before writing.
#[derive(Clone, Debug)]
pub struct CapacityCheck {
    /// Space to leave free beyond what the run writes.
    pub reserve: CapacityReserve,
    /// What other pulls on the node still write, by filesystem: the claim
    /// on the destination's counts as taken.
    pub claimed: CapacityClaims,
    /// How free space is measured.
    pub probe: FreeSpaceProbe,
}

impl CapacityCheck {
    /// A check with `statvfs` leaving `reserve` free (a size, or a share of
    /// the filesystem's size), nothing claimed by others.
    pub fn with_reserve(reserve: CapacityReserve) -> Self {
        Self { reserve, claimed: CapacityClaims::default(), probe: statvfs_free_space }
    }
}

/// Why a pull cannot fit, or could not, in its destination.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// What the run still has to write, with the reserve, exceeds the free space.
    #[error(
        // The remedy before the path: a worker's status keeps the first
        // 240 bytes of a failure, and a node's path can be long. The remedy
        // names no interface's spelling of the reserve: the operator words
        // its own message from the measurement (`disk`), naming the field.
        "the destination has {} free{} but this run still needs {}{} (+ {} reserve, {reserve_rule}): lower the capacity reserve, free space, or use a larger volume; destination '{}'",
        human_bytes(disk.free_bytes),
        disk.claimed_bytes.filter(|claimed| *claimed > 0).map_or_else(String::new, |claimed| format!(" of which other pulls on this node still write {}", human_bytes(claimed))),
        if *listing_finished { "" } else { "at least " },
        human_bytes(*needed),
        human_bytes(*reserve),
        destination.display()
    )]
    Insufficient {
        /// The destination directory.
        destination: PathBuf,
        /// Bytes the objects to copy take on disk (those listed so far when
        /// the listing is not finished).
        needed: u64,
        /// The reserve in bytes on this filesystem.
        reserve: u64,
        /// The reserve as the run was told it (`64MiB`, `10%`).
        reserve_rule: CapacityReserve,
        /// Whether every object had been listed: if not, more may be needed.
        listing_finished: bool,
        /// The filesystem when the run started (its free space, and of it
        /// what other pulls on the node still write there) with the need
        /// (objects and reserve), as the stager reports it.
        disk: DiskSpace,
    },
    /// A write failed because the filesystem is full (or a quota reached).
    #[error(
        "destination '{}' filled up while {what} for '{key}': {source}; free space or use a larger volume, then run again to resume",
        destination.display()
    )]
    DiskFull {
        /// The destination directory.
        destination: PathBuf,
        /// The object being staged.
        key: String,
        /// What was being done.
        what: &'static str,
        /// The error from the filesystem.
        #[source]
        source: io::Error,
    },
}

/// Whether an I/O error says the filesystem (or the writer's quota) is
/// full: ENOSPC, EDQUOT, or the `StorageFull` the staging area reports
/// when preallocation fails.
pub fn is_disk_full(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::StorageFull
        || [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT]
            .iter()
            .any(|errno| error.raw_os_error() == Some(errno.raw_os_error()))
}

/// The free space of a pull's destination and what the objects it is
/// going to copy take of it.
#[derive(Debug)]
pub struct SpaceLedger {
    destination: PathBuf,
    probe: FreeSpaceProbe,
    free: FreeSpace,
    reserve: u64,
    reserve_rule: CapacityReserve,
    /// What other pulls on the node still write to this filesystem.
    claimed: u64,
    /// Bytes on disk the objects charged so far take.
    needed: u64,
    /// Bytes the partials left by earlier runs already hold, by name.
    held_by_partials: HashMap<String, u64>,
}

impl SpaceLedger {
    /// Measures `destination`'s free space; `None` when its filesystem does
    /// not say, or cannot be asked (logged: the run goes on unchecked).
    pub fn open(check: CapacityCheck, destination: &Path) -> Option<Self> {
        let free = match (check.probe)(destination) {
            Ok(Some(free)) => free,
            Ok(None) => {
                tracing::info!(destination = %destination.display(), "the filesystem reports no size; free space is not checked");
                return None;
            }
            Err(error) => {
                tracing::warn!(destination = %destination.display(), %error, "cannot measure free space; it is not checked");
                return None;
            }
        };
        Some(Self {
            destination: destination.to_path_buf(),
            probe: check.probe,
            free,
            reserve: check.reserve.bytes_of(free.total),
            reserve_rule: check.reserve,
            claimed: check.claimed.on(&free.filesystem()),
            needed: 0,
            held_by_partials: partial::allocated(destination),
        })
    }

    /// Counts the object staged at `rel`, `size` bytes, as to be written.
    pub fn charge(&mut self, rel: &RelPath, size: u64) {
        let on_disk = size.div_ceil(self.free.block_size).saturating_mul(self.free.block_size);
        let held = self.held_by_partials.remove(&partial::name_for(rel)).unwrap_or(0);
        self.needed = self.needed.saturating_add(on_disk.saturating_sub(held));
    }

    /// Whether everything charged still fits with the reserve.
    ///
    /// # Errors
    /// [`CapacityError::Insufficient`] when it does not.
    pub fn check(&self, listing_finished: bool) -> Result<(), CapacityError> {
        if self.needed.saturating_add(self.reserve).saturating_add(self.claimed) <= self.free.available {
            return Ok(());
        }
        Err(CapacityError::Insufficient {
            destination: self.destination.clone(),
            needed: self.needed,
            reserve: self.reserve,
            reserve_rule: self.reserve_rule.clone(),
            listing_finished,
            disk: self.free.report(Some(self.needed.saturating_add(self.reserve)), Some(self.claimed)),
        })
    }

    /// The destination's filesystem as the run found it.
    pub fn found(&self) -> DiskSpace {
        self.free.report(None, None)
    }

    /// The destination's filesystem as it is now (at the end of a run);
    /// `None` when it can no longer be measured.
    pub fn measure_now(&self) -> Option<DiskSpace> {
        match (self.probe)(&self.destination) {
            Ok(free) => free.map(|free| free.report(None, None)),
            Err(error) => {
                tracing::warn!(destination = %self.destination.display(), %error, "cannot measure free space at the end of the run");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::paths::{KeyPath, key_to_path};
    use ferry_contract::layout::{PARTIAL_DIR, STATE_DIR};

    const MIB: u64 = 1 << 20;

    fn rel(path: &str) -> RelPath {
        match key_to_path(path).unwrap() {
            KeyPath::File(rel) => rel,
            KeyPath::DirectoryMarker => panic!("a file path"),
        }
    }

    fn ten_mib_free(_: &Path) -> io::Result<Option<FreeSpace>> {
        Ok(Some(FreeSpace { available: 10 * MIB, block_size: 4096, total: 80 * MIB, device: 7 << 8 | 3 }))
    }

    fn no_size(_: &Path) -> io::Result<Option<FreeSpace>> {
        Ok(None)
    }

    fn broken(_: &Path) -> io::Result<Option<FreeSpace>> {
        Err(io::Error::from_raw_os_error(rustix::io::Errno::NOSYS.raw_os_error()))
    }

    /// A ledger of a volume of 80 MiB with 10 MiB free.
    fn ledger(dir: &Path, reserve: &str) -> SpaceLedger {
        let check = CapacityCheck {
            reserve: reserve.parse().unwrap(),
            claimed: CapacityClaims::default(),
            probe: ten_mib_free,
        };
        SpaceLedger::open(check, dir).expect("a size is reported")
    }

    #[test]
    fn a_run_fits_only_while_what_it_writes_and_the_reserve_fit_in_the_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = ledger(dir.path(), "1MiB");
        ledger.charge(&rel("a"), 5 * MIB);
        ledger.charge(&rel("b"), 4 * MIB);
        ledger.check(true).expect("9 MiB and 1 MiB of reserve fit in 10 MiB");
        ledger.charge(&rel("c"), 1);
        let error = ledger.check(true).unwrap_err();
        let CapacityError::Insufficient { needed, reserve, disk, .. } = error else { panic!("{error}") };
        let available = disk.free_bytes;
        // The one byte takes a whole block.
        assert_eq!((available, needed, reserve), (10 * MIB, 9 * MIB + 4096, MIB));
        // The report the operator gets: the need with the reserve.
        assert_eq!((disk.filesystem.as_str(), disk.size_bytes, disk.free_bytes), ("7:3", 80 * MIB, 10 * MIB));
        assert_eq!(disk.needed_bytes, Some(10 * MIB + 4096));
        assert!(disk.could_ever_fit());
    }

    #[test]
    fn the_refusal_gives_the_numbers_and_says_when_more_may_be_needed() {
        let dir = tempfile::tempdir().unwrap();
        let mut ledger = ledger(dir.path(), "1MiB");
        ledger.charge(&rel("big"), 24 * MIB);
        let finished = ledger.check(true).unwrap_err().to_string();
        assert!(
            finished.contains("has 10.0 MiB free but this run still needs 24.0 MiB (+ 1.0 MiB reserve, 1MiB)"),
            "{finished}"
        );
        assert!(finished.contains(&dir.path().display().to_string()), "{finished}");
        let listing = ledger.check(false).unwrap_err().to_string();
        assert!(listing.contains("needs at least 24.0 MiB"), "{listing}");
    }

    #[test]
    fn a_reserve_in_percent_is_a_share_of_the_volume_and_the_refusal_names_where_to_lower_it() {
        let dir = tempfile::tempdir().unwrap();
        // 10% of the 80 MiB volume: 8 MiB reserved, 2 MiB left to write.
        let mut reserved = ledger(dir.path(), "10%");
        reserved.charge(&rel("a"), 2 * MIB);
        reserved.check(true).expect("2 MiB and the 8 MiB reserve fit in 10 MiB");
        reserved.charge(&rel("b"), 1);
        let refused = reserved.check(true).unwrap_err().to_string();
        assert!(refused.contains("(+ 8.0 MiB reserve, 10%)"), "{refused}");
        assert!(refused.contains("lower the capacity reserve") && !refused.contains("spec."), "{refused}");
        // Without a reserve the whole free space is usable.
        let mut unreserved = ledger(dir.path(), "0%");
        unreserved.charge(&rel("a"), 10 * MIB);
        unreserved.check(true).expect("10 MiB fit in 10 MiB with no reserve");
    }

    #[test]
    fn what_other_pulls_on_the_node_still_write_to_this_filesystem_counts_as_taken() {
        let dir = tempfile::tempdir().unwrap();
        let mut claimed = CapacityClaims::default();
        claimed.add("7:3", 6 * MIB);
        // Another filesystem's claim is not this one's.
        claimed.add("7:4", 100 * MIB);
        let check = CapacityCheck { reserve: "1MiB".parse().unwrap(), claimed, probe: ten_mib_free };
        let mut ledger = SpaceLedger::open(check, dir.path()).unwrap();
        ledger.charge(&rel("a"), 3 * MIB);
        ledger.check(true).expect("3 MiB, the reserve and the 6 MiB claimed fit in 10 MiB");
        ledger.charge(&rel("b"), 1);
        let error = ledger.check(true).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("the destination has 10.0 MiB free of which other pulls on this node still write 6.0 MiB but this run still needs 3.0 MiB"),
            "{message}"
        );
        // The need it reports is its own: the others' claim passes.
        let CapacityError::Insufficient { disk, .. } = error else { panic!() };
        assert_eq!((disk.needed_bytes, disk.claimed_bytes), (Some(4 * MIB + 4096), Some(6 * MIB)));
    }

    #[test]
    fn empty_files_take_no_blocks_and_small_ones_a_whole_block() {
        let dir = tempfile::tempdir().unwrap();
        // 10 MiB is 2,560 blocks: exactly that many 1-byte files fit.
        let mut ledger = ledger(dir.path(), "0");
        for i in 0..2560 {
            ledger.charge(&rel(&format!("f{i}")), 1);
            ledger.charge(&rel(&format!("empty{i}")), 0);
        }
        ledger.check(true).expect("2,560 blocks fit");
        ledger.charge(&rel("one-more"), 1);
        assert!(ledger.check(true).is_err());
    }

    #[test]
    fn space_a_partial_already_holds_is_not_counted_again() {
        let dir = tempfile::tempdir().unwrap();
        let partials = dir.path().join(STATE_DIR).join(PARTIAL_DIR);
        std::fs::create_dir_all(&partials).unwrap();
        // An earlier run's partial of "ckpt.bin", 8 MiB allocated on disk.
        let part = partials.join(format!("{}.part", partial::name_for(&rel("ckpt.bin"))));
        std::fs::write(part, vec![1u8; 8 * MIB as usize]).unwrap();
        let mut ledger = ledger(dir.path(), "1MiB");
        ledger.charge(&rel("ckpt.bin"), 9 * MIB);
        ledger.check(true).expect("only the missing MiB and the reserve are needed");
        // Another object's partial is not this one's.
        ledger.charge(&rel("other.bin"), 9 * MIB);
        assert!(ledger.check(true).is_err());
    }

    #[test]
    fn a_filesystem_that_reports_no_size_or_cannot_be_asked_is_not_checked() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            SpaceLedger::open(
                CapacityCheck { probe: no_size, ..CapacityCheck::with_reserve(CapacityReserve::Size(None)) },
                dir.path()
            )
            .is_none()
        );
        assert!(
            SpaceLedger::open(
                CapacityCheck { probe: broken, ..CapacityCheck::with_reserve(CapacityReserve::Size(None)) },
                dir.path()
            )
            .is_none()
        );
    }

    #[test]
    fn statvfs_reports_the_free_space_of_a_real_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let free = statvfs_free_space(dir.path()).unwrap().expect("a temporary directory's filesystem has a size");
        assert!(free.block_size >= 512, "{free:?}");
        assert!(free.available > 0, "{free:?}");
        assert!(free.total >= free.available && free.total % free.block_size == 0, "{free:?}");
    }

    #[test]
    fn enospc_edquot_and_a_failed_preallocation_mean_a_full_disk_and_nothing_else_does() {
        let full = [
            io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()),
            io::Error::from_raw_os_error(rustix::io::Errno::DQUOT.raw_os_error()),
            io::Error::from(io::ErrorKind::StorageFull),
        ];
        for error in &full {
            assert!(is_disk_full(error), "{error}");
        }
        let other = [
            io::Error::from_raw_os_error(rustix::io::Errno::IO.raw_os_error()),
            io::Error::from_raw_os_error(rustix::io::Errno::ROFS.raw_os_error()),
            io::Error::from(io::ErrorKind::PermissionDenied),
            io::Error::other("no space left on device"),
        ];
        for error in &other {
            assert!(!is_disk_full(error), "{error}");
        }
    }

    #[test]
    fn a_real_filesystem_reports_its_device_so_destinations_on_it_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let measured = |path: &Path| statvfs_free_space(path).unwrap().expect("a real filesystem reports its size");
        let (on_a, on_b) = (measured(&a).report(None, None), measured(&b).report(None, None));
        assert_eq!(on_a.filesystem, on_b.filesystem, "one filesystem, one name");
        let dev = rustix::fs::stat(&a).unwrap().st_dev;
        assert_eq!(on_a.filesystem, format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev)));
        assert!(on_a.size_bytes >= on_a.free_bytes && on_a.measured_at > 1_700_000_000, "{on_a:?}");
        let check = CapacityCheck::with_reserve("0".parse().unwrap());
        let at_the_end = SpaceLedger::open(check, &a).unwrap().measure_now().unwrap();
        assert_eq!((at_the_end.filesystem, at_the_end.needed_bytes), (on_a.filesystem, None));
    }
}
