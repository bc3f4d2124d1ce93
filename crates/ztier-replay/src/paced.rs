//! The far tier judged as a host serves it: a capture over time replayed at its recorded
//! pace, in real time, through devices a server exports (an NBD export each, its client as a
//! [`BlockDevice`]), each device's own policy writing back on the server's clock at a fixed
//! idle age or at the age its promotion controller chooses. The replay is the swapping
//! process [`crate::trace`] plays (a page that appears written, one that changed read and
//! written again, one that went discarded); what it cannot see from the client, the pages
//! on the store and those read from it, it reads from the server's figures after each
//! epoch ([`ServedFigures`]). A promotion is a page read from the store (`bd_reads`, one a
//! page in the kernel's formats).
//!
//! Every device is replayed at once, on a thread of its own, against one start taken once
//! every thread is ready: they see the same hour. An epoch is begun at its recorded time
//! after the first, never before; one begun late (the machine busy) is counted in the run's
//! [`Pace`], and those after it follow as soon as they can until the replay is back on the
//! capture's times. Against [`crate::far_tier`]'s replay in the capture's own time, this
//! one is as a server meets it: the policy passes when its clock says, beside the
//! requests. A device's replay that fails stops the others at their next epoch (or within
//! [`WAKE`] of their sleep), and the first error is returned.
//!
//! Invariants: each device is at least as large as the most pages the trace holds at once
//! (checked before anything runs); every present page reads back through the device as its
//! last content at the end of each run, after the figures are taken (its reads then are not
//! promotions).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use ztier_blockdev::BlockDevice;
use ztier_corpus::trace::Trace;
use ztier_corpus::CORPUS_PAGE;
use ztier_zram::{PolicyStats, PromotionTarget};

use crate::far_tier::{AgeChoice, FarTierRun, FarTierVerdict, Pace, Tally};
use crate::trace::{trace_pages, BlockSpace, CorpusPages, SwappedPages};
use crate::{ReplayError, Result};

/// An epoch begun this much after its recorded time is late ([`Pace::late_epochs`]).
pub const LATE: Duration = Duration::from_secs(1);

/// The longest a replay sleeps before it looks whether another device's replay failed.
pub const WAKE: Duration = Duration::from_millis(100);

/// One served device to replay the trace through.
pub struct PacedDevice<'a> {
    pub age: AgeChoice,
    /// The device as its client reaches it.
    pub device: Arc<dyn BlockDevice>,
    /// The server's figures for the device, read after each epoch.
    pub figures: Box<dyn Fn() -> ServedFigures + Send + Sync + 'a>,
}

/// What the server says of a device.
#[derive(Debug, Clone, Default)]
pub struct ServedFigures {
    /// Pages held on the store now (`bd_count`).
    pub stored_pages: u64,
    /// Reads from the store so far (`bd_reads`).
    pub store_reads: u64,
    /// The device's policy's counters (with its promotion controller's figures).
    pub policy: Option<PolicyStats>,
}

