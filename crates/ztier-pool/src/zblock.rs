//! zblock: the block allocator for compressed pages (Vitaly Wool's `mm/zblock.{c,h}` as last
//! posted, with its Rust version's wider table).
//!
//! A block is 2^n pages (1, 2, 4, 8; optionally 3, 5, 6) holding a whole number of equal
//! slots after the kernel's in-block header. Each block type {slot size, slots per block,
//! pages} has its own list. The type table is computed when the pool is made, for its page
//! size: of every (pages, slots) candidate, keep those no larger-slotted candidate beats on
//! bytes per object (the Pareto frontier of slot size against footprint), so an object goes
//! to the type that stores it in the fewest bytes. A size → type table indexed by 16-byte
//! steps makes the lookup one load.
//!
//! Objects larger than a page (zram's 16 and 64 KiB compression units; `max_object`, which
//! the kernel's zblock does not have): the page's table stays as it is, and types for the
//! larger objects follow it, computed the same way (a frontier of slot size against bytes
//! an object) from blocks of at most [`LARGE_BLOCK_FACTOR`] times a slot's fewest pages (as
//! zsmalloc's classes above a page chain up to four times an object's fewest pages), each
//! with a larger slot than any of the page's types. A handle names up to 256 types; the
//! page's table keeps the Rust version's 64. zblock's in-block header keeps a slot from
//! filling whole pages, so a unit stored raw costs a little more than on zsmalloc (64 KiB:
//! four slots in a block of 65 pages, 66 560 bytes each, against zsmalloc's 16 pages).
//!
//! Each type keeps its non-full blocks on an "active" list and takes slots from its first
//! block; a block that fills leaves the list and comes back (at the tail) when a slot is freed,
//! and a block whose last slot is freed is given back at once. So a new block is allocated
//! only when no block of the type has a free slot; v2's single list, where `[full] ->
//! [partial] -> ...` made it allocate while partial blocks held free slots, cannot happen.
//!
//! Handles carry type, block id, slot and a per-slot generation, so freed and foreign handles
//! are refused.
//!
//! # Lock ordering
//! `BlockList` (one per type) → `Arena::state`. Every access to a type's blocks, slots and
//! bytes happens under its list lock; lists never lock each other.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use ztier_base::list::{Linked, Links, List};
use ztier_base::slab::IdSlab;

use crate::arena::{Arena, PageChain};
use crate::handle::{self, Field, PoolTag};
use crate::{Handle, ObjectRef, PoolError, Result, ZPool};

/// Block sizes in pages: the kernel's powers of two, and the Rust version's extra sizes.
pub const BLOCK_PAGES: [usize; 4] = [1, 2, 4, 8];
pub const BLOCK_PAGES_EXTRA: [usize; 3] = [3, 5, 6];
/// Slot sizes are multiples of this (the Rust version's alignment).
const SLOT_ALIGN: usize = 16;
/// At most this many types for objects up to a page (the Rust version's 6 handle bits).
const MAX_PAGE_TYPES: usize = 64;
/// At most this many types in all: the page's, then those for larger objects.
const MAX_TYPES: usize = 256;
/// A block for objects larger than a page has at most this many times the fewest pages one
/// of its slots needs (zsmalloc's `LARGE_CHAIN_FACTOR`).
pub const LARGE_BLOCK_FACTOR: usize = 4;

// Handle layout (u64; `crate::handle` packs it):
//   63        54 53      43 42     35 34                   9 8        1 0
//  | pool (10)  | gen (11)  | type (8) | block id (26)        | slot (8)  |1|
// 2^26 blocks of a type hold 256 GiB at the smallest block, a 4 KiB page.
const H_SLOT: Field = Field::after(handle::TAG_BIT, 8);
const H_BLOCK: Field = Field::after(H_SLOT, 26);
const H_TYPE: Field = Field::after(H_BLOCK, 8);
const H_GEN: Field = Field::after(H_TYPE, 11);
const _: () = assert!(H_GEN.end() == 64 - handle::POOL_TAG_BITS);
const _: () = assert!(H_TYPE.max() + 1 >= MAX_TYPES as u64);

