//! The store: the backing device and its free-space map (the swap-slot allocator over it),
//! each unit's live bytes (a packed segment's, or a block's: the unit goes back to the
//! allocator when they reach zero), the holds that keep a unit from being freed while it is
//! read or committed (`Pin`), the store's identity (its swap header's random id), and the
//! stamp a saved state leaves on it (`mark`, `unmark`); `bd_stat`'s figures.
//!
//! Invariants: a unit is freed only when its live count is zero (no live object, no hold),
//! and, while a saved state's stamp is on the store, not even then: it waits in `Mark`'s
//! `deferred` until the next change to the store. Locks: DESIGN.md's table
//! (`Backing::gate`, `Backing::mark`, `Backing::stamping`).

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{AcqRel, Relaxed},
};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};
use serde::Serialize;
use ztier_base::zeroed::Table;
use ztier_blockdev::BlockDevice;
use ztier_swap::{SwapError, SLOT_BYTES};

use super::cache::{Ahead, AheadThreads, SegmentCache};
use super::{WbFormat, SEG_SLOTS, SWAP_UUID_AT};
use crate::slot::Place;
use crate::stats::{Counter, Counters};
use crate::{Result, StateError, ZramError};

/// A stamp no other save made: the clock, the process and a hasher's random keys.
fn new_stamp() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut stamp = [0u8; 16];
    for (i, half) in stamp.chunks_mut(8).enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_ne_bytes());
    }
    // Never all zeros (an unmarked store's).
    stamp[0] |= 1;
    stamp
}

/// `bd_stat`, in the kernel's units (4 KiB pages), and ztier's byte counts beside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BdStat {
    /// Pages held on the store now.
    pub bd_count: u64,
    /// Reads from the store: one per page in the kernel's formats, one per segment read whole
    /// in the packed format (the other pages of a segment come from the segment cache).
    pub bd_reads: u64,
    /// 4 KiB blocks written to the store.
    pub bd_writes: u64,
    /// Bytes written to the store.
    pub bytes_written: u64,
    /// Bytes of live objects on the store (what the held pages take there).
    pub bytes_stored: u64,
    /// Bytes of blocks or segments held on the store.
    pub bytes_held: u64,
    /// Pages writebacks could not write (the store refused or vanished); they stayed in
    /// memory.
    pub failed_writebacks: u64,
    /// Reads of written-back pages whose copy failed its checksum (each an I/O error).
    pub checksum_failures: u64,
}

/// The backing store and its free-space map.
pub struct Backing {
    /// The device the places are on (for its epoch: the segment cache's lifetime).
    pub(super) store: Arc<dyn BlockDevice>,
    pub(super) places: ztier_swap::Device,
    pub(super) format: WbFormat,
    /// Slots per unit of `live`: a segment's (packed), or, in the kernel's formats, one
    /// block's, or a device unit's blocks on a device of larger units (each unit written
    /// back to an aligned run of them: [`Backing::for_unit_size`]).
    pub(super) unit_slots: u64,
    /// Per unit, by first slot / `unit_slots`: the live bytes of the objects in it, plus one
    /// for each hold (a batch being committed, a read in flight). The unit goes back to the
    /// allocator when it reaches zero.
    pub(super) live: Table<AtomicU32>,
    /// Packed segments recently read whole (shared with the reads in flight that fill it).
    pub(super) cache: Arc<SegmentCache>,
    /// A sequential reader's readahead in the background.
    pub(super) ahead: Mutex<Ahead>,
    /// Packed segments read from the store (`bd_reads`), counted once read, before a reader
    /// waiting for one wakes.
    pub(super) segment_reads: AtomicU64,
    /// Background readahead threads running now (at most [`AHEAD_THREADS`]).
    pub(super) ahead_threads: AheadThreads,
    /// Whether the store is as a saved state left it (see [`Backing::mark`]).
    pub(super) mark: Mutex<Mark>,
    /// Held by whoever writes the store's stamp, so a mark and an unmark land in order.
    pub(super) stamping: Mutex<()>,
    /// Writebacks hold it shared for their whole length, a save exclusively for its whole
    /// length (so no writeback changes the store under a state being saved); true once
    /// writeback is closed for good ([`Device::close_writeback`]).
    pub(super) gate: RwLock<bool>,
    pub(super) bytes_written: AtomicU64,
    pub(super) bytes_stored: AtomicU64,
    /// Pages a writeback could not write (the store refused or vanished).
    pub(super) failed: AtomicU64,
    /// Reads whose copy failed its checksum.
    pub(super) corrupt: AtomicU64,
}

