//! `--allocator NAME|all`, and the side-by-side table of a sweep (allocators, compressors,
//! chain sizes, thread counts).

use ztier_pool::{AllocatorKind, UnknownName};
use ztier_replay::zram::ZramRun;

/// `--allocator NAME` or `--allocator all`.
#[derive(Debug, Clone)]
pub struct AllocatorChoice(Vec<AllocatorKind>);

impl AllocatorChoice {
    pub fn kinds(&self) -> &[AllocatorKind] {
        &self.0
    }
}

/// A word `--allocator` does not take: no allocator's name, nor `all`. The allocators'
/// names are said in the message (clap prints a flag's error by its message alone).
#[derive(Debug)]
pub struct UnknownChoice(UnknownName);

impl std::fmt::Display for UnknownChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} or all", self.0)
    }
}

impl std::error::Error for UnknownChoice {}

impl std::str::FromStr for AllocatorChoice {
    type Err = UnknownChoice;
    fn from_str(s: &str) -> Result<Self, UnknownChoice> {
        if s == "all" {
            return Ok(AllocatorChoice(AllocatorKind::ALL.to_vec()));
        }
        s.parse::<AllocatorKind>()
            .map(|k| AllocatorChoice(vec![k]))
            .map_err(UnknownChoice)
    }
}

/// One line per run (a sweep's table): density and speed of each allocator, compressor,
/// chain size and thread count on the same corpus, the kernel's `mem_used_total` beside it
/// where its figures apply.
pub fn print_side_by_side(runs: &[ZramRun]) {
    println!(
        "{:<10} {:<12} {:<10} {:>5} {:>7} {:>14} {:>14} {:>9} {:>6} {:>10} {:>10} {:>14} {:>12}",
        "corpus",
        "compressor",
        "allocator",
        "chain",
        "threads",
        "compr_data",
        "mem_used",
        "overhead",
        "ratio",
        "store MB/s",
        "load MB/s",
        "kernel mem",
        "store/kernel"
    );
    for r in runs {
        let kernel = r.kernel.as_ref().map_or("-".to_string(), |k| {
            let mark = if k.equal { "=" } else { "DIFF" };
            format!("{} {mark}", k.mm_stat.mem_used_total)
        });
        // The kernel's dd write speed on the same pages, where the truth file has it.
        let vs_kernel = r
            .kernel
            .as_ref()
            .and_then(|k| k.write_mb_s)
            .map_or("-".to_string(), |w| format!("{:.2}x", r.store_mb_s / w));
        println!(
            "{:<10} {:<12} {:<10} {:>5} {:>7} {:>14} {:>14} {:>9.3} {:>6.2} {:>10.1} {:>10.1} {:>14} {:>12}",
            r.corpus,
            r.compressor,
            r.allocator,
            // Chain sizes are zsmalloc's.
            if r.allocator == "zsmalloc" {
                r.chain_size.to_string()
            } else {
                "-".into()
            },
            r.threads,
            r.mm_stat.compr_data_size,
            r.mm_stat.mem_used_total,
            r.mm_stat.mem_used_total as f64 / r.mm_stat.compr_data_size.max(1) as f64,
            r.mm_stat.orig_data_size as f64 / r.mm_stat.mem_used_total.max(1) as f64,
            r.store_mb_s,
            r.load_mb_s,
            kernel,
            vs_kernel
        );
    }
}
