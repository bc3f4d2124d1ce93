//! What a region's choice of cold pages is measured against: an access trace (every page a
//! program touched, in order) replayed through four policies holding the same number of
//! pages resident, each counting the pages it must bring in (its refaults).
//!
//! - **MIN** (Belady's): on a miss with no room, let go of the page whose next use is
//!   furthest away (never used again first), the page just used among them. It knows the
//!   future, and no policy brings in fewer pages for the trace, neither one that prefetches
//!   (a page brought in early is still brought in) nor one that drops a page right after its
//!   use: the floor.
//! - **LRU**: evict the page least recently used. It sees every access but not the future.
//! - **CLOCK**: the kernel's second chance with the hardware's accessed bit: a hand sweeps
//!   the resident pages, clearing set bits and evicting the first page whose bit is clear.
//!
//! - **Fault CLOCK**: a model of a region's own clock. A region sees less than either of the
//!   last two: no accessed bits reach userspace (idle page tracking and soft-dirty are what a
//!   kernel offers, and not every kernel does), only its faults, so its hand, sweeping the
//!   page table, gives a page one second chance after the fault that brought it in and
//!   evicts it on the next visit however often it was read meanwhile.
//!
//! Where a region's refaults stand against these says what its blindness costs (fault CLOCK
//! against CLOCK), what its implementation adds (the region against fault CLOCK: fault-around,
//! its margin under the budget, two evictors) and what is left for any policy (MIN).
//!
//! Invariants: each policy holds at most `capacity` pages; an access to a resident page
//! brings nothing in; the accesses before `count_from` fill and shape the resident set but
//! their misses are not counted (so a region's steady state can be compared, not its
//! warm-up).

use std::collections::BinaryHeap;

use serde::Serialize;
use ztier_base::list::{Links, List};

/// Pages each policy brought in over the counted part of a trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Refaults {
    /// Accesses counted (the trace's length less `count_from`).
    pub accesses: u64,
    /// Pages resident at most.
    pub capacity: u64,
    pub min: u64,
    pub lru: u64,
    pub clock: u64,
    pub fault_clock: u64,
}

/// Replays `trace` (page numbers) through MIN, LRU, CLOCK and the fault clock, each holding at most
/// `capacity` pages (at least one), counting the misses from access `count_from` on.
pub fn replay(trace: &[u32], capacity: usize, count_from: usize) -> Refaults {
    let capacity = capacity.max(1);
    let pages = trace.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
    Refaults {
        accesses: trace.len().saturating_sub(count_from) as u64,
        capacity: capacity as u64,
        min: min(trace, pages, capacity, count_from),
        lru: lru(trace, pages, capacity, count_from),
        clock: clock(trace, pages, capacity, count_from),
        fault_clock: fault_clock(trace, pages, capacity, count_from),
    }
}

/// Belady's MIN. Resident pages sit in a max-heap by next use; an entry is current only
/// while it matches the page's recorded next use (a hit pushes a new one and leaves the old
/// to be skipped when it surfaces).
fn min(trace: &[u32], pages: usize, capacity: usize, count_from: usize) -> u64 {
    const NEVER: usize = usize::MAX;
    let mut next_use = vec![NEVER; trace.len()];
    let mut seen = vec![NEVER; pages];
    for (i, &p) in trace.iter().enumerate().rev() {
        next_use[i] = seen[p as usize];
        seen[p as usize] = i;
    }
    // Each resident page's next use; `None` while it is out.
    let mut resident: Vec<Option<usize>> = vec![None; pages];
    let mut heap = BinaryHeap::new();
    let mut held = 0;
    let mut misses = 0;
    for (i, &p) in trace.iter().enumerate() {
        let page = p as usize;
        let miss = resident[page].is_none();
        if miss && i >= count_from {
            misses += 1;
        }
        resident[page] = Some(next_use[i]);
        heap.push((next_use[i], page));
        if !miss {
            continue;
        }
        if held < capacity {
            held += 1;
            continue;
        }
        // The page just used is a candidate too: one not used again before every resident
        // page is let go at once (a region may evict a page right after its fault).
        loop {
            let (next, victim) = heap.pop().expect("a full resident set has entries");
            if resident[victim] == Some(next) {
                resident[victim] = None;
                break;
            }
        }
    }
    misses
}

