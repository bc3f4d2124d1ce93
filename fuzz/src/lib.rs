//! The checks behind every fuzz target: a decompressor is total (any input gives Ok or Err,
//! never a panic, an overrun or a hang, and never more output than room; lz4's also agrees
//! with liblz4 on every block both accept, lzo's with liblzo2), every compressor
//! round-trips whatever it is given, and the readers of outside input (the NBD server and
//! client, a saved zram state, control requests, a capture's trace) answer or refuse it.

use ztier_compress::{worst_case_len, Algorithm};

/// Output room: the largest page ztier stores.
const OUT: usize = 16384;

pub fn decompress_is_total(alg: &str, data: &[u8]) {
    let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
    let mut out = vec![0u8; OUT];
    let ours = c.decompress(data, &mut out);
    if let Ok(n) = ours {
        assert!(n <= OUT);
    }
    if alg == "lz4" {
        // liblz4 refuses some blocks ztier reads (a match in the last 5 input bytes) and
        // reads one kind ztier refuses (a zero offset); any block both read decodes the same.
        let mut lib = vec![0u8; OUT];
        match (
            &ours,
            ztier_compress::liblz4::decompress_safe(data, &mut lib),
        ) {
            (Ok(n), Some(m)) => {
                assert_eq!(m, *n);
                assert_eq!(lib[..*n], out[..*n]);
            }
            (Err(e), Some(_)) => assert!(
                e.to_string().contains("match offset outside the output"),
                "liblz4 reads a block ztier refuses: {e}"
            ),
            _ => {}
        }
    }
    if alg == "lzo" && data.first() != Some(&17) {
        // liblzo2 reads plain LZO1X the same way; a stream opening with 17 is the kernel's
        // versioned (lzo-rle) header to ztier and a literal run to liblzo2.
        let mut lib = vec![0u8; OUT];
        match (
            ours.as_ref().ok().copied(),
            ztier_reference::liblzo2::decompress_safe(data, &mut lib),
        ) {
            (Some(n), Some(m)) => {
                assert_eq!(m, n);
                assert_eq!(lib[..n], out[..n]);
            }
            (None, None) => {}
            // The kernel's decoder, which ztier follows, also requires the end marker's
            // length to be 3 (`t != 3` at eof_found); liblzo2 does not look.
            (None, Some(_)) if format!("{ours:?}").contains("malformed end marker") => {}
            (n, m) => panic!("ztier decoded {n:?} bytes ({ours:?}), liblzo2 {m:?}"),
        }
    }
    // A short output buffer must be refused, not overrun.
    let mut small = vec![0u8; 64];
    if let Ok(n) = c.decompress(data, &mut small) {
        assert!(n <= 64);
    }
}

pub fn round_trips(alg: &str, data: &[u8]) {
    let data = &data[..data.len().min(OUT)];
    let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
    let mut comp = vec![0u8; worst_case_len(data.len())];
    let n = c.compress(data, &mut comp).expect("compress");
    let mut back = vec![0u8; data.len()];
    let m = c
        .decompress(&comp[..n], &mut back)
        .expect("decompress own output");
    assert_eq!(m, data.len());
    assert_eq!(back, data);
    if alg == "lz4" {
        // The kernel variant writes standard LZ4 blocks: liblz4 must read them.
        let mut lib = vec![0u8; data.len()];
        assert_eq!(
            ztier_compress::liblz4::decompress_safe(&comp[..n], &mut lib),
            Some(data.len())
        );
        assert_eq!(lib, data);
    }
}

/// Arbitrary malloc / write / read / free / stale-free / invented-handle / compact sequences
/// on zsmalloc (any chain size, both page sizes) and zblock, checked against a model by
/// `ztier_pool::testing::run_model`: under AddressSanitizer, no sequence of calls to the
/// pools' safe API may touch memory outside live pages.
pub fn pool_model(data: &[u8]) {
    use ztier_pool::testing::{run_model, ModelOp};
    use ztier_pool::{ChainRule, ZblockConfig, ZblockPool, ZsConfig, ZsPool};
    let Some((&layout, mut rest)) = data.split_first() else {
        return;
    };
    let mut ops = Vec::new();
    while rest.len() >= 9 && ops.len() < 2000 {
        let (op, tail) = rest.split_at(9);
        rest = tail;
        let arg = u64::from_le_bytes(op[1..9].try_into().expect("8 bytes"));
        let pick = arg as usize;
        ops.push(match op[0] % 8 {
            0 | 1 => ModelOp::Store {
                len: pick,
                seed: arg >> 16,
            },
            2 => ModelOp::Rewrite {
                pick,
                seed: arg >> 8,
            },
            3 => ModelOp::Read { pick },
            4 => ModelOp::Free { pick },
            5 => ModelOp::FreeStale { pick },
            6 => ModelOp::Bogus { raw: arg },
            _ => ModelOp::Compact,
        });
    }
    let page_size = if layout & 0x80 != 0 { 16384 } else { 4096 };
    if layout & 0x40 != 0 {
        let pool = ZblockPool::new(ZblockConfig {
            page_size,
            odd_blocks: layout & 0x20 != 0,
            ..ZblockConfig::default()
        })
        .expect("valid layout");
        run_model(&pool, &ops, |p| {
            p.block_stats()
                .iter()
                .map(|r| r.blocks * r.pages_per_block as u64)
                .sum()
        });
    } else {
        let pool = ZsPool::new(ZsConfig {
            page_size,
            chain_size: 1 + (layout & 0x0f) as usize,
            chain_rule: if layout & 0x10 != 0 {
                ChainRule::UsedPercent
            } else {
                ChainRule::LeastWaste
            },
        })
        .expect("valid layout");
        run_model(&pool, &ops, |p| {
            p.class_stats().iter().map(|r| r.pages_used).sum()
        });
    }
}

