//! `ztier bench uffd` (or `--front uffd`): every corpus through a userfaultfd region under
//! a RAM budget (`ztier_replay::uffd`), twice, with the region's clean pages on and off,
//! beside the kernel's own path on the same pages and the machine's floor under a fault;
//! or, with `--lookups SECONDS`, the lookup workload that judges a budget sizing itself
//! (`ztier_replay::uffd_lookups`). Flags in, reports out.

use clap::builder::TypedValueParser;
use clap::Args;
use ztier_replay::sweep::UffdSweep;
use ztier_replay::uffd::UffdRun;
use ztier_replay::uffd_lookups::{Budget, LookupJudgement, Lookups};
use ztier_replay::uffd_units::UnitFaultIn;

use super::shared::{emit, ReplayArgs};
use crate::error::CliError;

/// The flags of a replay through a region: its device is zsmalloc with each compressor
/// given, and one thread touches it (no allocator, layout or threads of the bench's).
#[derive(Args, Debug, Clone)]
pub struct UffdArgs {
    #[command(flatten)]
    pub replay: ReplayArgs,
    /// The region's RAM budget, a share of its size (25% or 0.25).
    #[arg(long, default_value = "25%", value_parser = parse_budget)]
    pub budget: f64,
    /// Keep the region's fault thread at normal priority (by default it runs at idle
    /// priority while one thread faults, where the process may leave it again).
    #[arg(long)]
    pub normal_priority: bool,
    /// The region makes no CPU latency request while faults come (by default it holds one
    /// where /dev/cpu_dma_latency can be opened, so that idle CPUs poll instead of halting;
    /// see ztier_uffd::RegionConfig::cpu_latency_qos).
    #[arg(long)]
    pub no_cpu_latency_qos: bool,
    /// Instead of the replay: the lookup workload (a zipf law whose hot set drifts and
    /// jumps) for this many seconds a run, with every page resident, at fixed budgets of 97%
    /// down to 10%, and with the budget sizing itself under each --stall-target; judged
    /// against the best fixed budget chosen with hindsight within a 1% slowdown, in pace
    /// (lookups over the machine's speed, timed beside them on a page of the lookup thread's
    /// own). --budget is not used.
    #[arg(
        long,
        value_name = "SECONDS",
        value_parser = clap::value_parser!(u64).range(1..),
        conflicts_with_all = ["budget", "normal_priority", "no_cpu_latency_qos"]
    )]
    pub lookups: Option<u64>,
    /// With --lookups: the stall share a self-sized run steers to (1% or 0.01); repeatable,
    /// a self-sized run each.
    #[arg(long = "stall-target", value_name = "SHARE", requires = "lookups", value_parser = parse_budget)]
    pub stall_targets: Vec<f64>,
    /// With --lookups: also draw each judgement into this SVG (as `ztier plot` does): each
    /// self-sized run's budget, resident pages, throughput and stall share over time, and
    /// the savings/slowdown curve of the fixed budgets with the self-sized runs on it.
    #[arg(long, value_name = "FILE.svg", requires = "lookups")]
    pub plot: Option<std::path::PathBuf>,
    /// With --lookups: every page read back keeps its copy in the store, however full the
    /// store (by default the workload's regions free copies once the store holds copies of
    /// half the pages the budget leaves out: ztier_uffd::RegionConfig::free_copies_when_full).
    #[arg(long, requires = "lookups")]
    pub keep_clean_copies: bool,
    /// The region's compression units (4K, 16K or 64K; RegionConfig::unit_size), a run
    /// each: a fault decompresses its page's unit once and brings the rest of it in. Then
    /// each unit larger than the page against the page: two regions, their sequential
    /// fault-ins into free memory in turns over --rounds rounds, beside the most the
    /// decompression the unit saves allows and a bare handler's fault-in of the same units.
    #[arg(long, value_delimiter = ',', value_name = "SIZE,SIZE,...",
          value_parser = crate::size::parse_size, conflicts_with = "lookups")]
    pub unit_size: Vec<u64>,
    /// With --unit-size and a unit larger than 4K: rounds of each larger unit's pairing
    /// against the page (1 to 100; 5 if not given). More rounds give each pass more chances
    /// at its best and show how far a pairing swings from round to round (on this project's
    /// VM, 15 did not steady it: docs/region.md); a round takes up to about 10 s a corpus.
    #[arg(long, value_name = "N", requires = "unit_size",
          value_parser = clap::value_parser!(u16).range(1..=100).map(usize::from))]
    pub rounds: Option<usize>,
}

