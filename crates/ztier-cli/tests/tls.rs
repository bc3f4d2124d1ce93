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
