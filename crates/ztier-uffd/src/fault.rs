//! The fault thread: reads the userfaultfd's messages, handles the program's changes to its
//! address space (remove, unmap, remap events) and serves the faults.
//!
//! Invariants: it never reads or writes the region or the pad (the kernel copies into them
//! for it); events are handled, under `gate` (write), before any fault read after them is
//! served; a fault that cannot be served yet (`EAGAIN`, or the budget while the reclaim
//! thread catches up) waits in a queue while the thread goes on reading messages, so the
//! thread never waits for anything that waits for it. Lock order: lib.rs.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;

use crate::userfaultfd::{self, Msg, Outcome};
use crate::{Count, Shared, EMPTY, GONE, HELD, REFERENCED, RESIDENT, STATE_MASK, STORED, UNMAPPED};

/// Pages the fault thread lets the resident count exceed the budget by while the reclaim
/// thread is making progress, before it holds faults back.
const BUDGET_SLACK: u64 = 2 * crate::BATCH as u64;

/// A fault read and not yet served.
#[derive(Clone, Copy)]
struct Fault {
    addr: u64,
    write: bool,
}

/// Pages an `mremap` moved out of the region: their stored copies, to be copied to where
/// they are now, after which the new range is unregistered (its pages leave the region).
struct Remap {
    to: u64,
    len: u64,
    copies: Vec<(u64, Box<[u8]>)>,
}

enum Served {
    Done,
    /// Not now: the address space is changing, or the budget is full.
    Later,
}

pub(crate) fn run(sh: &Shared) {
    let mut msgs = [Msg::default(); 64];
    let mut faults: VecDeque<Fault> = VecDeque::new();
    let mut remaps: Vec<Remap> = Vec::new();
    let mut buf = vec![0u8; sh.page_size].into_boxed_slice();
    let zeros = vec![0u8; sh.page_size].into_boxed_slice();
    loop {
        if sh.stop_faults.load(Relaxed) {
            return;
        }
        let waiting = !faults.is_empty() || !remaps.is_empty();
        if waiting {
            std::thread::yield_now();
        }
        sh.uffd.poll(&sh.waker, if waiting { 1 } else { -1 });
        if sh.stop_faults.load(Relaxed) {
            return;
        }
        {
            let _gate = sh.gate.write();
            loop {
                let n = match sh.uffd.read(&mut msgs) {
                    Ok(n) => n,
                    Err(e) => {
                        *sh.last_error.lock() = Some(format!("reading the userfaultfd: {e}"));
                        if e.raw_os_error() == Some(libc::EBADF) {
                            return;
                        }
                        0
                    }
                };
                for m in &msgs[..n] {
                    match m.event {
                        userfaultfd::EVENT_PAGEFAULT => faults.push_back(Fault {
                            addr: m.arg[1] & !(sh.page_size as u64 - 1),
                            write: m.arg[0] & userfaultfd::PAGEFAULT_FLAG_WRITE != 0,
                        }),
                        userfaultfd::EVENT_REMOVE => sh.on_remove(m.arg[0], m.arg[1]),
                        userfaultfd::EVENT_UNMAP => sh.on_unmap(m.arg[0], m.arg[1]),
                        userfaultfd::EVENT_REMAP => {
                            if let Some(r) = sh.on_remap(m.arg[0], m.arg[1], m.arg[2]) {
                                remaps.push(r);
                            }
                        }
                        _ => {}
                    }
                }
                if n < msgs.len() {
                    break;
                }
            }
        }
        remaps.retain_mut(|r| !sh.continue_remap(r));
        let mut left = faults.len();
        while left > 0 {
            left -= 1;
            let f = faults.pop_front().expect("counted");
            if let Served::Later = sh.serve(f, &mut buf, &zeros) {
                sh.count(Count::Deferred, 1);
                faults.push_back(f);
            }
        }
        sh.wake_reclaim_if_over();
    }
}

impl Shared {
    /// Serves one fault.
    fn serve(&self, f: Fault, buf: &mut [u8], zeros: &[u8]) -> Served {
        let Some(page) = self.page_of(f.addr) else {
            // A page moved out by an mremap whose copies are still under way: the copy (or
            // the unregistering after it) wakes it; waking it now lets it retry meanwhile.
            self.uffd.wake(f.addr, self.page_size as u64);
            return Served::Done;
        };
        let _lock = self.locks.lock(page);
        let state = self.state(page);
        let s = state & STATE_MASK;
        if s == RESIDENT || s == GONE {
            self.count(Count::SpuriousFaults, 1);
            self.uffd.wake(f.addr, self.page_size as u64);
            return Served::Done;
        }
        if self.over_budget_hard() {
            return Served::Later;
        }
        let addr = self.page_addr(page);
        if s == STORED {
            if let Err(e) = self.device.read_page(page, buf) {
                *self.last_error.lock() = Some(format!("page {page}: {e}"));
                if self.uffd.poison(addr, self.page_size as u64).is_ok() {
                    self.count(Count::Poisoned, 1);
                }
                return Served::Done;
            }
        }
        let held = if s == HELD {
            self.held.lock().remove(&page)
        } else {
            None
        };
        // In before the copy, which lets the faulting thread run on: what it reads of the
        // region's figures then includes its own fault. Taken back if the copy fails.
        let kind = match s {
            STORED => 0,
            HELD => 2,
            _ => 1,
        };
        // In before the copy, which lets the faulting thread run on: what it reads of the
        // region's figures (and of the device's) then includes its own fault. Put back if
        // the copy fails.
        self.fault_ins[kind].fetch_add(1, Relaxed);
        self.drop_stored(page, state);
        self.leave(page, state, RESIDENT | REFERENCED);
        let outcome: Outcome = match (s, &held) {
            (STORED, _) => self.uffd.copy(addr, buf),
            (HELD, Some(copy)) => self.uffd.copy(addr, copy),
            // An unmapped page faults only if it is still mapped (MREMAP_DONTUNMAP): empty.
            _ if f.write => self.uffd.copy(addr, zeros),
            _ => self.uffd.zeropage(addr, self.page_size as u64),
        };
        match outcome {
            Ok(()) => Served::Done,
            Err(libc::EEXIST) => {
                // Present already: what the program sees is that page; the copy is stale.
                self.uffd.wake(addr, self.page_size as u64);
                Served::Done
            }
            Err(e) => {
                self.fault_ins[kind].fetch_sub(1, Relaxed);
                let mut back = state;
                let mut held = held;
                if s == STORED {
                    if let Err(cause) = self.device.write_page(page, buf) {
                        // The store refuses it now: kept whole instead.
                        *self.last_error.lock() = Some(format!("page {page}: {cause}"));
                        held = Some(buf.into());
                        back = HELD;
                    }
                }
                if let Some(copy) = held {
                    self.held.lock().insert(page, copy);
                }
                self.leave(page, RESIDENT, back);
                match e {
                    libc::EAGAIN => Served::Later,
                    // ENOENT: the mapping went (its unmap event is on its way); ESRCH: the
                    // process is exiting.
                    _ => Served::Done,
                }
            }
        }
    }

