//! NBD over TLS with the ecosystem's tools: libnbd's `nbdinfo` and `nbdcopy` against
//! ztier's server (over a Unix socket, and over TCP where libnbd checks the chain and the
//! name), and ztier's client against `nbdkit --tls=require`. A missing tool makes a test say
//! so and skip, except under CI, where it fails.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztier_blockdev::BlockDevice;
use ztier_nbd::client::{Client, Uri};
use ztier_nbd::{Listener, Server, ServerConfig, TlsMode};

use common::*;

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().expect("run a tool");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn nbdinfo_and_nbdcopy_work_against_ztiers_tls_server() {
    let Some(c) = certs() else { return };
    if !have("nbdinfo") || !have("nbdcopy") {
        return;
    }
    let size = 8u64 << 20;
    let s = serve_unix(
        "libnbd",
        memory(size),
        tls_config(TlsMode::Require, &c.server, false),
    );
    let uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        s.path.display(),
        c.server.display()
    );
    let out = run(Command::new("nbdinfo").args(["--size", &uri]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        size.to_string()
    );
    // In the clear, libnbd gets nowhere.
    let plain = format!("nbd+unix:///?socket={}", s.path.display());
    let out = Command::new("nbdinfo")
        .args(["--size", &plain])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a plain nbdinfo was served");
    // nbdcopy there and back (its several connections, each through STARTTLS).
    let dir = scratch();
    let (src, back) = (dir.join("copy-src.img"), dir.join("copy-back.img"));
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    run(Command::new("nbdcopy").arg(&uri).arg(&back));
    assert!(
        std::fs::read(&back).unwrap() == data,
        "nbdcopy read back other bytes"
    );
    assert!(
        s.server
            .stats()
            .tls_sessions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 3
    );
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&back);
}

/// A TCP listener on loopback serving `config`, stopped when dropped.
struct TcpServed {
    server: Arc<Server>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpServed {
    fn new(config: ServerConfig) -> TcpServed {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = Server::new(memory(1 << 20), config);
        let s = Arc::clone(&server);
        let thread = std::thread::spawn(move || s.serve(Listener::Tcp(listener)).unwrap());
        TcpServed {
            server,
            port,
            thread: Some(thread),
        }
    }
}

impl Drop for TcpServed {
    fn drop(&mut self) {
        self.server.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// libnbd checks a server's certificate only over TCP (on a Unix socket it has no host
/// name, and GnuTLS is told nothing to check): the chain and name there, and a client
/// certificate GnuTLS shows to a server that verifies peers.
#[test]
fn nbdinfo_over_tcp_checks_the_chain_and_name_and_shows_a_client_certificate() {
    let Some(c) = certs() else { return };
    if !have("nbdinfo") {
        return;
    }
    let s = TcpServed::new(tls_config(TlsMode::Require, &c.server, false));
    let info = |host: &str, dir: &Path| {
        Command::new("nbdinfo")
            .args([
                "--size",
                &format!(
                    "nbds://{host}:{}/?tls-certificates={}",
                    s.port,
                    dir.display()
                ),
            ])
            .output()
            .unwrap()
    };
    for host in ["localhost", "127.0.0.1"] {
        let out = info(host, &c.server);
        assert!(
            out.status.success(),
            "nbdinfo over TCP to {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1048576");
    }
    assert!(
        !info("localhost", &c.wrong).status.success(),
        "libnbd trusted a certificate another CA signed"
    );
    // Peers verified: libnbd shows client-cert.pem from the client directory.
    let v = TcpServed::new(tls_config(TlsMode::Require, &c.server, true));
    let out = Command::new("nbdinfo")
        .args([
            "--size",
            &format!(
                "nbds://localhost:{}/?tls-certificates={}",
                v.port,
                c.client.display()
            ),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nbdinfo with a client certificate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("nbdinfo")
        .args([
            "--size",
            &format!(
                "nbds://localhost:{}/?tls-certificates={}",
                v.port,
                c.server.display()
            ),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "served a client with no certificate");
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
fn ztiers_client_works_against_nbdkit_with_tls_required() {
    let Some(c) = certs() else { return };
    if !have("nbdkit") {
        return;
    }
    let socket = scratch().join("nbdkit.sock");
    let _ = std::fs::remove_file(&socket);
    let _nbdkit = Nbdkit(
        Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "--tls=require"])
            .arg(format!("--tls-certificates={}", c.server.display()))
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
        c.client.display()
    )
    .parse()
    .unwrap();
    let client = Client::connect(&uri).unwrap();
    assert_eq!(client.size(), 64 << 20);
    ztier_blockdev::testing::run_all(&client);
    // nbdkit refuses ztier's plain client, and one that trusts another CA.
    let plain: Uri = format!("nbd+unix:///?socket={}", socket.display())
        .parse()
        .unwrap();
    let e = Client::connect(&plain).err().expect("plain refused");
    assert!(e.to_string().contains("requires TLS"), "{e}");
    let wrong: Uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={}",
        socket.display(),
        c.wrong.display()
    )
    .parse()
    .unwrap();
    assert!(Client::connect(&wrong).is_err());
}
