//! The swap-slot allocator's lock study, as the 2024 rework measured it: threads (more than
//! cores is allowed) allocate and free slots in the patterns of swap-out and swap-in, for a
//! fixed number of operations, on a device over a real (sparse) backing file, in the
//! cluster mode and the legacy mode from the same seed; the report has operations per
//! second, device-lock acquisitions per slot allocated, every lock's contention and wait
//! (`perf lock contention`), allocation failures per order and fragmentation.
//!
//! Each thread keeps the slots it holds (its swapped-out pages) near a share of the
//! workload's fill level: below it, 60 % of the slots its operations move are allocated;
//! above, 40 % (counted in slots: where runs are swapped in page by page, a thread frees far
//! more often than it allocates, or the device would fill up whatever the level). A free
//! picks a held slot at random (swap-in order is not swap-out order). A large allocation
//! that finds no room falls back to its pages one by one, as the kernel splits a folio it
//! cannot swap out whole.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use serde::Serialize;
use ztier_base::rng::Rng;
use ztier_blockdev::file::FileDevice;
use ztier_swap::lockstat::LockReport;
use ztier_swap::{Config, Device, DeviceStats, ListPolicy, Mode, SwapError, SLOT_BYTES};

use crate::{ReplayError, Result};

/// What the threads do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Order-0 swap-out and swap-in at half full.
    Order0,
    /// A quarter of swap-outs are order-4 runs (64 KiB mTHP), swapped in whole; 60 % full.
    Mixed,
    /// As mixed, but runs are swapped in page by page, so clusters fragment; 70 % full.
    Churn,
    /// Churn at 95 % full.
    NearlyFull,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::Order0,
        Workload::Mixed,
        Workload::Churn,
        Workload::NearlyFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Order0 => "order0",
            Workload::Mixed => "mixed",
            Workload::Churn => "churn",
            Workload::NearlyFull => "nearly-full",
        }
    }

    /// The share of the device the threads keep allocated.
    pub fn fill(self) -> f64 {
        match self {
            Workload::Order0 => 0.5,
            Workload::Mixed => 0.6,
            Workload::Churn => 0.7,
            Workload::NearlyFull => 0.95,
        }
    }

    fn large_orders(self) -> bool {
        self != Workload::Order0
    }

    /// Runs are freed slot by slot.
    fn splits_runs(self) -> bool {
        matches!(self, Workload::Churn | Workload::NearlyFull)
    }
}

/// A workload name [`Workload::ALL`] does not have.
#[derive(Debug, Clone, thiserror::Error)]
#[error("unknown workload '{0}' (order0, mixed, churn, nearly-full)")]
pub struct UnknownWorkload(pub String);

impl std::str::FromStr for Workload {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> std::result::Result<Workload, UnknownWorkload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

/// The order of the large allocations (64 KiB).
pub const LARGE_ORDER: u32 = 4;

/// One run's settings.
#[derive(Debug, Clone)]
pub struct SwapAllocBench {
    pub workload: Workload,
    pub mode: Mode,
    /// Where frees send clusters (both modes alike).
    pub policy: ListPolicy,
    pub threads: usize,
    /// Operations (allocations and frees) over all threads.
    pub ops: u64,
    /// The backing file's size.
    pub device_bytes: u64,
    pub seed: u64,
    /// Where the (sparse) backing file is made, and removed after.
    pub dir: PathBuf,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct SwapAllocReport {
    pub workload: Workload,
    pub fill: f64,
    pub mode: Mode,
    pub threads: usize,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_s: f64,
    pub slots_allocated: u64,
    pub device_lock_acquisitions: u64,
    pub device_lock_per_slot: f64,
    /// Allocations that found no room, per order.
    pub fallbacks: Vec<u64>,
    /// Free slots in clusters on the frag lists at the end, before the threads let go.
    pub frag_free_slots: u64,
    pub locks: Vec<LockReport>,
    pub device: DeviceStats,
}

impl SwapAllocReport {
    /// A lock's figures by name's start (`si->lock`, `ci->lock`, ...).
    pub fn lock(&self, prefix: &str) -> Option<&LockReport> {
        self.locks.iter().find(|l| l.name.starts_with(prefix))
    }
}

/// A thread's slots: single slots, and whole runs (freed with one call).
struct Held {
    slots: Vec<u64>,
    runs: Vec<u64>,
}

impl Held {
    fn count(&self) -> u64 {
        self.slots.len() as u64 + ((self.runs.len() as u64) << LARGE_ORDER)
    }
}

impl SwapAllocBench {
    pub fn run(&self) -> Result<SwapAllocReport> {
        if self.threads == 0 || self.ops == 0 {
            return Err(ReplayError::NoThreadsOrOps);
        }
        let path = backing_path(&self.dir, self.mode, self.threads);
        let file =
            FileDevice::open(&path, self.device_bytes).map_err(|source| ReplayError::SwapFile {
                path: path.clone(),
                source,
            });
        let result = file.and_then(|file| self.run_on(Arc::new(file)));
        let _ = std::fs::remove_file(&path);
        result
    }

