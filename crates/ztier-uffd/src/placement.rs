//! Where the fault thread runs. A fault's round trip is two wake-ups: the faulting thread's
//! of the fault thread, and the copy's of the faulting thread. On one CPU each is a context
//! switch (the whole trip about 5 µs here); across two, on a machine whose idle CPUs halt
//! (a VM's vCPUs), each is an interrupt into a halted CPU, and the trip takes 50-70 µs.
//! The scheduler sends a woken thread to an idle CPU whenever its own is busy, and the
//! faulting thread's CPU is busy at the moment the copy wakes it: the fault thread is on
//! it, issuing the copy. So the two drift apart and stay apart; a sequential fault-in
//! then runs at a third of its speed (MEASUREMENTS.md, 2026-11-26).
//!
//! Two things keep them together:
//! - **Following**: at most every [`LOOK_EVERY`], the fault thread reads which CPU the
//!   thread whose fault it just read last ran on (its `/proc/self/task/TID/stat`, kept
//!   open) and moves there.
//! - **Idle priority** (`SCHED_IDLE`), while a single thread faults: the scheduler counts a
//!   CPU that runs only idle-priority threads as idle when it places a woken thread, so the
//!   faulting thread, woken by the copy, stays on the fault thread's CPU and takes it over at
//!   once. The fault thread is then pinned to that CPU (following moves the pin).
//!
//! Idle priority starves beside any busy thread of normal priority, and a fault waits for
//! it. So it is used only while one thread faults (faults from several leave it at the next
//! look), and a guard, run by the reclaim thread, takes it back: when faults are waiting
//! and the fault thread has not come round its loop for [`STARVED_AFTER`], it goes back to
//! normal priority, free to run on any CPU it could at the start, and idle priority is tried
//! again only after a back-off (0.1 s, doubling up to 5 s). Leaving idle priority needs
//! `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20 (sched(7)); a region made without either
//! follows at normal priority only (a probe thread tries both ways when the region is made).
//!
//! While the fault thread is pinned at idle priority, the evictors keep off its CPU (any
//! thread of normal priority there takes the CPU from it, and an evictor's batch compresses
//! for a millisecond or so), where the process has another.
//!
//! Invariants: only the fault thread enters idle priority, and only the fault thread or
//! the guard leaves it, each under `state`; the guard reads the fault thread's loop count,
//! never blocks on it. Lock order: `state` is a leaf.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How often, at most, the fault thread looks where the faulting thread runs. A look is
/// one `pread` of a stat file (about 1 µs here).
pub(crate) const LOOK_EVERY: Duration = Duration::from_micros(250);

/// How long faults may wait while the fault thread, at idle priority, does not come round
/// its loop, before the guard takes idle priority back.
pub(crate) const STARVED_AFTER: Duration = Duration::from_millis(2);

/// How often the reclaim thread, idle, runs the guard while the fault thread is at idle
/// priority (at normal priority it sleeps as before).
pub(crate) const GUARD_EVERY: Duration = Duration::from_millis(4);

/// Faults are coming if the fault thread looked where the faulting thread runs this
/// recently (it looks at most every [`LOOK_EVERY`] while they come).
const FAULTS_RECENT: Duration = Duration::from_millis(10);

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the fault thread and the guard share.
pub(crate) struct Placement {
    /// Whether idle priority is used at all: asked for, and leaving it allowed.
    allowed: bool,
    /// The fault thread's id (0 until it starts).
    tid: AtomicI32,
    /// The fault thread's turns round its loop.
    turns: AtomicU64,
    /// Whether the fault thread, at its last turn, held faults it could not serve yet.
    holding: AtomicBool,
    state: Mutex<State>,
}

struct State {
    /// The fault thread runs at idle priority.
    idle: bool,
    /// The CPU it is pinned to (at idle priority only).
    pinned: Option<usize>,
    /// The fault thread's last look (faults are coming while it is recent).
    looked: Option<Instant>,
    /// The CPUs the fault thread could run on when it started: where it may go again when
    /// it leaves idle priority.
    cpus: Vec<usize>,
    /// Not before then (after the guard took idle priority back).
    retry_at: Option<Instant>,
    backoff: Duration,
    /// The guard's last look: the fault thread's turns then, and since when unchanged.
    seen: (u64, Instant),
    /// How often the guard took idle priority back.
    demotions: u64,
}

