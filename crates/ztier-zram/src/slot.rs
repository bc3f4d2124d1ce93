//! The slot table: one entry per disk page, as `struct zram_table_entry`.
//!
//! An entry is two words and its lock is a bit of the second: 16 bytes per page (4 MiB of
//! table per GiB of 4 KiB pages), the kernel's own cost, with no lock word beside it:
//!
//! ```text
//!  handle: u64   pool handle of the object, or the fill word of a ZRAM_SAME page
//!  flags:  u64   63     62 ...      31 30..26    25     24 23 22 ... 16 15            0
//!               | LOCK | ac_time (32) | free | size hi | prio(2) | flags (7) | size (16) |
//! ```
//!
//! Slot states (the flags of a locked slot), decoded at this module's edge into one
//! [`Content`], so no caller reads the raw handle word or tests it against zero:
//!
//! | state | [`Content`] | handle word | size | flags |
//! |---|---|---|---|---|
//! | empty | `Empty` | 0 | 0 | none (IDLE may be set) |
//! | same-filled | `Same(word)` | the word | 0 | SAME |
//! | compressed | `Stored(handle)` | pool handle | compressed length | (IDLE, INCOMPRESSIBLE) |
//! | huge | `Stored(handle)` | pool handle | page size | HUGE |
//! | written back | `WrittenBack(place)` | the place, packed | stored length | WB (HUGE if stored whole) |
//!
//! `ac_time` is the second (since the device was made) the page was last written or read,
//! the kernel's `ac_time` with `CONFIG_ZRAM_TRACK_ENTRY_ACTIME`, kept in the flags word so a
//! slot stays 16 bytes.
//!
//! The lock bit is taken with a compare-and-swap and released with a store; holders keep it
//! for a few loads and stores, or one object's decompression in place, never across
//! compression or a backing store's I/O.

use std::sync::atomic::{AtomicU64, Ordering};

use ztier_base::bits::Field;
use ztier_pool::Handle;

/// The flags word's fields, low to high. An object's size is SIZE, with SIZE_HIGH above it
/// for a 64 KiB compression unit stored whole (a bit that was free: states saved before it
/// read the same).
const SIZE_BITS: u32 = 16;
const SIZE: Field = Field::at(0, SIZE_BITS);
const FLAGS: Field = Field::after(SIZE, 7);
const PRIO: Field = Field::after(FLAGS, 2);
const SIZE_HIGH: Field = Field::after(PRIO, 1);
const AC_TIME: Field = Field::at(31, 32);
const LOCK: u64 = 1 << 63;
const _: () = assert!(SIZE.max() >= 16384, "a 16 KiB huge page's size must fit");
const _: () = assert!(SIZE_HIGH.end() <= AC_TIME.shift() && AC_TIME.end() == 63);
/// The largest size an entry keeps: a 64 KiB unit stored raw.
const SIZE_MAX: u64 = (SIZE_HIGH.max() << SIZE_BITS) | SIZE.max();
const _: () = assert!(SIZE_MAX >= 65536);

/// Per-slot flags (`enum zram_pageflags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum SlotFlag {
    /// The page is one machine word repeated.
    Same = 1 << FLAGS.shift(),
    /// Written back to the backing device.
    Wb = 1 << (FLAGS.shift() + 1),
    /// Being written back.
    UnderWb = 1 << (FLAGS.shift() + 2),
    /// Stored raw: compressed length reached huge_class_size.
    Huge = 1 << (FLAGS.shift() + 3),
    /// Not accessed since the last `mark_idle`.
    Idle = 1 << (FLAGS.shift() + 4),
    /// Recompression found no algorithm that shrinks it.
    Incompressible = 1 << (FLAGS.shift() + 5),
    /// Stored by a secondary (recompression) algorithm.
    PpSlot = 1 << (FLAGS.shift() + 6),
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Content {
    Empty,
    /// Every machine word of the page is this one.
    Same(u64),
    /// An object in the pool, of the entry's size.
    Stored(Handle),
    /// On the backing store, the entry's size from this place.
    WrittenBack(Place),
}

