//! Metadata that follows use: the slot table costs memory where pages are stored, and the
//! table's pages a discard (or a reset) empties go back to the OS; a backing store's tables
//! (its live counts, the allocator's slot map) cost memory as it is used; the kernel's
//! figures do not change.

use std::sync::Arc;

use ztier_blockdev::file::FileDevice;
use ztier_compress::Algorithm;
use ztier_pool::testing::pattern;
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

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

/// The passes over the whole disk (choosing secondary algorithms, marking idle,
/// recompression, writeback, a save) look only at the table's pages ever written: not even
/// a read of the rest, which would map the zero page 65,536 times on a 64 GiB disk, on
/// every pass a host's policy makes over every device.
#[test]
fn passes_over_the_disk_look_only_where_pages_were_written() {
    let dir = std::env::temp_dir().join(format!("ztier-passes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = device(64 << 30);
    let store =
        Arc::new(FileDevice::open(&dir.join("store"), Backing::size_for(64 << 30)).unwrap());
    d.set_backing(Some(Backing::new(store, WbFormat::Page).unwrap()))
        .unwrap();
    let spread = [3u64, 5 << 20, (16 << 20) - 1];
    for (i, &index) in spread.iter().enumerate() {
        d.write_page(index, &pattern(i as u64, 4096)).unwrap();
    }
    let faults = |what: &str, pass: &dyn Fn()| {
        let before = ztier_base::sched::minor_faults().unwrap();
        pass();
        let taken = ztier_base::sched::minor_faults().unwrap() - before;
        // A walk of every slot: 65,536 table pages.
        assert!(taken < 4096, "{what}: {taken} minor faults");
    };
    faults("secondary algorithms", &|| {
        d.set_recomp_algorithms(vec!["zstd".parse().unwrap()])
            .unwrap()
    });
    faults("idle marking", &|| assert_eq!(d.mark_idle(None), 3));
    faults("recompression", &|| {
        d.store_attr("recompress", "type=idle").unwrap();
    });
    faults("a save", &|| {
        let mut saved = Vec::new();
        assert_eq!(d.save_state(&mut saved).unwrap().pages, 3);
    });
    faults("writeback", &|| {
        let done = d.writeback(PageSelector::Idle, None, None).unwrap();
        assert_eq!(done.pages, 3);
    });
    let mut back = vec![0u8; 4096];
    for (i, &index) in spread.iter().enumerate() {
        d.read_page(index, &mut back).unwrap();
        assert!(back == pattern(i as u64, 4096), "page {index}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A 64 GiB store costs its clusters' states, not its size, until pages are written back to
/// it; the allocator's maps of the clusters used go back when their pages are discarded (or
/// reset), and the whole store's tables when it is detached.
#[test]
fn a_stores_tables_follow_its_use() {
    let dir = std::env::temp_dir().join(format!("ztier-metadata-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store");
    let d = device(64 << 30);
    let before_store = d.metadata_bytes();
    let size = Backing::size_for(64 << 30);
    let store = Arc::new(FileDevice::open(&path, size).unwrap());
    d.set_backing(Some(Backing::new(store, WbFormat::Page).unwrap()))
        .unwrap();
    let attached = d.metadata_bytes() - before_store;
    // Whole, its 16 Mi slots' map alone is 16 MiB, their live counts 64 MiB.
    let whole = ztier_swap::Device::slot_map_bytes(size);
    assert!(
        attached <= whole / 8,
        "{attached} bytes for an unused 64 GiB store (whole: {whole})"
    );
    // 4,096 pages written back: 8 clusters' maps and 16 KiB of live counts at least.
    for i in 0..4096u64 {
        d.write_page(i * 64, &pattern(i, 4096)).unwrap();
    }
    d.store_attr("idle", "all").unwrap();
    d.store_attr("writeback", "idle").unwrap();
    assert_eq!(d.bd_stat().unwrap().bd_count, 4096);
    let used = d.metadata_bytes() - before_store;
    assert!(
        used >= attached + 8 * 512 + (16 << 10),
        "{used} bytes with 4,096 pages on the store (unused: {attached})"
    );
    let mut back = vec![0u8; 4096];
    d.read_page(64 * 17, &mut back).unwrap();
    assert!(back == pattern(17, 4096));
    // Every page discarded: the clusters' maps go back (the counts' pages, 16 KiB, stay).
    d.discard(0, 64 << 30).unwrap();
    let discarded = d.metadata_bytes() - before_store.min(d.metadata_bytes());
    assert!(
        discarded <= attached + (16 << 10) + (8 << 10),
        "{discarded} bytes after every page was discarded (unused: {attached})"
    );
    d.reset();
    let reset = d.metadata_bytes();
    assert!(
        reset <= before_store + attached + (24 << 10),
        "{reset} bytes after a reset (unused: {attached})"
    );
    d.set_backing(None).unwrap();
    let detached = d.metadata_bytes();
    assert!(
        detached <= 64 << 10,
        "{detached}: a store detached gives its tables back"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
