//! A budget that sizes itself, judged (`ztier bench uffd --lookups SECONDS --json`): for each
//! self-sized run, two panels over its measured seconds (its budget and resident pages with
//! its throughput against the baseline's, the every-page runs' mean; its stall share against
//! its target), the
//! oracle's fixed run drawn lightly beside it; then the savings/slowdown curve: each fixed
//! budget a point, joined from every page down, the self-sized runs marked apart, the
//! oracle ringed and the slowdown target a vertical line.
//!
//! Throughput is drawn as the judgement read it: in pace (lookups per reference fold, the
//! CPU's speed divided out) where the result has it, for every run and the baseline; else (a
//! result from before the reference) in lookups a second.
//!
//! Invariants: a judgement is checked before anything is drawn ([`LookupJudgement::check`]):
//! its first run has every page, its oracle is a fixed run and its self-sized verdicts name
//! self-sized runs, all within `runs`; the baseline's lookups a second and memory are finite
//! and at least 1, every figure finite; where it has a pace, the baseline's is over 0, every
//! run has one, and each run's share of the baseline's is finite. A file that breaks any of
//! these is refused with the reason, never drawn half (nor drawn on an axis without end).

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Deserialize;

use super::{draw_err, framed, Area, DISTINCT};

/// What the panels need of a judgement (`ztier_replay::uffd_lookups::LookupJudgement`).
#[derive(Deserialize)]
pub(super) struct LookupJudgement {
    corpus: String,
    pages: u64,
    runs: Vec<LookupRun>,
    /// The slowdown target (0.01: 1 %).
    slowdown: f64,
    oracle: Option<usize>,
    self_sized: Vec<SelfSized>,
    /// The mean lookups a second of the every-page runs made first and last, where the
    /// result has it; else the first run's are taken. What slowdowns are against in a result
    /// without pace.
    baseline_lookups_per_s: Option<f64>,
    /// The same in pace (lookups per reference fold), where the result has it: then what
    /// slowdowns are against.
    baseline_lookups_per_reference_fold: Option<f64>,
    /// Seconds a phase lasts and the warm-up before the measured seconds, where the result
    /// has them: then each phase's start is drawn on the panels over time.
    phase_seconds: Option<u64>,
    warmup_seconds: Option<u64>,
}

#[derive(Deserialize)]
struct LookupRun {
    budget: Budget,
    lookups_per_s: f64,
    lookups_per_reference_fold: Option<f64>,
    mean_memory_bytes: f64,
    seconds: Vec<Second>,
    /// The controller's figures, a self-sized run's.
    autosize: Option<Controller>,
}

#[derive(Deserialize)]
struct Controller {
    cap_pages: u64,
}

/// How a run's budget was set: serde's external tagging, as the bench writes it.
#[derive(Deserialize, Clone, Copy, PartialEq)]
enum Budget {
    Unlimited,
    Fixed(f64),
    Autosized(f64),
}

#[derive(Deserialize)]
struct Second {
    at: i64,
    lookups: u64,
    resident_pages: u64,
    budget_pages: u64,
    stall_ppm: u64,
    /// The CPU's speed that second (none or 0: not timed), where the result has it.
    reference_folds_per_s: Option<f64>,
}

#[derive(Deserialize)]
struct SelfSized {
    run: usize,
}

/// A run's name on the panels and in the legends.
fn name(budget: Budget) -> String {
    match budget {
        Budget::Unlimited => "every page".to_string(),
        Budget::Fixed(share) => format!("fixed {}", percent(share)),
        Budget::Autosized(target) => format!("self-sized, stall target {}", percent(target)),
    }
}

/// A share as a percentage, with as many decimals as it needs (0.97: "97 %", 0.001: "0.1 %").
fn percent(share: f64) -> String {
    let p = share * 100.0;
    let text = format!("{p:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text} %")
}

