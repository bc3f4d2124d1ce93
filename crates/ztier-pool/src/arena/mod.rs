//! The page arena: where every allocator's pages come from and go back to.
//!
//! Memory is taken from the OS by `mmap` in 2 MiB chunks and handed out as a [`PageChain`]:
//! the pool pages (4 KiB or 16 KiB) of one zspage or block, each an owned `Page`. A chain
//! made of fresh pages is carved from one chunk in address order, so an object straddling
//! two of its pages is one slice and is read in place; the kernel, whose pages are
//! physically scattered, must copy such objects out. Chunks are mapped ahead and faulted in
//! by the process's one [`helper`] thread when a core is idle; when none is ready the
//! allocating thread maps one itself, never waiting for the helper, and asks the helper to
//! fault in a window ([`PREFAULT_WINDOW_BYTES`]) ahead of its use of that chunk.
//! Chains are handed out resident: pages not yet faulted in (from such a chunk, or
//! released) are faulted in by [`Arena::alloc_chain`] outside the arena lock, a fresh run
//! in one call. A page given back is kept resident on a small "hot" list for quick reuse;
//! past [`HOT_PAGES_MAX`] it is gathered, still resident, and once [`RELEASE_BATCH_BYTES`]
//! are, the batch is released to the OS with `madvise(MADV_DONTNEED)` (sorted, a call per
//! run of consecutive pages) and parked on the "cold" list, so the process RSS follows the
//! pages the allocators hold (plus at most the hot list, one unfilled batch and the
//! untouched rest of the newest chunk, and for the process the helper's one ready chunk,
//! and that only while allocation goes on), as `mem_used_total` promises. Each arena's
//! batch is its own: a pool that stopped freeing keeps its unfilled batch while others go
//! on allocating. Once allocation stops, the helper trims each idle arena: its hot pages,
//! its gathered ones and the pre-faulted rest of its newest chunk are released (they fault
//! in again if allocation resumes). An empty pool
//! costs no thread and no mapping of its own.
//!
//! The children: [`chain`] (the owned pages and every byte access to them), [`helper`] (the
//! process-wide thread). A chunk is a `ztier_base::mapping::Mapping`, and the arena's
//! pages are faulted in and released with that module's calls.
//!
//! Invariants:
//! - every page pointer lies inside exactly one chunk of this arena and is page aligned;
//! - a page is either owned by exactly one `Page` value, or on `hot`, `gathered`, `cold`
//!   or not yet handed out (`next_fresh`), or being released by the `free_chain` that took
//!   it off `gathered` (counted in `pages_out` meanwhile), never two of these;
//! - a chain is marked contiguous only if its pages were checked to be consecutive in one
//!   chunk;
//! - a chain is given back only to the arena it came from (each chain carries its arena's
//!   id, checked with `assert!`), so the count of pages out is exact;
//! - chunks are unmapped only when no page is out (`pages_out == 0`), so a `Page` never
//!   outlives its mapping: when the arena's state goes with its last holder (the arena, or
//!   the helper finishing a release of its gathered pages); an arena whose chains outlived
//!   it leaks its chunks instead;
//! - every byte access through a chain is checked, with overflow-checked arithmetic, to lie
//!   inside the chain before any pointer is formed.
//!
//! The module is private to the crate: no code outside the allocators can make, free or
//! address a chain.
//!
//! Locking: one mutex over the free lists, taken only when a zspage or block is created or
//! destroyed, never on the object read/write path. It nests inside the allocators' class
//! locks. Inside it, once a chunk (512 pages at 4 KiB), the process-wide `HELPER` lock is
//! taken to collect the ready chunk, and inside that the helper's slot lock, which takes no
//! other (the helper never holds it across mapping, faulting or releasing a chunk). The
//! `ARENAS` registry lock is a leaf: the helper copies the registry out under it, lets it
//! go, and only then takes each arena's lock to trim it, holding nothing else. An arena asks
//! for its window (`HELPER`, then the slot) after letting go of its own lock; the helper
//! reads the window under the arena's lock, lets it go to fault the pages in, and takes it
//! again to note them.
//!
//! This module and its children are the only `unsafe` of the allocators.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

mod chain;
mod helper;

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use ztier_base::mapping::{self, Discard, Mapping};
use ztier_base::os::page_size as os_page_size;

use chain::Page;
pub(crate) use chain::PageChain;
use helper::{helper_ask_release, helper_ask_window, helper_join, helper_leave, helper_take_ready};

use crate::{PoolError, Result};

/// Bytes taken from the OS by one `mmap`.
pub const CHUNK_BYTES: usize = 2 << 20;

/// Free pages kept resident for reuse before further frees are released to the OS.
pub const HOT_PAGES_MAX: usize = 64;

/// Bytes of free pages past the hot list gathered before they are released to the OS: a
/// zswap load pass empties the pool zspage by zspage, and one `madvise` (with its TLB
/// flush, an IPI to every other core running the process) per zspage was a large part of
/// a load pass (docs/diary.md). Once a batch is gathered the helper thread is asked to
/// release it, off the freeing thread's path: all that is gathered is taken off the list,
/// sorted and released with no lock held, one call per run of consecutive pages (few calls:
/// each call's TLB flush interrupts every core running the process). Gathered pages stay
/// resident and are reused first, so a store that follows frees neither releases nor
/// faults them in.
pub const RELEASE_BATCH_BYTES: usize = 4 << 20;

