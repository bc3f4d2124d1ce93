//! zram writeback to a remote disk: nbdkit's `memory` plugin started by the test, on a Unix
//! socket and, across two network namespaces joined by a veth pair (with a netem delay where
//! the kernel has it), over
//! TCP, as one machine pushing cold pages to another. A store killed mid-writeback loses
//! nothing that was still in memory. Tools missing (or no root for namespaces) make a test
//! say so and skip, except under CI.

mod common;

use std::path::{Path, PathBuf};

use common::{have, temp_dir};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_compress::Algorithm;
use ztier_nbd::{Client, Uri};
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

/// nbdkit serving a `memory` export, killed when dropped.
struct Nbdkit(Child);

impl Nbdkit {
    fn on_socket(socket: &Path, size: &str) -> Nbdkit {
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(socket)
            .args(["memory", size])
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nbdkit");
        let start = Instant::now();
        while !socket.exists() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "nbdkit never made its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nbdkit(child)
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Text-like pages, different per index.
fn page(i: u64) -> Vec<u8> {
    let mut p = ztier_base::pattern::pattern(i, 1024);
    p.extend(std::iter::repeat_n(b"remote writeback ".iter().copied(), 200).flatten());
    p.truncate(4096);
    p
}

#[test]
fn pages_written_back_to_nbdkit_read_back_and_a_killed_server_loses_nothing() {
    if !have("nbdkit") {
        return;
    }
    let dir = temp_dir("kill");
    let socket = dir.join("nbdkit.sock");
    let mut nbdkit = Nbdkit::on_socket(&socket, "64M");
    let uri: Uri = format!("nbd+unix:///?socket={}", socket.display())
        .parse()
        .unwrap();
    let n = 4000u64;
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    let dev = Device::new(
        n * 4096,
        "lz4".parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap();
    for i in 0..n {
        dev.write_page(i, &page(i)).unwrap();
    }
    let client = Arc::new(Client::connect(&uri).unwrap());
    dev.set_backing(Some(
        Backing::new(client.clone(), WbFormat::Packed).unwrap(),
    ))
    .unwrap();
    dev.mark_idle(None);
    let first = dev
        .writeback(PageSelector::Idle, Some(0..n / 2), None)
        .unwrap();
    assert_eq!(first.pages, n / 2);
    let mut out = vec![0u8; 4096];
    for i in 0..n {
        dev.read_page(i, &mut out).unwrap();
        assert!(out == page(i), "page {i} before the kill");
    }
    // The store dies; the next writeback fails and keeps its pages in memory.
    nbdkit.kill();
    dev.mark_idle(None); // (the reads above cleared the marks)
    let before = dev.mm_stat();
    let err = dev
        .writeback(PageSelector::Idle, Some(n / 2..n), None)
        .unwrap_err();
    assert!(!err.to_string().is_empty());
    assert_eq!(dev.mm_stat(), before);
    for i in n / 2..n {
        dev.read_page(i, &mut out).unwrap();
        assert!(
            out == page(i),
            "page {i}, never written back, after the kill"
        );
    }
    // Pages that were on the dead store: a clear error, never wrong bytes.
    let err = dev.read_page(0, &mut out).unwrap_err();
    assert!(err.to_string().contains("was lost"), "{err}");
    // The device goes on serving writes and reads.
    dev.write_page(0, &page(99_999)).unwrap();
    dev.read_page(0, &mut out).unwrap();
    assert!(out == page(99_999));
    let _ = std::fs::remove_dir_all(&dir);
}

fn ztier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(args)
        .output()
        .expect("run ztier")
}

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst")
}

/// The bench's fields after writeback, checked.
fn check_bench_json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in [
        "mm_stat_after_recompress",
        "recompressed_pages",
        "mm_stat_after_writeback",
        "bd_stat",
        "writeback_bytes",
        "writeback_mb_s",
        "readback_mb_s",
    ] {
        assert!(!r[key].is_null(), "{key} missing in {r}");
    }
    assert_eq!(r["verified"], true);
    let pages = r["pages_written_back"].as_u64().unwrap();
    assert!(pages > 2000, "{r}");
    // Packed: a written-back page costs its compressed size, not a block.
    assert!(
        r["writeback_bytes_per_page"].as_f64().unwrap() < 2048.0,
        "{r}"
    );
    assert_eq!(r["mm_stat_after_writeback"]["compr_data_size"], 0);
    assert_eq!(r["bd_stat"]["bd_count"].as_u64().unwrap(), pages);
    r
}

