//! The region's pages as the protocol sees them (lib.rs): each page's state
//! ([`PageState`], a byte in the table) and lock, the gate under which the program's
//! changes to its address space reach the table, how many pages are resident, stored and
//! clean, and the whole copies of pages the store refused. The one way to a page an
//! evictor may move out is a [`MovableRun`], made here under the gate and the pages' locks.
//!
//! Invariants: a page's state and the counts change together under the page's lock, in
//! [`PageTable::leave`], or for a run of pages in [`PageTable::leave_run`] under all their
//! locks, the counts changed once after the run's states (the clock's clearing of a
//! referenced bit is the one change made without a lock, page_state.rs); a page leaves
//! the region (unmapped, gone) only under `gate` (write): the fault thread handles the
//! program's unmap or remap holding it, and until such an event is read the kernel refuses
//! every move (`EAGAIN`), so a page read resident under `gate` (read) is the region's for
//! as long as that is held.
//!
//! Lock order (lib.rs, DESIGN.md): `gate` → `locks[page % STRIPES]` → (the device's locks)
//! and `held`, a leaf. Page locks, several at once: the fault thread takes a faulting page's
//! and then its fault-around neighbours' in page order, waiting for each; an evictor waits
//! only for the first page of its run and tries the others ([`PageTable::lock_run`]), so it
//! never waits holding one; everyone else holds one at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard};
use ztier_base::shard::Stripes;

use crate::page_state::{Kind, PageState, PageStates};

/// Page lock stripes: page `p`'s is stripe `p % STRIPES`. A fault-around window (at most
/// 1024 pages) is shorter, so the fault thread's several locks are distinct stripes.
pub(crate) const STRIPES: usize = 1024;

pub(crate) struct PageTable {
    states: PageStates,
    /// The page locks (`ztier_base::shard::Stripes`).
    locks: Stripes,
    /// Held (write) by the fault thread while it reads and handles the userfaultfd's
    /// messages, and while it is parked in a blocking read between faults; (read) by an
    /// evictor while it checks pages and moves them, and by the figures, each through
    /// `Shared::gate_read`, which rings a parked fault thread out first (bell.rs).
    pub(crate) gate: RwLock<()>,
    resident: AtomicU64,
    stored: AtomicU64,
    /// Resident pages that are clean.
    clean: AtomicU64,
    /// Pages the store refused, whole, by page (a leaf lock).
    held: Mutex<HashMap<u64, Box<[u8]>>>,
}

impl PageTable {
    /// A table of `pages` empty pages (none resident), or `None` if its memory cannot be
    /// had (it is taken only where pages are: page_state.rs).
    pub(crate) fn new(pages: u64) -> Option<PageTable> {
        Some(PageTable {
            states: PageStates::new(pages)?,
            locks: Stripes::new(STRIPES),
            gate: RwLock::new(()),
            resident: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            clean: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
        })
    }

    #[inline]
    pub(crate) fn state(&self, page: u64) -> PageState {
        self.states.get(page)
    }

    /// Page `page`'s lock, waited for.
    #[inline]
    pub(crate) fn lock(&self, page: u64) -> MutexGuard<'_, ()> {
        self.locks.lock(page)
    }

    /// Leaves `page`'s state `from` for `to` (its lock held), keeping the counts and
    /// dropping a held copy it leaves behind.
    pub(crate) fn leave(&self, page: u64, from: PageState, to: PageState) {
        self.leave_run(page, [(from, to)]);
    }

    /// As [`leave`](Self::leave) for each page of the run from `first` on (all their locks
    /// held), given as (from, to) in page order: each count changed once for the whole run,
    /// not once a page (a fault-around window is up to a thousand pages).
    pub(crate) fn leave_run(
        &self,
        first: u64,
        pages: impl IntoIterator<Item = (PageState, PageState)>,
    ) {
        let mut counts = Counts::default();
        for (page, (from, to)) in (first..).zip(pages) {
            if from.is(Kind::Held) {
                self.held.lock().remove(&page);
            }
            counts.add(from, -1);
            counts.add(to, 1);
            self.states.set(page, to);
        }
        for (count, change) in [
            (&self.resident, counts.resident),
            (&self.stored, counts.stored),
            (&self.clean, counts.clean),
        ] {
            if change != 0 {
                // Two's complement: adding a negative change as u64 subtracts it.
                count.fetch_add(change as u64, Relaxed);
            }
        }
    }

    /// The clock passes a referenced page: it loses its second chance.
    #[inline]
    pub(crate) fn clear_referenced(&self, page: u64) {
        self.states.clear_referenced(page);
    }

    /// A resident page the kernel would not move out (its lock held): a second chance
    /// before the next try.
    pub(crate) fn mark_referenced(&self, page: u64) {
        self.states.mark_referenced(page);
    }

    pub(crate) fn resident(&self) -> u64 {
        self.resident.load(Relaxed)
    }

    pub(crate) fn stored(&self) -> u64 {
        self.stored.load(Relaxed)
    }

    pub(crate) fn clean(&self) -> u64 {
        self.clean.load(Relaxed)
    }

    pub(crate) fn held_pages(&self) -> u64 {
        self.held.lock().len() as u64
    }

    /// Keeps `copy` as page `page`'s content (its lock held; its state about to say held).
    pub(crate) fn hold(&self, page: u64, copy: Box<[u8]>) {
        self.held.lock().insert(page, copy);
    }

    /// Takes page `page`'s held copy (its lock held), to copy it in or out.
    pub(crate) fn take_held(&self, page: u64) -> Option<Box<[u8]>> {
        self.held.lock().remove(&page)
    }

    /// The run an evictor may move out from `first`, at most `max` pages (at least one),
    /// under `gate` (read, of this table): `first` if it is resident (its lock waited for),
    /// then the pages after it that are cold (resident, not referenced) and whose locks
    /// are free. `None` if `first` is not resident.
    pub(crate) fn lock_run<'t, 'g>(
        &'t self,
        gate: &'g RwLockReadGuard<'t, ()>,
        first: u64,
        max: usize,
    ) -> Option<MovableRun<'t, 'g>> {
        assert!(
            std::ptr::eq(RwLockReadGuard::rwlock(gate), &self.gate),
            "a run is locked under its own table's gate"
        );
        let lock = self.locks.lock(first);
        let state = self.state(first);
        if !state.is(Kind::Resident) {
            return None;
        }
        let mut pages = Vec::with_capacity(max);
        pages.push(LockedPage { state, _lock: lock });
        while pages.len() < max {
            let page = first + pages.len() as u64;
            // Looked at before its lock is tried, and again under it.
            if !self.state(page).cold() {
                break;
            }
            let Some(lock) = self.locks.try_lock(page) else {
                break;
            };
            let state = self.state(page);
            if !state.cold() {
                break;
            }
            pages.push(LockedPage { state, _lock: lock });
        }
        Some(MovableRun {
            first,
            pages,
            _gate: gate,
        })
    }
}

