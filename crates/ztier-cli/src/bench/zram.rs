//! `ztier bench` (and `ztier bench zram`): every corpus written to a zram device, read back
//! and verified, `mm_stat` after each step beside the kernel zram's (`ztier_replay::zram`);
//! a sweep of allocators, compressors, chain sizes and thread counts (`ztier_replay::sweep`)
//! in one table and picture; or, with `--trace`, a capture over time replayed epoch by epoch with the idle
//! policy (`ztier_replay::trace`); or, with `--unit-size`, each corpus stored in compression
//! units of each size (`ztier_replay::units`). Flags in, reports out.

use std::path::PathBuf;

use clap::Args;
use ztier_compress::Algorithm;
use ztier_replay::sweep::{Sweep, WritebackPlan, WritebackStore, ZramSweep};
use ztier_replay::trace::TraceRun;
use ztier_replay::zram::ZramRun;

use super::shared::{
    emit, mib, print_epoch_head, print_epoch_row, print_field, print_speeds, print_verdict,
    read_trace, PoolArgs, ReplayArgs,
};
use crate::error::CliError;

/// The flags of a replay through zram.
#[derive(Args, Debug, Clone)]
pub struct ZramArgs {
    #[command(flatten)]
    pub replay: ReplayArgs,
    #[command(flatten)]
    pub pool: PoolArgs,
    /// After the write, discard every odd page, then compact (as the kernel's figures in the
    /// truth files were taken).
    #[arg(long)]
    pub discard_odd: bool,
    /// Also print the allocator's table after the write (zsmalloc's debugfs `classes`,
    /// zblock's `blocks`).
    #[arg(long)]
    pub stats: bool,
    /// After the replay, recompress every page with this secondary algorithm (kept only where
    /// it lands in a smaller size class), and report mm_stat after it.
    #[arg(long, value_name = "ALG")]
    pub recompress: Option<Algorithm>,
    /// Then mark every page idle and write it back to this file (made sparse; removed after
    /// the run if the bench made it), and read every page back.
    #[arg(long, value_name = "PATH", group = "writeback")]
    pub writeback_file: Option<PathBuf>,
    /// As --writeback-file, to an NBD export (nbd://HOST:PORT/NAME or
    /// nbd+unix:///NAME?socket=PATH).
    #[arg(long, value_name = "URI", group = "writeback")]
    pub writeback_nbd: Option<ztier_nbd::Uri>,
    /// How written-back pages are laid out: packed (compressed objects back to back),
    /// compressed (one per block, the kernel's compressed_writeback) or page (decompressed,
    /// the kernel's default).
    #[arg(long, default_value = "packed", requires = "writeback")]
    pub writeback_format: ztier_zram::WbFormat,
    /// Several chain sizes in one sweep (`4,8,16`; overrides --chain-size): every corpus ×
    /// allocator × compressor × chain size × thread count, then one table of them all.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...",
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub chain_sizes: Vec<u8>,
    /// Also draw the runs into this SVG (as `ztier plot` does; keeps the allocator's table,
    /// as --stats). With --unit-size: memory against a random read's p99, each unit size;
    /// with --promotion-target: pages held on the store against promotions, each age.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Replay the capture over time beside each corpus (NAME.trace, from `ztier capture
    /// --every`) through zram, epoch by epoch: overwrites, discards and the idle policy
    /// (--recompress, --writeback-*); memory after every epoch. One thread, one layout, and
    /// no discard of its own.
    #[arg(long, conflicts_with_all = ["threads", "discard_odd", "stats", "chain_sizes"])]
    pub trace: bool,
    /// With --trace: every this many epochs, the pages not written since the policy's last
    /// run are recompressed and written back, then every page is marked idle.
    #[arg(long, default_value_t = 1, requires = "trace",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub idle_epochs: u32,
    /// Compression unit sizes to compare (`4K,16K,64K`): each corpus × compressor stored in
    /// units of each size on the allocator asked for (--allocator; zsmalloc by default, `all`
    /// for each), one thread; memory, store time beside the raw
    /// compressor's, sequential 4 KiB reads beside the raw decompressor's least for them
    /// (raw_seq), random 4 KiB reads beside the raw decompression of their units (raw_p99),
    /// readahead windows of 8 pages (ra_*), and what the device's cache of decompressed
    /// units held (cache_KiB).
    #[arg(long, value_delimiter = ',', value_name = "SIZE,SIZE,...",
          value_parser = crate::size::parse_size,
          conflicts_with_all = ["trace", "discard_odd", "recompress", "writeback", "chain_sizes"])]
    pub unit_size: Vec<u64>,
    /// With --unit-size: random page reads timed one by one.
    #[arg(long, default_value_t = 20_000, requires = "unit_size")]
    pub random_reads: usize,
    #[command(flatten)]
    pub far_tier: super::far_tier::FarTierArgs,
}

