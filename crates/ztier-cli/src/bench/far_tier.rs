//! `ztier bench --trace --promotion-target 0.2%/min`: the far tier judged on each corpus's
//! capture over time (`ztier_replay::far_tier`): the trace at its recorded pace through
//! zram with a store in memory, the device's policy writing back at each fixed idle age of
//! `--fixed-ages` and then at the age the promotion controller chooses; a table of the
//! runs, the best fixed age meeting the target (chosen with hindsight) and the verdict.
//! With `--through-nbd`, the same in real time through a host of devices served over NBD,
//! their stores files in `--store-dir` (`ztier_replay::paced`; the wiring in [`served`]).
//! Flags in, the table out; a verdict short of the goal is reported, not an error.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use ztier_replay::far_tier::{
    AgeChoice, FarTierReplay, FarTierRun, FarTierVerdict, GOAL_OF_ORACLE,
};
use ztier_zram::promotion::{parse_percent_per_minute, PromotionTarget};

use super::shared::ReplayArgs;
use super::shared::{emit, read_trace};

/// The far tier's flags (with `--trace`).
#[derive(Args, Debug, Clone)]
pub struct FarTierArgs {
    /// With --trace: judge the far tier instead: the device's policy writing back at each of
    /// --fixed-ages, then at the idle age that keeps reads from the store under this percent
    /// of the pages on it per minute (Google's far memory uses 0.2%/min, of its working
    /// set), against the best fixed age in hindsight. Written back to a store in memory (with
    /// --through-nbd, a file in --store-dir), a page to a block (the kernel's format: one
    /// read from the store per page promoted, as the target counts).
    #[arg(long, value_name = "PERCENT%/min", requires = "trace",
          value_parser = |s: &str| parse_percent_per_minute(s).map_err(|e| e.to_string()))]
    pub promotion_target: Option<f64>,
    /// The fixed idle ages the best is chosen from.
    #[arg(long, value_delimiter = ',', value_name = "AGE,AGE,...",
          value_parser = crate::size::parse_positive_duration, requires = "promotion_target",
          default_value = "10s,20s,30s,45s,60s,90s,120s,180s,240s,300s,420s,600s")]
    pub fixed_ages: Vec<Duration>,
    /// The policy's interval, in the capture's time.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "10s",
          requires = "promotion_target")]
    pub policy_interval: Duration,
    /// Judge as a host serves it: the trace replayed in real time, at its recorded pace (as
    /// long as the capture took), through a host of devices exported over NBD on a unix
    /// socket, one device per fixed age and one with the controller, all at once, each
    /// device's policy passing on the server's clock; its stores in --store-dir. Every
    /// device is a pool of its own, and each reads the corpus on its own (a corpus past
    /// --max-corpus: one epoch's pages held per device).
    #[arg(long, requires = "promotion_target")]
    pub through_nbd: bool,
    /// With --through-nbd: the directory (it must exist) in which a directory of the run's
    /// own is made for the devices' stores and the socket, and removed at the end. Default:
    /// the temporary directory.
    #[arg(long, value_name = "DIR", requires = "through_nbd")]
    pub store_dir: Option<PathBuf>,
}

/// Every corpus's trace judged; each verdict printed (or a JSON line each).
/// `allocator`, `layout` and `compressor` are the bench's first of each; `replay` its
/// corpus and output flags.
pub fn run(
    far: &FarTierArgs,
    replay_args: &ReplayArgs,
    allocator: ztier_pool::AllocatorKind,
    percent: f64,
    paths: &[PathBuf],
    layout: ztier_pool::ZsConfig,
    plot: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let replay = FarTierReplay {
        allocator,
        layout,
        algorithm: replay_args.compressors[0].clone(),
        format: ztier_zram::WbFormat::Page,
        interval: far.policy_interval,
        fixed_ages: far.fixed_ages.clone(),
        target: PromotionTarget::new(percent / 100.0),
    };
    let mut verdicts = Vec::new();
    for path in paths {
        let trace = read_trace(path)?;
        let corpus = replay_args.trace_corpus(path, &trace)?;
        let verdict = if far.through_nbd {
            served::judge(&replay, far, &corpus.pages(), &trace, percent)?
        } else {
            replay.judge_over(&corpus.pages(), &trace)?
        };
        emit(replay_args.json, &verdict, print_verdict)?;
        verdicts.push(serde_json::to_value(&verdict)?);
    }
    if let Some(svg) = plot {
        crate::plot::render(&verdicts, svg)?;
    }
    Ok(())
}

