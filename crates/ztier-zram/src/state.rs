//! A device's saved state, so a server can stop and start again with every page it held:
//! ztier's own (the kernel's zram is lost with the machine). Written by
//! [`Device::save_state`], read back into a new device of the same size and compressor by
//! [`Device::load_state`].
//!
//! Format (little-endian), checksummed whole:
//!
//! ```text
//!  header   "ZTIERST1" | version u32 (1) | page size u32 | pages u64 | oldest age u32
//!           | compressor: length u16, name (as --compressor spells it)
//!           | secondary algorithms: count u8, then each as the compressor
//!  records  index u64 | flags u64 (the slot's, lock and ac_time cleared) | age u32 (seconds
//!           since last access) | kind u8: 1 same-filled (word u64), 2 stored (size u16,
//!           then the object's bytes as the pool holds them)
//!  end      index u64::MAX | CRC-32 (IEEE) of every byte before it, u32
//! ```
//!
//! Pages written back to a backing store are saved as stored pages: their objects are read
//! from the store and come back into memory when the state is loaded (the backing store's
//! allocation map is not saved yet), so a state never depends on a store being there.
//!
//! Consistency: each page is saved as it was when the save passed it, under its page and slot
//! locks; a save while clients write is per page, not a point in time (a save at stop, with
//! the server no longer taking requests, is exact). A state that does not match the device,
//! is truncated, or fails its checksum is refused with the reason, and the device is left
//! empty: never served half loaded.

use std::io::{Read, Write};
use std::time::Duration;

use crate::slot::{Content, Entry, SlotFlag};
use crate::stats::Counter;
use crate::{Device, Result, ZramError};

const MAGIC: &[u8; 8] = b"ZTIERST1";
const VERSION: u32 = 1;
const END: u64 = u64::MAX;
const KIND_SAME: u8 = 1;
const KIND_STORED: u8 = 2;

/// What a save or a load did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StateSummary {
    /// Pages held (same-filled and stored).
    pub pages: u64,
    /// Of them, pages that were on the backing store.
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

