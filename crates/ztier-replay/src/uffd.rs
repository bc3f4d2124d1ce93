//! One userfaultfd region replay (`ztier bench uffd`): each corpus written into a region
//! (`ztier_uffd::Region`), the budget then cut to the given share so the reclaim thread evicts
//! the rest, every page read back in order and verified (under the budget: the pages brought in
//! make the reclaim thread evict as many others), the region's RSS then taken from
//! /proc/self/smaps (and again at rest, after the verify pass, once the reclaim thread is
//! done), then single pages touched at random for the fault latency (pushed out as they were,
//! then written and pushed out, as the kernel's own figure's are), then random reads with a
//! working set (most pages evicted clean: read in and not written since), then every page
//! stored and read back in order with the budget not binding, three times (into free memory, as
//! the kernel's fault-in figure is), and the memory held then set beside a fresh zram device's
//! holding the same pages. A caller runs it twice, with the region's clean pages on and off
//! (every eviction compressing, as before them), beside the kernel zswap's MADV_PAGEOUT,
//! fault-in and single-page fault latency on the same pages, measured before the regions where
//! the machine has the path ([`kernel_path`]: swap on, zswap on, `ztier_uffd::rig::pageout`,
//! with zswap's own compressor), else its figures from the corpus's `zswap-truth.json` and the
//! reason (both marked: the project's kernel offers zswap no lz4, so its path is lzo-rle). The
//! replay uses the public APIs of ztier-uffd (its region, and its measuring rig: the floor
//! under a fault's latency, the refaults of MIN, LRU and CLOCK) and ztier-zram only.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::Serialize;
use ztier_base::rng::Rng;
use ztier_compress::Algorithm;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_uffd::rig::floor;
use ztier_uffd::rig::oracle::{self, Refaults};
use ztier_uffd::rig::pageout::{self, NoKernelPath, PageoutError};
use ztier_uffd::{Region, RegionConfig, RegionStats};

use crate::units::RawSequential;
use crate::{ReplayError, Result};

/// What to replay: one corpus through a region, with clean pages on or off.
#[derive(Debug, Clone)]
pub struct UffdReplay {
    pub algorithm: Algorithm,
    /// The region's RAM budget, a share of its size (over 0, up to 1).
    pub budget_share: f64,
    /// `RegionConfig::clean_pages`.
    pub clean_pages: bool,
    /// `RegionConfig::idle_priority`.
    pub idle_priority: bool,
    /// `RegionConfig::cpu_latency_qos`.
    pub cpu_latency_qos: bool,
    /// `RegionConfig::unit_size`: the device's compression unit (4096, the page, by default).
    pub unit_size: usize,
}

/// The kernel's own path for a corpus's pages: measured, or why this machine has none.
#[derive(Debug, Clone)]
pub enum KernelPath {
    Measured(KernelRun),
    Missing(NoKernelPath),
}

/// The region's pages.
const PAGE: usize = CORPUS_PAGE;

/// A region operation that failed, and what it was.
pub(crate) fn region_err(what: &'static str) -> impl FnOnce(ztier_uffd::Error) -> ReplayError {
    move |source| ReplayError::Region { what, source }
}

/// Single-page faults timed a pass: p99 then rests on the 20 slowest. Each page timed is
/// evicted again and seldom drawn twice, so a small corpus (at a 25 % budget, under about
/// 8000 pages) gives fewer within the pass's tries.
const LATENCY_SAMPLES: usize = 2000;
/// Passes of every page stored and read back in order into free memory; the fastest is
/// the run's figure.
pub const FREE_PASSES: usize = 3;

/// Faults that brought a page in (from the store, a held copy, or zeros), spurious ones not.
fn trips(s: &RegionStats) -> u64 {
    s.faults + s.zero_faults + s.held_faults
}

