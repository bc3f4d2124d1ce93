//! LZO1X-1 and lzo-rle as the kernel's `lib/lzo` writes them (x86_64/arm64 build:
//! `LZO_USE_CTZ64`, `LZO_FAST_64BIT_MEMORY_ACCESS`), and a safe decompressor for both.
//!
//! Stream format (`Documentation/staging/lzo.rst`): a sequence of instructions, each a match
//! copy followed by 0..3 literals carried in the low bits of its last offset byte ("state"),
//! or a literal run. By first byte:
//! ```text
//!  0..15   literal run (state 0), or a 2/3-byte match M1 (state 1..4)
//!  16..31  M4: far match (16 KiB..48 KiB back) or, lzo-rle only, a zero run; 17 0 0 = end
//!  32..63  M3: match up to 16 KiB back
//!  64..255 M2: match of 3..8 bytes up to 2 KiB back
//! ```
//! lzo-rle streams start with `17, 1` (a first byte of 17 never starts a plain LZO1X stream
//! of non-empty input) and encode a run of 4..2051 zero bytes as the 4-byte M4 form
//! `0001 1LLL, 1111 11SS, 1111 1111, LLLL LLLL` that a plain stream never uses.
//!
//! The compressor's quirks that decide the exact output, kept here: a 13-bit hash of the next
//! 4 bytes into 16-bit positions; literal runs skip ahead by `1 + (run >> 5)`; match lengths
//! are extended 8 bytes at a time and stop at `ip_end` (20 bytes before the end) on an 8-byte
//! step; a zero run is tested before the hash and leaves the dictionary untouched.

use crate::copy::{copy_literals, copy_match, read32, read64};
use crate::{check_dst, CompressError, Compressor, Result};

const M2_MAX_LEN: usize = 8;
const M3_MAX_LEN: usize = 33;
const M4_MAX_LEN: usize = 9;
const M2_MAX_OFFSET: usize = 0x0800;
const M3_MAX_OFFSET: usize = 0x4000;
const M4_MAX_OFFSET_V0: usize = 0xbfff;
const M4_MAX_OFFSET_V1: usize = 0xbffe;
const M3_MARKER: u8 = 32;
const M4_MARKER: u8 = 16;
const MIN_ZERO_RUN_LENGTH: usize = 4;
const MAX_ZERO_RUN_LENGTH: usize = 2047 + MIN_ZERO_RUN_LENGTH;
const D_BITS: u32 = 13;
const D_SIZE: usize = 1 << D_BITS;
const D_MASK: usize = D_SIZE - 1;
/// lzo-rle's bitstream version, written after the leading 17.
const LZO_RLE_VERSION: u8 = 1;

/// One LZO1X-1 stream (plain or lzo-rle): the dictionary, reused for every page.
pub struct Lzo {
    dict: Box<[u16; D_SIZE]>,
    rle: bool,
}

impl Lzo {
    pub fn new(rle: bool) -> Lzo {
        Lzo {
            dict: Box::new([0; D_SIZE]),
            rle,
        }
    }
}

impl Compressor for Lzo {
    fn name(&self) -> &'static str {
        if self.rle {
            "lzo-rle"
        } else {
            "lzo"
        }
    }

    fn compress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        check_dst(src, dst)?;
        Ok(if self.rle {
            compress::<true>(src, dst, &mut self.dict)
        } else {
            compress::<false>(src, dst, &mut self.dict)
        })
    }

    fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<usize> {
        decompress(src, dst)
    }
}

/// Writes a length's zero bytes and remainder (the `tt > 255` loops).
#[inline(always)]
fn put_zero_extended(dst: &mut [u8], op: &mut usize, mut len: usize) {
    while len > 255 {
        len -= 255;
        dst[*op] = 0;
        *op += 1;
    }
    dst[*op] = len as u8;
    *op += 1;
}

/// Where the state bits of the previous instruction live: `op + state_offset`.
struct Out<'a> {
    dst: &'a mut [u8],
    op: usize,
    state_offset: isize,
}

