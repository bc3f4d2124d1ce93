//! One zram replay: a corpus written to a fresh device, read back, optionally every odd page
//! discarded, then compacted; `mm_stat` after each step; store and load speeds as ratios to
//! the raw compressor and decompressor on the same pages and threads in the same run; the
//! device's own memory; and the kernel's figures compared where they apply.
//!
//! What is compared with the kernel: its figures were taken with one `dd` writer on
//! zsmalloc at the kernel's page and chain size, with the algorithm's default level. Runs of
//! another allocator, layout or level are not compared. With more than one writing thread,
//! objects are laid out in another order than one writer's, so the layout-dependent fields
//! (`mem_used_total`, `mem_used_max`, `pages_compacted`) are shown but not compared; every
//! other field must still be equal.

use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use ztier_compress::{worst_case_len, Algorithm};
use ztier_corpus::{Corpus, Truth};
use ztier_pool::{AllocatorKind, PoolStats, ZsConfig};

use ztier_blockdev::BlockDevice;
use ztier_zram::{Backing, BdStat, Device, MmStat, PageSelector, WbFormat};

use crate::driver::{
    at, best_of_fresh_pairs, best_of_pairs, compress_all, for_each_page, mb_s, pages_of,
    passes_for, round1, round3, Progress, ReferenceStreams,
};
use crate::{ReplayError, Result};

/// What to replay.
#[derive(Debug, Clone)]
pub struct ZramReplay {
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub algorithm: Algorithm,
    pub threads: u16,
    /// After the write, discard every odd page, then compact (as the truth files' discard
    /// experiment was taken).
    pub discard_odd: bool,
    /// Keep the allocator's table after the write.
    pub allocator_stats: bool,
    /// Draw progress bars on a terminal.
    pub progress: bool,
    /// After everything else, recompress every page with this algorithm (kept where it
    /// lands in a smaller class).
    pub recompress: Option<Algorithm>,
    /// Then mark every page idle and write them back to this store.
    pub writeback: Option<WritebackTarget>,
}

/// Where `--writeback-*` writes back to.
#[derive(Clone)]
pub struct WritebackTarget {
    pub store: Arc<dyn BlockDevice>,
    pub format: WbFormat,
    /// What the store is, for the report (`file:PATH`, `nbd://...`).
    pub name: String,
}

impl std::fmt::Debug for WritebackTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({:?})", self.name, self.format)
    }
}

/// What recompression did (`--recompress`).
#[derive(Debug, Clone, Serialize)]
pub struct RecompressRun {
    pub algorithm: String,
    /// After recompression and compaction.
    pub mm_stat_after_recompress: MmStat,
    pub recompressed_pages: u64,
    pub incompressible_pages: u64,
    pub seconds: f64,
}

/// What writeback did (`--writeback-file`, `--writeback-nbd`).
#[derive(Debug, Clone, Serialize)]
pub struct WritebackRun {
    pub store: String,
    pub format: WbFormat,
    pub pages_written_back: u64,
    /// After writeback and compaction.
    pub mm_stat_after_writeback: MmStat,
    pub bd_stat: BdStat,
    /// Bytes written to the store.
    pub writeback_bytes: u64,
    /// Of them, per page written back.
    pub writeback_bytes_per_page: f64,
    /// Pages written back, in MB of pages (4 KiB each) per second.
    pub writeback_mb_s: f64,
    /// Every page read back (from memory or the store), verified, in MB of pages per second.
    pub readback_mb_s: f64,
}

