//! A bare handler's sequential fault-in of whole units on this machine: the reference a
//! region's fault-in at a larger unit is measured against (ztier-replay's `uffd_units`),
//! the same work with none of a region's own in it. A thread touches a word of every page
//! of an empty mapping in order; a bare handler serves each fault as a region's fault thread
//! serves one on a stored page with fault-around (fault_around.rs): the faulting page's
//! unit read (decompressed, or found all zeros), the faulting page put in alone (which wakes
//! its thread), then the rest of the window (up to `window` pages after the faulting one,
//! on to the end of a unit) read, and put in with one `UFFDIO_COPY` for each run of units
//! with content and one `UFFDIO_ZEROPAGE` for each run of units of zeros. A fault on a page
//! already in (the toucher ran into the window while it was read) is only woken. The
//! handler is placed as a region's fault thread places itself (floor.rs). What it leaves
//! out is what a region adds: its page table, states and locks, its store's lookups, its
//! figures; what it keeps is what a handler cannot leave out (the decompression, the
//! copies, the zero pages' mappings, the traps and wake-ups, the waits between faults).
//!
//! Invariants: the mapping is this module's alone, read only by the toucher and written
//! only by the kernel's copies; the handler never touches it. The units are read into the
//! handler's own buffer; the threads are this module's own (floor.rs). No locks.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use crate::cpu_latency_qos::CpuLatencyQos;
use crate::mapping::PlainPages;
use crate::placement::{self, Placement};
use crate::rig::floor::{beside_bare_handler, handler_failed, Placing};
use crate::userfaultfd::{self, Uffd};
use crate::{Error, Result};

/// What reading a unit found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitRead {
    /// Its bytes are in the buffer.
    Content,
    /// All zeros: its pages are mapped to the zero page, nothing copied.
    Zeros,
}

/// One bare sequential fault-in.
#[derive(Debug, Clone, Copy)]
pub struct BareFaultIn {
    /// From the first touch to the last one's return.
    pub seconds: f64,
    /// Faults the handler read (a fault on a page already in included).
    pub faults: u64,
    /// Pages it put in (copied or mapped to the zero page): every page of the mapping.
    pub pages_in: u64,
    /// The sum of the byte the toucher read at the start of each page: what the units'
    /// first bytes sum to, if every page came in where it belongs.
    pub first_bytes_sum: u64,
}

impl BareFaultIn {
    /// MB of pages a second.
    pub fn mb_s(&self, page_size: usize) -> f64 {
        self.pages_in as f64 * page_size as f64 / self.seconds.max(f64::EPSILON) / 1e6
    }
}

