//! A capture over time (`NAME.trace` beside `NAME.pages.zst`): per epoch, which of the
//! captured pages appeared, changed and went, each page named by a 64-bit number, and for each
//! page that appeared or changed the corpus page holding its new content. The number is
//! opaque here (a replay only tells pages apart by it): ztier-capture gives a private page of
//! its first process its virtual page number, and any other page a key of the process's or
//! the shared memory object's number with the page's place in it (`ztier_capture::key`).
//!
//! Epoch 0 is the first capture: every page appears, and the corpus's first pages are those.
//! Each later epoch appends to the corpus only the pages that appeared or changed, so the
//! corpus is the first capture followed by every new content in the order it was seen, and a
//! replay that writes each epoch's pages in turn rebuilds the process's memory at each epoch.
//!
//! Invariants [`Trace::read`] checks (a file that breaks one is refused, nothing is
//! trusted): a page appears only when it is not present, changes or goes only when it is,
//! and is named at most once an epoch (not appearing and changing, or changing and going);
//! corpus pages are named in increasing order, each once, the first of an epoch being the
//! one after the last of the epoch before; epoch times do not go backwards. Counts are
//! checked against the bytes left before anything is allocated for them.
//!
//! Format, little-endian: `ZTIERTRC`, version u32 (1), page size u32; then epochs to the end
//! of the file, each: milliseconds since the first capture u64, pages present and unchanged
//! u64, counts of appeared, changed and went (u32 each), then the appeared and the changed
//! pages as (page number u64, corpus page u32), then the page numbers that went (u64 each).

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use ztier_base::bytes::ByteReader;

use crate::{CorpusError, Result, CORPUS_PAGE};

const MAGIC: &[u8; 8] = b"ZTIERTRC";
const VERSION: u32 = 1;
const EPOCH_HEADER: usize = 8 + 8 + 3 * 4;
const WRITE_ENTRY: usize = 12;
const WENT_ENTRY: usize = 8;

/// Why a trace is refused: a file that is not one, or bytes or epochs that break the
/// module's invariants (the epoch and page that break them, and the figures).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("not a ztier trace (no ZTIERTRC header)")]
    NotATrace,
    #[error("trace version {version}, this reads {VERSION}")]
    Version { version: u32 },
    /// A trace holds corpus pages, of [`CORPUS_PAGE`] bytes.
    #[error("page size {page_size}, corpus pages are {CORPUS_PAGE}")]
    PageSize { page_size: u32 },
    #[error("truncated at byte {at}")]
    Truncated { at: usize },
    /// An epoch's counts name more entries than the bytes left hold (checked before any
    /// room is made for them).
    #[error("epoch {epoch}: its counts need {need} bytes, {left} are left (truncated?)")]
    CountsPastEnd { epoch: usize, need: u64, left: u64 },
    #[error("epoch {epoch}: its time is before the epoch before's")]
    TimeBackwards {
        epoch: usize,
        millis: u64,
        before: u64,
    },
    #[error("epoch {epoch}: corpus page {corpus_page} where {due} was due")]
    CorpusPageOutOfOrder {
        epoch: usize,
        corpus_page: u32,
        due: u64,
    },
    #[error("epoch {epoch}: page {vpn:#x} named twice")]
    NamedTwice { epoch: usize, vpn: u64 },
    #[error("epoch {epoch}: page {vpn:#x} appears while present")]
    AppearsWhilePresent { epoch: usize, vpn: u64 },
    #[error("epoch {epoch}: page {vpn:#x} changes while not present")]
    ChangesWhileAbsent { epoch: usize, vpn: u64 },
    #[error("epoch {epoch}: page {vpn:#x} goes while not present")]
    GoesWhileAbsent { epoch: usize, vpn: u64 },
    #[error(
        "epoch {epoch}: {unchanged} unchanged pages and {written} written do not add up to \
         the {present} present"
    )]
    CountsDoNotAddUp {
        epoch: usize,
        unchanged: u64,
        written: u64,
        present: u64,
    },
    #[error("{pages} pages in one epoch's list, more than a trace holds")]
    ListTooLong { pages: usize },
}

