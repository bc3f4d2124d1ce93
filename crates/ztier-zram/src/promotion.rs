//! The far tier's idle age by promotion rate, chosen as Google's software-defined far memory
//! chooses its cold-age threshold (Lagar-Cavilla et al., ASPLOS '19): so that the pages read
//! back from the store ("promotions") stay under a share of the pages held there per minute,
//! instead of a fixed age a person chose. (SDFM's SLO, 0.2 %/min in production, is a share
//! of the job's working set, the pages touched within its youngest threshold of 120 s; the
//! share here is of the pages on the store, as issue #61 states its goal.)
//!
//! It does not learn by going over. The device keeps two histograms by idle age
//! (`access_ages.rs`): the reads, by the age of the page read, and the pages, by their age now.
//! For every candidate age T (a bucket's start, from the target's youngest age to its oldest),
//! a window of the policy's passes gives the promotions T would have caused (the reads of pages
//! at least T old: they would have been on the store) over the pages T would hold (those at
//! least T old, the mean over the window's passes), per minute. A window counts for T only if
//! it began with pages at least T old, and only those pages' minutes are what it saw of T (its
//! exposure): pages that only grew T old during it show the ages just past T, not those beyond,
//! and a program that changes its pages about every 75 s looks safe at 64 s from pages that
//! reached 64 s at the window's end (a capture of CPython refreshing its package index did, and
//! the first minute's choice of 64 s promoted 38 % of what it wrote back within 11 s). And an
//! age counts only once the windows have seen pages twice as old ([`covered`]): the pages a
//! workload began with grow old together, and tell nothing of the ages later pages pass
//! through until they are twice as old (the same capture's first pages, unread at 300 s, chose 256 s at
//! minute 6, and the lists written since came back at 256-320 s: 13 %/min for 20 s). It is
//! not proof against every such case: pages long idle still vouch for younger ages that pages
//! newly idle only pass through (a window beginning with 1000 pages ten minutes idle may
//! choose 24 s while 10 000 pages it watched grow from 10 s to 70 s old are read at 75 s);
//! the window that follows sees their reads and goes older at once. [`choose`]
//! is the whole rule, pure: from the last [`RATE_WINDOWS`] windows, the youngest T whose
//! [`PERCENTILE`]th percentile of the windows' rates is at most the target, among those the
//! windows saw enough of to tell ([`WindowSeen::exposure`], [`covered`]); the oldest age when
//! none is. So
//! the age goes younger only where the history says it is safe, and a workload's first minutes,
//! which have no old pages yet, write nothing back until the pages that grew old show at which
//! age they stop coming back.
//!
//! [`PromotionController`] keeps the windows: it closes one when it has lasted the target's
//! window, or at once when the promotions at the current age already exceed what the whole
//! window allows (a workload that changed: the history must learn it now), and keeps a
//! bounded history of its decisions and the store's measured rate beside the predicted one.
//!
//! Invariants: the age is always within `[min_age, max_age]`, whole seconds, and either the
//! oldest age or a candidate whose percentile rate is at most the target; the windows kept
//! are at most [`RATE_WINDOWS`], the decisions at most [`HISTORY`].
//!
//! Locking: none; a controller belongs to one policy thread (`policy.rs` keeps it beside
//! the policy's configuration, outside its statistics' lock).

use std::collections::VecDeque;
use std::ops::RangeInclusive;
use std::time::Duration;

use serde::Serialize;

use crate::access_ages::{bucket_of, bucket_start, AgeHistogram, AGE_BUCKETS};

/// Decisions kept in a controller's history.
pub const HISTORY: usize = 32;

/// Windows whose rates the age is chosen from (half an hour of one-minute windows).
pub const RATE_WINDOWS: usize = 30;

/// The percentile of the windows' rates at an age that must be under the target (SDFM's):
/// of `n` windows, `n * (100 - PERCENTILE) / 100` (rounded down) may be over it.
pub const PERCENTILE: usize = 98;

/// Buckets a doubling of age spans (`access_ages`): a candidate's bucket plus this is twice
/// its age's from 8 s up; below, more than twice (9 s for 1 s, 15 s for 7 s).
pub const DOUBLING_BUCKETS: usize = crate::access_ages::BUCKETS_PER_DOUBLING;

/// SDFM's figure, 0.2 % a minute (of the working set there; of the pages on the store here).
pub const SDFM_SHARE_PER_MINUTE: f64 = 0.002;

/// What the controller aims at, and the ages it may choose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromotionTarget {
    /// Reads from the store allowed per minute, as a share of the pages on it (0.002: SDFM's
    /// figure, 0.2 %/min, which SDFM takes of the working set); in (0, 1].
    pub share_per_minute: f64,
    /// The youngest age a page may be written back at (at least a second).
    pub min_age: Duration,
    /// The oldest age the controller goes to, however many promotions it sees; also the age
    /// while no younger one is known to be safe (from the start, until the windows tell).
    pub max_age: Duration,
    /// How long a window lasts when it stays under the target.
    pub window: Duration,
}

