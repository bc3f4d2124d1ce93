//! `ztier bench --front uffd [--budget 25%]`: each corpus written into a region
//! (`ztier_uffd::Region`), the budget then cut to the given share so the reclaim thread
//! evicts the rest, every page read back in order and verified (under the budget: the pages
//! brought in make the reclaim thread evict as many others), the region's RSS then taken from
//! /proc/self/smaps (and again at rest, after the verify pass, once the reclaim thread is
//! done), then single pages touched at random for the fault latency (pushed out as they
//! were, then written and pushed out, as the kernel's own figure's are), then random
//! reads with a working set (most pages evicted clean: read in and not written since), then
//! every page stored and read back in order with the budget not binding (into free memory,
//! as the kernel's fault-in figure is), and the memory held then set beside a fresh zram
//! device's holding the same pages; all of it twice, with the region's clean pages on and
//! off (every eviction compressing, as before them); beside the kernel zswap's
//! MADV_PAGEOUT, fault-in and single-page fault latency on the same pages, measured in the
//! run before the regions where the machine has the path (swap on, zswap on:
//! `ztier_uffd::rig::pageout::kernel_pageout`, with zswap's own compressor), else its figures from the
//! corpus's `zswap-truth.json` and the reason (both marked: the project's kernel offers
//! zswap no lz4, so its path is lzo-rle). The bench uses the public APIs of ztier-uffd and
//! ztier-zram only.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use anyhow::Context;
use ztier_corpus::Corpus;
use ztier_uffd::{Region, RegionConfig};

use crate::bench::BenchArgs;

/// Single-page faults timed a pass: p99 then rests on the 20 slowest. Each page timed is
/// evicted again and seldom drawn twice, so a small corpus (at a 25 % budget, under about
/// 8000 pages) gives fewer within the pass's tries.
const LATENCY_SAMPLES: usize = 2000;

/// Faults that brought a page in (from the store, a held copy, or zeros), spurious ones not.
fn trips(s: &ztier_uffd::RegionStats) -> u64 {
    s.faults + s.zero_faults + s.held_faults
}

