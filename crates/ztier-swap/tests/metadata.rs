//! What a device's allocator tables cost before and as it is used, alone in its process so
//! that no other test's memory is counted: a 64 GiB device (32,768 clusters) holds its
//! chunks' directory and its first chunk until slots are allocated, not a state, lock,
//! published word and list node for every cluster (~1.5 MiB), and allocations make only the
//! chunks of the clusters they use.

use std::sync::Arc;

use ztier_blockdev::file::FileDevice;
use ztier_swap::{Config, Device, SLOT_BYTES, SWAPFILE_CLUSTER};

const CL: u64 = SWAPFILE_CLUSTER as u64;
const SIZE: u64 = 64 << 30;

fn rss() -> u64 {
    ztier_base::os::process_rss_bytes().expect("/proc/self/statm")
}

#[test]
fn a_64_gib_device_holds_only_the_tables_of_the_clusters_it_uses() {
    let dir = std::env::temp_dir().join(format!("ztier-swap-metadata-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A sparse file: nothing of it is written but the header.
    let backing = Arc::new(FileDevice::open(&dir.join("store"), SIZE).unwrap());
    // Whatever a first device makes once per process (the thread's shard, the random id's
    // source) is made before the measure.
    drop(Device::new(
        Arc::new(FileDevice::open(&dir.join("warm"), 64 * CL * SLOT_BYTES).unwrap()),
        Config::default(),
    ));

    let before = rss();
    let dev = Device::new(backing, Config::default()).unwrap();
    let made = rss().saturating_sub(before);
    let tables = dev.slot_map_resident_bytes();
    let whole = Device::slot_map_bytes(SIZE) - 32_768 * CL;
    eprintln!(
        "a 64 GiB device: {} KiB of RSS made, its tables {} KiB (every cluster's: {} KiB)",
        made >> 10,
        tables >> 10,
        whole >> 10
    );
    // Its tables: the directory (a few words per 128 clusters: ~12 KiB) and the first
    // chunk's clusters (~6 KiB, with the header's map); the rest is the device itself (its
    // shards, the header written). 64 KiB: 256 such devices in 16 MiB.
    assert!(tables <= 32 << 10, "{tables} bytes of tables before use");
    assert!(
        made <= 64 << 10,
        "{made} bytes of RSS for an unused 64 GiB device"
    );

    // 200 whole clusters (1..=200: the first two chunks) and a cluster's single slots.
    let before = rss();
    let runs: Vec<u64> = (0..200).map(|_| dev.alloc(9).unwrap()).collect();
    assert_eq!(runs.last(), Some(&(200 * CL)), "taken in ascending order");
    let singles: Vec<u64> = (0..CL).map(|_| dev.alloc(0).unwrap()).collect();
    let grown = rss().saturating_sub(before);
    let used = dev.slot_map_resident_bytes() - tables;
    eprintln!(
        "201 clusters used: {} KiB more RSS, tables {} KiB more",
        grown >> 10,
        used >> 10
    );
    // Two chunks made at most (the second's states and nodes, ~6 KiB) and each used
    // cluster's map: ~110 KiB, against ~1.5 MiB for every cluster's states.
    assert!(
        used <= (6 << 10) + 201 * CL,
        "{used} bytes of tables for 201 clusters"
    );
    assert!(used < whole / 8, "{used} of {whole}");
    // The RSS grows by those and the lists' bookkeeping, in whole pages.
    assert!(
        grown <= used + (64 << 10),
        "{grown} bytes of RSS for {used} of tables"
    );
    dev.check_consistency().unwrap();
    let held = dev.slot_map_resident_bytes();
    let mut all: Vec<u64> = runs
        .iter()
        .flat_map(|&first| first..first + CL)
        .chain(singles)
        .collect();
    dev.free_batch(&mut all).unwrap();
    assert_eq!(dev.in_use(), 0);
    // The 201 maps go back as their clusters empty (the header's stays); the chunks stay
    // until the device goes.
    assert_eq!(
        dev.slot_map_resident_bytes(),
        held - 201 * CL,
        "maps given back"
    );
    dev.check_consistency().unwrap();
    drop(dev);
    std::fs::remove_dir_all(&dir).unwrap();
}
