//! zram writeback, idle tracking and recompression: pages written back (in every format)
//! and recompressed read back identical; idle marking and aging; the writeback limit;
//! overwrite and discard free places on the store, down to whole segments; a failing store
//! loses nothing; threads reading and writing while writeback and recompression run. The
//! packed format's segment reads are in `segment_reads.rs`, a store changed or closed under
//! a writeback in `store_change.rs`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::Faulty;
use ztier_blockdev::BlockDevice;
use ztier_zram::{Backing, Device, PageSelector, SlotFlag, WbFormat, ZramError};

use common::writeback::*;

#[test]
fn idle_marking_and_aging() {
    let dev = device(64, "lz4");
    fill(&dev, 64);
    // Zero pages are same-filled: never marked.
    assert_eq!(dev.mark_idle(None), 60);
    let mut out = vec![0u8; PS];
    dev.read_page(1, &mut out).unwrap();
    assert!(
        !dev.entry(1).unwrap().has(SlotFlag::Idle),
        "a read clears the mark"
    );
    assert!(dev.entry(2).unwrap().has(SlotFlag::Idle));
    dev.write_page(2, &page(2)).unwrap();
    assert!(
        !dev.entry(2).unwrap().has(SlotFlag::Idle),
        "a write clears it"
    );
    // Nothing is an hour old.
    let dev = device(64, "lz4");
    fill(&dev, 64);
    assert_eq!(dev.mark_idle(Some(Duration::from_secs(3600))), 0);
    // Pages untouched for two seconds are, those read since are not. (Ages are whole
    // seconds of a coarse clock: with one second, a second's boundary between the reads and
    // the marking would age a page just read to 1 and mark it.)
    std::thread::sleep(Duration::from_millis(3100));
    for i in 32..64 {
        dev.read_page(i, &mut out).unwrap();
    }
    assert_eq!(dev.mark_idle(Some(Duration::from_secs(2))), 30);
    assert!(dev.entry(5).unwrap().has(SlotFlag::Idle));
    assert!(!dev.entry(40).unwrap().has(SlotFlag::Idle));
}

#[test]
fn written_back_pages_read_back_in_every_format() {
    for format in [WbFormat::Page, WbFormat::Compressed, WbFormat::Packed] {
        let n = 1000;
        let dev = device(n, "lzo-rle");
        fill(&dev, n);
        let before = dev.mm_stat();
        assert!(matches!(
            dev.writeback(PageSelector::Idle, None, None),
            Err(ZramError::NoBacking)
        ));
        dev.set_backing(Some(file_store(&format!("{format:?}"), 16 << 20, format)))
            .unwrap();
        assert_eq!(
            dev.writeback(PageSelector::Idle, None, None).unwrap().pages,
            0,
            "nothing idle"
        );
        dev.mark_idle(None);
        let r = dev.writeback(PageSelector::Idle, None, None).unwrap();
        let stored = (0..n).filter(|i| i % 16 != 0).count() as u64;
        assert_eq!(r.pages, stored, "{format:?}");
        let after = dev.mm_stat();
        let bd = dev.bd_stat().unwrap();
        assert_eq!(bd.bd_count, stored);
        assert_eq!(after.orig_data_size, before.orig_data_size, "still stored");
        assert_eq!(
            (after.compr_data_size, after.huge_pages),
            (0, 0),
            "{format:?}"
        );
        match format {
            WbFormat::Packed => {
                // Packed: bytes written within 1.1x of the compressed bytes.
                assert!(
                    (bd.bytes_written as f64) <= before.compr_data_size as f64 * 1.1,
                    "{bd:?} vs {before:?}"
                );
            }
            _ => assert_eq!(bd.bytes_written, stored * PS as u64),
        }
        assert!(dev.entry(3).unwrap().has(SlotFlag::Wb));
        verify(&dev, n, |_| None);
        // Reads from the store: one a page, or one a segment (packed, read in order).
        let reads = match format {
            WbFormat::Packed => bd.bytes_held / (64 << 10),
            _ => stored,
        };
        assert_eq!(dev.bd_stat().unwrap().bd_reads, reads, "{format:?}");
        // Overwrite half, discard a quarter: their places on the store are given back.
        for i in (0..n).step_by(2) {
            dev.write_page(i, &page(i + 10_000)).unwrap();
        }
        dev.discard(PS as u64, (n / 4) * PS as u64).unwrap();
        let changed = |i: u64| {
            if (1..=n / 4).contains(&i) {
                Some(vec![0u8; PS])
            } else if i.is_multiple_of(2) {
                Some(page(i + 10_000))
            } else {
                None
            }
        };
        verify(&dev, n, changed);
        let bd2 = dev.bd_stat().unwrap();
        assert!(bd2.bd_count < bd.bd_count / 2 + 1, "{bd2:?}");
        assert!(bd2.bytes_stored < bd.bytes_stored, "{bd2:?}");
        // Everything gone: every block or segment goes back.
        dev.discard(0, n * PS as u64).unwrap();
        let bd3 = dev.bd_stat().unwrap();
        assert_eq!(
            (bd3.bd_count, bd3.bytes_stored, bd3.bytes_held),
            (0, 0, 0),
            "{format:?}"
        );
        dev.reset();
    }
}

