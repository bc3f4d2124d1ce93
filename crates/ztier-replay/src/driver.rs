//! The replay driver: pages over threads, paired timing, progress, reference streams.
//!
//! Threads take batches of [`BATCH_PAGES`] round robin (thread t takes batches t, t + N, ...),
//! so one thread replays the pages in corpus order, as the kernel's one `dd` writer does.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ztier_base::shard::Shards;
use ztier_compress::{worst_case_len, Algorithm, CompressError, Compressor};

use crate::{ReplayError, Result};

/// Pages a thread takes at a time (1 MiB at 4 KiB pages, as `dd bs=1M`).
pub const BATCH_PAGES: usize = 256;

/// Runs `f(page_index, page, scratch)` over all pages on `threads` threads; returns the
/// seconds taken. The first error stops the thread that met it and is returned.
pub fn for_each_page<F>(pages: &[&[u8]], threads: u16, progress: &Progress, f: F) -> Result<f64>
where
    F: Fn(usize, &[u8], &mut Vec<u8>) -> Result<()> + Sync,
{
    let threads = usize::from(threads.max(1));
    let start = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || -> Result<()> {
                    let mut scratch = Vec::new();
                    let mut batch = t;
                    while batch * BATCH_PAGES < pages.len() {
                        let lo = batch * BATCH_PAGES;
                        let hi = (lo + BATCH_PAGES).min(pages.len());
                        for (i, page) in pages[lo..hi].iter().enumerate() {
                            f(lo + i, page, &mut scratch)?;
                        }
                        progress.add((hi - lo) as u64);
                        batch += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("replay worker panicked"))
    })?;
    Ok(start.elapsed().as_secs_f64())
}

/// The corpus's pages of `page_size` bytes; a corpus smaller than one is an error.
pub fn pages_of(corpus: &ztier_corpus::Corpus, page_size: usize) -> Result<Vec<&[u8]>> {
    let pages: Vec<&[u8]> = corpus.chunks(page_size).collect();
    if pages.is_empty() {
        return Err(ReplayError::CorpusTooSmall {
            corpus: corpus.name.clone(),
            page_size,
        });
    }
    Ok(pages)
}

/// Passes of each timed phase for `bytes` of pages: at least five, more for short corpora
/// (up to 64 MiB replayed), at most ten.
pub fn passes_for(bytes: usize) -> usize {
    (64usize << 20).div_ceil(bytes.max(1)).clamp(5, 10)
}

/// Times `phase` against `reference` over `passes` pairs, taking turns, so that a
/// disturbance lasting several passes slows both; returns the best (reference, phase)
/// seconds, so one disturbed pass on a shared machine decides nothing.
pub fn best_of_pairs(
    passes: usize,
    reference: &mut dyn FnMut() -> Result<f64>,
    phase: &mut dyn FnMut() -> Result<f64>,
) -> Result<(f64, f64)> {
    let (mut best_ref, mut best_phase) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..passes.max(1) {
        best_ref = best_ref.min(reference()?);
        best_phase = best_phase.min(phase()?);
    }
    Ok((best_ref, best_phase))
}

/// [`best_of_pairs`] for a phase that needs a fresh `T` each pass (a device to store into):
/// each pass makes one before its reference runs, as a device is set up before it is
/// written, and drops the last pass's first. Returns the best times and the last `T`.
pub fn best_of_fresh_pairs<T>(
    passes: usize,
    make: &mut dyn FnMut() -> Result<T>,
    reference: &mut dyn FnMut() -> Result<f64>,
    phase: &mut dyn FnMut(&T) -> Result<f64>,
) -> Result<(f64, f64, T)> {
    let (mut best_ref, mut best_phase) = (f64::INFINITY, f64::INFINITY);
    let mut last = None;
    for _ in 0..passes.max(1) {
        drop(last.take());
        let fresh = make()?;
        best_ref = best_ref.min(reference()?);
        best_phase = best_phase.min(phase(&fresh)?);
        last = Some(fresh);
    }
    Ok((best_ref, best_phase, last.expect("at least one pass")))
}

