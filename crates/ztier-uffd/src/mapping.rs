//! The crate's mappings (`mmap`), their `madvise`s and `munmap`s, and the one move that
//! takes pages out of one into another: the region's memory ([`RegionMemory`], which Rust
//! reaches only as atomics), the evictors' landing pad ([`Pad`]: each evictor's part a
//! [`PadPart`] it alone holds, through which it moves pages in, reads them and empties
//! them), and the measuring rig's plain pages ([`PlainPages`]). This is where the crate
//! touches memory by address; every other module uses these types' safe methods.
//!
//! Invariants: a mapping lives exactly as long as its value; it is never inherited by a
//! child (`MADV_DONTFORK`: a child would share the region's pages copy-on-write, which
//! `UFFDIO_MOVE` refuses, and would fault on pages no handler serves); it never holds
//! transparent huge pages (`MADV_NOHUGEPAGE`: faults, copies and moves are per 4 KiB page,
//! and khugepaged must not gather pages the protocol tracks one by one). No reference to a
//! mapping's bytes outlives the borrow that made it: the region's are atomics (a page
//! dropped or moved out under them reads as the protocol says), a pad page is read only
//! through the part that holds it, borrowed shared, so nothing moves into it or empties it
//! meanwhile, and plain pages are read by copy. No locks.
#![allow(unsafe_code)]

use std::io;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use crate::page_table::MovableRun;
use crate::userfaultfd::{Outcome, Uffd};

/// An anonymous private mapping, unmapped at its drop: the owner of the address range the
/// types below reach.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Byte ranges to unmap at the drop, if not the whole (see [`RegionMemory::unmap_at_drop`]).
    unmap_only: Option<Vec<Range<usize>>>,
}

// SAFETY: the mapping is plain memory owned by the value; which thread reads or changes what
// is the protocol's (lib.rs), and every access through this module's types is by raw address
// to the kernel, by atomics, or through a borrow that keeps every writer out.
unsafe impl Send for Mapping {}
// SAFETY: as Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new mapping of `len` bytes (a whole number of pages, more than zero), readable and
    /// writable, with no swap reserved for it.
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing: it touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap never maps address 0 for us"),
            len,
            unmap_only: None,
        };
        for advice in [libc::MADV_DONTFORK, libc::MADV_NOHUGEPAGE] {
            // SAFETY: advice on our own new mapping; neither changes its content.
            if unsafe { libc::madvise(p, len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(map)
    }

    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// `madvise(advice)` of `[offset, offset + len)`, clamped to the mapping.
    ///
    /// # Safety
    /// What the advice does to those bytes must be what the caller means: `MADV_DONTNEED`
    /// drops them, so no reference to them may be alive but atomic ones.
    unsafe fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        let len = len.min(self.len.saturating_sub(offset));
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside our mapping (clamped above); the advice's effect on it
        // is the caller's contract.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `MADV_DONTNEED` of `[offset, offset + len)` (clamped to the mapping): its pages go back
    /// to the OS and read as empty (a userfaultfd fault, or zeros) afterwards. As
    /// `MADV_DONTNEED_LOCKED` (Linux 5.18), so that it works in a process that locked its
    /// memory (`mlockall`) too, where plain `MADV_DONTNEED` is refused (`EINVAL`).
    ///
    /// # Safety
    /// No reference to those bytes may be alive but atomic ones, and their content must be
    /// one the caller means to drop.
    unsafe fn dont_need(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: dropping the content is the caller's contract.
        unsafe { self.advise(offset, len, libc::MADV_DONTNEED_LOCKED) }
    }

    /// For each page of `[offset, offset + len)` (clamped to the mapping, `offset` a whole
    /// number of pages), whether it is resident (`mincore`: present in the page table, or
    /// in the swap cache).
    fn residency(&self, offset: usize, len: usize) -> io::Result<Vec<bool>> {
        let len = len.min(self.len.saturating_sub(offset));
        let ps = ztier_base::os::page_size();
        if len == 0 {
            return Ok(Vec::new());
        }
        if !offset.is_multiple_of(ps) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut vec = vec![0u8; len.div_ceil(ps)];
        // SAFETY: the range is inside our mapping and page-aligned (checked above); `vec`
        // has the one byte per page that mincore writes.
        let r =
            unsafe { libc::mincore(self.ptr.as_ptr().add(offset).cast(), len, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.into_iter().map(|b| b & 1 != 0).collect())
    }

    /// The bytes `[offset, offset + len)`.
    ///
    /// # Safety
    /// The range's pages must be present or swapped (not missing: a fault on a registered
    /// page would wait for a handler that may be the caller), and nothing may change them
    /// while the slice lives.
    unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: inside the mapping (checked); the rest is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match &self.unmap_only {
            // SAFETY: our own mapping, unmapped once; nothing borrows it past the value's
            // life.
            None => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            },
            Some(runs) => {
                for run in runs {
                    // SAFETY: inside our mapping (checked when given), and no longer used:
                    // this is the value's drop.
                    unsafe { libc::munmap(self.ptr.as_ptr().add(run.start).cast(), run.len()) };
                }
            }
        }
    }
}

