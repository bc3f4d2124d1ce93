//! What a device operation refuses ([`ZramError`], the crate's one error), and the kinds
//! of refusal it carries as values: a saved state's ([`StateError`], in `state/`) and
//! an operation refused for now ([`Busy`]).

use ztier_compress::CompressError;
use ztier_pool::PoolError;

use crate::slot;
use crate::state::StateError;
use crate::writeback::WbFormat;

/// What a device operation refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZramError {
    #[error("offset {offset} + length {len} is beyond the disk's {disksize} bytes")]
    OutOfRange {
        offset: u64,
        len: usize,
        disksize: u64,
    },
    #[error("page {index} is beyond the disk's {pages} pages")]
    BadIndex { index: u64, pages: u64 },
    #[error("a page write needs exactly {page_size} bytes, got {len}")]
    BadLength { len: usize, page_size: usize },
    #[error("memory limit reached: {used_bytes} bytes used, limit {limit_bytes}")]
    MemLimit { used_bytes: u64, limit_bytes: u64 },
    /// The device's memory group (a host's budget) is full.
    #[error(
        "the group's memory limit reached: {used_bytes} bytes used by its devices, limit \
         {limit_bytes}"
    )]
    GroupLimit { used_bytes: u64, limit_bytes: u64 },
    #[error("the device is already in a memory group")]
    AlreadyInGroup,
    #[error("allocator: {0}")]
    Pool(#[from] PoolError),
    /// The cause is in the message, not also a `source` (a chain printed whole would say it
    /// twice); a page that decoded short is `CompressError::PageLength`.
    #[error("page {index}: {cause}")]
    Compress { index: u64, cause: CompressError },
    #[error("disk size {0} bytes is not a positive whole number of pages")]
    BadDiskSize(u64),
    #[error("disk size {disksize} bytes is not a whole number of {unit_size}-byte units")]
    DiskNotWholeUnits { disksize: u64, unit_size: usize },
    #[error(
        "unit size {unit_size}: a power of two from the page size {page_size} to {max_unit} \
         bytes (the allocator's largest object)"
    )]
    BadUnitSize {
        unit_size: usize,
        page_size: usize,
        max_unit: usize,
    },
    #[error(
        "disk size {disksize} bytes needs a slot table of {table_bytes} bytes, more than this \
         machine's {memory_bytes} bytes of memory"
    )]
    DiskTooLarge {
        disksize: u64,
        table_bytes: u64,
        memory_bytes: u64,
    },
    #[error("the slot table of {table_bytes} bytes could not be allocated")]
    TableAlloc { table_bytes: u64 },
    #[error("no backing store is set (backing_dev)")]
    NoBacking,
    #[error("the writeback limit is used up (writeback_limit)")]
    WritebackLimit,
    #[error("backing store: {0}")]
    Backing(ztier_swap::SwapError),
    /// A store whose bookkeeping would not fit in the machine's memory: writeback's live
    /// counts (a `u32` a unit) and the allocator's slot map, made whole beside them when it
    /// is attached (each alone may fit where the two do not).
    #[error(
        "a store of {store_bytes} bytes needs {live_count_bytes} bytes of live counts \
         ({format:?} format) and {map_bytes} bytes of slot map: the machine has \
         {memory_bytes} bytes of memory"
    )]
    StoreTooLarge {
        store_bytes: u64,
        format: WbFormat,
        live_count_bytes: u64,
        map_bytes: u64,
        memory_bytes: u64,
    },
    /// [`StoreTooLarge`](Self::StoreTooLarge)'s live counts fit the machine, and could not be
    /// allocated.
    #[error(
        "a store of {store_bytes} bytes needs {live_count_bytes} bytes of live counts \
         ({format:?} format) and {map_bytes} bytes of slot map: the live counts could not be \
         allocated"
    )]
    LiveCountsAlloc {
        store_bytes: u64,
        format: WbFormat,
        live_count_bytes: u64,
        map_bytes: u64,
    },
    /// A writeback that did not write every page it took: `pages` went out (they stay on
    /// the store), `failed` could not be written (they stay in memory), and the rest were
    /// not tried.
    #[error(
        "writeback wrote {pages} pages ({bytes} bytes); {failed} pages could not be written \
         and stay in memory: {cause}"
    )]
    WritebackCut {
        pages: u64,
        bytes: u64,
        failed: u64,
        cause: Box<ZramError>,
    },
    /// Refused for now: what it would change is in use, or going away.
    #[error("{0}")]
    Busy(Busy),
    /// A value an attribute or setting does not take.
    #[error("{attr}: {value:?} is not {want}")]
    BadValue {
        attr: String,
        value: String,
        want: String,
    },
    /// A page selector (`writeback`'s and `recompress`'s `type=`) that is none of them.
    #[error("{attr}: {source}")]
    BadSelectorValue {
        attr: String,
        source: slot::BadSelector,
    },
    /// A compressor (`recomp_algorithm`'s `algo=`) that cannot be made.
    #[error("{attr}: {source}")]
    BadAlgorithmValue {
        attr: String,
        source: ztier_compress::BadAlgorithm,
    },
    #[error("{name}: no such {kind} attribute ({known})")]
    NoAttribute {
        name: String,
        /// readable or writable.
        kind: &'static str,
        /// The attributes there are.
        known: &'static str,
    },
    #[error("{given} secondary algorithms: zram takes at most {max}")]
    TooManyAlgorithms { given: usize, max: usize },
    #[error("no secondary algorithm is set (recomp_algorithm)")]
    NoSecondary,
    /// A saved state that cannot be written, or read into this device (and why). The cause
    /// is in the message, not also a `source`.
    #[error("saved state: {0}")]
    BadState(StateError),
    /// A written-back page's copy on the store is not what was written (its checksum does
    /// not match): the store damaged it. `first` is its segment's first slot, `at` the byte
    /// in it.
    #[error(
        "page {index}: its copy on the backing store fails its checksum (segment at slot \
         {first}, byte {at}, {size} bytes): the store damaged it"
    )]
    Corrupt {
        index: u64,
        first: u64,
        at: usize,
        size: usize,
    },
    /// A written-back slot names bytes past its segment: the slot table is damaged.
    #[error(
        "page {index}: its place on the store (slot {first}, byte {at}) and size {size} run \
         past its segment"
    )]
    BadPlace {
        index: u64,
        first: u64,
        at: usize,
        size: usize,
    },
    #[error("after storing {stored} of {len} bytes at offset {offset}: {source}")]
    PartialWrite {
        offset: u64,
        len: usize,
        /// Bytes from `offset` on that were stored before the failure; the rest are unchanged.
        stored: usize,
        source: Box<ZramError>,
    },
}

pub type Result<T, E = ZramError> = std::result::Result<T, E>;

impl From<StateError> for ZramError {
    fn from(e: StateError) -> ZramError {
        ZramError::BadState(e)
    }
}

/// What an operation refused for now ([`ZramError::Busy`]) waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Busy {
    #[error("writeback is closed: the device is stopping")]
    WritebackClosed,
    /// Another backing store was set while the operation ran.
    #[error("the backing store was changed meanwhile")]
    StoreChanged,
    #[error("pages are written back to the current backing store")]
    PagesOnStore,
    #[error("pages are stored by the secondary algorithms; reset the device first")]
    PagesOnSecondary,
}
