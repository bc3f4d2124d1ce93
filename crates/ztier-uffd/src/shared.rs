//! What a region's threads share ([`Shared`]), grouped by who uses it: what every thread
//! reaches (the descriptor, the region's memory, the pad, the device, the page table and
//! the budget), the fault thread's own ([`FaultThread`]), the evictors' ([`Evictors`]), and
//! the figures everyone counts ([`Figures`]); how it is made (the userfaultfd opened and the
//! ranges registered) and dropped (only what is still the region's unmapped); and the
//! helpers the fault thread and the evictors both use: the gate taken for reading, the
//! bell, the budget's marks. The fault thread's work is fault.rs and fault_around.rs, the
//! evictors' reclaim.rs.
//!
//! Lock order: lib.rs (and page_table.rs for `gate` and the page locks). `Evictors::manual`
//! (the pad part of `Region::evict`) comes before `gate`; `FaultThread::serving` before the
//! page locks; the reclaim thread's and the second evictor's wake-up mutexes are taken alone;
//! `Figures::last_error` is a leaf.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLockReadGuard};
use ztier_base::shard::Counters;
use ztier_zram::Device;

use crate::autosize::{Autosize, StallClock};
use crate::bell::{Bell, Want};
use crate::cpu_latency_qos::CpuLatencyQos;
use crate::error::{Error, Result};
use crate::mapping::{Pad, PadPart, RegionMemory};
use crate::page_state::PageState;
use crate::page_table::PageTable;
use crate::placement::Placement;
use crate::userfaultfd::{self, Uffd, Waker};

/// Pages an evictor moves out before it empties its part of the pad. Each emptying is a
/// `MADV_DONTNEED` of the pad, which waits for the fault thread to read its `REMOVE` event
/// (a wake-up of another CPU), and each batch ends with a wake-up of the fault thread: 256
/// rather than 64 pays for those wake-ups over four times the pages (docs/diary.md has the
/// figures), for at most 2 MiB of pad resident while the evictors work.
pub(crate) const BATCH: usize = 256;

/// Pad pages of `Region::evict`, emptied together once all are used: each emptying is a
/// `REMOVE` event the caller waits for the fault thread to read (the pad is registered with
/// the region's userfaultfd, which `UFFDIO_MOVE` needs), two wake-ups a call were it one a
/// page, and every wake-up of the program's thread is a chance for the scheduler to place
/// it away from the fault thread.
pub(crate) const MANUAL_PAD: usize = 16;

/// The most pages of a region's budget margin (`Shared::budget_margin`, otherwise a
/// sixteenth of the budget): how far under the budget an eviction pass goes (each pass that
/// stopped at the budget itself was as long as the fault-around window that started it, and
/// cost a wake-up of the reclaim thread, the pad's emptying, a wait for the fault thread,
/// and a wake-up of the fault thread back), and how far past it faults may take the
/// resident pages while the reclaim thread catches up.
const RECLAIM_MARGIN: u64 = 128;

