//! The reclaim thread and eviction: once the resident pages exceed the budget, and until
//! they are a little under it (`Shared::reclaim_target`), a clock
//! over the page table picks pages not faulted in since its last pass (the kernel's second
//! chance, from what userspace sees: a fault sets a page's referenced bit, the hand clears
//! it once), moves runs of them out into the pad (one `UFFDIO_MOVE` a run of neighbours),
//! stores each from there (a clean page's copy is in the store already: nothing to store),
//! and empties the pad a batch at a time.
//!
//! Invariants: a page is moved only under `gate` (read) and its lock, after its state said
//! resident; its lock is held until its state says where its content is. A run's first
//! lock is waited for, the others only tried (page_table.rs). An evictor's pad slots are
//! its own part's (mapping.rs), read only after a move filled them. Lock order: lib.rs.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use crate::error::{Error, Result, UnmovableReason};
use crate::mapping::{self, Moved, PadPart};
use crate::page_state::PageState;
use crate::page_table::LockedPage;
use crate::placement;
use crate::shared::{Count, ManualPad, Shared, MANUAL_PAD};

/// What became of a page an evictor chose.
pub(crate) enum Evicted {
    /// Stored, or found all zeros and dropped.
    Out,
    /// Not resident (any more).
    Skipped,
    /// The address space is changing: an event is waiting for the fault thread.
    Busy,
}

/// How long an evictor waits before it tries again after a batch that could move no page
/// out (every candidate refused: the program locked or protected them): doubling from the
/// first to the last, back to the first once a page goes out. Long enough that pages that
/// cannot go cost no CPU to speak of; short enough that pages the program unlocks go within
/// a second.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
const LAST_BACKOFF: Duration = Duration::from_secs(1);

/// Waits on `cv` (with `lock`, whose holder wakes it) for at most `backoff`, and returns the
/// next backoff.
fn back_off<T>(
    lock: &parking_lot::Mutex<T>,
    cv: &parking_lot::Condvar,
    backoff: Duration,
) -> Duration {
    let mut g = lock.lock();
    cv.wait_for(&mut g, backoff);
    (backoff * 2).min(LAST_BACKOFF)
}

/// The reclaim thread: evicts once the resident pages exceed the budget, down to a little
/// under it (`Shared::reclaim_target`), through its part of the pad.
pub(crate) fn run(sh: &Shared, mut part: PadPart) {
    let mut segment = (0, 0);
    let mut keep_off = placement::KeepOff::start(&sh.fault.placement);
    // In a pass the budget started: it goes on, batch after batch, down to the target, and
    // ends there; the next starts only when the budget is crossed again.
    let mut passing = false;
    let mut backoff = FIRST_BACKOFF;
    loop {
        // Before the look at the budget: a step may have just lowered it.
        sh.autosize_tick();
        let idle = {
            let mut wanted = sh.evictors.wanted.lock();
            !sh.evictors.stop.load(Relaxed) && !passing && !sh.over_budget() && {
                *wanted = false;
                sh.evictors
                    .wanted_cv
                    .wait_for(&mut wanted, Duration::from_millis(100))
                    .timed_out()
            }
        };
        if sh.evictors.stop.load(Relaxed) {
            return;
        }
        passing = passing || sh.over_budget();
        sh.evictors.passing.store(passing, Relaxed);
        if !passing {
            // Under the budget by whatever way (a pass, the program's own drops, a budget
            // raised): nothing to be stuck on.
            sh.evictors.stuck.store(false, Relaxed);
            // Outside `Evictors::wanted`: emptying the pad waits for the fault thread, which
            // takes that lock to wake this thread.
            if idle {
                sh.release_manual_pad();
            }
            // Counted once the look's work is done, so a count that has not moved says no
            // look emptied the pad meanwhile.
            sh.count(Count::ReclaimLooks, 1);
            continue;
        }
        sh.count(Count::ReclaimLooks, 1);
        if sh.far_over_budget() {
            // Under its mutex: the helper is either before its look at the budget or waiting.
            let _idle = sh.evictors.helper_idle.lock();
            sh.evictors.helper_cv.notify_one();
        }
        keep_off.settle();
        let Batch { out, reached, busy } = sh.evict_batch(&mut segment, &mut part);
        // The pass ends where it reached the target, not where the thread looks next (the
        // pad's emptying waits for the fault thread, which serves the faults that came
        // meanwhile, and pages they bring in under the budget are not this pass's); or, when
        // nothing could go, it starts again from the budget.
        passing = out > 0 && !reached;
        sh.evictors.passing.store(passing, Relaxed);
        // Stuck only while over the budget: nothing evicted between the target and the
        // budget (another evictor got there first, or an event is waiting) holds no fault.
        // Nor is a batch stopped by an event stuck: the fault thread reads the event (its
        // own ring among them) while it holds faults back, and the next batch goes on;
        // counted stuck, it let faults take the resident pages past the hold unchecked.
        sh.evictors
            .stuck
            .store(out == 0 && !busy && sh.over_budget(), Relaxed);
        // Faults held back for the budget can go now (or, stuck, no longer wait for it).
        sh.fault.waker.wake();
        if out == 0 && !reached {
            // Nothing could go: the address space changing (an event waits for the fault
            // thread: a moment), or every candidate refused (locked or protected by the
            // program): wait, longer each time nothing goes, woken by a new budget or the
            // drop, rather than spin.
            if busy {
                std::thread::sleep(FIRST_BACKOFF);
            } else {
                sh.reclaim_blocked(true);
                backoff = back_off(&sh.evictors.wanted, &sh.evictors.wanted_cv, backoff);
            }
        } else {
            sh.reclaim_blocked(false);
            backoff = FIRST_BACKOFF;
        }
    }
}

