//! A region against a model of its bytes and of where each page is: any sequence of
//! writes, reads, evictions and drops reads back what the model says, and the store holds
//! exactly the evicted pages that are not zeros and the clean ones (read in from the store
//! and not written since); an eviction is clean (nothing written to the store) exactly
//! when the model says the page is clean. The budget holds every page, so only the
//! sequence evicts (the reclaim thread under a budget is `budget.rs`'s eight-thread test),
//! and fault-around is off (`region.rs` reads every page back with it on). The same runs at
//! 16 and 64 KiB units, where a fault from the store brings in the stored pages after its
//! own up to its unit's end, and the pages found all zeros among them, a read of a page
//! found all zeros the ones after it (the model does too), and the store holds whole
//! units. The region's refaults (pages brought back that
//! had been evicted) are the model's. Once more at each unit size with the store freeing
//! copies once full (`free_copies_when_full`), which under a budget of every page it
//! always is: at page-sized units no page comes in clean, and each a read brings from the
//! store frees its copy; at larger units, where copies are not freed, as without it.

mod common;

use common::{check_page, region_with, write_page, PAGE};
use proptest::prelude::*;

const PAGES: u64 = 16;

#[derive(Debug, Clone)]
enum Op {
    /// Writes version `v` of a page (0: all zeros).
    Write(u64, u64),
    Read(u64),
    Evict(u64),
    /// The program's MADV_DONTNEED of `n` pages from a page.
    Discard(u64, u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PAGES, 1..1000u64).prop_map(|(p, v)| Op::Write(p, v)),
        // All zeros: evicted, the page is found all zeros and stored as nothing (zeroed).
        1 => (0..PAGES).prop_map(|p| Op::Write(p, 0)),
        4 => (0..PAGES).prop_map(Op::Read),
        3 => (0..PAGES).prop_map(Op::Evict),
        1 => (0..PAGES, 1..4u64).prop_map(|(p, n)| Op::Discard(p, n.min(PAGES - p))),
    ]
}

proptest! {
    // Bounded for CI: 64 cases of up to 120 operations on 16 pages take well under a second
    // on an idle machine and found both of the region's figure lags (see the regressions
    // file); a failure's shrinking stops after 1024 steps or 30 s (unbounded by default,
    // which under load ran for minutes), and each case's region is under the watchdog.
    #![proptest_config(ProptestConfig {
        cases: 64,
        max_shrink_iters: 1024,
        max_shrink_time: 30_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_region_reads_back_as_its_model(ops in proptest::collection::vec(op(), 1..120)) {
        run_model(&ops, PAGE)?;
    }

    #[test]
    fn a_region_of_larger_units_reads_back_as_its_model(
        ops in proptest::collection::vec(op(), 1..120),
        unit in prop::sample::select(vec![16usize << 10, 64 << 10]),
    ) {
        run_model(&ops, unit)?;
    }

    /// With `free_copies_when_full` and a budget of every page, the store has no room: it
    /// is always full, and every read brings its pages in dirty, their copies freed (at
    /// page-sized units).
    #[test]
    fn a_region_whose_store_frees_copies_reads_back_as_its_model(
        ops in proptest::collection::vec(op(), 1..120),
        unit in prop::sample::select(vec![PAGE, 16 << 10, 64 << 10]),
    ) {
        run_model_with(&ops, unit, true)?;
    }
}

/// A page found all zeros between two stored ones of a unit comes in with the fault on the
/// first (as the zero page), and the second with it: the unit is read once.
#[test]
fn zeroed_pages_between_stored_ones_come_in_with_them() {
    use Op::*;
    let ops = [
        Write(4, 1),
        Write(5, 0),
        Write(6, 2),
        Evict(4),
        Evict(5),
        Evict(6),
        Read(4),
        Write(6, 3),
    ];
    for unit in [16 << 10, 64 << 10] {
        run_model(&ops, unit).unwrap();
    }
}

/// Only zeroed pages join a fault-around run: a page never written (6) ends it, and the
/// stored page after it (7) stays out.
#[test]
fn a_page_never_written_ends_the_run() {
    use Op::*;
    let ops = [
        Write(5, 1),
        Evict(5),
        Write(7, 1),
        Evict(7),
        Write(5, 1),
        Read(5),
    ];
    for unit in [16 << 10, 64 << 10] {
        run_model(&ops, unit).unwrap();
    }
}

/// Nor does a page the program dropped (its zero page could be zapped with it).
#[test]
fn a_dropped_page_ends_the_run() {
    use Op::*;
    let ops = [
        Write(4, 1),
        Write(5, 0),
        Write(6, 2),
        Evict(4),
        Evict(5),
        Evict(6),
        Discard(5, 1),
        Read(4),
        Read(6),
    ];
    for unit in [16 << 10, 64 << 10] {
        run_model(&ops, unit).unwrap();
    }
}

