//! Thin volumes of one shared store. The properties held:
//! - a volume passes the block-device conformance suite;
//! - every read of every volume equals a model of it (a `Vec<u8>` a volume) over any mix of
//!   writes, reads, discards, zeroings and volumes dropped and made again, and the store's
//!   free and held extents always add up to its extents, the held ones to the volumes' own;
//! - a volume never reads what another wrote: an extent taken after another volume wrote
//!   and dropped it reads as zeros but for what the new owner wrote, even on a store whose
//!   discard keeps the bytes;
//! - a full store refuses a write to a new extent with ENOSPC and leaves every volume as it
//!   was;
//! - an extent goes back to the store only once the I/O in flight to it is done;
//! - a volume's map survives a restart through its bytes, and a restore that would share or
//!   invent an extent, or a map that is corrupt or cut short, is refused by name;
//! - threads writing and verifying several volumes at once over a file lose nothing;
//! - a volume's metadata follows what it holds, not its virtual size.

use std::sync::Arc;

use proptest::prelude::*;
use ztier_blockdev::file::FileDevice;
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::{pattern, Faulty};
use ztier_blockdev::thin::{Destroyed, ThinError, ThinStore, Volume, VolumeMap};
use ztier_blockdev::{BlockDevice, BlockError};

const BLOCK: u64 = 4096;
/// Small extents, so that short requests cross them.
const EXTENT: u64 = 4 * BLOCK;

/// A store that cannot discard: what an earlier owner of an extent wrote stays there after
/// the volume's best-effort discard of it, so a volume that could read it would be caught.
struct NoDiscard(MemoryDevice);

impl BlockDevice for NoDiscard {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        self.0.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        self.0.write_at(offset, data, fua)
    }
    fn discard(&self, _offset: u64, _len: u64) -> ztier_blockdev::Result<()> {
        Err(BlockError::Unsupported("discard"))
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.0.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        Ok(())
    }
}

fn store_of(extents: u64) -> (Arc<NoDiscard>, Arc<ThinStore>) {
    let device = Arc::new(NoDiscard(MemoryDevice::new(extents * EXTENT).unwrap()));
    let store = ThinStore::new(device.clone(), EXTENT).unwrap();
    (device, store)
}

fn read(dev: &dyn BlockDevice, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0xEE; len as usize];
    dev.read_at(offset, &mut buf).unwrap();
    buf
}

#[test]
fn a_volume_passes_the_conformance_suite() {
    let device = Arc::new(MemoryDevice::new(80 * EXTENT).unwrap());
    let store = ThinStore::new(device, EXTENT).unwrap();
    // A size that is not a whole number of extents: the last one is cut short.
    let volume = store.volume(64 * EXTENT + 3 * BLOCK);
    ztier_blockdev::testing::run_all(&volume);
    // The suite zeroes what it wrote with unmap: nothing is left held.
    assert_eq!(store.used_extents(), 0);
    assert_eq!(volume.mapped_bytes(), 0);
}

#[test]
fn bad_extent_sizes_are_refused() {
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(64 * BLOCK).unwrap());
    for bad in [0, 3, 2048, 3 * BLOCK] {
        assert!(
            matches!(
                ThinStore::new(device.clone(), bad),
                Err(ThinError::ExtentSize { .. })
            ),
            "{bad}"
        );
    }
    // A tail shorter than an extent is unused; a store smaller than one has none.
    assert_eq!(
        ThinStore::new(device.clone(), 16 * BLOCK)
            .unwrap()
            .extents(),
        4
    );
    assert_eq!(
        ThinStore::new(device.clone(), 32 * BLOCK)
            .unwrap()
            .extents(),
        2
    );
    let none = ThinStore::new(device, 128 * BLOCK).unwrap();
    assert_eq!(none.extents(), 0);
    let err = none.volume(EXTENT).write_at(0, &[1], false).unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        vol: usize,
        off: u64,
        len: u64,
        seed: u64,
    },
    Read {
        vol: usize,
        off: u64,
        len: u64,
    },
    Discard {
        vol: usize,
        off: u64,
        len: u64,
    },
    Zeroes {
        vol: usize,
        off: u64,
        len: u64,
        unmap: bool,
    },
    Drop {
        vol: usize,
    },
}

