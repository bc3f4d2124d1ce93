//! zblock: the conformance suite every allocator passes, the model-based property test, and
//! the scenario that sank v2 in review (free slots trapped behind full blocks).

mod common;

use common::model_op;
use proptest::prelude::*;
use ztier_base::rng::Rng;
use ztier_pool::testing::{self, pattern};
use ztier_pool::{ConfigError, Handle, PoolError, ZPool, ZblockConfig, ZblockPool};

fn pool(page_size: usize, odd_blocks: bool) -> ZblockPool {
    ZblockPool::new(ZblockConfig {
        page_size,
        odd_blocks,
        ..ZblockConfig::default()
    })
    .unwrap()
}

#[test]
fn conformance_4k() {
    assert_eq!(
        testing::run_all(|| pool(4096, false)),
        0,
        "zblock does not compact"
    );
}

#[test]
fn conformance_16k_and_odd_blocks() {
    testing::run_all(|| pool(16384, false));
    testing::run_all(|| pool(4096, true));
}

/// Objects up to 16 and 64 KiB (zram's large compression units), on both page sizes.
#[test]
fn conformance_with_objects_larger_than_a_page() {
    for (page_size, max_object) in [(4096, 16384), (4096, 65536), (16384, 65536)] {
        let make = || {
            ZblockPool::new(ZblockConfig {
                page_size,
                max_object: Some(max_object),
                ..ZblockConfig::default()
            })
            .unwrap()
        };
        assert_eq!(make().max_alloc_size(), max_object);
        testing::run_all(make);
    }
}

#[test]
fn a_largest_object_that_is_not_a_power_of_two_from_the_page_is_refused() {
    for max_object in [8192 + 4096, 131072, 2048] {
        let refused = ZblockPool::new(ZblockConfig {
            max_object: Some(max_object),
            ..ZblockConfig::default()
        });
        assert!(
            matches!(
                refused,
                Err(PoolError::Config(ConfigError::MaxObject { max_object: m, page_size: 4096 }))
                    if m == max_object
            ),
            "{max_object}"
        );
    }
}

#[test]
fn bad_page_size_is_refused() {
    let refused = ZblockPool::new(ZblockConfig {
        page_size: 8192,
        ..ZblockConfig::default()
    });
    assert!(matches!(
        refused,
        Err(PoolError::Config(ConfigError::PageSize { page_size: 8192 }))
    ));
}

/// Left to itself, zblock stores raw from the first length whose slot costs a whole page:
/// below it every length is stored in less.
#[test]
fn its_own_huge_size_is_where_an_object_costs_a_page() {
    for page_size in [4096, 16384] {
        let pool = pool(page_size, true);
        let table = pool.table();
        let cost = |len: usize| {
            let ty = table.types[table.type_for(len)];
            ty.pages * page_size / ty.slots_per_block
        };
        let huge = table.huge_size();
        assert!(huge > 1 && huge <= page_size, "{huge}");
        assert!(cost(huge) >= page_size, "{page_size}: {huge} costs less");
        assert!((1..huge).all(|len| cost(len) < page_size));
        assert_eq!(pool.huge_class_size(), huge);
    }
}

/// Fill many blocks of every type, free a random half of the objects, then allocate as many
/// again: while the freed slots last, not one block may be added; and the pool's pages are
/// exactly its blocks' pages throughout.
#[test]
fn freed_slots_are_reused_before_new_blocks() {
    for page_size in [4096, 16384] {
        let pool = pool(page_size, false);
        let sizes: Vec<usize> = (0..40_000u64)
            .map(|i| 64 + (i.wrapping_mul(2654435761) as usize % (page_size - 64)))
            .collect();
        let mut handles: Vec<Option<Handle>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| Some(pool.store(&pattern(i as u64, len)).unwrap()))
            .collect();
        let blocks_full = pool.blocks();
        let pages_full = pool.total_pages();
        // A random half, by a fixed-seed shuffle.
        let mut rng = Rng::from_state(0x2545_F491_4F6C_DD1D);
        let mut freed = Vec::new();
        for (i, h) in handles.iter_mut().enumerate() {
            if rng.next_u64().is_multiple_of(2) {
                pool.free(h.take().unwrap()).unwrap();
                freed.push(i);
            }
        }
        let blocks_after_free = pool.blocks();
        assert!(blocks_after_free <= blocks_full);
        // Allocate the same sizes again: each fits a slot freed above.
        for &i in &freed {
            handles[i] = Some(pool.store(&pattern(i as u64 + 1, sizes[i])).unwrap());
        }
        assert!(
            pool.blocks() <= blocks_full,
            "{page_size}: {} blocks after refilling, {} when full, {} after freeing",
            pool.blocks(),
            blocks_full,
            blocks_after_free
        );
        assert!(pool.total_pages() <= pages_full);
        let stats = pool.block_stats();
        assert_eq!(
            stats
                .iter()
                .map(|r| r.blocks * r.pages_per_block as u64)
                .sum::<u64>(),
            pool.total_pages()
        );
        assert_eq!(
            stats.iter().map(|r| r.used_slots).sum::<u64>(),
            sizes.len() as u64
        );
        let mut out = vec![0; page_size];
        for (i, h) in handles.iter().enumerate() {
            let seed = if freed.binary_search(&i).is_ok() {
                i as u64 + 1
            } else {
                i as u64
            };
            let n = pool.read(h.unwrap(), &mut out).unwrap();
            assert_eq!(out[..n], pattern(seed, sizes[i])[..]);
        }
        for h in handles.into_iter().flatten() {
            pool.free(h).unwrap();
        }
        assert_eq!((pool.blocks(), pool.total_pages()), (0, 0));
    }
}

/// Within a type, allocation never adds a block while one of that type has a free slot.
#[test]
fn no_new_block_while_a_partial_one_exists() {
    let pool = pool(4096, false);
    let len = 1000;
    let handles: Vec<Handle> = (0..1000)
        .map(|i| pool.store(&pattern(i, len)).unwrap())
        .collect();
    let blocks = pool.blocks();
    // One free slot in each of many blocks, full blocks all around them.
    for h in handles.iter().step_by(5) {
        pool.free(*h).unwrap();
    }
    for i in 0..200 {
        pool.store(&pattern(i, len)).unwrap();
        assert!(
            pool.blocks() <= blocks,
            "a block was added with free slots left"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The model properties of `testing::run_model`, with the types' block counts as the
    /// allocator's own page count; objects up to a page, 16 or 64 KiB.
    #[test]
    fn matches_a_model(big in any::<bool>(), odd in any::<bool>(), units in 0usize..3, ops in proptest::collection::vec(model_op(), 1..400)) {
        let page_size = if big { 16384 } else { 4096 };
        let pool = ZblockPool::new(ZblockConfig {
            page_size,
            odd_blocks: odd,
            max_object: [None, Some(16384.max(page_size)), Some(65536)][units],
            ..ZblockConfig::default()
        })
        .unwrap();
        testing::run_model(&pool, &ops, |p| {
            p.block_stats().iter().map(|r| r.blocks * r.pages_per_block as u64).sum()
        });
    }
}
