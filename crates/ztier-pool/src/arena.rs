//! The page arena: where every allocator's pages come from and go back to.
//!
//! Memory is taken from the OS by `mmap` in 2 MiB chunks and handed out as a [`PageChain`]:
//! the pool pages (4 KiB or 16 KiB) of one zspage or block, each an owned [`Page`]. A chain
//! made of fresh pages is carved from one chunk in address order, so an object straddling
//! two of its pages is one slice and is read in place; the kernel, whose pages are
//! physically scattered, must copy such objects out. One helper thread for the whole process,
//! started with its first arena and ended with its last, maps chunks ahead and faults them
//! in, keeping one ready for whichever arena needs a chunk next, so the kernel's zeroing
//! of fresh pages (8 % of the store path when it was inline) runs beside the store path
//! instead of on it. It runs at idle priority, on a core that would otherwise be idle. When
//! none is ready the allocating thread maps one itself, never waiting for the helper.
//! Chains are handed out resident: pages not yet faulted in (from such a chunk, or
//! released) are faulted in by [`Arena::alloc_chain`] outside the arena lock, a fresh run
//! in one call. A page given back is kept resident on a small "hot" list for quick reuse;
//! past [`HOT_PAGES_MAX`] it is gathered, still resident, and once [`RELEASE_BATCH_BYTES`]
//! are, the batch is released to the OS with `madvise(MADV_DONTNEED)` (sorted, a call per
//! run of consecutive pages) and parked on the "cold" list, so the process RSS follows the
//! pages the allocators hold (plus at most the hot list, one unfilled batch and the
//! untouched rest of the newest chunk, and for the process the
//! helper's one ready chunk, and that only while allocation goes on), as `mem_used_total`
//! promises. Once allocation stops, the helper gives those back too: a second after its ready
//! chunk went unused, and then every 250 ms while any is left, each arena that neither took
//! nor gave back a page since the last look has its hot pages and the pre-faulted rest of
//! its newest chunk released (they fault in again if allocation resumes). An empty pool
//! costs no thread and no mapping of its own.
//!
//! Invariants:
//! - every page pointer lies inside exactly one chunk of this arena and is page aligned;
//! - a page is either owned by exactly one [`Page`] value, or on `hot`, `gathered`, `cold`
//!   or not yet handed out (`next_fresh`), or being released by the `free_chain` that took
//!   it off `gathered` (counted in `pages_out` meanwhile), never two of these;
//! - a chain is marked contiguous only if its pages were checked to be consecutive in one
//!   chunk;
//! - a chain is given back only to the arena it came from (each chain carries its arena's
//!   id, checked with `assert!`), so the count of pages out is exact;
//! - chunks are unmapped only when no page is out (`pages_out == 0`), so a [`Page`] never
//!   outlives its mapping; an arena dropped with pages still out leaks its chunks instead;
//! - every byte access through a chain is checked, with overflow-checked arithmetic, to lie
//!   inside the chain before any pointer is formed.
//!
//! The module is private to the crate: no code outside the allocators can make, free or
//! address a chain.
//! - a chunk the helper maps is its own until an arena takes it from the helper's slot, then
//!   the arena's; when the last arena goes, the helper unmaps the chunk in its slot and ends;
//!   a ready chunk left untaken for a second has its pages released (offered as not resident).
//!
//! Locking: one mutex over the free lists, taken only when a zspage or block is created or
//! destroyed, never on the object read/write path. It nests inside the allocators' class
//! locks. Inside it, once a chunk (512 pages at 4 KiB), the process-wide `HELPER` lock is
//! taken to collect the ready chunk, and inside that the helper's slot lock, which takes no
//! other (the helper never holds it across mapping, faulting or releasing a chunk). The
//! `ARENAS` registry lock is a leaf: the helper copies the registry out under it, lets it
//! go, and only then takes each arena's lock to trim it, holding nothing else.
//!
//! This module and nothing else in the allocators uses `unsafe`.
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::{PoolError, Result};

/// Bytes taken from the OS by one `mmap`.
pub const CHUNK_BYTES: usize = 2 << 20;

