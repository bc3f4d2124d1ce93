//! zsmalloc: the kernel's allocator for compressed objects (`mm/zsmalloc.c`), reproduced.
//!
//! Objects are grouped by size into classes ([`ClassTable`]); a class carves its zspages,
//! chains of 1..=chain_size pool pages, into equal slots. Pages of a zspage need not be
//! contiguous, so an object may straddle two of them. Each non-huge object starts with an
//! 8-byte header (`ZS_HANDLE_SIZE`, counted in the class size): the object's handle index and
//! length when allocated, the next free object's index when free, told apart by the low tag
//! bit, as the kernel's `link_free`/`OBJ_ALLOCATED_TAG` do. Huge objects fill their page and
//! keep that header in the zspage descriptor instead.
//!
//! Each class keeps its zspages on 12 fullness lists (empty, 10 %, 20 %, … 90 %, 99 %,
//! full), newest first. Allocation takes the first zspage of the fullest non-full list;
//! a zspage that becomes empty is freed at once, as the kernel's is (every figure counts it
//! freed), but its pages are kept, resident, as a class "spare" (at most
//! [`SPARE_ZSPAGES_PER_CLASS`] a class, [`SPARE_BYTES_MAX`] a pool) for the class's next new
//! zspage: a pass of exclusive loads that empties zspages, followed by stores that make
//! them again, goes through neither the arena nor the OS, as the kernel's page allocator
//! keeps freed pages on its per-CPU lists. Compaction gives the spares back to the arena
//! (so to the OS), as does dropping the pool. Compaction moves objects from the emptiest
//! zspages into the fullest, in the kernel's exact order, so `pages_compacted` and
//! `mem_used_total` match the kernel's on the same sequence of operations.
//!
//! Handles are indexes into a per-class handle table whose entries hold the object's
//! location, so a handle stays valid when compaction moves its object. A handle carries its
//! class and a generation, so freed and foreign handles are refused, never misread.
//!
//! # Lock ordering
//! `ZsPool::compacting` (a flag that makes compaction single-threaded) →
//! `SizeClass::state` → `Arena::state` (the spares are the class's, under its lock; the
//! pool's count of spare pages is an atomic). All access to a class's zspages, objects and
//! handles happens under that class's lock: shared by reads, exclusive for malloc, free,
//! write and compaction, so object bytes are never read and written at once and every access
//! is safe Rust; classes never lock each other. (The kernel's readers take the class lock
//! only to find the zspage and then hold a per-zspage read lock; the effect for readers is
//! the same: they run side by side, and an object does not move under one.)

mod classes;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockWriteGuard};
use serde::Serialize;

pub use classes::{
    ChainRule, ClassSpec, ClassTable, CHAIN_SIZE_RANGE, DEFAULT_CHAIN_SIZE, MAX_OBJECT_SIZE,
    ZS_HANDLE_SIZE, ZS_MIN_ALLOC_SIZE,
};

use ztier_base::list::{Linked, Links, List};
use ztier_base::prefetch::prefetch_read;
use ztier_base::slab::IdSlab;

use crate::arena::{Arena, PageChain};
use crate::handle::{self, Field, PoolTag};
use crate::{ConfigError, Handle, ObjectRef, PoolError, Result, ZPool};

/// Fullness groups: `ZS_INUSE_RATIO_0`, `_10` … `_99`, `_100`.
const NR_FULLNESS_GROUPS: usize = 12;
const FG_EMPTY: u8 = 0;
const FG_10: u8 = 1;
const FG_99: u8 = 10;
const FG_FULL: u8 = 11;
/// Marks a zspage taken off its list (isolated for compaction, or being set up).
const FG_OFF_LIST: u8 = u8::MAX;

/// Emptied zspages whose pages a class keeps for its next new zspage.
pub const SPARE_ZSPAGES_PER_CLASS: usize = 2;

/// Bytes of spare pages a pool keeps at most, over all its classes: what its RSS may run
/// ahead of `total_pages`, beyond the arena's own lists.
pub const SPARE_BYTES_MAX: usize = 4 << 20;

/// End of a zspage's free-object chain.
const NONE: u32 = ztier_base::NONE;

// Handle bit layout (u64; `crate::handle` packs it):
//
//   63        54 53            40 39     31 30                     1 0
//  +------------+----------------+---------+------------------------+-+
//  | pool (10)  | generation (14)|class (9)| handle table index (30)|1|
//  +------------+----------------+---------+------------------------+-+
const H_INDEX: Field = Field::after(handle::TAG_BIT, 30);
const H_CLASS: Field = Field::after(H_INDEX, 9);
const H_GEN: Field = Field::after(H_CLASS, 14);
const _: () = assert!(H_GEN.end() == 64 - handle::POOL_TAG_BITS);
const _: () = assert!(
    H_GEN.max() <= u16::MAX as u64,
    "a handle-table entry keeps it in 16 bits"
);
const _: () = assert!(H_CLASS.max() >= 256, "a 16 KiB pool has 257 class indexes");

// Object header (u64, little-endian, first 8 bytes of every non-huge object):
//
//   allocated:  | length (17) << 33 | handle index (32) << 1 | 1 |
//   free:       |                     next free object (32) << 1 | 0 |
const OBJ_ALLOCATED_TAG: u64 = 1;
const OBJ_LEN_SHIFT: u32 = 33;

fn header_allocated(handle_index: u32, len: usize) -> u64 {
    ((len as u64) << OBJ_LEN_SHIFT) | ((handle_index as u64) << 1) | OBJ_ALLOCATED_TAG
}
fn header_free(next: u32) -> u64 {
    (next as u64) << 1
}
fn header_next_free(header: u64) -> u32 {
    (header >> 1) as u32
}
fn header_len(header: u64) -> usize {
    (header >> OBJ_LEN_SHIFT) as usize & OBJ_LEN_MASK
}

