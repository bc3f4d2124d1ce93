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
//! A store that is lost is waited for and dialed again by itself when it can be recognised
//! ([`Client::pin_identity`]): module `link` says how. Changes of state (lost, found,
//! refused) go to the owner's log ([`Client::set_log`]) and [`Client::status`].
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
//! The parts: `uri` (where an export is), `handshake` (the socket and the negotiation),
//! `link` (the connection, lost and found again), and here the requests.
//!
//! Locking: `writes` (every write, for the read-modify-write) → the link's locks (module
//! `link`).

mod handshake;
mod link;
mod uri;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ztier_blockdev::{BlockDevice, BlockError, Result};

use handshake::wire_error;
pub use handshake::{BadReply, ExportInfo};
use link::{Core, Pipelined, PipelinedData, RequestHeader};
pub use link::{LinkState, LinkStatus};
pub use uri::{BadUri, Target, Uri, UriProblem, UriTls, NBD_PORT};

use crate::proto::*;
use crate::tls::{self, ClientTls, TlsError};
use crate::transport::Stream;

/// How long one request may wait on the network before the connection counts as dead, by
/// default (the kernel's nbd client also defaults to 30 s).
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// How a client waits on its store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// How long one request (or a connect and handshake) may take, waiting for a lost store
    /// included, before it fails.
    pub io_timeout: Duration,
    /// The longest wait between tries to reconnect to a lost store: a store that is back is
    /// found within about this long.
    pub max_backoff: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            io_timeout: IO_TIMEOUT,
            max_backoff: Duration::from_secs(1),
        }
    }
}

/// The TLS an `nbds` URI asks for could not be set up: the URI, and the certificate
/// directory's own error, kept whole. A client refused so fails with
/// [`BlockError::Invalid`], whose cause this is (for a caller that downcasts it).
#[derive(Debug, thiserror::Error)]
#[error("TLS for {uri}: {source}")]
pub struct ClientTlsError {
    pub uri: Uri,
    pub source: TlsError,
}

/// Requests a pipelined read or write keeps in flight on the connection at once.
const IN_FLIGHT: usize = 32;

