//! The policy's writeback age by promotion rate, chosen from the device's reads and pages by
//! age, live on a device with a store in a file: the policy's passes run by hand, the
//! device's clock pinned and moved by hand ([`Device::pin_clock`]), so nothing here waits for
//! time to pass, and the test's own time never ages a page.

mod common;

use std::time::Duration;

use ztier_zram::promotion::Step;
use ztier_zram::{
    BadPolicyConfig, BadPromotionTarget, PolicyConfig, PolicyRunner, PromotionTarget, WbFormat,
};

use common::writeback::*;

const PAGES: u64 = 2000;
/// Pages 0..HOT are a working set swapped in and out again (read, then written changed):
/// every 30 s each, then every 60 s; the rest is written once and never touched again.
const HOT: u64 = 300;
const STEP_SECS: u64 = 10;
/// Steps (of STEP_SECS) the working set is swapped every 30 s; then every 60 s.
const FIRST_PHASE: u64 = 47;

fn config(target: Option<PromotionTarget>) -> PolicyConfig {
    PolicyConfig {
        recompress_idle: None,
        writeback_idle: None,
        mem_target: None,
        interval: Duration::from_secs(STEP_SECS),
        promotion_target: target,
    }
}

#[test]
fn the_age_is_chosen_from_the_reads_by_age_without_going_over_to_learn() {
    let dev = device(PAGES, "lz4");
    dev.set_backing(Some(file_store("promotion", 32 << 20, WbFormat::Page)))
        .unwrap();
    let base = 10_000;
    dev.pin_clock(Some(Duration::from_secs(base)));
    fill(&dev, PAGES);
    let target = PromotionTarget {
        share_per_minute: 0.002,
        min_age: Duration::from_secs(10),
        max_age: Duration::from_secs(600),
        window: Duration::from_secs(60),
    };
    let mut runner = PolicyRunner::new(config(Some(target)));
    assert_eq!(runner.writeback_age(), Some(Duration::from_secs(600)));
    let mut out = vec![0u8; PS];
    let mut version = 0u64;
    let (mut reads_by_step, mut ages) = (Vec::new(), Vec::new());
    // About 8 minutes with the working set swapped every 30 s (a third of it each step),
    // then 7 with it swapped every 60 s (a sixth each step).
    for step in 1..=90u64 {
        dev.pin_clock(Some(Duration::from_secs(base + step * STEP_SECS)));
        let period = if step <= FIRST_PHASE { 3 } else { 6 };
        let reads_before = dev.bd_stat().unwrap().bd_reads;
        for i in (0..HOT).filter(|i| i % period == step % period) {
            // Swapped in (from the store if it went there) and out again, changed.
            dev.read_page(i, &mut out).unwrap();
            version += 1;
            dev.write_page(i, &page(PAGES + version)).unwrap();
        }
        reads_by_step.push(dev.bd_stat().unwrap().bd_reads - reads_before);
        let tick = runner.tick(&dev);
        assert_eq!(tick.errors, 0, "{tick:?}");
        ages.push(runner.writeback_age().unwrap().as_secs());
        if step == FIRST_PHASE {
            // The cold pages went to the store once they were old enough to tell the
            // working set from them; at 32 s, the youngest age the working set (read at
            // 30 s) is not read at; and nothing was read back from the store.
            let stored = dev.bd_stat().unwrap().bd_count;
            assert!(
                stored >= (PAGES - HOT) * 9 / 10,
                "the cold pages went: {stored}"
            );
            assert_eq!(reads_by_step.iter().sum::<u64>(), 0, "{ages:?}");
        }
    }
    let stats = runner.promotion_stats().unwrap();
    // 600 s for the first two windows (the first began with no page 32 s old: the old
    // pages grew past it during it, which tells nothing of the ages beyond), then straight
    // to 32 s, from the second window's end, for the rest of the first phase.
    assert!(ages[..12].iter().all(|&a| a == 600), "{ages:?}");
    let first_phase = FIRST_PHASE as usize;
    assert!(ages[12..first_phase].iter().all(|&a| a == 32), "{ages:?}");
    let d = stats.history[0];
    assert_eq!((d.step, d.age_secs), (Step::Holding, 600), "{stats:?}");
    let d = stats.history[1];
    assert_eq!((d.step, d.age_secs), (Step::Younger, 32), "{stats:?}");
    // The working set slowed: pages written back at 32 s were read at 40-60 s, which the
    // first pass over the target showed (mid-window); older at once, to 64 s, held there.
    assert_eq!((stats.younger, stats.older), (1, 1), "{stats:?}");
    let older = stats
        .history
        .iter()
        .find(|d| d.step == Step::Older)
        .unwrap();
    assert!(older.window_secs < 60.0, "{older:?}");
    assert_eq!(older.age_secs, 64);
    assert_eq!(stats.age_secs, 64, "{stats:?}");
    let changed: u64 = reads_by_step[first_phase..].iter().sum();
    assert!(changed > 0 && changed <= HOT, "{reads_by_step:?}");
    assert_eq!(
        reads_by_step[65..].iter().sum::<u64>(),
        0,
        "{reads_by_step:?}"
    );
    assert!(
        stats.predicted_share_per_minute.unwrap() <= 0.002,
        "{stats:?}"
    );
    // Every page still reads back as last written.
    for i in HOT..PAGES {
        dev.read_page(i, &mut out).unwrap();
        assert!(out == page(i), "page {i}");
    }
}

