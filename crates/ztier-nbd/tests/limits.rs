//! The server against neighbours that misbehave: clients that stop mid-handshake, more of
//! them than connections allowed, and a stop after the socket's path was removed.
//!
//! Nothing here is timed: each test waits on the state it names (a connection served, a
//! socket closed, the accept loop ended), with a deadline only so a broken server fails the
//! test instead of hanging it.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::client::Client;
use ztier_nbd::proto;
use ztier_nbd::{Listener, Server, ServerConfig};

/// Far past any scheduling delay; only a server that never does the thing reaches it.
const DEADLINE: Duration = Duration::from_secs(20);

struct Served {
    server: Arc<Server>,
    path: PathBuf,
    ended: mpsc::Receiver<std::io::Result<()>>,
}

fn serve(name: &str, config: ServerConfig) -> Served {
    serve_device(name, config, 1 << 20)
}

fn serve_device(name: &str, config: ServerConfig, size: u64) -> Served {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(size).unwrap());
    let server = Server::new(dev, config);
    let s = Arc::clone(&server);
    let (tx, ended) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(s.serve(Listener::Unix(listener)));
    });
    Served {
        server,
        path,
        ended,
    }
}

impl Served {
    fn uri(&self) -> ztier_nbd::Uri {
        format!("nbd+unix:///?socket={}", self.path.display())
            .parse()
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.stop();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A connection that takes the greeting and then says nothing: a handshake left half open.
fn half_open(path: &PathBuf) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    let mut greeting = [0u8; 18];
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.read_exact(&mut greeting).unwrap();
    s
}

/// Waits until the server closes `s` (end of file or a reset).
fn closed_by_server(s: &mut UnixStream) -> bool {
    closed_within(s, DEADLINE)
}

/// Waits up to `limit` for the server to close `s`.
fn closed_within(s: &mut UnixStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) if e.kind() == ErrorKind::ConnectionReset => true,
        _ => false,
    }
}

#[test]
fn half_open_handshakes_do_not_shut_out_a_good_client() {
    let s = serve(
        "half-open",
        ServerConfig {
            max_connections: 16,
            handshake_limit: Duration::from_secs(2),
            // One peer here (this user): its own limit past the stalled handshakes.
            max_handshakes_per_peer: 128,
            ..ServerConfig::default()
        },
    );
    let mut stalled: Vec<UnixStream> = (0..64).map(|_| half_open(&s.path)).collect();
    // 64 handshakes under way, four times the connections allowed: a good client still gets
    // in, long before any of them times out.
    let client = Client::connect(&s.uri()).expect("a good client beside 64 half-open ones");
    client.write_at(0, &[3u8; 4096], false).unwrap();
    let mut back = [0u8; 4096];
    client.read_at(0, &mut back).unwrap();
    assert_eq!(back, [3u8; 4096]);
    // Each stalled handshake is closed by the server at its deadline.
    for (i, c) in stalled.iter_mut().enumerate() {
        assert!(closed_by_server(c), "half-open connection {i} still open");
    }
    let failed = s
        .server
        .stats()
        .failed_handshakes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(failed, 64);
    // The good client was never disturbed.
    client.read_at(0, &mut back).unwrap();
}

