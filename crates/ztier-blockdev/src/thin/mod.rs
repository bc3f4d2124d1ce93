//! One backing store shared by many devices, each device's part its own: a pool of
//! fixed-size extents on one [`BlockDevice`] (a file, a block device, an NBD export), and
//! thin volumes over it whose extents are taken from the pool on first write and given back
//! on discard and when the volume goes. The kernel's device-mapper thin provisioning
//! (dm-thin's pool and thin devices) is the model; a host of zram devices writes back
//! through one [`Volume`] each.
//!
//! Invariants:
//! - every extent of the store is free or held by exactly one volume (or, for the moment a
//!   discard of it runs, by none: taken out of its volume, not yet back in the free set);
//! - a volume reads only its own extents or zeros: an extent it never wrote, or gave back,
//!   reads as zeros with no store I/O, and an extent it takes is zeroed on the store before
//!   any of its bytes can be read through it (unless the first write covers all of it);
//! - no extent goes back to the store while I/O of its volume to it is in flight (each I/O
//!   pins its extent in the volume's map; a discard waits for the pins to go), so a write
//!   never lands in an extent after another volume took it;
//! - a volume's map holds only the extents it holds (nothing for the virtual size before it
//!   is written) and shrinks as they are given back;
//! - a volume with a limit never takes an extent past it: a first write beyond it is
//!   refused with `NoSpace`, as a full store refuses one, and only that volume's (the
//!   store's other tenants keep their room). A limit lowered below what the volume holds
//!   takes nothing away; the volume takes no more until it is back under.
//!
//! Zeroing: an extent is zeroed when it is taken (`write_zeroes` with unmap, which a file
//! makes a punched hole and an NBD export one request), not tracked block by block. Knowing
//! which blocks were written would cost a bitmap an extent (32 bytes for 1 MiB of 4 KiB
//! blocks, more than the map entry itself), split every read at block boundaries and make a
//! partial-block write a read-modify-write; zeroing costs one cheap request per extent
//! taken, and none when the first write covers the whole extent.
//!
//! Locks, none ever taken with another held, and none held across store I/O:
//! `Volume::slots` (the volume's map and the pins of its I/O in flight; with a condvar on
//! which an I/O waits for an extent being taken or given back by another thread of the same
//! volume) and `ThinStore::free` (the free set: one search or one change of bits). A write
//! to an unmapped extent marks it `Slot::Filling` under `slots`, takes a free extent,
//! zeroes it and writes with no lock held, then marks it mapped; another write to the same
//! extent meanwhile waits on the condvar (a read returns zeros: the first write has not
//! completed).
//!
//! The pieces: the block device a volume is (`block_device.rs`), the free set
//! (`free_set.rs`), the store's label (`label.rs`) and the saved map and its format (`map.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ztier_base::bytes::PastEnd;
use ztier_base::pieces::pieces;

use crate::{check_range, BlockDevice, BlockError, Result};

mod block_device;
mod free_set;
mod label;
mod map;

use free_set::FreeSet;
pub use label::{Label, LABEL_LEN};
pub use map::VolumeMap;

