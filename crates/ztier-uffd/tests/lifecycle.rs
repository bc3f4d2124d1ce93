//! A region costs what it holds: made and dropped many times it gives back everything it
//! took (memory and address space return to where they started), and a region sized far
//! past what it holds costs no more for its size. Alone in its test binary, because it reads
//! the process's RSS and mappings, which other tests running beside it would move; and its
//! tests run one at a time, for the same reason.

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{region, write_page, PAGE};

/// Held by each test: one reads the process's memory while no other moves it.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The process's resident set (`/proc/self/status`), and its address space outside the C
/// library's per-thread malloc heaps, in bytes; and how many of those heaps there are.
///
/// glibc gives each thread that allocates an arena, its heaps 64 MiB reservations aligned
/// to 64 MiB (`HEAP_MAX_SIZE`), kept when the thread ends and reused by the next (at most 8
/// arenas a CPU): the region's threads come and go with it, so the count of heaps can move
/// by one whenever more threads than before happen to overlap. They are the C library's
/// cache, bounded by it, not mappings the region made; everything else is counted.
fn memory() -> (u64, u64, usize) {
    const HEAP: u64 = 64 << 20;
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap()
        * 1024;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let ranges: Vec<(u64, u64, bool)> = maps
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next().unwrap().split_once('-').unwrap();
            let named = f.nth(4).is_some();
            (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
                named,
            )
        })
        .collect();
    let (mut other, mut heaps) = (0, 0);
    let mut i = 0;
    while i < ranges.len() {
        let (start, _, named) = ranges[i];
        // A heap: anonymous mappings, each beginning where the last ended, from a 64 MiB
        // boundary to the next one (heaps of several arenas lie side by side).
        let mut j = i;
        while !named
            && start % HEAP == 0
            && ranges[j].1 < start + HEAP
            && j + 1 < ranges.len()
            && ranges[j + 1].0 == ranges[j].1
            && !ranges[j + 1].2
        {
            j += 1;
        }
        if !named && start % HEAP == 0 && ranges[j].1 == start + HEAP {
            heaps += 1;
            i = j + 1;
            continue;
        }
        other += ranges[i].1 - ranges[i].0;
        i += 1;
    }
    (rss, other, heaps)
}

/// Waits until the process's memory is at rest: the pool's helper gives its ready chunk
/// back to the OS a second after allocation stops, and its idle trim follows, so a reading
/// right after a region's drop may hold up to a chunk (2 MiB) that is the process's, not
/// the region's. At rest: the RSS the same at eight looks in a row, 200 ms apart (1.6 s:
/// past that second and the trim's tick).
fn settle() {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut same = 0;
    let mut last = memory().0;
    while same < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = memory().0;
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    if same < 8 {
        eprintln!("the process's memory never held still for 1.6 s in 10 s: read as it was");
    }
}

/// A region of 32 MiB with a 4 MiB budget, half its pages written (most of them compressed
/// into its device by the reclaim threads), read back, and dropped: a thousand times.
#[test]
fn made_and_dropped_a_thousand_times_a_region_leaves_memory_and_mappings_as_they_were() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    const LEN: usize = 32 << 20;
    let cycles = 1000;
    let cycle = || {
        let Some(r) = region(LEN, 4 << 20) else {
            return false;
        };
        let words = r.words();
        // Every other page: 16 MiB written, three quarters of it compressed into the
        // device's pool, whose pages all go back to its arena at the drop.
        for page in (0..(LEN / PAGE) as u64).step_by(2) {
            write_page(words, page, 1);
        }
        for page in (0..(LEN / PAGE) as u64).step_by(64) {
            common::check_page(words, page, 1).unwrap();
        }
        true
    };
    // The first cycles make what a process keeps once (threads' stacks reused, the
    // allocator's arenas): measured after them.
    for _ in 0..10 {
        if !cycle() {
            return;
        }
    }
    settle();
    let (rss0, size0, heaps0) = memory();
    for _ in 0..cycles {
        cycle();
    }
    settle();
    let (rss1, size1, heaps1) = memory();
    let mib = |b: u64, a: u64| (b as f64 - a as f64) / (1 << 20) as f64;
    eprintln!(
        "after {cycles} cycles: RSS {:+.1} MiB, address space {:+.1} MiB (outside malloc's \
         heaps, which went from {heaps0} to {heaps1})",
        mib(rss1, rss0),
        mib(size1, size0)
    );
    assert!(
        rss1 <= rss0 + (4 << 20),
        "RSS grew by {:.1} MiB over {cycles} cycles",
        mib(rss1, rss0)
    );
    // Room for two more threads' stacks the C library keeps (2 MiB and a guard page each,
    // seen once on a busy machine); a cycle's smallest mapping, its 8 KiB page-state table,
    // left behind each time would be 7.8 MiB.
    assert!(
        size1 <= size0 + (6 << 20),
        "the address space grew by {:.1} MiB over {cycles} cycles",
        mib(size1, size0)
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        heaps1 <= 8 * cpus,
        "{heaps1} malloc heaps, past glibc's own bound"
    );
}

/// A region of 1 TiB holding 64 MiB costs memory within 8 MiB of what it holds (its
/// resident pages and its device's pool), and is made in well under a second: its per-page
/// metadata (the device's slot table, the pages' states) is taken as pages are touched.
#[test]
fn a_terabyte_region_holding_64_mib_costs_what_it_holds() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    const LEN: usize = 1 << 40;
    const HELD: usize = 64 << 20;
    let (rss0, _, _) = memory();
    let start = Instant::now();
    let Some(r) = region(LEN, 16 << 20) else {
        return;
    };
    let made_in = start.elapsed();
    let words = r.words();
    // 64 MiB written across the terabyte: 16 MiB at its start, a quarter, half and three
    // quarters of the way in (a program's heap, and other areas far apart).
    let areas: Vec<u64> = (0..4).map(|k| (k * LEN / 4 / PAGE) as u64).collect();
    let area_pages = (HELD / 4 / PAGE) as u64;
    for &first in &areas {
        for page in first..first + area_pages {
            write_page(words, page, 1);
        }
    }
    // The reclaim pass the writes started, over.
    let deadline = Instant::now() + Duration::from_secs(60);
    while r.stats().resident_pages > r.stats().budget_pages {
        assert!(Instant::now() < deadline, "{:?}", r.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    // The arena helper's ready chunk and releases in flight, settled.
    settle();
    let s = r.stats();
    let holds = s.resident_pages * PAGE as u64 + s.mm_stat.mem_used_total;
    let (rss1, _, _) = memory();
    let cost = rss1.saturating_sub(rss0);
    eprintln!(
        "a 1 TiB region holding {} MiB ({} pages resident, {} MiB of pool): RSS +{} MiB, made in {made_in:?}",
        holds >> 20,
        s.resident_pages,
        s.mm_stat.mem_used_total >> 20,
        cost >> 20
    );
    assert!(
        cost <= holds + (8 << 20),
        "{} MiB of RSS for {} MiB held",
        cost >> 20,
        holds >> 20
    );
    // Slot tables and page states for 2^28 pages made up front would take seconds; a second
    // leaves room for a loaded machine's scheduling of the region's threads.
    assert!(made_in < Duration::from_secs(1), "made in {made_in:?}");
    for &first in &areas {
        for page in (first..first + area_pages).step_by(97) {
            common::check_page(words, page, 1).unwrap();
        }
    }
}
