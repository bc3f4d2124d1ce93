//! A hint to the CPU that a line of memory will be read soon, so that a miss on it can
//! overlap another: zsmalloc's read learns where an object lies (its handle entry) before
//! it learns the zspage that proves it (a second miss), and asks for the object's line
//! between the two.
//!
//! Invariant: a prefetch is only a hint. It reads nothing the program sees, never faults
//! (an address that is unmapped, freed or wrong is ignored) and needs no pointer, only an
//! address, so a stale hint costs at most a wasted line fetch.
#![allow(unsafe_code)]

/// Asks for the cache line holding `addr` ahead of a read of it. Does nothing on targets
/// without a stable prefetch instruction.
#[inline(always)]
pub fn prefetch_read(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: the intrinsic's only requirement is SSE, part of every x86_64 CPU; a
        // prefetch never dereferences its operand in the program's sense (no fault, no
        // value), so any address is sound.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::without_provenance(addr)) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
