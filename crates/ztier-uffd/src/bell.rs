//! The fault thread's doorbell. While faults come, the fault thread waits for the next
//! message in a blocking `read` of the userfaultfd ("parked"), holding `gate` (write), not
//! in a `poll` followed by a `read`: one system call on a fault's path instead of two, and
//! no poll table to set up and take down, which shows in a bare handler's round trip and
//! in a region's single-page faults at p50 (docs/diary.md, "A fault thread parked in its
//! read"). Nothing but a message (or a signal) ends such a read. So a thread that needs
//! the parked fault thread (an evictor or [`Region::stats`] waiting for `gate`, the CPU
//! latency request's alarm, the region's drop) sends it one: a `MADV_DONTNEED` of the bell
//! page, a page of the pad that nothing maps or moves into, makes the kernel queue a
//! `REMOVE` event for it and return once the event is read.
//!
//! Invariants: `word` holds [`PARKED`] (the fault thread is in its blocking read, or about to
//! enter it, or just out of it, holding `gate`), a count of wants (one for each thread that
//! needs the fault thread out of its read, from before it looks at [`PARKED`] until it no
//! longer needs it), and a count of rings made and not yet read. The fault thread parks only
//! while no want is held, by one atomic update that sees the wants; a want is taken by one
//! atomic update that sees [`PARKED`] and, if set, counts its ring in the same step. So a
//! want made before a park keeps the fault thread out, and one made while it is parked is
//! counted as a ring before it can be missed; a want that finds it just out of its read (not
//! yet unparked) rings all the same, and waits for the fault thread's next read, which every
//! turn of its loop makes. The fault thread reads every counted ring before it ends, so no
//! ringer waits for ever. A ring that could not be made (its `madvise` failed) is taken back
//! and leaves the bell unusable: the fault thread parks no more, but a wait already parked
//! ends only with the next message. `MADV_DONTNEED_LOCKED` of a page of the region's own
//! pad fails only if the program unmapped that pad. Atomics only; no locks.
//!
//! [`Region::stats`]: crate::Region::stats

use std::sync::atomic::Ordering::{Relaxed, SeqCst};

// Under `--cfg loom` the model checker's atomics stand in, so that it can try every order
// of a want and a park (`loom_tests` below).
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64};

use ztier_base::bits::Field;

/// The word's fields, low to high: the park bit, the wants, the rings made and not yet read.
const PARKED_BIT: Field = Field::at(0, 1);
const WANT_COUNT: Field = Field::after(PARKED_BIT, 31);
const RING_COUNT: Field = Field::after(WANT_COUNT, 32);
const _: () = assert!(RING_COUNT.end() == 64);

/// The fault thread is parked.
const PARKED: u64 = 1 << PARKED_BIT.shift();
/// One want, and every want.
const WANT: u64 = 1 << WANT_COUNT.shift();
const WANTS: u64 = WANT_COUNT.max() << WANT_COUNT.shift();
/// One ring made and not yet read.
const RING: u64 = 1 << RING_COUNT.shift();

pub(crate) struct Bell {
    word: AtomicU64,
    /// The bell page's address and its size.
    page: u64,
    page_size: u64,
    /// Set once a ring could not be made: parking is off for good.
    broken: AtomicBool,
    /// Times the fault thread was rung out of its read (a figure).
    rung: AtomicU64,
}

/// A thread's want of the fault thread out of its read: withdrawn when dropped.
pub(crate) struct Want<'a> {
    bell: &'a Bell,
    /// Whether the fault thread was parked when the want was made: the caller rings (the
    /// ring is counted already).
    pub(crate) must_ring: bool,
}

impl Drop for Want<'_> {
    fn drop(&mut self) {
        self.bell.word.fetch_sub(WANT, SeqCst);
    }
}

impl Bell {
    pub(crate) fn new(page: u64, page_size: usize) -> Bell {
        Bell {
            word: AtomicU64::new(0),
            page,
            page_size: page_size as u64,
            broken: AtomicBool::new(false),
            rung: AtomicU64::new(0),
        }
    }

