//! `discard` (the kernel's `zram_bio_discard` and `REQ_OP_DISCARD`): whole pages freed,
//! the partial pages at a range's ends left alone, as the kernel does; on a device of larger
//! units, the units a discard covers whole freed and the pages it covers of the others zeroed
//! by a read-modify-write. The slot table's pages a discard empties go back to the OS.
//!
//! Invariants: a page is freed under its page lock and its slot's lock (the order of
//! DESIGN.md's table), so a read or write of it finishes before or starts after.

use crate::slot::SlotOps;
use crate::stats::Counter;
use crate::{slot, Device, Result, ZramError, SLOT_BYTES};
use ztier_base::pieces::pieces;

impl Device {
    /// Discards whole pages in `[offset, offset + len)`; partial pages at the ends are left
    /// alone, as the kernel does. Returns the slots freed.
    pub fn discard(&self, offset: u64, len: u64) -> Result<u64> {
        let end = offset.checked_add(len).filter(|&e| e <= self.disksize());
        let Some(end) = end else {
            return Err(ZramError::OutOfRange {
                offset,
                len: usize::try_from(len).unwrap_or(usize::MAX),
                disksize: self.disksize(),
            });
        };
        let ps = self.page_size as u64;
        let first = offset.div_ceil(ps);
        if self.unit_size != self.page_size {
            let freed = self.discard_in_units(first * ps, (end / ps).saturating_sub(first) * ps);
            self.report_to_group();
            let unit = self.unit_size as u64;
            self.give_back_table((first * ps).div_ceil(unit), end / unit);
            return freed;
        }
        let mut freed = 0;
        for index in first..end / ps {
            let _page = self.page_lock(index);
            let mut shard = self.shard();
            let mut g = self.slot(index)?.lock();
            if g.entry.is_allocated() {
                freed += 1;
            }
            self.free_slot(&mut shard.counters, index, &mut g.entry);
            shard.counters.add(Counter::NotifyFree, 1);
        }
        self.report_to_group();
        self.give_back_table(first, end / ps);
        Ok(freed)
    }

    /// The slot table's pages around `[first, end)` that hold only empty slots go back to
    /// the OS: metadata follows use (as the kernel's swap table frees a cluster's table
    /// when the cluster empties), where the kernel's zram keeps its whole `vzalloc`ed
    /// table. A look without locks first; then every slot of a page is claimed by its own
    /// lock (a page with a slot held or in use stays), so no one holds a slot of a page
    /// while it goes back.
    fn give_back_table(&self, first: u64, end: u64) {
        // Pages emptied by earlier discards of neighbours are looked at too.
        let per_page = (ztier_base::os::page_size() / SLOT_BYTES as usize) as u64;
        let lo = first.saturating_sub(per_page) as usize;
        let hi = end.saturating_add(per_page).min(self.slots.len() as u64) as usize;
        if !ztier_base::zeroed::has_zero_page(&self.slots, lo..hi) {
            return;
        }
        ztier_base::zeroed::give_back_zero_pages(&self.slots, lo..hi, slot::ROW_LOCK);
    }

    /// Bytes of the slot table and the backing store's tables resident now (what grows with
    /// the disk's and the store's size, reported beside `mem_used_total`, which stays the
    /// kernel's figure: the pool's pages).
    pub fn metadata_bytes(&self) -> u64 {
        ztier_base::zeroed::resident_bytes(&self.slots).unwrap_or(0)
            + self.backing().map_or(0, |b| b.metadata_bytes())
    }

    /// `discard` of whole pages on a device of larger units: units it covers whole are
    /// freed; the pages it covers of the others are zeroed by a read-modify-write (one
    /// never written stays empty). Returns the units freed.
    fn discard_in_units(&self, offset: u64, len: u64) -> Result<u64> {
        let mut freed = 0;
        let mut scratch = Vec::new();
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        for s in pieces(offset, len, self.unit_size) {
            let pages = (s.len / self.page_size) as u64;
            if s.len == self.unit_size {
                let _unit = self.page_lock(s.unit);
                let mut shard = self.shard();
                let mut g = self.slot(s.unit)?.lock();
                if g.entry.is_allocated() {
                    freed += 1;
                }
                self.free_slot(&mut shard.counters, s.unit, &mut g.entry);
                shard.counters.add(Counter::NotifyFree, pages as i64);
                continue;
            }
            if self.slot(s.unit)?.lock().entry.is_allocated() {
                scratch.resize(self.unit_size, 0);
                let zeros = vec![0u8; s.len];
                self.patch_page(s.unit, s.in_unit, &zeros, &mut scratch)?;
            }
            self.shard().counters.add(Counter::NotifyFree, pages as i64);
        }
        Ok(freed)
    }

    /// Discards one page (`BLKDISCARD` of one page / swap slot free); with larger units, the
    /// page is zeroed in its unit, or the unit freed if it is the unit.
    pub fn discard_page(&self, index: u64) -> Result<()> {
        if self.unit_size != self.page_size {
            self.check_page_index(index, self.page_size)?;
            let ps = self.page_size as u64;
            return self.discard(index * ps, ps).map(drop);
        }
        let slot = self.slot(index)?;
        let _page = self.page_lock(index);
        let mut shard = self.shard();
        let mut g = slot.lock();
        self.free_slot(&mut shard.counters, index, &mut g.entry);
        shard.counters.add(Counter::NotifyFree, 1);
        Ok(())
    }
}
