//! zstd dictionaries, as zram's `algorithm_params` `dict=PATH` gives one: small pages share
//! most of their content with pages like them, and a dictionary trained on such pages lets
//! a 4 KiB page be compressed as if its neighbours had come first.
//!
//! A [`Dictionary`] is loaded once (the file read, checked and prepared for compression at
//! the algorithm's level and for decompression) and shared by every stream of a device, as
//! the kernel's zstd backend shares one `ZSTD_CDict` among its per-CPU contexts.
//! [`train`] makes one from sample pages (zstd's `ZDICT_trainFromBuffer`).

use std::path::{Path, PathBuf};

use crate::{CompressError, Result};

/// The largest dictionary file read (zstd trains 110 KiB by default; the kernel keeps the
/// file in memory too, so it must stay small).
pub const MAX_DICT_BYTES: u64 = 16 << 20;

/// Why a dictionary could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DictError {
    #[error("dictionary {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dictionary {} is {len} bytes; at most {MAX_DICT_BYTES} are read", path.display())]
    TooLarge { path: PathBuf, len: u64 },
    #[error("dictionary {} is empty", path.display())]
    Empty { path: PathBuf },
    #[error("zstd could not load the dictionary {}", path.display())]
    Refused { path: PathBuf },
}

/// A prepared zstd dictionary.
pub struct Dictionary {
    path: PathBuf,
    level: i32,
    pub(crate) cdict: zstd::zstd_safe::CDict<'static>,
    pub(crate) ddict: zstd::zstd_safe::DDict<'static>,
    len: usize,
}

impl Dictionary {
    /// Reads and prepares the dictionary at `path` for compression at `level`.
    pub fn load(path: &Path, level: i32) -> std::result::Result<Dictionary, DictError> {
        let unreadable = |source| DictError::Unreadable {
            path: path.to_owned(),
            source,
        };
        let len = std::fs::metadata(path).map_err(unreadable)?.len();
        if len > MAX_DICT_BYTES {
            return Err(DictError::TooLarge {
                path: path.to_owned(),
                len,
            });
        }
        let bytes = std::fs::read(path).map_err(unreadable)?;
        Dictionary::from_bytes(path, &bytes, level)
    }

    /// Prepares `bytes` (a trained dictionary, or raw content) as the dictionary named by
    /// `path`.
    pub fn from_bytes(
        path: &Path,
        bytes: &[u8],
        level: i32,
    ) -> std::result::Result<Dictionary, DictError> {
        if bytes.is_empty() {
            return Err(DictError::Empty {
                path: path.to_owned(),
            });
        }
        let cdict =
            zstd::zstd_safe::CDict::try_create(bytes, level).ok_or_else(|| DictError::Refused {
                path: path.to_owned(),
            })?;
        Ok(Dictionary {
            path: path.to_owned(),
            level,
            cdict,
            ddict: zstd::zstd_safe::DDict::create(bytes),
            len: bytes.len(),
        })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The level it was prepared for.
    pub fn level(&self) -> i32 {
        self.level
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Dictionary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dictionary")
            .field("path", &self.path)
            .field("level", &self.level)
            .field("len", &self.len)
            .finish()
    }
}

/// Trains a dictionary of at most `max_len` bytes on `samples` (pages). zstd needs samples
/// with something in common, and some of them: a few hundred pages at least.
pub fn train(samples: &[&[u8]], max_len: usize) -> Result<Vec<u8>> {
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let joined: Vec<u8> = samples.concat();
    zstd::dict::from_continuous(&joined, &sizes, max_len).map_err(|e| CompressError::Library {
        algorithm: "zstd",
        message: format!("training a dictionary on {} samples: {e}", samples.len()),
    })
}

/// Trains a dictionary of at most `max_len` bytes for pages like `pages`: same-filled pages
/// (which zram keeps without compressing) are left out, and the rest sampled evenly to at
/// most `sample_bytes` (zstd's training time grows with the samples; 32 MiB take seconds).
pub fn train_on_pages(pages: &[&[u8]], max_len: usize, sample_bytes: usize) -> Result<Vec<u8>> {
    let candidates: Vec<&[u8]> = pages
        .iter()
        .copied()
        .filter(|p| crate::same_filled(p).is_none())
        .collect();
    let total: usize = candidates.iter().map(|p| p.len()).sum();
    let stride = total.div_ceil(sample_bytes.max(1)).max(1);
    let samples: Vec<&[u8]> = candidates.into_iter().step_by(stride).collect();
    train(&samples, max_len)
}
