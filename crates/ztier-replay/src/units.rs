//! Large compression units measured (memory and CPU against the kernel's 4 KiB pages): a corpus written to a fresh zram device of
//! one unit size (4, 16 or 64 KiB) on the allocator asked for (zsmalloc or zblock), one thread, whole units at a time; beside it,
//! the raw compressor on the same units in the same run (bytes and time), so that
//! `mem_used_total` over the raw compressed bytes is the allocator's overhead. Then reads:
//! every page in order (sequential), random single pages (uniform: each a 4 KiB read of a
//! unit not read just before, the worst case for larger units, which decompress the whole
//! unit), and readahead windows (the kernel's swap readahead at its default `page-cluster`
//! of 3: the 8 aligned pages around a random page, read in order, each timed: the
//! neighbours that follow a read, which a device of larger units serves from its cache of
//! decompressed units), with their latency quantiles. Every page is verified (untimed)
//! after the timed phases; the cache's memory is reported beside the pool's. The random
//! reads' reference is the raw decompressor on the same units in the same order, each timed
//! (a page out of a larger unit cannot come back in less than its unit's decompression:
//! the cap the machine sets on a random read's latency at that unit size).
//!
//! Same-filled units are skipped by the reference as zram skips them; a unit the compressor
//! cannot shrink below zram's raw threshold counts its whole size in the reference, as zram
//! stores it.

use std::time::Instant;

use serde::Serialize;
use ztier_compress::{same_filled, worst_case_len, Algorithm, Compressor};
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_uffd::rig::unit_fault_in::{self, BareFaultIn, UnitRead};
use ztier_zram::{Device, MmStat};

use crate::driver::{at, best_of_fresh_pairs, best_of_pairs, mb_s, passes_for, round1, round3};
use crate::{ReplayError, Result};

/// One unit size's run.
#[derive(Debug, Clone)]
pub struct UnitReplay {
    pub layout: ZsConfig,
    /// The allocator under the device (its objects up to the unit).
    pub allocator: AllocatorKind,
    pub algorithm: Algorithm,
    /// Bytes per unit: the layout's page size or a power of two up to 64 KiB.
    pub unit_size: usize,
    /// Random page reads timed one by one.
    pub random_reads: usize,
}

/// What one unit size made of a corpus (what `--json` prints).
#[derive(Debug, Clone, Serialize)]
pub struct UnitRun {
    pub corpus: String,
    pub compressor: String,
    pub allocator: String,
    pub unit_size: usize,
    /// Pages of the corpus (the device rounds up to whole units; the tail reads as zeros).
    pub pages: u64,
    pub mm_stat: MmStat,
    /// The raw compressor's bytes on the same units (same-filled skipped, raw ones whole).
    pub raw_compressed_bytes: u64,
    /// `mem_used_total` / `raw_compressed_bytes`: what the allocator adds.
    pub stored_vs_raw: f64,
    /// Seconds to store every unit (one thread, best of up to three passes).
    pub store_seconds: f64,
    /// Seconds the raw compressor took on the same units (best of the passes).
    pub raw_compress_seconds: f64,
    /// Every page read in order, MB of pages per second (best of the passes).
    pub sequential_read_mb_s: f64,
    /// The raw decompressor on every unit in order, each unit's pages copied out: the least
    /// a sequential 4 KiB reader pays at this unit size (MB of pages per second, best of the
    /// passes taken in turns with the device's). Its ratio between two unit sizes is the cap
    /// on theirs.
    pub raw_sequential_read_mb_s: f64,
    /// Every unit read whole in order (decompressed straight into the destination), MB per
    /// second (best of the passes).
    pub sequential_unit_read_mb_s: f64,
    /// Random single-page reads, MB of pages per second.
    pub random_read_mb_s: f64,
    /// Their latency quantiles, in microseconds.
    pub random_read_p50_us: f64,
    pub random_read_p99_us: f64,
    /// The raw decompressor on the units of the same random pages, in the same order, each
    /// timed (a same-filled unit filled, one stored whole copied): latency quantiles in
    /// microseconds. The floor of a random read at this unit size.
    pub raw_unit_decompress_p50_us: f64,
    pub raw_unit_decompress_p99_us: f64,
    /// Readahead windows (8 aligned pages around a random page, in order), MB of pages per
    /// second, as many pages as the random reads.
    pub readahead_read_mb_s: f64,
    /// Their latency quantiles (every page's read timed), in microseconds.
    pub readahead_read_p50_us: f64,
    pub readahead_read_p99_us: f64,
    /// Bytes the device's cache of decompressed units held after the reads (0 at the
    /// page's size, which has none); not in `mm_stat`.
    pub unit_cache_bytes: u64,
    pub verified: bool,
}

