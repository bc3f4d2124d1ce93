//! zram device behaviour: round trips, overwrite, partial writes, discard, the memory limit,
//! reset, threads, and a property test against a model.
//!
//! Model properties: a read returns the last bytes written at that offset, zeros where
//! nothing was written or after discard; `orig_data_size` is the allocated slots × page
//! size; everything freed returns the pool to zero pages.

use std::collections::HashMap;

use proptest::prelude::*;
use ztier_base::rng::Rng;
use ztier_compress::Algorithm;
use ztier_pool::testing::pattern;
use ztier_pool::{PoolStats, ZsConfig, ZsPool};
use ztier_zram::{Device, SlotFlag, ZramError};

fn device(pages: u64, alg: &str) -> Device {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    Device::new(
        pages * 4096,
        alg.parse::<Algorithm>().unwrap(),
        Box::new(pool),
    )
    .unwrap()
}

/// Text-like, compressible, different per seed.
fn page(seed: u64) -> Vec<u8> {
    let words = [&b"alpha "[..], b"beta ", b"gamma ", b"delta ", b"epsilon "];
    let mut out = Vec::with_capacity(4096);
    let mut rng = Rng::from_state(seed | 1);
    while out.len() < 4096 {
        let x = rng.next_u64();
        out.extend_from_slice(words[(x % 5) as usize]);
        out.push((x >> 8) as u8);
    }
    out.truncate(4096);
    out
}

/// Incompressible: stored raw as a huge page.
fn noise(seed: u64) -> Vec<u8> {
    pattern(seed, 4096)
}

#[test]
fn round_trip_same_huge_and_compressed_pages() {
    for alg in ["lzo-rle", "lzo", "lz4", "zstd", "deflate", "lz4hc"] {
        let dev = device(16, alg);
        let pages = [page(1), vec![0; 4096], vec![0xab; 4096], noise(3), page(5)];
        for (i, p) in pages.iter().enumerate() {
            dev.write_page(i as u64, p).unwrap();
        }
        let mut out = vec![0; 4096];
        for (i, p) in pages.iter().enumerate() {
            dev.read_page(i as u64, &mut out).unwrap();
            assert_eq!(&out, p, "{alg} page {i}");
        }
        dev.read_page(10, &mut out).unwrap();
        assert!(
            out.iter().all(|&b| b == 0),
            "never-written pages read as zeros"
        );
        let mm = dev.mm_stat();
        assert_eq!(mm.orig_data_size, 5 * 4096);
        assert_eq!(mm.same_pages, 2);
        assert_eq!(
            (mm.huge_pages, mm.huge_pages_since),
            (1, 1),
            "{alg}: noise is huge"
        );
        assert!(dev.entry(3).unwrap().has(SlotFlag::Huge));
        assert!(dev.entry(1).unwrap().has(SlotFlag::Same));
        assert!(mm.compr_data_size > 4096 && mm.compr_data_size < 3 * 4096);
        let pool_pages: u64 = match dev.allocator_stats() {
            PoolStats::Zsmalloc(rows) => rows.iter().map(|r| r.pages_used).sum(),
            other => panic!("not zsmalloc: {other}"),
        };
        assert_eq!(mm.mem_used_total, pool_pages * 4096);
    }
}

#[test]
fn overwrite_frees_the_old_object() {
    let dev = device(4, "lz4");
    dev.write_page(0, &noise(1)).unwrap();
    assert_eq!(dev.mm_stat().huge_pages, 1);
    dev.write_page(0, &page(2)).unwrap();
    let mm = dev.mm_stat();
    assert_eq!(
        (mm.huge_pages, mm.huge_pages_since, mm.orig_data_size),
        (0, 1, 4096)
    );
    dev.write_page(0, &[7; 4096]).unwrap();
    let mm = dev.mm_stat();
    assert_eq!(
        (mm.compr_data_size, mm.same_pages, mm.mem_used_total),
        (0, 1, 0)
    );
}

#[test]
fn partial_writes_read_modify_write() {
    let dev = device(4, "lzo-rle");
    let base = page(9);
    dev.write_page(1, &base).unwrap();
    dev.write_bytes(4096 + 100, b"hello").unwrap();
    dev.write_bytes(4096 * 2 - 2, b"span!").unwrap(); // crosses into page 2
    let mut all = vec![0; 4 * 4096];
    dev.read_bytes(0, &mut all).unwrap();
    let mut expect = vec![0u8; 4 * 4096];
    expect[4096..8192].copy_from_slice(&base);
    expect[4196..4201].copy_from_slice(b"hello");
    expect[8190..8195].copy_from_slice(b"span!");
    assert!(all == expect);
    let mut small = [0u8; 7];
    dev.read_bytes(4096 + 99, &mut small).unwrap();
    assert_eq!(&small, &expect[4195..4202]);
}