/// An object's length in its header: up to a 64 KiB unit stored whole.
const OBJ_LEN_MASK: usize = (MAX_OBJECT_SIZE << 1) - 1;
fn header_handle_index(header: u64) -> u32 {
    (header >> 1) as u32
}

/// How a pool is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ZsConfig {
    /// Pool page size: 4096 or 16384.
    pub page_size: usize,
    /// Max pages per zspage (`CONFIG_ZSMALLOC_CHAIN_SIZE`), 1..=16.
    pub chain_size: usize,
    pub chain_rule: ChainRule,
    /// The largest object, if above a page: multi-page classes up to it (a power of two up
    /// to [`MAX_OBJECT_SIZE`], for zram's large compression units). `None`: the kernel's
    /// table, objects up to a page.
    pub max_object: Option<usize>,
}

impl Default for ZsConfig {
    fn default() -> Self {
        ZsConfig {
            page_size: 4096,
            chain_size: DEFAULT_CHAIN_SIZE,
            chain_rule: ChainRule::LeastWaste,
            max_object: None,
        }
    }
}

impl ZsConfig {
    /// Checks the configuration; the error is worded for a user.
    pub fn validate(&self) -> std::result::Result<(), ConfigError> {
        crate::check_page_size(self.page_size)?;
        if !CHAIN_SIZE_RANGE.contains(&self.chain_size) {
            return Err(ConfigError::ChainSize {
                chain_size: self.chain_size,
            });
        }
        crate::check_max_object(self.largest_object(), self.page_size)
    }

    /// The largest object a pool of this layout takes.
    pub fn largest_object(&self) -> usize {
        self.max_object.unwrap_or(self.page_size)
    }

    /// This layout with multi-page classes up to `max_object` bytes (none at a page or
    /// below).
    pub fn with_max_object(self, max_object: usize) -> ZsConfig {
        ZsConfig {
            max_object: (max_object > self.page_size).then_some(max_object),
            ..self
        }
    }
}

/// A zsmalloc pool.
pub struct ZsPool {
    /// Named by every handle of this pool.
    tag: PoolTag,
    table: ClassTable,
    classes: Box<[SizeClass]>,
    arena: Arena,
    /// Pool pages held by all zspages (`pool->pages_allocated`).
    pages_allocated: AtomicU64,
    /// Pages freed by compaction (`pool->stats.pages_compacted`).
    pages_compacted: AtomicU64,
    /// Set while a compaction runs; a second caller returns at once
    /// (`pool->compaction_in_progress`).
    compacting: AtomicBool,
    /// Pages in the classes' spares (not in `pages_allocated`), at most `spare_pages_max`.
    spare_pages: AtomicU64,
    spare_pages_max: u64,
}

struct SizeClass {
    spec: ClassSpec,
    /// Protects every zspage, object and handle of this class: reads share it, everything
    /// else (malloc, free, write, compaction) holds it alone.
    state: RwLock<ClassState>,
}

/// A class's zspages, lists, handles and counters.
#[derive(Default)]
struct ClassState {
    /// zspage descriptors by id; ids of freed zspages are reused.
    zspages: IdSlab<ZsPage>,
    /// The fullness lists (newest first), whose lengths are the debugfs 10 %..100 % columns.
    lists: [List; NR_FULLNESS_GROUPS],
    /// Object slots in all zspages (`ZS_OBJS_ALLOCATED`).
    obj_allocated: u64,
    /// Objects allocated (`ZS_OBJS_INUSE`).
    obj_used: u64,
    /// The handle table: where each live object is. A freed entry keeps its generation.
    handles: IdSlab<HandleSlot>,
    /// One object's bytes, for compaction's copies.
    scratch: Vec<u8>,
    /// The pages of emptied zspages, kept for this class's next new zspages (counted in the
    /// pool's `spare_pages`, in no figure of the kernel's).
    spare: Vec<PageChain>,
}

/// A zspage descriptor (`struct zspage`).
struct ZsPage {
    /// Its pool pages in chain order; empty while the id is free.
    pages: PageChain,
    /// Objects allocated in it.
    inuse: u32,
    /// First freed object (head of the in-page free chain), or NONE.
    freeobj: u32,
    /// Objects from this index on have not been handed out since the zspage was made. The
    /// kernel's `init_zspage()` links every object into the free chain up front; here the
    /// chain ends where these begin and they are taken in order after it, which hands out
    /// objects in the same order without touching each one's memory when the zspage is
    /// made and again to read its link (two cache misses per object on the store path).
    untouched: u32,
    /// The fullness list it is on, or FG_OFF_LIST.
    fullness: u8,
    links: Links,
    /// The header of a huge zspage's only object (huge objects have no room for one).
    huge_header: u64,
}

impl ZsPage {
    /// `alloc_zspage()`: pages from the arena, every object free (untouched). Needs no class
    /// lock (the kernel's zs_malloc() drops it here too), so the page faults of fresh memory,
    /// taken by the arena, hold up no one.
    fn new(spec: &ClassSpec, arena: &Arena) -> Result<ZsPage> {
        Ok(ZsPage::on(arena.alloc_chain(spec.pages_per_zspage)?))
    }

    /// A zspage on pages already taken (a spare's), every object free (untouched).
    fn on(pages: PageChain) -> ZsPage {
        ZsPage {
            pages,
            inuse: 0,
            freeobj: NONE,
            untouched: 0,
            fullness: FG_OFF_LIST,
            links: Links::default(),
            huge_header: 0,
        }
    }
}