/// Arbitrary bytes from a client, through the whole server: the handshake, options and
/// requests are parsed and run on a small zram device, and whatever comes in, the server
/// answers or closes, never panics or hangs. Half the inputs start with a valid handshake
/// (structured replies and base:allocation negotiated, then GO), so the request parser and
/// the commands are reached, not only the greeting.
pub fn nbd_server(data: &[u8]) {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, OnceLock};
    use ztier_nbd::proto::*;
    use ztier_nbd::{Server, ServerConfig, Stream};

    static SERVER: OnceLock<Arc<Server>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        let pool = ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool");
        let dev = ztier_zram::Device::new(1 << 20, "lz4".parse().expect("lz4"), Box::new(pool))
            .expect("device");
        Server::new(
            Arc::new(dev) as Arc<dyn ztier_blockdev::BlockDevice>,
            ServerConfig {
                export_name: "fuzz".into(),
                workers_per_connection: 2,
                max_payload: 1 << 20,
                ..ServerConfig::default()
            },
        )
    });
    let (mut client, server_end) = UnixStream::pair().expect("socketpair");
    let mut input = Vec::new();
    if data.first().is_some_and(|b| b & 1 == 1) {
        input.extend((FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        let mut option = |opt: u32, body: &[u8]| {
            input.extend(IHAVEOPT.to_be_bytes());
            input.extend(opt.to_be_bytes());
            input.extend((body.len() as u32).to_be_bytes());
            input.extend(body);
        };
        option(OPT_STRUCTURED_REPLY, &[]);
        let meta = MetaContextRequest {
            export: "fuzz".into(),
            queries: vec![BASE_ALLOCATION.into()],
        };
        option(OPT_SET_META_CONTEXT, &meta.encode());
        let go = InfoRequest {
            export: "fuzz".into(),
            infos: vec![INFO_BLOCK_SIZE],
        };
        option(OPT_GO, &go.encode());
        input.extend(&data[1..]);
    } else {
        input.extend(data);
    }
    // Drain the replies so the server never blocks on a full socket.
    let mut reader = client.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    let feeder = std::thread::spawn(move || {
        let _ = client.write_all(&input);
        let _ = client.shutdown(std::net::Shutdown::Write);
    });
    server.handle(1, Stream::from(server_end));
    feeder.join().expect("feeder");
    drain.join().expect("drain");
}

/// The NBD client against a hostile server: `data` is everything the server says (after a
/// valid greeting and a valid NBD_OPT_GO exchange when the first byte is odd, so the
/// transmission phase is reached too). The client must end every call with a value or an
/// error: no panic, no hang, no unbounded allocation.
pub fn nbd_client(data: &[u8]) {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use ztier_blockdev::BlockDevice;
    use ztier_nbd::proto::*;
    use ztier_nbd::{Client, Stream};

    let (client_end, mut server_end) = UnixStream::pair().expect("socketpair");
    client_end
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let mut said = Vec::new();
    if data.first().is_some_and(|b| b & 1 == 1) {
        said.extend(NBDMAGIC.to_be_bytes());
        said.extend(IHAVEOPT.to_be_bytes());
        said.extend((FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        said.extend(encode_option_reply(
            OPT_GO,
            REP_INFO,
            &info_export(1 << 20, FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_TRIM),
        ));
        said.extend(encode_option_reply(
            OPT_GO,
            REP_INFO,
            &info_block_size(512, 4096, 1 << 20),
        ));
        said.extend(encode_option_reply(OPT_GO, REP_ACK, &[]));
        said.extend(&data[1..]);
    } else {
        said.extend(data);
    }
    let server = std::thread::spawn(move || {
        let _ = server_end.write_all(&said);
        let _ = server_end.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = server_end.read_to_end(&mut sink);
    });
    let uri: ztier_nbd::Uri = "nbd+unix:///?socket=/nonexistent".parse().expect("uri");
    if let Ok(client) = Client::over_stream(Stream::from(client_end), &uri) {
        let mut buf = vec![0u8; 8192];
        let _ = client.read_at(0, &mut buf);
        let _ = client.read_at(100, &mut buf[..300]);
        let _ = client.write_at(4096, &buf[..4096], true);
        let _ = client.write_at(7, &buf[..9], false);
        let _ = client.write_zeroes(0, 5000, false);
        let _ = client.discard(0, 1 << 16);
        let _ = client.flush();
    }
    server.join().expect("server thread");
}

/// A test-only CA and a server certificate for localhost it signed (valid until 2126), for
/// the TLS fuzz target: made with openssl once and kept, so no run needs a tool.
const FUZZ_CA_CERT: &str = include_str!("../certs/ca-cert.pem");
const FUZZ_SERVER_CERT: &str = include_str!("../certs/server-cert.pem");
const FUZZ_SERVER_KEY: &str = include_str!("../certs/server-key.pem");

/// The NBD server with TLS required, fed arbitrary bytes at three depths, chosen by the
/// first byte: (0) straight from the greeting, so the option path before TLS (every option
/// refused with `NBD_REP_ERR_TLS_REQD`, STARTTLS with or without data, EXPORT_NAME
/// closing) and whatever follows a STARTTLS the input makes are reached; (1) after valid
/// client flags and `NBD_OPT_STARTTLS`, so the bytes are the TLS handshake itself (records
/// rustls must refuse without a panic, within the handshake deadline); (2, 3) after a real
/// TLS handshake by a rustls client in the harness, encrypted, so the haggling inside TLS
/// and, with (3)'s valid options and GO first, the transmission phase over the shared TLS
/// connection (reader and writer threads) see them. The server answers or closes, never
/// panics or hangs.
pub fn nbd_server_tls(data: &[u8]) {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::{Arc, OnceLock};
    use ztier_nbd::proto::*;
    use ztier_nbd::{Server, ServerConfig, ServerTls, Stream, TlsMode};

    static SERVER: OnceLock<Arc<Server>> = OnceLock::new();
    static CLIENT: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ztier-fuzz-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the certificates");
        std::fs::write(dir.join("server-cert.pem"), FUZZ_SERVER_CERT).expect("write");
        std::fs::write(dir.join("server-key.pem"), FUZZ_SERVER_KEY).expect("write");
        let tls = ServerTls::from_dir(TlsMode::Require, &dir, false).expect("test certificates");
        let _ = std::fs::remove_dir_all(&dir);
        let pool = ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool");
        let dev = ztier_zram::Device::new(1 << 20, "lz4".parse().expect("lz4"), Box::new(pool))
            .expect("device");
        Server::new(
            Arc::new(dev) as Arc<dyn ztier_blockdev::BlockDevice>,
            ServerConfig {
                export_name: "fuzz".into(),
                workers_per_connection: 2,
                max_payload: 1 << 20,
                handshake_limit: std::time::Duration::from_secs(5),
                tls,
                ..ServerConfig::default()
            },
        )
    });
    let client_config = CLIENT.get_or_init(|| {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(FUZZ_CA_CERT.as_bytes()).expect("CA"))
            .expect("CA");
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    });
    static SIGPIPE: OnceLock<()> = OnceLock::new();
    SIGPIPE.get_or_init(|| {
        // libFuzzer's main is C's, so Rust's runtime never set SIGPIPE aside as a Rust
        // program's main does: a write to a socket its peer closed (the server ending a
        // connection while the harness still writes) would kill the fuzzer instead of
        // failing with EPIPE.
        // SAFETY: setting a signal's disposition to SIG_IGN, once, before any thread here
        // writes to a socket.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
    });
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let option = |out: &mut Vec<u8>, opt: u32, body: &[u8]| {
        out.extend(IHAVEOPT.to_be_bytes());
        out.extend(opt.to_be_bytes());
        out.extend((body.len() as u32).to_be_bytes());
        out.extend(body);
    };
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let (client, server_end) = UnixStream::pair().expect("socketpair");
    let _ = client.set_read_timeout(Some(std::time::Duration::from_secs(10)));
    let peer = match mode & 3 {
        0 | 1 => {
            let mut input = Vec::new();
            if mode & 3 == 1 {
                input.extend(flags);
                option(&mut input, OPT_STARTTLS, &[]);
            }
            input.extend(rest);
            let mut reader = client.try_clone().expect("clone");
            let drain = std::thread::spawn(move || {
                let mut sink = Vec::new();
                let _ = reader.read_to_end(&mut sink);
            });
            let mut client = client;
            std::thread::spawn(move || {
                let _ = client.write_all(&input);
                let _ = client.shutdown(std::net::Shutdown::Write);
                drain.join().expect("drain");
            })
        }
        _ => {
            let mut plain = Vec::new();
            if mode & 3 == 3 {
                option(&mut plain, OPT_STRUCTURED_REPLY, &[]);
                let meta = MetaContextRequest {
                    export: "fuzz".into(),
                    queries: vec![BASE_ALLOCATION.into()],
                };
                option(&mut plain, OPT_SET_META_CONTEXT, &meta.encode());
                let go = InfoRequest {
                    export: "fuzz".into(),
                    infos: vec![INFO_BLOCK_SIZE],
                };
                option(&mut plain, OPT_GO, &go.encode());
            }
            plain.extend(rest);
            let config = Arc::clone(client_config);
            let mut sock = client;
            std::thread::spawn(move || {
                tls_client_sends(&mut sock, &flags, config, &plain);
                let _ = sock.shutdown(std::net::Shutdown::Both);
            })
        }
    };
    server.handle(1, Stream::from(server_end));
    peer.join().expect("the client thread");
}

