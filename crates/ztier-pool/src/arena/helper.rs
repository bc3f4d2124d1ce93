//! The process's one arena helper thread: it maps a chunk ahead and faults it in, keeping
//! one ready for whichever arena needs a chunk next, so the kernel's zeroing of fresh pages
//! runs beside the store path instead of on it; when arenas take chunks faster than that
//! (many pools making their first zspages), it faults in a window ahead of each such
//! arena's use as the arena asks; it releases an arena's gathered pages when the arena asks
//! (a full batch), and trims idle arenas once allocation stops. Started with the process's first
//! arena and ended with its last; it runs at idle priority, on a core that would otherwise
//! be idle, and no arena ever waits for it.
//!
//! Invariants: a chunk the helper maps is its own until an arena takes it from the slot,
//! then the arena's; when the last arena goes, the helper unmaps the chunk in its slot and
//! ends; a ready chunk left untaken for [`READY_IDLE`] has its pages released (offered as
//! not resident). Once it is released, the helper looks at the arenas every [`TRIM_TICK`]
//! while any has pages to release: one that neither took nor gave back a page since the
//! last look is trimmed.
//!
//! Locking: `HELPER` (the count of arenas and the running helper), then the helper's slot
//! lock, which takes no other; the helper holds neither across mapping, faulting or
//! releasing, nor while it trims an arena (see the arena's lock order).
#![allow(unsafe_code)]

use ztier_base::mapping::{self, Discard, Mapping};
use ztier_base::sched::lower_to_idle_priority;

use std::sync::Weak;

use parking_lot::Mutex;

use super::{
    fault_in_window, map_chunk, release_gathered_arenas, trim_idle_arenas, ArenaState, CHUNK_BYTES,
};

/// How long the helper's ready chunk may sit unused before its pages go back to the OS (the
/// mapping stays, offered as not resident): a process that stops allocating keeps no
/// prepared memory beyond what its allocators hold.
const READY_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the helper looks at the arenas once allocation has stopped, until it has
/// trimmed them all.
const TRIM_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// The process's chunk-ahead helper: how many arenas are alive, and the running helper's
/// hand-over slot.
struct Helper {
    arenas: usize,
    /// `None` when no helper runs.
    shared: Option<std::sync::Arc<HelperShared>>,
}

/// Where the helper leaves its ready chunk for an arena to take.
struct HelperShared {
    slot: std::sync::Mutex<HelperSlot>,
    /// Signalled when the chunk is taken or the helper is told to stop.
    changed: std::sync::Condvar,
}

#[derive(Default)]
struct HelperSlot {
    /// A mapped chunk no arena has yet, and whether it is faulted in.
    ready: Option<(Mapping, bool)>,
    /// The last arena is gone: unmap what is in the slot and end.
    stop: bool,
    /// The helper ended on its own (it could not map): start another next time.
    ended: bool,
    /// An arena asked for its gathered pages to be released.
    release: bool,
    /// Arenas that asked for their window to be faulted in, in the order they asked (each
    /// at most once until the helper looks: the arena's `window_asked`).
    windows: Vec<Weak<Mutex<ArenaState>>>,
}

static HELPER: std::sync::Mutex<Helper> = std::sync::Mutex::new(Helper {
    arenas: 0,
    shared: None,
});

fn helper_state() -> std::sync::MutexGuard<'static, Helper> {
    // A panic while holding this lock leaves nothing half-changed (each critical section is a
    // counter step or an Option swap), so a poisoned lock is taken as it is.
    HELPER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn lock_slot(shared: &HelperShared) -> std::sync::MutexGuard<'_, HelperSlot> {
    // As for HELPER: every critical section leaves the slot whole.
    shared.slot.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new arena: the first of the process starts the helper, so that a pool made ahead of
/// use (as a zram device is set up before it is written) finds a chunk ready.
pub(super) fn helper_join() {
    let mut h = helper_state();
    h.arenas += 1;
    if h.shared.is_none() {
        h.shared = start_helper();
    }
}

/// An arena gone: with the last one, the helper is told to unmap the chunk it holds and end.
pub(super) fn helper_leave() {
    let mut h = helper_state();
    h.arenas -= 1;
    if h.arenas == 0 {
        if let Some(shared) = h.shared.take() {
            lock_slot(&shared).stop = true;
            shared.changed.notify_all();
        }
    }
}

/// The helper's ready chunk, mapped, with whether it is faulted in, if it has one now; never
/// waits. A helper that ended (it could not map) is started again for the next time.
pub(super) fn helper_take_ready() -> Option<(Mapping, bool)> {
    let mut h = helper_state();
    let (taken, ended) = match &h.shared {
        Some(shared) => {
            let mut slot = lock_slot(shared);
            let taken = slot.ready.take();
            if taken.is_some() {
                shared.changed.notify_all();
            }
            (taken, slot.ended)
        }
        None => (None, true),
    };
    if ended {
        h.shared = start_helper();
    }
    taken
}

/// Asks the helper to release the gathered pages of the arenas that asked; false if no
/// helper runs (the caller releases them itself).
pub(super) fn helper_ask_release() -> bool {
    let h = helper_state();
    let Some(shared) = &h.shared else {
        return false;
    };
    let mut slot = lock_slot(shared);
    if slot.ended || slot.stop {
        return false;
    }
    slot.release = true;
    shared.changed.notify_all();
    true
}

/// Asks the helper to fault in `arena`'s window; false if no helper runs (the arena's pages
/// then fault in as it takes them).
pub(super) fn helper_ask_window(arena: Weak<Mutex<ArenaState>>) -> bool {
    let h = helper_state();
    let Some(shared) = &h.shared else {
        return false;
    };
    let mut slot = lock_slot(shared);
    if slot.ended || slot.stop {
        return false;
    }
    slot.windows.push(arena);
    shared.changed.notify_all();
    true
}