/// The second evictor: evicts beside the reclaim thread while the region is far over its
/// budget ([`FAR`] pages), through its own part of the pad, taking its pages from the same
/// clock, so that two CPUs compress. Near the budget the reclaim thread is alone (a batch
/// of this one's that began far over may still run on down to the target).
pub(crate) fn run_helper(sh: &Shared, mut part: PadPart) {
    let mut segment = (0, 0);
    let mut keep_off = placement::KeepOff::start(&sh.fault.placement);
    let mut backoff = FIRST_BACKOFF;
    loop {
        {
            // No timeout: the reclaim thread wakes it (under this mutex, so no wake-up is
            // lost), and the region's drop does; idle, it never runs.
            let mut idle = sh.evictors.helper_idle.lock();
            while !sh.evictors.stop.load(Relaxed) && !sh.far_over_budget() {
                sh.evictors.helper_cv.wait(&mut idle);
            }
        }
        if sh.evictors.stop.load(Relaxed) {
            return;
        }
        keep_off.settle();
        let Batch { out, busy, .. } = sh.evict_batch(&mut segment, &mut part);
        sh.fault.waker.wake();
        if out == 0 && busy {
            std::thread::sleep(FIRST_BACKOFF);
        } else if out == 0 {
            // As the reclaim thread: refused pages are waited out, longer each time.
            backoff = back_off(&sh.evictors.helper_idle, &sh.evictors.helper_cv, backoff);
        } else {
            backoff = FIRST_BACKOFF;
        }
    }
}

/// Pages past the budget beyond which the second evictor helps.
const FAR: u64 = 256;

/// Pages of the clock an evictor takes from the hand at a time.
const SEGMENT: u64 = 256;

/// What an evictor's batch did.
struct Batch {
    /// Pages that went out.
    out: u64,
    /// Whether the resident pages were down to the reclaim target when it stopped.
    reached: bool,
    /// Whether it stopped at a move refused while the address space changes: an event
    /// waits for the fault thread, which reads it even while it holds faults back, and the
    /// batch after it can go on.
    busy: bool,
}

/// What an evictor's run did.
#[derive(Default)]
pub(crate) struct Run {
    /// Pages from the first on that the run is done with (the clock's hand moves past them):
    /// at least one.
    pub(crate) taken: usize,
    /// Pad slots from the run's first on that it used (filled, or left empty for a page
    /// that was not there).
    pub(crate) slots: usize,
    /// Pages that went out (stored, clean, or found all zeros).
    pub(crate) out: usize,
    /// The address space is changing: an event is waiting for the fault thread.
    pub(crate) busy: bool,
    /// The last error (the store refused).
    pub(crate) error: Option<Error>,
    /// A page the kernel would not move out, and its errno (the program locked or
    /// protected it).
    pub(crate) refused: Option<(u64, i32)>,
}

