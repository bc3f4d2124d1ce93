//! The far tier's idle age by promotion rate: the control loop of Google's software-defined
//! far memory (Lagar-Cavilla et al., ASPLOS '19), which tunes zswap's cold-age threshold so
//! that the pages read back from far memory ("promotions") stay under a share of the pages
//! held there per minute (0.2 %/min in production), instead of a fixed age a person chose.
//!
//! [`decide`] is the whole rule, pure: from the promotions seen in a window, the pages on
//! the store and the current age, the next age. Over the target the age grows
//! multiplicatively (pages must be colder before they go); well under it (below
//! [`WELL_UNDER`] of the target) it shrinks slowly, an eighth at a time; in between, the
//! hysteresis band, it holds; and it never comes down to a floor, the youngest age known
//! to go over. [`PromotionController`] keeps the window: it decides when a window has
//! passed, or at once when the window's promotions already exceed what the whole window
//! allows (waiting could not bring the rate back under), and keeps a bounded history of its
//! decisions. It remembers the floor for [`REMEMBER_WINDOWS`] windows after the last one
//! over: without it, the slow decrease walks back down to the age that went over and pays
//! the promotions of a whole working set again (in the live test, once every six minutes,
//! four times the target), a cost only a workload that changed is worth paying again.
//!
//! Invariants: the age is always within `[min_age, max_age]` and whole seconds (slots'
//! access times are whole seconds); a window over the target never makes the age younger,
//! one well under it never makes it older, nor younger than the floor; the history holds at
//! most [`HISTORY`] decisions.
//!
//! Locking: none; a controller belongs to one policy thread (`policy.rs` keeps it beside
//! the policy's configuration, outside its statistics' lock).

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

/// Decisions kept in a controller's history.
pub const HISTORY: usize = 32;

/// The share of the target under which a window makes the age younger: between it and the
/// target, the age holds (the hysteresis band).
pub const WELL_UNDER: f64 = 0.5;

/// Windows the youngest age that went over is remembered for (as a floor) after the last
/// window over the target.
pub const REMEMBER_WINDOWS: u32 = 30;

/// SDFM's target: 0.2 % of the pages on the store per minute.
pub const SDFM_SHARE_PER_MINUTE: f64 = 0.002;

/// What the controller aims at, and the ages it may choose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromotionTarget {
    /// Reads from the store allowed per minute, as a share of the pages on it (0.002 is
    /// SDFM's 0.2 %/min); in (0, 1].
    pub share_per_minute: f64,
    /// The youngest age a page may be written back at (at least a second).
    pub min_age: Duration,
    /// The oldest age the controller goes to, however many promotions it sees.
    pub max_age: Duration,
    /// The age the controller starts from, within the two.
    pub start_age: Duration,
    /// How long a window lasts when it stays under the target.
    pub window: Duration,
}

impl PromotionTarget {
    /// A target of `share_per_minute` with the default ages: from 10 s to an hour,
    /// starting at 2 minutes, decided over one-minute windows.
    pub fn new(share_per_minute: f64) -> PromotionTarget {
        PromotionTarget {
            share_per_minute,
            min_age: Duration::from_secs(10),
            max_age: Duration::from_secs(3600),
            start_age: Duration::from_secs(120),
            window: Duration::from_secs(60),
        }
    }

    /// Checks the numbers make a target.
    pub fn validate(&self) -> Result<(), BadPromotionTarget> {
        let share = self.share_per_minute;
        if !(share > 0.0 && share <= 1.0) {
            return Err(BadPromotionTarget::Share { share });
        }
        let (min, max, start) = (
            self.min_age.as_secs(),
            self.max_age.as_secs(),
            self.start_age.as_secs(),
        );
        if min == 0 || min > max || max > u64::from(u32::MAX) {
            return Err(BadPromotionTarget::Ages { min, max });
        }
        if !(min..=max).contains(&start) {
            return Err(BadPromotionTarget::StartOutside { start, min, max });
        }
        if self.window.as_secs() == 0 {
            return Err(BadPromotionTarget::Window {
                millis: self.window.as_millis() as u64,
            });
        }
        Ok(())
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
    #[error("a starting age of {start} s outside the ages allowed, {min} s to {max} s")]
    StartOutside { start: u64, min: u64, max: u64 },
    #[error("a promotion window of {millis} ms: it must be at least a second")]
    Window { millis: u64 },
    #[error(
        "a promotion target of {given:?}: a percent of the stored pages per minute, as 0.2%/min"
    )]
    NotAPercent { given: String },
}

