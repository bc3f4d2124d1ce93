//! A backing store that stalls (a remote store paused, a network partition) stalls only the
//! reads of its own pages: while a read of a written-back page waits on the store, writes and
//! discards of other pages of its stripe, reads of pages in memory, the statistics and a
//! rewrite of the very page being read all go on, and the stalled read, once the store
//! answers, returns what the page holds then.
//!
//! No test times anything: the store is held stalled until the other operations have
//! finished, so an operation that waited on the store would never finish, and the watchdog
//! (a generous deadline on a channel) fails the test instead of hanging it.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::Faulty;
use ztier_compress::Algorithm;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

const PS: usize = 4096;
/// zram's page locks are striped by index modulo this.
const STRIPES: u64 = 256;
/// How long an operation that should not wait on the store may take before the test calls
/// it stuck: far past any scheduling delay, far short of a hang.
const WATCHDOG: Duration = Duration::from_secs(20);

/// A store whose reads can be held stalled.
type Store = Faulty<MemoryDevice>;

/// Compressible and different per seed.
fn page(seed: u64) -> Vec<u8> {
    (0..PS)
        .map(|i| (seed as usize * 7 + i / 16 % 11) as u8)
        .collect()
}

/// A device of `pages` pages, each written with `page(index)` and every one written back to
/// a stalling store (not stalled yet).
fn written_back(pages: u64, format: WbFormat) -> (Arc<Device>, Arc<Store>) {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    let dev = Device::new(
        pages * PS as u64,
        "lz4".parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap();
    // At least two clusters of 512 slots: the first holds the header.
    let store = Arc::new(Faulty::new(
        MemoryDevice::new(((pages + 64) * 2).max(1024) * PS as u64).unwrap(),
    ));
    dev.set_backing(Some(Backing::new(store.clone(), format).unwrap()))
        .unwrap();
    for i in 0..pages {
        dev.write_page(i, &page(i)).unwrap();
    }
    let wb = dev.writeback(PageSelector::All, None, None).unwrap();
    assert_eq!(wb.pages, pages);
    (Arc::new(dev), store)
}

/// Runs `f` on a thread; the test fails if it has not finished within the watchdog.
fn finishes<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("{what} waited on the stalled store"))
}

#[test]
fn a_stalled_store_read_blocks_nothing_else() {
    for format in [WbFormat::Packed, WbFormat::Compressed, WbFormat::Page] {
        let (dev, store) = written_back(2 * STRIPES + 2, format);
        // Page 1 comes back into memory, so a read of it needs no store.
        dev.write_page(1, &page(1)).unwrap();
        store.stall(true);
        let reader = {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                let mut out = vec![0; PS];
                dev.read_page(0, &mut out).map(|()| out)
            })
        };
        assert!(
            store.wait_for_stalled_reads(1, WATCHDOG),
            "no read reached the stalled store"
        );

        let d = Arc::clone(&dev);
        finishes("a write to another page of the stripe", move || {
            d.write_page(STRIPES, &page(1000)).unwrap()
        });
        let d = Arc::clone(&dev);
        finishes("a partial write to another page of the stripe", move || {
            d.write_bytes(STRIPES * PS as u64 + 8, b"patched").unwrap()
        });
        let d = Arc::clone(&dev);
        finishes("a discard of another page of the stripe", move || {
            d.discard_page(2 * STRIPES).unwrap()
        });
        let d = Arc::clone(&dev);
        let back = finishes("a read of a page in memory", move || {
            let mut out = vec![0; PS];
            d.read_page(1, &mut out).unwrap();
            out
        });
        assert_eq!(back, page(1));
        let d = Arc::clone(&dev);
        let (mm, bd) = finishes("mm_stat and bd_stat", move || (d.mm_stat(), d.bd_stat()));
        assert!(mm.orig_data_size > 0);
        assert!(bd.unwrap().bd_count > 0);
        assert!(!reader.is_finished(), "the read did not wait on the store");

        store.stall(false);
        let out = reader.join().unwrap().unwrap();
        assert_eq!(out, page(0), "{format:?}: the stalled read's page");
        let mut patched = page(1000);
        patched[8..15].copy_from_slice(b"patched");
        let mut now = vec![0; PS];
        dev.read_page(STRIPES, &mut now).unwrap();
        assert_eq!(now, patched, "{format:?}");
        dev.read_page(2 * STRIPES, &mut now).unwrap();
        assert_eq!(now, vec![0; PS], "{format:?}: the discarded page");
    }
}

