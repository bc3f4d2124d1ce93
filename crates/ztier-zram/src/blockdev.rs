//! zram as a [`BlockDevice`]: what a front end (the NBD server) serves.
//!
//! - reads and writes at any offset; sub-page writes are read-modify-writes under the
//!   page's lock ([`Device::write_bytes`]); FUA and flush have nothing to do (RAM);
//! - discard frees whole pages, leaving partial pages at the ends as they are, as the
//!   kernel's zram does;
//! - write_zeroes: whole pages are discarded (`may_unmap`, reading back as zeros) or stored
//!   as same-filled zero pages; partial pages get zeros written into them;
//! - block status: a slot never written or discarded is a hole; a same-filled page of zero
//!   words is zero but stored; everything else is data.

use ztier_blockdev::{check_range, BlockDevice, BlockError, Extent};
use ztier_pool::PoolError;

use crate::slot::Content;
use crate::{Device, ZramError};

impl From<ZramError> for BlockError {
    fn from(e: ZramError) -> BlockError {
        match e {
            ZramError::OutOfRange {
                offset,
                len,
                disksize,
            } => BlockError::OutOfRange {
                offset,
                len: len as u64,
                size: disksize,
            },
            ZramError::BadIndex { .. } | ZramError::BadLength { .. } => {
                BlockError::Invalid(Box::new(e))
            }
            ZramError::MemLimit { .. } | ZramError::GroupLimit { .. } => {
                BlockError::NoSpace(Box::new(e))
            }
            ZramError::Pool(PoolError::OutOfMemory { .. } | PoolError::HandleSpaceFull { .. }) => {
                BlockError::NoMemory(Box::new(e))
            }
            ZramError::PartialWrite { stored, source, .. } => BlockError::Partial {
                done: stored as u64,
                source: Box::new(BlockError::from(*source)),
            },
            other => BlockError::Io(std::io::Error::other(other)),
        }
    }
}

impl Device {
    /// Zeros over whole pages `first..end`: discarded if `unmap`, else stored as zero pages.
    fn zero_pages(&self, first: u64, end: u64, unmap: bool) -> Result<(), BlockError> {
        if unmap {
            let ps = self.page_size() as u64;
            self.discard(first * ps, (end - first) * ps)?;
            return Ok(());
        }
        let zeros = vec![0u8; self.page_size()];
        for index in first..end {
            self.write_page(index, &zeros).map_err(|e| {
                let done = (index - first) * self.page_size() as u64;
                match (done, BlockError::from(e)) {
                    (0, e) => e,
                    (done, e) => BlockError::Partial {
                        done,
                        source: Box::new(e),
                    },
                }
            })?;
        }
        Ok(())
    }
}

impl BlockDevice for Device {
    fn size(&self) -> u64 {
        self.disksize()
    }

    fn block_size(&self) -> u32 {
        self.page_size() as u32
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        Ok(self.read_bytes(offset, buf)?)
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), BlockError> {
        Ok(self.write_bytes(offset, data)?)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        Device::discard(self, offset, len)?;
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<(), BlockError> {
        check_range(self.disksize(), offset, len)?;
        let ps = self.page_size() as u64;
        let end = offset + len;
        let (first_whole, end_whole) = (offset.div_ceil(ps), end / ps);
        if first_whole >= end_whole {
            // Within one page, or across one boundary without a whole page.
            let zeros = vec![0u8; len as usize];
            return Ok(self.write_bytes(offset, &zeros)?);
        }
        let head = first_whole * ps - offset;
        if head > 0 {
            self.write_bytes(offset, &vec![0u8; head as usize])?;
        }
        self.zero_pages(first_whole, end_whole, may_unmap)
            .map_err(|e| match (head, e) {
                (0, e) => e,
                (head, BlockError::Partial { done, source }) => BlockError::Partial {
                    done: head + done,
                    source,
                },
                (head, e) => BlockError::Partial {
                    done: head,
                    source: Box::new(e),
                },
            })?;
        let tail = end - end_whole * ps;
        if tail > 0 {
            self.write_bytes(end_whole * ps, &vec![0u8; tail as usize])
                .map_err(|e| BlockError::Partial {
                    done: len - tail,
                    source: Box::new(e.into()),
                })?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn is_volatile(&self) -> bool {
        true
    }

    /// Whole pages are discarded or recorded as zero pages; partial pages are a page's
    /// read-modify-write at most.
    fn fast_zeroes(&self) -> bool {
        true
    }

    /// Extents by slot state, merged; at most one call's worth of pages is looked at per
    /// 64 Ki pages so a huge request cannot hold the caller long.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, BlockError> {
        check_range(self.disksize(), offset, len)?;
        // By slot: a page, or the device's compression unit.
        let ps = self.unit_size() as u64;
        let end = offset + len.min(ps * 65536);
        let mut extents: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end {
            let index = at / ps;
            let upto = ((index + 1) * ps).min(end);
            let e = self.entry(index)?;
            let (hole, zero) = match e.content() {
                Content::Empty => (true, true),
                Content::Same(word) => (false, word == 0),
                Content::Stored(_) | Content::WrittenBack(_) => (false, false),
            };
            let len = upto - at;
            Extent::push_merged(&mut extents, Extent { len, hole, zero });
            at = upto;
        }
        Ok(extents)
    }
}