/// A progress bar on stderr, drawn only when stderr is a terminal and the work is long.
pub struct Progress {
    label: &'static str,
    total: u64,
    done: AtomicU64,
    enabled: bool,
}

impl Progress {
    pub fn new(label: &'static str, total: u64, wanted: bool) -> Progress {
        Progress {
            label,
            total,
            done: AtomicU64::new(0),
            enabled: wanted && std::io::stderr().is_terminal() && total >= 16 * 1024,
        }
    }

    pub fn add(&self, n: u64) {
        let before = self.done.fetch_add(n, Ordering::Relaxed);
        let step = (self.total / 50).max(1);
        if self.enabled && (before / step) != ((before + n) / step) {
            let pct = ((before + n) * 100 / self.total.max(1)).min(100);
            eprint!(
                "\r  {:<8} [{:<50}] {pct:>3}%",
                self.label,
                "#".repeat((pct / 2) as usize)
            );
        }
    }

    pub fn finish(&self) {
        if self.enabled {
            eprint!("\r{:80}\r", "");
        }
    }
}

/// Reference compression streams, one per thread shard (the same sharding zram's own
/// streams use), for measuring the raw compressor on the threads that replay.
#[derive(Default)]
pub struct ReferenceStreams {
    shards: Shards<Option<(Algorithm, Box<dyn Compressor>)>>,
}

impl ReferenceStreams {
    /// Runs `f` on this thread's stream for `alg`, made on first use.
    pub fn with<T>(
        &self,
        alg: &Algorithm,
        f: impl FnOnce(&mut dyn Compressor) -> Result<T, CompressError>,
    ) -> Result<T, CompressError> {
        let mut shard = self.shards.local();
        if shard.as_ref().is_none_or(|(a, _)| a != alg) {
            *shard = Some((alg.clone(), alg.new_compressor()));
        }
        let (_, c) = shard.as_mut().expect("set above");
        f(c.as_mut())
    }
}

/// An error at one page.
pub fn at(what: &'static str, page: usize, e: impl Into<ReplayError>) -> ReplayError {
    ReplayError::AtPage {
        what,
        page,
        source: Box::new(e.into()),
    }
}

/// Every page compressed with one stream (the objects a load phase's reference decompresses).
pub fn compress_all(pages: &[&[u8]], alg: &Algorithm) -> Result<Vec<Vec<u8>>> {
    let mut c = alg.new_compressor();
    let mut buf = vec![0; worst_case_len(pages.first().map_or(0, |p| p.len()))];
    pages
        .iter()
        .map(|p| {
            let n = c.compress(p, &mut buf)?;
            Ok(buf[..n].to_vec())
        })
        .collect()
}

pub fn mb_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_page_is_visited_once_in_batches_round_robin() {
        let data = vec![0u8; 1000 * 8];
        let pages: Vec<&[u8]> = data.chunks(8).collect();
        let seen: Vec<AtomicU64> = (0..1000).map(|_| AtomicU64::new(0)).collect();
        let progress = Progress::new("test", 1000, false);
        for threads in [1, 3] {
            for_each_page(&pages, threads, &progress, |i, _, _| {
                seen[i].fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
        }
        assert!(seen.iter().all(|n| n.load(Ordering::Relaxed) == 2));
    }

    #[test]
    fn the_first_error_is_returned() {
        let data = vec![0u8; 600 * 8];
        let pages: Vec<&[u8]> = data.chunks(8).collect();
        let progress = Progress::new("test", 600, false);
        let r = for_each_page(&pages, 2, &progress, |i, _, _| {
            if i == 300 {
                Err(crate::ReplayError::SlotsInUse { slots: 300 })
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(crate::ReplayError::SlotsInUse { .. })));
    }
}
