//! How long the operator's watches wait before they try again after an
//! error: short enough that the controller follows the cluster within a few
//! seconds of the API server answering again.
//!
//! kube's default policy doubles from 800 ms to 30 s and forgets only after
//! a success or two minutes without errors. An API server restart costs a
//! watch one error per try while it is down (refused connections), and one
//! more when it is back (a `410 Gone` for a resource version older than its
//! new watch cache), so by then a watch sleeps 10 to 30 s, and an etcd
//! restart right after adds another sleep. The controller applies the same
//! policy once more to all its watches together (`trigger_backoff`), and
//! while that sleeps it reads none of them: in the fault test the
//! operator's triggers slept up to 36 s at a time while new DataStages
//! waited, and the first worker after the restarts started 57 to 113 s
//! late. At most 5 s here, for each watch and for the controller's
//! triggers: a watch that keeps failing costs its API server one request
//! every 5 s, and the operator has five.

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first wait after an error.
const FIRST: Duration = Duration::from_millis(500);
/// The longest wait between two tries.
const MAX: Duration = Duration::from_secs(5);

/// Exponential backoff with jitter from [`FIRST`] to [`MAX`], reset by
/// every event the watch delivers.
#[derive(Debug)]
pub struct WatchBackoff {
    next: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        Self { next: FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let base = self.next;
        self.next = (self.next * 2).min(MAX);
        // Half fixed, half random: watches that failed together (every
        // watch fails when the API server goes) do not retry in lockstep.
        let half = base / 2;
        Some(half + half.mul_f64(rand::random::<f64>()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_five_seconds_with_jitter_and_start_over_after_a_success() {
        let mut backoff = WatchBackoff::default();
        let bases = [500, 1000, 2000, 4000, 5000, 5000, 5000];
        for base in bases {
            let wait = backoff.next().unwrap();
            let base = Duration::from_millis(base);
            assert!(wait >= base / 2 && wait <= base, "{wait:?} outside [{:?}, {base:?}]", base / 2);
        }
        backoff.reset();
        assert!(backoff.next().unwrap() <= FIRST, "a success starts the waits over");
    }
}
