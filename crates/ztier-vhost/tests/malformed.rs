//! What a guest writes into its ring cannot harm the device, the guest's other memory, or
//! the server: each malformed chain and request is answered (`IOERR`, `UNSUPP`, or, with no
//! status byte to set, used with nothing written), the device is left as it was, memory
//! outside the chain's writable buffers is not written, and the next request is served.
//! A frontend that breaks the protocol loses its connection, not the server.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::pattern;
use ztier_blockdev::BlockDevice;
use ztier_vhost::testing::{
    self as guest, Guest, Options, Raw, Served, DATA_AT, GUEST_BYTES, HEADER_AT, STATUS_AT,
};
use ztier_vhost::DeviceConfig;

const R: u16 = 0;
const W: u16 = VRING_DESC_F_WRITE as u16;
const DEVICE_BYTES: u64 = 1 << 20;
const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;
/// What the status byte holds before a request: an answer overwrites it.
const UNANSWERED: u8 = 0xff;

/// A served device filled with a pattern, and a guest attached to it.
struct Rig {
    dev: Arc<MemoryDevice>,
    served: Served,
    guest: Guest,
    area: u64,
}

impl Rig {
    fn new(config: DeviceConfig) -> Rig {
        let dev = Arc::new(MemoryDevice::new(DEVICE_BYTES).unwrap());
        dev.write_at(0, &pattern(99, DEVICE_BYTES as usize), false)
            .unwrap();
        let served = Served::start(dev.clone(), config);
        let guest = Guest::connect(
            &served.path,
            Options {
                queues: 2,
                ..Options::default()
            },
        );
        let area = guest.area(0);
        Rig {
            dev,
            served,
            guest,
            area,
        }
    }

    fn writable() -> Rig {
        Rig::new(DeviceConfig {
            num_queues: 2,
            max_queue_size: guest::QUEUE_SIZE,
            ..DeviceConfig::default()
        })
    }

    fn header(&self, kind: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.guest
            .mem
            .write_slice(&h, GuestAddress(self.area + HEADER_AT))
            .unwrap();
    }

    fn status(&self) -> u8 {
        self.guest
            .mem
            .read_obj(GuestAddress(self.area + STATUS_AT))
            .unwrap()
    }

    /// Posts `descs` (address, length, flags) on queue 0 as a chain at indices 0.., each but
    /// the last pointing at the next; returns the used length and the status byte.
    fn chain(&self, descs: &[(u64, u32, u16)]) -> (u32, u8) {
        self.guest
            .mem
            .write_obj(UNANSWERED, GuestAddress(self.area + STATUS_AT))
            .unwrap();
        let raws: Vec<Raw> = descs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| Raw {
                index: i as u16,
                addr,
                len,
                flags: if i + 1 < descs.len() {
                    flags | VRING_DESC_F_NEXT as u16
                } else {
                    flags
                },
                next: i as u16 + 1,
            })
            .collect();
        self.guest.post_raw(0, &raws, 0);
        let used = self.guest.wait_used(0, 1)[0];
        assert_eq!(used.id, 0);
        (used.len, self.status())
    }

    fn hdr(&self) -> (u64, u32, u16) {
        (self.area + HEADER_AT, 16, R)
    }
    fn data(&self, len: u32, flags: u16) -> (u64, u32, u16) {
        (self.area + DATA_AT, len, flags)
    }
    fn st(&self) -> (u64, u32, u16) {
        (self.area + STATUS_AT, 1, W)
    }

    /// The device holds its pattern, nothing below the queues was written, and both queues
    /// still serve.
    fn assert_unharmed(&self) {
        let mut now = vec![0u8; DEVICE_BYTES as usize];
        self.dev.read_at(0, &mut now).unwrap();
        assert!(
            now == pattern(99, DEVICE_BYTES as usize),
            "the device was changed"
        );
        self.guest.assert_sentinel_intact();
        for q in 0..2 {
            let (st, back) = self.guest.request(q, VIRTIO_BLK_T_IN, 8, &[], 4096);
            assert_eq!(st, OK, "queue {q} serves after it");
            assert!(back[..] == pattern(99, DEVICE_BYTES as usize)[4096..8192]);
        }
    }
}

