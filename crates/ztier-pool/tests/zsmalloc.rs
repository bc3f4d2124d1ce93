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
        max_object: None,
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
fn conformance_multi_page_objects() {
    for max_object in [16384, 65536] {
        let compacted = testing::run_all(|| {
            ZsPool::new(ZsConfig::default().with_max_object(max_object)).unwrap()
        });
        assert!(compacted > 0, "compaction freed no page beside the workers");
    }
}

#[test]
fn bad_configurations_are_refused() {
    for max_object in [8192 + 4096, 131072, 2048] {
        let cfg = ZsConfig {
            max_object: Some(max_object),
            ..ZsConfig::default()
        };
        assert!(ZsPool::new(cfg).is_err(), "{max_object}");
    }
    for (page_size, chain) in [(8192, 8), (4096, 0), (4096, 17)] {
        let cfg = ZsConfig {
            page_size,
            chain_size: chain,
            chain_rule: ChainRule::LeastWaste,
            max_object: None,
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

/// An emptied zspage is counted freed at once, as the kernel's is, while its class keeps
/// its pages for the next zspage: at most two a class and 4 MiB a pool, all given back by
/// compaction.
#[test]
fn emptied_zspages_are_freed_in_the_figures_and_kept_as_spares() {
    use ztier_pool::zsmalloc::{SPARE_BYTES_MAX, SPARE_ZSPAGES_PER_CLASS};
    let pool = pool(4096, 8, ChainRule::LeastWaste);
    let object = pattern(1, 1000);
    let spec = pool.table().classes[pool.table().slot_for_request(object.len())].clone();
    let per_zspage = spec.pages_per_zspage as u64;
    let handles: Vec<Handle> = (0..10 * spec.objs_per_zspage)
        .map(|_| pool.store(&object).unwrap())
        .collect();
    assert_eq!(pool.total_pages(), 10 * per_zspage);
    for h in handles {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.total_pages(), 0, "freed in the figures");
    let kept = SPARE_ZSPAGES_PER_CLASS as u64 * per_zspage;
    assert_eq!(pool.spare_pages(), kept);
    // The next zspages are made on the spares.
    let again: Vec<Handle> = (0..spec.objs_per_zspage)
        .map(|_| pool.store(&object).unwrap())
        .collect();
    assert_eq!(pool.total_pages(), per_zspage);
    assert_eq!(pool.spare_pages(), kept - per_zspage);
    for h in &again {
        let mut back = vec![0; object.len()];
        pool.read(*h, &mut back).unwrap();
        assert_eq!(back, object);
    }
    for h in again {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.spare_pages(), kept);
    assert_eq!(
        pool.compact(),
        0,
        "nothing to compact: spares are not counted"
    );
    assert_eq!(pool.spare_pages(), 0, "compaction gives the spares back");

    // Every class emptied: the pool's bound holds.
    let sizes: Vec<usize> = (1..=4096).step_by(8).collect();
    let mut all = Vec::new();
    for _ in 0..3 {
        for &len in &sizes {
            all.push(pool.store(&pattern(len as u64, len)).unwrap());
        }
    }
    for h in all {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.total_pages(), 0);
    assert!(pool.spare_pages() > 0);
    assert!(pool.spare_pages() <= (SPARE_BYTES_MAX / 4096) as u64);
}