#[test]
fn a_handshake_that_trickles_is_held_to_its_whole_deadline() {
    let s = serve(
        "trickle",
        ServerConfig {
            handshake_limit: Duration::from_millis(500),
            ..ServerConfig::default()
        },
    );
    let mut c = half_open(&s.path);
    // A valid start (fixed newstyle), so the server goes on reading; then an option whose
    // data is long, one byte every 50 ms: each read is well inside a per-read timeout of
    // 500 ms, so only a limit on the whole handshake ends it.
    c.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    let mut option = Vec::new();
    option.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&proto::OPT_INFO.to_be_bytes());
    option.extend_from_slice(&4096u32.to_be_bytes());
    option.resize(16 + 4096, b'x');
    let whole = option.len();
    let (tx, done) = mpsc::channel();
    let mut writer = c.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut sent = 0;
        while sent < option.len() && writer.write_all(&option[sent..sent + 1]).is_ok() {
            sent += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = tx.send(sent);
    });
    let started = Instant::now();
    // The deadline is 0.5 s; 3 s is far past it, and far short of the trickle's 200 s.
    assert!(
        closed_within(&mut c, Duration::from_secs(3)),
        "a trickling handshake was not ended within 3 s of a 0.5 s limit"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "the handshake was ended before its limit: the start was refused, not the trickle"
    );
    let sent = done.recv_timeout(DEADLINE).expect("the trickler stopped");
    assert!(sent < whole, "the server kept reading a trickle");
}

#[test]
fn stop_ends_the_server_after_its_socket_path_was_removed() {
    let s = serve("removed", ServerConfig::default());
    let _client = Client::connect(&s.uri()).unwrap();
    std::fs::remove_file(&s.path).unwrap();
    s.server.stop();
    let ended = s
        .ended
        .recv_timeout(DEADLINE)
        .expect("the accept loop did not end after stop");
    ended.unwrap();
}

#[test]
fn stop_ends_handshakes_under_way_at_once() {
    let s = serve(
        "stop-handshake",
        ServerConfig {
            // Far longer than the test's deadline: only a stop that ends the handshake
            // itself lets the server finish in time.
            handshake_limit: Duration::from_secs(3600),
            ..ServerConfig::default()
        },
    );
    let mut stalled = half_open(&s.path);
    s.server.stop();
    s.ended
        .recv_timeout(DEADLINE)
        .expect("the server waited for a handshake's deadline to stop")
        .unwrap();
    assert!(closed_by_server(&mut stalled));
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all this
/// machine's): another peer, as the server counts peers, from the same process.
fn tcp_from(from: std::net::Ipv4Addr, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketType};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &std::net::SocketAddrV4::new(from, 0))?;
    rustix::net::connect(&fd, &to)?;
    Ok(TcpStream::from(fd))
}

/// One peer that stalls a thousand handshakes holds only its own share of the places for
/// handshakes: the rest of them are closed at once, and another peer's client gets in at
/// once, long before any stalled handshake reaches its deadline.
#[test]
fn one_peers_stalled_handshakes_do_not_shut_out_another_peer() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let server = Server::new(
        dev,
        ServerConfig {
            handshake_limit: Duration::from_secs(3600),
            max_handshakes: 256,
            max_handshakes_per_peer: 16,
            ..ServerConfig::default()
        },
    );
    let s = Arc::clone(&server);
    let serving = std::thread::spawn(move || s.serve(Listener::Tcp(listener)));
    // A thousand handshakes from 127.0.0.2, each left after the greeting (or closed by the
    // server at once, past its share).
    let hostile = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let mut held = Vec::new();
    let mut closed = 0;
    for _ in 0..1000 {
        let mut c = tcp_from(hostile, addr).unwrap();
        c.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut greeting = [0u8; 18];
        match c.read_exact(&mut greeting) {
            Ok(()) => held.push(c),
            Err(_) => closed += 1,
        }
    }
    assert_eq!(held.len(), 16, "the hostile peer holds only its share");
    assert_eq!(closed, 1000 - 16);
    // Another peer (127.0.0.1) gets in and is served.
    let uri: ztier_nbd::Uri = format!("nbd://{addr}/").parse().unwrap();
    let client = Client::connect(&uri).expect("another peer's client is served");
    client.write_at(0, &[5u8; 4096], false).unwrap();
    let mut back = [0u8; 4096];
    client.read_at(0, &mut back).unwrap();
    assert_eq!(back, [5u8; 4096]);
    drop(client);
    server.stop();
    serving.join().unwrap().unwrap();
}

