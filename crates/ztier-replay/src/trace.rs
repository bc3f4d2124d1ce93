//! A capture over time (`ztier capture --every`) replayed through zram, epoch by epoch, as
//! a process swapping all its memory to a zram device would use it: a page that appears is
//! written to a slot of its own; a page that changed is read (swapped in: from the pool, or
//! from the backing store if it was written back) and written again; a page that went is
//! discarded, its slot reused. Every `idle_epochs` epochs a userspace policy runs, as
//! Android's does with the kernel's files: the pages not written since the last mark
//! (`idle`) are recompressed with the secondary algorithm (`recompress type=idle`) and
//! written back (`writeback idle`), the pool compacted, then every page marked idle again
//! (`echo all > idle`).
//!
//! What it reports: `mm_stat` and the store's `bd_stat` after every epoch (memory over time),
//! what the policy recompressed, wrote back and read again, and the final figures; at the end
//! every present page is read and compared with its last content in the corpus.
//!
//! [`ZswapTraceReplay`] replays the same through zswap in front of a swap device: pages
//! swapped out as they appear or change (a changed page swapped in first, from the device if
//! zswap wrote it back, and its slot freed), slots freed as pages go; zswap's own pool limit
//! and shrink worker decide what goes to the device. Its figures after every epoch.
//!
//! Invariants: a virtual page holds one slot from its appearance to its going (zram; in
//! zswap, until it changes, as a swapped-in page's slot is freed); zram's slots are
//! reused lowest first, so the device is as large as the most pages present at once. The
//! trace is checked against a corpus read whole (its corpus pages all inside it) before
//! anything runs; a corpus too large to hold is read on from its start as the epochs come to
//! their pages ([`CorpusPages::Streamed`]: each epoch's pages held while it is replayed, a page's
//! last content remembered by its CRC-32 for the check at the end).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_corpus::stream::CorpusStream;
use ztier_corpus::trace::{Epoch, Trace};
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zram::{Backing, BdStat, Device, MmStat, PageSelector, SlotFlag};
use ztier_zswap::{Cache, Config, Source, ZswapStats};

use crate::driver::{at, round3};
use crate::zram::WritebackTarget;
use crate::zswap::zswap_err;
use crate::{ReplayError, Result};

/// What to replay a trace through.
#[derive(Debug, Clone)]
pub struct TraceReplay {
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub algorithm: Algorithm,
    /// The secondary algorithm idle pages are recompressed with, if any.
    pub recompress: Option<Algorithm>,
    /// Where idle pages are written back, if anywhere.
    pub writeback: Option<WritebackTarget>,
    /// The policy runs every this many epochs (at least 1).
    pub idle_epochs: u32,
}

/// The device after one epoch.
#[derive(Debug, Clone, Serialize)]
pub struct TraceEpochRow {
    pub epoch: usize,
    /// When the capture took it.
    pub seconds: f64,
    pub present: u64,
    pub appeared: u64,
    pub changed: u64,
    pub went: u64,
    /// Of the changed pages, those read from the backing store (written back before).
    pub read_back: u64,
    /// What the policy did at the end of this epoch (zero when it did not run).
    pub recompressed: u64,
    pub written_back: u64,
    pub mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bd_stat: Option<BdStat>,
}

/// A whole trace's replay (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct TraceRun {
    pub corpus: String,
    pub allocator: &'static str,
    pub compressor: String,
    pub chain_size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recompressor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writeback_store: Option<String>,
    pub idle_epochs: u32,
    /// The device's size in pages: the most pages present at once.
    pub device_pages: u64,
    pub epochs: Vec<TraceEpochRow>,
    pub final_mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_bd_stat: Option<BdStat>,
    pub pages_written: u64,
    pub pages_discarded: u64,
    pub recompressed_pages: u64,
    pub written_back_pages: u64,
    pub read_back_pages: u64,
    /// The largest `mem_used_total` after any epoch.
    pub peak_mem_used_total: u64,
    pub seconds: f64,
    pub verified: bool,
}

impl TraceReplay {
    /// Replays `trace` over the pages of `corpus` (the corpus it was captured with).
    pub fn run(&self, corpus: &Corpus, trace: &Trace) -> Result<TraceRun> {
        self.run_over(&CorpusPages::Whole(corpus), trace)
    }

