//! Where the fault thread runs. A fault's round trip is two wake-ups: the faulting thread's
//! of the fault thread, and the copy's of the faulting thread. On one CPU each is a context
//! switch; across two, on a machine whose idle CPUs halt (a VM's vCPUs), each is an
//! interrupt into a halted CPU, which costs the trip many times over. The scheduler sends
//! a woken thread to an idle CPU whenever its own is busy, and the faulting thread's CPU
//! is busy at the moment the copy wakes it: the fault thread is on it, issuing the copy.
//! So the two drift apart and stay apart; a sequential fault-in then runs far below its
//! speed (docs/diary.md, 2026-11-26, has the figures).
//!
//! Two things keep them together:
//! - **Following**: at most every [`LOOK_EVERY`], the fault thread reads which CPU the
//!   thread whose fault it just read last ran on (its `/proc/self/task/TID/stat`, kept
//!   open) and moves there, when it next has nothing in hand (or on a fault's path once the
//!   look is [`LOOK_OVERDUE`]); at idle priority also at once after a turn of serving faults
//!   that says the two are apart: a copy's wake-up of a faulting thread on this CPU takes
//!   the CPU from the fault thread until that thread blocks again, usually on its next
//!   fault, so the fault thread's first read after a turn of single-page faults finds it in
//!   (no system call more than the read that serves it); where a fault brought neighbours
//!   in, so that the faulting thread ran on meanwhile wherever it runs, `getrusage`'s count
//!   of involuntary switches across the first copy says instead.
//! - **Idle priority** (`SCHED_IDLE`), while a single thread faults: the scheduler counts a
//!   CPU that runs only idle-priority threads as idle when it places a woken thread, so the
//!   faulting thread, woken by the copy, stays on the fault thread's CPU and takes it over at
//!   once. The fault thread is then pinned to that CPU (following moves the pin), and the
//!   evictors keep off it while faults come (an evictor's batch compresses for a millisecond
//!   or so, and would take the CPU from it), where the process has another CPU.
//!
//! **Only while faults come densely.** The copy's wake-up leaves the pinned fault thread
//! runnable behind the faulting thread until that thread's next fault. Where the program
//! runs milliseconds between faults, an idle CPU's load balancing finds the pinned thread
//! waiting there, cannot pull it, and pushes the program's running thread across instead
//! (the stopper's active balance), and the fault thread then follows it: on the lookup
//! workload at 97 % (about 270 faults a second) the program's thread changed CPU 37 times a
//! second, each time onto cold caches, the stopper's pushes 40-55 a second in most seconds;
//! a process's moves fell from about 800 to under 50 with load balancing off
//! (docs/diary.md, 2026-12-02). So at idle priority, while the faults' mean gap is over
//! [`SPARSE_GAP`], the fault thread neither pins itself nor follows: its affinity is every
//! CPU it may use, and an idle CPU pulls it rather than push the program. A fault then
//! costs a trip across CPUs: while the CPU latency request holds (faults under 10 ms apart,
//! cpu_latency_qos.rs), about 5-7 µs more to the program than on one CPU on this project's
//! VM; where it does not (sparser faults, or a process that may not open
//! `/dev/cpu_dma_latency`) and idle CPUs halt, the wake-ups into a halted CPU (about 80 µs
//! a round trip there), which a pinned fault thread on the program's CPU would not have paid
//! (not measured against the pushes it would have caused).
//!
//! Idle priority starves beside any busy thread of normal priority, and a fault waits for
//! it. So faults from a second thread end it at the next look (and it is not tried again for
//! [`MIXED_BACKOFF`]), and a **guard thread**, which waits for nothing the fault thread does,
//! ends it when a look finds faults waiting (a message unread, or, while the descriptor is
//! blocking because faults come (bell.rs), a fault unread; or faults read and not yet
//! served) and they then wait [`STARVED_AFTER`] with no progress of the fault thread (it
//! looks every [`GUARD_EVERY`], so a starvation ends within about 52 ms): the fault thread
//! goes back to normal priority, free to run on any CPU it could at the start, and idle
//! priority is tried again after a back-off (0.1 s, doubling to 5 s, back to 0.1 s after a
//! minute without one). A second with no fault ends it too (nothing to keep together; the
//! guard stops waking).
//! Leaving idle priority needs `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20 (sched(7)): a probe
//! thread tries both ways when the region is made, and without them the fault thread only
//! follows, at normal priority. Should leaving ever fail later (the process gave up the
//! capability), idle priority is not used again.
//!
//! Invariants: `mode` says whether the fault thread runs at idle priority; only the fault
//! thread sets it to `IDLE` (before its own change of policy, which it undoes if the mode
//! was ended meanwhile), and whoever takes it from
//! `IDLE` to `NORMAL` with a compare-and-swap (the fault thread or the guard) makes the change
//! of policy and affinity back, so each change back is made once. `DONE` (the fault thread has
//! ended) is never left: the guard never acts on a thread id that may be reused. No locks but
//! the guard's own sleep (`nap`, a leaf). `pinned` names a CPU only while the fault thread's
//! affinity is that CPU alone (stored after the pin, cleared after the affinity is set
//! back, so stale for a moment either way).
//!
//! The scheduler's calls themselves (policy, affinity, the current CPU, preemptions) are
//! `ztier_base::sched`'s; this module decides when to make them.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, AtomicUsize};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use ztier_base::sched::{self, lower_to_idle_priority, CpuSet, Policy, ThreadId};

