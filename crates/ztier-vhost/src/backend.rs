//! The vhost-user backend of one connection: what vhost-user-backend's daemon asks of a
//! device (its features, configuration space, queues, memory), and each queue's requests
//! run when the guest kicks it.
//!
//! A queue is served by its own worker thread (the daemon's), which pops its available
//! chains, runs each on the block device in order ([`crate::request`]), puts it on the used
//! ring, and notifies the guest once for the batch (or as `EVENT_IDX` asks). In order and to
//! the end: a chain popped is used before the next is popped, so a connection that ends
//! leaves no request half done, and at a server's stop none is popped after the one in
//! hand; the VMM, reconnecting, resumes at the used index and sends
//! again what was not used (each request may be run twice with the same result: reads,
//! writes of the same bytes, discards, zero-writes).
//!
//! Nothing a guest writes makes a worker fail: a bad chain is answered (`request`'s
//! header), and only a broken ring (an index the queue refuses) ends the queue's thread,
//! as the daemon does with any error.
//!
//! Locks: `mem` (a `RwLock`, written only by the daemon's `update_memory`, read once a
//! batch), then a queue's `scratch` (its own worker's, and a stop's to wait for the request
//! in hand), then the device's own; `exits` only at the daemon's start. No lock is held
//! across the guest's notification.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};
use ztier_blockdev::BlockDevice;

use crate::config::{DeviceConfig, CONFIG_BYTES};
use crate::request::{self, Outcome};
use crate::Stats;

/// The guest's memory as the frontend maps it (its regions, shared `MAP_SHARED`).
pub(crate) type Memory = GuestMemoryAtomic<GuestMemoryMmap<()>>;

/// One connection's device.
pub(crate) struct Blk {
    dev: Arc<dyn BlockDevice>,
    config: DeviceConfig,
    /// The frontend's memory table, as the daemon last set it.
    mem: RwLock<Memory>,
    /// `VIRTIO_RING_F_EVENT_IDX` negotiated: notify as the guest's used event says.
    event_idx: AtomicBool,
    /// Each queue's scratch buffer, for copies between the guest and the device.
    scratch: Vec<Mutex<Vec<u8>>>,
    /// Each queue's first pass on this connection is still to come.
    fresh: Vec<AtomicBool>,
    /// The worker threads' exit events, written when the connection is over.
    exits: Mutex<Vec<EventNotifier>>,
    stats: Arc<Stats>,
    /// The server's stop: no request is taken off a ring once it is set.
    stopping: Arc<AtomicBool>,
}

impl Blk {
    pub(crate) fn new(
        dev: Arc<dyn BlockDevice>,
        config: DeviceConfig,
        mem: Memory,
        stats: Arc<Stats>,
        stopping: Arc<AtomicBool>,
    ) -> Blk {
        let queues = usize::from(config.num_queues.max(1));
        Blk {
            dev,
            config,
            mem: RwLock::new(mem),
            event_idx: AtomicBool::new(false),
            scratch: (0..queues).map(|_| Mutex::new(Vec::new())).collect(),
            fresh: (0..queues).map(|_| AtomicBool::new(true)).collect(),
            exits: Mutex::new(Vec::new()),
            stats,
            stopping,
        }
    }

    /// Returns once no queue is running a request, after the server's stop was set: a
    /// queue's pass holds its scratch buffer throughout and takes no request once the stop
    /// is set, so each buffer taken here in turn is a queue with nothing in hand, now and
    /// after.
    pub(crate) fn wait_for_requests_in_hand(&self) {
        debug_assert!(self.stopping.load(Ordering::SeqCst));
        for scratch in &self.scratch {
            drop(scratch.lock().unwrap_or_else(|p| p.into_inner()));
        }
    }

