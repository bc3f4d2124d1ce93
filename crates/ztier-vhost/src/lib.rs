//! vhost-user-blk: a [`BlockDevice`] served as a virtual machine's virtio-blk disk, its queues
//! in the guest's own memory, shared with this process. Every VMM attaches it (QEMU's
//! `vhost-user-blk-pci`, Cloud Hypervisor's `--disk vhost_user=on`, Firecracker's vhost-user
//! drives, crosvm's `--vhost-user block`), and no VMM block layer or socket copy sits between
//! the guest's driver and the device: the guest writes a request into its ring, kicks an
//! eventfd, and a thread here runs it on the device and puts it on the used ring.
//!
//! It knows the block-device trait only, as the NBD server does (never zram). Built on
//! rust-vmm's crates (the vhost-user protocol and daemon, the split virtqueue, guest
//! memory): [`config`] is the device the guest sees (features, configuration space),
//! [`request`] one request read from the ring and run, `backend` a connection's queues, and
//! here the server: a Unix socket where a VMM connects, one connection served at a time (a
//! disk belongs to one guest), and a stop that ends it.
//!
//! A VMM that reconnects (QEMU's `reconnect-ms`) finds the disk as it was: the device
//! outlives connections, and requests are completed in order, so the ring's used index is
//! where the next connection resumes (`backend`'s header). Guest memory is reached only
//! through the regions the frontend gave; nothing a guest writes into its ring makes this
//! process panic, spin, or touch memory outside them (`request`'s header).
//!
//! A host that ends the device first closes the server ([`Server::close`]): from then on no
//! VMM is served (one that connects waits in the socket's backlog, and one accepted at that
//! moment is let go before its first message), so what `close` says is attached is all that
//! can hold the disk; [`Server::reopen`] serves them again if the host changes its mind.
//!
//! Locks: `Server::active` (the connection being served and whether the server is closed:
//! taken to set, take or end the connection or to close, never across a connection's
//! requests), then a connection's (`backend`'s header). No lock of the server's is held
//! while the device runs.
#![forbid(unsafe_code)]

pub mod config;
pub mod request;
#[cfg(feature = "testing")]
pub mod testing;

mod backend;

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::event::{PollFd, PollFlags};
use vhost_user_backend::{ShutdownHandle, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use ztier_blockdev::BlockDevice;

pub use config::DeviceConfig;

use backend::Blk;

/// What went wrong serving the socket (a connection's own end is not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VhostError {
    #[error("the vhost-user socket: {0}")]
    Socket(io::Error),
    /// The daemon could not be made or started (its threads, its first accept).
    #[error("the vhost-user daemon: {0}")]
    Daemon(DaemonError),
}

/// Why vhost-user-backend's daemon could not be made or started: its error, variant by
/// variant, in its own words. Not that error itself, which is not `Sync` (a panicked
/// thread's payload, `Box<dyn Any + Send>`, is one of its variants), so could not travel in
/// an `anyhow` chain; every other variant's cause is kept whole. As [`VhostError`]'s, each
/// cause is said in the message, not also as a `source`: the CLI prints a server's end by
/// its message, and a chain printed whole (`{:#}`) would say it twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("cannot create vhost user handler: {0}")]
    Handler(vhost_user_backend::VhostUserHandlerError),
    /// The front end's connection could not be accepted.
    #[error("cannot create backend listener: {0}")]
    Accept(vhost::vhost_user::Error),
    #[error("cannot create backend req handler: {0}")]
    RequestHandler(vhost::vhost_user::Error),
    #[error("cannot create vhost-user listener: {0}")]
    Listener(vhost::vhost_user::Error),
    #[error("failed to handle request: {0}")]
    Request(vhost::vhost_user::Error),
    #[error("failed to start daemon: {0}")]
    Thread(io::Error),
    /// The daemon's thread panicked (what it panicked with is not kept: not `Sync`).
    #[error("failed to wait for daemon exit")]
    Panicked,
}

impl From<vhost_user_backend::Error> for DaemonError {
    fn from(e: vhost_user_backend::Error) -> DaemonError {
        use vhost_user_backend::Error as E;
        match e {
            E::NewVhostUserHandler(e) => DaemonError::Handler(e),
            E::CreateBackendListener(e) => DaemonError::Accept(e),
            E::CreateBackendReqHandler(e) => DaemonError::RequestHandler(e),
            E::CreateVhostUserListener(e) => DaemonError::Listener(e),
            E::HandleRequest(e) => DaemonError::Request(e),
            E::StartDaemon(e) => DaemonError::Thread(e),
            E::WaitDaemon(_) => DaemonError::Panicked,
        }
    }
}

