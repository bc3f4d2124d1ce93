//! Reaching an export: the socket (TCP or Unix, with the client's timeouts), the fixed
//! newstyle handshake (`NBD_OPT_GO` asking for block sizes, `NBD_OPT_EXPORT_NAME` for an old
//! server), and `NBD_OPT_STARTTLS` with the TLS handshake for an `nbds` URI.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use ztier_blockdev::BlockError;

use super::uri::Target;
use crate::proto::{self, *};
use crate::tls::ClientTls;
use crate::transport::{Stream, Transport};

/// Largest request sent when the server names no maximum (the spec's default, 32 MiB, is
/// what servers accept; smaller keeps memory per request low).
pub(super) const DEFAULT_MAX_PAYLOAD: u32 = 4 << 20;
/// Largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// What the handshake learned about the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

pub(super) fn io_err(
    what: impl Into<std::borrow::Cow<'static, str>>,
    why: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> io::Error {
    io::Error::other(BadReply {
        what: what.into(),
        why: why.into(),
    })
}

/// What the server said that the client cannot take: what was being read, and why (a
/// decoder's or TLS's own error kept whole, or the client's words). The cause is in the
/// message, not also a `source`: an error chain printed whole would say it twice.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {why}")]
pub struct BadReply {
    pub what: std::borrow::Cow<'static, str>,
    pub why: Box<dyn std::error::Error + Send + Sync>,
}

/// Reads `buf` whole; an error says what was being read, and keeps its kind (a timeout
/// stays a timeout, for the link to say so in words).
pub(super) fn read_exact(s: &mut impl Read, buf: &mut [u8], what: &str) -> io::Result<()> {
    s.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                e.kind(),
                format!("{what}: the server closed the connection"),
            )
        } else {
            io::Error::new(e.kind(), format!("{what}: {e}"))
        }
    })
}

/// How long a TCP connect may take, at most: a store on a host that does not answer (a
/// partition) is given up on and dialed again soon, so that it is found within about this
/// long once it is back, whatever the request timeout.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connected socket to `target`, its reads and writes timing out after `timeout`.
pub(super) fn open(target: &Target, timeout: Duration) -> io::Result<Stream> {
    let stream = match target {
        Target::Tcp { host, port } => {
            let mut last = io::Error::other(format!("{host}:{port} resolves to no address"));
            let mut found = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout.min(CONNECT_TIMEOUT)) {
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
            Stream::from(s)
        }
        Target::Unix(path) => {
            let s = UnixStream::connect(path)?;
            s.set_read_timeout(Some(timeout))?;
            s.set_write_timeout(Some(timeout))?;
            Stream::from(s)
        }
    };
    Ok(stream)
}

/// The fixed newstyle handshake, through STARTTLS and the TLS handshake if `tls` is given;
/// returns the stream to go on with and the export's details.
pub(super) fn handshake(
    mut raw: Stream,
    export: &str,
    tls: Option<&ClientTls>,
) -> io::Result<(Transport<Stream>, ExportInfo)> {
    let no_zeroes = greet(&mut raw)?;
    let mut s = Transport::plain(raw);
    if let Some(tls) = tls {
        start_tls(&mut s, tls)?;
    }
    let info = go(&mut s, export, no_zeroes)?;
    Ok((s, info))
}

