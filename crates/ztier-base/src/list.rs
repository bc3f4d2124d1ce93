//! Index-linked doubly linked lists: nodes live in a slice (an [`IdSlab`](crate::slab::IdSlab)'s
//! items) and link to each other by index, so a node moves between lists in O(1) without
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

/// One list: its ends and length. The nodes are in a slice given to each call.
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
    pub fn push_front<T: Linked>(&mut self, nodes: &mut [T], id: u32) {
        let old = self.head;
        let l = nodes[id as usize].links_mut();
        assert!(!l.linked, "node {id} is on a list already");
        l.linked = true;
        l.next = old;
        if old == NONE {
            self.tail = id;
        } else {
            nodes[old as usize].links_mut().prev = id;
        }
        self.head = id;
        self.len += 1;
    }

    /// Puts node `id`, on no list, at the tail.
    pub fn push_back<T: Linked>(&mut self, nodes: &mut [T], id: u32) {
        let old = self.tail;
        let l = nodes[id as usize].links_mut();
        assert!(!l.linked, "node {id} is on a list already");
        l.linked = true;
        l.prev = old;
        if old == NONE {
            self.head = id;
        } else {
            nodes[old as usize].links_mut().next = id;
        }
        self.tail = id;
        self.len += 1;
    }

    /// Takes node `id`, which is on this list, off it.
    pub fn remove<T: Linked>(&mut self, nodes: &mut [T], id: u32) {
        let Links { prev, next, linked } = *nodes[id as usize].links();
        assert!(
            linked && (prev == NONE) == (self.head == id) && (next == NONE) == (self.tail == id),
            "node {id} is not on this list"
        );
        if prev == NONE {
            self.head = next;
        } else {
            nodes[prev as usize].links_mut().next = next;
        }
        if next == NONE {
            self.tail = prev;
        } else {
            nodes[next as usize].links_mut().prev = prev;
        }
        *nodes[id as usize].links_mut() = Links::default();
        self.len -= 1;
    }

    /// Takes the head off the list and returns it.
    pub fn pop_front<T: Linked>(&mut self, nodes: &mut [T]) -> Option<u32> {
        let id = self.first()?;
        self.remove(nodes, id);
        Some(id)
    }

    /// Takes the tail off the list and returns it.
    pub fn pop_back<T: Linked>(&mut self, nodes: &mut [T]) -> Option<u32> {
        let id = self.last()?;
        self.remove(nodes, id);
        Some(id)
    }

    /// The node after `id` on its list.
    pub fn next<T: Linked>(nodes: &[T], id: u32) -> Option<u32> {
        let next = nodes[id as usize].links().next;
        (next != NONE).then_some(next)
    }

    /// The node before `id` on its list.
    pub fn prev<T: Linked>(nodes: &[T], id: u32) -> Option<u32> {
        let prev = nodes[id as usize].links().prev;
        (prev != NONE).then_some(prev)
    }

    /// The ids from head to tail.
    pub fn iter<'a, T: Linked>(&self, nodes: &'a [T]) -> impl Iterator<Item = u32> + 'a {
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