#[test]
fn bad_requests_are_refused_and_counted() {
    let dev = device(2, "lz4");
    dev.write_page(0, &page(1)).unwrap();
    assert!(matches!(
        dev.write_page(2, &page(1)),
        Err(ZramError::BadIndex { .. })
    ));
    assert!(matches!(
        dev.write_page(0, &[1; 100]),
        Err(ZramError::BadLength { .. })
    ));
    let mut out = vec![0; 4096];
    assert!(dev.read_page(5, &mut out).is_err());
    // A prefetch is a hint: out of range it does nothing, and it changes no page.
    dev.prefetch(5);
    dev.prefetch(u64::MAX);
    dev.prefetch(0);
    dev.read_page(0, &mut out).unwrap();
    assert!(out == page(1));
    assert!(matches!(
        dev.write_bytes(8190, b"xyz"),
        Err(ZramError::OutOfRange { .. })
    ));
    assert!(dev.read_bytes(u64::MAX - 1, &mut out).is_err());
    assert!(dev.discard(4096, 8192).is_err());
    let io = dev.io_stat();
    assert_eq!((io.failed_writes, io.failed_reads), (2, 1));
    dev.read_page(0, &mut out).unwrap();
    assert_eq!(out, page(1), "refused requests left stored data alone");
    assert!(Device::new(
        4095,
        "lz4".parse().unwrap(),
        Box::new(ZsPool::new(ZsConfig::default()).unwrap())
    )
    .is_err());
}

#[test]
fn discard_frees_whole_pages_only() {
    let dev = device(8, "lzo");
    for i in 0..8 {
        dev.write_page(i, &page(i)).unwrap();
    }
    // Covers page 2 whole and parts of 1 and 3.
    assert_eq!(dev.discard(4096 + 1, 3 * 4096 - 2).unwrap(), 1);
    assert_eq!(dev.io_stat().notify_free, 1);
    let mut out = vec![0; 4096];
    dev.read_page(2, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0));
    for i in [1, 3] {
        dev.read_page(i, &mut out).unwrap();
        assert_eq!(out, page(i));
    }
    assert_eq!(dev.mm_stat().orig_data_size, 7 * 4096);
}

#[test]
fn mem_limit_refuses_and_keeps_old_data() {
    let dev = device(4096, "lz4");
    dev.set_mem_limit(64 * 4096);
    let mut written = 0;
    let err = loop {
        match dev.write_page(written, &noise(written)) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 4096, "the limit never refused");
    };
    assert!(matches!(err, ZramError::MemLimit { .. }), "{err}");
    let mm = dev.mm_stat();
    assert!(mm.mem_used_total <= 64 * 4096);
    assert_eq!(mm.mem_limit, 64 * 4096);
    // Overwriting a page with one that does not fit is refused and keeps the old content:
    // the new object is allocated before the old one is freed, as in the kernel.
    let before = dev.mm_stat();
    assert!(matches!(
        dev.write_page(0, &noise(999)),
        Err(ZramError::MemLimit { .. })
    ));
    let mut out = vec![0; 4096];
    for i in 0..written {
        dev.read_page(i, &mut out).unwrap();
        assert_eq!(out, noise(i), "page {i}");
    }
    assert_eq!(dev.mm_stat().orig_data_size, before.orig_data_size);
    // Same-filled pages need no memory, so they are still accepted.
    dev.write_page(written, &[0; 4096]).unwrap();
    assert!(dev.io_stat().failed_writes >= 1);
}

#[test]
fn reset_and_compact() {
    let dev = device(2000, "lzo-rle");
    for i in 0..2000 {
        dev.write_page(i, &page(i)).unwrap();
    }
    for i in (1..2000).step_by(2) {
        dev.discard_page(i).unwrap();
    }
    let before = dev.mm_stat();
    let freed = dev.compact();
    let after = dev.mm_stat();
    assert!(freed > 0);
    assert_eq!(after.mem_used_total, before.mem_used_total - freed * 4096);
    assert_eq!(after.pages_compacted, freed);
    let mut out = vec![0; 4096];
    for i in (0..2000).step_by(2) {
        dev.read_page(i, &mut out).unwrap();
        assert_eq!(out, page(i), "page {i} after compaction");
    }
    dev.reset();
    let mm = dev.mm_stat();
    assert_eq!(
        (mm.orig_data_size, mm.compr_data_size, mm.mem_used_total),
        (0, 0, 0)
    );
    dev.read_page(0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0));
}

