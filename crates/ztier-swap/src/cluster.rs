//! Swap clusters: 512 consecutive slots with their usage counts, and the lists they are on.
//!
//! Per-slot usage is a byte per slot, kept per cluster: the classic `swap_map` byte (a count
//! of references, [`SWAP_MAP_MAX`] at most, [`SWAP_MAP_BAD`] for slots never handed out),
//! stored in the cluster as today's per-cluster swap table stores its counts, so a slot is
//! read and changed under its cluster's lock alone. As the kernel's swap table (6.18), a
//! cluster's map is made when the cluster first holds a slot and given back when it empties
//! (`ClusterMap`): a store's metadata follows its use, not its size.
//!
//! So do the clusters' own states. The kernel's `cluster_info` is made whole at swapon (a
//! state, a lock and a list node per cluster, every free one linked): for a 64 GiB store
//! that is 32,768 clusters, ~1.5 MiB touched before a slot is taken, ~400 MB for 256 such
//! stores. Here a cluster's state, lock, published word (`ClusterTable`) and list node
//! (`ClusterNodes`) are made a chunk of `CHUNK_CLUSTERS` at a time when a cluster of
//! the chunk is first used, and the free list links no cluster that was never used: those
//! are its frontier, `[next, end)`, taken in ascending order (`FreeList`). The order is
//! the kernel's exactly: its free list is filled in ascending order at swapon and freed
//! clusters go to its tail, so the never-used clusters are always a run in ascending order
//! between the clusters linked before it (a reopened area's free clusters among used ones;
//! ones an isolation passed by as their lock was held) and those freed since. An unused
//! 64 GiB device holds the chunks' directory and the header's chunk (~20 KiB); the chunks
//! go back to the heap when the device is dropped.
//!
//! Weighed against this: a table of states on an anonymous mapping whose untouched pages
//! cost nothing (`ztier_base::zeroed::Table`, zram's slot table), all-zero bytes meaning a
//! free, never-used cluster. It would save the directory's indirection, but a cluster's
//! lock is a `parking_lot` mutex (loom's spinlock under `--cfg loom`): holding it in zeroed
//! memory needs the claim, in `unsafe` code this crate forbids, that all-zero bytes are a
//! valid unlocked `parking_lot` mutex (an internal of that crate), and a table under loom
//! of another kind; and the list nodes would still be linked whole unless the free list had
//! the frontier anyway. The directory costs one more dependent load per cluster lock, which
//! the allocator's benchmark does not tell from noise (docs/diary.md, "Cluster tables that
//! follow use"). Chunks are not given back when all their clusters are free again: a
//! reader may hold a reference into one without a lock (the published words) and nothing
//! here could tell when it let go; a cluster's map, the bulk (512 of its ~560 bytes), is
//! given back as it empties.
//!
//! Invariants, with the cluster's lock held:
//! - `count` is the number of slots whose byte is not zero;
//! - a cluster whose `count` is 0 reads as all zero bytes, and holds no map once it is on
//!   the free or discard list;
//! - `flag` names the list the cluster is on ([`Flag::None`]: on none, held by whoever
//!   isolated it; [`Flag::Discard`] may also be off-list while its slots are discarded);
//! - a cluster on a per-order list (nonfull, frag) has `count > 0`, and its `order` does not
//!   change until it is empty;
//! - a cluster whose `count` is 0 is on the free or discard list, or isolated;
//! - `free_runs` is the number of free aligned runs of `order` slots while `count > 0`;
//! - a cluster on the full list has no free slot, or under ztier's list policy fewer than
//!   half free (order 0 fills them in place).
//!
//! The lists (`Lists`) are guarded by the device lock; a cluster's `flag` by its own lock,
//! and both are changed together only with both held (cluster lock first, then the device
//! lock: `move_cluster`), or, when a cluster is isolated, with the device lock held and the
//! cluster's lock taken by `try_lock` (never waiting, so the order cannot deadlock). Chunks
//! are made under the device lock (or by the device's constructor, before anyone sees it),
//! so a chunk's `OnceLock` is set once, by one thread, and read with no lock.

