//! The discard worker: freed clusters' blocks discarded on the backing device off the
//! allocation path, then the clusters freed.

use super::*;

impl Inner {
    /// The discard thread: waits for clusters to discard, discards them.
    pub(super) fn discard_worker(&self) {
        loop {
            {
                let mut state = self.discard.lock();
                while !state.0 && !state.1 {
                    state = self
                        .discard
                        .wake
                        .wait(state)
                        .unwrap_or_else(|p| p.into_inner());
                }
                if state.1 {
                    return;
                }
                state.0 = false;
            }
            self.do_discard(&mut None);
        }
    }

    /// `swap_do_scheduled_discard()`: each cluster on the discard list is taken off it (its
    /// flag stays Discard, so no allocator uses it), its slots are discarded on the backing
    /// device with no lock held (unless the caller holds the device lock), and it goes to
    /// the free list. True if any was, here or by a pass this one waited for (the
    /// worker's, which may have freed the clusters an allocation is about to look for).
    pub(crate) fn do_discard(&self, held: &mut Held<'_>) -> bool {
        let mut any = false;
        // A caller holding the device lock (legacy) must not wait for a worker that will
        // take it: it discards only if no one else is.
        let _serial = if held.is_none() {
            match self.discard.serial.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    any = true;
                    self.discard
                        .serial
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                }
            }
        } else {
            match self.discard.serial.try_lock() {
                Ok(g) => g,
                Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => return false,
            }
        };
        loop {
            let popped = self.with_lists(held, |l| {
                let (list, nodes) = l.list(Flag::Discard, 0);
                list.pop_front(nodes)
            });
            let Some(id) = popped else { return any };
            any = true;
            let first = (u64::from(id) * u64::from(CLUSTER)).max(1);
            let end = ((u64::from(id) + 1) * u64::from(CLUSTER)).min(self.slots);
            let punched = self
                .backing
                .discard(first * SLOT_BYTES, (end - first) * SLOT_BYTES);
            self.counters.add(Count::Discarded, 1);
            if punched.is_err() {
                // As the kernel: a failed discard loses nothing, the slots are free anyway.
                self.counters.add(Count::DiscardErrors, 1);
            }
            if self.config.mode == Mode::Legacy && held.is_none() {
                // The legacy order: device lock, then the cluster's.
                let mut dev = Some(self.lists.lock(&self.device_lock));
                let mut c = self.clusters.at(id).lock(&self.cluster_lock);
                c.flag = Flag::None;
                self.free_cluster_now(&mut c, id, &mut dev);
            } else {
                let mut c = self.clusters.at(id).lock(&self.cluster_lock);
                c.flag = Flag::None;
                self.free_cluster_now(&mut c, id, held);
            }
        }
    }
}
