//! The conformance suite every [`BlockDevice`] passes: the file device, zram, the plain RAM
//! disk and the NBD client. Each check starts from a device whose every byte reads as zero.
//! And [`Faulty`], a device that fails or stalls on demand and counts its reads, for the
//! tests of what sits on one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::{BlockDevice, BlockError};

/// A device whose writes fail while `fail_writes` is set (a full disk, a vanished server),
/// whose reads fail while `fail_reads` is, and whose reads wait while it is stalled (a store
/// paused, a network partition); otherwise `inner`. It counts the reads it answers. Its
/// [`epoch`](BlockDevice::epoch) moves each time its reads start or stop failing, as an NBD
/// client's does when its link is lost and found again.
pub struct Faulty<D> {
    pub inner: D,
    fail_writes: AtomicBool,
    /// Writes to fail from now on, one each, before writes go through again.
    fail_next_writes: AtomicU64,
    fail_reads: AtomicBool,
    /// Times the reads started or stopped failing.
    changes: AtomicU64,
    stall: Mutex<Stall>,
    stall_changed: Condvar,
    reads: AtomicU64,
}

#[derive(Default)]
struct Stall {
    on: bool,
    /// Reads waiting on the stall now.
    waiting: usize,
}

impl<D: BlockDevice> Faulty<D> {
    pub fn new(inner: D) -> Faulty<D> {
        Faulty {
            inner,
            fail_writes: AtomicBool::new(false),
            fail_next_writes: AtomicU64::new(0),
            fail_reads: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            stall: Mutex::default(),
            stall_changed: Condvar::new(),
            reads: AtomicU64::new(0),
        }
    }

    pub fn set_failing(&self, writes: bool, reads: bool) {
        self.fail_writes.store(writes, Relaxed);
        if self.fail_reads.swap(reads, Relaxed) != reads {
            self.changes.fetch_add(1, Relaxed);
        }
    }

    /// Fails the next `n` writes (a store that blips), then lets writes through again.
    pub fn fail_next_writes(&self, n: u64) {
        self.fail_next_writes.store(n, Relaxed);
    }

    fn write_fails(&self) -> bool {
        self.fail_writes.load(Relaxed)
            || self
                .fail_next_writes
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok()
    }

    /// Holds every read from now on until `stall(false)`, which lets the waiting ones go.
    pub fn stall(&self, on: bool) {
        self.stall.lock().unwrap_or_else(|p| p.into_inner()).on = on;
        self.stall_changed.notify_all();
    }

    /// Waits until `n` reads wait on the stall; false if they have not after `deadline`.
    pub fn wait_for_stalled_reads(&self, n: usize, deadline: Duration) -> bool {
        let s = self.stall.lock().unwrap_or_else(|p| p.into_inner());
        let (_s, waited) = self
            .stall_changed
            .wait_timeout_while(s, deadline, |s| s.waiting < n)
            .unwrap_or_else(|p| p.into_inner());
        !waited.timed_out()
    }

    /// Reads answered (stalled ones once they went on, failed ones not).
    pub fn reads(&self) -> u64 {
        self.reads.load(Relaxed)
    }

    fn failure(what: &str) -> BlockError {
        BlockError::Io(std::io::Error::other(format!(
            "the test's store failed the {what} (it vanished)"
        )))
    }
}