/// Free pages kept resident for reuse before further frees are released to the OS.
pub const HOT_PAGES_MAX: usize = 64;

/// Bytes of free pages past the hot list gathered before they are released to the OS: a
/// zswap load pass empties the pool zspage by zspage, and one `madvise` (with its TLB
/// flush, an IPI to every other core running the process) per zspage was 21 % of a load
/// pass. Once a batch is gathered the helper thread is asked to release it, off the freeing
/// thread's path: all that is gathered is taken off the list, sorted and released with no
/// lock held, one call per run of consecutive pages (few calls: each call's TLB flush
/// interrupts every core running the process). Gathered pages stay resident and are reused
/// first, so a store that follows frees neither releases nor faults them in.
pub const RELEASE_BATCH_BYTES: usize = 4 << 20;

/// The most a busy machine lets gather while the helper (at idle priority) has no core: at
/// this many bytes the freeing thread releases a batch itself. RSS runs at most this ahead
/// of the hot list, and only until a core is idle.
pub const GATHERED_MAX_BYTES: usize = 4 * RELEASE_BATCH_BYTES;

/// One pool page, owned: the only handle to its memory while it is out of the arena.
///
/// Owning a `Page` is what makes reading and writing it safe: no other `Page` value points
/// at the same memory (arena invariant), so `&Page` and `&mut Page` carry Rust's usual
/// aliasing guarantees over the bytes.
#[derive(Debug)]
pub(crate) struct Page {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Page uniquely owns its memory (arena invariant), like a Box<[u8]>; moving it to
// another thread moves that ownership, and shared references only read.
unsafe impl Send for Page {}
// SAFETY: &Page gives only read access to the bytes (see `bytes`), so sharing is sound.
unsafe impl Sync for Page {}

impl Page {
    /// The page's bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a mapped, page-aligned range owned by this Page alone
        // (arena invariant); the mapping outlives the Page because chunks are unmapped only
        // when no page is out.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The page's bytes, mutable.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; &mut self guarantees no other reference to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The pages of one zspage or block, in chain order, owned together.
///
/// When the arena could hand them out as consecutive addresses of one mapping (a fresh
/// chain, carved from a chunk's untouched tail), an object that straddles two of them is
/// read and written in place. Otherwise it is copied piece by piece, as the kernel must
/// always do, its pages being physically scattered. Only the arena makes chains, so
/// `contiguous` is true only when it is.
#[derive(Debug, Default)]
pub(crate) struct PageChain {
    pages: Box<[Page]>,
    /// The id of the arena the pages came from (0 for the empty chain).
    arena: u64,
    /// Set when pages[i + 1] starts where pages[i] ends, all inside one chunk: the first
    /// page's address, kept here so that an access needs no trip through `pages` (one cache
    /// miss fewer on every object read and write).
    contiguous_base: Option<NonNull<u8>>,
    /// Bytes in each page (0 for an empty chain), kept here for the same reason.
    page_size: usize,
}

// SAFETY: `contiguous_base` only repeats the address of pages[0], which the chain owns with
// the rest of its pages; the chain is Send and Sync as its Pages are.
unsafe impl Send for PageChain {}
// SAFETY: as for Send: through &PageChain the bytes are only read.
unsafe impl Sync for PageChain {}

impl PageChain {
    /// Pages in the chain (0 once given back).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Whether objects that straddle pages are reached in place.
    #[cfg(test)]
    pub fn is_contiguous(&self) -> bool {
        self.contiguous_base.is_some()
    }

    fn page_size(&self) -> usize {
        self.page_size
    }

