//! A host's memory over time, from its `ztier stat --json` lines: each device's
//! `mem_used_total`, the host's sum and its target.

use anyhow::bail;
use plotters::prelude::*;
use serde::Deserialize;

use super::{draw_err, framed, Area, DISTINCT};

/// One `ztier stat --json` of a host of devices.
#[derive(Deserialize)]
pub(super) struct HostSample {
    host: HostTotals,
    devices: std::collections::BTreeMap<String, HostDeviceSample>,
}

#[derive(Deserialize)]
struct HostTotals {
    /// When it was taken (older servers' samples lack it: then they are drawn a second
    /// apart).
    unix_time: Option<f64>,
    mem_used_bytes: u64,
    mem_target_bytes: u64,
}

#[derive(Deserialize)]
struct HostDeviceSample {
    mm_stat: Option<PoolBytes>,
}

/// Of a device's `mm_stat`, what the host's panel draws.
#[derive(Deserialize)]
struct PoolBytes {
    mem_used_total: u64,
}

/// A host's memory over time, from its `ztier stat --json` samples: each device's
/// `mem_used_total`, the host's sum and its target (if it has one).
pub(super) fn host_panel(area: &Area, samples: &[HostSample]) -> anyhow::Result<()> {
    fn mib(bytes: u64) -> f64 {
        bytes as f64 / 1048576.0
    }
    let first = samples[0].host.unix_time;
    let seconds: Vec<f64> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| match (first, s.host.unix_time) {
            (Some(t0), Some(t)) => t - t0,
            _ => i as f64,
        })
        .collect();
    if seconds.iter().any(|s| !s.is_finite()) {
        bail!("a host's sample has a time that is not a number");
    }
    let names: std::collections::BTreeSet<&String> =
        samples.iter().flat_map(|s| s.devices.keys()).collect();
    let device_mem = |s: &HostSample, name: &str| {
        s.devices
            .get(name)
            .and_then(|d| d.mm_stat.as_ref())
            .map(|m| mib(m.mem_used_total))
    };
    let target = samples
        .iter()
        .map(|s| s.host.mem_target_bytes)
        .find(|&t| t > 0);
    let top = samples
        .iter()
        .map(|s| mib(s.host.mem_used_bytes))
        .fold(target.map_or(1.0, mib), f64::max)
        * 1.1;
    let start = seconds.iter().copied().fold(f64::INFINITY, f64::min);
    let end = seconds.iter().copied().fold(start + 1.0, f64::max);
    let mut chart = framed(
        area,
        format!(
            "a host's memory over time: {} devices' mem_used_total{}",
            names.len(),
            target.map_or(String::new(), |t| format!(", target {:.1} MiB", mib(t)))
        ),
    )
    .build_cartesian_2d(start..end, 0f64..top)
    .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("MiB")
        .draw()
        .map_err(draw_err)?;
    // Red and black are the sum's and the target's.
    let palette: Vec<RGBColor> = DISTINCT
        .iter()
        .copied()
        .filter(|&c| c != RGBColor(214, 39, 40) && c != RGBColor(0, 0, 0))
        .collect();
    for (k, name) in names.iter().enumerate() {
        let color = palette[k % palette.len()];
        let points: Vec<(f64, f64)> = samples
            .iter()
            .zip(&seconds)
            .filter_map(|(s, &t)| device_mem(s, name).map(|m| (t, m)))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(draw_err)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .zip(&seconds)
                .map(|(s, &t)| (t, mib(s.host.mem_used_bytes))),
            RED.stroke_width(3),
        ))
        .map_err(draw_err)?
        .label("the host's sum")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED.stroke_width(3)));
    if let Some(t) = target {
        chart
            .draw_series(DashedLineSeries::new(
                [(start, mib(t)), (end, mib(t))],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(draw_err)?
            .label("target")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}
