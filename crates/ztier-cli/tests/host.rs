//! `ztier serve --device ...`: one server as the host of many devices. Each device is an NBD
//! export by its name and a vhost-user-blk socket of its own; devices are made and ended
//! through the control socket while others serve (refused while a client holds one);
//! `--state-dir` keeps every device, those made at runtime too, across a restart; a config
//! file says the same as the flags; the metrics endpoint is read by Prometheus's own parser
//! and agrees with each device's `mm_stat`; a host's `ztier stat --json` over time is drawn
//! by `ztier plot`.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use common::{ctl, export, ok, serve, temp_dir, text, wait_for};
use ztier_blockdev::testing::pattern;
use ztier_blockdev::BlockDevice;
use ztier_vhost::testing::{Guest, Options};

const ZTIER: &str = env!("CARGO_BIN_EXE_ztier");

/// `ztier stat --socket S --device NAME`'s mm_stat fields.
fn mm_stat(nbd: &Path, device: &str) -> Vec<u64> {
    stat_line(nbd, device, "mm_stat")
}

/// The fields of a line of `ztier stat --socket S --device NAME` (`mm_stat`, `io_stat`,
/// `bd_stat`): its leading numbers.
fn stat_line(nbd: &Path, device: &str, line: &str) -> Vec<u64> {
    let o = Command::new(ZTIER)
        .args([
            "stat",
            "--socket",
            nbd.to_str().unwrap(),
            "--device",
            device,
        ])
        .output()
        .unwrap();
    ok(o)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{line} ")))
        .unwrap_or_else(|| panic!("no {line} line"))
        .split_whitespace()
        .map_while(|w| w.parse().ok())
        .collect()
}

