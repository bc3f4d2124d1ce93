//! zswap in userspace (`mm/zswap.c`): a compressed cache in front of a swap device.
//!
//! A page on its way out to a swap slot ([`Cache::swap_out`]) is compressed and kept in a
//! pool instead; only when the pool reaches its limit are the coldest pages written back,
//! decompressed, to their slots on the [`ztier_swap::Device`] underneath. The caller owns
//! the slots, as the kernel's swap layer does: it allocates one before a page is stored
//! and frees it ([`Cache::swap_free`]) when the page is gone for good.
//!
//! - The index (`tree.rs`) maps a slot to a 16-byte value: a stored page's pool handle,
//!   length and LRU node, or the tag of a zero-filled page, which takes no entry and no pool
//!   memory. (Today's kernel keeps zero pages one layer down, in the swap device's zero map,
//!   so zswap never sees them; ztier's slot allocator knows nothing of page contents, so the
//!   tag lives here, as in the seed patch "mm: zswap: store zero-filled pages without a
//!   zswap_entry". Either way they are not in `stored_pages`.)
//! - A page that does not compress below a page is stored whole and counted
//!   (`stored_incompressible_pages`), as kernel 6.18 does when writeback is allowed.
//! - A load is exclusive, as the kernel's: the entry is freed once the page is handed back
//!   (the caller now holds the only copy, and marks it dirty). The page leaves the index at
//!   once; its pool object and LRU node are freed with the next 31 loads of the thread's
//!   shard, in one batch (one hold of the LRU lock, one of each class lock), and before any
//!   figure is read, any store of the shard checks the pool limit, or the shrinker walks.
//!   A load's batch passes over the classes another thread holds (a reader decompressing:
//!   a free would wait for it, and readers behind the free for both), keeping their
//!   objects for the next batch, up to 63 loads' worth, past which it waits: a shard holds
//!   at most 94 loaded pages' objects between batches. Other threads' shards hold theirs
//!   when a store checks the pool limit (the kernel frees each at once), so with several
//!   threads loading, the limit can be reached up to that many objects a shard early.
//! - The pool limit is `max_pool_percent` of a RAM budget; once reached, stores are refused
//!   (`pool_limit_hit`) until the pool is back under `accept_threshold_percent` of the
//!   limit, and a background worker compacts the pool and writes the LRU's coldest pages
//!   back until it is (`shrink.rs`). [`Cache::shrink`] does the same on demand (the memory-pressure
//!   shrinker).
//! - A store that zswap refuses leaves no stale copy: the slot's old entry is invalidated
//!   and [`Cache::swap_out`] writes the page to the device, where [`Cache::swap_in`] finds
//!   it.
//!
//! # Lock order
//! page lock of the slot (a stripe of [`Stripes`], the kernel's folio lock: held by every
//! operation on that slot, across the writeback I/O too) → the thread's shard (stream and
//! put-off frees) → the slot's tree node → the LRU → the pool's own locks. A load holds its
//! shard and the slot's tree node across the decompression; a batch of put-off frees holds
//! the shard, then the LRU, then each class. The shrinker chooses its pages under the LRU
//! lock alone, drops it, then takes each page's lock in order, and checks the index still
//! names the node it chose. The LRU's compaction takes a tree node then the LRU, holding at
//! most the caller's page lock. Only the page lock is held across I/O; a value's handle and
//! length change only under its page lock, so a holder of the page lock may read them and
//! use them without the node's lock (its LRU node id, which compaction may move, only under
//! the node's lock).
#![forbid(unsafe_code)]

mod lru;
mod shrink;
mod stats;
mod tree;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use ztier_base::shard::{Shards, Stripes};
use ztier_compress::{same_filled, Algorithm, CompressError, Stream};
use ztier_pool::{Handle, PoolError, ZPool};
use ztier_swap::SwapError;

pub use stats::ZswapStats;

