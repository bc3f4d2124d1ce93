//! zram's counters (`struct zram_stats`) and the sysfs files made from them.

use std::fmt;

use serde::{Deserialize, Serialize};

ztier_base::counters! {
    /// One of the device's running counters (`struct zram_stats`).
    pub enum Counter {
        /// Bytes of compressed objects held (huge pages count a whole page).
        ComprDataSize,
        /// Slots holding data (same-filled ones included).
        PagesStored,
        /// Slots holding a same-filled page as one word.
        SamePages,
        /// Slots holding a page stored raw.
        HugePages,
        /// Pages ever stored raw since the device was created or reset.
        HugePagesSince,
        /// Reads that failed (corrupt object, bad request).
        FailedReads,
        /// Writes that failed (memory limit, allocation, bad request).
        FailedWrites,
        /// Slots freed by discard.
        NotifyFree,
        /// Pages held on the backing store (`bd_count`).
        BdCount,
        /// Pages read from the backing store (`bd_reads`).
        BdReads,
        /// 4 KiB blocks written to the backing store (`bd_writes`).
        BdWrites,
        /// Pages recompressed into a smaller class by a secondary algorithm.
        Recompressed,
        /// Pages that no secondary algorithm could shrink, marked incompressible.
        RecompIncompressible,
        /// Frees that found the slot busy (kept for `debug_stat`; always 0 here, since a free
        /// waits for the slot lock instead of giving up).
        MissFree,
    }
}

/// One shard of every counter. It is written only by the thread holding its shard, so an
/// update is a plain add, and a reading sums the shards (a shard may go negative when one
/// thread frees what another stored).
///
/// Not [`ztier_base::shard::Counters`]: these live in the shard beside its streams, under the
/// lock an operation already holds (so an add is a plain add, not an atomic one), they are
/// signed (most are levels, raised by one thread and lowered by another), and `reset` zeroes
/// them with every shard held.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counters([i64; Counter::COUNT]);

impl Counters {
    #[inline]
    pub fn add(&mut self, counter: Counter, n: i64) {
        self.0[counter.index()] += n;
    }

    /// Adds another shard into this one.
    pub fn merge(&mut self, other: &Counters) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// A total, as the sysfs files show it (never below zero).
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter.index()].max(0) as u64
    }
}

/// `/sys/block/zramN/mm_stat`, in the kernel's field order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmStat {
    /// Bytes of data stored (pages × page size).
    pub orig_data_size: u64,
    /// Bytes of compressed data held.
    pub compr_data_size: u64,
    /// Bytes of memory the allocator holds.
    pub mem_used_total: u64,
    /// The memory limit in bytes, 0 for none.
    pub mem_limit: u64,
    /// The most memory the allocator held, in bytes.
    pub mem_used_max: u64,
    /// Pages kept as one repeated word.
    pub same_pages: u64,
    /// Pages freed by compaction.
    pub pages_compacted: u64,
    /// Pages stored raw.
    pub huge_pages: u64,
    /// Pages ever stored raw.
    pub huge_pages_since: u64,
}

impl MmStat {
    pub const FIELDS: [&'static str; 9] = [
        "orig_data_size",
        "compr_data_size",
        "mem_used_total",
        "mem_limit",
        "mem_used_max",
        "same_pages",
        "pages_compacted",
        "huge_pages",
        "huge_pages_since",
    ];

    pub fn values(&self) -> [u64; 9] {
        [
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since,
        ]
    }
}

impl fmt::Display for MmStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.values();
        write!(
            f,
            "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8]
        )
    }
}

/// `/sys/block/zramN/io_stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoStat {
    pub failed_reads: u64,
    pub failed_writes: u64,
    /// Always 0: the kernel no longer counts it, and keeps the column.
    pub invalid_io: u64,
    pub notify_free: u64,
}

impl fmt::Display for IoStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>8} {:>8} {:>8} {:>8}",
            self.failed_reads, self.failed_writes, self.invalid_io, self.notify_free
        )
    }
}

/// `/sys/block/zramN/debug_stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DebugStat {
    pub version: u32,
    pub miss_free: u64,
}

impl fmt::Display for DebugStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "version: {}\n0 {:>8}", self.version, self.miss_free)
    }
}
