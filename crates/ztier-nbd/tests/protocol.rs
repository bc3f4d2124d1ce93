//! The server at the protocol level, over Unix sockets, against an in-memory device: the
//! handshake and every option, every command with simple and structured replies, and the
//! bad inputs that must get the protocol's error (or a closed connection where the spec says
//! so) while every other connection and everything stored goes on.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ztier_blockdev::{check_range, BlockDevice, BlockError, Extent};
use ztier_nbd::proto::*;
use ztier_nbd::{Listener, Server, ServerConfig};

/// A RAM disk that remembers which 4 KiB blocks were written.
struct MemDevice {
    bytes: RwLock<(Vec<u8>, Vec<bool>)>,
}

impl MemDevice {
    fn new(size: usize) -> MemDevice {
        MemDevice {
            bytes: RwLock::new((vec![0; size], vec![false; size / 4096])),
        }
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.bytes.read().unwrap().0.len() as u64
    }
    fn block_size(&self) -> u32 {
        4096
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        check_range(self.size(), offset, buf.len() as u64)?;
        let g = self.bytes.read().unwrap();
        buf.copy_from_slice(&g.0[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), BlockError> {
        check_range(self.size(), offset, data.len() as u64)?;
        let mut g = self.bytes.write().unwrap();
        g.0[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        for b in offset / 4096..(offset + data.len() as u64).div_ceil(4096) {
            g.1[b as usize] = true;
        }
        Ok(())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.write_zeroes(offset, len, true)
    }
    fn write_zeroes(&self, offset: u64, len: u64, unmap: bool) -> Result<(), BlockError> {
        check_range(self.size(), offset, len)?;
        let mut g = self.bytes.write().unwrap();
        g.0[offset as usize..(offset + len) as usize].fill(0);
        if unmap {
            for b in offset.div_ceil(4096)..(offset + len) / 4096 {
                g.1[b as usize] = false;
            }
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(self.size(), offset, len)?;
        let g = self.bytes.read().unwrap();
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let upto = ((at / 4096 + 1) * 4096).min(offset + len);
            let written = g.1[(at / 4096) as usize];
            match out.last_mut() {
                Some(e) if e.hole != written => e.len += upto - at,
                _ => out.push(Extent {
                    len: upto - at,
                    hole: !written,
                    zero: !written,
                }),
            }
            at = upto;
        }
        Ok(out)
    }
}

const SIZE: usize = 1 << 20;

struct Harness {
    server: Arc<Server>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Harness {
    fn new(name: &str, config: ServerConfig) -> Harness {
        let dir = std::env::temp_dir().join(format!("ztier-nbd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.sock"));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let server = Server::new(Arc::new(MemDevice::new(SIZE)), config);
        let s = Arc::clone(&server);
        let thread = std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());
        Harness {
            server,
            path,
            thread: Some(thread),
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        export_name: "disk".into(),
        ..ServerConfig::default()
    }
}

/// How long a test waits for the server to close a connection it must close. The server
/// closes at once; this only bounds how long a server that wrongly stays open and silent
/// takes to fail the test (a server that wrongly answers fails it at once).
const CLOSE_WITHIN: Duration = Duration::from_secs(2);

/// Asserts the server has closed `s` with nothing more to say: the read side ends, with no
/// further byte, within [`CLOSE_WITHIN`]. The end is end-of-file, or a reset when the server
/// closed with bytes of ours still unread (a Unix socket's peer sees ECONNRESET then).
fn assert_closed(s: &mut UnixStream, what: &str) {
    s.set_read_timeout(Some(CLOSE_WITHIN)).unwrap();
    // One read: a byte fails the test at once, without waiting for a close that may not come.
    let mut buf = [0u8; 32];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!(
            "{what}: the server sent bytes instead of closing: {:02x?}",
            &buf[..n]
        ),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            panic!("{what}: the connection is still open after {CLOSE_WITHIN:?}")
        }
        Err(e) => panic!("{what}: {e}"),
    }
}

/// Bytes sent to a server that may already have closed the connection (which is what the
/// caller then checks with [`assert_closed`]), so a write refused for that is no failure.
fn send_to_closing(s: &mut UnixStream, bytes: &[u8]) {
    match s.write_all(bytes) {
        Ok(()) => {}
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {}
        Err(e) => panic!("write: {e}"),
    }
}

/// An option as sent: magic, option, length, data.
fn option_bytes(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend(opt.to_be_bytes());
    v.extend((data.len() as u32).to_be_bytes());
    v.extend(data);
    v
}

fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut b = vec![0; n];
    s.read_exact(&mut b).unwrap();
    b
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b[..2].try_into().unwrap())
}