impl PromotionTarget {
    /// A target of `share_per_minute` with the default ages: from 10 s to an hour, decided
    /// over one-minute windows.
    pub fn new(share_per_minute: f64) -> PromotionTarget {
        PromotionTarget {
            share_per_minute,
            min_age: Duration::from_secs(10),
            max_age: Duration::from_secs(3600),
            window: Duration::from_secs(60),
        }
    }

    /// Checks the numbers make a target.
    pub fn validate(&self) -> Result<(), BadPromotionTarget> {
        let share = self.share_per_minute;
        if !(share > 0.0 && share <= 1.0) {
            return Err(BadPromotionTarget::Share { share });
        }
        let (min, max) = (self.min_age.as_secs(), self.max_age.as_secs());
        if min == 0 || min > max || max > u64::from(u32::MAX) {
            return Err(BadPromotionTarget::Ages { min, max });
        }
        if self.window.as_secs() == 0 {
            return Err(BadPromotionTarget::Window {
                millis: self.window.as_millis() as u64,
            });
        }
        Ok(())
    }

    /// The youngest and oldest ages, brought within bounds (at least a second; the oldest at
    /// least the youngest).
    fn ages(&self) -> (u64, u64) {
        let min = self.min_age.as_secs().max(1);
        (min, self.max_age.as_secs().max(min))
    }

    /// The histogram buckets whose starts are the ages the controller may choose below the
    /// oldest: from the youngest age (rounded up to a bucket's start) to the oldest.
    pub fn candidates(&self) -> RangeInclusive<usize> {
        let (min, max) = self.ages();
        let first = bucket_of(min) + usize::from(bucket_start(bucket_of(min)) < min);
        first..=bucket_of(max)
    }
}

/// A target as a person writes it, `0.2%/min` or `0.2%` (per minute either way): the
/// percent of the stored pages read back per minute, above 0 and at most 100. The share a
/// [`PromotionTarget`] takes is this over 100 (kept as the percent where it is written back
/// out, so it reads back the same).
pub fn parse_percent_per_minute(text: &str) -> Result<f64, BadPromotionTarget> {
    let not_one = || BadPromotionTarget::NotAPercent {
        given: text.to_string(),
    };
    let number = text
        .trim()
        .strip_suffix("/min")
        .unwrap_or(text.trim())
        .strip_suffix('%')
        .ok_or_else(not_one)?;
    let percent: f64 = number.trim().parse().map_err(|_| not_one())?;
    if !(percent > 0.0 && percent <= 100.0) {
        return Err(BadPromotionTarget::Share {
            share: percent / 100.0,
        });
    }
    Ok(percent)
}

/// A promotion target that cannot be followed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BadPromotionTarget {
    #[error("a promotion target of {share} of the stored pages per minute: it must be above 0 and at most 1 (100 %/min)")]
    Share { share: f64 },
    #[error("promotion ages from {min} s to {max} s: the youngest must be at least 1 s and at most the oldest (at most 2^32-1 s)")]
    Ages { min: u64, max: u64 },
    #[error("a promotion window of {millis} ms: it must be at least a second")]
    Window { millis: u64 },
    #[error(
        "a promotion target of {given:?}: a percent of the stored pages per minute, as 0.2%/min"
    )]
    NotAPercent { given: String },
}

/// What the store showed over a window: its measured rate, reported beside the predicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Reads from the store (`bd_reads`) during the window.
    pub promotions: u64,
    /// Pages on the store (`bd_count`): the most seen at the window's start or end.
    pub stored_pages: u64,
    /// How long the window lasted.
    pub elapsed: Duration,
}

impl Observation {
    /// Promotions per minute as a share of the stored pages. A store holding nothing counts
    /// as one page, so promotions from it read as far over any target; a window under a
    /// second counts as a second.
    pub fn share_per_minute(&self) -> f64 {
        let minutes = self.elapsed.as_secs_f64().max(1.0) / 60.0;
        self.promotions as f64 / self.stored_pages.max(1) as f64 / minutes
    }
}

/// What one window showed at each candidate age (the target's [`candidates`], in order):
/// what each would have promoted and held.
///
/// [`candidates`]: PromotionTarget::candidates
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSeen {
    /// Reads during the window of pages at least the candidate's age old.
    pub promotions: Vec<u64>,
    /// Pages at least the candidate's age old, the mean over the window's passes.
    pub cold: Vec<f64>,
    /// Pages at least the candidate's age old at the window's start: held past it the whole
    /// window (unless read or gone). A window with none cannot tell the candidate's rate.
    pub held: Vec<f64>,
    /// Pages at least twice the candidate's age old, the mean over the window's passes (the
    /// oldest bucket's where twice is past it).
    pub doubled: Vec<f64>,
    /// The window's length in minutes.
    pub minutes: f64,
}

