//! `ztier bench zswap` (or `--front zswap`): every corpus swapped out through a zswap cache
//! in front of a swap device, swapped back in and verified, zswap's counters beside the
//! kernel zswap's (`ztier_replay::zswap`); or, with `--trace`, a capture over time through
//! zswap with its pool limit and shrinker (`ztier_replay::trace`). Flags in, reports out.

use std::path::PathBuf;

use clap::Args;
use ztier_replay::sweep::{Sweep, ZswapSweep};
use ztier_replay::trace::ZswapTraceRun;
use ztier_replay::zswap::ZswapRun;

use super::shared::{
    emit, mib, print_epoch_head, print_epoch_row, print_field, print_speeds, print_verdict,
    read_trace, PoolArgs, ReplayArgs,
};

/// The flags of a replay through zswap: no discard, recompression, writeback to a store of
/// the bench's, allocator table, sweep or picture (zram's), one `--chain-size` a run.
#[derive(Args, Debug, Clone)]
pub struct ZswapArgs {
    #[command(flatten)]
    pub replay: ReplayArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Replay the capture over time beside each corpus (NAME.trace, from `ztier capture
    /// --every`) through zswap over a swap device, epoch by epoch, its own pool limit
    /// (--max-pool-percent of --ram) and shrinker deciding what goes to the device. One
    /// thread.
    #[arg(long, conflicts_with = "threads")]
    pub trace: bool,
    /// With --trace: the memory zswap's pool limit is a percentage of (K, M, G suffixes;
    /// default this machine's).
    #[arg(long, value_name = "SIZE", requires = "trace", value_parser = crate::size::parse_size)]
    pub ram: Option<u64>,
    /// With --trace: zswap's max_pool_percent.
    #[arg(long, default_value_t = 20, requires = "trace",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_pool_percent: u32,
}

/// Every corpus × allocator × compressor × thread count through zswap (or, `--trace`,
/// every corpus's trace); fails (after printing every report) if any run's figures differ
/// from the kernel zswap's where they are compared.
pub fn run(args: &ZswapArgs) -> anyhow::Result<()> {
    let layout = args.pool.layout()?;
    let paths = args.replay.paths()?;
    if args.trace {
        run_trace(args, &paths, layout)
    } else {
        run_zswap(args, &paths, layout)
    }
}

/// `--trace`: each corpus's trace through zswap over a swap device.
fn run_trace(
    args: &ZswapArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let sweep = sweep(args, layout);
    let ram_bytes = args.ram.unwrap_or_else(ztier_pool::physical_memory_bytes);
    for path in paths {
        let trace = read_trace(path)?;
        let corpus = args.replay.trace_corpus(path, &trace)?;
        let pages = corpus.pages();
        for run in sweep.traces(&pages, &trace, ram_bytes, args.max_pool_percent)? {
            emit(args.replay.json, &run?, print_zswap_trace_run)?;
        }
    }
    Ok(())
}

/// The sweep the flags ask for.
fn sweep(args: &ZswapArgs, layout: ztier_pool::ZsConfig) -> ZswapSweep {
    ZswapSweep {
        sweep: Sweep {
            allocators: args.pool.allocator.kinds().to_vec(),
            compressors: args.replay.compressors.clone(),
            layouts: vec![layout],
            threads: args.pool.threads.clone(),
            progress: !args.replay.json,
        },
    }
}

fn print_zswap_trace_run(r: &ZswapTraceRun) {
    println!(
        "{}: {} epochs through zswap, {} on {} (chain {}), pool limit {}% of {}",
        r.corpus,
        r.epochs.len(),
        r.compressor,
        r.allocator,
        r.chain_size,
        r.max_pool_percent,
        mib(r.ram_bytes)
    );
    let front = [
        ("stored", 8),
        ("pool_total", 14),
        ("written back", 12),
        ("limit hit", 10),
    ];
    print_epoch_head(&front);
    for e in &r.epochs {
        let z = &e.zswap;
        let figures = [
            z.stored_pages,
            z.pool_total_size,
            z.written_back_pages,
            z.pool_limit_hit,
        ];
        let pages = [e.present, e.appeared, e.changed, e.went, e.read_back];
        print_epoch_row((e.epoch, e.seconds), pages, &front, &figures);
    }
    println!(
        "  {} pages swapped out, {} slots freed, {} swapped in from the device; peak pool {}; \
         every present page verified ({:.2} s)",
        r.pages_swapped_out,
        r.slots_freed,
        r.read_back_pages,
        mib(r.peak_pool_total_size),
        r.seconds
    );
    println!();
}

