//! How a run fails: [`TransferError`] ends the run; [`Retryable`] says
//! which errors are worth another attempt, and [`dooms_the_run`] which of a
//! store's stop every object, not just one.

use std::path::PathBuf;

use ferry_contract::Reason;

use super::capacity::{CapacityError, is_disk_full};
use super::tally;
use crate::local::staging::StagingError;
use crate::store::StoreError;

/// A run-level failure: nothing more can be done.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The configuration cannot work (e.g. memory limit below one part).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Listing the source failed.
    #[error("cannot list {uri}: {source}")]
    List {
        /// What was being listed.
        uri: String,
        /// Why it failed.
        #[source]
        source: StoreError,
    },
    /// The store refused the whole run (bucket missing, credentials wrong,
    /// endpoint unreachable).
    #[error("cannot reach {uri}: {source}")]
    Store {
        /// The bucket.
        uri: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The destination cannot be prepared.
    #[error(transparent)]
    Staging(#[from] crate::local::staging::StagingError),
    /// The local source of a push is unusable.
    #[error("cannot read '{path}': {source}")]
    Source {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A push that must push something found no file to select.
    #[error(
        "'{path}' holds no file to push (a directory the node created because it did not exist looks like this: check the path)"
    )]
    SourceEmpty {
        /// The source directory.
        path: PathBuf,
    },
    /// The manifest cannot be written.
    #[error("cannot write the manifest: {0}")]
    Manifest(#[source] std::io::Error),
    /// The destination has no room for the run, or ran out of it.
    #[error(transparent)]
    Capacity(#[from] CapacityError),
    /// The dataset holds more than its quota allows.
    #[error(
        "the dataset holds {}{} (all shards together), more than its quota of {} (--dataset-quota; a DataStage's comes from its namespace's StagingQuotas): raise the quota, free it, or stage less (include, exclude)",
        if *listing_finished { "" } else { "at least " },
        tally::human_bytes(*dataset_bytes),
        tally::human_bytes(*quota)
    )]
    Quota {
        /// Bytes of the dataset listed so far.
        dataset_bytes: u64,
        /// The quota.
        quota: u64,
        /// Whether every object had been listed: if not, the dataset is larger.
        listing_finished: bool,
    },
}

impl TransferError {
    /// A CamelCase name of why the run could not proceed, for status
    /// conditions (e.g. `BucketNotFound`, `AccessDenied`, `EndpointUnreachable`).
    pub fn reason(&self) -> Reason {
        match self {
            TransferError::Config(_) => Reason::InvalidConfiguration,
            TransferError::List { source, .. } | TransferError::Store { source, .. } => source.reason(),
            TransferError::Capacity(_) => Reason::InsufficientCapacity,
            TransferError::Quota { .. } => Reason::QuotaExceeded,
            // Creating the state directory or writing the manifest fails
            // the same way on a full disk.
            TransferError::Staging(StagingError::Prepare { source, .. }) | TransferError::Manifest(source)
                if is_disk_full(source) =>
            {
                Reason::InsufficientCapacity
            }
            TransferError::Staging(_) | TransferError::Manifest(_) => Reason::DestinationUnusable,
            TransferError::Source { .. } => Reason::SourceUnreadable,
            TransferError::SourceEmpty { .. } => Reason::SourceEmpty,
        }
    }

    /// What a pull refused for room found of its destination's filesystem,
    /// and needed of it.
    pub fn disk(&self) -> Option<&ferry_contract::DiskSpace> {
        match self {
            TransferError::Capacity(CapacityError::Insufficient { disk, .. }) => Some(disk),
            _ => None,
        }
    }

    /// Whether another attempt without a change cannot succeed.
    pub fn is_permanent(&self) -> bool {
        match self {
            // A quota changes only with a new run (the operator's, or the
            // user's command line).
            TransferError::Config(_) | TransferError::SourceEmpty { .. } | TransferError::Quota { .. } => true,
            TransferError::List { source, .. } | TransferError::Store { source, .. } => source.is_permanent(),
            // A need larger than the whole filesystem never fits. Any other
            // refusal may fit once space is freed, which needs no change to
            // the run: a Job retries it a few times, then the operator
            // waits for room from the need the summary reports.
            TransferError::Capacity(CapacityError::Insufficient { disk, .. }) => !disk.could_ever_fit(),
            // A disk that filled up under the run (other writers) may have
            // room again a moment later, and the next attempt resumes.
            TransferError::Staging(_)
            | TransferError::Manifest(_)
            | TransferError::Source { .. }
            | TransferError::Capacity(CapacityError::DiskFull { .. }) => false,
        }
    }
}

/// Errors that may be worth another attempt.
pub trait Retryable {
    /// The retry category, or `None` when retrying cannot help.
    fn retry_reason(&self) -> Option<crate::store::RetryReason>;
}

impl Retryable for StoreError {
    fn retry_reason(&self) -> Option<crate::store::RetryReason> {
        StoreError::retry_reason(self)
    }
}

/// Whether a store error dooms every object of the run, not just one.
pub fn dooms_the_run(error: &StoreError) -> bool {
    match error {
        StoreError::NoSuchBucket { .. } | StoreError::NoCredentials(_) => true,
        StoreError::AccessDenied { code, .. } => {
            matches!(code.as_str(), "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "ExpiredToken" | "InvalidToken")
        }
        StoreError::Transient { reason, .. } => *reason == crate::store::RetryReason::Connection,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_disk_is_insufficient_capacity_wherever_it_is_met_and_other_disk_errors_are_not() {
        let full = || std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        let denied = || std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let prepare = |source| TransferError::Staging(StagingError::Prepare { path: "/d/.ferry".into(), source });
        let filled_up = TransferError::Capacity(CapacityError::DiskFull {
            destination: "/d".into(),
            key: "k".into(),
            what: "writing to disk",
            source: full(),
        });
        for error in [filled_up, TransferError::Manifest(full()), prepare(full())] {
            assert_eq!(error.reason(), Reason::InsufficientCapacity, "{error}");
            assert!(!error.is_permanent(), "{error}");
        }
        for error in [TransferError::Manifest(denied()), prepare(denied())] {
            assert_eq!(error.reason(), Reason::DestinationUnusable, "{error}");
        }
    }

    #[test]
    fn a_refusal_for_room_is_final_only_when_the_need_is_larger_than_the_filesystem() {
        let refused = |needed: u64| {
            TransferError::Capacity(CapacityError::Insufficient {
                destination: "/d".into(),
                needed: needed - 2,
                reserve: 2,
                reserve_rule: "2".parse().unwrap(),
                listing_finished: true,
                disk: ferry_contract::DiskSpace {
                    filesystem: "0:52".into(),
                    size_bytes: 100,
                    free_bytes: 10,
                    needed_bytes: Some(needed),
                    claimed_bytes: None,
                    measured_at: 1,
                },
            })
        };
        for (needed, never_fits) in [(11, false), (100, false), (101, true)] {
            let error = refused(needed);
            assert_eq!(error.reason(), Reason::InsufficientCapacity);
            assert_eq!(error.is_permanent(), never_fits, "{needed} of 100: {error}");
            assert_eq!(error.disk().and_then(|d| d.needed_bytes), Some(needed));
        }
    }
}
