//! The VMM and the guest's virtio-blk driver, played by tests (the `testing` feature): this
//! crate's own, and the CLI's, which serve a disk and attach to it as a VMM would.
//!
//! [`Served`] is a ztier vhost-user-blk server on a socket of its own. [`Guest`] is what a
//! VMM and a guest kernel are to it: a frontend (the `vhost` crate's, as Cloud Hypervisor's
//! and the rust-vmm tests' are) that shares memfd memory with the backend and sets up split
//! virtqueues in it, and a driver that writes descriptor chains into those rings, kicks,
//! and waits on the call eventfd for the used ring, one request at a time a queue. Its
//! rings, buffers and counters live in the guest's memory and in the `Guest`, not in the
//! connection: a `Guest` reconnects to a server started again and resumes where its used
//! rings are, as QEMU does.
//!
//! [`GuestDisk`] (`disk`) is that driver as a block device (sector I/O, read-modify-write of
//! the sectors an unaligned request only partly covers, as a guest's page cache does), so the
//! block-device conformance suite runs over vhost-user. [`Raw`] chains are written as given,
//! for the malformed ones. [`Served`] is in `served`; the guest's driver is here.
//!
//! Guest memory: below `FIRST_QUEUE` a sentinel pattern nothing may write; then each queue's
//! area: its rings, a header, a status byte, an indirect table, and its data buffers.

mod disk;
mod served;

pub use disk::GuestDisk;
pub use served::{scratch_dir, Served};

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT,
    VRING_DESC_F_WRITE,
};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub const GUEST_BYTES: u64 = 80 << 20;
pub const QUEUE_SIZE: u16 = 256;
/// Guest memory below this is a sentinel pattern no request may change.
pub const FIRST_QUEUE: u64 = 1 << 20;
/// Each queue's part of guest memory.
pub const QUEUE_AREA: u64 = 9 << 20;
const DESC_AT: u64 = 0;
const AVAIL_AT: u64 = 0x1000;
const USED_AT: u64 = 0x2000;
/// A request's header (and a discard's segments after it).
pub const HEADER_AT: u64 = 0x4000;
/// The status byte.
pub const STATUS_AT: u64 = 0x5000;
/// An indirect descriptor table.
const INDIRECT_AT: u64 = 0x6000;
/// Data buffers, to the end of the queue's area.
pub const DATA_AT: u64 = 0x1_0000;
/// The most data one request carries.
pub const DATA_MAX: usize = 8 << 20;
/// Bytes of one data descriptor, at most (the device's `SIZE_MAX`).
const SEGMENT: usize = 1 << 20;
/// How long a request may take before the test says the device never answered.
pub const ANSWER_WAIT: Duration = Duration::from_secs(20);

/// How a guest drives its device.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub queues: usize,
    pub event_idx: bool,
    /// Each chain as one indirect descriptor pointing at a table of the chain.
    pub indirect: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            queues: 1,
            event_idx: true,
            indirect: false,
        }
    }
}

/// One descriptor of a chain the driver builds: guest address, length, and whether the
/// device writes it.
#[derive(Debug, Clone, Copy)]
pub struct Seg {
    pub addr: u64,
    pub len: u32,
    pub write: bool,
}

/// A descriptor written exactly as given, at table index `index`.
#[derive(Debug, Clone, Copy)]
pub struct Raw {
    pub index: u16,
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// One entry of the used ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    pub id: u32,
    pub len: u32,
}

/// A queue as the driver keeps it.
struct Ring {
    index: usize,
    base: u64,
    kick: EventFd,
    call: EventFd,
    /// The driver's next available index (what it has posted).
    avail_idx: u16,
    /// The used index the driver has read up to.
    used_idx: u16,
}

impl Ring {
    fn desc(&self) -> u64 {
        self.base + DESC_AT
    }
    fn avail(&self) -> u64 {
        self.base + AVAIL_AT
    }
    fn used(&self) -> u64 {
        self.base + USED_AT
    }
}