/// Replays `trace` through every device at once, at its recorded pace, and judges the
/// controller's run (the one device whose age is [`AgeChoice::Controller`]) against the
/// best fixed age that meets `target`.
pub fn judge_paced(
    corpus: &CorpusPages<'_>,
    trace: &Trace,
    target: PromotionTarget,
    devices: Vec<PacedDevice<'_>>,
) -> Result<FarTierVerdict> {
    let controllers = devices
        .iter()
        .filter(|d| d.age == AgeChoice::Controller)
        .count();
    if controllers != 1 {
        return Err(ReplayError::ControllerCount { controllers });
    }
    let pages = trace_pages(trace, corpus, CORPUS_PAGE)?;
    let need = pages * CORPUS_PAGE as u64;
    if let Some(small) = devices.iter().find(|d| d.device.size() < need) {
        return Err(ReplayError::ServedTooSmall {
            bytes: small.device.size(),
            need,
        });
    }
    let race = Race {
        ready: Barrier::new(devices.len()),
        start: OnceLock::new(),
        failed: AtomicBool::new(false),
    };
    let runs: Vec<Result<FarTierRun>> = thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .map(|d| {
                let race = &race;
                scope.spawn(move || {
                    let run = replay_one(corpus, trace, target, d, pages, race);
                    if run.is_err() {
                        race.failed.store(true, Ordering::Relaxed);
                    }
                    run
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a paced replay thread panicked"))
            .collect()
    });
    let (mut fixed, mut controller) = (Vec::new(), None);
    // The first error, not the others' `Stopped` that it caused.
    let mut stopped = false;
    let mut first_error = None;
    for run in runs {
        match run {
            Ok(run) if run.age == AgeChoice::Controller => controller = Some(run),
            Ok(run) => fixed.push(run),
            Err(ReplayError::PacedStopped) => stopped = true,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if stopped {
        return Err(ReplayError::PacedStopped);
    }
    let controller = controller.expect("exactly one controller, checked above");
    Ok(FarTierVerdict::of(corpus.name(), target, fixed, controller))
}

/// What the replays of one judgement share: the wait until all are ready, the start they
/// take together, and whether one failed.
struct Race {
    ready: Barrier,
    start: OnceLock<Instant>,
    failed: AtomicBool,
}

impl Race {
    /// Waits with the others until every replay is ready; the start, the same for all.
    fn start_together(&self) -> Instant {
        let leader = self.ready.wait().is_leader();
        if leader {
            let _ = self.start.set(Instant::now());
        }
        // Every thread passes the second wait after the leader set the start.
        self.ready.wait();
        *self
            .start
            .get()
            .expect("set by the leader before the second wait")
    }

    /// Sleeps until `due`, waking every [`WAKE`] to see whether another replay failed.
    fn sleep_until(&self, due: Instant) -> Result<()> {
        loop {
            if self.failed.load(Ordering::Relaxed) {
                return Err(ReplayError::PacedStopped);
            }
            let now = Instant::now();
            if now >= due {
                return Ok(());
            }
            thread::sleep((due - now).min(WAKE));
        }
    }
}

/// One device's run over the whole trace.
fn replay_one(
    corpus: &CorpusPages<'_>,
    trace: &Trace,
    target: PromotionTarget,
    device: &PacedDevice<'_>,
    pages: u64,
    race: &Race,
) -> Result<FarTierRun> {
    let space = BlockSpace(&*device.device);
    // Opened before the start, so a corpus's opening is no epoch's lag; a thread that
    // cannot open it still reaches the start, or the others would wait for it for ever.
    let source = corpus.open();
    let began = (device.figures)();
    let start = race.start_together();
    let mut swapped = SwappedPages::new(&space, source?, pages);
    let first = trace.epochs.first().map_or(0, |e| e.millis);
    let mut tally = Tally::default();
    let mut pace = Pace::default();
    let mut lag_sum = 0f64;
    let mut store_reads = began.store_reads;
    let mut ticks = began.policy.as_ref().map_or(0, |p| p.ticks);
    let mut ages = Vec::new();
    let mut last = began;
    for (n, epoch) in trace.epochs.iter().enumerate() {
        let at = Duration::from_millis(epoch.millis.saturating_sub(first));
        let due = start + at;
        race.sleep_until(due)?;
        let lag = Instant::now().saturating_duration_since(due);
        lag_sum += lag.as_secs_f64();
        pace.max_lag_secs = pace.max_lag_secs.max(lag.as_secs_f64());
        pace.late_epochs += u64::from(lag >= LATE);
        swapped.apply(n, epoch)?;
        let figures = (device.figures)();
        let promoted = figures.store_reads.saturating_sub(store_reads);
        store_reads = figures.store_reads;
        tally.epoch(at, promoted, figures.stored_pages);
        if let Some(policy) = &figures.policy {
            if let Some(e) = &policy.last_error {
                return Err(ReplayError::Policy(e.clone()));
            }
            if device.age == AgeChoice::Controller && policy.ticks != ticks {
                ticks = policy.ticks;
                ages.push(policy.promotion.as_ref().map_or(0, |p| p.age_secs));
            }
        }
        last = figures;
    }
    swapped.verify()?;
    let written_back = last.policy.as_ref().map_or(0, |p| p.written_back_pages);
    let mut run = tally.finish(trace, device.age, target, written_back);
    run.controller = last.policy.and_then(|p| p.promotion);
    run.ages_secs = ages;
    pace.mean_lag_secs = lag_sum / trace.epochs.len().max(1) as f64;
    run.pace = Some(pace);
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ztier_blockdev::memory::MemoryDevice;
    use ztier_blockdev::testing::Faulty;
    use ztier_corpus::trace::{Epoch, PageWrite};

    fn device<'a>(age: AgeChoice, device: Arc<dyn BlockDevice>) -> PacedDevice<'a> {
        PacedDevice {
            age,
            device,
            figures: Box::new(ServedFigures::default),
        }
    }

    /// One device's failure ends the judgement at once with its error, though the trace's
    /// next epoch is an hour away (without the stop, the other replay would sleep until
    /// then, and the test with it); a judgement without exactly one controller, or with a
    /// device too small for the trace, is refused before anything runs.
    #[test]
    fn a_failing_device_stops_the_others_and_bad_judgements_are_refused() {
        let dir = std::env::temp_dir().join(format!("ztier-paced-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let epochs = [
            Epoch {
                appeared: (0..4u64)
                    .map(|vpn| PageWrite {
                        vpn,
                        corpus_page: vpn as u32,
                    })
                    .collect(),
                ..Epoch::default()
            },
            Epoch {
                millis: 3_600_000,
                unchanged: 4,
                ..Epoch::default()
            },
        ];
        let (corpus, trace) = crate::test_traces::written(&dir.join("paced.pages"), 4, &epochs);
        let pages = CorpusPages::Whole(&corpus);
        let target = PromotionTarget::new(0.002);
        let disk = |pages: u64| -> Arc<dyn BlockDevice> {
            Arc::new(MemoryDevice::new(pages * CORPUS_PAGE as u64).unwrap())
        };
        let fixed = AgeChoice::Fixed { age_secs: 60 };
        // A disk whose writes all fail: a store gone, or a server that went away.
        let refusing = Arc::new(Faulty::new(MemoryDevice::new(4 * 4096).unwrap()));
        refusing.set_failing(true, false);
        let err = judge_paced(
            &pages,
            &trace,
            target,
            vec![
                device(AgeChoice::Controller, disk(4)),
                device(fixed, refusing),
            ],
        )
        .unwrap_err();
        assert!(err.to_string().contains("failed the write"), "{err}");
        let err = judge_paced(&pages, &trace, target, vec![device(fixed, disk(4))]).unwrap_err();
        assert!(
            matches!(err, ReplayError::ControllerCount { controllers: 0 }),
            "{err}"
        );
        let err = judge_paced(
            &pages,
            &trace,
            target,
            vec![device(AgeChoice::Controller, disk(3))],
        )
        .unwrap_err();
        assert!(matches!(err, ReplayError::ServedTooSmall { .. }), "{err}");
        assert_eq!(
            trace_pages(&trace, &pages, 16384).unwrap_err().to_string(),
            ReplayError::TracePageSize { page_size: 16384 }.to_string()
        );
        assert_eq!(trace_pages(&trace, &pages, CORPUS_PAGE).unwrap(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