    /// The page-sized pieces of `off..off + len`, as (page, offset in it, offset in the
    /// range, length): one piece when the range lies in one page.
    fn pieces(&self, off: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        let page_size = self.page_size();
        let mut done = 0;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let at = off + done;
                let (p, in_page) = (at / page_size, at % page_size);
                let n = (page_size - in_page).min(len - done);
                done += n;
                (p, in_page, done - n, n)
            })
        })
    }

    /// Panics unless `off..off + len` lies inside the chain. Every access checks this first,
    /// so no arithmetic below can overflow and no page index can run past the chain.
    #[inline]
    pub fn check_range(&self, off: usize, len: usize) {
        // The Box's length lives beside its pointer, so this reads no page descriptor.
        let bytes = self.page_size * self.pages.len();
        let inside = off.checked_add(len).is_some_and(|end| end <= bytes);
        assert!(
            inside,
            "bytes {off}..+{len} are outside the chain of {bytes} bytes"
        );
    }

    /// Where a range that lies in one page does: (page, offset in it). The range is inside
    /// the chain (`check_range`), so `in_page + len` cannot overflow.
    fn within_page(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        let page_size = self.page_size();
        let (p, in_page) = (off / page_size, off % page_size);
        (in_page + len <= page_size).then_some((p, in_page))
    }

    /// Where a contiguous chain's range starts, checked to lie inside the chain.
    #[inline]
    fn contiguous_start(&self, off: usize, len: usize) -> Option<*mut u8> {
        let base = self.contiguous_base?;
        self.check_range(off, len);
        // SAFETY: off + len is inside the chain (checked just above, without overflow), and
        // the chain's pages are consecutive in one mapping (`contiguous_base` is set only by
        // `Arena::alloc_chain`, after checking each page's address).
        Some(unsafe { base.as_ptr().add(off) })
    }

    /// `off..off + len` as one slice, if the chain is contiguous or it lies in one page.
    /// Panics if the range is not inside the chain.
    #[inline]
    fn span(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.check_range(off, len);
        if let Some(start) = self.contiguous_start(off, len) {
            // SAFETY: start..start + len lies in pages this chain alone owns, in one mapping
            // (contiguous_start); &self keeps them from being written meanwhile.
            return Some(unsafe { std::slice::from_raw_parts(start, len) });
        }
        let (p, in_page) = self.within_page(off, len)?;
        Some(&self.pages[p].bytes()[in_page..in_page + len])
    }

    /// As `span`, mutable.
    #[inline]
    fn span_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        self.check_range(off, len);
        if let Some(start) = self.contiguous_start(off, len) {
            // SAFETY: as in `span`; &mut self makes the access exclusive.
            return Some(unsafe { std::slice::from_raw_parts_mut(start, len) });
        }
        let (p, in_page) = self.within_page(off, len)?;
        Some(&mut self.pages[p].bytes_mut()[in_page..in_page + len])
    }

    /// Copies `out.len()` bytes starting `off` bytes into the chain. Panics if they are not
    /// all inside it.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        if let Some(bytes) = self.span(off, out.len()) {
            out.copy_from_slice(bytes);
            return;
        }
        for (p, in_page, at, n) in self.pieces(off, out.len()) {
            out[at..at + n].copy_from_slice(&self.pages[p].bytes()[in_page..in_page + n]);
        }
    }

    /// The little-endian `u64` at `off` (an object header): one load where the 8 bytes lie
    /// in one piece, not a call to `memmove` (2 % of a zswap load pass). Panics if they are
    /// not all inside the chain.
    #[inline]
    pub fn read_u64_le(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        match self.span(off, 8) {
            Some(bytes) => b.copy_from_slice(bytes),
            None => self.read(off, &mut b),
        }
        u64::from_le_bytes(b)
    }

    /// Copies `data` to `off` bytes into the chain. Panics if that is not all inside it.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        if let Some(bytes) = self.span_mut(off, data.len()) {
            bytes.copy_from_slice(data);
            return;
        }
        for (p, in_page, at, n) in self.pieces(off, data.len()) {
            self.pages[p].bytes_mut()[in_page..in_page + n].copy_from_slice(&data[at..at + n]);
        }
    }

    /// Whether `with_bytes` shows `off..off + len` in place (no scratch needed).
    pub fn is_in_place(&self, off: usize, len: usize) -> bool {
        self.contiguous_base.is_some() || self.within_page(off, len).is_some()
    }

    /// Calls `f` with the `len` bytes at `off`: in place when they lie in one page or the
    /// chain is contiguous, else copied into `scratch` (which must hold `len` bytes). Panics
    /// if the range is not inside the chain.
    pub fn with_bytes(&self, off: usize, len: usize, scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) {
        match self.span(off, len) {
            Some(bytes) => f(bytes),
            None => {
                self.read(off, &mut scratch[..len]);
                f(&scratch[..len]);
            }
        }
    }
}

