//! The policy's writeback age by promotion rate, live on a device with a store in a file:
//! the policy's passes run by hand, the device's clock moved by hand ([`Device::set_age`]),
//! so nothing here waits for time to pass.

mod common;

use std::time::Duration;

use ztier_zram::promotion::Step;
use ztier_zram::{
    BadPolicyConfig, BadPromotionTarget, PolicyConfig, PolicyRunner, PromotionTarget, WbFormat,
};

use common::writeback::*;

const PAGES: u64 = 2000;
/// Pages 0..HOT are a working set, a third of it swapped in and out again every step (so
/// each page every 30 s); the rest is written once and never touched again.
const HOT: u64 = 300;
const STEP_SECS: u64 = 10;

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
fn a_working_set_read_back_makes_the_age_grow_until_promotions_fall_under_the_target() {
    let dev = device(PAGES, "lz4");
    dev.set_backing(Some(file_store("promotion", 32 << 20, WbFormat::Page)))
        .unwrap();
    // Ages far from the device's real one, so the second or so the test takes is noise.
    let base = 10_000;
    dev.set_age(Duration::from_secs(base));
    fill(&dev, PAGES);
    let target = PromotionTarget {
        share_per_minute: 0.002,
        min_age: Duration::from_secs(10),
        max_age: Duration::from_secs(600),
        start_age: Duration::from_secs(10),
        window: Duration::from_secs(60),
    };
    let mut runner = PolicyRunner::new(config(Some(target)));
    assert_eq!(runner.writeback_age(), Some(Duration::from_secs(10)));
    let mut out = vec![0u8; PS];
    let mut version = 0u64;
    let mut reads_by_step = Vec::new();
    for step in 1..=90u64 {
        dev.set_age(Duration::from_secs(base + step * STEP_SECS));
        let reads_before = dev.bd_stat().unwrap().bd_reads;
        for i in (0..HOT).filter(|i| i % 3 == step % 3) {
            // Swapped in (from the store if it went there) and out again, changed.
            dev.read_page(i, &mut out).unwrap();
            version += 1;
            dev.write_page(i, &page(PAGES + version)).unwrap();
        }
        reads_by_step.push(dev.bd_stat().unwrap().bd_reads - reads_before);
        let tick = runner.tick(&dev);
        assert_eq!(tick.errors, 0, "{tick:?}");
    }
    let stats = runner.promotion_stats().unwrap();
    // At 10 s the working set went to the store between its uses and came back: over the
    // target, older, until it stays in memory.
    assert!(
        reads_by_step[..6].iter().sum::<u64>() > 0,
        "{reads_by_step:?}"
    );
    assert!(stats.older > 0, "{stats:?}");
    assert_eq!(
        stats.history[0].step,
        Step::Older,
        "the first window is over"
    );
    assert!(stats
        .history
        .iter()
        .all(|d| d.age_secs >= 10 && d.age_secs <= 600));
    // Over the last half, the promotions stay under the target: 0.2 % a minute of the
    // pages on the store (the cold ones, 1700 less the same-filled), over 7.5 minutes.
    let stored = dev.bd_stat().unwrap().bd_count;
    assert!(
        stored >= (PAGES - HOT) * 9 / 10,
        "the cold pages went: {stored}"
    );
    let late: u64 = reads_by_step[45..].iter().sum();
    let allowed = 0.002 * stored as f64 * 7.5;
    assert!(
        (late as f64) <= allowed,
        "{late} promotions in the last 7.5 minutes, {allowed} allowed; {stats:?}"
    );
    // Fewer than early on, when the age was young.
    let early: u64 = reads_by_step[..45].iter().sum();
    assert!(late < early, "{early} then {late}");
    assert!(stats.age_secs > 20, "{stats:?}");
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
    dev.set_age(Duration::from_secs(1000));
    fill(&dev, 64);
    let mut runner = PolicyRunner::new(PolicyConfig {
        writeback_idle: Some(Duration::from_secs(30)),
        ..config(None)
    });
    assert_eq!(runner.writeback_age(), Some(Duration::from_secs(30)));
    dev.set_age(Duration::from_secs(1020));
    assert_eq!(runner.tick(&dev).written_back_pages, 0, "20 s idle");
    dev.set_age(Duration::from_secs(1040));
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
