//! The host: its devices by name, each a zram device with its pool, limits, policy, state
//! file and backing store, made and ended while the others serve; the memory group every
//! device's pool counts toward (the host's limit); and the budget's thread
//! ([`crate::budget`]).
//!
//! Invariants: a name names at most one device; a device in the table is in the host's
//! memory group, has the limits its spec gives, and (with a state directory) has its state
//! file's guard taken once [`HostDevice::consume_state`] ran; a destroyed device is out of
//! the table before its files are removed, and its memory goes back when the last holder
//! of it (a front end's connection) lets it go.
//!
//! Locks, outer first: `Host::devices` (the table: read to look up or list, written to add
//! or remove; never held across a device's work), `Host::budget` (the budget thread's
//! handle), then a device's own (`HostDevice::policy`, then zram's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use ztier_base::units::parse_size;
use ztier_blockdev::file::FileDevice;
use ztier_blockdev::thin::{ThinStore, Volume, VolumeMap};
use ztier_blockdev::BlockDevice;
use ztier_zram::{Backing, Device, MemoryGroup, Policy, StateFile, StateSummary, ZramError};

use crate::budget::{Budget, BudgetStats, Pools};
use crate::device::HostDevice;
use crate::error::{HostError, VolumeError};
use crate::spec::{DeviceSpec, SavedSpecError, SpecError};

/// How a host keeps its devices.
#[derive(Debug, Clone, Default)]
pub struct HostConfig {
    /// The pools' sum the budget keeps under by writing back the coldest pages (every
    /// device needs a store: `store_dir`); none by default.
    pub target: Option<u64>,
    /// The pools' sum no write may take them past (it fails with ENOSPC); 0 = none.
    pub limit: u64,
    /// How often the budget looks (default 10 s).
    pub interval: Option<Duration>,
    /// Where each device's state is kept across restarts (`NAME.state`), if anywhere.
    pub state_dir: Option<PathBuf>,
    /// Where each device's backing store is (`NAME.store`, a sparse file of its own), if
    /// anywhere: each device's written-back pages in its own file, never read by another,
    /// removed with the device.
    pub store_dir: Option<PathBuf>,
    /// Or one store for every device (a file, a disk, an NBD export): each device's
    /// written-back pages in extents of its own (`ztier_blockdev::thin`: never read by
    /// another device, given back when it is destroyed). With a state directory, each
    /// device's map of its extents is kept there (`NAME.volume`) with its state.
    pub shared_store: Option<Arc<ThinStore>>,
}

/// The devices by name, and the names of those being made: a name is in at most one of the
/// two, so two callers making one name at once never both make it (the second is refused
/// before it touches the first one's store or state files).
#[derive(Default)]
struct DeviceTable {
    made: BTreeMap<String, Arc<HostDevice>>,
    making: std::collections::BTreeSet<String>,
}

/// The host of devices.
pub struct Host {
    config: HostConfig,
    group: Arc<MemoryGroup>,
    devices: RwLock<DeviceTable>,
    budget: Mutex<Option<Budget>>,
    /// Volumes of the shared store taken back at start (the devices a clean stop saved),
    /// by device name, each waiting for its device to be made again. They hold their
    /// extents meanwhile, so no device made first takes them.
    restored: Mutex<BTreeMap<String, Arc<Volume>>>,
}

impl Host {
    /// A host with no devices; its budget's thread starts if it has a target.
    pub fn new(config: HostConfig) -> Result<Arc<Host>, HostError> {
        if config.target.is_some() && config.store_dir.is_none() && config.shared_store.is_none() {
            return Err(HostError::TargetWithoutStores);
        }
        if config.store_dir.is_some() && config.shared_store.is_some() {
            return Err(HostError::TwoKindsOfStore);
        }
        let restored = match (&config.shared_store, &config.state_dir) {
            (Some(store), Some(dir)) => restore_volumes(store, dir)?,
            _ => BTreeMap::new(),
        };
        let host = Arc::new(Host {
            group: Arc::new(MemoryGroup::new(config.limit)),
            config,
            devices: RwLock::new(DeviceTable::default()),
            budget: Mutex::new(None),
            restored: Mutex::new(restored),
        });
        if let Some(target) = host.config.target {
            let interval = host.config.interval.unwrap_or(Duration::from_secs(10));
            let pools: Arc<dyn Pools> = Arc::clone(&host) as Arc<dyn Pools>;
            let budget = Budget::start(Arc::downgrade(&pools), target, interval)
                .map_err(HostError::Budget)?;
            *host.budget.lock() = Some(budget);
        }
        Ok(host)
    }

    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// The memory group every device's pool counts toward.
    pub fn group(&self) -> &MemoryGroup {
        &self.group
    }