use std::sync::OnceLock;

use serde::Serialize;
use ztier_base::list::{Linked, Links, List, Nodes};

use crate::lockstat::CountedMutex;
use crate::sync::AtomicU64;

/// Slots in a cluster (`SWAPFILE_CLUSTER`).
pub const SWAPFILE_CLUSTER: u32 = 512;
/// Allocation orders 0..NR_ORDERS (`SWAP_NR_ORDERS`): order 9, a whole cluster, is a PMD
/// (2 MiB) folio.
pub const NR_ORDERS: usize = 10;
/// The order of a whole cluster.
pub const PMD_ORDER: u32 = 9;
/// The largest count a slot takes.
pub const SWAP_MAP_MAX: u8 = 0x3e;
/// A slot never handed out: the header, or past the device's end.
pub const SWAP_MAP_BAD: u8 = 0x3f;
/// A slot whose last reference was put in the legacy mode, waiting in a thread's free
/// cache: not free, not in use.
pub(crate) const SWAP_MAP_FREEING: u8 = 0x40;

/// Which list a cluster is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Flag {
    /// On no list (isolated by an allocator scanning it).
    None,
    Free,
    /// Some slots free, freed into since it was last scanned.
    Nonfull,
    /// Some slots free, left behind by an allocator (a CPU's cluster that it moved on from).
    Frag,
    /// No slot free; under ztier's list policy, fewer than half free (order 0 fills those
    /// holes in place).
    Full,
    /// Empty, waiting for its slots to be discarded on the backing device.
    Discard,
}

impl Flag {
    /// Allocations may be made from it (`CLUSTER_FLAG_USABLE`).
    pub fn usable(self) -> bool {
        matches!(self, Flag::Free | Flag::Nonfull | Flag::Frag)
    }
}

/// One cluster's state, under its lock.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub count: u16,
    /// The order it serves while not empty (an order-0 allocation may take a free slot of
    /// any cluster).
    pub order: u8,
    pub flag: Flag,
    /// Free aligned runs of `order` slots (free slots for order 0); meaningful while
    /// `count > 0`, set afresh when an empty cluster takes an order.
    pub free_runs: u16,
    pub map: ClusterMap,
}

/// A cluster's slot bytes: made on the first write, given back ([`ClusterMap::release`])
/// when the cluster empties. Unmade, it reads as all zero (every slot free).
#[derive(Debug, Default)]
pub(crate) struct ClusterMap(Option<Box<[u8; SWAPFILE_CLUSTER as usize]>>);

/// What an unmade map reads as.
static FREE_MAP: [u8; SWAPFILE_CLUSTER as usize] = [0; SWAPFILE_CLUSTER as usize];

impl ClusterMap {
    /// Gives the map back; the cluster must hold no slot (its bytes all zero).
    pub(crate) fn release(&mut self) {
        debug_assert!(self.iter().all(|&b| b == 0), "a map given back held slots");
        self.0 = None;
    }

    /// Whether the map is made (memory held for it).
    pub(crate) fn is_made(&self) -> bool {
        self.0.is_some()
    }
}

impl std::ops::Deref for ClusterMap {
    type Target = [u8; SWAPFILE_CLUSTER as usize];

    fn deref(&self) -> &Self::Target {
        self.0.as_deref().unwrap_or(&FREE_MAP)
    }
}

impl std::ops::DerefMut for ClusterMap {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0
            .get_or_insert_with(|| Box::new([0; SWAPFILE_CLUSTER as usize]))
    }
}

impl Cluster {
    /// A free cluster never used: on the free list.
    pub(crate) fn new() -> Cluster {
        Cluster {
            count: 0,
            order: 0,
            flag: Flag::Free,
            free_runs: SWAPFILE_CLUSTER as u16,
            map: ClusterMap::default(),
        }
    }

    /// `cluster_is_usable()`: allocations of `order` may be made here.
    pub(crate) fn usable_for(&self, order: u32) -> bool {
        self.flag.usable() && (order == 0 || self.count == 0 || u32::from(self.order) == order)
    }

