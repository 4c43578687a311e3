//! The tokio runtime every front end runs the engine on (the `ferry-stager`
//! binary, the `ferry` Python package, the engine's own process tests), so
//! that its blocking pool has one bound, derived from the engine's own
//! limits.
//!
//! The engine hands file work to the blocking pool: a pull's creations and
//! commits and a push's opens and reads through its disk slots
//! ([`crate::transfer::Engine::on_disk`]), plus read-backs, hashes of
//! objects held in memory and a fleet server's reads. tokio's pool starts a
//! thread whenever a task arrives and no thread is idle, and a thread that
//! has just finished a task is not idle until it is back in the pool's
//! wait. On contended CPUs that moment is long, so the pool grew to several
//! times the work in flight (a push of 20,000 files: 205 threads idle, 257
//! with three CPU hogs beside it), each thread keeping its stack and
//! allocations resident (about 140 KB apiece). Bounded, a task that finds
//! every thread busy waits in the pool's queue for the next one free.
//!
//! The bound is safe because no task on the pool waits for another one to
//! run: every blocking task does its file or CPU work and returns. A task
//! that waits for the async side (the push's directory walk, which waits
//! for room in its channel) runs on a thread of its own instead.

use crate::transfer::{DISK_SLOTS_PER_CORE, cores};

/// Blocking threads beyond the disk slots: for the blocking work outside
/// them (read-backs, hashes of objects in memory, a fleet server's reads,
/// each run's few set-up steps, name lookups), which may then queue
/// behind file operations but never wait for one another.
pub const BLOCKING_THREADS_BEYOND_DISK_SLOTS: usize = 8;

/// The most blocking threads a process running the engine needs on a
/// machine of `cores` cores: one per disk slot, plus
/// [`BLOCKING_THREADS_BEYOND_DISK_SLOTS`].
#[must_use]
pub fn blocking_threads(cores: usize) -> usize {
    cores.max(1) * DISK_SLOTS_PER_CORE + BLOCKING_THREADS_BEYOND_DISK_SLOTS
}

/// A multi-threaded runtime with I/O and timers, and a blocking pool of
/// [`blocking_threads`] for this machine.
#[must_use]
pub fn builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().max_blocking_threads(blocking_threads(cores()));
    builder
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn the_pool_has_a_thread_per_disk_slot_and_a_few_more() {
        assert_eq!(blocking_threads(2), 2 * DISK_SLOTS_PER_CORE + BLOCKING_THREADS_BEYOND_DISK_SLOTS);
        assert_eq!(blocking_threads(0), blocking_threads(1), "at least one core");
    }

    /// Many more blocking tasks than the bound all run, and never more
    /// than the bound at once.
    #[test]
    fn blocking_tasks_beyond_the_bound_wait_their_turn() {
        let bound = blocking_threads(cores());
        let runtime = builder().build().unwrap();
        let (running, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let tasks: Vec<_> = (0..bound * 4)
            .map(|_| {
                let (running, most) = (Arc::clone(&running), Arc::clone(&most));
                runtime.spawn_blocking(move || {
                    most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(5));
                    running.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        runtime.block_on(async {
            for task in tasks {
                task.await.unwrap();
            }
        });
        let most = most.load(Ordering::SeqCst);
        assert!(most > 1 && most <= bound, "{most} blocking tasks ran at once; the bound is {bound}");
    }
}
