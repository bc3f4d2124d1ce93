//! `ztier capture` of shared memory and of several processes, and of processes that die:
//! Python children made for it (two processes sharing a shared anonymous mapping, a SysV
//! segment, a memfd and a /dev/shm file of known content; one holding 512 MiB, killed while it
//! is read; a zombie), captured by pid and by cgroup; and PostgreSQL under pgbench, whose
//! capture the kernel's zram is run on beside `ztier bench`.

mod common;
#[path = "../../ztier-capture/tests/common/shared.rs"]
mod shared;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use shared::{
    big_holder, files_in, kill_and_wait_for_exit, new_test_cgroup, state_and_flags, PAGE,
};
use ztier_corpus::Corpus;

/// Pages written in each region of [`SHARED_HOLDER`].
const SHARED_PAGES: u64 = 64;

/// Two processes holding memory of every kind, each page of known content (`page(region,
/// index)`, unique to it): (1) `MAP_SHARED | MAP_ANONYMOUS`, (3) a memfd whose last page is
/// written through its descriptor, never mapped, (4) a file on /dev/shm (unlinked), each twice
/// as long as written (the rest never touched); (2) a SysV segment that ends half way into its
/// last page (the page is mapped whole, and written whole); (5) private anonymous memory,
/// shared copy-on-write after the fork. The child maps the memfd a second time. Each
/// says its pid in one write (print may write a line in pieces, which the other's pieces
/// would interleave); both wait for stdin to close; the parent reaps the child before it exits.
const SHARED_HOLDER: &str = r#"
import ctypes, mmap, os, struct, sys
P, N = 4096, int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.restype = ctypes.c_int
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]

def page(region, i):
    return struct.pack('<512Q', *((0x5a << 56) | (region << 48) | (i << 16) | w for w in range(512)))

anon = mmap.mmap(-1, 2 * N * P)
for i in range(N):
    anon[i * P:(i + 1) * P] = page(1, i)
