//! A region page's state: where its content is ([`Kind`], lib.rs's table), and what the
//! clock and the clean-page tracking know of it. Each page's is a byte of the state table
//! ([`PageStates`]), decoded here and nowhere else, so no caller sees a bit:
//!
//! ```text
//!   7            6       5        4 3   2    0
//!  | REFERENCED | CLEAN | ZEROED | 0 0 | kind |
//!     Resident    Resident  Empty          Empty 0, Resident 1, Stored 2, Held 3,
//!                                          Gone 4, Unmapped 5
//! ```
//!
//! A flag is only ever set with its kind, so a state is one of: empty (zeroed or not),
//! resident (referenced or not, clean or not), stored, held, gone, unmapped. The all-zero
//! byte is [`PageState::EMPTY`]: the table comes zeroed from the OS and is written only
//! where pages are.
//!
//! Invariants: a page's state changes only under its page lock (`Shared::locks`), except the
//! clock's clearing of [`referenced`](PageState::referenced), one atomic bit operation that
//! leaves any state set meanwhile as it was but for that bit; a page leaves the region
//! ([`Kind::Gone`], [`Kind::Unmapped`]) only while the fault thread holds `gate` (write),
//! as it handles the program's unmap or remap (lib.rs: no move sees an address whose unmap
//! it has not seen; a fault on an unmapped page whose copy fails puts it back as it was,
//! under the lock it held throughout). No locks of its own.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

/// Where a page's content is (lib.rs's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nowhere: never written, dropped by the program, or found all zeros by an evictor
    /// ([`PageState::zeroed`]); a fault maps zeros.
    Empty,
    /// Present in the region (maybe the zero page).
    Resident,
    /// Out, its content in zram page `i`.
    Stored,
    /// Out, its content whole in the heap (the store refused it).
    Held,
    /// A page of the program's own that its `mremap` moved onto the region.
    Gone,
    /// Unmapped or moved away by the program.
    Unmapped,
}

const KIND_BITS: u8 = 0x7;
const EMPTY: u8 = 0;
const RESIDENT: u8 = 1;
const STORED: u8 = 2;
const HELD: u8 = 3;
const GONE: u8 = 4;
const UNMAPPED: u8 = 5;
/// With `RESIDENT`: faulted in since the clock last passed.
const REFERENCED: u8 = 0x80;
/// With `RESIDENT`: read in from the store and not written since.
const CLEAN: u8 = 0x40;
/// With `EMPTY`: out because an evictor found it all zeros.
const ZEROED: u8 = 0x20;
const _: () = assert!(UNMAPPED <= KIND_BITS && (REFERENCED | CLEAN | ZEROED) & KIND_BITS == 0);

/// A page's state, decoded from its byte in the table.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageState(u8);

impl PageState {
    /// Never written, or dropped by the program: a fault maps zeros, and is no refault.
    pub(crate) const EMPTY: PageState = PageState(EMPTY);
    /// Empty because an evictor found the page all zeros: the fault that brings it back
    /// maps zeros and is a refault.
    pub(crate) const ZEROED: PageState = PageState(EMPTY | ZEROED);
    pub(crate) const STORED: PageState = PageState(STORED);
    pub(crate) const HELD: PageState = PageState(HELD);
    pub(crate) const GONE: PageState = PageState(GONE);
    pub(crate) const UNMAPPED: PageState = PageState(UNMAPPED);

    /// Present in the region. `referenced`: faulted in since the clock last passed (the
    /// clock clears it once before it evicts the page: a second chance); `clean`: read in
    /// from the store and not written since, write-protected, its copy still in zram page
    /// `i` (lib.rs, "Clean pages").
    pub(crate) const fn resident(referenced: bool, clean: bool) -> PageState {
        let referenced = if referenced { REFERENCED } else { 0 };
        let clean = if clean { CLEAN } else { 0 };
        PageState(RESIDENT | referenced | clean)
    }

    #[inline]
    pub(crate) fn kind(self) -> Kind {
        match self.0 & KIND_BITS {
            EMPTY => Kind::Empty,
            RESIDENT => Kind::Resident,
            STORED => Kind::Stored,
            HELD => Kind::Held,
            GONE => Kind::Gone,
            // Nothing else is ever encoded.
            _ => Kind::Unmapped,
        }
    }

    /// Whether the page is of `kind`.
    #[inline]
    pub(crate) fn is(self, kind: Kind) -> bool {
        self.kind() == kind
    }

    /// Resident and faulted in since the clock last passed.
    #[inline]
    pub(crate) fn referenced(self) -> bool {
        self.0 & REFERENCED != 0
    }

    /// Resident, and its copy in the store is its content.
    #[inline]
    pub(crate) fn clean(self) -> bool {
        self.0 & CLEAN != 0
    }

    /// Empty because an evictor found it all zeros.
    #[inline]
    pub(crate) fn zeroed(self) -> bool {
        self.0 & ZEROED != 0
    }

