//! Devices in one memory group share its limit: a write that would take the group's pools
//! past it fails (ENOSPC through the block-device trait) on whichever device makes it, and
//! leaves that page as it was; pages freed on any member (discard, compaction, a device
//! dropped) make room for the others; each device's own `mem_limit` still holds.

use std::sync::Arc;

use ztier_compress::Algorithm;
use ztier_pool::testing::pattern;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Device, MemoryGroup, ZramError};

fn device(pages: u64) -> Device {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    Device::new(
        pages * 4096,
        "lz4".parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap()
}

/// Incompressible pages: each takes a whole page of pool.
fn page(seed: u64) -> Vec<u8> {
    pattern(seed, 4096)
}

/// Writes pages from `first` until one fails; returns how many were written and the error.
fn fill(dev: &Device, first: u64, pages: u64) -> (u64, Option<ZramError>) {
    for i in 0..pages {
        if let Err(e) = dev.write_page(first + i, &page(first + i)) {
            return (i, Some(e));
        }
    }
    (pages, None)
}

#[test]
fn members_share_the_group_limit() {
    let group = Arc::new(MemoryGroup::new(2 << 20));
    let (a, b) = (device(4096), device(4096));
    a.join_group(Arc::clone(&group)).unwrap();
    b.join_group(Arc::clone(&group)).unwrap();
    assert!(matches!(
        b.join_group(Arc::clone(&group)),
        Err(ZramError::AlreadyInGroup)
    ));

    // A alone fills the group.
    let (written, err) = fill(&a, 0, 4096);
    assert!(matches!(err, Some(ZramError::GroupLimit { .. })), "{err:?}");
    assert!(
        written > 300 && written < 520,
        "{written} pages of 4 KiB in 2 MiB"
    );
    assert!(group.used_bytes() <= 2 << 20);
    assert_eq!(group.used_bytes(), a.mm_stat().mem_used_total);

    // B cannot write: the group is full, not B. The page it tried is as it was (empty).
    let e = b.write_page(7, &page(7)).unwrap_err();
    assert!(matches!(e, ZramError::GroupLimit { .. }), "{e}");
    let mut back = vec![1u8; 4096];
    b.read_page(7, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 0));

    // A discards half of its pages: B can write about as many.
    a.discard(0, written / 2 * 4096).unwrap();
    a.compact();
    let (b_written, err) = fill(&b, 0, 4096);
    assert!(matches!(err, Some(ZramError::GroupLimit { .. })));
    assert!(
        b_written + 16 >= written / 2,
        "{b_written} written after {} freed",
        written / 2
    );
    assert_eq!(
        group.used_bytes(),
        a.mm_stat().mem_used_total + b.mm_stat().mem_used_total
    );

    // A dropped: its pages leave the group's sum.
    let b_used = b.mm_stat().mem_used_total;
    drop(a);
    assert_eq!(group.used_bytes(), b_used);
    let (more, _) = fill(&b, b_written, 64);
    assert_eq!(more, 64, "room again after a member went");
}

#[test]
fn a_device_limit_still_holds_inside_a_group() {
    let group = Arc::new(MemoryGroup::new(64 << 20));
    let dev = device(4096);
    dev.join_group(Arc::clone(&group)).unwrap();
    dev.set_mem_limit(1 << 20);
    let (_, err) = fill(&dev, 0, 4096);
    assert!(matches!(err, Some(ZramError::MemLimit { .. })), "{err:?}");
    assert!(group.used_bytes() <= (1 << 20) + 4096);
}

#[test]
fn reports_from_many_threads_keep_the_sum_exact() {
    let group = Arc::new(MemoryGroup::new(0));
    let devices: Vec<Arc<Device>> = (0..4).map(|_| Arc::new(device(2048))).collect();
    for d in &devices {
        d.join_group(Arc::clone(&group)).unwrap();
    }
    std::thread::scope(|s| {
        for (t, d) in devices.iter().enumerate() {
            for half in 0..2u64 {
                let d = Arc::clone(d);
                s.spawn(move || {
                    for i in 0..512u64 {
                        let index = half * 1024 + i;
                        d.write_page(index, &page(t as u64 * 10_000 + index))
                            .unwrap();
                        if i % 3 == 0 {
                            d.discard_page(index).unwrap();
                        }
                    }
                    d.compact();
                });
            }
        }
    });
    for d in &devices {
        d.report_to_group();
    }
    let sum: u64 = devices.iter().map(|d| d.mm_stat().mem_used_total).sum();
    assert_eq!(group.used_bytes(), sum);
}
