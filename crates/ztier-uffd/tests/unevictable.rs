//! A region over its budget whose pages cannot go out (the program locked them with `mlock`,
//! or made them read-only, as docs/region.md allows) does not spin: its reclaim backs off, costs
//! next to no CPU, and says why it cannot evict. Alone in its test binary, because it reads
//! the CPU time of the region's threads, which other tests' regions would share names with;
//! and its two tests one at a time, for the same reason.

mod common;

use std::time::{Duration, Instant};

use common::{region, write_page, PAGE};

/// The tests one at a time: each reads the CPU time of every thread named for a region's
/// reclaim, the other test's region's too.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// CPU time (user and system, in clock ticks) of this process's threads named `names`.
fn cpu_ticks(names: &[&str]) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !names.contains(&&stat[open + 1..close]) {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        // utime and stime: fields 14 and 15 of stat, 12 and 13 after the state.
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    hz.max(1) as u64
}

fn stays_quiet_and_says_why(
    lock: impl Fn(*mut u8, usize),
    unlock: impl Fn(*mut u8, usize),
    why: &str,
) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    const LEN: usize = 16 << 20;
    let Some(r) = region(LEN, LEN) else {
        return;
    };
    let words = r.words();
    for page in 0..(LEN / PAGE) as u64 {
        write_page(words, page, 1);
    }
    lock(r.as_ptr(), LEN);
    r.set_budget(4 << 20).unwrap();
    // Until the reclaim thread has tried and found nothing it can take.
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.stats().reclaim_looks < 5 {
        assert!(Instant::now() < deadline, "the reclaim thread never looked");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(&["uffd-reclaim", "uffd-reclaim2"]);
    let window = Duration::from_secs(2);
    std::thread::sleep(window);
    let used = cpu_ticks(&["uffd-reclaim", "uffd-reclaim2"]) - before;
    let share = used as f64 / ticks_per_second() as f64 / window.as_secs_f64();
    let s = r.stats();
    eprintln!(
        "{why}: {:.1} % of a CPU; {:?}",
        share * 100.0,
        r.last_error()
    );
    assert!(
        share < 0.05,
        "the reclaim threads took {:.1} % of a CPU",
        share * 100.0
    );
    assert_eq!(s.resident_pages, (LEN / PAGE) as u64, "nothing could go");
    assert!(s.reclaim_blocked && s.reclaim_blocked_passes > 0, "{s:?}");
    let said = r.last_error().unwrap_or_default();
    assert!(said.contains(why), "{said}");
    // Undone, the pages go: within the longest backoff and a pass.
    unlock(r.as_ptr(), LEN);
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.stats().resident_pages > r.stats().budget_pages || r.stats().reclaim_blocked {
        assert!(
            Instant::now() < deadline,
            "never evicted once undone: {:?}",
            r.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    for page in (0..(LEN / PAGE) as u64).step_by(7) {
        common::check_page(words, page, 1).unwrap();
    }
}

/// The program's `mlock` of the whole region.
#[test]
fn locked_pages_over_the_budget_cost_no_cpu_and_the_region_says_why() {
    stays_quiet_and_says_why(
        |p, len| {
            // SAFETY: the region's own mapping, locked in place; nothing is read or written.
            #[allow(unsafe_code)]
            let r = unsafe { libc::mlock(p.cast(), len) };
            assert_eq!(r, 0, "mlock: {}", std::io::Error::last_os_error());
        },
        |p, len| {
            // SAFETY: as above, unlocked.
            #[allow(unsafe_code)]
            let r = unsafe { libc::munlock(p.cast(), len) };
            assert_eq!(r, 0, "munlock: {}", std::io::Error::last_os_error());
        },
        "locked",
    );
}

/// The program's `mprotect` of the whole region read-only.
#[test]
fn read_only_pages_over_the_budget_cost_no_cpu_and_the_region_says_why() {
    stays_quiet_and_says_why(
        |p, len| {
            // SAFETY: the region's own mapping, made read-only; nothing is read or written.
            #[allow(unsafe_code)]
            let r = unsafe { libc::mprotect(p.cast(), len, libc::PROT_READ) };
            assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
        },
        |p, len| {
            // SAFETY: as above, writable again.
            #[allow(unsafe_code)]
            let r = unsafe { libc::mprotect(p.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
            assert_eq!(r, 0, "mprotect: {}", std::io::Error::last_os_error());
        },
        "read-only",
    );
}