    /// Replays `trace` over `pages`, the corpus it was captured with, read whole or on.
    pub fn run_over(&self, pages: &CorpusPages<'_>, trace: &Trace) -> Result<TraceRun> {
        let idle_epochs = self.idle_epochs.max(1) as usize;
        let (dev, device_pages) =
            trace_device(trace, pages, self.allocator, &self.layout, &self.algorithm)?;
        if let Some(alg) = &self.recompress {
            dev.set_recomp_algorithms(vec![alg.clone()])?;
        }
        if let Some(target) = &self.writeback {
            dev.set_backing(Some(Backing::new(target.store.clone(), target.format)?))?;
        }
        let began = Instant::now();
        let mut swapped = SwappedPages::new(&dev, pages.open()?, device_pages);
        let mut rows = Vec::with_capacity(trace.epochs.len());
        let mut totals = (0u64, 0u64, 0u64, 0u64, 0u64); // written, discarded, recomp, wb, rb
        let mut peak = 0u64;
        for (n, epoch) in trace.epochs.iter().enumerate() {
            let read_back = swapped.apply(n, epoch)?;
            totals.1 += epoch.went.len() as u64;
            totals.0 += (epoch.appeared.len() + epoch.changed.len()) as u64;
            totals.4 += read_back;
            let (mut recompressed, mut written_back) = (0, 0);
            if (n + 1) % idle_epochs == 0 {
                // The pages idle since the last mark: the first mark is after epoch 0's
                // writes, so nothing is idle before the second run.
                if n + 1 > idle_epochs {
                    if self.recompress.is_some() {
                        recompressed = dev.recompress(PageSelector::Idle, None, None)?.recompressed;
                    }
                    if self.writeback.is_some() {
                        written_back = dev.writeback(PageSelector::Idle, None, None)?.pages;
                    }
                    dev.compact();
                }
                dev.mark_idle(None);
            }
            totals.2 += recompressed;
            totals.3 += written_back;
            let mm_stat = dev.mm_stat();
            peak = peak.max(mm_stat.mem_used_total);
            rows.push(TraceEpochRow {
                epoch: n,
                seconds: epoch.millis as f64 / 1000.0,
                present: epoch.present(),
                appeared: epoch.appeared.len() as u64,
                changed: epoch.changed.len() as u64,
                went: epoch.went.len() as u64,
                read_back,
                recompressed,
                written_back,
                mm_stat,
                bd_stat: dev.bd_stat(),
            });
        }
        swapped.verify()?;
        Ok(TraceRun {
            corpus: pages.name().to_owned(),
            allocator: self.allocator.name(),
            compressor: self.algorithm.to_string(),
            chain_size: self.layout.chain_size,
            recompressor: self.recompress.as_ref().map(|a| a.to_string()),
            writeback_store: self.writeback.as_ref().map(|t| t.name.clone()),
            idle_epochs: idle_epochs as u32,
            device_pages,
            epochs: rows,
            final_mm_stat: dev.mm_stat(),
            final_bd_stat: dev.bd_stat(),
            pages_written: totals.0,
            pages_discarded: totals.1,
            recompressed_pages: totals.2,
            written_back_pages: totals.3,
            read_back_pages: totals.4,
            peak_mem_used_total: peak,
            seconds: round3(began.elapsed().as_secs_f64()),
            verified: true,
        })
    }
}

/// A zram device for replaying `trace` over the pages of `corpus` (the corpus it was
/// captured with), as large as the most pages present at once ([`trace_pages`]). Returns it
/// and its size in pages.
pub(crate) fn trace_device(
    trace: &Trace,
    pages: &CorpusPages<'_>,
    allocator: AllocatorKind,
    layout: &ZsConfig,
    algorithm: &Algorithm,
) -> Result<(Device, u64)> {
    layout.validate().map_err(ztier_pool::PoolError::from)?;
    let device_pages = trace_pages(trace, pages, layout.page_size)?;
    let pool = allocator.make_pool(layout)?;
    let dev = Device::new(device_pages * CORPUS_PAGE as u64, algorithm.clone(), pool)?;
    Ok((dev, device_pages))
}

/// The pages a device replaying `trace` over `pages` needs: the most present at once, once
/// the trace is checked against the corpus (its invariants, its corpus pages all inside it)
/// and the device's `page_size` against the trace's (4 KiB, [`CORPUS_PAGE`]). The size to make
/// a device served to [`crate::paced`].
pub fn trace_pages(trace: &Trace, pages: &CorpusPages<'_>, page_size: usize) -> Result<u64> {
    if page_size != CORPUS_PAGE {
        return Err(ReplayError::TracePageSize { page_size });
    }
    // A trace read from a file was checked by `Trace::read`; one built in memory is
    // checked here, before its counts size anything.
    trace
        .check_invariants()
        .map_err(ReplayError::TraceInvalid)?;
    // A corpus read on is known to be short only once it ends (`CorpusError::EndsBefore`).
    if let CorpusPages::Whole(corpus) = pages {
        if trace.corpus_pages() > corpus.pages() as u64 {
            return Err(ReplayError::NotTheCorpus {
                trace_pages: trace.corpus_pages(),
                corpus: corpus.name.clone(),
                corpus_pages: corpus.pages(),
            });
        }
    }
    Ok(trace
        .epochs
        .iter()
        .map(|e| e.present())
        .max()
        .unwrap_or(0)
        .max(1))
}

