//! LZ4 as the kernel's `lib/lz4/lz4_compress.c` writes it, and a block decoder in liblz4's
//! shape (its speed beside liblz4's is in docs/diary.md).
//!
//! The kernel's LZ4 is the 1.8-era `LZ4_compress_generic()`. For inputs under 64 KiB it keeps
//! 16-bit positions in an 8192-entry table (`byU16`, hash log 13), its match search skips
//! ahead by `searchMatchNb++ >> 6` steps, and after each match it inserts `ip - 2` and tests
//! `ip` once more before searching again. liblz4 1.9 and lz4_flex differ in these details, so
//! their sizes differ from the kernel's by a few bytes on most pages; this port follows the
//! kernel's choices one for one. The output is a standard LZ4 block: any decoder reads it.
//!
//! Block format (one sequence):
//! ```text
//!  token: [lit len 4 bits | match len - 4, 4 bits]  (15 = more length bytes follow, 255 = more)
//!  [lit len bytes...] [literals] [offset u16 LE] [match len bytes...]
//! ```
//! The last sequence has literals only; the last 5 bytes are always literals and no match
//! starts in the last 12.
//!
//! The decoder is liblz4's design: a fast loop while the output has 64 bytes to spare, with
//! fixed-size "wild" copies checked once per sequence (its copies are this crate's only
//! unsafe code outside the FFI), and a tail that checks every step. It accepts any block
//! liblz4 accepts except one with a zero offset, and decodes it to the same bytes (fuzzed);
//! it is more lenient than liblz4 only about the end-of-block rules above.

use crate::copy::{copy_literals, copy_match, copy_near_match, read32, read64};
use crate::{check_dst, CompressError, Compressor, Result};

const MINMATCH: usize = 4;
/// No match may start within this many bytes of the end (`MFLIMIT`).
const MFLIMIT: usize = 12;
/// The last bytes are always literals (`LASTLITERALS`).
const LASTLITERALS: usize = 5;
const ML_MASK: usize = 15;
const RUN_MASK: usize = 15;
const MAX_DISTANCE: usize = 65535;
const SKIP_TRIGGER: u32 = 6;
/// byU16 table: hash log `LZ4_HASHLOG + 1` = 13 for the kernel's `LZ4_MEMORY_USAGE` 14.
const HASH_LOG: u32 = 13;
const TABLE_SIZE: usize = 1 << HASH_LOG;
/// Inputs from this size on need the byU32 table, which this port does not implement.
pub const MAX_INPUT: usize = 64 * 1024 + MFLIMIT - 1 - 1;

/// One kernel-LZ4 stream: the position table, reused for every page.
pub struct Lz4 {
    table: Box<[u16; TABLE_SIZE]>,
    acceleration: u32,
}

impl Lz4 {
    /// `acceleration` as `LZ4_compress_fast()` takes it (zram's lz4 `level`); 1 is the default.
    pub fn new(acceleration: i32) -> Lz4 {
        Lz4 {
            table: Box::new([0; TABLE_SIZE]),
            acceleration: acceleration.max(1) as u32,
        }
    }
}

impl Compressor for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        if src.len() > MAX_INPUT {
            return Err(CompressError::InputTooLarge {
                algorithm: "lz4",
                len: src.len(),
                max: MAX_INPUT,
            });
        }
        Ok(compress_u16(src, dst, &mut self.table, self.acceleration))
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        decompress(src, dst)
    }
}

#[inline(always)]
fn hash(seq: u32) -> usize {
    (seq.wrapping_mul(2_654_435_761) >> (32 - HASH_LOG)) as usize
}

