//! zram in userspace: a compressed RAM disk (`drivers/block/zram/zram_drv.c`).
//!
//! A [`Device`] is a disk of `disksize` bytes cut into pages. Writing a page:
//! a page whose machine words are all equal is kept as that word, with no allocation
//! (`same_pages`); otherwise it is compressed on a stream of the device's algorithm, and a
//! compressed length at or above the pool's `huge_class_size` is stored raw instead
//! (`huge_pages`). The object is allocated and written before the slot is locked, and the
//! memory limit is checked after the allocation as the kernel does, so a refused write leaves
//! the slot's previous content as it was. Reads decompress the object where it lies (copied
//! out first only if it straddles two pool pages) under the slot lock, as the kernel's
//! `zram_read_from_zspool()` does.
//!
//! The device is a [`ztier_blockdev::BlockDevice`] (see `blockdev.rs`), which is how front ends
//! such as the NBD server use it without knowing it is zram.
//!
//! # Compression units
//! A slot holds one compression unit: a page (the default, the kernel's zram, where every
//! figure is the kernel's), or 16 or 64 KiB ([`Device::with_unit_size`], on a pool whose
//! largest object is the unit: zsmalloc's multi-page classes). A unit is stored as one
//! object; same-filled and incompressible (stored raw) are decided per unit, and the
//! counters count the unit's pages (`orig_data_size`, `same_pages` and `huge_pages` stay in
//! pages). A write or discard of part of a unit is a read-modify-write of the unit under
//! its lock; reading a page decompresses its unit into the shard's small cache of
//! decompressed units (`unit_cache.rs`: bounded, validated by the unit's change count under
//! its slot lock, given back on `compact`, `mark_idle` and `reset`) and copies the page out,
//! so the neighbours that follow it copy instead of decompressing again; a whole unit read
//! is decompressed straight into the destination. Writeback moves whole units (a unit's
//! object, or in the page format all of it, to an aligned run of `unit / 4 KiB` blocks;
//! a written-back unit read in part is read back whole and cached as one from memory),
//! recompression recompresses whole units, and a saved state names its unit size
//! (`state/`); `bd_stat` and every result count 4 KiB pages, as the kernel's.
//!
//! Beyond the kernel's defaults, as its config options add them: idle tracking by access
//! time (`mark_idle`), writeback to a backing store of any block device ([`writeback`]'s
//! `Backing`, places from the swap-slot allocator, ztier's packed format beside the
//! kernel's two), recompression with up to three secondary algorithms (`recompress.rs`), a
//! policy that runs them by itself ([`policy`]), and the sysfs attributes by name
//! (`sysfs.rs`). Here: the device, its page and unit reads and writes, `reset` and the
//! statistics; discards in `discard.rs`, reads and writes at any byte in `partial_io.rs`.
//!
//! Each thread works in a shard of per-thread state, zram's per-CPU state in userspace: a
//! compression stream and a shard of the counters. An operation holds its shard for its
//! whole length, as the kernel holds its CPU, so the stream and the counters need no atomic
//! operation of their own. Every lock costs a locked instruction, and on the store path these
//! are a measurable part of the time a page takes.
//!
//! Every operation that changes a page (a whole-page write, a sub-page read-modify-write, a
//! discard) holds that page's stripe of the page locks while it changes it, so a
//! read-modify-write cannot lose a concurrent change to the same page. (With larger units,
//! "page" here is the slot's unit: the stripe is the unit's.) No lock is held
//! across a backing store's I/O: a written-back page is read with its place pinned and
//! nothing locked, and a read-modify-write of one reads it first, then patches it under the
//! stripe only if the slot still names the place it read. [`Device::reset`] takes every
//! shard, which shuts out all I/O while it runs.
//!
//! # Lock ordering
//! `Device::page_locks[stripe]` (one at a time) → `Device::shards[i]` (the calling thread's;
//! `reset` and `set_recomp_algorithms` take all of them, in index order; its cache of
//! decompressed units is part of it, emptied by `compact` and `mark_idle` one shard at a
//! time, holding nothing else) → `Slot` lock (the unit generation counters are atomics,
//! bumped and compared under it) →
//! `Device::recomp` (read, to make a secondary stream; written only with every shard held)
//! and `Device::backing` (read, to give back a written-back page's place) → the swap-slot
//! allocator's locks on the backing store, and the pool's own locks (`SizeClass::state` →
//! `Arena::state`). No operation holds two stripes or two slot locks,
//! and only `reset` holds two shards; a reading of the counters takes the shards one at a
//! time, holding nothing else.
#![forbid(unsafe_code)]

