//! The kernel's CPU latency QoS (`kernel/power/qos.c`, `/dev/cpu_dma_latency`), asked for
//! while faults come.
//!
//! A fault's round trip is two wake-ups. When the faulting thread and the fault thread run
//! on different CPUs, each wake-up goes to a CPU that went idle in between, and what that
//! costs is the idle state's exit: on a VM whose idle vCPUs halt at once (cpuidle's
//! `haltpoll` with `guest_halt_poll_ns` 0) it is an interrupt into a halted vCPU, which
//! makes a bare handler's round trip several times longer at p50 (docs/diary.md,
//! 2026-11-27, has the figures). The scheduler separates the two threads now and then
//! whatever the fault thread does (placement.rs), so the idle state decides the tail.
//!
//! A request of 0 µs keeps every idle CPU in its polling state (cpuidle's state 0) while it
//! is held, where the cpuidle driver's state 0 polls (x86's `haltpoll`, `intel_idle`,
//! `acpi_idle`): the wake-up is then a flag the other CPU is watching. Where there is no
//! cpuidle driver, or its state 0 does not poll (arm64's is WFI), the request changes
//! nothing. It costs power (idle CPUs spin), so the fault thread holds it only from a fault
//! until none has come for [`RELAX_AFTER`], then withdraws it (a request back at the
//! default value, no constraint).
//!
//! The device is the kernel's interface for exactly this (a request lives while its file is
//! open, and goes with the process); it is root's alone by default, and where it cannot be
//! opened (or does not read as the kernel's device) the region runs without it and says
//! why. The file is the request: a child forked while it is open shares it (the fault
//! thread's later writes change it for both), so it is withdrawn when the fault thread ends
//! and before the file is closed, not left to the close. (A process killed while it holds
//! one leaves it to such a child until that child exits or execs.)
//!
//! While it is held, an alarm (a timerfd) is set for when it may be due to go: set again by
//! a fault at most every half [`RELAX_AFTER`] (a timeout on every wait armed and cancelled
//! a kernel timer on every fault's path), so that while faults keep coming it does not
//! ring, and set again for the rest of the spell if it rings early all the same. A thread
//! of the region's waits on the alarm ([`watch_alarm`](CpuLatencyQos::watch_alarm)): when it
//! rings, that thread marks it rung and wakes the fault thread, out of its poll or out of
//! its blocking read (bell.rs), which then looks at the request. (A ring of a parked fault
//! thread makes the kernel refuse copies until the ringer runs again, a millisecond's wait
//! for a fault that comes then, or longer where every CPU is busy, since the watcher runs
//! at idle priority: better when no fault is coming.)
//!
//! Invariants: only the fault thread changes the request (`hold`, `relax_if_quiet`,
//! `withdraw`; then the drop, after it has ended), so `held` is the request's state; while
//! it is held the alarm is set or has rung and not yet been looked at, and once it is not,
//! the alarm is disarmed (a refused write too). The alarm's watcher only takes its ringing
//! and sets `rang`, which the fault thread takes. The figures are atomics `stats()` reads.
//! The one lock, the reason the request is not used, is a leaf.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::userfaultfd::{Alarm, Waker};

/// The kernel's interface to CPU latency QoS requests.
const DEVICE: &str = "/dev/cpu_dma_latency";

/// How long after the last fault the request is withdrawn: far longer than the gaps
/// between a program's faults while it pages something in, short enough that idle CPUs
/// stop polling soon after.
pub(crate) const RELAX_AFTER: Duration = Duration::from_millis(10);

/// `PM_QOS_DEFAULT_VALUE`: a request at this value asks for nothing (the class's default).
const NO_CONSTRAINT: i32 = -1;

/// The machine's CPU latency target (µs) when nobody asks for anything:
/// `PM_QOS_CPU_LATENCY_DEFAULT_VALUE`, 2000 s.
pub const NO_CPU_LATENCY_TARGET_US: i32 = 2_000_000_000;

/// A CPU latency request the fault thread takes while faults come.
pub(crate) struct CpuLatencyQos {
    /// The request's file; `None` where it is not used (turned off, not permitted, not the
    /// kernel's device).
    file: Option<File>,
    /// Set once a write was refused: the request is not used again.
    refused: AtomicBool,
    /// Why the request is not used, where it is not (a leaf lock, taken when a write is
    /// refused and by `Region::cpu_latency_qos_unused`).
    unused: Mutex<Option<Unused>>,
    /// The clock the fault times below count from.
    epoch: Instant,
    /// When the last fault came (nanoseconds from `epoch`), while the request is held.
    last_fault_ns: AtomicU64,
    /// When a fault last set the alarm (nanoseconds from `epoch`).
    armed_ns: AtomicU64,
    held: AtomicBool,
    /// Times the request was taken.
    holds: AtomicU64,
    /// Rings when the request may be due to go, so that the fault thread's wait needs no
    /// timeout of its own while it is held (`None` where no timerfd could be made: then
    /// [`wait_ms`](Self::wait_ms) gives the poll a timeout instead, and the fault thread
    /// does not park in its read while the request is held).
    alarm: Option<Alarm>,
    /// The alarm rang (its watcher's mark) and the fault thread has not yet looked.
    rang: AtomicBool,
}

