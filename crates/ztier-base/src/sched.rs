//! The scheduler's calls: a thread's policy (normal or idle priority), the CPUs it may run
//! on and the one it runs on, and how often it was preempted. Background threads lower
//! themselves to idle priority ([`lower_to_idle_priority`]: the page arena's helper, zram's
//! policy, a host's budget); the userfaultfd region's fault thread also goes back to normal
//! priority, pins itself to a CPU and follows the threads whose faults it serves from CPU to
//! CPU, and its evictors keep off that CPU (ztier-uffd's `placement.rs` says why).
//!
//! Invariant: each call reads or changes only the scheduling of a thread of this process
//! (the calling one, or one its caller names by id and knows to be alive), and touches no
//! memory but its own locals. No locks.
#![allow(unsafe_code)]

use std::io;

/// A scheduler call the kernel refused, or a request it cannot express.
#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("sched_setscheduler({policy:?}) of thread {thread}: {source}")]
    SetPolicy {
        thread: i32,
        policy: Policy,
        source: io::Error,
    },
    #[error("sched_getscheduler: {0}")]
    GetPolicy(io::Error),
    /// A policy none of [`Policy`]'s, or one with `SCHED_RESET_ON_FORK` or-ed in (which a
    /// change of policy here would clear).
    #[error("scheduling policy {0:#x} is none of Policy's (or has SCHED_RESET_ON_FORK)")]
    UnknownPolicy(i32),
    #[error("sched_setaffinity of thread {thread}: {source}")]
    SetAffinity { thread: i32, source: io::Error },
    #[error("sched_getaffinity: {0}")]
    GetAffinity(io::Error),
    #[error("CPU {0} is past the largest CPU set the scheduler takes")]
    CpuOutOfRange(usize),
    #[error("CPU {0} is not one this thread may run on")]
    CpuNotAllowed(usize),
    #[error("sched_getcpu: {0}")]
    CurrentCpu(io::Error),
    #[error("getrusage: {0}")]
    Usage(io::Error),
}

/// A thread of this process as the scheduler names it: its id (`gettid`), or
/// [`ThreadId::CALLING`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadId(i32);

impl ThreadId {
    /// Whichever thread makes the call (the scheduler's id 0).
    pub const CALLING: ThreadId = ThreadId(0);

    /// The calling thread's own id, which other threads may name it by.
    pub fn current() -> ThreadId {
        // SAFETY: gettid takes nothing and returns the calling thread's id.
        ThreadId(unsafe { libc::gettid() })
    }

    /// The id `raw` (0: [`ThreadId::CALLING`]), as kept in an atomic.
    pub fn from_raw(raw: i32) -> ThreadId {
        ThreadId(raw)
    }

    pub fn as_raw(self) -> i32 {
        self.0
    }
}

/// A scheduling policy (sched(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `SCHED_OTHER`, the default time-sharing policy.
    Normal,
    /// `SCHED_BATCH`.
    Batch,
    /// `SCHED_IDLE`: runs only when a CPU would otherwise be idle.
    Idle,
    /// `SCHED_FIFO` (real time).
    Fifo,
    /// `SCHED_RR` (real time).
    RoundRobin,
    /// `SCHED_DEADLINE`.
    Deadline,
}

impl Policy {
    fn raw(self) -> libc::c_int {
        match self {
            Policy::Normal => libc::SCHED_OTHER,
            Policy::Batch => libc::SCHED_BATCH,
            Policy::Idle => libc::SCHED_IDLE,
            Policy::Fifo => libc::SCHED_FIFO,
            Policy::RoundRobin => libc::SCHED_RR,
            Policy::Deadline => 6,
        }
    }

    fn from_raw(raw: libc::c_int) -> Result<Policy, SchedError> {
        [
            Policy::Normal,
            Policy::Batch,
            Policy::Idle,
            Policy::Fifo,
            Policy::RoundRobin,
            Policy::Deadline,
        ]
        .into_iter()
        .find(|p| p.raw() == raw)
        .ok_or(SchedError::UnknownPolicy(raw))
    }
}

