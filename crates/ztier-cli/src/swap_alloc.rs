//! `ztier swap-alloc-bench`: the swap-slot allocator's lock study, both modes side by side.

use std::path::PathBuf;

use clap::Args;
use ztier_replay::swap_alloc::{SwapAllocBench, SwapAllocReport, Workload, LARGE_ORDER};
use ztier_swap::{ListPolicy, Mode};

use crate::size::parse_size;

#[derive(Args, Debug)]
pub struct SwapAllocArgs {
    /// Threads allocating and freeing at once (more than cores is allowed); a list runs each.
    #[arg(long, value_delimiter = ',', default_value = "2,4,16,64",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Vec<u16>,
    /// Workloads: order0, mixed, churn, nearly-full (a list; default all).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "order0,mixed,churn,nearly-full"
    )]
    pub workload: Vec<Workload>,
    /// Operations (allocations and frees) per run, over all its threads.
    #[arg(long, default_value_t = 4_000_000)]
    pub ops: u64,
    /// The swap device's size (its backing file is sparse: nothing is written).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where frees send clusters, in both modes: ztier's (nonfull holds clusters with room
    /// for their order) or the kernel's (every free to nonfull).
    #[arg(long, value_enum, default_value = "ztier")]
    pub list_policy: PolicyArg,
    /// Where the backing file is made (and removed after).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// One JSON object per run instead of the tables.
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum PolicyArg {
    Ztier,
    Kernel,
}

pub fn run(args: &SwapAllocArgs) -> anyhow::Result<()> {
    let policy = match args.list_policy {
        PolicyArg::Ztier => ListPolicy::Ztier,
        PolicyArg::Kernel => ListPolicy::Kernel,
    };
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    for &workload in &args.workload {
        for &threads in &args.threads {
            let mut reports = Vec::new();
            for mode in [Mode::Legacy, Mode::Cluster] {
                let report = SwapAllocBench {
                    workload,
                    mode,
                    policy,
                    threads: usize::from(threads),
                    ops: args.ops,
                    device_bytes: args.size,
                    seed: args.seed,
                    dir: dir.clone(),
                }
                .run()?;

                if args.json {
                    println!("{}", serde_json::to_string(&report)?);
                }
                reports.push(report);
            }
            if !args.json {
                print_pair(&reports[0], &reports[1]);
            }
        }
    }
    Ok(())
}

fn print_pair(legacy: &SwapAllocReport, cluster: &SwapAllocReport) {
    println!(
        "{} ({:.0} % full{}), {} threads, {} operations, {:?} list policy",
        legacy.workload.name(),
        legacy.fill * 100.0,
        if legacy.workload == Workload::Order0 {
            String::new()
        } else {
            format!(", a quarter order {LARGE_ORDER}")
        },
        legacy.threads,
        legacy.ops,
        legacy.device.policy
    );
    println!(
        "  {:<8} {:>12} {:>11} {:>10} {:>10} {:>11} {:>11} {:>10} {:>12} {:>10}",
        "mode",
        "ops/s",
        "devlock/slot",
        "contended",
        "wait ms",
        "cluster acq",
        "contended",
        "wait ms",
        format!("o{LARGE_ORDER} fallback"),
        "frag free"
    );
    for r in [legacy, cluster] {
        let dev = r.lock("si->lock").expect("the device lock is reported");
        let cl = r.lock("ci->lock").expect("the cluster locks are reported");
        println!(
            "  {:<8} {:>12.0} {:>11.4} {:>10} {:>10.2} {:>11} {:>11} {:>10.2} {:>12} {:>10}",
            format!("{:?}", r.mode).to_lowercase(),
            r.ops_per_s,
            r.device_lock_per_slot,
            dev.contended,
            dev.wait_ns as f64 / 1e6,
            cl.acquisitions,
            cl.contended,
            cl.wait_ns as f64 / 1e6,
            r.fallbacks[LARGE_ORDER as usize],
            r.frag_free_slots
        );
    }
    println!(
        "  cluster / legacy: {:.2}x the operations per second, {:.3}x the device-lock acquisitions per slot",
        cluster.ops_per_s / legacy.ops_per_s,
        cluster.device_lock_per_slot / legacy.device_lock_per_slot
    );
}
