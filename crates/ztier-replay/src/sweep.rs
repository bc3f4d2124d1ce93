//! Sweeps: the runs one `ztier bench` asks for over one corpus, in the order they are made,
//! each handed to the caller as it finishes (so a report is printed while the next run
//! goes), and the verdict on them all against the kernel's figures.
//!
//! A sweep is every allocator × compressor × pool layout × thread count. Chain sizes are
//! zsmalloc's: another allocator runs the first layout only. A trace is replayed once per
//! allocator × compressor, on the first layout, one thread. zswap runs one layout; its thread
//! counts for one allocator and compressor come one after another, the first count first (a
//! reader sets each count's figures against the first's). Compression units: every
//! compressor × unit size. A region: every compressor with clean pages kept and not, after
//! the kernel's own path for the corpus, measured once.
//!
//! The runs are made lazily: an iterator's `next` is one whole replay. Nothing here prints
//! a report (a replay draws its progress bar on a terminal when the sweep says so).

use std::sync::Arc;

use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_corpus::trace::Trace;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_pool::{AllocatorKind, PoolError, ZsConfig};
use ztier_zram::{Backing, MmStat, WbFormat};

use crate::trace::{CorpusPages, TraceReplay, TraceRun, ZswapTraceReplay, ZswapTraceRun};
use crate::uffd::{kernel_path, UffdReplay, UffdRun};
use crate::uffd_units::UnitFaultIn;
use crate::units::{UnitReplay, UnitRun};
use crate::zram::{WritebackTarget, ZramReplay, ZramRun};
use crate::zswap::{ZswapReplay, ZswapRun};
use crate::{ReplayError, Result};

/// What a sweep spans.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub allocators: Vec<AllocatorKind>,
    pub compressors: Vec<Algorithm>,
    /// The pool layouts, the first the one every allocator runs (see [`Sweep::layouts`]).
    pub layouts: Vec<ZsConfig>,
    pub threads: Vec<u16>,
    /// Draw progress bars on a terminal.
    pub progress: bool,
}

/// One run of a sweep.
#[derive(Debug, Clone)]
struct Point {
    allocator: AllocatorKind,
    layout: ZsConfig,
    algorithm: Algorithm,
    threads: u16,
}

impl Sweep {
    /// `layout`, or `layout` with each of `chain_sizes` in place of its own chain size; each
    /// checked.
    pub fn layouts(layout: ZsConfig, chain_sizes: &[u8]) -> Result<Vec<ZsConfig>> {
        let layouts = if chain_sizes.is_empty() {
            vec![layout]
        } else {
            chain_sizes
                .iter()
                .map(|&chain| ZsConfig {
                    chain_size: usize::from(chain),
                    ..layout
                })
                .collect()
        };
        for layout in &layouts {
            layout.validate().map_err(PoolError::from)?;
        }
        Ok(layouts)
    }

    /// The first layout: the one every allocator runs.
    fn first_layout(&self) -> Result<ZsConfig> {
        let layout = *self.layouts.first().ok_or(ReplayError::EmptySweep {
            what: "pool layouts",
        })?;
        layout.validate().map_err(PoolError::from)?;
        Ok(layout)
    }

    /// Every run, in order: allocator, then compressor, then layout, then thread count.
    fn points(&self) -> Result<Vec<Point>> {
        self.first_layout()?;
        let mut points = Vec::new();
        for &allocator in &self.allocators {
            let layouts = if allocator == AllocatorKind::Zsmalloc {
                &self.layouts[..]
            } else {
                &self.layouts[..1]
            };
            for algorithm in &self.compressors {
                for &layout in layouts {
                    for &threads in &self.threads {
                        points.push(Point {
                            allocator,
                            layout,
                            algorithm: algorithm.clone(),
                            threads,
                        });
                    }
                }
            }
        }
        Ok(points)
    }

    /// Every allocator × compressor, once each (a trace's runs).
    fn pairs(&self) -> impl Iterator<Item = (AllocatorKind, Algorithm)> + '_ {
        self.allocators.iter().flat_map(move |&allocator| {
            self.compressors
                .iter()
                .map(move |algorithm| (allocator, algorithm.clone()))
        })
    }
}

/// Where a sweep's zram runs write idle pages back to.
#[derive(Clone)]
pub enum WritebackStore {
    /// A file, made (sparse) or grown to fit each corpus.
    File(std::path::PathBuf),
    /// A block device already open (an NBD export, say), and what to call it in a report.
    Device {
        store: Arc<dyn BlockDevice>,
        name: String,
    },
}

