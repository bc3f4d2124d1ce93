//! `ztier serve` when what is around it fails or misbehaves: a remote backing store that
//! pauses past the timeout and resumes (nbdkit's pause filter), one restarted empty in its
//! place (refused by identity), a stop after its socket file was removed, and other users on
//! the machine (sockets 0600 whatever the umask; the control socket changes nothing for
//! them). Tools missing make a test say so and skip, except under CI.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{as_nobody, ctl, ctl_socket, have, temp_dir, text, wait_for, ztier, Proc, DEADLINE};
use ztier_blockdev::BlockDevice;
use ztier_nbd::{Client, Uri};

const PAGES: u64 = 2048;

/// nbdkit's `memory` plugin behind the pause filter, on a Unix socket.
fn nbdkit(socket: &Path, pause: &Path) -> Proc {
    let _ = std::fs::remove_file(socket);
    let _ = std::fs::remove_file(pause);
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(socket)
        .args(["--filter=pause", "memory", "64M"])
        .arg(format!("pause-control={}", pause.display()))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start nbdkit");
    wait_for(socket, "nbdkit");
    wait_for(pause, "nbdkit's pause filter");
    Proc(child)
}

/// Sends `p` or `r` to the pause filter and waits for its answer (`P` once every request
/// received before the pause has finished, `R`).
fn pause_control(pause: &Path, command: u8) {
    let mut s = UnixStream::connect(pause).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(&[command]).unwrap();
    let mut answer = [0u8];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(answer[0], command.to_ascii_uppercase());
}

