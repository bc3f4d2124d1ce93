//! One server, many exports by name (`Server::with_exports`): listed, looked up, added and
//! removed while others are served, disconnected, and counted apart.
//!
//! Properties:
//! - `NBD_OPT_LIST` names every export with its description (this crate's client and
//!   libnbd's `nbdinfo --list` both read them); `NBD_OPT_INFO`/`GO` give each export's own
//!   size, flags, canonical name and description;
//! - an unknown name is refused (`NBD_REP_ERR_UNKNOWN`, the haggling going on; a closed
//!   connection after `NBD_OPT_EXPORT_NAME`); "" is the default export only when one is named;
//! - an export added at runtime is served at once; one removed is refused to new clients
//!   while a connected client keeps working, until `disconnect_export`, which answers the
//!   requests it has and then closes;
//! - `connections_to` counts the connections holding an export; each export's counters hold
//!   its own traffic only, and the server's totals the sum.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::proto::*;
use ztier_nbd::{Client, Export, ExportTable, Listener, Server, ServerConfig, Uri};

/// How long a test waits for what must happen (a connection's end); only a server that
/// wrongly never does it waits this long.
const DEADLINE: Duration = Duration::from_secs(20);

struct Harness {
    server: Arc<Server>,
    table: Arc<ExportTable>,
    path: PathBuf,
    dir: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Harness {
    fn new(tag: &str) -> Harness {
        let dir =
            std::env::temp_dir().join(format!("ztier-nbd-exports-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("nbd.sock");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let table = Arc::new(ExportTable::new());
        let server = Server::with_exports(
            Arc::clone(&table) as Arc<dyn ztier_nbd::Exports>,
            ServerConfig {
                // Ignored by `with_exports`: every export has its own.
                export_name: "ignored".into(),
                read_only: true,
                ..ServerConfig::default()
            },
        );
        let s = Arc::clone(&server);
        let thread = std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());
        Harness {
            server,
            table,
            path,
            dir,
            thread: Some(thread),
        }
    }

    fn uri(&self, export: &str) -> Uri {
        format!("nbd+unix:///{export}?socket={}", self.path.display())
            .parse()
            .unwrap()
    }

    /// A raw connection, greeted.
    fn raw(&self) -> UnixStream {
        let mut s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        let g = read_n(&mut s, 18);
        assert_eq!(u64::from_be_bytes(g[..8].try_into().unwrap()), NBDMAGIC);
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        s
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.stop_now();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A RAM disk of `size` bytes, each byte `fill`.
fn disk(size: u64, fill: u8) -> Arc<MemoryDevice> {
    let dev = Arc::new(MemoryDevice::new(size).unwrap());
    dev.write_at(0, &vec![fill; size as usize], false).unwrap();
    dev
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn send_option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend(opt.to_be_bytes());
    v.extend((data.len() as u32).to_be_bytes());
    v.extend(data);
    s.write_all(&v).unwrap();
}

/// Replies to `opt` up to its ACK or first error: (type, data) each.
fn option_replies(s: &mut UnixStream, opt: u32) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let h = read_n(s, OPTION_REPLY_HEADER_LEN);
        let h = OptionReplyHeader::decode(&h.try_into().unwrap()).unwrap();
        assert_eq!(h.option, opt);
        let data = read_n(s, h.len as usize);
        let end = h.reply == REP_ACK || h.reply & (1 << 31) != 0;
        out.push((h.reply, data));
        if end {
            return out;
        }
    }
}

/// What `NBD_OPT_INFO` (or `GO`) for `name`, asking for its name and description, says:
/// Ok((size, flags, canonical name, description)), or Err(the error reply).
fn info(s: &mut UnixStream, opt: u32, name: &str) -> Result<(u64, u16, String, String), u32> {
    let req = InfoRequest {
        export: name.into(),
        infos: vec![INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE],
    };
    send_option(s, opt, &req.encode());
    let (mut size, mut flags, mut canonical, mut description) = (None, 0, None, String::new());
    for (reply, data) in option_replies(s, opt) {
        match reply {
            REP_INFO => {
                let text = || String::from_utf8(data[2..].to_vec()).unwrap();
                match u16::from_be_bytes([data[0], data[1]]) {
                    INFO_EXPORT => {
                        size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                        flags = u16::from_be_bytes([data[10], data[11]]);
                    }
                    INFO_NAME => canonical = Some(text()),
                    INFO_DESCRIPTION => description = text(),
                    _ => {}
                }
            }
            REP_ACK => {}
            e => return Err(e),
        }
    }
    Ok((
        size.unwrap(),
        flags,
        canonical.expect("NBD_INFO_NAME"),
        description,
    ))
}

/// One simple read of `len` bytes at `offset` on a connection in transmission: its data.
fn raw_read(s: &mut UnixStream, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let req = Request {
        flags: 0,
        kind: CMD_READ,
        cookie,
        offset,
        length: len,
    };
    s.write_all(&req.encode()).unwrap();
    let h = read_n(s, SIMPLE_REPLY_LEN);
    let reply = SimpleReply::decode(&h.try_into().unwrap()).unwrap();
    assert_eq!((reply.error, reply.cookie), (0, cookie));
    read_n(s, len as usize)
}

/// Waits (bounded) until `what` holds.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < DEADLINE, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Three exports, one read-only, "b" the default.
fn three(h: &Harness) -> [Arc<MemoryDevice>; 3] {
    let devs = [
        disk(1 << 20, 0xa1),
        disk(2 << 20, 0xb2),
        disk(3 << 20, 0xc3),
    ];
    let e = |name: &str, d: &Arc<MemoryDevice>| {
        Export::new(name, Arc::clone(d) as Arc<dyn BlockDevice>)
    };
    h.table
        .insert(e("a", &devs[0]).with_description("the first disk"));
    h.table
        .insert(e("b", &devs[1]).with_description("the second, ünïcode"));
    h.table.insert(e("c", &devs[2]).with_read_only(true));
    h.table.set_default(Some("b".into()));
    devs
}

#[test]
fn list_info_and_go_give_each_export_its_own() {
    let h = Harness::new("list");
    let devs = three(&h);
    // LIST, read by this crate's client.
    let listed: Vec<(String, String)> = Client::list_exports(&h.uri(""))
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.description))
        .collect();
    assert_eq!(
        listed,
        [
            ("a".to_string(), "the first disk".to_string()),
            ("b".into(), "the second, ünïcode".into()),
            ("c".into(), String::new()),
        ]
    );
    // INFO for each, then the default: canonical name, own size, flags, description.
    let mut s = h.raw();
    let (size, flags, name, desc) = info(&mut s, OPT_INFO, "a").unwrap();
    assert_eq!(
        (size, name.as_str(), desc.as_str()),
        (1 << 20, "a", "the first disk")
    );
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    assert_ne!(flags & FLAG_SEND_TRIM, 0);
    let (size, flags, name, desc) = info(&mut s, OPT_INFO, "c").unwrap();
    assert_eq!((size, name.as_str(), desc.as_str()), (3 << 20, "c", ""));
    assert_ne!(flags & FLAG_READ_ONLY, 0, "c is read-only");
    assert_eq!(flags & FLAG_SEND_TRIM, 0);
    let (size, _, name, _) = info(&mut s, OPT_INFO, "").unwrap();
    assert_eq!(
        (size, name.as_str()),
        (2 << 20, "b"),
        "the default export, by its name"
    );
    // GO to "c" and read its bytes, then a write is refused there alone.
    info(&mut s, OPT_GO, "c").unwrap();
    assert_eq!(raw_read(&mut s, 1, 4096, 4096), vec![0xc3; 4096]);
    assert_eq!(h.server.connections_to("c"), 1);
    drop(s);
    // This crate's client, to each by name: each sees its own disk, and writes land there.
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let c = Client::connect(&h.uri(name)).unwrap();
        assert_eq!(c.info().size, (i as u64 + 1) << 20);
        let mut page = vec![0u8; 4096];
        c.read_at(8192, &mut page).unwrap();
        assert_eq!(page, vec![[0xa1, 0xb2, 0xc3][i]; 4096]);
        let wrote = c.write_at(0, &[i as u8 + 1; 4096], false);
        if *name == "c" {
            assert!(wrote.is_err(), "c is read-only");
        } else {
            wrote.unwrap();
            let mut back = vec![0u8; 4096];
            devs[i].read_at(0, &mut back).unwrap();
            assert_eq!(back, vec![i as u8 + 1; 4096]);
        }
    }
    // Nothing leaked into the other disks.
    let mut page = vec![0u8; 4096];
    devs[2].read_at(0, &mut page).unwrap();
    assert_eq!(page, vec![0xc3; 4096]);
}

