//! The client side of NBD: a remote export as a [`BlockDevice`], so zram can write pages back
//! to any NBD server (nbdkit, qemu-nbd, qemu-storage-daemon, another `ztier serve`) over the
//! standard protocol, with the same message code as the server ([`crate::proto`]).
//!
//! A client negotiates fixed newstyle with `NBD_OPT_GO` (falling back to
//! `NBD_OPT_EXPORT_NAME` for an old server), asks for block sizes, and then sends requests with
//! simple replies. A single read or write is one request and its reply under the link's lock;
//! [`BlockDevice::read_many`] and [`BlockDevice::write_many`] send up to `IN_FLIGHT` requests
//! before reading their replies, which the server may send in any order (each is matched by
//! its cookie), so a batch of segments costs one round trip to a distant store, not one each.
//! Requests larger than the server's maximum payload are split.
//!
//! A socket error or a request that waits past the timeout marks the store lost: that
//! request fails with a clear error, never a hang. What happens next depends on whether the
//! store can be recognised. NBD itself cannot tell a server that came back from a new one (a
//! restarted `memory` export would read back zeros where the pages were), so the owner pins
//! an identity ([`Client::pin_identity`]: bytes the export holds and no other store would,
//! such as the header with a random id that zram's backing store writes). A client with an
//! identity reconnects by itself, with backoff (the first try at the next request, then
//! waits doubling from 100 ms to [`ClientConfig::max_backoff`]); until it is back, requests
//! fail at once with an error that says since when and why. On every reconnect the export
//! must have its old size and hold the identity; one that does not is refused, loudly, and
//! its reads never answered. A client with no identity reconnects only when the owner calls
//! [`Client::reconnect`]. Changes of state (lost, found, refused) go to the owner's log
//! ([`Client::set_log`]) and [`Client::status`].
//!
//! An `nbds://` or `nbds+unix://` URI asks for TLS: the client sends `NBD_OPT_STARTTLS`
//! first, checks the server's certificate against the CA of its `tls-certificates`
//! directory (and its name, on TCP), shows its own certificate if the directory has one,
//! and haggles and transmits inside TLS; a server that does not offer TLS is refused. The
//! certificates are read once, at connect; every reconnect goes through STARTTLS again.
//!
//! The server's minimum block is obeyed, as the spec asks of a client that asked for block
//! sizes: an unaligned read reads the blocks around it, an unaligned write reads, modifies
//! and writes them back.
//!
//! Locking: `writes` (every write, for the read-modify-write) → `link` (one whole request and
//! its reply, or a window of pipelined ones and theirs; never held while dialing) → `shown` (the published state, which `status` reads
//! alone) and `log` (leaves).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ztier_blockdev::{BlockDevice, BlockError, Result};

use crate::proto::{self, *};
use crate::tls::{self, ClientTls, TlsStream};
use crate::transport::Stream;

/// The default NBD port.
pub const NBD_PORT: u16 = 10809;
/// How long one request may wait on the network before the connection counts as dead, by
/// default (the kernel's nbd client also defaults to 30 s).
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The first wait between reconnect tries; each failed try doubles it.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// How a client waits on its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// How long one request (or a connect and handshake) may wait on the network before the
    /// store counts as lost.
    pub io_timeout: Duration,
    /// The longest wait between tries to reconnect to a lost store.
    pub max_backoff: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            io_timeout: IO_TIMEOUT,
            max_backoff: Duration::from_secs(5),
        }
    }
}

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

/// [`Client::status`]: the link's state, since when, and its history.
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
/// Largest request sent when the server names no maximum (the spec's default, 32 MiB, is
/// what servers accept; smaller keeps memory per request low).
const DEFAULT_MAX_PAYLOAD: u32 = 4 << 20;
/// Largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// Where an export is: `nbd://host[:port][/export]` or `nbd+unix:///export?socket=PATH`,
/// and over TLS, as libnbd writes them, `nbds://host[:port][/export][?QUERY]` or
/// `nbds+unix:///export?socket=PATH[&QUERY]`, the query taking `tls-certificates=DIR` (the
/// directory holding `ca-cert.pem`, and `client-cert.pem` with `client-key.pem` if the
/// server wants a client certificate) and `tls-hostname=NAME` (the name the server's
/// certificate must carry; by default the URI's host, and none on a Unix socket, where only
/// the chain to the CA is checked, as libnbd does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uri {
    pub target: Target,
    pub export: String,
    /// TLS (`nbds`): `NBD_OPT_STARTTLS` first, and a server that refuses it is refused.
    pub tls: Option<UriTls>,
}

/// The TLS part of an `nbds://` or `nbds+unix://` URI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UriTls {
    /// `tls-certificates=DIR`; without it, libnbd's default directories
    /// (`$HOME/.pki/libnbd`, `$HOME/.config/pki/libnbd`, or `/etc/pki/libnbd` for root).
    pub certificates: Option<PathBuf>,
    /// `tls-hostname=NAME`.
    pub hostname: Option<String>,
}

impl Uri {
    /// Whether `s` is meant as an NBD URI (any of the four schemes), so a caller can tell
    /// one from a file name before parsing it.
    pub fn is_nbd_uri(s: &str) -> bool {
        ["nbd://", "nbd+unix://", "nbds://", "nbds+unix://"]
            .iter()
            .any(|p| s.starts_with(p))
    }
}