impl LookupJudgement {
    /// Refuses a judgement the panels cannot stand on, saying what is wrong with it.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        let refuse = |why: String| -> anyhow::Result<()> {
            anyhow::bail!(
                "{}: {why}: not a judgement of `ztier bench uffd --lookups --json`",
                self.corpus
            )
        };
        let Some(base) = self.runs.first() else {
            return refuse("no runs".to_string());
        };
        if base.budget != Budget::Unlimited {
            return refuse("its first run does not keep every page".to_string());
        }
        // Every other run is drawn against these: a real run has thousands of lookups a
        // second and megabytes.
        let measured = |v: f64| v.is_finite() && v >= 1.0;
        if !measured(base.lookups_per_s)
            || !measured(self.base_rate())
            || !measured(base.mean_memory_bytes)
        {
            return refuse(format!(
                "the every-page run's throughput ({}, the baseline's {}) or memory ({}) is not \
                 a measured figure",
                base.lookups_per_s,
                self.base_rate(),
                base.mean_memory_bytes
            ));
        }
        if let Some(base_pace) = self.baseline_lookups_per_reference_fold {
            if !(base_pace.is_finite() && base_pace > 0.0) {
                return refuse(format!(
                    "the baseline's pace ({base_pace}) is not a measured figure"
                ));
            }
            // A pace far past the baseline's would put a run at an infinite share of it,
            // and the curve's axis with it.
            if let Some(r) = self.runs.iter().find(|r| {
                !(r.lookups_per_reference_fold
                    .is_some_and(|pace| pace.is_finite() && pace >= 0.0)
                    && self.run_pct(r).is_finite())
            }) {
                return refuse(format!(
                    "run {:?} has no pace, or one out of range, beside the baseline's",
                    name(r.budget)
                ));
            }
        }
        for r in &self.runs {
            let share = match r.budget {
                Budget::Unlimited => 1.0,
                Budget::Fixed(s) | Budget::Autosized(s) => s,
            };
            if !(r.lookups_per_s.is_finite()
                && r.lookups_per_s >= 0.0
                && r.mean_memory_bytes.is_finite()
                && r.mean_memory_bytes >= 0.0
                && share.is_finite()
                && share > 0.0
                && share <= 1.0)
            {
                return refuse(format!(
                    "run {:?} has a throughput, memory or share out of range",
                    name(r.budget)
                ));
            }
        }
        if !(self.slowdown.is_finite() && (0.0..1.0).contains(&self.slowdown)) {
            return refuse(format!(
                "a slowdown target of {} is not a share",
                self.slowdown
            ));
        }
        let n = self.runs.len();
        if let Some(o) = self.oracle {
            if !matches!(self.runs.get(o).map(|r| r.budget), Some(Budget::Fixed(_))) {
                return refuse(format!("its oracle, run {o} of {n}, is not a fixed budget"));
            }
        }
        for s in &self.self_sized {
            if !matches!(
                self.runs.get(s.run).map(|r| r.budget),
                Some(Budget::Autosized(_))
            ) {
                return refuse(format!(
                    "a self-sized verdict names run {} of {n}, not a self-sized run",
                    s.run
                ));
            }
        }
        Ok(())
    }

    /// How many panels [`draw`] draws: two for each self-sized run, and the curve.
    pub(super) fn panels(&self) -> usize {
        2 * self.self_sized.len() + 1
    }

    fn base(&self) -> &LookupRun {
        &self.runs[0]
    }

    /// The baseline's lookups a second (what a result without pace sets every run against).
    fn base_rate(&self) -> f64 {
        self.baseline_lookups_per_s
            .unwrap_or_else(|| self.base().lookups_per_s)
    }

    /// Whether throughput is read in pace (the machine's speed divided out): the result has
    /// the baseline's (and then, checked, every run's).
    fn paced(&self) -> bool {
        self.baseline_lookups_per_reference_fold.is_some()
    }

    /// What the throughput axes say they show.
    fn throughput_name(&self) -> &'static str {
        match self.paced() {
            true => "pace (lookups per reference fold)",
            false => "lookups/s",
        }
    }

    /// A run's throughput as a percentage of the baseline's.
    fn run_pct(&self, r: &LookupRun) -> f64 {
        match (
            self.baseline_lookups_per_reference_fold,
            r.lookups_per_reference_fold,
        ) {
            (Some(base), Some(pace)) => pace / base * 100.0,
            _ => r.lookups_per_s / self.base_rate() * 100.0,
        }
    }

    /// A second's throughput as a percentage of the baseline's; `None` for a second a paced
    /// result did not time the machine in.
    fn second_pct(&self, s: &Second) -> Option<f64> {
        match self.baseline_lookups_per_reference_fold {
            Some(base) => match s.reference_folds_per_s {
                Some(folds) if folds > 0.0 => Some(s.lookups as f64 / folds / base * 100.0),
                _ => None,
            },
            None => Some(s.lookups as f64 / self.base_rate() * 100.0),
        }
    }

    /// Where each phase starts, in measured seconds, within `[0, end]`, if the result says.
    fn phase_starts(&self, end: f64) -> Vec<f64> {
        let (Some(phase), Some(warmup)) = (self.phase_seconds, self.warmup_seconds) else {
            return Vec::new();
        };
        if phase == 0 {
            return Vec::new();
        }
        (1..)
            .map(|k: u64| k.saturating_mul(phase) as f64 - warmup as f64)
            .skip_while(|&at| at <= 0.0)
            .take_while(|&at| at < end)
            .collect()
    }
}