const VOLUMES: usize = 3;
/// Volume sizes: one of whole extents, one cut short, one smaller than the store can hold
/// the others' worth of beside it.
const SIZES: [u64; VOLUMES] = [8 * EXTENT, 5 * EXTENT + 3 * BLOCK + 100, 6 * EXTENT];
/// Fewer extents than the volumes' sum (19): the store fills, and NoSpace is exercised.
const STORE_EXTENTS: u64 = 12;

/// A range of volume `vol`, weighted towards short ones near extent boundaries.
fn range() -> impl Strategy<Value = (usize, u64, u64)> {
    (0..VOLUMES).prop_flat_map(|vol| {
        let size = SIZES[vol];
        prop_oneof![
            3 => (0..size).prop_flat_map(move |off| (Just(off), 1..=(size - off).min(3 * BLOCK))),
            1 => (0..size / EXTENT).prop_flat_map(move |e| {
                let off = e * EXTENT;
                (Just(off), 1..=(size - off).min(3 * EXTENT))
            }),
        ]
        .prop_map(move |(off, len)| (vol, off, len))
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (range(), any::<u64>()).prop_map(|((vol, off, len), seed)| Op::Write { vol, off, len, seed }),
        3 => range().prop_map(|(vol, off, len)| Op::Read { vol, off, len }),
        2 => range().prop_map(|(vol, off, len)| Op::Discard { vol, off, len }),
        2 => (range(), any::<bool>()).prop_map(|((vol, off, len), unmap)| Op::Zeroes { vol, off, len, unmap }),
        1 => (0..VOLUMES).prop_map(|vol| Op::Drop { vol }),
    ]
}

/// Runs `ops` on volumes of one small store against a model of each.
fn check_against_model(ops: &[Op]) {
    let (_, store) = store_of(STORE_EXTENTS);
    let mut volumes: Vec<Volume> = SIZES.iter().map(|&s| store.volume(s)).collect();
    let mut models: Vec<Vec<u8>> = SIZES.iter().map(|&s| vec![0; s as usize]).collect();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Write {
                vol,
                off,
                len,
                seed,
            } => {
                let data = pattern(seed, len as usize);
                match volumes[vol].write_at(off, &data, false) {
                    Ok(()) => {
                        models[vol][off as usize..(off + len) as usize].copy_from_slice(&data)
                    }
                    Err(e) => {
                        // Only a full store refuses, and only a write that needs a new extent;
                        // the pieces before the refusal landed.
                        let (done, source) = match e {
                            BlockError::Partial { done, source } => (done, *source),
                            other => (0, other),
                        };
                        assert!(matches!(source, BlockError::NoSpace(_)), "op {i}: {source}");
                        assert_eq!(store.free_extents(), 0, "op {i}: NoSpace with room left");
                        models[vol][off as usize..(off + done) as usize]
                            .copy_from_slice(&data[..done as usize]);
                    }
                }
            }
            Op::Read { vol, off, len } => {
                let back = read(&volumes[vol], off, len);
                let want = &models[vol][off as usize..(off + len) as usize];
                if let Some(at) = back.iter().zip(want).position(|(b, w)| b != w) {
                    panic!(
                        "op {i}: volume {vol} byte {} reads {:#04x}, not {:#04x}",
                        off + at as u64,
                        back[at],
                        want[at]
                    );
                }
            }
            Op::Discard { vol, off, len } => {
                // Whole extents are unmapped (their store discard, best effort, fails);
                // the store refuses the partial pieces' discard, which the volume passes on.
                if let Err(e) = volumes[vol].discard(off, len) {
                    assert_eq!(e.errno(), libc::EOPNOTSUPP, "op {i}: {e}");
                }
                // Whatever was discarded reads as zeros or as it did: make it zeros.
                volumes[vol].write_zeroes(off, len, false).unwrap();
                models[vol][off as usize..(off + len) as usize].fill(0);
            }
            Op::Zeroes {
                vol,
                off,
                len,
                unmap,
            } => {
                volumes[vol].write_zeroes(off, len, unmap).unwrap();
                models[vol][off as usize..(off + len) as usize].fill(0);
            }
            Op::Drop { vol } => {
                volumes[vol] = store.volume(SIZES[vol]);
                models[vol].fill(0);
            }
        }
        let held: u64 = volumes.iter().map(|v| v.mapped_bytes() / EXTENT).sum();
        assert_eq!(store.used_extents(), held, "op {i}: held extents");
        assert_eq!(
            store.free_extents() + store.used_extents(),
            STORE_EXTENTS,
            "op {i}"
        );
    }
    for (vol, volume) in volumes.iter().enumerate() {
        assert_eq!(
            read(volume, 0, SIZES[vol]),
            models[vol],
            "volume {vol} at the end"
        );
    }
    drop(volumes);
    assert_eq!(store.free_extents(), STORE_EXTENTS);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn volumes_read_as_their_models(ops in proptest::collection::vec(op(), 1..120)) {
        check_against_model(&ops);
    }
}

