//! `ztier serve` run the way NBD servers are run: captive (`--run`), under systemd socket
//! activation and readiness notification, tied to its parent (`--exit-with-parent`), with a
//! pid file. Tools missing make a test say so and skip, except under CI.

mod common;

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{have, temp_dir};

/// Far past anything a working server takes; only a broken one reaches it.
const DEADLINE: Duration = Duration::from_secs(30);
const ZTIER: &str = env!("CARGO_BIN_EXE_ztier");

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < DEADLINE, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server the test started, killed if the test ends before it stops it (a failed
/// assertion must not leave it running).
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Whether process `pid` has ended (gone, or a zombie no one has reaped yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

#[test]
fn captive_mode_runs_the_command_against_the_server_and_exits_with_its_status() {
    if !have("nbdinfo") {
        return;
    }
    let o = Command::new(ZTIER)
        .args(["serve", "--size", "4M", "--export-name", "disk", "--run"])
        .arg(r#"nbdinfo --size "$uri"; echo "export=$exportname"; exit 7"#)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(7), "{out}");
    assert_eq!(
        out, "4194304\nexport=disk\n",
        "stdout is the command's alone"
    );
    // The private socket and its directory are gone.
    let err = String::from_utf8_lossy(&o.stderr);
    let socket = err
        .split("socket=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the log names the socket");
    assert!(!Path::new(socket).exists(), "{socket} left behind");
    assert!(!Path::new(socket).parent().unwrap().exists());
}

#[test]
fn socket_activation_serves_the_socket_it_was_handed() {
    if !have("systemd-socket-activate") || !have("nbdinfo") {
        return;
    }
    let dir = temp_dir("activate");
    let socket = dir.join("activated.sock");
    let mut activator = Command::new("systemd-socket-activate")
        .arg("-l")
        .arg(&socket)
        .args([ZTIER, "serve", "--size", "8M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("systemd-socket-activate never listened", || socket.exists());
    // The first connection starts ztier, which must serve it on the socket it was handed.
    let o = Command::new("nbdinfo")
        .arg("--size")
        .arg(format!("nbd+unix:///?socket={}", socket.display()))
        .output()
        .unwrap();
    let _ = activator.kill();
    let _ = activator.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "8388608");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One datagram from the server (a signal may interrupt the wait: it goes on).
fn recv(socket: &UnixDatagram, buf: &mut [u8], what: &str) -> usize {
    loop {
        match socket.recv(buf) {
            Ok(n) => return n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("no {what} from the server: {e}"),
        }
    }
}

#[test]
fn ready_is_sent_only_once_a_client_can_connect() {
    let dir = temp_dir("notify");
    let notify = dir.join("notify.sock");
    let receiver = UnixDatagram::bind(&notify).unwrap();
    receiver.set_read_timeout(Some(DEADLINE)).unwrap();
    let socket = dir.join("ztier.sock");
    let pidfile = dir.join("ztier.pid");
    let mut server = Started(
        Command::new(ZTIER)
            .args(["serve", "--size", "4M", "--socket"])
            .arg(&socket)
            .arg("--pidfile")
            .arg(&pidfile)
            .env("NOTIFY_SOCKET", &notify)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut buf = [0u8; 4096];
    let n = recv(&receiver, &mut buf, "READY=1");
    let message = String::from_utf8_lossy(&buf[..n]).into_owned();
    // At the moment READY=1 arrives, a client connects and is greeted.
    let mut c = UnixStream::connect(&socket).expect("READY=1 before the socket accepts");
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut greeting = [0u8; 18];
    std::io::Read::read_exact(&mut c, &mut greeting).unwrap();
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    assert!(message.lines().any(|l| l == "READY=1"), "{message}");
    assert!(
        message.contains("STATUS=serving 4194304 bytes"),
        "{message}"
    );
    // The pid file holds the server's pid.
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    assert_eq!(pid.trim(), server.0.id().to_string());
    drop(c);
    // Its stop is announced too.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let n = recv(&receiver, &mut buf, "STOPPING=1");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(server.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exit_with_parent_ends_with_its_parent() {
    let dir = temp_dir("parent");
    let socket = dir.join("ztier.sock");
    let pidfile = dir.join("ztier.pid");
    // A shell is the server's parent; the server runs in its background.
    let mut parent = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{ZTIER} serve --size 4M --exit-with-parent --socket {} --pidfile {} \
             >/dev/null 2>&1 & wait",
            socket.display(),
            pidfile.display()
        ))
        .spawn()
        .unwrap();
    wait_until("the server never wrote its pid file", || {
        std::fs::read_to_string(&pidfile).is_ok_and(|p| p.ends_with('\n'))
    });
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // Killed at the end whatever happens, if it is still there.
    struct KillAtEnd(u32);
    impl Drop for KillAtEnd {
        fn drop(&mut self) {
            if let Some(pid) = rustix::process::Pid::from_raw(self.0 as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
    let _cleanup = KillAtEnd(pid);
    assert!(!ended(pid));
    parent.kill().unwrap();
    parent.wait().unwrap();
    wait_until("the server outlived its parent", || ended(pid));
    wait_until("the server left its socket behind", || !socket.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ztier serve --state PATH`, on a disk of `size` bytes, with more flags; its stderr in `log`.
fn serve_with_state(
    socket: &Path,
    state: &Path,
    size: &str,
    extra: &[&str],
    log: &Path,
) -> Started {
    let server = Started(
        Command::new(ZTIER)
            .args(["serve", "--size", size, "--compressor", "lz4", "--socket"])
            .arg(socket)
            .arg("--state")
            .arg(state)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut ctl = socket.as_os_str().to_owned();
    ctl.push(".ctl");
    let ctl = std::path::PathBuf::from(ctl);
    wait_until("ztier serve never made its control socket", || ctl.exists());
    server
}

fn stop(mut server: Started) {
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(server.0.wait().unwrap().success());
}

fn nbdcopy(from: &str, to: &str) {
    let o = Command::new("nbdcopy").args([from, to]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn ctl(socket: &Path, words: &[&str]) -> String {
    let o = Command::new(ZTIER)
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(words)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn a_restart_from_its_state_serves_every_byte_it_served() {
    if !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("state");
    // Real memory: the bundled sample, as a disk image.
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    let corpus = ztier_corpus::Corpus::load(&sample).unwrap();
    let image = dir.join("image");
    std::fs::write(&image, corpus.bytes()).unwrap();
    let size = (corpus.bytes().len() + (1 << 20)).to_string();
    let (socket, state, log) = (dir.join("s.sock"), dir.join("state"), dir.join("log"));
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let backing = dir.join("backing");

    // Every byte the disk serves, read back by nbdcopy: the corpus, then zeros.
    let reads_back_exact = |when: &str| {
        let back = dir.join("back");
        nbdcopy(&uri, back.to_str().unwrap());
        let back = std::fs::read(&back).unwrap();
        assert!(
            back[..corpus.bytes().len()] == *corpus.bytes(),
            "the disk restarted {when} differs"
        );
        assert!(
            back[corpus.bytes().len()..].iter().all(|&b| b == 0),
            "the disk restarted {when} has bytes past the corpus"
        );
    };

    // Filled, stopped with every page in memory (its state saved), started again from it:
    // every byte as before.
    let store_flags = ["--backing-dev", backing.to_str().unwrap()];
    let server = serve_with_state(&socket, &state, &size, &store_flags, &log);
    nbdcopy(image.to_str().unwrap(), &uri);
    stop(server);
    assert!(state.exists(), "no state saved at the stop");
    let server = serve_with_state(&socket, &state, &size, &store_flags, &log);
    reads_back_exact("with every page in memory");

    // Its state saved while every page is in memory (the reference for its size), then
    // every page but the first 1000 written back to a file, and stopped: the state is
    // saved again. Saved while serving goes on: consumed already (the writes after it
    // would make it stale), so it is STATE.loaded.
    assert!(ctl(&socket, &["save"]).contains("state saved"));
    assert!(!state.exists());
    let in_memory = std::fs::metadata(dir.join("state.loaded")).unwrap().len();
    ctl(&socket, &["idle", "all"]);
    let last = corpus.bytes().len() / 4096 - 1;
    let range = format!("page_indexes=1000-{last}");
    assert!(ctl(&socket, &["writeback", &range]).contains("written back"));
    let bd_count = |socket: &Path| -> u64 {
        ctl(socket, &["bd_stat"])
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let on_store = bd_count(&socket);
    assert!(on_store > 1000, "{on_store} pages written back");
    stop(server);
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("state saved"));
    assert!(
        !dir.join("state.loaded").exists(),
        "a clean stop removes it"
    );
    // The written-back pages' bytes stayed on the store: the state names their places.
    let with_store = std::fs::metadata(&state).unwrap().len();
    assert!(
        with_store * 2 < in_memory,
        "a state of {with_store} bytes, against {in_memory} with every page in it"
    );

    // Started again from it, with the same store: every byte as before, the written-back
    // pages still on the store.
    let server = serve_with_state(&socket, &state, &size, &store_flags, &log);
    assert_eq!(
        bd_count(&socket),
        on_store,
        "the pages are still on the store"
    );
    reads_back_exact("with pages written back");
    assert_eq!(bd_count(&socket), on_store);
    // `ctl save` while it runs writes the same state again.
    assert!(ctl(&socket, &["save"]).contains("state saved"));
    stop(server);

    // Refused with the reason: the store missing, another store, a store of another size.
    let refused_store = |store: &Path, why: &str| {
        let o = Command::new(ZTIER)
            .args(["serve", "--size", &size, "--compressor", "lz4", "--socket"])
            .arg(dir.join("refused.sock"))
            .arg("--state")
            .arg(&state)
            .arg("--backing-dev")
            .arg(store)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "served with a bad store ({why})");
        assert!(err.contains(why), "{err}");
    };
    refused_store(&dir.join("no-such-store"), "is missing");
    let other = dir.join("other-store");
    std::fs::copy(&backing, &other).unwrap();
    let mut header = std::fs::read(&other).unwrap();
    header[1036] ^= 0xff; // its id (sws_uuid)
    std::fs::write(&other, &header).unwrap();
    refused_store(&other, "not the one its pages were written back to");
    header.truncate(header.len() / 2);
    std::fs::write(&other, &header).unwrap();
    refused_store(&other, "different store layout");
    let _ = std::fs::remove_file(&other);

    // A state that does not fit is refused, and says why; none is served as zeros.
    let refused = |state: &Path, size: &str, compressor: &str, why: &str| {
        let o = Command::new(ZTIER)
            .args([
                "serve",
                "--size",
                size,
                "--compressor",
                compressor,
                "--socket",
            ])
            .arg(dir.join("refused.sock"))
            .arg("--state")
            .arg(state)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "served a bad state ({why})");
        assert!(err.contains(why), "{err}");
    };
    refused(&state, "64M", "lz4", "the device has");
    refused(&state, &size, "lzo-rle", "compressed with lz4");
    let bytes = std::fs::read(&state).unwrap();
    let truncated = dir.join("truncated");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    refused(&truncated, &size, "lz4", "truncated");
    let mut damaged = bytes.clone();
    // A byte of the units' list at its end, before the checksum: no check but the
    // checksum sees it before the units are looked at.
    let last = damaged.len() - 13;
    damaged[last] ^= 0x40;
    let corrupt = dir.join("corrupt");
    std::fs::write(&corrupt, &damaged).unwrap();
    refused(&corrupt, &size, "lz4", "damaged");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that dies (kill -9) after taking writes leaves no state that would serve the
/// pages from before them: the state it loaded was consumed, and the next start is refused,
/// naming it, until it is moved away.
#[test]
fn a_server_that_did_not_stop_cleanly_is_never_restarted_from_a_stale_state() {
    if !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("state-consumed");
    let (socket, state, log) = (dir.join("s.sock"), dir.join("state"), dir.join("log"));
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let (a, b) = (dir.join("a"), dir.join("b"));
    std::fs::write(&a, vec![0xaa; 1 << 20]).unwrap();
    std::fs::write(&b, vec![0xbb; 1 << 20]).unwrap();
    // Image A, saved at a clean stop.
    let server = serve_with_state(&socket, &state, "1M", &[], &log);
    nbdcopy(a.to_str().unwrap(), &uri);
    stop(server);
    assert!(state.exists());
    // Started from it, image B written (acknowledged), then killed.
    let mut server = serve_with_state(&socket, &state, "1M", &[], &log);
    nbdcopy(b.to_str().unwrap(), &uri);
    server.0.kill().unwrap();
    server.0.wait().unwrap();
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(dir.join("s.sock.ctl"));
    // Never A served again as if B had not been written.
    let o = Command::new(ZTIER)
        .args(["serve", "--size", "1M", "--compressor", "lz4", "--socket"])
        .arg(&socket)
        .arg("--state")
        .arg(&state)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "served a stale state: {err}");
    assert!(
        err.contains("did not stop cleanly")
            && err.contains(&format!("{}.loaded", state.display())),
        "{err}"
    );
    // Moved away: an empty start.
    std::fs::rename(dir.join("state.loaded"), dir.join("moved")).unwrap();
    let server = serve_with_state(&socket, &state, "1M", &[], &log);
    stop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A state path the server cannot write is refused at start, before a page is taken; a
/// final save that fails still prints the statistics, and says the pages are lost.
#[test]
fn an_unwritable_state_is_found_at_start_and_a_failed_save_still_reports() {
    let dir = temp_dir("state-unwritable");
    let o = Command::new(ZTIER)
        .args(["serve", "--size", "1M", "--socket"])
        .arg(dir.join("s.sock"))
        .args(["--state", "/proc/ztier.state", "--run", "exit 0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "started with an unwritable state: {err}"
    );
    assert!(err.contains("/proc/ztier.state"), "{err}");
    assert!(
        !err.contains("ztier serve: 1048576 bytes"),
        "it served: {err}"
    );

    // Its directory gone while it serves: the save at stop fails.
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let (socket, log) = (dir.join("t.sock"), dir.join("log"));
    let server = Started(
        Command::new(ZTIER)
            .args(["serve", "--size", "1M", "--socket"])
            .arg(&socket)
            .arg("--state")
            .arg(sub.join("state"))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until("ztier serve never made its control socket", || {
        dir.join("t.sock.ctl").exists()
    });
    std::fs::remove_dir_all(&sub).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&server.0),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let mut server = server;
    let mut out = String::new();
    use std::io::Read;
    server
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(!server.0.wait().unwrap().success());
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(err.contains("pages are lost"), "{err}");
    assert!(out.contains("mm_stat"), "no statistics: {out}");
    let _ = std::fs::remove_dir_all(&dir);
}
