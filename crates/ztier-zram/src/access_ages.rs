//! How old pages are when they are read, and how old they are now: the two histograms by
//! idle age that the far tier's age is chosen from (`promotion.rs`, after Google's
//! software-defined far memory, ASPLOS '19).
//!
//! - Every read of a page held in the pool or on the store records the page's age at that
//!   moment (now less its `ac_time`, before the read sets it) in the reading thread's
//!   shard (`ReadAges::touch`): for any idle age T, the reads of pages at least T old are
//!   the promotions T would have caused, since a page that old would have been on the store.
//! - [`Device::idle_ages`] counts the pages by their age now, in one pass over the slots: at
//!   least T old are the pages T would hold on the store.
//!
//! Ages fall in eighth-octave buckets of whole seconds (0, 1, 2, …, 16, 18, 20, …, 30, 32, 36,
//! …), so a bucket's start is an age a policy can choose and the counts at or above it are
//! exact for it. Eight a doubling keep the ages a policy may choose within 12.5 % of one
//! another: four a doubling left 330 s, the best fixed age on an hour of postgres at
//! 5 %/min, between 320 s and 384 s. A histogram is 1.5 KB (a shard's, made on its first
//! read; the controller keeps three). Same-filled and empty slots count in neither: they
//! never go to the store.
//!
//! Invariants: a shard's counts only grow (a device's reset leaves them: a reader takes
//! differences, and counts that went back mean a new start); ages from
//! [`OLDEST_BUCKET_SECS`] up fall in the last bucket; a bucket [`BUCKETS_PER_DOUBLING`] on
//! from another (from 8 s up) starts at twice its age. The recording is a plain add in the
//! shard the read already holds: no atomic operation, no lock of its own, and no memory until
//! a shard's first read.
//!
//! Locking: the calling thread's shard is held by the read (lib.rs's order);
//! [`Device::read_ages`] takes the shards one at a time, holding nothing else;
//! [`Device::idle_ages`] takes slot locks one at a time, holding nothing else.

use crate::slot::{Content, Entry, SlotOps};
use crate::Device;

/// Buckets a doubling of age spans (from 8 s up; each of the first eight is a second).
pub const BUCKETS_PER_DOUBLING: usize = 8;

/// Buckets of a histogram: every eighth of an octave of seconds up to [`OLDEST_BUCKET_SECS`].
pub const AGE_BUCKETS: usize = 192;

/// The start of the last bucket (about 730 days): older ages count there.
pub const OLDEST_BUCKET_SECS: u64 = bucket_start(AGE_BUCKETS - 1);

const _: () = assert!(bucket_of(OLDEST_BUCKET_SECS) == AGE_BUCKETS - 1);
const _: () = assert!(bucket_of(u32::MAX as u64) == AGE_BUCKETS - 1);
const _: () = assert!(
    bucket_start(3 * BUCKETS_PER_DOUBLING + 5) == 2 * bucket_start(2 * BUCKETS_PER_DOUBLING + 5)
);

/// The bucket of a page `age_secs` old: 0 to 7 for those seconds, then eight a doubling.
pub const fn bucket_of(age_secs: u64) -> usize {
    if age_secs < 8 {
        return age_secs as usize;
    }
    let octave = 63 - age_secs.leading_zeros() as usize;
    let eighth = ((age_secs >> (octave - 3)) & 7) as usize;
    let bucket = 8 * (octave - 2) + eighth;
    if bucket < AGE_BUCKETS {
        bucket
    } else {
        AGE_BUCKETS - 1
    }
}

/// The youngest age in `bucket` (seconds).
pub const fn bucket_start(bucket: usize) -> u64 {
    if bucket < 8 {
        return bucket as u64;
    }
    let (octave, eighth) = (bucket / 8 + 2, (bucket % 8) as u64);
    (8 + eighth) << (octave - 3)
}

/// Pages (or reads) by their idle age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgeHistogram {
    counts: [u64; AGE_BUCKETS],
}

impl Default for AgeHistogram {
    fn default() -> AgeHistogram {
        AgeHistogram {
            counts: [0; AGE_BUCKETS],
        }
    }
}

impl AgeHistogram {
    /// Counts one at `age_secs`.
    pub fn record(&mut self, age_secs: u64) {
        self.counts[bucket_of(age_secs)] += 1;
    }

    /// The count in each bucket.
    pub fn counts(&self) -> &[u64; AGE_BUCKETS] {
        &self.counts
    }