impl Placement {
    /// `wanted`: [`crate::RegionConfig::idle_priority`]; idle priority is used if it is
    /// wanted and this process may leave it again.
    pub(crate) fn new(wanted: bool) -> Placement {
        Placement {
            allowed: wanted && may_leave_idle_priority(),
            tid: AtomicI32::new(0),
            turns: AtomicU64::new(0),
            holding: AtomicBool::new(false),
            state: Mutex::new(State {
                idle: false,
                pinned: None,
                looked: None,
                cpus: Vec::new(),
                retry_at: None,
                backoff: FIRST_BACKOFF,
                seen: (0, Instant::now()),
                demotions: 0,
            }),
        }
    }

    /// Whether the fault thread runs at idle priority now.
    pub(crate) fn idle(&self) -> bool {
        self.state.lock().idle
    }

    /// How often the guard took idle priority back.
    pub(crate) fn demotions(&self) -> u64 {
        self.state.lock().demotions
    }

    /// A turn of the fault thread's loop.
    pub(crate) fn turn(&self) {
        self.turns.fetch_add(1, Relaxed);
    }

    /// Whether the fault thread, ending a turn, holds faults back to serve later.
    pub(crate) fn holding(&self, faults: bool) {
        self.holding.store(faults, Relaxed);
    }

    /// The guard, run by the reclaim thread: `unread` says whether a message waits for the
    /// fault thread.
    pub(crate) fn guard(&self, unread: impl FnOnce() -> bool) {
        let mut st = self.state.lock();
        if !st.idle {
            return;
        }
        let turns = self.turns.load(Relaxed);
        if turns != st.seen.0 {
            st.seen = (turns, Instant::now());
            return;
        }
        if st.seen.1.elapsed() < STARVED_AFTER || !(self.holding.load(Relaxed) || unread()) {
            return;
        }
        let tid = self.tid.load(Relaxed);
        if set_normal_priority(tid) {
            set_affinity(tid, &st.cpus);
            st.idle = false;
            st.pinned = None;
            st.retry_at = Some(Instant::now() + st.backoff);
            st.backoff = (st.backoff * 2).min(MAX_BACKOFF);
            st.demotions += 1;
        }
    }
}

/// An evictor's side: it keeps off the CPU the fault thread is pinned to at idle priority,
/// where it would take the CPU from the fault thread (an evictor's batch compresses for a
/// millisecond or so) while a fault waits. Made on the evictor's thread.
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
        if !self.placement.allowed {
            return;
        }
        let pinned = {
            let st = self.placement.state.lock();
            st.pinned
                .filter(|_| st.looked.is_some_and(|t| t.elapsed() < FAULTS_RECENT))
        };
        let want = pinned.filter(|cpu| self.cpus.iter().any(|c| c != cpu));
        if want == self.off {
            return;
        }
        let cpus: Vec<usize> = match want {
            Some(cpu) => self.cpus.iter().copied().filter(|&c| c != cpu).collect(),
            None => self.cpus.clone(),
        };
        set_affinity(0, &cpus);
        self.off = want;
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
    /// The stat file of the thread last looked at, by its id.
    stat: Option<(u64, File)>,
}

