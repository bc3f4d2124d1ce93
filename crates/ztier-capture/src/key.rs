//! How a capture names a page: [`PageKey`], the number a trace knows a page by from epoch to
//! epoch, and [`PhysicalPage`], what makes two mapped pages one page, so each is taken once
//! (`Taken`: the physical pages one read of every process has taken, and the numbers of the
//! shmem objects it has seen).
//!
//! A page key is one 64-bit word (a trace's page number, `ztier_corpus::trace`):
//!
//! ```text
//!  private page:  63 62           48 47                                     0
//!                | 0 | process (15)  | virtual page number (48)              |
//!  shared page:   63 62                      36 35                          0
//!                | 1 | shmem object (27)      | page index in the object (36)|
//! ```
//!
//! A private page (heap, stack, private anonymous, private file page) is named by its
//! process's number in the capture (0 for the first, so a capture of one process names its
//! private pages by their virtual page numbers) and its virtual page number. A shared page
//! (shmem: shared anonymous, SysV, memfd, tmpfs file) is named by its object (numbered in the
//! order the capture first saw it) and its index in the object, whichever process and address
//! it was seen through: two processes mapping it, or one mapping it twice, name it once, and
//! it keeps its name from epoch to epoch while any captured process maps it.
//!
//! A physical page is what the kernel would swap once: a frame, a swap slot, or a shmem
//! object's page. Frames and swap slots are shown by `/proc/PID/pagemap` only to
//! CAP_SYS_ADMIN; without them a private page cannot be told from another and is taken at
//! each address it is mapped at (a page shared copy-on-write after `fork` twice, say).

use std::collections::{HashMap, HashSet};

use crate::maps::ShmemObject;
use crate::{CaptureError, Result};

/// A page's name in a capture's trace (see the module's diagram).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageKey(pub u64);

impl PageKey {
    const SHARED: u64 = 1 << 63;
    const PROCESS_SHIFT: u32 = 48;
    const PROCESS_BITS: u32 = 15;
    const OBJECT_SHIFT: u32 = 36;
    const OBJECT_BITS: u32 = 27;

    /// Processes one capture can name.
    pub const MAX_PROCESSES: u64 = 1 << Self::PROCESS_BITS;
    /// Shmem objects one capture can name.
    pub const MAX_OBJECTS: u64 = 1 << Self::OBJECT_BITS;

    const VPN_MASK: u64 = (1 << Self::PROCESS_SHIFT) - 1;
    const INDEX_MASK: u64 = (1 << Self::OBJECT_SHIFT) - 1;

    /// Process `process`'s private page at virtual page number `vpn`. Every user address of
    /// x86-64 and arm64 (57 bits at most) has a virtual page number below 2^48.
    pub fn private(process: u32, vpn: u64) -> Result<PageKey> {
        if u64::from(process) >= Self::MAX_PROCESSES {
            return Err(CaptureError::TooMany {
                what: "processes",
                limit: Self::MAX_PROCESSES,
            });
        }
        debug_assert!(vpn <= Self::VPN_MASK, "a virtual page number above 2^48");
        Ok(PageKey(
            (u64::from(process) << Self::PROCESS_SHIFT) | (vpn & Self::VPN_MASK),
        ))
    }

    /// Page `index` of shmem object `object`.
    pub fn shared(object: u32, index: u64) -> Result<PageKey> {
        if u64::from(object) >= Self::MAX_OBJECTS {
            return Err(CaptureError::TooMany {
                what: "shared memory objects",
                limit: Self::MAX_OBJECTS,
            });
        }
        if index > Self::INDEX_MASK {
            return Err(CaptureError::TooMany {
                what: "pages in one shared memory object",
                limit: Self::INDEX_MASK + 1,
            });
        }
        Ok(PageKey(
            Self::SHARED | (u64::from(object) << Self::OBJECT_SHIFT) | index,
        ))
    }

    /// What the key names.
    pub fn decode(self) -> KeyedPage {
        if self.0 & Self::SHARED == 0 {
            KeyedPage::Private {
                process: (self.0 >> Self::PROCESS_SHIFT) as u32,
                vpn: self.0 & Self::VPN_MASK,
            }
        } else {
            KeyedPage::Shared {
                object: ((self.0 & !Self::SHARED) >> Self::OBJECT_SHIFT) as u32,
                index: self.0 & Self::INDEX_MASK,
            }
        }
    }
}