/// A place's fields in a written-back slot's handle word: the byte in the block or
/// segment, then its first slot.
const PLACE_AT: Field = Field::at(0, 16);
const PLACE_FIRST: Field = Field::after(PLACE_AT, 48);

/// The largest byte a place may name in its block or segment.
pub(crate) const PLACE_AT_MAX: u64 = PLACE_AT.max();

/// Where a written-back page is on the store: the first slot of its block or segment, and
/// the byte in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    first: u64,
    at: usize,
}

impl Place {
    pub(crate) fn new(first: u64, at: usize) -> Place {
        Place { first, at }
    }
    /// The place packed into a slot's handle word.
    pub(crate) fn raw(self) -> u64 {
        PLACE_FIRST.put(self.first) | PLACE_AT.put(self.at as u64)
    }
    /// The first slot of its block or segment.
    pub(crate) fn first(self) -> u64 {
        self.first
    }
    /// The byte it starts at in its block or segment.
    pub(crate) fn at(self) -> usize {
        self.at
    }
    pub(crate) fn from_raw(raw: u64) -> Place {
        Place {
            first: PLACE_FIRST.get(raw),
            at: PLACE_AT.get(raw) as usize,
        }
    }
}

/// Which pages a writeback or a recompression takes, by their slots' state: the words of the
/// kernel's `writeback` file and `recompress type=`, and the policy's age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageSelector {
    Idle,
    Huge,
    HugeIdle,
    /// Writeback only: pages recompression found no algorithm to shrink.
    Incompressible,
    /// Every page held in the pool.
    All,
    /// Pages not read or written for this many seconds (the policy's, by `ac_time`,
    /// whatever the idle marks say).
    OlderThan(u32),
}

impl PageSelector {
    /// Whether the page of entry `e` is selected, `now` seconds into the device's life.
    pub(crate) fn selects(self, e: &Entry, now: u32) -> bool {
        let (huge, idle) = (e.has(SlotFlag::Huge), e.has(SlotFlag::Idle));
        match self {
            PageSelector::Idle => idle,
            PageSelector::Huge => huge,
            PageSelector::HugeIdle => huge && idle,
            PageSelector::Incompressible => e.has(SlotFlag::Incompressible),
            PageSelector::All => true,
            PageSelector::OlderThan(age) => now.saturating_sub(e.ac_time()) >= age,
        }
    }
}

/// A word `PageSelector` does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?}: pages are selected by idle, huge, huge_idle, incompressible (writeback only) or all"
)]
pub struct BadSelector(pub String);

impl std::str::FromStr for PageSelector {
    type Err = BadSelector;
    fn from_str(s: &str) -> std::result::Result<PageSelector, BadSelector> {
        match s {
            "idle" => Ok(PageSelector::Idle),
            "huge" => Ok(PageSelector::Huge),
            "huge_idle" => Ok(PageSelector::HugeIdle),
            "incompressible" => Ok(PageSelector::Incompressible),
            "all" => Ok(PageSelector::All),
            _ => Err(BadSelector(s.to_string())),
        }
    }
}

/// One slot: the handle word (written only with the lock held; read under it), then the
/// flags word (size, flags and the lock bit). All zeros is an empty, unlocked slot, so the
/// table is made zeroed by the OS and costs memory only where pages arrive
/// (`ztier_base::zeroed`).
pub(crate) type Slot = [AtomicU64; 2];
const HANDLE_WORD: usize = 0;
const FLAGS_WORD: usize = 1;

/// A slot's lock as the table's give-back takes it (`ztier_base::zeroed`).
pub(crate) const ROW_LOCK: ztier_base::zeroed::RowLock = ztier_base::zeroed::RowLock {
    word: FLAGS_WORD,
    bit: LOCK,
};

/// What a slot does: its lock, and a look that takes none.
pub(crate) trait SlotOps {
    /// Locks the slot; its entry is read under the lock, and written back when the guard
    /// drops.
    fn lock(&self) -> SlotGuard<'_>;
    /// Whether the slot holds nothing and no flag (and is not locked), read without its lock:
    /// scans over the whole table (marking idle, a reset, a save) pass such slots by without
    /// writing to them, so the parts of the table never written stay unwritten. A slot being
    /// filled meanwhile is seen as it was a moment before, as any look without the lock.
    fn is_vacant(&self) -> bool;
}