#[test]
fn the_bench_recompresses_and_writes_back_to_a_file_and_to_nbdkit() {
    let dir = temp_dir("bench");
    let file = dir.join("wb.img");
    let o = ztier(&[
        "bench",
        "--corpus",
        sample().to_str().unwrap(),
        "--compressor",
        "lz4",
        "--recompress",
        "zstd",
        "--writeback-file",
        file.to_str().unwrap(),
        "--json",
    ]);
    check_bench_json(&o);
    assert!(!file.exists(), "the bench removes the file it made");
    if !have("nbdkit") {
        return;
    }
    let socket = dir.join("nbdkit.sock");
    let _nbdkit = Nbdkit::on_socket(&socket, "64M");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let o = ztier(&[
        "bench",
        "--corpus",
        sample().to_str().unwrap(),
        "--recompress",
        "zstd",
        "--writeback-nbd",
        &uri,
        "--json",
    ]);
    let r = check_bench_json(&o);
    assert!(
        r["store"].as_str().unwrap().starts_with("nbd+unix://"),
        "{r}"
    );
    let o = ztier(&["bench", "--writeback-nbd", "nbd://127.0.0.1:1/none"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("start the NBD server that exports it"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two network namespaces joined by a veth pair, removed when dropped.
struct Namespaces {
    near: String,
    far: String,
}

impl Namespaces {
    fn make() -> Option<Namespaces> {
        let id = std::process::id() % 200 + 20;
        let ns = Namespaces {
            near: format!("ztier-near-{id}"),
            far: format!("ztier-far-{id}"),
        };
        let (va, vb) = (format!("zt{id}a"), format!("zt{id}b"));
        let script = format!(
            "set -e
             ip netns add {near}
             ip netns add {far}
             ip link add {va} type veth peer name {vb}
             ip link set {va} netns {near}
             ip link set {vb} netns {far}
             ip -n {near} addr add 10.231.{id}.1/24 dev {va}
             ip -n {far} addr add 10.231.{id}.2/24 dev {vb}
             ip -n {near} link set {va} up
             ip -n {far} link set {vb} up
             ip -n {near} link set lo up
             ip -n {far} link set lo up",
            near = ns.near,
            far = ns.far,
        );
        let o = Command::new("sh").args(["-c", &script]).output().ok()?;
        if !o.status.success() {
            ztier_corpus::cannot_test(&format!(
                "cannot make network namespaces (root and iproute2 needed): {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
            return None;
        }
        // A delay on the link, where the kernel has netem (sch_netem); without it the
        // namespaces still stand for two machines.
        let netem = Command::new("tc")
            .args([
                "-n", &ns.near, "qdisc", "add", "dev", &va, "root", "netem", "delay", "1ms",
            ])
            .output();
        if !netem.is_ok_and(|o| o.status.success()) {
            eprintln!("note: no tc netem on this kernel; the far-memory link has no added delay");
        }
        Some(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.near])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.far])
            .output();
    }
}

#[test]
fn far_memory_across_network_namespaces() {
    if !have("nbdkit") || !have("ip") || !have("tc") {
        return;
    }
    let Some(ns) = Namespaces::make() else {
        return;
    };
    let id = std::process::id() % 200 + 20;
    let far_ip = format!("10.231.{id}.2");
    let mut nbdkit = Nbdkit(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.far,
                "nbdkit",
                "--foreground",
                "--exit-with-parent",
            ])
            .args(["--ipaddr", &far_ip, "--port", "10809", "memory", "256M"])
            .spawn()
            .expect("start nbdkit in the far namespace"),
    );
    // Wait for the export to answer from the near side.
    let uri = format!("nbd://{far_ip}:10809/");
    let start = Instant::now();
    loop {
        let probe = Command::new("ip")
            .args(["netns", "exec", &ns.near, "nbdinfo", "--size", &uri])
            .output();
        if probe.is_ok_and(|o| o.status.success()) {
            break;
        }
        if start.elapsed() > Duration::from_secs(20) || !have("nbdinfo") {
            // Without nbdinfo, give nbdkit a moment and go on.
            std::thread::sleep(Duration::from_secs(1));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.near,
            env!("CARGO_BIN_EXE_ztier"),
            "bench",
        ])
        .args(["--corpus", sample().to_str().unwrap()])
        .args(["--recompress", "zstd", "--writeback-nbd", &uri, "--json"])
        .output()
        .unwrap();
    let r = check_bench_json(&o);
    assert!(r["store"].as_str().unwrap().contains(&far_ip), "{r}");
    nbdkit.kill();
}

/// `ztier ctl --socket SOCKET WORDS`' output, which must succeed.
fn ctl(socket: &Path, words: &[&str]) -> String {
    let o = ztier(&[&["ctl", "--socket", socket.to_str().unwrap()], words].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `ztier serve` with its state at `state` and its backing store `store`, waited for.
fn serve_state(socket: &Path, state: &Path, store: &str) -> Child {
    let mut ctl_socket = socket.as_os_str().to_owned();
    ctl_socket.push(".ctl");
    let _ = std::fs::remove_file(&ctl_socket);
    let child = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["serve", "--size", "16M", "--compressor", "lz4", "--socket"])
        .arg(socket)
        .arg("--state")
        .arg(state)
        .args(["--backing-dev", store])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !Path::new(&ctl_socket).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ztier serve never made its control socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn stop(mut server: Child) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(server.wait().unwrap().success());
}

#[test]
fn a_restart_finds_its_pages_on_nbdkit_and_refuses_a_store_that_restarted_empty() {
    if !have("nbdkit") || !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("remote-state");
    let (socket, state) = (dir.join("s.sock"), dir.join("state"));
    let store_socket = dir.join("nbdkit.sock");
    let mut nbdkit = Nbdkit::on_socket(&store_socket, "64M");
    let store = format!("nbd+unix:///?socket={}", store_socket.display());
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let image = dir.join("image");
    let pages: Vec<u8> = (0..4096u64).flat_map(page).collect();
    std::fs::write(&image, &pages).unwrap();

    let server = serve_state(&socket, &state, &store);
    let copy = |from: &str, to: &str| {
        let o = Command::new("nbdcopy").args([from, to]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    copy(image.to_str().unwrap(), &uri);
    ctl(&socket, &["idle", "all"]);
    ctl(&socket, &["writeback", "idle"]);
    let bd_count = |socket: &Path| -> u64 {
        ctl(socket, &["bd_stat"])
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let on_store = bd_count(&socket);
    assert!(on_store >= 4000, "{on_store} pages written back");
    stop(server);

    // Started again: the pages are read from nbdkit, where they stayed.
    let server = serve_state(&socket, &state, &store);
    assert_eq!(bd_count(&socket), on_store);
    let back = dir.join("back");
    copy(&uri, back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap()[..pages.len()] == pages[..]);
    stop(server);

    // nbdkit restarted: an empty export of the same size, not the store the pages went to.
    nbdkit.kill();
    let _ = std::fs::remove_file(&store_socket);
    let _nbdkit = Nbdkit::on_socket(&store_socket, "64M");
    let o = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["serve", "--size", "16M", "--compressor", "lz4", "--socket"])
        .arg(dir.join("refused.sock"))
        .arg("--state")
        .arg(&state)
        .args(["--backing-dev", &store])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "served pages from a store that restarted empty"
    );
    assert!(
        err.contains("not the one its pages were written back to"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stop while the policy writes back to a slow store (every write 100 ms late): the
/// writeback in progress ends and no other starts before the final save, so the state it
/// saves still describes the store and the next start loads it.
#[test]
fn a_stop_during_the_policys_writeback_saves_a_state_that_loads() {
    if !have("nbdkit") || !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("remote-state-policy");
    let (socket, state) = (dir.join("s.sock"), dir.join("state"));
    let store_socket = dir.join("nbdkit.sock");
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(&store_socket)
        .args(["--filter=delay", "memory", "64M", "wdelay=100ms"])
        .spawn()
        .expect("start nbdkit");
    let _nbdkit = Nbdkit(child);
    let start = Instant::now();
    while !store_socket.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no nbdkit socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let store = format!("nbd+unix:///?socket={}", store_socket.display());
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let image = dir.join("image");
    let pages: Vec<u8> = (0..4096u64).flat_map(page).collect();
    std::fs::write(&image, &pages).unwrap();
    let serve = |policy: bool| {
        let mut ctl_socket = socket.as_os_str().to_owned();
        ctl_socket.push(".ctl");
        let _ = std::fs::remove_file(&ctl_socket);
        let child = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(["serve", "--size", "16M", "--compressor", "lz4", "--socket"])
            .arg(&socket)
            .arg("--state")
            .arg(&state)
            .args(["--backing-dev", &store])
            .args(if policy {
                &["--mem-target", "1M", "--policy-interval", "1s"][..]
            } else {
                &[][..]
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = child;
        let start = Instant::now();
        while !Path::new(&ctl_socket).exists() {
            if child.try_wait().unwrap().is_some() {
                let out = child.wait_with_output().unwrap();
                panic!(
                    "ztier serve did not start: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no control socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    };
    let server = serve(true);
    let o = Command::new("nbdcopy")
        .args([image.to_str().unwrap(), &uri])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Stopped once the policy has begun writing back (a few pages out of thousands).
    let start = Instant::now();
    loop {
        let bd = ctl(&socket, &["bd_stat"]);
        if bd.split_whitespace().next().unwrap() != "0" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no writeback");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = server.wait_with_output_after_term();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let server = serve(false);
    let back = dir.join("back");
    let o = Command::new("nbdcopy")
        .args([&uri, back.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&back).unwrap()[..pages.len()] == pages[..]);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

trait TermWait {
    fn wait_with_output_after_term(self) -> Output;
}

impl TermWait for Child {
    /// SIGTERM, then its status and stderr.
    fn wait_with_output_after_term(self) -> Output {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        self.wait_with_output().unwrap()
    }
}