/// The corpus a trace's writes name its pages in.
#[derive(Clone, Copy)]
pub enum CorpusPages<'a> {
    /// Read whole into memory.
    Whole(&'a Corpus),
    /// Read on from its start as the epochs come to their pages, holding at most
    /// `max_held_bytes` of them at once (a capture too large to hold: an epoch's pages are
    /// those it wrote, the first epoch's the most).
    Streamed { path: &'a Path, max_held_bytes: u64 },
}

impl<'a> CorpusPages<'a> {
    /// The corpus's name (its file's, without `.pages` / `.pages.zst`).
    pub fn name(&self) -> &str {
        match self {
            CorpusPages::Whole(corpus) => &corpus.name,
            CorpusPages::Streamed { path, .. } => ztier_corpus::corpus_name(path),
        }
    }

    /// A reader of the pages from the first, for one replay.
    pub(crate) fn open(&self) -> Result<PageSource<'a>> {
        Ok(match *self {
            CorpusPages::Whole(corpus) => PageSource::Whole(corpus),
            CorpusPages::Streamed {
                path,
                max_held_bytes,
            } => PageSource::Streamed(CorpusStream::open(path, max_held_bytes)?),
        })
    }
}

/// The pages one replay reads.
pub(crate) enum PageSource<'a> {
    Whole(&'a Corpus),
    Streamed(CorpusStream),
}

/// What a replay remembers of a page's last content, to check it at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remembered {
    /// Its corpus page (the corpus is held whole).
    Page(u32),
    /// The CRC-32 of its content (the corpus page is gone by then).
    Crc(u32),
}

impl PageSource<'_> {
    /// Holds the pages `epoch` writes (a streamed corpus; one read whole holds them all).
    fn prepare(&mut self, epoch: &Epoch) -> Result<()> {
        let PageSource::Streamed(stream) = self else {
            return Ok(());
        };
        let written = epoch.appeared.iter().chain(&epoch.changed);
        let Some((low, high)) = written
            .map(|w| u64::from(w.corpus_page))
            .fold(None, |b, p| {
                Some(b.map_or((p, p), |(l, h): (u64, u64)| (l.min(p), h.max(p))))
            })
        else {
            return Ok(());
        };
        stream.hold(low, high + 1)?;
        Ok(())
    }

    fn page(&self, index: u32) -> Result<&[u8]> {
        match self {
            PageSource::Whole(corpus) => {
                let at = index as usize * CORPUS_PAGE;
                corpus.bytes().get(at..at + CORPUS_PAGE).ok_or_else(|| {
                    ReplayError::CorpusPageOutside {
                        index,
                        corpus: corpus.name.clone(),
                        corpus_pages: corpus.pages(),
                    }
                })
            }
            // `prepare` held every page the epoch writes (or said why not).
            PageSource::Streamed(stream) => {
                stream
                    .page(u64::from(index))
                    .ok_or_else(|| ReplayError::CorpusPageOutside {
                        index,
                        corpus: stream.name.clone(),
                        corpus_pages: stream.pages_read() as usize,
                    })
            }
        }
    }

    fn remember(&self, index: u32, content: &[u8]) -> Remembered {
        match self {
            PageSource::Whole(_) => Remembered::Page(index),
            PageSource::Streamed(_) => Remembered::Crc(crc32fast::hash(content)),
        }
    }

    fn name(&self) -> &str {
        match self {
            PageSource::Whole(corpus) => &corpus.name,
            PageSource::Streamed(stream) => &stream.name,
        }
    }

    /// `got`, read back for page `vpn`, is the content `remembered` of it.
    fn check(&self, vpn: u64, remembered: Remembered, got: &[u8]) -> Result<()> {
        let corpus = || self.name().to_owned();
        match remembered {
            Remembered::Page(page) if got != self.page(page)? => Err(ReplayError::Mismatch {
                corpus: corpus(),
                page: page as usize,
            }),
            Remembered::Crc(crc) if crc32fast::hash(got) != crc => Err(ReplayError::MismatchAt {
                corpus: corpus(),
                vpn,
            }),
            _ => Ok(()),
        }
    }
}

