//! The link to the store: one connection, lost and found again.
//!
//! A socket error or a request that waits past `io_timeout` marks the store lost and drops
//! the connection (its stream may be out of step). What happens next depends on whether the
//! store can be recognised: NBD cannot tell a server that came back from a new one (a
//! restarted `memory` export reads back zeros where the pages were), so the owner pins an
//! identity ([`Core::pin_identity`]: bytes the export holds and no other store would, such
//! as the header with a random id that zram's backing store writes).
//!
//! With an identity, a reconnector thread dials the store by itself from the moment it is
//! lost, with backoff (100 ms doubling to `max_backoff`, 1 s by default), so a store that is
//! back is found within about that long whether or not requests come. A request meanwhile
//! waits for the link, up to `io_timeout` from when it began, and is then sent again on
//! the new connection (every request ztier sends may be repeated: a read, a write of the
//! same bytes to the same place, a trim, a zero write, a flush): an outage shorter than the
//! timeout costs latency, not errors. Past the timeout it fails with an error that says
//! since when and why. On every reconnect the export must have its old size and hold the
//! identity; one that does not is refused, loudly, and never read. Without an identity a
//! lost link fails requests at once and is dialed again only when the owner asks
//! ([`Core::reconnect`]).
//!
//! States of the wire, and what moves them:
//!
//! | from | event | to |
//! |---|---|---|
//! | `Up` | a request's I/O fails or times out | `Down` (next try now), reconnector started |
//! | `Down` | the reconnector's (or the owner's) try is due | `Dialing` |
//! | `Dialing` | the store answers and is the same store | `Up`, waiters woken |
//! | `Dialing` | unreachable, or another store | `Down` (next try after the backoff) |
//!
//! Locking: `link` (the wire, its state and history; held for one whole request and its
//! reply, or a window of pipelined ones, never while dialing) → `shown` (the state as last
//! published, which `status` reads alone), `identity` and `log` (leaves). Waiters for the
//! link wait on `changed` with `link` let go.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use ztier_blockdev::{BlockError, Result};

use super::handshake::{handshake, io_err, open, read_exact, wire_error, ExportInfo};
use super::uri::Uri;
use super::ClientConfig;
use crate::proto::*;
use crate::tls::ClientTls;
use crate::transport::{Stream, Transport};

/// The first wait between reconnect tries; each failed try doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Where the link to the store stands, for the owner's `ctl` and statistics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkState {
    Connected,
    /// Lost; tries to reconnect (by itself, if it has an identity).
    Lost {
        /// Why it was lost, or why the last try failed.
        error: String,
        /// Tries made since.
        attempts: u64,
    },
    /// A store answered, but not the one the pages went to; tries go on.
    Refused {
        reason: String,
        attempts: u64,
    },
}

/// [`Client::status`](super::Client::status): the link's state, since when, and its history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkStatus {
    pub state: LinkState,
    /// When the state began.
    pub since: SystemTime,
    /// Times the link was lost, and found again.
    pub losses: u64,
    pub reconnects: u64,
    /// Whether the client reconnects by itself (an identity is pinned).
    pub reconnects_by_itself: bool,
}

impl std::fmt::Display for LinkStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = self.since.elapsed().unwrap_or_default().as_secs_f64();
        match &self.state {
            LinkState::Connected => write!(f, "connected for {ago:.1} s")?,
            LinkState::Lost { error, attempts } => write!(
                f,
                "lost {ago:.1} s ago, {attempts} tries to reconnect since ({error})"
            )?,
            LinkState::Refused { reason, attempts } => write!(
                f,
                "refused {ago:.1} s ago, {attempts} tries since: {reason}"
            )?,
        }
        write!(
            f,
            "; lost {} times, reconnected {} times",
            self.losses, self.reconnects
        )
    }
}

/// One connection to the store.
pub(super) struct Conn {
    stream: Transport<Stream>,
    next_cookie: u64,
    /// The socket's read and write timeout now: `io_timeout`, or less for a request that
    /// waited for the link and has only the rest of its time.
    timeout: Duration,
}

/// One request of a pipelined batch.
pub(super) struct Pipelined<'a> {
    pub(super) offset: u64,
    pub(super) data: PipelinedData<'a>,
}