impl std::fmt::Debug for WritebackStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WritebackStore::File(path) => write!(f, "file:{}", path.display()),
            WritebackStore::Device { name, .. } => f.write_str(name),
        }
    }
}

/// The store and the layout of written-back pages.
#[derive(Debug, Clone)]
pub struct WritebackPlan {
    pub store: WritebackStore,
    pub format: WbFormat,
}

impl WritebackPlan {
    /// The store opened for a corpus of `pages` pages.
    pub fn target_for(&self, pages: u64) -> Result<WritebackTarget> {
        let store: Arc<dyn BlockDevice> = match &self.store {
            WritebackStore::File(path) => {
                let bytes = Backing::size_for(pages * ztier_swap::SLOT_BYTES);
                let file =
                    ztier_blockdev::file::FileDevice::open(path, bytes).map_err(|source| {
                        ReplayError::WritebackFile {
                            path: path.clone(),
                            source,
                        }
                    })?;
                Arc::new(file)
            }
            WritebackStore::Device { store, .. } => store.clone(),
        };
        Ok(WritebackTarget {
            store,
            format: self.format,
            // `file:PATH` or the device's name, as the plan shows it.
            name: format!("{:?}", self.store),
        })
    }
}

/// A sweep through zram.
#[derive(Debug, Clone)]
pub struct ZramSweep {
    pub sweep: Sweep,
    /// After the write, discard every odd page, then compact.
    pub discard_odd: bool,
    /// Keep the allocator's table after the write.
    pub allocator_stats: bool,
    /// Recompress with this secondary algorithm after the write (and, with a trace, the
    /// idle pages at each turn of the policy).
    pub recompress: Option<Algorithm>,
    /// Write idle pages back here.
    pub writeback: Option<WritebackPlan>,
}

impl ZramSweep {
    /// Every run over `corpus`, each replayed when asked for. The kernel's figures (the
    /// corpus's truth file) and the writeback store are read and opened first.
    pub fn runs<'a>(
        &'a self,
        corpus: &'a Corpus,
    ) -> Result<impl Iterator<Item = Result<ZramRun>> + 'a> {
        let truth = corpus.truth::<MmStat>()?;
        let writeback = self.writeback_for(corpus)?;
        let points = self.sweep.points()?;
        Ok(points.into_iter().map(move |p| {
            ZramReplay {
                allocator: p.allocator,
                layout: p.layout,
                algorithm: p.algorithm,
                threads: p.threads,
                discard_odd: self.discard_odd,
                allocator_stats: self.allocator_stats,
                progress: self.sweep.progress,
                recompress: self.recompress.clone(),
                writeback: writeback.clone(),
            }
            .run(corpus, truth.as_ref())
        }))
    }

    /// `trace` over its corpus (read whole or on) once for every allocator × compressor,
    /// the policy every `idle_epochs` epochs.
    pub fn traces<'a>(
        &'a self,
        corpus: CorpusPages<'a>,
        trace: &'a Trace,
        idle_epochs: u32,
    ) -> Result<impl Iterator<Item = Result<TraceRun>> + 'a> {
        let layout = self.sweep.first_layout()?;
        // The store as large as the corpus the trace names (pages present are fewer).
        let writeback = self
            .writeback
            .as_ref()
            .map(|plan| plan.target_for(trace.corpus_pages()))
            .transpose()?;
        Ok(self.sweep.pairs().map(move |(allocator, algorithm)| {
            TraceReplay {
                allocator,
                layout,
                algorithm,
                recompress: self.recompress.clone(),
                writeback: writeback.clone(),
                idle_epochs,
            }
            .run_over(&corpus, trace)
        }))
    }

    fn writeback_for(&self, corpus: &Corpus) -> Result<Option<WritebackTarget>> {
        self.writeback
            .as_ref()
            .map(|plan| plan.target_for(corpus.pages() as u64))
            .transpose()
    }
}

/// A sweep through zswap (one layout: the first).
#[derive(Debug, Clone)]
pub struct ZswapSweep {
    pub sweep: Sweep,
}

