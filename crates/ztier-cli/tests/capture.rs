//! `ztier capture` on processes whose memory the test knows: a child (this test binary run
//! again as `not_a_test_memory_child`, shared with ztier-capture's own tests) that fills pages
//! and changes some, frees a region or exits on command; a process of another user; a process
//! that is gone; and a real program (`python3` building a dict) whose capture the kernel's
//! zram and zswap are run on, beside `ztier bench`, and which `ztier bench` and `ztier plot`
//! draw. What the recorder itself captures is tested in ztier-capture's tests.

mod common;
#[path = "../../ztier-capture/tests/common/shared.rs"]
mod shared;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use shared::{serve_memory_child, MemoryChild};
use ztier_capture::{CaptureOptions, Recorder};
use ztier_corpus::trace::Trace;
use ztier_corpus::Corpus;

/// Not a test: the child the other tests capture (see `serve_memory_child`).
#[test]
#[ignore = "the child process the capture tests run, not a test"]
fn not_a_test_memory_child() {
    serve_memory_child();
}

#[test]
fn capture_every_for_writes_epochs_a_trace_and_a_manifest_that_agree() {
    let dir = common::temp_dir("capture-trace");
    let child = MemoryChild::spawn();
    // --every and --for give epochs and a manifest.
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args([
            "capture",
            "--pid",
            &child.pid().to_string(),
            "--every",
            "100ms",
            "--for",
            "300ms",
        ])
        .arg("-o")
        .arg(dir.join("cli.pages"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("cli.capture.json")).unwrap()).unwrap();
    let epochs = manifest["epochs"].as_array().unwrap().len();
    assert!(epochs >= 3, "{epochs} epochs");
    assert_eq!(
        Trace::read(&dir.join("cli.trace")).unwrap().epochs.len(),
        epochs
    );
    assert_eq!(
        Corpus::load(&dir.join("cli.pages")).unwrap().pages() as u64,
        manifest["pages"].as_u64().unwrap()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn capture_of_a_process_that_is_gone_is_one_line_saying_so() {
    let dir = common::temp_dir("capture-gone");
    let mut child = Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["capture", "--pid", &child.id().to_string()])
        .current_dir(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("no process {}", child.id())),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn capture_every_keeps_the_epochs_before_the_process_exits_and_says_it_exited() {
    let dir = common::temp_dir("capture-exit-between");
    // The epochs before are written, stderr says the process exited, the status is 0.
    let mut child = MemoryChild::spawn();
    let mut capture = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args([
            "capture",
            "--pid",
            &child.pid().to_string(),
            "--every",
            "10ms",
            "--for",
            "10m",
        ])
        .arg("-o")
        .arg(dir.join("cli.pages.zst"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(capture.stdout.take().unwrap());
    // The header, then epoch 0's row, then epoch 1's.
    for _ in 0..3 {
        let mut line = String::new();
        assert!(
            stdout.read_line(&mut line).unwrap() > 0,
            "the capture ended"
        );
    }
    writeln!(child.stdin, "exit").unwrap();
    child.child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    let out = capture.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("process {} exited", child.pid())),
        "{stderr}"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("cli.capture.json")).unwrap()).unwrap();
    assert_eq!(manifest["ended_by_exit"], true);
    let epochs = manifest["epochs"].as_array().unwrap().len();
    assert!(epochs >= 2, "{epochs} epochs");
    assert_eq!(
        Trace::read(&dir.join("cli.trace")).unwrap().epochs.len(),
        epochs
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bench_front_zswap_refuses_the_flags_it_has_no_use_for_by_name() {
    let dir = common::temp_dir("zswap-flags");
    let svg = dir.join("x.svg");
    for (args, flag) in [
        (vec!["--plot", svg.to_str().unwrap()], "--plot"),
        (vec!["--chain-sizes", "4,8"], "--chain-sizes"),
        (vec!["--trace", "--chain-sizes", "4,8"], "--chain-sizes"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(["bench", "--front", "zswap"])
            .args(&args)
            .current_dir(common::repo())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} is refused");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(!svg.exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A kernel thread's pid (PF_KTHREAD in its stat flags), if this namespace shows one.
fn kernel_thread() -> Option<u32> {
    common::pids().into_iter().find(|&pid| {
        shared::stat_field(pid, 9)
            .and_then(|flags| flags.parse::<u64>().ok())
            .is_some_and(|flags| flags & 0x0020_0000 != 0)
    })
}

#[test]
fn capture_errors_are_said_once_with_the_users_path_and_a_kernel_thread_is_named() {
    let dir = common::temp_dir("capture-errors");
    let child = MemoryChild::spawn();
    // An output in a directory that is not there: the user's path, the cause once.
    let output = dir.join("missing").join("x.pages.zst");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["capture", "--pid", &child.pid().to_string()])
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(output.to_str().unwrap()), "{stderr}");
    assert!(!stderr.contains("partial"), "{stderr}");
    assert_eq!(
        stderr.matches("No such file or directory").count(),
        1,
        "{stderr}"
    );
    drop(child);

    // A kernel thread has no user memory: said so, not that it exited.
    if let Some(pid) = kernel_thread() {
        let stderr = common::one_line_failure(
            common::ztier()
                .args(["capture", "--pid", &pid.to_string(), "-o"])
                .arg(dir.join("k.pages.zst")),
        );
        assert!(stderr.contains("is a kernel thread"), "{stderr}");
        assert!(!stderr.contains("exited"), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn capture_without_permission_is_one_clear_error() {
    let dir = common::temp_dir("capture-perm");
    let root = rustix::process::geteuid().is_root();
    // As root: capture a child of root's as `nobody`. As anyone else: capture init, root's.
    let (target, mut child) = if root {
        let c = MemoryChild::spawn();
        (c.pid(), Some(c))
    } else {
        (1, None)
    };
    // As nobody, from a copy of its own: the build's directory may be one nobody cannot
    // enter (a clone under /root).
    let binary = dir.join("ztier");
    std::fs::copy(env!("CARGO_BIN_EXE_ztier"), &binary).unwrap();
    let mut command = Command::new(&binary);
    command
        .args(["capture", "--pid", &target.to_string()])
        .arg("-o")
        .arg(dir.join("x.pages.zst"));
    if root {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        command.uid(65534).gid(65534);
    }
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no permission to read process"), "{stderr}");
    assert!(!dir.join("x.pages.zst").exists());
    child.take();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn on_a_capture_of_python_the_kernels_zram_and_zswap_agree_with_the_bench() {
    let root = rustix::process::geteuid().is_root();
    let zram = Path::new("/sys/class/zram-control").exists();
    let zswap = Path::new("/sys/module/zswap/parameters").exists();
    if !(root && zram && zswap) {
        ztier_corpus::cannot_test(&format!(
            "the kernel's figures need root ({root}), zram ({zram}) and zswap ({zswap})"
        ));
        return;
    }
    if !common::have("python3") || !common::have("zstd") || !common::have("mkswap") {
        return;
    }
    let dir = common::tmpfs_dir("capture-truth");
    // A real program's memory: CPython holding a dict of 200 000 strings and a list of
    // floats, waiting.
    let (python, line) = common::python_ready(
        "import sys\n\
         d = {i: ('value-%d-' % i) * (i % 7 + 1) for i in range(200000)}\n\
         f = [i * 0.5 for i in range(300000)]\n\
         print('ready', flush=True)\n\
         sys.stdin.read()",
        &[],
    );
    assert_eq!(line.trim(), "ready");
    let corpus = dir.join("python-dict.pages.zst");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["capture", "--pid", &python.0.id().to_string()])
        .arg("-o")
        .arg(&corpus)
        .output()
        .unwrap();
    drop(python);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // zram: every field of every compared step, for the kernel's three algorithms.
    common::assert_zram_equals_kernel(&corpus);

    // zswap: stored_pages and pool_total_size, lzo and lzo-rle.
    common::truth_script(
        "kernel-zswap-truth.py",
        &[&corpus],
        &dir.join("zswap-truth.json"),
    );
    let runs = common::bench_json(
        &[
            "--front",
            "zswap",
            "--compressor",
            "lzo",
            "--compressor",
            "lzo-rle",
        ],
        &corpus,
    );
    assert_eq!(runs.len(), 2);
    for run in &runs {
        let fields = run["kernel"]["fields"]
            .as_array()
            .expect("zswap's figures compared");
        for name in ["stored_pages", "pool_total_size"] {
            let f = fields.iter().find(|f| f["field"] == name).unwrap();
            assert_eq!(f["ztier"], f["kernel"], "{} {f}", run["compressor"]);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Renders an SVG to PNG with librsvg's rsvg-convert and says what is in it: (width,
/// height, pixels not white, distinct colours), decoded by python3 (zlib and the PNG row
/// filters, nothing more).
fn rendered(svg: &Path) -> (u64, u64, u64, u64) {
    let png = svg.with_extension("png");
    // At a third of the size: enough to see it drawn, and the decoder below is plain Python.
    let out = Command::new("rsvg-convert")
        .args(["--zoom", "0.33", "-o"])
        .arg(&png)
        .arg(svg)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rsvg-convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    const DECODE: &str = r#"
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
at, idat = 8, b''
while at < len(data):
    n, kind = struct.unpack('>I4s', data[at:at + 8])
    body = data[at + 8:at + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
    elif kind == b'IDAT':
        idat += body
    at += 12 + n
assert depth == 8 and ctype in (2, 6), (depth, ctype)
bpp = 4 if ctype == 6 else 3
raw, stride = zlib.decompress(idat), w * bpp
prev, rows, i = bytearray(stride), [], 0
for _ in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line))
    prev = line
colours, ink = set(), 0
for row in rows:
    for x in range(0, stride, bpp):
        px = row[x:x + bpp]
        colours.add(px)
        if px[:3] != b'\xff\xff\xff' and (bpp == 3 or px[3] > 0):
            ink += 1
print(w, h, ink, len(colours))
"#;
    let out = Command::new("python3")
        .args(["-c", DECODE])
        .arg(&png)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (v[0], v[1], v[2], v[3])
}

#[test]
fn a_sweep_and_a_trace_are_drawn_and_render_to_a_picture_that_is_not_blank() {
    if !common::have("rsvg-convert") || !common::have("python3") {
        return;
    }
    let dir = common::temp_dir("capture-plot");
    let sample = common::repo().join("samples/sample.pages.zst");
    // A sweep: two compressors, both allocators, two chain sizes, one table and a picture;
    // then the same picture again from its --json result by `ztier plot`.
    let sweep = dir.join("sweep.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["bench", "--compressor", "lzo-rle", "--compressor", "lz4"])
        .args(["--allocator", "all", "--chain-sizes", "4,8", "--corpus"])
        .arg(&sample)
        .arg("--plot")
        .arg(&sweep)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Zsmalloc at two chain sizes, zblock (which has none) once: 6 runs, one row each, the
    // kernel's figures beside the one run they apply to (lzo-rle, zsmalloc, chain 8).
    let rows: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("corpus "))
        .skip(1)
        .take_while(|l| l.starts_with("sample "))
        .collect();
    assert_eq!(rows.len(), 6, "one table of the 6 runs:\n{stdout}");
    assert_eq!(
        rows.iter().filter(|r| r.contains(" = ")).count(),
        2,
        "{stdout}"
    );
    let svg = std::fs::read_to_string(&sweep).unwrap();
    for title in [
        "memory by size class",
        "distribution of compressed page sizes",
        "sweep:",
    ] {
        assert!(svg.contains(title), "{title}");
    }
    // zblock has no chain size: its runs are not labelled with one; the distribution counts
    // objects; the kernel's key is there, for the runs it has figures for.
    assert!(
        !svg.contains("zblock c"),
        "a zblock run labelled with a chain size"
    );
    assert!(svg.contains("objects (compressed pages)"));
    assert!(svg.contains("in grey beside it"));
    let (w, h, ink, colours) = rendered(&sweep);
    assert!(w >= 330 && h >= 700, "{w}x{h}");
    assert!(
        ink * 20 > w * h,
        "at least 5 % of the picture drawn: {ink} of {}",
        w * h
    );
    assert!(colours >= 4, "{colours} colours");

    let json = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args([
            "bench",
            "--compressor",
            "lzo-rle",
            "--stats",
            "--json",
            "--corpus",
        ])
        .arg(&sample)
        .output()
        .unwrap();
    assert!(json.status.success());
    std::fs::write(dir.join("one.json"), &json.stdout).unwrap();
    let one = dir.join("one.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .arg("plot")
        .arg(dir.join("one.json"))
        .arg("-o")
        .arg(&one)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (w, h, ink, _) = rendered(&one);
    assert!(ink * 20 > w * h, "{ink} of {}", w * h);
    // A sweep none of whose runs has the kernel's figures (chain 4): no kernel key drawn.
    let json = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["bench", "--compressor", "lz4", "--chain-sizes", "4"])
        .args(["--allocator", "all", "--json", "--corpus"])
        .arg(&sample)
        .output()
        .unwrap();
    assert!(json.status.success());
    std::fs::write(dir.join("nokernel.json"), &json.stdout).unwrap();
    let nokernel = dir.join("nokernel.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .arg("plot")
        .arg(dir.join("nokernel.json"))
        .arg("-o")
        .arg(&nokernel)
        .output()
        .unwrap();
    assert!(out.status.success());
    let svg = std::fs::read_to_string(&nokernel).unwrap();
    assert!(svg.contains("sweep:"));
    assert!(!svg.contains(">kernel<") && !svg.contains("in grey beside it"));
    // A result whose allocator table overflows 64 bits is refused, not wrapped.
    let first = String::from_utf8_lossy(&json.stdout)
        .lines()
        .next()
        .unwrap()
        .to_owned();
    let mut huge: serde_json::Value = serde_json::from_str(&first).unwrap();
    huge["allocator_stats"] = serde_json::json!({
        "allocator": "zsmalloc",
        "rows": [{"size": 3072, "obj_used": u64::MAX / 2, "pages_used": 1}],
    });
    std::fs::write(dir.join("huge.json"), format!("{huge}\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .arg("plot")
        .arg(dir.join("huge.json"))
        .arg("-o")
        .arg(dir.join("huge.svg"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("overflow 64 bits"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A result with nothing to draw is refused, saying why.
    std::fs::write(dir.join("bad.json"), "{\"x\": 1}\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .arg("plot")
        .arg(dir.join("bad.json"))
        .arg("-o")
        .arg(dir.join("bad.svg"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a zram run, a trace replay"));

    // A trace: a child captured over epochs while it changes pages, replayed with the idle
    // policy writing back, its memory over time drawn.
    let mut child = MemoryChild::spawn();
    let corpus = dir.join("child.pages.zst");
    let mut recorder = Recorder::start(child.pid(), &corpus, CaptureOptions::default()).unwrap();
    recorder.epoch(&mut |_| {}).unwrap();
    child.command("change");
    recorder.epoch(&mut |_| {}).unwrap();
    recorder.epoch(&mut |_| {}).unwrap();
    recorder.finish().unwrap();
    let trace_svg = dir.join("trace.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["bench", "--trace", "--corpus"])
        .arg(&corpus)
        .arg("--writeback-file")
        .arg(dir.join("wb"))
        .arg("--plot")
        .arg(&trace_svg)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["epochs"].as_array().unwrap().len(), 3);
    assert_eq!(run["verified"], true);
    assert!(run["written_back_pages"].as_u64().unwrap() > 0, "{run}");
    let svg = std::fs::read_to_string(&trace_svg).unwrap();
    assert!(svg.contains("memory over time"));
    // The store's line is its bytes stored, said so.
    assert!(svg.contains("on the backing store (bytes stored)"));
    // The far tier judged on it, drawn: each fixed age and the controller against the
    // target; and the capture at three unit sizes, memory against a random read's p99.
    for (args, said) in [
        (
            &[
                "--trace",
                "--promotion-target",
                "5%/min",
                "--fixed-ages",
                "1s,2s",
            ][..],
            &["the far tier", "controller", "1s", "2s"][..],
        ),
        (
            &["--unit-size", "4K,16K,64K", "--random-reads", "200"][..],
            &["random 4 KiB read", "4K", "16K", "64K"][..],
        ),
    ] {
        let drawn = dir.join("drawn.svg");
        let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .arg("bench")
            .args(args)
            .arg("--corpus")
            .arg(&corpus)
            .arg("--plot")
            .arg(&drawn)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let svg = std::fs::read_to_string(&drawn).unwrap();
        for s in said {
            assert!(svg.contains(s), "{args:?}: no {s:?} in the picture");
        }
        std::fs::remove_file(&drawn).unwrap();
    }
    // The far tier over the corpus read on from its file, past a --max-corpus that holds
    // its largest epoch but not the whole: said so, and the same verdict.
    let trace = Trace::read(&Trace::path_for(&corpus)).unwrap();
    let largest_epoch = trace
        .epochs
        .iter()
        .map(|e| e.appeared.len() + e.changed.len())
        .max()
        .unwrap();
    assert!((largest_epoch as u64) < trace.corpus_pages());
    // Past an epoch, the corpus cannot be read on either: said before anything runs.
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args([
            "bench",
            "--trace",
            "--promotion-target",
            "5%/min",
            "--max-corpus",
        ])
        .arg((largest_epoch * 4096 - 4096).to_string())
        .arg("--corpus")
        .arg(&corpus)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("holds one epoch's pages at a time: give --max-corpus"),
        "{said}"
    );
    let verdict = |max_corpus: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(["bench", "--trace", "--promotion-target", "5%/min"])
            .args([
                "--fixed-ages",
                "1s,2s",
                "--json",
                "--max-corpus",
                max_corpus,
            ])
            .arg("--corpus")
            .arg(&corpus)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        let verdict: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (verdict, stderr)
    };
    let (whole, said_whole) = verdict("1G");
    let (streamed, said_streamed) = verdict(&(largest_epoch * 4096).to_string());
    assert!(
        !said_whole.contains("read on from the file"),
        "{said_whole}"
    );
    assert!(
        said_streamed.contains("read on from the file"),
        "{said_streamed}"
    );
    assert_eq!(whole, streamed);
    // So is the trace through zram with its policy: the same memory, epoch by epoch.
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["bench", "--trace", "--json", "--max-corpus"])
        .arg((largest_epoch * 4096).to_string())
        .arg("--corpus")
        .arg(&corpus)
        .arg("--writeback-file")
        .arg(dir.join("wb-streamed"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let streamed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(streamed["epochs"], run["epochs"]);
    assert_eq!(streamed["verified"], true);
    // The same trace through zswap with a pool limit of 1 % of 16 MiB: verified, some pages
    // sent to the device.
    let out = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args([
            "bench",
            "--trace",
            "--front",
            "zswap",
            "--compressor",
            "lzo",
        ])
        .args([
            "--ram",
            "16M",
            "--max-pool-percent",
            "1",
            "--json",
            "--corpus",
        ])
        .arg(&corpus)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(run["verified"], true);
    assert_eq!(run["epochs"].as_array().unwrap().len(), 3);
    let z = &run["final_zswap"];
    assert!(
        z["swpout_device"].as_u64().unwrap() + z["written_back_pages"].as_u64().unwrap() > 0,
        "{run}"
    );
    let (w, h, ink, colours) = rendered(&trace_svg);
    assert!(ink * 50 > w * h, "{ink} of {}", w * h);
    assert!(colours >= 4, "{colours} colours");
    std::fs::remove_dir_all(&dir).unwrap();
}
