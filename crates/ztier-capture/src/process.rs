//! One running process: opened, asked whether it still runs, and its captured mappings read
//! once: which pages are in memory or in swap from `/proc/PID/pagemap`, their contents from
//! `/proc/PID/mem`, a shmem mapping's pages from its object (`shmem`) where this user may.
//!
//! The reads go through `/proc/PID/mem` (`pread`, safe code, the same access check as
//! `process_vm_readv`: root, or ptrace access to the process). They are made a chunk of at
//! most [`CHUNK_PAGES`] at a time, the pagemap entries of a chunk read just before its
//! pages, so a mapping that changes under the capture is seen as it is when its chunk is
//! read, not as it was when the capture began.
//!
//! What the copy is: without `stop`, the process runs on while it is read, so the copy is
//! not one instant's memory: the kernel copies `/proc/PID/mem` (and a shmem object) a page at
//! a time, each page at its own instant, and a page the process writes while it is copied can
//! be torn (part old, part new). A page's presence (pagemap) is read just before its chunk's
//! content, so a page can also be freed in between: it is then read as the mapping now has it,
//! or the read stops short there. With `stop` (`crate::snapshot`), the process is stopped
//! (SIGSTOP, every thread) for the whole read and continued after, even on an error: the copy
//! is one instant's, and the process loses that long. Either way, reading a swapped-out page
//! brings it back into memory (the capture is a reader like any other).
//!
//! A process that exits is never mistaken for one that unmapped its memory: once its address
//! space is gone (exit, or exec) `/proc/PID/mem` and `pagemap` read 0 bytes, which a live
//! address space never does (an unmapped address reads as EIO, or as empty entries), and that
//! is an error, [`CaptureError::Exited`] or [`CaptureError::Replaced`]. While the kernel
//! tears a large address space down the process's state still reads R or D: [`Liveness`]
//! looks at its flags (`PF_EXITING`), its memory size and a pending SIGKILL too.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::key::{PageKey, PhysicalPage, Taken};
use crate::maps::{read_maps, Mapping};
use crate::pagemap::{entries, PageEntry};
use crate::shmem::{self, Opened};
use crate::{open_error, CaptureError, Result, PAGE};

/// Pages read from the process at a time.
pub const CHUNK_PAGES: usize = 256;

/// A process opened for reading.
pub struct Process {
    pid: u32,
    mem: File,
    pagemap: File,
    /// `starttime` from `/proc/PID/stat` when opened: a process of the same pid with another
    /// start time is not this one.
    start_time: u64,
    /// Read when opened: a process that exits takes them with it.
    name: String,
    command_line: String,
}

/// Whether a process opened still runs, as `/proc/PID/stat` and `status` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Running,
    /// Exiting: `PF_EXITING` set, its memory gone, or SIGKILL pending. Its state may still
    /// read R or D while the kernel tears its address space down.
    Exiting,
    /// Exited and not reaped, or dead.
    Zombie,
    /// No process of that pid, or another one (the pid reused).
    Gone,
}

/// One captured mapping as read.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MappingRead {
    #[serde(flatten)]
    pub mapping: Mapping,
    /// How its pages were read.
    pub read_via: ReadVia,
    /// Pages in memory (read through the object: the object's pages in the window, in memory
    /// or in swap, which shmem does not tell apart), and in swap (pagemap's swap bit).
    pub pages_present: u64,
    pub pages_swapped: u64,
    /// Pages handed on: each physical page once in the capture.
    pub pages_read: u64,
    /// Unmapped (whole or in part) while the capture ran: the pages read before are kept.
    pub vanished: bool,
}

/// Where a mapping's pages were read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadVia {
    /// `/proc/PID/mem`: the pages pagemap shows in memory or in swap.
    ProcessMemory,
    /// The shmem object, through `/proc/PID/map_files` (`shmem`): every page it holds in
    /// the mapping's window.
    ShmemObject,
}