pub struct Guest {
    /// The connection (none between a hang-up and the next attach).
    frontend: Mutex<Option<Frontend>>,
    pub mem: GuestMemoryMmap<()>,
    rings: Vec<Mutex<Ring>>,
    next_ring: AtomicUsize,
    pub options: Options,
    /// The virtio features the device offered.
    pub offered: u64,
    /// The configuration space the device gave.
    pub config: Vec<u8>,
}

impl Guest {
    /// A new guest (its memory zeroed, its sentinel written) attached to `path`.
    pub fn connect(path: &Path, options: Options) -> Guest {
        let file = std::fs::File::from(
            rustix::fs::memfd_create("guest", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
        );
        file.set_len(GUEST_BYTES).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            GUEST_BYTES as usize,
            Some(FileOffset::new(file, 0)),
        )])
        .unwrap();
        mem.write_slice(&sentinel(), GuestAddress(0)).unwrap();
        let rings = (0..options.queues)
            .map(|q| {
                Mutex::new(Ring {
                    index: q,
                    base: FIRST_QUEUE + q as u64 * QUEUE_AREA,
                    kick: EventFd::new(EFD_NONBLOCK).unwrap(),
                    call: EventFd::new(EFD_NONBLOCK).unwrap(),
                    avail_idx: 0,
                    used_idx: 0,
                })
            })
            .collect();
        let (frontend, offered, config) = attach(path, &mem, options).unwrap();
        let g = Guest {
            frontend: Mutex::new(Some(frontend)),
            mem,
            rings,
            next_ring: AtomicUsize::new(0),
            options,
            offered,
            config,
        };
        g.start_rings(0);
        g
    }

    /// Attaches again to a server at `path` (the old one gone or stopped), as QEMU's
    /// `reconnect-ms` does: the rings stay where they are, each resuming at its used index
    /// (requests posted and not used are taken again).
    pub fn reconnect(&self, path: &Path) -> Result<(), vhost::Error> {
        // The old connection closed first: the server serves one at a time, and ends one
        // when its VMM hangs up.
        let mut slot = self.frontend.lock().unwrap();
        drop(slot.take());
        *slot = Some(attach(path, &self.mem, self.options)?.0);
        drop(slot);
        for r in &self.rings {
            let mut r = r.lock().unwrap();
            // A fresh kick and call, as QEMU makes on each start.
            r.kick = EventFd::new(EFD_NONBLOCK).unwrap();
            r.call = EventFd::new(EFD_NONBLOCK).unwrap();
        }
        self.start_rings(1);
        Ok(())
    }

    /// Sets each queue's addresses, base, call and kick, and enables it; `kick_first`
    /// leaves that many on each kick eventfd (QEMU starts its host notifiers at 1, so a
    /// backend runs what is pending at once).
    fn start_rings(&self, kick_first: u64) {
        let mut guard = self.frontend.lock().unwrap();
        let fe = guard.as_mut().expect("attached");
        for r in &self.rings {
            let r = r.lock().unwrap();
            let q = r.index;
            let hva = |gpa: u64| self.mem.get_host_address(GuestAddress(gpa)).unwrap() as u64;
            fe.set_vring_num(q, QUEUE_SIZE).unwrap();
            fe.set_vring_addr(
                q,
                &VringConfigData {
                    queue_max_size: QUEUE_SIZE,
                    queue_size: QUEUE_SIZE,
                    flags: 0,
                    desc_table_addr: hva(r.desc()),
                    avail_ring_addr: hva(r.avail()),
                    used_ring_addr: hva(r.used()),
                    log_addr: None,
                },
            )
            .unwrap();
            let used = self
                .mem
                .load::<u16>(GuestAddress(r.used() + 2), Ordering::Acquire)
                .unwrap();
            fe.set_vring_base(q, used).unwrap();
            if kick_first > 0 {
                r.kick.write(kick_first).unwrap();
            }
            fe.set_vring_call(q, &r.call).unwrap();
            fe.set_vring_kick(q, &r.kick).unwrap();
            fe.set_vring_enable(q, true).unwrap();
        }
    }

    /// Detaches: the frontend's socket closed, as a VMM that exits.
    pub fn detach(self) {
        drop(self);
    }

    /// Whether the server has closed the connection, as a VMM finds it: a message it
    /// sends (`GET_FEATURES`, which touches no ring) is not answered. (QEMU, seeing the
    /// close, reads the used index and resets its rings to it.)
    pub fn hung_up(&self) -> bool {
        let mut slot = self.frontend.lock().unwrap();
        slot.as_mut().expect("attached").get_features().is_err()
    }

    /// Stops queue `q` as a VMM does (`GET_VRING_BASE`); returns the index it says the next
    /// request would be taken from.
    pub fn stop_ring(&self, q: usize) -> u32 {
        self.frontend
            .lock()
            .unwrap()
            .as_mut()
            .expect("attached")
            .get_vring_base(q)
            .unwrap()
    }

    pub fn capacity(&self) -> u64 {
        u64::from_le_bytes(self.config[0..8].try_into().unwrap()) * 512
    }

    pub fn config_u32(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.config[at..at + 4].try_into().unwrap())
    }

    pub fn queues(&self) -> usize {
        self.rings.len()
    }

    /// A queue's area in guest memory (its header, status and data are at fixed offsets).
    pub fn area(&self, q: usize) -> u64 {
        FIRST_QUEUE + q as u64 * QUEUE_AREA
    }

    /// Posts `segs` as a chain on queue `q` (as one indirect descriptor if the options say
    /// so), kicks, and waits for it to be used.
    pub fn submit(&self, q: usize, segs: &[Seg]) -> Used {
        let mut ring = self.rings[q].lock().unwrap();
        self.submit_locked(&mut ring, segs)
    }

    fn submit_locked(&self, ring: &mut Ring, segs: &[Seg]) -> Used {
        let raws = if self.options.indirect {
            for (i, s) in segs.iter().enumerate() {
                let next = if i + 1 < segs.len() { i as u16 + 1 } else { 0 };
                let flags = flags_of(s, i + 1 < segs.len());
                self.write_desc(
                    ring.base + INDIRECT_AT + 16 * i as u64,
                    s.addr,
                    s.len,
                    flags,
                    next,
                );
            }
            vec![Raw {
                index: 0,
                addr: ring.base + INDIRECT_AT,
                len: 16 * segs.len() as u32,
                flags: VRING_DESC_F_INDIRECT as u16,
                next: 0,
            }]
        } else {
            segs.iter()
                .enumerate()
                .map(|(i, s)| Raw {
                    index: i as u16,
                    addr: s.addr,
                    len: s.len,
                    flags: flags_of(s, i + 1 < segs.len()),
                    next: i as u16 + 1,
                })
                .collect()
        };
        self.post_locked(ring, &raws, 0);
        self.wait_locked(ring, 1)[0]
    }

    /// Writes `raws` into queue `q`'s descriptor table exactly as given and posts `head`,
    /// without waiting.
    pub fn post_raw(&self, q: usize, raws: &[Raw], head: u16) {
        let mut ring = self.rings[q].lock().unwrap();
        self.post_locked(&mut ring, raws, head);
    }

    /// Writes `head` straight into queue `q`'s available ring (any value) and kicks.
    pub fn post_head(&self, q: usize, head: u16) {
        let mut ring = self.rings[q].lock().unwrap();
        self.post_locked(&mut ring, &[], head);
    }

    /// Sets queue `q`'s available index to `idx` (any value) and kicks: a broken ring.
    pub fn set_avail_idx(&self, q: usize, idx: u16) {
        let ring = self.rings[q].lock().unwrap();
        self.mem
            .store(idx, GuestAddress(ring.avail() + 2), Ordering::Release)
            .unwrap();
        ring.kick.write(1).unwrap();
    }

    /// Waits for `n` more used entries on queue `q`.
    pub fn wait_used(&self, q: usize, n: usize) -> Vec<Used> {
        let mut ring = self.rings[q].lock().unwrap();
        self.wait_locked(&mut ring, n)
    }

    /// The used entries on queue `q` within `wait`, without failing if there are none.
    pub fn used_within(&self, q: usize, wait: Duration) -> Vec<Used> {
        let mut ring = self.rings[q].lock().unwrap();
        let deadline = std::time::Instant::now() + wait;
        loop {
            let used = self.used_idx(&ring);
            if used != ring.used_idx || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut got = Vec::new();
        while self.used_idx(&ring) != ring.used_idx {
            got.push(self.used_entry(&ring, ring.used_idx));
            ring.used_idx = ring.used_idx.wrapping_add(1);
        }
        got
    }

    fn post_locked(&self, ring: &mut Ring, raws: &[Raw], head: u16) {
        for r in raws {
            self.write_desc(
                ring.desc() + 16 * u64::from(r.index),
                r.addr,
                r.len,
                r.flags,
                r.next,
            );
        }
        let slot = ring.avail() + 4 + 2 * u64::from(ring.avail_idx % QUEUE_SIZE);
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        ring.avail_idx = ring.avail_idx.wrapping_add(1);
        // used_event: signal as soon as anything past what the driver has read is used.
        let used_event = ring.avail() + 4 + 2 * u64::from(QUEUE_SIZE);
        self.mem
            .store(ring.used_idx, GuestAddress(used_event), Ordering::Release)
            .unwrap();
        self.mem
            .store(
                ring.avail_idx,
                GuestAddress(ring.avail() + 2),
                Ordering::Release,
            )
            .unwrap();
        ring.kick.write(1).unwrap();
    }

    fn wait_locked(&self, ring: &mut Ring, n: usize) -> Vec<Used> {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + ANSWER_WAIT;
        while got.len() < n {
            while got.len() < n && self.used_idx(ring) != ring.used_idx {
                got.push(self.used_entry(ring, ring.used_idx));
                ring.used_idx = ring.used_idx.wrapping_add(1);
            }
            if got.len() == n {
                break;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "queue {}: {} of {n} requests used within {ANSWER_WAIT:?}",
                ring.index,
                got.len()
            );
            wait_readable(&ring.call, left.min(Duration::from_millis(100)));
            let _ = ring.call.read();
        }
        got
    }

    fn used_idx(&self, ring: &Ring) -> u16 {
        self.mem
            .load::<u16>(GuestAddress(ring.used() + 2), Ordering::Acquire)
            .unwrap()
    }

    fn used_entry(&self, ring: &Ring, idx: u16) -> Used {
        let at = ring.used() + 4 + 8 * u64::from(idx % QUEUE_SIZE);
        Used {
            id: self.mem.read_obj(GuestAddress(at)).unwrap(),
            len: self.mem.read_obj(GuestAddress(at + 4)).unwrap(),
        }
    }

    fn write_desc(&self, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&d, GuestAddress(at)).unwrap();
    }

    /// Picks a queue for the next request: the next one round the rings, so concurrent
    /// callers spread over every queue.
    pub fn pick(&self) -> usize {
        self.next_ring.fetch_add(1, Ordering::Relaxed) % self.rings.len()
    }

    /// Runs a request of `kind` at `sector` on queue `q`: `out` written after the header
    /// (a write's data, a discard's segments), `in_len` bytes read back before the status.
    /// Returns the status and what was read.
    pub fn request(
        &self,
        q: usize,
        kind: u32,
        sector: u64,
        out: &[u8],
        in_len: usize,
    ) -> (u8, Vec<u8>) {
        assert!(out.len() <= DATA_MAX && in_len <= DATA_MAX);
        // The queue's buffers are its own while its lock is held.
        let mut ring = self.rings[q].lock().unwrap();
        let area = self.area(q);
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem
            .write_slice(&header, GuestAddress(area + HEADER_AT))
            .unwrap();
        self.mem
            .write_obj(0xffu8, GuestAddress(area + STATUS_AT))
            .unwrap();
        let mut segs = vec![Seg {
            addr: area + HEADER_AT,
            len: 16,
            write: false,
        }];
        let data = area + DATA_AT;
        if !out.is_empty() {
            self.mem.write_slice(out, GuestAddress(data)).unwrap();
            segs.extend(pieces(data, out.len(), false));
        }
        if in_len > 0 {
            segs.extend(pieces(data, in_len, true));
        }
        segs.push(Seg {
            addr: area + STATUS_AT,
            len: 1,
            write: true,
        });
        let used = self.submit_locked(&mut ring, &segs);
        let status: u8 = self.mem.read_obj(GuestAddress(area + STATUS_AT)).unwrap();
        if u32::from(status) == VIRTIO_BLK_S_OK {
            assert_eq!(
                used.len as usize,
                in_len + 1,
                "used length of a type {kind} request"
            );
        } else {
            assert!(
                used.len as usize <= in_len + 1,
                "used length of a type {kind} request"
            );
        }
        let mut back = vec![0u8; in_len];
        self.mem.read_slice(&mut back, GuestAddress(data)).unwrap();
        (status, back)
    }

    /// Posts a request on queue `q` without waiting for it, in buffers of its own (`slot`,
    /// below 8: its header, status, descriptors and a MiB of data apart from the others'),
    /// so several can be in flight at once. [`Guest::wait_used`] waits for them;
    /// [`Guest::slot_status`] and [`Guest::slot_data`] read their answers.
    pub fn post_request(
        &self,
        q: usize,
        slot: u16,
        kind: u32,
        sector: u64,
        out: &[u8],
        in_len: usize,
    ) {
        assert!(slot < 8 && out.len() <= 1 << 20 && in_len <= 1 << 20);
        let mut ring = self.rings[q].lock().unwrap();
        let area = self.area(q);
        let header_at = area + HEADER_AT + 32 * u64::from(slot);
        let status_at = area + STATUS_AT + u64::from(slot);
        let data_at = area + DATA_AT + (u64::from(slot) << 20);
        let mut header = [0u8; 16];
        header[0..4].copy_from_slice(&kind.to_le_bytes());
        header[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem
            .write_slice(&header, GuestAddress(header_at))
            .unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(status_at)).unwrap();
        let mut segs = vec![(header_at, 16u32, 0u16)];
        if !out.is_empty() {
            self.mem.write_slice(out, GuestAddress(data_at)).unwrap();
            segs.push((data_at, out.len() as u32, 0));
        }
        if in_len > 0 {
            segs.push((data_at, in_len as u32, VRING_DESC_F_WRITE as u16));
        }
        segs.push((status_at, 1, VRING_DESC_F_WRITE as u16));
        let first = 8 * slot;
        let raws: Vec<Raw> = segs
            .iter()
            .enumerate()
            .map(|(i, &(addr, len, flags))| {
                let more = i + 1 < segs.len();
                Raw {
                    index: first + i as u16,
                    addr,
                    len,
                    flags: if more {
                        flags | VRING_DESC_F_NEXT as u16
                    } else {
                        flags
                    },
                    next: first + i as u16 + 1,
                }
            })
            .collect();
        self.post_locked(&mut ring, &raws, first);
    }

    /// The status byte of a request posted in `slot` on queue `q`.
    pub fn slot_status(&self, q: usize, slot: u16) -> u8 {
        self.mem
            .read_obj(GuestAddress(self.area(q) + STATUS_AT + u64::from(slot)))
            .unwrap()
    }

    /// `len` bytes of the data buffer of `slot` on queue `q`.
    pub fn slot_data(&self, q: usize, slot: u16, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(
                &mut v,
                GuestAddress(self.area(q) + DATA_AT + (u64::from(slot) << 20)),
            )
            .unwrap();
        v
    }

    /// Checks nothing wrote below the first queue's area.
    pub fn assert_sentinel_intact(&self) {
        let mut now = vec![0u8; FIRST_QUEUE as usize];
        self.mem.read_slice(&mut now, GuestAddress(0)).unwrap();
        assert!(
            now == sentinel(),
            "guest memory outside every request's buffers was written"
        );
    }
}

