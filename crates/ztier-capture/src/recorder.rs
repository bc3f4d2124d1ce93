//! A capture, once or epoch after epoch: each epoch reads the processes' pages
//! (`crate::snapshot`) and compares each page's content hash with the epoch before's, page by
//! page key (`crate::key`). Epoch 0 writes every page to the corpus; each later epoch writes
//! only the pages that appeared or changed, and the trace records which (see
//! `ztier_corpus::trace`).
//!
//! Invariants: the trace and the corpus agree at every epoch boundary. A later epoch's new
//! pages are held until the epoch is read whole and written with its trace entry together,
//! so an epoch cut short (a process exiting) leaves nothing of itself in either; its page
//! hashes replace the last epoch's only then. Nothing is in place under the output's names
//! before [`Recorder::finish`]: a capture that fails leaves no file. With
//! [`record`](Recorder::record), epoch `n` starts `n` periods after the first, never earlier:
//! an epoch that outlasts the period makes the next start at the next multiple of it, and the
//! periods so skipped are counted ([`Manifest::missed_periods`]), never run back to back.
//! Memory: one 16-byte hash per present page, and during a later epoch the pages it changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use ztier_corpus::trace::{Epoch, PageWrite, Trace, TraceWriter};
use ztier_corpus::writer::{CorpusWriter, WrittenCorpus};

use crate::key::ObjectNumbers;
use crate::maps::MappingKind;
use crate::process::{Process, ProcessRead};
use crate::target::Target;
use crate::{output_error, snapshot, CaptureError, Result, Snapshot, PAGE};

/// What to capture and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureOptions {
    /// Also private file mappings (their copy-on-write pages and the file pages mapped).
    pub file_backed: bool,
    /// Stop the processes (SIGSTOP) for each read, for a copy of one instant.
    pub stop: bool,
}

/// How many times a cgroup's later epoch is read before a process ending during each read
/// ends the recording (see [`Recorder::epoch`]).
pub const CGROUP_EPOCH_READS: u64 = 8;

/// One whole read of an epoch, its new pages held (a later epoch's) until it is recorded.
struct EpochRead {
    snap: Snapshot,
    epoch: Epoch,
    next_hashes: HashMap<u64, [u8; 16]>,
    held_appeared: Vec<u8>,
    held_changed: Vec<u8>,
    zero: u64,
    same: u64,
}

/// What one epoch saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochSummary {
    pub epoch: u64,
    /// Since the first epoch began.
    pub millis: u64,
    /// The read's time, and how long the processes were stopped for it (with `stop`).
    pub seconds: f64,
    pub stopped_seconds: f64,
    /// Processes read.
    pub processes: u64,
    pub present: u64,
    pub swapped: u64,
    pub appeared: u64,
    pub changed: u64,
    pub went: u64,
    pub unchanged: u64,
    pub vanished_mappings: u64,
    /// Reads of this epoch cut short by a process of the cgroup ending, and made again.
    pub read_again: u64,
}

/// `NAME.capture.json`: what was captured, from what, when.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Manifest {
    /// The cgroup captured (`--cgroup`), if it was one.
    pub cgroup: Option<PathBuf>,
    /// The first capture's processes, each with its mappings that held a page.
    pub processes: Vec<ProcessRead>,
    /// Processes of the cgroup read first by a later epoch.
    pub joined_later: Vec<JoinedProcess>,
    pub kernel: String,
    pub started_unix_seconds: u64,
    pub started_utc: String,
    pub page_size: usize,
    /// Pages in the corpus (the first capture's, then every later epoch's new ones).
    pub pages: u64,
    pub raw_sha256: String,
    pub zero_pages: u64,
    /// Pages whose 512 words are all equal, zero pages included.
    pub same_filled_pages: u64,
    pub first_capture_pages: u64,
    pub file_backed: bool,
    pub stopped: bool,
    /// How consistent the copy is, in words.
    pub consistency: String,
    /// The first capture's mappings, summed by kind over its processes (a shared mapping is
    /// counted in each process that maps it; its pages are captured once).
    pub by_kind: Vec<KindSummary>,
    /// Pages left out by the first capture as a physical page already read at another address
    /// or in another process (`crate::Snapshot::duplicate_pages`).
    pub duplicate_pages: u64,
    pub epochs: Vec<EpochSummary>,
    /// With `record`: the period epochs start on, and how many of its multiples passed with
    /// no epoch started because the epoch before was still running.
    pub period_millis: Option<u64>,
    pub missed_periods: u64,
    /// Epoch reads of a cgroup cut short by one of its processes ending, and made again
    /// (each epoch's in [`EpochSummary::read_again`]).
    pub epochs_read_again: u64,
    /// A process ended the recording before its end (during an epoch or between two): the
    /// epochs done before are kept and written; the one it cut short, if any, is not.
    pub ended_by_exit: bool,
    /// The process whose exit (or exec) ended it; none when the cgroup emptied.
    pub exited_pid: Option<u32>,
    /// A capture's limit that ended the recording before its end (more processes met than
    /// a page key numbers, [`PageKey::MAX_PROCESSES`](crate::key::PageKey::MAX_PROCESSES),
    /// or 2^32 pages): the epochs done before are kept and written.
    pub ended_at_limit: Option<String>,
    pub corpus: PathBuf,
    pub trace: PathBuf,
}

