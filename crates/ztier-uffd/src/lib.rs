//! Live memory with a RAM budget: a [`Region`] is an anonymous mapping registered with
//! userfaultfd whose cold pages are kept compressed in a zram device (region page `i` is
//! zram page `i`, reached through the device's public API only), so that at most a budget of
//! its pages is resident while the program sees all of it.
//!
//! Two threads serve a region (three while it is far over budget; and the fault thread's
//! guard where idle priority is usable, see below). The **fault thread** reads the userfaultfd's messages: a fault
//! on a page that is out is served by `UFFDIO_COPY` of its decompressed content, or by
//! `UFFDIO_ZEROPAGE` (a read) or a copy of zeros (a write) for a page never written or
//! dropped; the program's own `MADV_DONTNEED`/`MADV_FREE`, `munmap` and `mremap` arrive as
//! events (`UFFD_FEATURE_EVENT_REMOVE`, `_UNMAP`, `_REMAP`) and drop the stored copies they
//! make stale. It never reads or writes the region itself (a fault it took there would wait
//! for itself). The **reclaim thread** runs once the resident pages exceed the budget, and
//! on until they are a little under it (a sixteenth of the budget, at most 128 pages, so
//! that a program faulting pages in does not wake it again at each fault-around window): it
//! picks cold pages by a clock over the page table (a page faulted in gets a second chance),
//! stores them and drops them; while the region is far over its budget a second evictor
//! takes pages from the same clock beside it (two CPUs compressing), with its own part of
//! the pad.
//!
//! The fault thread keeps to the CPU of the thread that faults, and while a single thread
//! faults it runs at idle priority, so that the faulting thread, woken by the copy, stays
//! on that CPU: on a machine whose idle CPUs halt, a fault's two wake-ups across CPUs cost
//! ten times the rest of it. A guard thread ends idle priority when faults wait for it
//! (`placement.rs`, [`RegionConfig::idle_priority`]). When the two are apart all the same,
//! a CPU latency request the fault thread holds while faults come keeps idle CPUs polling
//! instead of halting, so the crossing costs little (`cpu_latency_qos.rs`,
//! [`RegionConfig::cpu_latency_qos`]; a thread of its own waits on the request's alarm).
//! While faults come, the fault thread waits for the next in a blocking read of the
//! descriptor rather than in `poll`, where the kernel allows it; other threads that need it
//! meanwhile ring it out (`bell.rs`).
//!
//! The measuring rig ([`rig`], not a region's) measures what a region is set beside: the floor
//! under a fault's latency on the machine at hand (the same round trip served by a bare
//! handler: [`rig::floor`]), the kernel's own path for the same pages ([`rig::pageout`]), and
//! the refaults of policies that see more than a region can ([`rig::oracle`]).
//!
//! # The eviction protocol
//!
//! A page is taken out with `UFFDIO_MOVE` into a page of a landing pad (`scratch`, a mapping
//! registered with the same userfaultfd): the move clears the region's page-table entry and
//! flushes the TLBs before the page appears in the pad, so every write of the program lands
//! either before the move (and is in the stored copy) or after it (and faults, and waits).
//! The reclaim thread moves a run of neighbouring cold pages with one move (one TLB flush
//! for the run), each page locked. The copy in the pad is stable (no one else maps it), so
//! it is compressed from there with no write-protection pass, then the pad is emptied
//! (`MADV_DONTNEED`, a batch at a time; its last few present pages read first, so that the
//! frames the next faults' copies get are warm: `Shared::empty_pad`).
//! The classic alternative (write-protect, copy, `MADV_DONTNEED` the region page) would
//! send the handler a `REMOVE` event for its own drop, indistinguishable from the program's.
//!
//! Per page, a state byte (changed only under the page's stripe of `locks`):
//!
//! | state | the page-table entry | the store | a fault |
//! |---|---|---|---|
//! | `EMPTY` | empty, or about to be (a drop whose event was read) | nothing | zeros |
//! | `EMPTY` + `ZEROED` | empty: an evictor found the page all zeros | nothing | zeros, a refault |
//! | `RESIDENT` | present (maybe the zero page) | nothing | spurious: wake |
//! | `RESIDENT` + `CLEAN` | present, write-protected | zram page `i`, the same bytes | a write: the copy goes, then the protection |
//! | `STORED` | empty | zram page `i` | decompress, copy |
//! | `HELD` | empty | a heap copy (the store refused it) | copy |
//! | `GONE` | a page the program's `mremap` moved onto the region: the program's own | nothing | wake |
//! | `UNMAPPED` | unmapped or moved away by the program | nothing | (kept by `MREMAP_DONTUNMAP`) zeros |
//!
//! The races, and why each is safe:
//! - **Eviction against the program's writes**: the move is atomic (above).
//! - **A fault on a page under eviction**: the evictor holds the page's lock from before the
//!   move until the state says `STORED` (or the page is back); the fault thread waits for
//!   that lock, which is held across the run's move and the compressions of the run's pages
//!   up to its own (each page's released once it is settled, in page order), never across
//!   anything that waits for the fault thread.
//! - **The program's `MADV_DONTNEED`**: the kernel queues `REMOVE`, waits until it is read,
//!   then zaps. The fault thread reads and handles events under `gate` (write), before it
//!   serves any fault read after them: the stored copy is discarded and the page is `EMPTY`
//!   before anything can fault on it again, so nothing stale comes back.
//! - **`munmap` / `mremap` and a move from a stale address**: from before the kernel
//!   changes the address space until its event has been read, every `UFFDIO_*` of this
//!   descriptor fails with `EAGAIN` (the context's `mmap_changing`). An evictor checks the
//!   state and moves under `gate` (read), and the fault thread reads and handles the event
//!   under `gate` (write), so no move ever sees an address whose unmap it has not seen: a
//!   move never takes a page of a mapping the program put where the region was.
//!   `mremap` moves pages out of the region: their stored copies are copied to the new
//!   place, which is then unregistered (those pages leave the region and its budget).
//! - **`EAGAIN`** from a copy: the fault waits in a queue while the messages are read, then
//!   is served again from its (maybe changed) state. From a move: the page was not moved and
//!   stays resident; the batch ends.
//! - **`EEXIST`** from a copy: the page is present; the stored copy is stale and goes.
//! - **A store that fails** (the device's memory limit, its allocator): the page stays in
//!   memory, kept whole in the heap (`HELD`) until it is touched, when it is copied back; the
//!   error is counted and kept ([`Region::evict`] returns it). It is not moved back into
//!   the region at once: that move would need `gate`, which comes before the page lock the
//!   evictor holds.
//! - **The budget**: the reclaim thread evicts once the resident pages exceed it, down to
//!   its margin under it (a sixteenth of it, at most 128 pages); the fault thread holds
//!   faults that bring a page in back (in its queue, still reading messages) while the
//!   resident pages are more than the margin past it and the reclaim thread is making
//!   progress, and the reclaim thread wakes it after each batch. So the resident pages run
//!   past the budget by at most the margin, one faulting page and its fault-around window
//!   while reclaim catches up, and pages moved out sit in the pad until their batch ends.
//! - **Dropping the region**: the evictors stop first (their drops of the pad need the
//!   fault thread), then the CPU latency request's alarm watcher (a ring of its is read by
//!   the fault thread, still running), then the fault thread, rung out of its read if parked
//!   (it reads every ring made before it ends); the userfaultfd is closed before the mappings are
//!   unmapped (an unmap with the descriptor open would wait for its `UNMAP` event to be read),
//!   and only the pages still the region's are unmapped: what the program unmapped or moved
//!   away may hold its own mappings since.
//!   Threads still touching the region must be gone: the safe API borrows the region.
//! - **`fork`**: the region and the pad are `MADV_DONTFORK`: a child does not have them.
//!
//! # Clean pages
//!
//! A page a *read* fault brings in from the store (with its fault-around neighbours) is
//! installed write-protected (`UFFDIO_COPY_MODE_WP`; the region is registered in
//! write-protect mode too) and keeps its copy in the store: its state says `RESIDENT` +
//! `CLEAN`. Evicting it again is only the move into the pad and the pad's drop: nothing
//! is compressed or written (`evictions_clean`). A *write* fault on a stored page brings it
//! in unprotected, its copy discarded (dirty, as are zero-filled and held pages).
//!
//! The program's first write to a clean page is a write-protect fault that the fault thread
//! serves, synchronously: under the page's lock it discards the copy and clears `CLEAN`,
//! then lifts the protection (`UFFDIO_WRITEPROTECT`), which wakes the writer. **The race
//! between that write and an evictor's decision**: the evictor reads `CLEAN` and moves the
//! page under the same page lock. The write cannot land before the fault thread has taken
//! that lock and discarded the copy (it waits in the kernel, the page still protected), so
//! either the evictor held the lock first and moved the page with no write in it (the
//! writer's fault then finds the page out, and is served as a write fault on a stored page:
//! the copy is its content), or the fault thread did, and the evictor finds the page dirty
//! and compresses what the move took, write included. No copy older than a write is ever
//! kept for a page that is present, so none is served after one.
//!
//! Why not `UFFD_FEATURE_WP_ASYNC` with `PAGEMAP_SCAN` (a write resolved in the kernel
//! without the handler, far cheaper than a fault's round trip): nothing orders such a write
//! against the evictor. A scan before the move can say "not written" and the write land
//! before the move; the move does not carry the write-protect bit into the pad, so after it
//! nothing tells whether the page was written, short of comparing it with its copy
//! (a decompression). The synchronous fault costs one handler round trip per page that is
//! read in and then written; a page faulted in by a write costs none.
//!
//! What else sees a clean page: the program's `MADV_DONTNEED`, `munmap` and `mremap`
//! discard its copy (`drop_stored`) like a stored page's; a page `mremap` moved out that was
//! clean is unprotected when written (its write-protect fault is outside the region) and the
//! new range's unregistering clears the protection; a copy that finds the page present
//! (`EEXIST`) makes it dirty. A user-mode-only userfaultfd cannot serve a write the kernel
//! makes (a `read(2)` into a clean page fails with `EFAULT`), as for missing pages.
//!
//! # Lock order
//! `gate` (the fault thread's write while it reads and handles messages, and while it is
//! parked in its blocking read; an evictor's read while it checks pages and moves them,
//! and `stats()`'s, each taken through `gate_read`, which rings a parked fault thread out
//! first: the ring waits for the fault thread's next read, and its callers hold no lock the
//! fault thread takes before that read) → `locks[page % STRIPES]` → the zram device's own
//! locks, and `held` (a leaf). Page locks, several at once: the fault thread takes a
//! faulting page's and then its fault-around neighbours' in page order, waiting for each;
//! an evictor waits only for the first page of its run and takes the others with `try_lock`
//! (a run ends at the first it cannot have), so it never waits holding one, and no cycle
//! can form; everyone else holds one at a time. The reclaim signal's mutex and the
//! helper's are taken alone; `placement`'s guard's (its sleep) is a leaf, which the fault
//! thread may take under `gate` (`placement` is otherwise atomics); the CPU latency
//! request's reason (`cpu_latency_qos.rs`) is a leaf, which the fault thread may take under
//! `serving` or `gate` (when the device refuses a write). The bell (`bell.rs`) is atomics.
//! `manual_pad_used` (the pad pages of [`Region::evict`]) is taken before `gate`, and held
//! while those pages are emptied, which waits for the fault thread to read the event (it
//! never takes that lock). `serving`
//! (the fault thread's, while it serves) is taken before the page locks; `stats()` takes it
//! holding nothing.
mod bell;
mod capi;
mod cpu_latency_qos;
mod fault;
mod mapping;
mod page_state;
mod placement;
mod reclaim;
pub mod rig;
mod userfaultfd;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, RwLock};
use serde::Serialize;
use ztier_base::shard::{Counters, Stripes};
use ztier_compress::Algorithm;
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zram::Policy;
pub use ztier_zram::{Backing, PageSelector, PolicyConfig, PolicyStats, WbFormat, WbResult};
use ztier_zram::{BdStat, Device, MmStat, ZramError};