impl Linked for ZsPage {
    fn links(&self) -> &Links {
        &self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
}

/// One handle-table entry: 16 bytes, packed so the prefetch hint costs no room.
#[derive(Clone, Copy)]
struct HandleSlot {
    /// Bumped on every free (kept to `H_GEN`'s 14 bits), so a freed handle no longer matches.
    generation: u16,
    /// Where the object is, while live: its index in the zspage (fewer than 2^16: see
    /// `OBJS_PER_ZSPAGE_MAX`) and the zspage.
    obj: u16,
    zspage: u32,
    /// The address of the object's first byte (its header; a huge object's data) as a
    /// number, split in two for room (user addresses take 48 bits): a prefetch hint only, set with `zspage` and `obj`. A read asks
    /// for the object's line as soon as it has this entry, so the fetch is under way while
    /// the zspage's descriptor is read, not only after (docs/diary.md, "A cold read's misses").
    /// Never used to reach memory: a wrong value costs a wasted fetch, not a wrong read.
    header_at_low: u32,
    header_at_high: u16,
    live: bool,
}

const _: () = assert!(std::mem::size_of::<HandleSlot>() == 16);

/// The most objects a zspage holds: its longest chain of the largest pool pages, in objects
/// of the smallest class.
const OBJS_PER_ZSPAGE_MAX: usize = {
    let mut largest = 0;
    let mut i = 0;
    while i < crate::PAGE_SIZES.len() {
        if crate::PAGE_SIZES[i] > largest {
            largest = crate::PAGE_SIZES[i];
        }
        i += 1;
    }
    largest * *CHAIN_SIZE_RANGE.end() / ZS_MIN_ALLOC_SIZE
};
const _: () = assert!(OBJS_PER_ZSPAGE_MAX <= u16::MAX as usize + 1);

impl HandleSlot {
    fn obj(&self) -> u32 {
        self.obj as u32
    }

    /// Points the entry at object `obj` of `zspage`, whose header is at `header_at`.
    fn place(&mut self, zspage: u32, obj: u32, header_at: usize) {
        self.zspage = zspage;
        // In range: an object index is below OBJS_PER_ZSPAGE_MAX (checked above).
        self.obj = obj as u16;
        self.header_at_low = header_at as u32;
        self.header_at_high = ((header_at as u64) >> 32) as u16;
    }

    fn header_at(&self) -> usize {
        ((self.header_at_high as u64) << 32 | self.header_at_low as u64) as usize
    }
}

impl ZsPool {
    /// A new, empty pool; refused if the layout is not one zsmalloc supports or a handle's
    /// pool tag can name no more pools.
    pub fn new(config: ZsConfig) -> Result<ZsPool> {
        config.validate()?;
        let tag = PoolTag::new()?;
        let table = ClassTable::with_max_object(
            config.page_size,
            config.chain_size,
            config.chain_rule,
            config.largest_object(),
        );
        // A handle-table entry keeps an object's index in 16 bits (`HandleSlot::place`).
        assert!(table
            .classes
            .iter()
            .all(|c| c.objs_per_zspage <= OBJS_PER_ZSPAGE_MAX));
        // A handle names its class in H_CLASS's bits.
        if table.classes.len() as u64 > H_CLASS.max() + 1 {
            return Err(ConfigError::MaxObject {
                max_object: config.largest_object(),
                page_size: config.page_size,
            }
            .into());
        }
        let classes = table
            .classes
            .iter()
            .map(|spec| SizeClass {
                spec: spec.clone(),
                state: RwLock::new(ClassState {
                    handles: IdSlab::with_max_id(H_INDEX.max() as u32),
                    ..ClassState::default()
                }),
            })
            .collect();
        Ok(ZsPool {
            tag,
            arena: Arena::new(config.page_size),
            table,
            classes,
            pages_allocated: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            compacting: AtomicBool::new(false),
            spare_pages: AtomicU64::new(0),
            spare_pages_max: (SPARE_BYTES_MAX / config.page_size) as u64,
        })
    }

    pub fn table(&self) -> &ClassTable {
        &self.table
    }

    /// Pages kept resident in the classes' spares for their next zspages: not in
    /// [`ZPool::total_pages`], at most [`SPARE_BYTES_MAX`] of them.
    pub fn spare_pages(&self) -> u64 {
        self.spare_pages.load(Ordering::Relaxed)
    }