impl Out<'_> {
    #[inline(always)]
    fn or_state(&mut self, t: usize) {
        let at = (self.op as isize + self.state_offset) as usize;
        self.dst[at] |= t as u8;
    }

    #[inline(always)]
    fn push(&mut self, b: u8) {
        self.dst[self.op] = b;
        self.op += 1;
    }

    #[inline(always)]
    fn copy(&mut self, bytes: &[u8]) {
        self.dst[self.op..self.op + bytes.len()].copy_from_slice(bytes);
        self.op += bytes.len();
    }

    #[inline(always)]
    fn copy_from(&mut self, src: &[u8], start: usize, end: usize) {
        copy_literals(self.dst, self.op, src, start, end - start);
        self.op += end - start;
    }

    /// The literal run `src[start..end]` (non-empty) after an instruction.
    #[inline(always)]
    fn literals(&mut self, src: &[u8], start: usize, end: usize) {
        let t = end - start;
        if t <= 3 {
            self.or_state(t);
        } else if t <= 18 {
            self.push((t - 3) as u8);
        } else {
            self.push(0);
            let mut op = self.op;
            put_zero_extended(self.dst, &mut op, t - 18);
            self.op = op;
        }
        self.copy_from(src, start, end);
    }
}

/// `lzogeneric1x_1_compress()`; `RLE` selects lzo-rle (a constant, so that the hot loop
/// carries no flag).
fn compress<const RLE: bool>(src: &[u8], dst: &mut [u8], dict: &mut [u16; D_SIZE]) -> usize {
    let mut out = Out {
        dst,
        op: 0,
        state_offset: -2,
    };
    let m4_max_offset = if RLE {
        out.push(17);
        out.push(LZO_RLE_VERSION);
        M4_MAX_OFFSET_V1
    } else {
        M4_MAX_OFFSET_V0
    };
    let data_start = out.op;
    let mut ip = 0;
    let mut l = src.len();
    let mut t = 0;
    while l > 20 {
        let ll = l.min(m4_max_offset + 1);
        dict.fill(0);
        // The chunk's input ends where the slice ends, so bounds follow from `ip < ip_end`.
        t = compress_chunk::<RLE>(&src[..ip + ll], ip, &mut out, t, dict);
        ip += ll;
        l -= ll;
    }
    t += l;

    if t > 0 {
        let ii = src.len() - t;
        if out.op == data_start && t <= 238 {
            out.push((17 + t) as u8);
            out.copy_from(src, ii, src.len());
        } else {
            out.literals(src, ii, src.len());
        }
    }
    out.push(M4_MARKER | 1);
    out.push(0);
    out.push(0);
    out.op
}

