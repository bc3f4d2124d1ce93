//! Which allocator a command builds, and the side-by-side table of allocators.

use ztier_pool::{ZPool, ZblockConfig, ZblockPool, ZsConfig, ZsPool};

use crate::bench::RunReport;

/// An allocator ztier can put under a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorKind {
    Zsmalloc,
    Zblock,
}

impl AllocatorKind {
    pub const ALL: &'static [AllocatorKind] = &[AllocatorKind::Zsmalloc, AllocatorKind::Zblock];

    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Zsmalloc => "zsmalloc",
            AllocatorKind::Zblock => "zblock",
        }
    }

    pub fn make_pool(self, config: &ZsConfig) -> anyhow::Result<Box<dyn ZPool>> {
        Ok(match self {
            AllocatorKind::Zsmalloc => Box::new(ZsPool::new(*config).map_err(anyhow::Error::msg)?),
            AllocatorKind::Zblock => Box::new(
                ZblockPool::new(ZblockConfig {
                    page_size: config.page_size,
                    odd_blocks: false,
                })
                .map_err(anyhow::Error::msg)?,
            ),
        })
    }
}

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
        AllocatorKind::ALL
            .iter()
            .find(|k| k.name() == s)
            .map(|k| AllocatorChoice(vec![*k]))
            .ok_or_else(|| {
                let names: Vec<_> = AllocatorKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown allocator '{s}' (known: {}, all)", names.join(", "))
            })
    }
}

/// One line per run: density and speed of each allocator and thread count on the same corpus
/// and compressor.
pub fn print_side_by_side(reports: &[RunReport]) {
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
    for r in reports {
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
