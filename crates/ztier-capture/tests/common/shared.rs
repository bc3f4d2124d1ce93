//! What ztier-capture's tests of the library and ztier-cli's tests of `ztier capture` share
//! (the CLI's include this file by its path): the processes they capture, a child whose memory
//! the test knows (this test binary run again, see [`serve_memory_child`]) and a Python process
//! holding hundreds of MiB, to kill while it is read; reading `/proc/PID/stat`; where the
//! cgroup v2 hierarchy is; and the check that a recording's epochs began on multiples of its
//! period. Only std, rustix and
//! ztier-base (its one seeded generator), which both crates' tests have, so it reads the same
//! in either crate.
#![allow(dead_code)] // each test file uses its own part

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

pub const PAGE: usize = 4096;
pub const PATTERN_PAGES: usize = 64;
pub const ZERO_PAGES: usize = 32;
pub const RANDOM_PAGES: usize = 64;
pub const FREED_PAGES: usize = 1024;

/// What a page of each region holds, by region, page and generation (0 as first written, 1
/// after `change`).
pub fn expected(region: &str, page: usize, generation: u64) -> Vec<u8> {
    match region {
        "patterns" | "freed" => {
            let tag = if region == "patterns" { 0xa5 } else { 0x3c };
            (0..PAGE / 8)
                .flat_map(|w| {
                    ((tag << 56) | (generation << 48) | ((page as u64) << 16) | w as u64)
                        .to_le_bytes()
                })
                .collect()
        }
        "zeros" => vec![if generation == 0 { 0 } else { 0xff }; PAGE],
        "random" => {
            let mut rng = ztier_base::rng::Rng::from_state(
                0x9e37_79b9_7f4a_7c15u64 ^ ((page as u64 + 1) * 0x1000_0001) ^ generation,
            );
            (0..PAGE / 8)
                .flat_map(|_| rng.next_u64().to_le_bytes())
                .collect()
        }
        _ => unreachable!(),
    }
}

/// The pages `change` rewrites: (region, page).
pub const CHANGED: [(&str, usize); 4] = [
    ("patterns", 3),
    ("patterns", 7),
    ("zeros", 5),
    ("random", 10),
];

/// A page-aligned region inside a vector of its own (its own mapping: glibc maps large
/// allocations alone).
struct Region {
    _buffer: Vec<u8>,
    offset: usize,
    pages: usize,
}

impl Region {
    fn new(pages: usize) -> Region {
        let buffer = vec![1u8; (pages + 1) * PAGE];
        let offset = (PAGE - buffer.as_ptr() as usize % PAGE) % PAGE;
        Region {
            _buffer: buffer,
            offset,
            pages,
        }
    }
    fn page_mut(&mut self, i: usize) -> &mut [u8] {
        let start = self.offset + i * PAGE;
        &mut self._buffer[start..start + PAGE]
    }
    fn first_vpn(&self) -> u64 {
        (self._buffer.as_ptr() as usize + self.offset) as u64 / PAGE as u64
    }
    fn fill(&mut self, name: &str, generation: u64) {
        for i in 0..self.pages {
            let content = expected(name, i, generation);
            let page = self.page_mut(i);
            // Written twice so a zero page is a page the process wrote, not one it never
            // touched (which would not be present at all).
            page.fill(0xee);
            std::hint::black_box(&mut *page);
            page.copy_from_slice(&content);
        }
    }
}

/// The child process the tests capture: each test binary that spawns a [`MemoryChild`] has an
/// ignored test `not_a_test_memory_child` calling this, and is run again as `--ignored --exact
/// not_a_test_memory_child` with `ZTIER_CAPTURE_CHILD` set (ignored, so a plain run lists it as
/// ignored, not passed; run without the variable this returns at once). It fills its regions,
/// says where they are, and obeys `change`, `free` and `exit` on stdin, answering each.
pub fn serve_memory_child() {
    if std::env::var_os("ZTIER_CAPTURE_CHILD").is_none() {
        return;
    }
    let mut regions: BTreeMap<&str, Region> = BTreeMap::new();
    for (name, pages) in [
        ("patterns", PATTERN_PAGES),
        ("zeros", ZERO_PAGES),
        ("random", RANDOM_PAGES),
        ("freed", FREED_PAGES),
    ] {
        let mut r = Region::new(pages);
        r.fill(name, 0);
        regions.insert(name, r);
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    for (name, r) in &regions {
        writeln!(out, "CHILD region {name} {} {}", r.first_vpn(), r.pages).unwrap();
    }
    writeln!(out, "CHILD ready").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().trim() {
            "change" => {
                for (name, page) in CHANGED {
                    let content = expected(name, page, 1);
                    regions
                        .get_mut(name)
                        .unwrap()
                        .page_mut(page)
                        .copy_from_slice(&content);
                }
                regions.remove("freed");
            }
            "free" => {
                regions.remove("freed");
            }
            "exit" => std::process::exit(0),
            _ => {}
        }
        writeln!(out, "CHILD done").unwrap();
        out.flush().unwrap();
    }
    std::hint::black_box(&regions);
}

/// The child, its regions (first virtual page number and pages, by name) and its pipes.
pub struct MemoryChild {
    pub child: Child,
    pub stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub regions: BTreeMap<String, (u64, usize)>,
}

