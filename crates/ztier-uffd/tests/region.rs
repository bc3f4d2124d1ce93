//! A region's pages read back as written whatever evicts them: evicted one by one or in
//! runs, stored or found all zeros, clean (read in, evicted again with nothing written) or
//! written since, refused by the store, and with threads writing into a run as it moves;
//! and the pad they pass through goes back to the OS.
mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{check_page, region, region_with, write_page, written_region, PAGE, WORDS};
use ztier_base::rng::Rng;

#[test]
fn a_never_written_page_reads_as_zeros_and_costs_no_store() {
    let Some(r) = region(256 * PAGE, 256 * PAGE) else {
        return;
    };
    let words = r.words();
    assert!(words.iter().all(|w| w.load(Relaxed) == 0));
    let s = r.stats();
    assert_eq!(s.zero_faults, 256, "{s:?}");
    assert_eq!(s.resident_pages, 256);
    // Evicted, a page of zeros is dropped with nothing stored.
    for page in 0..256 {
        assert!(r.evict(page).unwrap(), "page {page} was resident");
    }
    let s = r.stats();
    assert_eq!(
        (s.resident_pages, s.stored_pages, s.evictions),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(s.zero_evictions, 256);
    assert_eq!(
        s.mm_stat.orig_data_size, 0,
        "the device holds nothing: {s:?}"
    );
    assert!(words.iter().all(|w| w.load(Relaxed) == 0));
    // A page written with zeros is no different.
    words[5 * WORDS].store(0, Relaxed);
    assert!(r.evict(5).unwrap());
    assert_eq!(r.stats().stored_pages, 0);
}

/// While another thread of the program drops a page every few microseconds (each drop an
/// event the fault thread must read, until which the kernel refuses every move), an
/// eviction of a resident page waits that out and goes: it never says "not resident" for
/// it.
#[test]
fn an_eviction_waits_out_the_programs_drops() {
    const PAGES: u64 = 512;
    let Some(r) = written_region(PAGES + 1) else {
        return;
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let drops = std::sync::atomic::AtomicU64::new(0);
    let rounds = std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                r.discard(PAGES as usize * PAGE, PAGE).unwrap();
                drops.fetch_add(1, Relaxed);
                // A pause between drops, as a program's allocator makes them: back to back,
                // the kernel refuses every move for as long as they go on.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        });
        // Stops the dropper however the evictions end (a failed assertion included).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Relaxed);
            }
        }
        let _stopping = Stop(&stop);
        // Four rounds, and more while the dropper (on a loaded machine, slow to get a
        // core) has made too few drops to have run beside them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut round = 0;
        while round < 4 || (drops.load(Relaxed) <= 100 && std::time::Instant::now() < deadline) {
            for page in 0..PAGES {
                assert!(
                    r.evict(page).unwrap(),
                    "round {round}: page {page} went out"
                );
                check_page(r.words(), page, 1).unwrap();
            }
            round += 1;
        }
        round
    });
    let drops = drops.load(Relaxed);
    assert!(drops > 100, "the drops ran beside the evictions: {drops}");
    let s = r.stats();
    assert_eq!(s.evictions, rounds * PAGES, "{s:?}");
}

#[test]
fn an_evicted_page_is_stored_and_comes_back() {
    let Some(r) = written_region(64) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        assert!(r.evict(page).unwrap());
    }
    let s = r.stats();
    assert_eq!(
        (s.resident_pages, s.stored_pages, s.evictions),
        (0, 64, 64),
        "{s:?}"
    );
    assert_eq!(s.mm_stat.orig_data_size, 64 * PAGE as u64);
    for page in 0..64 {
        check_page(words, page, 1).unwrap();
    }
    let s = r.stats();
    // Read in order, most pages came in by fault-around, a few faults each bringing more.
    assert_eq!((s.resident_pages, s.stored_pages), (64, 0), "{s:?}");
    assert_eq!(s.faults + s.fault_around_pages, 64, "{s:?}");
    assert!(
        s.faults <= 8,
        "fault-around took the sequential reads: {s:?}"
    );
    assert_eq!(
        s.fault_latency_us.iter().sum::<u64>(),
        s.faults + s.zero_faults
    );
    assert!(r.evict(64).is_err(), "page 64 is beyond the region");
}

