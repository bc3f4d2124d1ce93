//! The far tier judged on a capture over time: the trace replayed through zram with a store
//! (a swapping process's pages, as [`crate::trace`] replays them) at its recorded pace, the
//! device's clock set to the capture's time before each epoch, and the device's own policy
//! ([`PolicyRunner`]) passing every `interval` of that time, writing back pages idle for a
//! fixed age, for each of a range of them, or for the age the promotion controller chooses
//! from the device's reads and pages by age (`ztier_zram::promotion`). A promotion is a
//! changed page swapped in from the store.
//!
//! What each run reports: the promotions per minute as a share of the pages on the store
//! (the mean over the epochs), the worst whole minute's share, the pages written back and
//! held on the store. The verdict: the fixed age that keeps the most pages on the store
//! while meeting the target, chosen with hindsight (the oracle), against the controller:
//! the goal is the target met while holding at least [`GOAL_OF_ORACLE`] of what the oracle
//! holds.
//!
//! Invariants: every run replays the same trace over its own device and its own store in
//! memory; ages are whole seconds of the capture's time alone (the device's clock is pinned
//! to each epoch's, however long the epoch takes to replay), so two runs at one age are the
//! same run; every present page reads back as its last content at the end of each run.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use ztier_blockdev::memory::MemoryDevice;
use ztier_compress::Algorithm;
use ztier_corpus::trace::Trace;
use ztier_corpus::{Corpus, CORPUS_PAGE};
use ztier_pool::{AllocatorKind, ZsConfig};
use ztier_zram::promotion::PromotionStats;
use ztier_zram::{Backing, PolicyConfig, PolicyRunner, PromotionTarget, WbFormat};

use crate::trace::{trace_device, CorpusPages, SwappedPages};
use crate::{ReplayError, Result};

/// The share of the oracle's pages on the store the controller must hold.
pub const GOAL_OF_ORACLE: f64 = 0.9;

/// The device's clock at the capture's start: far past the second or so the device lives
/// before the replay, so the capture's time is what it reads.
const CLOCK_BASE_SECS: u64 = 1 << 20;

/// What to replay, and the ages to judge.
#[derive(Debug, Clone)]
pub struct FarTierReplay {
    pub allocator: AllocatorKind,
    pub layout: ZsConfig,
    pub algorithm: Algorithm,
    pub format: WbFormat,
    /// Capture time between the policy's passes.
    pub interval: Duration,
    /// The fixed idle ages the oracle is chosen from.
    pub fixed_ages: Vec<Duration>,
    pub target: PromotionTarget,
}

/// Which age a run wrote back at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AgeChoice {
    Fixed { age_secs: u64 },
    Controller,
}

/// One run over the trace.
#[derive(Debug, Clone, Serialize)]
pub struct FarTierRun {
    pub age: AgeChoice,
    /// Changed pages swapped in from the store.
    pub promotions: u64,
    pub written_back_pages: u64,
    /// Pages on the store, the mean over the epochs (what the far tier holds).
    pub mean_stored_pages: f64,
    /// The trace's length.
    pub minutes: f64,
    /// Promotions per minute over the mean pages on the store.
    pub share_per_minute: f64,
    /// The same of the worst whole minute (its promotions over its mean pages stored).
    pub worst_minute_share: f64,
    pub meets_target: bool,
    /// The controller's figures at the end (its age, decisions and their history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<PromotionStats>,
    /// The controller's age after each pass (empty for a fixed age); through a served
    /// device, after each epoch that saw one or more passes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ages_secs: Vec<u64>,
    /// How far behind the recorded pace the replay ran (a run through a served device in
    /// real time; none for one in the capture's time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pace: Option<Pace>,
}

/// How far a run in real time (`crate::paced`) fell behind the capture's pace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pace {
    /// The latest an epoch was begun after its recorded time.
    pub max_lag_secs: f64,
    pub mean_lag_secs: f64,
    /// Epochs begun a second or more after their time.
    pub late_epochs: u64,
}