/// One run's results (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct ZramRun {
    pub corpus: String,
    pub pages: u64,
    pub page_size: usize,
    pub allocator: &'static str,
    pub compressor: String,
    pub chain_size: usize,
    pub threads: u16,
    pub mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_discard: Option<MmStat>,
    pub mm_stat_after_compact: MmStat,
    pub store_mb_s: f64,
    pub load_mb_s: f64,
    pub raw_compress_mb_s: f64,
    pub raw_decompress_mb_s: f64,
    pub store_vs_raw: f64,
    pub load_vs_raw: f64,
    /// The device's own resident memory after compaction: the process's RSS with the device
    /// less its RSS once the device is dropped (pool pages, slot table, kept free pages).
    pub device_rss_bytes: u64,
    /// `mem_used_total` at that moment, to set beside it.
    pub device_mem_used_total: u64,
    pub verified: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_stats: Option<PoolStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelComparison>,
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub recompress: Option<RecompressRun>,
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub writeback: Option<WritebackRun>,
}

/// The kernel's figures for the same corpus and configuration, and the comparison.
#[derive(Debug, Clone, Serialize)]
pub struct KernelComparison {
    pub release: String,
    pub mm_stat: MmStat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_discard: Option<MmStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_stat_after_compact: Option<MmStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_mb_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_mb_s: Option<f64>,
    /// Every field of every step both sides have.
    pub fields: Vec<FieldComparison>,
    /// Every compared field is equal.
    pub equal: bool,
    /// Why some fields or steps are not compared, for the reader.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One `mm_stat` field after one step.
#[derive(Debug, Clone, Serialize)]
pub struct FieldComparison {
    /// "write", "discard" or "compact".
    pub after: &'static str,
    pub field: &'static str,
    pub ztier: u64,
    pub kernel: u64,
    /// False for a field this run cannot be expected to match (see the module comment).
    pub compared: bool,
}

/// Fields that depend on the order objects were allocated in.
const LAYOUT_FIELDS: [&str; 3] = ["mem_used_total", "mem_used_max", "pages_compacted"];

impl ZramReplay {
    /// Replays `corpus`; `truth` is its kernel figures, if any (already checked against the
    /// corpus by [`Corpus::truth`]).
    pub fn run(&self, corpus: &Corpus, truth: Option<&Truth<MmStat>>) -> Result<ZramRun> {
        self.layout
            .validate()
            .map_err(ztier_pool::PoolError::from)?;
        let ps = self.layout.page_size;
        let pages = pages_of(corpus, ps)?;
        let bytes = pages.len() * ps;
        let alg = &self.algorithm;
        let threads = self.threads;
        let passes = passes_for(bytes);
        let total = (pages.len() * passes * 2) as u64;
        let streams = ReferenceStreams::default();
        let make_device = || -> Result<Device> {
            let pool = self.allocator.make_pool(&self.layout)?;
            Ok(Device::new(bytes as u64, alg.clone(), pool)?)
        };

        // Store, against the raw compressor on the same pages and threads, a fresh device a
        // pass; the last one goes on.
        let progress = Progress::new("store", total, self.progress);
        let (raw_compress_s, store_s, dev) = best_of_fresh_pairs(
            passes,
            &mut || make_device(),
            &mut || {
                for_each_page(&pages, threads, &progress, |_, page, scratch| {
                    scratch.resize(worst_case_len(ps), 0);
                    streams.with(alg, |c| c.compress(page, scratch))?;
                    Ok(())
                })
            },
            &mut |d: &Device| {
                for_each_page(&pages, threads, &progress, |i, page, _| {
                    d.write_page(i as u64, page)
                        .map_err(|e| at("writing", i, e))
                })
            },
        )?;
        progress.finish();
        let mm_stat = dev.mm_stat();
        let allocator_stats = self.allocator_stats.then(|| dev.allocator_stats());

        // Load, against the raw decompressor on the same objects.
        let compressed = compress_all(&pages, alg)?;
        let progress = Progress::new("load", total, self.progress);
        let (raw_decompress_s, load_s) = best_of_pairs(
            passes,
            &mut || {
                for_each_page(&pages, threads, &progress, |i, _, scratch| {
                    scratch.resize(ps, 0);
                    streams.with(alg, |c| c.decompress(&compressed[i], scratch))?;
                    Ok(())
                })
            },
            &mut || {
                for_each_page(&pages, threads, &progress, |i, _, scratch| {
                    scratch.resize(ps, 0);
                    dev.read_page(i as u64, scratch)
                        .map_err(|e| at("reading", i, e))
                })
            },
        )?;
        progress.finish();
        drop(compressed);

        // Every page read back byte for byte (untimed), now and after compaction.
        let verify = |i: usize, page: &[u8], scratch: &mut Vec<u8>| -> Result<()> {
            scratch.resize(ps, 0);
            dev.read_page(i as u64, scratch)
                .map_err(|e| at("reading", i, e))?;
            if scratch[..] != *page {
                return Err(ReplayError::Mismatch {
                    corpus: corpus.name.clone(),
                    page: i,
                });
            }
            Ok(())
        };
        let progress = Progress::new("verify", pages.len() as u64, self.progress);
        for_each_page(&pages, threads, &progress, verify)?;
        progress.finish();

        let mut mm_stat_after_discard = None;
        if self.discard_odd {
            for i in (1..pages.len()).step_by(2) {
                dev.discard_page(i as u64)
                    .map_err(|e| at("discarding", i, e))?;
            }
            mm_stat_after_discard = Some(dev.mm_stat());
        }
        dev.compact();
        let mm_stat_after_compact = dev.mm_stat();
        // What survived the discard must still read back after compaction moved it.
        let mut scratch = Vec::new();
        for (i, page) in pages.iter().enumerate() {
            if !(self.discard_odd && i % 2 == 1) {
                verify(i, page, &mut scratch)?;
            }
        }

        let device_mem_used_total = dev.mm_stat().mem_used_total;
        let rss_with = ztier_pool::process_rss_bytes().unwrap_or(0);

        let kept = |i: usize| !(self.discard_odd && i % 2 == 1);
        let mut recompress = None;
        if let Some(alg) = &self.recompress {
            dev.set_recomp_algorithms(vec![alg.clone()])?;
            let began = Instant::now();
            let r = dev.recompress(PageSelector::All, None, None)?;
            let seconds = began.elapsed().as_secs_f64();
            // Recompression leaves holes where the larger objects were; compaction (which
            // a user runs after it, as after any change) gives them back.
            dev.compact();
            recompress = Some(RecompressRun {
                algorithm: alg.to_string(),
                mm_stat_after_recompress: dev.mm_stat(),
                recompressed_pages: r.recompressed,
                incompressible_pages: r.incompressible,
                seconds: round3(seconds),
            });
            for (i, page) in pages.iter().enumerate() {
                if kept(i) {
                    verify(i, page, &mut scratch)?;
                }
            }
        }
        let mut writeback = None;
        if let Some(target) = &self.writeback {
            let store = Backing::new(target.store.clone(), target.format)?;
            dev.set_backing(Some(store))?;
            dev.mark_idle(None);
            let began = Instant::now();
            let r = dev.writeback(PageSelector::Idle, None, None)?;
            let wb_s = began.elapsed().as_secs_f64();
            dev.compact();
            let mm_stat_after_writeback = dev.mm_stat();
            let began = Instant::now();
            for_each_page(
                &pages,
                threads,
                &Progress::new("", 0, false),
                |i, page, scratch| {
                    if kept(i) {
                        verify(i, page, scratch)?;
                    }
                    Ok(())
                },
            )?;
            let rb_s = began.elapsed().as_secs_f64();
            let bd_stat = dev.bd_stat().expect("set above");
            let kept_bytes = (0..pages.len()).filter(|&i| kept(i)).count() * ps;
            writeback = Some(WritebackRun {
                store: target.name.clone(),
                format: target.format,
                pages_written_back: r.pages,
                mm_stat_after_writeback,
                bd_stat,
                writeback_bytes: r.bytes_written,
                writeback_bytes_per_page: round1(r.bytes_written as f64 / r.pages.max(1) as f64),
                writeback_mb_s: round1(mb_s(r.pages as usize * ps, wb_s)),
                readback_mb_s: round1(mb_s(kept_bytes, rb_s)),
            });
        }
        drop(dev);
        let rss_without = ztier_pool::process_rss_bytes().unwrap_or(0);

        let (raw_c, raw_d) = (mb_s(bytes, raw_compress_s), mb_s(bytes, raw_decompress_s));
        let (store, load) = (mb_s(bytes, store_s), mb_s(bytes, load_s));
        let mut run = ZramRun {
            corpus: corpus.name.clone(),
            pages: pages.len() as u64,
            page_size: ps,
            allocator: self.allocator.name(),
            compressor: alg.to_string(),
            chain_size: self.layout.chain_size,
            threads,
            mm_stat,
            mm_stat_after_discard,
            mm_stat_after_compact,
            store_mb_s: round1(store),
            load_mb_s: round1(load),
            raw_compress_mb_s: round1(raw_c),
            raw_decompress_mb_s: round1(raw_d),
            store_vs_raw: round3(store / raw_c),
            load_vs_raw: round3(load / raw_d),
            device_rss_bytes: rss_with.saturating_sub(rss_without),
            device_mem_used_total,
            verified: true,
            allocator_stats,
            kernel: None,
            recompress,
            writeback,
        };
        run.kernel = truth.and_then(|t| self.compare(t, &run));
        Ok(run)
    }