pub use cpu_latency_qos::NO_CPU_LATENCY_TARGET_US;
use mapping::Mapping;
use page_state::{Kind, PageState, PageStates};
use userfaultfd::{Uffd, Waker};

/// What making or using a region refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "userfaultfd is not allowed to this process ({0}): it needs CAP_SYS_PTRACE (root), \
         vm.unprivileged_userfaultfd=1, or access to /dev/userfaultfd"
    )]
    NotPermitted(io::Error),
    #[error("this kernel lacks {0} (UFFDIO_MOVE needs Linux 6.8)")]
    Unsupported(&'static str),
    #[error("a region of {len} bytes: the length must be a positive whole number of {page_size}-byte pages")]
    BadLength { len: usize, page_size: usize },
    #[error("a budget of {budget} bytes: it must hold at least one {page_size}-byte page")]
    BadBudget { budget: usize, page_size: usize },
    #[error("the device has {device_pages} pages of {device_page_size} bytes; the region needs {pages} of {page_size}")]
    DeviceTooSmall {
        device_pages: u64,
        device_page_size: usize,
        pages: u64,
        page_size: usize,
    },
    #[error("page {0} is beyond the region")]
    BadPage(u64),
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: io::Error,
    },
    /// A page could not be stored (the device's memory limit, its allocator): it stays
    /// resident.
    #[error("page {page} stays resident: the store refused it: {cause}")]
    Store { page: u64, cause: ZramError },
    #[error("making the device's pool: {0}")]
    Pool(ztier_pool::PoolError),
    #[error("making the device: {0}")]
    Device(ZramError),
    /// The device refused an operation the program asked of it ([`Region::set_backing`],
    /// [`Region::writeback`]): what it was, and why.
    #[error("{what}: {cause}")]
    Zram {
        what: &'static str,
        cause: ZramError,
    },
    /// A page the reclaim could not move out, and why: it stays resident, and reclaim
    /// backs off (waiting longer each time nothing can go) until the program undoes it.
    #[error("page {page} cannot be evicted: {reason}; reclaim backs off while it stays so")]
    Unmovable { page: u64, reason: UnmovableReason },
}

