//! zram recompression (`CONFIG_ZRAM_MULTI_COMP`): pages stored with the primary algorithm
//! recompressed with up to three secondary ones (`recomp_algorithm`, priorities 1..=3),
//! chosen by idleness, hugeness and size (`recompress type=... threshold=...
//! algo=/priority=`), with the kernel's rules:
//! - the algorithms are tried in priority order above the page's own; the first whose
//!   result lands in a smaller size class of the pool is kept, else the next is tried;
//! - a page that the highest priority could not shrink is marked incompressible and never
//!   tried again; a result at or above `threshold` is not kept;
//! - a page keeps the priority of the algorithm that stored it, and is decompressed with
//!   it.
//!
//! On a device of larger units a unit is recompressed whole (its object, at least
//! `threshold` bytes, decompressed and compressed again as one); the counters and the
//! result count its pages, as every counter of the device does.
//!
//! Each page is recompressed under its stripe lock (no write or discard runs beside it); its
//! object is copied out under the slot lock and the slot is locked again only to swap the
//! handles.

use serde::Serialize;
use ztier_compress::Algorithm;

use crate::slot::{Content, PageSelector, SlotFlag, SlotOps};
use crate::stats::Counter;
use crate::{Busy, Device, Result, ZramError};

/// Secondary algorithms at most (priorities 1..=3).
pub const MAX_SECONDARY: usize = 3;

/// What one recompression pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecompResult {
    /// Pages tried.
    pub scanned: u64,
    /// Pages kept in a smaller class.
    pub recompressed: u64,
    /// Pages now marked incompressible.
    pub incompressible: u64,
    /// Bytes of objects before and after, over the pages kept.
    pub bytes_before: u64,
    pub bytes_after: u64,
}

impl Device {
    /// Sets the secondary algorithms (`recomp_algorithm`), priority 1 first. Refused while
    /// pages are stored by the algorithms it would change.
    pub fn set_recomp_algorithms(&self, algorithms: Vec<Algorithm>) -> Result<()> {
        if algorithms.len() > MAX_SECONDARY {
            return Err(ZramError::TooManyAlgorithms {
                given: algorithms.len(),
                max: MAX_SECONDARY,
            });
        }
        // Every shard first, as `reset` takes them: no I/O runs while the algorithms change
        // (the lock order is shard, slot, then the algorithms' lock).
        let mut shards = self.shards.lock_all();
        let in_use = self.occupied_slots().any(|s| s.lock().entry.priority() > 0);
        let mut current = self.recomp.write();
        if in_use && current[..] != algorithms[..] {
            return Err(ZramError::Busy(Busy::PagesOnSecondary));
        }
        // Streams are made from the algorithms on first use: drop any made for old ones.
        for shard in shards.iter_mut() {
            shard.recomp = Default::default();
        }
        *current = algorithms;
        Ok(())
    }

    /// The secondary algorithms, priority 1 first.
    pub fn recomp_algorithms(&self) -> Vec<Algorithm> {
        self.recomp.read().clone()
    }

    /// `echo "type=MODE [threshold=N] [priority=P]" > recompress`: recompresses the pages
    /// `mode` takes whose object is at least `threshold` bytes, with the secondary
    /// algorithms up to priority `max_priority` (default all).
    pub fn recompress(
        &self,
        mode: PageSelector,
        threshold: Option<usize>,
        max_priority: Option<u32>,
    ) -> Result<RecompResult> {
        if mode == PageSelector::Incompressible {
            return Err(ZramError::BadValue {
                attr: "recompress type".into(),
                value: "incompressible".into(),
                want: "idle, huge, huge_idle or all (incompressible pages are the ones no \
                       algorithm shrank)"
                    .into(),
            });
        }
        let n = self.recomp.read().len() as u32;
        if n == 0 {
            return Err(ZramError::NoSecondary);
        }
        let max_prio = max_priority.unwrap_or(n).min(n);
        let mut result = RecompResult::default();
        let mut object = vec![0u8; self.unit_size];
        let mut page = vec![0u8; self.unit_size];
        let now = self.now();
        for index in self.written_slots(0..self.pages()) {
            // A look under the slot lock alone first: most slots are not candidates, and
            // the page lock would hold off a writer of the page for nothing.
            // An empty slot is passed over without its lock, which would write (bring in)
            // its table page.
            let slot = self.slot(index)?;
            if slot.is_vacant() {
                continue;
            }
            let e = slot.lock().entry;
            if !self.wants_recompress(e, mode, threshold, max_prio, now) {
                continue;
            }
            let _page = self.page_lock(index);
            self.recompress_slot(
                index,
                mode,
                threshold,
                max_prio,
                now,
                &mut object,
                &mut page,
                &mut result,
            )?;
        }
        Ok(result)
    }

