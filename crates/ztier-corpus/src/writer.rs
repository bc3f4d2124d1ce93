//! Writing a corpus: pages appended one after another to `NAME.pages.zst` (zstd) or
//! `NAME.pages` (raw), their SHA-256 and count kept as they go, so the manifest's
//! `raw_sha256` is that of the pages as [`Corpus::load`](crate::Corpus::load) reads them back.
//!
//! The file is written under a temporary name beside the target and renamed over it only by
//! [`CorpusWriter::finish`]: a capture that fails half way leaves no corpus that looks whole.
//! A writer dropped unfinished removes its temporary file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{hex, CorpusError, Result, CORPUS_PAGE};

enum Sink {
    Raw(BufWriter<File>),
    Zstd(zstd::stream::write::Encoder<'static, BufWriter<File>>),
}

/// A corpus being written. Pages go in with [`push`](Self::push); [`finish`](Self::finish)
/// makes the file and says what it holds.
pub struct CorpusWriter {
    path: PathBuf,
    temporary: PathBuf,
    /// zstd (`.pages.zst`), or raw.
    compressed: bool,
    sink: Option<Sink>,
    sha: Sha256,
    pages: u64,
}

/// What a finished corpus holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WrittenCorpus {
    pub path: PathBuf,
    pub pages: u64,
    /// SHA-256 of the raw pages, in hex (what a truth file's `raw_sha256` must be).
    pub raw_sha256: String,
}

impl CorpusWriter {
    /// Starts `path`, which must end in `.pages.zst` (zstd, level 3) or `.pages` (raw).
    pub fn create(path: &Path) -> Result<CorpusWriter> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let compressed = name.ends_with(".pages.zst");
        if !compressed && !name.ends_with(".pages") {
            return Err(CorpusError::NotACorpusName {
                path: path.to_owned(),
            });
        }
        let temporary = path.with_file_name(format!(".{name}.{}.partial", std::process::id()));
        let sink = Self::new_sink(&temporary, compressed)?;
        Ok(CorpusWriter {
            path: path.to_owned(),
            temporary,
            compressed,
            sink: Some(sink),
            sha: Sha256::new(),
            pages: 0,
        })
    }

    /// The temporary file made empty, and a sink writing it (zstd, level 3, or raw).
    fn new_sink(temporary: &Path, compressed: bool) -> Result<Sink> {
        let io = |source| CorpusError::Io {
            path: temporary.to_owned(),
            source,
        };
        let file = BufWriter::new(File::create(temporary).map_err(io)?);
        if !compressed {
            return Ok(Sink::Raw(file));
        }
        zstd::stream::write::Encoder::new(file, 3)
            .map(Sink::Zstd)
            .map_err(|e| {
                let _ = std::fs::remove_file(temporary);
                io(e)
            })
    }

    /// Drops every page pushed and starts again from none (a capture's first read cut
    /// short and made again).
    pub fn restart(&mut self) -> Result<()> {
        // The old sink goes first: its buffered bytes reach the file before it is emptied.
        drop(self.sink.take());
        self.sha = Sha256::new();
        self.pages = 0;
        match Self::new_sink(&self.temporary, self.compressed) {
            Ok(sink) => {
                self.sink = Some(sink);
                Ok(())
            }
            Err(e) => {
                // No sink, so the drop would not remove it.
                let _ = std::fs::remove_file(&self.temporary);
                Err(e)
            }
        }
    }

    /// Appends one page of [`CORPUS_PAGE`] bytes; returns its index in the corpus.
    pub fn push(&mut self, page: &[u8]) -> Result<u64> {
        if page.len() != CORPUS_PAGE {
            return Err(CorpusError::PageLength {
                path: self.path.clone(),
                len: page.len(),
            });
        }
        let io = |source| CorpusError::Io {
            path: self.temporary.clone(),
            source,
        };
        match self.sink.as_mut() {
            Some(Sink::Raw(w)) => w.write_all(page).map_err(io)?,
            Some(Sink::Zstd(w)) => w.write_all(page).map_err(io)?,
            // Taken by a restart that could not make the file again (it said why).
            None => {
                return Err(io(std::io::Error::other(
                    "the corpus could not be started again",
                )))
            }
        }
        self.sha.update(page);
        self.pages += 1;
        Ok(self.pages - 1)
    }

    /// Pages pushed so far.
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Flushes, syncs and renames the file into place. An empty corpus is refused (and no
    /// file is left), as [`Corpus::load`](crate::Corpus::load) would refuse it.
    pub fn finish(mut self) -> Result<WrittenCorpus> {
        if self.pages == 0 {
            return Err(CorpusError::Empty {
                path: self.path.clone(),
            });
        }
        let io = |source| CorpusError::Io {
            path: self.temporary.clone(),
            source,
        };
        let file = match self.sink.take() {
            Some(Sink::Raw(w)) => w.into_inner().map_err(|e| io(e.into_error()))?,
            Some(Sink::Zstd(w)) => w
                .finish()
                .map_err(io)?
                .into_inner()
                .map_err(|e| io(e.into_error()))?,
            None => {
                return Err(io(std::io::Error::other(
                    "the corpus could not be started again",
                )))
            }
        };
        file.sync_all().map_err(io)?;
        std::fs::rename(&self.temporary, &self.path).map_err(io)?;
        Ok(WrittenCorpus {
            path: self.path.clone(),
            pages: self.pages,
            raw_sha256: hex(&std::mem::take(&mut self.sha).finalize()),
        })
    }
}