fn print_verdict(v: &FarTierVerdict) {
    println!(
        "{}: far tier by promotion rate, target {} %/min of the stored pages",
        v.corpus,
        v.target_share_per_minute * 100.0
    );
    println!(
        "  {:<12} {:>10} {:>12} {:>12} {:>12} {:>12} {:>6}",
        "age", "promoted", "%/min", "worst min %", "mean stored", "written back", "meets"
    );
    for r in v.fixed.iter().chain([&v.controller]) {
        print_run(r);
    }
    if let Some(c) = &v.controller.controller {
        let ages = &v.controller.ages_secs;
        let predicted = c
            .predicted_share_per_minute
            .map_or("none known safe".to_string(), |p| {
                format!("{:.4} %/min", p * 100.0)
            });
        println!(
            "  controller: age {} s at the end (predicted there: {predicted}), from {} s to {} s \
             over the run; decisions {} older, {} younger, {} holding",
            c.age_secs,
            ages.iter().min().unwrap_or(&0),
            ages.iter().max().unwrap_or(&0),
            c.older,
            c.younger,
            c.holding
        );
    }
    match (&v.oracle, v.of_oracle) {
        (Some(o), Some(share)) => println!(
            "  oracle (best fixed age meeting the target): {}; the controller holds {:.1} % of \
             its pages on the store; goal (target met, >= {:.0} %): {}",
            label(o),
            share * 100.0,
            GOAL_OF_ORACLE * 100.0,
            if v.goal_met { "met" } else { "NOT met" }
        ),
        _ => println!(
            "  no fixed age meets the target; the controller {}",
            if v.goal_met {
                "does"
            } else {
                "does NOT either"
            }
        ),
    }
}

fn label(r: &FarTierRun) -> String {
    match r.age {
        AgeChoice::Fixed { age_secs } => format!("{age_secs} s"),
        AgeChoice::Controller => "controller".to_string(),
    }
}

fn print_run(r: &FarTierRun) {
    println!(
        "  {:<12} {:>10} {:>12.4} {:>12.4} {:>12.0} {:>12} {:>6}{}",
        label(r),
        r.promotions,
        r.share_per_minute * 100.0,
        r.worst_minute_share * 100.0,
        r.mean_stored_pages,
        r.written_back_pages,
        if r.meets_target { "yes" } else { "no" },
        r.pace.map_or(String::new(), |p| format!(
            "  (behind the pace: {:.2} s at most, {:.3} s mean, {} epochs late)",
            p.max_lag_secs, p.mean_lag_secs, p.late_epochs
        ))
    );
}

/// `--through-nbd`: the host, its NBD server and a client per device, wired for
/// `ztier_replay::paced`.
mod served {
    use std::os::unix::net::UnixListener;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use anyhow::Context;
    use ztier_corpus::trace::Trace;
    use ztier_corpus::CORPUS_PAGE;
    use ztier_host::{DeviceSpec, Host, HostConfig};
    use ztier_nbd::client::Target;
    use ztier_nbd::{Client, Export, ExportTable, Listener, Server, ServerConfig, Uri};
    use ztier_replay::far_tier::{AgeChoice, FarTierReplay, FarTierVerdict};
    use ztier_replay::paced::{self, PacedDevice, ServedFigures};
    use ztier_replay::trace::{trace_pages, CorpusPages};

    use super::FarTierArgs;

    /// The directory made for the run, removed at its end whatever happened.
    struct RunDir(PathBuf);

