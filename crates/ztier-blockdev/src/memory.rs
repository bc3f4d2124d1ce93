//! A plain RAM disk: pages kept as they are, allocated on first write, freed on discard.
//! No compression: it is what a memory-backed server costs when storing a page is one copy
//! (nbdkit's `memory` plugin with `allocator=sparse` is the same thing), and so the ceiling
//! of any front end serving a compressed device (`ztier serve --store plain`).
//!
//! Invariants: a page is `None` (a hole, reads as zeros) or holds exactly `PAGE` bytes;
//! every access to a page holds that page's lock, so writes to one page land whole and
//! sub-page writes never lose each other. Lock: one page lock at a time, never across
//! anything but the page's own copy.

use std::sync::RwLock;

use ztier_base::pieces::pieces;

use crate::{check_range, BlockDevice, BlockError, Extent, Result};

const PAGE: usize = 4096;

type Page = Option<Box<[u8]>>;

/// A sparse, uncompressed RAM disk.
pub struct MemoryDevice {
    size: u64,
    pages: Vec<RwLock<Page>>,
}

impl MemoryDevice {
    /// A disk of `size` bytes (a whole number of pages), all holes. Fails if even the page
    /// table cannot be allocated.
    pub fn new(size: u64) -> Result<MemoryDevice> {
        if !size.is_multiple_of(PAGE as u64) {
            return Err(BlockError::Invalid(
                format!("size {size} is not a whole number of {PAGE}-byte pages").into(),
            ));
        }
        let count = usize::try_from(size / PAGE as u64)
            .map_err(|_| BlockError::NoMemory(format!("a page table for {size} bytes").into()))?;
        let mut pages = Vec::new();
        pages
            .try_reserve_exact(count)
            .map_err(|_| BlockError::NoMemory(format!("a page table for {size} bytes").into()))?;
        pages.resize_with(count, || RwLock::new(None));
        Ok(MemoryDevice { size, pages })
    }

    /// Bytes of pages held (what a write has allocated and no discard has freed).
    pub fn bytes_held(&self) -> u64 {
        let held = self.pages.iter().filter(|p| read(p).is_some()).count();
        held as u64 * PAGE as u64
    }

    /// Calls `f(page index, offset in page, range of the request)` for each piece of
    /// `offset..offset + len`, in order.
    fn for_pieces(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        check_range(self.size, offset, len)?;
        // In range, so the length fits a usize and every index is below `pages.len()`.
        for p in pieces(offset, len as usize, PAGE) {
            if let Err(e) = f(p.unit as usize, p.in_unit, p.at..p.at + p.len) {
                return Err(partial(p.at as u64, e));
            }
        }
        Ok(())
    }

    /// Zeros the range. Whole pages become holes with `unmap`; without it they stay
    /// allocated, holding zeros (NBD's `NO_HOLE`).
    fn zero(&self, offset: u64, len: u64, unmap: bool) -> Result<()> {
        self.for_pieces(offset, len, |index, in_page, piece| {
            let mut page = write(&self.pages[index]);
            if unmap && piece.len() == PAGE {
                *page = None;
            } else if let Some(bytes) = page.as_mut() {
                bytes[in_page..in_page + piece.len()].fill(0);
            } else if !unmap {
                *page = Some(new_page()?);
            }
            Ok(())
        })
    }
}

fn read(lock: &RwLock<Page>) -> std::sync::RwLockReadGuard<'_, Page> {
    // A page's lock guards plain bytes: a panic elsewhere cannot leave them inconsistent.
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write(lock: &RwLock<Page>) -> std::sync::RwLockWriteGuard<'_, Page> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

fn partial(done: u64, e: BlockError) -> BlockError {
    if done == 0 {
        e
    } else {
        BlockError::Partial {
            done,
            source: Box::new(e),
        }
    }
}

fn new_page() -> Result<Box<[u8]>> {
    let mut v = Vec::new();
    v.try_reserve_exact(PAGE)
        .map_err(|_| BlockError::NoMemory("a page".into()))?;
    v.resize(PAGE, 0);
    Ok(v.into_boxed_slice())
}

impl BlockDevice for MemoryDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        PAGE as u32
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.for_pieces(offset, buf.len() as u64, |index, in_page, piece| {
            let page = read(&self.pages[index]);
            let out = &mut buf[piece];
            match page.as_ref() {
                Some(bytes) => out.copy_from_slice(&bytes[in_page..in_page + out.len()]),
                None => out.fill(0),
            }
            Ok(())
        })
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> Result<()> {
        self.for_pieces(offset, data.len() as u64, |index, in_page, piece| {
            let mut page = write(&self.pages[index]);
            if page.is_none() {
                *page = Some(new_page()?);
            }
            let bytes = page.as_mut().expect("just filled");
            bytes[in_page..in_page + piece.len()].copy_from_slice(&data[piece]);
            Ok(())
        })
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.zero(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        self.zero(offset, len, may_unmap)
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn is_volatile(&self) -> bool {
        true
    }

    fn fast_zeroes(&self) -> bool {
        true
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let mut extents: Vec<Extent> = Vec::new();
        self.for_pieces(offset, len, |index, _, piece| {
            let hole = read(&self.pages[index]).is_none();
            // An allocated page is reported as data even if it holds zeros: finding out
            // would mean scanning it, and "data" is always a truthful answer.
            let len = piece.len() as u64;
            Extent::push_merged(
                &mut extents,
                Extent {
                    len,
                    hole,
                    zero: hole,
                },
            );
            Ok(())
        })?;
        Ok(extents)
    }
}