/// Puts `thread` under `policy` at static priority 0: the time-sharing policies (normal,
/// batch, idle); the kernel refuses the real-time ones, which need a priority above 0.
/// Going from idle priority back to normal needs `CAP_SYS_NICE` or an `RLIMIT_NICE` of 20.
pub fn set_policy(thread: ThreadId, policy: Policy) -> Result<(), SchedError> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the struct we pass and changes only the policy of
    // `thread`, a thread of this process (the module's invariant).
    if unsafe { libc::sched_setscheduler(thread.0, policy.raw(), &param) } != 0 {
        return Err(SchedError::SetPolicy {
            thread: thread.0,
            policy,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The calling thread's policy; [`SchedError::UnknownPolicy`] if it has
/// `SCHED_RESET_ON_FORK`, so that a caller that would change it and back can leave it be.
pub fn policy() -> Result<Policy, SchedError> {
    // SAFETY: sched_getscheduler reads the calling thread's (0) policy, nothing else.
    let raw = unsafe { libc::sched_getscheduler(0) };
    if raw < 0 {
        return Err(SchedError::GetPolicy(io::Error::last_os_error()));
    }
    Policy::from_raw(raw)
}

/// Makes the calling thread run only when a CPU would otherwise be idle (`SCHED_IDLE`):
/// for background work that must not take the foreground's cores (the page arena's helper,
/// zram's policy), or a thread that should give its CPU to the one it wakes (the
/// userfaultfd region's fault thread); whether it could.
///
/// Such work is worth doing ahead only on a core with nothing else to do. On a busy machine
/// (as many working threads as cores) it would take the cores' time all the same and add a
/// context switch and a cold cache to each step, so there it yields (docs/diary.md has the
/// arena helper's figures). A thread put aside this way must hold no lock that a foreground
/// thread waits for, or something must end its idle priority when one waits (the
/// userfaultfd region's guard does that for its fault thread). Failure leaves the thread at
/// normal priority, which is correct, only slower on a busy machine.
pub fn lower_to_idle_priority() -> bool {
    set_policy(ThreadId::CALLING, Policy::Idle).is_ok()
}

/// A set of CPUs, as the scheduler's affinity calls take and give it (`cpu_set_t`: CPUs
/// below `CPU_SETSIZE`, 1024).
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// No CPU.
    pub fn empty() -> CpuSet {
        // SAFETY: cpu_set_t is plain bits; all zeros is a valid (empty) set.
        CpuSet(unsafe { std::mem::zeroed() })
    }

    /// The CPUs `cpus`; an error names the first past the set's size.
    pub fn of(cpus: &[usize]) -> Result<CpuSet, SchedError> {
        let mut set = CpuSet::empty();
        for &cpu in cpus {
            set.insert(cpu)?;
        }
        Ok(set)
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: usize) -> Result<(), SchedError> {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(SchedError::CpuOutOfRange(cpu));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE (checked); the set is ours.
        unsafe { libc::CPU_SET(cpu, &mut self.0) };
        Ok(())
    }

    /// Whether `cpu` is in the set (never one past its size).
    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: `cpu` is below CPU_SETSIZE (checked first); the set is a live value.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// The set's CPUs, in order.
    pub fn cpus(&self) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| self.contains(cpu))
            .collect()
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.cpus()).finish()
    }
}

