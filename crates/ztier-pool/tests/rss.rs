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
    let end = process_rss_bytes().unwrap();
    let slack = handle_vec + (64 << 20);
    assert!(
        end <= start + slack,
        "RSS after freeing 1 GiB: {} MiB, started at {} MiB",
        end >> 20,
        start >> 20
    );
}
