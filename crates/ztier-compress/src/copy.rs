//! The byte copies of LZ77 coders, done in fixed 16- and 8-byte steps where the buffers have
//! room past the end, as the C libraries' "wild copies" do. A fixed-size copy compiles to a
//! pair of vector moves; a variable one is a call to memcpy/memmove, which costs more than
//! the few bytes most literal runs and matches carry. Bytes written past `len` (at most 15)
//! lie inside the buffer and are overwritten by what follows or are beyond the result.

const WILD: usize = 16;

/// Copies `src[ip..ip + len]` to `dst[op..]`. The caller has checked both ranges.
#[inline(always)]
pub fn copy_literals(dst: &mut [u8], op: usize, src: &[u8], ip: usize, len: usize) {
    if op + len + WILD <= dst.len() && ip + len + WILD <= src.len() {
        let mut k = 0;
        while k < len {
            let chunk = *chunk::<WILD>(src, ip + k);
            *chunk_mut::<WILD>(dst, op + k) = chunk;
            k += WILD;
        }
    } else {
        dst[op..op + len].copy_from_slice(&src[ip..ip + len]);
    }
}

/// Appends `len` bytes copied from `dist` bytes back (`1 <= dist <= op`), overlapping as an
/// LZ77 match does: a short distance repeats its pattern. The caller has checked
/// `op + len <= dst.len()`.
#[inline(always)]
pub fn copy_match(dst: &mut [u8], op: usize, dist: usize, len: usize) {
    // Wild copies may run WILD bytes past what they copy, so near the end of `dst` the last
    // few bytes are copied one by one. (A match often runs to the end of a page: a page that
    // ends in zeros.)
    let wild = len.min(dst.len().saturating_sub(op + WILD));
    copy_match_wild(dst, op, dist, wild);
    for i in wild..len {
        dst[op + i] = dst[op - dist + i];
    }
}

/// `copy_match` when `dst` has `WILD` bytes of room past `op + len`.
#[allow(unsafe_code)]
#[inline(always)]
fn copy_match_wild(dst: &mut [u8], op: usize, dist: usize, len: usize) {
    if len == 0 {
        return;
    }
    let from = op - dist;
    let mut k = 0;
    if dist >= WILD {
        while k < len {
            let chunk = *chunk::<WILD>(dst, from + k);
            *chunk_mut::<WILD>(dst, op + k) = chunk;
            k += WILD;
        }
        return;
    }
    assert!(dist >= 1 && dist <= op && op + len + WILD <= dst.len());
    // SAFETY: dist < WILD here, and the rest of the contract is checked just above.
    unsafe { copy_near_match(dst.as_mut_ptr().add(op), dist, len) }
}

/// Appends a match at a distance under 16. A distance of 8 or less repeats a pattern of
/// `dist` bytes: its first 16 bytes are built in a register once and stored every whole
/// number of periods, so the stores depend on no earlier store, where copying from just
/// behind `to` would wait on each one in turn. A distance of 9 to 15 is copied in 8-byte
/// steps from behind, as liblz4 does (a gathered 16-byte pattern measured slower).
///
/// # Safety
/// `1 <= dist < 16`; `to - dist .. to + len + 15` is one valid, writable allocation (the
/// bytes past the match may be overwritten).
#[allow(unsafe_code)]
#[inline(always)]
pub unsafe fn copy_near_match(to: *mut u8, dist: usize, len: usize) {
    debug_assert!((1..WILD).contains(&dist));
    if dist > MAX_PATTERN {
        // Each 8-byte step reads only bytes already final, as dist > 8.
        let mut k = 0;
        while k < len {
            // SAFETY: the caller's contract: reads to - dist + k .. to - dist + k + 8, behind
            // to + k; writes to + k .. to + k + 8 with k < len.
            unsafe {
                to.add(k)
                    .cast::<[u8; 8]>()
                    .write_unaligned(to.sub(dist).add(k).cast::<[u8; 8]>().read_unaligned())
            };
            k += 8;
        }
        return;
    }
    // SAFETY: the caller's contract: the load covers to - dist .. to - dist + 16 <= to + 15,
    // each store to + k .. to + k + 16 with k < len.
    unsafe {
        let head = to.sub(dist).cast::<[u8; WILD]>().read_unaligned();
        let pattern = repeat_pattern(&head, dist);
        let step = PATTERN_STEP[dist];
        let mut k = 0;
        while k < len {
            to.add(k).cast::<[u8; WILD]>().write_unaligned(pattern);
            k += step;
        }
    }
}

