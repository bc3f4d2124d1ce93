//! A corpus read from its start page by page, for a replay of a capture too large to hold in
//! memory (a capture over time writes every page each epoch changed: an hour of a program's
//! life is tens of gigabytes of pages). The replay asks for each epoch's pages as it comes to
//! them, in the order the capture wrote them; only the pages asked for last are held.
//!
//! Invariants: the pages held are `held_from..next`, read in order from the file; a page
//! before them cannot be had again (the replay that asks for one is told so: a corpus read
//! whole can serve it); no more pages are held than the largest request asked for, and a
//! request of more than `max_held_bytes` is refused, so memory is bounded whatever the file
//! holds (a zstd bomb). Time is not: a request far into the file reads every page before it
//! (a replay asks for each epoch's pages straight after the last's, a trace's invariant). A
//! request that fails leaves nothing held.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{corpus_name, open_pages, CorpusError, Result, CORPUS_PAGE};

/// A corpus file read on from its start.
pub struct CorpusStream {
    /// File name without `.pages` / `.pages.zst`.
    pub name: String,
    pub path: PathBuf,
    reader: Box<dyn Read + Send>,
    held: Vec<u8>,
    held_from: u64,
    /// The page the next read begins with.
    next: u64,
    max_held_bytes: u64,
    /// A read of the file failed: where the file stands is unknown, so nothing more is read.
    failed: bool,
}

impl std::fmt::Debug for CorpusStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CorpusStream")
            .field("path", &self.path)
            .field("held_from", &self.held_from)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl CorpusStream {
    /// Opens a `.pages` or `.pages.zst` file at its first page; holds at most
    /// `max_held_bytes` of pages at a time.
    pub fn open(path: &Path, max_held_bytes: u64) -> Result<CorpusStream> {
        Ok(CorpusStream {
            name: corpus_name(path).to_owned(),
            path: path.to_owned(),
            reader: open_pages(path)?,
            held: Vec::new(),
            held_from: 0,
            next: 0,
            max_held_bytes,
            failed: false,
        })
    }

    /// Holds pages `from..to` in place of those held before, reading on from where the last
    /// request ended (the pages between are read past). A page before those held last is
    /// [`CorpusError::NotInOrder`]; a file that ends first, [`CorpusError::EndsBefore`].
    pub fn hold(&mut self, from: u64, to: u64) -> Result<()> {
        if self.failed {
            return Err(CorpusError::Io {
                path: self.path.clone(),
                source: std::io::Error::other("a read of it failed before: it is read no further"),
            });
        }
        if from < self.held_from {
            return Err(CorpusError::NotInOrder {
                path: self.path.clone(),
                page: from,
                held_from: self.held_from,
            });
        }
        let asked = to.saturating_sub(from).saturating_mul(CORPUS_PAGE as u64);
        if asked > self.max_held_bytes {
            return Err(CorpusError::TooLarge {
                path: self.path.clone(),
                max: self.max_held_bytes,
            });
        }
        // Pages already held that the request keeps: from..next of them, moved to the front.
        let kept_from = from.min(self.next);
        let keep = (kept_from - self.held_from) as usize * CORPUS_PAGE;
        self.held.drain(..keep.min(self.held.len()));
        if self.next < from {
            self.held.clear();
            if let Err(e) = self.skip(from - self.next) {
                self.failed = true;
                return Err(e);
            }
        }
        self.held_from = from;
        // At most `max_held_bytes`, checked above.
        let wanted = to.saturating_sub(self.next) as usize * CORPUS_PAGE;
        let have = self.held.len();
        self.held.resize(have + wanted, 0);
        if let Err(e) = self.fill(have) {
            self.held.clear();
            self.failed = true;
            return Err(e);
        }
        self.next = self.next.max(to);
        Ok(())
    }

    /// Page `index`, if it is held.
    pub fn page(&self, index: u64) -> Option<&[u8]> {
        let at = usize::try_from(index.checked_sub(self.held_from)?)
            .ok()?
            .checked_mul(CORPUS_PAGE)?;
        self.held.get(at..at.checked_add(CORPUS_PAGE)?)
    }

    /// Pages read from the file so far.
    pub fn pages_read(&self) -> u64 {
        self.next
    }

    /// Reads `held[from..]` whole from the file.
    fn fill(&mut self, from: usize) -> Result<()> {
        let got = read_up_to(&mut self.reader, &mut self.held[from..])
            .map_err(|source| self.io_error(source))?;
        if from + got < self.held.len() {
            return Err(CorpusError::EndsBefore {
                path: self.path.clone(),
                pages: self.held_from + ((from + got) / CORPUS_PAGE) as u64,
                wanted: self.held_from + (self.held.len() / CORPUS_PAGE) as u64,
            });
        }
        Ok(())
    }

    /// Reads `pages` pages past, a page at a time.
    fn skip(&mut self, pages: u64) -> Result<()> {
        let mut page = vec![0u8; CORPUS_PAGE];
        for n in 0..pages {
            let got =
                read_up_to(&mut self.reader, &mut page).map_err(|source| self.io_error(source))?;
            if got < CORPUS_PAGE {
                return Err(CorpusError::EndsBefore {
                    path: self.path.clone(),
                    pages: self.next + n,
                    wanted: self.next + pages,
                });
            }
        }
        self.next += pages;
        Ok(())
    }

    fn io_error(&self, source: std::io::Error) -> CorpusError {
        CorpusError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// Reads into `buf` until it is full or the reader ends; returns the bytes read.
fn read_up_to(reader: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut at = 0;
    while at < buf.len() {
        match reader.read(&mut buf[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::CorpusWriter;

    #[test]
    fn pages_are_held_in_order_and_what_cannot_be_had_is_an_error() {
        let dir = std::env::temp_dir().join(format!("ztier-corpus-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["s.pages.zst", "s.pages"] {
            let path = dir.join(name);
            let mut w = CorpusWriter::create(&path).unwrap();
            for i in 0..10u8 {
                w.push(&[i; CORPUS_PAGE]).unwrap();
            }
            w.finish().unwrap();
            let mut s = CorpusStream::open(&path, 4 * CORPUS_PAGE as u64).unwrap();
            assert_eq!(s.name, "s");
            s.hold(0, 3).unwrap();
            assert_eq!(s.page(2).unwrap(), &[2u8; CORPUS_PAGE][..]);
            assert!(s.page(3).is_none());
            // Overlapping the pages held: those kept, the rest read on.
            s.hold(2, 5).unwrap();
            assert_eq!(s.page(2).unwrap()[0], 2);
            assert_eq!(s.page(4).unwrap()[0], 4);
            assert!(s.page(1).is_none());
            // Past a gap: the pages between read past.
            s.hold(7, 8).unwrap();
            assert_eq!(s.page(7).unwrap()[0], 7);
            assert_eq!(s.pages_read(), 8);
            assert!(matches!(
                s.hold(6, 8),
                Err(CorpusError::NotInOrder { page: 6, .. })
            ));
            assert!(matches!(s.hold(8, 13), Err(CorpusError::TooLarge { .. })));
            assert!(matches!(
                s.hold(8, 12),
                Err(CorpusError::EndsBefore {
                    pages: 10,
                    wanted: 12,
                    ..
                })
            ));
            // Nothing held after it, and nothing more read.
            assert!(s.page(8).is_none());
            assert!(matches!(s.hold(8, 9), Err(CorpusError::Io { .. })));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
