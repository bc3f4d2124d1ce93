//! A real kernel swaps to `ztier serve`: scripts/vm-swap.sh boots a QEMU guest (Debian's
//! kernel, busybox, a static workload) under emulation (TCG, no KVM needed) whose swap disk
//! is a ztier export, and the guest's workload, larger than its RAM, reads every page back
//! and checks it. Then the same guest with ztier writing cold swap pages back to a file
//! store under a memory target, and across a restart of ztier. Then the same guest with its
//! swap disk served by ztier over vhost-user-blk (QEMU's vhost-user-blk-pci, the guest's
//! RAM shared with ztier), alone and across a restart QEMU dials through; and the floor of
//! them all, the guest swapping to a RAM disk of its own. The guests' own
//! kernel logs are read for I/O errors. Where QEMU, the guest's kernel or busybox-static is
//! missing (or the kernel is not readable) the test says so and skips, except under CI,
//! which installs them (scripts/setup.sh).

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Instant;

use common::{have, temp_dir};

/// One guest at a time: two emulated guests side by side on a 2-core machine would each
/// take twice as long.
static GUESTS: Mutex<()> = Mutex::new(());

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether a guest can be built and booted here; says what is missing if not.
fn guest_can_run() -> bool {
    for tool in [
        "qemu-system-x86_64",
        "gcc",
        "cpio",
        "zstd",
        "gzip",
        "modprobe",
    ] {
        if !have(tool) {
            return false;
        }
    }
    let runs = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        ztier_corpus::cannot_test("qemu-system-x86_64 does not run here");
        return false;
    }
    let busybox_static = Command::new("ldd")
        .arg("/bin/busybox")
        .output()
        .is_ok_and(|o| !o.status.success());
    if !Path::new("/bin/busybox").exists() || !busybox_static {
        ztier_corpus::cannot_test(
            "no static /bin/busybox (busybox-static; scripts/setup.sh installs it)",
        );
        return false;
    }
    let kernel = std::fs::read_dir("/boot")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            e.file_name().to_string_lossy().starts_with("vmlinuz-")
                && std::fs::File::open(e.path()).is_ok()
        });
    if kernel.is_none() {
        ztier_corpus::cannot_test(
            "no readable /boot/vmlinuz-* (linux-image-amd64, read as root; scripts/setup.sh)",
        );
        return false;
    }
    true
}

/// The shared corpus's three programs when it is there, else the bundled sample.
fn corpora() -> Vec<PathBuf> {
    let dir = std::env::var_os("ZTIER_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/corpus"));
    let shared: Vec<PathBuf> = ["postgres", "python", "cc1"]
        .iter()
        .map(|n| dir.join(format!("{n}.pages.zst")))
        .filter(|p| p.exists())
        .collect();
    if shared.is_empty() {
        eprintln!(
            "no corpus at {}: the guest's pages come from the bundled sample",
            dir.display()
        );
        vec![repo().join("samples/sample.pages.zst")]
    } else {
        shared
    }
}

/// The script's `RESULT swap=KIND key=value ...` lines, by kind.
fn results(out: &str) -> HashMap<String, HashMap<String, String>> {
    out.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| {
            let fields: HashMap<String, String> = l
                .split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            (fields["swap"].clone(), fields)
        })
        .collect()
}

fn num(r: &HashMap<String, String>, key: &str) -> f64 {
    r.get(key)
        .unwrap_or_else(|| panic!("{key} missing in {r:?}"))
        .parse()
        .unwrap_or_else(|_| panic!("{key} is not a number in {r:?}"))
}

