//! A device's saved state, so a server can stop and start again with every page it held:
//! ztier's own (the kernel's zram is lost with the machine). Written by
//! [`Device::save_state`], read back into a new device of the same size and compressor by
//! [`Device::load_state`], or, when its pages are on a backing store, by
//! [`Device::load_state_with_store`].
//!
//! Format (little-endian), checksummed whole:
//!
//! ```text
//!  header   "ZTIERST1" | version u32 (2, or 3 for a device of larger units; 1 is read
//!           too) | page size u32 | pages u64 | (version 3) unit size u32 | oldest age u32
//!           | compressor: length u16, name (as --compressor spells it)
//!           | secondary algorithms: count u8, then each as the compressor
//!  store    (version 2) u8: 0 none, or 1 and: format u8 (0 page, 1 compressed, 2 packed)
//!           | slots u64 | id [16] (the swap header's sws_uuid) | stamp [16]
//!  records  index u64 (of the slot: the unit) | flags u64 (the slot's, lock and ac_time
//!           cleared) | age u32 (seconds since last access) | kind u8: 1 same-filled (word
//!           u64), 2 stored (size, then the object's bytes as the pool holds them), 3 on
//!           the store (its place: first slot u48 and byte u16 in one u64, then size);
//!           a size is u16 (u32 in version 3: a 64 KiB unit stored raw is 65536 bytes)
//!  end      index u64::MAX
//!  units    (version 2, with a store) count u64, then each first slot u64 | live bytes u32
//!  crc      CRC-32 (IEEE) of every byte before it, u32
//! ```
//!
//! A device of page-sized units (the kernel's) writes version 2, byte for byte as before
//! units; one of larger units writes version 3, which names its unit size: a state loads
//! only into a device of the same unit size (versions 1 and 2 are of page-sized units).
//!
//! Pages written back stay on the backing store: the state names their places, and the
//! units (packed segments, or blocks) that hold them with the live bytes writeback counts
//! in each. Loading one re-attaches the store as it is (never formatted): its swap header's
//! id must be the state's (the store's identity: its id and stamp, checked on load and on reconnect), and so must its stamp, which a save
//! writes into the header and the first change to the store after it clears (until then
//! no unit is given back to the allocator, so nothing the state names is discarded or
//! overwritten): a state older than the store's contents is refused, never served. The
//! swap-slot allocator is reopened with exactly the state's units in use, and every page's
//! place is checked to lie in a unit whose live bytes are the sum of its pages'.
//!
//! Consistency: each page is saved as it was when the save passed it, under its page and slot
//! locks; a save while clients write is per page, not a point in time (a save at stop, with
//! the server no longer taking requests, is exact). The units a save names are held until
//! it ends, so none is handed out again under it. A state that does not match the device
//! or its store, is truncated, or fails its checksum is refused with the reason, and the
//! device is left empty, its store untouched: never served half loaded.
//!
//! A save excludes writeback for its whole length (`Backing::gate`), so the stamp it
//! writes is still the store's when it returns; a save with nothing written back since the
//! last one keeps that one's stamp, so a save that fails leaves the last state loadable.
//!
//! Files ([`StateFile`]; `ztier serve --state PATH`): a state is served at most once. A
//! state is consumed when loaded, so a server that dies (kill -9, OOM, a panic) after taking
//! writes never leaves behind a state that would load as if they had not happened:
//!
//! - `PATH`: a state no server has loaded, written by a clean stop. At start it is loaded,
//!   then, before any client is served, renamed to `PATH.loaded` (the directory synced).
//! - `PATH.loaded`: consumed: the state a running server loaded, or saved while it went on
//!   serving (`ztier ctl save`), or, empty, the mark of a server that started with none.
//!   A start that finds it and no `PATH` refuses, naming it: the server did not stop
//!   cleanly and the writes it took are lost. Moved away, the next start is empty; renamed
//!   to `PATH`, it is served as it was (the stamp still guards the store).
//! - `PATH.tmp`: a save under way; never read. Made and removed at start to prove the
//!   directory takes the state before any page is taken.
//!
//! Each file holds every page of the disk: made mode 0600 whatever the umask, never through
//! a link (`ztier_base::private_file`), and a state another user could have written (not
//! this process user's, or writable by its group or others) is refused with the reason.
//!
//! A save writes `PATH.tmp`, syncs it and renames it: at a clean stop (no more requests,
//! writeback closed) to `PATH`, then removes `PATH.loaded`; while serving goes on, to
//! `PATH.loaded`. Each step leaves a safe pair: a crash before the rename leaves the files
//! as they were (`PATH.loaded`, refused: the server's pages are lost); after it, before the
//! removal, both (`PATH` is the newer and loads, replacing `PATH.loaded`; the directory is
//! synced between the rename and the removal, so no crash keeps the one without the other).
//! A save while serving goes on never touches `PATH`; a clean stop's replaces it only by a
//! rename. Saves are one at a time in the process (`StateFile::save`), so a `ctl save` and
//! the stop's never share `PATH.tmp`.
//!
//! Not covered: a start killed after it consumed the state and before its first client is
//! refused like a crash, though nothing was served (renaming `PATH.loaded` back is right).

