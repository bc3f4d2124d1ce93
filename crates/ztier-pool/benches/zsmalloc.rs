//! zsmalloc's cost per object, against a plain memcpy of the same bytes measured in the same
//! run: store (malloc + write) + free, and read, across object sizes. Reads pick objects
//! across a 10,000-object population; their reference copies from as many slots of an equally
//! large buffer in the same order ("memcpy"), beside a copy of hot bytes ("memcpy-hot").

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ztier_pool::{ZPool, ZsConfig, ZsPool};

const SIZES: [usize; 6] = [64, 400, 1000, 2000, 3000, 4096];

fn store_free(c: &mut Criterion) {
    let mut g = c.benchmark_group("store_free");
    for len in SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let data = vec![0xa5u8; len];
        let pool = ZsPool::new(ZsConfig::default()).unwrap();
        // A resident population so allocation walks real fullness lists.
        let keep: Vec<_> = (0..10_000).map(|_| pool.store(&data).unwrap()).collect();
        g.bench_with_input(BenchmarkId::new("zsmalloc", len), &len, |b, _| {
            b.iter(|| {
                let h = pool.store(&data).unwrap();
                pool.free(h).unwrap();
            })
        });
        let mut dst = vec![0u8; len];
        g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |b, _| {
            b.iter(|| {
                dst.copy_from_slice(std::hint::black_box(&data));
                std::hint::black_box(&dst);
            })
        });
        for h in keep {
            pool.free(h).unwrap();
        }
    }
    g.finish();
}

fn read(c: &mut Criterion) {
    let mut g = c.benchmark_group("read");
    for len in SIZES {
        g.throughput(Throughput::Bytes(len as u64));
        let data = vec![0x5au8; len];
        let pool = ZsPool::new(ZsConfig::default()).unwrap();
        let handles: Vec<_> = (0..10_000).map(|_| pool.store(&data).unwrap()).collect();
        let mut out = vec![0u8; 4096];
        let mut i = 0;
        g.bench_with_input(BenchmarkId::new("zsmalloc", len), &len, |b, _| {
            b.iter(|| {
                i = (i + 7919) % handles.len();
                pool.read(handles[i], &mut out).unwrap()
            })
        });
        // The reference: the same bytes copied from the same number of objects spread over
        // as much memory, in the same order, so both pay the same cache misses.
        let spread = vec![0x5au8; handles.len() * len];
        let mut j = 0;
        g.bench_with_input(BenchmarkId::new("memcpy", len), &len, |b, _| {
            b.iter(|| {
                j = (j + 7919) % handles.len();
                out[..len].copy_from_slice(&spread[j * len..(j + 1) * len]);
                std::hint::black_box(&out);
            })
        });
        g.bench_with_input(BenchmarkId::new("memcpy-hot", len), &len, |b, _| {
            b.iter(|| {
                out[..len].copy_from_slice(std::hint::black_box(&data));
                std::hint::black_box(&out);
            })
        });
        for h in handles {
            pool.free(h).unwrap();
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .measurement_time(std::time::Duration::from_secs(1))
        .warm_up_time(std::time::Duration::from_millis(300));
    targets = store_free, read
}
criterion_main!(benches);
