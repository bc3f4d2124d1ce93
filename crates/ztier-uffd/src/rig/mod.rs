//! The measuring rig: what a region is measured against, not part of a region. The bench
//! (ztier-replay's uffd scenario) and the tests use it; a region never does.
//!
//! - [`floor`]: the floor under a fault's latency on this machine: the same round trip
//!   served by a bare handler, its two threads held on one CPU and on two, and placed as a
//!   region's fault thread places itself.
//! - [`copy_in`]: a part of the floor under a region's fault-in of whole units: the
//!   kernel's copy-in of ready pages, a unit at a time, with no fault.
//! - [`unit_fault_in`]: the reference under a region's sequential fault-in of whole units:
//!   the same faults served by a bare handler, each a unit read and put in with the window
//!   after it, placed as a region's fault thread places itself.
//! - [`pageout`]: the kernel's own path for the same pages, where the machine has one
//!   (`MADV_PAGEOUT` through zswap, the pages touched back).
//! - [`oracle`]: the pages MIN, LRU, CLOCK and a model of a region's own clock bring in for
//!   an access trace, holding as many pages as a region's budget.
//!
//! Each has its own mapping and threads; none touches a region's.

pub mod copy_in;
pub mod floor;
pub mod oracle;
pub mod pageout;
pub mod unit_fault_in;
