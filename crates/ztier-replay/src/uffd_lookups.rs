//! A lookup service over a region, to judge a budget that sizes itself against the best fixed one (
//! `ztier bench uffd --lookups SECONDS`): a corpus's pages kept in a region, one thread
//! serving lookups. Each phase has a hot set of its own size (a share of the pages) and
//! skew: a lookup's key follows a zipf law over the hot set's ranks, a rank's page given by
//! a bijection of the pages shifted by the phase's offset, so that the hot set drifts (the
//! offset moves a little each second) and jumps (each phase starts at a new offset). A few
//! lookups (`cold_share` of them) go to any page, uniformly: the rest of the memory is cold,
//! not dead, as a service's memory is (its captures' idle pages are read again, rarely). A
//! lookup folds `lookup_bytes` of its page `rounds` times (the work a service does with what
//! it looked up, sized so that a fault, whose cost docs/diary.md's region entries give,
//! costs a few lookups, not hundreds) and checks one word against the corpus.
//!
//! The same lookups (the same seed) run with the whole corpus resident (the every-page run),
//! at each fixed budget of a sweep, with the budget sizing itself from a stall target under
//! a cap of every page (`ztier_uffd::AutosizeConfig`), and with every page again, last;
//! each run reports its lookups, resident pages, budget, stall share and the CPU's speed
//! (below) each second. The baseline's pace is the two every-page runs' mean (how far they
//! differ is the noise left, reported beside), its memory the first's. The judgement: the
//! oracle is the fixed budget with the least memory whose pace is within the slowdown target
//! of the baseline's, chosen with hindsight; the self-sized run is set beside it: its
//! slowdown, and the share of the oracle's savings it saves.
//!
//! Memory is the region's resident pages plus its store's (`mem_used_total`), averaged over
//! the measured seconds (a warm-up before them is not counted: the fixed budgets' first
//! eviction, the controller's first steps). Lookups a second are over the same seconds, the
//! time the thread spent timing its reference (below) taken out.
//!
//! The CPU's own speed is taken beside them, because on a shared machine (a VM) it moves by
//! more than the 1 % a judgement reads: the same loop over the same memory ranged 5.6-9 %
//! over ten 4 s runs here, and moved 15 % over half a minute (docs/diary.md,
//! 2026-12-01, "The CPU's speed divided out"). Every 5 ms the lookup thread folds
//! `lookup_bytes` of its own heap (never in the region: no fault or eviction touches it) as
//! a lookup folds its page, once untimed (back into the CPU's cache) and then 4 times timed;
//! a second's reference speed is the median of its slices. A second's pace is its lookups
//! over its reference folds: lookups per reference fold. What it divides out is how fast
//! the core runs while the thread is on it (the reference stays in its first-level cache),
//! a load that shares the core all second long included (so a region's thread on an SMT
//! sibling would have its cost hidden); not the memory's speed (where the host put each
//! run's pages), nor time the thread is off its CPU or interrupted (preemption, the
//! region's threads sharing its CPU, a VM's stolen time, an eviction's TLB flush): that
//! lands in a few slices, which the median leaves out, so it stays a cost of the lookups.
//! The judgement reads paces; lookups a second are reported beside them.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use serde::Serialize;
use ztier_base::rng::Rng;
use ztier_compress::Algorithm;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_uffd::{AutosizeConfig, AutosizeStats, Region, RegionConfig};

use crate::{median, ReplayError, Result};

const PAGE: usize = CORPUS_PAGE;
const WORDS: usize = PAGE / 8;

/// The most phases before the skews and the hot sets line up again: a law is kept for
/// each (a float for each page of its hot set).
const MAX_PHASE_CYCLE: u64 = 64;

/// Lookups between two looks at the clock.
const LOOKUPS_A_LOOK: u64 = 64;

/// How often the lookup thread times the CPU's speed on its own page (0.3 % of the thread's
/// time here).
const REFERENCE_EVERY: Duration = Duration::from_millis(5);
/// The folds a slice times (about 9 µs here, after one fold untimed to bring the page back
/// into the CPU's cache): short, so that a slice is seldom one an eviction's TLB flush lands
/// in even when thousands come a second.
const REFERENCE_FOLDS: usize = 4;