/// One corpus × compressor through a region.
#[derive(Debug, Clone, Serialize)]
pub struct UffdRun {
    pub corpus: String,
    pub compressor: String,
    /// `RegionConfig::clean_pages`: a page read in keeps its copy in the store.
    pub clean_pages: bool,
    /// `RegionConfig::unit_size`.
    pub unit_size: usize,
    pub pages: u64,
    pub budget_pages: u64,
    /// MB/s the reclaim thread evicted at, the budget cut from every page to the share.
    pub evict_mb_s: f64,
    /// MB/s of pages brought back while every page was read in order.
    pub seq_faultin_mb_s: f64,
    /// Faults timed in the single-page latency phase.
    pub fault_samples: usize,
    /// Resident pages over the budget when that phase began (0 unless the reclaim thread
    /// had not caught up within 5 s).
    pub fault_start_over_budget: u64,
    /// One page touched at random (no fault-around), pushed out as it was (with clean pages
    /// on, only dropped: its copy stored long before): the toucher's time, p50/p99/max µs.
    pub fault_p50_us: f64,
    pub fault_p99_us: f64,
    pub fault_max_us: f64,
    /// The same for pages written, then pushed out (compressed as they go, as the kernel's
    /// `MADV_PAGEOUT` compresses the pages of its own figure): how many, p50/p99/max µs,
    /// and the dirty evictions in that pass (at least two a fault: the push-out before its
    /// touch, and the one after, its own value written back).
    pub written_fault_samples: usize,
    pub written_evictions_dirty: u64,
    pub written_fault_p50_us: f64,
    pub written_fault_p99_us: f64,
    pub written_fault_max_us: f64,
    /// The fault thread at idle priority after the latency phase, and how often over the
    /// run its idle priority was taken back.
    pub idle_priority: bool,
    pub idle_priority_demotions: u64,
    /// Of those, in the latency phase.
    pub latency_idle_priority_demotions: u64,
    /// The fault thread's moves to follow the touching thread in the latency phase.
    pub latency_fault_thread_moves: u64,
    /// In the latency phase: the fault thread's waits parked in its read (not in `poll`),
    /// and the times another thread (an eviction, the figures, the alarm) rang it out.
    pub latency_parked_reads: u64,
    pub latency_fault_thread_rung: u64,
    /// Whether the region's CPU latency request was held in the latency phase, the times
    /// it was taken over the run (once a spell of faults), or why it makes none.
    pub latency_cpu_latency_qos_held: bool,
    pub cpu_latency_qos_holds: u64,
    pub cpu_latency_qos_unused: Option<String>,
    /// As many touches served by a bare userfaultfd handler (one ready page copied in,
    /// nothing else), right after, the two threads held on one CPU: this machine's floor for
    /// the round trip, p50/p99 µs.
    pub floor_one_cpu_p50_us: f64,
    pub floor_one_cpu_p99_us: f64,
    /// The same, the two threads held on two CPUs (each wake-up crosses between them), where
    /// the process may use two.
    pub floor_two_cpus_p50_us: Option<f64>,
    pub floor_two_cpus_p99_us: Option<f64>,
    /// On two CPUs with a CPU latency request held (idle CPUs poll), where the process may
    /// make one.
    pub floor_two_cpus_qos_p50_us: Option<f64>,
    pub floor_two_cpus_qos_p99_us: Option<f64>,
    /// The handler placed as a region's fault thread places itself by default (idle
    /// priority, following the faulting thread, which runs where the scheduler puts it),
    /// the request held where it may be made, where the process has two CPUs and may leave
    /// idle priority (whatever --normal-priority and --no-cpu-latency-qos say for the
    /// region): the round trip, its tail included, that the region's own placement allows
    /// on this machine.
    pub floor_placed_p50_us: Option<f64>,
    pub floor_placed_p99_us: Option<f64>,
    /// The machine's CPU latency target (µs) while the floor on two CPUs without a request
    /// was measured: 2000 s where nobody asks for anything, lower where another process
    /// (or region) held a request then; and the cpuidle driver, which decides what a
    /// request changes (its state 0 polls on x86's haltpoll, intel_idle, acpi_idle).
    pub floor_latency_target_us: Option<i32>,
    pub cpuidle_driver: Option<String>,
    /// Random reads with a working set (9 in 10 in a scattered hot set of half the budget,
    /// the rest anywhere): MB/s of one-word reads, pages brought in, and the reclaim
    /// thread's evictions meanwhile, clean (nothing written) and dirty (compressed, stored).
    pub random_reads: u64,
    pub random_read_mb_s: f64,
    pub random_pages_in: u64,
    pub random_evictions_clean: u64,
    pub random_evictions_dirty: u64,
    /// Over the second half of those reads (the first warms every policy): the pages the
    /// region brought back in (fault-around's included) and the faults that brought them,
    /// beside the pages MIN (which knows the future: no policy brings in fewer), LRU and
    /// CLOCK (which see every access) and a model of the region's own clock (which sees
    /// faults only) bring in for the same reads, holding the budget's pages.
    pub random_refaults: u64,
    pub random_fault_trips: u64,
    pub random_oracle: Refaults,
    /// Evictions over the whole run, clean and dirty.
    pub evictions_clean: u64,
    pub evictions_dirty: u64,
    /// Every page stored (the budget cut to one page), then the budget raised to the
    /// whole region and every page read in order: the pages come into free memory with
    /// nothing evicted meanwhile, as in the kernel's fault-in figure. The best of
    /// [`FREE_PASSES`] such passes.
    pub seq_faultin_free_mb_s: f64,
    /// The raw decompressor on the same pages in the same order, right after that pass (best
    /// of three, the two in turns): each unit decompressed once and its pages copied out, at
    /// the region's unit size and at the page's, MB of pages per second. All a larger unit
    /// can take off a fault-in is the decompression it saves, so the fault-in at 4 KiB
    /// units less that difference is the fastest a larger unit's fault-in can be.
    pub raw_sequential_unit_mb_s: f64,
    pub raw_sequential_page_mb_s: f64,
    /// The fault thread's moves to follow the reading thread in that pass, and whether it
    /// ran at idle priority at its end.
    pub free_fault_thread_moves: u64,
    pub free_idle_priority: bool,
    /// Region pages resident at the end of the sequential pass, against the budget: past
    /// it by at most its margin, a faulting page and its fault-around window while the
    /// reclaim thread catches up.
    pub resident_pages: u64,
    /// Bytes the region keeps resident at the end of the sequential pass: its mapping's
    /// and its pad's `Rss` in /proc/self/smaps, and its state byte a page.
    pub rss_bytes: u64,
    /// Region pages resident at rest: after the verify pass that follows, once the reclaim
    /// thread is done (or 5 s).
    pub resident_at_rest_pages: u64,
    /// The same bytes as `rss_bytes` then (the pad included, emptied or not).
    pub rss_at_rest_bytes: u64,
    /// What the region's RSS goal allows: the budget and 64 bytes a page stored at the end of
    /// the pass.
    pub rss_allowed_bytes: u64,
    /// With every page stored: the region's device's mm_stat, and a fresh zram device
    /// (same compressor and allocator) with every page of the corpus written to it.
    pub all_stored_pages: u64,
    pub all_mem_used_total: u64,
    pub zram_mem_used_total: u64,
    pub zram_stored_pages: u64,
    /// The device's mm_stat after the eviction: memory held, compressed bytes.
    pub mem_used_total: u64,
    pub compr_data_size: u64,
    pub stored_pages: u64,
    /// The kernel's own path on the same pages, measured in this run where the machine has
    /// one (swap on, zswap on: `ztier_uffd::rig::pageout::kernel_pageout`), else why not.
    pub kernel_in_run: Option<KernelRun>,
    pub kernel_in_run_missing: Option<String>,
    /// The kernel zswap's figures for these pages (`zswap-truth.json`, lzo-rle), if there.
    pub kernel_pageout_mb_s: Option<f64>,
    pub kernel_faultin_mb_s: Option<f64>,
    pub kernel_pool_total_size: Option<u64>,
}