    pub(crate) fn range_is_free(&self, start: usize, nr: usize) -> bool {
        self.map[start..start + nr].iter().all(|&b| b == 0)
    }

    /// An empty cluster starts to serve `order`: every run of it is free.
    pub(crate) fn take_order(&mut self, order: u32) {
        debug_assert_eq!(self.count, 0, "only an empty cluster changes order");
        self.order = order as u8;
        self.free_runs = (SWAPFILE_CLUSTER >> order) as u16;
    }

    /// Free aligned runs of the cluster's order, counted (what `free_runs` must equal).
    pub(crate) fn count_free_runs(&self) -> u16 {
        let nr = 1usize << self.order;
        (0..SWAPFILE_CLUSTER as usize)
            .step_by(nr)
            .filter(|&i| self.range_is_free(i, nr))
            .count() as u16
    }
}

/// A cluster's place in the lists: its links, and on the free list, which part it is in
/// ([`FreeList`]).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Node {
    links: Links,
    /// On the free list's linked part before its never-used clusters (not the part after).
    before_frontier: bool,
}

impl Linked for Node {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}

/// Clusters in a chunk: the unit in which the table makes their states, published words
/// ([`ClusterTable`]) and list nodes ([`ClusterNodes`]). 128 clusters' states and words are
/// 4 KiB, a page; their nodes 2 KiB.
pub(crate) const CHUNK_CLUSTERS: u32 = 128;

/// The chunk of cluster `id`, and its place in the chunk.
fn chunk_of(id: u32) -> (usize, usize) {
    (
        (id / CHUNK_CLUSTERS) as usize,
        (id % CHUNK_CLUSTERS) as usize,
    )
}

/// One chunk's clusters: each one's state under its lock, and the word it publishes.
struct Chunk {
    clusters: Box<[CountedMutex<Cluster>]>,
    published: Box<[AtomicU64]>,
}

/// The clusters' states and published words, made a chunk at a time as clusters are first
/// used (the free list's frontier reaches them, [`FreeList`]), and kept until the device
/// is dropped. A cluster whose chunk is not made is free and was never used: it reads as
/// [`Cluster::new`] with nothing published, and no one holds its lock.
///
/// Chunks are made only under the device lock (or by the device's constructor, before
/// anyone else sees it: [`Lists::make`]), so a chunk's `OnceLock` is never waited on; it
/// is read without a lock.
pub(crate) struct ClusterTable {
    chunks: Box<[OnceLock<Chunk>]>,
    len: u32,
}

impl ClusterTable {
    /// A table of `len` clusters, none made; `None` if its directory cannot be allocated.
    pub(crate) fn new(len: u32) -> Option<ClusterTable> {
        let n = len.div_ceil(CHUNK_CLUSTERS) as usize;
        let mut chunks = Vec::new();
        chunks.try_reserve_exact(n).ok()?;
        chunks.resize_with(n, OnceLock::new);
        Some(ClusterTable {
            chunks: chunks.into_boxed_slice(),
            len,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    fn chunk(&self, id: u32) -> Option<(&Chunk, usize)> {
        let (chunk, at) = chunk_of(id);
        Some((self.chunks.get(chunk)?.get()?, at))
    }

    /// Cluster `id`'s lock, if its chunk is made (`None`: it is free and was never used).
    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&CountedMutex<Cluster>> {
        self.chunk(id).map(|(c, at)| &c.clusters[at])
    }

    /// The lock of a cluster that is made: one on a list but the free list's never-used
    /// part, isolated, or a thread's current cluster.
    #[inline]
    pub(crate) fn at(&self, id: u32) -> &CountedMutex<Cluster> {
        self.get(id)
            .unwrap_or_else(|| panic!("cluster {id} is used but not made"))
    }

    /// What cluster `id` publishes, if made (one not made publishes nothing: all zero).
    #[inline]
    pub(crate) fn published(&self, id: u32) -> Option<&AtomicU64> {
        self.chunk(id).map(|(c, at)| &c.published[at])
    }

    /// Makes the chunk of cluster `id` if it is not, each cluster's state from `init`; true
    /// if made now. Only [`Lists::make`] calls it, under the device lock.
    fn make(&self, id: u32, mut init: impl FnMut(u32) -> Cluster) -> bool {
        let (chunk, _) = chunk_of(id);
        let slot = &self.chunks[chunk];
        if slot.get().is_some() {
            return false;
        }
        let first = chunk as u32 * CHUNK_CLUSTERS;
        let ids = first..self.len.min(first + CHUNK_CLUSTERS);
        let made = Chunk {
            clusters: ids.clone().map(|i| CountedMutex::new(init(i))).collect(),
            published: ids.map(|_| AtomicU64::new(0)).collect(),
        };
        slot.set(made).is_ok()
    }

    /// The made clusters, ascending: id, lock and published word.
    pub(crate) fn made(&self) -> impl Iterator<Item = (u32, &CountedMutex<Cluster>, &AtomicU64)> {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as u32 * CHUNK_CLUSTERS, c.get()?)))
            .flat_map(|(first, c)| {
                c.clusters
                    .iter()
                    .zip(c.published.iter())
                    .enumerate()
                    .map(move |(i, (lock, word))| (first + i as u32, lock, word))
            })
    }

