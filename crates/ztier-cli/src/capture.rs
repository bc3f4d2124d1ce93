//! `ztier capture`: flags in, a summary out. The capture itself is `ztier_capture`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ztier_capture::recorder::CGROUP_EPOCH_READS;
use ztier_capture::{CaptureOptions, EpochSummary, Manifest, Recorder, Target};

use crate::size::parse_positive_duration;

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["pid", "cgroup"])))]
pub struct CaptureArgs {
    /// A process to capture; repeat it for several (a program's processes: private pages
    /// per process, shared memory once).
    #[arg(long, value_name = "PID")]
    pub pid: Vec<u32>,
    /// Capture every process of this cgroup and of the cgroups below it (a directory under
    /// /sys/fs/cgroup), listed again at each epoch.
    #[arg(long, value_name = "PATH", conflicts_with = "pid")]
    pub cgroup: Option<PathBuf>,
    /// The corpus to write (NAME.pages.zst or NAME.pages); NAME.capture.json (the manifest)
    /// and NAME.trace go beside it. Default here: COMM-PID.pages.zst (COMM-PID+N for N more
    /// processes), or the cgroup's name.
    #[arg(short = 'o', long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Capture again at this interval (5s, 500ms, 2m), recording which pages changed,
    /// appeared and went; with --for. An epoch that outlasts it makes the next start at the
    /// next multiple of it (the periods missed are counted), never at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, requires = "for_")]
    pub every: Option<Duration>,
    /// How long to record for, with --every.
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = parse_positive_duration,
          requires = "every")]
    pub for_: Option<Duration>,
    /// Also capture private file mappings (copy-on-write data and mapped file pages).
    #[arg(long)]
    pub file_backed: bool,
    /// Stop the processes (SIGSTOP) while they are read, for a copy of one instant; they
    /// are continued after each read, on an error too.
    #[arg(long)]
    pub stop: bool,
    /// Print the manifest as JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CaptureArgs) -> anyhow::Result<()> {
    let options = CaptureOptions {
        file_backed: args.file_backed,
        stop: args.stop,
    };
    let (target, what) = match &args.cgroup {
        Some(path) => (
            Target::Cgroup(path.clone()),
            format!("cgroup {}", path.display()),
        ),
        None => (
            Target::Pids(args.pid.clone()),
            match args.pid.as_slice() {
                [pid] => format!("process {pid}"),
                pids => format!(
                    "processes {}",
                    pids.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
        ),
    };
    let output = args.output.clone().unwrap_or_else(|| default_output(args));
    let mut recorder =
        Recorder::start(target, &output, options).with_context(|| format!("capturing {what}"))?;
    match (args.every, args.for_) {
        (Some(every), Some(total)) => {
            if !args.json {
                println!("{}", epoch_header());
            }
            let json = args.json;
            recorder.record(every, total, &mut |e| {
                if !json {
                    println!("{}", epoch_row(e));
                }
            })
        }
        _ => recorder.epoch(&mut |_| {}).map(|_| ()),
    }
    .with_context(|| format!("capturing {what}"))?;
    let manifest = recorder.finish()?;
    if manifest.ended_by_exit {
        eprintln!(
            "ztier: {} during the recording, after {} epochs (the last at {:.1} s): they are \
             kept and written",
            match (manifest.exited_pid, &manifest.cgroup) {
                (Some(pid), Some(_)) => format!(
                    "a process of the cgroup ended during each of {CGROUP_EPOCH_READS} reads of \
                     an epoch (the last, process {pid})"
                ),
                (Some(pid), None) => format!("process {pid} exited"),
                (None, _) => "every process of the cgroup exited".into(),
            },
            manifest.epochs.len(),
            last_epoch_seconds(&manifest)
        );
    }
    if let Some(limit) = &manifest.ended_at_limit {
        eprintln!(
            "ztier: the recording reached a capture's limit ({limit}) after {} epochs (the \
             last at {:.1} s): they are kept and written",
            manifest.epochs.len(),
            last_epoch_seconds(&manifest)
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&manifest)?);
    } else {
        print_manifest(&manifest);
    }
    Ok(())
}

/// COMM-PID.pages.zst (COMM-PID+N.pages.zst with N more processes), or CGROUP.pages.zst.
fn default_output(args: &CaptureArgs) -> PathBuf {
    if let Some(cgroup) = &args.cgroup {
        let name = cgroup
            .file_name()
            .map(|n| n.to_string_lossy().replace(['/', ' '], "_"))
            .unwrap_or_else(|| "cgroup".into());
        return PathBuf::from(format!("{name}.pages.zst"));
    }
    let first = args.pid.first().copied().unwrap_or_default();
    let name = std::fs::read_to_string(format!("/proc/{first}/comm"))
        .map(|s| s.trim().replace(['/', ' '], "_"))
        .unwrap_or_else(|_| "process".into());
    match args.pid.len() {
        0 | 1 => PathBuf::from(format!("{name}-{first}.pages.zst")),
        n => PathBuf::from(format!("{name}-{first}+{}.pages.zst", n - 1)),
    }
}

