//! The public API: a [`Region`] (made with a [`RegionConfig`], config.rs, or over a device
//! of the caller's), its figures ([`RegionStats`], stats.rs), and zram's policy run on its
//! device ([`RegionPolicy`]). Each method is a short way into the shared state (shared.rs)
//! and the threads' work (fault.rs, fault_around.rs, reclaim.rs); making a region starts
//! its threads, dropping it stops them in the order the protocol needs (lib.rs, "Dropping
//! the region").

use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

use ztier_pool::ZsConfig;
use ztier_zram::{Backing, Device, PageSelector, Policy, PolicyConfig};
use ztier_zram::{PolicyStats, WbResult};

use crate::autosize::{Autosize, AutosizeConfig};
use crate::config::RegionConfig;
use crate::error::{Error, Result};
use crate::shared::{Count, EvictorParts, FaultIn, ManualPad, Serving, Shared, MANUAL_PAD};
use crate::stats::RegionStats;
use crate::{fault, reclaim};

/// How long [`Region::evict`] waits for an address space that is changing (the kernel
/// refusing every move until the fault thread reads the change's event) before it gives up
/// on the page: far past any event's wait on a loaded machine.
pub const EVICT_WAITS_OUT: std::time::Duration = std::time::Duration::from_secs(1);

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
        let unit = config.device_unit(page_size)?;
        // Units above a page need the allocator's classes up to the unit's size (as
        // `ztier serve --unit` and a host's devices make theirs).
        let layout = ZsConfig {
            page_size,
            ..ZsConfig::default()
        }
        .with_max_object(unit);
        let pool = config.allocator.make_pool(&layout).map_err(Error::Pool)?;
        // A whole number of units: the last one's pages past the region are never used.
        let disksize = (len as u64).next_multiple_of(unit as u64);
        let device = Device::with_unit_size(disksize, config.algorithm.clone(), pool, unit)
            .map_err(Error::Device)?;
        device.set_mem_limit(config.store_limit);
        Region::make(len, budget, device, config)
    }

    /// A region storing in `device`, which must have a page for each of the region's, of
    /// the OS page size, and be empty (its pages are the region's from now on). Its unit
    /// is the device's ([`Device::unit_size`]).
    pub fn with_device(len: usize, budget: usize, device: Device) -> Result<Region> {
        Region::make(len, budget, device, &RegionConfig::default())
    }

    /// The region over `device` (the device's own settings in `config` are not used), its
    /// threads started.
    fn make(len: usize, budget: usize, device: Device, config: &RegionConfig) -> Result<Region> {
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
        let serving = Serving {
            fault_around: config.fault_around.min(1023),
            clean_pages: config.clean_pages,
            free_copies_when_full: config.free_copies_when_full,
            idle_priority: config.idle_priority,
            cpu_latency_qos: config.cpu_latency_qos,
        };
        let (shared, parts) = Shared::new(len, budget, device, &serving)?;
        if let Some(autosize) = &config.autosize {
            start_autosize(&shared, autosize)?;
        }
        let shared = Arc::new(shared);
        let spawn = |name: &str, f: Box<dyn FnOnce(&Shared) + Send>| {
            let sh = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || f(&sh))
                .map_err(|source| Error::Os {
                    what: "spawning a thread",
                    source,
                })
        };
        let mut region = Region {
            shared: Arc::clone(&shared),
            fault_thread: None,
            reclaim_thread: None,
            helper_thread: None,
            guard_thread: None,
            watcher_thread: None,
        };
        let EvictorParts { reclaim, helper } = parts;
        region.fault_thread = Some(spawn("uffd-fault", Box::new(fault::run))?);
        region.reclaim_thread = Some(spawn(
            "uffd-reclaim",
            Box::new(move |sh| reclaim::run(sh, reclaim)),
        )?);
        region.helper_thread = Some(spawn(
            "uffd-reclaim2",
            Box::new(move |sh| reclaim::run_helper(sh, helper)),
        )?);
        if shared.fault.placement.usable() {
            region.guard_thread = Some(spawn(
                "uffd-guard",
                Box::new(|sh| sh.fault.placement.run_guard(|| sh.uffd.unread())),
            )?);
        }
        if shared.fault.qos.has_alarm() {
            region.watcher_thread = Some(spawn(
                "uffd-alarm",
                Box::new(|sh| {
                    // At idle priority, its wake-ups never take a CPU from the program's
                    // threads. It runs where a CPU is otherwise idle, which is where the
                    // request costs; it holds no lock, and a want it holds only keeps the
                    // fault thread from parking.
                    ztier_base::os::lower_to_idle_priority();
                    let f = &sh.fault;
                    f.qos
                        .watch_alarm(&f.alarm_watcher_stop, &f.alarm_watcher_waker, || {
                            sh.wake_fault_thread()
                        })
                }),
            )?);
        }
        Ok(region)
    }

    /// The region's first byte. Reading and writing through it is the caller's business
    /// (the memory lives as long as the region); [`words`](Region::words) is the safe view.
    pub fn as_ptr(&self) -> *mut u8 {
        self.shared.memory.ptr()
    }

    pub fn len(&self) -> usize {
        self.shared.memory.len()
    }

    /// The bytes the region's mapping and its pad have resident now (`Rss` in
    /// `/proc/self/smaps`; a mapping of the program's own placed where it unmapped part of
    /// the region counts too).
    pub fn rss_bytes(&self) -> io::Result<u64> {
        let map = self.shared.memory.addr() as usize;
        ztier_base::os::rss_within(&[map..map + self.len(), self.pad_range()])
    }

    /// The addresses of the region's landing pad (the mapping its evictors move pages
    /// into before they store them), for a process's own accounting of what the region
    /// keeps resident (`/proc/self/smaps`): the region's mapping and this one.
    pub fn pad_range(&self) -> std::ops::Range<usize> {
        self.shared.pad.range()
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
        self.shared.memory.words()
    }

    /// Sets the budget in bytes (at least one page). While the budget sizes itself, the
    /// controller moves on from there, brought within its floor and cap.
    pub fn set_budget(&self, budget: usize) -> Result<()> {
        let page_size = self.shared.page_size;
        if budget < page_size {
            return Err(Error::BadBudget { budget, page_size });
        }
        let pages = (budget / page_size) as u64;
        {
            let autosize = self.shared.autosize.lock();
            let pages = autosize.as_ref().map_or(pages, |a| a.limits.clamp(pages));
            self.shared.budget_pages.store(pages, Relaxed);
        }
        self.shared.wake_reclaim_if_over();
        self.shared.fault.waker.wake();
        Ok(())
    }

    /// Lets the budget size itself from the region's stall share ([`AutosizeConfig`]),
    /// from where it is now (brought within the config's floor and cap), with a new
    /// history; or (`None`) stops that, the budget staying where the controller left it.
    pub fn set_autosize(&self, config: Option<AutosizeConfig>) -> Result<()> {
        match config {
            Some(c) => start_autosize(&self.shared, &c)?,
            None => {
                // Under the controller's lock, as `start_autosize` sets it: a controller
                // started meanwhile keeps its hold.
                let mut autosize = self.shared.autosize.lock();
                *autosize = None;
                self.shared.hold_at_least_pages.store(0, Relaxed);
                drop(autosize);
                self.shared
                    .stall
                    .set_fault_overhead(std::time::Duration::ZERO);
            }
        }
        self.shared.wake_reclaim_if_over();
        self.shared.fault.waker.wake();
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
        self.shared
            .memory
            .discard(offset, len)
            .map_err(|source| Error::Os {
                what: "madvise(MADV_DONTNEED_LOCKED)",
                source,
            })
    }

    /// Evicts page `page` now if it is resident: `Ok(true)` if it went out, `Ok(false)` if
    /// it was not resident, the store's error if it refused (the page stays in memory).
    /// While the address space is changing (a drop, unmap or move, the program's or the
    /// region's own, whose event the fault thread has not read yet) the kernel refuses
    /// every move for a moment: the call waits that out and tries again, for at most
    /// [`EVICT_WAITS_OUT`], then gives [`Error::AddressSpaceBusy`] (the page stays in
    /// memory). The page's memory goes back to the OS with
    /// those of the calls after it, 16 calls at a time, or when the reclaim thread
    /// next finds the region within its budget and idle (within about 0.1 s): until then it
    /// is in the pad ([`pad_range`](Self::pad_range)), at most 16 pages a region.
    pub fn evict(&self, page: u64) -> Result<bool> {
        if page >= self.shared.pages {
            return Err(Error::BadPage(page));
        }
        let mut manual = self.shared.evictors.manual.lock();
        let ManualPad { part, used } = &mut *manual;
        let since = std::time::Instant::now();
        let mut r = self.shared.evict_one(page, part, *used);
        // The fault thread reads an event within microseconds unless it is held up (its CPU
        // taken): a short sleep between tries, not a spin, so as not to be what holds it.
        while matches!(r, Ok(reclaim::Evicted::Busy)) && since.elapsed() < EVICT_WAITS_OUT {
            std::thread::sleep(std::time::Duration::from_micros(50));
            r = self.shared.evict_one(page, part, *used);
        }
        let waited = since.elapsed();
        *used += 1;
        if *used == MANUAL_PAD {
            self.shared.empty_pad(part, MANUAL_PAD);
            *used = 0;
        }
        match r? {
            reclaim::Evicted::Out => Ok(true),
            reclaim::Evicted::Busy => Err(Error::AddressSpaceBusy { page, waited }),
            reclaim::Evicted::Skipped => Ok(false),
        }
    }

    /// The region's figures. They include every drop, unmap and move the program's calls
    /// returned from: such a call returns once the fault thread read its event, which it
    /// handles under `gate` (write) in the same hold, so waiting for `gate` waits for that.
    pub fn stats(&self) -> RegionStats {
        let sh = &self.shared;
        drop(sh.gate_read());
        drop(sh.fault.serving.lock());
        let c = |k: Count| sh.figures.counts.sum(k);
        let bd_stat = sh.device.bd_stat();
        RegionStats {
            pages: sh.pages,
            budget_pages: sh.budget_pages.load(Relaxed),
            reclaim_target_pages: sh.reclaim_target(),
            resident_pages: sh.table.resident(),
            stored_pages: sh.table.stored(),
            clean_pages: sh.table.clean(),
            copies_freed: c(Count::CopiesFreed),
            fault_hold_pages: sh.fault_hold_above(),
            budget_held_faults: c(Count::BudgetHeld),
            held_pages: sh.table.held_pages(),
            faults: sh.fault_ins(FaultIn::Store),
            zero_faults: sh.fault_ins(FaultIn::Zeros),
            held_faults: sh.fault_ins(FaultIn::Held),
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
            store_reads: c(Count::StoreReads),
            lost_pages: c(Count::LostPages),
            unreported_moves: c(Count::UnreportedMoves),
            vanished_pages: c(Count::Vanished),
            refaults: sh.fault_ins(FaultIn::Store)
                + sh.fault_ins(FaultIn::Held)
                + c(Count::FaultAround)
                + c(Count::ZeroRefaults),
            written_back_pages: bd_stat.map_or(0, |b| b.bd_count),
            fault_latency_us: std::array::from_fn(|i| sh.figures.latency.0[i].load(Relaxed)),
            idle_priority_usable: sh.fault.placement.usable(),
            idle_priority: sh.fault.placement.idle(),
            idle_priority_demotions: sh.fault.placement.demotions(),
            fault_thread_moves: sh.fault.placement.moves(),
            cpu_latency_qos_usable: sh.fault.qos.usable(),
            cpu_latency_qos_held: sh.fault.qos.held(),
            cpu_latency_qos_holds: sh.fault.qos.holds(),
            parked_reads: c(Count::ParkedReads),
            fault_thread_rung: sh.fault.bell.times_rung(),
            reclaim_looks: c(Count::ReclaimLooks),
            reclaim_blocked: sh.evictors.blocked.load(Relaxed),
            reclaim_blocked_passes: c(Count::BlockedPasses),
            stall_us: sh.stall.stalled_ns(std::time::Instant::now()) / 1000,
            stall_share_ppm: sh.stall.last_second_ppm(),
            autosize: sh.autosize.lock().as_ref().map(Autosize::stats),
            mm_stat: sh.device.mm_stat(),
            bd_stat,
        }
    }

    /// Why the region does not ask for CPU wake-ups without delay
    /// ([`RegionConfig::cpu_latency_qos`]), where it does not.
    pub fn cpu_latency_qos_unused(&self) -> Option<String> {
        self.shared.fault.qos.unused_because()
    }

    /// The last error a store gave the reclaim thread, if any.
    pub fn last_error(&self) -> Option<String> {
        self.shared.figures.last_error.lock().clone()
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

/// Puts `config`'s controller on the region, the budget brought within its limits.
fn start_autosize(sh: &Shared, config: &AutosizeConfig) -> Result<()> {
    let limits = config.limits(sh.page_size)?;
    let overhead = config.overhead_for(sh.fault.qos.usable());
    sh.stall.set_fault_overhead(overhead);
    let now = std::time::Instant::now();
    let controller = Autosize::new(
        limits,
        config.interval,
        overhead,
        now,
        sh.stall.stalled_ns(now),
    );
    let mut autosize = sh.autosize.lock();
    let budget = sh.budget_pages.load(Relaxed);
    sh.budget_pages.store(limits.clamp(budget), Relaxed);
    sh.hold_at_least_pages.store(limits.cap_pages, Relaxed);
    *autosize = Some(controller);
    sh.fault.waker.wake();
    Ok(())
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
        sh.fault.placement.stop();
        if let Some(t) = self.guard_thread.take() {
            let _ = t.join();
        }
        let evictors = &sh.evictors;
        evictors.stop.store(true, Relaxed);
        {
            let mut wanted = evictors.wanted.lock();
            *wanted = true;
            evictors.wanted_cv.notify_all();
        }
        {
            let _idle = evictors.helper_idle.lock();
            evictors.helper_cv.notify_all();
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
        sh.fault.alarm_watcher_stop.store(true, Relaxed);
        sh.fault.alarm_watcher_waker.wake();
        if let Some(t) = self.watcher_thread.take() {
            let _ = t.join();
        }
        sh.fault.stop.store(true, Relaxed);
        sh.fault.waker.wake();
        // A want that stays: the fault thread parks no more, and if parked is rung out
        // (this waits until it read the ring).
        std::mem::forget(sh.want_fault_thread_out());
        if let Some(t) = self.fault_thread.take() {
            let _ = t.join();
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
            if r.shared.fault.bell.parked() {
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
        // A ring just read makes the kernel refuse the move for a moment: `evict` waits.
        assert!(r.evict(page).unwrap(), "page {page} went out");
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
            let rung = r.shared.fault.bell.times_rung();
            ring_out();
            match r.shared.fault.bell.times_rung() - rung {
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

    /// An eviction the kernel refuses for longer than [`EVICT_WAITS_OUT`] (an event waits
    /// for the fault thread, held up here by a page lock this test holds while it serves a
    /// fault) says so, rather than "not resident", and the page stays in memory, whole;
    /// once the event is read, the page goes. The stored page is the reclaim thread's
    /// (its pad emptied before the test begins), not `evict`'s, and `evict` is called once
    /// while the fault thread is held up: each call takes a slot of `evict`'s pad, which the
    /// reclaim thread empties when idle, holding that pad's lock, and that drop too waits
    /// for the fault thread.
    #[test]
    fn an_eviction_refused_past_its_wait_says_the_address_space_was_busy() {
        use crate::page_state::Kind;
        let Some(r) = region(4, false) else {
            return;
        };
        let words = r.words();
        for page in 0..4 {
            words[page * (PS / 8)].store(page as u64 + 1, Relaxed);
        }
        r.set_budget(PS).unwrap();
        let state = |p: u64| r.shared.table.state(p);
        let deadline = Instant::now() + Duration::from_secs(5);
        while (0..4).filter(|&p| state(p).is(Kind::Stored)).count() < 2 {
            assert!(
                Instant::now() < deadline,
                "the reclaim thread stored too few"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        r.set_budget(4 * PS).unwrap();
        let stored = (0..4).find(|&p| state(p).is(Kind::Stored)).unwrap();
        let resident = (0..4).find(|&p| p != stored).unwrap();
        // Read back into memory if it was stored too.
        assert_eq!(
            words[resident as usize * (PS / 8)].load(Relaxed),
            resident + 1
        );
        let dropped = (0..4).find(|&p| p != stored && p != resident).unwrap();
        // The reclaim thread's pad emptied, and nothing else in flight.
        std::thread::sleep(Duration::from_millis(300));
        // Waits (5 s at most) until `held` holds for 20 looks a millisecond apart.
        let steadily = |what: &str, held: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut looks = 0;
            while looks < 20 {
                assert!(Instant::now() < deadline, "never {what}");
                looks = if held() { looks + 1 } else { 0 };
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let dropper_tid = std::sync::atomic::AtomicI32::new(0);
        std::thread::scope(|s| {
            // Taken in the scope, so that a failed assertion lets it go before the scope
            // waits for the threads that wait for it.
            let held = r.shared.table.lock(stored);
            // Its fault holds the fault thread, serving it (`serving` held throughout) and
            // waiting for the page's lock.
            let toucher = s.spawn(|| words[stored as usize * (PS / 8)].load(Relaxed));
            steadily("serving", &|| r.shared.fault.serving.try_lock().is_none());
            // An event the fault thread cannot read meanwhile: the kernel refuses moves, and
            // the drop waits (uninterruptibly, in `madvise`) until it is read.
            let dropper = s.spawn(|| {
                dropper_tid.store(ztier_base::sched::ThreadId::current().as_raw(), Relaxed);
                r.discard(dropped as usize * PS, PS).unwrap()
            });
            steadily("dropping", &|| {
                let tid = dropper_tid.load(Relaxed);
                std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
                    .is_ok_and(|stat| stat.rsplit(") ").next().is_some_and(|s| s.starts_with('D')))
            });
            // The test holds a page lock here, which `gate_read` says an evictor must not
            // (a parked fault thread is rung out, and the ring waits for its read): the
            // fault thread is not parked but serving, and never takes `gate` meanwhile.
            match r.evict(resident) {
                Err(Error::AddressSpaceBusy { page, waited }) => {
                    assert_eq!(page, resident);
                    assert!(waited >= EVICT_WAITS_OUT, "{waited:?}");
                }
                other => panic!("{other:?}"),
            }
            assert!(state(resident).is(Kind::Resident));
            drop(held);
            assert_eq!(toucher.join().unwrap(), stored + 1);
            dropper.join().unwrap();
        });
        assert!(r.evict(resident).unwrap());
        assert_eq!(
            words[resident as usize * (PS / 8)].load(Relaxed),
            resident + 1
        );
        assert_eq!(words[dropped as usize * (PS / 8)].load(Relaxed), 0);
    }

    /// A fault thread parked when faults stop is rung out by the CPU latency request's
    /// alarm (nothing else wakes it here), and withdraws the request.
    #[test]
    fn the_cpu_latency_requests_alarm_rings_a_parked_fault_thread_out() {
        // The request's tests read the machine's target: this one's request is part of it.
        let _turn = crate::cpu_latency_qos::tests::MACHINE_TARGET.lock();
        let Some(r) = region(4, true) else {
            return;
        };
        if !r.shared.fault.qos.usable() {
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
            let rung = r.shared.fault.bell.times_rung();
            let deadline = Instant::now() + Duration::from_secs(5);
            while r.shared.fault.qos.held() {
                assert!(
                    Instant::now() < deadline,
                    "still held 5 s after the last fault"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // Else a message ended the park first and the poll's wake-up withdrew it.
            r.shared.fault.bell.times_rung() > rung
        });
        assert!(
            withdrawn_by_a_ring,
            "the alarm never rang a parked fault thread out"
        );
    }
}
