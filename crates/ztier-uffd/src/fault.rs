//! The fault thread: reads the userfaultfd's messages, handles the program's changes to its
//! address space (remove, unmap, remap events) and serves the faults: missing pages, and the
//! first write to a clean page (its copy discarded before its protection is lifted: lib.rs,
//! "Clean pages"). A fault on a stored page, or a read of a page an evictor found all
//! zeros, with the neighbours it brings in, is fault_around.rs's.
//!
//! Invariants: it never reads or writes the region or the pad (the kernel copies into them
//! for it); events are handled, under `gate` (write), before any fault read after them is
//! served; a fault that cannot be served yet (`EAGAIN`, or the budget while the reclaim
//! thread catches up) waits in a queue while the thread goes on reading messages, so the
//! thread never waits for anything that waits for it. Between messages it blocks (no
//! spinning): while faults come, in a `read` of the descriptor made blocking, holding `gate`
//! (bell.rs says how other threads get it out); otherwise in `poll`. After serving faults it
//! reads once without waiting first (the next is often in by then). It keeps to the CPU of
//! the thread that faults (placement.rs). Lock order: lib.rs.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use parking_lot::RwLockWriteGuard;

use crate::fault_around::{Around, BringIn};
use crate::page_state::{Kind, PageState};
use crate::placement::Follow;
use crate::shared::{Count, FaultIn, Served, Shared};
use crate::userfaultfd::{self, Msg, Outcome};

/// How long after the last fault a wait of the fault thread may begin parked in its read
/// (bell.rs): as long as it holds the CPU latency request for them. Parked, it holds `gate`
/// until a message or a ring ends the wait; the first wait after it that begins later is
/// in `poll`, where evictors and `Region::stats` need not ring it.
const PARK_WHILE: Duration = crate::cpu_latency_qos::RELAX_AFTER;

/// A fault read and not yet served.
#[derive(Clone, Copy)]
struct Fault {
    addr: u64,
    write: bool,
    /// A write to a write-protected (clean) page.
    wp: bool,
    /// When its message was read: the fault's latency, as the handler sees it, runs from
    /// here to its copy.
    read_at: Instant,
}

/// Pages an `mremap` moved out of the region: their stored copies, to be copied to where
/// they are now, after which the new range is unregistered (its pages leave the region).
struct Remap {
    to: u64,
    len: u64,
    copies: Vec<(u64, Box<[u8]>)>,
}

/// The fault thread. A panic here would leave every thread that faults on the region
/// waiting for ever (or, were the descriptor closed, reading zeros where its data was): the
/// process is aborted instead, with the panic's message.
pub(crate) fn run(sh: &Shared) {
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve_faults(sh)));
    read_unread_rings(sh);
    // However it ended, its thread id is not acted on again, and no CPU is kept polling
    // for it.
    sh.fault.placement.done();
    sh.fault.qos.withdraw();
    if served.is_err() {
        eprintln!("ztier-uffd: the fault thread panicked; no page of the region can be served");
        std::process::abort();
    }
}

