//! Compressors on real memory pages (the bundled sample), against the C libraries measured
//! in the same run: ztier's kernel-variant lz4 against liblz4, ztier's lzo and lzo-rle
//! against liblzo2's LZO1X-1. Throughput is of uncompressed bytes. Decoders are compared on
//! the same blocks: liblz4 and liblzo2 decode what ztier's lz4 and lzo wrote.
//!
//! `ZTIER_BENCH_CORPUS=PATH.pages.zst` measures another corpus instead of the sample.

use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ztier_compress::{liblz4, worst_case_len, Algorithm};
use ztier_corpus::Corpus;
use ztier_reference::liblzo2;

fn sample() -> Corpus {
    let path = match std::env::var_os("ZTIER_BENCH_CORPUS") {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../samples/sample.pages.zst"),
    };
    Corpus::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
                .map(|p| liblzo2::compress(p, &mut dst, &mut wrkmem).unwrap())
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
                .map(|s| liblzo2::decompress_safe(s, &mut out).unwrap())
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
