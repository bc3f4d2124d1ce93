//! Index-linked doubly linked lists: nodes live in a slice (an [`IdSlab`](crate::slab::IdSlab)'s
//! items), or in a table of their owner's that holds only the nodes in use ([`Nodes`]), and
//! link to each other by index, so a node moves between lists in O(1) without
//! allocating, and one slice can hold the nodes of many lists (zsmalloc's twelve fullness
//! lists of a class, the swap allocator's cluster lists).
//!
//! Invariants: a node is on at most one list at a time (its links say whether it is on one,
//! checked by every push), and only the list it is on touches its links; a node off every
//! list has both links [`NONE`]. Which list a node is on is its owner's to record (zsmalloc's
//! fullness group): removing a node from a list it is not on is caught when the list's ends
//! disagree with its links, and otherwise corrupts only that owner's lists, never memory.

use crate::NONE;

/// A node's links, kept inside the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    prev: u32,
    next: u32,
    linked: bool,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            prev: NONE,
            next: NONE,
            linked: false,
        }
    }
}

impl Links {
    /// Whether the node is on a list.
    pub fn is_linked(&self) -> bool {
        self.linked
    }
}

/// A type whose values can be nodes of a [`List`].
pub trait Linked {
    fn links(&self) -> &Links;
    fn links_mut(&mut self) -> &mut Links;
}

/// Links alone are a node: for lists whose nodes carry nothing else (their ids are the
/// items).
impl Linked for Links {
    fn links(&self) -> &Links {
        self
    }
    fn links_mut(&mut self) -> &mut Links {
        self
    }
}

/// Where a list's nodes are, reached by id: a slice of [`Linked`] values (most lists), or a
/// table of its owner's that holds only the nodes in use (the swap allocator's clusters,
/// made as they are first used). A list's calls take it as `&mut impl Nodes`.
pub trait Nodes {
    /// The links of node `id`, which the table holds.
    fn links_of(&self, id: u32) -> &Links;
    fn links_of_mut(&mut self, id: u32) -> &mut Links;
}

impl<T: Linked> Nodes for [T] {
    #[inline]
    fn links_of(&self, id: u32) -> &Links {
        self[id as usize].links()
    }
    #[inline]
    fn links_of_mut(&mut self, id: u32) -> &mut Links {
        self[id as usize].links_mut()
    }
}

impl<T: Linked> Nodes for Vec<T> {
    #[inline]
    fn links_of(&self, id: u32) -> &Links {
        self[id as usize].links()
    }
    #[inline]
    fn links_of_mut(&mut self, id: u32) -> &mut Links {
        self[id as usize].links_mut()
    }
}

/// One list: its ends and length. The nodes are in a table given to each call ([`Nodes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct List {
    head: u32,
    tail: u32,
    len: u64,
}

impl Default for List {
    fn default() -> Self {
        List::new()
    }
}

impl List {
    pub const fn new() -> List {
        List {
            head: NONE,
            tail: NONE,
            len: 0,
        }
    }

    pub fn first(&self) -> Option<u32> {
        (self.head != NONE).then_some(self.head)
    }