/// Where a replay swaps its pages: page-sized slots read, written and discarded.
pub(crate) trait SwapSpace {
    /// Reads `slot` into `buf` (a swap-in); whether it came from the backing store, where
    /// the space can tell (a zram device can; a device served over a socket cannot, and its
    /// server counts the store's reads instead).
    fn swap_in(&self, slot: u64, buf: &mut [u8]) -> Result<bool>;
    fn swap_out(&self, slot: u64, page: &[u8]) -> Result<()>;
    fn free(&self, slot: u64) -> Result<()>;
}

impl SwapSpace for Device {
    fn swap_in(&self, slot: u64, buf: &mut [u8]) -> Result<bool> {
        let from_store = self.entry(slot)?.has(SlotFlag::Wb);
        self.read_page(slot, buf)
            .map_err(|e| at("reading", slot as usize, e))?;
        Ok(from_store)
    }

    fn swap_out(&self, slot: u64, page: &[u8]) -> Result<()> {
        self.write_page(slot, page)
            .map_err(|e| at("writing", slot as usize, e))
    }

    fn free(&self, slot: u64) -> Result<()> {
        self.discard_page(slot)
            .map_err(|e| at("discarding", slot as usize, e))
    }
}

/// A block device as swap space: slot `n` is the page at `n * 4096`.
pub(crate) struct BlockSpace<'a>(pub(crate) &'a dyn BlockDevice);

impl SwapSpace for BlockSpace<'_> {
    fn swap_in(&self, slot: u64, buf: &mut [u8]) -> Result<bool> {
        self.0
            .read_at(slot * CORPUS_PAGE as u64, buf)
            .map_err(|e| at("reading", slot as usize, ReplayError::Served(e)))?;
        Ok(false)
    }

    fn swap_out(&self, slot: u64, page: &[u8]) -> Result<()> {
        self.0
            .write_at(slot * CORPUS_PAGE as u64, page, false)
            .map_err(|e| at("writing", slot as usize, ReplayError::Served(e)))
    }

    fn free(&self, slot: u64) -> Result<()> {
        self.0
            .discard(slot * CORPUS_PAGE as u64, CORPUS_PAGE as u64)
            .map_err(|e| at("discarding", slot as usize, ReplayError::Served(e)))
    }
}

/// The pages of a trace as a swapping process keeps them in its swap space: a slot per
/// present page (the lowest free one for a page that appears), its last content, and the
/// epoch's changes applied as swap-outs, swap-ins and frees.
pub(crate) struct SwappedPages<'a> {
    dev: &'a dyn SwapSpace,
    source: PageSource<'a>,
    device_pages: u64,
    slots: HashMap<u64, u64>,
    latest: HashMap<u64, Remembered>,
    free: BTreeSet<u64>,
    next_slot: u64,
    scratch: Vec<u8>,
}

impl<'a> SwappedPages<'a> {
    pub(crate) fn new(dev: &'a dyn SwapSpace, source: PageSource<'a>, device_pages: u64) -> Self {
        SwappedPages {
            dev,
            source,
            device_pages,
            slots: HashMap::new(),
            latest: HashMap::new(),
            free: BTreeSet::new(),
            next_slot: 0,
            scratch: vec![0u8; CORPUS_PAGE],
        }
    }

    /// Epoch `n`: the pages that went are discarded (their slots free for those that
    /// appear), those that changed read (swapped in) and written again, those that appeared
    /// written. Returns how many of the changed pages were read from the backing store.
    pub(crate) fn apply(&mut self, n: usize, epoch: &Epoch) -> Result<u64> {
        let inconsistent = |epoch: usize, vpn: u64, what: &'static str| {
            ReplayError::TraceInconsistent { epoch, vpn, what }
        };
        let dev = self.dev;
        self.source.prepare(epoch)?;
        for vpn in &epoch.went {
            let slot = self
                .slots
                .remove(vpn)
                .ok_or_else(|| inconsistent(n, *vpn, "goes while not present"))?;
            self.latest.remove(vpn);
            dev.free(slot)?;
            self.free.insert(slot);
        }
        let mut read_back = 0;
        for w in &epoch.changed {
            let slot = *self
                .slots
                .get(&w.vpn)
                .ok_or_else(|| inconsistent(n, w.vpn, "changes while not present"))?;
            // Swapped in before it is changed: from the store if it was written back.
            read_back += u64::from(dev.swap_in(slot, &mut self.scratch)?);
            let content = self.source.page(w.corpus_page)?;
            dev.swap_out(slot, content)?;
            let remembered = self.source.remember(w.corpus_page, content);
            self.latest.insert(w.vpn, remembered);
        }
        for w in &epoch.appeared {
            if self.slots.contains_key(&w.vpn) {
                return Err(inconsistent(n, w.vpn, "appears while present"));
            }
            let slot = self.free.pop_first().unwrap_or_else(|| {
                self.next_slot += 1;
                self.next_slot - 1
            });
            if slot >= self.device_pages {
                return Err(inconsistent(n, w.vpn, "appears beyond the pages present"));
            }
            self.slots.insert(w.vpn, slot);
            let content = self.source.page(w.corpus_page)?;
            let remembered = self.source.remember(w.corpus_page, content);
            self.latest.insert(w.vpn, remembered);
            dev.swap_out(slot, content)?;
        }
        Ok(read_back)
    }

    /// Every present page reads back as its last content.
    pub(crate) fn verify(&mut self) -> Result<()> {
        for (vpn, &slot) in &self.slots {
            self.dev.swap_in(slot, &mut self.scratch)?;
            self.source.check(*vpn, self.latest[vpn], &self.scratch)?; // set with every slot
        }
        Ok(())
    }
}