/// The kernel's path measured in the run: MADV_PAGEOUT through zswap, the pages touched back
/// in order, then single pages pushed out and touched (2000, or as many as the corpus has
/// pages).
#[derive(Debug, Clone, Serialize)]
pub struct KernelRun {
    /// zswap's compressor on this machine.
    pub compressor: String,
    pub pages: u64,
    /// Pages MADV_PAGEOUT left resident (not counted in the MB/s).
    pub left_resident: u64,
    pub pageout_mb_s: f64,
    pub faultin_mb_s: f64,
    pub fault_samples: usize,
    pub fault_p50_us: f64,
    pub fault_p99_us: f64,
    pub fault_max_us: f64,
}

/// The kernel's own path for `corpus`'s pages (MADV_PAGEOUT through zswap, the touch back in
/// order, up to 2000 single pages pushed out and touched), or why this machine has none; a
/// page that came back wrong is an error. Measured before any region, whose memory would
/// otherwise be reclaimed beside it.
pub fn kernel_path(corpus: &Corpus) -> Result<KernelPath> {
    let samples = LATENCY_SAMPLES.min(corpus.pages());
    let k = match pageout::kernel_pageout(corpus.bytes(), samples) {
        Ok(k) => k,
        Err(PageoutError::Missing(why)) => return Ok(KernelPath::Missing(why)),
        Err(e) => return Err(ReplayError::KernelPath(e)),
    };
    let out_bytes = (k.pages - k.left_resident) as f64 * k.page_size as f64;
    let us = micros(&k.latency);
    let (fault_p50_us, fault_p99_us, fault_max_us) = p50_p99_max(&us);
    Ok(KernelPath::Measured(KernelRun {
        compressor: k.compressor,
        pages: k.pages as u64,
        left_resident: k.left_resident as u64,
        pageout_mb_s: out_bytes / k.pageout.as_secs_f64() / 1e6,
        faultin_mb_s: out_bytes / k.faultin.as_secs_f64() / 1e6,
        fault_samples: us.len(),
        fault_p50_us,
        fault_p99_us,
        fault_max_us,
    }))
}