/// A process of a cgroup first read after the first epoch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct JoinedProcess {
    pub pid: u32,
    pub number: u32,
    pub name: String,
    pub command_line: String,
    pub epoch: u64,
}

/// The mappings of one kind in a capture.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KindSummary {
    pub kind: MappingKind,
    pub mappings: u64,
    pub mapped_bytes: u64,
    pub pages_present: u64,
    pub pages_swapped: u64,
    pub pages_read: u64,
}

/// A capture under way.
pub struct Recorder {
    target: Target,
    /// The processes open now, by number. A number is never given to another process: the
    /// next one's is [`next_number`](Self::next_number). A cgroup's process is closed (its
    /// handles dropped) once a listing no longer holds it, or once it runs another program,
    /// so a recording of a build holds the handles of the processes running, not of every
    /// process it ever met.
    open: HashMap<u32, Process>,
    /// The number of the open process of each pid.
    number_of_pid: HashMap<u32, u32>,
    next_number: u32,
    /// The numbers of the processes the next epoch reads.
    current: Vec<u32>,
    objects: ObjectNumbers,
    options: CaptureOptions,
    corpus: CorpusWriter,
    corpus_path: PathBuf,
    trace: TraceWriter,
    trace_path: PathBuf,
    manifest_path: PathBuf,
    /// Each present page's content hash, by page key.
    hashes: HashMap<u64, [u8; 16]>,
    started: Instant,
    started_unix: u64,
    first: Option<Snapshot>,
    joined_later: Vec<JoinedProcess>,
    epochs: Vec<EpochSummary>,
    zero_pages: u64,
    same_filled_pages: u64,
    period: Option<Duration>,
    missed_periods: u64,
    epochs_read_again: u64,
    ended_by_exit: bool,
    exited_pid: Option<u32>,
    ended_at_limit: Option<String>,
}

/// A page's content hash: SHA-256, the first 16 bytes.
fn page_hash(page: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out.copy_from_slice(&Sha256::digest(page)[..16]);
    out
}

fn same_filled(page: &[u8]) -> bool {
    let first = &page[..8];
    page.chunks_exact(8).all(|w| w == first)
}

impl From<u32> for Target {
    fn from(pid: u32) -> Target {
        Target::Pids(vec![pid])
    }
}

/// Whether an error opening a cgroup's process says only that it is gone (or has no memory):
/// it left the cgroup between the listing and the open.
fn left_meanwhile(e: &CaptureError) -> bool {
    matches!(
        e,
        CaptureError::NoProcess { .. }
            | CaptureError::Zombie { .. }
            | CaptureError::KernelThread { .. }
            | CaptureError::Exited { .. }
    )
}

