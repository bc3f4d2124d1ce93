//! A host of devices at scale, from outside: 256 devices of 64 GiB made at runtime in one
//! `ztier serve` cost memory as they are used, not as they are large; 64 devices made,
//! written, written back and destroyed while 4 clients write and check other devices lose
//! no byte of theirs, and every destroyed device's memory and store file go.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use common::{ctl, export, ok, serve, temp_dir, text};
use ztier_blockdev::testing::pattern;
use ztier_blockdev::BlockDevice;

/// The process's resident memory (`VmRSS`), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("a VmRSS line");
    kib << 10
}

/// A device may take a moment to let go of a client that closed its connection.
fn destroy(nbd: &Path, name: &str) {
    for _ in 0..200 {
        let o = ctl(nbd, &["destroy", name]);
        if o.status.success() {
            return;
        }
        assert!(text(&o).contains("held by"), "{}", text(&o));
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("{name} was never let go");
}

/// 256 devices of 64 GiB (16 TiB of disks) made through the control socket: the server
/// holds at most 64 MB before a page is written (each device's slot table is memory the OS
/// zeroes, taken as pages arrive). Written, each serves its own pages.
#[test]
fn two_hundred_and_fifty_six_devices_of_64_gib_cost_memory_as_they_are_used() {
    let dir = temp_dir("host-256");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "vm0,size=64G",
            "--socket",
            nbd.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    for i in 1..256 {
        let made = ok(ctl(&nbd, &["create", &format!("vm{i}"), "size=64G"]));
        assert!(made.contains(&format!("created vm{i}")), "{made}");
    }
    let listed = ok(ctl(&nbd, &["devices"]));
    assert_eq!(listed.lines().filter(|l| l.contains("size=")).count(), 256);
    let before = rss(server.child.id());
    assert!(
        before <= 64_000_000,
        "{before} bytes resident with 256 devices of 64 GiB before any write"
    );
    // Pages at the far ends of a few disks: each device has its own.
    let far = (64u64 << 30) - 4096;
    for i in [0u64, 17, 255] {
        let c = export(&nbd, &format!("vm{i}")).unwrap();
        c.write_at(0, &pattern(i, 4096), false).unwrap();
        c.write_at(far, &pattern(i + 1000, 4096), false).unwrap();
    }
    let mut page = vec![0u8; 4096];
    for i in [0u64, 17, 255] {
        let c = export(&nbd, &format!("vm{i}")).unwrap();
        c.read_at(0, &mut page).unwrap();
        assert!(page == pattern(i, 4096), "vm{i}'s first page");
        c.read_at(far, &mut page).unwrap();
        assert!(page == pattern(i + 1000, 4096), "vm{i}'s last page");
    }
    let c = export(&nbd, "vm18").unwrap();
    c.read_at(far, &mut page).unwrap();
    assert!(
        page.iter().all(|&b| b == 0),
        "an unwritten device reads zeros"
    );
    drop(c);
    let after = rss(server.child.id());
    assert!(
        after <= before + 8_000_000,
        "{after} bytes resident after 6 pages were written (before: {before})"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pages a checker thread writes to its device in a round, and checks back.
const CHECK_PAGES: u64 = 64;

/// Writes and checks back its device's pages, round after round, until told to stop;
/// returns the rounds and the wrong bytes it read.
fn check_loop(nbd: PathBuf, name: String, seed: u64, stop: Arc<AtomicBool>) -> (u64, u64) {
    let c = export(&nbd, &name).unwrap();
    let mut back = vec![0u8; 4096];
    let (mut rounds, mut wrong) = (0u64, 0u64);
    while !stop.load(Relaxed) || rounds < 4 {
        for p in 0..CHECK_PAGES {
            let at = (p * 37 % 1024) * 4096;
            c.write_at(at, &pattern(seed ^ (rounds << 20) ^ p, 4096), false)
                .unwrap();
        }
        for p in 0..CHECK_PAGES {
            let at = (p * 37 % 1024) * 4096;
            c.read_at(at, &mut back).unwrap();
            let want = pattern(seed ^ (rounds << 20) ^ p, 4096);
            wrong += back.iter().zip(&want).filter(|(a, b)| a != b).count() as u64;
        }
        rounds += 1;
    }
    (rounds, wrong)
}

/// 64 devices made, written (4 MiB each), written back to their stores and destroyed while 4
/// clients write and check 4 other devices: 0 wrong bytes; each destroyed device's store
/// file is gone and its memory back (the server's RSS does not grow with the churn).
#[test]
fn devices_made_and_destroyed_under_load_lose_nothing_and_give_everything_back() {
    let dir = temp_dir("host-churn");
    let nbd = dir.join("nbd.sock");
    let stores = dir.join("stores");
    std::fs::create_dir_all(&stores).unwrap();
    let log = dir.join("log");
    let mut args: Vec<String> = Vec::new();
    for i in 0..4 {
        args.extend(["--device".into(), format!("steady{i},size=64M")]);
    }
    args.extend([
        "--socket".into(),
        nbd.to_str().unwrap().into(),
        "--store-dir".into(),
        stores.to_str().unwrap().into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = serve(&args, &common::ctl_socket(&nbd), &log);
    let stop = Arc::new(AtomicBool::new(false));
    let checkers: Vec<_> = (0..4u64)
        .map(|i| {
            let (nbd, stop) = (nbd.clone(), Arc::clone(&stop));
            std::thread::spawn(move || check_loop(nbd, format!("steady{i}"), i << 40, stop))
        })
        .collect();
    let written_back = AtomicU64::new(0);
    let mut warm = 0;
    for round in 0..64u64 {
        let name = format!("churn{round}");
        ok(ctl(&nbd, &["create", &name, "size=64M"]));
        let c = export(&nbd, &name).unwrap();
        for p in 0..1024u64 {
            c.write_at(p * 4096, &pattern(round * 4096 + p, 4096), false)
                .unwrap();
        }
        ok(ctl(&nbd, &["--device", &name, "idle", "all"]));
        ok(ctl(&nbd, &["--device", &name, "writeback", "idle"]));
        let bd = ok(ctl(&nbd, &["--device", &name, "bd_stat"]));
        let on_store: u64 = bd.split_whitespace().next().unwrap().parse().unwrap();
        written_back.fetch_add(on_store, Relaxed);
        let mut back = vec![0u8; 4096];
        c.read_at(513 * 4096, &mut back).unwrap();
        assert!(
            back == pattern(round * 4096 + 513, 4096),
            "{name} read back"
        );
        assert!(stores.join(format!("{name}.store")).exists());
        drop(c);
        destroy(&nbd, &name);
        assert!(
            !stores.join(format!("{name}.store")).exists(),
            "{name}'s store file outlives it"
        );
        if round == 3 {
            warm = rss(server.child.id());
        }
    }
    let churned = rss(server.child.id());
    stop.store(true, Relaxed);
    for (i, t) in checkers.into_iter().enumerate() {
        let (rounds, wrong) = t.join().unwrap();
        assert_eq!(
            wrong, 0,
            "steady{i}: {wrong} wrong bytes in {rounds} rounds"
        );
        assert!(rounds >= 4);
    }
    // 60 devices of 4 MiB each came and went after the warm-up: had they kept their memory,
    // the server would hold over 100 MiB more.
    assert!(
        churned <= warm + 24_000_000,
        "{churned} bytes resident after 64 devices came and went (after 4: {warm})"
    );
    assert!(
        written_back.load(Relaxed) >= 64 * 512,
        "the churned devices' pages went to their stores"
    );
    let listed = ok(ctl(&nbd, &["devices"]));
    assert_eq!(listed.lines().filter(|l| l.contains("size=")).count(), 4);
    let left: Vec<_> = std::fs::read_dir(&stores)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 4, "only the steady devices' stores: {left:?}");
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// 64 devices of 64 GiB with stores made, used and destroyed: what they held leaves the
/// process. Unused, they hold little (their tables follow use); 256 pages written to each,
/// one every 256 MiB, and written back, bring in a page of slot table apiece (1 MiB a
/// device), their pools' chunks and their stores' clusters (a C library that kept large
/// blocks after their free would hold them all).
#[test]
fn destroyed_devices_give_their_memory_back_to_the_os() {
    let dir = temp_dir("host-give-back");
    let nbd = dir.join("nbd.sock");
    let stores = dir.join("stores");
    std::fs::create_dir_all(&stores).unwrap();
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "first,size=64G",
            "--socket",
            nbd.to_str().unwrap(),
            "--store-dir",
            stores.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let start = rss(server.child.id());
    for i in 0..64 {
        ok(ctl(&nbd, &["create", &format!("vm{i}"), "size=64G"]));
    }
    let unused = rss(server.child.id());
    // The budget, 64 MB for 256 devices of 64 GiB, at this scale.
    assert!(
        unused <= start + 16_000_000,
        "{unused} bytes with 64 unused devices and stores (start: {start})"
    );
    const SPREAD: u64 = 256;
    for i in 0..64u64 {
        let name = format!("vm{i}");
        let c = export(&nbd, &name).unwrap();
        for p in 0..SPREAD {
            let at = p * ((64 << 30) / SPREAD);
            c.write_at(at, &pattern(i * SPREAD + p, 4096), false)
                .unwrap();
        }
        drop(c);
        ok(ctl(&nbd, &["--device", &name, "idle", "all"]));
        ok(ctl(&nbd, &["--device", &name, "writeback", "idle"]));
    }
    let made = rss(server.child.id());
    assert!(
        made >= unused + 64 * 1_000_000,
        "{made} bytes with 64 devices used (unused: {unused}): their tables are held"
    );
    for i in 0..64 {
        destroy(&nbd, &format!("vm{i}"));
    }
    // The arena helper may be partway through a release or trim that still holds the
    // destroyed devices' arenas: waited out.
    let bound = start + 24_000_000;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut after = rss(server.child.id());
    while after > bound && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        after = rss(server.child.id());
    }
    // What stays is the C library's: small blocks the devices freed, kept in its arenas
    // for the next (11 to 14 MB, measured on this test before and after the allocator's
    // tables followed use); not the ~170 MB they held.
    assert!(
        after <= bound,
        "{after} bytes after 64 devices were destroyed (start: {start}, with them: {made})"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
