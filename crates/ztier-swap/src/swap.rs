//! Several swap devices by priority: the kernel's `folio_alloc_swap()` over `swap_info[]`.
//!
//! An allocation first tries the device the thread allocated from last for that order (its
//! current cluster there: no shared lock), then the available devices in order, each one
//! requeued behind its equals as it is tried, so devices of one priority take turns by
//! cluster. A full device is off the available list (its off-list bit, see
//! `avail`) and comes back with the first free.
//!
//! Devices are added, never removed (no swapoff); `devices` is written once per index under
//! `swapon`'s lock and read without a lock.

use std::sync::{Arc, Mutex, OnceLock};

use serde::Serialize;
use ztier_base::shard::{shard_index, Counters, Shards};
use ztier_blockdev::BlockDevice;

use crate::avail::Avail;
use crate::cluster::NR_ORDERS;
use crate::entry::{SwapEntry, MAX_SWAPFILES};
use crate::lockstat::LockReport;
use crate::swapfile::{Config, Device, DeviceStats, Inner};
use crate::SwapError;

/// The device each thread allocated from last, per order (`u8::MAX`: none).
struct LastDevice([u8; NR_ORDERS]);

impl Default for LastDevice {
    fn default() -> Self {
        LastDevice([u8::MAX; NR_ORDERS])
    }
}

ztier_base::counters! {
    /// What a [`Swap`] counts beside its devices.
    enum Count {
        /// Allocations of `2^order` slots that no device could serve, by order.
        Fallback[NR_ORDERS],
    }
}

/// The swap devices of a system.
pub struct Swap {
    devices: Vec<OnceLock<Device>>,
    swapon_lock: Mutex<usize>,
    avail: Arc<Avail>,
    last: Shards<LastDevice>,
    fallbacks: Counters<{ Count::COUNT }>,
}

impl Default for Swap {
    fn default() -> Self {
        Swap::new()
    }
}

impl Swap {
    pub fn new() -> Swap {
        Swap {
            devices: (0..MAX_SWAPFILES).map(|_| OnceLock::new()).collect(),
            swapon_lock: Mutex::new(0),
            avail: Avail::new(),
            last: Shards::default(),
            fallbacks: Counters::default(),
        }
    }

    /// Adds a device over `backing`; returns its index (the entries' device).
    pub fn swapon(&self, backing: Arc<dyn BlockDevice>, config: Config) -> Result<u8, SwapError> {
        let mut count = self.swapon_lock.lock().unwrap_or_else(|p| p.into_inner());
        if *count >= MAX_SWAPFILES {
            return Err(SwapError::TooManyDevices);
        }
        let id = *count as u8;
        let device = Device::attach(backing, config, id, Arc::clone(&self.avail))?;
        if self.devices[*count].set(device).is_err() {
            unreachable!("index {id} is set once, under swapon's lock");
        }
        *count += 1;
        Ok(id)
    }

    /// Device `id`, if it was added.
    pub fn device(&self, id: u8) -> Option<&Device> {
        self.devices.get(usize::from(id))?.get()
    }

    fn device_of(&self, entry: SwapEntry) -> Result<&Device, SwapError> {
        self.device(entry.device())
            .ok_or(SwapError::NoDevice(entry.device()))
    }

    /// The devices with free slots, in the order the next allocation tries them.
    pub fn available(&self) -> Vec<u8> {
        self.avail.ids()
    }

    /// Allocates `2^order` contiguous, aligned slots on a device with room.
    pub fn alloc(&self, order: u32) -> Result<SwapEntry, SwapError> {
        self.alloc_on(shard_index(), order)
    }

    /// As [`alloc`](Self::alloc), as the thread of CPU `cpu`.
    pub fn alloc_on(&self, cpu: usize, order: u32) -> Result<SwapEntry, SwapError> {
        Inner::check_order(order)?;
        let o = order as usize;
        let last = self.last.at(cpu).0[o];
        if let Some(dev) = self.device(last) {
            if let Some(slot) = dev.inner().alloc_fast(cpu, order) {
                dev.inner().count_alloc(order);
                return Ok(SwapEntry::new(last, u64::from(slot)));
            }
        }
        for id in self.avail.ids() {
            self.avail.requeue(id);
            let Some(dev) = self.device(id) else { continue };
            if let Some(slot) = dev.inner().alloc_slow(cpu, order) {
                dev.inner().count_alloc(order);
                self.last.at(cpu).0[o] = id;
                return Ok(SwapEntry::new(id, u64::from(slot)));
            }
        }
        self.fallbacks.add(Count::Fallback.at(o), 1);
        Err(SwapError::Full { order })
    }

    /// Drops one reference to the entry's slot.
    pub fn free(&self, entry: SwapEntry) -> Result<(), SwapError> {
        self.device_of(entry)?.free(entry.offset())
    }

    /// Drops one reference to each of `nr` slots from `entry`, in one cluster.
    pub fn free_range(&self, entry: SwapEntry, nr: u64) -> Result<(), SwapError> {
        self.device_of(entry)?.free_range(entry.offset(), nr)
    }

    pub fn dup(&self, entry: SwapEntry) -> Result<(), SwapError> {
        self.device_of(entry)?.dup(entry.offset())
    }

    pub fn usage(&self, entry: SwapEntry) -> Result<u8, SwapError> {
        self.device_of(entry)?.usage(entry.offset())
    }

    pub fn write(&self, entry: SwapEntry, page: &[u8]) -> Result<(), SwapError> {
        self.device_of(entry)?.write_slot(entry.offset(), page)
    }

    pub fn read(&self, entry: SwapEntry, page: &mut [u8]) -> Result<(), SwapError> {
        self.device_of(entry)?.read_slot(entry.offset(), page)
    }

    /// Every device's statistics, and the allocations no device had room for.
    pub fn stats(&self) -> SwapStats {
        let devices: Vec<DeviceStats> = self
            .devices
            .iter()
            .filter_map(|d| d.get())
            .map(Device::stats)
            .collect();
        SwapStats {
            devices,
            fallbacks: (0..NR_ORDERS)
                .map(|o| self.fallbacks.sum(Count::Fallback.at(o)))
                .collect(),
            avail_lock: self.avail.lock_stats.report(),
        }
    }
}

/// A [`Swap`]'s statistics.
#[derive(Debug, Clone, Serialize)]
pub struct SwapStats {
    pub devices: Vec<DeviceStats>,
    /// Per order, allocations that no device could serve.
    pub fallbacks: Vec<u64>,
    pub avail_lock: LockReport,
}