    /// The fault thread's call, holding `gate` (write): whether it may park (no one wants
    /// it, and no ring ever failed); if so it is parked until [`unpark`](Bell::unpark).
    pub(crate) fn park(&self) -> bool {
        if self.broken.load(Relaxed) {
            return false;
        }
        self.word
            .fetch_update(SeqCst, SeqCst, |w| {
                (w & (WANTS | PARKED) == 0).then_some(w | PARKED)
            })
            .is_ok()
    }

    /// The fault thread's call once its blocking read returned (or it chose not to wait).
    pub(crate) fn unpark(&self) {
        self.word.fetch_and(!PARKED, SeqCst);
    }

    /// Whether the fault thread is parked now.
    #[cfg(test)]
    pub(crate) fn parked(&self) -> bool {
        self.word.load(SeqCst) & PARKED != 0
    }

    /// A want of the fault thread out of its read, until the returned value is dropped;
    /// while it lasts the fault thread does not park. If it was parked, the ring is counted
    /// here and the caller must make it ([`Want::must_ring`]).
    pub(crate) fn want(&self) -> Want<'_> {
        let prev = self
            .word
            .fetch_update(SeqCst, SeqCst, |w| {
                Some(w + WANT + if w & PARKED != 0 { RING } else { 0 })
            })
            .expect("the update always applies");
        Want {
            bell: self,
            must_ring: prev & PARKED != 0,
        }
    }

    /// A counted ring could not be made (the caller's `madvise` failed): it is taken back,
    /// and the fault thread parks no more.
    pub(crate) fn ring_failed(&self) {
        self.broken.store(true, Relaxed);
        self.took_ring();
    }

    /// Whether a `REMOVE` event of `[start, end)` is a ring; if so it is taken as read.
    pub(crate) fn is_ring(&self, start: u64, end: u64) -> bool {
        if start != self.page || end != self.page + self.page_size {
            return false;
        }
        self.took_ring();
        self.rung.fetch_add(1, Relaxed);
        true
    }

    /// Rings made and not yet read: the fault thread reads them before it ends.
    pub(crate) fn rings_unread(&self) -> u64 {
        RING_COUNT.get(self.word.load(SeqCst))
    }

    /// Times the fault thread was rung out of its read.
    pub(crate) fn times_rung(&self) -> u64 {
        self.rung.load(Relaxed)
    }

    fn took_ring(&self) {
        let _ = self
            .word
            .fetch_update(SeqCst, SeqCst, |w| (w >= RING).then(|| w - RING));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Whichever comes first of a want and a park, the other sees it: a want made while
    /// the fault thread is parked rings (and is counted until read), one made before keeps
    /// it from parking, and a withdrawn want lets it park again.
    #[test]
    fn a_want_either_keeps_the_fault_thread_out_or_rings_it() {
        let bell = Bell::new(0x1000, 4096);
        {
            let w = bell.want();
            assert!(!w.must_ring, "nobody parked: no ring");
            assert!(!bell.park(), "a want keeps it from parking");
        }
        assert!(bell.park(), "the want withdrawn, it parks");
        let w = bell.want();
        assert!(w.must_ring, "parked: the want rings");
        assert_eq!(bell.rings_unread(), 1);
        assert!(
            !bell.is_ring(0x1000, 0x3000),
            "a drop of more than the bell page"
        );
        assert!(bell.is_ring(0x1000, 0x2000));
        assert_eq!(bell.rings_unread(), 0);
        assert_eq!(bell.times_rung(), 1);
        bell.unpark();
        assert!(!bell.park(), "the ringer's want still holds");
        drop(w);
        assert!(bell.park());
        bell.unpark();
        let for_ever = bell.want();
        assert!(!for_ever.must_ring);
        std::mem::forget(for_ever);
        assert!(!bell.park(), "a want for ever: never parks again");

        let bell = Bell::new(0x1000, 4096);
        assert!(bell.park());
        assert!(bell.want().must_ring);
        bell.unpark();
        bell.ring_failed();
        assert_eq!(bell.rings_unread(), 0, "a failed ring is taken back");
        assert!(!bell.park(), "and parking is off for good");
    }

    /// Wants from several threads against a thread parking and unparking: every want that
    /// was told to ring is counted, and none that was not (the count and the decision are
    /// one step).
    #[test]
    fn every_want_told_to_ring_is_counted_as_a_ring() {
        let bell = Bell::new(0x1000, 4096);
        let stop = AtomicBool::new(false);
        // On two CPUs shared with other tests, 20,000 wants each may all miss the parker's
        // parked moments: they go on, up to a deadline, until one of them has found it.
        let found = AtomicBool::new(false);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let told: u64 = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    if bell.park() {
                        std::hint::spin_loop();
                        bell.unpark();
                    }
                }
            });
            let wanters: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        let mut told = 0;
                        let mut wants = 0;
                        while wants < 20_000
                            || (!found.load(SeqCst) && std::time::Instant::now() < deadline)
                        {
                            let must_ring = bell.want().must_ring;
                            if must_ring {
                                found.store(true, SeqCst);
                            }
                            told += u64::from(must_ring);
                            wants += 1;
                        }
                        told
                    })
                })
                .collect();
            let told = wanters.into_iter().map(|w| w.join().unwrap()).sum();
            stop.store(true, SeqCst);
            told
        });
        assert!(told > 0, "the race never found the thread parked");
        assert_eq!(bell.rings_unread(), told);
        for _ in 0..told {
            assert!(bell.is_ring(0x1000, 0x2000));
        }
        assert_eq!(bell.rings_unread(), 0);
        assert!(!bell.parked());
    }
}