impl Recorder {
    /// Opens the processes and the output files (`output` ends in `.pages.zst` or `.pages`;
    /// the trace and the manifest go beside it). Nothing is read yet.
    pub fn start(
        target: impl Into<Target>,
        output: &Path,
        options: CaptureOptions,
    ) -> Result<Recorder> {
        let target = target.into();
        let trace_path = Trace::path_for(output);
        let name = output
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let stem = name
            .strip_suffix(".pages.zst")
            .or_else(|| name.strip_suffix(".pages"))
            .ok_or_else(|| CaptureError::OutputName {
                path: output.to_owned(),
            })?;
        let manifest_path = output.with_file_name(format!("{stem}.capture.json"));
        let mut recorder = Recorder {
            target,
            open: HashMap::new(),
            number_of_pid: HashMap::new(),
            next_number: 0,
            current: Vec::new(),
            objects: ObjectNumbers::default(),
            options,
            corpus: CorpusWriter::create(output).map_err(|e| output_error(output, e))?,
            corpus_path: output.to_owned(),
            trace: TraceWriter::create(&trace_path).map_err(|e| output_error(&trace_path, e))?,
            trace_path,
            manifest_path,
            hashes: HashMap::new(),
            started: Instant::now(),
            started_unix: unix_now(),
            first: None,
            joined_later: Vec::new(),
            epochs: Vec::new(),
            zero_pages: 0,
            same_filled_pages: 0,
            period: None,
            missed_periods: 0,
            epochs_read_again: 0,
            ended_by_exit: false,
            exited_pid: None,
            ended_at_limit: None,
        };
        recorder.list_processes()?;
        recorder.started = Instant::now();
        recorder.started_unix = unix_now();
        Ok(recorder)
    }

    /// How many processes the capture holds open now (their `mem` and `pagemap` handles).
    pub fn processes_open(&self) -> usize {
        self.open.len()
    }

    /// Opens `pid` under the next number.
    fn open_process(&mut self, pid: u32) -> Result<u32> {
        let process = Process::open(pid)?;
        let number = self.next_number;
        self.next_number += 1;
        self.open.insert(number, process);
        self.number_of_pid.insert(pid, number);
        Ok(number)
    }

    /// Drops process `number`'s handles; its pid, if seen again, is a new process.
    fn close_process(&mut self, number: u32) {
        if let Some(process) = self.open.remove(&number) {
            if self.number_of_pid.get(&process.pid()) == Some(&number) {
                self.number_of_pid.remove(&process.pid());
            }
        }
    }

    /// Sets [`current`](Self::current) to the processes the next epoch reads: the ones named
    /// (opened once, at the start), or the cgroup's now, opening the new ones and closing the
    /// ones it no longer holds.
    fn list_processes(&mut self) -> Result<()> {
        let pids = self.target.pids()?;
        if let Target::Pids(_) = self.target {
            if self.open.is_empty() {
                for &pid in &pids {
                    self.open_process(pid)?;
                }
                self.current = (0..self.next_number).collect();
            }
            return if self.current.is_empty() {
                Err(CaptureError::NothingToCapture)
            } else {
                Ok(())
            };
        }
        self.current.clear();
        for pid in pids {
            let known = self.number_of_pid.get(&pid).copied();
            // A pid whose process is gone is another process's now (the pid reused).
            if let Some(number) = known {
                if self.open[&number].liveness() == crate::process::Liveness::Gone {
                    self.close_process(number);
                }
            }
            let number = match self.number_of_pid.get(&pid) {
                Some(&number) => number,
                None => match self.open_process(pid) {
                    Ok(number) => number,
                    Err(e) if left_meanwhile(&e) => continue,
                    Err(e) => return Err(e),
                },
            };
            self.current.push(number);
        }
        let listed: std::collections::HashSet<u32> = self.current.iter().copied().collect();
        let left: Vec<u32> = self
            .open
            .keys()
            .copied()
            .filter(|n| !listed.contains(n))
            .collect();
        for number in left {
            self.close_process(number);
        }
        match self.target.cgroup() {
            Some(path) if self.current.is_empty() => Err(CaptureError::EmptyCgroup {
                path: path.to_owned(),
            }),
            _ => Ok(()),
        }
    }