pub(super) enum PipelinedData<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl Pipelined<'_> {
    pub(super) fn len(&self) -> usize {
        match &self.data {
            PipelinedData::Read(b) => b.len(),
            PipelinedData::Write(d) => d.len(),
        }
    }
}

impl Conn {
    fn new(stream: Transport<Stream>, timeout: Duration) -> Conn {
        Conn {
            stream,
            next_cookie: 1,
            timeout,
        }
    }

    /// One request and its simple reply; `write` is the payload of a write, `read` receives
    /// a read's data. The server's errno (0: done).
    pub(super) fn request(
        &mut self,
        header: RequestHeader,
        write: Option<&[u8]>,
        read: Option<&mut [u8]>,
    ) -> io::Result<u32> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let encoded = Request {
            flags: header.flags,
            kind: header.kind,
            cookie,
            offset: header.offset,
            length: header.length,
        }
        .encode();
        let s = &mut self.stream;
        match write {
            Some(data) => {
                let mut m = Vec::with_capacity(REQUEST_LEN + data.len());
                m.extend_from_slice(&encoded);
                m.extend_from_slice(data);
                s.write_all(&m)?;
            }
            None => s.write_all(&encoded)?,
        }
        let mut reply = [0u8; SIMPLE_REPLY_LEN];
        read_exact(s, &mut reply, "a reply")?;
        let reply = SimpleReply::decode(&reply).map_err(|e| io_err("a reply", e))?;
        if reply.cookie != cookie {
            return Err(io_err("a reply", "a cookie not in flight"));
        }
        if reply.error == 0 {
            if let Some(out) = read {
                read_exact(s, out, "a read's data")?;
            }
        }
        Ok(reply.error)
    }

    /// Sends every request of `window`, then reads as many replies, which the server may
    /// send in any order (each is matched by its cookie); the errno of each, in the
    /// window's order.
    pub(super) fn window(
        &mut self,
        kind: u16,
        window: &mut [Pipelined<'_>],
    ) -> io::Result<Vec<u32>> {
        let base = self.next_cookie;
        self.next_cookie += window.len() as u64;
        let mut out = Vec::new();
        for (i, op) in window.iter().enumerate() {
            let header = Request {
                flags: 0,
                kind,
                cookie: base + i as u64,
                offset: op.offset,
                length: op.len() as u32,
            }
            .encode();
            out.extend_from_slice(&header);
            if let PipelinedData::Write(data) = &op.data {
                out.extend_from_slice(data);
            }
        }
        self.stream.write_all(&out)?;
        let mut errnos = vec![None; window.len()];
        for _ in 0..window.len() {
            let mut reply = [0u8; SIMPLE_REPLY_LEN];
            read_exact(&mut self.stream, &mut reply, "a reply")?;
            let reply = SimpleReply::decode(&reply).map_err(|e| io_err("a reply", e))?;
            let i = reply.cookie.wrapping_sub(base);
            let slot = usize::try_from(i)
                .ok()
                .filter(|&i| i < window.len() && errnos[i].is_none())
                .ok_or_else(|| io_err("a reply", "a cookie not in flight"))?;
            errnos[slot] = Some(reply.error);
            if reply.error == 0 {
                if let PipelinedData::Read(buf) = &mut window[slot].data {
                    read_exact(&mut self.stream, buf, "a read's data")?;
                }
            }
        }
        Ok(errnos.into_iter().map(|e| e.unwrap_or(0)).collect())
    }

    /// Sets the socket's timeouts to `t`, if they are not that already.
    fn set_timeout(&mut self, t: Duration) -> io::Result<()> {
        if self.timeout != t {
            self.stream.socket().set_timeouts(Some(t))?;
            self.timeout = t;
        }
        Ok(())
    }

    /// `NBD_CMD_DISC` (and TLS's close_notify): the polite end.
    fn disconnect(&mut self) {
        let header = Request {
            flags: 0,
            kind: CMD_DISC,
            cookie: self.next_cookie,
            offset: 0,
            length: 0,
        }
        .encode();
        let _ = self.stream.write_all(&header);
        self.stream.close_notify();
    }
}