    /// Ends every worker thread (their exit events); the daemon joins them when dropped.
    pub(crate) fn stop_workers(&self) {
        for e in self.exits.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let _ = e.notify();
        }
    }

    /// Runs every available request of `vring` (queue `queue`), then notifies the guest as
    /// it asked; returns how many chains were taken off the ring.
    fn process(&self, queue: usize, vring: &VringRwLock<Memory>) -> io::Result<usize> {
        let mem = self.mem.read().unwrap_or_else(|p| p.into_inner()).memory();
        let mut scratch = self.scratch[queue]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut state = vring.get_mut();
        self.stats.ring_passes.fetch_add(1, Ordering::Relaxed);
        let mut taken = 0;
        let mut used_any = false;
        while !self.stopping.load(Ordering::SeqCst) {
            let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem.clone()) else {
                break;
            };
            taken += 1;
            let head = chain.head_index();
            let (outcome, used) = request::run(chain, &*self.dev, &self.config, &mut scratch);
            self.stats.count(outcome);
            // A head the ring cannot hold (an index past the queue's size, written by the
            // guest into its available ring) cannot be put on the used ring: it is counted
            // and passed over, and the queue goes on.
            match state.get_queue_mut().add_used(&*mem, head, used) {
                Ok(()) => used_any = true,
                Err(_) => {
                    self.stats.bad_heads.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The first pass of a connection signals whatever it finds: a backend stopped between
        // putting requests on the used ring and signalling them leaves a guest waiting.
        let first_pass = self.fresh[queue].swap(false, Ordering::Relaxed);
        if !used_any && !first_pass {
            return Ok(taken);
        }
        let notify = first_pass
            || !self.event_idx.load(Ordering::Relaxed)
            // A used ring the guest made unreadable: signal rather than leave it waiting.
            || state.get_queue_mut().needs_notification(&*mem).unwrap_or(true);
        if notify {
            state.signal_used_queue()?;
        }
        Ok(taken)
    }
}

impl VhostUserBackend for Blk {
    type Bitmap = ();
    type Vring = VringRwLock<Memory>;

    fn num_queues(&self) -> usize {
        usize::from(self.config.num_queues.max(1))
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.config.max_queue_size)
    }

    fn features(&self) -> u64 {
        self.config.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        // CONFIG: QEMU refuses a vhost-user-blk backend without it. Not INFLIGHT_SHMFD:
        // requests are completed in order, so the used index is where a reconnect resumes
        // (module header) after a stop, which closes with no request in hand; a VMM's own
        // close, or the daemon's on a message it refuses, can fall between a request's run
        // and its used entry, which the inflight region would cover.
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // Exactly `size` bytes (the vhost crate refuses anything else): zeros past the end.
        let space = self.config.space(self.dev.size());
        let mut v = space
            .get(offset as usize..CONFIG_BYTES)
            .unwrap_or(&[])
            .to_vec();
        v.resize(size as usize, 0);
        v
    }

    fn update_memory(&self, mem: Memory) -> io::Result<()> {
        *self.mem.write().unwrap_or_else(|p| p.into_inner()) = mem;
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        // A thread for each queue: a bit each (the daemon's masks).
        (0..self.num_queues()).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (consumer, notifier) = new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()?;
        let ours = notifier.try_clone().ok()?;
        self.exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ours);
        Some((consumer, notifier))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock<Memory>],
        thread: usize,
    ) -> io::Result<()> {
        // One queue a thread: its kick is event 0, the queue's index the thread's.
        if evset != EventSet::IN || device_event != 0 {
            return Ok(());
        }
        let Some(vring) = vrings.first() else {
            return Ok(());
        };
        loop {
            vring.disable_notification().map_err(io::Error::other)?;
            let taken = self.process(thread, vring)?;
            // Requests that came while notifications were off are run before waiting. An
            // available index that says there are requests the queue will not give (one
            // more than a ring's size ahead of the last taken: the guest's ring is broken)
            // would be seen again at once, forever: after a pass that took nothing, one more
            // look, then wait for the next kick.
            if !vring.enable_notification().map_err(io::Error::other)? {
                return Ok(());
            }
            if taken == 0 && self.process(thread, vring)? == 0 {
                return Ok(());
            }
        }
    }
}

impl Stats {
    fn count(&self, outcome: Outcome) {
        use std::sync::atomic::Ordering::Relaxed;
        self.requests.fetch_add(1, Relaxed);
        match outcome {
            Outcome::Done(_) => {}
            Outcome::DeviceError(_) => {
                self.device_errors.fetch_add(1, Relaxed);
            }
            Outcome::Refused(_) | Outcome::Malformed => {
                self.refused.fetch_add(1, Relaxed);
            }
            Outcome::Unsupported => {
                self.unsupported.fetch_add(1, Relaxed);
            }
            Outcome::Unanswerable => {
                self.unanswerable.fetch_add(1, Relaxed);
            }
        }
    }
}
