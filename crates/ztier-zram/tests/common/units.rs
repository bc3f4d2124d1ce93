//! What the tests of compression units share: a pool whose classes reach a unit's size, and
//! a device of whole units over it.

use ztier_compress::Algorithm;
use ztier_pool::{AllocatorKind, ZPool, ZsConfig};
use ztier_zram::Device;

/// zsmalloc with classes up to `unit` bytes.
pub fn pool(unit: usize) -> Box<dyn ZPool> {
    pool_of(AllocatorKind::Zsmalloc, unit)
}

/// `allocator` with objects up to `unit` bytes, as the registry lays it out.
pub fn pool_of(allocator: AllocatorKind, unit: usize) -> Box<dyn ZPool> {
    allocator
        .make_pool(&ZsConfig::default().with_max_object(unit))
        .unwrap()
}

/// A device of `units` units of `unit` bytes on zsmalloc, compressing with `alg`.
pub fn device(units: u64, unit: usize, alg: &str) -> Device {
    device_on(AllocatorKind::Zsmalloc, units, unit, alg)
}

/// [`device`] on `allocator`.
pub fn device_on(allocator: AllocatorKind, units: u64, unit: usize, alg: &str) -> Device {
    Device::with_unit_size(
        units * unit as u64,
        alg.parse::<Algorithm>().unwrap(),
        pool_of(allocator, unit),
        unit,
    )
    .unwrap()
}
