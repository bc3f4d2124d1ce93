//! Reads of written-back pages, with no lock held across the store's I/O: under the slot's
//! lock a read pins the page's place (a hold on its unit's live count, so the place cannot
//! be freed and handed out again), reads the store with nothing locked (a packed page's
//! whole segment, through the cache), checks a packed object's checksum, and decompresses on
//! its thread's shard; the caller checks the slot still names that place before it trusts
//! the bytes. A slow or vanished store so stalls only the reads of its own pages: never
//! writes to other pages of the stripe, the shard, `stat` or `ctl`. Reads never take the
//! page back into the pool (nor does the kernel).

use std::sync::atomic::Ordering::Relaxed;

use super::cache::{Claim, Taken, READAHEAD};
use super::store::Backing;
use super::store::Pin;
use super::{whole_check, whole_segment, WbFormat, OBJECT_CRC, SEGMENT_MAGIC};
use crate::slot::{Content, Entry, Place, SlotOps};
use crate::stats::{Counter, Counters};
use crate::{Device, Result, ZramError};

impl Device {
    /// Reads page `index` into `out` if it is written back, holding no lock across the
    /// store's I/O: the slot's entry is taken and its place pinned under the slot's lock,
    /// the store read with nothing held, and the object decompressed on the thread's shard.
    /// `None`: the page is not written back (read it from memory). Otherwise the entry read
    /// and the pin: the caller checks, with [`Entry::same_place`], that the slot still names
    /// that place before it trusts the bytes (the page may have been rewritten or discarded
    /// meanwhile; while the pin lives, its place cannot be handed out again).
    pub(crate) fn read_written_back(
        &self,
        index: u64,
        out: &mut [u8],
    ) -> Result<Option<(Entry, Pin)>> {
        let slot = self.slot(index)?;
        let store = self.backing().ok_or(ZramError::NoBacking)?;
        let (e, place, pin) = {
            let g = slot.lock();
            let Content::WrittenBack(place) = g.entry.content() else {
                return Ok(None);
            };
            (g.entry, place, store.pin(place))
        };
        let size = e.size();
        // The object's bytes: from its segment (packed), or read alone into a buffer of its
        // own (no copy into a shared one).
        let (segment, alone);
        // Packed segments count their own reads (`Backing::segment_reads`).
        let (object, store_reads): (&[u8], u64) = if store.format == WbFormat::Packed {
            segment = store.segment(place.first()).map_err(ZramError::Backing)?;
            if whole_segment(store.format, size) {
                // A unit filling its segment: checked against its place's check.
                let object = segment.get(..size).ok_or(ZramError::BadPlace {
                    index,
                    first: place.first(),
                    at: 0,
                    size,
                })?;
                if whole_check(object) != place.at() {
                    return Err(self.corrupt_copy(&store, index, place, size));
                }
                (object, 0)
            } else {
                let object =
                    segment
                        .get(place.at()..place.at() + size)
                        .ok_or(ZramError::BadPlace {
                            index,
                            first: place.first(),
                            at: place.at(),
                            size,
                        })?;
                if segment.starts_with(&SEGMENT_MAGIC) {
                    let stored = segment.get(place.at() + size..place.at() + size + OBJECT_CRC);
                    if stored != Some(&crc32fast::hash(object).to_le_bytes()[..]) {
                        return Err(self.corrupt_copy(&store, index, place, size));
                    }
                }
                (object, 0)
            }
        } else {
            let mut bytes = vec![0u8; size];
            store.read(place, &mut bytes).map_err(ZramError::Backing)?;
            alone = bytes;
            (&alone[..], 1)
        };
        let mut shard = self.shard();
        shard.counters.add(Counter::BdReads, store_reads as i64);
        if size == self.unit_size {
            out.copy_from_slice(object);
        } else {
            let decoded = self
                .stream_for(&mut shard, e.priority())
                .comp
                .decompress_page(object, out);
            drop(shard);
            self.check_decoded(index, decoded)?;
        }
        Ok(Some((e, pin)))
    }

    /// Before a read of the pages `range`: the packed segments its written-back pages are
    /// in, those not cached, read together (requests in flight at once, up to [`READAHEAD`]
    /// of them) into the cache, each pinned while it is read; the pages' own reads then find
    /// them there. A failure is left to those reads to meet and report.
    pub(crate) fn prefetch_segments(&self, range: std::ops::Range<u64>) {
        let Some(store) = self.backing() else { return };
        if store.format != WbFormat::Packed || range.end.saturating_sub(range.start) < 2 {
            return;
        }
        let (mut firsts, mut pins) = (Vec::new(), Vec::new());
        let epoch = store.store.epoch();
        for index in range {
            let Ok(slot) = self.slot(index) else { break };
            let g = slot.lock();
            if let Content::WrittenBack(place) = g.entry.content() {
                if !firsts.contains(&place.first()) && !store.cache.contains(place.first(), epoch) {
                    firsts.push(place.first());
                    pins.push(store.pin(place));
                    if firsts.len() == READAHEAD {
                        break;
                    }
                }
            }
        }
        // One segment: the page's own read fetches it as cheaply. Those another reader is
        // reading already are left to it.
        if firsts.len() >= 2 {
            let claims: Vec<Claim> = firsts
                .iter()
                .filter_map(|&f| match store.cache.claim(f, epoch) {
                    Taken::Claim(claim) => Some(claim),
                    Taken::Loading(_) | Taken::Cached => None,
                })
                .collect();
            if !claims.is_empty() {
                let _ = store.fetch(claims, epoch, &mut Vec::new());
            }
        }
        drop(pins);
    }

    /// A written-back copy that failed its check: counted, logged, and the read's error.
    fn corrupt_copy(&self, store: &Backing, index: u64, place: Place, size: usize) -> ZramError {
        store.corrupt.fetch_add(1, Relaxed);
        let e = ZramError::Corrupt {
            index,
            first: place.first(),
            at: place.at(),
            size,
        };
        self.log(&format!("{e}; the read fails with EIO"));
        e
    }

    /// Gives back the place of a written-back slot being freed (under its lock).
    pub(crate) fn release_written_back(&self, counters: &mut Counters, place: Place, size: usize) {
        if let Some(store) = self.backing.read().as_ref() {
            store.release(place, size);
        }
        counters.add(Counter::BdCount, -(self.pages_per_unit() as i64));
    }
}