/// One corpus × compressor through a region.
#[derive(Debug, serde::Serialize)]
struct UffdRun {
    corpus: String,
    compressor: String,
    /// `RegionConfig::clean_pages`: a page read in keeps its copy in the store.
    clean_pages: bool,
    pages: u64,
    budget_pages: u64,
    /// MB/s the reclaim thread evicted at, the budget cut from every page to the share.
    evict_mb_s: f64,
    /// MB/s of pages brought back while every page was read in order.
    seq_faultin_mb_s: f64,
    /// Faults timed in the single-page latency phase.
    fault_samples: usize,
    /// Resident pages over the budget when that phase began (0 unless the reclaim thread
    /// had not caught up within 5 s).
    fault_start_over_budget: u64,
    /// One page touched at random (no fault-around), pushed out as it was (with clean pages
    /// on, only dropped: its copy stored long before): the toucher's time, p50/p99/max µs.
    fault_p50_us: f64,
    fault_p99_us: f64,
    fault_max_us: f64,
    /// The same for pages written, then pushed out (compressed as they go, as the kernel's
    /// `MADV_PAGEOUT` compresses the pages of its own figure): how many, p50/p99/max µs,
    /// and the dirty evictions in that pass (at least two a fault: the push-out before its
    /// touch, and the one after, its own value written back).
    written_fault_samples: usize,
    written_evictions_dirty: u64,
    written_fault_p50_us: f64,
    written_fault_p99_us: f64,
    written_fault_max_us: f64,
    /// The fault thread at idle priority after the latency phase, and how often over the
    /// run its idle priority was taken back.
    idle_priority: bool,
    idle_priority_demotions: u64,
    /// Of those, in the latency phase.
    latency_idle_priority_demotions: u64,
    /// The fault thread's moves to follow the touching thread in the latency phase.
    latency_fault_thread_moves: u64,
    /// In the latency phase: the fault thread's waits parked in its read (not in `poll`),
    /// and the times another thread (an eviction, the figures, the alarm) rang it out.
    latency_parked_reads: u64,
    latency_fault_thread_rung: u64,
    /// Whether the region's CPU latency request was held in the latency phase, the times
    /// it was taken over the run (once a spell of faults), or why it makes none.
    latency_cpu_latency_qos_held: bool,
    cpu_latency_qos_holds: u64,
    cpu_latency_qos_unused: Option<String>,
    /// As many touches served by a bare userfaultfd handler (one ready page copied in,
    /// nothing else), right after, the two threads held on one CPU: this machine's floor for
    /// the round trip, p50/p99 µs.
    floor_one_cpu_p50_us: f64,
    floor_one_cpu_p99_us: f64,
    /// The same, the two threads held on two CPUs (each wake-up crosses between them), where
    /// the process may use two.
    floor_two_cpus_p50_us: Option<f64>,
    floor_two_cpus_p99_us: Option<f64>,
    /// On two CPUs with a CPU latency request held (idle CPUs poll), where the process may
    /// make one.
    floor_two_cpus_qos_p50_us: Option<f64>,
    floor_two_cpus_qos_p99_us: Option<f64>,
    /// The handler placed as a region's fault thread places itself by default (idle
    /// priority, following the faulting thread, which runs where the scheduler puts it),
    /// the request held where it may be made, where the process has two CPUs and may leave
    /// idle priority (whatever --normal-priority and --no-cpu-latency-qos say for the
    /// region): the round trip, its tail included, that the region's own placement allows
    /// on this machine.
    floor_placed_p50_us: Option<f64>,
    floor_placed_p99_us: Option<f64>,
    /// The machine's CPU latency target (µs) while the floor on two CPUs without a request
    /// was measured: 2000 s where nobody asks for anything, lower where another process
    /// (or region) held a request then; and the cpuidle driver, which decides what a
    /// request changes (its state 0 polls on x86's haltpoll, intel_idle, acpi_idle).
    floor_latency_target_us: Option<i32>,
    cpuidle_driver: Option<String>,
    /// Random reads with a working set (9 in 10 in a scattered hot set of half the budget,
    /// the rest anywhere): MB/s of one-word reads, pages brought in, and the reclaim
    /// thread's evictions meanwhile, clean (nothing written) and dirty (compressed, stored).
    random_reads: u64,
    random_read_mb_s: f64,
    random_pages_in: u64,
    random_evictions_clean: u64,
    random_evictions_dirty: u64,
    /// Over the second half of those reads (the first warms every policy): the pages the
    /// region brought back in (fault-around's included) and the faults that brought them,
    /// beside the pages MIN (which knows the future: no policy brings in fewer), LRU and
    /// CLOCK (which see every access) and a model of the region's own clock (which sees
    /// faults only) bring in for the same reads, holding the budget's pages.
    random_refaults: u64,
    random_fault_trips: u64,
    random_oracle: ztier_uffd::rig::oracle::Refaults,
    /// Evictions over the whole run, clean and dirty.
    evictions_clean: u64,
    evictions_dirty: u64,
    /// Every page stored (the budget cut to one page), then the budget raised to the
    /// whole region and every page read in order: the pages come into free memory with
    /// nothing evicted meanwhile, as in the kernel's fault-in figure.
    seq_faultin_free_mb_s: f64,
    /// The fault thread's moves to follow the reading thread in that pass, and whether it
    /// ran at idle priority at its end.
    free_fault_thread_moves: u64,
    free_idle_priority: bool,
    /// Region pages resident at the end of the sequential pass, against the budget: past
    /// it by at most its margin, a faulting page and its fault-around window while the
    /// reclaim thread catches up.
    resident_pages: u64,
    /// Bytes the region keeps resident at the end of the sequential pass: its mapping's
    /// and its pad's `Rss` in /proc/self/smaps, and its state byte a page.
    rss_bytes: u64,
    /// Region pages resident at rest: after the verify pass that follows, once the reclaim
    /// thread is done (or 5 s).
    resident_at_rest_pages: u64,
    /// The same bytes as `rss_bytes` then (the pad included, emptied or not).
    rss_at_rest_bytes: u64,
    /// What #28 allows: the budget and 64 bytes a page stored at the end of the pass.
    rss_allowed_bytes: u64,
    /// With every page stored: the region's device's mm_stat, and a fresh zram device
    /// (same compressor and allocator) with every page of the corpus written to it.
    all_stored_pages: u64,
    all_mem_used_total: u64,
    zram_mem_used_total: u64,
    zram_stored_pages: u64,
    /// The device's mm_stat after the eviction: memory held, compressed bytes.
    mem_used_total: u64,
    compr_data_size: u64,
    stored_pages: u64,
    /// The kernel's own path on the same pages, measured in this run where the machine has
    /// one (swap on, zswap on: `ztier_uffd::rig::pageout::kernel_pageout`), else why not.
    kernel_in_run: Option<KernelRun>,
    kernel_in_run_missing: Option<String>,
    /// The kernel zswap's figures for these pages (`zswap-truth.json`, lzo-rle), if there.
    kernel_pageout_mb_s: Option<f64>,
    kernel_faultin_mb_s: Option<f64>,
    kernel_pool_total_size: Option<u64>,
}

