//! One zswap replay (`ztier bench --front zswap`): a corpus swapped out in order into a fresh
//! zswap cache in front of a swap device (every page given a slot first, as the kernel's
//! swap layer does), then swapped back in and verified; zswap's counters after the
//! swap-out, store and load speeds as ratios to the raw compressor and decompressor on the
//! same pages and threads in the same run, and the kernel zswap's figures
//! (`zswap-truth.json`) compared where they apply; and, after the load, zram on the same
//! pages and threads: its reads, and its swap-in (each page read, then its slot freed at
//! once), so that a load that frees its object (zswap's, which puts its frees off in batches,
//! and zram's swap-in, which frees each one as the kernel does) is seen beside one that frees
//! nothing.
//!
//! The kernel's figures were taken with one process swapping its pages out in order, on
//! zsmalloc at the kernel's chain size, with no pool limit reached and no writeback; the
//! replay does the same (its pool limit is out of reach). With more than one thread the
//! pool's layout differs, so `pool_total_size` and `Zswap` are shown, not compared.

use std::sync::Arc;

use serde::Serialize;
use ztier_blockdev::memory::MemoryDevice;
use ztier_compress::{worst_case_len, Algorithm};
use ztier_corpus::{Corpus, ZswapTruth};
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zswap::{Cache, Config, Placement, ZswapStats};

use crate::driver::{
    at, best_of_fresh_pairs, best_of_pairs, compress_all, for_each_page, mb_s, pages_of,
    passes_for, round1, round3, Progress, ReferenceStreams,
};
use crate::zram::FieldComparison;
use crate::{ReplayError, Result};

/// What to replay.
#[derive(Debug, Clone)]
pub struct ZswapReplay {
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub algorithm: Algorithm,
    pub threads: u16,
    pub progress: bool,
}

/// One run's results (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct ZswapRun {
    pub corpus: String,
    pub pages: u64,
    pub page_size: usize,
    pub allocator: &'static str,
    pub compressor: String,
    pub chain_size: usize,
    pub threads: u16,
    /// The counters after the swap-out, under the kernel's names.
    pub zswap: ZswapStats,
    /// zswap's own metadata (index and LRU) per stored page.
    pub metadata_bytes_per_page: f64,
    pub store_mb_s: f64,
    pub load_mb_s: f64,
    pub raw_compress_mb_s: f64,
    pub raw_decompress_mb_s: f64,
    pub store_vs_raw: f64,
    pub load_vs_raw: f64,
    /// zram's plain reads of the same pages, allocator and threads, in the same run (after
    /// zswap's load, not in turn with it; nothing freed).
    pub zram_read_mb_s: f64,
    /// zram's swap-in of the same pages: each page read and its slot freed at once, as the
    /// kernel's swap-in from a zram swap device frees it (since 6.15, which dropped the swap
    /// slot cache that batched those frees: `swap_free` → `zram_slot_free_notify`) for a page
    /// mapped once. Each free waits for the class's readers (zswap's load puts its frees off
    /// in batches of 32 and passes over a class another thread holds).
    pub zram_swapin_mb_s: f64,
    pub verified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<ZswapComparison>,
}

/// The kernel zswap's figures for the same corpus and compressor, and the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct ZswapComparison {
    pub release: String,
    pub truth: ZswapTruth,
    pub fields: Vec<FieldComparison>,
    pub equal: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Fields that depend on the order objects were allocated in.
const LAYOUT_FIELDS: [&str; 2] = ["pool_total_size", "Zswap"];

