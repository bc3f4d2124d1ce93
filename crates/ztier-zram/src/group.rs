//! A memory group: devices whose pools share one limit (a host's budget for its guests'
//! disks), beside each device's own `mem_limit`. The kernel's zram has none (a memory
//! cgroup limits the pages of every device its tasks touch, not a set of devices); here a
//! host of devices needs one.
//!
//! The group keeps the sum of what each member last reported of its pool (`mem_used_total`
//! bytes). A member reports after each write (the write that takes the sum past the limit is
//! undone and fails, as a write past `mem_limit` does), after a discard or compaction, and
//! when asked ([`Device::report_to_group`], which a host's policy calls each tick, so pages
//! freed by other paths come off). Each member's report replaces its last one (a swap of its
//! own figure, then the difference added), so the sum is exact as of each member's last
//! report, however many threads report at once.
//!
//! No locks: atomics only.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::Device;

/// A limit shared by several devices' pools.
#[derive(Debug, Default)]
pub struct MemoryGroup {
    /// Bytes the members may hold together; 0 = none.
    limit_bytes: AtomicU64,
    /// What the members last reported, summed.
    used_bytes: AtomicU64,
}

impl MemoryGroup {
    pub fn new(limit_bytes: u64) -> MemoryGroup {
        MemoryGroup {
            limit_bytes: AtomicU64::new(limit_bytes),
            used_bytes: AtomicU64::new(0),
        }
    }

    pub fn set_limit(&self, bytes: u64) {
        self.limit_bytes.store(bytes, Relaxed);
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Relaxed)
    }

    /// The members' pools, summed as last reported.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Relaxed)
    }

    /// Replaces a member's last report (`previous`) with `now`; returns the sum after.
    pub(crate) fn replace(&self, previous: u64, now: u64) -> u64 {
        if now >= previous {
            self.used_bytes.fetch_add(now - previous, Relaxed) + (now - previous)
        } else {
            self.used_bytes.fetch_sub(previous - now, Relaxed) - (previous - now)
        }
    }

    /// Whether `sum` is past the limit.
    pub(crate) fn is_over(&self, sum: u64) -> bool {
        let limit = self.limit_bytes();
        limit != 0 && sum > limit
    }
}

impl Device {
    /// Makes the device a member of `group`: its pool counts toward the group's limit, and
    /// a write that would take the group past it fails with [`crate::ZramError::GroupLimit`].
    /// Once: a device joined to a group stays in it (leaving when dropped).
    pub fn join_group(&self, group: std::sync::Arc<MemoryGroup>) -> Result<(), crate::ZramError> {
        self.group
            .set(group)
            .map_err(|_| crate::ZramError::AlreadyInGroup)?;
        self.report_to_group();
        Ok(())
    }

    /// Tells the device's group what its pool holds now; returns the group's sum after, or
    /// `None` outside a group.
    pub fn report_to_group(&self) -> Option<u64> {
        let group = self.group.get()?;
        let now = self.pool_bytes();
        let previous = self.group_reported.swap(now, Relaxed);
        Some(group.replace(previous, now))
    }

    /// Leaves the group's sum (what it last reported comes off): at the device's end.
    pub(crate) fn leave_group(&self) {
        if let Some(group) = self.group.get() {
            let previous = self.group_reported.swap(0, Relaxed);
            group.replace(previous, 0);
        }
    }
}
