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
//!   is written) and shrinks as they are given back.
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
//! The saved map ([`VolumeMap::to_bytes`]), little-endian:
//!
//! ```text
//!  0        8         12        16             24        32
//!  +--------+---------+---------+--------------+---------+----------------------+-------+
//!  | magic  | version | 0 (u32) | extent bytes | entries | entries × (volume    | CRC32 |
//!  | ZTTHIN | u32 = 1 |         | u64          | u64     | extent u64, store    | u32   |
//!  | MAP\0\0|         |         |              |         | extent u64), by      |       |
//!  |        |         |         |              |         | volume extent, up    |       |
//!  +--------+---------+---------+--------------+---------+----------------------+-------+
//! ```
//!
//! The CRC (CRC-32, crc32fast) covers every byte before it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use ztier_base::bytes::{ByteReader, PastEnd};
use ztier_base::pieces::pieces;

use crate::{check_range, BlockDevice, BlockError, Extent, Result};

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
    #[error("volume map version {found}, this build reads {VERSION}")]
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
}

const MAGIC: [u8; 8] = *b"ZTTHINMP";
const VERSION: u32 = 1;
/// Magic, version, reserved, extent size, entry count.
const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;
const ENTRY_BYTES: usize = 16;
const CRC_BYTES: usize = 4;

/// The extents of one store, free or held, as one bit an extent.
struct FreeSet {
    /// Bit set: held. Bits past the last extent (in the last word) are set for good, so a
    /// search never offers them.
    held: Vec<u64>,
    /// Extents held (not counting those past the end).
    held_count: u64,
    /// The word after the last extent taken: where the next search begins, so a search does
    /// not rescan the full words at the front every time.
    cursor: usize,
}

impl FreeSet {
    fn new(extents: u64) -> std::result::Result<FreeSet, ThinError> {
        let words =
            usize::try_from(extents.div_ceil(64)).map_err(|_| ThinError::NoMemory { extents })?;
        let mut held = Vec::new();
        held.try_reserve_exact(words)
            .map_err(|_| ThinError::NoMemory { extents })?;
        held.resize(words, 0);
        let tail = extents % 64;
        if tail != 0 {
            held[words - 1] = !0u64 << tail;
        }
        Ok(FreeSet {
            held,
            held_count: 0,
            cursor: 0,
        })
    }

    fn is_held(&self, extent: u64) -> bool {
        self.held[(extent / 64) as usize] & (1 << (extent % 64)) != 0
    }

    fn set(&mut self, extent: u64, held: bool) {
        let word = &mut self.held[(extent / 64) as usize];
        let bit = 1u64 << (extent % 64);
        debug_assert_eq!(*word & bit != 0, !held, "extent {extent} already so");
        if held {
            *word |= bit;
            self.held_count += 1;
        } else {
            *word &= !bit;
            self.held_count -= 1;
        }
    }

    /// Takes a free extent, searching from the cursor round to it.
    fn take(&mut self) -> Option<u64> {
        let words = self.held.len();
        for i in 0..words {
            let w = (self.cursor + i) % words;
            let free = !self.held[w];
            if free != 0 {
                let extent = w as u64 * 64 + free.trailing_zeros() as u64;
                self.set(extent, true);
                self.cursor = w;
                return Some(extent);
            }
        }
        None
    }
}

/// A pool of extents on one store, which thin [`Volume`]s take and give back.
pub struct ThinStore {
    device: Arc<dyn BlockDevice>,
    extent_shift: u32,
    extents: u64,
    /// The free set: which extents are held. Taken for one search or one change of bits;
    /// never with a volume's `slots`, never across I/O.
    free: Mutex<FreeSet>,
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

    /// Extents held by volumes.
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
}

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

impl BlockDevice for Volume {
    fn size(&self) -> u64 {
        self.size
    }

