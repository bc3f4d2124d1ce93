//! zram writeback (`CONFIG_ZRAM_WRITEBACK` in `zram_drv.c`): idle, huge, incompressible or
//! all pages moved from the pool to a backing store, which is any block device of the
//! groundwork trait (a local file, a remote NBD export; zram never knows which).
//!
//! Places on the store come from the swap-slot allocator (`ztier_swap::Device` over the
//! store): a block per page, or, packed, a 64 KiB segment (an order-4 run of slots) per
//! batch. The allocator already keeps free space by cluster, hands out aligned runs,
//! batches frees and discards freed clusters off the allocation path, all of which a bitmap
//! would have to grow again.
//!
//! Three formats:
//! - [`WbFormat::Page`], the kernel's default: each page decompressed into its own block;
//! - [`WbFormat::Compressed`], the kernel's `compressed_writeback`: each compressed object in
//!   its own block (less CPU, the same blocks and bytes);
//! - [`WbFormat::Packed`], ztier's: compressed objects packed back to back into segments,
//!   so bytes written and stored fall by the compression ratio. A segment's live bytes are
//!   counted; the segment goes back to the allocator (and its blocks are discarded) when
//!   the last object in it dies (an overwrite, a discard, a reset).
//!
//! A batch is collected slot by slot (each slot marked `UNDER_WB` and its bytes copied out
//! under its lock), written with no lock held, then committed slot by slot: a slot still
//! `UNDER_WB` with the same handle gives its pool object back and now names its place; one
//! written or discarded meanwhile kept its new content and its bytes in the segment are
//! dead from the start. A failed write leaves every slot of the batch in memory as it was.
//!
//! Reads of a written-back page hold no lock across the store's I/O: under the slot's lock
//! they pin the page's place (a hold on its segment's, or block's, live count, so the place
//! cannot be freed and handed out again), read the store with nothing locked, and the caller
//! checks the slot still names that place before answering (a page rewritten or discarded
//! meanwhile is read again). A slow or vanished store so stalls only the reads of its own
//! pages: never writes to other pages of the stripe, the shard, `stat` or `ctl`. Reads never
//! take the page back into the pool (nor does the kernel). A packed page's read fetches its
//! whole segment in one request and keeps it in a small cache (`SEGMENT_CACHE` segments),
//! so the pages written back together cost the store one read between them; a segment leaves
//! the cache when it is freed, before its slots can be handed out again.
//!
//! Locks: a slot's lock (to pin, collect or commit), then `Backing::cache` (a leaf, held to
//! look up, add or drop one segment, never across I/O), then the swap allocator's.

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{AcqRel, Relaxed},
};
use std::sync::Arc;

use parking_lot::Mutex;

use serde::Serialize;
use ztier_blockdev::BlockDevice;
use ztier_swap::{SwapError, SLOT_BYTES};

use ztier_base::bits::Field;

use crate::slot::{Content, Entry, PageSelector, SlotFlag};
use crate::stats::{Counter, Counters};
use crate::{Device, Result, ZramError};

/// Slots of a packed segment (an order-4 allocation: 64 KiB).
const SEG_ORDER: u32 = 4;
const SEG_SLOTS: u64 = 1 << SEG_ORDER;
const SEG_BYTES: usize = (SEG_SLOTS * SLOT_BYTES) as usize;
/// A place's fields in a written-back slot's handle word: the byte in the block or
/// segment, then its first slot.
const PLACE_AT: Field = Field::at(0, 16);
const PLACE_FIRST: Field = Field::after(PLACE_AT, 48);
const _: () = assert!(SEG_BYTES as u64 - 1 <= PLACE_AT.max());

/// Where a written-back page is on the store: the first slot of its block or segment, and
/// the byte in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    first: u64,
    at: usize,
}

impl Place {
    pub(crate) fn new(first: u64, at: usize) -> Place {
        Place { first, at }
    }
    /// The place packed into a slot's handle word.
    pub(crate) fn raw(self) -> u64 {
        PLACE_FIRST.put(self.first) | PLACE_AT.put(self.at as u64)
    }
    pub(crate) fn from_raw(raw: u64) -> Place {
        Place {
            first: PLACE_FIRST.get(raw),
            at: PLACE_AT.get(raw) as usize,
        }
    }
}

/// How written-back pages are laid out on the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WbFormat {
    Page,
    Compressed,
    Packed,
}

