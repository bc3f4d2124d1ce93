//! Fault-around (the kernel's `do_fault_around()`, for a region's stored and zeroed pages):
//! a fault on a stored page brings in the stored pages after it too, and the pages among
//! and after them an evictor found all zeros, up to a window that grows while faults follow
//! on from where the last one's pages ended and shrinks when one does not; with larger
//! units, at least to the end of the faulting page's unit, each unit read once, and a
//! zeroed page inside a unit read comes in with the unit's copy, as a page of zeros.
//!
//! Invariants: the faulting page's lock is the caller's; the neighbours' locks are taken
//! here, in page order, fewer than `STRIPES` pages from the faulting unit's first page (so
//! their stripes are distinct), and held until each page's state says where its content is.
//! A neighbour is brought in only if it is stored or an evictor found it all zeros; any
//! other page ends the run (lib.rs, "The eviction protocol"). The faulting page goes in
//! first, which wakes its thread. A read fault on a page an evictor found all zeros brings
//! in the zeroed pages after it the same way, as the zero page, reading nothing. Lock
//! order: lib.rs.

use std::time::Instant;

use parking_lot::MutexGuard;

use crate::page_state::{Kind, PageState};
use crate::page_table::STRIPES;
use crate::placement::involuntary_switches;
use crate::shared::{Count, FaultIn, Served, Shared};

/// The fault-around window: how many pages after a faulting one come in with it.
/// It doubles while faults follow on from where the last one's pages ended (a sequential
/// or clustered touch), up to the region's most (`RegionConfig::fault_around`), and halves
/// when one does not.
pub(crate) struct Around {
    window: usize,
    next: u64,
    max: usize,
    /// For a turn in which a fault brought neighbours in (at idle priority): whether its
    /// copy of the faulting page took this thread's CPU (`getrusage`'s involuntary switches
    /// across it). Such a turn says nothing by its next read (module `placement`,
    /// "Following").
    pub(crate) preempted_by_copy: Option<bool>,
    /// When the fault thread began the call that wakes the last fault's thread (its page's
    /// copy, before the neighbours'; the wake of a spurious fault; the protection lifted):
    /// where its wait ends, for the stall clock. Taken before the call, not after: at idle
    /// priority the woken thread takes this CPU inside the call, and this thread sees the
    /// clock again only once that thread blocks.
    pub(crate) woke_at: Option<Instant>,
}

impl Around {
    pub(crate) fn new(max: usize) -> Around {
        Around {
            window: 0,
            next: u64::MAX,
            max,
            preempted_by_copy: None,
            woke_at: None,
        }
    }

    fn window(&mut self, page: u64) -> usize {
        self.window = if page == self.next {
            (self.window * 2).max(1).min(self.max)
        } else {
            self.window / 2
        };
        self.window
    }

    fn served(&mut self, page: u64, pages: usize) {
        self.next = page + pages as u64;
    }
}

/// How a fault brings stored pages in.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BringIn {
    /// Write-protected, their copies kept in the store: a read, with clean pages on.
    Clean,
    /// Unprotected, their copies freed: a write, or clean pages off.
    Dirty,
    /// As `Dirty`, for a read: the store is full and frees copies (`Shared::frees_copies`),
    /// counted in `RegionStats::copies_freed`.
    DirtyStoreFull,
}

impl Shared {
    /// The pages after `page` (locked by the caller) that a fault there brings in with it,
    /// each locked, and their states: on while `joins` takes a page's state, up to `window`
    /// pages after `page` and on to a unit's end (a page's, at page-sized units), within the
    /// region, and fewer than `STRIPES` pages from the first page of `page`'s unit, so the
    /// stripes locked are distinct (`STRIPES` is a whole number of units). The stripes are
    /// taken in page order: the fault thread may hold several; an evictor holding several
    /// waits for none after its first (lib.rs's lock order). Only stored pages and pages an
    /// evictor found all zeros may join: a page empty for any other reason ends the run.
    /// One the program dropped may still be mapped until the kernel zaps it, after the
    /// fault thread read the drop's event (lib.rs, "The eviction protocol"), and a zero page
    /// mapped there meanwhile would be zapped with it, leaving the page resident in the
    /// table with nothing mapped; an evictor unmapped a zeroed page itself, under the
    /// page's lock.
    fn lock_run(
        &self,
        page: u64,
        window: usize,
        joins: impl Fn(PageState) -> bool,
    ) -> (Vec<MutexGuard<'_, ()>>, Vec<PageState>) {
        let upp = self.unit_pages;
        let base = page - page % upp;
        let end = (page + 1 + window as u64)
            .next_multiple_of(upp)
            .min(base + STRIPES as u64)
            .min(self.pages);
        let most = end.saturating_sub(page + 1) as usize;
        let mut guards = Vec::with_capacity(most);
        let mut states = Vec::with_capacity(most);
        while page + 1 + (states.len() as u64) < end {
            let next = page + 1 + states.len() as u64;
            let guard = self.table.lock(next);
            let state = self.table.state(next);
            if !joins(state) {
                break;
            }
            guards.push(guard);
            states.push(state);
        }
        (guards, states)
    }