/// Durations in µs, sorted.
fn micros(taken: &[Duration]) -> Vec<f64> {
    let mut us: Vec<f64> = taken.iter().map(|d| d.as_nanos() as f64 / 1000.0).collect();
    us.sort_by(f64::total_cmp);
    us
}

/// p50, p99 and the largest of sorted µs (0 for none).
fn p50_p99_max(sorted: &[f64]) -> (f64, f64, f64) {
    (
        percentile(sorted, 0.5),
        percentile(sorted, 0.99),
        sorted.last().copied().unwrap_or(0.0),
    )
}

/// The `p` quantile of sorted values (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0.0)
}

/// Waits until the reclaim thread's pass is over: the region's resident pages down to the
/// pass's target (a little under the budget), or within the budget and no longer falling
/// (nothing more it could evict); or until `deadline`.
pub(crate) fn wait_for_reclaim_pass(region: &Region, deadline: Option<Instant>) {
    let mut last = (u64::MAX, Instant::now());
    loop {
        let s = region.stats();
        let now = Instant::now();
        if s.resident_pages != last.0 {
            last = (s.resident_pages, now);
        }
        let still = now - last.1 >= Duration::from_millis(20);
        if s.resident_pages <= s.reclaim_target_pages
            || (s.resident_pages <= s.budget_pages && still)
            || deadline.is_some_and(|d| now >= d)
        {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Evicts the region down to a budget of one page (every page but at most one stored, or
/// dropped if it was all zeros); returns once the reclaim thread's pass is over.
pub(crate) fn store_all(region: &Region) -> Result<()> {
    region
        .set_budget(PAGE)
        .map_err(region_err("setting the budget"))?;
    wait_for_reclaim_pass(region, None);
    Ok(())
}

/// One pass of every page stored, then read in order into free memory (nothing evicted
/// meanwhile), verified after.
pub(crate) struct FreePass {
    /// MB of pages brought in a second.
    pub mb_s: f64,
    pub took: Duration,
    pub brought: u64,
    /// The region's figures as the read began (every page stored) and as it ended.
    pub before: RegionStats,
    pub after: RegionStats,
}

/// Reads one word of each of the region's first `pages` pages, in order: how long it took.
fn touch_in_order(region: &Region, pages: usize) -> Duration {
    let words = region.words();
    let t = Instant::now();
    let mut sum = 0u64;
    for i in 0..pages {
        sum = sum.wrapping_add(words[i * (PAGE / 8)].load(Relaxed));
    }
    let took = t.elapsed();
    std::hint::black_box(sum);
    took
}

/// The pages faults brought in between two readings of a region's figures: each store
/// fault's page and every page fault-around brought.
fn pages_brought(before: &RegionStats, after: &RegionStats) -> u64 {
    (after.faults + after.fault_around_pages) - (before.faults + before.fault_around_pages)
}

pub(crate) fn free_pass(region: &Region, corpus: &Corpus) -> Result<FreePass> {
    let ps = PAGE;
    let pages = corpus.pages();
    store_all(region)?;
    let before = region.stats();
    region
        .set_budget(pages * ps)
        .map_err(region_err("setting the budget"))?;
    let took = touch_in_order(region, pages);
    let after = region.stats();
    let brought = pages_brought(&before, &after);
    verify(
        region,
        corpus,
        "after every page was stored and read back into free memory",
    )?;
    Ok(FreePass {
        mb_s: brought as f64 * ps as f64 / took.as_secs_f64() / 1e6,
        took,
        brought,
        before,
        after,
    })
}

/// The bytes a region keeps resident: its mapping's and its pad's `Rss` in
/// /proc/self/smaps, and its state byte a page.
fn region_rss(region: &Region) -> Result<u64> {
    Ok(region.rss_bytes().map_err(ReplayError::Smaps)? + region.pages())
}

/// [`region_rss`] once the reclaim pass is over and the pad it went through emptied: two
/// readings 2 ms apart that agree (at most 0.1 s of them).
fn rss_at_rest(region: &Region) -> Result<u64> {
    let mut last = region_rss(region)?;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(2));
        let now = region_rss(region)?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

impl UffdReplay {
    /// The run, beside `kernel` (from [`kernel_path`], measured once for a corpus).
    pub fn run(&self, corpus: &Corpus, kernel: &KernelPath) -> Result<UffdRun> {
        run_one(corpus, self, kernel)
    }
}

fn run_one(corpus: &Corpus, replay: &UffdReplay, kernel: &KernelPath) -> Result<UffdRun> {
    let UffdReplay {
        algorithm,
        budget_share: share,
        clean_pages,
        idle_priority,
        cpu_latency_qos,
        unit_size,
    } = replay.clone();
    let algorithm = &algorithm;
    let ps = PAGE;
    let pages = corpus.pages();
    let len = pages * ps;
    let budget = ((len as f64 * share) as usize).max(ps);
    let config = RegionConfig {
        algorithm: algorithm.clone(),
        clean_pages,
        idle_priority,
        cpu_latency_qos,
        unit_size,
        ..RegionConfig::default()
    };
    // Written with the whole region in budget, so the write evicts nothing.
    let region = Region::with_config(len, len, &config).map_err(region_err("making the region"))?;
    let words = region.words();
    for (i, page) in corpus.chunks(ps).enumerate() {
        for (w, bytes) in page.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            words[i * (ps / 8) + w].store(v, Relaxed);
        }
    }

    // Evict: the budget cut to the share; the reclaim thread's time to get under it.
    let before = region.stats();
    let t = Instant::now();
    region
        .set_budget(budget)
        .map_err(region_err("setting the budget"))?;
    wait_for_reclaim_pass(&region, None);
    let evict_time = t.elapsed();
    let after = region.stats();
    let evicted =
        (after.evictions + after.zero_evictions) - (before.evictions + before.zero_evictions);
    let evict_mb_s = evicted as f64 * ps as f64 / evict_time.as_secs_f64() / 1e6;
    let held = after.mm_stat;

    // Sequential fault-in: one word of every page, in order; then every page verified.
    let seq_time = touch_in_order(&region, pages);
    let seq = region.stats();
    let rss_bytes = region_rss(&region)?;
    let brought = pages_brought(&after, &seq);
    let seq_faultin_mb_s = brought as f64 * ps as f64 / seq_time.as_secs_f64() / 1e6;
    verify(
        &region,
        corpus,
        "after the sequential pass under the budget",
    )?;

    // Single-page fault latency: pages evicted one by one, touched in a scattered order
    // (so fault-around stays closed), until LATENCY_SAMPLES faults are timed. First the
    // reclaim thread finishes bringing the region under its budget after the verify pass
    // above (faults it makes wait for its locks are the evict pass's, not a fault's own).
    wait_for_reclaim_pass(&region, Some(Instant::now() + Duration::from_secs(5)));
    let rss_at_rest_bytes = rss_at_rest(&region)?;
    let before_latency = region.stats();
    // The bench's draws: fixed, the same every run.
    let mut x = Rng::from_state(0x2545_F491_4F6C_DD1D);
    let lat = single_faults(&region, corpus, &mut x, false)?;
    let after_latency = region.stats();
    let written = single_faults(&region, corpus, &mut x, true)?;
    let after_written = region.stats();
    let (fault_p50_us, fault_p99_us, fault_max_us) = p50_p99_max(&lat);
    let (written_fault_p50_us, written_fault_p99_us, written_fault_max_us) = p50_p99_max(&written);
    let idle_priority = after_latency.idle_priority;
    let latency_idle_priority_demotions =
        after_latency.idle_priority_demotions - before_latency.idle_priority_demotions;
    let latency_fault_thread_moves =
        after_latency.fault_thread_moves - before_latency.fault_thread_moves;
    let latency_cpu_latency_qos_held = before_latency.cpu_latency_qos_held
        || after_latency.cpu_latency_qos_holds > before_latency.cpu_latency_qos_holds;
    // The floor is the machine's own: the region's request lapses first (10 ms after its
    // last fault).
    let lapse = Instant::now() + Duration::from_millis(200);
    while region.stats().cpu_latency_qos_held && Instant::now() < lapse {
        std::thread::sleep(Duration::from_millis(1));
    }
    let floor = floor::bare_fault_latency(lat.len().max(1))
        .map_err(region_err("the bare userfaultfd handler"))?;
    let floor_one = micros(&floor.one_cpu);
    let floor_two = floor.two_cpus.as_deref().map(micros);
    let floor_two_qos = floor.two_cpus_latency_qos.as_deref().map(micros);
    let floor_placed = floor.placed_as_region.as_deref().map(micros);

    // Random reads with a working set: 9 in 10 in a hot set of half the budget, scattered
    // over the region (page `k * stride % pages`), the rest anywhere.
    let budget_pages = (budget / ps).max(1);
    let hot = (budget_pages / 2).max(1);
    let stride = (pages / hot).max(1) | 1;
    let reads = 4 * pages as u64;
    // Drawn before the timed loop, and replayed after it through the oracles (MIN, LRU,
    // CLOCK with every access seen) at the budget: the region's refaults in the second half
    // beside theirs, each warmed by the first half.
    let trace: Vec<u32> = (0..reads)
        .map(|_| {
            let x = x.next_u64();
            let page = if !x.is_multiple_of(10) {
                ((x >> 8) as usize % hot) * stride % pages
            } else {
                (x >> 8) as usize % pages
            };
            page as u32
        })
        .collect();
    let half = trace.len() / 2;
    let before_rand = region.stats();
    let mut mid_rand = before_rand.clone();
    let t = Instant::now();
    let mut sum = 0u64;
    for (i, &page) in trace.iter().enumerate() {
        if i == half {
            mid_rand = region.stats();
        }
        sum = sum.wrapping_add(words[page as usize * (ps / 8)].load(Relaxed));
    }
    let rand_time = t.elapsed();
    std::hint::black_box(sum);
    let rand = region.stats();
    let oracle = oracle::replay(&trace, budget_pages, half);
    verify(&region, corpus, "after the random reads")?;
    let end = region.stats();

    // Every page stored, then read in order into free memory (nothing evicted meanwhile):
    // the best of FREE_PASSES, as the raw decompressor beside it is taken. One pass lasts a
    // fraction of a second, and a wake-up or move of the fault thread swings it by half. A
    // pass its fault thread ended at normal priority (where the region could have used idle
    // priority) ran as the phases before it left the region, not as a program reading into
    // free memory finds it: idle priority, ended beside their busy evictors, is tried again
    // only after a back-off of up to IDLE_PRIORITY_MAX_BACKOFF, which the next pass waits.
    let mut best: Option<FreePass> = None;
    for pass in 0..FREE_PASSES {
        let this = free_pass(&region, corpus)?;
        let backed_off = this.after.idle_priority_usable && !this.after.idle_priority;
        if best.as_ref().is_none_or(|b| this.mb_s > b.mb_s) {
            best = Some(this);
        }
        if backed_off && pass + 1 < FREE_PASSES {
            std::thread::sleep(ztier_uffd::IDLE_PRIORITY_MAX_BACKOFF);
        }
    }
    let FreePass {
        took: free_time,
        brought: brought_free,
        before: all,
        after: free,
        ..
    } = best.expect("FREE_PASSES > 0");
    let (raw_sequential_unit_mb_s, raw_sequential_page_mb_s) =
        raw_sequential_reads(corpus, algorithm, unit_size)?;
    let zram = zram_of(corpus, algorithm)?;
    let truth = corpus.zswap_truth("lzo-rle").ok().flatten();
    Ok(UffdRun {
        corpus: corpus.name.clone(),
        compressor: algorithm.to_string(),
        clean_pages,
        unit_size,
        random_reads: reads,
        random_read_mb_s: reads as f64 * ps as f64 / rand_time.as_secs_f64() / 1e6,
        random_pages_in: (rand.faults + rand.fault_around_pages)
            - (before_rand.faults + before_rand.fault_around_pages),
        random_evictions_clean: rand.evictions_clean - before_rand.evictions_clean,
        random_evictions_dirty: rand.evictions_dirty - before_rand.evictions_dirty,
        random_refaults: rand.refaults - mid_rand.refaults,
        random_fault_trips: trips(&rand) - trips(&mid_rand),
        random_oracle: oracle,
        evictions_clean: end.evictions_clean,
        evictions_dirty: end.evictions_dirty,
        pages: pages as u64,
        budget_pages: (budget / ps) as u64,
        evict_mb_s,
        seq_faultin_mb_s,
        fault_samples: lat.len(),
        fault_start_over_budget: before_latency
            .resident_pages
            .saturating_sub(before_latency.budget_pages),
        fault_p50_us,
        fault_p99_us,
        fault_max_us,
        written_fault_samples: written.len(),
        written_evictions_dirty: after_written.evictions_dirty - after_latency.evictions_dirty,
        written_fault_p50_us,
        written_fault_p99_us,
        written_fault_max_us,
        idle_priority,
        idle_priority_demotions: end.idle_priority_demotions,
        latency_idle_priority_demotions,
        latency_fault_thread_moves,
        latency_parked_reads: after_latency.parked_reads - before_latency.parked_reads,
        latency_fault_thread_rung: after_latency.fault_thread_rung
            - before_latency.fault_thread_rung,
        latency_cpu_latency_qos_held,
        cpu_latency_qos_holds: free.cpu_latency_qos_holds,
        cpu_latency_qos_unused: region.cpu_latency_qos_unused(),
        floor_one_cpu_p50_us: percentile(&floor_one, 0.5),
        floor_one_cpu_p99_us: percentile(&floor_one, 0.99),
        floor_two_cpus_p50_us: floor_two.as_deref().map(|f| percentile(f, 0.5)),
        floor_two_cpus_p99_us: floor_two.as_deref().map(|f| percentile(f, 0.99)),
        floor_two_cpus_qos_p50_us: floor_two_qos.as_deref().map(|f| percentile(f, 0.5)),
        floor_two_cpus_qos_p99_us: floor_two_qos.as_deref().map(|f| percentile(f, 0.99)),
        floor_placed_p50_us: floor_placed.as_deref().map(|f| percentile(f, 0.5)),
        floor_placed_p99_us: floor_placed.as_deref().map(|f| percentile(f, 0.99)),
        floor_latency_target_us: floor.latency_target_us,
        cpuidle_driver: floor.cpuidle_driver.clone(),
        seq_faultin_free_mb_s: brought_free as f64 * ps as f64 / free_time.as_secs_f64() / 1e6,
        raw_sequential_unit_mb_s,
        raw_sequential_page_mb_s,
        free_fault_thread_moves: free.fault_thread_moves - all.fault_thread_moves,
        free_idle_priority: free.idle_priority,
        resident_pages: seq.resident_pages,
        rss_bytes,
        resident_at_rest_pages: before_latency.resident_pages,
        rss_at_rest_bytes,
        rss_allowed_bytes: budget as u64 + 64 * seq.stored_pages,
        all_stored_pages: all.stored_pages,
        all_mem_used_total: all.mm_stat.mem_used_total,
        zram_mem_used_total: zram.mem_used_total,
        zram_stored_pages: zram.orig_data_size / ps as u64 - zram.same_pages,
        mem_used_total: held.mem_used_total,
        compr_data_size: held.compr_data_size,
        stored_pages: after.stored_pages,
        kernel_in_run: match kernel {
            KernelPath::Measured(k) => Some(k.clone()),
            KernelPath::Missing(_) => None,
        },
        kernel_in_run_missing: match kernel {
            KernelPath::Measured(_) => None,
            KernelPath::Missing(why) => Some(why.to_string()),
        },
        kernel_pageout_mb_s: truth.as_ref().and_then(|t| t.pageout_mb_s),
        kernel_faultin_mb_s: truth.as_ref().and_then(|t| t.faultin_mb_s),
        kernel_pool_total_size: truth.as_ref().map(|t| t.pool_total_size),
    })
}

/// Single pages pushed out and touched, drawn at random from `x` on (scattered, so
/// fault-around stays closed), until `LATENCY_SAMPLES` faults are timed (or the draws run
/// out): the touching thread's time in µs, sorted. Zero pages are left out (they come back
/// as the zero page, nothing stored).
///
/// Not `written`: a page is pushed out as it is, and only if resident. With clean pages on,
/// one read since it came in (all of them here) is only dropped, and its fault reads a
/// copy stored long before (out of the cache). `written`: the page's first word is given a
/// new value first (a page out comes in for it), so the push compresses and stores it then,
/// as the kernel's `MADV_PAGEOUT` does before each of its own faults is timed; the touch
/// must read the new value back (a stale copy served is an error), and the page's own
/// value is then written back. Each page timed is pushed out again after its touch, so
/// every touch is a fault.
fn single_faults(region: &Region, corpus: &Corpus, x: &mut Rng, written: bool) -> Result<Vec<f64>> {
    let ps = PAGE;
    let pages = corpus.pages();
    let words = region.words();
    let mut taken = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES * 20 {
        if taken.len() == LATENCY_SAMPLES.min(pages) {
            break;
        }
        let page = x.below(pages as u64) as usize;
        let bytes = &corpus.bytes()[page * ps..(page + 1) * ps];
        if ztier_compress::same_filled(bytes) == Some(0) {
            continue;
        }
        let word = &words[page * (ps / 8)];
        let own = u64::from_ne_bytes(bytes[..8].try_into().expect("8 bytes"));
        if written {
            word.store(!own, Relaxed);
        }
        // Not resident: nothing to time. (The region's figures are not read here: each
        // read waits for the fault thread's locks, a wake-up more than the fault's own.)
        if !region
            .evict(page as u64)
            .map_err(region_err("evicting a page"))?
        {
            // Written, and already pushed out by the reclaim thread: its own value back.
            if written {
                word.store(own, Relaxed);
            }
            continue;
        }
        let t = Instant::now();
        let got = std::hint::black_box(word.load(Relaxed));
        taken.push(t.elapsed());
        if written {
            if got != !own {
                return Err(ReplayError::StaleAfterEviction {
                    page,
                    got,
                    want: !own,
                });
            }
            word.store(own, Relaxed);
        }
        // Back out, so each touch is a fault from the store.
        region
            .evict(page as u64)
            .map_err(region_err("evicting a page"))?;
    }
    Ok(micros(&taken))
}

/// A fresh zram device, the region's compressor and allocator, holding every page of the
/// corpus: its mm_stat.
fn zram_of(corpus: &Corpus, algorithm: &Algorithm) -> Result<ztier_zram::MmStat> {
    let layout = ztier_pool::ZsConfig {
        page_size: PAGE,
        ..ztier_pool::ZsConfig::default()
    };
    let pool = ztier_pool::AllocatorKind::Zsmalloc.make_pool(&layout)?;
    let device = ztier_zram::Device::new((corpus.pages() * PAGE) as u64, algorithm.clone(), pool)?;
    for (i, page) in corpus.chunks(PAGE).enumerate() {
        device.write_page(i as u64, page)?;
    }
    Ok(device.mm_stat())
}

/// MB of pages a second the raw decompressor brings back every page of `corpus` in order
/// at, at `unit_size` and at the page (best of three, the two in turns).
fn raw_sequential_reads(
    corpus: &Corpus,
    algorithm: &Algorithm,
    unit_size: usize,
) -> Result<(f64, f64)> {
    let raw = RawSequential::new(corpus, algorithm, unit_size)?;
    let mut best = (0.0f64, 0.0f64);
    for turn in 0..3 {
        let (unit, page) = raw.mb_s(turn % 2 == 0)?;
        best = (best.0.max(unit), best.1.max(page));
    }
    Ok(best)
}

/// Every word of every page as the corpus has it.
pub(crate) fn verify(region: &Region, corpus: &Corpus, pass: &'static str) -> Result<()> {
    let words = region.words();
    for (page, bytes) in corpus.chunks(PAGE).enumerate() {
        for (word, bytes) in bytes.chunks_exact(8).enumerate() {
            let want = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            let got = words[page * (PAGE / 8) + word].load(Relaxed);
            if got != want {
                return Err(ReplayError::RegionMismatch {
                    corpus: corpus.name.clone(),
                    pass,
                    page,
                    word,
                    got,
                    want,
                    region_says: region_says(region),
                });
            }
        }
    }
    Ok(())
}

/// For a mismatch's message: the pages the region lost (`RegionStats::lost_pages`) and its
/// last error, if it lost any; else nothing.
pub(crate) fn region_says(region: &Region) -> String {
    match region.stats().lost_pages {
        0 => String::new(),
        lost => format!(
            " (the region lost {lost} pages; its last error: {})",
            region.last_error().unwrap_or_default()
        ),
    }
}
