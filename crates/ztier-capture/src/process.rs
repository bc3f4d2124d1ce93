//! A running process's pages, read once: its mappings from `/proc/PID/maps`, which pages are
//! in memory or in swap from `/proc/PID/pagemap`, their contents from `/proc/PID/mem`.
//!
//! The reads go through `/proc/PID/mem` (`pread`, safe code, the same access check as
//! `process_vm_readv`: root, or ptrace access to the process). They are made a chunk of at
//! most [`CHUNK_PAGES`] at a time, the pagemap entries of a chunk read just before its
//! pages, so a mapping that changes under the capture is seen as it is when its chunk is
//! read, not as it was when the capture began.
//!
//! What the copy is: without `stop`, the process runs on while it is read, so the copy is
//! not one instant's memory: the kernel copies `/proc/PID/mem` a page at a time, each page
//! at its own instant, and a page the process writes while it is copied can be torn (part
//! old, part new). A page's presence (pagemap) is read just before its chunk's content, so
//! a page can also be freed in between: it is then read as the mapping now has it, or the
//! read stops short there. With `stop`, the process is stopped
//! (SIGSTOP, every thread) for the whole read and continued after, even on an error: the copy
//! is one instant's, and the process loses that long. Either way, reading a swapped-out page
//! brings it back into memory (the capture is a reader like any other).

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::maps::{read_maps, Mapping};
use crate::pagemap::{entries, PageEntry};
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
}

/// What one read of the process saw, mapping by mapping.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub mappings: Vec<MappingRead>,
    /// Pages in memory, and in swap, in the captured mappings.
    pub pages_present: u64,
    pub pages_swapped: u64,
    /// Pages handed on (each frame once).
    pub pages_read: u64,
    /// Pages left out because their frame was already read at another address (the shared
    /// zero page, KSM); counted only where the kernel shows frames (root).
    pub duplicate_frames: u64,
    pub seconds: f64,
    /// How long the process was stopped (with `stop`).
    pub stopped_seconds: f64,
}

/// One captured mapping in a snapshot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MappingRead {
    #[serde(flatten)]
    pub mapping: Mapping,
    pub pages_present: u64,
    pub pages_swapped: u64,
    pub pages_read: u64,
    /// Unmapped (whole or in part) while the capture ran: the pages read before are kept.
    pub vanished: bool,
}