ztier_base::counters! {
    /// The counters of `RegionStats` kept per thread shard.
    pub(crate) enum Count {
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
        BudgetHeld,
        FaultAround,
        StoreReads,
        LostPages,
        UnreportedMoves,
        Vanished,
        CopiesFreed,
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
pub(crate) struct Latency(pub(crate) [AtomicU64; LATENCY_BUCKETS]);

impl Latency {
    pub(crate) fn record(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        let bucket = (u64::BITS - us.leading_zeros()) as usize;
        self.0[bucket.min(LATENCY_BUCKETS - 1)].fetch_add(1, Relaxed);
    }
}

/// Where a fault brought its page in from: the index of `Figures::fault_ins`.
#[derive(Clone, Copy)]
pub(crate) enum FaultIn {
    Store = 0,
    Zeros = 1,
    Held = 2,
}

/// What became of a fault the fault thread took up.
pub(crate) enum Served {
    Done,
    /// Not now: the address space is changing, or the budget is full.
    Later,
}

/// How the fault thread serves (a region's `RegionConfig`, as far as the threads see it).
pub(crate) struct Serving {
    /// The most stored pages a fault brings in beside its own.
    pub(crate) fault_around: usize,
    /// Whether a page read in keeps its copy in the store (`RegionConfig::clean_pages`).
    pub(crate) clean_pages: bool,
    /// `RegionConfig::free_copies_when_full`.
    pub(crate) free_copies_when_full: bool,
    /// `RegionConfig::idle_priority`.
    pub(crate) idle_priority: bool,
    /// `RegionConfig::cpu_latency_qos`.
    pub(crate) cpu_latency_qos: bool,
}

/// What the region's threads share.
///
/// Field order is drop order: the userfaultfd closes before the mappings are unmapped.
pub(crate) struct Shared {
    pub(crate) uffd: Uffd,
    pub(crate) memory: RegionMemory,
    /// The evictors' landing pad: a part of [`BATCH`] pages for each evictor, one of
    /// [`MANUAL_PAD`] for `Region::evict`, and the bell page.
    pub(crate) pad: Pad,
    /// Shared with a policy the program starts (`Region::start_policy`).
    pub(crate) device: Arc<Device>,
    pub(crate) page_size: usize,
    pub(crate) pages: u64,
    /// Pages of the device's compression unit: 1 (the default), or 4 and 16 for 16 and
    /// 64 KiB units (lib.rs, "Compression units").
    pub(crate) unit_pages: u64,
    pub(crate) table: PageTable,
    pub(crate) budget_pages: AtomicU64,
    /// While the budget sizes itself, its cap (pages): faults are held back only past the
    /// cap, so that a budget the controller lowered is a reclaim target (TMO's
    /// `memory.reclaim`), not a limit a new phase's hot set waits on (`memory.high`); 0
    /// otherwise (faults held at the budget).
    pub(crate) hold_at_least_pages: AtomicU64,
    /// The time faults waited (the region's own PSI "some"): written by the fault thread.
    pub(crate) stall: StallClock,
    /// The controller of a budget that sizes itself, if it does (autosize.rs): a leaf,
    /// taken by the reclaim thread for a step, by `Region::stats`, `set_autosize` and
    /// `set_budget`.
    pub(crate) autosize: Mutex<Option<Autosize>>,
    pub(crate) fault: FaultThread,
    pub(crate) evictors: Evictors,
    pub(crate) figures: Figures,
}

/// The fault thread's own, and how the other threads reach it.
pub(crate) struct FaultThread {
    /// The most stored pages a fault brings in beside its own.
    pub(crate) max_around: usize,
    /// `RegionConfig::clean_pages`.
    pub(crate) clean_pages: bool,
    /// `RegionConfig::free_copies_when_full`.
    pub(crate) free_copies_when_full: bool,
    /// Held by the fault thread while it serves the faults it read, up to its recording of
    /// their latency; `Region::stats` waits for it, so a thread's figures include the
    /// recording of the fault that woke it.
    pub(crate) serving: Mutex<()>,
    /// Where the fault thread runs, and at what priority.
    pub(crate) placement: Placement,
    /// Its request for CPU wake-ups without delay, while faults come.
    pub(crate) qos: CpuLatencyQos,
    /// How others get it out of its blocking read (bell.rs).
    pub(crate) bell: Bell,
    /// Wakes it from its poll.
    pub(crate) waker: Waker,
    /// Stops it (set only once the evictors are gone: their drops of the pad wait for it
    /// to read the event).
    pub(crate) stop: AtomicBool,
    /// Stops the watcher of the request's alarm, and wakes it.
    pub(crate) alarm_watcher_stop: AtomicBool,
    pub(crate) alarm_watcher_waker: Waker,
}

/// The evictors' own: the reclaim thread's, the second evictor's, and `Region::evict`'s
/// part of the pad.
pub(crate) struct Evictors {
    /// Stops them.
    pub(crate) stop: AtomicBool,
    /// The reclaim thread's wake-up: set when the budget is exceeded.
    pub(crate) wanted: Mutex<bool>,
    pub(crate) wanted_cv: Condvar,
    /// The clock's hand, shared by the evictors: each takes pages from it a segment at a
    /// time.
    pub(crate) hand: AtomicU64,
    /// The second evictor's wake-up (when the region is far over budget).
    pub(crate) helper_idle: Mutex<()>,
    pub(crate) helper_cv: Condvar,
    /// Whether the reclaim thread is in an eviction pass: the fault thread does not park in
    /// its read meanwhile (each batch would ring it out).
    pub(crate) passing: AtomicBool,
    /// Whether the reclaim thread's last batch evicted nothing while the region was over
    /// its budget (the fault thread then stops holding faults back for the budget's sake:
    /// nothing would release them); cleared once the region is under its budget.
    pub(crate) stuck: AtomicBool,
    /// The last reclaim batch over the budget could evict nothing: every candidate refused.
    pub(crate) blocked: AtomicBool,
    /// `Region::evict`'s part of the pad, and how many of its pages are used since it was
    /// last emptied.
    pub(crate) manual: Mutex<ManualPad>,
}

/// `Region::evict`'s part of the pad.
pub(crate) struct ManualPad {
    pub(crate) part: PadPart,
    pub(crate) used: usize,
}

/// What every thread counts for `RegionStats`.
pub(crate) struct Figures {
    pub(crate) counts: Counters<{ Count::COUNT }>,
    /// Faults served from the store, with zeros, from a held copy ([`FaultIn`]): counted by
    /// the fault thread alone, before its copy wakes the faulting thread (so that thread's
    /// next reading includes its own fault), and taken back if the copy fails.
    pub(crate) fault_ins: [AtomicU64; 3],
    pub(crate) latency: Latency,
    /// The last error, as text.
    pub(crate) last_error: Mutex<Option<String>>,
}

/// The pad parts of the two evictors, the reclaim thread's and the second's.
pub(crate) struct EvictorParts {
    pub(crate) reclaim: PadPart,
    pub(crate) helper: PadPart,
}

impl Shared {
    /// The shared state of a region of `len` bytes (checked by the caller), at most `budget`
    /// of them resident, storing in `device`: the userfaultfd opened and both mappings
    /// registered; and the evictors' parts of the pad, for their threads.
    pub(crate) fn new(
        len: usize,
        budget: usize,
        device: Device,
        serving: &Serving,
    ) -> Result<(Shared, EvictorParts)> {
        let page_size = ztier_base::os::page_size();
        let pages = (len / page_size) as u64;
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
        let memory = RegionMemory::new(len).map_err(os("mmap of the region"))?;
        let (pad, parts) =
            Pad::new(page_size, &[BATCH, BATCH, MANUAL_PAD]).map_err(os("mmap of the pad"))?;
        let [reclaim, helper, manual]: [PadPart; 3] =
            parts.try_into().ok().expect("three parts asked for");
        let bell = Bell::new(pad.bell_addr(), page_size);
        // The region in write-protect mode too (its clean pages); the pad only for moves.
        uffd.register(
            memory.addr(),
            memory.len() as u64,
            userfaultfd::MODE_MISSING | userfaultfd::MODE_WP,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => Error::Unsupported("write-protect mode on anonymous memory"),
            _ => Error::Os {
                what: "UFFDIO_REGISTER",
                source: e,
            },
        })?;
        let pad_range = pad.range();
        uffd.register(
            pad_range.start as u64,
            pad_range.len() as u64,
            userfaultfd::MODE_MISSING,
        )
        .map_err(os("UFFDIO_REGISTER"))?;
        let unit_pages = (device.unit_size() / page_size) as u64;
        let shared = Shared {
            uffd,
            memory,
            pad,
            unit_pages,
            device: Arc::new(device),
            page_size,
            pages,
            table: PageTable::new(pages).ok_or_else(|| Error::Os {
                what: "the page-state table",
                source: io::ErrorKind::OutOfMemory.into(),
            })?,
            budget_pages: AtomicU64::new((budget / page_size) as u64),
            hold_at_least_pages: AtomicU64::new(0),
            stall: StallClock::new(),
            autosize: Mutex::new(None),
            fault: FaultThread {
                max_around: serving.fault_around,
                clean_pages: serving.clean_pages,
                free_copies_when_full: serving.free_copies_when_full,
                serving: Mutex::new(()),
                placement: Placement::new(serving.idle_priority),
                qos: CpuLatencyQos::open(serving.cpu_latency_qos),
                bell,
                waker: Waker::new().map_err(os("eventfd"))?,
                stop: AtomicBool::new(false),
                alarm_watcher_stop: AtomicBool::new(false),
                alarm_watcher_waker: Waker::new().map_err(os("eventfd"))?,
            },
            evictors: Evictors {
                stop: AtomicBool::new(false),
                wanted: Mutex::new(false),
                wanted_cv: Condvar::new(),
                hand: AtomicU64::new(0),
                helper_idle: Mutex::new(()),
                helper_cv: Condvar::new(),
                passing: AtomicBool::new(false),
                stuck: AtomicBool::new(false),
                blocked: AtomicBool::new(false),
                manual: Mutex::new(ManualPad {
                    part: manual,
                    used: 0,
                }),
            },
            figures: Figures {
                counts: Counters::default(),
                fault_ins: Default::default(),
                latency: Latency::default(),
                last_error: Mutex::new(None),
            },
        };
        Ok((shared, EvictorParts { reclaim, helper }))
    }

    #[inline]
    pub(crate) fn count(&self, k: Count, n: u64) {
        self.figures.counts.add(k, n);
    }

    /// Counts a fault that brings its page in, before its copy wakes the faulting thread.
    #[inline]
    pub(crate) fn count_fault_in(&self, from: FaultIn) {
        self.figures.fault_ins[from as usize].fetch_add(1, Relaxed);
    }

    /// Takes back the count of a fault whose copy failed.
    pub(crate) fn take_back_fault_in(&self, from: FaultIn) {
        self.figures.fault_ins[from as usize].fetch_sub(1, Relaxed);
    }

    pub(crate) fn fault_ins(&self, from: FaultIn) -> u64 {
        self.figures.fault_ins[from as usize].load(Relaxed)
    }

    /// Keeps `what` as the region's last error (`Region::last_error`).
    pub(crate) fn note_error(&self, what: String) {
        *self.figures.last_error.lock() = Some(what);
    }

    /// `gate` for reading. A fault thread parked in its read holds it (write) until a
    /// message comes: it is rung out first (bell.rs). The caller holds no page lock and
    /// nothing else the fault thread takes before its next read (lock order above), so
    /// the ring, which waits for that read, waits for nothing that waits for it.
    pub(crate) fn gate_read(&self) -> RwLockReadGuard<'_, ()> {
        if let Some(g) = self.table.gate.try_read() {
            return g;
        }
        let want = self.want_fault_thread_out();
        let g = self.table.gate.read();
        drop(want);
        g
    }

    /// A want of the fault thread out of its blocking read (bell.rs), which is rung out
    /// now if it is parked; it does not park again until the want is dropped.
    pub(crate) fn want_fault_thread_out(&self) -> Want<'_> {
        let want = self.fault.bell.want();
        if want.must_ring && self.pad.ring_bell().is_err() {
            self.fault.bell.ring_failed();
        }
        want
    }

    /// Wakes the fault thread wherever it waits: its poll (the waker) or its blocking read
    /// (the bell, if it is parked). The CPU latency request's alarm watcher's call.
    pub(crate) fn wake_fault_thread(&self) {
        self.fault.waker.wake();
        drop(self.want_fault_thread_out());
    }

    /// The region page at `addr`, if it is one.
    pub(crate) fn page_of(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.memory.addr())?;
        (off < self.memory.len() as u64).then(|| off / self.page_size as u64)
    }

    pub(crate) fn page_addr(&self, page: u64) -> u64 {
        self.memory.addr() + page * self.page_size as u64
    }

    /// Discards page `page`'s copy in the store, if it has one (its lock held). With larger
    /// units the copy stays in its unit, stale and never read (a discard of part of a unit
    /// is a read-modify-write of it): the unit's next write replaces it, and the caller
    /// discards the units no page needs any more where it can
    /// ([`discard_unused_units`](Self::discard_unused_units), lib.rs's "Compression units").
    pub(crate) fn drop_stored(&self, page: u64, state: PageState) {
        if state.has_copy() && self.unit_pages == 1 {
            // A discard of an index in range only fails for a bad index.
            let _ = self.device.discard_page(page);
        }
    }

    /// The unit page `page` is in: its first page and the page after its last (the region's
    /// last unit may reach past the region).
    pub(crate) fn unit_of(&self, page: u64) -> std::ops::Range<u64> {
        let first = page - page % self.unit_pages;
        first..first + self.unit_pages
    }

    /// Discards the units of `pages` of which no page needs its copy any more (none stored
    /// nor clean), so that no evictor stores a page of one in between the look and the
    /// discard: if `locked`, the caller holds the locks of all of `pages`, and only the
    /// units wholly inside them are looked at; else every unit `pages` touches is, with all
    /// its pages' locks taken in page order (the fault thread's, holding no page lock: it
    /// alone waits for a page lock while holding others, lib.rs's lock order). Nothing to
    /// do at page-sized units, where `drop_stored` discarded each copy.
    pub(crate) fn discard_unused_units(&self, pages: std::ops::Range<u64>, locked: bool) {
        if self.unit_pages == 1 || pages.is_empty() {
            return;
        }
        let ps = self.page_size as u64;
        let mut unit = self.unit_of(pages.start);
        while unit.start < pages.end {
            let in_region = unit.start..unit.end.min(self.pages);
            let inside = pages.start <= in_region.start && in_region.end <= pages.end;
            if locked && !inside {
                unit = unit.end..unit.end + self.unit_pages;
                continue;
            }
            let locks: Vec<_> = match locked {
                true => Vec::new(),
                false => in_region.clone().map(|p| self.table.lock(p)).collect(),
            };
            if !in_region.clone().any(|p| self.table.state(p).has_copy()) {
                // A whole unit of the device: only fails for a bad range.
                let _ = self.device.discard(unit.start * ps, self.unit_pages * ps);
            }
            drop(locks);
            unit = unit.end..unit.end + self.unit_pages;
        }
    }

    /// Notes whether the last batch over the budget was refused every page it tried.
    pub(crate) fn reclaim_blocked(&self, blocked: bool) {
        self.evictors.blocked.store(blocked, Relaxed);
        if blocked {
            self.count(Count::BlockedPasses, 1);
        }
    }

    /// Whether copies of pages read in are freed now: the region frees them when its store
    /// is full, and it is. The kernel's `vm_swap_full()` (more than half of swap used), with
    /// the store as large as the pages the budget leaves out: copies of more than half that
    /// many pages, stored or clean; with no budget under the region's pages, no room at all.
    /// Only at page-sized units, where a freed copy's memory goes back at once: at larger
    /// ones it is part of its unit's object, which a fault from the middle of the unit
    /// would leave whole, and a freed page's next eviction would rewrite.
    pub(crate) fn frees_copies(&self) -> bool {
        let room = self.pages.saturating_sub(self.budget_pages.load(Relaxed));
        let copies = self.table.stored() + self.table.clean();
        self.fault.free_copies_when_full
            && self.unit_pages == 1
            && (room == 0 || copies.saturating_mul(2) > room)
    }

    pub(crate) fn over_budget(&self) -> bool {
        self.table.resident() > self.budget_pages.load(Relaxed)
    }

    /// The self-sizing budget's step, if one is due (the reclaim thread's, at each look),
    /// and the stall clock's second. (A budget the step raises releases no fault: while
    /// the budget sizes itself faults wait only past its cap.)
    pub(crate) fn autosize_tick(&self) {
        let now = std::time::Instant::now();
        self.stall.tick(now);
        let mut autosize = self.autosize.lock();
        let Some(controller) = autosize.as_mut() else {
            return;
        };
        let budget = self.budget_pages.load(Relaxed);
        let resident = self.table.resident();
        // What the program uses: the resident pages and the margin a pass leaves under the
        // budget, when fewer than the budget.
        let in_use = resident.saturating_add(Shared::budget_margin(budget));
        let stalled = self.stall.stalled_ns(now);
        let at_ms = self.stall.ms(now);
        if let Some(to) = controller.step(now, at_ms, stalled, budget, resident, in_use) {
            self.budget_pages.store(to, Relaxed);
        }
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
    pub(crate) fn reclaim_target(&self) -> u64 {
        let budget = self.budget_pages.load(Relaxed);
        budget - Shared::budget_margin(budget)
    }

    /// Where the fault thread holds faults that bring pages in, while the reclaim thread is
    /// making progress: resident pages past the budget (or, while the budget sizes itself,
    /// its cap) by its margin. A fault served under it may still bring in its page and a
    /// fault-around window (`RegionConfig::fault_around` pages more, `MAX_AROUND` by
    /// default).
    pub(crate) fn fault_hold_above(&self) -> u64 {
        let limit = self
            .budget_pages
            .load(Relaxed)
            .max(self.hold_at_least_pages.load(Relaxed));
        limit.saturating_add(Shared::budget_margin(limit))
    }

    pub(crate) fn wake_reclaim_if_over(&self) {
        if self.over_budget() {
            let mut wanted = self.evictors.wanted.lock();
            if !*wanted {
                *wanted = true;
                self.evictors.wanted_cv.notify_one();
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.uffd.shutdown();
        let ps = self.page_size;
        let mine = |page: u64| self.table.state(page).still_the_regions();
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
            runs.push(start as usize * ps..page as usize * ps);
        }
        // The threads are gone and the region with them: the memory's drop, after the
        // descriptor's, unmaps what is still the region's.
        self.memory.unmap_at_drop(runs);
    }
}