/// Starts the thread that maps chunks ahead; `None` if no thread can be started (the arenas
/// then map every chunk themselves).
fn start_helper() -> Option<std::sync::Arc<HelperShared>> {
    let shared = std::sync::Arc::new(HelperShared {
        slot: std::sync::Mutex::new(HelperSlot::default()),
        changed: std::sync::Condvar::new(),
    });
    let theirs = std::sync::Arc::clone(&shared);
    std::thread::Builder::new()
        .name("ztier-arena".into())
        .spawn(move || run_helper(&theirs))
        .ok()
        .map(|_| shared)
}

/// The helper: maps a chunk, faults it in, leaves it in the slot and waits until an arena
/// takes it; one left unused for [`READY_IDLE`] has its pages released while it waits on.
fn run_helper(shared: &HelperShared) {
    lower_to_idle_priority();
    // Whether some arena has pages to trim.
    let mut trim_pending = false;
    loop {
        let Ok(chunk) = map_chunk() else {
            lock_slot(shared).ended = true;
            return;
        };
        // A write to each page rather than one MADV_POPULATE_WRITE, which would hold the
        // process's mmap lock for the whole chunk, holding up other threads' mmap calls
        // (page faults take only the VMA's lock). An arena's window, 128 KiB, does use it:
        // writes there could land on pages the arena has handed out meanwhile.
        // SAFETY: the chunk is new and the helper's alone; untouched, it reads as zeros.
        unsafe { mapping::fault_in_by_writes(chunk.ptr(), CHUNK_BYTES) };
        let mut slot = lock_slot(shared);
        slot.ready = Some((chunk, true));
        let mut resident = true;
        loop {
            if !slot.windows.is_empty() && !slot.stop {
                let windows = std::mem::take(&mut slot.windows);
                drop(slot);
                windows.iter().for_each(fault_in_window);
                slot = lock_slot(shared);
                continue;
            }
            if slot.release && !slot.stop {
                slot.release = false;
                drop(slot);
                release_gathered_arenas();
                slot = lock_slot(shared);
                continue;
            }
            if slot.stop {
                // Never taken by an arena, and the last arena is gone: nothing refers to the
                // chunk, unmapped as it drops.
                slot.ready = None;
                return;
            }
            if slot.ready.is_none() {
                break;
            }
            if !resident && !trim_pending {
                slot = shared.changed.wait(slot).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            if !resident {
                // Allocation has stopped: a look at the arenas each tick until all are
                // trimmed, with no lock held but theirs.
                let (back, waited) = shared
                    .changed
                    .wait_timeout(slot, TRIM_TICK)
                    .unwrap_or_else(|p| p.into_inner());
                slot = back;
                if waited.timed_out() && !slot.stop && slot.ready.is_some() {
                    drop(slot);
                    trim_pending = trim_idle_arenas();
                    slot = lock_slot(shared);
                }
                continue;
            }
            let (back, waited) = shared
                .changed
                .wait_timeout(slot, READY_IDLE)
                .unwrap_or_else(|p| p.into_inner());
            slot = back;
            if waited.timed_out() && !slot.stop {
                if let Some((chunk, _)) = slot.ready.take() {
                    // Out of the slot while its pages go, so no arena waits on the madvise.
                    drop(slot);
                    // SAFETY: out of the slot, the chunk is the helper's alone: no arena has
                    // a page of it, and no reference into it is alive. A refusal leaves it
                    // resident, costing memory only.
                    let _ = unsafe { chunk.discard(0, CHUNK_BYTES, Discard::DontNeed) };
                    // The first look notes each arena's activity; the next, a tick on, trims
                    // the idle ones.
                    trim_pending = trim_idle_arenas();
                    slot = lock_slot(shared);
                    slot.ready = Some((chunk, false));
                    resident = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ztier_base::os::page_size as os_page_size;

    /// A helper of its own (not the process's, which other tests use): its ready chunk comes
    /// faulted in, and after READY_IDLE untaken its pages are given back, the mapping kept
    /// and offered as not resident; told to stop, it unmaps it and ends.
    #[test]
    fn an_untaken_ready_chunk_goes_back_to_the_os() {
        let _one = super::super::ONE_TEST_AT_A_TIME.lock();
        let shared = std::sync::Arc::new(HelperShared {
            slot: std::sync::Mutex::new(HelperSlot::default()),
            changed: std::sync::Condvar::new(),
        });
        let theirs = std::sync::Arc::clone(&shared);
        let helper = std::thread::spawn(move || run_helper(&theirs));
        // The ready chunk's address, whether it is offered as resident, and its resident
        // OS pages.
        let ready = || {
            let slot = lock_slot(&shared);
            let (chunk, resident) = slot.ready.as_ref()?;
            let pages = chunk.residency(0, CHUNK_BYTES).expect("mincore");
            assert_eq!(pages.len(), CHUNK_BYTES / os_page_size());
            Some((
                chunk.addr(),
                *resident,
                pages.into_iter().filter(|&r| r).count(),
            ))
        };
        let started = std::time::Instant::now();
        while ready().is_none() {
            assert!(started.elapsed().as_secs() < 10, "no chunk made ready");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (base, resident, pages) = ready().unwrap();
        assert!(resident);
        assert_eq!(pages, CHUNK_BYTES / os_page_size());
        // (Out of the slot, `None`, while its pages go.)
        while ready().is_none_or(|(_, resident, _)| resident) {
            assert!(started.elapsed().as_secs() < 10, "never released");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(ready(), Some((base, false, 0)));
        lock_slot(&shared).stop = true;
        shared.changed.notify_all();
        helper.join().unwrap();
        assert!(ready().is_none(), "unmapped at stop");
    }
}
