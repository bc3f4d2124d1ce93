//! The synchronization the allocator is built on, in one place so that a model checker can
//! stand in for it: parking_lot's mutex and std's atomics, or, under `--cfg loom`, loom's
//! atomics and a spinlock built on one.
//!
//! Under loom the mutex is a spinlock on a loom `AtomicBool` (as the kernel's cluster and
//! device locks are spinlocks): loom 0.7's own `Mutex::try_lock` marks a thread about to
//! try a lock as blocked when another takes it, and so reports deadlocks that cannot
//! happen (tokio-rs/loom#376). The data sits in a std mutex that the flag keeps from ever
//! being contended.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;

/// A mutex with parking_lot's interface (`lock`, `try_lock`, no poisoning).
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct Mutex<T> {
    inner: parking_lot::Mutex<T>,
}

#[cfg(not(loom))]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Mutex<T> {
        Mutex {
            inner: parking_lot::Mutex::new(value),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.inner.lock()
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.inner.try_lock()
    }
}

#[cfg(loom)]
pub(crate) use model::{Mutex, MutexGuard};

#[cfg(loom)]
mod model {
    use loom::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug)]
    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        data: std::sync::Mutex<T>,
    }

    pub(crate) struct MutexGuard<'a, T> {
        /// `None` only inside `drop`, which lets the data go before clearing the flag.
        data: Option<std::sync::MutexGuard<'a, T>>,
        locked: &'a AtomicBool,
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Mutex<T> {
            Mutex {
                locked: AtomicBool::new(false),
                data: std::sync::Mutex::new(value),
            }
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            loop {
                if let Some(guard) = self.try_lock() {
                    return guard;
                }
                loom::thread::yield_now();
            }
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .ok()?;
            Some(MutexGuard {
                data: Some(self.data.lock().expect("uncontended: the flag is ours")),
                locked: &self.locked,
            })
        }
    }

    impl<T> std::ops::Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.data.as_ref().expect("held until drop")
        }
    }

    impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.data.as_mut().expect("held until drop")
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            drop(self.data.take());
            self.locked.store(false, Ordering::Release);
        }
    }
}
