//! The NBD server: serves [`BlockDevice`]s as exports by name ([`Exports`], asked at each
//! negotiation: one fixed export for [`Server::new`], a changing set for
//! [`Server::with_exports`]) to any number of connections.
//!
//! A connection is one thread through the handshake (fixed newstyle; options EXPORT_NAME,
//! ABORT, LIST, INFO, GO, STRUCTURED_REPLY, LIST/SET_META_CONTEXT), then a few threads that
//! take turns at reading (leader and followers): the one whose turn it is reads a request
//! whole, hands the turn on, runs the request on the device and writes its reply. Replies go
//! in whatever order requests finish (clients match them by cookie). A payload is read and
//! stored by one thread, on one core's cache, and no request waits in a queue (faster for
//! nbdcopy's writes than a reader handing requests to workers through a queue: docs/diary.md,
//! "The NBD server: accept, turns, idle trim, dictionary level").
//!
//! Invariants and bounds:
//! - a request is run only once its header and whole payload have arrived: a write cut
//!   short by a disconnect changes nothing;
//! - the buffer bytes of requests in flight are bounded per connection
//!   (`max_in_flight_bytes`) and for the whole server (`max_in_flight_total`: three quarters
//!   in flight, a quarter kept for reuse). Half of the in-flight part is reserved, an equal
//!   share for each of `max_connections` but never less than one small request's buffers
//!   (64 KiB), and a request takes its connection's share first: clients that stop reading
//!   their replies can hold only the other half (until they are cut off), so they delay no
//!   other connection's requests of up to its share, whichever export either serves (a
//!   server allowed more connections than its budget gives 64 KiB each holds up to
//!   `max_connections` × 64 KiB in flight instead, and nothing shared). Bounded too
//!   are the payload of one request
//!   (`max_payload`), option data, and the connections (`max_connections`: one more is
//!   greeted and closed); a client that reads none of its replies for `reply_timeout` is cut
//!   off, and what its requests held goes back;
//! - a stop ends handshakes under way at once, and admitted connections once their requests
//!   in flight are answered;
//! - a handshake must end within `handshake_limit` (10 s, qemu-nbd's default) or its
//!   connection is closed; handshakes under way are not counted against `max_connections`
//!   (a client that stalls mid-handshake cannot shut out others) but have their own bounds,
//!   `max_handshakes` in all and `max_handshakes_per_peer` for each peer (a user on a Unix
//!   socket, an address on TCP), past which a new connection is closed at once: one peer's
//!   stalled handshakes never take the places of another's;
//! - a connection costs one file descriptor (its handles share it);
//! - an error from `accept()` (out of file descriptors, a connection aborted) is logged and
//!   accepting goes on after a backoff of 10 ms doubling to 1 s: it never ends the server;
//! - `stop` wakes the accept loop through an eventfd polled beside the listener, so it works
//!   whatever happened to the socket's path;
//! - a malformed request header (bad magic) closes that connection, as the spec requires;
//!   every other bad request gets an error reply and the connection goes on.
//!
//! TLS (`ServerConfig::tls`, [`crate::tls`]): with it on or required, `NBD_OPT_STARTTLS`
//! upgrades the socket mid-haggling (under the same deadline) and the haggling goes on inside
//! TLS; required, every other option before it is answered `NBD_REP_ERR_TLS_REQD`. In the
//! transmission phase the reading thread and the writing threads share the one TLS
//! connection, decrypting and encrypting under its lock and touching the socket outside it.
//! A plain connection's halves are the socket's, as before.
//!
//! Exports change while the server runs: a connection keeps the export it opened; a name
//! the [`Exports`] no longer opens is refused to new clients (`NBD_REP_ERR_UNKNOWN`, or a
//! closed connection after `NBD_OPT_EXPORT_NAME`, as the spec has it), and
//! [`Server::disconnect_export`] ends the connections that hold it as a stop does (their
//! requests in flight answered, then closed). A handshake that opened an export before it
//! was removed and is admitted after its disconnect is not let in: every disconnect is
//! counted under `connections`, and an admission that sees a new one opens the name again.
//! Each export keeps its own counters ([`ExportStats`], [`Server::stats_for`]) beside the
//! server's totals.
//!
//! The server and its shared state are here; its two phases are child modules: `handshake`
//! (options, STARTTLS, the deadline, the connection count) and `transmission` (the
//! connection's threads, requests, replies, budgets), and `exports` says what is served.
//! The sockets are `crate::transport`'s.
//!
//! Locking, per connection: `Turn` (the socket's read half) is held for reading one whole
//! request, waiting for credit included, never while the device runs or a reply is written;
//! `Writer` (the write half) is held for one whole reply, so replies never interleave;
//! `Credit` is held only to count. Neither of the last two is held while the device runs.
//! Under TLS, the connection's rustls state is a leaf taken inside `Turn` or `Writer` only
//! to decrypt or encrypt at most 256 KiB, never across socket I/O, so a reply blocked on a
//! full socket never stops the reader.
//! The server's `connections` list is locked only to add, remove, count, or shut some or
//! all; an [`Exports`] is never called with it (or any server lock) held, and an
//! [`ExportTable`]'s lock is a leaf.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ztier_blockdev::{BlockDevice, BlockError};