/// Writers overwriting and discarding, a reader, and a compactor that runs without pause
/// until the workers are done: every read sees a whole page once written, and compaction
/// really moves objects (it frees pages) while the writers run. Each writer notes the pages
/// compaction had freed when it finished; the last of those notes counts only passes that
/// ended before the writers did (the full device frees nothing before they start), so a
/// pass after them, over the zspages their discards left half empty, cannot earn it.
#[test]
fn compaction_moves_pages_beside_writers_and_readers() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dev = device(4096, "lz4");
    for i in 0..4096u64 {
        dev.write_page(i, &page(i * 10)).unwrap();
    }
    let done = AtomicBool::new(false);
    let freed_so_far = AtomicU64::new(0);
    let (compacted, beside_writers) = std::thread::scope(|s| {
        let dev = &dev;
        let done = &done;
        let freed_so_far = &freed_so_far;
        let compactor = s.spawn(move || {
            let mut freed = 0;
            while !done.load(Ordering::Relaxed) {
                let f = dev.compact();
                freed_so_far.fetch_add(f, Ordering::Relaxed);
                freed += f;
                std::thread::yield_now();
            }
            freed
        });
        let mut writers = Vec::new();
        for t in 0..4u64 {
            writers.push(s.spawn(move || {
                let mut out = vec![0; 4096];
                for round in 1..3u64 {
                    for i in (t..4096).step_by(4) {
                        if i % 2 == 1 {
                            // Odd pages go: their zspages are left half empty.
                            dev.discard_page(i).unwrap();
                        } else {
                            dev.write_page(i, &page(i * 10 + round)).unwrap();
                        }
                    }
                    for i in (t..4096).step_by(4).filter(|i| i % 2 == 0) {
                        dev.read_page(i, &mut out).unwrap();
                        assert_eq!(out, page(i * 10 + round));
                    }
                }
                freed_so_far.load(Ordering::Relaxed)
            }));
        }
        // A reader of slots others are writing: each read sees some whole page ever written.
        let reader = s.spawn(move || {
            let mut out = vec![0; 4096];
            for i in 0..4096u64 {
                dev.read_page(i, &mut out).unwrap();
                assert!(out.iter().all(|&b| b == 0) || (0..3).any(|r| out == page(i * 10 + r)));
            }
        });
        // Stop the compactor even when a worker failed, so a failure is reported, not hung.
        let results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        let read = reader.join();
        done.store(true, Ordering::Relaxed);
        let freed = compactor.join().unwrap();
        read.unwrap();
        let noted = results.into_iter().map(|r| r.unwrap()).max().unwrap();
        (freed, noted)
    });
    assert!(
        beside_writers > 0,
        "compaction freed no page while the writers ran ({compacted} after them)"
    );
    let mm = dev.mm_stat();
    assert_eq!(mm.pages_compacted, compacted);
    assert_eq!(mm.orig_data_size, 2048 * 4096);
    let mut out = vec![0; 4096];
    for i in (0..4096u64).step_by(2) {
        dev.read_page(i, &mut out).unwrap();
        assert_eq!(out, page(i * 10 + 2), "page {i} after compaction");
    }
}

/// Eight threads each write their own 512-byte sector of the same pages, round after round:
/// the read-modify-write of a sub-page write must not lose another thread's sector.
#[test]
fn sub_page_writes_to_one_page_lose_nothing() {
    const SECTOR: usize = 512;
    const ROUNDS: u64 = 200;
    let dev = device(4, "lzo-rle");
    std::thread::scope(|s| {
        for sector in 0..8u64 {
            let dev = &dev;
            s.spawn(move || {
                for round in 0..ROUNDS {
                    for p in 0..4u64 {
                        let data = pattern(sector << 32 | round << 8 | p, SECTOR);
                        dev.write_bytes(p * 4096 + sector * SECTOR as u64, &data)
                            .unwrap();
                    }
                }
            });
        }
    });
    let mut out = vec![0; 4096];
    for p in 0..4u64 {
        dev.read_page(p, &mut out).unwrap();
        for (sector, got) in out.chunks(SECTOR).enumerate() {
            let last = pattern((sector as u64) << 32 | (ROUNDS - 1) << 8 | p, SECTOR);
            assert_eq!(got, last, "page {p} sector {sector}: a write was lost");
        }
    }
}

