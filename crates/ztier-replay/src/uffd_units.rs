//! A userfaultfd region's sequential fault-in at a larger compression unit against the
//! page's, paired in one run (`ztier bench uffd --unit-size 4K,64K`): two regions hold the
//! same corpus, one at each unit size, and in each of the rounds (by default
//! [`DEFAULT_ROUNDS`]) each in turn has every page stored and then read back in order into
//! free memory, the raw decompressor timed beside them at both sizes. A round's figures
//! share the machine's moment, so their ratio holds where the speeds themselves swing by
//! half from one pass to the next (a fault thread's wake-ups and moves, the neighbours'
//! work on a shared host); the median of the rounds' ratios is the run's.
//!
//! Beside the ratio, what the decompression a larger unit saves allows: the page's fault-in
//! with the raw decompressor's difference between the two sizes taken off it. The trap, the
//! copy into place and the wake-ups cost about the same at every unit size, so that is
//! about what a larger unit can give; fewer lookups and device reads a page let it give a
//! little more. An estimate from the machine's decompressor, not a bound. Each round
//! measures it too.
//!
//! And the floor under the larger unit's fault-in, measured each round: the sum of the
//! parts that a handler cannot leave out for the same pages and the faults the region
//! took, each timed alone. Those are the unit's decompression alone, each unit once and
//! units of zeros not at all
//! ([`RawUnits::decompress_all`](crate::units::RawUnits::decompress_all)); the kernel's
//! copy-in of ready pages a unit at a time ([`ztier_uffd::rig::copy_in`]) for every page
//! but each fault's own and the zero pages fault-around maps (those of units of zeros: a
//! zero page in a unit with content comes in with the unit's copy, but for the few a read
//! of a zeroed page maps at the head of such a unit); and a bare handler's round trip,
//! placed as a region's fault thread places itself, for each fault, spurious ones included
//! ([`ztier_uffd::rig::floor::round_trip_median`], its one copy a fault's page). It is a
//! reference, not a bound: the parts can overlap (the fault thread wakes the faulting
//! thread before it decompresses and copies the neighbours, which the program then runs
//! beside), so a round's fault-in can pass it, and a handler decompressing ahead on another
//! CPU could go further. The floor's speed over the 4 KiB units' fault-in is what the ratio
//! would be were the larger unit's fault-in its floor (the cap); the larger unit's fault-in
//! over its floor says how near the region comes to it.
//!
//! The floor leaves out what a handler cannot: the waits between faults (the toucher
//! running to its next fault, the handler woken for it), the zero pages' mappings, the
//! faults on pages of a window not yet in. So each round also times a bare handler doing
//! the whole fault-in ([`ztier_uffd::rig::unit_fault_in`]): the same corpus at the same
//! unit, each fault's unit and window read with the raw decompressor and put in as a
//! region's fault thread puts them, placed as it places itself, and none of a region's
//! own work (its page table, states, locks, store, figures). Its speed over the 4 KiB
//! units' fault-in is the ratio a region with no work of its own would reach here (the
//! bare cap); the larger unit's fault-in over it is how near the region comes to that.
//! Both are taken at each pass's best over the rounds, not paired: beside the regions, a
//! bare pass now and then runs at a fifth of its speed (a region's pass too, more seldom),
//! which a median of five paired ratios does not shed. It runs right before the larger
//! unit's region's pass, once that region's pages are all stored: in the memory their
//! eviction freed, as the region's own pass would be. The kernel hands out pages freed a
//! moment ago dearer than pages long free (more misses taking each off its CPU's list):
//! run anywhere else, the bare pass would gain that over the region for no work of its
//! own. The region's pass then follows the bare pass's unmap, which frees as many pages a
//! moment before (its fault thread's CPU a pass stayed as it was: docs/diary.md,
//! 2026-12-01). Zero pages it puts in
//! nearly as a region does: those in a unit with content with the unit's copy (a region's
//! read fault on a zeroed page maps the zeroed pages after it up to the next stored one,
//! where the handler copies their unit whole), each run of units of zeros as the zero
//! page. Memory: the corpus,
//! its raw copies at both sizes, both regions resident after their passes, and during the
//! bare pass the bare handler's own copy of the pages (the larger unit's region then
//! stored).
//!
//! Only the public APIs of ztier-uffd (its region and its rig) and the raw compressor are
//! used.

use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_uffd::rig::{copy_in, floor::round_trip_median};
use ztier_uffd::{Region, RegionConfig};

use crate::uffd::{free_pass, region_err, store_all, UffdReplay};
use crate::units::RawSequential;
use crate::{median, Result};

