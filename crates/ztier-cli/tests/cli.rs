//! The `ztier` binary as a user runs it: the class tables the kernel has, the bench's report
//! and JSON, and clear errors (with a non-zero exit) for bad input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn ztier(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(args)
        .output()
        .expect("run ztier")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A small corpus file: text-like pages, a few zero pages, a few incompressible ones.
fn corpus(name: &str, pages: usize, extra_bytes: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = Vec::new();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for p in 0..pages {
        for i in 0..4096 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.push(match p % 8 {
                0 => 0,
                7 => x as u8,
                _ => b"zram zsmalloc zblock "[(i + p) % 21],
            });
        }
    }
    data.extend(std::iter::repeat_n(1u8, extra_bytes));
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

#[test]
fn classes_match_the_kernels_tables() {
    for (chain, rule, unique, watermark) in [
        (4, "least-waste", 69, 3264),
        (8, "least-waste", 119, 3632),
        (16, "least-waste", 192, 3840),
        (4, "used-percent", 69, 3264),
        (8, "used-percent", 123, 3632),
        (16, "used-percent", 191, 3840),
    ] {
        let o = ztier(&[
            "classes",
            "--chain-size",
            &chain.to_string(),
            "--chain-rule",
            rule,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["unique_classes"], unique, "chain {chain} {rule}");
        assert_eq!(v["huge_watermark"], watermark, "chain {chain} {rule}");
        assert_eq!(v["classes"].as_array().unwrap().len(), unique);
        if chain == 8 {
            assert_eq!(v["huge_class_size"], 3625);
        }
    }
    let table = stdout(&ztier(&["classes"]));
    assert!(table.contains("119 unique classes of 255"));
}

#[test]
fn bench_reports_and_verifies() {
    let path = corpus("small.pages", 64, 0);
    let o = ztier(&[
        "bench",
        "--corpus",
        path.to_str().unwrap(),
        "--compressor",
        "lz4",
        "--discard-odd",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("every page verified"), "{out}");
    assert!(out.contains("mm_stat after discard"), "{out}");

    let o = ztier(&[
        "bench",
        "--corpus",
        path.to_str().unwrap(),
        "--json",
        "--allocator",
        "all",
        "--threads",
        "2",
        "--discard-odd",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    for r in &runs {
        for key in [
            "corpus",
            "pages",
            "allocator",
            "compressor",
            "chain_size",
            "threads",
            "mm_stat",
            "mm_stat_after_compact",
            "mm_stat_after_discard",
            "store_mb_s",
            "load_mb_s",
            "raw_compress_mb_s",
            "raw_decompress_mb_s",
            "rss_bytes",
            "verified",
        ] {
            assert!(!r[key].is_null(), "{key} missing in {r}");
        }
        assert_eq!(r["verified"], true);
        assert_eq!(r["mm_stat"]["orig_data_size"], 64 * 4096);
        assert_eq!(r["mm_stat"]["same_pages"], 8);
        assert_eq!(r["mm_stat"]["huge_pages"], 8);
        assert_eq!(r["mm_stat_after_discard"]["orig_data_size"], 32 * 4096);
    }
    let o = ztier(&[
        "bench",
        "--corpus",
        path.to_str().unwrap(),
        "--page-size",
        "16384",
        "--compressor",
        "zstd:level=1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("16 pages of 16384 B"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let truncated = corpus("cut.pages", 4, 100);
    let o = ztier(&["bench", "--corpus", truncated.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a whole number of 4096-byte pages"),
        "{}",
        stderr(&o)
    );

    let o = ztier(&["bench", "--corpus", "/nonexistent/x.pages"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("/nonexistent/x.pages"),
        "{}",
        stderr(&o)
    );

    let o = ztier(&["bench", "--compressor", "lzma"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown compressor 'lzma'"),
        "{}",
        stderr(&o)
    );

    let o = ztier(&["bench", "--compressor", "zstd:level=99"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("out of range"), "{}", stderr(&o));

    let o = ztier(&["classes", "--page-size", "8192"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a supported page size"),
        "{}",
        stderr(&o)
    );

    let o = ztier(&["bench", "--allocator", "slab"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown allocator 'slab'"),
        "{}",
        stderr(&o)
    );
}