impl UnitReplay {
    pub fn run(&self, corpus: &Corpus) -> Result<UnitRun> {
        let layout = self.layout.with_max_object(self.unit_size);
        layout.validate().map_err(ztier_pool::PoolError::from)?;
        let unit = self.unit_size;
        let ps = layout.page_size;
        if corpus.bytes().len() < ps {
            return Err(ReplayError::CorpusTooSmall {
                corpus: corpus.name.clone(),
                page_size: ps,
            });
        }
        // Whole pages, padded with zeros to whole units.
        let page_bytes = corpus.bytes().len() / ps * ps;
        let mut data = corpus.bytes()[..page_bytes].to_vec();
        data.resize(page_bytes.div_ceil(unit) * unit, 0);
        let units: Vec<&[u8]> = data.chunks_exact(unit).collect();
        let pages = (page_bytes / ps) as u64;
        let make_device = || -> Result<Device> {
            let pool = self.allocator.make_pool(&layout)?;
            Ok(Device::with_unit_size(
                data.len() as u64,
                self.algorithm.clone(),
                pool,
                unit,
            )?)
        };
        let huge_from = make_device()?.huge_class_size();

        // The reference: the raw compressor on every unit zram would compress.
        let mut comp = self.algorithm.new_compressor();
        let compressed = RawUnits::compress(&mut *comp, &data, unit, huge_from)?;
        let raw_compressed_bytes = compressed.stored_bytes;
        let mut buf = vec![0u8; worst_case_len(unit)];

        let passes = passes_for(data.len()).min(3);
        let (raw_compress_seconds, store_seconds, dev) = best_of_fresh_pairs(
            passes,
            &mut || make_device(),
            &mut || {
                let began = Instant::now();
                for (i, u) in units.iter().enumerate() {
                    if same_filled(u).is_none() {
                        comp.compress(u, &mut buf)
                            .map_err(|e| at("compressing", i, e))?;
                    }
                }
                Ok(began.elapsed().as_secs_f64())
            },
            &mut |d: &Device| {
                let began = Instant::now();
                for (i, u) in units.iter().enumerate() {
                    d.write_unit(i as u64, u).map_err(|e| at("writing", i, e))?;
                }
                Ok(began.elapsed().as_secs_f64())
            },
        )?;
        let mm_stat = dev.mm_stat();

        // Sequential: every page in order, against the raw decompressor doing the least such
        // a reader needs at this unit size (each unit decompressed once, its pages copied
        // out), in turns.
        let mut page = vec![0u8; ps];
        let mut whole_unit = vec![0u8; unit];
        let (raw_sequential_s, sequential_s) = best_of_pairs(
            passes,
            &mut || compressed.sequential_read(&mut *comp, &data, ps),
            &mut || {
                let began = Instant::now();
                for p in 0..pages {
                    dev.read_page(p, &mut page)
                        .map_err(|e| at("reading", p as usize, e))?;
                }
                Ok(began.elapsed().as_secs_f64())
            },
        )?;

        // Sequential whole units: one decompression each.
        let mut whole = vec![0u8; unit];
        let (_, unit_read_s) = best_of_pairs(passes, &mut || Ok(0.0), &mut || {
            let began = Instant::now();
            for u in 0..units.len() {
                dev.read_unit(u as u64, &mut whole)
                    .map_err(|e| at("reading", u, e))?;
            }
            Ok(began.elapsed().as_secs_f64())
        })?;

        // The floor: the raw decompressor on the units of the random pages below (the same
        // draws), each timed.
        let seed = 0x9e37_79b9_7f4a_7c15;
        let mut rng = ztier_base::rng::Rng::from_state(seed);
        let mut raw_latencies = Vec::with_capacity(self.random_reads);
        for _ in 0..self.random_reads {
            let u = (rng.next_u64() % pages) as usize * ps / unit;
            let t = Instant::now();
            compressed.decompress(&mut *comp, u, &data, &mut whole_unit)?;
            raw_latencies.push(t.elapsed().as_nanos() as u64);
            std::hint::black_box(&whole_unit);
        }
        raw_latencies.sort_unstable();
        drop(compressed);

        // Random single pages, each timed.
        let mut rng = ztier_base::rng::Rng::from_state(seed);
        let mut latencies = Vec::with_capacity(self.random_reads);
        let began = Instant::now();
        for _ in 0..self.random_reads {
            let p = rng.next_u64() % pages;
            let t = Instant::now();
            dev.read_page(p, &mut page)
                .map_err(|e| at("reading", p as usize, e))?;
            latencies.push(t.elapsed().as_nanos() as u64);
        }
        let random_s = began.elapsed().as_secs_f64();
        latencies.sort_unstable();

        // Readahead windows: the kernel's swap readahead (page-cluster 3) brings the 8
        // aligned pages around the page asked for.
        const WINDOW: u64 = 8;
        let mut window_latencies = Vec::with_capacity(self.random_reads);
        let began = Instant::now();
        while window_latencies.len() < self.random_reads {
            let first = rng.next_u64() % pages / WINDOW * WINDOW;
            for p in first..(first + WINDOW).min(pages) {
                let t = Instant::now();
                dev.read_page(p, &mut page)
                    .map_err(|e| at("reading", p as usize, e))?;
                window_latencies.push(t.elapsed().as_nanos() as u64);
            }
        }
        let window_s = began.elapsed().as_secs_f64();
        window_latencies.sort_unstable();
        let unit_cache_bytes = dev.unit_cache_bytes();
        let quantile_of = |latencies: &[u64], q: f64| {
            let i = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
            latencies.get(i).map_or(0.0, |&ns| ns as f64 / 1000.0)
        };
        let quantile = |q: f64| quantile_of(&latencies, q);

        for p in 0..pages {
            dev.read_page(p, &mut page)
                .map_err(|e| at("reading", p as usize, e))?;
            let at_byte = p as usize * ps;
            if page[..] != data[at_byte..at_byte + ps] {
                return Err(ReplayError::Mismatch {
                    corpus: corpus.name.clone(),
                    page: p as usize,
                });
            }
        }

        Ok(UnitRun {
            corpus: corpus.name.clone(),
            compressor: self.algorithm.to_string(),
            allocator: self.allocator.name().to_string(),
            unit_size: unit,
            pages,
            mm_stat,
            raw_compressed_bytes,
            stored_vs_raw: round3(
                mm_stat.mem_used_total as f64 / raw_compressed_bytes.max(1) as f64,
            ),
            store_seconds: round3(store_seconds),
            raw_compress_seconds: round3(raw_compress_seconds),
            sequential_read_mb_s: round1(mb_s(pages as usize * ps, sequential_s)),
            raw_sequential_read_mb_s: round1(mb_s(data.len(), raw_sequential_s)),
            sequential_unit_read_mb_s: round1(mb_s(data.len(), unit_read_s)),
            random_read_mb_s: round1(mb_s(self.random_reads * ps, random_s)),
            random_read_p50_us: round1(quantile(0.5)),
            random_read_p99_us: round1(quantile(0.99)),
            raw_unit_decompress_p50_us: round1(quantile_of(&raw_latencies, 0.5)),
            raw_unit_decompress_p99_us: round1(quantile_of(&raw_latencies, 0.99)),
            readahead_read_mb_s: round1(mb_s(window_latencies.len() * ps, window_s)),
            readahead_read_p50_us: round1(quantile_of(&window_latencies, 0.5)),
            readahead_read_p99_us: round1(quantile_of(&window_latencies, 0.99)),
            unit_cache_bytes,
            verified: true,
        })
    }
}