/// Pages a reclaim batch tries that the kernel refuses to move before it gives up the batch:
/// the program locks and protects ranges, so the pages after a refused one are most likely
/// refused too, and trying each costs a system call.
const REFUSED_PER_BATCH: u32 = 64;

impl Shared {
    /// Whether the second evictor helps.
    fn far_over_budget(&self) -> bool {
        self.table.resident() > self.budget_pages.load(Relaxed).saturating_add(FAR)
    }

    /// The next pages of the clock for an evictor, `[start, end)`: the hand moves past them.
    fn claim(&self) -> (u64, u64) {
        let pages = self.pages;
        let start = self
            .evictors
            .hand
            .fetch_update(Relaxed, Relaxed, |h| {
                Some(if h + SEGMENT >= pages { 0 } else { h + SEGMENT })
            })
            .expect("always Some");
        let start = start.min(pages - 1);
        (start, (start + SEGMENT).min(pages))
    }

    /// Evicts up to a pad part's worth of cold pages while over the reclaim target, through
    /// `part`, from the part of the clock `segment` (the evictor's own, taken from the hand;
    /// a new one once it is done).
    fn evict_batch(&self, segment: &mut (u64, u64), part: &mut PadPart) -> Batch {
        let mut slot = 0;
        let mut out = 0;
        let mut scanned = 0;
        let mut busy = false;
        let mut refused = 0;
        while slot < part.len()
            && scanned < 2 * self.pages
            && self.table.resident() > self.reclaim_target()
        {
            if segment.0 >= segment.1 {
                *segment = self.claim();
            }
            let page = segment.0;
            let state = self.table.state(page);
            if !state.cold() {
                if state.referenced() {
                    if state.clean() && self.frees_copies() {
                        self.free_clean_copy(page);
                    }
                    self.table.clear_referenced(page);
                }
                segment.0 += 1;
                scanned += 1;
                continue;
            }
            // A run of cold resident pages from here, no longer than the excess, the pad or
            // the segment.
            // With larger units, the excess is rounded up to the end of a unit, so that a
            // run takes whole units where it can: each unit it takes part of is one
            // read-modify-write of it in the store.
            let excess = self.table.resident().saturating_sub(self.reclaim_target());
            let wanted = (page + excess.max(1)).next_multiple_of(self.unit_pages) - page;
            let max = (part.len() - slot)
                .min(wanted as usize)
                .min((segment.1 - page) as usize);
            let run = self.evict_run(page, max, part, slot);
            segment.0 += run.taken as u64;
            scanned += run.taken as u64;
            slot += run.slots;
            out += run.out as u64;
            if let Some(e) = run.error {
                self.note_error(e.to_string());
            }
            if run.busy {
                busy = true;
                break;
            }
            if let Some((page, errno)) = run.refused {
                // Why pages stay, said at the first a batch meets (reading the mapping's
                // flags costs a read of the process's smaps).
                if refused == 0 {
                    self.note_error(self.unmovable(page, errno).to_string());
                }
                refused += 1;
                if refused == REFUSED_PER_BATCH {
                    break;
                }
            }
        }
        let reached = self.table.resident() <= self.reclaim_target();
        self.empty_pad(part, slot);
        Batch { out, reached, busy }
    }

    /// Frees the copy of clean page `page`, which the clock gives a second chance while the
    /// store is full (`Shared::frees_copies`): vmscan's `folio_free_swap()` for a page it
    /// keeps when swap is full. The page is dirty from then on, and its write protection is
    /// lifted under its lock, as a first write's fault would (`EAGAIN`, the address space
    /// changing, leaves it protected: its first write is then a fault that only lifts it).
    /// Under `gate`, as every call on an address of the region outside the fault thread:
    /// between the fault thread's read of an unmap or a move and its handling, the address
    /// may already be another mapping's (lib.rs, "The eviction protocol").
    fn free_clean_copy(&self, page: u64) {
        let _gate = self.gate_read();
        let _lock = self.table.lock(page);
        let state = self.table.state(page);
        if state.clean() {
            self.drop_stored(page, state);
            self.table.leave(page, state, state.dirtied());
            self.count(Count::CopiesFreed, 1);
            let _ = self
                .uffd
                .writeprotect(self.page_addr(page), self.page_size as u64, false);
        }
    }

