//! Devices of large compression units (16 and 64 KiB) with what the page-by-page device has
//! beside its pool: writeback of whole units to a backing store in each format, and their
//! reads back; recompression of whole units; saved states of units, in the pool,
//! same-filled and on the store.
//!
//! Properties: every read of every page returns what the model holds (the last bytes
//! written, zeros where nothing was or a discard freed them), whatever moved the unit
//! (writeback, recompression, a save and a load, partial writes into a written-back unit,
//! threads writing while writebacks run); `bd_count` is in 4 KiB pages (a unit's pages
//! each) and goes to 0 as the units leave the store, which then holds no block; a state of
//! one unit size is refused by a device of another, typed.

mod common;

use common::units::{device, pool};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use ztier_base::rng::Rng;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_zram::{Backing, Device, PageSelector, SlotFlag, StateError, WbFormat, ZramError};

const PAGE: usize = 4096;
const FORMATS: [WbFormat; 3] = [WbFormat::Page, WbFormat::Compressed, WbFormat::Packed];

fn store_for(dev: &Device) -> Arc<dyn BlockDevice> {
    Arc::new(MemoryDevice::new(Backing::size_for(dev.disksize())).unwrap())
}

fn with_store(dev: &Device, format: WbFormat) -> Arc<dyn BlockDevice> {
    let store = store_for(dev);
    dev.set_backing(Some(Backing::new(Arc::clone(&store), format).unwrap()))
        .unwrap();
    store
}

/// Unit `u`'s bytes by its kind (`u % 4`): text-like, one repeated word, random
/// (stored raw), or text again with a seed of its own.
fn unit_bytes(unit: usize, u: u64, seed: u64) -> Vec<u8> {
    let mut rng = Rng::from_state((seed ^ u.wrapping_mul(0x9e37_79b9)) | 1);
    match u % 4 {
        1 => vec![(u as u8) | 1; unit],
        2 => (0..unit).map(|_| rng.next_u64() as u8).collect(),
        _ => {
            let words = [&b"alpha "[..], b"beta ", b"gamma ", b"delta "];
            let mut out = Vec::with_capacity(unit + 8);
            while out.len() < unit {
                let x = rng.next_u64();
                out.extend_from_slice(words[(x % 4) as usize]);
                out.push((x >> 8) as u8);
            }
            out.truncate(unit);
            out
        }
    }
}

/// Writes every unit (kinds by index) and returns the model of the disk.
fn fill(dev: &Device, seed: u64) -> Vec<u8> {
    let unit = dev.unit_size();
    let mut model = Vec::with_capacity(dev.disksize() as usize);
    for u in 0..dev.units() {
        let bytes = unit_bytes(unit, u, seed);
        dev.write_unit(u, &bytes).unwrap();
        model.extend_from_slice(&bytes);
    }
    model
}

/// Every page read alone, every unit read whole, and the disk in odd ranges, against the
/// model.
fn check_all(dev: &Device, model: &[u8]) {
    let mut page = vec![0xa5; PAGE];
    for p in 0..dev.pages() {
        dev.read_page(p, &mut page).unwrap();
        let at = p as usize * PAGE;
        assert!(page[..] == model[at..at + PAGE], "page {p}");
    }
    let unit = dev.unit_size();
    let mut whole = vec![0xa5; unit];
    for u in 0..dev.units() {
        dev.read_unit(u, &mut whole).unwrap();
        let at = u as usize * unit;
        assert!(whole[..] == model[at..at + unit], "unit {u}");
    }
    let mut rng = Rng::new(5);
    for _ in 0..20 {
        let at = rng.next_u64() % model.len() as u64;
        let len = (1 + rng.next_u64() % 100_000).min(model.len() as u64 - at) as usize;
        let mut out = vec![0xa5; len];
        dev.read_bytes(at, &mut out).unwrap();
        assert!(
            out[..] == model[at as usize..at as usize + len],
            "{at}+{len}"
        );
    }
}

/// Units (by index) the writeback of `all` takes: the ones stored in the pool (not
/// same-filled).
fn stored_units(dev: &Device) -> u64 {
    (0..dev.units())
        .filter(|&u| {
            let e = dev.entry(u).unwrap();
            e.is_allocated() && !e.has(SlotFlag::Same) && !e.has(SlotFlag::Wb)
        })
        .count() as u64
}