#[test]
fn with_no_target_the_fixed_age_is_kept_and_the_controller_absent() {
    let dev = device(64, "lz4");
    dev.set_backing(Some(file_store("fixed", 4 << 20, WbFormat::Page)))
        .unwrap();
    dev.pin_clock(Some(Duration::from_secs(1000)));
    fill(&dev, 64);
    let mut runner = PolicyRunner::new(PolicyConfig {
        writeback_idle: Some(Duration::from_secs(30)),
        ..config(None)
    });
    assert_eq!(runner.writeback_age(), Some(Duration::from_secs(30)));
    dev.pin_clock(Some(Duration::from_secs(1020)));
    assert_eq!(runner.tick(&dev).written_back_pages, 0, "20 s idle");
    dev.pin_clock(Some(Duration::from_secs(1040)));
    // Every page but the 4 same-filled ones.
    assert_eq!(runner.tick(&dev).written_back_pages, 60);
    assert!(runner.promotion_stats().is_none());
}

#[test]
fn a_policy_that_cannot_be_followed_is_refused_with_its_reason() {
    let both = PolicyConfig {
        writeback_idle: Some(Duration::from_secs(30)),
        ..config(Some(PromotionTarget::new(0.002)))
    };
    assert_eq!(
        both.validate(),
        Err(BadPolicyConfig::TwoWritebackAges { idle_secs: 30 })
    );
    let bad = config(Some(PromotionTarget::new(-1.0)));
    assert!(matches!(
        bad.validate(),
        Err(BadPolicyConfig::Promotion(BadPromotionTarget::Share { .. }))
    ));
    let dev = std::sync::Arc::new(device(16, "lz4"));
    let err = ztier_zram::Policy::start(dev, bad).err().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("promotion target"), "{err}");
    assert!(config(Some(PromotionTarget::new(0.002))).validate().is_ok());
}

#[test]
fn a_pinned_clock_stands_still_and_runs_on_from_where_it_was_held() {
    let dev = device(8, "lz4");
    dev.pin_clock(Some(Duration::from_secs(5000)));
    fill(&dev, 8);
    // Real time crosses a second: the pinned clock does not see it.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(dev.clock(), Duration::from_secs(5000));
    // The pages held (a same-filled page among them holds no slot's age).
    let zero_old = dev.idle_ages().at_least();
    let held = zero_old[0];
    assert!(held >= 4 && zero_old[1] == 0, "{zero_old:?}");
    // Moved by hand, every page is exactly as old as the move.
    dev.pin_clock(Some(Duration::from_secs(5300)));
    let after = dev.idle_ages();
    let at = ztier_zram::access_ages::bucket_of(300);
    assert_eq!(after.counts()[at], held, "{:?}", after.counts());
    assert_eq!(after.at_least()[at + 1], 0);
    // Let go, it runs on from where it was held, not from the device's real age.
    dev.pin_clock(None);
    let running = dev.clock();
    assert!(
        running >= Duration::from_secs(5300) && running < Duration::from_secs(5400),
        "{running:?}"
    );
}