/// The harness's TLS client: flags, STARTTLS, the TLS handshake, then `plain` encrypted,
/// while a second thread reads (and drops) whatever the server sends back.
fn tls_client_sends(
    sock: &mut std::os::unix::net::UnixStream,
    flags: &[u8],
    config: std::sync::Arc<rustls::ClientConfig>,
    plain: &[u8],
) {
    use std::io::{Read, Write};
    use ztier_nbd::proto::*;
    let mut greeting = [0u8; 18];
    if sock.read_exact(&mut greeting).is_err() || sock.write_all(flags).is_err() {
        return;
    }
    let mut starttls = IHAVEOPT.to_be_bytes().to_vec();
    starttls.extend(OPT_STARTTLS.to_be_bytes());
    starttls.extend(0u32.to_be_bytes());
    let mut reply = [0u8; 20];
    if sock.write_all(&starttls).is_err() || sock.read_exact(&mut reply).is_err() {
        return;
    }
    if u32::from_be_bytes(reply[12..16].try_into().expect("4 bytes")) != REP_ACK {
        return;
    }
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let Ok(mut conn) = rustls::ClientConnection::new(config, name) else {
        return;
    };
    while conn.is_handshaking() {
        if conn.complete_io(sock).is_err() {
            return;
        }
    }
    let Ok(mut reader) = sock.try_clone() else {
        return;
    };
    let drain = std::thread::spawn(move || {
        let mut sink = [0u8; 64 << 10];
        while matches!(reader.read(&mut sink), Ok(n) if n > 0) {}
    });
    for chunk in plain.chunks(16 << 10) {
        if conn.writer().write_all(chunk).is_err() {
            break;
        }
        while conn.wants_write() {
            if conn.write_tls(sock).is_err() {
                break;
            }
        }
    }
    conn.send_close_notify();
    while conn.wants_write() {
        if conn.write_tls(sock).is_err() {
            break;
        }
    }
    let _ = sock.shutdown(std::net::Shutdown::Write);
    drain.join().expect("drain");
}

