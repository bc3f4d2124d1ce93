//! `ztier serve` against a hostile or flaky neighbour, as found by tests from outside: the
//! files that hold its pages are private whatever the umask, and a state another user could
//! have written is refused; one peer's stalled handshakes, clients that read no replies and
//! another user's silent control connections shut no one else out; a store that goes away
//! for less than the timeout costs latency, not errors, and one that is back is used at
//! once; a damaged copy on the store is an error, never wrong data; GNU `timeout`'s double
//! signal still saves the state; a socket file left by a killed server is cleared; a
//! connection costs one descriptor, and out of them a client is turned away, not left
//! hanging. Tools missing (or not root, for another user's view) make a test say so and
//! skip, except under CI.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{as_nobody, ctl, ctl_socket, have, temp_dir, text, wait_for, ztier, Proc, DEADLINE};
use ztier_blockdev::BlockDevice;
use ztier_nbd::proto;
use ztier_nbd::{Client, Uri};

/// Text-like pages, different per index, with a marker another user must never read.
fn page(i: u64) -> Vec<u8> {
    let mut p = format!("SECRET-MARKER-{i:08} ").into_bytes();
    p.extend(ztier_base::pattern::pattern(i, 2048));
    p.resize(4096, b'.');
    p
}

fn uri_of(socket: &Path) -> Uri {
    format!("nbd+unix:///?socket={}", socket.display())
        .parse()
        .unwrap()
}

/// `ztier serve ARGS` through a shell with `umask`, on `socket`, its stderr in `log`; waits
/// for its control socket.
fn serve(socket: &Path, umask: &str, args: &str, log: &Path) -> Proc {
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask {umask}; exec {} serve --socket {} {args}",
            env!("CARGO_BIN_EXE_ztier"),
            socket.display()
        ))
        .stderr(std::fs::File::create(log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&ctl_socket(socket), "ztier serve");
    Proc(child)
}

