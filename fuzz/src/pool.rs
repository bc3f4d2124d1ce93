//! The pools' safe API against a model, under AddressSanitizer.

/// Arbitrary malloc / write / read / free / stale-free / invented-handle / compact sequences
/// on zsmalloc (any chain size, both page sizes) and zblock (objects up to a page, 16 or
/// 64 KiB), checked against a model by
/// `ztier_pool::testing::run_model`: under AddressSanitizer, no sequence of calls to the
/// pools' safe API may touch memory outside live pages.
pub fn pool_model(data: &[u8]) {
    use ztier_pool::testing::{run_model, ModelOp};
    use ztier_pool::{ChainRule, ZblockConfig, ZblockPool, ZsConfig, ZsPool};
    let Some((&layout, mut rest)) = data.split_first() else {
        return;
    };
    let mut ops = Vec::new();
    while rest.len() >= 9 && ops.len() < 2000 {
        let (op, tail) = rest.split_at(9);
        rest = tail;
        let arg = u64::from_le_bytes(op[1..9].try_into().expect("8 bytes"));
        let pick = arg as usize;
        ops.push(match op[0] % 8 {
            0 | 1 => ModelOp::Store {
                len: pick,
                seed: arg >> 16,
            },
            2 => ModelOp::Rewrite {
                pick,
                seed: arg >> 8,
            },
            3 => ModelOp::Read { pick },
            4 => ModelOp::Free { pick },
            5 => ModelOp::FreeStale { pick },
            6 => ModelOp::Bogus { raw: arg },
            _ => ModelOp::Compact,
        });
    }
    let page_size = if layout & 0x80 != 0 { 16384 } else { 4096 };
    if layout & 0x40 != 0 {
        let pool = ZblockPool::new(ZblockConfig {
            page_size,
            odd_blocks: layout & 0x20 != 0,
            // Objects larger than a page too (zram's 16 and 64 KiB units).
            max_object: match layout & 0x03 {
                1 => Some(16384.max(page_size)),
                2 => Some(65536),
                _ => None,
            },
            ..ZblockConfig::default()
        })
        .expect("valid layout");
        run_model(&pool, &ops, |p| {
            p.block_stats()
                .iter()
                .map(|r| r.blocks * r.pages_per_block as u64)
                .sum()
        });
    } else {
        let pool = ZsPool::new(ZsConfig {
            page_size,
            chain_size: 1 + (layout & 0x0f) as usize,
            chain_rule: if layout & 0x10 != 0 {
                ChainRule::UsedPercent
            } else {
                ChainRule::LeastWaste
            },
            ..ZsConfig::default()
        })
        .expect("valid layout");
        run_model(&pool, &ops, |p| {
            p.class_stats().iter().map(|r| r.pages_used).sum()
        });
    }
}
