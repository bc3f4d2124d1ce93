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
//! dead from the start. Up to `WB_IN_FLIGHT` batches (segments, or pages in the kernel's
//! formats) are placed and written together, as requests in flight at once
//! ([`BlockDevice::write_many`]: one round trip to a distant store, not one each), then
//! committed in turn. A failed write leaves every slot of every batch in the group in
//! memory as it was, and gives their places back.
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
//! the cache when it is freed, before its slots can be handed out again, and the whole cache
//! goes when the store's epoch moves (its link lost or found again), so a store that is away
//! fails its pages' reads and one that is back is read anew. A miss right after
//! the segment before it (a sequential read) reads ahead: the next live segments, each held
//! while it is read, go out with it as requests in flight together, into the cache. The
//! first segment read ahead is a mark, as the kernel's `PG_readahead` page is: when the
//! reader reaches it, the next window is claimed and read in the background (on a thread
//! that lives while it reads, at most two at a time), so its requests are in flight while
//! the reader decompresses the pages of this one. A reset, and a new store in its place,
//! wait for those threads to end.
//! A segment being read is listed while it is: a reader that misses it waits for that
//! read and takes its bytes, so concurrent misses cost the store one read (a failed read
//! leaves each waiter to read for itself). `bd_reads` counts the segments read from the
//! store.
//!
//! A saved state (`state.rs`) names written-back pages by place: the save stamps the store's
//! header first (`Backing::mark`), and from then on no unit goes back to the allocator
//! until the next change to the store clears the stamp (`Backing::unmark`, the first thing
//! a writeback does); the units kept meanwhile are freed then. A state loads only if the
//! store still has its stamp, so it never names bytes that were overwritten or discarded.
//!
//! Locks: `Backing::gate` first (a writeback holds it shared for its whole length, a save
//! exclusively for its whole length, and so does a change of store while it swaps
//! `Device::backing`, so no writeback in flight commits pages to a store the device no
//! longer has; never taken under any other lock), then a slot's lock
//! (to pin, collect or commit), then `Backing::cache` (its `loading` list, then its cached
//! segments), `Backing::ahead`, `Backing::ahead_threads` and `Backing::mark` (held to look
//! up, add or drop one entry, never across I/O; `loading` takes the cached segments' lock
//! inside it, nothing else nests), then
//! the swap allocator's. `Backing::stamping` is taken under `Backing::gate` and no other
//! lock, by a save and a writeback, across the header write that sets or clears the stamp.
//! `Device::backing` (an `RwLock` of the store) is held only to look the store up or to swap
//! it, taking nothing under it (a swap waits there for the old store's readahead threads,
//! which take none of the device's locks); it may be taken under the gate or a slot's lock.

use std::sync::atomic::{
    AtomicU32, AtomicU64,
    Ordering::{AcqRel, Relaxed},
};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use serde::Serialize;
use ztier_blockdev::BlockDevice;
use ztier_swap::{SwapError, SLOT_BYTES};

use ztier_base::bits::Field;

use crate::slot::{Content, Entry, PageSelector, SlotFlag, SlotOps};
use crate::stats::{Counter, Counters};
use crate::{Device, Result, ZramError};

/// Where a Linux swap header holds its `sws_uuid`, the store's id.
const SWAP_UUID_AT: u64 = 1036;

/// Slots of a packed segment (an order-4 allocation: 64 KiB).
const SEG_ORDER: u32 = 4;
const SEG_SLOTS: u64 = 1 << SEG_ORDER;
const SEG_BYTES: usize = (SEG_SLOTS * SLOT_BYTES) as usize;