    /// The bytes the table holds now: its directory, and each made chunk's clusters'
    /// states, published words and list nodes ([`ClusterNodes`] makes its chunks with these).
    pub(crate) fn resident_bytes(&self) -> u64 {
        let made = self.chunks.iter().filter_map(|c| c.get());
        let clusters: usize = made.map(|c| c.clusters.len()).sum();
        (self.chunks.len() * Self::directory_bytes_per_chunk()
            + clusters * Self::bytes_per_cluster()) as u64
    }

    /// A made cluster's bytes: its state under its lock, its published word, its node.
    pub(crate) const fn bytes_per_cluster() -> usize {
        size_of::<CountedMutex<Cluster>>() + size_of::<AtomicU64>() + size_of::<Node>()
    }

    /// The directory's bytes per chunk, made or not (both tables').
    pub(crate) const fn directory_bytes_per_chunk() -> usize {
        size_of::<OnceLock<Chunk>>() + size_of::<Option<Box<[Node]>>>()
    }
}

/// The clusters' list nodes, made a chunk at a time with the [`ClusterTable`]'s chunks,
/// under the device lock. Only made clusters are ever linked.
pub(crate) struct ClusterNodes(Vec<Option<Box<[Node]>>>);

impl ClusterNodes {
    fn node(&self, id: u32) -> &Node {
        let (chunk, at) = chunk_of(id);
        match &self.0[chunk] {
            Some(nodes) => &nodes[at],
            None => panic!("the node of cluster {id}, not made"),
        }
    }

    fn node_mut(&mut self, id: u32) -> &mut Node {
        let (chunk, at) = chunk_of(id);
        match &mut self.0[chunk] {
            Some(nodes) => &mut nodes[at],
            None => panic!("the node of cluster {id}, not made"),
        }
    }
}

impl Nodes for ClusterNodes {
    #[inline]
    fn links_of(&self, id: u32) -> &Links {
        &self.node(id).links
    }
    #[inline]
    fn links_of_mut(&mut self, id: u32) -> &mut Links {
        &mut self.node_mut(id).links
    }
}

/// The free list, in the kernel's order (filled in ascending order at swapon, freed clusters
/// to its tail) without a node per cluster: the clusters never used since the device was
/// made, `[next, end)`, are free and on no list, taken in ascending order. The order is
/// `before`, then `[next, end)`, then `after`.
///
/// Invariants (under the device lock): every cluster below `next` is made; no cluster in
/// `[next, end)` is linked anywhere, and one not made is in it; `before` holds only clusters
/// below `next` (reopened free among used ones, or passed by when their lock was held),
/// each with `before_frontier` set; `after` the clusters freed since, each without it.
pub(crate) struct FreeList {
    before: List,
    next: u32,
    end: u32,
    after: List,
}