/// The most a busy machine lets gather while the helper (at idle priority) has no core: at
/// this many bytes the freeing thread releases a batch itself. RSS runs at most this ahead
/// of the hot list, and only until a core is idle.
pub const GATHERED_MAX_BYTES: usize = 4 * RELEASE_BATCH_BYTES;

/// How far ahead of an arena's use the helper faults in its newest chunk, when the chunk
/// was not faulted in whole (the arena mapped it itself: many arenas took chunks faster
/// than the one ready chunk could be refilled, as a host's devices each make their first
/// zspages). Asked for when less than half of it is left, so the pages the next allocations
/// take were zeroed by the OS on the helper's core, not on the storing thread's. Small,
/// since it is RSS ahead of use in each such arena, and trimmed with the chunk's rest.
pub const PREFAULT_WINDOW_BYTES: usize = 128 << 10;

/// The OS refused a window's `MADV_POPULATE_WRITE`: arenas stop asking for windows.
static WINDOWS_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Maps a chunk; its pages fault in when first written.
fn map_chunk() -> Result<Mapping> {
    Mapping::anonymous(CHUNK_BYTES).map_err(|e| PoolError::OutOfMemory {
        bytes: CHUNK_BYTES,
        reason: e.to_string(),
    })
}

/// Returns free pages' memory to the OS; their contents read as zero afterwards. A refusal
/// leaves them resident, costing memory only.
///
/// # Safety
/// `ptr..ptr + len` is consecutive free pages of one of the arenas' chunks that no one else
/// can reach (given back by their chain and on no list yet; the helper's ready chunk while
/// it is out of the slot; or, under the arena's lock, its hot pages or the rest of its
/// fresh run), so discarding their contents can affect no live data.
unsafe fn release(ptr: NonNull<u8>, len: usize) {
    // SAFETY: the caller's contract: pages of a live chunk no one else reaches.
    let _ = unsafe { mapping::discard(ptr, len, Discard::DontNeed) };
}

struct ArenaState {
    /// The chunks, unmapped when the state goes (see its drop).
    chunks: Vec<Mapping>,
    /// The chunks' base addresses, sorted: which chunk a page is in.
    chunk_bases: Vec<usize>,
    /// Free pages that are still resident.
    hot: Vec<NonNull<u8>>,
    /// Free pages past the hot list, still resident, gathered until a release batch is full.
    gathered: Vec<NonNull<u8>>,
    /// Free pages released to the OS (reading them gives zeros, touching faults them in).
    cold: Vec<NonNull<u8>>,
    /// The untouched tail of the newest chunk.
    next_fresh: Option<FreshRun>,
    pages_out: usize,
    /// Counts allocations and frees, so the helper can tell an idle arena.
    activity: u64,
    /// `activity` when the helper last looked (`None`: not since it last trimmed or began).
    activity_seen: Option<u64>,
    /// Hot pages the helper's trims released (for the tests, which must tell a trim's
    /// release of the hot pages from a batch's).
    #[cfg(test)]
    hot_pages_trimmed: usize,
    /// The helper was asked to release `gathered` and has not drained it yet.
    release_asked: bool,
    /// The helper was asked to fault in the fresh run's window and has not looked yet.
    window_asked: bool,
    /// Bytes in a page (for the helper, which trims through the registry).
    page_size: usize,
}

/// The untouched tail of a chunk.
#[derive(Clone, Copy)]
struct FreshRun {
    next: NonNull<u8>,
    left: usize,
    /// How many pages from `next` on are faulted in (the helper's, ahead of use: its chunk
    /// or its window); the rest are not resident yet. At most `left`.
    resident: usize,
}

impl FreshRun {
    /// The run's pages not yet faulted in that the helper's window should fault in now:
    /// `(first, pages)`, `None` if the window is still more than half full.
    fn window_to_fault(&self, page_size: usize) -> Option<(NonNull<u8>, usize)> {
        let window = (PREFAULT_WINDOW_BYTES / page_size).max(1).min(self.left);
        if self.resident * 2 >= window {
            return None;
        }
        // SAFETY: resident < window <= left, so the page is one of the run's, inside its
        // chunk.
        let first =
            unsafe { NonNull::new_unchecked(self.next.as_ptr().add(self.resident * page_size)) };
        Some((first, window - self.resident))
    }

    /// Notes that the helper faulted in `pages` pages from `first`, if they are still this
    /// run's pages and adjoin its resident ones (the run may have moved on, or to another
    /// chunk, since the helper looked).
    fn faulted_in(&mut self, first: NonNull<u8>, pages: usize, page_size: usize) {
        let next = self.next.as_ptr() as usize;
        let (start, end) = (
            first.as_ptr() as usize,
            first.as_ptr() as usize + pages * page_size,
        );
        let run_end = next + self.left * page_size;
        if next <= end && end <= run_end && start <= next + self.resident * page_size {
            self.resident = self.resident.max((end - next) / page_size);
        }
    }
}

// SAFETY: the raw pointers in ArenaState name memory the arena owns; the state is only
// reached through the Mutex, so it is moved between threads as a whole.
unsafe impl Send for ArenaState {}

/// Ids of arenas, so that a chain names the arena it must go back to.
static NEXT_ARENA_ID: AtomicU64 = AtomicU64::new(1);

/// A source of pool pages of one size.
pub(crate) struct Arena {
    /// Unique in the process (never 0); stamped on every chain made here.
    id: u64,
    page_size: usize,
    /// Shared with the registry (weakly), through which the helper trims an idle arena.
    state: Arc<Mutex<ArenaState>>,
}

