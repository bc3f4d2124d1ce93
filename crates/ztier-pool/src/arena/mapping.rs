//! The system calls over the arena's memory: mapping a chunk, faulting pages in, releasing
//! them to the OS and unmapping a chunk. Each takes pages the caller owns (said at each
//! call), so none can touch memory anyone else reaches.
#![allow(unsafe_code)]

use std::ptr::NonNull;

use ztier_base::os::page_size as os_page_size;

use super::CHUNK_BYTES;
use crate::{PoolError, Result};

/// Faults in `len` bytes of pages from `start`, which are not resident (untouched or
/// released, so reading as zeros): one `MADV_POPULATE_WRITE` (Linux 5.14), else a zero
/// written to each page, which leaves its bytes as they were.
pub(super) fn populate(start: NonNull<u8>, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    // SAFETY: start..start + len lies in pages of one chunk that the caller owns (taken out
    // of the arena, or a fresh chunk no one else knows yet); populating maps them and
    // leaves their bytes as they are.
    if unsafe { libc::madvise(start.as_ptr().cast(), len, MADV_POPULATE_WRITE) } != 0 {
        touch_pages(start, len);
    }
}

/// Faults in `len` bytes of pages from `start`, which read as zeros (untouched or released),
/// by writing a zero to each OS page, which leaves its bytes as they were.
pub(super) fn touch_pages(start: NonNull<u8>, len: usize) {
    for off in (0..len).step_by(os_page_size()) {
        // SAFETY: off < len, inside pages the caller owns (as for `populate`), which read as
        // zeros, so writing one changes nothing.
        unsafe { start.as_ptr().add(off).write_volatile(0) };
    }
}

/// Maps a chunk; its pages fault in when first written.
pub(super) fn map_chunk() -> Result<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHUNK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(PoolError::OutOfMemory {
            bytes: CHUNK_BYTES,
            reason: std::io::Error::last_os_error().to_string(),
        });
    }
    NonNull::new(p.cast()).ok_or(PoolError::OutOfMemory {
        bytes: CHUNK_BYTES,
        reason: "mmap returned NULL".into(),
    })
}

/// Returns free pages' memory to the OS; their contents read as zero afterwards.
pub(super) fn release(ptr: NonNull<u8>, len: usize) {
    // SAFETY: ptr..ptr+len is consecutive free pages of our mappings that no one else can
    // reach (given back by their chain and on no list yet; the helper's ready chunk while
    // it is out of the slot; or, under the arena's lock, its hot pages or the rest of its
    // fresh run), so discarding their contents can affect no live data.
    unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_DONTNEED) };
}

/// Unmaps a chunk.
///
/// # Safety
/// `base` is the start of a chunk made by [`map_chunk`] and not yet unmapped, and nothing
/// refers to its memory any more (no page of it is out, on a list or being released).
pub(super) unsafe fn unmap_chunk(base: NonNull<u8>) {
    // SAFETY: the caller's contract: the whole mapping is ours and unreferenced.
    unsafe { libc::munmap(base.as_ptr().cast(), CHUNK_BYTES) };
}
