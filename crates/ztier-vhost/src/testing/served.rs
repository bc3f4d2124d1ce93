//! A ztier vhost-user-blk server on a socket of its own, served on a thread of its own, for a
//! test's [`Guest`](super::Guest) to attach to; stopped (its connection's requests in hand
//! finished) when the test stops or drops it.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::ANSWER_WAIT;
use crate::{DeviceConfig, Server, VhostError};
use ztier_blockdev::BlockDevice;

/// A served device: the server, its socket and the thread serving it.
pub struct Served {
    pub server: Arc<Server>,
    pub path: PathBuf,
    thread: Option<JoinHandle<Result<(), VhostError>>>,
    /// Says when the serving thread has returned.
    done: std::sync::mpsc::Receiver<()>,
}

/// A fresh directory for a test's socket.
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "ztier-vhost-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Served {
    pub fn start(dev: Arc<dyn BlockDevice>, config: DeviceConfig) -> Served {
        let path = scratch_dir("sock").join("blk.sock");
        Served::start_at(dev, config, &path)
    }

    /// Serves `dev` at `path` (a server started again where a guest will reconnect).
    pub fn start_at(dev: Arc<dyn BlockDevice>, config: DeviceConfig, path: &Path) -> Served {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path).unwrap();
        let server = Server::new(dev, config).unwrap();
        let s = Arc::clone(&server);
        let (tx, done) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let r = s.serve(listener);
            let _ = tx.send(());
            r
        });
        Served {
            server,
            path: path.to_path_buf(),
            thread: Some(thread),
            done,
        }
    }

    /// Stops the server and waits for it: its connection's requests in hand are finished.
    pub fn stop(mut self) -> Result<(), VhostError> {
        self.server.stop();
        self.done
            .recv_timeout(ANSWER_WAIT)
            .expect("the server stopped: its queues' threads ended");
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.server.stop();
            // A server that never stops (a queue's thread that never ends) fails the test
            // that dropped it, rather than hanging the run: it is left behind.
            if self.done.recv_timeout(ANSWER_WAIT).is_ok() {
                let _ = t.join();
            } else if !std::thread::panicking() {
                panic!("the server did not stop within {ANSWER_WAIT:?}");
            }
        }
    }
}
