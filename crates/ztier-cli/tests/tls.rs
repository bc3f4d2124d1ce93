//! zram writeback to a remote store over TLS (`nbds+unix://`): ztier's own NBD server with
//! TLS required (in this process, a RAM disk behind it) and nbdkit `--tls=require`; every
//! page written back is read again and compared. Certificates are made at test time with
//! `openssl`; a missing tool makes a test say so and skip, except under CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{have, temp_dir};
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_nbd::{Client, Listener, Server, ServerConfig, ServerTls, TlsMode, Uri};
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

const OPENSSL_CNF: &str = "\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = ztier test
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost,IP:127.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory in nbdkit's layout (ca-cert.pem, server-cert.pem, server-key.pem), which
/// also serves a client as its `tls-certificates` (it reads ca-cert.pem).
fn certificates(name: &str) -> Option<PathBuf> {
    if !have("openssl") {
        return None;
    }
    let dir = temp_dir(name);
    std::fs::write(dir.join("openssl.cnf"), OPENSSL_CNF).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-new"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "3650",
        "-config",
        "openssl.cnf",
        "-extensions",
        "ca",
        "-subj",
        "/CN=ztier test CA",
    ]);
    openssl(&dir, &ca);
    let mut req = vec!["req", "-new"];
    req.extend(ec);
    req.extend([
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
        "-config",
        "openssl.cnf",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&dir, &req);
    openssl(
        &dir,
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
            "2",
            "-days",
            "3650",
            "-out",
            "server-cert.pem",
            "-extfile",
            "openssl.cnf",
            "-extensions",
            "server",
        ],
    );
    Some(dir)
}

/// Text-like pages, different per index.
fn page(i: u64) -> Vec<u8> {
    let mut p = ztier_base::pattern::pattern(i, 1024);
    p.extend(std::iter::repeat_n(b"writeback over TLS ".iter().copied(), 200).flatten());
    p.truncate(4096);
    p
}