#[test]
fn written_back_units_read_back_in_every_format() {
    for unit in [16384, 65536] {
        let ppu = (unit / PAGE) as u64;
        for format in FORMATS {
            let what = format!("{unit} {format:?}");
            let dev = device(12, unit, "lz4");
            let model = fill(&dev, 1);
            with_store(&dev, format);
            let before = dev.mm_stat();
            let stored = stored_units(&dev);
            let r = dev.writeback(PageSelector::All, None, None).unwrap();
            assert_eq!(r.pages, stored * ppu, "{what}: pages, not units");
            let bd = dev.bd_stat().unwrap();
            assert_eq!(bd.bd_count, stored * ppu, "{what}");
            assert_eq!(bd.bd_writes * 4096, r.bytes_written, "{what}");
            let mm = dev.mm_stat();
            assert_eq!(mm.orig_data_size, before.orig_data_size, "{what}");
            assert_eq!((mm.compr_data_size, mm.huge_pages), (0, 0), "{what}");
            assert_eq!(mm.same_pages, before.same_pages, "{what}");
            match format {
                // The whole unit: its pages' blocks each.
                WbFormat::Page => assert_eq!(bd.bd_writes, stored * ppu, "{what}"),
                // The objects alone: fewer blocks (text compresses).
                _ => assert!(bd.bd_writes < stored * ppu, "{what}: {}", bd.bd_writes),
            }
            check_all(&dev, &model);
            // Nothing read took a unit back into memory.
            assert_eq!(dev.bd_stat().unwrap().bd_count, stored * ppu, "{what}");
            // Everything discarded: the store holds nothing.
            dev.discard(0, dev.disksize()).unwrap();
            let bd = dev.bd_stat().unwrap();
            assert_eq!((bd.bd_count, bd.bytes_stored), (0, 0), "{what}");
            assert_eq!(bd.bytes_held, 0, "{what}: blocks left on the store");
            assert_eq!(dev.mm_stat().orig_data_size, 0, "{what}");
        }
    }
}

#[test]
fn partial_writes_and_discards_into_written_back_units() {
    for unit in [16384, 65536] {
        for format in FORMATS {
            let what = format!("{unit} {format:?}");
            let dev = device(8, unit, "zstd");
            let mut model = fill(&dev, 2);
            with_store(&dev, format);
            dev.writeback(PageSelector::All, None, None).unwrap();
            let mut rng = Rng::new(unit as u64 + format as u64);
            for round in 0..60 {
                let disk = model.len() as u64;
                let at = rng.next_u64() % disk;
                match rng.next_u64() % 4 {
                    0 | 1 => {
                        let len = (1 + rng.next_u64() % 9000).min(disk - at) as usize;
                        let data = unit_bytes(len, round, rng.next_u64());
                        dev.write_bytes(at, &data).unwrap();
                        model[at as usize..at as usize + len].copy_from_slice(&data);
                    }
                    2 => {
                        let len = (rng.next_u64() % 40_000).min(disk - at);
                        dev.discard(at, len).unwrap();
                        let ps = PAGE as u64;
                        let (first, end) = (at.div_ceil(ps) * ps, (at + len) / ps * ps);
                        if first < end {
                            model[first as usize..end as usize].fill(0);
                        }
                    }
                    _ => {
                        // Back to the store now and then, so writes meet written-back units.
                        dev.writeback(PageSelector::All, None, None).unwrap();
                    }
                }
            }
            check_all(&dev, &model);
            dev.discard(0, dev.disksize()).unwrap();
            let bd = dev.bd_stat().unwrap();
            assert_eq!((bd.bd_count, bd.bytes_held), (0, 0), "{what}");
        }
    }
}