use lru::Lru;
use stats::{Event, Events};
use tree::{Tree, Value};

/// The kernel's defaults.
pub const MAX_POOL_PERCENT: u32 = 20;
pub const ACCEPT_THRESHOLD_PERCENT: u32 = 90;
/// Pages the shrinker walks per LRU pass (`SWAP_CLUSTER_MAX`).
pub const SWAP_CLUSTER_MAX: usize = 32;

const PAGE_LOCK_STRIPES: usize = 1024;

/// LRU nodes a store moves down while the LRU's slab is sparse: more than the one node a
/// store adds, so the slab comes back, but a small share of a store's time.
const STORE_COMPACT_MOVES: usize = 8;

/// Loaded pages whose pool object and LRU node a shard keeps before it frees them together:
/// the LRU lock taken once and each class's lock once for the batch, instead of each once
/// per load.
const FREE_BATCH: usize = 32;

/// Loaded pages' objects a shard may keep unfreed because their class was held by another
/// thread when its batch was freed; at this many, the batch waits for the locks. A shard
/// holds at most `FREE_DEFER_MAX + FREE_BATCH - 2` loaded pages' objects between batches.
const FREE_DEFER_MAX: usize = 2 * FREE_BATCH;

/// Why zswap refused a store (the kernel's `reject_*` counters name the same causes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("the pool is at its limit (pool_limit_hit)")]
    PoolLimit,
    #[error("compression failed and writeback is off (reject_compress_fail)")]
    CompressFail,
    #[error("the compressed page is too large for the pool (reject_compress_poor)")]
    CompressPoor,
    #[error("the pool could not allocate (reject_alloc_fail)")]
    AllocFail,
    #[error("no LRU entry is left (reject_kmemcache_fail)")]
    EntryAllocFail,
}

/// What a cache operation refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZswapError {
    #[error("a page is {page_size} bytes, got {len}")]
    BadLength { len: usize, page_size: usize },
    #[error("swap slot {slot} is outside the device's slots 1..{slots}")]
    OutOfRange { slot: u64, slots: u64 },
    #[error("zswap refused the page: {0}")]
    Rejected(Reject),
    #[error("slot {slot}: {source}")]
    Decompress { slot: u64, source: CompressError },
    #[error("slot {slot} decompressed to {got} bytes instead of {page_size}")]
    ShortPage {
        slot: u64,
        got: usize,
        page_size: usize,
    },
    #[error("allocator: {0}")]
    Pool(#[from] PoolError),
    #[error("swap device: {0}")]
    Swap(#[from] SwapError),
    #[error("the pool's pages are {pool} bytes, the swap device's slots {slot}")]
    PageSizeMismatch { pool: usize, slot: u64 },
    #[error("{name} is {value}: a percentage (0..=100)")]
    NotAPercentage { name: &'static str, value: u32 },
    #[error("{slots} swap slots: zswap indexes at most {max}")]
    TooManySlots { slots: u64, max: u64 },
}

pub type Result<T, E = ZswapError> = std::result::Result<T, E>;

/// The cache's settings (zswap's module parameters).
#[derive(Debug, Clone)]
pub struct Config {
    pub algorithm: Algorithm,
    /// The memory the percentages are of (the kernel's `totalram_pages()`), in bytes.
    pub ram_bytes: u64,
    pub max_pool_percent: u32,
    pub accept_threshold_percent: u32,
    /// Whether pages may go to the swap device (`memory.zswap.writeback`): without it, the
    /// shrinker does nothing and an incompressible page is refused instead of stored whole.
    pub writeback: bool,
    /// Run the background worker that shrinks a full pool to the accept threshold.
    pub shrink_worker: bool,
}

impl Config {
    pub fn new(algorithm: Algorithm, ram_bytes: u64) -> Config {
        Config {
            algorithm,
            ram_bytes,
            max_pool_percent: MAX_POOL_PERCENT,
            accept_threshold_percent: ACCEPT_THRESHOLD_PERCENT,
            writeback: true,
            shrink_worker: true,
        }
    }
}

/// Where [`Cache::swap_out`] put a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Compressed in the pool.
    Zswap,
    /// Zero-filled: a tag in the index.
    Zero,
    /// Refused by zswap and written to the swap device.
    Device(Reject),
}

/// Where [`Cache::swap_in`] found a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Zswap,
    Zero,
    Device,
}