use std::io::{Read, Write};
use std::time::Duration;

use std::collections::BTreeMap;
use std::sync::Arc;

use ztier_blockdev::BlockDevice;

use crate::slot::Place;
use crate::slot::{Content, Entry, SlotFlag, SlotOps};
use crate::stats::Counter;
use crate::writeback::{whole_segment, Backing, WbFormat};
use crate::{Busy, Device, Result, ZramError};
pub use error::StateError;

const MAGIC: &[u8; 8] = b"ZTIERST1";
const VERSION: u32 = 3;
/// The version a device of page-sized units writes: the one before unit sizes, so its
/// states stay what they were (and older builds read them).
const PAGE_UNITS_VERSION: u32 = 2;
const END: u64 = u64::MAX;
const KIND_SAME: u8 = 1;
const KIND_STORED: u8 = 2;
const KIND_ON_STORE: u8 = 3;
/// Units a state may name: more than any store addressed by 32-bit slots holds.
const MAX_UNITS: u64 = 1 << 32;

fn format_code(f: WbFormat) -> u8 {
    match f {
        WbFormat::Page => 0,
        WbFormat::Compressed => 1,
        WbFormat::Packed => 2,
    }
}

fn format_of(code: u8) -> Result<WbFormat> {
    Ok(match code {
        0 => WbFormat::Page,
        1 => WbFormat::Compressed,
        2 => WbFormat::Packed,
        code => return Err(bad_state(StateError::UnknownWbFormat { code })),
    })
}

/// What a state says of the store its written-back pages are on.
struct SavedStore {
    format: WbFormat,
    slots: u64,
    uuid: [u8; 16],
    stamp: [u8; 16],
}

/// What a save or a load did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateSummary {
    /// Pages held (same-filled and stored).
    pub pages: u64,
    /// Of them, pages on the backing store (named by their place there, not copied).
    pub from_backing_store: u64,
    /// Bytes of the state.
    pub bytes: u64,
}

