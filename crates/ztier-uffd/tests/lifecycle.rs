//! A region made and dropped many times gives back everything it took: memory and address
//! space return to where they started. Alone in its test binary, because it reads the
//! process's RSS and mappings, which other tests running beside it would move.

mod common;

use common::{region, write_page, PAGE};

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

/// A region of 32 MiB with a 4 MiB budget, half its pages written (most of them compressed
/// into its device by the reclaim threads), read back, and dropped: a thousand times.
#[test]
fn made_and_dropped_a_thousand_times_a_region_leaves_memory_and_mappings_as_they_were() {
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
    let (rss0, size0, heaps0) = memory();
    for _ in 0..cycles {
        cycle();
    }
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
    assert!(
        size1 <= size0 + (4 << 20),
        "the address space grew by {:.1} MiB over {cycles} cycles",
        mib(size1, size0)
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        heaps1 <= 8 * cpus,
        "{heaps1} malloc heaps, past glibc's own bound"
    );
}