/// Slots per block at most (the kernel's `MAX_SLOTS`: a bitmap of `1 << SLOT_BITS`).
fn max_slots(page_size: usize) -> usize {
    if page_size <= 4096 {
        32
    } else {
        256
    }
}

/// `ZBLOCK_HEADER_SIZE`: the kernel's block header (list links, slot bitmap, free count),
/// kept inside the block so the density matches the kernel's.
fn header_size(page_size: usize) -> usize {
    let bitmap = max_slots(page_size) / 8;
    (16 + bitmap.max(8) + 4).next_multiple_of(8)
}

/// One block type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BlockType {
    pub slot_size: usize,
    pub slots_per_block: usize,
    pub pages: usize,
}

impl BlockType {
    /// Pool bytes per object when blocks are full.
    fn footprint(&self, page_size: usize) -> f64 {
        (self.pages * page_size) as f64 / self.slots_per_block as f64
    }
}

/// The pool's block types and its size → type lookup.
#[derive(Debug, Clone)]
pub struct BlockTable {
    pub page_size: usize,
    /// The largest object: the page size, or a larger power of two up to 64 KiB.
    pub max_object: usize,
    pub types: Vec<BlockType>,
    /// Type for sizes in `(16 (i - 1), 16 i]`.
    lookup: Vec<u8>,
}