/// The workload and the runs that judge the controller on it.
#[derive(Debug, Clone)]
pub struct Lookups {
    pub algorithm: Algorithm,
    /// Seconds measured a run, after the warm-up.
    pub seconds: u64,
    pub warmup_seconds: u64,
    /// Seconds a phase lasts: each starts its hot set at a new place, with the next skew
    /// and hot set.
    pub phase_seconds: u64,
    /// The zipf exponent of each phase, in turn.
    pub skews: Vec<f64>,
    /// The size of each phase's hot set, a share of the pages (over 0, at most 1), in turn
    /// (phase `k` takes `skews[k % skews.len()]` and `hot_shares[k % hot_shares.len()]`).
    pub hot_shares: Vec<f64>,
    /// The share of lookups that go to any page, uniformly, rather than to the hot set.
    pub cold_share: f64,
    /// How far the hot set drifts a second, a share of the pages.
    pub drift: f64,
    /// Bytes of its page a lookup reads (a multiple of 8, at most a page).
    pub lookup_bytes: usize,
    /// Times a lookup folds those bytes.
    pub rounds: usize,
    pub seed: u64,
    /// The fixed budgets tried, shares of the pages.
    pub fixed_shares: Vec<f64>,
    /// The self-sized runs' controller (its cap is set to every page, its stall target to
    /// each of `stall_targets` in turn).
    pub autosize: AutosizeConfig,
    pub stall_targets: Vec<f64>,
    /// The slowdown the oracle may have (0.01: 1 %).
    pub slowdown: f64,
    /// `RegionConfig::free_copies_when_full` for every run: a page read back keeps its copy
    /// only while the store has room, so that no budget costs more memory than every page.
    pub free_copies_when_full: bool,
}

impl Lookups {
    /// The judging run: 1 % slowdown target; phases of 10 s with skews 1.2, 0.9, 1.1, 0.8
    /// over hot sets of 50 %, 30 %, 60 % and 40 % of the pages; one lookup in 10 000 to any
    /// page; the hot set drifting 0.2 % of the pages a second; a lookup folds its whole page
    /// 8 times; fixed budgets from 97 % down to 10 %.
    pub fn new(algorithm: Algorithm, seconds: u64) -> Lookups {
        let mut autosize = AutosizeConfig::with_cap(0);
        autosize.shrink_step = 0.05;
        autosize.interval = Duration::from_millis(500);
        Lookups {
            algorithm,
            seconds,
            warmup_seconds: 5,
            phase_seconds: 10,
            skews: vec![1.2, 0.9, 1.1, 0.8],
            hot_shares: vec![0.5, 0.3, 0.6, 0.4],
            cold_share: 0.0001,
            drift: 0.002,
            lookup_bytes: PAGE,
            rounds: 8,
            seed: 61,
            fixed_shares: vec![0.97, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1],
            autosize,
            stall_targets: vec![0.01],
            slowdown: 0.01,
            free_copies_when_full: true,
        }
    }
}

/// How a run's budget was set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Budget {
    /// Every page: nothing evicted.
    Unlimited,
    /// This share of the pages.
    Fixed(f64),
    /// The controller's, under a cap of every page, steering to this stall share.
    Autosized(f64),
}

/// One second of a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Second {
    /// Seconds since the measured part began (negative in the warm-up).
    pub at: i64,
    /// Lookups a second of the lookup thread's time, its reference slices' taken out.
    pub lookups: u64,
    pub resident_pages: u64,
    pub store_bytes: u64,
    pub budget_pages: u64,
    /// The share of the second some lookup waited on the region, parts per million.
    pub stall_ppm: u64,
    /// The CPU's speed this second: the median of its reference slices, folds a second
    /// (`None` only if it had no slice, which the run's loop does not allow: a second ends
    /// after a slice is due).
    pub reference_folds_per_s: Option<f64>,
}

impl Second {
    /// Lookups per reference fold: the second's lookups with the CPU's speed divided out
    /// (`None` without a reference).
    pub fn pace(&self) -> Option<f64> {
        self.reference_folds_per_s
            .filter(|folds| *folds > 0.0)
            .map(|folds| self.lookups as f64 / folds)
    }
}

/// One run of the workload.
#[derive(Debug, Clone, Serialize)]
pub struct LookupRun {
    pub budget: Budget,
    pub pages: u64,
    /// Over the measured seconds: lookups a second, the region's memory (resident pages and
    /// the store's bytes), the resident pages alone, the budget, the stall share.
    pub lookups_per_s: f64,
    /// The mean of the measured seconds' paces (lookups per reference fold: the machine's
    /// speed divided out), what the judgement reads; and the machine's speed over them (the
    /// median of every slice).
    pub lookups_per_reference_fold: f64,
    pub reference_folds_per_s: f64,
    pub mean_memory_bytes: f64,
    pub mean_resident_pages: f64,
    pub mean_budget_pages: f64,
    pub stall_ppm: u64,
    /// The most the budget was over the measured seconds.
    pub max_budget_pages: u64,
    pub faults: u64,
    pub seconds: Vec<Second>,
    /// The controller's figures at the end (a self-sized run's).
    pub autosize: Option<AutosizeStats>,
}

