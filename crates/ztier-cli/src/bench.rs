//! `ztier bench`: flags in, reports out. The replay itself is `ztier_replay::zram`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use ztier_compress::Algorithm;
use ztier_corpus::trace::Trace;
use ztier_corpus::Corpus;
use ztier_replay::trace::{TraceReplay, TraceRun, ZswapTraceReplay, ZswapTraceRun};
use ztier_replay::zram::{FieldComparison, WritebackTarget, ZramReplay, ZramRun};
use ztier_replay::zswap::{ZswapReplay, ZswapRun};
use ztier_zram::MmStat;

use crate::classes::PoolLayoutArgs;
use crate::pools::AllocatorChoice;

/// Which engine the pages go through.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Front {
    /// A zram device: pages written to it, `mm_stat` beside the kernel zram's.
    Zram,
    /// A zswap cache in front of a swap device: pages swapped out to it, the zswap counters
    /// beside the kernel zswap's.
    Zswap,
    /// A userfaultfd region (`ztier-uffd`) under --budget: evicted, faulted back in and
    /// verified, beside the kernel zswap's page-out and fault-in.
    Uffd,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// The engine to replay through.
    #[arg(long, value_enum, default_value = "zram")]
    pub front: Front,
    /// Corpus file (raw .pages or .pages.zst); repeatable. Default: the bundled sample.
    #[arg(long = "corpus", value_name = "PATH")]
    pub corpora: Vec<PathBuf>,
    /// Compressor, with optional parameters (lzo-rle, lzo, lz4, lz4hc, zstd, deflate,
    /// zstd:level=N, ...); repeatable.
    #[arg(long = "compressor", value_name = "ALG", default_value = "lzo-rle")]
    pub compressors: Vec<Algorithm>,
    /// Allocator under the device (or `all`).
    #[arg(long, default_value = "zsmalloc")]
    pub allocator: AllocatorChoice,
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Threads writing and reading at once; a list (`1,2`) runs each count in turn.
    #[arg(long, value_delimiter = ',', default_value = "1",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Vec<u16>,
    /// After the write, discard every odd page, then compact (as the kernel's figures in the
    /// truth files were taken).
    #[arg(long)]
    pub discard_odd: bool,
    /// Print one JSON object per run instead of the report.
    #[arg(long)]
    pub json: bool,
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
    #[arg(long, value_name = "PATH", conflicts_with = "writeback_nbd")]
    pub writeback_file: Option<PathBuf>,
    /// As --writeback-file, to an NBD export (nbd://HOST:PORT/NAME or
    /// nbd+unix:///NAME?socket=PATH).
    #[arg(long, value_name = "URI")]
    pub writeback_nbd: Option<ztier_nbd::Uri>,
    /// How written-back pages are laid out: packed (compressed objects back to back),
    /// compressed (one per block, the kernel's compressed_writeback) or page (decompressed,
    /// the kernel's default).
    #[arg(long, default_value = "packed")]
    pub writeback_format: ztier_zram::WbFormat,
    /// Several chain sizes in one sweep (`4,8,16`; overrides --chain-size): every corpus ×
    /// allocator × compressor × chain size × thread count, then one table of them all.
    #[arg(long, value_delimiter = ',', value_name = "N,N,...",
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub chain_sizes: Vec<u8>,
    /// Also draw the runs into this SVG (as `ztier plot` does; keeps the allocator's table,
    /// as --stats).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Replay the capture over time beside each corpus (NAME.trace, from `ztier capture
    /// --every`) through zram, epoch by epoch: overwrites, discards and the idle policy
    /// (--recompress, --writeback-*); memory after every epoch.
    #[arg(long)]
    pub trace: bool,
    /// With --trace: every this many epochs, the pages not written since the policy's last
    /// run are recompressed and written back, then every page is marked idle.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub idle_epochs: u32,
    /// With --trace --front zswap: the memory zswap's pool limit is a percentage of (K, M, G
    /// suffixes; default this machine's).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub ram: Option<u64>,
    /// With --trace --front zswap: zswap's max_pool_percent.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_pool_percent: u32,
    /// Refuse a corpus of more than this many bytes of pages (K, M, G suffixes). Default: a
    /// quarter of this machine's memory (the bench holds the pages, their compressed copies
    /// and the device).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub max_corpus: Option<u64>,
    /// With --front uffd: the region's RAM budget, a share of its size (25% or 0.25).
    #[arg(long, default_value = "25%", value_parser = crate::uffd_bench::parse_budget)]
    pub budget: f64,
    /// With --front uffd: keep the region's fault thread at normal priority (by default it
    /// runs at idle priority while one thread faults, where the process may leave it again).
    #[arg(long)]
    pub normal_priority: bool,
    /// With --front uffd: the region makes no CPU latency request while faults come (by
    /// default it holds one where /dev/cpu_dma_latency can be opened, so that idle CPUs
    /// poll instead of halting; see ztier_uffd::RegionConfig::cpu_latency_qos).
    #[arg(long)]
    pub no_cpu_latency_qos: bool,
}