/// A thread shard's state (the kernel's per-CPU `acomp_ctx`, and the frees its loads put
/// off).
#[derive(Default)]
struct Shard {
    stream: Option<Stream>,
    /// Pool objects of pages loaded through this shard, out of the index, not yet freed.
    freed: Vec<Handle>,
    /// Their LRU nodes, not yet taken off the LRU.
    lru_freed: Vec<u32>,
}

/// The state the cache and its shrink worker share.
pub(crate) struct Inner {
    config: Config,
    page_size: usize,
    swap: Arc<ztier_swap::Device>,
    pool: Box<dyn ZPool>,
    /// Per thread shard: a compression stream (the kernel's per-CPU `acomp_ctx`) and the
    /// frees its loads put off.
    shards: Shards<Shard>,
    page_locks: Stripes,
    tree: Tree,
    lru: Mutex<Lru>,
    /// `zswap_pool_reached_full`.
    reached_full: AtomicBool,
    /// The LRU's slab was seen more than an eighth larger than needed.
    lru_sparse: AtomicBool,
    stored_pages: AtomicU64,
    stored_incompressible: AtomicU64,
    zero_pages: AtomicU64,
    events: Events,
    worker: shrink::Worker,
}

/// A zswap cache in front of one swap device.
pub struct Cache {
    inner: Arc<Inner>,
    worker: Option<shrink::Handle>,
}

impl Cache {
    /// A cache on `pool` in front of `swap`.
    pub fn new(
        swap: Arc<ztier_swap::Device>,
        pool: Box<dyn ZPool>,
        config: Config,
    ) -> Result<Cache> {
        let page_size = pool.page_size();
        if page_size as u64 != ztier_swap::SLOT_BYTES {
            return Err(ZswapError::PageSizeMismatch {
                pool: page_size,
                slot: ztier_swap::SLOT_BYTES,
            });
        }
        for (name, value) in [
            ("max_pool_percent", config.max_pool_percent),
            ("accept_threshold_percent", config.accept_threshold_percent),
        ] {
            if value > 100 {
                return Err(ZswapError::NotAPercentage { name, value });
            }
        }
        if swap.slots() > u64::from(u32::MAX) {
            return Err(ZswapError::TooManySlots {
                slots: swap.slots(),
                max: u64::from(u32::MAX),
            });
        }
        let inner = Arc::new(Inner {
            page_size,
            tree: Tree::new(swap.slots()),
            swap,
            pool,
            shards: Shards::default(),
            page_locks: Stripes::new(PAGE_LOCK_STRIPES),
            lru: Mutex::default(),
            reached_full: AtomicBool::new(false),
            lru_sparse: AtomicBool::new(false),
            stored_pages: AtomicU64::new(0),
            stored_incompressible: AtomicU64::new(0),
            zero_pages: AtomicU64::new(0),
            events: Events::default(),
            worker: shrink::Worker::default(),
            config,
        });
        let worker = inner
            .config
            .shrink_worker
            .then(|| shrink::Handle::start(&inner));
        Ok(Cache { inner, worker })
    }