type TraceResult<T> = std::result::Result<T, TraceError>;

/// A page's new content in an epoch: the page numbered `vpn` (its virtual page number, or
/// the capture's key for it: see the module's header) now holds corpus page `corpus_page`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PageWrite {
    pub vpn: u64,
    pub corpus_page: u32,
}

/// One epoch of a trace.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Epoch {
    /// Milliseconds since the first capture began.
    pub millis: u64,
    /// Pages present at the epoch before and at this one, with the same content.
    pub unchanged: u64,
    pub appeared: Vec<PageWrite>,
    pub changed: Vec<PageWrite>,
    /// Numbers of the pages that are no longer present (unmapped, freed back
    /// to the kernel, or neither resident nor in swap).
    pub went: Vec<u64>,
}

impl Epoch {
    /// Pages present after this epoch.
    pub fn present(&self) -> u64 {
        self.unchanged + (self.appeared.len() + self.changed.len()) as u64
    }
}

/// A whole trace, read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub page_size: u32,
    pub epochs: Vec<Epoch>,
}

impl Trace {
    /// `NAME.trace` for the corpus `NAME.pages.zst` (or `NAME.pages`) at `corpus`.
    pub fn path_for(corpus: &Path) -> PathBuf {
        let name = corpus
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let stem = name
            .strip_suffix(".pages.zst")
            .or_else(|| name.strip_suffix(".pages"))
            .unwrap_or(name);
        corpus.with_file_name(format!("{stem}.trace"))
    }

    /// The corpus pages the trace names: the corpus it sits beside must hold at least these.
    pub fn corpus_pages(&self) -> u64 {
        self.epochs
            .iter()
            .map(|e| (e.appeared.len() + e.changed.len()) as u64)
            .sum()
    }

    /// Reads and checks a trace file (see the module's invariants).
    pub fn read(path: &Path) -> Result<Trace> {
        let bytes = std::fs::read(path).map_err(|source| CorpusError::Io {
            path: path.to_owned(),
            source,
        })?;
        Trace::from_bytes(&bytes).map_err(|cause| CorpusError::BadTrace {
            path: path.to_owned(),
            cause,
        })
    }

    /// A trace from a file's bytes, checked (see the module's invariants); a refusal says
    /// why. A trace accepted here is written back byte for byte by [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: &[u8]) -> TraceResult<Trace> {
        // The magic first: a file too short for it, or not starting with it, is not a trace
        // at all (not a truncated one).
        let mut r = Reader(ByteReader::new(bytes));
        if r.0.take(MAGIC.len()) != Ok(&MAGIC[..]) {
            return Err(TraceError::NotATrace);
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(TraceError::Version { version });
        }
        let page_size = r.u32()?;
        if page_size as usize != CORPUS_PAGE {
            return Err(TraceError::PageSize { page_size });
        }
        let mut epochs: Vec<Epoch> = Vec::new();
        let mut checker = Checker::default();
        while r.0.left() > 0 {
            let index = epochs.len();
            let millis = r.u64()?;
            let unchanged = r.u64()?;
            let counts = [r.u32()?, r.u32()?, r.u32()?].map(u64::from);
            // In 64 bits: the counts are the file's, up to 2^32 each.
            let need = (counts[0] + counts[1]) * WRITE_ENTRY as u64 + counts[2] * WENT_ENTRY as u64;
            let left = r.0.left() as u64;
            if need > left {
                return Err(TraceError::CountsPastEnd {
                    epoch: index,
                    need,
                    left,
                });
            }
            // Each count now fits the bytes left, so in memory too.
            let [appeared, changed, went] = counts.map(|n| n as usize);
            let mut epoch = Epoch {
                millis,
                unchanged,
                appeared: Vec::with_capacity(appeared),
                changed: Vec::with_capacity(changed),
                went: Vec::with_capacity(went),
            };
            for (list, n) in [
                (&mut epoch.appeared, appeared),
                (&mut epoch.changed, changed),
            ] {
                for _ in 0..n {
                    list.push(PageWrite {
                        vpn: r.u64()?,
                        corpus_page: r.u32()?,
                    });
                }
            }
            for _ in 0..went {
                epoch.went.push(r.u64()?);
            }
            checker.epoch(index, &epoch)?;
            epochs.push(epoch);
        }
        Ok(Trace { page_size, epochs })
    }

    /// Checks a trace held in memory (built, not read) against the module's invariants, as
    /// [`from_bytes`](Self::from_bytes) checks a file: one that passes has consistent counts
    /// ([`Epoch::present`] is the pages present, and no sum of them overflows).
    pub fn check_invariants(&self) -> TraceResult<()> {
        if self.page_size as usize != CORPUS_PAGE {
            return Err(TraceError::PageSize {
                page_size: self.page_size,
            });
        }
        let mut checker = Checker::default();
        for (index, epoch) in self.epochs.iter().enumerate() {
            checker.epoch(index, epoch)?;
        }
        Ok(())
    }

    /// The trace in its file format: what [`TraceWriter`] writes for the same epochs. The
    /// caller keeps the module's invariants (a trace read back keeps them;
    /// [`check_invariants`](Self::check_invariants) checks one built). Refused: a page size other than the
    /// corpus's (the format has room for no other), an epoch's list longer than a `u32` can
    /// count.
    pub fn to_bytes(&self) -> TraceResult<Vec<u8>> {
        if self.page_size as usize != CORPUS_PAGE {
            return Err(TraceError::PageSize {
                page_size: self.page_size,
            });
        }
        let mut out = header();
        for e in &self.epochs {
            encode_epoch(e, &mut out)?;
        }
        Ok(out)
    }
}

