//! How a region is made ([`RegionConfig`]): its device (compressor, allocator, unit, store
//! limit), how its fault thread serves (fault-around, clean pages, idle priority, the CPU
//! latency request) and its budget's controller. A plain value, checked when a region is
//! made ([`RegionConfig::device_unit`], `AutosizeConfig::limits`).

use ztier_compress::Algorithm;
use ztier_pool::AllocatorKind;

use crate::autosize::AutosizeConfig;
use crate::error::{Error, Result};

/// How a region makes its own device.
#[derive(Debug, Clone)]
pub struct RegionConfig {
    pub algorithm: Algorithm,
    pub allocator: AllocatorKind,
    /// The device's memory limit in bytes (0: none): a store past it fails and the page
    /// stays resident.
    pub store_limit: u64,
    /// The most pages a fault brings in after its own (0: none): stored pages, and the
    /// pages among and after them an evictor found all zeros (as the zero page; at larger
    /// units, those inside a unit read as pages of zeros with its copy).
    pub fault_around: usize,
    /// Whether a page read in from the store keeps its copy there, so that evicting it
    /// again unwritten costs no compression or store write (module's "Clean pages"). Off,
    /// every page comes in dirty: for a program that writes nearly every page it reads,
    /// where each first write would cost a write-protect fault.
    pub clean_pages: bool,
    /// Whether clean pages' copies give way once the store is full, as the kernel frees a
    /// swap slot once more than half of swap is used (`vm_swap_full()`): the region's store
    /// is taken to be as large as the pages its budget leaves out, and full once it holds
    /// copies of more than half that many, stored or clean. From there a read fault brings
    /// its pages in dirty, their copies freed (zswap's exclusive load), and the clock frees
    /// the copy of each clean page it gives a second chance (vmscan's `folio_free_swap()`
    /// on activation): under a budget, a page's two copies cost memory the budget was set
    /// to save. With no budget under the region's pages, no page read back keeps its copy.
    /// At page-sized units only (a larger unit's object would stay whole). Off (the default),
    /// a page read in keeps its copy until it is written or dropped (module's "Clean
    /// pages").
    pub free_copies_when_full: bool,
    /// Whether the fault thread may run at idle priority (`SCHED_IDLE`) while a single
    /// thread faults, which keeps that thread on the fault thread's CPU: on a machine whose
    /// idle CPUs halt (a VM), a fault's two wake-ups across CPUs cost ten times the rest of
    /// it. Used only where the process may leave idle priority again (`CAP_SYS_NICE` or an
    /// `RLIMIT_NICE` of 20); taken back whenever faults wait for it (module `placement`).
    pub idle_priority: bool,
    /// Whether the fault thread asks the machine, through the kernel's CPU latency QoS
    /// (`/dev/cpu_dma_latency`, root's by default), to keep idle CPUs out of states slower
    /// to leave than polling, from a fault until none has come for 10 ms. When the
    /// scheduler puts the faulting thread and the fault thread on different CPUs, each of
    /// a fault's two wake-ups goes to a CPU that went idle in between; on a VM whose idle
    /// vCPUs halt at once each is an interrupt into a halted vCPU, which makes a fault
    /// several times slower (docs/diary.md has the figures). The price is power
    /// (on a VM, the host's CPU time): while the request is held, every idle CPU of the
    /// machine polls instead of halting, where its cpuidle driver's first state polls
    /// (x86's `haltpoll`, `intel_idle`, `acpi_idle`; elsewhere the request changes nothing).
    /// Where the device cannot be opened the region runs without it (module
    /// `cpu_latency_qos`).
    pub cpu_latency_qos: bool,
    /// A budget that sizes itself from the region's stall share, under a cap (module
    /// `autosize`): the budget given at creation is where it starts (brought within the
    /// config's floor and cap). `None`: the budget stays where it is set.
    pub autosize: Option<AutosizeConfig>,
    /// Bytes of the device's compression unit: 4096 (the default; a page at larger OS
    /// pages), the kernel's zram, page by page, or 16 or 64 KiB (a power of two up to
    /// [`ztier_zram::MAX_UNIT_SIZE`]), which compress better and faster, and whose stored
    /// pages a fault brings in a unit at a time, each unit decompressed once (lib.rs,
    /// "Compression units"). Anything else is refused ([`Error::BadUnitSize`]).
    pub unit_size: usize,
}

/// The default of [`RegionConfig::fault_around`]: a sequential touch reaches windows of 63
/// pages (256 KiB) after six faults. Each window costs two faults (its first page, then the
/// rest, which the faulting thread runs into while they are decompressed), so a larger one
/// spreads them thinner: free sequential fault-in on postgres and python 1.15-1.19x what
/// windows of 15 gave, cc1 (slower to decompress) the same; random reads and single-page
/// latency unchanged (docs/diary.md, 2026-11-27).
pub const MAX_AROUND: usize = 63;

impl Default for RegionConfig {
    fn default() -> Self {
        RegionConfig {
            algorithm: Algorithm::new(ztier_compress::Kind::Lz4),
            allocator: AllocatorKind::Zsmalloc,
            store_limit: 0,
            fault_around: MAX_AROUND,
            clean_pages: true,
            free_copies_when_full: false,
            idle_priority: true,
            cpu_latency_qos: true,
            autosize: None,
            unit_size: 4096,
        }
    }
}

impl RegionConfig {
    /// The device's unit for pages of `page_size` bytes: [`unit_size`](Self::unit_size),
    /// or the page where that is smaller; refused if it is not a power of two from 4096 up
    /// to [`ztier_zram::MAX_UNIT_SIZE`].
    pub fn device_unit(&self, page_size: usize) -> Result<usize> {
        let unit_size = self.unit_size;
        if !unit_size.is_power_of_two() || !(4096..=ztier_zram::MAX_UNIT_SIZE).contains(&unit_size)
        {
            return Err(Error::BadUnitSize {
                unit_size,
                page_size,
                max_unit: ztier_zram::MAX_UNIT_SIZE,
            });
        }
        Ok(unit_size.max(page_size))
    }
}
