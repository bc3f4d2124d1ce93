//! The segment cache and readahead: packed segments are read whole and kept in a small
//! cache (the pages written back together cost the store one read between them), readers
//! that miss the same segment at once share one read ([`Loading`], [`Claim`]), and a
//! sequential reader's next segments are read ahead, a window at a time, in the background
//! (the kernel's asynchronous readahead with its `PG_readahead` mark).
//!
//! Invariants: a cached segment always holds what the store holds: it is read while a pin
//! or hold keeps it allocated, leaves the cache before its slots can be handed out again,
//! and the whole cache goes when the store's epoch moves (its link lost or found again).
//! Locks: `SegmentCache::loading` before its cached segments' (a claim looks in the cache),
//! never after; `Backing::ahead` and `Backing::ahead_threads` are leaves; none is held
//! across I/O (DESIGN.md's table).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;
use ztier_swap::SwapError;

use super::store::Backing;
use super::{SEG_BYTES, SEG_SLOTS};

/// Packed segments kept after a read, so the pages written back together (usually
/// neighbours, read together again) cost one request to the store, not one each (4 MiB).
pub(super) const SEGMENT_CACHE: usize = 64;

/// Segments a sequential read fetches at once (the one asked for and those after it), in
/// flight together: 16 kept a Ceph cluster's reads 0.54-0.65x `rados bench -t 16` where 8
/// kept them at 0.31-0.48x (MEASUREMENTS.md). A quarter of the cache: the window being
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

/// Background readahead windows being read at once, at most: a thread each.
pub(super) const AHEAD_THREADS: usize = 2;

/// Segments claimed to be read together, each held so none is freed meanwhile: a
/// segment's hold goes once its bytes are in the cache (before its waiters wake), the rest
/// when the window is dropped (a failed read, a segment someone else was reading).
pub(super) struct Window {
    pub(super) store: Arc<Backing>,
    pub(super) claims: Vec<Claim>,
    pub(super) held: Vec<u64>,
}

impl Drop for Window {
    fn drop(&mut self) {
        // The claims first (their waiters read for themselves), then the holds.
        self.claims.clear();
        for f in self.held.drain(..) {
            self.store.release_bytes(f, 1);
        }
    }
}

/// The background readahead threads of a store: how many run now, and a signal when one
/// ends (a reset or a new store waits for them: [`Backing::quiesce`]).
#[derive(Default)]
pub(super) struct AheadThreads {
    pub(super) running: Mutex<usize>,
    pub(super) ended: parking_lot::Condvar,
}

/// A running readahead thread's place in [`AheadThreads`], given back when it ends however
/// it ends.
pub(super) struct AheadTicket(Arc<Backing>);

impl Drop for AheadTicket {
    fn drop(&mut self) {
        let threads = &self.0.ahead_threads;
        *threads.running.lock() -= 1;
        threads.ended.notify_all();
    }
}

impl Backing {
    /// The packed segment starting at slot `first`, from the cache or read whole from the
    /// store; the caller holds a pin on it. A miss right after the segment before it on the
    /// store (a sequential read) also reads the next live segments, up to [`READAHEAD`] in
    /// all, in one batch of requests in flight together, into the cache; each is held while
    /// it is read, so none is freed meanwhile.
    pub(super) fn segment(
        self: &Arc<Self>,
        first: u64,
    ) -> std::result::Result<Arc<[u8]>, SwapError> {
        let epoch = self.store.epoch();
        let own = loop {
            if let Some(bytes) = self.cache.get(first, epoch) {
                self.on_read(first);
                return Ok(bytes);
            }
            match self.cache.claim(first, epoch) {
                Taken::Claim(claim) => break claim,
                // Another reader (or the readahead) is reading it: its bytes are this one's
                // too. If its read failed, this one tries for itself.
                Taken::Loading(loading) => {
                    if let Some(bytes) = loading.wait() {
                        self.on_read(first);
                        return Ok(bytes);
                    }
                }
                // Read in since the look: the next look finds it.
                Taken::Cached => {}
            }
        };
        let sequential = first >= SEG_SLOTS && self.cache.contains(first - SEG_SLOTS, epoch);
        // The segments after it go with it; the first of them is the mark.
        let ahead = sequential
            .then(|| self.claim_window(first + SEG_SLOTS, READAHEAD - 1, epoch))
            .flatten();
        match ahead {
            Some(mut w) => {
                let mut claims = vec![own];
                claims.append(&mut w.claims);
                self.fetch(claims, epoch, &mut w.held)
            }
            None => self.fetch(vec![own], epoch, &mut Vec::new()),
        }
        .map(|first| first.expect("the segment's own claim is the first"))
    }

