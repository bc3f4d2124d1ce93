//! The sockets NBD runs over, for the server and the client alike: a listening socket and
//! a connected one, TCP or Unix, and the server's wait for a client beside its stop
//! eventfd.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

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
    pub(crate) fn send_by(&self, pieces: &[&[u8]], deadline: std::time::Instant) -> io::Result<()> {
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
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
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