    /// The budget's counters, if the host has a target.
    pub fn budget_stats(&self) -> Option<BudgetStats> {
        self.budget.lock().as_ref().map(Budget::stats)
    }

    pub fn get(&self, name: &str) -> Option<Arc<HostDevice>> {
        self.devices.read().made.get(name).cloned()
    }

    /// Writes attribute `attr` of device `name`: one of its zram's (by the kernel's sysfs
    /// names), or the host's `mem_low` or `store_limit`. A limit the spec holds (`mem_limit`,
    /// `mem_low`, `store_limit`) is changed in the spec too and, with a state directory,
    /// saved there, so a restart makes
    /// the device with the limit it had (unless whoever starts the host names the device
    /// again with limits of its own). Returns what the attribute answers.
    pub fn set(&self, name: &str, attr: &str, value: &str) -> Result<String, HostError> {
        let d = self
            .get(name)
            .ok_or_else(|| HostError::NoSuchDevice(name.to_string()))?;
        let answer = match attr {
            "mem_low" => {
                let bytes = parse_size(value).map_err(|e| SpecError::BadValue {
                    name: name.to_string(),
                    key: attr.to_string(),
                    value: value.to_string(),
                    why: Box::new(e.into()),
                })?;
                d.spec.write().mem_low = bytes;
                "mem_low set".to_string()
            }
            "store_limit" => {
                let bytes = parse_size(value).map_err(|e| SpecError::BadValue {
                    name: name.to_string(),
                    key: attr.to_string(),
                    value: value.to_string(),
                    why: Box::new(e.into()),
                })?;
                let volume =
                    d.volume
                        .as_ref()
                        .ok_or_else(|| HostError::StoreLimitWithoutSharedStore {
                            name: name.to_string(),
                        })?;
                volume.set_limit((bytes > 0).then_some(bytes));
                d.spec.write().store_limit = bytes;
                "store_limit set".to_string()
            }
            _ => d
                .device
                .store_attr(attr, value)
                .map_err(|source| HostError::Device {
                    name: name.to_string(),
                    source: Box::new(source),
                })?,
        };
        if attr == "mem_limit" {
            d.spec.write().mem_limit = d.device.mm_stat().mem_limit;
        }
        if let (Some(dir), "mem_limit" | "mem_low" | "store_limit") = (&self.config.state_dir, attr)
        {
            write_spec(&dir.join(format!("{name}.spec")), &d.spec())?;
        }
        Ok(answer)
    }

    /// Runs one tick of the budget now, whatever its interval (a host without a target:
    /// nothing); returns the pools' sum after, and what the tick did.
    pub fn keep_under_target(&self) -> Option<(u64, BudgetStats)> {
        let target = self.config.target?;
        let mut tick = BudgetStats::default();
        let used = crate::budget::keep_under(self as &dyn Pools, target, &mut tick, &|| false);
        Some((used, tick))
    }

    /// Every device, by name.
    pub fn devices(&self) -> Vec<Arc<HostDevice>> {
        self.devices.read().made.values().cloned().collect()
    }