fn serve_faults(sh: &Shared) {
    let mut inbox = Inbox {
        msgs: [Msg::default(); 64],
        faults: VecDeque::new(),
        remaps: Vec::new(),
        follow: Follow::start(&sh.fault.placement),
    };
    let mut around = Around::new(sh.fault.max_around);
    // A window, and the units it begins and ends in (`Shared::serve_stored`).
    let unit_pages = sh.unit_pages as usize;
    let buf_pages = (sh.fault.max_around + 1).next_multiple_of(unit_pages) + 2 * unit_pages;
    let mut buf = vec![0u8; buf_pages * sh.page_size].into_boxed_slice();
    let zeros = vec![0u8; sh.page_size].into_boxed_slice();
    // Whether the last turn served faults, and whether finding no message right after it
    // says the faulting thread runs on another CPU.
    let (mut after_serving, mut empty_means_apart) = (false, false);
    // Whether the descriptor is blocking now (this thread parks in its read); when a fault
    // was last served; whether this thread may park (a fault served since a parked wait
    // ended with none: a ring says other threads want `gate` now, and parking again at once
    // would make each of them ring).
    let mut blocking = false;
    let mut last_fault: Option<Instant> = None;
    let mut may_park = false;
    loop {
        if sh.fault.stop.load(Relaxed) {
            return;
        }
        let waiting = !inbox.faults.is_empty() || !inbox.remaps.is_empty();
        if waiting {
            std::thread::yield_now();
        }
        // After a turn that served faults, a read before any wait: a copy's wake-up of a
        // faulting thread on this CPU gives it this CPU at once (at idle priority), so by
        // the time this thread runs again that thread's next fault is usually in, and a
        // poll first would be one more system call on its path. Only if `gate` is free: an
        // evictor holding it is no reason to wait here with nothing known to be in.
        let mut read = None;
        if std::mem::take(&mut after_serving) {
            if let Some(_gate) = sh.table.gate.try_write() {
                read = match inbox.read(sh) {
                    Some(n) => Some(n),
                    None => return,
                };
            }
            // Nothing in: the faulting thread may run on another CPU, and following it
            // (outside `serving`: a move at idle priority waits for the faulting thread to
            // leave that CPU) comes before its next fault (placement.rs, "Following").
            // Nothing in hand: also the moment for a look a fault found due.
            if read == Some(0) {
                if empty_means_apart {
                    inbox.follow.maybe_apart();
                }
                inbox.follow.look_if_due();
            }
        }
        // No spinning for the next message: on a machine whose idle CPUs halt (a VM's
        // vCPUs), a handler awake on one CPU wakes the faulting thread on another, which
        // costs more than the handler's own wake-up, which the scheduler puts on the
        // faulting thread's CPU (docs/diary.md, 2026-11-25).
        if read.unwrap_or(0) == 0 {
            // Parked in the read while faults come, none waits to be served again, and no
            // eviction pass runs (its batches would each ring this thread out); never with
            // the CPU latency request held and no alarm to ring it out for the request.
            let park = may_park
                && sh.uffd.can_block()
                && !waiting
                && !sh.evictors.passing.load(Relaxed)
                && (sh.fault.qos.has_alarm() || !sh.fault.qos.held())
                && last_fault.is_some_and(|t| t.elapsed() < PARK_WHILE);
            if park != blocking {
                match sh.uffd.set_blocking(park) {
                    Ok(()) => blocking = park,
                    Err(e) => sh.note_error(format!("the userfaultfd: {e}")),
                }
            }
            if blocking {
                match park_and_read(sh, &mut inbox) {
                    Parked::Read { faults } => may_park = faults,
                    // Someone waits for `gate`: let go of it.
                    Parked::Wanted => {
                        may_park = false;
                        continue;
                    }
                    Parked::Gone => return,
                }
            } else if !poll_and_read(sh, waiting, &mut inbox) {
                return;
            }
        }
        let mut served = 0;

        {
            let _serving = sh.fault.serving.lock();
            // A spell of stall begins at the oldest fault waiting, unless one is under way
            // (then the queue was never empty since it began).
            if let Some(oldest) = inbox.faults.front() {
                sh.stall.begin(oldest.read_at);
            }
            inbox.remaps.retain_mut(|r| !sh.continue_remap(r));
            let mut left = inbox.faults.len();
            // When the last fault served woke its thread.
            let mut last_woke = None;
            while left > 0 {
                left -= 1;
                let f = inbox.faults.pop_front().expect("counted");
                if inbox.faults.is_empty() && inbox.remaps.is_empty() {
                    // The last: its copy wakes a thread of normal priority, which takes this
                    // CPU at once from a fault thread at idle priority. Nothing waits after
                    // it (unless it is put back below, or new messages come, which the guard
                    // sees unread).
                    sh.fault.placement.holding(false);
                }
                match sh.serve(f, &mut buf, &zeros, &mut around) {
                    Served::Later => {
                        sh.count(Count::Deferred, 1);
                        inbox.faults.push_back(f);
                    }
                    Served::Done => {
                        let now = Instant::now();
                        last_woke = Some(around.woke_at.take().unwrap_or(now));
                        sh.figures.latency.record(now - f.read_at);
                        sh.fault.placement.progress();
                        served += 1;
                    }
                }
            }
            if served > 0 {
                // After the copies (taking the request wakes the idle CPUs, which no
                // faulting thread need wait for), and under `serving`, so that a faulting
                // thread's reading of the figures includes it.
                let now = Instant::now();
                sh.stall.served(served);
                if inbox.faults.is_empty() {
                    sh.stall.end(last_woke.unwrap_or(now));
                }
                sh.fault.qos.hold(now);
                last_fault = Some(now);
                may_park = true;
            }
        }
        after_serving = served > 0;
        // A turn whose fault brought neighbours in let the faulting thread run on while they
        // came, and fault on them wherever it ran: whether the first copy took this
        // thread's CPU says instead.
        match around.preempted_by_copy.take() {
            Some(preempted) => {
                empty_means_apart = false;
                if !preempted {
                    inbox.follow.maybe_apart();
                }
            }
            None => empty_means_apart = after_serving,
        }
        sh.fault
            .placement
            .holding(!inbox.faults.is_empty() || !inbox.remaps.is_empty());
        sh.wake_reclaim_if_over();
    }
}