#[test]
fn descriptors_outside_guest_memory_are_ioerr_and_nothing_is_read() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_OUT, 0);
    for (addr, len) in [
        (GUEST_BYTES, 4096u32),
        (GUEST_BYTES - 2048, 4096),
        (u64::MAX - 100, 4096),
        (u64::MAX, 1),
    ] {
        assert_eq!(
            rig.chain(&[rig.hdr(), (addr, len, R), rig.st()]),
            (1, IOERR),
            "{addr:#x}"
        );
    }
    // A read whose buffer leaves memory: nothing written into the part that is inside.
    rig.header(VIRTIO_BLK_T_IN, 0);
    rig.guest
        .mem
        .write_slice(&[0xaa; 4096], GuestAddress(GUEST_BYTES - 4096))
        .unwrap();
    assert_eq!(
        rig.chain(&[rig.hdr(), (GUEST_BYTES - 4096, 8192, W), rig.st()]),
        (1, IOERR)
    );
    let mut tail = vec![0u8; 4096];
    rig.guest
        .mem
        .read_slice(&mut tail, GuestAddress(GUEST_BYTES - 4096))
        .unwrap();
    assert!(
        tail.iter().all(|&b| b == 0xaa),
        "the part inside memory was not written"
    );
    // The header itself outside.
    assert_eq!(
        rig.chain(&[(GUEST_BYTES + 16, 16, R), rig.st()]),
        (1, IOERR)
    );
    rig.assert_unharmed();
}

#[test]
fn a_chain_with_no_status_to_set_is_used_with_nothing_written() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_IN, 0);
    // The last descriptor is readable, outside memory, or empty.
    for last in [
        (rig.area + STATUS_AT, 1, R),
        (GUEST_BYTES, 1, W),
        (rig.area + STATUS_AT, 0, W),
    ] {
        assert_eq!(rig.chain(&[rig.hdr(), last]), (0, UNANSWERED), "{last:?}");
    }
    // Nothing at all: the head is an indirect descriptor whose table nests another.
    let table = rig.area + DATA_AT;
    let nested = [(table + 64, 32u32, VRING_DESC_F_INDIRECT as u16)];
    write_table(&rig.guest, table, &nested);
    assert_eq!(
        rig.chain(&[(table, 16, VRING_DESC_F_INDIRECT as u16)]),
        (0, UNANSWERED)
    );
    // An indirect table whose length is not whole descriptors.
    assert_eq!(
        rig.chain(&[(table, 20, VRING_DESC_F_INDIRECT as u16)]),
        (0, UNANSWERED)
    );
    let stats = rig.served.server.stats();
    assert_eq!(stats.unanswerable.load(Ordering::Relaxed), 5);
    rig.assert_unharmed();
}

#[test]
fn a_short_or_split_header() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_IN, 1);
    // 8 bytes of header and no more: IOERR.
    assert_eq!(
        rig.chain(&[(rig.area + HEADER_AT, 8, R), rig.st()]),
        (1, IOERR)
    );
    // No readable descriptor at all.
    assert_eq!(rig.chain(&[rig.data(512, W), rig.st()]), (1, IOERR));
    // The header in two descriptors of 8 bytes is a header (virtio 1.0 allows any layout).
    let (len, st) = rig.chain(&[
        (rig.area + HEADER_AT, 8, R),
        (rig.area + HEADER_AT + 8, 8, R),
        rig.data(512, W),
        rig.st(),
    ]);
    assert_eq!((len, st), (513, OK));
    let mut back = vec![0u8; 512];
    rig.guest
        .mem
        .read_slice(&mut back, GuestAddress(rig.area + DATA_AT))
        .unwrap();
    assert!(back[..] == pattern(99, 1024)[512..]);
    rig.assert_unharmed();
}

#[test]
fn data_in_the_wrong_direction_or_order_is_ioerr() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_IN, 0);
    // A read with data the device would read.
    assert_eq!(
        rig.chain(&[rig.hdr(), rig.data(512, R), rig.st()]),
        (1, IOERR)
    );
    rig.header(VIRTIO_BLK_T_OUT, 0);
    // A write with a buffer the device would write.
    assert_eq!(
        rig.chain(&[rig.hdr(), rig.data(512, W), rig.st()]),
        (1, IOERR)
    );
    // A readable descriptor after a writable one.
    assert_eq!(
        rig.chain(&[
            rig.hdr(),
            rig.data(512, W),
            (rig.area + DATA_AT + 4096, 512, R),
            rig.st()
        ]),
        (1, IOERR)
    );
    rig.header(VIRTIO_BLK_T_FLUSH, 0);
    assert_eq!(rig.chain(&[rig.hdr(), rig.st()]), (1, OK));
    rig.assert_unharmed();
}

