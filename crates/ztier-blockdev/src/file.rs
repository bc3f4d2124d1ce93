//! A regular file as a block device: `pread`/`pwrite`, holes punched on discard, ranges
//! zeroed with `fallocate`, `fdatasync` for flush and FUA. The backing store for zram
//! writeback and the swap device of the swap-slot allocator.
//!
//! The file is opened at a fixed size (created sparse if new); the device never grows it.
//! Locking: none of its own; the kernel orders concurrent `pread`/`pwrite` on one file.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use ztier_base::private_file;

use crate::{check_range, BlockDevice, BlockError, Result};

/// A file of fixed size used as a disk.
pub struct FileDevice {
    file: File,
    size: u64,
    block_size: u32,
}

impl FileDevice {
    /// Opens (creating if missing) `path` as a device of `size` bytes: a new or shorter file
    /// is extended sparse to `size`; a longer one is used up to `size`. The file holds a
    /// disk's pages, so it is made mode 0600 whatever the umask, never reached through a
    /// link, and one that exists must not be writable by another user
    /// ([`ztier_base::private_file`]).
    pub fn open(path: &Path, size: u64) -> Result<FileDevice> {
        let (file, _made) = private_file::open_or_create(path).map_err(BlockError::File)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(BlockError::NotAFile {
                path: path.to_owned(),
            });
        }
        if meta.len() < size {
            file.set_len(size)?;
        }
        Ok(FileDevice {
            file,
            size,
            block_size: 4096,
        })
    }

    /// `fallocate(mode)` over the range; `Unsupported` if the file system cannot.
    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> Result<()> {
        let (Ok(off), Ok(n)) = (i64::try_from(offset), i64::try_from(len)) else {
            return Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.size,
            });
        };
        // SAFETY: fallocate reads no memory of ours; the descriptor is open for as long as
        // `self.file` lives, which outlasts the call.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, n) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => BlockError::Unsupported("fallocate on this file system"),
            _ => BlockError::Io(e),
        })
    }

    /// Writes zeros over the range, in chunks.
    fn write_zero_bytes(&self, mut offset: u64, mut len: u64) -> Result<()> {
        let zeros = vec![0u8; 1 << 16];
        let start = offset;
        while len > 0 {
            let n = len.min(zeros.len() as u64) as usize;
            self.file
                .write_all_at(&zeros[..n], offset)
                .map_err(|e| partial(offset - start, e.into()))?;
            offset += n as u64;
            len -= n as u64;
        }
        Ok(())
    }
}

fn partial(done: u64, source: BlockError) -> BlockError {
    if done == 0 {
        source
    } else {
        BlockError::Partial {
            done,
            source: Box::new(source),
        }
    }
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        self.block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset)?;
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        check_range(self.size, offset, data.len() as u64)?;
        self.file.write_all_at(data, offset)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.write_zeroes(offset, len, true)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        check_range(self.size, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let mode = if may_unmap {
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
        } else {
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
        };
        match self.fallocate(mode, offset, len) {
            Err(BlockError::Unsupported(_)) => self.write_zero_bytes(offset, len),
            other => other,
        }
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_data()?;
        Ok(())
    }

    /// Holes from `SEEK_HOLE`/`SEEK_DATA`; a hole reads as zeros.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<crate::Extent>> {
        check_range(self.size, offset, len)?;
        let end = offset + len;
        let fd = self.file.as_raw_fd();
        let seek = |whence: libc::c_int, at: u64| -> Option<u64> {
            // SAFETY: lseek on an open descriptor reads no memory of ours. It moves the file
            // offset, which nothing here uses (all I/O is positional).
            let r = unsafe { libc::lseek(fd, at as libc::off_t, whence) };
            (r >= 0).then_some(r as u64)
        };
        let mut extents = Vec::new();
        let mut at = offset;
        while at < end {
            // The next data at or after `at`; none means a hole to the end of the file.
            let data = seek(libc::SEEK_DATA, at).unwrap_or(end).min(end);
            if data > at {
                extents.push(crate::Extent {
                    len: data - at,
                    hole: true,
                    zero: true,
                });
                at = data;
                continue;
            }
            let hole = seek(libc::SEEK_HOLE, at).unwrap_or(end).min(end);
            extents.push(crate::Extent {
                len: hole.max(at + 1) - at,
                hole: false,
                zero: false,
            });
            at = hole.max(at + 1);
        }
        Ok(extents)
    }
}