impl ZswapSweep {
    /// Every run over `corpus`, each replayed when asked for, with the kernel zswap's
    /// figures for its compressor where the corpus has them.
    pub fn runs<'a>(
        &'a self,
        corpus: &'a Corpus,
    ) -> Result<impl Iterator<Item = Result<ZswapRun>> + 'a> {
        let layout = self.sweep.first_layout()?;
        let points = self
            .sweep
            .points()?
            .into_iter()
            .filter(move |p| p.layout == layout);
        Ok(points.map(move |p| {
            let truth = corpus.zswap_truth(p.algorithm.kind.name())?;
            ZswapReplay {
                allocator: p.allocator,
                layout: p.layout,
                algorithm: p.algorithm,
                threads: p.threads,
                progress: self.sweep.progress,
            }
            .run(corpus, truth.as_ref())
        }))
    }

    /// `trace` over its corpus (read whole or on) once for every allocator × compressor, zswap's pool limit
    /// `max_pool_percent` of `ram_bytes`.
    pub fn traces<'a>(
        &'a self,
        corpus: &'a CorpusPages<'a>,
        trace: &'a Trace,
        ram_bytes: u64,
        max_pool_percent: u32,
    ) -> Result<impl Iterator<Item = Result<ZswapTraceRun>> + 'a> {
        let layout = self.sweep.first_layout()?;
        Ok(self.sweep.pairs().map(move |(allocator, algorithm)| {
            ZswapTraceReplay {
                allocator,
                layout,
                algorithm,
                ram_bytes,
                max_pool_percent,
            }
            .run_over(corpus, trace)
        }))
    }
}

/// Every allocator × compressor × unit size over a corpus, one thread (see
/// [`crate::units`]).
#[derive(Debug, Clone)]
pub struct UnitSweep {
    pub layout: ZsConfig,
    /// Each allocator in turn, under every compressor and unit size.
    pub allocators: Vec<AllocatorKind>,
    pub compressors: Vec<Algorithm>,
    /// Bytes per unit, each run in turn.
    pub unit_sizes: Vec<usize>,
    /// Random page reads timed one by one in each run.
    pub random_reads: usize,
}

impl UnitSweep {
    /// Every run over `corpus`, each made when asked for.
    pub fn runs<'a>(&'a self, corpus: &'a Corpus) -> impl Iterator<Item = Result<UnitRun>> + 'a {
        self.allocators.iter().flat_map(move |&allocator| {
            self.compressors.iter().flat_map(move |algorithm| {
                self.unit_sizes.iter().map(move |&unit_size| {
                    UnitReplay {
                        layout: self.layout,
                        allocator,
                        algorithm: algorithm.clone(),
                        unit_size,
                        random_reads: self.random_reads,
                    }
                    .run(corpus)
                })
            })
        })
    }
}

/// Every compressor through a userfaultfd region, with clean pages kept and not, beside the
/// kernel's own path for the corpus (see [`crate::uffd`]).
#[derive(Debug, Clone)]
pub struct UffdSweep {
    pub compressors: Vec<Algorithm>,
    /// The region's RAM budget, a share of its size (over 0, up to 1).
    pub budget_share: f64,
    /// The fault thread at idle priority.
    pub idle_priority: bool,
    /// The fault thread asks for a CPU latency bound while it serves.
    pub cpu_latency_qos: bool,
    /// The region's compression units, a run each (empty: the page, 4096).
    pub unit_sizes: Vec<usize>,
    /// Rounds of each larger unit's pairing against the page
    /// ([`crate::uffd_units::DEFAULT_ROUNDS`] unless asked for another number).
    pub unit_rounds: usize,
}

impl UffdSweep {
    /// Every run over `corpus`, each made when asked for; the kernel's path for the corpus
    /// is measured first, once.
    pub fn runs<'a>(
        &'a self,
        corpus: &'a Corpus,
    ) -> Result<impl Iterator<Item = Result<UffdRun>> + 'a> {
        let kernel = kernel_path(corpus)?;
        let units = if self.unit_sizes.is_empty() {
            vec![4096]
        } else {
            self.unit_sizes.clone()
        };
        Ok(self
            .replays(units)
            .map(move |replay| replay.run(corpus, &kernel)))
    }

    /// Every compressor × unit size of `units` × clean pages on and off, in that order.
    fn replays(&self, units: Vec<usize>) -> impl Iterator<Item = UffdReplay> + '_ {
        self.compressors.iter().flat_map(move |algorithm| {
            let units = units.clone();
            units.into_iter().flat_map(move |unit_size| {
                [true, false].map(|clean_pages| UffdReplay {
                    algorithm: algorithm.clone(),
                    budget_share: self.budget_share,
                    clean_pages,
                    idle_priority: self.idle_priority,
                    cpu_latency_qos: self.cpu_latency_qos,
                    unit_size,
                })
            })
        })
    }

    /// Each unit size larger than the page against the page, paired in one run
    /// ([`UffdReplay::fault_in_against_pages`]): every compressor × larger unit × clean
    /// pages on and off, each made when asked for.
    pub fn unit_pairs<'a>(
        &'a self,
        corpus: &'a Corpus,
    ) -> impl Iterator<Item = Result<UnitFaultIn>> + 'a {
        let larger: Vec<usize> = self
            .unit_sizes
            .iter()
            .copied()
            .filter(|&u| u > CORPUS_PAGE)
            .collect();
        self.replays(larger)
            .map(move |replay| replay.fault_in_against_pages(corpus, self.unit_rounds))
    }
}