    pub fn page_size(&self) -> usize {
        self.inner.page_size
    }
    pub fn config(&self) -> &Config {
        &self.inner.config
    }
    /// The swap device underneath.
    pub fn swap(&self) -> &Arc<ztier_swap::Device> {
        &self.inner.swap
    }
    /// The pool's table (zsmalloc's `classes`).
    pub fn pool_stats(&self) -> ztier_pool::PoolStats {
        self.inner.pool.stats()
    }
    /// Bytes of pool pages held now (`pool_total_size`), without the rest of the figures:
    /// the objects of up to 94 loads a thread shard has not freed yet included
    /// ([`stats`](Self::stats) frees them first).
    pub fn pool_bytes(&self) -> u64 {
        self.inner.total_pages() * self.inner.page_size as u64
    }
    /// Pool pages the limit allows (`zswap_max_pages()`).
    pub fn max_pages(&self) -> u64 {
        self.inner.max_pages()
    }

    /// `zswap_store()`: keeps `page` for `slot`, an allocated slot of the device. A refused
    /// store invalidates whatever the cache held for the slot (the caller must put the page
    /// elsewhere: [`swap_out`](Self::swap_out) writes it to the device).
    pub fn store(&self, slot: u64, page: &[u8]) -> Result<Placement> {
        self.inner.check(slot, page.len())?;
        let page_lock = self.inner.page_locks.lock(slot);
        let r = self.inner.store_locked(slot, page);
        drop(page_lock);
        self.inner.maybe_compact_lru();
        r
    }

    /// `zswap_load()`: the page of `slot` into `out`, if the cache holds it (`Ok(None)` if
    /// not: it is on the device). The entry goes once the page is handed back.
    pub fn load(&self, slot: u64, out: &mut [u8]) -> Result<Option<Source>> {
        self.inner.check(slot, out.len())?;
        let _page = self.inner.page_locks.lock(slot);
        self.inner.load_locked(slot, out)
    }

    /// `zswap_invalidate()`: forgets the slot's page, if held (the slot is being freed or
    /// rewritten elsewhere). Returns whether there was one.
    pub fn invalidate(&self, slot: u64) -> Result<bool> {
        self.inner.check(slot, self.inner.page_size)?;
        let _page = self.inner.page_locks.lock(slot);
        Ok(self.inner.invalidate_locked(slot))
    }

    /// Swap-out as `swap_writeout()` does it: zswap first; if zswap refuses, the page goes
    /// to the slot on the device.
    pub fn swap_out(&self, slot: u64, page: &[u8]) -> Result<Placement> {
        self.inner.check(slot, page.len())?;
        let page_lock = self.inner.page_locks.lock(slot);
        let r = match self.inner.store_locked(slot, page) {
            Err(ZswapError::Rejected(why)) => {
                self.inner.swap.write_slot(slot, page)?;
                self.inner.events.add(Event::SwpoutDevice, 1);
                Ok(Placement::Device(why))
            }
            other => other,
        };
        drop(page_lock);
        self.inner.maybe_compact_lru();
        r
    }

    /// Swap-in: from zswap if it holds the page, else from the device.
    pub fn swap_in(&self, slot: u64, out: &mut [u8]) -> Result<Source> {
        self.inner.check(slot, out.len())?;
        let _page = self.inner.page_locks.lock(slot);
        if let Some(source) = self.inner.load_locked(slot, out)? {
            return Ok(source);
        }
        self.inner.swap.read_slot(slot, out)?;
        self.inner.events.add(Event::SwpinDevice, 1);
        Ok(Source::Device)
    }

    /// Frees a slot for good: its zswap entry, then its slot on the device.
    pub fn swap_free(&self, slot: u64) -> Result<()> {
        self.invalidate(slot)?;
        self.inner.swap.free(slot)?;
        Ok(())
    }

    /// Writes back up to `nr` of the LRU's coldest pages now (passing over referenced
    /// ones, as the shrinker does); returns the pages written back.
    pub fn shrink(&self, nr: usize) -> u64 {
        let written = self.inner.shrink(nr);
        self.inner.compact_lru(usize::MAX, 64);
        written
    }

    /// Whether the cache holds `slot`'s page (a hint, as `zswap_is_present()`).
    pub fn contains(&self, slot: u64) -> bool {
        slot < self.inner.swap.slots() && !self.inner.tree.lock(slot).get().is_empty()
    }

