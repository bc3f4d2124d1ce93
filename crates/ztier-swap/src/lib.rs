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
pub use swapfile::{Config, Device, DeviceStats, ListPolicy, Mode, OrderStats, SLOT_BYTES};

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
    #[error("{0}")]
    Invalid(String),
    /// A device reopened over something that is not the swap area it expects.
    #[error("{0}")]
    NotTheArea(String),
    #[error("backing device: {0}")]
    Backing(ztier_blockdev::BlockError),
}
