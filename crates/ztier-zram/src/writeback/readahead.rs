//! Reading packed segments: from the cache, or from the store, where a miss right after the
//! segment before it (a sequential reader) also reads the next live segments in one batch of
//! requests in flight together, and a reader reaching the readahead's mark starts the next
//! window in the background (the kernel's asynchronous readahead, with its `PG_readahead`
//! mark), on at most [`AHEAD_THREADS`] threads.
//!
//! Invariants: every segment read is held while it is read (a reader's pin, or a window's
//! hold), so none is freed and handed out again meanwhile; a segment's hold goes once its
//! bytes are cached, before its waiters wake; a reset or a new store waits for the
//! readahead threads to end ([`Backing::quiesce`]).
//! Locks: `Backing::ahead` and `Backing::ahead_threads` are leaves; nothing is held across
//! the store's I/O (DESIGN.md's table).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ztier_swap::SwapError;

use super::cache::{Ahead, Claim, Taken, READAHEAD};
use super::store::Backing;
use super::{SEG_BYTES, SEG_SLOTS};

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