/// A saved state's hold on the store: while `marked`, the store's header carries the stamp
/// of the last state saved, and nothing the state names has changed since: units whose last
/// live byte goes wait in `deferred` (not freed, so neither discarded nor handed out again)
/// until the next change to the store clears the stamp ([`Backing::unmark`]).
#[derive(Default)]
pub(super) struct Mark {
    pub(super) marked: bool,
    pub(super) deferred: Vec<u64>,
}

/// The allocator's settings for a store: freed clusters are discarded.
fn places_config() -> ztier_swap::Config {
    ztier_swap::Config {
        discard: true,
        ..ztier_swap::Config::default()
    }
}

/// A store's live counts, one for each unit of `format` in `store_bytes` (in the page and
/// compressed formats a unit is one 4 KiB slot: 4 bytes of counts a slot), in memory the
/// OS zeroes, so they cost memory as the store is used, not as it is large. Refused, with
/// the reason, where they and the store's slot map together would not fit the machine's
/// memory, or they cannot be allocated: a store that says it is huge (a sparse file, a
/// remote export) must not abort the process.
fn live_counts(store_bytes: u64, format: WbFormat) -> Result<Table<AtomicU32>> {
    live_counts_within(store_bytes, format, ztier_pool::physical_memory_bytes())
}

/// [`live_counts`] on a machine of `memory_bytes`.
fn live_counts_within(
    store_bytes: u64,
    format: WbFormat,
    memory_bytes: u64,
) -> Result<Table<AtomicU32>> {
    // A store the allocator cannot take (too small, or more slots than it addresses) is
    // refused before anything is allocated for it.
    let slots = ztier_swap::Device::slots_for(store_bytes).map_err(ZramError::Backing)?;
    let units = slots.div_ceil(unit_slots_of(format));
    let bytes = units.saturating_mul(std::mem::size_of::<AtomicU32>() as u64);
    // The allocator's map beside them, both at their fullest: each alone may fit where the
    // two do not.
    let map_bytes = ztier_swap::Device::slot_map_bytes(store_bytes);
    if bytes.saturating_add(map_bytes) > memory_bytes {
        return Err(ZramError::StoreTooLarge {
            store_bytes,
            format,
            live_count_bytes: bytes,
            map_bytes,
            memory_bytes,
        });
    }
    // Zeroed by the OS: a unit's count takes memory once the unit is first used.
    usize::try_from(units)
        .ok()
        .and_then(ztier_base::zeroed::counts)
        .inspect(|live| ztier_base::zeroed::no_huge_pages(live))
        .ok_or(ZramError::LiveCountsAlloc {
            store_bytes,
            format,
            live_count_bytes: bytes,
            map_bytes,
        })
}

/// The slots of a unit of `format`: a packed segment's, or one block.
fn unit_slots_of(format: WbFormat) -> u64 {
    match format {
        WbFormat::Packed => SEG_SLOTS,
        WbFormat::Page | WbFormat::Compressed => 1,
    }
}

/// The slots of a unit of `format` on the store of a device of `unit_size` units: a packed
/// segment's, or in the kernel's formats the device unit's blocks (one, for pages).
fn unit_slots_for(format: WbFormat, unit_size: usize) -> u64 {
    match format {
        WbFormat::Packed => SEG_SLOTS,
        WbFormat::Page | WbFormat::Compressed => {
            (unit_size as u64 / SLOT_BYTES).max(unit_slots_of(format))
        }
    }
}

impl Backing {
    /// A store on `dev` (its first 4 KiB hold the allocator's header), formatted: whatever
    /// it held is forgotten.
    pub fn new(dev: Arc<dyn BlockDevice>, format: WbFormat) -> Result<Backing> {
        // Refused before the store is formatted.
        let live = live_counts(dev.size(), format)?;
        let places = ztier_swap::Device::new(Arc::clone(&dev), places_config())
            .map_err(ZramError::Backing)?;
        Ok(Backing::over(dev, places, format, live, false))
    }