/// The cases proptest once found (model.proptest-regressions: two of the region's figure
/// lags among them), kept as they were shrunk: a seed replays them only while the strategy
/// is unchanged, and it gained zero writes since.
#[test]
fn the_cases_found_before_still_pass() {
    use Op::*;
    let found: [&[Op]; 3] = [
        &[
            Read(7),
            Discard(6, 2),
            Evict(5),
            Evict(2),
            Write(6, 658),
            Read(11),
            Discard(6, 2),
            Evict(6),
            Read(6),
            Read(13),
            Read(5),
            Evict(11),
            Read(8),
            Evict(10),
            Evict(5),
            Write(5, 925),
            Evict(14),
            Evict(10),
            Evict(4),
            Write(14, 861),
            Read(13),
            Write(7, 983),
            Write(5, 757),
            Read(4),
            Evict(10),
            Write(5, 733),
            Read(15),
            Read(14),
            Read(15),
            Read(11),
            Read(12),
            Evict(15),
            Read(0),
            Write(14, 70),
            Write(4, 307),
            Discard(7, 3),
            Discard(12, 3),
            Evict(9),
            Read(4),
            Read(8),
            Discard(6, 2),
            Write(13, 549),
            Evict(0),
            Read(12),
            Evict(1),
            Read(2),
            Read(2),
            Write(4, 591),
            Evict(3),
            Write(3, 214),
            Evict(15),
            Evict(3),
            Read(6),
            Discard(10, 2),
            Read(7),
            Evict(5),
            Read(11),
            Write(13, 612),
            Evict(15),
            Discard(12, 3),
            Evict(12),
            Evict(11),
            Discard(11, 2),
            Read(0),
            Write(12, 70),
            Read(6),
            Evict(9),
            Read(14),
            Discard(7, 2),
            Evict(3),
            Write(5, 969),
            Write(6, 448),
            Evict(15),
            Read(13),
            Write(8, 582),
            Evict(14),
            Read(0),
            Discard(11, 1),
            Evict(4),
            Write(0, 396),
            Evict(0),
            Write(11, 889),
            Read(5),
            Read(3),
            Read(2),
            Read(14),
            Write(15, 48),
            Write(15, 624),
            Write(12, 903),
            Evict(5),
            Evict(8),
            Read(6),
            Evict(5),
            Discard(5, 2),
            Read(15),
            Write(2, 180),
            Read(13),
        ],
        &[
            Read(13),
            Write(12, 812),
            Evict(10),
            Read(15),
            Read(1),
            Read(2),
            Write(4, 56),
            Evict(10),
            Read(9),
            Evict(5),
            Write(14, 910),
            Evict(1),
            Read(4),
            Read(9),
            Discard(14, 1),
            Write(5, 919),
            Write(0, 228),
            Write(10, 732),
            Read(8),
            Evict(6),
            Evict(13),
            Write(6, 318),
            Evict(11),
            Evict(0),
            Discard(12, 2),
            Write(0, 656),
            Read(2),
            Evict(0),
            Write(6, 870),
            Write(3, 612),
            Write(7, 842),
            Read(3),
            Read(6),
            Discard(13, 3),
            Read(11),
            Discard(9, 3),
            Write(11, 811),
            Evict(15),
            Read(1),
            Evict(1),
            Discard(14, 1),
            Write(12, 780),
            Read(15),
            Read(14),
            Evict(7),
            Write(1, 317),
            Discard(12, 2),
            Write(13, 776),
            Evict(13),
            Evict(8),
            Read(5),
            Write(4, 151),
            Write(5, 322),
            Evict(2),
            Evict(12),
            Read(2),
            Evict(15),
            Evict(8),
            Evict(1),
            Write(14, 217),
            Evict(14),
            Evict(14),
            Write(14, 75),
            Evict(11),
            Write(6, 909),
            Read(11),
            Read(14),
            Read(3),
            Write(14, 177),
            Read(14),
            Write(1, 490),
            Evict(9),
            Read(15),
            Write(0, 772),
            Read(3),
            Read(1),
            Read(9),
            Write(7, 254),
            Write(2, 625),
            Read(8),
            Evict(12),
            Evict(12),
            Write(5, 595),
            Read(15),
            Write(13, 833),
            Write(7, 324),
            Evict(6),
            Read(3),
            Read(0),
            Evict(8),
            Read(5),
            Read(5),
            Write(6, 893),
            Evict(8),
            Write(6, 574),
            Read(1),
            Discard(4, 2),
            Read(3),
            Read(11),
            Discard(7, 1),
            Evict(4),
            Discard(15, 1),
            Evict(1),
            Read(12),
            Read(11),
            Read(8),
            Write(2, 536),
            Read(6),
            Evict(13),
            Write(12, 494),
            Write(2, 665),
            Read(11),
            Discard(4, 2),
            Read(7),
            Read(3),
            Evict(6),
            Evict(6),
            Write(5, 284),
        ],
        &[
            Write(5, 658),
            Evict(0),
            Discard(6, 2),
            Write(0, 309),
            Read(10),
            Write(8, 682),
            Write(2, 486),
            Read(9),
            Write(0, 230),
            Evict(8),
            Write(4, 847),
            Write(13, 776),
            Discard(3, 1),
            Read(7),
            Read(3),
            Write(7, 553),
            Read(8),
            Read(4),
            Read(0),
            Read(4),
            Read(12),
            Read(5),
            Evict(15),
            Read(1),
            Read(13),
            Read(7),
            Write(13, 324),
            Write(5, 126),
            Evict(15),
            Read(1),
            Write(8, 717),
            Evict(14),
            Discard(0, 3),
            Write(11, 905),
            Write(1, 659),
            Evict(15),
            Write(4, 850),
            Write(15, 641),
            Discard(6, 3),
            Read(2),
            Evict(9),
            Write(3, 785),
            Read(5),
            Evict(10),
            Write(10, 773),
            Read(13),
            Evict(10),
            Discard(10, 2),
            Read(10),
            Evict(9),
            Evict(11),
            Evict(13),
            Evict(3),
            Write(3, 895),
            Evict(1),
            Write(14, 387),
            Read(5),
            Evict(15),
            Evict(11),
            Read(2),
            Read(4),
            Discard(7, 1),
            Discard(12, 2),
            Write(9, 372),
            Write(11, 514),
            Write(15, 295),
            Evict(13),
            Evict(6),
            Write(4, 728),
            Read(11),
            Write(9, 762),
            Write(0, 875),
            Evict(0),
            Write(12, 583),
            Write(1, 156),
            Read(9),
            Write(15, 22),
            Read(14),
            Write(4, 956),
            Read(6),
            Evict(14),
            Write(1, 952),
            Write(12, 680),
            Evict(9),
            Read(15),
            Write(5, 477),
            Write(3, 402),
            Write(5, 430),
            Write(7, 447),
            Evict(3),
            Read(2),
        ],
    ];
    for ops in found {
        for unit in [PAGE, 16 << 10, 64 << 10] {
            run_model(ops, unit).unwrap();
        }
    }
}