#[test]
fn writeback_modes_and_the_limit() {
    let n = 256;
    let dev = device(n, "lz4");
    fill(&dev, n);
    dev.set_backing(Some(file_store("modes", 8 << 20, WbFormat::Packed)))
        .unwrap();
    // Huge pages (every 8th, random) alone.
    let r = dev.writeback(PageSelector::Huge, None, None).unwrap();
    assert_eq!(r.pages, n / 8);
    assert_eq!(dev.mm_stat().huge_pages, 0);
    // At most 5 pages, then a limit of 2 blocks.
    assert_eq!(
        dev.writeback(PageSelector::All, Some(0..n), Some(5))
            .unwrap()
            .pages,
        5
    );
    dev.set_writeback_limit(Some(2));
    let err = dev.writeback(PageSelector::All, None, None).unwrap_err();
    assert!(matches!(err, ZramError::WritebackLimit), "{err}");
    assert_eq!(dev.writeback_limit(), Some(0));
    dev.set_writeback_limit(None);
    dev.writeback(PageSelector::All, None, None).unwrap();
    assert_eq!(dev.mm_stat().compr_data_size, 0);
    verify(&dev, n, |_| None);
    // A page range past the disk is refused.
    assert!(dev
        .writeback(PageSelector::All, Some(0..n + 1), None)
        .is_err());
}

#[test]
fn a_failing_store_loses_nothing() {
    let n = 300;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Faulty::new(MemoryDevice::new(8 << 20).unwrap()));
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, Some(0..100), None)
        .unwrap();
    store.set_failing(true, false);
    let before = dev.mm_stat();
    let err = dev.writeback(PageSelector::All, None, None).unwrap_err();
    assert!(err.to_string().contains("vanished"), "{err}");
    assert_eq!(dev.mm_stat(), before, "nothing moved");
    // Every page the writeback took is counted as failed, not the writeback once.
    let ZramError::WritebackCut {
        pages: 0, failed, ..
    } = err
    else {
        panic!("{err:?}");
    };
    let in_memory = in_pool(&dev);
    assert_eq!(failed, in_memory, "{err}");
    assert_eq!(dev.bd_stat().unwrap().failed_writebacks, failed);
    assert!(!dev.entry(150).unwrap().has(SlotFlag::UnderWb));
    verify(&dev, n, |_| None);
    dev.write_page(200, &page(7)).unwrap();
    store.set_failing(false, false);
    dev.writeback(PageSelector::All, None, None).unwrap();
    verify(&dev, n, |i| (i == 200).then(|| page(7)));
}

