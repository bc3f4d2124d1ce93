//! `ztier swap-bench`: a zswap cache over a swap file, driven by threads that swap real
//! corpus pages out and in, with a working set larger than the pool, so the pool limit is
//! hit and the shrinker writes back while the threads run.
//!
//! Each thread owns the corpus pages `t, t + N, t + 2N, ...` of the working set, each either
//! resident (in the thread's hands) or swapped out to a slot. An operation is a swap-out of
//! a random resident page (a slot allocated, then `swap_out`) or, less often, a swap-in of
//! a random swapped-out one (`swap_in`, verified against the corpus page; then three times
//! in four the slot is freed, as on a swap-in not kept in the swap cache, and once in four
//! the page is swapped out again to the same slot, a re-store). At the end every page
//! still out is swapped in, verified and freed.

use std::path::PathBuf;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde::Serialize;
use ztier_blockdev::file::FileDevice;
use ztier_compress::Algorithm;
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_swap::lockstat::LockReport;
use ztier_swap::{Config as SwapConfig, Device, Mode};
use ztier_zswap::{Cache, Config, ZswapStats};

use crate::zswap::zswap_err;
use crate::{ReplayError, Result};
use ztier_base::rng::Rng;

/// One run's settings.
#[derive(Debug, Clone)]
pub struct SwapBench {
    pub algorithm: Algorithm,
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub threads: usize,
    /// Operations over all threads.
    pub ops: u64,
    /// The RAM budget the pool limit is a percentage of.
    pub ram_bytes: u64,
    pub max_pool_percent: u32,
    pub accept_threshold_percent: u32,
    pub mode: Mode,
    pub seed: u64,
    /// Where the swap file is made (and removed after).
    pub dir: PathBuf,
}

/// One run's figures (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct SwapBenchReport {
    pub corpus: String,
    pub compressor: String,
    pub verified: bool,
    pub threads: usize,
    pub working_set_pages: u64,
    pub ram_bytes: u64,
    pub max_pool_pages: u64,
    pub ops: u64,
    pub swap_outs: u64,
    pub swap_ins: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub stored_pages: u64,
    pub written_back_pages: u64,
    pub writeback_pages_per_s: f64,
    pub slots_allocated: u64,
    pub device_lock_acquisitions: u64,
    pub device_lock_per_slot: f64,
    pub pool_total_size: u64,
    /// `Zswap` and `Zswapped` in bytes, at the end of the timed operations.
    pub zswap_bytes: u64,
    pub zswapped_bytes: u64,
    /// Highest pool size seen by the threads, against the limit.
    pub pool_peak_bytes: u64,
    pub metadata_bytes_per_page: f64,
    pub zswap: ZswapStats,
    pub locks: Vec<LockReport>,
}

/// A thread's pages: which are swapped out, to which slot.
struct Pages {
    /// Indices into the corpus of the thread's pages.
    mine: Vec<usize>,
    /// `slot[k]`: the slot of `mine[k]`, 0 if resident.
    slot: Vec<u64>,
    resident: Vec<u32>,
    out: Vec<u32>,
}

#[derive(Default)]
struct Tally {
    swap_outs: u64,
    swap_ins: u64,
    pool_peak: u64,
}

impl SwapBench {
    pub fn run(&self, corpus_name: &str, pages: &[&[u8]]) -> Result<SwapBenchReport> {
        if self.threads == 0 || self.ops == 0 {
            return Err(ReplayError::NoThreadsOrOps);
        }
        if pages.len() < self.threads {
            return Err(ReplayError::FewerPagesThanThreads {
                threads: self.threads,
                pages: pages.len(),
            });
        }
        let path = self
            .dir
            .join(format!("ztier-swap-bench-{}.swap", std::process::id()));
        // Every page could be out at once; a tenth more, as a swap device is not run full.
        let slots = (pages.len() as u64 * 11 / 10 + 1).div_ceil(512) * 512 + 512;
        let file = FileDevice::open(&path, slots * ztier_swap::SLOT_BYTES).map_err(|source| {
            ReplayError::SwapFile {
                path: path.clone(),
                source,
            }
        });
        let result = file.and_then(|f| self.run_on(Arc::new(f), corpus_name, pages));
        let _ = std::fs::remove_file(&path);
        result
    }

