//! Swap entries (`swp_entry_t`): a device's index (its "type") and a slot offset in one
//! `u64`, packed with the shared bit fields.

use ztier_base::bits::Field;

/// Devices a [`crate::Swap`] holds at most (`MAX_SWAPFILES`).
pub const MAX_SWAPFILES: usize = 32;

const OFFSET: Field = Field::at(0, 58);
const TYPE: Field = Field::after(OFFSET, 5);

/// A slot on one of a [`crate::Swap`]'s devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SwapEntry(u64);

impl SwapEntry {
    /// The entry for slot `offset` of device `device` (`device < MAX_SWAPFILES`, `offset <
    /// 2^58`: a device has fewer than 2^32 slots).
    pub fn new(device: u8, offset: u64) -> SwapEntry {
        SwapEntry(TYPE.put(u64::from(device)) | OFFSET.put(offset))
    }

    pub fn device(self) -> u8 {
        TYPE.get(self.0) as u8
    }

    pub fn offset(self) -> u64 {
        OFFSET.get(self.0)
    }

    /// The packed value.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// An entry from its packed value (any value: its device and offset are checked where
    /// it is used).
    pub fn from_raw(raw: u64) -> SwapEntry {
        SwapEntry(raw & (TYPE.max() << TYPE.shift() | OFFSET.max()))
    }
}

impl std::fmt::Display for SwapEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.device(), self.offset())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_pack_and_unpack() {
        let e = SwapEntry::new(31, (1 << 32) + 5);
        assert_eq!((e.device(), e.offset()), (31, (1 << 32) + 5));
        assert_eq!(SwapEntry::from_raw(e.raw()), e);
        assert_eq!(e.to_string(), "31:4294967301");
        let junk = SwapEntry::from_raw(u64::MAX);
        assert_eq!((junk.device(), junk.offset()), (31, (1 << 58) - 1));
    }
}