/// `nbdinfo --list` (libnbd) sees every export with its own size, description and flags.
#[test]
fn nbdinfo_lists_every_export() {
    let found = Command::new("sh")
        .args(["-c", "command -v nbdinfo"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("skipping: nbdinfo (libnbd) is not installed");
        return;
    }
    let h = Harness::new("nbdinfo");
    three(&h);
    let out = Command::new("nbdinfo")
        .args(["--list", "--json"])
        .arg(h.uri("").to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8(out.stdout).unwrap();
    // One block per export, in order: name, description, size, read-only.
    let blocks: Vec<&str> = json.split("\"export-name\":").skip(1).collect();
    let expect = [
        ("\"a\"", "the first disk", "1048576", "false"),
        ("\"b\"", "the second, ünïcode", "2097152", "false"),
        ("\"c\"", "", "3145728", "true"),
    ];
    assert_eq!(blocks.len(), 3, "{json}");
    for (block, (name, desc, size, ro)) in blocks.iter().zip(expect) {
        assert!(block.trim_start().starts_with(name), "{block}");
        if !desc.is_empty() {
            assert!(
                block.contains(&format!("\"description\": \"{desc}\"")),
                "{block}"
            );
        }
        assert!(
            block.contains(&format!("\"export-size\": {size}")),
            "{block}"
        );
        assert!(
            block.contains(&format!("\"is_read_only\": {ro}")),
            "{block}"
        );
    }
}

#[test]
fn unknown_names_are_refused_and_the_default_is_only_a_named_one() {
    let h = Harness::new("unknown");
    h.table
        .insert(Export::new("a", disk(1 << 20, 1) as Arc<dyn BlockDevice>));
    let mut s = h.raw();
    // INFO and GO of an unknown name: NBD_REP_ERR_UNKNOWN, and the haggling goes on.
    assert_eq!(info(&mut s, OPT_INFO, "nope"), Err(REP_ERR_UNKNOWN));
    assert_eq!(info(&mut s, OPT_GO, "nope"), Err(REP_ERR_UNKNOWN));
    // No default export is named: "" is unknown too.
    assert_eq!(info(&mut s, OPT_GO, ""), Err(REP_ERR_UNKNOWN));
    let meta = MetaContextRequest {
        export: "nope".into(),
        queries: vec![],
    };
    send_option(&mut s, OPT_LIST_META_CONTEXT, &meta.encode());
    assert_eq!(
        option_replies(&mut s, OPT_LIST_META_CONTEXT)[0].0,
        REP_ERR_UNKNOWN
    );
    assert_eq!(
        h.server.connections_to("nope") + h.server.connections_to(""),
        0
    );
    // Still haggling: GO to a real one works.
    assert_eq!(info(&mut s, OPT_GO, "a").unwrap().0, 1 << 20);
    assert_eq!(h.server.connections_to("a"), 1);
    // NBD_OPT_EXPORT_NAME of an unknown name: the spec has the server close.
    let mut s = h.raw();
    send_option(&mut s, OPT_EXPORT_NAME, b"nope");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut b = [0u8; 16];
    match s.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        other => panic!("EXPORT_NAME of an unknown export was answered: {other:?}"),
    }
    // And "" by EXPORT_NAME, once a default is named, is that export.
    h.table.set_default(Some("a".into()));
    let mut s = h.raw();
    send_option(&mut s, OPT_EXPORT_NAME, b"");
    let reply = read_n(&mut s, 10);
    assert_eq!(
        decode_export_name_reply(&reply.try_into().unwrap())
            .unwrap()
            .0,
        1 << 20
    );
    // Counted once its transmission starts, just after that reply.
    wait_for("the second connection to a counted", || {
        h.server.stats_for("a").unwrap().connections == 2
    });
    assert!(h.server.stats_for("nope").is_none());
}

#[test]
fn exports_come_and_go_while_others_are_served() {
    let h = Harness::new("runtime");
    let a = disk(1 << 20, 0xaa);
    h.table
        .insert(Export::new("a", Arc::clone(&a) as Arc<dyn BlockDevice>));
    let client_a = Client::connect(&h.uri("a")).unwrap();
    assert_eq!(h.server.connections_to("a"), 1);
    // Added while "a" is served: listed and served at once.
    h.table.insert(Export::new(
        "b",
        disk(2 << 20, 0xbb) as Arc<dyn BlockDevice>,
    ));
    let names: Vec<String> = Client::list_exports(&h.uri(""))
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["a", "b"]);
    let client_b = Client::connect(&h.uri("b")).unwrap();
    let mut page = vec![0u8; 4096];
    client_b.read_at(0, &mut page).unwrap();
    assert_eq!(page, vec![0xbb; 4096]);

    // A raw client of "a" too, to see its last replies and its end.
    let mut raw_a = h.raw();
    info(&mut raw_a, OPT_GO, "a").unwrap();
    wait_for("two connections to a", || h.server.connections_to("a") == 2);
    assert_eq!(h.server.connections_to("b"), 1);

    // Removed: refused to new clients, but those connected keep working.
    h.table.remove("a").unwrap();
    assert!(Client::connect(&h.uri("a")).is_err());
    let mut s = h.raw();
    assert_eq!(info(&mut s, OPT_GO, "a"), Err(REP_ERR_UNKNOWN));
    client_a.write_at(4096, &[7u8; 4096], false).unwrap();
    client_a.read_at(4096, &mut page).unwrap();
    assert_eq!(page, vec![7u8; 4096]);
    assert_eq!(h.server.connections_to("a"), 2);

    // disconnect_export: the raw client's requests already sent are answered, then it is
    // closed; the other client of "a" loses its connection; "b" goes on.
    let pipelined: Vec<u8> = (0..8u64)
        .flat_map(|i| {
            Request {
                flags: 0,
                kind: CMD_READ,
                cookie: 100 + i,
                offset: i * 65536,
                length: 65536,
            }
            .encode()
        })
        .collect();
    raw_a.write_all(&pipelined).unwrap();
    assert_eq!(h.server.disconnect_export("a"), 2);
    let mut answered = Vec::new();
    for _ in 0..8 {
        let head = read_n(&mut raw_a, SIMPLE_REPLY_LEN);
        let r = SimpleReply::decode(&head.try_into().unwrap()).unwrap();
        assert_eq!(r.error, 0);
        let data = read_n(&mut raw_a, 65536);
        let mut expect = vec![0u8; 65536];
        a.read_at((r.cookie - 100) * 65536, &mut expect).unwrap();
        assert!(data == expect, "reply {} has the disk's bytes", r.cookie);
        answered.push(r.cookie);
    }
    answered.sort_unstable();
    assert_eq!(answered, (100..108).collect::<Vec<_>>());
    let mut b = [0u8; 1];
    assert!(
        matches!(raw_a.read(&mut b), Ok(0) | Err(_)),
        "closed after its replies"
    );
    wait_for("no connection to a", || h.server.connections_to("a") == 0);
    assert!(client_a.read_at(0, &mut page).is_err() || !client_a.is_connected());
    client_b.read_at(4096, &mut page).unwrap();
    assert_eq!(page, vec![0xbb; 4096]);
    assert_eq!(h.server.connections_to("b"), 1);
    assert_eq!(
        h.server.stats_for("a"),
        None,
        "a is gone and no one holds it"
    );
    // Put back (a new export of the same name): served again, with its own counters.
    h.table.insert(Export::new("a", a as Arc<dyn BlockDevice>));
    let again = Client::connect(&h.uri("a")).unwrap();
    again.read_at(4096, &mut page).unwrap();
    assert_eq!(page, vec![7u8; 4096], "the same disk, under the same name");
    assert_eq!(h.server.stats_for("a").unwrap().connections, 1);
}

