//! Anonymous memory taken from the OS by the process itself: [`Mapping`], a private
//! anonymous `mmap` owned by its value and unmapped at its drop, with its `madvise`s and
//! `mincore`; and the calls over pages of such a mapping that their owner reaches by address
//! rather than through the value ([`populate`], [`discard`], [`discard_runs`]); and
//! [`MappedBytes`], a mapping used as a plain byte buffer. The page arena's 2 MiB chunks
//! (ztier-pool), the userfaultfd region's memory, landing pad and plain pages (ztier-uffd)
//! and the NBD server's payload buffers (ztier-nbd, as `MappedBytes`) are all `Mapping`s;
//! what each does with its pages (the arena's free lists, the region's moves) stays in its
//! own crate, built on these.
//!
//! Invariants: a mapping is unmapped exactly once, at its value's drop (all of it, or only
//! the ranges its owner still holds: [`Mapping::unmap_only_at_drop`]), or never
//! ([`Mapping::leak`]); every range a method hands the kernel lies inside the mapping
//! (clamped or checked first). Nothing here forms a reference to a mapping's bytes but
//! [`Mapping::slice`], whose caller answers for them, and [`MappedBytes`], whose mapping
//! nothing else reaches; advice that keeps the bytes is safe,
//! advice that drops them ([`Discard`]) is `unsafe`, since a reference into them would see
//! them change. No locks (one process-wide flag: whether `process_madvise` works here).
#![allow(unsafe_code)]

use std::io;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::os::page_size;

/// A call on a mapping the kernel refused, with what was asked.
#[derive(Debug, thiserror::Error)]
pub enum MappingError {
    #[error("mmap of {len} bytes: {source}")]
    Map { len: usize, source: io::Error },
    #[error("madvise({advice}) of {len} bytes: {source}")]
    Advise {
        advice: &'static str,
        len: usize,
        source: io::Error,
    },
    #[error("mincore of {len} bytes: {source}")]
    Residency { len: usize, source: io::Error },
    #[error("offset or address {offset:#x} is not a whole number of pages")]
    Unaligned { offset: usize },
}

impl From<MappingError> for io::Error {
    /// The kernel's own error (its errno kept), or `InvalidInput` for an unaligned offset.
    fn from(e: MappingError) -> io::Error {
        match e {
            MappingError::Map { source, .. }
            | MappingError::Advise { source, .. }
            | MappingError::Residency { source, .. } => source,
            MappingError::Unaligned { .. } => io::Error::from(io::ErrorKind::InvalidInput),
        }
    }
}

/// Advice that keeps a mapping's bytes as they are, so any owner may give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advice {
    /// `MADV_DONTFORK`: a child process does not inherit the range.
    DontFork,
    /// `MADV_NOHUGEPAGE`: the range is never backed by transparent huge pages.
    NoHugePage,
    /// `MADV_PAGEOUT` (Linux 5.4): the kernel reclaims the pages now, as its own reclaim
    /// would (through zswap and swap); they read back the same.
    PageOut,
    /// `MADV_POPULATE_WRITE` (Linux 5.14): the pages are faulted in, writable, in one call.
    PopulateWrite,
}

/// `MADV_POPULATE_WRITE`, which older libc crates do not name.
const MADV_POPULATE_WRITE: libc::c_int = 23;

impl Advice {
    fn raw(self) -> (libc::c_int, &'static str) {
        match self {
            Advice::DontFork => (libc::MADV_DONTFORK, "MADV_DONTFORK"),
            Advice::NoHugePage => (libc::MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE"),
            Advice::PageOut => (libc::MADV_PAGEOUT, "MADV_PAGEOUT"),
            Advice::PopulateWrite => (MADV_POPULATE_WRITE, "MADV_POPULATE_WRITE"),
        }
    }
}

/// Advice that drops a range's bytes: its pages go back to the OS and read as empty (zeros,
/// or a userfaultfd fault where the range is registered) afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    /// `MADV_DONTNEED`, refused (`EINVAL`) on memory the process locked.
    DontNeed,
    /// `MADV_DONTNEED_LOCKED` (Linux 5.18): as `DontNeed`, and it works in a process that
    /// locked its memory (`mlockall`) too.
    DontNeedLocked,
}