/// A writer that keeps the CRC and the length of what passes through it.
struct Summed<W> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for Summed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that keeps the CRC of what it read, and says "truncated" at an early end. A
/// stream, not `ztier_base::bytes`' slice reader: a state is as large as the disk, read as
/// it comes, each byte summed as it passes.
struct Checked<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Checked<R> {
    fn bytes(&mut self, buf: &mut [u8]) -> Result<()> {
        self.inner.read_exact(buf).map_err(|e| {
            bad_state(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                StateError::Truncated
            } else {
                StateError::Read(e)
            })
        })?;
        self.crc.update(buf);
        Ok(())
    }
    fn u8(&mut self) -> Result<u8> {
        let mut b = [0u8; 1];
        self.bytes(&mut b)?;
        Ok(b[0])
    }
    fn u16(&mut self) -> Result<u16> {
        let mut b = [0u8; 2];
        self.bytes(&mut b)?;
        Ok(u16::from_le_bytes(b))
    }
    fn u32(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.bytes(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> Result<u64> {
        let mut b = [0u8; 8];
        self.bytes(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u16()? as usize;
        let mut b = vec![0u8; n];
        self.bytes(&mut b)?;
        String::from_utf8(b).map_err(|_| bad_state(StateError::NameNotUtf8))
    }
}

fn bad_state(why: StateError) -> ZramError {
    ZramError::BadState(why)
}

fn put_string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u16).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

impl Device {
    /// Writes the device's state to `out` (see the module's header for what and how). With
    /// a backing store, its header is stamped first, and written-back pages are saved by
    /// their place there.
    pub fn save_state(&self, out: &mut dyn Write) -> Result<StateSummary> {
        let io = |e: std::io::Error| bad_state(StateError::Write(e));
        let mut w = Summed {
            inner: out,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let store = self.backing();
        // No writeback changes the store until the state is written: waits for one in
        // progress, and keeps the next out.
        let _no_writeback = store.as_ref().map(|s| s.exclude_writeback());
        // A store set in place of this one before its gate was ours (`set_backing` holds the
        // old store's gate while it swaps) would have its writebacks described under this
        // one's stamp.
        let current = self.backing();
        if store.is_some() && !crate::writeback::same_store(store.as_ref(), current.as_ref()) {
            return Err(ZramError::Busy(Busy::StoreChanged));
        }
        // Before any page is looked at: from here on, no unit a page is seen in goes back
        // to the allocator until the store changes again (which clears the stamp).
        let stamp = match &store {
            Some(s) => Some(s.mark()?),
            None => None,
        };
        let now = self.now();
        let oldest = self
            .occupied_slots()
            .map(|s| s.lock().entry)
            .filter(Entry::is_allocated)
            .map(|e| now.saturating_sub(e.ac_time()))
            .max()
            .unwrap_or(0);
        let units = self.unit_size != self.page_size;
        let version = if units { VERSION } else { PAGE_UNITS_VERSION };
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&version.to_le_bytes()).map_err(io)?;
        w.write_all(&(self.page_size as u32).to_le_bytes())
            .map_err(io)?;
        w.write_all(&self.pages().to_le_bytes()).map_err(io)?;
        if units {
            w.write_all(&(self.unit_size as u32).to_le_bytes())
                .map_err(io)?;
        }
        w.write_all(&oldest.to_le_bytes()).map_err(io)?;
        put_string(&mut w, &self.algorithm().to_string()).map_err(io)?;
        let secondary = self.recomp_algorithms();
        w.write_all(&[secondary.len() as u8]).map_err(io)?;
        for a in &secondary {
            put_string(&mut w, &a.to_string()).map_err(io)?;
        }
        match (&store, stamp) {
            (Some(s), Some(stamp)) => {
                w.write_all(&[1, format_code(s.format())]).map_err(io)?;
                w.write_all(&s.slots().to_le_bytes()).map_err(io)?;
                w.write_all(&s.uuid()).map_err(io)?;
                w.write_all(&stamp).map_err(io)?;
            }
            _ => w.write_all(&[0]).map_err(io)?,
        }
        // A size: u16 in the versions of page-sized units, u32 in version 3.
        let put_size = |w: &mut Summed<&mut dyn Write>, size: usize| -> Result<()> {
            if units {
                w.write_all(&(size as u32).to_le_bytes()).map_err(io)
            } else {
                w.write_all(&(size as u16).to_le_bytes()).map_err(io)
            }
        };
        let mut summary = StateSummary::default();
        let mut object = vec![0u8; self.unit_size];
        // Per unit on the store: its live bytes as the pages saved count them, and a hold
        // that keeps it from being handed out again until the save ends.
        let mut units = BTreeMap::new();
        for index in self.written_slots(0..self.pages()) {
            if self.slot(index)?.is_vacant() {
                continue;
            }
            let _page = self.page_lock(index);
            let g = self.slot(index)?.lock();
            let e = g.entry;
            // The header named the secondary algorithms as they were when the save began; a
            // page recompressed since by one set meanwhile would make a state its load
            // refuses. Saves are per page, not a point in time: this one fails instead (a
            // failed save leaves the last state loadable).
            if e.priority() as usize > secondary.len() {
                return Err(bad_state(StateError::SecondaryChangedDuringSave {
                    index,
                    priority: e.priority(),
                    began_with: secondary.len(),
                }));
            }
            let age = now.saturating_sub(e.ac_time());
            let record = |w: &mut Summed<&mut dyn Write>, kind: u8| -> Result<()> {
                w.write_all(&index.to_le_bytes()).map_err(io)?;
                w.write_all(&e.saved_flags().to_le_bytes()).map_err(io)?;
                w.write_all(&age.to_le_bytes()).map_err(io)?;
                w.write_all(&[kind]).map_err(io)
            };
            match e.content() {
                Content::Empty => continue,
                Content::Same(word) => {
                    drop(g);
                    record(&mut w, KIND_SAME)?;
                    w.write_all(&word.to_le_bytes()).map_err(io)?;
                }
                Content::Stored(handle) => {
                    self.pool.read(handle, &mut object[..e.size()])?;
                    drop(g);
                    record(&mut w, KIND_STORED)?;
                    put_size(&mut w, e.size())?;
                    w.write_all(&object[..e.size()]).map_err(io)?;
                }
                Content::WrittenBack(place) => {
                    let Some(s) = &store else {
                        return Err(bad_state(StateError::StoreGoneDuringSave { index }));
                    };
                    let unit = units
                        .entry(place.first())
                        .or_insert_with(|| (0u64, s.pin(place)));
                    unit.0 += e.size() as u64;
                    drop(g);
                    record(&mut w, KIND_ON_STORE)?;
                    w.write_all(&place.raw().to_le_bytes()).map_err(io)?;
                    put_size(&mut w, e.size())?;
                    summary.from_backing_store += self.pages_per_unit();
                }
            }
            summary.pages += self.pages_per_unit();
        }
        w.write_all(&END.to_le_bytes()).map_err(io)?;
        if store.is_some() {
            w.write_all(&(units.len() as u64).to_le_bytes())
                .map_err(io)?;
            for (first, (live, _hold)) in &units {
                w.write_all(&first.to_le_bytes()).map_err(io)?;
                w.write_all(&(*live as u32).to_le_bytes()).map_err(io)?;
            }
        }
        let crc = w.crc.clone().finalize();
        w.inner.write_all(&crc.to_le_bytes()).map_err(io)?;
        w.flush().map_err(io)?;
        summary.bytes = w.bytes + 4;
        Ok(summary)
    }

    /// Loads a state written by [`Device::save_state`] into this device, which must be empty
    /// and made with the same page size, size and compressor (and have the state's
    /// secondary algorithms set). A state whose pages are on a backing store is refused
    /// here (see [`Device::load_state_with_store`]). Refused, with the reason, if anything
    /// does not match or the state is truncated or damaged; then the device is emptied
    /// again.
    pub fn load_state(&self, input: &mut dyn Read) -> Result<StateSummary> {
        self.load_checked(input, None)
    }

    /// [`Device::load_state`] for a device whose backing store is `store` (not set on the
    /// device yet), written back in `format`. If the state's pages are on a store, `store`
    /// must be that one as the save left it: the same size and id (its swap header's
    /// `sws_uuid`), unchanged since (its stamp), and `format` the state's; it is re-attached
    /// without being formatted, its allocator holding exactly the state's units. Else it is
    /// set up new, as [`Backing::new`] does. On success the store is the device's backing
    /// store; on a refusal the device is empty, has none, and the store is untouched.
    pub fn load_state_with_store(
        &self,
        input: &mut dyn Read,
        store: Arc<dyn BlockDevice>,
        format: WbFormat,
    ) -> Result<StateSummary> {
        if self.backing().is_some() {
            return Err(bad_state(StateError::DeviceHasStore));
        }
        self.load_checked(input, Some((store, format)))
    }

    fn load_checked(
        &self,
        input: &mut dyn Read,
        store: Option<(Arc<dyn BlockDevice>, WbFormat)>,
    ) -> Result<StateSummary> {
        if self
            .slots
            .iter()
            .any(|s| !s.is_vacant() && s.lock().entry.is_allocated())
        {
            return Err(bad_state(StateError::DeviceNotEmpty));
        }
        let r = self.load_records(input, store);
        if r.is_err() {
            self.reset();
        }
        r
    }

    fn load_records(
        &self,
        input: &mut dyn Read,
        store: Option<(Arc<dyn BlockDevice>, WbFormat)>,
    ) -> Result<StateSummary> {
        let mut r = Checked {
            inner: input,
            crc: crc32fast::Hasher::new(),
        };
        let mut magic = [0u8; 8];
        r.bytes(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad_state(StateError::NotAState));
        }
        let version = r.u32()?;
        if !(1..=VERSION).contains(&version) {
            return Err(bad_state(StateError::Version { version }));
        }
        let (page_size, pages) = (r.u32()? as usize, r.u64()?);
        if page_size != self.page_size || pages != self.pages() {
            return Err(bad_state(StateError::Geometry {
                pages,
                page_size,
                device_pages: self.pages(),
                device_page_size: self.page_size,
            }));
        }
        // Versions before 3 are of page-sized units.
        let unit_size = match version {
            3.. => r.u32()? as usize,
            _ => page_size,
        };
        if unit_size != self.unit_size {
            return Err(bad_state(StateError::UnitSize {
                state: unit_size,
                device: self.unit_size,
            }));
        }
        let size_of = |r: &mut Checked<&mut dyn Read>| -> Result<usize> {
            Ok(match version {
                3.. => r.u32()? as usize,
                _ => r.u16()? as usize,
            })
        };
        let oldest = r.u32()?;
        let algorithm = r.string()?;
        if algorithm != self.algorithm().to_string() {
            return Err(bad_state(StateError::Algorithm {
                state: algorithm,
                device: self.algorithm().to_string(),
            }));
        }
        let n = r.u8()?;
        let mut secondary = Vec::new();
        for _ in 0..n {
            secondary.push(r.string()?);
        }
        let ours: Vec<String> = self
            .recomp_algorithms()
            .iter()
            .map(|a| a.to_string())
            .collect();
        if secondary != ours {
            return Err(bad_state(StateError::SecondaryAlgorithms {
                state: secondary,
                device: ours,
            }));
        }
        let saved_store = match version {
            1 => None,
            _ => match r.u8()? {
                0 => None,
                1 => {
                    let format = format_of(r.u8()?)?;
                    let slots = r.u64()?;
                    let mut uuid = [0u8; 16];
                    r.bytes(&mut uuid)?;
                    let mut stamp = [0u8; 16];
                    r.bytes(&mut stamp)?;
                    Some(SavedStore {
                        format,
                        slots,
                        uuid,
                        stamp,
                    })
                }
                kind => return Err(bad_state(StateError::UnknownStoreKind { kind })),
            },
        };
        // Ages are kept: the device is made as old as the state's oldest page.
        self.set_age(Duration::from_secs(u64::from(oldest)));
        let now = self.now();
        let mut summary = StateSummary::default();
        let mut object = vec![0u8; self.unit_size];
        let mut last = None;
        // Pages on the store, installed once the store is checked.
        let mut on_store: Vec<(u64, Entry, Place)> = Vec::new();
        loop {
            let index = r.u64()?;
            if index == END {
                break;
            }
            if index >= self.units() || last.is_some_and(|l| index <= l) {
                return Err(bad_state(StateError::PageOutOfOrder { index }));
            }
            last = Some(index);
            let flags = r.u64()?;
            let age = r.u32()?;
            let mut e = Entry::from_saved_flags(flags);
            e.set_ac_time(now.saturating_sub(age));
            // The checksum finds damage; a crafted file passes it. Flags no save writes would
            // be read as they say: a priority with no algorithm, a huge object short of a
            // page, a same-filled page with a size.
            let prio = e.priority() as usize;
            if prio > secondary.len() {
                return Err(bad_state(StateError::NoSuchSecondary {
                    index,
                    priority: prio,
                    named: secondary.len(),
                }));
            }
            if e.has(SlotFlag::Huge) && e.size() != self.unit_size {
                return Err(bad_state(StateError::HugeNotWhole {
                    index,
                    size: e.size(),
                }));
            }
            match r.u8()? {
                KIND_SAME if e.size() != 0 => {
                    return Err(bad_state(StateError::SameWithSize {
                        index,
                        size: e.size(),
                    }));
                }
                KIND_SAME => e.set_same(r.u64()?),
                KIND_STORED => {
                    let size = size_of(&mut r)?;
                    if size == 0 || size > self.unit_size || size != e.size() {
                        return Err(bad_state(StateError::Size { index, size }));
                    }
                    r.bytes(&mut object[..size])?;
                    let handle = self.pool.store(&object[..size])?;
                    e.set_stored(handle, size);
                }
                KIND_ON_STORE if saved_store.is_some() => {
                    let place = Place::from_raw(r.u64()?);
                    let size = size_of(&mut r)?;
                    if size == 0 || size > self.unit_size || size != e.size() {
                        return Err(bad_state(StateError::Size { index, size }));
                    }
                    e.set_written_back(place, size);
                    on_store.push((index, e, place));
                    summary.pages += self.pages_per_unit();
                    summary.from_backing_store += self.pages_per_unit();
                    continue;
                }
                kind => return Err(bad_state(StateError::UnknownKind { index, kind })),
            }
            self.install(index, e);
            summary.pages += self.pages_per_unit();
        }
        let mut units = Vec::new();
        if saved_store.is_some() {
            let n = r.u64()?;
            if n > MAX_UNITS {
                return Err(bad_state(StateError::TooManyUnits { units: n }));
            }
            for _ in 0..n {
                let first = r.u64()?;
                units.push((first, r.u32()?));
            }
        }
        let want = r.crc.clone().finalize();
        let mut crc = [0u8; 4];
        r.inner
            .read_exact(&mut crc)
            .map_err(|_| bad_state(StateError::Truncated))?;
        if u32::from_le_bytes(crc) != want {
            return Err(bad_state(StateError::Checksum));
        }
        match (saved_store, store) {
            (Some(saved), Some((dev, format))) if !(on_store.is_empty() && units.is_empty()) => {
                let backing = self.reattach(&saved, dev, format, &units, &on_store)?;
                *self.backing.write() = Some(Arc::new(backing));
                for (index, e, _) in on_store {
                    self.install(index, e);
                }
            }
            (Some(_), None) if !(on_store.is_empty() && units.is_empty()) => {
                return Err(bad_state(StateError::NoStoreGiven {
                    pages: on_store.len(),
                }))
            }
            // Nothing on a store: a store given is set up new.
            (_, Some((dev, format))) => {
                let backing = Backing::new(dev, format)?.for_unit_size(self.unit_size);
                *self.backing.write() = Some(Arc::new(backing));
            }
            _ => {}
        }
        let used = self.pool.total_pages();
        self.max_used_pages
            .fetch_max(used, std::sync::atomic::Ordering::Relaxed);
        summary.bytes = 0;
        Ok(summary)
    }

    /// The store a state's pages are on, re-attached after every check: the flags' format
    /// and the store's size are the state's, its header's id and stamp are, and every
    /// page lies in a unit whose live bytes are the sum of its pages'.
    fn reattach(
        &self,
        saved: &SavedStore,
        dev: Arc<dyn BlockDevice>,
        format: WbFormat,
        units: &[(u64, u32)],
        pages: &[(u64, Entry, Place)],
    ) -> Result<Backing> {
        if format != saved.format {
            return Err(bad_state(StateError::WbFormat {
                state: saved.format,
                device: format,
            }));
        }
        let slots = dev.size() / ztier_swap::SLOT_BYTES;
        if slots != saved.slots {
            return Err(bad_state(StateError::StoreSlots {
                state: saved.slots,
                given: slots,
            }));
        }
        let backing = Backing::reopen(dev, format, self.unit_size, units)?;
        if backing.uuid() != saved.uuid {
            return Err(bad_state(StateError::StoreId {
                store: backing.uuid(),
                state: saved.uuid,
            }));
        }
        if backing.stamp() != saved.stamp {
            return Err(bad_state(StateError::StoreChanged));
        }
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        for &(first, _) in units {
            if !backing.is_unit_start(first) {
                return Err(bad_state(StateError::NotAUnit { first }));
            }
            live.insert(first, 0);
        }
        for (index, e, place) in pages {
            // A unit filling its packed segment keeps a check where the byte would be: it
            // starts at 0.
            let at = if whole_segment(format, e.size()) {
                0
            } else {
                place.at()
            };
            let fits = at + e.size() <= backing.unit_bytes()
                && (format != WbFormat::Page || e.size() == self.unit_size);
            match live.get_mut(&place.first()) {
                Some(bytes) if fits => *bytes += e.size() as u64,
                _ => {
                    return Err(bad_state(StateError::PlaceOutsideUnits {
                        index: *index,
                        first: place.first(),
                        at: place.at(),
                        size: e.size(),
                    }))
                }
            }
        }
        for &(first, bytes) in units {
            if live.get(&first) != Some(&u64::from(bytes)) {
                return Err(bad_state(StateError::UnitLiveBytes {
                    first,
                    state: bytes,
                    pages: live.get(&first).copied().unwrap_or(0),
                }));
            }
        }
        backing.count_stored(live.values().sum());
        Ok(backing)
    }

    /// Puts a loaded entry in its empty slot and counts it as a write would.
    fn install(&self, index: u64, e: Entry) {
        let mut shard = self.shard();
        let counters = &mut shard.counters;
        let Ok(slot) = self.slot(index) else { return };
        let mut g = slot.lock();
        // Counted in pages, as a write counts them: a unit is its pages.
        let pages = self.pages_per_unit() as i64;
        match e.content() {
            Content::Same(_) => counters.add(Counter::SamePages, pages),
            Content::Stored(_) => {
                counters.add(Counter::ComprDataSize, e.size() as i64);
                if e.has(SlotFlag::Huge) {
                    counters.add(Counter::HugePages, pages);
                    counters.add(Counter::HugePagesSince, pages);
                }
            }
            Content::WrittenBack(_) => counters.add(Counter::BdCount, pages),
            Content::Empty => return,
        }
        counters.add(Counter::PagesStored, pages);
        g.entry = e;
    }
}

mod error;
mod file;

pub use file::StateFile;
