//! The index by swap slot (the kernel's `zswap_trees`, one xarray per 64 MiB of swap): for
//! each run of 64 slots (an xarray leaf's worth), a bitmap of the slots that hold a value
//! and those [`Value`]s packed in slot order, under the run's own lock. A stored page costs
//! its 16-byte value (and the packed array's slack, at most as many again, reclaimed as the
//! run empties) however sparse its run is: under churn (pages written back or swapped in
//! in no order) a table of 64 values would cost a kilobyte for a few pages. A lookup is a
//! popcount; a lookup in one run never waits for another's. The packed values are a ring
//! (`VecDeque`), so taking one out moves the values on its shorter side: pages loaded or
//! stored in slot order, as a process's swap-in and swap-out mostly are, move none (a
//! `Vec` moved every value after the one taken out).
//!
//! Invariants: a node's `values` holds exactly one value, not empty, per bit set in
//! `present`, in slot order, and no room once it holds none. A value's handle and length
//! change only under its slot's page lock (see the crate's lock order) and its node's lock,
//! so a holder of the page lock can read them once and use them after dropping the node's
//! lock; its LRU node may also be moved by the LRU's compaction under the node's lock, so
//! it is used only under the node's lock.

use std::collections::VecDeque;

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

/// One run of 64 slots: which hold a value (a bit each), and those values packed in slot
/// order, so a run costs 16 bytes a page it holds however sparse it is.
#[derive(Default)]
struct Node {
    present: u64,
    values: VecDeque<Value>,
}

impl Node {
    /// Where slot `at`'s value is (or would go) in `values`.
    fn rank(&self, at: usize) -> usize {
        (self.present & ((1u64 << at) - 1)).count_ones() as usize
    }
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

    /// Bytes the index holds: the node array and every node's values.
    pub(crate) fn bytes(&self) -> u64 {
        let values: u64 = self
            .nodes
            .iter()
            .map(|n| n.lock().values.capacity() as u64)
            .sum();
        (self.nodes.len() * std::mem::size_of::<Mutex<Node>>()) as u64
            + values * std::mem::size_of::<Value>() as u64
    }
}

impl Locked<'_> {
    pub(crate) fn get(&self) -> Value {
        if self.node.present & (1u64 << self.at) == 0 {
            return Value::EMPTY;
        }
        self.node.values[self.node.rank(self.at)]
    }

    /// Sets the slot's value; returns the one it replaces.
    pub(crate) fn set(&mut self, value: Value) -> Value {
        let node = &mut *self.node;
        let bit = 1u64 << self.at;
        let i = node.rank(self.at);
        let held = node.present & bit != 0;
        match (held, value.is_empty()) {
            (false, true) => Value::EMPTY,
            (false, false) => {
                node.present |= bit;
                node.values.insert(i, value);
                Value::EMPTY
            }
            (true, false) => std::mem::replace(&mut node.values[i], value),
            (true, true) => {
                node.present &= !bit;
                let old = node.values.remove(i).expect("a value per bit set");
                let len = node.values.len();
                if len == 0 {
                    node.values = VecDeque::new();
                } else if len <= node.values.capacity() / 2 {
                    node.values.shrink_to(len + len / 4);
                }
                old
            }
        }
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

    /// The packed values follow a model of 64 slots through sets in any order, and the
    /// room they take stays within twice what they hold.
    #[test]
    fn packed_values_follow_a_model() {
        let tree = Tree::new(LEAF as u64);
        let base = tree.bytes();
        let mut model = [Value::EMPTY; LEAF];
        let mut rng = ztier_base::rng::Rng::from_state(12345);
        for step in 0..20_000u64 {
            let x = rng.next_u64();
            let at = (x % LEAF as u64) as usize;
            let value = match (x >> 8) % 3 {
                0 => Value::EMPTY,
                1 => Value::ZERO,
                _ => Value::stored(
                    Handle::from_raw(step + 1).unwrap(),
                    1 + (x >> 20) as usize % 4000,
                    step as u32,
                ),
            };
            assert_eq!(tree.lock(at as u64).set(value), model[at]);
            model[at] = value;
            for (s, v) in model.iter().enumerate() {
                assert_eq!(tree.lock(s as u64).get(), *v);
            }
            let held = model.iter().filter(|v| !v.is_empty()).count() as u64;
            let room = tree.bytes() - base;
            assert!(
                room <= (2 * held).max(4) * 16,
                "{room} bytes for {held} values"
            );
        }
    }
}
