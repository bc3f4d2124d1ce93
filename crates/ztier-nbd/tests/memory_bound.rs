//! One budget bounds the server's buffers whatever its clients do: sixteen connections
//! pipelining large reads and reading none of the replies hold at most the budget, are cut
//! off once they leave their replies unread past the reply timeout, and a good client is
//! served after. Alone in its test binary, because it reads the process's RSS.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::client::Client;
use ztier_nbd::proto::{Request, CMD_READ};
use ztier_nbd::{Listener, Server, ServerConfig};

const DEADLINE: Duration = Duration::from_secs(60);
const BUDGET: usize = 64 << 20;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    kb * 1024
}

/// A client through the handshake (NBD_OPT_EXPORT_NAME), its socket left for raw requests.
fn raw_client(path: &std::path::Path) -> UnixStream {
    use std::io::Read;
    let mut s = UnixStream::connect(path).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    let mut hello = 3u32.to_be_bytes().to_vec(); // fixed newstyle, no zeroes
    hello.extend(0x4948_4156_454f_5054u64.to_be_bytes()); // IHAVEOPT
    hello.extend(1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    hello.extend(0u32.to_be_bytes()); // the default export
    s.write_all(&hello).unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    s
}

#[test]
fn clients_that_read_no_replies_hold_at_most_the_budget_then_are_cut_off() {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("budget.sock");
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    // A disk whose pages hold data, so a read fills its whole reply buffer.
    let dev = Arc::new(MemoryDevice::new(64 << 20).unwrap());
    let fill = vec![0x5au8; 1 << 20];
    for mb in 0..64u64 {
        dev.write_at(mb << 20, &fill, false).unwrap();
    }
    let dev: Arc<dyn BlockDevice> = dev;
    let config = ServerConfig {
        max_in_flight_total: BUDGET,
        reply_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    };
    let server = Server::new(dev, config);
    let s = Arc::clone(&server);
    std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());
    let before = rss_bytes();

    // 16 connections each send 16 reads of 8 MiB (2 GiB asked for) and read nothing.
    let hogs: Vec<UnixStream> = (0..16)
        .map(|c| {
            let mut s = raw_client(&path);
            for i in 0..16u64 {
                let req = Request {
                    flags: 0,
                    kind: CMD_READ,
                    cookie: c * 100 + i,
                    offset: (i % 8) << 23,
                    length: 8 << 20,
                };
                s.write_all(&req.encode()).unwrap();
            }
            s
        })
        .collect();
    // Wait until the server's budget is spent: three quarters of it is for requests in
    // flight, and these 8 MiB reads, larger than any connection's reserve, can hold only
    // the shared half of that.
    let start = Instant::now();
    while (server.stats().in_flight_bytes.load(Relaxed) as usize) < BUDGET / 8 * 3 - (8 << 20) {
        assert!(
            start.elapsed() < DEADLINE,
            "the hogs never filled the budget"
        );
        std::thread::yield_now();
    }
    let held = rss_bytes().saturating_sub(before);
    assert!(
        held <= (BUDGET + (16 << 20)) as u64,
        "{} MiB held for 16 clients reading no replies, over a {} MiB budget",
        held >> 20,
        BUDGET >> 20
    );
    // Left unread past the reply timeout, they are cut off and their requests let go.
    let start = Instant::now();
    while server.stats().in_flight_bytes.load(Relaxed) > 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "the hogs were never cut off: {:?}",
            server.stats()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(hogs);
    let client = Client::connect(
        &format!("nbd+unix:///?socket={}", path.display())
            .parse()
            .unwrap(),
    )
    .unwrap();
    let mut page = vec![0u8; 4096];
    client.read_at(0, &mut page).unwrap();
    assert_eq!(page, vec![0x5a; 4096]);
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
