//! `ztier`: the Linux compressed-memory stack in userspace, from the command line.
#![forbid(unsafe_code)]

mod classes;

use clap::{Parser, Subcommand};

/// The Linux compressed-memory stack (zsmalloc, zram, ...) in userspace.
#[derive(Parser)]
#[command(name = "ztier", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print zsmalloc's size-class table for a pool layout.
    Classes(classes::ClassesArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Classes(args) => classes::run(&args),
    }
}
