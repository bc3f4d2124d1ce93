//! The devices with free slots, in priority order (the kernel's `swap_avail_head` and
//! `swap_avail_lock`), and each device's in-use counter with its off-list bit.
//!
//! A device is on the list exactly when its counter's [`OFFLIST_BIT`] is clear. The bit is
//! set and cleared only under the list's lock, but the counter moves without it: an
//! allocation that makes the device full (`in use == pages`, bit clear) takes it off the
//! list; a free that finds the bit set puts it back. So the common allocation and free take
//! no global lock at all, only the one that fills the device or the first that frees it.
//!
//! Order among devices: higher priority first; equal priorities in turn (a device tried is
//! requeued behind the others of its priority, `plist_requeue`).

use std::sync::Arc;

use crate::lockstat::{CountedMutex, LockStats};
use crate::sync::{AtomicU64, Ordering};

/// Set while the device is off the available list (`SWAP_USAGE_OFFLIST_BIT`).
pub(crate) const OFFLIST_BIT: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    priority: i16,
    id: u8,
}

/// The available list.
pub(crate) struct Avail {
    list: CountedMutex<Vec<Entry>>,
    pub(crate) lock_stats: LockStats,
}

impl Avail {
    pub(crate) fn new() -> Arc<Avail> {
        Arc::new(Avail {
            list: CountedMutex::new(Vec::new()),
            lock_stats: LockStats::new("swap_avail_lock"),
        })
    }

    /// The devices on the list, in the order to try them.
    pub(crate) fn ids(&self) -> Vec<u8> {
        self.list
            .lock(&self.lock_stats)
            .iter()
            .map(|e| e.id)
            .collect()
    }

    pub(crate) fn contains(&self, id: u8) -> bool {
        self.list.lock(&self.lock_stats).iter().any(|e| e.id == id)
    }

    /// Moves device `id` behind the others of its priority.
    pub(crate) fn requeue(&self, id: u8) {
        let mut list = self.list.lock(&self.lock_stats);
        if let Some(at) = list.iter().position(|e| e.id == id) {
            let entry = list.remove(at);
            insert(&mut list, entry);
        }
    }
}

/// Inserts behind every entry of the same or higher priority.
fn insert(list: &mut Vec<Entry>, entry: Entry) {
    let at = list
        .iter()
        .position(|e| e.priority < entry.priority)
        .unwrap_or(list.len());
    list.insert(at, entry);
}

/// A device's slots in use, and its membership of the available list.
pub(crate) struct Usage {
    inuse: AtomicU64,
    /// Usable slots: the counter's value when the device is full.
    pages: u64,
    id: u8,
    priority: i16,
    avail: Arc<Avail>,
}

impl Usage {
    /// A device off the list (its bit set) until [`swapon`](Usage::swapon).
    pub(crate) fn new(pages: u64, id: u8, priority: i16, avail: Arc<Avail>) -> Usage {
        Usage {
            inuse: AtomicU64::new(OFFLIST_BIT),
            pages,
            id,
            priority,
            avail,
        }
    }

    pub(crate) fn avail(&self) -> &Avail {
        &self.avail
    }

    /// Puts the device on the list (`add_to_avail_list(si, true)`).
    pub(crate) fn swapon(&self) {
        self.add_to_avail();
    }

    /// Slots in use.
    pub(crate) fn in_use(&self) -> u64 {
        self.inuse.load(Ordering::Relaxed) & !OFFLIST_BIT
    }

    /// Whether the device is off the available list.
    pub(crate) fn off_list(&self) -> bool {
        self.inuse.load(Ordering::Relaxed) & OFFLIST_BIT != 0
    }

    /// `swap_usage_add()`: `n` more slots in use; the allocation that fills the device
    /// takes it off the list.
    pub(crate) fn add(&self, n: u64) {
        let val = self.inuse.fetch_add(n, Ordering::AcqRel) + n;
        if val == self.pages {
            self.del_from_avail();
        }
    }

    /// `swap_usage_sub()`: `n` fewer in use; a device off the list comes back.
    pub(crate) fn sub(&self, n: u64) {
        let val = self.inuse.fetch_sub(n, Ordering::AcqRel) - n;
        if val & OFFLIST_BIT != 0 {
            self.add_to_avail();
        }
    }

    /// Sets the off-list bit if the device is exactly full with the bit clear (under the
    /// list's lock, the only place the bit is set).
    fn set_offlist_if_full(&self) -> bool {
        self.inuse
            .compare_exchange(
                self.pages,
                self.pages | OFFLIST_BIT,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Takes the device off the list if it is full and on it; a free since, or another
    /// caller that took it off first, makes this do nothing.
    fn del_from_avail(&self) {
        let mut list = self.avail.list.lock(&self.avail.lock_stats);
        if self.set_offlist_if_full() {
            list.retain(|e| e.id != self.id);
        }
    }

    /// Puts the device back on the list if it is off it and not full.
    fn add_to_avail(&self) {
        let mut list = self.avail.list.lock(&self.avail.lock_stats);
        if self.inuse.load(Ordering::Acquire) & OFFLIST_BIT == 0 {
            return;
        }
        let old = self.inuse.fetch_and(!OFFLIST_BIT, Ordering::AcqRel);
        // Full again (an allocation since the free that called us): no allocation will see
        // `in use == pages` happen, so keep it off. The kernel compares the old value, bit
        // and all, which never equals `pages`; its comment says this is what it means.
        if old & !OFFLIST_BIT == self.pages && self.set_offlist_if_full() {
            return;
        }
        insert(
            &mut list,
            Entry {
                priority: self.priority,
                id: self.id,
            },
        );
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn priorities_order_the_list_and_equals_take_turns() {
        let avail = Avail::new();
        let usages: Vec<Usage> = [(0u8, 5i16), (1, 10), (2, 5), (3, -1)]
            .into_iter()
            .map(|(id, prio)| Usage::new(100, id, prio, Arc::clone(&avail)))
            .collect();
        for u in &usages {
            u.swapon();
        }
        assert_eq!(avail.ids(), [1, 0, 2, 3]);
        avail.requeue(0);
        assert_eq!(avail.ids(), [1, 2, 0, 3]);
        avail.requeue(1);
        assert_eq!(avail.ids(), [1, 2, 0, 3], "alone at its priority");
    }

    #[test]
    fn a_full_device_leaves_and_a_free_brings_it_back() {
        let avail = Avail::new();
        let u = Usage::new(4, 7, 0, Arc::clone(&avail));
        assert!(u.off_list() && !avail.contains(7), "off until swapon");
        u.swapon();
        assert!(!u.off_list() && avail.contains(7));
        u.add(3);
        assert!(avail.contains(7));
        u.add(1);
        assert!(u.off_list() && !avail.contains(7), "full");
        assert_eq!(u.in_use(), 4);
        u.sub(2);
        assert!(!u.off_list() && avail.contains(7));
        assert_eq!(u.in_use(), 2);
        u.add(2);
        assert!(u.off_list());
    }
}