impl<D: BlockDevice> BlockDevice for Faulty<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> crate::Result<()> {
        let mut s = self.stall.lock().unwrap_or_else(|p| p.into_inner());
        if s.on {
            s.waiting += 1;
            self.stall_changed.notify_all();
            s = self
                .stall_changed
                .wait_while(s, |s| s.on)
                .unwrap_or_else(|p| p.into_inner());
            s.waiting -= 1;
        }
        drop(s);
        if self.fail_reads.load(Relaxed) {
            return Err(Self::failure("read"));
        }
        self.reads.fetch_add(1, Relaxed);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> crate::Result<()> {
        if self.write_fails() {
            return Err(Self::failure("write"));
        }
        self.inner.write_at(offset, data, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> crate::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> crate::Result<()> {
        if self.fail_writes.load(Relaxed) {
            return Err(Self::failure("write"));
        }
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> crate::Result<()> {
        self.inner.flush()
    }
    fn epoch(&self) -> u64 {
        self.inner.epoch() + self.changes.load(Relaxed)
    }
}

pub use ztier_base::pattern::pattern;

/// Runs every check on `dev`, which must be at least 64 blocks and read as zeros.
pub fn run_all(dev: &dyn BlockDevice) {
    unaligned_round_trips(dev);
    out_of_range_is_refused(dev);
    zeroes_and_discard(dev);
    extents_cover_the_range(dev);
    disjoint_concurrent_writes_keep_each_other(dev);
}

/// Writes at offsets and lengths that straddle blocks read back exactly, and leave the
/// bytes around them alone: after each write the whole device reads as a model of it (zeros,
/// then every write so far), so a write that spills onto a neighbouring byte, or undoes an
/// earlier write, is caught.
pub fn unaligned_round_trips(dev: &dyn BlockDevice) {
    let bs = dev.block_size() as u64;
    let mut model = vec![0u8; dev.size() as usize];
    let mut back = vec![0u8; model.len()];
    for (i, (off, len)) in [
        (0, 1),
        (bs - 1, 2),
        (bs + 7, 3 * bs as usize),
        (5 * bs, bs as usize),
        (9 * bs + 511, 512),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(i as u64, len);
        dev.write_at(off, &data, i % 2 == 0).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&data);
        // In pieces, so a device with a small largest request (the NBD client) reads it too.
        for (n, piece) in back.chunks_mut(1 << 20).enumerate() {
            dev.read_at((n << 20) as u64, piece).unwrap();
        }
        if let Some(at) = back.iter().zip(&model).position(|(b, m)| b != m) {
            let inside = (off..off + len as u64).contains(&(at as u64));
            panic!(
                "write {i} at {off}+{len}: byte {at} ({}) reads {:#04x}, not {:#04x}",
                if inside { "written" } else { "not written" },
                back[at],
                model[at]
            );
        }
    }
    dev.flush().unwrap();
    dev.write_zeroes(0, 16 * bs, true).unwrap();
}

/// Ranges past the end, or whose end overflows, are refused as EINVAL and change nothing.
pub fn out_of_range_is_refused(dev: &dyn BlockDevice) {
    let size = dev.size();
    let mut buf = [0u8; 8];
    let results = [
        dev.read_at(size - 4, &mut buf),
        dev.write_at(size, &buf, false),
        dev.write_at(u64::MAX - 3, &buf, false),
        dev.discard(size - 4, 8),
        dev.write_zeroes(u64::MAX, 2, false),
        dev.block_status(size, 1).map(drop),
    ];
    for r in results {
        let e = r.unwrap_err();
        assert!(matches!(e, BlockError::OutOfRange { .. }), "{e}");
        assert_eq!(e.errno(), libc::EINVAL);
    }
    dev.read_at(size - 8, &mut buf).unwrap();
    assert_eq!(buf, [0; 8]);
}

/// write_zeroes reads as zeros with or without unmapping, at any alignment; a discard of
/// whole blocks reads as zeros.
pub fn zeroes_and_discard(dev: &dyn BlockDevice) {
    let bs = dev.block_size() as u64;
    let data = pattern(7, 8 * bs as usize);
    for (unmap, off, len) in [
        (true, bs + 3, 3 * bs),
        (false, 2 * bs, bs),
        (false, 100, 10),
    ] {
        dev.write_at(0, &data, false).unwrap();
        dev.write_zeroes(off, len, unmap).unwrap();
        let mut back = vec![0; data.len()];
        dev.read_at(0, &mut back).unwrap();
        for (i, (&b, &d)) in back.iter().zip(&data).enumerate() {
            let inside = (off..off + len).contains(&(i as u64));
            assert_eq!(
                b,
                if inside { 0 } else { d },
                "byte {i}, zeroes {off}+{len}"
            );
        }
    }
    dev.write_at(0, &data, false).unwrap();
    dev.discard(2 * bs, 2 * bs).unwrap();
    let mut back = vec![0; 2 * bs as usize];
    dev.read_at(2 * bs, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0),
        "discarded blocks read as zeros"
    );
    dev.write_zeroes(0, 8 * bs, true).unwrap();
}

/// Block status covers the asked range from its start without gaps, and a range just
/// written is not reported as zero.
pub fn extents_cover_the_range(dev: &dyn BlockDevice) {
    let bs = dev.block_size() as u64;
    dev.write_at(3 * bs, &pattern(3, bs as usize), false)
        .unwrap();
    let mut at = 0;
    while at < 8 * bs {
        let extents = dev.block_status(at, 8 * bs - at).unwrap();
        assert!(!extents.is_empty());
        for e in &extents {
            assert!(e.len > 0);
            assert!(!e.hole || e.zero, "a hole reads as zeros");
            let covers_written = at < 4 * bs && at + e.len > 3 * bs;
            assert!(
                !(covers_written && e.zero),
                "written data reported as zero: {e:?}"
            );
            at += e.len;
        }
    }
    assert_eq!(at, 8 * bs);
    dev.write_zeroes(0, 8 * bs, true).unwrap();
}

/// Threads writing disjoint 512-byte pieces of the same blocks lose none of each other's
/// writes (a sub-block write is a read-modify-write for a block device with big blocks).
pub fn disjoint_concurrent_writes_keep_each_other(dev: &dyn BlockDevice) {
    let bs = dev.block_size() as usize;
    let pieces = bs / 512;
    std::thread::scope(|s| {
        for piece in 0..pieces {
            s.spawn(move || {
                for round in 0..50u64 {
                    for block in 0..4u64 {
                        let off = block * bs as u64 + (piece * 512) as u64;
                        let data = pattern(round << 16 | block << 8 | piece as u64, 512);
                        dev.write_at(off, &data, false).unwrap();
                    }
                }
            });
        }
    });
    let mut back = vec![0; 512];
    for block in 0..4u64 {
        for piece in 0..pieces {
            dev.read_at(block * bs as u64 + (piece * 512) as u64, &mut back)
                .unwrap();
            assert_eq!(
                back,
                pattern(49 << 16 | block << 8 | piece as u64, 512),
                "block {block} piece {piece}: a write was lost"
            );
        }
    }
    dev.write_zeroes(0, 4 * bs as u64, true).unwrap();
}
