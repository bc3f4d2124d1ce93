//! `ztier capture`: flags in, a summary out. The capture itself is `ztier_capture`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use ztier_capture::{CaptureOptions, EpochSummary, Manifest, Recorder};

use crate::size::parse_positive_duration;

#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// The process to capture.
    #[arg(long)]
    pub pid: u32,
    /// The corpus to write (NAME.pages.zst or NAME.pages); NAME.capture.json (the manifest)
    /// and NAME.trace go beside it. Default: COMM-PID.pages.zst here.
    #[arg(short = 'o', long, value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Capture again at this interval (5s, 500ms, 2m), recording which pages changed,
    /// appeared and went; with --for.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration, requires = "for_")]
    pub every: Option<Duration>,
    /// How long to record for, with --every.
    #[arg(long = "for", id = "for_", value_name = "DURATION", value_parser = parse_positive_duration,
          requires = "every")]
    pub for_: Option<Duration>,
    /// Also capture private file mappings (copy-on-write data and mapped file pages).
    #[arg(long)]
    pub file_backed: bool,
    /// Stop the process (SIGSTOP) while it is read, for a copy of one instant; it is
    /// continued after each read, on an error too.
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
    let output = match &args.output {
        Some(path) => path.clone(),
        None => {
            let name = std::fs::read_to_string(format!("/proc/{}/comm", args.pid))
                .map(|s| s.trim().replace(['/', ' '], "_"))
                .unwrap_or_else(|_| "process".into());
            PathBuf::from(format!("{name}-{}.pages.zst", args.pid))
        }
    };
    let mut recorder = Recorder::start(args.pid, &output, options)
        .with_context(|| format!("capturing process {}", args.pid))?;
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
    .with_context(|| format!("capturing process {}", args.pid))?;
    let manifest = recorder.finish()?;
    if manifest.ended_by_exit {
        eprintln!(
            "ztier: process {} exited during the recording, after {} epochs (the last at {:.1} s): \
             they are kept and written",
            manifest.pid,
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
    println!(
        "process {} ({}): {}",
        m.pid,
        m.process_name,
        if m.command_line.is_empty() {
            "(no command line)"
        } else {
            &m.command_line
        }
    );
    println!(
        "  {:<10} {:>8} {:>12} {:>10} {:>10} {:>10}",
        "kind", "mappings", "mapped", "present", "swapped", "captured"
    );
    for k in &m.by_kind {
        let kind = serde_json::to_value(k.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        println!(
            "  {:<10} {:>8} {:>12} {:>10} {:>10} {:>10}",
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
        "  first capture: {} pages ({}) in {:.2} s{}; {} frames mapped twice left out",
        m.first_capture_pages,
        mib(m.first_capture_pages),
        first.map_or(0.0, |e| e.seconds),
        if m.stopped {
            format!(
                ", the process stopped {:.2} s",
                first.map_or(0.0, |e| e.stopped_seconds)
            )
        } else {
            ", the process running".into()
        },
        m.duplicate_frames
    );
    let vanished: Vec<String> = m
        .mappings
        .iter()
        .filter(|r| r.vanished)
        .map(|r| {
            format!(
                "{:#x}-{:#x} {} ({} pages read before)",
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
            "  {} epochs over {:.1} s{}",
            m.epochs.len(),
            last_epoch_seconds(m),
            if m.ended_by_exit {
                "; the process exited, the epochs before are kept"
            } else {
                ""
            }
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