/// Why a page cannot be moved out of the region ([`Error::Unmovable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmovableReason {
    /// The program locked it in memory (`mlock`, `MCL_CURRENT`).
    Locked,
    /// The program made it read-only (`mprotect`).
    ReadOnly,
    /// The kernel refused the move for another reason (its errno).
    Other(i32),
}

impl std::fmt::Display for UnmovableReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmovableReason::Locked => f.write_str("the program locked it in memory (mlock)"),
            UnmovableReason::ReadOnly => {
                f.write_str("the program made it read-only (mprotect): only writable pages move")
            }
            UnmovableReason::Other(e) => write!(
                f,
                "UFFDIO_MOVE refused it: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Page lock stripes.
const STRIPES: usize = 1024;

/// Pages an evictor moves out before it empties its part of the pad. Each emptying is a
/// `MADV_DONTNEED` of the pad, which waits for the fault thread to read its `REMOVE` event
/// (a wake-up of another CPU), and each batch ends with a wake-up of the fault thread: 256
/// rather than 64 made eviction 1.2-1.5x faster (MEASUREMENTS.md), for at most 2 MiB of pad
/// resident while the evictors work.
const BATCH: usize = 256;

/// The most pages of a region's budget margin (`Shared::budget_margin`, otherwise a
/// sixteenth of the budget): how far under the budget an eviction pass goes (each pass that
/// stopped at the budget itself was as long as the fault-around window that started it, and
/// cost a wake-up of the reclaim thread, the pad's emptying, a wait for the fault thread,
/// and a wake-up of the fault thread back), and how far past it faults may take the
/// resident pages while the reclaim thread catches up.
const RECLAIM_MARGIN: u64 = 128;

/// Pad pages of [`Region::evict`], emptied together once all are used: each emptying is a
/// `REMOVE` event the caller waits for the fault thread to read (the pad is registered with
/// the region's userfaultfd, which `UFFDIO_MOVE` needs), two wake-ups a call were it one a
/// page, and every wake-up of the program's thread is a chance for the scheduler to place
/// it away from the fault thread.
const MANUAL_PAD: usize = 16;

/// The pad's last page is the fault thread's bell (bell.rs): never mapped, never moved into.
const BELL_PAGE: usize = 2 * BATCH + MANUAL_PAD;

ztier_base::counters! {
    /// The counters of [`RegionStats`] kept per thread shard.
    enum Count {
        SpuriousFaults,
        Evictions,
        CleanEvictions,
        ZeroEvictions,
        EvictFailures,
        Removed,
        Unmapped,
        Remapped,
        Poisoned,
        Deferred,
        FaultAround,
        FirstWrites,
        ZeroRefaults,
        ParkedReads,
        ReclaimLooks,
        BlockedPasses,
    }
}

/// Buckets of the fault latency histogram: bucket 0 under 1 µs, bucket `k` from
/// `2^(k-1)` to `2^k` µs, the last everything longer.
pub const LATENCY_BUCKETS: usize = 16;

/// The fault thread's latency histogram (it alone records).
#[derive(Default)]
struct Latency([AtomicU64; LATENCY_BUCKETS]);

impl Latency {
    fn record(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.0[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Relaxed);
    }
}

/// A region's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RegionStats {
    pub pages: u64,
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
    /// which discarded the page's copy in the store (and any that found it out or dirty
    /// already).
    pub first_write_faults: u64,
    /// Resident pages the store still holds a copy of (faulted in by a read, not written
    /// since): evicting one again is only dropping it.
    pub clean_pages: u64,
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
    /// Pages installed by fault-around beside the faulting page.
    pub fault_around_pages: u64,
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
    /// over its budget while the reclaim thread caught up.
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
    /// The device's `mm_stat`.
    pub mm_stat: MmStat,
    /// The device's `bd_stat`, where it has a backing store.
    pub bd_stat: Option<BdStat>,
}

/// How a region makes its own device.
#[derive(Debug, Clone)]
pub struct RegionConfig {
    pub algorithm: Algorithm,
    pub allocator: AllocatorKind,
    /// The device's memory limit in bytes (0: none): a store past it fails and the page
    /// stays resident.
    pub store_limit: u64,
    /// The most stored pages a fault brings in after its own (0: none).
    pub fault_around: usize,
    /// Whether a page read in from the store keeps its copy there, so that evicting it
    /// again unwritten costs no compression or store write (module's "Clean pages"). Off,
    /// every page comes in dirty: for a program that writes nearly every page it reads,
    /// where each first write would cost a write-protect fault.
    pub clean_pages: bool,
    /// Whether the fault thread may run at idle priority (`SCHED_IDLE`) while a single
    /// thread faults, which keeps that thread on the fault thread's CPU: on a machine whose
    /// idle CPUs halt (a VM), a fault's two wake-ups across CPUs cost ten times the rest of
    /// it. Used only where the process may leave idle priority again (`CAP_SYS_NICE` or an
    /// `RLIMIT_NICE` of 20); taken back whenever faults wait for it (module `placement`).
    pub idle_priority: bool,
    /// Whether the fault thread asks the machine, through the kernel's CPU latency QoS
    /// (`/dev/cpu_dma_latency`, root's by default), to keep idle CPUs out of states slower
    /// to leave than polling, from a fault until none has come for 10 ms. When the
    /// scheduler puts the faulting thread and the fault thread on different CPUs, each of
    /// a fault's two wake-ups goes to a CPU that went idle in between; on a VM whose idle
    /// vCPUs halt at once that costs 50-80 µs a fault instead of 8-10. The price is power
    /// (on a VM, the host's CPU time): while the request is held, every idle CPU of the
    /// machine polls instead of halting, where its cpuidle driver's first state polls
    /// (x86's `haltpoll`, `intel_idle`, `acpi_idle`; elsewhere the request changes nothing).
    /// Where the device cannot be opened the region runs without it (module
    /// `cpu_latency_qos`).
    pub cpu_latency_qos: bool,
}

/// The default of [`RegionConfig::fault_around`]: a sequential touch reaches windows of 63
/// pages (256 KiB) after six faults. Each window costs two faults (its first page, then the
/// rest, which the faulting thread runs into while they are decompressed), so a larger one
/// spreads them thinner: free sequential fault-in on postgres and python 1.15-1.19x what
/// windows of 15 gave, cc1 (slower to decompress) the same; random reads and single-page
/// latency unchanged (MEASUREMENTS.md, 2026-11-27).
pub const MAX_AROUND: usize = 63;

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            algorithm: Algorithm::new(ztier_compress::Kind::Lz4),
            allocator: AllocatorKind::Zsmalloc,
            store_limit: 0,
            fault_around: MAX_AROUND,
            clean_pages: true,
            idle_priority: true,
            cpu_latency_qos: true,
        }
    }
}