impl Discard {
    fn raw(self) -> (libc::c_int, &'static str) {
        match self {
            Discard::DontNeed => (libc::MADV_DONTNEED, "MADV_DONTNEED"),
            Discard::DontNeedLocked => (libc::MADV_DONTNEED_LOCKED, "MADV_DONTNEED_LOCKED"),
        }
    }
}

/// An anonymous private mapping, readable and writable, with no swap reserved for it
/// (`MAP_NORESERVE`), unmapped at its drop. Its pages fault in when first touched.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Byte ranges to unmap at the drop, if not the whole.
    unmap_only: Option<Vec<Range<usize>>>,
}

// SAFETY: the mapping is plain memory owned by the value; Rust reaches its bytes only through
// `slice` (whose caller keeps every writer out) or by address, under its owner's own rules.
unsafe impl Send for Mapping {}
// SAFETY: as Send; every `&self` method is a system call on the range or an `unsafe fn`.
unsafe impl Sync for Mapping {}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

impl Mapping {
    /// A new mapping of `len` bytes (more than zero; rounded up to whole pages by the
    /// kernel) at an address of the kernel's choosing.
    pub fn anonymous(len: usize) -> Result<Mapping, MappingError> {
        // SAFETY: a new anonymous mapping at an address of the kernel's choosing: it touches
        // no existing memory; the result is checked before use.
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
            return Err(MappingError::Map {
                len,
                source: io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| MappingError::Map {
            len,
            source: io::Error::other("mmap returned address 0"),
        })?;
        Ok(Mapping {
            ptr,
            len,
            unmap_only: None,
        })
    }

    /// The first byte's address.
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The first byte's address, as a number.
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a mapping has bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `[offset, offset + len)` clamped to the mapping, as a start address and a length
    /// (0 when nothing of it is inside).
    fn clamp(&self, offset: usize, len: usize) -> (NonNull<u8>, usize) {
        let offset = offset.min(self.len);
        let len = len.min(self.len - offset);
        // SAFETY: offset <= self.len: at most one past the mapping's end, which `add` allows.
        (unsafe { self.ptr.add(offset) }, len)
    }

    /// Gives `advice` for `[offset, offset + len)`, clamped to the mapping.
    pub fn advise(&self, offset: usize, len: usize, advice: Advice) -> Result<(), MappingError> {
        let (start, len) = self.clamp(offset, len);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range is inside our mapping (clamped); the advice keeps its bytes.
        unsafe { madvise(start, len, advice.raw()) }
    }

    /// Drops the bytes of `[offset, offset + len)`, clamped to the mapping, as `how` says.
    ///
    /// # Safety
    /// No reference to those bytes may be alive but atomic ones, and their content must be
    /// one the caller means to drop.
    pub unsafe fn discard(
        &self,
        offset: usize,
        len: usize,
        how: Discard,
    ) -> Result<(), MappingError> {
        let (start, len) = self.clamp(offset, len);
        if len == 0 {
            return Ok(());
        }
        // SAFETY: inside our mapping (clamped); dropping the bytes is the caller's contract.
        unsafe { discard(start, len, how) }
    }

    /// For each page of `[offset, offset + len)` (clamped to the mapping, `offset` a whole
    /// number of pages), whether it is resident (`mincore`: present in the page table, or in
    /// the swap cache).
    pub fn residency(&self, offset: usize, len: usize) -> Result<Vec<bool>, MappingError> {
        let (start, len) = self.clamp(offset, len);
        if len == 0 {
            return Ok(Vec::new());
        }
        if !offset.is_multiple_of(page_size()) {
            return Err(MappingError::Unaligned { offset });
        }
        residency_at(start, len)
    }

    /// The bytes `[offset, offset + len)`. Panics if the range is not inside the mapping.
    ///
    /// # Safety
    /// Reading the range must not wait on the caller (a missing page of a range registered
    /// with a userfaultfd the caller serves), and nothing may change its bytes while the
    /// slice lives.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len));
        // SAFETY: inside the mapping (checked), which outlives the borrow; the rest is the
        // caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// Unmaps only the byte ranges `runs` (each inside the mapping; panics otherwise) at the
    /// drop, not the whole: for a mapping part of which its owner's program unmapped or
    /// moved itself, whose addresses may hold the program's own mappings since.
    pub fn unmap_only_at_drop(&mut self, runs: Vec<Range<usize>>) {
        for run in &runs {
            assert!(run.start <= run.end && run.end <= self.len);
        }
        self.unmap_only = Some(runs);
    }

    /// Lets go of the mapping without unmapping it: for memory something may still reach
    /// by address (an arena's pages owned by chains that outlived it). Never unmapped then.
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        match &self.unmap_only {
            // SAFETY: our own mapping, unmapped once; nothing borrows it past the value's
            // life.
            None => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.len);
            },
            Some(runs) => {
                for run in runs {
                    // SAFETY: inside our mapping (checked when given), and no longer used:
                    // this is the value's drop.
                    unsafe { libc::munmap(self.ptr.as_ptr().add(run.start).cast(), run.len()) };
                }
            }
        }
    }
}

