//! Allocation: the per-thread (the kernel's per-CPU) current cluster, isolation and
//! relocation, the list policy's moves, the published offers of full and frag clusters, and
//! the slow path's fallbacks.

use super::*;

/// Whether slot `i`'s aligned run of the cluster's order is all free.
pub(crate) fn run_is_free(c: &Cluster, i: usize) -> bool {
    let nr = 1usize << c.order;
    c.range_is_free(i & !(nr - 1), nr)
}

/// Whether a cluster of order > 0 has free aligned runs of its order holding half of it (one
/// run for an order that fits fewer than two in a cluster): worth the nonfull list, so that
/// an allocator isolating it gets many runs for the two device-lock acquisitions of the trip.
pub(super) fn runs_worth_a_trip(c: &Cluster) -> bool {
    u32::from(c.free_runs) >= (FULL_ROOM >> c.order).max(1)
}

/// Puts an isolated cluster (off every list, its lock held) on the tail of the frag list of
/// its order, where relocation would put it: ztier's list policy does it in the isolating
/// device-lock hold.
pub(super) fn put_on_frag(l: &mut Lists, c: &mut Cluster, id: u32) {
    let (frag, nodes) = l.list(Flag::Frag, c.order);
    frag.push_back(nodes, id);
    c.flag = Flag::Frag;
}

/// What a cluster offers to allocators that do not hold its lock, packed in one word: its
/// free slots while it is on the full list under ztier's list policy (order 0 fills them
/// in place), and its free runs while it is on the frag list of its order (> 0). Public
/// only as [`Inconsistency::Published`](crate::Inconsistency::Published) names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Free slots, on the full list under ztier's list policy.
    pub holes: u32,
    /// Free runs of `order`, on a frag list.
    pub frag_runs: u32,
    pub order: u8,
}

impl Published {
    pub(super) fn pack(self) -> u64 {
        u64::from(self.holes) | u64::from(self.frag_runs) << 16 | u64::from(self.order) << 32
    }

    pub(super) fn unpack(word: u64) -> Published {
        Published {
            holes: (word & 0xffff) as u32,
            frag_runs: (word >> 16 & 0xffff) as u32,
            order: (word >> 32) as u8,
        }
    }
}

impl Inner {
    pub(super) fn with_lists<R>(&self, held: &mut Held<'_>, f: impl FnOnce(&mut Lists) -> R) -> R {
        let publish = |l: &mut Lists| {
            self.nonempty.store(l.nonempty_mask(), Ordering::Release);
        };
        match held {
            Some(guard) => {
                let r = f(guard);
                publish(guard);
                r
            }
            None => {
                let mut guard = self.lists.lock(&self.device_lock);
                let r = f(&mut guard);
                publish(&mut guard);
                r
            }
        }
    }

    /// `move_cluster()`: puts a cluster whose lock the caller holds on the tail of list `to`.
    pub(super) fn move_cluster(&self, c: &mut Cluster, id: u32, to: Flag, held: &mut Held<'_>) {
        let (from, order) = (c.flag, c.order);
        self.with_lists(held, |l| l.move_to(&self.clusters, id, from, to, order));
        c.flag = to;
        self.publish(id, c);
    }

    /// What a locked cluster offers, as it should be published.
    pub(super) fn offer(&self, c: &Cluster) -> Published {
        let ztier = self.config.policy == ListPolicy::Ztier;
        Published {
            holes: match c.flag {
                Flag::Full if ztier => CLUSTER - u32::from(c.count),
                _ => 0,
            },
            frag_runs: match c.flag {
                Flag::Frag if c.order > 0 => u32::from(c.free_runs),
                _ => 0,
            },
            order: c.order,
        }
    }

    /// Publishes what a locked cluster offers, after any change to its slots or its list.
    /// Only the holder of the cluster's lock writes its word, so a plain load and store
    /// suffice, and an allocation that changes nothing published (the common one) writes
    /// nothing.
    pub(super) fn publish(&self, id: u32, c: &Cluster) {
        let new = self.offer(c);
        let Some(word) = self.clusters.published(id) else {
            unreachable!("cluster {id} is locked, so made")
        };
        let old = Published::unpack(word.load(Ordering::Relaxed));
        if old == new {
            return;
        }
        word.store(new.pack(), Ordering::Relaxed);
        if old.frag_runs != new.frag_runs || old.order != new.order {
            // Each cluster's share is changed under its lock, so the sums never go below 0.
            self.frag_runs[usize::from(old.order)]
                .fetch_sub(u64::from(old.frag_runs), Ordering::Relaxed);
            self.frag_runs[usize::from(new.order)]
                .fetch_add(u64::from(new.frag_runs), Ordering::Relaxed);
        }
    }

