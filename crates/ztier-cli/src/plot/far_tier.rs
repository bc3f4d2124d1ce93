//! The far tier judged (`ztier bench --trace --promotion-target ... --json`): for each
//! trace, the pages the store held against the promotion rate, a point per fixed idle age
//! (the curve an operator would pick from with hindsight) and the controller's point, with
//! the target as a line.

use plotters::prelude::*;
use serde::Deserialize;

use super::{draw_err, framed, Area};

/// What the panel needs of a verdict.
#[derive(Deserialize)]
pub(super) struct FarTierResult {
    corpus: String,
    target_share_per_minute: f64,
    fixed: Vec<FarTierRun>,
    controller: FarTierRun,
}

#[derive(Deserialize)]
struct FarTierRun {
    age: AgeChoice,
    mean_stored_pages: f64,
    share_per_minute: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum AgeChoice {
    Fixed { age_secs: u64 },
    Controller,
}

pub(super) fn far_tier_panel(area: &Area, v: &FarTierResult) -> anyhow::Result<()> {
    // On a log axis (the ages' rates span orders of magnitude), a rate of 0 drawn at its floor.
    let floor = 0.001;
    let pct = |share: f64| (share * 100.0).max(floor);
    let mib = |pages: f64| pages * 4096.0 / 1048576.0;
    let runs = || v.fixed.iter().chain([&v.controller]);
    let right = runs()
        .map(|r| pct(r.share_per_minute))
        .chain([pct(v.target_share_per_minute)])
        .filter(|x| x.is_finite())
        .fold(0.01, f64::max)
        * 1.5;
    let top = runs()
        .map(|r| mib(r.mean_stored_pages))
        .filter(|x| x.is_finite())
        .fold(0.01, f64::max)
        * 1.15;
    let mut chart = framed(
        area,
        format!(
            "{}: the far tier, pages held on the store against promotions (target {} %/min)",
            v.corpus,
            pct(v.target_share_per_minute)
        ),
    )
    .build_cartesian_2d((floor..right).log_scale(), 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("promotions, % of the stored pages per minute (log scale; none drawn at 0.001)")
        .y_desc("held on the store, mean (MiB of pages)")
        .draw()
        .map_err(draw_err)?;
    let blue = RGBColor(31, 119, 180);
    let point = |r: &FarTierRun| (pct(r.share_per_minute), mib(r.mean_stored_pages));
    let mut fixed: Vec<&FarTierRun> = v.fixed.iter().collect();
    fixed.sort_by(|a, b| a.share_per_minute.total_cmp(&b.share_per_minute));
    chart
        .draw_series(LineSeries::new(
            fixed.iter().map(|r| point(r)),
            blue.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label("fixed idle ages")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], blue.stroke_width(1)));
    chart
        .draw_series(fixed.iter().map(|r| {
            let name = match r.age {
                AgeChoice::Fixed { age_secs } => format!("{age_secs}s"),
                AgeChoice::Controller => "controller".to_string(),
            };
            EmptyElement::at(point(r))
                + Circle::new((0, 0), 4, blue.filled())
                + Text::new(name, (6, -12), ("sans-serif", 12))
        }))
        .map_err(draw_err)?;
    chart
        .draw_series([EmptyElement::at(point(&v.controller))
            + Circle::new((0, 0), 8, RED.filled())
            + Text::new("controller", (10, -16), ("sans-serif", 14))])
        .map_err(draw_err)?
        .label("the controller")
        .legend(|(x, y)| Circle::new((x + 8, y), 5, RED.filled()));
    let target = pct(v.target_share_per_minute);
    chart
        .draw_series(DashedLineSeries::new(
            [(target, 0.0), (target, top)],
            6,
            4,
            BLACK.stroke_width(1),
        ))
        .map_err(draw_err)?
        .label("target")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}
