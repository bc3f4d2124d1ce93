//! Replaying real memory through ztier's engines, as `ztier bench` (and, later,
//! `ztier swap-bench`) do: the parts a front end would otherwise write again.
//!
//! - [`driver`]: runs a closure over every page of a corpus on N threads, in batches handed
//!   out round robin; times a phase and its reference pass by pass, in turns, keeping the best
//!   of each; a progress line; per-thread reference compression streams.
//! - [`zram`]: one zram run (store, load, verify, discard, compact) with `mm_stat` after each
//!   step, speeds as ratios to the raw compressor measured in the same run, the device's own
//!   memory, and the kernel's figures compared field by field where they apply.
//! - [`zswap`]: the same replay through a zswap cache in front of a swap device, with the
//!   kernel zswap's figures compared.
//! - [`trace`]: a capture over time replayed through zram epoch by epoch (overwrites,
//!   discards, the idle marks, writeback and recompression of idle pages), or through zswap
//!   (swap-outs, swap-ins, frees, its pool limit and shrinker), memory after each.
//! - [`swap_bench`]: threads swapping real pages out and in through zswap over a swap
//!   file, with a working set larger than the pool, the shrinker writing back meanwhile.
//! - [`swap_alloc`]: the swap-slot allocator's lock study: threads allocating and freeing
//!   slots in swap-out and swap-in patterns, in the cluster mode and the legacy mode on the
//!   same seed, with every lock's acquisitions, contention and wait.
#![forbid(unsafe_code)]

pub mod driver;
pub mod swap_alloc;
pub mod swap_bench;
pub mod trace;
pub mod zram;
pub mod zswap;

use ztier_compress::CompressError;
use ztier_corpus::CorpusError;
use ztier_zram::ZramError;

/// What a replay stops on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error("{0}")]
    Corpus(#[from] CorpusError),
    #[error("{0}")]
    Zram(#[from] ZramError),
    #[error("{0}")]
    Compress(#[from] CompressError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Pool(#[from] ztier_pool::PoolError),
    #[error("{0}")]
    Swap(#[from] ztier_swap::SwapError),
    #[error("{0}")]
    Zswap(Box<ztier_zswap::ZswapError>),
    #[error("page {page} of {corpus} read back different from what was written")]
    Mismatch { corpus: String, page: usize },
    #[error("{what} at page {page}: {source}")]
    AtPage {
        what: &'static str,
        page: usize,
        source: Box<ReplayError>,
    },
}

pub type Result<T, E = ReplayError> = std::result::Result<T, E>;
