//! A deterministic byte pattern (xorshift64), different per seed and per offset, so that a
//! byte written to the wrong place shows: the data every test and fuzz target writes.

/// `len` bytes of the pattern for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