/// The region's memory: reached by Rust only as atomics ([`words`](Self::words)), so the
/// protocol may drop its pages and move them out and back at any time under them.
pub(crate) struct RegionMemory(Mapping);

impl RegionMemory {
    pub(crate) fn new(len: usize) -> io::Result<RegionMemory> {
        Mapping::new(len).map(RegionMemory)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0.addr()
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.ptr.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len
    }

    /// The memory as machine words any thread may read and write at once.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        let n = self.0.len / size_of::<AtomicU64>();
        // SAFETY: the mapping is page-aligned, `len` bytes long and lives as long as
        // `self`; any bytes are a valid AtomicU64, and atomics make concurrent access by
        // any thread sound. The kernel changes the memory only as the protocol says (a page
        // moved out comes back with its content; dropped pages read as zeros, as the owner
        // asked).
        unsafe { std::slice::from_raw_parts(self.ptr().cast::<AtomicU64>(), n) }
    }

    /// Drops `[offset, offset + len)` (clamped to the memory) as the program's own
    /// `MADV_DONTNEED` would: those pages read as zeros afterwards (the fault thread sees
    /// the `REMOVE` event).
    pub(crate) fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: Rust reaches these bytes only as atomics (`words`), which read the zeros
        // the drop leaves; dropping them is what the region's owner asked.
        unsafe { self.0.dont_need(offset, len) }
    }

    /// Unmaps only the byte ranges `runs` (each inside the memory) at the drop, not the
    /// whole: for a region part of which the program unmapped or moved itself, whose
    /// addresses may hold the program's own mappings since.
    pub(crate) fn unmap_at_drop(&mut self, runs: Vec<Range<usize>>) {
        for run in &runs {
            assert!(run.start <= run.end && run.end <= self.0.len);
        }
        self.0.unmap_only = Some(runs);
    }
}

/// The evictors' landing pad: pages moved out of the region land in its slots, are read
/// from there and dropped. Its slots are dealt out once, as [`PadPart`]s; its last page is
/// the fault thread's bell (bell.rs), in no part.
pub(crate) struct Pad {
    map: Mapping,
    page_size: usize,
    /// Slots dealt out to parts; the bell page follows them.
    slots: usize,
}

/// Pad slots `[first, first + len)`, held by one owner (an evictor, or whoever holds
/// `Region::evict`'s lock): the only way to move pages into them, read them and empty them.
/// Not `Clone`; made only by [`Pad::new`].
pub(crate) struct PadPart {
    /// The pad's address: a part is used with its own pad only.
    pad: u64,
    first: usize,
    len: usize,
    /// Which slots a move has filled since they were last emptied.
    filled: Vec<bool>,
}

