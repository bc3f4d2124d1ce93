//! zswap's behaviour: exclusive loads, zero-filled and incompressible pages, the pool limit
//! and its hysteresis, writeback and reads of written-back pages, refused stores leaving the
//! page readable, many threads with the shrinker running, and a model of random operations.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use proptest::prelude::*;
use ztier_base::pattern;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::Faulty;
use ztier_compress::Algorithm;
use ztier_pool::{AllocatorKind, Handle, ObjectRef, PoolStats, ZPool, ZsConfig};
use ztier_zswap::{Cache, Config, Placement, Reject, Source, ZswapError};

const PS: usize = 4096;

fn swap(slots: u64) -> Arc<ztier_swap::Device> {
    let backing = Arc::new(MemoryDevice::new(slots * PS as u64).unwrap());
    Arc::new(ztier_swap::Device::new(backing, Default::default()).unwrap())
}

fn cache_on(swap: &Arc<ztier_swap::Device>, ram_bytes: u64, worker: bool) -> Cache {
    let pool = AllocatorKind::Zsmalloc
        .make_pool(&ZsConfig::default())
        .unwrap();
    let mut config = Config::new(Algorithm::new(ztier_compress::Kind::Lz4), ram_bytes);
    config.shrink_worker = worker;
    Cache::new(swap.clone(), pool, config).unwrap()
}

/// A page that compresses about 4:1, different for every `seed`.
fn page(seed: u64) -> Vec<u8> {
    let mut p = pattern::pattern(seed, 1024);
    p.resize(PS, (seed % 251) as u8 | 1);
    p
}

fn random_page(seed: u64) -> Vec<u8> {
    pattern::pattern(seed + 1_000_000_007, PS)
}

/// zsmalloc as another thread's reads would leave it for a load's batch of frees: every
/// class held, so a batch freed without waiting frees nothing. Counts its live objects.
struct HeldClasses {
    pool: Box<dyn ZPool>,
    live: Arc<AtomicU64>,
}

impl ZPool for HeldClasses {
    fn name(&self) -> &'static str {
        self.pool.name()
    }
    fn malloc(&self, len: usize) -> ztier_pool::Result<Handle> {
        let h = self.pool.malloc(len)?;
        self.live.fetch_add(1, Relaxed);
        Ok(h)
    }
    fn free(&self, handle: Handle) -> ztier_pool::Result<()> {
        self.pool.free(handle)?;
        self.live.fetch_sub(1, Relaxed);
        Ok(())
    }
    fn write(&self, handle: Handle, data: &[u8]) -> ztier_pool::Result<()> {
        self.pool.write(handle, data)
    }
    fn with_object(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(ObjectRef<'_>) -> ztier_pool::Result<()>,
    ) -> ztier_pool::Result<usize> {
        self.pool.with_object(handle, f)
    }
    fn free_batch_uncontended(&self, _handles: &mut Vec<Handle>) -> ztier_pool::Result<()> {
        Ok(())
    }
    fn total_pages(&self) -> u64 {
        self.pool.total_pages()
    }
    fn page_size(&self) -> usize {
        self.pool.page_size()
    }
    fn max_alloc_size(&self) -> usize {
        self.pool.max_alloc_size()
    }
    fn huge_class_size(&self) -> usize {
        self.pool.huge_class_size()
    }
    fn size_class(&self, len: usize) -> usize {
        self.pool.size_class(len)
    }
    fn compact(&self) -> u64 {
        self.pool.compact()
    }
    fn pages_compacted(&self) -> u64 {
        self.pool.pages_compacted()
    }
    fn stats(&self) -> PoolStats {
        self.pool.stats()
    }
}

