//! The `ztier` binary as a user runs it: the class tables the kernel has, the bench's report
//! and JSON, and clear errors (with a non-zero exit) for bad input.

use std::path::{Path, PathBuf};
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

/// `ztier bench --front zswap` on the corpus at `path` with `compressor`, and `more` flags.
fn zswap_bench(path: &Path, compressor: &str, more: &[&str]) -> Output {
    let args = [
        "bench",
        "--front",
        "zswap",
        "--corpus",
        path.to_str().unwrap(),
        "--compressor",
        compressor,
    ];
    ztier(&[&args[..], more].concat())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A successful run's standard output, a JSON value a line (`--json`).
fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A small corpus file: text-like pages, a few zero pages, a few incompressible ones.
fn corpus(name: &str, pages: usize, extra_bytes: usize) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut data = Vec::new();
    let mut rng = ztier_base::rng::Rng::from_state(0x9E37_79B9_7F4A_7C15);
    for p in 0..pages {
        for i in 0..4096 {
            let x = rng.next_u64();
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
    let runs = json_lines(&o);
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
            "device_rss_bytes",
            "device_mem_used_total",
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

/// The sample's truth file, copied beside a corpus of another name, with `edit` applied.
fn truth_beside(corpus: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../samples");
    let mut truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sample.join("sample.truth.json")).unwrap()).unwrap();
    edit(&mut truth);
    let name = corpus.file_name().unwrap().to_str().unwrap();
    let stem = name.split(".pages").next().unwrap();
    let path = corpus.with_file_name(format!("{stem}.truth.json"));
    std::fs::write(path, serde_json::to_vec(&truth).unwrap()).unwrap();
}

/// A truth file is checked against the pages beside it: one for other pages (another count,
/// another SHA-256) or missing a field is an error, never figures printed "on the same
/// pages".
#[test]
fn a_truth_file_for_other_pages_is_refused() {
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    let dir = std::env::temp_dir().join(format!("ztier-cli-truth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Another corpus's figures (the sample's) beside a corpus of 64 pages.
    let other = corpus("other.pages", 64, 0);
    truth_beside(&other, |_| {});
    let o = ztier(&["bench", "--corpus", other.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("it is for 2304 pages, the corpus has 64"),
        "{}",
        stderr(&o)
    );

    // The same page count, other bytes.
    let copy = dir.join("copy.pages.zst");
    std::fs::copy(&sample, &copy).unwrap();
    truth_beside(&copy, |t| {
        t["raw_sha256"] = "00".repeat(32).into();
    });
    let o = ztier(&["bench", "--corpus", copy.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("raw_sha256"), "{}", stderr(&o));

    // A field missing.
    truth_beside(&copy, |t| {
        t["zram"]["lzo-rle"]
            .as_object_mut()
            .unwrap()
            .remove("mm_stat");
    });
    let o = ztier(&["bench", "--corpus", copy.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("missing field `mm_stat`"),
        "{}",
        stderr(&o)
    );
}

/// Figures that differ from the kernel's make the exit code non-zero, after the report.
#[test]
fn figures_different_from_the_kernels_fail_the_bench() {
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    let dir = std::env::temp_dir().join(format!("ztier-cli-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("copy.pages.zst");
    std::fs::copy(&sample, &copy).unwrap();
    truth_beside(&copy, |t| {
        let same = &mut t["zram"]["lzo-rle"]["mm_stat"]["same_pages"];
        *same = (same.as_u64().unwrap() + 1).into();
    });
    let o = ztier(&["bench", "--corpus", copy.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(
        stdout(&o).contains("DIFFERENT from the kernel's figures"),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("different from the kernel's figures: copy lzo-rle"),
        "{}",
        stderr(&o)
    );

    // Two writers: the layout-dependent fields are shown but not compared, so the sample
    // still agrees with the kernel after discard and compaction.
    let o = ztier(&["bench", "--threads", "2", "--discard-odd"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("every compared field equal"),
        "{}",
        stdout(&o)
    );
}

/// A corpus with no end is refused once it passes the bound, without reading it all.
#[test]
fn an_endless_corpus_is_refused() {
    let o = ztier(&["bench", "--corpus", "/dev/zero", "--max-corpus", "64M"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("more than 67108864 bytes of pages"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bench_through_zswap_reports_the_kernels_counters() {
    let path = corpus("zswap.pages", 64, 0);
    let bench = |more: &[&str]| zswap_bench(&path, "lzo", &[&["--threads", "1,2"], more].concat());
    let o = bench(&["--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = json_lines(&o);
    assert_eq!(runs.len(), 2);
    for r in &runs {
        let z = &r["zswap"];
        // 8 zero pages take no entry; 8 random ones are stored whole.
        assert_eq!(z["stored_pages"], 56, "{r}");
        assert_eq!(z["stored_incompressible_pages"], 8, "{r}");
        assert_eq!(z["zero_pages"], 8, "{r}");
        assert_eq!(z["Zswapped"], 56 * 4, "{r}");
        assert_eq!(r["verified"], true);
        for key in [
            "pool_total_size",
            "Zswap",
            "written_back_pages",
            "pool_limit_hit",
        ] {
            assert!(!z[key].is_null(), "{key} missing in {r}");
        }
        // zram on the same pages, beside zswap's load: its reads and its swap-in (the
        // replay fails if a swap-in pass left a page or a pool byte behind).
        for key in ["load_mb_s", "zram_read_mb_s", "zram_swapin_mb_s"] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
    }
    let o = bench(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(
        out.matches("zram on the same pages: read ").count(),
        2,
        "{out}"
    );
    assert!(
        out.contains("zswap lzo on zsmalloc: 2 threads / 1: zswap load "),
        "{out}"
    );
    let o = ztier(&["bench", "--front", "zswap", "--discard-odd"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--discard-odd"), "{}", stderr(&o));
}

/// Each front takes its own flags and the parser refuses the others, in either spelling
/// (`ztier bench FRONT`, `ztier bench --front FRONT`), before any work is done.
#[test]
fn a_flag_a_front_does_not_take_is_refused_by_the_parser() {
    for (front, flag, value) in [
        ("uffd", "--allocator", Some("zblock")),
        ("uffd", "--threads", Some("2")),
        ("uffd", "--stats", None),
        ("uffd", "--chain-size", Some("4")),
        ("zswap", "--recompress", Some("zstd")),
        ("zswap", "--budget", Some("10%")),
        ("zram", "--budget", Some("10%")),
        ("zram", "--ram", Some("16M")),
    ] {
        let flag_and_value: Vec<&str> = [flag].into_iter().chain(value).collect();
        for spelling in [vec!["bench", front], vec!["bench", "--front", front]] {
            let o = ztier(&[&spelling[..], &flag_and_value[..]].concat());
            assert!(!o.status.success(), "{spelling:?} {flag} was taken");
            assert!(
                stderr(&o).contains(&format!("unexpected argument '{flag}'")),
                "{spelling:?} {flag}: {}",
                stderr(&o)
            );
        }
    }
    // Flags of one mode of a front: refused outside it.
    for args in [
        &["bench", "--idle-epochs", "2"][..],
        &["bench", "--trace", "--threads", "2"],
        &["bench", "--writeback-format", "page"],
        &["bench", "zswap", "--max-pool-percent", "5"],
        &["bench", "zswap", "--trace", "--threads", "1,2"],
        &["bench", "uffd", "--rounds", "3"],
        &["bench", "uffd", "--unit-size", "4K,64K", "--rounds", "0"],
        &["bench", "uffd", "--unit-size", "4K,64K", "--rounds", "101"],
        // No seconds measured: nothing to judge.
        &["bench", "uffd", "--lookups", "0"],
    ] {
        let o = ztier(args);
        // Refused by the parser (clap's status), before any work.
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).starts_with("ztier: ") && stderr(&o).contains("try --help"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}

/// `bench uffd --unit-size`: a region of each compression unit, each verified, its unit in
/// the JSON.
#[test]
fn bench_uffd_runs_a_region_of_each_unit_size() {
    let path = corpus("uffd-units.pages", 256, 0);
    // The same sweep as JSON and as the report.
    let units_bench = |more: &[&str]| {
        let mut args = vec![
            "bench",
            "uffd",
            "--corpus",
            path.to_str().unwrap(),
            "--compressor",
            "lz4",
            "--unit-size",
            "4K,64K",
        ];
        args.extend_from_slice(more);
        ztier(&args)
    };
    let o = units_bench(&["--json"]);
    if !o.status.success() && stderr(&o).contains("userfaultfd is not permitted") {
        eprintln!("skipped: {}", stderr(&o));
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = json_lines(&o);
    // The runs, then the larger unit's fault-in against the page's, paired round by round.
    let (pairs, runs): (Vec<_>, Vec<_>) = lines.iter().partition(|r| r.get("rounds").is_some());
    let units: Vec<u64> = runs
        .iter()
        .map(|r| r["unit_size"].as_u64().unwrap())
        .collect();
    assert_eq!(units, [4096, 4096, 65536, 65536]);
    assert_eq!(pairs.len(), 2, "{lines:?}");
    for p in &pairs {
        assert_eq!(p["unit_size"].as_u64(), Some(65536), "{p}");
        let rounds = p["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 5, "{p}");
        for figure in [
            "ratio",
            "allowed",
            "ratio_to_allowed",
            "cap",
            "ratio_to_cap",
            "bare_cap",
            "ratio_to_bare",
        ] {
            assert!(p[figure].as_f64().is_some_and(|v| v > 0.0), "{figure}: {p}");
        }
        for r in rounds {
            for figure in [
                "page_fault_in_mb_s",
                "unit_fault_in_mb_s",
                "raw_unit_mb_s",
                "copy_in_mb_s",
                "round_trip_us",
                "bare_unit_fault_in_mb_s",
            ] {
                assert!(r[figure].as_f64().is_some_and(|v| v > 0.0), "{figure}: {p}");
            }
            // The bare handler reads a fault a window at least: the corpus's pages over 64.
            let pages = r["corpus_pages"].as_u64().unwrap();
            let bare_faults = r["bare_unit_faults"].as_u64().unwrap();
            assert!(bare_faults >= pages / 64, "{bare_faults} faults: {p}");
        }
    }
    for r in &runs {
        for figure in [
            "seq_faultin_mb_s",
            "raw_sequential_unit_mb_s",
            "raw_sequential_page_mb_s",
        ] {
            assert!(r[figure].as_f64().is_some_and(|v| v > 0.0), "{figure}: {r}");
        }
    }
    // The report sets each larger unit's fault-in against the page's and its cap, with
    // clean pages on and off, over the rounds asked for.
    let o = units_bench(&["--rounds", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let against: Vec<_> = stdout(&o)
        .lines()
        .filter(|l| l.contains("64 KiB units' sequential fault-in"))
        .map(str::to_string)
        .collect();
    assert_eq!(against.len(), 2, "{}", stdout(&o));
    assert!(
        against[0].contains("clean pages on") && against[1].contains("clean pages off"),
        "{against:?}"
    );
    assert!(
        against
            .iter()
            .all(|l| l.contains("median of 3 paired rounds")
                && l.contains("allows")
                && l.contains("at a bare handler's fault-in")),
        "{against:?}"
    );
    // Rounds with no unit larger than the page to pair: refused before any work (an error
    // of the run, status 1, not the parser's 2).
    let o = ztier(&[
        "bench",
        "uffd",
        "--corpus",
        path.to_str().unwrap(),
        "--unit-size",
        "4K",
        "--rounds",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("--rounds") && stderr(&o).contains("--unit-size gives no unit"),
        "{}",
        stderr(&o)
    );
}

/// `bench --unit-size`: each unit size's reads beside the raw decompressor's floors, and
/// every page verified.
#[test]
fn bench_unit_sizes_report_the_raw_decompressors_floors() {
    let path = corpus("units.pages", 256, 0);
    let bench = |unit_sizes: &str, more: &[&str]| {
        let mut args = vec![
            "bench",
            "--corpus",
            path.to_str().unwrap(),
            "--compressor",
            "lz4",
            "--unit-size",
            unit_sizes,
            "--random-reads",
            "200",
            "--json",
        ];
        args.extend_from_slice(more);
        let o = ztier(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        json_lines(&o)
    };
    let runs = bench("4K,64K", &[]);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in &runs {
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["allocator"], "zsmalloc", "{r}");
        for figure in [
            "sequential_read_mb_s",
            "raw_sequential_read_mb_s",
            "raw_unit_decompress_p99_us",
        ] {
            assert!(r[figure].as_f64().is_some_and(|v| v > 0.0), "{figure}: {r}");
        }
    }
    // On zblock, whose types reach the unit's size: the allocator asked for, not zsmalloc.
    let runs = bench("64K", &["--allocator", "zblock"]);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["allocator"], "zblock", "{}", runs[0]);
    assert_eq!(runs[0]["verified"], true, "{}", runs[0]);
    assert!(runs[0]["mm_stat"]["mem_used_total"]
        .as_u64()
        .is_some_and(|m| m > 0));
}

/// `bench uffd` as a user runs it: a pass with clean pages on and one with them off,
/// every page verified, their figures in the JSON, and the kernel's own path either
/// measured in the run or the reason it was not.
#[test]
fn bench_through_a_uffd_region_reports_and_verifies() {
    let path = corpus("uffd.pages", 256, 0);
    let o = ztier(&[
        "bench",
        "uffd",
        "--corpus",
        path.to_str().unwrap(),
        "--compressor",
        "lz4",
        "--json",
    ]);
    if !o.status.success() && stderr(&o).contains("userfaultfd is not permitted") {
        eprintln!("skipped: {}", stderr(&o));
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let runs = json_lines(&o);
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["clean_pages"], true);
    assert_eq!(runs[1]["clean_pages"], false);
    for r in &runs {
        assert_eq!(r["pages"], 256, "{r}");
        assert_eq!(r["budget_pages"], 64, "{r}");
        for key in [
            "evict_mb_s",
            "seq_faultin_mb_s",
            "seq_faultin_free_mb_s",
            "fault_p50_us",
            "fault_p99_us",
            "written_fault_p50_us",
            "written_fault_p99_us",
            "floor_one_cpu_p50_us",
            "rss_bytes",
            "rss_at_rest_bytes",
            "all_mem_used_total",
            "zram_mem_used_total",
        ] {
            assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
        }
        // Every page timed in the written pass was compressed as it went out, twice.
        let samples = r["written_fault_samples"].as_u64().unwrap();
        assert!(samples > 0, "{r}");
        assert!(
            r["written_evictions_dirty"].as_u64().unwrap() >= 2 * samples,
            "{r}"
        );
        // The region's CPU latency request: taken in the latency phase, and measured under
        // the floor on two CPUs, where the process may make one (root); else the reason.
        match r["cpu_latency_qos_unused"].as_str() {
            None => {
                assert_eq!(r["latency_cpu_latency_qos_held"], true, "{r}");
                assert!(
                    r["cpu_latency_qos_holds"].as_u64().is_some_and(|n| n >= 1),
                    "{r}"
                );
                if !r["floor_two_cpus_p50_us"].is_null() {
                    assert!(
                        r["floor_two_cpus_qos_p50_us"]
                            .as_f64()
                            .is_some_and(|v| v > 0.0),
                        "{r}"
                    );
                }
            }
            Some(why) => assert!(why.contains("cannot be opened"), "{why}"),
        }
        // The floor placed as the region's fault thread: measured wherever the region's
        // fault thread ran at idle priority and there are two CPUs (the same conditions).
        if r["idle_priority"] == true && !r["floor_two_cpus_p50_us"].is_null() {
            for key in ["floor_placed_p50_us", "floor_placed_p99_us"] {
                assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
            }
        }
        // The random reads' second half replayed through the oracles at the budget: MIN
        // brings in no more than any other policy; the region brought pages back.
        let o = &r["random_oracle"];
        let n = |k: &str| o[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert_eq!(n("capacity"), 64, "{r}");
        assert_eq!(
            2 * n("accesses"),
            r["random_reads"].as_u64().unwrap(),
            "{r}"
        );
        assert!(
            n("min") > 0
                && ["lru", "clock", "fault_clock"]
                    .iter()
                    .all(|k| n(k) >= n("min")),
            "{r}"
        );
        assert!(r["random_refaults"].as_u64().is_some_and(|v| v > 0), "{r}");
        // 32 zero pages are stored as nothing; of the others the region, cut to a budget of
        // one page, stores all but that one, as a zram device holding every page does.
        assert_eq!(r["zram_stored_pages"], 224, "{r}");
        let stored = r["all_stored_pages"].as_u64().unwrap();
        assert!((223..=224).contains(&stored), "{r}");
        match (
            r["kernel_in_run"].is_null(),
            r["kernel_in_run_missing"].as_str(),
        ) {
            (false, None) => {
                let k = &r["kernel_in_run"];
                assert_eq!(k["pages"], 256, "{r}");
                assert!(k["fault_samples"].as_u64().is_some_and(|n| n > 0), "{r}");
            }
            // Which reason goes with which state of the machine is ztier-uffd's test of
            // `kernel_pageout`. Here: with swap and zswap on, the bench's own sampling (its
            // corpus's pages pushed out one by one) must find single pages to time.
            (true, Some(why)) => assert_ne!(
                why,
                ztier_uffd::rig::pageout::NoKernelPath::NoSinglePage.to_string(),
                "{r}"
            ),
            _ => panic!("the kernel's path neither measured nor refused: {r}"),
        }
    }
}

/// The kernel zswap's figures on a shared corpus, through the CLI as a user runs it.
#[test]
fn bench_through_zswap_equals_the_kernel_on_a_shared_corpus() {
    let Some(dir) = ztier_corpus::shared_corpus_dir() else {
        return;
    };
    let path = dir.join("cc1.pages.zst");
    let o = zswap_bench(&path, "lzo-rle", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("every field equal to the kernel's"), "{out}");
    assert!(out.contains("the kernel's zswap"), "{out}");
}

#[test]
fn swap_bench_verifies_and_writes_back() {
    let path = corpus("swapbench.pages", 2048, 0);
    let o = ztier(&[
        "swap-bench",
        "--corpus",
        path.to_str().unwrap(),
        "--threads",
        "2",
        // Long enough (about half a second) for the shrink worker, woken by the first
        // refused store, to get a core and write back: the default 8192 operations end in
        // 20 ms, sometimes before it runs.
        "--ops",
        "200000",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    for key in [
        "verified",
        "threads",
        "stored_pages",
        "written_back_pages",
        "ops_per_s",
        "slots_allocated",
        "device_lock_acquisitions",
        "pool_total_size",
        "zswap_bytes",
        "zswapped_bytes",
    ] {
        assert!(!r[key].is_null(), "{key} missing in {r}");
    }
    assert_eq!(r["verified"], true);
    assert_eq!(r["threads"], 2);
    assert!(r["written_back_pages"].as_u64().unwrap() > 0, "{r}");
    assert!(
        r["device_lock_per_slot"].as_f64().unwrap() <= 1.0 / 64.0,
        "{r}"
    );
}

/// A time limit or an interval of zero is refused when the flags are read: at zero a
/// server would start and then cut off every client after its handshake (the OS refuses a
/// zero socket timeout), fail every handshake, or rescan the device in a tight loop.
#[test]
fn serve_refuses_zero_time_limits() {
    for flag in [
        "--reply-timeout",
        "--handshake-limit",
        "--backing-timeout",
        "--policy-interval",
    ] {
        // Captive (`--run true`): were the zero taken, the server would end with its
        // command and the test fail, not serve on for ever.
        let o = ztier(&["serve", "--size", "1M", "--run", "true", flag, "0"]);
        assert!(!o.status.success(), "{flag} 0 was taken");
        assert!(
            stderr(&o).contains("'0' is not a duration above zero"),
            "{flag}: {}",
            stderr(&o)
        );
    }
}

/// `--promotion-target`: read as a percent per minute, refused without a store, beside
/// `--writeback-idle` or out of range; a server given one reports its controller in
/// `ztier stat --json` (the starting age, the oldest, and the target as a share).
#[test]
fn serve_takes_a_promotion_target_and_reports_its_controller() {
    let dir = std::env::temp_dir().join(format!("ztier-cli-promotion-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("s");
    let stat = format!(
        "{} stat --json --socket {}",
        env!("CARGO_BIN_EXE_ztier"),
        socket.display()
    );
    let o = ztier(&[
        "serve",
        "--size",
        "1M",
        "--socket",
        socket.to_str().unwrap(),
        "--backing-dev",
        dir.join("store").to_str().unwrap(),
        "--promotion-target",
        "0.5%/min",
        "--run",
        &stat,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let p = &v["policy"]["promotion"];
    assert_eq!(p["age_secs"], 3600, "{v}");
    assert_eq!(p["target_share_per_minute"], 0.005, "{v}");
    for (flags, said) in [
        (
            &["--promotion-target", "0.2%/min"][..],
            "need a --backing-dev",
        ),
        (
            &["--promotion-target", "0.2%", "--writeback-idle", "1m"],
            "cannot be used with",
        ),
        (
            &["--promotion-target", "0.2"],
            "a percent of the stored pages",
        ),
        (&["--promotion-target", "200%"], "at most 1 (100 %/min)"),
    ] {
        let mut args = vec!["serve", "--size", "1M", "--run", "true"];
        args.extend_from_slice(flags);
        let o = ztier(&args);
        assert!(!o.status.success(), "{flags:?} was taken");
        assert!(stderr(&o).contains(said), "{flags:?}: {}", stderr(&o));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `bench --trace --promotion-target --through-nbd`: the far tier judged as a host serves it,
/// on a trace of 8 s made by hand (200 pages written once, 20 changed every 3 s): each
/// fixed age and the controller a device of one host, exported over NBD, replayed at once
/// at the trace's pace, each device's policy on the server's clock. An age of 1 s writes
/// the cold pages back and reads the hot ones from the store again; one of 30 s and the
/// controller (an hour until an age is known safe) write nothing; every run read back whole
/// through its export (or the bench fails), and says how far behind the pace it ran.
#[test]
fn the_far_tier_judged_through_nbd_at_the_traces_pace() {
    use ztier_corpus::trace::{Epoch, PageWrite, Trace, TraceWriter};
    use ztier_corpus::writer::CorpusWriter;
    const COLD: u64 = 200;
    const HOT: u64 = 20;
    let dir = std::env::temp_dir().join(format!("ztier-cli-paced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("paced.pages");
    let mut cw = CorpusWriter::create(&corpus).unwrap();
    let mut next = 0u32;
    let mut write = |vpn: u64| {
        let mut page = vec![0u8; 4096];
        page[..8].copy_from_slice(&u64::from(next).to_le_bytes());
        page[2048..2056].copy_from_slice(&vpn.to_le_bytes());
        cw.push(&page).unwrap();
        next += 1;
        PageWrite {
            vpn,
            corpus_page: next - 1,
        }
    };
    let mut epochs = vec![Epoch {
        appeared: (0..COLD + HOT).map(&mut write).collect(),
        ..Epoch::default()
    }];
    // Epochs of 500 ms; each hot page changes every sixth (3 s).
    for n in 1..=16u64 {
        let changed: Vec<PageWrite> = (COLD..COLD + HOT)
            .filter(|vpn| vpn % 6 == n % 6)
            .map(&mut write)
            .collect();
        epochs.push(Epoch {
            millis: n * 500,
            unchanged: COLD + HOT - changed.len() as u64,
            changed,
            ..Epoch::default()
        });
    }
    cw.finish().unwrap();
    let mut tw = TraceWriter::create(&Trace::path_for(&corpus)).unwrap();
    for e in &epochs {
        tw.write_epoch(e).unwrap();
    }
    tw.finish().unwrap();
    let o = ztier(&[
        "bench",
        "--trace",
        "--corpus",
        corpus.to_str().unwrap(),
        "--compressor",
        "lz4",
        "--promotion-target",
        "5%/min",
        "--fixed-ages",
        "1s,30s",
        "--policy-interval",
        "1s",
        "--through-nbd",
        "--store-dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let fixed = v["fixed"].as_array().unwrap();
    let run = |age: u64| {
        fixed
            .iter()
            .find(|r| r["age"]["fixed"]["age_secs"] == age)
            .unwrap_or_else(|| panic!("no run at {age} s: {v}"))
    };
    let count = |r: &serde_json::Value, key: &str| r[key].as_u64().unwrap();
    // A promotion is a changed page read from the store: at most one per change (the
    // reads that check every page at the end are not counted).
    let changes: u64 = epochs.iter().map(|e| e.changed.len() as u64).sum();
    assert!(count(run(1), "written_back_pages") >= COLD, "{v}");
    assert!(
        (1..=changes).contains(&count(run(1), "promotions")),
        "{changes} changes: {v}"
    );
    for r in [run(30), &v["controller"]] {
        assert_eq!(count(r, "written_back_pages"), 0, "{v}");
        assert_eq!(count(r, "promotions"), 0, "{v}");
    }
    assert_eq!(v["controller"]["controller"]["age_secs"], 3600, "{v}");
    for r in fixed.iter().chain([&v["controller"]]) {
        assert!(r["pace"]["max_lag_secs"].as_f64().is_some(), "{v}");
    }
    // Ages that are one in whole seconds, and a --store-dir that is not there: refused
    // before anything is made.
    for (flags, said) in [
        (["--fixed-ages", "1s,1500ms"], "1 s given twice"),
        (["--store-dir", "/nonexistent/ztier"], "no such directory"),
    ] {
        let mut args = vec![
            "bench",
            "--trace",
            "--corpus",
            corpus.to_str().unwrap(),
            "--promotion-target",
            "5%/min",
            "--through-nbd",
        ];
        args.extend_from_slice(&flags);
        let o = ztier(&args);
        assert!(!o.status.success(), "{flags:?} was taken");
        assert!(stderr(&o).contains(said), "{flags:?}: {}", stderr(&o));
    }
    // The run's stores and socket went with it.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with("ztier-far-tier-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
