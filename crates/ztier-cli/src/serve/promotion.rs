//! `ztier serve --promotion-target`: the device's writeback age chosen by its promotion rate
//! (`ztier_zram::promotion`) instead of a fixed `--writeback-idle`. Its own module so the
//! flag's plumbing stays out of `serve.rs`.

use clap::Args;
use ztier_zram::promotion::{parse_percent_per_minute, PromotionTarget};

#[derive(Args, Debug, Clone)]
pub struct PromotionArgs {
    /// Policy, instead of --writeback-idle: write back at the idle age that keeps reads from
    /// the store under this percent of the pages on it per minute (Google's far memory uses
    /// 0.2%/min, of its working set). The age, 10 s to an hour, is the youngest whose
    /// promotion rate, worked out for every age from the reads and the pages by idle age,
    /// was at most the target in 98 % of the last 30 minutes; an hour until some age is
    /// known to be safe (needs --backing-dev).
    #[arg(long, value_name = "PERCENT%/min", value_parser = parse_target,
          conflicts_with = "writeback_idle")]
    pub promotion_target: Option<f64>,
}

impl PromotionArgs {
    /// The policy's target, if one was given (the flag holds the percent).
    pub fn target(&self) -> Option<PromotionTarget> {
        self.promotion_target
            .map(|percent| PromotionTarget::new(percent / 100.0))
    }
}

fn parse_target(text: &str) -> Result<f64, String> {
    parse_percent_per_minute(text).map_err(|e| e.to_string())
}
