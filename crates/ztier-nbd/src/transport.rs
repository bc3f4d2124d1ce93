//! The sockets NBD runs over and the bytes over them, for the server and the client alike:
//! a listening socket and a connected one ([`Listener`], [`Stream`]: TCP or Unix), the
//! server's wait for a client beside its stop eventfd, and a connection's bytes, in the clear
//! or TLS over its socket (`Transport`): whole (the client; the server's handshake) or split
//! into a reader and a writer (the server's transmission phase: `ReadHalf`, `WriteHalf`).
//! Whether TLS is offered, and with which certificates, is [`crate::tls`]'s.
//!
//! A rustls connection is a state machine that never touches a socket itself, which is what
//! lets the server's transmission phase keep its threads: one reads while others write,
//! sharing the one connection behind a mutex that is held only to decrypt or encrypt, never
//! across socket I/O (`TlsReader`, `TlsWriter`). A reply write that blocks on a full socket
//! therefore never keeps the reader from decrypting the next request.
//!
//! Invariants: a connection is in the clear until its TLS handshake is done, and TLS's from
//! then on (no byte goes in the clear after it); a connection's handles share one descriptor.
//! Lock: `Shared` (a split TLS connection's rustls state) is a leaf, held for at most 256 KiB
//! of decryption or encryption at a time; the socket reads and writes happen outside it.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

/// A listening socket, TCP or Unix.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_nonblocking(on),
            Listener::Unix(l) => l.set_nonblocking(on),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Stream::from(s)
            }),
            Listener::Unix(l) => l.accept().map(|(s, _)| Stream::from(s)),
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Listener::Tcp(l) => l.as_fd(),
            Listener::Unix(l) => l.as_fd(),
        }
    }
}

/// A connected socket, TCP or Unix. Its handles share one descriptor: the connection's
/// reader, its writer and the server's lists (to shut it at stop) each hold a handle, and
/// the socket closes when the last goes; a connection costs one descriptor, not one a
/// handle (as `dup` would).
#[derive(Clone)]
pub enum Stream {
    Tcp(Arc<TcpStream>),
    Unix(Arc<UnixStream>),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Stream {
        Stream::Tcp(Arc::new(s))
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Stream {
        Stream::Unix(Arc::new(s))
    }
}

/// Who is at the other end, for the limits each peer is held to: the user on a Unix
/// socket (`SO_PEERCRED`), the address on TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    User(u32),
    Address(std::net::IpAddr),
    /// The kernel would not say (counted as one peer together).
    Unknown,
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::User(uid) => write!(f, "user {uid}"),
            Peer::Address(a) => write!(f, "{a}"),
            Peer::Unknown => f.write_str("an unknown peer"),
        }
    }
}

impl Stream {
    /// Another handle on the same socket (no new descriptor).
    pub(crate) fn share(&self) -> Stream {
        self.clone()
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(how),
            Stream::Unix(s) => s.shutdown(how),
        };
    }

    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
            Stream::Unix(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
        }
    }

    pub(crate) fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s.peer_addr().map_or("tcp peer".into(), |a| a.to_string()),
            Stream::Unix(s) => match rustix::net::sockopt::socket_peercred(&**s) {
                Ok(cred) => format!("unix socket (uid {})", cred.uid.as_raw()),
                Err(_) => "unix socket".into(),
            },
        }
    }

    /// Who the peer is, for the per-peer limits.
    pub(crate) fn peer_id(&self) -> Peer {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or(Peer::Unknown, |a| Peer::Address(a.ip())),
            Stream::Unix(s) => rustix::net::sockopt::socket_peercred(&**s)
                .map_or(Peer::Unknown, |cred| Peer::User(cred.uid.as_raw())),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).read(buf),
            Stream::Unix(s) => (&**s).read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).write(buf),
            Stream::Unix(s) => (&**s).write(buf),
        }
    }
    /// One writev(2) for all the pieces (a reply's header and its data).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => (&**s).write_vectored(bufs),
            Stream::Unix(s) => (&**s).write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => (&**s).flush(),
            Stream::Unix(s) => (&**s).flush(),
        }
    }
}

