//! The slot table: one entry per disk page, as `struct zram_table_entry`.
//!
//! An entry is two words and its lock is a bit of the second: 16 bytes per page (4 MiB of
//! table per GiB of 4 KiB pages), the kernel's own cost, with no lock word beside it:
//!
//! ```text
//!  handle: u64   pool handle of the object, or the fill word of a ZRAM_SAME page
//!  flags:  u64   63     62 ...      31 30..25 24 23 22 ... 16 15            0
//!               | LOCK | ac_time (32) | free | prio(2) | flags (7) |  object size (16) |
//! ```
//!
//! Slot states (the flags of a locked slot):
//!
//! | state | handle | size | flags |
//! |---|---|---|---|
//! | empty | 0 | 0 | none (IDLE may be set) |
//! | same-filled | the word | 0 | SAME |
//! | compressed | pool handle | compressed length | (IDLE, INCOMPRESSIBLE) |
//! | huge | pool handle | page size | HUGE |
//! | written back | place on the backing store | stored length | WB (HUGE if stored whole) |
//!
//! `ac_time` is the second (since the device was made) the page was last written or read,
//! the kernel's `ac_time` with `CONFIG_ZRAM_TRACK_ENTRY_ACTIME`, kept in the flags word so a
//! slot stays 16 bytes.
//!
//! The lock bit is taken with a compare-and-swap and released with a store; holders keep it
//! for a few loads and stores, or one object copy out of the pool, never across compression.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of `flags` holding the object size.
const SIZE_BITS: u32 = 16;
const SIZE_MASK: u64 = (1 << SIZE_BITS) - 1;
const _: () = assert!(1 << SIZE_BITS > 16384, "a 16 KiB huge page's size must fit");

/// Per-slot flags (`enum zram_pageflags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum SlotFlag {
    /// The page is one machine word repeated; `handle` holds the word.
    Same = 1 << SIZE_BITS,
    /// Written back to the backing device.
    Wb = 1 << (SIZE_BITS + 1),
    /// Being written back.
    UnderWb = 1 << (SIZE_BITS + 2),
    /// Stored raw: compressed length reached huge_class_size.
    Huge = 1 << (SIZE_BITS + 3),
    /// Not accessed since the last `mark_idle`.
    Idle = 1 << (SIZE_BITS + 4),
    /// Recompression found no algorithm that shrinks it.
    Incompressible = 1 << (SIZE_BITS + 5),
    /// Stored by a secondary (recompression) algorithm.
    PpSlot = 1 << (SIZE_BITS + 6),
}

const PRIO_SHIFT: u32 = SIZE_BITS + 7;
const PRIO_MASK: u64 = 0b11 << PRIO_SHIFT;
const AC_TIME_SHIFT: u32 = 31;
const AC_TIME_MASK: u64 = (u32::MAX as u64) << AC_TIME_SHIFT;
const LOCK: u64 = 1 << 63;

/// One slot.
#[derive(Default)]
pub struct Slot {
    /// Written only with the lock held; read under it.
    handle: AtomicU64,
    /// Size, flags and the lock bit.
    flags: AtomicU64,
}

/// A slot's content, as read or written under its lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    pub handle: u64,
    pub flags: u64,
}

impl Entry {
    pub fn size(&self) -> usize {
        (self.flags & SIZE_MASK) as usize
    }
    pub fn has(&self, f: SlotFlag) -> bool {
        self.flags & f as u64 != 0
    }
    pub fn set(&mut self, f: SlotFlag, on: bool) {
        if on {
            self.flags |= f as u64;
        } else {
            self.flags &= !(f as u64);
        }
    }
    pub fn set_size(&mut self, size: usize) {
        self.flags = (self.flags & !SIZE_MASK) | size as u64;
    }
    /// Compression priority (0 = the primary algorithm).
    pub fn priority(&self) -> u32 {
        ((self.flags & PRIO_MASK) >> PRIO_SHIFT) as u32
    }
    pub fn set_priority(&mut self, prio: u32) {
        self.flags = (self.flags & !PRIO_MASK) | ((prio as u64) << PRIO_SHIFT & PRIO_MASK);
    }
    /// Holds data: a pool object, a same-filled word, or a place on the backing store.
    pub fn is_allocated(&self) -> bool {
        self.handle != 0 || self.has(SlotFlag::Same) || self.has(SlotFlag::Wb)
    }
    /// Both entries name the same place on the backing store (written back, same handle).
    pub fn same_place(&self, other: &Entry) -> bool {
        self.has(SlotFlag::Wb) && other.has(SlotFlag::Wb) && self.handle == other.handle
    }
    /// The second the page was last written or read.
    pub fn ac_time(&self) -> u32 {
        ((self.flags & AC_TIME_MASK) >> AC_TIME_SHIFT) as u32
    }
    pub fn set_ac_time(&mut self, secs: u32) {
        self.flags = (self.flags & !AC_TIME_MASK) | (u64::from(secs) << AC_TIME_SHIFT);
    }
}

/// A locked slot; unlocks on drop.
pub struct SlotGuard<'a> {
    slot: &'a Slot,
    pub entry: Entry,
}

impl Slot {
    pub fn lock(&self) -> SlotGuard<'_> {
        let mut spins = 0u32;
        loop {
            let flags = self.flags.load(Ordering::Relaxed);
            if flags & LOCK == 0
                && self
                    .flags
                    .compare_exchange_weak(
                        flags,
                        flags | LOCK,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                return SlotGuard {
                    slot: self,
                    entry: Entry {
                        handle: self.handle.load(Ordering::Relaxed),
                        flags,
                    },
                };
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slot.handle.store(self.entry.handle, Ordering::Relaxed);
        self.slot
            .flags
            .store(self.entry.flags & !LOCK, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_fields_do_not_overlap() {
        let mut e = Entry::default();
        e.set_size(16384);
        e.set(SlotFlag::Huge, true);
        e.set_priority(3);
        e.set(SlotFlag::Idle, true);
        assert_eq!(e.size(), 16384);
        assert!(e.has(SlotFlag::Huge) && e.has(SlotFlag::Idle) && !e.has(SlotFlag::Same));
        assert_eq!(e.priority(), 3);
        e.set(SlotFlag::Idle, false);
        e.set_size(7);
        assert_eq!(
            (e.size(), e.priority(), e.has(SlotFlag::Huge)),
            (7, 3, true)
        );
        assert_eq!(e.flags & LOCK, 0);
    }

    #[test]
    fn lock_excludes_other_threads() {
        let slot = Slot::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let mut g = slot.lock();
                        // A non-atomic read-modify-write of two words: lost updates would show.
                        g.entry.handle += 1;
                        let size = g.entry.size();
                        g.entry.set_size((size + 1) & 0xffff);
                    }
                });
            }
        });
        let g = slot.lock();
        assert_eq!(g.entry.handle, 40_000);
        assert_eq!(g.entry.size(), 40_000 & 0xffff);
    }
}
