//! Tables of atomics made zeroed by the OS: large per-page metadata (zram's slot table, a
//! store's live counts, a region's page states) whose memory is taken only where it is
//! written. Each table is a mapping of its own ([`Table`], on [`Mapping`]): it reads as zeros
//! without being touched, so a 1 TiB disk's 4 GiB slot table costs nothing until pages
//! arrive, reading an untouched part maps the shared zero page, not new memory, and the
//! whole goes back to the OS when the table is dropped. (Not `calloc`: the C library serves
//! a large request from its heap once its mapping threshold has grown past it, and zeroes
//! it there by writing, and keeps it after a free. Writes bring in a 4 KiB page of the
//! table at a time: 256 slots' worth.)
//!
//! Pages of a table that hold only zeros again can be given back to the OS
//! ([`give_back_zero_pages`], each row of the page claimed by its lock first: a discarded
//! range of a disk), and [`resident_bytes`] says what a table costs now.
//!
//! Invariant: every value handed out starts as all zero bytes, which is a valid value of
//! the atomic types here (their zero), and a page given back reads as zeros again: every
//! row of it empty and unlocked. No locks of its own: a give-back holds the rows' own.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

use crate::mapping::Mapping;

/// `len` values of `T` in a mapping of their own, all zero bytes until written.
pub struct Table<T> {
    /// `None` for an empty table (a mapping has at least a byte).
    mapping: Option<Mapping>,
    len: usize,
    values: PhantomData<T>,
}

impl<T> std::ops::Deref for Table<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match &self.mapping {
            None => &[],
            // SAFETY: the mapping holds `len` values of `T` (made so in `zeroed_table`),
            // page-aligned (more than any `T` here needs), initialised (zero bytes, valid
            // for `T` by `zeroed_table`'s contract), and lives as long as `self`; the values
            // are atomics, changed only through shared references.
            Some(m) => unsafe { std::slice::from_raw_parts(m.ptr().as_ptr().cast(), self.len) },
        }
    }
}

impl<T> std::fmt::Debug for Table<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("len", &self.len).finish()
    }
}

/// `n` values of `T`, all zero bytes, in a mapping of their own; `None` if the memory is
/// not there.
///
/// # Safety
/// All-zero bytes must be a valid `T`, and `T` must be an atomic type or arrays of them
/// (so a shared table may be changed), aligned to at most a page.
unsafe fn zeroed_table<T>(n: usize) -> Option<Table<T>> {
    let bytes = n.checked_mul(size_of::<T>())?;
    let mapping = match bytes {
        0 => None,
        _ => Some(Mapping::anonymous(bytes).ok()?),
    };
    Some(Table {
        mapping,
        len: n,
        values: PhantomData,
    })
}

/// `n` rows of `W` atomic words, all zero; `None` if the memory is not there.
pub fn words<const W: usize>(n: usize) -> Option<Table<[AtomicU64; W]>> {
    // SAFETY: an AtomicU64 has the size and validity of a u64, for which zero is valid; an
    // array of them likewise; 8-byte aligned.
    unsafe { zeroed_table(n) }
}

/// `n` atomic bytes, all zero; `None` if the memory is not there.
pub fn bytes(n: usize) -> Option<Table<AtomicU8>> {
    // SAFETY: an AtomicU8 has the size and validity of a u8, for which zero is valid.
    unsafe { zeroed_table(n) }
}