    /// Waits until the background worker is idle (tests and benches, to read settled
    /// figures).
    pub fn wait_shrink_idle(&self) {
        self.inner.worker.wait_idle();
    }

    pub fn stats(&self) -> ZswapStats {
        self.inner.stats()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            w.stop(&self.inner);
        }
    }
}

impl Inner {
    fn check(&self, slot: u64, len: usize) -> Result<()> {
        if len != self.page_size {
            return Err(ZswapError::BadLength {
                len,
                page_size: self.page_size,
            });
        }
        let slots = self.swap.slots();
        if slot == 0 || slot >= slots {
            return Err(ZswapError::OutOfRange { slot, slots });
        }
        Ok(())
    }

    fn count(&self, e: Event) {
        self.events.add(e, 1);
    }

    fn max_pages(&self) -> u64 {
        let ram_pages = self.config.ram_bytes / self.page_size as u64;
        ram_pages * u64::from(self.config.max_pool_percent) / 100
    }

    pub(crate) fn accept_thr_pages(&self) -> u64 {
        self.max_pages() * u64::from(self.config.accept_threshold_percent) / 100
    }

    pub(crate) fn total_pages(&self) -> u64 {
        self.pool.total_pages()
    }

    /// `zswap_check_limits()`: whether stores are refused now.
    fn check_limits(&self) -> bool {
        let cur = self.total_pages();
        if cur >= self.max_pages() {
            self.count(Event::PoolLimitHit);
            self.reached_full.store(true, Relaxed);
        } else if self.reached_full.load(Relaxed) && cur <= self.accept_thr_pages() {
            self.reached_full.store(false, Relaxed);
        }
        self.reached_full.load(Relaxed)
    }

    /// `zswap_store()` for a caller holding the slot's page lock.
    fn store_locked(&self, slot: u64, page: &[u8]) -> Result<Placement> {
        let r = self.try_store(slot, page);
        if let Err(ZswapError::Rejected(_)) = r {
            // No stale copy may outlive a refused store: the page goes elsewhere now.
            self.invalidate_locked(slot);
            if self.reached_full.load(Relaxed) {
                self.worker.queue();
            }
        }
        r
    }

    fn try_store(&self, slot: u64, page: &[u8]) -> Result<Placement> {
        if same_filled(page) == Some(0) {
            self.replace(slot, Value::ZERO);
            self.zero_pages.fetch_add(1, Relaxed);
            self.count(Event::SwpoutZero);
            return Ok(Placement::Zero);
        }
        let handle = {
            let mut shard = self.shards.local();
            // The pool as the kernel's would be: this thread's loads' objects freed.
            self.flush(&mut shard);
            if self.check_limits() {
                return Err(ZswapError::Rejected(Reject::PoolLimit));
            }
            let s = shard
                .stream
                .get_or_insert_with(|| Stream::new(&self.config.algorithm, self.page_size));
            let object = match s.compress(page) {
                Ok(c) if !c.is_empty() && c.len() < self.page_size => c,
                // Stored whole, to keep the LRU order of writebacks (kernel 6.18); without
                // writeback it would only add metadata.
                _ if self.config.writeback => page,
                _ => {
                    self.count(Event::RejectCompressFail);
                    return Err(ZswapError::Rejected(Reject::CompressFail));
                }
            };
            match self.pool.store(object) {
                Ok(h) => (h, object.len()),
                Err(PoolError::TooLarge { .. }) => {
                    self.count(Event::RejectCompressPoor);
                    return Err(ZswapError::Rejected(Reject::CompressPoor));
                }
                Err(_) => {
                    self.count(Event::RejectAllocFail);
                    return Err(ZswapError::Rejected(Reject::AllocFail));
                }
            }
        };
        let (handle, length) = handle;
        let mut node = self.tree.lock(slot);
        let lru_id = match self.lru.lock().add(slot as u32) {
            Ok(id) => id,
            Err(_) => {
                drop(node);
                self.count(Event::RejectKmemcacheFail);
                self.pool.free(handle)?;
                return Err(ZswapError::Rejected(Reject::EntryAllocFail));
            }
        };
        let old = node.set(Value::stored(handle, length, lru_id));
        self.stored_pages.fetch_add(1, Relaxed);
        if length == self.page_size {
            self.stored_incompressible.fetch_add(1, Relaxed);
        }
        self.release(old);
        drop(node);
        self.count(Event::Zswpout);
        Ok(Placement::Zswap)
    }