/// Runs `ops` on a region of `unit`-byte compression units against the model.
fn run_model(ops: &[Op], unit: usize) -> Result<(), TestCaseError> {
    run_model_with(ops, unit, false)
}

/// [`run_model`], the region's store freeing copies once full if `frees_copies`.
fn run_model_with(ops: &[Op], unit: usize, frees_copies: bool) -> Result<(), TestCaseError> {
    // Without fault-around, so the model knows which pages a read brings in.
    let unit_pages = (unit / PAGE) as u64;
    let config = ztier_uffd::RegionConfig {
        fault_around: 0,
        unit_size: unit,
        free_copies_when_full: frees_copies,
        ..Default::default()
    };
    let Some(r) = region_with(PAGES as usize * PAGE, PAGES as usize * PAGE, &config) else {
        return Ok(());
    };
    let words = r.words();
    let mut model = [0u64; PAGES as usize];
    let mut at = Places::new(frees_copies && unit == PAGE);
    // Pages brought back that had been evicted: from the store, or zeroed.
    let mut refaults = 0u64;
    let (mut evictions_clean, mut evictions_dirty) = (0u64, 0u64);
    for op in ops {
        match *op {
            Op::Write(p, v) => {
                refaults += at.fault_in(p, true, unit_pages, &model);
                write_page(words, p, v);
                model[p as usize] = v;
                at.out[p as usize] = false;
                at.clean[p as usize] = false;
            }
            Op::Read(p) => {
                prop_assert_eq!(check_page(words, p, model[p as usize]), Ok(()));
                refaults += at.fault_in(p, false, unit_pages, &model);
            }
            Op::Evict(p) => {
                prop_assert_eq!(r.evict(p).unwrap(), !at.out[p as usize]);
                if !at.out[p as usize] {
                    if at.clean[p as usize] {
                        evictions_clean += 1;
                    } else if model[p as usize] != 0 {
                        evictions_dirty += 1;
                    }
                }
                if !at.out[p as usize] && model[p as usize] == 0 {
                    at.zeroed[p as usize] = true;
                }
                at.out[p as usize] = true;
                at.clean[p as usize] = false;
            }
            Op::Discard(p, n) => {
                r.discard(p as usize * PAGE, n as usize * PAGE).unwrap();
                for i in p..p + n {
                    model[i as usize] = 0;
                    at.out[i as usize] = true;
                    at.clean[i as usize] = false;
                    at.zeroed[i as usize] = false;
                }
            }
        }
        // The store holds exactly the pages out that are not zeros and the clean ones,
        // and nothing else is resident.
        let s = r.stats();
        let stored = (0..PAGES as usize)
            .filter(|&i| at.out[i] && model[i] != 0)
            .count() as u64;
        let resident = at.out.iter().filter(|&&o| !o).count() as u64;
        let cleans = at.clean.iter().filter(|&&c| c).count() as u64;
        prop_assert_eq!(
            (s.stored_pages, s.resident_pages, s.clean_pages, s.refaults),
            (stored, resident, cleans, refaults),
            "{:?}",
            s
        );
        if unit == PAGE {
            prop_assert_eq!(s.mm_stat.orig_data_size, (stored + cleans) * PAGE as u64);
        }
        prop_assert_eq!(
            (s.evictions_clean, s.evictions_dirty, s.copies_freed),
            (evictions_clean, evictions_dirty, at.copies_freed),
            "{:?}",
            s
        );
    }
    for p in 0..PAGES {
        prop_assert_eq!(check_page(words, p, model[p as usize]), Ok(()));
        refaults += at.fault_in(p, false, unit_pages, &model);
    }
    let s = r.stats();
    let cleans = at.clean.iter().filter(|&&c| c).count() as u64;
    prop_assert_eq!(
        (s.stored_pages, s.resident_pages, s.clean_pages, s.refaults),
        (0, PAGES, cleans, refaults),
        "{:?}",
        s
    );
    if unit == PAGE {
        prop_assert_eq!(s.mm_stat.orig_data_size, cleans * PAGE as u64);
    }
    Ok(())
}

