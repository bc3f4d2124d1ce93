//! The shrink worker (`shrink_worker()` on the kernel's `zswap-shrink` workqueue): queued
//! when a store is refused with the pool full, it compacts the pool (as zsmalloc's own
//! shrinker would under the same pressure), then writes back the LRU's coldest pages until
//! the pool is at or below the accept threshold, giving up after `MAX_RECLAIM_RETRIES` walks
//! that write nothing back.
//!
//! Its state is one mutex and condvar, taken alone (never with any lock of the cache).

use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::{Inner, SWAP_CLUSTER_MAX};

/// Walks that write nothing back before the worker gives up (`MAX_RECLAIM_RETRIES`).
const MAX_RECLAIM_RETRIES: u32 = 16;

#[derive(Default)]
struct State {
    queued: bool,
    running: bool,
    stop: bool,
}

/// What the cache and its worker share.
#[derive(Default)]
pub(crate) struct Worker {
    state: Mutex<State>,
    wake: Condvar,
}

impl Worker {
    /// `queue_work(shrink_wq, &zswap_shrink_work)`: a no-op if already queued.
    pub(crate) fn queue(&self) {
        let mut s = self.state.lock();
        if !s.queued {
            s.queued = true;
            self.wake.notify_all();
        }
    }

    /// Blocks until no work is queued or running.
    pub(crate) fn wait_idle(&self) {
        let mut s = self.state.lock();
        while (s.queued || s.running) && !s.stop {
            self.wake.wait(&mut s);
        }
    }
}

/// The worker thread.
pub(crate) struct Handle(JoinHandle<()>);

impl Handle {
    pub(crate) fn start(inner: &Arc<Inner>) -> Handle {
        let inner = Arc::clone(inner);
        Handle(
            std::thread::Builder::new()
                .name("zswap-shrink".into())
                .spawn(move || run(&inner))
                .expect("spawning the zswap shrink worker"),
        )
    }

    pub(crate) fn stop(self, inner: &Inner) {
        inner.worker.state.lock().stop = true;
        inner.worker.wake.notify_all();
        let _ = self.0.join();
    }
}

fn run(inner: &Inner) {
    let w = &inner.worker;
    loop {
        {
            let mut s = w.state.lock();
            while !s.queued && !s.stop {
                w.wake.wait(&mut s);
            }
            if s.stop {
                return;
            }
            s.queued = false;
            s.running = true;
        }
        // Loads' put-off frees first: the pool as the kernel's would be.
        inner.flush_all();
        let thr = inner.accept_thr_pages();
        // The pressure that fills zswap's pool also runs zsmalloc's own shrinker, which
        // compacts (`zs_shrinker_scan()`): the holes that loads and writebacks leave are
        // given back before any page is written to the disk for the room.
        if inner.total_pages() > thr {
            inner.pool.compact();
        }
        let mut failures = 0;
        while inner.total_pages() > thr && !w.state.lock().stop {
            if inner.shrink(SWAP_CLUSTER_MAX) == 0 {
                failures += 1;
                if failures == MAX_RECLAIM_RETRIES {
                    break;
                }
            }
        }
        inner.compact_lru(usize::MAX, 64);
        let mut s = w.state.lock();
        s.running = false;
        w.wake.notify_all();
    }
}
