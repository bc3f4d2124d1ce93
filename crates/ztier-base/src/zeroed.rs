//! Tables of atomics made zeroed by the OS: large per-page metadata (zram's slot table, a
//! region's page states) whose memory is taken only where it is written. The allocation is
//! `calloc`'s (`alloc_zeroed`): for a table of more than a few pages the C library maps fresh
//! anonymous memory, which reads as zeros without being touched, so a 1 TiB disk's 4 GiB
//! slot table costs nothing until pages arrive, and reading an untouched part maps the
//! shared zero page, not new memory. (Writes bring in a 4 KiB page of the table at a time:
//! 256 slots' worth.)
//!
//! Pages of a table that hold only zeros again can be given back to the OS
//! ([`give_back_zero_pages`]: a discarded range of a disk), and [`resident_bytes`] says what
//! a table costs now.
//!
//! Invariant: every value handed out starts as all zero bytes, which is a valid value of
//! the atomic types here (their zero), and a page given back reads as zeros again. No locks
//! (the caller of a give-back keeps writers out).
#![allow(unsafe_code)]

use std::alloc::{alloc_zeroed, Layout};
use std::sync::atomic::{AtomicU64, AtomicU8};

/// `n` values of `T`, all zero bytes, from `alloc_zeroed`; `None` if the memory is not
/// there.
///
/// # Safety
/// All-zero bytes must be a valid `T`.
unsafe fn zeroed_slice<T>(n: usize) -> Option<Box<[T]>> {
    if n == 0 || size_of::<T>() == 0 {
        return Some(Box::new([]));
    }
    let layout = Layout::array::<T>(n).ok()?;
    // SAFETY: the layout has a non-zero size (n > 0, T not zero-sized).
    let ptr = unsafe { alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return None;
    }
    let slice = std::ptr::slice_from_raw_parts_mut(ptr, n);
    // SAFETY: `ptr` was allocated by the global allocator with `Layout::array::<T>(n)`,
    // which is what `Box<[T]>` deallocates with; its `n` values are initialised, as zero
    // bytes are a valid `T` (the caller's contract).
    Some(unsafe { Box::from_raw(slice) })
}

/// `n` rows of `W` atomic words, all zero; `None` if the memory is not there.
pub fn words<const W: usize>(n: usize) -> Option<Box<[[AtomicU64; W]]>> {
    // SAFETY: an AtomicU64 has the size and validity of a u64, for which zero is valid; an
    // array of them likewise.
    unsafe { zeroed_slice(n) }
}

/// `n` atomic bytes, all zero; `None` if the memory is not there.
pub fn bytes(n: usize) -> Option<Box<[AtomicU8]>> {
    // SAFETY: an AtomicU8 has the size and validity of a u8, for which zero is valid.
    unsafe { zeroed_slice(n) }
}

/// Whether some OS page wholly inside `rows[range]` holds only zeros now (a look without
/// locks, before a caller takes them to give such pages back).
pub fn has_zero_page<const W: usize>(
    rows: &[[AtomicU64; W]],
    range: std::ops::Range<usize>,
) -> bool {
    let page = crate::os::page_size();
    let Some(part) = rows.get(range) else {
        return false;
    };
    let row_bytes = size_of::<[AtomicU64; W]>();
    let start = part.as_ptr() as usize;
    let end = start + std::mem::size_of_val(part);
    let mut at = start.next_multiple_of(page);
    while at + page <= end {
        let from = (at - start) / row_bytes;
        if part[from..from + page / row_bytes].iter().all(|r| {
            r.iter()
                .all(|w| w.load(std::sync::atomic::Ordering::Relaxed) == 0)
        }) {
            return true;
        }
        at += page;
    }
    false
}

/// The OS pages wholly inside `rows[range]` whose every value is zero now are given back
/// to the OS (`MADV_DONTNEED`: the memory is freed, and the page reads as zeros again, from
/// the shared zero page, until it is written). Returns the bytes given back.
///
/// Memory-safe whatever the caller does: a page given back reads as zero, a valid value of
/// every atomic here. But a store into such a page between the look and the give-back is
/// lost (the page goes back to zero), so the caller keeps writers of the range out while
/// it runs; a writer that only ever stores zero there (a lock bit taken and released on an
/// empty row) loses nothing.
pub fn give_back_zero_pages<const W: usize>(
    rows: &[[AtomicU64; W]],
    range: std::ops::Range<usize>,
) -> usize {
    let page = crate::os::page_size();
    let Some(part) = rows.get(range) else {
        return 0;
    };
    let start = part.as_ptr() as usize;
    let end = start + std::mem::size_of_val(part);
    let first = start.next_multiple_of(page);
    let mut given = 0;
    let mut at = first;
    while at + page <= end {
        let row_bytes = size_of::<[AtomicU64; W]>();
        let from = (at - start) / row_bytes;
        let rows_in_page = page / row_bytes;
        let all_zero = part[from..from + rows_in_page].iter().all(|r| {
            r.iter()
                .all(|w| w.load(std::sync::atomic::Ordering::Acquire) == 0)
        });
        if all_zero {
            // SAFETY: `[at, at + page)` is a whole page inside `part` (aligned, and
            // `at + page <= end`), memory this process allocated (the table's, from
            // `alloc_zeroed`) and still owns while `rows` is borrowed. DONTNEED on private
            // anonymous memory makes it read as zero bytes, which are valid values of every
            // row here; the allocation itself stays mapped and owned. No Rust reference to
            // a non-atomic value points into it (the rows are atomics).
            let r = unsafe { libc::madvise(at as *mut libc::c_void, page, libc::MADV_DONTNEED) };
            if r == 0 {
                given += page;
            }
        }
        at += page;
    }
    given
}