/// Where each page of the model is.
struct Places {
    out: [bool; PAGES as usize],
    /// Resident, came in from the store by a read, not written since.
    clean: [bool; PAGES as usize],
    /// Out because an evictor found it all zeros (not never written, not dropped).
    zeroed: [bool; PAGES as usize],
    /// The store frees copies (always full: the budget holds every page; page-sized units),
    /// so no page comes in clean; the copies it freed so, those of the pages reads brought
    /// in from it.
    frees_copies: bool,
    copies_freed: u64,
}

impl Places {
    fn new(frees_copies: bool) -> Places {
        Places {
            out: [true; PAGES as usize],
            clean: [false; PAGES as usize],
            zeroed: [false; PAGES as usize],
            frees_copies,
            copies_freed: 0,
        }
    }

    /// What a touch of page `p` (a write's, or a read's) brings in, in the model, and how many
    /// of the pages it brings had been evicted (refaults): nothing if it is resident; else the
    /// page (from the store if it holds it: clean if read; zeros are not clean) and, on a region
    /// of larger units, the pages after it up to its unit's end that are stored or zeroed (up
    /// to the first that is neither): the stored ones come in as it does, the zeroed ones not
    /// clean. A read of a zeroed page brings in the zeroed pages after it up to its unit's end
    /// the same way (up to the first that is not zeroed).
    fn fault_in(&mut self, p: u64, write: bool, unit_pages: u64, model: &[u64]) -> u64 {
        let Places {
            out,
            clean,
            zeroed,
            frees_copies,
            copies_freed,
        } = self;
        let stored = |q: u64, out: &[bool]| out[q as usize] && model[q as usize] != 0;
        let keeps_copy = !write && !*frees_copies;
        let frees_copy = !write && *frees_copies;
        if !out[p as usize] {
            return 0;
        }
        let from_store = stored(p, out);
        let refault = u64::from(from_store || zeroed[p as usize]);
        out[p as usize] = false;
        zeroed[p as usize] = false;
        clean[p as usize] = from_store && keeps_copy;
        let zero_read = !from_store && refault == 1 && !write;
        if !from_store && !zero_read {
            return refault;
        }
        *copies_freed += u64::from(from_store && frees_copy);
        let unit_end = (p / unit_pages + 1) * unit_pages;
        let run_end = (p + 1..unit_end)
            .find(|&q| !(zeroed[q as usize] || from_store && stored(q, out)))
            .unwrap_or(unit_end);
        for q in p + 1..run_end {
            *copies_freed += u64::from(stored(q, out) && frees_copy);
            clean[q as usize] = stored(q, out) && keeps_copy;
            out[q as usize] = false;
            zeroed[q as usize] = false;
        }
        refault + (run_end - p - 1)
    }
}
