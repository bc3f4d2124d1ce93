//! The NBD client against ztier's own server: the block-device conformance suite through
//! the wire, errors from the server, a server that goes away and one that comes back.

use std::path::PathBuf;
use std::sync::Arc;

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::{BlockDevice, BlockError};
use ztier_nbd::client::{Client, ClientConfig, LinkState, Uri};
use ztier_nbd::{Listener, Server, ServerConfig};

struct Served {
    server: Arc<Server>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn serve(name: &str, dev: Arc<dyn BlockDevice>, config: ServerConfig) -> Served {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = Server::new(dev, config);
    let s = Arc::clone(&server);
    let thread = std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());
    Served {
        server,
        path,
        thread: Some(thread),
    }
}

impl Served {
    fn uri(&self, export: &str) -> Uri {
        format!("nbd+unix:///{export}?socket={}", self.path.display())
            .parse()
            .unwrap()
    }
    fn stop(&mut self) {
        self.server.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn config(export: &str) -> ServerConfig {
    ServerConfig {
        export_name: export.into(),
        log: false,
        ..ServerConfig::default()
    }
}

#[test]
fn the_conformance_suite_passes_through_the_wire() {
    let s = serve(
        "suite",
        Arc::new(MemoryDevice::new(4 << 20).unwrap()),
        config("disk"),
    );
    let client = Client::connect(&s.uri("disk")).unwrap();
    assert_eq!(client.size(), 4 << 20);
    ztier_blockdev::testing::run_all(&client);
}

#[test]
fn large_requests_are_split_and_errors_are_clear() {
    let s = serve(
        "split",
        Arc::new(MemoryDevice::new(64 << 20).unwrap()),
        config(""),
    );
    let client = Client::connect(&s.uri("")).unwrap();
    let data = ztier_base::pattern::pattern(7, 40 << 20);
    client.write_at(4096, &data, false).unwrap();
    let mut back = vec![0u8; data.len()];
    client.read_at(4096, &mut back).unwrap();
    assert!(back == data);
    assert!(matches!(
        client.read_at(64 << 20, &mut [0u8; 512]),
        Err(BlockError::OutOfRange { .. })
    ));
    let err = Client::connect(&s.uri("nosuch")).err().unwrap();
    assert!(err.to_string().contains("no export named"), "{err}");
}

#[test]
fn a_read_only_export_refuses_writes() {
    let mut c = config("ro");
    c.read_only = true;
    let s = serve("ro", Arc::new(MemoryDevice::new(1 << 20).unwrap()), c);
    let client = Client::connect(&s.uri("ro")).unwrap();
    assert!(matches!(
        client.write_at(0, &[1u8; 4096], false),
        Err(BlockError::ReadOnly)
    ));
    client.read_at(0, &mut [0u8; 4096]).unwrap();
}

#[test]
fn a_vanished_server_is_an_error_until_the_owner_reconnects() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("gone", dev.clone(), config("x"));
    let client = Client::connect(&s.uri("x")).unwrap();
    client.write_at(0, &[5u8; 4096], false).unwrap();
    assert_eq!(client.epoch(), 0);
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    let err = client.write_at(4096, &[6u8; 4096], false).unwrap_err();
    assert!(matches!(err, BlockError::Io(_)), "{err}");
    // Lost: the epoch moves (a cache of the store's bytes is no longer good).
    let lost = client.epoch();
    assert!(lost > 0, "the epoch stayed at 0 when the link was lost");
    assert!(
        client.read_at(0, &mut [0u8; 4096]).is_err(),
        "no server, no read"
    );
    assert!(!client.is_connected());
    assert!(client.reconnect().is_err(), "nobody to dial");
    // The same device served again at the same place: nothing happens by itself...
    let _back = serve("gone", dev, config("x"));
    let err = client.read_at(0, &mut [0u8; 4096]).unwrap_err();
    assert!(err.to_string().contains("reconnect"), "{err}");
    // ...until the owner reconnects.
    client.reconnect().unwrap();
    assert!(
        client.epoch() > lost,
        "the epoch stayed when the link came back"
    );
    let mut page = [0u8; 4096];
    client.read_at(0, &mut page).unwrap();
    assert_eq!(page, [5u8; 4096]);
}

/// A client with a short timeout and its identity pinned (an id written at block 0), and
/// the lines it logs.
fn pinned_client(uri: &Uri) -> (Client, Arc<std::sync::Mutex<Vec<String>>>) {
    let config = ClientConfig {
        io_timeout: std::time::Duration::from_millis(500),
        max_backoff: std::time::Duration::from_millis(200),
    };
    let client = Client::connect_with(uri, config).unwrap();
    client
        .write_at(0, b"ztier-test-identity-0123456789ab", false)
        .unwrap();
    client.pin_identity(0, 32).unwrap();
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let l = Arc::clone(&lines);
    client.set_log(move |line| l.lock().unwrap().push(line.to_string()));
    (client, lines)
}

/// Retries `f` until it succeeds (the client waits out its backoff between tries to dial),
/// failing the test after a deadline far past the backoff.
fn eventually<T>(what: &str, mut f: impl FnMut() -> ztier_blockdev::Result<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if std::time::Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => std::thread::yield_now(),
        }
    }
}