    /// Reads the processes once more and records the epoch. `observer` is called with each
    /// page's key (`crate::key`: a private page of the first process by its virtual page
    /// number) as it is read (a progress count, or a test acting on a process mid-capture).
    ///
    /// A cgroup's epoch whose read a process of the cgroup ended (it exited, or ran another
    /// program: a compiler of a build, a backend that served one query, a shell running its
    /// command) is read again from a new listing of the cgroup, up to [`CGROUP_EPOCH_READS`]
    /// reads: processes coming and going are what a cgroup does, and nothing of a read cut
    /// short is kept but the numbers given to shared memory objects it met (a later epoch's
    /// pages are held until the read is whole; the first epoch's, written as they are read,
    /// are dropped and the corpus started again). A process that exited is no longer listed;
    /// one that runs another program is opened afresh, a new process of the capture. The old
    /// one's pages go at the epoch read whole; the epoch's time is its last read's.
    pub fn epoch(&mut self, observer: &mut dyn FnMut(u64)) -> Result<&EpochSummary> {
        let first = self.first.is_none();
        let reads_allowed = if self.target.cgroup().is_some() {
            CGROUP_EPOCH_READS
        } else {
            1
        };
        let mut read_again = 0u64;
        let (read, millis) = loop {
            // The first read's processes were listed by `start`.
            let listed = if first && read_again == 0 {
                Ok(())
            } else {
                self.list_processes()
            };
            let millis = self.started.elapsed().as_millis() as u64;
            match listed.and_then(|()| self.read_once(first, millis, observer)) {
                Ok(read) => break (read, millis),
                Err(e) if e.ended_process().is_some() && read_again + 1 < reads_allowed => {
                    read_again += 1;
                    if let CaptureError::Replaced { pid, .. } = e {
                        self.retire_replaced(pid);
                    }
                    if first {
                        // The first read wrote its pages as it went: none of them stay, and
                        // the capture's time starts again with the read made again.
                        self.corpus
                            .restart()
                            .map_err(|e| output_error(&self.corpus_path, e))?;
                        self.started = Instant::now();
                        self.started_unix = unix_now();
                    }
                }
                Err(e) => {
                    self.epochs_read_again += read_again;
                    return Err(e);
                }
            }
        };
        self.epochs_read_again += read_again;
        let EpochRead {
            snap,
            mut epoch,
            next_hashes,
            held_appeared,
            held_changed,
            zero,
            same,
        } = read;
        let base = self.corpus.pages()
            - if first {
                epoch.appeared.len() as u64
            } else {
                0
            };
        let new_pages = (epoch.appeared.len() + epoch.changed.len()) as u64;
        if u32::try_from(base + new_pages).is_err() {
            return Err(CaptureError::TooManyPages);
        }
        for (n, w) in epoch
            .appeared
            .iter_mut()
            .chain(&mut epoch.changed)
            .enumerate()
        {
            w.corpus_page = (base + n as u64) as u32;
        }
        for page in held_appeared
            .chunks_exact(PAGE)
            .chain(held_changed.chunks_exact(PAGE))
        {
            self.corpus
                .push(page)
                .map_err(|e| output_error(&self.corpus_path, e))?;
        }
        let mut went: Vec<u64> = self
            .hashes
            .keys()
            .filter(|key| !next_hashes.contains_key(key))
            .copied()
            .collect();
        went.sort_unstable();
        epoch.went = went;
        self.trace
            .write_epoch(&epoch)
            .map_err(|e| output_error(&self.trace_path, e))?;
        self.hashes = next_hashes;
        self.zero_pages += zero;
        self.same_filled_pages += same;
        let epoch_number = self.epochs.len() as u64;
        let summary = EpochSummary {
            epoch: epoch_number,
            millis,
            seconds: snap.seconds,
            stopped_seconds: snap.stopped_seconds,
            processes: snap.processes.len() as u64,
            present: snap.pages_read,
            swapped: snap.pages_swapped,
            appeared: epoch.appeared.len() as u64,
            changed: epoch.changed.len() as u64,
            went: epoch.went.len() as u64,
            unchanged: epoch.unchanged,
            vanished_mappings: snap
                .processes
                .iter()
                .flat_map(|p| &p.mappings)
                .filter(|m| m.vanished)
                .count() as u64,
            read_again,
        };
        match &self.first {
            None => self.first = Some(snap),
            Some(first) => {
                for p in snap.processes {
                    let seen = first.processes.iter().any(|f| f.number == p.number)
                        || self.joined_later.iter().any(|j| j.number == p.number);
                    if !seen {
                        self.joined_later.push(JoinedProcess {
                            pid: p.pid,
                            number: p.number,
                            name: p.name,
                            command_line: p.command_line,
                            epoch: epoch_number,
                        });
                    }
                }
            }
        }
        self.epochs.push(summary);
        Ok(self.epochs.last().expect("just pushed"))
    }

    /// Closes the process `pid` of the current ones, found running another program, so the
    /// next listing opens it afresh under a new number.
    fn retire_replaced(&mut self, pid: u32) {
        if let Some(&number) = self.number_of_pid.get(&pid) {
            self.close_process(number);
        }
    }