/// The bundled sample: next to the working directory, or in the source tree.
pub fn default_corpus() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from("samples/sample.pages.zst"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("no --corpus given and the bundled samples/sample.pages.zst is not here")
}

/// Runs every corpus × allocator × compressor × thread count; fails (after printing every
/// report) if any run's figures differ from the kernel's where they are compared.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let layout = args.layout.config();
    layout.validate().map_err(anyhow::Error::msg)?;
    let paths = if args.corpora.is_empty() {
        vec![default_corpus()?]
    } else {
        args.corpora.clone()
    };
    if args.front == Front::Uffd {
        return crate::uffd_bench::run(args, &paths);
    }
    if args.front == Front::Zswap {
        // Refused by name rather than ignored: zswap's runs have no sweep table or picture,
        // and its pool is zsmalloc's at --chain-size (one chain size a run).
        for (given, flag) in [
            (args.plot.is_some(), "--plot"),
            (!args.chain_sizes.is_empty(), "--chain-sizes"),
        ] {
            if given {
                bail!(
                    "{flag} is zram's: --front zswap draws no picture and sweeps no chain \
                     sizes (one --chain-size a run; `ztier plot` draws zram results)"
                );
            }
        }
        if args.trace {
            return run_zswap_trace(args, &paths, layout);
        }
        return run_zswap(args, &paths, layout);
    }
    let made_file = args
        .writeback_file
        .as_ref()
        .filter(|p| !p.exists())
        .cloned();
    let result = if args.trace {
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
    args: &BenchArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    let layouts = layouts(args, layout)?;
    for path in paths {
        let corpus = load(args, path)?;
        let truth = corpus.truth::<MmStat>().context("reading the truth file")?;
        let writeback = writeback_target(args, corpus.pages() as u64)?;
        for &allocator in args.allocator.kinds() {
            for algorithm in &args.compressors {
                // Chain sizes are zsmalloc's: other allocators run the first layout only.
                let layouts = if allocator == ztier_pool::AllocatorKind::Zsmalloc {
                    &layouts[..]
                } else {
                    &layouts[..1]
                };
                for (&layout, &threads) in layouts
                    .iter()
                    .flat_map(|l| args.threads.iter().map(move |t| (l, t)))
                {
                    let replay = ZramReplay {
                        allocator,
                        layout,
                        algorithm: algorithm.clone(),
                        threads,
                        discard_odd: args.discard_odd,
                        allocator_stats: args.stats || args.plot.is_some(),
                        progress: !args.json,
                        recompress: args.recompress.clone(),
                        writeback: writeback.clone(),
                    };
                    let run = replay.run(&corpus, truth.as_ref())?;
                    if args.json {
                        println!("{}", serde_json::to_string(&run)?);
                    } else {
                        print_run(&run);
                    }
                    runs.push(run);
                }
            }
        }
    }
    if !args.json && runs.len() > 1 {
        crate::pools::print_side_by_side(&runs);
    }
    if let Some(svg) = &args.plot {
        let values = runs
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()?;
        crate::plot::render(&values, svg)?;
        if !args.json {
            println!("drawn: {}", svg.display());
        }
    }
    let different: Vec<String> = runs
        .iter()
        .filter(|r| r.kernel.as_ref().is_some_and(|k| !k.equal))
        .map(|r| format!("{} {} {} threads", r.corpus, r.compressor, r.threads))
        .collect();
    if !different.is_empty() {
        bail!(
            "different from the kernel's figures: {}",
            different.join("; ")
        );
    }
    Ok(())
}

