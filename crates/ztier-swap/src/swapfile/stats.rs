//! What a device reports: its statistics, and `check_consistency`, which checks every invariant of the
//! clusters, the lists and the published offers against each other.

use super::*;

/// One order's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OrderStats {
    pub order: u32,
    /// Allocations of `2^order` slots.
    pub allocations: u64,
    /// Frees of `2^order` slots (single slots: order 0).
    pub frees: u64,
    /// Allocations that found no room (the kernel's `swpout_fallback` for order > 0).
    pub fallbacks: u64,
}

/// A device's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceStats {
    pub mode: Mode,
    pub policy: ListPolicy,
    pub rotational: bool,
    pub discard: bool,
    pub priority: i16,
    pub slots: u64,
    pub usable_slots: u64,
    pub in_use: u64,
    pub off_list: bool,
    pub per_order: Vec<OrderStats>,
    pub lists: ListCounts,
    /// Free slots in clusters on the frag lists.
    pub frag_free_slots: u64,
    pub clusters_discarded: u64,
    pub discard_errors: u64,
    pub locks: Vec<LockReport>,
}

impl Inner {
    pub(super) fn list_counts(&self) -> ListCounts {
        let l = self.lists.lock(&self.device_lock);
        ListCounts {
            free: l.free.len(),
            nonfull: std::array::from_fn(|o| l.nonfull[o].len()),
            frag: std::array::from_fn(|o| l.frag[o].len()),
            full: l.full.len(),
            discard: l.discard.len(),
        }
    }

    /// Free slots in clusters on the frag lists.
    pub(super) fn frag_free_slots(&self) -> u64 {
        let ids: Vec<u32> = {
            let mut l = self.lists.lock(&self.device_lock);
            (0..NR_ORDERS)
                .flat_map(|o| l.ids(Flag::Frag, o as u8))
                .collect()
        };
        ids.iter()
            .map(|&id| {
                let c = self.clusters.at(id).lock(&self.cluster_lock);
                if c.flag == Flag::Frag {
                    u64::from(CLUSTER - u32::from(c.count))
                } else {
                    0
                }
            })
            .sum()
    }

    pub(super) fn stats(&self) -> DeviceStats {
        let per_order = (0..NR_ORDERS)
            .map(|o| OrderStats {
                order: o as u32,
                allocations: self.counters.sum(Count::Allocated.at(o)),
                frees: self.counters.sum(Count::Freed.at(o)),
                fallbacks: self.counters.sum(Count::Fallback.at(o)),
            })
            .collect();
        DeviceStats {
            mode: self.config.mode,
            policy: self.config.policy,
            rotational: self.config.rotational,
            discard: self.config.discard,
            priority: self.config.priority,
            slots: self.slots,
            usable_slots: self.slots - 1,
            in_use: self.usage.in_use(),
            off_list: self.usage.off_list(),
            per_order,
            lists: self.list_counts(),
            frag_free_slots: self.frag_free_slots(),
            clusters_discarded: self.counters.sum(Count::Discarded),
            discard_errors: self.counters.sum(Count::DiscardErrors),
            locks: vec![
                self.device_lock.report(),
                self.cluster_lock.report(),
                self.global_lock.report(),
                self.usage.avail().lock_stats.report(),
            ],
        }
    }

