//! What a region's store does beyond holding pages: the refaults it counts, and the zram
//! device's writeback to a backing store under a region (pages written back fault in from
//! the store, exact, while threads read and write them).

mod common;

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use common::{check_page, own_pages_at_random, region, write_page, PAGE, WORDS};
use ztier_blockdev::memory::MemoryDevice;
use ztier_uffd::{Backing, PageSelector, PolicyConfig, Region, WbFormat};

/// A RAM disk store for a region of `len` bytes.
fn store_for(len: usize, format: WbFormat) -> Backing {
    let dev = MemoryDevice::new(Backing::size_for(len as u64)).expect("a RAM disk");
    Backing::new(Arc::new(dev), format).expect("a backing store")
}

/// A refault is a page the region evicted coming back: from the store (the faulting page
/// and its fault-around neighbours) or as zeros where the eviction found zeros; a page
/// never written, or dropped by the program, is not one.
#[test]
fn refaults_count_the_evicted_pages_that_come_back() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..8 {
        write_page(words, page, 1);
    }
    assert_eq!(r.stats().refaults, 0, "first touches are not refaults");
    for page in 0..8 {
        assert!(r.evict(page).unwrap());
    }
    for page in 0..8 {
        check_page(words, page, 1).unwrap();
    }
    let s = r.stats();
    assert_eq!(s.refaults, 8, "{s:?}");
    assert_eq!(s.faults + s.fault_around_pages, 8, "{s:?}");
    // A page written, zeroed and evicted goes out as zeros: its touch is a refault.
    words[20 * WORDS].store(7, Relaxed);
    words[20 * WORDS].store(0, Relaxed);
    assert!(r.evict(20).unwrap());
    assert_eq!(r.stats().zero_evictions, 1);
    assert_eq!(words[20 * WORDS].load(Relaxed), 0);
    assert_eq!(r.stats().refaults, 9);
    // Dropped by the program: the touch after is a first touch again.
    r.discard(20 * PAGE, PAGE).unwrap();
    assert_eq!(words[20 * WORDS].load(Relaxed), 0);
    // Never written: a first touch.
    assert_eq!(words[40 * WORDS].load(Relaxed), 0);
    let s = r.stats();
    assert_eq!(s.refaults, 9, "{s:?}");
    assert!(s.zero_faults >= 3, "{s:?}");
}

/// Stored copies written back to the device's store free their memory and fault in from
/// the store, exact; pages read in keep their copies there and are evicted again for
/// nothing; a write discards a page's copy on the store; the store cannot be taken away
/// while it holds pages.
#[test]
fn pages_written_back_fault_in_from_the_backing_store() {
    const PAGES: u64 = 256;
    let len = PAGES as usize * PAGE;
    let Some(r) = region(len, len) else {
        return;
    };
    let words = r.words();
    for page in 0..PAGES {
        write_page(words, page, 1);
    }
    for page in 0..PAGES {
        assert!(r.evict(page).unwrap());
    }
    assert!(
        r.writeback(PageSelector::Idle, None).is_err(),
        "writeback without a store is refused"
    );
    r.set_backing(Some(store_for(len, WbFormat::Packed)))
        .unwrap();
    let before = r.stats();
    assert_eq!(before.written_back_pages, 0);
    assert_eq!(r.mark_idle(None), PAGES);
    let wb = r.writeback(PageSelector::Idle, None).unwrap();
    assert_eq!(wb.pages, PAGES, "{wb:?}");
    let s = r.stats();
    assert_eq!(
        (s.written_back_pages, s.stored_pages),
        (PAGES, PAGES),
        "{s:?}"
    );
    assert!(
        s.mm_stat.compr_data_size < before.mm_stat.compr_data_size / 8,
        "the copies left memory: {before:?} then {s:?}"
    );
    assert!(
        r.set_backing(None).is_err(),
        "the store holds pages: it cannot be taken away"
    );
    for page in 0..PAGES {
        check_page(words, page, 1).unwrap();
    }
    let s = r.stats();
    let bd = s.bd_stat.expect("a store is set");
    assert!(bd.bd_reads > 0, "pages came from the store: {s:?}");
    assert_eq!(s.refaults, PAGES);
    assert_eq!(
        (s.clean_pages, s.written_back_pages),
        (PAGES, PAGES),
        "read in, the pages keep their copies on the store: {s:?}"
    );
    // Evicted again unwritten: nothing compressed or written anywhere.
    for page in 0..PAGES {
        assert!(r.evict(page).unwrap());
    }
    let again = r.stats();
    assert_eq!(again.evictions_clean, PAGES, "{again:?}");
    assert_eq!(again.bd_stat.unwrap().bd_writes, bd.bd_writes);
    // A write discards the page's copy, on the store too; the rest read back exact. (Read
    // in first: a write fault brings its fault-around neighbours in dirty too.)
    check_page(words, 3, 1).unwrap();
    let before_write = r.stats().written_back_pages;
    write_page(words, 3, 2);
    assert_eq!(r.stats().written_back_pages, before_write - 1);
    for page in 0..PAGES {
        check_page(words, page, if page == 3 { 2 } else { 1 }).unwrap();
    }
    assert_eq!(
        r.stats().poisoned_pages,
        0,
        "every read from the store succeeded"
    );
}

/// Writeback runs beside the program: four threads write and check their pages at random
/// under a tenth budget while another marks every stored copy idle and writes them back,
/// over and over, and zram's policy runs too. Every page reads back as last written.
///
/// The store is in the kernel's compressed format (a block a page, so a store with a block
/// for every page never fills). A packed store fills under this churn: a segment goes back
/// only when its last page does, and clean pages keep their copies in it for as long as they
/// are not written.
#[test]
fn writeback_beside_threads_faulting_keeps_every_page() {
    const PAGES: u64 = 2048;
    const THREADS: u64 = 4;
    let len = PAGES as usize * PAGE;
    let Some(r) = region(len, len / 10) else {
        return;
    };
    r.set_backing(Some(store_for(len, WbFormat::Compressed)))
        .unwrap();
    let policy = r
        .start_policy(PolicyConfig {
            recompress_idle: None,
            writeback_idle: None,
            mem_target: Some(64 * PAGE as u64),
            interval: std::time::Duration::from_millis(5),
            promotion_target: None,
        })
        .unwrap();
    let region: &Region = &r;
    let words = region.words();
    let done = AtomicBool::new(false);
    let mut written_back = 0;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    // A write in four.
                    own_pages_at_random(words, (t, THREADS), PAGES, 8000, 0x9E37_79B9_7F4A_7C15, 4)
                })
            })
            .collect();
        s.spawn(|| {
            while !done.load(Relaxed) {
                region.mark_idle(None);
                written_back += region.writeback(PageSelector::Idle, None).unwrap().pages;
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Relaxed);
    });
    drop(policy);
    let s = r.stats();
    let bd = s.bd_stat.unwrap();
    assert!(
        written_back > 100,
        "the writeback thread wrote: {written_back}, {s:?}"
    );
    assert!(bd.bd_reads > 100, "pages faulted in from the store: {s:?}");
    assert_eq!(s.poisoned_pages + s.evict_failures, 0, "{s:?}");
}
