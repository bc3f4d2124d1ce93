//! The crate's mappings (each a `ztier_base::mapping::Mapping`, which maps, advises and
//! unmaps it), what each may do with its pages, and the one move that takes pages out of one
//! into another: the region's memory ([`RegionMemory`], which Rust reaches only as atomics),
//! the evictors' landing pad ([`Pad`]: each evictor's part a [`PadPart`] it alone holds,
//! through which it moves pages in, reads them and empties them), and the measuring rig's
//! plain pages ([`PlainPages`]). This is where the crate touches memory by address; every
//! other module uses these types' safe methods.
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
use std::sync::atomic::AtomicU64;

use ztier_base::mapping::{Advice, Discard, Mapping};

use crate::page_table::MovableRun;
use crate::userfaultfd::{Outcome, Uffd};

/// A new mapping of `len` bytes (a whole number of pages, more than zero), never inherited
/// by a child and never backed by transparent huge pages (the module's invariants).
fn new_mapping(len: usize) -> io::Result<Mapping> {
    let map = Mapping::anonymous(len)?;
    map.advise(0, len, Advice::DontFork)?;
    map.advise(0, len, Advice::NoHugePage)?;
    Ok(map)
}

/// The region's memory: reached by Rust only as atomics ([`words`](Self::words)), so the
/// protocol may drop its pages and move them out and back at any time under them.
pub(crate) struct RegionMemory(Mapping);

