//! `ztier bench --trace --promotion-target 0.2%/min`: the far tier judged on each corpus's
//! capture over time (`ztier_replay::far_tier`): the trace at its recorded pace through
//! zram with a store in memory, the device's policy writing back at each fixed idle age of
//! `--fixed-ages` and then at the age the promotion controller chooses; a table of the
//! runs, the best fixed age meeting the target (chosen with hindsight) and the verdict.
//! Flags in, the table out; a verdict short of the goal is reported, not an error.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ztier_replay::far_tier::{
    AgeChoice, FarTierReplay, FarTierRun, FarTierVerdict, GOAL_OF_ORACLE,
};
use ztier_zram::promotion::{parse_percent_per_minute, PromotionTarget};

use super::shared::ReplayArgs;
use super::shared::{emit, read_trace};

/// The far tier's flags (with `--trace`).
#[derive(Args, Debug, Clone)]
pub struct FarTierArgs {
    /// With --trace: judge the far tier instead: the device's policy writing back at each of
    /// --fixed-ages, then at the idle age that keeps reads from the store under this percent
    /// of the pages on it per minute (Google's far memory uses 0.2%/min, of its working
    /// set), against the best fixed age in hindsight. Written back to a store in memory, a
    /// page to a block (the kernel's format: one read from the store per page promoted, as
    /// the target counts).
    #[arg(long, value_name = "PERCENT%/min", requires = "trace",
          value_parser = |s: &str| parse_percent_per_minute(s).map_err(|e| e.to_string()))]
    pub promotion_target: Option<f64>,
    /// The fixed idle ages the best is chosen from.
    #[arg(long, value_delimiter = ',', value_name = "AGE,AGE,...",
          value_parser = crate::size::parse_positive_duration, requires = "promotion_target",
          default_value = "10s,20s,30s,45s,60s,90s,120s,180s,240s,300s,420s,600s")]
    pub fixed_ages: Vec<Duration>,
    /// The policy's interval, in the capture's time.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "10s",
          requires = "promotion_target")]
    pub policy_interval: Duration,
}

/// Every corpus's trace judged; each verdict printed (or a JSON line each).
/// `allocator`, `layout` and `compressor` are the bench's first of each; `replay` its
/// corpus and output flags.
pub fn run(
    far: &FarTierArgs,
    replay_args: &ReplayArgs,
    allocator: ztier_pool::AllocatorKind,
    percent: f64,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
    plot: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let replay = FarTierReplay {
        allocator,
        layout,
        algorithm: replay_args.compressors[0].clone(),
        format: ztier_zram::WbFormat::Page,
        interval: far.policy_interval,
        fixed_ages: far.fixed_ages.clone(),
        target: PromotionTarget::new(percent / 100.0),
    };
    let mut verdicts = Vec::new();
    for path in paths {
        let trace = read_trace(path)?;
        let corpus = replay_args.trace_corpus(path, &trace)?;
        let verdict = replay.judge_over(&corpus.pages(), &trace)?;
        emit(replay_args.json, &verdict, print_verdict)?;
        verdicts.push(serde_json::to_value(&verdict)?);
    }
    if let Some(svg) = plot {
        crate::plot::render(&verdicts, svg)?;
    }
    Ok(())
}

fn print_verdict(v: &FarTierVerdict) {
    println!(
        "{}: far tier by promotion rate, target {} %/min of the stored pages",
        v.corpus,
        v.target_share_per_minute * 100.0
    );
    println!(
        "  {:<12} {:>10} {:>12} {:>12} {:>12} {:>12} {:>6}",
        "age", "promoted", "%/min", "worst min %", "mean stored", "written back", "meets"
    );
    for r in v.fixed.iter().chain([&v.controller]) {
        print_run(r);
    }
    if let Some(c) = &v.controller.controller {
        let ages = &v.controller.ages_secs;
        let predicted = c
            .predicted_share_per_minute
            .map_or("none known safe".to_string(), |p| {
                format!("{:.4} %/min", p * 100.0)
            });
        println!(
            "  controller: age {} s at the end (predicted there: {predicted}), from {} s to {} s \
             over the run; decisions {} older, {} younger, {} holding",
            c.age_secs,
            ages.iter().min().unwrap_or(&0),
            ages.iter().max().unwrap_or(&0),
            c.older,
            c.younger,
            c.holding
        );
    }
    match (&v.oracle, v.of_oracle) {
        (Some(o), Some(share)) => println!(
            "  oracle (best fixed age meeting the target): {}; the controller holds {:.1} % of \
             its pages on the store; goal (target met, >= {:.0} %): {}",
            label(o),
            share * 100.0,
            GOAL_OF_ORACLE * 100.0,
            if v.goal_met { "met" } else { "NOT met" }
        ),
        _ => println!(
            "  no fixed age meets the target; the controller {}",
            if v.goal_met {
                "does"
            } else {
                "does NOT either"
            }
        ),
    }
}

fn label(r: &FarTierRun) -> String {
    match r.age {
        AgeChoice::Fixed { age_secs } => format!("{age_secs} s"),
        AgeChoice::Controller => "controller".to_string(),
    }
}

fn print_run(r: &FarTierRun) {
    println!(
        "  {:<12} {:>10} {:>12.4} {:>12.4} {:>12.0} {:>12} {:>6}",
        label(r),
        r.promotions,
        r.share_per_minute * 100.0,
        r.worst_minute_share * 100.0,
        r.mean_stored_pages,
        r.written_back_pages,
        if r.meets_target { "yes" } else { "no" }
    );
}
