//! Lock statistics, the userspace form of `perf lock contention`: a thin wrapper around a
//! mutex that counts, per class of locks (the device lock, all cluster locks, ...),
//! acquisitions, contended acquisitions and the time spent waiting.
//!
//! An uncontended acquisition costs one `try_lock` and one relaxed add on the calling
//! thread's own counter line ([`ztier_base::shard::Counters`]); only a contended one reads
//! the clock. Counting never takes a lock.

use std::time::Instant;

use serde::Serialize;
use ztier_base::shard::Counters;

use crate::sync::{Mutex, MutexGuard};

ztier_base::counters! {
    /// What a class of locks counts.
    enum Count {
        /// Acquisitions, contended or not.
        Acquired,
        /// Acquisitions that found the lock held.
        Contended,
        /// Nanoseconds those waited.
        WaitNs,
    }
}

/// The counts of one class of locks.
pub struct LockStats {
    name: &'static str,
    counts: Counters<{ Count::COUNT }>,
}

impl LockStats {
    pub fn new(name: &'static str) -> LockStats {
        LockStats {
            name,
            counts: Counters::default(),
        }
    }

    /// What was counted so far.
    pub fn report(&self) -> LockReport {
        LockReport {
            name: self.name,
            acquisitions: self.counts.sum(Count::Acquired),
            contended: self.counts.sum(Count::Contended),
            wait_ns: self.counts.sum(Count::WaitNs),
        }
    }
}

/// One class's counts, as `perf lock contention` would print them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LockReport {
    pub name: &'static str,
    pub acquisitions: u64,
    /// Acquisitions that found the lock held and waited.
    pub contended: u64,
    /// Total time those waited, in nanoseconds.
    pub wait_ns: u64,
}

/// A mutex whose acquisitions are counted in the [`LockStats`] the caller names.
#[derive(Debug)]
pub(crate) struct CountedMutex<T> {
    inner: Mutex<T>,
}

impl<T> CountedMutex<T> {
    pub(crate) fn new(value: T) -> CountedMutex<T> {
        CountedMutex {
            inner: Mutex::new(value),
        }
    }

    /// Locks, waiting if needed; counted in `stats`.
    #[inline]
    pub(crate) fn lock(&self, stats: &LockStats) -> MutexGuard<'_, T> {
        if let Some(guard) = self.inner.try_lock() {
            stats.counts.add(Count::Acquired, 1);
            return guard;
        }
        let start = Instant::now();
        // Counted as the wait begins, so a reading shows the waiters of a held lock.
        stats.counts.add(Count::Contended, 1);
        let guard = self.inner.lock();
        let waited = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        stats.counts.add(Count::Acquired, 1);
        stats.counts.add(Count::WaitNs, waited);
        guard
    }

    /// Locks if free; counted in `stats` when it succeeds (a failed try is no acquisition
    /// and no wait).
    #[inline]
    pub(crate) fn try_lock(&self, stats: &LockStats) -> Option<MutexGuard<'_, T>> {
        let guard = self.inner.try_lock()?;
        stats.counts.add(Count::Acquired, 1);
        Some(guard)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn acquisitions_and_contention_are_counted() {
        let stats = LockStats::new("test");
        let m = CountedMutex::new(0u64);
        *m.lock(&stats) += 1;
        assert!(m.try_lock(&stats).is_some());
        {
            let _held = m.lock(&stats);
            assert!(m.try_lock(&stats).is_none());
        }
        // The holder lets go only once the waiter is counted as waiting (its try failed,
        // its clock runs), and then not before `HOLD` has passed: the wait is at least that,
        // however late either thread gets a core. No sleep stands for the waiter's arrival.
        const HOLD: Duration = Duration::from_millis(2);
        std::thread::scope(|s| {
            let held = m.lock(&stats);
            let waiter = s.spawn(|| *m.lock(&stats) += 1);
            let deadline = Instant::now() + Duration::from_secs(60);
            while stats.report().contended == 0 {
                assert!(
                    Instant::now() < deadline,
                    "the waiter was never counted as contended: {:?}",
                    stats.report()
                );
                std::thread::yield_now();
            }
            let seen = Instant::now();
            while seen.elapsed() < HOLD {
                std::thread::yield_now();
            }
            drop(held);
            waiter.join().unwrap();
        });
        let r = stats.report();
        assert_eq!((r.name, r.acquisitions), ("test", 5));
        assert_eq!(r.contended, 1);
        assert!(r.wait_ns >= HOLD.as_nanos() as u64, "{r:?}");
        assert_eq!(*m.lock(&stats), 2);
    }
}