#[test]
fn a_store_with_an_identity_comes_back_by_itself() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("back", dev.clone(), config("x"));
    let (client, lines) = pinned_client(&s.uri("x"));
    client.write_at(8192, &[5u8; 4096], false).unwrap();
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    assert!(client.read_at(8192, &mut [0u8; 4096]).is_err(), "no server");
    assert!(!client.is_connected());
    assert!(matches!(client.status().state, LinkState::Lost { .. }));
    // The same store at the same place: the next requests find it, nobody reconnects.
    let _back = serve("back", dev, config("x"));
    let mut page = [0u8; 4096];
    eventually("reading after the store came back", || {
        client.read_at(8192, &mut page)
    });
    assert_eq!(page, [5u8; 4096]);
    let status = client.status();
    assert_eq!(status.state, LinkState::Connected);
    assert_eq!((status.losses, status.reconnects), (1, 1));
    let log = lines.lock().unwrap().join("\n");
    assert!(
        log.contains("lost the store") && log.contains("is back"),
        "{log}"
    );
}

#[test]
fn a_store_that_stalls_past_the_timeout_is_found_again() {
    let dev = Arc::new(ztier_blockdev::testing::Faulty::new(
        MemoryDevice::new(1 << 20).unwrap(),
    ));
    let s = serve("stall", dev.clone(), config(""));
    let (client, _lines) = pinned_client(&s.uri(""));
    client.write_at(4096, &[7u8; 4096], false).unwrap();
    dev.stall(true);
    let err = client.read_at(4096, &mut [0u8; 4096]).unwrap_err();
    assert!(matches!(err, BlockError::Io(_)), "{err}");
    // Said in words, not as the socket's EAGAIN.
    assert!(err.to_string().contains("no answer within"), "{err}");
    assert!(!err.to_string().contains("os error 11"), "{err}");
    assert!(!client.is_connected(), "a timed-out request loses the link");
    // While it stalls, a try to reconnect cannot check the identity: still lost.
    assert!(client.reconnect().is_err());
    dev.stall(false);
    let mut page = [0u8; 4096];
    eventually("reading after the store resumed", || {
        client.read_at(4096, &mut page)
    });
    assert_eq!(page, [7u8; 4096]);
}

#[test]
fn a_different_store_is_refused_until_the_right_one_is_back() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("other", dev.clone(), config("x"));
    let (client, lines) = pinned_client(&s.uri("x"));
    client.write_at(4096, &[9u8; 4096], false).unwrap();
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    drop(s);
    // A store of the same size that restarted empty.
    let mut empty = serve(
        "other",
        Arc::new(MemoryDevice::new(1 << 20).unwrap()),
        config("x"),
    );
    // The first request finds the old connection dead; the next dials the new store.
    assert!(client.read_at(4096, &mut [0u8; 4096]).is_err());
    let err = client.read_at(4096, &mut [0u8; 4096]).unwrap_err();
    assert!(err.to_string().contains("refused"), "{err}");
    let status = client.status();
    assert!(
        matches!(&status.state, LinkState::Refused { reason, .. } if reason.contains("identity")),
        "{status}"
    );
    assert!(lines.lock().unwrap().iter().any(|l| l.contains("REFUSED")));
    // Nothing it holds is ever read: every read fails while it is the only store there.
    for _ in 0..3 {
        assert!(client.read_at(4096, &mut [0u8; 4096]).is_err());
    }
    empty.stop();
    let _ = std::fs::remove_file(&empty.path);
    drop(empty);
    // A store of another size is refused too.
    let mut small = serve(
        "other",
        Arc::new(MemoryDevice::new(1 << 19).unwrap()),
        config("x"),
    );
    let err = eventually("a refusal of the small store", || {
        match client.read_at(4096, &mut [0u8; 4096]) {
            Err(e) if e.to_string().contains("bytes, not the") => Ok(e),
            Err(e) => Err(e),
            Ok(()) => panic!("read from a store of another size"),
        }
    });
    assert!(err.to_string().contains("refused"), "{err}");
    small.stop();
    let _ = std::fs::remove_file(&small.path);
    drop(small);
    // The right store back: found.
    let _right = serve("other", dev, config("x"));
    let mut page = [0u8; 4096];
    eventually("reading from the right store", || {
        client.read_at(4096, &mut page)
    });
    assert_eq!(page, [9u8; 4096]);
}

