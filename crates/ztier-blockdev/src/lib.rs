//! The block-device seam: what a disk is to the front ends that serve one (the NBD server)
//! and to the engines that write to one (zram writeback, zswap's swap device). zram's device
//! implements [`BlockDevice`], a file does ([`file::FileDevice`]), so does a plain RAM disk
//! ([`memory::MemoryDevice`], the uncompressed reference), and a remote NBD export will; a
//! server written against the trait never learns which it serves. A thin volume of one store
//! shared by many devices does too ([`thin::Volume`], each device's extents its own).
//!
//! Contract:
//! - every method may be called from any number of threads at once, on any byte range
//!   inside [`size`](BlockDevice::size) (the device does its own locking; overlapping
//!   concurrent writes land in some order, each whole per [`block_size`](BlockDevice::block_size)
//!   block);
//! - a range outside the device is refused with [`BlockError::OutOfRange`] and changes
//!   nothing;
//! - a failed write leaves every block it did not reach as it was; the error says how many
//!   bytes from the start were written;
//! - after [`discard`](BlockDevice::discard) the range reads as zeros or as what it held (the
//!   device may keep partial blocks); after [`write_zeroes`](BlockDevice::write_zeroes) it
//!   reads as zeros;
//! - errors map to the errno values NBD and the kernel use ([`BlockError::errno`]).
#![deny(unsafe_code)]

pub mod file;
pub mod memory;
#[cfg(feature = "testing")]
pub mod testing;
pub mod thin;

/// What a device says of a refusal of one of the kinds below: its own error, kept whole (a
/// `ZramError` stays one, for a caller that downcasts it), or words (a `String` converts
/// with `.into()`). The seam cannot name the engines' error types, which depend on it.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a block-device operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    #[error("bytes {offset}..+{len} are outside the device's {size} bytes")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("no space left: {0}")]
    NoSpace(Cause),
    #[error("out of memory: {0}")]
    NoMemory(Cause),
    #[error("the device is read-only")]
    ReadOnly,
    #[error("{0} is not supported by this device")]
    Unsupported(&'static str),
    #[error("invalid request: {0}")]
    Invalid(Cause),
    /// The file of a [`file::FileDevice`] may not hold a disk's pages, or could not be
    /// opened ([`ztier_base::private_file`]).
    #[error(transparent)]
    File(ztier_base::private_file::PrivateFileError),
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: std::path::PathBuf },
    /// The cause is in the message, not also a `source`: an error chain printed whole
    /// (`{:#}`) would say it twice.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    #[error("after {done} bytes: {source}")]
    Partial {
        /// Bytes from the start of the request that were written.
        done: u64,
        source: Box<BlockError>,
    },
}

impl From<std::io::Error> for BlockError {
    fn from(e: std::io::Error) -> BlockError {
        BlockError::Io(e)
    }
}

impl BlockError {
    /// The errno value this error is reported as (NBD's error field, the kernel's bio status).
    pub fn errno(&self) -> i32 {
        match self {
            BlockError::OutOfRange { .. }
            | BlockError::Invalid(_)
            | BlockError::File(_)
            | BlockError::NotAFile { .. } => libc::EINVAL,
            BlockError::NoSpace(_) => libc::ENOSPC,
            BlockError::NoMemory(_) => libc::ENOMEM,
            BlockError::ReadOnly => libc::EPERM,
            BlockError::Unsupported(_) => libc::EOPNOTSUPP,
            BlockError::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
            BlockError::Partial { source, .. } => source.errno(),
        }
    }
}

pub type Result<T, E = BlockError> = std::result::Result<T, E>;

/// What a range of the device holds, for NBD's `base:allocation` and sparse copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// Never written, or discarded: no storage behind it (reads as zeros).
    pub hole: bool,
    /// Reads as zeros (a hole, or zeros that are stored).
    pub zero: bool,
}

impl Extent {
    /// Adds `next` to the end of `extents`, into the last one if it is of the same kind
    /// (a block status answer lists each run of one kind once).
    pub fn push_merged(extents: &mut Vec<Extent>, next: Extent) {
        match extents.last_mut() {
            Some(last) if last.hole == next.hole && last.zero == next.zero => last.len += next.len,
            _ => extents.push(next),
        }
    }
}

/// A disk: a range of bytes read and written in place.
pub trait BlockDevice: Send + Sync {
    /// Bytes on the device.
    fn size(&self) -> u64;

    /// The device's block: writes of whole, aligned blocks are cheapest and never
    /// read-modify-write (zram's page size; a file's 4096).
    fn block_size(&self) -> u32;

    /// Reads `buf.len()` bytes from `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// Writes `data` at `offset`; with `fua`, the data is durable when this returns.
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()>;

    /// Says the range's contents are no longer needed (TRIM).
    fn discard(&self, offset: u64, len: u64) -> Result<()>;

    /// Makes the range read as zeros; `may_unmap` lets the device free its storage (punch a
    /// hole) rather than store zeros.
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()>;

    /// Makes every completed write durable.
    fn flush(&self) -> Result<()>;

    /// Whether [`flush`](Self::flush) and `fua` do anything (a RAM disk loses everything on
    /// exit whatever they do; a file does not).
    fn is_volatile(&self) -> bool {
        false
    }

    /// Whether [`write_zeroes`](Self::write_zeroes) is fast (no data written: a hole punched
    /// or a zero page recorded), as NBD's `FAST_ZERO` asks before a client relies on it.
    fn fast_zeroes(&self) -> bool {
        false
    }

    /// A count that moves whenever the bytes this device serves may have changed other than
    /// by writes made through it: an NBD export's link lost (a read then gets the store's
    /// word, an error) or found again (perhaps a store that restarted). A copy of the
    /// device's bytes kept by its user holds only while the count stays the same. 0, never
    /// moving, for a device nothing else changes (a file, a RAM disk).
    fn epoch(&self) -> u64 {
        0
    }

    /// Reads several ranges, each `(offset, buffer)`: the same as a [`read_at`] of each in
    /// turn, which is what it does by default. A device whose requests wait on a network
    /// (an NBD export) sends them all before it waits for the first, so they cost one round
    /// trip between them, not one each. The first error is returned; the buffers of the other
    /// ranges then hold what was read or their old bytes.
    ///
    /// [`read_at`]: Self::read_at
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        for (offset, buf) in reads.iter_mut() {
            self.read_at(*offset, buf)?;
        }
        Ok(())
    }

    /// Writes several ranges, each `(offset, data)`, as [`read_many`] reads them: the same as
    /// a [`write_at`] of each (no `fua`), in flight together where the device can. On an
    /// error, which ranges were written is unknown: the caller treats every one as unwritten.
    ///
    /// [`read_many`]: Self::read_many
    /// [`write_at`]: Self::write_at
    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        for (offset, data) in writes {
            self.write_at(*offset, data, false)?;
        }
        Ok(())
    }

    /// What `offset..offset + len` holds, as extents covering it from `offset` (a device may
    /// stop early; the caller asks again for the rest). By default: all data.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        check_range(self.size(), offset, len)?;
        Ok(vec![Extent {
            len,
            hole: false,
            zero: false,
        }])
    }
}

/// Refuses a range that does not lie inside a device of `size` bytes.
pub fn check_range(size: u64, offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(BlockError::OutOfRange { offset, len, size }),
    }
}
