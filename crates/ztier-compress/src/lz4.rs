//! LZ4 as the kernel's `lib/lz4/lz4_compress.c` writes it, and a safe block decoder.
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

use crate::copy::{chunk, chunk_mut, copy_literals, copy_match, read32, read64};
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

/// `LZ4_count()`: equal bytes at `a` and `b`, with `a` stopping at `limit`.
#[inline(always)]
fn count(s: &[u8], mut a: usize, mut b: usize, limit: usize) -> usize {
    let start = a;
    while a + 8 <= limit {
        let x = read64(s, a) ^ read64(s, b);
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
        table[hash(read32(src, 0))] = 0;
        let mut ip = 1;
        let mut forward_h = hash(read32(src, ip));

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
                    forward_h = hash(read32(src, forward_ip));
                    table[h] = ip as u16;
                    if read32(src, m) == read32(src, ip) {
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
                table[hash(read32(src, ip - 2))] = (ip - 2) as u16;
                let h = hash(read32(src, ip));
                m = table[h] as usize;
                table[h] = ip as u16;
                if m + MAX_DISTANCE >= ip && read32(src, m) == read32(src, ip) {
                    token = op;
                    op += 1;
                    dst[token] = 0;
                    continue;
                }
                break;
            }
            ip += 1;
            forward_h = hash(read32(src, ip));
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

/// Reads a length's continuation bytes.
#[inline(always)]
fn read_length(src: &[u8], ip: &mut usize, mut len: usize) -> Result<usize> {
    loop {
        let b = *src
            .get(*ip)
            .ok_or_else(|| corrupt(*ip, "truncated length"))?;
        *ip += 1;
        len += b as usize;
        if b != 255 {
            return Ok(len);
        }
    }
}

/// Decodes an LZ4 block into `dst`; returns the decoded length.
///
/// The main loop decodes while the output has room for wild copies, in liblz4's shape: a long
/// literal run and a long match are each a separate, rarely taken branch; a short literal run
/// is one 16-byte copy and a short match with an offset of 8 or more is fixed 8- or 16-byte
/// copies, so the common sequence has no loop whose trip count could be mispredicted. A
/// sequence it cannot finish within its bounds is left, unconsumed, to `decompress_tail`,
/// which checks every step (and ends the block).
pub fn decompress(src: &[u8], dst: &mut [u8]) -> Result<usize> {
    let (mut ip, mut op) = (0, 0);
    while op + 64 <= dst.len() {
        let Some(&token) = src.get(ip) else { break };
        let token = token as usize;
        let mut p = ip + 1;
        let mut lit = token >> 4;
        if lit == RUN_MASK {
            lit = read_length(src, &mut p, lit)?;
            if p + lit + 16 > src.len() || op + lit + 64 > dst.len() {
                break;
            }
            copy_literals(dst, op, src, p, lit);
        } else {
            if p + 18 > src.len() {
                break;
            }
            *chunk_mut::<16>(dst, op) = *chunk::<16>(src, p);
        }
        let q = p + lit;
        let offset = u16::from_le_bytes(*chunk::<2>(src, q)) as usize;
        let o = op + lit;
        let mut r = q + 2;
        let mut ml = token & ML_MASK;
        if ml == ML_MASK {
            ml = read_length(src, &mut r, ml)?;
        }
        ml += MINMATCH;
        if offset == 0 || offset > o {
            return Err(corrupt(q, "match offset outside the output"));
        }
        if o + ml + 32 > dst.len() {
            break;
        }
        let from = o - offset;
        if ml <= 18 && offset >= 16 {
            let first = *chunk::<16>(dst, from);
            *chunk_mut::<16>(dst, o) = first;
            let second = *chunk::<16>(dst, from + 16);
            *chunk_mut::<16>(dst, o + 16) = second;
        } else if ml <= 18 && offset >= 8 {
            for k in [0, 8, 16] {
                let c = *chunk::<8>(dst, from + k);
                *chunk_mut::<8>(dst, o + k) = c;
            }
        } else {
            copy_match(dst, o, offset, ml);
        }
        ip = r;
        op = o + ml;
    }
    decompress_tail(src, dst, ip, op)
}

/// Decodes sequences from `ip` on, writing from `op` on, checking every step, to the end of
/// the block.
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
            lit = read_length(src, &mut ip, lit)?;
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
            len = read_length(src, &mut ip, len)?;
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