    /// Whether a slot is one `recompress` takes.
    fn wants_recompress(
        &self,
        e: crate::Entry,
        mode: PageSelector,
        threshold: Option<usize>,
        max_prio: u32,
        now: u32,
    ) -> bool {
        mode.selects(&e, now)
            && matches!(e.content(), Content::Stored(_))
            && !e.has(SlotFlag::UnderWb)
            && !e.has(SlotFlag::Incompressible)
            && e.priority() < max_prio
            && threshold.is_none_or(|t| e.size() >= t)
    }

    #[allow(clippy::too_many_arguments)]
    fn recompress_slot(
        &self,
        index: u64,
        mode: PageSelector,
        threshold: Option<usize>,
        max_prio: u32,
        now: u32,
        object: &mut [u8],
        page: &mut [u8],
        result: &mut RecompResult,
    ) -> Result<()> {
        let slot = self.slot(index)?;
        let mut shard = self.shard();
        let e = {
            let g = slot.lock();
            let e = g.entry;
            let Content::Stored(handle) = e.content() else {
                return Ok(());
            };
            if !self.wants_recompress(e, mode, threshold, max_prio, now) {
                return Ok(());
            }
            self.pool.read(handle, &mut object[..e.size()])?;
            e
        };
        // Counted in pages: a unit is its pages.
        let pages = self.pages_per_unit();
        result.scanned += pages;
        let old_size = e.size();
        if e.has(SlotFlag::Huge) {
            page.copy_from_slice(&object[..self.unit_size]);
        } else {
            let s = self.stream_for(&mut shard, e.priority());
            self.check_decoded(index, s.comp.decompress_page(&object[..old_size], page))?;
        }
        let old_class = self.pool.size_class(old_size);
        let huge_class = self.pool.huge_class_size();
        let mut kept = None;
        let mut last_tried = 0;
        for prio in e.priority() + 1..=max_prio {
            last_tried = prio;
            let s = self.stream_for(&mut shard, prio);
            let Ok(new) = s.compress(page) else { continue };
            if new.is_empty()
                || new.len() >= huge_class
                || self.pool.size_class(new.len()) >= old_class
            {
                continue;
            }
            kept = Some((prio, new.len()));
            break;
        }
        let Some((prio, new_len)) = kept else {
            // Marked incompressible only when the highest priority failed too.
            if last_tried == self.recomp.read().len() as u32 {
                let mut g = slot.lock();
                if g.entry.holds_same(&e) {
                    g.entry.set(SlotFlag::Incompressible, true);
                    shard
                        .counters
                        .add(Counter::RecompIncompressible, pages as i64);
                    result.incompressible += pages;
                }
            }
            return Ok(());
        };
        if threshold.is_some_and(|t| new_len >= t) {
            return Ok(());
        }
        let new_handle = {
            let s = self.stream_for(&mut shard, prio);
            self.pool.store(&s.buf[..new_len])?
        };
        let mut g = slot.lock();
        if !g.entry.holds_same(&e) {
            // Cannot happen under the page lock; keep the store consistent regardless.
            drop(g);
            self.pool.free(new_handle)?;
            return Ok(());
        }
        let (ac_time, idle) = (g.entry.ac_time(), g.entry.has(SlotFlag::Idle));
        self.free_slot(&mut shard.counters, index, &mut g.entry);
        g.entry.set_stored(new_handle, new_len);
        g.entry.set_priority(prio);
        g.entry.set_ac_time(ac_time);
        g.entry.set(SlotFlag::Idle, idle);
        shard.counters.add(Counter::ComprDataSize, new_len as i64);
        shard.counters.add(Counter::PagesStored, pages as i64);
        shard.counters.add(Counter::Recompressed, pages as i64);
        result.recompressed += pages;
        result.bytes_before += old_size as u64;
        result.bytes_after += new_len as u64;
        Ok(())
    }
}