/// Pages an evictor found all zeros come back in runs, not a fault each: fault-around maps
/// them among and after the stored pages it brings in, and a read of one maps the zeroed
/// ones after it, with the window it reached (a run of them used to cost a fault a page).
#[test]
fn pages_found_all_zeros_come_back_in_runs() {
    let Some(r) = written_region(96) else {
        return;
    };
    let words = r.words();
    // Pages 24-29 and 40-95 all zeros: six among the stored pages, 56 after them.
    let zeros = |page: u64| (24..30).contains(&page) || page >= 40;
    for page in (0..96).filter(|&p| zeros(p)) {
        write_page(words, page, 0);
    }
    for page in 0..96 {
        assert!(r.evict(page).unwrap());
    }
    let b = r.stats();
    assert_eq!((b.stored_pages, b.zero_evictions), (34, 62), "{b:?}");
    for page in 0..96 {
        check_page(words, page, u64::from(!zeros(page))).unwrap();
    }
    let s = r.stats();
    assert_eq!(s.resident_pages, 96, "{s:?}");
    let (faults, zero_faults) = (s.faults - b.faults, s.zero_faults - b.zero_faults);
    let around = s.fault_around_pages - b.fault_around_pages;
    assert_eq!(faults + zero_faults + around, 96, "{s:?}");
    // The window doubles as the reads follow on (0, 1, 2, 4, 8, 16, 32 pages after each
    // fault's own): seven faults from the store reach page 69, through the zeros from page
    // 40 on, and one on a zeroed page brings in the rest (it was a fault a page).
    assert_eq!((faults, zero_faults), (7, 1), "{s:?}");
}

/// The pages `Region::evict` takes out go back to the OS sixteen at a time, or once the
/// region is idle: the pad never holds more, holds none once a sixteenth call has emptied
/// it, and none soon after the calls stop.
#[test]
fn evicted_pages_go_back_to_the_os_sixteen_at_a_time() {
    let Some(r) = written_region(64) else {
        return;
    };
    let words = r.words();
    let pad_rss = || common::rss_of(r.pad_range()) / PAGE;
    assert_eq!(pad_rss(), 0);
    // Each call leaves its page in the pad until an emptying: the sixteenth call's, or the
    // reclaim thread's, idle (on one of its looks, each 100 ms: it may fall anywhere in this
    // loop on a busy machine, and starts the count of sixteen again). So after a call the
    // pad holds the calls since the last emptying: exactly one more than before (none after
    // the sixteenth) when the reclaim thread did not look meanwhile; when it did, also just
    // this call's page (emptied before the call) or none (emptied after it). Never sixteen.
    let (mut since_empty, mut exact) = (0, 0);
    for page in 0..40 {
        let looks = r.stats().reclaim_looks;
        assert!(r.evict(page).unwrap());
        let now = pad_rss();
        // A look counts once it has emptied the pad: one under way as the pad was read is
        // waited for (a moment) before the count is taken as none.
        let mut looked = r.stats().reclaim_looks != looks;
        if !looked && now != since_empty + 1 && now != (since_empty + 1) % 16 {
            let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
            while !looked && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
                looked = r.stats().reclaim_looks != looks;
            }
        }
        since_empty = (since_empty + 1) % 16;
        if !looked {
            assert_eq!(
                now,
                since_empty,
                "after {} evictions the pad holds {now} pages",
                page + 1
            );
            exact += 1;
        } else {
            assert!(
                now == since_empty || now <= 1,
                "after {} evictions the pad holds {now} pages",
                page + 1
            );
            since_empty = now;
        }
    }
    // Forty calls take well under a look's 100 ms on an idle machine: most are exact, and a
    // few are enough to tell pages kept from pages given back at once.
    assert!(
        exact >= 4,
        "{exact} of 40 calls had no look of the reclaim thread beside them"
    );
    // The last 8: given back by the reclaim thread, idle, within about 0.1 s.
    common::wait_until_pad_empty(&r);
    for page in 0..64 {
        check_page(words, page, 1).unwrap();
    }
}

/// An emptying of `Region::evict`'s part of the pad reads the pages in it first (so the
/// frames it gives back are warm), and only those present: calls on pages that were not
/// resident leave holes in the pad, which a read would fault on with no one to serve it.
/// With holes between written, clean and zero pages, every emptying ends, the pad goes back
/// to the OS, and every page reads back as it was.
#[test]
fn emptying_a_pad_with_holes_reads_only_what_is_there() {
    // A read of a hole would wait forever: on a thread of its own, with a deadline.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        pad_with_holes();
        let _ = done.send(());
    });
    match finished.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(()) => {}
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("evicting through a pad with holes did not end within 60 s")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("evicting through a pad with holes failed (above)")
        }
    }
}