impl WindowSeen {
    /// Candidate `i`'s promotions per minute over the pages it would hold; `None` where the
    /// window held no page past it from its start (nothing to tell by).
    pub fn rate(&self, i: usize) -> Option<f64> {
        let (promotions, cold) = (*self.promotions.get(i)?, *self.cold.get(i)?);
        if self.held.get(i).is_none_or(|&held| held <= 0.0) {
            return None;
        }
        Some(promotions as f64 / cold.max(1.0) / self.minutes.max(1.0 / 60.0))
    }

    /// Candidate `i`'s page-minutes held past it from the window's start: at the target, the
    /// promotions expected of them are this times the share.
    pub fn exposure(&self, i: usize) -> f64 {
        self.held.get(i).copied().unwrap_or(0.0) * self.minutes
    }
}

/// Whether `windows` have seen pages twice candidate `i`'s age old, enough page-minutes of
/// them to expect a promotion at `share`: pages are then known to stay unread that long, not
/// only as long as the oldest seen so far. A workload's first pages grow old together, and
/// ages as old as they are tell nothing of the pages that idle later and pass through them: a
/// capture of CPython's rounds over its lists showed the pages it began with unread at 300 s
/// at minute 6, and the 256 s they vouched for brought 2724 pages back within 20 s (13 %/min)
/// as the lists written since reached 256-320 s.
pub fn covered(share: f64, windows: &[WindowSeen], i: usize) -> bool {
    let minutes: f64 = windows
        .iter()
        .map(|w| w.doubled.get(i).copied().unwrap_or(0.0) * w.minutes)
        .sum();
    minutes * share >= 1.0
}

/// Candidate `i`'s predicted rate over `windows`: the [`PERCENTILE`]th percentile of the
/// windows' rates, if the windows held enough past it from their starts for at least one
/// promotion to be expected at `share` (fewer cannot tell a rate under the target from one
/// over it), and have seen pages twice as old ([`covered`]).
pub fn predicted_rate(share: f64, windows: &[WindowSeen], i: usize) -> Option<f64> {
    let exposure: f64 = windows.iter().map(|w| w.exposure(i)).sum();
    if exposure * share < 1.0 || !covered(share, windows, i) {
        return None;
    }
    let mut rates: Vec<f64> = windows.iter().filter_map(|w| w.rate(i)).collect();
    rates.sort_by(f64::total_cmp);
    let may_be_over = rates.len() * (100 - PERCENTILE) / 100;
    rates.len().checked_sub(may_be_over + 1).map(|at| rates[at])
}

/// An age chosen, and the rate predicted there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    pub age_secs: u64,
    /// The percentile rate at the age; `None` when no candidate was known to be safe and
    /// the age is the oldest.
    pub predicted_share_per_minute: Option<f64>,
}

/// The youngest candidate whose predicted rate over `windows` ([`predicted_rate`]) is at
/// most the target; the target's oldest age if none is.
pub fn choose(target: &PromotionTarget, windows: &[WindowSeen]) -> Choice {
    let share = target.share_per_minute;
    let first = *target.candidates().start();
    target
        .candidates()
        .find_map(|b| {
            let rate = predicted_rate(share, windows, b - first)?;
            (rate <= share).then_some(Choice {
                age_secs: bucket_start(b),
                predicted_share_per_minute: Some(rate),
            })
        })
        .unwrap_or(Choice {
            age_secs: target.ages().1,
            predicted_share_per_minute: None,
        })
}

/// Which way a decision moved the age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    Holding,
    /// The history shows a younger age safe: more pages may go.
    Younger,
    /// The history shows the age unsafe: pages must be colder before they go.
    Older,
}

/// One decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decision {
    pub step: Step,
    /// The age before and after, in seconds.
    pub age_before_secs: u64,
    pub age_secs: u64,
    /// The window's measured promotions per minute as a share of the stored pages.
    pub share_per_minute: f64,
    /// The rate the history predicts at the new age ([`Choice`]).
    pub predicted_share_per_minute: Option<f64>,
    /// Reads from the store and the pages on it, measured.
    pub promotions: u64,
    pub stored_pages: u64,
    /// The window's length, in seconds.
    pub window_secs: f64,
}

/// What a policy's pass gives the controller.
#[derive(Debug, Clone)]
pub struct Sample {
    /// The device's clock (any that does not go back, the same each call).
    pub now: Duration,
    /// The store's counters: `bd_reads` so far, `bd_count` now.
    pub bd_reads: u64,
    pub bd_count: u64,
    /// The device's reads by age so far ([`Device::read_ages`](crate::Device::read_ages)).
    pub read_ages: AgeHistogram,
    /// Its pages by age now ([`Device::idle_ages`](crate::Device::idle_ages)).
    pub idle_ages: AgeHistogram,
}