/// A slot's state, as read or written under its lock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Entry {
    /// The handle word: a pool handle, a same-filled word or a place, as the flags say.
    handle: u64,
    flags: u64,
}

impl Entry {
    /// Bytes the page takes where it is (0 for empty and same-filled pages).
    pub fn size(&self) -> usize {
        (SIZE_HIGH.get(self.flags) << SIZE_BITS | SIZE.get(self.flags)) as usize
    }
    pub fn has(&self, f: SlotFlag) -> bool {
        self.flags & f as u64 != 0
    }
    /// Compression priority (0 = the primary algorithm).
    pub fn priority(&self) -> u32 {
        PRIO.get(self.flags) as u32
    }
    /// Holds data: a pool object, a same-filled word, or a place on the backing store.
    pub fn is_allocated(&self) -> bool {
        self.content() != Content::Empty
    }
    /// The second the page was last written or read.
    pub fn ac_time(&self) -> u32 {
        AC_TIME.get(self.flags) as u32
    }

    /// What the slot holds.
    pub(crate) fn content(&self) -> Content {
        if self.has(SlotFlag::Wb) {
            Content::WrittenBack(Place::from_raw(self.handle))
        } else if self.has(SlotFlag::Same) {
            Content::Same(self.handle)
        } else {
            Handle::from_raw(self.handle).map_or(Content::Empty, Content::Stored)
        }
    }
    /// Both entries hold the same thing: the same object, word or place (an object or place
    /// freed and handed out again in between is ruled out by whoever compares: a slot lock,
    /// a page lock or a pin held across).
    pub(crate) fn holds_same(&self, other: &Entry) -> bool {
        self.content() == other.content()
    }
    /// Both entries name the same place on the backing store.
    pub(crate) fn same_place(&self, other: &Entry) -> bool {
        matches!(self.content(), Content::WrittenBack(_)) && self.holds_same(other)
    }

    /// The flags a saved state keeps: size, priority and the page's own flags (idle, huge,
    /// incompressible, secondary); where the page lives is the record's, not these bits'.
    pub(crate) fn saved_flags(&self) -> u64 {
        let kept = SlotFlag::Huge as u64
            | SlotFlag::Idle as u64
            | SlotFlag::Incompressible as u64
            | SlotFlag::PpSlot as u64;
        let size = SIZE.max() << SIZE.shift() | SIZE_HIGH.max() << SIZE_HIGH.shift();
        self.flags & (size | PRIO.max() << PRIO.shift() | kept)
    }
    /// An entry with a saved state's flags (unknown bits dropped), holding nothing yet.
    pub(crate) fn from_saved_flags(flags: u64) -> Entry {
        Entry {
            handle: 0,
            flags: Entry { handle: 0, flags }.saved_flags(),
        }
    }
    /// A same-filled page of `word` (its other state left as it was: the caller frees first).
    pub(crate) fn set_same(&mut self, word: u64) {
        self.handle = word;
        self.set(SlotFlag::Same, true);
    }
    /// A pool object of `size` bytes.
    pub(crate) fn set_stored(&mut self, handle: Handle, size: usize) {
        self.handle = handle.raw();
        self.set_size(size);
    }
    /// A page written back to `place`, taking `size` bytes there.
    pub(crate) fn set_written_back(&mut self, place: Place, size: usize) {
        self.handle = place.raw();
        self.set(SlotFlag::Wb, true);
        self.set_size(size);
    }
    pub(crate) fn set(&mut self, f: SlotFlag, on: bool) {
        if on {
            self.flags |= f as u64;
        } else {
            self.flags &= !(f as u64);
        }
    }
    pub(crate) fn set_size(&mut self, size: usize) {
        let size = (size as u64).min(SIZE_MAX);
        self.flags = SIZE.set(self.flags, size & SIZE.max());
        self.flags = SIZE_HIGH.set(self.flags, size >> SIZE_BITS);
    }
    pub(crate) fn set_priority(&mut self, prio: u32) {
        self.flags = PRIO.set(self.flags, u64::from(prio) & PRIO.max());
    }
    pub(crate) fn set_ac_time(&mut self, secs: u32) {
        self.flags = AC_TIME.set(self.flags, u64::from(secs));
    }
}

