//! What making or using a region refuses ([`Error`]), and why a page cannot be moved out
//! ([`UnmovableReason`]). Each variant carries what a caller acts on; the C ABI maps them to
//! an `errno` (capi.rs).

use std::io;

use ztier_zram::ZramError;

/// What making or using a region refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(
        "userfaultfd is not allowed to this process ({0}): it needs CAP_SYS_PTRACE (root), \
         vm.unprivileged_userfaultfd=1, or access to /dev/userfaultfd"
    )]
    NotPermitted(io::Error),
    #[error("this kernel lacks {0} (UFFDIO_MOVE needs Linux 6.8)")]
    Unsupported(&'static str),
    #[error("a region of {len} bytes: the length must be a positive whole number of {page_size}-byte pages")]
    BadLength { len: usize, page_size: usize },
    #[error("a budget of {budget} bytes: it must hold at least one {page_size}-byte page")]
    BadBudget { budget: usize, page_size: usize },
    #[error("the device has {device_pages} pages of {device_page_size} bytes; the region needs {pages} of {page_size}")]
    DeviceTooSmall {
        device_pages: u64,
        device_page_size: usize,
        pages: u64,
        page_size: usize,
    },
    /// A compression unit the region cannot have ([`RegionConfig::unit_size`](crate::RegionConfig::unit_size)).
    #[error(
        "a compression unit of {unit_size} bytes: it must be a power of two from 4096 (a \
         page of {page_size} bytes at least) up to {max_unit} bytes"
    )]
    BadUnitSize {
        unit_size: usize,
        page_size: usize,
        max_unit: usize,
    },
    /// A self-sizing budget's config outside its rule (`AutosizeConfig`): why.
    #[error("the budget's controller: {0}")]
    BadAutosize(&'static str),
    #[error("page {0} is beyond the region")]
    BadPage(u64),
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: io::Error,
    },
    /// A page could not be stored (the device's memory limit, its allocator): it stays
    /// resident.
    #[error("page {page} stays resident: the store refused it: {cause}")]
    Store { page: u64, cause: ZramError },
    #[error("making the device's pool: {0}")]
    Pool(ztier_pool::PoolError),
    #[error("making the device: {0}")]
    Device(ZramError),
    /// The device refused an operation the program asked of it
    /// ([`Region::set_backing`](crate::Region::set_backing),
    /// [`Region::writeback`](crate::Region::writeback)): what it was, and why.
    #[error("{what}: {cause}")]
    Zram {
        what: &'static str,
        cause: ZramError,
    },
    /// [`Region::evict`](crate::Region::evict) tried for [`EVICT_WAITS_OUT`](crate::EVICT_WAITS_OUT)
    /// and the kernel refused every move: the program's address space kept changing (drops,
    /// unmaps or moves whose events the fault thread had not read yet). The page stays
    /// resident; a later call may move it.
    #[error(
        "page {page} stays resident: the address space kept changing for {waited:?} (drops, \
         unmaps or moves not yet read by the fault thread), and the kernel refused every move \
         meanwhile"
    )]
    AddressSpaceBusy {
        page: u64,
        waited: std::time::Duration,
    },
    /// A page the reclaim could not move out, and why: it stays resident, and reclaim
    /// backs off (waiting longer each time nothing can go) until the program undoes it.
    #[error("page {page} cannot be evicted: {reason}; reclaim backs off while it stays so")]
    Unmovable { page: u64, reason: UnmovableReason },
}

/// Why a page cannot be moved out of the region ([`Error::Unmovable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmovableReason {
    /// The program locked it in memory (`mlock`, `MCL_CURRENT`).
    Locked,
    /// The program made it read-only (`mprotect`).
    ReadOnly,
    /// The kernel refused the move for another reason (its errno).
    Other(i32),
}

impl std::fmt::Display for UnmovableReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnmovableReason::Locked => f.write_str("the program locked it in memory (mlock)"),
            UnmovableReason::ReadOnly => {
                f.write_str("the program made it read-only (mprotect): only writable pages move")
            }
            UnmovableReason::Other(e) => write!(
                f,
                "UFFDIO_MOVE refused it: {}",
                std::io::Error::from_raw_os_error(*e)
            ),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