fn run_zswap(
    args: &ZswapArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let sweep = sweep(args, layout);
    let mut runs: Vec<ZswapRun> = Vec::new();
    for path in paths {
        let corpus = args.replay.load(path)?;
        // The runs of one allocator and compressor (its thread counts) come together: their
        // scaling is printed once the next group starts, or the corpus ends.
        let mut group = runs.len();
        for run in sweep.runs(&corpus)? {
            let run = run?;
            let last = runs.last().filter(|_| group < runs.len());
            if last
                .is_some_and(|l| (l.allocator, &l.compressor) != (run.allocator, &run.compressor))
            {
                print_zswap_scaling(args.replay.json, &runs[group..]);
                group = runs.len();
            }
            emit(args.replay.json, &run, print_zswap_run)?;
            runs.push(run);
        }
        print_zswap_scaling(args.replay.json, &runs[group..]);
    }
    Ok(ztier_replay::sweep::zswap_verdict(&runs)?)
}

fn print_zswap_run(r: &ZswapRun) {
    let z = &r.zswap;
    println!(
        "{}: {} pages of {} B ({}) swapped out through zswap, {} on {} (chain {}), {} thread{}",
        r.corpus,
        r.pages,
        r.page_size,
        mib(r.pages * r.page_size as u64),
        r.compressor,
        r.allocator,
        r.chain_size,
        r.threads,
        if r.threads == 1 { "" } else { "s" }
    );
    for (name, value) in z.lines() {
        println!("  {name:<28} {value:>14}");
    }
    println!(
        "  ratio {:.2} (Zswapped / Zswap), metadata {:.1} bytes per stored page (index and LRU)",
        z.zswapped_kb as f64 / z.zswap_kb.max(1) as f64,
        r.metadata_bytes_per_page
    );
    print_speeds(
        (r.store_mb_s, r.store_vs_raw, r.raw_compress_mb_s),
        (r.load_mb_s, r.load_vs_raw, r.raw_decompress_mb_s),
    );
    println!(
        "  zram on the same pages: read {:.1} MB/s, swap-in {:.1} MB/s (each page read, then its \
         slot freed at once, as zram_slot_free_notify does); zswap's load = {:.2}x zram's swap-in",
        r.zram_read_mb_s,
        r.zram_swapin_mb_s,
        r.load_mb_s / r.zram_swapin_mb_s
    );
    if let Some(k) = &r.kernel {
        println!("  the kernel's zswap ({}) on the same pages:", k.release);
        println!(
            "    {:<30} {:>14} {:>14} {:>10}",
            "field", "ztier", "kernel", "diff"
        );
        for f in &k.fields {
            print_field(f.field, f);
        }
        print_verdict(&k.fields, &k.notes, k.equal);
        if let (Some(out), Some(inn)) = (k.truth.pageout_mb_s, k.truth.faultin_mb_s) {
            println!(
                "    kernel swap-out through zswap {out:.0} MB/s, fault-in {inn:.0} MB/s (whole \
                 process path); ztier store = {:.2}x, load = {:.2}x",
                r.store_mb_s / out,
                r.load_mb_s / inn
            );
        }
    }
    println!();
}

/// How each thread count's figures scale from the first's, for zswap's load and for zram's
/// reads and swap-in on the same pages: a load that frees its object (zswap's, in batches;
/// zram's swap-in, one at a time) meets the frees' cost and the lines they write, which
/// zram's plain reads do not. Text only (`--json` has each run's figures).
fn print_zswap_scaling(json: bool, runs: &[ZswapRun]) {
    let Some((first, rest)) = runs.split_first().filter(|_| !json) else {
        return;
    };
    for r in rest {
        println!(
            "{} {} on {}: {} threads / {}: zswap load {:.2}x, zram swap-in {:.2}x, zram read \
             {:.2}x",
            r.corpus,
            r.compressor,
            r.allocator,
            r.threads,
            first.threads,
            r.load_mb_s / first.load_mb_s,
            r.zram_swapin_mb_s / first.zram_swapin_mb_s,
            r.zram_read_mb_s / first.zram_read_mb_s
        );
    }
    if !rest.is_empty() {
        println!();
    }
}
