//! A writeback: pages collected slot by slot (each marked `UNDER_WB` and its bytes copied
//! out under its lock) into batches (a packed segment, or one page in the kernel's formats),
//! up to [`WB_IN_FLIGHT`] batches placed and written together with no lock held
//! ([`BlockDevice::write_many`]: one round trip to a distant store, not one each), then
//! committed slot by slot: a slot still `UNDER_WB` with the same object gives its pool object
//! back and names its place; one written or discarded meanwhile kept its new content, and
//! its bytes on the store are dead from the start. A failed write leaves its group's pages in
//! memory as they were and gives their places back; the writeback goes on with the next
//! group, as the kernel's goes on past a failed bio, until two fail in a row.
//!
//! Locks: the store's gate (shared, for the whole writeback), then a slot's lock to collect
//! or commit; none across the store's I/O (DESIGN.md's table).
//!
//! [`BlockDevice::write_many`]: ztier_blockdev::BlockDevice::write_many

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;
use ztier_swap::SLOT_BYTES;

use super::store::Backing;
use super::{
    same_store, whole_check, whole_segment, WbFormat, OBJECT_CRC, SEGMENT_MAGIC, SEG_BYTES,
    SEG_SLOTS,
};
use crate::slot::{Content, Entry, PageSelector, Place, SlotFlag, SlotOps};
use crate::stats::Counter;
use crate::{Busy, Device, Result, ZramError};

/// Units (packed segments, or single blocks) a writeback writes to the store together, in
/// flight at once: enough to keep a replicated store's disks busy while each write waits for
/// every replica (what 8 and 32 gave on Ceph: docs/diary.md, "Cold pages on a Ceph
/// cluster").
const WB_IN_FLIGHT: usize = 32;

/// What one writeback did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WbResult {
    pub pages: u64,
    pub bytes_written: u64,
    /// Pages whose write the store refused or lost (they stay in memory).
    pub failed_pages: u64,
}

/// Why a group of batches did not all go out.
enum GroupError {
    /// The store's write failed: the group's pages stay in memory as they were; the next
    /// group may go out (as the kernel's writeback goes on past a failed bio).
    Write(ZramError),
    /// Nothing more can go out (the limit, the store full or changed): the writeback stops.
    Stop(ZramError),
}

/// Groups failing to write one after another before a writeback gives up: a store that
/// is gone fails each after its timeout, and a writeback of thousands of pages would wait
/// that long for every group.
const FAILED_GROUPS_IN_A_ROW: u32 = 2;

/// Pages collected for one unit on the store (a packed segment, or one page), with their
/// bytes back to back.
struct Batch {
    pages: Vec<Pending>,
    buf: Vec<u8>,
    used: usize,
}

impl Batch {
    /// An empty batch for a unit of `format` on the store, for the device's units of
    /// `unit_size`: a packed segment starts with its magic.
    fn new(format: WbFormat, unit_size: usize) -> Batch {
        let bytes = match format {
            WbFormat::Packed => SEG_BYTES,
            _ => unit_size,
        };
        let mut b = Batch {
            pages: Vec::new(),
            buf: vec![0u8; bytes],
            used: 0,
        };
        if format == WbFormat::Packed {
            b.buf[..SEGMENT_MAGIC.len()].copy_from_slice(&SEGMENT_MAGIC);
            b.used = SEGMENT_MAGIC.len();
        }
        b
    }

    /// The bytes an object of `size` adds to the unit, its checksum's included.
    fn room_for(format: WbFormat, size: usize) -> usize {
        match format {
            WbFormat::Packed => size + OBJECT_CRC,
            _ => size,
        }
    }

    /// A packed segment holding one unit stored raw that fills it (a 64 KiB unit): no
    /// magic, no checksum after it (see [`whole_segment`]).
    fn whole_segment(pending: Pending, object: &[u8]) -> Batch {
        Batch {
            pages: vec![pending],
            buf: object.to_vec(),
            used: object.len(),
        }
    }

    /// The store's blocks its bytes take.
    fn blocks(&self) -> u64 {
        self.used.div_ceil(SLOT_BYTES as usize) as u64
    }
}

/// A page (a unit, on a device of larger units) copied out for a writeback, not yet
/// committed.
struct Pending {
    index: u64,
    /// The slot as collected: committed only if it still holds the same object.
    entry: Entry,
    size: usize,
    /// Where its bytes start in the batch's buffer.
    at: usize,
}

