//! What the process asks of the OS beyond std, for every layer: the page size, the
//! machine's memory, this process's resident set (whole, or of some of its mappings), its
//! page table's entries (`/proc/self/pagemap`), its user, a coarse clock, and how the C
//! library's allocator gives large blocks back. (The scheduler's calls are
//! [`crate::sched`]'s, anonymous mappings [`crate::mapping`]'s.)
//!
//! Invariant: nothing here touches memory the caller holds; each call only reads a file
//! of `/proc`, asks the kernel about the process, or sets an allocator parameter. No locks.
#![allow(unsafe_code)]

/// Seconds on the system's monotonic clock, read at its coarse resolution
/// (`CLOCK_MONOTONIC_COARSE`: the last timer tick, a few milliseconds old), for times kept in
/// whole seconds on every access (zram's `ac_time`): a fraction of the cost of a precise
/// read (`Instant::now`), whose share of a zram read is in docs/diary.md. Falls back to the
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

/// Idle priority for background threads, kept here for its callers; the scheduler's calls
/// live in [`crate::sched`].
pub use crate::sched::lower_to_idle_priority;

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

/// The `/proc/self/pagemap` entry of each of the `pages` OS pages from address
/// `first_page * page_size()`, handed to `each(page, entry)` (`page` counted from the
/// first), read in batches; `None` if the OS would not say. The bits are
/// [`PAGEMAP_PRESENT`], [`PAGEMAP_SWAPPED`] and [`PAGEMAP_EXCLUSIVE`]; the frame numbers in
/// the low bits read as 0 without `CAP_SYS_ADMIN`, and nothing here uses them.
pub fn pagemap_entries(
    first_page: usize,
    pages: usize,
    mut each: impl FnMut(usize, u64),
) -> Option<()> {
    use std::os::unix::fs::FileExt;
    if pages == 0 {
        return Some(());
    }
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let mut entries = vec![0u8; 8 * pages.min(64 << 10)];
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(64 << 10);
        let buf = &mut entries[..8 * n];
        pagemap
            .read_exact_at(buf, 8 * (first_page + done) as u64)
            .ok()?;
        for (i, e) in buf.chunks_exact(8).enumerate() {
            each(done + i, u64::from_ne_bytes(e.try_into().expect("8 bytes")));
        }
        done += n;
    }
    Some(())
}

/// A pagemap entry's page is in memory (`PM_PRESENT`).
pub const PAGEMAP_PRESENT: u64 = 1 << 63;
/// A pagemap entry's page is in swap (`PM_SWAP`).
pub const PAGEMAP_SWAPPED: u64 = 1 << 62;
/// A pagemap entry's page is mapped by this process alone (`PM_MMAP_EXCLUSIVE`): not the
/// shared zero page a read of an untouched page maps.
pub const PAGEMAP_EXCLUSIVE: u64 = 1 << 56;

/// The size from which the C library maps each allocation on its own, returned to the OS at
/// its free: its default (128 KiB), fixed.
pub const MAP_OWN_FROM: usize = 128 << 10;

/// Makes the C library (glibc) map every allocation of [`MAP_OWN_FROM`] or more on its own,
/// so a large block freed goes back to the OS at once. By default glibc raises that
/// threshold to the largest block freed so far (up to 32 MiB): after the first large free
/// a server's large tables (a store's clusters, a device's tables) come from its heap, and
/// stay in the process after they are freed, so RSS would follow the peak of what a
/// long-running server made, not what it holds. Fixing the threshold turns that raise off.
/// Called once at a server's start; true if the C library took it (elsewhere, false: its
/// allocator decides).
pub fn return_large_frees_to_the_os() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a parameter of the allocator's, which it reads under its
        // own lock; it touches no memory of ours.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MAP_OWN_FROM as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Gives the C library's freed heap back to the OS now (glibc's `malloc_trim`): what a
/// destroyed device's tables and buffers held below the mmap threshold, which the
/// allocator would otherwise keep for reuse. True if some memory went back.
pub fn give_freed_heap_back() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only returns the allocator's free memory to the OS, under its
        // own locks; it touches no memory in use.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// A random (version 4) UUID, as `mkswap` gives each swap area (and a shared store its label): from the kernel's random pool,
/// or, if `/dev/urandom` cannot be read, from the clock, the process and a hasher's random
/// keys, which still differ between any two areas made here.
pub fn random_uuid() -> [u8; 16] {
    use std::io::Read;
    let mut id = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut id));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, half) in id.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(now);
            h.write_u32(std::process::id());
            h.write_usize(i);
            half.copy_from_slice(&h.finish().to_ne_bytes());
        }
    }
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// Lets a closed pipe end the process quietly (`SIGPIPE`'s default, which Rust's runtime
/// turns off): a report written into `| head` stops there, as a C tool's does, instead of
/// failing the write. Only for a process that writes to no socket: a peer that goes would
/// end it too, without a word.
pub fn end_quietly_on_broken_pipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler of ours; it only restores the
    // kernel's default action for SIGPIPE, which touches no memory of this process.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mapping's resident bytes follow its pages: none, then every one written.
    #[test]
    fn rss_within_counts_a_mappings_resident_pages() {
        let ps = page_size();
        let len = 64 * ps;
        let map = crate::mapping::Mapping::anonymous(len).unwrap();
        // No huge pages, and flags no neighbour has, so it stays a mapping of its own in
        // /proc/self/smaps.
        map.advise(0, len, crate::mapping::Advice::NoHugePage)
            .unwrap();
        let range = map.addr()..map.addr() + len;
        assert_eq!(rss_within(std::slice::from_ref(&range)).unwrap(), 0);
        // SAFETY: the mapping is ours, `len` bytes long and writable; nothing else uses it.
        unsafe { std::ptr::write_bytes(map.ptr().as_ptr(), 1, len) };
        assert_eq!(
            rss_within(std::slice::from_ref(&range)).unwrap(),
            len as u64
        );
        assert_eq!(rss_within(&[]).unwrap(), 0);
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
