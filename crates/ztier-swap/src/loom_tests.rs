//! Model checks with loom: every interleaving (to loom's preemption bound) of the
//! allocator's locks and atomics on a small device. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p ztier-swap --release --lib loom`.
//!
//! Each modelled thread names its own CPU, so the per-thread shards (not modelled) are never
//! shared; the cluster locks, the device lock, the available-list lock and the in-use
//! counter are loom's.

use std::sync::Arc;

use ztier_blockdev::memory::MemoryDevice;

use crate::{Config, Device, SLOT_BYTES, SWAPFILE_CLUSTER};

fn device(slots: u64) -> Arc<Device> {
    let backing = Arc::new(MemoryDevice::new(slots * SLOT_BYTES).unwrap());
    Arc::new(Device::new(backing, Config::default()).unwrap())
}

/// Two CPUs allocate from their own clusters and free, beside each other: no slot is given
/// twice, every cluster ends on the list its state names, the counts add up.
#[test]
fn loom_per_thread_cluster_path() {
    loom::model(|| {
        let dev = device(2 * u64::from(SWAPFILE_CLUSTER));
        let threads: Vec<_> = (0..2)
            .map(|cpu| {
                let dev = Arc::clone(&dev);
                loom::thread::spawn(move || {
                    let a = dev.alloc_on(cpu, 0).unwrap();
                    let b = dev.alloc_on(cpu, 0).unwrap();
                    assert_ne!(a, b);
                    dev.free(a).unwrap();
                    b
                })
            })
            .collect();
        let kept: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_ne!(kept[0], kept[1], "one slot given to both CPUs");
        assert_eq!(dev.in_use(), 2);
        dev.check_consistency().unwrap();
    });
}

/// The allocation that fills the device races a free in another cluster (each under its
/// own cluster's lock, so the in-use counter is all they share): whatever the order, the
/// device ends on the available list exactly when it is not full, with its off-list bit
/// saying so.
#[test]
fn loom_off_list_bit() {
    loom::model(|| {
        // Two clusters, 1023 usable slots: all but slot 1 taken before the race.
        let dev = device(2 * u64::from(SWAPFILE_CLUSTER));
        dev.preallocate(1, 0..512);
        dev.preallocate(0, 2..512);
        assert_eq!(dev.in_use(), 1022);
        let filler = {
            let dev = Arc::clone(&dev);
            loom::thread::spawn(move || dev.alloc_on(1, 0).unwrap())
        };
        let freer = {
            let dev = Arc::clone(&dev);
            loom::thread::spawn(move || dev.free(600).unwrap())
        };
        assert_eq!(filler.join().unwrap(), 1);
        freer.join().unwrap();
        assert_eq!(dev.in_use(), 1022);
        assert!(!dev.off_list());
        dev.check_consistency().unwrap();
    });
}
