//! The LRU of stored pages (the kernel's `zswap_list_lru`), with the second chance of the
//! shrinker: a page enters at the tail with its referenced bit set; the shrinker walks from
//! the head (the oldest), clears a set bit and moves the page to the tail instead of taking
//! it, and takes a page whose bit is clear, moving it to the tail too before its writeback
//! starts (if the writeback fails the page stays, now young; if it succeeds, the free
//! takes it off).
//!
//! Nodes live in a slab indexed by id, linked by id. Freed ids are reused lowest first, the
//! free ids at the top of the slab are cut off, and [`Lru::relocate`] moves a node from the
//! top into the lowest free id, so under churn the slab shrinks back towards the pages it
//! holds instead of keeping its peak size (the cache moves the top nodes when the slab is
//! more than an eighth larger than needed: `Inner::compact_lru`).
//!
//! Invariants: every live node is on the list, and its slot's index value names it; a free
//! node has `slot == FREE` and is on no list. A node is added or removed together with its
//! index value, under the slot's tree node lock, then this lock; a node is moved (its id
//! changed) under the same two locks. Lock order: tree node → LRU (the kernel's
//! `tree.lock` → `lru_lock`); the shrinker takes this lock alone to choose its pages.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ztier_base::NONE;

/// The slot of a free node.
const FREE: u32 = u32::MAX;

/// One stored page on the LRU: which slot, its neighbours, and whether it was stored since
/// the shrinker last passed it.
#[derive(Debug, Clone, Copy)]
struct Node {
    slot: u32,
    prev: u32,
    next: u32,
    referenced: bool,
}

/// No node is left: every id a `u32` can name is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LruFull;

pub(crate) struct Lru {
    nodes: Vec<Node>,
    /// Free ids below `nodes.len()`, lowest first; may also hold ids since cut off or reused
    /// (checked when popped).
    free: BinaryHeap<Reverse<u32>>,
    head: u32,
    tail: u32,
    len: u64,
}

impl Default for Lru {
    fn default() -> Self {
        Lru {
            nodes: Vec::new(),
            free: BinaryHeap::new(),
            head: NONE,
            tail: NONE,
            len: 0,
        }
    }
}

impl Lru {
    /// The lowest free id, if any.
    fn pop_free(&mut self) -> Option<u32> {
        while let Some(Reverse(id)) = self.free.pop() {
            if self.nodes.get(id as usize).is_some_and(|n| n.slot == FREE) {
                return Some(id);
            }
        }
        None
    }

    /// Adds a just-stored page at the tail, referenced; returns its node.
    pub(crate) fn add(&mut self, slot: u32) -> Result<u32, LruFull> {
        debug_assert_ne!(slot, FREE);
        let id = match self.pop_free() {
            Some(id) => id,
            None if self.nodes.len() < NONE as usize => {
                self.nodes.push(Node {
                    slot: FREE,
                    prev: NONE,
                    next: NONE,
                    referenced: false,
                });
                (self.nodes.len() - 1) as u32
            }
            None => return Err(LruFull),
        };
        self.nodes[id as usize] = Node {
            slot,
            prev: NONE,
            next: NONE,
            referenced: true,
        };
        self.link_tail(id);
        self.len += 1;
        Ok(id)
    }

    fn link_tail(&mut self, id: u32) {
        let old = self.tail;
        self.nodes[id as usize].prev = old;
        self.nodes[id as usize].next = NONE;
        if old == NONE {
            self.head = id;
        } else {
            self.nodes[old as usize].next = id;
        }
        self.tail = id;
    }