#[test]
fn ranges_that_are_not_whole_sectors_inside_the_device_are_ioerr() {
    let rig = Rig::writable();
    let sectors = DEVICE_BYTES / 512;
    for (kind, sector, len) in [
        (VIRTIO_BLK_T_IN, 0, 1000u32),
        (VIRTIO_BLK_T_OUT, 0, 511),
        (VIRTIO_BLK_T_IN, sectors - 1, 1024),
        (VIRTIO_BLK_T_OUT, sectors, 512),
        (VIRTIO_BLK_T_OUT, u64::MAX, 512),
        (VIRTIO_BLK_T_IN, u64::MAX / 512 + 1, 512),
        (VIRTIO_BLK_T_IN, 0, 0),
    ] {
        rig.header(kind, sector);
        let dir = if kind == VIRTIO_BLK_T_IN { W } else { R };
        let chain = if len == 0 {
            vec![rig.hdr(), rig.st()]
        } else {
            vec![rig.hdr(), rig.data(len, dir), rig.st()]
        };
        assert_eq!(
            rig.chain(&chain),
            (1, IOERR),
            "type {kind} sector {sector} len {len}"
        );
    }
    rig.assert_unharmed();
}

#[test]
fn unknown_types_and_flags_are_unsupp() {
    let rig = Rig::writable();
    for kind in [
        VIRTIO_BLK_T_SCSI_CMD,
        VIRTIO_BLK_T_SECURE_ERASE,
        VIRTIO_BLK_T_ZONE_REPORT,
        u32::MAX,
    ] {
        rig.header(kind, 0);
        assert_eq!(
            rig.chain(&[rig.hdr(), rig.st()]),
            (1, UNSUPP),
            "type {kind}"
        );
    }
    let segment = |flags| guest::segment(0, 8, flags);
    for (kind, flags) in [
        (VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP),
        (VIRTIO_BLK_T_DISCARD, 1 << 7),
        (VIRTIO_BLK_T_WRITE_ZEROES, 1 << 1),
    ] {
        rig.header(kind, 0);
        rig.guest
            .mem
            .write_slice(&segment(flags), GuestAddress(rig.area + DATA_AT))
            .unwrap();
        assert_eq!(
            rig.chain(&[rig.hdr(), rig.data(16, R), rig.st()]),
            (1, UNSUPP)
        );
    }
    assert_eq!(
        rig.served
            .server
            .stats()
            .unsupported
            .load(Ordering::Relaxed),
        7
    );
    rig.assert_unharmed();
}

/// A discard or zero-write with any bad segment is refused whole: not one of its segments
/// is applied.
#[test]
fn a_bad_discard_segment_refuses_the_whole_request() {
    let rig = Rig::writable();
    let sectors = (DEVICE_BYTES / 512) as u32;
    let good = guest::segment(0, 8, 0);
    let bad_segments: Vec<Vec<u8>> = vec![
        guest::segment(u64::from(sectors) - 4, 8, 0).to_vec(), // past the end
        guest::segment(8, 0, 0).to_vec(),                      // no sectors
        guest::segment(0, (64 << 10) + 8, 0).to_vec(),         // more than max_discard_sectors
        guest::segment(u64::MAX / 256, 8, 0).to_vec(),         // overflows
        vec![0u8; 20],                                         // not whole segments
        (0..17).flat_map(|i| guest::segment(i * 8, 8, 0)).collect(), // more than max_discard_seg
    ];
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        rig.header(kind, 0);
        for bad in &bad_segments {
            let mut body = good.to_vec();
            body.extend_from_slice(bad);
            rig.guest
                .mem
                .write_slice(&body, GuestAddress(rig.area + DATA_AT))
                .unwrap();
            assert_eq!(
                rig.chain(&[rig.hdr(), rig.data(body.len() as u32, R), rig.st()]),
                (1, IOERR),
                "type {kind}, {} bytes of segments",
                body.len()
            );
        }
        // No segments at all.
        assert_eq!(rig.chain(&[rig.hdr(), rig.st()]), (1, IOERR));
    }
    rig.assert_unharmed();
}

#[test]
fn a_read_only_device_refuses_every_change() {
    let rig = Rig::new(DeviceConfig {
        num_queues: 2,
        max_queue_size: guest::QUEUE_SIZE,
        read_only: true,
        ..DeviceConfig::default()
    });
    rig.guest
        .mem
        .write_slice(&guest::segment(0, 8, 0), GuestAddress(rig.area + DATA_AT))
        .unwrap();
    for kind in [
        VIRTIO_BLK_T_OUT,
        VIRTIO_BLK_T_DISCARD,
        VIRTIO_BLK_T_WRITE_ZEROES,
    ] {
        rig.header(kind, 0);
        let len = if kind == VIRTIO_BLK_T_OUT { 512 } else { 16 };
        assert_eq!(
            rig.chain(&[rig.hdr(), rig.data(len, R), rig.st()]),
            (1, IOERR)
        );
    }
    rig.assert_unharmed();
}

