//! The host budget's run, shared by `tests/budget_run.rs` (short, asserted) and
//! `examples/host_figures.rs` (long, drawn): a host with a target and its budget's thread
//! running, four devices written by four threads with skewed working sets:
//! - `cold`: large; its writer writes it once over a wide range at the start, then leaves
//!   it idle;
//! - `hot0`, `hot1`: small; each writer rewrites the next pages of its working set (round
//!   it, so each page is rewritten every few steps) and adds a few new pages to it at each
//!   step, up to a most;
//! - `low`: small and under its protection (`mem_low`); its writer rewrites and reads its
//!   working set, which never grows.
//!
//! The cold device is written first; the others begin once it is and the budget has looked
//! at it once (a host's guests getting busy after one of them has filled its disk). They
//! take one step per budget tick: each waits for the budget's tick counter to
//! move before its next step. So the pools gain at most one step each between two looks of
//! the budget, whatever the machine's load. The budget runs at idle priority, and on a busy
//! shared machine its thread can be held off for a while; that must not become more writes
//! between two of its looks, which no budget acting once an interval could answer for (the
//! host's limit is what bounds a write burst, not its target).
//!
//! A sampler reads the pools' sum (`MemoryGroup::used_bytes`, as each device last reported
//! it) and each device's `mem_used_total` every `sample_every`.
//!
//! Invariants: a page's contents are a function of (device, page, version), and each writer
//! records the version it wrote before its next step, so every page is checked at the end.
//! Locks: `samples` (the sampler's, taken to mark where the run settled and to take them at
//! the end); each writer's versions are its own until it is joined.

// Each user takes what it needs of this module.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ztier_base::rng::Rng;
use ztier_host::{BudgetStats, DeviceSpec, Host, HostConfig, HostDevice};

/// Fills a page with the contents for a seed: the same seed, the same bytes.
pub type PageSource<'a> = &'a (dyn Fn(u64, &mut [u8]) + Sync);

/// The run's shape.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The host's target (bytes of the pools' sum).
    pub target: u64,
    /// The budget's interval.
    pub interval: Duration,
    /// The cold device's size (bytes) and the pages written to it once, spread evenly over
    /// the device.
    pub cold_size: u64,
    pub cold_pages: u64,
    /// Each hot device's size, working set at the start and at most, pages added to it at
    /// each step, and random pages of it rewritten at each step.
    pub hot_size: u64,
    pub hot_start_pages: u64,
    pub hot_most_pages: u64,
    pub hot_grow_pages: u64,
    pub rewrite_pages: u64,
    /// Pages of its working set each writer reads back (and checks) at each step.
    pub read_pages: u64,
    /// The protected device's working set and its protection (`mem_low`).
    pub low_pages: u64,
    pub low_protection: u64,
    /// Budget ticks the run goes on for once it has settled.
    pub run_ticks: u64,
    pub sample_every: Duration,
}

/// One look at the pools.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Since the run began (for a plot's axis; nothing is asserted on it).
    pub seconds: f64,
    /// The budget's ticks so far.
    pub tick: u64,
    /// The pools' sum as the host's memory group holds it.
    pub sum: u64,
    /// Each device's `mem_used_total`, in [`Outcome::names`]' order.
    pub devices: Vec<u64>,
    /// Each device's pages the budget has written back so far.
    pub written_back: Vec<u64>,
}

/// What a device went through.
#[derive(Debug, Clone)]
pub struct DeviceOutcome {
    pub name: String,
    pub pages_written: u64,
    pub budget_written_back_pages: u64,
    pub bd_reads: u64,
    pub bd_writes: u64,
    /// Pages on the store at the end.
    pub bd_count: u64,
    pub mem_used_total: u64,
    pub mem_low: u64,
    /// Pages read back different from what was written (during the run and at the end).
    pub wrong_pages: u64,
    /// Reads and writes that failed.
    pub failed_io: u64,
}

/// What the run gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub names: Vec<String>,
    /// Every sample, from the start.
    pub samples: Vec<Sample>,
    /// The first sample taken once the run had settled: the cold device written and two
    /// of the budget's ticks over the target since.
    pub settled_at: usize,
    pub devices: Vec<DeviceOutcome>,
    pub budget: BudgetStats,
}

impl Outcome {
    pub fn device(&self, name: &str) -> &DeviceOutcome {
        self.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no device {name}"))
    }

    /// The samples taken once the run had settled.
    pub fn settled(&self) -> &[Sample] {
        &self.samples[self.settled_at..]
    }
}

