//! The transmission phase: a connection's threads take turns reading whole requests, run
//! them on the device and reply, within the connection's and the server's budgets.

use super::*;

impl Server {
    /// Runs a negotiated connection, counted since its handshake took its place.
    pub(super) fn admit(
        self: &Arc<Self>,
        id: u64,
        peer: &str,
        transport: Transport<Stream>,
        session: Session,
        export: Export,
    ) {
        self.stats.connections.fetch_add(1, Ordering::Relaxed);
        export.stats.connections.fetch_add(1, Ordering::Relaxed);
        export
            .stats
            .live_connections
            .fetch_add(1, Ordering::Relaxed);
        let stats = Arc::clone(&export.stats);
        if self.config.log {
            let over = if transport.is_tls() { " over TLS" } else { "" };
            eprintln!(
                "nbd: connection {id} from {peer}{over} to export '{}'",
                export.name
            );
        }
        // A client that stops reading its replies is cut off after `reply_timeout` (the
        // socket's send timeout, shared by every handle on it), and what its requests held
        // goes back to the server's budget.
        if let (Stream::Unix(s), n @ 1..) = (transport.socket(), self.config.unix_send_buffer) {
            // Best effort: a refusal leaves the system's size, which serves, only slower.
            let _ = rustix::net::sockopt::set_socket_send_buffer_size(s, n);
        }
        let result = transport
            .socket()
            .set_write_timeout(Some(self.config.reply_timeout))
            .and_then(|()| {
                let (reader, writer) = transport.split();
                self.transmission(reader, writer, session, export)
            });
        self.unreserve(id);
        stats.live_connections.fetch_sub(1, Ordering::Relaxed);
        if self.config.log {
            match result {
                Ok(()) => eprintln!("nbd: connection {id} from {peer} ended"),
                Err(e) => eprintln!("nbd: connection {id} from {peer} ended: {e}"),
            }
        }
    }

    /// The transmission phase: the connection's threads take turns at reading (leader and
    /// followers): the one whose turn it is reads a request, whole, and hands the turn on,
    /// then runs the request and replies, so a payload is read and stored on one core while
    /// the next thread reads the next request. This thread is one of them.
    pub(super) fn transmission(
        self: &Arc<Self>,
        reader: ReadHalf,
        writer: WriteHalf,
        session: Session,
        export: Export,
    ) -> io::Result<()> {
        let conn = Arc::new(Conn {
            export,
            writer: Mutex::new(writer),
            credit: Credit::new(self.config.max_in_flight_bytes),
            reserve: Credit::new(self.reserve_share),
            buffers: Buffers::new(self.config.max_in_flight_bytes, Arc::clone(&self.kept)),
            session,
            dead: AtomicBool::new(false),
            reply_timeout: self.config.reply_timeout,
        });
        let turn = Arc::new(Mutex::new(Turn {
            stream: reader,
            ended: None,
        }));
        let followers: Vec<_> = (1..self.config.workers_per_connection.max(1))
            .map(|_| {
                let (server, conn, turn) = (Arc::clone(self), Arc::clone(&conn), Arc::clone(&turn));
                std::thread::spawn(move || server.take_turns(&conn, &turn))
            })
            .collect();
        self.take_turns(&conn, &turn);
        for f in followers {
            let _ = f.join();
        }
        // TLS's goodbye is given a second at most.
        conn.writer
            .lock()
            .expect("writer")
            .close(Duration::from_secs(1));
        let ended = lock_turn(&turn).ended.take();
        match ended {
            Some(Err(e)) if e.kind() != io::ErrorKind::UnexpectedEof => Err(e),
            _ => Ok(()),
        }
    }

