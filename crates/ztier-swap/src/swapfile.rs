//! A swap device: the cluster slot allocator of `mm/swapfile.c` over a block device.
//!
//! Two modes share everything but their locking:
//! - [`Mode::Cluster`], the allocator after the 2024 rework: each thread (the kernel's CPU)
//!   keeps a current cluster per order and allocates from it under that cluster's lock
//!   alone; a thread needing a new cluster isolates one from a list (device lock held only
//!   to take it off), scans it without the device lock, and relocates it (device lock only
//!   to put it on its new list). Frees take the cluster's lock, batched per cluster, and
//!   the device lock only when the cluster changes lists. A rotational device allocates
//!   from one global cluster per order under its own lock instead, so writes stay
//!   sequential.
//! - [`Mode::Legacy`], the allocator before it: every allocation and free under the device
//!   lock, with a per-thread cache of 64 slots in front of each (`mm/swap_slots.c`, see
//!   `swapfile/swap_slots.rs`).
//!
//! A device is made over a block device it formats ([`Device::new`]), or reopened over an
//! area one formatted ([`Device::reopen`], as `swapon` finds an area `mkswap` made), with
//! the runs its owner says are in use: the owner keeps what it stored where, this
//! allocator only which slots are taken.
//!
//! As in the kernel, an allocation can fail while a free slot exists elsewhere: isolation
//! never waits for a cluster's lock, so a cluster another thread holds at that moment is
//! passed by (the caller falls back, as the kernel's swap-out does).
//!
//! Invariants: those of [`crate::cluster`]; `usage` counts the slots whose byte is between 1
//! and [`SWAP_MAP_MAX`] or `SWAP_MAP_FREEING` (allocated, not yet freed); a slot is handed
//! out by at most one allocation until it is freed; each cluster's published offer (its
//! holes on the full list, its free runs on a frag list) is what its state says whenever
//! its lock is free, and `frag_runs` is the sum of the published runs. The published words
//! are read without the cluster's lock, as hints only: whoever acts on one takes the lock
//! and looks again.
//!
//! The device and its shared state are here; its jobs are child modules: `alloc` (current
//! clusters, isolation, the list policy, the slow path), `free` (frees, batches, `dup`, I/O
//! checks), `discard` (the discard worker), `header` (the swap header, its id and the owner's stamp) and
//! `stats` (statistics and `check_consistency`).
//!
//! Lock order (outer first), cluster mode: the thread's current-cluster shard, the global
//! cluster lock (rotational), a cluster lock, the device lock, the available-list lock. A
//! cluster lock is taken inside the device lock only by `try_lock` (isolation). Legacy mode:
//! the thread's slot cache, its current-cluster shard, the device lock, a cluster lock, the
//! available-list lock. A device is in one mode for life, so the two orders never meet.
//! The stamp's lock (`Inner::stamp`) is taken alone, never with another of these: held by
//! [`Device::set_stamp`] across the header's write and flush (a round trip to a remote
//! store), so stamps land in order; [`Device::stamp`] waits for a write in progress.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Serialize;
use ztier_base::shard::{shard_index, Counters, Shards};
use ztier_blockdev::{BlockDevice, BlockError};

use crate::avail::{Avail, Usage};
use crate::cluster::{
    Cluster, ClusterTable, Flag, ListCounts, Lists, CHUNK_CLUSTERS, NR_ORDERS, PMD_ORDER,
    SWAPFILE_CLUSTER, SWAP_MAP_BAD, SWAP_MAP_FREEING, SWAP_MAP_MAX,
};
use crate::lockstat::{CountedMutex, LockReport, LockStats};
use crate::sync::{AtomicU64, MutexGuard, Ordering};
use crate::{Inconsistency, NotTheArea, SwapError};
use swap_slots::SlotCache;

mod alloc;
mod discard;
mod free;
mod header;
mod stats;
mod swap_slots;

