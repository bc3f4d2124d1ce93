//! zswap's figures under the kernel's names: the debugfs counters
//! (`/sys/kernel/debug/zswap/*`), the `Zswap` / `Zswapped` lines of `/proc/meminfo`, and the
//! `zswpout` / `zswpin` / `zswpwb` / `swpout_zero` events of `/proc/vmstat`.

use serde::Serialize;
use ztier_base::shard::Counters;

ztier_base::counters! {
    /// Events, counted per thread shard.
    pub(crate) enum Event {
        PoolLimitHit,
        RejectReclaimFail,
        RejectAllocFail,
        RejectKmemcacheFail,
        RejectCompressFail,
        RejectCompressPoor,
        DecompressFail,
        WrittenBack,
        Zswpout,
        Zswpin,
        SwpoutZero,
        SwpinZero,
        /// Pages written to the swap device because zswap refused them.
        SwpoutDevice,
        /// Pages read from the swap device (written back or refused earlier).
        SwpinDevice,
    }
}

pub(crate) type Events = Counters<{ Event::COUNT }>;

/// Everything zswap reports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ZswapStats {
    // debugfs
    pub pool_limit_hit: u64,
    pub reject_reclaim_fail: u64,
    pub reject_alloc_fail: u64,
    pub reject_kmemcache_fail: u64,
    pub reject_compress_fail: u64,
    pub reject_compress_poor: u64,
    pub decompress_fail: u64,
    pub written_back_pages: u64,
    /// Bytes of pool pages held (`zswap_total_pages() * PAGE_SIZE`).
    pub pool_total_size: u64,
    /// Compressed pages held, incompressible ones included, zero-filled ones not.
    pub stored_pages: u64,
    /// Pages held whole because they did not compress below a page.
    pub stored_incompressible_pages: u64,
    // /proc/meminfo
    /// `Zswap`: the pool, in kB.
    #[serde(rename = "Zswap")]
    pub zswap_kb: u64,
    /// `Zswapped`: the pages it holds, uncompressed, in kB.
    #[serde(rename = "Zswapped")]
    pub zswapped_kb: u64,
    // /proc/vmstat
    pub zswpout: u64,
    pub zswpin: u64,
    pub zswpwb: u64,
    pub swpout_zero: u64,
    pub swpin_zero: u64,
    /// Pages written to the swap device because zswap refused them (not a kernel counter).
    pub swpout_device: u64,
    /// Pages read from the swap device.
    pub swpin_device: u64,
    /// Pool pages freed by compaction (zsmalloc's `pages_compacted`).
    pub pages_compacted: u64,
    /// Zero-filled pages held as a tagged index value, with no entry and no pool memory.
    pub zero_pages: u64,
    /// Bytes of zswap's own metadata: the index and the LRU.
    pub metadata_bytes: u64,
    /// Whether stores are refused until the pool shrinks to the accept threshold.
    pub pool_reached_full: bool,
}

impl ZswapStats {
    /// `name value` lines, as `grep . /sys/kernel/debug/zswap/*` prints them, then the
    /// meminfo and vmstat figures.
    pub fn lines(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("pool_limit_hit", self.pool_limit_hit),
            ("reject_reclaim_fail", self.reject_reclaim_fail),
            ("reject_alloc_fail", self.reject_alloc_fail),
            ("reject_kmemcache_fail", self.reject_kmemcache_fail),
            ("reject_compress_fail", self.reject_compress_fail),
            ("reject_compress_poor", self.reject_compress_poor),
            ("decompress_fail", self.decompress_fail),
            ("written_back_pages", self.written_back_pages),
            ("pool_total_size", self.pool_total_size),
            ("stored_pages", self.stored_pages),
            (
                "stored_incompressible_pages",
                self.stored_incompressible_pages,
            ),
            ("Zswap (kB)", self.zswap_kb),
            ("Zswapped (kB)", self.zswapped_kb),
            ("zswpout", self.zswpout),
            ("zswpin", self.zswpin),
            ("zswpwb", self.zswpwb),
            ("swpout_zero", self.swpout_zero),
            ("swpin_zero", self.swpin_zero),
            ("pages_compacted", self.pages_compacted),
            ("zero_pages", self.zero_pages),
            ("metadata_bytes", self.metadata_bytes),
        ]
    }
}