#[test]
fn an_extent_another_volume_wrote_reads_as_zeros_to_its_next_owner() {
    let (device, store) = store_of(1);
    let first = store.volume(EXTENT);
    first
        .write_at(0, &vec![0xAB; EXTENT as usize], false)
        .unwrap();
    assert_eq!(
        first.destroy(),
        Destroyed {
            extents: 1,
            failed_discards: 1
        }
    );
    // The store kept the bytes: it could not discard them.
    assert!(read(device.as_ref(), 0, EXTENT).iter().all(|&b| b == 0xAB));

    let second = store.volume(EXTENT);
    second.write_at(BLOCK + 10, b"mine", false).unwrap();
    assert_eq!(store.used_extents(), 1);
    let mut want = vec![0; EXTENT as usize];
    want[BLOCK as usize + 10..BLOCK as usize + 14].copy_from_slice(b"mine");
    assert_eq!(read(&second, 0, EXTENT), want);
}

#[test]
fn a_full_store_refuses_new_extents_and_keeps_every_volume() {
    let (_, store) = store_of(3);
    let a = store.volume(4 * EXTENT);
    let b = store.volume(4 * EXTENT);
    a.write_at(0, &pattern(1, EXTENT as usize + 1), false)
        .unwrap();
    b.write_at(EXTENT, &pattern(2, 100), false).unwrap();
    assert_eq!(store.free_extents(), 0);

    let err = b.write_at(3 * EXTENT, &[9; 10], false).unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("shared store"), "{err}");
    // A write that reaches a held extent first says how much of it landed.
    let err = b.write_at(2 * EXTENT - 5, &[7; 10], false).unwrap_err();
    assert!(matches!(err, BlockError::Partial { done: 5, .. }), "{err}");
    // Writes inside held extents still go through.
    a.write_at(EXTENT + 3, b"ok", false).unwrap();

    let mut a_model = pattern(1, EXTENT as usize + 1);
    a_model.resize(4 * EXTENT as usize, 0);
    a_model[EXTENT as usize + 3..EXTENT as usize + 5].copy_from_slice(b"ok");
    assert_eq!(read(&a, 0, 4 * EXTENT), a_model);
    let mut b_model = vec![0; 4 * EXTENT as usize];
    b_model[EXTENT as usize..EXTENT as usize + 100].copy_from_slice(&pattern(2, 100));
    b_model[2 * EXTENT as usize - 5..2 * EXTENT as usize].fill(7);
    assert_eq!(read(&b, 0, 4 * EXTENT), b_model);
    assert_eq!(store.used_extents(), 3);

    // Space given back by one volume is the other's to take.
    a.discard(0, 2 * EXTENT).unwrap();
    assert_eq!(store.free_extents(), 2);
    b.write_at(3 * EXTENT, &[9; 10], false).unwrap();
    assert_eq!(read(&b, 3 * EXTENT, 10), [9; 10]);
}