impl<'a> Follow<'a> {
    pub(crate) fn start(placement: &'a Placement) -> Follow<'a> {
        // SAFETY: gettid takes nothing and returns the calling thread's id.
        placement.tid.store(unsafe { libc::gettid() }, Relaxed);
        placement.state.lock().cpus = allowed_cpus();
        Follow {
            placement,
            last_look: None,
            last_tid: 0,
            mixed: false,
            stat: None,
        }
    }

    /// A fault read from thread `tid` (0 if the kernel did not say); true if the fault
    /// thread has just gone to idle priority (its guard should look often from now on).
    pub(crate) fn fault(&mut self, tid: u64) -> bool {
        if tid == 0 {
            return false;
        }
        if self.last_tid != 0 && tid != self.last_tid {
            self.mixed = true;
        }
        self.last_tid = tid;
        if self.last_look.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return false;
        }
        self.last_look = Some(Instant::now());
        let mixed = std::mem::take(&mut self.mixed);
        let Some(cpu) = self.cpu_of(tid) else {
            return false;
        };
        let p = self.placement;
        if !p.allowed {
            if current_cpu() != Some(cpu) {
                move_to_cpu(cpu);
            }
            return false;
        }
        let mut entered = false;
        let mut st = p.state.lock();
        st.looked = self.last_look;
        if st.idle && mixed {
            if set_normal_priority(0) {
                set_affinity(0, &st.cpus);
                st.idle = false;
                st.pinned = None;
            }
        } else if !st.idle && !mixed && st.retry_at.is_none_or(|t| Instant::now() >= t) {
            st.idle = set_idle_priority();
            entered = st.idle;
            // The guard counts unchanged turns from now.
            st.seen = (p.turns.load(Relaxed), Instant::now());
        }
        if st.idle {
            if st.pinned != Some(cpu) && pin_to_cpu(cpu) {
                st.pinned = Some(cpu);
            }
        } else if current_cpu() != Some(cpu) {
            move_to_cpu(cpu);
        }
        entered
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
        .spawn(|| set_idle_priority() && set_normal_priority(0))
        .ok()
        .and_then(|t| t.join().ok())
        .unwrap_or(false)
}

/// The calling thread to `SCHED_IDLE`; whether it could.
fn set_idle_priority() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the struct we pass and changes only the calling
    // thread's (0) policy.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
}

/// Thread `tid` of this process (0: the calling one) to `SCHED_OTHER`; whether it could.
fn set_normal_priority(tid: i32) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the struct we pass and changes only the policy of
    // thread `tid` (an id of this process's fault thread, or 0).
    unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param) == 0 }
}

/// Lets thread `tid` of this process (0: the calling one) run on `cpus` (none: left alone).
fn set_affinity(tid: i32, cpus: &[usize]) {
    if cpus.is_empty() {
        return;
    }
    // SAFETY: cpu_set_t is plain bits; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `cpu` is below CPU_SETSIZE (filtered); the set is a live local.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: sched_setaffinity reads the set we pass and changes only where thread `tid`
    // may run; CPUs it may not use fail the call (EINVAL) and nothing changes.
    unsafe { libc::sched_setaffinity(tid, size_of::<libc::cpu_set_t>(), &set) };
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing and returns a CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

/// The CPUs the calling thread may run on, in order (empty if that cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain bits; all zeros is a valid (empty) set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the size we pass into a live cpu_set_t; 0 is
    // the calling thread.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: every index is below CPU_SETSIZE; the set is a live, filled local.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Keeps the calling thread on `cpu` alone from now on; whether it could.
pub fn pin_to_cpu(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: as in `allowed_cpus`, an empty set.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE, checked above; the set is a live local.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: sched_setaffinity reads the set we pass and changes only where the calling
    // thread may run; a CPU it may not use fails (EINVAL) and nothing changes.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &one) == 0 }
}

/// Moves the calling thread to `cpu` now, leaving it free to run anywhere it could before
/// (its affinity is set to that CPU alone, which migrates it, then put back).
pub fn move_to_cpu(cpu: usize) {
    if cpu >= libc::CPU_SETSIZE as usize {
        return;
    }
    // SAFETY: cpu_set_t is plain bits; all zeros is a valid (empty) set.
    let mut was: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: sched_getaffinity writes at most the size we pass into a live cpu_set_t; 0 is
    // the calling thread.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut was) } != 0 {
        return;
    }
    // Never, even for a moment, onto a CPU the thread may not run on (a program's own
    // affinity, which the region's threads inherit).
    // SAFETY: `cpu` is below CPU_SETSIZE, checked above; `was` is a live, filled set.
    if !unsafe { libc::CPU_ISSET(cpu, &was) } {
        return;
    }
    if pin_to_cpu(cpu) {
        // SAFETY: sched_setaffinity reads the set we pass (a live local) and changes only
        // where the calling thread may run: back to where it could before.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &was) };
    }
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
        assert_eq!(follow.cpu_of(other_tid), None);
        assert!(follow.stat.is_none());
    }
}