use alloc::run_is_free;
use alloc::runs_worth_a_trip;
pub use alloc::Published;
use header::swap_header;
pub use stats::{DeviceStats, OrderStats};
pub use swap_slots::SWAP_SLOTS_CACHE_SIZE;
use ztier_base::os::random_uuid;

/// Bytes in a slot: a page.
pub const SLOT_BYTES: u64 = 4096;

const CLUSTER: u32 = SWAPFILE_CLUSTER;

/// Free slots that make a cluster worth a trip off the full list, and an order-0 cluster
/// worth the nonfull list (ztier's list policy): an allocator that isolates it gets at least
/// this many for the device-lock acquisitions the moves cost.
const ORDER0_ROOM: u32 = SWAPFILE_CLUSTER / 4;

/// Free slots that take a full cluster off the full list, and free slots in aligned runs
/// that put a larger order's cluster on the nonfull list (ztier's list policy): the
/// device-lock acquisitions of its next round are then shared by at least this many slots.
const FULL_ROOM: u32 = SWAPFILE_CLUSTER / 2;

/// How a device allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Per-thread clusters and per-cluster locks; the device lock only to move clusters
    /// between lists (the kernel since 6.14).
    Cluster,
    /// Every allocation and free under the device lock, behind a per-thread cache of 64
    /// slots (the kernel before the rework).
    Legacy,
}

/// Where a free sends a cluster that still has slots in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListPolicy {
    /// The kernel's `partial_free_cluster()`: to nonfull, from wherever it was. A free into
    /// the cluster a thread is allocating from (on the frag list) moves it to nonfull, and
    /// the thread's next allocation moves it back: two device-lock acquisitions per such
    /// free; and every failed large allocation isolates, rescans and demotes every nonfull
    /// cluster of its order that random frees promoted again.
    Kernel,
    /// ztier's: every list move buys many slots.
    /// - Nonfull holds only clusters with room for their order: free aligned runs of it
    ///   holding half the cluster, or for order 0 a quarter of the cluster free. A frag
    ///   cluster is promoted once, as a free gives it that room, so frees into the cluster
    ///   a thread is filling never move it.
    /// - A full cluster stays on the full list until half of it is free (or a larger
    ///   order's runs are worth a trip). Order 0's last resort fills its holes in place,
    ///   walking the clusters' published holes with no device lock and no list move, so a
    ///   hole costs neither its free nor its refill a trip.
    /// - A larger allocation passes by frag clusters with no free run of its order (each
    ///   cluster publishes its runs), and skips the frag list when none has one.
    /// - An isolated cluster goes straight onto the frag list it would be relocated to.
    /// - A thread whose cursor reaches the end of its cluster (or finds nothing past it)
    ///   starts over from the cluster's start while frees behind the cursor left it that
    ///   room, instead of stranding it half empty on the frag list.
    ///
    /// Measured with `ztier swap-alloc-bench --list-policy`.
    Ztier,
}

/// A device's settings (`swapon`'s flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    /// Where frees send clusters (both modes alike).
    pub policy: ListPolicy,
    /// A spinning disk: one cluster per order for the whole device, so writes stay
    /// sequential (the kernel's `!SWP_SOLIDSTATE`).
    pub rotational: bool,
    /// Discard freed clusters on the backing device (punch holes), in the background
    /// (`swapon --discard=pages`).
    pub discard: bool,
    /// Priority among several devices; higher first.
    pub priority: i16,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mode: Mode::Cluster,
            policy: ListPolicy::Ztier,
            rotational: false,
            discard: false,
            priority: -1,
        }
    }
}

ztier_base::counters! {
    /// A device's counters (its [`DeviceStats`]).
    pub(crate) enum Count {
        /// Allocations of `2^order` slots, by order.
        Allocated[NR_ORDERS],
        /// Frees of `2^order` slots, by order (single slots: order 0).
        Freed[NR_ORDERS],
        /// Allocations that found no room, by order.
        Fallback[NR_ORDERS],
        /// Clusters discarded.
        Discarded,
        /// Discards that failed.
        DiscardErrors,
    }
}