/// The packed segments on a store: the slot each starts at (they begin with the magic).
fn segments_on(store: &dyn BlockDevice) -> Vec<u64> {
    let mut found = Vec::new();
    let mut head = [0u8; 8];
    for slot in (16..store.size() / PS as u64).step_by(16) {
        store.read_at(slot * PS as u64, &mut head).unwrap();
        if &head == b"ztierPK1" {
            found.push(slot);
        }
    }
    found
}

/// A bit flipped in a packed segment on the store (damage that decompresses all the same)
/// is found by the object's checksum: the page's read is an I/O error, said in the device's
/// log and counted, never wrong data; the other pages read back.
#[test]
fn a_flipped_bit_on_the_store_is_an_error_never_wrong_data() {
    let n = 600;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(MemoryDevice::new(16 << 20).unwrap());
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    let log = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let lines = Arc::clone(&log);
    dev.set_log(move |line| lines.lock().unwrap().push(line.to_string()));
    dev.writeback(PageSelector::All, None, None).unwrap();
    let segments = segments_on(&*store);
    assert!(segments.len() >= 4, "{segments:?}");
    // One bit in each segment, a little way in: inside its first objects.
    for (k, &first) in segments.iter().enumerate() {
        let at = first * PS as u64 + 100 + 37 * k as u64;
        let mut b = [0u8];
        store.read_at(at, &mut b).unwrap();
        store.write_at(at, &[b[0] ^ 0x10], false).unwrap();
    }
    let mut out = vec![0u8; PS];
    let mut damaged = 0;
    for i in 0..n {
        match dev.read_page(i, &mut out) {
            Ok(()) => assert!(out == page(i), "page {i} read back wrong"),
            Err(ZramError::Corrupt { index, .. }) => {
                assert_eq!(index, i);
                damaged += 1;
            }
            Err(e) => panic!("page {i}: {e}"),
        }
    }
    assert_eq!(damaged, segments.len() as u64, "one object a segment");
    assert_eq!(dev.bd_stat().unwrap().checksum_failures, damaged);
    let log = log.lock().unwrap();
    assert_eq!(log.len() as u64, damaged, "{log:?}");
    assert!(
        log[0].contains("checksum") && log[0].contains("EIO"),
        "{log:?}"
    );
}

/// A segment written before objects carried checksums (no magic at its start) is read as
/// it was written, unchecked: a store of an older ztier still reads.
#[test]
fn a_segment_without_checksums_is_read_as_before() {
    let n = 300;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(MemoryDevice::new(16 << 20).unwrap());
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    for first in segments_on(&*store) {
        store.write_at(first * PS as u64, &[0u8; 8], false).unwrap();
    }
    verify(&dev, n, |_| None);
    assert_eq!(dev.bd_stat().unwrap().checksum_failures, 0);
}

/// Pages whose objects are in the pool: stored, neither same-filled nor written back.
fn in_pool(dev: &Device) -> u64 {
    let m = dev.mm_stat();
    m.orig_data_size / PS as u64 - m.same_pages - dev.bd_stat().map_or(0, |b| b.bd_count)
}

/// A store whose write fails once (a blip) costs that group of segments, not the rest of
/// the writeback: it goes on, as the kernel's writeback goes on past a failed bio, and
/// reports the pages that failed (they stay in memory, and read back).
#[test]
fn a_writeback_goes_on_past_a_failed_write() {
    let n = 6000;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Faulty::new(MemoryDevice::new(64 << 20).unwrap()));
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    let stored = in_pool(&dev);
    store.fail_next_writes(1);
    let err = dev.writeback(PageSelector::All, None, None).unwrap_err();
    let ZramError::WritebackCut { pages, failed, .. } = err else {
        panic!("{err:?}");
    };
    assert!(failed > 0 && pages > 0, "{err}");
    assert_eq!(pages + failed, stored, "every page tried: {err}");
    let bd = dev.bd_stat().unwrap();
    assert_eq!((bd.bd_count, bd.failed_writebacks), (pages, failed));
    verify(&dev, n, |_| None);
}