/// Waits up to `wait` for `fd` to be signalled.
fn wait_readable(fd: &EventFd, wait: Duration) {
    use std::os::fd::AsRawFd;
    use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
    let epoll = Epoll::new().unwrap();
    epoll
        .ctl(
            ControlOperation::Add,
            fd.as_raw_fd(),
            EpollEvent::new(EventSet::IN, 0),
        )
        .unwrap();
    let mut events = [EpollEvent::default()];
    let _ = epoll.wait(wait.as_millis() as i32, &mut events);
}

fn flags_of(s: &Seg, more: bool) -> u16 {
    let mut f = 0;
    if s.write {
        f |= VRING_DESC_F_WRITE;
    }
    if more {
        f |= VRING_DESC_F_NEXT;
    }
    f as u16
}

/// `len` bytes at `addr` as descriptors of at most `SEGMENT` bytes.
fn pieces(addr: u64, len: usize, write: bool) -> Vec<Seg> {
    (0..len)
        .step_by(SEGMENT)
        .map(|at| Seg {
            addr: addr + at as u64,
            len: (len - at).min(SEGMENT) as u32,
            write,
        })
        .collect()
}

/// A discard or zero-write segment: `le64 sector; le32 num_sectors; le32 flags`.
pub fn segment(sector: u64, sectors: u32, flags: u32) -> [u8; 16] {
    let mut seg = [0u8; 16];
    seg[0..8].copy_from_slice(&sector.to_le_bytes());
    seg[8..12].copy_from_slice(&sectors.to_le_bytes());
    seg[12..16].copy_from_slice(&flags.to_le_bytes());
    seg
}