/// A volume's limit refuses its own first writes past it, and no other volume's: one tenant
/// cannot fill the store its neighbours write back to.
#[test]
fn a_volume_past_its_limit_is_refused_alone() {
    let (_, store) = store_of(8);
    let greedy = store.volume(8 * EXTENT);
    let quiet = store.volume(8 * EXTENT);
    assert_eq!(greedy.limit(), None);
    // Rounded down to whole extents.
    greedy.set_limit(Some(2 * EXTENT + 100));
    assert_eq!(greedy.limit(), Some(2 * EXTENT));
    greedy.write_at(0, &pattern(1, 10), false).unwrap();
    greedy.write_at(5 * EXTENT, &pattern(2, 10), false).unwrap();
    let err = greedy.write_at(3 * EXTENT, &[9; 10], false).unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
    assert_eq!(err.errno(), libc::ENOSPC);
    assert!(err.to_string().contains("its limit"), "{err}");
    assert_eq!(read(&greedy, 3 * EXTENT, 10), [0; 10], "nothing landed");
    // Inside what it holds, it writes on; the store's room is the others'.
    greedy.write_at(5 * EXTENT + 20, b"more", false).unwrap();
    for e in 0..6 {
        quiet
            .write_at(e * EXTENT, &pattern(10 + e, 10), false)
            .unwrap();
    }
    assert_eq!(store.free_extents(), 0);
    // A limit lowered under what it holds takes nothing away and lets nothing more in.
    greedy.set_limit(Some(EXTENT));
    assert_eq!(greedy.mapped_bytes(), 2 * EXTENT);
    assert_eq!(read(&greedy, 0, 10), pattern(1, 10));
    // A discard gives an extent back to the store; the volume, still at its limit, may
    // not take it back; the neighbour may.
    greedy.discard(0, EXTENT).unwrap();
    let err = greedy.write_at(0, &[1; 10], false).unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
    quiet.write_at(7 * EXTENT, &[3; 10], false).unwrap();
    // No limit: the store's room is the only one.
    greedy.set_limit(None);
    let err = greedy.write_at(0, &[1; 10], false).unwrap_err();
    assert!(err.to_string().contains("shared store"), "{err}");
    for e in 0..6 {
        assert_eq!(read(&quiet, e * EXTENT, 10), pattern(10 + e, 10));
    }
}

#[test]
fn an_extent_is_given_back_only_after_its_io_in_flight() {
    let faulty = Arc::new(Faulty::new(MemoryDevice::new(EXTENT).unwrap()));
    let store = ThinStore::new(faulty.clone(), EXTENT).unwrap();
    let a = store.volume(EXTENT);
    let b = store.volume(EXTENT);
    a.write_at(0, &[5; 64], false).unwrap();
    faulty.stall(true);
    // Looked at while the read is held, asserted once it is let go (a failed assertion
    // with the read still stalled would never end the test).
    let (free_meanwhile, b_meanwhile, a_read) = std::thread::scope(|s| {
        let reader = s.spawn(|| read(&a, 0, 64));
        let stalled = faulty.wait_for_stalled_reads(1, std::time::Duration::from_secs(60));
        let discarder = s.spawn(|| a.discard(0, EXTENT).unwrap());
        // The discard has begun once the extent no longer shows as data.
        while stalled && !a.block_status(0, EXTENT).unwrap()[0].hole {
            std::thread::yield_now();
        }
        let free = store.free_extents();
        // Were the extent given back now, b would take it and write it before a's read.
        let b_write = b.write_at(0, &[6; 64], false);
        faulty.stall(false);
        discarder.join().unwrap();
        (free, b_write, reader.join().unwrap())
    });
    assert_eq!(free_meanwhile, 0, "given back under a read in flight");
    let err = b_meanwhile.unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
    assert_eq!(a_read, [5; 64], "a's read saw another volume's bytes");
    assert_eq!(store.free_extents(), 1);
    b.write_at(0, &[6; 64], false).unwrap();
    assert_eq!(read(&a, 0, 64), [0; 64]);
}

