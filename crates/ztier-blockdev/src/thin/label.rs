//! A shared store's label: its first bytes say that it is a store of thin volumes, with
//! which extent size and how many extents, under which random id. A host opens its store
//! through the label ([`ThinStore::labelled`](super::ThinStore::labelled)), so that:
//! - a store of another extent size, or a file or export that holds something else, is
//!   refused instead of overwritten;
//! - a remote store has bytes to be known by: the NBD client pins the label as the
//!   export's identity, waits for a lost store and reconnects by itself, and refuses one
//!   that came back empty (restarted without its data) or is another export.
//!
//! The label lives in the store's first extent, which no volume ever takes.
//!
//! Format (little-endian), [`LABEL_LEN`] bytes at offset 0:
//! ```text
//!  0  magic "ZTIERTHN"      8  version u32        12  reserved u32 (0)
//! 16  extent size u64      24  extents u64       32  uuid [u8; 16]
//! 48  CRC-32 of bytes 0..48
//! ```
//! No locks: read and written once, as the store is opened.

use ztier_base::bytes::ByteReader;

use std::sync::{Arc, Mutex};

use super::{ThinError, ThinStore};
use crate::BlockDevice;

/// What a label starts with.
pub(super) const MAGIC: [u8; 8] = *b"ZTIERTHN";
/// The label's format.
pub(super) const VERSION: u32 = 1;
/// The label's bytes, at the store's offset 0.
pub const LABEL_LEN: usize = 52;

/// What a store's label says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    pub extent_size: u64,
    /// The store's extents when the label was written (the store may grow, never shrink).
    pub extents: u64,
    /// The store's random id.
    pub uuid: [u8; 16],
}

/// What the first bytes of a store hold.
pub(super) enum Found {
    /// A label.
    Label(Label),
    /// Zeros: a store never used.
    Empty,
}

impl Label {
    pub(super) fn to_bytes(self) -> [u8; LABEL_LEN] {
        let mut b = [0u8; LABEL_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.extent_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.extents.to_le_bytes());
        b[32..48].copy_from_slice(&self.uuid);
        let crc = crc32fast::hash(&b[..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads a store's first [`LABEL_LEN`] bytes: a label, nothing (zeros), or a refusal
    /// that says what is there instead.
    pub(super) fn read(bytes: &[u8; LABEL_LEN]) -> Result<Found, ThinError> {
        if bytes.iter().all(|&b| b == 0) {
            return Ok(Found::Empty);
        }
        let mut r = ByteReader::new(bytes);
        let magic: [u8; 8] = r.array().map_err(ThinError::Truncated)?;
        if magic != MAGIC {
            return Err(ThinError::NotAStore { found: magic });
        }
        let version = r.u32_le().map_err(ThinError::Truncated)?;
        if version != VERSION {
            return Err(ThinError::LabelVersion { found: version });
        }
        let reserved = r.u32_le().map_err(ThinError::Truncated)?;
        let extent_size = r.u64_le().map_err(ThinError::Truncated)?;
        let extents = r.u64_le().map_err(ThinError::Truncated)?;
        let uuid: [u8; 16] = r.array().map_err(ThinError::Truncated)?;
        let stored = r.u32_le().map_err(ThinError::Truncated)?;
        let computed = crc32fast::hash(&bytes[..48]);
        if stored != computed {
            return Err(ThinError::LabelChecksum { stored, computed });
        }
        if reserved != 0 {
            return Err(ThinError::Reserved { found: reserved });
        }
        Ok(Found::Label(Label {
            extent_size,
            extents,
            uuid,
        }))
    }
}

impl super::ThinStore {
    /// A pool over a store with a label (see `thin/label.rs`): the label read and
    /// checked, or, on a store of zeros (never used), written with a new random id and
    /// flushed. The first extent holds the label and is never a volume's. Refused if the
    /// store holds something else, a label of another extent size, or fewer extents than
    /// its label says.
    pub fn labelled(
        device: Arc<dyn BlockDevice>,
        extent_size: u64,
    ) -> std::result::Result<Arc<ThinStore>, ThinError> {
        let unlabelled = ThinStore::new(device, extent_size)?;
        let extents = unlabelled.extents;
        if extents < 2 {
            return Err(ThinError::NoRoom);
        }
        let mut first = [0u8; LABEL_LEN];
        unlabelled
            .device
            .read_at(0, &mut first)
            .map_err(ThinError::LabelIo)?;
        let label = match Label::read(&first)? {
            Found::Label(label) => {
                if label.extent_size != extent_size {
                    return Err(ThinError::LabelExtentSize {
                        label: label.extent_size,
                        asked: extent_size,
                    });
                }
                if label.extents > extents {
                    return Err(ThinError::StoreShrank {
                        label: label.extents,
                        now: extents,
                    });
                }
                label
            }
            Found::Empty => {
                let label = Label {
                    extent_size,
                    extents,
                    uuid: ztier_base::os::random_uuid(),
                };
                let device = &unlabelled.device;
                device
                    .write_at(0, &label.to_bytes(), false)
                    .and_then(|()| device.flush())
                    .map_err(ThinError::LabelIo)?;
                label
            }
        };
        let ThinStore {
            device,
            extent_shift,
            extents,
            free,
            ..
        } = Arc::into_inner(unlabelled).expect("made here, held nowhere else");
        let mut free = free.into_inner().unwrap_or_else(|e| e.into_inner());
        free.set(0, true);
        Ok(Arc::new(ThinStore {
            device,
            extent_shift,
            extents,
            free: Mutex::new(free),
            label: Some(label),
        }))
    }

    /// The store's label, if it was opened through one.
    pub fn label(&self) -> Option<Label> {
        self.label
    }

    /// The bytes that tell this store from any other (its label: offset and length), for
    /// the owner of a remote store to pin as the export's identity; `None` without a label.
    pub fn identity(&self) -> Option<(u64, usize)> {
        self.label.map(|_| (0, LABEL_LEN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_reads_back_and_damage_is_named() {
        let label = Label {
            extent_size: 1 << 20,
            extents: 4096,
            uuid: [7; 16],
        };
        let bytes = label.to_bytes();
        assert!(matches!(Label::read(&bytes), Ok(Found::Label(l)) if l == label));
        assert!(matches!(Label::read(&[0; LABEL_LEN]), Ok(Found::Empty)));
        let mut other = [0u8; LABEL_LEN];
        other[..4].copy_from_slice(b"\x7fELF");
        assert!(matches!(
            Label::read(&other),
            Err(ThinError::NotAStore { .. })
        ));
        let mut flipped = bytes;
        flipped[40] ^= 1;
        assert!(matches!(
            Label::read(&flipped),
            Err(ThinError::LabelChecksum { .. })
        ));
        let mut newer = bytes;
        newer[8] = 2;
        assert!(matches!(
            Label::read(&newer),
            Err(ThinError::LabelVersion { found: 2 })
        ));
    }
}