/// Lets `thread` run on the CPUs of `set` alone (the kernel keeps those it may use, and
/// refuses, changing nothing, if none is left).
pub fn set_affinity(thread: ThreadId, set: &CpuSet) -> Result<(), SchedError> {
    // SAFETY: sched_setaffinity reads the set we pass and changes only where `thread`, a
    // thread of this process, may run.
    if unsafe { libc::sched_setaffinity(thread.0, size_of::<libc::cpu_set_t>(), &set.0) } != 0 {
        return Err(SchedError::SetAffinity {
            thread: thread.0,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn affinity() -> Result<CpuSet, SchedError> {
    let mut set = CpuSet::empty();
    // SAFETY: sched_getaffinity writes at most the size we pass into a live cpu_set_t; 0 is
    // the calling thread.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set.0) } != 0 {
        return Err(SchedError::GetAffinity(io::Error::last_os_error()));
    }
    Ok(set)
}

/// The CPU the calling thread runs on now.
pub fn current_cpu() -> Result<usize, SchedError> {
    // SAFETY: sched_getcpu takes nothing and returns a CPU number or -1.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).map_err(|_| SchedError::CurrentCpu(io::Error::last_os_error()))
}

/// Moves the calling thread to `cpu` now, leaving it free to run anywhere it could before:
/// its affinity is set to that CPU alone, which migrates it, then put back. Never, even for
/// a moment, onto a CPU the thread may not run on (a program's own affinity, which its
/// threads inherit).
pub fn move_to_cpu(cpu: usize) -> Result<(), SchedError> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(SchedError::CpuOutOfRange(cpu));
    }
    let was = affinity()?;
    if !was.contains(cpu) {
        return Err(SchedError::CpuNotAllowed(cpu));
    }
    set_affinity(ThreadId::CALLING, &CpuSet::of(&[cpu])?)?;
    // Back to where it could run before; should that fail, it stays on `cpu`, where it is.
    let _ = set_affinity(ThreadId::CALLING, &was);
    Ok(())
}

/// The calling thread's involuntary context switches so far (`getrusage`'s `ru_nivcsw`):
/// how often another thread took its CPU from it.
pub fn involuntary_switches() -> Result<u64, SchedError> {
    Ok(thread_usage()?.ru_nivcsw as u64)
}

/// The calling thread's minor page faults so far (`getrusage`'s `ru_minflt`): pages it
/// brought in without I/O, the zero page a read of untouched memory maps among them.
pub fn minor_faults() -> Result<u64, SchedError> {
    Ok(thread_usage()?.ru_minflt as u64)
}

/// `getrusage(RUSAGE_THREAD)`: the calling thread's own figures.
fn thread_usage() -> Result<libc::rusage, SchedError> {
    // SAFETY: rusage is plain integers; all zeros is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the calling thread's figures into the live struct we pass.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) } != 0 {
        return Err(SchedError::Usage(io::Error::last_os_error()));
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_set_holds_what_is_put_in_and_refuses_what_cannot_be() {
        let set = CpuSet::of(&[0, 3, 1023]).unwrap();
        assert_eq!(set.cpus(), [0, 3, 1023]);
        assert!(set.contains(3) && !set.contains(2) && !set.contains(1 << 20));
        assert!(matches!(
            CpuSet::of(&[1, 1024]),
            Err(SchedError::CpuOutOfRange(1024))
        ));
        assert_eq!(format!("{set:?}"), "{0, 3, 1023}");
    }

    /// On a thread of its own: pinned to each CPU it may use in turn it runs there, moved
    /// it runs there and keeps its affinity, and idle priority is entered (and, where the
    /// process may, left).
    #[test]
    fn a_thread_is_pinned_moved_and_lowered() {
        std::thread::spawn(|| {
            let allowed = affinity().unwrap();
            let cpus = allowed.cpus();
            assert!(!cpus.is_empty());
            assert!(cpus.contains(&current_cpu().unwrap()));
            for &cpu in &cpus {
                set_affinity(ThreadId::CALLING, &CpuSet::of(&[cpu]).unwrap()).unwrap();
                assert_eq!(current_cpu().unwrap(), cpu);
                assert_eq!(affinity().unwrap().cpus(), [cpu]);
            }
            set_affinity(ThreadId::current(), &allowed).unwrap();
            let last = *cpus.last().unwrap();
            move_to_cpu(last).unwrap();
            assert_eq!(affinity().unwrap().cpus(), cpus);
            assert!(matches!(
                move_to_cpu(1 << 20),
                Err(SchedError::CpuOutOfRange(_))
            ));
            if let Some(barred) = (0..1024).find(|&c| !allowed.contains(c)) {
                assert!(matches!(
                    move_to_cpu(barred),
                    Err(SchedError::CpuNotAllowed(c)) if c == barred
                ));
            }
            assert!(involuntary_switches().is_ok());
            assert_eq!(policy().unwrap(), Policy::Normal);
            assert!(lower_to_idle_priority());
            assert_eq!(policy().unwrap(), Policy::Idle);
            match set_policy(ThreadId::CALLING, Policy::Normal) {
                Ok(()) => assert_eq!(policy().unwrap(), Policy::Normal),
                Err(SchedError::SetPolicy { policy, source, .. }) => {
                    assert_eq!(policy, Policy::Normal);
                    assert_eq!(source.raw_os_error(), Some(libc::EPERM));
                }
                Err(e) => panic!("{e}"),
            }
            assert!(matches!(
                set_policy(ThreadId::CALLING, Policy::Fifo),
                Err(SchedError::SetPolicy { .. })
            ));
        })
        .join()
        .unwrap();
    }
}