/// Every live arena's state, for the helper's idle trim; dead entries are pruned as it looks.
static ARENAS: std::sync::Mutex<Vec<Weak<Mutex<ArenaState>>>> = std::sync::Mutex::new(Vec::new());

fn arenas() -> std::sync::MutexGuard<'static, Vec<Weak<Mutex<ArenaState>>>> {
    // A push or a retain: a panic leaves the list whole.
    ARENAS.lock().unwrap_or_else(|p| p.into_inner())
}

impl Arena {
    /// An arena handing out pages of `page_size` bytes (a power of two, at least the OS
    /// page size, dividing [`CHUNK_BYTES`]).
    pub fn new(page_size: usize) -> Arena {
        assert!(page_size.is_power_of_two() && page_size >= os_page_size());
        assert!(CHUNK_BYTES.is_multiple_of(page_size));
        helper_join();
        let state = Arc::new(Mutex::new(ArenaState {
            chunks: Vec::new(),
            chunk_bases: Vec::new(),
            hot: Vec::new(),
            gathered: Vec::new(),
            cold: Vec::new(),
            next_fresh: None,
            pages_out: 0,
            activity: 0,
            #[cfg(test)]
            hot_pages_trimmed: 0,
            activity_seen: None,
            release_asked: false,
            window_asked: false,
            page_size,
        }));
        arenas().push(Arc::downgrade(&state));
        Arena {
            id: NEXT_ARENA_ID.fetch_add(1, Ordering::Relaxed),
            page_size,
            state,
        }
    }

    /// Pages currently out of the arena.
    #[cfg(test)]
    pub fn pages_out(&self) -> usize {
        self.state.lock().pages_out
    }

    /// Free pages kept resident (the RSS the arena holds beyond the pages that are out).
    #[cfg(test)]
    pub fn hot_pages(&self) -> usize {
        self.state.lock().hot.len()
    }

    /// Hot pages the helper's trims of the idle arena released.
    #[cfg(test)]
    pub fn hot_pages_trimmed(&self) -> usize {
        self.state.lock().hot_pages_trimmed
    }

    /// Free pages past the hot list, resident, waiting for a release batch to fill.
    #[cfg(test)]
    pub fn gathered_pages(&self) -> usize {
        self.state.lock().gathered.len()
    }

    /// Whether the rest of the newest chunk is faulted in (came from the helper, not yet
    /// trimmed).
    #[cfg(test)]
    pub fn fresh_resident(&self) -> bool {
        self.state
            .lock()
            .next_fresh
            .is_some_and(|run| run.resident > 0)
    }

    /// The newest chunk's pages not yet handed out: where they start and how many. Neither
    /// the helper's window nor its trim moves them; only taking fresh pages does.
    #[cfg(test)]
    pub fn fresh_run(&self) -> Option<(usize, usize)> {
        self.state
            .lock()
            .next_fresh
            .map(|run| (run.next.as_ptr() as usize, run.left))
    }

    /// Takes a chain of `n` pages, resident; on failure nothing is taken. Free pages are
    /// used first (they are resident or cheap to fault in again); only a chain made wholly
    /// of fresh pages is contiguous.
    ///
    /// Pages not yet resident are faulted in here, after the arena lock is let go: a fresh
    /// run in one `MADV_POPULATE_WRITE` call, cheaper than a fault per page, released pages
    /// one touch each. So the faults
    /// of a new zspage are taken before its class lock, as the kernel's `alloc_zspage()`
    /// allocates with the class unlocked, and the first writes to it find its pages mapped.
    pub fn alloc_chain(&self, n: usize) -> Result<PageChain> {
        assert!(n > 0, "a chain has pages");
        let mut st = self.state.lock();
        st.activity += 1;
        // Each page with whether it is resident.
        let mut pages: Vec<(NonNull<u8>, bool)> = Vec::with_capacity(n);
        // A chain longer than a chunk cannot be consecutive in one mapping.
        let contiguous = n <= CHUNK_BYTES / self.page_size
            && st.hot.is_empty()
            && st.gathered.is_empty()
            && st.cold.is_empty();
        if contiguous && st.next_fresh.is_some_and(|run| run.left < n) {
            // Too few for a run: park the untouched rest as free pages, on the list that says
            // whether they are resident; take_fresh starts the next chunk.
            let FreshRun {
                next: mut p,
                left,
                resident,
            } = st.next_fresh.take().expect("checked");
            for i in 0..left {
                if i < resident {
                    &mut st.hot
                } else {
                    &mut st.cold
                }
                .push(p);
                // SAFETY: the `left` pages from p on lie in one chunk; the last step lands
                // at most one past its end, which `add` allows.
                p = unsafe { NonNull::new_unchecked(p.as_ptr().add(self.page_size)) };
            }
        }
        for _ in 0..n {
            let taken = if contiguous {
                self.take_fresh(&mut st)
            } else {
                self.take_one(&mut st)
            };
            match taken {
                Ok(page) => pages.push(page),
                Err(e) => {
                    // Back as they came: resident ones hot, the others cold (an untouched
                    // fresh page, like a released one, reads as zeros and faults in when
                    // first written).
                    st.pages_out -= pages.len();
                    for (ptr, resident) in pages {
                        if resident { &mut st.hot } else { &mut st.cold }.push(ptr);
                    }
                    return Err(e);
                }
            }
        }
        // A run begun in the old chunk's tail stays in that chunk (take_fresh moves to a new
        // chunk only when the tail is used up, and the tail held at least n pages), but the
        // unsafe in-place access rests on it, so it is checked, not assumed. Free pages are
        // listed so that a chain given back whole comes out again in address order: such a
        // chain, if it was contiguous, is again (checked the same way).
        let consecutive = pages
            .windows(2)
            .all(|w| w[1].0.as_ptr() as usize == w[0].0.as_ptr() as usize + self.page_size);
        let one_chunk = {
            let first = pages[0].0.as_ptr() as usize;
            let end = first + n * self.page_size;
            let at = st.chunk_bases.partition_point(|&b| b <= first);
            at > 0 && end <= st.chunk_bases[at - 1] + CHUNK_BYTES
        };
        // Pages taken from a chunk the arena mapped itself: the helper is asked to fault in
        // the next ones before they are wanted.
        let ask_window = contiguous
            && !st.window_asked
            && !WINDOWS_REFUSED.load(Ordering::Relaxed)
            && st
                .next_fresh
                .is_some_and(|run| run.window_to_fault(self.page_size).is_some());
        st.window_asked |= ask_window;
        drop(st);
        if ask_window && !helper_ask_window(Arc::downgrade(&self.state)) {
            // No helper runs: the pages fault in as they are taken, as before.
            self.state.lock().window_asked = false;
        }
        let contiguous_base = (consecutive && one_chunk).then(|| pages[0].0);
        if let Some(base) = contiguous_base.filter(|_| contiguous && !pages[0].1) {
            // One chunk's pages, all untouched.
            // SAFETY: n consecutive pages of one chunk (checked above), taken out of the
            // arena for this chain and not handed out yet: no one else reaches them, and
            // untouched, they read as zeros.
            unsafe { mapping::populate(base, n * self.page_size) };
        } else {
            for &(ptr, _) in pages.iter().filter(|(_, resident)| !resident) {
                // SAFETY: a page of a chunk, taken out of the arena for this chain and not
                // handed out yet; not resident (untouched or released), so reading as zeros.
                unsafe { mapping::populate(ptr, self.page_size) };
            }
        }
        let pages = pages
            .into_iter()
            .map(|(ptr, _)| Page {
                ptr,
                len: self.page_size,
            })
            .collect();
        Ok(PageChain {
            pages,
            arena: self.id,
            contiguous_base,
            page_size: self.page_size,
        })
    }

