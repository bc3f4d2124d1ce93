//! The host's budget at work, its thread running while four devices are written with skewed
//! working sets (`scenario`): the pools' sum held at the target, the cold device's pages the
//! ones written back, a protected device untouched, every byte read back right.
//!
//! What "held within 2 %" means here. The budget looks once an interval and brings the sum
//! under the target; between two looks the writers add to it (here at most one step each: see
//! `scenario`'s header). So the sum is sampled (every 50 ms, about three samples an interval,
//! at whatever point of an interval they fall) once the run has settled (the cold device
//! written and two of the budget's ticks over the target since), and:
//! - at least 95 % of the samples are at most 2 % above the target. Not all: a sample can
//!   fall while the budget's idle-priority thread is held off by the machine's other work and
//!   the writers that were already under way finish their step; 5 % leaves room for that and
//!   still fails a budget that lags a tick in every few;
//! - at least 95 % are at least 90 % of the target: the budget writes back what the sum is
//!   over by, not everything old (the writers keep the sum rising, so a budget that held it
//!   well under the target would have written back far more than needed).
//!
//! The run's steps add at most 2 × 16 new pages of at most 4 KiB between two ticks, 128 KiB,
//! about 1 % of the 12 MiB target: within the 2 % if the budget acts at each tick.

#[path = "scenario/mod.rs"]
mod scenario;

use std::time::Duration;

use scenario::{patterned_page, Scenario};

#[test]
fn the_budget_holds_the_target_with_the_cold_device_s_pages() {
    let target: u64 = 12 << 20;
    let s = Scenario {
        target,
        interval: Duration::from_millis(150),
        cold_size: 256 << 20,
        cold_pages: 6144,
        hot_size: 16 << 20,
        hot_start_pages: 256,
        hot_most_pages: 768,
        hot_grow_pages: 16,
        rewrite_pages: 192,
        read_pages: 8,
        low_pages: 512,
        low_protection: 4 << 20,
        run_ticks: 60,
        sample_every: Duration::from_millis(50),
    };
    let out = scenario::run(&s, &patterned_page);

    let settled = out.settled();
    let ceiling = target + target / 50;
    let floor = target - target / 10;
    let within = settled.iter().filter(|x| x.sum <= ceiling).count();
    let not_far_under = settled.iter().filter(|x| x.sum >= floor).count();
    let most = settled.iter().map(|x| x.sum).max().unwrap_or(0);
    let least = settled.iter().map(|x| x.sum).min().unwrap_or(0);
    eprintln!(
        "target {target}: {} samples settled, {within} at most 2 % over, {not_far_under} at \
         least 90 % of it; the sum from {least} to {most} ({:+.2} % at most)",
        settled.len(),
        (most as f64 / target as f64 - 1.0) * 100.0
    );
    for d in &out.devices {
        eprintln!("{d:?}");
    }
    eprintln!("{:?}", out.budget);
    assert!(
        settled.len() >= 100,
        "60 ticks of 150 ms sampled every 50 ms: {} samples",
        settled.len()
    );
    assert!(
        within * 100 >= settled.len() * 95,
        "{within} of {} samples at most 2 % over the target (the most {most})",
        settled.len()
    );
    assert!(
        not_far_under * 100 >= settled.len() * 95,
        "{not_far_under} of {} samples at least 90 % of the target (the least {least})",
        settled.len()
    );

    assert_eq!(out.budget.errors, 0, "{:?}", out.budget.last_error);
    assert_eq!(
        out.budget.protected_pages_taken, 0,
        "the cold device always had pages above its protection"
    );
    let cold = out.device("cold");
    assert!(
        cold.budget_written_back_pages >= 1000,
        "the sum was 1.5 times the target when the cold device was written: {cold:?}"
    );
    // The hot devices' pages are rewritten every few steps (well under a second), the cold
    // device's are idle from the start: at every age the budget asks the cold device first,
    // and again while it gives, so the hot ones give none.
    for hot in ["hot0", "hot1"] {
        let d = out.device(hot);
        assert_eq!(
            d.budget_written_back_pages, 0,
            "{hot}'s pages were rewritten within the last second, the cold device's not \
             since the start: {d:?}, {cold:?}"
        );
        assert_eq!(d.bd_reads, 0, "none of {hot}'s reads from the store: {d:?}");
    }
    let low = out.device("low");
    assert!(
        low.mem_used_total < low.mem_low,
        "the protected device stayed under its protection: {low:?}"
    );
    assert_eq!(low.budget_written_back_pages, 0, "{low:?}");
    assert_eq!(low.bd_writes, 0, "nothing of it on the store: {low:?}");
    assert_eq!(low.bd_reads, 0, "none of its reads from the store: {low:?}");

    for d in &out.devices {
        assert_eq!(d.failed_io, 0, "{d:?}");
        assert_eq!(d.wrong_pages, 0, "every page read back as written: {d:?}");
        assert!(d.pages_written > 0, "{d:?}");
    }
    assert!(
        cold.bd_reads > 0 && cold.bd_count > 0,
        "the cold device's pages were read back from the store: {cold:?}"
    );
}
