//! The handshake: fixed newstyle, the options, STARTTLS, all under the handshake's deadline;
//! a connection is counted against `max_connections` only from its last reply.

use super::*;

impl Server {
    /// Serves one connection to its end: the handshake within its deadline, then, if there
    /// is room, the transmission phase.
    pub fn handle(self: &Arc<Self>, id: u64, stream: Stream) {
        let peer = stream.peer();
        if self.is_full() {
            self.turn_away(id, &peer, stream);
            return;
        }
        if self.handshakes.fetch_add(1, Ordering::SeqCst) >= self.config.max_handshakes {
            self.handshakes.fetch_sub(1, Ordering::SeqCst);
            self.stats
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            if self.config.log {
                eprintln!(
                    "nbd: connection {id} from {peer} closed: {} handshakes under way already",
                    self.config.max_handshakes
                );
            }
            return;
        }
        let who = stream.peer_id();
        if !self.take_peer_handshake(who) {
            self.handshakes.fetch_sub(1, Ordering::SeqCst);
            self.stats
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            if self.config.log {
                eprintln!(
                    "nbd: connection {id} from {peer} closed: {} handshakes under way from \
                     {who} already",
                    self.config.max_handshakes_per_peer
                );
            }
            return;
        }
        // Registered first, then `stopping` looked at: a stop either sees it or is seen.
        self.handshaking
            .lock()
            .expect("handshaking")
            .push((id, stream.share()));
        let negotiated = if self.is_stopping() {
            Ok(None)
        } else {
            self.negotiate(id, &stream)
        };
        self.handshaking
            .lock()
            .expect("handshaking")
            .retain(|(c, _)| *c != id);
        self.give_peer_handshake(who);
        self.handshakes.fetch_sub(1, Ordering::SeqCst);
        let (session, export, transport) = match negotiated {
            Ok(Some(negotiated)) => negotiated,
            Ok(None) => {
                self.unreserve(id);
                stream.shutdown(Shutdown::Both);
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::QuotaExceeded => {
                self.stats
                    .refused_connections
                    .fetch_add(1, Ordering::Relaxed);
                if self.config.log {
                    eprintln!(
                        "nbd: connection {id} from {peer} refused at its handshake's end: {e}"
                    );
                }
                stream.shutdown(Shutdown::Both);
                return;
            }
            Err(e) => {
                self.unreserve(id);
                self.stats.failed_handshakes.fetch_add(1, Ordering::Relaxed);
                if self.config.log {
                    eprintln!("nbd: connection {id} from {peer}: handshake failed: {e}");
                }
                stream.shutdown(Shutdown::Both);
                return;
            }
        };
        // The connection's socket is the transport's from here: this handle goes.
        drop(stream);
        self.admit(id, &peer, transport, session, export);
    }

    /// Opens the export `name` for connection `id` and takes its place among
    /// `max_connections`, before the handshake's last reply, so a client that has seen it is
    /// counted. Refused if there is no such export, or no place (handshakes that ended
    /// together may have filled them). The export is opened again if an export was
    /// disconnected meanwhile: the one this opened may be it.
    pub(super) fn admit_to(&self, id: u64, s: &Stream, name: &str) -> Result<Export, Refused> {
        loop {
            let disconnects = self.connections.lock().expect("connections").disconnects;
            let export = self.exports.open(name).ok_or(Refused::Unknown)?;
            let mut admitted = self.connections.lock().expect("connections");
            if admitted.disconnects != disconnects {
                continue;
            }
            if admitted.list.len() >= self.config.max_connections || self.is_stopping() {
                return Err(Refused::Full);
            }
            admitted.list.push(Admission {
                id,
                stream: s.share(),
                export: export.name.clone(),
                stats: Arc::clone(&export.stats),
            });
            return Ok(export);
        }
    }

    /// Counts a handshake of `who`'s, if it has fewer than `max_handshakes_per_peer` under
    /// way.
    fn take_peer_handshake(&self, who: Peer) -> bool {
        let mut by_peer = self.handshakes_by_peer.lock().expect("handshakes by peer");
        let n = by_peer.entry(who).or_insert(0);
        if *n >= self.config.max_handshakes_per_peer.max(1) {
            return false;
        }
        *n += 1;
        true
    }

    fn give_peer_handshake(&self, who: Peer) {
        let mut by_peer = self.handshakes_by_peer.lock().expect("handshakes by peer");
        if let std::collections::hash_map::Entry::Occupied(mut e) = by_peer.entry(who) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    pub(super) fn unreserve(&self, id: u64) {
        let mut admitted = self.connections.lock().expect("connections");
        admitted.list.retain(|a| a.id != id);
    }

    pub(super) fn is_full(&self) -> bool {
        self.connections.lock().expect("connections").list.len() >= self.config.max_connections
    }

    /// Greets, so the client sees a server, then closes: the spec's way to turn one away.
    pub(super) fn turn_away(&self, id: u64, peer: &str, s: Stream) {
        if self.config.log {
            eprintln!(
                "nbd: connection {id} from {peer} refused: {} connections already",
                self.config.max_connections
            );
        }
        self.turn_away_for(id, s, "");
    }

    /// Turns connection `id` away, saying `why` in the log (if it says anything).
    pub(super) fn turn_away_for(&self, id: u64, mut s: Stream, why: &str) {
        self.stats
            .refused_connections
            .fetch_add(1, Ordering::Relaxed);
        if self.config.log && !why.is_empty() {
            eprintln!("nbd: connection {id} from {} refused: {why}", s.peer());
        }
        let _ = set_blocking(&s);
        let _ = s.set_timeouts(Some(Duration::from_secs(1)));
        let _ = s.write_all(&greeting());
        s.shutdown(Shutdown::Both);
    }

    /// The handshake under its deadline (the TLS handshake included): each read and write
    /// may wait only for what is left of it. With the session, the connection to go on with
    /// (TLS, if the client started it), over a handle of `stream`.
    pub(super) fn negotiate(&self, id: u64, stream: &Stream) -> io::Result<Option<Negotiated>> {
        let mut s = Transport::plain(Deadline {
            stream: stream.share(),
            until: Instant::now() + self.config.handshake_limit,
        });
        let session = self.handshake(id, &mut s)?;
        stream.set_timeouts(None)?;
        let transport = s.map_socket(|deadline| deadline.stream);
        Ok(session.map(|(session, export)| (session, export, transport)))
    }

    /// The handshake and option haggling: the session and the export it opened; `None`
    /// when the client aborted or is done.
    pub(super) fn handshake(&self, id: u64, s: &mut Nego) -> io::Result<Option<(Session, Export)>> {
        let full = || {
            io::Error::new(
                io::ErrorKind::QuotaExceeded,
                format!("{} connections already", self.config.max_connections),
            )
        };
        s.write_all(&greeting())?;
        let mut flags = [0u8; 4];
        s.read_exact(&mut flags)?;
        let client_flags = proto::decode_client_flags(&flags).map_err(invalid)?;
        let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
        let mut session = Session::default();
        loop {
            let mut header = [0u8; 16];
            s.read_exact(&mut header)?;
            let (option, len) = proto::decode_option_header(&header).map_err(invalid)?;
            const MAX_OPTION: u32 = 64 << 10;
            if len > MAX_OPTION {
                if option == OPT_EXPORT_NAME || len > 16 << 20 {
                    return Err(invalid(format!("option data of {len} bytes")));
                }
                discard(s, len as u64)?;
                reply(s, option, REP_ERR_TOO_BIG, b"option data too long")?;
                continue;
            }
            let mut data = vec![0u8; len as usize];
            s.read_exact(&mut data)?;
            // FORCEDTLS: nothing but STARTTLS and ABORT before TLS.
            let tls_required = self.config.tls.mode() == TlsMode::Require && !s.is_tls();
            if tls_required && !matches!(option, OPT_STARTTLS | OPT_ABORT) {
                if option == OPT_EXPORT_NAME {
                    // It cannot be answered with an error: the spec has the session end.
                    return Err(invalid(
                        "NBD_OPT_EXPORT_NAME before STARTTLS: TLS is required",
                    ));
                }
                reply(
                    s,
                    option,
                    REP_ERR_TLS_REQD,
                    b"TLS is required: NBD_OPT_STARTTLS first",
                )?;
                continue;
            }
            match option {
                OPT_EXPORT_NAME => {
                    // An unknown name cannot be answered with an error: the spec has the
                    // session end.
                    let name = String::from_utf8_lossy(&data);
                    let export = match self.admit_to(id, &s.socket().stream, &name) {
                        Ok(export) => export,
                        Err(Refused::Unknown) => {
                            return Err(invalid(format!("unknown export '{name}'")))
                        }
                        Err(Refused::Full) => return Err(full()),
                    };
                    let mut v = export.device.size().to_be_bytes().to_vec();
                    v.extend(export.transmission_flags(session.structured).to_be_bytes());
                    if !no_zeroes {
                        v.extend([0u8; 124]);
                    }
                    s.write_all(&v)?;
                    return Ok(Some((session, export)));
                }
                OPT_ABORT => {
                    let _ = reply(s, option, REP_ACK, &[]);
                    return Ok(None);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        reply(s, option, REP_ERR_INVALID, b"LIST takes no data")?;
                        continue;
                    }
                    for (name, description) in self.exports.list() {
                        if let Some(v) = (ListEntry { name, description }).encode() {
                            reply(s, option, REP_SERVER, &v)?;
                        }
                    }
                    reply(s, option, REP_ACK, &[])?;
                }
                OPT_STARTTLS => match self.config.tls.config() {
                    None => reply(s, option, REP_ERR_UNSUP, b"TLS is not offered")?,
                    Some(_) if s.is_tls() => {
                        reply(s, option, REP_ERR_INVALID, b"TLS is already on")?
                    }
                    Some(_) if !data.is_empty() => {
                        reply(s, option, REP_ERR_INVALID, b"STARTTLS takes no data")?
                    }
                    Some(config) => {
                        let conn = rustls::ServerConnection::new(Arc::clone(config))
                            .map_err(|e| io::Error::other(crate::transport::TlsFailure(e)))?;
                        reply(s, option, REP_ACK, &[])?;
                        s.start_tls(rustls::Connection::Server(conn))?;
                        self.stats.tls_sessions.fetch_add(1, Ordering::Relaxed);
                        // What was haggled in the clear is forgotten, so a man in the middle
                        // cannot have chosen it (as nbdkit does since CVE-2021-3716).
                        session = Session::default();
                    }
                },
                OPT_INFO | OPT_GO => {
                    let req = match InfoRequest::decode(&data) {
                        Ok(r) => r,
                        Err(e) => {
                            reply(s, option, REP_ERR_INVALID, e.to_string().as_bytes())?;
                            continue;
                        }
                    };
                    // GO takes the connection's place with the export (before any reply,
                    // so a refusal comes alone); INFO only looks.
                    let opened = if option == OPT_GO {
                        self.admit_to(id, &s.socket().stream, &req.export)
                    } else {
                        self.exports.open(&req.export).ok_or(Refused::Unknown)
                    };
                    let export = match opened {
                        Ok(export) => export,
                        Err(Refused::Unknown) => {
                            let msg = format!("no export named '{}'", req.export);
                            reply(s, option, REP_ERR_UNKNOWN, msg.as_bytes())?;
                            continue;
                        }
                        Err(Refused::Full) => {
                            let e = full();
                            let _ = reply(s, option, REP_ERR_POLICY, e.to_string().as_bytes());
                            return Err(e);
                        }
                    };
                    let flags = export.transmission_flags(session.structured);
                    reply(
                        s,
                        option,
                        REP_INFO,
                        &info_export(export.device.size(), flags),
                    )?;
                    // The canonical name when asked for, or when the client asked by another
                    // (the default export's "").
                    if req.infos.contains(&INFO_NAME) || req.export != export.name {
                        let mut v = INFO_NAME.to_be_bytes().to_vec();
                        v.extend(export.name.as_bytes());
                        reply(s, option, REP_INFO, &v)?;
                    }
                    if req.infos.contains(&INFO_DESCRIPTION) && !export.description.is_empty() {
                        let mut v = INFO_DESCRIPTION.to_be_bytes().to_vec();
                        v.extend(export.description.as_bytes());
                        reply(s, option, REP_INFO, &v)?;
                    }
                    let preferred = export.device.block_size().max(self.config.min_block);
                    let block =
                        info_block_size(self.config.min_block, preferred, self.config.max_payload);
                    reply(s, option, REP_INFO, &block)?;
                    reply(s, option, REP_ACK, &[])?;
                    if option == OPT_GO {
                        session.block_sizes = req.infos.contains(&INFO_BLOCK_SIZE);
                        return Ok(Some((session, export)));
                    }
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        reply(s, option, REP_ERR_INVALID, b"takes no data")?;
                    } else {
                        session.structured = true;
                        reply(s, option, REP_ACK, &[])?;
                    }
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                    let set = option == OPT_SET_META_CONTEXT;
                    if set && !session.structured {
                        reply(s, option, REP_ERR_INVALID, b"structured replies first")?;
                        continue;
                    }
                    let decoded = MetaContextRequest::decode(&data);
                    let Some(req) = self.for_export(s, option, decoded, |r| &r.export)? else {
                        continue;
                    };
                    let wanted = if set {
                        req.queries.iter().any(|q| q == BASE_ALLOCATION)
                    } else {
                        req.queries.is_empty()
                            || req
                                .queries
                                .iter()
                                .any(|q| q == "base:" || q == BASE_ALLOCATION)
                    };
                    if wanted {
                        let mut v = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
                        v.extend(BASE_ALLOCATION.as_bytes());
                        reply(s, option, REP_META_CONTEXT, &v)?;
                    }
                    if set {
                        session.base_allocation = wanted;
                    }
                    reply(s, option, REP_ACK, &[])?;
                }
                _ => {
                    let msg = format!("option {option} is not supported");
                    reply(s, option, REP_ERR_UNSUP, msg.as_bytes())?;
                }
            }
        }
    }