/// The query's `tls-*` keys (the others are left to the caller, e.g. `socket`).
fn uri_tls(query: &str) -> std::result::Result<UriTls, String> {
    let mut tls = UriTls::default();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "tls-certificates" if !v.is_empty() => tls.certificates = Some(PathBuf::from(v)),
            "tls-hostname" if !v.is_empty() => tls.hostname = Some(v.to_string()),
            "tls-certificates" | "tls-hostname" => return Err(format!("{k}= is empty")),
            "tls-psk-file" | "tls-username" => {
                return Err(format!("{k}: TLS with pre-shared keys is not supported"))
            }
            _ => {}
        }
    }
    Ok(tls)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl FromStr for Uri {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Uri, String> {
        let bad = |why: &str| {
            format!("{s:?} is not an NBD URI ({why}): use nbd://HOST[:PORT][/EXPORT] or nbd+unix:///EXPORT?socket=PATH (nbds:// and nbds+unix:// for TLS)")
        };
        let (s, tls) = if let Some(rest) = s.strip_prefix("nbds://") {
            // The query is TLS's: split it off before the export.
            let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
            let tls = uri_tls(query).map_err(|e| bad(&e))?;
            (format!("nbd://{rest}"), Some(tls))
        } else if let Some(rest) = s.strip_prefix("nbds+unix://") {
            let tls = uri_tls(rest.split_once('?').map_or("", |(_, q)| q)).map_err(|e| bad(&e))?;
            (format!("nbd+unix://{rest}"), Some(tls))
        } else {
            (s.to_string(), None)
        };
        let s = s.as_str();
        if let Some(rest) = s.strip_prefix("nbd+unix://") {
            let (path_part, query) = rest.split_once('?').ok_or_else(|| bad("no ?socket="))?;
            if !path_part.is_empty() && !path_part.starts_with('/') {
                return Err(bad("nbd+unix takes no host"));
            }
            let export = path_part.trim_start_matches('/').to_string();
            let socket = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("socket="))
                .filter(|p| !p.is_empty())
                .ok_or_else(|| bad("no socket= in the query"))?;
            return Ok(Uri {
                target: Target::Unix(PathBuf::from(socket)),
                export,
                tls,
            });
        }
        let rest = s
            .strip_prefix("nbd://")
            .ok_or_else(|| bad("no nbd:// scheme"))?;
        let (authority, export) = match rest.split_once('/') {
            Some((a, e)) => (a, e.to_string()),
            None => (rest, String::new()),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        // [v6addr]:port, host:port, host
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("bad port"))?,
                None if after.is_empty() => NBD_PORT,
                None => return Err(bad("junk after ]")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("bad port"))?),
                None => (authority.to_string(), NBD_PORT),
            }
        };
        Ok(Uri {
            target: Target::Tcp { host, port },
            export,
            tls,
        })
    }
}

impl std::fmt::Display for Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let mut query = Vec::new();
        if let Target::Unix(p) = &self.target {
            query.push(format!("socket={}", p.display()));
        }
        if let Some(t) = &self.tls {
            if let Some(d) = &t.certificates {
                query.push(format!("tls-certificates={}", d.display()));
            }
            if let Some(h) = &t.hostname {
                query.push(format!("tls-hostname={h}"));
            }
        }
        match &self.target {
            Target::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)?
            }
            Target::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export)?,
            Target::Unix(_) => write!(f, "nbd{s}+unix:///{}", self.export)?,
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

/// The connection's byte stream: the socket, or TLS over it.
enum ClientStream {
    Plain(Stream),
    Tls(Box<TlsStream>),
}

impl Read for ClientStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.read(buf),
            ClientStream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for ClientStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.write(buf),
            ClientStream::Tls(t) => t.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.flush(),
            ClientStream::Tls(t) => t.flush(),
        }
    }
}

struct Conn {
    stream: ClientStream,
    next_cookie: u64,
}

/// Requests a pipelined read or write keeps in flight on the connection at once.
const IN_FLIGHT: usize = 32;

/// One request of a pipelined batch.
struct Pipelined<'a> {
    offset: u64,
    data: PipelinedData<'a>,
}

enum PipelinedData<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl Pipelined<'_> {
    fn len(&self) -> usize {
        match &self.data {
            PipelinedData::Read(b) => b.len(),
            PipelinedData::Write(d) => d.len(),
        }
    }
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
}

/// An export, connected or reconnecting.
pub struct Client {
    uri: Uri,
    config: ClientConfig,
    info: ExportInfo,
    /// TLS, for an `nbds` URI: made once, used by every dial.
    tls: Option<ClientTls>,
    link: Mutex<Link>,
    /// The link's state as last published under `link` (a leaf): what `status` and
    /// `is_connected` read, so they never wait behind a request on the network.
    shown: Mutex<LinkStatus>,
    /// Losses and reconnects so far, as last published: [`BlockDevice::epoch`].
    epoch: AtomicU64,
    /// Bytes at an offset the export must hold on every reconnect.
    identity: Mutex<Option<(u64, Vec<u8>)>>,
    log: Mutex<Option<LogFn>>,
    /// Held by every write, so the read-modify-write of a write not aligned to the server's
    /// minimum block cannot lose another write to the same block.
    writes: Mutex<()>,
}