/// What the region's threads share.
///
/// Field order is drop order: the userfaultfd closes before the mappings are unmapped.
struct Shared {
    uffd: Uffd,
    map: Mapping,
    /// The evictors' landing pad: `BATCH` pages for the reclaim thread, `BATCH` for its
    /// helper, [`MANUAL_PAD`] for [`Region::evict`], and the bell page ([`BELL_PAGE`]).
    scratch: Mapping,
    /// Shared with a policy the program starts ([`Region::start_policy`]).
    device: Arc<Device>,
    page_size: usize,
    pages: u64,
    budget_pages: AtomicU64,
    /// A state byte per page (page_state.rs).
    states: PageStates,
    /// The page locks: page `p`'s is stripe `p % STRIPES`. A holder of several takes the
    /// first waiting and the others only with `try_lock` (an evictor), or takes them in page
    /// order, fewer than `STRIPES` at once (the fault thread): see the lock order above.
    locks: Stripes,
    gate: RwLock<()>,
    resident: AtomicU64,
    stored: AtomicU64,
    /// Resident pages that are clean (page_state.rs).
    clean: AtomicU64,
    /// Pages the store refused, by page.
    held: Mutex<HashMap<u64, Box<[u8]>>>,
    counts: Counters<{ Count::COUNT }>,
    /// Faults served from the store, with zeros, from a held copy: counted by the fault
    /// thread alone, before its copy wakes the faulting thread (so that thread's next
    /// reading includes its own fault), and taken back if the copy fails.
    fault_ins: [AtomicU64; 3],
    latency: Latency,
    /// Held by the fault thread while it serves the faults it read, up to its recording of
    /// their latency; `stats()` waits for it, so a thread's figures include the recording
    /// of the fault that woke it.
    serving: Mutex<()>,
    /// The most stored pages a fault brings in beside its own.
    fault_around: usize,
    /// [`RegionConfig::clean_pages`].
    clean_pages: bool,
    /// Where the fault thread runs, and at what priority.
    placement: placement::Placement,
    /// The fault thread's request for CPU wake-ups without delay, while faults come.
    qos: cpu_latency_qos::CpuLatencyQos,
    /// Stops the watcher of the request's alarm.
    stop_watcher: AtomicBool,
    watcher_waker: Waker,
    /// How others get the fault thread out of its blocking read (bell.rs).
    bell: bell::Bell,
    /// Stops the evictors.
    stop: AtomicBool,
    /// Stops the fault thread (set only once the evictors are gone: their drops of the
    /// pad wait for the fault thread to read the event).
    stop_faults: AtomicBool,
    waker: Waker,
    /// The reclaim thread's wake-up: set when the budget is exceeded.
    reclaim_wanted: Mutex<bool>,
    reclaim_cv: Condvar,
    /// The clock's hand, shared by the evictors: each takes pages from it a segment at a
    /// time.
    hand: AtomicU64,
    /// The second evictor's wake-up (when the region is far over budget).
    helper_idle: Mutex<()>,
    helper_cv: Condvar,
    /// Whether the reclaim thread is in an eviction pass: the fault thread does not park in
    /// its read meanwhile (each batch would ring it out).
    reclaim_passing: AtomicBool,
    /// Whether the reclaim thread's last batch evicted nothing while the region was over
    /// its budget (the fault thread then stops holding faults back for the budget's sake:
    /// nothing would release them); cleared once the region is under its budget.
    reclaim_stuck: AtomicBool,
    /// The last reclaim batch over the budget could evict nothing: every candidate refused.
    reclaim_blocked: AtomicBool,
    /// How many of [`Region::evict`]'s pad pages are used since they were last emptied.
    manual_pad_used: Mutex<usize>,
    /// The last store error, as text.
    last_error: Mutex<Option<String>>,
}

/// zram's policy running on a region's device ([`Region::start_policy`]); it stops when
/// dropped, which the region's borrow makes happen before the region goes.
pub struct RegionPolicy<'a> {
    policy: Policy,
    _region: std::marker::PhantomData<&'a Region>,
}

impl RegionPolicy<'_> {
    /// What the policy did so far.
    pub fn stats(&self) -> PolicyStats {
        self.policy.stats()
    }
}

/// An anonymous mapping whose pages beyond a RAM budget are kept compressed; see the
/// module's documentation.
pub struct Region {
    shared: Arc<Shared>,
    fault_thread: Option<JoinHandle<()>>,
    reclaim_thread: Option<JoinHandle<()>>,
    helper_thread: Option<JoinHandle<()>>,
    guard_thread: Option<JoinHandle<()>>,
    watcher_thread: Option<JoinHandle<()>>,
}

impl Region {
    /// A region of `len` bytes, at most `budget` of them resident, storing in a new zram
    /// device (lz4 on zsmalloc).
    pub fn new(len: usize, budget: usize) -> Result<Region> {
        Region::with_config(len, budget, &RegionConfig::default())
    }

    /// A region storing in a new device made as `config` says.
    pub fn with_config(len: usize, budget: usize, config: &RegionConfig) -> Result<Region> {
        let page_size = ztier_base::os::page_size();
        check_length(len, page_size)?;
        let layout = ZsConfig {
            page_size,
            ..ZsConfig::default()
        };
        let pool = config.allocator.make_pool(&layout).map_err(Error::Pool)?;
        let device =
            Device::new(len as u64, config.algorithm.clone(), pool).map_err(Error::Device)?;
        device.set_mem_limit(config.store_limit);
        Region::make(
            len,
            budget,
            device,
            config.fault_around.min(1023),
            config.clean_pages,
            config.idle_priority,
            config.cpu_latency_qos,
        )
    }

    /// A region storing in `device`, which must have a page for each of the region's, of
    /// the OS page size, and be empty (its pages are the region's from now on).
    pub fn with_device(len: usize, budget: usize, device: Device) -> Result<Region> {
        let defaults = RegionConfig::default();
        Region::make(
            len,
            budget,
            device,
            defaults.fault_around,
            defaults.clean_pages,
            defaults.idle_priority,
            defaults.cpu_latency_qos,
        )
    }

