//! What the CLI's integration tests share: finding a tool (or saying it is missing and
//! skipping, except under CI), a fresh directory, reading fio's JSON report, running
//! `ztier` (as this user or as `nobody`) and its control socket, and the kernel zram's
//! figures for a corpus beside `ztier bench`'s.
#![allow(dead_code)] // each test file uses its own part

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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

/// The pids `/proc` lists.
pub fn pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
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

/// `python3 -c SCRIPT ARGS...` with its stdin and stdout piped, once it has printed its first
/// line: the process (killed when dropped) and that line.
pub fn python_ready(script: &str, args: &[&str]) -> (Proc, String) {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Proc(child), line)
}

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

/// A client of export `name` of the server whose data socket is `nbd`.
pub fn export(nbd: &Path, name: &str) -> ztier_blockdev::Result<ztier_nbd::Client> {
    let uri: ztier_nbd::Uri = format!("nbd+unix:///{name}?socket={}", nbd.display())
        .parse()
        .unwrap();
    ztier_nbd::Client::connect(&uri)
}

/// A command's stdout, once it succeeded (else its output is the failure).
pub fn ok(o: Output) -> String {
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A command's stdout and stderr together, as text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `command`, which must fail saying why in one line on stderr: that line.
pub fn one_line_failure(command: &mut Command) -> String {
    one_line_failure_status(command).1
}

/// As [`one_line_failure`], with the status it ended with.
pub fn one_line_failure_status(command: &mut Command) -> (std::process::ExitStatus, String) {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(
        stderr.lines().count(),
        1,
        "{command:?}: not one line: {stderr}"
    );
    (out.status, stderr)
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

/// The repository's root, for its scripts and samples.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A directory on tmpfs if there is one (measurement inputs live there).
pub fn tmpfs_dir(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let dir = shm.join(format!("ztier-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    } else {
        temp_dir(name)
    }
}

/// Runs a truth script of `scripts/` on a corpus, its JSON written to `out`.
pub fn truth_script(script: &str, args: &[&Path], out: &Path) {
    let output = Command::new("python3")
        .arg(repo().join("scripts").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::write(out, &output.stdout).unwrap();
}

/// `ztier bench ARGS --corpus CORPUS --json`: one run a line.
pub fn bench_json(args: &[&str], corpus: &Path) -> Vec<serde_json::Value> {
    let out = ztier()
        .arg("bench")
        .args(args)
        .arg("--corpus")
        .arg(corpus)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ztier bench {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The kernel's zram on `corpus` (`scripts/kernel-zram-truth.py`, written as NAME.truth.json
/// beside it; root and zram needed) against `ztier bench` with lzo-rle, lzo and lz4: every
/// `mm_stat` field after the write and after the compaction equal to the kernel's. Returns
/// the bench's runs.
pub fn assert_zram_equals_kernel(corpus: &Path) -> Vec<serde_json::Value> {
    let name = corpus.file_name().unwrap().to_str().unwrap();
    let stem = name
        .strip_suffix(".pages.zst")
        .or_else(|| name.strip_suffix(".pages"))
        .expect("a corpus's name");
    truth_script(
        "kernel-zram-truth.py",
        &[corpus],
        &corpus.with_file_name(format!("{stem}.truth.json")),
    );
    let runs = bench_json(
        &[
            "--compressor",
            "lzo-rle",
            "--compressor",
            "lzo",
            "--compressor",
            "lz4",
        ],
        corpus,
    );
    assert_eq!(runs.len(), 3);
    for run in &runs {
        let fields = run["kernel"]["fields"]
            .as_array()
            .expect("the kernel's figures compared");
        assert!(
            fields.len() >= 18,
            "mm_stat after the write and the compaction"
        );
        for f in fields {
            assert_eq!(f["compared"], true, "{} {f}", run["compressor"]);
            assert_eq!(f["ztier"], f["kernel"], "{} {f}", run["compressor"]);
        }
    }
    runs
}

/// A `ztier serve` a test started (its stderr in `log`), killed if the test ends before it stops it.
pub struct Started {
    pub child: std::process::Child,
    pub log: PathBuf,
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Started {
    pub fn stop(mut self) -> String {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::TERM,
        )
        .unwrap();
        // Read before the wait: a host's figures on the way out can be more than the pipe
        // holds, and a server blocked writing them never ends.
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut out).unwrap();
        }
        let status = self.child.wait().unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap();
        assert!(status.success(), "ztier serve ended {status}: {log}");
        out
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

pub fn serve(args: &[&str], wait: &Path, log: &Path) -> Started {
    let s = Started {
        child: Command::new(env!("CARGO_BIN_EXE_ztier"))
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
        log: log.to_path_buf(),
    };
    wait_for(wait, "ztier serve's control socket");
    s
}