/// Runs every corpus × allocator × compressor × layout × thread count (or, `--trace`, every
/// corpus's trace); fails (after printing every report) if any run's figures differ from
/// the kernel's where they are compared.
pub fn run(args: &ZramArgs) -> anyhow::Result<()> {
    let layout = args.pool.layout()?;
    let paths = args.replay.paths()?;
    let made_file = args
        .writeback_file
        .as_ref()
        .filter(|p| !p.exists())
        .cloned();
    let result = if !args.unit_size.is_empty() {
        run_units(args, &paths, layout)
    } else if let Some(percent) = args.far_tier.promotion_target {
        super::far_tier::run(
            &args.far_tier,
            &args.replay,
            args.pool.allocator.kinds()[0],
            percent,
            &paths,
            layout,
            args.plot.as_deref(),
        )
    } else if args.trace {
        run_trace(args, &paths, layout)
    } else {
        run_zram(args, &paths, layout)
    };
    if let Some(p) = made_file {
        let _ = std::fs::remove_file(p);
    }
    result
}

fn run_zram(
    args: &ZramArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let sweep = sweep(args, layout)?;
    let mut runs = Vec::new();
    for path in paths {
        let corpus = args.replay.load(path)?;
        for run in sweep.runs(&corpus).map_err(CliError::from_replay)? {
            let run = run.map_err(CliError::from_replay)?;
            emit(args.replay.json, &run, print_run)?;
            runs.push(run);
        }
    }
    if !args.replay.json && runs.len() > 1 {
        crate::pools::print_side_by_side(&runs);
    }
    if let Some(svg) = &args.plot {
        let values = runs
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?;
        crate::plot::render(&values, svg)?;
        if !args.replay.json {
            println!("drawn: {}", svg.display());
        }
    }
    Ok(ztier_replay::sweep::zram_verdict(&runs)?)
}

/// The sweep the flags ask for.
fn sweep(args: &ZramArgs, layout: ztier_pool::ZsConfig) -> anyhow::Result<ZramSweep> {
    Ok(ZramSweep {
        sweep: Sweep {
            allocators: args.pool.allocator.kinds().to_vec(),
            compressors: args.replay.compressors.clone(),
            layouts: Sweep::layouts(layout, &args.chain_sizes)?,
            threads: args.pool.threads.clone(),
            progress: !args.replay.json,
        },
        discard_odd: args.discard_odd,
        allocator_stats: args.stats || args.plot.is_some(),
        recompress: args.recompress.clone(),
        writeback: writeback_plan(args)?,
    })
}

/// `--unit-size`: every corpus × compressor × unit size, one table.
fn run_units(
    args: &ZramArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    if !args.replay.json {
        println!(
            "{:<10} {:<9} {:<8} {:>5} {:>10} {:>10} {:>7} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8} {:>9}",
            "corpus",
            "allocator",
            "alg",
            "unit",
            "mem_used",
            "raw_compr",
            "mem/raw",
            "store_s",
            "raw_c_s",
            "seq_MB/s",
            "raw_seq",
            "unit_MB/s",
            "rand_MB/s",
            "p50_us",
            "p99_us",
            "raw_p99",
            "ra_MB/s",
            "ra_p50",
            "ra_p99",
            "cache_KiB"
        );
    }
    let sweep = ztier_replay::sweep::UnitSweep {
        layout,
        allocators: args.pool.allocator.kinds().to_vec(),
        compressors: args.replay.compressors.clone(),
        unit_sizes: args
            .unit_size
            .iter()
            .map(|&size| usize::try_from(size))
            .collect::<Result<_, _>>()?,
        random_reads: args.random_reads,
    };
    let mut runs = Vec::new();
    for path in paths {
        let corpus = args.replay.load(path)?;
        for run in sweep.runs(&corpus) {
            let run = run?;
            emit(args.replay.json, &run, print_unit_run)?;
            runs.push(serde_json::to_value(&run)?);
        }
    }
    if let Some(svg) = &args.plot {
        crate::plot::render(&runs, svg)?;
    }
    Ok(())
}

