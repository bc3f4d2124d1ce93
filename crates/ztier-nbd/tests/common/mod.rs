//! What the TLS tests (`tls.rs`, `tls_tools.rs`) share: a tool's absence said (or, under
//! CI, a failure), the test certificates made with `openssl` (a CA, a server certificate for
//! localhost, 127.0.0.1 and ::1, a client certificate, and a second CA that signed none of
//! them), laid out as nbdkit's `--tls-certificates` and libnbd's `tls-certificates=` want
//! them, and a server over a Unix socket.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_nbd::client::Uri;
use ztier_nbd::{Listener, Server, ServerConfig, ServerTls, TlsMode};

/// What a test does when a tool is missing: says so and skips, or under CI fails (as
/// `ztier_corpus::cannot_test`, which this crate may not import).
pub fn cannot_test(why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("{why}; CI must not skip this test");
    }
    eprintln!("skipping: {why}");
}

pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        cannot_test(&format!("{tool} is not installed"));
    }
    found
}

pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The certificate directories: `server` (nbdkit's layout, and the CA for libnbd),
/// `client` (the CA, and a client certificate), `wrong` (another CA).
pub struct Certs {
    pub server: PathBuf,
    pub client: PathBuf,
    pub wrong: PathBuf,
}

pub const OPENSSL_CNF: &str = "\
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
subjectAltName = DNS:localhost,IP:127.0.0.1,IP:::1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[legacy]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[elsewhere]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:elsewhere.example
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
";

pub fn openssl(dir: &Path, args: &[&str]) {
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

/// A CA (key and certificate) in `dir`.
pub fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
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
            &format!("/CN={name}"),
        ],
    );
}

/// `PREFIX-cert.pem` and `PREFIX-key.pem` in `dir`, signed by the CA there.
pub fn make_leaf(dir: &Path, prefix: &str, extensions: &str, serial: &str) {
    let (key, cert, csr) = (
        format!("{prefix}-key.pem"),
        format!("{prefix}-cert.pem"),
        format!("{prefix}.csr"),
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-config",
            "openssl.cnf",
            "-subj",
            "/CN=localhost",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-set_serial",
            serial,
            "-days",
            "3650",
            "-out",
            &cert,
            "-extfile",
            "openssl.cnf",
            "-extensions",
            extensions,
        ],
    );
}

/// The test certificates, made once per test process; `None` (after saying why) without
/// openssl.
pub fn certs() -> Option<&'static Certs> {
    static CERTS: OnceLock<Option<Certs>> = OnceLock::new();
    CERTS
        .get_or_init(|| {
            if !have("openssl") {
                return None;
            }
            let root = scratch().join("certs");
            let _ = std::fs::remove_dir_all(&root);
            let (server, client, wrong) =
                (root.join("server"), root.join("client"), root.join("wrong"));
            for d in [&server, &client, &wrong] {
                std::fs::create_dir_all(d).unwrap();
                std::fs::write(d.join("openssl.cnf"), OPENSSL_CNF).unwrap();
            }
            make_ca(&server, "ztier test CA");
            make_leaf(&server, "server", "server", "2");
            make_leaf(&server, "client", "client", "3");
            std::fs::copy(server.join("ca-cert.pem"), client.join("ca-cert.pem")).unwrap();
            for f in ["client-cert.pem", "client-key.pem"] {
                std::fs::rename(server.join(f), client.join(f)).unwrap();
            }
            make_ca(&wrong, "another CA");
            Some(Certs {
                server,
                client,
                wrong,
            })
        })
        .as_ref()
}

pub struct Served {
    pub server: Arc<Server>,
    pub path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// `nbds+unix:///EXPORT?socket=...&tls-certificates=DIR`.
    pub fn tls_uri(&self, dir: &Path) -> Uri {
        format!(
            "nbds+unix:///?socket={}&tls-certificates={}",
            self.path.display(),
            dir.display()
        )
        .parse()
        .unwrap()
    }

    pub fn plain_uri(&self) -> Uri {
        format!("nbd+unix:///?socket={}", self.path.display())
            .parse()
            .unwrap()
    }

    pub fn stop(&mut self) {
        self.server.stop();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn tls_config(mode: TlsMode, dir: &Path, verify_peer: bool) -> ServerConfig {
    ServerConfig {
        tls: ServerTls::from_dir(mode, dir, verify_peer).unwrap(),
        ..ServerConfig::default()
    }
}

pub fn serve_unix(name: &str, dev: Arc<dyn BlockDevice>, config: ServerConfig) -> Served {
    let path = scratch().join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let server = Server::new(dev, config);
    let s = Arc::clone(&server);
    let thread = std::thread::spawn(move || s.serve(Listener::Unix(listener)).unwrap());
    Served {
        server,
        path,
        thread: Some(thread),
    }
}

pub fn memory(size: u64) -> Arc<dyn BlockDevice> {
    Arc::new(MemoryDevice::new(size).unwrap())
}