    /// One read of the current processes for an epoch at `millis`: every page hashed and
    /// compared with the last epoch's; the first epoch's pages written to the corpus as they
    /// come, a later epoch's held in the result.
    fn read_once(
        &mut self,
        first: bool,
        millis: u64,
        observer: &mut dyn FnMut(u64),
    ) -> Result<EpochRead> {
        let mut next_hashes: HashMap<u64, [u8; 16]> = HashMap::with_capacity(self.hashes.len());
        let mut epoch = Epoch {
            millis,
            ..Epoch::default()
        };
        // Later epochs hold their new pages until the epoch is whole (see the header), the
        // pages that appeared apart from those that changed: the trace names the corpus
        // pages of an epoch's appeared pages first, then its changed pages'.
        let mut held_appeared: Vec<u8> = Vec::new();
        let mut held_changed: Vec<u8> = Vec::new();
        let mut zero = 0u64;
        let mut same = 0u64;
        let corpus = &mut self.corpus;
        let corpus_path = &self.corpus_path;
        let hashes = &self.hashes;
        let processes: Vec<(u32, &Process)> = self
            .current
            .iter()
            .map(|&n| (n, &self.open[&n])) // a listing opens every process it names
            .collect();
        let snap = snapshot::read(
            &processes,
            self.options.file_backed,
            self.options.stop,
            self.target.cgroup().is_some(),
            &mut self.objects,
            &mut |key, page| {
                let key = key.0;
                observer(key);
                let hash = page_hash(page);
                next_hashes.insert(key, hash);
                let old = hashes.get(&key);
                if old == Some(&hash) {
                    epoch.unchanged += 1;
                    return Ok(());
                }
                // Numbered below, once the epoch is whole.
                let write = PageWrite {
                    vpn: key,
                    corpus_page: 0,
                };
                if same_filled(page) {
                    same += 1;
                    zero += u64::from(page[..8] == [0u8; 8]);
                }
                if old.is_some() {
                    epoch.changed.push(write);
                    held_changed.extend_from_slice(page);
                } else {
                    epoch.appeared.push(write);
                    if first {
                        corpus
                            .push(page)
                            .map_err(|e| output_error(corpus_path, e))?;
                    } else {
                        held_appeared.extend_from_slice(page);
                    }
                }
                Ok(())
            },
        )?;
        Ok(EpochRead {
            snap,
            epoch,
            next_hashes,
            held_appeared,
            held_changed,
            zero,
            same,
        })
    }