    /// An option's decoded data if it parsed and names an export; else the error reply
    /// (INVALID, UNKNOWN) is sent and `None` returned, and the haggling goes on.
    pub(super) fn for_export<T>(
        &self,
        s: &mut Nego,
        option: u32,
        decoded: Result<T, Malformed>,
        export: impl Fn(&T) -> &str,
    ) -> io::Result<Option<T>> {
        let req = match decoded {
            Ok(r) => r,
            Err(e) => {
                reply(s, option, REP_ERR_INVALID, e.to_string().as_bytes())?;
                return Ok(None);
            }
        };
        if self.exports.open(export(&req)).is_none() {
            let msg = format!("no export named '{}'", export(&req));
            reply(s, option, REP_ERR_UNKNOWN, msg.as_bytes())?;
            return Ok(None);
        }
        Ok(Some(req))
    }
}

/// What a handshake settled: the session, its export, and the connection to go on with (TLS
/// if the client started it).
pub(super) type Negotiated = (Session, Export, Transport<Stream>);

pub(super) fn greeting() -> Vec<u8> {
    let mut v = NBDMAGIC.to_be_bytes().to_vec();
    v.extend(IHAVEOPT.to_be_bytes());
    v.extend((FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    v
}

pub(super) fn reply(s: &mut impl Write, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    s.write_all(&encode_option_reply(option, kind, data))
}

/// The handshake's stream: the socket under its deadline, and TLS over it once the client
/// has started it.
pub(super) type Nego = Transport<Deadline>;

/// A stream whose reads and writes may wait only until `until` in all.
pub(super) struct Deadline {
    /// A handle of the connection's socket.
    stream: Stream,
    until: Instant,
}

impl Deadline {
    pub(super) fn arm(&self) -> io::Result<()> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake went past its time limit",
            ));
        }
        self.stream.set_timeouts(Some(left))
    }

    pub(super) fn timed_out(e: io::Error) -> io::Error {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "the handshake went past its time limit",
            )
        } else {
            e
        }
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.read(buf).map_err(Deadline::timed_out)
    }
}

impl Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.stream.write(buf).map_err(Deadline::timed_out)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
