//! Corpus files: real memory, one 4096-byte page after another, raw (`NAME.pages`) or
//! zstd-compressed (`NAME.pages.zst`), with what the kernel's zram made of them beside it:
//! `NAME.truth.json` (its `mm_stat` figures) and `ksizes/NAME.ALG.ksizes.u16` (the size it
//! stored for each page).
//!
//! A corpus is read whole into memory, up to [`max_corpus_bytes`]; a truth file is decoded
//! into [`Truth`] and checked against the pages it sits beside (their count and SHA-256).
//!
//! - [`writer`]: writes a corpus (what `ztier capture` makes), its SHA-256 kept as it goes.
//! - [`stream`]: reads one on from its start, holding only the pages asked for last (a
//!   replay of a capture too large to hold).
//! - [`trace`]: a capture over time: per epoch, the pages that appeared, changed and went.
#![forbid(unsafe_code)]

pub mod stream;
pub mod trace;
pub mod writer;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use trace::TraceError;

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
    #[error("{path}: a corpus file's name ends in .pages.zst or .pages")]
    NotACorpusName { path: PathBuf },
    #[error("{path}: a page of {len} bytes, not {CORPUS_PAGE}")]
    PageLength { path: PathBuf, len: usize },
    /// A JSON file (the kernel's figures) that does not parse as what it should be. The
    /// cause is in the message, not also a `source`.
    #[error("{path}: {cause}")]
    Json {
        path: PathBuf,
        cause: serde_json::Error,
    },
    /// A `ksizes` file with an entry (a `u16`) for other than each corpus page.
    #[error("{path}: {entries} entries for {pages} pages")]
    KernelSizes {
        path: PathBuf,
        entries: usize,
        pages: usize,
    },
    /// A trace file refused (see [`trace`]'s invariants). The cause is in the message, not
    /// also a `source` (a chain printed whole would say it twice).
    #[error("{path}: {cause}")]
    BadTrace { path: PathBuf, cause: TraceError },
    #[error("{path}: more than {max} bytes of pages, the most allowed for a corpus here")]
    TooLarge { path: PathBuf, max: u64 },
    /// A streamed corpus asked for a page before those it holds (`stream`).
    #[error("{path}: page {page} asked for after page {held_from}: a corpus read on from its start gives its pages in order (read it whole for this)")]
    NotInOrder {
        path: PathBuf,
        page: u64,
        held_from: u64,
    },
    #[error("{path}: ends after {pages} pages; {wanted} wanted")]
    EndsBefore {
        path: PathBuf,
        pages: u64,
        wanted: u64,
    },
    #[error("{path} does not describe {corpus}: {reason}")]
    TruthMismatch {
        path: PathBuf,
        corpus: PathBuf,
        reason: String,
    },
}

pub type Result<T, E = CorpusError> = std::result::Result<T, E>;

/// A corpus file's name: its file's, without `.pages.zst` or `.pages`.
pub fn corpus_name(path: &Path) -> &str {
    let file = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let stem = file.strip_suffix(".zst").unwrap_or(file);
    stem.strip_suffix(".pages").unwrap_or(stem)
}

/// A corpus file's pages from the first, decompressed if its name ends in `.zst`.
pub(crate) fn open_pages(path: &Path) -> Result<Box<dyn Read + Send>> {
    let io = |source| CorpusError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    Ok(if path.extension().is_some_and(|e| e == "zst") {
        Box::new(zstd::stream::read::Decoder::new(file).map_err(io)?)
    } else {
        Box::new(std::io::BufReader::new(file))
    })
}

/// A corpus in memory.
pub struct Corpus {
    /// File name without `.pages` / `.pages.zst`.
    pub name: String,
    pub path: PathBuf,
    data: Vec<u8>,
}

impl Corpus {
    /// Reads a `.pages` or `.pages.zst` file whole, refusing one of more than
    /// [`max_corpus_bytes`] (decompressed).
    pub fn load(path: &Path) -> Result<Corpus> {
        Corpus::load_at_most(path, max_corpus_bytes())
    }