/// The runs of one corpus and the judgement.
#[derive(Debug, Clone, Serialize)]
pub struct LookupJudgement {
    pub corpus: String,
    pub pages: u64,
    pub runs: Vec<LookupRun>,
    /// The slowdown target.
    pub slowdown: f64,
    /// Seconds a phase lasts (the hot set jumps at each change), and the warm-up's before
    /// the measured seconds (phases count from the run's start, the warm-up included).
    pub phase_seconds: u64,
    pub warmup_seconds: u64,
    /// Whether the runs' stores freed copies once full (`Lookups::free_copies_when_full`).
    pub free_copies_when_full: bool,
    /// What every slowdown is against: the mean pace of the every-page run, made first
    /// (`runs[0]`) and again after every other run, lookups per reference fold.
    pub baseline_lookups_per_reference_fold: f64,
    /// Those two runs' paces, the first and the last.
    pub every_page_runs_lookups_per_reference_fold: [f64; 2],
    /// How far they differ, a share of their mean: the noise left between two runs of the
    /// same budget once the CPU's speed is divided out, to read each slowdown beside.
    pub baseline_pace_spread: f64,
    /// The same in lookups a second, the CPU's speed left in: the two runs' mean, each,
    /// and how far they differ (to compare with `baseline_pace_spread`).
    pub baseline_lookups_per_s: f64,
    pub every_page_runs_lookups_per_s: [f64; 2],
    pub baseline_spread_lookups_per_s: f64,
    /// The fixed run with the least memory within the slowdown of the baseline (the
    /// every-page runs' mean pace): its index
    /// in `runs`; `None` if none was.
    pub oracle: Option<usize>,
    /// Memory the oracle saved against the first every-page run's, bytes.
    pub oracle_saved_bytes: f64,
    /// Each self-sized run set beside the oracle and the fixed runs.
    pub self_sized: Vec<SelfSized>,
}

/// A self-sized run judged.
#[derive(Debug, Clone, Serialize)]
pub struct SelfSized {
    /// Its index in `runs`.
    pub run: usize,
    /// Its slowdown against the baseline (1 - its pace over the every-page runs' mean).
    pub slowdown: f64,
    /// Memory it saved against the first every-page run's, bytes.
    pub saved_bytes: f64,
    /// The best fixed run that uses no more memory than it: its index, and this run's
    /// pace over its.
    pub best_fixed_within_memory: Option<usize>,
    pub pace_vs_best_fixed_within_memory: Option<f64>,
    /// Its saving over the oracle's, where the oracle saved something.
    pub share_of_oracle_saving: Option<f64>,
    /// For each phase change in the measured seconds: the seconds until a second's pace
    /// was back within the slowdown of the baseline's (0: the first second after it
    /// already was); `None` if not before the next change or the run's end.
    pub recovery_seconds: Vec<Option<u64>>,
    /// Whether the budget stayed within the controller's cap every second.
    pub within_cap: bool,
}

/// A lookup's work on the words it read: `rounds` folds of them (the same code times the
/// machine's speed on the reference page).
#[inline]
fn fold(words: &[AtomicU64], rounds: usize) -> u64 {
    let mut acc = 0u64;
    for _ in 0..rounds {
        for w in words {
            acc = acc.rotate_left(5) ^ w.load(Relaxed);
        }
    }
    acc
}

/// A rank's page: a bijection of the pages (a multiplier coprime to their number), so that
/// neighbouring ranks land on pages far apart, as a hash table's keys do.
struct Placement {
    pages: u64,
    multiplier: u64,
}

impl Placement {
    fn new(pages: u64) -> Placement {
        let mut multiplier = ((pages as f64 * 0.618_033_988_75) as u64).max(1);
        while gcd(multiplier, pages) != 1 {
            multiplier += 1;
        }
        Placement { pages, multiplier }
    }

    fn page(&self, rank: u64, offset: u64) -> u64 {
        ((rank + offset) % self.pages * self.multiplier) % self.pages
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

/// A draw in `[0, 1)`.
fn unit_draw(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// A zipf law over `n` ranks: its cumulative weights, drawn from by bisection.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, skew: f64) -> Zipf {
        let mut sum = 0.0;
        let cumulative = (1..=n)
            .map(|r| {
                sum += (r as f64).powf(-skew);
                sum
            })
            .collect();
        Zipf { cumulative }
    }

    fn rank(&self, rng: &mut Rng) -> u64 {
        let total = *self.cumulative.last().expect("at least one rank");
        let u = unit_draw(rng) * total;
        self.cumulative.partition_point(|&c| c < u) as u64
    }
}

impl Lookups {
    /// Every run on `corpus` (the baseline, the fixed budgets, the self-sized), each second
    /// given to `report` as it ends, and the judgement.
    pub fn judge(
        &self,
        corpus: &Corpus,
        report: &mut dyn FnMut(Budget, &Second),
    ) -> Result<LookupJudgement> {
        let pages = corpus.pages() as u64;
        if pages == 0 {
            return Err(ReplayError::CorpusTooSmall {
                corpus: corpus.name.clone(),
                page_size: PAGE,
            });
        }
        let zipfs = self.phase_laws(pages)?;
        let mut runs = vec![self.run(corpus, &zipfs, Budget::Unlimited, report)?];
        for &share in &self.fixed_shares {
            runs.push(self.run(corpus, &zipfs, Budget::Fixed(share), report)?);
        }
        for &target in &self.stall_targets {
            runs.push(self.run(corpus, &zipfs, Budget::Autosized(target), report)?);
        }
        // The every-page run again, last: how far two runs of the same budget differ on
        // this machine now, beside the differences the judgement reads.
        let again = self.run(corpus, &zipfs, Budget::Unlimited, report)?;
        Ok(self.verdict(corpus.name.clone(), pages, runs, &again))
    }

