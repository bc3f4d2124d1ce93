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
//! Every device is replayed at once, on a thread of its own, against one start: they see
//! the same hour. An epoch is begun at its recorded time after the first; one begun late
//! (the machine busy) is counted in the run's [`Pace`], and the next ones are not hurried:
//! the capture's times stand. Against [`crate::far_tier`]'s replay in the capture's own
//! time, this one is as a server meets it: the policy passes when its clock says, beside
//! the requests.
//!
//! Invariants: each device is as large as the most pages the trace holds at once; every
//! present page reads back through the device as its last content at the end of each run,
//! after the figures are taken (its reads then are not promotions).

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;
use ztier_blockdev::BlockDevice;
use ztier_corpus::trace::Trace;
use ztier_zram::{PolicyStats, PromotionTarget};

use crate::far_tier::{AgeChoice, FarTierRun, FarTierVerdict, Tally};
use crate::trace::{trace_pages, BlockSpace, CorpusPages, SwappedPages};
use crate::{ReplayError, Result};

/// An epoch begun this much after its recorded time is late.
pub const LATE: Duration = Duration::from_secs(1);

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

/// How far a run fell behind the capture's pace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Pace {
    /// The latest an epoch was begun after its recorded time.
    pub max_lag_secs: f64,
    pub mean_lag_secs: f64,
    /// Epochs begun [`LATE`] or more after their time.
    pub late_epochs: u64,
}

/// The pages a device needs to replay `trace` over `corpus` (the most present at once):
/// the size to make each served device.
pub fn device_pages(trace: &Trace, corpus: &CorpusPages<'_>) -> Result<u64> {
    trace_pages(trace, corpus)
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
    let pages = trace_pages(trace, corpus)?;
    // Every thread's first epoch waits for this, so none has a head start from the others'
    // setup (each opens its own reader of the corpus).
    let start = Instant::now() + Duration::from_millis(200);
    let runs: Vec<Result<FarTierRun>> = thread::scope(|scope| {
        let handles: Vec<_> = devices
            .iter()
            .map(|d| scope.spawn(move || replay_one(corpus, trace, target, d, pages, start)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a paced replay thread panicked"))
            .collect()
    });
    let (mut fixed, mut controller) = (Vec::new(), None);
    for run in runs {
        let run = run?;
        match run.age {
            AgeChoice::Controller => controller = Some(run),
            AgeChoice::Fixed { .. } => fixed.push(run),
        }
    }
    let controller = controller.expect("exactly one controller, checked above");
    Ok(FarTierVerdict::of(corpus.name(), target, fixed, controller))
}

/// One device's run over the whole trace.
fn replay_one(
    corpus: &CorpusPages<'_>,
    trace: &Trace,
    target: PromotionTarget,
    device: &PacedDevice<'_>,
    pages: u64,
    start: Instant,
) -> Result<FarTierRun> {
    let space = BlockSpace(&*device.device);
    let mut swapped = SwappedPages::new(&space, corpus.open()?, pages);
    let first = trace.epochs.first().map_or(0, |e| e.millis);
    let began = (device.figures)();
    let mut tally = Tally::default();
    let mut pace = Pace::default();
    let mut lag_sum = 0f64;
    let (mut store_reads, mut ticks) = (began.store_reads, 0u64);
    let mut ages = Vec::new();
    let mut last = began;
    for (n, epoch) in trace.epochs.iter().enumerate() {
        let at = Duration::from_millis(epoch.millis.saturating_sub(first));
        let due = start + at;
        let now = Instant::now();
        if now < due {
            thread::sleep(due - now);
        }
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