    pub fn last(&self) -> Option<u32> {
        (self.tail != NONE).then_some(self.tail)
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Puts node `id`, on no list, at the head.
    pub fn push_front<N: Nodes + ?Sized>(&mut self, nodes: &mut N, id: u32) {
        let old = self.head;
        let l = nodes.links_of_mut(id);
        assert!(!l.linked, "node {id} is on a list already");
        l.linked = true;
        l.next = old;
        if old == NONE {
            self.tail = id;
        } else {
            nodes.links_of_mut(old).prev = id;
        }
        self.head = id;
        self.len += 1;
    }

    /// Puts node `id`, on no list, at the tail.
    pub fn push_back<N: Nodes + ?Sized>(&mut self, nodes: &mut N, id: u32) {
        let old = self.tail;
        let l = nodes.links_of_mut(id);
        assert!(!l.linked, "node {id} is on a list already");
        l.linked = true;
        l.prev = old;
        if old == NONE {
            self.head = id;
        } else {
            nodes.links_of_mut(old).next = id;
        }
        self.tail = id;
        self.len += 1;
    }

    /// Takes node `id`, which is on this list, off it.
    pub fn remove<N: Nodes + ?Sized>(&mut self, nodes: &mut N, id: u32) {
        let Links { prev, next, linked } = *nodes.links_of(id);
        assert!(
            linked && (prev == NONE) == (self.head == id) && (next == NONE) == (self.tail == id),
            "node {id} is not on this list"
        );
        if prev == NONE {
            self.head = next;
        } else {
            nodes.links_of_mut(prev).next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            nodes.links_of_mut(next).prev = prev;
        }
        *nodes.links_of_mut(id) = Links::default();
        self.len -= 1;
    }

    /// Takes the head off the list and returns it.
    pub fn pop_front<N: Nodes + ?Sized>(&mut self, nodes: &mut N) -> Option<u32> {
        let id = self.first()?;
        self.remove(nodes, id);
        Some(id)
    }

    /// Takes the tail off the list and returns it.
    pub fn pop_back<N: Nodes + ?Sized>(&mut self, nodes: &mut N) -> Option<u32> {
        let id = self.last()?;
        self.remove(nodes, id);
        Some(id)
    }

    /// The node after `id` on its list.
    pub fn next<N: Nodes + ?Sized>(nodes: &N, id: u32) -> Option<u32> {
        let next = nodes.links_of(id).next;
        (next != NONE).then_some(next)
    }

    /// The node before `id` on its list.
    pub fn prev<N: Nodes + ?Sized>(nodes: &N, id: u32) -> Option<u32> {
        let prev = nodes.links_of(id).prev;
        (prev != NONE).then_some(prev)
    }

    /// The ids from head to tail.
    pub fn iter<'a, N: Nodes + ?Sized>(&self, nodes: &'a N) -> impl Iterator<Item = u32> + 'a {
        let mut at = self.first();
        std::iter::from_fn(move || {
            let id = at?;
            at = List::next(nodes, id);
            Some(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    proptest! {
        /// Two lists over one slice behave as two deques of the same ids.
        #[test]
        fn lists_match_deques(ops in prop::collection::vec((0..6u8, 0..16u32), 1..300)) {
            let mut nodes = vec![Links::default(); 16];
            let mut lists = [List::new(), List::new()];
            let mut model: [VecDeque<u32>; 2] = Default::default();
            let on = |model: &[VecDeque<u32>; 2], id| model.iter().position(|m| m.contains(&id));
            for (op, id) in ops {
                let which = (id % 2) as usize;
                match (op, on(&model, id)) {
                    (0, None) => { lists[which].push_front(&mut nodes, id); model[which].push_front(id); }
                    (1, None) => { lists[which].push_back(&mut nodes, id); model[which].push_back(id); }
                    (2 | 3, Some(l)) => {
                        lists[l].remove(&mut nodes, id);
                        model[l].retain(|&x| x != id);
                    }
                    (4, _) => prop_assert_eq!(lists[which].pop_front(&mut nodes), model[which].pop_front()),
                    (5, _) => prop_assert_eq!(lists[which].pop_back(&mut nodes), model[which].pop_back()),
                    _ => {}
                }
                for l in 0..2 {
                    let ids: Vec<u32> = lists[l].iter(&nodes).collect();
                    prop_assert_eq!(&ids, &model[l].iter().copied().collect::<Vec<_>>());
                    prop_assert_eq!(lists[l].len(), model[l].len() as u64);
                    prop_assert_eq!(lists[l].last(), model[l].back().copied());
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "on a list already")]
    fn a_node_cannot_join_two_lists() {
        let mut nodes = vec![Links::default(); 2];
        let (mut a, mut b) = (List::new(), List::new());
        a.push_back(&mut nodes, 0);
        b.push_back(&mut nodes, 0);
    }
}
