//! What the region tests share: making a region where userfaultfd is allowed, and page
//! contents that say which page and which version they are.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ztier_uffd::{Error, Region, RegionConfig};

pub const PAGE: usize = 4096;
pub const WORDS: usize = PAGE / 8;

/// A region, or `None` (with the reason printed) where this process may not use
/// userfaultfd; under `CI` that fails instead.
pub fn region(len: usize, budget: usize) -> Option<Region> {
    region_with(len, budget, &RegionConfig::default())
}

/// [`region`], made as `config` says.
pub fn region_with(len: usize, budget: usize, config: &RegionConfig) -> Option<Region> {
    match Region::with_config(len, budget, config) {
        Ok(r) => Some(r),
        Err(e @ (Error::NotPermitted(_) | Error::Unsupported(_))) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI must run the region tests: {e}");
            }
            eprintln!("skipped: {e} (run as root or with vm.unprivileged_userfaultfd=1)");
            None
        }
        Err(e) => panic!("making a region: {e}"),
    }
}

/// Word `w` of page `page` at `version` (0: never written, all zeros). Half the words repeat
/// so the page compresses, half do not.
pub fn word(page: u64, version: u64, w: usize) -> u64 {
    if version == 0 {
        return 0;
    }
    match w {
        0 => page,
        1 => version,
        _ if w.is_multiple_of(2) => page ^ (version << 32),
        _ => {
            let mut x = page
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(version.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
                .wrapping_add(w as u64);
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^ (x >> 32)
        }
    }
}

pub fn write_page(words: &[AtomicU64], page: u64, version: u64) {
    let base = page as usize * WORDS;
    for w in 0..WORDS {
        words[base + w].store(word(page, version, w), Relaxed);
    }
}

/// The first word of page `page` that is not as `version` wrote it, if any.
pub fn check_page(words: &[AtomicU64], page: u64, version: u64) -> Result<(), String> {
    let base = page as usize * WORDS;
    for w in 0..WORDS {
        let got = words[base + w].load(Relaxed);
        let want = word(page, version, w);
        if got != want {
            return Err(format!(
                "page {page} version {version}: word {w} is {got:#x}, want {want:#x}"
            ));
        }
    }
    Ok(())
}