/// Ok when every zram run compared with the kernel's figures equals them; else the runs that
/// do not, named.
pub fn zram_verdict(runs: &[ZramRun]) -> Result<()> {
    let differs = |r: &ZramRun| r.kernel.as_ref().is_some_and(|k| !k.equal);
    verdict(
        "the kernel's figures",
        runs.iter().filter(|r| differs(r)).map(|r| {
            RunName::of(
                &r.corpus,
                &r.compressor,
                r.allocator,
                r.chain_size,
                r.threads,
            )
        }),
    )
}

/// As [`zram_verdict`], for zswap runs against the kernel zswap's figures.
pub fn zswap_verdict(runs: &[ZswapRun]) -> Result<()> {
    let differs = |r: &ZswapRun| r.kernel.as_ref().is_some_and(|k| !k.equal);
    verdict(
        "the kernel zswap's figures",
        runs.iter().filter(|r| differs(r)).map(|r| {
            RunName::of(
                &r.corpus,
                &r.compressor,
                r.allocator,
                r.chain_size,
                r.threads,
            )
        }),
    )
}

/// What tells one run of a sweep from another, as a verdict names it.
struct RunName<'a> {
    corpus: &'a str,
    compressor: &'a str,
    allocator: &'static str,
    chain_size: usize,
    threads: u16,
}

impl<'a> RunName<'a> {
    fn of(
        corpus: &'a str,
        compressor: &'a str,
        allocator: &'static str,
        chain_size: usize,
        threads: u16,
    ) -> RunName<'a> {
        RunName {
            corpus,
            compressor,
            allocator,
            chain_size,
            threads,
        }
    }
}

impl std::fmt::Display for RunName<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = if self.threads == 1 { "" } else { "s" };
        write!(
            f,
            "{} {} on {} (chain {}), {} thread{plural}",
            self.corpus, self.compressor, self.allocator, self.chain_size, self.threads
        )
    }
}

fn verdict<'a>(
    reference: &'static str,
    differing: impl Iterator<Item = RunName<'a>>,
) -> Result<()> {
    let runs: Vec<String> = differing.map(|run| run.to_string()).collect();
    if runs.is_empty() {
        Ok(())
    } else {
        Err(ReplayError::DifferentFromKernel { reference, runs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(chain_sizes: &[u8]) -> Sweep {
        Sweep {
            allocators: AllocatorKind::ALL.to_vec(),
            compressors: vec!["lz4".parse().unwrap(), "zstd".parse().unwrap()],
            layouts: Sweep::layouts(ZsConfig::default(), chain_sizes).unwrap(),
            threads: vec![1, 2],
            progress: false,
        }
    }

    #[test]
    fn chain_sizes_are_zsmallocs_alone() {
        let s = sweep(&[4, 8, 16]);
        let points = s.points().unwrap();
        let zsmalloc = points
            .iter()
            .filter(|p| p.allocator == AllocatorKind::Zsmalloc)
            .count();
        assert_eq!(zsmalloc, 2 * 3 * 2, "compressors × chain sizes × threads");
        for p in points
            .iter()
            .filter(|p| p.allocator != AllocatorKind::Zsmalloc)
        {
            assert_eq!(p.layout.chain_size, 4, "the first layout only");
        }
        let others = AllocatorKind::ALL.len() - 1;
        assert_eq!(points.len(), 12 + others * 2 * 2);
        // Thread counts of one allocator, compressor and layout come together, first first.
        assert_eq!(points[0].threads, 1);
        assert_eq!(points[1].threads, 2);
        assert_eq!(points[0].layout, points[1].layout);
    }

    #[test]
    fn a_chain_size_out_of_range_is_refused() {
        let refused = Sweep::layouts(ZsConfig::default(), &[4, 17]);
        assert!(matches!(refused, Err(ReplayError::Pool(_))), "{refused:?}");
    }

    #[test]
    fn a_sweep_without_layouts_is_refused() {
        let mut s = sweep(&[]);
        s.layouts.clear();
        assert!(matches!(s.points(), Err(ReplayError::EmptySweep { .. })));
    }
}
