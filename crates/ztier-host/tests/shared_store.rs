//! One store for every device of a host: each device's written-back pages in extents of
//! its own, read back right; a destroyed device's extents given back and the others'
//! untouched; across a restart, every saved device finds its pages on the store, even with
//! a new device made first; a map whose state a crash consumed is let go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ztier_blockdev::file::FileDevice;
use ztier_blockdev::thin::{ThinStore, DEFAULT_EXTENT_SIZE};
use ztier_host::{DeviceSpec, Host, HostConfig, HostError};
use ztier_pool::testing::pattern;

fn dir(name: &str) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ztier-host-shared-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

const PAGES: u64 = 600;

fn store_over(path: &std::path::Path) -> Arc<ThinStore> {
    let file = FileDevice::open(path, 256 << 20).unwrap();
    ThinStore::new(Arc::new(file), DEFAULT_EXTENT_SIZE).unwrap()
}

fn spec(name: &str) -> DeviceSpec {
    format!("{name},size=16M,compressor=lz4").parse().unwrap()
}

/// Writes `PAGES` pages of device `seed`'s own, then writes every one back to the store.
fn fill_and_write_back(host: &Host, name: &str, seed: u64) {
    let d = host.get(name).unwrap();
    for i in 0..PAGES {
        d.block_device()
            .write_at(i * 4096, &pattern(seed << 32 | i, 4096), false)
            .unwrap();
    }
    host.set(name, "idle", "all").unwrap();
    host.set(name, "writeback", "idle").unwrap();
    assert_eq!(
        d.device().bd_stat().unwrap().bd_count,
        PAGES,
        "{name}: every page written back"
    );
}

fn check(host: &Host, name: &str, seed: u64) {
    let d = host.get(name).unwrap();
    let mut back = vec![0u8; 4096];
    for i in 0..PAGES {
        d.block_device().read_at(i * 4096, &mut back).unwrap();
        assert!(back == pattern(seed << 32 | i, 4096), "{name} page {i}");
    }
}