/// An export, connected or reconnecting.
pub struct Client {
    core: Arc<Core>,
    /// Held by every write, so the read-modify-write of a write not aligned to the server's
    /// minimum block cannot lose another write to the same block.
    writes: Mutex<()>,
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
        let (conn, info) = Core::dial(uri, config.io_timeout, tls.as_ref())?;
        Ok(Client::with_core(Core::new(uri, config, info, conn, tls)))
    }

    /// A client over a stream already connected to `uri`'s server (a socket pair in tests
    /// and fuzzing); reconnecting dials `uri`.
    pub fn over_stream(stream: Stream, uri: &Uri) -> Result<Client> {
        let tls = Client::tls_for(uri)?;
        let config = ClientConfig::default();
        let (conn, info) = Core::negotiate(stream, uri, config.io_timeout, tls.as_ref())?;
        Ok(Client::with_core(Core::new(uri, config, info, conn, tls)))
    }

    /// The exports `uri`'s server lists (`NBD_OPT_LIST`: name and description each), over
    /// TLS if the URI asks for it; `uri`'s export name is not used.
    pub fn list_exports(uri: &Uri) -> Result<Vec<ListEntry>> {
        let tls = Client::tls_for(uri)?;
        let raw = handshake::open(&uri.target, IO_TIMEOUT).map_err(BlockError::Io)?;
        handshake::list(raw, tls.as_ref()).map_err(BlockError::Io)
    }

    fn with_core(core: Arc<Core>) -> Client {
        Client {
            core,
            writes: Mutex::new(()),
        }
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
            .map_err(|source| {
                BlockError::Invalid(Box::new(ClientTlsError {
                    uri: uri.clone(),
                    source,
                }))
            })
    }

    /// Pins the export's identity: the `len` bytes at `offset` are read now, and every
    /// reconnect must find them again, or the store is refused. With an identity pinned the
    /// client waits for a lost store and reconnects by itself.
    pub fn pin_identity(&self, offset: u64, len: usize) -> Result<()> {
        let mut bytes = vec![0u8; len];
        self.read_at(offset, &mut bytes)?;
        self.core.set_identity(offset, bytes);
        Ok(())
    }

    /// Where the owner's log lines go (lost, reconnected, refused); none by default.
    pub fn set_log(&self, log: impl Fn(&str) + Send + Sync + 'static) {
        self.core.set_log(log);
    }

    /// Makes sure of the link now: while it seems up, one read proves it (a store killed a
    /// moment ago is found lost here); while it is down, it is dialed at once, whatever the
    /// backoff says. An error while another thread is dialing. The export must have its old
    /// size and, if one is pinned, hold its identity.
    pub fn reconnect(&self) -> Result<()> {
        self.core.reconnect()
    }

    /// Whether the connection is up.
    pub fn is_connected(&self) -> bool {
        self.status().state == LinkState::Connected
    }

    /// The link's state, since when, and its history. It never waits on the network: a
    /// request in flight holds the link, not this.
    pub fn status(&self) -> LinkStatus {
        self.core.status()
    }

    pub fn uri(&self) -> &Uri {
        &self.core.uri
    }
    pub fn info(&self) -> ExportInfo {
        self.core.info
    }
    pub fn config(&self) -> ClientConfig {
        self.core.config
    }

    /// One request and its simple reply; `write` is the payload of a write, `read` receives a
    /// read's data. Splitting is the caller's (each request is at most `max_payload`).
    fn request(
        &self,
        header: RequestHeader,
        write: Option<&[u8]>,
        mut read: Option<&mut [u8]>,
    ) -> Result<()> {
        let errno = self
            .core
            .on_link(|conn| conn.request(header, write, read.as_deref_mut()))?;
        match errno {
            0 => Ok(()),
            errno => Err(wire_error(
                errno,
                &format!(
                    "{} of {} bytes at {}",
                    command_name(header.kind),
                    header.length,
                    header.offset
                ),
            )),
        }
    }

    /// Requests of one kind (a read or a write, each at most `max_payload`, aligned) sent
    /// [`IN_FLIGHT`] at a time before their replies are read. The first refusal is the
    /// error; the others' outcomes are then unknown to the caller.
    fn pipelined(&self, kind: u16, mut ops: Vec<Pipelined<'_>>) -> Result<()> {
        for window in ops.chunks_mut(IN_FLIGHT) {
            let errnos = self.core.on_link(|conn| conn.window(kind, window))?;
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

    /// Whether `[offset, offset + len)` goes out as one request: aligned to the server's
    /// minimum block and at most its largest payload.
    fn is_one_request(&self, offset: u64, len: usize) -> bool {
        let info = &self.core.info;
        let b = u64::from(info.min_block);
        len > 0
            && len <= info.max_payload as usize
            && offset.is_multiple_of(b)
            && (len as u64).is_multiple_of(b)
    }

    fn check(&self, offset: u64, len: u64) -> Result<()> {
        ztier_blockdev::check_range(self.core.info.size, offset, len)
    }

    fn read_aligned(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len();
        for (off, at, n) in self.core.chunks(offset, len) {
            let header = RequestHeader {
                kind: CMD_READ,
                flags: 0,
                offset: off,
                length: n as u32,
            };
            self.request(header, None, Some(&mut buf[at..at + n]))?;
        }
        Ok(())
    }

    fn write_aligned(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let flags = if fua && self.has(FLAG_SEND_FUA) {
            CMD_FLAG_FUA
        } else {
            0
        };
        for (off, at, n) in self.core.chunks(offset, data.len()) {
            let header = RequestHeader {
                kind: CMD_WRITE,
                flags,
                offset: off,
                length: n as u32,
            };
            self.request(header, Some(&data[at..at + n]), None)
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
        let b = u64::from(self.core.info.min_block);
        (offset.div_ceil(b) * b, (offset + len) / b * b)
    }

    /// A request with no payload over a range, in requests of at most 4 GiB less a page.
    fn ranged(&self, kind: u16, flags: u16, offset: u64, len: u64) -> Result<()> {
        let max = u64::from(!4095u32);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(max);
            let header = RequestHeader {
                kind,
                flags,
                offset: offset + done,
                length: n as u32,
            };
            self.request(header, None, None)?;
            done += n;
        }
        Ok(())
    }

    fn write_zero_bytes(&self, offset: u64, len: u64) -> Result<()> {
        let zeros = vec![0u8; u64::from(self.core.info.max_payload).min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(offset + done, &zeros[..n], false)?;
            done += n as u64;
        }
        Ok(())
    }

    fn has(&self, flag: u16) -> bool {
        self.core.info.flags & flag != 0
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
        self.core.info.size
    }

    /// Moves when the link is lost (a read of the store then fails, whatever a cache held)
    /// and when it is found again (the store checked by its identity, but perhaps restarted).
    fn epoch(&self) -> u64 {
        self.core.epoch()
    }

    fn block_size(&self) -> u32 {
        self.core.info.min_block
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len() as u64)?;
        let (start, end) = self.core.aligned(offset, buf.len());
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
        let (start, end) = self.core.aligned(offset, data.len());
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
            let header = RequestHeader {
                kind: CMD_FLUSH,
                flags: 0,
                offset: 0,
                length: 0,
            };
            self.request(header, None, None)?;
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
        self.core.close();
    }
}
