//! `ztier plot RESULT.json -o FILE.svg` and `ztier bench --plot FILE.svg`: pictures of bench
//! results, drawn with plotters into SVG (which a browser opens). From the `--json` lines of
//! `ztier bench` (zram runs, with the allocator's table when it was kept) and of
//! `ztier bench --trace`, one panel each, stacked:
//! - memory by size class, used and wasted, for each run with an allocator table (zsmalloc's
//!   classes or zblock's block types): what the objects hold and what the pool's pages hold
//!   beyond them;
//! - the distribution of compressed page sizes: objects per size class, a point per class
//!   and a colour per run;
//! - for a sweep (more than one run), `mem_used_total` of each run beside the kernel's where
//!   its figures are known;
//! - for a trace, memory over time: pages held, compressed bytes, the pool, and the bytes the
//!   backing store holds after each epoch.
//!
//! From `ztier bench --unit-size ... --json`, a panel per corpus of memory against a random
//! read's p99 for each unit size and compressor (`units`); from `ztier bench --trace
//! --promotion-target ... --json`, a panel per trace of the pages held on the store against
//! the promotion rate, each fixed idle age and the controller (`far_tier`). From `ztier
//! bench uffd --lookups SECONDS --json`, for each self-sized run its budget, resident pages,
//! throughput and stall share over time, and the savings/slowdown curve of the fixed budgets
//! with the self-sized runs and the oracle on it (`lookups`).
//!
//! And from a host's samples, the lines of `ztier stat --json` taken over time (a host of
//! devices: `while sleep 1; do ztier stat --json --socket S; done >> host.jsonl`), a panel of
//! each device's `mem_used_total`, the host's sum and its target over time.

mod far_tier;
mod host;
mod lookups;
mod units;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::Deserialize;
use ztier_zram::MmStat;

#[derive(Args, Debug)]
pub struct PlotArgs {
    /// A `ztier bench --json` output (one run a line; `--stats` for the size-class panels),
    /// or a host's `ztier stat --json` lines taken over time.
    pub result: PathBuf,
    /// The SVG to write.
    #[arg(short = 'o', long, value_name = "FILE.svg")]
    pub output: PathBuf,
}

/// What the panels need of a zram run.
#[derive(Deserialize)]
struct ZramResult {
    corpus: String,
    allocator: String,
    compressor: String,
    chain_size: usize,
    threads: u16,
    mm_stat: MmStat,
    allocator_stats: Option<AllocatorTable>,
    kernel: Option<KernelFigures>,
}

#[derive(Deserialize)]
struct KernelFigures {
    mm_stat: MmStat,
}

#[derive(Deserialize)]
#[serde(tag = "allocator", content = "rows", rename_all = "lowercase")]
enum AllocatorTable {
    Zsmalloc(Vec<ClassRow>),
    Zblock(Vec<BlockRow>),
}

#[derive(Deserialize)]
struct ClassRow {
    size: u64,
    obj_used: u64,
    pages_used: u64,
}

#[derive(Deserialize)]
struct BlockRow {
    slot_size: u64,
    pages_per_block: u64,
    blocks: u64,
    used_slots: u64,
}

/// What the panels need of a trace replay.
#[derive(Deserialize)]
struct TraceResult {
    corpus: String,
    allocator: String,
    compressor: String,
    epochs: Vec<TraceEpoch>,
}

#[derive(Deserialize)]
struct TraceEpoch {
    seconds: f64,
    mm_stat: MmStat,
    bd_stat: Option<StoreCount>,
}