    /// The kernel's figures beside the run's, if the truth file describes this
    /// configuration.
    fn compare(&self, truth: &Truth<MmStat>, run: &ZramRun) -> Option<KernelComparison> {
        let config = &truth.kernel_config;
        if self.allocator != AllocatorKind::Zsmalloc
            || self.layout.page_size != config.page_size
            || self.layout.chain_size != config.zsmalloc_chain_size
            || self.algorithm.level.is_some()
        {
            return None;
        }
        let k = truth.zram.get(self.algorithm.kind.name())?;
        let mut notes = Vec::new();
        let (after_discard, after_compact) = if self.discard_odd {
            match &k.discard_odd_pages_then_compact {
                Some(exp) => (Some(exp.after_discard), Some(exp.after_compact)),
                None => {
                    notes.push(format!(
                        "the kernel's figures for {} have no discard experiment: only the write \
                         is compared",
                        self.algorithm
                    ));
                    (None, None)
                }
            }
        } else {
            (None, Some(k.mm_stat_after_compact))
        };
        if self.threads > 1 {
            notes.push(format!(
                "{} writers lay objects out in another order than the kernel's one dd writer: \
                 {} shown, not compared",
                self.threads,
                LAYOUT_FIELDS.join(", ")
            ));
        }
        let steps = [
            ("write", Some(run.mm_stat), Some(k.mm_stat)),
            ("discard", run.mm_stat_after_discard, after_discard),
            ("compact", Some(run.mm_stat_after_compact), after_compact),
        ];
        let mut fields = Vec::new();
        for (after, ours, theirs) in steps {
            let (Some(ours), Some(theirs)) = (ours, theirs) else {
                continue;
            };
            for ((field, z), kv) in MmStat::FIELDS
                .iter()
                .zip(ours.values())
                .zip(theirs.values())
            {
                fields.push(FieldComparison {
                    after,
                    field,
                    ztier: z,
                    kernel: kv,
                    compared: self.threads == 1 || !LAYOUT_FIELDS.contains(field),
                });
            }
        }
        let equal = fields.iter().all(|f| !f.compared || f.ztier == f.kernel);
        Some(KernelComparison {
            release: truth.kernel.clone(),
            mm_stat: k.mm_stat,
            mm_stat_after_discard: after_discard,
            mm_stat_after_compact: after_compact,
            write_mb_s: k.write_mb_s,
            read_mb_s: k.read_mb_s,
            fields,
            equal,
            notes,
        })
    }
}
