//! Devices of large compression units (16 and 64 KiB, and the page for comparison): a
//! property test of random writes, partial writes, discards and reads of random ranges
//! against a plain byte model; the block-device conformance suite at each unit size; the
//! per-unit counters (same-filled, stored raw); bad unit sizes refused. The model test
//! runs also with writebacks of every unit (or those stored raw) among the operations, in
//! each format of the store, and on zblock (conformance too). (Writeback,
//! recompression and saved states of units: `units_store.rs`.)
//!
//! Model properties: every read returns the model's bytes (the last written at each offset,
//! zeros where nothing was written or whole pages were discarded); `orig_data_size` is the
//! allocated units × unit size; once everything is discarded the pool holds no page.

mod common;

use common::units::{device, device_on, pool};
use proptest::prelude::*;
use std::sync::Arc;
use ztier_base::rng::Rng;
use ztier_blockdev::memory::MemoryDevice;
use ztier_compress::Algorithm;
use ztier_pool::{AllocatorKind, ZsConfig, ZsPool};
use ztier_zram::{Backing, Device, PageSelector, SlotFlag, WbFormat, ZramError};

const PAGE: usize = 4096;
const FORMATS: [WbFormat; 3] = [WbFormat::Page, WbFormat::Compressed, WbFormat::Packed];

/// Bytes of one of four kinds, by `kind`: text-like, one repeated word, zeros, or random
/// (incompressible).
fn bytes(len: usize, seed: u64, kind: u8) -> Vec<u8> {
    let mut rng = Rng::from_state(seed | 1);
    match kind % 4 {
        0 => {
            let words = [&b"alpha "[..], b"beta ", b"gamma ", b"delta "];
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                let x = rng.next_u64();
                out.extend_from_slice(words[(x % 4) as usize]);
                out.push((x >> 8) as u8);
            }
            out.truncate(len);
            out
        }
        1 => (0..len).map(|i| (seed >> (8 * (i % 8))) as u8).collect(),
        2 => vec![0; len],
        _ => (0..len).map(|_| rng.next_u64() as u8).collect(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        at: u64,
        len: usize,
        seed: u64,
        kind: u8,
    },
    WriteUnit {
        unit: u64,
        seed: u64,
        kind: u8,
    },
    WritePage {
        page: u64,
        seed: u64,
        kind: u8,
    },
    Discard {
        at: u64,
        len: u64,
    },
    DiscardPage {
        page: u64,
    },
    Read {
        at: u64,
        len: usize,
    },
    ReadPage {
        page: u64,
    },
    /// Every unit in the pool (`huge`: those stored raw) to the backing store.
    Writeback {
        huge: bool,
    },
}

fn op(disk: u64, units: u64, pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..disk, 1..20_000usize, any::<u64>(), any::<u8>()).prop_map(
            move |(at, len, seed, kind)| Op::Write {
                at,
                len: len.min((disk - at) as usize),
                seed,
                kind
            }
        ),
        (0..units, any::<u64>(), any::<u8>()).prop_map(|(unit, seed, kind)| Op::WriteUnit {
            unit,
            seed,
            kind
        }),
        (0..pages, any::<u64>(), any::<u8>()).prop_map(|(page, seed, kind)| Op::WritePage {
            page,
            seed,
            kind
        }),
        (0..disk, 0..150_000u64).prop_map(move |(at, len)| Op::Discard {
            at,
            len: len.min(disk - at)
        }),
        (0..pages).prop_map(|page| Op::DiscardPage { page }),
        (0..disk, 1..70_000usize).prop_map(move |(at, len)| Op::Read {
            at,
            len: len.min((disk - at) as usize)
        }),
        (0..pages).prop_map(|page| Op::ReadPage { page }),
    ]
}

/// [`op`], or now and then a writeback.
fn op_or_writeback(disk: u64, units: u64, pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => op(disk, units, pages),
        1 => any::<bool>().prop_map(|huge| Op::Writeback { huge }),
    ]
}

/// Runs `ops` on a device of `units` units of `unit` bytes and on the model; checks every
/// read, the whole disk at the end, the page counts, and that discarding all frees the pool.
fn check_against_model(unit: usize, units: u64, alg: &str, ops: &[Op]) {
    check_against_model_on(AllocatorKind::Zsmalloc, unit, units, alg, None, ops);
}

