//! Frees: one slot, an order's run, a batch (each cluster's lock taken once), the
//! reference counts of `dup`, and the checks of a slot's I/O.

use super::*;

impl Inner {
    /// The cluster and in-cluster index of a slot that may be handed out.
    pub(crate) fn locate(&self, offset: u64) -> Result<(u32, usize), SwapError> {
        if offset == 0 || offset >= self.slots {
            return Err(SwapError::OutOfRange {
                offset,
                slots: self.slots,
            });
        }
        Ok((
            (offset / u64::from(CLUSTER)) as u32,
            (offset % u64::from(CLUSTER)) as usize,
        ))
    }

    pub(super) fn free_on(&self, cpu: usize, offset: u64) -> Result<(), SwapError> {
        match self.config.mode {
            Mode::Legacy => self.legacy_put(cpu, offset),
            Mode::Cluster => {
                let (id, i) = self.locate(offset)?;
                self.put_in_cluster(id, &[i], &mut None)?;
                self.counters.add(Count::Freed.at(0), 1);
                Ok(())
            }
        }
    }

    pub(super) fn free_range(&self, offset: u64, nr: u64) -> Result<(), SwapError> {
        let (id, i) = self.locate(offset)?;
        let end = offset.checked_add(nr).filter(|&e| e <= self.slots);
        if nr == 0 || end.is_none() || i as u64 + nr > u64::from(CLUSTER) {
            return Err(SwapError::RangeAcrossClusters { offset, nr });
        }
        let idx: Vec<usize> = (i..i + nr as usize).collect();
        let mut held = match self.config.mode {
            Mode::Legacy => Some(self.lists.lock(&self.device_lock)),
            Mode::Cluster => None,
        };
        self.put_in_cluster(id, &idx, &mut held)?;
        let order = if nr.is_power_of_two() {
            nr.trailing_zeros() as usize
        } else {
            0
        };
        self.counters
            .add(Count::Freed.at(order.min(NR_ORDERS - 1)), 1);
        Ok(())
    }