fn pad_with_holes() {
    let Some(r) = region(128 * PAGE, 128 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..32 {
        write_page(words, page, 3);
    }
    // Pages 32..64 read once (the zero page), 64..128 never touched.
    for page in 32..64 {
        assert_eq!(words[page as usize * WORDS].load(Relaxed), 0);
    }
    let pad_rss = || common::rss_of(r.pad_range());
    // Written pages out (dirty), each followed by a call on a page never touched: a hole.
    for page in 0..32 {
        assert!(r.evict(page).unwrap());
        assert!(
            !r.evict(64 + page).unwrap(),
            "page {} was never resident",
            64 + page
        );
    }
    assert!(pad_rss() <= 16 * PAGE);
    common::wait_until_pad_empty(&r);
    // Read back, so each is clean, then out again (nothing compressed), beside zero pages
    // and holes.
    for page in 0..32 {
        check_page(words, page, 3).unwrap();
    }
    for page in 0..32 {
        assert!(r.evict(page).unwrap());
        assert!(
            r.evict(32 + page).unwrap(),
            "page {} held the zero page",
            32 + page
        );
        assert!(!r.evict(96 + page).unwrap());
        assert!(!r.evict(96 + page).unwrap());
    }
    assert!(pad_rss() <= 16 * PAGE);
    common::wait_until_pad_empty(&r);
    let s = r.stats();
    assert_eq!(
        (s.evictions_dirty, s.evictions_clean, s.zero_evictions),
        (32, 32, 32),
        "{s:?}"
    );
    for page in 0..32 {
        check_page(words, page, 3).unwrap();
    }
    for page in 32..128 {
        assert!(
            (0..WORDS).all(|w| words[page as usize * WORDS + w].load(Relaxed) == 0),
            "page {page} reads as zeros"
        );
    }
}

/// The words of page `page`'s noise at `version`, in order.
fn noise(page: u64, version: u64) -> Rng {
    Rng::from_state((page + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version)
}

/// Pages that do not compress (each is stored raw: the device's `huge_pages_since` counts
/// every write of one), page `page`'s at `version`.
fn write_noise(words: &[std::sync::atomic::AtomicU64], page: u64, version: u64) {
    let mut rng = noise(page, version);
    for w in 0..WORDS {
        words[page as usize * WORDS + w].store(rng.next_u64(), Relaxed);
    }
}

fn noise_is(words: &[std::sync::atomic::AtomicU64], page: u64, version: u64) -> bool {
    let mut rng = noise(page, version);
    (0..WORDS).all(|w| words[page as usize * WORDS + w].load(Relaxed) == rng.next_u64())
}

/// A page read back in from the store and not written since keeps its copy there:
/// evicting it again writes nothing to the store (its figures do not move) and counts as
/// clean; it reads back the same.
#[test]
fn a_clean_page_is_evicted_again_without_writing_the_store() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..8 {
        write_noise(words, page, 1);
        assert!(r.evict(page).unwrap());
    }
    let s = r.stats();
    assert_eq!(
        (s.evictions_dirty, s.mm_stat.huge_pages_since),
        (8, 8),
        "{s:?}"
    );
    for page in 0..8 {
        assert!(noise_is(words, page, 1), "page {page} read back");
    }
    let before = r.stats();
    assert_eq!(
        (before.clean_pages, before.stored_pages),
        (8, 0),
        "{before:?}"
    );
    for page in 0..8 {
        assert!(r.evict(page).unwrap());
    }
    let s = r.stats();
    assert_eq!(
        (s.evictions_clean, s.evictions_dirty, s.evictions),
        (8, 8, 16),
        "{s:?}"
    );
    assert_eq!(s.mm_stat, before.mm_stat, "the store was not written");
    assert_eq!(
        (s.clean_pages, s.stored_pages, s.resident_pages),
        (0, 8, 0),
        "{s:?}"
    );
    for page in 0..8 {
        assert!(noise_is(words, page, 1), "page {page} read back again");
    }
}

/// With clean pages off, a page read back comes in dirty: evicted again it is written anew.
#[test]
fn with_clean_pages_off_every_eviction_writes() {
    let config = ztier_uffd::RegionConfig {
        clean_pages: false,
        ..Default::default()
    };
    let Some(r) = region_with(64 * PAGE, 64 * PAGE, &config) else {
        return;
    };
    let words = r.words();
    for page in 0..8 {
        write_noise(words, page, 1);
        assert!(r.evict(page).unwrap());
        assert!(noise_is(words, page, 1), "page {page} read back");
        assert!(r.evict(page).unwrap());
        assert!(noise_is(words, page, 1), "page {page} read back again");
    }
    let s = r.stats();
    assert_eq!(
        (
            s.evictions_clean,
            s.evictions_dirty,
            s.clean_pages,
            s.mm_stat.huge_pages_since
        ),
        (0, 16, 0, 16),
        "{s:?}"
    );
}

/// A page written after it came in clean loses its copy at the write: evicted again it is
/// stored anew and reads back what was written, a whole page or one word of it.
#[test]
fn a_page_written_after_it_came_in_is_stored_anew() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..8 {
        write_noise(words, page, 1);
        assert!(r.evict(page).unwrap());
        assert!(noise_is(words, page, 1), "page {page} read back");
    }
    assert_eq!(r.stats().clean_pages, 8);
    // Pages 0-3 rewritten whole; pages 4-7 one word each, the last.
    for page in 0..4 {
        write_noise(words, page, 2);
    }
    for page in 4..8 {
        words[page as usize * WORDS + WORDS - 1].store(0xDEAD_BEEF ^ page, Relaxed);
    }
    let s = r.stats();
    assert_eq!(
        (
            s.clean_pages,
            s.mm_stat.orig_data_size,
            s.first_write_faults
        ),
        (0, 0, 8),
        "the copies went at the writes: {s:?}"
    );
    for page in 0..8 {
        assert!(r.evict(page).unwrap());
    }
    let s = r.stats();
    assert_eq!(
        (
            s.evictions_clean,
            s.evictions_dirty,
            s.mm_stat.huge_pages_since
        ),
        (0, 16, 16),
        "{s:?}"
    );
    for page in 0..4 {
        assert!(noise_is(words, page, 2), "page {page} reads its new bytes");
    }
    for page in 4..8 {
        let base = page as usize * WORDS;
        assert_eq!(words[base + WORDS - 1].load(Relaxed), 0xDEAD_BEEF ^ page);
        // The rest of the page as it was.
        let mut rng = noise(page, 1);
        for w in 0..WORDS - 1 {
            let x = rng.next_u64();
            assert_eq!(words[base + w].load(Relaxed), x, "page {page} word {w}");
        }
    }
}

