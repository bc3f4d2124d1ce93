//! `ztier serve` with the clients people use: libnbd's nbdinfo, nbdcopy and nbdsh, and
//! qemu-img. Each test starts the server on a Unix socket, drives it with one client, and
//! stops it with SIGINT (it must answer what is in flight, remove its socket and print its
//! statistics). A client that is not installed makes its test say so and skip, except
//! under CI, which installs them all (scripts/setup.sh).

mod common;

use std::path::{Path, PathBuf};

use common::{fio_report, have, temp_dir};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A running `ztier serve` on a Unix socket.
struct Served {
    child: Option<Child>,
    socket: PathBuf,
}

impl Served {
    fn start(dir: &Path, extra: &[&str]) -> Served {
        let socket = dir.join("nbd.sock");
        let mut args = vec!["serve", "--socket", socket.to_str().unwrap(), "--quiet"];
        args.extend_from_slice(extra);
        let child = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Served {
            child: Some(child),
            socket,
        }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// SIGINT, then the server's output; it must exit 0 and remove its socket.
    fn stop(mut self) -> Output {
        let child = self.child.take().unwrap();
        let pid = child.id().to_string();
        assert!(Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap()
            .success());
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!self.socket.exists(), "socket removed at shutdown");
        out
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The bundled sample's raw pages in a file (9 MiB of real memory), with 3 MiB of zeros
/// after them, so the copy has a hole to skip.
fn sample_file(dir: &Path) -> PathBuf {
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    let corpus = ztier_corpus::Corpus::load(&sample).unwrap();
    let mut bytes = corpus.bytes().to_vec();
    bytes.resize(12 << 20, 0);
    let path = dir.join("sample.raw");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs a Python script in nbdsh (libnbd's handle is `h`; `uri` is set). nbdsh runs the
/// `python3` on PATH, which must be the one Debian's python3-libnbd installed into: a
/// pyenv or venv python found first does not have it, so /usr/bin goes first.
fn nbdsh(uri: &str, script: &str) -> Output {
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    Command::new("nbdsh")
        .env("PATH", path)
        .args(["-c", &format!("uri = {uri:?}\n{script}")])
        .output()
        .unwrap()
}

/// nbdcopy `input` into the export and back out to a file: the same bytes.
fn copy_in_and_out(served: &Served, input: &Path, dir: &Path) {
    run("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let back = dir.join("back.raw");
    run("nbdcopy", &[&served.uri(), back.to_str().unwrap()]);
    assert!(
        std::fs::read(input).unwrap() == std::fs::read(&back).unwrap(),
        "copied out as copied in"
    );
}

#[test]
fn nbdcopy_in_and_out_and_nbdinfo() {
    if !have("nbdcopy") || !have("nbdinfo") {
        return;
    }
    let dir = temp_dir("nbdcopy");
    let input = sample_file(&dir);
    let served = Served::start(&dir, &["--size", "12M", "--compressor", "lz4"]);
    copy_in_and_out(&served, &input, &dir);

    let info = String::from_utf8(run("nbdinfo", &["--json", &served.uri()]).stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(&info).unwrap();
    let export = &v["exports"][0];
    assert_eq!(export["export-size"], 12 << 20);
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_multi_conn",
        "can_cache",
    ] {
        assert_eq!(export[flag], true, "{flag} in {info}");
    }
    assert_eq!(export["is_read_only"], false);

    // The 3 MiB nbdcopy never wrote are a hole; the zero pages it wrote are zero.
    let map = String::from_utf8(run("nbdinfo", &["--map", &served.uri()]).stdout).unwrap();
    let last = map.lines().last().unwrap();
    assert!(last.contains("hole,zero"), "{map}");
    assert!(map.lines().any(|l| l.trim_end().ends_with("data")), "{map}");
    // The running server's statistics, as text and as JSON.
    let socket = served.socket.to_str().unwrap().to_owned();
    let ztier = env!("CARGO_BIN_EXE_ztier");
    let text = String::from_utf8(run(ztier, &["stat", "--socket", &socket]).stdout).unwrap();
    assert!(
        text.starts_with("mm_stat ")
            && text.contains("\nio_stat ")
            && text.contains("obj_allocated"),
        "{text}"
    );
    let json = run(ztier, &["stat", "--socket", &socket, "--json"]).stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(
        v["mm_stat"]["orig_data_size"].as_u64().unwrap() >= 8 << 20,
        "{v}"
    );
    assert!(
        v["server"]["bytes_written"].as_u64().unwrap() >= 8 << 20,
        "{v}"
    );
    assert_eq!(v["allocator"]["allocator"], "zsmalloc");
    let control = PathBuf::from(format!("{socket}.ctl"));
    let out = served.stop();
    assert!(!control.exists(), "control socket removed at shutdown");
    let stats = String::from_utf8_lossy(&out.stdout);
    assert!(
        stats.contains("mm_stat") && stats.contains("io_stat"),
        "{stats}"
    );
}

#[test]
fn qemu_img_convert_in_and_out() {
    if !have("qemu-img") {
        return;
    }
    let dir = temp_dir("qemu");
    let input = sample_file(&dir);
    let served = Served::start(&dir, &["--size", "12M", "--compressor", "zstd"]);
    run(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            input.to_str().unwrap(),
            &served.uri(),
        ],
    );
    let back = dir.join("back.raw");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &served.uri(),
            back.to_str().unwrap(),
        ],
    );
    assert!(std::fs::read(&input).unwrap() == std::fs::read(&back).unwrap());
    let info = String::from_utf8(run("qemu-img", &["info", "--output=json", &served.uri()]).stdout)
        .unwrap();
    assert!(
        info.contains(&format!("\"virtual-size\": {}", 12 << 20)),
        "{info}"
    );
    served.stop();
}

/// Every command and flag through libnbd, with block status after each change.
#[test]
fn nbdsh_commands_and_block_status() {
    if !have("nbdsh") {
        return;
    }
    let dir = temp_dir("nbdsh");
    let served = Served::start(&dir, &["--size", "1M", "--export-name", "disk"]);
    let script = r#"
import nbd
h.set_export_name("disk")
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
assert h.get_size() == 1 << 20
assert h.can_fua() and h.can_trim() and h.can_zero() and h.can_fast_zero() and h.can_cache() and h.can_multi_conn()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)

def status(offset, length):
    out = []
    def f(metacontext, off, entries, err):
        out.extend(zip(entries[0::2], entries[1::2]))
    h.block_status(length, offset, f)
    return out

page = bytes(range(256)) * 16
h.pwrite(page * 2, 4096, nbd.CMD_FLAG_FUA)
assert h.pread(8192, 4096) == page * 2
assert status(0, 4 * 4096)[0] == (4096, nbd.STATE_HOLE | nbd.STATE_ZERO)
assert status(4096, 8192) == [(8192, 0)]
h.trim(4096, 4096)
assert h.pread(4096, 4096) == bytes(4096)
assert status(4096, 4096) == [(4096, nbd.STATE_HOLE | nbd.STATE_ZERO)]
h.zero(4096, 8192, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8192, 8192) == bytes(8192)
assert status(8192, 4096) == [(4096, nbd.STATE_ZERO)], status(8192, 4096)
h.pwrite(page, 8192)
h.zero(4096, 8192)
assert status(8192, 4096) == [(4096, nbd.STATE_HOLE | nbd.STATE_ZERO)]
h.zero(4096, 0, nbd.CMD_FLAG_FAST_ZERO)
# A sub-page write (aligned to the 512-byte minimum) is a read-modify-write of its page.
h.pwrite(b"x" * 512, 1024)
assert h.pread(2048, 0) == bytes(1024) + b"x" * 512 + bytes(512)
# Below the minimum block, a client that asked for block sizes is refused by the server.
h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ALIGN)
try:
    h.pwrite(b"y" * 100, 10)
    raise SystemExit("a misaligned write was accepted")
except nbd.Error as e:
    assert e.errnum == 22, e
assert h.pread(512, 0) == bytes(512)
h.flush()
h.cache(4096, 0)
for off, length in [(1 << 20, 1), ((1 << 20) - 512, 1024)]:
    try:
        h.pread(length, off)
        raise SystemExit("read past the end was accepted")
    except nbd.Error as e:
        assert e.errnum == 22, e
try:
    h.pwrite(b"y" * 1024, (1 << 20) - 512)
    raise SystemExit("write past the end was accepted")
except nbd.Error as e:
    assert e.errnum == 28, e
h.shutdown()
print("nbdsh: all checks passed")
"#;
    let out = nbdsh(&served.uri(), script);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("all checks passed"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    served.stop();
}

/// A write past --mem-limit fails with ENOSPC and leaves what was stored as it was.
#[test]
fn a_write_past_the_memory_limit_is_enospc() {
    if !have("nbdsh") {
        return;
    }
    let dir = temp_dir("limit");
    let served = Served::start(&dir, &["--size", "16M", "--mem-limit", "1M"]);
    let script = r#"
import nbd, os
h.connect_uri(uri)
h.pwrite(b"kept" * 1024, 0)
noise = os.urandom(4 << 20)
try:
    h.pwrite(noise, 1 << 20)
    raise SystemExit("a write past the limit was accepted")
except nbd.Error as e:
    assert e.errnum == 28, e
assert h.pread(4096, 0) == b"kept" * 1024
print("limit: ok")
"#;
    let out = nbdsh(&served.uri(), script);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("limit: ok"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    served.stop();
}

/// fio's nbd engine at queue depth 32, two jobs each on its own 8 MiB of an lz4 device,
/// buffers 60 % compressible: random reads and writes with every block verified by CRC32C,
/// then random trim-then-write with verification. Zero verify errors. The trim pass uses
/// `serialize_overlap`: NBD lets a server run requests in flight in any order, so a client
/// must not keep a trim and a write of the same block in flight at once (without it, fio's
/// trimwrite at depth 32 fails on any server that runs requests in parallel).
#[test]
fn fio_random_io_with_verify() {
    if !have("fio") {
        return;
    }
    let dir = temp_dir("fio");
    let served = Served::start(&dir, &["--size", "16M", "--compressor", "lz4"]);
    let uri = format!("--uri={}", served.uri());
    for rw in [
        &["--rw=randrw", "--rwmixread=50"][..],
        &["--rw=randtrimwrite", "--serialize_overlap=1"][..],
    ] {
        let mut args = vec![
            "--name=verify",
            "--ioengine=nbd",
            &uri,
            "--bs=4k",
            "--size=8M",
            "--numjobs=2",
            "--offset_increment=8M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // fio saves verify state files in its working directory by default.
            "--verify_state_save=0",
            "--buffer_compress_percentage=60",
            "--refill_buffers",
            "--output-format=json",
        ];
        args.extend_from_slice(rw);
        let out = run("fio", &args);
        let report = fio_report(&out);
        let jobs = report["jobs"].as_array().unwrap();
        for job in jobs {
            // A verify error is fatal: fio ends that job with an error and exits non-zero
            // (which `run` checks).
            assert_eq!(job["error"], 0, "{rw:?}: {job}");
        }
        let total = |dir: &str| -> u64 {
            jobs.iter()
                .map(|j| j[dir]["io_bytes"].as_u64().unwrap())
                .sum()
        };
        assert!(
            total("read") + total("write") + total("trim") >= 16 << 20,
            "{rw:?}: too little I/O"
        );
        if rw[0] == "--rw=randrw" {
            assert!(total("read") > 0 && total("write") > 0, "{rw:?}");
        }
    }
    served.stop();
}

/// nbdfuse shows the export as a file; an ext4 made on it, mounted through a loop device,
/// holds files written and read back, and checks clean after unmounting.
#[test]
fn nbdfuse_ext4_through_a_loop_device() {
    if !have("nbdfuse") || !have("mkfs.ext4") || !have("losetup") || !have("fusermount3") {
        return;
    }
    if !Path::new("/dev/fuse").exists() || !Path::new("/dev/loop-control").exists() {
        ztier_corpus::cannot_test("no /dev/fuse or /dev/loop-control on this machine");
        return;
    }
    let dir = temp_dir("fuse");
    let served = Served::start(&dir, &["--size", "64M", "--compressor", "lz4"]);
    let fuse_dir = dir.join("fuse");
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&fuse_dir).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let mut fuse = Command::new("nbdfuse")
        .args([
            fuse_dir.to_str().unwrap(),
            "--unix",
            served.socket.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let image = fuse_dir.join("nbd");
    let started = Instant::now();
    while !image.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nbdfuse did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = std::panic::catch_unwind(|| {
        run("mkfs.ext4", &["-q", "-F", image.to_str().unwrap()]);
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        let files: Vec<(PathBuf, Vec<u8>)> = (0..8u64)
            .map(|i| {
                let data = ztier_base::pattern::pattern(i, 1 << 20 | (i as usize * 777));
                (mnt.join(format!("file{i}")), data)
            })
            .collect();
        for (path, data) in &files {
            std::fs::write(path, data).unwrap();
        }
        run("sync", &[]);
        run("umount", &[mnt.to_str().unwrap()]);
        run(
            "mount",
            &["-o", "loop", image.to_str().unwrap(), mnt.to_str().unwrap()],
        );
        for (path, data) in &files {
            assert!(std::fs::read(path).unwrap() == *data, "{}", path.display());
        }
        run("umount", &[mnt.to_str().unwrap()]);
        run("fsck.ext4", &["-fn", image.to_str().unwrap()]);
    });
    let _ = Command::new("umount").arg(&mnt).output();
    let _ = Command::new("fusermount3")
        .args(["-u", fuse_dir.to_str().unwrap()])
        .output();
    let _ = fuse.wait();
    served.stop();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// `--store plain`, the uncompressed RAM disk the bench measures the protocol's ceiling
/// with: nbdcopy in and out, identical; its pages held show in `ztier stat`; the hole
/// nbdcopy skipped holds nothing.
#[test]
fn a_plain_store_serves_nbdcopy_and_reports_pages_held() {
    if !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("plain");
    let input = sample_file(&dir);
    let served = Served::start(&dir, &["--size", "12M", "--store", "plain"]);
    copy_in_and_out(&served, &input, &dir);
    let socket = served.socket.to_str().unwrap().to_owned();
    let json = run(
        env!("CARGO_BIN_EXE_ztier"),
        &["stat", "--socket", &socket, "--json"],
    )
    .stdout;
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let held = v["plain"]["bytes_held"].as_u64().unwrap();
    // The sample's 9 MiB less the zero pages nbdcopy sent as zeroing; never the 3 MiB hole.
    assert!(held > 8 << 20 && held <= 9 << 20, "{v}");
    let out = served.stop();
    assert!(String::from_utf8_lossy(&out.stdout).contains("plain RAM disk"));
}

/// The policy running hard (every 100 ms: recompress and write back pages idle for 0 s,
/// keep the pool under 1 MiB) while fio writes, reads and verifies, and nbdcopy copies in
/// and out: nothing is lost, and the policy's actions show in `ztier stat` and `ztier ctl`.
#[test]
fn the_policy_runs_beside_clients_and_loses_nothing() {
    if !have("fio") || !have("nbdcopy") {
        return;
    }
    let dir = temp_dir("policy");
    let backing = dir.join("backing.img");
    let served = Served::start(
        &dir,
        &[
            "--size",
            "32M",
            "--compressor",
            "lz4",
            "--backing-dev",
            backing.to_str().unwrap(),
            "--recompress-algorithm",
            "zstd",
            "--recompress-idle",
            "0s",
            "--writeback-idle",
            "0s",
            "--mem-target",
            "1M",
            "--policy-interval",
            "100ms",
        ],
    );
    let input = sample_file(&dir);
    run("nbdcopy", &[input.to_str().unwrap(), &served.uri()]);
    let uri = format!("--uri={}", served.uri());
    let out = run(
        "fio",
        &[
            "--name=verify",
            "--ioengine=nbd",
            &uri,
            "--bs=4k",
            "--offset=16M",
            "--size=8M",
            "--iodepth=16",
            "--rw=randrw",
            "--rwmixread=50",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--buffer_compress_percentage=60",
            "--refill_buffers",
            "--output-format=json",
        ],
    );
    let report = fio_report(&out);
    assert_eq!(report["jobs"][0]["error"], 0, "{report}");
    // What nbdcopy put in is still there, wherever the policy moved it.
    let back = dir.join("again.raw");
    run("nbdcopy", &[&served.uri(), back.to_str().unwrap()]);
    let (a, b) = (
        std::fs::read(&input).unwrap(),
        std::fs::read(&back).unwrap(),
    );
    assert!(
        a[..] == b[..a.len()],
        "the copy read back after the policy ran"
    );
    let stat = run(
        env!("CARGO_BIN_EXE_ztier"),
        &[
            "stat",
            "--socket",
            served.socket.to_str().unwrap(),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    let policy = &v["policy"];
    assert!(policy["ticks"].as_u64().unwrap() > 0, "{v}");
    assert!(policy["written_back_pages"].as_u64().unwrap() > 0, "{v}");
    assert!(policy["recompressed_pages"].as_u64().unwrap() > 0, "{v}");
    assert!(v["bd_stat"]["bd_count"].as_u64().unwrap() > 0, "{v}");
    // The kernel's attribute names work on the running server.
    let ctl = |words: &[&str]| {
        let mut args = vec!["ctl", "--socket", served.socket.to_str().unwrap()];
        args.extend_from_slice(words);
        Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(&args)
            .output()
            .unwrap()
    };
    let o = ctl(&["bd_stat"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .count(),
        3
    );
    assert!(ctl(&["idle", "all"]).status.success());
    assert!(ctl(&["writeback", "idle"]).status.success());
    assert!(ctl(&["writeback_limit", "0"]).status.success());
    assert_eq!(
        String::from_utf8_lossy(&ctl(&["writeback_limit_enable"]).stdout).trim(),
        "1"
    );
    assert!(ctl(&["writeback_limit_enable", "0"]).status.success());
    let o = ctl(&["writeback", "bogus"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("idle, huge"),
        "{o:?}"
    );
    let o = ctl(&["no_such_attribute"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no such"));
    served.stop();
    assert!(!backing.exists(), "the backing file ztier made is removed");
}
