//! Random operation sequences against a model of slot usage: every count the device reports
//! is the model's, allocations are aligned runs of free slots, order 0 fails only on a full
//! device, and after every step each cluster is on the list its state names (`check_consistency`).

use std::collections::HashMap;
use std::sync::Arc;

use proptest::prelude::*;
use ztier_blockdev::memory::MemoryDevice;
use ztier_swap::{Config, Device, ListPolicy, Mode, SwapError, SLOT_BYTES, SWAPFILE_CLUSTER};

const CL: u64 = SWAPFILE_CLUSTER as u64;
const SLOTS: u64 = 4 * CL;

#[derive(Debug, Clone)]
enum Op {
    Alloc { cpu: usize, order: u32 },
    Free(usize),
    Dup(usize),
    FreeRun(usize),
    Batch(Vec<usize>),
    FreeUnallocated(u64),
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, prop_oneof![4 => Just(0u32), 1 => Just(1), 1 => Just(4), 1 => Just(9)])
            .prop_map(|(cpu, order)| Op::Alloc { cpu, order }),
        3 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::Dup),
        2 => any::<usize>().prop_map(Op::FreeRun),
        1 => prop::collection::vec(any::<usize>(), 1..40).prop_map(Op::Batch),
        1 => (1..SLOTS).prop_map(Op::FreeUnallocated),
        1 => Just(Op::Drain),
    ]
}

struct Model {
    counts: HashMap<u64, u8>,
    runs: Vec<(u64, u32)>,
}

impl Model {
    fn held(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.counts.keys().copied().collect();
        v.sort_unstable();
        v
    }
    fn put(&mut self, slot: u64) {
        let c = self.counts.get_mut(&slot).unwrap();
        *c -= 1;
        if *c == 0 {
            self.counts.remove(&slot);
        }
    }
}

fn run(ops: Vec<Op>, mode: Mode, policy: ListPolicy) -> Result<(), TestCaseError> {
    let dev = Device::new(
        Arc::new(MemoryDevice::new(SLOTS * SLOT_BYTES).unwrap()),
        Config {
            mode,
            policy,
            ..Config::default()
        },
    )
    .unwrap();
    let legacy = mode == Mode::Legacy;
    let mut m = Model {
        counts: HashMap::new(),
        runs: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Alloc { cpu, order } => match dev.alloc_on(cpu, order) {
                Ok(slot) => {
                    let nr = 1u64 << order;
                    prop_assert_eq!(slot % nr, 0);
                    prop_assert_eq!(slot / CL, (slot + nr - 1) / CL);
                    for s in slot..slot + nr {
                        prop_assert!(!m.counts.contains_key(&s), "slot {} given twice", s);
                        m.counts.insert(s, 1);
                    }
                    m.runs.push((slot, order));
                }
                Err(SwapError::Full { .. }) => {
                    if order == 0 && !legacy {
                        prop_assert_eq!(m.counts.len() as u64, SLOTS - 1, "order 0 failed");
                    }
                }
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            },
            Op::Free(pick) | Op::Dup(pick) => {
                let held = m.held();
                if held.is_empty() {
                    continue;
                }
                let slot = held[pick % held.len()];
                if matches!(op, Op::Free(_)) {
                    dev.free(slot).unwrap();
                    m.put(slot);
                } else if m.counts[&slot] < 0x3e {
                    dev.dup(slot).unwrap();
                    *m.counts.get_mut(&slot).unwrap() += 1;
                }
            }
            Op::FreeRun(pick) => {
                m.runs
                    .retain(|&(s, o)| (s..s + (1 << o)).all(|x| m.counts.get(&x) == Some(&1)));
                if m.runs.is_empty() {
                    continue;
                }
                let (slot, order) = m.runs.swap_remove(pick % m.runs.len());
                dev.free_range(slot, 1 << order).unwrap();
                for s in slot..slot + (1 << order) {
                    m.put(s);
                }
            }
            Op::Batch(picks) => {
                let held = m.held();
                if held.is_empty() {
                    continue;
                }
                let mut batch: Vec<u64> = Vec::new();
                let mut left = m.counts.clone();
                for p in picks {
                    let s = held[p % held.len()];
                    if left[&s] > 0 {
                        *left.get_mut(&s).unwrap() -= 1;
                        batch.push(s);
                    }
                }
                for &s in &batch {
                    m.put(s);
                }
                dev.free_batch(&mut batch).unwrap();
            }
            Op::FreeUnallocated(slot) => {
                // In the legacy mode the slot may sit in a thread's cache, allocated.
                if !legacy && !m.counts.contains_key(&slot) {
                    let refused = matches!(dev.free(slot), Err(SwapError::NotAllocated { .. }));
                    prop_assert!(refused, "free of unallocated {}", slot);
                }
            }
            Op::Drain => dev.drain_slot_caches(),
        }
        for (&s, &c) in &m.counts {
            prop_assert_eq!(dev.usage(s).unwrap(), c, "slot {}", s);
        }
        if !legacy {
            prop_assert_eq!(dev.in_use(), m.counts.len() as u64);
        }
        if let Err(e) = dev.check_consistency() {
            return Err(TestCaseError::fail(e.to_string()));
        }
    }
    dev.drain_slot_caches();
    prop_assert_eq!(dev.in_use(), m.counts.len() as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn cluster_mode_matches_the_model(ops in prop::collection::vec(op(), 1..400)) {
        run(ops, Mode::Cluster, ListPolicy::Ztier)?;
    }

    #[test]
    fn legacy_mode_matches_the_model(ops in prop::collection::vec(op(), 1..400)) {
        run(ops, Mode::Legacy, ListPolicy::Ztier)?;
    }

    #[test]
    fn the_kernels_list_policy_matches_the_model(
        ops in prop::collection::vec(op(), 1..400),
        legacy in any::<bool>(),
    ) {
        let mode = if legacy { Mode::Legacy } else { Mode::Cluster };
        run(ops, mode, ListPolicy::Kernel)?;
    }
}
