//! A part of the floor under a region's fault-in of whole units on this machine (a
//! reference, ztier-replay's `uffd_units`): the kernel's own copy-in of pages that are
//! ready, with none of ztier's work and no fault in it. Ready
//! pages are copied into an empty mapping registered with a userfaultfd of the rig's own
//! (`UFFDIO_COPY`) a unit at a time, as a region's fault thread installs a unit it has
//! decompressed: the unit's first page alone, then the rest (write-protected where the
//! region keeps clean pages; registered as a region is, for missing pages and write
//! protection). What that costs is the frames' allocation, the copy and the page-table
//! entries: the kernel's part of every page a region copies in (not of the zero pages it
//! maps), whatever it does before. The mapping is emptied between passes, outside the
//! timing.
//!
//! Invariants: the mapping is this module's alone and nothing reads it; only the kernel's
//! copies write it. No threads, no locks.

use std::time::Instant;

use crate::mapping::PlainPages;
use crate::userfaultfd::{self, Uffd};
use crate::{Error, Result};

/// At most this many pages (512 MiB) a pass, the pass's memory being the bench's on top
/// of its regions'. Fewer pages than a region's pass copies would flatter it: a lone
/// process copied 16 Ki pages in at 4800-6700 MB/s, 72 Ki and more at 4200-4600 MB/s,
/// the same up to 250 Ki (2026-12-01, 64 KiB units): small passes reuse frames still in
/// the caches.
pub const MAX_PAGES: usize = 131072;

/// MB of pages a second copied in, over one pass of `pages` pages (at most [`MAX_PAGES`])
/// in units of `unit_pages`, write-protected if `write_protect`.
pub fn copy_in_mb_s(pages: usize, unit_pages: usize, write_protect: bool) -> Result<f64> {
    let page_size = ztier_base::os::page_size();
    let unit_pages = unit_pages.max(1);
    let pages = pages.clamp(unit_pages, MAX_PAGES.max(unit_pages)) / unit_pages * unit_pages;
    let os = |what| move |source| Error::Os { what, source };
    let uffd = Uffd::open().map_err(Error::NotPermitted)?;
    uffd.api(0).map_err(os("UFFDIO_API"))?;
    let mut map = PlainPages::new(pages * page_size).map_err(os("mmap"))?;
    let mode = userfaultfd::MODE_MISSING | userfaultfd::MODE_WP;
    uffd.register(map.addr(), map.len() as u64, mode)
        .map_err(os("UFFDIO_REGISTER"))?;
    // The unit as a fault thread has it after decompressing it: warm, not zeros.
    let unit: Vec<u8> = (0..unit_pages * page_size).map(|i| i as u8 | 1).collect();
    let copy = |at: u64, bytes: &[u8]| {
        uffd.copy_run(at, bytes, write_protect)
            .1
            .map_err(|e| Error::Os {
                what: "UFFDIO_COPY",
                source: std::io::Error::from_raw_os_error(e),
            })
    };
    // A first pass untimed, so that the frames the timed one gets are the allocator's
    // ready ones, as a region's are after its evictions.
    let mut took = 0.0;
    for timed in [false, true] {
        map.drop_pages(0, map.len()).map_err(os("madvise"))?;
        let began = Instant::now();
        for first in (0..pages).step_by(unit_pages) {
            let at = map.addr() + (first * page_size) as u64;
            let (page, rest) = unit.split_at(page_size);
            copy(at, page)?;
            if !rest.is_empty() {
                copy(at + page_size as u64, rest)?;
            }
        }
        if timed {
            took = began.elapsed().as_secs_f64();
        }
    }
    Ok((pages * page_size) as f64 / took.max(f64::EPSILON) / 1e6)
}