/// A zram device of `pages` 4 KiB pages on zsmalloc, compressing with lz4.
fn lz4_device(pages: u64) -> ztier_zram::Device {
    let pool = ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool");
    ztier_zram::Device::new(pages * 4096, "lz4".parse().expect("lz4"), Box::new(pool))
        .expect("device")
}

/// Before the first input, a pool kept for the process: the arena's helper thread starts
/// with the process's first arena and ends with its last, so without one kept alive each
/// input would start and end a thread (which LeakSanitizer, at exit, takes for leaks).
pub fn keep_arena_helper() {
    static KEPT: std::sync::OnceLock<ztier_pool::ZsPool> = std::sync::OnceLock::new();
    KEPT.get_or_init(|| ztier_pool::ZsPool::new(ztier_pool::ZsConfig::default()).expect("pool"));
}

/// A saved zram state as outside input: `ztier serve --state PATH` loads whatever file it is
/// pointed at. By the first byte: the rest is the whole state; or its body after a valid
/// header (a device of 16 pages of 4096 bytes, lz4, with zstd as its one secondary
/// algorithm); or, after that header, records made from it (indexes in order, any flags,
/// priority and kind, sizes that agree with the flags, objects of the input's bytes), so the
/// records' checks and the reads of what they install are reached at once; or a real state
/// whose pages are mostly written back to a packed store, loaded with a copy of that store,
/// the input's changes XORed into the one or the other (so the places, the units, the
/// store's header and its reopening are reached). The checksum is made good, so what the
/// loader meets is a crafted file, not only a damaged one.
///
/// A load ends in a summary or a refusal; a refused load leaves the device empty; a loaded
/// device reads every page, takes writes and discards, compacts and saves again with no
/// panic (a page whose bytes do not decompress is an error, not a panic), and its saved
/// state loads into a new device holding the same.
pub fn zram_state(data: &[u8]) {
    const PAGES: u64 = 16;
    const PAGE: usize = 4096;
    let device = || {
        let dev = lz4_device(PAGES);
        dev.set_recomp_algorithms(vec!["zstd".parse().expect("zstd")])
            .expect("secondary");
        dev
    };
    let dev = device();
    let mut state = Vec::new();
    let mode = data.first().map_or(0, |b| b % 4);
    if mode == 3 {
        return zram_state_on_store(&dev, &data[1..], device);
    }
    if mode != 0 {
        let name = |state: &mut Vec<u8>, s: &str| {
            state.extend((s.len() as u16).to_le_bytes());
            state.extend(s.as_bytes());
        };
        state.extend(b"ZTIERST1");
        state.extend(2u32.to_le_bytes());
        state.extend((PAGE as u32).to_le_bytes());
        state.extend(PAGES.to_le_bytes());
        state.extend(0u32.to_le_bytes());
        name(&mut state, &dev.algorithm().to_string());
        let secondary = dev.recomp_algorithms();
        state.push(secondary.len() as u8);
        for a in &secondary {
            name(&mut state, &a.to_string());
        }
        state.push(0); // no backing store
        if mode == 1 {
            state.extend(&data[1..]);
        } else {
            state_records(&mut state, &data[1..], PAGES, PAGE);
        }
    } else {
        state.extend(data);
    }
    state.extend(crc32fast::hash(&state).to_le_bytes());

    let loaded = dev.load_state(&mut &state[..]);
    check_loaded_state(&dev, loaded.is_ok(), device);
}