/// `lzo1x_1_do_compress()` over `src[base..]`, with `ti` literals pending from the previous
/// chunk; returns the literals left pending at its end.
///
/// Reads stay below `in_end - 4`: `ip < ip_end = in_end - 20` wherever it is read at,
/// dictionary entries are earlier such positions (or `base`), and the match-length loop reads
/// 8 bytes at `ip + m_len` only after `ip + m_len - 8 < ip_end`.
#[allow(unsafe_code)]
fn compress_chunk<const RLE: bool>(
    src: &[u8],
    base: usize,
    out: &mut Out,
    ti: usize,
    dict: &mut [u16; D_SIZE],
) -> usize {
    let in_end = src.len();
    let ip_end = in_end - 20;
    let mut ti = ti;
    let mut ip = base + 4usize.saturating_sub(ti);
    let mut ii = base;

    'literal: loop {
        ip += 1 + ((ip - ii) >> 5);
        loop {
            // next:
            if ip >= ip_end {
                break 'literal;
            }
            // SAFETY: ip < ip_end, see above.
            let dv = unsafe { read32(src, ip) };
            let mut m_pos = 0;
            let mut run_length = 0;
            if RLE && dv == 0 {
                let limit = ip_end.min(ip + MAX_ZERO_RUN_LENGTH + 1);
                let mut ir = ip + 4;
                while ir < limit && src[ir] == 0 {
                    ir += 1;
                }
                run_length = (ir - ip).min(MAX_ZERO_RUN_LENGTH);
            } else {
                let h = ((dv.wrapping_mul(0x1824_429d) >> (32 - D_BITS)) as usize) & D_MASK;
                m_pos = base + dict[h] as usize;
                dict[h] = (ip - base) as u16;
                // SAFETY: m_pos is an earlier ip, or base.
                if dv != unsafe { read32(src, m_pos) } {
                    continue 'literal;
                }
            }

            ii -= ti;
            ti = 0;
            if ip != ii {
                out.literals(src, ii, ip);
            }

            if run_length != 0 {
                ip += run_length;
                let rl = (run_length - MIN_ZERO_RUN_LENGTH) as u32;
                out.copy(&((rl << 21) | 0xfffc18 | (rl & 7)).to_le_bytes());
                out.state_offset = -3;
                ii = ip;
                continue;
            }

            let mut m_len = 4;
            // SAFETY: m_pos < ip < ip_end and m_len = 4: the 8 bytes end before in_end - 8.
            let mut v = unsafe { read64(src, ip + m_len) ^ read64(src, m_pos + m_len) };
            let mut capped = false;
            if v == 0 {
                loop {
                    m_len += 8;
                    // SAFETY: ip + m_len - 8 < ip_end (checked on the round before), so the 8
                    // bytes end before in_end - 4 (the fn's header).
                    v = unsafe { read64(src, ip + m_len) ^ read64(src, m_pos + m_len) };
                    if ip + m_len >= ip_end {
                        capped = true;
                        break;
                    }
                    if v != 0 {
                        break;
                    }
                }
            }
            if !capped {
                m_len += (v.trailing_zeros() / 8) as usize;
            }

            let mut m_off = ip - m_pos;
            ip += m_len;
            if m_len <= M2_MAX_LEN && m_off <= M2_MAX_OFFSET {
                m_off -= 1;
                out.push((((m_len - 1) << 5) | ((m_off & 7) << 2)) as u8);
                out.push((m_off >> 3) as u8);
            } else {
                let (first, max_len) = if m_off <= M3_MAX_OFFSET {
                    m_off -= 1;
                    (M3_MARKER, M3_MAX_LEN)
                } else {
                    m_off -= 0x4000;
                    (M4_MARKER | ((m_off >> 11) & 8) as u8, M4_MAX_LEN)
                };
                if m_len <= max_len {
                    out.push(first | (m_len - 2) as u8);
                } else {
                    out.push(first);
                    let mut op = out.op;
                    put_zero_extended(out.dst, &mut op, m_len - max_len);
                    out.op = op;
                }
                out.push((m_off << 2) as u8);
                out.push((m_off >> 6) as u8);
            }
            out.state_offset = -2;
            ii = ip;
        }
    }
    in_end - (ii - ti)
}

fn corrupt(at: usize, reason: &'static str) -> CompressError {
    CompressError::Corrupt {
        algorithm: "lzo",
        at,
        reason,
    }
}

/// Reads the zero bytes and final byte of an extended length (`MAX_255_COUNT` guarded).
#[inline(always)]
fn read_zero_extended(src: &[u8], ip: &mut usize, base: usize) -> Result<usize> {
    let start = *ip;
    while *src
        .get(*ip)
        .ok_or_else(|| corrupt(*ip, "truncated length"))?
        == 0
    {
        *ip += 1;
    }
    let zeros = *ip - start;
    if zeros > usize::MAX / 255 - 2 {
        return Err(corrupt(*ip, "length overflows"));
    }
    let last = src[*ip] as usize;
    *ip += 1;
    Ok(zeros * 255 + base + last)
}