    /// One thread's share of a connection: read a request on its turn, run it, reply; until
    /// the connection ends (a disconnect, `DISC`, a malformed header, or a reply that could
    /// not be sent), when the request in hand is still answered.
    pub(super) fn take_turns(&self, conn: &Conn, turn: &Mutex<Turn>) {
        loop {
            let job = {
                let mut t = lock_turn(turn);
                if t.ended.is_some() {
                    return;
                }
                match self.read_request(&mut t.stream, conn) {
                    Ok(Some(job)) => job,
                    Ok(None) => {
                        t.ended = Some(Ok(()));
                        return;
                    }
                    Err(e) => {
                        t.ended = Some(Err(e));
                        return;
                    }
                }
            };
            let Job {
                req,
                payload,
                cost,
                from,
            } = job;
            if !conn.dead.load(Ordering::Relaxed) {
                match run(self, conn, req, &payload) {
                    Ok(()) => tally(self, conn, Tally::Replies, 1),
                    Err(_) => {
                        conn.dead.store(true, Ordering::Relaxed);
                        conn.writer.lock().expect("writer").shutdown(Shutdown::Both);
                    }
                }
            }
            conn.buffers.give(payload);
            self.release_credit(conn, cost, from);
        }
    }

    /// Gives a finished request's buffer bytes back to the server's (its shared part or the
    /// connection's reserve, `from`) and the connection's budgets.
    pub(super) fn release_credit(&self, conn: &Conn, cost: usize, from: CreditFrom) {
        self.stats
            .in_flight_bytes
            .fetch_sub(cost as u64, Ordering::Relaxed);
        match from {
            CreditFrom::Reserve => conn.reserve.release(cost),
            CreditFrom::Shared => self.credit.release(cost),
        }
        conn.credit.release(cost);
    }

    /// Reads the next request to run, with its whole payload; `None` at `DISC`. A request
    /// whose payload is over the limit is read past and refused here.
    pub(super) fn read_request(&self, s: &mut ReadHalf, conn: &Conn) -> io::Result<Option<Job>> {
        loop {
            let mut header = [0u8; REQUEST_LEN];
            s.read_exact(&mut header)?;
            let req = Request::decode(&header).map_err(invalid)?;
            tally(self, conn, Tally::Requests, 1);
            if req.kind == CMD_DISC {
                return Ok(None);
            }
            let payload_len = if req.kind == CMD_WRITE { req.length } else { 0 };
            if payload_len > self.config.max_payload {
                // Read past the payload so the stream stays in step, then refuse it.
                discard(s, payload_len as u64)?;
                conn.send_error(req, EINVAL, "payload longer than the maximum")?;
                tally(self, conn, Tally::Errors, 1);
                tally(self, conn, Tally::Replies, 1);
                continue;
            }
            // What its buffers map (a write's payload, a read's reply), counted against the
            // connection's budget, then the server's.
            let read_len = if req.kind == CMD_READ {
                req.length.min(self.config.max_payload)
            } else {
                0
            };
            let cost = mapped_len(payload_len as usize) + mapped_len(read_len as usize);
            conn.credit.acquire(cost);
            // The connection's own reserve first, which no other connection can take (so
            // clients that stop reading their replies, holding the shared part until they
            // are cut off, delay no one else's small requests); the shared part past it. A
            // request that fits the reserve but finds it held by the connection's own
            // requests (the one just answered, not yet released) waits for the reserve
            // when the shared part is spent: only its own requests hold it, and they end.
            let from = if conn.reserve.try_acquire(cost) {
                CreditFrom::Reserve
            } else if self.credit.try_acquire(cost) {
                CreditFrom::Shared
            } else if cost <= self.reserve_share {
                conn.reserve.acquire(cost);
                CreditFrom::Reserve
            } else {
                self.credit.acquire(cost);
                CreditFrom::Shared
            };
            self.stats
                .in_flight_bytes
                .fetch_add(cost as u64, Ordering::Relaxed);
            let release = || self.release_credit(conn, cost, from);
            let mut payload = match conn.buffers.take(payload_len as usize) {
                Ok(b) => b,
                Err(e) => {
                    release();
                    return Err(e);
                }
            };
            if let Err(e) = s.read_exact(&mut payload) {
                release();
                return Err(e);
            }
            return Ok(Some(Job {
                req,
                payload,
                cost,
                from,
            }));
        }
    }
}