/// What [`zram_state`] holds of a device after a load: refused, nothing left; loaded, every
/// page read, the state saved again and loaded into `device()` equal, then writes, discards,
/// compaction and reads.
fn check_loaded_state(
    dev: &ztier_zram::Device,
    loaded: bool,
    device: impl Fn() -> ztier_zram::Device,
) {
    let pages = dev.pages();
    let mut page = vec![0u8; dev.page_size()];
    if !loaded {
        let m = dev.mm_stat();
        assert_eq!(
            (
                m.orig_data_size,
                m.compr_data_size,
                m.mem_used_total,
                m.same_pages,
                m.huge_pages
            ),
            (0, 0, 0, 0, 0),
            "a refused state left pages behind"
        );
        return;
    }
    for i in 0..pages {
        let _ = dev.read_page(i, &mut page);
    }
    // A device with a store would save a state naming that store; saved again here only
    // without one.
    if dev.bd_stat().is_none() {
        let mut saved = Vec::new();
        dev.save_state(&mut saved).expect("a loaded state saves");
        let again = device();
        again
            .load_state(&mut &saved[..])
            .expect("a state saved from a loaded one loads");
        assert_eq!(
            again.mm_stat(),
            dev.mm_stat(),
            "the state saved again holds the same pages"
        );
    }
    page.fill(0x5a);
    for i in (0..pages).step_by(3) {
        let _ = dev.write_page(i, &page);
    }
    for i in (1..pages).step_by(3) {
        let _ = dev.discard_page(i);
    }
    dev.compact();
    for i in 0..pages {
        let _ = dev.read_page(i, &mut page);
    }
    dev.reset();
    assert_eq!(dev.mm_stat().mem_used_total, 0);
}

/// Records for [`zram_state`] made from `data`, 8 bytes a record (and an object's bytes taken
/// from what follows): page indexes in order, then any of the flags' 7 bits, any priority,
/// a kind (same-filled or stored), a size the flags agree with; then the end mark.
fn state_records(state: &mut Vec<u8>, mut data: &[u8], pages: u64, page: usize) {
    let mut index = 0u64;
    while data.len() >= 8 && index < pages {
        let (r, rest) = data.split_at(8);
        data = rest;
        let size = (u16::from_le_bytes([r[4], r[5]]) as usize % page) + 1;
        // Same-filled or stored: the header says there is no store, so a record on one
        // would only ever be refused.
        let kind = 1 + r[3] % 2;
        let size = if kind == 1 { 0 } else { size };
        let flags = size as u64 | u64::from(r[1] & 0x7f) << 16 | u64::from(r[2] % 4) << 23;
        state.extend(index.to_le_bytes());
        state.extend(flags.to_le_bytes());
        state.extend(u32::from(r[6]).to_le_bytes());
        state.push(kind);
        match kind {
            1 => {
                state.extend(u64::from_le_bytes([r[7], r[0], r[1], r[2], 0, 0, 0, 0]).to_le_bytes())
            }
            2 => {
                state.extend((size as u16).to_le_bytes());
                let take = size.min(data.len());
                state.extend(&data[..take]);
                state.resize(state.len() + size - take, r[7]);
                data = &data[take..];
            }
            _ => {
                state.extend(u64::from_le_bytes([r[7], r[0], 0, 0, 0, 0, 0, 0]).to_le_bytes());
                state.extend((size as u16).to_le_bytes());
            }
        }
        index += 1 + u64::from(r[0] % 3);
    }
    state.extend(u64::MAX.to_le_bytes());
}