impl Process {
    /// Opens `pid` for reading: [`CaptureError::NoProcess`] if there is none,
    /// [`CaptureError::Permission`] if this user may not read it.
    pub fn open(pid: u32) -> Result<Process> {
        let (_, start_time, flags) = stat(pid)?;
        if flags & PF_KTHREAD != 0 {
            return Err(CaptureError::KernelThread {
                pid,
                name: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default(),
            });
        }
        let open = |name: &str| {
            let path = PathBuf::from(format!("/proc/{pid}/{name}"));
            File::open(&path).map_err(|e| open_error(pid, &path, e))
        };
        let process = Process {
            pid,
            mem: open("mem")?,
            pagemap: open("pagemap")?,
            start_time,
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

    /// Whether the process this was opened on still runs (not gone, not a zombie, not
    /// another process of the same pid).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Ok((state, start, _)) if start == self.start_time && !matches!(state, 'Z' | 'X' | 'x'))
    }

    /// Its command line, arguments joined by spaces (empty for a kernel thread).
    pub fn command_line(&self) -> String {
        std::fs::read(format!("/proc/{}/cmdline", self.pid))
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    }

    /// Its short name (`comm`).
    pub fn name(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// Reads every captured page once (see the module's note on consistency), calling
    /// `on_page` with its virtual page number and content, in address order. The process
    /// exiting, before the read or during it, is [`CaptureError::Exited`] (not
    /// [`CaptureError::NoProcess`], once it was opened); a mapping unmapped meanwhile is marked
    /// [`vanished`](MappingRead::vanished) and the capture goes on.
    pub fn snapshot(
        &self,
        file_backed: bool,
        stop: bool,
        on_page: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Snapshot> {
        // The process gone by the time a read of its /proc files fails (its directory gone
        // once it is reaped, its pid perhaps another process's) is an exit, whatever the
        // failed read said; an error of `on_page`'s own is passed on as it is.
        let mut pages = 0u64;
        let mut page_failed = false;
        let result = self.read_all(file_backed, stop, &mut |vpn, page| {
            let r = on_page(vpn, page);
            page_failed = r.is_err();
            pages += u64::from(r.is_ok());
            r
        });
        match result {
            Err(e)
                if !page_failed && !matches!(e, CaptureError::Exited { .. }) && !self.alive() =>
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
        file_backed: bool,
        stop: bool,
        on_page: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Snapshot> {
        if !self.alive() {
            return Err(CaptureError::Exited {
                pid: self.pid,
                pages_read: 0,
            });
        }
        let started = Instant::now();
        let stopped = if stop {
            Some(Stopped::stop(self)?)
        } else {
            None
        };
        let maps = read_maps(self.pid)?;
        let mut snap = Snapshot {
            mappings: Vec::new(),
            pages_present: 0,
            pages_swapped: 0,
            pages_read: 0,
            duplicate_frames: 0,
            seconds: 0.0,
            stopped_seconds: 0.0,
        };
        let mut frames: HashSet<u64> = HashSet::new();
        let mut entries_buf = vec![0u8; CHUNK_PAGES * 8];
        let mut pages_buf = vec![0u8; CHUNK_PAGES * PAGE];
        for mapping in maps.into_iter().filter(|m| m.captured(file_backed)) {
            let mut read = MappingRead {
                mapping,
                pages_present: 0,
                pages_swapped: 0,
                pages_read: 0,
                vanished: false,
            };
            self.read_mapping(
                &mut read,
                &mut snap,
                &mut frames,
                &mut entries_buf,
                &mut pages_buf,
                on_page,
            )?;
            snap.mappings.push(read);
        }
        if let Some(s) = stopped {
            snap.stopped_seconds = s.since.elapsed().as_secs_f64();
        }
        // Mappings no longer wholly mapped at the end were unmapped (or remapped) meanwhile.
        if let Ok(now) = read_maps(self.pid) {
            for m in &mut snap.mappings {
                let covered = covered(&now, m.mapping.start, m.mapping.end);
                m.vanished |= !covered;
            }
        }
        snap.seconds = started.elapsed().as_secs_f64();
        Ok(snap)
    }

    fn read_mapping(
        &self,
        read: &mut MappingRead,
        snap: &mut Snapshot,
        frames: &mut HashSet<u64>,
        entries_buf: &mut [u8],
        pages_buf: &mut [u8],
        on_page: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let first = read.mapping.start / PAGE as u64;
        let last = read.mapping.end / PAGE as u64;
        let mut vpn = first;
        while vpn < last {
            let n = ((last - vpn) as usize).min(CHUNK_PAGES);
            let got = self.read_fully(&self.pagemap, &mut entries_buf[..n * 8], vpn * 8)?;
            if got < n * 8 {
                // The pagemap of an unmapped range reads as zeros: short means the process
                // is gone, or at least its address space.
                if !self.alive() {
                    return Err(CaptureError::Exited {
                        pid: self.pid,
                        pages_read: snap.pages_read + read.pages_read,
                    });
                }
                read.vanished = true;
                break;
            }
            let chunk: Vec<PageEntry> = entries(&entries_buf[..n * 8]).collect();
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
                let bytes = &mut pages_buf[..run.len() * PAGE];
                let address = (vpn + run_start as u64) * PAGE as u64;
                let got = match self.read_fully(&self.mem, bytes, address) {
                    Ok(got) => got,
                    Err(CaptureError::Io { error, .. })
                        if error.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) =>
                    {
                        0
                    }
                    Err(e) => return Err(e),
                };
                let whole = got / PAGE;
                for (k, entry) in run.iter().enumerate().take(whole) {
                    read.pages_present += u64::from(entry.present());
                    read.pages_swapped += u64::from(entry.swapped());
                    if let Some(frame) = entry.frame() {
                        if !frames.insert(frame) {
                            snap.duplicate_frames += 1;
                            continue;
                        }
                    }
                    on_page(
                        vpn + (run_start + k) as u64,
                        &bytes[k * PAGE..(k + 1) * PAGE],
                    )?;
                    read.pages_read += 1;
                }
                if whole < run.len() {
                    // A read that stops short: the process exited, or this part of the
                    // mapping was unmapped; the pages read before are kept.
                    if !self.alive() {
                        return Err(CaptureError::Exited {
                            pid: self.pid,
                            pages_read: snap.pages_read + read.pages_read,
                        });
                    }
                    read.vanished = true;
                    break;
                }
            }
            if read.vanished {
                break;
            }
            vpn += n as u64;
        }
        snap.pages_present += read.pages_present;
        snap.pages_swapped += read.pages_swapped;
        snap.pages_read += read.pages_read;
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `offset`, as many as there are.
    fn read_fully(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => {
                    if done > 0 {
                        break;
                    }
                    return Err(CaptureError::Io {
                        path: PathBuf::from(format!("/proc/{}/mem", self.pid)),
                        error,
                    });
                }
            }
        }
        Ok(done)
    }
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

/// `/proc/PID/stat`'s state letter, start time and flags.
fn stat(pid: u32) -> Result<(char, u64, u64)> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = std::fs::read_to_string(&path).map_err(|e| open_error(pid, &path, e))?;
    // The name (field 2) is in parentheses and may hold spaces and parentheses: the fields
    // after it start after the last ')'.
    let malformed = || CaptureError::Malformed {
        path: path.clone(),
        reason: text.trim().to_string(),
    };
    let rest = &text[text.rfind(')').ok_or_else(malformed)? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields
        .first()
        .and_then(|s| s.chars().next())
        .ok_or_else(malformed)?;
    // starttime is field 22, flags field 9; `rest` starts at field 3.
    let start = fields
        .get(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(malformed)?;
    let flags = fields
        .get(6)
        .and_then(|s| s.parse().ok())
        .ok_or_else(malformed)?;
    Ok((state, start, flags))
}

/// The process stopped by SIGSTOP while it is read, continued when this is dropped (unless
/// it was stopped before: then it is left as it was found).
struct Stopped<'a> {
    process: &'a Process,
    continue_after: bool,
    since: Instant,
}

impl<'a> Stopped<'a> {
    fn stop(process: &'a Process) -> Result<Stopped<'a>> {
        let already = matches!(stat(process.pid)?.0, 'T' | 't');
        let pid = rustix::process::Pid::from_raw(process.pid as i32)
            .ok_or(CaptureError::NoProcess { pid: process.pid })?;
        let since = Instant::now();
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
            since,
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
            if !process.alive() {
                return Err(CaptureError::Exited {
                    pid: process.pid,
                    pages_read: 0,
                });
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
    use crate::maps::Mapping;

    #[test]
    fn coverage_of_a_range() {
        let m = |s: u64, e: u64| Mapping {
            start: s,
            end: e,
            perms: "rw-p".into(),
            offset: 0,
            inode: 0,
            path: String::new(),
            kind: crate::maps::MappingKind::Anonymous,
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
        assert!(me.alive());
        // A page-aligned run of known pages inside a vector.
        let mut v = vec![0u8; 64 * PAGE];
        let offset = (PAGE - (v.as_ptr() as usize % PAGE)) % PAGE;
        let pages = &mut v[offset..offset + 32 * PAGE];
        for (i, p) in pages.chunks_exact_mut(PAGE).enumerate() {
            p.fill(i as u8 + 1);
        }
        let first = pages.as_ptr() as u64 / PAGE as u64;
        let mut seen = 0;
        let snap = me
            .snapshot(false, false, &mut |vpn, page| {
                if (first..first + 32).contains(&vpn) {
                    assert!(page.iter().all(|&b| b == (vpn - first) as u8 + 1));
                    seen += 1;
                }
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, 32);
        assert!(snap.pages_read >= 32 && snap.pages_present >= snap.pages_read);
        assert!(matches!(
            Process::open(u32::MAX / 2),
            Err(CaptureError::NoProcess { .. })
        ));
        std::hint::black_box(&v);
    }
}
