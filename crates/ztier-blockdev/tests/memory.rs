//! The plain RAM disk: the conformance suite, holes that come and go, and bad sizes.

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::{BlockDevice, BlockError};

#[test]
fn passes_the_conformance_suite() {
    let dev = MemoryDevice::new(1 << 20).unwrap();
    ztier_blockdev::testing::run_all(&dev);
}

#[test]
fn pages_are_held_only_while_written() {
    let dev = MemoryDevice::new(64 * 4096).unwrap();
    assert_eq!(dev.bytes_held(), 0);
    dev.write_at(4096 + 100, &[7; 5000], false).unwrap();
    assert_eq!(dev.bytes_held(), 2 * 4096);
    let extents = dev.block_status(0, 4 * 4096).unwrap();
    let shape: Vec<_> = extents.iter().map(|e| (e.len, e.hole)).collect();
    assert_eq!(shape, [(4096, true), (8192, false), (4096, true)]);

    // Zeroing with NO_HOLE keeps the page (reads zeros, still data); with unmap it goes.
    dev.write_zeroes(4096, 4096, false).unwrap();
    assert_eq!(dev.bytes_held(), 2 * 4096);
    dev.write_zeroes(3 * 4096, 4096, false).unwrap();
    assert_eq!(
        dev.bytes_held(),
        3 * 4096,
        "NO_HOLE allocates a zeroed page"
    );
    dev.write_zeroes(4096, 4096, true).unwrap();
    dev.discard(2 * 4096, 2 * 4096).unwrap();
    assert_eq!(dev.bytes_held(), 0);
    let mut back = vec![1; 4 * 4096];
    dev.read_at(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn bad_sizes_and_ranges_are_refused() {
    assert!(matches!(
        MemoryDevice::new(4095),
        Err(BlockError::Invalid(_))
    ));
    // A page table for 2^62 bytes cannot be had: an error, not an abort.
    assert!(matches!(
        MemoryDevice::new(1 << 62),
        Err(BlockError::NoMemory(_))
    ));
    let dev = MemoryDevice::new(8 * 4096).unwrap();
    let err = dev.write_at(8 * 4096 - 1, &[1, 2], false).unwrap_err();
    assert!(matches!(err, BlockError::OutOfRange { .. }));
    assert_eq!(dev.bytes_held(), 0, "a refused write changes nothing");
}