/// [`zram_state`]'s fourth kind of input: a real state of a device whose pages are mostly on
/// a packed store (made once), and a fresh copy of the store as the save left it; `data`'s
/// changes (a place of 4 bytes, a value to XOR) go into the state (its checksum made good)
/// or into the store (a store that lies: a remote one, a damaged file), then the state is
/// loaded with the store. A device loaded so is not saved again (its state would name the
/// store).
fn zram_state_on_store(
    dev: &ztier_zram::Device,
    data: &[u8],
    device: impl Fn() -> ztier_zram::Device,
) {
    use std::sync::{Arc, OnceLock};
    use ztier_blockdev::{memory::MemoryDevice, BlockDevice};
    use ztier_zram::{Backing, PageSelector, WbFormat};
    const PAGE: usize = 4096;
    // The saved state and the store's bytes as the save left them.
    static SAVED: OnceLock<(Vec<u8>, Vec<u8>)> = OnceLock::new();
    let store_of = |bytes: &[u8]| {
        let store = MemoryDevice::new(bytes.len() as u64).expect("store");
        store.write_at(0, bytes, false).expect("store written");
        Arc::new(store) as Arc<dyn BlockDevice>
    };
    let (state, store_bytes) = SAVED.get_or_init(|| {
        let size = Backing::size_for(dev.pages() * PAGE as u64);
        let store = store_of(&vec![0u8; size as usize]);
        // A device like `dev` (made by the same `device`).
        let full = device();
        for i in 0..dev.pages() {
            let mut page = vec![(i % 5) as u8; PAGE];
            for (j, b) in page.iter_mut().enumerate().step_by(7) {
                *b = (i as usize * 31 + j) as u8;
            }
            full.write_page(i, &page).expect("write");
        }
        full.set_backing(Some(
            Backing::new(Arc::clone(&store), WbFormat::Packed).expect("backing"),
        ))
        .expect("set backing");
        full.mark_idle(None);
        let mut page = vec![0u8; PAGE];
        full.read_page(0, &mut page).expect("read");
        full.writeback(PageSelector::Idle, None, None)
            .expect("writeback");
        let mut state = Vec::new();
        full.save_state(&mut state).expect("save");
        let mut bytes = vec![0u8; size as usize];
        store.read_at(0, &mut bytes).expect("store read");
        (state, bytes)
    });
    let mut state = state.clone();
    let mut store_bytes = store_bytes.clone();
    let body = state.len() - 4;
    // The first byte: the changes go to the state (even) or to the store (odd: its header
    // and its segments, written-back pages among them).
    let (on_store, data) = match data.split_first() {
        Some((b, rest)) => (b & 1 == 1, rest),
        None => (false, data),
    };
    for change in data.chunks_exact(5) {
        let at = u32::from_le_bytes([change[0], change[1], change[2], change[3]]) as usize;
        if on_store {
            let len = store_bytes.len();
            store_bytes[at % len] ^= change[4];
        } else {
            state[at % body] ^= change[4];
        }
    }
    let crc = crc32fast::hash(&state[..body]);
    state[body..].copy_from_slice(&crc.to_le_bytes());
    let loaded =
        dev.load_state_with_store(&mut &state[..], store_of(&store_bytes), WbFormat::Packed);
    if loaded.is_err() {
        assert!(dev.bd_stat().is_none(), "a refused state left a store set");
    }
    check_loaded_state(dev, loaded.is_ok(), device);
}

