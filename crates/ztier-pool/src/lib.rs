//! Allocators for compressed objects, behind one thin trait.
//!
//! - `arena` (private to the crate): pages from the OS in 2 MiB chunks, given back with
//!   `madvise`, the only `unsafe` of the allocators (its children: the page chains, the
//!   process-wide helper thread, the system calls). Nothing outside the allocators can make,
//!   free or address its page chains; callers see an object's bytes through an [`ObjectRef`].
//! - [`zsmalloc`]: the kernel's size-class allocator, reproduced class for class.
//! - [`zblock`]: the block allocator proposed for the kernel (blocks of whole slots).
//! - [`zpool`]: the registry of allocators by name.
//! - `testing` (with the `testing` feature): the conformance suite every [`ZPool`]
//!   implementation must pass.
//!
//! # Lock ordering
//! zsmalloc: `ZsPool::compacting` (a flag, not a lock) → `SizeClass::state` → `Arena::state`.
//! zblock: `BlockList::state` → `Arena::state`.
//! No operation holds two class or list locks at once.
#![deny(unsafe_code)]

mod arena;
mod handle;
#[cfg(feature = "testing")]
pub mod testing;
pub mod zblock;
pub mod zpool;
pub mod zsmalloc;

use std::num::NonZeroU64;

/// The OS queries live in `ztier_base::os`; re-exported for the engines' callers, which
/// reach the OS only through their pool.
pub use ztier_base::os::{lower_to_idle_priority, physical_memory_bytes, process_rss_bytes};

use arena::PageChain;

/// A live object's bytes, shown to the callback of [`ZPool::with_object`] while the object
/// can neither change nor move. Every access is bounds-checked; the pool's pages stay
/// private.
pub struct ObjectRef<'a>(ObjectBytes<'a>);

enum ObjectBytes<'a> {
    /// `len` bytes at `off` in a zspage's or block's pages (checked to lie inside them).
    Chain {
        pages: &'a PageChain,
        off: usize,
        len: usize,
    },
    /// Bytes that are one slice (an allocator outside this crate).
    Slice(&'a [u8]),
}

impl<'a> ObjectRef<'a> {
    /// An object at `off` in `pages`; panics if it does not lie inside them.
    pub(crate) fn in_chain(pages: &'a PageChain, off: usize, len: usize) -> ObjectRef<'a> {
        pages.check_range(off, len);
        ObjectRef(ObjectBytes::Chain { pages, off, len })
    }

    /// An object whose bytes are one slice: how an allocator outside this crate shows its
    /// objects.
    pub fn from_slice(bytes: &'a [u8]) -> ObjectRef<'a> {
        ObjectRef(ObjectBytes::Slice(bytes))
    }

    /// The object's length in bytes.
    pub fn len(&self) -> usize {
        match self.0 {
            ObjectBytes::Chain { len, .. } => len,
            ObjectBytes::Slice(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the object into the start of `out`; `None`, copying nothing, if `out` is
    /// shorter than the object.
    pub fn copy_to(&self, out: &mut [u8]) -> Option<usize> {
        let len = self.len();
        let out = out.get_mut(..len)?;
        match self.0 {
            ObjectBytes::Chain { pages, off, .. } => pages.read(off, out),
            ObjectBytes::Slice(b) => out.copy_from_slice(b),
        }
        Some(len)
    }

    /// Calls `f` with the object's bytes: where they lie if they are contiguous, else copied
    /// into `scratch` first; `None`, without calling `f`, if the bytes needed copying and
    /// `scratch` is shorter than the object.
    pub fn with_bytes(&self, scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) -> Option<()> {
        match self.0 {
            ObjectBytes::Chain { pages, off, len } => {
                if scratch.len() < len && !pages.is_in_place(off, len) {
                    return None;
                }
                pages.with_bytes(off, len, scratch, f);
            }
            ObjectBytes::Slice(b) => f(b),
        }
        Some(())
    }
}
pub use zblock::{BlockStats, ZblockConfig, ZblockPool};
pub use zpool::{AllocatorKind, PoolConfig};
pub use zsmalloc::{ChainRule, ClassStats, ClassTable, ZsConfig, ZsPool};

/// An allocator's table of its classes or block types, typed: zsmalloc's debugfs `classes`,
/// zblock's `blocks`. `Display` prints it as the kernel's debugfs file does; `--json`
/// serializes the rows.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "allocator", content = "rows", rename_all = "lowercase")]
#[non_exhaustive]
pub enum PoolStats {
    Zsmalloc(Vec<ClassStats>),
    Zblock(Vec<BlockStats>),
}

impl std::fmt::Display for PoolStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolStats::Zsmalloc(rows) => f.write_str(&zsmalloc::format_class_stats(rows)),
            PoolStats::Zblock(rows) => f.write_str(&zblock::format_block_stats(rows)),
        }
    }
}

/// An allocated object's name. Never 0; stays valid and unchanged for the object's whole
/// life, across compaction, and is refused once the object is freed. It names its pool too:
/// another live pool refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Handle(NonZeroU64);

impl Handle {
    pub fn from_raw(raw: u64) -> Option<Handle> {
        NonZeroU64::new(raw).map(Handle)
    }
    pub fn raw(self) -> u64 {
        self.0.get()
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// What an allocator refuses, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("allocation of 0 bytes")]
    ZeroSize,
    #[error("allocation of {len} bytes exceeds the pool's maximum of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("handle {handle:#x} does not name an object of this pool")]
    UnknownHandle { handle: u64 },
    #[error("handle {handle:#x} names an object that was freed")]
    FreedHandle { handle: u64 },
    #[error("object {handle:#x} holds {stored} bytes; the access was for {requested}")]
    LengthMismatch {
        handle: u64,
        stored: usize,
        requested: usize,
    },
    #[error("out of memory: could not map {bytes} bytes: {reason}")]
    OutOfMemory { bytes: usize, reason: String },
    #[error("{max} pools are alive already: a handle's pool tag can name no more")]
    TooManyPools { max: usize },
    #[error("{what} is full: {max} is the most a handle can name")]
    HandleSpaceFull { what: &'static str, max: u64 },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// A pool layout no allocator can make, said in the user's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("page size {page_size} (4096 or 16384)")]
    PageSize { page_size: usize },
    #[error("chain size {chain_size} (1..=16)")]
    ChainSize { chain_size: usize },
    #[error(
        "largest object {max_object} (a power of two from the page size {page_size} to 64 KiB)"
    )]
    MaxObject { max_object: usize, page_size: usize },
}

/// A name [`AllocatorKind`] or [`ChainRule`] does not know, said with the names there are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnknownName {
    #[error("unknown allocator '{0}' (known: {known})", known = AllocatorKind::names())]
    Allocator(String),
    #[error("unknown chain rule '{0}' (least-waste, used-percent)")]
    ChainRule(String),
}