    /// For each bucket, the count at its start's age or older.
    pub fn at_least(&self) -> [u64; AGE_BUCKETS] {
        let mut sums = self.counts;
        for b in (0..AGE_BUCKETS - 1).rev() {
            sums[b] += sums[b + 1];
        }
        sums
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &AgeHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// What was counted since `earlier`, or `None` if some count went back (a new start).
    pub fn since(&self, earlier: &AgeHistogram) -> Option<AgeHistogram> {
        let mut d = AgeHistogram::default();
        for ((out, now), then) in d.counts.iter_mut().zip(&self.counts).zip(&earlier.counts) {
            *out = now.checked_sub(*then)?;
        }
        Some(d)
    }
}

/// A shard's reads by the age of the page read; made on the shard's first one.
#[derive(Debug, Default)]
pub(crate) struct ReadAges(Option<Box<AgeHistogram>>);

impl ReadAges {
    /// A read of the locked slot's `entry` at `now`: the page's age is recorded if it could
    /// be on the store, and its access time set (the idle mark is the caller's).
    pub(crate) fn touch(&mut self, entry: &mut Entry, now: u32) {
        if matches!(
            entry.content(),
            Content::Stored(_) | Content::WrittenBack(_)
        ) {
            let age = now.saturating_sub(entry.ac_time());
            self.0.get_or_insert_default().record(u64::from(age));
        }
        if entry.is_allocated() {
            entry.set_ac_time(now);
        }
    }
}

impl Device {
    /// Every read so far of a page held in the pool or on the store, by the page's age when
    /// it was read (summed over the shards).
    pub fn read_ages(&self) -> AgeHistogram {
        let mut total = AgeHistogram::default();
        self.shards.for_each(|shard| {
            if let Some(h) = &shard.read_ages.0 {
                total.add(h);
            }
        });
        total
    }

    /// The pages held in the pool or on the store by their idle age now: one pass over the
    /// slots, each looked at under its lock. With larger units, a unit counts its pages.
    pub fn idle_ages(&self) -> AgeHistogram {
        let now = self.now();
        let mut ages = AgeHistogram::default();
        let pages = self.pages_per_unit();
        for slot in self.occupied_slots() {
            let e = slot.lock().entry;
            if matches!(e.content(), Content::Stored(_) | Content::WrittenBack(_)) {
                ages.counts[bucket_of(u64::from(now.saturating_sub(e.ac_time())))] += pages;
            }
        }
        ages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_by_hand() {
        let starts: Vec<u64> = (14..28).map(bucket_start).collect();
        assert_eq!(
            starts,
            [14, 15, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40, 44]
        );
        assert_eq!(bucket_of(17), 16);
        assert_eq!(bucket_of(18), 17);
        assert_eq!(bucket_of(31), 23);
        assert_eq!(bucket_start(bucket_of(330)), 320);
        assert_eq!(bucket_start(bucket_of(360)), 352);
        assert_eq!(bucket_of(u64::MAX), AGE_BUCKETS - 1);
        let mut h = AgeHistogram::default();
        for age in [0, 5, 30, 30, 400] {
            h.record(age);
        }
        let at_least = h.at_least();
        assert_eq!(at_least[0], 5);
        assert_eq!(at_least[bucket_of(28)], 3);
        assert_eq!(at_least[bucket_of(32)], 1);
        assert_eq!(at_least[AGE_BUCKETS - 1], 0);
        let mut more = h.clone();
        more.record(30);
        let d = more.since(&h).unwrap();
        assert_eq!(d.at_least()[0], 1);
        assert_eq!(h.since(&more), None, "counts that went back");
    }

    proptest! {
        /// A bucket holds exactly the ages from its start to the next one's, and its start
        /// counts at or above it: the model is a search over the starts.
        #[test]
        fn an_age_falls_in_the_last_bucket_starting_at_or_under_it(age in 0u64..(1 << 26)) {
            let model = (0..AGE_BUCKETS).rev().find(|&b| bucket_start(b) <= age).unwrap();
            prop_assert_eq!(bucket_of(age), model);
            let b = bucket_of(bucket_start(model));
            prop_assert_eq!(b, model);
        }

        #[test]
        fn at_least_counts_what_is_that_old(ages in proptest::collection::vec(0u64..100_000, 0..200)) {
            let mut h = AgeHistogram::default();
            for &a in &ages {
                h.record(a);
            }
            let sums = h.at_least();
            for (b, &sum) in sums.iter().enumerate() {
                let model = ages.iter().filter(|&&a| a >= bucket_start(b)).count() as u64;
                prop_assert_eq!(sum, model);
            }
        }
    }
}