/// A locked slot; unlocks on drop.
pub(crate) struct SlotGuard<'a> {
    slot: &'a Slot,
    pub(crate) entry: Entry,
}

impl SlotOps for Slot {
    fn lock(&self) -> SlotGuard<'_> {
        let flags_word = &self[FLAGS_WORD];
        let mut spins = 0u32;
        loop {
            let flags = flags_word.load(Ordering::Relaxed);
            if flags & LOCK == 0
                && flags_word
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
                        handle: self[HANDLE_WORD].load(Ordering::Relaxed),
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

    fn is_vacant(&self) -> bool {
        self[FLAGS_WORD].load(Ordering::Acquire) == 0
            && self[HANDLE_WORD].load(Ordering::Relaxed) == 0
    }
}

/// Slots a walk over the table looks at: a window of this many at a time is asked of the
/// OS which of its table pages were ever written (512 table pages, 2 MiB).
const WALK_WINDOW: u64 = 1 << 17;

/// A walk, in index order, over the slots of a range that may hold a page: those on the
/// table's pages ever written (`zeroed::written_rows`). Every other slot is empty, and a
/// look at it would bring its page of the table in (the zero page, read): 65,536 faults
/// and 256 MiB of mappings for one pass over a 64 GiB disk with a few pages, on every
/// pass a policy makes. The OS is asked a window at a time, just before the walk reaches
/// it, so a page written while the walk runs is seen or not as by a look slot by slot. A
/// walk where the OS would not say looks at every slot.
pub(crate) struct WrittenSlots<'a> {
    slots: &'a [Slot],
    end: u64,
    /// The written slots of the last window asked, in order, and where that window ended.
    rows: std::collections::VecDeque<std::ops::Range<u64>>,
    asked_to: u64,
    /// Where the iterator goes on from.
    next: u64,
}

impl<'a> WrittenSlots<'a> {
    pub(crate) fn new(slots: &'a [Slot], range: std::ops::Range<u64>) -> Self {
        let end = range.end.min(slots.len() as u64);
        WrittenSlots {
            slots,
            end,
            rows: Default::default(),
            asked_to: range.start,
            next: range.start,
        }
    }

    /// The first slot at or after `from` whose table page was ever written; `None` past
    /// the range's end.
    pub(crate) fn seek(&mut self, from: u64) -> Option<u64> {
        loop {
            while let Some(rows) = self.rows.front() {
                if rows.end <= from {
                    self.rows.pop_front();
                    continue;
                }
                return Some(from.max(rows.start)).filter(|&i| i < self.end);
            }
            let start = self.asked_to.max(from);
            if start >= self.end {
                return None;
            }
            let window = start..(start + WALK_WINDOW).min(self.end);
            let slots = &self.slots[window.start as usize..window.end as usize];
            match ztier_base::zeroed::written_rows(slots) {
                Some(written) => self.rows.extend(
                    written
                        .into_iter()
                        .map(|r| window.start + r.start as u64..window.start + r.end as u64),
                ),
                None => self.rows.push_back(window.clone()),
            }
            self.asked_to = window.end;
        }
    }
}