/// Per device, what its writer keeps: the version of each page (0: never written).
struct Written {
    id: u64,
    versions: Vec<u32>,
}

impl Written {
    fn seed(&self, page: u64) -> u64 {
        let version = u64::from(self.versions[page as usize]);
        // A different seed for every (device, page, version).
        Rng::new((self.id << 56) ^ (page << 20) ^ version).next_u64()
    }
}

/// Counters a writer shares with the end of the run.
#[derive(Default)]
struct IoCounts {
    written: AtomicU64,
    wrong: AtomicU64,
    failed: AtomicU64,
}

const PAGE: usize = 4096;

fn write_page(d: &HostDevice, w: &mut Written, page: u64, source: PageSource, io: &IoCounts) {
    let mut buf = vec![0u8; PAGE];
    w.versions[page as usize] += 1;
    source(w.seed(page), &mut buf);
    match d.block_device().write_at(page * PAGE as u64, &buf, false) {
        Ok(()) => {
            io.written.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            eprintln!("{}: writing page {page}: {e}", d.name());
            io.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn check_page(d: &HostDevice, w: &Written, page: u64, source: PageSource, io: &IoCounts) {
    let (mut want, mut got) = (vec![0u8; PAGE], vec![0u8; PAGE]);
    source(w.seed(page), &mut want);
    match d.block_device().read_at(page * PAGE as u64, &mut got) {
        Ok(()) if got == want => {}
        Ok(()) => {
            io.wrong.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            eprintln!("{}: reading page {page}: {e}", d.name());
            io.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Waits for the budget's tick counter to pass `seen`; returns it, or `None` once stopped.
fn next_tick(host: &Host, seen: u64, stop: &AtomicBool) -> Option<u64> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let ticks = host.budget_stats().map_or(0, |s| s.ticks);
        if ticks > seen {
            return Some(ticks);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A store directory of its own.
fn store_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "ztier-host-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

/// Runs the scenario with pages from `source`.
pub fn run(s: &Scenario, source: PageSource) -> Outcome {
    let stores = store_dir("budget-run");
    let host = Host::new(HostConfig {
        target: Some(s.target),
        interval: Some(s.interval),
        store_dir: Some(stores.clone()),
        ..HostConfig::default()
    })
    .expect("a host");
    let spec = |text: String| -> DeviceSpec { text.parse().expect("a spec") };
    let cold = host
        .create(spec(format!("cold,size={}", s.cold_size)))
        .expect("cold");
    let hot: Vec<Arc<HostDevice>> = (0..2)
        .map(|i| {
            host.create(spec(format!("hot{i},size={}", s.hot_size)))
                .expect("hot")
        })
        .collect();
    let low = host
        .create(spec(format!(
            "low,size={},mem_low={}",
            s.hot_size, s.low_protection
        )))
        .expect("low");
    let devices: Vec<Arc<HostDevice>> = [&cold, &hot[0], &hot[1], &low]
        .into_iter()
        .map(Arc::clone)
        .collect();
    let names: Vec<String> = devices.iter().map(|d| d.name().to_string()).collect();
    let io: Vec<IoCounts> = devices.iter().map(|_| IoCounts::default()).collect();
    let began = Instant::now();
    let samples: Mutex<Vec<Sample>> = Mutex::new(Vec::new());
    let stop_writers = AtomicBool::new(false);
    let stop_sampler = AtomicBool::new(false);
    let cold_written = AtomicBool::new(false);
    let settled_at = Mutex::new(None);

    let cold_stride = (cold.device().pages() / s.cold_pages.max(1)).max(1);
    let written: Vec<Written> = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop_sampler.load(Ordering::Relaxed) {
                let sample = Sample {
                    seconds: began.elapsed().as_secs_f64(),
                    tick: host.budget_stats().map_or(0, |b| b.ticks),
                    sum: host.group().used_bytes(),
                    devices: devices
                        .iter()
                        .map(|d| d.device().mm_stat().mem_used_total)
                        .collect(),
                    written_back: devices
                        .iter()
                        .map(|d| d.budget_written_back_pages())
                        .collect(),
                };
                samples.lock().expect("samples").push(sample);
                std::thread::sleep(s.sample_every);
            }
        });
        // The cold device: written once over its whole range, then idle.
        let cold_writer = scope.spawn(|| {
            let mut w = Written {
                id: 0,
                versions: vec![0; cold.device().pages() as usize],
            };
            for i in 0..s.cold_pages {
                write_page(&cold, &mut w, i * cold_stride, source, &io[0]);
            }
            cold_written.store(true, Ordering::SeqCst);
            w
        });
        // The hot ones and the protected one: a step per tick.
        let mut stepping = Vec::new();
        for (n, d) in devices.iter().enumerate().skip(1) {
            let (host, stop, io) = (&host, &stop_writers, &io[n]);
            let is_low = d.name() == "low";
            let cold_written = &cold_written;
            stepping.push(scope.spawn(move || {
                // The guests get busy once the cold one is written and the budget has
                // looked at it once.
                while !cold_written.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                let at_fill = host.budget_stats().map_or(0, |b| b.ticks);
                next_tick(host, at_fill, stop)?;
                let mut w = Written {
                    id: n as u64,
                    versions: vec![0; d.device().pages() as usize],
                };
                let mut rng = Rng::new(n as u64);
                let (start, most, grow) = if is_low {
                    (s.low_pages, s.low_pages, 0)
                } else {
                    (s.hot_start_pages, s.hot_most_pages, s.hot_grow_pages)
                };
                for page in 0..start {
                    write_page(d, &mut w, page, source, io);
                }
                let mut working = start;
                let mut next_rewrite = 0;
                let mut seen = 0;
                while let Some(tick) = next_tick(host, seen, stop) {
                    seen = tick;
                    // Round the working set: every page of it rewritten within
                    // working / rewrite_pages steps.
                    for _ in 0..s.rewrite_pages.min(working) {
                        write_page(d, &mut w, next_rewrite % working, source, io);
                        next_rewrite = (next_rewrite + 1) % working;
                    }
                    let grown = (working + grow).min(most);
                    for page in working..grown {
                        write_page(d, &mut w, page, source, io);
                    }
                    working = grown;
                    for _ in 0..s.read_pages {
                        check_page(d, &w, rng.below(working), source, io);
                    }
                }
                Some(w)
            }));
        }
        // Settled: the cold device written, then two ticks over the target.
        while !cold_written.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let over_at_fill = host.budget_stats().map_or(0, |b| b.over_target_ticks);
        loop {
            let b = host.budget_stats().unwrap_or_default();
            if b.over_target_ticks >= over_at_fill + 2 {
                *settled_at.lock().expect("settled") =
                    Some((samples.lock().expect("samples").len(), b.ticks));
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (_, settle_tick) = settled_at.lock().expect("settled").expect("set");
        while host.budget_stats().map_or(0, |b| b.ticks) < settle_tick + s.run_ticks {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop_writers.store(true, Ordering::SeqCst);
        let mut written = vec![cold_writer.join().expect("the cold writer")];
        for h in stepping {
            written.push(h.join().expect("a writer").expect("a writer that began"));
        }
        stop_sampler.store(true, Ordering::SeqCst);
        written
    });
    // Every page read back, from wherever it is now.
    for ((d, w), io) in devices.iter().zip(&written).zip(&io) {
        for page in 0..w.versions.len() as u64 {
            if w.versions[page as usize] > 0 {
                check_page(d, w, page, source, io);
            }
        }
    }
    let budget = host.budget_stats().expect("a budget");
    let outcome_devices = devices
        .iter()
        .zip(&io)
        .map(|(d, io)| {
            let bd = d.device().bd_stat().unwrap_or_default();
            DeviceOutcome {
                name: d.name().to_string(),
                pages_written: io.written.load(Ordering::Relaxed),
                budget_written_back_pages: d.budget_written_back_pages(),
                bd_reads: bd.bd_reads,
                bd_writes: bd.bd_writes,
                bd_count: bd.bd_count,
                mem_used_total: d.device().mm_stat().mem_used_total,
                mem_low: d.spec().mem_low,
                wrong_pages: io.wrong.load(Ordering::Relaxed),
                failed_io: io.failed.load(Ordering::Relaxed),
            }
        })
        .collect();
    drop(devices);
    drop((cold, hot, low));
    host.stop_and_save();
    drop(host);
    let _ = std::fs::remove_dir_all(&stores);
    let (settled_at, _) = settled_at.into_inner().expect("settled").expect("set");
    Outcome {
        names,
        samples: samples.into_inner().expect("samples"),
        settled_at,
        devices: outcome_devices,
        budget,
    }
}

/// Page contents made of the pattern: the first part of the page (1 KiB to all of it, by the
/// seed) the seed's pattern, the rest zeros, so pages compress to about that part and the
/// working sets' sizes vary as pages are rewritten.
pub fn patterned_page(seed: u64, out: &mut [u8]) {
    let filled = 1024 + (seed % (out.len() as u64 - 1024 + 1)) as usize;
    Rng::new(seed).fill(&mut out[..filled]);
    out[filled..].fill(0);
}