fn sentinel() -> Vec<u8> {
    ztier_blockdev::testing::pattern(0x5e17, FIRST_QUEUE as usize)
}

/// The frontend's side of a connection: negotiation, the memory table, the queue count.
/// Returns the frontend, the virtio features offered and the configuration space.
fn attach(
    path: &Path,
    mem: &GuestMemoryMmap<()>,
    options: Options,
) -> Result<(Frontend, u64, Vec<u8>), vhost::Error> {
    let mut fe = Frontend::connect(path, options.queues as u64)?;
    fe.set_owner()?;
    let offered = fe.get_features()?;
    let proto = fe.get_protocol_features()?;
    fe.set_protocol_features(
        proto
            & (VhostUserProtocolFeatures::CONFIG
                | VhostUserProtocolFeatures::MQ
                | VhostUserProtocolFeatures::REPLY_ACK),
    )?;
    fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let max_queues = fe.get_queue_num()?;
    assert!(
        options.queues as u64 <= max_queues,
        "the device has {max_queues} queues"
    );
    let (_, config) = fe.get_config(0, 60, VhostUserConfigFlags::WRITABLE, &[0u8; 60])?;
    let mut wanted = offered;
    if !options.event_idx {
        wanted &= !(1 << VIRTIO_RING_F_EVENT_IDX);
    }
    if !options.indirect {
        wanted &= !(1 << VIRTIO_RING_F_INDIRECT_DESC);
    }
    fe.set_features(wanted)?;
    let region = mem.find_region(GuestAddress(0)).unwrap();
    fe.set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region)?])?;
    Ok((fe, offered, config))
}