/// A raw connection through the handshake (`NBD_OPT_EXPORT_NAME`), ready for requests.
fn raw_session(path: &PathBuf) -> UnixStream {
    let mut c = half_open(path);
    c.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut option = Vec::new();
    option.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    option.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
    option.extend_from_slice(&0u32.to_be_bytes());
    c.write_all(&option).unwrap();
    let mut reply = [0u8; 10];
    c.read_exact(&mut reply).unwrap();
    c
}

/// Sixteen clients that send reads and never read the replies hold what they can of the
/// server's in-flight budget until they are cut off (`reply_timeout`); another client's
/// small read is answered at once all the same, from its connection's own reserve.
#[test]
fn clients_that_read_no_replies_delay_no_one_elses_read() {
    let s = serve_device(
        "no-readers",
        ServerConfig {
            max_connections: 32,
            max_in_flight_total: 256 << 20,
            reply_timeout: Duration::from_secs(3600),
            ..ServerConfig::default()
        },
        64 << 20,
    );
    // Each sends 64 reads of 8 MiB: its four threads each hold one read's reply, unsent,
    // 512 MiB wanted in all, twice the whole budget.
    let mut hogs: Vec<UnixStream> = (0..16).map(|_| raw_session(&s.path)).collect();
    for h in &mut hogs {
        let mut reqs = Vec::new();
        for cookie in 0..64u64 {
            let req = proto::Request {
                flags: 0,
                kind: proto::CMD_READ,
                cookie,
                offset: 0,
                length: 8 << 20,
            };
            reqs.extend_from_slice(&req.encode());
        }
        h.write_all(&reqs).unwrap();
    }
    // Until the hogs hold the budget's shared part (or all they can): in flight and stuck.
    let deadline = Instant::now() + DEADLINE;
    let mut last = 0;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = s
            .server
            .stats()
            .in_flight_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        if now > 0 && now == last {
            break;
        }
        last = now;
        assert!(Instant::now() < deadline, "the hogs' reads never piled up");
    }
    let client = Client::connect(&s.uri()).unwrap();
    let started = Instant::now();
    let mut back = [0u8; 4096];
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(client.read_at(0, &mut back).map(|()| back));
    });
    let got = finished
        .recv_timeout(Duration::from_secs(5))
        .expect("a small read waited behind clients that read no replies");
    got.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(hogs);
}

/// A client that reads its reply a trickle at a time (often enough that no single wait for
/// room in its socket outlasts the send timeout) is cut off once the reply has taken longer
/// than `reply_timeout`, as one that reads nothing is: what was in the socket's buffers
/// reaches it, then the end.
#[test]
fn a_client_that_reads_a_reply_by_the_trickle_is_cut_off() {
    let s = serve_device(
        "trickle-reader",
        ServerConfig {
            reply_timeout: Duration::from_secs(1),
            max_payload: 64 << 20,
            max_in_flight_bytes: 128 << 20,
            max_in_flight_total: 512 << 20,
            ..ServerConfig::default()
        },
        64 << 20,
    );
    let mut c = raw_session(&s.path);
    let req = proto::Request {
        flags: 0,
        kind: proto::CMD_READ,
        cookie: 1,
        offset: 0,
        length: 64 << 20,
    };
    c.write_all(&req.encode()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let started = Instant::now();
    // 16 KiB every 10 ms: the 64 MiB reply would take 40 s.
    let mut chunk = vec![0u8; 16 << 10];
    let mut got = 0usize;
    let cut = loop {
        match c.read(&mut chunk) {
            Ok(0) | Err(_) => break started.elapsed(),
            Ok(n) => got += n,
        }
        std::thread::sleep(Duration::from_millis(10));
        assert!(
            started.elapsed() < DEADLINE,
            "a trickling reader was never cut off"
        );
    };
    assert!(
        got < 32 << 20,
        "{got} bytes read: the reply was not cut short"
    );
    assert!(cut < Duration::from_secs(10), "cut off after {cut:?}");
}