    /// Sets the slot's value and releases the one it replaces.
    fn replace(&self, slot: u64, value: Value) -> Value {
        let mut node = self.tree.lock(slot);
        let old = node.set(value);
        self.release(old);
        old
    }

    /// `zswap_entry_free()`: gives back what a value taken out of the index held. The
    /// caller holds the slot's page lock and its tree node's lock.
    fn release(&self, old: Value) {
        if old.is_zero() {
            self.zero_pages.fetch_sub(1, Relaxed);
        } else if let Some((handle, length, lru_id)) = old.entry() {
            self.lru_remove(&mut self.lru.lock(), lru_id);
            // The handle came from this pool, and the value, now gone, was its only name.
            self.pool
                .free(handle)
                .expect("index values name live objects");
            self.stored_pages.fetch_sub(1, Relaxed);
            if length == self.page_size {
                self.stored_incompressible.fetch_sub(1, Relaxed);
            }
        }
    }

    /// Takes an LRU node off, noting when the slab has grown sparse.
    fn lru_remove(&self, lru: &mut Lru, id: u32) {
        lru.remove(id);
        if lru.sparse() && !self.lru_sparse.load(Relaxed) {
            self.lru_sparse.store(true, Relaxed);
        }
    }

    fn invalidate_locked(&self, slot: u64) -> bool {
        !self.replace(slot, Value::EMPTY).is_empty()
    }

    /// Frees what a shard's loads put off: their LRU nodes under one hold of the LRU lock,
    /// their objects with one hold of each class's lock. The caller holds the shard.
    fn flush(&self, shard: &mut Shard) {
        self.take_off_lru(shard);
        if shard.freed.is_empty() {
            return;
        }
        // The handles came from this pool, and the values that named them are gone.
        self.pool
            .free_batch(&mut shard.freed)
            .expect("index values name live objects");
        shard.freed.clear();
    }

    /// A load's share of [`flush`](Self::flush): the objects whose class no other thread
    /// holds are freed, the others kept for the next batch (a free waits for no reader
    /// decompressing beside it), unless [`FREE_DEFER_MAX`] are waiting.
    fn flush_uncontended(&self, shard: &mut Shard) {
        if shard.freed.len() >= FREE_DEFER_MAX {
            return self.flush(shard);
        }
        self.take_off_lru(shard);
        self.pool
            .free_batch_uncontended(&mut shard.freed)
            .expect("index values name live objects");
    }

    /// The LRU nodes of the shard's loaded pages taken off, under one hold of the LRU lock.
    fn take_off_lru(&self, shard: &mut Shard) {
        if shard.lru_freed.is_empty() {
            return;
        }
        let mut lru = self.lru.lock();
        for id in shard.lru_freed.drain(..) {
            self.lru_remove(&mut lru, id);
        }
    }