fn lru(trace: &[u32], pages: usize, capacity: usize, count_from: usize) -> u64 {
    // Each page's place on the list.
    let mut nodes = vec![Links::default(); pages];
    let mut list = List::new();
    let mut misses = 0;
    for (i, &p) in trace.iter().enumerate() {
        if nodes[p as usize].is_linked() {
            list.remove(&mut nodes, p);
        } else {
            if i >= count_from {
                misses += 1;
            }
            if list.len() == capacity as u64 {
                list.pop_back(&mut nodes);
            }
        }
        list.push_front(&mut nodes, p);
    }
    misses
}

fn clock(trace: &[u32], pages: usize, capacity: usize, count_from: usize) -> u64 {
    const OUT: u32 = u32::MAX;
    // The frame each page is in, and each frame's page and accessed bit.
    let mut frame_of = vec![OUT; pages];
    let mut frames: Vec<(u32, bool)> = Vec::with_capacity(capacity);
    let mut hand = 0;
    let mut misses = 0;
    for (i, &p) in trace.iter().enumerate() {
        let page = p as usize;
        if frame_of[page] != OUT {
            frames[frame_of[page] as usize].1 = true;
            continue;
        }
        if i >= count_from {
            misses += 1;
        }
        if frames.len() < capacity {
            frame_of[page] = frames.len() as u32;
            frames.push((p, false));
            continue;
        }
        while frames[hand].1 {
            frames[hand].1 = false;
            hand = (hand + 1) % capacity;
        }
        frame_of[frames[hand].0 as usize] = OUT;
        frames[hand] = (p, false);
        frame_of[page] = hand as u32;
        hand = (hand + 1) % capacity;
    }
    misses
}