    fn make(
        len: usize,
        budget: usize,
        device: Device,
        fault_around: usize,
        clean_pages: bool,
        idle_priority: bool,
        cpu_latency_qos: bool,
    ) -> Result<Region> {
        let page_size = ztier_base::os::page_size();
        check_length(len, page_size)?;
        let pages = (len / page_size) as u64;
        if device.page_size() != page_size || device.pages() < pages {
            return Err(Error::DeviceTooSmall {
                device_pages: device.pages(),
                device_page_size: device.page_size(),
                pages,
                page_size,
            });
        }
        if budget < page_size {
            return Err(Error::BadBudget { budget, page_size });
        }
        let os = |what| move |source| Error::Os { what, source };
        let mut uffd = Uffd::open().map_err(|e| match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => Error::NotPermitted(e),
            _ => Error::Os {
                what: "userfaultfd",
                source: e,
            },
        })?;
        let features = userfaultfd::FEATURE_EVENT_REMOVE
            | userfaultfd::FEATURE_EVENT_UNMAP
            | userfaultfd::FEATURE_EVENT_REMAP
            | userfaultfd::FEATURE_MOVE
            | userfaultfd::FEATURE_POISON
            | userfaultfd::FEATURE_THREAD_ID;
        uffd.api(features).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::Unsupported(
                "UFFDIO_MOVE, UFFDIO_POISON or the remove, unmap and remap events",
            ),
            _ => Error::Os {
                what: "UFFDIO_API",
                source: e,
            },
        })?;
        // Before any range is registered (it may read a message): whether the fault thread
        // may park in a blocking read (bell.rs).
        uffd.probe_nowait_reads();
        let map = Mapping::new(len).map_err(os("mmap of the region"))?;
        let scratch = Mapping::new((BELL_PAGE + 1) * page_size).map_err(os("mmap of the pad"))?;
        let bell = bell::Bell::new(scratch.addr() + (BELL_PAGE * page_size) as u64, page_size);
        // The region in write-protect mode too (its clean pages); the pad only for moves.
        uffd.register(
            map.addr(),
            map.len() as u64,
            userfaultfd::MODE_MISSING | userfaultfd::MODE_WP,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::Unsupported("write-protect mode on anonymous memory"),
            _ => Error::Os {
                what: "UFFDIO_REGISTER",
                source: e,
            },
        })?;
        uffd.register(
            scratch.addr(),
            scratch.len() as u64,
            userfaultfd::MODE_MISSING,
        )
        .map_err(os("UFFDIO_REGISTER"))?;
        let shared = Arc::new(Shared {
            uffd,
            map,
            scratch,
            device: Arc::new(device),
            page_size,
            pages,
            budget_pages: AtomicU64::new((budget / page_size) as u64),
            states: PageStates::new(pages).ok_or_else(|| Error::Os {
                what: "the page-state table",
                source: io::ErrorKind::OutOfMemory.into(),
            })?,
            locks: Stripes::new(STRIPES),
            gate: RwLock::new(()),
            resident: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            clean: AtomicU64::new(0),
            held: Mutex::new(HashMap::new()),
            counts: Counters::default(),
            fault_ins: Default::default(),
            latency: Latency::default(),
            serving: Mutex::new(()),
            fault_around,
            clean_pages,
            placement: placement::Placement::new(idle_priority),
            qos: cpu_latency_qos::CpuLatencyQos::open(cpu_latency_qos),
            stop_watcher: AtomicBool::new(false),
            watcher_waker: Waker::new().map_err(os("eventfd"))?,
            bell,
            stop: AtomicBool::new(false),
            stop_faults: AtomicBool::new(false),
            waker: Waker::new().map_err(os("eventfd"))?,
            reclaim_wanted: Mutex::new(false),
            reclaim_cv: Condvar::new(),
            hand: AtomicU64::new(0),
            helper_idle: Mutex::new(()),
            helper_cv: Condvar::new(),
            reclaim_stuck: AtomicBool::new(false),
            reclaim_blocked: AtomicBool::new(false),
            reclaim_passing: AtomicBool::new(false),
            manual_pad_used: Mutex::new(0),
            last_error: Mutex::new(None),
        });
        let spawn = |name: &str, f: fn(&Shared)| {
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&sh))
                .map_err(os("spawning a thread"))
        };
        let mut region = Region {
            shared: Arc::clone(&shared),
            fault_thread: None,
            reclaim_thread: None,
            helper_thread: None,
            guard_thread: None,
            watcher_thread: None,
        };
        region.fault_thread = Some(spawn("uffd-fault", fault::run)?);
        region.reclaim_thread = Some(spawn("uffd-reclaim", reclaim::run)?);
        region.helper_thread = Some(spawn("uffd-reclaim2", reclaim::run_helper)?);
        if shared.placement.usable() {
            region.guard_thread = Some(spawn("uffd-guard", |sh| {
                sh.placement.run_guard(|| sh.uffd.unread())
            })?);
        }
        if shared.qos.has_alarm() {
            region.watcher_thread = Some(spawn("uffd-alarm", |sh| {
                // At idle priority, its wake-ups never take a CPU from the program's threads.
                // It runs where a CPU is otherwise idle, which is where the request costs; it
                // holds no lock, and a want it holds only keeps the fault thread from parking.
                ztier_base::os::lower_to_idle_priority();
                sh.qos.watch_alarm(&sh.stop_watcher, &sh.watcher_waker, || {
                    sh.wake_fault_thread()
                })
            })?);
        }
        Ok(region)
    }

    /// The region's first byte. Reading and writing through it is the caller's business
    /// (the memory lives as long as the region); [`words`](Region::words) is the safe view.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.map.ptr()
    }

    pub fn len(&self) -> usize {
        self.shared.map.len()
    }

    /// The bytes the region's mapping and its pad have resident now (`Rss` in
    /// `/proc/self/smaps`; a mapping of the program's own placed where it unmapped part of
    /// the region counts too).
    pub fn rss_bytes(&self) -> io::Result<u64> {
        let map = self.shared.map.addr() as usize;
        ztier_base::os::rss_within(&[map..map + self.len(), self.pad_range()])
    }

    /// The addresses of the region's landing pad (the mapping its evictors move pages
    /// into before they store them), for a process's own accounting of what the region
    /// keeps resident (`/proc/self/smaps`): the region's mapping and this one.
    pub fn pad_range(&self) -> std::ops::Range<usize> {
        let start = self.shared.scratch.addr() as usize;
        start..start + self.shared.scratch.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn page_size(&self) -> usize {
        self.shared.page_size
    }

    pub fn pages(&self) -> u64 {
        self.shared.pages
    }

    /// Whether faults taken inside the kernel (a system call reading or writing the
    /// region) fail with `EFAULT`: the process could only have a user-mode-only
    /// userfaultfd.
    pub fn user_mode_only(&self) -> bool {
        self.shared.uffd.user_mode_only
    }

    /// The region as machine words any thread may read and write at once.
    pub fn words(&self) -> &[AtomicU64] {
        let n = self.len() / size_of::<AtomicU64>();
        // SAFETY: the mapping is page-aligned, `len` bytes long and lives as long as
        // `self`; any bytes are a valid AtomicU64, and atomics make concurrent access by
        // any thread sound. The kernel changes the memory only as the protocol says (a page
        // moved out comes back with its content; dropped pages read as zeros, as the owner
        // asked).
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.shared.map.ptr().cast::<AtomicU64>(), n)
        }
    }

    /// Sets the budget in bytes (at least one page).
    pub fn set_budget(&self, budget: usize) -> Result<()> {
        let page_size = self.shared.page_size;
        if budget < page_size {
            return Err(Error::BadBudget { budget, page_size });
        }
        self.shared
            .budget_pages
            .store((budget / page_size) as u64, Relaxed);
        self.shared.wake_reclaim_if_over();
        Ok(())
    }

    /// Drops `[offset, offset + len)` as the program's own `MADV_DONTNEED` would (it is
    /// one, as `MADV_DONTNEED_LOCKED`, which locked memory takes too): those pages read as
    /// zeros afterwards, and their stored copies go.
    pub fn discard(&self, offset: usize, len: usize) -> Result<()> {
        let page = self.shared.page_size;
        if !offset.is_multiple_of(page) || offset.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(Error::BadPage((offset / page) as u64));
        }
        // SAFETY: the range is inside the region; dropping its content is what the owner
        // asks; nothing holds a non-atomic reference into the region (`words` is atomic).
        #[allow(unsafe_code)]
        unsafe { self.shared.map.dont_need(offset, len) }.map_err(|source| Error::Os {
            what: "madvise(MADV_DONTNEED_LOCKED)",
            source,
        })
    }

    /// Evicts page `page` now if it is resident: `Ok(true)` if it went out, `Ok(false)` if
    /// it was not resident or the address space was changing, the store's error if it
    /// refused (the page stays in memory). The page's memory goes back to the OS with those
    /// of the calls after it, 16 calls at a time, or when the reclaim thread
    /// next finds the region within its budget and idle (within about 0.1 s): until then it
    /// is in the pad ([`pad_range`](Self::pad_range)), at most 16 pages a region.
    pub fn evict(&self, page: u64) -> Result<bool> {
        if page >= self.shared.pages {
            return Err(Error::BadPage(page));
        }
        let mut used = self.shared.manual_pad_used.lock();
        let r = self.shared.evict_one(page, 2 * BATCH + *used);
        *used += 1;
        if *used == MANUAL_PAD {
            self.shared.empty_pad(2 * BATCH, MANUAL_PAD);
            *used = 0;
        }
        Ok(matches!(r?, reclaim::Evicted::Out))
    }

    /// The region's figures. They include every drop, unmap and move the program's calls
    /// returned from: such a call returns once the fault thread read its event, which it
    /// handles under `gate` (write) in the same hold, so waiting for `gate` waits for that.
    pub fn stats(&self) -> RegionStats {
        let sh = &self.shared;
        drop(sh.gate_read());
        drop(sh.serving.lock());
        let c = |k: Count| sh.counts.sum(k);
        let bd_stat = sh.device.bd_stat();
        RegionStats {
            pages: sh.pages,
            budget_pages: sh.budget_pages.load(Relaxed),
            reclaim_target_pages: sh.reclaim_target(),
            resident_pages: sh.resident.load(Relaxed),
            stored_pages: sh.stored.load(Relaxed),
            clean_pages: sh.clean.load(Relaxed),
            held_pages: sh.held.lock().len() as u64,
            faults: sh.fault_ins[0].load(Relaxed),
            zero_faults: sh.fault_ins[1].load(Relaxed),
            held_faults: sh.fault_ins[2].load(Relaxed),
            spurious_faults: c(Count::SpuriousFaults),
            first_write_faults: c(Count::FirstWrites),
            evictions: c(Count::Evictions) + c(Count::CleanEvictions),
            evictions_dirty: c(Count::Evictions),
            evictions_clean: c(Count::CleanEvictions),
            zero_evictions: c(Count::ZeroEvictions),
            evict_failures: c(Count::EvictFailures),
            removed_pages: c(Count::Removed),
            unmapped_pages: c(Count::Unmapped),
            remapped_pages: c(Count::Remapped),
            poisoned_pages: c(Count::Poisoned),
            deferred_faults: c(Count::Deferred),
            fault_around_pages: c(Count::FaultAround),
            refaults: sh.fault_ins[0].load(Relaxed)
                + sh.fault_ins[2].load(Relaxed)
                + c(Count::FaultAround)
                + c(Count::ZeroRefaults),
            written_back_pages: bd_stat.map_or(0, |b| b.bd_count),
            fault_latency_us: std::array::from_fn(|i| sh.latency.0[i].load(Relaxed)),
            idle_priority_usable: sh.placement.usable(),
            idle_priority: sh.placement.idle(),
            idle_priority_demotions: sh.placement.demotions(),
            fault_thread_moves: sh.placement.moves(),
            cpu_latency_qos_usable: sh.qos.usable(),
            cpu_latency_qos_held: sh.qos.held(),
            cpu_latency_qos_holds: sh.qos.holds(),
            parked_reads: c(Count::ParkedReads),
            fault_thread_rung: sh.bell.times_rung(),
            reclaim_looks: c(Count::ReclaimLooks),
            reclaim_blocked: sh.reclaim_blocked.load(Relaxed),
            reclaim_blocked_passes: c(Count::BlockedPasses),
            mm_stat: sh.device.mm_stat(),
            bd_stat,
        }
    }

    /// Why the region does not ask for CPU wake-ups without delay
    /// ([`RegionConfig::cpu_latency_qos`]), where it does not.
    pub fn cpu_latency_qos_unused(&self) -> Option<String> {
        self.shared.qos.unused_because()
    }

    /// The last error a store gave the reclaim thread, if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().clone()
    }

    /// Gives the region's device a backing store, or takes it away (`None`): zram's
    /// `backing_dev`. [`writeback`](Self::writeback) and a policy
    /// ([`start_policy`](Self::start_policy)) move compressed copies there, out of memory; a
    /// fault on such a page reads it from the store (a read the store refuses, after its
    /// own retries, poisons the page: a touch raises SIGBUS, as the kernel's swap-in
    /// error does). Refused while pages are written back to the current store.
    pub fn set_backing(&self, store: Option<Backing>) -> Result<()> {
        let what = "setting the device's backing store";
        self.shared
            .device
            .set_backing(store)
            .map_err(|cause| Error::Zram { what, cause })
    }

    /// zram's `idle`: marks the stored copies not read or written for `older_than` (all
    /// of them: `None`) idle, for [`writeback`](Self::writeback) of
    /// [`PageSelector::Idle`] pages. A fault reading a page in from the store clears its
    /// mark; a page resident and clean keeps a copy the program's reads do not touch
    /// (userspace sees no accessed bits), so it may be marked and written back while in
    /// use, and its next eviction is still only a drop. Returns the copies marked.
    pub fn mark_idle(&self, older_than: Option<std::time::Duration>) -> u64 {
        self.shared.device.mark_idle(older_than)
    }

    /// zram's `writeback`: writes the stored copies `mode` selects (at most `max_pages`)
    /// to the backing store, freeing their memory. It runs beside faults and evictions
    /// (the device locks a page at a time); what the program sees does not change.
    pub fn writeback(&self, mode: PageSelector, max_pages: Option<u64>) -> Result<WbResult> {
        self.shared
            .device
            .writeback(mode, None, max_pages)
            .map_err(|cause| Error::Zram {
                what: "the device's writeback",
                cause,
            })
    }

    /// Starts zram's policy on the region's device (recompression and writeback of pages
    /// idle for a while, writeback down to a memory target), on a thread of its own at idle
    /// priority, until the returned [`RegionPolicy`] is dropped (which waits for its pass),
    /// at the latest with the region.
    pub fn start_policy(&self, config: PolicyConfig) -> Result<RegionPolicy<'_>> {
        let policy =
            Policy::start(Arc::clone(&self.shared.device), config).map_err(|source| Error::Os {
                what: "spawning the policy's thread",
                source,
            })?;
        Ok(RegionPolicy {
            policy,
            _region: std::marker::PhantomData,
        })
    }
}