impl std::str::FromStr for WbFormat {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<WbFormat, String> {
        match s {
            "page" => Ok(WbFormat::Page),
            "compressed" => Ok(WbFormat::Compressed),
            "packed" => Ok(WbFormat::Packed),
            _ => Err(format!(
                "{s:?}: the writeback formats are page, compressed and packed"
            )),
        }
    }
}

/// Packed segments kept after a read, so the pages written back together (usually
/// neighbours, read together again) cost one request to the store, not one each.
const SEGMENT_CACHE: usize = 32;

/// Recently read packed segments, most recent last. A segment is read whole on a miss, while
/// a pin keeps it allocated, and leaves the cache when its last live byte goes, before its
/// slots can be handed out again; so a cached segment always holds what the store holds.
/// Bounded at [`SEGMENT_CACHE`] segments (2 MiB); the lock is held to look up, add or drop
/// one, never across I/O.
#[derive(Default)]
struct SegmentCache {
    segments: Mutex<Vec<(u64, Arc<[u8]>)>>,
}

impl SegmentCache {
    fn get(&self, first: u64) -> Option<Arc<[u8]>> {
        let mut segs = self.segments.lock();
        let i = segs.iter().position(|(f, _)| *f == first)?;
        let hit = segs.remove(i);
        let bytes = Arc::clone(&hit.1);
        segs.push(hit);
        Some(bytes)
    }

    fn add(&self, first: u64, bytes: Arc<[u8]>) {
        let mut segs = self.segments.lock();
        segs.retain(|(f, _)| *f != first);
        if segs.len() == SEGMENT_CACHE {
            segs.remove(0);
        }
        segs.push((first, bytes));
    }

    fn forget(&self, first: u64) {
        self.segments.lock().retain(|(f, _)| *f != first);
    }
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
    /// Writebacks that failed (the store refused or vanished); their pages stayed in memory.
    pub failed_writebacks: u64,
}

/// What one writeback did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WbResult {
    pub pages: u64,
    pub bytes_written: u64,
}

/// The backing store and its free-space map.
pub struct Backing {
    places: ztier_swap::Device,
    format: WbFormat,
    /// Slots per unit of `live`: a segment's (packed) or one block's (the kernel's formats).
    unit_slots: u64,
    /// Per unit, by first slot / `unit_slots`: the live bytes of the objects in it, plus one
    /// for each hold (a batch being committed, a read in flight). The unit goes back to the
    /// allocator when it reaches zero.
    live: Box<[AtomicU32]>,
    /// Packed segments recently read whole.
    cache: SegmentCache,
    bytes_written: AtomicU64,
    bytes_stored: AtomicU64,
    failed: AtomicU64,
}

