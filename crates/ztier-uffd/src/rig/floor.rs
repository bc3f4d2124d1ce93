//! The floor under a region's fault latency on this machine: the same round trip with none
//! of ztier's work in it. A bare handler thread (poll, read, one `UFFDIO_COPY` of a page it
//! keeps ready) serves a thread that drops one page (`MADV_DONTNEED`) and touches it, page
//! after page. What is left is the kernel's fault path and the two wake-ups (the faulting
//! thread's of the handler, the copy's of the faulting thread), measured with both threads
//! held on one CPU and on two: on a VM whose idle vCPUs halt, a wake-up into another vCPU
//! costs more than everything ztier does for a fault, and where the faulting thread runs is
//! the scheduler's choice, not the handler's. On two CPUs it is measured again with a CPU
//! latency request held (`cpu_latency_qos.rs`, as a region's fault thread holds one while
//! faults come), where the process may make one: what is left of the crossing when idle
//! CPUs poll. Last, with the request still held where it could be made, the handler places
//! itself as a region's fault thread does by default (placement.rs: idle priority,
//! following the faulting thread, a guard; a read before any wait after serving, the looks
//! where fault.rs makes them; but always waiting in `poll`, never parked in a read) and the
//! faulting thread runs where the scheduler puts it: the round trip, tail included, that a
//! region's own placement allows on this machine, with none of its work. A bench sets a
//! region's latency beside these, measured in the same run.
//!
//! Invariants: the mapping is this module's alone, read only by the measuring thread and
//! written only by the kernel's copies; the handler never touches it; the threads (the
//! toucher, the handler, the placed handler's guard) are this module's own, so pinning them
//! or changing their priority changes no one else's placement. No locks but the guard's own
//! sleep (placement.rs).

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::cpu_latency_qos::{self, CpuLatencyQos};
use crate::mapping::PlainPages;
use crate::placement::{self, Follow, Placement};
use crate::userfaultfd::{self, Msg, Uffd, Waker};
use crate::{Error, Result};

/// Pages the measuring thread cycles through (each dropped before it is touched again).
const PAGES: usize = 256;

/// The bare round trip's latencies, each from the touch to its return, in the order taken.
#[derive(Debug, Clone, Default)]
pub struct Floor {
    /// The handler and the faulting thread held on one CPU (each wake-up a context switch).
    pub one_cpu: Vec<Duration>,
    /// Held on two different CPUs (each wake-up crosses to the other), if the process may
    /// use two.
    pub two_cpus: Option<Vec<Duration>>,
    /// On two CPUs with a CPU latency request of 0 µs held (idle CPUs poll instead of
    /// halting), if the process may use two CPUs and make the request.
    pub two_cpus_latency_qos: Option<Vec<Duration>>,
    /// The handler placed as a region's fault thread places itself by default (placement.rs:
    /// idle priority, following the faulting thread, the guard), the faulting thread left
    /// where the scheduler puts it, and the CPU latency request held where the process may
    /// make one: the round trip a region's own placement allows on this machine, its tail
    /// included (the ticks and moves that land in a fault). Measured where the process has
    /// two CPUs and may leave idle priority again.
    pub placed_as_region: Option<Vec<Duration>>,
    /// The machine's CPU latency target (µs, the least of every process's requests) while
    /// `two_cpus` was measured, where it can be read: 2000 s when nobody asks for anything;
    /// lower, and `two_cpus` is no longer the machine's own halting floor.
    pub latency_target_us: Option<i32>,
    /// The cpuidle driver (`/sys/devices/system/cpu/cpuidle/current_driver`), which decides
    /// what a request changes: its state 0 polls on x86's haltpoll, intel_idle, acpi_idle.
    pub cpuidle_driver: Option<String>,
}

