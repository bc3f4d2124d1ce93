//! The decompressed-unit cache: on a device of units larger than a page, a read of part of
//! a unit decompresses the whole unit into its shard's cache, and the reads of its other
//! pages that usually follow (a sequential reader, swap readahead, a fault-around) copy
//! from there instead of decompressing the unit again. A device of page-sized units has no
//! cache: its reads take the kernel's path, unchanged.
//!
//! Bounds: each shard keeps at most [`CACHE_BYTES_PER_SHARD`] of decompressed units (two
//! 64 KiB units, eight 16 KiB ones), in one anonymous mapping made on the shard's first
//! fill, so the whole cache is at most `SHARDS` × that (2 MiB) and a thread's hits take only
//! its own shard's lock, no shared one. The mappings are counted by
//! [`Device::unit_cache_bytes`](crate::Device::unit_cache_bytes) (beside `mem_used_total`,
//! which stays the pool's pages, the kernel's figure) and go back to the OS, unmapped, on
//! `compact` (the memory-pressure hook), `mark_idle` (the device ages) and `reset`.
//!
//! # What makes an entry valid
//! Every change to a unit's content (a write, a partial write's read-modify-write, a
//! discard, a reset, a recompression, and a writeback's commit, which changes where the
//! unit is, not its bytes) frees the slot's old content through `free_slot`, under
//! the slot's lock; `free_slot` adds one to the unit's stripe of the device's generation
//! counters ([`Generations`], `unit % GENERATION_STRIPES`) there. An entry records the
//! stripe's value loaded *before* its fill took the slot lock, and is served only if the
//! value loaded *under* the slot lock at the read equals it:
//! - the value loaded before the fill is at most the value at the fill's critical section
//!   (a bump after that section happens after the load: the lock's release orders them);
//! - the value under the read's lock counts every change made to the unit before it (each
//!   change bumped it under the same slot lock, which orders it before the read);
//! - counters only grow (`u64`, never wrapping), so one change after the fill makes them
//!   differ. A bump from another unit of the stripe costs a miss, never a stale hit.
//!
//! Handles are not what validates: a freed handle may be handed to another unit's object,
//! and a compaction moves objects under unchanged handles; the generation counts changes of
//! the unit itself, whatever its handle. A compaction-move leaves the unit's bytes as they
//! were, so an entry stays right through it (compaction drops the caches anyway, to give
//! their memory back).
//!
//! # Lock order
//! Taken inside the calling thread's `Device::shards` lock (the cache is part of the shard),
//! then the unit's `Slot` lock for the check; the generation counters are atomics, no lock.
//! Dropping every shard's cache (`compact`, `mark_idle`) takes the shards one at a time,
//! holding nothing else; `reset` drops them with every shard held.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ztier_base::mapping::MappedBytes;

/// Bytes of decompressed units one shard may keep.
pub(crate) const CACHE_BYTES_PER_SHARD: usize = 128 << 10;

/// Units a shard's cache holds at most (the smallest larger unit, 8 KiB, would fit 16).
const MAX_WAYS: usize = 8;

/// Stripes of the generation counters: a unit's is `unit % GENERATION_STRIPES`.
pub(crate) const GENERATION_STRIPES: usize = 1024;

/// Per-unit change counters, striped (see the module's header): empty on a device of
/// page-sized units, where nothing is cached.
pub(crate) struct Generations(Box<[AtomicU64]>);

impl Generations {
    /// Counters for a device whose units are `unit_size` bytes on pages of `page_size`.
    pub(crate) fn new(unit_size: usize, page_size: usize) -> Generations {
        let stripes = if unit_size > page_size {
            GENERATION_STRIPES
        } else {
            0
        };
        Generations((0..stripes).map(|_| AtomicU64::new(0)).collect())
    }

    /// Records a change of unit `index`'s content; called under its slot lock.
    pub(crate) fn bump(&self, index: u64) {
        if let Some(g) = self.stripe(index) {
            g.fetch_add(1, Relaxed);
        }
    }

    /// Unit `index`'s stripe's count now (0 on a device without a cache).
    pub(crate) fn get(&self, index: u64) -> u64 {
        self.stripe(index).map_or(0, |g| g.load(Relaxed))
    }

    fn stripe(&self, index: u64) -> Option<&AtomicU64> {
        let n = self.0.len() as u64;
        (n != 0).then(|| &self.0[(index % n) as usize])
    }

    /// Bytes the counters take.
    pub(crate) fn bytes(&self) -> u64 {
        std::mem::size_of_val(&*self.0) as u64
    }
}