    /// Whether faults that bring a page in wait for the reclaim thread.
    fn over_budget_hard(&self) -> bool {
        let budget = self.budget_pages.load(Relaxed);
        self.resident.load(Relaxed) >= budget.saturating_add(BUDGET_SLACK)
            && !self.reclaim_stuck.load(Relaxed)
    }

    /// The region pages wholly or partly in `[start, end)`.
    fn pages_in(&self, start: u64, end: u64) -> std::ops::Range<u64> {
        let base = self.map.addr();
        let top = base + self.map.len() as u64;
        let (s, e) = (start.max(base), end.min(top));
        if s >= e {
            return 0..0;
        }
        let ps = self.page_size as u64;
        (s - base) / ps..(e - base).div_ceil(ps)
    }

    /// The program dropped `[start, end)` (`MADV_DONTNEED`/`MADV_FREE`; the kernel zaps it
    /// once this event is read): those pages read as zeros from now on.
    fn on_remove(&self, start: u64, end: u64) {
        // The pad's own drops (the evictors') carry nothing to forget.
        let n = self.forget(self.pages_in(start, end), EMPTY);
        self.count(Count::Removed, n);
    }

    /// The program unmapped `[start, end)`.
    fn on_unmap(&self, start: u64, end: u64) {
        let n = self.forget(self.pages_in(start, end), UNMAPPED);
        self.count(Count::Unmapped, n);
    }

    /// Sets `pages` to `to`, dropping their stored copies; how many held anything.
    fn forget(&self, pages: std::ops::Range<u64>, to: u8) -> u64 {
        let mut n = 0;
        for page in pages {
            let _lock = self.locks.lock(page);
            let state = self.state(page);
            if !matches!(state & STATE_MASK, EMPTY | UNMAPPED | GONE) {
                n += 1;
            }
            self.drop_stored(page, state);
            self.leave(page, state, to);
        }
        n
    }

    /// The program moved `[from, from + len)` to `to`. The pages that were out are read
    /// back, to be copied to their new place; the pages now at `to` stop being the
    /// region's.
    fn on_remap(&self, from: u64, to: u64, len: u64) -> Option<Remap> {
        let mut copies = Vec::new();
        let mut moved = 0;
        for page in self.pages_in(from, from + len) {
            let _lock = self.locks.lock(page);
            let state = self.state(page);
            let dst = to + (self.page_addr(page) - from);
            match state & STATE_MASK {
                STORED => {
                    let mut copy = vec![0u8; self.page_size].into_boxed_slice();
                    match self.device.read_page(page, &mut copy) {
                        Ok(()) => copies.push((dst, copy)),
                        Err(e) => *self.last_error.lock() = Some(format!("page {page}: {e}")),
                    }
                }
                HELD => {
                    if let Some(copy) = self.held.lock().remove(&page) {
                        copies.push((dst, copy));
                    }
                }
                _ => {}
            }
            if state & STATE_MASK != EMPTY {
                moved += 1;
            }
            self.drop_stored(page, state);
            // With MREMAP_DONTUNMAP the old range stays, empty and registered: a fault
            // there finds it empty.
            self.leave(page, state, UNMAPPED);
        }
        self.count(Count::Remapped, moved);
        // Region pages the move landed on are the program's own memory from now on.
        self.forget(self.pages_in(to, to + len), GONE);
        let r = Remap { to, len, copies };
        Some(r)
    }

    /// Copies what it can of a remap's pages; true once all are done and the new range is
    /// unregistered.
    fn continue_remap(&self, r: &mut Remap) -> bool {
        while let Some((dst, copy)) = r.copies.last() {
            if let Err(libc::EAGAIN) = self.uffd.copy(*dst, copy) {
                return false;
            }
            // Done, or the page is there already, or the range went again: nothing to keep.
            r.copies.pop();
        }
        // Fails only if the range went meanwhile, leaving nothing registered there.
        let _ = self.uffd.unregister(r.to, r.len);
        true
    }
}