/// Stops a server with SIGTERM and waits for it, failing past the deadline.
fn stop(mut p: Proc) -> std::process::ExitStatus {
    let pid = rustix::process::Pid::from_child(&p.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let start = Instant::now();
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "SIGTERM did not stop the server"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn root_and(tools: &[&str]) -> bool {
    if !rustix::process::getuid().is_root() {
        ztier_corpus::cannot_test("another user's view needs root");
        return false;
    }
    tools.iter().all(|t| have(t))
}

/// Under umask 000, the state, the state a running server saved and the backing file it
/// made are 0600, and `nobody` reads none of them; a state another user could have written
/// (writable by others, or not the server's user's) is refused with the reason.
#[test]
fn files_holding_pages_are_private_and_a_state_others_could_write_is_refused() {
    if !root_and(&["setpriv"]) {
        return;
    }
    let dir = temp_dir("private-files");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (socket, state, wb, log) = (
        dir.join("s.sock"),
        dir.join("state"),
        dir.join("wb.img"),
        dir.join("serve.log"),
    );
    let args = format!(
        "--size 4M --state {} --backing-dev {}",
        state.display(),
        wb.display()
    );
    let server = serve(&socket, "000", &args, &log);
    let client = Client::connect(&uri_of(&socket)).unwrap();
    for i in 0..64 {
        client.write_at(i * 4096, &page(i), false).unwrap();
    }
    drop(client);
    assert!(ctl(&socket, &["writeback", "all"]).status.success());
    assert!(ctl(&socket, &["save"]).status.success());
    let loaded = dir.join("state.loaded");
    for p in [&loaded, &wb] {
        assert_eq!(mode(p), 0o600, "{p:?}");
        let o = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat"])
            .arg(p)
            .output()
            .unwrap();
        assert!(!o.status.success(), "nobody read {p:?}");
    }
    assert!(stop(server).success());
    assert_eq!(mode(&state), 0o600);

    // Writable by others: refused, and said why.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o666)).unwrap();
    let o = ztier()
        .args(["serve", "--socket"])
        .arg(&socket)
        .args(args.split(' '))
        .output()
        .unwrap();
    assert!(!o.status.success(), "a state others may write was loaded");
    assert!(text(&o).contains("written by other users"), "{}", text(&o));
    // Another user's: refused too.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o600)).unwrap();
    let nobody = Command::new("id").args(["-u", "nobody"]).output().unwrap();
    let nobody: u32 = String::from_utf8_lossy(&nobody.stdout)
        .trim()
        .parse()
        .unwrap();
    std::os::unix::fs::chown(&state, Some(nobody), None).unwrap();
    let o = ztier()
        .args(["serve", "--socket"])
        .arg(&socket)
        .args(args.split(' '))
        .output()
        .unwrap();
    assert!(!o.status.success(), "another user's state was loaded");
    assert!(text(&o).contains("belongs to user"), "{}", text(&o));
    // Given back, it loads, every page as written.
    std::os::unix::fs::chown(&state, Some(0), None).unwrap();
    let _server = serve(&socket, "077", &args, &log);
    let client = Client::connect(&uri_of(&socket)).unwrap();
    let mut out = vec![0u8; 4096];
    for i in 0..64 {
        client.read_at(i * 4096, &mut out).unwrap();
        assert!(out == page(i), "page {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A free TCP port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP connection to `to` from the loopback address `from`: another peer.
fn tcp_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &std::net::SocketAddrV4::new(from, 0))?;
    rustix::net::connect(&fd, &to)?;
    Ok(TcpStream::from(fd))
}

/// Raises this process's open-file limit to its hard limit (for a test that holds many
/// connections).
fn raise_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    let _ = setrlimit(Resource::Nofile, limit);
}

/// A thousand handshakes from one peer (127.0.0.2), each stalled after the greeting, do not
/// stop `nbdinfo` from another (127.0.0.1): the peer holds only its own share of the places
/// for handshakes.
#[test]
fn a_thousand_stalled_handshakes_from_one_peer_do_not_stop_another() {
    if !have("nbdinfo") {
        return;
    }
    raise_file_limit();
    let dir = temp_dir("handshakes");
    let port = free_port();
    let log = dir.join("serve.log");
    let child = ztier()
        .args(["serve", "--size", "4M", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--control")
        .arg(dir.join("ctl"))
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Proc(child);
    wait_for(&dir.join("ctl"), "ztier serve");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut stalled = Vec::new();
    for _ in 0..1000 {
        if let Ok(c) = tcp_from(Ipv4Addr::new(127, 0, 0, 2), addr) {
            stalled.push(c);
        }
    }
    let start = Instant::now();
    let o = Command::new("nbdinfo")
        .args(["--size", &format!("nbd://127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "4194304");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    drop(stalled);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raw connection through the handshake (`NBD_OPT_EXPORT_NAME`), ready for requests.
fn raw_session(socket: &Path) -> UnixStream {
    let mut c = UnixStream::connect(socket).unwrap();
    let mut greeting = [0u8; 18];
    c.read_exact(&mut greeting).unwrap();
    let mut hello = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    hello.extend(proto::IHAVEOPT.to_be_bytes());
    hello.extend(proto::OPT_EXPORT_NAME.to_be_bytes());
    hello.extend(0u32.to_be_bytes());
    c.write_all(&hello).unwrap();
    let mut export = [0u8; 10];
    c.read_exact(&mut export).unwrap();
    c
}

/// Sixteen clients that send 64 reads of 8 MiB each and read none of the replies do not
/// keep another client's 4 KiB read waiting past `--reply-timeout`: it is answered at once.
#[test]
fn clients_that_read_no_replies_do_not_delay_another_past_the_reply_timeout() {
    let dir = temp_dir("no-readers");
    let (socket, log) = (dir.join("s.sock"), dir.join("serve.log"));
    let _server = serve(
        &socket,
        "077",
        "--size 128M --max-connections 32 --reply-timeout 10s --quiet",
        &log,
    );
    let mut hogs: Vec<UnixStream> = (0..16).map(|_| raw_session(&socket)).collect();
    for h in &mut hogs {
        let mut reqs = Vec::new();
        for cookie in 0..64u64 {
            let req = proto::Request {
                flags: 0,
                kind: proto::CMD_READ,
                cookie,
                offset: (cookie % 16) << 23,
                length: 8 << 20,
            };
            reqs.extend_from_slice(&req.encode());
        }
        h.write_all(&reqs).unwrap();
    }
    std::thread::sleep(Duration::from_secs(1));
    let client = Client::connect(&uri_of(&socket)).unwrap();
    let start = Instant::now();
    let mut out = vec![0u8; 4096];
    client.read_at(64 << 20, &mut out).unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "a 4 KiB read took {took:?}");
    drop(hogs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another user holding 40 silent connections to a control socket opened to everyone
/// (`--socket-mode 0666`) does not lock the owner out of `ztier stat`.
#[test]
fn another_users_silent_control_connections_do_not_lock_out_the_owner() {
    // Debian's python3 (python3-libnbd brings it), which `nobody` may run.
    if !root_and(&["setpriv", "/usr/bin/python3"]) {
        return;
    }
    let dir = temp_dir("ctl-lockout");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (socket, log) = (dir.join("s.sock"), dir.join("serve.log"));
    let _server = serve(&socket, "022", "--size 4M --socket-mode 0666", &log);
    let hold = format!(
        "import socket, sys, time\n\
         s = [socket.socket(socket.AF_UNIX) for _ in range(40)]\n\
         [c.connect('{}') for c in s]\n\
         print('held', flush=True)\n\
         time.sleep(60)\n",
        ctl_socket(&socket).display()
    );
    let mut holder = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .args(["/usr/bin/python3", "-c"])
        .arg(hold)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 5];
    holder.stdout.take().unwrap().read_exact(&mut line).unwrap();
    assert_eq!(&line, b"held\n");
    let _holder = Proc(holder);
    // Others are told their places are taken; the owner is served.
    let o = as_nobody(&["stat", "--socket", socket.to_str().unwrap()]);
    assert!(
        text(&o).contains("too many control connections"),
        "{}",
        text(&o)
    );
    let o = ztier()
        .args(["stat", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        o.status.success() && text(&o).contains("mm_stat"),
        "{}",
        text(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// nbdkit's file plugin on `socket`, serving `file` (its contents survive a restart).
fn nbdkit_file(socket: &Path, file: &Path) -> Proc {
    let _ = std::fs::remove_file(socket);
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(socket)
        .arg("file")
        .arg(file)
        .stderr(Stdio::null())
        .spawn()
        .expect("start nbdkit");
    wait_for(socket, "nbdkit");
    Proc(child)
}

const STORE_PAGES: u64 = 1024;

/// A server writing back to nbdkit on `store` with `--backing-timeout`, every page written
/// and written back; its client.
fn served_on_store(dir: &Path, store: &Path, timeout: &str) -> (Proc, Client) {
    let socket = dir.join("s.sock");
    let args = format!(
        "--size {} --backing-dev nbd+unix:///?socket={} --backing-timeout {timeout}",
        STORE_PAGES * 4096,
        store.display()
    );
    let server = serve(&socket, "077", &args, &dir.join("serve.log"));
    let client = Client::connect(&uri_of(&socket)).unwrap();
    for i in 0..STORE_PAGES {
        client.write_at(i * 4096, &page(i), false).unwrap();
    }
    let o = ctl(&socket, &["writeback", "all"]);
    assert!(o.status.success(), "{}", text(&o));
    (server, client)
}

fn read_every_page(client: &Client) -> Result<(), String> {
    let mut out = vec![0u8; 4096];
    for i in 0..STORE_PAGES {
        client
            .read_at(i * 4096, &mut out)
            .map_err(|e| format!("page {i}: {e}"))?;
        assert!(out == page(i), "page {i} read back wrong");
    }
    Ok(())
}

/// The store away for 4 s with a 10 s timeout: reads issued while it is away wait, and
/// succeed once it is back. Away for longer than the timeout, reads fail; 1 s after it is
/// back they succeed again, the first time.
#[test]
fn a_store_outage_costs_latency_within_the_timeout_and_a_store_back_is_used_at_once() {
    if !have("nbdkit") {
        return;
    }
    let dir = temp_dir("outage");
    let (store, file) = (dir.join("store.sock"), dir.join("store.img"));
    std::fs::File::create(&file)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let nbdkit = nbdkit_file(&store, &file);
    let (_server, client) = served_on_store(&dir, &store, "10s");
    drop(nbdkit);
    let client = std::sync::Arc::new(client);
    let reader = {
        let client = std::sync::Arc::clone(&client);
        std::thread::spawn(move || read_every_page(&client))
    };
    std::thread::sleep(Duration::from_secs(4));
    let nbdkit = nbdkit_file(&store, &file);
    reader
        .join()
        .unwrap()
        .expect("reads during a 4 s outage of a 10 s timeout");

    // Longer than the timeout: reads fail meanwhile; the store back, they succeed 1 s on.
    let (dir2, store2) = (dir.join("long"), dir.join("long/store.sock"));
    std::fs::create_dir_all(&dir2).unwrap();
    drop(nbdkit);
    let nbdkit = nbdkit_file(&store2, &file);
    let (_server2, client2) = served_on_store(&dir2, &store2, "2s");
    drop(nbdkit);
    let mut out = vec![0u8; 4096];
    assert!(
        client2.read_at(0, &mut out).is_err(),
        "a read past the timeout"
    );
    std::thread::sleep(Duration::from_secs(1));
    let _nbdkit = nbdkit_file(&store2, &file);
    std::thread::sleep(Duration::from_secs(1));
    read_every_page(&client2).expect("reads 1 s after the store came back");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bit flipped in a segment of the backing file is an I/O error for the page it damaged,
/// with a line in the log and a count in `stat`: never wrong data.
#[test]
fn a_flipped_bit_in_the_store_is_an_error_and_a_log_line_never_wrong_data() {
    let dir = temp_dir("bit-flip");
    let (socket, wb, log) = (
        dir.join("s.sock"),
        dir.join("wb.img"),
        dir.join("serve.log"),
    );
    let args = format!("--size 8M --backing-dev {}", wb.display());
    let _server = serve(&socket, "077", &args, &log);
    let client = Client::connect(&uri_of(&socket)).unwrap();
    for i in 0..2048 {
        client.write_at(i * 4096, &page(i), false).unwrap();
    }
    assert!(ctl(&socket, &["writeback", "all"]).status.success());
    // One bit in each packed segment (they start with their magic), a little way in.
    let mut store = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&wb)
        .unwrap();
    let mut bytes = Vec::new();
    store.read_to_end(&mut bytes).unwrap();
    let mut flipped = 0;
    for seg in (0..bytes.len()).step_by(65536) {
        if bytes[seg..].starts_with(b"ztierPK1") {
            bytes[seg + 200] ^= 0x04;
            flipped += 1;
        }
    }
    assert!(flipped > 0);
    std::os::unix::fs::FileExt::write_all_at(&store, &bytes, 0).unwrap();
    let mut out = vec![0u8; 4096];
    let mut failed = 0;
    for i in 0..2048 {
        match client.read_at(i * 4096, &mut out) {
            Ok(()) => assert!(out == page(i), "page {i} read back wrong"),
            Err(_) => failed += 1,
        }
    }
    assert_eq!(failed, flipped, "one page a damaged segment");
    let stat = text(
        &ztier()
            .args(["stat", "--socket"])
            .arg(&socket)
            .output()
            .unwrap(),
    );
    assert!(
        stat.contains(&format!("{failed} reads failed their checksum")),
        "{stat}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("fails its checksum"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// GNU `timeout -s INT` sends its signal twice (to the server, and to its process group,
/// where the second is lost when it comes before the first is taken): the state is saved
/// all the same, and the next start loads it. Runs under `timeout` itself, and with two
/// SIGINTs 5 ms apart (the case that used to end the process without the save), each run
/// adding a page.
#[test]
fn a_double_sigint_as_timeout_sends_it_saves_the_state() {
    if !have("timeout") {
        return;
    }
    let dir = temp_dir("timeout-int");
    let (socket, state, log) = (dir.join("s.sock"), dir.join("state"), dir.join("serve.log"));
    for run in 0..4u64 {
        let under_timeout = run % 2 == 0;
        let mut cmd = if under_timeout {
            let mut c = Command::new("timeout");
            c.args(["-s", "INT", "3"]).arg(env!("CARGO_BIN_EXE_ztier"));
            c
        } else {
            ztier()
        };
        let child = cmd
            .args(["serve", "--size", "4M", "--socket"])
            .arg(&socket)
            .arg("--state")
            .arg(&state)
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = Proc(child);
        wait_for(&ctl_socket(&socket), "ztier serve");
        let client = Client::connect(&uri_of(&socket)).unwrap();
        let mut out = vec![0u8; 4096];
        for i in 0..run {
            client.read_at(i * 4096, &mut out).unwrap();
            assert!(out == page(i), "run {run}: page {i} lost");
        }
        client.write_at(run * 4096, &page(run), false).unwrap();
        drop(client);
        if !under_timeout {
            let pid = rustix::process::Pid::from_child(&child.0);
            rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
            // Taken by then (not merged with the first), and well before the server is done.
            std::thread::sleep(Duration::from_millis(5));
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let status = child.0.wait().unwrap();
        let log = std::fs::read_to_string(&log).unwrap();
        let want = if under_timeout { 124 } else { 0 };
        assert_eq!(status.code(), Some(want), "run {run}: {log}");
        assert!(log.contains("state saved"), "run {run}: {log}");
        assert!(state.exists(), "run {run}: {log}");
        assert!(!socket.exists() && !ctl_socket(&socket).exists(), "{log}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A socket file left by a server killed with SIGKILL does not stop the next start (nobody
/// answers on it: it is removed, and the log says so); one a live server answers on does.
#[test]
fn a_stale_socket_file_from_a_killed_server_is_cleared() {
    let dir = temp_dir("stale-socket");
    let (socket, log) = (dir.join("s.sock"), dir.join("serve.log"));
    let mut server = serve(&socket, "077", "--size 4M", &log);
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    assert!(socket.exists(), "SIGKILL leaves the socket file");
    // (The killed server's control socket is stale too: wait for a server to answer.)
    let _server = serve(&socket, "077", "--size 4M", &log);
    let start = Instant::now();
    while let Err(e) = Client::connect(&uri_of(&socket)) {
        assert!(
            start.elapsed() < DEADLINE,
            "never served on the same path: {e}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("removed the stale socket"), "{said}");
    let o = ztier()
        .args(["serve", "--size", "4M", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(!o.status.success(), "a second server on a live socket");
    assert!(text(&o).contains("in use"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A connection costs the server one descriptor; out of them, a client waiting to be
/// accepted is turned away at once (its handshake fails) with a line in the log, not left
/// hanging in the backlog.
#[test]
fn a_connection_costs_one_descriptor_and_a_client_past_the_limit_is_turned_away() {
    let dir = temp_dir("descriptors");
    let (socket, log) = (dir.join("s.sock"), dir.join("serve.log"));
    // Soft and hard limit 48: the server cannot raise it.
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 48; exec {} serve --socket {} --size 4M --max-connections 200",
            env!("CARGO_BIN_EXE_ztier"),
            socket.display()
        ))
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _server = Proc(child);
    wait_for(&ctl_socket(&socket), "ztier serve");
    let before = open_descriptors(pid);
    let few: Vec<Client> = (0..4)
        .map(|_| Client::connect(&uri_of(&socket)).unwrap())
        .collect();
    assert_eq!(
        open_descriptors(pid) - before,
        4,
        "one descriptor a connection"
    );
    let (mut connected, mut refused) = (few, 0);
    for _ in 0..60 {
        let start = Instant::now();
        match Client::connect(&uri_of(&socket)) {
            Ok(c) => connected.push(c),
            Err(_) => refused += 1,
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "a client left hanging"
        );
    }
    assert!(
        refused > 0,
        "{} connected under a limit of 48",
        connected.len()
    );
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("out of file descriptors"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
