//! The policy that runs by itself (the kernel has none; Android's `mmd` runs writeback and
//! recompression from a periodic job): a background thread that, every `interval`,
//! - recompresses pages not accessed for `recompress_idle` with the secondary algorithms;
//! - writes back pages not accessed for `writeback_idle`, or, given a promotion target
//!   instead, for the age its controller chooses so that reads from the store stay under
//!   the target (`promotion.rs`, from the device's reads and pages by age each pass,
//!   `access_ages.rs`);
//! - if the pool is above `mem_target`, writes back the oldest pages (by `ac_time`, ages
//!   halving down to zero) and compacts, until it is under the target or nothing is left.
//!
//! It selects pages by their access time, not the idle marks, so it never disturbs what a
//! user marked by hand. It works in the device's own batches (a page's lock at a time, a
//! segment at a time), so foreground I/O waits at most for one page or one slot copy. Its
//! thread runs at idle priority (`SCHED_IDLE`): it takes only CPU time the foreground leaves,
//! and a foreground thread that waits for a lock it holds leaves a core idle, which lets it
//! run and let go (what that keeps of the foreground's IOPS, against normal priority:
//! docs/diary.md, "zram writeback, recompression and the policy").
//! Every action is counted ([`PolicyStats`]); an error (a full or vanished store, the
//! writeback limit) is counted and kept as `last_error`, and the next tick tries again.
//!
//! A pass is a [`PolicyRunner::tick`]: the thread runs one every `interval`, a test or a
//! replay runs them by hand. Time is the device's clock ([`Device::clock`]), the one its
//! access times are in, so a device made older by hand ([`Device::set_age`]) ages its
//! pages and the controller's windows alike.
//!
//! Locking: `Shared::state` (the stop flag and the statistics), taken alone, never across
//! device work. The runner (the promotion controller's state) belongs to the thread.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use crate::promotion::{
    BadPromotionTarget, PromotionController, PromotionStats, PromotionTarget, Sample,
};
use crate::{Device, PageSelector, ZramError};

/// What the policy does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyConfig {
    pub recompress_idle: Option<Duration>,
    pub writeback_idle: Option<Duration>,
    /// Bytes of pool (`mem_used_total`) to stay under, by writeback.
    pub mem_target: Option<u64>,
    pub interval: Duration,
    /// Instead of `writeback_idle`: write back at the idle age that keeps reads from the
    /// store under this target (`promotion.rs`).
    pub promotion_target: Option<PromotionTarget>,
}

impl PolicyConfig {
    /// Whether there is anything to do.
    pub fn is_active(&self) -> bool {
        self.recompress_idle.is_some()
            || self.writeback_idle.is_some()
            || self.mem_target.is_some()
            || self.promotion_target.is_some()
    }

    /// Checks the configuration can be followed.
    pub fn validate(&self) -> Result<(), BadPolicyConfig> {
        if let Some(target) = &self.promotion_target {
            if let Some(idle) = self.writeback_idle {
                return Err(BadPolicyConfig::TwoWritebackAges {
                    idle_secs: idle.as_secs(),
                });
            }
            target.validate()?;
        }
        Ok(())
    }
}

/// A policy configuration that cannot be followed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum BadPolicyConfig {
    #[error("a writeback idle age ({idle_secs} s) and a promotion target: the target chooses the age, give one of them")]
    TwoWritebackAges { idle_secs: u64 },
    #[error(transparent)]
    Promotion(#[from] BadPromotionTarget),
}

/// The policy's actions so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicyStats {
    pub ticks: u64,
    pub recompressed_pages: u64,
    pub written_back_pages: u64,
    /// Of them, written back to meet `mem_target`.
    pub target_written_back_pages: u64,
    pub bytes_written: u64,
    pub compactions: u64,
    pub errors: u64,
    pub last_error: Option<String>,
    /// Time spent working, in milliseconds.
    pub busy_ms: u64,
    /// The promotion controller's age, rate and decisions, given a target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub promotion: Option<PromotionStats>,
}

impl PolicyStats {
    /// Adds a tick's counts (the promotion controller's state is set apart).
    fn add(&mut self, tick: PolicyStats) {
        self.ticks += tick.ticks;
        self.recompressed_pages += tick.recompressed_pages;
        self.written_back_pages += tick.written_back_pages;
        self.target_written_back_pages += tick.target_written_back_pages;
        self.bytes_written += tick.bytes_written;
        self.compactions += tick.compactions;
        self.errors += tick.errors;
        self.busy_ms += tick.busy_ms;
        if tick.last_error.is_some() {
            self.last_error = tick.last_error;
        }
    }
}