/// How often, at most, the fault thread looks where the faulting thread runs. A look is
/// one `pread` of a stat file: cheap, but a system call, so not one on every fault.
const LOOK_EVERY: Duration = Duration::from_micros(250);

/// The faults' mean gap (an average over about the last eight) over which the fault thread
/// is not pinned to the faulting thread's CPU: a program that runs this long between
/// faults gives an idle CPU's load balancing time to find the fault thread waiting behind
/// it. A dense run of faults (a sequential fault-in: microseconds apart) stays pinned.
/// Chosen between the two measured cases (microseconds, and the lookups' 3.7 ms), not
/// measured between them.
const SPARSE_GAP: Duration = Duration::from_millis(1);

/// The most a single gap counts in the mean: a pause in a dense run of faults (a pass of
/// evictions, a turn of another thread) moves it by at most half a millisecond, so it takes
/// three long gaps in a row to leave the pin.
const GAP_COUNTED: Duration = Duration::from_millis(4);

/// How long a look a fault found due may wait for a moment when the fault thread has
/// nothing in hand ([`Follow::look_if_due`]) before the next fault makes it on its path: a
/// look made on faults' paths shows in the p50 of a workload's single-page faults
/// (docs/diary.md, "A fault thread parked in its read").
const LOOK_OVERDUE: Duration = Duration::from_millis(2);

/// How long faults may wait with no progress of the fault thread, at idle priority, before
/// the guard ends idle priority.
const STARVED_AFTER: Duration = Duration::from_millis(2);

/// The guard's look: every [`GUARD_EVERY`], and every [`GUARD_CONFIRM`] after a look that
/// found faults waiting, until the fault thread makes any progress (a turn of its loop
/// counts) or [`STARVED_AFTER`] has passed without; so a starvation is ended within about
/// `GUARD_EVERY + STARVED_AFTER`, and a fault thread that gets the CPU now and then only
/// when those 2 ms after a look hold no turn of it. Each look wakes a thread of normal
/// priority, and the scheduler sends the faulting thread to the other CPU at some of those
/// moments, so the rarer the looks, the fewer the separations (docs/diary.md,
/// 2026-11-27, counts them for looks every 1, 20 and 50 ms).
const GUARD_EVERY: Duration = Duration::from_millis(50);
const GUARD_CONFIRM: Duration = Duration::from_millis(1);

/// Idle priority ends after this long with no fault.
const IDLE_ENDS_AFTER: Duration = Duration::from_secs(1);

/// Faults are coming if one was read this recently: the evictors keep off the pinned CPU.
const FAULTS_RECENT: Duration = Duration::from_millis(10);

/// Idle priority is not tried again for this long after faults from several threads.
const MIXED_BACKOFF: Duration = Duration::from_millis(100);

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest the fault thread waits, after idle priority was ended, before trying it
/// again at a fault.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A minute without a demotion starts the back-off afresh.
const BACKOFF_FORGOTTEN: Duration = Duration::from_secs(60);

const NORMAL: u8 = 0;
const IDLE: u8 = 1;
const DONE: u8 = 2;
const NOT_PINNED: usize = usize::MAX;