/// `samples` single-page faults served by a bare userfaultfd handler on one CPU, and as
/// many on two (without and with a CPU latency request) and placed as a region's fault
/// thread, where the process may (see [`Floor`]). Needs what a region needs (userfaultfd,
/// allowed to this process).
pub fn bare_fault_latency(samples: usize) -> Result<Floor> {
    let cpus = placement::allowed_cpus();
    let first = cpus.first().copied().unwrap_or(0);
    let one_cpu = measure(samples, Placing::Pinned(first, first))?;
    let cpuidle_driver = std::fs::read_to_string("/sys/devices/system/cpu/cpuidle/current_driver")
        .ok()
        .map(|d| d.trim().to_string());
    let Some(&second) = cpus.get(1) else {
        return Ok(Floor {
            one_cpu,
            cpuidle_driver,
            ..Floor::default()
        });
    };
    let latency_target_us = cpu_latency_qos::machine_target();
    let two_cpus = Some(measure(samples, Placing::Pinned(first, second))?);
    let qos = CpuLatencyQos::open(true);
    qos.hold(Instant::now());
    let two_cpus_latency_qos = if qos.held() {
        Some(measure(samples, Placing::Pinned(first, second))?)
    } else {
        None
    };
    // Still holding the request (if made), as a region's fault thread does while faults
    // come.
    let placement = Placement::new(true);
    let placed_as_region = if placement.usable() {
        Some(measure(samples, Placing::AsRegion(&placement))?)
    } else {
        None
    };
    Ok(Floor {
        one_cpu,
        two_cpus,
        two_cpus_latency_qos,
        placed_as_region,
        latency_target_us,
        cpuidle_driver,
    })
}

/// The median of `samples` bare round trips placed as a region's fault thread places itself
/// by default, the CPU latency request held if `latency_qos` and the process may make it
/// (where the process has one CPU or may not leave idle priority again: both threads on
/// that CPU). Nearly all of it is what a fault costs its thread beyond the fault thread's
/// own work (the trap, the two wake-ups): what a self-sizing region's stall clock adds a
/// fault (autosize.rs).
pub fn round_trip_median(samples: usize, latency_qos: bool) -> Result<Duration> {
    let qos = CpuLatencyQos::open(latency_qos);
    qos.hold(Instant::now());
    let placement = Placement::new(true);
    let mut taken = measure(samples.max(1), Placing::as_region_or_one_cpu(&placement))?;
    taken.sort_unstable();
    Ok(taken[taken.len() / 2])
}

/// Where the two threads of a measurement run.
pub(super) enum Placing<'a> {
    /// The toucher held on the first CPU, the handler on the second.
    Pinned(usize, usize),
    /// The toucher where the scheduler puts it; the handler places itself as a region's
    /// fault thread does: it follows the thread whose fault it read ([`Follow`]), at idle
    /// priority while one thread faults, with a guard that ends idle priority should faults
    /// starve.
    AsRegion(&'a Placement),
}

impl Placing<'_> {
    /// Placed as a region's fault thread places itself by default, where the process has two
    /// CPUs and `placement` is usable; else both threads on the first allowed CPU.
    pub(super) fn as_region_or_one_cpu(placement: &Placement) -> Placing<'_> {
        let cpus = placement::allowed_cpus();
        if cpus.len() > 1 && placement.usable() {
            Placing::AsRegion(placement)
        } else {
            let cpu = cpus.first().copied().unwrap_or(0);
            Placing::Pinned(cpu, cpu)
        }
    }
}

/// The round trips of a toucher served by a bare handler, placed as `placing` says.
fn measure(samples: usize, placing: Placing) -> Result<Vec<Duration>> {
    let page_size = ztier_base::os::page_size();
    let os = |what| move |source| Error::Os { what, source };
    let uffd = Uffd::open().map_err(Error::NotPermitted)?;
    uffd.api(userfaultfd::FEATURE_THREAD_ID)
        .map_err(os("UFFDIO_API"))?;
    let mut map = PlainPages::new(PAGES * page_size).map_err(os("mmap"))?;
    uffd.register(map.addr(), map.len() as u64, userfaultfd::MODE_MISSING)
        .map_err(os("UFFDIO_REGISTER"))?;
    let content = vec![0x5au8; page_size];
    let serve = |addr: u64| {
        // EEXIST (already there) or EAGAIN: the touch faults again.
        let _ = uffd.copy(addr & !(page_size as u64 - 1), &content);
        Ok(())
    };
    beside_bare_handler(&uffd, placing, serve, |failed| {
        let mut taken = Vec::with_capacity(samples);
        for i in 0..samples {
            let offset = (i % PAGES) * page_size;
            // The handler's copy goes, so that the touch faults again.
            map.drop_pages(offset, page_size).map_err(os("madvise"))?;
            let t = Instant::now();
            // The read faults, the handler fills the page, and the read returns.
            let byte = map.touch(offset);
            taken.push(t.elapsed());
            std::hint::black_box(byte);
            if failed.load(Relaxed) {
                return Err(handler_failed());
            }
        }
        Ok(taken)
    })
}

/// What the toucher returns once the bare handler has stopped reading.
pub(super) fn handler_failed() -> Error {
    Error::Os {
        what: "reading the userfaultfd",
        source: std::io::Error::other("the bare handler's read failed"),
    }
}

