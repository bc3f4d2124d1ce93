//! The compressors: every decompressor is total (any input gives Ok or Err, never a panic,
//! an overrun or a hang, and never more output than room; lz4's also agrees with liblz4 on
//! every block both accept, lzo's with liblzo2), and every compressor round-trips whatever
//! it is given.

use ztier_compress::{worst_case_len, Algorithm};

/// Output room: the largest page ztier stores.
const OUT: usize = 16384;

pub fn decompress_is_total(alg: &str, data: &[u8]) {
    let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
    let mut out = vec![0u8; OUT];
    let ours = c.decompress(data, &mut out);
    if let Ok(n) = ours {
        assert!(n <= OUT);
    }
    if alg == "lz4" {
        // liblz4 refuses some blocks ztier reads (a match in the last 5 input bytes) and
        // reads one kind ztier refuses (a zero offset); any block both read decodes the same.
        let mut lib = vec![0u8; OUT];
        match (
            &ours,
            ztier_compress::liblz4::decompress_safe(data, &mut lib),
        ) {
            (Ok(n), Some(m)) => {
                assert_eq!(m, *n);
                assert_eq!(lib[..*n], out[..*n]);
            }
            (Err(e), Some(_)) => assert!(
                e.to_string().contains("match offset outside the output"),
                "liblz4 reads a block ztier refuses: {e}"
            ),
            _ => {}
        }
    }
    if alg == "lzo" && data.first() != Some(&17) {
        // liblzo2 reads plain LZO1X the same way; a stream opening with 17 is the kernel's
        // versioned (lzo-rle) header to ztier and a literal run to liblzo2.
        let mut lib = vec![0u8; OUT];
        match (
            ours.as_ref().ok().copied(),
            ztier_reference::liblzo2::decompress_safe(data, &mut lib),
        ) {
            (Some(n), Some(m)) => {
                assert_eq!(m, n);
                assert_eq!(lib[..n], out[..n]);
            }
            (None, None) => {}
            // The kernel's decoder, which ztier follows, also requires the end marker's
            // length to be 3 (`t != 3` at eof_found); liblzo2 does not look.
            (None, Some(_)) if format!("{ours:?}").contains("malformed end marker") => {}
            (n, m) => panic!("ztier decoded {n:?} bytes ({ours:?}), liblzo2 {m:?}"),
        }
    }
    // A short output buffer must be refused, not overrun.
    let mut small = vec![0u8; 64];
    if let Ok(n) = c.decompress(data, &mut small) {
        assert!(n <= 64);
    }
}

pub fn round_trips(alg: &str, data: &[u8]) {
    let data = &data[..data.len().min(OUT)];
    let mut c = alg.parse::<Algorithm>().unwrap().new_compressor();
    let mut comp = vec![0u8; worst_case_len(data.len())];
    let n = c.compress(data, &mut comp).expect("compress");
    let mut back = vec![0u8; data.len()];
    let m = c
        .decompress(&comp[..n], &mut back)
        .expect("decompress own output");
    assert_eq!(m, data.len());
    assert_eq!(back, data);
    if alg == "lz4" {
        // The kernel variant writes standard LZ4 blocks: liblz4 must read them.
        let mut lib = vec![0u8; data.len()];
        assert_eq!(
            ztier_compress::liblz4::decompress_safe(&comp[..n], &mut lib),
            Some(data.len())
        );
        assert_eq!(lib, data);
    }
}
