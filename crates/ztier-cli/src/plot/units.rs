//! Large compression units (`ztier bench --unit-size 4K,16K,64K --json`): for each corpus,
//! memory against a random 4 KiB read's p99, a point per compressor and unit size, each
//! compressor's points joined from its smallest unit to its largest (each allocator's apart,
//! where a run has more than zsmalloc); beside each point the floor of that read (the raw
//! decompressor on the same units), where the run has it.

use std::collections::BTreeMap;

use plotters::prelude::*;
use serde::Deserialize;

use super::{draw_err, framed, Area, DISTINCT};

/// What the panel needs of a unit run.
#[derive(Deserialize)]
pub(super) struct UnitResult {
    corpus: String,
    compressor: String,
    /// Absent from runs before the allocator could be chosen: zsmalloc.
    allocator: Option<String>,
    unit_size: u64,
    mm_stat: MemUsed,
    random_read_p99_us: f64,
    /// Absent from runs before the floor was measured.
    raw_unit_decompress_p99_us: Option<f64>,
}

#[derive(Deserialize)]
struct MemUsed {
    mem_used_total: u64,
}

/// The corpora of `runs`, in their first appearance's order: a panel each.
pub(super) fn corpora(runs: &[UnitResult]) -> Vec<&str> {
    let mut seen: Vec<&str> = Vec::new();
    for r in runs {
        if !seen.contains(&r.corpus.as_str()) {
            seen.push(&r.corpus);
        }
    }
    seen
}

/// One corpus's panel.
pub(super) fn units_panel(area: &Area, runs: &[UnitResult], corpus: &str) -> anyhow::Result<()> {
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut by_compressor: BTreeMap<String, Vec<&UnitResult>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.corpus == corpus) {
        let series = match r.allocator.as_deref() {
            None | Some("zsmalloc") => r.compressor.clone(),
            Some(allocator) => format!("{} on {allocator}", r.compressor),
        };
        by_compressor.entry(series).or_default().push(r);
    }
    for points in by_compressor.values_mut() {
        points.sort_by_key(|r| r.unit_size);
    }
    let mine = || runs.iter().filter(|r| r.corpus == corpus);
    let right = mine()
        .flat_map(|r| {
            [
                r.random_read_p99_us,
                r.raw_unit_decompress_p99_us.unwrap_or(0.0),
            ]
        })
        .filter(|v| v.is_finite())
        .fold(1.0, f64::max)
        * 1.15;
    let top = mine()
        .map(|r| mib(r.mm_stat.mem_used_total))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = framed(
        area,
        format!("{corpus}: memory against a random 4 KiB read's p99, by unit size"),
    )
    .build_cartesian_2d(0f64..right, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("random 4 KiB read, p99 (µs); hollow: the raw decompressor on the same units")
        .y_desc("mem_used_total (MiB)")
        .draw()
        .map_err(draw_err)?;
    for (k, (compressor, points)) in by_compressor.iter().enumerate() {
        let color = DISTINCT[k % DISTINCT.len()];
        let at = |r: &UnitResult| (r.random_read_p99_us, mib(r.mm_stat.mem_used_total));
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|r| at(r)),
                color.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(compressor.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|r| {
                EmptyElement::at(at(r))
                    + Circle::new((0, 0), 5, color.filled())
                    + Text::new(
                        format!("{}K", r.unit_size >> 10),
                        (7, -14),
                        ("sans-serif", 13),
                    )
            }))
            .map_err(draw_err)?;
        chart
            .draw_series(points.iter().filter_map(|r| {
                let floor = r.raw_unit_decompress_p99_us?;
                Some(Circle::new(
                    (floor, mib(r.mm_stat.mem_used_total)),
                    5,
                    color.stroke_width(1),
                ))
            }))
            .map_err(draw_err)?;
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