pub mod access_ages;
mod blockdev;
mod discard;
mod error;
mod group;
mod partial_io;
pub mod policy;
pub mod promotion;
mod recompress;
mod slot;
mod state;
mod stats;
mod sysfs;
mod unit_cache;
pub mod writeback;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{MutexGuard, RwLock};
use ztier_compress::{fill_page, same_filled, Algorithm, CompressError, Stream};
use ztier_pool::{PoolStats, ZPool};

pub use error::{Busy, Result, ZramError};
pub use group::MemoryGroup;
pub use policy::{BadPolicyConfig, Policy, PolicyConfig, PolicyRunner, PolicyStats};
pub use promotion::{BadPromotionTarget, PromotionStats, PromotionTarget};
pub use recompress::{RecompResult, MAX_SECONDARY};
pub use slot::{BadSelector, Entry, PageSelector, SlotFlag};
pub use state::{StateError, StateFile, StateSummary};
pub use stats::{Counter, DebugStat, IoStat, MmStat};
pub use writeback::{Backing, BadWbFormat, BdStat, WbFormat, WbResult};

use slot::{Content, Slot, SlotOps};
use stats::Counters;
use unit_cache::{Generations, UnitCache};
use ztier_base::shard::{Shards, Stripes};

/// One shard of per-thread state (the kernel's per-CPU `zcomp_strm` and stats).
#[derive(Default)]
struct ShardState {
    /// Made on the shard's first compression or decompression.
    stream: Option<Stream>,
    /// Streams of the secondary (recompression) algorithms, by priority - 1.
    recomp: [Option<Stream>; MAX_SECONDARY],
    counters: Counters,
    /// Units decompressed for reads of part of them (empty while units are pages).
    unit_cache: UnitCache,
    /// A unit decompressed for a read of part of it when the cache's memory cannot be had.
    unit_buf: Vec<u8>,
    /// Reads by the age of the page read (`access_ages.rs`).
    read_ages: access_ages::ReadAges,
}

/// Stripes of the locks serializing the changes to each page (a page's stripe is
/// `index % PAGE_LOCK_STRIPES`).
const PAGE_LOCK_STRIPES: usize = 256;

/// [`Device::pin_clock`]'s "not held": the clock runs.
const CLOCK_RUNS: u64 = u64::MAX;

/// The largest compression unit a device stores.
pub const MAX_UNIT_SIZE: usize = 64 << 10;

/// Bytes of slot table per disk page (`struct zram_table_entry`).
const SLOT_BYTES: u64 = std::mem::size_of::<Slot>() as u64;

/// A zram device.
///
/// The allocator under it is its own: callers get its statistics
/// ([`allocator_stats`](Device::allocator_stats)), never the pool, so no caller can free an
/// object a slot still names (which made the next write and the drop panic):
///
/// ```compile_fail
/// fn free_behind_the_devices_back(dev: &ztier_zram::Device) {
///     let _ = dev.pool();
/// }
/// ```
pub struct Device {
    page_size: usize,
    /// Bytes of disk one slot holds: the page size, or a larger compression unit.
    unit_size: usize,
    algorithm: Algorithm,
    pool: Box<dyn ZPool>,
    slots: ztier_base::zeroed::Table<Slot>,
    /// Per-thread state by shard; an operation holds its thread's shard throughout.
    shards: Shards<ShardState>,
    /// Held by every change to a page, for its whole length.
    page_locks: Stripes,
    /// Changes of each unit, striped, bumped under its slot lock: what validates the
    /// shards' decompressed units (`unit_cache.rs`); empty while units are pages.
    generations: Generations,
    /// Pool pages allowed, 0 = unlimited (`limit_pages`).
    limit_pages: AtomicU64,
    /// Highest pool pages seen after a write (`max_used_pages`).
    max_used_pages: AtomicU64,
    /// When the device was made, in seconds of the coarse monotonic clock
    /// (`ztier_base::os::coarse_monotonic_secs`): slots' `ac_time` counts seconds from it.
    created_secs: u64,
    /// Seconds the device is older than `created_secs` says: a loaded state's oldest page's
    /// age.
    age_shift: std::sync::atomic::AtomicU32,
    /// The clock held still at this many seconds by a replay ([`Device::pin_clock`]), or
    /// [`CLOCK_RUNS`]: running.
    pinned_secs: AtomicU64,
    /// The backing store (`backing_dev`).
    backing: RwLock<Option<Arc<Backing>>>,
    /// 4 KiB blocks writeback may still write (`u64::MAX`: no limit).
    wb_limit: AtomicU64,
    /// The secondary algorithms (`recomp_algorithm`), by priority - 1.
    recomp: RwLock<Vec<Algorithm>>,
    /// Where the device reports what a caller's error alone would not show an operator (a
    /// written-back copy that fails its checksum); none by default. A leaf.
    log: parking_lot::Mutex<Option<LogFn>>,
    /// The memory group the pool counts toward, if any ([`MemoryGroup`]), and what this
    /// device last told it.
    group: std::sync::OnceLock<Arc<MemoryGroup>>,
    group_reported: AtomicU64,
}