    /// As [`load`](Self::load), refusing more than `max` bytes of pages; reads at most
    /// `max + 1` bytes, whatever the file (a pipe, `/dev/zero`, a zstd bomb).
    pub fn load_at_most(path: &Path, max: u64) -> Result<Corpus> {
        let mut data = Vec::new();
        open_pages(path)?
            .take(max.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|source| CorpusError::Io {
                path: path.to_owned(),
                source,
            })?;
        if data.len() as u64 > max {
            return Err(CorpusError::TooLarge {
                path: path.to_owned(),
                max,
            });
        }
        Corpus::new(corpus_name(path), path, data)
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

    /// `NAME.truth.json` beside the corpus, if there is one, decoded with `M` as the
    /// `mm_stat` type (zram's `MmStat`, or any struct of the fields a caller needs) and
    /// checked to describe these pages: a truth file missing a field, or one whose page count
    /// or `raw_sha256` differs from the corpus, is an error.
    pub fn truth<M: DeserializeOwned>(&self) -> Result<Option<Truth<M>>> {
        let path = self.sibling(&format!("{}.truth.json", self.name));
        let truth = match Truth::<M>::read(&path) {
            Err(CorpusError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None)
            }
            other => other?,
        };
        let mismatch = |reason: String| CorpusError::TruthMismatch {
            path: path.clone(),
            corpus: self.path.clone(),
            reason,
        };
        if truth.pages != self.pages() as u64 {
            return Err(mismatch(format!(
                "it is for {} pages, the corpus has {}",
                truth.pages,
                self.pages()
            )));
        }
        let sha = hex(&Sha256::digest(&self.data));
        if !truth.raw_sha256.eq_ignore_ascii_case(&sha) {
            return Err(mismatch(format!(
                "its raw_sha256 is {}, the pages' is {sha}",
                truth.raw_sha256
            )));
        }
        Ok(Some(truth))
    }

