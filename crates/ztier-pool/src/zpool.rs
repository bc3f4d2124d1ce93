//! The allocator registry, as the kernel's `mm/zpool.c` was (zswap picked zsmalloc, z3fold or
//! zbud by name through it): which allocators there are, their names, and how to make one
//! for a pool layout. Front ends choose an allocator here and never name the types.

use crate::{ZPool, ZblockConfig, ZblockPool, ZsConfig, ZsPool};

/// An allocator ztier can put under a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocatorKind {
    Zsmalloc,
    Zblock,
}

impl AllocatorKind {
    pub const ALL: &'static [AllocatorKind] = &[AllocatorKind::Zsmalloc, AllocatorKind::Zblock];

    /// The name a user types.
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Zsmalloc => "zsmalloc",
            AllocatorKind::Zblock => "zblock",
        }
    }

    /// A new, empty pool of this allocator for `layout` (zblock takes its page size; its
    /// block types are computed, so the chain settings are zsmalloc's alone). The error is a
    /// sentence for the user.
    pub fn make_pool(self, layout: &ZsConfig) -> Result<Box<dyn ZPool>, String> {
        Ok(match self {
            AllocatorKind::Zsmalloc => Box::new(ZsPool::new(*layout)?),
            AllocatorKind::Zblock => Box::new(ZblockPool::new(ZblockConfig {
                page_size: layout.page_size,
                odd_blocks: false,
            })?),
        })
    }
}

impl std::fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AllocatorKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        AllocatorKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = AllocatorKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown allocator '{s}' (known: {})", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_allocator_is_made_by_its_name() {
        for kind in AllocatorKind::ALL {
            let parsed: AllocatorKind = kind.name().parse().unwrap();
            let pool = parsed.make_pool(&ZsConfig::default()).unwrap();
            assert_eq!(pool.name(), kind.name());
        }
        assert!("slab"
            .parse::<AllocatorKind>()
            .unwrap_err()
            .contains("zsmalloc, zblock"));
    }
}