/// Greeting read, client flags sent.
fn start(s: &mut UnixStream) {
    let g = read_n(s, 18);
    assert_eq!((be64(&g), be64(&g[8..])), (NBDMAGIC, IHAVEOPT));
    assert_eq!(be16(&g[16..]), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
}

fn send_option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    s.write_all(&option_bytes(opt, data)).unwrap();
}

/// One option reply: (type, data).
fn option_reply(s: &mut UnixStream, opt: u32) -> (u32, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(be64(&h), REP_MAGIC);
    assert_eq!(be32(&h[8..]), opt);
    let len = be32(&h[16..]) as usize;
    (be32(&h[12..]), read_n(s, len))
}

/// Replies up to the ACK, or the first error.
fn option_replies(s: &mut UnixStream, opt: u32) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    loop {
        let r = option_reply(s, opt);
        let end = r.0 == REP_ACK || r.0 & (1 << 31) != 0;
        out.push(r);
        if end {
            return out;
        }
    }
}

/// A connection in transmission: structured replies and base:allocation if asked.
fn open(h: &Harness, structured: bool) -> UnixStream {
    let mut s = h.connect();
    start(&mut s);
    if structured {
        send_option(&mut s, OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(option_replies(&mut s, OPT_STRUCTURED_REPLY)[0].0, REP_ACK);
        let q = MetaContextRequest {
            export: "disk".into(),
            queries: vec![BASE_ALLOCATION.into()],
        };
        send_option(&mut s, OPT_SET_META_CONTEXT, &q.encode());
        let r = option_replies(&mut s, OPT_SET_META_CONTEXT);
        assert_eq!(r[0].0, REP_META_CONTEXT);
        assert_eq!(be32(&r[0].1), BASE_ALLOCATION_ID);
    }
    let go = InfoRequest {
        export: "disk".into(),
        infos: vec![INFO_BLOCK_SIZE],
    };
    send_option(&mut s, OPT_GO, &go.encode());
    let r = option_replies(&mut s, OPT_GO);
    assert_eq!(r.last().unwrap().0, REP_ACK);
    s
}

fn request(
    s: &mut UnixStream,
    kind: u16,
    flags: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    payload: &[u8],
) {
    let r = Request {
        flags,
        kind,
        cookie,
        offset,
        length,
    };
    let mut v = r.encode().to_vec();
    v.extend(payload);
    s.write_all(&v).unwrap();
}

/// A simple reply: (error, cookie), reading `data_len` bytes of data after a success.
fn simple(s: &mut UnixStream, data_len: usize) -> (u32, u64, Vec<u8>) {
    let h = read_n(s, 16);
    assert_eq!(be32(&h), SIMPLE_REPLY_MAGIC);
    let err = be32(&h[4..]);
    let data = if err == 0 {
        read_n(s, data_len)
    } else {
        Vec::new()
    };
    (err, be64(&h[8..]), data)
}

/// One structured chunk: (flags, type, cookie, payload).
fn chunk(s: &mut UnixStream) -> (u16, u16, u64, Vec<u8>) {
    let h = read_n(s, 20);
    assert_eq!(be32(&h), STRUCTURED_REPLY_MAGIC);
    let len = be32(&h[16..]) as usize;
    (be16(&h[4..]), be16(&h[6..]), be64(&h[8..]), read_n(s, len))
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    ztier_base::pattern::pattern(seed, len)
}

#[test]
fn options_are_answered_as_the_spec_says() {
    let h = Harness::new("options", config());
    let mut s = h.connect();
    start(&mut s);
    send_option(&mut s, OPT_LIST, &[]);
    let r = option_replies(&mut s, OPT_LIST);
    assert_eq!(r[0].0, REP_SERVER);
    assert_eq!(&r[0].1[4..], b"disk");
    send_option(&mut s, OPT_LIST, b"x");
    assert_eq!(option_reply(&mut s, OPT_LIST).0, REP_ERR_INVALID);
    send_option(&mut s, 999, b"whatever");
    assert_eq!(option_reply(&mut s, 999).0, REP_ERR_UNSUP);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s, OPT_STARTTLS).0, REP_ERR_UNSUP);
    let bad = InfoRequest {
        export: "nope".into(),
        infos: vec![],
    };
    send_option(&mut s, OPT_INFO, &bad.encode());
    assert_eq!(option_reply(&mut s, OPT_INFO).0, REP_ERR_UNKNOWN);
    send_option(&mut s, OPT_INFO, &[0, 0, 0, 9, 1]);
    assert_eq!(
        option_reply(&mut s, OPT_INFO).0,
        REP_ERR_INVALID,
        "truncated data"
    );
    // SET_META_CONTEXT needs structured replies first.
    let q = MetaContextRequest {
        export: "disk".into(),
        queries: vec![BASE_ALLOCATION.into()],
    };
    send_option(&mut s, OPT_SET_META_CONTEXT, &q.encode());
    assert_eq!(
        option_reply(&mut s, OPT_SET_META_CONTEXT).0,
        REP_ERR_INVALID
    );
    send_option(
        &mut s,
        OPT_LIST_META_CONTEXT,
        &MetaContextRequest {
            export: "disk".into(),
            queries: vec![],
        }
        .encode(),
    );
    let r = option_replies(&mut s, OPT_LIST_META_CONTEXT);
    assert_eq!(r[0].0, REP_META_CONTEXT);
    assert_eq!(&r[0].1[4..], BASE_ALLOCATION.as_bytes());
    // INFO: the export, its block sizes, and the name when asked.
    let info = InfoRequest {
        export: "".into(),
        infos: vec![INFO_NAME, INFO_BLOCK_SIZE],
    };
    send_option(&mut s, OPT_INFO, &info.encode());
    let r = option_replies(&mut s, OPT_INFO);
    let export = r
        .iter()
        .find(|(t, d)| *t == REP_INFO && be16(d) == INFO_EXPORT)
        .unwrap();
    assert_eq!(be64(&export.1[2..]), SIZE as u64);
    let flags = be16(&export.1[10..]);
    for f in [
        FLAG_HAS_FLAGS,
        FLAG_SEND_FLUSH,
        FLAG_SEND_FUA,
        FLAG_SEND_TRIM,
        FLAG_SEND_WRITE_ZEROES,
        FLAG_CAN_MULTI_CONN,
        FLAG_SEND_CACHE,
    ] {
        assert!(flags & f != 0, "flag {f:#x} in {flags:#x}");
    }
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    let block = r
        .iter()
        .find(|(t, d)| *t == REP_INFO && be16(d) == INFO_BLOCK_SIZE)
        .unwrap();
    assert_eq!(
        (
            be32(&block.1[2..]),
            be32(&block.1[6..]),
            be32(&block.1[10..])
        ),
        (512, 4096, 32 << 20)
    );
    assert!(r
        .iter()
        .any(|(t, d)| *t == REP_INFO && be16(d) == INFO_NAME && &d[2..] == b"disk"));
    send_option(&mut s, OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut s, OPT_ABORT).0, REP_ACK);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "closed after ABORT");
}

