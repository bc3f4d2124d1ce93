//! The conformance suite: the contract of [`ZPool`], checked the same way for every
//! allocator. Each allocator's tests call [`run_all`] with a constructor.

use crate::{Handle, PoolError, ZPool};

pub use ztier_base::pattern::pattern;

/// Runs every check on fresh pools from `make`; returns the pages that compaction freed
/// while other threads stored, read and freed (0 for an allocator that does not compact), so
/// that a compacting allocator's tests can check it really ran beside them.
pub fn run_all<P: ZPool>(make: impl Fn() -> P) -> u64 {
    round_trip_every_size(&make());
    boundary_sizes(&make());
    bad_handles(&make());
    foreign_handles(&make(), &make());
    batch_free_without_waiting(&make(), &make());
    wrong_lengths(&make());
    free_returns_pages(&make());
    concurrent_round_trips(&make())
}

/// An object's bytes as `read_with` shows them (in place or through `scratch`).
fn read_with_copy<P: ZPool>(pool: &P, h: Handle, scratch: &mut [u8]) -> Vec<u8> {
    let mut seen = Vec::new();
    let len = pool
        .read_with(h, scratch, &mut |bytes| seen = bytes.to_vec())
        .unwrap();
    assert_eq!(seen.len(), len);
    seen
}

/// Every length 1..=max stores and reads back intact, interleaved with frees.
pub fn round_trip_every_size<P: ZPool>(pool: &P) {
    let max = pool.max_alloc_size();
    let mut live = Vec::new();
    for len in 1..=max {
        let data = pattern(len as u64, len);
        let h = pool.store(&data).expect("store");
        live.push((h, data));
        if len % 3 == 0 {
            let (h, data) = live.swap_remove(len % live.len());
            let mut out = vec![0; max];
            assert_eq!(pool.read(h, &mut out).unwrap(), data.len());
            assert_eq!(&out[..data.len()], &data[..]);
            pool.free(h).unwrap();
        }
    }
    let mut out = vec![0; max];
    for (h, data) in live.drain(..) {
        assert_eq!(pool.read(h, &mut out).unwrap(), data.len());
        assert_eq!(
            &out[..data.len()],
            &data[..],
            "object of {} bytes",
            data.len()
        );
        assert_eq!(read_with_copy(pool, h, &mut out), data, "read_with");
        pool.free(h).unwrap();
    }
    assert_eq!(pool.total_pages(), 0);
}

/// 0 and max+1 are refused; 1 and max are accepted; a write at the start, middle and end of
/// a page-crossing run of objects lands where it should.
pub fn boundary_sizes<P: ZPool>(pool: &P) {
    let max = pool.max_alloc_size();
    assert_eq!(pool.malloc(0), Err(PoolError::ZeroSize));
    assert_eq!(
        pool.malloc(max + 1),
        Err(PoolError::TooLarge { len: max + 1, max })
    );
    for len in [1, 2, 7, 8, 9, 63, 64, 65, max / 2, max - 1, max] {
        let handles: Vec<_> = (0..40u64)
            .map(|i| (pool.store(&pattern(i * 7919 + len as u64, len)).unwrap(), i))
            .collect();
        let mut out = vec![0; len];
        for &(h, i) in &handles {
            assert_eq!(pool.read(h, &mut out).unwrap(), len);
            assert_eq!(out, pattern(i * 7919 + len as u64, len));
        }
        for (h, _) in handles {
            pool.free(h).unwrap();
        }
    }
    assert_eq!(pool.total_pages(), 0);
}

/// Freed, double-freed, invented and foreign handles are refused and change nothing.
pub fn bad_handles<P: ZPool>(pool: &P) {
    let keep = pool.store(b"kept intact").unwrap();
    let h = pool.store(b"to be freed").unwrap();
    pool.free(h).unwrap();
    let mut out = [0u8; 64];
    assert!(matches!(
        pool.read(h, &mut out),
        Err(PoolError::FreedHandle { .. })
    ));
    assert!(matches!(
        pool.write(h, b"to be freed"),
        Err(PoolError::FreedHandle { .. })
    ));
    assert!(matches!(pool.free(h), Err(PoolError::FreedHandle { .. })));
    // Reuse of the handle slot must not revive the old handle.
    let h2 = pool.store(b"reused slot").unwrap();
    assert_ne!(h, h2);
    assert!(pool.read(h, &mut out).is_err());
    for raw in [
        1u64,
        2,
        0xffff_ffff_ffff_ffff,
        0x1234_5678_9abc_def1,
        u64::MAX - 1,
    ] {
        let bogus = crate::Handle::from_raw(raw).unwrap();
        if bogus == keep || bogus == h2 {
            continue;
        }
        assert!(pool.read(bogus, &mut out).is_err(), "read of {raw:#x}");
        assert!(pool.free(bogus).is_err(), "free of {raw:#x}");
    }
    assert_eq!(pool.read(keep, &mut out).unwrap(), 11);
    assert_eq!(&out[..11], b"kept intact");
    pool.free(keep).unwrap();
    pool.free(h2).unwrap();
    assert_eq!(pool.total_pages(), 0);
}