    /// Serves a fault on a stored page (locked by the caller), then as many of the pages after
    /// it as the fault-around window takes that are stored or that an evictor found all zeros
    /// (those in a unit read as pages of zeros, the others as the zero page): with larger
    /// units, at least to the end of its unit, and always to the end of a unit (each unit
    /// read is decompressed once, straight into `buf`, and serves all of its pages the fault
    /// brings in). The faulting page goes in alone first, after its unit's decompression,
    /// which wakes its thread; the neighbours follow, a copy for each run of pages in units
    /// read and a zero-page mapping for each run of zeroed pages outside them. `how` says
    /// whether they come in clean (write-protected, their copies kept in the store) or
    /// dirty: unprotected, their copies discarded once the copy is done (until then, under
    /// their locks, the store's copy is what goes back if the copy fails: nothing to
    /// compress again; with larger units, only units the fault brought in whole are
    /// discarded, the rest keep stale bytes: `Shared::drop_stored`).
    pub(crate) fn serve_stored(
        &self,
        page: u64,
        buf: &mut [u8],
        around: &mut Around,
        how: BringIn,
    ) -> Served {
        let dirty = how != BringIn::Clean;
        // The copies a full store frees, counted as they are.
        let freed = |n: u64| {
            if how == BringIn::DirtyStoreFull {
                self.count(Count::CopiesFreed, n);
            }
        };
        let ps = self.page_size;
        let upp = self.unit_pages;
        let base = page - page % upp;
        // The neighbours (`lock_run`) are stored pages and pages an evictor found all zeros
        // (each comes in zeros in this fault): a run stopped at a zero page would leave
        // the rest of its unit to a fault that decompresses the unit again, and the zero
        // pages at its end to a fault each.
        let (guards, states) = self.lock_run(page, around.window(page), |state| {
            state.is(Kind::Stored) || state.is(Kind::Empty) && state.zeroed()
        });
        let n = 1 + states.len();
        // Page `q` of the units read is at `at(q)` in `buf`, from the faulting page's unit on.
        let at = |q: u64| (q - base) as usize * ps;
        let unit_bytes = upp as usize * ps;
        self.count(Count::StoreReads, 1);
        if let Err(e) = self.device.read_unit(base / upp, &mut buf[..unit_bytes]) {
            self.note_error(format!("page {page}: {e}"));
            if self.uffd.poison(self.page_addr(page), ps as u64).is_ok() {
                self.count(Count::Poisoned, 1);
            }
            return Served::Done;
        }
        let clean = !dirty;
        // The faulting page comes in referenced; its neighbours without a second chance:
        // cold unless touched.
        let (faulted_in, around_in) = (
            PageState::resident(true, clean),
            PageState::resident(false, clean),
        );
        // In before the copy, which lets the faulting thread run on: what it reads of the
        // region's figures then includes its own fault. Taken back if the copy fails.
        self.count_fault_in(FaultIn::Store);
        self.table.leave(page, PageState::STORED, faulted_in);
        // Only where it tells the fault thread something, and costs little beside the
        // neighbours' decompression: a system call.
        let switches =
            (n > 1 && self.fault.placement.at_idle_priority()).then(involuntary_switches);
        around.woke_at = Some(Instant::now());
        let copied = self
            .uffd
            .copy_run(self.page_addr(page), &buf[at(page)..at(page) + ps], !dirty)
            .1;
        if let Some(before) = switches {
            around.preempted_by_copy = Some(involuntary_switches() != before);
        }
        match copied {
            Ok(()) => {
                if dirty {
                    self.drop_stored(page, PageState::STORED);
                    freed(1);
                }
            }
            Err(libc::EEXIST) => {
                // Present already: what the program sees is that page, which is not one of
                // ours and not protected: not clean, and the stored copy is stale. Nothing
                // came in: a spurious fault, not a refault.
                self.take_back_fault_in(FaultIn::Store);
                self.count(Count::SpuriousFaults, 1);
                self.drop_stored(page, PageState::STORED);
                self.table.leave(page, faulted_in, faulted_in.dirtied());
                self.uffd.wake(self.page_addr(page), ps as u64);
                around.served(page, 1);
                return Served::Done;
            }
            Err(e) => {
                self.take_back_fault_in(FaultIn::Store);
                self.table.leave(page, faulted_in, PageState::STORED);
                around.served(page, 1);
                return match e {
                    libc::EAGAIN => Served::Later,
                    // ENOENT: the mapping went (its unmap event is on its way); ESRCH: the
                    // process is exiting.
                    _ => Served::Done,
                };
            }
        }
        // The neighbours' units after the faulting page's, read while the faulting thread
        // runs on (a unit none of whose stored pages are in the run is not read): pages
        // before `ready` are in `buf`.
        let first = page + 1;
        let last = page + n as u64;
        let state_of = |q: u64| states[(q - first) as usize];
        let mut ready = (base + upp).min(last);
        // Whether each unit from the faulting page's on was read (has content in `buf`).
        let mut units_read = Vec::with_capacity((last - base).div_ceil(upp) as usize);
        units_read.push(true);
        while ready < last {
            let unit_end = (ready + upp).min(last);
            let has_stored = (ready..unit_end).any(|q| state_of(q).is(Kind::Stored));
            if has_stored {
                self.count(Count::StoreReads, 1);
                let unit = &mut buf[at(ready)..at(ready) + unit_bytes];
                if let Err(e) = self.device.read_unit(ready / upp, unit) {
                    self.note_error(format!("page {ready}: {e}"));
                    break;
                }
            }
            units_read.push(has_stored);
            ready = unit_end;
        }
        // A neighbour in a unit read is copied from `buf` (a zeroed one as a page of zeros,
        // in the same copy as the stored pages around it, as the bare handler puts a unit
        // in: a run split at each zeroed page would cost a copy and a wake-up more, and the
        // faulting thread, run on ahead, a trap more); in a unit not read, it is mapped as
        // the zero page with the zeroed pages beside it.
        let copied = |q: u64| units_read[((q - base) / upp) as usize];
        // A stored neighbour comes in clean or not, as the faulting page; a zeroed one not
        // clean, with no copy anywhere (copied in a clean run, it is write-protected with
        // the run: its first write lifts that, as any first write's does).
        let zero_in = PageState::resident(false, false);
        let brought_as = |state: PageState| match state.is(Kind::Stored) {
            true => around_in,
            false => zero_in,
        };
        let read = (ready - first) as usize;
        for (q, state) in (first..).zip(&states[..read]) {
            if !state.is(Kind::Stored) && copied(q) {
                buf[at(q)..at(q) + ps].fill(0);
            }
        }
        let brought = &states[..read];
        self.table
            .leave_run(first, brought.iter().map(|&s| (s, brought_as(s))));
        // In runs of pages copied (one copy each) and of zeroed ones mapped (the zero page,
        // one mapping each), until one fails.
        let mut installed = 0;
        while installed < read {
            let start = first + installed as u64;
            let copy = copied(start);
            let run = (start..first + read as u64)
                .take_while(|&q| copied(q) == copy)
                .count();
            let (done, outcome) = if copy {
                let (done, outcome) = self.uffd.copy_run(
                    self.page_addr(start),
                    &buf[at(start)..at(start) + run * ps],
                    !dirty,
                );
                (done / ps, outcome)
            } else {
                let (done, outcome) = self
                    .uffd
                    .zeropage_run(self.page_addr(start), (run * ps) as u64);
                (done / ps, outcome)
            };
            if copy && dirty {
                // The stored pages among them: their copies go (a zeroed one has none).
                let mut copies = 0;
                for q in start..start + done as u64 {
                    if state_of(q).is(Kind::Stored) {
                        self.drop_stored(q, PageState::STORED);
                        copies += 1;
                    }
                }
                freed(copies);
            }
            // All of them refaults (`RegionStats::refaults` counts fault-around pages).
            self.count(Count::FaultAround, done as u64);
            installed += done;
            if let Err(e) = outcome {
                if e == libc::EEXIST && installed < read {
                    // As for the faulting page: present, not ours, not clean; a stored
                    // copy is stale.
                    let p = first + installed as u64;
                    let state = state_of(p);
                    self.drop_stored(p, state);
                    self.table
                        .leave(p, brought_as(state), brought_as(state).dirtied());
                    self.uffd.wake(self.page_addr(p), ps as u64);
                    installed += 1;
                }
                break;
            }
        }
        // The pages not installed: as they were (a stored one's copy is still in the store).
        let not_installed = &states[installed..read];
        self.table.leave_run(
            first + installed as u64,
            not_installed.iter().map(|&s| (brought_as(s), s)),
        );
        if dirty {
            // The units brought in whole, all locked here and none with a copy any more.
            self.discard_unused_units(page..first + installed as u64, true);
        }
        around.served(page, installed + 1);
        drop(guards);
        Served::Done
    }

