//! `ztier swap-bench`: zswap over a swap file under threads swapping real pages out and in.
//! The engine is `ztier_replay::swap_bench`; this parses flags and prints.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use ztier_compress::Algorithm;
use ztier_corpus::Corpus;
use ztier_replay::swap_bench::{SwapBench, SwapBenchReport};
use ztier_swap::Mode;

use crate::classes::PoolLayoutArgs;
use crate::pools::AllocatorChoice;
use crate::size::parse_size;

#[derive(Args, Debug)]
pub struct SwapBenchArgs {
    /// Corpus file whose pages are the working set. Default: the bundled sample.
    #[arg(long, value_name = "PATH")]
    pub corpus: Option<PathBuf>,
    /// zswap's compressor.
    #[arg(long, default_value = "lzo-rle")]
    pub compressor: Algorithm,
    /// The pool's allocator.
    #[arg(long, default_value = "zsmalloc")]
    pub allocator: AllocatorChoice,
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Threads swapping at once; a list (`1,2,4`) runs each count in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Vec<u16>,
    /// Swap-outs and swap-ins per run, over all its threads. Default: four per page of the
    /// working set.
    #[arg(long)]
    pub ops: Option<u64>,
    /// The RAM budget `max_pool_percent` is of (K, M, G suffixes). Default: half the
    /// working set, so the pool (a tenth of the working set) holds well under what the
    /// compressed working set needs, and writeback runs.
    #[arg(long, value_parser = parse_size)]
    pub ram: Option<u64>,
    #[arg(long, default_value_t = ztier_zswap::MAX_POOL_PERCENT)]
    pub max_pool_percent: u32,
    #[arg(long, default_value_t = ztier_zswap::ACCEPT_THRESHOLD_PERCENT)]
    pub accept_threshold_percent: u32,
    /// The swap device's slot allocator: the cluster mode or the legacy one.
    #[arg(long, value_enum, default_value = "cluster")]
    pub mode: ModeArg,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the swap file is made (and removed after).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// One JSON object per run instead of the report.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum ModeArg {
    Cluster,
    Legacy,
}

pub fn run(args: &SwapBenchArgs) -> anyhow::Result<()> {
    let path = match &args.corpus {
        Some(p) => p.clone(),
        None => crate::bench::default_corpus()?,
    };
    let corpus = Corpus::load_at_most(&path, ztier_pool::physical_memory_bytes() / 4)
        .with_context(|| format!("loading {}", path.display()))?;
    let layout = args.layout.config();
    let pages: Vec<&[u8]> = corpus.chunks(layout.page_size).collect();
    let bytes = pages.len() as u64 * layout.page_size as u64;
    for &allocator in args.allocator.kinds() {
        for &threads in &args.threads {
            let bench = SwapBench {
                algorithm: args.compressor.clone(),
                allocator,
                layout,
                threads: usize::from(threads),
                ops: args.ops.unwrap_or(4 * pages.len() as u64),
                ram_bytes: args.ram.unwrap_or(bytes / 2),
                max_pool_percent: args.max_pool_percent,
                accept_threshold_percent: args.accept_threshold_percent,
                mode: match args.mode {
                    ModeArg::Cluster => Mode::Cluster,
                    ModeArg::Legacy => Mode::Legacy,
                },
                seed: args.seed,
                dir: args.dir.clone().unwrap_or_else(std::env::temp_dir),
            };
            let report = bench.run(&corpus.name, &pages)?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print_report(&report);
            }
        }
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn print_report(r: &SwapBenchReport) {
    let z = &r.zswap;
    println!(
        "{}: {} pages ({}) through zswap ({}) over a swap file, {} thread{}, pool limit {} \
         (of a RAM budget of {})",
        r.corpus,
        r.working_set_pages,
        mib(r.working_set_pages * 4096),
        r.compressor,
        r.threads,
        if r.threads == 1 { "" } else { "s" },
        mib(r.max_pool_pages * 4096),
        mib(r.ram_bytes),
    );
    println!(
        "  {} ops ({} swap-outs, {} swap-ins, every one verified) in {:.2} s: {:.0} ops/s",
        r.ops, r.swap_outs, r.swap_ins, r.seconds, r.ops_per_s
    );
    println!(
        "  written back {} pages ({:.0} pages/s); pool {} at the end, peak {}",
        r.written_back_pages,
        r.writeback_pages_per_s,
        mib(r.pool_total_size),
        mib(r.pool_peak_bytes)
    );
    println!(
        "  Zswap {} / Zswapped {} (pool_total_size {}), {:.1} bytes of metadata per stored page",
        mib(r.zswap_bytes),
        mib(r.zswapped_bytes),
        r.pool_total_size,
        r.metadata_bytes_per_page
    );
    println!(
        "  swap device: {} slots allocated, {} device-lock acquisitions = {:.4} per slot",
        r.slots_allocated, r.device_lock_acquisitions, r.device_lock_per_slot
    );
    println!("  zswap counters:");
    for (name, value) in z.lines() {
        println!("    {name:<28} {value:>14}");
    }
    println!("  locks (acquisitions, contended, wait):");
    for l in &r.locks {
        println!(
            "    {:<24} {:>12} {:>10} {:>10.3} ms",
            l.name,
            l.acquisitions,
            l.contended,
            l.wait_ns as f64 / 1e6
        );
    }
    println!();
}