/// The types worth having among `candidates`, for objects of up to `reach` bytes: from the
/// largest slots down, a candidate is kept only if it stores objects in fewer bytes than
/// every larger-slotted type already kept (the Pareto frontier of slot size against
/// footprint); then, if more than `max_types`, thinned (see below). In ascending slot size.
fn frontier(
    mut candidates: Vec<BlockType>,
    page_size: usize,
    reach: usize,
    max_types: usize,
) -> Vec<BlockType> {
    // No object exceeds `reach`, so every slot of `reach` or more is as good as `reach`.
    let reached = |t: &BlockType| t.slot_size.min(reach);
    candidates.sort_by(|a, b| {
        reached(b).cmp(&reached(a)).then(
            a.footprint(page_size)
                .total_cmp(&b.footprint(page_size))
                .then(a.pages.cmp(&b.pages)),
        )
    });
    let mut types: Vec<BlockType> = Vec::new();
    for c in candidates {
        if types
            .last()
            .is_none_or(|l| c.footprint(page_size) < l.footprint(page_size))
        {
            types.push(c);
        }
    }
    // More types than the handle can name: keep, from the largest down, only the types
    // whose objects would pay more than `ratio` times their footprint in the next larger
    // kept type; the smallest ratio that fits bounds every object's overhead against the
    // best type for it.
    let thin = |ratio: f64| -> Vec<BlockType> {
        let mut kept: Vec<BlockType> = Vec::new();
        for t in &types {
            if kept
                .last()
                .is_none_or(|l| l.footprint(page_size) > ratio * t.footprint(page_size))
            {
                kept.push(*t);
            }
        }
        kept
    };
    let (mut lo, mut hi) = (1.0, 2.0);
    for _ in 0..40 {
        let mid = (lo + hi) / 2.0;
        if thin(mid).len() <= max_types {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    let mut types = if types.len() <= max_types {
        types
    } else {
        thin(hi)
    };
    types.reverse();
    types
}

/// The blocks a type for objects larger than a page may have: `pages` pages of `slots`
/// equal slots, each larger than `above`, in at most [`LARGE_BLOCK_FACTOR`] times the
/// fewest pages one slot needs (as zsmalloc chains its zspages above a page). Their
/// frontier is the larger objects' types. The bound on a block's pages matters: each type
/// in use keeps one block partly filled, and a frontier of blocks of up to 64 pages cost
/// more than it saved on a small device (the bundled sample at 64 KiB units held 3.4 times
/// zsmalloc's memory).
fn larger_candidates(page_size: usize, above: usize, max_object: usize) -> Vec<BlockType> {
    let header = header_size(page_size);
    let most_pages = LARGE_BLOCK_FACTOR * (max_object + header).div_ceil(page_size);
    candidates(page_size, 1..=most_pages)
        .filter(|t| {
            t.slot_size > above
                && t.pages <= LARGE_BLOCK_FACTOR * (t.slot_size + header).div_ceil(page_size)
        })
        .collect()
}

/// Every block type of `pages` pages (each count in turn) cut into 1 to `max_slots` equal
/// slots after the header, slots of at least 16 bytes.
fn candidates(
    page_size: usize,
    pages: impl Iterator<Item = usize>,
) -> impl Iterator<Item = BlockType> {
    let header = header_size(page_size);
    pages
        .flat_map(move |pages| {
            (1..=max_slots(page_size)).map(move |slots| BlockType {
                slot_size: ((pages * page_size - header) / slots) / SLOT_ALIGN * SLOT_ALIGN,
                slots_per_block: slots,
                pages,
            })
        })
        .filter(|t| t.slot_size >= SLOT_ALIGN)
}

impl BlockTable {
    /// Computes the table for `page_size` from blocks of `block_pages` pages.
    pub fn new(page_size: usize, block_pages: &[usize]) -> BlockTable {
        BlockTable::with_max_object(page_size, block_pages, page_size)
    }

    /// The page's table from blocks of `block_pages` pages, then types for objects up to
    /// `max_object` bytes (a power of two from the page size up to 64 KiB; the page size
    /// gives the page's table alone; see `larger_candidates`), each with a larger slot than the
    /// page's largest. Panics on any other `max_object` (`ZblockPool::new` refuses them with
    /// an error first).
    pub fn with_max_object(
        page_size: usize,
        block_pages: &[usize],
        max_object: usize,
    ) -> BlockTable {
        assert!(
            crate::check_max_object(max_object, page_size).is_ok(),
            "a largest object of {max_object} bytes on pages of {page_size}"
        );
        let mut types = frontier(
            candidates(page_size, block_pages.iter().copied()).collect(),
            page_size,
            page_size,
            MAX_PAGE_TYPES,
        );
        if max_object > page_size {
            let largest = types.last().map_or(0, |t| t.slot_size);
            let room = MAX_TYPES - types.len();
            let larger = larger_candidates(page_size, largest, max_object);
            types.extend(frontier(larger, page_size, max_object, room));
            assert!(types.len() <= MAX_TYPES);
        }
        let lookup = (0..=max_object / SLOT_ALIGN)
            .map(|step| {
                let t = types.partition_point(|t| t.slot_size < step * SLOT_ALIGN);
                t.min(types.len() - 1) as u8
            })
            .collect();
        BlockTable {
            page_size,
            max_object,
            types,
            lookup,
        }
    }

    /// The type storing an object of `len` bytes (1..=max_object).
    pub fn type_for(&self, len: usize) -> usize {
        self.lookup[len.div_ceil(SLOT_ALIGN)] as usize
    }

    /// The smallest length whose object costs its largest object (a page, or a unit) or
    /// more in its type: from here on compression saves nothing, so a front end stores the
    /// page or unit raw.
    pub fn huge_size(&self) -> usize {
        (1..=self.max_object)
            .find(|&len| {
                self.types[self.type_for(len)].footprint(self.page_size) >= self.max_object as f64
            })
            .unwrap_or(self.max_object)
    }
}

/// How a zblock pool is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZblockConfig {
    /// 4096 or 16384.
    pub page_size: usize,
    /// Also use blocks of 3, 5 and 6 pages (the Rust version's sizes).
    pub odd_blocks: bool,
    /// Compressed lengths from here on are to be stored raw (`ZPool::huge_class_size`);
    /// `None`: zblock's own threshold, [`BlockTable::huge_size`]. The registry sets
    /// zsmalloc's for the same page size, so the two allocators are compared on identical
    /// objects.
    pub huge_class_size: Option<usize>,
    /// The largest object, if above a page: types up to it (a power of two up to 64 KiB,
    /// for zram's large compression units). `None`: objects up to a page.
    pub max_object: Option<usize>,
}

impl Default for ZblockConfig {
    fn default() -> Self {
        ZblockConfig {
            page_size: 4096,
            odd_blocks: false,
            huge_class_size: None,
            max_object: None,
        }
    }
}

/// A zblock pool.
pub struct ZblockPool {
    /// Named by every handle of this pool.
    tag: PoolTag,
    table: BlockTable,
    lists: Box<[BlockList]>,
    arena: Arena,
    /// Compressed lengths from here are stored raw by zram (`ZblockConfig::huge_class_size`).
    huge_class_size: usize,
    pages_allocated: AtomicU64,
}

struct BlockList {
    ty: BlockType,
    /// Protects every block, slot and byte of this type.
    state: Mutex<ListState>,
}

#[derive(Default)]
struct ListState {
    /// Block descriptors by id; freed ids are reused.
    blocks: IdSlab<Block>,
    /// Non-full blocks, allocated from the head (`active_list`).
    active: List,
    /// Blocks of this type (`block_count`).
    block_count: u64,
    /// Slots in use.
    used_slots: u64,
}

/// A block descriptor (`struct zblock_block`, kept beside the block instead of in it).
#[derive(Default)]
struct Block {
    /// Its pages; empty while the id is free.
    pages: PageChain,
    free_slots: u32,
    /// Slot in use, per slot.
    occupied: Vec<bool>,
    /// Per slot: object length (up to 64 KiB, so not a `u16`), and a generation bumped on
    /// every free.
    lens: Vec<u32>,
    generations: Vec<u16>,
    /// On the active list.
    links: Links,
}

impl ZblockPool {
    /// A new, empty pool; refused if the page size is not one zblock supports or a handle's
    /// pool tag can name no more pools.
    pub fn new(config: ZblockConfig) -> Result<ZblockPool> {
        crate::check_page_size(config.page_size)?;
        let max_object = config.max_object.unwrap_or(config.page_size);
        crate::check_max_object(max_object, config.page_size)?;
        let pages: Vec<usize> = if config.odd_blocks {
            let mut p: Vec<usize> = BLOCK_PAGES
                .iter()
                .chain(&BLOCK_PAGES_EXTRA)
                .copied()
                .collect();
            p.sort_unstable();
            p
        } else {
            BLOCK_PAGES.to_vec()
        };
        let table = BlockTable::with_max_object(config.page_size, &pages, max_object);
        let lists = table
            .types
            .iter()
            .map(|&ty| BlockList {
                ty,
                state: Mutex::new(ListState {
                    blocks: IdSlab::with_max_id(H_BLOCK.max() as u32),
                    ..ListState::default()
                }),
            })
            .collect();
        let huge_class_size = config
            .huge_class_size
            .unwrap_or_else(|| table.huge_size())
            .min(max_object);
        Ok(ZblockPool {
            tag: PoolTag::new()?,
            arena: Arena::new(config.page_size),
            table,
            lists,
            huge_class_size,
            pages_allocated: AtomicU64::new(0),
        })
    }

    pub fn table(&self) -> &BlockTable {
        &self.table
    }

    /// Blocks allocated over all types.
    pub fn blocks(&self) -> u64 {
        self.lists.iter().map(|l| l.state.lock().block_count).sum()
    }

    fn encode(&self, ty: usize, block: u32, slot: usize, generation: u16) -> Handle {
        handle::make(
            &self.tag,
            H_GEN.put(generation as u64 & H_GEN.max())
                | H_TYPE.put(ty as u64)
                | H_BLOCK.put(block as u64)
                | H_SLOT.put(slot as u64),
        )
    }

    /// Finds a handle's list, and under its lock, its block and slot.
    fn locate<'a>(
        &'a self,
        handle: Handle,
    ) -> Result<(
        &'a BlockList,
        parking_lot::MutexGuard<'a, ListState>,
        u32,
        usize,
    )> {
        let raw = handle.raw();
        let bits = handle::open(&self.tag, handle)?;
        let ty = H_TYPE.get(bits) as usize;
        let block = H_BLOCK.get(bits) as u32;
        let slot = H_SLOT.get(bits) as usize;
        let generation = H_GEN.get(bits) as u16;
        let unknown = PoolError::UnknownHandle { handle: raw };
        let list = self.lists.get(ty).ok_or(unknown.clone())?;
        let st = list.state.lock();
        let b = st.blocks.get(block).ok_or(unknown.clone())?;
        if slot >= list.ty.slots_per_block || b.pages.is_empty() {
            return Err(if b.pages.is_empty() && slot < list.ty.slots_per_block {
                PoolError::FreedHandle { handle: raw }
            } else {
                unknown
            });
        }
        if b.generations[slot] as u64 & H_GEN.max() != generation as u64 || !b.occupied[slot] {
            return Err(PoolError::FreedHandle { handle: raw });
        }
        Ok((list, st, block, slot))
    }

    fn alloc_inner(&self, len: usize, data: Option<&[u8]>) -> Result<Handle> {
        let page_size = self.table.page_size;
        if len == 0 {
            return Err(PoolError::ZeroSize);
        }
        let max = self.table.max_object;
        if len > max {
            return Err(PoolError::TooLarge { len, max });
        }
        let ty = self.table.type_for(len);
        let list = &self.lists[ty];
        let mut st = list.state.lock();
        let id = match st.active.first() {
            None => {
                let id = st.alloc_block(&list.ty, &self.arena)?;
                self.pages_allocated
                    .fetch_add(list.ty.pages as u64, Ordering::Relaxed);
                id
            }
            Some(id) => id,
        };
        let b = &mut st.blocks[id];
        let slot = b
            .occupied
            .iter()
            .position(|&o| !o)
            .expect("an active block has a free slot");
        b.occupied[slot] = true;
        b.lens[slot] = len as u32;
        b.free_slots -= 1;
        let generation = b.generations[slot];
        if let Some(data) = data {
            b.pages
                .write(slot * list.ty.slot_size + header_size(page_size), data);
        }
        if b.free_slots == 0 {
            let st = &mut *st;
            st.active.remove(st.blocks.items_mut(), id);
        }
        st.used_slots += 1;
        Ok(self.encode(ty, id, slot, generation))
    }

    /// The `blocks` table: one row per type.
    pub fn block_stats(&self) -> Vec<BlockStats> {
        self.lists
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let st = l.state.lock();
                BlockStats {
                    index: i,
                    slot_size: l.ty.slot_size,
                    slots_per_block: l.ty.slots_per_block,
                    pages_per_block: l.ty.pages,
                    blocks: st.block_count,
                    used_slots: st.used_slots,
                }
            })
            .collect()
    }
}