const _: () = assert!(PageKey::PROCESS_SHIFT + PageKey::PROCESS_BITS == 63);
const _: () = assert!(PageKey::OBJECT_SHIFT + PageKey::OBJECT_BITS == 63);

/// A [`PageKey`] decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyedPage {
    Private { process: u32, vpn: u64 },
    Shared { object: u32, index: u64 },
}

/// What a mapped page is physically: the same physical page seen again (at another address,
/// in another process) is not taken again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhysicalPage {
    /// A page in memory, by its page frame number.
    Frame(u64),
    /// A page in swap, by its pagemap swap entry (type and offset).
    SwapSlot(u64),
    /// A shmem page, by its object and its index in it: in memory or in swap, mapped here or
    /// not.
    Shmem(ShmemObject, u64),
}

/// The numbers a capture gives shmem objects, in the order it first sees them, kept from
/// epoch to epoch so a shared page's key stays.
#[derive(Debug, Default)]
pub(crate) struct ObjectNumbers(HashMap<ShmemObject, u32>);

impl ObjectNumbers {
    /// `object`'s number, a new one if it is new.
    pub(crate) fn number(&mut self, object: ShmemObject) -> u32 {
        let next = self.0.len() as u32;
        *self.0.entry(object).or_insert(next)
    }
}

/// The physical pages a read has taken so far, across its processes, and the capture's
/// numbers for shmem objects.
pub(crate) struct Taken<'a> {
    pages: HashSet<PhysicalPage>,
    duplicates: u64,
    objects: &'a mut ObjectNumbers,
}

impl<'a> Taken<'a> {
    pub(crate) fn new(objects: &'a mut ObjectNumbers) -> Taken<'a> {
        Taken {
            pages: HashSet::new(),
            duplicates: 0,
            objects,
        }
    }

    /// Whether `page` is new to this read (a page of unknown identity always is), taking it;
    /// a page taken before is counted as a duplicate.
    pub(crate) fn take(&mut self, page: Option<PhysicalPage>) -> bool {
        let new = page.is_none_or(|p| self.pages.insert(p));
        self.duplicates += u64::from(!new);
        new
    }

    pub(crate) fn has(&self, page: &PhysicalPage) -> bool {
        self.pages.contains(page)
    }

    /// The pages left out so far as taken before.
    pub(crate) fn duplicates(&self) -> u64 {
        self.duplicates
    }

    /// Counts `pages` left out without a look at each (already taken).
    pub(crate) fn count_duplicates(&mut self, pages: u64) {
        self.duplicates += pages;
    }

    /// The capture's number for `object`; [`CaptureError::TooMany`] past what a key holds.
    pub(crate) fn object_number(&mut self, object: ShmemObject) -> Result<u32> {
        let number = self.objects.number(object);
        if u64::from(number) >= PageKey::MAX_OBJECTS {
            return Err(CaptureError::TooMany {
                what: "shared memory objects",
                limit: PageKey::MAX_OBJECTS,
            });
        }
        Ok(number)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_to_what_they_name() {
        assert_eq!(PageKey::private(0, 0x7f12_3456).unwrap().0, 0x7f12_3456);
        for (process, vpn) in [(0, 0), (1, 5), (32767, (1 << 48) - 1)] {
            let key = PageKey::private(process, vpn).unwrap();
            assert_eq!(key.decode(), KeyedPage::Private { process, vpn });
        }
        for (object, index) in [(0, 0), (7, 12), ((1 << 27) - 1, (1 << 36) - 1)] {
            let key = PageKey::shared(object, index).unwrap();
            assert_eq!(key.decode(), KeyedPage::Shared { object, index });
            assert!(key.0 >> 63 == 1);
        }
        assert!(PageKey::private(1 << 15, 0).is_err());
        assert!(PageKey::shared(1 << 27, 0).is_err());
        assert!(PageKey::shared(0, 1 << 36).is_err());
    }
}
