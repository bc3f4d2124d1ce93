//! Corpus files: real memory, one 4096-byte page after another, raw (`NAME.pages`) or
//! zstd-compressed (`NAME.pages.zst`), with what the kernel's zram made of them beside it:
//! `NAME.truth.json` (its `mm_stat` figures) and `ksizes/NAME.ALG.ksizes.u16` (the size it
//! stored for each page).
#![forbid(unsafe_code)]

use std::io::Read;
use std::path::{Path, PathBuf};

/// Size of a corpus page.
pub const CORPUS_PAGE: usize = 4096;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CorpusError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {len} bytes is not a whole number of 4096-byte pages (truncated file?)")]
    Truncated { path: PathBuf, len: usize },
    #[error("{path}: empty corpus")]
    Empty { path: PathBuf },
    #[error("{path}: {reason}")]
    Malformed { path: PathBuf, reason: String },
}

pub type Result<T, E = CorpusError> = std::result::Result<T, E>;

/// A corpus in memory.
pub struct Corpus {
    /// File name without `.pages` / `.pages.zst`.
    pub name: String,
    pub path: PathBuf,
    data: Vec<u8>,
}

impl Corpus {
    /// Reads a `.pages` or `.pages.zst` file whole.
    pub fn load(path: &Path) -> Result<Corpus> {
        let io = |source| CorpusError::Io {
            path: path.to_owned(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let file_name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let mut data = Vec::new();
        let name = if let Some(stem) = file_name.strip_suffix(".zst") {
            let mut dec = zstd::stream::read::Decoder::new(file).map_err(io)?;
            dec.read_to_end(&mut data).map_err(io)?;
            stem
        } else {
            let mut file = file;
            file.read_to_end(&mut data).map_err(io)?;
            file_name
        };
        let name = name.strip_suffix(".pages").unwrap_or(name).to_owned();
        Corpus::new(&name, path, data)
    }

    fn new(name: &str, path: &Path, data: Vec<u8>) -> Result<Corpus> {
        if data.is_empty() {
            return Err(CorpusError::Empty {
                path: path.to_owned(),
            });
        }
        if !data.len().is_multiple_of(CORPUS_PAGE) {
            return Err(CorpusError::Truncated {
                path: path.to_owned(),
                len: data.len(),
            });
        }
        Ok(Corpus {
            name: name.to_owned(),
            path: path.to_owned(),
            data,
        })
    }

    pub fn pages(&self) -> usize {
        self.data.len() / CORPUS_PAGE
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The corpus cut into pages of `page_size` bytes (4096, or 16384 formed from four
    /// consecutive corpus pages); a partial last page is left out.
    pub fn chunks(&self, page_size: usize) -> std::slice::ChunksExact<'_, u8> {
        self.data.chunks_exact(page_size)
    }

    fn sibling(&self, file: &str) -> PathBuf {
        self.path.parent().unwrap_or(Path::new(".")).join(file)
    }

    /// `NAME.truth.json` beside the corpus, if there is one.
    pub fn truth(&self) -> Result<Option<serde_json::Value>> {
        let path = self.sibling(&format!("{}.truth.json", self.name));
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CorpusError::Io { path, source }),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|e| CorpusError::Malformed {
                path,
                reason: e.to_string(),
            })
    }

    /// The kernel's stored size of each page for `algorithm`, if `ksizes/` has them.
    pub fn kernel_sizes(&self, algorithm: &str) -> Result<Option<Vec<u16>>> {
        let path = self.sibling(&format!("ksizes/{}.{algorithm}.ksizes.u16", self.name));
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(CorpusError::Io { path, source }),
        };
        if bytes.len() != self.pages() * 2 {
            return Err(CorpusError::Malformed {
                path,
                reason: format!("{} entries for {} pages", bytes.len() / 2, self.pages()),
            });
        }
        Ok(Some(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ))
    }
}

/// The shared corpus directory for tests: `$ZTIER_CORPUS_DIR`, else `../shared/corpus` beside
/// the repository. `None`, with a line saying so on stderr, when it is absent (see
/// [`cannot_test`]: under CI that fails the test instead).
pub fn shared_corpus_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("ZTIER_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus"));
    if dir.join("ksizes").is_dir() {
        Some(dir)
    } else {
        cannot_test(&format!(
            "no corpus at {} (set ZTIER_CORPUS_DIR to the shared corpus)",
            dir.display()
        ));
        None
    }
}

/// What a test does when something it needs is missing: says so and lets the test skip, or,
/// when the `CI` environment variable is set (as `.ci/run` sets it), panics, because in CI
/// nothing may be skipped.
pub fn cannot_test(why: &str) {
    if std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false" && v != "0") {
        panic!("{why}; CI must not skip this test");
    }
    eprintln!("skipping: {why}");
}

/// The `*.pages.zst` / `*.pages` files of a directory, sorted by name.
pub fn corpus_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.to_string_lossy();
            n.ends_with(".pages.zst") || n.ends_with(".pages")
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_empty_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("ztier-corpus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short.pages");
        std::fs::write(&short, vec![1u8; 4096 + 100]).unwrap();
        assert!(matches!(
            Corpus::load(&short),
            Err(CorpusError::Truncated { len: 4196, .. })
        ));
        let empty = dir.join("empty.pages");
        std::fs::write(&empty, b"").unwrap();
        assert!(matches!(
            Corpus::load(&empty),
            Err(CorpusError::Empty { .. })
        ));
        let zst = dir.join("cut.pages.zst");
        let full = zstd::encode_all(&vec![7u8; 8192][..], 3).unwrap();
        std::fs::write(&zst, &full[..full.len() / 2]).unwrap();
        assert!(Corpus::load(&zst).is_err(), "a cut zstd stream is an error");
        std::fs::write(&zst, &full).unwrap();
        let c = Corpus::load(&zst).unwrap();
        assert_eq!((c.name.as_str(), c.pages()), ("cut", 2));
        assert!(c.truth().unwrap().is_none());
        assert!(Corpus::load(&dir.join("missing.pages")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