fn check_length(len: usize, page_size: usize) -> Result<()> {
    if len == 0 || !len.is_multiple_of(page_size) {
        return Err(Error::BadLength { len, page_size });
    }
    Ok(())
}

impl Drop for Region {
    fn drop(&mut self) {
        let sh = &self.shared;
        // The guard first: it acts on the fault thread's id only while that thread runs.
        sh.placement.stop();
        if let Some(t) = self.guard_thread.take() {
            let _ = t.join();
        }
        sh.stop.store(true, Relaxed);
        {
            let mut wanted = sh.reclaim_wanted.lock();
            *wanted = true;
            sh.reclaim_cv.notify_all();
        }
        {
            let _idle = sh.helper_idle.lock();
            sh.helper_cv.notify_all();
        }
        // The evictors first: their drops of the pad wait for the fault thread to read the
        // event.
        for t in [self.reclaim_thread.take(), self.helper_thread.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
        // The alarm's watcher before the fault thread: a ring of its reads on.
        sh.stop_watcher.store(true, Relaxed);
        sh.watcher_waker.wake();
        if let Some(t) = self.watcher_thread.take() {
            let _ = t.join();
        }
        sh.stop_faults.store(true, Relaxed);
        sh.waker.wake();
        // A want that stays: the fault thread parks no more, and if parked is rung out
        // (this waits until it read the ring).
        std::mem::forget(sh.want_fault_thread_out());
        if let Some(t) = self.fault_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.uffd.shutdown();
        let ps = self.page_size;
        let mine = |page: u64| self.states.get(page).still_the_regions();
        if (0..self.pages).all(mine) {
            return; // the mapping's drop unmaps it whole
        }
        let mut runs = Vec::new();
        let mut page = 0;
        while page < self.pages {
            if !mine(page) {
                page += 1;
                continue;
            }
            let start = page;
            while page < self.pages && mine(page) {
                page += 1;
            }
            runs.push((start as usize * ps, (page - start) as usize * ps));
        }
        // SAFETY: the threads are gone and the region with them: nothing uses the mapping.
        #[allow(unsafe_code)]
        unsafe {
            self.map.unmap_runs(runs.into_iter())
        };
    }
}

impl Shared {
    fn count(&self, k: Count, n: u64) {
        self.counts.add(k, n);
    }