/// The invariants, checked an epoch at a time against the pages present so far.
#[derive(Default)]
struct Checker {
    present: HashSet<u64>,
    next_corpus_page: u64,
    millis: u64,
}

impl Checker {
    fn epoch(&mut self, index: usize, epoch: &Epoch) -> TraceResult<()> {
        if epoch.millis < self.millis {
            return Err(TraceError::TimeBackwards {
                epoch: index,
                millis: epoch.millis,
                before: self.millis,
            });
        }
        self.millis = epoch.millis;
        // Each page is named once an epoch: appeared, changed or went.
        let mut named: HashSet<u64> = HashSet::new();
        for (list, appearing) in [(&epoch.appeared, true), (&epoch.changed, false)] {
            for w in list {
                if u64::from(w.corpus_page) != self.next_corpus_page {
                    return Err(TraceError::CorpusPageOutOfOrder {
                        epoch: index,
                        corpus_page: w.corpus_page,
                        due: self.next_corpus_page,
                    });
                }
                self.next_corpus_page += 1;
                if !named.insert(w.vpn) {
                    return Err(TraceError::NamedTwice {
                        epoch: index,
                        vpn: w.vpn,
                    });
                }
                let was_present = if appearing {
                    !self.present.insert(w.vpn)
                } else {
                    self.present.contains(&w.vpn)
                };
                let (epoch, vpn) = (index, w.vpn);
                match (appearing, was_present) {
                    (true, true) => return Err(TraceError::AppearsWhilePresent { epoch, vpn }),
                    (false, false) => return Err(TraceError::ChangesWhileAbsent { epoch, vpn }),
                    _ => {}
                }
            }
        }
        for &vpn in &epoch.went {
            if !named.insert(vpn) {
                return Err(TraceError::NamedTwice { epoch: index, vpn });
            }
            if !self.present.remove(&vpn) {
                return Err(TraceError::GoesWhileAbsent { epoch: index, vpn });
            }
        }
        let written = (epoch.appeared.len() + epoch.changed.len()) as u64;
        let present = self.present.len() as u64;
        // Checked: the unchanged count may be anything (a file's, or a caller's).
        if epoch.unchanged.checked_add(written) != Some(present) {
            return Err(TraceError::CountsDoNotAddUp {
                epoch: index,
                unchanged: epoch.unchanged,
                written,
                present,
            });
        }
        Ok(())
    }
}

/// The file's header: magic, version, page size.
fn header() -> Vec<u8> {
    [
        &MAGIC[..],
        &VERSION.to_le_bytes(),
        &(CORPUS_PAGE as u32).to_le_bytes(),
    ]
    .concat()
}