    /// Gives a chain's pages back. Pages past the hot list's capacity are gathered, and once
    /// [`RELEASE_BATCH_BYTES`] of them are, the whole batch is released to the OS: sorted,
    /// consecutive ones in one call, outside the lock, since no one else can reach them until
    /// they are on the cold list.
    ///
    /// Panics, changing nothing, if the chain came from another arena.
    pub fn free_chain(&self, chain: PageChain) {
        assert!(
            chain.pages.is_empty() || chain.arena == self.id,
            "a chain of another arena (id {}) was given back to arena {}",
            chain.arena,
            self.id
        );
        let pages = chain.pages;
        let mut released = {
            let mut st = self.state.lock();
            let batch = st.batch_pages();
            st.activity += 1;
            st.pages_out -= pages.len();
            let kept = HOT_PAGES_MAX.saturating_sub(st.hot.len()).min(pages.len());
            // Last page first: taken again, they come out in the chain's order.
            for page in pages[..kept].iter().rev() {
                st.hot.push(page.ptr);
            }
            for page in pages[kept..].iter().rev() {
                st.gathered.push(page.ptr);
            }
            if st.gathered.len() < batch {
                return;
            }
            if st.gathered.len() < GATHERED_MAX_BYTES / self.page_size {
                if st.release_asked {
                    return;
                }
                if helper_ask_release() {
                    st.release_asked = true;
                    return;
                }
            }
            // No helper, or it has had no core for a while: a batch released here. Out of
            // every list while it goes: counted as out, as a chain's pages are. An ask still
            // pending is let go, so that one the helper lost does not keep the arena from
            // asking again (the helper, if it comes, finds less than a batch and does nothing).
            st.release_asked = false;
            let from = st.gathered.len() - batch;
            let released = st.gathered.split_off(from);
            st.pages_out += released.len();
            released
        };
        // SAFETY: taken off the gathered list and counted as out under the lock: no one
        // else reaches them, and the chunks stay mapped.
        unsafe { release_sorted(&mut released, self.page_size) };
        released.reverse();
        let mut st = self.state.lock();
        st.pages_out -= released.len();
        st.cold.append(&mut released);
    }

    /// A free page, else a fresh one, with whether it is resident.
    fn take_one(&self, st: &mut ArenaState) -> Result<(NonNull<u8>, bool)> {
        if let Some(p) = st.hot.pop().or_else(|| st.gathered.pop()) {
            st.pages_out += 1;
            return Ok((p, true));
        }
        if let Some(p) = st.cold.pop() {
            st.pages_out += 1;
            return Ok((p, false));
        }
        self.take_fresh(st)
    }