    pub(super) fn free_batch(&self, offsets: &mut [u64]) -> Result<(), SwapError> {
        offsets.sort_unstable();
        let mut held = match self.config.mode {
            Mode::Legacy => Some(self.lists.lock(&self.device_lock)),
            Mode::Cluster => None,
        };
        let mut first_error = None;
        let mut rest = &offsets[..];
        while let Some(&first) = rest.first() {
            let cluster = first / u64::from(CLUSTER);
            let n = rest
                .iter()
                .take_while(|&&o| o / u64::from(CLUSTER) == cluster)
                .count();
            let (group, tail) = rest.split_at(n);
            rest = tail;
            let mut idx = Vec::with_capacity(group.len());
            for &o in group {
                match self.locate(o) {
                    Ok((_, i)) => idx.push(i),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            if idx.is_empty() {
                continue;
            }
            match self.put_in_cluster(cluster as u32, &idx, &mut held) {
                Ok(()) => self.counters.add(Count::Freed.at(0), idx.len() as u64),
                Err(e) => {
                    // One bad slot refuses its cluster's group whole; free the rest of it.
                    first_error.get_or_insert(e);
                    for &i in &idx {
                        if self.put_in_cluster(cluster as u32, &[i], &mut held).is_ok() {
                            self.counters.add(Count::Freed.at(0), 1);
                        }
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops a reference to each slot `idx` of cluster `id`, given in ascending order (a
    /// slot may appear more than once), all or none: an unallocated slot refuses the whole
    /// call. Freed slots go back;
    /// the cluster moves to the free (or discard) or nonfull list.
    pub(crate) fn put_in_cluster(
        &self,
        id: u32,
        idx: &[usize],
        held: &mut Held<'_>,
    ) -> Result<(), SwapError> {
        let offset = |i: usize| u64::from(id) * u64::from(CLUSTER) + i as u64;
        // A cluster never used holds no slot.
        let Some(lock) = self.clusters.get(id) else {
            return idx.first().map_or(Ok(()), |&i| {
                Err(SwapError::NotAllocated { offset: offset(i) })
            });
        };
        let mut c = lock.lock(&self.cluster_lock);
        debug_assert!(idx.is_sorted(), "slots in ascending order");
        for run in idx.chunk_by(|a, b| a == b) {
            let b = c.map[run[0]];
            if b == 0 || b > SWAP_MAP_MAX || usize::from(b) < run.len() {
                return Err(SwapError::NotAllocated {
                    offset: offset(run[0]),
                });
            }
        }
        let (mut freed, mut runs) = (0u16, 0u16);
        for &i in idx {
            c.map[i] -= 1;
            if c.map[i] == 0 {
                freed += 1;
                runs += u16::from(run_is_free(&c, i));
            }
        }
        self.release_slots(&mut c, id, freed, runs, held);
        Ok(())
    }

    /// `freed` slots of a locked cluster just became free, completing `runs` free aligned runs
    /// of the cluster's order: count them, and move the cluster to the list its new state
    /// calls for under the device's [`ListPolicy`].
    pub(crate) fn release_slots(
        &self,
        c: &mut Cluster,
        id: u32,
        freed: u16,
        runs: u16,
        held: &mut Held<'_>,
    ) {
        if freed == 0 {
            return;
        }
        let completes_run = runs > 0;
        let free_before = CLUSTER - u32::from(c.count);
        c.count -= freed;
        c.free_runs += runs;
        self.usage.sub(u64::from(freed));
        if c.count == 0 {
            self.free_cluster(c, id, held);
            return;
        }
        // Thresholds are counted once, as the free slots cross them, so frees into a cluster
        // being filled never bounce it between lists.
        let crossed = |room: u32| free_before < room && free_before + u32::from(freed) >= room;
        // Room for the cluster's order: free aligned runs of it holding half the cluster, as a
        // free completes one (order > 0), or a quarter of the cluster free (order 0). With
        // less, the cluster waits on the frag list, where only order-0 allocation looks.
        let room = if c.order > 0 {
            completes_run && runs_worth_a_trip(c)
        } else {
            crossed(ORDER0_ROOM)
        };
        let to = match (self.config.policy, c.flag) {
            (ListPolicy::Kernel, Flag::Nonfull) => None,
            (ListPolicy::Kernel, _) => Some(Flag::Nonfull),
            // A full cluster keeps its place until half of it is free (or, for a larger
            // order, until its free runs are worth a trip): a free and the allocation that
            // fills the hole again would otherwise move it twice for one slot. Order 0 fills
            // its holes in place meanwhile (`fill_hole`), with no list move at all.
            (ListPolicy::Ztier, Flag::Full) if c.order > 0 && room => Some(Flag::Nonfull),
            (ListPolicy::Ztier, Flag::Full) => crossed(FULL_ROOM).then_some(if c.order == 0 {
                Flag::Nonfull
            } else {
                Flag::Frag
            }),
            (ListPolicy::Ztier, Flag::Frag) if room => Some(Flag::Nonfull),
            (ListPolicy::Ztier, _) => None,
        };
        if let Some(to) = to {
            self.move_cluster(c, id, to, held);
        } else {
            self.publish(id, c);
        }
    }

    pub(super) fn dup(&self, offset: u64) -> Result<(), SwapError> {
        let (id, i) = self.locate(offset)?;
        let Some(lock) = self.clusters.get(id) else {
            return Err(SwapError::NotAllocated { offset });
        };
        let mut c = lock.lock(&self.cluster_lock);
        match c.map[i] {
            0 | SWAP_MAP_BAD | SWAP_MAP_FREEING => Err(SwapError::NotAllocated { offset }),
            SWAP_MAP_MAX => Err(SwapError::CountOverflow { offset }),
            _ => {
                c.map[i] += 1;
                Ok(())
            }
        }
    }

    pub(super) fn usage_of(&self, offset: u64) -> Result<u8, SwapError> {
        let (id, i) = self.locate(offset)?;
        let Some(lock) = self.clusters.get(id) else {
            return Ok(0);
        };
        let c = lock.lock(&self.cluster_lock);
        Ok(match c.map[i] {
            SWAP_MAP_BAD | SWAP_MAP_FREEING => 0,
            n => n,
        })
    }

    /// Bytes `[at, at + len)` from the start of slot `offset`: within one cluster's worth of
    /// slots, each allocated.
    pub(super) fn check_run(&self, offset: u64, at: usize, len: usize) -> Result<(), SwapError> {
        let end = at as u64 + len as u64;
        if len == 0 || end > u64::from(CLUSTER) * SLOT_BYTES {
            return Err(SwapError::BytesOutsideRun { at, len });
        }
        for slot in offset + at as u64 / SLOT_BYTES..offset + end.div_ceil(SLOT_BYTES) {
            if self.usage_of(slot)? == 0 {
                return Err(SwapError::NotAllocated { offset: slot });
            }
        }
        Ok(())
    }

    pub(super) fn check_io(&self, offset: u64, len: usize) -> Result<(), SwapError> {
        if len as u64 != SLOT_BYTES {
            return Err(SwapError::NotASlotLength { len });
        }
        if self.usage_of(offset)? == 0 {
            return Err(SwapError::NotAllocated { offset });
        }
        Ok(())
    }
}