    /// An emptied zspage's pages (already counted freed): kept as a spare of its class if
    /// the class and the pool have room; else returned, for the caller to give back to the
    /// arena once it has let go of the class's lock (the arena may release pages to the OS
    /// there, a system call with a TLB flush that readers of the class must not wait on).
    #[must_use = "pages not kept as a spare go back to the arena"]
    fn retire_pages(&self, st: &mut ClassState, pages: PageChain) -> Option<PageChain> {
        let n = pages.len() as u64;
        let room = st.spare.len() < SPARE_ZSPAGES_PER_CLASS
            && self
                .spare_pages
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                    (held + n <= self.spare_pages_max).then_some(held + n)
                })
                .is_ok();
        if room {
            st.spare.push(pages);
            None
        } else {
            Some(pages)
        }
    }

    /// Frees a group of handles of one class under one hold of its lock, then gives the
    /// zspages they emptied back to the arena. With `only_if_free`, a lock held by another
    /// thread frees nothing and returns `Ok(false)`. A handle that fails changes nothing;
    /// the first error is returned after the others are freed.
    fn free_group(&self, group: &[Handle], only_if_free: bool) -> Result<bool> {
        let Some(&first_handle) = group.first() else {
            return Ok(true);
        };
        let Some(class) = self.classes.get(H_CLASS.get(first_handle.raw()) as usize) else {
            return Err(PoolError::UnknownHandle {
                handle: first_handle.raw(),
            });
        };
        let mut st = if only_if_free {
            match class.state.try_write() {
                Some(st) => st,
                None => return Ok(false),
            }
        } else {
            class.state.write()
        };
        let mut first = Ok(true);
        let mut retired = Vec::new();
        for &h in group {
            // Decoding checks each handle (its class among them: a foreign or forged one
            // names another class, or none, and is refused here).
            let r = self.decode(h).and_then(|(c, index, generation)| {
                if !std::ptr::eq(c, class) {
                    return Err(PoolError::UnknownHandle { handle: h.raw() });
                }
                self.free_locked(class, &mut st, h, index, generation)
            });
            match r {
                Ok(pages) => retired.extend(pages),
                Err(e) => first = first.and(Err(e)),
            }
        }
        drop(st);
        for pages in retired {
            self.arena.free_chain(pages);
        }
        first
    }

    /// Sorts the handles by class and frees each class's group under one hold of its lock
    /// ([`free_group`](Self::free_group)); the groups of classes it may not wait for and
    /// finds held go to `passed_over`. The first error is returned after every group.
    fn free_by_class(
        &self,
        handles: &mut [Handle],
        only_if_free: bool,
        passed_over: &mut Vec<Handle>,
    ) -> Result<()> {
        handles.sort_unstable_by_key(|h| H_CLASS.get(h.raw()));
        let mut first = Ok(());
        for group in handles.chunk_by(|a, b| H_CLASS.get(a.raw()) == H_CLASS.get(b.raw())) {
            match self.free_group(group, only_if_free) {
                Ok(true) => {}
                Ok(false) => passed_over.extend_from_slice(group),
                Err(e) => first = first.and(Err(e)),
            }
        }
        first
    }

    /// Gives a class's spares back to the arena.
    fn release_spares(&self, st: &mut ClassState) {
        for pages in st.spare.drain(..) {
            self.spare_pages
                .fetch_sub(pages.len() as u64, Ordering::Relaxed);
            self.arena.free_chain(pages);
        }
    }

    fn decode(&self, handle: Handle) -> Result<(&SizeClass, u32, u32)> {
        let bits = handle::open(&self.tag, handle)?;
        let class = H_CLASS.get(bits) as usize;
        let index = H_INDEX.get(bits) as u32;
        let generation = H_GEN.get(bits) as u32;
        self.classes
            .get(class)
            .map(|c| (c, index, generation))
            .ok_or(PoolError::UnknownHandle {
                handle: handle.raw(),
            })
    }

    fn encode(&self, class: usize, index: u32, generation: u32) -> Handle {
        handle::make(
            &self.tag,
            H_GEN.put(generation as u64) | H_CLASS.put(class as u64) | H_INDEX.put(index as u64),
        )
    }

    fn malloc_inner(&self, len: usize, data: Option<&[u8]>) -> Result<Handle> {
        if len == 0 {
            return Err(PoolError::ZeroSize);
        }
        if len > self.max_alloc_size() {
            return Err(PoolError::TooLarge {
                len,
                max: self.max_alloc_size(),
            });
        }
        let slot = self.table.slot_for_request(len);
        let class = &self.classes[slot];
        let spec = &class.spec;
        let mut st = class.state.write();
        st.check_handle_room()?;
        let (id, fresh) = match st.find_get_zspage() {
            Some(id) => (id, false),
            None if !st.spare.is_empty() => {
                // A spare is this class's own pages, resident: no arena, no unlocking.
                let pages = st.spare.pop().expect("not empty");
                self.spare_pages
                    .fetch_sub(pages.len() as u64, Ordering::Relaxed);
                let id = st.install_zspage(spec, ZsPage::on(pages));
                self.pages_allocated
                    .fetch_add(spec.pages_per_zspage as u64, Ordering::Relaxed);
                (id, true)
            }
            None => {
                // As the kernel does, make the zspage with the class unlocked, then use it
                // (another thread may have made one meanwhile; both are kept).
                drop(st);
                let zspage = ZsPage::new(spec, &self.arena)?;
                st = class.state.write();
                if let Err(e) = st.check_handle_room() {
                    self.arena.free_chain(zspage.pages);
                    return Err(e);
                }
                let id = st.install_zspage(spec, zspage);
                self.pages_allocated
                    .fetch_add(spec.pages_per_zspage as u64, Ordering::Relaxed);
                (id, true)
            }
        };
        let index = st.alloc_handle_slot();
        let obj = st.obj_malloc(spec, id, header_allocated(index, len));
        let header_at = st.zspages[id].pages.address_hint(spec.size * obj as usize);
        let h = &mut st.handles[index];
        h.live = true;
        h.place(id, obj, header_at);
        if fresh {
            let fg = fullness_group(spec, st.zspages[id].inuse);
            st.insert_zspage(id, fg);
        } else {
            st.fix_fullness_group(spec, id);
        }
        st.obj_used += 1;
        if let Some(data) = data {
            let off = payload_offset(spec, obj);
            st.zspages[id].pages.write(off, data);
        }
        Ok(self.encode(slot, index, st.handles[index].generation as u32))
    }

    /// Looks a handle up under its class lock: (handle index, zspage id, object index).
    fn locate(
        &self,
        st: &ClassState,
        handle: Handle,
        index: u32,
        generation: u32,
    ) -> Result<(u32, u32)> {
        let raw = handle.raw();
        match st.handles.get(index) {
            Some(h) if h.generation as u64 & H_GEN.max() == generation as u64 => {
                if h.live {
                    Ok((h.zspage, h.obj()))
                } else {
                    Err(PoolError::FreedHandle { handle: raw })
                }
            }
            Some(h) if !h.live || h.generation as u64 & H_GEN.max() > generation as u64 => {
                Err(PoolError::FreedHandle { handle: raw })
            }
            _ => Err(PoolError::UnknownHandle { handle: raw }),
        }
    }

    /// `zs_free()` under the class's lock. Returns the pages of a zspage it emptied that
    /// the class did not keep, for the caller to give back to the arena after unlocking.
    fn free_locked(
        &self,
        class: &SizeClass,
        st: &mut ClassState,
        handle: Handle,
        index: u32,
        generation: u32,
    ) -> Result<Option<PageChain>> {
        let spec = &class.spec;
        let (id, obj) = self.locate(st, handle, index, generation)?;
        st.obj_free(spec, id, obj);
        st.obj_used -= 1;
        let retired = if st.fix_fullness_group(spec, id) == FG_EMPTY {
            st.remove_zspage(id);
            let pages = st.free_zspage(spec, id);
            self.pages_allocated
                .fetch_sub(spec.pages_per_zspage as u64, Ordering::Relaxed);
            self.retire_pages(st, pages)
        } else {
            None
        };
        st.free_handle_slot(index);
        Ok(retired)
    }

    fn compact_class(&self, class: &SizeClass) -> u64 {
        let spec = &class.spec;
        let mut st = class.state.write();
        self.release_spares(&mut st);
        let mut freed = 0;
        let mut dst: Option<u32> = None;
        while st.can_compact(spec) > 0 {
            let d = match dst {
                Some(d) => d,
                None => match st.isolate_zspage(true) {
                    Some(d) => *dst.insert(d),
                    None => break,
                },
            };
            let Some(src) = st.isolate_zspage(false) else {
                break;
            };
            st.migrate_zspage(spec, src, d);
            if st.putback_zspage(spec, src) == FG_EMPTY {
                let pages = st.free_zspage(spec, src);
                self.arena.free_chain(pages);
                freed += spec.pages_per_zspage as u64;
            }
            if fullness_group(spec, st.zspages[d].inuse) == FG_FULL {
                st.putback_zspage(spec, d);
                dst = None;
                // As the kernel drops its locks between destination zspages, let waiting
                // allocations and reads in.
                RwLockWriteGuard::bump(&mut st);
            }
        }
        if let Some(d) = dst {
            st.putback_zspage(spec, d);
        }
        drop(st);
        self.pages_allocated.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// The debugfs `classes` table's rows, one per unique class.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.classes
            .iter()
            .map(|c| {
                let st = c.state.read();
                let mut fullness = [0; NR_FULLNESS_GROUPS - 1];
                for (n, list) in fullness.iter_mut().zip(&st.lists[1..]) {
                    *n = list.len();
                }
                ClassStats {
                    class: c.spec.index,
                    size: c.spec.size,
                    fullness,
                    obj_allocated: st.obj_allocated,
                    obj_used: st.obj_used,
                    pages_used: st.obj_allocated / c.spec.objs_per_zspage as u64
                        * c.spec.pages_per_zspage as u64,
                    pages_per_zspage: c.spec.pages_per_zspage,
                    freeable: st.can_compact(&c.spec),
                }
            })
            .collect()
    }
}