shmid = libc.shmget(0, N * P - 2048, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
assert shmid >= 0, ctypes.get_errno()
addr = libc.shmat(shmid, None, 0)
libc.shmctl(shmid, 0, None)  # IPC_RMID: gone once the last process detaches
for i in range(N):
    ctypes.memmove(addr + i * P, page(2, i), P)
fd = os.memfd_create('ztier-test')
os.ftruncate(fd, 2 * N * P)
memfd = mmap.mmap(fd, 2 * N * P)
for i in range(N - 1):
    memfd[i * P:(i + 1) * P] = page(3, i)
os.pwrite(fd, page(3, N - 1), (N - 1) * P)
path = '/dev/shm/ztier-test-%d' % os.getpid()
shm_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.unlink(path)
os.ftruncate(shm_fd, 2 * N * P)
shm = mmap.mmap(shm_fd, 2 * N * P)
for i in range(N):
    shm[i * P:(i + 1) * P] = page(4, i)
private = mmap.mmap(-1, N * P, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(N):
    private[i * P:(i + 1) * P] = page(5, i)
child = os.fork()
if child == 0:
    again = mmap.mmap(fd, 2 * N * P)
    os.write(1, b'child %d\n' % os.getpid())
    sys.stdin.read()
    os._exit(0)
os.write(1, b'parent %d\n' % os.getpid())
sys.stdin.read()
os.waitpid(child, 0)
"#;

/// The two processes of [`SHARED_HOLDER`]; both end when dropped (stdin closed).
struct SharedHolder {
    parent: Child,
    stdin: Option<ChildStdin>,
    child_pid: u32,
}

impl SharedHolder {
    fn spawn() -> SharedHolder {
        let mut parent = Command::new("python3")
            .args(["-c", SHARED_HOLDER, &SHARED_PAGES.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = parent.stdin.take();
        let mut stdout = BufReader::new(parent.stdout.take().unwrap());
        let mut pids = BTreeMap::new();
        while pids.len() < 2 {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "the holder ended");
            if let [who, pid] = line.split_whitespace().collect::<Vec<_>>()[..] {
                pids.insert(who.to_string(), pid.parse::<u32>().unwrap());
            }
        }
        assert_eq!(pids["parent"], parent.id());
        SharedHolder {
            parent,
            stdin,
            child_pid: pids["child"],
        }
    }

    fn pids(&self) -> [u32; 2] {
        [self.parent.id(), self.child_pid]
    }
}

impl Drop for SharedHolder {
    fn drop(&mut self) {
        // EOF on stdin ends both; the parent reaps the child first.
        drop(self.stdin.take());
        let _ = self.parent.wait();
    }
}

/// `ztier capture ARGS -o DIR/NAME.pages.zst`, which must succeed: its summary, and its
/// manifest (`DIR/NAME.capture.json`).
fn capture(args: &[&str], dir: &Path, name: &str) -> (String, serde_json::Value) {
    let out = common::ztier()
        .arg("capture")
        .args(args)
        .arg("-o")
        .arg(dir.join(format!("{name}.pages.zst")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", common::text(&out));
    let manifest = std::fs::read(dir.join(format!("{name}.capture.json"))).unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        serde_json::from_slice(&manifest).unwrap(),
    )
}

/// The manifest's summary of the mappings of `kind`.
fn kind_row<'a>(manifest: &'a serde_json::Value, kind: &str) -> &'a serde_json::Value {
    manifest["by_kind"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {}", manifest["by_kind"]))
}

/// Checks a capture of [`SHARED_HOLDER`]'s two processes: every page of every region in the
/// corpus exactly once, as written; each shmem kind's `captured` in the manifest the pages
/// written (none of the pages never touched).
fn assert_each_page_once(corpus: &Path, manifest: &serde_json::Value) {
    let corpus = Corpus::load(corpus).unwrap();
    let mut found: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for page in corpus.bytes().chunks_exact(PAGE) {
        let word = |w: usize| u64::from_le_bytes(page[w * 8..w * 8 + 8].try_into().unwrap());
        let first = word(0);
        let (region, index) = ((first >> 48) & 0xff, (first >> 16) & 0xffff_ffff);
        // Only a whole page as written counts (Python's heap holds copies of some pages'
        // contents at other offsets, freed buffers it wrote them from).
        if first >> 56 == 0x5a && (0..512).all(|w| word(w) == first | w as u64) {
            *found.entry((region, index)).or_default() += 1;
        }
    }
    for region in 1..=5 {
        for index in 0..SHARED_PAGES {
            assert_eq!(
                found.get(&(region, index)).copied().unwrap_or(0),
                1,
                "region {region} page {index}: each physical page once"
            );
        }
    }
    for kind in ["shared_anonymous", "sysv", "memfd", "shmem_file"] {
        let row = kind_row(manifest, kind);
        assert_eq!(row["pages_read"], SHARED_PAGES, "{kind}: {row}");
    }
    // The memfd is mapped three times (once by the parent, twice by the child).
    let memfd = kind_row(manifest, "memfd");
    assert_eq!(memfd["mappings"], 3, "{memfd}");
    assert!(manifest["duplicate_pages"].as_u64().unwrap() >= 5 * SHARED_PAGES);
}

#[test]
fn shared_memory_of_every_kind_is_captured_page_exact_each_shared_page_once() {
    if !rustix::process::geteuid().is_root() {
        // Frames (for the copy-on-write pages) and shmem objects (for the page no process
        // maps) are shown to CAP_SYS_ADMIN only.
        ztier_corpus::cannot_test("capturing shared memory whole needs root");
        return;
    }
    if !common::have("python3") {
        return;
    }
    let dir = common::temp_dir("capture-shared");
    let holder = SharedHolder::spawn();
    let [parent, child] = holder.pids();
    let (parent, child) = (parent.to_string(), child.to_string());
    let (stdout, manifest) = capture(&["--pid", &parent, "--pid", &child], &dir, "shared");
    // The summary names both processes and every kind.
    assert!(stdout.starts_with("2 processes:"), "{stdout}");
    for kind in [
        "shared_anonymous",
        "sysv",
        "memfd",
        "shmem_file",
        "anonymous",
    ] {
        assert!(stdout.contains(&format!("  {kind} ")), "{kind}: {stdout}");
    }
    assert_eq!(manifest["processes"].as_array().unwrap().len(), 2);
    assert_each_page_once(&dir.join("shared.pages.zst"), &manifest);
    // The parent alone: its shared pages, the memfd's page no one maps included.
    let (_, manifest) = capture(&["--pid", &parent], &dir, "parent");
    let memfd = kind_row(&manifest, "memfd");
    assert_eq!(memfd["pages_read"], SHARED_PAGES, "{memfd}");

    // The same two processes as a cgroup's.
    let cgroup = match new_test_cgroup("capture") {
        Ok(cgroup) => cgroup,
        Err(why) => {
            ztier_corpus::cannot_test(&why);
            return;
        }
    };
    for pid in [parent, child] {
        std::fs::write(cgroup.join("cgroup.procs"), pid).unwrap();
    }
    let (stdout, manifest) = capture(&["--cgroup", cgroup.to_str().unwrap()], &dir, "cgroup");
    assert!(stdout.starts_with("2 processes of cgroup"), "{stdout}");
    assert_eq!(manifest["cgroup"], cgroup.to_str().unwrap());
    assert_each_page_once(&dir.join("cgroup.pages.zst"), &manifest);
    // Both gone (the parent reaps the child): the cgroup is empty and goes.
    drop(holder);
    std::fs::remove_dir(&cgroup).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn capture_of_a_process_killed_while_it_is_read_fails_in_one_line_and_leaves_no_file() {
    if !common::have("python3") {
        return;
    }
    let dir = common::temp_dir("capture-killed");
    // Killed once the corpus has its first bytes (the capture is reading), the capture exits
    // non-zero with one line and leaves no file. (The recorder's own handling of a process
    // whose memory is torn down under it is tested in ztier-capture's tests/exits.rs.)
    let (holder, _) = big_holder(512);
    let pid = holder.0.id();
    let mut capture = common::ztier()
        .args(["capture", "--pid", &pid.to_string(), "-o"])
        .arg(dir.join("cli.pages.zst"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let reading = || {
        std::fs::read_dir(&dir).unwrap().flatten().any(|e| {
            e.file_name().to_string_lossy().ends_with(".partial")
                && e.metadata().is_ok_and(|m| m.len() > 0)
        })
    };
    while !reading() {
        assert!(
            start.elapsed() < common::DEADLINE,
            "the capture never wrote"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        capture.try_wait().unwrap().is_none(),
        "the capture still reads"
    );
    kill_and_wait_for_exit(pid);
    let out = capture.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("process {pid} exited during the capture")),
        "{stderr}"
    );
    assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn epochs_slower_than_the_period_start_on_its_multiples_and_the_missed_ones_are_said() {
    if !common::have("python3") {
        return;
    }
    let dir = common::temp_dir("capture-slow-epochs");
    // Each epoch reads 256 MiB (hashing every page): longer than the period of 300 ms.
    let (holder, _) = big_holder(256);
    let pid = holder.0.id().to_string();
    let every = ["--every", "300ms", "--for", "3s"];
    let (stdout, manifest) = capture(&[&["--pid", &pid][..], &every].concat(), &dir, "slow");
    let starts: Vec<u64> = manifest["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["millis"].as_u64().unwrap())
        .collect();
    assert!(starts.len() >= 2, "{starts:?}");
    assert_eq!(manifest["period_millis"], 300);
    shared::period_multiples(&starts, 300);
    // Multiples 0 to 10: each began an epoch or was missed, and the summary says how many.
    let missed = manifest["missed_periods"].as_u64().expect("missed_periods");
    assert_eq!(missed + starts.len() as u64, 11, "{starts:?}");
    assert!(
        stdout.contains(&format!("{missed} periods of 300 ms missed")),
        "{stdout}"
    );
    drop(holder);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_zombie_is_said_to_be_one() {
    let dir = common::temp_dir("capture-zombie");
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    let start = Instant::now();
    while state_and_flags(pid).map(|(state, _)| state) != Some('Z') {
        assert!(start.elapsed() < common::DEADLINE, "true never ended");
        std::thread::sleep(Duration::from_millis(1));
    }
    let stderr = common::one_line_failure(
        common::ztier()
            .args(["capture", "--pid", &pid.to_string(), "-o"])
            .arg(dir.join("z.pages.zst")),
    );
    assert!(
        stderr.contains(&format!(
            "process {pid} is a zombie (exited, not reaped): nothing to capture"
        )),
        "{stderr}"
    );
    assert!(files_in(&dir).is_empty(), "{:?}", files_in(&dir));
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A PostgreSQL program (`initdb`, `postgres`, `pg_isready`, `pgbench`): Debian keeps them in
/// /usr/lib/postgresql/VERSION/bin, off PATH; the newest version there, else PATH's.
fn postgres_program(name: &str) -> Option<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin").join(name))
        .filter(|p| p.is_file())
        .collect();
    versions.sort_by_key(|p| {
        p.components()
            .nth(4)
            .and_then(|v| v.as_os_str().to_str()?.parse::<u32>().ok())
    });
    versions.pop().or_else(|| {
        Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    })
}

/// The postmaster, shut down when dropped (a failed assertion included) with a fast shutdown
/// (SIGINT): it ends its processes and removes its shared memory, which SIGKILL would leave.
struct Postmaster(Child);

impl Drop for Postmaster {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::INT);
        }
        let _ = self.0.wait();
    }
}

/// The uid and gid of the user `postgres` (Debian's packages make it).
fn postgres_user() -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"postgres"))
            .then(|| Some((fields.get(2)?.parse().ok()?, fields.get(3)?.parse().ok()?)))?
    })
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    common::pids()
        .into_iter()
        .filter(|&pid| shared::stat_field(pid, 4) == Some(parent.to_string()))
        .collect()
}