#[test]
fn idle_marks_and_the_writeback_limit_hold_for_units() {
    let (unit, ppu) = (65536, 16u64);
    let dev = device(8, unit, "lz4");
    let model = fill(&dev, 3);
    with_store(&dev, WbFormat::Page);
    dev.mark_idle(None);
    // A page read of unit 0 and unit 4 makes them not idle.
    let mut page = vec![0; PAGE];
    dev.read_page(3, &mut page).unwrap();
    dev.read_page(4 * ppu + 15, &mut page).unwrap();
    let r = dev.writeback(PageSelector::Idle, None, None).unwrap();
    // Units 0, 3, 4, 7 are text, 2, 6 random, 1, 5 same-filled: 0 and 4 were read.
    assert_eq!(r.pages, 4 * ppu);
    for u in [0, 4] {
        assert!(
            !dev.entry(u).unwrap().has(SlotFlag::Wb),
            "unit {u} was read"
        );
    }
    for u in [2, 3, 6, 7] {
        assert!(dev.entry(u).unwrap().has(SlotFlag::Wb), "unit {u} idle");
    }
    // The limit is in 4 KiB blocks: a unit in the page format takes 16. Room for one.
    dev.set_writeback_limit(Some(ppu + 3));
    let err = dev
        .writeback(PageSelector::All, None, None)
        .expect_err("the limit stops it");
    assert!(matches!(err, ZramError::WritebackLimit), "{err}");
    assert_eq!(dev.writeback_limit(), Some(3));
    assert_eq!(dev.bd_stat().unwrap().bd_count, 5 * ppu);
    // A range of pages takes the units they are in: unit 4 is the one left in memory.
    dev.set_writeback_limit(None);
    assert!(!dev.entry(4).unwrap().has(SlotFlag::Wb));
    let r = dev
        .writeback(PageSelector::All, Some(4 * ppu + 5..4 * ppu + 6), None)
        .unwrap();
    assert_eq!(r.pages, ppu);
    assert!(dev.entry(4).unwrap().has(SlotFlag::Wb));
    // At most max_pages: a unit is taken while fewer pages are taken.
    for u in [0, 3] {
        dev.write_unit(u, &model[u as usize * unit..][..unit])
            .unwrap();
    }
    let r = dev.writeback(PageSelector::All, None, Some(1)).unwrap();
    assert_eq!(r.pages, ppu);
    assert!(dev.entry(0).unwrap().has(SlotFlag::Wb) && !dev.entry(3).unwrap().has(SlotFlag::Wb));
    check_all(&dev, &model);
}

/// A 64 KiB unit stored raw fills a packed segment by itself: no room for a checksum
/// after it, so its place keeps one; a store that damages it fails the read, never serves
/// wrong bytes.
#[test]
fn a_raw_64k_unit_in_a_packed_segment_is_checked() {
    let dev = device(4, 65536, "lz4");
    let model = fill(&dev, 4);
    let store = with_store(&dev, WbFormat::Packed);
    let r = dev.writeback(PageSelector::Huge, None, None).unwrap();
    assert_eq!(r.pages, 16, "the raw unit alone");
    let e = dev.entry(2).unwrap();
    assert!(e.has(SlotFlag::Wb) && e.size() == 65536, "the raw unit");
    check_all(&dev, &model);
    // Every block after the header changed by one bit (the segment is not cached: the
    // device never read it).
    let dev = device(4, 65536, "lz4");
    let store2 = with_store(&dev, WbFormat::Packed);
    dev.write_unit(2, &model[2 * 65536..3 * 65536]).unwrap();
    dev.writeback(PageSelector::Huge, None, None).unwrap();
    let mut block = vec![0u8; 4096];
    for slot in 1..store2.size() / 4096 {
        store2.read_at(slot * 4096, &mut block).unwrap();
        block[100] ^= 1;
        store2.write_at(slot * 4096, &block, false).unwrap();
    }
    let mut page = vec![0; PAGE];
    let err = dev.read_page(2 * 16 + 1, &mut page).expect_err("damaged");
    assert!(matches!(err, ZramError::Corrupt { .. }), "{err}");
    assert_eq!(dev.bd_stat().unwrap().checksum_failures, 1);
    drop(store);
}