struct Chunk {
    base: NonNull<u8>,
}

struct ArenaState {
    chunks: Vec<Chunk>,
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
    /// The helper was asked to release `gathered` and has not drained it yet.
    release_asked: bool,
    /// Bytes in a page (for the helper, which trims through the registry).
    page_size: usize,
}

/// The untouched tail of a chunk.
#[derive(Clone, Copy)]
struct FreshRun {
    next: NonNull<u8>,
    left: usize,
    /// The helper faulted the chunk in; else its pages are not resident yet.
    resident: bool,
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
            activity_seen: None,
            release_asked: false,
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

    /// Free pages past the hot list, resident, waiting for a release batch to fill.
    #[cfg(test)]
    pub fn gathered_pages(&self) -> usize {
        self.state.lock().gathered.len()
    }

    /// Whether the rest of the newest chunk is faulted in (came from the helper, not yet
    /// trimmed).
    #[cfg(test)]
    pub fn fresh_resident(&self) -> bool {
        self.state.lock().next_fresh.is_some_and(|run| run.resident)
    }

    /// Takes a chain of `n` pages, resident; on failure nothing is taken. Free pages are
    /// used first (they are resident or cheap to fault in again); only a chain made wholly
    /// of fresh pages is contiguous.
    ///
    /// Pages not yet resident are faulted in here, after the arena lock is let go: a fresh
    /// run in one `MADV_POPULATE_WRITE` call, cheaper than a fault per page (1.55 against
    /// 2.15 us a page on this project's VM), released pages one touch each. So the faults
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
            for _ in 0..left {
                if resident { &mut st.hot } else { &mut st.cold }.push(p);
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
        drop(st);
        let contiguous_base = (consecutive && one_chunk).then(|| pages[0].0);
        if let Some(base) = contiguous_base.filter(|_| contiguous && !pages[0].1) {
            // One chunk's pages, all untouched.
            populate(base, n * self.page_size);
        } else {
            for &(ptr, _) in pages.iter().filter(|(_, resident)| !resident) {
                populate(ptr, self.page_size);
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
        let batch = RELEASE_BATCH_BYTES / self.page_size;
        let mut released = {
            let mut st = self.state.lock();
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
            // every list while it goes: counted as out, as a chain's pages are.
            let from = st.gathered.len() - batch;
            let released = st.gathered.split_off(from);
            st.pages_out += released.len();
            released
        };
        release_sorted(&mut released, self.page_size);
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
            let (base, resident) = match helper_take_ready() {
                Some(ready) => ready,
                None => (map_chunk()?, false),
            };
            st.chunks.push(Chunk { base });
            let at = st
                .chunk_bases
                .partition_point(|&b| b < base.as_ptr() as usize);
            st.chunk_bases.insert(at, base.as_ptr() as usize);
            st.next_fresh = Some(FreshRun {
                next: base,
                left: CHUNK_BYTES / self.page_size,
                resident,
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
                ..run
            });
        }
        st.pages_out += 1;
        Ok((run.next, run.resident))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        helper_leave();
        // The helper may hold this state (through the registry) a moment longer: nothing is
        // left in it for a trim to touch once the chunks go.
        let mut st = self.state.lock();
        st.next_fresh = None;
        st.hot.clear();
        st.gathered.clear();
        st.cold.clear();
        if st.pages_out != 0 {
            // A Page may still point into these chunks, or the helper be releasing pages of
            // them (counted as out until it is done): leaking is the sound choice.
            return;
        }
        for c in st.chunks.drain(..) {
            // SAFETY: base is the start of a CHUNK_BYTES mapping made by map_chunk, and no
            // page of it is out, so nothing refers to it any more.
            unsafe { libc::munmap(c.base.as_ptr().cast(), CHUNK_BYTES) };
        }
    }
}

/// Releases free pages no one else can reach (off every list): sorted, one `madvise` per
/// run of consecutive pages.
fn release_sorted(pages: &mut [NonNull<u8>], page_size: usize) {
    pages.sort_unstable();
    let addr = |i: usize| pages[i].as_ptr() as usize;
    let mut start = 0;
    for i in 1..=pages.len() {
        if i == pages.len() || addr(i) != addr(i - 1) + page_size {
            release(pages[start], (i - start) * page_size);
            start = i;
        }
    }
}

impl ArenaState {
    /// Takes the gathered pages off the list for the helper to release, counted as out
    /// meanwhile (so the arena, if dropped, leaks its chunks rather than unmap pages being
    /// released).
    fn take_gathered(&mut self) -> Vec<NonNull<u8>> {
        let step = std::mem::take(&mut self.gathered);
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
                || self.next_fresh.is_some_and(|run| run.resident);
        }
        let mut free = std::mem::take(&mut self.hot);
        free.append(&mut self.gathered);
        for p in free {
            release(p, self.page_size);
            self.cold.push(p);
        }
        if let Some(run) = self.next_fresh.as_mut().filter(|run| run.resident) {
            release(run.next, run.left * self.page_size);
            run.resident = false;
        }
        false
    }
}

