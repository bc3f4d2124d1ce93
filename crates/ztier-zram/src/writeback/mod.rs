//! zram writeback (`CONFIG_ZRAM_WRITEBACK` in `zram_drv.c`): idle, huge, incompressible or
//! all pages moved from the pool to a backing store, which is any block device of the
//! groundwork trait (a local file, a remote NBD export; zram never knows which).
//!
//! Places on the store come from the swap-slot allocator (`ztier_swap::Device` over the
//! store): a block per page, or, packed, a 64 KiB segment (an order-4 run of slots) per
//! batch. The allocator already keeps free space by cluster, hands out aligned runs,
//! batches frees and discards freed clusters off the allocation path, all of which a bitmap
//! would have to grow again.
//!
//! Three formats:
//! - [`WbFormat::Page`], the kernel's default: each page decompressed into its own block;
//! - [`WbFormat::Compressed`], the kernel's `compressed_writeback`: each compressed object in
//!   its own block (less CPU, the same blocks and bytes);
//! - [`WbFormat::Packed`], ztier's: compressed objects packed back to back into segments,
//!   each with a CRC-32 after it (a segment starts with `SEGMENT_MAGIC`; one written before
//!   checksums does not, and is read unchecked), so bytes written and stored fall by the
//!   compression ratio. A segment's live bytes are counted; the segment goes back to the
//!   allocator (and its blocks are discarded) when the last object in it dies (an
//!   overwrite, a discard, a reset).
//!
//! The parts, in the order a reader meets them: `store` (the store, its live counts,
//! identity, stamp and pins), `pipeline` (a writeback: collect, write, commit), `reads` (a
//! written-back page read back, pinned, with nothing locked across the I/O), `readahead` (a
//! packed segment read, with the segments after it for a sequential reader) and `cache`
//! (the segment cache those reads fill). Here: the store's place in the device (set, closed), the
//! writeback limit, `bd_stat`.
//!
//! A saved state (`state/`) names written-back pages by place: the save stamps the store's
//! header first (`Backing::mark`), and from then on no unit goes back to the allocator
//! until the next change to the store clears the stamp (`Backing::unmark`, the first thing
//! a writeback does); the units kept meanwhile are freed then. A state loads only if the
//! store still has its stamp, so it never names bytes that were overwritten or discarded.
//!
//! Locks: every lock of writeback is in DESIGN.md's table, in order: `Backing::gate` first
//! (never under another), then a slot's lock, then the cache's and readahead's leaves and
//! `Backing::mark`, then the swap allocator's; `Backing::stamping` under the gate alone;
//! `Device::backing` held only to look up or swap the store.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use serde::Serialize;
use ztier_swap::SLOT_BYTES;

use crate::stats::Counter;
use crate::{Busy, Device, Result, ZramError};

mod cache;
mod pipeline;
mod readahead;
mod reads;
mod store;

pub use pipeline::WbResult;
pub(crate) use store::Pin;
pub use store::{Backing, BdStat};

/// Where a Linux swap header holds its `sws_uuid`, the store's id.
pub(super) const SWAP_UUID_AT: u64 = 1036;

/// Slots of a packed segment (an order-4 allocation: 64 KiB).
pub(super) const SEG_ORDER: u32 = 4;
pub(super) const SEG_SLOTS: u64 = 1 << SEG_ORDER;
pub(super) const SEG_BYTES: usize = (SEG_SLOTS * SLOT_BYTES) as usize;

/// The first bytes of a packed segment whose objects each carry a checksum: the object,
/// then the CRC-32 (IEEE, as the saved state's) of its bytes, little-endian. A segment
/// written before checksums (objects back to back from byte 0) does not start with it and
/// is read as it was written; one whose first object happened to begin with these bytes
/// would fail its checks (an I/O error), never be read wrong.
pub(super) const SEGMENT_MAGIC: [u8; 8] = *b"ztierPK1";
/// An object's checksum, after it.
pub(super) const OBJECT_CRC: usize = 4;

/// Whether an object of `size` bytes, in `format`, fills a packed segment by itself: a
/// 64 KiB unit stored raw, which leaves no room for the segment's magic or a checksum
/// after it. Such a segment holds the unit alone from byte 0, and the place's byte (0 for
/// every such unit) holds its check instead ([`whole_check`]), so its reads are checked
/// as every packed object's are (on 16 bits, not 32).
pub(crate) fn whole_segment(format: WbFormat, size: usize) -> bool {
    format == WbFormat::Packed && SEGMENT_MAGIC.len() + size + OBJECT_CRC > SEG_BYTES
}

/// The check a unit filling its segment keeps in its place: the low 16 bits of its
/// CRC-32.
pub(super) fn whole_check(object: &[u8]) -> usize {
    (crc32fast::hash(object) & 0xffff) as usize
}

/// A place's byte must fit the handle word's field for it.
const _: () = assert!(SEG_BYTES as u64 - 1 <= crate::slot::PLACE_AT_MAX);