impl PadPart {
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Pad {
    /// A pad with a part of each of `parts` slots, and a bell page after them.
    pub(crate) fn new(page_size: usize, parts: &[usize]) -> io::Result<(Pad, Vec<PadPart>)> {
        let slots: usize = parts.iter().sum();
        let map = Mapping::new((slots + 1) * page_size)?;
        let mut first = 0;
        let parts = parts
            .iter()
            .map(|&len| {
                let part = PadPart {
                    pad: map.addr(),
                    first,
                    len,
                    filled: vec![false; len],
                };
                first += len;
                part
            })
            .collect();
        let pad = Pad {
            map,
            page_size,
            slots,
        };
        Ok((pad, parts))
    }

    /// The pad's addresses, the bell page's included.
    pub(crate) fn range(&self) -> Range<usize> {
        let start = self.map.addr() as usize;
        start..start + self.map.len
    }

    /// The bell page's address.
    pub(crate) fn bell_addr(&self) -> u64 {
        self.map.addr() + (self.slots * self.page_size) as u64
    }

    /// Rings the bell: a `MADV_DONTNEED` of the bell page, which the kernel turns into a
    /// `REMOVE` event for the fault thread, returning once it is read (bell.rs).
    pub(crate) fn ring_bell(&self) -> io::Result<()> {
        // SAFETY: the bell page is in no part: no one reads, writes or moves a page into it,
        // so it holds nothing to drop and nothing refers to it.
        unsafe {
            self.map
                .dont_need(self.slots * self.page_size, self.page_size)
        }
    }

    fn check(&self, part: &PadPart, slot: usize, n: usize) {
        assert!(
            part.pad == self.map.addr() && slot + n <= part.len,
            "pad slots {slot}..{} of a part of {} slots of this pad",
            slot + n,
            part.len
        );
    }

    fn offset(&self, part: &PadPart, slot: usize) -> usize {
        (part.first + slot) * self.page_size
    }

    /// Moves the pages `run_pages` of `run` (indexes into it; each the region's:
    /// page_table.rs) out of `region` into `part`'s slots from `slot` on, with one
    /// `UFFDIO_MOVE` (one TLB flush for them all): the bytes moved (a whole number of pages
    /// from the first) and the outcome (userfaultfd.rs). The slots must be empty.
    pub(crate) fn move_in(
        &self,
        part: &mut PadPart,
        slot: usize,
        uffd: &Uffd,
        region: &RegionMemory,
        run: &MovableRun<'_, '_>,
        run_pages: Range<usize>,
    ) -> (usize, Outcome) {
        let n = run_pages.len();
        self.check(part, slot, n);
        assert!(run_pages.end <= run.len());
        let ps = self.page_size;
        let src_offset = (run.first() as usize + run_pages.start) * ps;
        assert!(src_offset + n * ps <= region.len());
        let dst = self.map.addr() + self.offset(part, slot) as u64;
        let src = region.addr() + src_offset as u64;
        // SAFETY: the source pages are the region's own (a `MovableRun`'s: read resident
        // under `gate` with their locks held, and no unmap unseen while it lives:
        // page_table.rs), whose content the protocol keeps for the program (stored from the
        // pad, or put back); the slots are this part's (`&mut`: no slice of them is alive)
        // and empty, which the kernel checks too.
        let (done, outcome) = unsafe { uffd.move_pages(dst, src, (n * ps) as u64) };
        for filled in &mut part.filled[slot..slot + done / ps] {
            *filled = true;
        }
        (done, outcome)
    }

    /// The page a move put in `part`'s slot `slot`, if one did since the slot was emptied.
    pub(crate) fn page<'a>(&'a self, part: &'a PadPart, slot: usize) -> Option<&'a [u8]> {
        self.check(part, slot, 1);
        if !part.filled[slot] {
            return None;
        }
        // SAFETY: a move put a page there (present, or swapped out by the kernel's own
        // reclaim and read back from swap, never missing); nothing can move into the slot or
        // empty it while `part` is borrowed shared, which the slice keeps it.
        Some(unsafe { self.map.slice(self.offset(part, slot), self.page_size) })
    }

    /// Empties `part`'s slots `[0, n)`: their pages go back to the OS. First the last
    /// `warm` of them that are present are read, so that their frames, the first the
    /// kernel hands out again on this CPU, are in its cache (reclaim.rs says why).
    pub(crate) fn empty(&self, part: &mut PadPart, n: usize, warm: usize) {
        self.check(part, 0, n);
        let ps = self.page_size;
        let offset = self.offset(part, 0);
        if warm > 0 {
            if let Ok(present) = self.map.residency(offset, n * ps) {
                let last = present.iter().enumerate().rev().filter(|&(_, &p)| p);
                for (k, _) in last.take(warm) {
                    // SAFETY: present (just checked: only a move fills a pad page, and only
                    // the kernel's own reclaim takes one away, which a read faults back from
                    // swap, not to the fault thread), and this part's alone (`&mut`).
                    let page = unsafe { self.map.slice(offset + k * ps, ps) };
                    std::hint::black_box(page.iter().step_by(64).fold(0u8, |a, &b| a ^ b));
                }
            }
        }
        // SAFETY: the slots are this part's (`&mut`: no slice of them is alive), and hold
        // only copies already stored or held: dropping them is what the evictor means.
        let _ = unsafe { self.map.dont_need(offset, n * ps) };
        for filled in &mut part.filled[..n] {
            *filled = false;
        }
    }
}

/// Pages of the measuring rig's own, reached only through this type's copies and
/// one-byte reads (no reference into them is handed out but for the length of a call), so
/// they may be dropped or pushed out between calls.
pub(crate) struct PlainPages(Mapping);

impl PlainPages {
    pub(crate) fn new(len: usize) -> io::Result<PlainPages> {
        Mapping::new(len).map(PlainPages)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0.addr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len
    }