/// A reader that keeps the CRC of what it read, and says "truncated" at an early end.
struct Checked<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Checked<R> {
    fn bytes(&mut self, buf: &mut [u8]) -> Result<()> {
        self.inner.read_exact(buf).map_err(|e| {
            bad_state(if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "it is truncated".to_string()
            } else {
                format!("reading it: {e}")
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
        String::from_utf8(b).map_err(|_| bad_state("a name in it is not UTF-8".into()))
    }
}

fn bad_state(why: String) -> ZramError {
    ZramError::BadState(why)
}

fn put_string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u16).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

impl Device {
    /// Writes the device's state to `out` (see the module's header for what and how).
    pub fn save_state(&self, out: &mut dyn Write) -> Result<StateSummary> {
        let io = |e: std::io::Error| bad_state(format!("writing it: {e}"));
        let mut w = Summed {
            inner: out,
            crc: crc32fast::Hasher::new(),
            bytes: 0,
        };
        let now = self.now();
        let oldest = self
            .slots
            .iter()
            .map(|s| s.lock().entry)
            .filter(Entry::is_allocated)
            .map(|e| now.saturating_sub(e.ac_time()))
            .max()
            .unwrap_or(0);
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
        w.write_all(&(self.page_size as u32).to_le_bytes())
            .map_err(io)?;
        w.write_all(&self.pages().to_le_bytes()).map_err(io)?;
        w.write_all(&oldest.to_le_bytes()).map_err(io)?;
        put_string(&mut w, &self.algorithm().to_string()).map_err(io)?;
        let secondary = self.recomp_algorithms();
        w.write_all(&[secondary.len() as u8]).map_err(io)?;
        for a in &secondary {
            put_string(&mut w, &a.to_string()).map_err(io)?;
        }
        let mut summary = StateSummary::default();
        let mut object = vec![0u8; self.page_size];
        for index in 0..self.pages() {
            let _page = self.page_lock(index);
            let (e, kind) = {
                let g = self.slot(index)?.lock();
                let e = g.entry;
                let kind = match e.content() {
                    Content::Empty => continue,
                    Content::Same(word) => Some(word),
                    Content::Stored(handle) => {
                        self.pool.read(handle, &mut object[..e.size()])?;
                        None
                    }
                    // Read below, with the slot lock let go (the page lock keeps it).
                    Content::WrittenBack(_) => None,
                };
                (e, kind)
            };
            let mut flags = e;
            if let Content::WrittenBack(_) = e.content() {
                self.read_written_back_object(index, &e, &mut object[..e.size()])?;
                flags.set(SlotFlag::Wb, false);
                flags.set(SlotFlag::Huge, e.size() == self.page_size);
                summary.from_backing_store += 1;
            }
            let age = now.saturating_sub(e.ac_time());
            w.write_all(&index.to_le_bytes()).map_err(io)?;
            w.write_all(&flags.saved_flags().to_le_bytes())
                .map_err(io)?;
            w.write_all(&age.to_le_bytes()).map_err(io)?;
            match kind {
                Some(word) => {
                    w.write_all(&[KIND_SAME]).map_err(io)?;
                    w.write_all(&word.to_le_bytes()).map_err(io)?;
                }
                None => {
                    w.write_all(&[KIND_STORED]).map_err(io)?;
                    w.write_all(&(e.size() as u16).to_le_bytes()).map_err(io)?;
                    w.write_all(&object[..e.size()]).map_err(io)?;
                }
            }
            summary.pages += 1;
        }
        w.write_all(&END.to_le_bytes()).map_err(io)?;
        let crc = w.crc.clone().finalize();
        w.inner.write_all(&crc.to_le_bytes()).map_err(io)?;
        w.flush().map_err(io)?;
        summary.bytes = w.bytes + 4;
        Ok(summary)
    }

    /// Loads a state written by [`Device::save_state`] into this device, which must be empty
    /// and made with the same page size, size and compressor (and have the state's
    /// secondary algorithms set). Refused, with the reason, if anything does not match or
    /// the state is truncated or damaged; then the device is emptied again.
    pub fn load_state(&self, input: &mut dyn Read) -> Result<StateSummary> {
        if self.slots.iter().any(|s| s.lock().entry.is_allocated()) {
            return Err(bad_state("the device already holds pages".into()));
        }
        let r = self.load_records(input);
        if r.is_err() {
            self.reset();
        }
        r
    }

    fn load_records(&self, input: &mut dyn Read) -> Result<StateSummary> {
        let mut r = Checked {
            inner: input,
            crc: crc32fast::Hasher::new(),
        };
        let mut magic = [0u8; 8];
        r.bytes(&mut magic)?;
        if &magic != MAGIC {
            return Err(bad_state("it is not a ztier state".into()));
        }
        let version = r.u32()?;
        if version != VERSION {
            return Err(bad_state(format!(
                "it is version {version}; this ztier reads version {VERSION}"
            )));
        }
        let (page_size, pages) = (r.u32()? as usize, r.u64()?);
        if page_size != self.page_size || pages != self.pages() {
            return Err(bad_state(format!(
                "it holds {pages} pages of {page_size} bytes; the device has {} of {}",
                self.pages(),
                self.page_size
            )));
        }
        let oldest = r.u32()?;
        let algorithm = r.string()?;
        if algorithm != self.algorithm().to_string() {
            return Err(bad_state(format!(
                "its pages are compressed with {algorithm}; the device uses {}",
                self.algorithm()
            )));
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
            return Err(bad_state(format!(
                "its secondary algorithms are [{}]; the device has [{}]",
                secondary.join(", "),
                ours.join(", ")
            )));
        }
        // Ages are kept: the device is made as old as the state's oldest page.
        self.set_age(Duration::from_secs(u64::from(oldest)));
        let now = self.now();
        let mut summary = StateSummary::default();
        let mut object = vec![0u8; self.page_size];
        let mut last = None;
        loop {
            let index = r.u64()?;
            if index == END {
                break;
            }
            if index >= self.pages() || last.is_some_and(|l| index <= l) {
                return Err(bad_state(format!("page {index} is out of order or range")));
            }
            last = Some(index);
            let flags = r.u64()?;
            let age = r.u32()?;
            let mut e = Entry::from_saved_flags(flags);
            e.set_ac_time(now.saturating_sub(age));
            match r.u8()? {
                KIND_SAME => e.set_same(r.u64()?),
                KIND_STORED => {
                    let size = r.u16()? as usize;
                    if size == 0 || size > self.page_size || size != e.size() {
                        return Err(bad_state(format!("page {index}: a size of {size}")));
                    }
                    r.bytes(&mut object[..size])?;
                    let handle = self.pool.store(&object[..size])?;
                    e.set_stored(handle, size);
                }
                k => return Err(bad_state(format!("page {index}: an unknown kind {k}"))),
            }
            self.install(index, e);
            summary.pages += 1;
        }
        let want = r.crc.clone().finalize();
        let mut crc = [0u8; 4];
        r.inner
            .read_exact(&mut crc)
            .map_err(|_| bad_state("it is truncated".into()))?;
        if u32::from_le_bytes(crc) != want {
            return Err(bad_state(
                "its checksum does not match: it is damaged".into(),
            ));
        }
        let used = self.pool.total_pages();
        self.max_used_pages
            .fetch_max(used, std::sync::atomic::Ordering::Relaxed);
        summary.bytes = 0;
        Ok(summary)
    }

    /// Puts a loaded entry in its empty slot and counts it as a write would.
    fn install(&self, index: u64, e: Entry) {
        let mut shard = self.shard();
        let counters = &mut shard.counters;
        let Ok(slot) = self.slot(index) else { return };
        let mut g = slot.lock();
        match e.content() {
            Content::Same(_) => counters.add(Counter::SamePages, 1),
            Content::Stored(_) => {
                counters.add(Counter::ComprDataSize, e.size() as i64);
                if e.has(SlotFlag::Huge) {
                    counters.add(Counter::HugePages, 1);
                    counters.add(Counter::HugePagesSince, 1);
                }
            }
            Content::Empty | Content::WrittenBack(_) => return,
        }
        counters.add(Counter::PagesStored, 1);
        g.entry = e;
    }

    /// Makes the device `age` old, so saved ages of pages keep their meaning.
    fn set_age(&self, age: Duration) {
        let lived = self.created.elapsed();
        let shift = age.saturating_sub(lived).as_secs().min(u64::from(u32::MAX)) as u32;
        self.age_shift
            .store(shift, std::sync::atomic::Ordering::Relaxed);
    }
}