    pub(super) fn check_consistency(&self) -> Result<(), Inconsistency> {
        let mut on_list = vec![None; self.clusters.len()];
        {
            let mut l = self.lists.lock(&self.device_lock);
            let mut lists = vec![(Flag::Free, 0u8), (Flag::Full, 0), (Flag::Discard, 0)];
            for o in 0..NR_ORDERS as u8 {
                lists.push((Flag::Nonfull, o));
                lists.push((Flag::Frag, o));
            }
            if self.nonempty.load(Ordering::Acquire) != l.nonempty_mask() {
                return Err(Inconsistency::ListBitmap);
            }
            for (flag, order) in lists {
                for id in l.ids(flag, order) {
                    if let Some((first, first_order)) = on_list[id as usize].replace((flag, order))
                    {
                        return Err(Inconsistency::OnTwoLists {
                            cluster: id,
                            first,
                            first_order,
                            second: flag,
                        });
                    }
                }
            }
        }
        let mut in_use = 0u64;
        let mut frag_runs = [0u64; NR_ORDERS];
        for (id, &on) in on_list.iter().enumerate() {
            let cluster = id as u32;
            let (Some(lock), Some(word)) =
                (self.clusters.get(cluster), self.clusters.published(cluster))
            else {
                // Never used: free, in the free list's never-used part, publishing nothing.
                if on != Some((Flag::Free, 0)) {
                    return Err(Inconsistency::WrongList {
                        cluster,
                        flag: Flag::Free,
                        order: 0,
                        on,
                    });
                }
                continue;
            };
            let c = lock.lock(&self.cluster_lock);
            let used = c.map.iter().filter(|&&b| b != 0).count();
            if used != usize::from(c.count) {
                return Err(Inconsistency::Count {
                    cluster,
                    count: c.count,
                    used,
                });
            }
            in_use += c
                .map
                .iter()
                .filter(|&&b| b != 0 && b != SWAP_MAP_BAD)
                .count() as u64;
            let expected = match c.flag {
                Flag::None => None,
                Flag::Free | Flag::Full | Flag::Discard => Some((c.flag, 0)),
                Flag::Nonfull | Flag::Frag => Some((c.flag, c.order)),
            };
            if on != expected && !(c.flag == Flag::Discard && on.is_none()) {
                return Err(Inconsistency::WrongList {
                    cluster,
                    flag: c.flag,
                    order: c.order,
                    on,
                });
            }
            let fits = match c.flag {
                Flag::Free | Flag::Discard => c.count == 0,
                // ztier's list policy leaves a full cluster there until half is free.
                Flag::Full => match self.config.policy {
                    ListPolicy::Ztier => CLUSTER - u32::from(c.count) < FULL_ROOM,
                    ListPolicy::Kernel => u32::from(c.count) == CLUSTER,
                },
                Flag::Nonfull | Flag::Frag => c.count > 0,
                Flag::None => false,
            };
            if matches!(c.flag, Flag::Free | Flag::Discard) && c.map.is_made() {
                return Err(Inconsistency::MapHeld {
                    cluster,
                    flag: c.flag,
                });
            }
            if !fits {
                return Err(Inconsistency::FlagDoesNotFit {
                    cluster,
                    flag: c.flag,
                    used: c.count,
                });
            }
            if c.count > 0 && c.free_runs != c.count_free_runs() {
                return Err(Inconsistency::FreeRuns {
                    cluster,
                    counted: c.free_runs,
                    order: c.order,
                    there: c.count_free_runs(),
                });
            }
            let published = Published::unpack(word.load(Ordering::Relaxed));
            let offers = self.offer(&c);
            if published != offers {
                return Err(Inconsistency::Published {
                    cluster,
                    published,
                    offers,
                });
            }
            frag_runs[usize::from(published.order)] += u64::from(published.frag_runs);
        }
        let summed: [u64; NR_ORDERS] =
            std::array::from_fn(|o| self.frag_runs[o].load(Ordering::Relaxed));
        if let Some(order) = (0..NR_ORDERS).find(|&o| summed[o] != frag_runs[o]) {
            return Err(Inconsistency::FragRuns {
                order,
                summed: summed[order],
                there: frag_runs[order],
            });
        }
        if in_use != self.usage.in_use() {
            return Err(Inconsistency::InUse {
                in_clusters: in_use,
                counted: self.usage.in_use(),
            });
        }
        let full = self.usage.in_use() == self.slots - 1;
        if self.usage.off_list() != full
            || self.usage.avail().contains(self.id) == self.usage.off_list()
        {
            return Err(Inconsistency::OffList {
                in_use: self.usage.in_use(),
                usable: self.slots - 1,
                off_list: self.usage.off_list(),
                available: self.usage.avail().contains(self.id),
            });
        }
        Ok(())
    }
}