    /// Each phase's law over its hot set, one for each phase of a cycle through the skews
    /// and hot sets; or why the workload is refused.
    fn phase_laws(&self, pages: u64) -> Result<Vec<Zipf>> {
        let bad = |why: &'static str| Err(ReplayError::BadWorkload(why));
        if self.skews.is_empty() || self.hot_shares.is_empty() {
            return bad("each phase needs a skew and a hot set");
        }
        if !self.skews.iter().all(|s| s.is_finite() && *s >= 0.0) {
            return bad("a skew must be a finite number, at least 0");
        }
        if !self.hot_shares.iter().all(|h| *h > 0.0 && *h <= 1.0) {
            return bad("a hot set must be over 0 and at most every page");
        }
        if !(0.0..=1.0).contains(&self.cold_share) {
            return bad("the cold share must be 0 to 1");
        }
        let cycle = lcm(self.skews.len() as u64, self.hot_shares.len() as u64);
        if cycle > MAX_PHASE_CYCLE {
            return bad("the skews and the hot sets must line up within 64 phases");
        }
        Ok((0..cycle as usize)
            .map(|k| {
                let hot = self.hot_shares[k % self.hot_shares.len()];
                let hot_pages = ((pages as f64 * hot).round() as u64).clamp(1, pages);
                Zipf::new(hot_pages, self.skews[k % self.skews.len()])
            })
            .collect())
    }

    /// A lookup's rank among `pages`: any page's (`cold_share` of the lookups), or one of
    /// the phase's hot set's, by its law.
    fn draw_rank(&self, zipf: &Zipf, pages: u64, rng: &mut Rng) -> u64 {
        if unit_draw(rng) < self.cold_share {
            rng.below(pages)
        } else {
            zipf.rank(rng)
        }
    }

    /// The judgement of `runs` (the every-page run first, then the fixed and the
    /// self-sized runs), the every-page run made `again` after them.
    fn verdict(
        &self,
        corpus: String,
        pages: u64,
        runs: Vec<LookupRun>,
        again: &LookupRun,
    ) -> LookupJudgement {
        let base = &runs[0];
        let mean_and_spread = |pair: [f64; 2]| {
            let mean = (pair[0] + pair[1]) / 2.0;
            let spread = if mean > 0.0 {
                (pair[0] - pair[1]).abs() / mean
            } else {
                0.0
            };
            (mean, spread)
        };
        let every_page_paces = [
            base.lookups_per_reference_fold,
            again.lookups_per_reference_fold,
        ];
        let (base_pace, baseline_pace_spread) = mean_and_spread(every_page_paces);
        let every_page_runs_lookups_per_s = [base.lookups_per_s, again.lookups_per_s];
        let (baseline_lookups_per_s, baseline_spread_lookups_per_s) =
            mean_and_spread(every_page_runs_lookups_per_s);
        let fixed = 1..1 + self.fixed_shares.len();
        let within =
            |r: &LookupRun| r.lookups_per_reference_fold >= base_pace * (1.0 - self.slowdown);
        let least_memory = |a: &usize, b: &usize| {
            runs[*a]
                .mean_memory_bytes
                .total_cmp(&runs[*b].mean_memory_bytes)
        };
        let oracle = fixed
            .clone()
            .filter(|&i| within(&runs[i]))
            .min_by(least_memory);
        let saved = |r: &LookupRun| base.mean_memory_bytes - r.mean_memory_bytes;
        let self_sized = (fixed.end..runs.len())
            .map(|run| {
                let me = &runs[run];
                let best_fixed_within_memory = fixed
                    .clone()
                    .filter(|&i| runs[i].mean_memory_bytes <= me.mean_memory_bytes)
                    .max_by(|a, b| {
                        runs[*a]
                            .lookups_per_reference_fold
                            .total_cmp(&runs[*b].lookups_per_reference_fold)
                    });
                let oracle_saved = oracle.map_or(0.0, |i| saved(&runs[i]));
                SelfSized {
                    run,
                    slowdown: 1.0 - me.lookups_per_reference_fold / base_pace,
                    saved_bytes: saved(me),
                    best_fixed_within_memory,
                    pace_vs_best_fixed_within_memory: best_fixed_within_memory.map(|i| {
                        me.lookups_per_reference_fold / runs[i].lookups_per_reference_fold
                    }),
                    share_of_oracle_saving: (oracle_saved > 0.0).then(|| saved(me) / oracle_saved),
                    recovery_seconds: self.recoveries(me, base_pace * (1.0 - self.slowdown)),
                    within_cap: me
                        .autosize
                        .as_ref()
                        .is_none_or(|a| me.max_budget_pages <= a.cap_pages),
                }
            })
            .collect();
        LookupJudgement {
            corpus,
            pages,
            slowdown: self.slowdown,
            phase_seconds: self.phase_seconds,
            warmup_seconds: self.warmup_seconds,
            free_copies_when_full: self.free_copies_when_full,
            baseline_lookups_per_reference_fold: base_pace,
            every_page_runs_lookups_per_reference_fold: every_page_paces,
            baseline_pace_spread,
            baseline_lookups_per_s,
            every_page_runs_lookups_per_s,
            baseline_spread_lookups_per_s,
            oracle,
            oracle_saved_bytes: oracle.map_or(0.0, |i| saved(&runs[i])),
            self_sized,
            runs,
        }
    }

