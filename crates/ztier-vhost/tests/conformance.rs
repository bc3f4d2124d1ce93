//! The block device served over vhost-user behaves as the block device does: the
//! conformance suite run through a guest's virtio-blk driver (played by `guest`), over one
//! queue and several, direct and indirect descriptors, with and without `EVENT_IDX`; the
//! configuration space says what the device is; several queues serve at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::{self, pattern};
use ztier_blockdev::BlockDevice;
use ztier_vhost::testing::{self as guest, Guest, GuestDisk, Options, Served};
use ztier_vhost::DeviceConfig;

fn memory(bytes: u64) -> Arc<MemoryDevice> {
    Arc::new(MemoryDevice::new(bytes).unwrap())
}

fn config(queues: u16) -> DeviceConfig {
    DeviceConfig {
        num_queues: queues,
        max_queue_size: guest::QUEUE_SIZE,
        ..DeviceConfig::default()
    }
}

#[test]
fn the_conformance_suite_passes_over_one_queue() {
    let served = Served::start(memory(1 << 20), config(1));
    let guest = Arc::new(Guest::connect(&served.path, Options::default()));
    testing::run_all(&GuestDisk::new(Arc::clone(&guest)));
    guest.assert_sentinel_intact();
    let stats = served.server.stats();
    assert!(stats.requests.load(Ordering::Relaxed) > 100);
    assert_eq!(stats.refused.load(Ordering::Relaxed), 0);
    assert_eq!(stats.device_errors.load(Ordering::Relaxed), 0);
}

#[test]
fn the_conformance_suite_passes_over_four_queues_with_indirect_descriptors_and_no_event_idx() {
    let served = Served::start(memory(1 << 20), config(4));
    let options = Options {
        queues: 4,
        event_idx: false,
        indirect: true,
    };
    let guest = Arc::new(Guest::connect(&served.path, options));
    testing::run_all(&GuestDisk::new(Arc::clone(&guest)));
    guest.assert_sentinel_intact();
}

/// Large requests cross the scratch buffer's 1 MiB and several descriptors: 6 MiB written
/// and read back in one request each.
#[test]
fn a_request_larger_than_the_scratch_buffer_is_whole() {
    let dev = memory(16 << 20);
    let served = Served::start(dev.clone(), config(1));
    let guest = Guest::connect(&served.path, Options::default());
    let data = pattern(6, 6 << 20);
    let (st, _) = guest.request(0, VIRTIO_BLK_T_OUT, 2048, &data, 0);
    assert_eq!(u32::from(st), VIRTIO_BLK_S_OK);
    let mut direct = vec![0; data.len()];
    dev.read_at(2048 * 512, &mut direct).unwrap();
    assert!(direct == data, "the device holds what was written");
    let (st, back) = guest.request(0, VIRTIO_BLK_T_IN, 2048, &[], data.len());
    assert_eq!(u32::from(st), VIRTIO_BLK_S_OK);
    assert!(back == data, "read back whole");
}

#[test]
fn the_configuration_space_and_features_say_what_the_device_is() {
    let served = Served::start(memory(64 << 20), config(3));
    let guest = Guest::connect(&served.path, Options::default());
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
        VIRTIO_BLK_F_SIZE_MAX,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_TOPOLOGY,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_MQ,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
    ] {
        assert_ne!(guest.offered & (1 << bit), 0, "feature bit {bit} offered");
    }
    assert_eq!(guest.offered & (1 << VIRTIO_BLK_F_RO), 0);
    assert_eq!(guest.capacity(), 64 << 20);
    assert_eq!(guest.config_u32(8), 1 << 20, "size_max");
    assert_eq!(
        guest.config_u32(12),
        u32::from(guest::QUEUE_SIZE) - 2,
        "seg_max"
    );
    assert_eq!(guest.config_u32(20), 4096, "blk_size");
    assert_eq!(u16::from_le_bytes([guest.config[34], guest.config[35]]), 3);
    assert_eq!(guest.config_u32(44), 8, "discard alignment: a page");

    let ro = Served::start(
        memory(1 << 20),
        DeviceConfig {
            read_only: true,
            ..config(1)
        },
    );
    let guest = Guest::connect(&ro.path, Options::default());
    assert_ne!(guest.offered & (1 << VIRTIO_BLK_F_RO), 0);
}