    /// Evicts `page` through slot `slot` of `part`.
    pub(crate) fn evict_one(&self, page: u64, part: &mut PadPart, slot: usize) -> Result<Evicted> {
        let run = self.evict_run(page, 1, part, slot);
        match run {
            Run { error: Some(e), .. } => Err(e),
            Run {
                refused: Some((page, errno)),
                ..
            } => Err(self.unmovable(page, errno)),
            Run { busy: true, .. } => Ok(Evicted::Busy),
            Run { out: 1, .. } => Ok(Evicted::Out),
            _ => Ok(Evicted::Skipped),
        }
    }

    /// Evicts the resident pages from `first` on, at most `max` of them, through `part`'s
    /// slots from `slot` on: `first` if it is resident, and after it those resident and not
    /// referenced whose locks are free (`PageTable::lock_run`, under `gate`). One
    /// `UFFDIO_MOVE` takes the run out (one TLB flush for all of it, not one a page), then
    /// each page is stored from the pad and its lock released, in page order.
    ///
    /// The locks: `first`'s is waited for, under `gate` (read); the others are only tried
    /// (lib.rs's lock order: an evictor never waits while it holds a page lock). Each is
    /// held from before its state is checked until its state says where its content is,
    /// as for a single page: a fault on a page of the run waits until that page is
    /// settled; the program's write to it lands before its move (and is stored) or after
    /// (and faults, and waits).
    pub(crate) fn evict_run(&self, first: u64, max: usize, part: &mut PadPart, slot: usize) -> Run {
        let ps = self.page_size;
        let mut run = Run {
            taken: 1,
            ..Run::default()
        };
        let gate = self.gate_read();
        let Some(movable) = self.table.lock_run(&gate, first, max) else {
            return run;
        };
        // The moves, all under `gate`: pages `[0, moved)` went into the pad (or were not
        // there: their slots stay empty); those after stay as they are.
        let n = movable.len();
        let mut moved = 0;
        let mut one_by_one = n == 1;
        while moved < n {
            let len = if one_by_one { 1 } else { n - moved };
            let Moved {
                bytes: done,
                uncounted,
                outcome,
            } = self.pad.move_in(
                part,
                slot + moved,
                &self.uffd,
                &self.memory,
                &movable,
                moved..moved + len,
            );
            moved += done / ps;
            if uncounted > 0 {
                self.count(Count::UnreportedMoves, uncounted as u64);
            }
            match outcome {
                Ok(()) => {}
                // A part moved: a move of the rest says what stopped it.
                Err(_) if done > 0 => {}
                Err(libc::EAGAIN) => {
                    run.busy = true;
                    break;
                }
                // No page there, though the page was resident (its lock held, and the
                // program's own drops and unmaps are seen before the kernel zaps), and not
                // in the pad (`Pad::move_in` looked): it reads as zeros from now on. Zeros
                // are right for a page the program dropped while another of its threads
                // touched it (lib.rs, "The program's `MADV_DONTNEED`"), which cannot be told
                // apart here from a lost page: said, and counted, so a loss is never silent.
                Err(libc::ENOENT) => {
                    let page = first + moved as u64;
                    self.count(Count::LostPages, 1);
                    self.note_error(format!(
                        "page {page}: resident, but the kernel had no page there when it was \
                         evicted (UFFDIO_MOVE: ENOENT); it reads as zeros"
                    ));
                    moved += 1;
                }
                // A run across two mappings (the program changed part of the range's
                // protection, or remapped inside it) fails whole: page by page, the pages
                // of each go.
                Err(_) if len > 1 => one_by_one = true,
                Err(e) => {
                    // EBUSY (a page pinned or shared), EINVAL (the program locked the
                    // range, or changed its protection): it stays, with a second chance
                    // before the next try.
                    let page = first + moved as u64;
                    self.table.mark_referenced(page);
                    run.refused = Some((page, e));
                    run.taken = moved + 1;
                    break;
                }
            }
        }
        let mut pages = movable.into_pages();
        drop(gate);
        // The pages that did not move stay resident, and unlocked.
        pages.truncate(moved);
        run.taken = run.taken.max(moved);
        run.slots = moved;
        if self.unit_pages > 1 {
            self.settle_units(first, pages, part, slot, &mut run);
            return run;
        }
        for (k, locked) in pages.into_iter().enumerate() {
            let page = first + k as u64;
            match self.settle(page, locked.state, part, slot + k) {
                Ok(()) => run.out += 1,
                Err(e) => run.error = Some(e),
            }
        }
        run
    }

