//! Packed pages read back a segment at a time: the segment cache (never stale, emptied
//! when the store is lost), segments written and read several at once, readers missing the
//! same segment sharing one read, readahead for a sequential reader, and a reset that waits
//! for the readahead.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::testing::Faulty;
use ztier_zram::{Backing, Device, PageSelector, WbFormat};

use common::writeback::*;

/// A device of `n` pages, filled, every page written back packed to a `Faulty` RAM store.
fn all_written_back_packed(n: u64) -> (Device, Arc<Faulty<MemoryDevice>>) {
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Faulty::new(MemoryDevice::new(8 << 20).unwrap()));
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    (dev, store)
}

#[test]
fn packed_pages_are_read_a_segment_at_a_time_and_never_stale() {
    let n = 600;
    let (dev, store) = all_written_back_packed(n);
    let bd = dev.bd_stat().unwrap();
    let segments = bd.bytes_held / (64 << 10);
    assert!(segments > 1 && segments * 8 < bd.bd_count, "{bd:?}");
    // Read in order, the pages of a segment cost the store one read between them.
    let before = store.reads();
    verify(&dev, n, |_| None);
    let reads = store.reads() - before;
    assert_eq!(
        reads, segments,
        "reads from the store for {segments} segments"
    );
    assert_eq!(dev.bd_stat().unwrap().bd_reads, segments);

    // A segment whose pages all go is freed, leaves the cache, and its slots are handed out
    // again to new pages: reading them must give the new pages, not the cached old ones.
    let mut out = vec![0u8; PS];
    dev.read_page(0, &mut out).unwrap(); // the first segment, cached
    for i in 0..n {
        dev.discard_page(i).unwrap();
    }
    assert_eq!(dev.bd_stat().unwrap().bytes_held, 0);
    for i in 0..n {
        dev.write_page(i, &page(i + 7777)).unwrap();
    }
    dev.writeback(PageSelector::All, None, None).unwrap();
    verify(&dev, n, |i| Some(page(i + 7777)));
}

#[test]
fn cached_segments_go_when_the_store_is_lost_and_are_read_anew_when_it_is_back() {
    let n = 64;
    let (dev, store) = all_written_back_packed(n);
    // Page 1: written back (page 0 is a zero page, never on the store).
    let mut out = vec![0u8; PS];
    dev.read_page(1, &mut out).unwrap();
    let reads = store.reads();
    dev.read_page(1, &mut out).unwrap();
    assert_eq!(store.reads(), reads, "the second read is the cache's");

    // The store is lost (its epoch moves): the page's read is the store's, and fails,
    // though the cache held its segment.
    store.set_failing(false, true);
    let err = dev.read_page(1, &mut out).unwrap_err();
    assert!(err.to_string().contains("vanished"), "{err}");
    // Back: read from the store again, exact.
    store.set_failing(false, false);
    dev.read_page(1, &mut out).unwrap();
    assert_eq!(out, page(1));
    assert_eq!(
        store.reads(),
        reads + 1,
        "read anew from the store once back"
    );
    verify(&dev, n, |_| None);
}

/// A store that counts its batches (`read_many` and `write_many` calls of more than one
/// range), the requests a remote store would have in flight together.
struct Batches {
    inner: MemoryDevice,
    read_batches: AtomicU64,
    write_batches: AtomicU64,
}

impl ztier_blockdev::BlockDevice for Batches {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_at(offset, data, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        Ok(())
    }
    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> ztier_blockdev::Result<()> {
        if reads.len() > 1 {
            self.read_batches.fetch_add(1, Relaxed);
        }
        for (offset, buf) in reads.iter_mut() {
            self.inner.read_at(*offset, buf)?;
        }
        Ok(())
    }
    fn write_many(&self, writes: &[(u64, &[u8])]) -> ztier_blockdev::Result<()> {
        if writes.len() > 1 {
            self.write_batches.fetch_add(1, Relaxed);
        }
        for (offset, data) in writes {
            self.inner.write_at(*offset, data, false)?;
        }
        Ok(())
    }
}

#[test]
fn segments_go_out_and_come_back_several_at_once() {
    let n = 1200;
    let store = Arc::new(Batches {
        inner: MemoryDevice::new(16 << 20).unwrap(),
        read_batches: AtomicU64::new(0),
        write_batches: AtomicU64::new(0),
    });
    let setup = || {
        let dev = device(n, "lz4");
        fill(&dev, n);
        dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
            .unwrap();
        dev.writeback(PageSelector::All, None, None).unwrap();
        dev
    };
    let dev = setup();
    let bd = dev.bd_stat().unwrap();
    let segments = bd.bytes_held / (64 << 10);
    assert!(segments >= 8, "{bd:?}");
    assert!(
        store.write_batches.load(Relaxed) > 0,
        "segments written one by one"
    );

    // Pages read one by one in order: past the first segments, the next ones are read
    // ahead with the one asked for. Every page exact, each segment read once.
    verify(&dev, n, |_| None);
    assert!(store.read_batches.load(Relaxed) > 0, "no readahead");
    assert_eq!(dev.bd_stat().unwrap().bd_reads, segments);

    // A read of many pages at once fetches its segments together before it decompresses.
    drop(dev);
    let dev = setup();
    store.read_batches.store(0, Relaxed);
    let mut all = vec![0u8; n as usize * PS];
    dev.read_bytes(0, &mut all).unwrap();
    assert!(
        store.read_batches.load(Relaxed) > 0,
        "segments read one by one"
    );
    for i in 0..n as usize {
        assert!(all[i * PS..(i + 1) * PS] == page(i as u64)[..], "page {i}");
    }
    assert_eq!(dev.bd_stat().unwrap().bd_reads, segments);
}

