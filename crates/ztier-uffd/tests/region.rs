//! A region's pages read back as written whatever evicts them, and the program's own drops,
//! unmaps and moves never bring back a stale copy.
// The program's own madvise, munmap, mremap and fork are raw calls on the region's memory,
// each with its reason.
#![allow(unsafe_code)]

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{check_page, own_pages_at_random, region, region_with, write_page, PAGE, WORDS};

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

#[test]
fn an_evicted_page_is_stored_and_comes_back() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        write_page(words, page, 1);
    }
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

/// The pages `Region::evict` takes out go back to the OS sixteen at a time, or once the
/// region is idle: the pad never holds more, holds none once a sixteenth call has emptied
/// it, and none soon after the calls stop.
#[test]
fn evicted_pages_go_back_to_the_os_sixteen_at_a_time() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        write_page(words, page, 1);
    }
    let pad_rss = || common::rss_of(r.pad_range()) / PAGE;
    assert_eq!(pad_rss(), 0);
    // Each call leaves its page in the pad until an emptying: the sixteenth call's, or the
    // reclaim thread's, idle (its 100 ms tick may fall anywhere in this loop on a busy
    // machine, between two calls, and starts the count of sixteen again). So after each
    // call the pad holds the calls since the last emptying: one more than before, or just
    // this call's page after an idle emptying, or none after the sixteenth; never sixteen.
    let (mut held, mut since_empty) = (0, 0);
    for page in 0..40 {
        assert!(r.evict(page).unwrap());
        let now = pad_rss();
        since_empty = if now == 1 && held != 0 {
            1
        } else {
            since_empty + 1
        };
        if since_empty == 16 {
            since_empty = 0;
        }
        assert_eq!(
            now,
            since_empty,
            "after {} evictions the pad holds {now} pages, {held} before this one",
            page + 1
        );
        held = now;
    }
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

/// Pages that do not compress (each is stored raw: the device's `huge_pages_since` counts
/// every write of one), page `page`'s at `version`.
fn write_noise(words: &[std::sync::atomic::AtomicU64], page: u64, version: u64) {
    let mut x = (page + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version;
    for w in 0..WORDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        words[page as usize * WORDS + w].store(x, Relaxed);
    }
}

fn noise_is(words: &[std::sync::atomic::AtomicU64], page: u64, version: u64) -> bool {
    let mut x = (page + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version;
    (0..WORDS).all(|w| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        words[page as usize * WORDS + w].load(Relaxed) == x
    })
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
        let mut x = (page + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 1;
        for w in 0..WORDS - 1 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            assert_eq!(words[base + w].load(Relaxed), x, "page {page} word {w}");
        }
    }
}

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

#[test]
fn the_programs_madv_dontneed_never_brings_back_a_stored_copy() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        write_page(words, page, 1);
    }
    // Half out in the store, half resident; then the program drops pages 16..48 itself.
    for page in 0..32 {
        assert!(r.evict(page).unwrap());
    }
    let p = r.as_ptr();
    // SAFETY: inside the region; dropping it is what the test means.
    let rc = unsafe { libc::madvise(p.add(16 * PAGE).cast(), 32 * PAGE, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    let s = r.stats();
    assert_eq!(
        s.stored_pages, 16,
        "the dropped pages' stored copies went: {s:?}"
    );
    assert_eq!(s.removed_pages, 32);
    assert_eq!(s.mm_stat.orig_data_size, 16 * PAGE as u64);
    for page in 0..64 {
        let version = if (16..48).contains(&page) { 0 } else { 1 };
        check_page(words, page, version).unwrap();
    }
    // Written again, evicted, dropped through the region's own call: zeros again.
    write_page(words, 20, 2);
    assert!(r.evict(20).unwrap());
    r.discard(20 * PAGE, PAGE).unwrap();
    check_page(words, 20, 0).unwrap();
}

#[test]
fn the_programs_munmap_drops_the_stored_copies() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        write_page(words, page, 1);
    }
    for page in 0..64 {
        assert!(r.evict(page).unwrap());
    }
    let p = r.as_ptr();
    // SAFETY: the region's last 32 pages are replaced by fresh anonymous memory (an unmap
    // and a new mapping in one call, so no other thread's mapping can land in between).
    unsafe {
        let q = libc::mmap(
            p.add(32 * PAGE).cast(),
            32 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(q, p.add(32 * PAGE).cast());
    }
    let s = r.stats();
    assert_eq!(s.stored_pages, 32, "{s:?}");
    assert_eq!(s.unmapped_pages, 32);
    for page in 0..64 {
        check_page(words, page, if page < 32 { 1 } else { 0 }).unwrap();
    }
    // The new memory is the program's: the region never takes its pages, nor unmaps them.
    for page in 32..64 {
        write_page(words, page, 3);
        assert!(!r.evict(page).unwrap());
        check_page(words, page, 3).unwrap();
    }
    let ours = p as usize + 32 * PAGE;
    drop(r);
    // SAFETY: the test's own mapping; it reads as written after the region went.
    unsafe {
        let w = std::slice::from_raw_parts(ours as *const std::sync::atomic::AtomicU64, 32 * WORDS);
        for page in 0..32 {
            for i in 0..WORDS {
                assert_eq!(
                    w[page * WORDS + i].load(Relaxed),
                    common::word(32 + page as u64, 3, i)
                );
            }
        }
        libc::munmap(ours as *mut libc::c_void, 32 * PAGE);
    }
}