#[test]
fn each_export_counts_its_own_traffic() {
    let h = Harness::new("stats");
    three(&h);
    let a = Client::connect(&h.uri("a")).unwrap();
    let b1 = Client::connect(&h.uri("b")).unwrap();
    let b2 = Client::connect(&h.uri("")).unwrap();
    wait_for("three connections", || {
        h.server.connections_to("a") == 1 && h.server.connections_to("b") == 2
    });
    let before: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| h.server.stats_for(n).unwrap())
        .collect();
    let mut page = vec![0u8; 8192];
    a.write_at(0, &page, false).unwrap();
    a.read_at(0, &mut page).unwrap();
    a.read_at(0, &mut page[..4096]).unwrap();
    b1.read_at(0, &mut page).unwrap();
    b2.read_at(0, &mut page).unwrap();
    // A read past the end (sent raw: the client checks bounds itself): an error, on "b"
    // alone, and a request and a reply there.
    let mut raw_b = h.raw();
    info(&mut raw_b, OPT_GO, "b").unwrap();
    let past = Request {
        flags: 0,
        kind: CMD_READ,
        cookie: 9,
        offset: 2 << 20,
        length: 4096,
    };
    raw_b.write_all(&past.encode()).unwrap();
    let head = read_n(&mut raw_b, SIMPLE_REPLY_LEN);
    assert_eq!(
        SimpleReply::decode(&head.try_into().unwrap())
            .unwrap()
            .error,
        EINVAL
    );
    let sa = h.server.stats_for("a").unwrap();
    let sb = h.server.stats_for("b").unwrap();
    let sc = h.server.stats_for("c").unwrap();
    assert_eq!(sa.requests - before[0].requests, 3);
    assert_eq!(sa.replies - before[0].replies, 3);
    assert_eq!(
        (
            sa.bytes_written,
            sa.bytes_read - before[0].bytes_read,
            sa.errors
        ),
        (8192, 8192 + 4096, 0)
    );
    assert_eq!(sb.bytes_written, 0);
    assert_eq!(sb.bytes_read - before[1].bytes_read, 2 * 8192);
    assert_eq!(sb.errors, 1);
    assert_eq!(sb.requests - before[1].requests, 3);
    assert_eq!(
        (
            sa.live_connections,
            sb.live_connections,
            sc.live_connections
        ),
        (1, 3, 0)
    );
    assert_eq!((sa.connections, sb.connections, sc.connections), (1, 3, 0));
    // The server's totals are the sum.
    let total = h.server.stats();
    assert_eq!(
        total.bytes_read.load(Relaxed),
        sa.bytes_read + sb.bytes_read + sc.bytes_read
    );
    assert_eq!(
        total.requests.load(Relaxed),
        sa.requests + sb.requests + sc.requests
    );
    assert_eq!(total.errors.load(Relaxed), 1);
    drop((a, b1, b2, raw_b));
    wait_for("the clients' ends", || {
        h.server.stats_for("b").unwrap().live_connections == 0
            && h.server.stats_for("a").unwrap().live_connections == 0
    });
    assert_eq!(h.server.stats_for("b").unwrap().connections, 3);
}