    /// What the kernel's zswap made of these pages with `algorithm` (`zswap-truth.json`
    /// beside the corpus), if the file has them; a figure for another page count is an
    /// error.
    pub fn zswap_truth(&self, algorithm: &str) -> Result<Option<ZswapTruth>> {
        let path = self.sibling("zswap-truth.json");
        let Some(file) = read_zswap_truth(&path)? else {
            return Ok(None);
        };
        let Some(mut truth) = file
            .corpora
            .get(&self.name)
            .and_then(|by_alg| by_alg.get(algorithm))
            .cloned()
        else {
            return Ok(None);
        };
        if truth.pages != self.pages() as u64 {
            return Err(CorpusError::TruthMismatch {
                path,
                corpus: self.path.clone(),
                reason: format!(
                    "its {algorithm} figures are for {} pages, the corpus has {}",
                    truth.pages,
                    self.pages()
                ),
            });
        }
        truth.kernel = file.kernel;
        Ok(Some(truth))
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
            return Err(CorpusError::KernelSizes {
                path,
                entries: bytes.len() / 2,
                pages: self.pages(),
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

#[derive(Deserialize)]
struct ZswapTruthFile {
    kernel: String,
    corpora: BTreeMap<String, BTreeMap<String, ZswapTruth>>,
}

/// What the kernel's zswap made of a corpus with one compressor: the pages swapped out in
/// order, no writeback (see the shared corpus's README).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct ZswapTruth {
    /// The kernel release (from the file's header).
    #[serde(default)]
    pub kernel: String,
    pub pages: u64,
    pub zero_pages: u64,
    pub nonzero_same_filled_pages: u64,
    pub stored_pages: u64,
    pub stored_incompressible_pages: u64,
    pub pool_total_size: u64,
    pub written_back_pages: u64,
    #[serde(rename = "Zswap_kB")]
    pub zswap_kb: u64,
    #[serde(rename = "Zswapped_kB")]
    pub zswapped_kb: u64,
    #[serde(rename = "pageout_MBps_median")]
    pub pageout_mb_s: Option<f64>,
    #[serde(rename = "faultin_MBps_median")]
    pub faultin_mb_s: Option<f64>,
}

/// A truth file: what the kernel's zram made of a corpus (`NAME.truth.json`; see the shared
/// corpus's README). `M` is the type each `mm_stat` is read as.
#[derive(Debug, Clone, Deserialize)]
pub struct Truth<M> {
    /// Pages of the corpus it describes.
    pub pages: u64,
    /// SHA-256 of the corpus's raw pages, in hex.
    pub raw_sha256: String,
    /// The kernel release the figures come from.
    pub kernel: String,
    pub kernel_config: KernelConfig,
    /// The kernel's per-algorithm figures, by zram's algorithm name.
    pub zram: BTreeMap<String, ZramTruth<M>>,
}

/// The kernel configuration the figures were taken with.
#[derive(Debug, Clone, Deserialize)]
pub struct KernelConfig {
    #[serde(rename = "CONFIG_ZSMALLOC_CHAIN_SIZE")]
    pub zsmalloc_chain_size: usize,
    #[serde(rename = "PAGE_SIZE")]
    pub page_size: usize,
}

/// One algorithm's figures.
#[derive(Debug, Clone, Deserialize)]
pub struct ZramTruth<M> {
    /// After writing every page.
    pub mm_stat: M,
    /// After that and one compaction.
    pub mm_stat_after_compact: M,
    /// Median `dd` write and read speeds, MB/s.
    #[serde(rename = "write_MBps_median", alias = "write_MBps")]
    pub write_mb_s: Option<f64>,
    #[serde(rename = "read_MBps_median")]
    pub read_mb_s: Option<f64>,
    /// Every odd page discarded after the write, then two compactions (not taken for every
    /// algorithm).
    pub discard_odd_pages_then_compact: Option<DiscardTruth<M>>,
    /// The `ksizes` file of the kernel's size of each page, when one was measured.
    #[serde(default)]
    pub per_page_sizes_file: Option<String>,
}

/// The discard experiment: `mm_stat` after each step.
#[derive(Debug, Clone, Deserialize)]
pub struct DiscardTruth<M> {
    pub pages_discarded: u64,
    pub after_write: M,
    pub after_discard: M,
    pub after_compact: M,
    pub after_second_compact: M,
}

impl<M: DeserializeOwned> Truth<M> {
    /// Decodes a truth file, without checking it against any corpus (for tests that use
    /// only the figures and the `ksizes`); [`Corpus::truth`] also checks it.
    pub fn read(path: &Path) -> Result<Truth<M>> {
        let text = std::fs::read(path).map_err(|source| CorpusError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_slice(&text).map_err(|cause| CorpusError::Json {
            path: path.to_owned(),
            cause,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The most bytes of pages a corpus may hold: half the machine's memory (the bench keeps the
/// pages and the device's copy of them), and no more than 64 GiB.
pub fn max_corpus_bytes() -> u64 {
    (ztier_base::os::physical_memory_bytes() / 2).min(64 << 30)
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

/// A corpus and an algorithm the kernel's figures are given for.
pub type TruthPair = (String, String);

/// The (corpus, algorithm) pairs the `NAME.truth.json` files in `dir` give zram figures for,
/// sorted; with `per_page`, only those whose entry names a `per_page_sizes_file` (`ksizes`).
/// What a kernel-parity test must compare, all of it ([`require_pairs`]).
pub fn zram_truth_pairs(dir: &Path, per_page: bool) -> Result<Vec<TruthPair>> {
    let mut pairs = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|source| CorpusError::Io {
        path: dir.to_owned(),
        source,
    })? {
        let path = entry
            .map_err(|source| CorpusError::Io {
                path: dir.to_owned(),
                source,
            })?
            .path();
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let Some(name) = file.strip_suffix(".truth.json") else {
            continue;
        };
        let truth = Truth::<serde_json::Value>::read(&path)?;
        for (alg, figures) in &truth.zram {
            if !per_page || figures.per_page_sizes_file.is_some() {
                pairs.push((name.to_owned(), alg.clone()));
            }
        }
    }
    pairs.sort();
    Ok(pairs)
}

/// A `zswap-truth.json`, parsed; `None` if there is none.
fn read_zswap_truth(path: &Path) -> Result<Option<ZswapTruthFile>> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(CorpusError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|cause| CorpusError::Json {
            path: path.to_owned(),
            cause,
        })
}

/// The (corpus, algorithm) pairs `zswap-truth.json` in `dir` gives figures for, sorted (none
/// without the file).
pub fn zswap_truth_pairs(dir: &Path) -> Result<Vec<TruthPair>> {
    let Some(file) = read_zswap_truth(&dir.join("zswap-truth.json"))? else {
        return Ok(Vec::new());
    };
    Ok(file
        .corpora
        .into_iter()
        .flat_map(|(corpus, by_alg)| by_alg.into_keys().map(move |alg| (corpus.clone(), alg)))
        .collect())
}

/// Checks a kernel-parity test compared every pair `listed` (by its truth files): the ones
/// it did not are named through [`cannot_test`], so under CI a pair the corpus lacks (a
/// corpus file, a `ksizes` file) fails the test, and elsewhere it is said and skipped.
pub fn require_pairs(test: &str, listed: &[TruthPair], compared: &[TruthPair]) {
    let missing: Vec<String> = listed
        .iter()
        .filter(|p| !compared.contains(p))
        .map(|(corpus, alg)| format!("{corpus}/{alg}"))
        .collect();
    if !missing.is_empty() {
        cannot_test(&format!(
            "{test}: the truth files list {} not compared",
            missing.join(", ")
        ));
    }
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
        assert!(c.truth::<serde_json::Value>().unwrap().is_none());
        // A small file that decompresses to more than the bound is refused, having read
        // no more than the bound.
        let bomb = dir.join("bomb.pages.zst");
        std::fs::write(
            &bomb,
            zstd::encode_all(&vec![0u8; 64 << 20][..], 19).unwrap(),
        )
        .unwrap();
        assert!(std::fs::metadata(&bomb).unwrap().len() < 64 << 10);
        assert!(matches!(
            Corpus::load_at_most(&bomb, 1 << 20),
            Err(CorpusError::TooLarge { max: 1048576, .. })
        ));
        assert_eq!(
            Corpus::load_at_most(&bomb, 64 << 20).unwrap().pages(),
            16384
        );
        assert!(Corpus::load(&dir.join("missing.pages")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