#[test]
fn status_answers_while_a_request_waits_on_the_store() {
    let dev = Arc::new(ztier_blockdev::testing::Faulty::new(
        MemoryDevice::new(1 << 20).unwrap(),
    ));
    let s = serve("status", dev.clone(), config(""));
    let client = Arc::new(Client::connect(&s.uri("")).unwrap());
    dev.stall(true);
    let reader = {
        let client = Arc::clone(&client);
        std::thread::spawn(move || client.read_at(0, &mut [0u8; 4096]))
    };
    assert!(dev.wait_for_stalled_reads(1, std::time::Duration::from_secs(20)));
    // The request holds the connection across the network; the link's state is read
    // without it (what `ztier stat` and `ctl backing_dev` show).
    let (tx, rx) = std::sync::mpsc::channel();
    let c = Arc::clone(&client);
    std::thread::spawn(move || {
        let _ = tx.send((c.status(), c.is_connected()));
    });
    let answered = rx.recv_timeout(std::time::Duration::from_secs(20));
    let still_waiting = !reader.is_finished();
    // Let the store go first, so a failure below ends the test instead of hanging it.
    dev.stall(false);
    let (status, connected) = answered.expect("status waited behind a request on the network");
    assert_eq!(status.state, LinkState::Connected);
    assert!(connected);
    assert!(still_waiting);
    reader.join().unwrap().unwrap();
}

/// A disk that counts the most reads and writes it ever had on it at once; each stays on it
/// a little while, so requests in flight together meet there.
struct Meeting {
    inner: MemoryDevice,
    on: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

impl Meeting {
    fn visit<T>(&self, op: impl FnOnce() -> T) -> T {
        use std::sync::atomic::Ordering::SeqCst;
        let now = self.on.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(5));
        let r = op();
        self.on.fetch_sub(1, SeqCst);
        r
    }
    fn take_most(&self) -> usize {
        self.most.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

impl BlockDevice for Meeting {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        self.visit(|| self.inner.read_at(offset, buf))
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        self.visit(|| self.inner.write_at(offset, data, fua))
    }
    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        Ok(())
    }
}

#[test]
fn batches_go_out_as_requests_in_flight_together_and_come_back_matched() {
    // The server runs four requests of the connection at once: a batch's requests meet on
    // the disk only if the client sent them before the first reply came back.
    let disk = Arc::new(Meeting {
        inner: MemoryDevice::new(4 << 20).unwrap(),
        on: Default::default(),
        most: Default::default(),
    });
    let s = serve(
        "meeting",
        Arc::clone(&disk) as Arc<dyn BlockDevice>,
        ServerConfig {
            workers_per_connection: 4,
            ..config("disk")
        },
    );
    let client = Client::connect(&s.uri("disk")).unwrap();
    let data: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i + 1; 64 << 10]).collect();
    let writes: Vec<(u64, &[u8])> = data
        .iter()
        .enumerate()
        .map(|(i, d)| ((i as u64) << 17, &d[..]))
        .collect();
    client.write_many(&writes).unwrap();
    assert!(disk.take_most() >= 2, "the writes went one at a time");
    let mut bufs = vec![vec![0u8; 64 << 10]; 20];
    let mut reads: Vec<(u64, &mut [u8])> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| ((i as u64) << 17, &mut b[..]))
        .collect();
    client.read_many(&mut reads).unwrap();
    assert!(disk.take_most() >= 2, "the reads went one at a time");
    // Each buffer got its own range's bytes, whatever order the replies came in.
    assert!(bufs == data);
    let mut whole = vec![0u8; 128 << 10];
    disk.inner.read_at(3 << 17, &mut whole).unwrap();
    assert!(whole[..64 << 10] == data[3][..] && whole[64 << 10..].iter().all(|&b| b == 0));
    // The same reads one by one never meet: what the disk counts is the client's doing.
    for (i, b) in bufs.iter_mut().enumerate() {
        client.read_at((i as u64) << 17, b).unwrap();
    }
    assert_eq!(disk.take_most(), 1);
    // A range past the end refuses the batch before anything is sent; the link stays up.
    let mut past = vec![0u8; 4096];
    assert!(client
        .read_many(&mut [(0, &mut bufs[0][..]), (4 << 20, &mut past[..])])
        .is_err());
    assert!(client.is_connected());
}

