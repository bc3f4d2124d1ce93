//! The block device a thin volume is: each request cut at extent boundaries, a mapped
//! extent's piece sent to the store (pinned while it is in flight), an unmapped one read as
//! zeros or taken on its first write; batches sent as batches. The invariants and locks are
//! the module's (`thin/mod.rs`).

use super::{Found, Slot, Volume, Zeroing};
use crate::{check_range, BlockDevice, Extent, Result};
use ztier_base::pieces::pieces;

impl BlockDevice for Volume {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        self.store.device.block_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.for_extents(
            offset,
            buf.len() as u64,
            |volume_extent, in_extent, piece| {
                let out = &mut buf[piece];
                match self.pin(volume_extent, false) {
                    Some(Found::Pinned(store_extent)) => {
                        let read = self
                            .store
                            .device
                            .read_at(self.at(store_extent, in_extent), out);
                        self.unpin(volume_extent);
                        read
                    }
                    _ => {
                        out.fill(0);
                        Ok(())
                    }
                }
            },
        )
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.for_extents(
            offset,
            data.len() as u64,
            |volume_extent, in_extent, piece| {
                self.write_extent(volume_extent, in_extent, &data[piece], fua)
            },
        )
    }

    /// The pieces on mapped extents go to the store in one `read_many` (in flight together
    /// on an NBD store), each extent pinned until it returns; pieces on unmapped extents
    /// read zeros.
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        let mut pinned: Vec<u64> = Vec::new();
        let mut batch: Vec<(u64, &mut [u8])> = Vec::new();
        let mut checked = Ok(());
        for (offset, buf) in reads.iter_mut() {
            if let Err(e) = check_range(self.size, *offset, buf.len() as u64) {
                checked = Err(e);
                break;
            }
            let mut rest: &mut [u8] = buf;
            for p in pieces(*offset, rest.len(), self.store.extent_size() as usize) {
                let (out, tail) = std::mem::take(&mut rest).split_at_mut(p.len);
                rest = tail;
                match self.pin(p.unit, false) {
                    Some(Found::Pinned(store_extent)) => {
                        pinned.push(p.unit);
                        batch.push((self.at(store_extent, p.in_unit), out));
                    }
                    _ => out.fill(0),
                }
            }
        }
        let read = checked.and_then(|()| self.store.device.read_many(&mut batch));
        for volume_extent in pinned {
            self.unpin(volume_extent);
        }
        read
    }

    /// The pieces on mapped extents go to the store in one `write_many`, each extent pinned
    /// until it returns. A piece on an extent not mapped (or being taken or given back)
    /// sends what is gathered first and lets its pins go, then takes its extent on its own:
    /// a writer never waits on another while it holds pins (a discard may be waiting for
    /// them).
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        let mut pinned: Vec<u64> = Vec::new();
        let mut batch: Vec<(u64, &[u8])> = Vec::new();
        let send = |pinned: &mut Vec<u64>, batch: &mut Vec<(u64, &[u8])>| {
            let written = self.store.device.write_many(batch);
            for volume_extent in pinned.drain(..) {
                self.unpin(volume_extent);
            }
            batch.clear();
            written
        };
        for &(offset, data) in writes {
            if let Err(e) = check_range(self.size, offset, data.len() as u64) {
                send(&mut pinned, &mut batch)?;
                return Err(e);
            }
            for p in pieces(offset, data.len(), self.store.extent_size() as usize) {
                let piece = &data[p.at..p.at + p.len];
                match self.pin(p.unit, false) {
                    Some(Found::Pinned(store_extent)) => {
                        pinned.push(p.unit);
                        batch.push((self.at(store_extent, p.in_unit), piece));
                    }
                    _ => {
                        send(&mut pinned, &mut batch)?;
                        self.write_extent(p.unit, p.in_unit, piece, false)?;
                    }
                }
            }
        }
        send(&mut pinned, &mut batch)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.zero(offset, len, Zeroing::Discard)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        self.zero(
            offset,
            len,
            if may_unmap {
                Zeroing::Unmap
            } else {
                Zeroing::Keep
            },
        )
    }

    fn flush(&self) -> Result<()> {
        self.store.device.flush()
    }

    fn is_volatile(&self) -> bool {
        self.store.device.is_volatile()
    }

    fn fast_zeroes(&self) -> bool {
        self.store.device.fast_zeroes()
    }

    fn epoch(&self) -> u64 {
        self.store.device.epoch()
    }

    /// Unmapped extents are holes; mapped ones data (the store is not asked which of their
    /// blocks hold zeros).
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let mut extents: Vec<Extent> = Vec::new();
        let slots = self.slots();
        self.for_extents(offset, len, |volume_extent, _, piece| {
            let hole = !matches!(slots.map.get(&volume_extent), Some(Slot::Mapped { .. }));
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
