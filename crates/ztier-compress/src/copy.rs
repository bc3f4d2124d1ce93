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
    let from = op - dist;
    if op + len + WILD > dst.len() {
        for i in 0..len {
            dst[op + i] = dst[from + i];
        }
        return;
    }
    if dist >= WILD {
        let mut k = 0;
        while k < len {
            let chunk = *chunk::<WILD>(dst, from + k);
            *chunk_mut::<WILD>(dst, op + k) = chunk;
            k += WILD;
        }
        return;
    }
    // Lay down the first 8 bytes one by one, then copy 8 at a time from a whole number of
    // pattern periods back (at least 8 bytes, so each chunk reads only bytes already written).
    let mut k = 0;
    while k < len.min(8) {
        dst[op + k] = dst[from + k];
        k += 1;
    }
    let period = if dist >= 8 {
        dist
    } else {
        dist * 8usize.div_ceil(dist)
    };
    while k < len {
        let chunk = *chunk::<8>(dst, op + k - period);
        *chunk_mut::<8>(dst, op + k) = chunk;
        k += 8;
    }
}

/// The little-endian u32 at `at`.
#[inline(always)]
pub fn read32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(*chunk::<4>(buf, at))
}

/// The little-endian u64 at `at`.
#[inline(always)]
pub fn read64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(*chunk::<8>(buf, at))
}

/// `buf[at..at + N]` as an array, checked with two compares.
#[inline(always)]
pub fn chunk<const N: usize>(buf: &[u8], at: usize) -> &[u8; N] {
    buf[at..]
        .first_chunk::<N>()
        .expect("caller checked the room")
}

/// `buf[at..at + N]` as a mutable array, checked with two compares.
#[inline(always)]
pub fn chunk_mut<const N: usize>(buf: &mut [u8], at: usize) -> &mut [u8; N] {
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
