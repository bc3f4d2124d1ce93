//! `ztier`: the Linux compressed-memory stack in userspace, from the command line.
#![forbid(unsafe_code)]

mod bench;
mod classes;
mod pools;

use clap::{Parser, Subcommand};

/// The Linux compressed-memory stack (zsmalloc, zram, the kernel's compressors) in userspace.
#[derive(Parser)]
#[command(name = "ztier", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replay real memory through a zram device; print mm_stat, speed, and the kernel's figures.
    Bench(bench::BenchArgs),
    /// Print zsmalloc's size-class table for a pool layout.
    Classes(classes::ClassesArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(&args),
        Command::Classes(args) => classes::run(&args),
    }
}
