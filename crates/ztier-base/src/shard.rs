//! Per-thread shards: the userspace form of the kernel's per-CPU data. A thread always uses
//! the shard of its index (threads numbered in order of first use, modulo the shard count),
//! so threads rarely share one, and state kept in a shard (a compression stream, a share of
//! the counters) is reached with one uncontended lock instead of atomics on shared lines.
//!
//! Invariants: each shard is alone on its cache lines; a thread's shard never changes.
//! Locking: an operation holds at most its own thread's shard, except [`Shards::lock_all`],
//! which takes every shard in index order (so two of them cannot deadlock).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};

/// The shard count: enough that the threads of a 16-CPU machine each have their own.
pub const SHARDS: usize = 16;

/// This thread's shard index, `0..SHARDS`.
pub fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(Mutex<T>);

/// One `T` per shard.
pub struct Shards<T> {
    shards: Box<[Padded<T>]>,
}

impl<T: Default> Default for Shards<T> {
    fn default() -> Self {
        Shards {
            shards: (0..SHARDS).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> Shards<T> {
    /// The calling thread's shard, held until the guard goes.
    #[inline]
    pub fn local(&self) -> MutexGuard<'_, T> {
        self.shards[shard_index()].0.lock()
    }

    /// Calls `f` on each shard in turn, holding only that one.
    pub fn for_each(&self, mut f: impl FnMut(&mut T)) {
        for s in self.shards.iter() {
            f(&mut s.0.lock());
        }
    }

    /// Every shard, locked in index order: shuts out every operation that holds one.
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, T>> {
        self.shards.iter().map(|s| s.0.lock()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_keeps_its_shard_and_sums_add_up() {
        let shards: Shards<u64> = Shards::default();
        std::thread::scope(|s| {
            for _ in 0..40 {
                s.spawn(|| {
                    let mine = shard_index();
                    for _ in 0..100 {
                        assert_eq!(shard_index(), mine);
                        *shards.local() += 1;
                    }
                });
            }
        });
        let mut total = 0;
        shards.for_each(|n| total += *n);
        assert_eq!(total, 4000);
        assert_eq!(shards.lock_all().len(), SHARDS);
    }
}