/// `LZ4_count()`: equal bytes at `a` and `b`, with `a` stopping at `limit`; `b < a`,
/// `limit <= s.len()`.
#[allow(unsafe_code)]
#[inline(always)]
fn count(s: &[u8], mut a: usize, mut b: usize, limit: usize) -> usize {
    debug_assert!(b < a && limit <= s.len());
    let start = a;
    while a + 8 <= limit {
        // SAFETY: b + 8 < a + 8 <= limit <= s.len().
        let x = unsafe { read64(s, a) ^ read64(s, b) };
        if x != 0 {
            return a - start + (x.trailing_zeros() / 8) as usize;
        }
        a += 8;
        b += 8;
    }
    while a < limit && s[a] == s[b] {
        a += 1;
        b += 1;
    }
    a - start
}

/// Writes a literal or match length's continuation bytes (`len` already minus 15).
#[inline(always)]
fn put_length(dst: &mut [u8], mut op: usize, mut len: usize) -> usize {
    while len >= 255 {
        dst[op] = 255;
        op += 1;
        len -= 255;
    }
    dst[op] = len as u8;
    op + 1
}

/// `LZ4_compress_generic(..., noLimit, byU16, noDict, noDictIssue, acceleration)`.
///
/// Every read of 4 input bytes is at a position at most `mflimit + 1 = n - 11`: `ip` and
/// `forward_ip` are checked against `mflimit` before they are read at (or are 0 and 1 with
/// `n > MFLIMIT`), and table entries are positions stored from those or 0.
#[allow(unsafe_code)]
fn compress_u16(
    src: &[u8],
    dst: &mut [u8],
    table: &mut [u16; TABLE_SIZE],
    acceleration: u32,
) -> usize {
    table.fill(0);
    let n = src.len();
    let mut op = 0;
    let mut anchor = 0;

    // Inputs shorter than LZ4_minLength (MFLIMIT + 1) are all literals.
    if n > MFLIMIT {
        let mflimit = n - MFLIMIT;
        let matchlimit = n - LASTLITERALS;
        // Every read32 below is at most at n - 11 (the fn's header).
        // SAFETY: 0 + 4 <= n, as n > MFLIMIT.
        table[hash(unsafe { read32(src, 0) })] = 0;
        let mut ip = 1;
        // SAFETY: 1 + 4 <= n, as n > MFLIMIT.
        let mut forward_h = hash(unsafe { read32(src, ip) });

        'sequences: loop {
            // Find a match, skipping faster the longer none is found.
            let mut m;
            {
                let mut forward_ip = ip;
                let mut step = 1;
                let mut search_match_nb = acceleration << SKIP_TRIGGER;
                loop {
                    let h = forward_h;
                    ip = forward_ip;
                    forward_ip += step;
                    step = (search_match_nb >> SKIP_TRIGGER) as usize;
                    search_match_nb += 1;
                    if forward_ip > mflimit {
                        break 'sequences;
                    }
                    m = table[h] as usize;
                    // SAFETY: forward_ip <= mflimit, checked above.
                    forward_h = hash(unsafe { read32(src, forward_ip) });
                    table[h] = ip as u16;
                    // SAFETY: ip was a forward_ip checked against mflimit; m is a position
                    // stored from such an ip, or 0.
                    if unsafe { read32(src, m) == read32(src, ip) } {
                        break;
                    }
                }
            }

            // Catch up: extend the match backwards over equal literals.
            while ip > anchor && m > 0 && src[ip - 1] == src[m - 1] {
                ip -= 1;
                m -= 1;
            }

            // Literals.
            let lit = ip - anchor;
            let mut token = op;
            op += 1;
            if lit >= RUN_MASK {
                dst[token] = (RUN_MASK << 4) as u8;
                op = put_length(dst, op, lit - RUN_MASK);
            } else {
                dst[token] = (lit << 4) as u8;
            }
            copy_literals(dst, op, src, anchor, lit);
            op += lit;

            loop {
                // Offset and match length.
                dst[op..op + 2].copy_from_slice(&((ip - m) as u16).to_le_bytes());
                op += 2;
                let mut match_code = count(src, ip + MINMATCH, m + MINMATCH, matchlimit);
                ip += MINMATCH + match_code;
                if match_code >= ML_MASK {
                    dst[token] += ML_MASK as u8;
                    match_code -= ML_MASK;
                    op = put_length(dst, op, match_code);
                } else {
                    dst[token] += match_code as u8;
                }
                anchor = ip;

                if ip > mflimit {
                    break 'sequences;
                }
                // Fill the table, then test the next position for an immediate match.
                // SAFETY: ip - 2 < ip <= mflimit, checked above.
                table[hash(unsafe { read32(src, ip - 2) })] = (ip - 2) as u16;
                // SAFETY: ip <= mflimit, checked above.
                let h = hash(unsafe { read32(src, ip) });
                m = table[h] as usize;
                table[h] = ip as u16;
                // SAFETY: ip <= mflimit; m is a position stored from an earlier ip, or 0.
                if m + MAX_DISTANCE >= ip && unsafe { read32(src, m) == read32(src, ip) } {
                    token = op;
                    op += 1;
                    dst[token] = 0;
                    continue;
                }
                break;
            }
            ip += 1;
            // SAFETY: ip <= mflimit + 1 = n - 11, as the loop above left with ip <= mflimit.
            forward_h = hash(unsafe { read32(src, ip) });
        }
    }

    // Last literals.
    let last_run = n - anchor;
    if last_run >= RUN_MASK {
        dst[op] = (RUN_MASK << 4) as u8;
        op = put_length(dst, op + 1, last_run - RUN_MASK);
    } else {
        dst[op] = (last_run << 4) as u8;
        op += 1;
    }
    dst[op..op + last_run].copy_from_slice(&src[anchor..]);
    op + last_run
}