/// The per-thread current cluster: the slot to try next for each order (0: none; slot 0 is
/// the header and never free, the kernel's `SWAP_ENTRY_INVALID`).
#[derive(Debug, Default)]
pub(crate) struct PerCpu(pub [u32; NR_ORDERS]);

/// Whether the caller holds the device lock (the legacy mode holds it across a whole
/// allocation or free batch; the cluster mode takes it only to move a cluster).
pub(crate) type Held<'a> = Option<MutexGuard<'a, Lists>>;

/// A swap device.
pub struct Device {
    inner: Arc<Inner>,
    discard_worker: Option<JoinHandle<()>>,
}

pub(crate) struct Inner {
    pub(crate) id: u8,
    pub(crate) config: Config,
    /// The area's random id, in its header as `mkswap` writes one (`sws_uuid`).
    uuid: [u8; 16],
    /// The owner's stamp, in the header's padding (see [`Device::set_stamp`]); the lock is
    /// held across the header's write, so stamps land in the order they are set.
    stamp: std::sync::Mutex<[u8; 16]>,
    /// Slots on the backing device, header and all.
    pub(crate) slots: u64,
    /// Each cluster's state under its lock, and what it offers, kept under its lock and read
    /// without it ([`Published`]): order 0's last resort walks the holes of full clusters to
    /// fill them in place, without a list move; a larger allocation looks at the frag list
    /// only if it has free runs. Made a chunk at a time as the clusters are first used.
    pub(crate) clusters: ClusterTable,
    /// The device lock (`si->lock`) and what it guards: the cluster lists.
    pub(crate) lists: CountedMutex<Lists>,
    /// Which lists have clusters ([`Lists::nonempty_mask`]), published whenever the device
    /// lock is let go, so isolation passes an empty list by without taking the lock (the
    /// kernel takes it to find the list empty; what that cost is in docs/diary.md).
    nonempty: AtomicU64,
    pub(crate) percpu: Shards<PerCpu>,
    /// The rotational device's clusters (`si->global_cluster` under `global_cluster_lock`).
    pub(crate) global: CountedMutex<PerCpu>,
    pub(crate) usage: Usage,
    /// Free aligned runs of each order in the clusters on that order's frag list.
    frag_runs: [AtomicU64; NR_ORDERS],
    /// Where the next walk for holes starts, so successive walks spread over the device.
    hole_cursor: AtomicU64,
    pub(crate) caches: Shards<SlotCache>,
    pub(crate) backing: Arc<dyn BlockDevice>,
    pub(crate) counters: Counters<{ Count::COUNT }>,
    pub(crate) device_lock: LockStats,
    pub(crate) cluster_lock: LockStats,
    pub(crate) global_lock: LockStats,
    discard: DiscardQueue,
}

/// Wakes the discard worker; tells it to stop.
#[derive(Default)]
struct DiscardQueue {
    state: std::sync::Mutex<(bool, bool)>, // (work pending, stop)
    wake: std::sync::Condvar,
    /// Held by whoever is discarding (the worker, or a caller of `discard_now`), so that
    /// one pass finishes its clusters before another looks: when `discard_now` returns,
    /// no cluster is between the discard list and the free list.
    serial: std::sync::Mutex<()>,
}

impl DiscardQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, (bool, bool)> {
        // Two flags: a panic cannot leave them half-set.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kick(&self) {
        self.lock().0 = true;
        self.wake.notify_one();
    }
}

impl Device {
    /// A swap device over `backing`, a slot per 4 KiB page of it, formatted as Linux's
    /// `mkswap` does (a version-1 header in slot 0, which is never handed out), alone on its
    /// own available list.
    pub fn new(backing: Arc<dyn BlockDevice>, config: Config) -> Result<Device, SwapError> {
        Device::attach(backing, config, 0, Avail::new())
    }

