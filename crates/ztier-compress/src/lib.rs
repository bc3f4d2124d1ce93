//! The kernel's page compressors, behind one trait.
//!
//! - [`lz4`]: the kernel's in-tree LZ4 (`lib/lz4`), byte-identical output, and a decoder;
//! - [`lzo`]: the kernel's LZO1X-1 (`lib/lzo`) and its lzo-rle variant, compressor and a safe
//!   decompressor that reads both;
//! - [`external`]: zstd, deflate and lz4hc through their reference libraries.
//!
//! A [`Compressor`] is one stream's state (hash tables, contexts): create one per thread from
//! an [`Algorithm`], as zram keeps one per CPU. Compressing allocates nothing.
//!
//! `unsafe` is denied but in three places, each for a speed measured against the C library:
//! the liblz4 FFI in [`liblz4`]; the copies of the LZ4 decoder's fast loop
//! (`lz4::decompress_fast`), where each sequence is bounds-checked once before its copies
//! run; and the compressors' 4- and 8-byte input reads (`copy::read32`/`read64`), in bounds by
//! the shape of the match finders' loops, as each call site says. The fuzz targets run all of
//! it under AddressSanitizer with debug assertions, which check those reads.
//!
//! Decompressors are total: corrupt or truncated input gives an error, never a panic, an
//! out-of-bounds access or a loop that does not end.
//!
//! Each compressor is a cargo feature (`lz4`, `lzo` for lzo and lzo-rle, `lz4hc`, `zstd`,
//! `deflate`; all by default): a compressor left out is not a [`Kind`], and its name is
//! refused when parsed, saying which feature builds it.
#![deny(unsafe_code)]

#[cfg(not(any(
    feature = "lz4",
    feature = "lzo",
    feature = "lz4hc",
    feature = "zstd",
    feature = "deflate"
)))]
compile_error!(
    "ztier-compress needs at least one compressor feature: lz4, lzo, lz4hc, zstd, deflate"
);

#[cfg(any(feature = "lz4", feature = "lzo"))]
mod copy;
#[cfg(feature = "zstd")]
pub mod dict;
#[cfg(any(feature = "lz4hc", feature = "zstd", feature = "deflate"))]
pub mod external;
#[cfg(feature = "lz4hc")]
pub mod liblz4;
#[cfg(feature = "lz4")]
pub mod lz4;
#[cfg(feature = "lzo")]
pub mod lzo;

use std::fmt;
use std::str::FromStr;
#[cfg(feature = "zstd")]
use std::sync::Arc;

#[cfg(feature = "zstd")]
pub use dict::{DictError, Dictionary};

/// Why a compression or decompression failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompressError {
    #[error("output buffer of {have} bytes is below the worst case of {need} for this input")]
    OutputTooSmall { have: usize, need: usize },
    #[error("input of {len} bytes is larger than {algorithm} accepts here ({max})")]
    InputTooLarge {
        algorithm: &'static str,
        len: usize,
        max: usize,
    },
    #[error("corrupt {algorithm} stream at input byte {at}: {reason}")]
    Corrupt {
        algorithm: &'static str,
        at: usize,
        reason: &'static str,
    },
    #[error("{algorithm} stream decodes to more than the {capacity}-byte output")]
    OutputOverrun {
        algorithm: &'static str,
        capacity: usize,
    },
    #[error("{algorithm}: {message}")]
    Library {
        algorithm: &'static str,
        message: String,
    },
    /// A stored page decoded without error but not to a whole page
    /// ([`Compressor::decompress_page`]).
    #[error("{algorithm} stream decodes to {got} bytes instead of a {page_size}-byte page")]
    PageLength {
        algorithm: &'static str,
        got: usize,
        page_size: usize,
    },
}

pub type Result<T, E = CompressError> = std::result::Result<T, E>;

/// Worst-case compressed size of `len` input bytes for every algorithm here (zram likewise
/// gives its streams a buffer of two pages).
pub const fn worst_case_len(len: usize) -> usize {
    2 * len + 64
}

/// One compression stream.
pub trait Compressor: Send {
    /// The algorithm's name as zram spells it.
    fn name(&self) -> &'static str;
    /// Compresses `src` into `dst` (at least [`worst_case_len`]`(src.len())` bytes); returns
    /// the compressed length.
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize>;
    /// Decompresses `src` into `dst`; returns the decompressed length.
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize>;
    /// Decompresses a stored page into `page`, which it must fill exactly: a stream that
    /// decodes to fewer bytes is [`CompressError::PageLength`] (zram's and zswap's check of
    /// every decoded page).
    fn decompress_page(&mut self, src: &[u8], page: &mut [u8]) -> Result<()> {
        match self.decompress(src, page)? {
            n if n == page.len() => Ok(()),
            got => Err(CompressError::PageLength {
                algorithm: self.name(),
                got,
                page_size: page.len(),
            }),
        }
    }
}

