//! zsmalloc: the conformance suite at each layout, a model-based property test, and the
//! return of memory to the OS.
//!
//! Properties checked against a `HashMap<Handle, Vec<u8>>` model:
//! - every live object reads back exactly as last written, across compaction;
//! - a freed handle is refused by read, write and free, and nothing else changes;
//! - malloc of 0 or of more than a page is refused;
//! - `total_pages` equals the sum of the classes' `pages_used`, and is 0 once all is freed.

mod common;

use common::model_op;
use proptest::prelude::*;
use ztier_pool::testing::{self, pattern};
use ztier_pool::zsmalloc::ChainRule;
use ztier_pool::{Handle, ZPool, ZsConfig, ZsPool};

fn pool(page_size: usize, chain_size: usize, chain_rule: ChainRule) -> ZsPool {
    ZsPool::new(ZsConfig {
        page_size,
        chain_size,
        chain_rule,
    })
    .unwrap()
}

#[test]
fn conformance_default_layout() {
    let compacted = testing::run_all(|| pool(4096, 8, ChainRule::LeastWaste));
    assert!(compacted > 0, "compaction freed no page beside the workers");
}

#[test]
fn conformance_chain_1_and_16() {
    let compacted = testing::run_all(|| pool(4096, 1, ChainRule::LeastWaste));
    assert!(compacted > 0, "compaction freed no page beside the workers");
    let compacted = testing::run_all(|| pool(4096, 16, ChainRule::UsedPercent));
    assert!(compacted > 0, "compaction freed no page beside the workers");
}

#[test]
fn conformance_16k_pages() {
    let compacted = testing::run_all(|| pool(16384, 4, ChainRule::LeastWaste));
    assert!(compacted > 0, "compaction freed no page beside the workers");
}

#[test]
fn bad_configurations_are_refused() {
    for (page_size, chain) in [(8192, 8), (4096, 0), (4096, 17)] {
        let cfg = ZsConfig {
            page_size,
            chain_size: chain,
            chain_rule: ChainRule::LeastWaste,
        };
        assert!(ZsPool::new(cfg).is_err(), "{page_size}/{chain}");
    }
}

#[test]
fn handles_survive_compaction_and_stats_add_up() {
    let pool = pool(4096, 8, ChainRule::LeastWaste);
    let handles: Vec<Handle> = (0..30_000u64)
        .map(|i| {
            pool.store(&pattern(i, 200 + (i as usize % 5) * 400))
                .unwrap()
        })
        .collect();
    for h in handles.iter().step_by(3) {
        pool.free(*h).unwrap();
    }
    let before = pool.total_pages();
    let stats = pool.class_stats();
    let freeable: u64 = stats.iter().map(|r| r.freeable).sum();
    assert!(freeable > 0);
    assert_eq!(stats.iter().map(|r| r.pages_used).sum::<u64>(), before);
    let freed = pool.compact();
    assert!(
        freed >= freeable / 2,
        "freed {freed} of {freeable} freeable"
    );
    assert_eq!(pool.total_pages(), before - freed);
    assert_eq!(pool.pages_compacted(), freed);
    let mut out = vec![0; 4096];
    for (i, h) in handles.iter().enumerate() {
        if i % 3 != 0 {
            let len = pool.read(*h, &mut out).unwrap();
            assert_eq!(out[..len], pattern(i as u64, 200 + (i % 5) * 400)[..]);
        }
    }
    let table = ztier_pool::zsmalloc::format_class_stats(&pool.class_stats());
    assert!(table.starts_with(" class  size       10%"));
    assert!(table
        .lines()
        .last()
        .unwrap()
        .trim_start()
        .starts_with("Total"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matches_a_model(chain in 1usize..=16, ops in proptest::collection::vec(model_op(), 1..400)) {
        let pool = pool(4096, chain, ChainRule::LeastWaste);
        testing::run_model(&pool, &ops, |p| p.class_stats().iter().map(|r| r.pages_used).sum());
    }
}