impl MemoryChild {
    pub fn spawn() -> MemoryChild {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "not_a_test_memory_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ZTIER_CAPTURE_CHILD", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut regions = BTreeMap::new();
        loop {
            let mut line = String::new();
            assert!(
                stdout.read_line(&mut line).unwrap() > 0,
                "the child ended early"
            );
            // The test harness may print "test not_a_test_memory_child ... " before it on
            // the line.
            let Some(at) = line.find("CHILD ") else {
                continue;
            };
            let words: Vec<&str> = line[at..].split_whitespace().collect();
            match words.as_slice() {
                ["CHILD", "region", name, vpn, pages] => {
                    regions.insert(
                        name.to_string(),
                        (vpn.parse().unwrap(), pages.parse().unwrap()),
                    );
                }
                ["CHILD", "ready"] => break,
                _ => {}
            }
        }
        MemoryChild {
            child,
            stdin,
            stdout,
            regions,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command and waits for its answer.
    pub fn command(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "the child ended"
            );
            if line.trim_end().ends_with("CHILD done") {
                return;
            }
        }
    }

    /// Which region and page a virtual page number is, if it is one of the child's.
    pub fn locate(&self, vpn: u64) -> Option<(&str, usize)> {
        self.regions.iter().find_map(|(name, &(first, pages))| {
            (first..first + pages as u64)
                .contains(&vpn)
                .then(|| (name.as_str(), (vpn - first) as usize))
        })
    }
}

impl Drop for MemoryChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process holding MiB (its argument) of private anonymous memory in 4 KiB pages (not 2 MiB
/// ones: the kernel then takes tens of milliseconds to tear 512 MiB down, a page at a time),
/// each page's first word its index; prints its first virtual page number and waits for stdin
/// to close. Killed while it is read, and read slowly enough for epochs to outlast a period.
const BIG_HOLDER: &str = r#"
import ctypes, mmap, sys
P, n = 4096, (int(sys.argv[1]) << 20) // 4096
m = mmap.mmap(-1, n * P, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(n):
    m[i * P:i * P + 8] = i.to_bytes(8, 'little')
print('ready', ctypes.addressof(ctypes.c_char.from_buffer(m)) // P, flush=True)
sys.stdin.read()
"#;

/// Far past anything a working kernel takes to begin an exit; only a broken test reaches it.
const DEADLINE: Duration = Duration::from_secs(30);

/// A [`BIG_HOLDER`], killed (and reaped) when dropped.
pub struct BigHolder(pub Child);

impl Drop for BigHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`BIG_HOLDER`] holding `mib` MiB (python3 must be there), and the first virtual page
/// number of them.
pub fn big_holder(mib: u64) -> (BigHolder, u64) {
    let mut child = BigHolder(
        Command::new("python3")
            .args(["-c", BIG_HOLDER, &mib.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let first_vpn = line
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("{line:?}"))
        .trim()
        .parse()
        .unwrap();
    (child, first_vpn)
}

/// Field `field` of `/proc/PID/stat`, numbered as proc(5) numbers them (3 the state, 4 the
/// parent's pid, 9 the flags), read past the name (which may hold spaces and parentheses).
pub fn stat_field(pid: u32, field: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(field.checked_sub(3)?)
        .map(str::to_owned)
}

/// `/proc/PID/stat`'s state letter and flags.
pub fn state_and_flags(pid: u32) -> Option<(char, u64)> {
    let state = stat_field(pid, 3)?.chars().next()?;
    Some((state, stat_field(pid, 9)?.parse().ok()?))
}

/// Kills `pid` with SIGKILL (not reaped) and waits until the kernel has begun its exit
/// (`PF_EXITING`); returns its state then: R or D while its memory is torn down, Z after.
pub fn kill_and_wait_for_exit(pid: u32) -> char {
    const PF_EXITING: u64 = 4;
    let target = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(target, rustix::process::Signal::KILL).unwrap();
    let start = Instant::now();
    loop {
        match state_and_flags(pid) {
            Some((state, flags)) if flags & PF_EXITING != 0 || state == 'Z' => return state,
            _ => assert!(start.elapsed() < DEADLINE, "{pid} never exited"),
        }
    }
}

/// The files in `dir`.
pub fn files_in(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect()
}

/// The multiples of `period_ms` a recording's epochs started on (`starts`, milliseconds since
/// the first), checked: each epoch late by less than half a period (a loaded machine wakes a
/// sleeper late, never early) and each on a later multiple than the one before (never two
/// back to back within one period).
pub fn period_multiples(starts: &[u64], period_ms: u64) -> Vec<u64> {
    let multiples: Vec<u64> = starts.iter().map(|s| s / period_ms).collect();
    for (start, multiple) in starts.iter().zip(&multiples) {
        assert!(
            start - multiple * period_ms < period_ms / 2,
            "an epoch began at {start} ms, not on a multiple of {period_ms} ms: {starts:?}"
        );
    }
    assert!(
        multiples.windows(2).all(|w| w[0] < w[1]),
        "two epochs in one period: {starts:?}"
    );
    multiples
}

/// Where the cgroup v2 hierarchy is mounted, if it is.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let point = mount.split_whitespace().nth(4)?;
        (fs.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(point))
    })
}

/// As [`new_test_cgroup`], for a test that moves processes into it: `None`, said (and failing
/// under CI), when this is not root or there is no cgroup; the caller then returns.
pub fn cgroup_for_test(name: &str) -> Option<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        ztier_corpus::cannot_test("moving a process into a cgroup needs root");
        return None;
    }
    new_test_cgroup(name)
        .map_err(|why| ztier_corpus::cannot_test(&why))
        .ok()
}

/// A new cgroup of this test process's own (`ztier-test-NAME-PID`) in the cgroup v2
/// hierarchy, or why there is none (the caller says so and skips).
pub fn new_test_cgroup(name: &str) -> Result<PathBuf, String> {
    let mount = cgroup2_mount().ok_or("no cgroup v2 hierarchy mounted")?;
    let cgroup = mount.join(format!("ztier-test-{name}-{}", std::process::id()));
    std::fs::create_dir(&cgroup).map_err(|e| format!("cannot make a cgroup in {mount:?}: {e}"))?;
    Ok(cgroup)
}
