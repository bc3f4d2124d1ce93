//! The one seeded generator: numbers that look random and are the same every run, for test
//! data, fixed-seed shuffles and draws. Marsaglia's xorshift64 (shifts 13, 7, 17): a full
//! period of 2^64 - 1 over the nonzero states, three shifts and three xors a number.
//!
//! Not for anything an adversary may guess (it is not cryptographic), and [`Rng::below`]
//! takes the remainder, so a bound that is not a power of two favours the low values by at
//! most `n / 2^64`: nothing a test or a bench's draw can see.
//!
//! Each sequence is fixed by its first state. [`Rng::new`] spreads a seed (0, 1, 2, … give
//! unrelated sequences); [`Rng::from_state`] starts where a caller says, for data whose
//! figures a test was written against.

/// A xorshift64 sequence (see the module's header).
#[derive(Debug, Clone)]
pub struct Rng {
    /// Never 0: the one state xorshift never leaves.
    state: u64,
}

/// The golden ratio in 64 bits: multiplying by it spreads neighbouring seeds over the states.
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

impl Rng {
    /// The sequence of `seed`: its state is `seed` spread by the golden ratio, made odd (so
    /// never 0).
    pub const fn new(seed: u64) -> Rng {
        Rng {
            state: seed.wrapping_mul(SPREAD) | 1,
        }
    }

    /// The sequence whose first state is `state`, which must not be 0.
    pub const fn from_state(state: u64) -> Rng {
        assert!(state != 0, "xorshift never leaves the state 0");
        Rng { state }
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        x
    }

    /// The next number below `n` (which must not be 0): the remainder of [`next_u64`](Self::next_u64).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "no number is below 0");
        self.next_u64() % n
    }

    /// Fills `out` a byte a number (each the low byte of the next), as
    /// [`pattern`](crate::pattern::pattern) makes its bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.next_u64() as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_marsaglias() {
        // xorshift64 (13, 7, 17) from the state 1, worked by hand.
        let mut rng = Rng::from_state(1);
        assert_eq!(rng.next_u64(), 0x4082_2041);
        assert_eq!(rng.next_u64(), 0x1000_4106_0c01_1441);
        assert_eq!(rng.next_u64(), 0x9b1e_842f_6e86_2629);
    }

    #[test]
    fn seeds_spread_and_below_stays_below() {
        let firsts: Vec<u64> = (0..4).map(|s| Rng::new(s).next_u64()).collect();
        for (i, a) in firsts.iter().enumerate() {
            assert!(firsts[i + 1..].iter().all(|b| a != b), "{firsts:x?}");
        }
        let mut rng = Rng::new(7);
        assert!((0..10_000).all(|_| rng.below(3) < 3));
        let mut page = [0u8; 64];
        Rng::new(7).fill(&mut page);
        assert!(page.iter().any(|&b| b != page[0]));
    }

    #[test]
    #[should_panic(expected = "state 0")]
    fn the_state_0_is_refused() {
        Rng::from_state(0);
    }
}