    /// The store a saved state's pages are on, opened again as it is, not formatted: the
    /// allocator holds exactly `units` (each a unit's first slot and live bytes) and the
    /// live counts are theirs. The caller checks the store's id and stamp against the
    /// state's. Nothing is written.
    pub(crate) fn reopen(
        dev: Arc<dyn BlockDevice>,
        format: WbFormat,
        unit_size: usize,
        units: &[(u64, u32)],
    ) -> Result<Backing> {
        let order = unit_slots_for(format, unit_size).trailing_zeros();
        let runs: Vec<(u64, u32)> = units.iter().map(|&(first, _)| (first, order)).collect();
        // Weighed before the allocator's map is made, as for a new store.
        let live = live_counts(dev.size(), format)?;
        let places =
            ztier_swap::Device::reopen(Arc::clone(&dev), places_config(), &runs).map_err(|e| {
                match e {
                    SwapError::NotTheArea(why) => StateError::StoreNotTheArea(why),
                    e => StateError::StoreReopen(e),
                }
            })?;
        let store = Backing::over(dev, places, format, live, true).for_unit_size(unit_size);
        for &(first, live) in units {
            store.live_of(first).store(live, Relaxed);
        }
        Ok(store)
    }

    pub(super) fn over(
        store: Arc<dyn BlockDevice>,
        places: ztier_swap::Device,
        format: WbFormat,
        live: Table<AtomicU32>,
        marked: bool,
    ) -> Backing {
        let unit_slots = unit_slots_of(format);
        debug_assert_eq!(live.len() as u64, places.slots().div_ceil(unit_slots));
        Backing {
            live,
            cache: Arc::default(),
            ahead: Mutex::new(Ahead::default()),
            segment_reads: AtomicU64::new(0),
            ahead_threads: AheadThreads::default(),
            mark: Mutex::new(Mark {
                marked,
                deferred: Vec::new(),
            }),
            stamping: Mutex::new(()),
            gate: RwLock::new(false),
            store,
            places,
            format,
            unit_slots,
            bytes_written: AtomicU64::new(0),
            bytes_stored: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
        }
    }

    /// The store as a device of `unit_size` units writes back to it: in the kernel's
    /// formats each unit goes to an aligned run of `unit_size / 4 KiB` blocks (an order-n
    /// allocation, as the swap allocator hands out a large folio's slots), so a unit's
    /// live count and its return to the allocator are the run's; a packed segment (64 KiB)
    /// holds units as it holds pages. For a store no unit was written back to yet (a new
    /// one, or one being reopened): its live counts, made for single blocks, index runs as
    /// well (more counts than runs, and the OS gives memory only to those used).
    pub(crate) fn for_unit_size(mut self, unit_size: usize) -> Backing {
        self.unit_slots = unit_slots_for(self.format, unit_size);
        self
    }

    /// The allocation order of a unit of `live` (a run of `unit_slots` slots).
    pub(super) fn unit_order(&self) -> u32 {
        self.unit_slots.trailing_zeros()
    }

    /// Counts `bytes` of live objects a reloaded state put back on the store.
    pub(crate) fn count_stored(&self, bytes: u64) {
        self.bytes_stored.fetch_add(bytes, Relaxed);
    }

    /// The store's id (its swap header's `sws_uuid`).
    pub(crate) fn uuid(&self) -> [u8; 16] {
        self.places.uuid()
    }

    /// The stamp in the store's header.
    pub(crate) fn stamp(&self) -> [u8; 16] {
        self.places.stamp()
    }

    /// Slots on the store, header included.
    pub(crate) fn slots(&self) -> u64 {
        self.places.slots()
    }

    /// Bytes a unit holds: a segment's, or a block's.
    pub(crate) fn unit_bytes(&self) -> usize {
        (self.unit_slots * SLOT_BYTES) as usize
    }

    /// The first slot of a unit that slot `first` starts, if it starts one.
    pub(crate) fn is_unit_start(&self, first: u64) -> bool {
        first > 0 && first < self.places.slots() && first.is_multiple_of(self.unit_slots)
    }