/// Bytes of a map as `to_bytes` writes them, from raw fields (for maps no volume makes).
fn crafted(extent_size: u64, entries: &[(u64, u64)]) -> Vec<u8> {
    let mut out = b"ZTTHINMP".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&extent_size.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for &(v, s) in entries {
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&s.to_le_bytes());
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

#[test]
fn a_volume_map_survives_a_restart_and_bad_ones_are_refused() {
    let device = Arc::new(MemoryDevice::new(16 * EXTENT).unwrap());
    let (a_bytes, b_bytes, a_data, b_data) = {
        let store = ThinStore::new(device.clone(), EXTENT).unwrap();
        let a = store.volume(8 * EXTENT);
        let b = store.volume(8 * EXTENT);
        let a_data = pattern(10, 5 * EXTENT as usize);
        let b_data = pattern(11, 3 * EXTENT as usize + 77);
        a.write_at(EXTENT / 2, &a_data, false).unwrap();
        b.write_at(4 * EXTENT + 9, &b_data, false).unwrap();
        let a_map = a.close();
        assert_eq!(a_map.entries().len(), 6);
        assert_eq!(
            store.used_extents(),
            6 + 4,
            "a closed volume's extents stay held"
        );
        (a_map.to_bytes(), b.close().to_bytes(), a_data, b_data)
    };

    // The next process: a new pool over the same store.
    let store = ThinStore::new(device.clone(), EXTENT).unwrap();
    let a = store
        .restore(8 * EXTENT, &VolumeMap::from_bytes(&a_bytes).unwrap())
        .unwrap();
    let b_map = VolumeMap::from_bytes(&b_bytes).unwrap();
    let b = store.restore(8 * EXTENT, &b_map).unwrap();
    assert_eq!(read(&a, EXTENT / 2, a_data.len() as u64), a_data);
    assert_eq!(read(&b, 4 * EXTENT + 9, b_data.len() as u64), b_data);
    assert_eq!(
        read(&b, 0, 4 * EXTENT + 9),
        vec![0; 4 * EXTENT as usize + 9]
    );
    assert_eq!(store.used_extents(), 10);
    assert_eq!(a.map().to_bytes(), a_bytes);

    // Refusals, each changing nothing.
    let refused = |size: u64, bytes: &[u8]| {
        let map = VolumeMap::from_bytes(bytes).unwrap();
        store.restore(size, &map).map(drop).unwrap_err()
    };
    assert!(matches!(
        refused(8 * EXTENT, &b_bytes),
        ThinError::StoreExtentHeld { .. }
    ));
    let free = b_map.entries()[0].1;
    drop(b);
    assert!(matches!(
        refused(8 * EXTENT, &crafted(EXTENT, &[(0, free), (1, free)])),
        ThinError::StoreExtentTwice { .. }
    ));
    assert!(matches!(
        refused(8 * EXTENT, &crafted(EXTENT, &[(0, 16)])),
        ThinError::StoreExtentOutOfRange {
            extent: 16,
            extents: 16
        }
    ));
    assert!(matches!(
        refused(3 * EXTENT + 1, &crafted(EXTENT, &[(4, free)])),
        ThinError::VolumeExtentOutOfRange {
            extent: 4,
            extents: 4
        }
    ));
    assert!(matches!(
        refused(8 * EXTENT, &crafted(2 * EXTENT, &[(0, free)])),
        ThinError::ExtentSizeMismatch { .. }
    ));
    // One good entry and one held: the good one is not claimed either.
    let held = a.map().entries()[0].1;
    assert!(matches!(
        refused(8 * EXTENT, &crafted(EXTENT, &[(0, free), (1, held)])),
        ThinError::StoreExtentHeld { extent } if extent == held
    ));
    assert_eq!(store.used_extents(), 6);

    // Corrupt and cut-short bytes.
    let mut bad = a_bytes.clone();
    bad[40] ^= 1;
    assert!(matches!(
        VolumeMap::from_bytes(&bad),
        Err(ThinError::Checksum { .. })
    ));
    assert!(matches!(
        VolumeMap::from_bytes(&a_bytes[..a_bytes.len() - 1]),
        Err(ThinError::Truncated(_))
    ));
    assert!(matches!(
        VolumeMap::from_bytes(&[]),
        Err(ThinError::Truncated(_))
    ));
    assert!(matches!(
        VolumeMap::from_bytes(&crafted(EXTENT, &[(3, 1), (3, 2)])),
        Err(ThinError::VolumeExtentOrder { extent: 3 })
    ));
}

#[test]
fn threads_write_and_verify_volumes_over_a_file() {
    let dir = std::env::temp_dir().join(format!("ztier-blockdev-thin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store");
    let _ = std::fs::remove_file(&path);
    const EXTENT: u64 = 64 << 10;
    const THREADS: u64 = 4;
    const VOLUME: u64 = 16 * EXTENT;
    let file: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, 40 * EXTENT).unwrap());
    let store = ThinStore::new(file, EXTENT).unwrap();
    // Two volumes, each written by two threads at once (interleaved 4 KiB blocks), so the
    // threads race to fill the same extents; the volumes together need 32 of the 40.
    let volumes = [store.volume(VOLUME), store.volume(VOLUME)];
    let rounds_done = [std::sync::Barrier::new(2), std::sync::Barrier::new(2)];
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let volume = &volumes[(t / 2) as usize];
            let round_done = &rounds_done[(t / 2) as usize];
            let half = t % 2;
            s.spawn(move || {
                for round in 0..3u64 {
                    for block in (half..VOLUME / BLOCK).step_by(2) {
                        let data = pattern(round << 32 | t << 24 | block, BLOCK as usize);
                        volume.write_at(block * BLOCK, &data, false).unwrap();
                    }
                    for block in (half..VOLUME / BLOCK).step_by(2) {
                        let want = pattern(round << 32 | t << 24 | block, BLOCK as usize);
                        assert_eq!(
                            read(volume, block * BLOCK, BLOCK),
                            want,
                            "thread {t} block {block}"
                        );
                    }
                    // Give half of them back (both threads' blocks, once both have
                    // checked theirs) and take them again next round.
                    round_done.wait();
                    if half == 0 && round < 2 {
                        volume.discard(0, VOLUME / 2).unwrap();
                    }
                    round_done.wait();
                }
            });
        }
    });
    for (v, volume) in volumes.iter().enumerate() {
        for block in 0..VOLUME / BLOCK {
            let t = v as u64 * 2 + block % 2;
            assert_eq!(
                read(volume, block * BLOCK, BLOCK),
                pattern(2 << 32 | t << 24 | block, BLOCK as usize),
                "volume {v} block {block}"
            );
        }
        assert_eq!(volume.mapped_bytes(), VOLUME);
    }
    assert_eq!(store.used_extents(), 32);
    drop(volumes);
    assert_eq!(store.free_extents(), 40);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn metadata_follows_what_a_volume_holds_not_its_size() {
    let device = Arc::new(MemoryDevice::new(128 << 20).unwrap());
    let store = ThinStore::new(device, 1 << 20).unwrap();
    let volume = store.volume(64 << 30);
    assert_eq!(volume.metadata_bytes(), 0);
    for gib in [0u64, 7, 33, 63] {
        volume.write_at(gib << 30, &[1; 4096], false).unwrap();
    }
    let held = volume.metadata_bytes();
    assert_eq!(volume.mapped_bytes(), 4 << 20);
    assert!(held > 0 && held <= 256, "{held} bytes for 4 extents");
    println!("metadata: {held} bytes for 4 mapped extents of a 64 GiB volume");
    // Each of 64 extents, then all given back: the map shrinks again.
    for e in 0..64u64 {
        volume.write_at(e << 20, &[1], false).unwrap();
    }
    let full = volume.metadata_bytes();
    println!(
        "metadata: {full} bytes for 64 mapped extents ({} a mapped extent)",
        full / 64
    );
    assert!(full <= 64 * 64, "{full}");
    volume.discard(0, 64 << 30).unwrap();
    assert_eq!(volume.mapped_bytes(), 0);
    assert_eq!(volume.metadata_bytes(), 0, "after every extent went");
}