/// A region's clock: the hand goes round the page numbers (not the resident pages), a page's
/// bit is set when it comes in and never by a hit, and a page over capacity evicts the
/// first resident page whose bit is clear, clearing the set ones it passes.
fn fault_clock(trace: &[u32], pages: usize, capacity: usize, count_from: usize) -> u64 {
    let mut resident = vec![false; pages];
    let mut referenced = vec![false; pages];
    let mut held = 0;
    let mut hand = 0;
    let mut misses = 0;
    for (i, &p) in trace.iter().enumerate() {
        let page = p as usize;
        if resident[page] {
            continue;
        }
        if i >= count_from {
            misses += 1;
        }
        resident[page] = true;
        referenced[page] = true;
        held += 1;
        while held > capacity {
            let q = hand;
            hand = (hand + 1) % pages;
            if !resident[q] {
                continue;
            }
            if referenced[q] {
                referenced[q] = false;
                continue;
            }
            resident[q] = false;
            held -= 1;
        }
    }
    misses
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The fewest misses any eviction choice gives (the page just used among the
    /// candidates), by trying every one (small traces).
    fn fewest_misses(trace: &[u32], capacity: usize) -> u64 {
        fn go(trace: &[u32], resident: &mut Vec<u32>, capacity: usize) -> u64 {
            let Some((&p, rest)) = trace.split_first() else {
                return 0;
            };
            if resident.contains(&p) {
                return go(rest, resident, capacity);
            }
            if resident.len() < capacity {
                resident.push(p);
                let m = 1 + go(rest, resident, capacity);
                resident.pop();
                return m;
            }
            // Let go of the page just used, or of a resident one for it.
            let keep_out = 1 + go(rest, resident, capacity);
            (0..resident.len())
                .map(|k| {
                    let old = std::mem::replace(&mut resident[k], p);
                    let m = 1 + go(rest, resident, capacity);
                    resident[k] = old;
                    m
                })
                .chain([keep_out])
                .min()
                .expect("capacity is at least one")
        }
        go(trace, &mut Vec::new(), capacity)
    }

    #[test]
    fn a_loop_one_page_too_long_for_lru_costs_min_little() {
        // Pages 0..5 in a loop, 4 resident: LRU and CLOCK miss every access, MIN about one
        // in three once warm.
        let trace: Vec<u32> = (0..60).map(|i| i % 5).collect();
        let r = replay(&trace, 4, 0);
        assert_eq!((r.lru, r.clock), (60, 60));
        assert!(r.min <= 5 + 55 / 3 + 1, "{r:?}");
        assert_eq!(
            replay(&trace[..16], 4, 0).min,
            fewest_misses(&trace[..16], 4)
        );
    }

    #[test]
    fn misses_before_count_from_are_not_counted() {
        let trace = [0, 1, 2, 0, 1, 2];
        assert_eq!(replay(&trace, 3, 0).min, 3);
        let r = replay(&trace, 3, 3);
        assert_eq!((r.accesses, r.min, r.lru, r.clock), (3, 0, 0, 0));
    }

    #[test]
    fn a_clock_that_sees_only_faults_evicts_a_page_in_use() {
        // Page 0 read between every other access, two resident: CLOCK and LRU keep it (one
        // miss for it); the fault clock, which never sees it read, evicts it in turn.
        let trace: Vec<u32> = (1..40).flat_map(|k| [0, k]).collect();
        let r = replay(&trace, 2, 0);
        assert_eq!((r.lru, r.clock, r.min), (40, 40, 40));
        assert!(r.fault_clock > 45, "{r:?}");
    }

    proptest! {
        #[test]
        fn min_is_the_fewest_misses_and_no_policy_takes_fewer(
            trace in prop::collection::vec(0..6u32, 0..11),
            capacity in 1..4usize,
        ) {
            let r = replay(&trace, capacity, 0);
            prop_assert_eq!(r.min, fewest_misses(&trace, capacity));
            prop_assert!(r.min <= r.lru && r.min <= r.clock && r.min <= r.fault_clock);
        }

        #[test]
        fn each_policy_misses_once_per_page_when_all_fit(
            trace in prop::collection::vec(0..50u32, 0..400),
        ) {
            let distinct = trace.iter().collect::<std::collections::HashSet<_>>().len() as u64;
            let r = replay(&trace, 50, 0);
            prop_assert_eq!(
                (r.min, r.lru, r.clock, r.fault_clock),
                (distinct, distinct, distinct, distinct)
            );
        }

        #[test]
        fn lru_matches_a_model(
            trace in prop::collection::vec(0..12u32, 0..200),
            capacity in 1..6usize,
        ) {
            let mut order: std::collections::VecDeque<u32> = Default::default();
            let mut misses = 0;
            for &p in &trace {
                if let Some(k) = order.iter().position(|&q| q == p) {
                    order.remove(k);
                } else {
                    misses += 1;
                    if order.len() == capacity {
                        order.pop_back();
                    }
                }
                order.push_front(p);
            }
            prop_assert_eq!(replay(&trace, capacity, 0).lru, misses);
        }

        /// CLOCK is second chance: a FIFO queue whose head, if its bit is set, goes to the
        /// back with the bit cleared instead of out.
        #[test]
        fn clock_matches_second_chance(
            trace in prop::collection::vec(0..12u32, 0..200),
            capacity in 1..6usize,
        ) {
            let mut queue: std::collections::VecDeque<(u32, bool)> = Default::default();
            let mut misses = 0;
            for &p in &trace {
                if let Some(e) = queue.iter_mut().find(|e| e.0 == p) {
                    e.1 = true;
                    continue;
                }
                misses += 1;
                if queue.len() == capacity {
                    while let Some((q, referenced)) = queue.pop_front() {
                        if !referenced {
                            break;
                        }
                        queue.push_back((q, false));
                    }
                }
                queue.push_back((p, false));
            }
            prop_assert_eq!(replay(&trace, capacity, 0).clock, misses);
        }
    }
}
