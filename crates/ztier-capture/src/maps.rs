//! `/proc/PID/maps`: a process's mappings, what each is, and which of them a capture reads.
//!
//! A capture takes the memory a swap device would hold: private anonymous memory (the heap,
//! the stacks, anonymous mappings, named ones too: `[anon:NAME]`) and shared memory, which
//! the kernel keeps in shmem and swaps through zswap and zram like any anonymous page: shared
//! anonymous mappings (`MAP_SHARED | MAP_ANONYMOUS`), SysV segments, memfds and files on a
//! tmpfs (`/dev/shm`); with `file_backed`, private file mappings as well (their copy-on-write
//! pages and the file pages they map). It never takes shared mappings of other files (their
//! pages go back to the file, not to swap; `MAP_HUGETLB` memory, which is never swapped, is
//! one), the kernel's special mappings (`[vdso]`, `[vvar]`, ...) or mappings the process
//! cannot read (guard pages).
//!
//! How a shared mapping is told apart, from its line alone but for the last: the kernel names
//! a shared anonymous mapping `/dev/zero (deleted)` (`[anon_shmem:NAME]` once named), a SysV
//! segment `/SYSV%08x (deleted)` (its key; the inode column is its shmid), a memfd
//! `/memfd:NAME (deleted)`; any other shared mapping is of a tmpfs file if its device is a
//! tmpfs mount's in the process's `/proc/PID/mountinfo`. A SysV segment or memfd made with
//! `SHM_HUGETLB` / `MFD_HUGETLB` is named the same and taken, though the kernel never swaps it.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::{CaptureError, Result};

/// What a mapping is, by its path column, flags and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingKind {
    Heap,
    Stack,
    /// Private anonymous memory (no path, or `[anon:NAME]`).
    Anonymous,
    /// `MAP_SHARED | MAP_ANONYMOUS` (and shared mappings of `/dev/zero`): shmem.
    SharedAnonymous,
    /// A SysV shared memory segment (`shmat`): shmem.
    #[serde(rename = "sysv")]
    SysV,
    /// A shared mapping of a memfd: shmem.
    Memfd,
    /// A shared mapping of a file on a tmpfs (`/dev/shm`, POSIX `shm_open`): shmem.
    ShmemFile,
    /// A private mapping of a file: captured with `file_backed`.
    File,
    /// A shared mapping of a file that is not on a tmpfs, or of a device: never captured.
    SharedFile,
    /// `[vdso]`, `[vvar]`, `[vsyscall]` and the like: never captured.
    Special,
}

impl MappingKind {
    /// Whether its pages are a shmem object's (one object, whichever process maps it).
    pub fn shmem(self) -> bool {
        matches!(
            self,
            MappingKind::SharedAnonymous
                | MappingKind::SysV
                | MappingKind::Memfd
                | MappingKind::ShmemFile
        )
    }
}

/// A device number, as `/proc/PID/maps` prints it (`major:minor`, hexadecimal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub major: u32,
    pub minor: u32,
}

impl DeviceId {
    /// `08:01` as `/proc/PID/maps` writes it (hexadecimal), or `8:1` as
    /// `/proc/PID/mountinfo` does (decimal).
    fn parse(text: &str, radix: u32) -> Option<DeviceId> {
        let (major, minor) = text.split_once(':')?;
        Some(DeviceId {
            major: u32::from_str_radix(major, radix).ok()?,
            minor: u32::from_str_radix(minor, radix).ok()?,
        })
    }
}

impl serde::Serialize for DeviceId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{:02x}:{:02x}", self.major, self.minor))
    }
}

/// One shmem object (a shared anonymous mapping's, a SysV segment, a memfd, a tmpfs file),
/// whichever process maps it, at whatever address: its device and inode. A SysV segment's
/// inode is its shmid, which may equal another shmem object's inode number on the same
/// internal mount: the kind keeps them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ShmemObject {
    pub sysv: bool,
    pub device: DeviceId,
    pub inode: u64,
}

/// The devices of a process's tmpfs mounts, from `/proc/PID/mountinfo`.
#[derive(Debug, Clone, Default)]
pub struct TmpfsDevices(HashSet<DeviceId>);

impl TmpfsDevices {
    /// From the text of a `/proc/PID/mountinfo`: `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS
    /// [TAGS...] - FSTYPE SOURCE SUPER_OPTIONS`.
    pub fn from_mountinfo(text: &str) -> TmpfsDevices {
        TmpfsDevices(
            text.lines()
                .filter_map(|line| {
                    let (mount, fs) = line.split_once(" - ")?;
                    if fs.split_whitespace().next()? != "tmpfs" {
                        return None;
                    }
                    DeviceId::parse(mount.split_whitespace().nth(2)?, 10)
                })
                .collect(),
        )
    }