/// A chain that loops on itself ends where the queue's size says (its descriptors are
/// walked at most that many times) and is answered; one longer than a header, `SEG_MAX` and
/// a status is `IOERR`.
#[test]
fn looping_and_overlong_chains_end_and_are_answered() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_IN, 0);
    // 0 -> 1 -> 1 -> 1 ...: the writable descriptor 1 names itself as next.
    rig.guest
        .mem
        .write_obj(UNANSWERED, GuestAddress(rig.area + DATA_AT + 511))
        .unwrap();
    rig.guest.post_raw(
        0,
        &[
            Raw {
                index: 0,
                addr: rig.area + HEADER_AT,
                len: 16,
                flags: VRING_DESC_F_NEXT as u16,
                next: 1,
            },
            Raw {
                index: 1,
                addr: rig.area + DATA_AT,
                len: 512,
                flags: (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE) as u16,
                next: 1,
            },
        ],
        0,
    );
    let used = rig.guest.wait_used(0, 1)[0];
    // 255 descriptors of 512 bytes written (the status is the last one's last byte): the
    // data is not whole sectors, so IOERR, at the status the chain ends with.
    assert_eq!(used.len, 1);
    let status: u8 = rig
        .guest
        .mem
        .read_obj(GuestAddress(rig.area + DATA_AT + 511))
        .unwrap();
    assert_eq!(status, IOERR);

    // An indirect table of 300 descriptors: a header, 298 of data, a status (SEG_MAX is 254).
    let table = rig.area + DATA_AT + (1 << 20);
    let mut descs = vec![(rig.area + HEADER_AT, 16u32, R)];
    descs.extend((0..298).map(|i| (rig.area + DATA_AT + i * 512, 512, W)));
    descs.push((rig.area + STATUS_AT, 1, W));
    write_table(&rig.guest, table, &descs);
    assert_eq!(
        rig.chain(&[(table, 16 * descs.len() as u32, VRING_DESC_F_INDIRECT as u16)]),
        (1, IOERR)
    );
    // The same within SEG_MAX is served.
    let descs: Vec<_> = descs[..200]
        .iter()
        .copied()
        .chain([(rig.area + STATUS_AT, 1, W)])
        .collect();
    write_table(&rig.guest, table, &descs);
    assert_eq!(
        rig.chain(&[(table, 16 * descs.len() as u32, VRING_DESC_F_INDIRECT as u16)]),
        (199 * 512 + 1, OK)
    );
    rig.assert_unharmed();
}

/// A request whose buffers overlap each other, its own header, or the ring it came on is
/// run as written, and harms only the guest's own buffers.
#[test]
fn buffers_overlapping_the_request_or_the_ring_harm_nothing_else() {
    let rig = Rig::writable();
    rig.header(VIRTIO_BLK_T_IN, 0);
    // The data buffer covers the header, and the status is inside the data buffer.
    let (len, _) = rig.chain(&[
        rig.hdr(),
        (rig.area + HEADER_AT, 4096, W),
        (rig.area + HEADER_AT + 100, 1, W),
    ]);
    assert_eq!(len, 4097);
    let status: u8 = rig
        .guest
        .mem
        .read_obj(GuestAddress(rig.area + HEADER_AT + 100))
        .unwrap();
    assert_eq!(status, OK, "the status, written last, over the data");
    // A read into the queue's own descriptor table: the chain was read before its buffers
    // were written.
    rig.header(VIRTIO_BLK_T_IN, 0);
    let (len, st) = rig.chain(&[rig.hdr(), (rig.area, 4096, W), rig.st()]);
    assert_eq!((len, st), (4097, OK));
    // The driver's ring is now the device's bytes; the driver rebuilds its descriptors on each
    // request, and its indices are its own, so it goes on.
    rig.assert_unharmed();
}

