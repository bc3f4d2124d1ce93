//! Per-thread shards: the userspace form of the kernel's per-CPU data. A thread always uses
//! the shard of its index (threads numbered in order of first use, modulo the shard count),
//! so threads rarely share one, and state kept in a shard (a compression stream, a share of
//! the counters) is reached with one uncontended lock instead of atomics on shared lines.
//!
//! Invariants: each shard is alone on its cache lines; a thread's shard never changes.
//! Locking: an operation holds at most its own thread's shard, except [`Shards::lock_all`],
//! which takes every shard in index order (so two of them cannot deadlock).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard};

use crate::counter::CounterIndex;

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

    /// Shard `index % SHARDS`: the shard of a CPU named by the caller (a model checker's
    /// thread, which must not share the OS thread's index with the others).
    #[inline]
    pub fn at(&self, index: usize) -> MutexGuard<'_, T> {
        self.shards[index % SHARDS].0.lock()
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

/// Locks striped by a key (a page index, a swap slot): key `k` takes stripe `k % n`, each
/// stripe on its own cache line. The userspace form of a per-page lock (the kernel's folio
/// lock), for a table too large to hold one lock per entry: two keys of one stripe wait for
/// each other, which is harmless as long as no caller holds two stripes at once.
pub struct Stripes {
    locks: Box<[Padded<()>]>,
}

impl Stripes {
    /// `n` stripes (at least one).
    pub fn new(n: usize) -> Stripes {
        Stripes {
            locks: (0..n.max(1)).map(|_| Padded::default()).collect(),
        }
    }

    /// Every stripe, in index order (never while holding one): nothing keyed by any of them
    /// runs until the guards go.
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.locks.iter().map(|l| l.0.lock()).collect()
    }

    pub fn len(&self) -> usize {
        self.locks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.locks.is_empty()
    }

    /// The lock of `key`'s stripe, held until the guard goes.
    #[inline]
    pub fn lock(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks[(key % self.locks.len() as u64) as usize]
            .0
            .lock()
    }

    /// The lock of `key`'s stripe if no one holds it now: for a holder of several that
    /// waits only for its first, so that it never waits while holding one.
    #[inline]
    pub fn try_lock(&self, key: u64) -> Option<MutexGuard<'_, ()>> {
        self.locks[(key % self.locks.len() as u64) as usize]
            .0
            .try_lock()
    }
}

/// Event counters kept per shard, so that threads counting the same event do not share a
/// cache line (as the kernel's per-CPU `vm_event` counters): [`add`](Counters::add) is one
/// relaxed atomic add on the calling thread's line, [`sum`](Counters::sum) reads them all.
///
/// Indexed by a [`counters!`](crate::counters) set (`Counters<{ Count::COUNT }>`) or by a
/// bare `usize`. A set of another size does not compile:
///
/// ```compile_fail
/// ztier_base::counters! {
///     enum Count { A, B[2] }
/// }
/// let counters: ztier_base::shard::Counters<2> = Default::default();
/// counters.add(Count::A, 1);
/// ```
pub struct Counters<const N: usize> {
    shards: Box<[PaddedCounts<N>]>,
}

#[repr(align(128))]
struct PaddedCounts<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Counters<N> {
    fn default() -> Self {
        Counters {
            shards: (0..SHARDS)
                .map(|_| PaddedCounts(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl<const N: usize> Counters<N> {
    /// `counter`'s place, its set's size checked against `N` when this compiles.
    #[inline]
    fn index<I: CounterIndex>(counter: I) -> usize {
        const {
            assert!(
                match I::SET {
                    Some(set) => set == N,
                    None => true,
                },
                "counters of one set indexed by another"
            )
        };
        counter.index()
    }

    /// Adds `n` to `counter`.
    #[inline]
    pub fn add(&self, counter: impl CounterIndex, n: u64) {
        self.shards[shard_index()].0[Self::index(counter)].fetch_add(n, Relaxed);
    }

    /// `counter` over every shard (exact once the counting threads have stopped).
    pub fn sum(&self, counter: impl CounterIndex) -> u64 {
        let i = Self::index(counter);
        self.shards.iter().map(|s| s.0[i].load(Relaxed)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::counters! {
        enum Count {
            Never,
            ByThread[2],
        }
    }

    #[test]
    fn try_lock_is_refused_while_the_stripe_is_held_and_only_then() {
        let stripes = Stripes::new(4);
        let held = stripes.lock(1);
        assert!(stripes.try_lock(1).is_none(), "the same key");
        assert!(
            stripes.try_lock(5).is_none(),
            "another key of the same stripe"
        );
        assert!(stripes.try_lock(2).is_some(), "another stripe");
        drop(held);
        assert!(stripes.try_lock(1).is_some());
    }

    #[test]
    fn counters_sum_over_threads() {
        let counters: Counters<{ Count::COUNT }> = Counters::default();
        std::thread::scope(|s| {
            for t in 0..20u64 {
                let counters = &counters;
                s.spawn(move || {
                    for _ in 0..1000 {
                        counters.add(Count::ByThread.at(0), t);
                        counters.add(Count::ByThread.at(1), 1);
                    }
                });
            }
        });
        assert_eq!(counters.sum(Count::Never), 0);
        assert_eq!(
            counters.sum(Count::ByThread.at(0)),
            1000 * (0..20).sum::<u64>()
        );
        assert_eq!(counters.sum(Count::ByThread.at(1)), 20_000);
        // A bare index is the same counter.
        assert_eq!(counters.sum(2), 20_000);
    }

    #[test]
    fn a_shard_at_an_index_is_that_shard() {
        let shards: Shards<u64> = Shards::default();
        *shards.at(3) += 5;
        *shards.at(3 + SHARDS) += 1;
        assert_eq!(*shards.at(3), 6);
    }

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
