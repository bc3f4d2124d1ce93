//! An `accept()` that fails (here: out of file descriptors, EMFILE) never ends the server:
//! it is counted, retried after a backoff, and once descriptors are free again a new client
//! is served. Alone in its test binary, because the limit it lowers is the process's.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::client::Client;
use ztier_nbd::{Listener, Server, ServerConfig};

const DEADLINE: Duration = Duration::from_secs(20);

/// Descriptors open in this process now.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[test]
fn out_of_file_descriptors_on_accept_does_not_end_the_server() {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-emfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("emfile.sock");
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let server = Server::new(dev, ServerConfig::default());
    let s = Arc::clone(&server);
    let (tx, ended) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(s.serve(Listener::Unix(listener)));
    });

    // The clients' sockets are made first; then the process may open no more descriptors,
    // so connecting them (which takes none) leaves the server's accept none for its side.
    // (Clients that made their sockets after the limit would race the server for the last
    // ones, and could be the side that runs out.)
    let clients: Vec<_> = (0..8)
        .map(|_| {
            rustix::net::socket(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::STREAM,
                None,
            )
            .unwrap()
        })
        .collect();
    let addr = rustix::net::SocketAddrUnix::new(&path).unwrap();
    let old = getrlimit(Resource::Nofile);
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(open_fds()),
            maximum: old.maximum,
        },
    )
    .unwrap();
    let deadline = Instant::now() + DEADLINE;
    for c in &clients {
        rustix::net::connect(c, &addr).unwrap();
    }
    while server.stats().accept_errors.load(Relaxed) == 0 {
        assert!(Instant::now() < deadline, "accept never failed");
        std::thread::yield_now();
    }
    assert!(
        ended.try_recv().is_err(),
        "the server ended on an accept error"
    );
    drop(clients);
    setrlimit(Resource::Nofile, old).unwrap();

    // Descriptors free again: the server takes new clients.
    let uri = format!("nbd+unix:///?socket={}", path.display())
        .parse()
        .unwrap();
    let client = loop {
        match Client::connect(&uri) {
            Ok(c) => break c,
            Err(e) => assert!(Instant::now() < deadline, "no client served since: {e}"),
        }
    };
    client.write_at(0, &[1u8; 4096], false).unwrap();
    assert!(ended.try_recv().is_err());
    server.stop();
    ended.recv_timeout(DEADLINE).unwrap().unwrap();
    let _ = std::fs::remove_file(&path);
}