    /// Makes a device: its pool, limits and policy, in the host's group; its store (in the
    /// store directory) and its state (from the state directory, if one is there: loaded,
    /// its guard taken by [`HostDevice::consume_state`] once it is served).
    pub fn create(&self, spec: DeviceSpec) -> Result<Arc<HostDevice>, HostError> {
        let name = spec.name.clone();
        {
            let mut devices = self.devices.write();
            if devices.made.contains_key(&name) || !devices.making.insert(name.clone()) {
                return Err(HostError::Exists(name));
            }
        }
        // The name is this call's until it ends, however it ends.
        struct Making<'a>(&'a RwLock<DeviceTable>, &'a str);
        impl Drop for Making<'_> {
            fn drop(&mut self) {
                self.0.write().making.remove(self.1);
            }
        }
        let _making = Making(&self.devices, &name);
        let made = self.make(spec)?;
        if let Some(dir) = &self.config.state_dir {
            write_spec(&dir.join(format!("{name}.spec")), &made.spec())?;
        }
        self.devices
            .write()
            .made
            .insert(name.clone(), Arc::clone(&made));
        Ok(made)
    }

    /// The specs of the devices a host with this state directory had when it stopped (each
    /// `NAME.spec` there), by name: a host started again makes them, with their states.
    pub fn saved_specs(state_dir: &Path) -> Result<Vec<DeviceSpec>, HostError> {
        let mut specs = Vec::new();
        let entries = match std::fs::read_dir(state_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(specs),
            Err(e) => {
                return Err(HostError::SavedSpec {
                    path: state_dir.to_path_buf(),
                    why: e.into(),
                })
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "spec") {
                specs.push(read_spec(&path)?);
            }
        }
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(specs)
    }

    fn make(&self, spec: DeviceSpec) -> Result<Arc<HostDevice>, HostError> {
        let name = spec.name.clone();
        if spec.store_limit > 0 && self.config.shared_store.is_none() {
            return Err(HostError::StoreLimitWithoutSharedStore { name });
        }
        let device_error = |source| HostError::Device {
            name: name.clone(),
            source: Box::new(source),
        };
        // Units above a page need the allocator's classes up to the unit's size.
        let layout = if spec.unit_size > spec.layout.page_size {
            spec.layout.with_max_object(spec.unit_size)
        } else {
            spec.layout
        };
        let pool = spec
            .allocator
            .make_pool(&layout)
            .map_err(|e| device_error(ZramError::Pool(e)))?;
        let device =
            Device::with_unit_size(spec.size, spec.compressor.clone(), pool, spec.unit_size)
                .map_err(device_error)?;
        device.set_mem_limit(spec.mem_limit);
        device
            .set_recomp_algorithms(spec.recompress_algorithms.clone())
            .map_err(device_error)?;
        device
            .join_group(Arc::clone(&self.group))
            .map_err(device_error)?;
        let state = self
            .config
            .state_dir
            .as_ref()
            .map(|dir| StateFile::new(dir.join(format!("{name}.state"))));
        let store_path = self
            .config
            .store_dir
            .as_ref()
            .map(|dir| dir.join(format!("{name}.store")));
        // Its volume of the shared store: the one a clean stop saved, or a new one.
        let volume = self.config.shared_store.as_ref().map(|store| {
            self.restored
                .lock()
                .remove(&name)
                .unwrap_or_else(|| Arc::new(store.volume(Backing::size_for(spec.size))))
        });
        if let Some(v) = &volume {
            v.set_limit((spec.store_limit > 0).then_some(spec.store_limit));
        }
        let mut loaded = false;
        if let Some(state) = &state {
            let state_error = |source| HostError::State {
                name: name.clone(),
                path: state.path().to_path_buf(),
                source: Box::new(source),
            };
            if let Some(file) = state.open().map_err(state_error)? {
                let mut input = std::io::BufReader::with_capacity(1 << 20, file);
                let kept_store = match (&volume, store_path.as_deref()) {
                    (Some(v), _) if v.mapped_bytes() > 0 => {
                        Some(Arc::clone(v) as Arc<dyn BlockDevice>)
                    }
                    (_, Some(path)) if path.exists() => Some(open_store(&name, path, None)?),
                    _ => None,
                };
                match kept_store {
                    Some(store) => {
                        device
                            .load_state_with_store(&mut input, store, spec.writeback_format)
                            .map_err(state_error)?;
                    }
                    None => {
                        device.load_state(&mut input).map_err(state_error)?;
                    }
                }
                loaded = true;
            }
        }
        if device.backing().is_none() {
            let store = match (&volume, &store_path) {
                (Some(v), _) => Some(Arc::clone(v) as Arc<dyn BlockDevice>),
                (None, Some(path)) => {
                    Some(open_store(&name, path, Some(Backing::size_for(spec.size)))?)
                }
                (None, None) => None,
            };
            if let Some(store) = store {
                let backing = Backing::new(store, spec.writeback_format).map_err(device_error)?;
                device.set_backing(Some(backing)).map_err(device_error)?;
            }
        }
        let device = Arc::new(device);
        let policy_config =
            spec.policy_config(self.config.interval.unwrap_or(Duration::from_secs(10)));
        let policy = if policy_config.is_active() {
            Some(
                Policy::start(Arc::clone(&device), policy_config).map_err(|source| {
                    HostError::Policy {
                        name: name.clone(),
                        source,
                    }
                })?,
            )
        } else {
            None
        };
        Ok(Arc::new(HostDevice {
            name: spec.name.clone(),
            spec: RwLock::new(spec),
            device,
            policy: Mutex::new(policy),
            state,
            loaded,
            consumed: AtomicBool::new(false),
            store_path,
            volume,
            budget_pages: AtomicU64::new(0),
        }))
    }

    /// Takes a device out of the table without ending its files (its state, spec and store
    /// stay as they are): a device that could not be served after it was made, so a start
    /// that fails keeps what the last run saved. Its policy stops; its memory goes with the
    /// last holder.
    pub fn abandon(&self, name: &str) -> Option<Arc<HostDevice>> {
        let gone = self.devices.write().made.remove(name)?;
        gone.quiesce();
        Some(gone)
    }

    /// Ends a device: out of the table (no new front end finds it), its policy stopped, its
    /// state and store files removed. Its memory goes back when the last holder lets it go
    /// (the caller makes sure no front end holds it, or lets them end first). Returns it.
    pub fn destroy(&self, name: &str) -> Result<Arc<HostDevice>, HostError> {
        let gone = self
            .devices
            .write()
            .made
            .remove(name)
            .ok_or_else(|| HostError::NoSuchDevice(name.to_string()))?;
        gone.quiesce();
        if let Some(state) = &gone.state {
            let _ = std::fs::remove_file(state.path());
            let _ = std::fs::remove_file(state.loaded_path());
        }
        if let Some(dir) = &self.config.state_dir {
            let _ = std::fs::remove_file(dir.join(format!("{name}.spec")));
        }
        if let Some(path) = &gone.store_path {
            let _ = std::fs::remove_file(path);
        }
        if let Some(dir) = &self.config.state_dir {
            let _ = std::fs::remove_file(dir.join(format!("{name}.volume")));
        }
        // Its volume's extents go back to the shared store with the device's last holder.
        Ok(gone)
    }

    /// Stops the budget and every device's policy, closes writeback, and saves each device's
    /// state (where the host keeps them); returns each save's outcome by name.
    pub fn stop_and_save(&self) -> Vec<(String, Result<StateSummary, HostError>)> {
        if let Some(b) = self.budget.lock().take() {
            b.stop();
        }
        let devices = self.devices();
        let mut saved = Vec::new();
        for d in &devices {
            d.quiesce();
            if let Some(r) = d.save_state(true) {
                // A saved state's pages on the shared store are kept there for the next
                // start: the volume's map beside the state, its extents not given back.
                let r = match (r, &d.volume, &self.config.state_dir) {
                    (Ok(summary), Some(volume), Some(dir)) => {
                        save_volume(d.name(), volume, dir).map(|()| summary)
                    }
                    (r, _, _) => r,
                };
                saved.push((d.name().to_string(), r));
            }
        }
        if self.config.state_dir.is_none() {
            // Without states, stores hold nothing anyone will read again.
            for d in &devices {
                if let Some(path) = &d.store_path {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
        saved
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(b) = self.budget.get_mut().take() {
            b.stop();
        }
    }
}

/// The volumes a clean stop kept on the shared store (each `NAME.volume` beside its
/// `NAME.state` in `dir`), taken back, so that no device made before its own takes their
/// extents. A map without its state (a host that died after the device was served: its
/// state was consumed) is stale: removed, and its extents are free.
fn restore_volumes(
    store: &Arc<ThinStore>,
    dir: &Path,
) -> Result<BTreeMap<String, Arc<Volume>>, HostError> {
    use std::io::Read;
    let mut restored = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(restored);
    };
    for path in entries.flatten().map(|e| e.path()) {
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".volume"))
        else {
            continue;
        };
        if !dir.join(format!("{name}.state")).exists() {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let failed = |why: VolumeError| HostError::Volume {
            name: name.to_string(),
            path: path.clone(),
            why,
        };
        let spec = read_spec(&dir.join(format!("{name}.spec")))?;
        let mut bytes = Vec::new();
        ztier_base::private_file::open(&path, false)
            .map_err(|e| failed(e.into()))?
            .take(64 << 20)
            .read_to_end(&mut bytes)
            .map_err(|e| failed(e.into()))?;
        let map = VolumeMap::from_bytes(&bytes).map_err(|e| failed(e.into()))?;
        let volume = store
            .restore(Backing::size_for(spec.size), &map)
            .map_err(|e| failed(e.into()))?;
        restored.insert(name.to_string(), Arc::new(volume));
    }
    Ok(restored)
}