/// The page sizes every allocator supports.
pub const PAGE_SIZES: [usize; 2] = [4096, 16384];

/// Refuses a page size no allocator supports.
fn check_page_size(page_size: usize) -> std::result::Result<(), ConfigError> {
    if PAGE_SIZES.contains(&page_size) {
        Ok(())
    } else {
        Err(ConfigError::PageSize { page_size })
    }
}

/// Refuses a largest object no allocator lays out: a power of two from the page size up to
/// 64 KiB (zram's largest unit).
fn check_max_object(max_object: usize, page_size: usize) -> std::result::Result<(), ConfigError> {
    if max_object.is_power_of_two()
        && max_object >= page_size
        && max_object <= zsmalloc::MAX_OBJECT_SIZE.max(page_size)
    {
        Ok(())
    } else {
        Err(ConfigError::MaxObject {
            max_object,
            page_size,
        })
    }
}

pub type Result<T, E = PoolError> = std::result::Result<T, E>;

/// Refuses a buffer of `room` bytes for an object of `stored`.
fn check_room(handle: Handle, stored: usize, room: usize) -> Result<()> {
    if room < stored {
        return Err(PoolError::LengthMismatch {
            handle: handle.raw(),
            stored,
            requested: room,
        });
    }
    Ok(())
}

