//! `ztier serve --unit`: a device of 16 or 64 KiB compression units served over NBD, its
//! pages written back to a store and kept across a restart by `--state`, on zsmalloc and on
//! zblock; a host's devices with `unit_size` (one on zblock); sizes that are not whole units
//! refused.

mod common;

use common::{ctl, export, ok, serve, temp_dir};
use ztier_blockdev::testing::pattern;
use ztier_blockdev::BlockDevice;

/// Text-like pages (they compress), different per index.
fn pages(n: usize, seed: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| {
            let mut page = format!("page {i} of seed {seed}: ")
                .repeat(160)
                .into_bytes();
            page.resize(4096, b'.');
            page
        })
        .collect()
}

#[test]
fn a_device_of_64k_units_serves_writes_back_and_keeps_its_pages() {
    for allocator in ["zsmalloc", "zblock"] {
        serves_writes_back_and_keeps_its_pages(allocator);
    }
}

/// `a_device_of_64k_units_serves_writes_back_and_keeps_its_pages` on `allocator`.
fn serves_writes_back_and_keeps_its_pages(allocator: &str) {
    let dir = temp_dir(&format!("units-serve-{allocator}"));
    let (nbd, log, state, store) = (
        dir.join("nbd.sock"),
        dir.join("log"),
        dir.join("state"),
        dir.join("store"),
    );
    let args = [
        "--size",
        "16M",
        "--unit",
        "64K",
        "--compressor",
        "lz4",
        "--allocator",
        allocator,
        "--socket",
        nbd.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--backing-dev",
        store.to_str().unwrap(),
    ];
    let server = serve(&args, &common::ctl_socket(&nbd), &log);
    let data = pages(512, 7);
    let c = export(&nbd, "").unwrap();
    c.write_at(0, &data, false).unwrap();
    // A partial write inside a unit, then half the pages written back.
    c.write_at(5 * 4096 + 100, &pattern(9, 300), false).unwrap();
    let mut want = data.clone();
    want[5 * 4096 + 100..5 * 4096 + 400].copy_from_slice(&pattern(9, 300));
    drop(c);
    ok(ctl(&nbd, &["idle", "all"]));
    let wrote = ok(ctl(&nbd, &["writeback", "idle"]));
    assert!(wrote.starts_with("512 pages written back"), "{wrote}");
    server.stop();
    let server = serve(&args, &common::ctl_socket(&nbd), &log);
    let c = export(&nbd, "").unwrap();
    let mut back = vec![0u8; want.len()];
    c.read_at(0, &mut back).unwrap();
    assert!(
        back == want,
        "the pages came back through the state and the store ({allocator})"
    );
    drop(c);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hosts_device_takes_a_unit_size_and_a_size_of_whole_units() {
    let dir = temp_dir("units-host");
    let (nbd, log) = (dir.join("nbd.sock"), dir.join("log"));
    let server = serve(
        &[
            "--device",
            "vm1,size=8M,unit_size=16K,compressor=lz4",
            "--device",
            "vm2,size=8M,unit_size=64K,compressor=lz4,allocator=zblock",
            "--socket",
            nbd.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let data = pages(256, 3);
    for name in ["vm1", "vm2"] {
        let c = export(&nbd, name).unwrap();
        c.write_at(0, &data, false).unwrap();
        let mut back = vec![0u8; data.len()];
        c.read_at(0, &mut back).unwrap();
        assert!(back == data, "{name}");
    }
    let refused = ctl(&nbd, &["create", "odd", "size=20K", "unit_size=16K"]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("16384-byte units"), "{said}");
    let refused = ctl(&nbd, &["create", "odd", "size=64K", "unit_size=3K"]);
    assert!(String::from_utf8_lossy(&refused.stderr).contains("4K, 16K or 64K"));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