#[test]
fn export_name_and_simple_replies() {
    let h = Harness::new("simple", config());
    let mut s = h.connect();
    start(&mut s);
    send_option(&mut s, OPT_EXPORT_NAME, b"disk");
    let r = read_n(&mut s, 10);
    assert_eq!(be64(&r), SIZE as u64);
    let data = pattern(1, 8192);
    request(&mut s, CMD_WRITE, CMD_FLAG_FUA, 1, 4096, 8192, &data);
    assert_eq!(simple(&mut s, 0), (0, 1, vec![]));
    request(&mut s, CMD_READ, 0, 2, 4096 + 100, 1000, &[]);
    assert_eq!(simple(&mut s, 1000), (0, 2, data[100..1100].to_vec()));
    request(&mut s, CMD_FLUSH, 0, 3, 0, 0, &[]);
    assert_eq!(simple(&mut s, 0).0, 0);
    request(&mut s, CMD_TRIM, 0, 4, 4096, 4096, &[]);
    assert_eq!(simple(&mut s, 0).0, 0);
    request(&mut s, CMD_READ, 0, 5, 4096, 4096, &[]);
    assert_eq!(simple(&mut s, 4096).2, vec![0; 4096]);
    request(&mut s, CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 6, 8192, 10, &[]);
    assert_eq!(simple(&mut s, 0).0, 0);
    request(&mut s, CMD_READ, 0, 7, 8192, 16, &[]);
    let mut expect = data[4096..4112].to_vec();
    expect[..10].fill(0);
    assert_eq!(simple(&mut s, 16).2, expect);
    request(&mut s, CMD_CACHE, 0, 8, 0, 4096, &[]);
    assert_eq!(simple(&mut s, 0).0, 0);
    // Block status without a negotiated context: EINVAL.
    request(&mut s, CMD_BLOCK_STATUS, 0, 9, 0, 4096, &[]);
    assert_eq!(simple(&mut s, 0).0, EINVAL);
    request(&mut s, CMD_DISC, 0, 10, 0, 0, &[]);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
}