/// A compression stream with its output buffer, sized for the worst case of one page: what
/// each CPU keeps for zram (`struct zcomp_strm`) and zswap (`struct crypto_acomp_ctx`).
pub struct Stream {
    pub comp: Box<dyn Compressor>,
    /// Compressed bytes of the last [`Compressor::compress`] into it.
    pub buf: Vec<u8>,
}

impl Stream {
    /// A stream of `algorithm` for pages of `page_size` bytes.
    pub fn new(algorithm: &Algorithm, page_size: usize) -> Stream {
        Stream {
            comp: algorithm.new_compressor(),
            buf: vec![0; worst_case_len(page_size)],
        }
    }

    /// Compresses `page` into the stream's buffer; returns the compressed bytes.
    pub fn compress(&mut self, page: &[u8]) -> Result<&[u8]> {
        let len = self.comp.compress(page, &mut self.buf)?;
        Ok(&self.buf[..len])
    }
}

pub(crate) fn check_dst(src: &[u8], dst: &[u8]) -> Result<()> {
    let need = worst_case_len(src.len());
    if dst.len() < need {
        return Err(CompressError::OutputTooSmall {
            have: dst.len(),
            need,
        });
    }
    Ok(())
}

/// An algorithm and its parameters, as `--compressor` and zram's `algorithm_params` name
/// them: `lz4`, `lzo-rle`, `zstd:level=5`, `lz4:level=2` (acceleration),
/// `zstd:dict=/etc/zram.dict` (a dictionary, loaded when the name is parsed), ...
#[derive(Debug, Clone)]
pub struct Algorithm {
    pub kind: Kind,
    /// Level (zstd, deflate, lz4hc) or acceleration (lz4); `None` for the default.
    pub level: Option<i32>,
    /// zstd's dictionary, shared by every stream made from this value.
    #[cfg(feature = "zstd")]
    pub dict: Option<Arc<Dictionary>>,
}

impl PartialEq for Algorithm {
    fn eq(&self, other: &Algorithm) -> bool {
        #[cfg(feature = "zstd")]
        let same_dict = match (&self.dict, &other.dict) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a.path() == b.path(),
            _ => false,
        };
        #[cfg(not(feature = "zstd"))]
        let same_dict = true;
        self.kind == other.kind && self.level == other.level && same_dict
    }
}

impl Eq for Algorithm {}

/// The algorithms built into this ztier (each a cargo feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    #[cfg(feature = "lz4")]
    Lz4,
    #[cfg(feature = "lz4hc")]
    Lz4hc,
    #[cfg(feature = "lzo")]
    Lzo,
    #[cfg(feature = "lzo")]
    LzoRle,
    #[cfg(feature = "zstd")]
    Zstd,
    #[cfg(feature = "deflate")]
    Deflate,
}

/// Every compressor ztier has, with the cargo feature that builds it.
const FEATURES: [(&str, &str, bool); 6] = [
    ("lzo-rle", "lzo", cfg!(feature = "lzo")),
    ("lzo", "lzo", cfg!(feature = "lzo")),
    ("lz4", "lz4", cfg!(feature = "lz4")),
    ("lz4hc", "lz4hc", cfg!(feature = "lz4hc")),
    ("zstd", "zstd", cfg!(feature = "zstd")),
    ("deflate", "deflate", cfg!(feature = "deflate")),
];

