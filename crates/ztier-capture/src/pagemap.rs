//! `/proc/PID/pagemap`: one 64-bit entry per virtual page (Documentation/admin-guide/mm/
//! pagemap.rst). A capture reads the present and swapped bits; the frame number and the swap
//! entry only where the kernel shows them (CAP_SYS_ADMIN), to take a page mapped twice once
//! (`crate::key::PhysicalPage`). A shmem page has a frame here only while this process maps
//! it in memory: swapped out, or never touched by this process, its entry is empty.

/// One pagemap entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageEntry(pub u64);

impl PageEntry {
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const PFN_MASK: u64 = (1 << 55) - 1;

    pub fn present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    pub fn swapped(self) -> bool {
        self.0 & Self::SWAPPED != 0
    }

    /// The page frame of a present page, if the kernel shows it to this reader (it reads 0
    /// without CAP_SYS_ADMIN).
    pub fn frame(self) -> Option<u64> {
        let pfn = self.0 & Self::PFN_MASK;
        (self.present() && pfn != 0).then_some(pfn)
    }

    /// The swap entry (type and offset) of a swapped-out page, if the kernel shows it to this
    /// reader (it reads 0 without CAP_SYS_ADMIN; offset 0 of a swap device is its header,
    /// never a page's, so a shown entry is never 0).
    pub fn swap_slot(self) -> Option<u64> {
        let slot = self.0 & Self::PFN_MASK;
        (self.swapped() && slot != 0).then_some(slot)
    }

    /// Whether a capture takes the page: in memory or in swap.
    pub fn captured(self) -> bool {
        self.present() || self.swapped()
    }
}

/// Decodes entries, native-endian as the kernel writes them.
pub fn entries(bytes: &[u8]) -> impl Iterator<Item = PageEntry> + '_ {
    bytes.chunks_exact(8).map(|c| {
        let mut a = [0u8; 8];
        a.copy_from_slice(c);
        PageEntry(u64::from_ne_bytes(a))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits() {
        let present = PageEntry((1 << 63) | 0x1234);
        assert!(present.present() && !present.swapped() && present.captured());
        assert_eq!(present.frame(), Some(0x1234));
        let hidden = PageEntry(1 << 63);
        assert_eq!(hidden.frame(), None);
        let swapped = PageEntry((1 << 62) | 0x55);
        assert!(swapped.captured() && swapped.frame().is_none());
        assert_eq!(swapped.swap_slot(), Some(0x55));
        assert_eq!(present.swap_slot(), None);
        assert_eq!(PageEntry(1 << 62).swap_slot(), None);
        assert!(!PageEntry(0).captured());
        let bytes: Vec<u8> = [present.0, 0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        assert_eq!(entries(&bytes).collect::<Vec<_>>(), [present, PageEntry(0)]);
    }
}
