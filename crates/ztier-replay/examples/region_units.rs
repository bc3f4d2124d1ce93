//! A userfaultfd region's compression units measured against each other on a corpus: for
//! each unit size (4, 16 and 64 KiB), in alternated rounds of the same run, the corpus is
//! written into a region, evicted under a quarter budget and read back in order (one word
//! a page: the sequential fault-in of `ztier bench uffd`, reclaim running beside it), then
//! all of it stored (`mem_used_total`, the device's memory) and read back in order into
//! free memory (nothing evicted meanwhile); every page is verified. Median MB/s of pages
//! brought in, and the device reads (decompressions) the faults made.
//!
//! `cargo run --release -p ztier-replay --example region_units -- CORPUS [ROUNDS [ALGORITHM [FAULT_AROUND]]]`
//! (lz4 and a window of `MAX_AROUND` pages, the region's defaults, unless named).

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use ztier_compress::Algorithm;
use ztier_corpus::Corpus;
use ztier_uffd::{Region, RegionConfig, RegionStats};

const PAGE: usize = 4096;
const UNITS: [usize; 3] = [4 << 10, 16 << 10, 64 << 10];

/// One round at one unit size.
#[derive(Default, Clone, Copy)]
struct Round {
    /// Sequential fault-in under a quarter budget, MB/s of pages brought in.
    budget_mb_s: f64,
    /// Sequential fault-in of the whole region, all of it stored, into free memory.
    free_mb_s: f64,
    /// The device's memory with every page stored.
    mem_used_total: u64,
    /// Device reads by the free pass's faults, and pages they brought in.
    free_reads: u64,
    free_pages_in: u64,
}

fn wait_for_reclaim_pass(region: &Region) {
    let mut last = (u64::MAX, Instant::now());
    loop {
        let s = region.stats();
        let now = Instant::now();
        if s.resident_pages != last.0 {
            last = (s.resident_pages, now);
        }
        if s.resident_pages <= s.reclaim_target_pages
            || (s.resident_pages <= s.budget_pages && now - last.1 >= Duration::from_millis(20))
        {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn pages_in(s: &RegionStats) -> u64 {
    s.faults + s.fault_around_pages
}

/// Reads one word of every page in order: MB/s of pages brought in, and the figures after.
fn sequential(region: &Region, pages: usize) -> (f64, RegionStats, RegionStats) {
    let words = region.words();
    let before = region.stats();
    let t = Instant::now();
    let mut sum = 0u64;
    for i in 0..pages {
        sum = sum.wrapping_add(words[i * (PAGE / 8)].load(Relaxed));
    }
    let taken = t.elapsed();
    std::hint::black_box(sum);
    let after = region.stats();
    let brought = pages_in(&after) - pages_in(&before);
    let mb_s = brought as f64 * PAGE as f64 / taken.as_secs_f64() / 1e6;
    (mb_s, before, after)
}

fn verify(region: &Region, corpus: &Corpus) {
    let words = region.words();
    for (i, page) in corpus.chunks(PAGE).enumerate() {
        for (w, bytes) in page.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            assert_eq!(
                words[i * (PAGE / 8) + w].load(Relaxed),
                v,
                "page {i} word {w}"
            );
        }
    }
}

fn round(corpus: &Corpus, unit_size: usize, algorithm: &Algorithm, fault_around: usize) -> Round {
    let pages = corpus.pages();
    let len = pages * PAGE;
    let config = RegionConfig {
        unit_size,
        algorithm: algorithm.clone(),
        fault_around,
        ..RegionConfig::default()
    };
    let region = Region::with_config(len, len, &config).expect("making the region");
    let words = region.words();
    for (i, page) in corpus.chunks(PAGE).enumerate() {
        for (w, bytes) in page.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            words[i * (PAGE / 8) + w].store(v, Relaxed);
        }
    }
    region.set_budget(len / 4).expect("budget");
    wait_for_reclaim_pass(&region);
    let (budget_mb_s, ..) = sequential(&region, pages);
    region.set_budget(PAGE).expect("budget");
    wait_for_reclaim_pass(&region);
    let stored = region.stats();
    region.set_budget(len).expect("budget");
    let (free_mb_s, before, after) = sequential(&region, pages);
    verify(&region, corpus);
    Round {
        budget_mb_s,
        free_mb_s,
        mem_used_total: stored.mm_stat.mem_used_total,
        free_reads: after.store_reads - before.store_reads,
        free_pages_in: pages_in(&after) - pages_in(&before),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("a corpus (.pages or .pages.zst)");
    let rounds: usize = args.next().map_or(5, |r| r.parse().expect("rounds"));
    let algorithm: Algorithm = args
        .next()
        .map_or(Ok(RegionConfig::default().algorithm), |a| a.parse())
        .expect("an algorithm");
    let fault_around: usize = args.next().map_or(ztier_uffd::MAX_AROUND, |a| {
        a.parse().expect("a window in pages")
    });
    let corpus = Corpus::load(std::path::Path::new(&path)).expect("loading the corpus");
    println!(
        "{}: {} pages, {algorithm}, windows up to {fault_around} pages, {rounds} rounds",
        corpus.name,
        corpus.pages()
    );
    let mut all: Vec<Vec<Round>> = vec![Vec::new(); UNITS.len()];
    for r in 0..rounds {
        // Alternated, and the order turned each round.
        for k in 0..UNITS.len() {
            let u = (k + r) % UNITS.len();
            let x = round(&corpus, UNITS[u], &algorithm, fault_around);
            println!(
                "round {r} unit {:>2}K: budget {:7.1} MB/s, free {:7.1} MB/s, mem_used_total {:>10}, \
                 free pass {} reads for {} pages",
                UNITS[u] >> 10,
                x.budget_mb_s,
                x.free_mb_s,
                x.mem_used_total,
                x.free_reads,
                x.free_pages_in
            );
            all[u].push(x);
        }
    }
    println!("| unit | seq fault-in, 25% budget (MB/s) | seq fault-in, free (MB/s) | mem_used_total (MiB) | reads/pages (free pass) |");
    println!("|---|---|---|---|---|");
    for (u, rounds) in all.iter().enumerate() {
        let b = median(rounds.iter().map(|x| x.budget_mb_s).collect());
        let f = median(rounds.iter().map(|x| x.free_mb_s).collect());
        let m = median(rounds.iter().map(|x| x.mem_used_total as f64).collect());
        let last = rounds.last().expect("a round");
        println!(
            "| {} KiB | {b:.0} | {f:.0} | {:.1} | {}/{} |",
            UNITS[u] >> 10,
            m / (1 << 20) as f64,
            last.free_reads,
            last.free_pages_in
        );
    }
}