    /// Serves a read fault on a page an evictor found all zeros (locked by the caller), with
    /// the zeroed pages after it up to the window as it stands (on to a unit's end, fewer
    /// than `STRIPES` pages from the faulting unit's first): all as the zero page, with one
    /// mapping (the faulting page's alone where the run reaches another mapping), which
    /// wakes the faulting thread. Nothing is read. Without it, a program
    /// reading through a run of zero pages faults on each of them. The window is neither
    /// grown nor shrunk (a zero page costs no memory, so a wide window over zeros costs
    /// nothing but its page-table entries), but the next fault after the run follows on
    /// from it.
    pub(crate) fn serve_zeroed(&self, page: u64, state: PageState, around: &mut Around) -> Served {
        let ps = self.page_size;
        let (guards, states) = self.lock_run(page, around.window, |state| {
            state.is(Kind::Empty) && state.zeroed()
        });
        let n = 1 + states.len();
        let (faulted_in, around_in) = (
            PageState::resident(true, false),
            PageState::resident(false, false),
        );
        // In before the mapping, which lets the faulting thread run on; taken back unless
        // the faulting page is mapped.
        self.count_fault_in(FaultIn::Zeros);
        self.drop_stored(page, state);
        self.table.leave(page, state, faulted_in);
        self.table
            .leave_run(page + 1, states.iter().map(|&s| (s, around_in)));
        around.woke_at = Some(Instant::now());
        let (mut done, mut outcome) = self
            .uffd
            .zeropage_run(self.page_addr(page), (n * ps) as u64);
        if done == 0 && n > 1 && !matches!(outcome, Err(libc::EEXIST | libc::EAGAIN)) {
            // The run reaches past the faulting page's mapping (the program split the region
            // with `mprotect` or `mlock`), and the kernel maps none of a range that does
            // (ENOENT): the faulting page alone, or its thread would wait for ever.
            (done, outcome) = self.uffd.zeropage_run(self.page_addr(page), ps as u64);
        }
        let mapped = done / ps;
        // The neighbours mapped, and the one found present (not ours, not clean) if the
        // mapping stopped there with EEXIST (Linux reports a run stopped part way as EAGAIN
        // with the bytes done, as serve_stored's copies: then the rest stays as it was).
        let mut installed = mapped.saturating_sub(1);
        let served = match outcome {
            Ok(()) => Served::Done,
            Err(libc::EEXIST) if mapped == 0 => {
                // The faulting page is present already: what the program sees is that page.
                // Nothing came in: a spurious fault, not a refault.
                self.take_back_fault_in(FaultIn::Zeros);
                self.count(Count::SpuriousFaults, 1);
                self.uffd.wake(self.page_addr(page), ps as u64);
                Served::Done
            }
            Err(libc::EEXIST) => {
                let p = page + mapped as u64;
                self.table.leave(p, around_in, around_in.dirtied());
                self.uffd.wake(self.page_addr(p), ps as u64);
                installed += 1;
                Served::Done
            }
            Err(e) if mapped == 0 => {
                self.take_back_fault_in(FaultIn::Zeros);
                self.table.leave(page, faulted_in, state);
                match e {
                    libc::EAGAIN => Served::Later,
                    // ENOENT: the mapping went (its unmap event is on its way); ESRCH: the
                    // process is exiting.
                    _ => Served::Done,
                }
            }
            Err(_) => Served::Done,
        };
        if mapped > 0 {
            self.count(Count::ZeroRefaults, 1);
            self.count(Count::FaultAround, mapped as u64 - 1);
        }
        // The neighbours not installed: as they were.
        let not_installed = states.get(installed..).unwrap_or_default();
        self.table.leave_run(
            page + 1 + installed as u64,
            not_installed.iter().map(|&s| (around_in, s)),
        );
        around.served(page, 1 + installed);
        drop(guards);
        served
    }
}