    /// Claims up to `n` live segments from slot `start` on that are neither cached nor being
    /// read (looking no further than twice [`READAHEAD`], past freed ones), each held, and
    /// makes the first the mark for the window after; `None` if there are none.
    pub(super) fn claim_window(
        self: &Arc<Self>,
        start: u64,
        n: usize,
        epoch: u64,
    ) -> Option<Window> {
        let mut w = Window {
            store: Arc::clone(self),
            claims: Vec::new(),
            held: Vec::new(),
        };
        for next in (0..2 * READAHEAD as u64).map(|i| start + i * SEG_SLOTS) {
            if w.claims.len() == n || next + SEG_SLOTS > self.places.slots() {
                break;
            }
            if self.cache.contains(next, epoch) || !self.try_hold(next) {
                continue;
            }
            w.held.push(next);
            if let Taken::Claim(claim) = self.cache.claim(next, epoch) {
                w.claims.push(claim);
            }
        }
        let (first, last) = (w.claims.first()?.first, w.claims.last()?.first);
        *self.ahead.lock() = Ahead {
            mark: Some(first),
            last,
        };
        Some(w)
    }

    /// After segment `first` was read (from the cache or a read it waited for): if it is the
    /// readahead's mark, the next window is claimed now and read in the background, unless
    /// [`AHEAD_THREADS`] are reading already (the reader's misses then read for themselves).
    pub(super) fn on_read(self: &Arc<Self>, first: u64) {
        let start = {
            let mut a = self.ahead.lock();
            if a.mark != Some(first) {
                return;
            }
            a.mark = None;
            a.last + SEG_SLOTS
        };
        {
            let mut running = self.ahead_threads.running.lock();
            if *running == AHEAD_THREADS {
                return;
            }
            *running += 1;
        }
        let ticket = AheadTicket(Arc::clone(self));
        let epoch = self.store.epoch();
        // Claimed before the thread starts: a reader that gets there first waits for these
        // reads rather than sending its own. If no thread can be started, the window and
        // the ticket are dropped here: the claims go unfinished (their readers read for
        // themselves) and the holds go.
        let Some(mut window) = self.claim_window(start, READAHEAD, epoch) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("zram-readahead".into())
            .spawn(move || {
                let claims = std::mem::take(&mut window.claims);
                // A failure is left to the reads of those pages to meet and report.
                let _ = window.store.fetch(claims, epoch, &mut window.held);
                // The holds go before the ticket, so a store that waits for its readahead
                // to end finds every unit as its pages left it.
                drop(window);
                drop(ticket);
            });
    }

    /// Waits until no readahead thread is reading this store: before a reset frees its
    /// pages' places, and before another store (maybe over the same device) replaces it.
    pub(crate) fn quiesce(&self) {
        let mut running = self.ahead_threads.running.lock();
        while *running > 0 {
            self.ahead_threads.ended.wait(&mut running);
        }
    }

    /// Zeroes the count of segments read (a reset's, with the device's other counters).
    pub(crate) fn reset_reads(&self) {
        self.segment_reads.store(0, Relaxed);
    }

    /// Reads the packed segments claimed as requests in flight together, adds them to the
    /// cache (read in the store's `epoch`, as it was before the read), lets go of each one's
    /// hold in `held` once it is cached, tells whoever waits for them, and returns the first
    /// (`None` for no claims).
    /// Each is held by the caller (a pin, or a hold in `held`).
    pub(super) fn fetch(
        &self,
        claims: Vec<Claim>,
        epoch: u64,
        held: &mut Vec<u64>,
    ) -> std::result::Result<Option<Arc<[u8]>>, SwapError> {
        let mut bufs: Vec<Vec<u8>> = claims.iter().map(|_| vec![0u8; SEG_BYTES]).collect();
        let mut reads: Vec<(u64, usize, &mut [u8])> = claims
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| (c.first, 0, &mut b[..]))
            .collect();
        // On an error the claims go unfinished: their waiters read for themselves.
        self.places.read_runs(&mut reads)?;
        // Counted before anyone waiting for them wakes.
        self.segment_reads.fetch_add(claims.len() as u64, Relaxed);
        let mut own = None;
        for (claim, bytes) in claims.into_iter().zip(bufs) {
            let bytes: Arc<[u8]> = bytes.into();
            own.get_or_insert_with(|| Arc::clone(&bytes));
            self.cache.add(claim.first, Arc::clone(&bytes), epoch);
            // Cached, so a hold is no longer needed to keep it from going stale: freed
            // from now on, it leaves the cache first. Every waiter holds a pin of its own.
            if let Some(i) = held.iter().position(|&f| f == claim.first) {
                held.swap_remove(i);
                self.release_bytes(claim.first, 1);
            }
            claim.finish(Some(bytes));
        }
        Ok(own)
    }
}
