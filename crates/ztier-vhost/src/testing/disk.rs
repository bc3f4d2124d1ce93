//! The guest's driver as a [`BlockDevice`]: sector I/O on the queues in turn, so the
//! block-device conformance suite runs over vhost-user.

use std::io;
use std::sync::{Arc, Mutex};

use super::{segment, Guest, DATA_MAX};
use virtio_bindings::virtio_blk::*;
use ztier_blockdev::{check_range, BlockDevice, BlockError};

/// The driver as a block device: requests on the queues in turn, sectors read and written
/// whole (those an unaligned request covers in part are read, changed and written back, as
/// a guest's page cache does).
pub struct GuestDisk {
    pub guest: Arc<Guest>,
    /// Serializes read-modify-writes of partly covered sectors.
    partial: Mutex<()>,
}

impl GuestDisk {
    pub fn new(guest: Arc<Guest>) -> GuestDisk {
        GuestDisk {
            guest,
            partial: Mutex::new(()),
        }
    }

    fn status(status: u8) -> ztier_blockdev::Result<()> {
        match u32::from(status) {
            VIRTIO_BLK_S_OK => Ok(()),
            VIRTIO_BLK_S_UNSUPP => Err(BlockError::Unsupported("the request")),
            _ => Err(BlockError::Io(io::Error::from_raw_os_error(libc::EIO))),
        }
    }

    fn read_sectors(&self, sector: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        for (i, piece) in buf.chunks_mut(DATA_MAX / 2).enumerate() {
            let s = sector + (i * DATA_MAX / 2 / 512) as u64;
            let (st, data) =
                self.guest
                    .request(self.guest.pick(), VIRTIO_BLK_T_IN, s, &[], piece.len());
            Self::status(st)?;
            piece.copy_from_slice(&data);
        }
        Ok(())
    }

    fn write_sectors(&self, sector: u64, data: &[u8]) -> ztier_blockdev::Result<()> {
        for (i, piece) in data.chunks(DATA_MAX / 2).enumerate() {
            let s = sector + (i * DATA_MAX / 2 / 512) as u64;
            let (st, _) = self
                .guest
                .request(self.guest.pick(), VIRTIO_BLK_T_OUT, s, piece, 0);
            Self::status(st)?;
        }
        Ok(())
    }

    /// Discard or zero-write requests over whole sectors, each segment no longer than the
    /// device's limit.
    fn ranged(
        &self,
        kind: u32,
        sector: u64,
        sectors: u64,
        flags: u32,
    ) -> ztier_blockdev::Result<()> {
        let most = u64::from(self.guest.config_u32(36));
        let mut at = 0;
        while at < sectors {
            let n = (sectors - at).min(most);
            let (st, _) = self.guest.request(
                self.guest.pick(),
                kind,
                0,
                &segment(sector + at, n as u32, flags),
                0,
            );
            Self::status(st)?;
            at += n;
        }
        Ok(())
    }

    /// Splits `offset..offset + len` into a partial head sector, whole sectors, and a partial
    /// tail sector.
    fn whole(offset: u64, len: u64) -> (u64, u64) {
        let first = offset.div_ceil(512);
        let last = (offset + len) / 512;
        (first, last.saturating_sub(first))
    }
}

impl BlockDevice for GuestDisk {
    fn size(&self) -> u64 {
        self.guest.capacity()
    }

    fn block_size(&self) -> u32 {
        self.guest.config_u32(20)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        let first = offset / 512;
        let end = (offset + buf.len() as u64).div_ceil(512);
        let mut sectors = vec![0u8; ((end - first) * 512) as usize];
        self.read_sectors(first, &mut sectors)?;
        let skip = (offset - first * 512) as usize;
        buf.copy_from_slice(&sectors[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], _fua: bool) -> ztier_blockdev::Result<()> {
        check_range(self.size(), offset, data.len() as u64)?;
        if data.is_empty() {
            return Ok(());
        }
        if offset.is_multiple_of(512) && data.len().is_multiple_of(512) {
            return self.write_sectors(offset / 512, data);
        }
        let _partial = self.partial.lock().unwrap();
        let first = offset / 512;
        let end = (offset + data.len() as u64).div_ceil(512);
        let mut sectors = vec![0u8; ((end - first) * 512) as usize];
        self.read_sectors(first, &mut sectors)?;
        let skip = (offset - first * 512) as usize;
        sectors[skip..skip + data.len()].copy_from_slice(data);
        self.write_sectors(first, &sectors)
    }

    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        check_range(self.size(), offset, len)?;
        let (first, count) = Self::whole(offset, len);
        if count == 0 {
            return Ok(());
        }
        self.ranged(VIRTIO_BLK_T_DISCARD, first, count, 0)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        check_range(self.size(), offset, len)?;
        let (first, count) = Self::whole(offset, len);
        // The parts of sectors at either end are zeroed by writes.
        let head_end = (first * 512).min(offset + len);
        if head_end > offset {
            self.write_at(offset, &vec![0; (head_end - offset) as usize], false)?;
        }
        let tail_start = ((first + count) * 512).max(head_end);
        if offset + len > tail_start {
            self.write_at(
                tail_start,
                &vec![0; (offset + len - tail_start) as usize],
                false,
            )?;
        }
        if count == 0 {
            return Ok(());
        }
        let flags = if may_unmap {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        self.ranged(VIRTIO_BLK_T_WRITE_ZEROES, first, count, flags)
    }

    fn flush(&self) -> ztier_blockdev::Result<()> {
        let (st, _) = self
            .guest
            .request(self.guest.pick(), VIRTIO_BLK_T_FLUSH, 0, &[], 0);
        Self::status(st)
    }
}
