//! The swap device: exhaustion and recovery, the lists clusters move between, aligned
//! multi-order runs, rotational order, priorities and the off-list bit, discard, bad input,
//! threads, and slot maps that follow use, in both modes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ztier_base::rng::Rng;
use ztier_blockdev::file::FileDevice;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_swap::{Config, Device, Mode, Swap, SwapError, SLOT_BYTES, SWAPFILE_CLUSTER};

const CL: u64 = SWAPFILE_CLUSTER as u64;

fn memory(slots: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemoryDevice::new(slots * SLOT_BYTES).unwrap())
}

fn device(slots: u64, config: Config) -> Device {
    Device::new(memory(slots), config).unwrap()
}

fn modes() -> [Config; 2] {
    [
        Config::default(),
        Config {
            mode: Mode::Legacy,
            ..Config::default()
        },
    ]
}

#[test]
fn exhaustion_and_recovery() {
    for config in modes() {
        let dev = device(4 * CL, config);
        assert_eq!(dev.usable_slots(), 4 * CL - 1);
        let mut got = HashSet::new();
        loop {
            match dev.alloc(0) {
                Ok(slot) => assert!(got.insert(slot), "{slot} twice"),
                Err(SwapError::Full { order: 0 }) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got.len() as u64, 4 * CL - 1, "{config:?}");
        assert!(!got.contains(&0), "the header slot is never handed out");
        assert!(dev.off_list());
        assert_eq!(dev.stats().per_order[0].fallbacks, 1);
        assert!(matches!(dev.alloc(3), Err(SwapError::Full { order: 3 })));

        let some = *got.iter().next().unwrap();
        dev.free(some).unwrap();
        dev.drain_slot_caches();
        assert!(!dev.off_list(), "a free brings a full device back");
        assert_eq!(dev.alloc(0).unwrap(), some);
        let mut all: Vec<u64> = got.into_iter().collect();
        dev.free_batch(&mut all).unwrap();
        dev.drain_slot_caches();
        assert_eq!(dev.in_use(), 0);
        dev.check_consistency().unwrap();
        let s = dev.stats();
        assert_eq!(s.lists.free, 3, "{s:?}");
        assert_eq!(dev.alloc(9).unwrap() % CL, 0, "a whole cluster again");
    }
}

#[test]
fn slot_maps_are_made_as_clusters_are_used_and_given_back_as_they_empty() {
    for discard in [false, true] {
        let config = Config {
            discard,
            ..Config::default()
        };
        // 64 clusters: unused, only their states are held (the header's cluster has a map).
        let dev = device(64 * CL, config);
        let unused = dev.slot_map_resident_bytes();
        let per_map = CL;
        let full = Device::slot_map_bytes(64 * CL * SLOT_BYTES);
        assert!(
            unused + 60 * per_map < full,
            "unused {unused}, whole {full}"
        );
        // Ten whole clusters taken: ten maps more.
        let mut runs: Vec<u64> = (0..10).map(|_| dev.alloc(9).unwrap()).collect();
        assert_eq!(dev.slot_map_resident_bytes(), unused + 10 * per_map);
        // Single slots, more than a cluster's worth: the clusters they go to have maps.
        let mut one: Vec<u64> = (0..CL + 1).map(|_| dev.alloc(0).unwrap()).collect();
        let held = dev.slot_map_resident_bytes();
        assert!(held > unused + 10 * per_map, "{held}");
        dev.check_consistency().unwrap();
        // Everything freed (and discarded): back to the states alone.
        let mut all: Vec<u64> = runs.drain(..).flat_map(|first| first..first + CL).collect();
        all.append(&mut one);
        dev.free_batch(&mut all).unwrap();
        dev.drain_slot_caches();
        dev.discard_now();
        assert_eq!(dev.in_use(), 0);
        dev.check_consistency().unwrap();
        assert_eq!(dev.slot_map_resident_bytes(), unused, "discard {discard}");
        // And made again when used again, with what a slot held gone.
        let again = dev.alloc(9).unwrap();
        assert!(dev.slot_map_resident_bytes() > unused);
        dev.free_range(again, CL).unwrap();
        dev.drain_slot_caches();
        dev.discard_now();
        assert_eq!(dev.slot_map_resident_bytes(), unused);
    }
}

#[test]
fn fragmented_clusters_go_to_the_frag_list_and_order_0_takes_them_first() {
    let dev = device(4 * CL, Config::default());
    // CPU 0 takes ten order-0 slots from cluster 0 (the header's, on nonfull[0]); left
    // partly used, it is on frag[0].
    for _ in 0..10 {
        assert_eq!(dev.alloc_on(0, 0).unwrap() / CL, 0);
    }
    assert_eq!(dev.stats().lists.frag[0], 1);
    // CPU 1 fills clusters 1..4 with order-4 runs: nothing else has room for order 4.
    let mut runs = Vec::new();
    while let Ok(slot) = dev.alloc_on(1, 4) {
        runs.push(slot);
    }
    assert_eq!(runs.len(), 3 * 32);
    assert_eq!(dev.stats().per_order[4].fallbacks, 1);
    // Frees: a run in cluster 1 leaves it on the full list (too little room to be worth a
    // trip: order 0 fills its holes in place); half of cluster 2, then half of cluster 3,
    // in whole runs, put both on nonfull[4], 2 first.
    let runs_in = |c: u64| runs.iter().copied().filter(move |r| r / CL == c);
    dev.free_range(runs_in(1).next().unwrap(), 16).unwrap();
    let s = dev.stats();
    assert_eq!(
        (s.lists.frag[4], s.lists.nonfull[4], s.lists.full),
        (0, 0, 3),
        "{:?}",
        s.lists
    );
    for r in runs_in(2).take(16).collect::<Vec<_>>() {
        dev.free_range(r, 16).unwrap();
    }
    for r in runs_in(3).take(16).collect::<Vec<_>>() {
        dev.free_range(r, 16).unwrap();
    }
    assert_eq!(dev.stats().lists.nonfull[4], 2);
    // CPU 2's order-4 allocation isolates cluster 2, takes one run, and leaves it on
    // frag[4] (still room in it); cluster 3 stays on nonfull[4].
    assert_eq!(dev.alloc_on(2, 4).unwrap() / CL, 2);
    let s = dev.stats();
    assert_eq!(
        (s.lists.frag[4], s.lists.nonfull[4]),
        (1, 1),
        "{:?}",
        s.lists
    );
    dev.check_consistency().unwrap();

    // No free cluster: CPU 3's order-0 allocations take frag[0] (cluster 0) first...
    assert_eq!(dev.stats().lists.free, 0);
    for _ in 10..CL - 1 {
        assert_eq!(dev.alloc_on(3, 0).unwrap() / CL, 0);
    }
    // ...then steal from higher orders, the fragmented cluster (2) before the nonfull (3),
    // and last fill the holes of the full one (1) in place.
    let mut order = Vec::new();
    while let Ok(slot) = dev.alloc_on(4, 0) {
        match order.last_mut() {
            Some((c, n)) if *c == slot / CL => *n += 1,
            _ => order.push((slot / CL, 1)),
        }
    }
    assert_eq!(order, [(2, CL / 2 - 16), (3, CL / 2), (1, 16)]);
    dev.check_consistency().unwrap();
}

/// A larger allocation passes by fragmented clusters with no free run of its order without
/// the device lock (each cluster publishes its free runs), and finds the run a free
/// completes.
#[test]
fn large_allocations_skip_frag_clusters_without_a_run() {
    let dev = device(4 * CL, Config::default());
    let mut runs = Vec::new();
    while let Ok(slot) = dev.alloc_on(1, 4) {
        runs.push(slot);
    }
    assert_eq!(
        runs.len(),
        3 * 32,
        "clusters 1 to 3 (cluster 0 holds the header)"
    );
    // In cluster 2, every slot but the last of each of its first 18 runs: 270 free, more
    // than half, and not one run whole. It leaves the full list for frag[4].
    let base = 2 * CL;
    for run in 0..18 {
        for i in 0..15 {
            dev.free(base + run * 16 + i).unwrap();
        }
    }
    let s = dev.stats();
    assert_eq!(
        (s.lists.frag[4], s.lists.nonfull[4]),
        (1, 0),
        "{:?}",
        s.lists
    );
    let device_lock = |d: &Device| d.stats().locks[0].acquisitions;
    let before = device_lock(&dev);
    assert!(matches!(
        dev.alloc_on(2, 4),
        Err(SwapError::Full { order: 4 })
    ));
    assert_eq!(
        device_lock(&dev) - before,
        2,
        "the failed allocation took the device lock (stats() takes it twice)"
    );
    dev.check_consistency().unwrap();
    // One more free completes run 5: the next order-4 allocation finds it.
    dev.free(base + 5 * 16 + 15).unwrap();
    assert_eq!(dev.alloc_on(2, 4).unwrap(), base + 5 * 16);
    dev.check_consistency().unwrap();
}

#[test]
fn multi_order_runs_are_aligned_contiguous_and_disjoint() {
    for config in modes() {
        let dev = device(16 * CL, config);
        let mut used = vec![false; (16 * CL) as usize];
        let mut rng = Rng::from_state(0x9e37_79b9_7f4a_7c15);
        for _ in 0..400 {
            let order = [0, 0, 1, 2, 4, 4, 9][rng.below(7) as usize];
            let Ok(slot) = dev.alloc(order) else { continue };
            let nr = 1u64 << order;
            assert_eq!(slot % nr, 0, "order {order} at {slot}");
            assert_eq!(slot / CL, (slot + nr - 1) / CL, "one cluster");
            for s in slot..slot + nr {
                assert!(!used[s as usize], "slot {s} twice");
                used[s as usize] = true;
                assert_eq!(dev.usage(s).unwrap(), 1);
            }
        }
        dev.check_consistency().unwrap();
    }
}

#[test]
fn a_rotational_device_hands_out_slots_in_order_whatever_the_thread() {
    let rot = device(
        4 * CL,
        Config {
            rotational: true,
            ..Config::default()
        },
    );
    let slots: Vec<u64> = (0..100).map(|i| rot.alloc_on(i % 2, 0).unwrap()).collect();
    assert_eq!(slots, (1..101).collect::<Vec<_>>());
    // Solid state: each CPU its own cluster.
    let ssd = device(4 * CL, Config::default());
    let a: Vec<u64> = (0..10).map(|_| ssd.alloc_on(0, 0).unwrap() / CL).collect();
    let b: Vec<u64> = (0..10).map(|_| ssd.alloc_on(1, 0).unwrap() / CL).collect();
    assert!(a.iter().all(|&c| c == a[0]) && b.iter().all(|&c| c == b[0]));
    assert_ne!(a[0], b[0]);
}

#[test]
fn priorities_order_devices_and_a_full_one_leaves_and_comes_back() {
    let swap = Swap::new();
    let config = |priority| Config {
        priority,
        ..Config::default()
    };
    let high = swap.swapon(memory(2 * CL), config(10)).unwrap();
    let b = swap.swapon(memory(8 * CL), config(5)).unwrap();
    let c = swap.swapon(memory(8 * CL), config(5)).unwrap();
    assert_eq!(swap.available(), [high, b, c]);
    let mut on_high = Vec::new();
    for _ in 0..2 * CL - 1 {
        let e = swap.alloc_on(0, 0).unwrap();
        assert_eq!(e.device(), high);
        on_high.push(e);
    }
    // Full: off the list, with its bit set.
    assert!(swap.device(high).unwrap().off_list());
    assert!(!swap.available().contains(&high));
    // Equal priorities take turns cluster by cluster (each new cluster requeues).
    let mut seen = [0u64; 3];
    for cpu in 1..9 {
        let e = swap.alloc_on(cpu, 0).unwrap();
        seen[usize::from(e.device())] += 1;
    }
    assert_eq!(seen[usize::from(high)], 0);
    assert!(
        seen[usize::from(b)] > 0 && seen[usize::from(c)] > 0,
        "{seen:?}"
    );
    // A free puts it back, first in line; a thread that needs a new cluster goes there.
    swap.free(on_high[7]).unwrap();
    assert_eq!(swap.available()[0], high);
    let e = swap.alloc_on(9, 0).unwrap();
    assert_eq!(e, on_high[7]);
    assert!(swap.device(high).unwrap().off_list());
    for d in [high, b, c] {
        swap.device(d).unwrap().check_consistency().unwrap();
    }
    assert!(matches!(
        swap.free(ztier_swap::SwapEntry::new(7, 1)),
        Err(SwapError::NoDevice(7))
    ));
}

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-swap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn discard_punches_holes_in_the_backing_file() {
    for mode in [Mode::Cluster, Mode::Legacy] {
        let path = temp(&format!("discard-{mode:?}"));
        let file = Arc::new(FileDevice::open(&path, 4 * CL * SLOT_BYTES).unwrap());
        let dev = Device::new(
            Arc::clone(&file) as Arc<dyn BlockDevice>,
            Config {
                mode,
                discard: true,
                ..Config::default()
            },
        )
        .unwrap();
        // A whole cluster, written.
        let start = dev.alloc(9).unwrap();
        for s in start..start + CL {
            dev.write_slot(s, &[0xa5; 4096]).unwrap();
        }
        let mut page = vec![0; 4096];
        dev.read_slot(start + 3, &mut page).unwrap();
        assert!(page.iter().all(|&b| b == 0xa5));
        let data = |f: &FileDevice| {
            f.block_status(start * SLOT_BYTES, CL * SLOT_BYTES)
                .unwrap()
                .iter()
                .any(|e| !e.hole)
        };
        assert!(data(&file));
        dev.free_range(start, CL).unwrap();
        // The discard thread punches the hole and frees the cluster.
        let began = std::time::Instant::now();
        while dev.stats().clusters_discarded == 0 {
            assert!(began.elapsed().as_secs() < 10, "never discarded");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        while data(&file) || dev.stats().lists.discard > 0 {
            assert!(began.elapsed().as_secs() < 10, "no hole");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(dev.stats().discard_errors, 0);
        // The header is left alone.
        let mut header = vec![0; 4096];
        file.read_at(0, &mut header).unwrap();
        assert_eq!(&header[4086..], b"SWAPSPACE2");
        dev.check_consistency().unwrap();
        drop(dev);
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn the_header_is_a_linux_swap_header() {
    let backing = memory(3 * CL);
    let dev = Device::new(Arc::clone(&backing), Config::default()).unwrap();
    let mut page = vec![0; 4096];
    backing.read_at(0, &mut page).unwrap();
    assert_eq!(&page[4086..], b"SWAPSPACE2");
    assert_eq!(u32::from_ne_bytes(page[1024..1028].try_into().unwrap()), 1);
    assert_eq!(
        u32::from_ne_bytes(page[1028..1032].try_into().unwrap()) as u64,
        3 * CL - 1,
        "last_page"
    );
    // sws_uuid: a random version-4 id, different for every area of the same size.
    let uuid = dev.uuid();
    assert_eq!(page[1036..1052], uuid);
    assert_eq!(
        (uuid[6] >> 4, uuid[8] >> 6),
        (4, 0b10),
        "version 4, RFC 4122 variant"
    );
    let other = Device::new(memory(3 * CL), Config::default()).unwrap();
    assert_ne!(other.uuid(), uuid);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    for config in modes() {
        let dev = device(2 * CL, config);
        let slot = dev.alloc(0).unwrap();
        assert!(matches!(dev.alloc(10), Err(SwapError::BadOrder(10))));
        assert!(matches!(dev.free(0), Err(SwapError::OutOfRange { .. })));
        assert!(matches!(
            dev.free(2 * CL),
            Err(SwapError::OutOfRange { .. })
        ));
        // Far from it: the legacy mode's cache holds the next 63 slots, allocated.
        let unallocated = slot + 100;
        assert!(matches!(
            dev.free(unallocated),
            Err(SwapError::NotAllocated { .. })
        ));
        assert!(matches!(
            dev.dup(unallocated),
            Err(SwapError::NotAllocated { .. })
        ));
        assert!(matches!(
            dev.free_range(CL - 4, 8),
            Err(SwapError::RangeAcrossClusters { nr: 8, .. })
        ));
        assert!(matches!(
            dev.free_range(unallocated, 2),
            Err(SwapError::NotAllocated { .. })
        ));
        assert!(matches!(
            dev.write_slot(unallocated, &[0; 4096]),
            Err(SwapError::NotAllocated { .. })
        ));
        assert!(matches!(
            dev.write_slot(slot, &[0; 100]),
            Err(SwapError::NotASlotLength { len: 100 })
        ));
        assert_eq!(dev.usage(slot).unwrap(), 1, "{config:?}");
        // References: up to the most a slot holds, then refused.
        for _ in 1..0x3e {
            dev.dup(slot).unwrap();
        }
        assert!(matches!(
            dev.dup(slot),
            Err(SwapError::CountOverflow { .. })
        ));
        for _ in 0..0x3e {
            dev.free(slot).unwrap();
        }
        assert!(
            matches!(dev.free(slot), Err(SwapError::NotAllocated { .. })),
            "double free"
        );
        dev.drain_slot_caches();
        assert_eq!(dev.in_use(), 0);
        // A batch with a bad slot frees the good ones and names the bad.
        let a = dev.alloc(0).unwrap();
        let b = dev.alloc(0).unwrap();
        let err = dev.free_batch(&mut [a, b, b]).unwrap_err();
        assert!(matches!(err, SwapError::NotAllocated { offset } if offset == b));
        dev.drain_slot_caches();
        assert_eq!(dev.in_use(), 0);
        dev.check_consistency().unwrap();
    }
    assert!(matches!(
        Device::new(memory(1), Config::default()),
        Err(SwapError::TooFewSlots { .. })
    ));
}

/// Many threads allocating and freeing, orders 0 and 2, with the discard thread running
/// beside them: no slot is ever held by two, and everything adds up after.
#[test]
fn threads_never_share_a_slot() {
    for mode in [Mode::Cluster, Mode::Legacy] {
        for discard in [false, true] {
            let dev = device(
                16 * CL,
                Config {
                    mode,
                    discard,
                    ..Config::default()
                },
            );
            let owned: Vec<AtomicBool> = (0..16 * CL).map(|_| AtomicBool::new(false)).collect();
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let (dev, owned) = (&dev, &owned);
                    s.spawn(move || {
                        let mut held: Vec<(u64, u32)> = Vec::new();
                        let mut rng = Rng::new(t);
                        for _ in 0..20_000 {
                            let r = rng.next_u64();
                            if held.len() < 300 && !r.is_multiple_of(3) {
                                let order = if r.is_multiple_of(5) { 2 } else { 0 };
                                if let Ok(slot) = dev.alloc(order) {
                                    for s in slot..slot + (1 << order) {
                                        let was = owned[s as usize].swap(true, Ordering::AcqRel);
                                        assert!(!was, "slot {s} handed out twice");
                                    }
                                    held.push((slot, order));
                                }
                            } else if !held.is_empty() {
                                let (slot, order) = held.swap_remove(r as usize % held.len());
                                for s in slot..slot + (1 << order) {
                                    owned[s as usize].store(false, Ordering::Release);
                                }
                                if order == 0 {
                                    dev.free(slot).unwrap();
                                } else {
                                    dev.free_range(slot, 1 << order).unwrap();
                                }
                            }
                        }
                        for (slot, order) in held {
                            for s in slot..slot + (1 << order) {
                                owned[s as usize].store(false, Ordering::Release);
                            }
                            dev.free_range(slot, 1 << order).unwrap();
                        }
                    });
                }
            });
            dev.drain_slot_caches();
            assert_eq!(dev.in_use(), 0, "{mode:?} discard {discard}");
            while dev.discard_now() {}
            dev.check_consistency().unwrap();
        }
    }
}

/// A free into the cluster a thread is allocating from: under the kernel's list policy it
/// moves the cluster to nonfull and the thread's next allocation moves it back (two
/// device-lock acquisitions); under ztier's it stays where it is (none).
#[test]
fn a_free_into_a_threads_cluster_moves_it_only_under_the_kernels_policy() {
    use ztier_swap::ListPolicy;
    for (policy, expected) in [(ListPolicy::Ztier, 0), (ListPolicy::Kernel, 2)] {
        let dev = device(
            4 * CL,
            Config {
                policy,
                ..Config::default()
            },
        );
        let a = dev.alloc_on(0, 0).unwrap();
        dev.alloc_on(0, 0).unwrap();
        // stats() takes the device lock twice itself (list lengths, fragmentation).
        let device_lock = || dev.stats().locks[0].acquisitions;
        let before = device_lock();
        dev.free(a).unwrap();
        assert_eq!(dev.alloc_on(0, 0).unwrap() / CL, a / CL);
        assert_eq!(device_lock() - before - 2, expected, "{policy:?}");
        dev.check_consistency().unwrap();
    }
}

/// ztier's list policy keeps a full cluster on the full list until half of it is free (a
/// free and the allocation that fills the hole would otherwise move it twice for one slot);
/// those holes are the last resort of order-0 allocation, filled in place with no list move
/// and no device lock, so nothing free is ever out of reach.
#[test]
fn holes_in_full_clusters_stay_put_and_are_filled_in_place() {
    let dev = device(4 * CL, Config::default());
    let mut all = Vec::new();
    while let Ok(slot) = dev.alloc(0) {
        all.push(slot);
    }
    assert_eq!(all.len() as u64, 4 * CL - 1, "every slot but the header");
    let full_before = dev.stats().lists.full;
    let acquisitions = |d: &Device| {
        d.stats()
            .locks
            .iter()
            .find(|l| l.name.starts_with("si->lock"))
            .unwrap()
            .acquisitions
    };
    let before = acquisitions(&dev);
    // A few holes in every cluster: no list moves.
    let holes: Vec<u64> = all.iter().copied().filter(|s| s % 64 == 7).collect();
    for &s in &holes {
        dev.free(s).unwrap();
    }
    // (stats() itself takes the device lock: count from the reading before.)
    let s = dev.stats();
    assert_eq!(s.lists.full, full_before, "{:?}", s.lists);
    let moved = acquisitions(&dev) - before;
    assert!(
        moved <= 4,
        "frees into full clusters moved them: {moved} acquisitions"
    );
    dev.check_consistency().unwrap();
    // Nothing else is free: order 0 finds every hole, then the device is full; none of it
    // takes the device lock.
    let extra = all[(2 * CL + 100) as usize];
    dev.free(extra).unwrap();
    let before = acquisitions(&dev);
    let mut refilled: Vec<u64> = (0..=holes.len()).map(|_| dev.alloc(0).unwrap()).collect();
    assert!(dev.alloc(0).is_err());
    assert_eq!(
        acquisitions(&dev) - before,
        2,
        "filling holes moved clusters (stats() takes the lock twice)"
    );
    assert_eq!(dev.stats().lists.full, full_before);
    refilled.sort_unstable();
    let mut expected = holes.clone();
    expected.push(extra);
    expected.sort_unstable();
    assert_eq!(refilled, expected);
    dev.check_consistency().unwrap();
    // Half free: the cluster leaves the full list for nonfull.
    for &s in all.iter().filter(|&&s| s / CL == 2).take(CL as usize / 2) {
        dev.free(s).unwrap();
    }
    assert_eq!(dev.stats().lists.nonfull[0], 1);
    dev.check_consistency().unwrap();
}

/// Under ztier's list policy a thread whose cursor reaches the end of its cluster starts
/// over in it when the frees behind the cursor left the room its order needs on the nonfull
/// list (a quarter free for order 0): no free announces that room (the threshold was
/// crossed while the cluster was the thread's), so leaving it would strand it half empty on
/// the frag list while the thread took a fresh cluster. The kernel's policy leaves it (any
/// later free sends it to nonfull).
#[test]
fn a_thread_starts_over_in_its_cluster_when_frees_behind_the_cursor_left_room() {
    use ztier_swap::ListPolicy;
    for (policy, stays) in [(ListPolicy::Ztier, true), (ListPolicy::Kernel, false)] {
        for mode in [Mode::Cluster, Mode::Legacy] {
            let dev = device(
                4 * CL,
                Config {
                    mode,
                    policy,
                    ..Config::default()
                },
            );
            // Order 4 goes through no slot cache in either mode: the cursor is the thread's.
            let runs: Vec<u64> = (0..24).map(|_| dev.alloc_on(0, 4).unwrap()).collect();
            let cluster = runs[0] / CL;
            assert!(runs.iter().all(|r| r / CL == cluster), "{runs:?}");
            // Half the runs behind the cursor come free, then the cursor reaches the end.
            for &r in &runs[..16] {
                dev.free_range(r, 16).unwrap();
            }
            let left = (CL - runs.iter().map(|r| r % CL + 16).max().unwrap()) / 16;
            for _ in 0..left {
                assert_eq!(dev.alloc_on(0, 4).unwrap() / CL, cluster);
            }
            let free_before = dev.stats().lists.free;
            let next = dev.alloc_on(0, 4).unwrap();
            assert_eq!(next / CL == cluster, stays, "{policy:?} {mode:?}");
            assert_eq!(
                dev.stats().lists.free,
                free_before - u64::from(!stays),
                "{policy:?} {mode:?}"
            );
            dev.check_consistency().unwrap();
        }
    }
}

/// Threads share the current clusters by index (`ztier_base::shard`): however many threads
/// allocate, at most `SHARDS` clusters per order are some thread's current one, so 64
/// threads hold no more of the device than 16 do.
#[test]
fn current_clusters_are_bounded_by_the_shards_whatever_the_threads() {
    use ztier_base::shard::SHARDS;
    let dev = device(64 * CL, Config::default());
    let start = std::sync::Barrier::new(64);
    let slots: Vec<u64> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..64)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    (0..8).map(|_| dev.alloc(0).unwrap()).collect::<Vec<u64>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let clusters: HashSet<u64> = slots.iter().map(|s| s / CL).collect();
    assert_eq!(slots.len(), 64 * 8);
    assert!(clusters.len() <= SHARDS, "{} clusters", clusters.len());
    dev.check_consistency().unwrap();
}

/// The free list keeps the kernel's order across the table's chunks, whose clusters are
/// made only as they are first used: fresh clusters in ascending order, then those freed,
/// in the order they were freed; in both modes, discarding or not.
#[test]
fn fresh_clusters_go_in_ascending_order_and_freed_ones_after_them() {
    let clusters = 300; // over three chunks of the allocator's table
    for mode in modes() {
        for discard in [false, true] {
            let config = Config { discard, ..mode };
            let dev = device(clusters * CL, config);
            let cluster = |dev: &Device| dev.alloc_on(0, 9).unwrap() / CL;
            let first: Vec<u64> = (0..130).map(|_| cluster(&dev)).collect();
            assert_eq!(first, (1..=130).collect::<Vec<_>>(), "{config:?}");
            for c in [5u64, 129, 7] {
                dev.free_range(c * CL, CL).unwrap();
            }
            dev.discard_now();
            dev.check_consistency().unwrap();
            let rest: Vec<u64> = (0..clusters - 131 + 3).map(|_| cluster(&dev)).collect();
            let expected: Vec<u64> = (131..clusters).chain([5, 129, 7]).collect();
            assert_eq!(rest, expected, "{config:?}");
            assert!(matches!(dev.alloc_on(0, 9), Err(SwapError::Full { .. })));
            dev.check_consistency().unwrap();
        }
    }
}

/// A device over a size that ends inside a cluster keeps that cluster (its slots past the
/// end never handed out) on the nonfull list from the start, as the kernel does: order 0
/// takes it right after the header's, however far it lies.
#[test]
fn the_cluster_past_the_end_is_on_the_nonfull_list_from_the_start() {
    let slots = 300 * CL + 10;
    let dev = device(slots, Config::default());
    dev.check_consistency().unwrap();
    assert_eq!(dev.stats().lists.nonfull[0], 2, "{:?}", dev.stats().lists);
    // The header's cluster's 511 slots, then the last cluster's 10.
    let taken: Vec<u64> = (0..CL - 1 + 10)
        .map(|_| dev.alloc_on(0, 0).unwrap())
        .collect();
    assert!(taken[..CL as usize - 1].iter().all(|&s| s < CL));
    assert!(
        taken[CL as usize - 1..]
            .iter()
            .all(|&s| (300 * CL..slots).contains(&s)),
        "{:?}",
        &taken[CL as usize - 1..]
    );
    assert_eq!(
        dev.alloc_on(0, 0).unwrap() / CL,
        1,
        "then the free list's head"
    );
    dev.check_consistency().unwrap();
}