proptest! {
    /// Any bytes, or a valid map's bytes changed at a few places (by XOR, or cut short), are
    /// refused by name or accepted; an accepted map is written back byte for byte, its
    /// volume extents in order.
    #[test]
    fn map_bytes_are_accepted_whole_or_refused(
        entries in proptest::collection::btree_map(any::<u64>(), any::<u64>(), 0..20),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in any::<Option<usize>>(),
        raw in proptest::collection::vec(any::<u8>(), 0..200),
        use_raw in any::<bool>(),
    ) {
        let mut bytes = if use_raw {
            raw
        } else {
            let entries: Vec<(u64, u64)> = entries.into_iter().collect();
            crafted(EXTENT, &entries)
        };
        for (at, x) in flips {
            if !bytes.is_empty() {
                let at = at % bytes.len();
                bytes[at] ^= x;
            }
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (bytes.len() + 1));
        }
        if let Ok(map) = VolumeMap::from_bytes(&bytes) {
            prop_assert_eq!(map.to_bytes(), bytes);
            prop_assert!(map.entries().windows(2).all(|w| w[0].0 < w[1].0));
        }
    }
}

/// Two volumes on a store of four extents, each with a thread writing one block of its
/// first extent (so each fill zeroes the rest), one giving that extent back over and over
/// (discard and unmapping zeroes in turn) and one reading it: the store's extents pass from
/// volume to volume all the time, over a store that keeps what it held, and a reader sees
/// only zeros or its own volume's block, never the other's; nothing waits for ever.
#[test]
fn volumes_sharing_recycled_extents_never_see_each_other() {
    const ROUNDS: usize = 2000;
    let (_, store) = store_of(4);
    let volumes = [store.volume(EXTENT), store.volume(EXTENT)];
    let block_of = |v: usize| pattern(100 + v as u64, BLOCK as usize);
    std::thread::scope(|s| {
        for (v, volume) in volumes.iter().enumerate() {
            s.spawn(move || {
                for _ in 0..ROUNDS {
                    volume.write_at(BLOCK, &block_of(v), false).unwrap();
                }
            });
            s.spawn(move || {
                for round in 0..ROUNDS {
                    if round % 2 == 0 {
                        volume.discard(0, EXTENT).unwrap();
                    } else {
                        volume.write_zeroes(0, EXTENT, true).unwrap();
                    }
                }
            });
            s.spawn(move || {
                let zeros = vec![0; BLOCK as usize];
                for round in 0..ROUNDS {
                    let back = read(volume, 0, EXTENT);
                    for (b, got) in back.chunks(BLOCK as usize).enumerate() {
                        let own = b == 1 && got == block_of(v);
                        assert!(
                            own || got == zeros,
                            "volume {v} round {round} block {b}: neither zeros nor its own"
                        );
                    }
                }
            });
        }
    });
    let held: u64 = volumes.iter().map(|v| v.mapped_bytes() / EXTENT).sum();
    assert_eq!(store.used_extents(), held);
    assert_eq!(store.free_extents() + held, 4);
}

