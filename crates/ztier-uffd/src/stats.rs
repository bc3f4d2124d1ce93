//! A region's figures ([`RegionStats`]), a plain value that
//! `Region::stats` fills (taking what it needs there): the counts kept per thread shard
//! (shared.rs's `Count`), the page table's, the fault thread's latency histogram and
//! placement, the CPU latency request, the stall clock, the controller's figures, and the
//! device's `mm_stat` and `bd_stat`.

use serde::Serialize;
use ztier_zram::{BdStat, MmStat};

use crate::autosize::AutosizeStats;
use crate::shared::LATENCY_BUCKETS;

// The docs' links name them.
#[cfg(doc)]
use crate::{Region, RegionConfig};

/// A region's figures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RegionStats {
    pub pages: u64,
    /// The budget now: the one set, or where the controller put it
    /// ([`RegionConfig::autosize`]).
    pub budget_pages: u64,
    /// Where an eviction pass the budget starts stops: a sixteenth of the budget (at most
    /// 128 pages) under it.
    pub reclaim_target_pages: u64,
    /// Pages present in the region (the zero page included).
    pub resident_pages: u64,
    /// Pages held compressed in the device.
    pub stored_pages: u64,
    /// Pages the store refused, held whole in the heap until touched.
    pub held_pages: u64,
    /// Faults served from the store.
    pub faults: u64,
    /// Faults served with zeros (a page never written, dropped, or stored as zeros).
    pub zero_faults: u64,
    /// Faults served from a held copy.
    pub held_faults: u64,
    /// Faults on a page already present: another thread's fault served it first, or a page
    /// of the program's own was there when the copy came (nothing brought in).
    pub spurious_faults: u64,
    /// Write-protect faults served: the program's first writes to clean pages, each of
    /// which discarded the page's copy in the store (at larger units, left its bytes stale
    /// in its unit; and any that found it out or dirty already, or a zeroed page that came in
    /// with a clean unit's copy).
    pub first_write_faults: u64,
    /// Resident pages the store still holds a copy of (faulted in by a read, not written
    /// since): evicting one again is only dropping it.
    pub clean_pages: u64,
    /// Copies of pages read in that the store freed because it was full
    /// ([`RegionConfig::free_copies_when_full`]): pages a read fault brought in dirty, and
    /// clean pages whose copy the clock freed as it gave them a second chance.
    pub copies_freed: u64,
    /// Where faults that bring pages in wait for the reclaim thread (counted in
    /// [`deferred_faults`](Self::deferred_faults)): resident pages past the budget by its
    /// margin, or, while the budget sizes itself, past its cap by the cap's margin (below
    /// its cap a self-sized budget is what the reclaim thread evicts to, not a limit a
    /// fault waits on).
    pub fault_hold_pages: u64,
    /// Times a fault was held back because the resident pages were past
    /// [`fault_hold_pages`](Self::fault_hold_pages), counted in
    /// [`deferred_faults`](Self::deferred_faults) too: the budget (or, while it sizes
    /// itself, its cap) throttling the program while the reclaim thread catches up.
    pub budget_held_faults: u64,
    /// Pages dropped with a copy in the store: `evictions_dirty + evictions_clean`.
    pub evictions: u64,
    /// Evictions that compressed the page and wrote it to the store.
    pub evictions_dirty: u64,
    /// Evictions of clean pages: the store's copy kept, nothing compressed or written.
    pub evictions_clean: u64,
    /// Pages found all zeros at eviction: dropped with nothing stored.
    pub zero_evictions: u64,
    /// Evictions the store refused (the page stayed resident or was held).
    pub evict_failures: u64,
    /// Pages the program dropped (`MADV_DONTNEED`, `MADV_FREE`).
    pub removed_pages: u64,
    /// Pages the program unmapped.
    pub unmapped_pages: u64,
    /// Pages the program moved out with `mremap`.
    pub remapped_pages: u64,
    /// Pages whose stored copy could not be read: a touch raises SIGBUS.
    pub poisoned_pages: u64,
    /// Pages installed by fault-around beside the faulting page (stored pages, and the ones
    /// an evictor found all zeros: as the zero page, or at larger units, inside a unit read,
    /// as pages of zeros with its copy).
    pub fault_around_pages: u64,
    /// Reads of the device by faults: each a decompression of one compression unit
    /// ([`RegionConfig::unit_size`]; a page at page-sized units), which serves every stored
    /// page of that unit the fault brings in.
    pub store_reads: u64,
    /// Pages the region held resident that an eviction's `UFFDIO_MOVE` found gone from
    /// the program's memory (`ENOENT`) and not in the pad either, which read back as zeros
    /// from then on: content lost, and named in [`Region::last_error`]. 0 unless the
    /// kernel dropped a page behind the region's back (docs/region.md, "When the kernel
    /// swaps the region"): none in any test run since the pad is looked in
    /// ([`unreported_moves`](Self::unreported_moves)).
    pub lost_pages: u64,
    /// Pages an eviction's `UFFDIO_MOVE` moved into the pad and said it had not (`EEXIST`
    /// after a retried step: Linux 6.18, while the kernel's reclaim swaps region pages out),
    /// found there with their sources empty and stored as any page moved out; left as the
    /// kernel said, each would have been lost.
    pub unreported_moves: u64,
    /// Missing-page faults on pages the region held resident with nothing mapped there,
    /// served with zeros (counted in [`zero_faults`](Self::zero_faults) too): a page the
    /// program dropped (`MADV_DONTNEED`) while another of its threads touched it, whose
    /// fault was served after the drop's event and before the kernel's zap (lib.rs, "The
    /// program's `MADV_DONTNEED`"), or one it freed (`MADV_FREE`) that the kernel reclaimed
    /// later. Zeros are what the program reads there; any other cause would be a loss,
    /// which is why it is counted.
    pub vanished_pages: u64,
    /// Pages brought back in after the region evicted them: from the store (faults and
    /// fault-around), from a held copy, or as zeros where the eviction found the page all
    /// zeros. The kernel's `workingset_refault_anon` for a region: what its choice of cold
    /// pages costs (a page never written or dropped by the program is not one).
    pub refaults: u64,
    /// Pages whose compressed copy the device has written back to its backing store
    /// ([`Region::set_backing`], [`Region::writeback`]): `bd_stat`'s `bd_count`.
    pub written_back_pages: u64,
    /// Faults by how long the fault thread took from reading one to installing its page or
    /// lifting its protection (see [`LATENCY_BUCKETS`]): every fault served, spurious ones
    /// included.
    pub fault_latency_us: [u64; LATENCY_BUCKETS],
    /// Faults served late: the address space was changing (`EAGAIN`), or the region was
    /// past [`fault_hold_pages`](Self::fault_hold_pages) while the reclaim thread caught up
    /// (those counted in [`budget_held_faults`](Self::budget_held_faults) too).
    pub deferred_faults: u64,
    /// Whether the fault thread may run at idle priority ([`RegionConfig::idle_priority`],
    /// and the process may leave idle priority again).
    pub idle_priority_usable: bool,
    /// Whether the fault thread runs at idle priority now, keeping a faulting thread on
    /// its CPU.
    pub idle_priority: bool,
    /// How often the fault thread's idle priority was ended because faults waited for it
    /// (another thread held its CPU).
    pub idle_priority_demotions: u64,
    /// How often the fault thread moved to the CPU of the thread whose faults it serves.
    pub fault_thread_moves: u64,
    /// Whether the region can ask the machine for CPU wake-ups without delay while faults
    /// come ([`RegionConfig::cpu_latency_qos`]; [`Region::cpu_latency_qos_unused`] says
    /// why not where it cannot).
    pub cpu_latency_qos_usable: bool,
    /// Whether that request is held now: from a fault until the fault thread, waking after
    /// 10 ms with none, withdraws it.
    pub cpu_latency_qos_held: bool,
    /// Times the request was taken: once for each spell of faults.
    pub cpu_latency_qos_holds: u64,
    /// Waits of the fault thread for a message in a blocking read (while faults come, where
    /// the kernel allows it), not in `poll`: one system call less on each fault's path.
    pub parked_reads: u64,
    /// Times a thread needing the fault thread out of such a read (an evictor's batch,
    /// [`Region::stats`], the request's alarm) rang it out (module `bell`).
    pub fault_thread_rung: u64,
    /// Times the reclaim thread looked at the region: woken by a fault past the budget, or
    /// at its 100 ms tick, or for the next batch of a pass.
    pub reclaim_looks: u64,
    /// Whether the region is over its budget with nothing it can evict: every candidate
    /// refused (the program locked its pages, or made them read-only: `last_error` says
    /// which), so reclaim backs off, trying again at most once a second.
    pub reclaim_blocked: bool,
    /// Reclaim batches that could evict nothing for that reason.
    pub reclaim_blocked_passes: u64,
    /// Microseconds some thread of the program waited on the region since it was made:
    /// from a fault's message read to its page in, while any fault waits (the region's own
    /// PSI "some", autosize.rs's `StallClock`).
    pub stall_us: u64,
    /// That wait's share of the last whole second, parts per million.
    pub stall_share_ppm: u64,
    /// The self-sizing budget's controller, if the budget sizes itself: its state, limits
    /// and last steps.
    pub autosize: Option<AutosizeStats>,
    /// The device's `mm_stat`.
    pub mm_stat: MmStat,
    /// The device's `bd_stat`, where it has a backing store.
    pub bd_stat: Option<BdStat>,
}
