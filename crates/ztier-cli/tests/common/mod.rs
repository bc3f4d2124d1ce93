//! What the CLI's integration tests share: finding a tool (or saying it is missing and
//! skipping, except under CI), a fresh directory, reading fio's JSON report, and running
//! `ztier` (as this user or as `nobody`) and its control socket.
#![allow(dead_code)] // each test file uses its own part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// Far past anything a working server takes; only a broken one reaches it.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Whether `tool` is on PATH; if not, says so (and fails under CI, where nothing may skip).
pub fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        ztier_corpus::cannot_test(&format!(
            "{tool} is not installed (scripts/setup.sh installs it)"
        ));
    }
    found
}

/// An empty directory of this test process's own.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// fio's `--output-format=json` report (the nbd engine prints "fio: connected to NBD
/// server" before it).
pub fn fio_report(out: &Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').expect("a JSON report")..];
    serde_json::from_str(json).unwrap()
}

/// The `ztier` binary under test.
pub fn ztier() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
}

/// Waits until `path` exists; `what` is what should have made it.
pub fn wait_for(path: &Path, what: &str) {
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < DEADLINE, "{what} never made {path:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A server's control socket: its data socket's path with `.ctl` appended.
pub fn ctl_socket(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// `ztier ctl --socket SOCKET WORDS...`.
pub fn ctl(socket: &Path, words: &[&str]) -> Output {
    ztier()
        .arg("ctl")
        .arg("--socket")
        .arg(socket)
        .args(words)
        .output()
        .unwrap()
}

/// A command's stdout and stderr together, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `ztier ARGS` as the user `nobody`.
pub fn as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_ztier"))
        .args(args)
        .output()
        .unwrap()
}