    fn run_on(&self, file: Arc<FileDevice>) -> Result<SwapAllocReport> {
        let dev = Device::new(
            file,
            Config {
                mode: self.mode,
                policy: self.policy,
                ..Config::default()
            },
        )?;
        let usable = dev.usable_slots();
        let share = (usable as f64 * self.workload.fill() / self.threads as f64) as u64;
        let per_thread = self.ops / self.threads as u64;
        let start = Barrier::new(self.threads);
        // Timed from the first thread's start to the last one's end, each read by the worker:
        // with 64 threads on 2 cores the spawning thread may get a core only after much of
        // the work is done, and a clock it read after the barrier undercounted the run (order0
        // at 64 threads read 22-246M operations a second in the cluster mode; 15-30M timed
        // here).
        let (held, seconds) = std::thread::scope(|s| {
            let workers: Vec<_> = (0..self.threads)
                .map(|t| {
                    let (dev, start) = (&dev, &start);
                    let seed = self.seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    s.spawn(move || {
                        start.wait();
                        let began = Instant::now();
                        let held = thread_ops(dev, self.workload, per_thread, share, seed);
                        (held, began, Instant::now())
                    })
                })
                .collect();
            let mut held = Vec::with_capacity(self.threads);
            let (mut first, mut last) = (None::<Instant>, None::<Instant>);
            for w in workers {
                let (h, began, ended) = w.join().expect("bench thread");
                held.push(h);
                first = Some(first.map_or(began, |f| f.min(began)));
                last = Some(last.map_or(ended, |l| l.max(ended)));
            }
            let seconds = match (first, last) {
                (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
                _ => 0.0,
            };
            (held, seconds)
        });
        let during = dev.stats();
        for mut h in held {
            for run in h.runs {
                dev.free_range(run, 1 << LARGE_ORDER)?;
            }
            dev.free_batch(&mut h.slots)?;
        }
        dev.drain_slot_caches();
        if dev.in_use() != 0 {
            return Err(ReplayError::SlotsInUse {
                slots: dev.in_use(),
            });
        }
        dev.check_consistency()
            .map_err(ReplayError::SwapInconsistent)?;
        let slots_allocated: u64 = during
            .per_order
            .iter()
            .map(|o| o.allocations << o.order)
            .sum();
        let locks = during.locks.clone();
        let device_lock_acquisitions = locks
            .iter()
            .find(|l| l.name.starts_with("si->lock"))
            .map_or(0, |l| l.acquisitions);
        Ok(SwapAllocReport {
            workload: self.workload,
            fill: self.workload.fill(),
            mode: self.mode,
            threads: self.threads,
            ops: per_thread * self.threads as u64,
            seconds,
            ops_per_s: (per_thread * self.threads as u64) as f64 / seconds,
            slots_allocated,
            device_lock_acquisitions,
            device_lock_per_slot: device_lock_acquisitions as f64 / slots_allocated.max(1) as f64,
            fallbacks: during.per_order.iter().map(|o| o.fallbacks).collect(),
            frag_free_slots: during.frag_free_slots,
            locks,
            device: during,
        })
    }
}

fn backing_path(dir: &Path, mode: Mode, threads: usize) -> PathBuf {
    dir.join(format!(
        "ztier-swap-alloc-{}-{mode:?}-{threads}",
        std::process::id()
    ))
}

/// One thread's operations; returns what it still holds.
fn thread_ops(dev: &Device, workload: Workload, ops: u64, share: u64, seed: u64) -> Held {
    let mut rng = Rng::new(seed);
    let mut held = Held {
        slots: Vec::with_capacity(share as usize + 64),
        runs: Vec::new(),
    };
    let (below, above) = (alloc_chance(workload, 0.6), alloc_chance(workload, 0.4));
    for _ in 0..ops {
        let want_alloc = rng.below(1000) < if held.count() < share { below } else { above };
        if want_alloc || held.count() == 0 {
            let large = workload.large_orders() && rng.below(4) == 0;
            let order = if large { LARGE_ORDER } else { 0 };
            match dev.alloc(order) {
                Ok(slot) if large && !workload.splits_runs() => held.runs.push(slot),
                Ok(slot) => held.slots.extend(slot..slot + (1 << order)),
                // No room for the run (a fallback, counted by the device): as the kernel
                // splits the folio, its pages go out one by one.
                Err(SwapError::Full { order: LARGE_ORDER }) => {
                    for _ in 0..1 << LARGE_ORDER {
                        match dev.alloc(0) {
                            Ok(slot) => held.slots.push(slot),
                            Err(_) => break,
                        }
                    }
                }
                // Nothing free for one page: the thread swaps something in instead.
                Err(SwapError::Full { .. }) => free_one(dev, &mut held, &mut rng),
                Err(e) => panic!("allocation failed: {e}"),
            }
        } else {
            free_one(dev, &mut held, &mut rng);
        }
    }
    held
}

/// The chance in 1000 that an operation allocates, so that of the slots an operation moves a
/// share `slots_in` are allocated: an allocation takes 4.75 slots on average where a quarter
/// are order-4 runs, and where runs are swapped in page by page a free gives back one, so
/// operations there must free far more often than they allocate to keep the fill level.
fn alloc_chance(workload: Workload, slots_in: f64) -> u64 {
    let per_alloc = if workload.large_orders() {
        0.75 + 0.25 * f64::from(1u32 << LARGE_ORDER)
    } else {
        1.0
    };
    // A free gives back an allocation's worth when runs are freed whole.
    let per_free = if workload.splits_runs() {
        1.0
    } else {
        per_alloc
    };
    let ratio = per_alloc / per_free;
    (1000.0 * slots_in / (slots_in + ratio * (1.0 - slots_in))).round() as u64
}

fn free_one(dev: &Device, held: &mut Held, rng: &mut Rng) {
    let total = held.slots.len() + held.runs.len();
    if total == 0 {
        return;
    }
    let pick = rng.below(total as u64) as usize;
    if pick < held.slots.len() {
        let slot = held.slots.swap_remove(pick);
        dev.free(slot).expect("a held slot frees");
    } else {
        let run = held.runs.swap_remove(pick - held.slots.len());
        dev.free_range(run, 1 << LARGE_ORDER)
            .expect("a held run frees");
    }
}

/// Bytes of a device of `slots` slots.
pub fn device_bytes(slots: u64) -> u64 {
    slots * SLOT_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both modes, every workload, two threads: everything frees (`run` refuses a device
    /// with a slot still in use, or one `verify()` faults), the device saw every operation,
    /// the fill level held, and order 0 never failed; on order 0 the legacy mode takes the
    /// device lock about twice per 64 slots (a cache refill and a flush), the cluster mode
    /// under 1/64 (under half the legacy mode's where runs are swapped in page by page).
    #[test]
    fn both_modes_run_every_workload_and_let_go_of_everything() {
        for workload in Workload::ALL {
            let run = |mode| {
                SwapAllocBench {
                    workload,
                    mode,
                    policy: ListPolicy::Ztier,
                    threads: 2,
                    ops: 200_000,
                    device_bytes: device_bytes(64 * 512),
                    seed: 7,
                    dir: std::env::temp_dir(),
                }
                .run()
                .unwrap()
            };
            let (cluster, legacy) = (run(Mode::Cluster), run(Mode::Legacy));
            for r in [&cluster, &legacy] {
                let d = &r.device;
                assert!(r.slots_allocated > 50_000, "{workload:?}: {r:?}");
                // Every operation reached the device: an allocation, a free or a fallback
                // (counted in calls, not slots). Where nothing failed, each operation was
                // exactly one call, but for the legacy mode's frees still in the threads'
                // return caches (counted when flushed).
                let calls: u64 = d.per_order.iter().map(|o| o.allocations + o.frees).sum();
                let fallbacks: u64 = r.fallbacks.iter().sum();
                let unflushed = match r.mode {
                    Mode::Cluster => 0,
                    Mode::Legacy => 2 * ztier_swap::SWAP_SLOTS_CACHE_SIZE as u64,
                };
                assert!(
                    calls + fallbacks + unflushed >= r.ops,
                    "{workload:?} {:?}: {calls} calls and {fallbacks} fallbacks for {} ops",
                    r.mode,
                    r.ops
                );
                if fallbacks == 0 {
                    assert!(calls <= r.ops, "{workload:?} {:?}: {calls} calls", r.mode);
                }
                // The threads kept the workload's fill level (counted in slots).
                let level = d.in_use as f64 / d.usable_slots as f64;
                assert!(
                    (level - workload.fill()).abs() < 0.02,
                    "{workload:?} {:?}: {level:.3} full, not {}",
                    r.mode,
                    workload.fill()
                );
                // Below the level there is always a slot: order 0 never fails, and at half or
                // 60 % full neither does order 4.
                assert_eq!(r.fallbacks[0], 0, "{workload:?} {:?}", r.mode);
                if !workload.splits_runs() {
                    assert_eq!(fallbacks, 0, "{workload:?} {:?}", r.mode);
                }
            }
            // Where runs are swapped in page by page, each order-4 allocation that succeeds
            // in a fragmented cluster is a trip of its own, and how many succeed depends on
            // the threads' interleaving: 0.18-1.75 acquisitions per 64 slots over a hundred
            // runs of churn (one CI run 1.63), against the legacy mode's 4.8-5.0. There the
            // bound is half the legacy mode's; elsewhere under one per 64 slots (0.6-0.8).
            let bound = if workload.splits_runs() {
                legacy.device_lock_per_slot / 2.0
            } else {
                1.0 / 64.0
            };
            assert!(
                cluster.device_lock_per_slot < bound,
                "{workload:?}: cluster {}, legacy {}",
                cluster.device_lock_per_slot,
                legacy.device_lock_per_slot
            );
            // Order-4 runs bypass the caches: the 64-slot batching shows on order 0 alone.
            assert!(
                workload != Workload::Order0 || legacy.device_lock_per_slot < 3.0 / 64.0,
                "{workload:?}: legacy {}",
                legacy.device_lock_per_slot
            );
            assert_eq!(cluster.lock("global").unwrap().acquisitions, 0);
        }
    }
}
