//! The index by swap slot (the kernel's `zswap_trees`, one xarray per 64 MiB of swap): for
//! each run of 64 slots (an xarray leaf's worth), a table of [`Value`]s made when the run's
//! first page is stored and dropped with its last, under the run's own lock. The slot
//! allocator fills clusters densely, so a stored page costs its 16-byte value and a share of
//! a 1 KiB table that is mostly full; a lookup in one run never waits for another's.
//!
//! Invariants: a node's `live` is the number of its values that are not empty, and the node
//! has a table exactly when `live > 0`. A value changes only under its slot's page lock
//! (see the crate's lock order) and its node's lock, so a holder of the page lock can read
//! the value once and use it after dropping the node's lock.

use parking_lot::{Mutex, MutexGuard};
use ztier_pool::Handle;

/// Slots per table (an xarray node's 64).
pub(crate) const LEAF: usize = 64;

/// What the index holds for one slot: nothing, a zero-filled page (no entry, no
/// allocation: the tagged value of "mm: zswap: store zero-filled pages without a
/// zswap_entry"), or a stored page's handle, length and LRU node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Value {
    handle: u64,
    lru: u32,
    /// 0: empty; [`ZERO_TAG`]: a zero-filled page; else the stored length.
    length: u16,
}

const ZERO_TAG: u16 = u16::MAX;

impl Value {
    pub(crate) const EMPTY: Value = Value {
        handle: 0,
        lru: ztier_base::NONE,
        length: 0,
    };
    pub(crate) const ZERO: Value = Value {
        handle: 0,
        lru: ztier_base::NONE,
        length: ZERO_TAG,
    };

    pub(crate) fn stored(handle: Handle, length: usize, lru: u32) -> Value {
        debug_assert!(length > 0 && length < ZERO_TAG as usize);
        Value {
            handle: handle.raw(),
            lru,
            length: length as u16,
        }
    }

    pub(crate) fn is_empty(self) -> bool {
        self.length == 0
    }
    pub(crate) fn is_zero(self) -> bool {
        self.length == ZERO_TAG
    }
    /// The handle, length and LRU node of a stored page.
    pub(crate) fn entry(self) -> Option<(Handle, usize, u32)> {
        if self.is_empty() || self.is_zero() {
            return None;
        }
        Handle::from_raw(self.handle).map(|h| (h, self.length as usize, self.lru))
    }
}

#[derive(Default)]
struct Node {
    table: Option<Box<[Value]>>,
    live: u16,
}

/// The whole index.
pub(crate) struct Tree {
    nodes: Box<[Mutex<Node>]>,
}

/// One run's node, locked.
pub(crate) struct Locked<'a> {
    node: MutexGuard<'a, Node>,
    at: usize,
}

impl Tree {
    pub(crate) fn new(slots: u64) -> Tree {
        let runs = slots.div_ceil(LEAF as u64) as usize;
        Tree {
            nodes: (0..runs).map(|_| Mutex::default()).collect(),
        }
    }

    /// Locks the node of `slot` (which the caller has checked is below the device's slots).
    pub(crate) fn lock(&self, slot: u64) -> Locked<'_> {
        Locked {
            node: self.nodes[slot as usize / LEAF].lock(),
            at: slot as usize % LEAF,
        }
    }

    /// Bytes the index holds: the node array and every table.
    pub(crate) fn bytes(&self) -> u64 {
        let tables: u64 = self
            .nodes
            .iter()
            .map(|n| n.lock().table.is_some() as u64)
            .sum();
        (self.nodes.len() * std::mem::size_of::<Mutex<Node>>()) as u64
            + tables * (LEAF * std::mem::size_of::<Value>()) as u64
    }
}

impl Locked<'_> {
    pub(crate) fn get(&self) -> Value {
        self.node
            .table
            .as_ref()
            .map_or(Value::EMPTY, |t| t[self.at])
    }

    /// Sets the slot's value; returns the one it replaces.
    pub(crate) fn set(&mut self, value: Value) -> Value {
        let node = &mut *self.node;
        let old = node.table.as_ref().map_or(Value::EMPTY, |t| t[self.at]);
        match (old.is_empty(), value.is_empty()) {
            (true, true) => return old,
            (true, false) => node.live += 1,
            (false, true) => node.live -= 1,
            (false, false) => {}
        }
        if node.live == 0 {
            node.table = None;
        } else {
            node.table
                .get_or_insert_with(|| vec![Value::EMPTY; LEAF].into_boxed_slice())[self.at] =
                value;
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Value>(), 16);
    }

    #[test]
    fn tables_come_and_go_with_their_pages() {
        let tree = Tree::new(3 * LEAF as u64);
        let base = tree.bytes();
        let h = Handle::from_raw(7).unwrap();
        let mut n = tree.lock(100);
        assert!(n.set(Value::stored(h, 100, 3)).is_empty());
        drop(n);
        assert!(tree.bytes() > base);
        tree.lock(101).set(Value::ZERO);
        assert_eq!(tree.lock(100).get().entry(), Some((h, 100, 3)));
        assert!(tree.lock(101).get().is_zero());
        assert_eq!(tree.lock(100).set(Value::EMPTY).entry(), Some((h, 100, 3)));
        assert!(tree.bytes() > base, "slot 101 still holds a zero page");
        tree.lock(101).set(Value::EMPTY);
        assert_eq!(tree.bytes(), base);
        assert!(tree.lock(5).get().is_empty());
    }
}