    /// For each phase change within `run`'s measured seconds, the seconds until one of them
    /// kept a pace of at least `good` (see [`SelfSized::recovery_seconds`]).
    fn recoveries(&self, run: &LookupRun, good: f64) -> Vec<Option<u64>> {
        let phase = self.phase_seconds.max(1) as i64;
        let (first, last) = match (run.seconds.first(), run.seconds.last()) {
            (Some(f), Some(l)) => (f.at, l.at),
            _ => return Vec::new(),
        };
        // Phases begin every `phase` seconds from the run's start, warm-up included; a
        // second's `at` is its end, counted from the measured part's start.
        let warmup = self.warmup_seconds as i64;
        (1..)
            .map(|k| k * phase - warmup)
            .skip_while(|&change| change < first - 1)
            .take_while(|&change| change < last)
            .map(|change| {
                run.seconds
                    .iter()
                    .filter(|s| s.at > change && s.at <= change + phase)
                    .find(|s| s.pace().is_some_and(|pace| pace >= good))
                    .map(|s| (s.at - change - 1) as u64)
            })
            .collect()
    }

    /// One run: a fresh region with the corpus in it, the budget set, the lookups served.
    fn run(
        &self,
        corpus: &Corpus,
        zipfs: &[Zipf],
        budget: Budget,
        report: &mut dyn FnMut(Budget, &Second),
    ) -> Result<LookupRun> {
        let region_err = |what| move |source| ReplayError::Region { what, source };
        let pages = corpus.pages() as u64;
        let len = pages as usize * PAGE;
        let config = RegionConfig {
            algorithm: self.algorithm.clone(),
            free_copies_when_full: self.free_copies_when_full,
            ..RegionConfig::default()
        };
        let region =
            Region::with_config(len, len, &config).map_err(region_err("making the region"))?;
        if region.page_size() != PAGE {
            return Err(ReplayError::Region {
                what: "the region's pages",
                source: ztier_uffd::Error::BadLength {
                    len,
                    page_size: region.page_size(),
                },
            });
        }
        let words = region.words();
        for (w, bytes) in words.iter().zip(corpus.bytes().chunks_exact(8)) {
            w.store(
                u64::from_le_bytes(bytes.try_into().expect("8 bytes")),
                Relaxed,
            );
        }
        match budget {
            Budget::Unlimited => {}
            Budget::Fixed(share) => {
                let pages = ((pages as f64 * share) as usize).max(1);
                region
                    .set_budget(pages * PAGE)
                    .map_err(region_err("setting the budget"))?;
            }
            Budget::Autosized(target_stall) => {
                let config = AutosizeConfig {
                    cap: len,
                    target_stall,
                    ..self.autosize.clone()
                };
                region
                    .set_autosize(Some(config))
                    .map_err(region_err("sizing the budget"))?;
            }
        }
        let placement = Placement::new(pages);
        let mut rng = Rng::new(self.seed);
        let mut phase_rng = Rng::new(self.seed ^ 0x61);
        let fold_words = (self.lookup_bytes / 8).clamp(1, WORDS);
        let rounds = self.rounds.max(1);
        // The machine's speed is timed on a page of the thread's own, folded as a lookup
        // folds its page.
        let mut reference_rng = Rng::new(self.seed ^ 0x5eed);
        let reference: Vec<AtomicU64> = (0..fold_words)
            .map(|_| AtomicU64::new(reference_rng.next_u64()))
            .collect();
        let mut slices_this_second: Vec<f64> = Vec::new();
        let mut measured_slices: Vec<f64> = Vec::new();
        let mut reference_time_this_second = Duration::ZERO;
        let started = Instant::now();
        let mut next_slice = started;
        let measure_from = started + Duration::from_secs(self.warmup_seconds);
        let end = measure_from + Duration::from_secs(self.seconds);
        let mut phase = usize::MAX;
        let mut phase_offset = 0u64;
        let mut seconds = Vec::new();
        let mut second_began = started;
        let mut lookups_this_second = 0u64;
        let mut stall_then = region.stats().stall_us;
        let mut sink = 0u64;
        let mut now = started;
        while now < end {
            let elapsed = now.duration_since(started).as_secs_f64();
            let this_phase = (elapsed / self.phase_seconds as f64) as usize;
            if this_phase != phase {
                phase = this_phase;
                phase_offset = phase_rng.below(pages);
            }
            let drift = (elapsed * self.drift * pages as f64) as u64;
            let offset = phase_offset + drift;
            let zipf = &zipfs[phase % zipfs.len()];
            for _ in 0..LOOKUPS_A_LOOK {
                let rank = self.draw_rank(zipf, pages, &mut rng);
                let page = placement.page(rank, offset) as usize;
                let first = (rank as usize * 7) % (WORDS - fold_words + 1);
                let base = page * WORDS + first;
                let acc = fold(&words[base..base + fold_words], rounds);
                let got = words[base].load(Relaxed);
                let at = base * 8;
                let want =
                    u64::from_le_bytes(corpus.bytes()[at..at + 8].try_into().expect("8 bytes"));
                if got != want {
                    return Err(ReplayError::RegionMismatch {
                        corpus: corpus.name.clone(),
                        pass: "in a lookup",
                        page,
                        word: first,
                        got,
                        want,
                        region_says: crate::uffd::region_says(&region),
                    });
                }
                sink = sink.wrapping_add(acc);
            }
            lookups_this_second += LOOKUPS_A_LOOK;
            now = Instant::now();
            if now >= next_slice {
                let reference_began = now;
                // Untimed: the page back in the CPU's cache after the lookups.
                sink = sink.wrapping_add(fold(std::hint::black_box(&reference), rounds));
                let slice_began = Instant::now();
                for _ in 0..REFERENCE_FOLDS {
                    // Each fold made: the compiler may not merge the same work done again.
                    sink = sink.wrapping_add(fold(std::hint::black_box(&reference), rounds));
                }
                now = Instant::now();
                let took = now.duration_since(slice_began);
                reference_time_this_second += now.duration_since(reference_began);
                slices_this_second.push(REFERENCE_FOLDS as f64 / took.as_secs_f64().max(1e-9));
                next_slice = now + REFERENCE_EVERY;
            }
            if now.duration_since(second_began) >= Duration::from_secs(1) {
                let s = region.stats();
                let wall = now.duration_since(second_began);
                let stalled = s.stall_us.saturating_sub(stall_then);
                // The lookups' own time: the reference slices' taken out.
                let serving = wall.saturating_sub(reference_time_this_second);
                let second = Second {
                    at: (now.duration_since(started).as_secs() as i64) - self.warmup_seconds as i64,
                    lookups: (lookups_this_second as f64 / serving.as_secs_f64().max(1e-9)) as u64,
                    resident_pages: s.resident_pages,
                    store_bytes: s.mm_stat.mem_used_total,
                    budget_pages: s.budget_pages,
                    stall_ppm: (stalled as f64 / wall.as_secs_f64()) as u64,
                    reference_folds_per_s: median(&mut slices_this_second),
                };
                report(budget, &second);
                if now > measure_from {
                    seconds.push(second);
                    measured_slices.append(&mut slices_this_second);
                }
                slices_this_second.clear();
                reference_time_this_second = Duration::ZERO;
                stall_then = s.stall_us;
                second_began = now;
                lookups_this_second = 0;
            }
        }
        std::hint::black_box(sink);
        let s = region.stats();
        let n = seconds.len().max(1) as f64;
        let mean = |f: &dyn Fn(&Second) -> f64| seconds.iter().map(f).sum::<f64>() / n;
        let paces: Vec<f64> = seconds.iter().filter_map(Second::pace).collect();
        Ok(LookupRun {
            budget,
            pages,
            lookups_per_s: mean(&|s| s.lookups as f64),
            lookups_per_reference_fold: paces.iter().sum::<f64>() / paces.len().max(1) as f64,
            reference_folds_per_s: median(&mut measured_slices).unwrap_or(0.0),
            mean_memory_bytes: mean(&|s| (s.resident_pages * PAGE as u64 + s.store_bytes) as f64),
            mean_resident_pages: mean(&|s| s.resident_pages as f64),
            mean_budget_pages: mean(&|s| s.budget_pages as f64),
            stall_ppm: mean(&|s| s.stall_ppm as f64) as u64,
            max_budget_pages: seconds.iter().map(|s| s.budget_pages).max().unwrap_or(0),
            faults: s.faults,
            seconds,
            autosize: s.autosize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A short judgement on the bundled sample: every lookup checked against the corpus
    /// (a wrong word fails the run), nothing evicted with every page in budget, a fixed
    /// budget held, and the self-sized budget moved by its controller and never over its cap,
    /// with a recovery figure for each phase change.
    #[test]
    fn a_short_judgement_holds_its_budgets() {
        let sample = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../samples/sample.pages.zst"
        );
        let corpus = Corpus::load(std::path::Path::new(sample)).expect("the bundled sample");
        let mut w = Lookups::new(RegionConfig::default().algorithm, 4);
        w.warmup_seconds = 1;
        w.phase_seconds = 2;
        w.fixed_shares = vec![0.5];
        w.stall_targets = vec![0.01];
        let judged = match w.judge(&corpus, &mut |_, _| {}) {
            Err(ReplayError::Region {
                source: ztier_uffd::Error::NotPermitted(e),
                ..
            }) => {
                eprintln!("skipped: userfaultfd is not permitted here: {e}");
                return;
            }
            judged => judged.expect("the judgement"),
        };
        let pages = corpus.pages() as u64;
        assert_eq!(judged.runs.len(), 3);
        let [first, last] = judged.every_page_runs_lookups_per_reference_fold;
        assert!(first > 0.0 && last > 0.0, "{first} {last}");
        assert_eq!(
            judged.baseline_lookups_per_reference_fold,
            (first + last) / 2.0
        );
        assert_eq!(
            judged.baseline_pace_spread,
            (first - last).abs() / judged.baseline_lookups_per_reference_fold
        );
        let [first, last] = judged.every_page_runs_lookups_per_s;
        assert_eq!(judged.baseline_lookups_per_s, (first + last) / 2.0);
        assert_eq!(
            judged.baseline_spread_lookups_per_s,
            (first - last).abs() / judged.baseline_lookups_per_s
        );
        for r in &judged.runs {
            // Every measured second timed the CPU (a slice each 5 ms), and the run's pace is
            // its seconds' mean.
            assert!(r.reference_folds_per_s > 0.0, "{r:?}");
            assert!(r
                .seconds
                .iter()
                .all(|s| s.reference_folds_per_s.is_some_and(|f| f > 0.0)));
            let paces: Vec<f64> = r.seconds.iter().filter_map(Second::pace).collect();
            let mean = paces.iter().sum::<f64>() / paces.len() as f64;
            assert!((r.lookups_per_reference_fold - mean).abs() <= mean * 1e-9);
        }
        let (every, fixed, sized) = (&judged.runs[0], &judged.runs[1], &judged.runs[2]);
        assert_eq!(every.faults, 0, "every page in budget: nothing evicted");
        assert!(
            fixed.max_budget_pages <= pages / 2,
            "{}",
            fixed.max_budget_pages
        );
        assert!(fixed.faults > 0, "half the pages in budget: lookups fault");
        let controller = sized.autosize.as_ref().expect("the controller's figures");
        assert!(controller.steps > 0, "{controller:?}");
        assert_eq!(controller.cap_pages, pages);
        assert!(controller.fault_overhead_ns > 0, "{controller:?}");
        let me = &judged.self_sized[0];
        assert_eq!(me.run, 2);
        assert!(me.within_cap && sized.max_budget_pages <= pages);
        // Changes at measured seconds 1 and 3 (2 s phases after a 1 s warm-up); the last
        // second may end before the second change.
        assert!(
            (1..=2).contains(&me.recovery_seconds.len()),
            "{:?}",
            me.recovery_seconds
        );
    }

    #[test]
    fn recovery_is_counted_from_each_phase_change_within_its_phase() {
        // Phases of 10 s after a 5 s warm-up: changes at measured seconds 5, 15 and 25.
        let w = Lookups::new(RegionConfig::default().algorithm, 30);
        let slow = |at: i64| (6..=7).contains(&at) || (16..=25).contains(&at);
        let run = LookupRun {
            budget: Budget::Autosized(0.01),
            pages: 1,
            lookups_per_s: 0.0,
            lookups_per_reference_fold: 0.0,
            reference_folds_per_s: 0.0,
            mean_memory_bytes: 0.0,
            mean_resident_pages: 0.0,
            mean_budget_pages: 0.0,
            stall_ppm: 0,
            max_budget_pages: 1,
            faults: 0,
            seconds: (1..=30)
                .map(|at| Second {
                    at,
                    lookups: if slow(at) { 50 } else { 100 },
                    resident_pages: 1,
                    store_bytes: 0,
                    budget_pages: 1,
                    stall_ppm: 0,
                    // A machine twice as fast from second 20: the pace, not the lookups,
                    // says when a run is back.
                    reference_folds_per_s: Some(if at >= 20 { 2.0 } else { 1.0 }),
                })
                .collect(),
            autosize: None,
        };
        // From second 26 the lookups are back to 100 a second, but on a machine twice as
        // fast: half the pace, not back.
        assert_eq!(w.recoveries(&run, 99.0), [Some(2), None, None]);
        assert_eq!(w.recoveries(&run, 20.0), [Some(0), Some(0), Some(0)]);
        // A second without a reference slice never counts as back.
        let mut blind = run.clone();
        blind
            .seconds
            .iter_mut()
            .for_each(|s| s.reference_folds_per_s = None);
        assert_eq!(w.recoveries(&blind, 1.0), [None, None, None]);
    }

    /// A run of the given pace, lookups a second and memory, for the judgement alone.
    fn judged_run(budget: Budget, pace: f64, lookups_per_s: f64, memory: f64) -> LookupRun {
        LookupRun {
            budget,
            pages: 100,
            lookups_per_s,
            lookups_per_reference_fold: pace,
            reference_folds_per_s: lookups_per_s / pace,
            mean_memory_bytes: memory,
            mean_resident_pages: 0.0,
            mean_budget_pages: 0.0,
            stall_ppm: 0,
            max_budget_pages: 0,
            faults: 0,
            seconds: Vec::new(),
            autosize: None,
        }
    }

    #[test]
    fn the_judgement_reads_pace_not_lookups_a_second() {
        let mut w = Lookups::new(RegionConfig::default().algorithm, 4);
        w.fixed_shares = vec![0.9, 0.5];
        w.stall_targets = vec![0.01];
        // The CPU slowed down for the 90 % run (fewer lookups a second, the same pace) and
        // sped up for the 50 % run (as many lookups a second as every page, a slower pace).
        let runs = vec![
            judged_run(Budget::Unlimited, 1.0, 100.0, 100.0),
            judged_run(Budget::Fixed(0.9), 0.995, 90.0, 90.0),
            judged_run(Budget::Fixed(0.5), 0.95, 100.0, 50.0),
            judged_run(Budget::Autosized(0.01), 0.992, 80.0, 85.0),
        ];
        let again = judged_run(Budget::Unlimited, 1.0, 100.0, 100.0);
        let j = w.verdict("model".to_string(), 100, runs, &again);
        assert_eq!(j.baseline_lookups_per_reference_fold, 1.0);
        assert_eq!(j.baseline_pace_spread, 0.0);
        // Within 1 % in pace: the 90 % run, not the 50 % one (within in lookups a second).
        assert_eq!(j.oracle, Some(1));
        assert_eq!(j.oracle_saved_bytes, 10.0);
        let me = &j.self_sized[0];
        assert_eq!(me.run, 3);
        assert!((me.slowdown - 0.008).abs() < 1e-12, "{}", me.slowdown);
        assert_eq!(me.share_of_oracle_saving, Some(1.5));
        // The best fixed run within its memory is the 50 % one, set beside it in pace.
        assert_eq!(me.best_fixed_within_memory, Some(2));
        let ratio = me.pace_vs_best_fixed_within_memory.expect("a ratio");
        assert!((ratio - 0.992 / 0.95).abs() < 1e-12, "{ratio}");
    }

    #[test]
    fn the_median_of_the_slices() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [9.0, 1.0, 5.0]), Some(5.0));
        assert_eq!(median(&mut [9.0, 1.0, 5.0, 2.0]), Some(3.5));
        // A slice an interrupt slowed leaves the median where the other slices put it.
        assert_eq!(median(&mut [10.0, 10.0, 0.1, 10.0, 10.0]), Some(10.0));
    }