impl FreeList {
    pub(crate) fn len(&self) -> u64 {
        self.before.len() + u64::from(self.end - self.next) + self.after.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether never-used cluster `id` is in the frontier's part (on the list, not linked).
    pub(crate) fn in_frontier(&self, id: u32) -> bool {
        (self.next..self.end).contains(&id)
    }

    fn first(&self) -> Option<u32> {
        self.before
            .first()
            .or((self.next < self.end).then_some(self.next))
            .or(self.after.first())
    }

    fn next_of(&self, nodes: &ClusterNodes, id: u32) -> Option<u32> {
        let after_frontier = || {
            (self.next < self.end)
                .then_some(self.next)
                .or(self.after.first())
        };
        if self.in_frontier(id) {
            return (id + 1 < self.end).then_some(id + 1).or(self.after.first());
        }
        let next = List::next(nodes, id);
        match nodes.node(id).before_frontier {
            true => next.or_else(after_frontier),
            false => next,
        }
    }
}

/// The device's cluster lists, under the device lock.
pub(crate) struct Lists {
    pub nodes: ClusterNodes,
    pub free: FreeList,
    pub nonfull: [List; NR_ORDERS],
    pub frag: [List; NR_ORDERS],
    pub full: List,
    pub discard: List,
}

impl Lists {
    /// Lists for `clusters` clusters, all empty; `None` if the node directory cannot be
    /// allocated.
    pub(crate) fn new(clusters: u32) -> Option<Lists> {
        let mut nodes = Vec::new();
        nodes
            .try_reserve_exact(clusters.div_ceil(CHUNK_CLUSTERS) as usize)
            .ok()?;
        nodes.resize_with(clusters.div_ceil(CHUNK_CLUSTERS) as usize, || None);
        Some(Lists {
            nodes: ClusterNodes(nodes),
            free: FreeList {
                before: List::new(),
                next: 0,
                end: 0,
                after: List::new(),
            },
            nonfull: [List::new(); NR_ORDERS],
            frag: [List::new(); NR_ORDERS],
            full: List::new(),
            discard: List::new(),
        })
    }

    /// The free list's never-used part is `[next, end)`; set once, while it is empty.
    pub(crate) fn set_frontier(&mut self, next: u32, end: u32) {
        debug_assert!(self.free.is_empty() && next <= end);
        self.free.next = next;
        self.free.end = end;
    }

    /// Makes the chunk of cluster `id` (states from `init`, and nodes) if it is not; true
    /// if made now. The caller holds the device lock (`&mut self`), or is the device's
    /// constructor.
    pub(crate) fn make_with(
        &mut self,
        table: &ClusterTable,
        id: u32,
        init: impl FnMut(u32) -> Cluster,
    ) -> bool {
        if !table.make(id, init) {
            return false;
        }
        let (chunk, _) = chunk_of(id);
        let len =
            (table.len as usize - chunk * CHUNK_CLUSTERS as usize).min(CHUNK_CLUSTERS as usize);
        self.nodes.0[chunk] = Some(vec![Node::default(); len].into_boxed_slice());
        true
    }

    /// Makes the chunk of cluster `id` if it is not, its clusters free and never used.
    pub(crate) fn make(&mut self, table: &ClusterTable, id: u32) {
        self.make_with(table, id, |_| Cluster::new());
    }

    /// The list `flag` names for a cluster of `order`, and the nodes; not the free list,
    /// which is more than one list ([`FreeList`]).
    pub(crate) fn list(&mut self, flag: Flag, order: u8) -> (&mut List, &mut ClusterNodes) {
        let o = usize::from(order);
        match flag {
            Flag::Nonfull => (&mut self.nonfull[o], &mut self.nodes),
            Flag::Frag => (&mut self.frag[o], &mut self.nodes),
            Flag::Full => (&mut self.full, &mut self.nodes),
            Flag::Discard => (&mut self.discard, &mut self.nodes),
            Flag::Free => unreachable!("the free list is reached through its own calls"),
            Flag::None => unreachable!("Flag::None names no list"),
        }
    }