#[test]
fn get_id_answers_the_serial() {
    let served = Served::start(
        memory(1 << 20),
        DeviceConfig {
            serial: "swap-of-vm-17".into(),
            ..config(1)
        },
    );
    let guest = Guest::connect(&served.path, Options::default());
    let (st, id) = guest.request(0, VIRTIO_BLK_T_GET_ID, 0, &[], 20);
    assert_eq!(u32::from(st), VIRTIO_BLK_S_OK);
    assert_eq!(&id[..13], b"swap-of-vm-17");
    assert!(id[13..].iter().all(|&b| b == 0));
}

/// A device that counts what reaches it.
struct Counting {
    inner: MemoryDevice,
    discarded: AtomicU64,
    zeroed_unmapping: AtomicU64,
    flushes: AtomicU64,
}

impl BlockDevice for Counting {
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
        self.discarded.fetch_add(len, Ordering::Relaxed);
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        if may_unmap {
            self.zeroed_unmapping.fetch_add(len, Ordering::Relaxed);
        }
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.inner.flush()
    }
}

/// Discards, zero-writes that may unmap, and flushes reach the device as the guest asked
/// them, every segment of a request applied; the discarded pages are given back.
#[test]
fn discards_zero_writes_and_flushes_reach_the_device() {
    let dev = Arc::new(Counting {
        inner: MemoryDevice::new(4 << 20).unwrap(),
        discarded: AtomicU64::new(0),
        zeroed_unmapping: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
    });
    let served = Served::start(dev.clone(), config(1));
    let guest = Guest::connect(&served.path, Options::default());
    let data = pattern(1, 1 << 20);
    assert_eq!(
        u32::from(guest.request(0, VIRTIO_BLK_T_OUT, 0, &data, 0).0),
        VIRTIO_BLK_S_OK
    );
    let held = dev.inner.bytes_held();
    assert!(held >= 1 << 20);
    // Three segments in one discard: 64 KiB at 0, 128 KiB at 256 KiB, 4 KiB at 1020 KiB.
    let mut segs = Vec::new();
    for (sector, n) in [(0u64, 128u32), (512, 256), (2040, 8)] {
        segs.extend_from_slice(&guest::segment(sector, n, 0));
    }
    assert_eq!(
        u32::from(guest.request(0, VIRTIO_BLK_T_DISCARD, 0, &segs, 0).0),
        VIRTIO_BLK_S_OK
    );
    assert_eq!(dev.discarded.load(Ordering::Relaxed), (128 + 256 + 8) * 512);
    assert_eq!(
        dev.inner.bytes_held(),
        held - (128 + 256 + 8) * 512,
        "discarded pages freed"
    );
    let (_, back) = guest.request(0, VIRTIO_BLK_T_IN, 512, &[], 256 * 512);
    assert!(back.iter().all(|&b| b == 0));
    let seg = guest::segment(1024, 16, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    assert_eq!(
        u32::from(guest.request(0, VIRTIO_BLK_T_WRITE_ZEROES, 0, &seg, 0).0),
        VIRTIO_BLK_S_OK
    );
    assert_eq!(dev.zeroed_unmapping.load(Ordering::Relaxed), 16 * 512);
    let (_, back) = guest.request(0, VIRTIO_BLK_T_IN, 1016, &[], 32 * 512);
    assert!(
        back[..8 * 512] == data[1016 * 512..1024 * 512],
        "before the zeroes: data"
    );
    assert!(back[8 * 512..24 * 512].iter().all(|&b| b == 0), "zeroed");
    assert!(
        back[24 * 512..] == data[1040 * 512..1048 * 512],
        "after: data"
    );
    assert_eq!(
        u32::from(guest.request(0, VIRTIO_BLK_T_FLUSH, 0, &[], 0).0),
        VIRTIO_BLK_S_OK
    );
    assert_eq!(dev.flushes.load(Ordering::Relaxed), 1);
}

/// Four threads, each with its own queue, write and read back their own part of the disk at
/// once: every queue serves (its own thread: the requests of all four are in flight
/// together), and none sees another's bytes.
#[test]
fn several_queues_serve_at_once() {
    let dev = memory(16 << 20);
    let served = Served::start(dev.clone(), config(4));
    let guest = Arc::new(Guest::connect(
        &served.path,
        Options {
            queues: 4,
            ..Options::default()
        },
    ));
    const ROUNDS: u64 = 200;
    std::thread::scope(|s| {
        for q in 0..4usize {
            let guest = Arc::clone(&guest);
            s.spawn(move || {
                let base = q as u64 * 8192; // 4 MiB apart, in sectors
                for round in 0..ROUNDS {
                    let sector = base + (round % 64) * 8;
                    let data = pattern(q as u64 * 1000 + round, 4096);
                    let (st, _) = guest.request(q, VIRTIO_BLK_T_OUT, sector, &data, 0);
                    assert_eq!(u32::from(st), VIRTIO_BLK_S_OK);
                    let (st, back) = guest.request(q, VIRTIO_BLK_T_IN, sector, &[], 4096);
                    assert_eq!(u32::from(st), VIRTIO_BLK_S_OK);
                    assert!(
                        back == data,
                        "queue {q} round {round}: read back another's bytes"
                    );
                }
            });
        }
    });
    for q in 0..4u64 {
        for slot in 0..64u64 {
            let last = (0..ROUNDS).rev().find(|r| r % 64 == slot).unwrap();
            let mut back = vec![0; 4096];
            dev.read_at((q * 8192 + slot * 8) * 512, &mut back).unwrap();
            assert!(
                back == pattern(q * 1000 + last, 4096),
                "queue {q} slot {slot}"
            );
        }
    }
    assert_eq!(
        served.server.stats().requests.load(Ordering::Relaxed),
        4 * ROUNDS * 2
    );
    guest.assert_sentinel_intact();
}

/// A request stalled in the device on one queue holds up none on another: each queue has
/// its own thread.
#[test]
fn a_stalled_queue_does_not_hold_up_another() {
    let dev = Arc::new(ztier_blockdev::testing::Faulty::new(
        MemoryDevice::new(1 << 20).unwrap(),
    ));
    let served = Served::start(dev.clone(), config(2));
    let guest = Guest::connect(
        &served.path,
        Options {
            queues: 2,
            ..Options::default()
        },
    );
    dev.stall(true);
    let area = guest.area(0);
    let header = [0u8; 16]; // type IN (0), sector 0
    vm_memory::Bytes::write_slice(
        &guest.mem,
        &header,
        vm_memory::GuestAddress(area + guest::HEADER_AT),
    )
    .unwrap();
    guest.post_raw(
        0,
        &[
            guest::Raw {
                index: 0,
                addr: area + guest::HEADER_AT,
                len: 16,
                flags: 1,
                next: 1,
            },
            guest::Raw {
                index: 1,
                addr: area + guest::DATA_AT,
                len: 4096,
                flags: 1 | 2,
                next: 2,
            },
            guest::Raw {
                index: 2,
                addr: area + guest::STATUS_AT,
                len: 1,
                flags: 2,
                next: 0,
            },
        ],
        0,
    );
    assert!(
        dev.wait_for_stalled_reads(1, guest::ANSWER_WAIT),
        "queue 0's read reached the device"
    );
    let data = pattern(2, 4096);
    let (st, _) = guest.request(1, VIRTIO_BLK_T_OUT, 64, &data, 0);
    assert_eq!(
        u32::from(st),
        VIRTIO_BLK_S_OK,
        "queue 1 served while queue 0 waits"
    );
    dev.stall(false);
    assert_eq!(guest.wait_used(0, 1)[0].len, 4096 + 1);
}