    /// Copies `data` in from the first byte (at most the mapping's length).
    pub(crate) fn fill(&mut self, data: &[u8]) {
        let n = data.len().min(self.0.len);
        // SAFETY: `n` bytes inside the mapping, which `&mut` keeps from any other access;
        // `data` is another allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.0.ptr.as_ptr(), n) };
    }

    /// Reads the byte at `offset` (faulting its page in, as the program's touch would).
    pub(crate) fn touch(&self, offset: usize) -> u8 {
        assert!(offset < self.0.len);
        // SAFETY: inside the live mapping; a volatile read of one byte by value keeps no
        // reference, and any byte is a valid u8.
        unsafe { std::ptr::read_volatile(self.0.ptr.as_ptr().add(offset)) }
    }

    /// `MADV_DONTNEED` of `[offset, offset + len)` (clamped): those pages read as empty
    /// afterwards (zeros, or a userfaultfd fault where the range is registered).
    pub(crate) fn drop_pages(&mut self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: no reference into the mapping outlives a call of this type's (`&mut` here);
        // dropping the bytes is what the caller asks.
        unsafe { self.0.dont_need(offset, len) }
    }

    /// `MADV_PAGEOUT` of `[offset, offset + len)` (clamped): the kernel reclaims those pages
    /// now, as its own reclaim would (through zswap and swap), keeping their content.
    pub(crate) fn page_out(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: the advice changes no byte of the range (a page pushed out reads back the
        // same).
        unsafe { self.0.advise(offset, len, libc::MADV_PAGEOUT) }
    }

    /// How many pages of `[offset, offset + len)` (clamped, `offset` a whole number of
    /// pages) are resident (`mincore`).
    pub(crate) fn resident_pages(&self, offset: usize, len: usize) -> io::Result<usize> {
        Ok(self
            .0
            .residency(offset, len)?
            .into_iter()
            .filter(|&r| r)
            .count())
    }

    /// The first page of `page_size` bytes that differs from `data`'s (compared from the
    /// first byte; pages still out are faulted back in by the kernel itself: the range must
    /// not be registered with a userfaultfd).
    pub(crate) fn first_difference(&self, data: &[u8], page_size: usize) -> Option<usize> {
        // SAFETY: inside the mapping (`slice` checks); no page is missing (not registered:
        // the kernel fills a missing page with zeros, a swapped one from swap); and nothing
        // changes the bytes while the slice lives: every change goes through `&mut self`,
        // and a page-out keeps them.
        let back = unsafe { self.0.slice(0, data.len()) };
        back.chunks(page_size)
            .zip(data.chunks(page_size))
            .position(|(a, b)| a != b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_says_which_pages_are_in_memory() {
        let ps = ztier_base::os::page_size();
        let mut m = PlainPages::new(4 * ps).unwrap();
        assert_eq!(m.0.residency(0, 4 * ps).unwrap(), [false; 4]);
        // SAFETY: inside our own mapping, which no userfaultfd watches and no reference
        // reaches: each write faults in a page of zeros and sets its first byte.
        unsafe {
            m.0.ptr.as_ptr().add(ps).write(1);
            m.0.ptr.as_ptr().add(3 * ps).write(1);
        }
        assert_eq!(
            m.0.residency(0, 4 * ps).unwrap(),
            [false, true, false, true]
        );
        assert_eq!(m.resident_pages(0, 4 * ps).unwrap(), 2);
        // Clamped to the mapping.
        assert_eq!(m.0.residency(2 * ps, 8 * ps).unwrap(), [false, true]);
        assert_eq!(m.0.residency(4 * ps, ps).unwrap(), []);
        assert_eq!(
            m.0.residency(1, ps).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        m.drop_pages(ps, ps).unwrap();
        assert_eq!(
            m.0.residency(0, 4 * ps).unwrap(),
            [false, false, false, true]
        );
        assert_eq!(m.touch(3 * ps), 1);
    }

    #[test]
    fn a_pad_deals_its_slots_out_once_and_keeps_the_bell_page_apart() {
        let ps = ztier_base::os::page_size();
        let (pad, mut parts) = Pad::new(ps, &[2, 3]).unwrap();
        assert_eq!(pad.range().len(), 6 * ps);
        assert_eq!(pad.bell_addr(), pad.range().start as u64 + 5 * ps as u64);
        assert_eq!((parts[0].len(), parts[1].len()), (2, 3));
        // Nothing moved in: no page to read; emptying what was never filled is harmless.
        assert!(pad.page(&parts[1], 2).is_none());
        pad.empty(&mut parts[1], 3, 1);
        pad.ring_bell().unwrap();
        // A part of another pad is refused.
        let (other, _) = Pad::new(ps, &[2, 3]).unwrap();
        let refused = std::panic::catch_unwind(|| other.page(&parts[0], 0).is_none());
        assert!(refused.is_err());
    }
}

/// What the kernel says of the mapping at an address: the program may lock or protect its
/// own memory, and the region must say so when that keeps pages from moving out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MappingFlags {
    /// Locked in memory (`mlock`): `VmFlags` has `lo`.
    pub(crate) locked: bool,
    /// Writable: the permissions have `w`.
    pub(crate) writable: bool,
}

/// The flags of this process's mapping holding `addr` (`/proc/self/smaps`); `None` if no
/// mapping holds it or the file cannot be read.
pub(crate) fn flags_of(addr: u64) -> Option<MappingFlags> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside: Option<bool> = None;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                if inside.is_some() {
                    // The mapping ended without a VmFlags line: no flags said.
                    return None;
                }
                if (a..b).contains(&addr) {
                    let perms = line.split_whitespace().nth(1).unwrap_or("");
                    inside = Some(perms.as_bytes().get(1) == Some(&b'w'));
                }
                continue;
            }
        }
        if let (Some(writable), Some(flags)) = (inside, line.strip_prefix("VmFlags:")) {
            let locked = flags.split_whitespace().any(|f| f == "lo");
            return Some(MappingFlags { locked, writable });
        }
    }
    None
}