#[test]
fn structured_replies_and_block_status() {
    let h = Harness::new("structured", config());
    let mut s = open(&h, true);
    request(&mut s, CMD_WRITE, 0, 1, 8192, 4096, &pattern(2, 4096));
    let (flags, kind, cookie, _) = chunk(&mut s);
    assert_eq!((flags, kind, cookie), (REPLY_FLAG_DONE, REPLY_TYPE_NONE, 1));
    request(&mut s, CMD_READ, CMD_FLAG_DF, 2, 8192, 4096, &[]);
    let (flags, kind, cookie, payload) = chunk(&mut s);
    assert_eq!(
        (flags, kind, cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 2)
    );
    assert_eq!(be64(&payload), 8192);
    assert_eq!(payload[8..], pattern(2, 4096)[..]);
    request(&mut s, CMD_BLOCK_STATUS, 0, 3, 0, 4 * 4096, &[]);
    let (_, kind, _, payload) = chunk(&mut s);
    assert_eq!(kind, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(be32(&payload), BASE_ALLOCATION_ID);
    let descriptors: Vec<(u32, u32)> = payload[4..]
        .chunks(8)
        .map(|d| (be32(d), be32(&d[4..])))
        .collect();
    assert_eq!(
        descriptors,
        vec![
            (8192, STATE_HOLE | STATE_ZERO),
            (4096, 0),
            (4096, STATE_HOLE | STATE_ZERO)
        ]
    );
    request(
        &mut s,
        CMD_BLOCK_STATUS,
        CMD_FLAG_REQ_ONE,
        4,
        0,
        4 * 4096,
        &[],
    );
    let (_, _, _, payload) = chunk(&mut s);
    assert_eq!(payload.len(), 4 + 8, "one descriptor");
    // nbdkit's CVE-2025-47712 case: a length running one byte past the end.
    request(
        &mut s,
        CMD_BLOCK_STATUS,
        0,
        5,
        SIZE as u64 - 4096,
        4097,
        &[],
    );
    let (flags, kind, cookie, payload) = chunk(&mut s);
    assert_eq!(
        (flags, kind, cookie),
        (REPLY_FLAG_DONE, REPLY_TYPE_ERROR, 5)
    );
    assert_eq!(be32(&payload), EINVAL);
    // An error reply carries the message.
    request(&mut s, CMD_READ, 0, 6, SIZE as u64, 1, &[]);
    let (_, kind, _, payload) = chunk(&mut s);
    assert_eq!((kind, be32(&payload)), (REPLY_TYPE_ERROR, EINVAL));
    assert!(String::from_utf8_lossy(&payload[6..]).contains("past the end"));
}

#[test]
fn bad_requests_get_errors_and_the_connection_goes_on() {
    let h = Harness::new("bad", config());
    let mut s = open(&h, false);
    let cases: [(u16, u16, u64, u32, u32); 7] = [
        (CMD_READ, 0, SIZE as u64 - 512, 1024, EINVAL),
        (CMD_WRITE, 0, SIZE as u64 - 512, 1024, ENOSPC),
        (CMD_WRITE, 0, u64::MAX - 511, 512, ENOSPC),
        (CMD_TRIM, 0, SIZE as u64, 512, EINVAL),
        (CMD_READ, 1 << 9, 0, 512, EINVAL),
        (77, 0, 0, 512, EINVAL),
        (CMD_READ, 0, 100, 512, EINVAL),
    ];
    for (i, (kind, flags, offset, length, err)) in cases.into_iter().enumerate() {
        let payload = if kind == CMD_WRITE {
            vec![7u8; length as usize]
        } else {
            vec![]
        };
        request(&mut s, kind, flags, i as u64, offset, length, &payload);
        let (got, cookie, _) = simple(&mut s, 0);
        assert_eq!((got, cookie), (err, i as u64), "case {i}");
    }
    // A write longer than the maximum payload: its payload is read past, the request
    // refused, and the connection keeps working.
    let big = (32 << 20) + 512;
    request(&mut s, CMD_WRITE, 0, 100, 0, big, &vec![1u8; big as usize]);
    assert_eq!(simple(&mut s, 0), (EINVAL, 100, vec![]));
    // Write-zeroes longer than the payload limit is fine: it carries no payload.
    request(&mut s, CMD_WRITE_ZEROES, 0, 101, 0, SIZE as u32, &[]);
    assert_eq!(simple(&mut s, 0).0, 0);
    request(&mut s, CMD_READ, 0, 102, 0, 512, &[]);
    assert_eq!(simple(&mut s, 512), (0, 102, vec![0; 512]));
    // Every request read was answered, the refused ones too.
    assert_replies(&h, 10, 10);
    // A bad magic ends the connection (the stream cannot be trusted past it). A good
    // request follows it: a server that skipped the bad header, or looked for the next
    // magic, would answer that one instead of closing.
    let mut bad = vec![0u8; REQUEST_LEN];
    bad.extend(
        Request {
            flags: 0,
            kind: CMD_READ,
            cookie: 103,
            offset: 0,
            length: 512,
        }
        .encode(),
    );
    send_to_closing(&mut s, &bad);
    assert_closed(&mut s, "after a bad magic");
    // Other connections are served.
    let mut t = open(&h, false);
    request(&mut t, CMD_READ, 0, 1, 0, 512, &[]);
    assert_eq!(simple(&mut t, 512).0, 0);
}

#[test]
fn a_write_cut_short_stores_nothing_and_vanishing_clients_hurt_no_one() {
    let h = Harness::new("cut", config());
    let mut s = open(&h, false);
    request(&mut s, CMD_WRITE, 0, 1, 0, 8192, &pattern(3, 8192));
    assert_eq!(simple(&mut s, 0).0, 0);
    // Half a payload, then gone.
    request(&mut s, CMD_WRITE, 0, 2, 0, 8192, &vec![0xEE; 4096]);
    drop(s);
    // Requests in flight, then gone without reading the replies.
    let mut v = open(&h, false);
    for i in 0..64 {
        request(&mut v, CMD_READ, 0, i, 0, 65536, &[]);
    }
    drop(v);
    let mut t = open(&h, false);
    request(&mut t, CMD_READ, 0, 3, 0, 8192, &[]);
    assert_eq!(simple(&mut t, 8192), (0, 3, pattern(3, 8192)));
}

#[test]
fn a_truncated_or_foreign_handshake_ends_only_that_connection() {
    let h = Harness::new("handshake", config());
    // Cut short: the client hangs up before its flags are whole.
    for junk in [&b""[..], &b"\x00\x00"[..]] {
        let mut s = h.connect();
        read_n(&mut s, 18);
        s.write_all(junk).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        assert_closed(&mut s, &format!("handshake cut short after {junk:?}"));
    }
    // Foreign: flags no NBD client sends, the client still there. The first is followed by
    // an option a server that took the flags would answer.
    let mut bad_flags = vec![0xff; 4];
    bad_flags.extend(option_bytes(OPT_LIST, &[]));
    for junk in [&bad_flags[..], &b"GET / HTTP/1.1\r\n\r\n"[..]] {
        let mut s = h.connect();
        read_n(&mut s, 18);
        send_to_closing(&mut s, junk);
        assert_closed(&mut s, &format!("foreign handshake {junk:?}"));
    }
    // An unknown export through EXPORT_NAME closes the connection. An option follows it: a
    // server that went on haggling would answer it, one that went on to transmission would
    // send the export's size first.
    let mut s = h.connect();
    start(&mut s);
    let mut v = option_bytes(OPT_EXPORT_NAME, b"other");
    v.extend(option_bytes(OPT_LIST, &[]));
    send_to_closing(&mut s, &v);
    assert_closed(&mut s, "EXPORT_NAME of an unknown export");
    // Only those connections ended: the next is served.
    let mut t = open(&h, true);
    request(&mut t, CMD_READ, 0, 1, 0, 512, &[]);
    assert_eq!(chunk(&mut t).1, REPLY_TYPE_OFFSET_DATA);
}

/// A connection taken through EXPORT_NAME to transmission, or `None` if the server turned it
/// away (greeted it, then closed).
fn try_open(h: &Harness) -> Option<UnixStream> {
    let mut s = h.connect();
    read_n(&mut s, 18);
    let mut v = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    v.extend(option_bytes(OPT_EXPORT_NAME, b"disk"));
    let mut export = [0u8; 10];
    match s.write_all(&v).and_then(|()| s.read_exact(&mut export)) {
        Ok(()) => {
            assert_eq!(be64(&export), SIZE as u64);
            Some(s)
        }
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ) =>
        {
            None
        }
        Err(e) => panic!("handshake: {e}"),
    }
}

