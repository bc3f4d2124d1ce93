//! Tables of atomics made zeroed by the OS: large per-page metadata (zram's slot table, a
//! region's page states) whose memory is taken only where it is written. The allocation is
//! `calloc`'s (`alloc_zeroed`): for a table of more than a few pages the C library maps fresh
//! anonymous memory, which reads as zeros without being touched, so a 1 TiB disk's 4 GiB
//! slot table costs nothing until pages arrive, and reading an untouched part maps the
//! shared zero page, not new memory. (Writes bring in a 4 KiB page of the table at a time:
//! 256 slots' worth.)
//!
//! Invariant: every value handed out starts as all zero bytes, which is a valid value of
//! the atomic types here (their zero). No locks.
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