impl Stream {
    /// Sends every byte of `pieces`, in order, by `deadline`: each send never blocks
    /// (`MSG_DONTWAIT`, this call only: the socket stays blocking for its readers), and
    /// while the peer's window is full it waits in `poll` for at most what is left. A
    /// blocking send would wait as long as the peer reads a little now and then (the
    /// socket's send timeout restarts with each bit of room), so a peer that reads a reply a
    /// trickle at a time could hold it for ever. As few `sendmsg` calls as the socket takes.
    pub(crate) fn send_by(&self, pieces: &[&[u8]], deadline: Instant) -> io::Result<()> {
        use rustix::net::{SendAncillaryBuffer, SendFlags};
        let fd = match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        };
        let mut slices: Vec<io::IoSlice<'_>> = pieces.iter().map(|p| io::IoSlice::new(p)).collect();
        let mut rest = &mut slices[..];
        io::IoSlice::advance_slices(&mut rest, 0); // (drops leading empty pieces)
        while !rest.is_empty() {
            let sent = rustix::net::sendmsg(
                fd,
                rest,
                &mut SendAncillaryBuffer::default(),
                SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
            );
            match sent {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => io::IoSlice::advance_slices(&mut rest, n),
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the peer did not read what was sent within the time allowed",
                        ));
                    }
                    let t = rustix::event::Timespec {
                        tv_sec: left.as_secs() as i64,
                        tv_nsec: i64::from(left.subsec_nanos()),
                    };
                    let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
                    match rustix::event::poll(&mut fds, Some(&t)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

/// Waits for a client on `listener` (or, after an accept error, for `backoff` with the
/// listener left alone) or for a write to `wake`. True when the listener may have a client.
pub(crate) fn wait_for_client(
    wake: &OwnedFd,
    listener: &Listener,
    backoff: Duration,
) -> io::Result<bool> {
    let mut fds = [
        PollFd::new(wake, PollFlags::IN),
        PollFd::new(listener, PollFlags::IN),
    ];
    let (fds, timeout) = if backoff.is_zero() {
        (&mut fds[..], None)
    } else {
        let t = rustix::event::Timespec {
            tv_sec: backoff.as_secs() as i64,
            tv_nsec: i64::from(backoff.subsec_nanos()),
        };
        (&mut fds[..1], Some(t))
    };
    match rustix::event::poll(fds, timeout.as_ref()) {
        Ok(_) => Ok(true),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// An accept error that retrying cannot mend: the listener is no listening socket.
pub(crate) fn accept_error_is_fatal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP | libc::EFAULT)
    )
}

pub(crate) fn set_blocking(s: &Stream) -> io::Result<()> {
    match s {
        Stream::Tcp(t) => t.set_nonblocking(false),
        Stream::Unix(u) => u.set_nonblocking(false),
    }
}

/// A connection's bytes over the socket `S`, at either end: in the clear, or TLS once
/// `NBD_OPT_STARTTLS` has started it ([`Transport::start_tls`], in place, mid-haggling). The
/// client's connection is one over its [`Stream`]; the server's handshake is one over its
/// socket under the handshake's deadline, and its transmission phase splits the connection
/// ([`Transport::split`]) into a reader and a writer for its threads.
pub(crate) struct Transport<S> {
    sock: S,
    /// The TLS session over `sock`, its handshake done; `None` in the clear. (Boxed: a
    /// rustls connection is large, and the client's link keeps its connection in an enum.)
    tls: Option<Box<rustls::Connection>>,
}

impl<S> Transport<S> {
    /// The socket's bytes as they are, until TLS is started.
    pub(crate) fn plain(sock: S) -> Transport<S> {
        Transport { sock, tls: None }
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The socket the bytes go over.
    pub(crate) fn socket(&self) -> &S {
        &self.sock
    }

    /// The same bytes (in the clear, or the same TLS session) over `f(socket)`, another
    /// handle of the same socket: how the server's handshake hands its connection on.
    pub(crate) fn map_socket<T>(self, f: impl FnOnce(S) -> T) -> Transport<T> {
        Transport {
            sock: f(self.sock),
            tls: self.tls,
        }
    }
}

impl<S: Read + Write> Transport<S> {
    /// Starts TLS: `conn`'s handshake runs to its end over the socket (whose own timeouts
    /// bound it), and every byte after it is TLS's. Refused if TLS is on already.
    pub(crate) fn start_tls(&mut self, conn: rustls::Connection) -> io::Result<()> {
        if self.tls.is_some() {
            return Err(io::Error::other("TLS is on already"));
        }
        let mut conn = Box::new(conn);
        tls_handshake(&mut conn, &mut self.sock)?;
        self.tls = Some(conn);
        Ok(())
    }

    /// Says goodbye to a TLS peer (close_notify), as the spec asks before a TLS session is
    /// closed; nothing in the clear.
    pub(crate) fn close_notify(&mut self) {
        if let Some(conn) = &mut self.tls {
            conn.send_close_notify();
            let _ = flush_tls(conn, &mut self.sock);
        }
    }
}

impl<S: Read + Write> Read for Transport<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(conn) => tls_read(conn, &mut self.sock, buf),
            None => self.sock.read(buf),
        }
    }
}

impl<S: Write> Write for Transport<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.tls {
            Some(conn) => tls_write(conn, &mut self.sock, buf),
            None => self.sock.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.tls {
            Some(conn) => flush_tls(conn, &mut self.sock),
            None => self.sock.flush(),
        }
    }
}