/// The pool layouts of a sweep: `--chain-sizes`, else the one `--chain-size`.
fn layouts(
    args: &BenchArgs,
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<Vec<ztier_pool::ZsConfig>> {
    if args.chain_sizes.is_empty() {
        return Ok(vec![layout]);
    }
    args.chain_sizes
        .iter()
        .map(|&chain| {
            let l = ztier_pool::ZsConfig {
                chain_size: chain as usize,
                ..layout
            };
            l.validate().map_err(anyhow::Error::msg)?;
            Ok(l)
        })
        .collect()
}

/// `--trace`: each corpus's trace through zram, for every allocator and compressor.
fn run_trace(
    args: &BenchArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for path in paths {
        let corpus = load(args, path)?;
        let trace_path = Trace::path_for(path);
        let trace = Trace::read(&trace_path).with_context(|| {
            format!(
                "--trace: reading {} (made by ztier capture beside its corpus)",
                trace_path.display()
            )
        })?;
        let writeback = writeback_target(args, corpus.pages() as u64)?;
        for &allocator in args.allocator.kinds() {
            for algorithm in &args.compressors {
                let replay = TraceReplay {
                    allocator,
                    layout,
                    algorithm: algorithm.clone(),
                    recompress: args.recompress.clone(),
                    writeback: writeback.clone(),
                    idle_epochs: args.idle_epochs,
                };
                let run = replay.run(&corpus, &trace)?;
                if args.json {
                    println!("{}", serde_json::to_string(&run)?);
                } else {
                    print_trace_run(&run);
                }
                runs.push(serde_json::to_value(&run)?);
            }
        }
    }
    if let Some(svg) = &args.plot {
        crate::plot::render(&runs, svg)?;
        if !args.json {
            println!("drawn: {}", svg.display());
        }
    }
    Ok(())
}

/// `--trace --front zswap`: each corpus's trace through zswap over a swap device.
fn run_zswap_trace(
    args: &BenchArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    if args.discard_odd
        || args.stats
        || args.recompress.is_some()
        || args.writeback_file.is_some()
        || args.writeback_nbd.is_some()
    {
        bail!(
            "--discard-odd, --stats, --recompress and --writeback-* are zram's; zswap's \
             trace replay writes back by its own pool limit (--ram, --max-pool-percent)"
        );
    }
    for path in paths {
        let corpus = load(args, path)?;
        let trace_path = Trace::path_for(path);
        let trace = Trace::read(&trace_path)
            .with_context(|| format!("--trace: reading {}", trace_path.display()))?;
        for &allocator in args.allocator.kinds() {
            for algorithm in &args.compressors {
                let replay = ZswapTraceReplay {
                    allocator,
                    layout,
                    algorithm: algorithm.clone(),
                    ram_bytes: args.ram.unwrap_or_else(ztier_pool::physical_memory_bytes),
                    max_pool_percent: args.max_pool_percent,
                };
                let run = replay.run(&corpus, &trace)?;
                if args.json {
                    println!("{}", serde_json::to_string(&run)?);
                } else {
                    print_zswap_trace_run(&run);
                }
            }
        }
    }
    Ok(())
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
    println!(
        "  {:>5} {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>14} {:>12} {:>10}",
        "epoch",
        "at s",
        "present",
        "appeared",
        "changed",
        "went",
        "read back",
        "stored",
        "pool_total",
        "written back",
        "limit hit"
    );
    for e in &r.epochs {
        let z = &e.zswap;
        println!(
            "  {:>5} {:>7.1} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>14} {:>12} {:>10}",
            e.epoch,
            e.seconds,
            e.present,
            e.appeared,
            e.changed,
            e.went,
            e.read_back,
            z.stored_pages,
            z.pool_total_size,
            z.written_back_pages,
            z.pool_limit_hit
        );
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
    println!(
        "  {:>5} {:>7} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>12} {:>12} {:>8}",
        "epoch",
        "at s",
        "present",
        "appeared",
        "changed",
        "went",
        "read back",
        "recomp",
        "wb",
        "compr_data",
        "mem_used",
        "on store"
    );
    for e in &r.epochs {
        println!(
            "  {:>5} {:>7.1} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>12} {:>12} {:>8}",
            e.epoch,
            e.seconds,
            e.present,
            e.appeared,
            e.changed,
            e.went,
            e.read_back,
            e.recompressed,
            e.written_back,
            e.mm_stat.compr_data_size,
            e.mm_stat.mem_used_total,
            e.bd_stat.as_ref().map_or(0, |b| b.bd_count)
        );
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

/// The store `--writeback-file` or `--writeback-nbd` names, for a corpus of `pages` pages.
fn writeback_target(args: &BenchArgs, pages: u64) -> anyhow::Result<Option<WritebackTarget>> {
    let store: std::sync::Arc<dyn ztier_blockdev::BlockDevice> =
        if let Some(path) = &args.writeback_file {
            let bytes = ztier_zram::Backing::size_for(pages * ztier_swap::SLOT_BYTES);
            let dev = ztier_blockdev::file::FileDevice::open(path, bytes)
                .with_context(|| format!("opening the writeback file {}", path.display()))?;
            std::sync::Arc::new(dev)
        } else if let Some(uri) = &args.writeback_nbd {
            std::sync::Arc::new(
                ztier_nbd::Client::connect(uri)
                    .with_context(|| format!("connecting to the writeback export {uri}"))?,
            )
        } else {
            return Ok(None);
        };
    let name = match (&args.writeback_file, &args.writeback_nbd) {
        (Some(p), _) => format!("file:{}", p.display()),
        (_, Some(u)) => u.to_string(),
        _ => unreachable!("one of them is set"),
    };
    Ok(Some(WritebackTarget {
        store,
        format: args.writeback_format,
        name,
    }))
}

fn load(args: &BenchArgs, path: &Path) -> anyhow::Result<Corpus> {
    let max = args
        .max_corpus
        .unwrap_or_else(|| ztier_pool::physical_memory_bytes() / 4);
    Corpus::load_at_most(path, max).with_context(|| format!("loading {}", path.display()))
}

/// `--front zswap`: every corpus × allocator × compressor × thread count through zswap.
fn run_zswap(
    args: &BenchArgs,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
) -> anyhow::Result<()> {
    if args.discard_odd
        || args.stats
        || args.recompress.is_some()
        || args.writeback_file.is_some()
        || args.writeback_nbd.is_some()
    {
        bail!(
            "--discard-odd, --stats, --recompress and --writeback-* are zram's; zswap's replay \
             has none of them"
        );
    }
    let mut different = Vec::new();
    for path in paths {
        let corpus = load(args, path)?;
        for &allocator in args.allocator.kinds() {
            for algorithm in &args.compressors {
                let truth = corpus
                    .zswap_truth(algorithm.kind.name())
                    .context("reading zswap-truth.json")?;
                let mut runs = Vec::new();
                for &threads in &args.threads {
                    let replay = ZswapReplay {
                        allocator,
                        layout,
                        algorithm: algorithm.clone(),
                        threads,
                        progress: !args.json,
                    };
                    let run = replay.run(&corpus, truth.as_ref())?;
                    if args.json {
                        println!("{}", serde_json::to_string(&run)?);
                    } else {
                        print_zswap_run(&run);
                    }
                    if run.kernel.as_ref().is_some_and(|k| !k.equal) {
                        different.push(format!(
                            "{} {} {} threads",
                            run.corpus, run.compressor, threads
                        ));
                    }
                    runs.push(run);
                }
                if !args.json {
                    print_zswap_scaling(&runs);
                }
            }
        }
    }
    if !different.is_empty() {
        bail!(
            "different from the kernel zswap's figures: {}",
            different.join("; ")
        );
    }
    Ok(())
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
    println!(
        "  store {:>8.1} MB/s  = {:.2}x raw compress ({:.1} MB/s)",
        r.store_mb_s, r.store_vs_raw, r.raw_compress_mb_s
    );
    println!(
        "  load  {:>8.1} MB/s  = {:.2}x raw decompress ({:.1} MB/s), every page verified",
        r.load_mb_s, r.load_vs_raw, r.raw_decompress_mb_s
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
fn print_zswap_scaling(runs: &[ZswapRun]) {
    let Some((first, rest)) = runs.split_first() else {
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

/// One row of a comparison with the kernel: ztier's figure, the kernel's, the difference.
fn print_field(name: &str, f: &FieldComparison) {
    let diff = f.ztier as i128 - f.kernel as i128;
    let mark = if f.compared { "" } else { "  (not compared)" };
    println!(
        "    {name:<30} {:>14} {:>14} {diff:>+10}{mark}",
        f.ztier, f.kernel
    );
}

/// The notes under a comparison, and its verdict.
fn print_verdict(fields: &[FieldComparison], notes: &[String], equal: bool) {
    for note in notes {
        println!("    note: {note}");
    }
    println!(
        "    {}",
        if !equal {
            "DIFFERENT from the kernel's figures"
        } else if fields.iter().all(|f| f.compared) {
            "every field equal to the kernel's"
        } else {
            "every compared field equal to the kernel's"
        }
    );
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
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
    println!(
        "  store {:>8.1} MB/s  = {:.2}x raw compress ({:.1} MB/s)",
        r.store_mb_s, r.store_vs_raw, r.raw_compress_mb_s
    );
    println!(
        "  load  {:>8.1} MB/s  = {:.2}x raw decompress ({:.1} MB/s), every page verified",
        r.load_mb_s, r.load_vs_raw, r.raw_decompress_mb_s
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
