//! A userfaultfd region's sequential fault-in at a larger compression unit against the
//! page's, paired in one run (`ztier bench uffd --unit-size 4K,64K`): two regions hold the
//! same corpus, one at each unit size, and in each of [`ROUNDS`] rounds each in turn has
//! every page stored and then read back in order into free memory, the raw decompressor
//! timed beside them at both sizes. A round's figures share the machine's moment, so their
//! ratio holds where the speeds themselves swing by half from one pass to the next (a
//! fault thread's wake-ups and moves, the neighbours' work on a shared host); the median of
//! the rounds' ratios is the run's.
//!
//! Beside the ratio, what the decompression a larger unit saves allows: the page's fault-in
//! with the raw decompressor's difference between the two sizes taken off it. The trap, the
//! copy into place and the wake-ups cost about the same at every unit size, so that is
//! about what a larger unit can give; fewer lookups and device reads a page let it give a
//! little more. An estimate from the machine's decompressor, not a bound. Each round
//! measures it too.
//!
//! Only the public APIs of ztier-uffd (its region) and the raw compressor are used.

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_uffd::{Region, RegionConfig};

use crate::uffd::{free_pass, region_err, UffdReplay};
use crate::units::RawSequential;
use crate::Result;

/// Rounds of paired passes; the median of their ratios is the run's.
pub const ROUNDS: usize = 5;

/// One round: each region's pass, then the raw decompressor's at both sizes; MB of pages
/// a second.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Round {
    pub page_fault_in_mb_s: f64,
    pub unit_fault_in_mb_s: f64,
    pub raw_page_mb_s: f64,
    pub raw_unit_mb_s: f64,
    /// Whether each region's fault thread ended its pass at idle priority, where the region
    /// can use it (a pass at normal priority follows the faulting thread from CPU to CPU).
    pub page_idle_priority: bool,
    pub unit_idle_priority: bool,
}

impl Round {
    /// The larger unit's fault-in over the page's.
    pub fn ratio(&self) -> f64 {
        self.unit_fault_in_mb_s / self.page_fault_in_mb_s
    }

    /// What the decompression the unit saves allows: the page's fault-in with it taken off.
    pub fn allowed(&self) -> f64 {
        let page_s = 1.0 / self.page_fault_in_mb_s;
        let saved = 1.0 / self.raw_page_mb_s - 1.0 / self.raw_unit_mb_s;
        page_s / (page_s - saved).max(f64::EPSILON)
    }
}

/// The paired rounds of one corpus, compressor and clean-pages setting.
#[derive(Debug, Clone, Serialize)]
pub struct UnitFaultIn {
    pub corpus: String,
    pub compressor: String,
    pub clean_pages: bool,
    pub unit_size: usize,
    pub rounds: Vec<Round>,
    /// Medians over the rounds: the ratio, what the decompression saved allows, and the
    /// ratio over that.
    pub ratio: f64,
    pub allowed: f64,
    pub ratio_to_allowed: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A region holding every page of `corpus`, all resident.
fn filled_region(corpus: &Corpus, config: &RegionConfig) -> Result<Region> {
    let len = corpus.pages() * CORPUS_PAGE;
    let region = Region::with_config(len, len, config).map_err(region_err("making the region"))?;
    let words = region.words();
    for (i, page) in corpus.chunks(CORPUS_PAGE).enumerate() {
        for (w, bytes) in page.chunks_exact(8).enumerate() {
            let v = u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
            words[i * (CORPUS_PAGE / 8) + w].store(v, Relaxed);
        }
    }
    Ok(region)
}

/// [`free_pass`]'s speed, and whether the fault thread ended the pass at idle priority (true
/// where it cannot use it).
fn free_pass_mb_s(region: &Region, corpus: &Corpus) -> Result<(f64, bool)> {
    let pass = free_pass(region, corpus)?;
    let idle = pass.after.idle_priority || !pass.after.idle_priority_usable;
    Ok((pass.mb_s, idle))
}

impl UffdReplay {
    /// This replay's unit (larger than the page) against the page's, paired: [`ROUNDS`]
    /// rounds of a pass of each region, then of the raw decompressor at both sizes.
    pub fn fault_in_against_pages(&self, corpus: &Corpus) -> Result<UnitFaultIn> {
        let ps = CORPUS_PAGE;
        let config = |unit_size| RegionConfig {
            algorithm: self.algorithm.clone(),
            clean_pages: self.clean_pages,
            idle_priority: self.idle_priority,
            cpu_latency_qos: self.cpu_latency_qos,
            unit_size,
            ..RegionConfig::default()
        };
        let page_region = filled_region(corpus, &config(ps))?;
        let unit_region = filled_region(corpus, &config(self.unit_size))?;
        let raw = RawSequential::new(corpus, &self.algorithm, self.unit_size)?;
        let mut rounds = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            // Each goes first in every other round, as in the raw decompressor's turns.
            let unit_first = round % 2 == 1;
            let (page, unit) = if unit_first {
                let unit = free_pass_mb_s(&unit_region, corpus)?;
                (free_pass_mb_s(&page_region, corpus)?, unit)
            } else {
                let page = free_pass_mb_s(&page_region, corpus)?;
                (page, free_pass_mb_s(&unit_region, corpus)?)
            };
            let (
                (page_fault_in_mb_s, page_idle_priority),
                (unit_fault_in_mb_s, unit_idle_priority),
            ) = (page, unit);
            let (raw_unit_mb_s, raw_page_mb_s) = raw.mb_s(unit_first)?;
            rounds.push(Round {
                page_fault_in_mb_s,
                unit_fault_in_mb_s,
                raw_page_mb_s,
                raw_unit_mb_s,
                page_idle_priority,
                unit_idle_priority,
            });
        }
        let ratio = median(rounds.iter().map(Round::ratio).collect());
        let allowed = median(rounds.iter().map(Round::allowed).collect());
        let ratio_to_allowed = median(rounds.iter().map(|r| r.ratio() / r.allowed()).collect());
        Ok(UnitFaultIn {
            corpus: corpus.name.clone(),
            compressor: self.algorithm.to_string(),
            clean_pages: self.clean_pages,
            unit_size: self.unit_size,
            rounds,
            ratio,
            allowed,
            ratio_to_allowed,
        })
    }
}
