//! A zspage's or block's pages, owned: [`Page`] and [`PageChain`], and every byte access to
//! them.
//!
//! Invariants: a `Page` is the only handle to its memory while it is out of the arena (so
//! `&Page`/`&mut Page` carry Rust's aliasing guarantees over the bytes); a chain's
//! `contiguous_base` is set only by `Arena::alloc_chain` after checking that its pages are
//! consecutive in one chunk; every access checks its range, overflow-checked, before a
//! pointer is formed. Only the arena makes and takes back chains (the fields are the
//! arena's alone). No locks: a chain is reached through its allocator's locks.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use ztier_base::pieces::{pieces, Piece};

/// One pool page, owned: the only handle to its memory while it is out of the arena.
///
/// Owning a `Page` is what makes reading and writing it safe: no other `Page` value points
/// at the same memory (arena invariant), so `&Page` and `&mut Page` carry Rust's usual
/// aliasing guarantees over the bytes.
#[derive(Debug)]
pub(crate) struct Page {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
}

// SAFETY: a Page uniquely owns its memory (arena invariant), like a Box<[u8]>; moving it to
// another thread moves that ownership, and shared references only read.
unsafe impl Send for Page {}
// SAFETY: &Page gives only read access to the bytes (see `bytes`), so sharing is sound.
unsafe impl Sync for Page {}

impl Page {
    /// The page's bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is a mapped, page-aligned range owned by this Page alone
        // (arena invariant); the mapping outlives the Page because chunks are unmapped only
        // when no page is out.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The page's bytes, mutable.
    #[inline]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; &mut self guarantees no other reference to these bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// The pages of one zspage or block, in chain order, owned together.
///
/// When the arena could hand them out as consecutive addresses of one mapping (a fresh
/// chain, carved from a chunk's untouched tail), an object that straddles two of them is
/// read and written in place. Otherwise it is copied piece by piece, as the kernel must
/// always do, its pages being physically scattered. Only the arena makes chains, so
/// `contiguous` is true only when it is.
#[derive(Debug, Default)]
pub(crate) struct PageChain {
    pub(super) pages: Box<[Page]>,
    /// The id of the arena the pages came from (0 for the empty chain).
    pub(super) arena: u64,
    /// Set when pages[i + 1] starts where pages[i] ends, all inside one chunk: the first
    /// page's address, kept here so that an access needs no trip through `pages` (one cache
    /// miss fewer on every object read and write).
    pub(super) contiguous_base: Option<NonNull<u8>>,
    /// Bytes in each page (0 for an empty chain), kept here for the same reason.
    pub(super) page_size: usize,
}

// SAFETY: `contiguous_base` only repeats the address of pages[0], which the chain owns with
// the rest of its pages; the chain is Send and Sync as its Pages are.
unsafe impl Send for PageChain {}
// SAFETY: as for Send: through &PageChain the bytes are only read.
unsafe impl Sync for PageChain {}

impl PageChain {
    /// Pages in the chain (0 once given back).
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Whether objects that straddle pages are reached in place.
    #[cfg(test)]
    pub fn is_contiguous(&self) -> bool {
        self.contiguous_base.is_some()
    }

    fn page_size(&self) -> usize {
        self.page_size
    }

    /// The page-sized pieces of `off..off + len` (one when the range lies in one page).
    fn pieces(&self, off: usize, len: usize) -> impl Iterator<Item = Piece> {
        pieces(off as u64, len, self.page_size())
    }

    /// Panics unless `off..off + len` lies inside the chain. Every access checks this first,
    /// so no arithmetic below can overflow and no page index can run past the chain.
    #[inline]
    pub fn check_range(&self, off: usize, len: usize) {
        // The Box's length lives beside its pointer, so this reads no page descriptor.
        let bytes = self.page_size * self.pages.len();
        let inside = off.checked_add(len).is_some_and(|end| end <= bytes);
        assert!(
            inside,
            "bytes {off}..+{len} are outside the chain of {bytes} bytes"
        );
    }

    /// Where a range that lies in one page does: (page, offset in it). The range is inside
    /// the chain (`check_range`), so `in_page + len` cannot overflow.
    fn within_page(&self, off: usize, len: usize) -> Option<(usize, usize)> {
        let page_size = self.page_size();
        let (p, in_page) = (off / page_size, off % page_size);
        (in_page + len <= page_size).then_some((p, in_page))
    }

