//! liblzo2's LZO1X-1 encoder and safe decoder, the C reference that ztier's lzo is measured
//! against (benches) and must agree with (fuzzing). It links the system's liblzo2 (Debian's
//! liblzo2-dev, which scripts/setup.sh installs).
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_ulong, c_void};

/// The shape every liblzo2 codec call shares: (src, src_len, dst, in/out dst_len, wrkmem).
type LzoCall =
    unsafe extern "C" fn(*const u8, c_ulong, *mut u8, *mut c_ulong, *mut c_void) -> c_int;

#[link(name = "lzo2")]
extern "C" {
    fn lzo1x_1_compress(
        src: *const u8,
        len: c_ulong,
        dst: *mut u8,
        dst_len: *mut c_ulong,
        wrkmem: *mut c_void,
    ) -> c_int;
    fn lzo1x_decompress_safe(
        src: *const u8,
        len: c_ulong,
        dst: *mut u8,
        dst_len: *mut c_ulong,
        wrkmem: *mut c_void,
    ) -> c_int;
}

/// `LZO1X_1_MEM_COMPRESS`: 16384 dictionary entries of at most 8 bytes.
pub const WRKMEM: usize = 16384 * 8;

/// Runs `call` from `src` into `dst`; the output length, or `None` if it fails.
///
/// # Safety
/// `call` must read at most `src.len()` bytes of `src`, write at most `dst.len()` bytes of
/// `dst` (the length it is told), and find in `wrkmem` the work memory it needs.
unsafe fn run(call: LzoCall, src: &[u8], dst: &mut [u8], wrkmem: *mut c_void) -> Option<usize> {
    let mut out = dst.len() as c_ulong;
    // SAFETY: the caller's contract; the pointers come from live slices of those lengths.
    let r = unsafe {
        call(
            src.as_ptr(),
            src.len() as c_ulong,
            dst.as_mut_ptr(),
            &mut out,
            wrkmem,
        )
    };
    (r == 0).then_some(out as usize)
}

/// `lzo1x_1_compress()`; `None` if `dst` is below LZO's worst case for `src` or `wrkmem` is
/// below [`WRKMEM`].
pub fn compress(src: &[u8], dst: &mut [u8], wrkmem: &mut [u8]) -> Option<usize> {
    if dst.len() < src.len() + src.len() / 16 + 67 || wrkmem.len() < WRKMEM {
        return None;
    }
    // SAFETY: the encoder reads src and writes at most LZO's worst case for it, for which dst
    // has room; wrkmem has LZO1X_1_MEM_COMPRESS bytes (both checked above).
    unsafe { run(lzo1x_1_compress, src, dst, wrkmem.as_mut_ptr().cast()) }
}

/// `lzo1x_decompress_safe()`: the decoded length, or `None` for any error.
pub fn decompress_safe(src: &[u8], dst: &mut [u8]) -> Option<usize> {
    // SAFETY: the safe decoder reads at most src.len() bytes, writes at most the dst length
    // it is told, and needs no work memory.
    unsafe { run(lzo1x_decompress_safe, src, dst, std::ptr::null_mut()) }
}