    /// Resident and not referenced: what the clock evicts.
    #[inline]
    pub(crate) fn cold(self) -> bool {
        self.0 & (KIND_BITS | REFERENCED) == RESIDENT
    }

    /// Whether zram page `i` holds a copy of it: stored, or resident and clean.
    #[inline]
    pub(crate) fn has_copy(self) -> bool {
        self.is(Kind::Stored) || self.clean()
    }

    /// Whether the page is still the region's: not unmapped or moved away by the program,
    /// nor a page of the program's own moved onto it.
    pub(crate) fn still_the_regions(self) -> bool {
        !matches!(self.kind(), Kind::Gone | Kind::Unmapped)
    }

    /// The same state, not clean (the program wrote the page, or its copy went).
    pub(crate) fn dirtied(self) -> PageState {
        PageState(self.0 & !CLEAN)
    }
}

impl std::fmt::Debug for PageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind())?;
        for (set, flag) in [
            (self.referenced(), "referenced"),
            (self.clean(), "clean"),
            (self.zeroed(), "zeroed"),
        ] {
            if set {
                write!(f, "+{flag}")?;
            }
        }
        Ok(())
    }
}

/// The state table: a byte a page, atomic so that the clock may read states and clear the
/// referenced bit with no lock (every other change is made under the page's lock).
pub(crate) struct PageStates(ztier_base::zeroed::Table<AtomicU8>);

impl PageStates {
    /// A table of `pages` states, every one [`PageState::EMPTY`]: zeroed by the OS and
    /// untouched, so memory is taken only where pages are. `None` if it cannot be had.
    pub(crate) fn new(pages: u64) -> Option<PageStates> {
        let pages = usize::try_from(pages).ok()?;
        ztier_base::zeroed::bytes(pages).map(PageStates)
    }

    #[inline]
    pub(crate) fn get(&self, page: u64) -> PageState {
        PageState(self.0[page as usize].load(Relaxed))
    }

    /// Sets page `page`'s state; the caller holds its lock.
    #[inline]
    pub(crate) fn set(&self, page: u64, state: PageState) {
        self.0[page as usize].store(state.0, Relaxed);
    }

    /// The clock's pass over a referenced page: its bit goes, and only it (a state set
    /// meanwhile under the page's lock keeps the rest of its own).
    #[inline]
    pub(crate) fn clear_referenced(&self, page: u64) {
        self.0[page as usize].fetch_and(!REFERENCED, Relaxed);
    }

    /// A resident page the kernel would not move out (its lock held): a second chance
    /// before the next try.
    pub(crate) fn mark_referenced(&self, page: u64) {
        self.0[page as usize].fetch_or(REFERENCED, Relaxed);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every state there is: each kind, with each flag it may carry.
    pub(crate) fn every_state() -> Vec<PageState> {
        let mut all = vec![
            PageState::EMPTY,
            PageState::ZEROED,
            PageState::STORED,
            PageState::HELD,
            PageState::GONE,
            PageState::UNMAPPED,
        ];
        for referenced in [false, true] {
            for clean in [false, true] {
                all.push(PageState::resident(referenced, clean));
            }
        }
        all
    }

    #[test]
    fn each_state_decodes_to_its_kind_and_carries_only_its_own_flags() {
        let all = every_state();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b, "two states share a byte");
            }
            let resident = a.is(Kind::Resident);
            assert!(resident || !(a.referenced() || a.clean()), "{a:?}");
            assert!(a.is(Kind::Empty) || !a.zeroed(), "{a:?}");
            assert_eq!(a.cold(), resident && !a.referenced(), "{a:?}");
            assert_eq!(a.has_copy(), a.is(Kind::Stored) || a.clean(), "{a:?}");
            assert_eq!(
                a.still_the_regions(),
                !a.is(Kind::Gone) && !a.is(Kind::Unmapped)
            );
            assert_eq!(a.dirtied().kind(), a.kind());
            assert!(!a.dirtied().clean());
            assert_eq!(a.dirtied().referenced(), a.referenced());
        }
        assert_eq!(PageState::ZEROED.kind(), Kind::Empty);
        assert!(PageState::ZEROED.zeroed() && !PageState::EMPTY.zeroed());
    }

    #[test]
    fn the_table_starts_empty_and_the_clock_clears_only_its_bit() {
        let table = PageStates::new(4).unwrap();
        assert!((0..4).all(|p| table.get(p) == PageState::EMPTY));
        table.set(1, PageState::resident(true, true));
        table.clear_referenced(1);
        assert_eq!(table.get(1), PageState::resident(false, true));
        table.mark_referenced(1);
        assert_eq!(table.get(1), PageState::resident(true, true));
        // A page the clock passes that changed meanwhile keeps its new state.
        table.set(2, PageState::STORED);
        table.clear_referenced(2);
        assert_eq!(table.get(2), PageState::STORED);
    }
}