/// The panels of one judgement, each in the next of `areas`, which holds at least
/// [`LookupJudgement::panels`] of them. The judgement was checked.
pub(super) fn draw<'a, 'b: 'a>(
    areas: &mut impl Iterator<Item = &'a Area<'b>>,
    j: &LookupJudgement,
) -> anyhow::Result<()> {
    for s in &j.self_sized {
        let run = &j.runs[s.run];
        pages_panel(areas.next().expect("counted"), j, run)?;
        stall_panel(areas.next().expect("counted"), j, run)?;
    }
    curve_panel(areas.next().expect("counted"), j)
}

const BUDGET: RGBColor = RGBColor(31, 119, 180);
const RESIDENT: RGBColor = RGBColor(44, 160, 44);
const THROUGHPUT: RGBColor = RGBColor(255, 127, 14);
const STALL: RGBColor = RGBColor(214, 39, 40);
const LIGHT: RGBColor = RGBColor(150, 150, 150);

/// The measured seconds' span of `runs`, at least a second.
fn span<'r>(runs: impl Iterator<Item = &'r LookupRun>) -> (f64, f64) {
    let (mut start, mut end) = (f64::MAX, f64::MIN);
    for s in runs.flat_map(|r| &r.seconds) {
        start = start.min(s.at as f64);
        end = end.max(s.at as f64);
    }
    if start > end {
        (0.0, 1.0)
    } else {
        (start, end.max(start + 1.0))
    }
}

/// Dashed vertical lines at each phase's start, from 0 to `top`.
fn phase_lines<DB: DrawingBackend>(
    chart: &mut ChartContext<DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    starts: &[f64],
    top: f64,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    for (k, &at) in starts.iter().enumerate() {
        let series = chart
            .draw_series(DashedLineSeries::new(
                [(at, 0.0), (at, top)],
                3,
                5,
                BLACK.mix(0.4).stroke_width(1),
            ))
            .map_err(draw_err)?;
        if k == 0 {
            series.label("a phase begins").legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], BLACK.mix(0.4).stroke_width(1))
            });
        }
    }
    Ok(())
}