/// What a window showed.
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

/// Which way a decision moved the age.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// In the band, or already at the bound it would move past.
    Holding,
    /// Well under the target: more pages may go.
    Younger,
    /// Over the target: pages must be colder before they go.
    Older,
}

/// One decision.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Decision {
    pub step: Step,
    /// The age before and after, in seconds.
    pub age_before_secs: u64,
    pub age_secs: u64,
    /// The window's promotions per minute as a share of the stored pages.
    pub share_per_minute: f64,
    pub promotions: u64,
    pub stored_pages: u64,
    /// The window's length, in seconds.
    pub window_secs: f64,
}

/// The next age after a window that showed `seen`, from `age`: twice as old over the target,
/// an eighth (at least a second) younger under [`WELL_UNDER`] of it but never below `floor`
/// (seconds; 0 for none), the same in between; always within the target's ages (a current
/// age outside them is brought inside first).
pub fn decide(target: &PromotionTarget, seen: &Observation, age: Duration, floor: u64) -> Decision {
    let (min, max) = (
        target.min_age.as_secs().max(1),
        target.max_age.as_secs().max(1),
    );
    let max = max.max(min);
    let before = age.as_secs().clamp(min, max);
    let share = seen.share_per_minute();
    let next = if share > target.share_per_minute {
        before.saturating_mul(2)
    } else if share < target.share_per_minute * WELL_UNDER {
        (before - (before / 8).max(1).min(before)).max(floor.min(before))
    } else {
        before
    }
    .clamp(min, max);
    let step = match next.cmp(&before) {
        std::cmp::Ordering::Greater => Step::Older,
        std::cmp::Ordering::Less => Step::Younger,
        std::cmp::Ordering::Equal => Step::Holding,
    };
    Decision {
        step,
        age_before_secs: before,
        age_secs: next,
        share_per_minute: share,
        promotions: seen.promotions,
        stored_pages: seen.stored_pages,
        window_secs: seen.elapsed.as_secs_f64(),
    }
}

/// Where the current window started.
#[derive(Debug, Clone, Copy)]
struct WindowStart {
    at: Duration,
    reads: u64,
    stored: u64,
}

/// The controller's state, for the statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PromotionStats {
    /// The idle age pages are written back at now, in seconds.
    pub age_secs: u64,
    /// The youngest age the controller comes down to for now (one over it went over), in
    /// seconds; 0 for none.
    pub floor_secs: u64,
    /// The share of the target (promotions per minute over the stored pages).
    pub target_share_per_minute: f64,
    /// The last decided window's promotions per minute as a share of the stored pages.
    pub share_per_minute: f64,
    /// Decisions by their step.
    pub holding: u64,
    pub younger: u64,
    pub older: u64,
    /// The last decisions, oldest first (at most [`HISTORY`]).
    pub history: Vec<Decision>,
}

/// The age, moved window by window by [`decide`].
#[derive(Debug, Clone)]
pub struct PromotionController {
    target: PromotionTarget,
    age: Duration,
    window: Option<WindowStart>,
    history: VecDeque<Decision>,
    counts: [u64; 3],
    last_share: f64,
    /// The youngest age (seconds) that went over, and the windows it is remembered for.
    floor: Option<(u64, u32)>,
}

impl PromotionController {
    /// A controller at the target's starting age (brought within its ages).
    pub fn new(target: PromotionTarget) -> PromotionController {
        let (min, max) = (
            target.min_age.as_secs().max(1),
            target.max_age.as_secs().max(1),
        );
        let start = target.start_age.as_secs().clamp(min, max.max(min));
        PromotionController {
            target,
            age: Duration::from_secs(start),
            window: None,
            history: VecDeque::with_capacity(HISTORY),
            counts: [0; 3],
            last_share: 0.0,
            floor: None,
        }
    }

    /// The age pages are written back at now.
    pub fn age(&self) -> Duration {
        self.age
    }

    pub fn target(&self) -> &PromotionTarget {
        &self.target
    }

