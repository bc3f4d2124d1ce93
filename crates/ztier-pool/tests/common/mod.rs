//! What the allocators' integration tests share.

use proptest::prelude::*;
use ztier_pool::testing::ModelOp;

/// Model operations weighted toward the common path (store, read, free).
pub fn model_op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        6 => (any::<usize>(), any::<u64>()).prop_map(|(len, seed)| ModelOp::Store { len, seed }),
        2 => (any::<usize>(), any::<u64>()).prop_map(|(pick, seed)| ModelOp::Rewrite { pick, seed }),
        3 => any::<usize>().prop_map(|pick| ModelOp::Read { pick }),
        4 => any::<usize>().prop_map(|pick| ModelOp::Free { pick }),
        1 => any::<usize>().prop_map(|pick| ModelOp::FreeStale { pick }),
        1 => any::<u64>().prop_map(|raw| ModelOp::Bogus { raw }),
        1 => Just(ModelOp::Compact),
    ]
}