    /// Whether order-`order` allocations may be made in a locked cluster: one on a usable
    /// list, or for order 0 under ztier's list policy, the holes of one on the full list.
    pub(super) fn usable(&self, c: &Cluster, order: u32) -> bool {
        c.usable_for(order)
            || (order == 0
                && c.flag == Flag::Full
                && self.config.policy == ListPolicy::Ztier
                && u32::from(c.count) < CLUSTER)
    }

    /// An empty cluster goes to be discarded, or to the free list.
    pub(super) fn free_cluster(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        // Its map goes back now (every byte zero): taken again, it is made afresh.
        c.map.release();
        if self.config.discard {
            self.move_cluster(c, id, Flag::Discard, held);
            self.discard.kick();
        } else {
            self.free_cluster_now(c, id, held);
        }
    }

    pub(super) fn free_cluster_now(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        self.move_cluster(c, id, Flag::Free, held);
        c.take_order(0);
        self.publish(id, c);
    }

    /// `relocate_cluster()`: after an allocation, to the frag, full or free list.
    pub(super) fn relocate(&self, c: &mut Cluster, id: u32, held: &mut Held<'_>) {
        if c.flag == Flag::Discard {
            return;
        }
        if c.count == 0 {
            if c.flag != Flag::Free {
                self.free_cluster(c, id, held);
            }
        } else if u32::from(c.count) < CLUSTER {
            // Under ztier's list policy a full cluster's holes are filled in place.
            let in_place = c.flag == Flag::Full && self.config.policy == ListPolicy::Ztier;
            if c.flag != Flag::Frag && !in_place {
                self.move_cluster(c, id, Flag::Frag, held);
            }
        } else if c.flag != Flag::Full {
            self.move_cluster(c, id, Flag::Full, held);
        }
    }

