//! The NBD client against ztier's own server: the block-device conformance suite through
//! the wire, errors from the server, a server that goes away and one that comes back.

use std::path::PathBuf;
use std::sync::Arc;

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::{BlockDevice, BlockError};
use ztier_nbd::client::{Client, Uri};
use ztier_nbd::{Listener, Server, ServerConfig};

struct Served {
    server: Arc<Server>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn serve(name: &str, dev: Arc<dyn BlockDevice>, config: ServerConfig) -> Served {
    let dir = std::env::temp_dir().join(format!("ztier-nbd-client-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sock"));
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

impl Served {
    fn uri(&self, export: &str) -> Uri {
        format!("nbd+unix:///{export}?socket={}", self.path.display())
            .parse()
            .unwrap()
    }
    fn stop(&mut self) {
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

fn config(export: &str) -> ServerConfig {
    ServerConfig {
        export_name: export.into(),
        log: false,
        ..ServerConfig::default()
    }
}

#[test]
fn the_conformance_suite_passes_through_the_wire() {
    let s = serve(
        "suite",
        Arc::new(MemoryDevice::new(4 << 20).unwrap()),
        config("disk"),
    );
    let client = Client::connect(&s.uri("disk")).unwrap();
    assert_eq!(client.size(), 4 << 20);
    ztier_blockdev::testing::run_all(&client);
}

#[test]
fn large_requests_are_split_and_errors_are_clear() {
    let s = serve(
        "split",
        Arc::new(MemoryDevice::new(64 << 20).unwrap()),
        config(""),
    );
    let client = Client::connect(&s.uri("")).unwrap();
    let data = ztier_base::pattern::pattern(7, 40 << 20);
    client.write_at(4096, &data, false).unwrap();
    let mut back = vec![0u8; data.len()];
    client.read_at(4096, &mut back).unwrap();
    assert!(back == data);
    assert!(matches!(
        client.read_at(64 << 20, &mut [0u8; 512]),
        Err(BlockError::OutOfRange { .. })
    ));
    let err = Client::connect(&s.uri("nosuch")).err().unwrap();
    assert!(err.to_string().contains("no export named"), "{err}");
}

#[test]
fn a_read_only_export_refuses_writes() {
    let mut c = config("ro");
    c.read_only = true;
    let s = serve("ro", Arc::new(MemoryDevice::new(1 << 20).unwrap()), c);
    let client = Client::connect(&s.uri("ro")).unwrap();
    assert!(matches!(
        client.write_at(0, &[1u8; 4096], false),
        Err(BlockError::ReadOnly)
    ));
    client.read_at(0, &mut [0u8; 4096]).unwrap();
}

#[test]
fn a_vanished_server_is_an_error_until_the_owner_reconnects() {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(1 << 20).unwrap());
    let mut s = serve("gone", dev.clone(), config("x"));
    let client = Client::connect(&s.uri("x")).unwrap();
    client.write_at(0, &[5u8; 4096], false).unwrap();
    s.stop();
    let _ = std::fs::remove_file(&s.path);
    let err = client.write_at(4096, &[6u8; 4096], false).unwrap_err();
    assert!(matches!(err, BlockError::Io(_)), "{err}");
    assert!(
        client.read_at(0, &mut [0u8; 4096]).is_err(),
        "no server, no read"
    );
    assert!(!client.is_connected());
    assert!(client.reconnect().is_err(), "nobody to dial");
    // The same device served again at the same place: nothing happens by itself...
    let _back = serve("gone", dev, config("x"));
    let err = client.read_at(0, &mut [0u8; 4096]).unwrap_err();
    assert!(err.to_string().contains("reconnect"), "{err}");
    // ...until the owner reconnects.
    client.reconnect().unwrap();
    let mut page = [0u8; 4096];
    client.read_at(0, &mut page).unwrap();
    assert_eq!(page, [5u8; 4096]);
}
