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

/// The most ranges one `process_madvise` call takes (`UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// A pidfd of this process, for `process_madvise` on its own memory; `None` where the
/// kernel has no pidfds. Opened once; the pid it was opened for is kept beside it, so a
/// forked child (whose pid differs) never uses its parent's.
fn own_pidfd() -> Option<libc::c_int> {
    static PIDFD: std::sync::OnceLock<Option<(libc::pid_t, libc::c_int)>> =
        std::sync::OnceLock::new();
    let (pid, fd) = (*PIDFD.get_or_init(|| {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        // SAFETY: pidfd_open takes no pointers; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        (fd >= 0).then_some((pid, fd as libc::c_int))
    }))?;
    // SAFETY: getpid has no preconditions.
    (unsafe { libc::getpid() } == pid).then_some(fd)
}

/// Whether `process_madvise(MADV_DONTNEED)` on this process worked (it needs Linux 5.10
/// and, for a destructive advice on the caller's own memory, a kernel that allows it);
/// cleared at its first failure, after which every run gets its own `madvise`.
static VECTOR_RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Returns many runs of free pages to the OS, each `(start, bytes)`, in as few system calls
/// as the kernel allows: `process_madvise` on the process's own memory takes up to
/// [`IOV_MAX`] runs a call and flushes the TLB once for all of them (one interrupt of each
/// other core running the process, where a `madvise` a run sends one per run), else one
/// `madvise` a run. The runs obey [`release`]'s contract.
pub(super) fn release_runs(runs: &[(NonNull<u8>, usize)]) {
    use std::sync::atomic::Ordering::Relaxed;
    for group in runs.chunks(IOV_MAX) {
        let mut done = 0;
        if group.len() > 1 && VECTOR_RELEASE.load(Relaxed) {
            if let Some(fd) = own_pidfd() {
                let iov: Vec<libc::iovec> = group
                    .iter()
                    .map(|&(ptr, len)| libc::iovec {
                        iov_base: ptr.as_ptr().cast(),
                        iov_len: len,
                    })
                    .collect();
                // SAFETY: iov holds group.len() valid iovecs naming runs that obey
                // `release`'s contract (free pages of our mappings no one else can reach);
                // the kernel only discards those ranges' contents, here or (refusing a
                // destructive advice on another process) nowhere.
                let advised = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        fd,
                        iov.as_ptr(),
                        iov.len(),
                        libc::MADV_DONTNEED,
                        0,
                    )
                };
                if advised < 0 {
                    VECTOR_RELEASE.store(false, Relaxed);
                } else {
                    // The bytes of the runs advised, from the first: whole runs, then
                    // perhaps part of one, which is advised again whole below (advising a
                    // free page twice changes nothing).
                    let mut bytes = advised as usize;
                    while done < group.len() && bytes >= group[done].1 {
                        bytes -= group[done].1;
                        done += 1;
                    }
                }
            }
        }
        for &(ptr, len) in &group[done..] {
            release(ptr, len);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every other page of a chunk released as one vector of runs: those read as zeros, the
    /// others keep their bytes.
    #[test]
    fn runs_are_released_and_nothing_else() {
        let page = os_page_size();
        let chunk = map_chunk().unwrap();
        // SAFETY: the chunk is this test's alone, CHUNK_BYTES long and mapped writable.
        let bytes = unsafe { std::slice::from_raw_parts_mut(chunk.as_ptr(), CHUNK_BYTES) };
        bytes.fill(0xA7);
        let pages = CHUNK_BYTES / page;
        let runs: Vec<(NonNull<u8>, usize)> = (0..pages)
            .step_by(2)
            .map(|i| (NonNull::new(bytes[i * page..].as_mut_ptr()).unwrap(), page))
            .collect();
        release_runs(&runs);
        for i in 0..pages {
            let released = i % 2 == 0;
            let p = &bytes[i * page..(i + 1) * page];
            assert!(
                p.iter().all(|&b| b == if released { 0 } else { 0xA7 }),
                "page {i}"
            );
        }
        if !VECTOR_RELEASE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("process_madvise(MADV_DONTNEED) refused here: one madvise a run");
        }
        // SAFETY: the chunk came from map_chunk and nothing refers to it after this.
        unsafe { unmap_chunk(chunk) };
    }
}
