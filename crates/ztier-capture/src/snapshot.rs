//! One read of every process of a capture: each process's pages (`process`), each physical
//! page once however many times and by however many processes it is mapped (`key`), and the
//! check, once every process is read, that each one read still runs.
//!
//! Invariants: a process that exits (or is killed, or runs another program) while the read
//! runs makes the whole read an error, whatever the kernel's teardown showed of it meanwhile;
//! a process of a cgroup gone before its read began is not part of the read (it left between
//! the cgroup's listing and its turn), one of the processes named is an error. With `stop`,
//! every process is stopped before the first is read and continued after the last, so the
//! copy is one instant's across them.

use std::time::Instant;

use crate::key::{ObjectNumbers, PageKey, Taken};
use crate::process::{Liveness, Process, ProcessRead, Stopped};
use crate::Result;

/// What one read of the processes saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub processes: Vec<ProcessRead>,
    /// Pages in memory, and in swap, in the captured mappings (a page mapped twice, twice).
    pub pages_present: u64,
    pub pages_swapped: u64,
    /// Pages handed on: each physical page once.
    pub pages_read: u64,
    /// Pages left out as a physical page already read at another address or in another
    /// process: a shmem page mapped again, a frame mapped twice (copy-on-write after `fork`,
    /// the shared zero page, KSM; frames are known only to CAP_SYS_ADMIN).
    pub duplicate_pages: u64,
    pub seconds: f64,
    /// How long the processes were stopped (with `stop`).
    pub stopped_seconds: f64,
}

/// Reads `processes` (each with its number in the capture), calling `on_page` with each
/// page's key and content. `leave_out_gone`: a process no longer running when the read
/// begins is left out (a cgroup's), rather than an error.
pub(crate) fn read(
    processes: &[(u32, &Process)],
    file_backed: bool,
    stop: bool,
    leave_out_gone: bool,
    objects: &mut ObjectNumbers,
    on_page: &mut dyn FnMut(PageKey, &[u8]) -> Result<()>,
) -> Result<Snapshot> {
    let started = Instant::now();
    let mut running = Vec::with_capacity(processes.len());
    for &(number, process) in processes {
        match process.liveness() {
            Liveness::Running => running.push((number, process)),
            _ if leave_out_gone => {}
            _ => return Err(process.ended(0)),
        }
    }
    let mut stopped = Vec::new();
    if stop {
        for &(_, process) in &running {
            stopped.push(Stopped::stop(process)?);
        }
    }
    let stopped_at = Instant::now();
    let mut taken = Taken::new(objects);
    let mut reads = Vec::with_capacity(running.len());
    let mut pages_read = 0;
    for &(number, process) in &running {
        let read = process
            .read(number, file_backed, &mut taken, on_page)
            .map_err(|e| e.after_pages(pages_read))?;
        pages_read += read.pages_read;
        reads.push(read);
    }
    let stopped_seconds = if stop {
        stopped_at.elapsed().as_secs_f64()
    } else {
        0.0
    };
    drop(stopped);
    // Each process read must still run now: one that died after its own read (while
    // another was read) took part of the capture's instant with it.
    for &(_, process) in &running {
        if process.liveness() != Liveness::Running {
            return Err(process.ended(pages_read));
        }
    }
    Ok(Snapshot {
        pages_present: reads.iter().map(|r| r.pages_present).sum(),
        pages_swapped: reads.iter().map(|r| r.pages_swapped).sum(),
        pages_read,
        duplicate_pages: taken.duplicates(),
        processes: reads,
        seconds: started.elapsed().as_secs_f64(),
        stopped_seconds,
    })
}
