//! The C ABI (`include/ztier_uffd.h`): create (with the defaults, or flags, or flags and a
//! compression unit), pointer,
//! length, statistics (`ztier_region_get_stats`), the self-sizing budget
//! (`ztier_region_set_autosize`, `ztier_region_autosize_history`), destroy.
//!
//! Invariants: a `ztier_region *` is a `Box<Region>` made by `ztier_region_create` and
//! freed only by `ztier_region_destroy`; errors are reported through `errno`, nothing
//! panics across the boundary (every function here is infallible or returns the error).
#![allow(unsafe_code)]

use std::time::Duration;

use crate::{AutosizeConfig, AutosizeStats, Error, Region, RegionConfig, LATENCY_BUCKETS};

/// `ztier_region_stats`, field for field: 8-byte fields only, so it has no padding and any
/// prefix of it is a prefix of its fields (what a caller built against an older header
/// asks for). New fields go at the end.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CStats {
    size: u64,
    pages: u64,
    budget_pages: u64,
    resident_pages: u64,
    stored_pages: u64,
    held_pages: u64,
    faults: u64,
    zero_faults: u64,
    evictions: u64,
    zero_evictions: u64,
    evict_failures: u64,
    removed_pages: u64,
    unmapped_pages: u64,
    compr_data_size: u64,
    mem_used_total: u64,
    clean_pages: u64,
    evictions_clean: u64,
    cpu_latency_qos_usable: u64,
    cpu_latency_qos_held: u64,
    cpu_latency_qos_holds: u64,
    reclaim_target_pages: u64,
    held_faults: u64,
    spurious_faults: u64,
    first_write_faults: u64,
    evictions_dirty: u64,
    remapped_pages: u64,
    poisoned_pages: u64,
    deferred_faults: u64,
    fault_around_pages: u64,
    refaults: u64,
    written_back_pages: u64,
    fault_latency_us: [u64; LATENCY_BUCKETS],
    orig_data_size: u64,
    mem_used_max: u64,
    same_pages: u64,
    huge_pages: u64,
    mem_limit: u64,
    pages_compacted: u64,
    huge_pages_since: u64,
    idle_priority_usable: u64,
    idle_priority: u64,
    idle_priority_demotions: u64,
    fault_thread_moves: u64,
    bd_reads: u64,
    bd_writes: u64,
    bd_bytes_written: u64,
    bd_bytes_stored: u64,
    bd_bytes_held: u64,
    bd_failed_writebacks: u64,
    parked_reads: u64,
    fault_thread_rung: u64,
    reclaim_looks: u64,
    reclaim_blocked: u64,
    reclaim_blocked_passes: u64,
    stall_us: u64,
    stall_share_ppm: u64,
    autosize_state: u64,
    autosize_target_ppm: u64,
    autosize_floor_pages: u64,
    autosize_cap_pages: u64,
    autosize_steps: u64,
    autosize_shrinks: u64,
    autosize_grows: u64,
    store_reads: u64,
    autosize_fault_overhead_ns: u64,
    lost_pages: u64,
    unreported_moves: u64,
    vanished_pages: u64,
    copies_freed: u64,
    fault_hold_pages: u64,
    budget_held_faults: u64,
}

/// `ztier_region_autosize`: `AutosizeConfig` for C.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CAutosize {
    target_stall: f64,
    band: f64,
    cap: u64,
    floor: u64,
    shrink_step: f64,
    grow_step: f64,
    interval_ms: u64,
}

/// `ztier_region_autosize_step`: `AutosizeStep` for C.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CAutosizeStep {
    at_ms: u64,
    stall_ppm: u64,
    resident_pages: u64,
    budget_pages: u64,
    state: u64,
}

const _: () = assert!(size_of::<CAutosize>() == 7 * 8 && size_of::<CAutosizeStep>() == 5 * 8);

/// The header's `ZTIER_REGION_LATENCY_BUCKETS` and its struct's size (the C test checks its
/// side: `sizeof(ztier_region_stats)`, and the size this library fills).
const _: () = assert!(LATENCY_BUCKETS == 16 && size_of::<CStats>() == 86 * 8);

/// The fields every caller has: `size` itself.
const STATS_HEADER: usize = size_of::<u64>();

/// `ZTIER_REGION_NO_CPU_LATENCY_QOS`: `RegionConfig::cpu_latency_qos` off.
const NO_CPU_LATENCY_QOS: u32 = 1;
/// `ZTIER_REGION_FREE_COPIES_WHEN_FULL`: `RegionConfig::free_copies_when_full` on.
const FREE_COPIES_WHEN_FULL: u32 = 2;

fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno, always valid to write.
    unsafe { *libc::__errno_location() = e };
}

#[no_mangle]
pub extern "C" fn ztier_region_create(length: usize, budget: usize) -> *mut Region {
    ztier_region_create_flags(length, budget, 0)
}

#[no_mangle]
pub extern "C" fn ztier_region_create_flags(
    length: usize,
    budget: usize,
    flags: u32,
) -> *mut Region {
    ztier_region_create_unit(length, budget, flags, RegionConfig::default().unit_size)
}

