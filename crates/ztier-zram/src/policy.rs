//! The policy that runs by itself (the kernel has none; Android's `mmd` runs writeback and
//! recompression from a periodic job): a background thread that, every `interval`,
//! - recompresses pages not accessed for `recompress_idle` with the secondary algorithms;
//! - writes back pages not accessed for `writeback_idle`;
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
//! Locking: `Shared::state` (the stop flag and the statistics), taken alone, never across
//! device work.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::Serialize;

use crate::{Device, PageSelector, ZramError};

/// What the policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyConfig {
    pub recompress_idle: Option<Duration>,
    pub writeback_idle: Option<Duration>,
    /// Bytes of pool (`mem_used_total`) to stay under, by writeback.
    pub mem_target: Option<u64>,
    pub interval: Duration,
}

impl PolicyConfig {
    /// Whether there is anything to do.
    pub fn is_active(&self) -> bool {
        self.recompress_idle.is_some() || self.writeback_idle.is_some() || self.mem_target.is_some()
    }
}

/// The policy's actions so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
    /// Starts the policy's thread on `device`.
    pub fn start(device: Arc<Device>, config: PolicyConfig) -> std::io::Result<Policy> {
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("zram-policy".into())
            .spawn(move || {
                ztier_pool::lower_to_idle_priority();
                run(&device, config, &s)
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

fn run(device: &Device, config: PolicyConfig, shared: &Shared) {
    loop {
        {
            let mut st = shared.state.lock();
            if !st.stop {
                shared.wake.wait_for(&mut st, config.interval);
            }
            if st.stop {
                return;
            }
        }
        let began = Instant::now();
        let mut tick = PolicyStats {
            ticks: 1,
            ..PolicyStats::default()
        };
        let mut note = |tick: &mut PolicyStats, e: ZramError| {
            tick.errors += 1;
            tick.last_error = Some(e.to_string());
        };
        if let Some(age) = config.recompress_idle {
            if !device.recomp_algorithms().is_empty() {
                match device.recompress(PageSelector::OlderThan(secs(age)), None, None) {
                    Ok(r) => tick.recompressed_pages += r.recompressed,
                    Err(e) => note(&mut tick, e),
                }
            }
        }
        if device.backing().is_some() {
            if let Some(age) = config.writeback_idle {
                match device.writeback(PageSelector::OlderThan(secs(age)), None, None) {
                    Ok(r) => {
                        tick.written_back_pages += r.pages;
                        tick.bytes_written += r.bytes_written;
                    }
                    Err(e) => note(&mut tick, e),
                }
            }
            if let Some(target) = config.mem_target {
                meet_target(device, target, config.writeback_idle, &mut tick, &mut note);
            }
        }
        tick.busy_ms = began.elapsed().as_millis() as u64;
        let mut st = shared.state.lock();
        let s = &mut st.stats;
        s.ticks += tick.ticks;
        s.recompressed_pages += tick.recompressed_pages;
        s.written_back_pages += tick.written_back_pages;
        s.target_written_back_pages += tick.target_written_back_pages;
        s.bytes_written += tick.bytes_written;
        s.compactions += tick.compactions;
        s.errors += tick.errors;
        s.busy_ms += tick.busy_ms;
        if tick.last_error.is_some() {
            s.last_error = tick.last_error;
        }
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