/// What a way of the cache holds.
#[derive(Debug, Clone, Copy)]
struct Tag {
    unit: u64,
    /// The unit's generation stripe's count loaded before the fill.
    generation: u64,
    /// The cache's clock at its last use: the least recently used way is refilled first.
    used: u64,
}

/// One shard's cache: up to `ways` units of `unit_size` bytes.
#[derive(Default)]
pub(crate) struct UnitCache {
    /// The units' bytes, way `w` at `w * unit_size`; made on the first fill.
    bytes: Option<MappedBytes>,
    tags: [Option<Tag>; MAX_WAYS],
    clock: u64,
}

/// A way of the cache, found or chosen for a fill.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Way(usize);

impl UnitCache {
    /// Ways for units of `unit_size` bytes.
    fn ways(unit_size: usize) -> usize {
        (CACHE_BYTES_PER_SHARD / unit_size).clamp(1, MAX_WAYS)
    }

    /// The way holding unit `unit`, and the generation it was filled at.
    pub(crate) fn find(&mut self, unit: u64) -> Option<(Way, u64)> {
        let w = self
            .tags
            .iter()
            .position(|t| t.is_some_and(|t| t.unit == unit))?;
        let tag = self.tags[w].as_mut().expect("found");
        self.clock += 1;
        tag.used = self.clock;
        Some((Way(w), tag.generation))
    }

    /// The bytes of a way found or filled.
    pub(crate) fn unit(&self, way: Way, unit_size: usize) -> &[u8] {
        let bytes = self.bytes.as_deref().unwrap_or_default();
        &bytes[way.0 * unit_size..(way.0 + 1) * unit_size]
    }

    /// Forgets what a way holds (a fill that failed, an entry found stale).
    pub(crate) fn forget(&mut self, way: Way) {
        self.tags[way.0] = None;
    }

    /// A way to fill (an empty one, else the least recently used), emptied, and its bytes to
    /// decompress a unit of `unit_size` into; `None` if the cache's mapping cannot be made
    /// (the read then goes uncached).
    pub(crate) fn fill(&mut self, unit_size: usize) -> Option<(Way, &mut [u8])> {
        let ways = UnitCache::ways(unit_size);
        if self.bytes.is_none() {
            self.bytes = Some(MappedBytes::new(ways * unit_size).ok()?);
        }
        let w = (0..ways)
            .min_by_key(|&w| self.tags[w].map_or(0, |t| t.used))
            .expect("at least one way");
        self.tags[w] = None;
        let bytes = self.bytes.as_deref_mut().expect("made above");
        Some((Way(w), &mut bytes[w * unit_size..(w + 1) * unit_size]))
    }

    /// Records that way `way` now holds `unit` as of `generation` (after a fill succeeded).
    pub(crate) fn filled(&mut self, way: Way, unit: u64, generation: u64) {
        self.clock += 1;
        self.tags[way.0] = Some(Tag {
            unit,
            generation,
            used: self.clock,
        });
    }

    /// Empties the cache and gives its memory back to the OS.
    pub(crate) fn clear(&mut self) {
        self.tags = [None; MAX_WAYS];
        self.bytes = None;
    }

    /// Bytes of memory the cache holds.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.as_ref().map_or(0, |b| b.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fill_takes_the_least_recently_used_way() {
        let unit = 64 << 10;
        let mut cache = UnitCache::default();
        for u in [10, 11] {
            let (way, bytes) = cache.fill(unit).unwrap();
            bytes[0] = u as u8;
            cache.filled(way, u, 7);
        }
        assert_eq!(cache.bytes(), CACHE_BYTES_PER_SHARD as u64);
        // 10 used last: 11 goes.
        let (way, g) = cache.find(10).unwrap();
        assert_eq!((cache.unit(way, unit)[0], g), (10, 7));
        let (way, _) = cache.fill(unit).unwrap();
        cache.filled(way, 12, 8);
        assert!(cache.find(11).is_none() && cache.find(10).is_some());
        cache.clear();
        assert!(cache.find(10).is_none());
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn generations_only_on_larger_units() {
        let none = Generations::new(4096, 4096);
        none.bump(3);
        assert_eq!((none.get(3), none.bytes()), (0, 0));
        let g = Generations::new(65536, 4096);
        g.bump(3);
        g.bump(3 + GENERATION_STRIPES as u64);
        assert_eq!((g.get(3), g.get(4)), (2, 0));
    }
}