#[test]
fn writeback_beside_threads_doing_io() {
    for (unit, alg, format) in [
        (16384, "lz4", WbFormat::Packed),
        (65536, "zstd", WbFormat::Page),
        (65536, "lz4", WbFormat::Compressed),
    ] {
        const THREADS: u64 = 3;
        const UNITS_EACH: u64 = 3;
        let dev = device(THREADS * UNITS_EACH, unit, alg);
        with_store(&dev, format);
        let stop = AtomicBool::new(false);
        let ub = unit as u64;
        std::thread::scope(|s| {
            let dev = &dev;
            let stop = &stop;
            // The writeback side: writebacks of everything, idle marks, compactions.
            s.spawn(move || {
                while !stop.load(Relaxed) {
                    match dev.writeback(PageSelector::All, None, None) {
                        Ok(_) | Err(ZramError::WritebackCut { .. }) => {}
                        Err(e) => panic!("writeback: {e}"),
                    }
                    dev.mark_idle(None);
                    dev.compact();
                }
            });
            let workers: Vec<_> = (0..THREADS)
                .map(|t| {
                    s.spawn(move || {
                        // This thread's units, and its model of them.
                        let base = t * UNITS_EACH * ub;
                        let len = UNITS_EACH * ub;
                        let mut model = vec![0u8; len as usize];
                        let mut rng = Rng::new(t + 77);
                        let mut wrong = 0usize;
                        for round in 0..400u64 {
                            let at = rng.next_u64() % len;
                            match rng.next_u64() % 6 {
                                0 | 1 => {
                                    let n = (1 + rng.next_u64() % 12_000).min(len - at) as usize;
                                    let data = unit_bytes(n, round % 4, rng.next_u64());
                                    dev.write_bytes(base + at, &data).unwrap();
                                    model[at as usize..at as usize + n].copy_from_slice(&data);
                                }
                                2 => {
                                    let n = (rng.next_u64() % 30_000).min(len - at);
                                    dev.discard(base + at, n).unwrap();
                                    let ps = PAGE as u64;
                                    let (a, b) = (at.div_ceil(ps) * ps, (at + n) / ps * ps);
                                    if a < b {
                                        model[a as usize..b as usize].fill(0);
                                    }
                                }
                                _ => {
                                    let n = (1 + rng.next_u64() % 20_000).min(len - at) as usize;
                                    let mut out = vec![0xa5; n];
                                    dev.read_bytes(base + at, &mut out).unwrap();
                                    wrong += out
                                        .iter()
                                        .zip(&model[at as usize..at as usize + n])
                                        .filter(|(a, b)| a != b)
                                        .count();
                                }
                            }
                        }
                        (model, wrong)
                    })
                })
                .collect();
            let mut whole = Vec::new();
            for w in workers {
                let (model, wrong) = w.join().unwrap();
                assert_eq!(wrong, 0, "{unit} {format:?}: wrong bytes read");
                whole.extend_from_slice(&model);
            }
            stop.store(true, Relaxed);
            // Once quiet: every unit, from wherever it is.
            let mut out = vec![0xa5; whole.len()];
            dev.read_bytes(0, &mut out).unwrap();
            assert!(out == whole, "{unit} {format:?}: the disk after");
        });
        let written_back = (0..dev.units())
            .filter(|&u| dev.entry(u).unwrap().has(SlotFlag::Wb))
            .count() as u64;
        let bd = dev.bd_stat().unwrap();
        assert_eq!(bd.bd_count, written_back * (unit / PAGE) as u64);
        dev.discard(0, dev.disksize()).unwrap();
        let bd = dev.bd_stat().unwrap();
        assert_eq!((bd.bd_count, bd.bytes_held), (0, 0), "{unit} {format:?}");
    }
}

#[test]
fn units_recompress_whole_and_read_back() {
    for unit in [16384, 65536] {
        let ppu = (unit / PAGE) as u64;
        let dev = device(8, unit, "lz4");
        dev.set_recomp_algorithms(vec!["zstd".parse().unwrap()])
            .unwrap();
        let model = fill(&dev, 6);
        let before = dev.mm_stat();
        // A threshold above every object takes none.
        let r = dev
            .recompress(PageSelector::All, Some(unit + 1), None)
            .unwrap();
        assert_eq!(r.scanned, 0);
        let r = dev.recompress(PageSelector::All, None, None).unwrap();
        // Text units (0, 3, 4, 7) shrink with zstd; random ones (2, 6) are tried and marked.
        assert_eq!(r.scanned, 6 * ppu, "{unit}");
        assert_eq!(r.recompressed, 4 * ppu, "{unit}");
        assert_eq!(r.incompressible, 2 * ppu, "{unit}");
        assert!(r.bytes_after < r.bytes_before);
        let mm = dev.mm_stat();
        assert_eq!(mm.orig_data_size, before.orig_data_size);
        assert_eq!(
            mm.compr_data_size,
            before.compr_data_size - (r.bytes_before - r.bytes_after)
        );
        for u in [0, 3, 4, 7] {
            assert_eq!(dev.entry(u).unwrap().priority(), 1, "{unit}: unit {u}");
        }
        assert!(dev.entry(2).unwrap().has(SlotFlag::Incompressible));
        check_all(&dev, &model);
        // Recompressed units go to the store and come back by their own algorithm.
        with_store(&dev, WbFormat::Compressed);
        dev.writeback(PageSelector::All, None, None).unwrap();
        check_all(&dev, &model);
    }
}