/// An anonymous mapping used as a plain byte buffer, safely: its [`Mapping`] is its own and
/// its address is never given out, so nothing reaches the bytes but through it (no
/// userfaultfd watches them, nothing else drops or moves their pages) and it derefs to a
/// byte slice. For a buffer that goes back to the OS at its drop, whatever an allocator
/// would have kept.
pub struct MappedBytes(Mapping);

impl MappedBytes {
    /// `len` bytes (more than zero), reading as zeros until written.
    pub fn new(len: usize) -> Result<MappedBytes, MappingError> {
        Mapping::anonymous(len).map(MappedBytes)
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("MappedBytes").field(&self.0).finish()
    }
}

impl std::ops::Deref for MappedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the whole mapping, which lives as long as `self`; its address is never
        // given out, so no userfaultfd watches it (a read never waits on anyone) and its
        // bytes change only through `&mut self`, which this borrow excludes.
        unsafe { self.0.slice(0, self.0.len()) }
    }
}

impl std::ops::DerefMut for MappedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: the whole mapping, readable and writable, live as long as `self`; the
        // exclusive borrow of `self` makes this the only reference to its bytes (their
        // address is never given out), and no page of it is ever missing (no userfaultfd).
        unsafe { std::slice::from_raw_parts_mut(self.0.ptr().as_ptr(), self.0.len()) }
    }
}

/// Faults in the pages of `len` bytes from `start`, which read as zeros (untouched or
/// discarded): one `MADV_POPULATE_WRITE` (Linux 5.14), else [`fault_in_by_writes`].
///
/// # Safety
/// `start..start + len` lies inside one live [`Mapping`], in pages that read as zeros and
/// that no one else reaches meanwhile (populating maps them and leaves their bytes as they
/// are; the fallback writes zeros).
pub unsafe fn populate(start: NonNull<u8>, len: usize) {
    // SAFETY: inside a live mapping (the caller's contract); populating leaves the bytes.
    if unsafe { libc::madvise(start.as_ptr().cast(), len, MADV_POPULATE_WRITE) } != 0 {
        // SAFETY: the caller's contract, as for this function.
        unsafe { fault_in_by_writes(start, len) };
    }
}

/// Faults in the pages of `len` bytes from `start` with one `MADV_POPULATE_WRITE` and no
/// fallback, leaving every byte as it is: pages that others may be writing meanwhile can be
/// populated this way (a fallback's writes could not). Returns whether the OS did it (it
/// needs Linux 5.14); a refusal changes nothing.
///
/// # Safety
/// `start..start + len` lies inside one live [`Mapping`], which stays mapped for the call.
pub unsafe fn populate_in_place(start: NonNull<u8>, len: usize) -> bool {
    // SAFETY: inside a live mapping (the caller's contract); populating maps pages and
    // reads or writes no byte of them.
    unsafe { libc::madvise(start.as_ptr().cast(), len, MADV_POPULATE_WRITE) == 0 }
}

/// Faults in the pages of `len` bytes from `start`, which read as zeros, by writing a zero to
/// each OS page, which leaves its bytes as they were. Unlike one `MADV_POPULATE_WRITE`, this
/// never holds the process's mmap lock for the whole range (a page fault takes only the
/// mapping's own lock), so other threads' `mmap` calls are not held up.
///
/// # Safety
/// As for [`populate`].
pub unsafe fn fault_in_by_writes(start: NonNull<u8>, len: usize) {
    for off in (0..len).step_by(page_size()) {
        // SAFETY: off < len, inside the caller's pages of a live mapping, which read as
        // zeros, so writing one changes nothing.
        unsafe { start.as_ptr().add(off).write_volatile(0) };
    }
}