impl Transport<Stream> {
    /// The transmission phase's halves, for the server's threads: the reader reads one
    /// handle of the socket and the writer another (no new descriptor). In the clear each is
    /// the socket's own; under TLS they share the one session ([`TlsReader`], [`TlsWriter`]).
    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        let reader = self.sock.share();
        match self.tls {
            None => (ReadHalf::Plain(reader), WriteHalf::Plain(self.sock)),
            Some(conn) => {
                let (r, w) = split_tls(*conn, reader, self.sock);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

/// A split connection's reading half ([`Transport::split`]): the socket, or TLS over it.
pub(crate) enum ReadHalf {
    Plain(Stream),
    Tls(TlsReader),
}

impl Read for ReadHalf {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ReadHalf::Plain(s) => s.read(buf),
            ReadHalf::Tls(t) => t.read(buf),
        }
    }
}

/// A split connection's writing half ([`Transport::split`]): the socket, or TLS over it.
pub(crate) enum WriteHalf {
    Plain(Stream),
    Tls(TlsWriter),
}

impl WriteHalf {
    /// Sends every byte of `pieces`, in order, by `deadline`. On a plain socket the pieces
    /// go out together in one writev(2) (more only when the socket takes part of them),
    /// neither copied into one buffer first nor split into a write each. Over TLS a small
    /// message is gathered first, so that it makes one record, not one per piece.
    pub(crate) fn send_by(&mut self, pieces: &[&[u8]], deadline: Instant) -> io::Result<()> {
        match self {
            WriteHalf::Plain(stream) => stream.send_by(pieces, deadline),
            WriteHalf::Tls(tls) => {
                tls.set_deadline(deadline);
                let total: usize = pieces.iter().map(|p| p.len()).sum();
                if total <= 64 << 10 {
                    let mut buf = Vec::with_capacity(total);
                    for p in pieces {
                        buf.extend_from_slice(p);
                    }
                    tls.write_all(&buf)
                } else {
                    pieces.iter().try_for_each(|p| tls.write_all(p))
                }
            }
        }
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        match self {
            WriteHalf::Plain(s) => s.shutdown(how),
            WriteHalf::Tls(t) => t.sock.shutdown(how),
        }
    }

    /// The connection's end: TLS says goodbye first (close_notify, as the spec asks, given
    /// `limit` at most), then the socket is shut.
    pub(crate) fn close(&mut self, limit: Duration) {
        if let WriteHalf::Tls(t) = self {
            t.close_notify(limit);
        }
        self.shutdown(Shutdown::Both);
    }
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, TlsFailure(e))
}

/// rustls's own error, kept whole as an I/O error's inner error (its words in the message:
/// not also a `source`, so a chain printed whole says it once).
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsFailure(pub rustls::Error);

/// A TLS handshake's I/O failure (a rustls error or the socket's), kept whole.
#[derive(Debug, thiserror::Error)]
#[error("the TLS handshake: {0}")]
pub struct TlsHandshakeFailure(pub io::Error);

/// Sends whatever TLS records the connection holds.
fn flush_tls(conn: &mut rustls::Connection, sock: &mut impl Write) -> io::Result<()> {
    while conn.wants_write() {
        if conn.write_tls(sock)? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    sock.flush()
}

/// Runs the TLS handshake to its end over `sock` (whose own timeouts bound it).
fn tls_handshake(conn: &mut rustls::Connection, sock: &mut (impl Read + Write)) -> io::Result<()> {
    while conn.is_handshaking() {
        let (read, written) = conn
            .complete_io(sock)
            .map_err(|e| io::Error::new(e.kind(), TlsHandshakeFailure(e)))?;
        if read == 0 && written == 0 && conn.is_handshaking() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the TLS handshake: the peer went away",
            ));
        }
    }
    flush_tls(conn, sock)
}

/// Plaintext read over a connection owned by one thread.
fn tls_read(
    conn: &mut rustls::Connection,
    sock: &mut (impl Read + Write),
    buf: &mut [u8],
) -> io::Result<usize> {
    loop {
        match conn.reader().read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        flush_tls(conn, sock)?;
        conn.read_tls(sock)?;
        if let Err(e) = conn.process_new_packets() {
            let _ = flush_tls(conn, sock); // the alert, if any
            return Err(tls_error(e));
        }
    }
}

/// Plaintext written over a connection owned by one thread, and sent at once.
fn tls_write(
    conn: &mut rustls::Connection,
    sock: &mut impl Write,
    buf: &[u8],
) -> io::Result<usize> {
    let n = conn.writer().write(buf)?;
    flush_tls(conn, sock)?;
    Ok(n)
}