    /// Stamps the store for a state being saved: from now until [`Backing::unmark`], no
    /// unit is given back to the allocator, so what the state names stays on the store.
    /// Returns the stamp, which the state keeps.
    /// A store still stamped (nothing written back since the last mark) keeps its stamp:
    /// a save that fails or is cut short before its state is in place then leaves the last
    /// state saved loadable. A new stamp is written only after an unmark.
    pub(crate) fn mark(&self) -> Result<[u8; 16]> {
        let _serial = self.stamping.lock();
        if self.mark.lock().marked {
            let stamp = self.places.stamp();
            if stamp != [0; 16] {
                return Ok(stamp);
            }
        }
        let stamp = new_stamp();
        self.places.set_stamp(stamp).map_err(ZramError::Backing)?;
        self.mark.lock().marked = true;
        Ok(stamp)
    }

    /// Keeps writebacks out until the guard drops: taken by a save for its whole length.
    pub(crate) fn exclude_writeback(&self) -> RwLockWriteGuard<'_, bool> {
        self.gate.write()
    }

    /// Before any change to the store: its stamp is cleared (the saved state no longer
    /// describes it, and is refused if loaded), and the units kept for it go back.
    pub(super) fn unmark(&self) -> Result<()> {
        if !self.mark.lock().marked {
            return Ok(());
        }
        let _serial = self.stamping.lock();
        if !self.mark.lock().marked {
            return Ok(());
        }
        self.places.set_stamp([0; 16]).map_err(ZramError::Backing)?;
        let deferred = {
            let mut m = self.mark.lock();
            m.marked = false;
            std::mem::take(&mut m.deferred)
        };
        for start in deferred {
            self.free_unit(start);
        }
        Ok(())
    }

    pub fn format(&self) -> WbFormat {
        self.format
    }

    /// The size a backing file for a disk of `disk_bytes` is made with: a block for every
    /// page (the kernel's formats need one each; packed needs less), the header block, and a
    /// cluster spare so the last pages still find aligned runs.
    pub fn size_for(disk_bytes: u64) -> u64 {
        let cluster = 512;
        let pages = disk_bytes.div_ceil(SLOT_BYTES);
        ((pages + 1).div_ceil(cluster) + 1) * cluster * SLOT_BYTES
    }

    /// The bytes of the store that tell it from any other: the random id in its header (a
    /// Linux swap header's `sws_uuid`; the rest of the header changes with a saved state's
    /// stamp). A remote store that does not hold them is not this one (restarted empty, or
    /// another export), so the owner of a remote store pins them as its identity.
    pub fn identity(&self) -> (u64, usize) {
        (SWAP_UUID_AT, 16)
    }

    /// The memory the store's tables hold now (its live counts, the allocator's slot map):
    /// what they take as the store is used, not as it is large.
    pub fn metadata_bytes(&self) -> u64 {
        ztier_base::zeroed::resident_bytes(&self.live).unwrap_or(0)
            + self.places.slot_map_resident_bytes()
    }

    /// Pages the store has room for, at most.
    pub fn capacity_pages(&self) -> u64 {
        self.places.usable_slots()
    }

    /// Gives back the `size` bytes of a dead object at `place`.
    pub(super) fn release(&self, place: Place, size: usize) {
        self.bytes_stored.fetch_sub(size as u64, Relaxed);
        self.release_bytes(place.first(), size);
    }

    /// The live count of the unit holding slot `first`.
    pub(super) fn live_of(&self, first: u64) -> &AtomicU32 {
        &self.live[(first / self.unit_slots) as usize]
    }

    /// Adds a hold (or an object's bytes) to the unit holding slot `first`.
    pub(super) fn hold_bytes(&self, first: u64, n: usize) {
        self.live_of(first).fetch_add(n as u32, Relaxed);
    }

    /// Drops `n` of the unit's live count; the last one gives the unit back (or, while a
    /// saved state names the store, keeps it until the stamp is cleared).
    pub(super) fn release_bytes(&self, first: u64, n: usize) {
        // AcqRel: every read of the unit under a hold happens before its slots are freed.
        if self.live_of(first).fetch_sub(n as u32, AcqRel) == n as u32 {
            let start = first / self.unit_slots * self.unit_slots;
            // Out of the cache before its slots can be handed out again.
            if self.format == WbFormat::Packed {
                self.cache.forget(start);
            }
            {
                let mut m = self.mark.lock();
                if m.marked {
                    m.deferred.push(start);
                    return;
                }
            }
            self.free_unit(start);
        }
    }

    pub(super) fn free_unit(&self, start: u64) {
        let _ = if self.unit_slots == 1 {
            self.places.free(start)
        } else {
            self.places.free_range(start, self.unit_slots)
        };
    }

    /// A hold on the unit at slot `first` if it is live (allocated and holding objects):
    /// readahead's, which must not revive a unit on its way back to the allocator.
    pub(super) fn try_hold(&self, first: u64) -> bool {
        let Some(live) = self.live.get((first / self.unit_slots) as usize) else {
            return false;
        };
        live.fetch_update(AcqRel, Relaxed, |v| (v > 0).then_some(v + 1))
            .is_ok()
    }

    /// Keeps the place `handle` names from being freed (and so handed out again) until the
    /// pin goes. Taken under the lock of a slot that names it: that slot's own bytes keep the
    /// unit alive until then.
    pub(crate) fn pin(self: &Arc<Backing>, place: Place) -> Pin {
        self.hold_bytes(place.first(), 1);
        Pin {
            store: Arc::clone(self),
            first: place.first(),
        }
    }

    pub(super) fn read(&self, place: Place, out: &mut [u8]) -> std::result::Result<(), SwapError> {
        self.places.read_bytes(place.first(), place.at(), out)
    }

    pub(crate) fn stat(&self, counters: &Counters) -> BdStat {
        BdStat {
            bd_count: counters.get(Counter::BdCount),
            bd_reads: counters.get(Counter::BdReads) + self.segment_reads.load(Relaxed),
            bd_writes: counters.get(Counter::BdWrites),
            bytes_written: self.bytes_written.load(Relaxed),
            bytes_stored: self.bytes_stored.load(Relaxed),
            bytes_held: self.places.in_use() * SLOT_BYTES,
            failed_writebacks: self.failed.load(Relaxed),
            checksum_failures: self.corrupt.load(Relaxed),
        }
    }
}