/// A handle of another pool is refused by every call, even where the other pool holds an
/// object at the same place (both pools' first object), and neither pool's data changes.
pub fn foreign_handles<P: ZPool>(a: &P, b: &P) {
    let in_a = a.store(b"pool a's object").unwrap();
    let in_b = b.store(b"pool b's object").unwrap();
    let mut out = [0u8; 64];
    assert!(matches!(b.free(in_a), Err(PoolError::UnknownHandle { .. })));
    assert!(matches!(
        b.read(in_a, &mut out),
        Err(PoolError::UnknownHandle { .. })
    ));
    assert!(matches!(
        b.write(in_a, b"pool b's object"),
        Err(PoolError::UnknownHandle { .. })
    ));
    assert!(a.free(in_b).is_err());
    assert_eq!(a.read(in_a, &mut out).unwrap(), 15);
    assert_eq!(&out[..15], b"pool a's object");
    assert_eq!(b.read(in_b, &mut out).unwrap(), 15);
    assert_eq!(&out[..15], b"pool b's object");
    a.free(in_a).unwrap();
    b.free(in_b).unwrap();
}

/// A batch freed without waiting, with no other thread about, frees every object it can:
/// the good handles are freed, a foreign or already freed one is refused and changes
/// nothing, and nothing is left in the batch.
pub fn batch_free_without_waiting<P: ZPool>(a: &P, b: &P) {
    let good: Vec<Handle> = (1..40)
        .map(|i| a.store(&pattern(i, 37 * i as usize + 5)).expect("store"))
        .collect();
    let foreign = b.store(&pattern(1, 100)).expect("store");
    let freed = a.store(&pattern(2, 100)).expect("store");
    a.free(freed).expect("free");
    let kept = a.store(&pattern(3, 300)).expect("store");
    let mut batch = good.clone();
    batch.push(foreign);
    batch.push(freed);
    assert!(
        a.free_batch_uncontended(&mut batch).is_err(),
        "a foreign and a freed handle refused"
    );
    assert!(batch.is_empty(), "nothing held, nothing kept: {batch:?}");
    for h in good {
        assert!(a.free(h).is_err(), "freed by the batch");
    }
    assert_eq!(b.read(foreign, &mut [0u8; 100]).expect("still live"), 100);
    let mut out = vec![0u8; 300];
    a.read(kept, &mut out).expect("untouched");
    assert_eq!(out, pattern(3, 300));
    a.free(kept).expect("free");
    b.free(foreign).expect("free");
}

/// Writes of the wrong length and reads into short buffers are refused, data intact.
pub fn wrong_lengths<P: ZPool>(pool: &P) {
    let h = pool.store(&[7u8; 100]).unwrap();
    assert!(matches!(
        pool.write(h, &[1u8; 99]),
        Err(PoolError::LengthMismatch { .. })
    ));
    assert!(matches!(
        pool.write(h, &[1u8; 101]),
        Err(PoolError::LengthMismatch { .. })
    ));
    let mut short = [0u8; 99];
    assert!(matches!(
        pool.read(h, &mut short),
        Err(PoolError::LengthMismatch { .. })
    ));
    let mut out = [0u8; 128];
    assert_eq!(pool.read(h, &mut out).unwrap(), 100);
    assert!(out[..100].iter().all(|&b| b == 7));
    pool.free(h).unwrap();
}

/// Freeing everything gives every page back, whatever the order.
pub fn free_returns_pages<P: ZPool>(pool: &P) {
    let handles: Vec<_> = (0..20_000u64)
        .map(|i| {
            pool.store(&pattern(i, 1 + (i as usize * 37) % 3000))
                .unwrap()
        })
        .collect();
    assert!(pool.total_pages() > 0);
    for (i, h) in handles.iter().enumerate() {
        if i % 2 == 0 {
            pool.free(*h).unwrap();
        }
    }
    pool.compact();
    for (i, h) in handles.iter().enumerate() {
        if i % 2 == 1 {
            let len = 1 + (i * 37) % 3000;
            let mut out = vec![0; len];
            pool.read(*h, &mut out).unwrap();
            assert_eq!(out, pattern(i as u64, len), "object {i} after compaction");
            pool.free(*h).unwrap();
        }
    }
    assert_eq!(pool.total_pages(), 0);
}