    #[test]
    fn each_phase_draws_from_its_own_hot_set_and_bad_phases_are_refused() {
        let mut w = Lookups::new(RegionConfig::default().algorithm, 4);
        w.skews = vec![1.0, 0.5];
        w.hot_shares = vec![0.5, 0.25, 1.0];
        let laws = w.phase_laws(1000).expect("valid");
        // Six phases before the skews and the hot sets line up again.
        let sizes: Vec<usize> = laws.iter().map(|z| z.cumulative.len()).collect();
        assert_eq!(sizes, [500, 250, 1000, 500, 250, 1000]);
        // No lookup cold: every draw in the phase's hot set.
        w.cold_share = 0.0;
        let mut rng = Rng::new(3);
        assert!((0..10_000).all(|_| w.draw_rank(&laws[1], 1000, &mut rng) < 250));
        // Every lookup cold: the draws reach the pages outside the hot set, most of them.
        w.cold_share = 1.0;
        let outside = (0..10_000)
            .filter(|_| w.draw_rank(&laws[1], 1000, &mut rng) >= 250)
            .count();
        assert!((7000..8000).contains(&outside), "{outside}");
        for (skews, hot, cold) in [
            (vec![], vec![0.5], 0.0),
            (vec![1.0], vec![], 0.0),
            (vec![f64::NAN], vec![0.5], 0.0),
            (vec![1.0], vec![0.0], 0.0),
            (vec![1.0], vec![1.5], 0.0),
            (vec![1.0], vec![0.5], -0.1),
            (vec![1.0; 13], vec![0.5; 7], 0.0),
        ] {
            w.skews = skews;
            w.hot_shares = hot;
            w.cold_share = cold;
            assert!(matches!(
                w.phase_laws(1000),
                Err(ReplayError::BadWorkload(_))
            ));
        }
        // A hot set of a few pages of a small corpus keeps one page at least.
        w.skews = vec![1.0];
        w.hot_shares = vec![0.001];
        w.cold_share = 0.0;
        assert_eq!(w.phase_laws(10).expect("valid")[0].cumulative.len(), 1);
    }

    #[test]
    fn the_placement_is_a_bijection_and_the_zipf_law_favours_low_ranks() {
        for pages in [1u64, 2, 10, 97, 1000, 4096] {
            let p = Placement::new(pages);
            let mut seen = vec![false; pages as usize];
            for r in 0..pages {
                seen[p.page(r, 5) as usize] = true;
            }
            assert!(seen.iter().all(|&s| s), "{pages} pages");
        }
        let z = Zipf::new(1000, 1.0);
        let mut rng = Rng::new(1);
        let draws: Vec<u64> = (0..10_000).map(|_| z.rank(&mut rng)).collect();
        assert!(draws.iter().all(|&r| r < 1000));
        let top10 = draws.iter().filter(|&&r| r < 10).count();
        // H(10)/H(1000) = 2.93/7.49: 39 % of draws in the first 10 ranks.
        assert!((3500..4300).contains(&top10), "{top10}");
    }
}
