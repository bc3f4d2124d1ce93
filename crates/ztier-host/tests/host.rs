//! The host of devices: devices by name made and ended while others are written; what a
//! device costs before use; each device's cap and the host's limit; the budget that keeps
//! the pools' sum under the target with the coldest pages across devices, sparing a
//! device's protection (the coldest and largest one too); limits changed at runtime; states
//! kept across a host's restart; one name made by two callers at once.

use std::sync::atomic::{AtomicU64, Ordering};

use ztier_blockdev::{BlockDevice, BlockError};
use ztier_host::{DeviceSpec, Host, HostConfig, HostError};
use ztier_pool::testing::pattern;

fn dir(name: &str) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ztier-host-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spec(s: &str) -> DeviceSpec {
    s.parse().unwrap()
}

/// Incompressible pages: each costs a pool page.
fn write_pages(dev: &dyn BlockDevice, first: u64, count: u64, seed: u64) -> Result<(), BlockError> {
    for i in first..first + count {
        dev.write_at(i * 4096, &pattern(seed ^ i, 4096), false)?;
    }
    Ok(())
}

#[test]
fn devices_by_name_are_made_and_ended() {
    let host = Host::new(HostConfig::default()).unwrap();
    let a = host.create(spec("a,size=16M,compressor=lz4")).unwrap();
    host.create(spec("b,size=8M")).unwrap();
    assert!(matches!(
        host.create(spec("a,size=4M")),
        Err(HostError::Exists(_))
    ));
    let names: Vec<String> = host
        .devices()
        .iter()
        .map(|d| d.name().to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(a.block_device().size(), 16 << 20);
    write_pages(&*a.block_device(), 0, 256, 1).unwrap();
    assert!(host.group().used_bytes() >= 256 * 4096);
    drop(a);
    let gone = host.destroy("a").unwrap();
    assert!(host.get("a").is_none());
    assert!(matches!(host.destroy("a"), Err(HostError::NoSuchDevice(_))));
    // Its memory goes back with the last holder.
    assert!(host.group().used_bytes() >= 256 * 4096);
    drop(gone);
    assert_eq!(host.group().used_bytes(), 0);
}

/// Devices made and ended while four threads write and verify others: no wrong byte, and
/// every ended device's memory and store given back.
/// Two callers making one name at once: one device is made, the other caller is refused
/// before it touches the first one's store, whose pages read back whole.
#[test]
fn one_name_made_twice_at_once_is_made_once() {
    let stores = dir("race");
    let host = Host::new(HostConfig {
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    for round in 0..32 {
        let name = format!("r{round}");
        let barrier = std::sync::Barrier::new(2);
        let made: Vec<_> = std::thread::scope(|s| {
            let tries: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let d = host.create(spec(&format!("{name},size=4M")))?;
                        // The store's file is in use: written back and read again.
                        write_pages(&*d.block_device(), 0, 4, round).unwrap();
                        d.device()
                            .writeback(ztier_zram::PageSelector::All, None, None)
                            .unwrap();
                        Ok::<_, HostError>(d)
                    })
                })
                .collect();
            tries.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let ok: Vec<_> = made.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 1, "round {round}: made {} times", ok.len());
        assert!(made
            .iter()
            .any(|r| matches!(r, Err(HostError::Exists(n)) if *n == name)));
        let d = ok[0];
        assert_eq!(d.device().bd_stat().unwrap().bd_count, 4);
        let mut back = vec![0; 4096];
        for i in 0..4 {
            d.block_device().read_at(i * 4096, &mut back).unwrap();
            assert_eq!(back, pattern(round ^ i, 4096), "round {round}: page {i}");
        }
    }
    let _ = std::fs::remove_dir_all(&stores);
}