impl Kind {
    /// Every built algorithm, zram's default (lzo-rle) first.
    pub const ALL: &'static [Kind] = &[
        #[cfg(feature = "lzo")]
        Kind::LzoRle,
        #[cfg(feature = "lzo")]
        Kind::Lzo,
        #[cfg(feature = "lz4")]
        Kind::Lz4,
        #[cfg(feature = "lz4hc")]
        Kind::Lz4hc,
        #[cfg(feature = "zstd")]
        Kind::Zstd,
        #[cfg(feature = "deflate")]
        Kind::Deflate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            #[cfg(feature = "lz4")]
            Kind::Lz4 => "lz4",
            #[cfg(feature = "lz4hc")]
            Kind::Lz4hc => "lz4hc",
            #[cfg(feature = "lzo")]
            Kind::Lzo => "lzo",
            #[cfg(feature = "lzo")]
            Kind::LzoRle => "lzo-rle",
            #[cfg(feature = "zstd")]
            Kind::Zstd => "zstd",
            #[cfg(feature = "deflate")]
            Kind::Deflate => "deflate",
        }
    }

    /// Whether `level` is one this algorithm takes (acceleration for lz4).
    fn level_ok(self, level: i32) -> bool {
        let _ = level;
        match self {
            #[cfg(feature = "lz4")]
            Kind::Lz4 => (1..=65537).contains(&level),
            #[cfg(feature = "lz4hc")]
            Kind::Lz4hc => (1..=12).contains(&level),
            #[cfg(feature = "zstd")]
            Kind::Zstd => (-131072..=22).contains(&level) && level != 0,
            #[cfg(feature = "deflate")]
            Kind::Deflate => (0..=9).contains(&level),
            #[cfg(feature = "lzo")]
            Kind::Lzo | Kind::LzoRle => false,
        }
    }

    /// Whether it takes a dictionary (`dict=PATH`).
    fn takes_dict(self) -> bool {
        #[cfg(feature = "zstd")]
        return self == Kind::Zstd;
        #[cfg(not(feature = "zstd"))]
        false
    }
}

impl Algorithm {
    /// The algorithm with its default parameters.
    pub fn new(kind: Kind) -> Algorithm {
        Algorithm {
            kind,
            level: None,
            #[cfg(feature = "zstd")]
            dict: None,
        }
    }

    /// A new stream for this algorithm.
    pub fn new_compressor(&self) -> Box<dyn Compressor> {
        match self.kind {
            #[cfg(feature = "lz4")]
            Kind::Lz4 => Box::new(lz4::Lz4::new(self.level.unwrap_or(1))),
            #[cfg(feature = "lzo")]
            Kind::Lzo => Box::new(lzo::Lzo::new(false)),
            #[cfg(feature = "lzo")]
            Kind::LzoRle => Box::new(lzo::Lzo::new(true)),
            #[cfg(feature = "lz4hc")]
            Kind::Lz4hc => Box::new(external::Lz4hc::new(self.level)),
            #[cfg(feature = "zstd")]
            Kind::Zstd => Box::new(external::Zstd::new(self.level, self.dict.clone())),
            #[cfg(feature = "deflate")]
            Kind::Deflate => Box::new(external::Deflate::new(self.level)),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        let mut sep = ':';
        if let Some(l) = self.level {
            write!(f, "{sep}level={l}")?;
            sep = ',';
        }
        #[cfg(feature = "zstd")]
        if let Some(d) = &self.dict {
            write!(f, "{sep}dict={}", d.path().display())?;
        }
        let _ = sep;
        Ok(())
    }
}

/// A compressor named as `Algorithm` cannot take it (`lz4`, `zstd:level=3`, ...), and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BadAlgorithm {
    #[error("compressor '{name}' is not built into this ztier (cargo feature {feature})")]
    NotBuilt { name: String, feature: &'static str },
    #[error("unknown compressor '{name}' (known: {known})")]
    Unknown { name: String, known: String },
    #[error("level '{0}' is not a number")]
    LevelNotANumber(String),
    #[error("level {level} is out of range for {name}")]
    LevelOutOfRange { level: i32, name: String },
    #[error("dict= is supported for zstd, not {0}")]
    DictionaryNotTaken(String),
    #[error("unknown parameter '{param}' for {name} ({known})")]
    UnknownParameter {
        param: String,
        name: String,
        known: &'static str,
    },
    #[cfg(feature = "zstd")]
    #[error(transparent)]
    Dictionary(#[from] DictError),
}

impl FromStr for Algorithm {
    type Err = BadAlgorithm;
    fn from_str(s: &str) -> std::result::Result<Self, BadAlgorithm> {
        let (name, params) = s.split_once(':').unwrap_or((s, ""));
        let kind = Kind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                if let Some((_, feature, _)) = FEATURES.iter().find(|(n, ..)| *n == name) {
                    return BadAlgorithm::NotBuilt {
                        name: name.to_string(),
                        feature,
                    };
                }
                let names: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
                BadAlgorithm::Unknown {
                    name: name.to_string(),
                    known: names.join(", "),
                }
            })?;
        let mut level = None;
        let mut dict_path = None;
        for param in params.split(',').filter(|p| !p.is_empty()) {
            match param.split_once('=') {
                Some(("level", v)) => {
                    let n: i32 = v
                        .parse()
                        .map_err(|_| BadAlgorithm::LevelNotANumber(v.to_string()))?;
                    if !kind.level_ok(n) {
                        return Err(BadAlgorithm::LevelOutOfRange {
                            level: n,
                            name: name.to_string(),
                        });
                    }
                    level = Some(n);
                }
                Some(("dict", path)) if kind.takes_dict() => dict_path = Some(path),
                Some(("dict", _)) => {
                    return Err(BadAlgorithm::DictionaryNotTaken(name.to_string()));
                }
                _ => {
                    let known = if kind.takes_dict() {
                        "level=N, dict=PATH"
                    } else {
                        "level=N"
                    };
                    return Err(BadAlgorithm::UnknownParameter {
                        param: param.to_string(),
                        name: name.to_string(),
                        known,
                    });
                }
            }
        }
        #[cfg(feature = "zstd")]
        let dict = match dict_path {
            Some(path) => {
                let at = level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL);
                Some(Arc::new(Dictionary::load(std::path::Path::new(path), at)?))
            }
            None => None,
        };
        #[cfg(not(feature = "zstd"))]
        let _: Option<&str> = dict_path;
        Ok(Algorithm {
            kind,
            level,
            #[cfg(feature = "zstd")]
            dict,
        })
    }
}