    /// The head of list (`flag`, `order`).
    pub(crate) fn first(&mut self, flag: Flag, order: u8) -> Option<u32> {
        match flag {
            Flag::Free => self.free.first(),
            _ => self.list(flag, order).0.first(),
        }
    }

    /// The cluster after `id` on its list, of `flag`.
    pub(crate) fn next(&self, flag: Flag, id: u32) -> Option<u32> {
        match flag {
            Flag::Free => self.free.next_of(&self.nodes, id),
            _ => List::next(&self.nodes, id),
        }
    }

    /// Takes cluster `id` off list (`flag`, `order`), which holds it. A never-used cluster
    /// taken past the frontier's first leaves those before it linked in front of the
    /// frontier, where they were (their chunks made).
    pub(crate) fn remove(&mut self, table: &ClusterTable, flag: Flag, order: u8, id: u32) {
        if flag != Flag::Free {
            let (list, nodes) = self.list(flag, order);
            list.remove(nodes, id);
            return;
        }
        if self.free.in_frontier(id) {
            for passed in self.free.next..id {
                self.make(table, passed);
                self.free.before.push_back(&mut self.nodes, passed);
                self.nodes.node_mut(passed).before_frontier = true;
            }
            self.make(table, id);
            self.free.next = id + 1;
        } else if self.nodes.node(id).before_frontier {
            self.free.before.remove(&mut self.nodes, id);
            self.nodes.node_mut(id).before_frontier = false;
        } else {
            self.free.after.remove(&mut self.nodes, id);
        }
    }

    /// Puts made cluster `id`, on no list, on the tail of list (`flag`, `order`); on the
    /// free list, after its never-used part.
    pub(crate) fn push_back(&mut self, flag: Flag, order: u8, id: u32) {
        match flag {
            Flag::Free => self.free.after.push_back(&mut self.nodes, id),
            _ => {
                let (list, nodes) = self.list(flag, order);
                list.push_back(nodes, id);
            }
        }
    }

    /// Puts made free cluster `id`, below the frontier and on no list, on the free list's
    /// part before the frontier (a device's constructor, in ascending order).
    pub(crate) fn push_before_frontier(&mut self, id: u32) {
        debug_assert!(id < self.free.next);
        self.free.before.push_back(&mut self.nodes, id);
        self.nodes.node_mut(id).before_frontier = true;
    }

    /// Moves made cluster `id`, on the list (`from`, `order`) or on none, to the tail of
    /// (`to`, `order`).
    pub(crate) fn move_to(
        &mut self,
        table: &ClusterTable,
        id: u32,
        from: Flag,
        to: Flag,
        order: u8,
    ) {
        if from != Flag::None {
            self.remove(table, from, order, id);
        }
        self.push_back(to, order, id);
    }

    /// One bit per list, set if the list has clusters: the free, full and discard lists, then
    /// nonfull and frag per order ([`Lists::bit`]).
    pub(crate) fn nonempty_mask(&self) -> u64 {
        let mut mask = 0;
        let mut set = |flag, order: usize, empty: bool| {
            if !empty {
                mask |= Lists::bit(flag, order as u8);
            }
        };
        set(Flag::Free, 0, self.free.is_empty());
        set(Flag::Full, 0, self.full.is_empty());
        set(Flag::Discard, 0, self.discard.is_empty());
        for o in 0..NR_ORDERS {
            set(Flag::Nonfull, o, self.nonfull[o].is_empty());
            set(Flag::Frag, o, self.frag[o].is_empty());
        }
        mask
    }

    /// The bit of list (`flag`, `order`) in [`nonempty_mask`](Lists::nonempty_mask).
    pub(crate) fn bit(flag: Flag, order: u8) -> u64 {
        let o = u32::from(order);
        1 << match flag {
            Flag::Free => 0,
            Flag::Full => 1,
            Flag::Discard => 2,
            Flag::Nonfull => 3 + o,
            Flag::Frag => 3 + NR_ORDERS as u32 + o,
            Flag::None => unreachable!("Flag::None names no list"),
        }
    }