/// `NBD_OPT_LIST` (through STARTTLS first if `tls` is given): every export the server
/// lists, then `NBD_OPT_ABORT`, the spec's polite goodbye.
pub(super) fn list(mut raw: Stream, tls: Option<&ClientTls>) -> io::Result<Vec<ListEntry>> {
    greet(&mut raw)?;
    let mut s = Transport::plain(raw);
    if let Some(tls) = tls {
        start_tls(&mut s, tls)?;
    }
    send_option(&mut s, OPT_LIST, &[])?;
    let mut exports = Vec::new();
    loop {
        let (reply, data) = read_option_reply(&mut s, OPT_LIST)?;
        match reply {
            REP_SERVER => {
                exports.push(ListEntry::decode(&data).map_err(|e| io_err("NBD_OPT_LIST", e))?)
            }
            REP_ACK => break,
            r => {
                let msg = String::from_utf8_lossy(&data).into_owned();
                let what = match r {
                    REP_ERR_UNSUP => "the server does not list its exports".to_string(),
                    REP_ERR_POLICY => "refused by the server's policy".into(),
                    REP_ERR_TLS_REQD => "the server requires TLS".into(),
                    r => format!("reply {r:#x}"),
                };
                return Err(io_err("NBD_OPT_LIST", format!("{what} {msg}").trim_end()));
            }
        }
    }
    // The goodbye's answer is not waited for: the list is had.
    let _ = send_option(&mut s, OPT_ABORT, &[]);
    Ok(exports)
}

/// `NBD_OPT_STARTTLS` and the TLS handshake. A server that does not offer TLS is left with
/// `NBD_OPT_ABORT` (the spec's soft disconnect) and refused: a client that asked for TLS
/// never goes on in the clear.
fn start_tls(s: &mut Transport<Stream>, tls: &ClientTls) -> io::Result<()> {
    send_option(s, OPT_STARTTLS, &[])?;
    let (reply, data) = read_option_reply(s, OPT_STARTTLS)?;
    if reply != REP_ACK {
        let _ = send_option(s, OPT_ABORT, &[]);
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
    s.start_tls(rustls::Connection::Client(conn))
}

/// The greeting and the client's flags; whether the server takes `NBD_FLAG_C_NO_ZEROES`.
fn greet(s: &mut Stream) -> io::Result<bool> {
    let mut hello = [0u8; 18];
    read_exact(s, &mut hello, "the server's greeting")?;
    let server_flags =
        proto::decode_greeting(&hello).map_err(|e| io_err("the server's greeting", e))?;
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
fn go(s: &mut Transport<Stream>, export: &str, no_zeroes: bool) -> io::Result<ExportInfo> {
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
    s: &mut Transport<Stream>,
    export: &str,
    no_zeroes: bool,
) -> io::Result<ExportInfo> {
    send_option(s, OPT_EXPORT_NAME, export.as_bytes())?;
    let mut reply = [0u8; 10];
    read_exact(s, &mut reply, "NBD_OPT_EXPORT_NAME's reply")?;
    let (size, flags) = proto::decode_export_name_reply(&reply)
        .map_err(|e| io_err("NBD_OPT_EXPORT_NAME's reply", e))?;
    if !no_zeroes {
        let mut zeroes = [0u8; 124];
        read_exact(s, &mut zeroes, "NBD_OPT_EXPORT_NAME's reply")?;
    }
    Ok(ExportInfo {
        size,
        flags,
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
    let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
    read_exact(s, &mut h, "an option reply")?;
    let h = OptionReplyHeader::decode(&h).map_err(|e| io_err("an option reply", e))?;
    if h.option != option {
        return Err(io_err(
            "an option reply",
            format!("it answers option {} where {option} was asked", h.option),
        ));
    }
    if h.len > MAX_OPTION_REPLY {
        return Err(io_err(
            "an option reply",
            format!("{} bytes is too long", h.len),
        ));
    }
    let mut data = vec![0u8; h.len as usize];
    read_exact(s, &mut data, "an option reply")?;
    Ok((h.reply, data))
}

/// The error a server's errno stands for.
pub(super) fn wire_error(errno: u32, what: &str) -> BlockError {
    match errno {
        ENOSPC => BlockError::NoSpace(format!("the NBD server: {what}").into()),
        ENOMEM => BlockError::NoMemory(format!("the NBD server: {what}").into()),
        EPERM => BlockError::ReadOnly,
        EINVAL => BlockError::Invalid(format!("the NBD server refused {what}").into()),
        ENOTSUP => BlockError::Unsupported("this request (per the NBD server)"),
        e => BlockError::Io(io::Error::other(format!(
            "the NBD server failed {what} with error {e}"
        ))),
    }
}