/// A corpus's units as the raw compressor makes them, for the references timed beside a
/// device: what zram would store with no allocator (same-filled units skipped as zram skips
/// them, a unit it cannot shrink below zram's raw threshold kept whole).
pub struct RawUnits {
    unit: usize,
    units: Vec<RawUnit>,
    /// Each compressed unit's length, each unit kept whole's size.
    pub stored_bytes: u64,
}

/// A unit as the raw reference holds it.
enum RawUnit {
    /// Same-filled: its word, as zram keeps it.
    Filled(u64),
    /// Kept whole (the compressor could not shrink it below zram's threshold).
    Whole,
    Compressed(Vec<u8>),
}

impl RawUnits {
    /// `data` (whole units of `unit` bytes) compressed unit by unit; a unit compressing to
    /// `huge_from` bytes or more is kept whole, as zram keeps it.
    pub fn compress(
        comp: &mut dyn Compressor,
        data: &[u8],
        unit: usize,
        huge_from: usize,
    ) -> Result<RawUnits> {
        let mut buf = vec![0u8; worst_case_len(unit)];
        let mut stored_bytes = 0u64;
        let mut units = Vec::with_capacity(data.len() / unit);
        for (i, u) in data.chunks_exact(unit).enumerate() {
            if let Some(fill) = same_filled(u) {
                units.push(RawUnit::Filled(fill));
                continue;
            }
            let len = comp
                .compress(u, &mut buf)
                .map_err(|e| at("compressing", i, e))?;
            if len >= huge_from {
                stored_bytes += unit as u64;
                units.push(RawUnit::Whole);
            } else {
                stored_bytes += len as u64;
                units.push(RawUnit::Compressed(buf[..len].to_vec()));
            }
        }
        Ok(RawUnits {
            unit,
            units,
            stored_bytes,
        })
    }