impl CpuLatencyQos {
    /// The request, opened where `wanted` and the device allows (asking for nothing until
    /// the first fault).
    pub(crate) fn open(wanted: bool) -> CpuLatencyQos {
        let (file, unused) = if wanted {
            match open_device() {
                Ok(f) => (Some(f), None),
                Err(why) => (None, Some(why)),
            }
        } else {
            (None, Some(Unused::TurnedOff))
        };
        let alarm = file.as_ref().and_then(|_| Alarm::new().ok());
        let qos = CpuLatencyQos {
            alarm,
            file,
            refused: AtomicBool::new(false),
            unused: Mutex::new(unused),
            epoch: Instant::now(),
            last_fault_ns: AtomicU64::new(0),
            armed_ns: AtomicU64::new(0),
            held: AtomicBool::new(false),
            holds: AtomicU64::new(0),
            rang: AtomicBool::new(false),
        };
        // Opening adds a request at the default value; saying so explicitly shows a
        // device that takes no writes now, not at the first fault.
        qos.set(NO_CONSTRAINT);
        qos
    }

    /// Whether the request can be taken.
    pub(crate) fn usable(&self) -> bool {
        self.file.is_some() && !self.refused.load(Relaxed)
    }

    /// Why the request is not used, where it is not.
    pub(crate) fn unused_because(&self) -> Option<String> {
        self.unused.lock().as_ref().map(Unused::to_string)
    }

    /// Whether the request is held now.
    pub(crate) fn held(&self) -> bool {
        self.held.load(Relaxed)
    }

    /// Times the request was taken.
    pub(crate) fn holds(&self) -> u64 {
        self.holds.load(Relaxed)
    }

    /// A fault came at `now` (the fault thread's call): the request is held (taken now if
    /// it was not) until [`RELAX_AFTER`] passes with none.
    pub(crate) fn hold(&self, now: Instant) {
        if !self.usable() {
            return;
        }
        let ns = self.ns(now);
        self.last_fault_ns.store(ns, Relaxed);
        if !self.held() && self.set(0) {
            self.held.store(true, Relaxed);
            self.holds.fetch_add(1, Relaxed);
            self.arm(ns);
        } else if self.held()
            && ns.saturating_sub(self.armed_ns.load(Relaxed)) >= RELAX_AFTER.as_nanos() as u64 / 2
        {
            // Pushed back while faults keep coming: it rings only once they stop.
            self.arm(ns);
        }
    }

    /// Sets the alarm for a whole quiet spell from `ns` (a fault's time).
    fn arm(&self, ns: u64) {
        if let Some(alarm) = &self.alarm {
            alarm.set(RELAX_AFTER);
            self.armed_ns.store(ns, Relaxed);
        }
    }

    /// The alarm while the request is held: it rings when the request may be due to go.
    #[cfg(test)]
    fn alarm(&self) -> Option<&Alarm> {
        self.alarm.as_ref().filter(|_| self.held())
    }

    /// Whether there is an alarm to watch ([`watch_alarm`](Self::watch_alarm)).
    pub(crate) fn has_alarm(&self) -> bool {
        self.alarm.is_some()
    }

    /// The alarm's watcher (a thread of its own): each time the alarm rings, marks it rung
    /// and calls `wake_fault_thread`; returns once `stop` is set and `stop_waker`
    /// signalled.
    pub(crate) fn watch_alarm(
        &self,
        stop: &AtomicBool,
        stop_waker: &Waker,
        wake_fault_thread: impl Fn(),
    ) {
        let Some(alarm) = &self.alarm else {
            return;
        };
        while !stop.load(Relaxed) {
            if alarm.wait(stop_waker) {
                self.rang.store(true, SeqCst);
                wake_fault_thread();
            }
        }
    }

    /// Whether the alarm rang since the fault thread last looked (the fault thread's call;
    /// it then looks: [`relax_if_quiet`](Self::relax_if_quiet)).
    pub(crate) fn take_ringing(&self) -> bool {
        self.rang.swap(false, SeqCst)
    }

    /// Whether the alarm rang and the fault thread has not looked yet (without taking it).
    pub(crate) fn ringing(&self) -> bool {
        self.rang.load(SeqCst)
    }

