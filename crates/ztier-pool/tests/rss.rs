//! Memory is real: pages the pool stops using go back to the OS.
//!
//! Alone in its own test binary, because it reads the process's RSS, which tests running in
//! parallel threads of the same process would disturb.

use ztier_pool::testing::pattern;
use ztier_pool::{process_rss_bytes, Handle, ZPool, ZsConfig, ZsPool};

fn pool(page_size: usize, chain_size: usize, chain_rule: ztier_pool::ChainRule) -> ZsPool {
    ZsPool::new(ZsConfig {
        page_size,
        chain_size,
        chain_rule,
        max_object: None,
    })
    .unwrap()
}

/// Storing 1 GiB of objects and freeing them returns the memory: RSS comes back to within a
/// few MiB of where it started, and while they are stored it tracks `total_pages`.
#[test]
fn rss_follows_pages_used() {
    let Some(start) = process_rss_bytes() else {
        ztier_corpus::cannot_test("/proc/self/statm unreadable");
        return;
    };
    let pool = pool(4096, 8, ztier_pool::ChainRule::LeastWaste);
    let object = pattern(42, 2000);
    let count = (1usize << 30) / object.len();
    let mut handles = Vec::with_capacity(count);
    for _ in 0..count {
        handles.push(pool.store(&object).unwrap());
    }
    let held = pool.total_pages() * 4096;
    let peak = process_rss_bytes().unwrap();
    let handle_vec = (count * std::mem::size_of::<Handle>()) as u64;
    assert!(
        peak >= start + held - (8 << 20),
        "RSS {peak} should include the {held} bytes held (start {start})"
    );
    for h in handles.drain(..) {
        pool.free(h).unwrap();
    }
    drop(handles);
    assert_eq!(pool.total_pages(), 0);
    // Freed pages past the hot list are gathered and released by the arena's helper thread
    // off the freeing thread's path, at most 16 MiB of them waiting (the freeing thread
    // releases beyond that): RSS comes down once the helper has had a core.
    let slack = handle_vec + (64 << 20);
    let now = process_rss_bytes().unwrap();
    assert!(
        now <= start + slack + (16 << 20),
        "RSS just after freeing 1 GiB: {} MiB, started at {} MiB",
        now >> 20,
        start >> 20
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut end = now;
    while end > start + slack && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
        end = process_rss_bytes().unwrap();
    }
    assert!(
        end <= start + slack,
        "RSS after freeing 1 GiB: {} MiB, started at {} MiB",
        end >> 20,
        start >> 20
    );
}