/// The device's controls as `ztier serve`'s control socket takes them (`ztier ctl ATTR
/// VALUE`): `data` is a series of requests, split at 0xff bytes, each a byte naming an
/// attribute (a writable one, a readable one, or, past them, a name and value from the
/// input) and a value (its bytes read as the words and edge numbers the attributes take,
/// [`attr_value`], or as themselves), run in order on a device of 16 pages with a packed
/// backing store, half of them written. Every request ends in an answer or an error, never
/// a panic (an overflow included: fuzz builds check arithmetic), and every page still reads.
pub fn zram_attrs(data: &[u8]) {
    use std::sync::Arc;
    use ztier_blockdev::memory::MemoryDevice;
    use ztier_zram::{Backing, WbFormat};
    const PAGES: u64 = 16;
    const PAGE: usize = 4096;
    const WRITABLE: [&str; 9] = [
        "idle",
        "writeback",
        "writeback_limit",
        "writeback_limit_enable",
        "recomp_algorithm",
        "recompress",
        "compact",
        "mem_limit",
        "mem_used_max",
    ];
    const READABLE: [&str; 8] = [
        "mm_stat",
        "io_stat",
        "bd_stat",
        "debug_stat",
        "writeback_limit",
        "writeback_limit_enable",
        "recomp_algorithm",
        "backing_dev",
    ];
    let dev = lz4_device(PAGES);
    let store = Arc::new(MemoryDevice::new(Backing::size_for(PAGES * PAGE as u64)).expect("store"));
    dev.set_backing(Some(
        Backing::new(store, WbFormat::Packed).expect("backing"),
    ))
    .expect("set backing");
    for i in (0..PAGES).step_by(2) {
        let mut page = vec![(i % 7) as u8; PAGE];
        for (j, b) in page.iter_mut().enumerate().step_by(11) {
            *b = (i as usize + j) as u8;
        }
        dev.write_page(i, &page).expect("write");
    }
    for request in data.split(|&b| b == 0xff).take(32) {
        let Some((&which, value)) = request.split_first() else {
            continue;
        };
        let value = attr_value(&value[..value.len().min(64)]);
        let which = which as usize;
        if which < WRITABLE.len() {
            let _ = dev.store_attr(WRITABLE[which], &value);
        } else if which < WRITABLE.len() + READABLE.len() {
            let _ = dev.show_attr(READABLE[which - WRITABLE.len()]);
        } else if which & 1 == 0 {
            let (name, rest) = value.split_once(' ').unwrap_or((&value, ""));
            let _ = dev.store_attr(name, rest);
        } else {
            let _ = dev.show_attr(&value);
        }
    }
    let mut page = vec![0u8; PAGE];
    for i in 0..PAGES {
        dev.read_page(i, &mut page).expect("every page still reads");
    }
}

/// A control value from `bytes`: each byte below the table's length is a word or number the
/// attributes take (their keys, modes, edge numbers), any other is itself, so that values
/// like `page_indexes=2-18446744073709551615` are a few bytes away, not a few million runs.
fn attr_value(bytes: &[u8]) -> String {
    const WORDS: [&str; 32] = [
        "page=",
        "page_indexes=",
        "type=",
        "threshold=",
        "priority=",
        "algo=",
        "all",
        "idle",
        "huge",
        "huge_idle",
        "incompressible",
        "lz4",
        "zstd",
        "lzo-rle",
        "zstd:level=",
        "deflate",
        "0",
        "1",
        "2",
        "3",
        "63",
        "64",
        "4096",
        "4294967295",
        "4294967297",
        "18446744073709551615",
        "-",
        " ",
        "=",
        "K",
        "0x",
        "E",
    ];
    let mut value = String::new();
    for &b in bytes {
        match WORDS.get(b as usize) {
            Some(word) => value.push_str(word),
            None => value.push(b as char),
        }
    }
    value
}

/// A capture's trace file as outside input (`NAME.trace` beside a corpus, which `ztier
/// replay` reads). By the first byte: the rest is the whole file; or epochs after a valid
/// header; or a valid trace built from the input (pages appearing, changing and going over
/// a few dozen page numbers, so that the same page comes back), written out, then changed at
/// places the input names, by XOR or by an edge number written over the bytes there (no
/// change: it must read back as built).
///
/// A file is accepted or refused, never a panic; an accepted trace keeps the format's
/// invariants, checked here against a model of the pages present, and is written back byte
/// for byte.
pub fn trace(data: &[u8]) {
    use ztier_corpus::trace::Trace;
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let header: Vec<u8> = [
        &b"ZTIERTRC"[..],
        &1u32.to_le_bytes(),
        &4096u32.to_le_bytes(),
    ]
    .concat();
    let (file, built) = match mode % 4 {
        0 => (rest.to_vec(), None),
        1 => ([&header[..], rest].concat(), None),
        edges => {
            let (built, changes) = build_trace(rest);
            let mut file = built.to_bytes().expect("a built trace's lists fit");
            for change in changes.chunks_exact(3) {
                let at = usize::from(u16::from_le_bytes([change[0], change[1]])) % file.len();
                if edges == 2 {
                    file[at] ^= change[2];
                } else {
                    // An edge number written over the bytes there (8 of them, or its low 4).
                    let n = TRACE_EDGES[usize::from(change[2]) % TRACE_EDGES.len()];
                    let width = if change[2] & 0x80 == 0 { 8 } else { 4 };
                    let end = (at + width).min(file.len());
                    file[at..end].copy_from_slice(&n.to_le_bytes()[..end - at]);
                }
            }
            let unchanged = changes.len() < 3;
            (file, unchanged.then_some(built))
        }
    };
    let Ok(trace) = Trace::from_bytes(&file) else {
        assert!(built.is_none(), "a trace as built is refused");
        return;
    };
    if let Some(built) = built {
        assert_eq!(trace, built, "read back other than built");
    }
    assert_eq!(trace.check_invariants(), Ok(()), "read, yet its check refuses it");
    assert_eq!(
        trace.to_bytes().expect("an accepted trace's lists fit"),
        file,
        "written back other than read"
    );
    check_trace(&trace);
}