/// A zram device of `n` pages written back whole to `uri` (its identity pinned, as
/// `ztier serve` does), then every page read again and compared.
fn writeback_verifies_every_page(uri: &Uri, n: u64) {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    let dev = Device::new(
        n * 4096,
        "lz4".parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap();
    for i in 0..n {
        dev.write_page(i, &page(i)).unwrap();
    }
    let client = Arc::new(Client::connect(uri).unwrap());
    let backing = Backing::new(
        Arc::clone(&client) as Arc<dyn BlockDevice>,
        WbFormat::Packed,
    )
    .unwrap();
    let (offset, len) = backing.identity();
    client.pin_identity(offset, len).unwrap();
    dev.set_backing(Some(backing)).unwrap();
    dev.mark_idle(None);
    let done = dev.writeback(PageSelector::Idle, None, None).unwrap();
    assert_eq!(done.pages, n, "every page went to the store");
    assert!(done.bytes_written > 0);
    let mut out = vec![0u8; 4096];
    for i in 0..n {
        dev.read_page(i, &mut out).unwrap();
        assert!(
            out == page(i),
            "page {i} read back from the TLS store differs"
        );
    }
}

#[test]
fn zram_writes_back_over_tls_to_ztiers_own_server_and_reads_every_page_back() {
    let Some(dir) = certificates("tls-own") else {
        return;
    };
    let socket = dir.join("serve.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let store = Arc::new(ztier_blockdev::memory::MemoryDevice::new(64 << 20).unwrap());
    let server = Server::new(
        store,
        ServerConfig {
            tls: ServerTls::from_dir(TlsMode::Require, &dir, false).unwrap(),
            ..ServerConfig::default()
        },
    );
    let srv = Arc::clone(&server);
    let thread = std::thread::spawn(move || srv.serve(Listener::Unix(listener)).unwrap());
    let uri: Uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        socket.display(),
        dir.display()
    )
    .parse()
    .unwrap();
    writeback_verifies_every_page(&uri, 4000);
    let stats = server.stats();
    assert_eq!(stats.tls_sessions.load(Ordering::Relaxed), 1);
    assert!(stats.bytes_written.load(Ordering::Relaxed) > 4000 * 1024);
    server.stop();
    thread.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// nbdkit, killed when dropped.
struct Nbdkit(Child);

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn zram_writes_back_over_tls_to_nbdkit_tls_require_and_reads_every_page_back() {
    if !have("nbdkit") {
        return;
    }
    let Some(dir) = certificates("tls-nbdkit") else {
        return;
    };
    let socket = dir.join("nbdkit.sock");
    let _nbdkit = Nbdkit(
        Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--tls=require"])
            .arg(format!("--tls-certificates={}", dir.display()))
            .arg("--unix")
            .arg(&socket)
            .args(["memory", "64M"])
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start nbdkit"),
    );
    let start = Instant::now();
    while !socket.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no nbdkit socket"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let uri: Uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        socket.display(),
        dir.display()
    )
    .parse()
    .unwrap();
    writeback_verifies_every_page(&uri, 4000);
    // In the clear, nbdkit serves nothing.
    let plain: Uri = format!("nbd+unix:///?socket={}", socket.display())
        .parse()
        .unwrap();
    assert!(Client::connect(&plain).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `ztier serve --tls require` with the certificate directory: nbdinfo and nbdcopy reach it
/// through `nbds+unix://` and `tls-certificates`, a plain client is refused, and a second
/// `ztier serve` writes back to it over TLS (`--backing-dev nbds+unix://...`), every page
/// read back exact through the first one's export.
#[test]
fn ztier_serve_takes_tls_and_writes_back_over_it() {
    let Some(certs) = certificates("serve-tls") else {
        return;
    };
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("serve-tls-run");
    let store = dir.join("store.sock");
    let mut far = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["serve", "--size", "64M", "--tls", "require", "--socket"])
        .arg(&store)
        .arg("--tls-certificates")
        .arg(&certs)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !store.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let tls_uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        store.display(),
        certs.display()
    );
    let o = Command::new("nbdinfo")
        .arg("--size")
        .arg(&tls_uri)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "67108864");
    let plain = Command::new("nbdinfo")
        .arg("--size")
        .arg(format!("nbd+unix:///?socket={}", store.display()))
        .output()
        .unwrap();
    assert!(!plain.status.success(), "a plain client was served");

    // A near server whose backing store is the far one, over TLS; nbdcopy fills it, its
    // pages go to the far store, and come back exact.
    let near = dir.join("near.sock");
    let mut near_server = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["serve", "--size", "16M", "--compressor", "lz4", "--socket"])
        .arg(&near)
        .arg("--backing-dev")
        .arg(&tls_uri)
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ctl = dir.join("near.sock.ctl");
    let start = Instant::now();
    while !ctl.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no near socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    let image = dir.join("image");
    let data: Vec<u8> = (0..16u64 << 20)
        .map(|i| (i / 4096 * 7 + i % 13) as u8)
        .collect();
    std::fs::write(&image, &data).unwrap();
    let near_uri = format!("nbd+unix:///?socket={}", near.display());
    let copy = |from: &str, to: &str| {
        let o = Command::new("nbdcopy").args([from, to]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    copy(image.to_str().unwrap(), &near_uri);
    let o = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["ctl", "--socket"])
        .arg(&near)
        .args(["writeback", "all"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bd = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["ctl", "--socket"])
        .arg(&near)
        .arg("bd_stat")
        .output()
        .unwrap();
    let held: u64 = String::from_utf8_lossy(&bd.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert_eq!(held, 4096, "every page written back to the far store");
    let back = dir.join("back");
    copy(&near_uri, back.to_str().unwrap());
    assert!(
        std::fs::read(&back).unwrap() == data,
        "pages read back over TLS differ"
    );
    for p in [&mut near_server, &mut far] {
        let _ = p.kill();
        let _ = p.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
