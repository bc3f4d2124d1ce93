//! A host of zram devices: many devices by name in one process, each with its own size,
//! compressor, allocator, limits, policy, state file and backing store ([`spec`]), made and
//! ended while the others serve ([`Host`]); one memory budget shared by the rules memory
//! cgroups use ([`budget`]): the host's limit (no write takes the pools' sum past it), the
//! host's target (the coldest pages across devices written back to keep under it), each
//! device's cap (`mem_limit`) and protection (`mem_low`); and their figures for Prometheus
//! ([`metrics`]).
//!
//! It knows the engines (zram and what is under it) and nothing of the front ends that serve
//! its devices (NBD, vhost-user): the CLI wires those to each device by its name.
//!
//! Locks: `host`'s header; the budget's in `budget`'s.
#![forbid(unsafe_code)]

pub mod budget;
mod device;
mod error;
mod host;
pub mod metrics;
pub mod spec;

pub use budget::BudgetStats;
pub use device::HostDevice;
pub use error::HostError;
pub use host::{Host, HostConfig};
pub use spec::{DeviceSpec, SpecError};
