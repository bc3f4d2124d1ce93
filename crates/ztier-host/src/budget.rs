//! The host's budget: a thread that, every interval, keeps the sum of the devices' pools
//! (`mem_used_total`) under the host's target by writing back the coldest pages across all
//! devices, by the rules memory cgroups taught operators:
//! - one idle order for the host: pages idle for 64 s or more on any device go first, then
//!   32 s, and so on down to every page (the kernel's reclaim ages every cgroup's LRU
//!   together), a device with more above its protection asked first at each age;
//! - a device's protection (`mem_low`): none of its pages below it are taken while another
//!   device is above its own; only when every device is at or under its protection (or has
//!   nothing left to give) and the sum is still over the target are they taken too;
//! - a device's own cap (`mem_limit`) and the host's limit are enforced on every write by
//!   the device and the host's memory group, not here.
//!
//! It runs at idle priority, as a device's own policy does, and works through the devices'
//! own batched writeback (a page's lock at a time), so foreground I/O waits for at most a
//! page. Every action is counted ([`BudgetStats`]), each device's pages written back in its
//! `HostDevice`.
//!
//! Locks: `Shared::state` alone, never across device work; the host's table is read once
//! a tick (a list of devices copied out).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use ztier_zram::PageSelector;

use crate::device::HostDevice;

/// What the budget reads of its host: the devices now, and their pools' sum (the host
/// implements it; the budget's thread holds it weakly, so a host that goes ends it).
pub(crate) trait Pools: Send + Sync {
    fn devices(&self) -> Vec<Arc<HostDevice>>;
    fn used_bytes(&self) -> u64;
}

/// What the budget did, since the host started.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct BudgetStats {
    pub ticks: u64,
    /// Ticks that found the sum over the target.
    pub over_target_ticks: u64,
    pub written_back_pages: u64,
    pub bytes_written: u64,
    /// Pages taken from below a device's protection (every device was at or under its own).
    pub protected_pages_taken: u64,
    pub errors: u64,
    pub last_error: Option<String>,
    /// The sum of the pools after the last tick.
    pub used_bytes: u64,
    pub target_bytes: u64,
    pub busy_ms: u64,
}