impl ListState {
    /// `alloc_block()`: a new block, all slots free, at the head of the active list.
    fn alloc_block(&mut self, ty: &BlockType, arena: &Arena) -> Result<u32> {
        self.blocks
            .next_id()
            .map_err(|full| PoolError::HandleSpaceFull {
                what: "a block type's block table",
                max: full.capacity,
            })?;
        let pages = arena.alloc_chain(ty.pages)?;
        let slots = ty.slots_per_block;
        let id = self
            .blocks
            .insert_with(|old| {
                // A reused id keeps its slots' generations, so old handles stay refused.
                let generations = old
                    .map(|b| std::mem::take(&mut b.generations))
                    .filter(|g| g.len() == slots)
                    .unwrap_or_else(|| vec![0; slots]);
                Block {
                    pages,
                    free_slots: slots as u32,
                    occupied: vec![false; slots],
                    lens: vec![0; slots],
                    generations,
                    links: Links::default(),
                }
            })
            .expect("room checked");
        self.block_count += 1;
        self.active.push_front(self.blocks.items_mut(), id);
        Ok(id)
    }
}

impl Linked for Block {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}

impl ZPool for ZblockPool {
    fn name(&self) -> &'static str {
        "zblock"
    }

    fn malloc(&self, len: usize) -> Result<Handle> {
        self.alloc_inner(len, None)
    }

    fn store(&self, data: &[u8]) -> Result<Handle> {
        self.alloc_inner(data.len(), Some(data))
    }

    /// `zblock_free()`: a block whose last slot is freed goes back at once; a full block
    /// that gets a free slot rejoins the active list at its tail.
    fn free(&self, handle: Handle) -> Result<()> {
        let (list, mut st, id, slot) = self.locate(handle)?;
        let slots = list.ty.slots_per_block as u32;
        let b = &mut st.blocks[id];
        b.occupied[slot] = false;
        b.generations[slot] = b.generations[slot].wrapping_add(1);
        b.free_slots += 1;
        let free_slots = b.free_slots;
        st.used_slots -= 1;
        if free_slots == slots {
            let st = &mut *st;
            if st.blocks[id].links.is_linked() {
                st.active.remove(st.blocks.items_mut(), id);
            }
            let pages = std::mem::take(&mut st.blocks[id].pages);
            self.arena.free_chain(pages);
            st.blocks.remove(id);
            st.block_count -= 1;
            self.pages_allocated
                .fetch_sub(list.ty.pages as u64, Ordering::Relaxed);
        } else if free_slots == 1 {
            let st = &mut *st;
            st.active.push_back(st.blocks.items_mut(), id);
        }
        Ok(())
    }

    fn write(&self, handle: Handle, data: &[u8]) -> Result<()> {
        let (list, mut st, id, slot) = self.locate(handle)?;
        let b = &mut st.blocks[id];
        let stored = b.lens[slot] as usize;
        if data.len() != stored {
            return Err(PoolError::LengthMismatch {
                handle: handle.raw(),
                stored,
                requested: data.len(),
            });
        }
        let off = slot * list.ty.slot_size + header_size(self.table.page_size);
        b.pages.write(off, data);
        Ok(())
    }

    /// Under the object's list's lock.
    fn with_object(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(ObjectRef<'_>) -> Result<()>,
    ) -> Result<usize> {
        let (list, st, id, slot) = self.locate(handle)?;
        let b = &st.blocks[id];
        let stored = b.lens[slot] as usize;
        let off = slot * list.ty.slot_size + header_size(self.table.page_size);
        f(ObjectRef::in_chain(&b.pages, off, stored))?;
        Ok(stored)
    }

    fn total_pages(&self) -> u64 {
        self.pages_allocated.load(Ordering::Relaxed)
    }

    fn page_size(&self) -> usize {
        self.table.page_size
    }

    fn max_alloc_size(&self) -> usize {
        self.table.max_object
    }

    fn huge_class_size(&self) -> usize {
        self.huge_class_size
    }

    fn size_class(&self, len: usize) -> usize {
        self.table.type_for(len.clamp(1, self.table.max_object))
    }

    /// zblock has no compaction: its blocks are freed as soon as they empty.
    fn compact(&self) -> u64 {
        0
    }

    fn pages_compacted(&self) -> u64 {
        0
    }

    fn stats(&self) -> crate::PoolStats {
        crate::PoolStats::Zblock(self.block_stats())
    }
}