#[test]
fn devices_come_and_go_while_others_are_written() {
    let stores = dir("churn");
    let host = Host::new(HostConfig {
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let steady: Vec<_> = (0..4)
        .map(|i| host.create(spec(&format!("steady{i},size=8M"))).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (t, d) in steady.iter().enumerate() {
            let dev = d.block_device();
            s.spawn(move || {
                for round in 0..20u64 {
                    write_pages(&*dev, 0, 128, t as u64 * 1000 + round).unwrap();
                    let mut back = vec![0u8; 4096];
                    for i in 0..128u64 {
                        dev.read_at(i * 4096, &mut back).unwrap();
                        assert!(
                            back == pattern((t as u64 * 1000 + round) ^ i, 4096),
                            "device {t} round {round} page {i}"
                        );
                    }
                }
            });
        }
        s.spawn(|| {
            for i in 0..64 {
                let name = format!("churn{i}");
                let d = host.create(spec(&format!("{name},size=4M"))).unwrap();
                write_pages(&*d.block_device(), 0, 64, i).unwrap();
                let store = stores.join(format!("{name}.store"));
                assert!(store.exists());
                drop(d);
                drop(host.destroy(&name).unwrap());
                assert!(!store.exists(), "{name}'s store was removed");
            }
        });
    });
    let steady_total: u64 = steady
        .iter()
        .map(|d| d.device().mm_stat().mem_used_total)
        .sum();
    for d in &steady {
        d.device().report_to_group();
    }
    assert_eq!(
        host.group().used_bytes(),
        steady_total,
        "every churned device's pool came off"
    );
    let _ = std::fs::remove_dir_all(&stores);
}

/// A device's cap fails writes on that device alone; the host's limit fails them on
/// whichever device would take the sum past it.
#[test]
fn a_cap_is_one_device_s_and_the_limit_is_the_host_s() {
    let host = Host::new(HostConfig {
        limit: 4 << 20,
        ..HostConfig::default()
    })
    .unwrap();
    let capped = host.create(spec("capped,size=16M,mem_limit=1M")).unwrap();
    let other = host.create(spec("other,size=16M")).unwrap();
    let e = write_pages(&*capped.block_device(), 0, 1024, 1).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    assert!(e.to_string().contains("memory limit"), "{e}");
    write_pages(&*other.block_device(), 0, 512, 2).unwrap();
    let e = write_pages(&*other.block_device(), 512, 1024, 3).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC);
    assert!(e.to_string().contains("group"), "{e}");
    assert!(host.group().used_bytes() <= 4 << 20);
}