impl RegionMemory {
    pub(crate) fn new(len: usize) -> io::Result<RegionMemory> {
        new_mapping(len).map(RegionMemory)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0.addr() as u64
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        self.0.ptr().as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The memory as machine words any thread may read and write at once.
    pub(crate) fn words(&self) -> &[AtomicU64] {
        let n = self.0.len() / size_of::<AtomicU64>();
        // SAFETY: the mapping is page-aligned, `len` bytes long and lives as long as
        // `self`; any bytes are a valid AtomicU64, and atomics make concurrent access by
        // any thread sound. The kernel changes the memory only as the protocol says (a page
        // moved out comes back with its content; dropped pages read as zeros, as the owner
        // asked).
        unsafe { std::slice::from_raw_parts(self.ptr().cast::<AtomicU64>(), n) }
    }

    /// Drops `[offset, offset + len)` (clamped to the memory) as the program's own
    /// `MADV_DONTNEED` would: those pages read as zeros afterwards (the fault thread sees
    /// the `REMOVE` event). As `MADV_DONTNEED_LOCKED`, so that it works in a process that
    /// locked its memory (`mlockall`) too.
    pub(crate) fn discard(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: Rust reaches these bytes only as atomics (`words`), which read the zeros
        // the drop leaves; dropping them is what the region's owner asked.
        Ok(unsafe { self.0.discard(offset, len, Discard::DontNeedLocked) }?)
    }

    /// Unmaps only the byte ranges `runs` (each inside the memory) at the drop, not the
    /// whole: for a region part of which the program unmapped or moved itself, whose
    /// addresses may hold the program's own mappings since.
    pub(crate) fn unmap_at_drop(&mut self, runs: Vec<Range<usize>>) {
        self.0.unmap_only_at_drop(runs);
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

/// What [`Pad::move_in`] did.
pub(crate) struct Moved {
    /// Bytes moved into the pad, from the first page: the kernel's count, plus the pages it
    /// moved without counting them.
    pub(crate) bytes: usize,
    /// Of those, the pages the kernel did not count (found in the pad).
    pub(crate) uncounted: usize,
    pub(crate) outcome: Outcome,
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
        let map = new_mapping((slots + 1) * page_size)?;
        let mut first = 0;
        let parts = parts
            .iter()
            .map(|&len| {
                let part = PadPart {
                    pad: map.addr() as u64,
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
        let start = self.map.addr();
        start..start + self.map.len()
    }

    /// The bell page's address.
    pub(crate) fn bell_addr(&self) -> u64 {
        (self.map.addr() + self.slots * self.page_size) as u64
    }

    /// Rings the bell: a `MADV_DONTNEED` of the bell page, which the kernel turns into a
    /// `REMOVE` event for the fault thread, returning once it is read (bell.rs).
    pub(crate) fn ring_bell(&self) -> io::Result<()> {
        // SAFETY: the bell page is in no part: no one reads, writes or moves a page into it,
        // so it holds nothing to drop and nothing refers to it.
        let rung = unsafe {
            self.map.discard(
                self.slots * self.page_size,
                self.page_size,
                Discard::DontNeedLocked,
            )
        };
        Ok(rung?)
    }

    fn check(&self, part: &PadPart, slot: usize, n: usize) {
        assert!(
            part.pad == self.map.addr() as u64 && slot + n <= part.len,
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
    /// from the first: the kernel's count, corrected by `claim_unreported`) and the outcome
    /// (userfaultfd.rs; `EAGAIN` where the correction leaves the rest to move). The slots
    /// must be empty.
    pub(crate) fn move_in(
        &self,
        part: &mut PadPart,
        slot: usize,
        uffd: &Uffd,
        region: &RegionMemory,
        run: &MovableRun<'_, '_>,
        run_pages: Range<usize>,
    ) -> Moved {
        let n = run_pages.len();
        self.check(part, slot, n);
        assert!(run_pages.end <= run.len());
        let ps = self.page_size;
        let src_offset = (run.first() as usize + run_pages.start) * ps;
        assert!(src_offset + n * ps <= region.len());
        let dst = (self.map.addr() + self.offset(part, slot)) as u64;
        let src = region.addr() + src_offset as u64;
        // SAFETY: the source pages are the region's own (a `MovableRun`'s: read resident
        // under `gate` with their locks held, and no unmap unseen while it lives:
        // page_table.rs), whose content the protocol keeps for the program (stored from the
        // pad, or put back); the slots are this part's (`&mut`: no slice of them is alive)
        // and empty, which the kernel checks too.
        let (mut done, mut outcome) = unsafe { uffd.move_pages(dst, src, (n * ps) as u64) };
        for filled in &mut part.filled[slot..slot + done / ps] {
            *filled = true;
        }
        let mut uncounted = 0;
        if let Err(libc::EEXIST | libc::ENOENT) = outcome {
            let at = done / ps;
            uncounted = self.claim_unreported(part, slot + at, n - at, src + done as u64);
            if uncounted > 0 {
                done += uncounted * ps;
                outcome = if done == n * ps {
                    Ok(())
                } else {
                    Err(libc::EAGAIN)
                };
            }
        }
        Moved {
            bytes: done,
            uncounted,
            outcome,
        }
    }

    /// After a move that stopped at `part`'s slot `slot` with `EEXIST` or `ENOENT`: how many
    /// slots from `slot` on (at most `max`) hold a page all the same, now marked filled.
    /// Linux 6.18's `UFFDIO_MOVE` keeps the `EAGAIN` of a step it retries (a page the
    /// kernel's reclaim is pushing to swap) through the retry that succeeds, so it does the
    /// step again without counting it: the pages it moved are in the pad, uncounted, and the
    /// repeat finds them there (`EEXIST`; `ENOENT`, the source empty, is looked at the same
    /// way, in case). Measured: a single thread moving pages beside `MADV_PAGEOUT` got
    /// `EEXIST` for about one move in 335, each time with the page moved. The slots were
    /// empty before the move (`move_in`'s contract), so a slot with an entry in the page
    /// table (in memory, or in swap) whose source page (`src`, the region's address of the
    /// page meant for `slot`, the next page for each next slot) has none holds the page
    /// moved there. 0 where the kernel's error was true, or where the page table could not
    /// be read.
    fn claim_unreported(&self, part: &mut PadPart, slot: usize, max: usize, src: u64) -> usize {
        self.check(part, slot, max);
        let os_page = ztier_base::os::page_size();
        let per = (self.page_size / os_page).max(1);
        let entries = |addr: usize| {
            let mut entries = Vec::with_capacity(max * per);
            ztier_base::os::pagemap_entries(addr / os_page, max * per, |_, e| entries.push(e))
                .map(|()| entries)
        };
        let (Some(dst), Some(src)) = (
            entries(self.map.addr() + self.offset(part, slot)),
            entries(src as usize),
        ) else {
            return 0;
        };
        let held =
            |e: &u64| e & (ztier_base::os::PAGEMAP_PRESENT | ztier_base::os::PAGEMAP_SWAPPED) != 0;
        let claimed = dst
            .chunks(per)
            .zip(src.chunks(per))
            .take_while(|(to, from)| to.iter().all(held) && !from.iter().any(held))
            .count();
        for filled in &mut part.filled[slot..slot + claimed] {
            *filled = true;
        }
        claimed
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
        let _ = unsafe { self.map.discard(offset, n * ps, Discard::DontNeedLocked) };
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
        new_mapping(len).map(PlainPages)
    }

    pub(crate) fn addr(&self) -> u64 {
        self.0.addr() as u64
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Copies `data` in from the first byte (at most the mapping's length).
    pub(crate) fn fill(&mut self, data: &[u8]) {
        let n = data.len().min(self.0.len());
        // SAFETY: `n` bytes inside the mapping, which `&mut` keeps from any other access;
        // `data` is another allocation.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.0.ptr().as_ptr(), n) };
    }

    /// Reads the byte at `offset` (faulting its page in, as the program's touch would).
    pub(crate) fn touch(&self, offset: usize) -> u8 {
        assert!(offset < self.0.len());
        // SAFETY: inside the live mapping; a volatile read of one byte by value keeps no
        // reference, and any byte is a valid u8.
        unsafe { std::ptr::read_volatile(self.0.ptr().as_ptr().add(offset)) }
    }

    /// `MADV_DONTNEED` (as `MADV_DONTNEED_LOCKED`) of `[offset, offset + len)` (clamped):
    /// those pages read as empty afterwards (zeros, or a userfaultfd fault where the range
    /// is registered).
    pub(crate) fn drop_pages(&mut self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: no reference into the mapping outlives a call of this type's (`&mut` here);
        // dropping the bytes is what the caller asks.
        Ok(unsafe { self.0.discard(offset, len, Discard::DontNeedLocked) }?)
    }

    /// `MADV_PAGEOUT` of `[offset, offset + len)` (clamped): the kernel reclaims those pages
    /// now, as its own reclaim would (through zswap and swap), keeping their content.
    pub(crate) fn page_out(&self, offset: usize, len: usize) -> io::Result<()> {
        Ok(self.0.advise(offset, len, Advice::PageOut)?)
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
    fn plain_pages_are_written_dropped_and_counted() {
        let ps = ztier_base::os::page_size();
        let mut m = PlainPages::new(4 * ps).unwrap();
        assert_eq!(m.resident_pages(0, 4 * ps).unwrap(), 0);
        let mut data = vec![0u8; 4 * ps];
        data[ps] = 1;
        data[3 * ps] = 1;
        m.fill(&data);
        assert_eq!(m.first_difference(&data, ps), None);
        m.drop_pages(ps, ps).unwrap();
        assert_eq!(m.resident_pages(0, 4 * ps).unwrap(), 3);
        // Clamped to the mapping; an offset inside a page refused.
        assert_eq!(m.resident_pages(2 * ps, 8 * ps).unwrap(), 2);
        // The dropped page reads as zeros (read, it is resident again: the zero page).
        assert_eq!(m.first_difference(&data, ps), Some(1));
        assert_eq!(
            m.resident_pages(1, ps).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(m.touch(3 * ps), 1);
        assert_eq!(m.touch(ps), 0);
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