/// A self-sized run's budget and resident pages over time (left axis) and its throughput
/// against the baseline's (right axis), the oracle's resident pages and throughput
/// lightly beside them.
fn pages_panel(area: &Area, j: &LookupJudgement, run: &LookupRun) -> anyhow::Result<()> {
    let oracle = j.oracle.map(|o| &j.runs[o]);
    let (start, end) = span(std::iter::once(run).chain(oracle));
    let (cap, cap_label) = match &run.autosize {
        Some(c) if c.cap_pages == j.pages => (c.cap_pages, "the cap: every page"),
        Some(c) => (c.cap_pages, "the cap"),
        None => (j.pages, "every page"),
    };
    let top = run
        .seconds
        .iter()
        .chain(oracle.iter().flat_map(|o| &o.seconds))
        .flat_map(|s| [s.budget_pages, s.resident_pages])
        .chain([j.pages, cap])
        .max()
        .unwrap_or(1) as f64
        * 1.6;
    let pct_top = run
        .seconds
        .iter()
        .chain(oracle.iter().flat_map(|o| &o.seconds))
        .filter_map(|s| j.second_pct(s))
        .filter(|v| v.is_finite())
        .fold(100.0, f64::max)
        * 1.6;
    let mut chart = framed(
        area,
        format!(
            "{}: {}, budget and resident pages over time, throughput against every page",
            j.corpus,
            name(run.budget)
        ),
    )
    .right_y_label_area_size(60)
    .build_cartesian_2d(start..end, 0f64..top)
    .map_err(draw_err)?
    .set_secondary_coord(start..end, 0f64..pct_top);
    chart
        .configure_mesh()
        .x_desc("seconds measured (after the warm-up)")
        .y_desc("pages")
        .draw()
        .map_err(draw_err)?;
    chart
        .configure_secondary_axes()
        .y_desc(format!("{}, % of every page's", j.throughput_name()))
        .draw()
        .map_err(draw_err)?;
    let at = |s: &Second| s.at as f64;
    chart
        .draw_series(LineSeries::new(
            run.seconds.iter().map(|s| (at(s), s.budget_pages as f64)),
            BUDGET.stroke_width(3),
        ))
        .map_err(draw_err)?
        .label("budget (pages)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BUDGET.stroke_width(3)));
    chart
        .draw_series(LineSeries::new(
            run.seconds.iter().map(|s| (at(s), s.resident_pages as f64)),
            RESIDENT.stroke_width(2),
        ))
        .map_err(draw_err)?
        .label("resident pages")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RESIDENT.stroke_width(2)));
    chart
        .draw_series(DashedLineSeries::new(
            [(start, cap as f64), (end, cap as f64)],
            2,
            3,
            BLACK.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label(cap_label)
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    if let Some(o) = oracle {
        chart
            .draw_series(DashedLineSeries::new(
                o.seconds.iter().map(|s| (at(s), s.resident_pages as f64)),
                6,
                4,
                LIGHT.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("oracle ({}): resident pages", name(o.budget)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], LIGHT.stroke_width(2)));
    }
    phase_lines(&mut chart, &j.phase_starts(end), top)?;
    chart
        .draw_secondary_series(LineSeries::new(
            run.seconds
                .iter()
                .filter_map(|s| Some((at(s), j.second_pct(s)?))),
            THROUGHPUT.stroke_width(2),
        ))
        .map_err(draw_err)?
        .label(format!(
            "{}, % of every page's (right)",
            j.throughput_name()
        ))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], THROUGHPUT.stroke_width(2)));
    if let Some(o) = oracle {
        chart
            .draw_secondary_series(LineSeries::new(
                o.seconds
                    .iter()
                    .filter_map(|s| Some((at(s), j.second_pct(s)?))),
                THROUGHPUT.mix(0.35).stroke_width(1),
            ))
            .map_err(draw_err)?
            .label(format!("oracle: {}, % (right)", j.throughput_name()))
            .legend(|(x, y)| {
                PathElement::new(
                    vec![(x, y), (x + 16, y)],
                    THROUGHPUT.mix(0.35).stroke_width(1),
                )
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// A self-sized run's stall share each second against its target, the oracle's lightly.
fn stall_panel(area: &Area, j: &LookupJudgement, run: &LookupRun) -> anyhow::Result<()> {
    let oracle = j.oracle.map(|o| &j.runs[o]);
    let (start, end) = span(std::iter::once(run).chain(oracle));
    let target = match run.budget {
        Budget::Autosized(t) => t * 100.0,
        Budget::Unlimited | Budget::Fixed(_) => 0.0,
    };
    let stall = |s: &Second| s.stall_ppm as f64 / 1e4;
    let top = run
        .seconds
        .iter()
        .chain(oracle.iter().flat_map(|o| &o.seconds))
        .map(stall)
        .fold(target.max(0.01), f64::max)
        * 1.5;
    let mut chart = framed(
        area,
        format!(
            "{}: {}, the share of each second a lookup waited on the region",
            j.corpus,
            name(run.budget)
        ),
    )
    .right_y_label_area_size(60)
    .build_cartesian_2d(start..end, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds measured (after the warm-up)")
        .y_desc("stall, % of the second")
        .draw()
        .map_err(draw_err)?;
    let at = |s: &Second| s.at as f64;
    chart
        .draw_series(LineSeries::new(
            run.seconds.iter().map(|s| (at(s), stall(s))),
            STALL.stroke_width(2),
        ))
        .map_err(draw_err)?
        .label("stall share")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], STALL.stroke_width(2)));
    if let Some(o) = oracle {
        chart
            .draw_series(DashedLineSeries::new(
                o.seconds.iter().map(|s| (at(s), stall(s))),
                6,
                4,
                LIGHT.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(format!("oracle ({}): stall share", name(o.budget)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], LIGHT.stroke_width(2)));
    }
    chart
        .draw_series(DashedLineSeries::new(
            [(start, target), (end, target)],
            8,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label(format!("stall target {}", percent(target / 100.0)))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    phase_lines(&mut chart, &j.phase_starts(end), top)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Memory saved against slowdown, both against the every-page run (its throughput the
/// baseline's): the fixed budgets joined
/// from every page down, the self-sized runs apart, the oracle ringed, the target a line.
fn curve_panel(area: &Area, j: &LookupJudgement) -> anyhow::Result<()> {
    let base = j.base();
    let base_rate = j.base_rate();
    let slowdown = |r: &LookupRun| 100.0 - j.run_pct(r);
    let saved = |r: &LookupRun| (1.0 - r.mean_memory_bytes / base.mean_memory_bytes) * 100.0;
    let point = |r: &LookupRun| (slowdown(r), saved(r));
    let mut fixed: Vec<&LookupRun> = j
        .runs
        .iter()
        .filter(|r| matches!(r.budget, Budget::Fixed(_) | Budget::Unlimited))
        .collect();
    // From every page (a share of 1) down to the smallest budget.
    let share = |r: &LookupRun| match r.budget {
        Budget::Fixed(s) => s,
        Budget::Unlimited | Budget::Autosized(_) => 1.0 + f64::EPSILON,
    };
    fixed.sort_by(|a, b| share(b).total_cmp(&share(a)));
    let target = j.slowdown * 100.0;
    let xs = || j.runs.iter().map(slowdown).chain([0.0, target]);
    let left = xs().fold(0.0, f64::min);
    let right = xs().fold(target, f64::max);
    let pad = (right - left).max(1.0) * 0.06;
    let ys = || j.runs.iter().map(saved).chain([0.0]);
    let bottom = ys().fold(0.0, f64::min);
    let top = ys().fold(1.0, f64::max);
    let ypad = (top - bottom).max(1.0) * 0.1;
    let base_mb = base.mean_memory_bytes / 1e6;
    let mut chart = framed(
        area,
        format!(
            "{}: memory saved against slowdown, each fixed budget and the self-sized runs \
                 (every page: {base_mb:.1} MB, {} lookups/s{})",
            j.corpus,
            base_rate as u64,
            j.baseline_lookups_per_reference_fold
                .map_or(String::new(), |pace| format!(", pace {pace:.4}"))
        ),
    )
    .build_cartesian_2d(left - pad..right + pad, bottom - ypad..top + ypad)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(format!(
            "slowdown, % of every page's {} (negative: faster, the machine's noise)",
            j.throughput_name()
        ))
        .y_desc("memory saved, % of every page's")
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(LineSeries::new(
            fixed.iter().map(|r| point(r)),
            BUDGET.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label("fixed budgets")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BUDGET.stroke_width(1)));
    chart
        .draw_series(fixed.iter().map(|r| {
            let label = match r.budget {
                Budget::Fixed(s) => percent(s),
                Budget::Unlimited | Budget::Autosized(_) => name(r.budget),
            };
            EmptyElement::at(point(r))
                + Circle::new((0, 0), 4, BUDGET.filled())
                + Text::new(label, (6, -12), ("sans-serif", 12))
        }))
        .map_err(draw_err)?;
    if let Some(o) = j.oracle {
        let r = &j.runs[o];
        chart
            .draw_series([EmptyElement::at(point(r))
                + Circle::new((0, 0), 9, BLACK.stroke_width(2))
                + Text::new(
                    format!("oracle: {}", name(r.budget)),
                    (12, 8),
                    ("sans-serif", 13),
                )])
            .map_err(draw_err)?
            .label("the oracle (least memory within the target, with hindsight)")
            .legend(|(x, y)| Circle::new((x + 8, y), 5, BLACK.stroke_width(2)));
    }
    for (k, s) in j.self_sized.iter().enumerate() {
        let r = &j.runs[s.run];
        // Red first, then the colours not used above.
        let color = if k == 0 {
            STALL
        } else {
            DISTINCT[(k + 3) % DISTINCT.len()]
        };
        chart
            .draw_series([EmptyElement::at(point(r))
                + TriangleMarker::new((0, 0), 9, color.filled())
                + Text::new(name(r.budget), (10, -18), ("sans-serif", 13))])
            .map_err(draw_err)?
            .label(name(r.budget))
            .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 6, color.filled()));
    }
    chart
        .draw_series(DashedLineSeries::new(
            [(target, bottom - ypad), (target, top + ypad)],
            8,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label(format!("slowdown target {}", percent(j.slowdown)))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    chart
        .configure_series_labels()
        // Top left: little slowdown and much saved, where no budget is seen to land.
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_written_with_the_decimals_they_need() {
        assert_eq!(percent(0.97), "97 %");
        assert_eq!(percent(0.01), "1 %");
        assert_eq!(percent(0.001), "0.1 %");
        assert_eq!(percent(0.0025), "0.25 %");
    }
}
