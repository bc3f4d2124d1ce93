//! The program's own changes to the region's memory never bring back a stale copy: its
//! `MADV_DONTNEED`, `munmap` and `mremap`, its `fork` (the child has no region), a page it
//! makes read-only in the middle of a run (of pages stored or found all zeros), and the
//! last of many faulting threads dropping the region.
// The program's own madvise, munmap, mremap, mprotect and fork are raw calls on the
// region's memory, each with its reason.
#![allow(unsafe_code)]

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::{check_page, region, write_page, written_region, PAGE, WORDS};

#[test]
fn the_programs_madv_dontneed_never_brings_back_a_stored_copy() {
    let Some(r) = written_region(64) else {
        return;
    };
    let words = r.words();
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
    let Some(r) = written_region(64) else {
        return;
    };
    let words = r.words();
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
    let Some(r) = written_region(64) else {
        return;
    };
    let words = r.words();
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

/// A run across two mappings (the program made a page in the middle read-only, which
/// splits the region's mapping) is not moved whole: the pages on either side go out page
/// by page, the read-only one stays (the move refuses it), and all read back.
#[test]
fn a_run_across_a_protection_change_goes_out_page_by_page() {
    const PAGES: u64 = 64;
    let Some(r) = written_region(PAGES) else {
        return;
    };
    let words = r.words();
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

/// A read of a page found all zeros brings in the zeroed pages after it with one mapping;
/// where that run reaches a page the program made read-only (another mapping, to the
/// kernel, which then maps none of the run), the faulting page still comes in alone, and
/// every page reads back.
#[test]
fn zeroed_pages_read_up_to_a_protection_change_come_in() {
    let Some(r) = written_region(32) else {
        return;
    };
    let _dog = common::Watchdog::new(common::WATCHDOG);
    let words = r.words();
    let zeros = |page: u64| (8..16).contains(&page);
    for page in (0..32).filter(|&p| zeros(p)) {
        write_page(words, page, 0);
    }
    for page in 0..32 {
        assert!(r.evict(page).unwrap());
    }
    // SAFETY: page 12 of the region, out as zeros, made read-only; the test only reads it
    // until it is made writable again below.
    let rc = unsafe { libc::mprotect(r.as_ptr().add(12 * PAGE).cast(), PAGE, libc::PROT_READ) };
    assert_eq!(rc, 0);
    let b = r.stats();
    // In order: the window has grown to four pages by page 11, whose run of zeroed pages
    // then reaches page 12.
    for page in 0..32 {
        check_page(words, page, u64::from(!zeros(page))).unwrap();
    }
    let s = r.stats();
    assert_eq!(s.resident_pages, 32, "{s:?}");
    // Pages 11 and 12 each alone (their runs reach the other mapping), then 13-15.
    assert_eq!(s.zero_faults - b.zero_faults, 3, "{s:?}");
    // SAFETY: the same page made writable again, as the rest of the region.
    let rc = unsafe {
        libc::mprotect(
            r.as_ptr().add(12 * PAGE).cast(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, 0);
}

#[test]
fn a_page_touched_while_the_program_drops_it_comes_in_as_zeros() {
    // The kernel zaps a dropped range only after the fault thread has read the drop's event:
    // a fault on a stored page of it served in between maps zeros that the zap removes. The
    // region must take the page's next fault as a fault (zeros again), not as a spurious one
    // to wake: woken, it faults again, for ever (the watchdog's abort).
    const PAGES: u64 = 64;
    let Some(r) = written_region(PAGES) else {
        return;
    };
    let words = r.words();
    let p = r.as_ptr() as usize;
    // Until the gap has been met a few times (15-21 drops of 3200 meet it here), at most
    // `ROUNDS` and 30 s (half the watchdog's time, for a busy machine whose hand-offs each
    // cost a tick): a test that never met it would pass without the region's answer to it.
    const ROUNDS: u64 = 1000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for round in 0..ROUNDS {
        let met = r.stats().vanished_pages;
        if round >= 50 && met >= 3 || std::time::Instant::now() >= deadline {
            break;
        }
        for page in 0..PAGES {
            write_page(words, page, round + 1);
            assert!(r.evict(page).unwrap());
        }
        // Another thread of the program touches the page being dropped, while it goes: the
        // drop waits until that thread is about to touch the page, still stored, so that its
        // fault is being served (or is about to be) when the drop's event comes. It reads in
        // even rounds and writes a zero word in odd ones (a write fault: the page stays all
        // zeros whichever comes first, the write or the drop).
        let (dropping, touching) = (AtomicU64::new(0), AtomicU64::new(PAGES));
        std::thread::scope(|s| {
            s.spawn(|| loop {
                let page = dropping.load(Relaxed);
                if page == PAGES {
                    break;
                }
                touching.store(page, Relaxed);
                let word = &words[page as usize * WORDS];
                if round % 2 == 1 {
                    word.store(0, Relaxed);
                } else {
                    std::hint::black_box(word.load(Relaxed));
                }
            });
            for page in 0..PAGES {
                dropping.store(page, Relaxed);
                while touching.load(Relaxed) != page {
                    std::hint::spin_loop();
                }
                // SAFETY: one page inside the region; dropping it is what the test means.
                let rc = unsafe {
                    libc::madvise(
                        (p + page as usize * PAGE) as *mut _,
                        PAGE,
                        libc::MADV_DONTNEED,
                    )
                };
                assert_eq!(rc, 0);
            }
            dropping.store(PAGES, Relaxed);
        });
        // Every page dropped: zeros, each reached (no fault taken as spurious for ever).
        for page in 0..PAGES {
            check_page(words, page, 0).unwrap();
        }
    }
    let s = r.stats();
    assert!(s.vanished_pages >= 1, "the gap was never met: {s:?}");
    assert_eq!(s.lost_pages, 0, "{s:?}");
}