/// The helper's release of every arena's gathered pages, a step per hold of its lock.
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
            release_sorted(&mut step, page_size);
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

/// How long the helper's ready chunk may sit unused before its pages go back to the OS (the
/// mapping stays, offered as not resident): a process that stops allocating keeps no
/// prepared memory beyond what its allocators hold.
const READY_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the helper looks at the arenas once allocation has stopped, until it has
/// trimmed them all.
const TRIM_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// The process's chunk-ahead helper: how many arenas are alive, and the running helper's
/// hand-over slot.
struct Helper {
    arenas: usize,
    /// `None` when no helper runs.
    shared: Option<std::sync::Arc<HelperShared>>,
}

/// Where the helper leaves its ready chunk for an arena to take.
struct HelperShared {
    slot: std::sync::Mutex<HelperSlot>,
    /// Signalled when the chunk is taken or the helper is told to stop.
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct HelperSlot {
    /// A mapped chunk no arena has yet (address as usize), and whether it is faulted in.
    ready: Option<(usize, bool)>,
    /// The last arena is gone: unmap what is in the slot and end.
    stop: bool,
    /// The helper ended on its own (it could not map): start another next time.
    ended: bool,
    /// An arena asked for its gathered pages to be released.
    release: bool,
}

static HELPER: std::sync::Mutex<Helper> = std::sync::Mutex::new(Helper {
    arenas: 0,
    shared: None,
});

fn helper_state() -> std::sync::MutexGuard<'static, Helper> {
    // A panic while holding this lock leaves nothing half-changed (each critical section is a
    // counter step or an Option swap), so a poisoned lock is taken as it is.
    HELPER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock_slot(shared: &HelperShared) -> std::sync::MutexGuard<'_, HelperSlot> {
    // As for HELPER: every critical section leaves the slot whole.
    shared.slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new arena: the first of the process starts the helper, so that a pool made ahead of
/// use (as a zram device is set up before it is written) finds a chunk ready.
fn helper_join() {
    let mut h = helper_state();
    h.arenas += 1;
    if h.shared.is_none() {
        h.shared = start_helper();
    }
}

/// An arena gone: with the last one, the helper is told to unmap the chunk it holds and end.
fn helper_leave() {
    let mut h = helper_state();
    h.arenas -= 1;
    if h.arenas == 0 {
        if let Some(shared) = h.shared.take() {
            lock_slot(&shared).stop = true;
            shared.changed.notify_all();
        }
    }
}

/// The helper's ready chunk, mapped, with whether it is faulted in, if it has one now; never
/// waits. A helper that ended (it could not map) is started again for the next time.
fn helper_take_ready() -> Option<(NonNull<u8>, bool)> {
    let mut h = helper_state();
    let (taken, ended) = match &h.shared {
        Some(shared) => {
            let mut slot = lock_slot(shared);
            let taken = slot.ready.take();
            if taken.is_some() {
                shared.changed.notify_all();
            }
            (taken, slot.ended)
        }
        None => (None, true),
    };
    if ended {
        h.shared = start_helper();
    }
    taken.and_then(|(addr, resident)| NonNull::new(addr as *mut u8).map(|p| (p, resident)))
}

/// Asks the helper to release the arenas' gathered pages; false if no helper runs (the
/// caller releases them itself).
fn helper_ask_release() -> bool {
    let h = helper_state();
    let Some(shared) = &h.shared else {
        return false;
    };
    let mut slot = lock_slot(shared);
    if slot.ended || slot.stop {
        return false;
    }
    slot.release = true;
    shared.changed.notify_all();
    true
}

/// Starts the thread that maps chunks ahead; `None` if no thread can be started (the arenas
/// then map every chunk themselves).
fn start_helper() -> Option<std::sync::Arc<HelperShared>> {
    let shared = std::sync::Arc::new(HelperShared {
        slot: std::sync::Mutex::new(HelperSlot::default()),
        changed: std::sync::Condvar::new(),
    });
    let theirs = std::sync::Arc::clone(&shared);
    std::thread::Builder::new()
        .name("ztier-arena".into())
        .spawn(move || run_helper(&theirs))
        .ok()
        .map(|_| shared)
}

/// The helper: maps a chunk, faults it in, leaves it in the slot and waits until an arena
/// takes it; one left unused for [`READY_IDLE`] has its pages released while it waits on.
fn run_helper(shared: &HelperShared) {
    lower_to_idle_priority();
    // Whether some arena has pages to trim.
    let mut trim_pending = false;
    loop {
        let Ok(chunk) = map_chunk() else {
            lock_slot(shared).ended = true;
            return;
        };
        // A write to each page rather than one MADV_POPULATE_WRITE, which would hold the
        // process's mmap lock for the whole chunk, holding up other threads' mmap calls
        // (page faults take only the VMA's lock).
        touch_pages(chunk, CHUNK_BYTES);
        let addr = chunk.as_ptr() as usize;
        let mut slot = lock_slot(shared);
        slot.ready = Some((addr, true));
        let mut resident = true;
        loop {
            if slot.release && !slot.stop {
                slot.release = false;
                drop(slot);
                release_gathered_arenas();
                slot = lock_slot(shared);
                continue;
            }
            if slot.stop {
                if let Some((addr, _)) = slot.ready.take() {
                    // SAFETY: the chunk was never taken by an arena, and the last arena is
                    // gone: nothing refers to it.
                    unsafe { libc::munmap(addr as *mut libc::c_void, CHUNK_BYTES) };
                }
                return;
            }
            if slot.ready.is_none() {
                break;
            }
            if !resident && !trim_pending {
                slot = shared.changed.wait(slot).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if !resident {
                // Allocation has stopped: a look at the arenas each tick until all are
                // trimmed, with no lock held but theirs.
                let (back, waited) = shared
                    .changed
                    .wait_timeout(slot, TRIM_TICK)
                    .unwrap_or_else(|p| p.into_inner());
                slot = back;
                if waited.timed_out() && !slot.stop && slot.ready.is_some() {
                    drop(slot);
                    trim_pending = trim_idle_arenas();
                    slot = lock_slot(shared);
                }
                continue;
            }
            let (back, waited) = shared
                .changed
                .wait_timeout(slot, READY_IDLE)
                .unwrap_or_else(|p| p.into_inner());
            slot = back;
            if waited.timed_out() && !slot.stop {
                if let Some((addr, _)) = slot.ready.take() {
                    // Out of the slot while its pages go, so no arena waits on the madvise.
                    drop(slot);
                    let base = NonNull::new(addr as *mut u8).expect("mapped");
                    release(base, CHUNK_BYTES);
                    // The first look notes each arena's activity; the next, a tick on, trims
                    // the idle ones.
                    trim_pending = trim_idle_arenas();
                    slot = lock_slot(shared);
                    slot.ready = Some((addr, false));
                    resident = false;
                }
            }
        }
    }
}

/// Makes the calling thread run only when a CPU would otherwise be idle (`SCHED_IDLE`): for
/// background work that must not take the foreground's cores (the chunk helper here, zram's
/// policy).
///
/// The helper's work is worth doing ahead only on a core with nothing else to do. On a busy
/// machine (as many storing threads as cores) it would take the cores' time all the same and
/// add a context switch and a cold cache to each chunk, so there it yields, and the storing
/// threads fault their own pages in: measured here, two storing threads on two cores went
/// from 1.5x to 1.6x one thread's speed, and one thread kept its speed. A helper put aside
/// this way holds no lock that an allocating thread waits for: it faults pages of a mapping
/// no one else knows yet (a page fault takes only that mapping's lock, not the mmap lock).
pub fn lower_to_idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes only the calling thread's policy; param
    // is a valid sched_param for SCHED_IDLE. Failure leaves the thread at normal priority,
    // which is correct, only slower on a busy machine.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}

/// Faults in `len` bytes of pages from `start`, which are not resident (untouched or
/// released, so reading as zeros): one `MADV_POPULATE_WRITE` (Linux 5.14), else a zero
/// written to each page, which leaves its bytes as they were.
fn populate(start: NonNull<u8>, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: start..start + len lies in pages of one chunk that the caller owns (taken out
    // of the arena, or a fresh chunk no one else knows yet); populating maps them and
    // leaves their bytes as they are.
    if unsafe { libc::madvise(start.as_ptr().cast(), len, MADV_POPULATE_WRITE) } != 0 {
        touch_pages(start, len);
    }
}

/// Faults in `len` bytes of pages from `start`, which read as zeros (untouched or released),
/// by writing a zero to each OS page, which leaves its bytes as they were.
fn touch_pages(start: NonNull<u8>, len: usize) {
    for off in (0..len).step_by(os_page_size()) {
        // SAFETY: off < len, inside pages the caller owns (as for `populate`), which read as
        // zeros, so writing one changes nothing.
        unsafe { start.as_ptr().add(off).write_volatile(0) };
    }
}

fn os_page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// Maps a chunk; its pages fault in when first written.
fn map_chunk() -> Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(PoolError::OutOfMemory {
            bytes: CHUNK_BYTES,
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    NonNull::new(p.cast()).ok_or(PoolError::OutOfMemory {
        bytes: CHUNK_BYTES,
        reason: "mmap returned NULL".into(),
    })
}

/// Returns free pages' memory to the OS; their contents read as zero afterwards.
fn release(ptr: NonNull<u8>, len: usize) {
    // SAFETY: ptr..ptr+len is consecutive free pages of our mappings that no one else can
    // reach (given back by their chain and on no list yet; the helper's ready chunk while
    // it is out of the slot; or, under the arena's lock, its hot pages or the rest of its
    // fresh run), so discarding their contents can affect no live data.
    unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTNEED) };
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`), `u64::MAX` if unreadable:
/// the bound for tables and corpora that must fit in memory.
pub fn physical_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(u64::MAX)
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(resident * os_page_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_chains_are_contiguous_and_straddles_read_in_place() {
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

    /// Once allocation stops, the helper releases an idle arena's hot pages and the
    /// pre-faulted rest of its chunk; pages still out keep their bytes, and the released
    /// ones fault in again when taken.
    #[test]
    fn an_idle_arena_is_trimmed() {
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
        while arena.gathered_pages() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the helper never released the batch"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(arena.pages_out(), 0);
        let again = arena.alloc_chain(HOT_PAGES_MAX + batch).unwrap();
        assert!(!again.is_contiguous(), "made of freed pages");
        let zeroed = again
            .pages
            .iter()
            .filter(|p| p.bytes().iter().all(|&b| b == 0))
            .count();
        assert_eq!(
            zeroed, batch,
            "pages past the hot list were released to the OS"
        );
        arena.free_chain(again);
    }

    #[test]
    #[should_panic(expected = "another arena")]
    fn a_chain_cannot_be_freed_into_another_arena() {
        let a = Arena::new(4096);
        let b = Arena::new(4096);
        let chain = a.alloc_chain(1).unwrap();
        // Were it taken, dropping `b` would unmap a page `a` still counts as out.
        b.free_chain(chain);
    }

    #[test]
    fn a_chain_longer_than_a_chunk_is_not_contiguous_and_overwrites_nothing() {
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
        let arena = Arena::new(4096);
        let mut chain = arena.alloc_chain(2).unwrap();
        assert!(chain.is_contiguous());
        chain.write(usize::MAX - 7, &[0xAB; 16]);
    }

    #[test]
    #[should_panic(expected = "outside the chain")]
    fn a_read_whose_end_overflows_is_refused() {
        let arena = Arena::new(4096);
        let chain = arena.alloc_chain(2).unwrap();
        let mut out = [0; 16];
        chain.read(usize::MAX - 7, &mut out);
    }

    #[test]
    #[should_panic(expected = "outside the chain")]
    fn a_scattered_chain_refuses_ranges_past_its_end() {
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
        let mut v = [0u8; 4];
        // SAFETY: the page is mapped and page aligned; v has room for its 1..=4 OS pages.
        let r = unsafe { libc::mincore(page.ptr.as_ptr().cast(), page.len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore");
        v[..page.len / os_page_size()].iter().all(|&b| b & 1 == 1)
    }

    #[test]
    fn chains_come_back_resident() {
        let arena = Arena::new(4096);
        // Three chunks' worth at once: the helper has at most one ready, so the others are
        // mapped by this thread unpopulated, and alloc_chain must fault them in.
        let chains: Vec<PageChain> = (0..192).map(|_| arena.alloc_chain(8).unwrap()).collect();
        let all = |cs: &[PageChain]| cs.iter().flat_map(|c| c.pages.iter()).all(resident);
        assert!(all(&chains), "fresh pages");
        let fresh_before = arena.fresh_resident();
        for c in chains {
            arena.free_chain(c);
        }
        // Released pages (past the hot list) are faulted in again when taken.
        let again: Vec<PageChain> = (0..40).map(|_| arena.alloc_chain(8).unwrap()).collect();
        assert!(arena.pages_out() == 320 && arena.fresh_resident() == fresh_before);
        assert!(all(&again), "hot and released pages");
        for c in again {
            arena.free_chain(c);
        }
    }

    /// Resident OS pages in a chunk.
    fn resident_pages(base: usize) -> usize {
        let mut v = vec![0u8; CHUNK_BYTES / os_page_size()];
        // SAFETY: base is a mapped CHUNK_BYTES chunk, page aligned; v has a byte per OS page.
        let r = unsafe { libc::mincore(base as *mut libc::c_void, CHUNK_BYTES, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore");
        v.iter().filter(|&&b| b & 1 == 1).count()
    }

    /// A helper of its own (not the process's, which other tests use): its ready chunk comes
    /// faulted in, and after READY_IDLE untaken its pages are given back, the mapping kept
    /// and offered as not resident; told to stop, it unmaps it and ends.
    #[test]
    fn an_untaken_ready_chunk_goes_back_to_the_os() {
        let shared = std::sync::Arc::new(HelperShared {
            slot: std::sync::Mutex::new(HelperSlot::default()),
            changed: std::sync::Condvar::new(),
        });
        let theirs = std::sync::Arc::clone(&shared);
        let helper = std::thread::spawn(move || run_helper(&theirs));
        let ready = || lock_slot(&shared).ready;
        let started = std::time::Instant::now();
        while ready().is_none() {
            assert!(started.elapsed().as_secs() < 10, "no chunk made ready");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (base, resident) = ready().unwrap();
        assert!(resident);
        assert_eq!(resident_pages(base), CHUNK_BYTES / os_page_size());
        while ready().is_some_and(|(_, resident)| resident) {
            assert!(started.elapsed().as_secs() < 10, "never released");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let (again, resident) = ready().unwrap();
        assert_eq!((again, resident), (base, false));
        assert_eq!(resident_pages(base), 0);
        lock_slot(&shared).stop = true;
        shared.changed.notify_all();
        helper.join().unwrap();
        assert!(ready().is_none(), "unmapped at stop");
    }
}
