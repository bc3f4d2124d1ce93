//! `ztier serve --vhost-user-blk`: the device a VMM attaches as a virtio-blk disk, served
//! alone or beside NBD (the same device: what one writes the other reads), with the
//! service's ways: statistics, a private socket, `--state` across a restart the guest does
//! not see, `--run`, and socket activation. The VMM and its guest's driver are played by
//! the test (ztier-vhost's `testing`).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{have, serve, temp_dir, wait_for};
use virtio_bindings_consts::*;
use ztier_blockdev::testing::pattern;
use ztier_blockdev::BlockDevice;
use ztier_vhost::testing::{Guest, Options};

/// virtio-blk's request types and statuses (the spec's numbers).
mod virtio_bindings_consts {
    pub const T_IN: u32 = 0;
    pub const T_OUT: u32 = 1;
    pub const T_DISCARD: u32 = 11;
    pub const S_OK: u8 = 0;
}

const ZTIER: &str = env!("CARGO_BIN_EXE_ztier");

fn ctl_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

fn stat(socket: &Path) -> String {
    let o = Command::new(ZTIER)
        .arg("stat")
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Alone, the vhost-user-blk socket is the only front end: private (0600), with a control
/// socket beside it; no NBD port is opened. The guest's writes, reads and discards reach
/// zram (mm_stat says so), and the statistics count them.
#[test]
fn alone_it_serves_zram_to_a_guest_with_statistics() {
    let dir = temp_dir("vhost-alone");
    let sock = dir.join("vhost.sock");
    let log = dir.join("log");
    let server = serve(
        &["--size", "16M", "--vhost-user-blk", sock.to_str().unwrap()],
        &ctl_path(&sock),
        &log,
    );
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let guest = Guest::connect(&sock, Options::default());
    assert_eq!(guest.capacity(), 16 << 20);
    let data: Vec<u8> = (0..64).flat_map(|i| pattern(i, 4096)).collect();
    assert_eq!(guest.request(0, T_OUT, 0, &data, 0).0, S_OK);
    let (st, back) = guest.request(0, T_IN, 0, &[], data.len());
    assert_eq!(st, S_OK);
    assert!(back == data);
    let mm: Vec<u64> = stat(&sock)
        .lines()
        .find_map(|l| l.strip_prefix("mm_stat "))
        .unwrap()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(mm[0], 64 * 4096, "orig_data_size: the guest's 64 pages");
    // The guest's swap frees 32 of them.
    let seg = {
        let mut s = [0u8; 16];
        s[8..12].copy_from_slice(&(32u32 * 8).to_le_bytes());
        s
    };
    assert_eq!(guest.request(0, T_DISCARD, 0, &seg, 0).0, S_OK);
    let text = stat(&sock);
    let mm: Vec<u64> = text
        .lines()
        .find_map(|l| l.strip_prefix("mm_stat "))
        .unwrap()
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(mm[0], 32 * 4096, "the discarded pages left zram");
    assert!(
        text.contains("vhost-user-blk 1 connections (0 ended by a protocol error), 3 requests"),
        "{text}"
    );
    assert!(!text.contains("\nserver "), "no NBD server: {text}");
    drop(guest);
    server.stop();
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains(&format!("vhost-user-blk at {}", sock.display())),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Beside NBD, it is the same device: a page written by the guest is read over NBD, and
/// one written over NBD is read by the guest.
#[test]
fn beside_nbd_it_is_the_same_device() {
    let dir = temp_dir("vhost-nbd");
    let sock = dir.join("vhost.sock");
    let nbd = dir.join("nbd.sock");
    let log = dir.join("log");
    let server = serve(
        &[
            "--size",
            "8M",
            "--socket",
            nbd.to_str().unwrap(),
            "--vhost-user-blk",
            sock.to_str().unwrap(),
        ],
        &ctl_path(&nbd),
        &log,
    );
    wait_for(&sock, "the vhost-user-blk socket");
    let guest = Guest::connect(&sock, Options::default());
    assert_eq!(guest.request(0, T_OUT, 16, &pattern(7, 4096), 0).0, S_OK);
    let uri: ztier_nbd::Uri = format!("nbd+unix:///?socket={}", nbd.display())
        .parse()
        .unwrap();
    let client = ztier_nbd::Client::connect(&uri).unwrap();
    let mut back = vec![0u8; 4096];
    client.read_at(16 * 512, &mut back).unwrap();
    assert!(back == pattern(7, 4096), "NBD reads what the guest wrote");
    client.write_at(64 * 512, &pattern(8, 4096), false).unwrap();
    let (st, got) = guest.request(0, T_IN, 64, &[], 4096);
    assert_eq!(st, S_OK);
    assert!(got == pattern(8, 4096), "the guest reads what NBD wrote");
    let text = stat(&nbd);
    assert!(text.contains("\nserver 1 connections"), "{text}");
    assert!(text.contains("vhost-user-blk 1 connections"), "{text}");
    drop(client);
    drop(guest);
    let out = server.stop();
    assert!(out.contains("vhost-user-blk 1 connections"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Stopped (SIGTERM) and started again from `--state` under an attached guest: the guest
/// reconnects (as QEMU's reconnect-ms does), its disk is as it left it, and a request it
/// posted while the server was down runs on the new one.
#[test]
fn a_restart_from_its_state_is_invisible_to_the_guest() {
    let dir = temp_dir("vhost-state");
    let sock = dir.join("vhost.sock");
    let state = dir.join("state");
    let log = dir.join("log");
    let args = [
        "--size",
        "32M",
        "--compressor",
        "lz4",
        "--vhost-user-blk",
        sock.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
    ];
    let server = serve(&args, &ctl_path(&sock), &log);
    let guest = Guest::connect(&sock, Options::default());
    let data: Vec<u8> = (0..1024).flat_map(|i| pattern(i, 4096)).collect();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        assert_eq!(guest.request(0, T_OUT, (i as u64) << 11, chunk, 0).0, S_OK);
    }
    server.stop();
    assert!(state.exists(), "the state was saved");
    // While it is down, the guest posts a write.
    guest.post_request(0, 0, T_OUT, 8192 * 2, &pattern(5000, 4096), 0);
    let log2 = dir.join("log2");
    let again = serve(&args, &ctl_path(&sock), &log2);
    guest.reconnect(&sock).unwrap();
    let used = guest.wait_used(0, 1);
    assert_eq!(used[0].len, 1);
    assert_eq!(guest.slot_status(0, 0), S_OK);
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        let (st, back) = guest.request(0, T_IN, (i as u64) << 11, &[], chunk.len());
        assert_eq!(st, S_OK);
        assert!(back == chunk, "MiB {i} as the guest left it");
    }
    let (st, back) = guest.request(0, T_IN, 8192 * 2, &[], 4096);
    assert_eq!(st, S_OK);
    assert!(back == pattern(5000, 4096));
    drop(guest);
    again.stop();
    let log2 = std::fs::read_to_string(&log2).unwrap();
    assert!(log2.contains("state loaded"), "{log2}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--run` with only vhost-user-blk: the command finds the socket in $vhost_user_blk (and
/// no $uri: there is no NBD server), and the server lives as long as it.
#[test]
fn captive_mode_names_the_vhost_user_socket() {
    let dir = temp_dir("vhost-run");
    let sock = dir.join("vhost.sock");
    let o = Command::new(ZTIER)
        .args(["serve", "--size", "4M", "--vhost-user-blk"])
        .arg(&sock)
        .arg("--run")
        .arg(r#"test -S "$vhost_user_blk" && test -z "$uri" && echo "at $vhost_user_blk"; exit 3"#)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains(&format!("at {}", sock.display())), "{out}");
    assert!(!sock.exists(), "the socket is removed at the end");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under socket activation `--vhost-user-blk -` serves the socket handed over.
#[test]
fn socket_activation_hands_over_the_vhost_user_socket() {
    if !have("systemd-socket-activate") {
        return;
    }
    let dir = temp_dir("vhost-activate");
    let sock = dir.join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&sock)
        .args([ZTIER, "serve", "--size", "8M", "--vhost-user-blk", "-"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock, "systemd-socket-activate's socket");
    let guest = Guest::connect(&sock, Options::default());
    assert_eq!(guest.capacity(), 8 << 20);
    assert_eq!(guest.request(0, T_OUT, 0, &pattern(1, 4096), 0).0, S_OK);
    let _ = activator.kill();
    let _ = activator.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flags that cannot work are refused in a line before anything is served.
#[test]
fn vhost_without_a_handed_socket_is_refused() {
    let o = Command::new(ZTIER)
        .args(["serve", "--size", "4M", "--vhost-user-blk", "-"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("takes the socket systemd hands over"), "{err}");
}