/// Why a store could not be made, a map not read, or a volume not restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ThinError {
    #[error("extent size {extent_size} is not a power of two at least the store's {block_size}-byte block")]
    ExtentSize { extent_size: u64, block_size: u32 },
    #[error("no memory for the free set of {extents} extents")]
    NoMemory { extents: u64 },
    #[error("the volume map is cut short: {0}")]
    Truncated(PastEnd),
    #[error("not a volume map (magic {found:02x?})")]
    Magic { found: [u8; 8] },
    #[error("volume map version {found}, this build reads {}", map::VERSION)]
    Version { found: u32 },
    #[error("volume map's extent size {extent_size} is not a power of two")]
    MapExtentSize { extent_size: u64 },
    #[error("volume map reserved field is {found:#x}, not 0")]
    Reserved { found: u32 },
    #[error("volume map checksum {stored:#010x}, its bytes sum to {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("volume map says {entries} entries, which {len} bytes cannot hold")]
    Length { entries: u64, len: usize },
    #[error("volume map lists volume extent {extent} out of order or twice")]
    VolumeExtentOrder { extent: u64 },
    #[error("volume map's extents are {map} bytes, the store's {store}")]
    ExtentSizeMismatch { map: u64, store: u64 },
    #[error("volume map lists volume extent {extent}, past the volume's {extents} extents")]
    VolumeExtentOutOfRange { extent: u64, extents: u64 },
    #[error("volume map lists store extent {extent}, past the store's {extents} extents")]
    StoreExtentOutOfRange { extent: u64, extents: u64 },
    #[error("volume map lists store extent {extent} twice")]
    StoreExtentTwice { extent: u64 },
    #[error("store extent {extent} is held by another volume")]
    StoreExtentHeld { extent: u64 },
    #[error("volume map lists store extent 0, the store's label (a map saved before stores had labels?)")]
    LabelExtent,
    #[error("not a ztier shared store: its first bytes hold other data (magic {found:02x?}); give an empty file or export")]
    NotAStore { found: [u8; 8] },
    #[error(
        "shared store label version {found}, this build reads {}",
        label::VERSION
    )]
    LabelVersion { found: u32 },
    #[error("shared store label checksum {stored:#010x}, its bytes sum to {computed:#010x}")]
    LabelChecksum { stored: u32, computed: u32 },
    #[error("the shared store was made with {label}-byte extents, and is opened with {asked}")]
    LabelExtentSize { label: u64, asked: u64 },
    #[error("the shared store's label says {label} extents, and it now holds {now}: it shrank")]
    StoreShrank { label: u64, now: u64 },
    #[error("the shared store holds no extent after its label's")]
    NoRoom,
    #[error("the shared store's label could not be read or written")]
    LabelIo(#[source] BlockError),
}

/// A pool of extents on one store, which thin [`Volume`]s take and give back.
pub struct ThinStore {
    device: Arc<dyn BlockDevice>,
    extent_shift: u32,
    extents: u64,
    /// The free set: which extents are held. Taken for one search or one change of bits;
    /// never with a volume's `slots`, never across I/O.
    free: Mutex<FreeSet>,
    /// The label in the first extent (held, never a volume's), if the store was opened
    /// through one.
    label: Option<Label>,
}

/// The default extent: 1 MiB, so a 1 TiB store is 1 Mi extents (a 128 KiB free set).
pub const DEFAULT_EXTENT_SIZE: u64 = 1 << 20;

impl std::fmt::Debug for ThinStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThinStore")
            .field("extent_size", &self.extent_size())
            .field("extents", &self.extents)
            .field("free_extents", &self.free_extents())
            .finish_non_exhaustive()
    }
}

impl ThinStore {
    /// A pool of `extent_size`-byte extents over `device`, every one free (whatever the
    /// device holds: an extent is zeroed as it is taken). `extent_size` is a power of two, at
    /// least the device's block size; a tail of the device shorter than an extent is unused.
    pub fn new(
        device: Arc<dyn BlockDevice>,
        extent_size: u64,
    ) -> std::result::Result<Arc<ThinStore>, ThinError> {
        let block_size = device.block_size();
        if !extent_size.is_power_of_two()
            || extent_size < u64::from(block_size)
            || usize::try_from(extent_size).is_err()
        {
            return Err(ThinError::ExtentSize {
                extent_size,
                block_size,
            });
        }
        let extent_shift = extent_size.trailing_zeros();
        let extents = device.size() >> extent_shift;
        Ok(Arc::new(ThinStore {
            free: Mutex::new(FreeSet::new(extents)?),
            device,
            extent_shift,
            extents,
            label: None,
        }))
    }