/// A store that fails every write (gone) is given up on after two groups in a row, each of
/// their pages counted; the pages not tried stay in memory uncounted.
#[test]
fn a_writeback_gives_up_on_a_store_that_fails_twice_in_a_row() {
    let n = 6000;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Faulty::new(MemoryDevice::new(64 << 20).unwrap()));
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    let stored = in_pool(&dev);
    store.set_failing(true, false);
    let err = dev.writeback(PageSelector::All, None, None).unwrap_err();
    let ZramError::WritebackCut {
        pages: 0, failed, ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert!(failed > 0 && failed < stored, "two groups, not all: {err}");
    assert_eq!(dev.bd_stat().unwrap().failed_writebacks, failed);
    verify(&dev, n, |_| None);
}

#[test]
fn a_full_store_is_a_clear_error_and_loses_nothing() {
    let n = 2000;
    let dev = device(n, "lz4");
    fill(&dev, n);
    // Room for one cluster of slots after the header: 32 segments of 64 KiB.
    dev.set_backing(Some(file_store("full", 1024 * PS as u64, WbFormat::Packed)))
        .unwrap();
    let err = dev.writeback(PageSelector::All, None, None).unwrap_err();
    assert!(err.to_string().contains("no room"), "{err}");
    let bd = dev.bd_stat().unwrap();
    assert!(bd.bd_count > 0 && bd.bd_count < n, "{bd:?}");
    // The error says how many pages did go out.
    assert!(
        err.to_string()
            .contains(&format!("wrote {} pages", bd.bd_count)),
        "{err}"
    );
    verify(&dev, n, |_| None);
}

#[test]
fn recompression_keeps_smaller_classes_and_marks_incompressible() {
    let n = 512;
    let dev = device(n, "lz4");
    fill(&dev, n);
    assert!(
        dev.recompress(PageSelector::All, None, None).is_err(),
        "no algorithm set"
    );
    dev.set_recomp_algorithms(vec!["zstd".parse().unwrap()])
        .unwrap();
    let before = dev.mm_stat();
    let r = dev.recompress(PageSelector::All, None, None).unwrap();
    assert!(r.recompressed > n / 2, "{r:?}");
    assert!(r.bytes_after < r.bytes_before);
    // The random pages: huge, and zstd cannot shrink them either.
    assert_eq!(r.incompressible, n / 8, "{r:?}");
    let after = dev.mm_stat();
    assert!(
        after.compr_data_size < before.compr_data_size,
        "{after} vs {before}"
    );
    assert!(dev.entry(7).unwrap().has(SlotFlag::Incompressible));
    assert_eq!(dev.entry(1).unwrap().priority(), 1);
    verify(&dev, n, |_| None);
    // Nothing left to try: recompressed pages are at the top priority, the rest marked.
    let again = dev.recompress(PageSelector::All, None, None).unwrap();
    assert_eq!((again.scanned, again.recompressed), (0, 0));
    // Changing the algorithm while pages use it is refused; writeback of recompressed
    // pages keeps their priority and reads back.
    assert!(dev
        .set_recomp_algorithms(vec!["deflate".parse().unwrap()])
        .is_err());
    dev.set_backing(Some(file_store("recomp", 8 << 20, WbFormat::Packed)))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    verify(&dev, n, |_| None);
    // A threshold leaves small objects alone.
    let dev = device(64, "lz4");
    fill(&dev, 64);
    dev.set_recomp_algorithms(vec!["zstd".parse().unwrap()])
        .unwrap();
    let r = dev.recompress(PageSelector::All, Some(4000), None).unwrap();
    assert_eq!(r.recompressed, 0, "{r:?}");
}

