//! The LRU of stored pages (the kernel's `zswap_list_lru`), with the second chance of the
//! shrinker: a page enters at the tail with its referenced bit set; the shrinker walks from
//! the head (the oldest), clears a set bit and moves the page to the tail instead of taking
//! it, and takes a page whose bit is clear, moving it to the tail too before its writeback
//! starts (if the writeback fails the page stays, now young; if it succeeds, the free
//! takes it off).
//!
//! Invariants: every node in the slab is on the list, and its slot's index value names it
//! (both change together, under the slot's page lock and its tree node's lock, then this
//! lock). Lock order: tree node → LRU (the kernel's `tree.lock` → `lru_lock`); the shrinker
//! takes this lock alone to choose its pages.

use ztier_base::list::{Linked, Links, List};
use ztier_base::slab::{IdSlab, SlabFull};

/// One stored page on the LRU: which slot, and whether it was stored since the shrinker
/// last passed it.
#[derive(Debug, Clone, Default)]
struct Node {
    slot: u32,
    referenced: bool,
    links: Links,
}

impl Linked for Node {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}

#[derive(Default)]
pub(crate) struct Lru {
    nodes: IdSlab<Node>,
    list: List,
}

impl Lru {
    /// Adds a just-stored page at the tail, referenced; returns its node.
    pub(crate) fn add(&mut self, slot: u32) -> Result<u32, SlabFull> {
        let id = self.nodes.insert(Node {
            slot,
            referenced: true,
            links: Links::default(),
        })?;
        self.list.push_back(self.nodes.items_mut(), id);
        Ok(id)
    }

    /// Takes a node off (its page was loaded, invalidated, replaced or written back).
    pub(crate) fn remove(&mut self, id: u32) {
        self.list.remove(self.nodes.items_mut(), id);
        self.nodes.remove(id);
        self.nodes.release_if_empty();
    }

    /// Walks up to `nr_to_walk` nodes from the head and puts the pages to write back,
    /// `(node, slot)`, in `victims`.
    pub(crate) fn walk(&mut self, nr_to_walk: usize, victims: &mut Vec<(u32, u64)>) {
        for _ in 0..nr_to_walk {
            let Some(id) = self.list.first() else { return };
            let nodes = self.nodes.items_mut();
            self.list.remove(nodes, id);
            self.list.push_back(nodes, id);
            let node = &mut nodes[id as usize];
            if node.referenced {
                node.referenced = false;
            } else {
                victims.push((id, node.slot as u64));
            }
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.list.len()
    }

    /// Bytes the LRU holds (the node slab's capacity, its free ids).
    pub(crate) fn bytes(&self) -> u64 {
        (self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.nodes.free_capacity() * std::mem::size_of::<u32>()) as u64
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
    }
}
