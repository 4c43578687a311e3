//! From [`TransferOptions`] (what the `ferry-stager` flags and the Python
//! package's keyword arguments both parse into) to a configured run: the
//! engine's [`TransferConfig`] (the store a location names is
//! `ferry_store::connect`'s). One
//! translation for every front end, so an option cannot mean one thing on
//! the command line and another in Python.

use ferry_contract::TransferOptions;
use ferry_contract::options::{COMPLETION_INDEX_ENV, Concurrency, Shard};

use crate::selection::Selection;
use crate::transfer::capacity::CapacityCheck;
use crate::transfer::{RetryPolicy, SharedObjectsDir, TransferConfig, TransferError};

/// The smallest part S3 accepts in a multipart upload (but the last).
pub const MIN_PUSH_PART_SIZE: u64 = 5 << 20;

/// The shard this process copies: `shard`, or with `shards: N` the index an
/// Indexed Job gives its pod in `$JOB_COMPLETION_INDEX`.
///
/// # Errors
/// `shards` without a usable completion index.
pub fn shard(options: &TransferOptions) -> Result<Option<Shard>, TransferError> {
    let Some(count) = options.shards else { return Ok(options.shard) };
    let index = std::env::var(COMPLETION_INDEX_ENV).unwrap_or_default();
    format!("{index}/{count}").parse().map(Some).map_err(|_| {
        TransferError::Config(format!(
            "--shards {count} takes this pod's shard from ${COMPLETION_INDEX_ENV} (set by an Indexed Job), which is '{index}'; run it in an Indexed Job or use --shard INDEX/{count}"
        ))
    })
}

/// Part size for uploads, and the smallest range size for downloads,
/// unless told otherwise.
pub const DEFAULT_PART_SIZE: u64 = 8 << 20;

/// The part size of a run: the one asked for, else [`DEFAULT_PART_SIZE`].
pub fn part_size(options: &TransferOptions) -> u64 {
    options.part_size.as_ref().map_or(DEFAULT_PART_SIZE, |s| s.bytes())
}

/// What a push cannot be told.
///
/// # Errors
/// A usage error, in words that name the option.
pub fn check_push(options: &TransferOptions) -> Result<(), TransferError> {
    if options.delete_removed {
        return Err(TransferError::Config("--delete-removed applies to pulls only".to_owned()));
    }
    if part_size(options) < MIN_PUSH_PART_SIZE {
        return Err(TransferError::Config(
            "--part-size must be at least 5MiB, the smallest part S3 accepts".to_owned(),
        ));
    }
    Ok(())
}

/// Whether a push may write to `destination`: an OCI artifact is read only.
///
/// # Errors
/// A destination of a store Ferry does not write, as a usage error.
pub fn check_push_destination(destination: &ferry_contract::ObjectLocation) -> Result<(), TransferError> {
    if destination.scheme.writable() {
        return Ok(());
    }
    Err(TransferError::Config(format!(
        "{destination} cannot be pushed to: Ferry reads {}:// stores and does not write them",
        destination.scheme
    )))
}

impl TransferConfig {
    /// The engine's configuration for these options.
    ///
    /// # Errors
    /// Include or exclude globs that do not parse, or an unusable shard.
    pub fn from_options(options: &TransferOptions) -> Result<Self, TransferError> {
        let selection = Selection::new(&options.include, &options.exclude, shard(options)?)
            .map_err(|e| TransferError::Config(e.to_string()))?;
        let part_size = part_size(options);
        Ok(TransferConfig {
            concurrency: options.concurrency.ceiling() as usize,
            adaptive: options.concurrency == Concurrency::Adaptive,
            part_size,
            // A part size the user chose is taken as the range size too.
            grow_ranges: options.part_size.is_none(),
            multipart_threshold: options.multipart_threshold.as_ref().map_or(part_size, |s| s.bytes()),
            write_buffer: options.write_buffer.bytes(),
            memory_limit: options.memory_limit.bytes(),
            verify: options.verify,
            retry: RetryPolicy { max_attempts: options.max_attempts, ..RetryPolicy::default() },
            stall_timeout: options.stall_timeout,
            max_bandwidth: options.max_bandwidth.as_ref().map(|s| s.bytes()),
            max_request_rate: options.max_request_rate.map(u64::from),
            store_share: options.store_share,
            selection,
            capacity: (!options.no_capacity_check).then(|| CapacityCheck {
                claimed: options.capacity_claimed.clone().unwrap_or_default(),
                ..CapacityCheck::with_reserve(options.capacity_reserve.clone())
            }),
            dataset_quota: options.dataset_quota.as_ref().map(ferry_contract::ByteSize::bytes),
            shared_objects: options
                .shared_objects
                .clone()
                .map(|dir| SharedObjectsDir { dir, endpoint: options.endpoint_url.clone() }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_come_from_the_option_or_the_completion_index() {
        let one_of_three = Some(Shard { index: 1, count: 3 });
        let options = TransferOptions { shard: one_of_three, ..TransferOptions::default() };
        assert_eq!(shard(&options).unwrap(), one_of_three);
        assert_eq!(shard(&TransferOptions::default()).unwrap(), None);
        // No Indexed Job around the test: the message says what is missing.
        if std::env::var_os(COMPLETION_INDEX_ENV).is_none() {
            let options = TransferOptions { shards: Some(3), ..TransferOptions::default() };
            let error = shard(&options).unwrap_err().to_string();
            assert!(error.contains("JOB_COMPLETION_INDEX"), "{error}");
        }
    }

    #[test]
    fn a_push_refuses_what_only_a_pull_understands_and_parts_s3_refuses() {
        assert!(check_push(&TransferOptions::default()).is_ok());
        let error = check_push(&TransferOptions { delete_removed: true, ..TransferOptions::default() }).unwrap_err();
        assert!(error.to_string().contains("--delete-removed"), "{error}");
        let small = TransferOptions { part_size: Some("1MiB".parse().unwrap()), ..TransferOptions::default() };
        assert!(check_push(&small).unwrap_err().to_string().contains("5MiB"));
    }
}