/// A request's header fields but its cookie (the connection numbers them).
#[derive(Debug, Clone, Copy)]
pub(super) struct RequestHeader {
    pub(super) kind: u16,
    pub(super) flags: u16,
    pub(super) offset: u64,
    pub(super) length: u32,
}

/// Where the owner's log lines go.
type LogFn = Box<dyn Fn(&str) + Send + Sync>;

/// The connection, or why there is none.
enum Wire {
    Up(Conn),
    /// Lost or refused: the next try is due at `next_try`.
    Down {
        next_try: Instant,
        backoff: Duration,
    },
    /// A thread is dialing, with the lock let go.
    Dialing,
}

struct Link {
    wire: Wire,
    state: LinkState,
    since: SystemTime,
    losses: u64,
    reconnects: u64,
    /// A reconnector thread is running.
    reconnecting: bool,
}

/// Why a dial failed.
enum DialError {
    /// The store could not be reached or negotiated with.
    Unreachable(BlockError),
    /// A store answered, but not the one the pages went to.
    Refused(String),
}

/// The link and what dialing needs, shared by the client and its reconnector thread.
pub(super) struct Core {
    pub(super) uri: Uri,
    pub(super) config: ClientConfig,
    pub(super) info: ExportInfo,
    /// TLS, for an `nbds` URI: made once, used by every dial.
    tls: Option<ClientTls>,
    link: Mutex<Link>,
    /// Told when the wire goes up or down, and when the client goes: requests waiting for
    /// the link and the reconnector's backoff wait on it.
    changed: Condvar,
    /// The link's state as last published under `link` (a leaf): what `status` reads, so
    /// it never waits behind a request on the network.
    shown: Mutex<LinkStatus>,
    /// Losses and reconnects so far, as last published: [`BlockDevice::epoch`].
    ///
    /// [`BlockDevice::epoch`]: ztier_blockdev::BlockDevice::epoch
    epoch: AtomicU64,
    /// Bytes at an offset the export must hold on every reconnect.
    identity: Mutex<Option<(u64, Vec<u8>)>>,
    log: Mutex<Option<LogFn>>,
    /// The client is gone: the reconnector ends.
    closing: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error from the socket in words: a timeout says how long, not "os error 11".
fn in_words(e: io::Error, timeout: Duration) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer within {:.1} s", timeout.as_secs_f64()),
        ),
        _ => e,
    }
}

/// The least time a request's I/O is given on a link that is up, however little of its
/// time waiting for the link left it: one found just at its deadline still gets an answer
/// from a store that is back.
const LEAST_IO_TIME: Duration = Duration::from_secs(1);