#[test]
fn connections_past_the_limit_are_turned_away() {
    let h = Harness::new(
        "limit",
        ServerConfig {
            max_connections: 2,
            ..config()
        },
    );
    let refused = || h.server.stats().refused_connections.load(Relaxed);
    let a = open(&h, false);
    let b = open(&h, false);
    // Greeted and closed, before anything it sends is read: a server that served it would
    // answer the option.
    let mut c = h.connect();
    read_n(&mut c, 18);
    let mut v = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    v.extend(option_bytes(OPT_LIST, &[]));
    send_to_closing(&mut c, &v);
    assert_closed(&mut c, "a third connection of two allowed");
    assert_eq!(refused(), 1);
    // The server frees a place when it sees a and b hang up, on their own threads: connect
    // until one is taken in. Every attempt before it must have been turned away, counted.
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut turned_away = 0;
    let mut d = loop {
        if let Some(d) = try_open(&h) {
            break d;
        }
        turned_away += 1;
        assert!(
            Instant::now() < deadline,
            "no place freed 10 s after both connections ended ({turned_away} turned away)"
        );
    };
    request(&mut d, CMD_FLUSH, 0, 1, 0, 0, &[]);
    assert_eq!(simple(&mut d, 0).0, 0);
    assert_eq!(refused(), 1 + turned_away);
}