    /// A swap device over `backing` as a [`Device::new`] left it, not formatted again: its
    /// header must be a Linux swap header of this size (its id and stamp are kept), and
    /// exactly the slots of `used` are in use, each `(first slot, order)` an aligned run of
    /// `2^order` slots, as [`alloc`](Self::alloc) handed them out (a count of one each).
    /// What its owner stored in them is the owner's to know; this allocator knows the runs.
    /// Refused, with the reason and nothing written, if the header is not one or does not
    /// fit, or a run is out of range, unaligned or overlaps another.
    ///
    /// A cluster whose runs are all of one order serves that order again; one with runs of
    /// several orders, or with the header slot, serves order 0 (which takes any free slot).
    pub fn reopen(
        backing: Arc<dyn BlockDevice>,
        config: Config,
        used: &[(u64, u32)],
    ) -> Result<Device, SwapError> {
        Device::attach_as(backing, config, 0, Avail::new(), Some(used))
    }

    /// The slots of a device over `backing_bytes`, or why there can be no such device: fewer
    /// than two (a header and one more), or more than a `u32` addresses.
    pub fn slots_for(backing_bytes: u64) -> Result<u64, SwapError> {
        let slots = backing_bytes / SLOT_BYTES;
        if slots < 2 {
            return Err(SwapError::TooFewSlots { backing_bytes });
        }
        if slots > u64::from(u32::MAX) {
            return Err(SwapError::TooManySlots { slots });
        }
        Ok(slots)
    }

    /// The memory a device over `backing_bytes` takes for its slot map (a byte a slot, in
    /// its clusters: the kernel's `swap_map` and `cluster_info`) at its peak: every cluster
    /// in use, so every cluster's map made (a map is made as its cluster first holds a slot
    /// and given back when it empties, [`Device::slot_map_resident_bytes`]), beside each
    /// cluster's state, lock, published count and list node (made a chunk at a time as the
    /// clusters are first used, kept until the device is dropped) and the chunks'
    /// directory. For a caller that keeps more beside it to weigh the two together.
    pub fn slot_map_bytes(backing_bytes: u64) -> u64 {
        let clusters = (backing_bytes / SLOT_BYTES).div_ceil(u64::from(CLUSTER));
        let per_cluster = ClusterTable::bytes_per_cluster() + SWAPFILE_CLUSTER as usize;
        clusters.saturating_mul(per_cluster as u64).saturating_add(
            clusters
                .div_ceil(u64::from(CHUNK_CLUSTERS))
                .saturating_mul(ClusterTable::directory_bytes_per_chunk() as u64),
        )
    }

    /// A swap device over a file of `size` bytes at `path` (created, or truncated to size).
    pub fn over_file(path: &Path, size: u64, config: Config) -> Result<Device, SwapError> {
        let file = ztier_blockdev::file::FileDevice::open(path, size)?;
        Device::new(Arc::new(file), config)
    }

    pub(crate) fn attach(
        backing: Arc<dyn BlockDevice>,
        config: Config,
        id: u8,
        avail: Arc<Avail>,
    ) -> Result<Device, SwapError> {
        Device::attach_as(backing, config, id, avail, None)
    }

