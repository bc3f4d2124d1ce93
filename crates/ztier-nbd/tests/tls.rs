//! NBD over TLS (`NBD_OPT_STARTTLS`) between ztier's own ends: client and server together
//! (the block-device conformance suite, reconnects), what `--tls require` refuses (plain
//! clients, the wrong CA, the wrong name, a client with no certificate when peers are
//! verified), a certificate directory that cannot be read (a typed error that names it), the
//! handshake deadline over a stalled or garbled TLS handshake, a reply
//! blocked on a full socket, and the keys and certificates GnuTLS peers take. The
//! ecosystem's tools (libnbd, nbdkit) are in `tls_tools.rs`; the certificates and the
//! server both use, in `tests/common`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_blockdev::{BlockDevice, BlockError};
use ztier_nbd::client::{Client, ClientConfig, LinkState, Uri};
use ztier_nbd::proto::*;
use ztier_nbd::{ClientTlsError, Listener, Server, ServerConfig, ServerTls, TlsError, TlsMode};

use common::*;

#[test]
fn tls_client_and_server_pass_the_conformance_suite_on_unix_and_tcp() {
    let Some(c) = certs() else { return };
    let s = serve_unix(
        "suite",
        memory(4 << 20),
        tls_config(TlsMode::Require, &c.server, false),
    );
    let client = Client::connect(&s.tls_uri(&c.client)).unwrap();
    assert_eq!(client.size(), 4 << 20);
    ztier_blockdev::testing::run_all(&client);
    assert_eq!(
        s.server
            .stats()
            .tls_sessions
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    drop(client);

    // TCP, where the name is checked: the certificate names 127.0.0.1 and localhost.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Server::new(
        memory(4 << 20),
        tls_config(TlsMode::Require, &c.server, false),
    );
    let srv = Arc::clone(&server);
    let thread = std::thread::spawn(move || srv.serve(Listener::Tcp(listener)).unwrap());
    for host in ["127.0.0.1", "localhost"] {
        let uri: Uri = format!(
            "nbds://{host}:{port}/?tls-certificates={}",
            c.client.display()
        )
        .parse()
        .unwrap();
        let client = Client::connect(&uri).unwrap();
        ztier_blockdev::testing::run_all(&client);
    }
    // A name the certificate does not carry is refused.
    let uri: Uri = format!(
        "nbds://127.0.0.1:{port}/?tls-certificates={}&tls-hostname=elsewhere.example",
        c.client.display()
    )
    .parse()
    .unwrap();
    let e = Client::connect(&uri)
        .err()
        .expect("a wrong name is refused");
    assert!(e.to_string().contains("not valid for name"), "{e}");
    server.stop();
    thread.join().unwrap();
}

/// A raw plain client: greeting read, fixed newstyle with no zeroes sent.
fn plain_greeted(path: &Path) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], &NBDMAGIC.to_be_bytes());
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    s
}

fn send_option(s: &mut UnixStream, option: u32, data: &[u8]) {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend(option.to_be_bytes());
    m.extend((data.len() as u32).to_be_bytes());
    m.extend(data);
    s.write_all(&m).unwrap();
}

/// (option, reply type, data) of the next option reply.
fn option_reply(s: &mut UnixStream) -> (u32, u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(&h[..8], &REP_MAGIC.to_be_bytes());
    let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data).unwrap();
    (opt, kind, data)
}

/// The server has closed: a read ends (EOF or a reset) within 2 s, with nothing read.
fn assert_closed(s: &mut UnixStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => {}
        Ok(_) => panic!("{what}: the server sent more"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("{what}: the server did not close ({e})"),
    }
}