    /// Moves LRU nodes from the top of its slab into free ids below, up to `batches` of `per`,
    /// until the slab is at most an eighth larger than the pages it holds: under churn
    /// (pages written back, loaded or freed in no order) it would otherwise keep its peak
    /// size. Each node is moved under its slot's tree node and the LRU lock, the order every
    /// change of a value takes; a node whose value no longer names it (loaded, freed,
    /// written back meanwhile) is passed over. The caller holds no lock of the cache but
    /// perhaps its slot's page lock.
    pub(crate) fn compact_lru(&self, batches: usize, per: usize) {
        let mut top = Vec::with_capacity(per);
        for _ in 0..batches {
            top.clear();
            {
                let lru = self.lru.lock();
                if !lru.sparse() {
                    return;
                }
                lru.top(per, &mut top);
            }
            let mut moved = 0;
            for &(id, slot) in &top {
                let mut node = self.tree.lock(slot);
                let Some((handle, length, lru_id)) = node.get().entry() else {
                    continue;
                };
                if lru_id != id {
                    continue;
                }
                let Some(to) = self.lru.lock().relocate(id) else {
                    continue;
                };
                node.set(Value::stored(handle, length, to));
                moved += 1;
            }
            if moved == 0 {
                return;
            }
        }
        // Not done: the next store goes on.
        self.lru_sparse.store(true, Relaxed);
    }

    /// A store's share of the LRU's compaction: a few moves if the slab has grown
    /// sparse (a flag set under the LRU lock). Stores pay it, not loads: a pass of loads
    /// that empties the cache would move nodes down only to take them off, and the slab
    /// matters as pages are held.
    pub(crate) fn maybe_compact_lru(&self) {
        if self.lru_sparse.load(Relaxed) {
            self.lru_sparse.store(false, Relaxed);
            self.compact_lru(1, STORE_COMPACT_MOVES);
        }
    }

    /// Every shard's put-off frees done (before figures are read or the LRU walked).
    pub(crate) fn flush_all(&self) {
        self.shards.for_each(|shard| self.flush(shard));
    }

    /// Decompresses a stored page into `out` with the shard's stream.
    fn decompress(
        &self,
        shard: &mut Shard,
        slot: u64,
        handle: Handle,
        length: usize,
        out: &mut [u8],
    ) -> Result<()> {
        if length == self.page_size {
            self.pool.read(handle, out)?;
            return Ok(());
        }
        let Stream { comp, buf } = shard
            .stream
            .get_or_insert_with(|| Stream::new(&self.config.algorithm, self.page_size));
        let decoded = self
            .pool
            .read_map(handle, buf, |object| comp.decompress_page(object, out))?;
        decoded.map_err(|e| {
            self.count(Event::DecompressFail);
            match e {
                CompressError::PageLength { got, page_size, .. } => ZswapError::ShortPage {
                    slot,
                    got,
                    page_size,
                },
                source => ZswapError::Decompress { slot, source },
            }
        })
    }

    /// `zswap_load()` for a caller holding the slot's page lock: the page is decompressed
    /// under the slot's tree node, taken out of the index, and its object and LRU node left
    /// to the shard's next batch of frees.
    fn load_locked(&self, slot: u64, out: &mut [u8]) -> Result<Option<Source>> {
        let mut shard = self.shards.local();
        let mut node = self.tree.lock(slot);
        let value = node.get();
        if value.is_empty() {
            return Ok(None);
        }
        if value.is_zero() {
            node.set(Value::EMPTY);
            drop(node);
            self.zero_pages.fetch_sub(1, Relaxed);
            out.fill(0);
            self.count(Event::SwpinZero);
            return Ok(Some(Source::Zero));
        }
        let (handle, length, lru_id) = value.entry().expect("neither empty nor zero");
        // A page that does not decompress stays where it is.
        self.decompress(&mut shard, slot, handle, length, out)?;
        node.set(Value::EMPTY);
        drop(node);
        self.stored_pages.fetch_sub(1, Relaxed);
        if length == self.page_size {
            self.stored_incompressible.fetch_sub(1, Relaxed);
        }
        shard.freed.push(handle);
        shard.lru_freed.push(lru_id);
        if shard.lru_freed.len() >= FREE_BATCH {
            self.flush_uncontended(&mut shard);
        }
        self.count(Event::Zswpin);
        Ok(Some(Source::Zswap))
    }

