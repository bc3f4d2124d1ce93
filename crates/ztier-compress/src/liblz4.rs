//! liblz4 itself, through lz4-sys: lz4hc for users, and for tests and benches the reference
//! encoder and decoder that ztier's kernel-variant LZ4 must interoperate with and be measured
//! against. The FFI calls are sealed here; the crate's other `unsafe` (the LZ4 decoder's fast
//! loop, the compressors' word reads) is listed in the crate's header.
#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int};

fn as_c_len(len: usize) -> Option<c_int> {
    c_int::try_from(len).ok()
}

/// `LZ4_compress_HC()`; `None` if it fails (dst too small, input too large).
pub fn compress_hc(src: &[u8], dst: &mut [u8], level: i32) -> Option<usize> {
    let (n, cap) = (as_c_len(src.len())?, as_c_len(dst.len())?);
    // SAFETY: src and dst are valid for n and cap bytes; liblz4 writes at most cap bytes
    // into dst and reads exactly n bytes of src.
    let r = unsafe {
        lz4_sys::LZ4_compress_HC(
            src.as_ptr().cast::<c_char>(),
            dst.as_mut_ptr().cast::<c_char>(),
            n,
            cap,
            level,
        )
    };
    (r > 0).then_some(r as usize)
}

/// `LZ4_compress_default()` of liblz4 (not the kernel's variant).
pub fn compress_default(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let (n, cap) = (as_c_len(src.len())?, as_c_len(dst.len())?);
    // SAFETY: as in compress_hc.
    let r = unsafe {
        lz4_sys::LZ4_compress_default(
            src.as_ptr().cast::<c_char>(),
            dst.as_mut_ptr().cast::<c_char>(),
            n,
            cap,
        )
    };
    (r > 0).then_some(r as usize)
}

/// `LZ4_decompress_safe()`: liblz4's bounds-checked decoder; `None` on corrupt input.
pub fn decompress_safe(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    let (n, cap) = (as_c_len(src.len())?, as_c_len(dst.len())?);
    // SAFETY: LZ4_decompress_safe reads at most n bytes of src and writes at most cap bytes
    // of dst, whatever src contains.
    let r = unsafe {
        lz4_sys::LZ4_decompress_safe(
            src.as_ptr().cast::<c_char>(),
            dst.as_mut_ptr().cast::<c_char>(),
            n,
            cap,
        )
    };
    (r >= 0).then_some(r as usize)
}