    /// Brings unit `u` of `data` back into `into` as zram would: filled, copied (a unit
    /// kept whole), or decompressed.
    pub fn decompress(
        &self,
        comp: &mut dyn Compressor,
        u: usize,
        data: &[u8],
        into: &mut [u8],
    ) -> Result<()> {
        match &self.units[u] {
            RawUnit::Filled(fill) => ztier_compress::fill_page(into, *fill),
            RawUnit::Whole => into.copy_from_slice(&data[u * self.unit..(u + 1) * self.unit]),
            RawUnit::Compressed(bytes) => {
                comp.decompress(bytes, into)
                    .map_err(|e| at("decompressing", u, e))?;
            }
        }
        Ok(())
    }

    /// Whether unit `u` is all zeros (a region maps the zero page for its pages).
    pub fn zeros(&self, u: usize) -> bool {
        matches!(self.units[u], RawUnit::Filled(0))
    }

    /// Of the first `pages` corpus pages, those in units of zeros: the pages a region at
    /// this unit maps as the zero page when they come in (a zero page in a unit with content
    /// comes in with the unit's copy).
    pub fn zero_unit_pages(&self, pages: usize) -> u64 {
        let per_unit = self.unit / CORPUS_PAGE;
        (0..self.units.len())
            .filter(|&u| self.zeros(u))
            .map(|u| pages.saturating_sub(u * per_unit).min(per_unit) as u64)
            .sum()
    }

    /// Seconds for decompressing every unit once, in order, into one buffer: the
    /// decompressor's part alone of a sequential read. A unit of zeros is not read at all
    /// (a region maps the zero page for its pages); another same-filled one is filled.
    pub fn decompress_all(&self, comp: &mut dyn Compressor, data: &[u8]) -> Result<f64> {
        let mut whole = vec![0u8; self.unit];
        let began = Instant::now();
        for u in 0..self.units.len() {
            if !self.zeros(u) {
                self.decompress(comp, u, data, &mut whole)?;
                std::hint::black_box(&whole);
            }
        }
        Ok(began.elapsed().as_secs_f64())
    }

    /// Seconds for the least a reader of every page in order pays at this unit size: each
    /// unit decompressed once, its pages of `page_size` bytes copied out one by one.
    pub fn sequential_read(
        &self,
        comp: &mut dyn Compressor,
        data: &[u8],
        page_size: usize,
    ) -> Result<f64> {
        let mut whole = vec![0u8; self.unit];
        let mut page = vec![0u8; page_size];
        let began = Instant::now();
        for u in 0..self.units.len() {
            self.decompress(comp, u, data, &mut whole)?;
            for from in whole.chunks_exact(page_size) {
                page.copy_from_slice(from);
                std::hint::black_box(&page);
            }
        }
        Ok(began.elapsed().as_secs_f64())
    }
}

