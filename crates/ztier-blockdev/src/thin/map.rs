//! A thin volume's saved map ([`VolumeMap::to_bytes`]): which store extent backs which
//! volume extent, kept by the volume's user across a restart. Little-endian:
//!
//! ```text
//!  0        8         12        16             24        32
//!  +--------+---------+---------+--------------+---------+----------------------+-------+
//!  | magic  | version | 0 (u32) | extent bytes | entries | entries × (volume    | CRC32 |
//!  | ZTTHIN | u32 = 1 |         | u64          | u64     | extent u64, store    | u32   |
//!  | MAP\0\0|         |         |              |         | extent u64), by      |       |
//!  |        |         |         |              |         | volume extent, up    |       |
//!  +--------+---------+---------+--------------+---------+----------------------+-------+
//! ```
//!
//! The CRC (CRC-32, crc32fast) covers every byte before it.

use ztier_base::bytes::{ByteReader, PastEnd};

use super::ThinError;

pub(super) const MAGIC: [u8; 8] = *b"ZTTHINMP";
pub(super) const VERSION: u32 = 1;
/// Magic, version, reserved, extent size, entry count.
pub(super) const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
pub(super) const ENTRY_BYTES: usize = 16;
pub(super) const CRC_BYTES: usize = 4;

/// Which store extent backs which volume extent: a volume's part of the store, saved across
/// a restart. Entries by volume extent, each volume extent once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMap {
    pub(super) extent_size: u64,
    pub(super) entries: Vec<(u64, u64)>,
}

impl VolumeMap {
    /// The extent size of the store it was taken on.
    pub fn extent_size(&self) -> u64 {
        self.extent_size
    }

    /// `(volume extent, store extent)` pairs by volume extent.
    pub fn entries(&self) -> &[(u64, u64)] {
        &self.entries
    }

    /// The map in its saved form (the module header draws it).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_BYTES + self.entries.len() * ENTRY_BYTES + CRC_BYTES);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.extent_size.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for &(volume_extent, store_extent) in &self.entries {
            out.extend_from_slice(&volume_extent.to_le_bytes());
            out.extend_from_slice(&store_extent.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a saved map, refusing (typed) anything [`to_bytes`](Self::to_bytes) would not
    /// have written. Whether its extents fit a store and a volume is
    /// [`ThinStore::restore`](super::ThinStore::restore)'s to check.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<VolumeMap, ThinError> {
        let mut r = ByteReader::new(bytes);
        let magic: [u8; 8] = r.array().map_err(ThinError::Truncated)?;
        if magic != MAGIC {
            return Err(ThinError::Magic { found: magic });
        }
        let version = r.u32_le().map_err(ThinError::Truncated)?;
        if version != VERSION {
            return Err(ThinError::Version { found: version });
        }
        let reserved = r.u32_le().map_err(ThinError::Truncated)?;
        let extent_size = r.u64_le().map_err(ThinError::Truncated)?;
        let count = r.u64_le().map_err(ThinError::Truncated)?;
        let body = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(ENTRY_BYTES))
            .and_then(|b| b.checked_add(CRC_BYTES));
        if body != Some(r.left()) {
            // Cut short, or bytes after the checksum.
            return Err(match body {
                Some(wanted) if wanted > r.left() => ThinError::Truncated(PastEnd {
                    at: r.position(),
                    wanted,
                    left: r.left(),
                }),
                _ => ThinError::Length {
                    entries: count,
                    len: bytes.len(),
                },
            });
        }
        let summed = bytes.len() - CRC_BYTES;
        let stored = u32::from_le_bytes(bytes[summed..].try_into().expect("4 bytes left"));
        let computed = crc32fast::hash(&bytes[..summed]);
        if stored != computed {
            return Err(ThinError::Checksum { stored, computed });
        }
        if reserved != 0 {
            return Err(ThinError::Reserved { found: reserved });
        }
        if !extent_size.is_power_of_two() {
            return Err(ThinError::MapExtentSize { extent_size });
        }
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let volume_extent = r.u64_le().map_err(ThinError::Truncated)?;
            let store_extent = r.u64_le().map_err(ThinError::Truncated)?;
            if entries
                .last()
                .is_some_and(|&(last, _)| last >= volume_extent)
            {
                return Err(ThinError::VolumeExtentOrder {
                    extent: volume_extent,
                });
            }
            entries.push((volume_extent, store_extent));
        }
        Ok(VolumeMap {
            extent_size,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_round_trips_and_each_corruption_is_named() {
        let map = VolumeMap {
            extent_size: 1 << 20,
            entries: vec![(0, 7), (3, 1), (1 << 40, 2)],
        };
        let bytes = map.to_bytes();
        assert_eq!(bytes.len(), HEADER_BYTES + 3 * ENTRY_BYTES + CRC_BYTES);
        assert_eq!(VolumeMap::from_bytes(&bytes).unwrap(), map);

        for cut in 0..bytes.len() {
            let e = VolumeMap::from_bytes(&bytes[..cut]).unwrap_err();
            assert!(matches!(e, ThinError::Truncated(_)), "cut at {cut}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            VolumeMap::from_bytes(&longer),
            Err(ThinError::Length { .. })
        ));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let e = VolumeMap::from_bytes(&bad).unwrap_err();
            let expected = match at {
                0..8 => matches!(e, ThinError::Magic { .. }),
                8..12 => matches!(e, ThinError::Version { .. }),
                // The count: the length no longer fits it.
                24..32 => matches!(e, ThinError::Length { .. } | ThinError::Truncated(_)),
                _ => matches!(e, ThinError::Checksum { .. }),
            };
            assert!(expected, "byte {at} flipped: {e}");
        }
    }

    /// A map whose checksum is right but whose fields are not (what only a crafted file
    /// holds) is still refused.
    #[test]
    fn well_summed_nonsense_is_refused() {
        let resum = |mut bytes: Vec<u8>| {
            let n = bytes.len() - CRC_BYTES;
            let crc = crc32fast::hash(&bytes[..n]);
            bytes[n..].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        let map = VolumeMap {
            extent_size: 1 << 20,
            entries: vec![(1, 1), (2, 2)],
        };
        let mut bytes = map.to_bytes();
        bytes[12] = 1;
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::Reserved { found: 1 })
        ));
        let mut bytes = map.to_bytes();
        bytes[16..24].copy_from_slice(&3u64.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::MapExtentSize { extent_size: 3 })
        ));
        let mut bytes = map.to_bytes();
        // The second entry's volume extent made the first's.
        bytes[HEADER_BYTES + ENTRY_BYTES..HEADER_BYTES + ENTRY_BYTES + 8]
            .copy_from_slice(&1u64.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::VolumeExtentOrder { extent: 1 })
        ));
        // A count that would overflow the length sum.
        let mut bytes = map.to_bytes();
        bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&bytes),
            Err(ThinError::Length { .. })
        ));
    }
}
