//! A region keeps its budget: an eviction pass goes a little under it and rests, a small
//! budget is overrun by no more than its margin and a fault-around window, and every page
//! reads back while eight threads work under a tenth of the region.

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{check_page, own_pages_at_random, region, region_with, write_page, PAGE};

/// An eviction pass the budget starts goes down to a little under it (a sixteenth of the
/// budget, at most 128 pages), over as many of the reclaim thread's batches (256 pages) as
/// that takes, so that pages faulted in afterwards do not wake it again for each
/// fault-around window; and then rests while the region stays under its budget.
#[test]
fn an_eviction_pass_goes_a_little_under_the_budget_and_then_rests() {
    use std::time::{Duration, Instant};
    const PAGES: u64 = 2048;
    const BUDGET: u64 = 1024;
    // Past the budget by less than the 256 pages that call in the second evictor (two
    // evictors each take the excess they see, and may together go under the target), by
    // more than one batch past the target.
    const WRITTEN: u64 = BUDGET + 250;
    let Some(r) = region(PAGES as usize * PAGE, PAGES as usize * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..WRITTEN {
        write_page(words, page, 1);
    }
    r.set_budget(BUDGET as usize * PAGE).unwrap();
    let target = BUDGET - BUDGET / 16;
    let deadline = Instant::now() + Duration::from_secs(20);
    // Until the pass is over: down to the target, and its last eviction counted (a page's
    // state changes before its eviction is counted).
    let s = loop {
        let s = r.stats();
        if s.resident_pages <= target && s.evictions >= WRITTEN - target {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the pass never reached {target}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(
        (s.reclaim_target_pages, s.resident_pages, s.evictions),
        (target, target, WRITTEN - target),
        "where the pass stopped: {s:?}"
    );
    // Pages read back at once, one by one (every other page: no fault-around), leave the
    // region under its budget: the pass is over, nothing more goes out. (Most of them were
    // out: the pass took pages from the clock's hand on, but one whose lock was busy, or
    // that was touched, stays in and a later one goes instead.)
    for page in (0..32).step_by(2) {
        check_page(words, page, 1).unwrap();
    }
    // Two looks of the reclaim thread begun after the reads: one of them saw the region as
    // the reads left it, and evicted whatever it was going to.
    let looked = r.stats().reclaim_looks;
    while r.stats().reclaim_looks < looked + 2 {
        assert!(
            Instant::now() < deadline,
            "the reclaim thread stopped looking"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let after = r.stats();
    let brought = after.faults - s.faults + after.fault_around_pages - s.fault_around_pages;
    assert!(
        (8..=16).contains(&brought),
        "{brought} of 16 pages came back from the store: {after:?}"
    );
    assert_eq!(
        (after.evictions, after.resident_pages),
        (s.evictions, target + brought),
        "read {brought} pages back under the budget: {after:?}"
    );
    for page in 0..WRITTEN {
        check_page(words, page, 1).unwrap();
    }
}

/// A small budget is kept as closely as a large one, in proportion: while a thread reads
/// every page in order (each fault bringing a window in, the reclaim thread compressing
/// behind it), the resident pages run past the budget by at most its margin (a sixteenth
/// of it) and one fault-around window, not by the 128 pages a large budget's margin allows.
#[test]
fn a_small_budget_is_overrun_by_at_most_its_margin_and_a_window() {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;
    const PAGES: u64 = 2048;
    const BUDGET: u64 = 256;
    // Every eviction compresses, so the reclaim thread falls behind the reads.
    let config = ztier_uffd::RegionConfig {
        clean_pages: false,
        ..Default::default()
    };
    let Some(r) = region_with(PAGES as usize * PAGE, BUDGET as usize * PAGE, &config) else {
        return;
    };
    let words = r.words();
    for page in 0..PAGES {
        write_page(words, page, 1);
    }
    // Rounds of four reads each, until the sampler has seen the region past its budget (a
    // busy machine can starve the sampler through a round).
    let mut peak = 0;
    for _ in 0..16 {
        let done = AtomicBool::new(false);
        let round_peak = std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut peak = 0;
                while !done.load(Relaxed) {
                    peak = peak.max(r.stats().resident_pages);
                    std::thread::sleep(Duration::from_micros(20));
                }
                peak
            });
            for _ in 0..4 {
                for page in 0..PAGES {
                    check_page(words, page, 1).unwrap();
                }
            }
            done.store(true, Relaxed);
            sampler.join().unwrap()
        });
        peak = peak.max(round_peak);
        if peak > BUDGET {
            break;
        }
    }
    let limit = BUDGET + BUDGET / 16 + ztier_uffd::MAX_AROUND as u64 + 1;
    assert!(
        peak > BUDGET,
        "the reads ran the region past its budget, so the bound was tested: peak {peak}"
    );
    assert!(
        peak <= limit,
        "resident pages peaked at {peak}, past the budget {BUDGET} by more than its margin \
         and a fault-around window ({limit}): {:?}",
        r.stats()
    );
}

/// Eight threads each own every eighth page and write new versions of them or check them,
/// at random, while the reclaim thread keeps the region at a tenth of its size.
#[test]
fn every_page_reads_back_under_a_tenth_budget_with_eight_threads() {
    const PAGES: u64 = 4096;
    const THREADS: u64 = 8;
    let Some(r) = region(PAGES as usize * PAGE, PAGES as usize * PAGE / 10) else {
        return;
    };
    let words = r.words();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                own_pages_at_random(words, (t, THREADS), PAGES, 12_000, 0x2545_F491_4F6C_DD1D, 6)
            });
        }
    });
    let s = r.stats();
    assert!(s.evictions > 1000, "the reclaim thread ran: {s:?}");
    // Both kinds ran under the threads' writes: pages read in and evicted clean, pages
    // written after they came in stored anew (and every page read back above).
    assert!(
        s.evictions_clean > 100 && s.evictions_dirty > 100,
        "clean and dirty evictions: {s:?}"
    );
    assert_eq!(s.evictions, s.evictions_clean + s.evictions_dirty);
    assert!(s.faults > 1000, "pages came back from the store: {s:?}");
    assert!(
        s.resident_pages <= s.budget_pages + 2 * 64,
        "resident pages stay near the budget: {s:?}"
    );
    assert_eq!(
        s.evict_failures + s.poisoned_pages + s.held_pages,
        0,
        "{s:?}"
    );
}