/// Numbers at the edges of a trace's fields (counts, page numbers, times).
const TRACE_EDGES: [u64; 10] = [
    0,
    1,
    2,
    u32::MAX as u64 - 1,
    u32::MAX as u64,
    u32::MAX as u64 + 1,
    1 << 63,
    u64::MAX - 2,
    u64::MAX - 1,
    u64::MAX,
];

/// The format's invariants, from a model of the pages present: a page appears only when
/// absent, changes or goes only when present, is named once an epoch; corpus pages run
/// 0, 1, 2, ... in order; times do not go backwards; the unchanged count adds up.
fn check_trace(trace: &ztier_corpus::trace::Trace) {
    assert_eq!(trace.page_size, 4096, "the corpus's page size");
    let mut present = std::collections::HashSet::new();
    let mut next_corpus_page = 0u64;
    let mut millis = 0;
    for e in &trace.epochs {
        assert!(e.millis >= millis, "time went backwards");
        millis = e.millis;
        let mut named = std::collections::HashSet::new();
        for w in &e.appeared {
            assert!(present.insert(w.vpn), "{:#x} appeared while present", w.vpn);
        }
        for w in &e.changed {
            assert!(
                present.contains(&w.vpn),
                "{:#x} changed while absent",
                w.vpn
            );
        }
        for w in e.appeared.iter().chain(&e.changed) {
            assert!(named.insert(w.vpn), "{:#x} named twice", w.vpn);
            assert_eq!(
                u64::from(w.corpus_page),
                next_corpus_page,
                "corpus pages out of order"
            );
            next_corpus_page += 1;
        }
        for vpn in &e.went {
            assert!(named.insert(*vpn), "{vpn:#x} named twice");
            assert!(present.remove(vpn), "{vpn:#x} went while absent");
        }
        assert_eq!(
            e.present(),
            present.len() as u64,
            "the counts do not add up"
        );
    }
    assert_eq!(
        trace.corpus_pages(),
        next_corpus_page,
        "corpus pages miscounted"
    );
}

/// A valid trace from `data`, and the bytes left over (the changes to make to its file).
/// Each epoch takes a byte of time step and a byte of how many operations follow; each
/// operation a byte: the low six bits a page number, the top bit what happens to it if it
/// is present (changes or goes; an absent one appears; a page already named this epoch is
/// passed over).
fn build_trace(mut data: &[u8]) -> (ztier_corpus::trace::Trace, &[u8]) {
    use ztier_corpus::trace::{Epoch, PageWrite, Trace};
    let mut present = std::collections::BTreeSet::new();
    let mut epochs = Vec::new();
    let mut corpus_page = 0u32;
    let mut millis = 0u64;
    while let [step, ops, more @ ..] = data {
        if epochs.len() == 8 {
            break;
        }
        let ops = usize::from(*ops % 32).min(more.len());
        let (these, rest) = more.split_at(ops);
        data = rest;
        millis += u64::from(*step);
        let mut e = Epoch {
            millis,
            ..Epoch::default()
        };
        let mut named = std::collections::HashSet::new();
        for &op in these {
            let vpn = u64::from(op & 63) * 0x1000 + 0x7f00_0000;
            if !named.insert(vpn) {
                continue;
            }
            let write = PageWrite {
                vpn,
                corpus_page: 0,
            };
            match (present.contains(&vpn), op >> 7) {
                (false, _) => e.appeared.push(write),
                (true, 0) => e.changed.push(write),
                (true, _) => e.went.push(vpn),
            }
        }
        for w in e.appeared.iter_mut().chain(e.changed.iter_mut()) {
            w.corpus_page = corpus_page;
            corpus_page += 1;
        }
        for w in &e.appeared {
            present.insert(w.vpn);
        }
        for vpn in &e.went {
            present.remove(vpn);
        }
        e.unchanged = present.len() as u64 - (e.appeared.len() + e.changed.len()) as u64;
        epochs.push(e);
    }
    let trace = Trace {
        page_size: 4096,
        epochs,
    };
    (trace, data)
}

/// A server certificate's names, read out of untrusted DER by the NBD client's name check
/// (`ztier_nbd::der`): any bytes are a certificate's names or refused, never a panic, and
/// whatever names are found lie within the input.
pub fn x509_names(data: &[u8]) {
    if let Some(names) = ztier_nbd::der::names(data) {
        for cn in &names.common_names {
            assert!(cn.len() <= data.len());
        }
    }
}