    /// The clusters on a list, head first (the free list's never-used part too).
    pub(crate) fn ids(&mut self, flag: Flag, order: u8) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut at = self.first(flag, order);
        while let Some(id) = at {
            ids.push(id);
            at = self.next(flag, id);
        }
        ids
    }
}

/// How many clusters are on each list.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ListCounts {
    pub free: u64,
    pub nonfull: [u64; NR_ORDERS],
    pub frag: [u64; NR_ORDERS],
    pub full: u64,
    pub discard: u64,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    /// What the free list must be: the kernel's, every free cluster linked in ascending
    /// order at the start, freed clusters to the tail.
    fn model(next: u32, end: u32) -> VecDeque<u32> {
        (next..end).collect()
    }

    proptest! {
        /// The free list with its never-used part is the kernel's linked list, whatever is
        /// taken from it (its head, or any cluster on it: one isolation passed by, or a
        /// thread's) and put back on it; and only the chunks of clusters taken, or passed
        /// by, are made.
        #[test]
        fn the_free_list_is_the_kernels(
            ops in prop::collection::vec((0..3u8, any::<prop::sample::Index>()), 1..200),
        ) {
            const CLUSTERS: u32 = 5 * CHUNK_CLUSTERS + 7;
            let table = ClusterTable::new(CLUSTERS).unwrap();
            let mut lists = Lists::new(CLUSTERS).unwrap();
            // Cluster 0 holds the header: made, on no free list.
            lists.make(&table, 0);
            lists.set_frontier(1, CLUSTERS);
            let mut free = model(1, CLUSTERS);
            let mut taken: Vec<u32> = Vec::new();
            let mut highest = 0;
            for (op, at) in ops {
                match op {
                    // Isolation takes the head.
                    0 if !free.is_empty() => {
                        let id = lists.first(Flag::Free, 0).unwrap();
                        prop_assert_eq!(Some(id), free.pop_front());
                        lists.remove(&table, Flag::Free, 0, id);
                        taken.push(id);
                        highest = highest.max(id);
                    }
                    // Any cluster on the list is taken off it.
                    1 if !free.is_empty() => {
                        let id = free.remove(at.index(free.len())).unwrap();
                        lists.remove(&table, Flag::Free, 0, id);
                        taken.push(id);
                        highest = highest.max(id);
                    }
                    // A cluster taken before is freed: to the tail.
                    2 if !taken.is_empty() => {
                        let id = taken.swap_remove(at.index(taken.len()));
                        lists.push_back(Flag::Free, 0, id);
                        free.push_back(id);
                    }
                    _ => {}
                }
                prop_assert_eq!(lists.ids(Flag::Free, 0), Vec::from(free.clone()));
                prop_assert_eq!(lists.free.len(), free.len() as u64);
                prop_assert_eq!(lists.nonempty_mask() & 1 != 0, !free.is_empty());
                // The chunks made: those up to the highest cluster taken, none past it.
                for id in 0..CLUSTERS {
                    let made = table.get(id).is_some();
                    let (chunk, _) = chunk_of(id);
                    prop_assert_eq!(made, chunk <= chunk_of(highest).0, "cluster {}", id);
                }
            }
        }
    }

    #[test]
    fn an_untaken_table_holds_its_directory_and_first_chunk() {
        let clusters = 32_768; // 64 GiB
        let table = ClusterTable::new(clusters).unwrap();
        let mut lists = Lists::new(clusters).unwrap();
        lists.make(&table, 0);
        let chunks = (clusters / CHUNK_CLUSTERS) as usize;
        assert_eq!(
            table.resident_bytes(),
            (chunks * ClusterTable::directory_bytes_per_chunk()
                + CHUNK_CLUSTERS as usize * ClusterTable::bytes_per_cluster()) as u64
        );
        assert!(
            table.resident_bytes() < 32 << 10,
            "{}",
            table.resident_bytes()
        );
    }
}
