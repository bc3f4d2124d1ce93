//! The C ABI from C: `tests/c/region_test.c` compiled with the machine's `cc` against the
//! crate's cdylib and header, and run.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the C test may run (it takes well under a second) before it is killed and the
/// test fails: a fault its region's handler never serves must not hang CI.
const LIMIT: Duration = Duration::from_secs(60);

/// Skips (printing why) unless `CI` is set, where it fails.
fn skip(why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("CI must run the C test: {why}");
    }
    eprintln!("skipped: {why}");
}

/// The directory holding `libztier_uffd.so`: the test binary's (deps/) or its parent.
fn library_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let found = [deps, deps.parent()?]
        .into_iter()
        .find(|d| d.join("libztier_uffd.so").exists())
        .map(Path::to_path_buf);
    found
}

#[test]
fn the_c_test_passes() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(lib) = library_dir() else {
        return skip("libztier_uffd.so was not built beside the test");
    };
    let out = std::env::temp_dir().join(format!("ztier-uffd-c-test-{}", std::process::id()));
    let cc = Command::new("cc")
        .arg("-std=c11")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-O1")
        .arg("-I")
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("tests/c/region_test.c"))
        .arg("-o")
        .arg(&out)
        .arg("-L")
        .arg(&lib)
        .arg("-lztier_uffd")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status();
    match cc {
        Err(e) => return skip(&format!("cc: {e}")),
        Ok(s) => assert!(s.success(), "cc failed: {s}"),
    }
    // The library the program was linked against, not whatever cargo's own library path
    // finds first (an older copy in target/debug, left by a `cargo build` before a change).
    let mut child = Command::new(&out)
        .env("LD_LIBRARY_PATH", &lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the C test");
    // Its output is a few lines: the pipes never fill, so waiting before reading them is
    // safe.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the C test") {
            break status;
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&out);
            panic!(
                "the C test still ran after {} s (a fault never served?): killed",
                LIMIT.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = std::fs::remove_file(&out);
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let _ = child
        .stdout
        .take()
        .expect("piped")
        .read_to_string(&mut stdout);
    let _ = child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr);
    print!("{stdout}");
    if status.code() == Some(77) {
        return skip(&stderr);
    }
    assert!(status.success(), "the C test failed ({status}): {stderr}");
}