/// Runs scripts/vm-swap.sh with the swap disks `kinds` (a 128 MiB guest, a workload of
/// `mib` MiB) in `dir`; its RESULT lines by kind. Fails if the script does (a page back
/// wrong, an I/O error in a guest's kernel log, a guest that did not finish).
fn vm_swap(dir: &Path, kinds: &[&str], mib: u32) -> HashMap<String, HashMap<String, String>> {
    let _one = GUESTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("bash");
    cmd.current_dir(repo())
        .env("ZTIER", env!("CARGO_BIN_EXE_ztier"))
        .env("TMPDIR", dir)
        .arg("scripts/vm-swap.sh");
    for kind in kinds {
        cmd.args(["--swap", kind]);
    }
    cmd.args(["--ram", "128", "--mib", &mib.to_string()]).args([
        "--mem-target",
        "8M",
        "--timeout",
        "600",
    ]);
    for c in corpora() {
        cmd.arg("--corpus").arg(c);
    }
    let started = Instant::now();
    let out = cmd.output().expect("run scripts/vm-swap.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    eprintln!(
        "vm-swap: {} guests in {:.0} s",
        kinds.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(out.status.success(), "vm-swap.sh failed:\n{stdout}{stderr}");
    let results = results(&stdout);
    // A guest still running at half the time-out ran its watchdog (scripts/vm/init): it
    // showed where it waited and read each of its disks once. If it then finished, it was
    // slow, or a request the device had completed without telling it came back with that
    // read; either way ztier had answered, and every page was checked: it passes.
    // What the watchdog found goes to the test's real stderr, past the harness's capture,
    // so that a passing run's log keeps it.
    for (kind, r) in &results {
        if r.get("guest_watchdog").map(String::as_str) == Some("1") {
            let _ = writeln!(
                std::io::stderr(),
                "vm-swap: the {kind} guest needed its watchdog to finish; all it said:\n\
                 {stdout}{stderr}"
            );
        }
    }
    results
}

#[test]
fn a_guest_swaps_to_ztier_and_every_page_comes_back() {
    if !guest_can_run() {
        return;
    }
    let dir = temp_dir("vm-swap");
    let mib = 256;
    let results = vm_swap(&dir, &["ztier", "ztier-wb-file", "ztier-restart"], mib);

    // The guest swapped at least 64 MiB out to ztier and read every page back intact.
    let plain = &results["ztier"];
    assert_eq!(num(plain, "mismatches"), 0.0, "{plain:?}");
    assert!(
        num(plain, "pswpout") * 4096.0 >= 64.0 * 1048576.0,
        "{plain:?}"
    );
    assert!(num(plain, "pswpin") > 0.0, "{plain:?}");
    assert!(num(plain, "nbd_written_mib") >= 64.0, "{plain:?}");
    assert!(num(plain, "nbd_read_mib") > 0.0, "{plain:?}");
    assert_eq!(num(plain, "failed_reads"), 0.0, "{plain:?}");
    assert_eq!(num(plain, "failed_writes"), 0.0, "{plain:?}");
    // Discards reach ztier: beyond swapon's discard of the whole disk (mib + 64 MiB, less
    // the header page), freed clusters were discarded, and the memory went with them.
    let whole_disk = ((mib + 64) * 256 - 1) as f64;
    assert!(num(plain, "discarded_pages") > whole_disk, "{plain:?}");
    assert!(num(plain, "orig_peak_mib") >= 64.0, "{plain:?}");
    assert!(
        num(plain, "orig_end_mib") < num(plain, "orig_peak_mib") / 4.0,
        "{plain:?}"
    );
    assert!(
        num(plain, "mem_used_end_mib") < num(plain, "mem_used_max_mib") / 4.0,
        "{plain:?}"
    );

    // With a memory target under what the guest swaps, cold pages went to the file store
    // and came back; none was lost, no I/O failed.
    let wb = &results["ztier-wb-file"];
    assert_eq!(num(wb, "mismatches"), 0.0, "{wb:?}");
    assert!(num(wb, "pswpout") * 4096.0 >= 64.0 * 1048576.0, "{wb:?}");
    assert!(num(wb, "policy_written_back") > 0.0, "{wb:?}");
    assert!(num(wb, "bd_writes") > 0.0, "pages written back: {wb:?}");
    assert!(
        num(wb, "bd_reads") > 0.0,
        "pages read back from the store: {wb:?}"
    );
    assert_eq!(num(wb, "failed_reads"), 0.0, "{wb:?}");
    assert_eq!(num(wb, "failed_writes"), 0.0, "{wb:?}");

    // ztier stopped and started again from its state in the middle of the workload (64 MiB
    // swapped out): QEMU's NBD client waited for it, the guest saw no I/O error (its
    // workload ended well, its kernel logged none) and every page came back as it was
    // written.
    let restart = &results["ztier-restart"];
    assert_eq!(num(restart, "restarts"), 1.0, "{restart:?}");
    assert_eq!(num(restart, "mismatches"), 0.0, "{restart:?}");
    assert_eq!(num(restart, "guest_io_errors"), 0.0, "{restart:?}");
    assert!(num(restart, "pswpin") > 0.0, "{restart:?}");
    assert_eq!(num(restart, "failed_reads"), 0.0, "{restart:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The guest's swap disk is ztier over vhost-user-blk: QEMU's vhost-user-blk-pci hands
/// ztier the guest's virtqueues in the guest's RAM (a memfd shared with it), and ztier runs
/// them. Every page comes back intact, the guest's kernel logs no I/O error, and the
/// discards of freed swap clusters reach ztier. Then ztier is stopped (SIGTERM) and
/// started again from `--state` in the middle of the workload; QEMU dials the socket again
/// (reconnect-ms), and the guest does not notice.
#[test]
fn a_guest_swaps_to_ztier_over_vhost_user_and_through_a_restart() {
    if !guest_can_run() {
        return;
    }
    let dir = temp_dir("vm-swap-vhost");
    let mib = 256;
    let results = vm_swap(&dir, &["ztier-vhost", "ztier-vhost-restart"], mib);

    let plain = &results["ztier-vhost"];
    assert_eq!(num(plain, "mismatches"), 0.0, "{plain:?}");
    assert_eq!(num(plain, "guest_io_errors"), 0.0, "{plain:?}");
    assert!(
        num(plain, "pswpout") * 4096.0 >= 64.0 * 1048576.0,
        "{plain:?}"
    );
    assert!(num(plain, "pswpin") > 0.0, "{plain:?}");
    // Served over vhost-user: one VMM, every request answered without a device or
    // protocol error.
    assert_eq!(num(plain, "vhost_connections"), 1.0, "{plain:?}");
    assert!(num(plain, "vhost_requests") > 0.0, "{plain:?}");
    for key in [
        "vhost_protocol_errors",
        "vhost_device_errors",
        "vhost_refused",
        "vhost_unsupported",
        "vhost_unanswerable",
        "vhost_bad_heads",
        "failed_reads",
        "failed_writes",
    ] {
        assert_eq!(num(plain, key), 0.0, "{key}: {plain:?}");
    }
    // Discards reach ztier: beyond swapon's discard of the whole disk, freed clusters were
    // discarded, and the memory went with them.
    let whole_disk = ((mib + 64) * 256 - 1) as f64;
    assert!(num(plain, "discarded_pages") > whole_disk, "{plain:?}");
    assert!(num(plain, "orig_peak_mib") >= 64.0, "{plain:?}");
    assert!(
        num(plain, "orig_end_mib") < num(plain, "orig_peak_mib") / 4.0,
        "{plain:?}"
    );
    assert!(
        num(plain, "mem_used_end_mib") < num(plain, "mem_used_max_mib") / 4.0,
        "{plain:?}"
    );

    // Stopped with 64 MiB or more stored and started again from its state: QEMU dialed
    // the new server and it served the rest of the workload (the verify pass reads every
    // page, those swapped out before the restart too); no page wrong, no I/O error in
    // the guest's kernel log.
    let restart = &results["ztier-vhost-restart"];
    assert_eq!(num(restart, "restarts"), 1.0, "{restart:?}");
    assert_eq!(num(restart, "states_loaded"), 1.0, "{restart:?}");
    assert_eq!(num(restart, "mismatches"), 0.0, "{restart:?}");
    assert_eq!(num(restart, "guest_io_errors"), 0.0, "{restart:?}");
    assert!(num(restart, "pswpin") > 0.0, "{restart:?}");
    assert!(num(restart, "vhost_connections") >= 1.0, "{restart:?}");
    assert!(num(restart, "vhost_requests") > 0.0, "{restart:?}");
    assert_eq!(num(restart, "vhost_device_errors"), 0.0, "{restart:?}");
    assert_eq!(num(restart, "failed_reads"), 0.0, "{restart:?}");
    assert_eq!(num(restart, "failed_writes"), 0.0, "{restart:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The floor the other swap disks are measured against: the guest swaps to a RAM disk of
/// its own (brd), with no device outside it. The guest is given the disk's memory on top
/// of its RAM, and the workload's memory cgroup keeps it to what the guest's own RAM would
/// have left it: it still swaps (64 MiB or more out, pages read back), every page comes
/// back intact, and the host holds nothing for it.
#[test]
fn a_guest_swaps_to_its_own_ram_disk_as_the_floor() {
    if !guest_can_run() {
        return;
    }
    let dir = temp_dir("vm-swap-floor");
    let results = vm_swap(&dir, &["guest-ram"], 256);
    let floor = &results["guest-ram"];
    assert_eq!(num(floor, "mismatches"), 0.0, "{floor:?}");
    assert_eq!(num(floor, "guest_io_errors"), 0.0, "{floor:?}");
    assert!(
        num(floor, "pswpout") * 4096.0 >= 64.0 * 1048576.0,
        "the cgroup did not make the workload swap: {floor:?}"
    );
    assert!(num(floor, "pswpin") > 0.0, "{floor:?}");
    assert!(num(floor, "swapins_timed") > 0.0, "{floor:?}");
    assert_eq!(num(floor, "host_mem_mib"), 0.0, "{floor:?}");
    // The guest had the RAM disk's memory on top of its 128 MiB, the workload 64 MiB.
    assert_eq!(
        num(floor, "guest_ram_mib"),
        (128 + 256 + 64) as f64,
        "{floor:?}"
    );
    assert_eq!(num(floor, "floor_memcg_mib"), 64.0, "{floor:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
