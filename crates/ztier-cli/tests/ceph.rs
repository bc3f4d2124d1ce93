//! ztier's far tier on a real Ceph cluster: `ztier serve --backing-dev` writing cold pages
//! to RBD images through qemu-storage-daemon's NBD export (librbd), on a throwaway cluster
//! of one mon, one mgr and two bluestore OSDs on 127.0.0.1, a pool of size 2
//! (`scripts/ceph-cluster.sh`). One cluster and two servers live through every scenario in
//! turn, as a user's would: both servers at once on their own images, an OSD killed in the
//! middle of a writeback, one OSD hung until the cluster marks it down, every OSD hung past
//! the client's timeout and resumed, the export killed and started again, and the export
//! restarted with the images swapped (each server refuses the other's image by its
//! identity). After each, every page reads back exact from the same servers: none is
//! restarted. The cluster is torn down whatever happens (a panic included). Without the
//! packages the test says so and skips, except under CI.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{have, temp_dir};
use ztier_blockdev::BlockDevice;
use ztier_nbd::{Client, Uri};

/// Far past anything a working cluster and server take; only a broken one reaches it.
const DEADLINE: Duration = Duration::from_secs(120);
const PAGE: u64 = 4096;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph-cluster.sh")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A cluster made by scripts/ceph-cluster.sh in its own directory, torn down when dropped.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    /// `ceph-cluster.sh up DIR ARGS`: the cluster (torn down when dropped, even if it did
    /// not start) and the script's output.
    fn try_up(dir: PathBuf, args: &[&str]) -> (Cluster, Output) {
        let o = Command::new("bash")
            .arg(script())
            .arg("up")
            .arg(&dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (Cluster { dir }, o)
    }

    fn up(dir: PathBuf, args: &[&str]) -> Cluster {
        let (cluster, o) = Cluster::try_up(dir, args);
        assert!(
            o.status.success(),
            "the cluster did not start: {}",
            text(&o)
        );
        cluster
    }

    /// `ceph-cluster.sh COMMAND DIR ARGS`, which must succeed; its output.
    fn run(&self, command: &str, args: &[&str]) -> String {
        let o = Command::new("bash")
            .arg(script())
            .arg(command)
            .arg(&self.dir)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ceph-cluster.sh {command}: {}",
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn ceph(&self, args: &[&str]) -> String {
        let o = Command::new("ceph")
            .arg("-c")
            .arg(self.dir.join("ceph.conf"))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ceph {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The OSD acting as primary for the first object of `image` (where the store's header
    /// and its first segments are).
    fn primary_of_first_object(&self, image: &str) -> String {
        let conf = self.dir.join("ceph.conf");
        let o = Command::new("rbd")
            .arg("-c")
            .arg(&conf)
            .args(["info", &format!("rbd/{image}")])
            .output()
            .unwrap();
        assert!(o.status.success(), "rbd info: {}", text(&o));
        let info = String::from_utf8_lossy(&o.stdout);
        let prefix = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("block_name_prefix: "))
            .unwrap_or_else(|| panic!("no block_name_prefix in {info}"));
        let map = self.ceph(&["osd", "map", "rbd", &format!("{prefix}.0000000000000000")]);
        // "... acting ([1,0], p1)"
        let p = map.rsplit(", p").next().unwrap();
        p.trim_end().trim_end_matches(')').to_string()
    }

    fn pid_of(&self, daemon: &str) -> rustix::process::Pid {
        let pid: i32 = std::fs::read_to_string(self.dir.join(format!("run/{daemon}.pid")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        rustix::process::Pid::from_raw(pid).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .output();
    }
}

/// A `ztier serve` writing back to an image of the cluster, killed when dropped.
struct Server {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    pages: u64,
    /// Which server's pages (a seed of their content).
    tag: u64,
}

impl Server {
    fn start(dir: &Path, name: &str, tag: u64, pages: u64, store: &str, timeout: &str) -> Server {
        let socket = dir.join(format!("{name}.sock"));
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .args(["serve", "--compressor", "lz4", "--size"])
            .arg((pages * PAGE).to_string())
            .arg("--socket")
            .arg(&socket)
            .args(["--backing-dev", store, "--backing-timeout", timeout])
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .expect("start ztier serve");
        let server = Server {
            child,
            socket,
            log,
            pages,
            tag,
        };
        let start = Instant::now();
        while !server.ctl_socket().exists() {
            assert!(
                start.elapsed() < DEADLINE,
                "ztier serve never started: {}",
                server.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    fn ctl_socket(&self) -> PathBuf {
        let mut p = self.socket.as_os_str().to_owned();
        p.push(".ctl");
        PathBuf::from(p)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn ctl_command(&self, words: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_ztier"));
        c.arg("ctl").arg("--socket").arg(&self.socket).args(words);
        c
    }

    fn ctl(&self, words: &[&str]) -> String {
        let o = self.ctl_command(words).output().unwrap();
        assert!(o.status.success(), "ctl {words:?}: {}", text(&o));
        text(&o)
    }

    /// bd_stat's first field: pages on the store.
    fn pages_on_store(&self) -> u64 {
        self.ctl(&["bd_stat"])
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    /// `ztier stat --json`.
    fn stat(&self) -> serde_json::Value {
        let o = Command::new(env!("CARGO_BIN_EXE_ztier"))
            .arg("stat")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "stat: {}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn client(&self) -> Client {
        let uri: Uri = format!("nbd+unix:///?socket={}", self.socket.display())
            .parse()
            .unwrap();
        // The client waits longer than the server's --backing-timeout (60 s for A): a read
        // the server holds while its store is away is answered, and the test's own link is
        // never the one given up on.
        let config = ztier_nbd::ClientConfig {
            io_timeout: Duration::from_secs(150),
            ..ztier_nbd::ClientConfig::default()
        };
        Client::connect_with(&uri, config).unwrap()
    }

    /// Page `i` of generation `generation`: text-like, different per server, page and
    /// generation.
    fn page(&self, generation: u64, i: u64) -> Vec<u8> {
        let seed = (self.tag << 40) ^ (generation << 32) ^ i;
        let mut p = ztier_base::pattern::pattern(seed, 1024);
        p.extend(
            std::iter::repeat_n(
                format!(
                    "server {} generation {generation}: cold pages on RBD ",
                    self.tag
                )
                .into_bytes(),
                100,
            )
            .flatten(),
        );
        p.truncate(PAGE as usize);
        p
    }

    /// Every page written as generation `generation`, 64 pages a request.
    fn fill(&self, client: &Client, generation: u64) {
        let chunk = 64;
        for first in (0..self.pages).step_by(chunk) {
            let buf: Vec<u8> = (first..(first + chunk as u64).min(self.pages))
                .flat_map(|i| self.page(generation, i))
                .collect();
            client.write_at(first * PAGE, &buf, false).unwrap();
        }
    }

    /// Every page read back and compared; the first that fails to read, as an error.
    fn read_all(&self, client: &Client, generation: u64) -> Result<(), String> {
        let mut out = vec![0u8; PAGE as usize];
        for i in 0..self.pages {
            client
                .read_at(i * PAGE, &mut out)
                .map_err(|e| format!("page {i}: {e}"))?;
            assert!(
                out == self.page(generation, i),
                "server {}: page {i} read back wrong",
                self.tag
            );
        }
        Ok(())
    }

    /// Reads every page until all read back exact, which they must before DEADLINE.
    fn read_all_once_back(&self, client: &Client, generation: u64, after: &str) {
        let start = Instant::now();
        while let Err(e) = self.read_all(client, generation) {
            assert!(
                start.elapsed() < DEADLINE,
                "server {}: the store never came back after {after}: {e}\n{}\n{}",
                self.tag,
                self.ctl(&["backing_dev"]),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Every page written back: bd_stat counts them all and none failed.
    fn write_back_all(&self) {
        self.ctl(&["idle", "all"]);
        self.ctl(&["writeback", "idle"]);
        assert_eq!(self.pages_on_store(), self.pages, "every page written back");
    }

    /// Waits until `ctl backing_dev` says `what`.
    fn wait_store(&self, what: &str) -> String {
        let start = Instant::now();
        loop {
            let state = self.ctl(&["backing_dev"]);
            if state.contains(what) {
                return state;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "server {}: the store never {what}: {state}",
                self.tag
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn assert_running(&mut self) {
        assert!(
            self.child.try_wait().unwrap().is_none(),
            "server {} exited: {}",
            self.tag,
            self.log_text()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Says what the test is at, and since when: the log CI keeps.
fn step(began: Instant, what: &str) {
    eprintln!("ceph: {:6.1} s  {what}", began.elapsed().as_secs_f64());
}

fn have_ceph() -> bool {
    [
        "ceph-mon",
        "ceph-mgr",
        "ceph-osd",
        "ceph",
        "rbd",
        "qemu-storage-daemon",
    ]
    .iter()
    .all(|tool| have(tool))
}

/// Processes whose command line names `dir`.
fn processes_of(dir: &Path) -> Vec<String> {
    let dir = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&dir))
        .collect()
}

#[test]
fn a_cluster_that_cannot_start_says_why() {
    if !have_ceph() {
        return;
    }
    let base = temp_dir("ceph-fail");
    let dir = base.join("cluster");
    // OSDs of 64 MiB: bluestore's database does not fit, its mkfs aborts.
    let (cluster, o) = Cluster::try_up(dir.clone(), &["--osds", "1", "--size", "64M"]);
    assert!(!o.status.success(), "a cluster on 64 MiB OSDs started");
    let out = text(&o);
    assert!(
        out.contains("osd.0 is not running") && out.contains("bluefs _allocate allocation failed"),
        "{out}"
    );
    assert!(
        processes_of(&dir).is_empty(),
        "daemons left running: {:?}",
        processes_of(&dir)
    );
    drop(cluster);
    assert!(!dir.exists(), "down left {dir:?}");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn cold_pages_on_ceph_survive_what_clusters_do() {
    if !have_ceph() {
        return;
    }
    let began = Instant::now();
    let dir = temp_dir("ceph");
    let cluster = Cluster::up(
        dir.join("cluster"),
        &[
            "--osds",
            "2",
            "--images",
            "a,b,bench",
            "--image-size",
            "256M",
        ],
    );
    // A with a timeout well past the time the cluster takes to mark a hung OSD down and
    // re-peer (15-21 s here, more on a loaded machine: what is tested is that the reads
    // wait and complete, not the timeout's value), B with a short one, to be outlived when
    // every OSD hangs (yet not so short that a healthy cluster's slow request on a loaded
    // two-core machine, while both servers write back at once, counts as a lost store).
    let mut a = Server::start(&dir, "a", 1, 32768, &cluster.run("uri", &["a"]), "60s");
    let mut b = Server::start(&dir, "b", 2, 16384, &cluster.run("uri", &["b"]), "10s");
    let (client_a, client_b) = (a.client(), b.client());
    step(began, "cluster up, two servers");

    // Two servers at once, each on its own image of one pool: every page written back
    // and read back exact by both.
    std::thread::scope(|s| {
        for (server, client) in [(&a, &client_a), (&b, &client_b)] {
            s.spawn(move || {
                server.fill(client, 1);
                server.write_back_all();
                server.read_all(client, 1).unwrap();
            });
        }
    });
    a.read_all(&client_a, 1).unwrap();
    step(began, "both servers written back and read back");

    // The bench on its own image: real pages written back and read back, every page
    // verified, the store holding no more than 1.02x their compressed bytes, and the
    // figures scripts/ceph-bench.sh reads.
    let o = Command::new(env!("CARGO_BIN_EXE_ztier"))
        .args(["bench", "--corpus"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"))
        .args(["--compressor", "lz4", "--writeback-nbd"])
        .arg(cluster.run("uri", &["bench"]))
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "bench: {}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["verified"], true, "{r}");
    assert_eq!(r["page_size"], PAGE, "{r}");
    for key in ["writeback_mb_s", "readback_mb_s"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {r}");
    }
    let pages = r["pages_written_back"].as_u64().unwrap();
    assert!(pages > 2000, "{r}");
    assert_eq!(r["bd_stat"]["bd_count"], pages, "{r}");
    let stored = r["bd_stat"]["bytes_stored"].as_u64().unwrap();
    let written = r["writeback_bytes"].as_u64().unwrap();
    assert!(
        stored > 0 && written as f64 <= 1.02 * stored as f64,
        "{written} bytes written for {stored} compressed: {r}"
    );
    step(
        began,
        &format!("the bench: {written} bytes on the store for {stored} compressed"),
    );

    // An OSD killed in the middle of a writeback: the writeback finishes on the other
    // replica, every page on the store, nothing lost.
    a.fill(&client_a, 2);
    a.ctl(&["idle", "all"]);
    let mut writeback = a
        .ctl_command(&["writeback", "idle"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while a.pages_on_store() == 0 {
        assert!(start.elapsed() < DEADLINE, "the writeback never began");
    }
    rustix::process::kill_process(cluster.pid_of("osd.1"), rustix::process::Signal::KILL).unwrap();
    assert!(
        writeback.try_wait().unwrap().is_none(),
        "the writeback ended before the OSD was killed"
    );
    let status = writeback.wait().unwrap();
    assert!(status.success(), "the writeback failed when an OSD died");
    assert_eq!(a.pages_on_store(), a.pages, "every page written back");
    let stat = a.stat();
    assert_eq!(stat["bd_stat"]["failed_writebacks"], 0, "{stat}");
    a.read_all(&client_a, 2).unwrap();
    // Ceph hid the death from its client: the store was never lost.
    assert!(!a.log_text().contains("lost the store"), "{}", a.log_text());
    step(began, "an OSD killed mid-writeback: every page read back");
    cluster.run("osd-start", &["1"]);
    cluster.run("wait-clean", &[]);

    // One OSD hung (the primary of the store's first object): the reads that need it wait
    // until the cluster marks it down, then go to the other replica; none fails.
    let hung = cluster.primary_of_first_object("a");
    cluster.run("osd-stop", &[&hung]);
    step(began, &format!("osd.{hung} hung"));
    a.read_all(&client_a, 2).unwrap();
    step(began, "every page read back");
    assert_eq!(cluster.run("osd-state", &[&hung]), "down");
    let state = a.ctl(&["backing_dev"]);
    assert!(state.contains("connected"), "{state}");
    assert!(!a.log_text().contains("lost the store"), "{}", a.log_text());
    cluster.run("osd-cont", &[&hung]);
    cluster.run("wait-osd", &[&hung, "up"]);
    cluster.run("wait-clean", &[]);

    // Every OSD hung past B's timeout: B's written-back pages fail (EIO, never wrong
    // bytes) and its store counts as lost; resumed, they read back with no restart.
    cluster.run("osd-stop", &["0"]);
    cluster.run("osd-stop", &["1"]);
    let mut out = vec![0u8; PAGE as usize];
    assert!(
        client_b.read_at(0, &mut out).is_err(),
        "a read with every OSD hung"
    );
    b.wait_store("lost");
    step(began, "every OSD hung: B's store lost");
    cluster.run("osd-cont", &["0"]);
    cluster.run("osd-cont", &["1"]);
    b.read_all_once_back(&client_b, 1, "every OSD hung");
    step(began, "resumed: B's pages read back");
    assert!(b.log_text().contains("is back"), "{}", b.log_text());
    a.read_all(&client_a, 2).unwrap();
    cluster.run("wait-clean", &[]);

    // The export killed and started again: both servers find it by themselves.
    cluster.run("export-kill", &[]);
    assert!(
        client_b.read_at(0, &mut out).is_err(),
        "a read with the export gone"
    );
    cluster.run("export-start", &[]);
    a.read_all_once_back(&client_a, 2, "the export's restart");
    b.read_all_once_back(&client_b, 1, "the export's restart");
    step(began, "the export killed and started: every page read back");

    // The export restarted with the images swapped: each server finds the other's image
    // where its own was and refuses it by its identity (its pages fail, never read from
    // the wrong image); with the right images back, every page reads back exact.
    cluster.run("export-restart", &["a=b,b=a"]);
    for (server, client) in [(&a, &client_a), (&b, &client_b)] {
        let start = Instant::now();
        loop {
            assert!(
                client.read_at(0, &mut out).is_err(),
                "server {} read from the other's image",
                server.tag
            );
            let state = server.ctl(&["backing_dev"]);
            if state.contains(": refused") {
                assert!(state.contains("identity"), "{state}");
                break;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "server {} never refused the other's image: {state}",
                server.tag
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(
            server.log_text().contains("REFUSED"),
            "{}",
            server.log_text()
        );
    }
    step(began, "images swapped: both refused");
    cluster.run("export-restart", &[]);
    a.read_all_once_back(&client_a, 2, "the images' swap");
    b.read_all_once_back(&client_b, 1, "the images' swap");
    step(began, "images back: every page read back");

    a.assert_running();
    b.assert_running();
    drop((client_a, client_b, a, b, cluster));
    let _ = std::fs::remove_dir_all(&dir);
}
