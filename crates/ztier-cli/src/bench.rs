//! `ztier bench`: replays real memory through a zram device and reports the kernel's figures.
//!
//! Per corpus × allocator × compressor: the raw compressor's speed on the pages, then the
//! device's store (write every page), load (read every page back, verified byte for byte),
//! optionally the discard of every odd page, and compaction; `mm_stat` after each step, and
//! the kernel's own figures beside them when `NAME.truth.json` sits next to the corpus.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use ztier_compress::{worst_case_len, Algorithm};
use ztier_corpus::Corpus;
use ztier_zram::{Device, MmStat};

use crate::classes::PoolLayoutArgs;
use crate::pools::{AllocatorChoice, AllocatorKind};

/// Pages a thread takes at a time (1 MiB at 4 KiB pages, as `dd bs=1M`).
const BATCH_PAGES: usize = 256;

#[derive(Args, Debug)]
pub struct BenchArgs {
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
}

/// One run's results, as `--json` prints them.
#[derive(Serialize)]
pub struct RunReport {
    pub corpus: String,
    pub pages: u64,
    pub page_size: usize,
    pub allocator: &'static str,
    pub compressor: String,
    pub chain_size: usize,
    pub threads: u16,
    pub mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_discard: Option<MmStat>,
    pub mm_stat_after_compact: MmStat,
    pub store_mb_s: f64,
    pub load_mb_s: f64,
    pub raw_compress_mb_s: f64,
    pub raw_decompress_mb_s: f64,
    pub store_vs_raw: f64,
    pub load_vs_raw: f64,
    pub rss_bytes: u64,
    pub verified: bool,
    /// The allocator's table after the write, with `--stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_stats: Option<ztier_pool::PoolStats>,
    /// The kernel's figures for the same corpus and algorithm, when a truth file has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelFigures>,
}

#[derive(Serialize, Clone)]
pub struct KernelFigures {
    pub release: String,
    pub mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_discard: Option<MmStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_compact: Option<MmStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_mb_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_mb_s: Option<f64>,
}