    /// The next untouched page of the newest chunk, mapping a new chunk when it is used up,
    /// with whether it is resident (its chunk came from the helper).
    fn take_fresh(&self, st: &mut ArenaState) -> Result<(NonNull<u8>, bool)> {
        if st.next_fresh.is_none() {
            // The helper's chunk if one is ready. Waiting for it under this lock would
            // stall every allocating thread; instead map one here, unpopulated, whose
            // pages alloc_chain faults in as it hands them out.
            let (chunk, resident) = match helper_take_ready() {
                Some(ready) => ready,
                None => (map_chunk()?, false),
            };
            let base = chunk.ptr();
            st.chunks.push(chunk);
            let at = st
                .chunk_bases
                .partition_point(|&b| b < base.as_ptr() as usize);
            st.chunk_bases.insert(at, base.as_ptr() as usize);
            st.next_fresh = Some(FreshRun {
                next: base,
                left: CHUNK_BYTES / self.page_size,
                resident: if resident {
                    CHUNK_BYTES / self.page_size
                } else {
                    0
                },
            });
        }
        let run = st.next_fresh.take().expect("set above");
        if run.left > 1 {
            // SAFETY: run.next is inside a chunk with `left` pages from it on; the page after
            // it is the next of them, still inside the same mapping.
            let next = unsafe { NonNull::new_unchecked(run.next.as_ptr().add(self.page_size)) };
            st.next_fresh = Some(FreshRun {
                next,
                left: run.left - 1,
                resident: run.resident.saturating_sub(1),
            });
        }
        st.pages_out += 1;
        Ok((run.next, run.resident > 0))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        helper_leave();
        // The helper may hold this state (through the registry) a moment longer, releasing
        // gathered pages: nothing is left in it for a trim to touch, and the chunks go with
        // the state, once its last holder lets go (`ArenaState`'s drop).
        let mut st = self.state.lock();
        st.next_fresh = None;
        st.hot.clear();
        st.gathered.clear();
        st.cold.clear();
    }
}

impl Drop for ArenaState {
    fn drop(&mut self) {
        // The last holder is gone: the arena, or a helper step that was releasing some of
        // its pages (counted as out until it was done, and done now). Pages still out are
        // owned by a chain that outlived its allocator: leaking is the sound choice.
        // Otherwise no page is out and no one else holds the state, so nothing refers to
        // the chunks any more: they are unmapped as they drop.
        if self.pages_out != 0 {
            self.chunks.drain(..).for_each(Mapping::leak);
        }
    }
}

/// Releases free pages: sorted into runs of consecutive pages, released together
/// (`discard_runs`).
///
/// # Safety
/// The pages are free pages of the arenas' chunks, off every list and counted as out, so
/// no one else can reach them and their chunks stay mapped.
unsafe fn release_sorted(pages: &mut [NonNull<u8>], page_size: usize) {
    pages.sort_unstable();
    let addr = |i: usize| pages[i].as_ptr() as usize;
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=pages.len() {
        if i == pages.len() || addr(i) != addr(i - 1) + page_size {
            runs.push((pages[start], (i - start) * page_size));
            start = i;
        }
    }
    // SAFETY: the caller's contract: pages of live chunks no one else can reach, so
    // dropping their contents affects no live data.
    unsafe { mapping::discard_runs(&runs) };
}

impl ArenaState {
    /// Pages in a release batch ([`RELEASE_BATCH_BYTES`]) at this arena's page size.
    fn batch_pages(&self) -> usize {
        RELEASE_BATCH_BYTES / self.page_size
    }

    /// Takes the gathered pages off the list for the helper to release, counted as out
    /// meanwhile (so the arena, if dropped, leaks its chunks rather than unmap pages being
    /// released).
    fn take_gathered(&mut self) -> Vec<NonNull<u8>> {
        // Only an arena that asked, or whose gathered pages filled a batch again since:
        // another's unfilled batch stays gathered, within the bound the module promises.
        if !self.release_asked && self.gathered.len() < self.batch_pages() {
            return Vec::new();
        }
        // The list keeps its room: the frees that gather the next batch (a load pass's,
        // on the loading thread) grow no vector.
        let room = self.gathered.capacity();
        let step = std::mem::replace(&mut self.gathered, Vec::with_capacity(room));
        self.pages_out += step.len();
        self.release_asked = false;
        step
    }

    /// Releases the hot pages and the pre-faulted rest of the newest chunk, if the arena
    /// neither took nor gave back a page since the helper's last look (noted here). Returns
    /// whether anything is left resident to release later.
    fn trim_if_idle(&mut self) -> bool {
        if self.activity_seen != Some(self.activity) {
            self.activity_seen = Some(self.activity);
            return !self.hot.is_empty()
                || !self.gathered.is_empty()
                || self.next_fresh.is_some_and(|run| run.resident > 0);
        }
        #[cfg(test)]
        {
            self.hot_pages_trimmed += self.hot.len();
        }
        let mut free = std::mem::take(&mut self.hot);
        free.append(&mut self.gathered);
        // An ask the helper lost (taken as it ended, unable to map a chunk) is answered
        // here too: with the list empty, the arena may ask again.
        self.release_asked = false;
        for p in free {
            // SAFETY: a free page of this arena, hot or gathered, reached by no one but
            // through this state, whose lock the caller holds.
            unsafe { release(p, self.page_size) };
            self.cold.push(p);
        }
        if let Some(run) = self.next_fresh.as_mut().filter(|run| run.resident > 0) {
            // SAFETY: the untouched rest of the newest chunk, never handed out, reached by
            // no one but through this state, whose lock the caller holds.
            unsafe { release(run.next, run.left * self.page_size) };
            run.resident = 0;
        }
        false
    }
}

