//! The kernel's own path for the pages a region would hold, measured beside it where this
//! machine has one: the pages copied into a plain anonymous mapping (no userfaultfd),
//! pushed out with `MADV_PAGEOUT` (through zswap into the swap device behind it) and touched
//! back, first in order, then one page at a time (pushed out alone, touched, timed), as a
//! region's single-page faults are timed. It needs what the kernel needs for that path: swap
//! on with room for the pages, and zswap on (without it the pages would go to the swap
//! device, a disk path, which is no comparison for a compressed tier); where it is missing,
//! [`kernel_pageout`] says what is.
//!
//! Invariants: the mapping is this module's alone and only the calling thread touches it;
//! every page that went out went through zswap (`/proc/vmstat`), and every page comes back
//! equal to the one given (else an error). No locks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::mapping::PlainPages;

/// `MADV_PAGEOUT` calls over the whole mapping at most: a page still in a per-CPU LRU batch
/// is passed over by one call (the kernel's own truth script repeats it the same way).
const PAGEOUT_TRIES: usize = 4;

/// Tries per timed single-page fault before the latency pass gives up (a page that will
/// not go out, or an all-zero page, is passed over).
const TRIES_PER_SAMPLE: usize = 20;

/// Why the kernel's own path is not there for the pages (each says what is missing; the
/// kinds are what tests and callers match on, the text what a user reads). An OS error is
/// kept whole (shared, so the reason can be cloned into a run's report) and said in the
/// message, not also as a `source`: callers print this by its message.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NoKernelPath {
    /// zswap's parameter at `path` cannot be read: no zswap in this kernel.
    #[error("{path}: {error} (no zswap here)")]
    NoZswap {
        path: String,
        error: Arc<std::io::Error>,
    },
    /// zswap is not enabled (`path` reads `enabled`, not `Y`).
    #[error(
        "zswap is off ({path} is {enabled}): MADV_PAGEOUT would write the pages to the swap \
         device, not compress them"
    )]
    ZswapOff { path: String, enabled: String },
    /// `/proc/swaps` cannot be read (the OS's reason).
    #[error("/proc/swaps: {0}")]
    SwapsUnreadable(Arc<std::io::Error>),
    /// No swap device is on.
    #[error("no swap is on (/proc/swaps): zswap needs a swap device behind it")]
    NoSwap,
    /// The swap devices have `free` bytes free; the pages need `need` bytes.
    #[error("the swap devices have {free} bytes free (/proc/swaps), the pages need {need}")]
    SwapTooSmall { free: u64, need: usize },
    /// Every page stayed resident through every `MADV_PAGEOUT`.
    #[error("MADV_PAGEOUT moved no page out (a memory cgroup's swap limit, locked memory?)")]
    NothingMoved,
    /// Of `went_out` pages pushed out, only `through_zswap` went through zswap.
    #[error(
        "only {through_zswap} of the {went_out} pages that went out went through zswap \
         (/proc/vmstat zswpout and swpout_zero): the others went to the swap device"
    )]
    WentToSwapDevice { through_zswap: u64, went_out: usize },
    /// No page pushed out alone left memory, so no single-page fault could be timed.
    #[error("no single page went out with MADV_PAGEOUT to be timed")]
    NoSinglePage,
}

/// What [`kernel_pageout`] refuses or meets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PageoutError {
    /// The kernel's own path is not there: what is missing.
    #[error("the kernel's swap path: {0}")]
    Missing(#[from] NoKernelPath),
    /// A page came back from the kernel's swap path different from what went out.
    #[error("page {page} came back from the kernel's swap path different from what went out")]
    Corrupt { page: usize },
    #[error("{len} bytes of pages: the length must be a positive whole number of {page_size}-byte pages")]
    BadPages { len: usize, page_size: usize },
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
}

type Result<T, E = PageoutError> = std::result::Result<T, E>;

/// What the kernel made of the pages.
#[derive(Debug, Clone)]
pub struct KernelPageout {
    /// zswap's compressor (`/sys/module/zswap/parameters/compressor`).
    pub compressor: String,
    /// The system's page size, the pages' size.
    pub page_size: usize,
    /// Pages given, and of them those `MADV_PAGEOUT` left resident.
    pub pages: usize,
    pub left_resident: usize,
    /// The `MADV_PAGEOUT` calls over the whole mapping.
    pub pageout: Duration,
    /// One word of every page read in order, pages that went out faulting back in.
    pub faultin: Duration,
    /// Single pages pushed out alone and touched, the touch timed, in the order taken
    /// (all-zero pages not drawn).
    pub latency: Vec<Duration>,
}