/// How written-back pages are laid out on the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WbFormat {
    Page,
    Compressed,
    Packed,
}

/// A word `WbFormat` does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: the writeback formats are page, compressed and packed")]
pub struct BadWbFormat(pub String);

impl std::str::FromStr for WbFormat {
    type Err = BadWbFormat;
    fn from_str(s: &str) -> std::result::Result<WbFormat, BadWbFormat> {
        match s {
            "page" => Ok(WbFormat::Page),
            "compressed" => Ok(WbFormat::Compressed),
            "packed" => Ok(WbFormat::Packed),
            _ => Err(BadWbFormat(s.to_string())),
        }
    }
}

impl Device {
    /// Sets the backing store (`backing_dev`). Refused while pages are written back to the
    /// current one.
    pub fn set_backing(&self, store: Option<Backing>) -> Result<()> {
        // The current store's gate first (before `backing`, as a writeback takes it): a
        // writeback on it in flight has pages it has not yet counted in `bd_count`, and
        // would commit them to a store the device no longer has; one that starts after
        // this finds it is not the device's store any more (`writeback`).
        let current = self.backing();
        let quiet = current.as_ref().map(|old| old.gate.write());
        if quiet.as_ref().is_some_and(|closed| **closed) {
            return Err(ZramError::Busy(Busy::WritebackClosed));
        }
        let mut b = self.backing.write();
        if !same_store(b.as_ref(), current.as_ref()) {
            return Err(ZramError::Busy(Busy::StoreChanged));
        }
        if b.is_some() && self.counters().get(Counter::BdCount) > 0 {
            return Err(ZramError::Busy(Busy::PagesOnStore));
        }
        // The old store's readahead ends first: its late frees must not land on a new
        // store over the same device.
        if let Some(old) = b.as_ref() {
            old.quiesce();
        }
        // Laid out for this device's units (a new store: nothing is on it yet).
        *b = store.map(|s| Arc::new(s.for_unit_size(self.unit_size)));
        Ok(())
    }

    /// The backing store, if set.
    pub fn backing(&self) -> Option<Arc<Backing>> {
        self.backing.read().clone()
    }

    /// Closes writeback for good: waits for any writeback in progress (the policy's, or one
    /// a control request started) to end, and refuses every one after it. For a server that
    /// stops: its final save then describes the store as it stays.
    pub fn close_writeback(&self) {
        // The store the device has once its gate is held: a store set meanwhile in place of
        // the one looked up first is closed instead (`set_backing` swaps under the old
        // store's gate, and refuses once it is closed).
        while let Some(b) = self.backing() {
            let mut closed = b.gate.write();
            if same_store(self.backing().as_ref(), Some(&b)) {
                *closed = true;
                return;
            }
        }
    }

    /// `writeback_limit_enable` and `writeback_limit` (in 4 KiB blocks): each block written
    /// to the store takes one; at 0, writeback stops. `u64::MAX` is how "no limit" is kept,
    /// so a limit of `u64::MAX` blocks is kept as one block fewer (more than any store
    /// holds either way): it stays a limit, reads back as on, and is not lost to 0 when
    /// `writeback_limit_enable` is written again.
    pub fn set_writeback_limit(&self, limit: Option<u64>) {
        let kept = match limit {
            Some(blocks) => blocks.min(u64::MAX - 1),
            None => u64::MAX,
        };
        self.wb_limit.store(kept, Relaxed);
    }

    /// Blocks the writeback limit has left (`None`: no limit).
    pub fn writeback_limit(&self) -> Option<u64> {
        let l = self.wb_limit.load(Relaxed);
        (l != u64::MAX).then_some(l)
    }

    /// Takes `blocks` from the limit; false (taking nothing) if it has fewer.
    pub(super) fn take_limit(&self, blocks: u64) -> bool {
        self.wb_limit
            .fetch_update(Relaxed, Relaxed, |l| {
                if l == u64::MAX {
                    Some(l)
                } else {
                    l.checked_sub(blocks)
                }
            })
            .is_ok()
    }

    /// Gives `blocks` taken by [`take_limit`](Self::take_limit) back, for a write that did
    /// not happen.
    fn give_back_limit(&self, blocks: u64) {
        let _ = self.wb_limit.fetch_update(Relaxed, Relaxed, |l| {
            (l != u64::MAX).then(|| l.saturating_add(blocks).min(u64::MAX - 1))
        });
    }

    /// `bd_stat`, if a backing store is set.
    pub fn bd_stat(&self) -> Option<BdStat> {
        self.backing().map(|b| b.stat(&self.counters()))
    }
}

/// Whether two looks at a device's store saw the same one (or both none): a store is
/// told apart by its identity, not its contents.
pub(crate) fn same_store(a: Option<&Arc<Backing>>, b: Option<&Arc<Backing>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}