impl Device {
    /// `echo MODE > writeback`: writes matching pages of `range` (default all) to the backing
    /// store, at most `max_pages` of them. On a device of larger units a unit goes whole
    /// (its compressed object, or in the page format all of it): the units `range` touches
    /// are taken, and one is taken while fewer than `max_pages` pages are; the result
    /// counts pages (a unit's pages each).
    pub fn writeback(
        &self,
        mode: PageSelector,
        range: Option<std::ops::Range<u64>>,
        max_pages: Option<u64>,
    ) -> Result<WbResult> {
        let store = self.backing().ok_or(ZramError::NoBacking)?;
        // Held to the end: a save waits for this writeback, and it for a save; so does a
        // change of store (`set_backing`).
        let closed = store.gate.read();
        if *closed {
            return Err(ZramError::Busy(Busy::WritebackClosed));
        }
        if !same_store(self.backing().as_ref(), Some(&store)) {
            // Replaced (or taken away) between the look and the gate.
            return Err(ZramError::Busy(Busy::StoreChanged));
        }
        let range = range.unwrap_or(0..self.pages());
        if range.end > self.pages() {
            return Err(ZramError::BadIndex {
                index: range.end.saturating_sub(1),
                pages: self.pages(),
            });
        }
        // Slots from here on: the units the pages of `range` are in.
        let ppu = self.pages_per_unit();
        let range = range.start / ppu..range.end.div_ceil(ppu);
        let mut done = WbResult::default();
        // Full batches waiting to go out together, and the one being filled.
        let mut group: Vec<Batch> = Vec::new();
        let new_batch = || Batch::new(store.format, self.unit_size);
        let mut batch = new_batch();
        let mut page = vec![0u8; self.unit_size];
        let mut index = range.start;
        // Only the slots on table pages ever written can hold a page to take.
        let mut written = self.written_slots(range.clone());
        // A group's write failed: the last error, and how many in a row.
        let (mut write_error, mut failed_in_a_row) = (None, 0);
        let mut send = |group: &mut Vec<Batch>, done: &mut WbResult| -> Result<()> {
            match self.write_group(&store, group, done) {
                Ok(()) => {
                    failed_in_a_row = 0;
                    Ok(())
                }
                Err(GroupError::Write(e)) => {
                    failed_in_a_row += 1;
                    if failed_in_a_row >= FAILED_GROUPS_IN_A_ROW {
                        return Err(e);
                    }
                    write_error = Some(e);
                    Ok(())
                }
                Err(GroupError::Stop(e)) => Err(e),
            }
        };
        let r = loop {
            index = written.seek(index).unwrap_or(range.end);
            let queued = group.iter().map(|b| b.pages.len() as u64).sum::<u64>();
            let taken = done.pages + done.failed_pages + (queued + batch.pages.len() as u64) * ppu;
            let full = index >= range.end || max_pages.is_some_and(|m| taken >= m);
            if full {
                group.push(std::mem::replace(&mut batch, new_batch()));
                break send(&mut group, &mut done);
            }
            let mut p = match self.collect(index, mode, &store, &mut page) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    index += 1;
                    continue;
                }
                Err(e) => {
                    // Nothing collected and not written stays marked for writeback.
                    for p in group.iter().chain([&batch]).flat_map(|b| &b.pages) {
                        self.uncollect(p);
                    }
                    break Err(e);
                }
            };
            let queued_blocks = group.iter().map(Batch::blocks).sum::<u64>();
            let whole = whole_segment(store.format, p.size);
            let adds = Batch::room_for(store.format, p.size);
            let blocks = if whole {
                queued_blocks + batch.blocks() + SEG_SLOTS
            } else {
                queued_blocks + (batch.used + adds).div_ceil(SLOT_BYTES as usize) as u64
            };
            if self.writeback_limit().is_some_and(|left| blocks > left) {
                // The limit has no room for this page: write what fits, then stop.
                self.uncollect(&p);
                group.push(std::mem::replace(&mut batch, new_batch()));
                break send(&mut group, &mut done).and(Err(ZramError::WritebackLimit));
            }
            if whole {
                // A segment of its own, after the one being filled.
                group.push(std::mem::replace(&mut batch, new_batch()));
                group.push(Batch::whole_segment(p, &page[..SEG_BYTES]));
                index += 1;
                if group.len() >= WB_IN_FLIGHT {
                    if let Err(e) = send(&mut group, &mut done) {
                        break Err(e);
                    }
                }
                continue;
            }
            let room = match store.format {
                WbFormat::Packed => batch.used + adds <= SEG_BYTES,
                _ => batch.pages.is_empty(),
            };
            if !room {
                // This one starts the next batch: put it back as it was, queue the batch,
                // and write the group once it is full.
                self.uncollect(&p);
                group.push(std::mem::replace(&mut batch, new_batch()));
                if group.len() >= WB_IN_FLIGHT {
                    if let Err(e) = send(&mut group, &mut done) {
                        break Err(e);
                    }
                }
                continue;
            }
            let bytes = match store.format {
                WbFormat::Page => &page[..],
                _ => &page[..p.size],
            };
            let used = batch.used;
            batch.buf[used..used + bytes.len()].copy_from_slice(bytes);
            if store.format == WbFormat::Packed {
                let crc = crc32fast::hash(bytes).to_le_bytes();
                batch.buf[used + bytes.len()..used + bytes.len() + OBJECT_CRC]
                    .copy_from_slice(&crc);
            }
            p.at = used;
            p.size = bytes.len();
            batch.used += Batch::room_for(store.format, bytes.len());
            batch.pages.push(p);
            index += 1;
        };
        // A failed group the writeback went on past is its error, as the kernel returns
        // the last bio's error after writing what it could.
        let r = r.and(write_error.map_or(Ok(()), Err));
        r.map(|()| done).map_err(|e| match e {
            // The limit's own error is what the kernel gives, whatever went out before it.
            ZramError::WritebackLimit if done.failed_pages == 0 => e,
            e if done.pages > 0 || done.failed_pages > 0 => ZramError::WritebackCut {
                pages: done.pages,
                bytes: done.bytes_written,
                failed: done.failed_pages,
                cause: Box::new(e),
            },
            e => e,
        })
    }

    /// Marks slot `index` `UNDER_WB` and copies its bytes into `page` (the object, or the
    /// whole page or unit decompressed for [`WbFormat::Page`]), if writeback of `mode`
    /// takes it.
    fn collect(
        &self,
        index: u64,
        mode: PageSelector,
        store: &Backing,
        page: &mut [u8],
    ) -> Result<Option<Pending>> {
        let slot = self.slot(index)?;
        let now = self.now();
        let takes = |e: &Entry| {
            matches!(e.content(), Content::Stored(_))
                && !e.has(SlotFlag::UnderWb)
                && mode.selects(e, now)
        };
        // A look under the slot lock alone first: most slots are not taken, and a shard
        // is not worth locking for them. An empty slot is passed over without its lock,
        // whose compare-and-swap would write (bring in) a table page no page was ever
        // stored in.
        if slot.is_vacant() || !takes(&slot.lock().entry) {
            return Ok(None);
        }
        let mut shard = self.shard();
        let mut g = slot.lock();
        let e = g.entry;
        if !takes(&e) {
            return Ok(None);
        }
        let Content::Stored(handle) = e.content() else {
            return Ok(None); // (`takes` saw a stored object)
        };
        let size = e.size();
        if store.format == WbFormat::Page && !e.has(SlotFlag::Huge) {
            let s = self.stream_for(&mut shard, e.priority());
            let comp = &mut s.comp;
            let decoded = self.pool.read_map(handle, &mut s.buf, |object| {
                comp.decompress_page(object, page)
            })?;
            self.check_decoded(index, decoded)?;
        } else {
            self.pool.read(handle, &mut page[..size])?;
        }
        g.entry.set(SlotFlag::UnderWb, true);
        Ok(Some(Pending {
            index,
            entry: e,
            size,
            at: 0,
        }))
    }

    /// Clears `UNDER_WB` of a page collected but not written.
    fn uncollect(&self, p: &Pending) {
        if let Ok(slot) = self.slot(p.index) {
            let mut g = slot.lock();
            if g.entry.holds_same(&p.entry) {
                g.entry.set(SlotFlag::UnderWb, false);
            }
        }
    }

    /// Writes a group of batches, each to a new place, all in flight together, and commits
    /// their pages. A batch the writeback limit or the store's room refuses is put back with
    /// every batch after it (the ones before it go out), and its reason is the error; a
    /// failed write puts every batch of the group back in memory as it was and gives their
    /// places back. The group is empty after it.
    fn write_group(
        &self,
        store: &Backing,
        group: &mut Vec<Batch>,
        done: &mut WbResult,
    ) -> std::result::Result<(), GroupError> {
        group.retain(|b| !b.pages.is_empty());
        if group.is_empty() {
            return Ok(());
        }
        // A packed segment, a block, or a unit's run of blocks.
        let order = store.unit_order();
        // The store changes now: a state saved before no longer describes it.
        let mut refused = store.unmark().err();
        let mut placed: Vec<(u64, Batch)> = Vec::new();
        for mut b in group.drain(..) {
            if refused.is_none() {
                let blocks = b.blocks();
                if !self.take_limit(blocks) {
                    refused = Some(ZramError::WritebackLimit);
                } else {
                    match store.places.alloc(order) {
                        Ok(first) => {
                            // Whole blocks go to the store: the tail of the last one is zeros.
                            b.buf.truncate((blocks * SLOT_BYTES) as usize);
                            b.buf[b.used..].fill(0);
                            placed.push((first, b));
                            continue;
                        }
                        Err(e) => refused = Some(ZramError::Backing(e)),
                    }
                }
            }
            // Refused by the store (full, or its header not written), not by the limit:
            // these pages failed to go out.
            if !matches!(refused, Some(ZramError::WritebackLimit)) {
                let pages = b.pages.len() as u64 * self.pages_per_unit();
                store.failed.fetch_add(pages, Relaxed);
                done.failed_pages += pages;
            }
            for p in b.pages.drain(..) {
                self.uncollect(&p);
            }
        }
        let writes: Vec<(u64, &[u8])> = placed.iter().map(|(f, b)| (*f, &b.buf[..])).collect();
        if let Err(e) = store.places.write_runs(&writes) {
            let units: u64 = placed.iter().map(|(_, b)| b.pages.len() as u64).sum();
            let pages = units * self.pages_per_unit();
            store.failed.fetch_add(pages, Relaxed);
            done.failed_pages += pages;
            // The limit blocks these batches took go back: nothing of them was written.
            let taken: u64 = placed.iter().map(|(_, b)| b.blocks()).sum();
            self.give_back_limit(taken);
            for (first, b) in placed {
                let _ = store.places.free_range(first, 1 << order);
                for p in &b.pages {
                    self.uncollect(p);
                }
            }
            // The write failed: the writeback may go on with the next group, unless a batch
            // was refused before it (the limit, the store full), which stops it.
            return Err(match refused {
                Some(r) => GroupError::Stop(r),
                None => GroupError::Write(ZramError::Backing(e)),
            });
        }
        for (first, mut b) in placed {
            self.commit(store, first, &mut b, done)
                .map_err(GroupError::Stop)?;
        }
        refused.map_or(Ok(()), |e| Err(GroupError::Stop(e)))
    }

    /// Commits the pages of a batch written at `first`: each slot still as collected now
    /// names its place there.
    fn commit(
        &self,
        store: &Backing,
        first: u64,
        batch: &mut Batch,
        done: &mut WbResult,
    ) -> Result<()> {
        let blocks = batch.blocks();
        store.bytes_written.fetch_add(blocks * SLOT_BYTES, Relaxed);
        // Held while the commits count the place's live bytes in.
        store.hold_bytes(first, 1);
        let mut shard = self.shard();
        shard.counters.add(Counter::BdWrites, blocks as i64);
        // Counted in pages (`bd_count` is the kernel's): a unit is its pages.
        let pages = self.pages_per_unit();
        let mut committed = 0;
        for p in batch.pages.drain(..) {
            let slot = self.slot(p.index)?;
            let mut g = slot.lock();
            if !g.entry.holds_same(&p.entry) || !g.entry.has(SlotFlag::UnderWb) {
                continue; // rewritten or discarded meanwhile: its bytes are dead
            }
            let (prio, ac_time, idle) = (
                g.entry.priority(),
                g.entry.ac_time(),
                g.entry.has(SlotFlag::Idle),
            );
            let stored = if store.format == WbFormat::Page {
                self.unit_size
            } else {
                p.size
            };
            // A segment's byte; for a unit filling its segment, its check instead.
            let at = if whole_segment(store.format, stored) {
                whole_check(&batch.buf[..stored])
            } else {
                p.at
            };
            self.free_slot(&mut shard.counters, p.index, &mut g.entry);
            let mut e = Entry::default();
            e.set_written_back(Place::new(first, at), stored);
            e.set(SlotFlag::Huge, stored == self.unit_size);
            e.set(SlotFlag::Idle, idle);
            e.set_priority(if stored == self.unit_size { 0 } else { prio });
            e.set_ac_time(ac_time);
            g.entry = e;
            shard.counters.add(Counter::PagesStored, pages as i64);
            shard.counters.add(Counter::BdCount, pages as i64);
            store.bytes_stored.fetch_add(stored as u64, Relaxed);
            store.hold_bytes(first, stored);
            committed += pages;
        }
        drop(shard);
        // The commit's hold: with no page committed, the place goes back now.
        store.release_bytes(first, 1);
        done.pages += committed;
        done.bytes_written += blocks * SLOT_BYTES;
        Ok(())
    }
}