#[derive(Deserialize)]
struct StoreCount {
    /// Bytes the held pages take on the store (older results lack it: then their count of
    /// pages, uncompressed, is drawn and the legend says so).
    bytes_stored: Option<u64>,
    bd_count: u64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum BenchResult {
    Trace(TraceResult),
    Zram(ZramResult),
    Host(host::HostSample),
    Units(units::UnitResult),
    FarTier(far_tier::FarTierResult),
    Lookups(lookups::LookupJudgement),
}

/// One size class's bytes: (class size, objects, bytes the objects take, bytes of pages).
struct ClassBytes {
    size: u64,
    objects: u64,
    used: u64,
    pages: u64,
}

impl AllocatorTable {
    /// Each class's bytes; a table whose figures overflow 64 bits is refused (it came from
    /// a file: nothing in it is trusted).
    fn classes(&self) -> anyhow::Result<Vec<ClassBytes>> {
        let product = |a: u64, b: u64, c: u64| {
            a.checked_mul(b)
                .and_then(|x| x.checked_mul(c))
                .context("an allocator table's figures overflow 64 bits: not a bench result")
        };
        match self {
            AllocatorTable::Zsmalloc(rows) => rows
                .iter()
                .filter(|r| r.pages_used > 0)
                .map(|r| {
                    Ok(ClassBytes {
                        size: r.size,
                        objects: r.obj_used,
                        used: product(r.obj_used, r.size, 1)?,
                        pages: product(r.pages_used, 4096, 1)?,
                    })
                })
                .collect(),
            AllocatorTable::Zblock(rows) => rows
                .iter()
                .filter(|r| r.blocks > 0)
                .map(|r| {
                    Ok(ClassBytes {
                        size: r.slot_size,
                        objects: r.used_slots,
                        used: product(r.used_slots, r.slot_size, 1)?,
                        pages: product(r.blocks, r.pages_per_block, 4096)?,
                    })
                })
                .collect(),
        }
    }
}

pub fn run(args: &PlotArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.result).with_context(|| {
        format!(
            "reading {} (give the file `ztier bench --json > FILE` wrote)",
            args.result.display()
        )
    })?;
    let mut values = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not JSON", args.result.display(), n + 1))?;
        values.push(value);
    }
    render(&values, &args.output)?;
    println!("{}", args.output.display());
    Ok(())
}

