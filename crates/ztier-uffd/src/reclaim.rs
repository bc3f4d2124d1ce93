//! The reclaim thread and eviction: while the resident pages exceed the budget, a clock
//! over the page table picks pages not faulted in since its last pass (the kernel's second
//! chance, from what userspace sees: a fault sets a page's referenced bit, the hand clears
//! it once), moves each out into the pad, stores it (a clean page's copy is in the store
//! already: nothing to store), and empties the pad a batch at a time.
//!
//! Invariants: a page is moved only under `gate` (read) and its lock, after its state said
//! `RESIDENT`; its lock is held until its state says where its content is. The pad's pages
//! are read only here, after a move put a page there. Lock order: lib.rs.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::{
    Count, Error, Result, Shared, CLEAN, EMPTY, HELD, REFERENCED, RESIDENT, STATE_MASK, STORED,
};

/// What became of a page an evictor chose.
pub(crate) enum Evicted {
    /// Stored, or found all zeros and dropped.
    Out,
    /// Not resident (any more).
    Skipped,
    /// The address space is changing: an event is waiting for the fault thread.
    Busy,
}

pub(crate) fn run(sh: &Shared) {
    let mut hand = 0u64;
    loop {
        {
            let mut wanted = sh.reclaim_wanted.lock();
            while !sh.stop.load(Relaxed) && !sh.over_budget() {
                *wanted = false;
                sh.reclaim_cv
                    .wait_for(&mut wanted, Duration::from_millis(100));
            }
        }
        if sh.stop.load(Relaxed) {
            return;
        }
        let out = sh.evict_batch(&mut hand);
        sh.reclaim_stuck.store(out == 0, Relaxed);
        // Faults held back for the budget can go now (or, stuck, no longer wait for it).
        sh.waker.wake();
        if out == 0 {
            // Nothing could go (every candidate refused, or the address space changing):
            // try again shortly rather than spin.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Shared {
    /// Evicts up to a pad's worth of cold pages while over budget; how many went out.
    fn evict_batch(&self, hand: &mut u64) -> u64 {
        let mut slot = 0;
        let mut out = 0;
        let mut scanned = 0;
        while slot < crate::BATCH && scanned < 2 * self.pages && self.over_budget() {
            let page = *hand;
            *hand = (page + 1) % self.pages;
            scanned += 1;
            let state = self.state(page);
            if state & STATE_MASK != RESIDENT {
                continue;
            }
            if state & REFERENCED != 0 {
                // Clearing only the bit: a state set meanwhile under the lock keeps its own.
                self.states[page as usize].fetch_and(!REFERENCED, Relaxed);
                continue;
            }
            match self.evict_one(page, slot) {
                Ok(Evicted::Out) => {
                    out += 1;
                    slot += 1;
                }
                Ok(Evicted::Skipped) => {}
                Ok(Evicted::Busy) => break,
                Err(e) => *self.last_error.lock() = Some(e.to_string()),
            }
        }
        self.empty_pad(0, slot);
        out
    }

    /// Evicts `page` through pad page `slot` (the caller's alone until it empties it).
    pub(crate) fn evict_one(&self, page: u64, slot: usize) -> Result<Evicted> {
        let ps = self.page_size;
        let gate = self.gate.read();
        let _lock = self.locks.lock(page);
        let state = self.state(page);
        if state & STATE_MASK != RESIDENT {
            return Ok(Evicted::Skipped);
        }
        let pad = self.scratch.addr() + (slot * ps) as u64;
        // SAFETY: the page is the region's (its state, checked under `gate`, says resident,
        // and no unmap can have gone unseen: see lib.rs) and its lock is held until its
        // content is stored or held below.
        #[allow(unsafe_code)]
        let moved = unsafe { self.uffd.move_page(pad, self.page_addr(page), ps as u64) };
        drop(gate);
        match moved {
            Ok(()) => {}
            Err(libc::EAGAIN) => return Ok(Evicted::Busy),
            Err(libc::ENOENT) => {
                // No page there (dropped by the kernel): it reads as zeros.
                self.drop_stored(page, state);
                self.leave(page, state, EMPTY);
                self.count(Count::ZeroEvictions, 1);
                return Ok(Evicted::Out);
            }
            Err(e) => {
                // EBUSY (a page pinned or shared), EINVAL (the program changed the range's
                // protection): it stays, with a second chance before the next try.
                self.states[page as usize].fetch_or(REFERENCED, Relaxed);
                return Err(Error::Os {
                    what: "UFFDIO_MOVE",
                    source: std::io::Error::from_raw_os_error(e),
                });
            }
        }
        if state & CLEAN != 0 {
            // Not written since it came in from the store (a write would have waited for the
            // fault thread, which needs this page's lock to mark it dirty): the store's copy
            // is its content. Nothing to compress or write; the pad's copy is dropped.
            self.leave(page, state, STORED);
            self.count(Count::CleanEvictions, 1);
            return Ok(Evicted::Out);
        }
        // SAFETY: the pad page holds the page just moved in; only this evictor, holding the
        // pad slot, reads or changes it until it empties it.
        #[allow(unsafe_code)]
        let content = unsafe { self.scratch.slice(slot * ps, ps) };
        if ztier_compress::same_filled(content) == Some(0) {
            self.leave(page, state, EMPTY);
            self.count(Count::ZeroEvictions, 1);
            return Ok(Evicted::Out);
        }
        match self.device.write_page(page, content) {
            Ok(()) => {
                self.leave(page, state, STORED);
                self.count(Count::Evictions, 1);
                Ok(Evicted::Out)
            }
            Err(cause) => {
                // The page stays in memory, held whole until it is touched. Putting it back
                // with a move would need `gate`, which comes before the page lock.
                self.held.lock().insert(page, content.into());
                self.leave(page, state, HELD);
                self.count(Count::EvictFailures, 1);
                let e = Error::Store { page, cause };
                *self.last_error.lock() = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Empties pad pages `[slot, slot + n)`.
    pub(crate) fn empty_pad(&self, slot: usize, n: usize) {
        let ps = self.page_size;
        // SAFETY: the pad's pages hold only copies already stored or held, and no
        // reference to them is alive (`evict_one`'s slice is gone).
        #[allow(unsafe_code)]
        let _ = unsafe { self.scratch.dont_need(slot * ps, n * ps) };
    }
}