/// Appends one epoch in the file format; refused if a list is longer than a `u32` can count.
fn encode_epoch(e: &Epoch, out: &mut Vec<u8>) -> TraceResult<()> {
    let count = |n: usize| u32::try_from(n).map_err(|_| TraceError::ListTooLong { pages: n });
    let counts = [
        count(e.appeared.len())?,
        count(e.changed.len())?,
        count(e.went.len())?,
    ];
    out.reserve(
        EPOCH_HEADER
            + (e.appeared.len() + e.changed.len()) * WRITE_ENTRY
            + e.went.len() * WENT_ENTRY,
    );
    out.extend_from_slice(&e.millis.to_le_bytes());
    out.extend_from_slice(&e.unchanged.to_le_bytes());
    for n in counts {
        out.extend_from_slice(&n.to_le_bytes());
    }
    for w in e.appeared.iter().chain(&e.changed) {
        out.extend_from_slice(&w.vpn.to_le_bytes());
        out.extend_from_slice(&w.corpus_page.to_le_bytes());
    }
    for vpn in &e.went {
        out.extend_from_slice(&vpn.to_le_bytes());
    }
    Ok(())
}

/// The trace's little-endian fields, a read past the end refused as truncated.
struct Reader<'a>(ByteReader<'a>);

impl Reader<'_> {
    fn u32(&mut self) -> TraceResult<u32> {
        self.0
            .u32_le()
            .map_err(|e| TraceError::Truncated { at: e.at })
    }
    fn u64(&mut self) -> TraceResult<u64> {
        self.0
            .u64_le()
            .map_err(|e| TraceError::Truncated { at: e.at })
    }
}

/// A trace being written, an epoch at a time, under a temporary name renamed into place by
/// [`finish`](Self::finish) (dropped unfinished, it removes the temporary file).
pub struct TraceWriter {
    path: PathBuf,
    temporary: PathBuf,
    out: Option<BufWriter<std::fs::File>>,
    epochs: u64,
}