/// Rounds of paired passes unless the caller asks for another number: the median of their
/// ratios is the run's, and each pass's best over them is set beside the bare handler's
/// best. More rounds (`ztier bench uffd --rounds`) give each pass more chances at its best
/// and show how far the figures swing; on this project's VM 15 did not steady them.
pub const DEFAULT_ROUNDS: usize = 5;

/// Bare round trips a round times for the floor (their median is taken).
const ROUND_TRIPS: usize = 500;

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
    /// The floor's parts: the unit's decompression alone, every unit of the corpus's
    /// `corpus_pages` once, and the kernel's copy-in of ready pages a unit at a time (MB of
    /// pages a second); a bare round trip's median (µs); the larger unit's pass's faults
    /// (from the store, of zeros, spurious: each a round trip), the pages it brought in as
    /// its fault-in counts them (each store fault's page and every page fault-around
    /// brought), and of those the pages copied in besides each fault's own (not the zero
    /// pages fault-around mapped: those of units of zeros).
    pub decompress_unit_mb_s: f64,
    pub copy_in_mb_s: f64,
    pub round_trip_us: f64,
    pub corpus_pages: u64,
    pub unit_faults: u64,
    pub unit_pages_in: u64,
    pub unit_pages_copied: u64,
    /// The bare handler's fault-in of the same pages at the larger unit (MB of pages a
    /// second), and the faults it read.
    pub bare_unit_fault_in_mb_s: f64,
    pub bare_unit_faults: u64,
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

    /// The floor under the larger unit's fault-in (see the module's comment), MB of pages a
    /// second as the fault-in counts them: the corpus's decompression, the copy-in of the
    /// pages copied besides each fault's own, and the faults' bare round trips, one after
    /// another.
    pub fn floor_mb_s(&self) -> f64 {
        let mb = |pages: u64| pages as f64 * CORPUS_PAGE as f64 / 1e6;
        let s = mb(self.corpus_pages) / self.decompress_unit_mb_s
            + mb(self.unit_pages_copied) / self.copy_in_mb_s
            + self.unit_faults as f64 * self.round_trip_us / 1e6;
        mb(self.unit_pages_in) / s.max(f64::EPSILON)
    }

    /// What the ratio would be were the larger unit's fault-in its floor: the floor's speed
    /// over the page's fault-in.
    pub fn cap(&self) -> f64 {
        self.floor_mb_s() / self.page_fault_in_mb_s
    }

    /// What the ratio would be were the larger unit's fault-in the bare handler's: its
    /// speed over the page's fault-in.
    pub fn bare_cap(&self) -> f64 {
        self.bare_unit_fault_in_mb_s / self.page_fault_in_mb_s
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
    /// Medians over the rounds: what the ratio would be at the floor ([`Round::cap`]),
    /// and the ratio over it (the larger unit's fault-in over its floor).
    pub cap: f64,
    pub ratio_to_cap: f64,
    /// Each at its best over the rounds (the fastest pass of each, where the machine's
    /// stalls, which only slow a pass, least reach it: a bare pass's speed swings by up to
    /// five times from one to the next with regions beside it): what the ratio would be at
    /// the bare handler's fault-in (its best over the page's best), and the larger unit's
    /// best fault-in over the bare handler's best.
    pub bare_cap: f64,
    pub ratio_to_bare: f64,
}

