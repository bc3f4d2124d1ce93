//! `--allocator NAME|all`, and the side-by-side table of allocators and thread counts.

use ztier_pool::AllocatorKind;
use ztier_replay::zram::ZramRun;

/// `--allocator NAME` or `--allocator all`.
#[derive(Debug, Clone)]
pub struct AllocatorChoice(Vec<AllocatorKind>);

impl AllocatorChoice {
    pub fn kinds(&self) -> &[AllocatorKind] {
        &self.0
    }
}

impl std::str::FromStr for AllocatorChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "all" {
            return Ok(AllocatorChoice(AllocatorKind::ALL.to_vec()));
        }
        s.parse::<AllocatorKind>()
            .map(|k| AllocatorChoice(vec![k]))
            .map_err(|e| format!("{e} or all"))
    }
}

/// One line per run: density and speed of each allocator and thread count on the same corpus
/// and compressor.
pub fn print_side_by_side(runs: &[ZramRun]) {
    println!(
        "{:<10} {:<12} {:<10} {:>7} {:>14} {:>14} {:>9} {:>10} {:>10}",
        "corpus",
        "compressor",
        "allocator",
        "threads",
        "compr_data",
        "mem_used",
        "overhead",
        "store MB/s",
        "load MB/s"
    );
    for r in runs {
        println!(
            "{:<10} {:<12} {:<10} {:>7} {:>14} {:>14} {:>9.3} {:>10.1} {:>10.1}",
            r.corpus,
            r.compressor,
            r.allocator,
            r.threads,
            r.mm_stat.compr_data_size,
            r.mm_stat.mem_used_total,
            r.mm_stat.mem_used_total as f64 / r.mm_stat.compr_data_size.max(1) as f64,
            r.store_mb_s,
            r.load_mb_s
        );
    }
}
