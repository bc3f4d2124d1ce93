//! The in-flight budget shared between exports: many clients of one export that send large
//! reads and read none of the replies do not stop another export's client from having its
//! 4 KiB read answered, on a server allowed many connections (a host's guests), where an
//! equal split of the reserved half of the budget gives each connection less than one small
//! request's buffer. Alone in its test binary: it holds a large part of a budget.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::proto::*;
use ztier_nbd::{Client, Export, ExportTable, Exports, Listener, Server, ServerConfig};

const MIB: usize = 1 << 20;
/// How long the test waits for what must happen; a server that is fair never nears it.
const DEADLINE: Duration = Duration::from_secs(30);

/// A client of `export` through `NBD_OPT_GO`, its socket left for raw requests.
fn raw_client(path: &std::path::Path, export: &str) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let go = InfoRequest {
        export: export.into(),
        infos: vec![],
    }
    .encode();
    let mut opt = IHAVEOPT.to_be_bytes().to_vec();
    opt.extend(OPT_GO.to_be_bytes());
    opt.extend((go.len() as u32).to_be_bytes());
    opt.extend(go);
    s.write_all(&opt).unwrap();
    loop {
        let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
        s.read_exact(&mut h).unwrap();
        let h = OptionReplyHeader::decode(&h).unwrap();
        let mut data = vec![0u8; h.len as usize];
        s.read_exact(&mut data).unwrap();
        match h.reply {
            REP_ACK => return s,
            REP_INFO => {}
            r => panic!("GO {export}: reply {r:#x}"),
        }
    }
}

/// 8 clients of "a" each send 4 reads of 8 MiB and read nothing (their reply timeout is far
/// off); a client of "b" then reads 4 KiB, 16 times. Every one of its reads is answered while
/// all of "a"'s clients are still connected and still hold what they took.
#[test]
fn clients_of_one_export_that_read_nothing_do_not_stall_another_export() {
    const HOGS: usize = 8;
    let dir = std::env::temp_dir().join(format!("ztier-nbd-xfair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fair.sock");
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let a = Arc::new(MemoryDevice::new(64 * MIB as u64).unwrap());
    a.write_at(0, &vec![0xaa; 64 * MIB], false).unwrap();
    let b = Arc::new(MemoryDevice::new(MIB as u64).unwrap());
    b.write_at(0, &vec![0xbb; MIB], false).unwrap();
    let table = Arc::new(ExportTable::new());
    table.insert(Export::new("a", a as Arc<dyn BlockDevice>));
    table.insert(Export::new("b", b as Arc<dyn BlockDevice>));
    let server = Server::with_exports(
        table as Arc<dyn Exports>,
        ServerConfig {
            // Many guests allowed: the reserved half of the 48 MiB in flight over 512
            // connections is 48 KiB each, less than a 4 KiB read's buffer (64 KiB).
            max_connections: 512,
            max_in_flight_total: 64 * MIB,
            max_in_flight_bytes: 64 * MIB,
            reply_timeout: Duration::from_secs(600),
            ..ServerConfig::default()
        },
    );
    let s = Arc::clone(&server);
    let serving = std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());

    let hogs: Vec<UnixStream> = (0..HOGS)
        .map(|c| {
            let mut s = raw_client(&path, "a");
            let reads: Vec<u8> = (0..4u64)
                .flat_map(|i| {
                    Request {
                        flags: 0,
                        kind: CMD_READ,
                        cookie: (c as u64) << 8 | i,
                        offset: (i % 8) * 8 * MIB as u64,
                        length: 8 * MIB as u32,
                    }
                    .encode()
                })
                .collect();
            s.write_all(&reads).unwrap();
            s
        })
        .collect();
    // Until the hogs hold what they can, and it stays put.
    let start = Instant::now();
    let mut last = 0;
    let held = loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = server.stats().in_flight_bytes.load(Relaxed);
        if now >= 8 * MIB as u64 && now == last {
            break now;
        }
        last = now;
        assert!(start.elapsed() < DEADLINE, "the hogs' reads never piled up");
    };

    let uri = format!("nbd+unix:///b?socket={}", path.display())
        .parse()
        .unwrap();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let client = Client::connect(&uri).unwrap();
        let mut page = vec![0u8; 4096];
        for i in 0..16u64 {
            client.read_at(i * 4096, &mut page).unwrap();
            assert_eq!(page, vec![0xbb; 4096]);
        }
        let _ = done.send(());
    });
    let answered = finished.recv_timeout(DEADLINE);
    let (connected, still_held) = (
        server.connections_to("a"),
        server.stats().in_flight_bytes.load(Relaxed),
    );
    assert!(
        answered.is_ok(),
        "b's 4 KiB reads were not answered beside {HOGS} clients of a reading nothing \
         (they hold {} MiB): {:?}",
        held >> 20,
        server.stats()
    );
    assert_eq!(
        connected, HOGS,
        "a's clients were cut off before b was answered"
    );
    assert!(
        still_held >= held,
        "a's clients let go of what they held ({} MiB, now {} MiB) before b was answered",
        held >> 20,
        still_held >> 20
    );
    assert_eq!(server.stats_for("b").unwrap().bytes_read, 16 * 4096);
    assert_eq!(server.stats_for("b").unwrap().errors, 0);
    // Forced off, what they held goes back.
    assert_eq!(server.disconnect_export_now("a"), HOGS);
    let start = Instant::now();
    while server.stats().in_flight_bytes.load(Relaxed) > 0 || server.connections_to("a") > 0 {
        assert!(
            start.elapsed() < DEADLINE,
            "a's clients never let go: {:?}",
            server.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(hogs);
    server.stop_now();
    serving.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
