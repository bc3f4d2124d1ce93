//! Writeback of whole units measured: a corpus stored at 4 and 64 KiB units, every unit
//! written back to a store in memory (page and packed formats), then read back page by page
//! (sequentially, and at random pages), every page checked. One thread, wall time.
//!
//! `cargo run --release -p ztier-zram --example units_writeback -- CORPUS.pages.zst...`
//! (the first 64 MiB of each).

use std::sync::Arc;
use std::time::Instant;

use ztier_base::rng::Rng;
use ztier_blockdev::memory::MemoryDevice;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

const PAGE: usize = 4096;

fn main() {
    println!(
        "| corpus | alg | unit | format | mem before | mem after | store bytes written | store bytes held | writeback s | seq 4K read MB/s | rand 4K read µs (mean) |"
    );
    println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for path in std::env::args().skip(1) {
        let corpus = ztier_corpus::Corpus::load(path.as_ref()).unwrap();
        let bytes = &corpus.bytes()[..corpus.bytes().len().min(64 << 20)];
        let name = std::path::Path::new(&path)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .split('.')
            .next()
            .unwrap()
            .to_string();
        for alg in ["lz4", "zstd"] {
            for unit in [4096usize, 65536] {
                for format in [WbFormat::Page, WbFormat::Packed] {
                    run(&name, bytes, alg, unit, format);
                }
            }
        }
    }
}

fn run(name: &str, bytes: &[u8], alg: &str, unit: usize, format: WbFormat) {
    let units = bytes.len() / unit;
    let data = &bytes[..units * unit];
    let config = if unit == PAGE {
        ZsConfig::default()
    } else {
        ZsConfig::default().with_max_object(unit)
    };
    let pool = Box::new(ZsPool::new(config).unwrap());
    let dev = Device::with_unit_size(data.len() as u64, alg.parse().unwrap(), pool, unit).unwrap();
    for (u, chunk) in data.chunks_exact(unit).enumerate() {
        dev.write_unit(u as u64, chunk).unwrap();
    }
    let before = dev.mm_stat().mem_used_total;
    let store = MemoryDevice::new(Backing::size_for(dev.disksize())).unwrap();
    dev.set_backing(Some(Backing::new(Arc::new(store), format).unwrap()))
        .unwrap();
    let t = Instant::now();
    dev.writeback(PageSelector::All, None, None).unwrap();
    let wb = t.elapsed().as_secs_f64();
    dev.compact();
    let after = dev.mm_stat().mem_used_total;
    let bd = dev.bd_stat().unwrap();
    let mut page = vec![0u8; PAGE];
    let mut wrong = 0;
    let t = Instant::now();
    for p in 0..dev.pages() {
        dev.read_page(p, &mut page).unwrap();
        wrong += usize::from(page[..] != data[p as usize * PAGE..][..PAGE]);
    }
    let seq = data.len() as f64 / t.elapsed().as_secs_f64() / 1e6;
    let mut rng = Rng::new(1);
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        let p = rng.next_u64() % dev.pages();
        dev.read_page(p, &mut page).unwrap();
        wrong += usize::from(page[..] != data[p as usize * PAGE..][..PAGE]);
    }
    let rand = t.elapsed().as_secs_f64() / n as f64 * 1e6;
    assert_eq!(wrong, 0, "wrong pages read");
    println!(
        "| {name} | {alg} | {}K | {format:?} | {before} | {after} | {} | {} | {wb:.3} | {seq:.0} | {rand:.1} |",
        unit / 1024,
        bd.bytes_written,
        bd.bytes_held
    );
}