/// How a parked wait ended.
enum Parked {
    /// Messages read (maybe only a ring), and handled; whether faults were among them.
    Read { faults: bool },
    /// Someone wants the fault thread out of its read (bell.rs): it did not park, and let
    /// `gate` go to whoever waits for it.
    Wanted,
    /// The region is being dropped.
    Gone,
}

/// Waits for the next message in a blocking read, holding `gate` (write) from before the
/// wait until the messages read are handled (as `Inbox::read`'s caller holds it), unless
/// someone wants this thread out of its read (bell.rs). The descriptor is blocking.
fn park_and_read(sh: &Shared, inbox: &mut Inbox<'_>) -> Parked {
    let gate = sh.table.gate.write();
    if sh.fault.stop.load(Relaxed) {
        return Parked::Gone;
    }
    loop {
        look_at_request_if_rung(sh);
        if !sh.fault.bell.park() {
            RwLockWriteGuard::unlock_fair(gate);
            return Parked::Wanted;
        }
        // The alarm's watcher marks it rung before it looks whether to ring: a ringing
        // marked before the park is seen here, one after it rings this thread out.
        if !sh.fault.qos.ringing() {
            break;
        }
        sh.fault.bell.unpark();
    }
    sh.count(Count::ParkedReads, 1);
    let got = sh.uffd.read_waiting(&mut inbox.msgs);
    sh.fault.bell.unpark();
    sh.fault.placement.progress();
    let n = match got {
        Ok(n) => n,
        Err(e) => {
            sh.note_error(format!("reading the userfaultfd: {e}"));
            if e.raw_os_error() == Some(libc::EBADF) {
                return Parked::Gone;
            }
            0
        }
    };
    let queued = inbox.faults.len();
    inbox.handle(sh, n);
    if n == inbox.msgs.len() && inbox.read(sh).is_none() {
        return Parked::Gone;
    }
    drop(gate);
    Parked::Read {
        faults: inbox.faults.len() > queued,
    }
}