/// A head index past the queue's size cannot be put on the used ring: it is passed over and
/// counted; an available index far ahead of the queue is a broken ring, waited out without
/// spinning; both leave the other queue serving.
#[test]
fn a_broken_available_ring_is_passed_over_without_spinning() {
    let rig = Rig::writable();
    rig.guest.post_head(0, 300);
    let deadline = std::time::Instant::now() + guest::ANSWER_WAIT;
    let stats = rig.served.server.stats();
    while stats.bad_heads.load(Ordering::Relaxed) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the bad head was never taken"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(rig
        .guest
        .used_within(0, Duration::from_millis(50))
        .is_empty());
    // An available index 1000 ahead: more requests than the ring holds.
    let passes = stats.ring_passes.load(Ordering::Relaxed);
    rig.guest.set_avail_idx(0, 1001);
    while stats.ring_passes.load(Ordering::Relaxed) == passes {
        assert!(
            std::time::Instant::now() < deadline,
            "the kick was never seen"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let requests = stats.requests.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        stats.ring_passes.load(Ordering::Relaxed) <= passes + 2,
        "the queue's thread went on looking at a ring with nothing it can take"
    );
    assert_eq!(stats.requests.load(Ordering::Relaxed), requests);
    // Queue 1 serves; queue 0 serves again once its index is put back.
    let (st, _) = rig.guest.request(1, VIRTIO_BLK_T_IN, 0, &[], 512);
    assert_eq!(st, OK);
    rig.guest.set_avail_idx(0, 1);
    rig.assert_unharmed();
}

/// A frontend that sends bytes that are not vhost-user, or goes away in the middle of
/// setting up, loses its connection; the next is served.
#[test]
fn a_frontend_breaking_the_protocol_loses_only_its_connection() {
    let dev = Arc::new(MemoryDevice::new(DEVICE_BYTES).unwrap());
    let served = Served::start(dev, DeviceConfig::default());
    let mut garbage = UnixStream::connect(&served.path).unwrap();
    let _ = garbage.write_all(&pattern(5, 4096));
    // The server ends it: a read sees the end.
    garbage.set_read_timeout(Some(guest::ANSWER_WAIT)).unwrap();
    let mut buf = [0u8; 64];
    let _ = std::io::Read::read(&mut garbage, &mut buf);
    drop(garbage);
    // One that hangs up after its memory table.
    {
        let g = Guest::connect(&served.path, Options::default());
        g.detach();
    }
    let guest = Guest::connect(&served.path, Options::default());
    let (st, _) = guest.request(0, VIRTIO_BLK_T_IN, 0, &[], 4096);
    assert_eq!(st, OK);
    assert!(served.server.stats().connections.load(Ordering::Relaxed) >= 3);
}

fn write_table(guest: &Guest, at: u64, descs: &[(u64, u32, u16)]) {
    for (i, &(addr, len, flags)) in descs.iter().enumerate() {
        let more = i + 1 < descs.len();
        let flags = if more {
            flags | VRING_DESC_F_NEXT as u16
        } else {
            flags
        };
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&(i as u16 + 1).to_le_bytes());
        guest
            .mem
            .write_slice(&d, GuestAddress(at + 16 * i as u64))
            .unwrap();
    }
}

/// A descriptor a property test draws: inside the queue's data area, at the end of guest
/// memory, or past it; readable or writable.
fn any_desc(area: u64) -> impl Strategy<Value = (u64, u32, u16)> {
    let addr = prop_oneof![
        6 => (0u64..(1 << 20)).prop_map(move |o| area + DATA_AT + o),
        1 => (0u64..8192).prop_map(|o| GUEST_BYTES - 4096 + o),
        1 => any::<u64>(),
    ];
    let len = prop_oneof![
        3 => Just(512u32),
        2 => 0u32..9000,
        1 => any::<u32>(),
    ];
    (addr, len, prop_oneof![Just(R), Just(W)])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any header and any chain over a read-only device: each is used (or, with a bad head,
    /// passed over), the device never changes, and the queues still serve.
    #[test]
    fn any_chain_is_answered_and_changes_nothing(
        kind in prop_oneof![0u32..12, any::<u32>()],
        sector in prop_oneof![0u64..2048, any::<u64>()],
        descs in prop::collection::vec(any_desc(guest::FIRST_QUEUE), 1..6),
    ) {
        let rig = Rig::new(DeviceConfig {
            num_queues: 2,
            max_queue_size: guest::QUEUE_SIZE,
            read_only: true,
            ..DeviceConfig::default()
        });
        prop_assert_eq!(rig.area, guest::FIRST_QUEUE);
        rig.header(kind, sector);
        let mut chain = vec![rig.hdr()];
        chain.extend(descs);
        rig.chain(&chain);
        rig.assert_unharmed();
    }
}
