//! `ztier`: the Linux compressed-memory stack in userspace, from the command line.
#![forbid(unsafe_code)]

mod bench;
mod capture;
mod classes;
mod dict;
mod error;
mod generate;
mod plot;
mod pools;
mod serve;
mod size;
mod swap_alloc;
mod swap_bench;

use clap::{CommandFactory, Parser, Subcommand};

/// The Linux compressed-memory stack (zsmalloc, zram, the kernel's compressors) in userspace.
#[derive(Parser)]
#[command(name = "ztier", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
// The two commands of many flags are boxed, so a command is no larger than its pointer.
enum Command {
    /// Replay real memory through zram (or `ztier bench zswap|uffd`: zswap, a userfaultfd
    /// region); print the figures, speed, and the kernel's figures beside them.
    Bench(Box<bench::BenchArgs>),
    /// Capture running processes' memory (private, and shared memory once) as a corpus
    /// (once, or every --every for --for, with a trace of the pages that changed), for
    /// `ztier bench --corpus`.
    Capture(capture::CaptureArgs),
    /// Print zsmalloc's size-class table for a pool layout.
    Classes(classes::ClassesArgs),
    /// Serve a zram device over NBD (to qemu, nbdcopy, nbdfuse, fio, the kernel's nbd) and
    /// vhost-user-blk, or a host of devices (--device, --config).
    Serve(Box<serve::ServeArgs>),
    /// Print a running `ztier serve`'s mm_stat, io_stat, server counts and allocator table.
    Stat(serve::StatArgs),
    /// Read or write a running `ztier serve`'s zram attributes by the kernel's sysfs names
    /// (mm_stat, bd_stat, idle, writeback, recompress, writeback_limit, ...).
    Ctl(serve::CtlArgs),
    /// Draw a `ztier bench --json` result as SVG: memory by size class, the distribution of
    /// compressed sizes, a sweep's runs, a trace's memory over time.
    Plot(plot::PlotArgs),
    /// Train a zstd dictionary on memory pages, for `--compressor zstd:dict=PATH`.
    TrainDict(dict::TrainDictArgs),
    /// The swap-slot allocator's lock study: the cluster mode and the legacy mode on the
    /// same work, with every lock's contention.
    SwapAllocBench(swap_alloc::SwapAllocArgs),
    /// zswap over a swap file: threads swap real pages out and in with a working set
    /// larger than the pool, the shrinker writing back; counters, throughput, locks.
    SwapBench(swap_bench::SwapBenchArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or PowerShell to stdout
    /// (the Debian package installs bash's, zsh's and fish's).
    Completions(generate::CompletionsArgs),
}

fn main() -> std::process::ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if generate::names_manpages(&args) {
        let manpages = generate::ManpagesArgs::parse_from(&args[1..]);
        return report(generate::manpages(&manpages, Cli::command()));
    }
    let cli = match Cli::try_parse_from(bench::front_alias(args)) {
        Ok(cli) => cli,
        // --help and --version print what was asked for, and a bare `ztier` its help, as
        // clap does.
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            eprintln!("ztier: {}", error::usage_line(&e));
            return std::process::ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Capture(args) => capture::run(&args),
        Command::Classes(args) => classes::run(&args),
        Command::Serve(args) => match serve::run(&args) {
            Ok(status) => return std::process::ExitCode::from(status),
            Err(e) => Err(e),
        },
        Command::Stat(args) => serve::stat(&args),
        Command::Ctl(args) => serve::ctl(&args),
        Command::TrainDict(args) => dict::run(&args),
        Command::Plot(args) => plot::run(&args),
        Command::SwapAllocBench(args) => swap_alloc::run(&args),
        Command::SwapBench(args) => swap_bench::run(&args),
        Command::Completions(args) => generate::completions(&args, Cli::command()),
    };
    report(result)
}

/// The exit status of a command's result, its error printed.
fn report(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause chain on one line, each cause once, no backtrace: this is for a user,
            // not a debugger.
            eprintln!("ztier: {}", error::one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}