/// A store past the device's memory limit refuses the page: the eviction says why, and the
/// page stays in memory with its content.
#[test]
fn a_refused_store_keeps_the_page() {
    let config = ztier_uffd::RegionConfig {
        store_limit: 8 * PAGE as u64,
        ..Default::default()
    };
    let Some(r) = region_with(64 * PAGE, 64 * PAGE, &config) else {
        return;
    };
    let words = r.words();
    // Pages that do not compress: each takes a whole page of the store.
    let mut rng = Rng::from_state(0x9E37_79B9_7F4A_7C15);
    let noise: Vec<u64> = (0..64 * WORDS).map(|_| rng.next_u64()).collect();
    for (w, v) in words.iter().zip(&noise) {
        w.store(*v, Relaxed);
    }
    let mut refused = 0;
    for page in 0..64 {
        match r.evict(page) {
            Ok(out) => assert!(out),
            Err(ztier_uffd::Error::Store { page: p, .. }) => {
                assert_eq!(p, page);
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        refused > 0 && refused < 64,
        "the limit refused some: {refused}"
    );
    let s = r.stats();
    assert_eq!(s.held_pages, refused, "{s:?}");
    assert_eq!(s.evict_failures, refused);
    assert!(r.last_error().unwrap().contains("stays resident"));
    for (i, (w, v)) in words.iter().zip(&noise).enumerate() {
        assert_eq!(w.load(Relaxed), *v, "word {i}");
    }
    assert_eq!(
        r.stats().held_pages,
        0,
        "touched, the held pages are back in the region"
    );
}

/// The evictors move runs of neighbouring cold pages with one move each. Four threads
/// write whole pages of their own contiguous blocks over and over, in order (so the writes
/// land on pages of a run as it is moved), while the budget is cut to an eighth, until
/// every page was evicted dirty three times over: every page reads back the last version
/// written, at once and at the end.
#[test]
fn a_run_moved_while_threads_write_into_it_reads_back_exact() {
    const PAGES: u64 = 2048;
    const THREADS: u64 = 4;
    let Some(r) = region(PAGES as usize * PAGE, PAGES as usize * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..PAGES {
        write_page(words, page, 1);
    }
    let block = PAGES / THREADS;
    let done = std::sync::atomic::AtomicBool::new(false);
    let versions: Vec<u64> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let done = &done;
                s.spawn(move || {
                    let mut version = 1;
                    while !done.load(Relaxed) {
                        version += 1;
                        for page in t * block..(t + 1) * block {
                            write_page(words, page, version);
                            check_page(words, page, version).unwrap();
                        }
                    }
                    version
                })
            })
            .collect();
        r.set_budget(PAGES as usize * PAGE / 8).unwrap();
        let t = std::time::Instant::now();
        while r.stats().evictions_dirty < 4 * PAGES
            && t.elapsed() < std::time::Duration::from_secs(30)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        done.store(true, Relaxed);
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    for page in 0..PAGES {
        check_page(words, page, versions[(page / block) as usize]).unwrap();
    }
    let s = r.stats();
    assert!(
        s.evictions_dirty >= 4 * PAGES,
        "pages were evicted as they were written: {s:?}"
    );
    assert_eq!(
        s.evict_failures + s.poisoned_pages + s.held_pages + s.lost_pages,
        0,
        "{s:?}"
    );
}
