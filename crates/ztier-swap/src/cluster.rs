//! Swap clusters: 512 consecutive slots with their usage counts, and the lists they are on.
//!
//! Per-slot usage is a byte per slot, kept per cluster: the classic `swap_map` byte (a count
//! of references, [`SWAP_MAP_MAX`] at most, [`SWAP_MAP_BAD`] for slots never handed out),
//! stored in the cluster as today's per-cluster swap table stores its counts, so a slot is
//! read and changed under its cluster's lock alone. As the kernel's swap table (6.18), a
//! cluster's map is made when the cluster first holds a slot and given back when it empties
//! (`ClusterMap`): a store's metadata follows its use, not its size.
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
//! cluster's lock taken by `try_lock` (never waiting, so the order cannot deadlock).

use serde::Serialize;
use ztier_base::list::{Linked, Links, List};

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
    pub(crate) fn new() -> Cluster {
        Cluster {
            count: 0,
            order: 0,
            flag: Flag::None,
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

/// A cluster's place in the lists.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Node(Links);

impl Linked for Node {
    fn links(&self) -> &Links {
        &self.0
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.0
    }
}

/// The device's cluster lists, under the device lock.
pub(crate) struct Lists {
    pub nodes: Vec<Node>,
    pub free: List,
    pub nonfull: [List; NR_ORDERS],
    pub frag: [List; NR_ORDERS],
    pub full: List,
    pub discard: List,
}

impl Lists {
    /// The bytes each cluster's node takes in [`Lists::new`]'s table.
    pub(crate) const fn node_bytes() -> usize {
        std::mem::size_of::<Node>()
    }

    pub(crate) fn new(clusters: usize) -> Lists {
        Lists {
            nodes: vec![Node::default(); clusters],
            free: List::new(),
            nonfull: [List::new(); NR_ORDERS],
            frag: [List::new(); NR_ORDERS],
            full: List::new(),
            discard: List::new(),
        }
    }

    /// The list `flag` names for a cluster of `order`, and the nodes.
    pub(crate) fn list(&mut self, flag: Flag, order: u8) -> (&mut List, &mut [Node]) {
        let o = usize::from(order);
        match flag {
            Flag::Free => (&mut self.free, &mut self.nodes),
            Flag::Nonfull => (&mut self.nonfull[o], &mut self.nodes),
            Flag::Frag => (&mut self.frag[o], &mut self.nodes),
            Flag::Full => (&mut self.full, &mut self.nodes),
            Flag::Discard => (&mut self.discard, &mut self.nodes),
            Flag::None => unreachable!("Flag::None names no list"),
        }
    }

    /// Moves cluster `id`, on the list (`from`, `order`) or on none, to the tail of (`to`,
    /// `order`).
    pub(crate) fn move_to(&mut self, id: u32, from: Flag, to: Flag, order: u8) {
        if from != Flag::None {
            let (list, nodes) = self.list(from, order);
            list.remove(nodes, id);
        }
        let (list, nodes) = self.list(to, order);
        list.push_back(nodes, id);
    }

    /// One bit per list, set if the list has clusters: the free, full and discard lists, then
    /// nonfull and frag per order ([`Lists::bit`]).
    pub(crate) fn nonempty_mask(&self) -> u64 {
        let mut mask = 0;
        let mut set = |flag, order: usize, list: &List| {
            if !list.is_empty() {
                mask |= Lists::bit(flag, order as u8);
            }
        };
        set(Flag::Free, 0, &self.free);
        set(Flag::Full, 0, &self.full);
        set(Flag::Discard, 0, &self.discard);
        for o in 0..NR_ORDERS {
            set(Flag::Nonfull, o, &self.nonfull[o]);
            set(Flag::Frag, o, &self.frag[o]);
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

    /// The clusters on a list, head first.
    pub(crate) fn ids(&mut self, flag: Flag, order: u8) -> Vec<u32> {
        let (list, nodes) = self.list(flag, order);
        let mut ids = Vec::with_capacity(list.len() as usize);
        let mut at = list.first();
        while let Some(id) = at {
            ids.push(id);
            at = List::next(nodes, id);
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
