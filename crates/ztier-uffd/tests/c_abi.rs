//! The C ABI from C: `tests/c/region_test.c` compiled with the machine's `cc` against the
//! crate's cdylib and header, and run.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    let run = Command::new(&out).output().expect("running the C test");
    let _ = std::fs::remove_file(&out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    print!("{}", String::from_utf8_lossy(&run.stdout));
    if run.status.code() == Some(77) {
        return skip(&stderr);
    }
    assert!(
        run.status.success(),
        "the C test failed ({}): {stderr}",
        run.status
    );
}