/// Keeps a stopped device's volume on the shared store for the next start: the store
/// flushed (an extent's zeroing as it was taken is durable), the map written beside the
/// state (private, whole or not at all), and the volume closed (its extents not given back
/// when it goes).
fn save_volume(name: &str, volume: &Volume, dir: &Path) -> Result<(), HostError> {
    use std::io::Write;
    let path = dir.join(format!("{name}.volume"));
    let failed = |why: VolumeError| HostError::Volume {
        name: name.to_string(),
        path: path.clone(),
        why,
    };
    volume
        .store()
        .device()
        .flush()
        .map_err(|e| failed(e.into()))?;
    let temporary = path.with_extension("volume.new");
    let _ = std::fs::remove_file(&temporary);
    let mut file = ztier_base::private_file::create(&temporary).map_err(|e| failed(e.into()))?;
    file.write_all(&volume.map().to_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| failed(e.into()))?;
    std::fs::rename(&temporary, &path).map_err(|e| failed(e.into()))?;
    volume.close();
    Ok(())
}

/// A device's store file: opened at its own size (`size` None: it must exist), or made
/// (sparse, private) at `size`.
fn open_store(
    name: &str,
    path: &Path,
    size: Option<u64>,
) -> Result<Arc<dyn BlockDevice>, HostError> {
    let bytes = match size {
        Some(s) => s,
        None => std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
    };
    FileDevice::open(path, bytes)
        .map(|f| Arc::new(f) as Arc<dyn BlockDevice>)
        .map_err(|source| HostError::Store {
            name: name.to_string(),
            path: path.to_path_buf(),
            source,
        })
}

