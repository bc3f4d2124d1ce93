//! Byte-granular I/O (the kernel's partial-page path, `is_partial_io`): reads and writes at
//! any offset and length; a page (or unit) written in part is read, patched and rewritten
//! under its page lock, so concurrent writes to other bytes of it are kept.
//!
//! Invariants: a range is checked against the disk's size before any page is touched; a
//! write that fails part way has stored the pages before the failing one and left that one
//! and the rest as they were.

use crate::slot::SlotOps;
use crate::{Counter, Device, Result, SlotFlag, ZramError};
use ztier_base::pieces::pieces;

impl Device {
    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.disksize()) {
            return Err(ZramError::OutOfRange {
                offset,
                len,
                disksize: self.disksize(),
            });
        }
        Ok(())
    }

    /// Writes bytes at any offset; pages written in part are read, patched and rewritten
    /// under the page's lock, so concurrent writes to other bytes of the page are kept. A
    /// write that fails part way ([`ZramError::PartialWrite`]) has stored the pages before
    /// the failing one, and left that one and the rest as they were.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        let mut scratch = vec![0; self.unit_size];
        for s in pieces(offset, data.len(), self.unit_size) {
            let part = &data[s.at..s.at + s.len];
            let r = if s.len == self.unit_size {
                let _page = self.page_lock(s.unit);
                self.write_page_locked(s.unit, part)
            } else {
                self.patch_page(s.unit, s.in_unit, part, &mut scratch)
            };
            if let Err(e) = r {
                return Err(if s.at == 0 {
                    e
                } else {
                    ZramError::PartialWrite {
                        offset,
                        len: data.len(),
                        stored: s.at,
                        source: Box::new(e),
                    }
                });
            }
        }
        Ok(())
    }

    /// Writes `part` at byte `in_page` of page `index`: read, patched and written under the
    /// page's lock, so a concurrent change to other bytes of the page is kept. A page on the
    /// backing store is read before the lock is taken (a slow store then holds no stripe) and
    /// patched only if the slot still names the place read, else read again.
    pub(crate) fn patch_page(
        &self,
        index: u64,
        in_page: usize,
        part: &[u8],
        scratch: &mut [u8],
    ) -> Result<()> {
        loop {
            let written_back = self.slot(index)?.lock().entry.has(SlotFlag::Wb);
            let pinned = if written_back {
                self.read_page_pinned(index, scratch)?
            } else {
                None
            };
            let _page = self.page_lock(index);
            match pinned {
                Some((read, _pin)) => {
                    if !self.slot(index)?.lock().entry.same_place(&read) {
                        continue; // rewritten or discarded since it was read
                    }
                }
                // In memory: read under the lock, as any other change would be.
                None => {
                    let mut shard = self.shard();
                    if self.read_page_inner(&mut shard, index, scratch)?.is_some() {
                        // Written back between the look and the lock (a writeback's commit
                        // takes no page lock): read it from the store with the lock dropped.
                        continue;
                    }
                }
            }
            scratch[in_page..in_page + part.len()].copy_from_slice(part);
            return self.write_page_locked(index, scratch);
        }
    }

    /// Reads bytes at any offset.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let us = self.unit_size as u64;
        self.prefetch_segments(offset / us..(offset + out.len() as u64).div_ceil(us));
        let mut scratch = Vec::new();
        for s in pieces(offset, out.len(), self.unit_size) {
            let part = &mut out[s.at..s.at + s.len];
            if s.len == self.unit_size {
                self.read_unit(s.unit, part)?;
            } else if self.unit_size != self.page_size {
                let r = self.read_unit_part(s.unit, s.in_unit, part);
                if r.is_err() {
                    self.shard().counters.add(Counter::FailedReads, 1);
                }
                r?;
            } else {
                scratch.resize(self.unit_size, 0);
                self.read_unit(s.unit, &mut scratch)?;
                part.copy_from_slice(&scratch[s.in_unit..s.in_unit + s.len]);
            }
        }
        Ok(())
    }
}