/// `n` atomic counts, all zero; `None` if the memory is not there.
pub fn counts(n: usize) -> Option<Table<AtomicU32>> {
    // SAFETY: an AtomicU32 has the size and validity of a u32, for which zero is valid.
    unsafe { zeroed_table(n) }
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

/// How a table's rows are locked: the word of a row that holds its lock bit, and the bit.
/// A give-back takes the lock of every row of a page (a compare-and-swap from zero), so no
/// one holds or takes one while the page goes back.
#[derive(Debug, Clone, Copy)]
pub struct RowLock {
    pub word: usize,
    pub bit: u64,
}

/// The OS pages wholly inside `rows[range]` whose every value is zero are given back to
/// the OS (`MADV_DONTNEED`: the memory is freed, and the page reads as zeros again, from
/// the shared zero page, until it is written). Returns the bytes given back.
///
/// A page goes back only once every row of it is claimed: its lock word swapped from zero
/// to `lock.bit` (a row locked by anyone, or not empty, keeps the whole page). Claimed,
/// no locker can hold or take a row of the page, so nothing written to it is lost; the
/// give-back releases every claim at once (the page reads as zeros, unlocked), and a page
/// that cannot go back has its claims released by hand. A writer that stores into a row
/// without its lock is the caller's to keep out.
pub fn give_back_zero_pages<const W: usize>(
    rows: &[[AtomicU64; W]],
    range: std::ops::Range<usize>,
    lock: RowLock,
) -> usize {
    use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
    const { assert!(W > 0) };
    let page = crate::os::page_size();
    let row_bytes = size_of::<[AtomicU64; W]>();
    if lock.word >= W || lock.bit == 0 || !page.is_multiple_of(row_bytes) {
        return 0;
    }
    let Some(part) = rows.get(range) else {
        return 0;
    };
    let start = part.as_ptr() as usize;
    let end = start + std::mem::size_of_val(part);
    let mut given = 0;
    let mut at = start.next_multiple_of(page);
    while at + page <= end {
        let from = (at - start) / row_bytes;
        let in_page = &part[from..from + page / row_bytes];
        at += page;
        let mut claimed = 0;
        for row in in_page {
            if row[lock.word]
                .compare_exchange(0, lock.bit, Acquire, Relaxed)
                .is_err()
            {
                break;
            }
            claimed += 1;
        }
        let release = |n: usize| {
            for row in &in_page[..n] {
                row[lock.word].store(0, Release);
            }
        };
        let empty = claimed == in_page.len()
            && in_page.iter().all(|row| {
                row.iter()
                    .enumerate()
                    .all(|(i, w)| i == lock.word || w.load(Relaxed) == 0)
            });
        if !empty {
            release(claimed);
            continue;
        }
        let page_start = at - page;
        // SAFETY: `[page_start, page_start + page)` is a whole page inside `part` (aligned,
        // and it ended at or before `end`), private anonymous memory of this process (a
        // [`Table`]'s mapping, or the heap's) that stays owned while `rows` is borrowed. DONTNEED on private
        // anonymous memory makes it read as zero bytes, which are valid values of every row
        // here; the allocation itself stays mapped and owned. No Rust reference to a
        // non-atomic value points into it (the rows are atomics), and every row of it is
        // claimed above, so no locker holds one.
        let r =
            unsafe { libc::madvise(page_start as *mut libc::c_void, page, libc::MADV_DONTNEED) };
        if r == 0 {
            given += page;
        } else {
            release(claimed);
        }
    }
    given
}

/// Asks the OS not to back `rows` with transparent huge pages: a table written here and
/// there would otherwise take 2 MiB at each first write, and a page given back would free
/// nothing until its huge page is split. Best effort.
pub fn no_huge_pages<T>(rows: &[T]) {
    let page = crate::os::page_size();
    let start = rows.as_ptr() as usize;
    let end = start + std::mem::size_of_val(rows);
    let first = start.next_multiple_of(page);
    let last = end - end % page;
    if last <= first {
        return;
    }
    // SAFETY: `[first, last)` is whole pages inside the table's allocation; MADV_NOHUGEPAGE
    // changes only how the kernel may back them, not their contents or mapping.
    unsafe {
        libc::madvise(
            first as *mut libc::c_void,
            last - first,
            libc::MADV_NOHUGEPAGE,
        );
    }
}

/// Calls `each(page, entry)` with the `/proc/self/pagemap` entry of each OS page that
/// `rows` touches (`page` counted from the first); `None` if the OS would not say.
fn for_each_page<T>(rows: &[T], each: impl FnMut(usize, u64)) -> Option<()> {
    if rows.is_empty() || size_of::<T>() == 0 {
        return Some(());
    }
    let page = crate::os::page_size();
    let start = rows.as_ptr() as usize;
    let end = start + std::mem::size_of_val(rows);
    let first = start / page;
    crate::os::pagemap_entries(first, end.div_ceil(page) - first, each)
}

use crate::os::{
    PAGEMAP_EXCLUSIVE as EXCLUSIVE, PAGEMAP_PRESENT as PRESENT, PAGEMAP_SWAPPED as SWAPPED,
};

/// The bytes of `rows` held in memory now: pages written and not given back, read from
/// `/proc/self/pagemap` (present and mapped by this process alone, which leaves out the
/// shared zero page a read of an untouched page maps); `None` if the OS would not say.
pub fn resident_bytes<T>(rows: &[T]) -> Option<u64> {
    let mut held = 0u64;
    for_each_page(rows, |_, e| {
        held += u64::from(e & PRESENT != 0 && e & EXCLUSIVE != 0);
    })?;
    Some(held * crate::os::page_size() as u64)
}

/// The ranges of `rows` on pages that were ever written and not given back since (in
/// memory and this process's alone, or in swap), in order: every row outside them is all
/// zero bytes, so a walk for non-zero rows (a reset's) need look only here, and never
/// brings in a page of the table no row was written to. `None` if the OS would not say
/// (walk them all).
pub fn written_rows<T>(rows: &[T]) -> Option<Vec<std::ops::Range<usize>>> {
    let page = crate::os::page_size();
    let row_bytes = size_of::<T>();
    let start = rows.as_ptr() as usize;
    let page_of_start = start / page * page;
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    for_each_page(rows, |p, e| {
        let written = (e & PRESENT != 0 && e & EXCLUSIVE != 0) || e & SWAPPED != 0;
        if !written {
            return;
        }
        // The rows that overlap the page's bytes.
        let lo = (page_of_start + p * page).max(start) - start;
        let hi = (page_of_start + (p + 1) * page - start).min(std::mem::size_of_val(rows));
        let (from, to) = (lo / row_bytes, hi.div_ceil(row_bytes));
        match ranges.last_mut() {
            Some(last) if last.end >= from => last.end = last.end.max(to),
            _ => ranges.push(from..to),
        }
    })?;
    Some(ranges)
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
        let lock = RowLock {
            word: 1,
            bit: 1 << 63,
        };
        // A row whose lock is held keeps its page.
        t[50_000][1].store(1 << 63, Relaxed);
        let given = give_back_zero_pages(&t, 0..t.len(), lock);
        let page = crate::os::page_size();
        assert!(
            given >= (16 << 20) - 3 * page,
            "{given}: all but the pages of rows 1000 and 50,000"
        );
        let left = resident_bytes(&t).unwrap();
        assert!(left <= 5 * page as u64, "{left} bytes still resident");
        assert_eq!(
            t[1000][1].load(Relaxed),
            5,
            "the page holding a value stays"
        );
        assert_eq!(
            t[50_000][1].load(Relaxed),
            1 << 63,
            "a held lock stays held"
        );
        assert!(t.iter().enumerate().all(|(i, r)| r[0].load(Relaxed) == 0
            && (i == 1000 || i == 50_000 || r[1].load(Relaxed) == 0)));
        // A range that holds no whole page gives nothing back.
        assert_eq!(give_back_zero_pages(&t, 10..20, lock), 0);
        assert_eq!(
            give_back_zero_pages(&t, 0..usize::MAX, lock),
            0,
            "out of bounds: nothing"
        );
    }

    /// The rows on written pages are found, and only they: every row written is in a range,
    /// the untouched rest (read or not) is not.
    #[test]
    fn written_rows_are_the_rows_of_written_pages() {
        let t = words::<2>(1 << 20).unwrap(); // 16 MiB: 256 rows a page
        assert!(
            t.iter().all(|r| r[0].load(Relaxed) == 0),
            "read: the zero page"
        );
        // At most the first page, which the allocator's own header shares.
        let untouched: usize = written_rows(&t).unwrap().iter().map(|r| r.len()).sum();
        assert!(untouched <= crate::os::page_size() / 16, "{untouched} rows");
        for i in [5usize, 300, 301, 700_000, (1 << 20) - 1] {
            t[i][1].store(9, Relaxed);
        }
        let ranges = written_rows(&t).unwrap();
        for i in [5usize, 300, 301, 700_000, (1 << 20) - 1] {
            assert!(ranges.iter().any(|r| r.contains(&i)), "row {i}: {ranges:?}");
        }
        let rows: usize = ranges.iter().map(|r| r.len()).sum();
        let per_page = crate::os::page_size() / 16;
        assert!(rows <= 6 * per_page, "{rows} rows in {ranges:?}");
        assert!(
            ranges.windows(2).all(|w| w[0].end < w[1].start),
            "{ranges:?}"
        );
        // Given back, a page is not written any more.
        t[700_000][1].store(0, Relaxed);
        let lock = RowLock { word: 0, bit: 1 };
        give_back_zero_pages(&t, 0..t.len(), lock);
        let after = written_rows(&t).unwrap();
        assert!(!after.iter().any(|r| r.contains(&700_000)), "{after:?}");
        assert!(after.iter().any(|r| r.contains(&300)), "{after:?}");
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
