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
//!   `swap_slots.rs`).
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
//! Lock order (outer first), cluster mode: the thread's current-cluster shard, the global
//! cluster lock (rotational), a cluster lock, the device lock, the available-list lock. A
//! cluster lock is taken inside the device lock only by `try_lock` (isolation). Legacy mode:
//! the thread's slot cache, its current-cluster shard, the device lock, a cluster lock, the
//! available-list lock. A device is in one mode for life, so the two orders never meet.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use serde::Serialize;
use ztier_base::shard::{shard_index, Counters, Shards};
use ztier_blockdev::{BlockDevice, BlockError};

use crate::avail::{Avail, Usage};
use crate::cluster::{
    Cluster, Flag, ListCounts, Lists, NR_ORDERS, PMD_ORDER, SWAPFILE_CLUSTER, SWAP_MAP_BAD,
    SWAP_MAP_FREEING, SWAP_MAP_MAX,
};
use crate::lockstat::{CountedMutex, LockReport, LockStats};
use crate::swap_slots::SlotCache;
use crate::sync::{AtomicU64, MutexGuard, Ordering};
use crate::SwapError;

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

// Counter indices.
const ALLOCATED: usize = 0;
const FREED: usize = NR_ORDERS;
/// Order-0 frees, for the legacy flush.
pub(crate) const FREED_ORDER0: usize = FREED;
const FALLBACK: usize = 2 * NR_ORDERS;
const DISCARDED: usize = 3 * NR_ORDERS;
const DISCARD_ERRORS: usize = 3 * NR_ORDERS + 1;
const COUNTERS: usize = 3 * NR_ORDERS + 2;

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
    /// Slots on the backing device, header and all.
    pub(crate) slots: u64,
    pub(crate) clusters: Box<[CountedMutex<Cluster>]>,
    /// The device lock (`si->lock`) and what it guards: the cluster lists.
    pub(crate) lists: CountedMutex<Lists>,
    /// Which lists have clusters ([`Lists::nonempty_mask`]), published whenever the device
    /// lock is let go, so isolation passes an empty list by without taking the lock (the
    /// kernel takes it to find the list empty: 18 times in one failed order-0 steal).
    nonempty: AtomicU64,
    pub(crate) percpu: Shards<PerCpu>,
    /// The rotational device's clusters (`si->global_cluster` under `global_cluster_lock`).
    pub(crate) global: CountedMutex<PerCpu>,
    pub(crate) usage: Usage,
    /// Per cluster, what it offers, kept under its lock and read without it ([`Published`]):
    /// order 0's last resort walks the holes of full clusters to fill them in place, without
    /// a list move; a larger allocation looks at the frag list only if it has free runs.
    published: Box<[AtomicU64]>,
    /// Free aligned runs of each order in the clusters on that order's frag list.
    frag_runs: [AtomicU64; NR_ORDERS],
    /// Where the next walk for holes starts, so successive walks spread over the device.
    hole_cursor: AtomicU64,
    pub(crate) caches: Shards<SlotCache>,
    pub(crate) backing: Arc<dyn BlockDevice>,
    pub(crate) counters: Counters<COUNTERS>,
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
        let slots = backing.size() / SLOT_BYTES;
        if slots < 2 {
            return Err(SwapError::Invalid(format!(
                "a swap device needs at least two {SLOT_BYTES}-byte slots (a header and one \
                 more); the backing device has {} bytes",
                backing.size()
            )));
        }
        if slots > u64::from(u32::MAX) {
            return Err(SwapError::Invalid(format!(
                "{slots} slots; at most {} are addressed",
                u32::MAX
            )));
        }
        let nclusters = slots.div_ceil(u64::from(CLUSTER)) as usize;
        let mut clusters: Vec<Cluster> = Vec::new();
        clusters
            .try_reserve_exact(nclusters)
            .map_err(|_| SwapError::Invalid(format!("no memory for {nclusters} clusters")))?;
        clusters.resize_with(nclusters, Cluster::new);
        // The header slot and the slots past the end are never handed out.
        let mark_bad = |c: &mut Cluster, i: usize| {
            c.map[i] = SWAP_MAP_BAD;
            c.count += 1;
            c.free_runs -= 1;
        };
        mark_bad(&mut clusters[0], 0);
        for slot in slots..nclusters as u64 * u64::from(CLUSTER) {
            let c = &mut clusters[(slot / u64::from(CLUSTER)) as usize];
            mark_bad(c, (slot % u64::from(CLUSTER)) as usize);
        }
        let mut lists = Lists::new(nclusters);
        for (id, c) in clusters.iter_mut().enumerate() {
            c.flag = match u32::from(c.count) {
                0 => Flag::Free,
                CLUSTER => Flag::Full,
                _ => Flag::Nonfull,
            };
            lists.move_to(id as u32, Flag::None, c.flag, 0);
        }
        let uuid = random_uuid();
        backing.write_at(0, &swap_header(slots, &uuid), false)?;
        let inner = Arc::new(Inner {
            id,
            config,
            uuid,
            slots,
            clusters: clusters.into_iter().map(CountedMutex::new).collect(),
            nonempty: AtomicU64::new(lists.nonempty_mask()),
            lists: CountedMutex::new(lists),
            percpu: Shards::default(),
            global: CountedMutex::new(PerCpu::default()),
            usage: Usage::new(slots - 1, id, config.priority, avail),
            published: (0..nclusters).map(|_| AtomicU64::new(0)).collect(),
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
        inner.usage.swapon();
        let discard_worker = if config.discard {
            let worker = Arc::clone(&inner);
            let spawned = std::thread::Builder::new()
                .name("ztier-swap-discard".into())
                .spawn(move || worker.discard_worker())
                .map_err(|e| SwapError::Invalid(format!("starting the discard thread: {e}")))?;
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

    /// Checks every invariant of the clusters and lists; exact when no other operation
    /// runs (a consistency check, the allocator's fsck).
    pub fn verify(&self) -> Result<(), String> {
        self.inner.verify()
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

/// Whether slot `i`'s aligned run of the cluster's order is all free.
pub(crate) fn run_is_free(c: &Cluster, i: usize) -> bool {
    let nr = 1usize << c.order;
    c.range_is_free(i & !(nr - 1), nr)
}

/// Whether a cluster of order > 0 has free aligned runs of its order holding half of it (one
/// run for an order that fits fewer than two in a cluster): worth the nonfull list, so that
/// an allocator isolating it gets many runs for the two device-lock acquisitions of the trip.
fn runs_worth_a_trip(c: &Cluster) -> bool {
    u32::from(c.free_runs) >= (FULL_ROOM >> c.order).max(1)
}

/// Puts an isolated cluster (off every list, its lock held) on the tail of the frag list of
/// its order, where relocation would put it: ztier's list policy does it in the isolating
/// device-lock hold.
fn put_on_frag(l: &mut Lists, c: &mut Cluster, id: u32) {
    let (frag, nodes) = l.list(Flag::Frag, c.order);
    frag.push_back(nodes, id);
    c.flag = Flag::Frag;
}

/// What a cluster offers to allocators that do not hold its lock, packed in one word: its
/// free slots while it is on the full list under ztier's list policy (order 0 fills them
/// in place), and its free runs while it is on the frag list of its order (> 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Published {
    holes: u32,
    frag_runs: u32,
    order: u8,
}

impl Published {
    fn pack(self) -> u64 {
        u64::from(self.holes) | u64::from(self.frag_runs) << 16 | u64::from(self.order) << 32
    }

    fn unpack(word: u64) -> Published {
        Published {
            holes: (word & 0xffff) as u32,
            frag_runs: (word >> 16 & 0xffff) as u32,
            order: (word >> 32) as u8,
        }
    }
}

/// The first page of a Linux swap area (`union swap_header`, version 1): the signature in
/// its last 10 bytes, the last page's index, no bad pages, and the area's id. The id is what
/// tells this area from another of the same size: zram's backing store pins the header as
/// its remote store's identity, so a store that restarted empty or a different export is
/// never read as this one.
fn swap_header(slots: u64, uuid: &[u8; 16]) -> Vec<u8> {
    let mut page = vec![0u8; SLOT_BYTES as usize];
    page[1024..1028].copy_from_slice(&1u32.to_ne_bytes()); // version
    page[1028..1032].copy_from_slice(&((slots - 1) as u32).to_ne_bytes()); // last_page
    page[1036..1052].copy_from_slice(uuid); // sws_uuid
    page[4086..4096].copy_from_slice(b"SWAPSPACE2");
    page
}

/// A random (version 4) UUID, as `mkswap` gives each area: from the kernel's random pool,
/// or, if `/dev/urandom` cannot be read, from the clock, the process and a hasher's random
/// keys, which still differ between any two areas made here.
fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut id = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, half) in id.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(now);
            h.write_u32(std::process::id());
            h.write_usize(i);
            half.copy_from_slice(&h.finish().to_ne_bytes());
        }
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

impl Inner {
    fn with_lists<R>(&self, held: &mut Held<'_>, f: impl FnOnce(&mut Lists) -> R) -> R {
        let publish = |l: &mut Lists| {
            self.nonempty.store(l.nonempty_mask(), Ordering::Release);
        };
        match held {
            Some(guard) => {
                let r = f(guard);
                publish(guard);
                r
            }
            None => {
                let mut guard = self.lists.lock(&self.device_lock);
                let r = f(&mut guard);
                publish(&mut guard);
                r
            }
        }
    }

    /// `move_cluster()`: puts a cluster whose lock the caller holds on the tail of list `to`.
    fn move_cluster(&self, c: &mut Cluster, id: u32, to: Flag, held: &mut Held<'_>) {
        let (from, order) = (c.flag, c.order);
        self.with_lists(held, |l| l.move_to(id, from, to, order));
        c.flag = to;
        self.publish(id, c);
    }

    /// What a locked cluster offers, as it should be published.
    fn offer(&self, c: &Cluster) -> Published {
        let ztier = self.config.policy == ListPolicy::Ztier;
        Published {
            holes: match c.flag {
                Flag::Full if ztier => CLUSTER - u32::from(c.count),
                _ => 0,
            },
            frag_runs: match c.flag {
                Flag::Frag if c.order > 0 => u32::from(c.free_runs),
                _ => 0,
            },
            order: c.order,
        }
    }

    /// Publishes what a locked cluster offers, after any change to its slots or its list.
    /// Only the holder of the cluster's lock writes its word, so a plain load and store
    /// suffice, and an allocation that changes nothing published (the common one) writes
    /// nothing.
    fn publish(&self, id: u32, c: &Cluster) {
        let new = self.offer(c);
        let word = &self.published[id as usize];
        let old = Published::unpack(word.load(Ordering::Relaxed));
        if old == new {
            return;
        }
        word.store(new.pack(), Ordering::Relaxed);
        if old.frag_runs != new.frag_runs || old.order != new.order {
            // Each cluster's share is changed under its lock, so the sums never go below 0.
            self.frag_runs[usize::from(old.order)]
                .fetch_sub(u64::from(old.frag_runs), Ordering::Relaxed);
            self.frag_runs[usize::from(new.order)]
                .fetch_add(u64::from(new.frag_runs), Ordering::Relaxed);
        }
    }

    /// Whether order-`order` allocations may be made in a locked cluster: one on a usable
    /// list, or for order 0 under ztier's list policy, the holes of one on the full list.
    fn usable(&self, c: &Cluster, order: u32) -> bool {
        c.usable_for(order)
            || (order == 0
                && c.flag == Flag::Full
                && self.config.policy == ListPolicy::Ztier
                && u32::from(c.count) < CLUSTER)
    }

    /// An empty cluster goes to be discarded, or to the free list.
    fn free_cluster(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        if self.config.discard {
            self.move_cluster(c, id, Flag::Discard, held);
            self.discard.kick();
        } else {
            self.free_cluster_now(c, id, held);
        }
    }

    fn free_cluster_now(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        self.move_cluster(c, id, Flag::Free, held);
        c.take_order(0);
        self.publish(id, c);
    }

    /// `relocate_cluster()`: after an allocation, to the frag, full or free list.
    fn relocate(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        if c.flag == Flag::Discard {
            return;
        }
        if c.count == 0 {
            if c.flag != Flag::Free {
                self.free_cluster(c, id, held);
            }
        } else if u32::from(c.count) < CLUSTER {
            // Under ztier's list policy a full cluster's holes are filled in place.
            let in_place = c.flag == Flag::Full && self.config.policy == ListPolicy::Ztier;
            if c.flag != Flag::Frag && !in_place {
                self.move_cluster(c, id, Flag::Frag, held);
            }
        } else if c.flag != Flag::Full {
            self.move_cluster(c, id, Flag::Full, held);
        }
    }

    /// `isolate_lock_cluster()`: the first cluster of a list whose lock is free, taken off
    /// the list and locked.
    ///
    /// Under ztier's list policy the cluster goes straight to the tail of the frag list of
    /// the order it will serve (`alloc_order` if it is empty), where relocation would put it
    /// after all but the allocation that fills it: one device-lock acquisition per new
    /// cluster instead of two. No one sees it there before its lock, held by the caller, is
    /// let go.
    fn isolate<'a>(
        &'a self,
        flag: Flag,
        order: u8,
        alloc_order: u32,
        held: &mut Held<'_>,
    ) -> Option<(u32, MutexGuard<'a, Cluster>)> {
        // A list that gains a cluster just after this look is passed by this time, as a
        // cluster whose lock is held is.
        if self.nonempty.load(Ordering::Acquire) & Lists::bit(flag, order) == 0 {
            return None;
        }
        self.with_lists(held, |l| {
            let (list, nodes) = l.list(flag, order);
            let mut at = list.first();
            while let Some(id) = at {
                // A larger allocation passes by fragmented clusters with no run for it.
                let hopeless = flag == Flag::Frag
                    && alloc_order > 0
                    && self.config.policy == ListPolicy::Ztier
                    && Published::unpack(self.published[id as usize].load(Ordering::Relaxed))
                        .frag_runs
                        == 0;
                if hopeless {
                    at = ztier_base::list::List::next(nodes, id);
                    continue;
                }
                if let Some(mut c) = self.clusters[id as usize].try_lock(&self.cluster_lock) {
                    list.remove(nodes, id);
                    c.flag = Flag::None;
                    if self.config.policy == ListPolicy::Ztier {
                        if c.count == 0 {
                            c.take_order(alloc_order);
                        }
                        put_on_frag(l, &mut c, id);
                    }
                    self.publish(id, &c);
                    return Some((id, c));
                }
                at = ztier_base::list::List::next(nodes, id);
            }
            None
        })
    }

    /// `alloc_swap_scan_cluster()`: the first free aligned run of `2^order` slots from
    /// `start` in the locked cluster `id`; relocates the cluster after. Returns the slot
    /// found and where to look next time (0: this cluster is done).
    fn scan_cluster(
        &self,
        mut c: MutexGuard<'_, Cluster>,
        id: u32,
        start: u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> (Option<u32>, u32) {
        let base = id * CLUSTER;
        let nr = 1u32 << order;
        let (mut found, mut next) = (None, 0);
        if u32::from(c.count) + nr <= CLUSTER {
            let mut from = start - base;
            loop {
                let mut off = from;
                while off + nr <= CLUSTER {
                    let (i, n) = (off as usize, nr as usize);
                    if c.range_is_free(i, n) {
                        if c.count == 0 {
                            c.take_order(order);
                        }
                        // The run of the cluster's order this allocation breaks (or takes).
                        if run_is_free(&c, i) {
                            c.free_runs -= 1;
                        }
                        c.map[i..i + n].fill(1);
                        c.count += nr as u16;
                        self.usage.add(u64::from(nr));
                        found = Some(base + off);
                        off += nr;
                        if u32::from(c.count) < CLUSTER && off + nr <= CLUSTER {
                            next = base + off;
                        } else if self.worth_another_pass(&c) {
                            next = base;
                        }
                        break;
                    }
                    off += nr;
                }
                // Nothing from the cursor on (another thread filled it), but room behind it.
                if found.is_some() || from == 0 || !self.worth_another_pass(&c) {
                    break;
                }
                from = 0;
            }
        }
        self.relocate(&mut c, id, held);
        self.publish(id, &c);
        (found, next)
    }

    /// Whether a locked cluster whose cursor reached its end (or found nothing past the
    /// cursor) keeps its thread for another pass from its start (ztier's list policy): when it
    /// has the room its order needs on the nonfull list. Under ztier's rule a frag cluster
    /// reaches nonfull only as a free crosses that room; room made by frees behind the
    /// cursor while the cluster was a thread's is never announced, so without another pass
    /// the thread would leave a half-empty cluster on the frag list (where order 0 looks
    /// once, after the free list) and take a fresh one. With 64 threads churning small
    /// shares, that used up the free clusters at 43 % full (200 order-0 clusters on the
    /// frag list, most of them half empty), and order-4 allocations failed.
    fn worth_another_pass(&self, c: &Cluster) -> bool {
        self.config.policy == ListPolicy::Ztier
            && matches!(c.flag, Flag::Frag | Flag::Nonfull)
            && if c.order > 0 {
                runs_worth_a_trip(c)
            } else {
                CLUSTER - u32::from(c.count) >= ORDER0_ROOM
            }
    }

    /// The fast path: the thread's current cluster for `order`, if it is still usable.
    pub(crate) fn alloc_cached(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        let at = *next;
        if at == 0 {
            return None;
        }
        let id = at / CLUSTER;
        let c = self.clusters[id as usize].lock(&self.cluster_lock);
        if !self.usable(&c, order) {
            return None;
        }
        let start = if c.count == 0 { id * CLUSTER } else { at };
        let (found, n) = self.scan_cluster(c, id, start, order, held);
        *next = n;
        found
    }

    /// One list's clusters, isolated and scanned in turn: the first only, or until one
    /// yields.
    fn scan_list(
        &self,
        flag: Flag,
        list_order: usize,
        order: u32,
        all: bool,
        next: &mut u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        loop {
            let (id, c) = self.isolate(flag, list_order as u8, order, held)?;
            let (found, n) = self.scan_cluster(c, id, id * CLUSTER, order, held);
            *next = n;
            if found.is_some() || !all {
                return found;
            }
        }
    }

    /// `cluster_alloc_swap_entry()`'s search for a new cluster, in the kernel's order.
    pub(crate) fn alloc_new_cluster(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        let o = order as usize;
        let discard = self.config.discard;
        // A device that discards prefers fresh clusters, spreading writes out.
        if discard {
            if let found @ Some(_) = self.scan_list(Flag::Free, 0, order, false, next, held) {
                return found;
            }
        }
        if order < PMD_ORDER {
            if let found @ Some(_) = self.scan_list(Flag::Nonfull, o, order, true, next, held) {
                return found;
            }
        }
        if !discard {
            if let found @ Some(_) = self.scan_list(Flag::Free, 0, order, false, next, held) {
                return found;
            }
        }
        // One fragmented cluster is enough: order 0 will find room later in the steal, and a
        // large allocation may fail; it does not look when no cluster there has a free run.
        // (Under ztier's list policy; the kernel's scans one whatever it holds.)
        let frag_has_runs = order == 0
            || self.config.policy == ListPolicy::Kernel
            || self.frag_runs[o].load(Ordering::Relaxed) > 0;
        if order < PMD_ORDER && frag_has_runs {
            if let found @ Some(_) = self.scan_list(Flag::Frag, o, order, false, next, held) {
                return found;
            }
        }
        if order == 0 {
            // Order 0 steals from higher orders' clusters, fragmented ones first.
            for hi in 1..NR_ORDERS {
                if let found @ Some(_) = self.scan_list(Flag::Frag, hi, 0, true, next, held) {
                    return found;
                }
                if let found @ Some(_) = self.scan_list(Flag::Nonfull, hi, 0, true, next, held) {
                    return found;
                }
            }
            // Last, the holes full clusters keep under ztier's list policy.
            return self.fill_hole(next, held);
        }
        None
    }

    /// Order 0's last resort under ztier's list policy: a free slot in a cluster on the full
    /// list, taken in place (the cluster stays on the full list, so no list moves and no
    /// device lock), and the thread allocates from that cluster's holes next. The walk
    /// starts where the last one stopped and reads each cluster's published holes before
    /// taking its lock; a cluster whose lock is held is passed by, as isolation passes it.
    fn fill_hole(&self, next: &mut u32, held: &mut Held<'_>) -> Option<u32> {
        if self.config.policy != ListPolicy::Ztier
            || self.nonempty.load(Ordering::Acquire) & Lists::bit(Flag::Full, 0) == 0
        {
            return None;
        }
        let n = self.clusters.len();
        let start = self.hole_cursor.load(Ordering::Relaxed) as usize % n;
        for id in (start..n).chain(0..start) {
            if Published::unpack(self.published[id].load(Ordering::Relaxed)).holes == 0 {
                continue;
            }
            let Some(c) = self.clusters[id].try_lock(&self.cluster_lock) else {
                continue;
            };
            if !(c.flag == Flag::Full && self.usable(&c, 0)) {
                continue;
            }
            // The next walk starts past it: this thread fills it, another takes the next.
            self.hole_cursor.store(id as u64 + 1, Ordering::Relaxed);
            let id = id as u32;
            let (found, n) = self.scan_cluster(c, id, id * CLUSTER, 0, held);
            *next = n;
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The thread's cluster, then a new one; and when all else fails, clusters waiting to be
    /// discarded are discarded now (`swap_sync_discard()`) and the search runs once more.
    pub(crate) fn alloc_with_next(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        self.alloc_cached(next, order, held)
            .or_else(|| self.alloc_new_cluster_or_discard(next, order, held))
    }

    /// A new cluster; failing that, clusters waiting to be discarded are discarded now
    /// (`swap_sync_discard()`) and the search runs once more.
    fn alloc_new_cluster_or_discard(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        self.alloc_new_cluster(next, order, held).or_else(|| {
            (self.discard_for_room(held))
                .then(|| self.alloc_new_cluster(next, order, held))
                .flatten()
        })
    }

    /// Discards what waits for it, if the device discards: true if that freed clusters.
    pub(crate) fn discard_for_room(&self, held: &mut Held<'_>) -> bool {
        self.config.discard && self.do_discard(held)
    }

    pub(crate) fn check_order(order: u32) -> Result<(), SwapError> {
        if order as usize >= NR_ORDERS {
            return Err(SwapError::BadOrder(order));
        }
        Ok(())
    }

    /// The fast path alone (a multi-device caller tries it on the device it used last).
    pub(crate) fn alloc_fast(&self, cpu: usize, order: u32) -> Option<u32> {
        match self.config.mode {
            Mode::Legacy => self.legacy_alloc_cached(cpu, order),
            Mode::Cluster if self.config.rotational => None,
            Mode::Cluster => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_cached(&mut pc.0[order as usize], order, &mut None)
            }
        }
    }

    /// Everything but the fast path.
    pub(crate) fn alloc_slow(&self, cpu: usize, order: u32) -> Option<u32> {
        let o = order as usize;
        match self.config.mode {
            Mode::Legacy => self.legacy_alloc_refill(cpu, order),
            Mode::Cluster if self.config.rotational => {
                let mut global = self.global.lock(&self.global_lock);
                self.alloc_with_next(&mut global.0[o], order, &mut None)
            }
            Mode::Cluster => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_new_cluster_or_discard(&mut pc.0[o], order, &mut None)
            }
        }
    }

    pub(crate) fn count_alloc(&self, order: u32) {
        self.counters.add(ALLOCATED + order as usize, 1);
    }

    pub(crate) fn count_fallback(&self, order: u32) {
        self.counters.add(FALLBACK + order as usize, 1);
    }

    fn alloc_on(&self, cpu: usize, order: u32) -> Result<u64, SwapError> {
        Inner::check_order(order)?;
        let found = match (self.config.mode, self.config.rotational) {
            // One local lock across both paths, as the kernel holds its CPU.
            (Mode::Cluster, false) => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_with_next(&mut pc.0[order as usize], order, &mut None)
            }
            _ => self
                .alloc_fast(cpu, order)
                .or_else(|| self.alloc_slow(cpu, order)),
        };
        match found {
            Some(slot) => {
                self.count_alloc(order);
                Ok(u64::from(slot))
            }
            None => {
                self.count_fallback(order);
                Err(SwapError::Full { order })
            }
        }
    }

    /// The cluster and in-cluster index of a slot that may be handed out.
    pub(crate) fn locate(&self, offset: u64) -> Result<(u32, usize), SwapError> {
        if offset == 0 || offset >= self.slots {
            return Err(SwapError::OutOfRange {
                offset,
                slots: self.slots,
            });
        }
        Ok((
            (offset / u64::from(CLUSTER)) as u32,
            (offset % u64::from(CLUSTER)) as usize,
        ))
    }

    fn free_on(&self, cpu: usize, offset: u64) -> Result<(), SwapError> {
        match self.config.mode {
            Mode::Legacy => self.legacy_put(cpu, offset),
            Mode::Cluster => {
                let (id, i) = self.locate(offset)?;
                self.put_in_cluster(id, &[i], &mut None)?;
                self.counters.add(FREED, 1);
                Ok(())
            }
        }
    }

    fn free_range(&self, offset: u64, nr: u64) -> Result<(), SwapError> {
        let (id, i) = self.locate(offset)?;
        let end = offset.checked_add(nr).filter(|&e| e <= self.slots);
        if nr == 0 || end.is_none() || i as u64 + nr > u64::from(CLUSTER) {
            return Err(SwapError::Invalid(format!(
                "{nr} slots from {offset} do not lie in one cluster"
            )));
        }
        let idx: Vec<usize> = (i..i + nr as usize).collect();
        let mut held = match self.config.mode {
            Mode::Legacy => Some(self.lists.lock(&self.device_lock)),
            Mode::Cluster => None,
        };
        self.put_in_cluster(id, &idx, &mut held)?;
        let order = if nr.is_power_of_two() {
            nr.trailing_zeros() as usize
        } else {
            0
        };
        self.counters.add(FREED + order.min(NR_ORDERS - 1), 1);
        Ok(())
    }

    fn free_batch(&self, offsets: &mut [u64]) -> Result<(), SwapError> {
        offsets.sort_unstable();
        let mut held = match self.config.mode {
            Mode::Legacy => Some(self.lists.lock(&self.device_lock)),
            Mode::Cluster => None,
        };
        let mut first_error = None;
        let mut rest = &offsets[..];
        while let Some(&first) = rest.first() {
            let cluster = first / u64::from(CLUSTER);
            let n = rest
                .iter()
                .take_while(|&&o| o / u64::from(CLUSTER) == cluster)
                .count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let mut idx = Vec::with_capacity(group.len());
            for &o in group {
                match self.locate(o) {
                    Ok((_, i)) => idx.push(i),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if idx.is_empty() {
                continue;
            }
            match self.put_in_cluster(cluster as u32, &idx, &mut held) {
                Ok(()) => self.counters.add(FREED, idx.len() as u64),
                Err(e) => {
                    // One bad slot refuses its cluster's group whole; free the rest of it.
                    first_error.get_or_insert(e);
                    for &i in &idx {
                        if self.put_in_cluster(cluster as u32, &[i], &mut held).is_ok() {
                            self.counters.add(FREED, 1);
                        }
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops a reference to each slot `idx` of cluster `id`, given in ascending order (a
    /// slot may appear more than once), all or none: an unallocated slot refuses the whole
    /// call. Freed slots go back;
    /// the cluster moves to the free (or discard) or nonfull list.
    pub(crate) fn put_in_cluster(
        &self,
        id: u32,
        idx: &[usize],
        held: &mut Held<'_>,
    ) -> Result<(), SwapError> {
        let mut c = self.clusters[id as usize].lock(&self.cluster_lock);
        let offset = |i: usize| u64::from(id) * u64::from(CLUSTER) + i as u64;
        debug_assert!(idx.is_sorted(), "slots in ascending order");
        for run in idx.chunk_by(|a, b| a == b) {
            let b = c.map[run[0]];
            if b == 0 || b > SWAP_MAP_MAX || usize::from(b) < run.len() {
                return Err(SwapError::NotAllocated {
                    offset: offset(run[0]),
                });
            }
        }
        let (mut freed, mut runs) = (0u16, 0u16);
        for &i in idx {
            c.map[i] -= 1;
            if c.map[i] == 0 {
                freed += 1;
                runs += u16::from(run_is_free(&c, i));
            }
        }
        self.release_slots(&mut c, id, freed, runs, held);
        Ok(())
    }

    /// `freed` slots of a locked cluster just became free, completing `runs` free aligned runs
    /// of the cluster's order: count them, and move the cluster to the list its new state
    /// calls for under the device's [`ListPolicy`].
    pub(crate) fn release_slots(
        &self,
        c: &mut Cluster,
        id: u32,
        freed: u16,
        runs: u16,
        held: &mut Held<'_>,
    ) {
        if freed == 0 {
            return;
        }
        let completes_run = runs > 0;
        let free_before = CLUSTER - u32::from(c.count);
        c.count -= freed;
        c.free_runs += runs;
        self.usage.sub(u64::from(freed));
        if c.count == 0 {
            self.free_cluster(c, id, held);
            return;
        }
        // Thresholds are counted once, as the free slots cross them, so frees into a cluster
        // being filled never bounce it between lists.
        let crossed = |room: u32| free_before < room && free_before + u32::from(freed) >= room;
        // Room for the cluster's order: free aligned runs of it holding half the cluster, as a
        // free completes one (order > 0), or a quarter of the cluster free (order 0). With
        // less, the cluster waits on the frag list, where only order-0 allocation looks.
        let room = if c.order > 0 {
            completes_run && runs_worth_a_trip(c)
        } else {
            crossed(ORDER0_ROOM)
        };
        let to = match (self.config.policy, c.flag) {
            (ListPolicy::Kernel, Flag::Nonfull) => None,
            (ListPolicy::Kernel, _) => Some(Flag::Nonfull),
            // A full cluster keeps its place until half of it is free (or, for a larger
            // order, until its free runs are worth a trip): a free and the allocation that
            // fills the hole again would otherwise move it twice for one slot. Order 0 fills
            // its holes in place meanwhile (`fill_hole`), with no list move at all.
            (ListPolicy::Ztier, Flag::Full) if c.order > 0 && room => Some(Flag::Nonfull),
            (ListPolicy::Ztier, Flag::Full) => crossed(FULL_ROOM).then_some(if c.order == 0 {
                Flag::Nonfull
            } else {
                Flag::Frag
            }),
            (ListPolicy::Ztier, Flag::Frag) if room => Some(Flag::Nonfull),
            (ListPolicy::Ztier, _) => None,
        };
        if let Some(to) = to {
            self.move_cluster(c, id, to, held);
        } else {
            self.publish(id, c);
        }
    }

    fn dup(&self, offset: u64) -> Result<(), SwapError> {
        let (id, i) = self.locate(offset)?;
        let mut c = self.clusters[id as usize].lock(&self.cluster_lock);
        match c.map[i] {
            0 | SWAP_MAP_BAD | SWAP_MAP_FREEING => Err(SwapError::NotAllocated { offset }),
            SWAP_MAP_MAX => Err(SwapError::CountOverflow { offset }),
            _ => {
                c.map[i] += 1;
                Ok(())
            }
        }
    }

    fn usage_of(&self, offset: u64) -> Result<u8, SwapError> {
        let (id, i) = self.locate(offset)?;
        let c = self.clusters[id as usize].lock(&self.cluster_lock);
        Ok(match c.map[i] {
            SWAP_MAP_BAD | SWAP_MAP_FREEING => 0,
            n => n,
        })
    }

    /// Bytes `[at, at + len)` from the start of slot `offset`: within one cluster's worth of
    /// slots, each allocated.
    fn check_run(&self, offset: u64, at: usize, len: usize) -> Result<(), SwapError> {
        let end = at as u64 + len as u64;
        if len == 0 || end > u64::from(CLUSTER) * SLOT_BYTES {
            return Err(SwapError::Invalid(format!(
                "{len} bytes at byte {at} of a run: a run holds 1 to {} bytes",
                u64::from(CLUSTER) * SLOT_BYTES
            )));
        }
        for slot in offset + at as u64 / SLOT_BYTES..offset + end.div_ceil(SLOT_BYTES) {
            if self.usage_of(slot)? == 0 {
                return Err(SwapError::NotAllocated { offset: slot });
            }
        }
        Ok(())
    }

    fn check_io(&self, offset: u64, len: usize) -> Result<(), SwapError> {
        if len as u64 != SLOT_BYTES {
            return Err(SwapError::Invalid(format!(
                "a slot holds {SLOT_BYTES} bytes, not {len}"
            )));
        }
        if self.usage_of(offset)? == 0 {
            return Err(SwapError::NotAllocated { offset });
        }
        Ok(())
    }

    /// The discard thread: waits for clusters to discard, discards them.
    fn discard_worker(&self) {
        loop {
            {
                let mut state = self.discard.lock();
                while !state.0 && !state.1 {
                    state = self
                        .discard
                        .wake
                        .wait(state)
                        .unwrap_or_else(|p| p.into_inner());
                }
                if state.1 {
                    return;
                }
                state.0 = false;
            }
            self.do_discard(&mut None);
        }
    }

    /// `swap_do_scheduled_discard()`: each cluster on the discard list is taken off it (its
    /// flag stays Discard, so no allocator uses it), its slots are discarded on the backing
    /// device with no lock held (unless the caller holds the device lock), and it goes to
    /// the free list. True if any was.
    pub(crate) fn do_discard(&self, held: &mut Held<'_>) -> bool {
        // A caller holding the device lock (legacy) must not wait for a worker that will
        // take it: it discards only if no one else is.
        let _serial = if held.is_none() {
            self.discard
                .serial
                .lock()
                .unwrap_or_else(|p| p.into_inner())
        } else {
            match self.discard.serial.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        };
        let mut any = false;
        loop {
            let popped = self.with_lists(held, |l| {
                let (list, nodes) = l.list(Flag::Discard, 0);
                list.pop_front(nodes)
            });
            let Some(id) = popped else { return any };
            any = true;
            let first = (u64::from(id) * u64::from(CLUSTER)).max(1);
            let end = ((u64::from(id) + 1) * u64::from(CLUSTER)).min(self.slots);
            let punched = self
                .backing
                .discard(first * SLOT_BYTES, (end - first) * SLOT_BYTES);
            self.counters.add(DISCARDED, 1);
            if punched.is_err() {
                // As the kernel: a failed discard loses nothing, the slots are free anyway.
                self.counters.add(DISCARD_ERRORS, 1);
            }
            if self.config.mode == Mode::Legacy && held.is_none() {
                // The legacy order: device lock, then the cluster's.
                let mut dev = Some(self.lists.lock(&self.device_lock));
                let mut c = self.clusters[id as usize].lock(&self.cluster_lock);
                c.flag = Flag::None;
                self.free_cluster_now(&mut c, id, &mut dev);
            } else {
                let mut c = self.clusters[id as usize].lock(&self.cluster_lock);
                c.flag = Flag::None;
                self.free_cluster_now(&mut c, id, held);
            }
        }
    }

    fn list_counts(&self) -> ListCounts {
        let l = self.lists.lock(&self.device_lock);
        ListCounts {
            free: l.free.len(),
            nonfull: std::array::from_fn(|o| l.nonfull[o].len()),
            frag: std::array::from_fn(|o| l.frag[o].len()),
            full: l.full.len(),
            discard: l.discard.len(),
        }
    }

    /// Free slots in clusters on the frag lists.
    fn frag_free_slots(&self) -> u64 {
        let ids: Vec<u32> = {
            let mut l = self.lists.lock(&self.device_lock);
            (0..NR_ORDERS)
                .flat_map(|o| l.ids(Flag::Frag, o as u8))
                .collect()
        };
        ids.iter()
            .map(|&id| {
                let c = self.clusters[id as usize].lock(&self.cluster_lock);
                if c.flag == Flag::Frag {
                    u64::from(CLUSTER - u32::from(c.count))
                } else {
                    0
                }
            })
            .sum()
    }

    fn stats(&self) -> DeviceStats {
        let per_order = (0..NR_ORDERS)
            .map(|o| OrderStats {
                order: o as u32,
                allocations: self.counters.sum(ALLOCATED + o),
                frees: self.counters.sum(FREED + o),
                fallbacks: self.counters.sum(FALLBACK + o),
            })
            .collect();
        DeviceStats {
            mode: self.config.mode,
            policy: self.config.policy,
            rotational: self.config.rotational,
            discard: self.config.discard,
            priority: self.config.priority,
            slots: self.slots,
            usable_slots: self.slots - 1,
            in_use: self.usage.in_use(),
            off_list: self.usage.off_list(),
            per_order,
            lists: self.list_counts(),
            frag_free_slots: self.frag_free_slots(),
            clusters_discarded: self.counters.sum(DISCARDED),
            discard_errors: self.counters.sum(DISCARD_ERRORS),
            locks: vec![
                self.device_lock.report(),
                self.cluster_lock.report(),
                self.global_lock.report(),
                self.usage.avail().lock_stats.report(),
            ],
        }
    }

    fn verify(&self) -> Result<(), String> {
        let mut on_list = vec![None; self.clusters.len()];
        {
            let mut l = self.lists.lock(&self.device_lock);
            let mut lists = vec![(Flag::Free, 0u8), (Flag::Full, 0), (Flag::Discard, 0)];
            for o in 0..NR_ORDERS as u8 {
                lists.push((Flag::Nonfull, o));
                lists.push((Flag::Frag, o));
            }
            if self.nonempty.load(Ordering::Acquire) != l.nonempty_mask() {
                return Err("the published list bitmap differs from the lists".into());
            }
            for (flag, order) in lists {
                for id in l.ids(flag, order) {
                    if let Some(prev) = on_list[id as usize].replace((flag, order)) {
                        return Err(format!("cluster {id} on two lists: {prev:?} and {flag:?}"));
                    }
                }
            }
        }
        let mut in_use = 0u64;
        let mut frag_runs = [0u64; NR_ORDERS];
        for (id, lock) in self.clusters.iter().enumerate() {
            let c = lock.lock(&self.cluster_lock);
            let used = c.map.iter().filter(|&&b| b != 0).count();
            if used != usize::from(c.count) {
                return Err(format!(
                    "cluster {id}: count {} but {used} slots used",
                    c.count
                ));
            }
            in_use += c
                .map
                .iter()
                .filter(|&&b| b != 0 && b != SWAP_MAP_BAD)
                .count() as u64;
            let expected = match c.flag {
                Flag::None => None,
                Flag::Free | Flag::Full | Flag::Discard => Some((c.flag, 0)),
                Flag::Nonfull | Flag::Frag => Some((c.flag, c.order)),
            };
            if on_list[id] != expected && !(c.flag == Flag::Discard && on_list[id].is_none()) {
                return Err(format!(
                    "cluster {id}: flag {:?} order {} but on {:?}",
                    c.flag, c.order, on_list[id]
                ));
            }
            let fits = match c.flag {
                Flag::Free | Flag::Discard => c.count == 0,
                // ztier's list policy leaves a full cluster there until half is free.
                Flag::Full => match self.config.policy {
                    ListPolicy::Ztier => CLUSTER - u32::from(c.count) < FULL_ROOM,
                    ListPolicy::Kernel => u32::from(c.count) == CLUSTER,
                },
                Flag::Nonfull | Flag::Frag => c.count > 0,
                Flag::None => false,
            };
            if !fits {
                return Err(format!(
                    "cluster {id}: {:?} with {} slots used",
                    c.flag, c.count
                ));
            }
            if c.count > 0 && c.free_runs != c.count_free_runs() {
                return Err(format!(
                    "cluster {id}: {} free runs of order {} counted, {} there",
                    c.free_runs,
                    c.order,
                    c.count_free_runs()
                ));
            }
            let published = Published::unpack(self.published[id].load(Ordering::Relaxed));
            if published != self.offer(&c) {
                return Err(format!(
                    "cluster {id}: published {published:?}, offers {:?}",
                    self.offer(&c)
                ));
            }
            frag_runs[usize::from(published.order)] += u64::from(published.frag_runs);
        }
        let summed: [u64; NR_ORDERS] =
            std::array::from_fn(|o| self.frag_runs[o].load(Ordering::Relaxed));
        if summed != frag_runs {
            return Err(format!(
                "free runs on the frag lists: {summed:?} summed, {frag_runs:?} there"
            ));
        }
        if in_use != self.usage.in_use() {
            return Err(format!(
                "{in_use} slots used in the clusters, {} counted",
                self.usage.in_use()
            ));
        }
        let full = self.usage.in_use() == self.slots - 1;
        if self.usage.off_list() != full
            || self.usage.avail().contains(self.id) == self.usage.off_list()
        {
            return Err(format!(
                "in use {} of {}: off-list bit {}, on the available list {}",
                self.usage.in_use(),
                self.slots - 1,
                self.usage.off_list(),
                self.usage.avail().contains(self.id)
            ));
        }
        Ok(())
    }
}

/// One order's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OrderStats {
    pub order: u32,
    /// Allocations of `2^order` slots.
    pub allocations: u64,
    /// Frees of `2^order` slots (single slots: order 0).
    pub frees: u64,
    /// Allocations that found no room (the kernel's `swpout_fallback` for order > 0).
    pub fallbacks: u64,
}

/// A device's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub mode: Mode,
    pub policy: ListPolicy,
    pub rotational: bool,
    pub discard: bool,
    pub priority: i16,
    pub slots: u64,
    pub usable_slots: u64,
    pub in_use: u64,
    pub off_list: bool,
    pub per_order: Vec<OrderStats>,
    pub lists: ListCounts,
    /// Free slots in clusters on the frag lists.
    pub frag_free_slots: u64,
    pub clusters_discarded: u64,
    pub discard_errors: u64,
    pub locks: Vec<LockReport>,
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
        let mut c = inner.clusters[id as usize].lock(&inner.cluster_lock);
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
                .move_to(id, from, to, order);
            c.flag = to;
        }
    }
}