/// Several threads store, read back, and free at once, with compaction running beside.
/// Returns the pages a compacting thread freed while they ran; it compacts without pause
/// until every worker is done.
pub fn concurrent_round_trips<P: ZPool>(pool: &P) -> u64 {
    use std::sync::atomic::{AtomicBool, Ordering};
    let threads = 4;
    let done = AtomicBool::new(false);
    let compacted = std::thread::scope(|s| {
        let compactor = s.spawn(|| {
            let mut freed = 0;
            while !done.load(Ordering::Relaxed) {
                freed += pool.compact();
                std::thread::yield_now();
            }
            freed
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut live = Vec::new();
                    let mut out = vec![0; pool.max_alloc_size()];
                    for i in 0..20_000u64 {
                        let seed = (t << 32) | i;
                        let len =
                            1 + (seed.wrapping_mul(2654435761) as usize % pool.max_alloc_size());
                        live.push((pool.store(&pattern(seed, len)).unwrap(), seed, len));
                        if i % 3 != 0 {
                            let (h, seed, len) =
                                live.swap_remove((seed as usize * 31) % live.len());
                            assert_eq!(pool.read(h, &mut out).unwrap(), len);
                            assert_eq!(out[..len], pattern(seed, len)[..]);
                            pool.free(h).unwrap();
                        }
                    }
                    for (h, seed, len) in live {
                        assert_eq!(read_with_copy(pool, h, &mut out), pattern(seed, len));
                        pool.free(h).unwrap();
                    }
                })
            })
            .collect();
        // Stop the compactor even when a worker failed, so a failure is reported, not hung.
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        done.store(true, Ordering::Relaxed);
        let freed = compactor.join().expect("compactor");
        for r in results {
            r.expect("worker");
        }
        freed
    });
    assert_eq!(pool.total_pages(), 0);
    compacted
}

/// One step of the model-based property test ([`run_model`]).
#[derive(Debug, Clone)]
pub enum ModelOp {
    Store {
        len: usize,
        seed: u64,
    },
    Rewrite {
        pick: usize,
        seed: u64,
    },
    Read {
        pick: usize,
    },
    Free {
        pick: usize,
    },
    FreeStale {
        pick: usize,
    },
    /// An invented handle: read, write and free must refuse it (unless it happens to be a
    /// live one) and change nothing.
    Bogus {
        raw: u64,
    },
    Compact,
}

/// Runs `ops` against `pool` and a `HashMap` model, checking after every step:
/// - every live object reads back exactly as last written, across compaction;
/// - a freed handle is refused by free and read, and nothing else changes;
/// - no live handle is ever handed out twice;
/// - `pages_of(pool)` (the allocator's own per-class or per-type count) equals `total_pages`;
/// - once everything is freed, `total_pages` is 0.
pub fn run_model<P: ZPool>(pool: &P, ops: &[ModelOp], pages_of: impl Fn(&P) -> u64) {
    use std::collections::HashMap;
    let max = pool.max_alloc_size();
    let mut model: HashMap<crate::Handle, Vec<u8>> = HashMap::new();
    let mut keys = Vec::new();
    let mut freed = Vec::new();
    let mut out = vec![0u8; max];
    for op in ops {
        match *op {
            ModelOp::Store { len, seed } => {
                let data = pattern(seed, 1 + len % max);
                let h = pool.store(&data).unwrap();
                assert!(
                    model.insert(h, data).is_none(),
                    "handle {h} handed out twice"
                );
                keys.push(h);
            }
            ModelOp::Rewrite { pick, seed } if !keys.is_empty() => {
                let h = keys[pick % keys.len()];
                let data = pattern(seed, model[&h].len());
                pool.write(h, &data).unwrap();
                model.insert(h, data);
            }
            ModelOp::Read { pick } if !keys.is_empty() => {
                let h = keys[pick % keys.len()];
                let len = pool.read(h, &mut out).unwrap();
                assert_eq!(&out[..len], &model[&h][..]);
            }
            ModelOp::Free { pick } if !keys.is_empty() => {
                let h = keys.swap_remove(pick % keys.len());
                pool.free(h).unwrap();
                model.remove(&h);
                freed.push(h);
            }
            ModelOp::FreeStale { pick } if !freed.is_empty() => {
                let h = freed[pick % freed.len()];
                assert!(matches!(pool.free(h), Err(PoolError::FreedHandle { .. })));
                assert!(pool.read(h, &mut out).is_err());
            }
            ModelOp::Bogus { raw } => {
                if let Some(h) = crate::Handle::from_raw(raw).filter(|h| !model.contains_key(h)) {
                    assert!(pool.read(h, &mut out).is_err(), "read of {h}");
                    assert!(pool.write(h, &[1]).is_err(), "write of {h}");
                    assert!(pool.free(h).is_err(), "free of {h}");
                }
            }
            ModelOp::Compact => {
                pool.compact();
            }
            _ => {}
        }
        assert_eq!(pages_of(pool), pool.total_pages());
    }
    for (h, data) in &model {
        let len = pool.read(*h, &mut out).unwrap();
        assert_eq!(&out[..len], &data[..]);
        pool.free(*h).unwrap();
    }
    assert_eq!(pool.total_pages(), 0);
}