/// Waits in `poll` for a message, the waker (the reclaim thread made room, the alarm rang,
/// the region is being dropped), or a millisecond while faults wait to be served again;
/// then reads what came. `false` once the region is being dropped. The descriptor is not
/// blocking.
fn poll_and_read(sh: &Shared, waiting: bool, inbox: &mut Inbox<'_>) -> bool {
    // While the CPU latency request is held, its alarm's watcher wakes this thread when the
    // request may be due to go, so the poll itself needs no timeout, whose timer would be
    // armed and cancelled on every fault.
    // Its ringing is taken before every wait, not only when a wait ends with no message:
    // it rings once, and a ringing left for a later wait would leave the request held.
    look_at_request_if_rung(sh);
    let timeout = match waiting {
        true => 1,
        false => sh.fault.qos.poll_timeout_ms(),
    };
    let ready = sh.uffd.poll(&sh.fault.waker, timeout);
    if sh.fault.stop.load(Relaxed) {
        return false;
    }
    // Not with a message in hand: withdrawing wakes the idle CPUs, which may halt again
    // just before this thread's copy has to wake one.
    if !ready.uffd && sh.fault.qos.held() {
        sh.fault.qos.relax_if_quiet(Instant::now());
    }
    sh.fault.placement.progress();
    if ready.waker {
        sh.fault.waker.drain();
    }
    // Nothing to read when only the waker woke it (or the poll timed out): queued faults
    // are served all the same.
    if ready.uffd {
        // In hand from here until served (the guard's view of what waits for this thread: a
        // message read is no longer unread).
        sh.fault.placement.holding(true);
        let _gate = sh.table.gate.write();
        if inbox.read(sh).is_none() {
            return false;
        }
    }
    true
}

/// Before a wait, with no message in hand (withdrawing the CPU latency request wakes the
/// idle CPUs, which may halt again just before this thread's copy has to wake one): if the
/// request's alarm rang, the request goes if no fault came for its quiet spell, else the
/// alarm is set for the rest of it.
fn look_at_request_if_rung(sh: &Shared) {
    if sh.fault.qos.take_ringing() && sh.fault.qos.held() {
        sh.fault.qos.relax_if_quiet(Instant::now());
    }
}

/// Reads until every ring made is read (the fault thread's last act): a thread that rang
/// waits until its ring is read (the region's drop among them). Other messages no longer
/// matter.
fn read_unread_rings(sh: &Shared) {
    if sh.fault.bell.rings_unread() == 0 || sh.uffd.set_blocking(true).is_err() {
        return;
    }
    let mut msgs = [Msg::default(); 16];
    while sh.fault.bell.rings_unread() > 0 {
        let Ok(n) = sh.uffd.read_waiting(&mut msgs) else {
            return;
        };
        for m in &msgs[..n] {
            if m.event == userfaultfd::EVENT_REMOVE {
                sh.fault.bell.is_ring(m.arg[0], m.arg[1]);
            }
        }
    }
}

/// What the fault thread's reads fill: the messages read, the faults and moves waiting to
/// be served, and the following of the threads that fault.
struct Inbox<'a> {
    msgs: [Msg; 64],
    faults: VecDeque<Fault>,
    remaps: Vec<Remap>,
    follow: Follow<'a>,
}

impl Inbox<'_> {
    /// Reads every waiting message, the caller holding `gate` (write): faults join the
    /// queue, the program's changes to its address space are handled at once. How many
    /// were read; `None` once the descriptor is gone (the region is being dropped).
    fn read(&mut self, sh: &Shared) -> Option<usize> {
        let mut read = 0;
        loop {
            let n = match sh.uffd.read(&mut self.msgs) {
                Ok(n) => n,
                Err(e) => {
                    sh.note_error(format!("reading the userfaultfd: {e}"));
                    if e.raw_os_error() == Some(libc::EBADF) {
                        return None;
                    }
                    0
                }
            };
            self.handle(sh, n);
            read += n;
            if n < self.msgs.len() {
                return Some(read);
            }
        }
    }

    /// Handles the first `n` messages read, the caller holding `gate` (write): faults join
    /// the queue, the program's changes to its address space are handled at once, rings
    /// are taken as read.
    fn handle(&mut self, sh: &Shared, n: usize) {
        for m in self.msgs[..n].iter().copied() {
            match m.event {
                userfaultfd::EVENT_PAGEFAULT => {
                    self.follow.fault(m.arg[2]);
                    self.faults.push_back(Fault {
                        addr: m.arg[1] & !(sh.page_size as u64 - 1),
                        write: m.arg[0] & userfaultfd::PAGEFAULT_FLAG_WRITE != 0,
                        wp: m.arg[0] & userfaultfd::PAGEFAULT_FLAG_WP != 0,
                        read_at: Instant::now(),
                    })
                }
                userfaultfd::EVENT_REMOVE if sh.fault.bell.is_ring(m.arg[0], m.arg[1]) => {}
                userfaultfd::EVENT_REMOVE => sh.on_remove(m.arg[0], m.arg[1]),
                userfaultfd::EVENT_UNMAP => sh.on_unmap(m.arg[0], m.arg[1]),
                userfaultfd::EVENT_REMAP => {
                    if let Some(r) = sh.on_remap(m.arg[0], m.arg[1], m.arg[2]) {
                        self.remaps.push(r);
                    }
                }
                _ => {}
            }
        }
    }
}

