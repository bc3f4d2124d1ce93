//! A thin store's free set: one bit an extent, held or free, searched from a cursor so
//! that extents are handed out round the store rather than always from its start.

use super::ThinError;

/// The extents of one store, free or held, as one bit an extent.
pub(super) struct FreeSet {
    /// Bit set: held. Bits past the last extent (in the last word) are set for good, so a
    /// search never offers them.
    pub(super) held: Vec<u64>,
    /// Extents held (not counting those past the end).
    pub(super) held_count: u64,
    /// The word after the last extent taken: where the next search begins, so a search does
    /// not rescan the full words at the front every time.
    pub(super) cursor: usize,
}

impl FreeSet {
    pub(super) fn new(extents: u64) -> std::result::Result<FreeSet, ThinError> {
        let words =
            usize::try_from(extents.div_ceil(64)).map_err(|_| ThinError::NoMemory { extents })?;
        let mut held = Vec::new();
        held.try_reserve_exact(words)
            .map_err(|_| ThinError::NoMemory { extents })?;
        held.resize(words, 0);
        let tail = extents % 64;
        if tail != 0 {
            held[words - 1] = !0u64 << tail;
        }
        Ok(FreeSet {
            held,
            held_count: 0,
            cursor: 0,
        })
    }

    pub(super) fn is_held(&self, extent: u64) -> bool {
        self.held[(extent / 64) as usize] & (1 << (extent % 64)) != 0
    }

    pub(super) fn set(&mut self, extent: u64, held: bool) {
        let word = &mut self.held[(extent / 64) as usize];
        let bit = 1u64 << (extent % 64);
        debug_assert_eq!(*word & bit != 0, !held, "extent {extent} already so");
        if held {
            *word |= bit;
            self.held_count += 1;
        } else {
            *word &= !bit;
            self.held_count -= 1;
        }
    }

    /// Takes a free extent, searching from the cursor round to it.
    pub(super) fn take(&mut self) -> Option<u64> {
        let words = self.held.len();
        for i in 0..words {
            let w = (self.cursor + i) % words;
            let free = !self.held[w];
            if free != 0 {
                let extent = w as u64 * 64 + free.trailing_zeros() as u64;
                self.set(extent, true);
                self.cursor = w;
                return Some(extent);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_set_never_offers_the_tail_and_wraps_round() {
        let mut free = FreeSet::new(70).unwrap();
        let taken: Vec<u64> = std::iter::from_fn(|| free.take()).collect();
        assert_eq!(taken, (0..70).collect::<Vec<_>>());
        assert_eq!(free.held_count, 70);
        free.set(3, false);
        free.set(69, false);
        // The cursor is in the last word: 69 first, then round to 3.
        assert_eq!(free.take(), Some(69));
        assert_eq!(free.take(), Some(3));
        assert_eq!(free.take(), None);
        assert!(FreeSet::new(0).unwrap().take().is_none());
    }
}
