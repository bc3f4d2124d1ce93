//! zstd, deflate and lz4hc through their reference libraries. Their sizes follow those
//! libraries, not the kernel's copies of them (which only lz4, lzo and lzo-rle are checked
//! against).

use crate::{check_dst, CompressError, Compressor, Result};

fn library(algorithm: &'static str, message: impl ToString) -> CompressError {
    CompressError::Library {
        algorithm,
        message: message.to_string(),
    }
}

/// zstd with reusable contexts; zram's default level is 3.
pub struct Zstd {
    cctx: zstd::bulk::Compressor<'static>,
    dctx: zstd::bulk::Decompressor<'static>,
}

impl Zstd {
    pub fn new(level: Option<i32>) -> Zstd {
        let level = level.unwrap_or(zstd::DEFAULT_COMPRESSION_LEVEL);
        let mut cctx = zstd::bulk::Compressor::new(level).expect("zstd context");
        // As the kernel's zstd backend: no checksum, no dictionary id; content size kept.
        let _ = cctx.include_checksum(false);
        let _ = cctx.include_dictid(false);
        Zstd {
            cctx,
            dctx: zstd::bulk::Decompressor::new().expect("zstd context"),
        }
    }
}

impl Compressor for Zstd {
    fn name(&self) -> &'static str {
        "zstd"
    }
    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        self.cctx
            .compress_to_buffer(src, dst)
            .map_err(|e| library("zstd", e))
    }
    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        self.dctx
            .decompress_to_buffer(src, dst)
            .map_err(|e| library("zstd", e))
    }
}

/// Raw deflate (no zlib header), as the kernel's deflate backend writes.
pub struct Deflate {
    comp: flate2::Compress,
    decomp: flate2::Decompress,
}

impl Deflate {
    pub fn new(level: Option<i32>) -> Deflate {
        let level = flate2::Compression::new(level.unwrap_or(6) as u32);
        Deflate {
            comp: flate2::Compress::new(level, false),
            decomp: flate2::Decompress::new(false),
        }
    }
}

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

/// lz4hc through liblz4 (the kernel's lz4hc is the same algorithm); level 9 by default.
pub struct Lz4hc {
    level: i32,
}

impl Lz4hc {
    pub fn new(level: Option<i32>) -> Lz4hc {
        Lz4hc {
            level: level.unwrap_or(9),
        }
    }
}

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