impl Shared {
    /// Serves one fault.
    fn serve(&self, f: Fault, buf: &mut [u8], zeros: &[u8], around: &mut Around) -> Served {
        let Some(page) = self.page_of(f.addr) else {
            // A page moved out by an mremap whose copies are still under way: the copy (or
            // the unregistering after it) wakes it; waking it now lets it retry meanwhile. A
            // clean page moved out is the program's own now: its protection goes.
            if f.wp {
                let _ = self.uffd.writeprotect(f.addr, self.page_size as u64, false);
            }
            self.uffd.wake(f.addr, self.page_size as u64);
            return Served::Done;
        };
        if !f.wp {
            // A missing page is most often a stored one: its slot's miss overlaps the
            // lock's and the state's.
            self.device.prefetch(page);
        }
        let _lock = self.table.lock(page);
        let state = self.table.state(page);
        let present = matches!(state.kind(), Kind::Resident | Kind::Gone);
        if f.wp && present {
            return self.serve_first_write(page, state, around);
        }
        if !f.wp && state.is(Kind::Resident) {
            return self.serve_missing_resident(page, state, around);
        }
        if present {
            self.count(Count::SpuriousFaults, 1);
            around.woke_at = Some(Instant::now());
            self.uffd.wake(f.addr, self.page_size as u64);
            return Served::Done;
        }
        if self.over_budget_hard() {
            self.count(Count::BudgetHeld, 1);
            return Served::Later;
        }
        let addr = self.page_addr(page);
        if state.is(Kind::Stored) {
            let how = if f.write || !self.fault.clean_pages {
                BringIn::Dirty
            } else if self.frees_copies() {
                BringIn::DirtyStoreFull
            } else {
                BringIn::Clean
            };
            return self.serve_stored(page, buf, around, how);
        }
        if state.is(Kind::Empty) && state.zeroed() && !f.write {
            return self.serve_zeroed(page, state, around);
        }
        let held = if state.is(Kind::Held) {
            self.table.take_held(page)
        } else {
            None
        };
        // In before the copy, which lets the faulting thread run on: what it reads of the
        // region's figures then includes its own fault. Taken back if the copy fails.
        let source = if state.is(Kind::Held) {
            FaultIn::Held
        } else {
            FaultIn::Zeros
        };
        self.count_fault_in(source);
        self.drop_stored(page, state);
        let faulted_in = PageState::resident(true, false);
        self.table.leave(page, state, faulted_in);
        around.woke_at = Some(Instant::now());
        let outcome: Outcome = match &held {
            Some(copy) => self.uffd.copy(addr, copy),
            // An unmapped page faults only if it is still mapped (MREMAP_DONTUNMAP): empty.
            _ if f.write => self.uffd.copy(addr, zeros),
            _ => self.uffd.zeropage(addr, self.page_size as u64),
        };
        match outcome {
            Ok(()) => {
                if state.zeroed() {
                    self.count(Count::ZeroRefaults, 1);
                }
                Served::Done
            }
            Err(libc::EEXIST) => {
                // Present already: what the program sees is that page; the copy is stale.
                // Nothing came in: a spurious fault, not a refault.
                self.take_back_fault_in(source);
                self.count(Count::SpuriousFaults, 1);
                self.uffd.wake(addr, self.page_size as u64);
                Served::Done
            }
            Err(e) => {
                self.take_back_fault_in(source);
                if let Some(copy) = held {
                    self.table.hold(page, copy);
                }
                self.table.leave(page, faulted_in, state);
                match e {
                    libc::EAGAIN => Served::Later,
                    // ENOENT: the mapping went (its unmap event is on its way); ESRCH: the
                    // process is exiting.
                    _ => Served::Done,
                }
            }
        }
    }