impl ZPool for ZsPool {
    fn name(&self) -> &'static str {
        "zsmalloc"
    }

    fn malloc(&self, len: usize) -> Result<Handle> {
        self.malloc_inner(len, None)
    }

    fn store(&self, data: &[u8]) -> Result<Handle> {
        self.malloc_inner(data.len(), Some(data))
    }

    fn free(&self, handle: Handle) -> Result<()> {
        let (class, index, generation) = self.decode(handle)?;
        let mut st = class.state.write();
        let retired = self.free_locked(class, &mut st, handle, index, generation)?;
        drop(st);
        if let Some(pages) = retired {
            self.arena.free_chain(pages);
        }
        Ok(())
    }

    /// The handles sorted by class, each class's lock taken once for its objects.
    fn free_batch(&self, handles: &mut [Handle]) -> Result<()> {
        self.free_by_class(handles, false, &mut Vec::new())
    }

    /// As [`free_batch`](ZPool::free_batch), passing over the classes whose lock is held
    /// (by a reader decompressing an object, most often): their handles stay in `handles`.
    fn free_batch_uncontended(&self, handles: &mut Vec<Handle>) -> Result<()> {
        let mut passed_over = Vec::new();
        let r = self.free_by_class(handles, true, &mut passed_over);
        handles.clear();
        handles.extend_from_slice(&passed_over);
        r
    }

    fn write(&self, handle: Handle, data: &[u8]) -> Result<()> {
        let (class, index, generation) = self.decode(handle)?;
        let mut st = class.state.write();
        let (id, obj) = self.locate(&st, handle, index, generation)?;
        let stored = st.object_len(&class.spec, id, obj);
        if data.len() != stored {
            return Err(PoolError::LengthMismatch {
                handle: handle.raw(),
                stored,
                requested: data.len(),
            });
        }
        let off = payload_offset(&class.spec, obj);
        st.zspages[id].pages.write(off, data);
        Ok(())
    }

    /// `zs_obj_read_begin()`/`_end()`: under the class's shared lock.
    fn with_object(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(ObjectRef<'_>) -> Result<()>,
    ) -> Result<usize> {
        let (class, index, generation) = self.decode(handle)?;
        let st = class.state.read();
        if let Some(h) = st.handles.get(index) {
            prefetch_read(h.header_at());
        }
        let (id, obj) = self.locate(&st, handle, index, generation)?;
        let stored = st.object_len(&class.spec, id, obj);
        let off = payload_offset(&class.spec, obj);
        f(ObjectRef::in_chain(&st.zspages[id].pages, off, stored))?;
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
        self.table.huge_class_size
    }

    fn size_class(&self, len: usize) -> usize {
        self.table.slot_for_request(len)
    }

    /// `zs_compact()`: classes from the largest down.
    fn compact(&self) -> u64 {
        if self.compacting.swap(true, Ordering::Acquire) {
            return 0;
        }
        let freed = self
            .classes
            .iter()
            .rev()
            .map(|c| self.compact_class(c))
            .sum();
        self.pages_compacted.fetch_add(freed, Ordering::Relaxed);
        self.compacting.store(false, Ordering::Release);
        freed
    }

    fn pages_compacted(&self) -> u64 {
        self.pages_compacted.load(Ordering::Relaxed)
    }

    fn stats(&self) -> crate::PoolStats {
        crate::PoolStats::Zsmalloc(self.class_stats())
    }
}