/// A RAM store whose reads take `delay` (a remote store's round trip, so readers that miss
/// the same segment meet), counting the blocks read by the thread that made it and by any
/// other.
struct Slow {
    inner: MemoryDevice,
    delay: Duration,
    maker: std::thread::ThreadId,
    by_maker: AtomicU64,
    by_others: AtomicU64,
}

impl Slow {
    fn new(bytes: u64, delay: Duration) -> Slow {
        Slow {
            inner: MemoryDevice::new(bytes).unwrap(),
            delay,
            maker: std::thread::current().id(),
            by_maker: AtomicU64::new(0),
            by_others: AtomicU64::new(0),
        }
    }
}

impl ztier_blockdev::BlockDevice for Slow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> ztier_blockdev::Result<()> {
        std::thread::sleep(self.delay);
        let count = if std::thread::current().id() == self.maker {
            &self.by_maker
        } else {
            &self.by_others
        };
        count.fetch_add(1, Relaxed);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_at(offset, data, fua)
    }
    fn discard(&self, offset: u64, len: u64) -> ztier_blockdev::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> ztier_blockdev::Result<()> {
        self.inner.write_zeroes(offset, len, may_unmap)
    }
    fn flush(&self) -> ztier_blockdev::Result<()> {
        Ok(())
    }
}

#[test]
fn readers_missing_the_same_segment_share_one_read() {
    let n = 800;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Slow::new(8 << 20, Duration::from_millis(2)));
    dev.set_backing(Some(Backing::new(store, WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    let segments = dev.bd_stat().unwrap().bytes_held / (64 << 10);
    assert!(segments >= 4);
    // Four threads read every page in the same order at once: each segment is missed by
    // all four about together.
    let start = Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                start.wait();
                verify(&dev, n, |_| None);
            });
        }
    });
    let reads = dev.bd_stat().unwrap().bd_reads;
    assert!(
        reads < 2 * segments,
        "{reads} store reads for {segments} segments: the readers read on their own"
    );
}

#[test]
fn a_sequential_reader_finds_the_next_segments_read_in_the_background() {
    let n = 2400;
    let dev = device(n, "lz4");
    fill(&dev, n);
    // This thread reads; the store tells its reads from the readahead's.
    let store = Arc::new(Slow::new(32 << 20, Duration::from_micros(500)));
    dev.set_backing(Some(Backing::new(store.clone(), WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    let segments = dev.bd_stat().unwrap().bytes_held / (64 << 10);
    // The first segment and a window of 16 the reader reads itself, then two windows the
    // readahead claims before the reader gets there.
    assert!(
        segments >= 49,
        "{segments} segments: too few for the first and three windows of 16"
    );
    let (mine, others) = (store.by_maker.load(Relaxed), store.by_others.load(Relaxed));

    // Read in order, page by page: past the first windows, the segments are read by the
    // readahead while this thread decompresses, each once, every page exact.
    verify(&dev, n, |_| None);
    let mine = store.by_maker.load(Relaxed) - mine;
    let others = store.by_others.load(Relaxed) - others;
    // Most are, here; at least two windows' worth on a loaded machine, where the two
    // readahead threads can fall behind the reader.
    assert!(
        others >= 32,
        "of {segments} segments, {others} were read in the background and {mine} by the reader"
    );
    assert_eq!(dev.bd_stat().unwrap().bd_reads, segments);
}

#[test]
fn a_reset_waits_for_the_readahead_and_frees_every_place() {
    let n = 2400;
    let dev = device(n, "lz4");
    fill(&dev, n);
    let store = Arc::new(Slow::new(32 << 20, Duration::from_millis(2)));
    dev.set_backing(Some(Backing::new(store, WbFormat::Packed).unwrap()))
        .unwrap();
    dev.writeback(PageSelector::All, None, None).unwrap();
    // Read in order until a window is being read in the background (more segments read
    // than the reader has reached), then reset at once.
    let mut out = vec![0u8; PS];
    let mut i = 0;
    while i < n && dev.bd_stat().unwrap().bd_reads < 2 * 16 {
        dev.read_page(i, &mut out).unwrap();
        assert!(out == page(i), "page {i}");
        i += 1;
    }
    assert!(i < n, "no readahead went out");
    dev.reset();
    // Every place given back, none still held by a read in flight; the counts start again.
    let bd = dev.bd_stat().unwrap();
    assert_eq!(
        (bd.bytes_held, bd.bd_count, bd.bd_reads),
        (0, 0, 0),
        "{bd:?}"
    );
}
