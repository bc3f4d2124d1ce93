//! A capture, once or epoch after epoch: each epoch reads the process's pages
//! ([`Process::snapshot`]) and compares each page's content hash with the epoch before's.
//! Epoch 0 writes every page to the corpus; each later epoch writes only the pages that
//! appeared or changed, and the trace records which (see `ztier_corpus::trace`).
//!
//! Invariants: the trace and the corpus agree at every epoch boundary. A later epoch's new
//! pages are held until the epoch is read whole and written with its trace entry together,
//! so an epoch cut short (the process exiting) leaves nothing of itself in either; its page
//! hashes replace the last epoch's only then. Memory: one 16-byte hash per present page, and
//! during a later epoch the pages it changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use ztier_corpus::trace::{Epoch, PageWrite, Trace, TraceWriter};
use ztier_corpus::writer::{CorpusWriter, WrittenCorpus};

use crate::process::{MappingRead, Process};
use crate::{output_error, CaptureError, Result, PAGE};

/// What to capture and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct CaptureOptions {
    /// Also private file mappings (their copy-on-write pages and the file pages mapped).
    pub file_backed: bool,
    /// Stop the process (SIGSTOP) for each read, for a copy of one instant.
    pub stop: bool,
}

/// What one epoch saw.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochSummary {
    pub epoch: u64,
    /// Since the first epoch began.
    pub millis: u64,
    /// The read's time, and how long the process was stopped for it (with `stop`).
    pub seconds: f64,
    pub stopped_seconds: f64,
    pub present: u64,
    pub swapped: u64,
    pub appeared: u64,
    pub changed: u64,
    pub went: u64,
    pub unchanged: u64,
    pub vanished_mappings: u64,
}

/// `NAME.capture.json`: what was captured, from what, when.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Manifest {
    pub pid: u32,
    pub process_name: String,
    pub command_line: String,
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
    /// The first capture's mappings, summed by kind.
    pub by_kind: Vec<KindSummary>,
    /// The first capture's mappings that held a page.
    pub mappings: Vec<MappingRead>,
    /// Pages left out as frames already read (the shared zero page, KSM), first capture.
    pub duplicate_frames: u64,
    pub epochs: Vec<EpochSummary>,
    /// The process exited before the recording's end (during an epoch or between two): the
    /// epochs done before are kept and written; the one it cut short, if any, is not.
    pub ended_by_exit: bool,
    pub corpus: PathBuf,
    pub trace: PathBuf,
}

/// The mappings of one kind in a capture.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KindSummary {
    pub kind: crate::maps::MappingKind,
    pub mappings: u64,
    pub mapped_bytes: u64,
    pub pages_present: u64,
    pub pages_swapped: u64,
    pub pages_read: u64,
}

/// A capture under way.
pub struct Recorder {
    process: Process,
    options: CaptureOptions,
    corpus: CorpusWriter,
    corpus_path: PathBuf,
    trace: TraceWriter,
    trace_path: PathBuf,
    manifest_path: PathBuf,
    hashes: HashMap<u64, [u8; 16]>,
    started: Instant,
    started_unix: u64,
    command_line: String,
    process_name: String,
    first: Option<crate::Snapshot>,
    epochs: Vec<EpochSummary>,
    zero_pages: u64,
    same_filled_pages: u64,
    ended_by_exit: bool,
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

impl Recorder {
    /// Opens the process and the output files (`output` ends in `.pages.zst` or `.pages`;
    /// the trace and the manifest go beside it). Nothing is read yet.
    pub fn start(pid: u32, output: &Path, options: CaptureOptions) -> Result<Recorder> {
        let process = Process::open(pid)?;
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
        let corpus = CorpusWriter::create(output).map_err(|e| output_error(output, e))?;
        let trace = TraceWriter::create(&trace_path).map_err(|e| output_error(&trace_path, e))?;
        Ok(Recorder {
            command_line: process.command_line(),
            process_name: process.name(),
            process,
            options,
            corpus,
            corpus_path: output.to_owned(),
            trace,
            trace_path,
            manifest_path,
            hashes: HashMap::new(),
            started: Instant::now(),
            started_unix: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            first: None,
            epochs: Vec::new(),
            zero_pages: 0,
            same_filled_pages: 0,
            ended_by_exit: false,
        })
    }

    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Reads the process once more and records the epoch. `observer` is called with each
    /// page's virtual page number as it is read (a progress count, or a test acting on the
    /// process mid-capture).
    pub fn epoch(&mut self, observer: &mut dyn FnMut(u64)) -> Result<&EpochSummary> {
        let millis = self.started.elapsed().as_millis() as u64;
        let first = self.first.is_none();
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
        let snap = self.process.snapshot(
            self.options.file_backed,
            self.options.stop,
            &mut |vpn, page| {
                observer(vpn);
                let hash = page_hash(page);
                next_hashes.insert(vpn, hash);
                let old = hashes.get(&vpn);
                if old == Some(&hash) {
                    epoch.unchanged += 1;
                    return Ok(());
                }
                // Numbered below, once the epoch is whole.
                let write = PageWrite {
                    vpn,
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
            .filter(|vpn| !next_hashes.contains_key(vpn))
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
        let summary = EpochSummary {
            epoch: self.epochs.len() as u64,
            millis,
            seconds: snap.seconds,
            stopped_seconds: snap.stopped_seconds,
            present: snap.pages_read,
            swapped: snap.pages_swapped,
            appeared: epoch.appeared.len() as u64,
            changed: epoch.changed.len() as u64,
            went: epoch.went.len() as u64,
            unchanged: epoch.unchanged,
            vanished_mappings: snap.mappings.iter().filter(|m| m.vanished).count() as u64,
        };
        if first {
            self.first = Some(snap);
        }
        self.epochs.push(summary);
        Ok(self.epochs.last().expect("just pushed"))
    }

    /// Epochs every `every` for `total` (the first at once), `on_epoch` told of each. The
    /// process exiting after the first epoch (during an epoch, or between two, reaped or
    /// not) ends the recording with `Ok`, keeping the epochs done: [`finish`](Self::finish)
    /// then writes them, with [`Manifest::ended_by_exit`] set. Exiting before the first
    /// epoch is whole is [`CaptureError::Exited`].
    pub fn record(
        &mut self,
        every: Duration,
        total: Duration,
        on_epoch: &mut dyn FnMut(&EpochSummary),
    ) -> Result<()> {
        if every.is_zero() {
            return Err(CaptureError::ZeroInterval);
        }
        let start = Instant::now();
        let mut due = start;
        loop {
            let had_epochs = !self.epochs.is_empty();
            match self.epoch(&mut |_| {}) {
                Ok(summary) => on_epoch(summary),
                Err(CaptureError::Exited { .. }) if had_epochs => {
                    self.ended_by_exit = true;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
            due += every;
            if due > start + total {
                return Ok(());
            }
            // An epoch that took longer than the interval starts the next at once.
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
        for m in &first.mappings {
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
        let manifest = Manifest {
            pid: self.process.pid(),
            process_name: self.process_name,
            command_line: self.command_line,
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
            consistency: if stopped {
                "the process was stopped (SIGSTOP) for each read: each epoch is one instant's memory"
            } else {
                "the process ran during each read: each page was copied at its own instant, \
                 and a page written while copied may be torn"
            }
            .into(),
            by_kind,
            mappings: first
                .mappings
                .into_iter()
                .filter(|m| m.pages_read > 0 || m.vanished)
                .collect(),
            duplicate_frames: first.duplicate_frames,
            epochs: self.epochs,
            ended_by_exit: self.ended_by_exit,
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