/// What the fault thread, its guard and the evictors share.
pub(crate) struct Placement {
    /// Whether idle priority is used at all: asked for, and leaving it allowed.
    allowed: AtomicBool,
    /// The fault thread's id (0 until it starts).
    tid: AtomicI32,
    /// The CPUs the fault thread could run on when it started: where it may run again when
    /// it leaves idle priority.
    cpus: OnceLock<Vec<usize>>,
    /// `NORMAL`, `IDLE` or `DONE`.
    mode: AtomicU8,
    /// The CPU the fault thread is pinned to at idle priority (`NOT_PINNED`: none).
    pinned: AtomicUsize,
    /// The fault thread's progress: turns of its loop and faults served.
    progress: AtomicU64,
    /// Whether the fault thread has faults read and not yet served.
    holding: AtomicBool,
    /// When, in ns since `epoch`, the fault thread last read a fault.
    last_fault: AtomicU64,
    /// Not at idle priority before then (ns since `epoch`).
    retry_at: AtomicU64,
    epoch: Instant,
    demotions: AtomicU64,
    /// How often the fault thread moved to follow a faulting thread to another CPU.
    moves: AtomicU64,
    /// The guard's sleep, and its wake-up (the fault thread entering idle priority, the
    /// region's drop).
    nap: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

impl Placement {
    /// `wanted`: [`crate::RegionConfig::idle_priority`]; idle priority is used if it is
    /// wanted and this process may leave it again.
    pub(crate) fn new(wanted: bool) -> Placement {
        Placement {
            allowed: AtomicBool::new(wanted && may_leave_idle_priority()),
            tid: AtomicI32::new(0),
            cpus: OnceLock::new(),
            mode: AtomicU8::new(NORMAL),
            pinned: AtomicUsize::new(NOT_PINNED),
            progress: AtomicU64::new(0),
            holding: AtomicBool::new(false),
            last_fault: AtomicU64::new(0),
            retry_at: AtomicU64::new(0),
            epoch: Instant::now(),
            demotions: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            nap: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        }
    }

    /// Whether idle priority may be used (asked for, and the process may leave it).
    pub(crate) fn usable(&self) -> bool {
        self.allowed.load(Relaxed)
    }

    /// Whether the fault thread runs at idle priority now.
    pub(crate) fn idle(&self) -> bool {
        self.mode.load(Acquire) == IDLE
    }

    /// How often the guard ended idle priority because faults waited.
    pub(crate) fn demotions(&self) -> u64 {
        self.demotions.load(Relaxed)
    }

    /// How often the fault thread moved to another CPU, following a faulting thread.
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Relaxed)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn since(&self, at: &AtomicU64) -> Duration {
        Duration::from_nanos(self.now().saturating_sub(at.load(Relaxed)))
    }

    /// A turn of the fault thread's loop, or a fault served.
    pub(crate) fn progress(&self) {
        self.progress.fetch_add(1, Relaxed);
    }

    /// Whether the fault thread runs at idle priority.
    pub(crate) fn at_idle_priority(&self) -> bool {
        self.mode.load(Relaxed) == IDLE
    }

    /// Whether the fault thread holds faults read and not yet served.
    pub(crate) fn holding(&self, faults: bool) {
        self.holding.store(faults, Relaxed);
    }

    /// Takes the fault thread from idle priority back to normal, free to run where it
    /// could at the start, if it is at idle priority and no one else has done it; whether
    /// this call did. `tid` 0: the calling thread (the fault thread itself).
    fn end_idle(&self, tid: i32) -> bool {
        if self
            .mode
            .compare_exchange(IDLE, NORMAL, AcqRel, Acquire)
            .is_err()
        {
            return false;
        }
        if !set_normal_priority(tid) {
            // The process can no longer leave idle priority: not used again (this thread
            // stays at it, the guard's look never passes NORMAL).
            self.allowed.store(false, Relaxed);
        }
        if let Some(cpus) = self.cpus.get() {
            set_affinity(tid, cpus);
        }
        self.pinned.store(NOT_PINNED, Relaxed);
        true
    }

    /// The fault thread has ended: its id is not acted on again.
    pub(crate) fn done(&self) {
        self.mode.store(DONE, Release);
    }

    /// Ends the guard thread, and idle priority for good: the region is being dropped, and
    /// its drop waits for the fault thread (the evictors' last events, its own end).
    pub(crate) fn stop(&self) {
        self.allowed.store(false, Relaxed);
        self.end_idle(self.tid.load(Relaxed));
        let _nap = self.nap.lock();
        self.stop.store(true, Relaxed);
        self.wake.notify_all();
    }

