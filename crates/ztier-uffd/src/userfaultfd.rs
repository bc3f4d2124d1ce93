//! The userfaultfd file descriptor and its ioctls (`include/uapi/linux/userfaultfd.h`), and
//! the eventfd and the timerfd that wake the thread polling it.
//!
//! The descriptor is non-blocking, and can be polled, unless [`Uffd::set_blocking`] made it
//! blocking for a while: a `read` with nothing waiting then waits in the kernel, one system
//! call where a `poll` and a `read` are two (the kernel's poll of a blocking userfaultfd
//! answers `EPOLLERR`, so it is not polled then). Reads that must not wait pass
//! `RWF_NOWAIT`, which a kernel whose userfaultfd reads are `read_iter` and that marks the
//! file `FMODE_NOWAIT` takes (6.18 does); where it does not, the descriptor stays
//! non-blocking. The crate's other system
//! calls are the mapping's (`mapping.rs`) and the threads' placement and priority
//! (`placement.rs`).
//!
//! Why raw ioctls: the protocol needs `UFFDIO_MOVE` (6.8) and `UFFDIO_POISON` (6.6), which
//! no userfaultfd crate wraps; the structures below are the kernel's, field for field.
//!
//! Invariants: every ioctl here either only reads memory of ours passed as a slice, or
//! changes page tables of a range the kernel itself checks is registered with this
//! descriptor; the one exception, [`Uffd::move_pages`], takes a page *out* of a mapping and is
//! `unsafe` for that reason. No locks.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};

const UFFDIO: u32 = 0xAA;
const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// `_IOC(dir, 0xAA, nr, size)`.
const fn ioc(dir: u32, nr: u32, size: usize) -> libc::c_ulong {
    ((dir << 30) | ((size as u32) << 16) | (UFFDIO << 8) | nr) as libc::c_ulong
}
const READ_WRITE: u32 = 3;
const READ: u32 = 2;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
/// `struct uffdio_copy` and `struct uffdio_move` have the same layout.
#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    /// Bytes copied (moved), or a negative errno.
    done: i64,
}
/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
/// `struct uffdio_zeropage` and `struct uffdio_poison` have the same layout.
#[repr(C)]
#[derive(Default)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    done: i64,
}

const UFFDIO_API: libc::c_ulong = ioc(READ_WRITE, 0x3F, size_of::<UffdioApi>());
const UFFDIO_REGISTER: libc::c_ulong = ioc(READ_WRITE, 0x00, size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: libc::c_ulong = ioc(READ, 0x01, size_of::<UffdioRange>());
const UFFDIO_WAKE: libc::c_ulong = ioc(READ, 0x02, size_of::<UffdioRange>());
const UFFDIO_COPY: libc::c_ulong = ioc(READ_WRITE, 0x03, size_of::<UffdioCopy>());
const UFFDIO_ZEROPAGE: libc::c_ulong = ioc(READ_WRITE, 0x04, size_of::<UffdioZeropage>());
const UFFDIO_MOVE: libc::c_ulong = ioc(READ_WRITE, 0x05, size_of::<UffdioCopy>());
const UFFDIO_WRITEPROTECT: libc::c_ulong = ioc(READ_WRITE, 0x06, size_of::<UffdioWriteprotect>());
const UFFDIO_POISON: libc::c_ulong = ioc(READ_WRITE, 0x08, size_of::<UffdioZeropage>());
const _: () = assert!(UFFDIO_API == 0xc018_aa3f && UFFDIO_COPY == 0xc028_aa03);
const _: () = assert!(UFFDIO_REGISTER == 0xc020_aa00 && UFFDIO_UNREGISTER == 0x8010_aa01);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xc018_aa06);