/// A store opened through its label: written on a store of zeros, found again with the same
/// id, its extent never a volume's; a store of another extent size, or of other data, refused.
#[test]
fn a_labelled_store_keeps_its_label_and_refuses_what_is_not_one() {
    use ztier_blockdev::thin::{Label, LABEL_LEN};
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(6 * EXTENT).unwrap());
    let store = ThinStore::labelled(Arc::clone(&device), EXTENT).unwrap();
    let label: Label = store.label().unwrap();
    assert_eq!((label.extent_size, label.extents), (EXTENT, 6));
    assert_eq!(store.identity(), Some((0, LABEL_LEN)));
    assert_eq!(store.free_extents(), 5, "the label's extent is no volume's");
    assert_eq!(&read(&*device, 0, 8)[..], b"ZTIERTHN");
    // Every extent a volume can take, written whole with a pattern: the label stays.
    let v = store.volume(8 * EXTENT);
    for e in 0..5 {
        v.write_at(e * EXTENT, &pattern(e, EXTENT as usize), false)
            .unwrap();
    }
    let err = v.write_at(5 * EXTENT, &[1], false).unwrap_err();
    assert!(matches!(err, BlockError::NoSpace(_)), "{err}");
    let map = v.map();
    assert!(
        map.entries().iter().all(|&(_, s)| s != 0),
        "{:?}",
        map.entries()
    );
    v.close();
    drop(v);
    drop(store);
    // Opened again: the same label, and the saved volume comes back whole.
    let again = ThinStore::labelled(Arc::clone(&device), EXTENT).unwrap();
    assert_eq!(again.label(), Some(label));
    let back = again.restore(8 * EXTENT, &map).unwrap();
    for e in 0..5 {
        assert_eq!(read(&back, e * EXTENT, EXTENT), pattern(e, EXTENT as usize));
    }
    drop(back);
    drop(again);
    // A map that names the label's extent (saved before stores had labels) is refused.
    let bytes = crafted(EXTENT, &[(0, 0)]);
    let old = VolumeMap::from_bytes(&bytes).unwrap();
    let fresh = ThinStore::labelled(Arc::clone(&device), EXTENT).unwrap();
    assert!(matches!(
        fresh.restore(8 * EXTENT, &old),
        Err(ThinError::LabelExtent)
    ));
    drop(fresh);
    // Another extent size, another kind of data, a store too small: refused, nothing written.
    assert!(matches!(
        ThinStore::labelled(Arc::clone(&device), EXTENT * 2),
        Err(ThinError::LabelExtentSize { .. })
    ));
    let other: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(6 * EXTENT).unwrap());
    other.write_at(0, b"\x7fELF", false).unwrap();
    assert!(matches!(
        ThinStore::labelled(Arc::clone(&other), EXTENT),
        Err(ThinError::NotAStore { .. })
    ));
    assert_eq!(read(&*other, 0, 4), b"\x7fELF");
    let tiny: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(EXTENT).unwrap());
    assert!(matches!(
        ThinStore::labelled(tiny, EXTENT),
        Err(ThinError::NoRoom)
    ));
}

/// A store that counts the batches it is sent.
struct Batches {
    inner: MemoryDevice,
    reads: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
}