/// Draws the panels for `results` (the `--json` objects of bench runs) into an SVG file.
pub fn render(results: &[serde_json::Value], output: &Path) -> anyhow::Result<()> {
    let mut zram = Vec::new();
    let mut traces = Vec::new();
    let mut host = Vec::new();
    let mut units = Vec::new();
    let mut far = Vec::new();
    let mut lookups = Vec::new();
    for (n, value) in results.iter().enumerate() {
        match serde_json::from_value::<BenchResult>(value.clone()) {
            Ok(BenchResult::Zram(r)) => zram.push(r),
            Ok(BenchResult::Trace(t)) => traces.push(t),
            Ok(BenchResult::Host(h)) => host.push(h),
            Ok(BenchResult::Units(u)) => units.push(u),
            Ok(BenchResult::FarTier(f)) => far.push(f),
            Ok(BenchResult::Lookups(l)) => {
                l.check()?;
                lookups.push(l);
            }
            // A lookups judgement that does not parse: serde's reason, which names the field.
            Err(_) if value.get("self_sized").is_some() => {
                let why = serde_json::from_value::<lookups::LookupJudgement>(value.clone())
                    .err()
                    .map_or_else(|| "no variant matched".to_string(), |e| e.to_string());
                bail!(
                    "result {}: a lookups judgement of `ztier bench uffd --lookups --json` that \
                     cannot be read: {why}",
                    n + 1
                )
            }
            Err(_) => bail!(
                "result {}: not a zram run, a trace replay, a unit-size run, a far tier \
                 verdict or a lookups judgement of `ztier bench --json`, nor a host's `ztier \
                 stat --json` (zswap runs have no pictures yet)",
                n + 1
            ),
        }
    }
    let mut tables: Vec<(&ZramResult, Vec<ClassBytes>)> = Vec::new();
    for r in &zram {
        if let Some(t) = &r.allocator_stats {
            let classes = t.classes()?;
            // A panel's sums too: refused rather than wrapped.
            for sum in [
                classes.iter().try_fold(0u64, |a, c| a.checked_add(c.used)),
                classes.iter().try_fold(0u64, |a, c| a.checked_add(c.pages)),
            ] {
                if sum.is_none() {
                    bail!("an allocator table's figures overflow 64 bits: not a bench result");
                }
            }
            if !classes.is_empty() {
                tables.push((r, classes));
            }
        }
    }
    let panels = tables.len()
        + usize::from(!tables.is_empty())
        + usize::from(zram.len() > 1)
        + traces.len()
        + usize::from(!host.is_empty())
        + units::corpora(&units).len()
        + far.len()
        + lookups.iter().map(|l| l.panels()).sum::<usize>();
    if panels == 0 {
        bail!(
            "nothing to draw: no allocator table (run the bench with --stats or --plot), no \
             sweep of several runs, no trace, no host's samples, no unit sizes, no far tier \
             verdict, no lookups judgement"
        );
    }
    let root = SVGBackend::new(output, (1100, 380 * panels as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_err)?;
    let areas = root.split_evenly((panels, 1));
    let mut areas = areas.iter();
    for (r, classes) in &tables {
        size_class_panel(areas.next().expect("counted"), r, classes)?;
    }
    if !tables.is_empty() {
        distribution_panel(areas.next().expect("counted"), &tables)?;
    }
    if zram.len() > 1 {
        sweep_panel(areas.next().expect("counted"), &zram)?;
    }
    for t in &traces {
        trace_panel(areas.next().expect("counted"), t)?;
    }
    if !host.is_empty() {
        host::host_panel(areas.next().expect("counted"), &host)?;
    }
    for corpus in units::corpora(&units) {
        units::units_panel(areas.next().expect("counted"), &units, corpus)?;
    }
    for v in &far {
        far_tier::far_tier_panel(areas.next().expect("counted"), v)?;
    }
    for l in &lookups {
        lookups::draw(&mut areas, l)?;
    }
    root.present().map_err(draw_err)?;
    Ok(())
}

/// A chart on `area` in the house's frame: `caption` over it, the same margin and room for
/// the axes' labels in every picture.
fn framed<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    caption: impl AsRef<str>,
) -> ChartBuilder<'a, 'static, DB> {
    let mut chart = ChartBuilder::on(area);
    chart
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70);
    chart
}

fn draw_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing the SVG: {e:?}")
}

/// Colours told apart at a glance (Tableau's ten, then two more), for the runs of one panel.
const DISTINCT: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(0, 0, 128),
];

/// A sweep run's short name: compressor, allocator, and the chain size only for zsmalloc
/// (zblock has none: the table shows `-`).
fn run_name(r: &ZramResult) -> String {
    if r.allocator == "zsmalloc" {
        format!("{} {} c{}", r.compressor, r.allocator, r.chain_size)
    } else {
        format!("{} {}", r.compressor, r.allocator)
    }
}