/// Why a dial failed.
enum DialError {
    /// The store could not be reached or negotiated with.
    Unreachable(BlockError),
    /// A store answered, but not the one the pages went to.
    Refused(String),
}

fn io_err(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

fn read_exact(s: &mut impl Read, buf: &mut [u8], what: &str) -> io::Result<()> {
    s.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io_err(what, "the server closed the connection")
        } else {
            io_err(what, e)
        }
    })
}

fn open(target: &Target, timeout: Duration) -> io::Result<Stream> {
    let stream = match target {
        Target::Tcp { host, port } => {
            let mut last = io::Error::other(format!("{host}:{port} resolves to no address"));
            let mut found = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => {
                        found = Some(s);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let s = found.ok_or(last)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            Stream::Tcp(s)
        }
        Target::Unix(path) => {
            let s = UnixStream::connect(path)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            Stream::Unix(s)
        }
    };
    Ok(stream)
}

/// The fixed newstyle handshake, through STARTTLS and the TLS handshake if `tls` is given;
/// returns the stream to go on with and the export's details.
fn handshake(
    mut raw: Stream,
    export: &str,
    tls: Option<&ClientTls>,
) -> io::Result<(ClientStream, ExportInfo)> {
    let no_zeroes = greet(&mut raw)?;
    let mut s = match tls {
        Some(tls) => ClientStream::Tls(Box::new(start_tls(raw, tls)?)),
        None => ClientStream::Plain(raw),
    };
    let info = go(&mut s, export, no_zeroes)?;
    Ok((s, info))
}

/// `NBD_OPT_STARTTLS` and the TLS handshake. A server that does not offer TLS is left with
/// `NBD_OPT_ABORT` (the spec's soft disconnect) and refused: a client that asked for TLS
/// never goes on in the clear.
fn start_tls(mut raw: Stream, tls: &ClientTls) -> io::Result<TlsStream> {
    send_option(&mut raw, OPT_STARTTLS, &[])?;
    let (reply, data) = read_option_reply(&mut raw, OPT_STARTTLS)?;
    if reply != REP_ACK {
        let _ = send_option(&mut raw, OPT_ABORT, &[]);
        let msg = String::from_utf8_lossy(&data).into_owned();
        let what = match reply {
            REP_ERR_UNSUP | REP_ERR_POLICY => "the server does not offer TLS".to_string(),
            r => format!("error reply {r:#x}"),
        };
        return Err(io_err(
            "NBD_OPT_STARTTLS",
            format!("{what} {msg}").trim_end(),
        ));
    }
    let conn = rustls::ClientConnection::new(Arc::clone(&tls.config), tls.name.clone())
        .map_err(|e| io_err("TLS", e))?;
    let mut t = TlsStream {
        conn: rustls::Connection::Client(conn),
        sock: raw,
    };
    tls::handshake(&mut t.conn, &mut t.sock)?;
    Ok(t)
}

/// The greeting and the client's flags; whether the server takes `NBD_FLAG_C_NO_ZEROES`.
fn greet(s: &mut Stream) -> io::Result<bool> {
    let mut hello = [0u8; 18];
    read_exact(s, &mut hello, "the server's greeting")?;
    let magic = u64::from_be_bytes(hello[0..8].try_into().expect("8 bytes"));
    let opt_magic = u64::from_be_bytes(hello[8..16].try_into().expect("8 bytes"));
    if magic != NBDMAGIC || opt_magic != IHAVEOPT {
        return Err(io_err(
            "the server's greeting",
            "not a newstyle NBD server (oldstyle servers are not supported)",
        ));
    }
    let server_flags = u16::from_be_bytes([hello[16], hello[17]]);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(io_err("the server's greeting", "no fixed newstyle"));
    }
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= FLAG_C_NO_ZEROES;
    }
    s.write_all(&client_flags.to_be_bytes())?;
    Ok(no_zeroes)
}

