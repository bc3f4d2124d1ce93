//! What the tests of compression units share: a pool whose classes reach a unit's size, and
//! a device of whole units over it.

use ztier_compress::Algorithm;
use ztier_pool::{ZPool, ZsConfig, ZsPool};
use ztier_zram::Device;

/// zsmalloc with classes up to `unit` bytes.
pub fn pool(unit: usize) -> Box<dyn ZPool> {
    Box::new(ZsPool::new(ZsConfig::default().with_max_object(unit)).unwrap())
}

/// A device of `units` units of `unit` bytes, compressing with `alg`.
pub fn device(units: u64, unit: usize, alg: &str) -> Device {
    Device::with_unit_size(
        units * unit as u64,
        alg.parse::<Algorithm>().unwrap(),
        pool(unit),
        unit,
    )
    .unwrap()
}
