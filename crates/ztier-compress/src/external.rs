//! zstd, deflate and lz4hc through their reference libraries. Their sizes follow those
//! libraries, not the kernel's copies of them (which only lz4, lzo and lzo-rle are checked
//! against).

#[cfg(feature = "zstd")]
use std::sync::Arc;

#[cfg(feature = "zstd")]
use crate::dict::Dictionary;
use crate::{check_dst, CompressError, Compressor, Result};

fn library(algorithm: &'static str, message: impl ToString) -> CompressError {
    CompressError::Library {
        algorithm,
        message: message.to_string(),
    }
}

#[cfg(feature = "zstd")]
/// zstd with reusable contexts; zram's default level is 3. With a dictionary, every stream
/// of a device compresses and decompresses with the same prepared one.
pub struct Zstd {
    cctx: zstd::zstd_safe::CCtx<'static>,
    dctx: zstd::zstd_safe::DCtx<'static>,
    dict: Option<Arc<Dictionary>>,
}

#[cfg(feature = "zstd")]
impl Zstd {
    pub fn new(level: Option<i32>, dict: Option<Arc<Dictionary>>) -> Zstd {
        use zstd::zstd_safe::CParameter;
        let level = level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL);
        let mut cctx = zstd::zstd_safe::CCtx::create();
        // As the kernel's zstd backend: no checksum, no dictionary id; content size kept.
        // (With a dictionary, the prepared one's parameters apply, as in the kernel's
        // zstd_compress_using_cdict().) Setting valid parameters cannot fail.
        let _ = cctx.set_parameter(CParameter::CompressionLevel(level));
        let _ = cctx.set_parameter(CParameter::ChecksumFlag(false));
        let _ = cctx.set_parameter(CParameter::DictIdFlag(false));
        Zstd {
            cctx,
            dctx: zstd::zstd_safe::DCtx::create(),
            dict,
        }
    }
}

#[cfg(feature = "zstd")]
impl Compressor for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        let n = match &self.dict {
            Some(d) => self.cctx.compress_using_cdict(dst, src, &d.cdict),
            None => self.cctx.compress2(dst, src),
        };
        n.map_err(|code| library("zstd", zstd::zstd_safe::get_error_name(code)))
    }
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        let n = match &self.dict {
            Some(d) => self.dctx.decompress_using_ddict(dst, src, &d.ddict),
            None => self.dctx.decompress(dst, src),
        };
        n.map_err(|code| library("zstd", zstd::zstd_safe::get_error_name(code)))
    }
}

#[cfg(feature = "deflate")]
/// Raw deflate (no zlib header), as the kernel's deflate backend writes.
pub struct Deflate {
    comp: flate2::Compress,
    decomp: flate2::Decompress,
}

#[cfg(feature = "deflate")]
impl Deflate {
    pub fn new(level: Option<i32>) -> Deflate {
        let level = flate2::Compression::new(level.unwrap_or(6) as u32);
        Deflate {
            comp: flate2::Compress::new(level, false),
            decomp: flate2::Decompress::new(false),
        }
    }
}

#[cfg(feature = "deflate")]
impl Compressor for Deflate {
    fn name(&self) -> &'static str {
        "deflate"
    }
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        self.comp.reset();
        match self.comp.compress(src, dst, flate2::FlushCompress::Finish) {
            Ok(flate2::Status::StreamEnd) => Ok(self.comp.total_out() as usize),
            Ok(status) => Err(library(
                "deflate",
                format!("stream not finished: {status:?}"),
            )),
            Err(e) => Err(library("deflate", e)),
        }
    }
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        self.decomp.reset(false);
        match self
            .decomp
            .decompress(src, dst, flate2::FlushDecompress::Finish)
        {
            Ok(flate2::Status::StreamEnd) => Ok(self.decomp.total_out() as usize),
            Ok(_) => Err(CompressError::Corrupt {
                algorithm: "deflate",
                at: self.decomp.total_in() as usize,
                reason: "stream truncated or larger than the output",
            }),
            Err(e) => Err(library("deflate", e)),
        }
    }
}

#[cfg(feature = "lz4hc")]
/// lz4hc through liblz4 (the kernel's lz4hc is the same algorithm); level 9 by default.
pub struct Lz4hc {
    level: i32,
}

#[cfg(feature = "lz4hc")]
impl Lz4hc {
    pub fn new(level: Option<i32>) -> Lz4hc {
        Lz4hc {
            level: level.unwrap_or(9),
        }
    }
}

#[cfg(feature = "lz4hc")]
impl Compressor for Lz4hc {
    fn name(&self) -> &'static str {
        "lz4hc"
    }
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        crate::liblz4::compress_hc(src, dst, self.level)
            .ok_or_else(|| library("lz4hc", "compression failed"))
    }
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        crate::lz4::decompress(src, dst)
    }
}
