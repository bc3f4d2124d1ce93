//! What ztier-capture's tests share: a fresh directory, finding a tool (or saying it is
//! missing and skipping, except under CI), and, in `shared`, what they share with ztier-cli's
//! tests of `ztier capture` (the processes captured).
#![allow(dead_code)] // each test file uses its own part

pub mod shared;

use std::path::PathBuf;
use std::process::Command;

/// An empty directory of this test process's own.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

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
