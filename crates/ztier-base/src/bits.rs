//! Bit fields of a `u64`: how handles and packed entries are laid out, one field after
//! another from a given bit, each checked to fit.

/// A bit field of a `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    shift: u32,
    bits: u32,
}

impl Field {
    /// The field of `bits` bits from bit `shift`.
    pub const fn at(shift: u32, bits: u32) -> Field {
        assert!(
            bits > 0 && bits < 64 && shift + bits <= 64,
            "field outside a u64"
        );
        Field { shift, bits }
    }

    /// The field of `bits` bits just above `prev`.
    pub const fn after(prev: Field, bits: u32) -> Field {
        Field::at(prev.shift + prev.bits, bits)
    }

    /// The lowest bit of the field.
    pub const fn shift(self) -> u32 {
        self.shift
    }

    /// The first bit above the field.
    pub const fn end(self) -> u32 {
        self.shift + self.bits
    }

    /// The largest value the field holds.
    pub const fn max(self) -> u64 {
        (1 << self.bits) - 1
    }

    /// The field's value in `raw`.
    #[inline]
    pub const fn get(self, raw: u64) -> u64 {
        (raw >> self.shift) & self.max()
    }

    /// `value` in its place; panics if it does not fit (callers bound what they hand out, so
    /// this is a bug, not input).
    #[inline]
    pub fn put(self, value: u64) -> u64 {
        assert!(
            value <= self.max(),
            "{value} does not fit a {}-bit field",
            self.bits
        );
        value << self.shift
    }

    /// `raw` with the field's bits cleared.
    #[inline]
    pub const fn clear(self, raw: u64) -> u64 {
        raw & !(self.max() << self.shift)
    }

    /// `raw` with the field set to `value` (which must fit).
    #[inline]
    pub fn set(self, raw: u64, value: u64) -> u64 {
        self.clear(raw) | self.put(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_pack_and_unpack_without_overlap() {
        let a = Field::at(1, 30);
        let b = Field::after(a, 9);
        assert_eq!((a.end(), b.shift(), b.end()), (31, 31, 40));
        let raw = a.put(a.max()) | b.put(5) | 1;
        assert_eq!((a.get(raw), b.get(raw), raw & 1), (a.max(), 5, 1));
        let raw = b.set(raw, 7);
        assert_eq!((a.get(raw), b.get(raw)), (a.max(), 7));
        assert_eq!(a.get(a.clear(raw)), 0);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn a_value_too_wide_for_its_field_panics() {
        Field::at(1, 4).put(16);
    }
}