/// The window being seen: where it started, and the pages by age summed over its passes.
#[derive(Debug, Clone)]
struct OpenWindow {
    at: Duration,
    bd_reads: u64,
    bd_count: u64,
    read_ages: AgeHistogram,
    /// Pages at least each bucket's age old at the window's start.
    cold_at_start: [u64; AGE_BUCKETS],
    cold_sum: [u64; AGE_BUCKETS],
    passes: u64,
}

impl OpenWindow {
    fn new(s: &Sample) -> OpenWindow {
        let cold = s.idle_ages.at_least();
        OpenWindow {
            at: s.now,
            bd_reads: s.bd_reads,
            bd_count: s.bd_count,
            read_ages: s.read_ages.clone(),
            cold_at_start: cold,
            cold_sum: cold,
            passes: 1,
        }
    }
}

/// The controller's state, for the statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PromotionStats {
    /// The idle age pages are written back at now, in seconds.
    pub age_secs: u64,
    /// The share of the target (promotions per minute over the stored pages).
    pub target_share_per_minute: f64,
    /// The last decided window's measured promotions per minute over the stored pages.
    pub share_per_minute: f64,
    /// The rate the history predicts at the age; `None` while no younger age than the
    /// oldest is known to be safe.
    pub predicted_share_per_minute: Option<f64>,
    /// Windows the age is chosen from (at most [`RATE_WINDOWS`]).
    pub windows: usize,
    /// Decisions by their step.
    pub holding: u64,
    pub younger: u64,
    pub older: u64,
    /// The last decisions, oldest first (at most [`HISTORY`]).
    pub history: Vec<Decision>,
}

/// The age, chosen window by window by [`choose`].
#[derive(Debug, Clone)]
pub struct PromotionController {
    target: PromotionTarget,
    age: Duration,
    predicted: Option<f64>,
    window: Option<OpenWindow>,
    seen: VecDeque<WindowSeen>,
    history: VecDeque<Decision>,
    counts: [u64; 3],
    last_share: f64,
}

impl PromotionController {
    /// A controller at the target's oldest age: nothing is known safe yet.
    pub fn new(target: PromotionTarget) -> PromotionController {
        PromotionController {
            target,
            age: Duration::from_secs(target.ages().1),
            predicted: None,
            window: None,
            seen: VecDeque::with_capacity(RATE_WINDOWS),
            history: VecDeque::with_capacity(HISTORY),
            counts: [0; 3],
            last_share: 0.0,
        }
    }

    /// The age pages are written back at now.
    pub fn age(&self) -> Duration {
        self.age
    }

    pub fn target(&self) -> &PromotionTarget {
        &self.target
    }

    /// Takes a pass's sample. Decides when the window has lasted the target's window, or at
    /// once when its promotions at the current age already exceed what the whole window
    /// allows; returns the decision, if any. The first call only opens a window, as does a
    /// call whose counters or clock went back (a reset or a new store).
    pub fn observe(&mut self, s: &Sample) -> Option<Decision> {
        let (window, read) = match self.window.take() {
            Some(w) if s.bd_reads >= w.bd_reads && s.now >= w.at => {
                match s.read_ages.since(&w.read_ages) {
                    Some(read) => (w, read),
                    None => return self.open(s),
                }
            }
            _ => return self.open(s),
        };
        let mut window = window;
        for (sum, n) in window.cold_sum.iter_mut().zip(s.idle_ages.at_least()) {
            *sum += n;
        }
        window.passes += 1;
        let elapsed = s.now - window.at;
        let promotions = read.at_least();
        let candidates = self.target.candidates();
        let passes = window.passes as f64;
        let seen = WindowSeen {
            promotions: candidates.clone().map(|b| promotions[b]).collect(),
            cold: candidates
                .clone()
                .map(|b| window.cold_sum[b] as f64 / passes)
                .collect(),
            held: candidates
                .clone()
                .map(|b| window.cold_at_start[b] as f64)
                .collect(),
            doubled: self
                .target
                .candidates()
                .map(|b| {
                    let twice = (b + DOUBLING_BUCKETS).min(AGE_BUCKETS - 1);
                    window.cold_sum[twice] as f64 / passes
                })
                .collect(),
            // A window closed early counts as a whole one: its promotions already exceed
            // what the whole window allows.
            minutes: elapsed.max(self.target.window).as_secs_f64() / 60.0,
        };
        // Over already at the current age: more promotions than the whole window allows
        // the pages it holds so far.
        let now_at = bucket_of(self.age.as_secs());
        let cold_now = window.cold_sum[now_at] as f64 / passes;
        let allowed = self.target.share_per_minute
            * cold_now.max(1.0)
            * (self.target.window.as_secs_f64() / 60.0);
        let over_already = promotions[now_at] as f64 > allowed;
        if elapsed < self.target.window && !over_already {
            self.window = Some(window);
            return None;
        }
        if self.seen.len() == RATE_WINDOWS {
            self.seen.pop_front();
        }
        self.seen.push_back(seen);
        let choice = choose(&self.target, self.seen.make_contiguous());
        let measured = Observation {
            promotions: s.bd_reads - window.bd_reads,
            stored_pages: window.bd_count.max(s.bd_count),
            elapsed,
        };
        let before = self.age.as_secs();
        let step = match choice.age_secs.cmp(&before) {
            std::cmp::Ordering::Greater => Step::Older,
            std::cmp::Ordering::Less => Step::Younger,
            std::cmp::Ordering::Equal => Step::Holding,
        };
        let decision = Decision {
            step,
            age_before_secs: before,
            age_secs: choice.age_secs,
            share_per_minute: measured.share_per_minute(),
            predicted_share_per_minute: choice.predicted_share_per_minute,
            promotions: measured.promotions,
            stored_pages: measured.stored_pages,
            window_secs: elapsed.as_secs_f64(),
        };
        self.age = Duration::from_secs(choice.age_secs);
        self.predicted = choice.predicted_share_per_minute;
        self.last_share = decision.share_per_minute;
        self.counts[step as usize] += 1;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(decision);
        self.window = Some(OpenWindow::new(s));
        Some(decision)
    }

