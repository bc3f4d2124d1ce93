//! A shmem mapping read through its object: `/proc/PID/map_files/START-END` opens anew the
//! file the mapping maps (a shared anonymous mapping's, a SysV segment's, a memfd, a tmpfs
//! file). Its pages are found with `SEEK_DATA` / `SEEK_HOLE` (shmem counts a page in memory
//! or in swap as data, a page never written as a hole) and read with `pread`, which allocates
//! nothing. So a capture takes every page of the object in the mapping's window, as the kernel
//! would swap them: whether or not a captured process has the page mapped now (a page written
//! through a memfd's descriptor, or touched only by a process since gone), and whether it is in
//! memory or in swap (which pagemap cannot say of a shmem page: a swapped-out one's entry is
//! empty). Reading a page in swap brings it back into memory, as reading `/proc/PID/mem` does.
//!
//! Opening `map_files` needs CAP_SYS_ADMIN. Without it [`open`] says so
//! ([`Opened::NotPermitted`]) and the caller reads the mapping through `/proc/PID/mem`: only
//! the pages the process has mapped in memory. The object stays readable while the file is
//! open, whatever becomes of the process: the caller checks that the process still runs.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use rustix::fs::SeekFrom;

use crate::maps::Mapping;
use crate::{CaptureError, Result, PAGE};

/// The part of a shmem object one mapping maps, open for reading.
pub(crate) struct ObjectWindow {
    file: File,
    path: PathBuf,
    /// The window, in bytes of the object: `[start, end)`.
    start: u64,
    end: u64,
}

/// What opening a mapping's object came to.
pub(crate) enum Opened {
    Window(ObjectWindow),
    /// This user may not open `map_files` (no CAP_SYS_ADMIN).
    NotPermitted,
    /// The mapping is no longer there (unmapped, or the process gone).
    Gone,
}

/// Opens the object `mapping` (a shmem mapping of process `pid`) maps.
pub(crate) fn open(pid: u32, mapping: &Mapping) -> Result<Opened> {
    let path = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        mapping.start, mapping.end
    ));
    match File::open(&path) {
        Ok(file) => Ok(Opened::Window(ObjectWindow {
            file,
            path,
            start: mapping.offset,
            end: mapping.offset + (mapping.end - mapping.start),
        })),
        Err(e) => match e.kind() {
            std::io::ErrorKind::PermissionDenied => Ok(Opened::NotPermitted),
            std::io::ErrorKind::NotFound => Ok(Opened::Gone),
            _ if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
                Ok(Opened::Gone)
            }
            _ => Err(CaptureError::Io { path, error: e }),
        },
    }
}

impl ObjectWindow {
    /// The first run of data pages at or after byte `from` of the object, within the window,
    /// as page indexes `[first, end)` in the object; `None` past the last.
    pub(crate) fn next_data(&self, from: u64) -> Result<Option<(u64, u64)>> {
        let page = PAGE as u64;
        let seek = |to: SeekFrom| match rustix::fs::seek(&self.file, to) {
            Ok(at) => Ok(Some(at)),
            // ENXIO: no data at or after the offset (or the offset is past the file's end).
            Err(rustix::io::Errno::NXIO) => Ok(None),
            Err(e) => Err(CaptureError::Io {
                path: self.path.clone(),
                error: e.into(),
            }),
        };
        let Some(data) = seek(SeekFrom::Data(from.max(self.start)))? else {
            return Ok(None);
        };
        if data >= self.end {
            return Ok(None);
        }
        // A hole always follows: the file's end is one.
        let hole = seek(SeekFrom::Hole(data))?
            .unwrap_or(self.end)
            .min(self.end);
        Ok(Some((data / page, hole.div_ceil(page))))
    }

    /// Reads whole pages at page `index` of the object into `buf`; returns how many bytes
    /// were read (fewer at the file's end, if it was truncated meanwhile).
    pub(crate) fn read(&self, buf: &mut [u8], index: u64) -> Result<usize> {
        let offset = index * PAGE as u64;
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    return Err(CaptureError::Io {
                        path: self.path.clone(),
                        error,
                    })
                }
            }
        }
        Ok(done)
    }

    /// The window's first byte in the object: the mapping's first page is this page of it.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }
}