/// A hold on a written-back page's place on the store (see [`Backing::pin`]): while it
/// lives, a slot that names the place is the page that was read from it.
pub(crate) struct Pin {
    pub(super) store: Arc<Backing>,
    pub(super) first: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.store.release_bytes(self.first, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_counts_and_the_slot_map_are_weighed_together() {
        // A 1 GiB store in the page format: 1 MiB of live counts, and a slot map at its
        // peak about half of that.
        let store = 1u64 << 30;
        let counts = (store / SLOT_BYTES) * 4;
        let map = ztier_swap::Device::slot_map_bytes(store);
        assert!(map > 0 && map < counts, "{map} {counts}");
        // Room for either alone, not for both: refused, saying both.
        let err = live_counts_within(store, WbFormat::Page, counts + map - 1).unwrap_err();
        assert!(
            matches!(
                err,
                ZramError::StoreTooLarge { live_count_bytes, map_bytes, .. }
                    if live_count_bytes == counts && map_bytes == map
            ),
            "{err}"
        );
        let err = err.to_string();
        assert!(
            err.contains(&format!("{counts} bytes of live counts"))
                && err.contains(&format!("{map} bytes of slot map")),
            "{err}"
        );
        // A store the allocator cannot take is refused before any count is made.
        let err = live_counts_within(SLOT_BYTES, WbFormat::Page, u64::MAX)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least two"), "{err}");
        // Nor is one with more slots than the allocator addresses, however much memory
        // there is (its counts would be 16 GiB, made before the allocator refused it).
        let err = live_counts_within(
            (u64::from(u32::MAX) + 1) * SLOT_BYTES,
            WbFormat::Page,
            u64::MAX,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("at most"), "{err}");
        // Room for both: made, every count zero.
        let live = live_counts_within(store, WbFormat::Page, counts + map).unwrap();
        assert_eq!(live.len() as u64, store / SLOT_BYTES);
        assert!(live
            .iter()
            .all(|c| c.load(std::sync::atomic::Ordering::Relaxed) == 0));
    }
}