/// A sequential fault-in of `pages` pages in units of `unit_pages`, `window` pages brought
/// in after each faulting one (a region's `fault_around`, at its widest), write-protected
/// if `write_protect` (a region's clean pages), the handler placed as a region's fault
/// thread (at idle priority if `idle_priority`, a CPU latency request held if
/// `latency_qos`, where the process may). `read_unit(u,
/// buf)` reads unit `u` into `buf` (`unit_pages` pages) and says what it found; its error
/// ends the pass with that error.
pub fn sequential_fault_in(
    pages: usize,
    unit_pages: usize,
    window: usize,
    write_protect: bool,
    idle_priority: bool,
    latency_qos: bool,
    mut read_unit: impl FnMut(usize, &mut [u8]) -> std::result::Result<UnitRead, String> + Send,
) -> Result<BareFaultIn> {
    let ps = ztier_base::os::page_size();
    let upp = unit_pages.max(1);
    if pages == 0 {
        return Ok(BareFaultIn {
            seconds: 0.0,
            faults: 0,
            pages_in: 0,
            first_bytes_sum: 0,
        });
    }
    let os = |what| move |source| Error::Os { what, source };
    let uffd = Uffd::open().map_err(Error::NotPermitted)?;
    uffd.api(userfaultfd::FEATURE_THREAD_ID)
        .map_err(os("UFFDIO_API"))?;
    let map = PlainPages::new(pages.max(1) * ps).map_err(os("mmap"))?;
    let mode = match write_protect {
        true => userfaultfd::MODE_MISSING | userfaultfd::MODE_WP,
        false => userfaultfd::MODE_MISSING,
    };
    uffd.register(map.addr(), map.len() as u64, mode)
        .map_err(os("UFFDIO_REGISTER"))?;
    let qos = CpuLatencyQos::open(latency_qos);
    qos.hold(Instant::now());
    // Placed as a region's fault thread places itself, at idle priority or not (it follows
    // the faulting thread either way); both threads on one CPU where there is one.
    let placement = Placement::new(idle_priority);
    let placing = match placement::allowed_cpus()[..] {
        [] => Placing::Pinned(0, 0),
        [cpu] => Placing::Pinned(cpu, cpu),
        _ => Placing::AsRegion(&placement),
    };

    let base_addr = map.addr();
    let mut brought = vec![false; pages];
    let mut faults = 0u64;
    let mut pages_in = 0u64;
    // The units of the widest window: the faulting page's and those the window reaches.
    let mut buf = vec![0u8; (window + 2 * upp).next_multiple_of(upp) * ps];
    let mut reads = Vec::with_capacity(buf.len() / (upp * ps));
    let uffd = &uffd;
    let ioctl = |what: &'static str| {
        move |e: i32| Error::Os {
            what,
            source: std::io::Error::from_raw_os_error(e),
        }
    };
    // Pages of one kind put in at `dst`: `bytes` copied, or as many pages of zeros mapped.
    let put_in = |dst: u64, bytes: &[u8], kind: UnitRead| match kind {
        UnitRead::Content => uffd.copy_run(dst, bytes, write_protect).1,
        UnitRead::Zeros => uffd.zeropage(dst, bytes.len() as u64),
    };
    let serve = |addr: u64| -> Result<()> {
        faults += 1;
        let page = ((addr - base_addr) / ps as u64) as usize;
        let at = |q: usize| base_addr + (q * ps) as u64;
        if page >= pages || brought[page] {
            // In already (the window's copy woke the touch): a wake, as a region's.
            uffd.wake(at(page.min(pages - 1)), ps as u64);
            return Ok(());
        }
        let base = page - page % upp;
        let reach = (page + 1 + window).next_multiple_of(upp).min(pages);
        let end = (page + 1..reach).find(|&q| brought[q]).unwrap_or(reach);
        let units = (base / upp)..end.div_ceil(upp);
        let mut read = |u: usize, buf: &mut [u8]| {
            read_unit(u, buf).map_err(|why| Error::Os {
                what: "reading a unit for the bare handler",
                source: std::io::Error::other(why),
            })
        };
        // The faulting page's unit, then the page alone: its thread runs on.
        reads.clear();
        reads.push(read(units.start, &mut buf[..upp * ps])?);
        let off = (page - base) * ps;
        match put_in(at(page), &buf[off..off + ps], reads[0]) {
            Ok(()) => {}
            // Present already (not by this handler: nothing else maps here): woken as is.
            Err(libc::EEXIST) => uffd.wake(at(page), ps as u64),
            Err(e) => return Err(ioctl("UFFDIO_COPY of the faulting page")(e)),
        }
        brought[page] = true;
        pages_in += 1;
        // The rest of the window's units, then its pages in runs of units alike.
        for u in units.clone().skip(1) {
            let from = (u * upp - base) * ps;
            reads.push(read(u, &mut buf[from..from + upp * ps])?);
        }
        let mut q = page + 1;
        while q < end {
            let kind = reads[(q - base) / upp];
            let mut run_end = (q / upp + 1) * upp;
            while run_end < end && reads[(run_end - base) / upp] == kind {
                run_end += upp;
            }
            let run_end = run_end.min(end);
            let len = (run_end - q) * ps;
            let from = (q - base) * ps;
            if let Err(e) = put_in(at(q), &buf[from..from + len], kind) {
                return Err(ioctl("UFFDIO_COPY of a window")(e));
            }
            brought[q..run_end].fill(true);
            pages_in += (run_end - q) as u64;
            q = run_end;
        }
        Ok(())
    };
    let (seconds, first_bytes_sum) = beside_bare_handler(uffd, placing, serve, |failed| {
        let began = Instant::now();
        let mut sum = 0u64;
        for page in 0..pages {
            sum += u64::from(map.touch(page * ps));
        }
        let seconds = began.elapsed().as_secs_f64();
        if failed.load(Relaxed) {
            return Err(handler_failed());
        }
        Ok((seconds, sum))
    })?;
    Ok(BareFaultIn {
        seconds,
        faults,
        pages_in,
        first_bytes_sum,
    })
}