/// Where a device's log lines go ([`Device::set_log`]).
type LogFn = Box<dyn Fn(&str) + Send + Sync>;

impl Device {
    /// A device of `disksize` bytes on `pool`, compressing with `algorithm`, page by page.
    pub fn new(disksize: u64, algorithm: Algorithm, pool: Box<dyn ZPool>) -> Result<Device> {
        let page_size = pool.page_size();
        Device::with_unit_size(disksize, algorithm, pool, page_size)
    }

    /// A device storing compression units of `unit_size` bytes (a power of two from the
    /// pool's page size up to its largest object); `disksize` is a whole number of units.
    pub fn with_unit_size(
        disksize: u64,
        algorithm: Algorithm,
        pool: Box<dyn ZPool>,
        unit_size: usize,
    ) -> Result<Device> {
        let page_size = pool.page_size();
        if disksize == 0 || !disksize.is_multiple_of(page_size as u64) {
            return Err(ZramError::BadDiskSize(disksize));
        }
        let max_unit = pool.max_alloc_size().min(MAX_UNIT_SIZE);
        if !unit_size.is_power_of_two() || unit_size < page_size || unit_size > max_unit {
            return Err(ZramError::BadUnitSize {
                unit_size,
                page_size,
                max_unit,
            });
        }
        if !disksize.is_multiple_of(unit_size as u64) {
            return Err(ZramError::DiskNotWholeUnits {
                disksize,
                unit_size,
            });
        }
        let pages = disksize / unit_size as u64;
        // The kernel allocates the table with vzalloc when disksize is set, and fails with
        // ENOMEM when it cannot; a table larger than the machine's memory is refused up front
        // (allocating it would abort the process or swap it to death).
        let table_bytes = pages.saturating_mul(SLOT_BYTES);
        let memory_bytes = ztier_pool::physical_memory_bytes();
        if table_bytes > memory_bytes {
            return Err(ZramError::DiskTooLarge {
                disksize,
                table_bytes,
                memory_bytes,
            });
        }
        // Zeroed by the OS, untouched: memory is taken where pages arrive (the kernel's
        // vzalloc'd table takes it all up front).
        let slots = usize::try_from(pages)
            .ok()
            .and_then(ztier_base::zeroed::words::<2>)
            .ok_or(ZramError::TableAlloc { table_bytes })?;
        ztier_base::zeroed::no_huge_pages(&slots);
        Ok(Device {
            page_size,
            unit_size,
            algorithm,
            pool,
            slots,
            shards: Shards::default(),
            page_locks: Stripes::new(PAGE_LOCK_STRIPES),
            generations: Generations::new(unit_size, page_size),
            limit_pages: AtomicU64::new(0),
            max_used_pages: AtomicU64::new(0),
            created_secs: ztier_base::os::coarse_monotonic_secs(),
            age_shift: std::sync::atomic::AtomicU32::new(0),
            pinned_secs: AtomicU64::new(CLOCK_RUNS),
            backing: RwLock::new(None),
            wb_limit: AtomicU64::new(u64::MAX),
            recomp: RwLock::new(Vec::new()),
            log: parking_lot::Mutex::new(None),
            group: std::sync::OnceLock::new(),
            group_reported: AtomicU64::new(0),
        })
    }

    /// Where the device's log lines go: a written-back copy that fails its checksum (the
    /// read is an I/O error; this says which page and where).
    pub fn set_log(&self, log: impl Fn(&str) + Send + Sync + 'static) {
        *self.log.lock() = Some(Box::new(log));
    }

    fn log(&self, line: &str) {
        if let Some(log) = self.log.lock().as_ref() {
            log(line);
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// Bytes of disk one slot holds: the page size unless made
    /// [`with_unit_size`](Device::with_unit_size).
    pub fn unit_size(&self) -> usize {
        self.unit_size
    }
    /// Pages of the page size in the disk.
    pub fn pages(&self) -> u64 {
        self.units() * self.pages_per_unit()
    }
    /// Slots: compression units (pages, by default).
    pub fn units(&self) -> u64 {
        self.slots.len() as u64
    }
    fn pages_per_unit(&self) -> u64 {
        (self.unit_size / self.page_size) as u64
    }
    pub fn disksize(&self) -> u64 {
        self.units() * self.unit_size as u64
    }

    pub fn algorithm(&self) -> &Algorithm {
        &self.algorithm
    }
    /// The allocator under the device, as the CLI spells it.
    pub fn allocator(&self) -> &'static str {
        self.pool.name()
    }
    /// The allocator's table (zsmalloc's debugfs `classes`, zblock's `blocks`).
    pub fn allocator_stats(&self) -> PoolStats {
        self.pool.stats()
    }
    /// Compressed lengths from this size up are stored raw.
    pub fn huge_class_size(&self) -> usize {
        self.pool.huge_class_size()
    }

    /// The lock serializing changes to page `index`.
    fn page_lock(&self, index: u64) -> MutexGuard<'_, ()> {
        self.page_locks.lock(index)
    }