/// `--budget`: a share of the region, `25%` or `0.25`.
fn parse_budget(s: &str) -> Result<f64, String> {
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

/// Every corpus × compressor through a region, with clean pages on and off, beside the
/// kernel's own path for the corpus (measured once, before the regions).
pub fn run(args: &UffdArgs) -> anyhow::Result<()> {
    if let Some(seconds) = args.lookups {
        return run_lookups(args, seconds);
    }
    if args.rounds.is_some() && args.unit_size.iter().all(|&size| size <= 4096) {
        anyhow::bail!(
            "--rounds: --unit-size gives no unit larger than 4K to pair against 4K; add one \
             (--unit-size 4K,64K) or leave --rounds out"
        );
    }
    let sweep = UffdSweep {
        compressors: args.replay.compressors.clone(),
        budget_share: args.budget,
        idle_priority: !args.normal_priority,
        cpu_latency_qos: !args.no_cpu_latency_qos,
        unit_sizes: args
            .unit_size
            .iter()
            .map(|&size| usize::try_from(size))
            .collect::<Result<_, _>>()?,
        unit_rounds: args
            .rounds
            .unwrap_or(ztier_replay::uffd_units::DEFAULT_ROUNDS),
    };
    for path in args.replay.paths()? {
        let corpus = args.replay.load(&path)?;
        for run in sweep.runs(&corpus).map_err(CliError::from_replay)? {
            let run = run.map_err(CliError::from_replay)?;
            emit(args.replay.json, &run, print_run)?;
        }
        for pair in sweep.unit_pairs(&corpus) {
            let pair = pair.map_err(CliError::from_replay)?;
            emit(args.replay.json, &pair, print_unit_pair)?;
        }
    }
    Ok(())
}

/// A larger unit's sequential fault-in against the page's, paired round by round, beside
/// what the decompression it saves allows, what the sum of its parts, each timed alone,
/// would give, and what a bare handler doing the same fault-in gives
/// (`ztier_replay::uffd_units`).
fn print_unit_pair(p: &UnitFaultIn) {
    let rounds: Vec<String> = p
        .rounds
        .iter()
        .map(|r| {
            let normal = match (r.page_idle_priority, r.unit_idle_priority) {
                (true, true) => "",
                (false, true) => " (4 KiB's fault thread at normal priority)",
                (true, false) => " (the unit's fault thread at normal priority)",
                (false, false) => " (both fault threads at normal priority)",
            };
            format!(
                "{:.0} against {:.0} MB/s, allowed {:.2}x, floor {:.0} MB/s ({} faults), cap {:.2}x, bare handler {:.0} MB/s ({} faults), bare cap {:.2}x{normal}",
                r.unit_fault_in_mb_s,
                r.page_fault_in_mb_s,
                r.allowed(),
                r.floor_mb_s(),
                r.unit_faults,
                r.cap(),
                r.bare_unit_fault_in_mb_s,
                r.bare_unit_faults,
                r.bare_cap()
            )
        })
        .collect();
    println!(
        "{} / {} / clean pages {}: {} KiB units' sequential fault-in into free memory {:.2}x the 4 KiB units' (median of {} paired rounds); the decompression they save allows {:.2}x: {:.2} of it; at the floor under the unit's fault-in (the sum of its decompression alone, the kernel's copy-in of its ready pages and a bare round trip a fault, each timed alone) it would be {:.2}x: {:.2} of that; at a bare handler's fault-in of the same units (the same faults and copies, none of a region's own work; each at its best of the rounds) {:.2}x: {:.2} of that ({})",
        p.corpus,
        p.compressor,
        if p.clean_pages { "on" } else { "off" },
        p.unit_size >> 10,
        p.ratio,
        p.rounds.len(),
        p.allowed,
        p.ratio_to_allowed,
        p.cap,
        p.ratio_to_cap,
        p.bare_cap,
        p.ratio_to_bare,
        rounds.join("; "),
    );
}

fn print_run(r: &UffdRun) {
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "{} / {} / {} KiB units / clean pages {}: {} pages, budget {} pages",
        r.corpus,
        r.compressor,
        r.unit_size >> 10,
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
        "  fault-in    {:>8.0} MB/s   every page stored, the budget not binding, the best of {} passes (kernel's fault-in {k_in} MB/s, one pass; fault thread at {} priority, moved {} times)",
        r.seq_faultin_free_mb_s,
        ztier_replay::uffd::FREE_PASSES,
        if r.free_idle_priority { "idle" } else { "normal" },
        r.free_fault_thread_moves
    );
    println!(
        "  decompress  {:>8.0} MB/s   the raw decompressor on the same pages in order, each unit once, its pages copied out ({:.0} MB/s at 4 KiB units)",
        r.raw_sequential_unit_mb_s, r.raw_sequential_page_mb_s
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

/// `--lookups`: every corpus × compressor through the lookup workload, each second printed
/// as it ends, then the runs and the judgement; with `--plot`, the judgements drawn.
fn run_lookups(args: &UffdArgs, seconds: u64) -> anyhow::Result<()> {
    let mut judgements = Vec::new();
    for path in args.replay.paths()? {
        let corpus = args.replay.load(&path)?;
        for algorithm in &args.replay.compressors {
            let mut workload = Lookups::new(algorithm.clone(), seconds);
            if !args.stall_targets.is_empty() {
                workload.stall_targets.clone_from(&args.stall_targets);
            }
            workload.free_copies_when_full = !args.keep_clean_copies;
            let json = args.replay.json;
            let mut each_second = |budget: Budget, s: &ztier_replay::uffd_lookups::Second| {
                if !json {
                    println!(
                        "  {budget:?} {:>4} s: {:>9} lookups/s, pace {}, resident {:>7} pages, budget {:>7}, store {:>6.1} MB, stall {:.3} %",
                        s.at,
                        s.lookups,
                        s.pace().map_or("—".to_string(), |pace| format!("{pace:.4}")),
                        s.resident_pages,
                        s.budget_pages,
                        s.store_bytes as f64 / 1e6,
                        s.stall_ppm as f64 / 1e4
                    );
                }
            };
            let judged = workload
                .judge(&corpus, &mut each_second)
                .map_err(CliError::from_replay)?;
            emit(json, &judged, print_judgement)?;
            if args.plot.is_some() {
                judgements.push(serde_json::to_value(&judged)?);
            }
        }
    }
    if let Some(svg) = &args.plot {
        crate::plot::render(&judgements, svg)?;
    }
    Ok(())
}

fn print_judgement(j: &LookupJudgement) {
    let mb = |b: f64| b / 1e6;
    println!(
        "{}: {} pages, slowdown target {:.1} %, {}",
        j.corpus,
        j.pages,
        j.slowdown * 100.0,
        match j.free_copies_when_full {
            true => "copies freed once the store is full",
            false => "clean pages' copies kept",
        }
    );
    println!(
        "  budget           lookups/s    pace  ref. folds/s   memory MB  resident pages  budget pages  stall %"
    );
    for (i, r) in j.runs.iter().enumerate() {
        let name = match r.budget {
            Budget::Unlimited => "every page".to_string(),
            Budget::Fixed(share) => format!("fixed {:.0} %", share * 100.0),
            Budget::Autosized(target) => format!("self {:.2} %", target * 100.0),
        };
        let mark = if Some(i) == j.oracle { " (oracle)" } else { "" };
        println!(
            "  {name:<14} {:>11.0} {:>7.4} {:>13.0} {:>11.1} {:>15.0} {:>13.0} {:>8.3}{mark}",
            r.lookups_per_s,
            r.lookups_per_reference_fold,
            r.reference_folds_per_s,
            mb(r.mean_memory_bytes),
            r.mean_resident_pages,
            r.mean_budget_pages,
            r.stall_ppm as f64 / 1e4
        );
    }
    let [_, last] = j.every_page_runs_lookups_per_s;
    let [_, last_pace] = j.every_page_runs_lookups_per_reference_fold;
    println!(
        "  every page again, last: {last:.0} lookups/s, pace {last_pace:.4}; the baseline is the two \
         runs' mean pace, {:.4}, and they differ by {:.1} % (the noise left once the CPU's \
         speed is divided out, to read each slowdown beside; in lookups a second {:.1} %)",
        j.baseline_lookups_per_reference_fold,
        j.baseline_pace_spread * 100.0,
        j.baseline_spread_lookups_per_s * 100.0
    );
    for me in &j.self_sized {
        let r = &j.runs[me.run];
        let target = match r.budget {
            Budget::Autosized(t) => t * 100.0,
            _ => 0.0,
        };
        println!(
            "  self-sized at {target:.2} % stall: slowdown {:.2} %, saved {:.1} MB; the oracle saved {:.1} MB ({})",
            me.slowdown * 100.0,
            mb(me.saved_bytes),
            mb(j.oracle_saved_bytes),
            match (j.oracle, me.share_of_oracle_saving) {
                (Some(_), Some(share)) => format!("{:.0} % of it", share * 100.0),
                (Some(_), None) => "nothing to save".to_string(),
                (None, _) => "no fixed budget was within the target".to_string(),
            }
        );
        let recoveries: Vec<String> = me
            .recovery_seconds
            .iter()
            .map(|r| r.map_or("not within the phase".to_string(), |s| format!("{s} s")))
            .collect();
        println!(
            "    back within the slowdown after each phase change: {}; the budget {} its cap",
            if recoveries.is_empty() {
                "no change measured".to_string()
            } else {
                recoveries.join(", ")
            },
            if me.within_cap {
                "never over"
            } else {
                "went over"
            }
        );
        if let (Some(i), Some(ratio)) = (
            me.best_fixed_within_memory,
            me.pace_vs_best_fixed_within_memory,
        ) {
            println!(
                "    against the best fixed budget using no more memory ({:.1} MB): {:.1} % of its pace",
                mb(j.runs[i].mean_memory_bytes),
                ratio * 100.0
            );
        }
    }
}