    fn unlink(&mut self, id: u32) {
        let Node { prev, next, .. } = self.nodes[id as usize];
        if prev == NONE {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    /// Takes a node off (its page was loaded, invalidated, replaced or written back).
    pub(crate) fn remove(&mut self, id: u32) {
        assert!(
            self.nodes.get(id as usize).is_some_and(|n| n.slot != FREE),
            "LRU node {id} is not live"
        );
        self.unlink(id);
        self.nodes[id as usize].slot = FREE;
        self.len -= 1;
        self.free.push(Reverse(id));
        self.cut_top();
    }

    /// Cuts the free ids off the top of the slab, and gives back room once the slab has a
    /// quarter more than it holds.
    fn cut_top(&mut self) {
        while self.nodes.last().is_some_and(|n| n.slot == FREE) {
            self.nodes.pop();
        }
        if self.nodes.is_empty() {
            self.nodes = Vec::new();
            self.free = BinaryHeap::new();
            return;
        }
        let len = self.nodes.len();
        if self.nodes.capacity() > len + len / 4 + 64 {
            self.nodes.shrink_to(len + len / 8);
        }
        // Ids cut off (or reused) are only skipped when popped: rebuild once they
        // outnumber the free ids that are real.
        let real_free = len - self.len as usize;
        if self.free.len() > 2 * real_free + 64 {
            self.free = (0..len as u32)
                .filter(|&id| self.nodes[id as usize].slot == FREE)
                .map(Reverse)
                .collect();
        } else if self.free.capacity() > 2 * self.free.len() + 64 {
            self.free.shrink_to(self.free.len() + self.free.len() / 4);
        }
    }

    /// Whether the slab is more than an eighth larger than the nodes it holds (worth moving
    /// nodes down from the top).
    pub(crate) fn sparse(&self) -> bool {
        let live = self.len as usize;
        self.nodes.len() > live + live / 8 + 64
    }

    /// Up to `n` live nodes from the top of the slab, `(node, slot)`, highest first.
    pub(crate) fn top(&self, n: usize, out: &mut Vec<(u32, u64)>) {
        out.extend(
            self.nodes
                .iter()
                .enumerate()
                .rev()
                .filter(|(_, node)| node.slot != FREE)
                .take(n)
                .map(|(id, node)| (id as u32, node.slot as u64)),
        );
    }

    /// Moves live node `id` into the lowest free id, if that is below it, keeping its place
    /// on the list; returns the new id. The caller holds the slot's tree node and changes
    /// the index value to name the new id.
    pub(crate) fn relocate(&mut self, id: u32) -> Option<u32> {
        let to = self.pop_free()?;
        if to > id {
            self.free.push(Reverse(to));
            return None;
        }
        let node = self.nodes[id as usize];
        debug_assert_ne!(node.slot, FREE);
        self.nodes[to as usize] = node;
        if node.prev == NONE {
            self.head = to;
        } else {
            self.nodes[node.prev as usize].next = to;
        }
        if node.next == NONE {
            self.tail = to;
        } else {
            self.nodes[node.next as usize].prev = to;
        }
        self.nodes[id as usize].slot = FREE;
        self.free.push(Reverse(id));
        self.cut_top();
        Some(to)
    }

    /// Walks up to `nr_to_walk` nodes from the head and puts the pages to write back,
    /// `(node, slot)`, in `victims`.
    pub(crate) fn walk(&mut self, nr_to_walk: usize, victims: &mut Vec<(u32, u64)>) {
        for _ in 0..nr_to_walk {
            let id = self.head;
            if id == NONE {
                return;
            }
            self.unlink(id);
            self.link_tail(id);
            let node = &mut self.nodes[id as usize];
            if node.referenced {
                node.referenced = false;
            } else {
                victims.push((id, node.slot as u64));
            }
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Bytes the LRU holds (the node slab's capacity, its free ids).
    pub(crate) fn bytes(&self) -> u64 {
        (self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * std::mem::size_of::<u32>()) as u64
    }

    /// Checks the list against the slab (tests).
    #[cfg(test)]
    fn check(&self) {
        let mut n = 0;
        let mut prev = NONE;
        let mut id = self.head;
        while id != NONE {
            let node = self.nodes[id as usize];
            assert_ne!(node.slot, FREE);
            assert_eq!(node.prev, prev);
            prev = id;
            id = node.next;
            n += 1;
        }
        assert_eq!(prev, self.tail);
        assert_eq!(n, self.len);
        assert_eq!(
            self.nodes.iter().filter(|n| n.slot != FREE).count() as u64,
            self.len
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_chance() {
        let mut lru = Lru::default();
        let a = lru.add(10).unwrap();
        let b = lru.add(11).unwrap();
        let mut v = Vec::new();
        // Both referenced: the first pass only clears their bits.
        lru.walk(2, &mut v);
        assert!(v.is_empty());
        let c = lru.add(12).unwrap();
        lru.walk(3, &mut v);
        assert_eq!(v, vec![(a, 10), (b, 11)], "c was still referenced");
        lru.remove(a);
        lru.remove(b);
        v.clear();
        lru.walk(5, &mut v);
        assert_eq!(v.first(), Some(&(c, 12)));
        assert_eq!(lru.len(), 1);
        lru.check();
    }

    /// Under churn the slab shrinks back: ids are reused lowest first, the free top is cut
    /// off, and relocation moves the top nodes down, keeping the list's order.
    #[test]
    fn the_slab_shrinks_and_relocation_keeps_the_order() {
        let mut lru = Lru::default();
        let ids: Vec<u32> = (0..1000).map(|s| lru.add(s).unwrap()).collect();
        // Keep every tenth page.
        for (s, &id) in ids.iter().enumerate() {
            if s % 10 != 0 {
                lru.remove(id);
            }
        }
        lru.check();
        assert!(lru.sparse());
        let mut moved = 0;
        while lru.sparse() {
            let mut top = Vec::new();
            lru.top(16, &mut top);
            for (id, _) in top {
                if lru.relocate(id).is_some() {
                    moved += 1;
                }
            }
            lru.check();
        }
        assert!(moved > 0);
        assert!(lru.nodes.len() <= 100 + 100 / 8 + 64);
        // The walk still meets the pages in the order they were stored.
        let mut v = Vec::new();
        lru.walk(100, &mut v); // clears the referenced bits
        lru.walk(100, &mut v);
        let slots: Vec<u64> = v.iter().map(|&(_, s)| s).collect();
        assert_eq!(slots, (0..100).map(|s| s * 10).collect::<Vec<u64>>());
        let new = lru.add(5000).unwrap();
        assert!((new as usize) < lru.nodes.len());
        lru.check();
    }
}