/// Loads whose classes are all held keep their objects for later batches, but no more than
/// the bound the cache documents (94 loads' objects a shard), and every figure read after
/// them is exact: nothing is lost, nothing freed twice.
#[test]
fn loads_beside_held_classes_keep_few_objects_and_figures_stay_exact() {
    let swap = swap(1024);
    let live = Arc::new(AtomicU64::new(0));
    let pool = Box::new(HeldClasses {
        pool: AllocatorKind::Zsmalloc
            .make_pool(&ZsConfig::default())
            .unwrap(),
        live: live.clone(),
    });
    let config = Config::new(Algorithm::new(ztier_compress::Kind::Lz4), 1 << 30);
    let cache = Cache::new(swap.clone(), pool, config).unwrap();
    let pages = 600u64;
    let slots: Vec<u64> = (0..pages).map(|_| swap.alloc(0).unwrap()).collect();
    for (i, &slot) in slots.iter().enumerate() {
        assert_eq!(
            cache.store(slot, &page(i as u64)).unwrap(),
            Placement::Zswap
        );
    }
    assert_eq!(live.load(Relaxed), pages);
    let (mut most, mut emptied) = (0, false);
    let mut out = vec![0u8; PS];
    for (i, &slot) in slots.iter().enumerate() {
        assert_eq!(cache.load(slot, &mut out).unwrap(), Some(Source::Zswap));
        assert_eq!(out, page(i as u64));
        let still_stored = pages - 1 - i as u64;
        let unfreed = live.load(Relaxed) - still_stored;
        most = most.max(unfreed);
        emptied |= unfreed == 0 && i >= 64;
    }
    assert!(most <= 94, "{most} loaded pages' objects held at once");
    assert!(most >= 32, "the batches kept nothing: {most}");
    assert!(
        emptied,
        "no batch waited for its classes and freed what was kept"
    );
    let s = cache.stats();
    assert_eq!((s.stored_pages, s.pool_total_size), (0, 0));
    assert_eq!(live.load(Relaxed), 0, "every object freed once read");
}