use crate::buffers::{mapped_len, Buffer, Buffers, KeptBytes};
use crate::proto::{self, *};
use crate::tls::{ServerTls, TlsMode};
use crate::transport::{
    accept_error_is_fatal, set_blocking, wait_for_client, ReadHalf, Transport, WriteHalf,
};
pub use crate::transport::{Listener, Peer, Stream};

/// How a server serves its exports.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The export's name, for [`Server::new`]; "" (the default export) is also accepted.
    /// [`Server::with_exports`] ignores it, as it does `description` and `read_only`: each
    /// [`Export`] carries its own.
    pub export_name: String,
    pub description: Option<String>,
    pub read_only: bool,
    pub max_connections: usize,
    /// Smallest block advertised (`NBD_INFO_BLOCK_SIZE` minimum); enforced only for clients
    /// that asked for block sizes.
    pub min_block: u32,
    /// Largest payload of one request.
    pub max_payload: u32,
    /// Threads per connection, taking turns at reading: requests run at once on one.
    pub workers_per_connection: usize,
    /// Payload bytes of requests queued or running per connection.
    pub max_in_flight_bytes: usize,
    /// Log each connection and its end on stderr.
    pub log: bool,
    /// How long a connection may take over its handshake.
    pub handshake_limit: Duration,
    /// Handshakes under way at once; a connection past them is closed at once.
    pub max_handshakes: usize,
    /// Handshakes under way at once from one peer (a user on a Unix socket, an address on
    /// TCP); a connection past them is closed at once, so one peer that stalls its
    /// handshakes cannot take every place of `max_handshakes` from the others.
    pub max_handshakes_per_peer: usize,
    /// Bytes of request and reply buffers for the whole server, whatever the clients do:
    /// three quarters for requests in flight (a connection past its share waits for credit,
    /// as one past `max_in_flight_bytes` does), a quarter kept for reuse, so no mix of
    /// clients holds more; but each of `max_connections` is guaranteed one small request's
    /// buffers (64 KiB), so a budget under `max_connections` × 171 KiB is exceeded up to
    /// `max_connections` × 64 KiB in flight.
    pub max_in_flight_total: usize,
    /// How long a reply may wait for a client to read: a client that reads none of its
    /// replies for this long is cut off, and what its requests held goes back.
    pub reply_timeout: Duration,
    /// TLS (`NBD_OPT_STARTTLS`): off, on (for the clients that ask) or required, with the
    /// certificates ([`ServerTls::from_dir`]). The TLS handshake counts against
    /// `handshake_limit` like the rest of the haggling.
    pub tls: ServerTls,
    /// The send buffer (`SO_SNDBUF`) asked for each connection on a Unix socket; 0 keeps the
    /// system's. The kernel doubles it and caps it at `net.core.wmem_max`. A Unix socket's
    /// default (about 208 KiB) is smaller than one of nbdcopy's 256 KiB read replies, so its
    /// sender would block partway through each while the connection's other threads wait
    /// for the writer, and the cores idle between the wake-ups (docs/diary.md). TCP
    /// connections keep the kernel's autotuning.
    pub unix_send_buffer: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export_name: String::new(),
            description: None,
            read_only: false,
            max_connections: 16,
            min_block: 512,
            max_payload: 32 << 20,
            workers_per_connection: 4,
            max_in_flight_bytes: 64 << 20,
            log: false,
            handshake_limit: Duration::from_secs(10),
            max_handshakes: 256,
            max_handshakes_per_peer: 16,
            max_in_flight_total: 256 << 20,
            reply_timeout: Duration::from_secs(30),
            tls: ServerTls::off(),
            unix_send_buffer: 1 << 20,
        }
    }
}

