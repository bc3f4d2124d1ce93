//! zram in userspace: a compressed RAM disk (`drivers/block/zram/zram_drv.c`).
//!
//! A [`Device`] is a disk of `disksize` bytes cut into pages. Writing a page:
//! a page whose machine words are all equal is kept as that word, with no allocation
//! (`same_pages`); otherwise it is compressed on a stream of the device's algorithm, and a
//! compressed length at or above the pool's `huge_class_size` is stored raw instead
//! (`huge_pages`). The object is allocated and written before the slot is locked, and the
//! memory limit is checked after the allocation as the kernel does, so a refused write leaves
//! the slot's previous content as it was. Reads decompress the object where it lies (copied
//! out first only if it straddles two pool pages) under the slot lock, as the kernel's
//! `zram_read_from_zspool()` does.
//!
//! # Lock ordering
//! `Device::streams[shard]` (held only to take or return a stream, never with another lock);
//! `Slot` lock → the pool's own locks (`SizeClass::state` → `Arena::state`).
//! No operation holds two slot locks.
#![forbid(unsafe_code)]

pub mod slot;
mod stats;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use ztier_compress::{
    fill_page, same_filled, worst_case_len, Algorithm, CompressError, Compressor,
};
use ztier_pool::{PoolError, ZPool};

pub use slot::{Entry, SlotFlag};
pub use stats::{Counter, DebugStat, IoStat, MmStat, Stats};

use slot::Slot;
use stats::{shard_index, SHARDS};

/// What a device operation refuses.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZramError {
    #[error("offset {offset} + length {len} is beyond the disk's {disksize} bytes")]
    OutOfRange {
        offset: u64,
        len: usize,
        disksize: u64,
    },
    #[error("page {index} is beyond the disk's {pages} pages")]
    BadIndex { index: u64, pages: u64 },
    #[error("a page write needs exactly {page_size} bytes, got {len}")]
    BadLength { len: usize, page_size: usize },
    #[error("memory limit reached: {used_bytes} bytes used, limit {limit_bytes}")]
    MemLimit { used_bytes: u64, limit_bytes: u64 },
    #[error("allocator: {0}")]
    Pool(#[from] PoolError),
    #[error("page {index}: {source}")]
    Compress { index: u64, source: CompressError },
    #[error("page {index} decompressed to {got} bytes instead of {page_size}")]
    ShortPage {
        index: u64,
        got: usize,
        page_size: usize,
    },
    #[error("disk size {0} bytes is not a positive whole number of pages")]
    BadDiskSize(u64),
}

pub type Result<T, E = ZramError> = std::result::Result<T, E>;

/// The part of one page that a byte range covers.
struct PageSpan {
    index: u64,
    in_page: usize,
    len: usize,
    /// Where the part starts in the caller's buffer.
    at: usize,
}

/// A compression stream and its buffers (`struct zcomp_strm`).
struct Stream {
    comp: Box<dyn Compressor>,
    /// Compressed bytes, sized for the worst case.
    buf: Vec<u8>,
}

/// A zram device.
pub struct Device {
    page_size: usize,
    algorithm: Algorithm,
    pool: Box<dyn ZPool>,
    slots: Box<[Slot]>,
    /// Idle streams by shard; an operation takes one from its thread's shard and gives it
    /// back (zram's per-CPU streams).
    streams: Box<[Mutex<Vec<Stream>>]>,
    stats: Stats,
    /// Pool pages allowed, 0 = unlimited (`limit_pages`).
    limit_pages: AtomicU64,
    /// Highest pool pages seen after a write (`max_used_pages`).
    max_used_pages: AtomicU64,
}