    /// A missing page's fault on a page the table holds resident (locked by the caller). Most
    /// often spurious: the page came in after the fault was raised, and the zero page mapped
    /// here finds it (`EEXIST`): the thread is woken. But the program may have dropped the
    /// page while another of its threads touched it: a fault served after the drop's event
    /// was read and before the kernel's zap maps zeros that the zap removes (lib.rs, "The
    /// program's `MADV_DONTNEED`"). Zeros are what the program reads there now, so the zero
    /// page is mapped again (a write then copies it in the kernel, as any write to the zero
    /// page does: a spurious write fault is not made to allocate a page first); the page is
    /// unprotected (dirty), its stored copy, if any, stale. Counted (`vanished_pages`), as a
    /// page an eviction finds gone is.
    fn serve_missing_resident(&self, page: u64, state: PageState, around: &mut Around) -> Served {
        let (addr, ps) = (self.page_addr(page), self.page_size as u64);
        // In before the map, as every fault-in is; taken back unless it maps.
        self.count_fault_in(FaultIn::Zeros);
        around.woke_at = Some(Instant::now());
        let outcome = self.uffd.zeropage(addr, ps);
        if outcome.is_err() {
            self.take_back_fault_in(FaultIn::Zeros);
        }
        match outcome {
            Ok(()) => {
                self.count(Count::Vanished, 1);
                self.drop_stored(page, state);
                self.table
                    .leave(page, state, PageState::resident(true, false));
                Served::Done
            }
            Err(libc::EAGAIN) => Served::Later,
            Err(e) => {
                if e == libc::EEXIST {
                    self.count(Count::SpuriousFaults, 1);
                }
                // EEXIST: the page is there, and the ioctl woke no one. ENOENT (the mapping
                // went, its unmap event on its way), ESRCH (the process is exiting): waking
                // lets the thread retry meanwhile, as for a page moved out (`serve`).
                self.uffd.wake(addr, ps);
                Served::Done
            }
        }
    }

    /// The program's first write to a clean page since it came in (locked by the caller,
    /// which it holds across both steps): its copy in the store is discarded, then its
    /// protection lifted, which wakes the writer. Until then the writer waits, so no
    /// evictor can have decided the page was clean after the write was made.
    fn serve_first_write(&self, page: u64, state: PageState, around: &mut Around) -> Served {
        let ps = self.page_size as u64;
        self.count(Count::FirstWrites, 1);
        if state.clean() {
            self.drop_stored(page, state);
            self.table.leave(page, state, state.dirtied());
        }
        around.woke_at = Some(Instant::now());
        match self.uffd.writeprotect(self.page_addr(page), ps, false) {
            Ok(()) => Served::Done,
            // The page stays dirty (no copy), still protected: lifted on the next try.
            Err(libc::EAGAIN) => Served::Later,
            Err(_) => {
                self.uffd.wake(self.page_addr(page), ps);
                Served::Done
            }
        }
    }

    /// Whether faults that bring a page in wait for the reclaim thread.
    fn over_budget_hard(&self) -> bool {
        self.table.resident() > self.fault_hold_above() && !self.evictors.stuck.load(Relaxed)
    }

