//! A worker's share of a store budget: how many requests and bytes per
//! second one stager may send to a bucket that many workers share.
//!
//! A cluster admin sets a budget for a bucket (the operator's `StoreBudget`
//! resource); the operator splits it among the workers running against that
//! bucket and hands each its [`StoreShare`], first on the command line
//! (`--store-share`) and then, as workers come and go, in the DataStage's
//! status, which every worker reads back while it reports its progress.
//! One type for both ways, so the operator cannot write a share the stager
//! reads differently.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Per-second caps for one worker; a cap left out is no cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::kubernetes_integer_formats)]
pub struct StoreShare {
    /// Requests per second this worker may start (listing, reads, uploads
    /// and retries alike).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<u32>,
    /// Bytes per second this worker may move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<u64>,
}

/// The tighter of two per-second caps, `None` meaning no cap.
pub fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl StoreShare {
    /// An equal part of a budget of `requests_per_second` and
    /// `bytes_per_second` for each of `workers`. Rounded down, so the parts
    /// never add up to more than the budget, but never below one unit: a
    /// worker with a share of zero would stall, not share.
    pub fn split(requests_per_second: Option<u32>, bytes_per_second: Option<u64>, workers: u32) -> Self {
        let workers = workers.max(1);
        Self {
            requests_per_second: requests_per_second.map(|rate| (rate / workers).max(1)),
            bytes_per_second: bytes_per_second.map(|rate| (rate / u64::from(workers)).max(1)),
        }
    }

    /// Whether this share caps nothing.
    pub fn is_unlimited(&self) -> bool {
        self.requests_per_second.is_none() && self.bytes_per_second.is_none()
    }

    /// The tighter of this share and a worker's own caps (`--max-request-rate`,
    /// `--max-bandwidth`): a budget never lets a worker exceed what its user asked for.
    pub fn within(
        &self,
        own_requests_per_second: Option<u64>,
        own_bytes_per_second: Option<u64>,
    ) -> (Option<u64>, Option<u64>) {
        (
            tighter(self.requests_per_second.map(u64::from), own_requests_per_second),
            tighter(self.bytes_per_second, own_bytes_per_second),
        )
    }
}

/// A `--store-share` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "'{0}' is not a store share: write requests=N and/or bytes=N per second, separated by a comma, e.g. requests=20,bytes=1048576"
)]
pub struct StoreShareError(String);

/// `requests=N,bytes=N` (either may be left out; `unlimited` for neither).
impl std::fmt::Display for StoreShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(rate) = self.requests_per_second {
            parts.push(format!("requests={rate}"));
        }
        if let Some(rate) = self.bytes_per_second {
            parts.push(format!("bytes={rate}"));
        }
        if parts.is_empty() { f.write_str("unlimited") } else { f.write_str(&parts.join(",")) }
    }
}

impl std::str::FromStr for StoreShare {
    type Err = StoreShareError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || StoreShareError(s.to_owned());
        let mut share = StoreShare::default();
        if s.trim() == "unlimited" {
            return Ok(share);
        }
        for part in s.split(',') {
            let (key, value) = part.split_once('=').ok_or_else(err)?;
            match key.trim() {
                "requests" if share.requests_per_second.is_none() => {
                    share.requests_per_second = Some(value.trim().parse().ok().filter(|v| *v > 0).ok_or_else(err)?);
                }
                "bytes" if share.bytes_per_second.is_none() => {
                    share.bytes_per_second = Some(value.trim().parse().ok().filter(|v| *v > 0).ok_or_else(err)?);
                }
                _ => return Err(err()),
            }
        }
        Ok(share)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_splits_into_equal_parts_that_never_add_up_to_more() {
        let share = StoreShare::split(Some(100), Some(1000), 3);
        assert_eq!(share, StoreShare { requests_per_second: Some(33), bytes_per_second: Some(333) });
        // More workers than requests: each still gets one.
        assert_eq!(StoreShare::split(Some(2), None, 5).requests_per_second, Some(1));
        assert_eq!(StoreShare::split(None, None, 0), StoreShare::default());
        assert_eq!(StoreShare::split(Some(10), None, 0).requests_per_second, Some(10), "no workers counts as one");
    }

    #[test]
    fn a_share_never_loosens_the_workers_own_caps() {
        let share = StoreShare { requests_per_second: Some(50), bytes_per_second: None };
        assert_eq!(share.within(Some(20), None), (Some(20), None));
        assert_eq!(share.within(None, Some(7)), (Some(50), Some(7)));
        assert_eq!(StoreShare::default().within(None, None), (None, None));
    }

    #[test]
    fn a_share_prints_as_it_parses_and_bad_ones_are_refused_with_the_grammar() {
        for share in [
            StoreShare::default(),
            StoreShare { requests_per_second: Some(1), bytes_per_second: None },
            StoreShare { requests_per_second: None, bytes_per_second: Some(u64::MAX) },
            StoreShare { requests_per_second: Some(u32::MAX), bytes_per_second: Some(1) },
        ] {
            assert_eq!(share.to_string().parse(), Ok(share));
            let json = serde_json::to_string(&share).unwrap();
            assert_eq!(serde_json::from_str::<StoreShare>(&json).unwrap(), share);
        }
        assert_eq!(
            "bytes=5, requests=2".parse(),
            Ok(StoreShare { requests_per_second: Some(2), bytes_per_second: Some(5) })
        );
        for bad in ["", "requests=0", "requests=x", "rps=3", "requests=1,requests=2", "requests"] {
            let error = bad.parse::<StoreShare>().unwrap_err();
            assert!(error.to_string().contains("requests=20,bytes=1048576"), "{error}");
        }
        assert_eq!(serde_json::to_value(StoreShare::split(Some(9), Some(9), 1)).unwrap()["requestsPerSecond"], 9);
    }
}