/// The runs over one trace and the verdict.
#[derive(Debug, Clone, Serialize)]
pub struct FarTierVerdict {
    pub corpus: String,
    pub target_share_per_minute: f64,
    pub fixed: Vec<FarTierRun>,
    pub controller: FarTierRun,
    /// The fixed age that holds the most on the store while meeting the target, if any does.
    pub oracle: Option<FarTierRun>,
    /// The controller's mean pages on the store over the oracle's.
    pub of_oracle: Option<f64>,
    /// The target met, and at least [`GOAL_OF_ORACLE`] of the oracle's pages held (or no
    /// fixed age meets the target).
    pub goal_met: bool,
}

impl FarTierVerdict {
    /// The verdict on `controller` against the best of `fixed` that meets `target`.
    pub fn of(
        corpus: &str,
        target: PromotionTarget,
        fixed: Vec<FarTierRun>,
        controller: FarTierRun,
    ) -> FarTierVerdict {
        let oracle = fixed
            .iter()
            .filter(|r| r.meets_target)
            .max_by(|a, b| a.mean_stored_pages.total_cmp(&b.mean_stored_pages))
            .cloned();
        let of_oracle = oracle
            .as_ref()
            .map(|o| controller.mean_stored_pages / o.mean_stored_pages.max(f64::MIN_POSITIVE));
        let goal_met = controller.meets_target && of_oracle.is_none_or(|s| s >= GOAL_OF_ORACLE);
        FarTierVerdict {
            corpus: corpus.to_owned(),
            target_share_per_minute: target.share_per_minute,
            fixed,
            controller,
            oracle,
            of_oracle,
            goal_met,
        }
    }
}

impl FarTierReplay {
    /// Every fixed age, then the controller, over `trace` (captured with `corpus`).
    pub fn judge(&self, corpus: &Corpus, trace: &Trace) -> Result<FarTierVerdict> {
        self.judge_over(&CorpusPages::Whole(corpus), trace)
    }

    /// As [`judge`](Self::judge), over the corpus read whole or on (each run reads it anew).
    pub fn judge_over(&self, corpus: &CorpusPages<'_>, trace: &Trace) -> Result<FarTierVerdict> {
        let mut fixed = Vec::with_capacity(self.fixed_ages.len());
        for &age in &self.fixed_ages {
            fixed.push(self.run(corpus, trace, Some(age))?);
        }
        let controller = self.run(corpus, trace, None)?;
        Ok(FarTierVerdict::of(
            corpus.name(),
            self.target,
            fixed,
            controller,
        ))
    }

    /// One run: at `age` fixed, or with the controller (`None`).
    pub fn run(
        &self,
        corpus: &CorpusPages<'_>,
        trace: &Trace,
        age: Option<Duration>,
    ) -> Result<FarTierRun> {
        let (dev, device_pages) =
            trace_device(trace, corpus, self.allocator, &self.layout, &self.algorithm)?;
        let store = MemoryDevice::new(Backing::size_for(device_pages * CORPUS_PAGE as u64))
            .map_err(ReplayError::SwapBacking)?;
        dev.set_backing(Some(Backing::new(Arc::new(store), self.format)?))?;
        let config = PolicyConfig {
            recompress_idle: None,
            writeback_idle: age,
            mem_target: None,
            interval: self.interval,
            promotion_target: age.is_none().then_some(self.target),
        };
        let mut runner = PolicyRunner::new(config);
        let interval = self.interval.max(Duration::from_secs(1));
        let mut swapped = SwappedPages::new(&dev, corpus.open()?, device_pages);
        let first = trace.epochs.first().map_or(0, |e| e.millis);
        let mut next_pass = interval;
        let mut written_back = 0u64;
        let mut tally = Tally::default();
        let mut ages = Vec::new();
        for (n, epoch) in trace.epochs.iter().enumerate() {
            let at = Duration::from_millis(epoch.millis.saturating_sub(first));
            dev.pin_clock(Some(Duration::from_secs(CLOCK_BASE_SECS) + at));
            let read_back = swapped.apply(n, epoch)?;
            if at >= next_pass {
                let tick = runner.tick(&dev);
                if let Some(e) = tick.last_error {
                    return Err(ReplayError::Policy(e));
                }
                written_back += tick.written_back_pages;
                if age.is_none() {
                    ages.push(runner.writeback_age().map_or(0, |a| a.as_secs()));
                }
                while next_pass <= at {
                    next_pass += interval;
                }
            }
            tally.epoch(at, read_back, dev.bd_stat().map_or(0, |b| b.bd_count));
        }
        swapped.verify()?;
        let mut run = tally.finish(trace, AgeChoice::of(age), self.target, written_back);
        run.controller = runner.promotion_stats();
        run.ages_secs = ages;
        Ok(run)
    }
}