#[test]
fn on_a_capture_of_postgresql_under_pgbench_the_kernels_zram_agrees_with_the_bench() {
    let root = rustix::process::geteuid().is_root();
    let zram = Path::new("/sys/class/zram-control").exists();
    if !(root && zram) {
        ztier_corpus::cannot_test(&format!(
            "the kernel's figures need root ({root}) and zram ({zram})"
        ));
        return;
    }
    if !common::have("python3") {
        return;
    }
    let (Some(initdb), Some(postgres), Some(pg_isready), Some(pgbench), Some((uid, gid))) = (
        postgres_program("initdb"),
        postgres_program("postgres"),
        postgres_program("pg_isready"),
        postgres_program("pgbench"),
        postgres_user(),
    ) else {
        ztier_corpus::cannot_test(
            "PostgreSQL is not installed (scripts/setup.sh installs postgresql and \
             postgresql-contrib)",
        );
        return;
    };
    use std::os::unix::process::CommandExt;
    let dir = common::temp_dir("capture-postgres");
    std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    let data = dir.join("data");
    let as_postgres = |program: &Path| {
        let mut command = Command::new(program);
        command
            .uid(uid)
            .gid(gid)
            .env("HOME", &dir)
            .current_dir(&dir);
        command
    };
    let out = as_postgres(&initdb)
        .arg("-D")
        .arg(&data)
        .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
        .arg("--no-sync")
        .output()
        .unwrap();
    assert!(out.status.success(), "initdb: {}", common::text(&out));
    // shared_buffers of 32 MB under a database of ~75 MB (pgbench scale 5): the buffers fill.
    // Nothing that starts processes on its own (autovacuum), so the processes captured are
    // the ones listed.
    let log = std::fs::File::create(dir.join("postgres.log")).unwrap();
    let server = Postmaster(
        as_postgres(&postgres)
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-c", "listen_addresses=", "-c", "shared_buffers=32MB"])
            .args(["-c", "autovacuum=off", "-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    loop {
        let ready = Command::new(&pg_isready)
            .arg("-h")
            .arg(&dir)
            .args(["-U", "postgres", "-q"])
            .status()
            .unwrap();
        if ready.success() {
            break;
        }
        assert!(
            started.elapsed() < common::DEADLINE,
            "postgres never started: {}",
            std::fs::read_to_string(dir.join("postgres.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let pgbench = |args: &[&str]| {
        let mut command = Command::new(&pgbench);
        command
            .arg("-h")
            .arg(&dir)
            .args(["-U", "postgres"])
            .args(args)
            .arg("postgres");
        command
    };
    let out = pgbench(&["-i", "-q", "-s", "5"]).output().unwrap();
    assert!(out.status.success(), "pgbench -i: {}", common::text(&out));
    // Four clients for longer than the test: captured while they work, stopped after.
    let load = common::Proc(
        pgbench(&["-c", "4", "-j", "2", "-T", "600"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(3));
    let postmaster = server.0.id();
    let mut pids = vec![postmaster];
    pids.extend(children_of(postmaster));
    assert!(
        pids.len() >= 8,
        "the postmaster, its helpers, 4 backends: {pids:?}"
    );
    let measured = common::tmpfs_dir("capture-postgres");
    let pid_args: Vec<String> = pids
        .iter()
        .flat_map(|p| ["--pid".into(), p.to_string()])
        .collect();
    let pid_args: Vec<&str> = pid_args.iter().map(String::as_str).collect();
    let (stdout, manifest) = capture(&pid_args, &measured, "postgres");
    drop(load);
    eprintln!("{stdout}");
    assert_eq!(manifest["processes"].as_array().unwrap().len(), pids.len());
    // shared_buffers (8192 pages) is in the shared anonymous mapping, taken once.
    let shared = kind_row(&manifest, "shared_anonymous");
    assert!(
        shared["pages_read"].as_u64().unwrap() >= 8192,
        "{shared}: {stdout}"
    );

    let runs = common::assert_zram_equals_kernel(&measured.join("postgres.pages.zst"));
    for run in &runs {
        eprintln!(
            "{} ztier {} kernel {}",
            run["compressor"], run["mem_used_total"], run["kernel"]["fields"]
        );
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&measured);
    std::fs::remove_dir_all(&dir).unwrap();
}