/// The bell's one-atomic-step rules, tried in every order of the threads' atomic steps by
/// loom: `RUSTFLAGS="--cfg loom" cargo test -p ztier-uffd --lib loom` (.ci/run). A want
/// taken in two steps (a look at [`PARKED`], then the count) fails here: the fault thread
/// can park between them, and the want neither keeps it out nor rings it.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// A want and a park racing agree on which came first: the want rings exactly when the
    /// park succeeded before it.
    #[test]
    fn loom_a_want_and_a_park_agree_on_which_came_first() {
        loom::model(|| {
            let bell = Arc::new(Bell::new(0x1000, 4096));
            let parker = {
                let bell = Arc::clone(&bell);
                loom::thread::spawn(move || bell.park())
            };
            let want = bell.want();
            let rang = want.must_ring;
            std::mem::forget(want);
            let parked = parker.join().unwrap();
            assert_eq!(parked, rang, "parked {parked}, rang {rang}");
        });
    }

    /// A fault thread's turn (park, a blocking read that a ring or another message ends,
    /// unpark) against a thread that needs it out of its read: whatever the order, the
    /// want gets the fault thread out (it never waits on a read nobody will end), and every
    /// ring counted is read.
    #[test]
    fn loom_a_want_always_gets_the_fault_thread_out_of_its_read() {
        use loom::sync::atomic::AtomicBool;
        loom::model(|| {
            let bell = Arc::new(Bell::new(0x1000, 4096));
            let in_read = Arc::new(AtomicBool::new(false));
            // Another message (a fault), which ends a read too; sent only at the end.
            let message = Arc::new(AtomicBool::new(false));
            let fault_thread = {
                let (bell, in_read, message) = (
                    Arc::clone(&bell),
                    Arc::clone(&in_read),
                    Arc::clone(&message),
                );
                loom::thread::spawn(move || {
                    if bell.park() {
                        in_read.store(true, SeqCst);
                        while bell.rings_unread() == 0 && !message.load(SeqCst) {
                            loom::thread::yield_now();
                        }
                        if bell.rings_unread() > 0 {
                            assert!(bell.is_ring(0x1000, 0x2000));
                        }
                        in_read.store(false, SeqCst);
                        bell.unpark();
                    }
                })
            };
            {
                // The ring's `madvise`, if told to ring, is the count `want` made already.
                let _want = bell.want();
                // What the want is for: the fault thread is not in its read (it never
                // parked, or a ring ends its read). A park the want missed would wait here
                // for ever, and loom fails the model.
                while in_read.load(SeqCst) {
                    loom::thread::yield_now();
                }
            }
            message.store(true, SeqCst);
            fault_thread.join().unwrap();
            assert_eq!(bell.rings_unread(), 0, "a ring left unread");
        });
    }
}