    /// Where a contiguous chain's range starts, checked to lie inside the chain.
    #[inline]
    fn contiguous_start(&self, off: usize, len: usize) -> Option<*mut u8> {
        let base = self.contiguous_base?;
        self.check_range(off, len);
        // SAFETY: off + len is inside the chain (checked just above, without overflow), and
        // the chain's pages are consecutive in one mapping (`contiguous_base` is set only by
        // `Arena::alloc_chain`, after checking each page's address).
        Some(unsafe { base.as_ptr().add(off) })
    }

    /// `off..off + len` as one slice, if the chain is contiguous or it lies in one page.
    /// Panics if the range is not inside the chain.
    #[inline]
    fn span(&self, off: usize, len: usize) -> Option<&[u8]> {
        self.check_range(off, len);
        if let Some(start) = self.contiguous_start(off, len) {
            // SAFETY: start..start + len lies in pages this chain alone owns, in one mapping
            // (contiguous_start); &self keeps them from being written meanwhile.
            return Some(unsafe { std::slice::from_raw_parts(start, len) });
        }
        let (p, in_page) = self.within_page(off, len)?;
        Some(&self.pages[p].bytes()[in_page..in_page + len])
    }

    /// As `span`, mutable.
    #[inline]
    fn span_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        self.check_range(off, len);
        if let Some(start) = self.contiguous_start(off, len) {
            // SAFETY: as in `span`; &mut self makes the access exclusive.
            return Some(unsafe { std::slice::from_raw_parts_mut(start, len) });
        }
        let (p, in_page) = self.within_page(off, len)?;
        Some(&mut self.pages[p].bytes_mut()[in_page..in_page + len])
    }

    /// The address of the byte `off` bytes into the chain (0 if it is outside), as a number:
    /// a prefetch hint for a later read of it, never a way to reach the byte.
    pub fn address_hint(&self, off: usize) -> usize {
        let page_size = self.page_size();
        if page_size == 0 {
            return 0;
        }
        if let Some(base) = self.contiguous_base {
            return if off < self.pages.len() * page_size {
                base.as_ptr() as usize + off
            } else {
                0
            };
        }
        self.pages
            .get(off / page_size)
            .map_or(0, |p| p.ptr.as_ptr() as usize + off % page_size)
    }

    /// Copies `out.len()` bytes starting `off` bytes into the chain. Panics if they are not
    /// all inside it.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        if let Some(bytes) = self.span(off, out.len()) {
            out.copy_from_slice(bytes);
            return;
        }
        for Piece {
            unit,
            in_unit,
            at,
            len,
        } in self.pieces(off, out.len())
        {
            out[at..at + len]
                .copy_from_slice(&self.pages[unit as usize].bytes()[in_unit..in_unit + len]);
        }
    }

    /// The little-endian `u64` at `off` (an object header): one load where the 8 bytes lie
    /// in one piece, not a call to `memmove`. Panics if they are
    /// not all inside the chain.
    #[inline]
    pub fn read_u64_le(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        match self.span(off, 8) {
            Some(bytes) => b.copy_from_slice(bytes),
            None => self.read(off, &mut b),
        }
        u64::from_le_bytes(b)
    }

    /// Copies `data` to `off` bytes into the chain. Panics if that is not all inside it.
    pub fn write(&mut self, off: usize, data: &[u8]) {
        if let Some(bytes) = self.span_mut(off, data.len()) {
            bytes.copy_from_slice(data);
            return;
        }
        for Piece {
            unit,
            in_unit,
            at,
            len,
        } in self.pieces(off, data.len())
        {
            self.pages[unit as usize].bytes_mut()[in_unit..in_unit + len]
                .copy_from_slice(&data[at..at + len]);
        }
    }

    /// Whether `with_bytes` shows `off..off + len` in place (no scratch needed).
    pub fn is_in_place(&self, off: usize, len: usize) -> bool {
        self.contiguous_base.is_some() || self.within_page(off, len).is_some()
    }

    /// Calls `f` with the `len` bytes at `off`: in place when they lie in one page or the
    /// chain is contiguous, else copied into `scratch` (which must hold `len` bytes). Panics
    /// if the range is not inside the chain.
    pub fn with_bytes(&self, off: usize, len: usize, scratch: &mut [u8], f: &mut dyn FnMut(&[u8])) {
        match self.span(off, len) {
            Some(bytes) => f(bytes),
            None => {
                self.read(off, &mut scratch[..len]);
                f(&scratch[..len]);
            }
        }
    }
}
