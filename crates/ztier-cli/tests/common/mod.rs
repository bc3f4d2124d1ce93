//! What the CLI's integration tests share: finding a tool (or saying it is missing and
//! skipping, except under CI), a fresh directory, and reading fio's JSON report.
#![allow(dead_code)] // each test file uses its own part

use std::path::PathBuf;
use std::process::{Command, Output};

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