    fn block_size(&self) -> u32 {
        self.store.device.block_size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.for_extents(
            offset,
            buf.len() as u64,
            |volume_extent, in_extent, piece| {
                let out = &mut buf[piece];
                match self.pin(volume_extent, false) {
                    Some(Found::Pinned(store_extent)) => {
                        let read = self
                            .store
                            .device
                            .read_at(self.at(store_extent, in_extent), out);
                        self.unpin(volume_extent);
                        read
                    }
                    _ => {
                        out.fill(0);
                        Ok(())
                    }
                }
            },
        )
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.for_extents(
            offset,
            data.len() as u64,
            |volume_extent, in_extent, piece| {
                self.write_extent(volume_extent, in_extent, &data[piece], fua)
            },
        )
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.zero(offset, len, Zeroing::Discard)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        self.zero(
            offset,
            len,
            if may_unmap {
                Zeroing::Unmap
            } else {
                Zeroing::Keep
            },
        )
    }

    fn flush(&self) -> Result<()> {
        self.store.device.flush()
    }

    fn is_volatile(&self) -> bool {
        self.store.device.is_volatile()
    }

    fn fast_zeroes(&self) -> bool {
        self.store.device.fast_zeroes()
    }

    fn epoch(&self) -> u64 {
        self.store.device.epoch()
    }

    /// Unmapped extents are holes; mapped ones data (the store is not asked which of their
    /// blocks hold zeros).
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let mut extents: Vec<Extent> = Vec::new();
        let slots = self.slots();
        self.for_extents(offset, len, |volume_extent, _, piece| {
            let hole = !matches!(slots.map.get(&volume_extent), Some(Slot::Mapped { .. }));
            match extents.last_mut() {
                Some(last) if last.hole == hole => last.len += piece.len() as u64,
                _ => extents.push(Extent {
                    len: piece.len() as u64,
                    hole,
                    zero: hole,
                }),
            }
            Ok(())
        })?;
        Ok(extents)
    }
}

/// Which store extent backs which volume extent: a volume's part of the store, saved across
/// a restart. Entries by volume extent, each volume extent once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMap {
    extent_size: u64,
    entries: Vec<(u64, u64)>,
}

impl VolumeMap {
    /// The extent size of the store it was taken on.
    pub fn extent_size(&self) -> u64 {
        self.extent_size
    }

    /// `(volume extent, store extent)` pairs by volume extent.
    pub fn entries(&self) -> &[(u64, u64)] {
        &self.entries
    }