    /// Takes the store's counters at `now` (any clock that does not go back, the same each
    /// call): `reads` is `bd_reads` so far, `stored` is `bd_count`. Decides when the window
    /// has lasted the target's window, or at once when its promotions already exceed what the
    /// whole window allows; returns the decision, if any. The first call only opens a window,
    /// as does a call whose counters went back (a reset or a new store).
    pub fn observe(&mut self, now: Duration, reads: u64, stored: u64) -> Option<Decision> {
        let start = match self.window {
            Some(w) if reads >= w.reads && now >= w.at => w,
            _ => {
                self.window = Some(WindowStart {
                    at: now,
                    reads,
                    stored,
                });
                return None;
            }
        };
        let seen = Observation {
            promotions: reads - start.reads,
            stored_pages: start.stored.max(stored),
            elapsed: now - start.at,
        };
        let whole_window = Observation {
            elapsed: seen.elapsed.max(self.target.window),
            ..seen
        };
        let over_already = whole_window.share_per_minute() > self.target.share_per_minute;
        if seen.elapsed < self.target.window && !over_already {
            return None;
        }
        let floor = self.floor.map_or(0, |(age, _)| age);
        let decision = decide(&self.target, &seen, self.age, floor);
        self.floor = if decision.share_per_minute > self.target.share_per_minute {
            let max = self.target.max_age.as_secs().max(1);
            let over = (decision.age_before_secs + 1).min(max);
            Some((over.max(floor).min(max), REMEMBER_WINDOWS))
        } else {
            self.floor
                .and_then(|(age, left)| (left > 1).then(|| (age, left - 1)))
        };
        self.age = Duration::from_secs(decision.age_secs);
        self.last_share = decision.share_per_minute;
        self.counts[decision.step as usize] += 1;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(decision);
        self.window = Some(WindowStart {
            at: now,
            reads,
            stored,
        });
        Some(decision)
    }