/// A capture over time replayed through zswap in front of a swap device, as the swapping
/// process would use them: a page that appears is swapped out to a new slot; a page that
/// changed is swapped in (from zswap, or from the device if the shrinker wrote it back),
/// its slot freed, and swapped out again to a new one; a page that went has its slot freed.
/// zswap's own policy runs meanwhile: the pool limit (`max_pool_percent` of `ram_bytes`) and
/// the shrink worker, which writes the coldest pages back to the device; its figures are
/// read once it is idle after each epoch.
#[derive(Debug, Clone)]
pub struct ZswapTraceReplay {
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub algorithm: Algorithm,
    /// The memory `max_pool_percent` is of (the kernel's `totalram_pages()`), in bytes.
    pub ram_bytes: u64,
    pub max_pool_percent: u32,
}

/// zswap after one epoch.
#[derive(Debug, Clone, Serialize)]
pub struct ZswapTraceEpochRow {
    pub epoch: usize,
    pub seconds: f64,
    pub present: u64,
    pub appeared: u64,
    pub changed: u64,
    pub went: u64,
    /// Of the changed pages, those swapped in from the device (written back before).
    pub read_back: u64,
    pub zswap: ZswapStats,
}

/// A whole trace through zswap (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct ZswapTraceRun {
    pub corpus: String,
    pub front: &'static str,
    pub allocator: &'static str,
    pub compressor: String,
    pub chain_size: usize,
    pub ram_bytes: u64,
    pub max_pool_percent: u32,
    pub epochs: Vec<ZswapTraceEpochRow>,
    pub final_zswap: ZswapStats,
    pub pages_swapped_out: u64,
    pub slots_freed: u64,
    pub read_back_pages: u64,
    pub peak_pool_total_size: u64,
    pub seconds: f64,
    pub verified: bool,
}

impl ZswapTraceReplay {
    /// Replays `trace` over the pages of `corpus` (the corpus it was captured with).
    pub fn run(&self, corpus: &Corpus, trace: &Trace) -> Result<ZswapTraceRun> {
        self.run_over(&CorpusPages::Whole(corpus), trace)
    }

