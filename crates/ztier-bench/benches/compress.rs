//! Compressors on real memory pages (the bundled sample), against the C libraries measured
//! in the same run: ztier's kernel-variant lz4 against liblz4, ztier's lzo and lzo-rle
//! against liblzo2's LZO1X-1. Throughput is of uncompressed bytes. Decoders are compared on
//! the same blocks: liblz4 and liblzo2 decode what ztier's lz4 and lzo wrote.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ztier_compress::{liblz4, worst_case_len, Algorithm};
use ztier_corpus::Corpus;

mod liblzo2 {
    //! liblzo2's LZO1X-1, for reference only.
    //! Links Debian's liblzo2-dev, which scripts/setup.sh installs.
    use std::os::raw::{c_int, c_ulong, c_void};
    #[link(name = "lzo2")]
    extern "C" {
        fn lzo1x_1_compress(
            src: *const u8,
            len: c_ulong,
            dst: *mut u8,
            dst_len: *mut c_ulong,
            wrkmem: *mut c_void,
        ) -> c_int;
        fn lzo1x_decompress_safe(
            src: *const u8,
            len: c_ulong,
            dst: *mut u8,
            dst_len: *mut c_ulong,
            wrkmem: *mut c_void,
        ) -> c_int;
    }
    /// LZO1X_1_MEM_COMPRESS is 16384 dictionary entries of at most 8 bytes.
    pub const WRKMEM: usize = 16384 * 8;

    pub fn compress(src: &[u8], dst: &mut [u8], wrkmem: &mut [u8]) -> usize {
        assert!(dst.len() >= src.len() + src.len() / 16 + 67 && wrkmem.len() >= WRKMEM);
        let mut out = dst.len() as c_ulong;
        // SAFETY: src is readable for its length; dst has room for LZO's worst case
        // (checked above); wrkmem has LZO1X_1_MEM_COMPRESS bytes.
        let r = unsafe {
            lzo1x_1_compress(
                src.as_ptr(),
                src.len() as c_ulong,
                dst.as_mut_ptr(),
                &mut out,
                wrkmem.as_mut_ptr().cast(),
            )
        };
        assert_eq!(r, 0);
        out as usize
    }

    pub fn decompress(src: &[u8], dst: &mut [u8]) -> usize {
        let mut out = dst.len() as c_ulong;
        // SAFETY: the safe decoder writes at most *dst_len bytes and reads at most len bytes.
        let r = unsafe {
            lzo1x_decompress_safe(
                src.as_ptr(),
                src.len() as c_ulong,
                dst.as_mut_ptr(),
                &mut out,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(r, 0);
        out as usize
    }
}

fn sample() -> Corpus {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst");
    Corpus::load(&path).expect("bundled sample")
}

fn compress(c: &mut Criterion) {
    let corpus = sample();
    let pages: Vec<&[u8]> = corpus.chunks(4096).collect();
    let bytes = (pages.len() * 4096) as u64;
    let mut dst = vec![0u8; worst_case_len(4096)];

    let mut g = c.benchmark_group("compress");
    g.throughput(Throughput::Bytes(bytes));
    for name in ["lz4", "lzo", "lzo-rle", "zstd", "lz4hc", "deflate"] {
        let mut comp = name.parse::<Algorithm>().unwrap().new_compressor();
        g.bench_function(name, |b| {
            b.iter(|| {
                pages
                    .iter()
                    .map(|p| comp.compress(p, &mut dst).unwrap())
                    .sum::<usize>()
            })
        });
    }
    g.bench_function("liblz4", |b| {
        b.iter(|| {
            pages
                .iter()
                .map(|p| liblz4::compress_default(p, &mut dst).unwrap())
                .sum::<usize>()
        })
    });
    let mut wrkmem = vec![0u8; liblzo2::WRKMEM];
    g.bench_function("liblzo2", |b| {
        b.iter(|| {
            pages
                .iter()
                .map(|p| liblzo2::compress(p, &mut dst, &mut wrkmem))
                .sum::<usize>()
        })
    });
    g.finish();
}

fn decompress(c: &mut Criterion) {
    let corpus = sample();
    let pages: Vec<&[u8]> = corpus.chunks(4096).collect();
    let bytes = (pages.len() * 4096) as u64;
    let mut out = vec![0u8; 4096];
    let mut g = c.benchmark_group("decompress");
    g.throughput(Throughput::Bytes(bytes));
    let encode = |f: &mut dyn FnMut(&[u8], &mut [u8]) -> usize| -> Vec<Vec<u8>> {
        let mut dst = vec![0u8; worst_case_len(4096)];
        pages
            .iter()
            .map(|p| {
                let n = f(p, &mut dst);
                dst[..n].to_vec()
            })
            .collect()
    };
    // The C decoders read the very blocks ztier's do (ztier's lz4 and lzo write standard
    // blocks), so that the comparison is of decoders alone.
    let mut ztier_streams = std::collections::HashMap::new();
    for name in ["lz4", "lzo", "lzo-rle", "zstd", "lz4hc", "deflate"] {
        let mut comp = name.parse::<Algorithm>().unwrap().new_compressor();
        let streams = encode(&mut |p, d| comp.compress(p, d).unwrap());
        g.bench_function(name, |b| {
            b.iter(|| {
                streams
                    .iter()
                    .map(|s| comp.decompress(s, &mut out).unwrap())
                    .sum::<usize>()
            })
        });
        ztier_streams.insert(name, streams);
    }
    g.bench_function("liblz4", |b| {
        b.iter(|| {
            ztier_streams["lz4"]
                .iter()
                .map(|s| liblz4::decompress_safe(s, &mut out).unwrap())
                .sum::<usize>()
        })
    });
    g.bench_function("liblzo2", |b| {
        b.iter(|| {
            ztier_streams["lzo"]
                .iter()
                .map(|s| liblzo2::decompress(s, &mut out))
                .sum::<usize>()
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .measurement_time(std::time::Duration::from_secs(2))
        .warm_up_time(std::time::Duration::from_millis(500));
    targets = compress, decompress
}
criterion_main!(benches);
