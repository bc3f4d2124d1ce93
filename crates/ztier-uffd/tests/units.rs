//! Regions of larger compression units (16 and 64 KiB): every page reads back exact while
//! threads write and read under a small budget (the evictors storing parts of units that
//! other threads' pages share), and a sequential touch of evicted units decompresses each
//! unit once, not each page.

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{check_page, own_pages_at_random, region_with, rss_of, write_page, PAGE, WORDS};
use ztier_uffd::{Error, Region, RegionConfig};

const UNITS: [usize; 2] = [16 << 10, 64 << 10];

fn config(unit_size: usize) -> RegionConfig {
    RegionConfig {
        unit_size,
        ..RegionConfig::default()
    }
}

/// Eight threads each own every eighth page (so every unit holds pages of several threads)
/// and write new versions of them or check them, at random, while the reclaim thread keeps
/// the region at a tenth of its size: every page reads back as last written.
#[test]
fn unit_regions_read_back_exact_under_eight_threads_and_a_tenth_budget() {
    const PAGES: u64 = 4096;
    const THREADS: u64 = 8;
    for unit in UNITS {
        let budget = PAGES as usize * PAGE / 10;
        let Some(r) = region_with(PAGES as usize * PAGE, budget, &config(unit)) else {
            return;
        };
        let words = r.words();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    own_pages_at_random(words, (t, THREADS), PAGES, 12_000, 0x9E37_79B9, 6)
                });
            }
        });
        let s = r.stats();
        assert!(s.evictions > 1000, "{unit}: the reclaim thread ran: {s:?}");
        assert!(
            s.evictions_clean > 100 && s.evictions_dirty > 100,
            "{unit}: clean and dirty evictions: {s:?}"
        );
        assert!(s.faults > 1000, "{unit}: pages came back: {s:?}");
        assert_eq!(
            s.evict_failures + s.poisoned_pages + s.held_pages + s.lost_pages,
            0,
            "{unit}: {s:?}"
        );
    }
}

/// Four threads write whole pages of their own blocks over and over, in order, while the
/// budget is cut to an eighth: runs of whole units are moved out and stored as units while
/// the writes land on them; every page reads back the last version written.
#[test]
fn units_written_while_they_are_evicted_read_back_exact() {
    const PAGES: u64 = 2048;
    const THREADS: u64 = 4;
    for unit in UNITS {
        let len = PAGES as usize * PAGE;
        let Some(r) = region_with(len, len, &config(unit)) else {
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
            r.set_budget(len / 8).unwrap();
            let t = std::time::Instant::now();
            while r.stats().evictions_dirty < 3 * PAGES
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
            s.evictions_dirty >= 3 * PAGES,
            "{unit}: pages were evicted as they were written: {s:?}"
        );
        assert_eq!(
            s.evict_failures + s.poisoned_pages + s.held_pages + s.lost_pages,
            0,
            "{unit}: {s:?}"
        );
    }
}

/// A region of `pages` pages at `unit`, every page written and then evicted one by one
/// (all stored), its budget holding all of them again.
fn evicted_region(pages: u64, unit: usize) -> Option<common::Guarded> {
    let len = pages as usize * PAGE;
    let r = region_with(len, len, &config(unit))?;
    for page in 0..pages {
        write_page(r.words(), page, 1);
    }
    for page in 0..pages {
        assert!(r.evict(page).unwrap(), "page {page} went out");
    }
    let s = r.stats();
    assert_eq!((s.stored_pages, s.resident_pages), (pages, 0), "{s:?}");
    Some(r)
}

/// Touching evicted pages in order brings each unit in with one read of the device (one
/// decompression for all its pages), where page-sized units take one a page.
#[test]
fn a_sequential_touch_of_n_units_costs_n_unit_reads() {
    const PAGES: u64 = 1024;
    for unit in [PAGE, 16 << 10, 64 << 10] {
        let Some(r) = evicted_region(PAGES, unit) else {
            return;
        };
        for page in 0..PAGES {
            check_page(r.words(), page, 1).unwrap();
        }
        let s = r.stats();
        let brought = s.faults + s.fault_around_pages;
        assert_eq!(
            brought, PAGES,
            "{unit}: every page came from the store: {s:?}"
        );
        let units = PAGES * PAGE as u64 / unit as u64;
        if unit == PAGE {
            assert_eq!(s.store_reads, PAGES, "a read a page: {s:?}");
        } else {
            assert!(
                (units..=units + 2).contains(&s.store_reads),
                "{unit}: {} reads for {units} units: {s:?}",
                s.store_reads
            );
        }
    }
}