impl TraceWriter {
    pub fn create(path: &Path) -> Result<TraceWriter> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("trace");
        let temporary = path.with_file_name(format!(".{name}.{}.partial", std::process::id()));
        let io = |source| CorpusError::Io {
            path: temporary.clone(),
            source,
        };
        let mut out = BufWriter::new(std::fs::File::create(&temporary).map_err(io)?);
        if let Err(e) = out.write_all(&header()) {
            let _ = std::fs::remove_file(&temporary);
            return Err(io(e));
        }
        Ok(TraceWriter {
            path: path.to_owned(),
            temporary,
            out: Some(out),
            epochs: 0,
        })
    }

    /// Appends an epoch; the caller keeps the module's invariants (the capture does).
    pub fn write_epoch(&mut self, e: &Epoch) -> Result<()> {
        let mut buf = Vec::new();
        encode_epoch(e, &mut buf).map_err(|cause| CorpusError::BadTrace {
            path: self.path.clone(),
            cause,
        })?;
        let out = self.out.as_mut().expect("taken only by finish");
        out.write_all(&buf).map_err(|source| CorpusError::Io {
            path: self.temporary.clone(),
            source,
        })?;
        self.epochs += 1;
        Ok(())
    }

    /// Flushes, syncs and renames the trace into place; returns how many epochs it holds.
    pub fn finish(mut self) -> Result<u64> {
        let io = |source| CorpusError::Io {
            path: self.temporary.clone(),
            source,
        };
        let out = self.out.take().expect("finish runs once");
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.temporary, &self.path).map_err(io)?;
        Ok(self.epochs)
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(vpn: u64, corpus_page: u32) -> PageWrite {
        PageWrite { vpn, corpus_page }
    }

    #[test]
    fn a_trace_reads_back_and_broken_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("ztier-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace");
        let epochs = vec![
            Epoch {
                millis: 0,
                unchanged: 0,
                appeared: vec![w(10, 0), w(11, 1), w(12, 2)],
                ..Epoch::default()
            },
            Epoch {
                millis: 5000,
                unchanged: 1,
                appeared: vec![w(20, 3)],
                changed: vec![w(11, 4)],
                went: vec![12],
            },
        ];
        let mut tw = TraceWriter::create(&path).unwrap();
        for e in &epochs {
            tw.write_epoch(e).unwrap();
        }
        assert_eq!(tw.finish().unwrap(), 2);
        let t = Trace::read(&path).unwrap();
        assert_eq!(t.epochs, epochs);
        assert_eq!(t.corpus_pages(), 5);
        assert_eq!(
            Trace::path_for(Path::new("/x/p.pages.zst")),
            Path::new("/x/p.trace")
        );

        let good = std::fs::read(&path).unwrap();
        assert_eq!(t.to_bytes().unwrap(), good, "written back byte for byte");
        // Cut anywhere inside: refused.
        for cut in [3, 17, 30, good.len() - 1] {
            assert!(Trace::from_bytes(&good[..cut]).is_err(), "cut at {cut}");
        }
        // A page that changes while not present.
        let mut bad = epochs.clone();
        bad[1].changed[0].vpn = 99;
        let mut tw = TraceWriter::create(&path).unwrap();
        for e in &bad {
            tw.write_epoch(e).unwrap();
        }
        tw.finish().unwrap();
        let err = Trace::read(&path).unwrap_err().to_string();
        assert!(err.contains("changes while not present"), "{err}");
        // A huge count in a short file is refused before anything is allocated for it.
        let mut huge = good[..16].to_vec();
        huge.extend_from_slice(&[0u8; 16]);
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0u8; 8]);
        let err = Trace::from_bytes(&huge).unwrap_err();
        assert!(
            matches!(err, TraceError::CountsPastEnd { epoch: 0, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_page_named_twice_in_one_epoch_is_refused() {
        let dir = std::env::temp_dir().join(format!("ztier-trace-twice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace");
        let first = Epoch {
            appeared: vec![w(10, 0), w(11, 1)],
            ..Epoch::default()
        };
        for second in [
            // Appears and changes (the counts otherwise adding up).
            Epoch {
                millis: 1,
                unchanged: 1,
                appeared: vec![w(20, 2)],
                changed: vec![w(20, 3)],
                ..Epoch::default()
            },
            // Changes and goes.
            Epoch {
                millis: 1,
                unchanged: 0,
                changed: vec![w(10, 2)],
                went: vec![10],
                ..Epoch::default()
            },
        ] {
            let mut tw = TraceWriter::create(&path).unwrap();
            tw.write_epoch(&first).unwrap();
            tw.write_epoch(&second).unwrap();
            tw.finish().unwrap();
            let err = Trace::read(&path).unwrap_err().to_string();
            assert!(err.contains("named twice"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unchanged_count_past_any_sum_is_refused() {
        // Two pages appear while the epoch says u64::MAX - k were there unchanged: the sum
        // overflows (a panic with overflow checks, as in a debug build; a wrapped sum
        // without them), and is refused as not adding up, read from a file or checked in
        // memory.
        for k in [0, 1] {
            let t = Trace {
                page_size: CORPUS_PAGE as u32,
                epochs: vec![Epoch {
                    unchanged: u64::MAX - k,
                    appeared: vec![w(7, 0), w(8, 1)],
                    ..Epoch::default()
                }],
            };
            let err = Trace::from_bytes(&t.to_bytes().unwrap()).unwrap_err();
            assert!(err.to_string().contains("do not add up"), "{err}");
            let err = t.check_invariants().unwrap_err();
            assert_eq!(
                err,
                TraceError::CountsDoNotAddUp {
                    epoch: 0,
                    unchanged: u64::MAX - k,
                    written: 2,
                    present: 2
                }
            );
            assert!(err.to_string().contains("do not add up"), "{err}");
        }
    }

    #[test]
    fn a_file_without_the_magic_is_not_a_trace() {
        for garbage in [&b""[..], b"garbage", b"ZTIERTR", b"ZTIERTRX\x01\0\0\0"] {
            let err = Trace::from_bytes(garbage).unwrap_err();
            assert_eq!(err, TraceError::NotATrace, "{garbage:?}");
            assert!(
                err.to_string().contains("not a ztier trace"),
                "{garbage:?}: {err}"
            );
        }
    }
}