/// [`check_against_model`] on a device with a backing store in `format`, if given (for
/// [`Op::Writeback`]); at the end `bd_count` is the written-back units' pages, and
/// discarding all empties the store too.
fn check_against_model_on(
    allocator: AllocatorKind,
    unit: usize,
    units: u64,
    alg: &str,
    format: Option<WbFormat>,
    ops: &[Op],
) {
    let dev = device_on(allocator, units, unit, alg);
    if let Some(format) = format {
        let store = MemoryDevice::new(Backing::size_for(units * unit as u64)).unwrap();
        dev.set_backing(Some(Backing::new(Arc::new(store), format).unwrap()))
            .unwrap();
    }
    let disk = units * unit as u64;
    let mut model = vec![0u8; disk as usize];
    let ps = PAGE as u64;
    for op in ops {
        match *op {
            Op::Write {
                at,
                len,
                seed,
                kind,
            } => {
                let data = bytes(len, seed, kind);
                dev.write_bytes(at, &data).unwrap();
                model[at as usize..at as usize + len].copy_from_slice(&data);
            }
            Op::WriteUnit {
                unit: u,
                seed,
                kind,
            } => {
                let data = bytes(unit, seed, kind);
                dev.write_unit(u, &data).unwrap();
                let at = u as usize * unit;
                model[at..at + unit].copy_from_slice(&data);
            }
            Op::WritePage { page, seed, kind } => {
                let data = bytes(PAGE, seed, kind);
                dev.write_page(page, &data).unwrap();
                let at = page as usize * PAGE;
                model[at..at + PAGE].copy_from_slice(&data);
            }
            Op::Discard { at, len } => {
                dev.discard(at, len).unwrap();
                // Whole pages only: the partial pages at the ends are left as they are.
                let (first, end) = (at.div_ceil(ps) * ps, (at + len) / ps * ps);
                if first < end {
                    model[first as usize..end as usize].fill(0);
                }
            }
            Op::DiscardPage { page } => {
                dev.discard_page(page).unwrap();
                let at = page as usize * PAGE;
                model[at..at + PAGE].fill(0);
            }
            Op::Read { at, len } => {
                let mut out = vec![0xa5; len];
                dev.read_bytes(at, &mut out).unwrap();
                assert!(
                    out[..] == model[at as usize..at as usize + len],
                    "read {at}+{len}"
                );
            }
            Op::ReadPage { page } => {
                let mut out = vec![0xa5; PAGE];
                dev.read_page(page, &mut out).unwrap();
                let at = page as usize * PAGE;
                assert!(out[..] == model[at..at + PAGE], "page {page}");
            }
            Op::Writeback { huge } => {
                let mode = if huge {
                    PageSelector::Huge
                } else {
                    PageSelector::All
                };
                dev.writeback(mode, None, None).unwrap();
            }
        }
    }
    let mut whole = vec![0xa5; disk as usize];
    dev.read_bytes(0, &mut whole).unwrap();
    assert!(whole == model, "the whole disk");
    let allocated = (0..units)
        .filter(|&u| dev.entry(u).unwrap().is_allocated())
        .count() as u64;
    let mm = dev.mm_stat();
    assert_eq!(mm.orig_data_size, allocated * unit as u64);
    assert!(mm.same_pages * PAGE as u64 <= mm.orig_data_size);
    if let Some(bd) = dev.bd_stat() {
        let written_back = (0..units)
            .filter(|&u| dev.entry(u).unwrap().has(SlotFlag::Wb))
            .count() as u64;
        assert_eq!(bd.bd_count, written_back * (unit / PAGE) as u64);
    }
    dev.discard(0, disk).unwrap();
    if let Some(bd) = dev.bd_stat() {
        assert_eq!((bd.bd_count, bd.bytes_stored, bd.bytes_held), (0, 0, 0));
    }
    let mm = dev.mm_stat();
    assert_eq!(
        (mm.orig_data_size, mm.compr_data_size, mm.mem_used_total),
        (0, 0, 0)
    );
    assert_eq!((mm.same_pages, mm.huge_pages), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn units_of_4k_follow_the_model(ops in prop::collection::vec(op(16 * 4096, 16, 16), 1..40)) {
        check_against_model(4096, 16, "lz4", &ops);
    }

    #[test]
    fn units_of_16k_follow_the_model(ops in prop::collection::vec(op(8 * 16384, 8, 32), 1..40)) {
        check_against_model(16384, 8, "lz4", &ops);
    }

    #[test]
    fn units_of_64k_follow_the_model(ops in prop::collection::vec(op(4 * 65536, 4, 64), 1..40)) {
        check_against_model(65536, 4, "zstd", &ops);
    }

    #[test]
    fn units_of_16k_written_back_follow_the_model(
        ops in prop::collection::vec(op_or_writeback(8 * 16384, 8, 32), 1..40),
        format in 0..3usize,
    ) {
        check_against_model_on(AllocatorKind::Zsmalloc, 16384, 8, "lz4", Some(FORMATS[format]), &ops);
    }

    #[test]
    fn units_of_64k_written_back_follow_the_model(
        ops in prop::collection::vec(op_or_writeback(4 * 65536, 4, 64), 1..40),
        format in 0..3usize,
    ) {
        check_against_model_on(AllocatorKind::Zsmalloc, 65536, 4, "zstd", Some(FORMATS[format]), &ops);
    }

    /// zblock's types above a page hold units too, written back among the operations.
    #[test]
    fn units_on_zblock_follow_the_model(
        ops in prop::collection::vec(op_or_writeback(4 * 65536, 4, 64), 1..40),
        format in 0..3usize,
    ) {
        check_against_model_on(AllocatorKind::Zblock, 65536, 4, "lz4", Some(FORMATS[format]), &ops);
    }
}

#[test]
fn block_device_conformance_at_each_unit_size() {
    for allocator in AllocatorKind::ALL {
        for unit in [16384, 65536] {
            let dev = device_on(*allocator, 4 * 65536 / unit as u64, unit, "lz4");
            ztier_blockdev::testing::run_all(&dev);
        }
    }
}

#[test]
fn same_filled_and_incompressible_units_are_counted_in_pages() {
    let dev = device(4, 65536, "lz4");
    dev.write_unit(0, &bytes(65536, 7, 1)).unwrap();
    dev.write_unit(1, &bytes(65536, 7, 3)).unwrap();
    dev.write_unit(2, &bytes(65536, 7, 0)).unwrap();
    let mm = dev.mm_stat();
    assert_eq!(mm.same_pages, 16, "one same-filled unit is its 16 pages");
    assert_eq!(mm.huge_pages, 16, "one unit stored raw");
    assert_eq!(mm.orig_data_size, 3 * 65536);
    let text = dev.entry(2).unwrap().size();
    assert!(
        text > 0 && text < 65536 / 2,
        "text compresses as one object: {text}"
    );
    assert_eq!(mm.compr_data_size, 65536 + text as u64);
    assert_eq!(dev.entry(1).unwrap().size(), 65536);
    // A page written into the same-filled unit makes it one compressed object.
    dev.write_page(3, &bytes(4096, 9, 0)).unwrap();
    let mm = dev.mm_stat();
    assert_eq!((mm.same_pages, mm.orig_data_size), (0, 3 * 65536));
}

#[test]
fn a_4k_page_read_from_a_64k_unit_is_its_page() {
    let dev = device(2, 65536, "zstd");
    let unit = bytes(65536, 3, 0);
    dev.write_unit(1, &unit).unwrap();
    let mut page = vec![0; 4096];
    for p in 16..32 {
        dev.read_page(p, &mut page).unwrap();
        assert!(
            page[..] == unit[(p as usize - 16) * 4096..][..4096],
            "page {p}"
        );
    }
    assert!(matches!(
        dev.read_page(32, &mut page),
        Err(ZramError::BadIndex {
            index: 32,
            pages: 32
        })
    ));
    assert_eq!(dev.io_stat().failed_reads, 1);
}

#[test]
fn bad_unit_sizes_and_disks_are_refused() {
    let alg = || "lz4".parse::<Algorithm>().unwrap();
    // The pool's largest object bounds the unit.
    let small = Box::new(ZsPool::new(ZsConfig::default()).unwrap());
    assert!(matches!(
        Device::with_unit_size(1 << 20, alg(), small, 16384),
        Err(ZramError::BadUnitSize {
            unit_size: 16384,
            max_unit: 4096,
            ..
        })
    ));
    for unit in [8192 + 4096, 2048, 131072] {
        assert!(matches!(
            Device::with_unit_size(1 << 20, alg(), pool(65536), unit),
            Err(ZramError::BadUnitSize { .. })
        ));
    }
    assert!(matches!(
        Device::with_unit_size(65536 + 4096, alg(), pool(65536), 65536),
        Err(ZramError::DiskNotWholeUnits {
            unit_size: 65536,
            ..
        })
    ));
    // A page-sized unit is the default device.
    let dev = Device::with_unit_size(1 << 20, alg(), pool(4096), 4096).unwrap();
    assert_eq!(
        (dev.unit_size(), dev.pages(), dev.units()),
        (4096, 256, 256)
    );
}