#[test]
fn read_only_refuses_changes() {
    let h = Harness::new(
        "ro",
        ServerConfig {
            read_only: true,
            ..config()
        },
    );
    let mut s = open(&h, false);
    request(&mut s, CMD_WRITE, 0, 1, 0, 512, &[1; 512]);
    assert_eq!(simple(&mut s, 0).0, EPERM);
    request(&mut s, CMD_TRIM, 0, 2, 0, 512, &[]);
    assert_eq!(simple(&mut s, 0).0, EPERM);
    request(&mut s, CMD_READ, 0, 3, 0, 512, &[]);
    assert_eq!(simple(&mut s, 512), (0, 3, vec![0; 512]));
}

#[test]
fn many_requests_in_flight_are_all_answered() {
    let h = Harness::new("inflight", config());
    let mut s = open(&h, true);
    let mut writer = s.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..256u64 {
            let off = (i % 64) * 4096;
            request(&mut writer, CMD_WRITE, 0, i, off, 4096, &pattern(i, 4096));
        }
    });
    let mut seen = std::collections::HashSet::new();
    for _ in 0..256 {
        let (flags, kind, cookie, _) = chunk(&mut s);
        assert_eq!((flags, kind), (REPLY_FLAG_DONE, REPLY_TYPE_NONE));
        assert!(seen.insert(cookie));
    }
    sender.join().unwrap();
    assert_eq!(seen.len(), 256);
    assert_replies(&h, 256, 256);
}