/// The first 16 bytes of the endless repetition of `head[..dist]`, `1 <= dist <= 8`. (The
/// periods that divide 8 go through a u128 so that the compiler keeps them in registers.)
#[inline(always)]
fn repeat_pattern(head: &[u8; WILD], dist: usize) -> [u8; WILD] {
    // Periods that divide 8 are a multiply; the others gather byte by byte.
    let word = match dist {
        1 => u64::from(head[0]) * 0x0101_0101_0101_0101,
        2 => u64::from(u16::from_le_bytes([head[0], head[1]])) * 0x0001_0001_0001_0001,
        4 => u64::from(u32::from_le_bytes(*chunk(head, 0))) * 0x0000_0001_0000_0001,
        8 => u64::from_le_bytes(*chunk(head, 0)),
        _ => {
            let mut pattern = [0u8; WILD];
            for (byte, &i) in pattern.iter_mut().zip(&PATTERN_INDEX[dist]) {
                *byte = head[i as usize];
            }
            return pattern;
        }
    };
    (u128::from(word) << 64 | u128::from(word)).to_le_bytes()
}

/// The longest period [`repeat_pattern`] builds.
const MAX_PATTERN: usize = 8;

/// `PATTERN_STEP[d]`: the whole periods of `d` that fit in `WILD` bytes, as a length.
const PATTERN_STEP: [usize; MAX_PATTERN + 1] = {
    let mut table = [WILD; MAX_PATTERN + 1];
    let mut d = 1;
    while d <= MAX_PATTERN {
        table[d] = WILD - WILD % d;
        d += 1;
    }
    table
};

/// `PATTERN_INDEX[d][i] = i % d`: where byte `i` of a pattern of period `d` comes from.
const PATTERN_INDEX: [[u8; WILD]; MAX_PATTERN + 1] = {
    let mut table = [[0u8; WILD]; MAX_PATTERN + 1];
    let mut d = 1;
    while d <= MAX_PATTERN {
        let mut i = 0;
        while i < WILD {
            table[d][i] = (i % d) as u8;
            i += 1;
        }
        d += 1;
    }
    table
};

/// The little-endian u32 at `at`, unchecked.
///
/// For the compressors' match finders, which read at every input position and whose
/// positions are in bounds by the shape of their loops; a bounds check on each read costs
/// them a measurable share of their speed against liblz4 and liblzo2 (docs/diary.md).
///
/// # Safety
/// `at + 4 <= buf.len()`. Checked in debug builds, which the fuzz targets use.
#[allow(unsafe_code)]
#[inline(always)]
pub unsafe fn read32(buf: &[u8], at: usize) -> u32 {
    debug_assert!(at.checked_add(4).is_some_and(|end| end <= buf.len()));
    // SAFETY: the caller's contract; [u8; 4] has alignment 1.
    u32::from_le_bytes(unsafe { buf.as_ptr().add(at).cast::<[u8; 4]>().read() })
}

/// The little-endian u64 at `at`, unchecked; see [`read32`].
///
/// # Safety
/// `at + 8 <= buf.len()`. Checked in debug builds.
#[allow(unsafe_code)]
#[inline(always)]
pub unsafe fn read64(buf: &[u8], at: usize) -> u64 {
    debug_assert!(at.checked_add(8).is_some_and(|end| end <= buf.len()));
    // SAFETY: the caller's contract; [u8; 8] has alignment 1.
    u64::from_le_bytes(unsafe { buf.as_ptr().add(at).cast::<[u8; 8]>().read() })
}

/// `buf[at..at + N]` as an array, checked with two compares.
#[inline(always)]
fn chunk<const N: usize>(buf: &[u8], at: usize) -> &[u8; N] {
    buf[at..]
        .first_chunk::<N>()
        .expect("caller checked the room")
}

/// `buf[at..at + N]` as a mutable array, checked with two compares.
#[inline(always)]
fn chunk_mut<const N: usize>(buf: &mut [u8], at: usize) -> &mut [u8; N] {
    buf[at..]
        .first_chunk_mut::<N>()
        .expect("caller checked the room")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_equal_the_byte_loop() {
        for dist in 1..40 {
            for len in 0..100 {
                for room in [0, 7, 16, 40] {
                    let mut fast: Vec<u8> = (0..64u8)
                        .chain(std::iter::repeat_n(0, len + room))
                        .collect();
                    let mut slow = fast.clone();
                    let op = 64;
                    copy_match(&mut fast, op, dist, len);
                    for i in 0..len {
                        slow[op + i] = slow[op - dist + i];
                    }
                    assert_eq!(
                        fast[..op + len],
                        slow[..op + len],
                        "dist {dist} len {len} room {room}"
                    );
                }
            }
        }
    }

    #[test]
    fn literals_copy_exactly() {
        let src: Vec<u8> = (0..200u8).collect();
        for len in 0..100 {
            for room in [0, 20] {
                let mut dst = vec![0xffu8; 10 + len + room];
                copy_literals(&mut dst, 10, &src, 3, len);
                assert_eq!(dst[10..10 + len], src[3..3 + len]);
                assert!(dst[..10].iter().all(|&b| b == 0xff));
            }
        }
    }
}