impl ZswapReplay {
    pub fn run(&self, corpus: &Corpus, truth: Option<&ZswapTruth>) -> Result<ZswapRun> {
        self.layout
            .validate()
            .map_err(ztier_pool::PoolError::from)?;
        let ps = self.layout.page_size;
        if ps as u64 != ztier_swap::SLOT_BYTES {
            return Err(ReplayError::ZswapPageSize { page_size: ps });
        }
        let pages = pages_of(corpus, ps)?;
        let bytes = pages.len() * ps;
        let alg = &self.algorithm;
        let threads = self.threads;
        let passes = passes_for(bytes);
        let total = (pages.len() * passes * 2) as u64;
        let streams = ReferenceStreams::default();
        // A device with a slot for every page (slot 0 is the header), the cache's limit out
        // of reach; the slots are given out in order before the swap-out, as a process's
        // pages get theirs.
        let make_cache = || -> Result<(Cache, Vec<u64>)> {
            let slots = (pages.len() as u64 + 1).div_ceil(512) * 512;
            let backing =
                Arc::new(MemoryDevice::new(slots * ps as u64).map_err(ReplayError::SwapBacking)?);
            let swap = Arc::new(ztier_swap::Device::new(backing, Default::default())?);
            let pool = self.allocator.make_pool(&self.layout)?;
            let mut config = Config::new(alg.clone(), u64::MAX / 128);
            config.shrink_worker = false;
            let cache = Cache::new(swap.clone(), pool, config).map_err(zswap_err)?;
            let slots = (0..pages.len())
                .map(|_| swap.alloc(0))
                .collect::<Result<Vec<u64>, _>>()?;
            Ok((cache, slots))
        };
        let store_all = |cache: &Cache, slots: &[u64], progress: &Progress| {
            for_each_page(&pages, threads, progress, |i, page, _| {
                match cache.store(slots[i], page).map_err(zswap_err) {
                    Ok(Placement::Zswap | Placement::Zero) => Ok(()),
                    Ok(Placement::Device(why)) => Err(ReplayError::ZswapRefused { page: i, why }),
                    Err(e) => Err(at("storing", i, e)),
                }
            })
        };

        // Store, against the raw compressor on the same pages and threads, a fresh cache a
        // pass; the last one goes on.
        let progress = Progress::new("store", total, self.progress);
        let (raw_compress_s, store_s, (cache, slots)) = best_of_fresh_pairs(
            passes,
            &mut || make_cache(),
            &mut || {
                for_each_page(&pages, threads, &progress, |_, page, scratch| {
                    scratch.resize(worst_case_len(ps), 0);
                    streams.with(alg, |c| c.compress(page, scratch))?;
                    Ok(())
                })
            },
            &mut |(c, slots): &(Cache, Vec<u64>)| store_all(c, slots, &progress),
        )?;
        progress.finish();
        let zswap = cache.stats();

        // Load (which frees each entry: the kernel's loads are exclusive), against the raw
        // decompressor on the same objects; the pages swapped out again, untimed, before the
        // next pass. As zram's timed reads, the timed loads compare nothing (a compare with
        // the corpus page, which is not in cache, cost a fifth of a load pass); a last pass,
        // untimed, loads and verifies every page.
        let compressed = compress_all(&pages, alg)?;
        let progress = Progress::new("load", total, self.progress);
        let mut first = true;
        let (raw_decompress_s, load_s) = best_of_pairs(
            passes,
            &mut || {
                for_each_page(&pages, threads, &progress, |i, _, scratch| {
                    scratch.resize(ps, 0);
                    if compressed[i].len() < ps {
                        streams.with(alg, |c| c.decompress(&compressed[i], scratch))?;
                    }
                    Ok(())
                })
            },
            &mut || {
                if !std::mem::take(&mut first) {
                    store_all(&cache, &slots, &Progress::new("", 0, false))?;
                }
                for_each_page(&pages, threads, &progress, |i, _, scratch| {
                    scratch.resize(ps, 0);
                    match cache.load(slots[i], scratch).map_err(zswap_err) {
                        Ok(Some(_)) => Ok(()),
                        Ok(None) => Err(ReplayError::Mismatch {
                            corpus: corpus.name.clone(),
                            page: i,
                        }),
                        Err(e) => Err(at("loading", i, e)),
                    }
                })
            },
        )?;
        progress.finish();
        store_all(&cache, &slots, &Progress::new("", 0, false))?;
        for_each_page(
            &pages,
            threads,
            &Progress::new("", 0, false),
            |i, page, scratch| {
                scratch.resize(ps, 0);
                match cache.load(slots[i], scratch).map_err(zswap_err) {
                    Ok(Some(_)) if scratch[..] == *page => Ok(()),
                    Ok(_) => Err(ReplayError::Mismatch {
                        corpus: corpus.name.clone(),
                        page: i,
                    }),
                    Err(e) => Err(at("verifying", i, e)),
                }
            },
        )?;
        let after = cache.stats();
        if after.stored_pages + after.zero_pages != 0 || after.pool_total_size != 0 {
            return Err(ReplayError::CacheHoldsPages {
                pages: after.stored_pages + after.zero_pages,
                pool_bytes: after.pool_total_size,
            });
        }

        let (zram_read_s, zram_swapin_s) = self.zram_beside(&pages, passes, total)?;

        let (raw_c, raw_d) = (mb_s(bytes, raw_compress_s), mb_s(bytes, raw_decompress_s));
        let (store, load) = (mb_s(bytes, store_s), mb_s(bytes, load_s));
        let metadata_bytes_per_page =
            zswap.metadata_bytes as f64 / (zswap.stored_pages + zswap.zero_pages).max(1) as f64;
        let mut run = ZswapRun {
            corpus: corpus.name.clone(),
            pages: pages.len() as u64,
            page_size: ps,
            allocator: self.allocator.name(),
            compressor: alg.to_string(),
            chain_size: self.layout.chain_size,
            threads,
            zswap,
            metadata_bytes_per_page: (metadata_bytes_per_page * 10.0).round() / 10.0,
            store_mb_s: round1(store),
            load_mb_s: round1(load),
            raw_compress_mb_s: round1(raw_c),
            raw_decompress_mb_s: round1(raw_d),
            store_vs_raw: round3(store / raw_c),
            load_vs_raw: round3(load / raw_d),
            zram_read_mb_s: round1(mb_s(bytes, zram_read_s)),
            zram_swapin_mb_s: round1(mb_s(bytes, zram_swapin_s)),
            verified: true,
            kernel: None,
        };
        run.kernel = truth.and_then(|t| self.compare(t, &run));
        Ok(run)
    }