fn label(r: &ZramResult) -> String {
    let chain = if r.allocator == "zsmalloc" {
        format!(" chain {}", r.chain_size)
    } else {
        String::new()
    };
    let threads = if r.threads > 1 {
        format!(" {} threads", r.threads)
    } else {
        String::new()
    };
    format!(
        "{} {} {}{chain}{threads}",
        r.corpus, r.compressor, r.allocator
    )
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Stacked bars per class: the objects' bytes, and the rest of the class's pages (wasted).
fn size_class_panel(area: &Area, r: &ZramResult, classes: &[ClassBytes]) -> anyhow::Result<()> {
    let kib = |b: u64| b as f64 / 1024.0;
    let top = classes.iter().map(|c| kib(c.pages)).fold(1.0, f64::max) * 1.1;
    let max_size = classes.iter().map(|c| c.size).max().unwrap_or(4096) as f64 + 64.0;
    let used: u64 = classes.iter().map(|c| c.used).sum();
    let pages: u64 = classes.iter().map(|c| c.pages).sum();
    let mut chart = framed(
        area,
        format!(
            "memory by size class, {}: {:.1} MiB in pages, {:.1} MiB wasted ({:.1} %)",
            label(r),
            pages as f64 / 1048576.0,
            (pages - used.min(pages)) as f64 / 1048576.0,
            100.0 * (pages - used.min(pages)) as f64 / pages.max(1) as f64
        ),
    )
    .build_cartesian_2d(0f64..max_size, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("size class (bytes an object takes)")
        .y_desc("KiB")
        .draw()
        .map_err(draw_err)?;
    // Each bar as wide as the gap to the class before it (zsmalloc's classes are 16 bytes
    // apart, the huge class and zblock's types wider).
    let mut bars = Vec::new();
    let mut before = 0f64;
    for c in classes {
        let x1 = c.size as f64;
        let x0 = before.max(x1 - 64.0);
        before = x1;
        bars.push((x0, x1, kib(c.used.min(c.pages)), kib(c.pages)));
    }
    chart
        .draw_series(
            bars.iter().map(|&(x0, x1, u, _)| {
                Rectangle::new([(x0, 0.0), (x1, u)], BLUE.mix(0.8).filled())
            }),
        )
        .map_err(draw_err)?
        .label("objects (used)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], BLUE.mix(0.8).filled()));
    chart
        .draw_series(
            bars.iter()
                .map(|&(x0, x1, u, p)| Rectangle::new([(x0, u), (x1, p)], RED.mix(0.6).filled())),
        )
        .map_err(draw_err)?
        .label("rest of the pages (wasted)")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RED.mix(0.6).filled()));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Objects per size class, one line per run: the distribution of compressed page sizes.
fn distribution_panel(
    area: &Area,
    tables: &[(&ZramResult, Vec<ClassBytes>)],
) -> anyhow::Result<()> {
    let top = tables
        .iter()
        .flat_map(|(_, c)| c.iter().map(|c| c.objects))
        .max()
        .unwrap_or(1) as f64
        * 1.1;
    // As wide as the widest class of any run (zblock's largest slots are past 4096 bytes).
    let right = tables
        .iter()
        .flat_map(|(_, c)| c.iter().map(|c| c.size))
        .max()
        .unwrap_or(4096) as f64
        + 64.0;
    let mut chart = framed(
        area,
        "distribution of compressed page sizes (objects per size class)",
    )
    .build_cartesian_2d(0f64..right, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("compressed size, by size class (bytes)")
        .y_desc("objects (compressed pages)")
        .draw()
        .map_err(draw_err)?;
    // A point per class (the classes are far apart in places: a line between two would
    // show sizes no class has), a colour of its own per run.
    for (i, (r, classes)) in tables.iter().enumerate() {
        let color = DISTINCT[i % DISTINCT.len()];
        let filled = (i / DISTINCT.len()).is_multiple_of(2);
        chart
            .draw_series(classes.iter().map(move |c| {
                let style = if filled {
                    color.filled()
                } else {
                    color.stroke_width(1)
                };
                Circle::new((c.size as f64, c.objects as f64), 3, style)
            }))
            .map_err(draw_err)?
            .label(label(r))
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// `mem_used_total` per run of a sweep, the kernel's beside it where known.
fn sweep_panel(area: &Area, runs: &[ZramResult]) -> anyhow::Result<()> {
    let mib = |b: u64| b as f64 / 1048576.0;
    let top = runs
        .iter()
        .flat_map(|r| {
            [
                Some(r.mm_stat.mem_used_total),
                r.kernel.as_ref().map(|k| k.mm_stat.mem_used_total),
            ]
        })
        .flatten()
        .map(mib)
        .fold(1.0, f64::max)
        * 1.4;
    let n = runs.len();
    // The key is in the caption: a legend box would hide the runs' labels at the top.
    let any_kernel = runs.iter().any(|r| r.kernel.is_some());
    let mut chart = framed(
        area,
        if any_kernel {
            "sweep: mem_used_total of each run, ztier in blue, the kernel's in grey beside it \
                 where known; ratio above"
        } else {
            "sweep: mem_used_total of each run (no kernel figures for these runs); ratio above"
        },
    )
    .build_cartesian_2d(0f64..n as f64, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("MiB")
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(runs.iter().enumerate().map(|(i, r)| {
            let x = i as f64;
            Rectangle::new(
                [(x + 0.1, 0.0), (x + 0.5, mib(r.mm_stat.mem_used_total))],
                BLUE.mix(0.8).filled(),
            )
        }))
        .map_err(draw_err)?;
    chart
        .draw_series(runs.iter().enumerate().filter_map(|(i, r)| {
            let k = r.kernel.as_ref()?;
            let x = i as f64;
            Some(Rectangle::new(
                [(x + 0.5, 0.0), (x + 0.9, mib(k.mm_stat.mem_used_total))],
                BLACK.mix(0.5).filled(),
            ))
        }))
        .map_err(draw_err)?;
    // Each run named at the top, its ratio (orig / mem_used_total) just above its bars (the
    // text's bottom on the bar's top plus a margin, so it never overlaps the bar).
    let above =
        TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Left, VPos::Bottom));
    for (i, r) in runs.iter().enumerate() {
        let x = i as f64 + 0.1;
        let bar = r
            .kernel
            .as_ref()
            .map_or(0, |k| k.mm_stat.mem_used_total)
            .max(r.mm_stat.mem_used_total);
        chart
            .draw_series(std::iter::once(Text::new(
                format!(
                    "{:.2}x",
                    r.mm_stat.orig_data_size as f64 / r.mm_stat.mem_used_total.max(1) as f64
                ),
                (x, mib(bar) + top * 0.02),
                above.clone(),
            )))
            .map_err(draw_err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                run_name(r),
                (x, top * 0.97 - (i % 2) as f64 * top * 0.06),
                ("sans-serif", 11),
            )))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// Memory over time for a trace: after every epoch.
fn trace_panel(area: &Area, t: &TraceResult) -> anyhow::Result<()> {
    fn mib(bytes: u64) -> f64 {
        bytes as f64 / 1048576.0
    }
    type EpochValue = fn(&TraceEpoch) -> f64;
    let series: [(&str, RGBColor, EpochValue); 4] = [
        ("pages held (orig_data_size)", GREEN, |e| {
            mib(e.mm_stat.orig_data_size)
        }),
        ("compr_data_size", BLUE, |e| mib(e.mm_stat.compr_data_size)),
        ("mem_used_total (the pool)", RED, |e| {
            mib(e.mm_stat.mem_used_total)
        }),
        ("on the backing store (bytes stored)", MAGENTA, |e| {
            mib(e.bd_stat.as_ref().map_or(0, |b| {
                b.bytes_stored.unwrap_or(b.bd_count.saturating_mul(4096))
            }))
        }),
    ];
    let store_as_pages = t
        .epochs
        .iter()
        .any(|e| e.bd_stat.as_ref().is_some_and(|b| b.bytes_stored.is_none()));
    let top = t
        .epochs
        .iter()
        .flat_map(|e| series.iter().map(move |(_, _, f)| f(e)))
        .fold(1.0, f64::max)
        * 1.1;
    let end = t.epochs.last().map_or(1.0, |e| e.seconds).max(1.0);
    let mut chart = framed(
        area,
        format!(
            "memory over time, trace of {} through zram ({} on {})",
            t.corpus, t.compressor, t.allocator
        ),
    )
    .build_cartesian_2d(0f64..end, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds into the capture")
        .y_desc("MiB")
        .draw()
        .map_err(draw_err)?;
    for (name, color, value) in &series {
        let color = *color;
        let name = if store_as_pages && name.starts_with("on the backing store") {
            "on the backing store (its pages' uncompressed size)"
        } else {
            name
        };
        chart
            .draw_series(LineSeries::new(
                t.epochs.iter().map(|e| (e.seconds, value(e))),
                color.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}
