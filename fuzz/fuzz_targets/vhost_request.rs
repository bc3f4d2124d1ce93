//! A virtio-blk request as a guest could write it: the input is guest memory (two regions
//! with a hole between, holding the descriptor table, the available ring and every buffer)
//! and a head index; the chain it names is popped from a split queue and run on a RAM disk
//! by the vhost-user-blk request path. Nothing in it may panic; a request the device did not
//! answer OK changes nothing on the disk, a read-only disk never changes, and the used length
//! is never more than the chain's writable bytes.
#![no_main]

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_vhost::request::{self, Outcome};
use ztier_vhost::DeviceConfig;

const LOW: usize = 0x1_0000;
const HIGH_AT: u64 = 0x10_0000;
const HIGH: usize = 0x1000;
const DISK: usize = 64 << 10;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&[flags, size_byte, head_lo, head_hi], rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let read_only = flags & 1 != 0;
    // A queue of 1 to 256 entries, a power of two.
    let size = 1u16 << (size_byte % 9);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[
        (GuestAddress(0), LOW),
        (GuestAddress(HIGH_AT), HIGH),
    ])
    .unwrap();
    let (low, high) = rest.split_at(rest.len().min(LOW));
    mem.write_slice(low, GuestAddress(0)).unwrap();
    mem.write_slice(&high[..high.len().min(HIGH)], GuestAddress(HIGH_AT)).unwrap();
    // The descriptor table where the input put it (at 0); the available ring holding one
    // head, and the used ring, in the high region (so the input cannot move them).
    let avail = HIGH_AT;
    let used = HIGH_AT + 0x800;
    mem.write_obj(0u16, GuestAddress(avail)).unwrap();
    mem.write_obj(1u16, GuestAddress(avail + 2)).unwrap();
    mem.write_obj(u16::from_le_bytes([head_lo, head_hi]), GuestAddress(avail + 4))
        .unwrap();
    let mut queue = Queue::new(size).unwrap();
    queue.set_desc_table_address(Some(0), Some(0));
    queue.set_avail_ring_address(Some(avail as u32), Some((avail >> 32) as u32));
    queue.set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
    queue.set_ready(true);
    let Some(chain) = queue.pop_descriptor_chain(&mem) else {
        return;
    };
    let writable: u64 = chain
        .clone()
        .filter(|d| d.is_write_only())
        .map(|d| u64::from(d.len()))
        .sum();

    let dev = MemoryDevice::new(DISK as u64).unwrap();
    let before: Vec<u8> = (0..DISK).map(|i| (i * 7 + 3) as u8).collect();
    dev.write_at(0, &before, false).unwrap();
    let config = DeviceConfig {
        max_queue_size: size.max(4),
        read_only,
        ..DeviceConfig::default()
    };
    let mut scratch = Vec::new();
    let (outcome, used_len) = request::run(chain, &dev, &config, &mut scratch);

    assert!(u64::from(used_len) <= writable, "used {used_len} of {writable} writable bytes");
    if outcome == Outcome::Unanswerable {
        assert_eq!(used_len, 0);
    }
    let mut after = vec![0u8; DISK];
    dev.read_at(0, &mut after).unwrap();
    let changed = after != before;
    if changed {
        assert!(!read_only, "a read-only disk changed ({outcome:?})");
        assert!(matches!(outcome, Outcome::Done(_)), "the disk changed on {outcome:?}");
    }
});