/// A page an evictor found all zeros, inside a unit a fault reads, comes in with the unit's
/// stored pages in their copy, as a page of zeros of its own: the run is not split around
/// it (the zero page mapped apart would cost a copy and a wake-up more, and the program,
/// run on ahead, a trap more). Its bytes in the unit read are stale (the unit was stored
/// while the page held other data): it reads zeros all the same.
#[test]
fn a_zeroed_page_inside_a_unit_read_comes_in_with_the_units_copy() {
    const PAGES: u64 = 32;
    let len = PAGES as usize * PAGE;
    let Some(r) = evicted_region(PAGES, 64 << 10) else {
        return;
    };
    let words = r.words();
    // Read back (clean: the units' copies stay), then page 5 zeroed and evicted alone: found
    // all zeros, while its unit's copy in the store still holds its version 1.
    for page in 0..PAGES {
        check_page(words, page, 1).unwrap();
    }
    for w in &words[5 * WORDS..6 * WORDS] {
        w.store(0, Relaxed);
    }
    for page in 0..PAGES {
        assert!(r.evict(page).unwrap());
    }
    let before = r.stats();
    assert_eq!(
        (before.stored_pages, before.resident_pages),
        (PAGES - 1, 0),
        "{before:?}"
    );
    // A fault on page 0 brings its unit in (pages 0-15).
    check_page(words, 0, 1).unwrap();
    let s = r.stats();
    assert_eq!(
        (
            s.faults - before.faults,
            s.fault_around_pages - before.fault_around_pages,
            s.zero_faults - before.zero_faults,
            s.store_reads - before.store_reads,
        ),
        (1, 15, 0, 1),
        "{s:?}"
    );
    let base = r.as_ptr() as usize;
    assert_eq!(
        rss_of(base..base + len),
        16 * PAGE,
        "page 5 came in a page of its own, with the unit's copy, not as the zero page"
    );
    assert!(
        words[5 * WORDS..6 * WORDS]
            .iter()
            .all(|w| w.load(Relaxed) == 0),
        "page 5 reads zeros, not its unit's stale bytes"
    );
    for page in (0..PAGES).filter(|&p| p != 5) {
        check_page(words, page, 1).unwrap();
    }
    // Its first write is a write-protect fault (it came in protected with the unit's
    // copy), which lifts the protection; the write lands, and goes out and back with it.
    let writes = r.stats().first_write_faults;
    words[5 * WORDS].store(7, Relaxed);
    assert_eq!(r.stats().first_write_faults, writes + 1);
    assert!(r.evict(5).unwrap());
    let page5: Vec<u64> = words[5 * WORDS..6 * WORDS]
        .iter()
        .map(|w| w.load(Relaxed))
        .collect();
    assert!(
        page5[0] == 7 && page5[1..].iter().all(|&w| w == 0),
        "{page5:?}"
    );
}

/// A fault inside a unit brings the rest of the unit in with it even with fault-around
/// off: its pages are decompressed once, so they cost nothing more.
#[test]
fn a_fault_brings_the_rest_of_its_unit_with_fault_around_off() {
    const PAGES: u64 = 64;
    let unit_pages = 16;
    let config = RegionConfig {
        fault_around: 0,
        ..config(64 << 10)
    };
    let len = PAGES as usize * PAGE;
    let Some(r) = region_with(len, len, &config) else {
        return;
    };
    for page in 0..PAGES {
        write_page(r.words(), page, 1);
    }
    for page in 0..PAGES {
        assert!(r.evict(page).unwrap());
    }
    // Page 20 is the fifth of the second unit: it and the eleven after it come in.
    check_page(r.words(), 20, 1).unwrap();
    let s = r.stats();
    assert_eq!(
        (s.faults, s.fault_around_pages, s.store_reads),
        (1, unit_pages - 5, 1),
        "{s:?}"
    );
    assert_eq!(s.resident_pages, unit_pages - 4, "{s:?}");
    for page in 0..PAGES {
        check_page(r.words(), page, 1).unwrap();
    }
    // Written after it came in clean: evicted again, the unit is stored anew.
    write_page(r.words(), 21, 2);
    assert!(r.evict(21).unwrap());
    check_page(r.words(), 21, 2).unwrap();
    check_page(r.words(), 20, 1).unwrap();
}

/// A unit size the device cannot have is refused, saying so.
#[test]
fn a_unit_that_is_not_a_power_of_two_up_to_64_kib_is_refused() {
    for unit_size in [0, 2048, 12 << 10, 128 << 10] {
        match Region::with_config(16 * PAGE, 16 * PAGE, &config(unit_size)) {
            Err(Error::BadUnitSize { unit_size: u, .. }) => assert_eq!(u, unit_size),
            Err(e) => panic!("{unit_size}: {e}"),
            Ok(_) => panic!("{unit_size}: accepted"),
        }
    }
}

/// The region bench's sequential pass at 64 KiB units with clean pages off: every page
/// written, the budget cut to a quarter, then every page read in order (one word each, the
/// reclaim thread evicting behind, each fault bringing units in written and discarding
/// them), then every page checked whole; several rounds on fresh regions.
#[test]
fn a_sequential_pass_under_a_quarter_budget_reads_back_exact() {
    const PAGES: u64 = 16384;
    for round in 0..20 {
        let len = PAGES as usize * PAGE;
        let config = RegionConfig {
            clean_pages: false,
            ..config(64 << 10)
        };
        let Some(r) = region_with(len, len, &config) else {
            return;
        };
        let words = r.words();
        // Some pages all zeros, and some whole units, as real memory has them.
        let zeros = |page: u64| page % 7 == 3 || (page / 16) % 11 == 5;
        for page in (0..PAGES).filter(|&p| !zeros(p)) {
            write_page(words, page, 1);
        }
        r.set_budget(len / 4).unwrap();
        while r.stats().resident_pages > PAGES / 4 + 64 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut sum = 0u64;
        for page in 0..PAGES {
            sum = sum.wrapping_add(words[page as usize * (PAGE / 8)].load(Relaxed));
        }
        std::hint::black_box(sum);
        for page in 0..PAGES {
            let version = if zeros(page) { 0 } else { 1 };
            if let Err(e) = check_page(words, page, version) {
                panic!("round {round}: {e}; {:?}", r.stats());
            }
        }
    }
}