/// The first bytes of a packed segment whose objects each carry a checksum: the object,
/// then the CRC-32 (IEEE, as the saved state's) of its bytes, little-endian. A segment
/// written before checksums (objects back to back from byte 0) does not start with it and
/// is read as it was written; one whose first object happened to begin with these bytes
/// would fail its checks (an I/O error), never be read wrong.
const SEGMENT_MAGIC: [u8; 8] = *b"ztierPK1";
/// An object's checksum, after it.
const OBJECT_CRC: usize = 4;
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
    /// The first slot of its block or segment.
    pub(crate) fn first(self) -> u64 {
        self.first
    }
    /// The byte it starts at in its block or segment.
    pub(crate) fn at(self) -> usize {
        self.at
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
/// neighbours, read together again) cost one request to the store, not one each (4 MiB).
const SEGMENT_CACHE: usize = 64;

/// Segments a sequential read fetches at once (the one asked for and those after it), in
/// flight together: 16 kept a Ceph cluster's reads 0.54-0.65x `rados bench -t 16` where 8
/// kept them at 0.31-0.48x (MEASUREMENTS.md). A quarter of the cache: the window being
/// read, the one read ahead and the one the reader is in fit with room to spare, so
/// readahead never pushes out what the reader has yet to read.
const READAHEAD: usize = SEGMENT_CACHE / 4;

/// Units (packed segments, or single blocks) a writeback writes to the store together, in
/// flight at once: enough to keep a replicated store's disks busy while each write waits for
/// every replica (what 8 and 32 gave on Ceph: MEASUREMENTS.md, "Cold pages on a Ceph
/// cluster").
const WB_IN_FLIGHT: usize = 32;

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

/// Recently read packed segments, most recent last. A segment is read whole on a miss, while
/// a pin keeps it allocated, and leaves the cache when its last live byte goes, before its
/// slots can be handed out again; so a cached segment always holds what the store holds.
/// And the cache is emptied when the store's [`epoch`](BlockDevice::epoch) moves (its link
/// lost, or found again): while the store is away its pages fail as the store does, and
/// what it holds once back is read from it anew. Bounded at [`SEGMENT_CACHE`] segments
/// (4 MiB); the lock is held to look up, add or drop one, never across I/O. `loading`'s
/// lock is taken before `cached`'s (a claim looks in the cache), never after.
#[derive(Default)]
struct SegmentCache {
    cached: Mutex<Cached>,
    /// Segments being read from the store now: a reader that misses one waits for that
    /// read instead of sending its own (concurrent misses cost the store one read).
    loading: Mutex<Vec<(u64, Arc<Loading>)>>,
}

/// The cached segments and the store's epoch they were read in.
#[derive(Default)]
struct Cached {
    epoch: u64,
    segments: Vec<(u64, Arc<[u8]>)>,
}

impl Cached {
    /// The segments of the store's `epoch`: emptied first if it moved on from theirs.
    fn at(&mut self, epoch: u64) -> &mut Vec<(u64, Arc<[u8]>)> {
        if self.epoch != epoch {
            self.segments.clear();
            self.epoch = epoch;
        }
        &mut self.segments
    }
}

/// A segment read in flight: its bytes once read (`Some(None)`: the read failed).
#[derive(Default)]
struct Loading {
    done: Mutex<Option<Option<Arc<[u8]>>>>,
    finished: parking_lot::Condvar,
}

impl Loading {
    /// The bytes the read got, once it ends; `None` if it failed.
    fn wait(&self) -> Option<Arc<[u8]>> {
        let mut done = self.done.lock();
        while done.is_none() {
            self.finished.wait(&mut done);
        }
        done.clone().flatten()
    }
}

/// The right to read a segment for everyone who misses it meanwhile; its readers are told
/// the outcome when it is finished, or, if it is dropped unfinished, that it failed.
struct Claim {
    cache: Arc<SegmentCache>,
    first: u64,
    loading: Arc<Loading>,
}

impl Claim {
    fn finish(self, bytes: Option<Arc<[u8]>>) {
        *self.loading.done.lock() = Some(bytes);
        // Dropped now: the entry goes and the waiters wake.
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut done = self.loading.done.lock();
        if done.is_none() {
            *done = Some(None);
        }
        drop(done);
        self.loading.finished.notify_all();
        self.cache
            .loading
            .lock()
            .retain(|(f, l)| !(*f == self.first && Arc::ptr_eq(l, &self.loading)));
    }
}

/// What a reader about to read a segment finds: the right to read it, a read of it in
/// flight, or the segment cached already.
enum Taken {
    Claim(Claim),
    Loading(Arc<Loading>),
    Cached,
}

impl SegmentCache {
    /// The claim to read segment `first`, unless it is being read or cached (in the store's
    /// `epoch`). A read adds its segment to the cache before it leaves `loading`, and the
    /// cache is looked at under `loading`'s lock, so a segment is never claimed again just
    /// as its read ends.
    fn claim(self: &Arc<Self>, first: u64, epoch: u64) -> Taken {
        let mut loading = self.loading.lock();
        if let Some((_, l)) = loading.iter().find(|(f, _)| *f == first) {
            return Taken::Loading(Arc::clone(l));
        }
        if self.contains(first, epoch) {
            return Taken::Cached;
        }
        let l = Arc::new(Loading::default());
        loading.push((first, Arc::clone(&l)));
        Taken::Claim(Claim {
            cache: Arc::clone(self),
            first,
            loading: l,
        })
    }

    fn get(&self, first: u64, epoch: u64) -> Option<Arc<[u8]>> {
        let mut cached = self.cached.lock();
        let segs = cached.at(epoch);
        let i = segs.iter().position(|(f, _)| *f == first)?;
        let hit = segs.remove(i);
        let bytes = Arc::clone(&hit.1);
        segs.push(hit);
        Some(bytes)
    }

    /// Adds a segment read in the store's `epoch` (as it was before the read began), unless
    /// the cache has seen a later one since.
    fn add(&self, first: u64, bytes: Arc<[u8]>, epoch: u64) {
        let mut cached = self.cached.lock();
        if epoch < cached.epoch {
            return;
        }
        let segs = cached.at(epoch);
        segs.retain(|(f, _)| *f != first);
        if segs.len() == SEGMENT_CACHE {
            segs.remove(0);
        }
        segs.push((first, bytes));
    }

    fn contains(&self, first: u64, epoch: u64) -> bool {
        self.cached
            .lock()
            .at(epoch)
            .iter()
            .any(|(f, _)| *f == first)
    }

    fn forget(&self, first: u64) {
        self.cached.lock().segments.retain(|(f, _)| *f != first);
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
    /// Pages writebacks could not write (the store refused or vanished); they stayed in
    /// memory.
    pub failed_writebacks: u64,
    /// Reads of written-back pages whose copy failed its checksum (each an I/O error).
    pub checksum_failures: u64,
}

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

/// A sequential reader's readahead (the kernel's asynchronous readahead, with its
/// `PG_readahead` mark): the segment whose read starts the next window in the background,
/// and where that window starts, so the next window's requests are in flight while the
/// reader decompresses this one's pages.
#[derive(Default)]
struct Ahead {
    /// The segment whose read starts the next window (the first of the window before it).
    mark: Option<u64>,
    /// The last segment of the newest window: the next starts after it.
    last: u64,
}

/// Background readahead windows being read at once, at most: a thread each.
const AHEAD_THREADS: usize = 2;

/// Segments claimed to be read together, each held so none is freed meanwhile: a
/// segment's hold goes once its bytes are in the cache (before its waiters wake), the rest
/// when the window is dropped (a failed read, a segment someone else was reading).
struct Window {
    store: Arc<Backing>,
    claims: Vec<Claim>,
    held: Vec<u64>,
}

impl Drop for Window {
    fn drop(&mut self) {
        // The claims first (their waiters read for themselves), then the holds.
        self.claims.clear();
        for f in self.held.drain(..) {
            self.store.release_bytes(f, 1);
        }
    }
}

/// The background readahead threads of a store: how many run now, and a signal when one
/// ends (a reset or a new store waits for them: [`Backing::quiesce`]).
#[derive(Default)]
struct AheadThreads {
    running: Mutex<usize>,
    ended: parking_lot::Condvar,
}

/// A running readahead thread's place in [`AheadThreads`], given back when it ends however
/// it ends.
struct AheadTicket(Arc<Backing>);

impl Drop for AheadTicket {
    fn drop(&mut self) {
        let threads = &self.0.ahead_threads;
        *threads.running.lock() -= 1;
        threads.ended.notify_all();
    }
}

/// The backing store and its free-space map.
pub struct Backing {
    /// The device the places are on (for its epoch: the segment cache's lifetime).
    store: Arc<dyn BlockDevice>,
    places: ztier_swap::Device,
    format: WbFormat,
    /// Slots per unit of `live`: a segment's (packed) or one block's (the kernel's formats).
    unit_slots: u64,
    /// Per unit, by first slot / `unit_slots`: the live bytes of the objects in it, plus one
    /// for each hold (a batch being committed, a read in flight). The unit goes back to the
    /// allocator when it reaches zero.
    live: Box<[AtomicU32]>,
    /// Packed segments recently read whole (shared with the reads in flight that fill it).
    cache: Arc<SegmentCache>,
    /// A sequential reader's readahead in the background.
    ahead: Mutex<Ahead>,
    /// Packed segments read from the store (`bd_reads`), counted once read, before a reader
    /// waiting for one wakes.
    segment_reads: AtomicU64,
    /// Background readahead threads running now (at most [`AHEAD_THREADS`]).
    ahead_threads: AheadThreads,
    /// Whether the store is as a saved state left it (see [`Backing::mark`]).
    mark: Mutex<Mark>,
    /// Held by whoever writes the store's stamp, so a mark and an unmark land in order.
    stamping: Mutex<()>,
    /// Writebacks hold it shared for their whole length, a save exclusively for its whole
    /// length (so no writeback changes the store under a state being saved); true once
    /// writeback is closed for good ([`Device::close_writeback`]).
    gate: RwLock<bool>,
    bytes_written: AtomicU64,
    bytes_stored: AtomicU64,
    /// Pages a writeback could not write (the store refused or vanished).
    failed: AtomicU64,
    /// Reads whose copy failed its checksum.
    corrupt: AtomicU64,
}

/// A saved state's hold on the store: while `marked`, the store's header carries the stamp
/// of the last state saved, and nothing the state names has changed since: units whose last
/// live byte goes wait in `deferred` (not freed, so neither discarded nor handed out again)
/// until the next change to the store clears the stamp ([`Backing::unmark`]).
#[derive(Default)]
struct Mark {
    marked: bool,
    deferred: Vec<u64>,
}

/// The allocator's settings for a store: freed clusters are discarded.
fn places_config() -> ztier_swap::Config {
    ztier_swap::Config {
        discard: true,
        ..ztier_swap::Config::default()
    }
}

/// A store's live counts, one for each unit of `format` in `store_bytes` (in the page and
/// compressed formats a unit is one 4 KiB slot: 4 bytes of counts a slot). Refused, with
/// the reason, where they and the store's slot map together would not fit the machine's
/// memory, or they cannot be allocated: a store that says it is huge (a sparse file, a
/// remote export) must not abort the process.
fn live_counts(store_bytes: u64, format: WbFormat) -> Result<Box<[AtomicU32]>> {
    live_counts_within(store_bytes, format, ztier_pool::physical_memory_bytes())
}

/// [`live_counts`] on a machine of `memory_bytes`.
fn live_counts_within(
    store_bytes: u64,
    format: WbFormat,
    memory_bytes: u64,
) -> Result<Box<[AtomicU32]>> {
    // A store the allocator cannot take (too small, or more slots than it addresses) is
    // refused before anything is allocated for it.
    let slots = ztier_swap::Device::slots_for(store_bytes).map_err(ZramError::Backing)?;
    let units = slots.div_ceil(unit_slots_of(format));
    let bytes = units.saturating_mul(std::mem::size_of::<AtomicU32>() as u64);
    // The allocator's map is made whole beside them when the store is attached: each alone
    // may fit where the two do not.
    let map_bytes = ztier_swap::Device::slot_map_bytes(store_bytes);
    let too_large = |why: String| {
        ZramError::Backing(SwapError::Invalid(format!(
            "a store of {store_bytes} bytes needs {bytes} bytes of live counts ({format:?} \
             format) and {map_bytes} bytes of slot map: {why}"
        )))
    };
    if bytes.saturating_add(map_bytes) > memory_bytes {
        return Err(too_large(format!(
            "the machine has {memory_bytes} bytes of memory"
        )));
    }
    let mut live = Vec::new();
    let n = usize::try_from(units)
        .ok()
        .filter(|&n| live.try_reserve_exact(n).is_ok())
        .ok_or_else(|| too_large("the live counts could not be allocated".into()))?;
    live.resize_with(n, || AtomicU32::new(0));
    Ok(live.into_boxed_slice())
}

/// The slots of a unit of `format`: a packed segment's, or one block.
fn unit_slots_of(format: WbFormat) -> u64 {
    match format {
        WbFormat::Packed => SEG_SLOTS,
        WbFormat::Page | WbFormat::Compressed => 1,
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
        units: &[(u64, u32)],
    ) -> Result<Backing> {
        let order = if format == WbFormat::Packed {
            SEG_ORDER
        } else {
            0
        };
        let runs: Vec<(u64, u32)> = units.iter().map(|&(first, _)| (first, order)).collect();
        // Weighed before the allocator's map is made, as for a new store.
        let live = live_counts(dev.size(), format)?;
        let places =
            ztier_swap::Device::reopen(Arc::clone(&dev), places_config(), &runs).map_err(|e| {
                match e {
                    SwapError::NotTheArea(why) => ZramError::BadState(format!(
                        "the backing store is not the one its pages were written back to: {why}"
                    )),
                    e => ZramError::BadState(format!("the backing store: {e}")),
                }
            })?;
        let store = Backing::over(dev, places, format, live, true);
        for &(first, live) in units {
            store.live_of(first).store(live, Relaxed);
        }
        Ok(store)
    }

    fn over(
        store: Arc<dyn BlockDevice>,
        places: ztier_swap::Device,
        format: WbFormat,
        live: Box<[AtomicU32]>,
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
    fn unmark(&self) -> Result<()> {
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

    /// Drops `n` of the unit's live count; the last one gives the unit back (or, while a
    /// saved state names the store, keeps it until the stamp is cleared).
    fn release_bytes(&self, first: u64, n: usize) {
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

    fn free_unit(&self, start: u64) {
        let _ = if self.unit_slots == 1 {
            self.places.free(start)
        } else {
            self.places.free_range(start, self.unit_slots)
        };
    }

    /// A hold on the unit at slot `first` if it is live (allocated and holding objects):
    /// readahead's, which must not revive a unit on its way back to the allocator.
    fn try_hold(&self, first: u64) -> bool {
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
    /// store; the caller holds a pin on it. A miss right after the segment before it on the
    /// store (a sequential read) also reads the next live segments, up to [`READAHEAD`] in
    /// all, in one batch of requests in flight together, into the cache; each is held while
    /// it is read, so none is freed meanwhile.
    fn segment(self: &Arc<Self>, first: u64) -> std::result::Result<Arc<[u8]>, SwapError> {
        let epoch = self.store.epoch();
        let own = loop {
            if let Some(bytes) = self.cache.get(first, epoch) {
                self.on_read(first);
                return Ok(bytes);
            }
            match self.cache.claim(first, epoch) {
                Taken::Claim(claim) => break claim,
                // Another reader (or the readahead) is reading it: its bytes are this one's
                // too. If its read failed, this one tries for itself.
                Taken::Loading(loading) => {
                    if let Some(bytes) = loading.wait() {
                        self.on_read(first);
                        return Ok(bytes);
                    }
                }
                // Read in since the look: the next look finds it.
                Taken::Cached => {}
            }
        };
        let sequential = first >= SEG_SLOTS && self.cache.contains(first - SEG_SLOTS, epoch);
        // The segments after it go with it; the first of them is the mark.
        let ahead = sequential
            .then(|| self.claim_window(first + SEG_SLOTS, READAHEAD - 1, epoch))
            .flatten();
        match ahead {
            Some(mut w) => {
                let mut claims = vec![own];
                claims.append(&mut w.claims);
                self.fetch(claims, epoch, &mut w.held)
            }
            None => self.fetch(vec![own], epoch, &mut Vec::new()),
        }
    }

    /// Claims up to `n` live segments from slot `start` on that are neither cached nor being
    /// read (looking no further than twice [`READAHEAD`], past freed ones), each held, and
    /// makes the first the mark for the window after; `None` if there are none.
    fn claim_window(self: &Arc<Self>, start: u64, n: usize, epoch: u64) -> Option<Window> {
        let mut w = Window {
            store: Arc::clone(self),
            claims: Vec::new(),
            held: Vec::new(),
        };
        for next in (0..2 * READAHEAD as u64).map(|i| start + i * SEG_SLOTS) {
            if w.claims.len() == n || next + SEG_SLOTS > self.places.slots() {
                break;
            }
            if self.cache.contains(next, epoch) || !self.try_hold(next) {
                continue;
            }
            w.held.push(next);
            if let Taken::Claim(claim) = self.cache.claim(next, epoch) {
                w.claims.push(claim);
            }
        }
        let (first, last) = (w.claims.first()?.first, w.claims.last()?.first);
        *self.ahead.lock() = Ahead {
            mark: Some(first),
            last,
        };
        Some(w)
    }

    /// After segment `first` was read (from the cache or a read it waited for): if it is the
    /// readahead's mark, the next window is claimed now and read in the background, unless
    /// [`AHEAD_THREADS`] are reading already (the reader's misses then read for themselves).
    fn on_read(self: &Arc<Self>, first: u64) {
        let start = {
            let mut a = self.ahead.lock();
            if a.mark != Some(first) {
                return;
            }
            a.mark = None;
            a.last + SEG_SLOTS
        };
        {
            let mut running = self.ahead_threads.running.lock();
            if *running == AHEAD_THREADS {
                return;
            }
            *running += 1;
        }
        let ticket = AheadTicket(Arc::clone(self));
        let epoch = self.store.epoch();
        // Claimed before the thread starts: a reader that gets there first waits for these
        // reads rather than sending its own. If no thread can be started, the window and
        // the ticket are dropped here: the claims go unfinished (their readers read for
        // themselves) and the holds go.
        let Some(mut window) = self.claim_window(start, READAHEAD, epoch) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("zram-readahead".into())
            .spawn(move || {
                let claims = std::mem::take(&mut window.claims);
                // A failure is left to the reads of those pages to meet and report.
                let _ = window.store.fetch(claims, epoch, &mut window.held);
                // The holds go before the ticket, so a store that waits for its readahead
                // to end finds every unit as its pages left it.
                drop(window);
                drop(ticket);
            });
    }

    /// Waits until no readahead thread is reading this store: before a reset frees its
    /// pages' places, and before another store (maybe over the same device) replaces it.
    pub(crate) fn quiesce(&self) {
        let mut running = self.ahead_threads.running.lock();
        while *running > 0 {
            self.ahead_threads.ended.wait(&mut running);
        }
    }

    /// Zeroes the count of segments read (a reset's, with the device's other counters).
    pub(crate) fn reset_reads(&self) {
        self.segment_reads.store(0, Relaxed);
    }

    /// Reads the packed segments claimed as requests in flight together, adds them to the
    /// cache (read in the store's `epoch`, as it was before the read), lets go of each one's
    /// hold in `held` once it is cached, tells whoever waits for them, and returns the first.
    /// Each is held by the caller (a pin, or a hold in `held`).
    fn fetch(
        &self,
        claims: Vec<Claim>,
        epoch: u64,
        held: &mut Vec<u64>,
    ) -> std::result::Result<Arc<[u8]>, SwapError> {
        let mut bufs: Vec<Vec<u8>> = claims.iter().map(|_| vec![0u8; SEG_BYTES]).collect();
        let mut reads: Vec<(u64, usize, &mut [u8])> = claims
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| (c.first, 0, &mut b[..]))
            .collect();
        // On an error the claims go unfinished: their waiters read for themselves.
        self.places.read_runs(&mut reads)?;
        // Counted before anyone waiting for them wakes.
        self.segment_reads.fetch_add(claims.len() as u64, Relaxed);
        let mut own = None;
        for (claim, bytes) in claims.into_iter().zip(bufs) {
            let bytes: Arc<[u8]> = bytes.into();
            own.get_or_insert_with(|| Arc::clone(&bytes));
            self.cache.add(claim.first, Arc::clone(&bytes), epoch);
            // Cached, so a hold is no longer needed to keep it from going stale: freed
            // from now on, it leaves the cache first. Every waiter holds a pin of its own.
            if let Some(i) = held.iter().position(|&f| f == claim.first) {
                held.swap_remove(i);
                self.release_bytes(claim.first, 1);
            }
            claim.finish(Some(bytes));
        }
        own.ok_or_else(|| SwapError::Invalid("no segment to read".into()))
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
    store: Arc<Backing>,
    first: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.store.release_bytes(self.first, 1);
    }
}

/// Pages collected for one unit on the store (a packed segment, or one page), with their
/// bytes back to back.
struct Batch {
    pages: Vec<Pending>,
    buf: Vec<u8>,
    used: usize,
}

impl Batch {
    /// An empty batch for a unit of `format`: a packed segment starts with its magic.
    fn new(format: WbFormat, page_size: usize) -> Batch {
        let bytes = match format {
            WbFormat::Packed => SEG_BYTES,
            _ => page_size,
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

    /// The store's blocks its bytes take.
    fn blocks(&self) -> u64 {
        self.used.div_ceil(SLOT_BYTES as usize) as u64
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
        // The current store's gate first (before `backing`, as a writeback takes it): a
        // writeback on it in flight has pages it has not yet counted in `bd_count`, and
        // would commit them to a store the device no longer has; one that starts after
        // this finds it is not the device's store any more (`writeback`).
        let current = self.backing();
        let quiet = current.as_ref().map(|old| old.gate.write());
        if quiet.as_ref().is_some_and(|closed| **closed) {
            return Err(ZramError::Busy(
                "writeback is closed: the device is stopping".into(),
            ));
        }
        let mut b = self.backing.write();
        if !same_store(b.as_ref(), current.as_ref()) {
            return Err(ZramError::Busy(
                "the backing store was changed meanwhile".into(),
            ));
        }
        if b.is_some() && self.counters().get(Counter::BdCount) > 0 {
            return Err(ZramError::Busy(
                "pages are written back to the current backing store".into(),
            ));
        }
        // The old store's readahead ends first: its late frees must not land on a new
        // store over the same device.
        if let Some(old) = b.as_ref() {
            old.quiesce();
        }
        *b = store.map(Arc::new);
        Ok(())
    }

    /// The backing store, if set.
    pub fn backing(&self) -> Option<Arc<Backing>> {
        self.backing.read().clone()
    }

    /// Closes writeback for good: waits for any writeback in progress (the policy's, or one
    /// a control request started) to end, and refuses every one after it. For a server that
    /// stops: its final save then describes the store as it stays.
    pub fn close_writeback(&self) {
        // The store the device has once its gate is held: a store set meanwhile in place of
        // the one looked up first is closed instead (`set_backing` swaps under the old
        // store's gate, and refuses once it is closed).
        while let Some(b) = self.backing() {
            let mut closed = b.gate.write();
            if same_store(self.backing().as_ref(), Some(&b)) {
                *closed = true;
                return;
            }
        }
    }

    /// `writeback_limit_enable` and `writeback_limit` (in 4 KiB blocks): each block written
    /// to the store takes one; at 0, writeback stops. `u64::MAX` is how "no limit" is kept,
    /// so a limit of `u64::MAX` blocks is kept as one block fewer (more than any store
    /// holds either way): it stays a limit, reads back as on, and is not lost to 0 when
    /// `writeback_limit_enable` is written again.
    pub fn set_writeback_limit(&self, limit: Option<u64>) {
        let kept = match limit {
            Some(blocks) => blocks.min(u64::MAX - 1),
            None => u64::MAX,
        };
        self.wb_limit.store(kept, Relaxed);
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
        // Held to the end: a save waits for this writeback, and it for a save; so does a
        // change of store (`set_backing`).
        let closed = store.gate.read();
        if *closed {
            return Err(ZramError::Busy(
                "writeback is closed: the device is stopping".into(),
            ));
        }
        if !same_store(self.backing().as_ref(), Some(&store)) {
            // Replaced (or taken away) between the look and the gate.
            return Err(ZramError::Busy(
                "the backing store was changed meanwhile".into(),
            ));
        }
        let range = range.unwrap_or(0..self.pages());
        if range.end > self.pages() {
            return Err(ZramError::BadIndex {
                index: range.end.saturating_sub(1),
                pages: self.pages(),
            });
        }
        let mut done = WbResult::default();
        // Full batches waiting to go out together, and the one being filled.
        let mut group: Vec<Batch> = Vec::new();
        let new_batch = || Batch::new(store.format, self.page_size);
        let mut batch = new_batch();
        let mut page = vec![0u8; self.page_size];
        let mut index = range.start;
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
            let queued = group.iter().map(|b| b.pages.len() as u64).sum::<u64>();
            let taken = done.pages + done.failed_pages + queued + batch.pages.len() as u64;
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
            let adds = Batch::room_for(store.format, p.size);
            let blocks = queued_blocks + (batch.used + adds).div_ceil(SLOT_BYTES as usize) as u64;
            if self.writeback_limit().is_some_and(|left| blocks > left) {
                // The limit has no room for this page: write what fits, then stop.
                self.uncollect(&p);
                group.push(std::mem::replace(&mut batch, new_batch()));
                break send(&mut group, &mut done).and(Err(ZramError::WritebackLimit));
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
                if group.len() == WB_IN_FLIGHT {
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
        let order = if store.format == WbFormat::Packed {
            SEG_ORDER
        } else {
            0
        };
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
                store.failed.fetch_add(b.pages.len() as u64, Relaxed);
                done.failed_pages += b.pages.len() as u64;
            }
            for p in b.pages.drain(..) {
                self.uncollect(&p);
            }
        }
        let writes: Vec<(u64, &[u8])> = placed.iter().map(|(f, b)| (*f, &b.buf[..])).collect();
        if let Err(e) = store.places.write_runs(&writes) {
            let pages: u64 = placed.iter().map(|(_, b)| b.pages.len() as u64).sum();
            store.failed.fetch_add(pages, Relaxed);
            done.failed_pages += pages;
            for (first, b) in placed {
                let _ = store.places.free_range(first, 1 << order);
                for p in &b.pages {
                    self.uncollect(p);
                }
            }
            // The batches refused before the write are not failed writes: they wait for
            // the next writeback.
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
        // Packed segments count their own reads (`Backing::segment_reads`).
        let (object, store_reads): (&[u8], u64) = if store.format == WbFormat::Packed {
            segment = store.segment(place.first).map_err(ZramError::Backing)?;
            let object =
                segment
                    .get(place.at..place.at + size)
                    .ok_or_else(|| ZramError::BadPlace {
                        index,
                        place: format!("{place:?}"),
                        size,
                    })?;
            if segment.starts_with(&SEGMENT_MAGIC) {
                let stored = segment.get(place.at + size..place.at + size + OBJECT_CRC);
                if stored != Some(&crc32fast::hash(object).to_le_bytes()[..]) {
                    store.corrupt.fetch_add(1, Relaxed);
                    let e = ZramError::Corrupt {
                        index,
                        place: format!(
                            "segment at slot {}, byte {}, {size} bytes",
                            place.first, place.at
                        ),
                    };
                    self.log(&format!("{e}; the read fails with EIO"));
                    return Err(e);
                }
            }
            (object, 0)
        } else {
            let mut bytes = vec![0u8; size];
            store.read(place, &mut bytes).map_err(ZramError::Backing)?;
            alone = bytes;
            (&alone[..], 1)
        };
        let mut shard = self.shard();
        shard.counters.add(Counter::BdReads, store_reads as i64);
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

    /// Before a read of the pages `range`: the packed segments its written-back pages are
    /// in, those not cached, read together (requests in flight at once, up to [`READAHEAD`]
    /// of them) into the cache, each pinned while it is read; the pages' own reads then find
    /// them there. A failure is left to those reads to meet and report.
    pub(crate) fn prefetch_segments(&self, range: std::ops::Range<u64>) {
        let Some(store) = self.backing() else { return };
        if store.format != WbFormat::Packed || range.end.saturating_sub(range.start) < 2 {
            return;
        }
        let (mut firsts, mut pins) = (Vec::new(), Vec::new());
        let epoch = store.store.epoch();
        for index in range {
            let Ok(slot) = self.slot(index) else { break };
            let g = slot.lock();
            if let Content::WrittenBack(place) = g.entry.content() {
                if !firsts.contains(&place.first) && !store.cache.contains(place.first, epoch) {
                    firsts.push(place.first);
                    pins.push(store.pin(place));
                    if firsts.len() == READAHEAD {
                        break;
                    }
                }
            }
        }
        // One segment: the page's own read fetches it as cheaply. Those another reader is
        // reading already are left to it.
        if firsts.len() >= 2 {
            let claims: Vec<Claim> = firsts
                .iter()
                .filter_map(|&f| match store.cache.claim(f, epoch) {
                    Taken::Claim(claim) => Some(claim),
                    Taken::Loading(_) | Taken::Cached => None,
                })
                .collect();
            if !claims.is_empty() {
                let _ = store.fetch(claims, epoch, &mut Vec::new());
            }
        }
        drop(pins);
    }

    /// Gives back the place of a written-back slot being freed (under its lock).
    pub(crate) fn release_written_back(&self, counters: &mut Counters, place: Place, size: usize) {
        if let Some(store) = self.backing.read().as_ref() {
            store.release(place, size);
        }
        counters.add(Counter::BdCount, -1);
    }
}

/// Whether two looks at a device's store saw the same one (or both none): a store is
/// told apart by its identity, not its contents.
pub(crate) fn same_store(a: Option<&Arc<Backing>>, b: Option<&Arc<Backing>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
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
        let err = live_counts_within(store, WbFormat::Page, counts + map - 1)
            .unwrap_err()
            .to_string();
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