impl Core {
    /// Connects to `uri` and negotiates its export.
    pub(super) fn dial(
        uri: &Uri,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<(Conn, ExportInfo)> {
        let stream = open(&uri.target, timeout)
            .map_err(|e| BlockError::Io(io_err(format!("connecting to {uri}"), e)))?;
        Core::negotiate(stream, uri, timeout, tls)
    }

    /// The handshake over a connected stream.
    pub(super) fn negotiate(
        stream: Stream,
        uri: &Uri,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<(Conn, ExportInfo)> {
        let (stream, info) = handshake(stream, &uri.export, tls).map_err(|e| {
            BlockError::Io(io_err(
                format!("negotiating with {uri}"),
                in_words(e, timeout),
            ))
        })?;
        Ok((Conn::new(stream, timeout), info))
    }

    pub(super) fn new(
        uri: &Uri,
        config: ClientConfig,
        info: ExportInfo,
        conn: Conn,
        tls: Option<ClientTls>,
    ) -> Arc<Core> {
        let since = SystemTime::now();
        Arc::new(Core {
            uri: uri.clone(),
            config,
            info,
            tls,
            link: Mutex::new(Link {
                wire: Wire::Up(conn),
                state: LinkState::Connected,
                since,
                losses: 0,
                reconnects: 0,
                reconnecting: false,
            }),
            changed: Condvar::new(),
            shown: Mutex::new(LinkStatus {
                state: LinkState::Connected,
                since,
                losses: 0,
                reconnects: 0,
                reconnects_by_itself: false,
            }),
            epoch: AtomicU64::new(0),
            identity: Mutex::new(None),
            log: Mutex::new(None),
            closing: AtomicBool::new(false),
        })
    }

    pub(super) fn set_identity(&self, offset: u64, bytes: Vec<u8>) {
        *lock(&self.identity) = Some((offset, bytes));
    }

    pub(super) fn set_log(&self, log: impl Fn(&str) + Send + Sync + 'static) {
        *lock(&self.log) = Some(Box::new(log));
    }

    fn log(&self, line: &str) {
        if let Some(log) = lock(&self.log).as_ref() {
            log(line);
        }
    }

    fn has_identity(&self) -> bool {
        lock(&self.identity).is_some()
    }

    /// The link's state, since when, and its history. It never waits on the network: a
    /// request in flight holds the link, not this.
    pub(super) fn status(&self) -> LinkStatus {
        let mut status = lock(&self.shown).clone();
        status.reconnects_by_itself = self.has_identity();
        status
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Publishes the link's state for `status` (called under the link's lock whenever the
    /// state changes), and wakes whoever waits for the link.
    fn publish(&self, link: &Link) {
        self.epoch
            .store(link.losses + link.reconnects, Ordering::Release);
        *lock(&self.shown) = LinkStatus {
            state: link.state.clone(),
            since: link.since,
            losses: link.losses,
            reconnects: link.reconnects,
            reconnects_by_itself: false,
        };
        self.changed.notify_all();
    }

    /// Runs `talk` on the connection, under the link's lock, within `io_timeout` from now.
    /// A lost link (with an identity) is waited for while the reconnector dials, and `talk`
    /// is run again on the new connection; without an identity a lost link fails at once.
    /// An error from `talk` leaves the stream out of step: it is dropped and the store
    /// counts as lost.
    pub(super) fn on_link<T>(
        self: &Arc<Self>,
        mut talk: impl FnMut(&mut Conn) -> io::Result<T>,
    ) -> Result<T> {
        let timeout = self.config.io_timeout;
        let mut link = lock(&self.link);
        // From when the request has the link: a wait behind other requests is theirs.
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let conn = match &mut link.wire {
                Wire::Up(conn) => conn,
                Wire::Down { .. } | Wire::Dialing if self.has_identity() && !left.is_zero() => {
                    self.start_reconnector(&mut link);
                    link = self
                        .changed
                        .wait_timeout(link, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    continue;
                }
                _ => return Err(self.down_error(&link, timeout)),
            };
            // The request within what is left of its time (each read and write of it).
            let io_time = left.max(LEAST_IO_TIME).min(timeout);
            let talked = conn
                .set_timeout(io_time)
                .and_then(|()| talk(conn))
                .map_err(|e| in_words(e, io_time));
            match talked {
                Ok(r) => {
                    if conn.timeout != timeout {
                        // Best effort: a socket that refuses it fails the next request.
                        let _ = conn.set_timeout(timeout);
                    }
                    return Ok(r);
                }
                Err(e) => {
                    self.lose(&mut link, &e);
                    if !self.has_identity() || Instant::now() >= deadline {
                        drop(link);
                        return Err(BlockError::Io(io_err(self.uri.to_string(), e)));
                    }
                }
            }
        }
    }

    /// The error of a request that found no link (or ran out of time waiting for one).
    fn down_error(&self, link: &Link, timeout: Duration) -> BlockError {
        let since = link.since.elapsed().unwrap_or_default().as_secs_f64();
        let why = match &link.state {
            LinkState::Lost { error, .. } => error.clone(),
            LinkState::Refused { reason, .. } => format!("refused: {reason}"),
            LinkState::Connected => "no answer".into(),
        };
        let how = if self.has_identity() {
            format!(
                "not back within the request's {:.1} s; reconnecting by itself",
                timeout.as_secs_f64()
            )
        } else {
            "reconnect to go on; what the export held may be gone".into()
        };
        BlockError::Io(io_err(
            self.uri.to_string(),
            format!("the store was lost {since:.1} s ago ({why}); {how}"),
        ))
    }

    /// The connection failed with `e`: it is dropped, the store counts as lost, and (with an
    /// identity) the reconnector starts dialing at once.
    fn lose(self: &Arc<Self>, link: &mut Link, e: &io::Error) {
        link.wire = Wire::Down {
            next_try: Instant::now(),
            backoff: FIRST_BACKOFF,
        };
        link.state = LinkState::Lost {
            error: e.to_string(),
            attempts: 0,
        };
        link.since = SystemTime::now();
        link.losses += 1;
        self.publish(link);
        let how = if self.has_identity() {
            "; reconnecting by itself"
        } else {
            ""
        };
        self.log(&format!("lost the store {}: {e}{how}", self.uri));
        if self.has_identity() {
            self.start_reconnector(link);
        }
    }

    /// Starts the reconnector thread if none runs.
    fn start_reconnector(self: &Arc<Self>, link: &mut Link) {
        if link.reconnecting || self.closing.load(Ordering::Acquire) {
            return;
        }
        let core = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nbd-reconnect".into())
            .spawn(move || core.reconnect_until_up());
        // Without a thread, the requests that wait still find the link when it is dialed
        // by the next owner's reconnect; nothing is lost but the dialing by itself.
        link.reconnecting = spawned.is_ok();
    }

    /// The reconnector: dials whenever a try is due, until the link is up or the client goes.
    fn reconnect_until_up(self: Arc<Self>) {
        let mut link = lock(&self.link);
        loop {
            if self.closing.load(Ordering::Acquire) {
                break;
            }
            match link.wire {
                Wire::Up(_) => break,
                Wire::Dialing => {
                    link = self
                        .changed
                        .wait_timeout(link, FIRST_BACKOFF)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                Wire::Down { next_try, .. } => {
                    let wait = next_try.saturating_duration_since(Instant::now());
                    if wait.is_zero() {
                        link = self.redial(link).0;
                    } else {
                        link = self
                            .changed
                            .wait_timeout(link, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                    }
                }
            }
        }
        link.reconnecting = false;
    }

    /// Makes sure of the link now: while it seems up, a request to the store proves it
    /// (a store killed a moment ago is found lost here, not at the next page read); while
    /// it is down, it is dialed at once, whatever the backoff says. An error while another
    /// thread is dialing. The export must have its old size and, if one is pinned, hold
    /// its identity.
    pub(super) fn reconnect(self: &Arc<Self>) -> Result<()> {
        let mut link = lock(&self.link);
        if let Wire::Up(conn) = &mut link.wire {
            let probe = RequestHeader {
                kind: CMD_READ,
                flags: 0,
                offset: 0,
                length: self.info.min_block.min(self.info.size as u32).max(1),
            };
            let mut buf = vec![0u8; probe.length as usize];
            match conn.request(probe, None, Some(&mut buf)) {
                Ok(_) => return Ok(()),
                Err(e) => {
                    let e = in_words(e, conn.timeout);
                    self.lose(&mut link, &e);
                }
            }
        }
        match link.wire {
            Wire::Up(_) => Ok(()),
            Wire::Dialing => Err(BlockError::Io(io_err(
                self.uri.to_string(),
                "a reconnect is already under way",
            ))),
            Wire::Down { .. } => self.redial(link).1,
        }
    }

    /// Dials the store with the link's lock let go meanwhile, so a store that stalls holds
    /// up no other request. Back under the lock, the link is up again, or down with the
    /// next try put off.
    fn redial<'a>(&'a self, mut link: MutexGuard<'a, Link>) -> (MutexGuard<'a, Link>, Result<()>) {
        let backoff = match link.wire {
            Wire::Down { backoff, .. } => backoff,
            _ => FIRST_BACKOFF,
        };
        link.wire = Wire::Dialing;
        drop(link);
        let dialed = self.dial_checked();
        let mut link = lock(&self.link);
        let attempts = match &link.state {
            LinkState::Lost { attempts, .. } | LinkState::Refused { attempts, .. } => attempts + 1,
            LinkState::Connected => 1,
        };
        match dialed {
            Ok(conn) => {
                let down_for = link.since.elapsed().unwrap_or_default().as_secs_f64();
                link.wire = Wire::Up(conn);
                link.state = LinkState::Connected;
                link.since = SystemTime::now();
                link.reconnects += 1;
                self.publish(&link);
                self.log(&format!(
                    "the store {} is back after {down_for:.1} s ({attempts} tries)",
                    self.uri
                ));
                (link, Ok(()))
            }
            Err(e) => {
                link.wire = Wire::Down {
                    next_try: Instant::now() + backoff,
                    backoff: (backoff * 2).min(self.config.max_backoff.max(FIRST_BACKOFF)),
                };
                let (state, err) = match e {
                    DialError::Unreachable(e) => (
                        LinkState::Lost {
                            error: e.to_string(),
                            attempts,
                        },
                        e,
                    ),
                    DialError::Refused(reason) => {
                        let newly = !matches!(&link.state,
                            LinkState::Refused { reason: r, .. } if *r == reason);
                        if newly {
                            self.log(&format!(
                                "REFUSED the store at {}: {reason}; its written-back pages \
                                 fail with EIO until the right store is back",
                                self.uri
                            ));
                        }
                        let err = BlockError::Io(io_err(
                            format!("reconnecting to {}", self.uri),
                            format!("refused: {reason}"),
                        ));
                        (LinkState::Refused { reason, attempts }, err)
                    }
                };
                // `since` stays: it is when the store was lost.
                link.state = state;
                self.publish(&link);
                (link, Err(err))
            }
        }
    }

    /// A new connection, checked to reach the store the pages went to.
    fn dial_checked(&self) -> std::result::Result<Conn, DialError> {
        let (mut conn, info) = Core::dial(&self.uri, self.config.io_timeout, self.tls.as_ref())
            .map_err(DialError::Unreachable)?;
        if info.size != self.info.size {
            return Err(DialError::Refused(format!(
                "the export is {} bytes, not the {} the pages went to",
                info.size, self.info.size
            )));
        }
        let identity = lock(&self.identity).clone();
        if let Some((offset, want)) = identity {
            let (start, end) = self.aligned(offset, want.len());
            let mut whole = vec![0u8; (end - start) as usize];
            for (off, at, n) in self.chunks(start, whole.len()) {
                let header = RequestHeader {
                    kind: CMD_READ,
                    flags: 0,
                    offset: off,
                    length: n as u32,
                };
                match conn.request(header, None, Some(&mut whole[at..at + n])) {
                    Ok(0) => {}
                    Ok(errno) => {
                        return Err(DialError::Unreachable(wire_error(
                            errno,
                            "the identity check's read",
                        )))
                    }
                    Err(e) => {
                        return Err(DialError::Unreachable(BlockError::Io(io_err(
                            self.uri.to_string(),
                            in_words(e, self.config.io_timeout),
                        ))))
                    }
                }
            }
            let at = (offset - start) as usize;
            if whole[at..at + want.len()] != want[..] {
                return Err(DialError::Refused(format!(
                    "the export does not hold the identity written when the pages went to it \
                     ({} bytes at {offset} differ: another store, or this one restarted empty)",
                    want.len()
                )));
            }
        }
        Ok(conn)
    }

    /// `[offset, offset + len)` widened to the server's minimum block (within the export).
    pub(super) fn aligned(&self, offset: u64, len: usize) -> (u64, u64) {
        let b = u64::from(self.info.min_block);
        let start = offset / b * b;
        let end = (offset + len as u64).div_ceil(b) * b;
        (start, end.min(self.info.size))
    }

    /// `[offset, offset + len)` in requests of at most `max_payload` bytes.
    pub(super) fn chunks(
        &self,
        offset: u64,
        len: usize,
    ) -> impl Iterator<Item = (u64, usize, usize)> {
        let max = self.info.max_payload as usize;
        (0..len)
            .step_by(max.max(1))
            .map(move |at| (offset + at as u64, at, max.min(len - at)))
    }

    /// The client is going: the reconnector ends, and a connection still up is closed
    /// politely.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        let mut link = lock(&self.link);
        if let Wire::Up(c) = &mut link.wire {
            c.disconnect();
        }
        self.changed.notify_all();
    }
}