#[derive(Default)]
struct State {
    stop: bool,
    stats: PolicyStats,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// A running policy; stopped (and joined) when dropped.
pub struct Policy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Policy {
    /// Starts the policy's thread on `device`; a configuration that does not
    /// [validate](PolicyConfig::validate) is an `InvalidInput` error carrying why.
    pub fn start(device: Arc<Device>, config: PolicyConfig) -> std::io::Result<Policy> {
        config
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let shared = Arc::new(Shared::default());
        let runner = PolicyRunner::new(config);
        // The controller's starting age is reported before the first pass.
        shared.state.lock().stats.promotion = runner.promotion_stats();
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("zram-policy".into())
            .spawn(move || {
                ztier_pool::lower_to_idle_priority();
                run(&device, runner, &s)
            })?;
        Ok(Policy {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks the policy to stop after the pass it is in, if any (without waiting: dropping
    /// it waits). A writeback of that pass can be waited for with
    /// [`Device::close_writeback`].
    pub fn stop(&self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
    }

    pub fn stats(&self) -> PolicyStats {
        self.shared.state.lock().stats.clone()
    }
}

impl Drop for Policy {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn secs(d: Duration) -> u32 {
    d.as_secs().min(u64::from(u32::MAX)) as u32
}

fn run(device: &Device, mut runner: PolicyRunner, shared: &Shared) {
    let interval = runner.config.interval;
    loop {
        {
            let mut st = shared.state.lock();
            if !st.stop {
                shared.wake.wait_for(&mut st, interval);
            }
            if st.stop {
                return;
            }
        }
        let tick = runner.tick(device);
        let mut st = shared.state.lock();
        st.stats.add(tick);
        st.stats.promotion = runner.promotion_stats();
    }
}

/// The policy's passes over a device and what it keeps between them (the promotion
/// controller): what [`Policy`]'s thread runs every `interval`, and what a test or a replay
/// runs by hand.
#[derive(Debug, Clone)]
pub struct PolicyRunner {
    config: PolicyConfig,
    promotion: Option<PromotionController>,
}

impl PolicyRunner {
    /// A runner of `config` (a promotion target's numbers are brought within bounds here;
    /// [`PolicyConfig::validate`] says whether they were).
    pub fn new(config: PolicyConfig) -> PolicyRunner {
        PolicyRunner {
            config,
            promotion: config.promotion_target.map(PromotionController::new),
        }
    }

    /// The age pages are written back at now: the controller's, or the fixed one.
    pub fn writeback_age(&self) -> Option<Duration> {
        match &self.promotion {
            Some(c) => Some(c.age()),
            None => self.config.writeback_idle,
        }
    }

    pub fn promotion_stats(&self) -> Option<PromotionStats> {
        self.promotion.as_ref().map(PromotionController::stats)
    }

    /// One pass: the controller takes the store's counters and the device's reads and pages
    /// by age (and may move its age), then recompression, writeback and the memory target
    /// as configured. Returns what the pass did; an error is counted in it, and the next
    /// pass tries again.
    pub fn tick(&mut self, device: &Device) -> PolicyStats {
        let began = Instant::now();
        let mut tick = PolicyStats {
            ticks: 1,
            ..PolicyStats::default()
        };
        let mut note = |tick: &mut PolicyStats, e: ZramError| {
            tick.errors += 1;
            tick.last_error = Some(e.to_string());
        };
        let config = &self.config;
        if let Some(age) = config.recompress_idle {
            if !device.recomp_algorithms().is_empty() {
                match device.recompress(PageSelector::OlderThan(secs(age)), None, None) {
                    Ok(r) => tick.recompressed_pages += r.recompressed,
                    Err(e) => note(&mut tick, e),
                }
            }
        }
        if let (Some(controller), Some(bd)) = (&mut self.promotion, device.bd_stat()) {
            controller.observe(&Sample {
                now: device.clock(),
                bd_reads: bd.bd_reads,
                bd_count: bd.bd_count,
                read_ages: device.read_ages(),
                idle_ages: device.idle_ages(),
            });
        }
        if device.backing().is_some() {
            let age = self.writeback_age();
            if let Some(age) = age {
                match device.writeback(PageSelector::OlderThan(secs(age)), None, None) {
                    Ok(r) => {
                        tick.written_back_pages += r.pages;
                        tick.bytes_written += r.bytes_written;
                    }
                    Err(e) => note(&mut tick, e),
                }
            }
            if let Some(target) = config.mem_target {
                meet_target(device, target, age, &mut tick, &mut note);
            }
        }
        tick.busy_ms = began.elapsed().as_millis() as u64;
        tick
    }
}

/// Writes back the oldest pages until the pool is under `target`: pages idle for `start`
/// (default 64 s), then half that, and so on down to every page.
fn meet_target(
    device: &Device,
    target: u64,
    start: Option<Duration>,
    tick: &mut PolicyStats,
    note: &mut impl FnMut(&mut PolicyStats, ZramError),
) {
    let mut age = start.map_or(64, secs);
    loop {
        let mm = device.mm_stat();
        if mm.mem_used_total <= target {
            return;
        }
        // About as many pages as hold the excess, at the pool's average object size.
        let stored = (mm.orig_data_size / device.page_size() as u64).saturating_sub(mm.same_pages);
        let per_page = (mm.mem_used_total / stored.max(1)).max(1);
        let want = (mm.mem_used_total - target).div_ceil(per_page).max(1);
        match device.writeback(PageSelector::OlderThan(age), None, Some(want)) {
            Ok(r) => {
                tick.written_back_pages += r.pages;
                tick.target_written_back_pages += r.pages;
                tick.bytes_written += r.bytes_written;
                device.compact();
                tick.compactions += 1;
            }
            Err(e) => {
                note(tick, e);
                return;
            }
        }
        if age == 0 {
            return;
        }
        age /= 2;
    }
}