/// Whose turn it is to read a connection's next request, and how the connection ended.
pub(super) struct Turn {
    stream: ReadHalf,
    /// Set by the thread that saw the end; every other thread stops at its next turn.
    ended: Option<io::Result<()>>,
}

pub(super) fn lock_turn(turn: &Mutex<Turn>) -> std::sync::MutexGuard<'_, Turn> {
    // A thread that panicked mid-read leaves the stream out of step: end the connection.
    turn.lock().unwrap_or_else(|p| {
        let mut t = p.into_inner();
        t.ended
            .get_or_insert(Err(io::Error::other("a connection thread panicked")));
        t
    })
}

pub(super) struct Job {
    req: Request,
    payload: Buffer,
    cost: usize,
    from: CreditFrom,
}

/// Which part of the server's budget a request's bytes came from.
#[derive(Debug, Clone, Copy)]
pub(super) enum CreditFrom {
    /// The connection's own reserve.
    Reserve,
    /// The part every connection shares.
    Shared,
}

pub(super) struct Conn {
    /// What the connection opened at its handshake: its device, flags and counters.
    export: Export,
    writer: Mutex<WriteHalf>,
    /// The connection's budget (`max_in_flight_bytes`).
    credit: Credit,
    /// Its reserve of the server's budget: bytes only it may use.
    reserve: Credit,
    /// Payload buffers, reused across the connection's requests.
    buffers: Buffers,
    session: Session,
    /// A reply could not be sent: the client is gone. Requests still queued are dropped
    /// unrun, and the socket is shut so the reader stops too.
    dead: AtomicBool,
    /// How long one whole reply may take to go out (`reply_timeout`): a client that reads
    /// its replies a trickle at a time is cut off as one that reads none.
    reply_timeout: Duration,
}

impl Conn {
    /// Writes one whole reply (pieces in order, as [`WriteHalf::send_by`] sends them) under
    /// the writer lock.
    pub(super) fn send(&self, pieces: &[&[u8]]) -> io::Result<()> {
        let mut w = self.writer.lock().expect("writer");
        // The whole reply within `reply_timeout`, however the client reads it.
        w.send_by(pieces, Instant::now() + self.reply_timeout)
    }

    pub(super) fn send_ok(&self, req: Request) -> io::Result<()> {
        if self.session.structured {
            self.send(&[&chunk_header(
                req.cookie,
                REPLY_FLAG_DONE,
                REPLY_TYPE_NONE,
                0,
            )])
        } else {
            self.send(&[&simple_reply(req.cookie, 0)])
        }
    }

    /// One structured reply chunk, the last of its request: its header, then its payload.
    pub(super) fn send_chunk(&self, req: Request, kind: u16, payload: &[u8]) -> io::Result<()> {
        let header = chunk_header(req.cookie, REPLY_FLAG_DONE, kind, payload.len() as u32);
        self.send(&[&header, payload])
    }

    pub(super) fn send_error(&self, req: Request, error: u32, message: &str) -> io::Result<()> {
        if self.session.structured {
            self.send_chunk(req, REPLY_TYPE_ERROR, &error_chunk_payload(error, message))
        } else {
            self.send(&[&simple_reply(req.cookie, error)])
        }
    }
}