#[test]
fn the_programs_mremap_takes_its_pages_out_with_their_content() {
    let Some(r) = region(64 * PAGE, 64 * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..64 {
        write_page(words, page, 1);
    }
    for page in (0..64).step_by(2) {
        assert!(r.evict(page).unwrap());
    }
    let p = r.as_ptr();
    // SAFETY: pages 32..64 move onto a place reserved for them; fresh memory is then mapped
    // where they were, unless another thread's mapping landed there meanwhile
    // (MAP_FIXED_NOREPLACE refuses to replace it).
    let (moved, old_after, refilled) = unsafe {
        let hole = libc::mmap(
            std::ptr::null_mut(),
            32 * PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(hole, libc::MAP_FAILED);
        let q = libc::mremap(
            p.add(32 * PAGE).cast(),
            32 * PAGE,
            32 * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            hole,
        );
        assert_eq!(q, hole, "{}", std::io::Error::last_os_error());
        let back = libc::mmap(
            p.add(32 * PAGE).cast(),
            32 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        let moved =
            std::slice::from_raw_parts(q.cast::<std::sync::atomic::AtomicU64>(), 32 * WORDS);
        (moved, q, back == p.add(32 * PAGE).cast())
    };
    let s = r.stats();
    assert_eq!(
        s.stored_pages, 16,
        "the moved pages' copies left the store: {s:?}"
    );
    assert_eq!(s.remapped_pages, 32);
    for page in 0..32u64 {
        // The moved pages read as written, at their new place.
        let base = page as usize * WORDS;
        for w in 0..WORDS {
            assert_eq!(
                moved[base + w].load(Relaxed),
                common::word(32 + page, 1, w),
                "moved page {page} word {w}"
            );
        }
    }
    let pages = if refilled { 64 } else { 32 };
    for page in 0..pages {
        check_page(words, page, if page < 32 { 1 } else { 0 }).unwrap();
    }
    let old = p as usize + 32 * PAGE;
    drop(r);
    // SAFETY: the moved pages, and the fresh memory where they were: the test's own, which
    // the region left alone.
    unsafe {
        libc::munmap(old_after, 32 * PAGE);
        if refilled {
            libc::munmap(old as *mut libc::c_void, 32 * PAGE);
        }
    }
}

#[test]
fn the_region_can_be_dropped_by_the_last_of_many_faulting_threads() {
    let Some(r) = region(1024 * PAGE, 64 * PAGE) else {
        return;
    };
    let r = std::sync::Arc::new(r);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let r = std::sync::Arc::clone(&r);
            std::thread::spawn(move || {
                let words = r.words();
                for round in 1..=3 {
                    for page in (t..1024).step_by(8) {
                        write_page(words, page, round);
                    }
                }
                for page in (t..1024).step_by(8) {
                    check_page(words, page, 3).unwrap();
                }
                // Whichever thread ends last drops the region, with the others' faults
                // possibly still being served.
            })
        })
        .collect();
    drop(r);
    for t in threads {
        t.join().unwrap();
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
    let mut x = 0x9E37_79B9_7F4A_7C15_u64;
    let mut noise = vec![0u64; 64 * WORDS];
    for w in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *w = x;
    }
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

/// fork's child does not have the region (MADV_DONTFORK): nothing there is mapped in it, so
/// it can neither fault on pages no handler serves nor share the region's pages.
#[test]
fn a_forked_child_does_not_have_the_region() {
    let Some(r) = region(16 * PAGE, 16 * PAGE) else {
        return;
    };
    write_page(r.words(), 3, 1);
    let p = r.as_ptr();
    // SAFETY: the child calls only madvise and _exit (async-signal-safe) before it ends.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: advice that changes nothing, on an address range; ENOMEM says it is
        // not mapped.
        let rc = unsafe { libc::madvise(p.cast(), 16 * PAGE, libc::MADV_NORMAL) };
        let unmapped =
            rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
        // SAFETY: ends the child at once, running nothing of the parent's.
        unsafe { libc::_exit(if unmapped { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child, writing its status into a live int.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child had the region mapped (status {status:#x})"
    );
    check_page(r.words(), 3, 1).unwrap();
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
        s.evict_failures + s.poisoned_pages + s.held_pages,
        0,
        "{s:?}"
    );
}

/// A run across two mappings (the program made a page in the middle read-only, which
/// splits the region's mapping) is not moved whole: the pages on either side go out page
/// by page, the read-only one stays (the move refuses it), and all read back.
#[test]
fn a_run_across_a_protection_change_goes_out_page_by_page() {
    const PAGES: u64 = 64;
    let Some(r) = region(PAGES as usize * PAGE, PAGES as usize * PAGE) else {
        return;
    };
    let words = r.words();
    for page in 0..PAGES {
        write_page(words, page, 1);
    }
    // SAFETY: page 20 of the region, made read-only (its content kept); the test only reads
    // it until it is made writable again below.
    let rc = unsafe { libc::mprotect(r.as_ptr().add(20 * PAGE).cast(), PAGE, libc::PROT_READ) };
    assert_eq!(rc, 0);
    r.set_budget(4 * PAGE).unwrap();
    let t = std::time::Instant::now();
    while r.stats().resident_pages > 4 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "the pages around the read-only one go out: {:?}",
            r.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let s = r.stats();
    assert!(s.evictions_dirty >= PAGES - 4, "{s:?}");
    assert!(r
        .last_error()
        .is_some_and(|e| e.contains("page 20") && e.contains("read-only")));
    check_page(words, 20, 1).unwrap();
    // SAFETY: the same page made writable again, as the rest of the region.
    let rc = unsafe {
        libc::mprotect(
            r.as_ptr().add(20 * PAGE).cast(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, 0);
    r.set_budget(PAGES as usize * PAGE).unwrap();
    for page in 0..PAGES {
        check_page(words, page, 1).unwrap();
        write_page(words, page, 2);
    }
    for page in 0..PAGES {
        check_page(words, page, 2).unwrap();
    }
}

#[test]
fn the_floors_bare_handler_serves_every_touch_on_one_cpu_on_two_and_placed_as_a_region() {
    // A region first, so a process that may not use userfaultfd skips here as everywhere;
    // whether its fault thread may use idle priority (it may leave it again: root here).
    let Some(idle_priority) = region(PAGE, PAGE).map(|r| r.stats().idle_priority_usable) else {
        return;
    };
    let _dog = common::Watchdog::new(common::WATCHDOG);
    let floor = ztier_uffd::rig::floor::bare_fault_latency(300).unwrap();
    assert_eq!(floor.one_cpu.len(), 300);
    assert!(floor.one_cpu.iter().all(|d| !d.is_zero()));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    match &floor.two_cpus {
        Some(two) => assert_eq!(two.len(), 300),
        None => assert_eq!(cpus, 1, "two CPUs usable but none measured"),
    }
    // With a CPU latency request too, where the process may make one (root).
    let may_request = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/cpu_dma_latency")
        .is_ok();
    match &floor.two_cpus_latency_qos {
        Some(two) => assert_eq!(two.len(), 300),
        None => assert!(
            cpus == 1 || !may_request,
            "a request could be made but none measured"
        ),
    }
    // Placed as a region's fault thread places itself, where a region's fault thread may
    // use idle priority and there are two CPUs.
    match &floor.placed_as_region {
        Some(placed) => {
            assert_eq!(placed.len(), 300);
            assert!(placed.iter().all(|d| !d.is_zero()));
        }
        None => assert!(
            cpus == 1 || !idle_priority,
            "idle priority usable on two CPUs but no placed floor measured"
        ),
    }
}

/// A fault takes the region's CPU latency request (idle CPUs then poll, so a fault's
/// wake-ups across CPUs cost little), a spell with no fault gives it back, the next faults
/// take it again, and a region told not to makes none. Where `/dev/cpu_dma_latency`
/// cannot be opened (not root), the region says why, and this skips.
#[test]
fn a_fault_holds_the_cpu_latency_request_until_faults_stop() {
    let Some(r) = region(4 * PAGE, 4 * PAGE) else {
        return;
    };
    let s = r.stats();
    if !s.cpu_latency_qos_usable {
        let why = r
            .cpu_latency_qos_unused()
            .expect("a reason where it is not usable");
        // A kernel without the device (no CONFIG_CPU_IDLE) cannot be given one; a device
        // this process may not use can.
        let device = std::path::Path::new("/dev/cpu_dma_latency").exists();
        if std::env::var_os("CI").is_some() && device {
            panic!("CI must run the CPU latency request's test: {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    assert_eq!(r.cpu_latency_qos_unused(), None);
    let words = r.words();
    // The first touch faults (a page never written); the reading after it includes what
    // the fault thread did for it. (Whether it is still held depends on this thread
    // running within 10 ms; that a held request sets the machine's target is the unit
    // tests' to show.)
    write_page(words, 0, 1);
    let s = r.stats();
    assert_eq!(s.cpu_latency_qos_holds, 1, "{s:?}");
    let quiet = |r: &ztier_uffd::Region| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while r.stats().cpu_latency_qos_held && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        !r.stats().cpu_latency_qos_held
    };
    assert!(quiet(&r), "still held 5 s after the last fault");
    // Another spell of faults takes it again.
    assert!(r.evict(0).unwrap());
    check_page(words, 0, 1).unwrap();
    for page in 1..4 {
        write_page(words, page, 2);
    }
    // Taken again (more than once only if this thread waited 10 ms between two faults).
    let s = r.stats();
    assert!(s.cpu_latency_qos_holds >= 2, "{s:?}");
    assert!(quiet(&r));

    let config = ztier_uffd::RegionConfig {
        cpu_latency_qos: false,
        ..Default::default()
    };
    let off = region_with(4 * PAGE, 4 * PAGE, &config).expect("made as the first was");
    write_page(off.words(), 0, 1);
    let s = off.stats();
    assert!(
        !s.cpu_latency_qos_usable && !s.cpu_latency_qos_held && s.cpu_latency_qos_holds == 0,
        "{s:?}"
    );
    assert!(off.cpu_latency_qos_unused().unwrap().contains("turned off"));
}

/// The kernel's own path for a region's pages: where swap and zswap are on, every page comes
/// back equal (the function checks) with every touch timed; elsewhere it refuses, naming
/// what is missing. Uneven lengths are refused either way. (CI has swap off: there the
/// refusal is what runs; a machine with both on runs the measurement.)
#[test]
fn the_kernels_pageout_path_is_measured_where_it_exists_and_refused_where_not() {
    let ps = ztier_base::os::page_size();
    let pages = 64;
    let mut data = vec![0u8; pages * ps];
    for (i, page) in data.chunks_mut(ps).enumerate().skip(1) {
        // Compressible and distinct (page 0 stays all zero: never drawn for a latency).
        for (j, b) in page.iter_mut().enumerate() {
            *b = ((i * 7 + j / 64) % 251) as u8;
        }
    }
    assert!(matches!(
        ztier_uffd::rig::pageout::kernel_pageout(&data[..ps + 1], 4),
        Err(ztier_uffd::rig::pageout::PageoutError::BadPages { .. })
    ));
    let zswap_on = std::fs::read_to_string("/sys/module/zswap/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    let swap_on = std::fs::read_to_string("/proc/swaps").is_ok_and(|s| s.lines().count() > 1);
    match ztier_uffd::rig::pageout::kernel_pageout(&data, 16) {
        Ok(k) => {
            assert!(
                swap_on && zswap_on,
                "measured with swap {swap_on}, zswap {zswap_on}"
            );
            assert_eq!((k.pages, k.page_size), (pages, ps));
            assert!(k.left_resident < pages, "nothing went out: {k:?}");
            assert!(!k.compressor.is_empty());
            // A page that will not go out is passed over, but most do.
            assert!(!k.latency.is_empty() && k.latency.len() <= 16, "{k:?}");
        }
        Err(ztier_uffd::rig::pageout::PageoutError::Missing(why)) => {
            use ztier_uffd::rig::pageout::NoKernelPath as Why;
            // With both on, only a full swap device (or pages kept in) refuses.
            let expected = match (zswap_on, swap_on) {
                (false, _) => matches!(why, Why::ZswapOff { .. } | Why::NoZswap { .. }),
                (true, false) => matches!(why, Why::NoSwap),
                (true, true) => matches!(
                    why,
                    Why::SwapTooSmall { .. } | Why::NothingMoved | Why::WentToSwapDevice { .. }
                ),
            };
            assert!(expected, "zswap {zswap_on}, swap {swap_on}: {why}");
        }
        Err(e) => panic!("{e}"),
    }
}

/// A region's fault thread uses idle priority only where the process may leave it again.
fn skip_without_idle_priority() {
    let why = "this process may not leave idle priority again (no CAP_SYS_NICE, RLIMIT_NICE \
               under 20), so the fault thread stays at normal priority";
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the idle-priority tests: {why}");
    }
    eprintln!("skipped: {why}");
}

/// The CPUs the calling thread may use, in order. The crate's own helper is private to it.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the size we pass into a live local.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE; the set is a live, filled local.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Holds the calling thread on `cpu` alone.
fn hold_on(cpu: usize) {
    assert!(cpu < libc::CPU_SETSIZE as usize);
    // SAFETY: as above, an empty set.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE; the set is a live local.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: reads the set we pass; changes only where the calling thread (0) runs.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) };
    assert_eq!(rc, 0, "sched_setaffinity to CPU {cpu}");
}

/// Holds the calling thread on the first CPU it may use (the same one for every caller
/// of a test).
fn hold_on_first_cpu() {
    let first = *allowed_cpus().first().expect("a CPU this thread may use");
    hold_on(first);
}

/// Evicts `pages` and reads them back, each checked.
fn evict_and_read(r: &ztier_uffd::Region, pages: std::ops::Range<u64>) {
    for page in pages.clone() {
        r.evict(page).unwrap();
    }
    for page in pages {
        check_page(r.words(), page, 1).unwrap();
    }
}

/// A 64-page region made as `config` says, every page written (version 1); `None` (the
/// test skips, saying why) where userfaultfd or idle priority is not usable.
fn written_region_for_idle_priority(config: &ztier_uffd::RegionConfig) -> Option<common::Guarded> {
    let r = region_with(64 * PAGE, 64 * PAGE, config)?;
    for page in 0..64 {
        write_page(r.words(), page, 1);
    }
    if !r.stats().idle_priority_usable {
        skip_without_idle_priority();
        return None;
    }
    Some(r)
}

/// Evicts and reads every page from the calling thread until the fault thread is seen at
/// idle priority (entered at the first fault's look; a busy thread of another test on its
/// CPU may end it meanwhile, and each time it is ended it is not tried again for a
/// back-off that doubles from 0.1 s), for at most 20 s; whether it was seen.
fn fault_until_idle_priority(r: &ztier_uffd::Region) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        evict_and_read(r, 0..64);
        if r.stats().idle_priority {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    false
}

#[test]
fn a_fault_thread_starved_at_idle_priority_is_given_back_its_priority() {
    // A fault a page (no fault-around), so that a pass is 64 faults.
    let config = ztier_uffd::RegionConfig {
        fault_around: 0,
        ..Default::default()
    };
    let Some(r) = written_region_for_idle_priority(&config) else {
        return;
    };
    // One thread faults on one CPU: the fault thread goes to idle priority there. Then a
    // thread of normal priority is busy on that CPU, and the same thread faults again: the
    // fault thread would get a few thousandths of the CPU. Every fault is still served,
    // and the guard has ended idle priority.
    let (busy, stop) = (
        std::sync::atomic::AtomicBool::new(false),
        std::sync::atomic::AtomicBool::new(false),
    );
    /// Sets its flag when dropped, however the thread holding it ends.
    struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }
    let entered = std::thread::scope(|s| {
        let toucher = s.spawn(|| {
            let _stop = SetOnDrop(&stop);
            hold_on_first_cpu();
            let entered = fault_until_idle_priority(&r);
            let before = r.stats().idle_priority_demotions;
            busy.store(true, Relaxed);
            // A fault waits for the fault thread's scraps of the CPU, not always longer than
            // the guard allows: fault until the guard has acted (or 200 passes).
            for _ in 0..200 {
                evict_and_read(&r, 0..64);
                if r.stats().idle_priority_demotions > before {
                    break;
                }
            }
            (entered, before)
        });
        s.spawn(|| {
            hold_on_first_cpu();
            while !busy.load(Relaxed) && !stop.load(Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            while !stop.load(Relaxed) {
                std::hint::spin_loop();
            }
        });
        toucher.join().unwrap()
    });
    let (entered, before) = entered;
    assert!(
        entered,
        "the fault thread never ran at idle priority: {:?}",
        r.stats()
    );
    let s = r.stats();
    assert!(s.idle_priority_demotions > before, "{s:?}");
}

#[test]
fn faults_from_two_threads_keep_the_fault_thread_at_normal_priority() {
    let Some(r) = written_region_for_idle_priority(&ztier_uffd::RegionConfig::default()) else {
        return;
    };
    // One thread faulting: idle priority.
    assert!(
        fault_until_idle_priority(&r),
        "never at idle priority: {:?}",
        r.stats()
    );
    // Two threads faulting strictly by turns (each fault's thread differs from the one
    // before), for longer than a look's interval (250 µs).
    let turn = std::sync::Mutex::new(0u64);
    let next = std::sync::Condvar::new();
    std::thread::scope(|s| {
        for me in 0..2u64 {
            let (turn, next, r) = (&turn, &next, &r);
            s.spawn(move || {
                for round in 0..100u64 {
                    let mut t = turn.lock().unwrap();
                    while *t % 2 != me {
                        t = next.wait(t).unwrap();
                    }
                    let page = (2 * round + me) % 64;
                    r.evict(page).unwrap();
                    check_page(r.words(), page, 1).unwrap();
                    *t += 1;
                    next.notify_all();
                }
            });
        }
    });
    let s = r.stats();
    // (Not that the guard never acted: another test's busy thread may have held this
    // region's fault thread's CPU meanwhile.)
    assert!(!s.idle_priority, "{s:?}");
}

#[test]
fn the_fault_thread_follows_a_faulting_thread_to_another_cpu() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: one CPU, nowhere to follow a thread to");
        return;
    }
    let config = ztier_uffd::RegionConfig {
        fault_around: 0,
        ..Default::default()
    };
    let Some(r) = written_region_for_idle_priority(&config) else {
        return;
    };
    // One thread faults on one CPU until the fault thread runs there at idle priority, then
    // moves to another and faults on: the fault thread goes after it, at its next look (due
    // at the first fault after a pass's evictions, which take longer than a look's
    // interval). This does not single out the quick look after serving (placement.rs,
    // "Following"), which catches a thread that moves while it faults on without a pause.
    let (entered, before, after) = std::thread::scope(|s| {
        s.spawn(|| {
            hold_on(cpus[0]);
            let entered = fault_until_idle_priority(&r);
            let before = r.stats().fault_thread_moves;
            hold_on(cpus[1]);
            for _ in 0..20 {
                evict_and_read(&r, 0..64);
                if r.stats().fault_thread_moves > before {
                    break;
                }
            }
            (entered, before, r.stats().fault_thread_moves)
        })
        .join()
        .unwrap()
    });
    assert!(entered, "never at idle priority: {:?}", r.stats());
    assert!(after > before, "{:?}", r.stats());
}