    /// Walks up to `nr_to_walk` pages from the LRU's head, writing back those not
    /// referenced since the last walk; returns how many were written back.
    pub(crate) fn shrink(&self, nr_to_walk: usize) -> u64 {
        if !self.config.writeback {
            return 0;
        }
        let mut victims = Vec::with_capacity(SWAP_CLUSTER_MAX);
        let mut page = vec![0u8; self.page_size];
        let mut written = 0;
        let mut walked = 0;
        // Loaded pages' nodes off the LRU first, so the walk chooses none of them.
        self.flush_all();
        while walked < nr_to_walk {
            let walk = (nr_to_walk - walked).min(SWAP_CLUSTER_MAX);
            victims.clear();
            {
                let mut lru = self.lru.lock();
                if lru.len() == 0 {
                    break;
                }
                lru.walk(walk, &mut victims);
            }
            walked += walk;
            for &(lru_id, slot) in &victims {
                match self.writeback_entry(lru_id, slot, &mut page) {
                    Ok(true) => {
                        self.count(Event::WrittenBack);
                        written += 1;
                    }
                    // Gone or stored again since it was chosen, or the device failed: the
                    // page, if any, stays in the pool.
                    Ok(false) | Err(_) => self.count(Event::RejectReclaimFail),
                }
            }
        }
        written
    }

    /// `zswap_writeback_entry()`: if the index still names LRU node `lru_id` for `slot`,
    /// its page is decompressed, written to the slot, then freed. `Ok(false)`: it does not.
    fn writeback_entry(&self, lru_id: u32, slot: u64, page: &mut [u8]) -> Result<bool> {
        let _page_lock = self.page_locks.lock(slot);
        let value = self.tree.lock(slot).get();
        let Some((handle, length, id)) = value.entry() else {
            return Ok(false);
        };
        if id != lru_id {
            return Ok(false);
        }
        self.decompress(&mut self.shards.local(), slot, handle, length, page)?;
        // The only I/O, under the page lock alone: a swap-in of this slot waits for it and
        // then reads the device; until the write is done the page is still in the pool.
        self.swap.write_slot(slot, page)?;
        self.replace(slot, Value::EMPTY);
        Ok(true)
    }

    fn stats(&self) -> ZswapStats {
        self.flush_all();
        let e = |x: Event| self.events.sum(x);
        let pool_total_size = self.total_pages() * self.page_size as u64;
        let stored_pages = self.stored_pages.load(Relaxed);
        let lru_bytes = self.lru.lock().bytes();
        ZswapStats {
            pool_limit_hit: e(Event::PoolLimitHit),
            reject_reclaim_fail: e(Event::RejectReclaimFail),
            reject_alloc_fail: e(Event::RejectAllocFail),
            reject_kmemcache_fail: e(Event::RejectKmemcacheFail),
            reject_compress_fail: e(Event::RejectCompressFail),
            reject_compress_poor: e(Event::RejectCompressPoor),
            decompress_fail: e(Event::DecompressFail),
            written_back_pages: e(Event::WrittenBack),
            pool_total_size,
            stored_pages,
            stored_incompressible_pages: self.stored_incompressible.load(Relaxed),
            zswap_kb: pool_total_size / 1024,
            zswapped_kb: stored_pages * self.page_size as u64 / 1024,
            zswpout: e(Event::Zswpout),
            zswpin: e(Event::Zswpin),
            zswpwb: e(Event::WrittenBack),
            swpout_zero: e(Event::SwpoutZero),
            swpin_zero: e(Event::SwpinZero),
            swpout_device: e(Event::SwpoutDevice),
            swpin_device: e(Event::SwpinDevice),
            pages_compacted: self.pool.pages_compacted(),
            zero_pages: self.zero_pages.load(Relaxed),
            metadata_bytes: self.tree.bytes() + lru_bytes,
            pool_reached_full: self.reached_full.load(Relaxed),
        }
    }
}