/// Changes to the table's counts of resident, stored and clean pages, gathered over a run.
#[derive(Default)]
struct Counts {
    resident: i64,
    stored: i64,
    clean: i64,
}

impl Counts {
    /// A page in `state` counted `by` (1 entering it, -1 leaving it).
    fn add(&mut self, state: PageState, by: i64) {
        match state.kind() {
            Kind::Resident => {
                self.resident += by;
                if state.clean() {
                    self.clean += by;
                }
            }
            Kind::Stored => self.stored += by,
            _ => {}
        }
    }
}

/// A page whose lock is held, and its state when it was taken.
pub(crate) struct LockedPage<'t> {
    pub(crate) state: PageState,
    _lock: MutexGuard<'t, ()>,
}

/// Region pages `[first, first + len)` read resident under `gate` (read) with their locks
/// held ([`PageTable::lock_run`]): the region's own while it lives (the module's
/// invariants), so a move may take them out into the pad (mapping.rs). Given up for its
/// locks alone ([`MovableRun::into_pages`]) once the moves are done, so the gate can go
/// while the pages are settled.
pub(crate) struct MovableRun<'t, 'g> {
    first: u64,
    pages: Vec<LockedPage<'t>>,
    _gate: &'g RwLockReadGuard<'t, ()>,
}

impl<'t> MovableRun<'t, '_> {
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }

    /// The run's pages, still locked, no longer movable.
    pub(crate) fn into_pages(self) -> Vec<LockedPage<'t>> {
        self.pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_state::tests::every_state;
    use proptest::prelude::*;

    const PAGES: u64 = 64;

    /// The counts as the model has them: every page's state looked at.
    fn counted(table: &PageTable) -> (u64, u64, u64) {
        let all: Vec<PageState> = (0..PAGES).map(|p| table.state(p)).collect();
        let count = |f: &dyn Fn(&PageState) -> bool| all.iter().filter(|s| f(s)).count() as u64;
        (
            count(&|s| s.is(Kind::Resident)),
            count(&|s| s.is(Kind::Stored)),
            count(&|s| s.is(Kind::Resident) && s.clean()),
        )
    }

    proptest! {
        /// Runs of pages left together keep the counts as page-by-page leaving does: equal
        /// to the states' own count after every step, whichever way the pages went.
        #[test]
        fn a_run_left_at_once_keeps_the_counts_as_its_pages_one_by_one(
            steps in prop::collection::vec(
                (
                    0..PAGES,
                    1..PAGES,
                    prop::collection::vec(any::<prop::sample::Index>(), 64),
                    any::<bool>(),
                ),
                1..40,
            )
        ) {
            let table = PageTable::new(PAGES).expect("a small table");
            let states = every_state();
            for (first, len, to, as_run) in steps {
                let len = len.min(PAGES - first);
                let pages = (first..first + len)
                    .map(|p| (table.state(p), *to[(p - first) as usize].get(&states)));
                if as_run {
                    table.leave_run(first, pages.collect::<Vec<_>>());
                } else {
                    for (p, (from, to)) in (first..).zip(pages.collect::<Vec<_>>()) {
                        table.leave(p, from, to);
                    }
                }
                prop_assert_eq!(
                    (table.resident(), table.stored(), table.clean()),
                    counted(&table)
                );
            }
        }
    }
}
