//! `/proc/PID/maps`: a process's mappings, and which of them a capture reads.
//!
//! A capture takes private memory a swap device would hold: the heap, the stacks and
//! anonymous mappings (named ones too, `[anon:NAME]`); with `file_backed`, private file
//! mappings as well (their copy-on-write pages and the file pages they map). It never takes
//! shared mappings, the kernel's special ones (`[vdso]`, `[vvar]`, `[vsyscall]`, ...) or
//! mappings the process cannot read (guard pages).

use std::path::PathBuf;

use crate::{CaptureError, Result};

/// What a mapping is, by its path column and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MappingKind {
    Heap,
    Stack,
    /// Private anonymous memory (no path, or `[anon:NAME]`).
    Anonymous,
    /// A private mapping of a file.
    File,
    /// A shared mapping (of a file, shmem, SysV segment, memfd): never captured.
    Shared,
    /// `[vdso]`, `[vvar]`, `[vsyscall]` and the like: never captured.
    Special,
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `rw-s` as the kernel prints them.
    pub perms: String,
    pub offset: u64,
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
                MappingKind::File => file_backed,
                MappingKind::Shared | MappingKind::Special => false,
            }
    }

    /// Parses one line (`start-end perms offset dev inode [path]`).
    pub fn parse(line: &str) -> Option<Mapping> {
        let mut fields = line.splitn(6, ' ');
        let range = fields.next()?;
        let perms = fields.next()?;
        let offset = fields.next()?;
        let _dev = fields.next()?;
        let inode = fields.next()?;
        let path = fields.next().unwrap_or("").trim_start().to_string();
        let (start, end) = range.split_once('-')?;
        let start = u64::from_str_radix(start, 16).ok()?;
        let end = u64::from_str_radix(end, 16).ok()?;
        if end <= start || perms.len() != 4 {
            return None;
        }
        let private = perms.ends_with('p');
        let kind = if !private {
            MappingKind::Shared
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
            inode: inode.parse().ok()?,
            path,
            kind,
        })
    }
}

/// Reads a process's mappings. A process that is gone (or a zombie, whose maps are empty)
/// is [`CaptureError::Exited`]; a line the kernel would not print is an error, not skipped.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>> {
    let path = PathBuf::from(format!("/proc/{pid}/maps"));
    let text = std::fs::read_to_string(&path).map_err(|e| crate::open_error(pid, &path, e))?;
    let mut maps = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mapping = Mapping::parse(line).ok_or_else(|| CaptureError::Malformed {
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
                MappingKind::Shared,
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
            let m = Mapping::parse(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!((m.kind, m.captured(false)), (kind, captured), "{line}");
        }
        let m = Mapping::parse(cases[9].0).unwrap();
        assert_eq!(m.path, "/path with spaces/x");
        assert!(m.captured(true));
        for bad in [
            "",
            "zz-10 rw-p 0 0 0",
            "20-10 rw-p 00000000 00:00 0",
            "10-20 rw 0 00:00 0",
        ] {
            assert!(Mapping::parse(bad).is_none(), "{bad}");
        }
    }
}