/// `ztier serve` on `socket` writing back to `store`, its stderr in `log`.
fn serve(socket: &Path, store: &Path, log: &Path) -> Proc {
    let child = ztier()
        .args(["serve", "--size"])
        .arg((PAGES * 4096).to_string())
        .args(["--compressor", "lz4", "--socket"])
        .arg(socket)
        .arg("--backing-dev")
        .arg(format!("nbd+unix:///?socket={}", store.display()))
        .args(["--backing-timeout", "1s"])
        .stderr(std::fs::File::create(log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .expect("start ztier serve");
    wait_for(&ctl_socket(socket), "ztier serve");
    Proc(child)
}

/// Text-like pages, different per index.
fn page(i: u64) -> Vec<u8> {
    let mut p = ztier_base::pattern::pattern(i, 1024);
    p.extend(std::iter::repeat_n(b"served, then written back ".iter().copied(), 160).flatten());
    p.truncate(4096);
    p
}

/// A client of the server, every page written, then every page written back.
fn fill_and_write_back(socket: &Path) -> Client {
    let uri: Uri = format!("nbd+unix:///?socket={}", socket.display())
        .parse()
        .unwrap();
    let client = Client::connect(&uri).unwrap();
    for i in 0..PAGES {
        client.write_at(i * 4096, &page(i), false).unwrap();
    }
    let o = ctl(socket, &["writeback", "all"]);
    assert!(o.status.success(), "{}", text(&o));
    let bd = ctl(socket, &["bd_stat"]);
    let count: u64 = text(&bd)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(count, PAGES, "every page written back");
    client
}

fn read_all(client: &Client) -> Result<(), String> {
    let mut out = vec![0u8; 4096];
    for i in 0..PAGES {
        client
            .read_at(i * 4096, &mut out)
            .map_err(|e| format!("page {i}: {e}"))?;
        assert!(out == page(i), "page {i} read back wrong");
    }
    Ok(())
}

#[test]
fn a_store_paused_past_the_timeout_comes_back_without_a_restart() {
    if !have("nbdkit") {
        return;
    }
    let dir = temp_dir("pause");
    let (store, pause) = (dir.join("store.sock"), dir.join("pause.sock"));
    let _nbdkit = nbdkit(&store, &pause);
    let socket = dir.join("ztier.sock");
    let log = dir.join("serve.log");
    let _server = serve(&socket, &store, &log);
    // Not read back before the pause: the segment cache (4 MiB) would answer page 0 from
    // memory, as a page cache does, and the read below must go to the store.
    let client = fill_and_write_back(&socket);

    pause_control(&pause, b'p');
    // Past the 1 s timeout: the read fails (EIO), the store counts as lost.
    let mut out = vec![0u8; 4096];
    assert!(
        client.read_at(0, &mut out).is_err(),
        "a read from a paused store"
    );
    let state = text(&ctl(&socket, &["backing_dev"]));
    assert!(state.contains("lost"), "{state}");
    // The statistics answer while the store is away.
    let stat = ztier()
        .arg("stat")
        .arg("--socket")
        .arg(&socket)
        .output()
        .unwrap();
    assert!(text(&stat).contains("store nbd+unix"), "{}", text(&stat));

    pause_control(&pause, b'r');
    // No restart, no command: the next reads find the store again, every page exact.
    let start = Instant::now();
    while let Err(e) = read_all(&client) {
        assert!(start.elapsed() < DEADLINE, "the store never came back: {e}");
    }
    let state = text(&ctl(&socket, &["backing_dev"]));
    assert!(state.contains("connected"), "{state}");
    assert!(!state.contains("reconnected 0 times"), "{state}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("lost the store") && log.contains("is back"),
        "{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_store_restarted_empty_is_refused_and_its_pages_fail_with_eio() {
    if !have("nbdkit") {
        return;
    }
    let dir = temp_dir("empty-store");
    let (store, pause) = (dir.join("store.sock"), dir.join("pause.sock"));
    let nbdkit1 = nbdkit(&store, &pause);
    let socket = dir.join("ztier.sock");
    let log = dir.join("serve.log");
    let _server = serve(&socket, &store, &log);
    let client = fill_and_write_back(&socket);
    // Page 1 back in memory: it never needs the store.
    client.write_at(4096, &page(1), false).unwrap();
    drop(nbdkit1);
    // The same place, the same size, nothing in it: a store that restarted empty.
    let _nbdkit2 = nbdkit(&store, &pause);
    let mut out = vec![0u8; 4096];
    let start = Instant::now();
    loop {
        assert!(
            client.read_at(0, &mut out).is_err(),
            "read from an empty store"
        );
        let state = text(&ctl(&socket, &["backing_dev"]));
        if state.contains(": refused") {
            assert!(state.contains("identity"), "{state}");
            break;
        }
        assert!(start.elapsed() < DEADLINE, "never refused: {state}");
    }
    client.read_at(4096, &mut out).unwrap();
    assert!(out == page(1), "a page in memory is untouched");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("REFUSED"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ztier serve` on `socket` with no backing store, started through a shell with `umask`.
fn serve_plain(socket: &Path, umask: &str, extra: &str) -> Proc {
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask {umask}; exec {} serve --size 4M --socket {} {extra}",
            env!("CARGO_BIN_EXE_ztier"),
            socket.display()
        ))
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&ctl_socket(socket), "ztier serve");
    Proc(child)
}

#[test]
fn sockets_are_private_whatever_the_umask_and_others_cannot_drive_the_device() {
    if !have("setpriv") || !rustix::process::getuid().is_root() {
        ztier_corpus::cannot_test("another user's view needs root and setpriv");
        return;
    }
    let dir = temp_dir("private");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.join("ztier.sock");
    let _server = serve_plain(&socket, "000", "");
    for p in [&socket, &ctl_socket(&socket)] {
        let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{p:?}");
    }
    let s = socket.to_str().unwrap();
    let o = as_nobody(&["stat", "--socket", s]);
    assert!(!o.status.success(), "another user read the statistics");
    drop(_server);

    // Opened up on purpose: others may read, but not change.
    let socket = dir.join("open.sock");
    let _server = serve_plain(&socket, "022", "--socket-mode 0666");
    let s = socket.to_str().unwrap();
    let o = as_nobody(&["stat", "--socket", s]);
    assert!(
        o.status.success() && text(&o).contains("mm_stat"),
        "{}",
        text(&o)
    );
    let o = as_nobody(&["ctl", "--socket", s, "compact"]);
    assert!(!o.status.success(), "another user compacted the device");
    assert!(text(&o).contains("own user"), "{}", text(&o));
    // The server's own user may, with no dummy value.
    let o = ztier()
        .args(["ctl", "--socket", s, "compact"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = ztier()
        .args(["ctl", "--socket", s, "mem_limit", "1K"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_stops_the_server_after_its_socket_file_was_removed() {
    let dir = temp_dir("sigterm");
    let socket = dir.join("ztier.sock");
    let mut server = serve_plain(&socket, "077", "");
    std::fs::remove_file(&socket).unwrap();
    let start = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "SIGTERM did not stop the server"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = start.elapsed();
    assert!(status.success(), "{status}");
    // Within a second: the eventfd wakes the accept loop at once (a stop that waited for a
    // connection to its removed socket would hang until DEADLINE).
    assert!(
        took < Duration::from_secs(1),
        "SIGTERM took {took:?} to stop the server"
    );
    let mut stdout = String::new();
    server
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(
        stdout.contains("mm_stat"),
        "no statistics at the stop: {stdout:?}"
    );
    assert!(
        !ctl_socket(&socket).exists(),
        "the control socket was left behind"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn silent_control_clients_hold_up_no_one() {
    let dir = temp_dir("silent-ctl");
    let socket = dir.join("ztier.sock");
    let _server = serve_plain(&socket, "077", "");
    // Five clients connect to the control socket and say nothing (each would hold a server
    // that answers one connection at a time for its 5 s read timeout).
    let silent: Vec<UnixStream> = (0..5)
        .map(|_| UnixStream::connect(ctl_socket(&socket)).unwrap())
        .collect();
    // `ztier stat` is answered while they are all still there: long before their timeouts
    // would have run out one after another (25 s).
    let mut stat = ztier()
        .arg("stat")
        .arg("--socket")
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = stat.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ztier stat waited behind silent control clients"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    stat.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(out.contains("mm_stat"), "{out}");
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}