impl Drop for ZblockPool {
    fn drop(&mut self) {
        for list in self.lists.iter_mut() {
            for b in list.state.get_mut().blocks.items_mut() {
                self.arena.free_chain(std::mem::take(&mut b.pages));
            }
        }
    }
}

/// One row of the `blocks` table.
#[derive(Debug, Clone, Serialize)]
pub struct BlockStats {
    pub index: usize,
    pub slot_size: usize,
    pub slots_per_block: usize,
    pub pages_per_block: usize,
    pub blocks: u64,
    pub used_slots: u64,
}

/// Formats rows like the debugfs `blocks` file, with slot columns added.
pub fn format_block_stats(rows: &[BlockStats]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>4} {:>9} {:>15} {:>15} {:>10} {:>10} {:>11}",
        "type",
        "slot_size",
        "slots_per_block",
        "pages_per_block",
        "blocks",
        "used_slots",
        "total_pages"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:>4} {:>9} {:>15} {:>15} {:>10} {:>10} {:>11}",
            r.index,
            r.slot_size,
            r.slots_per_block,
            r.pages_per_block,
            r.blocks,
            r.used_slots,
            r.blocks * r.pages_per_block as u64
        );
    }
    s
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn thinning_bounds_the_overhead() {
        // Against the full frontier, no object pays more than a few percent for the cap.
        let t = BlockTable::new(16384, &BLOCK_PAGES);
        assert_eq!(t.types.len(), MAX_PAGE_TYPES);
        let gaps = t
            .types
            .windows(2)
            .map(|w| w[1].footprint(16384) / w[0].footprint(16384));
        assert!(gaps.clone().all(|g| g > 1.0));
        let worst_small = t.types.iter().filter(|t| t.slot_size >= 256).count();
        assert!(
            worst_small > 40,
            "types spread over the sizes compressed pages have"
        );
    }

    #[test]
    fn tables_cover_every_size_in_ascending_types() {
        for page_size in [4096, 16384] {
            for pages in [&BLOCK_PAGES[..], &[1, 2, 3, 4, 5, 6, 8]] {
                let t = BlockTable::new(page_size, pages);
                assert!(
                    t.types.len() <= MAX_PAGE_TYPES && t.types.len() > 8,
                    "{}",
                    t.types.len()
                );
                assert!(t.types.windows(2).all(|w| w[0].slot_size < w[1].slot_size));
                for len in 1..=page_size {
                    let ty = t.types[t.type_for(len)];
                    assert!(ty.slot_size >= len, "{len} into {ty:?}");
                    if t.type_for(len) > 0 {
                        assert!(
                            t.types[t.type_for(len) - 1].slot_size < len,
                            "{len}: a smaller type fits"
                        );
                    }
                    assert!(ty.slots_per_block <= max_slots(page_size));
                }
            }
        }
    }

    #[test]
    fn larger_objects_get_types_of_their_own_after_the_pages() {
        for (page_size, max_object) in [(4096, 16384), (4096, 65536), (16384, 65536)] {
            let page = BlockTable::new(page_size, &BLOCK_PAGES);
            let t = BlockTable::with_max_object(page_size, &BLOCK_PAGES, max_object);
            // The page's types come first, untouched.
            assert_eq!(t.types[..page.types.len()], page.types[..]);
            assert!(t.types.len() <= MAX_TYPES);
            assert!(t.types.windows(2).all(|w| w[0].slot_size < w[1].slot_size));
            let above = page.types.last().unwrap().slot_size;
            let allowed = larger_candidates(page_size, above, max_object);
            for len in (1..=max_object).step_by(7).chain([max_object]) {
                let i = t.type_for(len);
                let ty = t.types[i];
                assert!(ty.slot_size >= len, "{len} into {ty:?}");
                assert!(
                    i == 0 || t.types[i - 1].slot_size < len,
                    "{len}: a smaller type fits"
                );
                assert!(ty.slots_per_block <= max_slots(page_size));
                if i >= page.types.len() {
                    // Within 5 % of the fewest bytes any allowed block stores it in (the
                    // thinning to the types a handle can name), in a block of at most four
                    // times its slot's fewest pages.
                    let best = allowed
                        .iter()
                        .filter(|c| c.slot_size >= len)
                        .map(|c| c.footprint(page_size))
                        .fold(f64::INFINITY, f64::min);
                    let cost = ty.footprint(page_size);
                    assert!(cost <= best * 1.05, "{len}: {cost} in {ty:?}, best {best}");
                    let fewest = (ty.slot_size + header_size(page_size)).div_ceil(page_size);
                    assert!(ty.pages <= LARGE_BLOCK_FACTOR * fewest, "{len}: {ty:?}");
                }
            }
            // A unit stored raw costs less than a page more than itself.
            let raw = t.types[t.type_for(max_object)].footprint(page_size);
            assert!(raw < (max_object + page_size) as f64, "{raw}");
            let huge = t.huge_size();
            assert!(huge > page_size && huge <= max_object, "{huge}");
        }
    }

    #[test]
    fn a_whole_page_takes_seven_slots_in_eight_pages() {
        // As the kernel's last descriptor, SLOT_SIZE(7, 3): the header keeps a 4 KiB object
        // out of one- and two-page blocks' single slots at a lower cost.
        let t = BlockTable::new(4096, &BLOCK_PAGES);
        let last = t.types[t.type_for(4096)];
        assert_eq!((last.slots_per_block, last.pages), (7, 8));
    }
}