/// The helper's step for an arena that asked for its window (`PREFAULT_WINDOW_BYTES`): the
/// next pages of its fresh run faulted in, with its lock let go meanwhile, so the arena's
/// threads go on taking pages, which populating does not disturb.
fn fault_in_window(arena: &Weak<Mutex<ArenaState>>) {
    let Some(arena) = arena.upgrade() else {
        return;
    };
    let (window, page_size) = {
        let mut st = arena.lock();
        st.window_asked = false;
        let page_size = st.page_size;
        (
            st.next_fresh.and_then(|run| run.window_to_fault(page_size)),
            page_size,
        )
    };
    let Some((first, pages)) = window else {
        return;
    };
    // SAFETY: pages of one of this arena's chunks (the fresh run's, inside its chunk), and
    // the chunks stay mapped while the state lives, which `arena` holds. Populating in place
    // reads and writes no byte, so pages the arena hands out meanwhile are not disturbed.
    if unsafe { mapping::populate_in_place(first, pages * page_size) } {
        if let Some(run) = arena.lock().next_fresh.as_mut() {
            run.faulted_in(first, pages, page_size);
        }
    } else {
        // An OS without MADV_POPULATE_WRITE (before Linux 5.14): no arena asks again.
        WINDOWS_REFUSED.store(true, Ordering::Relaxed);
    }
}

/// The helper's release of the gathered pages of every arena that asked (`take_gathered`),
/// a step per hold of its lock.
fn release_gathered_arenas() {
    let live: Vec<Arc<Mutex<ArenaState>>> = {
        let mut list = arenas();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    };
    for arena in &live {
        let page_size = arena.lock().page_size;
        loop {
            let mut step = arena.lock().take_gathered();
            if step.is_empty() {
                break;
            }
            // With the lock let go: the arena's threads wait for no madvise.
            // SAFETY: taken off the gathered list and counted as out (`take_gathered`): no
            // one else reaches them, and the chunks stay mapped.
            unsafe { release_sorted(&mut step, page_size) };
            // Highest address first, so they are taken in address order.
            step.reverse();
            let mut st = arena.lock();
            st.pages_out -= step.len();
            st.cold.append(&mut step);
        }
    }
}

/// One look at every arena: those idle since the last look are trimmed. Returns whether some
/// arena still has pages to release at a later look.
fn trim_idle_arenas() -> bool {
    let live: Vec<Arc<Mutex<ArenaState>>> = {
        let mut list = arenas();
        list.retain(|w| w.strong_count() > 0);
        list.iter().filter_map(Weak::upgrade).collect()
    };
    let mut pending = false;
    for arena in &live {
        pending |= arena.lock().trim_if_idle();
    }
    pending
}

