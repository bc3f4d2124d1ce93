//! Pools an embedder makes ahead of use cost little: many empty pools share the process's one
//! chunk-ahead helper thread and map no memory of their own (each used to start a thread and
//! fault in 2 MiB: 100 empty pools took 207 MiB and 100 threads). Alone in its test binary,
//! so no other test's threads or memory are counted.

use ztier_pool::{process_rss_bytes, ZPool, ZblockConfig, ZblockPool, ZsConfig, ZsPool};

fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn empty_pools_take_no_thread_and_no_chunk_each() {
    let Some(rss_before) = process_rss_bytes() else {
        ztier_corpus::cannot_test("/proc/self/statm unreadable");
        return;
    };
    let threads_before = threads();
    let zs: Vec<ZsPool> = (0..100)
        .map(|_| ZsPool::new(ZsConfig::default()).unwrap())
        .collect();
    let zb: Vec<ZblockPool> = (0..100)
        .map(|_| ZblockPool::new(ZblockConfig::default()).unwrap())
        .collect();
    // Give a helper that was started time to fault its chunk in, so it is counted.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let grown = process_rss_bytes().unwrap().saturating_sub(rss_before);
    eprintln!(
        "200 empty pools: RSS +{} KiB, threads {threads_before} -> {}",
        grown >> 10,
        threads()
    );
    assert!(
        threads() <= threads_before + 1,
        "{} threads for 200 pools (from {threads_before})",
        threads()
    );
    // The one ready chunk (2 MiB) and the pools' own tables (about 20 KiB each).
    assert!(
        grown < 12 << 20,
        "200 empty pools grew RSS by {grown} bytes"
    );
    assert!(zs.iter().all(|p| p.total_pages() == 0) && zb.iter().all(|p| p.total_pages() == 0));
    drop((zs, zb));
}
