//! The segment cache: packed segments are read whole and kept in a small cache (the pages
//! written back together cost the store one read between them), and readers that miss the
//! same segment at once share one read ([`Loading`], [`Claim`]). Also the readahead's state
//! ([`Ahead`], [`AheadThreads`]); the reading itself is `readahead.rs`'s.
//!
//! Invariants: a cached segment always holds what the store holds: it is read while a pin
//! or hold keeps it allocated, leaves the cache before its slots can be handed out again,
//! and the whole cache goes when the store's epoch moves (its link lost or found again).
//! Locks: `SegmentCache::loading` before its cached segments' (a claim looks in the cache),
//! never after; `Backing::ahead` and `Backing::ahead_threads` are leaves; none is held
//! across I/O (DESIGN.md's table).

use std::sync::Arc;

use parking_lot::Mutex;

/// Packed segments kept after a read, so the pages written back together (usually
/// neighbours, read together again) cost one request to the store, not one each (4 MiB).
pub(super) const SEGMENT_CACHE: usize = 64;

/// Segments a sequential read fetches at once (the one asked for and those after it), in
/// flight together: 16 kept a Ceph cluster's reads 0.54-0.65x `rados bench -t 16` where 8
/// kept them at 0.31-0.48x (docs/diary.md). A quarter of the cache: the window being
/// read, the one read ahead and the one the reader is in fit with room to spare, so
/// readahead never pushes out what the reader has yet to read.
pub(super) const READAHEAD: usize = SEGMENT_CACHE / 4;

/// Recently read packed segments, most recent last. A segment is read whole on a miss, while
/// a pin keeps it allocated, and leaves the cache when its last live byte goes, before its
/// slots can be handed out again; so a cached segment always holds what the store holds.
/// And the cache is emptied when the store's [`epoch`](BlockDevice::epoch) moves (its link
/// lost, or found again): while the store is away its pages fail as the store does, and
/// what it holds once back is read from it anew. Bounded at [`SEGMENT_CACHE`] segments
/// (4 MiB); the lock is held to look up, add or drop one, never across I/O. `loading`'s
/// lock is taken before `cached`'s (a claim looks in the cache), never after.
#[derive(Default)]
pub(super) struct SegmentCache {
    pub(super) cached: Mutex<Cached>,
    /// Segments being read from the store now: a reader that misses one waits for that
    /// read instead of sending its own (concurrent misses cost the store one read).
    pub(super) loading: Mutex<Vec<(u64, Arc<Loading>)>>,
}

impl SegmentCache {
    /// The claim to read segment `first`, unless it is being read or cached (in the store's
    /// `epoch`). A read adds its segment to the cache before it leaves `loading`, and the
    /// cache is looked at under `loading`'s lock, so a segment is never claimed again just
    /// as its read ends.
    pub(super) fn claim(self: &Arc<Self>, first: u64, epoch: u64) -> Taken {
        let mut loading = self.loading.lock();
        if let Some((_, l)) = loading.iter().find(|(f, _)| *f == first) {
            return Taken::Loading(Arc::clone(l));
        }
        if self.contains(first, epoch) {
            return Taken::Cached;
        }
        let l = Arc::new(Loading::default());
        loading.push((first, Arc::clone(&l)));
        Taken::Claim(Claim {
            cache: Arc::clone(self),
            first,
            loading: l,
        })
    }

    pub(super) fn get(&self, first: u64, epoch: u64) -> Option<Arc<[u8]>> {
        let mut cached = self.cached.lock();
        let segs = cached.at(epoch);
        let i = segs.iter().position(|(f, _)| *f == first)?;
        let hit = segs.remove(i);
        let bytes = Arc::clone(&hit.1);
        segs.push(hit);
        Some(bytes)
    }

    /// Adds a segment read in the store's `epoch` (as it was before the read began), unless
    /// the cache has seen a later one since.
    pub(super) fn add(&self, first: u64, bytes: Arc<[u8]>, epoch: u64) {
        let mut cached = self.cached.lock();
        if epoch < cached.epoch {
            return;
        }
        let segs = cached.at(epoch);
        segs.retain(|(f, _)| *f != first);
        if segs.len() == SEGMENT_CACHE {
            segs.remove(0);
        }
        segs.push((first, bytes));
    }

    pub(super) fn contains(&self, first: u64, epoch: u64) -> bool {
        self.cached
            .lock()
            .at(epoch)
            .iter()
            .any(|(f, _)| *f == first)
    }

    pub(super) fn forget(&self, first: u64) {
        self.cached.lock().segments.retain(|(f, _)| *f != first);
    }
}

/// The cached segments and the store's epoch they were read in.
#[derive(Default)]
pub(super) struct Cached {
    pub(super) epoch: u64,
    pub(super) segments: Vec<(u64, Arc<[u8]>)>,
}

impl Cached {
    /// The segments of the store's `epoch`: emptied first if it moved on from theirs.
    pub(super) fn at(&mut self, epoch: u64) -> &mut Vec<(u64, Arc<[u8]>)> {
        if self.epoch != epoch {
            self.segments.clear();
            self.epoch = epoch;
        }
        &mut self.segments
    }
}

/// A segment read in flight: its bytes once read (`Some(None)`: the read failed).
#[derive(Default)]
pub(super) struct Loading {
    pub(super) done: Mutex<Option<Option<Arc<[u8]>>>>,
    pub(super) finished: parking_lot::Condvar,
}

impl Loading {
    /// The bytes the read got, once it ends; `None` if it failed.
    pub(super) fn wait(&self) -> Option<Arc<[u8]>> {
        let mut done = self.done.lock();
        while done.is_none() {
            self.finished.wait(&mut done);
        }
        done.clone().flatten()
    }
}

/// The right to read a segment for everyone who misses it meanwhile; its readers are told
/// the outcome when it is finished, or, if it is dropped unfinished, that it failed.
pub(super) struct Claim {
    pub(super) cache: Arc<SegmentCache>,
    pub(super) first: u64,
    pub(super) loading: Arc<Loading>,
}

impl Claim {
    pub(super) fn finish(self, bytes: Option<Arc<[u8]>>) {
        *self.loading.done.lock() = Some(bytes);
        // Dropped now: the entry goes and the waiters wake.
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut done = self.loading.done.lock();
        if done.is_none() {
            *done = Some(None);
        }
        drop(done);
        self.loading.finished.notify_all();
        self.cache
            .loading
            .lock()
            .retain(|(f, l)| !(*f == self.first && Arc::ptr_eq(l, &self.loading)));
    }
}

/// What a reader about to read a segment finds: the right to read it, a read of it in
/// flight, or the segment cached already.
pub(super) enum Taken {
    Claim(Claim),
    Loading(Arc<Loading>),
    Cached,
}

/// A sequential reader's readahead (the kernel's asynchronous readahead, with its
/// `PG_readahead` mark): the segment whose read starts the next window in the background,
/// and where that window starts, so the next window's requests are in flight while the
/// reader decompresses this one's pages.
#[derive(Default)]
pub(super) struct Ahead {
    /// The segment whose read starts the next window (the first of the window before it).
    pub(super) mark: Option<u64>,
    /// The last segment of the newest window: the next starts after it.
    pub(super) last: u64,
}

/// The background readahead threads of a store: how many run now, and a signal when one
/// ends (a reset or a new store waits for them: `Backing::quiesce`).
#[derive(Default)]
pub(super) struct AheadThreads {
    pub(super) running: Mutex<usize>,
    pub(super) ended: parking_lot::Condvar,
}
