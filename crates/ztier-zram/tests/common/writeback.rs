//! What the writeback tests (`writeback.rs`, `segment_reads.rs`, `store_change.rs`) share:
//! a device, its pages (text-like, compressible, different per seed), a store in a file,
//! and the fill and the check of every page.

use std::path::PathBuf;
use std::sync::Arc;

use ztier_base::rng::Rng;
use ztier_blockdev::file::FileDevice;
use ztier_compress::Algorithm;
use ztier_pool::{ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, WbFormat};

pub const PS: usize = 4096;

pub fn device(pages: u64, alg: &str) -> Device {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    Device::new(
        pages * PS as u64,
        alg.parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap()
}

/// Text-like, compressible, different per seed; every 8th page random, every 16th zero.
pub fn page(seed: u64) -> Vec<u8> {
    if seed.is_multiple_of(16) {
        return vec![0; PS];
    }
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(PS);
    let words = [&b"alpha "[..], b"beta ", b"gamma ", b"delta ", b"epsilon "];
    while out.len() < PS {
        let x = rng.next_u64();
        if seed % 8 == 7 {
            out.extend_from_slice(&x.to_le_bytes());
        } else {
            out.extend_from_slice(words[(x % 5) as usize]);
            out.push((x >> 8) as u8);
        }
    }
    out.truncate(PS);
    out
}

pub fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-zram-wb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

pub fn file_store(name: &str, bytes: u64, format: WbFormat) -> Backing {
    let file = FileDevice::open(&temp(name), bytes).unwrap();
    Backing::new(Arc::new(file), format).unwrap()
}

pub fn fill(dev: &Device, n: u64) {
    for i in 0..n {
        dev.write_page(i, &page(i)).unwrap();
    }
}

pub fn verify(dev: &Device, n: u64, changed: impl Fn(u64) -> Option<Vec<u8>>) {
    let mut out = vec![0u8; PS];
    for i in 0..n {
        dev.read_page(i, &mut out).unwrap();
        let want = changed(i).unwrap_or_else(|| page(i));
        assert!(out == want, "page {i}");
    }
}
