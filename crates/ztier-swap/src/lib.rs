//! The swap-slot allocator of the kernel's `mm/swapfile.c`: where pages pushed out of memory
//! (by zswap's writeback, zram's writeback) are placed on a backing device. It knows nothing
//! of compression.
//!
//! - [`swapfile`]: a [`Device`] of 512-slot clusters over any [`ztier_blockdev::BlockDevice`]
//!   (a file, a remote disk), allocating 2^order contiguous slots, in the cluster mode of
//!   the 2024 lock rework or the legacy mode before it ([`Mode`]);
//! - [`cluster`]: a cluster's slot counts and the lists it moves between;
//! - `swapfile::swap_slots`: the legacy mode's per-thread slot caches (a child of the
//!   device it caches for, so the two import no circle);
//! - `avail` and [`swap`]: several devices by priority, and the off-list bit
//!   that lets a full device leave the available list without a global lock;
//! - [`lockstat`]: every lock's acquisitions, contention and wait, as `perf lock contention`
//!   shows them;
//! - [`entry`]: swap entries (device and offset in one word).
//!
//! Locks, outer first: see [`swapfile`]. Model-checked with loom
//! (`RUSTFLAGS="--cfg loom" cargo test -p ztier-swap --release --lib loom`).
#![forbid(unsafe_code)]

mod avail;
pub mod cluster;
pub mod entry;
pub mod lockstat;
pub mod swap;
pub mod swapfile;
mod sync;

#[cfg(all(test, loom))]
mod loom_tests;

pub use cluster::{Flag, NR_ORDERS, SWAPFILE_CLUSTER};
pub use entry::{SwapEntry, MAX_SWAPFILES};
pub use swap::{Swap, SwapStats};
pub use swapfile::SWAP_SLOTS_CACHE_SIZE;
pub use swapfile::{
    Config, Device, DeviceStats, ListPolicy, Mode, OrderStats, Published, SLOT_BYTES,
};

/// Why a swap operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwapError {
    #[error("no room for {} contiguous swap slots (order {order})", 1u64 << order)]
    Full { order: u32 },
    #[error("order {0} is above the largest, {max}", max = NR_ORDERS - 1)]
    BadOrder(u32),
    #[error("swap slot {offset} is not allocated")]
    NotAllocated { offset: u64 },
    #[error("swap slot {offset} is outside the device's slots 1..{slots}")]
    OutOfRange { offset: u64, slots: u64 },
    #[error("swap slot {offset} already has the most references a slot holds")]
    CountOverflow { offset: u64 },
    #[error("no swap device {0}")]
    NoDevice(u8),
    #[error("{MAX_SWAPFILES} swap devices at most")]
    TooManyDevices,
    #[error(
        "a swap device needs at least two {SLOT_BYTES}-byte slots (a header and one more); \
         the backing device has {backing_bytes} bytes"
    )]
    TooFewSlots { backing_bytes: u64 },
    #[error("{slots} slots; at most {max} are addressed", max = u32::MAX)]
    TooManySlots { slots: u64 },
    /// The slot map is made whole at swapon, as the kernel's `swap_map` is: one larger
    /// than the machine's memory is refused before it is written out.
    #[error(
        "{slots} slots need {map_bytes} bytes of slot map while the device is made; the \
         machine has {memory_bytes} bytes of memory"
    )]
    SlotMapTooLarge {
        slots: u64,
        map_bytes: u64,
        memory_bytes: u64,
    },
    #[error("no memory for {clusters} clusters")]
    ClustersAlloc { clusters: usize },
    /// The cause is in the message, not also a `source` (a chain printed whole would say it
    /// twice).
    #[error("starting the discard thread: {0}")]
    DiscardThread(std::io::Error),
    #[error("{nr} slots from {offset} do not lie in one cluster")]
    RangeAcrossClusters { offset: u64, nr: u64 },
    #[error(
        "{len} bytes at byte {at} of a run: a run holds 1 to {max} bytes",
        max = SWAPFILE_CLUSTER as u64 * SLOT_BYTES
    )]
    BytesOutsideRun { at: usize, len: usize },
    #[error("a slot holds {SLOT_BYTES} bytes, not {len}")]
    NotASlotLength { len: usize },
    /// A run [`Device::reopen`] was given to hold that the area cannot hold.
    #[error("a run of order {order}: the largest is {max}", max = NR_ORDERS - 1)]
    RunOrder { order: u32 },
    #[error(
        "a run of {nr} slots at slot {first}: not an aligned run of this area's slots \
         1..{slots}"
    )]
    RunOutside { first: u64, nr: u64, slots: u64 },
    #[error("a run of {nr} slots at slot {first} overlaps another run (or the header)")]
    RunOverlaps { first: u64, nr: u64 },
    /// A device reopened over something that is not the swap area it expects.
    #[error(transparent)]
    NotTheArea(NotTheArea),
    #[error("backing device: {0}")]
    Backing(ztier_blockdev::BlockError),
}

/// Why what a device was reopened over ([`Device::reopen`]) is not the area it expects.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NotTheArea {
    #[error(
        "its first page is not a Linux swap header (version 1): it was never a store, or was \
         overwritten"
    )]
    NoSwapHeader,
    #[error("its swap header is of an area of {area_slots} slots; the device has {slots}")]
    OtherSize { area_slots: u64, slots: u64 },
}

/// What [`Device::check_consistency`] found wrong: the first invariant of the clusters, the
/// lists and the published offers that does not hold, with the figures that break it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Inconsistency {
    #[error("the published list bitmap differs from the lists")]
    ListBitmap,
    #[error("cluster {cluster} on two lists: ({first:?}, {first_order}) and {second:?}")]
    OnTwoLists {
        cluster: u32,
        first: Flag,
        first_order: u8,
        second: Flag,
    },
    #[error("cluster {cluster}: count {count} but {used} slots used")]
    Count {
        cluster: u32,
        count: u16,
        used: usize,
    },
    /// The list a cluster is on (flag and order; `None` for none) is not the one its flag
    /// and order name.
    #[error("cluster {cluster}: flag {flag:?} order {order} but on {on:?}")]
    WrongList {
        cluster: u32,
        flag: Flag,
        order: u8,
        on: Option<(Flag, u8)>,
    },
    #[error("cluster {cluster}: {flag:?} with {used} slots used")]
    FlagDoesNotFit { cluster: u32, flag: Flag, used: u16 },
    /// An empty cluster on the free or discard list still holds its slot map.
    #[error("cluster {cluster}: {flag:?} and empty, but its slot map is held")]
    MapHeld { cluster: u32, flag: Flag },
    #[error("cluster {cluster}: {counted} free runs of order {order} counted, {there} there")]
    FreeRuns {
        cluster: u32,
        counted: u16,
        order: u8,
        there: u16,
    },
    #[error("cluster {cluster}: published {published:?}, offers {offers:?}")]
    Published {
        cluster: u32,
        published: Published,
        offers: Published,
    },
    /// The first order whose free runs on the frag lists, summed as they change, are not
    /// those the clusters publish.
    #[error("free runs of order {order} on the frag lists: {summed} summed, {there} there")]
    FragRuns {
        order: usize,
        summed: u64,
        there: u64,
    },
    #[error("{in_clusters} slots used in the clusters, {counted} counted")]
    InUse { in_clusters: u64, counted: u64 },
    #[error(
        "in use {in_use} of {usable}: off-list bit {off_list}, on the available list \
         {available}"
    )]
    OffList {
        in_use: u64,
        usable: u64,
        off_list: bool,
        available: bool,
    },
}