#[test]
fn loads_are_exclusive_and_zero_pages_take_nothing() {
    let swap = swap(1024);
    let cache = cache_on(&swap, 1 << 30, false);
    let (a, z, r) = (
        swap.alloc(0).unwrap(),
        swap.alloc(0).unwrap(),
        swap.alloc(0).unwrap(),
    );
    assert_eq!(cache.store(a, &page(1)).unwrap(), Placement::Zswap);
    assert_eq!(cache.store(z, &[0u8; PS]).unwrap(), Placement::Zero);
    assert_eq!(cache.store(r, &random_page(2)).unwrap(), Placement::Zswap);
    let s = cache.stats();
    assert_eq!(
        (s.stored_pages, s.zero_pages, s.stored_incompressible_pages),
        (2, 1, 1)
    );
    // One pool page for the compressed one, the incompressible one whole in its own.
    assert_eq!(s.zswapped_kb, 8);
    let mut out = vec![1u8; PS];
    assert_eq!(cache.load(z, &mut out).unwrap(), Some(Source::Zero));
    assert!(out.iter().all(|&b| b == 0));
    assert_eq!(cache.load(a, &mut out).unwrap(), Some(Source::Zswap));
    assert_eq!(out, page(1));
    assert_eq!(
        cache.load(a, &mut out).unwrap(),
        None,
        "a load frees the entry"
    );
    assert_eq!(cache.load(r, &mut out).unwrap(), Some(Source::Zswap));
    assert_eq!(out, random_page(2));
    let s = cache.stats();
    assert_eq!((s.stored_pages, s.zero_pages, s.pool_total_size), (0, 0, 0));
    assert_eq!(
        (s.zswpout, s.zswpin, s.swpout_zero, s.swpin_zero),
        (2, 2, 1, 1)
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let swap = swap(1024);
    let cache = cache_on(&swap, 1 << 30, false);
    let a = swap.alloc(0).unwrap();
    cache.store(a, &page(3)).unwrap();
    assert!(matches!(
        cache.store(a, &[1u8; 100]),
        Err(ZswapError::BadLength { len: 100, .. })
    ));
    assert!(matches!(
        cache.store(0, &page(1)),
        Err(ZswapError::OutOfRange { .. })
    ));
    assert!(matches!(
        cache.store(1 << 20, &page(1)),
        Err(ZswapError::OutOfRange { .. })
    ));
    assert!(matches!(
        cache.load(a, &mut [0u8; 10]),
        Err(ZswapError::BadLength { .. })
    ));
    let mut out = vec![0u8; PS];
    assert_eq!(cache.swap_in(a, &mut out).unwrap(), Source::Zswap);
    assert_eq!(out, page(3));
}

#[test]
fn a_store_replaces_the_slots_old_page() {
    let swap = swap(1024);
    let cache = cache_on(&swap, 1 << 30, false);
    let a = swap.alloc(0).unwrap();
    cache.store(a, &page(1)).unwrap();
    cache.store(a, &random_page(1)).unwrap();
    cache.store(a, &page(2)).unwrap();
    let s = cache.stats();
    assert_eq!((s.stored_pages, s.stored_incompressible_pages), (1, 0));
    let mut out = vec![0u8; PS];
    cache.load(a, &mut out).unwrap();
    assert_eq!(out, page(2));
}

/// Fills a pool of a 2 MiB budget (20 %: 104 pages) past its limit, with no worker.
#[test]
fn the_limit_refuses_until_the_pool_is_under_the_threshold() {
    let swap = swap(4096);
    let cache = cache_on(&swap, 2 << 20, false);
    assert_eq!(cache.max_pages(), 102);
    let mut placed = Vec::new();
    for i in 0..400u64 {
        let slot = swap.alloc(0).unwrap();
        placed.push((slot, i, cache.swap_out(slot, &page(i)).unwrap()));
    }
    let s = cache.stats();
    assert!(s.pool_limit_hit > 0 && s.pool_reached_full, "{s:?}");
    // The limit is checked before a store, as the kernel does: the store that crosses it
    // may have opened a zspage of up to `chain_size` (8) pages.
    assert!(
        s.pool_total_size / PS as u64 <= cache.max_pages() + 8,
        "{s:?}"
    );
    let refused = placed
        .iter()
        .filter(|p| p.2 == Placement::Device(Reject::PoolLimit))
        .count() as u64;
    assert_eq!(refused, s.swpout_device);
    assert!(refused > 0);
    // Freeing a little is not enough: stores stay refused until the accept threshold.
    let mut out = vec![0u8; PS];
    let (zswapped, on_device): (Vec<_>, Vec<_>) =
        placed.iter().partition(|p| p.2 == Placement::Zswap);
    for &(slot, i, _) in zswapped.iter().take(3) {
        assert_eq!(cache.swap_in(slot, &mut out).unwrap(), Source::Zswap);
        assert_eq!(out, page(i));
    }
    let extra = swap.alloc(0).unwrap();
    assert!(matches!(
        cache.swap_out(extra, &page(1000)).unwrap(),
        Placement::Device(Reject::PoolLimit)
    ));
    // Writing back down past the threshold reopens it.
    // (The first walks over the LRU only clear the referenced bits.)
    for _ in 0..100 {
        if cache.stats().pool_total_size / PS as u64 <= cache.max_pages() * 9 / 10 {
            break;
        }
        cache.shrink(64);
    }
    assert!(cache.stats().pool_total_size / PS as u64 <= cache.max_pages() * 9 / 10);
    assert_eq!(
        cache.swap_out(extra, &page(1001)).unwrap(),
        Placement::Zswap
    );
    // Every page reads back, from wherever it is.
    for &(slot, i, _) in zswapped.iter().skip(3).chain(on_device.iter()) {
        cache.swap_in(slot, &mut out).unwrap();
        assert_eq!(out, page(i), "slot {slot}");
    }
    assert!(cache.stats().written_back_pages > 0);
}

#[test]
fn a_refused_store_leaves_no_stale_copy() {
    let swap = swap(4096);
    let cache = cache_on(&swap, 2 << 20, false);
    let a = swap.alloc(0).unwrap();
    assert_eq!(cache.swap_out(a, &page(1)).unwrap(), Placement::Zswap);
    // Fill the pool so the next store of `a` is refused.
    let mut slot = 0;
    while !cache.stats().pool_reached_full {
        slot = swap.alloc(0).unwrap();
        cache.swap_out(slot, &random_page(slot)).unwrap();
    }
    assert!(slot > 0);
    assert_eq!(
        cache.swap_out(a, &page(2)).unwrap(),
        Placement::Device(Reject::PoolLimit)
    );
    assert!(
        !cache.contains(a),
        "the old page of the slot is gone from zswap"
    );
    let mut out = vec![0u8; PS];
    assert_eq!(cache.swap_in(a, &mut out).unwrap(), Source::Device);
    assert_eq!(out, page(2));
}

#[test]
fn writeback_gives_referenced_pages_a_second_chance_and_frees_slots() {
    let swap = swap(1024);
    let cache = cache_on(&swap, 1 << 30, false);
    let slots: Vec<u64> = (0..10).map(|_| swap.alloc(0).unwrap()).collect();
    for (i, &s) in slots.iter().enumerate() {
        cache.store(s, &page(i as u64)).unwrap();
    }
    // The first walk only clears the referenced bits.
    assert_eq!(cache.shrink(10), 0);
    assert_eq!(cache.shrink(4), 4);
    let s = cache.stats();
    assert_eq!((s.written_back_pages, s.stored_pages), (4, 6));
    let mut out = vec![0u8; PS];
    for (i, &s) in slots.iter().enumerate() {
        let from = cache.swap_in(s, &mut out).unwrap();
        assert_eq!(from, if i < 4 { Source::Device } else { Source::Zswap });
        assert_eq!(out, page(i as u64));
    }
    for &s in &slots {
        cache.swap_free(s).unwrap();
        assert_eq!(swap.usage(s).unwrap(), 0);
    }
    assert_eq!(swap.in_use(), 0);
}

#[test]
fn a_failing_device_loses_nothing() {
    let disk = Arc::new(Faulty::new(MemoryDevice::new(1024 * PS as u64).unwrap()));
    // (swapon writes the header, so the disk fails only from here.)
    let swap = Arc::new(ztier_swap::Device::new(disk.clone(), Default::default()).unwrap());
    disk.set_failing(true, false);
    let cache = cache_on(&swap, 2 << 20, false);
    let slots: Vec<u64> = (0..8).map(|_| swap.alloc(0).unwrap()).collect();
    for (i, &s) in slots.iter().enumerate() {
        cache.store(s, &page(i as u64)).unwrap();
    }
    cache.shrink(8);
    assert_eq!(cache.shrink(8), 0, "every write back failed");
    let s = cache.stats();
    assert_eq!(
        (s.written_back_pages, s.reject_reclaim_fail, s.stored_pages),
        (0, 8, 8)
    );
    // A refused store whose device write fails is an error, and the page is nowhere.
    let mut n = 0u64;
    let err = loop {
        let slot = swap.alloc(0).unwrap();
        n += 1;
        match cache.swap_out(slot, &random_page(n)) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, ZswapError::Swap(_)), "{err}");
    // The disk comes back: writeback goes on, and every page is readable.
    disk.set_failing(false, false);
    assert!(cache.shrink(8) > 0);
    let mut out = vec![0u8; PS];
    for (i, &s) in slots.iter().enumerate() {
        cache.swap_in(s, &mut out).unwrap();
        assert_eq!(out, page(i as u64));
    }
}

