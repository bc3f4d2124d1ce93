//! zram's counters (`struct zram_stats`) and the sysfs files made from them.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

/// The device's running counters.
#[derive(Debug, Default)]
pub struct Stats {
    /// Bytes of compressed objects held (huge pages count a whole page).
    pub compr_data_size: AtomicU64,
    /// Slots holding data (same-filled ones included).
    pub pages_stored: AtomicU64,
    /// Slots holding a same-filled page as one word.
    pub same_pages: AtomicU64,
    /// Slots holding a page stored raw.
    pub huge_pages: AtomicU64,
    /// Pages ever stored raw since the device was created.
    pub huge_pages_since: AtomicU64,
    /// Reads that failed (corrupt object, bad request).
    pub failed_reads: AtomicU64,
    /// Writes that failed (memory limit, allocation, bad request).
    pub failed_writes: AtomicU64,
    /// Slots freed by discard.
    pub notify_free: AtomicU64,
    /// Frees that found the slot busy (kept for `debug_stat`; always 0 here, since a free
    /// waits for the slot lock instead of giving up).
    pub miss_free: AtomicU64,
}

impl Stats {
    /// Zeroes every counter: a reset device starts from nothing, as in the kernel.
    pub fn clear(&self) {
        for c in [
            &self.compr_data_size,
            &self.pages_stored,
            &self.same_pages,
            &self.huge_pages,
            &self.huge_pages_since,
            &self.failed_reads,
            &self.failed_writes,
            &self.notify_free,
            &self.miss_free,
        ] {
            c.store(0, Relaxed);
        }
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