/// The kernel's path measured in the run: MADV_PAGEOUT through zswap, the pages touched back
/// in order, then single pages pushed out and touched (2000, or as many as the corpus has
/// pages).
#[derive(Debug, Clone, serde::Serialize)]
struct KernelRun {
    /// zswap's compressor on this machine.
    compressor: String,
    pages: u64,
    /// Pages MADV_PAGEOUT left resident (not counted in the MB/s).
    left_resident: u64,
    pageout_mb_s: f64,
    faultin_mb_s: f64,
    fault_samples: usize,
    fault_p50_us: f64,
    fault_p99_us: f64,
    fault_max_us: f64,
}

/// The kernel's path for the corpus's pages, or why this machine has none (a page that
/// came back wrong is an error).
fn kernel_run(corpus: &Corpus) -> anyhow::Result<Result<KernelRun, String>> {
    let samples = LATENCY_SAMPLES.min(corpus.pages());
    let k = match ztier_uffd::rig::pageout::kernel_pageout(corpus.bytes(), samples) {
        Ok(k) => k,
        Err(ztier_uffd::rig::pageout::PageoutError::Missing(why)) => {
            return Ok(Err(why.to_string()))
        }
        Err(e) => return Err(e).context("the kernel's swap path"),
    };
    let out_bytes = (k.pages - k.left_resident) as f64 * k.page_size as f64;
    let us = micros(&k.latency);
    let (fault_p50_us, fault_p99_us, fault_max_us) = p50_p99_max(&us);
    Ok(Ok(KernelRun {
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

/// The next of a xorshift64 sequence (the bench's draws: fixed, the same every run).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// The `p` quantile of sorted values (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0.0)
}

/// `--budget`: a share of the region, `25%` or `0.25`.
pub fn parse_budget(s: &str) -> Result<f64, String> {
    let v: f64 = match s.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|p| p / 100.0),
        None => s.trim().parse::<f64>(),
    }
    .map_err(|e| format!("{s:?}: {e}"))?;
    if !(v > 0.0 && v <= 1.0) {
        return Err(format!(
            "{s:?}: the budget is a share of the region, over 0 up to 100%"
        ));
    }
    Ok(v)
}

pub fn run(args: &BenchArgs, paths: &[PathBuf]) -> anyhow::Result<()> {
    for path in paths {
        let corpus = match args.max_corpus {
            Some(max) => Corpus::load_at_most(path, max),
            None => Corpus::load(path),
        }
        .with_context(|| format!("loading {}", path.display()))?;
        // Before the regions, whose memory would otherwise be reclaimed beside it.
        let kernel = kernel_run(&corpus)?;
        for algorithm in &args.compressors {
            for clean_pages in [true, false] {
                let run = run_one(
                    &corpus,
                    algorithm,
                    args.budget,
                    clean_pages,
                    !args.normal_priority,
                    !args.no_cpu_latency_qos,
                    &kernel,
                )?;
                if args.json {
                    println!("{}", serde_json::to_string(&run)?);
                } else {
                    print_run(&run);
                }
            }
        }
    }
    Ok(())
}

/// Waits until the reclaim thread's pass is over: the region's resident pages down to the
/// pass's target (a little under the budget), or within the budget and no longer falling
/// (nothing more it could evict); or until `deadline`.
fn wait_for_reclaim_pass(region: &Region, deadline: Option<Instant>) {
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

/// The bytes a region keeps resident: its mapping's and its pad's `Rss` in
/// /proc/self/smaps, and its state byte a page.
fn region_rss(region: &Region) -> anyhow::Result<u64> {
    Ok(region.rss_bytes().context("/proc/self/smaps")? + region.pages())
}

/// [`region_rss`] once the reclaim pass is over and the pad it went through emptied: two
/// readings 2 ms apart that agree (at most 0.1 s of them).
fn rss_at_rest(region: &Region) -> anyhow::Result<u64> {
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

fn run_one(
    corpus: &Corpus,
    algorithm: &ztier_compress::Algorithm,
    share: f64,
    clean_pages: bool,
    idle_priority: bool,
    cpu_latency_qos: bool,
    kernel: &Result<KernelRun, String>,
) -> anyhow::Result<UffdRun> {
    let ps = 4096usize;
    let pages = corpus.pages();
    let len = pages * ps;
    let budget = ((len as f64 * share) as usize).max(ps);
    let config = RegionConfig {
        algorithm: algorithm.clone(),
        clean_pages,
        idle_priority,
        cpu_latency_qos,
        ..RegionConfig::default()
    };
    // Written with the whole region in budget, so the write evicts nothing.
    let region = Region::with_config(len, len, &config).context("making the region")?;
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
    region.set_budget(budget)?;
    wait_for_reclaim_pass(&region, None);
    let evict_time = t.elapsed();
    let after = region.stats();
    let evicted =
        (after.evictions + after.zero_evictions) - (before.evictions + before.zero_evictions);
    let evict_mb_s = evicted as f64 * ps as f64 / evict_time.as_secs_f64() / 1e6;
    let held = after.mm_stat;

    // Sequential fault-in: one word of every page, in order; then every page verified.
    let t = Instant::now();
    let mut sum = 0u64;
    for i in 0..pages {
        sum = sum.wrapping_add(words[i * (ps / 8)].load(Relaxed));
    }
    let seq_time = t.elapsed();
    std::hint::black_box(sum);
    let seq = region.stats();
    let rss_bytes = region_rss(&region)?;
    let brought = (seq.faults + seq.fault_around_pages) - (after.faults + after.fault_around_pages);
    let seq_faultin_mb_s = brought as f64 * ps as f64 / seq_time.as_secs_f64() / 1e6;
    verify(&region, corpus)?;

    // Single-page fault latency: pages evicted one by one, touched in a scattered order
    // (so fault-around stays closed), until LATENCY_SAMPLES faults are timed. First the
    // reclaim thread finishes bringing the region under its budget after the verify pass
    // above (faults it makes wait for its locks are the evict pass's, not a fault's own).
    wait_for_reclaim_pass(&region, Some(Instant::now() + Duration::from_secs(5)));
    let rss_at_rest_bytes = rss_at_rest(&region)?;
    let before_latency = region.stats();
    let mut x = 0x2545_F491_4F6C_DD1Du64;
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
    let floor = ztier_uffd::rig::floor::bare_fault_latency(lat.len().max(1))
        .context("the bare userfaultfd handler")?;
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
            let x = xorshift(&mut x);
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
    let mut mid_rand = before_rand;
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
    let oracle = ztier_uffd::rig::oracle::replay(&trace, budget_pages, half);
    verify(&region, corpus)?;
    let end = region.stats();

    // Every page stored, then read in order into free memory (nothing evicted meanwhile).
    region.set_budget(ps)?;
    wait_for_reclaim_pass(&region, None);
    let all = region.stats();
    region.set_budget(len)?;
    let t = Instant::now();
    let mut sum = 0u64;
    for i in 0..pages {
        sum = sum.wrapping_add(words[i * (ps / 8)].load(Relaxed));
    }
    let free_time = t.elapsed();
    std::hint::black_box(sum);
    let free = region.stats();
    let brought_free =
        (free.faults + free.fault_around_pages) - (all.faults + all.fault_around_pages);
    verify(&region, corpus)?;
    let zram = zram_of(corpus, algorithm)?;
    let truth = corpus.zswap_truth("lzo-rle").ok().flatten();
    Ok(UffdRun {
        corpus: corpus.name.clone(),
        compressor: algorithm.to_string(),
        clean_pages,
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
        kernel_in_run: kernel.as_ref().ok().cloned(),
        kernel_in_run_missing: kernel.as_ref().err().cloned(),
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
fn single_faults(
    region: &Region,
    corpus: &Corpus,
    x: &mut u64,
    written: bool,
) -> anyhow::Result<Vec<f64>> {
    let ps = 4096usize;
    let pages = corpus.pages();
    let words = region.words();
    let mut taken = Vec::with_capacity(LATENCY_SAMPLES);
    for _ in 0..LATENCY_SAMPLES * 20 {
        if taken.len() == LATENCY_SAMPLES.min(pages) {
            break;
        }
        let page = (xorshift(x) % pages as u64) as usize;
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
        if !region.evict(page as u64)? {
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
            anyhow::ensure!(
                got == !own,
                "page {page}: {got:#x} read back after it was written and pushed out, not the {:#x} written",
                !own
            );
            word.store(own, Relaxed);
        }
        // Back out, so each touch is a fault from the store.
        region.evict(page as u64)?;
    }
    Ok(micros(&taken))
}

/// A fresh zram device, the region's compressor and allocator, holding every page of the
/// corpus: its mm_stat.
fn zram_of(
    corpus: &Corpus,
    algorithm: &ztier_compress::Algorithm,
) -> anyhow::Result<ztier_zram::MmStat> {
    let ps = 4096usize;
    let layout = ztier_pool::ZsConfig {
        page_size: ps,
        ..ztier_pool::ZsConfig::default()
    };
    let pool = ztier_pool::AllocatorKind::Zsmalloc
        .make_pool(&layout)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let device = ztier_zram::Device::new((corpus.pages() * ps) as u64, algorithm.clone(), pool)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, page) in corpus.chunks(ps).enumerate() {
        device
            .write_page(i as u64, page)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(device.mm_stat())
}

/// Every word of every page as the corpus has it.
fn verify(region: &Region, corpus: &Corpus) -> anyhow::Result<()> {
    let words = region.words();
    for (i, page) in corpus.chunks(4096).enumerate() {
        for (w, bytes) in page.chunks_exact(8).enumerate() {
            let want = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            let got = words[i * 512 + w].load(Relaxed);
            anyhow::ensure!(
                got == want,
                "page {i} word {w}: {got:#x}, the corpus has {want:#x}"
            );
        }
    }
    Ok(())
}

fn print_run(r: &UffdRun) {
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "{} / {} / clean pages {}: {} pages, budget {} pages",
        r.corpus,
        r.compressor,
        if r.clean_pages { "on" } else { "off" },
        r.pages,
        r.budget_pages
    );
    let kernel = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    // The kernel's figures: measured in this run where the machine allows it, else the
    // corpus's truth file's.
    let (k_out, k_in, k_from) = match &r.kernel_in_run {
        Some(k) => (
            format!("{:.0}", k.pageout_mb_s),
            format!("{:.0}", k.faultin_mb_s),
            format!("this run, {}", k.compressor),
        ),
        None => (
            kernel(r.kernel_pageout_mb_s),
            kernel(r.kernel_faultin_mb_s),
            "zswap-truth.json, lzo-rle".to_string(),
        ),
    };
    println!(
        "  evict       {:>8.0} MB/s   kernel zswap MADV_PAGEOUT {k_out} MB/s ({k_from})",
        r.evict_mb_s
    );
    println!(
        "  fault-in    {:>8.0} MB/s   kernel zswap fault-in {k_in} MB/s ({k_from})",
        r.seq_faultin_mb_s
    );
    println!(
        "  fault-in    {:>8.0} MB/s   every page stored, the budget not binding (kernel's fault-in {k_in} MB/s; fault thread at {} priority, moved {} times)",
        r.seq_faultin_free_mb_s,
        if r.free_idle_priority { "idle" } else { "normal" },
        r.free_fault_thread_moves
    );
    let qos = match &r.cpu_latency_qos_unused {
        None => format!(
            "CPU latency request {} in this phase, taken {} times in the run",
            if r.latency_cpu_latency_qos_held {
                "held"
            } else {
                "not held"
            },
            r.cpu_latency_qos_holds
        ),
        Some(why) => format!("no CPU latency request: {why}"),
    };
    println!(
        "  fault       p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs ({} faults of one page, from the store, pushed out as it was{}; fault thread at {} priority, moved {} times and taken back {} in this phase, {} in the run; parked in its read {} times, rung out {}; {qos})",
        r.fault_p50_us, r.fault_p99_us, r.fault_max_us, r.fault_samples,
        if r.clean_pages { " (read since it came in: only dropped, its copy stored long before)" } else { " (compressed as it went)" },
        if r.idle_priority { "idle" } else { "normal" },
        r.latency_fault_thread_moves,
        r.latency_idle_priority_demotions,
        r.idle_priority_demotions,
        r.latency_parked_reads,
        r.latency_fault_thread_rung
    );
    println!(
        "  written     p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs ({} faults of one page written, then pushed out: compressed as it went, as the kernel's MADV_PAGEOUT compresses each page of its figure)",
        r.written_fault_p50_us, r.written_fault_p99_us, r.written_fault_max_us, r.written_fault_samples
    );
    match (&r.kernel_in_run, &r.kernel_in_run_missing) {
        (Some(k), _) => println!(
            "  kernel      p50 {:.1} µs  p99 {:.1} µs  max {:.1} µs ({} faults of one page from zswap, {}, measured before the region; {} of {} pages left resident by MADV_PAGEOUT)",
            k.fault_p50_us, k.fault_p99_us, k.fault_max_us, k.fault_samples, k.compressor,
            k.left_resident, k.pages
        ),
        (None, Some(why)) => println!("  kernel      not measured in this run: {why}"),
        (None, None) => {}
    }
    if r.fault_start_over_budget > 0 {
        println!(
            "              (the phase began {} pages over the budget: the reclaim thread had not caught up within 5 s)",
            r.fault_start_over_budget
        );
    }
    let mut two = match (r.floor_two_cpus_p50_us, r.floor_two_cpus_p99_us) {
        (Some(p50), Some(p99)) => format!("; on two CPUs p50 {p50:.1} µs  p99 {p99:.1} µs"),
        _ => String::new(),
    };
    if let Some(target) = r
        .floor_latency_target_us
        .filter(|&t| t < ztier_uffd::NO_CPU_LATENCY_TARGET_US)
    {
        two += &format!(" (while a CPU latency request of {target} µs was held elsewhere)");
    }
    if let (Some(p50), Some(p99)) = (r.floor_two_cpus_qos_p50_us, r.floor_two_cpus_qos_p99_us) {
        two += &format!(", with a CPU latency request p50 {p50:.1} µs  p99 {p99:.1} µs");
    }
    if let (Some(p50), Some(p99)) = (r.floor_placed_p50_us, r.floor_placed_p99_us) {
        two += &format!(
            ", placed as the region's fault thread places itself p50 {p50:.1} µs  p99 {p99:.1} µs"
        );
    }
    if let Some(driver) = &r.cpuidle_driver {
        two += &format!("; cpuidle driver {driver}");
    }
    println!(
        "  floor       p50 {:.1} µs  p99 {:.1} µs with the two threads on one CPU{two} (a bare handler copying one ready page)",
        r.floor_one_cpu_p50_us, r.floor_one_cpu_p99_us
    );
    println!(
        "  resident    {} pages right after the pass, {} at rest (budget {}; past it by at most its margin, a faulting page and its fault-around window while the reclaim thread catches up)",
        r.resident_pages, r.resident_at_rest_pages, r.budget_pages
    );
    println!(
        "  rss         {:.2} MB region + pad + state bytes right after the pass, {:.2} MB at rest; allowed {:.2} MB (budget + 64 B a stored page)",
        mb(r.rss_bytes),
        mb(r.rss_at_rest_bytes),
        mb(r.rss_allowed_bytes)
    );
    println!(
        "  all stored  {:.2} MB held for {} pages (+{:.2} MB state bytes); zram device, same pages: {:.2} MB for {} pages ({:.3}x)",
        mb(r.all_mem_used_total),
        r.all_stored_pages,
        mb(r.pages),
        mb(r.zram_mem_used_total),
        r.zram_stored_pages,
        (r.all_mem_used_total + r.pages) as f64 / r.zram_mem_used_total as f64
    );
    println!(
        "  held        {:.1} MB memory for {} stored pages ({:.1} MB compressed){}",
        mb(r.mem_used_total),
        r.stored_pages,
        mb(r.compr_data_size),
        r.kernel_pool_total_size
            .map(|p| format!("; kernel zswap pool {:.1} MB (lzo-rle, every page)", mb(p)))
            .unwrap_or_default()
    );
    println!(
        "  random      {:>8.0} MB/s   {} one-word reads (hot set half the budget), {} pages in, evictions {} clean / {} dirty",
        r.random_read_mb_s,
        r.random_reads,
        r.random_pages_in,
        r.random_evictions_clean,
        r.random_evictions_dirty
    );
    let o = &r.random_oracle;
    println!(
        "  refaults    {} pages in ({} faults) over the last {} reads; at {} pages resident MIN brings in {}, LRU {}, CLOCK {}, a clock seeing faults only {} (region {:.2}x MIN in pages, {:.2}x in faults; {:.2}x LRU)",
        r.random_refaults,
        r.random_fault_trips,
        o.accesses,
        o.capacity,
        o.min,
        o.lru,
        o.clock,
        o.fault_clock,
        r.random_refaults as f64 / o.min.max(1) as f64,
        r.random_fault_trips as f64 / o.min.max(1) as f64,
        r.random_refaults as f64 / o.lru.max(1) as f64
    );
    println!(
        "  evictions   {} clean / {} dirty over the run",
        r.evictions_clean, r.evictions_dirty
    );
    println!("  every page verified (after each read pass)");
}