impl Drop for ZsPool {
    fn drop(&mut self) {
        for class in self.classes.iter_mut() {
            let st = class.state.get_mut();
            for zs in st.zspages.items_mut() {
                self.arena.free_chain(std::mem::take(&mut zs.pages));
            }
            for pages in st.spare.drain(..) {
                self.arena.free_chain(pages);
            }
        }
    }
}

/// `get_fullness_group()`.
fn fullness_group(spec: &ClassSpec, inuse: u32) -> u8 {
    let objs = spec.objs_per_zspage as u32;
    if inuse == 0 {
        FG_EMPTY
    } else if inuse == objs {
        FG_FULL
    } else {
        (100 * inuse / objs / 10 + 1) as u8
    }
}

fn payload_offset(spec: &ClassSpec, obj: u32) -> usize {
    obj as usize * spec.size + if spec.huge { 0 } else { ZS_HANDLE_SIZE }
}

impl ClassState {
    /// `find_get_zspage()`: first zspage of the fullest non-full list.
    fn find_get_zspage(&self) -> Option<u32> {
        (FG_EMPTY..=FG_99)
            .rev()
            .find_map(|fg| self.lists[fg as usize].first())
    }

    /// Adds a zspage made by `ZsPage::new` to the class (off any list yet).
    fn install_zspage(&mut self, spec: &ClassSpec, zspage: ZsPage) -> u32 {
        self.obj_allocated += spec.objs_per_zspage as u64;
        // A class has fewer zspages than handles, which check_handle_room bounds.
        self.zspages
            .insert(zspage)
            .expect("zspage ids outnumber handles")
    }

    /// `__free_zspage()` for a zspage already off its list: gone from the class and its
    /// figures; returns its pages for the caller to keep or give back.
    fn free_zspage(&mut self, spec: &ClassSpec, id: u32) -> PageChain {
        let zs = &mut self.zspages[id];
        debug_assert!(zs.inuse == 0 && zs.fullness == FG_OFF_LIST);
        let pages = std::mem::take(&mut zs.pages);
        self.obj_allocated -= spec.objs_per_zspage as u64;
        self.zspages.remove(id);
        pages
    }

    fn insert_zspage(&mut self, id: u32, fg: u8) {
        self.lists[fg as usize].push_front(self.zspages.items_mut(), id);
        self.zspages[id].fullness = fg;
    }

    fn remove_zspage(&mut self, id: u32) {
        let fg = self.zspages[id].fullness;
        debug_assert!(fg != FG_OFF_LIST);
        self.lists[fg as usize].remove(self.zspages.items_mut(), id);
        self.zspages[id].fullness = FG_OFF_LIST;
    }

    /// Moves a zspage to the list its fullness now calls for; returns that group.
    fn fix_fullness_group(&mut self, spec: &ClassSpec, id: u32) -> u8 {
        let zs = &self.zspages[id];
        let fg = fullness_group(spec, zs.inuse);
        if fg != zs.fullness {
            self.remove_zspage(id);
            self.insert_zspage(id, fg);
        }
        fg
    }

    /// `putback_zspage()`: back onto the right list; returns the group.
    fn putback_zspage(&mut self, spec: &ClassSpec, id: u32) -> u8 {
        let fg = fullness_group(spec, self.zspages[id].inuse);
        self.insert_zspage(id, fg);
        if fg == FG_EMPTY {
            self.remove_zspage(id);
        }
        fg
    }

    /// `isolate_src_zspage()` / `isolate_dst_zspage()`: takes the first zspage of the
    /// emptiest (sources) or fullest (destinations) non-empty list among 10 %..99 %.
    fn isolate_zspage(&mut self, fullest_first: bool) -> Option<u32> {
        let pick = |fg: u8| self.lists[fg as usize].first();
        let id = if fullest_first {
            (FG_10..=FG_99).rev().find_map(pick)
        } else {
            (FG_10..=FG_99).find_map(pick)
        }?;
        self.remove_zspage(id);
        Some(id)
    }

    /// `zs_can_compact()`: pages that whole zspages' worth of free slots would give back.
    fn can_compact(&self, spec: &ClassSpec) -> u64 {
        let wasted = self.obj_allocated.saturating_sub(self.obj_used);
        wasted / spec.objs_per_zspage as u64 * spec.pages_per_zspage as u64
    }