    /// Epochs every `every` for `total`, the first at once, epoch `n` no earlier than `n`
    /// periods after the first; `on_epoch` is told of each. An epoch that outlasts the period
    /// makes the next start at the next multiple of `every`, and the multiples skipped count in
    /// [`Manifest::missed_periods`]. A process named ending after the first epoch (exiting
    /// or running another program, during an epoch or between two, reaped or not), a
    /// cgroup's ending during each of an epoch's [`CGROUP_EPOCH_READS`] reads, or the cgroup
    /// emptying ends the recording with `Ok`, keeping the epochs done:
    /// [`finish`](Self::finish) then writes them, with [`Manifest::ended_by_exit`] set; so
    /// does a limit reached ([`Manifest::ended_at_limit`]). A
    /// process named ending before the first epoch is whole is an error, as is a cgroup's
    /// ending during each of the first epoch's reads.
    pub fn record(
        &mut self,
        every: Duration,
        total: Duration,
        on_epoch: &mut dyn FnMut(&EpochSummary),
    ) -> Result<()> {
        if every.is_zero() {
            return Err(CaptureError::ZeroInterval);
        }
        self.period = Some(every);
        let start = Instant::now();
        // The last multiple of the period an epoch may start on.
        let last_period = (total.as_nanos() / every.as_nanos()) as u64;
        let mut period = 0u64;
        loop {
            let had_epochs = !self.epochs.is_empty();
            match self.epoch(&mut |_| {}) {
                Ok(summary) => on_epoch(summary),
                Err(e) if had_epochs && e.ended_process().is_some() => {
                    self.ended_by_exit = true;
                    self.exited_pid = e.ended_process();
                    return Ok(());
                }
                Err(CaptureError::EmptyCgroup { .. }) if had_epochs => {
                    self.ended_by_exit = true;
                    return Ok(());
                }
                // A cgroup that ran more processes than a page key can number (a long
                // build), or a corpus of 2^32 pages: what was recorded is kept.
                Err(e @ (CaptureError::TooMany { .. } | CaptureError::TooManyPages))
                    if had_epochs =>
                {
                    self.ended_at_limit = Some(e.to_string());
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            // The next epoch starts on the first multiple of the period not yet begun.
            let next = (start.elapsed().as_nanos() / every.as_nanos()) as u64 + 1;
            self.missed_periods += next.min(last_period + 1) - (period + 1);
            period = next;
            if period > last_period {
                return Ok(());
            }
            let due = start + period_offset(every, period);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    }

    /// Writes the corpus, the trace and the manifest into place.
    pub fn finish(self) -> Result<Manifest> {
        let Some(first) = self.first else {
            return Err(CaptureError::NoEpoch);
        };
        let written: WrittenCorpus = self
            .corpus
            .finish()
            .map_err(|e| output_error(&self.corpus_path, e))?;
        self.trace
            .finish()
            .map_err(|e| output_error(&self.trace_path, e))?;
        let mut by_kind: Vec<KindSummary> = Vec::new();
        for m in first.processes.iter().flat_map(|p| &p.mappings) {
            let at = match by_kind.iter().position(|k| k.kind == m.mapping.kind) {
                Some(i) => i,
                None => {
                    by_kind.push(KindSummary {
                        kind: m.mapping.kind,
                        mappings: 0,
                        mapped_bytes: 0,
                        pages_present: 0,
                        pages_swapped: 0,
                        pages_read: 0,
                    });
                    by_kind.len() - 1
                }
            };
            let k = &mut by_kind[at];
            k.mappings += 1;
            k.mapped_bytes += m.mapping.end - m.mapping.start;
            k.pages_present += m.pages_present;
            k.pages_swapped += m.pages_swapped;
            k.pages_read += m.pages_read;
        }
        by_kind.sort_by_key(|k| k.kind);
        let stopped = self.options.stop;
        let consistency = consistency(stopped, first.processes.len());
        let processes = first
            .processes
            .into_iter()
            .map(|mut p| {
                p.mappings.retain(|m| m.pages_read > 0 || m.vanished);
                p
            })
            .collect();
        let manifest = Manifest {
            cgroup: self.target.cgroup().map(Path::to_owned),
            processes,
            joined_later: self.joined_later,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            started_unix_seconds: self.started_unix,
            started_utc: utc(self.started_unix),
            page_size: PAGE,
            pages: written.pages,
            raw_sha256: written.raw_sha256,
            zero_pages: self.zero_pages,
            same_filled_pages: self.same_filled_pages,
            first_capture_pages: first.pages_read,
            file_backed: self.options.file_backed,
            stopped,
            consistency,
            by_kind,
            duplicate_pages: first.duplicate_pages,
            epochs: self.epochs,
            period_millis: self.period.map(|p| p.as_millis() as u64),
            missed_periods: self.missed_periods,
            epochs_read_again: self.epochs_read_again,
            ended_by_exit: self.ended_by_exit,
            exited_pid: self.exited_pid,
            ended_at_limit: self.ended_at_limit,
            corpus: written.path,
            trace: self.trace_path,
        };
        let json = serde_json::to_vec_pretty(&manifest).map_err(CaptureError::Manifest)?;
        std::fs::write(&self.manifest_path, json).map_err(|error| CaptureError::Io {
            path: self.manifest_path.clone(),
            error,
        })?;
        Ok(manifest)
    }
}

/// How consistent the copy is, in words.
fn consistency(stopped: bool, processes: usize) -> String {
    let (them, were) = if processes == 1 {
        ("the process", "was")
    } else {
        ("the processes", "were")
    };
    if stopped {
        format!("{them} {were} stopped (SIGSTOP) for each read: each epoch is one instant's memory")
    } else {
        format!(
            "{them} ran during each read: each page was copied at its own instant, and a page \
             written while copied may be torn"
        )
    }
}

/// `period` periods of `every`, however many.
fn period_offset(every: Duration, period: u64) -> Duration {
    let nanos = every.as_nanos().saturating_mul(u128::from(period));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (the civil-from-days algorithm).
fn utc(unix: u64) -> String {
    let days = (unix / 86400) as i64;
    let secs = unix % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Seconds since the Unix epoch now (0 on a clock set before it).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_000_000), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn same_filled_pages() {
        assert!(same_filled(&[0u8; PAGE]));
        let mut p = [0xabu8; PAGE];
        assert!(same_filled(&p));
        p[4095] = 0;
        assert!(!same_filled(&p));
    }
}