/// A store away for less than the request timeout costs the requests made meanwhile their
/// wait, not an error: they wait for the reconnector, which finds the store once it is back,
/// and are answered then.
#[test]
fn an_outage_shorter_than_the_timeout_costs_latency_not_errors() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("blip", dev.clone(), config("x"));
    let waits = ClientConfig {
        io_timeout: std::time::Duration::from_secs(10),
        max_backoff: std::time::Duration::from_millis(200),
    };
    let client = Arc::new(Client::connect_with(&s.uri("x"), waits).unwrap());
    client
        .write_at(0, b"ztier-test-identity-0123456789ab", false)
        .unwrap();
    client.pin_identity(0, 32).unwrap();
    client.write_at(8192, &[6u8; 4096], false).unwrap();
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    let issued = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let client = Arc::clone(&client);
        let issued = Arc::clone(&issued);
        std::thread::spawn(move || {
            let mut page = [0u8; 4096];
            let started = std::time::Instant::now();
            issued.store(true, std::sync::atomic::Ordering::SeqCst);
            client
                .read_at(8192, &mut page)
                .map(|()| (page, started.elapsed()))
        })
    };
    // The store is back a second after the read is issued (a reader thread started late
    // would otherwise see a shorter outage), and the read is still waiting then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !issued.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(std::time::Instant::now() < deadline, "the reader never ran");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    std::thread::sleep(std::time::Duration::from_secs(1));
    if reader.is_finished() {
        let ended = reader.join().unwrap().map(|(_, waited)| waited);
        panic!("the read ended during the outage: {ended:?}");
    }
    let _back = serve("blip", dev, config("x"));
    let (page, waited) = reader
        .join()
        .unwrap()
        .expect("a read during a short outage");
    assert_eq!(page, [6u8; 4096]);
    assert!(
        waited >= std::time::Duration::from_millis(900),
        "{waited:?}"
    );
    assert_eq!(client.status().state, LinkState::Connected);
}

/// A store that is back is dialed by the reconnector without a request to drive it: its
/// status says so within about the longest backoff.
#[test]
fn a_store_that_is_back_is_found_without_a_request() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("found", dev.clone(), config("x"));
    let (client, _lines) = pinned_client(&s.uri("x"));
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    assert!(client.read_at(8192, &mut [0u8; 4096]).is_err(), "no server");
    let _back = serve("found", dev, config("x"));
    let back_at = std::time::Instant::now();
    while client.status().state != LinkState::Connected {
        assert!(
            back_at.elapsed() < std::time::Duration::from_secs(20),
            "never dialed again: {}",
            client.status()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // The backoff is at most 200 ms here; far less than a second in all.
    assert!(back_at.elapsed() < std::time::Duration::from_secs(2));
}

/// `reconnect` on a link that seems up proves it first: a store stopped a moment ago is
/// found lost (and, not back, the reconnect fails), not called connected.
#[test]
fn reconnect_proves_a_link_that_seems_up() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("probe", dev, config("x"));
    let (client, _lines) = pinned_client(&s.uri("x"));
    assert!(client.reconnect().is_ok(), "a live store");
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    assert_eq!(
        client.status().state,
        LinkState::Connected,
        "nothing asked yet"
    );
    assert!(
        client.reconnect().is_err(),
        "a stopped store called connected"
    );
    assert!(matches!(client.status().state, LinkState::Lost { .. }));
}