#[test]
fn require_refuses_plain_clients_and_serves_no_data() {
    let Some(c) = certs() else { return };
    let s = serve_unix(
        "require",
        memory(1 << 20),
        tls_config(TlsMode::Require, &c.server, false),
    );
    // Every option but STARTTLS and ABORT: NBD_REP_ERR_TLS_REQD, and no info with it.
    let mut raw = plain_greeted(&s.path);
    let go = InfoRequest {
        export: String::new(),
        infos: vec![INFO_BLOCK_SIZE],
    }
    .encode();
    for (opt, data) in [
        (OPT_LIST, Vec::new()),
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (OPT_INFO, go.clone()),
        (OPT_GO, go.clone()),
        (99, Vec::new()),
    ] {
        send_option(&mut raw, opt, &data);
        let (o, kind, _) = option_reply(&mut raw);
        assert_eq!((o, kind), (opt, REP_ERR_TLS_REQD), "option {opt}");
    }
    // EXPORT_NAME cannot be refused with an error: the connection ends, with no size sent.
    send_option(&mut raw, OPT_EXPORT_NAME, b"");
    assert_closed(&mut raw, "EXPORT_NAME in the clear");
    // ABORT is still answered.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut raw).1, REP_ACK);
    // ztier's own plain client says why.
    let e = Client::connect(&s.plain_uri())
        .err()
        .expect("plain refused");
    assert!(e.to_string().contains("requires TLS"), "{e}");
    // STARTTLS with data is invalid, and the haggling goes on in the clear.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_STARTTLS, b"x");
    assert_eq!(option_reply(&mut raw).1, REP_ERR_INVALID);
    let stats = s.server.stats();
    assert_eq!(
        stats.bytes_read.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        stats.connections.load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn on_serves_plain_and_tls_clients_and_off_refuses_starttls() {
    let Some(c) = certs() else { return };
    let dev = memory(1 << 20);
    let s = serve_unix("on", dev, tls_config(TlsMode::On, &c.server, false));
    let plain = Client::connect(&s.plain_uri()).unwrap();
    plain.write_at(0, &[3u8; 4096], false).unwrap();
    let tls = Client::connect(&s.tls_uri(&c.client)).unwrap();
    let mut page = [0u8; 4096];
    tls.read_at(0, &mut page).unwrap();
    assert_eq!(page, [3u8; 4096]);
    // A second STARTTLS inside TLS is invalid (checked through the raw protocol below for
    // a server with TLS off: STARTTLS is not supported there).
    let off = serve_unix("off", memory(1 << 20), ServerConfig::default());
    let e = Client::connect(&off.tls_uri(&c.client))
        .err()
        .expect("no TLS offered");
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
    let mut raw = plain_greeted(&off.path);
    send_option(&mut raw, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut raw).1, REP_ERR_UNSUP);
}

#[test]
fn a_client_trusting_another_ca_is_refused_and_verify_peer_wants_a_client_certificate() {
    let Some(c) = certs() else { return };
    let s = serve_unix(
        "wrongca",
        memory(1 << 20),
        tls_config(TlsMode::Require, &c.server, false),
    );
    let e = Client::connect(&s.tls_uri(&c.wrong))
        .err()
        .expect("the server's certificate is not signed by the CA the client trusts");
    assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    // The server went on: a client that trusts the right CA is served.
    Client::connect(&s.tls_uri(&c.client)).unwrap();

    // --tls-verify-peer: the server's own directory has no client certificate, the client
    // directory has one signed by the CA.
    let v = serve_unix(
        "verify",
        memory(1 << 20),
        tls_config(TlsMode::Require, &c.server, true),
    );
    assert!(Client::connect(&v.tls_uri(&c.server)).is_err());
    let client = Client::connect(&v.tls_uri(&c.client)).unwrap();
    client.write_at(0, &[1u8; 512], false).unwrap();
}

/// A certificate directory that cannot be read fails the connect before any socket is
/// opened, as an invalid request whose cause is the typed TLS error: which URI, which file.
#[test]
fn a_missing_certificate_directory_is_a_typed_error_that_names_the_uri_and_the_file() {
    let uri: Uri =
        "nbds+unix:///disk?socket=/nonexistent/ztier.sock&tls-certificates=/nonexistent/ztier-pki"
            .parse()
            .unwrap();
    let e = Client::connect(&uri)
        .err()
        .expect("no certificates to read");
    let BlockError::Invalid(cause) = &e else {
        panic!("not an invalid request: {e:?}")
    };
    let tls = cause
        .downcast_ref::<ClientTlsError>()
        .expect("the cause is the client's TLS error");
    assert_eq!(tls.uri, uri);
    assert!(
        matches!(&tls.source, TlsError::Read { path, .. } if path.ends_with("ca-cert.pem")),
        "{tls}"
    );
    assert!(e.to_string().contains("TLS for nbds+unix:///disk"), "{e}");
}

#[test]
fn the_handshake_deadline_covers_a_stalled_or_garbled_tls_handshake() {
    let Some(c) = certs() else { return };
    let mut config = tls_config(TlsMode::Require, &c.server, false);
    config.handshake_limit = Duration::from_millis(300);
    let s = serve_unix("stall", memory(1 << 20), config);
    // STARTTLS accepted, then silence: closed at the limit.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut raw).1, REP_ACK);
    let started = Instant::now();
    assert_closed(&mut raw, "a stalled TLS handshake");
    assert!(started.elapsed() < Duration::from_secs(2));
    // Half a ClientHello, then silence.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut raw).1, REP_ACK);
    raw.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .unwrap();
    assert_closed(&mut raw, "half a ClientHello");
    // Garbage instead of a TLS record: the server answers with an alert at most, and closes.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut raw).1, REP_ACK);
    raw.write_all(&[0xffu8; 64]).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut sink = Vec::new();
    let _ = raw.read_to_end(&mut sink);
    assert!(sink.len() < 64, "an alert at most: {sink:?}");
    // A client that goes away mid-handshake ends only its own connection.
    let mut raw = plain_greeted(&s.path);
    send_option(&mut raw, OPT_STARTTLS, &[]);
    drop(raw);
    let failed = &s.server.stats().failed_handshakes;
    let deadline = Instant::now() + Duration::from_secs(5);
    while failed.load(std::sync::atomic::Ordering::Relaxed) < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(failed.load(std::sync::atomic::Ordering::Relaxed), 4);
    let client = Client::connect(&s.tls_uri(&c.client)).unwrap();
    client.write_at(0, &[9u8; 4096], false).unwrap();
}

#[test]
fn a_pinned_tls_client_redoes_tls_when_it_reconnects() {
    let Some(c) = certs() else { return };
    let dev = memory(1 << 20);
    let config = || tls_config(TlsMode::Require, &c.server, false);
    let mut s = serve_unix("back", Arc::clone(&dev), config());
    let uri = s.tls_uri(&c.client);
    let client = Client::connect_with(
        &uri,
        ClientConfig {
            io_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_millis(200),
        },
    )
    .unwrap();
    client
        .write_at(0, b"ztier-tls-identity-0123456789abc", false)
        .unwrap();
    client.pin_identity(0, 32).unwrap();
    client.write_at(8192, &[5u8; 4096], false).unwrap();
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    assert!(client.read_at(8192, &mut [0u8; 4096]).is_err());
    let back = serve_unix("back", dev, config());
    let mut page = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = client.read_at(8192, &mut page) {
        assert!(Instant::now() < deadline, "never came back: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(page, [5u8; 4096]);
    assert_eq!(client.status().state, LinkState::Connected);
    assert_eq!(
        back.server
            .stats()
            .tls_sessions
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "the reconnect went through STARTTLS"
    );
}

#[test]
fn nbds_uris_parse_and_print() {
    let u: Uri = "nbds://example.org:10810/disk?tls-certificates=/etc/pki/x&tls-hostname=h.example"
        .parse()
        .unwrap();
    assert_eq!(u.export, "disk");
    let tls = u.tls.as_ref().unwrap();
    assert_eq!(tls.certificates.as_deref(), Some(Path::new("/etc/pki/x")));
    assert_eq!(tls.hostname.as_deref(), Some("h.example"));
    assert_eq!(
        u.to_string(),
        "nbds://example.org:10810/disk?tls-certificates=/etc/pki/x&tls-hostname=h.example"
    );
    let u: Uri = "nbds+unix:///wb?socket=/run/s.sock&tls-certificates=/d"
        .parse()
        .unwrap();
    assert_eq!(u.export, "wb");
    assert_eq!(
        u.to_string(),
        "nbds+unix:///wb?socket=/run/s.sock&tls-certificates=/d"
    );
    let u: Uri = "nbds://[::1]".parse().unwrap();
    assert_eq!(u.tls, Some(Default::default()));
    assert!(Uri::is_nbd_uri("nbds+unix:///?socket=/s"));
    assert!(!Uri::is_nbd_uri("/dev/sdb"));
    // Plain URIs are as they were: no TLS.
    let u: Uri = "nbd://h/x".parse().unwrap();
    assert_eq!((u.tls, u.export.as_str()), (None, "x"));
    for bad in [
        "nbds+unix:///x",
        "nbds://h/?tls-certificates=",
        "nbds://h/?tls-psk-file=/k",
    ] {
        assert!(bad.parse::<Uri>().is_err(), "{bad}");
    }
}

/// A TLS client of the test's own over a Unix socket, past STARTTLS and the handshake.
fn raw_tls_client(path: &Path, ca: &Path) -> (UnixStream, rustls::ClientConnection) {
    use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
    let mut s = plain_greeted(path);
    send_option(&mut s, OPT_STARTTLS, &[]);
    assert_eq!(option_reply(&mut s).1, REP_ACK);
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
            .unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut s).unwrap();
    }
    (s, conn)
}

fn tls_send(s: &mut UnixStream, conn: &mut rustls::ClientConnection, bytes: &[u8]) {
    for chunk in bytes.chunks(16 << 10) {
        conn.writer().write_all(chunk).unwrap();
        while conn.wants_write() {
            conn.write_tls(s).unwrap_or_else(|e| {
                panic!("the server stopped reading while a reply waited to be written: {e}")
            });
        }
    }
}

fn tls_receive(s: &mut UnixStream, conn: &mut rustls::ClientConnection, out: &mut [u8]) {
    let mut got = 0;
    while got < out.len() {
        match conn.reader().read(&mut out[got..]) {
            Ok(0) => panic!("the server closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(conn.read_tls(s).unwrap() > 0, "the server closed");
                conn.process_new_packets().unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The server's threads share one TLS connection: a thread blocked writing a reply the
/// client does not read yet (16 MiB) must not keep the next thread from decrypting the
/// request behind it (an 8 MiB write), or client and server would each wait for the other.
#[test]
fn a_reply_blocked_on_a_full_socket_does_not_stop_the_tls_reader() {
    let Some(c) = certs() else { return };
    let s = serve_unix(
        "blocked",
        memory(64 << 20),
        tls_config(TlsMode::Require, &c.server, false),
    );
    let (mut sock, mut conn) = raw_tls_client(&s.path, &c.client.join("ca-cert.pem"));
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    sock.set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // Inside TLS: GO, simple replies.
    let go = InfoRequest {
        export: String::new(),
        infos: vec![],
    }
    .encode();
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend(OPT_GO.to_be_bytes());
    m.extend((go.len() as u32).to_be_bytes());
    m.extend(&go);
    tls_send(&mut sock, &mut conn, &m);
    loop {
        let mut h = [0u8; 20];
        tls_receive(&mut sock, &mut conn, &mut h);
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut data = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        tls_receive(&mut sock, &mut conn, &mut data);
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_INFO);
    }
    let request = |kind, cookie, offset, length| {
        Request {
            flags: 0,
            kind,
            cookie,
            offset,
            length,
        }
        .encode()
    };
    let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    // The read's 16 MiB reply fills the socket and blocks its thread; the write behind it
    // must still be read (or this send times out).
    tls_send(&mut sock, &mut conn, &request(CMD_READ, 1, 0, 16 << 20));
    let mut write = request(CMD_WRITE, 2, 32 << 20, 8 << 20).to_vec();
    write.extend(&payload);
    tls_send(&mut sock, &mut conn, &write);
    let mut replies = Vec::new();
    for _ in 0..2 {
        let mut h = [0u8; 16];
        tls_receive(&mut sock, &mut conn, &mut h);
        assert_eq!(&h[..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
        assert_eq!(&h[4..8], &[0; 4], "an error reply");
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        if cookie == 1 {
            let mut data = vec![0u8; 16 << 20];
            tls_receive(&mut sock, &mut conn, &mut data);
        }
        replies.push(cookie);
    }
    replies.sort();
    assert_eq!(replies, [1, 2]);
    let mut back = vec![0u8; 8 << 20];
    s.server
        .device()
        .expect("the default export")
        .read_at(32 << 20, &mut back)
        .unwrap();
    assert!(back == payload, "the write landed whole");
}

/// `server-cert.pem` and `server-key.pem` in `dir`: an RSA key of `bits`, the subject
/// `CN=cn`, the extensions of section `extensions`, signed by the CA there.
fn make_rsa_server(dir: &Path, bits: u32, cn: &str, extensions: &str) {
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            &format!("rsa:{bits}"),
            "-nodes",
            "-keyout",
            "server-key.pem",
            "-out",
            "server.csr",
            "-config",
            "openssl.cnf",
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-set_serial",
            "7",
            "-days",
            "3650",
            "-out",
            "server-cert.pem",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            extensions,
        ],
    );
}

/// What GnuTLS servers and clients (nbd's own tests, libnbd, QEMU) take, ztier takes too:
/// an RSA key of 2432 bits (nbd's test key; a size that is no multiple of 512), and, as a
/// client, a server certificate that names its host only in its common name (no
/// subjectAltName). A certificate that has a subjectAltName is held to it alone, and a
/// common name that is another host's is refused.
#[test]
fn a_2432_bit_key_and_a_certificate_named_only_by_its_common_name_are_taken() {
    if certs().is_none() {
        return;
    }
    let root = scratch().join("legacy-certs");
    let _ = std::fs::remove_dir_all(&root);
    let dir = |name: &str| {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("openssl.cnf"), OPENSSL_CNF).unwrap();
        make_ca(&d, "legacy CA");
        d
    };
    let serve_tcp = |certs: &Path| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = Server::new(memory(1 << 20), tls_config(TlsMode::Require, certs, false));
        let s = Arc::clone(&server);
        let thread = std::thread::spawn(move || s.serve(Listener::Tcp(listener)).unwrap());
        (server, thread, port)
    };
    let connect = |certs: &Path, port: u16, host: &str| {
        let uri: Uri = format!(
            "nbds://127.0.0.1:{port}/?tls-certificates={}&tls-hostname={host}",
            certs.display()
        )
        .parse()
        .unwrap();
        Client::connect(&uri)
    };

    // The common name alone, on a 2432-bit key: loaded, and the name matched.
    let legacy = dir("legacy");
    make_rsa_server(&legacy, 2432, "localhost", "legacy");
    let (server, thread, port) = serve_tcp(&legacy);
    let client = connect(&legacy, port, "localhost").expect("CN=localhost, no subjectAltName");
    client.write_at(0, &[9u8; 4096], false).unwrap();
    drop(client);
    let e = connect(&legacy, port, "elsewhere.example")
        .err()
        .expect("another host's name");
    assert!(e.to_string().contains("not valid for"), "{e}");
    server.stop();
    thread.join().unwrap();

    // A subjectAltName is the only name checked where there is one.
    let other = dir("elsewhere");
    make_rsa_server(&other, 2048, "localhost", "elsewhere");
    let (server, thread, port) = serve_tcp(&other);
    let e = connect(&other, port, "localhost")
        .err()
        .expect("the CN is not looked at");
    assert!(e.to_string().contains("not valid for"), "{e}");
    connect(&other, port, "elsewhere.example").expect("the subjectAltName's name");
    server.stop();
    thread.join().unwrap();

    // A key the TLS stack cannot use is named by its own file.
    let bad = dir("bad-key");
    make_rsa_server(&bad, 2048, "localhost", "legacy");
    std::fs::write(
        bad.join("server-key.pem"),
        "-----BEGIN PRIVATE KEY-----\nMAA=\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = ServerTls::from_dir(TlsMode::Require, &bad, false).unwrap_err();
    assert!(e.to_string().contains("server-key.pem"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}