impl Device {
    /// A device of `disksize` bytes on `pool`, compressing with `algorithm`.
    pub fn new(disksize: u64, algorithm: Algorithm, pool: Box<dyn ZPool>) -> Result<Device> {
        let page_size = pool.page_size();
        if disksize == 0 || !disksize.is_multiple_of(page_size as u64) {
            return Err(ZramError::BadDiskSize(disksize));
        }
        let pages = disksize / page_size as u64;
        Ok(Device {
            page_size,
            algorithm,
            pool,
            slots: (0..pages).map(|_| Slot::default()).collect(),
            streams: (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect(),
            stats: Stats::default(),
            limit_pages: AtomicU64::new(0),
            max_used_pages: AtomicU64::new(0),
        })
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn pages(&self) -> u64 {
        self.slots.len() as u64
    }
    pub fn disksize(&self) -> u64 {
        self.pages() * self.page_size as u64
    }
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }
    pub fn pool(&self) -> &dyn ZPool {
        &*self.pool
    }
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Sets `mem_limit` in bytes (rounded up to pages; 0 = none).
    pub fn set_mem_limit(&self, bytes: u64) {
        self.limit_pages
            .store(bytes.div_ceil(self.page_size as u64), Relaxed);
    }

    /// Resets `mem_used_max` to the pages in use now (writing 0 to the sysfs file).
    pub fn reset_mem_used_max(&self) {
        self.max_used_pages.store(self.pool.total_pages(), Relaxed);
    }

    fn slot(&self, index: u64) -> Result<&Slot> {
        self.slots.get(index as usize).ok_or(ZramError::BadIndex {
            index,
            pages: self.pages(),
        })
    }

    fn with_stream<T>(&self, f: impl FnOnce(&mut Stream) -> T) -> T {
        let shard = &self.streams[shard_index()];
        let mut stream = shard.lock().pop().unwrap_or_else(|| Stream {
            comp: self.algorithm.new_compressor(),
            buf: vec![0; worst_case_len(self.page_size)],
        });
        let r = f(&mut stream);
        shard.lock().push(stream);
        r
    }

    /// Writes one whole page.
    pub fn write_page(&self, index: u64, page: &[u8]) -> Result<()> {
        let r = self.write_page_inner(index, page);
        if r.is_err() {
            self.stats.add(Counter::FailedWrites, 1);
        }
        r
    }

    fn write_page_inner(&self, index: u64, page: &[u8]) -> Result<()> {
        let slot = self.slot(index)?;
        if page.len() != self.page_size {
            return Err(ZramError::BadLength {
                len: page.len(),
                page_size: self.page_size,
            });
        }
        if let Some(word) = same_filled(page) {
            let mut g = slot.lock();
            self.free_slot(&mut g.entry);
            g.entry.handle = word;
            g.entry.set(SlotFlag::Same, true);
            self.stats.add(Counter::SamePages, 1);
            self.stats.add(Counter::PagesStored, 1);
            return Ok(());
        }

        let (handle, size) = self.with_stream(|s| -> Result<_> {
            let len = s
                .comp
                .compress(page, &mut s.buf)
                .map_err(|source| ZramError::Compress { index, source })?;
            let huge = len >= self.pool.huge_class_size();
            let object = if huge { page } else { &s.buf[..len] };
            Ok((self.pool.store(object)?, object.len()))
        })?;

        let used = self.pool.total_pages();
        // Read first: the line stays shared between threads until a new maximum is set.
        if used > self.max_used_pages.load(Relaxed) {
            self.max_used_pages.fetch_max(used, Relaxed);
        }
        let limit = self.limit_pages.load(Relaxed);
        if limit != 0 && used > limit {
            self.pool.free(handle)?;
            return Err(ZramError::MemLimit {
                used_bytes: used * self.page_size as u64,
                limit_bytes: limit * self.page_size as u64,
            });
        }

        let mut g = slot.lock();
        self.free_slot(&mut g.entry);
        g.entry.handle = handle.raw();
        g.entry.set_size(size);
        if size == self.page_size {
            g.entry.set(SlotFlag::Huge, true);
            self.stats.add(Counter::HugePages, 1);
            self.stats.add(Counter::HugePagesSince, 1);
        }
        self.stats.add(Counter::ComprDataSize, size as i64);
        self.stats.add(Counter::PagesStored, 1);
        Ok(())
    }

    /// `zram_free_page()`: releases what a locked slot holds and clears it.
    fn free_slot(&self, e: &mut Entry) {
        let was_allocated = e.is_allocated();
        if e.has(SlotFlag::Same) {
            self.stats.add(Counter::SamePages, -1);
        } else if e.handle != 0 {
            let handle = ztier_pool::Handle::from_raw(e.handle).expect("nonzero");
            // The handle came from this pool and the slot lock makes it ours alone.
            self.pool.free(handle).expect("slot handles are live");
            self.stats.add(Counter::ComprDataSize, -(e.size() as i64));
            if e.has(SlotFlag::Huge) {
                self.stats.add(Counter::HugePages, -1);
            }
        }
        if was_allocated {
            self.stats.add(Counter::PagesStored, -1);
        }
        *e = Entry::default();
    }

    /// Reads one whole page into `out`.
    pub fn read_page(&self, index: u64, out: &mut [u8]) -> Result<()> {
        let r = self.read_page_inner(index, out);
        if r.is_err() {
            self.stats.add(Counter::FailedReads, 1);
        }
        r
    }

    fn read_page_inner(&self, index: u64, out: &mut [u8]) -> Result<()> {
        let slot = self.slot(index)?;
        if out.len() != self.page_size {
            return Err(ZramError::BadLength {
                len: out.len(),
                page_size: self.page_size,
            });
        }
        let mut g = slot.lock();
        g.entry.set(SlotFlag::Idle, false);
        if g.entry.has(SlotFlag::Same) || g.entry.handle == 0 {
            let word = if g.entry.has(SlotFlag::Same) {
                g.entry.handle
            } else {
                0
            };
            drop(g);
            fill_page(out, word);
            return Ok(());
        }
        let handle = ztier_pool::Handle::from_raw(g.entry.handle).expect("nonzero");
        if g.entry.has(SlotFlag::Huge) {
            self.pool.read(handle, out)?;
            return Ok(());
        }
        // Only a compressed object needs a stream. It is decompressed where it lies (copied
        // out first only if it straddles two pool pages), under the slot lock as the kernel's
        // zram_read_from_zspool() does.
        self.with_stream(|s| -> Result<()> {
            let comp = &mut s.comp;
            let mut decoded = Ok(0);
            self.pool.read_with(handle, &mut s.buf, &mut |object| {
                decoded = comp.decompress(object, out);
            })?;
            drop(g);
            let got = decoded.map_err(|source| ZramError::Compress { index, source })?;
            if got != self.page_size {
                return Err(ZramError::ShortPage {
                    index,
                    got,
                    page_size: self.page_size,
                });
            }
            Ok(())
        })
    }

    /// Discards whole pages in `[offset, offset + len)`; partial pages at the ends are left
    /// alone, as the kernel does. Returns the slots freed.
    pub fn discard(&self, offset: u64, len: u64) -> Result<u64> {
        self.check_range(offset, len as usize)?;
        let ps = self.page_size as u64;
        let first = offset.div_ceil(ps);
        let end = (offset + len) / ps;
        let mut freed = 0;
        for index in first..end {
            let mut g = self.slots[index as usize].lock();
            if g.entry.is_allocated() {
                freed += 1;
            }
            self.free_slot(&mut g.entry);
            self.stats.add(Counter::NotifyFree, 1);
        }
        Ok(freed)
    }

    /// Discards one page (`BLKDISCARD` of one page / swap slot free).
    pub fn discard_page(&self, index: u64) -> Result<()> {
        let mut g = self.slot(index)?.lock();
        self.free_slot(&mut g.entry);
        self.stats.add(Counter::NotifyFree, 1);
        Ok(())
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.disksize()) {
            return Err(ZramError::OutOfRange {
                offset,
                len,
                disksize: self.disksize(),
            });
        }
        Ok(())
    }