/// What one read of a process saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessRead {
    pub pid: u32,
    /// Its number in the capture, which its private pages' keys carry (`crate::key`).
    pub number: u32,
    pub name: String,
    pub command_line: String,
    pub pages_present: u64,
    pub pages_swapped: u64,
    /// Pages handed on (a page another process's mapping gave first is not counted again).
    pub pages_read: u64,
    pub mappings: Vec<MappingRead>,
}

/// What a failed or short read of `/proc/PID/mem` or `pagemap` means.
enum Got {
    /// This many bytes (a short count: the rest of the range is no longer mapped).
    Bytes(usize),
    /// EIO at the first byte: the address is no longer mapped.
    Unmapped,
    /// 0 bytes: the address space is gone (the process exits, or ran another program).
    AddressSpaceGone,
}

impl Process {
    /// Opens `pid` for reading: [`CaptureError::NoProcess`] if there is none,
    /// [`CaptureError::Zombie`] if it has exited and not been reaped,
    /// [`CaptureError::Permission`] if this user may not read it.
    pub fn open(pid: u32) -> Result<Process> {
        let stat = Stat::read(pid)?;
        if stat.flags & PF_KTHREAD != 0 {
            return Err(CaptureError::KernelThread {
                pid,
                name: comm(pid),
            });
        }
        match stat.state {
            'Z' => return Err(CaptureError::Zombie { pid }),
            'X' | 'x' => return Err(CaptureError::NoProcess { pid }),
            _ => {}
        }
        let open = |name: &str| {
            let path = PathBuf::from(format!("/proc/{pid}/{name}"));
            File::open(&path).map_err(|e| open_error(pid, &path, e))
        };
        let process = Process {
            pid,
            mem: open("mem")?,
            pagemap: open("pagemap")?,
            start_time: stat.start_time,
            name: comm(pid),
            command_line: command_line(pid),
        };
        // Opening mem checks ptrace access at open on some kernels and at read on others:
        // one entry of pagemap read now makes the refusal come here, not mid-capture.
        let mut probe = [0u8; 8];
        if let Err(e) = process.pagemap.read_at(&mut probe, 0) {
            return Err(open_error(
                pid,
                &PathBuf::from(format!("/proc/{pid}/pagemap")),
                e,
            ));
        }
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// `starttime` from `/proc/PID/stat`: with the pid, what tells this process from a later
    /// one of the same pid.
    pub fn start_time(&self) -> u64 {
        self.start_time
    }

    /// Whether the process this was opened on still runs.
    pub fn liveness(&self) -> Liveness {
        let Ok(stat) = Stat::read(self.pid) else {
            return Liveness::Gone;
        };
        if stat.start_time != self.start_time {
            Liveness::Gone
        } else if matches!(stat.state, 'Z' | 'X' | 'x') {
            Liveness::Zombie
        } else if stat.flags & PF_EXITING != 0 || stat.vsize == 0 || kill_pending(self.pid) {
            Liveness::Exiting
        } else {
            Liveness::Running
        }
    }

    /// Its command line, arguments joined by spaces, as when it was opened.
    pub fn command_line(&self) -> &str {
        &self.command_line
    }

    /// Its short name (`comm`), as when it was opened.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The error for this process having ended (or ended its address space) with
    /// `pages_read` pages read: [`CaptureError::Replaced`] if it still runs (it ran another
    /// program), else [`CaptureError::Exited`].
    pub(crate) fn ended(&self, pages_read: u64) -> CaptureError {
        match self.liveness() {
            Liveness::Running => CaptureError::Replaced {
                pid: self.pid,
                pages_read,
            },
            _ => CaptureError::Exited {
                pid: self.pid,
                pages_read,
            },
        }
    }

    /// Reads every captured page once (see the module's note on consistency), calling
    /// `on_page` with its key and content, mapping by mapping in address order, skipping a
    /// page `taken` has had (from another mapping or process). The process ending during
    /// the read is [`CaptureError::Exited`] or [`CaptureError::Replaced`]; a mapping unmapped
    /// meanwhile is marked [`vanished`](MappingRead::vanished) and the read goes on.
    pub(crate) fn read(
        &self,
        number: u32,
        file_backed: bool,
        taken: &mut Taken,
        on_page: &mut dyn FnMut(PageKey, &[u8]) -> Result<()>,
    ) -> Result<ProcessRead> {
        // The process gone by the time a read of its /proc files fails (its directory gone
        // once it is reaped, its pid perhaps another process's) is an exit, whatever the
        // failed read said; an error of `on_page`'s own is passed on as it is.
        let mut pages = 0u64;
        let mut page_failed = false;
        let result = self.read_all(number, file_backed, taken, &mut |key, page| {
            let r = on_page(key, page);
            page_failed = r.is_err();
            pages += u64::from(r.is_ok());
            r
        });
        match result {
            Err(e)
                if !page_failed
                    && !matches!(
                        e,
                        CaptureError::Exited { .. } | CaptureError::Replaced { .. }
                    )
                    && self.liveness() != Liveness::Running =>
            {
                Err(CaptureError::Exited {
                    pid: self.pid,
                    pages_read: pages,
                })
            }
            other => other,
        }
    }

    fn read_all(
        &self,
        number: u32,
        file_backed: bool,
        taken: &mut Taken,
        on_page: &mut dyn FnMut(PageKey, &[u8]) -> Result<()>,
    ) -> Result<ProcessRead> {
        let maps = read_maps(self.pid)?;
        let mut read = ProcessRead {
            pid: self.pid,
            number,
            name: self.name.clone(),
            command_line: self.command_line.clone(),
            pages_present: 0,
            pages_swapped: 0,
            pages_read: 0,
            mappings: Vec::new(),
        };
        let mut buffers = Buffers {
            entries: vec![0u8; CHUNK_PAGES * 8],
            pages: vec![0u8; CHUNK_PAGES * PAGE],
        };
        for mapping in maps.into_iter().filter(|m| m.captured(file_backed)) {
            let mut m = MappingRead {
                mapping,
                read_via: ReadVia::ProcessMemory,
                pages_present: 0,
                pages_swapped: 0,
                pages_read: 0,
                vanished: false,
            };
            // A private mapping is read through /proc/PID/mem, and so is a shmem mapping
            // whose object this user may not open.
            let object = if m.mapping.kind.shmem() {
                shmem::open(self.pid, &m.mapping)?
            } else {
                Opened::NotPermitted
            };
            match object {
                Opened::Window(window) => {
                    m.read_via = ReadVia::ShmemObject;
                    self.read_object(&window, &mut m, taken, &mut buffers, on_page)?;
                }
                Opened::NotPermitted => self.read_mapping(
                    number,
                    &mut m,
                    taken,
                    &mut buffers,
                    read.pages_read,
                    on_page,
                )?,
                Opened::Gone => m.vanished = true,
            }
            read.pages_present += m.pages_present;
            read.pages_swapped += m.pages_swapped;
            read.pages_read += m.pages_read;
            read.mappings.push(m);
        }
        // Mappings no longer wholly mapped at the end were unmapped (or remapped) meanwhile.
        if let Ok(now) = read_maps(self.pid) {
            for m in &mut read.mappings {
                m.vanished |= !covered(&now, m.mapping.start, m.mapping.end);
            }
        }
        if self.liveness() != Liveness::Running {
            return Err(self.ended(read.pages_read));
        }
        Ok(read)
    }

    /// Reads a mapping's pages in memory or in swap through `/proc/PID/mem`.
    fn read_mapping(
        &self,
        number: u32,
        read: &mut MappingRead,
        taken: &mut Taken,
        buffers: &mut Buffers,
        pages_before: u64,
        on_page: &mut dyn FnMut(PageKey, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let object = read.mapping.shmem_object();
        let first = read.mapping.start / PAGE as u64;
        let last = read.mapping.end / PAGE as u64;
        let gone = |read: &MappingRead| self.ended(pages_before + read.pages_read);
        let mut vpn = first;
        while vpn < last {
            let n = ((last - vpn) as usize).min(CHUNK_PAGES);
            match self.read_fully(&self.pagemap, &mut buffers.entries[..n * 8], vpn * 8)? {
                // The pagemap of an unmapped range reads as empty entries, never short.
                Got::Bytes(got) if got == n * 8 => {}
                _ => return Err(gone(read)),
            }
            let chunk: Vec<PageEntry> = entries(&buffers.entries[..n * 8]).collect();
            let mut i = 0;
            while i < n {
                if !chunk[i].captured() {
                    i += 1;
                    continue;
                }
                let run_start = i;
                while i < n && chunk[i].captured() {
                    i += 1;
                }
                let run = &chunk[run_start..i];
                let bytes = &mut buffers.pages[..run.len() * PAGE];
                let address = (vpn + run_start as u64) * PAGE as u64;
                let got = match self.read_fully(&self.mem, bytes, address)? {
                    Got::Bytes(got) => got,
                    Got::Unmapped => 0,
                    Got::AddressSpaceGone => return Err(gone(read)),
                };
                let whole = got / PAGE;
                for (k, entry) in run.iter().enumerate().take(whole) {
                    read.pages_present += u64::from(entry.present());
                    read.pages_swapped += u64::from(entry.swapped());
                    let page_vpn = vpn + (run_start + k) as u64;
                    let (key, physical) = match object {
                        Some(object) => {
                            let index = (read.mapping.offset / PAGE as u64) + page_vpn - first;
                            (
                                PageKey::shared(taken.object_number(object)?, index)?,
                                Some(PhysicalPage::Shmem(object, index)),
                            )
                        }
                        None => (
                            PageKey::private(number, page_vpn)?,
                            entry
                                .frame()
                                .map(PhysicalPage::Frame)
                                .or(entry.swap_slot().map(PhysicalPage::SwapSlot)),
                        ),
                    };
                    if !taken.take(physical) {
                        continue;
                    }
                    on_page(key, &bytes[k * PAGE..(k + 1) * PAGE])?;
                    read.pages_read += 1;
                }
                if whole < run.len() {
                    // A read that stops short: this part of the mapping was unmapped; the
                    // pages read before are kept.
                    read.vanished = true;
                    return Ok(());
                }
            }
            vpn += n as u64;
        }
        Ok(())
    }

    /// Reads a shmem mapping's pages through its object: every page of the object in the
    /// mapping's window, mapped here or not, in memory or in swap.
    fn read_object(
        &self,
        window: &shmem::ObjectWindow,
        read: &mut MappingRead,
        taken: &mut Taken,
        buffers: &mut Buffers,
        on_page: &mut dyn FnMut(PageKey, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let object = read
            .mapping
            .shmem_object()
            .expect("read through its object: a shmem mapping");
        let number = taken.object_number(object)?;
        let mut from = window.start();
        while let Some((first, end)) = window.next_data(from)? {
            from = end * PAGE as u64;
            read.pages_present += end - first;
            let mut index = first;
            while index < end {
                let n = ((end - index) as usize).min(CHUNK_PAGES);
                let page = |k: usize| PhysicalPage::Shmem(object, index + k as u64);
                if (0..n).all(|k| taken.has(&page(k))) {
                    // Another mapping (here or in another process) gave these already.
                    taken.count_duplicates(n as u64);
                    index += n as u64;
                    continue;
                }
                let bytes = &mut buffers.pages[..n * PAGE];
                let got = window.read(bytes, index)?;
                let mut whole = got / PAGE;
                if got % PAGE != 0 {
                    // The object ends inside this page (a SysV segment of 56 bytes, say): the
                    // rest of the page is mapped all the same, and holds whatever the process
                    // wrote there. Read it as the process sees it.
                    let address =
                        read.mapping.start + (index + whole as u64) * PAGE as u64 - window.start();
                    let page = &mut bytes[whole * PAGE..(whole + 1) * PAGE];
                    match self.read_fully(&self.mem, page, address)? {
                        Got::Bytes(n) if n == PAGE => whole += 1,
                        Got::AddressSpaceGone => return Err(self.ended(read.pages_read)),
                        // Unmapped meanwhile: the mapping is marked vanished below.
                        _ => {}
                    }
                }
                for k in 0..whole {
                    if taken.take(Some(page(k))) {
                        on_page(
                            PageKey::shared(number, index + k as u64)?,
                            &bytes[k * PAGE..(k + 1) * PAGE],
                        )?;
                        read.pages_read += 1;
                    }
                }
                if whole < n {
                    // The object was truncated under the capture.
                    read.vanished = true;
                    return Ok(());
                }
                index += n as u64;
            }
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes of `/proc/PID/mem` or `pagemap` at `offset`.
    fn read_fully(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<Got> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => return Ok(Got::AddressSpaceGone),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => {
                    return Ok(if done > 0 {
                        Got::Bytes(done)
                    } else {
                        Got::Unmapped
                    });
                }
                Err(error) => {
                    return Err(CaptureError::Io {
                        path: PathBuf::from(format!("/proc/{}/mem", self.pid)),
                        error,
                    });
                }
            }
        }
        Ok(Got::Bytes(done))
    }
}

/// The reusable buffers of one process's read.
struct Buffers {
    entries: Vec<u8>,
    pages: Vec<u8>,
}

/// Whether `[start, end)` lies wholly within the mappings `maps` (sorted, as the kernel
/// lists them).
fn covered(maps: &[Mapping], start: u64, end: u64) -> bool {
    let mut at = start;
    for m in maps {
        if m.end <= at {
            continue;
        }
        if m.start > at {
            return false;
        }
        at = m.end;
        if at >= end {
            return true;
        }
    }
    at >= end
}

/// `task_struct`'s flag of a kernel thread (`PF_KTHREAD`), in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u64 = 0x0020_0000;
/// Set by `do_exit()` before it tears the address space down (`PF_EXITING`).
const PF_EXITING: u64 = 0x0000_0004;
/// SIGKILL's bit in `/proc/PID/status`'s pending-signal masks (signal 9: bit 8).
const SIGKILL_BIT: u64 = 1 << 8;

/// The fields of `/proc/PID/stat` a capture reads.
struct Stat {
    state: char,
    flags: u64,
    start_time: u64,
    /// Bytes of address space: 0 once the process's memory is gone.
    vsize: u64,
}

impl Stat {
    fn read(pid: u32) -> Result<Stat> {
        let path = PathBuf::from(format!("/proc/{pid}/stat"));
        let text = std::fs::read_to_string(&path).map_err(|e| open_error(pid, &path, e))?;
        // The name (field 2) is in parentheses and may hold spaces and parentheses: the
        // fields after it start after the last ')'.
        let malformed = || CaptureError::Malformed {
            path: path.clone(),
            reason: text.trim().to_string(),
        };
        let rest = &text[text.rfind(')').ok_or_else(malformed)? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state); flags is field 9, starttime 22, vsize 23.
        let number = |field: usize| -> Result<u64> {
            fields
                .get(field - 3)
                .and_then(|s| s.parse().ok())
                .ok_or_else(malformed)
        };
        Ok(Stat {
            state: fields
                .first()
                .and_then(|s| s.chars().next())
                .ok_or_else(malformed)?,
            flags: number(9)?,
            start_time: number(22)?,
            vsize: number(23)?,
        })
    }
}

/// Whether SIGKILL is pending for the process (`SigPnd` or `ShdPnd`): it is about to exit.
fn kill_pending(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status.lines().any(|line| {
            line.strip_prefix("SigPnd:")
                .or_else(|| line.strip_prefix("ShdPnd:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & SIGKILL_BIT != 0)
        })
    })
}

/// The process's short name (`comm`).
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The process's command line, arguments joined by spaces.
fn command_line(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The process stopped by SIGSTOP while it is read, continued when this is dropped (unless
/// it was stopped before: then it is left as it was found).
pub(crate) struct Stopped<'a> {
    process: &'a Process,
    continue_after: bool,
}

impl<'a> Stopped<'a> {
    pub(crate) fn stop(process: &'a Process) -> Result<Stopped<'a>> {
        let already = matches!(Stat::read(process.pid)?.state, 'T' | 't');
        let pid = rustix::process::Pid::from_raw(process.pid as i32)
            .ok_or(CaptureError::NoProcess { pid: process.pid })?;
        if !already {
            rustix::process::kill_process(pid, rustix::process::Signal::STOP).map_err(|e| {
                CaptureError::Io {
                    path: PathBuf::from(format!("/proc/{}", process.pid)),
                    error: e.into(),
                }
            })?;
        }
        let guard = Stopped {
            process,
            continue_after: !already,
        };
        // Every thread stops at its next return to user space; wait for the group stop.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let threads_stopped = std::fs::read_dir(format!("/proc/{}/task", process.pid))
                .map(|dir| {
                    dir.flatten().all(|t| {
                        std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                            s.rfind(')')
                                .and_then(|i| s[i + 1..].split_whitespace().next())
                                .is_some_and(|st| matches!(st, "T" | "t" | "Z" | "X"))
                        })
                    })
                })
                .unwrap_or(false);
            if threads_stopped {
                return Ok(guard);
            }
            if process.liveness() != Liveness::Running {
                return Err(process.ended(0));
            }
            if Instant::now() > deadline {
                return Err(CaptureError::Malformed {
                    path: PathBuf::from(format!("/proc/{}/task", process.pid)),
                    reason: "the process's threads did not all stop within 5 s of SIGSTOP \
                             (one in uninterruptible sleep?)"
                        .into(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if self.continue_after {
            if let Some(pid) = rustix::process::Pid::from_raw(self.process.pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::CONT);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ObjectNumbers;
    use crate::maps::{DeviceId, MappingKind};

    #[test]
    fn coverage_of_a_range() {
        let m = |s: u64, e: u64| Mapping {
            start: s,
            end: e,
            perms: "rw-p".into(),
            offset: 0,
            device: DeviceId { major: 0, minor: 0 },
            inode: 0,
            path: String::new(),
            kind: MappingKind::Anonymous,
        };
        let maps = [m(0x1000, 0x3000), m(0x3000, 0x5000), m(0x8000, 0x9000)];
        assert!(covered(&maps, 0x1000, 0x5000));
        assert!(covered(&maps, 0x2000, 0x4000));
        assert!(!covered(&maps, 0x4000, 0x6000));
        assert!(!covered(&maps, 0x6000, 0x7000));
        assert!(covered(&maps, 0x8000, 0x9000));
    }

    #[test]
    fn this_process_reads_its_own_pages() {
        let me = Process::open(std::process::id()).unwrap();
        assert_eq!(me.liveness(), Liveness::Running);
        // A page-aligned run of known pages inside a vector.
        let mut v = vec![0u8; 64 * PAGE];
        let offset = (PAGE - (v.as_ptr() as usize % PAGE)) % PAGE;
        let pages = &mut v[offset..offset + 32 * PAGE];
        for (i, p) in pages.chunks_exact_mut(PAGE).enumerate() {
            p.fill(i as u8 + 1);
        }
        let first = pages.as_ptr() as u64 / PAGE as u64;
        let mut seen = 0;
        let mut objects = ObjectNumbers::default();
        let mut taken = Taken::new(&mut objects);
        let read = me
            .read(0, false, &mut taken, &mut |key, page| {
                let vpn = key.0;
                if (first..first + 32).contains(&vpn) {
                    assert!(page.iter().all(|&b| b == (vpn - first) as u8 + 1));
                    seen += 1;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, 32);
        assert!(read.pages_read >= 32 && read.pages_present >= read.pages_read);
        assert!(matches!(
            Process::open(u32::MAX / 2),
            Err(CaptureError::NoProcess { .. })
        ));
        std::hint::black_box(&v);
    }
}