/// When the last epoch kept began, in seconds since the first.
fn last_epoch_seconds(m: &Manifest) -> f64 {
    m.epochs.last().map_or(0, |e| e.millis) as f64 / 1000.0
}

fn epoch_header() -> String {
    format!(
        "{:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "epoch", "at s", "present", "appeared", "changed", "went", "unchanged", "read s"
    )
}

fn epoch_row(e: &EpochSummary) -> String {
    format!(
        "{:>5} {:>8.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.2}",
        e.epoch,
        e.millis as f64 / 1000.0,
        e.present,
        e.appeared,
        e.changed,
        e.went,
        e.unchanged,
        e.seconds
    )
}

fn mib(pages: u64) -> String {
    format!("{:.1} MiB", (pages * 4096) as f64 / (1 << 20) as f64)
}

fn print_manifest(m: &Manifest) {
    let command_line = |c: &str| {
        if c.is_empty() {
            "(no command line)".to_string()
        } else {
            c.to_string()
        }
    };
    match (m.processes.as_slice(), &m.cgroup) {
        ([p], None) => println!(
            "process {} ({}): {}",
            p.pid,
            p.name,
            command_line(&p.command_line)
        ),
        (processes, cgroup) => {
            println!(
                "{} processes{}:",
                processes.len(),
                cgroup
                    .as_ref()
                    .map(|c| format!(" of cgroup {}", c.display()))
                    .unwrap_or_default()
            );
            for p in processes {
                println!(
                    "  {:>7} {:>8} pages  {}",
                    p.pid,
                    p.pages_read,
                    command_line(&p.command_line)
                );
            }
        }
    }
    println!(
        "  {:<16} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "kind", "mappings", "mapped", "present", "swapped", "captured"
    );
    for k in &m.by_kind {
        let kind = serde_json::to_value(k.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!(
            "  {:<16} {:>8} {:>12} {:>10} {:>10} {:>10}",
            kind,
            k.mappings,
            mib(k.mapped_bytes / 4096),
            k.pages_present,
            k.pages_swapped,
            k.pages_read
        );
    }
    let first = m.epochs.first();
    println!(
        "  first capture: {} pages ({}) in {:.2} s{}; {} pages mapped more than once taken once",
        m.first_capture_pages,
        mib(m.first_capture_pages),
        first.map_or(0.0, |e| e.seconds),
        if m.stopped {
            format!(
                ", stopped {:.2} s",
                first.map_or(0.0, |e| e.stopped_seconds)
            )
        } else if m.processes.len() == 1 {
            ", the process running".into()
        } else {
            ", the processes running".into()
        },
        m.duplicate_pages
    );
    let vanished: Vec<String> = m
        .processes
        .iter()
        .flat_map(|p| p.mappings.iter().map(move |r| (p.pid, r)))
        .filter(|(_, r)| r.vanished)
        .map(|(pid, r)| {
            format!(
                "{pid}: {:#x}-{:#x} {} ({} pages read before)",
                r.mapping.start, r.mapping.end, r.mapping.path, r.pages_read
            )
        })
        .collect();
    if !vanished.is_empty() {
        println!(
            "  unmapped by the process during the capture: {}",
            vanished.join(", ")
        );
    }
    if m.epochs.len() > 1 {
        println!(
            "  {} epochs over {:.1} s{}{}",
            m.epochs.len(),
            last_epoch_seconds(m),
            match (m.missed_periods, m.period_millis) {
                (0, _) | (_, None) => String::new(),
                (missed, Some(period)) => format!(
                    "; {missed} periods of {period} ms missed: an epoch outlasted the period, \
                     the next began at the next multiple of it"
                ),
            },
            if m.ended_by_exit {
                "; a process exited, the epochs before are kept"
            } else {
                ""
            }
        );
    }
    if m.epochs_read_again > 0 {
        println!(
            "  {} epoch reads made again: a process of the cgroup ended during the read",
            m.epochs_read_again
        );
    }
    if !m.joined_later.is_empty() {
        println!(
            "  joined the cgroup later: {}",
            m.joined_later
                .iter()
                .map(|j| format!("{} ({}, epoch {})", j.pid, j.name, j.epoch))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!(
        "  corpus {}: {} pages ({}), {} zero, {} same-filled; raw_sha256 {}",
        m.corpus.display(),
        m.pages,
        mib(m.pages),
        m.zero_pages,
        m.same_filled_pages,
        m.raw_sha256
    );
    println!("  trace {}", m.trace.display());
    println!("  {}", m.consistency);
}