    /// The guard thread: `unread` says whether a message waits in the userfaultfd.
    pub(crate) fn run_guard(&self, unread: impl Fn() -> bool) {
        let mut backoff = FIRST_BACKOFF;
        let mut last_demotion: Option<Instant> = None;
        // Faults found waiting, since when, and the fault thread's progress then.
        let mut waiting: Option<(Instant, u64)> = None;
        // Off the fault thread's CPU too: there a CPU running only the fault thread counts
        // as idle, so this thread's wake-ups would land on it and take it from a fault.
        let mut keep_off = KeepOff::start(self);
        loop {
            keep_off.settle();
            {
                let mut nap = self.nap.lock();
                if self.stop.load(Relaxed) {
                    return;
                }
                if self.mode.load(Acquire) != IDLE {
                    // Woken when the fault thread enters idle priority, or by `stop` (both
                    // under `nap`, so neither is lost).
                    self.wake.wait(&mut nap);
                } else {
                    let sleep = if waiting.is_some() {
                        GUARD_CONFIRM
                    } else {
                        GUARD_EVERY
                    };
                    self.wake.wait_for(&mut nap, sleep);
                }
                if self.stop.load(Relaxed) {
                    return;
                }
            }
            if self.mode.load(Acquire) != IDLE {
                waiting = None;
                continue;
            }
            let progress = self.progress.load(Relaxed);
            if !(self.holding.load(Relaxed) || unread()) {
                waiting = None;
                if self.since(&self.last_fault) >= IDLE_ENDS_AFTER {
                    let tid = self.tid.load(Relaxed);
                    self.end_idle(tid);
                }
                continue;
            }
            match waiting {
                Some((since, seen)) if seen == progress => {
                    if since.elapsed() >= STARVED_AFTER {
                        let tid = self.tid.load(Relaxed);
                        if last_demotion.is_some_and(|t| t.elapsed() >= BACKOFF_FORGOTTEN) {
                            backoff = FIRST_BACKOFF;
                        }
                        // Before the change back: a fault thread that gets the CPU between
                        // the two must not enter idle priority again at once.
                        self.retry_at
                            .fetch_max(self.now() + backoff.as_nanos() as u64, Relaxed);
                        if self.end_idle(tid) {
                            backoff = (backoff * 2).min(MAX_BACKOFF);
                            last_demotion = Some(Instant::now());
                            self.demotions.fetch_add(1, Relaxed);
                        }
                        waiting = None;
                    }
                }
                // The fault thread moved on since faults were seen waiting: back to the
                // long look.
                Some(_) => waiting = None,
                None => waiting = Some((Instant::now(), progress)),
            }
        }
    }
}

/// An evictor's side: it keeps off the CPU the fault thread is pinned to at idle priority
/// while faults come. Made on the evictor's thread.
pub(crate) struct KeepOff<'a> {
    placement: &'a Placement,
    /// The CPU this thread keeps off now, if any.
    off: Option<usize>,
    /// The CPUs this thread could run on when it started.
    cpus: Vec<usize>,
}

impl<'a> KeepOff<'a> {
    pub(crate) fn start(placement: &'a Placement) -> KeepOff<'a> {
        KeepOff {
            placement,
            off: None,
            cpus: allowed_cpus(),
        }
    }

    /// Before a batch: off the fault thread's CPU while it is pinned at idle priority and
    /// faults are coming (if another CPU is left), back on it once not: an eviction pass
    /// with no faults uses every CPU.
    pub(crate) fn settle(&mut self) {
        let p = self.placement;
        let pinned = p.pinned.load(Relaxed);
        let want = (pinned != NOT_PINNED
            && p.since(&p.last_fault) < FAULTS_RECENT
            && self.cpus.iter().any(|&c| c != pinned))
        .then_some(pinned);
        if want == self.off {
            return;
        }
        let cpus: Vec<usize> = match want {
            Some(cpu) => self.cpus.iter().copied().filter(|&c| c != cpu).collect(),
            None => self.cpus.clone(),
        };
        if set_affinity(0, &cpus) {
            self.off = want;
        }
    }
}

/// The fault thread's side: follows the faulting threads and enters and leaves idle
/// priority. Made on the fault thread.
pub(crate) struct Follow<'a> {
    placement: &'a Placement,
    last_look: Option<Instant>,
    /// The thread whose fault came last, and whether faults since the last look came from
    /// more than one thread.
    last_tid: u64,
    mixed: bool,
    /// The CPU this thread pinned itself to at idle priority.
    pinned: Option<usize>,
    /// The stat file of the thread last looked at, by its id.
    stat: Option<(u64, File)>,
    /// Whether the last look made after serving found nowhere to go (the thread on this
    /// CPU after all, or on one this thread may not run on): the next waits for
    /// [`LOOK_EVERY`], as a look for a fault does.
    fruitless: bool,
    /// A fault found a look due, left for [`look_if_due`](Follow::look_if_due).
    look_due: bool,
    /// The mean gap between faults (ns, an exponential average with weight 1/8, from the
    /// placement's `last_fault`): sparse faults leave this thread unpinned.
    mean_gap_ns: u64,
}