/// The arena's tests one at a time: the process's helper releases and trims every arena,
/// so one test's release or idle look would otherwise land in another's counts.
#[cfg(test)]
pub(crate) static ONE_TEST_AT_A_TIME: Mutex<()> = Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_chains_are_contiguous_and_straddles_read_in_place() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        // 512 pages a chunk: 102 chains of 5 leave 2 pages, too few for the 103rd.
        let chains: Vec<PageChain> = (0..103).map(|_| arena.alloc_chain(5).unwrap()).collect();
        assert!(chains.iter().all(PageChain::is_contiguous));
        let mut tail = arena.alloc_chain(3).unwrap();
        assert!(!tail.is_contiguous(), "the parked pages are free pages now");

        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut c = arena.alloc_chain(4).unwrap();
        for chain in [&mut c, &mut tail] {
            chain.write(4000, &data[..5000.min(chain.len() * 4096 - 4000)]);
            let n = 5000.min(chain.len() * 4096 - 4000);
            let mut back = vec![0; n];
            chain.read(4000, &mut back);
            assert_eq!(back, data[..n]);
            let mut scratch = vec![0; n];
            let mut seen = Vec::new();
            chain.with_bytes(4000, n, &mut scratch, &mut |b| seen = b.to_vec());
            assert_eq!(seen, data[..n]);
        }
        // In place: the scratch is untouched when the chain is contiguous.
        let mut scratch = vec![0xEE; 200];
        c.with_bytes(4000, 200, &mut scratch, &mut |b| {
            assert_eq!(b, &data[..200])
        });
        assert!(scratch.iter().all(|&b| b == 0xEE));
        for chain in chains.into_iter().chain([c, tail]) {
            arena.free_chain(chain);
        }
        assert_eq!(arena.pages_out(), 0);
    }

    /// A chunk the arena mapped itself (its rest not resident, as here after a trim) gets
    /// its window faulted in ahead of use: by the helper step directly, exactly the window's
    /// pages, bytes of pages out untouched; and by the process's helper when an allocation
    /// asks for it.
    #[test]
    fn a_chunk_not_faulted_in_gets_a_window_ahead_of_use() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let page = 4096;
        let window = PREFAULT_WINDOW_BYTES / page;
        let arena = Arena::new(page);
        let mut first = arena.alloc_chain(1).unwrap();
        first.write(0, &[0x5A; 4096]);
        // As if the arena had mapped the chunk itself: its rest not resident.
        let rest = |arena: &Arena| {
            let mut st = arena.state.lock();
            let run = st.next_fresh.as_mut().expect("a fresh run");
            // SAFETY: the untouched rest of the chunk, reached by no one else, under its lock.
            unsafe { release(run.next, run.left * page) };
            run.resident = 0;
            *run
        };
        let run = rest(&arena);
        assert!(run.left > window);
        fault_in_window(&Arc::downgrade(&arena.state));
        let resident = mapping::residency_at(run.next, (window + 8) * page).unwrap();
        assert!(
            resident[..window].iter().all(|&r| r),
            "the window is faulted in"
        );
        assert!(
            !resident[window..].iter().any(|&r| r),
            "nothing past the window"
        );
        assert_eq!(arena.state.lock().next_fresh.unwrap().resident, window);
        // Still more than half full: a second look faults nothing more.
        fault_in_window(&Arc::downgrade(&arena.state));
        assert_eq!(arena.state.lock().next_fresh.unwrap().resident, window);
        // Taken pages come out resident, with their count.
        let taken = arena.alloc_chain(window / 2 + 1).unwrap();
        assert!(taken
            .pages
            .iter()
            .all(|p| mapping::residency_at(p.ptr, page).unwrap()[0]));
        // The process's helper, asked by that allocation (the window was under half).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while arena.state.lock().next_fresh.unwrap().resident < window / 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the helper never faulted the window"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let mut back = vec![0; 4096];
        first.read(0, &mut back);
        assert!(back.iter().all(|&b| b == 0x5A), "a page out was disturbed");
        arena.free_chain(first);
        arena.free_chain(taken);
        let _ = rest(&arena);
    }

    /// Once allocation stops, the helper releases an idle arena's hot pages and the
    /// pre-faulted rest of its chunk; pages still out keep their bytes, and the released
    /// ones fault in again when taken.
    #[test]
    fn an_idle_arena_is_trimmed() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        // Take pages until the fresh run is a chunk the helper faulted in.
        let mut taken = Vec::new();
        while !arena.fresh_resident() {
            assert!(taken.len() < 400, "the helper never readied a chunk");
            taken.push(arena.alloc_chain(64).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for chain in taken {
            arena.free_chain(chain);
        }
        let mut kept = arena.alloc_chain(1).unwrap();
        kept.write(0, &[0xA5; 4096]);
        assert!(arena.hot_pages() > 0 && arena.fresh_resident());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while (arena.hot_pages() + arena.gathered_pages() > 0 || arena.fresh_resident())
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(
            arena.hot_pages(),
            0,
            "hot pages kept after allocation stopped"
        );
        assert_eq!(arena.gathered_pages(), 0, "gathered pages kept");
        assert!(!arena.fresh_resident(), "the chunk's rest kept resident");
        let mut back = vec![0; 4096];
        kept.read(0, &mut back);
        assert!(back.iter().all(|&b| b == 0xA5), "a page out was touched");
        let mut again = arena.alloc_chain(4).unwrap();
        again.write(100, &[7; 8000]);
        let mut out = vec![0; 8000];
        again.read(100, &mut out);
        assert!(out.iter().all(|&b| b == 7));
        arena.free_chain(again);
        arena.free_chain(kept);
    }

    #[test]
    fn pages_are_distinct_and_writable() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        // 75 chains of 8 span two chunks.
        let mut chains: Vec<PageChain> = (0..75).map(|_| arena.alloc_chain(8).unwrap()).collect();
        for (i, c) in chains.iter_mut().enumerate() {
            for (j, p) in c.pages.iter_mut().enumerate() {
                p.bytes_mut().fill((i * 8 + j) as u8);
            }
        }
        for (i, c) in chains.iter().enumerate() {
            for (j, p) in c.pages.iter().enumerate() {
                assert!(p.bytes().iter().all(|&b| b == (i * 8 + j) as u8));
            }
        }
        assert_eq!(arena.pages_out(), 600);
        for c in chains {
            arena.free_chain(c);
        }
        assert_eq!(arena.pages_out(), 0);
        assert_eq!(arena.hot_pages(), HOT_PAGES_MAX);
        assert_eq!(arena.gathered_pages(), 600 - HOT_PAGES_MAX);
    }

    /// Pages past the hot list are gathered, resident, until a batch is full; then the
    /// helper releases them (zeroed when taken again), and the pages out stay counted.
    #[test]
    fn released_pages_come_back_zeroed() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(16384);
        let batch = RELEASE_BATCH_BYTES / 16384;
        let mut chain = arena.alloc_chain(HOT_PAGES_MAX + batch - 1).unwrap();
        for p in chain.pages.iter_mut() {
            p.bytes_mut().fill(0xAB);
        }
        let mut one = arena.alloc_chain(1).unwrap();
        one.pages[0].bytes_mut().fill(0xAB);
        arena.free_chain(chain);
        assert_eq!(arena.gathered_pages(), batch - 1, "gathered, not released");
        arena.free_chain(one);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // The batch's pages count as out while the helper releases them.
        while arena.gathered_pages() > 0 || arena.pages_out() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the helper never released the batch"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let again = arena.alloc_chain(HOT_PAGES_MAX + batch).unwrap();
        // Exact whenever a trim came: after the taking, the hot list is empty.
        let trimmed = arena.hot_pages_trimmed();
        assert!(!again.is_contiguous(), "made of freed pages");
        let zeroed = again
            .pages
            .iter()
            .filter(|p| p.bytes().iter().all(|&b| b == 0))
            .count();
        // The hot pages too, if the helper found the arena idle meanwhile and trimmed it.
        assert_eq!(
            zeroed,
            batch + trimmed,
            "pages past the hot list were released to the OS, the hot ones only by a trim"
        );
        arena.free_chain(again);
    }

    #[test]
    #[should_panic(expected = "another arena")]
    fn a_chain_cannot_be_freed_into_another_arena() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let a = Arena::new(4096);
        let b = Arena::new(4096);
        let chain = a.alloc_chain(1).unwrap();
        // Were it taken, dropping `b` would unmap a page `a` still counts as out.
        b.free_chain(chain);
    }

    #[test]
    fn a_chain_longer_than_a_chunk_is_not_contiguous_and_overwrites_nothing() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        let per_chunk = CHUNK_BYTES / 4096;
        let mut before: Vec<PageChain> = (0..32).map(|_| arena.alloc_chain(8).unwrap()).collect();
        let mut big = arena.alloc_chain(per_chunk + 8).unwrap();
        let mut after: Vec<PageChain> = (0..32).map(|_| arena.alloc_chain(8).unwrap()).collect();
        assert!(!big.is_contiguous(), "its pages span two mappings");
        for (i, c) in before.iter_mut().chain(after.iter_mut()).enumerate() {
            c.write(0, &vec![i as u8; 8 * 4096]);
        }
        big.write(0, &vec![0xEE; big.len() * 4096]);
        let mut back = vec![0; 8 * 4096];
        for (i, c) in before.iter().chain(after.iter()).enumerate() {
            c.read(0, &mut back);
            assert!(back.iter().all(|&b| b == i as u8), "chain {i} overwritten");
        }
        let mut all = vec![0; big.len() * 4096];
        big.read(0, &mut all);
        assert!(all.iter().all(|&b| b == 0xEE));
        for c in before.into_iter().chain(after).chain([big]) {
            arena.free_chain(c);
        }
    }

    #[test]
    #[should_panic(expected = "outside the chain")]
    fn a_write_whose_end_overflows_is_refused() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        let mut chain = arena.alloc_chain(2).unwrap();
        assert!(chain.is_contiguous());
        chain.write(usize::MAX - 7, &[0xAB; 16]);
    }

    #[test]
    #[should_panic(expected = "outside the chain")]
    fn a_read_whose_end_overflows_is_refused() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        let chain = arena.alloc_chain(2).unwrap();
        let mut out = [0; 16];
        chain.read(usize::MAX - 7, &mut out);
    }

    #[test]
    #[should_panic(expected = "outside the chain")]
    fn a_scattered_chain_refuses_ranges_past_its_end() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        let (a, b, c) = (
            arena.alloc_chain(1).unwrap(),
            arena.alloc_chain(1).unwrap(),
            arena.alloc_chain(1).unwrap(),
        );
        // Taken again last freed first: c, then a, which are not consecutive.
        arena.free_chain(a);
        arena.free_chain(c);
        let mut chain = arena.alloc_chain(2).unwrap();
        assert!(!chain.is_contiguous(), "made of freed pages, apart");
        arena.free_chain(b);
        chain.write(2 * 4096 - 8, &[1; 16]);
    }

    /// A chain given back whole and taken again at its length is its old pages in order, so
    /// a contiguous one is contiguous again; pages taken out of order are not.
    #[test]
    fn a_chain_given_back_whole_comes_back_contiguous() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        let a = arena.alloc_chain(4).unwrap();
        let b = arena.alloc_chain(4).unwrap();
        assert!(a.is_contiguous() && b.is_contiguous());
        let a_base = a.pages[0].ptr;
        arena.free_chain(b);
        arena.free_chain(a);
        let mut again = arena.alloc_chain(4).unwrap();
        assert_eq!(again.pages[0].ptr, a_base);
        assert!(again.is_contiguous(), "a's pages, in order");
        let data: Vec<u8> = (0..8000u32).map(|i| (i % 253) as u8).collect();
        again.write(3000, &data);
        let mut back = vec![0; 8000];
        again.read(3000, &mut back);
        assert_eq!(back, data);
        // b's pages are next, then the chunk's untouched pages after them: consecutive in
        // one chunk, so contiguous too.
        let more = arena.alloc_chain(6).unwrap();
        assert!(more.is_contiguous());
        // Given back in two pieces, taken as one chain in another order: not consecutive.
        let (x, y) = (arena.alloc_chain(1).unwrap(), arena.alloc_chain(1).unwrap());
        arena.free_chain(x);
        arena.free_chain(y);
        let swapped = arena.alloc_chain(2).unwrap();
        assert!(!swapped.is_contiguous(), "y's page, then x's");
        arena.free_chain(swapped);
        arena.free_chain(again);
        arena.free_chain(more);
    }

    fn resident(page: &Page) -> bool {
        let pages = mapping::residency_at(page.ptr, page.len).expect("mincore");
        assert_eq!(pages.len(), page.len / os_page_size());
        pages.into_iter().all(|r| r)
    }

    #[test]
    fn chains_come_back_resident() {
        let _one = ONE_TEST_AT_A_TIME.lock();
        let arena = Arena::new(4096);
        // Three chunks' worth at once: the helper has at most one ready, so the others are
        // mapped by this thread unpopulated, and alloc_chain must fault them in.
        let chains: Vec<PageChain> = (0..192).map(|_| arena.alloc_chain(8).unwrap()).collect();
        let all = |cs: &[PageChain]| cs.iter().flat_map(|c| c.pages.iter()).all(resident);
        assert!(all(&chains), "fresh pages");
        let fresh_before = arena.fresh_run();
        for c in chains {
            arena.free_chain(c);
        }
        // Past the hot list, a full batch (1024 pages) is released by the helper.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let batch = RELEASE_BATCH_BYTES / 4096;
        while (arena.gathered_pages() >= batch || arena.pages_out() > 0)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let resident_free = arena.hot_pages() + arena.gathered_pages();
        assert!(resident_free < 1536, "the helper released no batch");
        // Taking every resident free page and 64 more reaches released ones, which are
        // faulted in again when taken.
        let n = resident_free.div_ceil(8) + 8;
        let again: Vec<PageChain> = (0..n).map(|_| arena.alloc_chain(8).unwrap()).collect();
        assert_eq!(
            arena.fresh_run(),
            fresh_before,
            "taken from free pages, not fresh"
        );
        assert_eq!(arena.pages_out(), n * 8);
        assert!(all(&again), "hot and released pages");
        for c in again {
            arena.free_chain(c);
        }
    }
}
