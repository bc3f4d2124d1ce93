//! `Device::reopen`: a device over an area a first device formatted and allocated from, with
//! exactly the runs it is told are in use. Checked against a model (the set of used slots)
//! under random runs of mixed orders and frees: the same id and stamp, every used slot
//! allocated and no other, every invariant of the clusters and lists (`check_consistency`),
//! and the reopened device hands out only free slots until it is full. Bad headers and bad
//! runs are refused with the reason, and nothing is written.

use std::collections::BTreeSet;
use std::sync::Arc;

use proptest::prelude::*;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_swap::{Config, Device, NotTheArea, SwapError, SLOT_BYTES, SWAPFILE_CLUSTER};

const CL: u64 = SWAPFILE_CLUSTER as u64;

fn memory(slots: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemoryDevice::new(slots * SLOT_BYTES).unwrap())
}

fn config(discard: bool) -> Config {
    Config {
        discard,
        ..Config::default()
    }
}

/// Allocates runs of the orders given, frees every `free_every`-th, and returns the live
/// runs with the slots they cover.
fn fill(dev: &Device, orders: &[u32], free_every: usize) -> (Vec<(u64, u32)>, BTreeSet<u64>) {
    let mut runs = Vec::new();
    for &o in orders {
        match dev.alloc(o) {
            Ok(first) => runs.push((first, o)),
            Err(SwapError::Full { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let mut live = Vec::new();
    for (i, &(first, o)) in runs.iter().enumerate() {
        if free_every > 0 && i % free_every == 0 {
            dev.free_range(first, 1 << o).unwrap();
        } else {
            live.push((first, o));
        }
    }
    let slots = live
        .iter()
        .flat_map(|&(f, o)| f..f + (1 << o))
        .collect::<BTreeSet<_>>();
    (live, slots)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_reopened_device_holds_exactly_the_runs_it_was_given(
        orders in proptest::collection::vec(prop_oneof![Just(0u32), Just(2), Just(4)], 1..600),
        free_every in 0usize..5,
        slots in (3 * CL..6 * CL),
    ) {
        let backing = memory(slots);
        let first = Device::new(Arc::clone(&backing), config(false)).unwrap();
        let (runs, used) = fill(&first, &orders, free_every);
        first.set_stamp([7; 16]).unwrap();
        let uuid = first.uuid();
        drop(first);

        let dev = Device::reopen(Arc::clone(&backing), config(true), &runs).unwrap();
        prop_assert_eq!(dev.uuid(), uuid);
        prop_assert_eq!(dev.stamp(), [7; 16]);
        prop_assert_eq!(dev.in_use(), used.len() as u64);
        dev.check_consistency()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for slot in 1..slots {
            let want = u8::from(used.contains(&slot));
            prop_assert_eq!(dev.usage(slot).unwrap(), want, "slot {}", slot);
        }
        // Every allocation after it lands on free slots only, until the device is full.
        let mut taken = used.clone();
        for o in [4u32, 0, 2].into_iter().cycle().take(3 * slots as usize) {
            match dev.alloc(o) {
                Ok(f) => {
                    for s in f..f + (1 << o) {
                        prop_assert!(taken.insert(s), "slot {} handed out twice", s);
                    }
                }
                Err(SwapError::Full { order: 0 }) => break,
                Err(SwapError::Full { .. }) => {}
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            }
        }
        prop_assert_eq!(taken.len() as u64, slots - 1, "order 0 fills the device");
        dev.check_consistency()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // A run given back frees its slots as any run does.
        if let Some(&(f, o)) = runs.first() {
            dev.free_range(f, 1 << o).unwrap();
            prop_assert_eq!(dev.usage(f).unwrap(), 0);
            dev.check_consistency()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
}

#[test]
fn bad_headers_and_runs_are_refused_and_nothing_is_written() {
    let backing = memory(4 * CL);
    let first = Device::new(Arc::clone(&backing), config(false)).unwrap();
    let a = first.alloc(4).unwrap();
    drop(first);
    let mut before = vec![0u8; (4 * CL * SLOT_BYTES) as usize];
    backing.read_at(0, &mut before).unwrap();
    let refused = |runs: &[(u64, u32)], why: &str| {
        let e = Device::reopen(Arc::clone(&backing), config(false), runs)
            .err()
            .unwrap_or_else(|| panic!("reopened with {runs:?}"));
        assert!(e.to_string().contains(why), "{e}");
    };
    refused(&[(a + 1, 4)], "not an aligned run");
    refused(&[(0, 0)], "not an aligned run");
    refused(&[(4 * CL - 8, 4)], "not an aligned run");
    refused(&[(a, 4), (a, 0)], "overlaps");
    refused(&[(a, 12)], "order 12");
    let mut after = vec![0u8; before.len()];
    backing.read_at(0, &mut after).unwrap();
    assert!(after == before, "a refused reopen wrote to the area");

    // Another size: the header says so. No header: never a store.
    let bigger = memory(5 * CL);
    bigger
        .write_at(0, &before[..SLOT_BYTES as usize], false)
        .unwrap();
    let e = Device::reopen(bigger, config(false), &[]).err().unwrap();
    assert!(e.to_string().contains("an area of"), "{e}");
    assert!(
        matches!(
            e,
            SwapError::NotTheArea(NotTheArea::OtherSize { area_slots, slots })
                if area_slots == 4 * CL && slots == 5 * CL
        ),
        "{e:?}"
    );
    let e = Device::reopen(memory(4 * CL), config(false), &[])
        .err()
        .unwrap();
    assert!(e.to_string().contains("not a Linux swap header"), "{e}");
    assert!(
        matches!(e, SwapError::NotTheArea(NotTheArea::NoSwapHeader)),
        "{e:?}"
    );
    // And the good one still opens.
    let dev = Device::reopen(Arc::clone(&backing), config(false), &[(a, 4)]).unwrap();
    assert_eq!(dev.in_use(), 16);
    assert_eq!(dev.stamp(), [0; 16]);
}

#[test]
fn runs_read_and_written_together_are_the_slots_bytes() {
    let dev = Device::new(memory(2 * CL), config(false)).unwrap();
    let runs: Vec<u64> = (0..6).map(|_| dev.alloc(4).unwrap()).collect();
    let data: Vec<Vec<u8>> = (0..6u8)
        .map(|i| vec![i + 1; 16 * SLOT_BYTES as usize])
        .collect();
    let writes: Vec<(u64, &[u8])> = runs.iter().zip(&data).map(|(&f, d)| (f, &d[..])).collect();
    dev.write_runs(&writes).unwrap();
    let mut bufs = vec![vec![0u8; 100]; 6];
    let mut reads: Vec<(u64, usize, &mut [u8])> = runs
        .iter()
        .zip(bufs.iter_mut())
        .map(|(&f, b)| (f, 5000, &mut b[..]))
        .collect();
    dev.read_runs(&mut reads).unwrap();
    for (i, b) in bufs.iter().enumerate() {
        assert!(b.iter().all(|&x| x == i as u8 + 1));
    }
    // A run not allocated is refused before anything is read or written.
    let free = runs[5] + 16;
    assert!(matches!(
        dev.write_runs(&[(runs[0], &data[0][..]), (free, &data[1][..])]),
        Err(SwapError::NotAllocated { .. })
    ));
}

#[test]
fn reopened_runs_freed_are_handed_out_again() {
    for (order, discard) in [(0u32, true), (0, false), (4, true)] {
        let backing = memory(7 * CL);
        let first = Device::new(Arc::clone(&backing), config(discard)).unwrap();
        let mut runs = Vec::new();
        while let Ok(f) = first.alloc(order) {
            runs.push((f, order));
            if runs.len() as u64 * (1 << order) >= 5 * CL {
                break;
            }
        }
        // Every third run freed before the reopen: clusters partly used.
        let mut kept = Vec::new();
        for (i, &(f, o)) in runs.iter().enumerate() {
            if i % 3 == 0 {
                first.free_range(f, 1 << o).unwrap();
            } else {
                kept.push((f, o));
            }
        }
        let runs = kept;
        drop(first);
        let dev = Device::reopen(Arc::clone(&backing), config(discard), &runs).unwrap();
        for &(f, o) in &runs {
            dev.free_range(f, 1 << o).unwrap();
        }
        // check_consistency is exact only with nothing else running: the discard worker's pass over
        // the clusters just freed done first (it failed about one run in twenty otherwise).
        while dev.discard_now() {}
        dev.check_consistency().unwrap();
        assert_eq!(dev.in_use(), 0);
        let mut n = 0;
        while dev.alloc(order).is_ok() {
            n += 1 << order;
        }
        assert!(
            n >= 5 * CL,
            "order {order} discard {discard}: {n} slots handed out again"
        );
    }
}

/// Reopened with runs far apart (over several chunks of the allocator's table), the free
/// clusters are taken in ascending order, those between the runs first, as the kernel
/// fills its free list at swapon.
#[test]
fn free_clusters_between_reopened_runs_go_in_ascending_order() {
    let clusters = 400;
    let backing = memory(clusters * CL);
    drop(Device::new(Arc::clone(&backing), config(false)).unwrap());
    let used = [(2 * CL, 9), (200 * CL + 3, 0), (300 * CL, 9)];
    let dev = Device::reopen(backing, config(false), &used).unwrap();
    dev.check_consistency().unwrap();
    let taken: Vec<u64> = (0..clusters - 4)
        .map(|_| dev.alloc_on(0, 9).unwrap() / CL)
        .collect();
    let expected: Vec<u64> = (1..clusters)
        .filter(|c| ![2, 200, 300].contains(c))
        .collect();
    assert_eq!(taken, expected);
    dev.check_consistency().unwrap();
}