#[test]
fn devices_share_one_store_each_in_extents_of_its_own_across_a_restart() {
    let dir = dir("restart");
    let (states, store_path) = (dir.join("states"), dir.join("store"));
    std::fs::create_dir_all(&states).unwrap();
    let config = |store| HostConfig {
        state_dir: Some(states.clone()),
        shared_store: Some(store),
        ..HostConfig::default()
    };
    let store = store_over(&store_path);
    let host = Host::new(config(Arc::clone(&store))).unwrap();
    for (seed, name) in ["a", "b", "c"].iter().enumerate() {
        host.create(spec(name)).unwrap();
        fill_and_write_back(&host, name, seed as u64);
    }
    let used = store.used_extents();
    assert!(used >= 3, "each device took extents: {used}");
    for (seed, name) in ["a", "b", "c"].iter().enumerate() {
        check(&host, name, seed as u64);
    }

    // A destroyed device's extents go back once its last holder lets go; the others read
    // what they wrote.
    let b = host.destroy("b").unwrap();
    drop(b);
    assert!(store.used_extents() < used, "b's extents given back");
    check(&host, "a", 0);
    check(&host, "c", 2);

    host.stop_and_save();
    drop(host);
    assert!(states.join("a.volume").exists() && !states.join("b.volume").exists());
    drop(store);

    // The next start: a new device is made before the saved ones, and takes none of their
    // extents; every saved page is read back from the store.
    let store = store_over(&store_path);
    let host = Host::new(config(Arc::clone(&store))).unwrap();
    host.create(spec("d")).unwrap();
    fill_and_write_back(&host, "d", 3);
    for saved in Host::saved_specs(&states).unwrap() {
        if saved.name == "d" {
            continue;
        }
        let d = host.create(saved).unwrap();
        assert!(d.state_loaded());
        d.consume_state().unwrap();
        assert_eq!(d.device().bd_stat().unwrap().bd_count, PAGES);
    }
    check(&host, "a", 0);
    check(&host, "c", 2);
    check(&host, "d", 3);

    // A crash after the devices were served: no state is left, so the maps are stale, and
    // the next start lets their extents go.
    drop(host);
    drop(store);
    let store = store_over(&store_path);
    let host = Host::new(config(Arc::clone(&store))).unwrap();
    assert_eq!(store.used_extents(), 0, "no saved state: no extent held");
    assert!(!states.join("a.volume").exists());
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_host_takes_one_kind_of_store() {
    let dir = dir("kinds");
    let store = store_over(&dir.join("store"));
    let both = Host::new(HostConfig {
        store_dir: Some(dir.clone()),
        shared_store: Some(store),
        ..HostConfig::default()
    });
    assert!(matches!(both, Err(HostError::TwoKindsOfStore)));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A device's `store_limit` caps its own part of the shared store: its writeback past the
/// limit leaves pages in memory (none lost), a neighbour writes back all of its own, and a
/// raised limit (at runtime, saved with the spec) lets the rest go.
#[test]
fn a_devices_store_limit_is_its_own() {
    let dir = dir("limit");
    let store = store_over(&dir.join("store"));
    let state_dir = dir.join("state");
    std::fs::create_dir_all(&state_dir).unwrap();
    let host = Host::new(HostConfig {
        shared_store: Some(Arc::clone(&store)),
        state_dir: Some(state_dir),
        ..HostConfig::default()
    })
    .unwrap();
    let capped: DeviceSpec = "capped,size=16M,compressor=lz4,store_limit=1M"
        .parse()
        .unwrap();
    host.create(capped).unwrap();
    host.create(spec("free")).unwrap();
    let d = host.get("capped").unwrap();
    for i in 0..PAGES {
        d.block_device()
            .write_at(i * 4096, &pattern(1 << 32 | i, 4096), false)
            .unwrap();
    }
    host.set("capped", "idle", "all").unwrap();
    // Past its limit the store refuses it: an error or pages left behind, never a loss.
    let refused = host.set("capped", "writeback", "idle");
    let (held, limit) = d.shared_store_use().unwrap();
    assert_eq!(limit, Some(1 << 20));
    assert!(held <= 1 << 20, "{held} bytes held past a 1 MiB limit");
    let on_store = d.device().bd_stat().unwrap().bd_count;
    assert!(
        on_store < PAGES,
        "{on_store} pages written back into 1 MiB ({refused:?})"
    );
    fill_and_write_back(&host, "free", 2);
    check(&host, "capped", 1);
    check(&host, "free", 2);
    let metrics = ztier_host::metrics::exposition(&host, &[]);
    for line in [
        "ztier_device_shared_store_limit_bytes{device=\"capped\"} 1048576",
        "ztier_device_mem_low_bytes{device=\"free\"} 0",
        "ztier_host_shared_store_bytes 268435456",
        "ztier_host_devices 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in:\n{metrics}"
        );
    }
    assert!(metrics.contains("ztier_host_shared_store_free_bytes "));
    // Raised at runtime: the rest goes, and the spec keeps it.
    host.set("capped", "store_limit", "8M").unwrap();
    assert_eq!(host.get("capped").unwrap().spec().store_limit, 8 << 20);
    host.set("capped", "idle", "all").unwrap();
    host.set("capped", "writeback", "idle").unwrap();
    assert_eq!(d.device().bd_stat().unwrap().bd_count, PAGES);
    check(&host, "capped", 1);
    assert!(matches!(
        host.set("capped", "store_limit", "lots"),
        Err(HostError::Spec(_))
    ));
    // A host without a shared store has no part of one to limit.
    let plain = Host::new(HostConfig::default()).unwrap();
    let refused = plain.create(
        "lonely,size=16M,store_limit=1M"
            .parse::<DeviceSpec>()
            .unwrap(),
    );
    assert!(
        matches!(&refused, Err(HostError::StoreLimitWithoutSharedStore { name }) if name == "lonely"),
        "{:?}",
        refused.err()
    );
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A device at its `store_limit` has nothing more the budget can take: the budget asks it
/// once a tick and counts it as down, so a protected neighbour gives way instead of none
/// (the capped device alone may keep the host over its target: its limit says so).
#[test]
fn a_device_at_its_store_limit_lets_the_budget_take_from_the_others() {
    let dir = dir("limit-budget");
    let store = store_over(&dir.join("store"));
    let host = Host::new(HostConfig {
        target: Some(1 << 20),
        interval: Some(std::time::Duration::from_secs(3600)),
        shared_store: Some(store),
        ..HostConfig::default()
    })
    .unwrap();
    let capped: DeviceSpec = "capped,size=16M,compressor=lz4,store_limit=1M"
        .parse()
        .unwrap();
    let capped = host.create(capped).unwrap();
    let guarded: DeviceSpec = "guarded,size=16M,compressor=lz4,mem_low=4M"
        .parse()
        .unwrap();
    let guarded = host.create(guarded).unwrap();
    for i in 0..PAGES {
        for (d, seed) in [(&capped, 5u64), (&guarded, 6)] {
            d.block_device()
                .write_at(i * 4096, &pattern(seed << 32 | i, 4096), false)
                .unwrap();
        }
    }
    let (_, first) = host.keep_under_target().unwrap();
    let (used, tick) = host.keep_under_target().unwrap();
    let (held, _) = capped.shared_store_use().unwrap();
    assert!(held <= 1 << 20, "{held} bytes past the limit");
    assert!(
        first.protected_pages_taken + tick.protected_pages_taken > 0,
        "the protected device gave way: {first:?} {tick:?}"
    );
    // The capped device alone holds more than the target: the guarded one gave all it had.
    let guarded_left = guarded.device().mm_stat().mem_used_total;
    assert!(
        guarded_left <= 256 << 10,
        "{guarded_left} bytes left on the guarded device"
    );
    assert!(guarded.budget_written_back_pages() >= PAGES - 64);
    assert!(used <= capped.device().mm_stat().mem_used_total + guarded_left);
    let why = first.last_error.or(tick.last_error).unwrap_or_default();
    assert!(why.starts_with("capped"), "{why}");
    check(&host, "capped", 5);
    check(&host, "guarded", 6);
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}