/// The storage interface zram and zswap use.
///
/// Contract:
/// - implementations are `Send + Sync` and do their own locking; every method may be called
///   from any number of threads at once;
/// - an object has the length given to [`malloc`](Self::malloc), fixed for its life;
///   [`write`](Self::write) must supply exactly that many bytes, [`read`](Self::read) needs a
///   buffer at least that long and returns the length;
/// - `malloc` fails with [`PoolError::ZeroSize`] for 0 and [`PoolError::TooLarge`] above
///   [`max_alloc_size`](Self::max_alloc_size);
/// - handles of other pools, invented numbers and freed objects give
///   [`PoolError::UnknownHandle`] / [`PoolError::FreedHandle`]; a failed call changes nothing;
/// - [`total_pages`](Self::total_pages) counts the pool pages the allocator holds (what
///   zram reports as `mem_used_total`), and those pages are what the process keeps resident.
pub trait ZPool: Send + Sync {
    /// The allocator's name as the CLI spells it.
    fn name(&self) -> &'static str;
    /// Allocates an object of `len` bytes (contents unspecified until written).
    fn malloc(&self, len: usize) -> Result<Handle>;
    /// Frees an object.
    fn free(&self, handle: Handle) -> Result<()>;
    /// Overwrites an object's bytes.
    fn write(&self, handle: Handle, data: &[u8]) -> Result<()>;
    /// Finds a live object and calls `f` with a view of its bytes, while the object can
    /// neither change nor move (zsmalloc holds its class's shared lock, zblock its list's
    /// lock: `f` holds off writers, so it should be brief); returns the object's length. The
    /// one way to an object's bytes: [`read`](Self::read) and [`read_with`](Self::read_with)
    /// are made of it.
    fn with_object(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(ObjectRef<'_>) -> Result<()>,
    ) -> Result<usize>;
    /// Copies an object's bytes into `out`; returns its length.
    fn read(&self, handle: Handle, out: &mut [u8]) -> Result<usize> {
        self.with_object(handle, &mut |object| {
            check_room(handle, object.len(), out.len())?;
            object.copy_to(out).expect("room checked");
            Ok(())
        })
    }
    /// Calls `f` with an object's bytes, where they lie if they are contiguous, else copied
    /// into `scratch` (which must have room for the object); returns its length. zram
    /// decompresses in `f`, as the kernel's zram does between `zs_obj_read_begin()` and
    /// `_end()`.
    fn read_with(
        &self,
        handle: Handle,
        scratch: &mut [u8],
        f: &mut dyn FnMut(&[u8]),
    ) -> Result<usize> {
        self.with_object(handle, &mut |object| {
            check_room(handle, object.len(), scratch.len())?;
            object.with_bytes(scratch, f).expect("room checked");
            Ok(())
        })
    }
    /// Frees many objects: each as [`free`](Self::free) would, in any order; returns the
    /// first error after trying every handle (a handle that fails changes nothing). zsmalloc
    /// takes each class's lock once for all its objects in the batch.
    fn free_batch(&self, handles: &mut [Handle]) -> Result<()> {
        let mut first = Ok(());
        for &h in handles.iter() {
            if let Err(e) = self.free(h) {
                first = first.and(Err(e));
            }
        }
        first
    }
    /// [`free_batch`](Self::free_batch) of the objects it can free without waiting: those
    /// whose lock another thread holds now stay in `handles`, for a later call (a thread
    /// freeing the objects it has loaded need not stop while another reads beside them).
    /// On an error, the handles passed over are still in `handles`. Pools that do not
    /// override it wait for their locks and free them all.
    fn free_batch_uncontended(&self, handles: &mut Vec<Handle>) -> Result<()> {
        let r = self.free_batch(handles);
        handles.clear();
        r
    }
    /// Allocates and writes in one step.
    fn store(&self, data: &[u8]) -> Result<Handle> {
        let handle = self.malloc(data.len())?;
        if let Err(e) = self.write(handle, data) {
            let _ = self.free(handle);
            return Err(e);
        }
        Ok(handle)
    }
    /// Pool pages held.
    fn total_pages(&self) -> u64;
    /// Size of one pool page in bytes.
    fn page_size(&self) -> usize;
    /// Largest object `malloc` accepts.
    fn max_alloc_size(&self) -> usize;
    /// Compressed lengths from this size up should be stored raw (zram's `huge_class_size`).
    fn huge_class_size(&self) -> usize;
    /// Which class an object of `len` bytes lands in (`zs_lookup_class_index()`), ordered by
    /// size: recompression keeps a new object only if its class is below the old one's.
    fn size_class(&self, len: usize) -> usize;
    /// Moves objects to free pages; returns the pages freed by this call.
    fn compact(&self) -> u64;
    /// Pages freed by compaction over the pool's life.
    fn pages_compacted(&self) -> u64;
    /// The allocator's debugfs table: zsmalloc's `classes`, zblock's `blocks`.
    fn stats(&self) -> PoolStats;
}

impl dyn ZPool + '_ {
    /// [`read_with`](ZPool::read_with) for a closure that returns a value: calls `f` once
    /// with the object's bytes (in place, or copied into `scratch`, which must have room for
    /// the object) and returns what `f` returned. The one relay out of the pool's callback,
    /// for a decompression:
    ///
    /// ```
    /// # use ztier_pool::{ZPool, ZsPool, ZsConfig};
    /// let pool: Box<dyn ZPool> = Box::new(ZsPool::new(ZsConfig::default()).unwrap());
    /// let h = pool.store(b"object").unwrap();
    /// let mut scratch = [0u8; 16];
    /// assert_eq!(pool.read_map(h, &mut scratch, |b| b.len()).unwrap(), 6);
    /// ```
    pub fn read_map<R>(
        &self,
        handle: Handle,
        scratch: &mut [u8],
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.read_with(handle, scratch, &mut |bytes| {
            if let Some(f) = f.take() {
                out = Some(f(bytes));
            }
        })?;
        Ok(out.expect("read_with calls its closure once on success"))
    }
}