/// `NBD_OPT_GO` with the export's name, asking for block sizes.
fn go(s: &mut ClientStream, export: &str, no_zeroes: bool) -> io::Result<ExportInfo> {
    let mut data = (export.len() as u32).to_be_bytes().to_vec();
    data.extend(export.as_bytes());
    data.extend(1u16.to_be_bytes());
    data.extend(INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data)?;
    let mut info = ExportInfo {
        size: 0,
        flags: 0,
        min_block: 1,
        preferred_block: 4096,
        max_payload: DEFAULT_MAX_PAYLOAD,
    };
    let mut have_export = false;
    loop {
        let (reply, data) = read_option_reply(s, OPT_GO)?;
        match reply {
            REP_ACK if have_export => return Ok(info),
            REP_ACK => {
                return Err(io_err(
                    "NBD_OPT_GO",
                    "acknowledged without the export's size",
                ))
            }
            REP_INFO => {
                let mut c = proto::Cursor::new(&data, "NBD_REP_INFO");
                let kind = c.u16().map_err(|e| io_err("NBD_REP_INFO", e))?;
                match kind {
                    INFO_EXPORT => {
                        info.size = c.u64().map_err(|e| io_err("NBD_INFO_EXPORT", e))?;
                        info.flags = c.u16().map_err(|e| io_err("NBD_INFO_EXPORT", e))?;
                        have_export = true;
                    }
                    INFO_BLOCK_SIZE => {
                        let mut r = || c.u32().map_err(|e| io_err("NBD_INFO_BLOCK_SIZE", e));
                        let (min, preferred, max) = (r()?, r()?, r()?);
                        // The spec's rules: powers of two, minimum at most 64 KiB, preferred
                        // at least the minimum, maximum a multiple of the minimum.
                        let sane = min.is_power_of_two()
                            && min <= 64 << 10
                            && preferred.is_power_of_two()
                            && preferred >= min
                            && max >= min
                            && max % min == 0;
                        if !sane {
                            return Err(io_err(
                                "NBD_INFO_BLOCK_SIZE",
                                format!("minimum {min}, preferred {preferred}, maximum {max} break the spec's rules"),
                            ));
                        }
                        info.min_block = min;
                        info.preferred_block = preferred;
                        // At most our own cap, and still a multiple of the minimum.
                        info.max_payload = max.min(DEFAULT_MAX_PAYLOAD) / min * min;
                    }
                    _ => {}
                }
            }
            REP_ERR_UNSUP => return export_name_fallback(s, export, no_zeroes),
            r if r & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&data).into_owned();
                let what = match r {
                    REP_ERR_UNKNOWN => format!("no export named {export:?}"),
                    REP_ERR_POLICY => "refused by the server's policy".into(),
                    REP_ERR_TLS_REQD => "the server requires TLS".into(),
                    REP_ERR_SHUTDOWN => "the server is shutting down".into(),
                    _ => format!("error reply {r:#x}"),
                };
                return Err(io_err("NBD_OPT_GO", format!("{what} {msg}").trim_end()));
            }
            _ => {}
        }
    }
}

/// `NBD_OPT_EXPORT_NAME`, for a server without `NBD_OPT_GO`.
fn export_name_fallback(
    s: &mut ClientStream,
    export: &str,
    no_zeroes: bool,
) -> io::Result<ExportInfo> {
    send_option(s, OPT_EXPORT_NAME, export.as_bytes())?;
    let mut reply = vec![0u8; if no_zeroes { 10 } else { 134 }];
    read_exact(s, &mut reply, "NBD_OPT_EXPORT_NAME's reply")?;
    Ok(ExportInfo {
        size: u64::from_be_bytes(reply[0..8].try_into().expect("8 bytes")),
        flags: u16::from_be_bytes([reply[8], reply[9]]),
        min_block: 1,
        preferred_block: 4096,
        max_payload: DEFAULT_MAX_PAYLOAD,
    })
}

fn send_option(s: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend(option.to_be_bytes());
    m.extend((data.len() as u32).to_be_bytes());
    m.extend(data);
    s.write_all(&m)
}

fn read_option_reply(s: &mut impl Read, option: u32) -> io::Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 20];
    read_exact(s, &mut h, "an option reply")?;
    let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
    let opt = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
    let reply = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
    let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes"));
    if magic != REP_MAGIC || opt != option {
        return Err(io_err("an option reply", "bad magic or option"));
    }
    if len > MAX_OPTION_REPLY {
        return Err(io_err(
            "an option reply",
            format!("{len} bytes is too long"),
        ));
    }
    let mut data = vec![0u8; len as usize];
    read_exact(s, &mut data, "an option reply")?;
    Ok((reply, data))
}

/// The error a server's errno stands for.
fn wire_error(errno: u32, what: &str) -> BlockError {
    match errno {
        ENOSPC => BlockError::NoSpace(format!("the NBD server: {what}")),
        ENOMEM => BlockError::NoMemory(format!("the NBD server: {what}")),
        EPERM => BlockError::ReadOnly,
        EINVAL => BlockError::Invalid(format!("the NBD server refused {what}")),
        ENOTSUP => BlockError::Unsupported("this request (per the NBD server)"),
        e => BlockError::Io(io::Error::other(format!(
            "the NBD server failed {what} with error {e}"
        ))),
    }
}

impl Client {
    /// Connects to `uri` and negotiates its export, with the default [`ClientConfig`].
    pub fn connect(uri: &Uri) -> Result<Client> {
        Client::connect_with(uri, ClientConfig::default())
    }

    /// Connects to `uri` and negotiates its export.
    /// An `nbds` URI's certificates are read once, here, and serve every reconnect.
    pub fn connect_with(uri: &Uri, config: ClientConfig) -> Result<Client> {
        let tls = Client::tls_for(uri)?;
        let (conn, info) = Client::dial(uri, config.io_timeout, tls.as_ref())?;
        Ok(Client::with_conn(uri, config, info, conn, tls))
    }

    /// A client over a stream already connected to `uri`'s server (a socket pair in tests
    /// and fuzzing); reconnecting dials `uri`.
    pub fn over_stream(stream: Stream, uri: &Uri) -> Result<Client> {
        let tls = Client::tls_for(uri)?;
        let (stream, info) = handshake(stream, &uri.export, tls.as_ref())
            .map_err(|e| BlockError::Io(io_err(&format!("negotiating with {uri}"), e)))?;
        let conn = Conn {
            stream,
            next_cookie: 1,
        };
        Ok(Client::with_conn(
            uri,
            ClientConfig::default(),
            info,
            conn,
            tls,
        ))
    }