    /// `gate` for reading. A fault thread parked in its read holds it (write) until a
    /// message comes: it is rung out first (bell.rs). The caller holds no page lock and
    /// nothing else the fault thread takes before its next read (lock order above), so
    /// the ring, which waits for that read, waits for nothing that waits for it.
    fn gate_read(&self) -> parking_lot::RwLockReadGuard<'_, ()> {
        if let Some(g) = self.gate.try_read() {
            return g;
        }
        let want = self.want_fault_thread_out();
        let g = self.gate.read();
        drop(want);
        g
    }

    /// A want of the fault thread out of its blocking read (bell.rs), which is rung out
    /// now if it is parked; it does not park again until the want is dropped.
    fn want_fault_thread_out(&self) -> bell::Want<'_> {
        let want = self.bell.want();
        if want.must_ring {
            self.ring_bell();
        }
        want
    }

    /// Wakes the fault thread wherever it waits: its poll (the waker) or its blocking read
    /// (the bell, if it is parked). The CPU latency request's alarm watcher's call.
    fn wake_fault_thread(&self) {
        self.waker.wake();
        drop(self.want_fault_thread_out());
    }

    /// Rings the fault thread out of its blocking read (a want found it parked, and counted
    /// the ring): a `REMOVE` event for the bell page, which returns once the fault thread
    /// read it.
    fn ring_bell(&self) {
        // SAFETY: the bell page is the pad's last page, which no one reads, writes, maps or
        // moves a page into: there is nothing in it to drop, and no reference to it.
        #[allow(unsafe_code)]
        let dropped = unsafe {
            self.scratch
                .dont_need(BELL_PAGE * self.page_size, self.page_size)
        };
        if dropped.is_err() {
            self.bell.ring_failed();
        }
    }

    /// The region page at `addr`, if it is one.
    fn page_of(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.map.addr())?;
        (off < self.map.len() as u64).then(|| off / self.page_size as u64)
    }

    fn page_addr(&self, page: u64) -> u64 {
        self.map.addr() + page * self.page_size as u64
    }

    /// Notes whether the last batch over the budget was refused every page it tried.
    fn reclaim_blocked(&self, blocked: bool) {
        self.reclaim_blocked.store(blocked, Relaxed);
        if blocked {
            self.count(Count::BlockedPasses, 1);
        }
    }

    fn over_budget(&self) -> bool {
        self.resident.load(Relaxed) > self.budget_pages.load(Relaxed)
    }

    /// A sixteenth of `budget`, at most [`RECLAIM_MARGIN`] pages: small budgets get a margin
    /// in proportion, so that a region of a few MiB is not let run a quarter past its
    /// budget.
    fn budget_margin(budget: u64) -> u64 {
        (budget / 16).min(RECLAIM_MARGIN)
    }

    /// Where an eviction pass that the budget started stops: a margin under the budget
    /// (kswapd's high watermark above its low), so that a program faulting pages in keeps
    /// going for that many pages before the reclaim thread is woken again, and that thread
    /// evicts in batches, not a fault-around window at a time.
    fn reclaim_target(&self) -> u64 {
        let budget = self.budget_pages.load(Relaxed);
        budget - Shared::budget_margin(budget)
    }

    /// Where the fault thread holds faults that bring pages in, while the reclaim thread is
    /// making progress: resident pages past the budget by its margin. A fault served under
    /// it may still bring in its page and a fault-around window (`RegionConfig::fault_around`
    /// pages more, [`MAX_AROUND`] by default).
    fn fault_hold_above(&self) -> u64 {
        let budget = self.budget_pages.load(Relaxed);
        budget.saturating_add(Shared::budget_margin(budget))
    }

    fn wake_reclaim_if_over(&self) {
        if self.over_budget() {
            let mut wanted = self.reclaim_wanted.lock();
            if !*wanted {
                *wanted = true;
                self.reclaim_cv.notify_one();
            }
        }
    }

    /// Leaves `page`'s state for `to` (its lock held), keeping the resident and stored
    /// counts and dropping a held copy it leaves behind.
    fn leave(&self, page: u64, from: PageState, to: PageState) {
        match from.kind() {
            Kind::Resident => {
                self.resident.fetch_sub(1, Relaxed);
                if from.clean() {
                    self.clean.fetch_sub(1, Relaxed);
                }
            }
            Kind::Stored => {
                self.stored.fetch_sub(1, Relaxed);
            }
            Kind::Held => {
                self.held.lock().remove(&page);
            }
            _ => {}
        }
        match to.kind() {
            Kind::Resident => {
                self.resident.fetch_add(1, Relaxed);
                if to.clean() {
                    self.clean.fetch_add(1, Relaxed);
                }
            }
            Kind::Stored => {
                self.stored.fetch_add(1, Relaxed);
            }
            _ => {}
        }
        self.states.set(page, to);
    }

    /// Discards page `page`'s copy in the store, if it has one (its lock held).
    fn drop_stored(&self, page: u64, state: PageState) {
        if state.has_copy() {
            // A discard of an index in range only fails for a bad index.
            let _ = self.device.discard_page(page);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    const PS: usize = 4096;

    /// A region, and a watchdog dropped after it (fields drop in order), so that a drop
    /// that hangs is caught too.
    struct Guarded {
        region: Region,
        _done: std::sync::mpsc::Sender<()>,
    }

    impl std::ops::Deref for Guarded {
        type Target = Region;
        fn deref(&self) -> &Region {
            &self.region
        }
    }

    /// A region of `pages` pages, all of them in budget, its fault thread at normal priority
    /// (so that it reaches its wait at once after a fault, whatever else runs), or `None`
    /// (having said why) where this process may not use userfaultfd; under `CI` that fails
    /// instead. A thread aborts the process should the test (or the region's drop) hang
    /// for a minute: a ring never read.
    fn region(pages: usize, cpu_latency_qos: bool) -> Option<Guarded> {
        let (done, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_secs(60))
            {
                eprintln!("a region test hung for 60 s: aborting");
                std::process::abort();
            }
        });
        let config = RegionConfig {
            idle_priority: false,
            cpu_latency_qos,
            ..RegionConfig::default()
        };
        match Region::with_config(pages * PS, pages * PS, &config) {
            Ok(region) => Some(Guarded {
                region,
                _done: done,
            }),
            Err(e @ (Error::NotPermitted(_) | Error::Unsupported(_))) => {
                assert!(std::env::var_os("CI").is_none(), "CI must run this: {e}");
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Whether this kernel lets the fault thread park; where not, says so (and fails under
    /// `CI`, whose kernel does).
    fn may_park(r: &Region) -> bool {
        if r.shared.uffd.can_block() {
            return true;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "CI's kernel must let the fault thread park (RWF_NOWAIT on a userfaultfd)"
        );
        eprintln!("skipped: this kernel refuses RWF_NOWAIT on a userfaultfd");
        false
    }

    /// Whether the fault thread parks within a second (once it has served a fault and has
    /// nothing else to do; a message in between, such as the reclaim thread's emptying of
    /// the pad, may keep it out until the next fault).
    fn parks(r: &Region) -> bool {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if r.shared.bell.parked() {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    /// A fault from the store on `page` (evicted first), read back.
    fn fault_in(r: &Region, page: u64) {
        let words = r.words();
        let w = page as usize * (PS / 8);
        words[w].store(page + 1, Relaxed);
        // A ring just read may make the kernel refuse the move for a moment.
        while !r.evict(page).unwrap() {
            std::thread::yield_now();
        }
        assert_eq!(words[w].load(Relaxed), page + 1);
    }

    /// Faults until the fault thread parks, then `ring_out` (which must ring it out once):
    /// whether it rang exactly once, over up to 20 tries (a try whose park something else
    /// ended first is tried again). Two rings for one call fail at once.
    fn rings_out_once(r: &Region, ring_out: impl Fn()) -> bool {
        for attempt in 0..20u64 {
            fault_in(r, attempt % 4);
            if !parks(r) {
                continue;
            }
            let rung = r.shared.bell.times_rung();
            ring_out();
            match r.shared.bell.times_rung() - rung {
                1 => return true,
                0 => continue,
                n => panic!("rung {n} times for one call"),
            }
        }
        false
    }

    /// A parked fault thread holds `gate`: an eviction (which needs it) and the figures
    /// each ring it out once, the region's drop does too, and nothing hangs.
    #[test]
    fn a_parked_fault_thread_is_rung_out_by_an_eviction_the_figures_and_the_drop() {
        let Some(r) = region(8, false) else {
            return;
        };
        if !may_park(&r) {
            return;
        }
        for (page, w) in r.words().iter().step_by(PS / 8).enumerate() {
            w.store(page as u64 + 1, Relaxed);
        }
        assert!(
            rings_out_once(&r, || while !r.evict(5).unwrap() {
                fault_in(&r, 5)
            }),
            "an eviction never rang the parked fault thread out"
        );
        assert!(
            rings_out_once(&r, || {
                let s = r.stats();
                assert!(s.parked_reads >= 2 && s.fault_thread_rung >= 1, "{s:?}");
            }),
            "the figures never rang the parked fault thread out"
        );
        for (page, w) in r.words().iter().step_by(PS / 8).enumerate() {
            assert_eq!(w.load(Relaxed), page as u64 + 1, "page {page}");
        }
        fault_in(&r, 3);
        parks(&r);
        drop(r);
    }

    /// A fault thread parked when faults stop is rung out by the CPU latency request's
    /// alarm (nothing else wakes it here), and withdraws the request.
    #[test]
    fn the_cpu_latency_requests_alarm_rings_a_parked_fault_thread_out() {
        // The request's tests read the machine's target: this one's request is part of it.
        let _turn = cpu_latency_qos::tests::MACHINE_TARGET.lock();
        let Some(r) = region(4, true) else {
            return;
        };
        if !r.shared.qos.usable() {
            // The request's own tests say why (and fail under CI).
            eprintln!("skipped: {:?}", r.cpu_latency_qos_unused());
            return;
        }
        if !may_park(&r) {
            return;
        }
        for (page, w) in r.words().iter().step_by(PS / 8).enumerate() {
            w.store(page as u64 + 1, Relaxed);
        }
        let withdrawn_by_a_ring = (0..10u64).any(|attempt| {
            fault_in(&r, attempt % 4);
            if !parks(&r) {
                return false;
            }
            let rung = r.shared.bell.times_rung();
            let deadline = Instant::now() + Duration::from_secs(5);
            while r.shared.qos.held() {
                assert!(
                    Instant::now() < deadline,
                    "still held 5 s after the last fault"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // Else a message ended the park first and the poll's wake-up withdrew it.
            r.shared.bell.times_rung() > rung
        });
        assert!(
            withdrawn_by_a_ring,
            "the alarm never rang a parked fault thread out"
        );
    }
}
