//! The file device: round trips, holes, zeroing, bounds, and its extents.

use ztier_blockdev::file::FileDevice;
use ztier_blockdev::{BlockDevice, BlockError};

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ztier-blockdev-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn reads_writes_discards_and_zeroes() {
    let dev = FileDevice::open(&temp("rw"), 1 << 20).unwrap();
    assert_eq!((dev.size(), dev.block_size()), (1 << 20, 4096));
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
    dev.write_at(4096, &data, true).unwrap();
    let mut back = vec![0; data.len()];
    dev.read_at(4096, &mut back).unwrap();
    assert_eq!(back, data);

    // A punched hole reads as zeros and shows as a hole.
    dev.discard(8192, 4096).unwrap();
    dev.read_at(4096, &mut back).unwrap();
    assert!(back[4096..8192].iter().all(|&b| b == 0));
    assert_eq!(back[..4096], data[..4096]);
    assert_eq!(back[8192..], data[8192..]);
    let extents = dev.block_status(0, 4 * 4096).unwrap();
    assert_eq!(extents.iter().map(|e| e.len).sum::<u64>(), 4 * 4096);
    assert!(extents[0].hole, "{extents:?}");
    assert!(extents.iter().any(|e| !e.hole), "{extents:?}");

    // Zeroing without unmapping, at an unaligned range.
    dev.write_zeroes(4096 + 100, 50, false).unwrap();
    dev.read_at(4096, &mut back).unwrap();
    assert!(back[100..150].iter().all(|&b| b == 0));
    assert_eq!(back[..100], data[..100]);
    dev.flush().unwrap();
}

#[test]
fn ranges_outside_the_device_are_refused() {
    let dev = FileDevice::open(&temp("bounds"), 8192).unwrap();
    let mut buf = [0u8; 16];
    for r in [
        dev.read_at(8190, &mut buf),
        dev.write_at(u64::MAX - 4, &buf, false),
        dev.discard(4096, 8192),
        dev.write_zeroes(u64::MAX, 2, true),
    ] {
        let e = r.unwrap_err();
        assert!(matches!(e, BlockError::OutOfRange { .. }), "{e}");
        assert_eq!(e.errno(), libc_einval());
    }
}

fn libc_einval() -> i32 {
    22
}

#[test]
fn a_directory_is_not_a_device() {
    let e = FileDevice::open(&std::env::temp_dir(), 4096).err().unwrap();
    assert!(
        e.to_string().contains("Is a directory") || e.to_string().contains("not a regular file"),
        "{e}"
    );
}

#[test]
fn conformance() {
    let dev = FileDevice::open(&temp("conformance"), 64 * 4096).unwrap();
    ztier_blockdev::testing::run_all(&dev);
}
