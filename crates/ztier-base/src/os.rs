//! What the process asks of the OS beyond std, for every layer: the page size, the
//! machine's memory, this process's resident set (whole, or of some of its mappings), idle
//! priority for background threads, and a coarse clock.
//!
//! Invariant: nothing here touches memory the caller holds; each call only reads a file
//! of `/proc` or asks the kernel about (or changes the policy of) the calling thread. No
//! locks.
#![allow(unsafe_code)]

/// Seconds on the system's monotonic clock, read at its coarse resolution
/// (`CLOCK_MONOTONIC_COARSE`: the last timer tick, a few milliseconds old), for times kept in
/// whole seconds on every access (zram's `ac_time`): a fraction of the cost of a precise
/// read (`Instant::now`), whose share of a zram read is in MEASUREMENTS.md. Falls back to the
/// precise clock where the coarse one is refused.
pub fn coarse_monotonic_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0 {
        return ts.tv_sec as u64;
    }
    // SAFETY: as above.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } == 0 {
        return ts.tv_sec as u64;
    }
    0
}

/// The user this process acts as (its effective user id).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() }
}

/// The OS page size in bytes (4096 if the OS will not say).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as usize
    } else {
        4096
    }
}

/// Makes the calling thread run only when a CPU would otherwise be idle (`SCHED_IDLE`):
/// for background work that must not take the foreground's cores (the page arena's helper,
/// zram's policy), or a thread that should give its CPU to the one it wakes (the
/// userfaultfd region's fault thread); whether it could.
///
/// Such work is worth doing ahead only on a core with nothing else to do. On a busy machine
/// (as many working threads as cores) it would take the cores' time all the same and add a
/// context switch and a cold cache to each step, so there it yields (MEASUREMENTS.md has the
/// arena helper's figures). A thread put aside this way must hold no lock that a foreground
/// thread waits for, or something must end its idle priority when one waits (the
/// userfaultfd region's guard does that for its fault thread).
pub fn lower_to_idle_priority() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler with pid 0 changes only the calling thread's policy; param
    // is a valid sched_param for SCHED_IDLE. Failure leaves the thread at normal priority,
    // which is correct, only slower on a busy machine.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`), `u64::MAX` if unreadable:
/// the bound for tables and corpora that must fit in memory.
pub fn physical_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kib.checked_mul(1024)
        })
        .unwrap_or(u64::MAX)
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(resident * page_size() as u64)
}

/// Bytes resident (`Rss` in `/proc/self/smaps`) in the process's mappings that lie inside
/// one of `ranges` (a mapping split into several, by its protections or its use, counts
/// whole: each part lies inside).
pub fn rss_within(ranges: &[std::ops::Range<usize>]) -> std::io::Result<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let bad = |line: &str| std::io::Error::other(format!("/proc/self/smaps: {line:?}"));
    let mut inside = false;
    let mut kib = 0u64;
    for line in smaps.lines() {
        // A mapping's first line: "start-end perms ...", addresses in hex.
        let bounds = line.split_once(' ').and_then(|(range, _)| {
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        });
        if let Some((a, b)) = bounds {
            inside = ranges.iter().any(|r| a >= r.start && b <= r.end);
        } else if let (true, Some(v)) = (inside, line.strip_prefix("Rss:")) {
            kib += v
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .map_err(|_| bad(line))?;
        }
    }
    Ok(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping's resident bytes follow its pages: none, then every one written.
    #[test]
    fn rss_within_counts_a_mappings_resident_pages() {
        let ps = page_size();
        let len = 64 * ps;
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing; it touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: advice on our own new mapping. No huge pages, and flags no neighbour has,
        // so it stays a mapping of its own in /proc/self/smaps.
        assert_eq!(unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) }, 0);
        let range = p as usize..p as usize + len;
        assert_eq!(rss_within(std::slice::from_ref(&range)).unwrap(), 0);
        // SAFETY: the mapping is ours, `len` bytes long and writable; nothing else uses it.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
        assert_eq!(
            rss_within(std::slice::from_ref(&range)).unwrap(),
            len as u64
        );
        assert_eq!(rss_within(&[]).unwrap(), 0);
        // SAFETY: our own mapping, unmapped once, no reference into it left.
        unsafe { libc::munmap(p, len) };
    }

    /// The coarse clock counts the seconds the precise one does (within its tick).
    #[test]
    fn the_coarse_clock_keeps_whole_seconds() {
        let (a, start) = (coarse_monotonic_secs(), std::time::Instant::now());
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let (b, waited) = (coarse_monotonic_secs(), start.elapsed().as_secs());
        assert!(a > 0);
        assert!(
            (b - a).abs_diff(waited) <= 1,
            "coarse {a} -> {b} over {waited} s"
        );
        assert!(b - a >= 2, "coarse {a} -> {b} over {waited} s");
    }

    #[test]
    fn the_machine_and_the_process_are_measured() {
        assert!(page_size().is_power_of_two());
        let memory = physical_memory_bytes();
        assert!(memory > 1 << 20 && memory != u64::MAX, "MemTotal read");
        let before = process_rss_bytes().expect("statm read");
        // 8 MiB touched raise the resident set by about that much.
        let block = vec![1u8; 8 << 20];
        let after = process_rss_bytes().unwrap();
        assert!(std::hint::black_box(&block)[12345] == 1);
        assert!(after >= before + (6 << 20), "rss {before} -> {after}");
    }
}
