//! An anonymous private mapping (`mmap`), its `madvise`s and its `munmap` at drop: the
//! region's memory, the reclaim thread's landing pad, the floor's pages and the plain
//! mapping the kernel's own path is measured on (`pageout.rs`).
//!
//! Invariants: the mapping lives exactly as long as the value; it is never inherited by a
//! child (`MADV_DONTFORK`: a child would share the region's pages copy-on-write, which
//! `UFFDIO_MOVE` refuses, and would fault on pages no handler serves); it never holds
//! transparent huge pages (`MADV_NOHUGEPAGE`: faults, copies and moves are per 4 KiB page,
//! and khugepaged must not gather pages the protocol tracks one by one). No locks.
#![allow(unsafe_code)]

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Whether the drop unmaps the whole range (else [`Mapping::unmap_runs`] did the part
    /// that was still ours).
    whole: AtomicBool,
}

// SAFETY: the mapping is plain memory owned by the value; which thread reads or changes what
// is the protocol's (lib.rs), and every access through this type is by raw address or
// through `slice`, whose caller answers for it.
unsafe impl Send for Mapping {}
// SAFETY: as Send.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// A new mapping of `len` bytes (a whole number of pages, more than zero), readable and
    /// writable, with no swap reserved for it.
    pub fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing: it touches
        // no existing memory.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap never maps address 0 for us"),
            len,
            whole: AtomicBool::new(true),
        };
        for advice in [libc::MADV_DONTFORK, libc::MADV_NOHUGEPAGE] {
            // SAFETY: advice on our own new mapping; neither changes its content.
            if unsafe { libc::madvise(p, len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(map)
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// `MADV_DONTNEED` of `[offset, offset + len)` (clamped to the mapping): its pages go back
    /// to the OS and read as empty (a userfaultfd fault, or zeros) afterwards. As
    /// `MADV_DONTNEED_LOCKED` (Linux 5.18), so that it works in a process that locked its
    /// memory (`mlockall`) too, where plain `MADV_DONTNEED` is refused (`EINVAL`).
    ///
    /// # Safety
    /// No reference to those bytes may be alive, and their content must be one the caller
    /// means to drop (the region's owner asked for it, or the reclaim thread stored it).
    pub unsafe fn dont_need(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: dropping the content is the caller's contract.
        unsafe { self.advise(offset, len, libc::MADV_DONTNEED_LOCKED) }
    }

    /// `MADV_PAGEOUT` of `[offset, offset + len)` (clamped to the mapping): the kernel
    /// reclaims those pages now, as its own reclaim would (through zswap and swap, for an
    /// anonymous mapping), keeping their content.
    pub fn page_out(&self, offset: usize, len: usize) -> io::Result<()> {
        // SAFETY: the advice changes no byte of the range (a page pushed out reads back the
        // same).
        unsafe { self.advise(offset, len, libc::MADV_PAGEOUT) }
    }

    /// `madvise(advice)` of `[offset, offset + len)`, clamped to the mapping.
    ///
    /// # Safety
    /// What the advice does to those bytes must be what the caller means (`MADV_DONTNEED`
    /// drops them: no reference to them may be alive).
    unsafe fn advise(&self, offset: usize, len: usize, advice: libc::c_int) -> io::Result<()> {
        let len = len.min(self.len.saturating_sub(offset));
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside our mapping (clamped above); the advice's effect on it
        // is the caller's contract.
        let r = unsafe { libc::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// How many pages of `[offset, offset + len)` (clamped to the mapping, `offset` a whole
    /// number of pages) are resident (`mincore`).
    pub fn resident_pages(&self, offset: usize, len: usize) -> io::Result<usize> {
        Ok(self
            .residency(offset, len)?
            .into_iter()
            .filter(|&r| r)
            .count())
    }

    /// For each page of `[offset, offset + len)` (clamped to the mapping, `offset` a whole
    /// number of pages), whether it is resident (`mincore`: present in the page table, or
    /// in the swap cache).
    pub fn residency(&self, offset: usize, len: usize) -> io::Result<Vec<bool>> {
        let len = len.min(self.len.saturating_sub(offset));
        let ps = ztier_base::os::page_size();
        if len == 0 {
            return Ok(Vec::new());
        }
        if !offset.is_multiple_of(ps) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut vec = vec![0u8; len.div_ceil(ps)];
        // SAFETY: the range is inside our mapping and page-aligned (checked above); `vec`
        // has the one byte per page that mincore writes.
        let r =
            unsafe { libc::mincore(self.ptr.as_ptr().add(offset).cast(), len, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.into_iter().map(|b| b & 1 != 0).collect())
    }

    /// Unmaps the byte ranges `runs` (each inside the mapping) now, and nothing more at the
    /// drop: for a mapping part of which the program unmapped or moved itself, whose
    /// addresses may hold the program's own mappings since.
    ///
    /// # Safety
    /// Nothing may use the mapping afterwards (the caller is its owner's drop).
    pub unsafe fn unmap_runs(&self, runs: impl Iterator<Item = (usize, usize)>) {
        self.whole.store(false, Relaxed);
        for (offset, len) in runs {
            assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
            // SAFETY: inside our mapping (checked), and no longer used (the caller's
            // contract).
            unsafe { libc::munmap(self.ptr.as_ptr().add(offset).cast(), len) };
        }
    }

    /// The bytes `[offset, offset + len)`.
    ///
    /// # Safety
    /// The range must be inside the mapping, its pages present (a fault on a registered
    /// page from the thread that serves faults would wait for itself), and nothing may
    /// change them while the slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.whole.load(Relaxed) {
            // SAFETY: our own mapping, unmapped once; nothing borrows it past the value's
            // life.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_says_which_pages_are_in_memory() {
        let ps = ztier_base::os::page_size();
        let m = Mapping::new(4 * ps).unwrap();
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false; 4]);
        // SAFETY: inside our own mapping, which no userfaultfd watches: each write faults in
        // a page of zeros and sets its first byte.
        unsafe {
            m.ptr().add(ps).write(1);
            m.ptr().add(3 * ps).write(1);
        }
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false, true, false, true]);
        assert_eq!(m.resident_pages(0, 4 * ps).unwrap(), 2);
        // Clamped to the mapping.
        assert_eq!(m.residency(2 * ps, 8 * ps).unwrap(), [false, true]);
        assert_eq!(m.residency(4 * ps, ps).unwrap(), []);
        assert_eq!(
            m.residency(1, ps).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // SAFETY: no reference to the page is alive; its byte is ours to drop.
        unsafe { m.dont_need(ps, ps).unwrap() };
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false, false, false, true]);
    }
}

/// What the kernel says of the mapping at an address: the program may lock or protect its
/// own memory, and the region must say so when that keeps pages from moving out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MappingFlags {
    /// Locked in memory (`mlock`): `VmFlags` has `lo`.
    pub(crate) locked: bool,
    /// Writable: the permissions have `w`.
    pub(crate) writable: bool,
}

/// The flags of this process's mapping holding `addr` (`/proc/self/smaps`); `None` if no
/// mapping holds it or the file cannot be read.
pub(crate) fn flags_of(addr: u64) -> Option<MappingFlags> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut inside: Option<bool> = None;
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = head.split_once('-') {
            if let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                if inside.is_some() {
                    // The mapping ended without a VmFlags line: no flags said.
                    return None;
                }
                if (a..b).contains(&addr) {
                    let perms = line.split_whitespace().nth(1).unwrap_or("");
                    inside = Some(perms.as_bytes().get(1) == Some(&b'w'));
                }
                continue;
            }
        }
        if let (Some(writable), Some(flags)) = (inside, line.strip_prefix("VmFlags:")) {
            let locked = flags.split_whitespace().any(|f| f == "lo");
            return Some(MappingFlags { locked, writable });
        }
    }
    None
}