    /// Opens a window at `s`.
    fn open(&mut self, s: &Sample) -> Option<Decision> {
        self.window = Some(OpenWindow::new(s));
        None
    }

    pub fn stats(&self) -> PromotionStats {
        PromotionStats {
            age_secs: self.age.as_secs(),
            target_share_per_minute: self.target.share_per_minute,
            share_per_minute: self.last_share,
            predicted_share_per_minute: self.predicted,
            windows: self.seen.len(),
            holding: self.counts[Step::Holding as usize],
            younger: self.counts[Step::Younger as usize],
            older: self.counts[Step::Older as usize],
            history: self.history.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn target() -> PromotionTarget {
        PromotionTarget {
            share_per_minute: 0.002,
            min_age: secs(10),
            max_age: secs(600),
            window: secs(60),
        }
    }

    /// A minute's window: `cold` pages at every candidate, and the promotions of `reads` pages
    /// read at `read_age`.
    fn window(t: &PromotionTarget, cold: f64, reads: u64, read_age: u64) -> WindowSeen {
        WindowSeen {
            promotions: t
                .candidates()
                .map(|b| {
                    if bucket_start(b) <= read_age {
                        reads
                    } else {
                        0
                    }
                })
                .collect(),
            cold: t.candidates().map(|_| cold).collect(),
            held: t.candidates().map(|_| cold).collect(),
            doubled: t.candidates().map(|_| cold).collect(),
            minutes: 1.0,
        }
    }

    #[test]
    fn the_choice_by_hand() {
        let t = target();
        // The candidates: 10 s, 11, …, 15, 16, 18, … 30, 32, 36, … 512, 576 (600 is in 576's
        // bucket).
        let starts: Vec<u64> = t.candidates().map(bucket_start).collect();
        assert_eq!(starts[..9], [10, 11, 12, 13, 14, 15, 16, 18, 20]);
        assert_eq!(*starts.last().unwrap(), 576);
        // Nothing seen: the oldest age, nothing predicted.
        let none = Choice {
            age_secs: 600,
            predicted_share_per_minute: None,
        };
        assert_eq!(choose(&t, &[]), none);
        // 10 000 cold pages; 100 reads a minute of pages 30 s old: every age up to 30 s
        // would promote them (1 %/min), 32 s and over none.
        let hot = window(&t, 10_000.0, 100, 30);
        let c = choose(&t, std::slice::from_ref(&hot));
        assert_eq!((c.age_secs, c.predicted_share_per_minute), (32, Some(0.0)));
        // 20 reads a minute are 0.2 %/min: at the target is safe, one more is not.
        let c = choose(&t, &[window(&t, 10_000.0, 20, 30)]);
        assert_eq!(
            (c.age_secs, c.predicted_share_per_minute),
            (10, Some(0.002))
        );
        assert_eq!(choose(&t, &[window(&t, 10_000.0, 21, 30)]).age_secs, 32);
        // Too few pages to tell: 100 pages a minute expect 0.2 promotions at the target.
        // Five such windows expect one: enough.
        let few = window(&t, 100.0, 0, 0);
        assert_eq!(choose(&t, std::slice::from_ref(&few)), none);
        assert_eq!(choose(&t, &vec![few.clone(); 4]), none);
        assert_eq!(choose(&t, &vec![few; 5]).age_secs, 10);
        // The 98th percentile: of 50 windows, one over the target may be; two may not.
        let mut windows = vec![window(&t, 10_000.0, 0, 0); 48];
        windows.push(hot.clone());
        windows.push(window(&t, 10_000.0, 0, 0));
        assert_eq!(choose(&t, &windows).age_secs, 10);
        windows[0] = hot.clone();
        assert_eq!(choose(&t, &windows).age_secs, 32);
        // Of 30, none may.
        let mut windows = vec![window(&t, 10_000.0, 0, 0); 29];
        windows.push(hot);
        assert_eq!(choose(&t, &windows).age_secs, 32);
        // Reads at every age: no candidate is safe.
        assert_eq!(choose(&t, &[window(&t, 10_000.0, 500, 10_000)]), none);
        // A youngest age that is no bucket's start is rounded up to the next one.
        let t17 = PromotionTarget {
            min_age: secs(17),
            ..t
        };
        let quiet = window(&t17, 10_000.0, 0, 0);
        assert_eq!(choose(&t17, &[quiet]).age_secs, 18);
        // A window that held no page past a candidate from its start tells nothing there,
        // whatever it promoted; one that held some counts its promotions over at least one.
        let mut empty = window(&t, 0.0, 0, 0);
        empty.promotions[0] = 1;
        assert_eq!(empty.rate(0), None);
        empty.held[0] = 1.0;
        assert_eq!(empty.rate(0), Some(1.0));
        assert_eq!(empty.rate(1), None);
    }

    /// A sample at `now` with the given reads so far (by age) and pages by age.
    fn sample(now: u64, reads: &[(u64, u64)], pages: &[(u64, u64)]) -> Sample {
        let mut read_ages = AgeHistogram::default();
        for &(age, n) in reads {
            for _ in 0..n {
                read_ages.record(age);
            }
        }
        let mut idle_ages = AgeHistogram::default();
        for &(age, n) in pages {
            for _ in 0..n {
                idle_ages.record(age);
            }
        }
        Sample {
            now: secs(now),
            bd_reads: 0,
            bd_count: 0,
            read_ages,
            idle_ages,
        }
    }

    #[test]
    fn the_controller_waits_for_old_pages_then_goes_younger_and_older_on_a_change() {
        let t = target();
        let mut c = PromotionController::new(t);
        assert_eq!(c.age(), secs(600), "nothing is known safe yet");
        // 1000 pages written at 0 s and never read again; 100 hot pages read every 10 s at
        // 30 s old. A pass every 10 s.
        let mut reads = 0u64;
        let mut decisions = Vec::new();
        for now in (0..=120).step_by(10) {
            let s = sample(now, &[(30, reads)], &[(now, 1000), (15, 100)]);
            if let Some(d) = c.observe(&s) {
                decisions.push(d);
            }
            reads += 100;
        }
        // The first minute began with no page 32 s old (the old pages grew so during it):
        // nothing to tell by. The second tells: 32 s is the youngest age the hot pages are
        // not read at.
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        assert_eq!(
            (decisions[0].step, decisions[0].age_secs),
            (Step::Holding, 600)
        );
        assert_eq!(decisions[0].predicted_share_per_minute, None);
        assert_eq!(
            (decisions[1].step, decisions[1].age_secs),
            (Step::Younger, 32)
        );
        assert_eq!(decisions[1].predicted_share_per_minute, Some(0.0));
        // The hot pages are now read at 60 s old: 32 s promotes them, more than the
        // window allows at the first pass; older at once, past the reads' age.
        let at = 130;
        let s = sample(at, &[(30, reads), (60, 50)], &[(at, 1000), (30, 100)]);
        let d = c.observe(&s).expect("decided at once");
        assert_eq!(
            (d.step, d.age_before_secs, d.age_secs),
            (Step::Older, 32, 64)
        );
        assert_eq!(d.window_secs, 10.0);
        let stats = c.stats();
        assert_eq!((stats.younger, stats.older, stats.holding), (1, 1, 1));
        assert_eq!((stats.age_secs, stats.windows), (64, 3));
        assert_eq!(stats.predicted_share_per_minute, Some(0.0));
        // Counters that went back open a new window; the windows and decisions kept are
        // bounded.
        assert_eq!(c.observe(&sample(140, &[], &[])), None);
        for n in 1..=(2 * HISTORY as u64) {
            c.observe(&sample(140 + 60 * n, &[], &[(1000, 10_000)]));
        }
        let stats = c.stats();
        assert_eq!(stats.history.len(), HISTORY);
        assert_eq!(stats.windows, RATE_WINDOWS);
        // Half an hour of quiet windows forgot the reads: the youngest age again.
        assert_eq!(stats.age_secs, 10);
    }

    #[test]
    fn pages_that_grew_old_during_a_window_do_not_vouch_for_the_ages_they_reached() {
        // 10 000 pages written at 0 s and changed (read) when 75 s old; 1000 hot pages read
        // every 10 s at 20 s old. A pass every 10 s from 10 s.
        let t = target();
        let mut c = PromotionController::new(t);
        let mut hot_reads = 0u64;
        let mut decisions = Vec::new();
        for now in (10..=130).step_by(10) {
            let cold_reads = if now >= 80 { 10_000 } else { 0 };
            let cold_age = if now >= 80 { now - 75 } else { now };
            let s = sample(
                now,
                &[(20, hot_reads), (75, cold_reads)],
                &[(cold_age, 10_000), (10, 1000)],
            );
            if let Some(d) = c.observe(&s) {
                decisions.push(d);
            }
            hot_reads += 1000;
        }
        // The first window (10-70 s) saw the cold pages pass 24 s to 64 s unread, but only
        // as they grew that old: they vouch for none of those ages (the mean over its passes
        // alone would have chosen 24 s, and every cold page would have come back at 75 s).
        // The second saw them read at 75 s. Nothing is known safe: the oldest age holds.
        assert_eq!(decisions.len(), 2, "{decisions:?}");
        for d in &decisions {
            assert_eq!((d.step, d.age_secs), (Step::Holding, 600), "{decisions:?}");
            assert_eq!(d.predicted_share_per_minute, None);
        }
    }

    #[test]
    fn pages_a_workload_began_with_vouch_for_no_age_until_they_are_twice_as_old() {
        // 10 000 pages written at 0 s and never read; 1000 hot pages, each read at 200 s old,
        // 100 a pass. A pass every 10 s from 10 s, decisions every minute from 70 s.
        let t = target();
        let mut c = PromotionController::new(t);
        let mut hot_reads = 0u64;
        let mut decisions = Vec::new();
        for now in (10..=490).step_by(10) {
            let s = sample(now, &[(200, hot_reads)], &[(now, 10_000), (100, 1000)]);
            if let Some(d) = c.observe(&s) {
                decisions.push((now, d));
            }
            hot_reads += 100;
        }
        // From 250 s on, the first pages were at least 208 s old at a window's start and
        // nothing was read at 208 s or older: without waiting for pages twice as old, 208 s
        // at 310 s, though nothing had yet shown what becomes of pages idle from later on at
        // those ages. Once some are 416 s old (in the window from 370 s, decided at 430 s),
        // 208 s.
        for (now, d) in &decisions {
            let expected = match now {
                ..430 => (Step::Holding, 600),
                430 => (Step::Younger, 208),
                _ => (Step::Holding, 208),
            };
            assert_eq!((d.step, d.age_secs), expected, "at {now}: {d:?}");
        }
        assert_eq!(decisions.last().map(|(now, _)| *now), Some(490));
    }

    #[test]
    fn bad_targets_are_typed_errors() {
        let t = target();
        assert!(t.validate().is_ok());
        let bad = |f: fn(&mut PromotionTarget)| {
            let mut b = t;
            f(&mut b);
            b.validate().unwrap_err()
        };
        assert!(matches!(
            bad(|b| b.share_per_minute = 0.0),
            BadPromotionTarget::Share { .. }
        ));
        assert!(matches!(
            bad(|b| b.share_per_minute = f64::NAN),
            BadPromotionTarget::Share { .. }
        ));
        assert!(matches!(
            bad(|b| b.min_age = secs(0)),
            BadPromotionTarget::Ages { .. }
        ));
        assert!(matches!(
            bad(|b| b.max_age = secs(5)),
            BadPromotionTarget::Ages { .. }
        ));
        assert!(matches!(
            bad(|b| b.window = Duration::from_millis(500)),
            BadPromotionTarget::Window { .. }
        ));
    }

    #[test]
    fn targets_are_read_as_percents_per_minute() {
        assert_eq!(parse_percent_per_minute("0.2%/min"), Ok(0.2));
        assert_eq!(parse_percent_per_minute(" 1.5% "), Ok(1.5));
        assert_eq!(parse_percent_per_minute("100%/min"), Ok(100.0));
        for bad in ["0.2", "0.2/min", "%/min", "abc%", "0.2%/hour", ""] {
            assert!(
                matches!(
                    parse_percent_per_minute(bad),
                    Err(BadPromotionTarget::NotAPercent { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["0%", "-1%/min", "101%", "NaN%"] {
            assert!(
                matches!(
                    parse_percent_per_minute(bad),
                    Err(BadPromotionTarget::Share { .. })
                ),
                "{bad}"
            );
        }
    }

    /// Windows of random promotions and pages at each of a target's candidates.
    fn windows(candidates: usize) -> impl Strategy<Value = Vec<WindowSeen>> {
        // A fifth of the candidates held nothing from the window's start.
        let held = (0u64..2500).prop_map(|h| h.saturating_sub(500));
        // And a fifth saw none twice as old.
        let doubled = (0u64..1250).prop_map(|h| h.saturating_sub(250));
        let one = (
            proptest::collection::vec((0u64..50, 0u64..2000, held), candidates),
            proptest::collection::vec(doubled, candidates),
            1u64..120,
        )
            .prop_map(|(at, doubled, secs)| WindowSeen {
                promotions: at.iter().map(|&(p, _, _)| p).collect(),
                cold: at.iter().map(|&(_, c, _)| c as f64).collect(),
                held: at.iter().map(|&(_, _, h)| h as f64).collect(),
                doubled: doubled.iter().map(|&d| d as f64).collect(),
                minutes: secs as f64 / 60.0,
            });
        proptest::collection::vec(one, 0..60)
    }

    proptest! {
        /// The choice against the rule spelled out: an age is safe when the windows held
        /// enough past it from their starts to expect a promotion at the target, saw enough
        /// twice as old to expect one too, and at most 2 % of the rates those windows give
        /// are over it; the youngest safe candidate, else the oldest age.
        #[test]
        fn the_choice_is_the_youngest_age_the_history_shows_safe(
            share in 0.0005f64..0.2,
            min in 1u64..100,
            span in 0u64..2000,
            seed in windows(80),
        ) {
            let t = PromotionTarget {
                share_per_minute: share,
                min_age: secs(min),
                max_age: secs(min + span),
                window: secs(60),
            };
            let n = t.candidates().count();
            let seen: Vec<WindowSeen> = seed
                .into_iter()
                .map(|mut w| {
                    w.promotions.truncate(n);
                    w.cold.truncate(n);
                    w.held.truncate(n);
                    w.doubled.truncate(n);
                    w
                })
                .collect();
            let safe = |i: usize| {
                let held: f64 = seen.iter().map(|w| w.held[i] * w.minutes).sum();
                let doubled: f64 = seen.iter().map(|w| w.doubled[i] * w.minutes).sum();
                let rates: Vec<f64> = seen
                    .iter()
                    .filter(|w| w.held[i] > 0.0)
                    .map(|w| w.promotions[i] as f64 / w.cold[i].max(1.0) / w.minutes)
                    .collect();
                let over = rates.iter().filter(|&&r| r > share).count();
                held * share >= 1.0 && doubled * share >= 1.0 && over <= rates.len() / 50
            };
            let model = t
                .candidates()
                .enumerate()
                .find(|&(i, _)| safe(i))
                .map_or(min + span, |(_, b)| bucket_start(b));
            let c = choose(&t, &seen);
            prop_assert_eq!(c.age_secs, model);
            prop_assert!((min..=min + span).contains(&c.age_secs));
            if let Some(rate) = c.predicted_share_per_minute {
                prop_assert!(rate <= share);
            }
        }

        /// More promotions never make the choice younger.
        #[test]
        fn more_promotions_never_choose_a_younger_age(
            seed in windows(80),
            extra in proptest::collection::vec(0u64..50, 80),
        ) {
            // 69 candidates, 10 s to an hour.
            let t = PromotionTarget::new(0.01);
            let n = t.candidates().count();
            let fewer: Vec<WindowSeen> = seed
                .into_iter()
                .map(|mut w| {
                    w.promotions.resize(n, 0);
                    w.cold.resize(n, 0.0);
                    w.held.resize(n, 0.0);
                    w.doubled.resize(n, 0.0);
                    w
                })
                .collect();
            let mut more = fewer.clone();
            for w in &mut more {
                // Reads add at every age up to one: the counts at or over an age stay
                // monotone in the age as a histogram's are.
                for (i, p) in w.promotions.iter_mut().enumerate() {
                    *p += extra[i..].iter().sum::<u64>();
                }
            }
            prop_assert!(choose(&t, &more).age_secs >= choose(&t, &fewer).age_secs);
        }

        #[test]
        fn a_controller_fed_anything_stays_within_bounds(
            steps in proptest::collection::vec(
                (0u64..200, 0u64..500, 0u64..100_000, 0u64..5000, 0u64..5000), 1..100),
        ) {
            let t = target();
            let starts: Vec<u64> = t.candidates().map(bucket_start).collect();
            let mut c = PromotionController::new(t);
            let (mut now, mut reads, mut read_ages) = (0u64, 0u64, AgeHistogram::default());
            for (dt, dr, stored, read_age, idle_age) in steps {
                now += dt;
                reads += dr;
                for _ in 0..dr {
                    read_ages.record(read_age);
                }
                let mut idle_ages = AgeHistogram::default();
                idle_ages.record(idle_age);
                c.observe(&Sample {
                    now: secs(now),
                    bd_reads: reads,
                    bd_count: stored,
                    read_ages: read_ages.clone(),
                    idle_ages,
                });
                let age = c.age().as_secs();
                prop_assert!(age == 600 || starts.contains(&age), "{}", age);
                let s = c.stats();
                prop_assert!(s.history.len() <= HISTORY && s.windows <= RATE_WINDOWS);
            }
        }
    }
}