/// The median of the rounds' figures (NaN for none).
fn median_of(mut v: Vec<f64>) -> f64 {
    median(&mut v).unwrap_or(f64::NAN)
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

/// One [`free_pass`], as a round uses it.
struct Pass {
    mb_s: f64,
    /// Whether the fault thread ended the pass at idle priority (true where it cannot use
    /// it).
    idle_priority: bool,
    /// The faults the fault thread served (from the store, of zeros, spurious), the pages
    /// the pass brought in (each store fault's and fault-around's), and of those the ones
    /// copied in besides each store fault's own: all but the zero pages fault-around mapped
    /// (`zero_mapped`, the pages of the corpus's units of zeros at the region's unit size,
    /// less those faulted on themselves).
    faults: u64,
    pages_in: u64,
    pages_copied: u64,
}

fn timed_pass(region: &Region, corpus: &Corpus, zero_mapped: u64) -> Result<Pass> {
    let pass = free_pass(region, corpus)?;
    let (a, b) = (&pass.after, &pass.before);
    let store_faults = a.faults - b.faults;
    let zero_faults = a.zero_faults - b.zero_faults;
    let zeros_around = zero_mapped.saturating_sub(zero_faults);
    Ok(Pass {
        mb_s: pass.mb_s,
        idle_priority: a.idle_priority || !a.idle_priority_usable,
        faults: store_faults + zero_faults + (a.spurious_faults - b.spurious_faults),
        pages_in: pass.brought,
        pages_copied: pass.brought.saturating_sub(store_faults + zeros_around),
    })
}

impl UffdReplay {
    /// This replay's unit (larger than the page) against the page's, paired: `round_count`
    /// rounds (at least one) of a pass of each region, then of the raw decompressor at both
    /// sizes.
    pub fn fault_in_against_pages(
        &self,
        corpus: &Corpus,
        round_count: usize,
    ) -> Result<UnitFaultIn> {
        let ps = CORPUS_PAGE;
        let config = |unit_size| RegionConfig {
            algorithm: self.algorithm.clone(),
            clean_pages: self.clean_pages,
            idle_priority: self.idle_priority,
            cpu_latency_qos: self.cpu_latency_qos,
            unit_size,
            ..RegionConfig::default()
        };
        let unit_config = config(self.unit_size);
        let page_region = filled_region(corpus, &config(ps))?;
        let unit_region = filled_region(corpus, &unit_config)?;
        let raw = RawSequential::new(corpus, &self.algorithm, self.unit_size)?;
        // The pages each region maps as the zero page: at page-sized units every page of
        // zeros, at larger ones those of units of zeros.
        let (page_zeros, unit_zeros) = raw.zero_mapped_pages();
        let round_count = round_count.max(1);
        let mut rounds = Vec::with_capacity(round_count);
        for round in 0..round_count {
            // Each goes first in every other round, as in the raw decompressor's turns.
            let unit_first = round % 2 == 1;
            // The bare handler's pass right before the larger unit's region's, once that
            // region's pages are all stored (module doc).
            let bare_then_unit = || -> Result<_> {
                store_all(&unit_region)?;
                let bare = raw.bare_unit_fault_in(
                    unit_config.fault_around,
                    self.clean_pages,
                    self.idle_priority,
                    self.cpu_latency_qos,
                )?;
                Ok((bare, timed_pass(&unit_region, corpus, unit_zeros)?))
            };
            let (page, (bare, unit)) = if unit_first {
                let bare_and_unit = bare_then_unit()?;
                (timed_pass(&page_region, corpus, page_zeros)?, bare_and_unit)
            } else {
                let page = timed_pass(&page_region, corpus, page_zeros)?;
                (page, bare_then_unit()?)
            };
            let (raw_unit_mb_s, raw_page_mb_s) = raw.mb_s(unit_first)?;
            let decompress_unit_mb_s = raw.unit_decompress_mb_s()?;
            let copy_in_mb_s =
                copy_in::copy_in_mb_s(corpus.pages(), self.unit_size / ps, self.clean_pages)
                    .map_err(region_err("timing the kernel's copy-in"))?;
            let round_trip = round_trip_median(ROUND_TRIPS, self.cpu_latency_qos)
                .map_err(region_err("timing a bare round trip"))?;
            rounds.push(Round {
                page_fault_in_mb_s: page.mb_s,
                unit_fault_in_mb_s: unit.mb_s,
                raw_page_mb_s,
                raw_unit_mb_s,
                page_idle_priority: page.idle_priority,
                unit_idle_priority: unit.idle_priority,
                decompress_unit_mb_s,
                copy_in_mb_s,
                round_trip_us: round_trip.as_secs_f64() * 1e6,
                unit_faults: unit.faults,
                corpus_pages: corpus.pages() as u64,
                unit_pages_in: unit.pages_in,
                unit_pages_copied: unit.pages_copied,
                bare_unit_fault_in_mb_s: bare.mb_s(ps),
                bare_unit_faults: bare.faults,
            });
        }
        let ratio = median_of(rounds.iter().map(Round::ratio).collect());
        let allowed = median_of(rounds.iter().map(Round::allowed).collect());
        let ratio_to_allowed = median_of(rounds.iter().map(|r| r.ratio() / r.allowed()).collect());
        let cap = median_of(rounds.iter().map(Round::cap).collect());
        let ratio_to_cap = median_of(rounds.iter().map(|r| r.ratio() / r.cap()).collect());
        let best = |speed: fn(&Round) -> f64| rounds.iter().map(speed).fold(0.0, f64::max);
        let best_bare = best(|r| r.bare_unit_fault_in_mb_s);
        let bare_cap = best_bare / best(|r| r.page_fault_in_mb_s);
        let ratio_to_bare = best(|r| r.unit_fault_in_mb_s) / best_bare;
        Ok(UnitFaultIn {
            corpus: corpus.name.clone(),
            compressor: self.algorithm.to_string(),
            clean_pages: self.clean_pages,
            unit_size: self.unit_size,
            rounds,
            ratio,
            allowed,
            ratio_to_allowed,
            cap,
            ratio_to_cap,
            bare_cap,
            ratio_to_bare,
        })
    }
}