    /// How long the fault thread may wait for a message before it should look at the
    /// request again, in whole milliseconds rounded up (so that it wakes once, after the
    /// quiet spell): `None` while none is held, or while the alarm will wake it (it may
    /// wait for ever).
    pub(crate) fn wait_ms(&self, now: Instant) -> Option<i32> {
        if !self.held() || self.alarm.is_some() {
            return None;
        }
        let left = RELAX_AFTER.saturating_sub(self.quiet(now));
        Some(left.as_micros().div_ceil(1000).clamp(1, i32::MAX as u128) as i32)
    }

    /// The fault thread's poll timeout: -1 (none) unless the request is held with no
    /// alarm, then [`wait_ms`](Self::wait_ms) (the clock is read only then).
    pub(crate) fn poll_timeout_ms(&self) -> i32 {
        if !self.held() || self.alarm.is_some() {
            return -1;
        }
        self.wait_ms(Instant::now()).unwrap_or(-1)
    }

    /// Withdraws the request once no fault has come for [`RELAX_AFTER`], else sets the
    /// alarm for when that will be (the fault thread's call, before a wait or after a poll
    /// that found no message, with nothing in hand).
    pub(crate) fn relax_if_quiet(&self, now: Instant) {
        if !self.held() {
            return;
        }
        let quiet = self.quiet(now);
        if quiet >= RELAX_AFTER {
            self.withdraw();
        } else if let Some(alarm) = &self.alarm {
            alarm.set(RELAX_AFTER - quiet);
        }
    }

    /// Withdraws the request, held or not (the fault thread's call as it ends).
    pub(crate) fn withdraw(&self) {
        if self.set(NO_CONSTRAINT) {
            self.let_go();
        }
    }

    /// How long since the last fault.
    fn quiet(&self, now: Instant) -> Duration {
        Duration::from_nanos(
            self.ns(now)
                .saturating_sub(self.last_fault_ns.load(Relaxed)),
        )
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// Writes the request's value (a binary `s32`, as the device takes it); false if the
    /// device refused it, which leaves the request unused from then on, with the reason.
    /// (The kernel's device takes every four-byte write; `open_device` made sure it is that
    /// device.) With no request to write, nothing is refused.
    fn set(&self, value: i32) -> bool {
        let Some(mut f) = self.file.as_ref().filter(|_| !self.refused.load(Relaxed)) else {
            return true;
        };
        match f.write_all(&value.to_ne_bytes()) {
            Ok(()) => true,
            Err(e) => {
                *self.unused.lock() = Some(Unused::Refused(e));
                self.refused.store(true, Relaxed);
                self.let_go();
                false
            }
        }
    }

    /// The request is no longer held: nothing is due, so the alarm is disarmed.
    fn let_go(&self) {
        self.held.store(false, Relaxed);
        if let Some(alarm) = &self.alarm {
            alarm.disarm();
        }
    }
}

/// Why the request is not used. The OS's error is said in the message, not also as a
/// `source`: the region hands the reason on as its message alone
/// (`Region::cpu_latency_qos_unused`).
#[derive(Debug, thiserror::Error)]
enum Unused {
    #[error("turned off (RegionConfig::cpu_latency_qos)")]
    TurnedOff,
    #[error("{DEVICE} cannot be opened: {0}")]
    CannotOpen(io::Error),
    #[error("{DEVICE} cannot be read: {0}")]
    CannotRead(io::Error),
    /// Not the kernel's device (`read` bytes where it reads four).
    #[error("{DEVICE} read {read} bytes, not the 4 of a CPU latency target")]
    NotTheDevice { read: usize },
    /// A write of a request was refused.
    #[error("{DEVICE} refused a request: {0}")]
    Refused(io::Error),
}

/// The device, opened for a request; the reason where it cannot be. The kernel's device
/// reads as the machine's target, four bytes: anything else at that path (a `/dev/null`
/// bind-mounted over it) would take writes and do nothing.
fn open_device() -> Result<File, Unused> {
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEVICE)
        .map_err(Unused::CannotOpen)?;
    match f.read(&mut [0u8; 8]) {
        Ok(4) => Ok(f),
        Ok(read) => Err(Unused::NotTheDevice { read }),
        Err(e) => Err(Unused::CannotRead(e)),
    }
}

/// The machine's CPU latency target in µs, the least of every process's requests (the
/// device's read), where the device can be read; [`NO_CPU_LATENCY_TARGET_US`] when nobody
/// asks for anything.
pub(crate) fn machine_target() -> Option<i32> {
    let bytes = std::fs::read(DEVICE).ok()?;
    Some(i32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?))
}