    /// `settle` for a region of larger units: the run's pages (from `first`, locked, moved
    /// out into `part`'s slots from `slot` on) a unit at a time. Clean pages and pages
    /// found empty or all zeros leave as `settle` has them; the written ones of a unit are
    /// stored together, in one write of the unit's part from the first written page to the
    /// last (the whole unit where the run took it all, with nothing to read back; else one
    /// read-modify-write of the unit, which keeps the bytes of its other pages: the stored
    /// and clean ones' copies, under their own locks), never a write of each page. A clean
    /// page or one found all zeros inside that part is written with it, as it is (the
    /// same bytes as its copy, or zeros no one reads). Each unit's locks go once it is
    /// settled, in page order.
    fn settle_units(
        &self,
        first: u64,
        pages: Vec<LockedPage<'_>>,
        part: &PadPart,
        slot: usize,
        run: &mut Run,
    ) {
        let ps = self.page_size;
        let mut scratch = Vec::new();
        let mut pages = pages.into_iter();
        let mut at = first;
        let end = first + pages.len() as u64;
        while at < end {
            let unit = self.unit_of(at);
            let upto = unit.end.min(end);
            let locked: Vec<LockedPage<'_>> = pages.by_ref().take((upto - at) as usize).collect();
            let slot_of = |page: u64| slot + (page - first) as usize;
            // The unit's written pages, in page order.
            let mut dirty_pages = Vec::new();
            for (k, l) in locked.iter().enumerate() {
                let page = at + k as u64;
                match self.pad.page(part, slot_of(page)) {
                    None => {
                        self.table.leave(page, l.state, PageState::ZEROED);
                        self.count(Count::ZeroEvictions, 1);
                        run.out += 1;
                    }
                    Some(_) if l.state.clean() => {
                        self.table.leave(page, l.state, PageState::STORED);
                        self.count(Count::CleanEvictions, 1);
                        run.out += 1;
                    }
                    Some(content) if ztier_compress::same_filled(content) == Some(0) => {
                        self.table.leave(page, l.state, PageState::ZEROED);
                        self.count(Count::ZeroEvictions, 1);
                        run.out += 1;
                    }
                    Some(_) => dirty_pages.push(page),
                }
            }
            let (Some(&first_dirty), Some(&last_dirty)) = (dirty_pages.first(), dirty_pages.last())
            else {
                at = upto;
                continue;
            };
            let (mut from, mut to) = (first_dirty, last_dirty + 1);
            // The whole unit where the run took it all: no read-modify-write.
            if at == unit.start && upto == unit.end {
                (from, to) = (unit.start, unit.end);
            }
            scratch.clear();
            for page in from..to {
                match self.pad.page(part, slot_of(page)) {
                    Some(content) => scratch.extend_from_slice(content),
                    None => scratch.resize(scratch.len() + ps, 0),
                }
            }
            match self.device.write_bytes(from * ps as u64, &scratch) {
                Ok(()) => {
                    for &page in &dirty_pages {
                        let state = locked[(page - at) as usize].state;
                        self.table.leave(page, state, PageState::STORED);
                    }
                    self.count(Count::Evictions, dirty_pages.len() as u64);
                    run.out += dirty_pages.len();
                }
                Err(cause) => {
                    // As `settle`: the written pages stay in memory, held whole until
                    // touched; the unit is as it was (a failed write of one unit changes
                    // nothing), so the clean pages' copies stand.
                    for &page in &dirty_pages {
                        let state = locked[(page - at) as usize].state;
                        let content = self.pad.page(part, slot_of(page)).expect("written");
                        self.table.hold(page, content.into());
                        self.table.leave(page, state, PageState::HELD);
                    }
                    self.count(Count::EvictFailures, dirty_pages.len() as u64);
                    let e = Error::Store { page: from, cause };
                    self.note_error(e.to_string());
                    run.error = Some(e);
                }
            }
            drop(locked);
            at = upto;
        }
    }