/// Waits (at most 20 s) until the eviction pass `r`'s budget started is over: resident pages
/// at or under the budget, the store's count of its pages agreeing with the table's copies,
/// stored and clean (a page's state changes before its store's figures are read), and no
/// eviction in 20 ms.
fn after_the_pass(r: &ztier_uffd::Region) -> ztier_uffd::RegionStats {
    use std::time::{Duration, Instant};
    let settled = |s: &ztier_uffd::RegionStats| {
        s.resident_pages <= s.budget_pages
            && s.mm_stat.orig_data_size == (s.stored_pages + s.clean_pages) * PAGE as u64
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = r.stats();
        if settled(&s) {
            std::thread::sleep(Duration::from_millis(20));
            let again = r.stats();
            if settled(&again) && again.evictions == s.evictions {
                return again;
            }
        }
        assert!(Instant::now() < deadline, "the pass never ended: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A region of `pages` whose store frees copies once full, under a budget of `budget`
/// pages, with its first `written` pages written (version 1) and the pass that started
/// over: the region and its figures then. `None` where the region may not be made.
fn freeing_region(
    pages: u64,
    budget: u64,
    written: u64,
) -> Option<(common::Guarded, ztier_uffd::RegionStats)> {
    let config = ztier_uffd::RegionConfig {
        free_copies_when_full: true,
        ..Default::default()
    };
    let r = region_with(pages as usize * PAGE, budget as usize * PAGE, &config)?;
    for page in 0..written {
        write_page(r.words(), page, 1);
    }
    let s = after_the_pass(&r);
    Some((r, s))
}

/// With `free_copies_when_full`, a store that holds copies of more than half the pages the
/// budget leaves out is full (the kernel's `vm_swap_full()`): every page read back then
/// comes in without keeping its copy, so the store holds the pages that are out and nothing
/// more, and no eviction is a clean one.
#[test]
fn a_full_store_keeps_no_second_copy_of_a_page_read_back() {
    const PAGES: u64 = 1024;
    const BUDGET: u64 = 256;
    let Some((r, _)) = freeing_region(PAGES, BUDGET, PAGES) else {
        return;
    };
    let words = r.words();
    // Three quarters of the pages are out, always more than half of the store's room.
    for _ in 0..2 {
        for page in 0..PAGES {
            check_page(words, page, 1).unwrap();
        }
    }
    let s = after_the_pass(&r);
    assert_eq!(
        (s.clean_pages, s.evictions_clean),
        (0, 0),
        "no page came in clean: {s:?}"
    );
    assert!(
        s.copies_freed >= 2 * (PAGES - BUDGET),
        "each page brought back freed its copy: {s:?}"
    );
    assert!(s.stored_pages >= PAGES - BUDGET, "{s:?}");
}

/// ... and a store with room keeps them: a region whose budget left few of its pages out
/// brings them back clean, as with clean pages alone.
#[test]
fn a_store_with_room_keeps_the_copies_of_pages_read_back() {
    const PAGES: u64 = 1024;
    const BUDGET: u64 = 512;
    // Past the budget by under a tenth of the store's room: the pass leaves about 80 pages
    // out, and the copies grow only by evictions of pages not read back: well under the 256
    // that fill half of it.
    const WRITTEN: u64 = 560;
    let Some((r, before)) = freeing_region(PAGES, BUDGET, WRITTEN) else {
        return;
    };
    let words = r.words();
    assert!(
        (before.stored_pages + before.clean_pages) * 2 < PAGES - BUDGET,
        "{before:?}"
    );
    // The clock took its pages from the first on: those are the ones read back.
    for page in 0..32 {
        check_page(words, page, 1).unwrap();
    }
    let s = r.stats();
    assert!(s.faults > before.faults, "pages came back: {s:?}");
    assert!(
        s.clean_pages > 0 && s.copies_freed == 0,
        "they came back clean, no copy freed: {s:?}"
    );
}

/// ... and once the store is full, the clock frees the copy of each clean page it gives a
/// second chance and lifts its protection: such a page is dirty, and what it holds when it
/// goes out again is compressed anew.
#[test]
fn the_clock_frees_the_copies_of_clean_pages_once_the_store_is_full() {
    const PAGES: u64 = 1024;
    // Nearly all of 300 pages out, then read back under a budget that holds them all and
    // leaves room for 624 pages: copies of under 300 are under half of it, so they come
    // back clean, each faulted in since the clock last passed it.
    let Some((r, _)) = freeing_region(PAGES, 8, 300) else {
        return;
    };
    let words = r.words();
    r.set_budget(400 * PAGE).unwrap();
    for page in 0..300 {
        check_page(words, page, 1).unwrap();
    }
    let clean = r.stats();
    assert!(
        clean.clean_pages > 250 && clean.copies_freed == 0,
        "{clean:?}"
    );
    // The rest of the pages written under no budget, then one that leaves room for 324
    // pages, more than half of which the clean pages' copies fill. Fewer pages are cold
    // (not faulted in since the clock's last pass: 0..300's fault-around neighbours) than
    // must go, so the clock laps the region to evict down to it, passing the clean pages'
    // faulting ones while the store is full.
    r.set_budget(PAGES as usize * PAGE).unwrap();
    for page in 300..PAGES {
        write_page(words, page, 1);
    }
    r.set_budget(700 * PAGE).unwrap();
    let s = after_the_pass(&r);
    assert!(
        s.copies_freed > 0 && s.clean_pages < clean.clean_pages,
        "the clock freed copies: {s:?}"
    );
    // All but a few pages pushed out (the freed ones compressed anew) and read back; then
    // every page written again, all but a few pushed out, and read back as last written.
    r.set_budget(64 * PAGE).unwrap();
    after_the_pass(&r);
    for page in 0..PAGES {
        check_page(words, page, 1).unwrap();
    }
    r.set_budget(PAGES as usize * PAGE).unwrap();
    for page in 0..PAGES {
        write_page(words, page, 2);
    }
    r.set_budget(64 * PAGE).unwrap();
    after_the_pass(&r);
    for page in 0..PAGES {
        check_page(words, page, 2).unwrap();
    }
}