impl<'a> Follow<'a> {
    pub(crate) fn start(placement: &'a Placement) -> Follow<'a> {
        placement.tid.store(ThreadId::current().as_raw(), Relaxed);
        let _ = placement.cpus.set(allowed_cpus());
        // A real-time (or batch) fault thread keeps its policy: idle priority would end at
        // normal priority, not at its own.
        if !normal_policy() {
            placement.allowed.store(false, Relaxed);
        }
        Follow {
            placement,
            last_look: None,
            last_tid: 0,
            mixed: false,
            pinned: None,
            stat: None,
            fruitless: false,
            look_due: false,
            mean_gap_ns: 0,
        }
    }

    /// Whether faults come too far apart for pinning to pay ([`SPARSE_GAP`]).
    fn sparse(&self) -> bool {
        self.mean_gap_ns > SPARSE_GAP.as_nanos() as u64
    }

    /// Unpinned, wherever the scheduler puts it (the module header, "Only while faults come
    /// densely"): the affinity back to every CPU this thread could use, if pinned.
    fn float(&mut self) {
        if self.pinned.take().is_some() {
            let p = self.placement;
            set_affinity(0, p.cpus.get().map_or(&[][..], Vec::as_slice));
            p.pinned.store(NOT_PINNED, Relaxed);
        }
    }

    /// A sign, after a turn of the fault thread's loop that served faults, that the
    /// faulting thread was woken on another CPU: at idle priority, a copy's wake-up of a
    /// faulting thread on this CPU takes the CPU from this thread until that thread blocks
    /// again, usually on its next fault. So the first read after a turn of single-page
    /// faults finds nothing in, or, where a fault brought neighbours in (the faulting thread
    /// running on meanwhile, wherever it runs), the copy of the faulting page did not take
    /// this thread's CPU. This thread looks where the faulting thread runs and follows it
    /// now, before its next fault, rather than within [`LOOK_EVERY`] (every fault while the
    /// two are apart pays two wake-ups across CPUs, the module header's cost). A look that
    /// finds the two together (the faulting thread blocked on something else, or ran on
    /// beside this thread given a slice) is not repeated within [`LOOK_EVERY`].
    pub(crate) fn maybe_apart(&mut self) {
        // Faults far apart are not followed (the module header).
        if self.placement.mode.load(Relaxed) != IDLE || self.sparse() {
            return;
        }
        let due = !self.fruitless || self.last_look.is_none_or(|t| t.elapsed() >= LOOK_EVERY);
        if self.last_tid != 0 && due {
            self.fruitless = !self.look(self.last_tid);
        }
    }

    /// A fault read from thread `tid` (0 if the kernel did not say). A look it finds due
    /// is left for the next moment this thread has nothing in hand, unless it has been due
    /// for [`LOOK_OVERDUE`] (or none was ever made): then it is made now, on the fault's path.
    pub(crate) fn fault(&mut self, tid: u64) {
        let p = self.placement;
        let now = p.now();
        // Only this thread writes `last_fault`: the value it replaces is the last fault's
        // (0 before the first).
        let last = p.last_fault.swap(now, Relaxed);
        p.holding.store(true, Relaxed);
        if last != 0 {
            let gap = now.saturating_sub(last).min(GAP_COUNTED.as_nanos() as u64);
            self.mean_gap_ns = self.mean_gap_ns - self.mean_gap_ns / 8 + gap / 8;
        }
        if tid == 0 {
            return;
        }
        if self.last_tid != 0 && tid != self.last_tid {
            self.mixed = true;
        }
        self.last_tid = tid;
        match self.last_look.map(|t| t.elapsed()) {
            Some(since) if since < LOOK_EVERY => {}
            Some(since) if since < LOOK_OVERDUE => self.look_due = true,
            _ => {
                self.look(tid);
            }
        }
    }

    /// The look a fault found due, if any (the fault thread's call when its read after
    /// serving found nothing: nothing in hand, and the faulting thread not faulting yet).
    pub(crate) fn look_if_due(&mut self) {
        if self.look_due && self.last_tid != 0 {
            self.look(self.last_tid);
        }
    }

    /// Looks where thread `tid` runs, and follows it there (entering or leaving idle
    /// priority as the faults since the last look allow; at idle priority with faults far
    /// apart, unpinned instead, and no look); whether this thread moved to another CPU.
    fn look(&mut self, tid: u64) -> bool {
        let p = self.placement;
        self.last_look = Some(Instant::now());
        self.look_due = false;
        let mixed = std::mem::take(&mut self.mixed);
        if !mixed && p.mode.load(Acquire) == IDLE && self.sparse() {
            // Floating: nowhere to follow to, so no stat to read.
            self.float();
            return false;
        }
        let Some(cpu) = self.cpu_of(tid) else {
            return false;
        };
        if p.allowed.load(Relaxed) {
            if mixed {
                p.retry_at
                    .fetch_max(p.now() + MIXED_BACKOFF.as_nanos() as u64, Relaxed);
                p.end_idle(0);
            } else if p.now() >= p.retry_at.load(Relaxed)
                && p.mode
                    .compare_exchange(NORMAL, IDLE, AcqRel, Acquire)
                    .is_ok()
            {
                // Entering idle priority, this thread is not pinned (whoever ended it last
                // set the affinity back): the look below pins it.
                self.pinned = None;
                // IDLE before the change, so that the guard watches from the moment this
                // thread can be starved; should the guard have ended it meanwhile (its change
                // back may have come first), back to normal here.
                if !lower_to_idle_priority() {
                    let _ = p.mode.compare_exchange(IDLE, NORMAL, AcqRel, Acquire);
                } else if p.mode.load(Acquire) != IDLE {
                    set_normal_priority(0);
                }
                // The guard to its short naps.
                let _nap = p.nap.lock();
                p.wake.notify_all();
            }
        }
        let cpus = p.cpus.get().map_or(&[][..], Vec::as_slice);
        if p.mode.load(Acquire) == IDLE && self.sparse() {
            // Just entered idle priority, faults far apart.
            self.float();
            return false;
        }
        if p.mode.load(Acquire) == IDLE {
            // Pinned there already: nothing to do (`self.pinned` is reset on every entry to
            // idle priority, after whoever ended it last set the affinity back).
            if self.pinned == Some(cpu) || !cpus.contains(&cpu) {
                return false;
            }
            let moved = current_cpu() != Some(cpu);
            if pin_to_cpu(cpu) {
                if moved {
                    p.moves.fetch_add(1, Relaxed);
                }
                self.pinned = Some(cpu);
                p.pinned.store(cpu, Relaxed);
                if p.mode.load(Acquire) != IDLE {
                    // Ended meanwhile by the guard, which may have set the affinity back
                    // before this pin: set it back again.
                    set_affinity(0, cpus);
                    self.pinned = None;
                    p.pinned.store(NOT_PINNED, Relaxed);
                }
                return moved;
            }
            return false;
        }
        // At normal priority: whoever ended idle priority set the affinity back.
        self.pinned = None;
        let moved = current_cpu() != Some(cpu) && move_to_cpu(cpu);
        if moved {
            p.moves.fetch_add(1, Relaxed);
        }
        moved
    }

    /// The CPU thread `tid` of this process last ran on (field 39 of its stat).
    fn cpu_of(&mut self, tid: u64) -> Option<usize> {
        if self.stat.as_ref().is_none_or(|(t, _)| *t != tid) {
            self.stat = None;
            let file = File::open(format!("/proc/self/task/{tid}/stat")).ok()?;
            self.stat = Some((tid, file));
        }
        let (_, file) = self.stat.as_ref()?;
        // A stat line is well under 1 KiB (52 numeric fields and a 16-byte name).
        let mut line = [0u8; 1024];
        let cpu = file
            .read_at(&mut line, 0)
            .ok()
            .and_then(|n| stat_cpu(&line[..n]));
        if cpu.is_none() {
            // The thread has exited (its id may come back as another's): opened afresh
            // next time.
            self.stat = None;
        }
        cpu
    }
}

/// The calling thread's involuntary context switches so far (0 if unknown).
pub(crate) fn involuntary_switches() -> u64 {
    sched::involuntary_switches().unwrap_or(0)
}

/// Field 39 (the CPU last run on) of a /proc/PID/stat line.
fn stat_cpu(line: &[u8]) -> Option<usize> {
    // The command name (field 2) may hold spaces and parentheses; the fields after its last
    // ')' are plain.
    let close = line.iter().rposition(|&b| b == b')')?;
    let field = line.get(close + 2..)?.split(|&b| b == b' ').nth(39 - 3)?;
    std::str::from_utf8(field).ok()?.parse().ok()
}

/// Whether a thread of this process may go from idle priority back to normal: tried on a
/// thread of its own, which ends either way.
fn may_leave_idle_priority() -> bool {
    std::thread::Builder::new()
        .name("uffd-probe".into())
        .spawn(|| lower_to_idle_priority() && set_normal_priority(0))
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

/// Thread `tid` of this process (0: the calling one) to `SCHED_OTHER`; whether it could.
/// `tid` is 0, or the fault thread's id while it runs (`mode` is `DONE`, and never left,
/// once it has ended, so no one acts on an id that may be reused).
fn set_normal_priority(tid: i32) -> bool {
    sched::set_policy(ThreadId::from_raw(tid), Policy::Normal).is_ok()
}

/// Whether the calling thread runs under `SCHED_OTHER` (not real-time, batch or idle).
fn normal_policy() -> bool {
    sched::policy().is_ok_and(|p| p == Policy::Normal)
}

/// Lets thread `tid` of this process (0: the calling one) run on `cpus`; whether it could
/// (none given: left alone).
fn set_affinity(tid: i32, cpus: &[usize]) -> bool {
    if cpus.is_empty() {
        return false;
    }
    CpuSet::of(cpus)
        .and_then(|set| sched::set_affinity(ThreadId::from_raw(tid), &set))
        .is_ok()
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    sched::current_cpu().ok()
}

/// The CPUs the calling thread may run on, in order (empty if that cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    sched::affinity().map_or_else(|_| Vec::new(), |set| set.cpus())
}

/// Keeps the calling thread on `cpu` alone from now on; whether it could.
pub fn pin_to_cpu(cpu: usize) -> bool {
    set_affinity(0, &[cpu])
}

/// Moves the calling thread to `cpu` now, leaving it free to run anywhere it could before;
/// whether it moved.
pub fn move_to_cpu(cpu: usize) -> bool {
    sched::move_to_cpu(cpu).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_lines_cpu_is_read_after_the_last_parenthesis_of_its_name() {
        // Fields 3 to 52 of a line, field 39 (the CPU) set to 7.
        let mut fields: Vec<String> = (3..=52).map(|f| f.to_string()).collect();
        fields[39 - 3] = "7".into();
        let rest = fields.join(" ");
        for name in ["uffd-fault", "a b) (c", ")"] {
            let line = format!("1234 ({name}) {rest}\n");
            assert_eq!(stat_cpu(line.as_bytes()), Some(7), "{line}");
        }
        assert_eq!(stat_cpu(b"1234 (cut"), None);
        assert_eq!(stat_cpu(b"1234 (short) S 1 2"), None);
    }

    #[test]
    fn a_thread_sharing_its_cpu_with_a_busy_one_counts_involuntary_switches() {
        // The signal a turn with fault-around reads (and the next test's measure): a
        // runnable thread of normal priority on this thread's CPU takes it from this
        // thread, and getrusage counts that.
        let was = allowed_cpus();
        let Some(&cpu) = was.first() else {
            panic!("no CPU this thread may use");
        };
        assert!(pin_to_cpu(cpu));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to_cpu(cpu);
                while !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let before = involuntary_switches();
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until && involuntary_switches() == before {
            std::hint::spin_loop();
        }
        let after = involuntary_switches();
        stop.store(true, Relaxed);
        busy.join().unwrap();
        set_affinity(0, &was);
        assert!(after > before, "{before} -> {after}");
    }

    #[test]
    fn a_wake_up_of_a_thread_on_its_cpu_preempts_an_idle_priority_thread() {
        // What quick following rests on (`Follow::maybe_apart`): a thread at idle priority
        // that wakes a thread of normal priority on its own CPU gives that CPU up at once,
        // so the woken thread has run, and answered, before the waker's next look (the
        // fault thread's first read after serving single pages), and getrusage counts an
        // involuntary switch across the wake-up (what a turn with fault-around reads). The
        // woken thread waits in a blocking read, as a faulting thread waits in the kernel (a
        // channel's receiver would spin and yield first, runnable when the wake-up comes).
        use std::io::{ErrorKind, Read, Write};
        use std::os::unix::net::UnixStream;
        // The last CPU: the test beside it keeps a busy thread on the first.
        let Some(&cpu) = allowed_cpus().last() else {
            panic!("no CPU this thread may use");
        };
        // A pass of 20 wake-ups (other threads sharing the CPU have left a whole pass
        // without one, now and then).
        let pass = || {
            let (mut waker_end, mut woken_end) = UnixStream::pair().unwrap();
            let woken = std::thread::spawn(move || {
                assert!(pin_to_cpu(cpu));
                let mut byte = [0u8];
                while woken_end.read_exact(&mut byte).is_ok() {
                    woken_end.write_all(&byte).unwrap();
                }
            });
            let counts = std::thread::spawn(move || {
                assert!(pin_to_cpu(cpu));
                assert!(lower_to_idle_priority(), "lowering to idle priority");
                let (mut preempted, mut answered) = (0, 0);
                let mut byte = [0u8];
                waker_end.set_nonblocking(true).unwrap();
                for _ in 0..20 {
                    let before = involuntary_switches();
                    waker_end.write_all(&[1]).unwrap();
                    let after = involuntary_switches();
                    preempted += u32::from(after > before);
                    match waker_end.read(&mut byte) {
                        Ok(1) => answered += 1,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {
                            waker_end.set_nonblocking(false).unwrap();
                            waker_end.read_exact(&mut byte).unwrap();
                            waker_end.set_nonblocking(true).unwrap();
                        }
                        other => panic!("reading the answer: {other:?}"),
                    }
                }
                (preempted, answered)
            })
            .join()
            .unwrap();
            woken.join().unwrap();
            counts
        };
        // Passes until one of each kind is seen, at most 200: the other tests of this binary
        // run beside this one, and one that keeps the CPU busy (a property test) can take
        // every wake-up of a few passes; they end within a second.
        let mut passes: Vec<(u32, u32)> = Vec::new();
        while passes.len() < 200
            && !(passes.iter().any(|&(p, _)| p >= 15) && passes.iter().any(|&(_, a)| a >= 15))
        {
            passes.push(pass());
        }
        // Each wake-up should; a tick's preemption of the woken thread before it blocks
        // again may leave it runnable at the next wake-up now and then.
        assert!(
            passes.iter().any(|&(p, _)| p >= 15) && passes.iter().any(|&(_, a)| a >= 15),
            "wake-ups of 20 that preempted, and that were answered before the next read, {} \
             passes: {passes:?}",
            passes.len()
        );
    }

    fn thread_id() -> u64 {
        let link = std::fs::read_link("/proc/thread-self").unwrap();
        link.file_name().unwrap().to_str().unwrap().parse().unwrap()
    }

    #[test]
    fn following_reads_a_live_threads_cpu_and_lets_go_of_a_dead_one() {
        let placement = Placement::new(false);
        let mut follow = Follow::start(&placement);
        let me = thread_id();
        assert!(follow.cpu_of(me).is_some());
        assert!(follow.stat.as_ref().is_some_and(|(t, _)| *t == me));
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            tx.send(thread_id()).unwrap();
            let _ = done_rx.recv();
        });
        let other_tid = rx.recv().unwrap();
        assert!(follow.cpu_of(other_tid).is_some());
        drop(done_tx);
        other.join().unwrap();
        // The join can return a moment before the kernel has released the thread.
        let mut tries = 0;
        while follow.cpu_of(other_tid).is_some() && tries < 1000 {
            std::thread::sleep(Duration::from_millis(1));
            tries += 1;
        }
        assert_eq!(follow.cpu_of(other_tid), None);
        assert!(follow.stat.is_none());
    }
}