/// A reset racing writers leaves counters that agree with the slots: whatever each write
/// left behind is counted, nothing more.
#[test]
fn reset_is_exclusive_with_io() {
    let dev = device(64, "lz4");
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let dev = &dev;
            s.spawn(move || {
                for round in 0..2000u64 {
                    dev.write_page(t * 32 + round % 32, &page(round)).unwrap();
                }
            });
        }
        let dev = &dev;
        s.spawn(move || {
            for _ in 0..200 {
                dev.reset();
                std::thread::yield_now();
            }
        });
    });
    let (mut stored, mut compressed) = (0, 0);
    for i in 0..64 {
        let e = dev.entry(i).unwrap();
        if e.is_allocated() {
            stored += 1;
            compressed += e.size() as u64;
        }
    }
    let mm = dev.mm_stat();
    assert_eq!(mm.orig_data_size, stored * 4096, "orig_data_size");
    assert_eq!(mm.compr_data_size, compressed, "compr_data_size");
    dev.reset();
    assert_eq!(dev.mm_stat().mem_used_total, 0);
}

/// A disk whose slot table could not fit in memory is refused with an error, not an abort.
#[test]
fn a_disk_too_large_for_its_table_is_refused() {
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    let r = Device::new(1 << 50, "lz4".parse().unwrap(), Box::new(pool));
    assert!(
        matches!(r, Err(ZramError::DiskTooLarge { .. })),
        "{:?}",
        r.err()
    );
}

/// A multi-page write that hits the memory limit part way says how much it stored; those
/// pages hold the new data, and the rest are as they were.
#[test]
fn a_write_failing_part_way_says_what_it_stored() {
    let dev = device(64, "lz4");
    let old = page(7);
    for i in 0..64 {
        dev.write_page(i, &old).unwrap();
    }
    let used = dev.mm_stat().mem_used_total;
    // Room for a few more huge pages, not for 64.
    dev.set_mem_limit(used + 4 * 4096);
    let data: Vec<u8> = (0..64).flat_map(noise).collect();
    let err = dev.write_bytes(0, &data).unwrap_err();
    let ZramError::PartialWrite { stored, source, .. } = err else {
        panic!("expected a partial write, got {err}");
    };
    assert!(matches!(*source, ZramError::MemLimit { .. }), "{source}");
    assert!(
        stored > 0 && stored % 4096 == 0 && stored < data.len(),
        "{stored}"
    );
    let mut out = vec![0; 4096];
    for i in 0..64u64 {
        dev.read_page(i, &mut out).unwrap();
        let at = i as usize * 4096;
        if at < stored {
            assert_eq!(out, data[at..at + 4096], "page {i} was stored");
        } else {
            assert_eq!(out, old, "page {i} is unchanged");
        }
    }
}

/// More threads than the device has shards (16), so threads share one: writes, reads,
/// discards and stat readings side by side must neither deadlock nor lose a count.
#[test]
fn more_threads_than_shards_keep_exact_counts() {
    const THREADS: u64 = 40;
    const PER_THREAD: u64 = 64;
    let dev = device(THREADS * PER_THREAD, "lzo-rle");
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let dev = &dev;
            s.spawn(move || {
                let mut out = vec![0; 4096];
                let pages = t * PER_THREAD..(t + 1) * PER_THREAD;
                for round in 0..3u64 {
                    for i in pages.clone() {
                        // A mix of compressed, same-filled and huge pages.
                        let data = match i % 3 {
                            0 => page(i * 10 + round),
                            1 => vec![round as u8; 4096],
                            _ => noise(i * 10 + round),
                        };
                        dev.write_page(i, &data).unwrap();
                        dev.read_page(i, &mut out).unwrap();
                        assert_eq!(out, data);
                    }
                    let _ = dev.mm_stat();
                }
                // Leave every other page discarded.
                for i in pages.step_by(2) {
                    dev.discard_page(i).unwrap();
                }
            });
        }
    });
    let kept = THREADS * PER_THREAD / 2;
    let mm = dev.mm_stat();
    assert_eq!(mm.orig_data_size, kept * 4096);
    // Of the kept (odd) pages, i % 3 == 1 are same-filled and i % 3 == 2 are huge.
    let odd = || (1..THREADS * PER_THREAD).step_by(2);
    assert_eq!(mm.same_pages, odd().filter(|i| i % 3 == 1).count() as u64);
    assert_eq!(mm.huge_pages, odd().filter(|i| i % 3 == 2).count() as u64);
    assert_eq!(dev.io_stat().notify_free, kept);
    dev.reset();
    assert_eq!(dev.mm_stat().orig_data_size, 0);
    assert_eq!(dev.mm_stat().mem_used_total, 0);
}

