//! Captures running processes' memory as a corpus (`NAME.pages.zst`), with a manifest
//! (`NAME.capture.json`) and a trace (`NAME.trace`), once or over time: what `ztier capture
//! --pid PID` (or several `--pid`, or `--cgroup PATH`) runs. A front end like the others: it
//! reads `/proc` and writes the corpus format; it knows nothing of zram, zswap or pools.
//!
//! - [`target`]: which processes: those named, or a cgroup's, listed at every epoch.
//! - [`maps`]: `/proc/PID/maps`, what each mapping is and which a capture reads (heap,
//!   stacks, private anonymous memory, shared memory of every kind; private file mappings on
//!   request).
//! - [`pagemap`]: `/proc/PID/pagemap` entries: which pages are in memory or in swap, and
//!   (to root) their frames and swap slots.
//! - [`key`]: how a page is named across processes and epochs, what makes two mapped
//!   pages one physical page, and the physical pages a read has taken so far.
//! - [`process`]: one process opened, whether it still runs, and one read of its captured
//!   pages through `/proc/PID/mem`, `shmem` for a shared mapping's pages through its object.
//! - [`snapshot`]: one read of every process, each physical page once, and the check that
//!   none of them exited meanwhile.
//! - [`recorder`]: epochs over time. Each epoch reads every page again and compares its
//!   content hash (SHA-256) with the epoch before's: pages appeared, changed, went.
//!
//! What a trace can and cannot see: this kernel gives no soft-dirty bits (`clear_refs` 4)
//! and no idle page tracking for another process, so an epoch knows only each page's content
//! at the instant it was read. It sees every page whose content differs from the epoch
//! before's, every page that appeared (touched for the first time, or mapped anew; a page
//! moving between memory and swap neither appears nor goes, both count as present) and every
//! page that went (unmapped, or given back with `MADV_DONTNEED`, or `MADV_FREE` once the
//! kernel took it). It cannot see a page written and
//! written back to the same content within an epoch, how many times a page was written,
//! a page read but not written (no access bits: "idle" in a replay means unchanged for so
//! many epochs, not unread), or a page moved by `mremap` (it goes and another appears).
//! Every epoch costs a read of the whole captured memory.
//!
//! Errors are typed ([`CaptureError`]): no such process, a zombie, no permission (root, or
//! ptrace access: same user and `kernel.yama.ptrace_scope` allowing it), a process exiting
//! or running another program mid-capture (however the kernel's teardown of its memory looks
//! meanwhile). A mapping unmapped mid-capture is not an error: it is marked vanished in the
//! manifest and the pages read before are kept (each was the mapping's content when read).
#![forbid(unsafe_code)]

pub mod key;
pub mod maps;
pub mod pagemap;
pub mod process;
pub mod recorder;
mod shmem;
pub mod snapshot;
pub mod target;

use std::path::{Path, PathBuf};

pub use process::Process;
pub use recorder::{CaptureOptions, EpochSummary, Manifest, Recorder};
pub use snapshot::Snapshot;
pub use target::Target;

/// The page size a capture reads in (the corpus's).
pub const PAGE: usize = ztier_corpus::CORPUS_PAGE;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    #[error("no process {pid}")]
    NoProcess { pid: u32 },
    #[error(
        "no permission to read process {pid}'s memory ({path}): capture needs root, or ptrace \
         access to it (the same user, and kernel.yama.ptrace_scope allowing it)"
    )]
    Permission { pid: u32, path: PathBuf },
    #[error("process {pid} ({name}) is a kernel thread: it has no user memory to capture")]
    KernelThread { pid: u32, name: String },
    #[error("process {pid} is a zombie (exited, not reaped): nothing to capture")]
    Zombie { pid: u32 },
    #[error(
        "process {pid} exited during the capture ({pages_read} pages read); nothing was written"
    )]
    Exited { pid: u32, pages_read: u64 },
    #[error(
        "process {pid} ran another program (exec) during the capture ({pages_read} pages \
         read); nothing was written"
    )]
    Replaced { pid: u32, pages_read: u64 },
    #[error("{}: not a cgroup (no cgroup.procs in it)", path.display())]
    NotACgroup { path: PathBuf },
    #[error("{}: the cgroup holds no process to capture", path.display())]
    EmptyCgroup { path: PathBuf },
    #[error("no process to capture: name one (--pid) or a cgroup (--cgroup)")]
    NothingToCapture,
    /// The io error is in the message, not a source of its own: said once.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: unexpected content: {reason}")]
    Malformed { path: PathBuf, reason: String },
    /// Writing the corpus or the trace (other than an io error, which is [`Io`](Self::Io)
    /// with the output's path): the corpus error's message, its causes in it, said once.
    #[error("{0}")]
    Corpus(ztier_corpus::CorpusError),
    #[error("{}: the output's name ends in .pages.zst or .pages", path.display())]
    OutputName { path: PathBuf },
    #[error("more than 2^32 pages in one capture's corpus")]
    TooManyPages,
    #[error("more than {limit} {what} in one capture")]
    TooMany { what: &'static str, limit: u64 },
    #[error("an epoch every 0 s")]
    ZeroInterval,
    #[error("no epoch was captured")]
    NoEpoch,
    #[error("the manifest does not serialise: {0}")]
    Manifest(serde_json::Error),
}

pub type Result<T, E = CaptureError> = std::result::Result<T, E>;

impl CaptureError {
    /// The process whose end (exit, or exec) this error is.
    pub fn ended_process(&self) -> Option<u32> {
        match self {
            CaptureError::Exited { pid, .. } | CaptureError::Replaced { pid, .. } => Some(*pid),
            _ => None,
        }
    }

    /// The error with `pages` read before it counted in (other processes' pages).
    pub(crate) fn after_pages(self, pages: u64) -> CaptureError {
        match self {
            CaptureError::Exited { pid, pages_read } => CaptureError::Exited {
                pid,
                pages_read: pages + pages_read,
            },
            CaptureError::Replaced { pid, pages_read } => CaptureError::Replaced {
                pid,
                pages_read: pages + pages_read,
            },
            other => other,
        }
    }
}

/// The typed error for a failure to open or read a file of `/proc/PID`.
pub(crate) fn open_error(pid: u32, path: &Path, e: std::io::Error) -> CaptureError {
    match e.kind() {
        std::io::ErrorKind::NotFound => CaptureError::NoProcess { pid },
        std::io::ErrorKind::PermissionDenied => CaptureError::Permission {
            pid,
            path: path.to_owned(),
        },
        // ESRCH: the process went between the open and the read.
        _ if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
            CaptureError::Exited { pid, pages_read: 0 }
        }
        _ => CaptureError::Io {
            path: path.to_owned(),
            error: e,
        },
    }
}

/// The typed error for a failure to write an output file: an io error names `path`, the
/// file the user asked for (not the temporary file it is written under).
pub(crate) fn output_error(path: &Path, e: ztier_corpus::CorpusError) -> CaptureError {
    match e {
        ztier_corpus::CorpusError::Io { source, .. } => CaptureError::Io {
            path: path.to_owned(),
            error: source,
        },
        other => CaptureError::Corpus(other),
    }
}