    impl Drop for RunDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Every fixed age and the controller, each a device of one host served over NBD,
    /// replayed at once at the trace's pace.
    pub(super) fn judge(
        replay: &FarTierReplay,
        far: &FarTierArgs,
        corpus: &CorpusPages<'_>,
        trace: &Trace,
        percent: f64,
    ) -> anyhow::Result<FarTierVerdict> {
        let mut ages: Vec<(String, AgeChoice)> = Vec::new();
        for age in &replay.fixed_ages {
            let name = format!("age-{}s", age.as_secs());
            if ages.iter().any(|(n, _)| *n == name) {
                anyhow::bail!(
                    "--fixed-ages: {} s given twice (ages are whole seconds)",
                    age.as_secs()
                );
            }
            ages.push((name, AgeChoice::of(Some(*age))));
        }
        ages.push(("controller".to_string(), AgeChoice::Controller));
        let base = far.store_dir.clone().unwrap_or_else(std::env::temp_dir);
        if !base.is_dir() {
            anyhow::bail!("--store-dir {}: no such directory", base.display());
        }
        let dir = base.join(format!("ztier-far-tier-{}", std::process::id()));
        std::fs::create_dir(&dir)
            .with_context(|| format!("--store-dir: making {}", dir.display()))?;
        let dir = RunDir(dir);
        let host = Host::new(HostConfig {
            interval: Some(far.policy_interval),
            store_dir: Some(dir.0.clone()),
            ..HostConfig::default()
        })?;
        let size = trace_pages(trace, corpus, replay.layout.page_size)? * CORPUS_PAGE as u64;
        let table = ExportTable::new();
        for (name, age) in &ages {
            let mut spec = DeviceSpec::new(name, size)?;
            spec.compressor = replay.algorithm.clone();
            spec.allocator = replay.allocator;
            spec.layout = replay.layout;
            spec.writeback_format = replay.format;
            match age {
                AgeChoice::Fixed { age_secs } => {
                    spec.writeback_idle = Some(std::time::Duration::from_secs(*age_secs))
                }
                AgeChoice::Controller => spec.promotion_target_percent = Some(percent),
            }
            let device = host.create(spec)?;
            table.insert(Export::new(name.as_str(), device.block_device()));
        }
        let server = Server::with_exports(
            Arc::new(table),
            ServerConfig {
                max_connections: ages.len() + 1,
                ..ServerConfig::default()
            },
        );
        let socket = dir.0.join("nbd.sock");
        let listener = UnixListener::bind(&socket).with_context(|| {
            format!(
                "binding {} (a unix socket's path is at most 107 bytes: a shorter \
                 --store-dir)",
                socket.display()
            )
        })?;
        let serving = {
            let server = Arc::clone(&server);
            std::thread::spawn(move || server.serve(Listener::Unix(listener)))
        };
        let verdict = replay_through(&host, &socket, &ages, corpus, trace, replay);
        server.stop();
        // The replay's own error first; then the server's, then a device's end.
        let served = match serving.join() {
            Ok(served) => served.context("the NBD server"),
            Err(_) => Err(anyhow::anyhow!("the NBD server's thread panicked")),
        };
        let mut ended = Ok(());
        for (name, _) in &ages {
            if let Err(e) = host.destroy(name) {
                ended = ended.and(Err(e));
            }
        }
        let verdict = verdict?;
        served?;
        ended?;
        Ok(verdict)
    }

    /// The clients, each with its device's figures as the host has them.
    fn replay_through(
        host: &Arc<Host>,
        socket: &Path,
        ages: &[(String, AgeChoice)],
        corpus: &CorpusPages<'_>,
        trace: &Trace,
        replay: &FarTierReplay,
    ) -> anyhow::Result<FarTierVerdict> {
        let mut devices = Vec::with_capacity(ages.len());
        for (name, age) in ages {
            let uri = Uri {
                target: Target::Unix(socket.to_owned()),
                export: name.clone(),
                tls: None,
            };
            let client = Client::connect(&uri)
                .with_context(|| format!("connecting to export {name} on {}", socket.display()))?;
            let device = host
                .get(name)
                .with_context(|| format!("device {name} is gone from the host"))?;
            devices.push(PacedDevice {
                age: *age,
                device: Arc::new(client),
                figures: Box::new(move || {
                    let bd = device.device().bd_stat().unwrap_or_default();
                    ServedFigures {
                        stored_pages: bd.bd_count,
                        store_reads: bd.bd_reads,
                        policy: device.policy_stats(),
                    }
                }),
            });
        }
        Ok(paced::judge_paced(corpus, trace, replay.target, devices)?)
    }
}