fn corrupt(at: usize, reason: &'static str) -> CompressError {
    CompressError::Corrupt {
        algorithm: "lz4",
        at,
        reason,
    }
}

/// Reads a length's continuation bytes; `None` where the block ends inside them.
#[inline(always)]
fn read_length(src: &[u8], ip: &mut usize, mut len: usize) -> Option<usize> {
    loop {
        let b = *src.get(*ip)?;
        *ip += 1;
        len += b as usize;
        if b != 255 {
            return Some(len);
        }
    }
}

/// Decodes an LZ4 block into `dst`; returns the decoded length.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize> {
    let (ip, op) = decompress_fast(src, dst);
    decompress_tail(src, dst, ip, op)
}

/// Room the fast loop keeps after `op`, so that every copy of a sequence it starts, rounded
/// up to whole 16- or 32-byte steps, stays inside `dst` (as liblz4's `FASTLOOP_SAFE_DISTANCE`;
/// 32 would do, and measured no faster: the tail is a small part of a page).
const FAST_ROOM: usize = 64;

/// Decodes whole sequences while the output has `FAST_ROOM` bytes to spare, in liblz4's
/// shape: short literal runs are one 16-byte copy, short matches at distance 8 or more three
/// 8-byte copies, and only long runs loop. Returns where it stopped: at the first sequence
/// it could not finish within those bounds, which `decompress_tail` then decodes checking
/// every step.
///
/// The copies use raw pointers. Each sequence is checked, before any byte is copied, to
/// read only `src[ip..]` and write only `dst[..]` with the wild-copy overshoot included; a
/// bounds check per copy costs as much again as the copies themselves (docs/diary.md).
#[allow(unsafe_code)]
fn decompress_fast(src: &[u8], dst: &mut [u8]) -> (usize, usize) {
    let src_len = src.len();
    let Some(dst_limit) = dst.len().checked_sub(FAST_ROOM) else {
        return (0, 0);
    };
    if src_len == 0 {
        return (0, 0);
    }
    let s = src.as_ptr();
    let d = dst.as_mut_ptr();
    let (mut ip, mut op) = (0usize, 0usize);
    // Invariants at the top of the loop: op <= dst_limit, and ip < src_len (the next token
    // is in `src`): a short literal run checks p + 18 <= src_len and a long one
    // p + lit + 32 <= src_len, both past the offset; a long match length checks it itself.
    loop {
        // SAFETY: ip < src_len by the invariant.
        let token = unsafe { *s.add(ip) } as usize;
        let mut p = ip + 1;
        let mut lit = token >> 4;
        if lit != RUN_MASK {
            // 14 literals at most, the offset, and a byte past it.
            if p + 16 + 2 > src_len {
                break;
            }
            // SAFETY: src[p..p + 16] is checked just above; dst[op..op + 16] lies within
            // the FAST_ROOM the invariant keeps; src and dst are distinct slices.
            unsafe { copy_bytes::<16>(s.add(p), d.add(op)) };
        } else {
            let Some(len) = read_length(src, &mut p, lit) else {
                break;
            };
            lit = len;
            if lit > src_len || p + lit + 32 > src_len || op + lit + 32 > dst_limit + FAST_ROOM {
                break;
            }
            // SAFETY: checked just above: src[p..p + lit + 32] and dst[op..op + lit + 32]
            // are in bounds, and wild_copy32 touches at most lit + 31 bytes of each.
            unsafe { wild_copy32(s.add(p), d.add(op), lit) };
        }
        let q = p + lit;
        // SAFETY: q + 2 <= src_len: a short run checked p + 18 <= src_len with lit <= 14,
        // a long one p + lit + 32 <= src_len.
        let offset = unsafe { u16::from_le_bytes(s.add(q).cast::<[u8; 2]>().read()) } as usize;
        let o = op + lit;
        let mut r = q + 2;
        let mut ml = token & ML_MASK;
        // 1 <= offset <= o, in one compare.
        let offset_valid = offset.wrapping_sub(1) < o;
        if ml != ML_MASK {
            ml += MINMATCH;
            if o + ml > dst_limit {
                break;
            }
            if offset >= 8 && offset_valid {
                // SAFETY: reads o - offset..o - offset + 24 <= o + 16 (offset >= 8, and
                // offset <= o), writes o..o + 18 < o + ml + FAST_ROOM <= dst.len(); each
                // 8-byte step reads only bytes already final because offset >= 8.
                unsafe {
                    let from = d.add(o - offset);
                    let to = d.add(o);
                    copy_bytes::<8>(from, to);
                    copy_bytes::<8>(from.add(8), to.add(8));
                    copy_bytes::<2>(from.add(16), to.add(16));
                }
                ip = r;
                op = o + ml;
                continue;
            }
        } else {
            let Some(len) = read_length(src, &mut r, ml) else {
                break;
            };
            // A block never ends in a match; one that does is for the tail to report.
            if r >= src_len {
                break;
            }
            ml = len + MINMATCH;
            if ml > dst_limit || o + ml > dst_limit {
                break;
            }
        }
        if !offset_valid {
            break;
        }
        // From here dst[o - offset..o + ml + FAST_ROOM] is in bounds, which covers every
        // match copy below (each runs at most 31 bytes past its end) and keeps the
        // invariant for the next sequence.
        if offset >= 16 {
            // SAFETY: reads from o - offset on, writes o..o + ml + 31, in bounds by the
            // above; offset >= 16 keeps each 16-byte load behind what is already written.
            unsafe { wild_copy32(d.add(o - offset), d.add(o), ml) };
        } else {
            // SAFETY: 1 <= offset <= o, writes o..o + ml + 15, in bounds by the above.
            unsafe { copy_near_match(d.add(o), offset, ml) };
        }
        ip = r;
        op = o + ml;
    }
    (ip, op)
}