impl AgeChoice {
    /// A fixed age, or the controller's (`None`).
    pub fn of(age: Option<Duration>) -> AgeChoice {
        match age {
            Some(a) => AgeChoice::Fixed {
                age_secs: a.as_secs(),
            },
            None => AgeChoice::Controller,
        }
    }
}

/// A run's figures as its epochs pass: the promotions and the pages stored, overall and
/// per whole minute of the capture.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    promotions: u64,
    stored_sum: f64,
    epochs: u64,
    /// Per whole minute of the capture: promotions, the sum of pages stored, epochs.
    minutes: Vec<(u64, f64, u64)>,
}

impl Tally {
    /// An epoch `at` into the capture: `promoted` pages read from the store, `stored` on it
    /// after.
    pub(crate) fn epoch(&mut self, at: Duration, promoted: u64, stored: u64) {
        let stored = stored as f64;
        self.promotions += promoted;
        self.stored_sum += stored;
        self.epochs += 1;
        let minute = (at.as_secs() / 60) as usize;
        if self.minutes.len() <= minute {
            self.minutes.resize(minute + 1, (0, 0.0, 0));
        }
        let m = &mut self.minutes[minute];
        m.0 += promoted;
        m.1 += stored;
        m.2 += 1;
    }

    /// The run over `trace` (its controller figures left empty).
    pub(crate) fn finish(
        self,
        trace: &Trace,
        age: AgeChoice,
        target: PromotionTarget,
        written_back_pages: u64,
    ) -> FarTierRun {
        let mean_stored = self.stored_sum / self.epochs.max(1) as f64;
        let first = trace.epochs.first().map_or(0, |e| e.millis);
        let span = trace
            .epochs
            .last()
            .map_or(0, |e| e.millis.saturating_sub(first));
        let length = (span as f64 / 60_000.0).max(1.0 / 60.0);
        let share = self.promotions as f64 / length / mean_stored.max(1.0);
        // Whole minutes only: the last, cut short, would count its promotions at a rate.
        let whole = (span / 60_000) as usize;
        let worst = self
            .minutes
            .iter()
            .take(whole)
            .filter(|m| m.2 > 0)
            .map(|&(p, s, e)| p as f64 / (s / e as f64).max(1.0))
            .fold(0.0, f64::max);
        FarTierRun {
            age,
            promotions: self.promotions,
            written_back_pages,
            mean_stored_pages: mean_stored,
            minutes: length,
            share_per_minute: share,
            worst_minute_share: worst,
            meets_target: share <= target.share_per_minute,
            controller: None,
            ages_secs: Vec::new(),
            pace: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ztier_corpus::trace::{Epoch, PageWrite};

    const COLD: u64 = 1000;
    const HOT: u64 = 60;
    /// Every hot page changes once every this many epochs of 2 s (30 s).
    const HOT_PERIOD: u64 = 15;

    /// 20 minutes in epochs of 2 s: COLD pages written once, HOT pages changed every 30 s
    /// each (a fifteenth of them each epoch). Every write a corpus page of its own.
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
            appeared: (0..COLD + HOT).map(&mut write).collect(),
            ..Epoch::default()
        }];
        for n in 1..600u64 {
            let changed: Vec<PageWrite> = (0..HOT)
                .filter(|i| i % HOT_PERIOD == n % HOT_PERIOD)
                .map(&mut write)
                .collect();
            epochs.push(Epoch {
                millis: n * 2000,
                unchanged: COLD + HOT - changed.len() as u64,
                changed,
                ..Epoch::default()
            });
        }
        crate::test_traces::written(&dir.join("far.pages"), next, &epochs)
    }

    #[test]
    fn the_controller_finds_the_age_the_oracle_chose_with_hindsight() {
        let dir = std::env::temp_dir().join(format!("ztier-far-tier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (corpus, trace) = made_trace(&dir);
        let secs = Duration::from_secs;
        let replay = FarTierReplay {
            allocator: AllocatorKind::Zsmalloc,
            layout: ZsConfig::default(),
            algorithm: "lz4".parse().unwrap(),
            format: WbFormat::Page,
            interval: secs(10),
            fixed_ages: [10, 20, 40, 80, 160].map(secs).to_vec(),
            // A minute's window, 10 s to an hour.
            target: PromotionTarget::new(0.002),
        };
        let v = replay.judge(&corpus, &trace).unwrap();
        // The corpus read on from its file: every run the same.
        let streamed = CorpusPages::Streamed {
            path: &corpus.path,
            max_held_bytes: 1 << 30,
        };
        let v_on = replay.judge_over(&streamed, &trace).unwrap();
        let figures = |r: &FarTierRun| {
            (
                r.promotions,
                r.written_back_pages,
                r.mean_stored_pages,
                r.ages_secs.clone(),
            )
        };
        for (a, b) in v
            .fixed
            .iter()
            .chain([&v.controller])
            .zip(v_on.fixed.iter().chain([&v_on.controller]))
        {
            assert_eq!(figures(a), figures(b));
        }
        let by_age = |s: u64| {
            v.fixed
                .iter()
                .find(|r| r.age == AgeChoice::Fixed { age_secs: s })
                .unwrap()
        };
        // Ages under the hot pages' 30 s send them to the store between their changes:
        // far over the target. From 40 s on, only the cold pages go, later the older.
        assert!(
            !by_age(10).meets_target && !by_age(20).meets_target,
            "{v:#?}"
        );
        assert!(by_age(20).promotions > 100);
        assert!(by_age(40).meets_target && by_age(40).promotions == 0);
        assert!(by_age(40).mean_stored_pages > by_age(80).mean_stored_pages);
        assert_eq!(
            v.oracle.as_ref().unwrap().age,
            AgeChoice::Fixed { age_secs: 40 }
        );
        // The controller writes nothing back until a window has held the cold pages past
        // an age from its start (the second minute's: in the first they grew old as it
        // went), then goes straight to the youngest age the hot pages are not read at (32
        // s: each is read 30 s after its last change) and stays there: it never went over
        // to learn, so nothing was promoted.
        let c = &v.controller;
        let stats = c.controller.as_ref().unwrap();
        assert_eq!(c.ages_secs[0], 3600, "{c:#?}");
        let first_younger = c.ages_secs.iter().position(|&a| a != 3600).unwrap();
        // Not from the first window (six passes), by the second's end.
        assert!((7..=13).contains(&first_younger), "{c:#?}");
        assert!(
            c.ages_secs[first_younger..].iter().all(|&a| a == 32),
            "{c:#?}"
        );
        assert_eq!((stats.younger, stats.older), (1, 0), "{stats:#?}");
        assert_eq!(stats.predicted_share_per_minute, Some(0.0));
        assert_eq!(c.promotions, 0, "{c:#?}");
        assert!(c.meets_target, "{c:#?}");
        assert!(v.of_oracle.unwrap() >= GOAL_OF_ORACLE, "{v:#?}");
        assert!(v.goal_met);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