/// The raw decompressor bringing back every page of a corpus in order, at a unit size and
/// at the page: each unit decompressed once, its pages copied out.
pub(crate) struct RawSequential {
    /// The corpus's pages, padded with zeros to whole units.
    data: Vec<u8>,
    page_bytes: usize,
    units: RawUnits,
    pages: RawUnits,
    algorithm: Algorithm,
}

impl RawSequential {
    /// The corpus compressed at both sizes, a unit compressing to its pool's huge size or
    /// more kept whole, as the region's device keeps it.
    pub(crate) fn new(corpus: &Corpus, algorithm: &Algorithm, unit_size: usize) -> Result<Self> {
        let ps = CORPUS_PAGE;
        let page_bytes = corpus.pages() * ps;
        let mut data = corpus.bytes()[..page_bytes].to_vec();
        data.resize(data.len().div_ceil(unit_size) * unit_size, 0);
        let huge_from = |unit: usize| -> Result<usize> {
            let layout = ZsConfig {
                page_size: ps,
                ..ZsConfig::default()
            }
            .with_max_object(unit);
            Ok(AllocatorKind::Zsmalloc
                .make_pool(&layout)?
                .huge_class_size())
        };
        let mut comp = algorithm.new_compressor();
        let units = RawUnits::compress(&mut *comp, &data, unit_size, huge_from(unit_size)?)?;
        let pages = RawUnits::compress(&mut *comp, &data, ps, huge_from(ps)?)?;
        Ok(RawSequential {
            data,
            page_bytes,
            units,
            pages,
            algorithm: algorithm.clone(),
        })
    }

    /// The corpus's pages a region maps as the zero page when they come in, at page-sized
    /// units and at the unit ([`RawUnits::zero_unit_pages`]).
    pub(crate) fn zero_mapped_pages(&self) -> (u64, u64) {
        let pages = self.page_bytes / CORPUS_PAGE;
        (
            self.pages.zero_unit_pages(pages),
            self.units.zero_unit_pages(pages),
        )
    }

    /// The unit's decompression alone ([`RawUnits::decompress_all`]): MB of pages a second.
    pub(crate) fn unit_decompress_mb_s(&self) -> Result<f64> {
        let mut comp = self.algorithm.new_compressor();
        let s = self.units.decompress_all(&mut *comp, &self.data)?;
        Ok(self.page_bytes as f64 / s.max(f64::EPSILON) / 1e6)
    }

    /// A bare handler's sequential fault-in of the corpus's pages at the unit size
    /// ([`ztier_uffd::rig::unit_fault_in`]): each unit decompressed by the raw compressor,
    /// a unit of zeros mapped to the zero page; `window`, `write_protect`, `idle_priority`
    /// and `latency_qos` as the region's config has them.
    pub(crate) fn bare_unit_fault_in(
        &self,
        window: usize,
        write_protect: bool,
        idle_priority: bool,
        latency_qos: bool,
    ) -> Result<BareFaultIn> {
        let mut comp = self.algorithm.new_compressor();
        let units = &self.units;
        let read_unit = |u: usize, into: &mut [u8]| {
            if units.zeros(u) {
                return Ok(UnitRead::Zeros);
            }
            units
                .decompress(&mut *comp, u, &self.data, into)
                .map(|()| UnitRead::Content)
                .map_err(|e| e.to_string())
        };
        unit_fault_in::sequential_fault_in(
            self.page_bytes / CORPUS_PAGE,
            units.unit / CORPUS_PAGE,
            window,
            write_protect,
            idle_priority,
            latency_qos,
            read_unit,
        )
        .map_err(|source| ReplayError::Region {
            what: "the bare handler's fault-in",
            source,
        })
    }

    /// One timing of each, the unit's first if `unit_first`: MB of pages a second at the
    /// unit and at the page.
    pub(crate) fn mb_s(&self, unit_first: bool) -> Result<(f64, f64)> {
        let mut comp = self.algorithm.new_compressor();
        let len = self.page_bytes as f64;
        let mut time = |raw: &RawUnits| raw.sequential_read(&mut *comp, &self.data, CORPUS_PAGE);
        let (unit_s, page_s) = if unit_first {
            let unit_s = time(&self.units)?;
            (unit_s, time(&self.pages)?)
        } else {
            let page_s = time(&self.pages)?;
            (time(&self.units)?, page_s)
        };
        Ok((len / unit_s / 1e6, len / page_s / 1e6))
    }
}