/// Copies `N` bytes; `from` and `to` are valid for `N` bytes. The value is loaded whole
/// before it is stored, so `to` may overlap `from`: it then gets what `from` held before.
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn copy_bytes<const N: usize>(from: *const u8, to: *mut u8) {
    // SAFETY: the caller's contract.
    unsafe {
        to.cast::<[u8; N]>()
            .write_unaligned(from.cast::<[u8; N]>().read_unaligned())
    }
}

/// Copies `len` bytes in 32-byte steps, writing up to 31 bytes beyond: liblz4's
/// `LZ4_wildCopy32`. `len >= 1`; `from` and `to` are valid for `len + 31` bytes, and either in different
/// buffers or `to - from >= 16`.
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn wild_copy32(from: *const u8, to: *mut u8, len: usize) {
    let mut k = 0;
    loop {
        // SAFETY: k < max(len, 1), so k + 32 <= len + 31: inside the caller's bounds.
        unsafe {
            copy_bytes::<16>(from.add(k), to.add(k));
            copy_bytes::<16>(from.add(k + 16), to.add(k + 16));
        }
        k += 32;
        if k >= len {
            break;
        }
    }
}

/// Decodes sequences from `ip` on, writing from `op` on, checking every step, to the end of
/// the block.
#[inline(never)]
fn decompress_tail(src: &[u8], dst: &mut [u8], mut ip: usize, mut op: usize) -> Result<usize> {
    let capacity = dst.len();
    let overrun = || CompressError::OutputOverrun {
        algorithm: "lz4",
        capacity,
    };
    loop {
        let token = *src
            .get(ip)
            .ok_or_else(|| corrupt(ip, "truncated: no token"))? as usize;
        ip += 1;
        let mut lit = token >> 4;
        if lit == RUN_MASK {
            lit = read_length(src, &mut ip, lit).ok_or_else(|| corrupt(ip, "truncated length"))?;
        }
        let lit_end = ip.checked_add(lit).filter(|&e| e <= src.len());
        let lit_end = lit_end.ok_or_else(|| corrupt(ip, "literals run past the input"))?;
        if op + lit > dst.len() {
            return Err(overrun());
        }
        copy_literals(dst, op, src, ip, lit);
        ip = lit_end;
        op += lit;
        if ip == src.len() {
            return Ok(op);
        }

        let offset_bytes = src
            .get(ip..ip + 2)
            .ok_or_else(|| corrupt(ip, "truncated offset"))?;
        let offset = u16::from_le_bytes([offset_bytes[0], offset_bytes[1]]) as usize;
        if offset == 0 || offset > op {
            return Err(corrupt(ip, "match offset outside the output"));
        }
        ip += 2;
        let mut len = token & ML_MASK;
        if len == ML_MASK {
            len = read_length(src, &mut ip, len).ok_or_else(|| corrupt(ip, "truncated length"))?;
        }
        len += MINMATCH;
        if op + len > dst.len() {
            return Err(overrun());
        }
        copy_match(dst, op, offset, len);
        op += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(data: &[u8]) -> usize {
        let mut c = Lz4::new(1);
        let mut comp = vec![0; crate::worst_case_len(data.len())];
        let n = c.compress(data, &mut comp).unwrap();
        let mut out = vec![0; data.len()];
        assert_eq!(c.decompress(&comp[..n], &mut out).unwrap(), data.len());
        assert_eq!(out, data);
        n
    }

    #[test]
    fn round_trips() {
        round_trip(&[]);
        round_trip(b"a");
        round_trip(b"abcdefghijkl");
        round_trip(&[0; 4096]);
        let text: Vec<u8> = b"the quick brown fox "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        assert!(round_trip(&text) < 100);
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        round_trip(&noise);
    }

    #[test]
    fn rejects_corrupt_input() {
        let mut out = [0u8; 64];
        assert!(decompress(&[], &mut out).is_err());
        assert!(decompress(&[0xf0], &mut out).is_err());
        assert!(
            decompress(&[0x10, b'a', 5, 0], &mut out).is_err(),
            "offset beyond output"
        );
        assert!(
            decompress(&[0x10, b'a', 0, 0], &mut out).is_err(),
            "offset 0"
        );
        assert!(decompress(&[0x1f, b'a', 1, 0, 255, 255], &mut out).is_err());
        assert!(decompress(&[0xf0, 255, 255], &mut out).is_err());
    }
}