/// Counts kept while serving.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub refused_connections: AtomicU64,
    /// Connections closed because their handshake went past the limit or was malformed.
    pub failed_handshakes: AtomicU64,
    /// TLS handshakes completed (after `NBD_OPT_STARTTLS`).
    pub tls_sessions: AtomicU64,
    /// `accept()` errors (each retried after a backoff).
    pub accept_errors: AtomicU64,
    /// Request headers read (`NBD_CMD_DISC` among them, which has no reply).
    pub requests: AtomicU64,
    /// Replies sent whole: with `requests`, what the server owes its clients (a request
    /// read and not yet answered is running, waiting for a budget, or lost with its
    /// connection).
    pub replies: AtomicU64,
    pub errors: AtomicU64,
    /// Buffer bytes of the requests in flight now, server-wide (at most three quarters of
    /// `max_in_flight_total`, but for one request larger than that running alone).
    pub in_flight_bytes: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
}

mod exports;
mod handshake;
mod transmission;

pub use exports::{Export, ExportCounts, ExportStats, ExportTable, Exports, SingleExport};
use transmission::Credit;

/// The server of a set of exports.
pub struct Server {
    /// What is served, asked at each negotiation (never with a lock of ours held).
    exports: Arc<dyn Exports>,
    config: ServerConfig,
    stats: ServerStats,
    stopping: AtomicBool,
    /// Every admitted connection (its socket, to shut it at stop or at its export's
    /// disconnect, and its export's name), and the disconnects so far.
    connections: Mutex<Admitted>,
    /// Handshakes under way.
    handshakes: AtomicUsize,
    /// Handshakes under way per peer (held only to count; a leaf).
    handshakes_by_peer: Mutex<std::collections::HashMap<Peer, usize>>,
    /// A clone of the socket of each handshake under way, so a stop ends them at once
    /// instead of at their deadline.
    handshaking: Mutex<Vec<(u64, Stream)>>,
    /// Buffer bytes of requests in flight, for the whole server: the part every connection
    /// shares (half of the in-flight budget); the other half is reserved, a share each of
    /// `max_connections` (`reserve_share`), for the connection's own requests.
    credit: Credit,
    reserve_share: usize,
    /// Buffer bytes kept for reuse, for the whole server.
    kept: Arc<KeptBytes>,
    /// An eventfd the accept loop polls beside its listener, made when it starts; `stop`
    /// writes to it.
    wake: Mutex<Option<Arc<OwnedFd>>>,
}

/// The connections admitted to the transmission phase (or about to be: a handshake takes
/// its place just before its last reply).
#[derive(Default)]
struct Admitted {
    list: Vec<Admission>,
    /// Calls of [`Server::disconnect_export`] so far: a handshake that opened its export
    /// before one and is admitted after it opens the name again, so a removed export's
    /// disconnect cannot miss a client that was half way in.
    disconnects: u64,
}

/// One admitted connection.
struct Admission {
    id: u64,
    /// A clone of its socket.
    stream: Stream,
    /// Its export's canonical name.
    export: String,
    /// Its export's counters.
    stats: Arc<ExportStats>,
}

/// Why a connection was not admitted to an export.
enum Refused {
    /// No export of that name (now).
    Unknown,
    /// `max_connections` are taken, or the server is stopping.
    Full,
}

impl Server {
    /// A server of one export, `dev`, under `config.export_name` and as the default export,
    /// described and read-only as `config` says.
    pub fn new(dev: Arc<dyn BlockDevice>, config: ServerConfig) -> Arc<Server> {
        let export = Export::new(config.export_name.clone(), dev)
            .with_description(config.description.clone().unwrap_or_default())
            .with_read_only(config.read_only);
        Server::with_exports(Arc::new(SingleExport::new(export)), config)
    }