/// Threads swapping out, in and again, each on its own slots, with a tight pool, the
/// background worker and a thread shrinking on demand: every page reads back as stored.
fn threads_with_writeback(threads: u64) {
    let swap = swap(16 * 1024);
    let cache = cache_on(&swap, 4 << 20, true);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                cache.shrink(16);
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let cache = &cache;
                let swap = &swap;
                s.spawn(move || {
                    let mut out = vec![0u8; PS];
                    // (slot, content seed) of pages swapped out
                    let mut out_pages: Vec<(u64, u64)> = Vec::new();
                    let mut seed = t * 1_000_000;
                    for round in 0..3000u64 {
                        seed += 1;
                        if round % 256 == 255 {
                            // Writeback from the workers too: on a busy machine the
                            // shrinking thread may get no core while the pool is full.
                            cache.shrink(16);
                        }
                        if out_pages.len() < 200 || round % 3 != 0 {
                            let slot = swap.alloc(0).unwrap();
                            let p = if seed % 7 == 0 {
                                vec![0u8; PS]
                            } else {
                                page(seed)
                            };
                            cache.swap_out(slot, &p).unwrap();
                            out_pages.push((slot, seed));
                        }
                        if round % 2 == 0 && !out_pages.is_empty() {
                            let k = (seed as usize * 31) % out_pages.len();
                            let (slot, sd) = out_pages.swap_remove(k);
                            cache.swap_in(slot, &mut out).unwrap();
                            let want = if sd % 7 == 0 { vec![0u8; PS] } else { page(sd) };
                            assert_eq!(out, want, "thread {t} slot {slot}");
                            if round % 4 == 0 {
                                // Re-store: the page swapped out again to the same slot.
                                cache.swap_out(slot, &want).unwrap();
                                out_pages.push((slot, sd));
                            } else {
                                cache.swap_free(slot).unwrap();
                            }
                        }
                    }
                    for (slot, sd) in out_pages {
                        cache.swap_in(slot, &mut out).unwrap();
                        let want = if sd % 7 == 0 { vec![0u8; PS] } else { page(sd) };
                        assert_eq!(out, want, "thread {t} slot {slot}");
                        cache.swap_free(slot).unwrap();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
    });
    cache.wait_shrink_idle();
    let s = cache.stats();
    assert!(s.written_back_pages > 0, "{s:?}");
    assert_eq!((s.stored_pages, s.zero_pages), (0, 0), "{s:?}");
    assert_eq!(s.pool_total_size, 0);
    assert_eq!(swap.in_use(), 0);
    swap.check_consistency().unwrap();
}

#[test]
fn two_threads_with_writeback() {
    threads_with_writeback(2);
}

#[test]
fn four_threads_with_writeback() {
    threads_with_writeback(4);
}

#[derive(Debug, Clone)]
enum Op {
    Store { slot: usize, seed: u8 },
    Load { slot: usize },
    Invalidate { slot: usize },
    Shrink { n: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..24usize, any::<u8>()).prop_map(|(slot, seed)| Op::Store { slot, seed }),
        3 => (0..24usize).prop_map(|slot| Op::Load { slot }),
        1 => (0..24usize).prop_map(|slot| Op::Invalidate { slot }),
        1 => (0..40u8).prop_map(|n| Op::Shrink { n }),
    ]
}