    /// The region pages wholly or partly in `[start, end)`.
    fn pages_in(&self, start: u64, end: u64) -> std::ops::Range<u64> {
        let base = self.memory.addr();
        let top = base + self.memory.len() as u64;
        let (s, e) = (start.max(base), end.min(top));
        if s >= e {
            return 0..0;
        }
        let ps = self.page_size as u64;
        (s - base) / ps..(e - base).div_ceil(ps)
    }

    /// The program dropped `[start, end)` (`MADV_DONTNEED`/`MADV_FREE`; the kernel zaps it
    /// once this event is read): those pages read as zeros from now on.
    fn on_remove(&self, start: u64, end: u64) {
        // The pad's own drops (the evictors') carry nothing to forget.
        let n = self.forget(self.pages_in(start, end), PageState::EMPTY);
        self.count(Count::Removed, n);
    }

    /// The program unmapped `[start, end)`.
    fn on_unmap(&self, start: u64, end: u64) {
        let n = self.forget(self.pages_in(start, end), PageState::UNMAPPED);
        self.count(Count::Unmapped, n);
    }

    /// Sets `pages` to `to`, dropping their stored copies (with larger units, the units no
    /// page needs any more); how many held anything.
    fn forget(&self, pages: std::ops::Range<u64>, to: PageState) -> u64 {
        let mut n = 0;
        for page in pages.clone() {
            let _lock = self.table.lock(page);
            let state = self.table.state(page);
            if !matches!(state.kind(), Kind::Empty | Kind::Unmapped | Kind::Gone) {
                n += 1;
            }
            self.drop_stored(page, state);
            self.table.leave(page, state, to);
        }
        self.discard_unused_units(pages, false);
        n
    }

    /// The program moved `[from, from + len)` to `to`. The pages that were out are read
    /// back, to be copied to their new place; the pages now at `to` stop being the
    /// region's.
    fn on_remap(&self, from: u64, to: u64, len: u64) -> Option<Remap> {
        let mut copies = Vec::new();
        let mut moved = 0;
        for page in self.pages_in(from, from + len) {
            let _lock = self.table.lock(page);
            let state = self.table.state(page);
            let dst = to + (self.page_addr(page) - from);
            match state.kind() {
                Kind::Stored => {
                    let mut copy = vec![0u8; self.page_size].into_boxed_slice();
                    match self.device.read_page(page, &mut copy) {
                        Ok(()) => copies.push((dst, copy)),
                        Err(e) => self.note_error(format!("page {page}: {e}")),
                    }
                }
                Kind::Held => {
                    if let Some(copy) = self.table.take_held(page) {
                        copies.push((dst, copy));
                    }
                }
                _ => {}
            }
            if !state.is(Kind::Empty) {
                moved += 1;
            }
            self.drop_stored(page, state);
            // With MREMAP_DONTUNMAP the old range stays, empty and registered: a fault
            // there finds it empty.
            self.table.leave(page, state, PageState::UNMAPPED);
        }
        self.discard_unused_units(self.pages_in(from, from + len), false);
        self.count(Count::Remapped, moved);
        // Region pages the move landed on are the program's own memory from now on.
        self.forget(self.pages_in(to, to + len), PageState::GONE);
        let r = Remap { to, len, copies };
        Some(r)
    }

    /// Copies what it can of a remap's pages; true once all are done and the new range is
    /// unregistered.
    fn continue_remap(&self, r: &mut Remap) -> bool {
        while let Some((dst, copy)) = r.copies.last() {
            if let Err(libc::EAGAIN) = self.uffd.copy(*dst, copy) {
                return false;
            }
            // Done, or the page is there already, or the range went again: nothing to keep.
            r.copies.pop();
        }
        // Fails only if the range went meanwhile, leaving nothing registered there.
        let _ = self.uffd.unregister(r.to, r.len);
        true
    }
}
