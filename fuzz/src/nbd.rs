//! The NBD server (plain and over TLS) and client against hostile peers, and the client's
//! reading of a server certificate's names.

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
