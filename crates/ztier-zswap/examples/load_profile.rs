//! zswap's load path alone, for profiling: a corpus stored in order into a fresh cache, then
//! passes of (raw decompression of the same pages, timed; every page loaded, timed and
//! verified; every page stored again, untimed), on `threads` threads taking 256-page batches
//! round robin as the replay driver does. Prints each pass's load and raw times and the
//! median ratio.
//!
//! `cargo run --release -p ztier-zswap --example load_profile -- CORPUS ALG THREADS [PASSES]`
//!
//! With `PERF_CTL=fifo` (perf record `--control fifo:FIFO -D -1`), the profiler is enabled
//! only while loads run.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ztier_blockdev::memory::MemoryDevice;
use ztier_compress::{worst_case_len, Algorithm};
use ztier_corpus::Corpus;
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zswap::{Cache, Config};

const PS: usize = 4096;
const BATCH: usize = 256;

/// Nanoseconds the calling thread has run on a CPU (`/proc/thread-self/schedstat`): on a
/// shared machine, what a pass cost, whatever else ran meanwhile.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs `f` over the pages on `threads` threads: (wall seconds, CPU seconds of all threads).
fn over_threads(n: usize, threads: usize, f: &(dyn Fn(usize, &mut Vec<u8>) + Sync)) -> (f64, f64) {
    let start = Instant::now();
    let cpu: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut scratch = vec![0u8; worst_case_len(PS)];
                    let began = thread_cpu_ns();
                    let mut b = t;
                    while b * BATCH < n {
                        for i in b * BATCH..((b + 1) * BATCH).min(n) {
                            f(i, &mut scratch);
                        }
                        b += threads;
                    }
                    thread_cpu_ns() - began
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    (start.elapsed().as_secs_f64(), cpu as f64 / 1e9)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let corpus = Corpus::load(Path::new(&args[1])).expect("corpus");
    let alg: Algorithm = args[2].parse().expect("algorithm");
    let threads: usize = args[3].parse().expect("threads");
    let passes: usize = args.get(4).map_or(7, |p| p.parse().expect("passes"));
    // VERIFY=0: loads are not compared with the page inside the timed pass (the raw pass
    // compares nothing either); a last untimed pass verifies every page.
    let verify = std::env::var("VERIFY").map_or(true, |v| v != "0");
    let mut ctl = std::env::var("PERF_CTL").ok().map(|p| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .expect("perf control fifo")
    });
    let pages: Vec<&[u8]> = corpus.chunks(PS).collect();
    let n = pages.len();
    let slots_n = (n as u64 + 1).div_ceil(512) * 512;
    let backing = Arc::new(MemoryDevice::new(slots_n * PS as u64).unwrap());
    let swap = Arc::new(ztier_swap::Device::new(backing, Default::default()).unwrap());
    let pool = AllocatorKind::Zsmalloc
        .make_pool(&ZsConfig::default())
        .unwrap();
    let mut config = Config::new(alg.clone(), u64::MAX / 128);
    config.shrink_worker = false;
    let cache = Cache::new(swap.clone(), pool, config).unwrap();
    let slots: Vec<u64> = (0..n).map(|_| swap.alloc(0).unwrap()).collect();
    let compressed: Vec<Vec<u8>> = {
        let mut c = alg.new_compressor();
        let mut buf = vec![0u8; worst_case_len(PS)];
        pages
            .iter()
            .map(|p| {
                let len = c.compress(p, &mut buf).unwrap();
                buf[..len].to_vec()
            })
            .collect()
    };
    let store = |i: usize, _: &mut Vec<u8>| {
        cache.store(slots[i], pages[i]).unwrap();
    };
    over_threads(n, threads, &store);
    let streams: Vec<std::sync::Mutex<Box<dyn ztier_compress::Compressor>>> = (0..threads)
        .map(|_| std::sync::Mutex::new(alg.new_compressor()))
        .collect();
    let mut ratios = Vec::new();
    let mut cpu_ratios = Vec::new();
    for pass in 0..passes {
        let raw = over_threads(n, threads, &|i, scratch| {
            if compressed[i].len() < PS {
                let t = (i / BATCH) % threads;
                let mut c = streams[t].lock().unwrap();
                c.decompress(&compressed[i], &mut scratch[..PS]).unwrap();
            }
        });
        if let Some(f) = ctl.as_mut() {
            f.write_all(b"enable\n").unwrap();
        }
        let load = over_threads(n, threads, &|i, scratch| {
            let out = &mut scratch[..PS];
            cache.load(slots[i], out).unwrap().expect("held");
            assert!(!verify || out == pages[i], "page {i}");
        });
        if let Some(f) = ctl.as_mut() {
            f.write_all(b"disable\n").unwrap();
        }
        let s = cache.stats();
        assert_eq!(
            (s.stored_pages, s.zero_pages, s.pool_total_size),
            (0, 0, 0),
            "after the loads"
        );
        let mb = |secs: f64| (n * PS) as f64 / secs / 1e6;
        println!(
            "pass {pass}: raw {:.0} MB/s load {:.0} MB/s = {:.3}x; CPU: raw {:.0} MB/s load {:.0} MB/s = {:.3}x",
            mb(raw.0),
            mb(load.0),
            raw.0 / load.0,
            mb(raw.1),
            mb(load.1),
            raw.1 / load.1
        );
        ratios.push(raw.0 / load.0);
        cpu_ratios.push(raw.1 / load.1);
        over_threads(n, threads, &store);
    }
    over_threads(n, threads, &|i, scratch| {
        let out = &mut scratch[..PS];
        cache.load(slots[i], out).unwrap().expect("held");
        assert!(out == pages[i], "page {i}");
    });
    ratios.sort_by(f64::total_cmp);
    cpu_ratios.sort_by(f64::total_cmp);
    println!(
        "{} {} {} threads: median load/raw {:.3} (best {:.3}); per CPU second {:.3}",
        corpus.name,
        alg,
        threads,
        ratios[ratios.len() / 2],
        ratios[ratios.len() - 1],
        cpu_ratios[cpu_ratios.len() / 2]
    );
}