/// Seed 0 is a zero page, seeds 1..8 incompressible, the rest compressible.
fn content(seed: u8) -> Vec<u8> {
    match seed {
        0 => vec![0u8; PS],
        1..=8 => random_page(seed as u64),
        _ => page(seed as u64),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Random stores, loads, invalidations and shrinks on a pool with room for about 20
    /// pages, against a model of which slot holds which page: a load gives the model's page
    /// from zswap or the device, and the cache holds exactly the pages the counters say.
    #[test]
    fn random_operations_match_the_model(ops in prop::collection::vec(op(), 1..200)) {
        let swap = swap(1024);
        // 20 % of 400 KiB: 20 pool pages.
        let cache = cache_on(&swap, 400 << 10, false);
        let slots: Vec<u64> = (0..24).map(|_| swap.alloc(0).unwrap()).collect();
        let mut model: Vec<Option<u8>> = vec![None; 24];
        let mut out = vec![0u8; PS];
        for op in ops {
            match op {
                Op::Store { slot, seed } => {
                    cache.swap_out(slots[slot], &content(seed)).unwrap();
                    model[slot] = Some(seed);
                }
                Op::Load { slot } => match model[slot].take() {
                    Some(seed) => {
                        cache.swap_in(slots[slot], &mut out).unwrap();
                        prop_assert_eq!(&out, &content(seed));
                    }
                    None => prop_assert_eq!(cache.load(slots[slot], &mut out).unwrap(), None),
                },
                Op::Invalidate { slot } => {
                    cache.invalidate(slots[slot]).unwrap();
                    model[slot] = None;
                }
                Op::Shrink { n } => {
                    cache.shrink(n as usize);
                }
            }
            let s = cache.stats();
            let held = slots.iter().filter(|&&sl| cache.contains(sl)).count() as u64;
            prop_assert_eq!(s.stored_pages + s.zero_pages, held);
            for (i, m) in model.iter().enumerate() {
                if m.is_none() {
                    prop_assert!(!cache.contains(slots[i]), "slot {} is free in the model", i);
                }
            }
            prop_assert!(s.stored_incompressible_pages <= s.stored_pages);
            prop_assert!(s.pool_total_size / PS as u64 <= cache.max_pages() + 8);
        }
        for (i, m) in model.iter().enumerate() {
            if let Some(seed) = m {
                cache.swap_in(slots[i], &mut out).unwrap();
                prop_assert_eq!(&out, &content(*seed));
            }
        }
        let s = cache.stats();
        prop_assert_eq!((s.stored_pages, s.zero_pages, s.pool_total_size), (0, 0, 0));
    }

    /// Churn over 640 slots (ten index runs), with writeback: the pages stored in a burst,
    /// then random loads, invalidations, stores and shrinks, against the model. The LRU's
    /// slab is compacted as it grows sparse (by the shrinker, and a batch by each store) and
    /// the index keeps no room for pages gone, so
    /// metadata stays within 64 bytes a page held (plus the index's fixed node array and a
    /// little slack), and the walk still writes back the right pages after nodes moved.
    #[test]
    fn metadata_stays_tight_under_churn(
        keep in 0..640usize,
        ops in prop::collection::vec(
            (0..4u8, 0..640usize, any::<u8>()), 1..1500),
    ) {
        const N: usize = 640;
        let swap = swap(1024);
        let cache = cache_on(&swap, 1 << 30, false);
        let empty = cache.stats().metadata_bytes;
        let slots: Vec<u64> = (0..N).map(|_| swap.alloc(0).unwrap()).collect();
        let mut model: Vec<Option<u8>> = vec![None; N];
        let mut out = vec![0u8; PS];
        for (i, m) in model.iter_mut().enumerate() {
            let seed = 9 + (i % 200) as u8;
            cache.swap_out(slots[i], &content(seed)).unwrap();
            *m = Some(seed);
        }
        // Most pages leave in no order: the LRU's top and the index's runs go sparse.
        for i in (0..N).filter(|i| (i * 7919 + keep) % 10 != 0) {
            cache.swap_in(slots[i], &mut out).unwrap();
            prop_assert_eq!(&out, &content(model[i].take().unwrap()));
        }
        // Loads leave the compaction to stores and the shrinker; the shrinker does it all.
        cache.shrink(0);
        let s = cache.stats();
        let held = s.stored_pages + s.zero_pages;
        prop_assert!(
            s.metadata_bytes <= empty + 64 * held + 2048,
            "{} bytes of metadata for {} pages ({} empty)", s.metadata_bytes, held, empty
        );
        for (kind, slot, seed) in ops {
            match kind {
                0 => {
                    cache.swap_out(slots[slot], &content(seed)).unwrap();
                    model[slot] = Some(seed);
                }
                1 => match model[slot].take() {
                    Some(seed) => {
                        cache.swap_in(slots[slot], &mut out).unwrap();
                        prop_assert_eq!(&out, &content(seed));
                    }
                    None => prop_assert_eq!(cache.load(slots[slot], &mut out).unwrap(), None),
                },
                2 => {
                    cache.invalidate(slots[slot]).unwrap();
                    model[slot] = None;
                }
                _ => {
                    cache.shrink(seed as usize % 40);
                }
            }
        }
        let s = cache.stats();
        let held = s.stored_pages + s.zero_pages;
        prop_assert!(
            s.metadata_bytes <= empty + 64 * held + 2048,
            "{} bytes of metadata for {} pages ({} empty)", s.metadata_bytes, held, empty
        );
        for (i, m) in model.iter().enumerate() {
            match m {
                Some(seed) => {
                    cache.swap_in(slots[i], &mut out).unwrap();
                    prop_assert_eq!(&out, &content(*seed));
                }
                None => prop_assert!(!cache.contains(slots[i])),
            }
        }
        let s = cache.stats();
        prop_assert_eq!((s.stored_pages, s.zero_pages, s.pool_total_size), (0, 0, 0));
        prop_assert_eq!(s.metadata_bytes, empty, "every page gone, and the room they took");
    }
}

/// A cache on a pool whose pages are not the swap device's slots, or with a percentage past
/// 100, is refused with the reason, typed.
#[test]
fn bad_settings_are_refused_by_name() {
    let swap = swap(16);
    let big_pages = AllocatorKind::Zsmalloc
        .make_pool(&ZsConfig {
            page_size: 16384,
            ..ZsConfig::default()
        })
        .unwrap();
    let config = Config::new(Algorithm::new(ztier_compress::Kind::Lz4), 1 << 30);
    assert!(matches!(
        Cache::new(swap.clone(), big_pages, config.clone()),
        Err(ZswapError::PageSizeMismatch { pool: 16384, .. })
    ));
    let mut config = config;
    config.accept_threshold_percent = 101;
    let pool = AllocatorKind::Zsmalloc
        .make_pool(&ZsConfig::default())
        .unwrap();
    assert!(matches!(
        Cache::new(swap, pool, config),
        Err(ZswapError::NotAPercentage {
            name: "accept_threshold_percent",
            value: 101
        })
    ));
}
