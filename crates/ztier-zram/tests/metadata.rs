//! Metadata that follows use: the slot table costs memory where pages are stored, and the
//! table's pages a discard (or a reset) empties go back to the OS; the kernel's figures do
//! not change.

use std::sync::Arc;

use ztier_compress::Algorithm;
use ztier_pool::testing::pattern;
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zram::Device;

fn device(size: u64) -> Arc<Device> {
    let pool = AllocatorKind::Zsmalloc
        .make_pool(&ZsConfig::default())
        .unwrap();
    Arc::new(Device::new(size, "lz4".parse::<Algorithm>().unwrap(), pool).unwrap())
}

#[test]
fn the_slot_table_grows_with_use_and_shrinks_with_discards() {
    let d = device(64 << 30);
    let untouched = d.metadata_bytes();
    assert!(untouched <= 64 << 10, "{untouched} bytes before any write");
    // 64 MiB of pages spread over the first 1 GiB: 16,384 slots, 256 KiB of table.
    let page = pattern(3, 4096);
    for i in 0..16_384u64 {
        d.write_page(i * 16, &page).unwrap();
    }
    let written = d.metadata_bytes();
    // Every 16th slot is written, so every page of the table over the first 1 GiB is.
    assert!(
        written >= 4 << 20,
        "{written} bytes with 16,384 pages over 1 GiB"
    );
    let mm_before = d.mm_stat();
    // The second half discarded: its table pages go back; the first half's stay.
    d.discard(512 << 20, 512 << 20).unwrap();
    let half = d.metadata_bytes();
    assert!(
        half <= written / 2 + (64 << 10),
        "{half} bytes after half was discarded (was {written})"
    );
    assert!(
        half >= written / 2 - (64 << 10),
        "{half}: the first half stays"
    );
    let mut back = vec![0u8; 4096];
    for i in (0..8192u64).step_by(97) {
        d.read_page(i * 16, &mut back).unwrap();
        assert!(
            back == page,
            "page {i} reads back after its neighbours' table went"
        );
    }
    // Written again after its table page went back: the page comes back, the slot works.
    d.write_page((512 << 20) / 4096, &page).unwrap();
    d.read_page((512 << 20) / 4096, &mut back).unwrap();
    assert!(back == page);
    // The kernel's figures are the pages', not the table's.
    let mm = d.mm_stat();
    assert_eq!(mm.orig_data_size, (8192 + 1) * 4096);
    assert!(mm.mem_used_total <= mm_before.mem_used_total);
    d.reset();
    assert!(
        d.metadata_bytes() <= 64 << 10,
        "a reset gives the table back"
    );
}

/// Discards and writes racing over the same table pages: nothing written is lost to a
/// give-back.
#[test]
fn a_give_back_never_loses_a_racing_write() {
    let d = device(256 << 20);
    let rounds = 200u64;
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let d = Arc::clone(&d);
            s.spawn(move || {
                let mut back = vec![0u8; 4096];
                for r in 0..rounds {
                    // Thread t owns the even or odd table pages' worth of slots (256 a page).
                    let base = (r % 32) * 512 + t * 256;
                    for i in 0..256 {
                        d.write_page(base + i, &pattern(base + i + r, 4096))
                            .unwrap();
                    }
                    for i in 0..256 {
                        d.read_page(base + i, &mut back).unwrap();
                        assert!(back == pattern(base + i + r, 4096), "slot {}", base + i);
                    }
                    d.discard((base) * 4096, 256 * 4096).unwrap();
                }
            });
        }
    });
    assert_eq!(d.mm_stat().orig_data_size, 0);
}

/// A scan over the whole disk (recompression's, idle marking) passes empty slots by
/// without writing their table pages: an empty 64 GiB device stays cheap.
#[test]
fn scans_of_an_empty_disk_bring_in_no_table() {
    let d = device(64 << 30);
    d.set_recomp_algorithms(vec!["zstd".parse().unwrap()])
        .unwrap();
    d.write_page(7, &pattern(1, 4096)).unwrap();
    d.store_attr("idle", "all").unwrap();
    d.store_attr("recompress", "type=idle").unwrap();
    let held = d.metadata_bytes();
    assert!(held <= 64 << 10, "{held} bytes of table after the scans");
}