impl BlockDevice for Batches {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_at(offset, data, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        Ok(())
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> ztier_blockdev::Result<()> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (offset, buf) in reads.iter_mut() {
            self.inner.read_at(*offset, buf)?;
        }
        Ok(())
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> ztier_blockdev::Result<()> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for (offset, data) in writes {
            self.inner.write_at(*offset, data, false)?;
        }
        Ok(())
    }
}

/// Batches through a volume reach the store as batches (what an NBD store sends in flight
/// together), read and write what single requests would, extents taken on the way, pieces
/// crossing extents, zeros where nothing was written; threads batching beside discards of
/// the same extents never wait on each other for good.
#[test]
fn batches_through_a_volume_reach_the_store_as_batches() {
    use std::sync::atomic::Ordering::Relaxed;
    let store_device = Arc::new(Batches {
        inner: MemoryDevice::new(64 * EXTENT).unwrap(),
        reads: Default::default(),
        writes: Default::default(),
    });
    let store = ThinStore::new(store_device.clone(), EXTENT).unwrap();
    let v = store.volume(32 * EXTENT);
    let mut model = vec![0u8; 32 * EXTENT as usize];
    // Mapped first, by single writes, then a batch over them and over extents not mapped.
    v.write_at(0, &pattern(1, 3 * EXTENT as usize), false)
        .unwrap();
    model[..3 * EXTENT as usize].copy_from_slice(&pattern(1, 3 * EXTENT as usize));
    let (a, b, c) = (
        pattern(2, BLOCK as usize),
        pattern(3, 2 * EXTENT as usize),
        pattern(4, 100),
    );
    let writes: Vec<(u64, &[u8])> = vec![
        (BLOCK, &a[..]),
        (EXTENT - 7, &b[..]),
        (10 * EXTENT + 5, &c[..]),
    ];
    let before = store_device.writes.load(Relaxed);
    v.write_many(&writes).unwrap();
    for (offset, data) in &writes {
        model[*offset as usize..*offset as usize + data.len()].copy_from_slice(data);
    }
    assert!(
        store_device.writes.load(Relaxed) > before,
        "no batch reached the store"
    );
    assert_eq!(read(&v, 0, 32 * EXTENT), model);
    let (mut x, mut y, mut z) = (
        vec![0xEE; 300],
        vec![0xEE; 2 * EXTENT as usize],
        vec![0xEE; 50],
    );
    let reads_before = store_device.reads.load(Relaxed);
    {
        let mut reads: Vec<(u64, &mut [u8])> = vec![
            (EXTENT - 100, &mut x[..]),
            (2 * EXTENT + 3, &mut y[..]),
            (20 * EXTENT, &mut z[..]),
        ];
        v.read_many(&mut reads).unwrap();
    }
    assert_eq!(
        store_device.reads.load(Relaxed),
        reads_before + 1,
        "one batch"
    );
    assert_eq!(x, model[EXTENT as usize - 100..EXTENT as usize + 200]);
    assert_eq!(y, model[2 * EXTENT as usize + 3..4 * EXTENT as usize + 3]);
    assert_eq!(z, vec![0; 50], "never written: zeros");
    // Out of range: refused.
    let mut past = [0u8; 10];
    let mut reads: Vec<(u64, &mut [u8])> = vec![(32 * EXTENT - 5, &mut past[..])];
    assert!(v.read_many(&mut reads).is_err());
    assert!(v.write_many(&[(32 * EXTENT, &[1u8][..])]).is_err());

    // Threads batching over extents a third one discards and writes again.
    let v = Arc::new(v);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let v = Arc::clone(&v);
            s.spawn(move || {
                for r in 0..200u64 {
                    let data = pattern(t * 1000 + r, 300);
                    let at = (r % 8) * EXTENT + t * 512;
                    v.write_many(&[(at, &data[..]), (at + EXTENT * 8, &data[..])])
                        .unwrap();
                    let mut back = vec![0u8; 300];
                    let mut reads: Vec<(u64, &mut [u8])> = vec![(at + EXTENT * 8, &mut back[..])];
                    v.read_many(&mut reads).unwrap();
                    assert_eq!(back, data, "thread {t} round {r}");
                }
            });
        }
        let v = Arc::clone(&v);
        s.spawn(move || {
            for r in 0..200u64 {
                v.discard((r % 8) * EXTENT, EXTENT).unwrap();
            }
        });
    });
}