    /// `obj_malloc()`: takes the zspage's first free object and stamps its header.
    fn obj_malloc(&mut self, spec: &ClassSpec, id: u32, header: u64) -> u32 {
        let zs = &mut self.zspages[id];
        let obj = if zs.freeobj != NONE {
            let obj = zs.freeobj;
            zs.freeobj = if spec.huge {
                NONE
            } else {
                header_next_free(read_header(&zs.pages, spec.size * obj as usize))
            };
            obj
        } else {
            debug_assert!(
                zs.untouched < spec.objs_per_zspage as u32,
                "obj_malloc on a full zspage"
            );
            zs.untouched += 1;
            zs.untouched - 1
        };
        if spec.huge {
            zs.huge_header = header;
        } else {
            write_header(&mut zs.pages, spec.size * obj as usize, header);
        }
        zs.inuse += 1;
        obj
    }

    /// `obj_free()`: pushes the object on its zspage's free chain.
    fn obj_free(&mut self, spec: &ClassSpec, id: u32, obj: u32) {
        let zs = &mut self.zspages[id];
        if spec.huge {
            zs.huge_header = 0;
        } else {
            write_header(
                &mut zs.pages,
                spec.size * obj as usize,
                header_free(zs.freeobj),
            );
        }
        zs.freeobj = obj;
        zs.inuse -= 1;
    }

    fn object_header(&self, spec: &ClassSpec, id: u32, obj: u32) -> u64 {
        let zs = &self.zspages[id];
        if spec.huge {
            zs.huge_header
        } else {
            read_header(&zs.pages, spec.size * obj as usize)
        }
    }

    fn object_len(&self, spec: &ClassSpec, id: u32, obj: u32) -> usize {
        header_len(self.object_header(spec, id, obj))
    }

    /// `migrate_zspage()`: moves src's objects, lowest index first, into dst until dst is
    /// full or src is empty, re-pointing each object's handle.
    fn migrate_zspage(&mut self, spec: &ClassSpec, src: u32, dst: u32) {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(spec.size, 0);
        let objs = spec.objs_per_zspage as u32;
        // Objects past `untouched` were never allocated; their bytes are not headers.
        for obj in 0..self.zspages[src].untouched {
            let header = self.object_header(spec, src, obj);
            if header & OBJ_ALLOCATED_TAG == 0 {
                continue;
            }
            let base = spec.size * obj as usize;
            self.zspages[src].pages.read(base, &mut scratch);
            let new_obj = self.obj_malloc(spec, dst, header);
            self.zspages[dst]
                .pages
                .write(spec.size * new_obj as usize, &scratch);
            let header_at = self.zspages[dst]
                .pages
                .address_hint(spec.size * new_obj as usize);
            self.handles[header_handle_index(header)].place(dst, new_obj, header_at);
            self.obj_free(spec, src, obj);
            if self.zspages[dst].inuse == objs || self.zspages[src].inuse == 0 {
                break;
            }
        }
        self.scratch = scratch;
    }

    /// Refuses an allocation when every handle the class can name is taken.
    fn check_handle_room(&self) -> Result<()> {
        self.handles
            .next_id()
            .map(drop)
            .map_err(|full| PoolError::HandleSpaceFull {
                what: "a size class's handle table",
                max: full.capacity,
            })
    }

    /// A free handle-table entry (`check_handle_room` has made sure there is one), keeping
    /// the generation a reused entry had.
    fn alloc_handle_slot(&mut self) -> u32 {
        self.handles
            .insert_with(|old| HandleSlot {
                generation: old.map_or(0, |h| h.generation),
                live: false,
                zspage: NONE,
                obj: 0,
                header_at_low: 0,
                header_at_high: 0,
            })
            .expect("room checked")
    }

    fn free_handle_slot(&mut self, index: u32) {
        let h = &mut self.handles[index];
        h.live = false;
        h.generation = ((h.generation as u64 + 1) & H_GEN.max()) as u16;
        self.handles.remove(index);
    }
}

fn read_header(pages: &PageChain, off: usize) -> u64 {
    pages.read_u64_le(off)
}

fn write_header(pages: &mut PageChain, off: usize, header: u64) {
    pages.write(off, &header.to_le_bytes());
}

/// One row of the debugfs `classes` table.
#[derive(Debug, Clone, Serialize)]
pub struct ClassStats {
    pub class: usize,
    pub size: usize,
    /// zspages per fullness group: 10 %, 20 %, … 90 %, 99 %, 100 %.
    pub fullness: [u64; NR_FULLNESS_GROUPS - 1],
    pub obj_allocated: u64,
    pub obj_used: u64,
    pub pages_used: u64,
    pub pages_per_zspage: usize,
    /// Pages compaction could free now.
    pub freeable: u64,
}

