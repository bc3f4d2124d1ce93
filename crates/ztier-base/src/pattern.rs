//! A deterministic byte pattern (the [`Rng`] of the seed, a byte a number), different per
//! seed and per offset, so that a byte written to the wrong place shows: the data every test
//! and fuzz target writes.

use crate::rng::Rng;

/// `len` bytes of the pattern for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    Rng::new(seed).fill(&mut out);
    out
}
