//! The legacy mode's per-thread slot caches (`mm/swap_slots.c`, removed by the rework):
//! a thread takes order-0 slots from its cache of up to [`SWAP_SLOTS_CACHE_SIZE`], refilled
//! in one batch under the device lock; the last reference to a slot puts it in the thread's
//! return cache (the slot marked freeing: neither free nor in use), flushed in one batch
//! under the device lock when full. Larger orders bypass the caches, under the device lock.
//!
//! Lock order: the thread's cache, its current-cluster shard, the device lock, a cluster
//! lock. A put takes the slot's cluster lock alone first and lets go of it before the cache.

use super::Inner;
use crate::cluster::{SWAPFILE_CLUSTER, SWAP_MAP_BAD, SWAP_MAP_FREEING, SWAP_MAP_MAX};
use crate::SwapError;

/// Slots a thread caches (`SWAP_SLOTS_CACHE_SIZE`, `SWAP_BATCH`).
pub const SWAP_SLOTS_CACHE_SIZE: usize = 64;

/// One thread's caches.
#[derive(Debug, Default)]
pub(crate) struct SlotCache {
    /// Allocated ahead, handed out last first.
    slots: Vec<u32>,
    /// Freed by their last put, waiting for the batch.
    ret: Vec<u32>,
}

impl Inner {
    /// An order-0 slot from the thread's cache.
    pub(crate) fn legacy_alloc_cached(&self, cpu: usize, order: u32) -> Option<u32> {
        if order != 0 {
            return None;
        }
        self.caches.at(cpu).slots.pop()
    }

    /// Order 0: refills the thread's cache (up to 64 slots under one hold of the device
    /// lock) and takes one; larger orders: one allocation under the device lock.
    pub(crate) fn legacy_alloc_refill(&self, cpu: usize, order: u32) -> Option<u32> {
        if order != 0 {
            let mut pc = self.percpu.at(cpu);
            let mut held = Some(self.lists.lock(&self.device_lock));
            return self.alloc_with_next(&mut pc.0[order as usize], order, &mut held);
        }
        let mut cache = self.caches.at(cpu);
        if let Some(slot) = cache.slots.pop() {
            return Some(slot);
        }
        let mut pc = self.percpu.at(cpu);
        let mut held = Some(self.lists.lock(&self.device_lock));
        self.legacy_fill(&mut cache, &mut pc.0[0], &mut held);
        if cache.slots.is_empty() && self.discard_for_room(&mut held) {
            self.legacy_fill(&mut cache, &mut pc.0[0], &mut held);
        }
        // Handed out last first, so the thread writes its slots in ascending order.
        cache.slots.reverse();
        cache.slots.pop()
    }

    /// Allocates order-0 slots into the cache until it is full or the device has none.
    fn legacy_fill(&self, cache: &mut SlotCache, next: &mut u32, held: &mut super::Held<'_>) {
        while cache.slots.len() < SWAP_SLOTS_CACHE_SIZE {
            let found = self
                .alloc_cached(next, 0, held)
                .or_else(|| self.alloc_new_cluster(next, 0, held));
            match found {
                Some(slot) => cache.slots.push(slot),
                None => break,
            }
        }
    }

    /// Drops a reference: a count above one is decremented in place; the last reference
    /// sends the slot to the thread's return cache, flushed when it is full.
    pub(crate) fn legacy_put(&self, cpu: usize, offset: u64) -> Result<(), SwapError> {
        let (id, i) = self.locate(offset)?;
        {
            // A cluster never used holds no slot.
            let Some(lock) = self.clusters.get(id) else {
                return Err(SwapError::NotAllocated { offset });
            };
            let mut c = lock.lock(&self.cluster_lock);
            match c.map[i] {
                0 | SWAP_MAP_BAD | SWAP_MAP_FREEING => {
                    return Err(SwapError::NotAllocated { offset });
                }
                1 => c.map[i] = SWAP_MAP_FREEING,
                n => {
                    debug_assert!(n <= SWAP_MAP_MAX);
                    c.map[i] = n - 1;
                    return Ok(());
                }
            }
        }
        let mut cache = self.caches.at(cpu);
        cache.ret.push(offset as u32);
        if cache.ret.len() >= SWAP_SLOTS_CACHE_SIZE {
            self.legacy_flush(&mut cache.ret);
        }
        Ok(())
    }

    /// Frees a batch of slots marked freeing, under one hold of the device lock.
    fn legacy_flush(&self, ret: &mut Vec<u32>) {
        if ret.is_empty() {
            return;
        }
        ret.sort_unstable();
        let mut held = Some(self.lists.lock(&self.device_lock));
        for group in ret.chunk_by(|a, b| a / SWAPFILE_CLUSTER == b / SWAPFILE_CLUSTER) {
            let id = group[0] / SWAPFILE_CLUSTER;
            let mut c = self.clusters.at(id).lock(&self.cluster_lock);
            let (mut freed, mut runs) = (0u16, 0u16);
            for &slot in group {
                let i = (slot % SWAPFILE_CLUSTER) as usize;
                if c.map[i] == SWAP_MAP_FREEING {
                    c.map[i] = 0;
                    freed += 1;
                    runs += u16::from(super::run_is_free(&c, i));
                }
            }
            self.release_slots(&mut c, id, freed, runs, &mut held);
            self.counters
                .add(super::Count::Freed.at(0), u64::from(freed));
        }
        ret.clear();
    }

    /// Every thread's caches back to the device.
    pub(crate) fn drain_slot_caches(&self) {
        if self.config.mode != crate::Mode::Legacy {
            return;
        }
        self.caches.for_each(|cache| {
            let mut slots = std::mem::take(&mut cache.slots);
            let mut held = Some(self.lists.lock(&self.device_lock));
            slots.sort_unstable();
            for group in slots.chunk_by(|a, b| a / SWAPFILE_CLUSTER == b / SWAPFILE_CLUSTER) {
                let id = group[0] / SWAPFILE_CLUSTER;
                let idx: Vec<usize> = group
                    .iter()
                    .map(|s| (s % SWAPFILE_CLUSTER) as usize)
                    .collect();
                // Cached slots were allocated with a count of one: dropping it frees them.
                let _ = self.put_in_cluster(id, &idx, &mut held);
            }
            drop(held);
            self.legacy_flush(&mut cache.ret);
        });
    }
}