#[derive(Debug, Clone)]
enum Op {
    Write { page: u64, seed: u64, kind: u8 },
    WriteBytes { offset: u64, len: usize, seed: u64 },
    Read { page: u64 },
    Discard { page: u64 },
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..32u64, any::<u64>(), 0..4u8).prop_map(|(page, seed, kind)| Op::Write { page, seed, kind }),
        2 => (0..32 * 4096u64, 1..9000usize, any::<u64>()).prop_map(|(offset, len, seed)| Op::WriteBytes { offset, len, seed }),
        4 => (0..32u64).prop_map(|page| Op::Read { page }),
        2 => (0..32u64).prop_map(|page| Op::Discard { page }),
        1 => Just(Op::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn matches_a_model(alg in prop_oneof![Just("lz4"), Just("lzo-rle"), Just("zstd")],
                       ops in proptest::collection::vec(op(), 1..120)) {
        let dev = device(32, alg);
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let zero = vec![0u8; 4096];
        let mut out = vec![0u8; 4096];
        for op in ops {
            match op {
                Op::Write { page: p, seed, kind } => {
                    let data = match kind { 0 => page(seed), 1 => noise(seed), 2 => vec![seed as u8; 4096], _ => zero.clone() };
                    dev.write_page(p, &data).unwrap();
                    model.insert(p, data);
                }
                Op::WriteBytes { offset, len, seed } => {
                    let len = len.min((32 * 4096 - offset) as usize);
                    let data: Vec<u8> = page(seed).iter().cycle().take(len).copied().collect();
                    dev.write_bytes(offset, &data).unwrap();
                    for (k, b) in data.iter().enumerate() {
                        let pos = offset + k as u64;
                        model.entry(pos / 4096).or_insert_with(|| zero.clone())[(pos % 4096) as usize] = *b;
                    }
                }
                Op::Read { page: p } => {
                    dev.read_page(p, &mut out).unwrap();
                    prop_assert_eq!(&out, model.get(&p).unwrap_or(&zero));
                }
                Op::Discard { page: p } => {
                    dev.discard_page(p).unwrap();
                    model.remove(&p);
                }
                Op::Compact => { dev.compact(); }
            }
            prop_assert_eq!(dev.mm_stat().orig_data_size, model.len() as u64 * 4096);
        }
        for p in 0..32 {
            dev.read_page(p, &mut out).unwrap();
            prop_assert_eq!(&out, model.get(&p).unwrap_or(&zero));
            dev.discard_page(p).unwrap();
        }
        prop_assert_eq!(dev.mm_stat().mem_used_total, 0);
    }
}

/// zram passes the block-device conformance suite, at 4 KiB and 16 KiB pages.
#[test]
fn is_a_block_device() {
    ztier_blockdev::testing::run_all(&device(64, "lz4"));
    let pool = ZsPool::new(ZsConfig {
        page_size: 16384,
        ..ZsConfig::default()
    })
    .unwrap();
    let dev = Device::new(64 * 16384, "zstd".parse().unwrap(), Box::new(pool)).unwrap();
    ztier_blockdev::testing::run_all(&dev);
}

/// Block status tells holes (never written, discarded), stored zeros and data apart, and a
/// zeroed range is a hole only when unmapping was allowed.
#[test]
fn block_status_follows_the_slots() {
    use ztier_blockdev::{BlockDevice, BlockError, Extent};
    let dev = device(8, "lz4");
    dev.write_page(1, &page(1)).unwrap();
    dev.write_page(2, &[0; 4096]).unwrap();
    dev.write_page(3, &page(3)).unwrap();
    BlockDevice::write_zeroes(&dev, 3 * 4096, 4096, false).unwrap();
    dev.write_page(4, &page(4)).unwrap();
    BlockDevice::write_zeroes(&dev, 4 * 4096, 4096, true).unwrap();
    let e = |len, hole, zero| Extent { len, hole, zero };
    assert_eq!(
        dev.block_status(0, 8 * 4096).unwrap(),
        vec![
            e(4096, true, true),
            e(4096, false, false),
            e(2 * 4096, false, true),
            e(4 * 4096, true, true),
        ]
    );
    // A write past the memory limit is ENOSPC.
    dev.set_mem_limit(4096);
    let err = BlockDevice::write_at(&dev, 5 * 4096, &noise(5), false).unwrap_err();
    assert_eq!(err.errno(), 28, "{err}");
    // zram's own error is kept whole under the kind, not flattened to its words.
    let BlockError::NoSpace(cause) = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(
            cause.downcast_ref::<ZramError>(),
            Some(ZramError::MemLimit { .. })
        ),
        "{err}"
    );
}