impl Iterator for WrittenSlots<'_> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        let index = self.seek(self.next)?;
        self.next = index + 1;
        Some(index)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slot[HANDLE_WORD].store(self.entry.handle, Ordering::Relaxed);
        self.slot[FLAGS_WORD].store(self.entry.flags & !LOCK, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk finds every written slot, in order, and nothing off the written table pages;
    /// `seek` goes forward from where it is asked.
    #[test]
    fn a_walk_sees_the_written_table_pages_alone() {
        let slots = ztier_base::zeroed::words::<2>(3 * WALK_WINDOW as usize).unwrap();
        let per_page = (ztier_base::os::page_size() / std::mem::size_of::<Slot>()) as u64;
        let written = [5, WALK_WINDOW - 1, WALK_WINDOW, 3 * WALK_WINDOW - 2];
        for &i in &written {
            slots[i as usize][HANDLE_WORD].store(1, Ordering::Relaxed);
        }
        let seen: Vec<u64> = WrittenSlots::new(&slots, 0..3 * WALK_WINDOW).collect();
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order");
        for i in written {
            assert!(seen.contains(&i), "slot {i} written, not seen");
        }
        // Three table pages (the two around the window's edge are neighbours).
        assert!(
            seen.len() as u64 <= 4 * per_page,
            "{} slots seen",
            seen.len()
        );
        let mut walk = WrittenSlots::new(&slots, 6..WALK_WINDOW);
        assert_eq!(walk.seek(6), Some(6), "on the first written page");
        assert_eq!(walk.seek(per_page), Some(WALK_WINDOW - per_page));
        assert_eq!(walk.seek(WALK_WINDOW - 1), Some(WALK_WINDOW - 1));
        assert_eq!(walk.seek(WALK_WINDOW), None, "the range's end");
        let mut tail = WrittenSlots::new(&slots, WALK_WINDOW + per_page..3 * WALK_WINDOW);
        assert_eq!(tail.next(), Some(3 * WALK_WINDOW - per_page));
    }

    #[test]
    fn entry_fields_do_not_overlap() {
        let mut e = Entry::default();
        e.set_size(16384);
        e.set(SlotFlag::Huge, true);
        e.set_priority(3);
        e.set(SlotFlag::Idle, true);
        e.set_ac_time(u32::MAX);
        assert_eq!(e.size(), 16384);
        assert!(e.has(SlotFlag::Huge) && e.has(SlotFlag::Idle) && !e.has(SlotFlag::Same));
        assert_eq!((e.priority(), e.ac_time()), (3, u32::MAX));
        e.set(SlotFlag::Idle, false);
        e.set_size(7);
        assert_eq!(
            (e.size(), e.priority(), e.has(SlotFlag::Huge), e.ac_time()),
            (7, 3, true, u32::MAX)
        );
        assert_eq!(e.flags & LOCK, 0);
    }

    #[test]
    fn a_64k_units_size_fits_beside_the_flags() {
        let mut e = Entry::default();
        e.set_priority(3);
        e.set(SlotFlag::PpSlot, true);
        e.set_size(65536);
        assert_eq!(
            (e.size(), e.priority(), e.has(SlotFlag::PpSlot)),
            (65536, 3, true)
        );
        e.set_size(4096);
        assert_eq!((e.size(), e.priority()), (4096, 3));
    }

    #[test]
    fn contents_decode_as_they_were_set() {
        assert_eq!(Entry::default().content(), Content::Empty);
        let mut e = Entry::default();
        e.set_same(0);
        assert_eq!(e.content(), Content::Same(0));
        assert!(e.is_allocated(), "a page of zeros is held");
        let handle = Handle::from_raw(0x1234_5679).unwrap();
        let mut e = Entry::default();
        e.set_stored(handle, 100);
        assert_eq!((e.content(), e.size()), (Content::Stored(handle), 100));
        let place = Place::new(77, 4000);
        let mut w = Entry::default();
        w.set_written_back(place, 300);
        assert_eq!((w.content(), w.size()), (Content::WrittenBack(place), 300));
        assert!(w.same_place(&w) && !e.same_place(&e) && !w.holds_same(&e));
    }

    #[test]
    fn lock_excludes_other_threads() {
        let slot: Slot = Default::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..10_000 {
                        let mut g = slot.lock();
                        // A non-atomic read-modify-write of two words: lost updates would show.
                        let Content::Same(n) = g.entry.content() else {
                            g.entry.set_same(1);
                            g.entry.set_size(1);
                            continue;
                        };
                        g.entry.set_same(n + 1);
                        let size = g.entry.size();
                        g.entry.set_size((size + 1) & 0xffff);
                    }
                });
            }
        });
        let g = slot.lock();
        assert_eq!(g.entry.content(), Content::Same(40_000));
        assert_eq!(g.entry.size(), 40_000 & 0xffff);
    }
}