    /// A server of whatever `exports` opens, asked at each negotiation: the set may change
    /// while it serves. `config`'s export name, description and read-only flag are not
    /// used (each [`Export`] has its own); its bounds and budgets are the whole server's.
    pub fn with_exports(exports: Arc<dyn Exports>, config: ServerConfig) -> Arc<Server> {
        let (in_flight, kept) = (
            config.max_in_flight_total / 4 * 3,
            config.max_in_flight_total / 4,
        );
        let connections = config.max_connections.max(1);
        // A connection's reserve holds at least one small request's buffers (a 4 KiB read
        // maps 64 KiB): an equal split of a server allowed many connections would give each
        // less, and then clients that read no replies, holding the shared part, would stall
        // every other client's (every other export's) smallest request until they are cut
        // off. Past `max_in_flight_total / 4 * 3 / 2 / 64 KiB` connections the reserves
        // cost more than half the in-flight part, and the shared part shrinks to make up.
        let reserve_share = (in_flight / 2 / connections).max(mapped_len(1));
        Arc::new(Server {
            exports,
            config,
            stats: ServerStats::default(),
            stopping: AtomicBool::new(false),
            connections: Mutex::new(Admitted::default()),
            handshakes: AtomicUsize::new(0),
            handshakes_by_peer: Mutex::new(std::collections::HashMap::new()),
            handshaking: Mutex::new(Vec::new()),
            credit: Credit::new(in_flight.saturating_sub(reserve_share * connections)),
            reserve_share,
            kept: Arc::new(KeptBytes::new(kept)),
            wake: Mutex::new(None),
        })
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// The default export's device (a server made by [`new`](Self::new) has one), if any.
    pub fn device(&self) -> Option<Arc<dyn BlockDevice>> {
        self.exports.open("").map(|e| e.device)
    }

    /// What this server serves.
    pub fn exports(&self) -> &Arc<dyn Exports> {
        &self.exports
    }

    /// Connections that hold the export `name` (its canonical name) now: in their
    /// transmission phase, or admitted at their handshake's last reply.
    pub fn connections_to(&self, name: &str) -> usize {
        let admitted = self.connections.lock().expect("connections");
        admitted.list.iter().filter(|a| a.export == name).count()
    }

    /// Ends every connection that holds the export `name`, as [`stop`](Self::stop) ends
    /// them all: each stops reading requests, answers those in flight (or fails to, if its
    /// client reads none, at `reply_timeout`) and closes; returns how many were told. A
    /// handshake that opened `name` before this call is not admitted after it unless
    /// [`Exports::open`] still gives it. To take an export away: remove it from the
    /// [`Exports`] first (new clients are refused), then call this, then wait for
    /// [`connections_to`](Self::connections_to) to reach 0 (or
    /// [`disconnect_export_now`](Self::disconnect_export_now)).
    pub fn disconnect_export(&self, name: &str) -> usize {
        self.shut_export(name, Shutdown::Read)
    }

    /// As [`disconnect_export`](Self::disconnect_export), but cuts the connections now:
    /// replies in flight are lost (their clients see the connection close).
    pub fn disconnect_export_now(&self, name: &str) -> usize {
        self.shut_export(name, Shutdown::Both)
    }

    fn shut_export(&self, name: &str, how: Shutdown) -> usize {
        let mut admitted = self.connections.lock().expect("connections");
        admitted.disconnects += 1;
        let held = admitted.list.iter().filter(|a| a.export == name);
        held.clone().for_each(|a| a.stream.shutdown(how));
        held.count()
    }

    /// The counters of the export `name`: those of a connection that holds it, else of
    /// what [`Exports::open`] gives for it; `None` if neither knows the name.
    pub fn stats_for(&self, name: &str) -> Option<ExportCounts> {
        let held = {
            let admitted = self.connections.lock().expect("connections");
            let found = admitted.list.iter().find(|a| a.export == name);
            found.map(|a| Arc::clone(&a.stats))
        };
        held.or_else(|| self.exports.open(name).map(|e| e.stats))
            .map(|s| s.counts())
    }

    /// Stops accepting, and ends every connection once its requests in flight are answered.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for (_, s) in self.handshaking.lock().expect("handshaking").iter() {
            s.shutdown(Shutdown::Both);
        }
        for a in self.connections.lock().expect("connections").list.iter() {
            a.stream.shutdown(Shutdown::Read);
        }
        // The accept loop polls the eventfd beside its listener. (A loop that has not made
        // it yet finds `stopping` set: it publishes the eventfd first, then looks.)
        if let Some(wake) = self.wake.lock().expect("wake").as_ref() {
            let _ = rustix::io::write(wake.as_ref(), &1u64.to_ne_bytes());
        }
    }

    /// Stops as [`stop`](Self::stop) does, and cuts every connection now, without waiting
    /// for the replies in flight (a client that reads none of its replies would hold a stop
    /// for its reply timeout).
    pub fn stop_now(&self) {
        self.stop();
        for a in self.connections.lock().expect("connections").list.iter() {
            a.stream.shutdown(Shutdown::Both);
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Accepts connections until [`stop`](Self::stop), each on its own thread; returns once
    /// every connection has ended.
    ///
    /// The loop sleeps in `poll` on the listener and the stop eventfd, so a client is taken
    /// the moment it connects (a periodic poll delayed each of nbdcopy's two connections by
    /// up to its period) and a stop is seen at once. An error from `accept()` (EMFILE, ENFILE,
    /// ENOBUFS, ECONNABORTED, ...) is counted, logged once per run of them, and retried
    /// after a backoff; only a listener that is no socket at all ends the loop with an error.
    pub fn serve(self: &Arc<Self>, listener: Listener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK;
        let wake = Arc::new(rustix::event::eventfd(0, flags)?);
        *self.wake.lock().expect("wake") = Some(Arc::clone(&wake));
        let mut handles: Vec<std::thread::JoinHandle<()>> = Vec::new();
        let mut next_id = 0u64;
        let mut backoff = Duration::ZERO;
        // Given up for a moment when the process is out of descriptors, so that a client
        // waiting to be accepted is taken and turned away (it sees a server close on it)
        // instead of hanging in the listener's backlog with nothing said.
        let mut spare = spare_descriptor();
        while !self.is_stopping() {
            // Given up to take a client once, and taken by someone else meanwhile: tried for
            // again, so the next time the process is out of descriptors there is one.
            if spare.is_none() {
                spare = spare_descriptor();
            }
            if !wait_for_client(&wake, &listener, backoff)? {
                continue;
            }
            if self.is_stopping() {
                break;
            }
            handles.retain(|h| !h.is_finished());
            let stream = match listener.accept() {
                Ok(s) => {
                    backoff = Duration::ZERO;
                    s
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) if accept_error_is_fatal(&e) => return Err(e),
                Err(e) => {
                    self.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                    let out_of_descriptors =
                        matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                    if out_of_descriptors && spare.take().is_some() {
                        if let Ok(s) = listener.accept() {
                            next_id += 1;
                            self.turn_away_for(next_id, s, "the server is out of file descriptors");
                        }
                        spare = spare_descriptor();
                    }
                    if backoff.is_zero() && out_of_descriptors {
                        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
                            .current
                            .map_or("unlimited".to_string(), |n| n.to_string());
                        eprintln!(
                            "nbd: out of file descriptors (the limit is {limit}): connections \
                             are turned away; raise it (LimitNOFILE= in a service unit)"
                        );
                    } else if backoff.is_zero() {
                        eprintln!("nbd: accepting a connection failed: {e}; retrying with backoff");
                    }
                    backoff =
                        (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                    continue;
                }
            };
            set_blocking(&stream)?;
            next_id += 1;
            let id = next_id;
            let server = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name(format!("nbd-conn-{id}"))
                .spawn(move || server.handle(id, stream));
            match spawned {
                Ok(h) => handles.push(h),
                // No thread to be had: that client goes (its socket closes with the closure).
                Err(e) => {
                    self.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("nbd: no thread for connection {id}: {e}");
                }
            }
        }
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }
}

/// A descriptor to give up when the process has none left (`/dev/null`, opened now).
fn spare_descriptor() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// What the handshake settled.
#[derive(Debug, Default, Clone, Copy)]
struct Session {
    structured: bool,
    base_allocation: bool,
    /// The client asked for block sizes, so their constraints are enforced.
    block_sizes: bool,
}

/// Reads and drops `n` bytes.
fn discard(s: &mut impl Read, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut s.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn invalid(e: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}
