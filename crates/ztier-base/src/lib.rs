//! The structures every ztier layer shares, written once: zsmalloc's zspage lists, zblock's
//! block lists, the swap allocator's cluster lists and zswap's LRU are all [`list`]s over an
//! [`slab`]; handles of every allocator are packed with [`bits`]; per-CPU state (zram's
//! streams and counters) lives in [`shard`]s; every counter set is declared with
//! [`counters!`] ([`counter`]); byte ranges are cut into page [`pieces`]; wire and file
//! formats are read field by field with [`bytes`]' reader; tests write
//! [`pattern`]s and draw from the one seeded generator, [`rng`]; a read asks for a line it
//! will need through a [`prefetch`] hint; what the process asks of the OS (page size,
//! memory, RSS) is in [`os`], of the scheduler (idle priority, CPUs) in [`sched`];
//! anonymous memory is a [`mapping`]; files that hold a disk's pages are made and
//! opened by [`private_file`]; per-page tables that cost memory only where written come
//! from [`zeroed`]; sizes and durations as people write them are read by [`units`].
//!
//! Nothing here knows about pool pages, compression or devices. The only `unsafe` is in
//! [`os`] and [`sched`] (libc calls that touch no memory of the caller's), [`mapping`]
//! (`mmap`, `madvise`, `mincore`, `munmap`: the one owner of anonymous mappings),
//! [`prefetch`] (a hint that reads nothing) and [`zeroed`] (tables of atomics made from
//! zeroed memory).
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bits;
pub mod bytes;
pub mod counter;
pub mod list;
pub mod mapping;
pub mod os;
pub mod pattern;
pub mod pieces;
pub mod prefetch;
pub mod private_file;
pub mod rng;
pub mod sched;
pub mod shard;
pub mod slab;
pub mod units;
pub mod zeroed;

/// "No node": the end of a list, an unset link.
pub const NONE: u32 = u32::MAX;