#[test]
fn a_page_rewritten_during_its_store_read_reads_as_rewritten() {
    let (dev, store) = written_back(8, WbFormat::Packed);
    store.stall(true);
    let reader = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            let mut out = vec![0; PS];
            dev.read_page(3, &mut out).map(|()| out)
        })
    };
    assert!(
        store.wait_for_stalled_reads(1, WATCHDOG),
        "no read reached the stalled store"
    );
    // The page itself is rewritten while its old copy is being read: the write needs no
    // store, and frees the old place, which the read's pin keeps from reuse.
    let d = Arc::clone(&dev);
    finishes("a rewrite of the page being read", move || {
        d.write_page(3, &page(333)).unwrap()
    });
    // Every other page goes too, so the old segment's only hold is the read's.
    let d = Arc::clone(&dev);
    let bd = finishes("discards of the segment's other pages", move || {
        for i in (0..8).filter(|&i| i != 3) {
            d.discard_page(i).unwrap();
        }
        d.bd_stat().unwrap()
    });
    assert_eq!(bd.bd_count, 0);
    assert!(
        bd.bytes_held > 0,
        "the pinned segment was freed under the read"
    );
    store.stall(false);
    let out = reader.join().unwrap().unwrap();
    assert_eq!(
        out,
        page(333),
        "the read answered with the page's old content"
    );
    // The read's pin gone, the segment went back to the store's allocator.
    assert_eq!(dev.bd_stat().unwrap().bytes_held, 0);
}

#[test]
fn a_partial_write_to_a_written_back_page_keeps_both_changes() {
    let (dev, store) = written_back(4, WbFormat::Packed);
    store.stall(true);
    // The partial write reads the page from the store first, with no lock held ...
    let patcher = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || dev.write_bytes(2 * PS as u64 + 100, b"first"))
    };
    assert!(
        store.wait_for_stalled_reads(1, WATCHDOG),
        "no read reached the stalled store"
    );
    // ... so a whole-page write to the same page gets in meanwhile; the patch must then be
    // applied to the new content, not to the stale copy it read.
    let d = Arc::clone(&dev);
    finishes(
        "a write of the page a partial write is reading",
        move || d.write_page(2, &page(222)).unwrap(),
    );
    store.stall(false);
    patcher.join().unwrap().unwrap();
    let mut want = page(222);
    want[100..105].copy_from_slice(b"first");
    let mut out = vec![0; PS];
    dev.read_page(2, &mut out).unwrap();
    assert_eq!(out, want);
}

/// A partial write that has read its written-back page (and found it current) but waits
/// for the page's lock behind a whole-page write of the same page: the whole-page write
/// goes first, so the patch must find the page changed under it and patch the new content,
/// not the copy it read. The order is forced, not raced: a save holds the page's stripe
/// (its writer stopped on the record of page `2 + STRIPES`), the whole-page write queues on
/// the stripe first and the partial write second, and parking_lot wakes them in that order.
#[test]
fn a_partial_write_queued_behind_a_rewrite_patches_the_new_content() {
    let (dev, _store) = written_back(STRIPES + 44, WbFormat::Packed);
    let mut out = common::StoppedSave::at_page(2 + STRIPES);
    let gate = Arc::clone(&out.gate);
    let saver = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || dev.save_state(&mut out).map(|_| ()))
    };
    gate.wait_stopped(|| saver.is_finished());
    // Queued first: the whole-page write.
    let (tid, rx) = mpsc::channel();
    let rewrite = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            tid.send(common::this_thread()).unwrap();
            dev.write_page(2, &page(222))
        })
    };
    common::wait_until_asleep(rx.recv().unwrap(), || rewrite.is_finished(), "the rewrite");
    assert!(
        !rewrite.is_finished(),
        "the rewrite did not wait for the save's lock"
    );
    // Queued second: the partial write, its read of the store done and still current.
    let (tid, rx) = mpsc::channel();
    let patch = {
        let dev = Arc::clone(&dev);
        std::thread::spawn(move || {
            tid.send(common::this_thread()).unwrap();
            dev.write_bytes(2 * PS as u64 + 100, b"first")
        })
    };
    common::wait_until_asleep(rx.recv().unwrap(), || patch.is_finished(), "the patch");
    assert!(
        !patch.is_finished(),
        "the patch did not wait for the save's lock"
    );
    gate.release();
    saver.join().unwrap().unwrap();
    rewrite.join().unwrap().unwrap();
    patch.join().unwrap().unwrap();
    let mut want = page(222);
    want[100..105].copy_from_slice(b"first");
    let mut out = vec![0; PS];
    dev.read_page(2, &mut out).unwrap();
    assert!(
        out == want,
        "the patch was applied to the copy read before the rewrite"
    );
}
