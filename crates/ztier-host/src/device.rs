//! One device of the host: its spec, its zram device, its own policy, its state file and
//! store (a path of its own, or its volume of the host's shared store), and what the host's
//! budget took from it.
//!
//! Invariants: the state's guard is taken at most once (`consumed`); after `quiesce` no
//! policy or writeback changes the device's store; the spec's limits (`mem_limit`,
//! `mem_low`) are the device's now (a runtime change is made to both). Locks:
//! `HostDevice::policy`, then zram's own; `HostDevice::spec` is a leaf.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use ztier_blockdev::thin::Volume;
use ztier_blockdev::BlockDevice;
use ztier_zram::{Device, Policy, StateFile, StateSummary};

use crate::error::HostError;
use crate::spec::DeviceSpec;

/// One device of the host.
pub struct HostDevice {
    pub(crate) name: String,
    /// As made, with the limits changed since (what a restart makes again).
    pub(crate) spec: RwLock<DeviceSpec>,
    pub(crate) device: Arc<Device>,
    /// The device's own policy, if its spec asks for one.
    pub(crate) policy: Mutex<Option<Policy>>,
    pub(crate) state: Option<StateFile>,
    /// Whether a state was loaded at creation.
    pub(crate) loaded: bool,
    /// The state's guard is taken (the file renamed `.loaded`).
    pub(crate) consumed: AtomicBool,
    pub(crate) store_path: Option<PathBuf>,
    /// Its part of the host's shared store, if the host has one (its store is this volume).
    pub(crate) volume: Option<Arc<Volume>>,
    /// Pages the host's budget wrote back from this device.
    pub(crate) budget_pages: AtomicU64,
}

impl HostDevice {
    /// The device's spec: as it was made, with its limits as they are now.
    pub fn spec(&self) -> DeviceSpec {
        self.spec.read().clone()
    }

    /// The device's protection (`mem_low`): its pages under it are taken by the host's
    /// budget only when every device is down to its own.
    pub fn mem_low(&self) -> u64 {
        self.spec.read().mem_low
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zram device (its statistics, its sysfs attributes).
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    /// The device as front ends serve it.
    pub fn block_device(&self) -> Arc<dyn BlockDevice> {
        Arc::clone(&self.device) as Arc<dyn BlockDevice>
    }

    /// Whether a state was loaded when the device was made.
    pub fn state_loaded(&self) -> bool {
        self.loaded
    }

    /// Bytes of the host's shared store the device's volume holds, and its limit there
    /// (`None`: none but the store's room); `None` on a host without a shared store.
    pub fn shared_store_use(&self) -> Option<(u64, Option<u64>)> {
        self.volume.as_ref().map(|v| (v.mapped_bytes(), v.limit()))
    }

    /// Pages the host's budget wrote back from this device.
    pub fn budget_written_back_pages(&self) -> u64 {
        self.budget_pages.load(Ordering::Relaxed)
    }

    /// The device's own policy's counters, if it has one.
    pub fn policy_stats(&self) -> Option<ztier_zram::PolicyStats> {
        self.policy.lock().as_ref().map(Policy::stats)
    }

    /// Takes the state's guard (`StateFile::consume`): from now on a host that dies leaves
    /// no state that would serve this device's pages as they were before. Called once the
    /// device is served; again, it does nothing.
    pub fn consume_state(&self) -> Result<(), HostError> {
        let Some(state) = &self.state else {
            return Ok(());
        };
        if self.consumed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        state
            .consume(self.loaded)
            .map_err(|source| HostError::State {
                name: self.name.clone(),
                path: state.path().to_path_buf(),
                source: Box::new(source),
            })
    }

    /// Saves the device's state (at a stop: `stopped`), if it keeps one.
    pub fn save_state(&self, stopped: bool) -> Option<Result<StateSummary, HostError>> {
        let state = self.state.as_ref()?;
        Some(
            state
                .save(&self.device, stopped)
                .map_err(|source| HostError::State {
                    name: self.name.clone(),
                    path: state.path().to_path_buf(),
                    source: Box::new(source),
                }),
        )
    }

    /// Stops the device's own policy and closes writeback: nothing changes its store from
    /// now on (before a save).
    pub fn quiesce(&self) {
        if let Some(p) = self.policy.lock().take() {
            p.stop();
        }
        self.device.close_writeback();
    }
}