/// Runs `touch` on a thread of its own (held where `placing` says) beside a bare handler
/// thread, placed as `placing` says, that reads `uffd`'s messages and calls `serve` with each
/// page fault's address, until `touch` returns. Where a read or `serve` fails, the handler
/// sets the flag `touch` is given and shuts the descriptor (a touch waiting then, or made
/// later, is the kernel's own), and `serve`'s error is the outcome.
pub(super) fn beside_bare_handler<T: Send>(
    uffd: &Uffd,
    placing: Placing,
    mut serve: impl FnMut(u64) -> Result<()> + Send,
    touch: impl FnOnce(&AtomicBool) -> Result<T> + Send,
) -> Result<T> {
    let waker = Waker::new().map_err(|source| Error::Os {
        what: "eventfd",
        source,
    })?;
    let (stop, failed) = (AtomicBool::new(false), AtomicBool::new(false));
    let placement = match placing {
        Placing::AsRegion(placement) => Some(placement),
        Placing::Pinned(..) => None,
    };
    std::thread::scope(|s| -> Result<T> {
        let guard = placement.map(|p| s.spawn(|| p.run_guard(|| uffd.unread())));
        let handler = s.spawn(|| -> Result<()> {
            let mut follow = match placing {
                Placing::Pinned(_, handler) => {
                    placement::pin_to_cpu(handler);
                    None
                }
                Placing::AsRegion(p) => Some(Follow::start(p)),
            };
            let mut msgs = [Msg::default(); 16];
            let mut after_serving = false;
            let mut outcome = Ok(());
            'reading: while !stop.load(Relaxed) {
                // Placed as a region's: after a turn that served a fault, a read before any
                // wait (the faulting thread's next fault is usually in by then), and only if
                // nothing is in, the looks where the faulting thread runs, as the fault
                // thread makes them (fault.rs); it waits in `poll`, never parked in a read.
                let mut got = Ok(0);
                if let Some(follow) = follow.as_mut().filter(|_| after_serving) {
                    got = uffd.read(&mut msgs);
                    if matches!(got, Ok(0)) {
                        follow.maybe_apart();
                        follow.look_if_due();
                    }
                }
                if matches!(got, Ok(0)) {
                    if !uffd.poll(&waker, -1).uffd {
                        continue;
                    }
                    got = uffd.read(&mut msgs);
                }
                let Ok(n) = got else {
                    // Closed, the range unregistered: a touch waiting now, or made later,
                    // is the kernel's own (and the measuring thread stops).
                    failed.store(true, Relaxed);
                    uffd.shutdown();
                    break;
                };
                after_serving = false;
                for (i, m) in msgs[..n].iter().enumerate() {
                    if m.event != userfaultfd::EVENT_PAGEFAULT {
                        continue;
                    }
                    if let Some(follow) = follow.as_mut() {
                        // The faulting thread's id (`UFFD_FEATURE_THREAD_ID`).
                        follow.fault(m.arg[2]);
                    }
                    if let Some(p) = placement.filter(|_| i + 1 == n) {
                        // The last: nothing waits after its copy (as fault.rs says).
                        p.holding(false);
                    }
                    if let Err(e) = serve(m.arg[1]) {
                        outcome = Err(e);
                        failed.store(true, Relaxed);
                        uffd.shutdown();
                        break 'reading;
                    }
                    if let Some(p) = placement {
                        p.progress();
                    }
                    after_serving = true;
                }
                if let Some(p) = placement {
                    p.holding(false);
                }
            }
            if let Some(p) = placement {
                p.done();
            }
            outcome
        });
        let toucher = s.spawn(|| -> Result<T> {
            if let Placing::Pinned(toucher, _) = placing {
                placement::pin_to_cpu(toucher);
            }
            touch(&failed)
        });
        let touched = toucher.join().unwrap_or_else(|_| {
            Err(Error::Os {
                what: "measuring the floor",
                source: std::io::Error::other("the measuring thread panicked"),
            })
        });
        stop.store(true, Relaxed);
        waker.wake();
        let served = handler.join().unwrap_or_else(|_| {
            Err(Error::Os {
                what: "measuring the floor",
                source: std::io::Error::other("the bare handler panicked"),
            })
        });
        if let (Some(p), Some(guard)) = (placement, guard) {
            // The handler has ended (`done`): the guard acts on its id no more.
            p.stop();
            let _ = guard.join();
        }
        served.and(touched)
    })
}