/// zram's `page_same_filled()`: if every machine word of `page` is equal, that word.
pub fn same_filled(page: &[u8]) -> Option<u64> {
    let (words, rest) = page.as_chunks::<8>();
    if !rest.is_empty() || words.is_empty() {
        return None;
    }
    let first = words[0];
    // Checking the last word first rejects most pages after two loads, as zram does.
    if words[words.len() - 1] != first {
        return None;
    }
    words
        .iter()
        .all(|w| *w == first)
        .then(|| u64::from_ne_bytes(first))
}

/// Fills `page` with `word` repeated: the inverse of [`same_filled`].
pub fn fill_page(page: &mut [u8], word: u64) {
    for chunk in page.chunks_exact_mut(8) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compressor left out of the build is refused by name, with the feature that builds
    /// it; each one built parses by its name.
    #[test]
    fn built_compressors_parse_and_others_name_their_feature() {
        for (name, feature, built) in FEATURES {
            match name.parse::<Algorithm>() {
                Ok(a) => assert!(built && a.kind.name() == name),
                Err(e) => assert!(
                    !built && e.to_string().contains(&format!("cargo feature {feature}")),
                    "{e}"
                ),
            }
        }
        assert_eq!(
            Kind::ALL.len(),
            FEATURES.iter().filter(|(.., built)| *built).count()
        );
    }

    #[cfg(all(feature = "zstd", feature = "lzo"))]
    #[test]
    fn names_and_params_parse() {
        let a: Algorithm = "zstd:level=5".parse().unwrap();
        assert_eq!((a.kind, a.level), (Kind::Zstd, Some(5)));
        assert_eq!(a.to_string(), "zstd:level=5");
        assert_eq!("lzo-rle".parse::<Algorithm>().unwrap().kind, Kind::LzoRle);
        assert!(matches!(
            "lzma".parse::<Algorithm>(),
            Err(BadAlgorithm::Unknown { .. })
        ));
        assert!("lzo:level=3".parse::<Algorithm>().is_err());
        assert!("zstd:level=99".parse::<Algorithm>().is_err());
        assert!("zstd:window=3".parse::<Algorithm>().is_err());
    }

    #[test]
    fn same_filled_pages() {
        let mut page = vec![0u8; 4096];
        assert_eq!(same_filled(&page), Some(0));
        fill_page(&mut page, 0xdead_beef_0102_0304);
        assert_eq!(same_filled(&page), Some(0xdead_beef_0102_0304));
        page[4095] ^= 1;
        assert_eq!(same_filled(&page), None);
        page[4095] ^= 1;
        page[100] ^= 1;
        assert_eq!(same_filled(&page), None);
    }

    #[test]
    fn decompress_page_wants_a_whole_page() {
        for &kind in Kind::ALL {
            let mut c = Algorithm::new(kind).new_compressor();
            let mut buf = vec![0u8; worst_case_len(4096)];
            let page: Vec<u8> = (0..4096u32).map(|i| (i / 7 % 251) as u8).collect();
            let n = c.compress(&page, &mut buf).unwrap();
            let mut out = vec![0u8; 4096];
            c.decompress_page(&buf[..n], &mut out).unwrap();
            assert_eq!(out, page);
            // Half a page compressed, read back as a page: decoded, but short.
            let n = c.compress(&page[..2048], &mut buf).unwrap();
            let err = c.decompress_page(&buf[..n], &mut out).unwrap_err();
            assert!(
                matches!(
                    err,
                    CompressError::PageLength {
                        got: 2048,
                        page_size: 4096,
                        ..
                    }
                ),
                "{kind:?}: {err}"
            );
        }
    }
}