/// A device of units with pages in the pool, same-filled and on the store, in each
/// format; saved and loaded into a new device with the store: the same pages, the same
/// figures; loaded again it reads the same.
#[test]
fn states_of_units_round_trip() {
    for unit in [16384, 65536] {
        for format in FORMATS {
            let what = format!("{unit} {format:?}");
            let dev = device(12, unit, "lz4");
            let model = fill(&dev, 7);
            let store = with_store(&dev, format);
            // Half the units on the store: the text and random ones of the first half.
            dev.writeback(PageSelector::All, Some(0..6 * (unit / PAGE) as u64), None)
                .unwrap();
            assert!(dev.bd_stat().unwrap().bd_count > 0, "{what}");
            let mut state = Vec::new();
            let saved = dev.save_state(&mut state).unwrap();
            assert_eq!(saved.pages, dev.pages(), "{what}: every unit held");
            assert_eq!(&state[8..12], &3u32.to_le_bytes(), "{what}: version 3");
            let (mm, bd) = (dev.mm_stat(), dev.bd_stat().unwrap());
            dev.close_writeback();
            drop(dev);

            let back = device(12, unit, "lz4");
            let loaded = back
                .load_state_with_store(&mut &state[..], Arc::clone(&store), format)
                .unwrap();
            assert_eq!(
                (loaded.pages, loaded.from_backing_store),
                (saved.pages, saved.from_backing_store),
                "{what}"
            );
            let mm2 = back.mm_stat();
            assert_eq!(
                (
                    mm2.orig_data_size,
                    mm2.compr_data_size,
                    mm2.same_pages,
                    mm2.huge_pages
                ),
                (
                    mm.orig_data_size,
                    mm.compr_data_size,
                    mm.same_pages,
                    mm.huge_pages
                ),
                "{what}"
            );
            let bd2 = back.bd_stat().unwrap();
            assert_eq!(
                (bd2.bd_count, bd2.bytes_stored),
                (bd.bd_count, bd.bytes_stored)
            );
            check_all(&back, &model);
            // It goes on working: written back further, discarded, the store emptied.
            back.writeback(PageSelector::All, None, None).unwrap();
            check_all(&back, &model);
            back.discard(0, back.disksize()).unwrap();
            let bd3 = back.bd_stat().unwrap();
            assert_eq!((bd3.bd_count, bd3.bytes_held), (0, 0), "{what}");
        }
        // No store: the pool's and same-filled units alone.
        let dev = device(6, unit, "zstd");
        let model = fill(&dev, 8);
        let mut state = Vec::new();
        dev.save_state(&mut state).unwrap();
        let back = device(6, unit, "zstd");
        back.load_state(&mut &state[..]).unwrap();
        assert_eq!(back.mm_stat(), dev.mm_stat());
        check_all(&back, &model);
    }
}

#[test]
fn a_state_of_another_unit_size_is_refused() {
    let disk = 4 * 65536u64;
    let of = |unit: usize| {
        let dev = Device::with_unit_size(disk, "lz4".parse().unwrap(), pool(65536), unit).unwrap();
        fill(&dev, 9);
        let mut state = Vec::new();
        dev.save_state(&mut state).unwrap();
        state
    };
    let page_state = of(4096);
    // A device of pages writes the version before unit sizes, as it always did.
    assert_eq!(&page_state[8..12], &2u32.to_le_bytes());
    for (state_unit, device_unit) in [(16384, 65536), (65536, 16384), (4096, 16384), (16384, 4096)]
    {
        let state = if state_unit == 4096 {
            page_state.clone()
        } else {
            of(state_unit)
        };
        let dev =
            Device::with_unit_size(disk, "lz4".parse().unwrap(), pool(65536), device_unit).unwrap();
        let err = dev.load_state(&mut &state[..]).unwrap_err();
        assert!(
            matches!(
                err,
                ZramError::BadState(StateError::UnitSize { state, device })
                    if state == state_unit && device == device_unit
            ),
            "{state_unit} into {device_unit}: {err}"
        );
        assert_eq!(dev.mm_stat().orig_data_size, 0, "left empty");
    }
}