/// Devices by name, over NBD and vhost-user-blk: what is written to one is in it and in no
/// other; `stat` takes a device; an unknown export is refused; the host's `stat` lists each.
#[test]
fn each_device_is_served_by_its_name_over_nbd_and_vhost_user() {
    let dir = temp_dir("host-names");
    let nbd = dir.join("nbd.sock");
    let vhost = dir.join("vhost");
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "vm1,size=32M",
            "--device",
            "vm2,size=16M,compressor=lz4",
            "--socket",
            nbd.to_str().unwrap(),
            "--vhost-user-dir",
            vhost.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    wait_for(&vhost.join("vm2.sock"), "vm2's vhost-user-blk socket");
    let vm1 = export(&nbd, "vm1").unwrap();
    assert_eq!(vm1.size(), 32 << 20);
    vm1.write_at(0, &pattern(1, 8 * 4096), false).unwrap();
    let guest = Guest::connect(&vhost.join("vm2.sock"), Options::default());
    assert_eq!(guest.capacity(), 16 << 20);
    assert_eq!(guest.request(0, 1, 0, &pattern(2, 4 * 4096), 0).0, 0);
    assert_eq!(mm_stat(&nbd, "vm1")[0], 8 * 4096);
    assert_eq!(mm_stat(&nbd, "vm2")[0], 4 * 4096);
    // vm2 over NBD too: the guest's pages, not vm1's.
    let vm2 = export(&nbd, "vm2").unwrap();
    let mut back = vec![0u8; 4 * 4096];
    vm2.read_at(0, &mut back).unwrap();
    assert!(back == pattern(2, 4 * 4096));
    let refused = export(&nbd, "nope").err().expect("no export named nope");
    assert!(refused.to_string().contains("nope") || !refused.to_string().is_empty());
    let all = ok(Command::new(ZTIER)
        .args(["stat", "--socket", nbd.to_str().unwrap()])
        .output()
        .unwrap());
    assert!(all.starts_with("host 2 devices"), "{all}");
    assert!(
        all.contains("device vm1\n") && all.contains("device vm2\n"),
        "{all}"
    );
    let list = ok(ctl(&nbd, &["devices"]));
    assert!(
        list.contains("vm1 size=33554432") && list.contains("vmm=attached"),
        "{list}"
    );
    if common::have("nbdinfo") {
        let o = Command::new("nbdinfo")
            .args(["--list", &format!("nbd+unix://?socket={}", nbd.display())])
            .output()
            .unwrap();
        let listed = text(&o);
        assert!(listed.contains("vm1") && listed.contains("vm2"), "{listed}");
    }
    drop((vm1, vm2, guest));
    let out = server.stop();
    assert!(out.contains("device vm1\nmm_stat"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `create` makes a device a client can use at once; `destroy` is refused while a client
/// holds it and says who, ends it once let go (a new client is refused), and `force` cuts a
/// holder off. Other devices serve throughout.
#[test]
fn devices_are_made_and_ended_at_runtime() {
    let dir = temp_dir("host-runtime");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "base,size=8M",
            "--socket",
            nbd.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let base = export(&nbd, "base").unwrap();
    base.write_at(0, &pattern(9, 4096), false).unwrap();
    let made = ok(ctl(&nbd, &["create", "vm3", "size=16M", "compressor=lz4"]));
    assert!(made.contains("created vm3"), "{made}");
    let again = ctl(&nbd, &["create", "vm3", "size=16M"]);
    assert!(!again.status.success());
    assert!(text(&again).contains("exists"), "{}", text(&again));
    let bad = ctl(&nbd, &["create", "vm4", "size=16M", "colour=blue"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("colour"), "{}", text(&bad));
    let vm3 = export(&nbd, "vm3").unwrap();
    vm3.write_at(4096, &pattern(3, 4096), false).unwrap();
    let held = ctl(&nbd, &["destroy", "vm3"]);
    assert!(!held.status.success());
    assert!(
        text(&held).contains("held by 1 NBD connection"),
        "{}",
        text(&held)
    );
    drop(vm3);
    // The connection's end reaches the server a moment after the client closes it.
    let mut gone = String::new();
    for _ in 0..100 {
        let o = ctl(&nbd, &["destroy", "vm3"]);
        if o.status.success() {
            gone = text(&o);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(gone.contains("destroyed vm3"), "{gone}");
    assert!(
        export(&nbd, "vm3").is_err(),
        "a destroyed device is no export"
    );
    // Forced: the holder is cut off.
    ok(ctl(&nbd, &["create", "vm5", "size=8M"]));
    let vm5 = export(&nbd, "vm5").unwrap();
    let forced = ok(ctl(&nbd, &["destroy", "vm5", "force"]));
    assert!(forced.contains("cut off"), "{forced}");
    let mut page = vec![0u8; 4096];
    let mut cut = false;
    for _ in 0..100 {
        if vm5.read_at(0, &mut page).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(cut, "a forced destroy ends its clients' connections");
    // The first device served throughout.
    base.read_at(0, &mut page).unwrap();
    assert!(page == pattern(9, 4096));
    drop((base, vm5));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// With `--state-dir`, a restart brings back every device, one made at runtime included,
/// with its pages; a destroyed one stays gone.
#[test]
fn a_state_directory_keeps_every_device_across_a_restart() {
    let dir = temp_dir("host-state");
    let nbd = dir.join("nbd.sock");
    let states = dir.join("states");
    let log = dir.join("log");
    let args = [
        "--state-dir",
        states.to_str().unwrap(),
        "--socket",
        nbd.to_str().unwrap(),
    ];
    let mut first = vec!["--device", "vm1,size=8M"];
    first.extend_from_slice(&args);
    let server = serve(&first, &common::ctl_socket(&nbd), &log);
    ok(ctl(&nbd, &["create", "vm2", "size=16M", "compressor=lz4"]));
    ok(ctl(&nbd, &["create", "gone", "size=4M"]));
    ok(ctl(&nbd, &["destroy", "gone"]));
    for (name, seed) in [("vm1", 11), ("vm2", 12)] {
        let c = export(&nbd, name).unwrap();
        c.write_at(8192, &pattern(seed, 3 * 4096), false).unwrap();
    }
    server.stop();
    let server = serve(&args, &common::ctl_socket(&nbd), &log);
    for (name, seed) in [("vm1", 11), ("vm2", 12)] {
        let c = export(&nbd, name).unwrap();
        let mut back = vec![0u8; 3 * 4096];
        c.read_at(8192, &mut back).unwrap();
        assert!(back == pattern(seed, 3 * 4096), "{name}'s pages came back");
    }
    let list = ok(ctl(&nbd, &["devices"]));
    assert!(list.contains("vm2 size=16777216 compressor=lz4"), "{list}");
    assert!(!list.contains("gone"), "{list}");
    // Limits set at runtime come back with the device; the flags' own replace them, said.
    ok(ctl(&nbd, &["--device", "vm2", "mem_limit", "4M"]));
    // The device named in words, as the server's own hint writes it, is the same request.
    let low = ok(ctl(&nbd, &["device", "vm2", "mem_low", "1M"]));
    assert!(low.contains("mem_low set"), "{low}");
    let stat = ok(ctl(&nbd, &["device", "vm2", "mm_stat"]));
    assert_eq!(stat.split_whitespace().count(), 9, "{stat}");
    // And the hint's own forms: the device's statistics, an explicit get.
    let all = ok(ctl(&nbd, &["device", "vm2", "stat"]));
    let line = all
        .lines()
        .find_map(|l| l.strip_prefix("mm_stat "))
        .unwrap_or_else(|| panic!("no mm_stat in {all}"));
    assert!(
        line.split_whitespace().eq(stat.split_whitespace()),
        "{line} against {stat}"
    );
    assert_eq!(
        ok(ctl(&nbd, &["device", "vm2", "get", "mem_low"])).trim(),
        "1048576"
    );
    ok(ctl(&nbd, &["--device", "vm1", "mem_limit", "2M"]));
    server.stop();
    let mut again = vec!["--device", "vm1,size=8M"];
    again.extend_from_slice(&args);
    let server = serve(&again, &common::ctl_socket(&nbd), &log);
    let list = ok(ctl(&nbd, &["devices"]));
    assert!(
        list.contains("vm2 size=16777216 compressor=lz4")
            && list.contains("mem_limit=4194304 mem_low=1048576"),
        "{list}"
    );
    let said = server.log();
    assert!(
        said.contains(
            "device vm1: mem_limit=0 from the flags or config replaces mem_limit=2097152"
        ),
        "{said}"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// One store for every device (`--shared-store`): each device's pages written back to it
/// and read back, across a restart too; a destroyed device's extents given back.
#[test]
fn devices_write_back_to_one_shared_store_across_a_restart() {
    let dir = temp_dir("host-shared-store");
    let nbd = dir.join("nbd.sock");
    let store = dir.join("store");
    let log = dir.join("log");
    let states = dir.join("states");
    let args = [
        "--state-dir",
        states.to_str().unwrap(),
        "--shared-store",
        store.to_str().unwrap(),
        "--shared-store-size",
        "64M",
        "--socket",
        nbd.to_str().unwrap(),
    ];
    let mut first = vec!["--device", "vm1,size=8M", "--device", "vm2,size=8M"];
    first.extend_from_slice(&args);
    let server = serve(&first, &common::ctl_socket(&nbd), &log);
    ok(ctl(&nbd, &["create", "gone", "size=8M"]));
    for (name, seed) in [("vm1", 21), ("vm2", 22), ("gone", 23)] {
        let c = export(&nbd, name).unwrap();
        c.write_at(0, &pattern(seed, 64 * 4096), false).unwrap();
        drop(c);
        ok(ctl(&nbd, &["--device", name, "idle", "all"]));
        let wrote = ok(ctl(&nbd, &["--device", name, "writeback", "idle"]));
        assert!(
            wrote.starts_with("64 pages written back"),
            "{name}: {wrote}"
        );
    }
    let on_store = |name: &str| stat_line(&nbd, name, "bd_stat")[0];
    assert_eq!((on_store("vm1"), on_store("vm2")), (64, 64));
    ok(ctl(&nbd, &["destroy", "gone"]));
    server.stop();
    let server = serve(&args, &common::ctl_socket(&nbd), &log);
    for (name, seed) in [("vm1", 21), ("vm2", 22)] {
        assert_eq!(on_store(name), 64, "{name}'s pages are on the store");
        let c = export(&nbd, name).unwrap();
        let mut back = vec![0u8; 64 * 4096];
        c.read_at(0, &mut back).unwrap();
        assert!(back == pattern(seed, 64 * 4096), "{name}'s pages came back");
    }
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// nbdkit's `file` plugin serving `file` on `socket`, killed when dropped.
struct NbdkitFile(std::process::Child);

impl NbdkitFile {
    fn serve(socket: &Path, file: &Path) -> NbdkitFile {
        let _ = std::fs::remove_file(socket);
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--unix"])
            .arg(socket)
            .arg("file")
            .arg(file)
            .spawn()
            .expect("start nbdkit");
        wait_for(socket, "nbdkit's socket");
        NbdkitFile(child)
    }
}

impl Drop for NbdkitFile {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A shared store on an NBD export is known by its label: when the export goes and comes
/// back with its data, the host reconnects by itself and reads its pages again; when it
/// comes back empty (another disk), the host refuses it and reads no zeros for pages.
#[test]
fn a_shared_nbd_store_that_goes_away_is_found_again_by_its_label() {
    if !common::have("nbdkit") {
        return;
    }
    let dir = temp_dir("host-shared-nbd");
    let (nbd, log) = (dir.join("nbd.sock"), dir.join("log"));
    let (store_socket, disk) = (dir.join("store.sock"), dir.join("disk"));
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let nbdkit = NbdkitFile::serve(&store_socket, &disk);
    let store = format!("nbd+unix:///?socket={}", store_socket.display());
    let server = serve(
        &[
            "--device",
            // Whole pages on the store: a read goes to it, with no segment cache between.
            "vm1,size=8M,writeback_format=page",
            "--shared-store",
            &store,
            // A read waits this long for a lost store before it fails.
            "--backing-timeout",
            "3s",
            "--socket",
            nbd.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let c = export(&nbd, "vm1").unwrap();
    c.write_at(0, &pattern(31, 256 * 4096), false).unwrap();
    ok(ctl(&nbd, &["--device", "vm1", "idle", "all"]));
    let wrote = ok(ctl(&nbd, &["--device", "vm1", "writeback", "idle"]));
    assert!(wrote.starts_with("256 pages written back"), "{wrote}");
    // The disk holds the label, as the host wrote it.
    assert_eq!(&std::fs::read(&disk).unwrap()[..8], b"ZTIERTHN");

    // The store goes away and comes back with its data: the pages read back.
    drop(nbdkit);
    let nbdkit = NbdkitFile::serve(&store_socket, &disk);
    let mut back = vec![0u8; 64 * 4096];
    c.read_at(0, &mut back).unwrap();
    assert!(
        back == pattern(31, 64 * 4096),
        "pages read after the store came back"
    );

    // It comes back empty: refused, and no read returns zeros for a page on it.
    drop(nbdkit);
    let empty = dir.join("empty");
    std::fs::File::create(&empty)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let _nbdkit = NbdkitFile::serve(&store_socket, &empty);
    let mut page = vec![0u8; 4096];
    let err = c.read_at(200 * 4096, &mut page).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    drop(c);
    server.stop();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("is back after") && said.contains("REFUSED the store"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host serves its guests together: more than a one-device server's 16 connections at
/// once by default, and as many as `max_connections` in its config says.
#[test]
fn a_host_serves_more_guests_than_one_device_does() {
    let dir = temp_dir("host-connections");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &["--device", "vm1,size=8M", "--socket", nbd.to_str().unwrap()],
        &common::ctl_socket(&nbd),
        &log,
    );
    let held: Vec<_> = (0..24)
        .map(|i| export(&nbd, "vm1").unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    drop(held);
    server.stop();
    let config = dir.join("host.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nsocket = \"{}\"\nmax_connections = 2\n\n[[device]]\nname = \"vm1\"\nsize = \"8M\"\n",
            nbd.display()
        ),
    )
    .unwrap();
    let server = serve(
        &["--config", config.to_str().unwrap()],
        &common::ctl_socket(&nbd),
        &log,
    );
    let two = [export(&nbd, "vm1").unwrap(), export(&nbd, "vm1").unwrap()];
    assert!(
        export(&nbd, "vm1").is_err(),
        "a third connection past max_connections = 2"
    );
    drop(two);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A config file says what the flags say; a key it does not know is refused by name.
#[test]
fn a_config_file_makes_the_host() {
    let dir = temp_dir("host-config");
    let nbd = dir.join("nbd.sock");
    let config = dir.join("ztier.toml");
    std::fs::write(
        &config,
        format!(
            "[host]\nlimit = \"1G\"\nsocket = \"{}\"\n\n[[device]]\nname = \"vm1\"\nsize = \
             \"8M\"\nmem_limit = \"4M\"\n\n[[device]]\nname = \"vm2\"\nsize = 16777216\n\
             compressor = \"lz4\"\nread_only = true\n",
            nbd.display()
        ),
    )
    .unwrap();
    let log = dir.join("log");
    let server = serve(
        &["--config", config.to_str().unwrap()],
        &common::ctl_socket(&nbd),
        &log,
    );
    let list = ok(ctl(&nbd, &["devices"]));
    assert!(list.contains("vm1 size=8388608"), "{list}");
    assert!(list.contains("mem_limit=4194304"), "{list}");
    assert!(list.contains("vm2 size=16777216 compressor=lz4"), "{list}");
    let vm2 = export(&nbd, "vm2").unwrap();
    assert!(
        vm2.write_at(0, &pattern(1, 4096), false).is_err(),
        "read_only = true"
    );
    drop(vm2);
    let stat = ok(Command::new(ZTIER)
        .args(["stat", "--socket", nbd.to_str().unwrap()])
        .output()
        .unwrap());
    assert!(stat.contains("(limit 1073741824, target 0)"), "{stat}");
    server.stop();
    std::fs::write(&config, "[host]\ncolour = \"blue\"\n").unwrap();
    let o = Command::new(ZTIER)
        .args(["serve", "--config", config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("colour"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// GET http://ADDR/metrics: the body.
fn scrape(addr: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: ztier\r\n\r\n")
        .unwrap();
    let mut reply = String::new();
    conn.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(
        reply.contains("Content-Type: application/openmetrics-text"),
        "{reply}"
    );
    reply[reply.find("\r\n\r\n").unwrap() + 4..].to_string()
}

/// The metrics endpoint: parsed by Prometheus's own Python client (its OpenMetrics parser),
/// and each device's figures equal to its `mm_stat`, `io_stat` and `bd_stat` (a device with
/// pages written back and one read from its store).
#[test]
fn the_metrics_are_prometheus_s_and_agree_with_stat() {
    let python = "/usr/bin/python3";
    let has_parser = Command::new(python)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_parser {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs Prometheus's Python client (python3-prometheus-client): scripts/setup.sh"
        );
        eprintln!(
            "skipped: Prometheus's Python client is missing (Debian's python3-prometheus-client, \
             which scripts/setup.sh installs)"
        );
        return;
    }
    let dir = temp_dir("host-metrics");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "vm1,size=16M",
            "--device",
            "vm2,size=16M,compressor=lz4,mem_limit=8M",
            "--store-dir",
            dir.join("stores").to_str().unwrap(),
            "--socket",
            nbd.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let addr = server
        .log()
        .lines()
        .find_map(|l| {
            l.split("metrics at http://")
                .nth(1)
                .map(|a| a.replace("/metrics", ""))
        })
        .expect("the log says where the metrics are");
    let vm1 = export(&nbd, "vm1").unwrap();
    vm1.write_at(0, &pattern(5, 32 * 4096), false).unwrap();
    let vm2 = export(&nbd, "vm2").unwrap();
    vm2.write_at(0, &vec![0u8; 4096], false).unwrap();
    // Some of vm1's pages on its store, one of them read back from it; a read past the end
    // (refused: io_stat's invalid_io).
    ok(ctl(&nbd, &["--device", "vm1", "idle", "all"]));
    ok(ctl(&nbd, &["--device", "vm1", "writeback", "idle"]));
    let mut page = vec![0u8; 4096];
    vm1.read_at(4096, &mut page).unwrap();
    assert_eq!(page, pattern(5, 32 * 4096)[4096..8192]);
    let body = scrape(&addr);
    let doubled: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("# HELP") && l.ends_with(".."))
        .collect();
    assert!(
        doubled.is_empty(),
        "help ending in two full stops: {doubled:?}"
    );
    let parser = "import sys\nfrom prometheus_client.openmetrics.parser import \
                  text_string_to_metric_families as parse\nfor f in parse(sys.stdin.read()):\n    \
                  for s in f.samples:\n        labels = ','.join(f'{k}={v}' for k, v in \
                  sorted(s.labels.items()))\n        print(f'{s.name} {labels} {int(s.value)}')\n";
    let mut py = Command::new(python)
        .args(["-c", parser])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    py.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let parsed = py.wait_with_output().unwrap();
    assert!(
        parsed.status.success(),
        "Prometheus's parser refused it: {}\n{body}",
        text(&parsed)
    );
    let samples = String::from_utf8(parsed.stdout).unwrap();
    let sample = |name: &str, labels: &str| -> u64 {
        samples
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} {labels} ")))
            .unwrap_or_else(|| panic!("no {name} {{{labels}}} in\n{samples}"))
            .parse()
            .unwrap()
    };
    for device in ["vm1", "vm2"] {
        let labels = format!("device={device}");
        let fields = [
            (
                "mm_stat",
                &[
                    "ztier_device_orig_data_bytes",
                    "ztier_device_compr_data_bytes",
                    "ztier_device_mem_used_bytes",
                    "ztier_device_mem_limit_bytes",
                    "ztier_device_mem_used_max_bytes",
                    "ztier_device_same_pages",
                    "ztier_device_pages_compacted_total",
                    "ztier_device_huge_pages",
                    "ztier_device_huge_pages_stored_total",
                ][..],
            ),
            (
                "io_stat",
                &[
                    "ztier_device_failed_reads_total",
                    "ztier_device_failed_writes_total",
                    "ztier_device_invalid_io_total",
                    "ztier_device_notify_free_total",
                ][..],
            ),
            (
                "bd_stat",
                &[
                    "ztier_device_backing_pages",
                    "ztier_device_backing_read_pages_total",
                    "ztier_device_backing_written_pages_total",
                ][..],
            ),
        ];
        for (line, names) in fields {
            let stat = stat_line(&nbd, device, line);
            assert_eq!(stat.len(), names.len(), "{device} {line}: {stat:?}");
            for (name, value) in names.iter().zip(stat) {
                assert_eq!(sample(name, &labels), value, "{device} {name}");
            }
        }
    }
    let bd = stat_line(&nbd, "vm1", "bd_stat");
    assert!(
        bd[0] > 0 && bd[1] == 1,
        "vm1's pages on its store, one read: {bd:?}"
    );
    assert_eq!(sample("ztier_device_same_pages", "device=vm2"), 1);
    assert_eq!(sample("ztier_host_devices", ""), 2);
    assert_eq!(
        sample("ztier_frontend_requests_total", "device=vm1,front=nbd"),
        2,
        "a write and a read"
    );
    assert_eq!(
        sample("ztier_frontend_live_connections", "device=vm1,front=nbd"),
        1
    );
    drop((vm1, vm2));
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A start that fails (its metrics port taken) after the devices were made from their
/// states leaves the states as they were: the next start serves every page.
#[test]
fn a_failed_start_keeps_every_state() {
    let dir = temp_dir("host-failed-start");
    let nbd = dir.join("nbd.sock");
    let states = dir.join("states");
    let log = dir.join("log");
    let base = [
        "--state-dir",
        states.to_str().unwrap(),
        "--socket",
        nbd.to_str().unwrap(),
    ];
    let mut first = vec!["--device", "vm1,size=8M"];
    first.extend_from_slice(&base);
    let server = serve(&first, &common::ctl_socket(&nbd), &log);
    export(&nbd, "vm1")
        .unwrap()
        .write_at(0, &pattern(21, 4096), false)
        .unwrap();
    server.stop();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut failing = base.to_vec();
    failing.extend_from_slice(&["--metrics", &port]);
    let o = Command::new(ZTIER)
        .arg("serve")
        .args(&failing)
        .output()
        .unwrap();
    assert!(!o.status.success(), "the metrics port is taken");
    assert!(text(&o).contains("--metrics"), "{}", text(&o));
    drop(taken);
    let server = serve(&base, &common::ctl_socket(&nbd), &log);
    let mut back = vec![0u8; 4096];
    export(&nbd, "vm1").unwrap().read_at(0, &mut back).unwrap();
    assert!(
        back == pattern(21, 4096),
        "the state survived the failed start"
    );
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A host's `ztier stat --json` lines taken over time are drawn by `ztier plot`: a line per
/// device, the host's sum and its target.
#[test]
fn a_hosts_samples_over_time_are_drawn_by_plot() {
    let dir = temp_dir("host-plot");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &[
            "--device",
            "guest-a,size=16M",
            "--device",
            "guest-b,size=16M",
            "--store-dir",
            dir.join("stores").to_str().unwrap(),
            "--host-target",
            "64M",
            "--socket",
            nbd.to_str().unwrap(),
        ],
        &common::ctl_socket(&nbd),
        &log,
    );
    let a = export(&nbd, "guest-a").unwrap();
    let mut samples = String::new();
    for i in 0..4u64 {
        a.write_at(i * 64 * 4096, &pattern(i, 64 * 4096), false)
            .unwrap();
        samples += &ok(common::ztier()
            .args(["stat", "--json", "--socket", nbd.to_str().unwrap()])
            .output()
            .unwrap());
    }
    let times: Vec<f64> = samples
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["host"]["unix_time"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let jsonl = dir.join("host.jsonl");
    std::fs::write(&jsonl, &samples).unwrap();
    let svg = dir.join("host.svg");
    ok(common::ztier()
        .args(["plot", jsonl.to_str().unwrap(), "-o", svg.to_str().unwrap()])
        .output()
        .unwrap());
    let drawn = std::fs::read_to_string(&svg).unwrap();
    for label in [
        "guest-a",
        "guest-b",
        "the host&apos;s sum",
        "target 64.0 MiB",
    ] {
        assert!(drawn.contains(label), "no {label:?} in the picture");
    }
    drop(server);
}