/// A byte budget for requests in flight.
pub(super) struct Credit {
    limit: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Credit {
    pub(super) fn new(limit: usize) -> Credit {
        Credit {
            limit,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits until `n` more bytes fit (a request larger than the whole budget runs alone).
    pub(super) fn acquire(&self, n: usize) {
        let mut used = self.used.lock().expect("credit");
        while *used > 0 && *used + n > self.limit {
            used = self.freed.wait(used).expect("credit");
        }
        *used += n;
    }

    /// Takes `n` bytes if they fit now; never waits.
    pub(super) fn try_acquire(&self, n: usize) -> bool {
        let mut used = self.used.lock().expect("credit");
        if *used + n > self.limit {
            return false;
        }
        *used += n;
        true
    }

    pub(super) fn release(&self, n: usize) {
        *self.used.lock().expect("credit") -= n;
        self.freed.notify_all();
    }
}

/// Runs one request and sends its reply.
pub(super) fn run(server: &Server, conn: &Conn, req: Request, payload: &[u8]) -> io::Result<()> {
    if let Err((error, msg)) = check(server, conn, &req) {
        tally(server, conn, Tally::Errors, 1);
        return conn.send_error(req, error, &msg);
    }
    let dev = &conn.export.device;
    let fua = req.flags & CMD_FLAG_FUA != 0;
    let result: Result<Option<Buffer>, BlockError> = match req.kind {
        CMD_READ => match conn.buffers.take(req.length as usize) {
            Ok(mut buf) => dev.read_at(req.offset, &mut buf).map(|()| Some(buf)),
            Err(e) => Err(BlockError::NoMemory(format!("a read buffer: {e}").into())),
        },
        CMD_WRITE => dev.write_at(req.offset, payload, fua).map(|()| None),
        CMD_FLUSH => dev.flush().map(|()| None),
        CMD_TRIM => dev
            .discard(req.offset, req.length as u64)
            .and_then(|()| if fua { dev.flush() } else { Ok(()) })
            .map(|()| None),
        CMD_CACHE => Ok(None),
        CMD_WRITE_ZEROES => {
            if req.flags & CMD_FLAG_FAST_ZERO != 0 && !dev.fast_zeroes() {
                Err(BlockError::Unsupported("fast zeroing"))
            } else {
                let unmap = req.flags & CMD_FLAG_NO_HOLE == 0;
                dev.write_zeroes(req.offset, req.length as u64, unmap)
                    .and_then(|()| if fua { dev.flush() } else { Ok(()) })
                    .map(|()| None)
            }
        }
        CMD_BLOCK_STATUS => return block_status(server, conn, req),
        _ => unreachable!("checked"),
    };
    match result {
        Ok(Some(data)) => {
            tally(server, conn, Tally::BytesRead, data.len() as u64);
            let sent = if conn.session.structured {
                let header = chunk_header(
                    req.cookie,
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_OFFSET_DATA,
                    8 + data.len() as u32,
                );
                conn.send(&[&header, &req.offset.to_be_bytes(), &data])
            } else {
                conn.send(&[&simple_reply(req.cookie, 0), &data])
            };
            conn.buffers.give(data);
            sent
        }
        Ok(None) => {
            if req.kind == CMD_WRITE {
                tally(server, conn, Tally::BytesWritten, payload.len() as u64);
            }
            conn.send_ok(req)
        }
        Err(e) => {
            tally(server, conn, Tally::Errors, 1);
            conn.send_error(req, wire_errno(e.errno()), &e.to_string())
        }
    }
}

/// A counter kept both for the whole server and for the connection's export.
#[derive(Debug, Clone, Copy)]
pub(super) enum Tally {
    Requests,
    Replies,
    Errors,
    BytesRead,
    BytesWritten,
}

/// Adds `n` to the server's counter `what` and to the connection's export's.
pub(super) fn tally(server: &Server, conn: &Conn, what: Tally, n: u64) {
    let (total, export) = match what {
        Tally::Requests => (&server.stats.requests, &conn.export.stats.requests),
        Tally::Replies => (&server.stats.replies, &conn.export.stats.replies),
        Tally::Errors => (&server.stats.errors, &conn.export.stats.errors),
        Tally::BytesRead => (&server.stats.bytes_read, &conn.export.stats.bytes_read),
        Tally::BytesWritten => (
            &server.stats.bytes_written,
            &conn.export.stats.bytes_written,
        ),
    };
    total.fetch_add(n, Ordering::Relaxed);
    export.fetch_add(n, Ordering::Relaxed);
}

/// The checks every request passes before the device sees it: (error, message) if not.
pub(super) fn check(server: &Server, conn: &Conn, req: &Request) -> Result<(), (u32, String)> {
    let known_flags =
        CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;
    if req.flags & !known_flags != 0 {
        return Err((EINVAL, format!("unknown command flags {:#x}", req.flags)));
    }
    let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    match req.kind {
        CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE | CMD_WRITE_ZEROES => {}
        CMD_BLOCK_STATUS if conn.session.base_allocation => {}
        CMD_BLOCK_STATUS => {
            return Err((EINVAL, "no metadata context was negotiated".into()));
        }
        k => return Err((EINVAL, format!("unknown command {k}"))),
    }
    if writes && conn.export.read_only {
        return Err((EPERM, "the export is read-only".into()));
    }
    if req.kind == CMD_FLUSH {
        return Ok(());
    }
    if matches!(req.kind, CMD_READ | CMD_WRITE) && req.length > server.config.max_payload {
        return Err((EINVAL, "longer than the maximum payload".into()));
    }
    let size = conn.export.device.size();
    if req
        .offset
        .checked_add(req.length as u64)
        .is_none_or(|end| end > size)
    {
        // The spec: ENOSPC for writes and write-zeroes past the end, EINVAL for the rest.
        let e = if matches!(req.kind, CMD_WRITE | CMD_WRITE_ZEROES) {
            ENOSPC
        } else {
            EINVAL
        };
        return Err((
            e,
            format!("{}+{} is past the end ({size})", req.offset, req.length),
        ));
    }
    if conn.session.block_sizes {
        let min = server.config.min_block as u64;
        let aligned = req.offset.is_multiple_of(min)
            && ((req.length as u64).is_multiple_of(min) || req.offset + req.length as u64 == size);
        // A trim is advisory: the device drops the whole blocks inside it and leaves the
        // partial ones, as the kernel's zram does with a discard's partial pages.
        if !aligned && !matches!(req.kind, CMD_BLOCK_STATUS | CMD_TRIM) {
            return Err((
                EINVAL,
                format!("not aligned to the {min}-byte minimum block"),
            ));
        }
    }
    Ok(())
}

/// `NBD_CMD_BLOCK_STATUS` for `base:allocation`: descriptors covering at most the asked
/// length, each no longer than a u32.
pub(super) fn block_status(server: &Server, conn: &Conn, req: Request) -> io::Result<()> {
    const MAX_DESCRIPTORS: usize = 1 << 16;
    let extents = match conn
        .export
        .device
        .block_status(req.offset, req.length as u64)
    {
        Ok(e) => e,
        Err(e) => {
            tally(server, conn, Tally::Errors, 1);
            return conn.send_error(req, wire_errno(e.errno()), &e.to_string());
        }
    };
    let mut payload = BASE_ALLOCATION_ID.to_be_bytes().to_vec();
    let mut left = req.length as u64;
    let mut count = 0;
    'extents: for e in extents {
        let mut len = e.len.min(left);
        let flags = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
        while len > 0 {
            let piece = len.min(u32::MAX as u64 & !4095);
            payload.extend((piece as u32).to_be_bytes());
            payload.extend(flags.to_be_bytes());
            len -= piece;
            left -= piece;
            count += 1;
            if count == MAX_DESCRIPTORS || req.flags & CMD_FLAG_REQ_ONE != 0 || left == 0 {
                break 'extents;
            }
        }
    }
    if count == 0 {
        tally(server, conn, Tally::Errors, 1);
        return conn.send_error(req, EINVAL, "no extent for that range");
    }
    conn.send_chunk(req, REPLY_TYPE_BLOCK_STATUS, &payload)
}