    /// `isolate_lock_cluster()`: the first cluster of a list whose lock is free, taken off
    /// the list and locked.
    ///
    /// Under ztier's list policy the cluster goes straight to the tail of the frag list of
    /// the order it will serve (`alloc_order` if it is empty), where relocation would put it
    /// after all but the allocation that fills it: one device-lock acquisition per new
    /// cluster instead of two. No one sees it there before its lock, held by the caller, is
    /// let go.
    pub(super) fn isolate<'a>(
        &'a self,
        flag: Flag,
        order: u8,
        alloc_order: u32,
        held: &mut Held<'_>,
    ) -> Option<(u32, MutexGuard<'a, Cluster>)> {
        // A list that gains a cluster just after this look is passed by this time, as a
        // cluster whose lock is held is.
        if self.nonempty.load(Ordering::Acquire) & Lists::bit(flag, order) == 0 {
            return None;
        }
        self.with_lists(held, |l| {
            let mut at = l.first(flag, order);
            while let Some(id) = at {
                at = l.next(flag, id);
                // A larger allocation passes by fragmented clusters with no run for it.
                let hopeless = flag == Flag::Frag
                    && alloc_order > 0
                    && self.config.policy == ListPolicy::Ztier
                    && self.clusters.published(id).map_or(0, |w| {
                        Published::unpack(w.load(Ordering::Relaxed)).frag_runs
                    }) == 0;
                if hopeless {
                    continue;
                }
                // A never-used cluster at the free list's frontier: its chunk made now.
                l.make(&self.clusters, id);
                if let Some(mut c) = self.clusters.at(id).try_lock(&self.cluster_lock) {
                    l.remove(&self.clusters, flag, order, id);
                    c.flag = Flag::None;
                    if self.config.policy == ListPolicy::Ztier {
                        if c.count == 0 {
                            c.take_order(alloc_order);
                        }
                        put_on_frag(l, &mut c, id);
                    }
                    self.publish(id, &c);
                    return Some((id, c));
                }
            }
            None
        })
    }

    /// `alloc_swap_scan_cluster()`: the first free aligned run of `2^order` slots from
    /// `start` in the locked cluster `id`; relocates the cluster after. Returns the slot
    /// found and where to look next time (0: this cluster is done).
    pub(super) fn scan_cluster(
        &self,
        mut c: MutexGuard<'_, Cluster>,
        id: u32,
        start: u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> (Option<u32>, u32) {
        let base = id * CLUSTER;
        let nr = 1u32 << order;
        let (mut found, mut next) = (None, 0);
        if u32::from(c.count) + nr <= CLUSTER {
            let mut from = start - base;
            loop {
                let mut off = from;
                while off + nr <= CLUSTER {
                    let (i, n) = (off as usize, nr as usize);
                    if c.range_is_free(i, n) {
                        if c.count == 0 {
                            c.take_order(order);
                        }
                        // The run of the cluster's order this allocation breaks (or takes).
                        if run_is_free(&c, i) {
                            c.free_runs -= 1;
                        }
                        c.map[i..i + n].fill(1);
                        c.count += nr as u16;
                        self.usage.add(u64::from(nr));
                        found = Some(base + off);
                        off += nr;
                        if u32::from(c.count) < CLUSTER && off + nr <= CLUSTER {
                            next = base + off;
                        } else if self.worth_another_pass(&c) {
                            next = base;
                        }
                        break;
                    }
                    off += nr;
                }
                // Nothing from the cursor on (another thread filled it), but room behind it.
                if found.is_some() || from == 0 || !self.worth_another_pass(&c) {
                    break;
                }
                from = 0;
            }
        }
        self.relocate(&mut c, id, held);
        self.publish(id, &c);
        (found, next)
    }

    /// Whether a locked cluster whose cursor reached its end (or found nothing past the
    /// cursor) keeps its thread for another pass from its start (ztier's list policy): when it
    /// has the room its order needs on the nonfull list. Under ztier's rule a frag cluster
    /// reaches nonfull only as a free crosses that room; room made by frees behind the
    /// cursor while the cluster was a thread's is never announced, so without another pass
    /// the thread would leave a half-empty cluster on the frag list (where order 0 looks
    /// once, after the free list) and take a fresh one. With 64 threads churning small
    /// shares, that used up the free clusters long before the device was full (half-empty
    /// order-0 clusters stranded on the frag list), and order-4 allocations failed
    /// (docs/diary.md, "The swap-slot allocator's locks at 64 threads").
    pub(super) fn worth_another_pass(&self, c: &Cluster) -> bool {
        self.config.policy == ListPolicy::Ztier
            && matches!(c.flag, Flag::Frag | Flag::Nonfull)
            && if c.order > 0 {
                runs_worth_a_trip(c)
            } else {
                CLUSTER - u32::from(c.count) >= ORDER0_ROOM
            }
    }

    /// The fast path: the thread's current cluster for `order`, if it is still usable.
    pub(crate) fn alloc_cached(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        let at = *next;
        if at == 0 {
            return None;
        }
        let id = at / CLUSTER;
        let c = self.clusters.at(id).lock(&self.cluster_lock);
        if !self.usable(&c, order) {
            return None;
        }
        let start = if c.count == 0 { id * CLUSTER } else { at };
        let (found, n) = self.scan_cluster(c, id, start, order, held);
        *next = n;
        found
    }

    /// One list's clusters, isolated and scanned in turn: the first only, or until one
    /// yields.
    pub(super) fn scan_list(
        &self,
        flag: Flag,
        list_order: usize,
        order: u32,
        all: bool,
        next: &mut u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        loop {
            let (id, c) = self.isolate(flag, list_order as u8, order, held)?;
            let (found, n) = self.scan_cluster(c, id, id * CLUSTER, order, held);
            *next = n;
            if found.is_some() || !all {
                return found;
            }
        }
    }

    /// `cluster_alloc_swap_entry()`'s search for a new cluster, in the kernel's order.
    pub(crate) fn alloc_new_cluster(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        let o = order as usize;
        let discard = self.config.discard;
        // A device that discards prefers fresh clusters, spreading writes out.
        if discard {
            if let found @ Some(_) = self.scan_list(Flag::Free, 0, order, false, next, held) {
                return found;
            }
        }
        if order < PMD_ORDER {
            if let found @ Some(_) = self.scan_list(Flag::Nonfull, o, order, true, next, held) {
                return found;
            }
        }
        if !discard {
            if let found @ Some(_) = self.scan_list(Flag::Free, 0, order, false, next, held) {
                return found;
            }
        }
        // One fragmented cluster is enough: order 0 will find room later in the steal, and a
        // large allocation may fail; it does not look when no cluster there has a free run.
        // (Under ztier's list policy; the kernel's scans one whatever it holds.)
        let frag_has_runs = order == 0
            || self.config.policy == ListPolicy::Kernel
            || self.frag_runs[o].load(Ordering::Relaxed) > 0;
        if order < PMD_ORDER && frag_has_runs {
            if let found @ Some(_) = self.scan_list(Flag::Frag, o, order, false, next, held) {
                return found;
            }
        }
        if order == 0 {
            // Order 0 steals from higher orders' clusters, fragmented ones first.
            for hi in 1..NR_ORDERS {
                if let found @ Some(_) = self.scan_list(Flag::Frag, hi, 0, true, next, held) {
                    return found;
                }
                if let found @ Some(_) = self.scan_list(Flag::Nonfull, hi, 0, true, next, held) {
                    return found;
                }
            }
            // Last, the holes full clusters keep under ztier's list policy.
            return self.fill_hole(next, held);
        }
        None
    }

    /// Order 0's last resort under ztier's list policy: a free slot in a cluster on the full
    /// list, taken in place (the cluster stays on the full list, so no list moves and no
    /// device lock), and the thread allocates from that cluster's holes next. The walk
    /// starts where the last one stopped and reads each cluster's published holes before
    /// taking its lock; a cluster whose lock is held is passed by, as isolation passes it.
    pub(super) fn fill_hole(&self, next: &mut u32, held: &mut Held<'_>) -> Option<u32> {
        if self.config.policy != ListPolicy::Ztier
            || self.nonempty.load(Ordering::Acquire) & Lists::bit(Flag::Full, 0) == 0
        {
            return None;
        }
        let n = self.clusters.len();
        let start = self.hole_cursor.load(Ordering::Relaxed) as usize % n;
        for id in (start..n).chain(0..start) {
            // A cluster never used publishes nothing (and has no holes).
            let Some(word) = self.clusters.published(id as u32) else {
                continue;
            };
            if Published::unpack(word.load(Ordering::Relaxed)).holes == 0 {
                continue;
            }
            let Some(c) = self.clusters.at(id as u32).try_lock(&self.cluster_lock) else {
                continue;
            };
            if !(c.flag == Flag::Full && self.usable(&c, 0)) {
                continue;
            }
            // The next walk starts past it: this thread fills it, another takes the next.
            self.hole_cursor.store(id as u64 + 1, Ordering::Relaxed);
            let id = id as u32;
            let (found, n) = self.scan_cluster(c, id, id * CLUSTER, 0, held);
            *next = n;
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// The thread's cluster, then a new one; and when all else fails, clusters waiting to be
    /// discarded are discarded now (`swap_sync_discard()`) and the search runs once more.
    pub(crate) fn alloc_with_next(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        self.alloc_cached(next, order, held)
            .or_else(|| self.alloc_new_cluster_or_discard(next, order, held))
    }

    /// A new cluster; failing that, clusters waiting to be discarded are discarded now
    /// (`swap_sync_discard()`) and the search runs once more.
    pub(super) fn alloc_new_cluster_or_discard(
        &self,
        next: &mut u32,
        order: u32,
        held: &mut Held<'_>,
    ) -> Option<u32> {
        self.alloc_new_cluster(next, order, held).or_else(|| {
            (self.discard_for_room(held))
                .then(|| self.alloc_new_cluster(next, order, held))
                .flatten()
        })
    }

    /// Discards what waits for it, if the device discards: true if that freed clusters.
    pub(crate) fn discard_for_room(&self, held: &mut Held<'_>) -> bool {
        self.config.discard && self.do_discard(held)
    }

    pub(crate) fn check_order(order: u32) -> Result<(), SwapError> {
        if order as usize >= NR_ORDERS {
            return Err(SwapError::BadOrder(order));
        }
        Ok(())
    }

    /// The fast path alone (a multi-device caller tries it on the device it used last).
    pub(crate) fn alloc_fast(&self, cpu: usize, order: u32) -> Option<u32> {
        match self.config.mode {
            Mode::Legacy => self.legacy_alloc_cached(cpu, order),
            Mode::Cluster if self.config.rotational => None,
            Mode::Cluster => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_cached(&mut pc.0[order as usize], order, &mut None)
            }
        }
    }

    /// Everything but the fast path.
    pub(crate) fn alloc_slow(&self, cpu: usize, order: u32) -> Option<u32> {
        let o = order as usize;
        match self.config.mode {
            Mode::Legacy => self.legacy_alloc_refill(cpu, order),
            Mode::Cluster if self.config.rotational => {
                let mut global = self.global.lock(&self.global_lock);
                self.alloc_with_next(&mut global.0[o], order, &mut None)
            }
            Mode::Cluster => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_new_cluster_or_discard(&mut pc.0[o], order, &mut None)
            }
        }
    }

    pub(crate) fn count_alloc(&self, order: u32) {
        self.counters.add(Count::Allocated.at(order as usize), 1);
    }

    pub(crate) fn count_fallback(&self, order: u32) {
        self.counters.add(Count::Fallback.at(order as usize), 1);
    }

    pub(super) fn alloc_on(&self, cpu: usize, order: u32) -> Result<u64, SwapError> {
        Inner::check_order(order)?;
        let found = match (self.config.mode, self.config.rotational) {
            // One local lock across both paths, as the kernel holds its CPU.
            (Mode::Cluster, false) => {
                let mut pc = self.percpu.at(cpu);
                self.alloc_with_next(&mut pc.0[order as usize], order, &mut None)
            }
            _ => self
                .alloc_fast(cpu, order)
                .or_else(|| self.alloc_slow(cpu, order)),
        };
        match found {
            Some(slot) => {
                self.count_alloc(order);
                Ok(u64::from(slot))
            }
            None => {
                self.count_fallback(order);
                Err(SwapError::Full { order })
            }
        }
    }
}