#[no_mangle]
pub extern "C" fn ztier_region_create_unit(
    length: usize,
    budget: usize,
    flags: u32,
    unit_size: usize,
) -> *mut Region {
    if flags & !(NO_CPU_LATENCY_QOS | FREE_COPIES_WHEN_FULL) != 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let config = RegionConfig {
        cpu_latency_qos: flags & NO_CPU_LATENCY_QOS == 0,
        free_copies_when_full: flags & FREE_COPIES_WHEN_FULL != 0,
        unit_size,
        ..RegionConfig::default()
    };
    match Region::with_config(length, budget, &config) {
        Ok(r) => Box::into_raw(Box::new(r)),
        Err(e) => {
            set_errno(match e {
                Error::BadLength { .. } | Error::BadBudget { .. } | Error::BadUnitSize { .. } => {
                    libc::EINVAL
                }
                Error::NotPermitted(_) => libc::EPERM,
                Error::Unsupported(_) => libc::ENOSYS,
                _ => libc::ENOMEM,
            });
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// `region` is NULL or a live region from `ztier_region_create`.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_ptr(region: *const Region) -> *mut libc::c_void {
    // SAFETY: the caller's contract.
    match unsafe { region.as_ref() } {
        Some(r) => r.as_ptr().cast(),
        None => std::ptr::null_mut(),
    }
}

/// # Safety
/// As `ztier_region_ptr`.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_len(region: *const Region) -> usize {
    // SAFETY: the caller's contract.
    unsafe { region.as_ref() }.map_or(0, Region::len)
}

/// # Safety
/// As `ztier_region_ptr`; `out` is NULL or points to a writable `ztier_region_stats`
/// prefix of `out->size` bytes (the caller's `sizeof`, set before the call).
#[no_mangle]
pub unsafe extern "C" fn ztier_region_get_stats(region: *const Region, out: *mut CStats) -> i32 {
    // SAFETY: the caller's contract.
    let (Some(r), false) = (unsafe { region.as_ref() }, out.is_null()) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: `out` points to at least the size field (the contract); read unaligned in
    // case a caller's buffer is not aligned for it.
    let asked = unsafe { out.cast::<u64>().read_unaligned() };
    if asked < STATS_HEADER as u64 {
        set_errno(libc::EINVAL);
        return -1;
    }
    let mut c = c_stats(&r.stats());
    // A caller built against a shorter struct gets the fields it knows; a longer one learns
    // how many this library filled.
    let filled = (asked as usize).min(size_of::<CStats>()) / size_of::<u64>() * size_of::<u64>();
    c.size = filled as u64;
    // SAFETY: `filled` bytes: no more than the caller's `size` (which it says are
    // writable) nor than `c` holds; `c` is a local, so the two do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            std::ptr::from_ref(&c).cast::<u8>(),
            out.cast::<u8>(),
            filled,
        )
    };
    0
}

/// # Safety
/// As `ztier_region_ptr`; `buf` is NULL (with `len` 0) or points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_last_error(
    region: *const Region,
    buf: *mut libc::c_char,
    len: usize,
) -> usize {
    // SAFETY: the caller's contract.
    let Some(r) = (unsafe { region.as_ref() }) else {
        return 0;
    };
    let text = r.last_error().unwrap_or_default();
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: `n + 1 <= len` bytes, which the caller says are writable; `text` is
        // ours, so the two do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    text.len()
}

/// # Safety
/// `out` points to a writable `ztier_region_autosize`.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_autosize_defaults(out: *mut CAutosize, cap: u64) {
    let d = AutosizeConfig::with_cap(usize::try_from(cap).unwrap_or(usize::MAX));
    let c = CAutosize {
        target_stall: d.target_stall,
        band: d.band,
        cap,
        floor: d.floor as u64,
        shrink_step: d.shrink_step,
        grow_step: d.grow_step,
        interval_ms: d.interval.as_millis() as u64,
    };
    // SAFETY: the caller's contract; NULL is ignored.
    if let Some(out) = unsafe { out.as_mut() } {
        *out = c;
    }
}

/// # Safety
/// As `ztier_region_ptr`; `config` is NULL (stop sizing) or points to a readable
/// `ztier_region_autosize`.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_set_autosize(
    region: *const Region,
    config: *const CAutosize,
) -> i32 {
    // SAFETY: the caller's contract.
    let Some(r) = (unsafe { region.as_ref() }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: the caller's contract.
    let config = unsafe { config.as_ref() }.map(|c| AutosizeConfig {
        target_stall: c.target_stall,
        band: c.band,
        cap: usize::try_from(c.cap).unwrap_or(usize::MAX),
        floor: usize::try_from(c.floor).unwrap_or(usize::MAX),
        shrink_step: c.shrink_step,
        grow_step: c.grow_step,
        interval: Duration::from_millis(c.interval_ms),
        fault_overhead: None,
    });
    match r.set_autosize(config) {
        Ok(()) => 0,
        Err(_) => {
            set_errno(libc::EINVAL);
            -1
        }
    }
}

/// # Safety
/// As `ztier_region_ptr`; `out` is NULL (with `max` 0) or points to `max` writable
/// `ztier_region_autosize_step`s.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_autosize_history(
    region: *const Region,
    out: *mut CAutosizeStep,
    max: usize,
) -> usize {
    // SAFETY: the caller's contract.
    let Some(r) = (unsafe { region.as_ref() }) else {
        return 0;
    };
    let Some(AutosizeStats { history, .. }) = r.stats().autosize else {
        return 0;
    };
    if !out.is_null() {
        let newest = &history[history.len().saturating_sub(max)..];
        for (i, h) in newest.iter().enumerate() {
            let step = CAutosizeStep {
                at_ms: h.at_ms,
                stall_ppm: h.stall_ppm,
                resident_pages: h.resident_pages,
                budget_pages: h.budget_pages,
                state: h.state.code(),
            };
            // SAFETY: `i < newest.len() <= max`, which the caller says are writable.
            unsafe { out.add(i).write_unaligned(step) };
        }
    }
    history.len()
}