    /// A new volume of `size` bytes, holding nothing: every byte reads as zero, and no
    /// store space is set aside for it.
    pub fn volume(self: &Arc<Self>, size: u64) -> Volume {
        Volume {
            store: Arc::clone(self),
            size,
            slots: Mutex::new(Slots::default()),
            changed: Condvar::new(),
            limit_extents: AtomicU64::new(NO_LIMIT),
        }
    }

    /// A volume of `size` bytes holding the extents `map` lists (saved by [`Volume::map`]
    /// before a restart), with the bytes the store has in them. Refused, changing nothing, if
    /// the map's extent size is not the store's, if an extent lies outside the volume or the
    /// store, if a store extent is listed twice, or if another live volume holds one.
    pub fn restore(
        self: &Arc<Self>,
        size: u64,
        map: &VolumeMap,
    ) -> std::result::Result<Volume, ThinError> {
        if map.extent_size != self.extent_size() {
            return Err(ThinError::ExtentSizeMismatch {
                map: map.extent_size,
                store: self.extent_size(),
            });
        }
        let volume_extents = size.div_ceil(self.extent_size());
        let mut store_extents = Vec::with_capacity(map.entries.len());
        for &(volume_extent, store_extent) in &map.entries {
            if volume_extent >= volume_extents {
                return Err(ThinError::VolumeExtentOutOfRange {
                    extent: volume_extent,
                    extents: volume_extents,
                });
            }
            if store_extent >= self.extents {
                return Err(ThinError::StoreExtentOutOfRange {
                    extent: store_extent,
                    extents: self.extents,
                });
            }
            store_extents.push(store_extent);
        }
        store_extents.sort_unstable();
        if let Some(twice) = store_extents.windows(2).find(|w| w[0] == w[1]) {
            return Err(ThinError::StoreExtentTwice { extent: twice[0] });
        }
        {
            if self.label.is_some() && store_extents.first() == Some(&0) {
                return Err(ThinError::LabelExtent);
            }
            let mut free = self.free();
            if let Some(&held) = store_extents.iter().find(|&&e| free.is_held(e)) {
                return Err(ThinError::StoreExtentHeld { extent: held });
            }
            for &e in &store_extents {
                free.set(e, true);
            }
        }
        let volume = self.volume(size);
        {
            let mut slots = volume.slots();
            for &(volume_extent, store_extent) in &map.entries {
                slots.map.insert(
                    volume_extent,
                    Slot::Mapped {
                        store_extent,
                        pins: 0,
                    },
                );
            }
        }
        Ok(volume)
    }

    /// The store under the pool.
    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    pub fn extent_size(&self) -> u64 {
        1 << self.extent_shift
    }

    /// Extents in the pool (the store's whole extents).
    pub fn extents(&self) -> u64 {
        self.extents
    }

    /// Extents no volume holds.
    pub fn free_extents(&self) -> u64 {
        self.extents - self.free().held_count
    }

    /// Extents held by volumes (and the label's, on a store with one).
    pub fn used_extents(&self) -> u64 {
        self.free().held_count
    }

    fn free(&self) -> MutexGuard<'_, FreeSet> {
        // The free set's bits change one at a time, with its count: a panic cannot leave
        // them disagreeing.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Result<u64> {
        self.free().take().ok_or_else(|| {
            BlockError::NoSpace(
                format!(
                    "all {} extents of {} bytes of the shared store are held by volumes",
                    self.extents,
                    self.extent_size()
                )
                .into(),
            )
        })
    }

    fn give_back(&self, store_extents: &[u64]) {
        let mut free = self.free();
        for &e in store_extents {
            free.set(e, false);
        }
    }

    /// Discards the extents on the store, in runs, best effort (the space is given back
    /// whether or not the store frees it: an extent is zeroed when it is next taken). The
    /// number of discards that failed.
    fn discard_extents(&self, sorted: &[u64]) -> u64 {
        let mut failed = 0;
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
                j += 1;
            }
            let offset = sorted[i] << self.extent_shift;
            let len = ((j - i) as u64) << self.extent_shift;
            if self.device.discard(offset, len).is_err() {
                failed += 1;
            }
            i = j;
        }
        failed
    }

    /// Makes a store extent read as zeros: unmapped where the store can, written where not.
    fn zero_extent(&self, store_extent: u64) -> Result<()> {
        let offset = store_extent << self.extent_shift;
        match self.device.write_zeroes(offset, self.extent_size(), true) {
            Err(BlockError::Unsupported(_)) => {
                let zeros = vec![0u8; (self.extent_size() as usize).min(1 << 16)];
                let mut at = 0;
                while at < self.extent_size() {
                    self.device.write_at(offset + at, &zeros, false)?;
                    at += zeros.len() as u64;
                }
                Ok(())
            }
            other => other,
        }
    }
}