/// The server's `requests` and `replies` reach these counts (a reply is counted just after
/// it is sent, so the client may read it first).
fn assert_replies(h: &Harness, requests: u64, replies: u64) {
    let stats = h.server.stats();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stats.replies.load(Relaxed) < replies && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(
        (stats.requests.load(Relaxed), stats.replies.load(Relaxed)),
        (requests, replies)
    );
}

/// A read reply larger than a Unix socket's default send buffer goes out whole while the
/// client has read none of it: the server asks for a larger buffer (`unix_send_buffer`), so
/// its sender does not stop partway and hold the connection's writer. With the system's
/// size the same reply stays unsent, which shows the test can tell.
#[test]
fn a_large_reply_goes_out_before_the_client_reads() {
    const REPLY: u32 = 320 << 10;
    let replied_unread = |unix_send_buffer: usize| -> bool {
        let h = Harness::new(
            &format!("sndbuf{unix_send_buffer}"),
            ServerConfig {
                unix_send_buffer,
                ..config()
            },
        );
        let mut s = open(&h, false);
        request(&mut s, CMD_READ, 0, 1, 0, REPLY, &[]);
        let stats = h.server.stats();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while stats.replies.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let replied = stats.replies.load(Relaxed) == 1;
        // Read it now: the reply is whole either way.
        assert_eq!(simple(&mut s, REPLY as usize).0, 0);
        replied
    };
    assert!(
        replied_unread(ServerConfig::default().unix_send_buffer),
        "a {REPLY}-byte reply waited for the client with the server's send buffer"
    );
    let system_default: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_default")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(usize::MAX);
    if system_default < REPLY as usize {
        assert!(
            !replied_unread(0),
            "a {REPLY}-byte reply went out unread with the system's {system_default}-byte buffer"
        );
    } else {
        eprintln!(
            "net.core.wmem_default is {system_default} bytes: the system's own buffer holds \
             the reply, so the control case tells nothing here and is not run"
        );
    }
}