    /// A new device over `backing` (formatted), or with `used`, one reopened over the area
    /// it holds ([`Device::reopen`]).
    fn attach_as(
        backing: Arc<dyn BlockDevice>,
        config: Config,
        id: u8,
        avail: Arc<Avail>,
        used: Option<&[(u64, u32)]>,
    ) -> Result<Device, SwapError> {
        let slots = Device::slots_for(backing.size())?;
        let nclusters = slots.div_ceil(u64::from(CLUSTER)) as u32;
        // A map that would not fit the machine's memory once in use is refused up front (a
        // large sparse file, or a remote export that says it is huge, would otherwise fill
        // memory as it is used).
        let map_bytes = Device::slot_map_bytes(backing.size());
        let memory_bytes = ztier_base::os::physical_memory_bytes();
        if map_bytes > memory_bytes {
            return Err(SwapError::SlotMapTooLarge {
                slots,
                map_bytes,
                memory_bytes,
            });
        }
        let no_room = || SwapError::ClustersAlloc {
            clusters: nclusters as usize,
        };
        let table = ClusterTable::new(nclusters).ok_or_else(no_room)?;
        let mut lists = Lists::new(nclusters).ok_or_else(no_room)?;
        // The clusters that hold something now: the header's, the one past the device's end
        // (slots never handed out), and a reopened area's runs'. The rest are free.
        let mut held: BTreeMap<u32, Cluster> = BTreeMap::new();
        let mut mark_bad = |slot: u64| {
            let c = held
                .entry((slot / u64::from(CLUSTER)) as u32)
                .or_insert_with(Cluster::new);
            c.map[(slot % u64::from(CLUSTER)) as usize] = SWAP_MAP_BAD;
            c.count += 1;
            c.free_runs -= 1;
        };
        mark_bad(0);
        for slot in slots..u64::from(nclusters) * u64::from(CLUSTER) {
            mark_bad(slot);
        }
        let (uuid, stamp, in_use) = match used {
            None => {
                let uuid = random_uuid();
                backing.write_at(0, &swap_header(slots, &uuid, &[0; 16]), false)?;
                (uuid, [0; 16], 0)
            }
            Some(runs) => {
                let mut page = vec![0u8; SLOT_BYTES as usize];
                backing.read_at(0, &mut page)?;
                let (uuid, stamp) = read_header(&page, slots).map_err(SwapError::NotTheArea)?;
                let in_use = mark_runs(&mut held, slots, runs)?;
                (uuid, stamp, in_use)
            }
        };
        for c in held.values_mut() {
            c.flag = match u32::from(c.count) {
                0 => Flag::Free,
                CLUSTER => Flag::Full,
                // Reopened runs: where an allocation leaves a cluster it moves on from.
                _ if c.map.iter().any(|&b| b != 0 && b != SWAP_MAP_BAD) => Flag::Frag,
                _ => Flag::Nonfull,
            };
        }
        // The free list as the kernel fills it at swapon, every free cluster in ascending
        // order, with the never-used ones from past the last held cluster (but the one past
        // the device's end) left unlinked: its frontier.
        let end = match slots % u64::from(CLUSTER) {
            0 => nclusters,
            _ => nclusters - 1,
        };
        let frontier = held
            .keys()
            .filter(|&&id| id < end)
            .max()
            .map_or(1, |&id| id + 1)
            .max(1);
        lists.set_frontier(frontier, end.max(frontier));
        let linked: Vec<(u32, Flag, u8)> = (0..frontier)
            .chain(held.keys().copied().filter(|&id| id >= frontier))
            .map(|id| {
                held.get(&id)
                    .map_or((id, Flag::Free, 0), |c| (id, c.flag, c.order))
            })
            .collect();
        for &(id, flag, order) in &linked {
            lists.make_with(&table, id, |i| held.remove(&i).unwrap_or_else(Cluster::new));
            match flag {
                Flag::Free => lists.push_before_frontier(id),
                _ => lists.push_back(flag, order, id),
            }
        }
        let inner = Arc::new(Inner {
            id,
            config,
            uuid,
            stamp: std::sync::Mutex::new(stamp),
            slots,
            clusters: table,
            nonempty: AtomicU64::new(lists.nonempty_mask()),
            lists: CountedMutex::new(lists),
            percpu: Shards::default(),
            global: CountedMutex::new(PerCpu::default()),
            usage: Usage::new(slots - 1, id, config.priority, avail),
            frag_runs: std::array::from_fn(|_| AtomicU64::new(0)),
            hole_cursor: AtomicU64::new(0),
            caches: Shards::default(),
            backing,
            counters: Counters::default(),
            device_lock: LockStats::new("si->lock (device)"),
            cluster_lock: LockStats::new("ci->lock (clusters)"),
            global_lock: LockStats::new("global_cluster_lock"),
            discard: DiscardQueue::default(),
        });
        inner.usage.add(in_use);
        inner.usage.swapon();
        for (id, c, _) in inner.clusters.made() {
            inner.publish(id, &c.lock(&inner.cluster_lock));
        }
        let discard_worker = if config.discard {
            let worker = Arc::clone(&inner);
            let spawned = std::thread::Builder::new()
                .name("ztier-swap-discard".into())
                .spawn(move || worker.discard_worker())
                .map_err(SwapError::DiscardThread)?;
            Some(spawned)
        } else {
            None
        };
        Ok(Device {
            inner,
            discard_worker,
        })
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    /// Allocates `2^order` contiguous slots aligned to their size, each with a count of
    /// one; returns the first.
    pub fn alloc(&self, order: u32) -> Result<u64, SwapError> {
        self.inner.alloc_on(shard_index(), order)
    }

    /// As [`alloc`](Self::alloc), as the thread of CPU `cpu` (a model checker's threads
    /// name theirs).
    pub fn alloc_on(&self, cpu: usize, order: u32) -> Result<u64, SwapError> {
        self.inner.alloc_on(cpu, order)
    }

    /// Drops one reference to a slot; the last one frees it.
    pub fn free(&self, offset: u64) -> Result<(), SwapError> {
        self.inner.free_on(shard_index(), offset)
    }

    /// Drops one reference to each of `nr` slots from `offset`, all in one cluster (an
    /// order-n allocation).
    pub fn free_range(&self, offset: u64, nr: u64) -> Result<(), SwapError> {
        self.inner.free_range(offset, nr)
    }

    /// Drops one reference to each slot in `offsets` (sorted in place), taking each
    /// cluster's lock once. Every valid slot is freed; the first invalid one is the error.
    pub fn free_batch(&self, offsets: &mut [u64]) -> Result<(), SwapError> {
        self.inner.free_batch(offsets)
    }

    /// Adds a reference to an allocated slot (a second page table mapping it).
    pub fn dup(&self, offset: u64) -> Result<(), SwapError> {
        self.inner.dup(offset)
    }

    /// A slot's count of references (0: free).
    pub fn usage(&self, offset: u64) -> Result<u8, SwapError> {
        self.inner.usage_of(offset)
    }

    /// Writes a page to an allocated slot.
    pub fn write_slot(&self, offset: u64, page: &[u8]) -> Result<(), SwapError> {
        self.inner.check_io(offset, page.len())?;
        Ok(self
            .inner
            .backing
            .write_at(offset * SLOT_BYTES, page, false)?)
    }

    /// Reads an allocated slot's page.
    pub fn read_slot(&self, offset: u64, page: &mut [u8]) -> Result<(), SwapError> {
        self.inner.check_io(offset, page.len())?;
        Ok(self.inner.backing.read_at(offset * SLOT_BYTES, page)?)
    }

    /// Writes `data` (at most a cluster's slots' worth) from the start of slot `offset` on,
    /// in one I/O; every slot it covers must be allocated.
    pub fn write_slots(&self, offset: u64, data: &[u8]) -> Result<(), SwapError> {
        self.inner.check_run(offset, 0, data.len())?;
        Ok(self
            .inner
            .backing
            .write_at(offset * SLOT_BYTES, data, false)?)
    }

    /// Reads `out.len()` bytes from byte `at` of slot `offset` on; every slot it covers must
    /// be allocated.
    pub fn read_bytes(&self, offset: u64, at: usize, out: &mut [u8]) -> Result<(), SwapError> {
        self.inner.check_run(offset, at, out.len())?;
        Ok(self
            .inner
            .backing
            .read_at(offset * SLOT_BYTES + at as u64, out)?)
    }

    /// The area's id, as its header holds it (`sws_uuid`).
    pub fn uuid(&self) -> [u8; 16] {
        self.inner.uuid
    }

    /// The owner's stamp in the header (zeros until one is set).
    pub fn stamp(&self) -> [u8; 16] {
        *self.inner.stamp.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes `stamp` into the header, in words of its padding that Linux ignores: 16
    /// bytes the owner keeps with the area and finds again at [`Device::reopen`] (zram
    /// marks the area as a saved state left it, and clears the mark before it changes it).
    /// Written before this returns; on an error the header may hold either stamp.
    pub fn set_stamp(&self, stamp: [u8; 16]) -> Result<(), SwapError> {
        let mut held = self.inner.stamp.lock().unwrap_or_else(|p| p.into_inner());
        let header = swap_header(self.inner.slots, &self.inner.uuid, &stamp);
        self.inner.backing.write_at(0, &header, false)?;
        self.inner.backing.flush()?;
        *held = stamp;
        Ok(())
    }

    /// Reads several runs at once, each `(first slot, byte in it, buffer)` as
    /// [`read_bytes`](Self::read_bytes) takes them: every slot each covers is allocated,
    /// and the reads go to the backing device together ([`BlockDevice::read_many`]).
    pub fn read_runs(&self, reads: &mut [(u64, usize, &mut [u8])]) -> Result<(), SwapError> {
        let mut ranges = Vec::with_capacity(reads.len());
        for (offset, at, out) in reads.iter_mut() {
            self.inner.check_run(*offset, *at, out.len())?;
            ranges.push((*offset * SLOT_BYTES + *at as u64, &mut **out));
        }
        Ok(self.inner.backing.read_many(&mut ranges)?)
    }

    /// Writes several runs at once, each `(first slot, data)` as
    /// [`write_slots`](Self::write_slots) takes them, together
    /// ([`BlockDevice::write_many`]). On an error, any of them may have been written.
    pub fn write_runs(&self, writes: &[(u64, &[u8])]) -> Result<(), SwapError> {
        let mut ranges = Vec::with_capacity(writes.len());
        for &(offset, data) in writes {
            self.inner.check_run(offset, 0, data.len())?;
            ranges.push((offset * SLOT_BYTES, data));
        }
        Ok(self.inner.backing.write_many(&ranges)?)
    }

    /// Slots, header included.
    pub fn slots(&self) -> u64 {
        self.inner.slots
    }

    /// Slots that can be allocated (all but the header).
    pub fn usable_slots(&self) -> u64 {
        self.inner.slots - 1
    }

    /// Slots allocated and not freed (including those in legacy per-thread caches).
    pub fn in_use(&self) -> u64 {
        self.inner.usage.in_use()
    }

    /// Whether the device is off the available list (full).
    pub fn off_list(&self) -> bool {
        self.inner.usage.off_list()
    }

    pub fn config(&self) -> Config {
        self.inner.config
    }

    /// Legacy mode: returns every thread's cached slots (allocated ahead, or freed and not
    /// yet flushed) to the device, as the kernel drains its slot caches. Nothing in cluster
    /// mode.
    pub fn drain_slot_caches(&self) {
        self.inner.drain_slot_caches();
    }

    /// Discards the clusters waiting for it now, on this thread, after any pass the discard
    /// thread is in; true if there were any.
    pub fn discard_now(&self) -> bool {
        self.inner.do_discard(&mut None)
    }

    /// The counters, list lengths, fragmentation and lock statistics.
    pub fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }

    /// The memory the slot map holds now: the chunks' directory, the state, lock, published
    /// count and list node of every cluster of a chunk made (the clusters used since the
    /// device was made, and their chunks' neighbours), and the maps of the clusters holding
    /// slots (each made cluster locked in turn).
    pub fn slot_map_resident_bytes(&self) -> u64 {
        let inner = &self.inner;
        let maps = inner
            .clusters
            .made()
            .filter(|(_, c, _)| c.lock(&inner.cluster_lock).map.is_made())
            .count() as u64;
        inner.clusters.resident_bytes() + maps * u64::from(SWAPFILE_CLUSTER)
    }

    /// Checks every invariant of the clusters and lists; exact when no other operation
    /// runs (a consistency check, the allocator's fsck). The first that does not hold is
    /// the error.
    pub fn check_consistency(&self) -> Result<(), Inconsistency> {
        self.inner.check_consistency()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Some(worker) = self.discard_worker.take() {
            self.inner.discard.lock().1 = true;
            self.inner.discard.wake.notify_one();
            let _ = worker.join();
        }
    }
}

/// The id and stamp of a swap header read back, if it is one of a device of `slots` slots.
fn read_header(page: &[u8], slots: u64) -> Result<([u8; 16], [u8; 16]), NotTheArea> {
    let (uuid, stamp, last_page) = header::parse_header(page).ok_or(NotTheArea::NoSwapHeader)?;
    if u64::from(last_page) != slots - 1 {
        return Err(NotTheArea::OtherSize {
            area_slots: u64::from(last_page) + 1,
            slots,
        });
    }
    Ok((uuid, stamp))
}

/// Marks each run of `used` allocated (a count of one) in a new device's clusters that hold
/// something (`held`, made as runs land in them); the slots in use. Every run is checked
/// before any slot is marked as a whole: in range, aligned to its size, overlapping nothing
/// marked.
fn mark_runs(
    held: &mut BTreeMap<u32, Cluster>,
    slots: u64,
    used: &[(u64, u32)],
) -> Result<u64, SwapError> {
    let per = u64::from(CLUSTER);
    // A cluster's order: that of its runs, if one; 0 if several or if it holds bad slots.
    let mut order: BTreeMap<u32, Option<u8>> = BTreeMap::new();
    let mut in_use = 0;
    for &(first, o) in used {
        if o as usize >= NR_ORDERS {
            return Err(SwapError::RunOrder { order: o });
        }
        let nr = 1u64 << o;
        if first == 0 || !first.is_multiple_of(nr) || first.saturating_add(nr) > slots {
            return Err(SwapError::RunOutside { first, nr, slots });
        }
        let id = (first / per) as u32;
        let c = held.entry(id).or_insert_with(Cluster::new);
        let at = (first % per) as usize;
        if !c.range_is_free(at, nr as usize) {
            return Err(SwapError::RunOverlaps { first, nr });
        }
        c.map[at..at + nr as usize].fill(1);
        c.count += nr as u16;
        in_use += nr;
        order
            .entry(id)
            .and_modify(|k| {
                if *k != Some(o as u8) {
                    *k = None;
                }
            })
            .or_insert(Some(o as u8));
    }
    for (id, o) in order {
        let c = held.get_mut(&id).expect("a run's cluster is held");
        let pure = !c.map.contains(&SWAP_MAP_BAD);
        c.order = if pure { o.unwrap_or(0) } else { 0 };
        c.free_runs = c.count_free_runs();
    }
    Ok(in_use)
}

impl From<BlockError> for SwapError {
    fn from(e: BlockError) -> SwapError {
        SwapError::Backing(e)
    }
}

#[cfg(loom)]
impl Device {
    /// Marks `slots` of cluster `id` allocated (count one) in one step, and relocates the
    /// cluster: a model check's setup, which would run out of loom's branches allocating
    /// them one by one.
    pub(crate) fn preallocate(&self, id: u32, slots: std::ops::Range<usize>) {
        let inner = &self.inner;
        inner
            .lists
            .lock(&inner.device_lock)
            .make(&inner.clusters, id);
        let mut c = inner.clusters.at(id).lock(&inner.cluster_lock);
        let n = slots.len();
        for i in slots {
            assert_eq!(c.map[i], 0);
            c.map[i] = 1;
        }
        c.count += n as u16;
        c.free_runs -= n as u16;
        inner.usage.add(n as u64);
        let (from, order) = (c.flag, c.order);
        let to = if u32::from(c.count) == CLUSTER {
            Flag::Full
        } else {
            Flag::Nonfull
        };
        if from != to {
            inner
                .lists
                .lock(&inner.device_lock)
                .move_to(&inner.clusters, id, from, to, order);
            c.flag = to;
        }
    }
}