/// Two threads read and write their own pages while another marks pages idle, recompresses
/// and writes back, pass after pass: every read sees its page's last write, and both
/// recompression and writeback really ran beside the I/O. The passes start with the workers
/// (a barrier), the workers go on until at least one pass has ended, and each worker notes
/// what the passes had done when it finished: passes after the workers cannot earn that.
#[test]
fn io_goes_on_while_writeback_and_recompression_run() {
    let n = 2048u64;
    let dev = device(n, "lz4");
    fill(&dev, n);
    dev.set_recomp_algorithms(vec!["zstd:level=1".parse().unwrap()])
        .unwrap();
    dev.set_backing(Some(file_store("threads", 32 << 20, WbFormat::Packed)))
        .unwrap();
    let stop = AtomicBool::new(false);
    let start = Barrier::new(3);
    // What the background passes have done so far: pages recompressed, pages written back,
    // passes ended; `ended` also when the thread stops (or panics), so no worker waits for a
    // pass that will never come.
    let (recompressed, written_back, passes) =
        (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let ended = AtomicBool::new(false);
    let noted = std::thread::scope(|s| {
        s.spawn(|| {
            struct Ended<'a>(&'a AtomicBool);
            impl Drop for Ended<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Relaxed);
                }
            }
            let _ended = Ended(&ended);
            start.wait();
            while !stop.load(Relaxed) {
                dev.mark_idle(None);
                let r = dev.recompress(PageSelector::Idle, None, None).unwrap();
                recompressed.fetch_add(r.recompressed, Relaxed);
                let w = dev.writeback(PageSelector::Idle, None, Some(256)).unwrap();
                written_back.fetch_add(w.pages, Relaxed);
                passes.fetch_add(1, Relaxed);
            }
        });
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let (dev, start) = (&dev, &start);
                let (recompressed, written_back, passes, ended) =
                    (&recompressed, &written_back, &passes, &ended);
                s.spawn(move || {
                    let mut out = vec![0u8; PS];
                    // Thread t owns pages of its parity in the first half; generation g
                    // of page i is page(i + g * n). The second half is left alone, so the
                    // passes always find idle pages however slowly they run (touched, every
                    // page of the first half stops being idle within 512 rounds).
                    let mut gen = vec![0u64; n as usize];
                    start.wait();
                    let mut round = 0u64;
                    while round < 6000 || (passes.load(Relaxed) == 0 && !ended.load(Relaxed)) {
                        let i = ((round * 7919 + t * 13) % (n / 4)) * 2 + t;
                        if round.is_multiple_of(3) {
                            gen[i as usize] += 1;
                            dev.write_page(i, &page(i + gen[i as usize] * n)).unwrap();
                        } else {
                            dev.read_page(i, &mut out).unwrap();
                            assert!(out == page(i + gen[i as usize] * n), "page {i}");
                        }
                        round += 1;
                    }
                    let noted = (recompressed.load(Relaxed), written_back.load(Relaxed));
                    (gen, noted)
                })
            })
            .collect();
        // Stop the passes even when a worker failed, so a failure is reported, not hung.
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Relaxed);
        let (gens, noted): (Vec<Vec<u64>>, Vec<(u64, u64)>) =
            results.into_iter().map(|r| r.unwrap()).unzip();
        let mut out = vec![0u8; PS];
        for i in 0..n {
            let g = gens[(i % 2) as usize][i as usize];
            dev.read_page(i, &mut out).unwrap();
            assert!(out == page(i + g * n), "page {i} at the end");
        }
        // The later worker's note (the counts only grow): what the passes did before the
        // I/O ended.
        noted
            .into_iter()
            .fold((0, 0), |(r, w), (nr, nw)| (r.max(nr), w.max(nw)))
    });
    let (recompressed, written_back) = noted;
    assert!(
        recompressed > 0,
        "no page recompressed while the workers ran"
    );
    assert!(
        written_back > 0,
        "no page written back while the workers ran"
    );
}