/// `UFFDIO_REGISTER_MODE_MISSING`.
pub const MODE_MISSING: u64 = 1;
/// `UFFDIO_REGISTER_MODE_WP`: a write to a page installed write-protected
/// (`UFFDIO_COPY_MODE_WP`) is a fault for the handler, with `PAGEFAULT_FLAG_WP`.
pub const MODE_WP: u64 = 2;
/// `UFFDIO_COPY_MODE_WP`.
const COPY_MODE_WP: u64 = 2;
/// `UFFDIO_WRITEPROTECT_MODE_WP`.
const WRITEPROTECT_MODE_WP: u64 = 1;

/// Features the region asks for (`UFFD_FEATURE_*`).
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// The faulting thread's id in a page fault's message (`arg[2]`).
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
pub const FEATURE_POISON: u64 = 1 << 14;
pub const FEATURE_MOVE: u64 = 1 << 16;

/// `UFFD_EVENT_*`.
pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const EVENT_REMAP: u8 = 0x14;
pub const EVENT_REMOVE: u8 = 0x15;
pub const EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_WRITE`.
pub const PAGEFAULT_FLAG_WRITE: u64 = 1;
/// `UFFD_PAGEFAULT_FLAG_WP`: a write to a write-protected page.
pub const PAGEFAULT_FLAG_WP: u64 = 2;

/// `struct uffd_msg` (packed in the kernel's header; this layout has no padding either).
#[repr(C)]
#[derive(Default, Clone, Copy, Debug)]
pub struct Msg {
    pub event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    /// pagefault: flags, address, ptid; remap: from, to, len; remove and unmap: start, end.
    pub arg: [u64; 3],
}
const _: () = assert!(size_of::<Msg>() == 32);

/// What an ioctl that changes a page said: done, or the kernel's errno (`EAGAIN`: the
/// address space is changing and an event is waiting to be read; `EEXIST`: the page is
/// there already; `ENOENT`: no registered mapping there, or for a move no page at the source).
pub type Outcome = Result<(), i32>;

/// A userfaultfd descriptor, non-blocking unless [`Uffd::set_blocking`] says otherwise.
pub struct Uffd {
    /// The descriptor, -1 once [`Uffd::shutdown`] closed it (every call then fails with
    /// `EBADF`).
    fd: AtomicI32,
    /// Made with `UFFD_USER_MODE_ONLY`: faults taken inside the kernel (a system call reading
    /// or writing the region) are not handled and fail with `EFAULT`.
    pub user_mode_only: bool,
    /// Whether reads may pass `RWF_NOWAIT` (checked by [`Uffd::probe_nowait_reads`]).
    nowait_reads: bool,
}

impl Uffd {
    /// A new descriptor: handling every fault if the process may (`CAP_SYS_PTRACE` or
    /// `vm.unprivileged_userfaultfd=1`), else user-mode faults only, where the kernel allows
    /// that, then `/dev/userfaultfd` (its permissions decide).
    pub fn open() -> io::Result<Uffd> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let mut first_error = None;
        for (extra, user_mode_only) in [(0, false), (UFFD_USER_MODE_ONLY, true)] {
            // SAFETY: userfaultfd takes only flags and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | extra) };
            if fd >= 0 {
                // SAFETY: the kernel just made this descriptor for us alone.
                let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
                return Ok(Uffd::from_fd(fd, user_mode_only));
            }
            first_error.get_or_insert_with(io::Error::last_os_error);
        }
        // SAFETY: a NUL-terminated path and plain flags.
        let dev =
            unsafe { libc::open(c"/dev/userfaultfd".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev >= 0 {
            // SAFETY: a descriptor open() just returned, ours alone.
            let dev = unsafe { OwnedFd::from_raw_fd(dev) };
            const USERFAULTFD_IOC_NEW: libc::c_ulong = (UFFDIO << 8) as libc::c_ulong;
            // SAFETY: USERFAULTFD_IOC_NEW takes the flags by value and returns a descriptor.
            let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW, flags) };
            if fd >= 0 {
                // SAFETY: a descriptor the kernel just made for us alone.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                return Ok(Uffd::from_fd(fd, false));
            }
        }
        Err(first_error.unwrap_or_else(io::Error::last_os_error))
    }

    fn from_fd(fd: OwnedFd, user_mode_only: bool) -> Uffd {
        Uffd {
            fd: AtomicI32::new(fd.into_raw_fd()),
            user_mode_only,
            nowait_reads: false,
        }
    }

    fn raw(&self) -> i32 {
        self.fd.load(Relaxed)
    }

    /// Closes the descriptor: the kernel unregisters every range and wakes the threads
    /// waiting on faults (they fault again, on memory that is the kernel's own). Called once
    /// the threads that use it are gone.
    pub fn shutdown(&self) {
        let fd = self.fd.swap(-1, Relaxed);
        if fd >= 0 {
            // SAFETY: a descriptor this value owned, closed once (the swap above).
            unsafe { libc::close(fd) };
        }
    }

    /// `UFFDIO_API` with `features`; the features the kernel has, or its error (`EINVAL`:
    /// one of them is not in this kernel).
    pub fn api(&self, features: u64) -> io::Result<u64> {
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes the struct we pass, nothing else.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_API, &mut api) })?;
        Ok(api.features)
    }

    /// `UFFDIO_REGISTER` of `[start, start + len)` in `mode`.
    pub fn register(&self, start: u64, len: u64, mode: u64) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes the struct we pass; registering changes
        // no memory's content.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_REGISTER, &mut reg) })
    }

    /// `UFFDIO_UNREGISTER`: the range's faults are the kernel's again (missing pages read as
    /// zeros); threads waiting on them are woken.
    pub fn unregister(&self, start: u64, len: u64) -> io::Result<()> {
        let range = UffdioRange { start, len };
        // SAFETY: UFFDIO_UNREGISTER reads the struct we pass; it changes no page's content.
        cvt(unsafe { libc::ioctl(self.raw(), UFFDIO_UNREGISTER, &range) })
    }

    /// `UFFDIO_WAKE`: wakes the threads waiting on faults in the range.
    pub fn wake(&self, start: u64, len: u64) {
        let range = UffdioRange { start, len };
        // SAFETY: UFFDIO_WAKE reads the struct we pass and only wakes threads. A failure
        // (nothing waiting, a range gone) leaves nothing to do.
        unsafe { libc::ioctl(self.raw(), UFFDIO_WAKE, &range) };
    }

    /// `UFFDIO_COPY` of `src` to `dst` (page-aligned, `src.len()` a whole number of pages),
    /// waking the threads waiting there.
    pub fn copy(&self, dst: u64, src: &[u8]) -> Outcome {
        let mut copy = UffdioCopy {
            dst,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            ..Default::default()
        };
        // SAFETY: the kernel reads `src.len()` bytes from `src`, a live slice, and fills only
        // page-table entries that are empty (EEXIST otherwise) in a mapping registered with
        // this descriptor (ENOENT otherwise): it overwrites no memory anyone holds.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_COPY, &mut copy) };
        outcome(r, copy.done, src.len())
    }

    /// `UFFDIO_COPY` of several pages, write-protected if `wp` (a range registered with
    /// [`MODE_WP`]): the bytes copied (a whole number of pages from `dst` on, all of them if
    /// the outcome is `Ok`) and the outcome.
    pub fn copy_run(&self, dst: u64, src: &[u8], wp: bool) -> (usize, Outcome) {
        let mut copy = UffdioCopy {
            dst,
            src: src.as_ptr() as u64,
            len: src.len() as u64,
            mode: if wp { COPY_MODE_WP } else { 0 },
            ..Default::default()
        };
        // SAFETY: as `copy`.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_COPY, &mut copy) };
        (copy.done.max(0) as usize, outcome(r, copy.done, src.len()))
    }

    /// `UFFDIO_WRITEPROTECT` of the range: protects its present pages (`wp`) or lifts the
    /// protection and wakes the threads waiting on write faults there.
    pub fn writeprotect(&self, start: u64, len: u64, wp: bool) -> Outcome {
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode: if wp { WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads the struct we pass and changes only the
        // protection of pages in a range registered with this descriptor (the kernel checks):
        // no memory's content.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_WRITEPROTECT, &mut w) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO))
        }
    }

    /// `UFFDIO_ZEROPAGE`: maps the zero page at the empty pages of the range.
    pub fn zeropage(&self, start: u64, len: u64) -> Outcome {
        self.zeropage_run(start, len).1
    }

    /// `UFFDIO_ZEROPAGE` of several pages: the bytes mapped (a whole number of pages from
    /// `start` on, all of them if the outcome is `Ok`) and the outcome.
    pub fn zeropage_run(&self, start: u64, len: u64) -> (usize, Outcome) {
        let mut z = UffdioZeropage {
            range: UffdioRange { start, len },
            ..Default::default()
        };
        // SAFETY: as `copy`: only empty entries of a registered mapping are filled.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_ZEROPAGE, &mut z) };
        (z.done.max(0) as usize, outcome(r, z.done, len as usize))
    }

    /// `UFFDIO_POISON`: the range's empty pages raise `SIGBUS` when touched (a page whose
    /// stored copy could not be read back: the program learns it lost it rather than reading
    /// something else).
    pub fn poison(&self, start: u64, len: u64) -> Outcome {
        let mut z = UffdioZeropage {
            range: UffdioRange { start, len },
            ..Default::default()
        };
        // SAFETY: as `copy`: only empty entries of a registered mapping are filled.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_POISON, &mut z) };
        outcome(r, z.done, len as usize)
    }

    /// `UFFDIO_MOVE` of the `len` bytes of pages at `src` to `dst` (empty, in a mapping
    /// registered with this descriptor): atomically for each page, as far as any thread can
    /// see, the pages leave `src` (whose entries become empty) and appear at `dst`, with
    /// their content as it was at the move. The bytes moved (a whole number of pages from
    /// the start, all of them if the outcome is `Ok`) and the outcome: after a part moved
    /// the kernel says only `EAGAIN` (whatever stopped it); a move of what is left says why.
    ///
    /// # Safety
    /// The pages at `src` must be ones whose content the caller keeps for their owner (region
    /// pages under their page locks, which the protocol stores or puts back): the kernel
    /// accepts any anonymous private mapping as the source, Rust's own heap included.
    pub unsafe fn move_pages(&self, dst: u64, src: u64, len: u64) -> (usize, Outcome) {
        let mut mv = UffdioCopy {
            dst,
            src,
            len,
            ..Default::default()
        };
        // SAFETY: the struct is ours; what the move does to `src` is the caller's contract;
        // `dst` must be empty and registered with this descriptor, which the kernel checks.
        let r = unsafe { libc::ioctl(self.raw(), UFFDIO_MOVE, &mut mv) };
        (mv.done.max(0) as usize, outcome(r, mv.done, len as usize))
    }

    /// Whether a read may be told not to wait (`RWF_NOWAIT`), so that the descriptor may be
    /// made blocking ([`Uffd::set_blocking`]). Reads a message if one is waiting: called
    /// before any range is registered.
    pub fn probe_nowait_reads(&mut self) -> bool {
        let mut msg = [Msg::default()];
        self.nowait_reads = true;
        let r = self.read(&mut msg);
        self.nowait_reads = matches!(r, Ok(0));
        self.nowait_reads
    }

    /// Whether [`Uffd::set_blocking`] may make the descriptor blocking.
    pub fn can_block(&self) -> bool {
        self.nowait_reads
    }

    /// Makes the descriptor blocking (a [`read_waiting`](Uffd::read_waiting) with nothing
    /// in waits for a message; it cannot be polled meanwhile) or non-blocking again; only
    /// where [`can_block`](Uffd::can_block).
    pub fn set_blocking(&self, blocking: bool) -> io::Result<()> {
        if blocking && !self.nowait_reads {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let flags = if blocking { 0 } else { libc::O_NONBLOCK };
        // SAFETY: F_SETFL takes plain flags; of the flags it changes this descriptor has
        // only O_NONBLOCK.
        cvt(unsafe { libc::fcntl(self.raw(), libc::F_SETFL, flags) })?;
        Ok(())
    }

    /// Reads the waiting messages into `buf` without waiting for any; how many (0: none
    /// waiting).
    pub fn read(&self, buf: &mut [Msg]) -> io::Result<usize> {
        self.read_with(
            buf,
            if self.nowait_reads {
                libc::RWF_NOWAIT
            } else {
                0
            },
        )
    }

    /// Reads the waiting messages into `buf`, waiting for the first if the descriptor is
    /// blocking; how many (0: none, or a signal came first).
    pub fn read_waiting(&self, buf: &mut [Msg]) -> io::Result<usize> {
        self.read_with(buf, 0)
    }

    fn read_with(&self, buf: &mut [Msg], flags: libc::c_int) -> io::Result<usize> {
        let n = if flags == 0 {
            // SAFETY: read writes at most `size_of_val(buf)` bytes into `buf`, a live slice
            // of plain integers (any bytes are valid values).
            unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), size_of_val(buf)) }
        } else {
            let iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: size_of_val(buf),
            };
            // SAFETY: preadv2 writes at most `iov_len` bytes at `iov_base`, a live slice of
            // plain integers (any bytes are valid values); offset -1 is the file position (a
            // userfaultfd has none).
            unsafe { libc::preadv2(self.raw(), &iov, 1, -1, flags) }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize / size_of::<Msg>())
    }

    /// Whether a message waits unread (without waiting): a poll, or, while the descriptor is
    /// blocking (its poll answers `EPOLLERR` then), the faults the kernel has queued unread
    /// (`pending` in its `/proc/self/fdinfo`). Events do not count there.
    pub fn unread(&self) -> bool {
        let mut fd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one live struct, without waiting.
        let r = unsafe { libc::poll(&mut fd, 1, 0) };
        if fd.revents & libc::POLLERR == 0 {
            return r > 0 && fd.revents != 0;
        }
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.raw()))
            .ok()
            .and_then(|info| fdinfo_pending(&info))
            .is_some_and(|n| n > 0)
    }

    /// Waits until a message is waiting, `waker` is signalled, or `timeout_ms` pass (-1: no
    /// limit; 0: only looks); which of the userfaultfd and the waker is readable. The
    /// descriptor must not be blocking (its poll would answer at once).
    pub fn poll(&self, waker: &Waker, timeout_ms: i32) -> Ready {
        // An error or hang-up on the descriptor (closed) counts as readable: the read says.
        // An interrupted poll returns early, which the caller's loop absorbs.
        let [uffd, waker] =
            poll_two([self.raw(), waker.fd.as_raw_fd()], timeout_ms).unwrap_or_default();
        Ready { uffd, waker }
    }
}

/// What [`Uffd::poll`] found readable.
#[derive(Default, Clone, Copy)]
pub struct Ready {
    pub uffd: bool,
    pub waker: bool,
}

impl Drop for Uffd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An eventfd: wakes the fault thread out of its poll, to stop, or because the reclaim
/// thread made room for faults held back for the budget.
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes an initial count and flags and returns a descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        cvt(fd)?;
        // SAFETY: a descriptor the kernel just made for us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd })
    }

    /// Takes the wake-ups so far (the poll blocks again until the next).
    pub fn drain(&self) {
        // Nothing to read (EAGAIN) is fine.
        read_count(self.fd.as_raw_fd());
    }

    /// Makes the descriptor readable until drained.
    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes the 8 bytes of a live u64. A full counter (EAGAIN) is still readable.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// A one-shot timer on the monotonic clock (a timerfd) that a poll waits on beside the
/// userfaultfd: a deadline that stays set across many polls. A poll's own timeout would arm
/// and cancel a kernel timer on every wait, a cost on each fault's path (docs/diary.md,
/// "A poll's timeout on a fault's path").
pub struct Alarm {
    fd: OwnedFd,
}

impl Alarm {
    pub fn new() -> io::Result<Alarm> {
        // SAFETY: timerfd_create takes a clock id and flags and returns a descriptor or -1.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
            )
        };
        cvt(fd)?;
        // SAFETY: a descriptor the kernel just made for us alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Alarm { fd })
    }

    /// Rings once, `after` from now (at least a microsecond: a zero would disarm it), in
    /// place of any earlier setting; the ringing of an earlier setting not yet taken is
    /// taken with it.
    pub fn set(&self, after: std::time::Duration) {
        self.settime(after.max(std::time::Duration::from_micros(1)));
    }

    /// Waits until the alarm rings (and takes the ringing: `true`) or `stop` is signalled
    /// (`false`; left signalled).
    pub fn wait(&self, stop: &Waker) -> bool {
        match poll_two([self.fd.as_raw_fd(), stop.fd.as_raw_fd()], -1) {
            // Set again meanwhile, the timer has nothing to read (EAGAIN): it did not ring
            // after all.
            Some([true, false]) => read_count(self.fd.as_raw_fd()),
            _ => false,
        }
    }

    /// Never rings until set again; a ringing not yet taken is taken.
    pub fn disarm(&self) {
        self.settime(std::time::Duration::ZERO);
    }

    /// How long until it rings; `None` if it is not set (or has rung).
    #[cfg(test)]
    pub fn remaining(&self) -> Option<std::time::Duration> {
        let mut cur = one_shot(std::time::Duration::ZERO);
        // SAFETY: writes one itimerspec into a live local.
        let r = unsafe { libc::timerfd_gettime(self.fd.as_raw_fd(), &mut cur) };
        let left =
            std::time::Duration::new(cur.it_value.tv_sec as u64, cur.it_value.tv_nsec as u32);
        (r == 0 && !left.is_zero()).then_some(left)
    }

    fn settime(&self, value: std::time::Duration) {
        let spec = one_shot(value);
        // SAFETY: reads one itimerspec from a live local; no old value is asked for. It
        // cannot fail for a valid descriptor and a normalized value.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }
}

/// The `pending:` count of a userfaultfd's fdinfo (faults queued and not yet read).
fn fdinfo_pending(info: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix("pending:"))
        .and_then(|n| n.trim().parse().ok())
}

/// A timerfd setting that rings once, `value` from now (zero: never).
fn one_shot(value: std::time::Duration) -> libc::itimerspec {
    libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: value.as_secs() as libc::time_t,
            tv_nsec: value.subsec_nanos() as libc::c_long,
        },
    }
}

fn cvt(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An ioctl's result as [`Outcome`]: a whole `len` done, else the errno (a part done is
/// reported by the kernel as done bytes with `EAGAIN`, which the run variants return
/// beside it).
fn outcome(r: libc::c_int, done: i64, len: usize) -> Outcome {
    if r == 0 && done == len as i64 {
        return Ok(());
    }
    if done < 0 {
        return Err(-done as i32);
    }
    Err(io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO))
}

/// `poll` of two descriptors for input, waiting `timeout_ms` (-1: no limit): which are
/// ready (an error or hang-up counts), or `None` if none (timed out, interrupted, failed).
fn poll_two(fds: [i32; 2], timeout_ms: i32) -> Option<[bool; 2]> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: poll reads and writes the two structs of a live array, nothing else.
    let r = unsafe { libc::poll(polled.as_mut_ptr(), 2, timeout_ms) };
    (r > 0).then(|| polled.map(|p| p.revents != 0))
}

/// Reads the 8-byte count of an eventfd or timerfd (taking it): whether there was one.
fn read_count(fd: i32) -> bool {
    let mut count = 0u64;
    // SAFETY: reads at most 8 bytes into a live u64.
    let n = unsafe { libc::read(fd, (&mut count as *mut u64).cast(), 8) };
    n == 8
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Whether the alarm's descriptor is readable (has rung) within `within`.
    fn rung(alarm: &Alarm, within: Duration) -> bool {
        let mut fd = libc::pollfd {
            fd: alarm.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one live struct.
        unsafe { libc::poll(&mut fd, 1, within.as_millis() as i32) == 1 }
    }

    /// The guard's look at a blocking descriptor: the faults its fdinfo says are queued.
    #[test]
    fn a_blocking_descriptors_unread_faults_are_read_from_its_fdinfo() {
        assert_eq!(
            fdinfo_pending("pos:\t0\nflags:\t02000000\npending:\t3\ntotal:\t5\n"),
            Some(3)
        );
        assert_eq!(fdinfo_pending("pos:\t0\n"), None);
        let mut uffd = match Uffd::open() {
            Ok(uffd) => uffd,
            Err(e) => {
                assert!(std::env::var_os("CI").is_none(), "CI must run this: {e}");
                eprintln!("skipped: userfaultfd not allowed here: {e}");
                return;
            }
        };
        uffd.api(0).unwrap();
        assert!(!uffd.unread());
        if !uffd.probe_nowait_reads() {
            eprintln!("skipped: this kernel refuses RWF_NOWAIT on a userfaultfd");
            return;
        }
        let map = crate::mapping::PlainPages::new(4096).unwrap();
        uffd.register(map.addr(), 4096, MODE_MISSING).unwrap();
        uffd.set_blocking(true).unwrap();
        assert!(!uffd.unread(), "nothing queued, blocking");
        assert_eq!(uffd.read(&mut [Msg::default()]).unwrap(), 0, "no wait");
        std::thread::scope(|s| {
            // The first byte, which faults until the copy below fills it.
            let toucher = s.spawn(|| map.touch(0));
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut seen = uffd.unread();
            while !seen && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
                seen = uffd.unread();
            }
            // Served whatever was seen, so that a failure does not leave the toucher waiting.
            let mut msg = [Msg::default()];
            let n = uffd.read_waiting(&mut msg).unwrap();
            let after = uffd.unread();
            uffd.copy(map.addr(), &[7u8; 4096]).unwrap();
            assert_eq!(toucher.join().unwrap(), 7);
            assert!(seen, "the fault never showed as unread");
            assert_eq!((n, msg[0].event), (1, EVENT_PAGEFAULT));
            assert!(!after, "read, yet unread");
        });
        uffd.set_blocking(false).unwrap();
    }

    /// An alarm rings once its time has come and stays rung until it is set again (which
    /// takes the ringing); a disarmed one never rings.
    #[test]
    fn an_alarm_rings_when_due_and_setting_it_again_takes_the_ringing() {
        let alarm = Alarm::new().unwrap();
        assert_eq!(alarm.remaining(), None);
        assert!(!rung(&alarm, Duration::ZERO));
        let set_at = Instant::now();
        alarm.set(Duration::from_millis(20));
        // (None if this thread lost the CPU for 20 ms meanwhile: it has rung already.)
        assert!(alarm
            .remaining()
            .is_none_or(|d| d <= Duration::from_millis(20)));
        assert!(rung(&alarm, Duration::from_secs(5)));
        assert!(set_at.elapsed() >= Duration::from_millis(20), "rang early");
        assert!(rung(&alarm, Duration::ZERO), "rung until taken");
        alarm.set(Duration::from_secs(60));
        assert!(
            !rung(&alarm, Duration::ZERO),
            "setting it again took the ringing"
        );
        alarm.disarm();
        assert_eq!(alarm.remaining(), None);
        assert!(!rung(&alarm, Duration::from_millis(50)));
    }
}
