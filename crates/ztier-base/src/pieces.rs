//! A byte range cut into the pieces that fixed-size units (pages) hold: how a read or write
//! at any offset meets a device or a chain made of pages. Written once for zram's partial
//! page I/O, the plain RAM disk and the pool's page chains.
//!
//! Invariant: the pieces are in order, none is empty, each lies within one unit, and their
//! lengths add up to the range's.

/// The part of one unit a byte range covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The unit's index (the range's offset divided by the unit size).
    pub unit: u64,
    /// Where the piece starts in its unit.
    pub in_unit: usize,
    /// Where the piece starts in the range (the caller's buffer).
    pub at: usize,
    pub len: usize,
}

/// The pieces of `offset..offset + len` in units of `unit_size` bytes (which must not be 0).
pub fn pieces(offset: u64, len: usize, unit_size: usize) -> impl Iterator<Item = Piece> {
    assert!(unit_size > 0, "units of no bytes");
    let unit = unit_size as u64;
    let mut done = 0;
    std::iter::from_fn(move || {
        (done < len).then(|| {
            let pos = offset + done as u64;
            let in_unit = (pos % unit) as usize;
            let piece = Piece {
                unit: pos / unit,
                in_unit,
                at: done,
                len: (unit_size - in_unit).min(len - done),
            };
            done += piece.len;
            piece
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_cut_at_unit_boundaries() {
        let p: Vec<_> = pieces(4090, 4110, 4096).collect();
        assert_eq!(
            p,
            [
                Piece {
                    unit: 0,
                    in_unit: 4090,
                    at: 0,
                    len: 6
                },
                Piece {
                    unit: 1,
                    in_unit: 0,
                    at: 6,
                    len: 4096
                },
                Piece {
                    unit: 2,
                    in_unit: 0,
                    at: 4102,
                    len: 8
                },
            ]
        );
        assert_eq!(pieces(8192, 4096, 4096).count(), 1, "one whole unit");
        assert_eq!(pieces(100, 0, 4096).count(), 0, "nothing");
    }

    #[test]
    fn pieces_cover_the_range_in_order_and_stay_in_their_unit() {
        for (offset, len, unit) in [(0u64, 1usize, 1usize), (7, 1000, 64), (12345, 99999, 4096)] {
            let mut next = 0;
            for p in pieces(offset, len, unit) {
                assert_eq!(p.at, next);
                assert!(p.len > 0 && p.in_unit + p.len <= unit);
                assert_eq!(
                    p.unit * unit as u64 + p.in_unit as u64,
                    offset + p.at as u64
                );
                next += p.len;
            }
            assert_eq!(next, len);
        }
    }
}