fn print_unit_run(r: &ztier_replay::units::UnitRun) {
    println!(
        "{:<10} {:<9} {:<8} {:>4}K {:>10} {:>10} {:>7.3} {:>8.3} {:>8.3} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>8.1} {:>8.1} {:>8.1} {:>9.0} {:>8.1} {:>8.1} {:>9}",
        r.corpus,
        r.allocator,
        r.compressor,
        r.unit_size >> 10,
        r.mm_stat.mem_used_total,
        r.raw_compressed_bytes,
        r.stored_vs_raw,
        r.store_seconds,
        r.raw_compress_seconds,
        r.sequential_read_mb_s,
        r.raw_sequential_read_mb_s,
        r.sequential_unit_read_mb_s,
        r.random_read_mb_s,
        r.random_read_p50_us,
        r.random_read_p99_us,
        r.raw_unit_decompress_p99_us,
        r.readahead_read_mb_s,
        r.readahead_read_p50_us,
        r.readahead_read_p99_us,
        r.unit_cache_bytes >> 10
    );
}

/// `--trace`: each corpus's trace through zram, for every allocator and compressor.
fn run_trace(
    args: &ZramArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let sweep = sweep(args, layout)?;
    let mut runs = Vec::new();
    for path in paths {
        let trace = read_trace(path)?;
        let corpus = args.replay.trace_corpus(path, &trace)?;
        for run in sweep
            .traces(corpus.pages(), &trace, args.idle_epochs)
            .map_err(CliError::from_replay)?
        {
            let run = run.map_err(CliError::from_replay)?;
            emit(args.replay.json, &run, print_trace_run)?;
            runs.push(serde_json::to_value(&run)?);
        }
    }
    if let Some(svg) = &args.plot {
        crate::plot::render(&runs, svg)?;
        if !args.replay.json {
            println!("drawn: {}", svg.display());
        }
    }
    Ok(())
}

fn print_trace_run(r: &TraceRun) {
    println!(
        "{}: {} epochs through zram, {} on {} (chain {}), device of {} pages; policy every {} \
         epoch{}: recompress {}, write back to {}",
        r.corpus,
        r.epochs.len(),
        r.compressor,
        r.allocator,
        r.chain_size,
        r.device_pages,
        r.idle_epochs,
        if r.idle_epochs == 1 { "" } else { "s" },
        r.recompressor.as_deref().unwrap_or("no"),
        r.writeback_store.as_deref().unwrap_or("nowhere")
    );
    let front = [
        ("recomp", 9),
        ("wb", 8),
        ("compr_data", 12),
        ("mem_used", 12),
        ("on store", 8),
    ];
    print_epoch_head(&front);
    for e in &r.epochs {
        let figures = [
            e.recompressed,
            e.written_back,
            e.mm_stat.compr_data_size,
            e.mm_stat.mem_used_total,
            e.bd_stat.as_ref().map_or(0, |b| b.bd_count),
        ];
        let pages = [e.present, e.appeared, e.changed, e.went, e.read_back];
        print_epoch_row((e.epoch, e.seconds), pages, &front, &figures);
    }
    println!("  final mm_stat {}", r.final_mm_stat);
    if let Some(bd) = &r.final_bd_stat {
        println!(
            "  final bd_stat {} {} {}",
            bd.bd_count, bd.bd_reads, bd.bd_writes
        );
    }
    println!(
        "  {} pages written, {} discarded; the policy recompressed {}, wrote back {}, of which \
         {} were read again; peak mem_used_total {}; every present page verified ({:.2} s)",
        r.pages_written,
        r.pages_discarded,
        r.recompressed_pages,
        r.written_back_pages,
        r.read_back_pages,
        mib(r.peak_mem_used_total),
        r.seconds
    );
    println!();
}

/// The store `--writeback-file` or `--writeback-nbd` names (an export connected to here:
/// the CLI wires front ends to engines).
fn writeback_plan(args: &ZramArgs) -> anyhow::Result<Option<WritebackPlan>> {
    let store = if let Some(path) = &args.writeback_file {
        WritebackStore::File(path.clone())
    } else if let Some(uri) = &args.writeback_nbd {
        let client = ztier_nbd::Client::connect(uri)
            .map_err(|e| CliError::store_export("--writeback-nbd", &uri.to_string(), &e))?;
        WritebackStore::Device {
            store: std::sync::Arc::new(client),
            name: uri.to_string(),
        }
    } else {
        return Ok(None);
    };
    Ok(Some(WritebackPlan {
        store,
        format: args.writeback_format,
    }))
}