impl Drop for CpuLatencyQos {
    /// The request is withdrawn before its file is closed: a child the program forked
    /// shares the open file, and with it the request, which closing here would leave as
    /// it was until the child exits.
    fn drop(&mut self) {
        if self.held() {
            self.withdraw();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The tests that read the machine's target take turns: each one's request is part of it.
    pub(crate) static MACHINE_TARGET: Mutex<()> = Mutex::new(());

    /// A request to test, and this test's turn at the machine's target; `None` (having
    /// said why) where the request cannot be made here.
    fn usable_request() -> Option<(parking_lot::MutexGuard<'static, ()>, CpuLatencyQos)> {
        let turn = MACHINE_TARGET.lock();
        let qos = CpuLatencyQos::open(true);
        usable_or_skip(&qos).then_some((turn, qos))
    }

    /// Whether the request can be made here; if not, says why, and fails under `CI`.
    fn usable_or_skip(qos: &CpuLatencyQos) -> bool {
        if qos.usable() {
            return true;
        }
        let why = qos.unused_because().unwrap_or_default();
        // A kernel without the device (no CONFIG_CPU_IDLE) cannot be given one; a device
        // this process may not use can.
        if std::env::var_os("CI").is_some() && std::path::Path::new(DEVICE).exists() {
            panic!("CI must run the CPU latency request's tests: {why}");
        }
        eprintln!("skipped: {why}");
        false
    }

    #[test]
    fn turned_off_it_is_never_held_and_says_why() {
        let qos = CpuLatencyQos::open(false);
        assert!(!qos.usable());
        assert!(qos.unused_because().unwrap().contains("turned off"));
        qos.hold(Instant::now());
        assert!(!qos.held());
        assert_eq!(qos.holds(), 0);
        assert_eq!(qos.wait_ms(Instant::now()), None);
    }

    /// Where the device can be opened (root), a fault takes the request, a quiet spell
    /// withdraws it, and the kernel's aggregate follows: the device's read gives the
    /// machine's current target, which our request of 0 sets while it is held.
    #[test]
    fn held_from_a_fault_until_a_quiet_spell() {
        let Some((_turn, mut qos)) = usable_request() else {
            return;
        };
        let t0 = Instant::now();
        qos.hold(t0);
        assert!(qos.held());
        assert_eq!(qos.holds(), 1);
        assert_eq!(
            machine_target(),
            Some(0),
            "a held request of 0 is the machine's target"
        );
        // The alarm, set for the quiet spell, is what wakes the fault thread (through its
        // watcher): its wait itself needs no timeout.
        let alarm_left = |qos: &CpuLatencyQos| qos.alarm().and_then(|a| a.remaining());
        assert!(qos.alarm().is_some(), "a held request has its alarm");
        assert!(alarm_left(&qos).is_none_or(|d| d <= RELAX_AFTER));
        assert_eq!(qos.wait_ms(t0), None);
        assert_eq!(qos.poll_timeout_ms(), -1);
        // A second fault while held takes nothing more.
        qos.hold(t0 + Duration::from_millis(1));
        assert_eq!(qos.holds(), 1);
        // Not yet quiet: held, the alarm set again for the rest of the spell.
        qos.relax_if_quiet(t0 + Duration::from_millis(2));
        assert!(qos.held());
        assert!(alarm_left(&qos).is_none_or(|d| d <= Duration::from_millis(9)));
        qos.relax_if_quiet(t0 + Duration::from_millis(1) + RELAX_AFTER);
        assert!(!qos.held());
        assert!(qos.alarm().is_none());
        assert_eq!(qos.alarm.as_ref().unwrap().remaining(), None, "disarmed");
        assert_eq!(qos.poll_timeout_ms(), -1);

        // Without an alarm (no timerfd could be made), the poll's timeout ends the wait,
        // rounded up: one wake-up, after the quiet spell, not one just before it.
        qos.alarm = None;
        let t1 = Instant::now();
        qos.hold(t1);
        assert_eq!(qos.wait_ms(t1), Some(10));
        assert_eq!(qos.wait_ms(t1 + Duration::from_micros(300)), Some(10));
        assert_eq!(qos.wait_ms(t1 + Duration::from_micros(9_999)), Some(1));
        assert!((1..=10).contains(&qos.poll_timeout_ms()));
        qos.relax_if_quiet(t1 + RELAX_AFTER);
        assert!(!qos.held());
        assert_eq!(qos.wait_ms(t1 + RELAX_AFTER * 2), None);
    }

    /// A request dropped while held is withdrawn even where its file stays open elsewhere
    /// (a forked child's copy; here a duplicate descriptor of the same open file).
    #[test]
    fn dropped_while_held_it_is_withdrawn_for_a_shared_file_too() {
        let Some((_turn, qos)) = usable_request() else {
            return;
        };
        if machine_target() == Some(0) {
            eprintln!("skipped: another process holds a request of 0 µs");
            return;
        }
        let shared = qos.file.as_ref().unwrap().try_clone().unwrap();
        qos.hold(Instant::now());
        assert!(qos.held());
        drop(qos);
        assert_ne!(
            machine_target(),
            Some(0),
            "the request stayed at 0 with its file still open"
        );
        drop(shared);
    }
}