/// What one extent of a volume is. A volume extent with no slot is unmapped (reads zeros).
///
/// | state      | reads          | writes           | made by                     | left by                     |
/// |------------|----------------|------------------|-----------------------------|-----------------------------|
/// | (none)     | zeros          | take, → Filling  | a discard, a failed fill    | a write                     |
/// | `Filling`  | zeros          | wait             | a write to an unmapped one  | its fill done (→ Mapped) or failed (→ none) |
/// | `Mapped`   | the store      | the store        | a fill, a restore           | a whole-extent discard (→ Draining, or none if no pins) |
/// | `Draining` | zeros          | wait             | a discard while pinned      | its last pin gone (→ none)  |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A write is taking a store extent for it, zeroing and writing it, with no lock held.
    Filling,
    /// Backed by `store_extent`; `pins` I/O of this volume to it in flight, each holding
    /// the extent from going back to the store.
    Mapped { store_extent: u64, pins: u32 },
    /// Being given back: waits for its `pins` to go, taking no new ones.
    Draining { store_extent: u64, pins: u32 },
}

#[derive(Default)]
struct Slots {
    map: HashMap<u64, Slot>,
    /// Threads waiting on `Volume::changed` (so a change with none waiting wakes nobody).
    waiting: u32,
}

/// A thin volume of a [`ThinStore`]: a block device whose extents are the store's, taken on
/// first write. See the module header for its invariants.
pub struct Volume {
    store: Arc<ThinStore>,
    size: u64,
    /// The volume's map (volume extent to its slot) and its I/O in flight. Never held
    /// across store I/O, never with the store's `free`.
    slots: Mutex<Slots>,
    /// Signalled when a slot leaves `Filling` or a `Draining` slot's last pin goes.
    changed: Condvar,
    /// The most extents the volume may hold ([`NO_LIMIT`]: the store's room is its limit).
    limit_extents: AtomicU64,
}

/// A volume's limit when it has none.
const NO_LIMIT: u64 = u64::MAX;

/// What one extent's access found: the store extent to use (pinned), or zeros.
enum Found {
    Pinned(u64),
    Unmapped,
}