    /// The map in its saved form (the module header draws it).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(HEADER_BYTES + self.entries.len() * ENTRY_BYTES + CRC_BYTES);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.extent_size.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for &(volume_extent, store_extent) in &self.entries {
            out.extend_from_slice(&volume_extent.to_le_bytes());
            out.extend_from_slice(&store_extent.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Reads a saved map, refusing (typed) anything [`to_bytes`](Self::to_bytes) would not
    /// have written. Whether its extents fit a store and a volume is
    /// [`ThinStore::restore`]'s to check.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<VolumeMap, ThinError> {
        let mut r = ByteReader::new(bytes);
        let magic: [u8; 8] = r.array().map_err(ThinError::Truncated)?;
        if magic != MAGIC {
            return Err(ThinError::Magic { found: magic });
        }
        let version = r.u32_le().map_err(ThinError::Truncated)?;
        if version != VERSION {
            return Err(ThinError::Version { found: version });
        }
        let reserved = r.u32_le().map_err(ThinError::Truncated)?;
        let extent_size = r.u64_le().map_err(ThinError::Truncated)?;
        let count = r.u64_le().map_err(ThinError::Truncated)?;
        let body = usize::try_from(count)
            .ok()
            .and_then(|c| c.checked_mul(ENTRY_BYTES))
            .and_then(|b| b.checked_add(CRC_BYTES));
        if body != Some(r.left()) {
            // Cut short, or bytes after the checksum.
            return Err(match body {
                Some(wanted) if wanted > r.left() => ThinError::Truncated(PastEnd {
                    at: r.position(),
                    wanted,
                    left: r.left(),
                }),
                _ => ThinError::Length {
                    entries: count,
                    len: bytes.len(),
                },
            });
        }
        let summed = bytes.len() - CRC_BYTES;
        let stored = u32::from_le_bytes(bytes[summed..].try_into().expect("4 bytes left"));
        let computed = crc32fast::hash(&bytes[..summed]);
        if stored != computed {
            return Err(ThinError::Checksum { stored, computed });
        }
        if reserved != 0 {
            return Err(ThinError::Reserved { found: reserved });
        }
        if !extent_size.is_power_of_two() {
            return Err(ThinError::MapExtentSize { extent_size });
        }
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let volume_extent = r.u64_le().map_err(ThinError::Truncated)?;
            let store_extent = r.u64_le().map_err(ThinError::Truncated)?;
            if entries
                .last()
                .is_some_and(|&(last, _)| last >= volume_extent)
            {
                return Err(ThinError::VolumeExtentOrder {
                    extent: volume_extent,
                });
            }
            entries.push((volume_extent, store_extent));
        }
        Ok(VolumeMap {
            extent_size,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_free_set_never_offers_the_tail_and_wraps_round() {
        let mut free = FreeSet::new(70).unwrap();
        let taken: Vec<u64> = std::iter::from_fn(|| free.take()).collect();
        assert_eq!(taken, (0..70).collect::<Vec<_>>());
        assert_eq!(free.held_count, 70);
        free.set(3, false);
        free.set(69, false);
        // The cursor is in the last word: 69 first, then round to 3.
        assert_eq!(free.take(), Some(69));
        assert_eq!(free.take(), Some(3));
        assert_eq!(free.take(), None);
        assert!(FreeSet::new(0).unwrap().take().is_none());
    }

    #[test]
    fn a_map_round_trips_and_each_corruption_is_named() {
        let map = VolumeMap {
            extent_size: 1 << 20,
            entries: vec![(0, 7), (3, 1), (1 << 40, 2)],
        };
        let bytes = map.to_bytes();
        assert_eq!(bytes.len(), HEADER_BYTES + 3 * ENTRY_BYTES + CRC_BYTES);
        assert_eq!(VolumeMap::from_bytes(&bytes).unwrap(), map);

        for cut in 0..bytes.len() {
            let e = VolumeMap::from_bytes(&bytes[..cut]).unwrap_err();
            assert!(matches!(e, ThinError::Truncated(_)), "cut at {cut}: {e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            VolumeMap::from_bytes(&longer),
            Err(ThinError::Length { .. })
        ));
        for at in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let e = VolumeMap::from_bytes(&bad).unwrap_err();
            let expected = match at {
                0..8 => matches!(e, ThinError::Magic { .. }),
                8..12 => matches!(e, ThinError::Version { .. }),
                // The count: the length no longer fits it.
                24..32 => matches!(e, ThinError::Length { .. } | ThinError::Truncated(_)),
                _ => matches!(e, ThinError::Checksum { .. }),
            };
            assert!(expected, "byte {at} flipped: {e}");
        }
    }

    /// A map whose checksum is right but whose fields are not (what only a crafted file
    /// holds) is still refused.
    #[test]
    fn well_summed_nonsense_is_refused() {
        let resum = |mut bytes: Vec<u8>| {
            let n = bytes.len() - CRC_BYTES;
            let crc = crc32fast::hash(&bytes[..n]);
            bytes[n..].copy_from_slice(&crc.to_le_bytes());
            bytes
        };
        let map = VolumeMap {
            extent_size: 1 << 20,
            entries: vec![(1, 1), (2, 2)],
        };
        let mut bytes = map.to_bytes();
        bytes[12] = 1;
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::Reserved { found: 1 })
        ));
        let mut bytes = map.to_bytes();
        bytes[16..24].copy_from_slice(&3u64.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::MapExtentSize { extent_size: 3 })
        ));
        let mut bytes = map.to_bytes();
        // The second entry's volume extent made the first's.
        bytes[HEADER_BYTES + ENTRY_BYTES..HEADER_BYTES + ENTRY_BYTES + 8]
            .copy_from_slice(&1u64.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&resum(bytes)),
            Err(ThinError::VolumeExtentOrder { extent: 1 })
        ));
        // A count that would overflow the length sum.
        let mut bytes = map.to_bytes();
        bytes[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            VolumeMap::from_bytes(&bytes),
            Err(ThinError::Length { .. })
        ));
    }
}