impl Drop for CorpusWriter {
    fn drop(&mut self) {
        if self.sink.take().is_some() {
            let _ = std::fs::remove_file(&self.temporary);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Corpus;

    #[test]
    fn written_pages_load_back_with_their_sha() {
        let dir = std::env::temp_dir().join(format!("ztier-corpus-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["w.pages.zst", "w.pages"] {
            let path = dir.join(name);
            let mut w = CorpusWriter::create(&path).unwrap();
            let pages: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; CORPUS_PAGE]).collect();
            for p in &pages {
                w.push(p).unwrap();
            }
            assert!(w.push(&[0u8; 100]).is_err(), "a short page is refused");
            assert!(!path.exists(), "nothing in place before finish");
            let done = w.finish().unwrap();
            assert_eq!(done.pages, 5);
            let c = Corpus::load(&path).unwrap();
            assert_eq!(c.bytes(), pages.concat().as_slice());
            assert_eq!(done.raw_sha256, hex(&Sha256::digest(c.bytes())));
        }
        // Dropped unfinished: no file, no temporary left.
        let path = dir.join("dropped.pages.zst");
        let mut w = CorpusWriter::create(&path).unwrap();
        w.push(&[1u8; CORPUS_PAGE]).unwrap();
        drop(w);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("dropped"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // Restarted: only the pages pushed since are in the corpus, and in its SHA-256.
        for name in ["r.pages.zst", "r.pages"] {
            let path = dir.join(name);
            let mut w = CorpusWriter::create(&path).unwrap();
            for i in 0..3u8 {
                w.push(&[i; CORPUS_PAGE]).unwrap();
            }
            w.restart().unwrap();
            assert_eq!(w.pages(), 0);
            w.push(&[9u8; CORPUS_PAGE]).unwrap();
            let done = w.finish().unwrap();
            let c = Corpus::load(&path).unwrap();
            assert_eq!(c.bytes(), &[9u8; CORPUS_PAGE][..]);
            assert_eq!(done.raw_sha256, hex(&Sha256::digest(c.bytes())));
        }
        assert!(matches!(
            CorpusWriter::create(&dir.join("x.bin")),
            Err(CorpusError::NotACorpusName { .. })
        ));
        assert!(matches!(
            CorpusWriter::create(&dir.join("e.pages")).unwrap().finish(),
            Err(CorpusError::Empty { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