    fn new_stream(&self) -> Stream {
        Stream::new(&self.algorithm, self.unit_size)
    }

    /// The stream of priority `prio` (0: the primary algorithm) in a held shard.
    fn stream_for<'a>(&self, shard: &'a mut ShardState, prio: u32) -> &'a mut Stream {
        if prio == 0 {
            return shard.stream.get_or_insert_with(|| self.new_stream());
        }
        let i = (prio as usize - 1).min(MAX_SECONDARY - 1);
        shard.recomp[i].get_or_insert_with(|| {
            let alg = self.recomp.read().get(i).cloned();
            // A slot names a priority only after its algorithm was set; algorithms are
            // never removed while pages use them.
            Stream::new(
                &alg.expect("a stored priority has its algorithm"),
                self.unit_size,
            )
        })
    }

    /// A page's decompression (`Compressor::decompress_page`: a whole page or the error), as
    /// the device reports it.
    fn check_decoded(&self, index: u64, decoded: Result<(), CompressError>) -> Result<()> {
        decoded.map_err(|cause| ZramError::Compress { index, cause })
    }

    /// Seconds since the device was made (slots' `ac_time`), plus the age of a loaded state.
    /// Read on every access, from the coarse clock (whole seconds need no more).
    fn now(&self) -> u32 {
        let pinned = self.pinned_secs.load(Relaxed);
        if pinned != CLOCK_RUNS {
            return pinned as u32;
        }
        let shift = u64::from(self.age_shift.load(Relaxed));
        (self.lived_secs() + shift).min(u64::from(u32::MAX)) as u32
    }

    /// The device's age: the clock its pages' access times are read on (whole seconds).
    pub fn clock(&self) -> Duration {
        Duration::from_secs(u64::from(self.now()))
    }

    /// Makes the device `age` old (if it has not lived that long already), so the access
    /// times of its pages keep their meaning: a loaded state's oldest page's age, or a
    /// replay's recorded time (its pages then age at the recording's pace as long as the
    /// replay keeps ahead of it).
    pub fn set_age(&self, age: Duration) {
        let shift = age
            .as_secs()
            .saturating_sub(self.lived_secs())
            .min(u64::from(u32::MAX)) as u32;
        self.age_shift.store(shift, Relaxed);
    }

    /// Holds the device's clock still at `at` (whole seconds, at most 2^32-1), or lets it
    /// run again (`None`): from where it was held, or from the device's own age if it has
    /// lived longer ([`set_age`](Self::set_age) never takes the clock back; one called
    /// while the clock was held is overruled by the let-go). A replay pins it to each
    /// epoch's recorded time: the pages it writes then are stamped, and its policy's pass
    /// judges their ages, on the recording's clock alone, however long the replay takes, so
    /// two replays of one recording age every page alike.
    pub fn pin_clock(&self, at: Option<Duration>) {
        match at {
            Some(at) => {
                let secs = at.as_secs().min(u64::from(u32::MAX));
                self.pinned_secs.store(secs, Relaxed);
            }
            None => {
                let held = self.pinned_secs.load(Relaxed);
                if held != CLOCK_RUNS {
                    // The running clock is set before it shows, so no reader sees it step.
                    self.set_age(Duration::from_secs(held));
                    self.pinned_secs.store(CLOCK_RUNS, Relaxed);
                }
            }
        }
    }

    /// Whole seconds since the device was made.
    fn lived_secs(&self) -> u64 {
        ztier_base::os::coarse_monotonic_secs().saturating_sub(self.created_secs)
    }

    /// The calling thread's shard, held until the guard goes.
    fn shard(&self) -> MutexGuard<'_, ShardState> {
        self.shards.local()
    }

    /// The counters summed over the shards.
    fn counters(&self) -> Counters {
        let mut total = Counters::default();
        self.shards.for_each(|shard| total.merge(&shard.counters));
        total
    }

    /// Sets `mem_limit` in bytes (rounded up to pages; 0 = none).
    pub fn set_mem_limit(&self, bytes: u64) {
        self.limit_pages
            .store(bytes.div_ceil(self.page_size as u64), Relaxed);
    }

    /// Resets `mem_used_max` to the pages in use now (writing 0 to the sysfs file).
    pub fn reset_mem_used_max(&self) {
        self.max_used_pages.store(self.pool.total_pages(), Relaxed);
    }

    /// The slots of `range` a pass over the table looks at (see [`slot::WrittenSlots`]).
    fn written_slots(&self, range: std::ops::Range<u64>) -> slot::WrittenSlots<'_> {
        slot::WrittenSlots::new(&self.slots, range)
    }

    /// Every slot that holds a page now (each seen as by a look without its lock).
    fn occupied_slots(&self) -> impl Iterator<Item = &Slot> {
        self.written_slots(0..self.pages())
            .map(|index| &self.slots[index as usize])
            .filter(|s| !s.is_vacant())
    }

    fn slot(&self, index: u64) -> Result<&Slot> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.slots.get(i))
            .ok_or(ZramError::BadIndex {
                index,
                pages: self.pages(),
            })
    }

    /// A hint that page `index` will be read soon: asks the CPU for the line of its slot
    /// (its unit's, with larger units), so that the miss on it overlaps the caller's own
    /// work before the read (a fault handler taking its page's lock). Does nothing for an
    /// index out of range.
    pub fn prefetch(&self, index: u64) {
        let unit = index / (self.unit_size / self.page_size) as u64;
        if let Some(slot) = usize::try_from(unit).ok().and_then(|i| self.slots.get(i)) {
            ztier_base::prefetch::prefetch_read(std::ptr::from_ref(slot).addr());
        }
    }

    /// Writes one whole page (with larger units, a read-modify-write of its unit).
    pub fn write_page(&self, index: u64, page: &[u8]) -> Result<()> {
        if self.unit_size != self.page_size {
            self.check_page_index(index, page.len())?;
            return self.write_bytes(index * self.page_size as u64, page);
        }
        let _page = self.page_lock(index);
        self.write_page_locked(index, page)
    }

    /// Writes one whole unit (a page, unless the device has larger units): `unit` bytes.
    pub fn write_unit(&self, index: u64, unit: &[u8]) -> Result<()> {
        let _unit = self.page_lock(index);
        self.write_page_locked(index, unit)
    }

    /// Refuses a page index beyond the disk, or a buffer not one page long.
    fn check_page_index(&self, index: u64, len: usize) -> Result<()> {
        if index >= self.pages() {
            return Err(ZramError::BadIndex {
                index,
                pages: self.pages(),
            });
        }
        if len != self.page_size {
            return Err(ZramError::BadLength {
                len,
                page_size: self.page_size,
            });
        }
        Ok(())
    }

    /// `write_page` (of a whole unit) for a caller holding the unit's lock.
    fn write_page_locked(&self, index: u64, page: &[u8]) -> Result<()> {
        let mut shard = self.shard();
        let r = self.write_page_inner(&mut shard, index, page);
        if r.is_err() {
            shard.counters.add(Counter::FailedWrites, 1);
        }
        r
    }

    fn write_page_inner(&self, shard: &mut ShardState, index: u64, page: &[u8]) -> Result<()> {
        let slot = self.slot(index)?;
        if page.len() != self.unit_size {
            return Err(ZramError::BadLength {
                len: page.len(),
                page_size: self.unit_size,
            });
        }
        let counters = &mut shard.counters;
        let now = self.now();
        // Counted in pages: a unit is its pages.
        let pages = self.pages_per_unit() as i64;
        if let Some(word) = same_filled(page) {
            let mut g = slot.lock();
            self.free_slot(counters, index, &mut g.entry);
            g.entry.set_same(word);
            g.entry.set_ac_time(now);
            counters.add(Counter::SamePages, pages);
            counters.add(Counter::PagesStored, pages);
            return Ok(());
        }

        let s = shard.stream.get_or_insert_with(|| self.new_stream());
        let len = s
            .comp
            .compress(page, &mut s.buf)
            .map_err(|cause| ZramError::Compress { index, cause })?;
        // Stored raw from the pool's threshold on, and never larger than the unit (a pool
        // of larger objects than the device's unit has a threshold above it).
        let huge = len >= self.pool.huge_class_size().min(self.unit_size);
        let object = if huge { page } else { &s.buf[..len] };
        let handle = self.pool.store(object)?;
        let size = object.len();

        let used = self.pool.total_pages();
        // Read first: the line stays shared between threads until a new maximum is set.
        if used > self.max_used_pages.load(Relaxed) {
            self.max_used_pages.fetch_max(used, Relaxed);
        }
        let limit = self.limit_pages.load(Relaxed);
        if limit != 0 && used > limit {
            self.pool.free(handle)?;
            return Err(ZramError::MemLimit {
                used_bytes: used * self.page_size as u64,
                limit_bytes: limit * self.page_size as u64,
            });
        }
        if let Some(sum) = self.report_to_group() {
            let group = self.group.get().expect("reported to it");
            if group.is_over(sum) {
                self.pool.free(handle)?;
                let used_bytes = self.report_to_group().unwrap_or(sum);
                return Err(ZramError::GroupLimit {
                    used_bytes,
                    limit_bytes: group.limit_bytes(),
                });
            }
        }

        let mut g = slot.lock();
        self.free_slot(counters, index, &mut g.entry);
        g.entry.set_stored(handle, size);
        g.entry.set_ac_time(now);
        if size == self.unit_size {
            g.entry.set(SlotFlag::Huge, true);
            counters.add(Counter::HugePages, pages);
            counters.add(Counter::HugePagesSince, pages);
        }
        counters.add(Counter::ComprDataSize, size as i64);
        counters.add(Counter::PagesStored, pages);
        Ok(())
    }

    /// `zram_free_page()`: releases what slot `index`, locked, holds and clears it. Every
    /// change of a slot's content passes here first, so here the unit's generation moves on
    /// (which makes any decompressed copy of it in a shard's cache unusable).
    fn free_slot(&self, counters: &mut Counters, index: u64, e: &mut Entry) {
        self.generations.bump(index);
        let pages = self.pages_per_unit() as i64;
        match e.content() {
            Content::Empty => {}
            Content::Same(_) => counters.add(Counter::SamePages, -pages),
            Content::WrittenBack(place) => self.release_written_back(counters, place, e.size()),
            Content::Stored(handle) => {
                // The handle came from this pool and the slot lock makes it ours alone.
                self.pool.free(handle).expect("slot handles are live");
                counters.add(Counter::ComprDataSize, -(e.size() as i64));
                if e.has(SlotFlag::Huge) {
                    counters.add(Counter::HugePages, -pages);
                }
            }
        }
        if e.is_allocated() {
            counters.add(Counter::PagesStored, -pages);
        }
        *e = Entry::default();
    }

    /// Reads one whole page into `out`. A written-back page is read from the store with no
    /// lock held (see [`writeback`]); if the page changed while the store was read, it is
    /// read again. With larger units, its unit is decompressed and the page copied out.
    pub fn read_page(&self, index: u64, out: &mut [u8]) -> Result<()> {
        if self.unit_size != self.page_size {
            let r = self.check_page_index(index, out.len()).and_then(|()| {
                let ppu = self.pages_per_unit();
                let in_unit = (index % ppu) as usize * self.page_size;
                self.read_unit_part(index / ppu, in_unit, out)
            });
            if r.is_err() {
                self.shard().counters.add(Counter::FailedReads, 1);
            }
            return r;
        }
        self.read_unit(index, out)
    }

    /// Reads one whole unit (a page, unless the device has larger units) into `out`.
    pub fn read_unit(&self, index: u64, out: &mut [u8]) -> Result<()> {
        let r = self.read_page_pinned(index, out).map(drop);
        if r.is_err() {
            self.shard().counters.add(Counter::FailedReads, 1);
        }
        r
    }

    /// `read_page`, returning the pin of the place a written-back page was read from, so a
    /// caller can check the slot still names it later (a read-modify-write, under the page's
    /// lock).
    fn read_page_pinned(
        &self,
        index: u64,
        out: &mut [u8],
    ) -> Result<Option<(Entry, writeback::Pin)>> {
        loop {
            let in_memory = {
                let mut shard = self.shard();
                self.read_page_inner(&mut shard, index, out)?
            };
            if in_memory.is_none() {
                return Ok(None);
            }
            let Some((read, pin)) = self.read_written_back(index, out)? else {
                continue; // taken back into memory meanwhile (rewritten or discarded)
            };
            if self.slot(index)?.lock().entry.same_place(&read) {
                return Ok(Some((read, pin)));
            }
        }
    }

    /// Reads `out.len()` bytes at `in_unit` of unit `index`: copied from the shard's cache of
    /// decompressed units if it holds the unit as it is now (`unit_cache.rs`), else the unit
    /// decompressed into the cache and the part copied out. A written-back unit is read
    /// from the store with nothing held ([`read_page_pinned`](Device::read_page_pinned))
    /// and goes into the cache the same way.
    fn read_unit_part(&self, index: u64, in_unit: usize, out: &mut [u8]) -> Result<()> {
        let mut guard = self.shard();
        let shard = &mut *guard;
        let part = in_unit..in_unit + out.len();
        if let Some((way, generation)) = shard.unit_cache.find(index) {
            if self.cached_unit_current(shard, index, generation)? {
                out.copy_from_slice(&shard.unit_cache.unit(way, self.unit_size)[part]);
                return Ok(());
            }
            shard.unit_cache.forget(way);
        }
        // Loaded before the fill's slot lock: at most the count the filled bytes are of.
        let generation = self.generations.get(index);
        let mut cache = std::mem::take(&mut shard.unit_cache);
        let r = match cache.fill(self.unit_size) {
            Some((way, unit)) => {
                let r = self.read_page_inner(shard, index, unit);
                if let Ok(None) = r {
                    out.copy_from_slice(&unit[part]);
                    cache.filled(way, index, generation);
                }
                r
            }
            None => {
                let mut unit = std::mem::take(&mut shard.unit_buf);
                unit.resize(self.unit_size, 0);
                let r = self.read_page_inner(shard, index, &mut unit);
                if r.is_ok() {
                    out.copy_from_slice(&unit[part]);
                }
                shard.unit_buf = unit;
                r
            }
        };
        shard.unit_cache = cache;
        if r?.is_none() {
            return Ok(());
        }
        // Written back: read from the store with no shard held (it takes its own), into
        // the shard's spare buffer, then cached as a unit decompressed from memory is.
        let mut unit = std::mem::take(&mut shard.unit_buf);
        drop(guard);
        unit.resize(self.unit_size, 0);
        let r = self.read_page_pinned(index, &mut unit).map(drop);
        let mut guard = self.shard();
        let shard = &mut *guard;
        if r.is_ok() {
            out.copy_from_slice(&unit[in_unit..in_unit + out.len()]);
            // The bytes are the unit's content named under its slot lock after `generation`
            // was loaded (its place pinned, so not written anew in between): as sound a
            // fill as one from memory.
            if let Some((way, cached)) = shard.unit_cache.fill(self.unit_size) {
                cached.copy_from_slice(&unit);
                shard.unit_cache.filled(way, index, generation);
            }
        }
        shard.unit_buf = unit;
        r
    }

    /// Whether a shard's copy of unit `index`, filled at generation `filled`, is the unit
    /// as it is now: the unit's generation, loaded under its slot lock, has not moved since.
    /// If so the read counts as one (the slot's idle mark cleared, its access time set, its
    /// age recorded), as [`read_page_inner`](Device::read_page_inner) does.
    fn cached_unit_current(&self, shard: &mut ShardState, index: u64, filled: u64) -> Result<bool> {
        let now = self.now();
        let mut g = self.slot(index)?.lock();
        if self.generations.get(index) != filled {
            return Ok(false);
        }
        g.entry.set(SlotFlag::Idle, false);
        shard.read_ages.touch(&mut g.entry, now);
        Ok(true)
    }

    /// Reads a unit (a page, by default) held in memory; `Ok(Some(entry))` for a
    /// written-back one, which the caller reads from the store.
    fn read_page_inner(
        &self,
        shard: &mut ShardState,
        index: u64,
        out: &mut [u8],
    ) -> Result<Option<Entry>> {
        let slot = self.slot(index)?;
        if out.len() != self.unit_size {
            return Err(ZramError::BadLength {
                len: out.len(),
                page_size: self.unit_size,
            });
        }
        let now = self.now();
        let mut g = slot.lock();
        g.entry.set(SlotFlag::Idle, false);
        shard.read_ages.touch(&mut g.entry, now);
        let handle = match g.entry.content() {
            Content::WrittenBack(_) => return Ok(Some(g.entry)),
            Content::Empty | Content::Same(_) => {
                let word = match g.entry.content() {
                    Content::Same(word) => word,
                    _ => 0,
                };
                drop(g);
                fill_page(out, word);
                return Ok(None);
            }
            Content::Stored(handle) => handle,
        };
        if g.entry.has(SlotFlag::Huge) {
            self.pool.read(handle, out)?;
            return Ok(None);
        }
        // Only a compressed object needs a stream. It is decompressed where it lies (copied
        // out first only if it straddles two pool pages), under the slot lock as the kernel's
        // zram_read_from_zspool() does.
        let prio = g.entry.priority();
        let s = self.stream_for(shard, prio);
        let comp = &mut s.comp;
        let decoded = self.pool.read_map(handle, &mut s.buf, |object| {
            comp.decompress_page(object, out)
        })?;
        drop(g);
        self.check_decoded(index, decoded)?;
        Ok(None)
    }

    /// `echo all > idle` (`older_than` `None`) or `echo N > idle` (pages not accessed for
    /// `N` seconds): marks those pages idle; reads and writes clear the mark. Pages written
    /// back or same-filled are not marked, as in the kernel. Returns the pages marked.
    pub fn mark_idle(&self, older_than: Option<Duration>) -> u64 {
        let now = self.now();
        let age = older_than.map(|d| d.as_secs().min(u64::from(u32::MAX)) as u32);
        let mut marked = 0;
        for slot in self.occupied_slots() {
            let mut g = slot.lock();
            let e = &mut g.entry;
            if !e.is_allocated() || e.has(SlotFlag::Wb) || e.has(SlotFlag::Same) {
                continue;
            }
            if age.is_some_and(|a| now.saturating_sub(e.ac_time()) < a) {
                continue;
            }
            e.set(SlotFlag::Idle, true);
            marked += 1;
        }
        // An aging device gives its decompressed units back: a read that follows refills.
        self.drop_unit_caches();
        marked
    }

    /// A slot's state, for inspection.
    pub fn entry(&self, index: u64) -> Result<Entry> {
        Ok(self.slot(index)?.lock().entry)
    }

    /// Runs the allocator's compaction (the memory-pressure hook); returns pages freed. The
    /// shards' decompressed units go back to the OS too.
    pub fn compact(&self) -> u64 {
        let freed = self.pool.compact();
        self.report_to_group();
        self.drop_unit_caches();
        freed
    }

    /// Empties every shard's cache of decompressed units and gives its memory back, taking
    /// the shards one at a time (nothing to do on a device of page-sized units).
    fn drop_unit_caches(&self) {
        if self.unit_size != self.page_size {
            self.shards.for_each(|shard| shard.unit_cache.clear());
        }
    }

    /// Bytes of memory the caches of decompressed units hold: the shards' buffers (at most
    /// `SHARDS` × 128 KiB, given back on `compact`, `mark_idle` and `reset`) and the 8 KiB
    /// of generation counters that validate them; 0 on a device of page-sized units, which
    /// has none. Not part of `mem_used_total`, which stays the pool's pages.
    pub fn unit_cache_bytes(&self) -> u64 {
        if self.unit_size == self.page_size {
            return 0;
        }
        let mut bytes = self.generations.bytes();
        self.shards
            .for_each(|shard| bytes += shard.unit_cache.bytes());
        bytes
    }

    /// The pool's bytes (`mem_used_total`).
    fn pool_bytes(&self) -> u64 {
        self.pool.total_pages() * self.page_size as u64
    }

    /// Frees every slot and zeroes the statistics (`reset`); the limit stays. It waits for
    /// the backing store's readahead to end, then holds every shard throughout, so no read,
    /// write or discard runs beside it: each one finishes before it or starts after it.
    pub fn reset(&self) {
        // A readahead in flight holds places on the store: it ends before they are freed.
        let store = self.backing();
        if let Some(store) = &store {
            store.quiesce();
        }
        let mut shards = self.shards.lock_all();
        // Only the table's pages ever written hold slots: the rest is passed by untouched
        // (a claim's compare-and-swap would bring each in, 256 MiB of a 64 GiB disk's).
        let written = ztier_base::zeroed::written_rows(&self.slots)
            .unwrap_or_else(|| std::iter::once(0..self.slots.len()).collect());
        for range in &written {
            for (index, slot) in (range.start as u64..).zip(&self.slots[range.clone()]) {
                if slot.is_vacant() {
                    continue;
                }
                let mut g = slot.lock();
                self.free_slot(&mut shards[0].counters, index, &mut g.entry);
            }
        }
        for shard in shards.iter_mut() {
            shard.counters = Counters::default();
            shard.unit_cache.clear();
        }
        // Every slot is empty: the table goes back to the OS (a slot a scanner holds keeps
        // its page).
        for range in written {
            ztier_base::zeroed::give_back_zero_pages(&self.slots, range, slot::ROW_LOCK);
        }
        if let Some(store) = &store {
            store.reset_reads();
        }
        self.max_used_pages.store(self.pool.total_pages(), Relaxed);
    }

    /// `mm_stat`.
    pub fn mm_stat(&self) -> MmStat {
        let ps = self.page_size as u64;
        let counters = self.counters();
        MmStat {
            orig_data_size: counters.get(Counter::PagesStored) * ps,
            compr_data_size: counters.get(Counter::ComprDataSize),
            mem_used_total: self.pool.total_pages() * ps,
            mem_limit: self.limit_pages.load(Relaxed) * ps,
            mem_used_max: self.max_used_pages.load(Relaxed) * ps,
            same_pages: counters.get(Counter::SamePages),
            pages_compacted: self.pool.pages_compacted(),
            huge_pages: counters.get(Counter::HugePages),
            huge_pages_since: counters.get(Counter::HugePagesSince),
        }
    }

    /// `io_stat`.
    pub fn io_stat(&self) -> IoStat {
        let counters = self.counters();
        IoStat {
            failed_reads: counters.get(Counter::FailedReads),
            failed_writes: counters.get(Counter::FailedWrites),
            invalid_io: 0,
            notify_free: counters.get(Counter::NotifyFree),
        }
    }

    /// `debug_stat`.
    pub fn debug_stat(&self) -> DebugStat {
        DebugStat {
            version: 2,
            miss_free: self.counters().get(Counter::MissFree),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.reset();
        self.leave_group();
    }
}