/// Counts kept while serving, over every connection.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections served (a VMM's, and each of its reconnections).
    pub connections: AtomicU64,
    /// Requests taken off the queues (each put on the used ring).
    pub requests: AtomicU64,
    /// Times a queue's thread looked over its ring for requests (at least once a guest's
    /// kick; several requests may be run in one look).
    pub ring_passes: AtomicU64,
    /// Requests the device failed (`IOERR`).
    pub device_errors: AtomicU64,
    /// Requests refused before the device saw them: malformed, in the wrong direction,
    /// past the end, not whole sectors, a write to a read-only disk (`IOERR`).
    pub refused: AtomicU64,
    /// Requests of a type or with flags the device does not do (`UNSUPP`).
    pub unsupported: AtomicU64,
    /// Chains with no status byte to answer (no writable byte, or memory outside the
    /// guest's): put back used with nothing written.
    pub unanswerable: AtomicU64,
    /// Chains whose head index the ring cannot hold (past the queue's size): taken off the
    /// available ring and passed over, since they cannot be put on the used ring.
    pub bad_heads: AtomicU64,
    /// Connections that ended on a protocol error (a message the backend refused, a
    /// frontend that broke the protocol) rather than a hang-up.
    pub protocol_errors: AtomicU64,
    /// Connections let go before their first message: accepted as the server was closed
    /// ([`Server::close`]).
    pub turned_away: AtomicU64,
}

/// A vhost-user-blk server of one device.
pub struct Server {
    dev: Arc<dyn BlockDevice>,
    config: DeviceConfig,
    stats: Arc<Stats>,
    /// Set at a stop; the queues' threads look at it between requests.
    stopping: Arc<AtomicBool>,
    /// Say each connection and its end on stderr.
    log: AtomicBool,
    /// An eventfd the accept loop polls beside its listener; `stop` writes to it.
    wake: OwnedFd,
    /// The connection being served, and whether new ones are turned away.
    active: Mutex<Active>,
}

/// What `Server::active` guards.
#[derive(Default)]
struct Active {
    /// The connection being served: its daemon's shutdown handle and its device (to end its
    /// workers).
    connection: Option<(ShutdownHandle, Arc<Blk>)>,
    /// Closed by a host about to end the device: no connection is served.
    closed: bool,
}

