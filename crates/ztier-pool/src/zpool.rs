//! The allocator registry, as the kernel's `mm/zpool.c` was (zswap picked zsmalloc, z3fold or
//! zbud by name through it): which allocators there are, their names, each one's config, and
//! how to make one for a pool layout. Front ends choose an allocator here and never name the
//! types. This is the one place that knows every allocator: no allocator reads another's
//! config.

use crate::{PoolError, ZPool, ZblockConfig, ZblockPool, ZsConfig, ZsPool};

/// One allocator's layout, of its own type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolConfig {
    Zsmalloc(ZsConfig),
    Zblock(ZblockConfig),
}

impl PoolConfig {
    pub fn kind(&self) -> AllocatorKind {
        match self {
            PoolConfig::Zsmalloc(_) => AllocatorKind::Zsmalloc,
            PoolConfig::Zblock(_) => AllocatorKind::Zblock,
        }
    }

    /// A new, empty pool of this layout.
    pub fn make_pool(&self) -> Result<Box<dyn ZPool>, PoolError> {
        Ok(match *self {
            PoolConfig::Zsmalloc(config) => Box::new(ZsPool::new(config)?),
            PoolConfig::Zblock(config) => Box::new(ZblockPool::new(config)?),
        })
    }
}

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

    /// Every allocator's name, comma-separated, for messages.
    pub(crate) fn names() -> String {
        let names: Vec<_> = AllocatorKind::ALL.iter().map(|k| k.name()).collect();
        names.join(", ")
    }

    /// This allocator's config for the layout a user chose (a page size, the largest object,
    /// and zsmalloc's chain settings): zsmalloc takes it whole; zblock takes the page size
    /// and the largest object (its block types are computed) and zsmalloc's huge threshold
    /// for them, so that a front end stores the same pages and units raw on either allocator
    /// and the two are compared on identical objects.
    pub fn config(self, layout: &ZsConfig) -> PoolConfig {
        match self {
            AllocatorKind::Zsmalloc => PoolConfig::Zsmalloc(*layout),
            AllocatorKind::Zblock => {
                // zsmalloc's table for the page size and largest object, with the kernel's
                // chain size; a layout it would refuse leaves zblock its own threshold (and
                // zblock then refuses the layout itself).
                let zsmalloc = ZsConfig {
                    chain_size: crate::zsmalloc::DEFAULT_CHAIN_SIZE,
                    chain_rule: crate::ChainRule::LeastWaste,
                    ..*layout
                };
                PoolConfig::Zblock(ZblockConfig {
                    page_size: layout.page_size,
                    odd_blocks: false,
                    huge_class_size: zsmalloc.validate().is_ok().then(|| {
                        crate::ClassTable::with_max_object(
                            zsmalloc.page_size,
                            zsmalloc.chain_size,
                            zsmalloc.chain_rule,
                            zsmalloc.largest_object(),
                        )
                        .huge_class_size
                    }),
                    max_object: layout.max_object,
                })
            }
        }
    }

    /// A new, empty pool of this allocator for `layout` ([`AllocatorKind::config`]).
    pub fn make_pool(self, layout: &ZsConfig) -> Result<Box<dyn ZPool>, PoolError> {
        self.config(layout).make_pool()
    }
}

impl std::fmt::Display for AllocatorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for AllocatorKind {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Self, crate::UnknownName> {
        AllocatorKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| crate::UnknownName::Allocator(s.to_string()))
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
            assert_eq!(parsed.config(&ZsConfig::default()).kind(), *kind);
        }
        let zsmalloc = AllocatorKind::Zsmalloc
            .make_pool(&ZsConfig::default())
            .unwrap();
        let zblock = AllocatorKind::Zblock
            .make_pool(&ZsConfig::default())
            .unwrap();
        assert_eq!(
            zblock.huge_class_size(),
            zsmalloc.huge_class_size(),
            "compared on identical objects"
        );
        // With 64 KiB units too: the same units stored raw on either allocator.
        let layout = ZsConfig::default().with_max_object(65536);
        let zsmalloc = AllocatorKind::Zsmalloc.make_pool(&layout).unwrap();
        let zblock = AllocatorKind::Zblock.make_pool(&layout).unwrap();
        assert_eq!(zblock.max_alloc_size(), 65536);
        assert_eq!(zblock.huge_class_size(), zsmalloc.huge_class_size());
        assert!(zblock.huge_class_size() > 4096);
        let bad = ZsConfig {
            page_size: 8192,
            ..ZsConfig::default()
        };
        for kind in AllocatorKind::ALL {
            assert!(matches!(
                kind.make_pool(&bad),
                Err(PoolError::Config(crate::ConfigError::PageSize {
                    page_size: 8192
                }))
            ));
        }
        assert!("slab"
            .parse::<AllocatorKind>()
            .unwrap_err()
            .to_string()
            .contains("zsmalloc, zblock"));
    }
}