/// The most plaintext decrypted or encrypted under the connection's lock at once.
const CHUNK: usize = 256 << 10;

/// One TLS connection shared by a server connection's reading and writing threads.
type Shared = Arc<Mutex<rustls::Connection>>;

fn lock(
    shared: &Mutex<rustls::Connection>,
) -> io::Result<std::sync::MutexGuard<'_, rustls::Connection>> {
    shared
        .lock()
        .map_err(|_| io::Error::other("a thread panicked inside TLS"))
}

/// Splits a connection whose handshake is done into the transmission phase's halves: the
/// reader reads `reader`, the writer writes `writer` (two handles of one socket).
fn split_tls(
    mut conn: rustls::Connection,
    reader: Stream,
    writer: Stream,
) -> (TlsReader, TlsWriter) {
    conn.set_buffer_limit(Some(CHUNK + (64 << 10)));
    let shared = Arc::new(Mutex::new(conn));
    (
        TlsReader {
            shared: Arc::clone(&shared),
            sock: reader,
            raw: vec![0u8; CHUNK].into_boxed_slice(),
            start: 0,
            end: 0,
        },
        TlsWriter {
            shared,
            sock: writer,
            out: Vec::new(),
            deadline: None,
        },
    )
}

/// The reading half: socket bytes are read with no lock held, then decrypted under it.
pub(crate) struct TlsReader {
    shared: Shared,
    sock: Stream,
    /// Bytes read from the socket, `start..end` not yet given to rustls.
    raw: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut conn = lock(&self.shared)?;
                let mut got = 0;
                loop {
                    match conn.reader().read(&mut buf[got..]) {
                        // A close_notify: the end, once what came before it is read.
                        Ok(0) => return Ok(got),
                        Ok(n) => {
                            got += n;
                            if got == buf.len() || got >= CHUNK {
                                return Ok(got);
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        // What was read comes first; the error comes again at the next call.
                        Err(_) if got > 0 => return Ok(got),
                        Err(e) => return Err(e),
                    }
                    if self.start == self.end {
                        break;
                    }
                    // At most one record's worth is taken, and decrypted before the next.
                    let mut pending = &self.raw[self.start..self.end];
                    let n = conn.read_tls(&mut pending)?;
                    self.start += n;
                    conn.process_new_packets().map_err(tls_error)?;
                }
                if got > 0 {
                    return Ok(got);
                }
            }
            // Nothing decrypted and nothing left to decrypt: wait for the socket, unlocked.
            self.start = 0;
            self.end = self.sock.read(&mut self.raw)?;
            if self.end == 0 {
                return Ok(0);
            }
        }
    }
}

/// The writing half: plaintext is encrypted under the lock into `out`, which is written to
/// the socket with the lock let go.
pub(crate) struct TlsWriter {
    shared: Shared,
    sock: Stream,
    out: Vec<u8>,
    /// When what is being written must have gone out ([`TlsWriter::set_deadline`]); none
    /// (the socket's own timeouts) until one is set.
    deadline: Option<Instant>,
}

impl TlsWriter {
    fn take_records(&mut self, conn: &mut rustls::Connection) -> io::Result<()> {
        while conn.wants_write() {
            conn.write_tls(&mut self.out)?;
        }
        Ok(())
    }

    fn send_out(&mut self) -> io::Result<()> {
        let sent = match self.deadline {
            Some(by) => self.sock.send_by(&[&self.out], by),
            None => self.sock.write_all(&self.out),
        };
        self.out.clear();
        sent
    }

    /// What is written from now on must go out by `by` (a reply's `reply_timeout`).
    fn set_deadline(&mut self, by: Instant) {
        self.deadline = Some(by);
    }

    /// Says goodbye (close_notify), waiting at most `limit` for the socket to take it.
    fn close_notify(&mut self, limit: Duration) {
        let shared = Arc::clone(&self.shared);
        let Ok(mut conn) = lock(&shared) else { return };
        conn.send_close_notify();
        let taken = self.take_records(&mut conn);
        drop(conn);
        if taken.is_ok() {
            // By `limit` from now, not by a reply's deadline set earlier (and without
            // touching the socket's timeouts, which the reading half shares).
            self.deadline = Some(Instant::now() + limit);
            let _ = self.send_out();
        }
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let chunk = &buf[..buf.len().min(CHUNK)];
        let shared = Arc::clone(&self.shared);
        let mut conn = lock(&shared)?;
        let n = conn.writer().write(chunk)?;
        // Records the reader queued (a key update's answer) go out first, in order.
        self.take_records(&mut conn)?;
        drop(conn);
        self.send_out()?;
        if n == 0 && !chunk.is_empty() {
            return Err(io::ErrorKind::WriteZero.into());
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
