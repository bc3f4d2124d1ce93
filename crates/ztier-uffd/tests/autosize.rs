//! A budget that sizes itself (autosize.rs) on a running program: it comes down to what the
//! program touches, never past its cap, with every page reading back; and under its cap it
//! is a target the reclaim thread evicts to, not a limit faults wait on (they wait only past
//! the cap), where the same budget set by hand sets the hold at itself and its margin. (The controller's goals
//! against the best fixed budget are held on a model program in autosize.rs's own tests,
//! and measured by `ztier bench uffd --lookups`.)

mod common;

use std::time::{Duration, Instant};

use common::{check_page, written_region, PAGE};
use ztier_uffd::{AutosizeConfig, AutosizeState};

const PAGES: u64 = 2048;

/// A controller that looks every `interval` and steers to a 5 % stall under a cap of
/// `cap` pages, counting the fault thread's time only (no fault overhead measured: a
/// measurement made beside another test's faults would count each fault several times).
fn controller(cap: u64, interval: Duration) -> AutosizeConfig {
    let mut c = AutosizeConfig::with_cap(cap as usize * PAGE);
    c.target_stall = 0.05;
    c.shrink_step = 0.05;
    c.interval = interval;
    c.fault_overhead = Some(Duration::ZERO);
    c
}

/// A program that reads a quarter of its pages over and over, under a cap of three quarters:
/// the budget comes down from the cap to under half the pages (the rest is never touched,
/// so evicting it costs no stall), never past the cap, and every page, evicted or not,
/// reads back.
#[test]
fn a_self_sized_budget_comes_down_towards_what_the_program_touches() {
    let Some(r) = written_region(PAGES) else {
        return;
    };
    let cap = PAGES * 3 / 4;
    r.set_autosize(Some(controller(cap, Duration::from_millis(50))))
        .unwrap();
    // At the cap, or a controller's step or two under it if the test thread was slow.
    let set = r.stats().budget_pages;
    assert!(
        set <= cap && set >= cap * 9 / 10,
        "brought to the cap: {set}"
    );
    let words = r.words();
    let hot = 0..PAGES / 4;
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        for page in hot.clone() {
            check_page(words, page, 1).unwrap();
        }
        let s = r.stats();
        assert!(s.budget_pages <= cap, "{:?}", s.autosize);
        if s.budget_pages < PAGES / 2 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the budget never came under half the pages: {:?}",
            s.autosize
        );
    };
    let a = s.autosize.expect("the controller's figures");
    assert!(a.shrinks > 0, "{a:?}");
    assert!(
        a.history.iter().all(|step| step.budget_pages <= cap),
        "{a:?}"
    );
    assert!(
        a.history
            .iter()
            .any(|step| step.state == AutosizeState::Shrinking),
        "{a:?}"
    );
    for page in 0..PAGES {
        check_page(words, page, 1).unwrap();
    }
}

/// A budget of a sixteenth of the pages, set by hand, holds faults back past it and its
/// margin (`fault_hold_pages`); set by a controller under a cap of every page, it holds them back only past the
/// cap, which the region's pages never reach: a program reading every page has no fault
/// held back (`budget_held_faults`), while the reclaim thread still brings the region down
/// to the budget, and every page reads back, twice. Stopping the controller holds faults
/// at the budget again.
#[test]
fn under_its_cap_a_self_sized_budget_holds_no_fault_back() {
    let budget = PAGES / 16;
    let Some(r) = written_region(PAGES) else {
        return;
    };
    r.set_budget(budget as usize * PAGE).unwrap();
    let margin = |pages: u64| (pages / 16).min(128);
    assert_eq!(r.stats().fault_hold_pages, budget + margin(budget));
    // An interval of an hour: the controller takes no step, the budget stays where it is.
    r.set_autosize(Some(controller(PAGES, Duration::from_secs(3600))))
        .unwrap();
    let s = r.stats();
    assert_eq!(
        (s.budget_pages, s.fault_hold_pages),
        (budget, PAGES + margin(PAGES))
    );
    settle_at(&r, budget);
    let held_before = r.stats().budget_held_faults;
    for _ in 0..2 {
        for page in 0..PAGES {
            check_page(r.words(), page, 1).unwrap();
        }
        settle_at(&r, budget);
    }
    assert_eq!(r.stats().budget_held_faults, held_before);
    r.set_autosize(None).unwrap();
    assert_eq!(r.stats().fault_hold_pages, budget + margin(budget));
}

/// Waits until the region is down to `budget` pages (fails after 20 s).
fn settle_at(r: &ztier_uffd::Region, budget: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.stats().resident_pages > budget {
        assert!(Instant::now() < deadline, "never down to {budget}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