    fn run_on(
        &self,
        file: Arc<FileDevice>,
        corpus_name: &str,
        pages: &[&[u8]],
    ) -> Result<SwapBenchReport> {
        let swap = Arc::new(Device::new(
            file,
            SwapConfig {
                mode: self.mode,
                ..SwapConfig::default()
            },
        )?);
        let pool = self.allocator.make_pool(&self.layout)?;
        let mut config = Config::new(self.algorithm.clone(), self.ram_bytes);
        config.max_pool_percent = self.max_pool_percent;
        config.accept_threshold_percent = self.accept_threshold_percent;
        let cache = Cache::new(swap.clone(), pool, config).map_err(zswap_err)?;
        let per_thread = self.ops / self.threads as u64;
        let start = Barrier::new(self.threads + 1);
        let (results, seconds, during) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..self.threads)
                .map(|t| {
                    let (cache, start) = (&cache, &start);
                    let seed = self.seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mine: Vec<usize> = (t..pages.len()).step_by(self.threads).collect();
                    s.spawn(move || {
                        start.wait();
                        thread_ops(cache, corpus_name, pages, mine, per_thread, seed)
                    })
                })
                .collect();
            start.wait();
            let began = Instant::now();
            let results: Vec<Result<(Pages, Tally)>> = workers
                .into_iter()
                .map(|w| w.join().expect("bench thread"))
                .collect();
            let seconds = began.elapsed().as_secs_f64();
            (results, seconds, (cache.stats(), swap.stats()))
        });
        let (zswap, device) = during;
        let mut tally = Tally::default();
        let mut held = Vec::new();
        for r in results {
            let (p, t) = r?;
            tally.swap_outs += t.swap_outs;
            tally.swap_ins += t.swap_ins;
            tally.pool_peak = tally.pool_peak.max(t.pool_peak);
            held.push(p);
        }
        // Every page still out comes back as it went.
        let mut page = vec![0u8; ztier_swap::SLOT_BYTES as usize];
        for p in held {
            for &k in &p.out {
                let (index, slot) = (p.mine[k as usize], p.slot[k as usize]);
                cache.swap_in(slot, &mut page).map_err(zswap_err)?;
                if page[..] != *pages[index] {
                    return Err(ReplayError::Mismatch {
                        corpus: corpus_name.into(),
                        page: index,
                    });
                }
                cache.swap_free(slot).map_err(zswap_err)?;
            }
        }
        cache.wait_shrink_idle();
        let end = cache.stats();
        if end.stored_pages + end.zero_pages != 0 || swap.in_use() != 0 {
            return Err(ReplayError::ZswapHoldsPages {
                pages: end.stored_pages + end.zero_pages,
                slots: swap.in_use(),
            });
        }
        swap.check_consistency()
            .map_err(ReplayError::SwapInconsistent)?;
        let slots_allocated: u64 = device
            .per_order
            .iter()
            .map(|o| o.allocations << o.order)
            .sum();
        let device_lock_acquisitions = device
            .locks
            .iter()
            .find(|l| l.name.starts_with("si->lock"))
            .map_or(0, |l| l.acquisitions);
        let ops = per_thread * self.threads as u64;
        let held_pages = (zswap.stored_pages + zswap.zero_pages).max(1);
        Ok(SwapBenchReport {
            corpus: corpus_name.into(),
            compressor: self.algorithm.to_string(),
            verified: true,
            threads: self.threads,
            working_set_pages: pages.len() as u64,
            ram_bytes: self.ram_bytes,
            max_pool_pages: cache.max_pages(),
            ops,
            swap_outs: tally.swap_outs,
            swap_ins: tally.swap_ins,
            seconds,
            ops_per_s: ops as f64 / seconds,
            stored_pages: zswap.stored_pages,
            written_back_pages: zswap.written_back_pages,
            writeback_pages_per_s: zswap.written_back_pages as f64 / seconds,
            slots_allocated,
            device_lock_acquisitions,
            device_lock_per_slot: device_lock_acquisitions as f64 / slots_allocated.max(1) as f64,
            pool_total_size: zswap.pool_total_size,
            zswap_bytes: zswap.zswap_kb * 1024,
            zswapped_bytes: zswap.zswapped_kb * 1024,
            pool_peak_bytes: tally.pool_peak,
            metadata_bytes_per_page: zswap.metadata_bytes as f64 / held_pages as f64,
            zswap,
            locks: device.locks,
        })
    }
}

fn thread_ops(
    cache: &Cache,
    corpus_name: &str,
    pages: &[&[u8]],
    mine: Vec<usize>,
    ops: u64,
    seed: u64,
) -> Result<(Pages, Tally)> {
    let n = mine.len();
    let mut p = Pages {
        slot: vec![0; n],
        resident: (0..n as u32).collect(),
        out: Vec::with_capacity(n),
        mine,
    };
    let mut t = Tally::default();
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; ztier_swap::SLOT_BYTES as usize];
    for op in 0..ops {
        let swap_out = !p.resident.is_empty() && (p.out.is_empty() || rng.below(100) < 55);
        if swap_out {
            let k = p
                .resident
                .swap_remove(rng.below(p.resident.len() as u64) as usize);
            let slot = cache.swap().alloc(0)?;
            cache
                .swap_out(slot, pages[p.mine[k as usize]])
                .map_err(zswap_err)?;
            p.slot[k as usize] = slot;
            p.out.push(k);
            t.swap_outs += 1;
        } else {
            let at = rng.below(p.out.len() as u64) as usize;
            let k = p.out[at];
            let (index, slot) = (p.mine[k as usize], p.slot[k as usize]);
            cache.swap_in(slot, &mut buf).map_err(zswap_err)?;
            t.swap_ins += 1;
            if buf[..] != *pages[index] {
                return Err(ReplayError::Mismatch {
                    corpus: corpus_name.into(),
                    page: index,
                });
            }
            if rng.below(4) == 0 {
                // Dirtied again in the swap cache: out to the same slot.
                cache.swap_out(slot, pages[index]).map_err(zswap_err)?;
                t.swap_outs += 1;
            } else {
                p.out.swap_remove(at);
                cache.swap_free(slot).map_err(zswap_err)?;
                p.slot[k as usize] = 0;
                p.resident.push(k);
            }
        }
        if op % 1024 == 0 {
            t.pool_peak = t.pool_peak.max(cache.pool_bytes());
        }
    }
    Ok((p, t))
}