impl Backing {
    /// A store on `dev` (its first 4 KiB hold the allocator's header).
    pub fn new(dev: Arc<dyn BlockDevice>, format: WbFormat) -> Result<Backing> {
        let places = ztier_swap::Device::new(
            dev,
            ztier_swap::Config {
                discard: true,
                ..ztier_swap::Config::default()
            },
        )
        .map_err(ZramError::Backing)?;
        let unit_slots = match format {
            WbFormat::Packed => SEG_SLOTS,
            WbFormat::Page | WbFormat::Compressed => 1,
        };
        let units = places.slots().div_ceil(unit_slots) as usize;
        Ok(Backing {
            live: (0..units).map(|_| AtomicU32::new(0)).collect(),
            cache: SegmentCache::default(),
            places,
            format,
            unit_slots,
            bytes_written: AtomicU64::new(0),
            bytes_stored: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
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

    /// The bytes of the store that tell it from any other: its header, a Linux swap header
    /// with the area's random id. A remote store that does not hold them is not this one
    /// (restarted empty, or another export), so the owner of a remote store pins them as its
    /// identity.
    pub fn identity(&self) -> (u64, usize) {
        (0, SLOT_BYTES as usize)
    }

    /// Pages the store has room for, at most.
    pub fn capacity_pages(&self) -> u64 {
        self.places.usable_slots()
    }

    /// Gives back the `size` bytes of a dead object at `place`.
    fn release(&self, place: Place, size: usize) {
        self.bytes_stored.fetch_sub(size as u64, Relaxed);
        self.release_bytes(place.first, size);
    }

    /// The live count of the unit holding slot `first`.
    fn live_of(&self, first: u64) -> &AtomicU32 {
        &self.live[(first / self.unit_slots) as usize]
    }

    /// Adds a hold (or an object's bytes) to the unit holding slot `first`.
    fn hold_bytes(&self, first: u64, n: usize) {
        self.live_of(first).fetch_add(n as u32, Relaxed);
    }

    /// Drops `n` of the unit's live count; the last one gives the unit back.
    fn release_bytes(&self, first: u64, n: usize) {
        // AcqRel: every read of the unit under a hold happens before its slots are freed.
        if self.live_of(first).fetch_sub(n as u32, AcqRel) == n as u32 {
            let start = first / self.unit_slots * self.unit_slots;
            // Out of the cache before its slots can be handed out again.
            if self.format == WbFormat::Packed {
                self.cache.forget(start);
            }
            let _ = if self.unit_slots == 1 {
                self.places.free(start)
            } else {
                self.places.free_range(start, self.unit_slots)
            };
        }
    }

    /// Keeps the place `handle` names from being freed (and so handed out again) until the
    /// pin goes. Taken under the lock of a slot that names it: that slot's own bytes keep the
    /// unit alive until then.
    fn pin(self: &Arc<Backing>, place: Place) -> Pin {
        self.hold_bytes(place.first, 1);
        Pin {
            store: Arc::clone(self),
            first: place.first,
        }
    }

    fn read(&self, place: Place, out: &mut [u8]) -> std::result::Result<(), SwapError> {
        self.places.read_bytes(place.first, place.at, out)
    }

    /// The packed segment starting at slot `first`, from the cache or read whole from the
    /// store (one request); the caller holds a pin on it. True if the store was read.
    fn segment(&self, first: u64) -> std::result::Result<(Arc<[u8]>, bool), SwapError> {
        if let Some(bytes) = self.cache.get(first) {
            return Ok((bytes, false));
        }
        let mut bytes = vec![0u8; SEG_BYTES];
        self.places.read_bytes(first, 0, &mut bytes)?;
        let bytes: Arc<[u8]> = bytes.into();
        self.cache.add(first, Arc::clone(&bytes));
        Ok((bytes, true))
    }

    pub(crate) fn stat(&self, counters: &Counters) -> BdStat {
        BdStat {
            bd_count: counters.get(Counter::BdCount),
            bd_reads: counters.get(Counter::BdReads),
            bd_writes: counters.get(Counter::BdWrites),
            bytes_written: self.bytes_written.load(Relaxed),
            bytes_stored: self.bytes_stored.load(Relaxed),
            bytes_held: self.places.in_use() * SLOT_BYTES,
            failed_writebacks: self.failed.load(Relaxed),
        }
    }
}

/// A hold on a written-back page's place on the store (see [`Backing::pin`]): while it
/// lives, a slot that names the place is the page that was read from it.
pub(crate) struct Pin {
    store: Arc<Backing>,
    first: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.store.release_bytes(self.first, 1);
    }
}

/// A page copied out for a writeback, not yet committed.
struct Pending {
    index: u64,
    /// The slot as collected: committed only if it still holds the same object.
    entry: Entry,
    size: usize,
    /// Where its bytes start in the batch's buffer.
    at: usize,
}

impl Device {
    /// Sets the backing store (`backing_dev`). Refused while pages are written back to the
    /// current one.
    pub fn set_backing(&self, store: Option<Backing>) -> Result<()> {
        let mut b = self.backing.write();
        if b.is_some() && self.counters().get(Counter::BdCount) > 0 {
            return Err(ZramError::Busy(
                "pages are written back to the current backing store".into(),
            ));
        }
        *b = store.map(Arc::new);
        Ok(())
    }

    /// The backing store, if set.
    pub fn backing(&self) -> Option<Arc<Backing>> {
        self.backing.read().clone()
    }

    /// `writeback_limit_enable` and `writeback_limit` (in 4 KiB blocks): each block written
    /// to the store takes one; at 0, writeback stops.
    pub fn set_writeback_limit(&self, limit: Option<u64>) {
        self.wb_limit.store(limit.unwrap_or(u64::MAX), Relaxed);
    }

    /// Blocks the writeback limit has left (`None`: no limit).
    pub fn writeback_limit(&self) -> Option<u64> {
        let l = self.wb_limit.load(Relaxed);
        (l != u64::MAX).then_some(l)
    }

    /// Takes `blocks` from the limit; false (taking nothing) if it has fewer.
    fn take_limit(&self, blocks: u64) -> bool {
        self.wb_limit
            .fetch_update(Relaxed, Relaxed, |l| {
                if l == u64::MAX {
                    Some(l)
                } else {
                    l.checked_sub(blocks)
                }
            })
            .is_ok()
    }

    /// `bd_stat`, if a backing store is set.
    pub fn bd_stat(&self) -> Option<BdStat> {
        self.backing().map(|b| b.stat(&self.counters()))
    }

    /// `echo MODE > writeback`: writes matching pages of `range` (default all) to the backing
    /// store, at most `max_pages` of them.
    pub fn writeback(
        &self,
        mode: PageSelector,
        range: Option<std::ops::Range<u64>>,
        max_pages: Option<u64>,
    ) -> Result<WbResult> {
        let store = self.backing().ok_or(ZramError::NoBacking)?;
        let range = range.unwrap_or(0..self.pages());
        if range.end > self.pages() {
            return Err(ZramError::BadIndex {
                index: range.end.saturating_sub(1),
                pages: self.pages(),
            });
        }
        let mut done = WbResult::default();
        let mut batch: Vec<Pending> = Vec::new();
        let mut buf = vec![0u8; SEG_BYTES];
        let mut page = vec![0u8; self.page_size];
        let batch_bytes = SEG_BYTES;
        let mut used = 0;
        let mut index = range.start;
        let r = loop {
            let full = index >= range.end
                || max_pages.is_some_and(|m| done.pages + batch.len() as u64 >= m);
            if full {
                break self.write_batch(&store, &mut batch, &buf[..used], &mut done);
            }
            let Some(mut p) = self.collect(index, mode, &store, &mut page)? else {
                index += 1;
                continue;
            };
            let blocks = (used + p.size).div_ceil(SLOT_BYTES as usize) as u64;
            if self.writeback_limit().is_some_and(|left| blocks > left) {
                // The limit has no room for this page: write what fits, then stop.
                self.uncollect(&p);
                break self
                    .write_batch(&store, &mut batch, &buf[..used], &mut done)
                    .and(Err(ZramError::WritebackLimit));
            }
            let room = match store.format {
                WbFormat::Packed => used + p.size <= batch_bytes,
                _ => batch.is_empty(),
            };
            if !room {
                // This one starts the next batch: put it back as it was, write the batch.
                self.uncollect(&p);
                if let Err(e) = self.write_batch(&store, &mut batch, &buf[..used], &mut done) {
                    break Err(e);
                }
                used = 0;
                continue;
            }
            let bytes = match store.format {
                WbFormat::Page => &page[..],
                _ => &page[..p.size],
            };
            buf[used..used + bytes.len()].copy_from_slice(bytes);
            p.at = used;
            p.size = bytes.len();
            used += bytes.len();
            batch.push(p);
            index += 1;
        };
        r.map(|()| done).map_err(|e| match e {
            // The limit's own error is what the kernel gives, whatever went out before it.
            ZramError::WritebackLimit => e,
            e if done.pages > 0 => ZramError::WritebackCut {
                pages: done.pages,
                bytes: done.bytes_written,
                cause: Box::new(e),
            },
            e => e,
        })
    }

    /// Marks slot `index` `UNDER_WB` and copies its bytes into `page` (the object, or the
    /// whole page decompressed for [`WbFormat::Page`]), if writeback of `mode` takes it.
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
        // is not worth locking for them.
        if !takes(&slot.lock().entry) {
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

    /// Writes a batch's bytes to a new place and commits its pages; on failure, every page
    /// of the batch stays in memory and the place is given back.
    fn write_batch(
        &self,
        store: &Backing,
        batch: &mut Vec<Pending>,
        bytes: &[u8],
        done: &mut WbResult,
    ) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let blocks = bytes.len().div_ceil(SLOT_BYTES as usize) as u64;
        let order = if store.format == WbFormat::Packed {
            SEG_ORDER
        } else {
            0
        };
        let placed = if !self.take_limit(blocks) {
            Err(ZramError::WritebackLimit)
        } else {
            store
                .places
                .alloc(order)
                .map_err(ZramError::Backing)
                .and_then(|first| {
                    // Whole blocks go to the store: the tail of the last one is zeros.
                    let len = (blocks * SLOT_BYTES) as usize;
                    let r = if len == bytes.len() {
                        store.places.write_slots(first, bytes)
                    } else {
                        let mut padded = bytes.to_vec();
                        padded.resize(len, 0);
                        store.places.write_slots(first, &padded)
                    };
                    match r {
                        Ok(()) => Ok(first),
                        Err(e) => {
                            let _ = store.places.free_range(first, 1 << order);
                            Err(ZramError::Backing(e))
                        }
                    }
                })
        };
        let first = match placed {
            Ok(first) => first,
            Err(e) => {
                if !matches!(e, ZramError::WritebackLimit) {
                    store.failed.fetch_add(1, Relaxed);
                }
                for p in batch.drain(..) {
                    self.uncollect(&p);
                }
                return Err(e);
            }
        };
        store.bytes_written.fetch_add(blocks * SLOT_BYTES, Relaxed);
        // Held while the commits count the place's live bytes in.
        store.hold_bytes(first, 1);
        let mut shard = self.shard();
        shard.counters.add(Counter::BdWrites, blocks as i64);
        let mut committed = 0;
        for p in batch.drain(..) {
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
                self.page_size
            } else {
                p.size
            };
            self.free_slot(&mut shard.counters, &mut g.entry);
            let mut e = Entry::default();
            e.set_written_back(Place::new(first, p.at), stored);
            e.set(SlotFlag::Huge, stored == self.page_size);
            e.set(SlotFlag::Idle, idle);
            e.set_priority(if stored == self.page_size { 0 } else { prio });
            e.set_ac_time(ac_time);
            g.entry = e;
            shard.counters.add(Counter::PagesStored, 1);
            shard.counters.add(Counter::BdCount, 1);
            store.bytes_stored.fetch_add(stored as u64, Relaxed);
            store.hold_bytes(first, stored);
            committed += 1;
        }
        drop(shard);
        // The commit's hold: with no page committed, the place goes back now.
        store.release_bytes(first, 1);
        done.pages += committed;
        done.bytes_written += blocks * SLOT_BYTES;
        Ok(())
    }

    /// Reads page `index` into `out` if it is written back, holding no lock across the
    /// store's I/O: the slot's entry is taken and its place pinned under the slot's lock,
    /// the store read with nothing held, and the object decompressed on the thread's shard.
    /// `None`: the page is not written back (read it from memory). Otherwise the entry read
    /// and the pin: the caller checks, with [`Entry::same_place`], that the slot still names
    /// that place before it trusts the bytes (the page may have been rewritten or discarded
    /// meanwhile; while the pin lives, its place cannot be handed out again).
    pub(crate) fn read_written_back(
        &self,
        index: u64,
        out: &mut [u8],
    ) -> Result<Option<(Entry, Pin)>> {
        let slot = self.slot(index)?;
        let store = self.backing().ok_or(ZramError::NoBacking)?;
        let (e, place, pin) = {
            let g = slot.lock();
            let Content::WrittenBack(place) = g.entry.content() else {
                return Ok(None);
            };
            (g.entry, place, store.pin(place))
        };
        let size = e.size();
        // The object's bytes: from its segment (packed), or read alone into a buffer of its
        // own (no copy into a shared one).
        let (segment, alone);
        let (object, read_store): (&[u8], bool) = if store.format == WbFormat::Packed {
            let (bytes, read) = store.segment(place.first).map_err(ZramError::Backing)?;
            segment = bytes;
            let object =
                segment
                    .get(place.at..place.at + size)
                    .ok_or_else(|| ZramError::BadPlace {
                        index,
                        place: format!("{place:?}"),
                        size,
                    })?;
            (object, read)
        } else {
            let mut bytes = vec![0u8; size];
            store.read(place, &mut bytes).map_err(ZramError::Backing)?;
            alone = bytes;
            (&alone[..], true)
        };
        let mut shard = self.shard();
        if read_store {
            shard.counters.add(Counter::BdReads, 1);
        }
        if size == self.page_size {
            out.copy_from_slice(object);
        } else {
            let decoded = self
                .stream_for(&mut shard, e.priority())
                .comp
                .decompress_page(object, out);
            drop(shard);
            self.check_decoded(index, decoded)?;
        }
        Ok(Some((e, pin)))
    }

    /// The object of a written-back page as the store holds it (for a saved state); the
    /// caller holds the page's lock, so its place stays.
    pub(crate) fn read_written_back_object(
        &self,
        index: u64,
        e: &Entry,
        out: &mut [u8],
    ) -> Result<()> {
        let store = self.backing().ok_or(ZramError::NoBacking)?;
        let Content::WrittenBack(place) = e.content() else {
            return Err(ZramError::BadState(format!(
                "page {index} is not written back"
            )));
        };
        store.read(place, out).map_err(ZramError::Backing)
    }

    /// Gives back the place of a written-back slot being freed (under its lock).
    pub(crate) fn release_written_back(&self, counters: &mut Counters, place: Place, size: usize) {
        if let Some(store) = self.backing.read().as_ref() {
            store.release(place, size);
        }
        counters.add(Counter::BdCount, -1);
    }
}