fn print_run(r: &ZramRun) {
    let mm = &r.mm_stat;
    let layout = if r.allocator == "zsmalloc" {
        format!(" (chain {})", r.chain_size)
    } else {
        String::new()
    };
    println!(
        "{}: {} pages of {} B ({}), {} on {}{layout}, {} thread{}",
        r.corpus,
        r.pages,
        r.page_size,
        mib(r.pages * r.page_size as u64),
        r.compressor,
        r.allocator,
        r.threads,
        if r.threads == 1 { "" } else { "s" }
    );
    println!("  mm_stat               {mm}");
    if let Some(d) = &r.mm_stat_after_discard {
        println!("  mm_stat after discard {d}");
    }
    println!("  mm_stat after compact {}", r.mm_stat_after_compact);
    let ratio = mm.orig_data_size as f64 / mm.mem_used_total.max(1) as f64;
    let overhead = mm.mem_used_total as f64 / mm.compr_data_size.max(1) as f64;
    println!(
        "  ratio {:.2} (orig / mem_used_total), allocator overhead {:.3} (mem_used_total / compr_data_size), \
         same {} huge {}",
        ratio, overhead, mm.same_pages, mm.huge_pages
    );
    print_speeds(
        (r.store_mb_s, r.store_vs_raw, r.raw_compress_mb_s),
        (r.load_mb_s, r.load_vs_raw, r.raw_decompress_mb_s),
    );
    println!(
        "  device rss {} after compaction, mem_used_total {} (rss with the device less rss without it)",
        mib(r.device_rss_bytes),
        mib(r.device_mem_used_total)
    );
    if let Some(table) = &r.allocator_stats {
        println!("  {} after the write:", r.allocator);
        for line in table.to_string().lines() {
            println!("    {line}");
        }
    }
    if let Some(rc) = &r.recompress {
        let before = r.mm_stat_after_compact.compr_data_size;
        let after = rc.mm_stat_after_recompress.compr_data_size;
        println!(
            "  recompressed with {}: {} pages into smaller classes, {} incompressible, in {:.2} s; \
             compr_data_size {} -> {}, mem_used_total {} -> {} (every page verified)",
            rc.algorithm,
            rc.recompressed_pages,
            rc.incompressible_pages,
            rc.seconds,
            mib(before),
            mib(after),
            mib(r.mm_stat_after_compact.mem_used_total),
            mib(rc.mm_stat_after_recompress.mem_used_total)
        );
    }
    if let Some(wb) = &r.writeback {
        println!(
            "  written back to {} ({:?}): {} pages, {} written ({:.0} bytes a page), {:.1} MB/s of pages",
            wb.store,
            wb.format,
            wb.pages_written_back,
            mib(wb.writeback_bytes),
            wb.writeback_bytes_per_page,
            wb.writeback_mb_s
        );
        println!(
            "    mm_stat after writeback {}; bd_stat {} {} {}; read back {:.1} MB/s, every page verified",
            wb.mm_stat_after_writeback,
            wb.bd_stat.bd_count,
            wb.bd_stat.bd_reads,
            wb.bd_stat.bd_writes,
            wb.readback_mb_s
        );
    }
    if let Some(k) = &r.kernel {
        println!("  the kernel's zram ({}) on the same pages:", k.release);
        println!(
            "    {:<30} {:>14} {:>14} {:>10}",
            "field", "ztier", "kernel", "diff"
        );
        for f in &k.fields {
            // Every field after the write; after later steps, those that differ and those
            // the step changes most (the pool's pages).
            let shown = f.after == "write"
                || f.ztier != f.kernel
                || ["mem_used_total", "pages_compacted"].contains(&f.field);
            if !shown {
                continue;
            }
            let name = if f.after == "write" {
                f.field.to_string()
            } else {
                format!("after {}: {}", f.after, f.field)
            };
            print_field(&name, f);
        }
        print_verdict(&k.fields, &k.notes, k.equal);
        if let Some(w) = k.write_mb_s {
            let read = k
                .read_mb_s
                .map_or(String::new(), |rd| format!(", read {rd:.0} MB/s"));
            println!(
                "    kernel zram via dd O_DIRECT: write {w:.0} MB/s{read}; ztier store = {:.2}x the kernel's write",
                r.store_mb_s / w
            );
        }
    }
    println!();
}