    /// The TLS configuration an `nbds` URI asks for.
    fn tls_for(uri: &Uri) -> Result<Option<ClientTls>> {
        let Some(t) = &uri.tls else { return Ok(None) };
        let name = match (&t.hostname, &uri.target) {
            (Some(h), _) => Some(h.as_str()),
            (None, Target::Tcp { host, .. }) => Some(host.as_str()),
            (None, Target::Unix(_)) => None,
        };
        tls::client_tls(t.certificates.as_deref(), name)
            .map(Some)
            .map_err(|e| BlockError::Invalid(format!("TLS for {uri}: {e}")))
    }

    fn with_conn(
        uri: &Uri,
        config: ClientConfig,
        info: ExportInfo,
        conn: Conn,
        tls: Option<ClientTls>,
    ) -> Client {
        let since = SystemTime::now();
        Client {
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
            }),
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
            writes: Mutex::new(()),
        }
    }

    fn dial(uri: &Uri, timeout: Duration, tls: Option<&ClientTls>) -> Result<(Conn, ExportInfo)> {
        let stream = open(&uri.target, timeout)
            .map_err(|e| BlockError::Io(io_err(&format!("connecting to {uri}"), e)))?;
        let (stream, info) = handshake(stream, &uri.export, tls)
            .map_err(|e| BlockError::Io(io_err(&format!("negotiating with {uri}"), e)))?;
        Ok((
            Conn {
                stream,
                next_cookie: 1,
            },
            info,
        ))
    }

    /// Pins the export's identity: the `len` bytes at `offset` are read now, and every
    /// reconnect must find them again, or the store is refused. With an identity pinned the
    /// client reconnects by itself.
    pub fn pin_identity(&self, offset: u64, len: usize) -> Result<()> {
        let mut bytes = vec![0u8; len];
        self.read_at(offset, &mut bytes)?;
        *self.identity.lock().unwrap_or_else(|p| p.into_inner()) = Some((offset, bytes));
        Ok(())
    }

    /// Where the owner's log lines go (lost, reconnected, refused); none by default.
    pub fn set_log(&self, log: impl Fn(&str) + Send + Sync + 'static) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(log));
    }

    fn log(&self, line: &str) {
        if let Some(log) = self.log.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            log(line);
        }
    }

    fn lock_link(&self) -> std::sync::MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_identity(&self) -> bool {
        self.identity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Tries to reconnect now, whatever the backoff says (a no-op while connected, an error
    /// while another thread is dialing). The export must have its old size and, if one is
    /// pinned, hold its identity.
    pub fn reconnect(&self) -> Result<()> {
        let link = self.lock_link();
        match link.wire {
            Wire::Up(_) => return Ok(()),
            Wire::Dialing => {
                return Err(BlockError::Io(io_err(
                    &self.uri.to_string(),
                    "a reconnect is already under way",
                )))
            }
            Wire::Down { .. } => {}
        }
        self.redial(link).1
    }

    /// Dials the store with the link's lock let go meanwhile, so a store that stalls holds
    /// up no other request: they see `Dialing` and fail at once. Back under the lock, the link
    /// is up again, or down with the next try put off.
    fn redial<'a>(
        &'a self,
        mut link: std::sync::MutexGuard<'a, Link>,
    ) -> (std::sync::MutexGuard<'a, Link>, Result<()>) {
        let backoff = match link.wire {
            Wire::Down { backoff, .. } => backoff,
            _ => FIRST_BACKOFF,
        };
        link.wire = Wire::Dialing;
        drop(link);
        let dialed = self.dial_checked();
        let mut link = self.lock_link();
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
                            &format!("reconnecting to {}", self.uri),
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
        let (mut conn, info) = Client::dial(&self.uri, self.config.io_timeout, self.tls.as_ref())
            .map_err(DialError::Unreachable)?;
        if info.size != self.info.size {
            return Err(DialError::Refused(format!(
                "the export is {} bytes, not the {} the pages went to",
                info.size, self.info.size
            )));
        }
        let identity = self
            .identity
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some((offset, want)) = identity {
            let mut got = vec![0u8; want.len()];
            let (start, end) = self.aligned(offset, want.len());
            let mut whole = vec![0u8; (end - start) as usize];
            for (off, at, n) in self.chunks(start, whole.len()) {
                let cookie = conn.next_cookie;
                conn.next_cookie += 1;
                let r = Client::exchange(
                    &mut conn,
                    CMD_READ,
                    0,
                    off,
                    n as u32,
                    cookie,
                    None,
                    Some(&mut whole[at..at + n]),
                );
                match r {
                    Ok(0) => {}
                    Ok(errno) => {
                        return Err(DialError::Unreachable(wire_error(
                            errno,
                            "the identity check's read",
                        )))
                    }
                    Err(e) => {
                        return Err(DialError::Unreachable(BlockError::Io(io_err(
                            &self.uri.to_string(),
                            e,
                        ))))
                    }
                }
            }
            let at = (offset - start) as usize;
            got.copy_from_slice(&whole[at..at + want.len()]);
            if got != want {
                return Err(DialError::Refused(format!(
                    "the export does not hold the identity written when the pages went to it \
                     ({} bytes at {offset} differ: another store, or this one restarted empty)",
                    want.len()
                )));
            }
        }
        Ok(conn)
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.status().state == LinkState::Connected
    }

    /// The link's state, since when, and its history. It never waits on the network: a
    /// request in flight holds the link, not this.
    pub fn status(&self) -> LinkStatus {
        let mut status = self.shown.lock().unwrap_or_else(|p| p.into_inner()).clone();
        status.reconnects_by_itself = self.has_identity();
        status
    }

    /// Publishes the link's state for `status` (called under the link's lock whenever the
    /// state changes).
    fn publish(&self, link: &Link) {
        self.epoch
            .store(link.losses + link.reconnects, Ordering::Release);
        *self.shown.lock().unwrap_or_else(|p| p.into_inner()) = LinkStatus {
            state: link.state.clone(),
            since: link.since,
            losses: link.losses,
            reconnects: link.reconnects,
            reconnects_by_itself: false,
        };
    }

    pub fn uri(&self) -> &Uri {
        &self.uri
    }
    pub fn info(&self) -> ExportInfo {
        self.info
    }
    pub fn config(&self) -> ClientConfig {
        self.config
    }

    /// One request and its simple reply; `write` is the payload of a write, `read` receives a
    /// read's data. Splitting is the caller's (each request is at most `max_payload`).
    fn request(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        write: Option<&[u8]>,
        read: Option<&mut [u8]>,
    ) -> Result<()> {
        let errno = self.on_link(|conn| {
            let cookie = conn.next_cookie;
            conn.next_cookie += 1;
            Client::exchange(conn, kind, flags, offset, length, cookie, write, read)
        })?;
        match errno {
            0 => Ok(()),
            errno => Err(wire_error(
                errno,
                &format!("{} of {length} bytes at {offset}", command_name(kind)),
            )),
        }
    }

    /// Runs `talk` on the connection, under the link's lock: dialed again first if it was
    /// lost and the backoff is over (with an identity), refused at once while it is down. An
    /// error from `talk` leaves the stream out of step: it is dropped and the store counts as
    /// lost.
    fn on_link<T>(&self, talk: impl FnOnce(&mut Conn) -> io::Result<T>) -> Result<T> {
        let mut link = self.lock_link();
        if let Wire::Down { next_try, .. } = link.wire {
            if self.has_identity() && Instant::now() >= next_try {
                // A failed try is in the link's state; this request says so below.
                link = self.redial(link).0;
            }
        }
        let conn = match &mut link.wire {
            Wire::Up(conn) => conn,
            Wire::Dialing => {
                return Err(BlockError::Io(io_err(
                    &self.uri.to_string(),
                    "the store was lost and is being dialed again",
                )))
            }
            Wire::Down { .. } => {
                let how = if self.has_identity() {
                    "reconnecting by itself"
                } else {
                    "reconnect to go on; what the export held may be gone"
                };
                let since = link.since.elapsed().unwrap_or_default().as_secs_f64();
                let why = match &link.state {
                    LinkState::Lost { error, .. } => error.clone(),
                    LinkState::Refused { reason, .. } => format!("refused: {reason}"),
                    LinkState::Connected => String::new(),
                };
                return Err(BlockError::Io(io_err(
                    &self.uri.to_string(),
                    format!("the store was lost {since:.1} s ago ({why}); {how}"),
                )));
            }
        };
        match talk(conn) {
            Ok(r) => Ok(r),
            Err(e) => {
                // The stream is out of step or gone: drop it. The first request after the
                // backoff dials again (with an identity), or the owner does.
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
                self.publish(&link);
                drop(link);
                self.log(&format!("lost the store {}: {e}", self.uri));
                Err(BlockError::Io(io_err(&self.uri.to_string(), e)))
            }
        }
    }

    /// Requests of one kind (a read or a write, each at most `max_payload`, aligned) sent
    /// [`IN_FLIGHT`] at a time before their replies are read, which the server may send in
    /// any order: each is matched to its request by its cookie. The first refusal is the
    /// error; the others' outcomes are then unknown to the caller.
    fn pipelined(&self, kind: u16, mut ops: Vec<Pipelined<'_>>) -> Result<()> {
        for window in ops.chunks_mut(IN_FLIGHT) {
            let errnos = self.on_link(|conn| Client::exchange_window(conn, kind, window))?;
            if let Some((i, errno)) = errnos.iter().enumerate().find(|(_, e)| **e != 0) {
                let (offset, length) = (window[i].offset, window[i].len());
                return Err(wire_error(
                    *errno,
                    &format!("{} of {length} bytes at {offset}", command_name(kind)),
                ));
            }
        }
        Ok(())
    }

    /// Sends every request of `window`, then reads as many replies; the errno of each, in
    /// the window's order.
    fn exchange_window(
        conn: &mut Conn,
        kind: u16,
        window: &mut [Pipelined<'_>],
    ) -> io::Result<Vec<u32>> {
        let base = conn.next_cookie;
        conn.next_cookie += window.len() as u64;
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
        conn.stream.write_all(&out)?;
        let mut errnos = vec![None; window.len()];
        for _ in 0..window.len() {
            let mut reply = [0u8; 16];
            read_exact(&mut conn.stream, &mut reply, "a reply")?;
            let magic = u32::from_be_bytes(reply[0..4].try_into().expect("4 bytes"));
            let errno = u32::from_be_bytes(reply[4..8].try_into().expect("4 bytes"));
            let cookie = u64::from_be_bytes(reply[8..16].try_into().expect("8 bytes"));
            let i = cookie.wrapping_sub(base);
            let slot = usize::try_from(i)
                .ok()
                .filter(|&i| magic == SIMPLE_REPLY_MAGIC && i < window.len())
                .filter(|&i| errnos[i].is_none())
                .ok_or_else(|| io_err("a reply", "bad magic, or a cookie not in flight"))?;
            errnos[slot] = Some(errno);
            if errno == 0 {
                if let PipelinedData::Read(buf) = &mut window[slot].data {
                    read_exact(&mut conn.stream, buf, "a read's data")?;
                }
            }
        }
        Ok(errnos.into_iter().map(|e| e.unwrap_or(0)).collect())
    }

    /// Whether `[offset, offset + len)` goes out as one request: aligned to the server's
    /// minimum block and at most its largest payload.
    fn is_one_request(&self, offset: u64, len: usize) -> bool {
        let b = u64::from(self.info.min_block);
        len > 0
            && len <= self.info.max_payload as usize
            && offset.is_multiple_of(b)
            && (len as u64).is_multiple_of(b)
    }

    #[allow(clippy::too_many_arguments)]
    fn exchange(
        conn: &mut Conn,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        cookie: u64,
        write: Option<&[u8]>,
        read: Option<&mut [u8]>,
    ) -> io::Result<u32> {
        let header = Request {
            flags,
            kind,
            cookie,
            offset,
            length,
        }
        .encode();
        let s = &mut conn.stream;
        match write {
            Some(data) => {
                let mut m = Vec::with_capacity(REQUEST_LEN + data.len());
                m.extend_from_slice(&header);
                m.extend_from_slice(data);
                s.write_all(&m)?;
            }
            None => s.write_all(&header)?,
        }
        let mut reply = [0u8; 16];
        read_exact(s, &mut reply, "a reply")?;
        let magic = u32::from_be_bytes(reply[0..4].try_into().expect("4 bytes"));
        let errno = u32::from_be_bytes(reply[4..8].try_into().expect("4 bytes"));
        let got = u64::from_be_bytes(reply[8..16].try_into().expect("8 bytes"));
        if magic != SIMPLE_REPLY_MAGIC || got != cookie {
            return Err(io_err("a reply", "bad magic or cookie"));
        }
        if errno == 0 {
            if let Some(out) = read {
                read_exact(s, out, "a read's data")?;
            }
        }
        Ok(errno)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        ztier_blockdev::check_range(self.info.size, offset, len)
    }

    /// `[offset, offset + len)` widened to the server's minimum block (within the export).
    fn aligned(&self, offset: u64, len: usize) -> (u64, u64) {
        let b = u64::from(self.info.min_block);
        let start = offset / b * b;
        let end = (offset + len as u64).div_ceil(b) * b;
        (start, end.min(self.info.size))
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        for (off, at, n) in self.chunks(offset, len) {
            self.request(CMD_READ, 0, off, n as u32, None, Some(&mut buf[at..at + n]))?;
        }
        Ok(())
    }

    fn write_aligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let flags = if fua && self.has(FLAG_SEND_FUA) {
            CMD_FLAG_FUA
        } else {
            0
        };
        for (off, at, n) in self.chunks(offset, data.len()) {
            self.request(
                CMD_WRITE,
                flags,
                off,
                n as u32,
                Some(&data[at..at + n]),
                None,
            )
            .map_err(|e| match at {
                0 => e,
                done => BlockError::Partial {
                    done: done as u64,
                    source: Box::new(e),
                },
            })?;
        }
        Ok(())
    }

    /// The whole blocks inside `[offset, offset + len)`.
    fn inner_blocks(&self, offset: u64, len: u64) -> (u64, u64) {
        let b = u64::from(self.info.min_block);
        (offset.div_ceil(b) * b, (offset + len) / b * b)
    }

    /// A request with no payload over a range, in requests of at most 4 GiB less a page.
    fn ranged(&self, kind: u16, flags: u16, offset: u64, len: u64) -> Result<()> {
        let max = u64::from(!4095u32);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(max);
            self.request(kind, flags, offset + done, n as u32, None, None)?;
            done += n;
        }
        Ok(())
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> Result<()> {
        let zeros = vec![0u8; u64::from(self.info.max_payload).min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(offset + done, &zeros[..n], false)?;
            done += n as u64;
        }
        Ok(())
    }

    fn has(&self, flag: u16) -> bool {
        self.info.flags & flag != 0
    }

    /// `[offset, offset + len)` in requests of at most `max_payload` bytes.
    fn chunks(&self, offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
        let max = self.info.max_payload as usize;
        (0..len)
            .step_by(max.max(1))
            .map(move |at| (offset + at as u64, at, max.min(len - at)))
    }
}

fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "a read",
        CMD_WRITE => "a write",
        CMD_FLUSH => "a flush",
        CMD_TRIM => "a trim",
        CMD_WRITE_ZEROES => "a zero write",
        _ => "a request",
    }
}

impl BlockDevice for Client {
    fn size(&self) -> u64 {
        self.info.size
    }

    /// Moves when the link is lost (a read of the store then fails, whatever a cache held)
    /// and when it is found again (the store checked by its identity, but perhaps restarted).
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    fn block_size(&self) -> u32 {
        self.info.min_block
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let (start, end) = self.aligned(offset, buf.len());
        if start != offset || end != offset + buf.len() as u64 {
            let mut whole = vec![0u8; (end - start) as usize];
            self.read_aligned(start, &mut whole)?;
            let at = (offset - start) as usize;
            buf.copy_from_slice(&whole[at..at + buf.len()]);
            return Ok(());
        }
        self.read_aligned(offset, buf)
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check(offset, data.len() as u64)?;
        if self.has(FLAG_READ_ONLY) {
            return Err(BlockError::ReadOnly);
        }
        let _writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        let (start, end) = self.aligned(offset, data.len());
        if start != offset || end != offset + data.len() as u64 {
            let mut whole = vec![0u8; (end - start) as usize];
            self.read_aligned(start, &mut whole)?;
            let at = (offset - start) as usize;
            whole[at..at + data.len()].copy_from_slice(data);
            return self.write_aligned(start, &whole, fua);
        }
        self.write_aligned(offset, data, fua)
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check(offset, len)?;
        // Advisory, as a trim is: only the whole blocks inside the range are trimmed.
        let (start, end) = self.inner_blocks(offset, len);
        if !self.has(FLAG_SEND_TRIM) || start >= end {
            return Ok(());
        }
        self.ranged(CMD_TRIM, 0, start, end - start)
    }

    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> Result<()> {
        self.check(offset, len)?;
        if !self.has(FLAG_SEND_WRITE_ZEROES) {
            return self.write_zero_bytes(offset, len);
        }
        // Whole blocks by request; the unaligned ends, if any, written as zero bytes.
        let (start, end) = self.inner_blocks(offset, len);
        if start >= end {
            return self.write_zero_bytes(offset, len);
        }
        self.write_zero_bytes(offset, start - offset)?;
        let flags = if may_unmap { 0 } else { CMD_FLAG_NO_HOLE };
        {
            let _writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
            self.ranged(CMD_WRITE_ZEROES, flags, start, end - start)?;
        }
        self.write_zero_bytes(end, offset + len - end)
    }

