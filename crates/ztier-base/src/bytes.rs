//! The one reader of fixed-width fields from a byte slice, refusing to run past its end:
//! NBD's messages (big-endian, `ztier-nbd`'s `proto::Cursor`, which adds what message it
//! reads and NBD's strings) and a capture's trace (little-endian, `ztier-corpus`). Each
//! caller turns a [`PastEnd`] into its own error, with the words its format needs.
//!
//! Not here: zram's saved state is read as a stream (`std::io::Read`, a state can be as
//! large as the disk) with a CRC over every byte as it passes, so its reader
//! (`ztier-zram`'s `state::Checked`) owns a checksum and a stream that a slice reader has
//! no use for; it decodes its little-endian fields with `from_le_bytes` as this does.

/// A read that would run past the end of the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{wanted} bytes wanted at byte {at}, {left} left")]
pub struct PastEnd {
    /// Where the read began (bytes consumed before it).
    pub at: usize,
    pub wanted: usize,
    pub left: usize,
}

/// Fields read in order from a byte slice, each in the byte order its method names.
#[derive(Debug, Clone)]
pub struct ByteReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> ByteReader<'a> {
    pub fn new(bytes: &'a [u8]) -> ByteReader<'a> {
        ByteReader { bytes, at: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Bytes not yet read.
    pub fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The next `n` bytes; on a refusal nothing is consumed.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], PastEnd> {
        if n > self.left() {
            return Err(PastEnd {
                at: self.at,
                wanted: n,
                left: self.left(),
            });
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], PastEnd> {
        Ok(self.take(N)?.try_into().expect("take gave N bytes"))
    }

    pub fn u8(&mut self) -> Result<u8, PastEnd> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16_be(&mut self) -> Result<u16, PastEnd> {
        self.array().map(u16::from_be_bytes)
    }

    pub fn u32_be(&mut self) -> Result<u32, PastEnd> {
        self.array().map(u32::from_be_bytes)
    }

    pub fn u64_be(&mut self) -> Result<u64, PastEnd> {
        self.array().map(u64::from_be_bytes)
    }

    pub fn u16_le(&mut self) -> Result<u16, PastEnd> {
        self.array().map(u16::from_le_bytes)
    }

    pub fn u32_le(&mut self) -> Result<u32, PastEnd> {
        self.array().map(u32::from_le_bytes)
    }

    pub fn u64_le(&mut self) -> Result<u64, PastEnd> {
        self.array().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_in_either_order_and_never_past_the_end() {
        let bytes = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
        let mut r = ByteReader::new(&bytes);
        assert_eq!(r.u8(), Ok(1));
        assert_eq!(r.u16_be(), Ok(0x0203));
        assert_eq!(r.u16_le(), Ok(0x0504));
        assert_eq!(r.u32_be(), Ok(0x0607_0809));
        assert_eq!(r.position(), 9);
        assert_eq!(
            r.u64_le(),
            Err(PastEnd {
                at: 9,
                wanted: 8,
                left: 6
            })
        );
        // A refused read consumes nothing.
        assert_eq!(r.u32_le(), Ok(0x0d0c_0b0a));
        assert_eq!(r.take(2), Ok(&[14, 15][..]));
        assert_eq!(r.left(), 0);
        assert_eq!(r.take(0), Ok(&[][..]));
        let mut r = ByteReader::new(&bytes[..8]);
        assert_eq!(r.u64_be(), Ok(0x0102_0304_0506_0708));
    }
}