    /// zram on the same pages, allocator, compressor and threads: the best times of its
    /// reads and of its swap-in (each page read, then its slot freed), the two taken in
    /// turn, the pages written again (untimed) after each swap-in but the last. zram's
    /// reads free nothing; its swap-in frees every object at once, under the object's class
    /// lock, as the kernel's zram does: beside zswap's load (its frees put off and batched),
    /// what the frees, and the way they are made, cost two loaders.
    fn zram_beside(&self, pages: &[&[u8]], passes: usize, total: u64) -> Result<(f64, f64)> {
        let ps = self.layout.page_size;
        let threads = self.threads;
        let pool = self.allocator.make_pool(&self.layout)?;
        let dev = ztier_zram::Device::new((pages.len() * ps) as u64, self.algorithm.clone(), pool)?;
        let quiet = Progress::new("", 0, false);
        let write_all = || {
            for_each_page(pages, threads, &quiet, |i, page, _| {
                dev.write_page(i as u64, page)
                    .map_err(|e| at("writing", i, e))
            })
        };
        let read = |i: usize, scratch: &mut Vec<u8>| {
            scratch.resize(ps, 0);
            dev.read_page(i as u64, scratch)
                .map_err(|e| at("reading", i, e))
        };
        write_all()?;
        let progress = Progress::new("zram", total, self.progress);
        let (mut best_read, mut best_swapin) = (f64::INFINITY, f64::INFINITY);
        for pass in 1..=passes.max(1) {
            let t = for_each_page(pages, threads, &progress, |i, _, scratch| read(i, scratch))?;
            best_read = best_read.min(t);
            let t = for_each_page(pages, threads, &progress, |i, _, scratch| {
                read(i, scratch)?;
                dev.discard_page(i as u64).map_err(|e| at("freeing", i, e))
            })?;
            best_swapin = best_swapin.min(t);
            let left = dev.mm_stat();
            if left.orig_data_size != 0 || left.compr_data_size != 0 || left.mem_used_total != 0 {
                return Err(ReplayError::ZramHoldsPages {
                    pages: left.orig_data_size / ps as u64,
                    compressed: left.compr_data_size,
                    pool_bytes: left.mem_used_total,
                });
            }
            if pass < passes.max(1) {
                write_all()?;
            }
        }
        progress.finish();
        Ok((best_read, best_swapin))
    }

    /// The kernel's figures beside the run's, if they describe this configuration.
    fn compare(&self, truth: &ZswapTruth, run: &ZswapRun) -> Option<ZswapComparison> {
        if self.allocator != AllocatorKind::Zsmalloc
            || self.layout != ZsConfig::default()
            || self.algorithm.level.is_some()
        {
            return None;
        }
        let z = &run.zswap;
        let mut notes = Vec::new();
        if self.threads > 1 {
            notes.push(format!(
                "{} threads lay objects out in another order than the kernel's one process: \
                 {} shown, not compared",
                self.threads,
                LAYOUT_FIELDS.join(", ")
            ));
        }
        let pairs = [
            ("stored_pages", z.stored_pages, truth.stored_pages),
            (
                "stored_incompressible_pages",
                z.stored_incompressible_pages,
                truth.stored_incompressible_pages,
            ),
            ("pool_total_size", z.pool_total_size, truth.pool_total_size),
            (
                "written_back_pages",
                z.written_back_pages,
                truth.written_back_pages,
            ),
            ("Zswap", z.zswap_kb, truth.zswap_kb),
            ("Zswapped", z.zswapped_kb, truth.zswapped_kb),
            ("zero-filled pages", z.zero_pages, truth.zero_pages),
        ];
        let fields: Vec<FieldComparison> = pairs
            .into_iter()
            .map(|(field, ztier, kernel)| FieldComparison {
                after: "swap-out",
                field,
                ztier,
                kernel,
                compared: self.threads == 1 || !LAYOUT_FIELDS.contains(&field),
            })
            .collect();
        let equal = fields.iter().all(|f| !f.compared || f.ztier == f.kernel);
        Some(ZswapComparison {
            release: truth.kernel.clone(),
            truth: truth.clone(),
            fields,
            equal,
            notes,
        })
    }
}

pub(crate) fn zswap_err(e: ztier_zswap::ZswapError) -> ReplayError {
    ReplayError::Zswap(Box::new(e))
}