    fn flush(&self) -> Result<()> {
        if self.has(FLAG_SEND_FLUSH) {
            self.request(CMD_FLUSH, 0, 0, 0, None, None)?;
        }
        Ok(())
    }

    fn read_many(&self, reads: &mut [(u64, &mut [u8])]) -> Result<()> {
        let mut ops = Vec::with_capacity(reads.len());
        for (offset, buf) in reads.iter_mut() {
            self.check(*offset, buf.len() as u64)?;
            if self.is_one_request(*offset, buf.len()) {
                ops.push(Pipelined {
                    offset: *offset,
                    data: PipelinedData::Read(buf),
                });
            } else {
                self.read_at(*offset, buf)?;
            }
        }
        self.pipelined(CMD_READ, ops)
    }

    fn write_many(&self, writes: &[(u64, &[u8])]) -> Result<()> {
        if self.has(FLAG_READ_ONLY) {
            return Err(BlockError::ReadOnly);
        }
        for (offset, data) in writes {
            self.check(*offset, data.len() as u64)?;
        }
        let mut ops = Vec::with_capacity(writes.len());
        for &(offset, data) in writes {
            if self.is_one_request(offset, data.len()) {
                ops.push(Pipelined {
                    offset,
                    data: PipelinedData::Write(data),
                });
            } else {
                self.write_at(offset, data, false)?;
            }
        }
        // Held as by any write: an unaligned write's read-modify-write must not lose these.
        let _writes = self.writes.lock().unwrap_or_else(|p| p.into_inner());
        self.pipelined(CMD_WRITE, ops)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let link = self.link.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Wire::Up(c) = &mut link.wire {
            let header = Request {
                flags: 0,
                kind: CMD_DISC,
                cookie: c.next_cookie,
                offset: 0,
                length: 0,
            }
            .encode();
            let _ = c.stream.write_all(&header);
            if let ClientStream::Tls(t) = &mut c.stream {
                t.close_notify();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse() {
        let u: Uri = "nbd://example.org:10810/disk".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "example.org".into(),
                port: 10810
            }
        );
        assert_eq!(u.export, "disk");
        let u: Uri = "nbd://10.0.0.2".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "10.0.0.2".into(),
                port: NBD_PORT
            }
        );
        assert_eq!(u.export, "");
        let u: Uri = "nbd://[::1]:10811/x".parse().unwrap();
        assert_eq!(
            u.target,
            Target::Tcp {
                host: "::1".into(),
                port: 10811
            }
        );
        let u: Uri = "nbd+unix:///wb?socket=/run/nbd.sock".parse().unwrap();
        assert_eq!(u.target, Target::Unix("/run/nbd.sock".into()));
        assert_eq!(u.export, "wb");
        assert_eq!(u.to_string(), "nbd+unix:///wb?socket=/run/nbd.sock");
        for bad in [
            "http://x",
            "nbd://",
            "nbd://h:port",
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=/s",
            "nbd://[::1",
        ] {
            assert!(bad.parse::<Uri>().is_err(), "{bad}");
        }
    }
}