/// The kernel's path for `data` (whole pages of the system's page size): pageout and
/// fault-in times, and `samples` single-page fault latencies. Refuses, saying why
/// ([`NoKernelPath`]), where the path is missing (no swap, no room on it, zswap off), or
/// ([`PageoutError::Corrupt`]) where a page comes back different.
pub fn kernel_pageout(data: &[u8], samples: usize) -> Result<KernelPageout> {
    let ps = ztier_base::os::page_size();
    if data.is_empty() || !data.len().is_multiple_of(ps) {
        return Err(PageoutError::BadPages {
            len: data.len(),
            page_size: ps,
        });
    }
    let compressor = zswap_compressor()?;
    let free = swap_free_bytes()?;
    if free < data.len() as u64 {
        return Err(NoKernelPath::SwapTooSmall {
            free,
            need: data.len(),
        }
        .into());
    }
    let os = |what| move |source| PageoutError::Os { what, source };
    let pages = data.len() / ps;
    let mut map = PlainPages::new(data.len()).map_err(os("mmap"))?;
    map.fill(data);

    let before = zswap_outs();
    let t = Instant::now();
    let mut left = pages;
    for _ in 0..PAGEOUT_TRIES {
        map.page_out(0, data.len())
            .map_err(os("madvise(MADV_PAGEOUT)"))?;
        let now_left = map.resident_pages(0, data.len()).map_err(os("mincore"))?;
        let progress = now_left < left;
        left = now_left;
        if left == 0 || !progress {
            break;
        }
    }
    let pageout = t.elapsed();
    // Every page that went out went through zswap (stored, or a zero page the swap layer
    // keeps as nothing), not to the swap device: else this is a disk path. Other processes'
    // swap-outs meanwhile only add to the count.
    let through_zswap = zswap_outs().saturating_sub(before);
    if left == pages {
        return Err(NoKernelPath::NothingMoved.into());
    }
    if through_zswap < (pages - left) as u64 {
        return Err(NoKernelPath::WentToSwapDevice {
            through_zswap,
            went_out: pages - left,
        }
        .into());
    }

    let t = Instant::now();
    let mut sum = 0u8;
    for page in 0..pages {
        // Faults the page back in (or finds it resident).
        sum ^= map.touch(page * ps);
    }
    let faultin = t.elapsed();
    std::hint::black_box(sum);
    check_equal(&map, data, ps)?;

    let mut latency = Vec::with_capacity(samples.min(pages));
    let mut draws = ztier_base::rng::Rng::from_state(0x9E37_79B9_7F4A_7C15);
    for _ in 0..samples.saturating_mul(TRIES_PER_SAMPLE) {
        if latency.len() == samples {
            break;
        }
        let page = draws.below(pages as u64) as usize;
        let offset = page * ps;
        if data[offset..offset + ps].iter().all(|&b| b == 0) {
            continue;
        }
        map.page_out(offset, ps)
            .map_err(os("madvise(MADV_PAGEOUT)"))?;
        if map.resident_pages(offset, ps).map_err(os("mincore"))? != 0 {
            continue;
        }
        let t = Instant::now();
        let byte = map.touch(offset);
        latency.push(t.elapsed());
        std::hint::black_box(byte);
    }
    check_equal(&map, data, ps)?;
    if samples > 0 && latency.is_empty() {
        return Err(NoKernelPath::NoSinglePage.into());
    }
    Ok(KernelPageout {
        compressor,
        page_size: ps,
        pages,
        left_resident: left,
        pageout,
        faultin,
        latency,
    })
}

/// Every page of the mapping equal to `data`'s (a page still out is faulted back by the
/// kernel itself as it is read: no userfaultfd here).
fn check_equal(map: &PlainPages, data: &[u8], ps: usize) -> Result<()> {
    match map.first_difference(data, ps) {
        None => Ok(()),
        Some(page) => Err(PageoutError::Corrupt { page }),
    }
}

/// Pages the swap layer has sent through zswap so far: stored there (`zswpout`) or, being
/// all zero, kept as nothing (`swpout_zero`), from `/proc/vmstat` (0 for a field it lacks).
fn zswap_outs() -> u64 {
    let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vmstat
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(name, _)| matches!(*name, "zswpout" | "swpout_zero"))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum()
}

/// zswap's compressor, if zswap is on.
fn zswap_compressor() -> Result<String> {
    let params = "/sys/module/zswap/parameters";
    let read = |name: &str| {
        std::fs::read_to_string(format!("{params}/{name}"))
            .map(|s| s.trim().to_string())
            .map_err(|e| NoKernelPath::NoZswap {
                path: format!("{params}/{name}"),
                error: Arc::new(e),
            })
    };
    let enabled = read("enabled")?;
    if enabled != "Y" {
        return Err(NoKernelPath::ZswapOff {
            path: format!("{params}/enabled"),
            enabled,
        }
        .into());
    }
    Ok(read("compressor")?)
}

/// Bytes free on the swap devices that are on (`/proc/swaps`: size and used in KiB).
fn swap_free_bytes() -> Result<u64> {
    let swaps = std::fs::read_to_string("/proc/swaps")
        .map_err(|e| NoKernelPath::SwapsUnreadable(Arc::new(e)))?;
    let devices: Vec<(u64, u64)> = swaps
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let size = f.get(2)?.parse::<u64>().ok()?;
            let used = f.get(3)?.parse::<u64>().ok()?;
            Some((size, used))
        })
        .collect();
    if devices.is_empty() {
        return Err(NoKernelPath::NoSwap.into());
    }
    Ok(devices
        .iter()
        .map(|(size, used)| size.saturating_sub(*used) * 1024)
        .sum())
}