fn c_stats(s: &crate::RegionStats) -> CStats {
    let bd = s.bd_stat.unwrap_or_default();
    let a = s.autosize.as_ref();
    CStats {
        size: size_of::<CStats>() as u64,
        pages: s.pages,
        budget_pages: s.budget_pages,
        resident_pages: s.resident_pages,
        stored_pages: s.stored_pages,
        held_pages: s.held_pages,
        faults: s.faults,
        zero_faults: s.zero_faults,
        evictions: s.evictions,
        zero_evictions: s.zero_evictions,
        evict_failures: s.evict_failures,
        removed_pages: s.removed_pages,
        unmapped_pages: s.unmapped_pages,
        compr_data_size: s.mm_stat.compr_data_size,
        mem_used_total: s.mm_stat.mem_used_total,
        clean_pages: s.clean_pages,
        evictions_clean: s.evictions_clean,
        cpu_latency_qos_usable: s.cpu_latency_qos_usable.into(),
        cpu_latency_qos_held: s.cpu_latency_qos_held.into(),
        cpu_latency_qos_holds: s.cpu_latency_qos_holds,
        reclaim_target_pages: s.reclaim_target_pages,
        held_faults: s.held_faults,
        spurious_faults: s.spurious_faults,
        first_write_faults: s.first_write_faults,
        evictions_dirty: s.evictions_dirty,
        remapped_pages: s.remapped_pages,
        poisoned_pages: s.poisoned_pages,
        deferred_faults: s.deferred_faults,
        fault_around_pages: s.fault_around_pages,
        refaults: s.refaults,
        written_back_pages: s.written_back_pages,
        fault_latency_us: s.fault_latency_us,
        orig_data_size: s.mm_stat.orig_data_size,
        mem_used_max: s.mm_stat.mem_used_max,
        same_pages: s.mm_stat.same_pages,
        huge_pages: s.mm_stat.huge_pages,
        mem_limit: s.mm_stat.mem_limit,
        pages_compacted: s.mm_stat.pages_compacted,
        huge_pages_since: s.mm_stat.huge_pages_since,
        idle_priority_usable: s.idle_priority_usable.into(),
        idle_priority: s.idle_priority.into(),
        idle_priority_demotions: s.idle_priority_demotions,
        fault_thread_moves: s.fault_thread_moves,
        bd_reads: bd.bd_reads,
        bd_writes: bd.bd_writes,
        bd_bytes_written: bd.bytes_written,
        bd_bytes_stored: bd.bytes_stored,
        bd_bytes_held: bd.bytes_held,
        bd_failed_writebacks: bd.failed_writebacks,
        parked_reads: s.parked_reads,
        reclaim_looks: s.reclaim_looks,
        reclaim_blocked: s.reclaim_blocked.into(),
        reclaim_blocked_passes: s.reclaim_blocked_passes,
        fault_thread_rung: s.fault_thread_rung,
        stall_us: s.stall_us,
        stall_share_ppm: s.stall_share_ppm,
        autosize_state: a.map_or(0, |a| a.state.code()),
        autosize_target_ppm: a.map_or(0, |a| a.target_ppm),
        autosize_floor_pages: a.map_or(0, |a| a.floor_pages),
        autosize_cap_pages: a.map_or(0, |a| a.cap_pages),
        autosize_steps: a.map_or(0, |a| a.steps),
        autosize_shrinks: a.map_or(0, |a| a.shrinks),
        autosize_grows: a.map_or(0, |a| a.grows),
        store_reads: s.store_reads,
        autosize_fault_overhead_ns: a.map_or(0, |a| a.fault_overhead_ns),
        lost_pages: s.lost_pages,
        unreported_moves: s.unreported_moves,
        vanished_pages: s.vanished_pages,
        copies_freed: s.copies_freed,
        fault_hold_pages: s.fault_hold_pages,
        budget_held_faults: s.budget_held_faults,
    }
}

/// # Safety
/// `region` is NULL or a region from `ztier_region_create` not yet destroyed, which no
/// thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn ztier_region_destroy(region: *mut Region) {
    if !region.is_null() {
        // SAFETY: made by Box::into_raw in ztier_region_create, freed once (the contract).
        drop(unsafe { Box::from_raw(region) });
    }
}