    fn contains(&self, device: DeviceId) -> bool {
        self.0.contains(&device)
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `rw-s` as the kernel prints them.
    pub perms: String,
    pub offset: u64,
    pub device: DeviceId,
    pub inode: u64,
    pub path: String,
    pub kind: MappingKind,
}

impl Mapping {
    pub fn pages(&self, page_size: u64) -> u64 {
        (self.end - self.start) / page_size
    }

    fn readable(&self) -> bool {
        self.perms.starts_with('r')
    }

    /// Whether a capture reads this mapping.
    pub fn captured(&self, file_backed: bool) -> bool {
        self.readable()
            && match self.kind {
                MappingKind::Heap | MappingKind::Stack | MappingKind::Anonymous => true,
                kind if kind.shmem() => true,
                MappingKind::File => file_backed,
                _ => false,
            }
    }

    /// The shmem object it maps, for a shmem kind.
    pub fn shmem_object(&self) -> Option<ShmemObject> {
        self.kind.shmem().then_some(ShmemObject {
            sysv: self.kind == MappingKind::SysV,
            device: self.device,
            inode: self.inode,
        })
    }

    /// Parses one line (`start-end perms offset dev inode [path]`), `tmpfs` telling which
    /// devices are tmpfs mounts.
    pub fn parse(line: &str, tmpfs: &TmpfsDevices) -> Option<Mapping> {
        let mut fields = line.splitn(6, ' ');
        let range = fields.next()?;
        let perms = fields.next()?;
        let offset = fields.next()?;
        let device = DeviceId::parse(fields.next()?, 16)?;
        let inode = fields.next()?;
        let path = fields.next().unwrap_or("").trim_start().to_string();
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if end <= start || perms.len() != 4 {
            return None;
        }
        let kind = if perms.ends_with('s') {
            if path == "/dev/zero (deleted)" || path.starts_with("[anon_shmem:") {
                MappingKind::SharedAnonymous
            } else if path.starts_with("/SYSV") && path.ends_with(" (deleted)") {
                MappingKind::SysV
            } else if path.starts_with("/memfd:") {
                MappingKind::Memfd
            } else if !path.starts_with('[') && tmpfs.contains(device) {
                MappingKind::ShmemFile
            } else {
                MappingKind::SharedFile
            }
        } else if path == "[heap]" {
            MappingKind::Heap
        } else if path == "[stack]" || path.starts_with("[stack:") {
            MappingKind::Stack
        } else if path.is_empty() || path.starts_with("[anon:") {
            MappingKind::Anonymous
        } else if path.starts_with('[') {
            MappingKind::Special
        } else {
            MappingKind::File
        };
        Some(Mapping {
            start,
            end,
            perms: perms.to_string(),
            offset: u64::from_str_radix(offset, 16).ok()?,
            device,
            inode: inode.parse().ok()?,
            path,
            kind,
        })
    }
}

/// Reads a process's mappings. A process that is gone (or a zombie, whose maps are empty)
/// is [`CaptureError::Exited`]; a line the kernel would not print is an error, not skipped.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let read = |name: &str| {
        let path = PathBuf::from(format!("/proc/{pid}/{name}"));
        std::fs::read_to_string(&path)
            .map(|text| (path.clone(), text))
            .map_err(|e| crate::open_error(pid, &path, e))
    };
    let (_, mountinfo) = read("mountinfo")?;
    let tmpfs = TmpfsDevices::from_mountinfo(&mountinfo);
    let (path, text) = read("maps")?;
    let mut maps = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mapping = Mapping::parse(line, &tmpfs).ok_or_else(|| CaptureError::Malformed {
            path: path.clone(),
            reason: format!("line {}: {line:?}", n + 1),
        })?;
        maps.push(mapping);
    }
    if maps.is_empty() {
        return Err(CaptureError::Exited { pid, pages_read: 0 });
    }
    Ok(maps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_classified() {
        // /dev/shm is device 0:27 (00:1b in maps); 0:6 is devtmpfs, not tmpfs.
        let tmpfs = TmpfsDevices::from_mountinfo(
            "24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,mode=755\n\
             30 25 0:27 / /dev/shm rw,relatime shared:5 - tmpfs tmpfs rw,size=24684092k\n\
             31 23 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n",
        );
        let cases = [
            (
                "55d0c000-55d2d000 rw-p 00000000 00:00 0                          [heap]",
                MappingKind::Heap,
                true,
            ),
            (
                "7ffd1000-7ffd3000 rw-p 00000000 00:00 0                          [stack]",
                MappingKind::Stack,
                true,
            ),
            (
                "7f000000-7f100000 rw-p 00000000 00:00 0 ",
                MappingKind::Anonymous,
                true,
            ),
            (
                "7f000000-7f100000 rw-p 00000000 00:00 0",
                MappingKind::Anonymous,
                true,
            ),
            (
                "7f000000-7f100000 rw-p 00000000 00:00 0   [anon:jemalloc]",
                MappingKind::Anonymous,
                true,
            ),
            (
                "7f000000-7f001000 ---p 00000000 00:00 0 ",
                MappingKind::Anonymous,
                false,
            ),
            (
                "7f200000-7f300000 r--p 00001000 08:01 1234   /usr/lib/libc.so.6",
                MappingKind::File,
                false,
            ),
            (
                "7f200000-7f300000 rw-s 00000000 00:01 99   /dev/zero (deleted)",
                MappingKind::SharedAnonymous,
                true,
            ),
            (
                "7f200000-7f300000 rw-s 00000000 00:01 99   [anon_shmem:buffers]",
                MappingKind::SharedAnonymous,
                true,
            ),
            (
                "7f1dbe048000-7f1dbe050000 rw-s 00000000 00:01 3   /SYSV00000000 (deleted)",
                MappingKind::SysV,
                true,
            ),
            (
                "7f1dbe050000-7f1dbe060000 r--s 00000000 00:01 1057   /memfd:probe (deleted)",
                MappingKind::Memfd,
                true,
            ),
            (
                "7f1dbe040000-7f1dbe048000 rw-s 00000000 00:1b 2   /dev/shm/PostgreSQL.1",
                MappingKind::ShmemFile,
                true,
            ),
            (
                "7f1dbe040000-7f1dbe048000 rw-p 00000000 00:1b 2   /dev/shm/PostgreSQL.1",
                MappingKind::File,
                false,
            ),
            (
                "7f1dbf000000-7f1dbf007000 r--s 00000000 08:01 325745   /usr/lib/gconv-modules.cache",
                MappingKind::SharedFile,
                false,
            ),
            (
                "7f1dbf000000-7f1dbf007000 rw-s 00000000 00:06 12   /dev/dri/card0",
                MappingKind::SharedFile,
                false,
            ),
            (
                "7f1dbf000000-7f1dbf007000 ---s 00000000 00:01 9   /dev/zero (deleted)",
                MappingKind::SharedAnonymous,
                false,
            ),
            (
                "7fff000-7fff2000 r--p 00000000 00:00 0   [vvar]",
                MappingKind::Special,
                false,
            ),
            (
                "7f200000-7f300000 rw-p 00001000 08:01 1234   /path with spaces/x",
                MappingKind::File,
                false,
            ),
        ];
        for (line, kind, captured) in cases {
            let m = Mapping::parse(line, &tmpfs).unwrap_or_else(|| panic!("{line}"));
            assert_eq!((m.kind, m.captured(false)), (kind, captured), "{line}");
            assert_eq!(m.shmem_object().is_some(), kind.shmem(), "{line}");
        }
        let m = Mapping::parse(cases.last().unwrap().0, &tmpfs).unwrap();
        assert_eq!(m.path, "/path with spaces/x");
        assert_eq!(m.device, DeviceId { major: 8, minor: 1 });
        assert!(m.captured(true));
        // A SysV segment and a memfd of the same inode number are two objects.
        let sysv = Mapping::parse(cases[9].0, &tmpfs).unwrap().shmem_object();
        let memfd = Mapping::parse(
            "7f1dbe050000-7f1dbe060000 rw-s 00000000 00:01 3   /memfd:x (deleted)",
            &tmpfs,
        )
        .unwrap()
        .shmem_object();
        assert_ne!(sysv, memfd);
        assert_eq!(
            serde_json::to_value(DeviceId {
                major: 0,
                minor: 0x1b
            })
            .unwrap(),
            "00:1b"
        );
        assert_eq!(serde_json::to_value(MappingKind::SysV).unwrap(), "sysv");
        for bad in [
            "",
            "zz-10 rw-p 0 00:00 0",
            "20-10 rw-p 00000000 00:00 0",
            "10-20 rw 0 00:00 0",
            "10-20 rw-p 0 0000 0",
        ] {
            assert!(Mapping::parse(bad, &tmpfs).is_none(), "{bad}");
        }
    }
}