    /// Why page `page` could not be moved out (`UFFDIO_MOVE` said `errno`), in the words a
    /// program's author acts on: its mapping as the kernel shows it (`/proc/self/smaps`):
    /// locked (`mlock`) or not writable (`mprotect`) are the program's doing, and stay so
    /// until it undoes them.
    fn unmovable(&self, page: u64, errno: i32) -> Error {
        let addr = self.page_addr(page);
        let reason = match mapping::flags_of(addr) {
            Some(f) if f.locked => UnmovableReason::Locked,
            Some(f) if !f.writable => UnmovableReason::ReadOnly,
            _ => UnmovableReason::Other(errno),
        };
        Error::Unmovable { page, reason }
    }

    /// Stores page `page` (locked by the caller), moved out into slot `slot` of `part`, or
    /// gone from the region if the move found none there (the slot is empty), and sets its
    /// state to say where its content is.
    fn settle(&self, page: u64, state: PageState, part: &PadPart, slot: usize) -> Result<()> {
        let Some(content) = self.pad.page(part, slot) else {
            self.drop_stored(page, state);
            self.table.leave(page, state, PageState::ZEROED);
            self.count(Count::ZeroEvictions, 1);
            return Ok(());
        };
        if state.clean() {
            // Not written since it came in from the store (a write would have waited for the
            // fault thread, which needs this page's lock to mark it dirty): the store's copy
            // is its content. Nothing to compress or write; the pad's copy is dropped.
            self.table.leave(page, state, PageState::STORED);
            self.count(Count::CleanEvictions, 1);
            return Ok(());
        }
        if ztier_compress::same_filled(content) == Some(0) {
            self.table.leave(page, state, PageState::ZEROED);
            self.count(Count::ZeroEvictions, 1);
            return Ok(());
        }
        match self.device.write_page(page, content) {
            Ok(()) => {
                self.table.leave(page, state, PageState::STORED);
                self.count(Count::Evictions, 1);
                Ok(())
            }
            Err(cause) => {
                // The page stays in memory, held whole until it is touched. Putting it back
                // with a move would need `gate`, which comes before the page lock.
                self.table.hold(page, content.into());
                self.table.leave(page, state, PageState::HELD);
                self.count(Count::EvictFailures, 1);
                let e = Error::Store { page, cause };
                self.note_error(e.to_string());
                Err(e)
            }
        }
    }

    /// Empties the pad pages [`Region::evict`](crate::Region::evict) has used, unless a call
    /// of it holds them now (the reclaim thread, idle, gives them back to the OS).
    pub(crate) fn release_manual_pad(&self) {
        if let Some(mut manual) = self.evictors.manual.try_lock() {
            let ManualPad { part, used } = &mut *manual;
            if *used > 0 {
                self.empty_pad(part, *used);
                *used = 0;
            }
        }
    }

    /// Empties `part`'s slots `[0, n)`, the last [`WARM_FRAMES`] of those present read
    /// first: the kernel's per-CPU free lists hand out the frames freed last first, so those
    /// are the new pages of this CPU's next allocations, such as a fault's copy (which writes
    /// all of its page). A page compressed on its way out was read whole already; a clean one
    /// was not, and a copy into its cold frame misses on every line (docs/diary.md,
    /// 2026-11-28). Only the last few: reading every clean page made random reads slower.
    pub(crate) fn empty_pad(&self, part: &mut PadPart, n: usize) {
        self.pad.empty(part, n, WARM_FRAMES);
    }
}

/// Pad pages read just before an emptying gives them back ([`Shared::empty_pad`]). All of
/// [`Region::evict`](crate::Region::evict)'s part of the pad, whose caller runs on the CPU
/// the frames go back to and often touches a page it pushed out soon after (as the bench's
/// single-page pass does); the last sixteenth of a reclaim batch, whose frames help a fault
/// only where the fault thread runs on the reclaim thread's CPU.
const WARM_FRAMES: usize = MANUAL_PAD;
