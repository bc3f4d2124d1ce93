//! Replaying real memory through ztier's engines, as `ztier bench` and
//! `ztier swap-bench` do: the parts a front end would otherwise write again.
//!
//! - [`driver`]: runs a closure over every page of a corpus on N threads, in batches handed
//!   out round robin; times a phase and its reference pass by pass, in turns, keeping the best
//!   of each; a progress line; per-thread reference compression streams.
//! - [`zram`]: one zram run (store, load, verify, discard, compact) with `mm_stat` after each
//!   step, speeds as ratios to the raw compressor measured in the same run, the device's own
//!   memory, and the kernel's figures compared field by field where they apply.
//! - [`zswap`]: the same replay through a zswap cache in front of a swap device, with the
//!   kernel zswap's figures compared.
//! - [`uffd`]: the same pages in a userfaultfd region under a RAM budget: eviction, fault-in
//!   and single-page fault latency beside the machine's floor and the kernel zswap's own
//!   path, random reads' refaults beside MIN, LRU and CLOCK, the region's memory beside
//!   zram's.
//! - [`uffd_lookups`]: a lookup service over a region (a zipf law whose hot set drifts and
//!   jumps between phases), run with the corpus resident, at a sweep of fixed budgets and
//!   with a budget that sizes itself from a stall target, judged against the best fixed
//!   budget chosen with hindsight.
//! - [`sweep`]: the runs one `ztier bench` asks for over a corpus (allocators × compressors ×
//!   layouts × thread counts, or a trace per allocator and compressor), made one by one as a
//!   caller asks, and the verdict on them against the kernel's figures.
//! - [`trace`]: a capture over time replayed through zram epoch by epoch (overwrites,
//!   discards, the idle marks, writeback and recompression of idle pages), or through zswap
//!   (swap-outs, swap-ins, frees, its pool limit and shrinker), memory after each.
//! - [`far_tier`]: a capture over time replayed at its recorded pace through zram with a
//!   store, its policy writing back at a range of fixed idle ages and at the age a
//!   promotion-rate controller chooses, judged against the best fixed age in hindsight.
//! - [`paced`]: the same judged as a host serves it: the capture in real time, at its
//!   recorded pace, through served devices (NBD exports), each device's policy passing on
//!   the server's clock, the store's figures read from the server.
//! - [`swap_bench`]: threads swapping real pages out and in through zswap over a swap
//!   file, with a working set larger than the pool, the shrinker writing back meanwhile.
//! - [`swap_alloc`]: the swap-slot allocator's lock study: threads allocating and freeing
//!   slots in swap-out and swap-in patterns, in the cluster mode and the legacy mode on the
//!   same seed, with every lock's acquisitions, contention and wait.
#![forbid(unsafe_code)]