/// The bundled sample: next to the working directory, or in the source tree.
fn default_corpus() -> anyhow::Result<PathBuf> {
    let candidates = [
        PathBuf::from("samples/sample.pages.zst"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"),
    ];
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("no --corpus given and the bundled samples/sample.pages.zst is not here")
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let config = args.layout.config();
    config.validate().map_err(anyhow::Error::msg)?;
    let paths = if args.corpora.is_empty() {
        vec![default_corpus()?]
    } else {
        args.corpora.clone()
    };
    let mut reports = Vec::new();
    for path in &paths {
        let corpus = Corpus::load(path).with_context(|| format!("loading {}", path.display()))?;
        let truth = corpus.truth().context("reading the truth file")?;
        if corpus.bytes().len() < config.page_size {
            bail!(
                "{}: smaller than one {}-byte page",
                path.display(),
                config.page_size
            );
        }
        for &kind in args.allocator.kinds() {
            for alg in &args.compressors {
                for &threads in &args.threads {
                    let kernel = kernel_figures(truth.as_ref(), kind, alg, args, config.page_size);
                    let report = run_one(&corpus, kind, *alg, threads, args, kernel)?;
                    if args.json {
                        println!("{}", serde_json::to_string(&report)?);
                    } else {
                        print_report(&report);
                    }
                    reports.push(report);
                }
            }
        }
    }
    if !args.json && (args.allocator.kinds().len() > 1 || args.threads.len() > 1) {
        crate::pools::print_side_by_side(&reports);
    }
    Ok(())
}

/// The truth file's figures, when they describe this configuration (4 KiB pages, chain 8).
fn kernel_figures(
    truth: Option<&serde_json::Value>,
    kind: AllocatorKind,
    alg: &Algorithm,
    args: &BenchArgs,
    page_size: usize,
) -> Option<KernelFigures> {
    let truth = truth?;
    let chain = truth["kernel_config"]["CONFIG_ZSMALLOC_CHAIN_SIZE"]
        .as_u64()
        .unwrap_or(8);
    // The kernel's figures are zsmalloc's, at 4 KiB pages and the kernel's chain size.
    if kind != AllocatorKind::Zsmalloc
        || page_size != 4096
        || args.layout.chain_size as u64 != chain
        || alg.level.is_some()
    {
        return None;
    }
    let k = truth["zram"].get(alg.kind.name())?;
    let stat = |v: &serde_json::Value| serde_json::from_value::<MmStat>(v.clone()).ok();
    let exp = &k["discard_odd_pages_then_compact"];
    let (after_discard, after_compact) = if args.discard_odd {
        (stat(&exp["after_discard"]), stat(&exp["after_compact"]))
    } else {
        (None, stat(&k["mm_stat_after_compact"]))
    };
    Some(KernelFigures {
        release: truth["kernel"].as_str().unwrap_or("unknown").to_owned(),
        mm_stat: stat(&k["mm_stat"])?,
        mm_stat_after_discard: after_discard,
        mm_stat_after_compact: after_compact,
        write_mb_s: k["write_MBps_median"].as_f64().or(k["write_MBps"].as_f64()),
        read_mb_s: k["read_MBps_median"].as_f64(),
    })
}

/// A progress line on stderr, when stderr is a terminal.
struct Progress {
    label: &'static str,
    total: u64,
    done: AtomicU64,
    enabled: bool,
}

impl Progress {
    fn new(label: &'static str, total: u64) -> Progress {
        Progress {
            label,
            total,
            done: AtomicU64::new(0),
            enabled: std::io::stderr().is_terminal() && total >= 16 * 1024,
        }
    }
    fn add(&self, n: u64) {
        let before = self.done.fetch_add(n, Ordering::Relaxed);
        let step = (self.total / 50).max(1);
        if self.enabled && (before / step) != ((before + n) / step) {
            let pct = (before + n) * 100 / self.total;
            eprint!(
                "\r  {:<8} [{:<50}] {pct:>3}%",
                self.label,
                "#".repeat((pct / 2) as usize)
            );
        }
    }
    fn finish(&self) {
        if self.enabled {
            eprint!("\r{:80}\r", "");
        }
    }
}

/// Runs `f(page_index, page)` over all pages on `threads` threads, in batches handed out
/// round robin (one thread: plain page order); returns the seconds taken.
fn parallel_pages<F>(
    pages: &[&[u8]],
    threads: u16,
    progress: &Progress,
    f: F,
) -> anyhow::Result<f64>
where
    F: Fn(usize, &[u8], &mut Vec<u8>) -> anyhow::Result<()> + Sync,
{
    let threads = threads as usize;
    let start = Instant::now();
    std::thread::scope(|s| -> anyhow::Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || -> anyhow::Result<()> {
                    let mut scratch = Vec::new();
                    let mut batch = t;
                    while batch * BATCH_PAGES < pages.len() {
                        let lo = batch * BATCH_PAGES;
                        let hi = (lo + BATCH_PAGES).min(pages.len());
                        for (i, page) in pages[lo..hi].iter().enumerate() {
                            f(lo + i, page, &mut scratch)?;
                        }
                        progress.add((hi - lo) as u64);
                        batch += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("bench worker panicked")?;
        }
        Ok(())
    })?;
    Ok(start.elapsed().as_secs_f64())
}

fn mb_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

fn run_one(
    corpus: &Corpus,
    kind: AllocatorKind,
    alg: Algorithm,
    threads: u16,
    args: &BenchArgs,
    kernel: Option<KernelFigures>,
) -> anyhow::Result<RunReport> {
    let config = args.layout.config();
    let ps = config.page_size;
    let pages: Vec<&[u8]> = corpus.chunks(ps).collect();
    let bytes = pages.len() * ps;

    // Every phase is timed at least five times and the best pass kept (short corpora more
    // often), so that one disturbed pass on a shared machine does not decide the figures.
    // A phase and its reference (store and the raw compressor, load and the raw
    // decompressor) take turns, so that a disturbance lasting several passes slows both.
    let reps = (64usize << 20).div_ceil(bytes).clamp(5, 10);
    let best_of_pairs = |reference: &mut dyn FnMut() -> anyhow::Result<f64>,
                         phase: &mut dyn FnMut() -> anyhow::Result<f64>|
     -> anyhow::Result<(f64, f64)> {
        let (mut best_ref, mut best_phase) = (f64::INFINITY, f64::INFINITY);
        for _ in 0..reps {
            best_ref = best_ref.min(reference()?);
            best_phase = best_phase.min(phase()?);
        }
        Ok((best_ref, best_phase))
    };
    let total = (pages.len() * reps * 2) as u64;

    // Store, against the raw compressor on the same pages and threads. A fresh device per
    // pass, made before the pass's reference runs, as a device is set up before it is
    // written; the last one goes on.
    let dev = RefCell::new(None);
    let next_dev = RefCell::new(None);
    let progress = Progress::new("store", total);
    let (raw_compress_s, store_s) = best_of_pairs(
        &mut || {
            drop(dev.take());
            *next_dev.borrow_mut() =
                Some(Device::new(bytes as u64, alg, kind.make_pool(&config)?)?);
            parallel_pages(&pages, threads, &progress, |_, page, scratch| {
                thread_local_compressor(alg, |c| {
                    scratch.resize(worst_case_len(ps), 0);
                    c.compress(page, scratch)
                })
                .map(drop)
            })
        },
        &mut || {
            let d = next_dev.take().expect("made with the reference pass");
            let secs = parallel_pages(&pages, threads, &progress, |i, page, _| {
                d.write_page(i as u64, page)
                    .with_context(|| format!("writing page {i}"))
            })?;
            *dev.borrow_mut() = Some(d);
            Ok(secs)
        },
    )?;
    progress.finish();
    let dev = dev.into_inner().expect("at least one pass");
    let mm_stat = dev.mm_stat();
    let rss_bytes = ztier_pool::process_rss_bytes().unwrap_or(0);
    let stats_table = args.stats.then(|| dev.allocator_stats());

    // Load, against the raw decompressor on the same objects.
    let compressed = compress_all(&pages, alg)?;
    let progress = Progress::new("load", total);
    let (raw_decompress_s, load_s) = best_of_pairs(
        &mut || {
            parallel_pages(&pages, threads, &progress, |i, _, scratch| {
                thread_local_compressor(alg, |c| {
                    scratch.resize(ps, 0);
                    c.decompress(&compressed[i], scratch)
                })
                .map(drop)
            })
        },
        &mut || {
            parallel_pages(&pages, threads, &progress, |i, _, scratch| {
                scratch.resize(ps, 0);
                dev.read_page(i as u64, scratch)
                    .with_context(|| format!("reading page {i}"))
            })
        },
    )?;
    progress.finish();
    drop(compressed);

    // Every page read back byte for byte (untimed), now and after compaction.
    let verify = |i: usize, page: &[u8], scratch: &mut Vec<u8>| -> anyhow::Result<()> {
        scratch.resize(ps, 0);
        dev.read_page(i as u64, scratch)
            .with_context(|| format!("reading page {i}"))?;
        if scratch[..] != *page {
            bail!(
                "page {i} of {} read back different from what was written",
                corpus.name
            );
        }
        Ok(())
    };
    let progress = Progress::new("verify", pages.len() as u64);
    parallel_pages(&pages, threads, &progress, verify)?;
    progress.finish();

    let mut mm_stat_after_discard = None;
    if args.discard_odd {
        for i in (1..pages.len()).step_by(2) {
            dev.discard_page(i as u64)?;
        }
        mm_stat_after_discard = Some(dev.mm_stat());
    }
    dev.compact();
    let mm_stat_after_compact = dev.mm_stat();
    // What survived the discard must still read back after compaction moved it.
    for (i, page) in pages.iter().enumerate() {
        if !(args.discard_odd && i % 2 == 1) {
            let mut scratch = Vec::new();
            verify(i, page, &mut scratch)?;
        }
    }

    let (raw_c, raw_d) = (mb_s(bytes, raw_compress_s), mb_s(bytes, raw_decompress_s));
    let (store, load) = (mb_s(bytes, store_s), mb_s(bytes, load_s));
    Ok(RunReport {
        corpus: corpus.name.clone(),
        pages: pages.len() as u64,
        page_size: ps,
        allocator: kind.name(),
        compressor: alg.to_string(),
        chain_size: config.chain_size,
        threads,
        mm_stat,
        mm_stat_after_discard,
        mm_stat_after_compact,
        store_mb_s: round1(store),
        load_mb_s: round1(load),
        raw_compress_mb_s: round1(raw_c),
        raw_decompress_mb_s: round1(raw_d),
        store_vs_raw: round3(store / raw_c),
        load_vs_raw: round3(load / raw_d),
        rss_bytes,
        verified: true,
        allocator_stats: stats_table,
        kernel,
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

thread_local! {
    static STREAM: std::cell::RefCell<Option<(Algorithm, Box<dyn ztier_compress::Compressor>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's stream for `alg`, as the device's streams are per thread.
fn thread_local_compressor<T>(
    alg: Algorithm,
    f: impl FnOnce(&mut dyn ztier_compress::Compressor) -> Result<T, ztier_compress::CompressError>,
) -> anyhow::Result<T> {
    STREAM.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(a, _)| *a != alg) {
            *slot = Some((alg, alg.new_compressor()));
        }
        let (_, c) = slot.as_mut().expect("set above");
        Ok(f(c.as_mut())?)
    })
}

fn compress_all(pages: &[&[u8]], alg: Algorithm) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut c = alg.new_compressor();
    let mut buf = vec![0; worst_case_len(pages.first().map_or(0, |p| p.len()))];
    pages
        .iter()
        .map(|p| {
            let n = c.compress(p, &mut buf)?;
            Ok(buf[..n].to_vec())
        })
        .collect()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn print_report(r: &RunReport) {
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
    println!("  rss {} after the write", mib(r.rss_bytes));
    if let Some(table) = &r.allocator_stats {
        println!("  {} after the write:", r.allocator);
        for line in table.to_string().lines() {
            println!("    {line}");
        }
    }
    if let Some(k) = &r.kernel {
        println!("  the kernel's zram ({}) on the same pages:", k.release);
        println!(
            "    {:<24} {:>14} {:>14} {:>10}",
            "field", "ztier", "kernel", "diff"
        );
        let mut rows = vec![("", mm, &k.mm_stat)];
        if let (Some(z), Some(kd)) = (&r.mm_stat_after_discard, &k.mm_stat_after_discard) {
            rows.push(("after discard: ", z, kd));
        }
        if let Some(kc) = &k.mm_stat_after_compact {
            rows.push(("after compact: ", &r.mm_stat_after_compact, kc));
        }
        let mut equal = true;
        for (prefix, z, kk) in rows {
            for ((name, zv), kv) in MmStat::FIELDS.iter().zip(z.values()).zip(kk.values()) {
                if prefix.is_empty()
                    || zv != kv
                    || ["mem_used_total", "pages_compacted"].contains(name)
                {
                    let diff = zv as i128 - kv as i128;
                    equal &= diff == 0;
                    let field = format!("{prefix}{name}");
                    println!("    {field:<24} {zv:>14} {kv:>14} {diff:>+10}");
                }
            }
        }
        println!(
            "    {}",
            if equal {
                "every field equal to the kernel's"
            } else {
                "DIFFERENT from the kernel's figures"
            }
        );
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