/// The bytes of `rows` held in memory now: pages written and not given back, read from
/// `/proc/self/pagemap` (present and mapped by this process alone, which leaves out the
/// shared zero page a read of an untouched page maps); `None` if the OS would not say.
pub fn resident_bytes<const W: usize>(rows: &[[AtomicU64; W]]) -> Option<u64> {
    use std::os::unix::fs::FileExt;
    if rows.is_empty() {
        return Some(0);
    }
    let page = crate::os::page_size();
    let start = rows.as_ptr() as usize;
    let end = start + std::mem::size_of_val(rows);
    let first = start / page;
    let pages = end.div_ceil(page) - first;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    const PRESENT: u64 = 1 << 63;
    const EXCLUSIVE: u64 = 1 << 56;
    let mut held = 0u64;
    let mut entries = vec![0u8; 8 * pages.min(64 << 10)];
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(64 << 10);
        let buf = &mut entries[..8 * n];
        pagemap.read_exact_at(buf, 8 * (first + done) as u64).ok()?;
        held += buf
            .chunks_exact(8)
            .map(|e| u64::from_ne_bytes(e.try_into().expect("8 bytes")))
            .filter(|e| e & PRESENT != 0 && e & EXCLUSIVE != 0)
            .count() as u64;
        done += n;
    }
    Some(held * page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn tables_start_at_zero_and_hold_what_is_written() {
        let t = words::<2>(100_000).unwrap();
        assert_eq!(t.len(), 100_000);
        assert!(t
            .iter()
            .all(|r| r[0].load(Relaxed) == 0 && r[1].load(Relaxed) == 0));
        t[99_999][1].store(7, Relaxed);
        assert_eq!(t[99_999][1].load(Relaxed), 7);
        let b = bytes(3).unwrap();
        assert!(b.iter().all(|x| x.load(Relaxed) == 0));
        assert!(words::<2>(0).unwrap().is_empty());
    }

    /// Pages emptied again go back to the OS; a page with one value left stays, and
    /// everything reads as it did.
    #[test]
    fn emptied_pages_go_back_to_the_os() {
        let t = words::<2>(1 << 20).unwrap(); // 16 MiB of table
        for r in t.iter() {
            r[0].store(1, Relaxed);
        }
        let full = resident_bytes(&t).unwrap();
        assert!(full >= 16 << 20, "{full}");
        // Read where nothing was written: the zero page, which costs nothing and is not
        // counted.
        let untouched = words::<2>(1 << 20).unwrap();
        assert!(untouched.iter().all(|r| r[0].load(Relaxed) == 0));
        assert!(resident_bytes(&untouched).unwrap() <= 2 * crate::os::page_size() as u64);
        for r in t.iter() {
            r[0].store(0, Relaxed);
        }
        t[1000][1].store(5, Relaxed);
        let given = give_back_zero_pages(&t, 0..t.len());
        let page = crate::os::page_size();
        assert!(given >= (16 << 20) - 2 * page, "{given}");
        let left = resident_bytes(&t).unwrap();
        assert!(left <= 3 * page as u64, "{left} bytes still resident");
        assert_eq!(
            t[1000][1].load(Relaxed),
            5,
            "the page holding a value stays"
        );
        assert!(t
            .iter()
            .enumerate()
            .all(|(i, r)| r[0].load(Relaxed) == 0 && (i == 1000 || r[1].load(Relaxed) == 0)));
        // A range that holds no whole page gives nothing back.
        assert_eq!(give_back_zero_pages(&t, 10..20), 0);
        assert_eq!(
            give_back_zero_pages(&t, 0..usize::MAX),
            0,
            "out of bounds: nothing"
        );
    }

    /// A table far larger than what is written costs only the pages written.
    #[test]
    fn an_untouched_table_costs_no_memory() {
        let before = crate::os::process_rss_bytes().unwrap();
        let t = words::<2>(1 << 28).unwrap(); // 4 GiB of table
        for i in (0..t.len()).step_by(1 << 20) {
            t[i][0].store(1, Relaxed);
        }
        let after = crate::os::process_rss_bytes().unwrap();
        assert!(
            after < before + (64 << 20),
            "{} MiB for 256 written rows",
            (after.saturating_sub(before)) >> 20
        );
    }
}