    /// Replays `trace` over `pages`, the corpus it was captured with, read whole or on.
    pub fn run_over(&self, pages: &CorpusPages<'_>, trace: &Trace) -> Result<ZswapTraceRun> {
        self.layout
            .validate()
            .map_err(ztier_pool::PoolError::from)?;
        let most_present = trace_pages(trace, pages, self.layout.page_size)?;
        let mut source = pages.open()?;
        let inconsistent = |epoch: usize, vpn: u64, what: &'static str| {
            ReplayError::TraceInconsistent { epoch, vpn, what }
        };
        // Room for every page present at once, twice over, so the slot allocator's clusters
        // never run short.
        let slots = (2 * most_present + 1).div_ceil(512) * 512 + 512;
        let backing = Arc::new(
            MemoryDevice::new(slots * CORPUS_PAGE as u64).map_err(ReplayError::SwapBacking)?,
        );
        let swap = Arc::new(ztier_swap::Device::new(backing, Default::default())?);
        let mut config = Config::new(self.algorithm.clone(), self.ram_bytes);
        config.max_pool_percent = self.max_pool_percent;
        let pool = self.allocator.make_pool(&self.layout)?;
        let cache = Cache::new(swap.clone(), pool, config).map_err(zswap_err)?;
        let began = Instant::now();
        let mut slot_of: HashMap<u64, u64> = HashMap::new();
        let mut latest: HashMap<u64, Remembered> = HashMap::new();
        let mut scratch = vec![0u8; CORPUS_PAGE];
        let mut rows = Vec::with_capacity(trace.epochs.len());
        let (mut out, mut freed, mut read_back_total, mut peak) = (0u64, 0u64, 0u64, 0u64);
        let swap_out = |slot: u64, content: &[u8]| -> Result<()> {
            cache
                .swap_out(slot, content)
                .map(|_| ())
                .map_err(|e| at("swapping out", slot as usize, zswap_err(e)))
        };
        for (n, epoch) in trace.epochs.iter().enumerate() {
            source.prepare(epoch)?;
            for vpn in &epoch.went {
                let slot = slot_of
                    .remove(vpn)
                    .ok_or_else(|| inconsistent(n, *vpn, "goes while not present"))?;
                latest.remove(vpn);
                cache.swap_free(slot).map_err(zswap_err)?;
                freed += 1;
            }
            let mut read_back = 0;
            for w in &epoch.changed {
                let slot = *slot_of
                    .get(&w.vpn)
                    .ok_or_else(|| inconsistent(n, w.vpn, "changes while not present"))?;
                let from = cache.swap_in(slot, &mut scratch).map_err(zswap_err)?;
                read_back += u64::from(from == Source::Device);
                cache.swap_free(slot).map_err(zswap_err)?;
                freed += 1;
                let slot = swap.alloc(0)?;
                slot_of.insert(w.vpn, slot);
                let content = source.page(w.corpus_page)?;
                latest.insert(w.vpn, source.remember(w.corpus_page, content));
                swap_out(slot, content)?;
            }
            for w in &epoch.appeared {
                if slot_of.contains_key(&w.vpn) {
                    return Err(inconsistent(n, w.vpn, "appears while present"));
                }
                let slot = swap.alloc(0)?;
                slot_of.insert(w.vpn, slot);
                let content = source.page(w.corpus_page)?;
                latest.insert(w.vpn, source.remember(w.corpus_page, content));
                swap_out(slot, content)?;
            }
            out += (epoch.appeared.len() + epoch.changed.len()) as u64;
            read_back_total += read_back;
            cache.wait_shrink_idle();
            let zswap = cache.stats();
            peak = peak.max(zswap.pool_total_size);
            rows.push(ZswapTraceEpochRow {
                epoch: n,
                seconds: epoch.millis as f64 / 1000.0,
                present: epoch.present(),
                appeared: epoch.appeared.len() as u64,
                changed: epoch.changed.len() as u64,
                went: epoch.went.len() as u64,
                read_back,
                zswap,
            });
        }
        let final_zswap = cache.stats();
        // Every present page swaps in as its last content (from zswap or the device).
        for (vpn, &slot) in &slot_of {
            cache.swap_in(slot, &mut scratch).map_err(zswap_err)?;
            source.check(*vpn, latest[vpn], &scratch)?; // `latest` is set with every slot
        }
        Ok(ZswapTraceRun {
            corpus: pages.name().to_owned(),
            front: "zswap",
            allocator: self.allocator.name(),
            compressor: self.algorithm.to_string(),
            chain_size: self.layout.chain_size,
            ram_bytes: self.ram_bytes,
            max_pool_percent: self.max_pool_percent,
            epochs: rows,
            final_zswap,
            pages_swapped_out: out,
            slots_freed: freed,
            read_back_pages: read_back_total,
            peak_pool_total_size: peak,
            seconds: round3(began.elapsed().as_secs_f64()),
            verified: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_traces::content;
    use std::sync::Arc;
    use ztier_corpus::trace::{Epoch, PageWrite};
    use ztier_corpus::writer::CorpusWriter;

    /// Epoch 0: 100 pages appear. Epoch 1: 10 change, 20 go, 5 appear. Epoch 2: the same
    /// 10 change again; epoch 3 too, and page 50. Written to `dir` and read back.
    fn made_trace(dir: &std::path::Path) -> (Corpus, Trace) {
        let mut next = 0u32;
        let mut write = |vpn: u64| {
            next += 1;
            PageWrite {
                vpn,
                corpus_page: next - 1,
            }
        };
        let mut epochs = vec![Epoch {
            appeared: (0..100).map(&mut write).collect(),
            ..Epoch::default()
        }];
        epochs.push(Epoch {
            millis: 1000,
            unchanged: 70,
            appeared: (200..205).map(&mut write).collect(),
            changed: (0..10).map(&mut write).collect(),
            went: (80..100).collect(),
        });
        epochs.push(Epoch {
            millis: 2000,
            unchanged: 75,
            changed: (0..10).map(&mut write).collect(),
            ..Epoch::default()
        });
        // Page 50, written back since, changes: read from the store, written to the pool.
        epochs.push(Epoch {
            millis: 3000,
            unchanged: 74,
            changed: (0..10).chain([50]).map(&mut write).collect(),
            ..Epoch::default()
        });
        crate::test_traces::written(&dir.join("t.pages"), next, &epochs)
    }

    /// The replay the tests run: lzo-rle on zsmalloc, writing back pages idle an epoch to a
    /// store of its own in memory.
    fn replay_on_a_new_store() -> TraceReplay {
        let store = Arc::new(
            ztier_blockdev::memory::MemoryDevice::new(Backing::size_for(105 * CORPUS_PAGE as u64))
                .unwrap(),
        );
        TraceReplay {
            allocator: AllocatorKind::Zsmalloc,
            layout: ZsConfig::default(),
            algorithm: "lzo-rle".parse().unwrap(),
            recompress: None,
            writeback: Some(WritebackTarget {
                store,
                format: ztier_zram::WbFormat::Page,
                name: "ram".into(),
            }),
            idle_epochs: 1,
        }
    }

    #[test]
    fn a_trace_replays_its_epochs_and_the_policy_writes_back_idle_pages() {
        let dir = std::env::temp_dir().join(format!("ztier-trace-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (corpus, trace) = made_trace(&dir);
        let replay = replay_on_a_new_store();
        let run = replay.run(&corpus, &trace).unwrap();
        assert_eq!(run.device_pages, 100);
        let presents: Vec<u64> = run.epochs.iter().map(|r| r.present).collect();
        assert_eq!(presents, [100, 85, 85, 85]);
        // Pages held (orig_data_size counts written-back pages too, as the kernel's does)
        // and of them on the store: epoch 1's policy writes back the 70 idle since epoch 0,
        // epoch 2's the 5 that appeared in epoch 1; epoch 3 reads page 50 back.
        let held: Vec<(u64, u64)> = run
            .epochs
            .iter()
            .map(|r| (r.mm_stat.orig_data_size / 4096, r.bd_stat.unwrap().bd_count))
            .collect();
        assert_eq!(held, [(100, 0), (85, 70), (85, 75), (85, 74)]);
        let in_pool = |r: &TraceEpochRow| r.mm_stat.compr_data_size;
        assert!(in_pool(&run.epochs[1]) < in_pool(&run.epochs[0]) / 4);
        assert_eq!(
            run.epochs
                .iter()
                .map(|r| r.written_back)
                .collect::<Vec<_>>(),
            [0, 70, 5, 0]
        );
        assert_eq!(run.written_back_pages, 75);
        assert_eq!(run.read_back_pages, 1);
        assert_eq!(run.epochs[3].read_back, 1);
        assert_eq!(run.final_bd_stat.unwrap().bd_count, 74);
        assert_eq!(run.pages_discarded, 20);
        assert_eq!(run.pages_written, 100 + 15 + 10 + 11);
        assert!(run.verified);
        // The corpus read on from its file, an epoch's pages at a time (at most 100 held),
        // not whole: the same run, epoch by epoch, checked by each page's CRC-32.
        let streamed = CorpusPages::Streamed {
            path: &corpus.path,
            max_held_bytes: 100 * CORPUS_PAGE as u64,
        };
        assert_eq!(streamed.name(), corpus.name);
        let run_on = replay_on_a_new_store().run_over(&streamed, &trace).unwrap();
        let figures = |r: &TraceRun| -> Vec<_> {
            r.epochs
                .iter()
                .map(|e| (e.mm_stat, e.bd_stat, e.read_back, e.written_back))
                .collect()
        };
        assert_eq!(figures(&run_on), figures(&run));
        assert!(run_on.verified);
        // Too little room for the first epoch's 100 pages: refused, not held.
        let cramped = CorpusPages::Streamed {
            path: &corpus.path,
            max_held_bytes: 99 * CORPUS_PAGE as u64,
        };
        let err = replay_on_a_new_store()
            .run_over(&cramped, &trace)
            .unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        // A trace naming more pages than the corpus holds is refused.
        let short = dir.join("short.pages");
        let mut cw = CorpusWriter::create(&short).unwrap();
        cw.push(&content(0)).unwrap();
        cw.finish().unwrap();
        let err = replay
            .run(&Corpus::load(&short).unwrap(), &trace)
            .unwrap_err();
        assert!(err.to_string().contains("not the corpus"), "{err}");
        // Read on, it is found short when it ends.
        let short_on = CorpusPages::Streamed {
            path: &short,
            max_held_bytes: 1 << 20,
        };
        let err = replay_on_a_new_store()
            .run_over(&short_on, &trace)
            .unwrap_err();
        assert!(err.to_string().contains("ends after 1 pages"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trace_built_in_memory_that_breaks_the_invariants_is_refused_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("ztier-trace-broken-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (corpus, trace) = made_trace(&dir);
        let replay = replay_on_a_new_store();
        // The trace as made replays: what follows breaks it one invariant at a time.
        assert!(replay.run(&corpus, &trace).is_ok());
        // A trace built in memory that breaks the invariants is an error, not a panic.
        let mut broken = trace.clone();
        broken.epochs[1].went.push(999);
        let err = replay.run(&corpus, &broken).unwrap_err();
        assert!(err.to_string().contains("goes while not present"), "{err}");
        let mut broken = trace.clone();
        broken.epochs[2].changed[0].vpn = 998;
        let err = replay.run(&corpus, &broken).unwrap_err();
        assert!(
            err.to_string().contains("changes while not present"),
            "{err}"
        );
        let mut broken = trace.clone();
        broken.epochs[0].appeared[1].corpus_page = 10_000;
        let err = replay.run(&corpus, &broken).unwrap_err();
        assert!(err.to_string().contains("corpus page 10000"), "{err}");
        // Counts that overflow the device's size (it was sized from them first).
        let mut broken = trace.clone();
        broken.epochs[0].unchanged = u64::MAX;
        let err = replay.run(&corpus, &broken).unwrap_err();
        assert!(err.to_string().contains("do not add up"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_trace_replays_through_zswap_and_a_full_pool_sends_pages_to_the_device() {
        let dir = std::env::temp_dir().join(format!("ztier-trace-zswap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (corpus, trace) = made_trace(&dir);
        let replay = |ram_bytes: u64, max_pool_percent: u32| ZswapTraceReplay {
            allocator: AllocatorKind::Zsmalloc,
            layout: ZsConfig::default(),
            algorithm: "lzo".parse().unwrap(),
            ram_bytes,
            max_pool_percent,
        };
        // No limit in reach: every page present is in zswap after every epoch.
        let run = replay(1 << 40, 20).run(&corpus, &trace).unwrap();
        let stored: Vec<u64> = run.epochs.iter().map(|r| r.zswap.stored_pages).collect();
        assert_eq!(stored, [100, 85, 85, 85]);
        assert_eq!(run.pages_swapped_out, 100 + 15 + 10 + 11);
        assert_eq!(run.slots_freed, 20 + 10 + 10 + 11);
        assert_eq!(run.read_back_pages, 0);
        assert_eq!(run.final_zswap.written_back_pages, 0);
        assert!(run.verified);
        // The corpus read on from its file: the same figures, every page checked by its
        // CRC; too little room for the first epoch's 100 pages is refused, not held.
        let streamed = CorpusPages::Streamed {
            path: &corpus.path,
            max_held_bytes: 100 * CORPUS_PAGE as u64,
        };
        let run_on = replay(1 << 40, 20).run_over(&streamed, &trace).unwrap();
        let on: Vec<u64> = run_on.epochs.iter().map(|r| r.zswap.stored_pages).collect();
        assert_eq!(on, stored);
        assert_eq!(
            (run_on.pages_swapped_out, run_on.slots_freed, run_on.corpus),
            (run.pages_swapped_out, run.slots_freed, run.corpus.clone())
        );
        assert!(run_on.verified);
        let cramped = CorpusPages::Streamed {
            path: &corpus.path,
            max_held_bytes: 99 * CORPUS_PAGE as u64,
        };
        let err = replay(1 << 40, 20).run_over(&cramped, &trace).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        // A pool limit of a few pages: stores refused to the device, pages written back,
        // changed pages swapped in from the device; every page still right at the end.
        let run = replay(1 << 20, 1).run(&corpus, &trace).unwrap();
        let z = &run.final_zswap;
        assert!(z.pool_limit_hit > 0, "{z:?}");
        assert!(z.swpout_device + z.written_back_pages > 0, "{z:?}");
        assert!(run.read_back_pages > 0);
        // The limit (2 pages) and at most one zspage (chain 8) taken past it by a store
        // under way.
        assert!(
            run.peak_pool_total_size <= (2 + 8) * 4096,
            "{}",
            run.peak_pool_total_size
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