/// Formats rows as the kernel's `/sys/kernel/debug/zsmalloc/<pool>/classes`.
pub fn format_class_stats(rows: &[ClassStats]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        " {:>5} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>13} {:>10} {:>10} {:>16} {:>8}",
        "class", "size", "10%", "20%", "30%", "40%", "50%", "60%", "70%", "80%", "90%", "99%",
        "100%", "obj_allocated", "obj_used", "pages_used", "pages_per_zspage", "freeable"
    );
    let mut totals = [0u64; NR_FULLNESS_GROUPS - 1];
    let (mut objs, mut used, mut pages, mut freeable) = (0, 0, 0, 0);
    for r in rows {
        let _ = write!(s, " {:>5} {:>5} ", r.class, r.size);
        for (t, n) in totals.iter_mut().zip(r.fullness) {
            *t += n;
            let _ = write!(s, "{n:>9} ");
        }
        let _ = writeln!(
            s,
            "{:>13} {:>10} {:>10} {:>16} {:>8}",
            r.obj_allocated, r.obj_used, r.pages_used, r.pages_per_zspage, r.freeable
        );
        objs += r.obj_allocated;
        used += r.obj_used;
        pages += r.pages_used;
        freeable += r.freeable;
    }
    let _ = write!(s, "\n {:>5} {:>5} ", "Total", "");
    for n in totals {
        let _ = write!(s, "{n:>9} ");
    }
    let _ = writeln!(
        s,
        "{objs:>13} {used:>10} {pages:>10} {:>16} {freeable:>8}",
        ""
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (zspage id, object index) of a live handle.
    fn location(pool: &ZsPool, handle: Handle) -> (u32, u32) {
        let (class, index, generation) = pool.decode(handle).unwrap();
        let st = class.state.read();
        pool.locate(&st, handle, index, generation).unwrap()
    }

    /// Every live handle's prefetch hint is its object's first byte, after allocation
    /// and after compaction has moved objects between zspages (a hint left behind would
    /// only waste a fetch, so only this test sees it).
    #[test]
    fn every_handle_hints_at_its_objects_header_after_compaction() {
        let pool = ZsPool::new(ZsConfig::default()).unwrap();
        let check = |handles: &[(Handle, u8)]| {
            for &(h, byte) in handles {
                let (class, index, generation) = pool.decode(h).unwrap();
                let st = class.state.read();
                let (id, obj) = pool.locate(&st, h, index, generation).unwrap();
                let at = st.zspages[id]
                    .pages
                    .address_hint(class.spec.size * obj as usize);
                assert_ne!(at, 0);
                assert_eq!(st.handles[index].header_at(), at, "handle {h:?}");
                drop(st);
                let mut out = [0u8; 300];
                assert_eq!(pool.read(h, &mut out).unwrap(), 300);
                assert!(out.iter().all(|&b| b == byte));
            }
        };
        let mut handles: Vec<(Handle, u8)> = (0..2000u32)
            .map(|i| (pool.store(&[i as u8; 300]).unwrap(), i as u8))
            .collect();
        check(&handles);
        // Free all but every seventh, leaving zspages sparse for compaction to merge.
        let mut kept = Vec::new();
        for (i, (h, byte)) in handles.drain(..).enumerate() {
            if i % 7 == 0 {
                kept.push((h, byte));
            } else {
                pool.free(h).unwrap();
            }
        }
        assert!(pool.compact() > 0, "compaction moved nothing");
        check(&kept);
    }

    /// A batch freed without waiting frees the objects of the classes no one holds and
    /// keeps the others for a later call; a foreign handle is refused and stops nothing.
    #[test]
    fn a_batch_freed_without_waiting_keeps_the_objects_of_held_classes() {
        let pool = ZsPool::new(ZsConfig::default()).unwrap();
        let other = ZsPool::new(ZsConfig::default()).unwrap();
        let (small, large) = (100, 1000);
        let held_class = pool.table.slot_for_request(large);
        let mut handles = Vec::new();
        for _ in 0..20 {
            handles.push(pool.malloc(small).unwrap());
            handles.push(pool.malloc(large).unwrap());
        }
        let foreign = other.malloc(small).unwrap();
        let mut batch = handles.clone();
        batch.push(foreign);
        let reader = pool.classes[held_class].state.read();
        let r = pool.free_batch_uncontended(&mut batch);
        assert!(matches!(r, Err(PoolError::UnknownHandle { .. })), "{r:?}");
        let (large_handles, small_handles): (Vec<Handle>, Vec<Handle>) = handles
            .iter()
            .partition(|h| H_CLASS.get(h.raw()) as usize == held_class);
        let mut kept = batch.clone();
        kept.sort_unstable_by_key(|h| h.raw());
        let mut expected = large_handles.clone();
        expected.sort_unstable_by_key(|h| h.raw());
        assert_eq!(kept, expected, "only the held class's objects are kept");
        drop(reader);
        for h in &small_handles {
            assert!(matches!(pool.free(*h), Err(PoolError::FreedHandle { .. })));
        }
        for h in &large_handles {
            let (class, index, generation) = pool.decode(*h).unwrap();
            let st = class.state.read();
            assert!(
                pool.locate(&st, *h, index, generation).is_ok(),
                "still live"
            );
        }
        pool.free_batch_uncontended(&mut batch).unwrap();
        assert!(batch.is_empty());
        assert_eq!(pool.total_pages(), 0, "every object freed");
        other.free(foreign).unwrap();
    }

    proptest! {
        /// The lazily linked free chain hands out objects in the order of the kernel's
        /// eagerly linked one: freed objects last-in first-out, then the untouched ones in
        /// index order. The ops keep one to `objs_per_zspage` objects live, so one zspage
        /// serves them all.
        #[test]
        fn objects_come_in_the_kernels_order(ops in prop::collection::vec(any::<(bool, prop::sample::Index)>(), 1..400)) {
            let pool = ZsPool::new(ZsConfig::default()).unwrap();
            let len = 1000;
            let objs = pool.classes[pool.table.slot_for_request(len)].spec.objs_per_zspage as u32;
            // The kernel's chain after init_zspage(): 0 → 1 → … → objs - 1.
            let mut kernel_chain: std::collections::VecDeque<u32> = (0..objs).collect();
            let mut live: Vec<(Handle, u32)> = Vec::new();
            let first = pool.malloc(len).unwrap();
            let zspage = location(&pool, first).0;
            live.push((first, kernel_chain.pop_front().unwrap()));
            for (alloc, pick) in ops {
                if alloc && (live.len() as u32) < objs {
                    let h = pool.malloc(len).unwrap();
                    let expected = kernel_chain.pop_front().unwrap();
                    prop_assert_eq!(location(&pool, h), (zspage, expected));
                    live.push((h, expected));
                } else if live.len() > 1 {
                    let (h, obj) = live.swap_remove(pick.index(live.len()));
                    pool.free(h).unwrap();
                    kernel_chain.push_front(obj);
                }
            }
        }
    }
}