impl Volume {
    fn slots(&self) -> MutexGuard<'_, Slots> {
        // Every change to the map is one insert, remove or count under the lock: a panic
        // cannot leave it half made.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, mut slots: MutexGuard<'a, Slots>) -> MutexGuard<'a, Slots> {
        slots.waiting += 1;
        let mut slots = self.changed.wait(slots).unwrap_or_else(|e| e.into_inner());
        slots.waiting -= 1;
        slots
    }

    fn wake(&self, slots: &Slots) {
        if slots.waiting > 0 {
            self.changed.notify_all();
        }
    }

    /// Pins the extent's store extent if it is mapped; zeros if it is not (or is being filled
    /// or drained: a read meanwhile may see either). `wait_busy`: wait out a fill or a drain
    /// instead (a write or a partial discard must reach the extent that ends up there).
    fn pin(&self, volume_extent: u64, wait_busy: bool) -> Option<Found> {
        let mut slots = self.slots();
        loop {
            match slots.map.get_mut(&volume_extent) {
                Some(Slot::Mapped { store_extent, pins }) => {
                    *pins += 1;
                    return Some(Found::Pinned(*store_extent));
                }
                None => return Some(Found::Unmapped),
                Some(Slot::Filling | Slot::Draining { .. }) if !wait_busy => {
                    return Some(Found::Unmapped)
                }
                Some(_) => slots = self.wait(slots),
            }
        }
    }

    fn unpin(&self, volume_extent: u64) {
        let mut slots = self.slots();
        match slots.map.get_mut(&volume_extent) {
            Some(Slot::Mapped { pins, .. }) => *pins -= 1,
            Some(Slot::Draining { pins, .. }) => {
                *pins -= 1;
                if *pins == 0 {
                    self.wake(&slots);
                }
            }
            other => debug_assert!(false, "unpin of {volume_extent} found {other:?}"),
        }
    }

    /// The store offset of byte `in_extent` of store extent `store_extent`.
    fn at(&self, store_extent: u64, in_extent: usize) -> u64 {
        (store_extent << self.store.extent_shift) + in_extent as u64
    }

    /// Runs `f(volume extent, offset in it, range of the request)` over the request's pieces,
    /// one an extent, in order; an error after the first piece says how far it got.
    fn for_extents(
        &self,
        offset: u64,
        len: u64,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> Result<()>,
    ) -> Result<()> {
        check_range(self.size, offset, len)?;
        let len = usize::try_from(len).map_err(|_| BlockError::OutOfRange {
            offset,
            len,
            size: self.size,
        })?;
        for p in pieces(offset, len, self.store.extent_size() as usize) {
            if let Err(e) = f(p.unit, p.in_unit, p.at..p.at + p.len) {
                return Err(partial(p.at as u64, e));
            }
        }
        Ok(())
    }

    /// The bytes of volume extent `volume_extent` inside the volume (all of an extent but
    /// for a last one cut short by the volume's size).
    fn extent_len(&self, volume_extent: u64) -> u64 {
        let start = volume_extent << self.store.extent_shift;
        (self.size - start).min(self.store.extent_size())
    }

    fn write_extent(
        &self,
        volume_extent: u64,
        in_extent: usize,
        data: &[u8],
        fua: bool,
    ) -> Result<()> {
        let mut slots = self.slots();
        loop {
            match slots.map.get_mut(&volume_extent) {
                Some(Slot::Mapped { store_extent, pins }) => {
                    *pins += 1;
                    let store_extent = *store_extent;
                    drop(slots);
                    let written =
                        self.store
                            .device
                            .write_at(self.at(store_extent, in_extent), data, fua);
                    self.unpin(volume_extent);
                    return written;
                }
                Some(_) => slots = self.wait(slots),
                None => {
                    // Extents being filled or given back count: each holds a store extent
                    // or is about to.
                    let limit = self.limit_extents.load(Relaxed);
                    if slots.map.len() as u64 >= limit {
                        return Err(BlockError::NoSpace(
                            format!(
                                "the volume holds {} bytes of the shared store, its limit",
                                limit << self.store.extent_shift
                            )
                            .into(),
                        ));
                    }
                    slots.map.insert(volume_extent, Slot::Filling);
                    drop(slots);
                    return self.fill(volume_extent, in_extent, data, fua);
                }
            }
        }
    }

    /// The first write to an unmapped extent, which this thread marked `Filling`: takes a
    /// store extent, zeroes it unless the write covers it all, writes, and maps it. On an
    /// error the extent goes back and the volume extent is unmapped again (reads zeros).
    fn fill(&self, volume_extent: u64, in_extent: usize, data: &[u8], fua: bool) -> Result<()> {
        let taken = self.store.take().and_then(|store_extent| {
            let whole = in_extent == 0 && data.len() as u64 == self.store.extent_size();
            let written = if whole {
                Ok(())
            } else {
                self.store.zero_extent(store_extent)
            }
            .and_then(|()| {
                self.store
                    .device
                    .write_at(self.at(store_extent, in_extent), data, fua)
            });
            match written {
                Ok(()) => Ok(store_extent),
                Err(e) => {
                    // Nothing of this volume's is in it that a later owner must not see: it
                    // is zeroed again when it is next taken.
                    self.store.give_back(&[store_extent]);
                    Err(e)
                }
            }
        });
        let mut slots = self.slots();
        match taken {
            Ok(store_extent) => {
                slots.map.insert(
                    volume_extent,
                    Slot::Mapped {
                        store_extent,
                        pins: 0,
                    },
                );
            }
            Err(_) => {
                slots.map.remove(&volume_extent);
            }
        }
        self.wake(&slots);
        taken.map(drop)
    }

    /// Unmaps a volume extent, waiting for its I/O in flight, and gives its store extent
    /// back (discarded on the store first, best effort).
    fn unmap(&self, volume_extent: u64) {
        let mut slots = self.slots();
        let store_extent = loop {
            match slots.map.get(&volume_extent).copied() {
                None => return,
                Some(Slot::Mapped {
                    store_extent,
                    pins: 0,
                })
                | Some(Slot::Draining {
                    store_extent,
                    pins: 0,
                }) => {
                    slots.map.remove(&volume_extent);
                    // A write or a partial discard may wait on the drain.
                    self.wake(&slots);
                    // The map gives memory back as it empties: all of it when empty, half
                    // when a quarter full (so a volume that breathes does not reallocate at
                    // every extent).
                    let (len, capacity) = (slots.map.len(), slots.map.capacity());
                    if len == 0 {
                        slots.map = HashMap::new();
                    } else if capacity > 16 && len < capacity / 4 {
                        slots.map.shrink_to(len * 2);
                    }
                    break store_extent;
                }
                Some(Slot::Mapped { store_extent, pins }) => {
                    slots
                        .map
                        .insert(volume_extent, Slot::Draining { store_extent, pins });
                    slots = self.wait(slots);
                }
                // A fill, or another thread's drain: once done, look again.
                Some(Slot::Filling | Slot::Draining { .. }) => slots = self.wait(slots),
            }
        };
        drop(slots);
        self.store.discard_extents(&[store_extent]);
        self.store.give_back(&[store_extent]);
    }

    /// Zeroes (`discard`: discards) a range: whole extents are unmapped when `unmap`,
    /// partial ones passed on to the store inside the extent, and unmapped ones left (they
    /// read as zeros already; taking store space to hold zeros is what thin provisioning is
    /// for not doing).
    fn zero(&self, offset: u64, len: u64, how: Zeroing) -> Result<()> {
        self.for_extents(offset, len, |volume_extent, in_extent, piece| {
            let whole = in_extent == 0 && piece.len() as u64 == self.extent_len(volume_extent);
            if whole && how != Zeroing::Keep {
                self.unmap(volume_extent);
                return Ok(());
            }
            let Some(Found::Pinned(store_extent)) = self.pin(volume_extent, true) else {
                return Ok(());
            };
            let at = self.at(store_extent, in_extent);
            let device = &self.store.device;
            let done = match how {
                Zeroing::Discard => device.discard(at, piece.len() as u64),
                Zeroing::Unmap => device.write_zeroes(at, piece.len() as u64, true),
                Zeroing::Keep => device.write_zeroes(at, piece.len() as u64, false),
            };
            self.unpin(volume_extent);
            done
        })
    }

    /// Sets the most bytes of the store the volume may hold (rounded down to whole extents;
    /// `None`: no limit but the store's room). Takes effect for the next extent it would
    /// take; what it holds stays.
    pub fn set_limit(&self, bytes: Option<u64>) {
        let extents = bytes.map_or(NO_LIMIT, |b| b >> self.store.extent_shift);
        self.limit_extents.store(extents, Relaxed);
    }

    /// The most bytes of the store the volume may hold, if it has a limit.
    pub fn limit(&self) -> Option<u64> {
        match self.limit_extents.load(Relaxed) {
            NO_LIMIT => None,
            extents => Some(extents << self.store.extent_shift),
        }
    }

    /// Bytes of store extents this volume holds.
    pub fn mapped_bytes(&self) -> u64 {
        (self.slots().map.len() as u64) << self.store.extent_shift
    }

    /// Bytes of memory the volume's map holds: its table's capacity, each entry a key, a slot
    /// and the table's control byte (the table's own few words not counted).
    pub fn metadata_bytes(&self) -> u64 {
        let capacity = self.slots().map.capacity() as u64;
        capacity * (std::mem::size_of::<(u64, Slot)>() as u64 + 1)
    }

    /// Which store extent backs which volume extent, to save for [`ThinStore::restore`].
    /// Extents being filled or given back as it is taken are left out: take it with the
    /// volume quiet (no writes or discards in flight) for a map that is the volume's, and
    /// flush the store before saving it (an extent's zeroing as it was taken is durable only
    /// once the store is flushed).
    pub fn map(&self) -> VolumeMap {
        let mut entries: Vec<(u64, u64)> = self
            .slots()
            .map
            .iter()
            .filter_map(|(&v, slot)| match *slot {
                Slot::Mapped { store_extent, .. } => Some((v, store_extent)),
                _ => None,
            })
            .collect();
        entries.sort_unstable();
        VolumeMap {
            extent_size: self.store.extent_size(),
            entries,
        }
    }

    /// The pool the volume takes its extents from.
    pub fn store(&self) -> &Arc<ThinStore> {
        &self.store
    }

    /// Gives every extent back to the store (discarded there, best effort), as dropping the
    /// volume does; says what it gave back.
    pub fn destroy(mut self) -> Destroyed {
        self.release()
    }

    /// Lets the volume go for a restart, keeping its bytes: its map, for
    /// [`ThinStore::restore`] by the next process over the same store. Its extents are
    /// neither discarded nor freed: this store keeps them held, so nothing made after can
    /// take them. (The next process's store starts with every extent free: it restores every
    /// saved volume before it makes a new one.) Through a shared handle too (a zram store's
    /// volume is held by its device): after it the volume holds nothing, so it is called
    /// last, once nothing uses the volume.
    pub fn close(&self) -> VolumeMap {
        let map = self.map();
        self.slots().map.clear();
        map
    }

    fn release(&mut self) -> Destroyed {
        let slots = std::mem::take(&mut *self.slots());
        // Owned: no I/O of this volume is in flight, so every slot is Mapped with no pins.
        let mut store_extents: Vec<u64> = slots
            .map
            .values()
            .filter_map(|slot| match *slot {
                Slot::Mapped { store_extent, .. } | Slot::Draining { store_extent, .. } => {
                    Some(store_extent)
                }
                Slot::Filling => None,
            })
            .collect();
        store_extents.sort_unstable();
        let failed_discards = self.store.discard_extents(&store_extents);
        self.store.give_back(&store_extents);
        Destroyed {
            extents: store_extents.len() as u64,
            failed_discards,
        }
    }
}

/// What [`Volume::destroy`] gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destroyed {
    /// Extents back in the store's free set.
    pub extents: u64,
    /// Discards of runs of them the store refused (the extents are free all the same).
    pub failed_discards: u64,
}

impl Drop for Volume {
    fn drop(&mut self) {
        self.release();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Zeroing {
    /// `discard`: whole extents unmapped, partial ones discarded on the store.
    Discard,
    /// `write_zeroes` with `may_unmap`.
    Unmap,
    /// `write_zeroes` without: mapped extents zeroed in place, kept.
    Keep,
}

fn partial(done: u64, e: BlockError) -> BlockError {
    if done == 0 {
        e
    } else {
        BlockError::Partial {
            done,
            source: Box::new(e),
        }
    }
}
