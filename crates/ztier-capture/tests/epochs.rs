//! A recording of a child whose memory the test knows (this test binary run again: pages of
//! patterns, zeros and random bytes, some changed on command, a region freed on command):
//! every page captured as written, each epoch's trace exactly the pages that changed, went or
//! appeared, and epochs begun on multiples of the period.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::shared::{
    expected, period_multiples, serve_memory_child, MemoryChild, CHANGED, FREED_PAGES, PAGE,
    PATTERN_PAGES, RANDOM_PAGES, ZERO_PAGES,
};
use ztier_capture::{CaptureOptions, Recorder};
use ztier_corpus::trace::Trace;
use ztier_corpus::Corpus;

/// Not a test: the child the other tests capture (see `serve_memory_child`).
#[test]
#[ignore = "the child process the capture tests run, not a test"]
fn not_a_test_memory_child() {
    serve_memory_child();
}

/// The capture's pages by virtual page number after each epoch: (corpus page index).
fn pages_by_epoch(trace: &Trace) -> Vec<BTreeMap<u64, u32>> {
    let mut present = BTreeMap::new();
    let mut out = Vec::new();
    for e in &trace.epochs {
        for w in e.appeared.iter().chain(&e.changed) {
            present.insert(w.vpn, w.corpus_page);
        }
        for vpn in &e.went {
            present.remove(vpn);
        }
        out.push(present.clone());
    }
    out
}

fn corpus_page(corpus: &Corpus, index: u32) -> &[u8] {
    let i = index as usize * PAGE;
    &corpus.bytes()[i..i + PAGE]
}

#[test]
fn every_page_of_a_child_is_captured_as_written_and_a_region_freed_halfway_is_cut() {
    let dir = common::temp_dir("capture-known");
    let mut child = MemoryChild::spawn();
    let output = dir.join("child.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    let freed_first = child.regions["freed"].0;
    let mut freed_during = false;
    recorder
        .epoch(&mut |vpn| {
            // The region is freed once its first page is read: the rest of it goes while
            // the capture runs.
            if vpn == freed_first && !freed_during {
                child.command("free");
                freed_during = true;
            }
        })
        .unwrap();
    assert!(freed_during, "the capture read the region's first page");
    let manifest = recorder.finish().unwrap();
    assert!(
        manifest.processes[0].mappings.iter().any(|m| m.vanished),
        "the freed region's mapping is marked vanished"
    );
    let corpus = Corpus::load(&output).unwrap();
    assert_eq!(corpus.pages() as u64, manifest.pages);
    let trace = Trace::read(&dir.join("child.trace")).unwrap();
    assert_eq!(trace.epochs.len(), 1);
    let mut captured: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for (&vpn, &index) in &pages_by_epoch(&trace)[0] {
        let Some((region, page)) = child.locate(vpn) else {
            continue;
        };
        assert!(
            corpus_page(&corpus, index) == expected(region, page, 0).as_slice(),
            "{region} page {page} captured different from what the child wrote"
        );
        captured.entry(region).or_default().insert(page);
    }
    for (region, pages) in [
        ("patterns", PATTERN_PAGES),
        ("zeros", ZERO_PAGES),
        ("random", RANDOM_PAGES),
    ] {
        assert_eq!(
            captured.get(region).map_or(0, |s| s.len()),
            pages,
            "every page of {region}"
        );
    }
    let freed = captured.get("freed").map_or(0, |s| s.len());
    assert!(
        freed > 0 && freed < FREED_PAGES,
        "the freed region is captured up to where it was freed: {freed} of {FREED_PAGES} pages"
    );
    assert!(manifest.zero_pages >= ZERO_PAGES as u64);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_trace_over_epochs_sees_exactly_the_pages_the_child_changed() {
    let dir = common::temp_dir("capture-trace");
    let mut child = MemoryChild::spawn();
    let output = dir.join("child.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    recorder.epoch(&mut |_| {}).unwrap();
    child.command("change");
    recorder.epoch(&mut |_| {}).unwrap();
    // Nothing of the child's regions changes after: the third epoch sees none of them.
    recorder.epoch(&mut |_| {}).unwrap();
    recorder.finish().unwrap();
    let corpus = Corpus::load(&output).unwrap();
    let trace = Trace::read(&dir.join("child.trace")).unwrap();
    assert_eq!(trace.epochs.len(), 3);
    let by_epoch = pages_by_epoch(&trace);
    let mine = |list: &mut dyn Iterator<Item = u64>| -> BTreeSet<(String, usize)> {
        list.filter_map(|vpn| child.locate(vpn))
            .map(|(r, p)| (r.to_string(), p))
            .collect()
    };
    let e1 = &trace.epochs[1];
    let changed = mine(&mut e1.changed.iter().map(|w| w.vpn));
    let want: BTreeSet<(String, usize)> =
        CHANGED.iter().map(|&(r, p)| (r.to_string(), p)).collect();
    assert_eq!(
        changed, want,
        "epoch 1 changed exactly the pages the child rewrote"
    );
    assert!(mine(&mut e1.appeared.iter().map(|w| w.vpn)).is_empty());
    let went = mine(&mut e1.went.iter().copied());
    let freed_before: BTreeSet<(String, usize)> = by_epoch[0]
        .keys()
        .filter_map(|&vpn| child.locate(vpn))
        .filter(|(r, _)| *r == "freed")
        .map(|(r, p)| (r.to_string(), p))
        .collect();
    assert_eq!(freed_before.len(), FREED_PAGES);
    assert_eq!(
        went, freed_before,
        "epoch 1: every page of the freed region went, no other"
    );
    for (&vpn, &index) in &by_epoch[1] {
        if let Some((region, page)) = child.locate(vpn) {
            let generation = u64::from(CHANGED.contains(&(region, page)));
            assert!(
                corpus_page(&corpus, index) == expected(region, page, generation).as_slice(),
                "{region} page {page} after the change"
            );
        }
    }
    let e2 = &trace.epochs[2];
    assert!(mine(&mut e2.changed.iter().chain(&e2.appeared).map(|w| w.vpn)).is_empty());
    assert!(mine(&mut e2.went.iter().copied()).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_epoch_that_outlasts_the_period_moves_the_next_to_the_next_multiple_of_it() {
    let dir = common::temp_dir("capture-period");
    let child = MemoryChild::spawn();
    let output = dir.join("period.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &output, CaptureOptions::default()).unwrap();
    // Periods of 300 ms for 1.5 s (multiples 0 to 5); the first epoch is made to last 700 ms
    // (its report sleeps), past the multiples at 300 and 600 ms: the next starts at 900 ms
    // or later, on a multiple. Back to back, as before, it would start at ~700 ms and the one
    // after just then.
    const PERIOD_MS: u64 = 300;
    recorder
        .record(
            std::time::Duration::from_millis(PERIOD_MS),
            std::time::Duration::from_millis(1500),
            &mut |e| {
                if e.epoch == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(700));
                }
            },
        )
        .unwrap();
    let manifest = recorder.finish().unwrap();
    let starts: Vec<u64> = manifest.epochs.iter().map(|e| e.millis).collect();
    let multiples = period_multiples(&starts, PERIOD_MS);
    assert!(
        starts.len() >= 2 && multiples[0] == 0 && multiples[1] >= 3,
        "{starts:?}"
    );
    // Every multiple up to the end either began an epoch or was missed.
    assert_eq!(
        manifest.missed_periods + starts.len() as u64,
        6,
        "epochs at {starts:?} ms"
    );
    assert_eq!(manifest.period_millis, Some(PERIOD_MS));
    std::fs::remove_dir_all(&dir).unwrap();
}