impl Server {
    pub fn new(dev: Arc<dyn BlockDevice>, config: DeviceConfig) -> io::Result<Arc<Server>> {
        let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK;
        Ok(Arc::new(Server {
            dev,
            config,
            stats: Arc::new(Stats::default()),
            stopping: Arc::new(AtomicBool::new(false)),
            log: AtomicBool::new(false),
            wake: rustix::event::eventfd(0, flags)?,
            active: Mutex::new(Active::default()),
        }))
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Says each connection and its end on stderr (a connection that ends on a protocol
    /// error is said whatever this is).
    pub fn set_log(&self, on: bool) {
        self.log.store(on, Ordering::Relaxed);
    }

    /// Whether a VMM is connected now.
    pub fn is_attached(&self) -> bool {
        self.active().connection.is_some()
    }

    /// Turns every VMM that connects from now on away (see the module's header) and says
    /// whether one is attached: what a host asks before it ends the device, with no window
    /// in which a VMM attaches unseen and is then cut off.
    pub fn close(&self) -> bool {
        let mut active = self.active();
        active.closed = true;
        active.connection.is_some()
    }

    /// Serves VMMs again after a [`close`](Server::close) (the device stays): one waiting in
    /// the backlog is taken now.
    pub fn reopen(&self) {
        self.active().closed = false;
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn is_closed(&self) -> bool {
        self.active().closed
    }

    fn active(&self) -> std::sync::MutexGuard<'_, Active> {
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Stops: no more connections are taken, and the one being served ends. Each queue
    /// finishes the request in hand and puts it on the used ring, and takes no other: the
    /// VMM, reconnecting to a server started again, resumes at the used index, and the
    /// requests it posted after are run then.
    ///
    /// The connection is closed only once no queue holds a request: the VMM reads the used
    /// index when it sees the close (QEMU: `virtio_queue_restore_last_avail_idx`), and a
    /// request put on the used ring after that would leave the ring's used index one ahead
    /// of where the next server takes requests from (vhost-user-backend reads it from
    /// guest memory at `SET_VRING_ADDR`): that server runs the request again, and the guest
    /// finds a head it does not hold and marks its queue broken, failing every request
    /// after (seen under load: QEMU's reconnect after a restart, `scripts/vm-swap.sh`).
    /// The wait and the close are a thread's of their own, so the caller (a signal's) is
    /// never held by a device that does not answer; [`stop_now`](Server::stop_now) closes
    /// at once. Closes this does not cover: a VMM's own, and the daemon's on a message it
    /// refuses (`INFLIGHT_SHMFD` would cover those; module `backend`).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        // Taken out of `active`, which is never held across a request.
        let connection = self.active().connection.clone();
        if let Some((handle, blk)) = connection {
            let at_once = handle.clone();
            let closer = std::thread::Builder::new()
                .name("vhost-stop".into())
                .spawn(move || {
                    blk.wait_for_requests_in_hand();
                    handle.shutdown();
                });
            if closer.is_err() {
                at_once.shutdown();
            }
        }
    }

    /// Stops at once (a second signal): as [`stop`](Server::stop), but the connection is
    /// closed now, whatever a queue has in hand; the VMM may run that request again.
    pub fn stop_now(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
        if let Some((handle, _)) = self.active().connection.as_ref() {
            handle.shutdown();
        }
    }

    /// Serves VMMs connecting on `listener`, one connection at a time, until [`stop`]; a
    /// connection's end (the VMM gone, or reconnecting) is not an error.
    ///
    /// [`stop`]: Server::stop
    pub fn serve(&self, listener: UnixListener) -> Result<(), VhostError> {
        // The daemon accepts through a handle of its own on the same socket; this one is
        // polled beside the stop eventfd, so a stop never waits for a VMM to connect.
        let accepting = listener.try_clone().map_err(VhostError::Socket)?;
        let mut vhost_listener = vhost::vhost_user::Listener::from(accepting);
        while !self.is_stopping() {
            let mut fds = [
                PollFd::new(&self.wake, PollFlags::IN),
                PollFd::new(&listener, PollFlags::IN),
            ];
            // Closed: a VMM that connects waits in the backlog; only a wake (a stop or a
            // reopen) is looked for.
            let watched = if self.is_closed() { 1 } else { 2 };
            match rustix::event::poll(&mut fds[..watched], None) {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(VhostError::Socket(e.into())),
            }
            if self.is_stopping() {
                break;
            }
            if fds[0].revents().contains(PollFlags::IN) {
                // A reopen's wake, read so that the next poll waits again.
                let _ = rustix::io::read(&self.wake, &mut [0u8; 8]);
            }
            if watched < 2 || !fds[1].revents().contains(PollFlags::IN) {
                continue;
            }
            // Closed since the poll began watching the listener: the VMM waits in the
            // backlog until a reopen, as one that connects while closed does (accepted, it
            // would only be turned away).
            if self.is_closed() {
                continue;
            }
            self.serve_one(&mut vhost_listener)?;
        }
        Ok(())
    }

    /// Takes the connection waiting on `listener` and serves it to its end.
    fn serve_one(&self, listener: &mut vhost::vhost_user::Listener) -> Result<(), VhostError> {
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::<()>::new());
        let blk = Arc::new(Blk::new(
            Arc::clone(&self.dev),
            self.config.clone(),
            mem.clone(),
            Arc::clone(&self.stats),
            Arc::clone(&self.stopping),
        ));
        let mut daemon = VhostUserDaemon::new("ztier-vhost".into(), Arc::clone(&blk), mem)
            .map_err(|e| VhostError::Daemon(e.into()))?;
        daemon
            .start(listener)
            .map_err(|e| VhostError::Daemon(e.into()))?;
        let id = self.stats.connections.fetch_add(1, Ordering::Relaxed) + 1;
        if self.log.load(Ordering::Relaxed) {
            eprintln!("vhost-user: connection {id}");
        }
        let turned_away = {
            let mut active = self.active();
            active.connection = daemon.shutdown_handle().map(|h| (h, Arc::clone(&blk)));
            // A stop that came before the connection was set as active ends it now, and
            // a close lets it go before its first message: the host that closed counted
            // no VMM.
            let turned_away = active.closed && !self.is_stopping();
            if self.is_stopping() || active.closed {
                if let Some((h, _)) = active.connection.as_ref() {
                    h.shutdown();
                }
            }
            turned_away
        };
        if turned_away {
            self.stats.turned_away.fetch_add(1, Ordering::Relaxed);
            eprintln!("vhost-user: connection {id} turned away: the disk is being ended");
        }
        let ended = daemon.wait();
        self.active().connection = None;
        // The workers end (each finishes the request in hand first); the daemon's drop
        // joins them.
        blk.stop_workers();
        drop(daemon);
        match ended {
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => {
                if self.log.load(Ordering::Relaxed) {
                    eprintln!("vhost-user: connection {id} ended");
                }
            }
            // Anything else ends this connection, not the server: the next VMM is served.
            Err(e) => {
                self.stats.protocol_errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("vhost-user: connection {id} ended: {e}");
            }
        }
        Ok(())
    }
}