/// Over the target, the budget writes back the coldest pages across devices: the big cold
/// device's, not the small hot ones'; a device under its protection gives none while others
/// can.
#[test]
fn the_budget_takes_the_coldest_pages_and_spares_protection() {
    let stores = dir("budget");
    let host = Host::new(HostConfig {
        target: Some(6 << 20),
        interval: Some(std::time::Duration::from_secs(3600)),
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let cold = host.create(spec("cold,size=32M")).unwrap();
    let protected = host.create(spec("protected,size=16M,mem_low=2M")).unwrap();
    write_pages(&*cold.block_device(), 0, 1536, 1).unwrap(); // 6 MiB
    write_pages(&*protected.block_device(), 0, 384, 2).unwrap(); // 1.5 MiB, under its 2 MiB
                                                                 // Both older than 2 s; the hot ones written now.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let hot: Vec<_> = (0..2)
        .map(|i| host.create(spec(&format!("hot{i},size=8M"))).unwrap())
        .collect();
    for (i, d) in hot.iter().enumerate() {
        write_pages(&*d.block_device(), 0, 256, 10 + i as u64).unwrap(); // 1 MiB each
    }
    let (used, tick) = host.keep_under_target().unwrap();
    assert!(used <= 6 << 20, "under the target: {used}");
    assert!(used >= (6 << 20) * 95 / 100, "not far under it: {used}");
    assert!(tick.written_back_pages > 0);
    assert_eq!(tick.errors, 0, "{:?}", tick.last_error);
    assert_eq!(
        cold.budget_written_back_pages(),
        tick.written_back_pages,
        "all from the cold device"
    );
    for d in hot.iter().chain([&protected]) {
        assert_eq!(d.budget_written_back_pages(), 0, "{}", d.name());
        assert_eq!(d.device().bd_stat().unwrap().bd_writes, 0, "{}", d.name());
    }
    // Reading the protected device back touches no store.
    let mut back = vec![0u8; 4096];
    for i in 0..384u64 {
        protected
            .block_device()
            .read_at(i * 4096, &mut back)
            .unwrap();
    }
    assert_eq!(protected.device().bd_stat().unwrap().bd_reads, 0);
    // The cold device's pages read back right from the store.
    for i in 0..1536u64 {
        cold.block_device().read_at(i * 4096, &mut back).unwrap();
        assert!(back == pattern(1 ^ i, 4096), "cold page {i}");
    }
    let _ = std::fs::remove_dir_all(&stores);
}

/// A device under its protection keeps its pages though they are the coldest and the most:
/// the budget takes a warmer device's instead, and reads of the protected one touch no store.
#[test]
fn protection_holds_for_the_coldest_and_largest_device() {
    let stores = dir("coldest-protected");
    let host = Host::new(HostConfig {
        target: Some(7 << 20),
        interval: Some(std::time::Duration::from_secs(3600)),
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let protected = host.create(spec("protected,size=32M,mem_low=8M")).unwrap();
    write_pages(&*protected.block_device(), 0, 1536, 1).unwrap(); // 6 MiB, under its 8 MiB
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let warm = host.create(spec("warm,size=16M")).unwrap();
    write_pages(&*warm.block_device(), 0, 768, 2).unwrap(); // 3 MiB, newer
    let (used, tick) = host.keep_under_target().unwrap();
    assert!(used <= 7 << 20, "under the target: {used}");
    assert_eq!(tick.errors, 0, "{:?}", tick.last_error);
    assert_eq!(tick.protected_pages_taken, 0);
    assert!(
        warm.budget_written_back_pages() > 0,
        "the warmer device gave"
    );
    assert_eq!(protected.budget_written_back_pages(), 0);
    assert_eq!(protected.device().bd_stat().unwrap().bd_writes, 0);
    let mut back = vec![0u8; 4096];
    for i in 0..1536u64 {
        protected
            .block_device()
            .read_at(i * 4096, &mut back)
            .unwrap();
        assert!(back == pattern(1 ^ i, 4096), "protected page {i}");
    }
    assert_eq!(protected.device().bd_stat().unwrap().bd_reads, 0);
    let _ = std::fs::remove_dir_all(&stores);
}

/// Only when every device is down to its protection are protected pages taken.
#[test]
fn protection_gives_way_only_when_every_device_is_down_to_its_own() {
    let stores = dir("low");
    let host = Host::new(HostConfig {
        target: Some(1 << 20),
        interval: Some(std::time::Duration::from_secs(3600)),
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let a = host.create(spec("a,size=16M,mem_low=2M")).unwrap();
    let b = host.create(spec("b,size=16M,mem_low=2M")).unwrap();
    write_pages(&*a.block_device(), 0, 768, 1).unwrap(); // 3 MiB
    write_pages(&*b.block_device(), 0, 256, 2).unwrap(); // 1 MiB
    let (used, tick) = host.keep_under_target().unwrap();
    assert!(used <= 1 << 20, "{used}");
    assert!(
        tick.protected_pages_taken > 0,
        "every device got to its protection, so it gave way"
    );
    assert!(a.budget_written_back_pages() > b.budget_written_back_pages());
    let _ = std::fs::remove_dir_all(&stores);
}

/// With a state directory, a host stopped and made again finds every device as it was.
#[test]
fn states_keep_every_device_across_a_restart() {
    let states = dir("states");
    let config = HostConfig {
        state_dir: Some(states.clone()),
        ..HostConfig::default()
    };
    let host = Host::new(config.clone()).unwrap();
    for i in 0..3u64 {
        let d = host
            .create(spec(&format!("vm{i},size=8M,compressor=lz4")))
            .unwrap();
        assert!(!d.state_loaded());
        d.consume_state().unwrap();
        write_pages(&*d.block_device(), 0, 100 + i, i).unwrap();
    }
    let saved = host.stop_and_save();
    assert_eq!(saved.len(), 3);
    assert!(saved.iter().all(|(_, r)| r.is_ok()));
    drop(host);
    let host = Host::new(config).unwrap();
    for i in 0..3u64 {
        let d = host
            .create(spec(&format!("vm{i},size=8M,compressor=lz4")))
            .unwrap();
        assert!(d.state_loaded());
        d.consume_state().unwrap();
        assert_eq!(d.device().mm_stat().orig_data_size, (100 + i) * 4096);
        let mut back = vec![0u8; 4096];
        d.block_device().read_at(7 * 4096, &mut back).unwrap();
        assert!(back == pattern(i ^ 7, 4096));
    }
    // A device whose state does not match its spec is refused, saying why.
    host.stop_and_save();
    drop(host);
    let host = Host::new(HostConfig {
        state_dir: Some(states.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let e = host
        .create(spec("vm1,size=16M,compressor=lz4"))
        .map(drop)
        .unwrap_err();
    assert!(matches!(e, HostError::State { .. }), "{e}");
    assert!(host.get("vm1").is_none());
    let _ = std::fs::remove_dir_all(&states);
}

/// A device's spec is kept beside its state: read back, it is the same spec, and a
/// destroyed device's is gone.
#[test]
fn specs_are_kept_for_the_next_start() {
    let dir = dir("specs");
    let host = Host::new(HostConfig {
        state_dir: Some(dir.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let a: DeviceSpec = "a,size=8M,compressor=zstd:level=3,mem_limit=4M,mem_low=1M,writeback_idle=90s,read_only=true,serial=disk-a"
        .parse()
        .unwrap();
    let b: DeviceSpec = "b,size=16M,allocator=zblock".parse().unwrap();
    host.create(a.clone()).unwrap();
    host.create(b.clone()).unwrap();
    host.create("c,size=4M".parse().unwrap()).unwrap();
    host.destroy("c").unwrap();
    let saved = Host::saved_specs(&dir).unwrap();
    assert_eq!(saved, vec![a, b]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Limits changed at runtime are the device's at once and its spec's: kept in the state
/// directory, so the next start makes the device with them; other attributes go to zram.
#[test]
fn limits_changed_at_runtime_are_kept_for_the_next_start() {
    let dir = dir("limits");
    let host = Host::new(HostConfig {
        state_dir: Some(dir.clone()),
        ..HostConfig::default()
    })
    .unwrap();
    let d = host.create(spec("vm1,size=8M,mem_limit=4M")).unwrap();
    host.set("vm1", "mem_limit", "1M").unwrap();
    assert_eq!(d.device().mm_stat().mem_limit, 1 << 20);
    host.set("vm1", "mem_low", "512K").unwrap();
    assert_eq!(d.mem_low(), 512 << 10);
    assert_eq!(d.spec().mem_limit, 1 << 20);
    // The cap holds at once: incompressible pages past 1 MiB are refused.
    let e = write_pages(&*d.block_device(), 0, 512, 1).unwrap_err();
    assert!(
        e.to_string().contains("space") || e.to_string().contains("ENOSPC"),
        "{e}"
    );
    // A bad value changes nothing; an unknown device is named.
    assert!(host.set("vm1", "mem_low", "lots").is_err());
    assert_eq!(d.mem_low(), 512 << 10);
    assert!(matches!(
        host.set("vm9", "mem_limit", "1M"),
        Err(HostError::NoSuchDevice(_))
    ));
    host.set("vm1", "idle", "all").unwrap();
    let saved = Host::saved_specs(&dir).unwrap();
    assert_eq!(saved.len(), 1);
    assert_eq!((saved[0].mem_limit, saved[0].mem_low), (1 << 20, 512 << 10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_promotion_target_runs_the_device_s_policy_and_is_reported() {
    let host = Host::new(HostConfig::default()).unwrap();
    let d = host
        .create(spec("p,size=4M,promotion_target=0.2%/min"))
        .unwrap();
    let promotion = d.policy_stats().unwrap().promotion.unwrap();
    // The controller's defaults: it starts at the oldest age, an hour (no younger one is
    // known to be safe yet), aiming at 0.2 % a minute.
    assert_eq!(promotion.age_secs, 3600);
    assert_eq!(promotion.target_share_per_minute, 0.002);
    let text = ztier_host::metrics::exposition(&host, &[]);
    for line in [
        "ztier_device_promotion_age_seconds{device=\"p\"} 3600",
        "ztier_device_promotion_target_minute_ratio{device=\"p\"} 0.002",
        "ztier_device_promotion_decisions_total{device=\"p\",step=\"older\"} 0",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    // A device without one has no promotion figures.
    host.create(spec("q,size=4M,writeback_idle=1m")).unwrap();
    assert!(host
        .get("q")
        .unwrap()
        .policy_stats()
        .unwrap()
        .promotion
        .is_none());
    assert!(!ztier_host::metrics::exposition(&host, &[])
        .contains("ztier_device_promotion_age_seconds{device=\"q\"}"));
}