pub mod driver;
pub mod far_tier;
pub mod paced;
pub mod swap_alloc;
pub mod swap_bench;
pub mod sweep;
#[cfg(test)]
mod test_traces;
pub mod trace;
pub mod uffd;
pub mod uffd_lookups;
pub mod uffd_units;
pub mod units;
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
    #[error("{corpus}: smaller than one {page_size}-byte page")]
    CorpusTooSmall { corpus: String, page_size: usize },
    #[error(
        "a trace is replayed in {}-byte pages, the pages it was captured in",
        ztier_corpus::CORPUS_PAGE
    )]
    TracePageSize { page_size: usize },
    #[error(
        "zswap needs pages of the swap device's {} bytes, not {page_size}",
        ztier_swap::SLOT_BYTES
    )]
    ZswapPageSize { page_size: usize },
    #[error(
        "the trace names {trace_pages} corpus pages, {corpus} has {corpus_pages}: not the corpus it was captured with"
    )]
    NotTheCorpus {
        trace_pages: u64,
        corpus: String,
        corpus_pages: usize,
    },
    /// A trace built in memory that names a page past its corpus.
    #[error("the trace names corpus page {index}, {corpus} has {corpus_pages}")]
    CorpusPageOutside {
        index: u32,
        corpus: String,
        corpus_pages: usize,
    },
    /// A trace built in memory that breaks the invariants `Trace::read` checks
    /// (`Trace::check_invariants`'s refusal).
    #[error("the trace: {0}")]
    TraceInvalid(ztier_corpus::trace::TraceError),
    /// The replay's pages disagree with a trace that passed `Trace::check_invariants` (a
    /// replay bug, an error rather than a panic).
    #[error("trace epoch {epoch}: page {vpn:#x} {what}")]
    TraceInconsistent {
        epoch: usize,
        vpn: u64,
        what: &'static str,
    },
    #[error("threads and ops must be above zero")]
    NoThreadsOrOps,
    /// A lookup workload (uffd_lookups.rs) whose phases cannot be drawn from.
    #[error("the lookup workload: {0}")]
    BadWorkload(&'static str),
    #[error("{threads} threads for {pages} pages: each thread needs a page at least")]
    FewerPagesThanThreads { threads: usize, pages: usize },
    /// The memory behind a swap device the replay made could not be had.
    #[error("the swap device's backing: {0}")]
    SwapBacking(ztier_blockdev::BlockError),
    /// A pass of the device's policy failed (its error as the policy counted it).
    #[error("the device's policy: {0}")]
    Policy(String),
    /// A paced judgement's devices must include one run by the controller, and one only.
    #[error("a paced judgement needs one device with the controller, given {controllers}")]
    ControllerCount { controllers: usize },
    /// A served device smaller than the pages the trace holds at once.
    #[error("a served device of {bytes} bytes, where the trace needs {need}")]
    ServedTooSmall { bytes: u64, need: u64 },
    /// This device's replay stopped because another device's failed.
    #[error("stopped: another device's replay failed")]
    PacedStopped,
    /// A request to a device served to the replay (an NBD export) failed.
    #[error("the served device: {0}")]
    Served(ztier_blockdev::BlockError),
    /// The file behind a swap device the replay made could not be created.
    #[error("{}: {source}", path.display())]
    SwapFile {
        path: std::path::PathBuf,
        source: ztier_blockdev::BlockError,
    },
    #[error("zswap refused page {page}: {why}")]
    ZswapRefused {
        page: usize,
        why: ztier_zswap::Reject,
    },
    /// Pages or slots held once every page was taken back: a leak.
    #[error("after every page came back, zswap holds {pages} pages and the device {slots} slots")]
    ZswapHoldsPages { pages: u64, slots: u64 },
    #[error("after every page was loaded the cache still holds {pages} pages and {pool_bytes} pool bytes")]
    CacheHoldsPages { pages: u64, pool_bytes: u64 },
    /// zram, beside zswap's load, still held something after a swap-in pass freed every slot.
    #[error(
        "after a swap-in pass freed every slot, zram still holds {pages} pages, {compressed} \
         compressed bytes and {pool_bytes} bytes of pool (mem_used_total)"
    )]
    ZramHoldsPages {
        pages: u64,
        compressed: u64,
        pool_bytes: u64,
    },
    #[error("{slots} slots still in use after every thread let go")]
    SlotsInUse { slots: u64 },
    /// The swap device's own consistency check (`check_consistency`) failed.
    #[error("{0}")]
    SwapInconsistent(ztier_swap::Inconsistency),
    #[error("{0}")]
    Pool(#[from] ztier_pool::PoolError),
    /// A sweep given none of something it runs over.
    #[error("a sweep needs one of its {what} at least")]
    EmptySweep { what: &'static str },
    /// The file a sweep writes idle pages back to could not be opened or sized.
    #[error("the writeback file {}: {source}", path.display())]
    WritebackFile {
        path: std::path::PathBuf,
        source: ztier_blockdev::BlockError,
    },
    /// Runs whose figures differ from the kernel's where they are compared, named
    /// (`CORPUS COMPRESSOR N threads`).
    #[error("different from {reference}: {}", runs.join("; "))]
    DifferentFromKernel {
        reference: &'static str,
        runs: Vec<String>,
    },
    #[error("{0}")]
    Swap(#[from] ztier_swap::SwapError),
    #[error("{0}")]
    Zswap(Box<ztier_zswap::ZswapError>),
    #[error("page {page} of {corpus} read back different from what was written")]
    Mismatch { corpus: String, page: usize },
    /// A trace's page read back different from its last content (remembered by its CRC-32:
    /// the corpus was read on, not held).
    #[error("the page at {vpn:#x} read back different from its last content in {corpus}")]
    MismatchAt { corpus: String, vpn: u64 },
    /// A region page read back different from the corpus's.
    #[error("{corpus}: page {page} word {word} read back {got:#x} from the region {pass}, the corpus has {want:#x}{region_says}")]
    RegionMismatch {
        corpus: String,
        /// When it was read: which pass of the replay.
        pass: &'static str,
        page: usize,
        word: usize,
        got: u64,
        want: u64,
        /// What the region said of pages it lost, if it lost any: `uffd::region_says`.
        region_says: String,
    },
    /// A region page written, pushed out and touched read back something else: a stale copy
    /// served.
    #[error("page {page}: {got:#x} read back after it was written and pushed out, not the {want:#x} written")]
    StaleAfterEviction { page: usize, got: u64, want: u64 },
    /// A region (or the rig beside it) refused what the replay asked: what it was, and why.
    #[error("{what}: {source}")]
    Region {
        what: &'static str,
        source: ztier_uffd::Error,
    },
    /// The kernel's own path for the pages met an error (its absence is no error).
    #[error("{0}")]
    KernelPath(ztier_uffd::rig::pageout::PageoutError),
    /// A region's RSS could not be read.
    #[error("/proc/self/smaps: {0}")]
    Smaps(std::io::Error),
    #[error("{what} at page {page}: {source}")]
    AtPage {
        what: &'static str,
        page: usize,
        source: Box<ReplayError>,
    },
}

pub type Result<T, E = ReplayError> = std::result::Result<T, E>;

/// The median of `values` (reordered), `None` if there are none: the lookups' reference
/// slices, the region's paired rounds.
pub(crate) fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(match values.len() % 2 {
        1 => values[mid],
        _ => (values[mid - 1] + values[mid]) / 2.0,
    })
}