struct State {
    stop: bool,
    stats: BudgetStats,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// The budget's thread.
pub(crate) struct Budget {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Budget {
    pub(crate) fn start(
        host: Weak<dyn Pools>,
        target: u64,
        interval: Duration,
    ) -> std::io::Result<Budget> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                stop: false,
                stats: BudgetStats {
                    target_bytes: target,
                    ..BudgetStats::default()
                },
            }),
            wake: Condvar::new(),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ztier-budget".into())
            .spawn(move || {
                ztier_base::os::lower_to_idle_priority();
                run(&host, target, interval, &s)
            })?;
        Ok(Budget {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn stats(&self) -> BudgetStats {
        self.shared.state.lock().stats.clone()
    }

    pub(crate) fn stop(mut self) {
        self.end();
    }

    fn end(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            // The last handle of the host may go on the budget's own thread (its tick held
            // one): that thread ends by itself once it sees the stop; it cannot join itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.end();
    }
}

fn run(host: &Weak<dyn Pools>, target: u64, interval: Duration, shared: &Shared) {
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
        let Some(host) = host.upgrade() else {
            return;
        };
        let began = Instant::now();
        let mut tick = BudgetStats {
            ticks: 1,
            ..BudgetStats::default()
        };
        let used = keep_under(&*host, target, &mut tick, &|| shared.state.lock().stop);
        tick.busy_ms = began.elapsed().as_millis() as u64;
        let mut st = shared.state.lock();
        let s = &mut st.stats;
        s.ticks += 1;
        s.over_target_ticks += tick.over_target_ticks;
        s.written_back_pages += tick.written_back_pages;
        s.bytes_written += tick.bytes_written;
        s.protected_pages_taken += tick.protected_pages_taken;
        s.errors += tick.errors;
        s.busy_ms += tick.busy_ms;
        s.used_bytes = used;
        if tick.last_error.is_some() {
            s.last_error = tick.last_error;
        }
    }
}

/// One tick: brings the pools' sum under `target` if it is over; returns the sum after.
pub(crate) fn keep_under(
    host: &dyn Pools,
    target: u64,
    tick: &mut BudgetStats,
    stopping: &dyn Fn() -> bool,
) -> u64 {
    let devices = host.devices();
    for d in &devices {
        d.device().report_to_group();
    }
    let used = || host.used_bytes();
    if used() <= target {
        return used();
    }
    tick.over_target_ticks += 1;
    // Devices whose store took nothing this tick and failed (full, or at the device's
    // `store_limit`): asked no more until the next tick, and counted as having nothing to
    // give, so the protected pages of the others are taken rather than none.
    let mut refused: Vec<&str> = Vec::new();
    // Protected first; then, if every device is at or under its protection and the sum is
    // still over, unprotected.
    for protected in [true, false] {
        if !protected {
            let all_down = devices.iter().all(|d| {
                let mm = d.device().mm_stat();
                mm.mem_used_total <= d.mem_low()
                    || stored_pages(d) == 0
                    || refused.contains(&d.name())
            });
            if !all_down {
                break;
            }
        }
        let mut age = 64u32;
        loop {
            if used() <= target || stopping() {
                return used();
            }
            // The device with the most above its protection first.
            let mut order: Vec<(u64, &Arc<HostDevice>)> = devices
                .iter()
                .filter(|d| d.device().backing().is_some() && !refused.contains(&d.name()))
                .map(|d| {
                    let total = d.device().mm_stat().mem_used_total;
                    let floor = if protected { d.mem_low() } else { 0 };
                    (total.saturating_sub(floor), d)
                })
                .filter(|(room, _)| *room > 0)
                .collect();
            order.sort_by_key(|b| std::cmp::Reverse(b.0));
            for (_, d) in order {
                // Asked again while it gives: what a writeback frees can fall short of the
                // average page's share its `want` was counted by, and the shortfall is this
                // device's to make up from its pages of this age before the next device's
                // (younger, or more protected) pages are taken.
                loop {
                    let over = used().saturating_sub(target);
                    if over == 0 || stopping() {
                        break;
                    }
                    let mm = d.device().mm_stat();
                    let floor = if protected { d.mem_low() } else { 0 };
                    let room = mm.mem_used_total.saturating_sub(floor);
                    let stored = stored_pages(d);
                    if stored == 0 || room == 0 {
                        break;
                    }
                    let per_page = (mm.mem_used_total / stored).max(1);
                    let want = over.min(room).div_ceil(per_page).max(1);
                    let gave =
                        match d
                            .device()
                            .writeback(PageSelector::OlderThan(age), None, Some(want))
                        {
                            Ok(r) if r.pages == 0 && r.failed_pages > 0 => {
                                tick.errors += 1;
                                tick.last_error = Some(format!(
                                    "{}: its store took none of {} pages",
                                    d.name(),
                                    r.failed_pages
                                ));
                                refused.push(d.name());
                                0
                            }
                            Ok(r) => {
                                tick.written_back_pages += r.pages;
                                tick.bytes_written += r.bytes_written;
                                if !protected {
                                    tick.protected_pages_taken += r.pages;
                                }
                                d.budget_pages.fetch_add(r.pages, Ordering::Relaxed);
                                if r.pages > 0 {
                                    d.device().compact();
                                }
                                r.pages
                            }
                            Err(e) => {
                                tick.errors += 1;
                                tick.last_error = Some(format!("{}: {e}", d.name()));
                                refused.push(d.name());
                                0
                            }
                        };
                    d.device().report_to_group();
                    if gave == 0 {
                        break;
                    }
                }
            }
            if age == 0 {
                break;
            }
            age /= 2;
        }
    }
    used()
}

/// Pages the device holds in its pool (not same-filled, not on its store).
fn stored_pages(d: &HostDevice) -> u64 {
    let mm = d.device().mm_stat();
    let ps = d.device().page_size() as u64;
    let on_store = d.device().bd_stat().map_or(0, |b| b.bd_count);
    (mm.orig_data_size / ps)
        .saturating_sub(mm.same_pages)
        .saturating_sub(on_store)
}