    pub fn stats(&self) -> PromotionStats {
        PromotionStats {
            age_secs: self.age.as_secs(),
            floor_secs: self.floor.map_or(0, |(age, _)| age),
            target_share_per_minute: self.target.share_per_minute,
            share_per_minute: self.last_share,
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

    fn decide0(t: &PromotionTarget, seen: &Observation, age: Duration) -> Decision {
        decide(t, seen, age, 0)
    }

    fn target() -> PromotionTarget {
        PromotionTarget {
            share_per_minute: 0.002,
            min_age: secs(10),
            max_age: secs(600),
            start_age: secs(60),
            window: secs(60),
        }
    }

    #[test]
    fn the_model_by_hand() {
        let t = target();
        // 10 000 pages stored: the target allows 20 promotions a minute; under 10 is well
        // under.
        let window = |promotions| Observation {
            promotions,
            stored_pages: 10_000,
            elapsed: secs(60),
        };
        let d = decide0(&t, &window(21), secs(60));
        assert_eq!((d.step, d.age_secs), (Step::Older, 120));
        let d = decide0(&t, &window(20), secs(120));
        assert_eq!((d.step, d.age_secs), (Step::Holding, 120));
        let d = decide0(&t, &window(10), secs(120));
        assert_eq!((d.step, d.age_secs), (Step::Holding, 120));
        let d = decide0(&t, &window(9), secs(120));
        assert_eq!((d.step, d.age_secs), (Step::Younger, 105));
        // At the bounds: held, not moved past.
        let d = decide0(&t, &window(1000), secs(400));
        assert_eq!((d.step, d.age_secs), (Step::Older, 600));
        let d = decide0(&t, &window(1000), secs(600));
        assert_eq!((d.step, d.age_secs), (Step::Holding, 600));
        let d = decide0(&t, &window(0), secs(11));
        assert_eq!((d.step, d.age_secs), (Step::Younger, 10));
        let d = decide0(&t, &window(0), secs(10));
        assert_eq!((d.step, d.age_secs), (Step::Holding, 10));
        // Nothing stored and nothing promoted is well under; promotions from an empty store
        // are over.
        let empty = |promotions| Observation {
            promotions,
            stored_pages: 0,
            elapsed: secs(60),
        };
        assert_eq!(decide0(&t, &empty(0), secs(60)).step, Step::Younger);
        assert_eq!(decide0(&t, &empty(1), secs(60)).step, Step::Older);
        // A floor stops the way down, not the way up.
        let d = decide(&t, &window(0), secs(120), 110);
        assert_eq!((d.step, d.age_secs), (Step::Younger, 110));
        let d = decide(&t, &window(0), secs(110), 110);
        assert_eq!((d.step, d.age_secs), (Step::Holding, 110));
        let d = decide(&t, &window(100), secs(110), 110);
        assert_eq!((d.step, d.age_secs), (Step::Older, 220));
    }

    #[test]
    fn the_controller_decides_per_window_and_at_once_when_over() {
        let mut c = PromotionController::new(target());
        assert_eq!(c.age(), secs(60));
        assert_eq!(c.observe(secs(0), 0, 10_000), None, "opens the window");
        // Half a window with 5 promotions: nothing yet.
        assert_eq!(c.observe(secs(30), 5, 10_000), None);
        // A whole quiet window: younger.
        let d = c.observe(secs(60), 5, 10_000).unwrap();
        assert_eq!((d.step, d.age_secs), (Step::Younger, 53));
        // 25 promotions 10 s in: more than the whole window allows; older at once.
        let d = c.observe(secs(70), 30, 10_000).unwrap();
        assert_eq!((d.step, d.age_secs), (Step::Older, 106));
        assert_eq!(d.promotions, 25);
        // Counters that went back open a new window.
        assert_eq!(c.observe(secs(200), 0, 0), None);
        let s = c.stats();
        assert_eq!((s.younger, s.older, s.holding), (1, 1, 0));
        assert_eq!(s.history.len(), 2);
        assert_eq!(s.age_secs, 106);
        // The history keeps the last HISTORY decisions.
        for n in 1..=(HISTORY as u64 + 5) {
            c.observe(secs(200 + 60 * n), 0, 0);
        }
        let s = c.stats();
        assert_eq!(s.history.len(), HISTORY);
        // From 106 s down an eighth a window to the floor, 54 s (one over the 53 s that
        // went over), in 6 steps; held there until the floor is forgotten, REMEMBER_WINDOWS
        // windows after the one over; then down again: 48, 42, 37, 33, 29, 26, 23.
        assert_eq!(REMEMBER_WINDOWS, 30);
        assert_eq!((s.younger, s.holding), (1 + 6 + 7, 24));
        assert_eq!((s.age_secs, s.floor_secs), (23, 0));
        let ages: Vec<u64> = s.history.iter().map(|d| d.age_secs).collect();
        assert_eq!(ages[ages.len() - 8..], [54, 48, 42, 37, 33, 29, 26, 23]);
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
            bad(|b| b.start_age = secs(700)),
            BadPromotionTarget::StartOutside { .. }
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

    proptest! {
        #[test]
        fn decisions_keep_the_age_within_bounds_and_move_the_right_way(
            share in 0.0001f64..1.0,
            min in 1u64..1000,
            span in 0u64..10_000,
            age in 0u64..20_000,
            promotions in 0u64..100_000,
            stored in 0u64..1_000_000,
            elapsed in 0u64..1000,
            floor in 0u64..20_000,
        ) {
            let t = PromotionTarget {
                share_per_minute: share,
                min_age: secs(min),
                max_age: secs(min + span),
                start_age: secs(min),
                window: secs(60),
            };
            let seen = Observation { promotions, stored_pages: stored, elapsed: secs(elapsed) };
            let d = decide(&t, &seen, secs(age), floor);
            if d.step == Step::Younger {
                prop_assert!(d.age_secs >= floor.min(d.age_before_secs), "below the floor");
            }
            prop_assert!((min..=min + span).contains(&d.age_secs));
            prop_assert!((min..=min + span).contains(&d.age_before_secs));
            let rate = seen.share_per_minute();
            if rate > share {
                prop_assert!(d.age_secs >= d.age_before_secs, "over the target, younger");
                prop_assert_ne!(d.step, Step::Younger);
            } else {
                prop_assert!(d.age_secs <= d.age_before_secs, "under the target, older");
                prop_assert_ne!(d.step, Step::Older);
            }
            if rate >= share * WELL_UNDER && rate <= share {
                prop_assert_eq!(d.step, Step::Holding);
            }
        }

        #[test]
        fn a_controller_fed_anything_stays_within_bounds(
            steps in proptest::collection::vec((0u64..200, 0u64..500, 0u64..100_000), 1..100),
        ) {
            let t = target();
            let mut c = PromotionController::new(t);
            let (mut now, mut reads) = (0u64, 0u64);
            for (dt, dr, stored) in steps {
                now += dt;
                reads += dr;
                c.observe(secs(now), reads, stored);
                prop_assert!(c.age() >= t.min_age && c.age() <= t.max_age);
                prop_assert!(c.stats().history.len() <= HISTORY);
            }
        }
    }
}