    /// The pages `[offset, offset + len)` touches: (page index, offset in page, bytes, offset
    /// in the caller's buffer).
    fn spans(&self, offset: u64, len: usize) -> impl Iterator<Item = PageSpan> {
        let ps = self.page_size;
        let mut done = 0;
        std::iter::from_fn(move || {
            (done < len).then(|| {
                let pos = offset + done as u64;
                let in_page = (pos % ps as u64) as usize;
                let span = PageSpan {
                    index: pos / ps as u64,
                    in_page,
                    len: (ps - in_page).min(len - done),
                    at: done,
                };
                done += span.len;
                span
            })
        })
    }

    /// Writes bytes at any offset; pages written in part are read, patched and rewritten.
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len())?;
        let mut scratch = vec![0; self.page_size];
        for s in self.spans(offset, data.len()) {
            let part = &data[s.at..s.at + s.len];
            if s.len == self.page_size {
                self.write_page(s.index, part)?;
            } else {
                self.read_page(s.index, &mut scratch)?;
                scratch[s.in_page..s.in_page + s.len].copy_from_slice(part);
                self.write_page(s.index, &scratch)?;
            }
        }
        Ok(())
    }

    /// Reads bytes at any offset.
    pub fn read_bytes(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len())?;
        let mut scratch = vec![0; self.page_size];
        for s in self.spans(offset, out.len()) {
            let part = &mut out[s.at..s.at + s.len];
            if s.len == self.page_size {
                self.read_page(s.index, part)?;
            } else {
                self.read_page(s.index, &mut scratch)?;
                part.copy_from_slice(&scratch[s.in_page..s.in_page + s.len]);
            }
        }
        Ok(())
    }

    /// Marks every allocated slot idle (`echo all > idle`).
    pub fn mark_idle(&self) {
        for slot in self.slots.iter() {
            let mut g = slot.lock();
            if g.entry.is_allocated() {
                g.entry.set(SlotFlag::Idle, true);
            }
        }
    }

    /// A slot's state, for inspection.
    pub fn entry(&self, index: u64) -> Result<Entry> {
        Ok(self.slot(index)?.lock().entry)
    }

    /// Runs the allocator's compaction; returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact()
    }

    /// Frees every slot and zeroes the statistics (`reset`); the limit stays.
    pub fn reset(&self) {
        for slot in self.slots.iter() {
            let mut g = slot.lock();
            self.free_slot(&mut g.entry);
        }
        self.stats.clear();
        self.max_used_pages.store(self.pool.total_pages(), Relaxed);
    }

    /// `mm_stat`.
    pub fn mm_stat(&self) -> MmStat {
        let ps = self.page_size as u64;
        MmStat {
            orig_data_size: self.stats.get(Counter::PagesStored) * ps,
            compr_data_size: self.stats.get(Counter::ComprDataSize),
            mem_used_total: self.pool.total_pages() * ps,
            mem_limit: self.limit_pages.load(Relaxed) * ps,
            mem_used_max: self.max_used_pages.load(Relaxed) * ps,
            same_pages: self.stats.get(Counter::SamePages),
            pages_compacted: self.pool.pages_compacted(),
            huge_pages: self.stats.get(Counter::HugePages),
            huge_pages_since: self.stats.get(Counter::HugePagesSince),
        }
    }

    /// `io_stat`.
    pub fn io_stat(&self) -> IoStat {
        IoStat {
            failed_reads: self.stats.get(Counter::FailedReads),
            failed_writes: self.stats.get(Counter::FailedWrites),
            invalid_io: 0,
            notify_free: self.stats.get(Counter::NotifyFree),
        }
    }

    /// `debug_stat`.
    pub fn debug_stat(&self) -> DebugStat {
        DebugStat {
            version: 2,
            miss_free: self.stats.get(Counter::MissFree),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.reset();
    }
}
