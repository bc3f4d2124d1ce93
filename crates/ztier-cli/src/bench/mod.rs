//! `ztier bench`: flags in, reports out, one front at a time. Each front is a subcommand
//! with the flags it takes over the shared ones ([`shared::ReplayArgs`]), so a flag a front
//! does not take is refused by the parser: `ztier bench` (zram, the main job; also
//! `ztier bench zram`), `ztier bench zswap`, `ztier bench uffd`. `--front NAME` names the
//! front as well ([`front_alias`]). The replays are `ztier_replay`'s.

mod far_tier;
mod shared;
mod uffd;
mod zram;
mod zswap;

use std::ffi::OsString;

use clap::{Args, Subcommand};

pub use shared::default_corpus;

#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_value_name = "FRONT",
    subcommand_help_heading = "Fronts (zram when none is named; `--front FRONT` names one too)"
)]
pub struct BenchArgs {
    #[command(subcommand)]
    front: Option<Front>,
    /// With no front named: zram's flags.
    #[command(flatten)]
    zram: zram::ZramArgs,
}

/// Which engine the pages go through.
#[derive(Subcommand, Debug)]
enum Front {
    /// A zram device: pages written to it, `mm_stat` beside the kernel zram's (the default).
    Zram(Box<zram::ZramArgs>),
    /// A zswap cache in front of a swap device: pages swapped out to it, the zswap counters
    /// beside the kernel zswap's.
    Zswap(zswap::ZswapArgs),
    /// A userfaultfd region (`ztier-uffd`) under --budget: evicted, faulted back in and
    /// verified, beside the kernel zswap's page-out and fault-in.
    Uffd(uffd::UffdArgs),
}

/// Whether the bench talks to a store over a socket (zram's `--writeback-nbd`).
pub fn uses_a_socket(args: &BenchArgs) -> bool {
    match &args.front {
        None => args.zram.writeback_nbd.is_some(),
        Some(Front::Zram(zram)) => zram.writeback_nbd.is_some(),
        Some(Front::Zswap(_) | Front::Uffd(_)) => false,
    }
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    match &args.front {
        None => zram::run(&args.zram),
        Some(Front::Zram(zram)) => zram::run(zram),
        Some(Front::Zswap(zswap)) => zswap::run(zswap),
        Some(Front::Uffd(uffd)) => uffd::run(uffd),
    }
}

/// `ztier bench ... --front NAME ...` as `ztier bench NAME ...`: the spelling before the
/// fronts were subcommands, kept for the scripts and habits that use it. Only the name
/// moves; what follows is the front's flags, which its parser takes or refuses.
pub fn front_alias(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut args: Vec<OsString> = args.into_iter().collect();
    if args.get(1).is_none_or(|a| a != "bench") {
        return args;
    }
    let front = args
        .iter()
        .skip(2)
        .position(|a| a == "--front" || a.to_str().is_some_and(|a| a.starts_with("--front=")));
    let Some(at) = front.map(|i| i + 2) else {
        return args;
    };
    let name = match args[at].to_str().and_then(|a| a.strip_prefix("--front=")) {
        Some(name) => Some(OsString::from(name)),
        None if at + 1 < args.len() => Some(args.remove(at + 1)),
        None => None,
    };
    if let Some(name) = name {
        args.remove(at);
        args.insert(2, name);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(args: &[&str]) -> Vec<String> {
        front_alias(args.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn front_names_the_subcommand_wherever_it_stands() {
        assert_eq!(
            alias(&["ztier", "bench", "--trace", "--front", "zswap", "--json"]),
            ["ztier", "bench", "zswap", "--trace", "--json"]
        );
        assert_eq!(
            alias(&["ztier", "bench", "--front=uffd", "--budget", "10%"]),
            ["ztier", "bench", "uffd", "--budget", "10%"]
        );
        // Nothing else is touched: another command, no --front, a --front with no name.
        for args in [
            &["ztier", "serve", "--front", "zswap"][..],
            &["ztier", "bench", "--json"],
            &["ztier", "bench", "--front"],
        ] {
            assert_eq!(alias(args), args);
        }
    }
}