/// Drops the bytes of `len` bytes from `start` as `how` says: their pages go back to the OS
/// and read as empty afterwards.
///
/// # Safety
/// `start..start + len` lies inside one live [`Mapping`]; no reference to those bytes may be
/// alive but atomic ones, and their content must be one the caller means to drop.
pub unsafe fn discard(start: NonNull<u8>, len: usize, how: Discard) -> Result<(), MappingError> {
    // SAFETY: the caller's contract: the range is a live mapping's, its bytes theirs to drop.
    unsafe { madvise(start, len, how.raw()) }
}

/// `madvise(start, len, raw)`, its failure named by the advice's name.
///
/// # Safety
/// `start..start + len` lies inside one live mapping, and the advice is one its owner allows
/// there (one that drops bytes only where they are the caller's to drop).
unsafe fn madvise(
    start: NonNull<u8>,
    len: usize,
    (raw, name): (libc::c_int, &'static str),
) -> Result<(), MappingError> {
    // SAFETY: the caller's contract.
    if unsafe { libc::madvise(start.as_ptr().cast(), len, raw) } != 0 {
        return Err(MappingError::Advise {
            advice: name,
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// For each page of the `len` bytes from `start` (a page boundary), whether it is resident
/// (`mincore`: present in the page table, or in the swap cache). Safe for any address: the
/// kernel only reads its page tables, and refuses (`ENOMEM`) a range not all mapped.
pub fn residency_at(start: NonNull<u8>, len: usize) -> Result<Vec<bool>, MappingError> {
    let ps = page_size();
    let addr = start.as_ptr() as usize;
    if !addr.is_multiple_of(ps) {
        return Err(MappingError::Unaligned { offset: addr });
    }
    let mut vec = vec![0u8; len.div_ceil(ps)];
    // SAFETY: mincore reads no memory at `start`, only the page tables; `vec` has the one
    // byte per page of the range that it writes.
    if unsafe { libc::mincore(start.as_ptr().cast(), len, vec.as_mut_ptr()) } != 0 {
        return Err(MappingError::Residency {
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok(vec.into_iter().map(|b| b & 1 != 0).collect())
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
        let pid = std::process::id() as libc::pid_t;
        // SAFETY: pidfd_open takes no pointers; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        (fd >= 0).then_some((pid, fd as libc::c_int))
    }))?;
    (std::process::id() as libc::pid_t == pid).then_some(fd)
}

/// Whether `process_madvise(MADV_DONTNEED)` on this process worked (it needs Linux 5.10
/// and, for a destructive advice on the caller's own memory, a kernel that allows it);
/// cleared at its first failure, after which every run gets its own `madvise`.
static VECTOR_DISCARD: AtomicBool = AtomicBool::new(true);

/// Drops the bytes of many runs, each `(start, bytes)`, with `MADV_DONTNEED`, in as few
/// system calls as the kernel allows: `process_madvise` on the process's own memory takes up
/// to `UIO_MAXIOV` (1024) runs a call and flushes the TLB once for all of them (one
/// interrupt of each other core running the process, where a `madvise` a run sends one per
/// run), else one `madvise` a run. A run the kernel refuses is left resident (only memory is
/// lost).
///
/// # Safety
/// Each run obeys [`discard`]'s contract.
pub unsafe fn discard_runs(runs: &[(NonNull<u8>, usize)]) {
    for group in runs.chunks(IOV_MAX) {
        let mut done = 0;
        if group.len() > 1 && VECTOR_DISCARD.load(Relaxed) {
            if let Some(fd) = own_pidfd() {
                let iov: Vec<libc::iovec> = group
                    .iter()
                    .map(|&(ptr, len)| libc::iovec {
                        iov_base: ptr.as_ptr().cast(),
                        iov_len: len,
                    })
                    .collect();
                // SAFETY: iov holds group.len() valid iovecs naming runs the caller may drop
                // (this function's contract); the kernel only discards those ranges'
                // contents, here or (refusing a destructive advice on another process)
                // nowhere.
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
                    VECTOR_DISCARD.store(false, Relaxed);
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
            // SAFETY: the caller's contract, run by run.
            let _ = unsafe { discard(ptr, len, Discard::DontNeed) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_says_which_pages_are_in_memory() {
        let ps = page_size();
        let m = Mapping::anonymous(4 * ps).unwrap();
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false; 4]);
        // SAFETY: inside our own mapping, which no userfaultfd watches and no reference
        // reaches: each write faults in a page of zeros and sets its first byte.
        unsafe {
            m.ptr().as_ptr().add(ps).write(1);
            m.ptr().as_ptr().add(3 * ps).write(1);
        }
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false, true, false, true]);
        // Clamped to the mapping.
        assert_eq!(m.residency(2 * ps, 8 * ps).unwrap(), [false, true]);
        assert_eq!(m.residency(4 * ps, ps).unwrap(), []);
        assert!(matches!(
            m.residency(1, ps),
            Err(MappingError::Unaligned { offset: 1 })
        ));
        // SAFETY: no reference into the mapping is alive; its bytes are this test's.
        unsafe { m.discard(ps, ps, Discard::DontNeed).unwrap() };
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [false, false, false, true]);
        // A discarded page reads as zeros; a kept one keeps its byte.
        // SAFETY: every page is present or reads as zeros; nothing writes meanwhile.
        let bytes = unsafe { m.slice(0, 4 * ps) };
        assert_eq!((bytes[ps], bytes[3 * ps]), (0, 1));
        // Populating faults pages in and keeps their bytes.
        m.advise(0, 4 * ps, Advice::PopulateWrite).unwrap();
        assert_eq!(m.residency(0, 4 * ps).unwrap(), [true; 4]);
        assert_eq!(bytes[3 * ps], 1);
    }

    /// Every other page of a mapping discarded as one vector of runs: those read as zeros,
    /// the others keep their bytes.
    #[test]
    fn runs_are_discarded_and_nothing_else() {
        let page = page_size();
        let pages = 512;
        let m = Mapping::anonymous(pages * page).unwrap();
        // SAFETY: the mapping is this test's alone, mapped writable; no other reference.
        unsafe { std::ptr::write_bytes(m.ptr().as_ptr(), 0xA7, m.len()) };
        let runs: Vec<(NonNull<u8>, usize)> = (0..pages)
            .step_by(2)
            // SAFETY: i < pages: inside the mapping.
            .map(|i| (unsafe { m.ptr().add(i * page) }, page))
            .collect();
        // SAFETY: the runs are inside the mapping, and no reference into it is alive.
        unsafe { discard_runs(&runs) };
        // SAFETY: every page present or reading as zeros; nothing writes meanwhile.
        let bytes = unsafe { m.slice(0, m.len()) };
        for i in 0..pages {
            let discarded = i % 2 == 0;
            let p = &bytes[i * page..(i + 1) * page];
            assert!(
                p.iter().all(|&b| b == if discarded { 0 } else { 0xA7 }),
                "page {i}"
            );
        }
        if !VECTOR_DISCARD.load(Relaxed) {
            eprintln!("process_madvise(MADV_DONTNEED) refused here: one madvise a run");
        }
    }

    #[test]
    fn a_failed_call_says_what_was_asked_and_keeps_the_errno() {
        let e = Mapping::anonymous(0).unwrap_err();
        assert!(matches!(e, MappingError::Map { len: 0, .. }), "{e}");
        assert!(e.to_string().starts_with("mmap of 0 bytes: "), "{e}");
        assert_eq!(io::Error::from(e).raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn mapped_bytes_start_as_zeros_and_keep_what_is_written() {
        let ps = page_size();
        let mut b = MappedBytes::new(3 * ps + 5).unwrap();
        assert_eq!(b.len(), 3 * ps + 5);
        assert!(b.iter().all(|&x| x == 0));
        b[ps] = 7;
        let last = b.len() - 1;
        b[last] = 9;
        assert_eq!((b[ps], b[last], b[0]), (7, 9, 0));
        assert!(MappedBytes::new(0).is_err());
    }

    /// A mapping that unmaps only some ranges at its drop leaves the others mapped.
    #[test]
    fn only_the_ranges_kept_are_unmapped_at_the_drop() {
        let ps = page_size();
        let mut m = Mapping::anonymous(2 * ps).unwrap();
        let second = m.addr() + ps;
        m.unmap_only_at_drop(std::iter::once(0..ps).collect());
        drop(m);
        let second = NonNull::new(second as *mut u8).unwrap();
        assert!(
            residency_at(second, ps).is_ok(),
            "the second page is still mapped"
        );
        // SAFETY: the page left mapped above is this test's, unmapped once here.
        unsafe { libc::munmap(second.as_ptr().cast(), ps) };
    }
}