fn le16(src: &[u8], ip: usize) -> Result<usize> {
    src.get(ip..ip + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
        .ok_or_else(|| corrupt(ip, "truncated instruction"))
}

fn byte(src: &[u8], ip: usize) -> Result<usize> {
    src.get(ip)
        .map(|&b| b as usize)
        .ok_or_else(|| corrupt(ip, "truncated instruction"))
}

/// `lzo1x_decompress_safe()`: decodes an LZO1X or lzo-rle stream into `dst`; returns the
/// decoded length. Corrupt, truncated or trailing input is an error.
///
/// As the kernel's decoder does, the 0..3 literals after a match are copied as four bytes
/// when input and output have the room, and the bytes past them are overwritten by what
/// follows; bytes of `dst` past the returned length may so have been written.
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize> {
    if src.len() < 3 {
        return Err(corrupt(0, "input shorter than the end marker"));
    }
    let mut ip = 0;
    let mut op = 0;
    let rle = if src.len() >= 5 && src[0] == 17 {
        ip = 2;
        src[1] != 0
    } else {
        false
    };

    // State: 0 after a match with no literals (or at the start), 1..3 after a match and that
    // many literals, 4 after a literal run. It decides what an instruction below 16 means.
    let first = byte(src, ip)?;
    let mut state = if first > 17 {
        // A literal run (or 0..3 literals) with no instruction before it.
        ip += 1;
        let t = first - 17;
        literals(src, &mut ip, dst, &mut op, t)?;
        if t < 4 {
            t
        } else {
            4
        }
    } else {
        0
    };

    loop {
        let at = ip;
        let mut t = byte(src, ip)?;
        ip += 1;
        // (distance back from op, bytes to copy, literals after)
        let (dist, len, trailing);
        if t < 16 {
            if state == 0 {
                if t == 0 {
                    t = read_zero_extended(src, &mut ip, 15)?;
                }
                literals(src, &mut ip, dst, &mut op, t + 3)?;
                state = 4;
                continue;
            }
            let b = byte(src, ip)?;
            ip += 1;
            if state != 4 {
                (dist, len) = (1 + (t >> 2) + (b << 2), 2);
            } else {
                (dist, len) = (1 + M2_MAX_OFFSET + (t >> 2) + (b << 2), 3);
            }
            trailing = t & 3;
        } else if t >= 64 {
            let b = byte(src, ip)?;
            ip += 1;
            (dist, len, trailing) = (1 + ((t >> 2) & 7) + (b << 3), (t >> 5) + 1, t & 3);
        } else if t >= 32 {
            let mut l = (t & 31) + 2;
            if l == 2 {
                l = read_zero_extended(src, &mut ip, 31 + 2)?;
            }
            let n = le16(src, ip)?;
            ip += 2;
            (dist, len, trailing) = (1 + (n >> 2), l, n & 3);
        } else {
            let n = le16(src, ip)?;
            if rle && (n & 0xfffc) == 0xfffc && (t & 0xf8) == 0x18 {
                let hi = byte(src, ip + 2)?;
                let run = ((t & 7) | (hi << 3)) + MIN_ZERO_RUN_LENGTH;
                if op + run > dst.len() {
                    return Err(overrun(dst));
                }
                dst[op..op + run].fill(0);
                op += run;
                ip += 3;
                state = n & 3;
                trailing_literals(src, &mut ip, dst, &mut op, state)?;
                continue;
            }
            let mut l = (t & 7) + 2;
            let mut n = n;
            if l == 2 {
                l = read_zero_extended(src, &mut ip, 7 + 2)?;
                n = le16(src, ip)?;
            }
            ip += 2;
            let far = ((t & 8) << 11) + (n >> 2);
            if far == 0 {
                // End of stream: 17 0 0.
                if l != 3 {
                    return Err(corrupt(at, "malformed end marker"));
                }
                if ip != src.len() {
                    return Err(corrupt(ip, "data after the end marker"));
                }
                return Ok(op);
            }
            (dist, len, trailing) = (far + 0x4000, l, n & 3);
        }
        if dist > op {
            return Err(corrupt(at, "match reaches before the output"));
        }
        if op + len > dst.len() {
            return Err(overrun(dst));
        }
        copy_match(dst, op, dist, len);
        op += len;
        trailing_literals(src, &mut ip, dst, &mut op, trailing)?;
        state = trailing;
    }
}

fn overrun(dst: &[u8]) -> CompressError {
    CompressError::OutputOverrun {
        algorithm: "lzo",
        capacity: dst.len(),
    }
}

/// Copies a literal run of `n` bytes.
#[inline(always)]
fn literals(src: &[u8], ip: &mut usize, dst: &mut [u8], op: &mut usize, n: usize) -> Result<()> {
    if *ip + n > src.len() {
        return Err(corrupt(*ip, "literals run past the input"));
    }
    if *op + n > dst.len() {
        return Err(overrun(dst));
    }
    copy_literals(dst, *op, src, *ip, n);
    *ip += n;
    *op += n;
    Ok(())
}

/// Copies the 0..3 literals that follow a match: four bytes at once when both sides have
/// the room (the kernel's `COPY4`), the surplus to be overwritten by what follows.
#[inline(always)]
fn trailing_literals(
    src: &[u8],
    ip: &mut usize,
    dst: &mut [u8],
    op: &mut usize,
    n: usize,
) -> Result<()> {
    if *ip + 4 <= src.len() && *op + 4 <= dst.len() {
        let four: [u8; 4] = src[*ip..*ip + 4].try_into().expect("four bytes");
        dst[*op..*op + 4].copy_from_slice(&four);
        *ip += n;
        *op += n;
        Ok(())
    } else {
        literals(src, ip, dst, op, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(data: &[u8], rle: bool) -> usize {
        let mut c = Lzo::new(rle);
        let mut comp = vec![0; crate::worst_case_len(data.len())];
        let n = c.compress(data, &mut comp).unwrap();
        let mut out = vec![0; data.len()];
        assert_eq!(
            c.decompress(&comp[..n], &mut out).unwrap(),
            data.len(),
            "rle={rle}"
        );
        assert_eq!(out, data, "rle={rle}");
        n
    }

    #[test]
    fn round_trips_both_variants() {
        let text: Vec<u8> = b"the quick brown fox jumps "
            .iter()
            .cycle()
            .take(4096)
            .copied()
            .collect();
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let mut sparse = vec![0u8; 16384];
        for i in (0..16384).step_by(700) {
            sparse[i] = i as u8 | 1;
        }
        for rle in [false, true] {
            for data in [
                &[][..],
                b"x",
                b"abcdefghijklmnopqrstuvwxyz",
                &text,
                &noise,
                &sparse,
            ] {
                round_trip(data, rle);
            }
        }
        // Zero runs are what lzo-rle is for.
        assert!(round_trip(&sparse, true) < round_trip(&sparse, false));
    }

    #[test]
    fn rejects_corrupt_input() {
        let mut out = [0u8; 64];
        assert!(decompress(&[], &mut out).is_err());
        assert!(decompress(&[17, 0], &mut out).is_err());
        assert!(decompress(&[0, 0, 0, 0, 0, 0], &mut out).is_err());
        assert!(
            decompress(&[21, b'a', b'b', b'c', b'd', 0x40, 0x20], &mut out).is_err(),
            "lookbehind"
        );
        assert!(
            decompress(&[21, b'a', b'b', b'c', b'd', 17, 0, 0, 9], &mut out).is_err(),
            "trailing"
        );
        let mut tiny = [0u8; 2];
        assert!(decompress(&[21, b'a', b'b', b'c', b'd', 17, 0, 0], &mut tiny).is_err());
        assert_eq!(
            decompress(&[21, b'a', b'b', b'c', b'd', 17, 0, 0], &mut out).unwrap(),
            4
        );
    }
}