/// Writes `spec` to `path` as `key=value` lines, private (0600), replacing what was there
/// only once the new file is whole (written beside it, synced, renamed).
fn write_spec(path: &Path, spec: &DeviceSpec) -> Result<(), HostError> {
    use std::io::Write;
    let failed = |why: SavedSpecError| HostError::SavedSpec {
        path: path.to_path_buf(),
        why,
    };
    let mut text = String::new();
    for (key, value) in spec.to_pairs() {
        text.push_str(&format!("{key}={value}\n"));
    }
    let temporary = path.with_extension("spec.new");
    let _ = std::fs::remove_file(&temporary);
    let mut file = ztier_base::private_file::create(&temporary)
        .map_err(|e| failed(SavedSpecError::File(e)))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| failed(e.into()))?;
    std::fs::rename(&temporary, path).map_err(|e| failed(e.into()))
}

/// A spec [`write_spec`] wrote (refused if another user could have written the file).
fn read_spec(path: &Path) -> Result<DeviceSpec, HostError> {
    use std::io::Read;
    let failed = |why: SavedSpecError| HostError::SavedSpec {
        path: path.to_path_buf(),
        why,
    };
    let mut text = String::new();
    ztier_base::private_file::open(path, false)
        .map_err(|e| failed(SavedSpecError::File(e)))?
        .take(64 << 10)
        .read_to_string(&mut text)
        .map_err(|e| failed(e.into()))?;
    let pairs = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.split_once('=').ok_or_else(|| {
                failed(SavedSpecError::NotAPair {
                    line: l.to_string(),
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    DeviceSpec::from_pairs(None, pairs).map_err(|e| failed(e.into()))
}

impl Pools for Host {
    fn devices(&self) -> Vec<Arc<HostDevice>> {
        Host::devices(self)
    }

    fn used_bytes(&self) -> u64 {
        self.group.used_bytes()
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;
    use crate::spec::ValueError;

    /// A state directory of its own, with `files` (name, text) in it.
    fn state_dir(files: &[(&str, &str)]) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "ztier-host-saved-{}-{}",
            std::process::id(),
            files[0].0
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            let path = d.join(name);
            let mut f = ztier_base::private_file::create(&path).unwrap();
            std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        }
        d
    }

    /// A saved spec that cannot be read back says which file and why, the why kept whole
    /// as the error's source.
    #[test]
    fn a_bad_saved_spec_keeps_its_cause() {
        let d = state_dir(&[("a.spec", "name=a\nsize=1M\noops\n")]);
        let e = Host::saved_specs(&d).unwrap_err();
        assert!(
            matches!(
                &e,
                HostError::SavedSpec {
                    why: SavedSpecError::NotAPair { line },
                    ..
                } if line == "oops"
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("the saved spec {}", d.join("a.spec").display())
        );
        assert_eq!(e.source().unwrap().to_string(), "\"oops\" is not key=value");
        let _ = std::fs::remove_dir_all(&d);

        let d = state_dir(&[("b.spec", "name=b\nsize=1M\ncompressor=lz9\n")]);
        let e = Host::saved_specs(&d).unwrap_err();
        assert!(
            matches!(
                &e,
                HostError::SavedSpec {
                    why: SavedSpecError::Spec(SpecError::BadValue { why, .. }),
                    ..
                } if matches!(**why, ValueError::Compressor(_))
            ),
            "{e:?}"
        );
        let cause = e.source().unwrap().to_string();
        assert!(
            cause.starts_with("device b: compressor=lz9: unknown compressor 'lz9'"),
            "{cause}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
