//! The virtio-blk device a guest sees: the feature bits ztier offers and the device's
//! configuration space (the specification's `struct virtio_blk_config`, little-endian), made
//! from a [`DeviceConfig`].
//!
//! What is offered, and why:
//! - `BLK_SIZE` 4096: the store keeps 4 KiB pages (zram's logical block), so the guest
//!   issues page-aligned I/O and never a read-modify-write of part of a page;
//! - `SEG_MAX` (the queue size less the header and the status) and `SIZE_MAX`: the most
//!   descriptors of data a request may have, and the longest each may be;
//! - `TOPOLOGY`: one block is the minimum and the optimal I/O;
//! - `DISCARD` and `WRITE_ZEROES` (which may unmap), their limits, aligned to a page: a
//!   guest's swap frees clusters with discards, and zram frees their pages;
//! - `FLUSH`: answered at once (a RAM store has no cache to write out), so a guest that
//!   asks its disk to persist is told it did;
//! - `MQ`, several queues, each served by its own thread;
//! - the ring's `INDIRECT_DESC` and `EVENT_IDX`, and `VERSION_1`; `RO` for a read-only
//!   export. Not `CONFIG_WCE` (no write cache to turn off), `GEOMETRY`, packed rings.
//!
//! Invariant: the configuration space read back is what the features say (a field is
//! meaningful only with its feature).

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ,
    VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// The block size the device advertises (`BLK_SIZE`): the store's page.
pub const BLOCK_SIZE: u32 = 4096;
/// A sector, the unit of every offset and count in a virtio-blk request.
pub const SECTOR: u64 = 512;
/// The longest a segment (one descriptor of data) may be (`SIZE_MAX`).
pub const SEGMENT_MAX_BYTES: u32 = 1 << 20;
/// Sectors a discard or zero-write segment may cover, at most (32 MiB: as many as a guest's
/// swap frees at once).
pub const MAX_DISCARD_SECTORS: u32 = 64 << 10;
/// Segments a discard or zero-write request may carry.
pub const MAX_DISCARD_SEGMENTS: u32 = 16;
/// Bytes of a serial (`GET_ID`): `VIRTIO_BLK_ID_BYTES`.
pub const SERIAL_BYTES: usize = 20;
/// Bytes of the configuration space (through the write-zeroes fields; what Firecracker and
/// QEMU read). A read past it reads zeros.
pub const CONFIG_BYTES: usize = 60;

/// How a device is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Queues the device offers (`MQ`); the VMM may use fewer. Each is served by a thread.
    pub num_queues: u16,
    /// The largest queue the device takes (the VMM's `queue-size` must be no larger).
    pub max_queue_size: u16,
    /// Refuse writes, discards and zero-writes (`RO`).
    pub read_only: bool,
    /// What `GET_ID` answers (at most 20 bytes; longer is cut).
    pub serial: String,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            num_queues: 1,
            max_queue_size: 1024,
            read_only: false,
            serial: "ztier".into(),
        }
    }
}

impl DeviceConfig {
    /// The virtio feature bits offered (the vhost-user `PROTOCOL_FEATURES` bit is the
    /// backend's to add).
    pub fn features(&self) -> u64 {
        let mut f = [
            VIRTIO_F_VERSION_1,
            VIRTIO_RING_F_INDIRECT_DESC,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_BLK_F_SIZE_MAX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_TOPOLOGY,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_MQ,
            VIRTIO_BLK_F_DISCARD,
            VIRTIO_BLK_F_WRITE_ZEROES,
        ]
        .iter()
        .fold(0u64, |f, &bit| f | 1 << bit);
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    /// Data segments a request may have: the queue's descriptors less the header and the
    /// status.
    pub fn seg_max(&self) -> u32 {
        u32::from(self.max_queue_size).saturating_sub(2).max(1)
    }

    /// The configuration space of a device of `capacity_bytes`.
    pub fn space(&self, capacity_bytes: u64) -> [u8; CONFIG_BYTES] {
        let mut c = [0u8; CONFIG_BYTES];
        let mut put = |at: usize, bytes: &[u8]| c[at..at + bytes.len()].copy_from_slice(bytes);
        put(0, &(capacity_bytes / SECTOR).to_le_bytes()); // capacity, in sectors
        put(8, &SEGMENT_MAX_BYTES.to_le_bytes()); // size_max
        put(12, &self.seg_max().to_le_bytes()); // seg_max
                                                // 16..20: geometry (not offered)
        put(20, &BLOCK_SIZE.to_le_bytes()); // blk_size
        put(24, &[0]); // physical_block_exp: a physical block is a logical one
        put(25, &[0]); // alignment_offset
        put(26, &1u16.to_le_bytes()); // min_io_size, in blocks
        put(28, &1u32.to_le_bytes()); // opt_io_size, in blocks
                                      // 32: wce, 33: unused (no CONFIG_WCE)
        put(34, &self.num_queues.to_le_bytes()); // num_queues
        put(36, &MAX_DISCARD_SECTORS.to_le_bytes()); // max_discard_sectors
        put(40, &MAX_DISCARD_SEGMENTS.to_le_bytes()); // max_discard_seg
        let page_sectors = (u64::from(BLOCK_SIZE) / SECTOR) as u32;
        put(44, &page_sectors.to_le_bytes()); // discard_sector_alignment
        put(48, &MAX_DISCARD_SECTORS.to_le_bytes()); // max_write_zeroes_sectors
        put(52, &MAX_DISCARD_SEGMENTS.to_le_bytes()); // max_write_zeroes_seg
        put(56, &[1]); // write_zeroes_may_unmap
        c
    }

    /// `GET_ID`'s answer: the serial, NUL-padded to 20 bytes (not NUL-terminated at 20).
    pub fn serial_bytes(&self) -> [u8; SERIAL_BYTES] {
        let mut s = [0u8; SERIAL_BYTES];
        let b = self.serial.as_bytes();
        let n = b.len().min(SERIAL_BYTES);
        s[..n].copy_from_slice(&b[..n]);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_space_says_what_the_spec_puts_where() {
        let cfg = DeviceConfig {
            num_queues: 4,
            max_queue_size: 256,
            ..DeviceConfig::default()
        };
        let c = cfg.space(8 << 30);
        let le32 = |at: usize| u32::from_le_bytes(c[at..at + 4].try_into().unwrap());
        assert_eq!(
            u64::from_le_bytes(c[0..8].try_into().unwrap()),
            (8 << 30) / 512
        );
        assert_eq!(le32(12), 254);
        assert_eq!(le32(20), 4096);
        assert_eq!(u16::from_le_bytes([c[34], c[35]]), 4);
        assert_eq!(le32(44), 8);
        assert_eq!(c[56], 1);
        assert_eq!(cfg.features() & (1 << VIRTIO_BLK_F_RO), 0);
        let ro = DeviceConfig {
            read_only: true,
            ..cfg
        };
        assert_ne!(ro.features() & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(&ro.serial_bytes()[..6], b"ztier\0");
    }
}
