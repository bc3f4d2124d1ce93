//! The control socket of `ztier serve` and its two clients, `ztier stat` and `ztier ctl`: a
//! line in (`stat`, `stat json`, `get ATTR`, `set ATTR [VALUE]`), the answer out, then the
//! connection closes. Each connection is served on its own thread (at most
//! [`MAX_CONTROL_OWNER`] for the server's own user and root, [`MAX_CONTROL_PER_USER`] for each
//! other user), so a silent client or a long writeback holds up no one else, and no other
//! user can take the owner's places; requests that change the device are taken only from the server's own user and
//! root (`SO_PEERCRED`) unless the server was told otherwise. The loop sleeps in `poll` on
//! the listener and a stop eventfd. No lock of its own is held while a device method runs.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use rustix::event::{PollFd, PollFlags};
use serde::Serialize;
use ztier_nbd::{Client, LinkState, Server};

use super::frontends::Frontends;

use super::Store;
use crate::error::CliError;

/// Attributes `ztier ctl` runs with no value (the kernel's write-only files, whose value is
/// ignored, and ztier's own actions).
pub(super) const ACTIONS: [&str; 3] = ["compact", "reconnect", "save"];

/// `ztier stat`: the statistics of a running `ztier serve`.
#[derive(Args, Debug)]
pub struct StatArgs {
    /// The server's data socket (its control socket is this path with `.ctl` appended).
    #[arg(long, value_name = "PATH", required_unless_present = "control")]
    pub socket: Option<PathBuf>,
    /// The server's control socket, when it was given one with --control.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Print JSON instead of the kernel's sysfs format.
    #[arg(long)]
    pub json: bool,
    /// Of a host of devices (`ztier serve --device`), this device's only (by default: the
    /// host's line and every device's).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
}

/// `ztier ctl`: reads or writes a running server's zram attributes, by the kernel's sysfs
/// names (`ztier ctl --socket S mm_stat`, `ztier ctl --socket S writeback idle`).
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The server's data socket (its control socket is this path with `.ctl` appended).
    #[arg(long, value_name = "PATH", required_unless_present = "control")]
    pub socket: Option<PathBuf>,
    /// The server's control socket, when it was given one with --control.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Of a host of devices (`ztier serve --device`): the device whose attribute is read or
    /// written.
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// The attribute (mm_stat, bd_stat, idle, writeback, recompress, ...), then the value to
    /// write, if any. Of a host: `devices` (list them), `create NAME size=64G
    /// [compressor=lz4 mem_limit=2G mem_low=256M ...]` (a device made while the others
    /// serve), `destroy NAME [force]` (refused while a client holds it, unless forced: its
    /// clients are cut off); `device NAME ATTR [VALUE...]` is `--device NAME ATTR
    /// [VALUE...]`.
    #[arg(required = true, num_args = 1.., value_name = "ATTR [VALUE...]")]
    pub words: Vec<String>,
}

/// Sends one request to a running server's control socket; returns its answer.
fn ask(
    control: Option<&PathBuf>,
    socket: Option<&PathBuf>,
    request: &str,
) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let path = match (control, socket) {
        (Some(c), _) => c.clone(),
        (None, Some(s)) => control_path(s),
        (None, None) => bail!("give --socket or --control"),
    };
    let mut conn = std::os::unix::net::UnixStream::connect(&path)
        .map_err(|cause| CliError::NotServing { path, cause })?;
    // A server that turns the connection away answers before it reads (and closes): its
    // answer is read even when the request could not be written.
    let wrote = conn.write_all(format!("{request}\n").as_bytes());
    let mut answer = String::new();
    let read = conn.read_to_string(&mut answer);
    if answer.is_empty() {
        wrote?;
        read?;
    }
    Ok(answer)
}

pub fn ctl(args: &CtlArgs) -> anyhow::Result<()> {
    let host_request = ["devices", "create", "destroy"];
    // `device NAME ATTR [VALUE...]` in words is `--device NAME ATTR [VALUE...]`.
    let (device, words) = match args.words.as_slice() {
        [verb, name, rest @ ..] if verb == "device" && !rest.is_empty() => {
            if args.device.as_ref().is_some_and(|d| d != name) {
                bail!(
                    "--device {} and `device {name}`: name one device",
                    args.device.as_deref().unwrap_or_default()
                );
            }
            (Some(name), rest)
        }
        words => (args.device.as_ref(), words),
    };
    let request = match words {
        [verb, ..] if device.is_none() && host_request.contains(&verb.as_str()) => words.join(" "),
        // A device's own requests, as the server's hint writes them: its statistics, or an
        // explicit get or set.
        [verb, ..] if device.is_some() && (verb == "stat" || verb == "get" || verb == "set") => {
            words.join(" ")
        }
        [attr] if ACTIONS.contains(&attr.as_str()) => format!("set {attr}"),
        [attr] => format!("get {attr}"),
        [attr, value @ ..] => format!("set {attr} {}", value.join(" ")),
        [] => bail!("name an attribute"),
    };
    let request = match device {
        Some(name) => format!("device {name} {request}"),
        None => request,
    };
    let answer = ask(args.control.as_ref(), args.socket.as_ref(), &request)?;
    if let Some(e) = answer.strip_prefix("error: ") {
        bail!("{}", e.trim_end());
    }
    print!("{answer}");
    Ok(())
}

pub(super) fn control_path(socket: &std::path::Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// Asks a running server for its statistics and prints them.
pub fn stat(args: &StatArgs) -> anyhow::Result<()> {
    let request = if args.json { "stat json" } else { "stat" };
    let request = match &args.device {
        Some(name) => format!("device {name} {request}"),
        None => request.to_string(),
    };
    let answer = ask(args.control.as_ref(), args.socket.as_ref(), &request)?;
    if let Some(e) = answer.strip_prefix("error: ") {
        bail!("{}", e.trim_end());
    }
    print!("{answer}");
    Ok(())
}

/// The server's counters, read once.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct ServerCounts {
    connections: u64,
    refused_connections: u64,
    failed_handshakes: u64,
    requests: u64,
    replies: u64,
    errors: u64,
    bytes_written: u64,
    bytes_read: u64,
    accept_errors: u64,
}

impl ServerCounts {
    /// One export's counts (of a host's device): what the server counts per export.
    pub(super) fn of_export(e: &ztier_nbd::ExportCounts) -> ServerCounts {
        ServerCounts {
            connections: e.connections,
            refused_connections: 0,
            failed_handshakes: 0,
            requests: e.requests,
            replies: e.replies,
            errors: e.errors,
            bytes_written: e.bytes_written,
            bytes_read: e.bytes_read,
            accept_errors: 0,
        }
    }

    fn of(server: &Server) -> ServerCounts {
        let s = server.stats();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        ServerCounts {
            connections: load(&s.connections),
            refused_connections: load(&s.refused_connections),
            failed_handshakes: load(&s.failed_handshakes),
            requests: load(&s.requests),
            replies: load(&s.replies),
            errors: load(&s.errors),
            bytes_written: load(&s.bytes_written),
            bytes_read: load(&s.bytes_read),
            accept_errors: load(&s.accept_errors),
        }
    }
}

/// A remote backing store's link, as `stat` gives it.
#[derive(Debug, Clone, Serialize)]
struct StoreLink {
    uri: String,
    /// connected, lost or refused.
    state: &'static str,
    /// Why it was lost or refused.
    detail: Option<String>,
    /// Seconds in this state.
    for_s: f64,
    losses: u64,
    reconnects: u64,
    /// The status in a sentence, for the text form.
    #[serde(skip)]
    text: String,
}

impl StoreLink {
    fn of(c: &Client) -> StoreLink {
        let st = c.status();
        let (state, detail) = match &st.state {
            LinkState::Connected => ("connected", None),
            LinkState::Lost { error, .. } => ("lost", Some(error.clone())),
            LinkState::Refused { reason, .. } => ("refused", Some(reason.clone())),
        };
        StoreLink {
            uri: c.uri().to_string(),
            state,
            detail,
            for_s: st.since.elapsed().unwrap_or_default().as_secs_f64(),
            losses: st.losses,
            reconnects: st.reconnects,
            text: st.to_string(),
        }
    }
}

/// Everything `ztier stat` shows, read once: the JSON form serialises it, the text form
/// prints it, so the two cannot disagree.
#[derive(Debug, Serialize)]
pub(super) struct Snapshot {
    #[serde(skip_serializing_if = "Option::is_none")]
    mm_stat: Option<ztier_zram::MmStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    io_stat: Option<ztier_zram::IoStat>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bd_stat: Option<ztier_zram::BdStat>,
    /// The slot table's resident bytes (what grows with use beside the pool).
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreLink>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<ztier_zram::PolicyStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocator: Option<ztier_pool::PoolStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    plain: Option<PlainCounts>,
    /// NBD's server.
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<ServerCounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    vhost: Option<VhostCounts>,
}

/// The vhost-user-blk server's counters, read once.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct VhostCounts {
    pub(super) connections: u64,
    pub(super) requests: u64,
    pub(super) device_errors: u64,
    pub(super) refused: u64,
    pub(super) unsupported: u64,
    pub(super) unanswerable: u64,
    pub(super) bad_heads: u64,
    pub(super) protocol_errors: u64,
}

impl VhostCounts {
    pub(super) fn of(server: &ztier_vhost::Server) -> VhostCounts {
        let s = server.stats();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        VhostCounts {
            connections: load(&s.connections),
            requests: load(&s.requests),
            device_errors: load(&s.device_errors),
            refused: load(&s.refused),
            unsupported: load(&s.unsupported),
            unanswerable: load(&s.unanswerable),
            bad_heads: load(&s.bad_heads),
            protocol_errors: load(&s.protocol_errors),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
struct PlainCounts {
    bytes_held: u64,
}

impl Snapshot {
    /// A host's device: its figures, its policy's, and its front ends'.
    pub(super) fn of_device(
        device: &ztier_zram::Device,
        policy: Option<ztier_zram::PolicyStats>,
        server: Option<ServerCounts>,
        vhost: Option<VhostCounts>,
    ) -> Snapshot {
        Snapshot {
            mm_stat: Some(device.mm_stat()),
            io_stat: Some(device.io_stat()),
            bd_stat: device.bd_stat(),
            metadata_bytes: Some(device.metadata_bytes()),
            store: None,
            policy,
            allocator: Some(device.allocator_stats()),
            plain: None,
            server,
            vhost,
        }
    }

    /// Without the allocator's class table (a host's overview of many devices).
    pub(super) fn brief(mut self) -> Snapshot {
        self.allocator = None;
        self
    }

    fn of(store: &Store, fronts: &Frontends) -> Snapshot {
        let server = fronts.nbd.as_deref().map(ServerCounts::of);
        let vhost = fronts.vhost.as_deref().map(VhostCounts::of);
        match store {
            Store::Zram(device, policy, link, _) => Snapshot {
                mm_stat: Some(device.mm_stat()),
                io_stat: Some(device.io_stat()),
                bd_stat: device.bd_stat(),
                metadata_bytes: Some(device.metadata_bytes()),
                store: link.as_deref().map(StoreLink::of),
                policy: policy.as_ref().map(|p| p.stats()),
                allocator: Some(device.allocator_stats()),
                plain: None,
                server,
                vhost,
            },
            Store::Plain(device) => Snapshot {
                mm_stat: None,
                io_stat: None,
                bd_stat: None,
                metadata_bytes: None,
                store: None,
                policy: None,
                allocator: None,
                plain: Some(PlainCounts {
                    bytes_held: device.bytes_held(),
                }),
                server,
                vhost,
            },
        }
    }
}

impl std::fmt::Display for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(p) = &self.plain {
            writeln!(f, "plain RAM disk: {} bytes of pages held", p.bytes_held)?;
        }
        if let Some(m) = &self.mm_stat {
            writeln!(f, "mm_stat {m}")?;
        }
        if let Some(io) = &self.io_stat {
            writeln!(f, "io_stat {io}")?;
        }
        if let Some(b) = &self.bd_stat {
            writeln!(
                f,
                "bd_stat {:>8} {:>8} {:>8}  ({} bytes written, {} live on the store, {} held, \
                 {} pages failed to write back, {} reads failed their checksum)",
                b.bd_count,
                b.bd_reads,
                b.bd_writes,
                b.bytes_written,
                b.bytes_stored,
                b.bytes_held,
                b.failed_writebacks,
                b.checksum_failures
            )?;
        }
        if let Some(m) = self.metadata_bytes {
            writeln!(
                f,
                "metadata {m} bytes (the resident pages of the slot table and the store's tables)"
            )?;
        }
        if let Some(l) = &self.store {
            writeln!(f, "store {}: {}", l.uri, l.text)?;
        }
        if let Some(s) = &self.policy {
            writeln!(
                f,
                "policy {} ticks, {} pages recompressed, {} written back ({} for the memory \
                 target), {} bytes written, {} compactions, {} errors{}, {} ms busy",
                s.ticks,
                s.recompressed_pages,
                s.written_back_pages,
                s.target_written_back_pages,
                s.bytes_written,
                s.compactions,
                s.errors,
                s.last_error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" (last: {e})")),
                s.busy_ms
            )?;
            if let Some(p) = &s.promotion {
                writeln!(
                    f,
                    "promotion age {} s (predicted {}), {:.3} %/min of the stored pages read \
                     back in the last window, target {} %/min; {} decisions older, {} younger, \
                     {} holding",
                    p.age_secs,
                    p.predicted_share_per_minute.map_or(
                        "none known safe".to_string(),
                        |r| format!("{:.3} %/min", r * 100.0)
                    ),
                    p.share_per_minute * 100.0,
                    p.target_share_per_minute * 100.0,
                    p.older,
                    p.younger,
                    p.holding
                )?;
            }
        }
        if let Some(c) = &self.server {
            writeln!(
                f,
                "server {} connections ({} turned away, {} failed handshakes), {} requests, \
                 {} replied, {} errors, {} bytes written, {} read, {} accept errors",
                c.connections,
                c.refused_connections,
                c.failed_handshakes,
                c.requests,
                c.replies,
                c.errors,
                c.bytes_written,
                c.bytes_read,
                c.accept_errors
            )?;
        }
        if let Some(v) = &self.vhost {
            writeln!(
                f,
                "vhost-user-blk {} connections ({} ended by a protocol error), {} requests, {} \
                 device errors, {} refused, {} unsupported, {} unanswerable, {} bad heads",
                v.connections,
                v.protocol_errors,
                v.requests,
                v.device_errors,
                v.refused,
                v.unsupported,
                v.unanswerable,
                v.bad_heads
            )?;
        }
        if let Some(a) = &self.allocator {
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

/// The statistics, as the control socket and the shutdown report give them.
pub(super) fn stats_text(store: &Store, fronts: &Frontends, json: bool) -> String {
    let snapshot = Snapshot::of(store, fronts);
    if json {
        // Every field is a plain number, string or serialisable stat struct.
        return serde_json::to_string(&snapshot).map_or_else(
            |e| format!("error: the statistics could not be written as JSON: {e}\n"),
            |j| format!("{j}\n"),
        );
    }
    snapshot.to_string()
}

/// Control connections served at once for the server's own user and root together, and
/// for each other user (by `SO_PEERCRED`): one more is told so and closed. Another user's
/// silent connections (a socket opened with `--socket-mode 0666`) never take the owner's.
const MAX_CONTROL_OWNER: usize = 32;
const MAX_CONTROL_PER_USER: usize = 8;

/// Who a control connection counts against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ControlPeer {
    /// The server's own user, or root.
    Owner,
    /// Another user.
    User(u32),
    /// The kernel would not say.
    Unknown,
}

impl ControlPeer {
    fn of(conn: &UnixStream) -> ControlPeer {
        match rustix::net::sockopt::socket_peercred(conn) {
            Ok(cred) => {
                let uid = cred.uid.as_raw();
                if uid == 0 || uid == rustix::process::getuid().as_raw() {
                    ControlPeer::Owner
                } else {
                    ControlPeer::User(uid)
                }
            }
            Err(_) => ControlPeer::Unknown,
        }
    }

    fn limit(self) -> usize {
        match self {
            ControlPeer::Owner => MAX_CONTROL_OWNER,
            ControlPeer::User(_) | ControlPeer::Unknown => MAX_CONTROL_PER_USER,
        }
    }
}

/// Control connections open, per peer (held only to count).
#[derive(Default)]
struct ControlCounts(std::sync::Mutex<std::collections::HashMap<ControlPeer, usize>>);

impl ControlCounts {
    fn take(&self, who: ControlPeer) -> bool {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(who).or_insert(0);
        if *n >= who.limit() {
            return false;
        }
        *n += 1;
        true
    }

    fn give(&self, who: ControlPeer) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&who) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&who);
            }
        }
    }
}

/// Answers the control socket until `stop` is written to: each connection on its own
/// thread (a silent client or a long writeback holds up no one else), a line in, the answer
/// out. Requests that change the device are taken only from the server's own user and root,
/// unless `any_user`.
pub(super) fn serve_control(
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    answer: Arc<Answerer>,
    any_user: bool,
) {
    let busy = Arc::new(ControlCounts::default());
    let mut backoff = Duration::ZERO;
    loop {
        let mut fds = [
            PollFd::new(stop.as_ref(), PollFlags::IN),
            PollFd::new(&listener, PollFlags::IN),
        ];
        let pause = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: backoff.as_nanos() as i64,
        };
        // After an accept error, only the stop is waited for, for the pause.
        let polled = if backoff.is_zero() {
            rustix::event::poll(&mut fds, None)
        } else {
            rustix::event::poll(&mut fds[..1], Some(&pause))
        };
        match polled {
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return,
            Ok(_) if fds[0].revents().contains(PollFlags::IN) => return,
            Ok(_) => {}
        }
        if !backoff.is_zero() {
            backoff = Duration::ZERO;
            continue;
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            // Out of descriptors and the like: retried after a pause, never fatal.
            Err(_) => {
                backoff = Duration::from_millis(100);
                continue;
            }
        };
        let who = ControlPeer::of(&conn);
        if !busy.take(who) {
            let _ = (&conn).write_all(b"error: too many control connections; try again\n");
            continue;
        }
        let (answer, count) = (Arc::clone(&answer), Arc::clone(&busy));
        let spawned = std::thread::Builder::new()
            .name("ztier-ctl".into())
            .spawn(move || {
                answer_control(&conn, &*answer, any_user);
                count.give(who);
            });
        if spawned.is_err() {
            // The closure went with the failed spawn, its count not given back.
            busy.give(who);
        }
    }
}

/// What answers a control request: the request's line, and whether its peer may change
/// the server (its own user or root, or any user if the server was told so).
pub(super) type Answerer = dyn Fn(&str, bool) -> String + Send + Sync;

/// One control request and its answer.
fn answer_control(conn: &UnixStream, answer: &Answerer, any_user: bool) {
    use std::io::{BufRead, BufReader};
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let mut reader = BufReader::new(conn);
    if reader.by_ref().take(1024).read_line(&mut line).is_err() {
        return;
    }
    let may_change = any_user || may_change(conn);
    let _ = (&*conn).write_all(answer(line.trim(), may_change).as_bytes());
}

/// The refusal of a change asked by a peer that may not make it.
pub(super) const NOT_THE_OWNER: &str = "error: only the server's own user (or root) may change \
                                        the device; start it with --control-any-user to let \
                                        others\n";

/// A request to the one device of a server without `--device`.
pub(super) fn answer_one_device(
    store: &Store,
    fronts: &Frontends,
    request: &str,
    may_change: bool,
) -> String {
    match request {
        "stat" => stats_text(store, fronts, false),
        "stat json" => stats_text(store, fronts, true),
        r if r.starts_with("set ") && !may_change => NOT_THE_OWNER.to_string(),
        r if r.starts_with("device ") || r.starts_with("create ") || r.starts_with("destroy ") => {
            "error: this server serves one device (it was started without --device): leave out --device\n".into()
        }
        other => control(store, other),
    }
}

/// Whether the peer on `conn` runs as the server's user or as root.
fn may_change(conn: &UnixStream) -> bool {
    ControlPeer::of(conn) == ControlPeer::Owner
}

/// `get ATTR` and `set ATTR VALUE`: the device's sysfs attributes.
fn control(store: &Store, request: &str) -> String {
    let Store::Zram(device, _, link, state) = store else {
        return "error: a plain RAM disk has no attributes\n".into();
    };
    let mut words = request.splitn(3, ' ');
    let r = match (words.next(), words.next(), words.next()) {
        (Some("get"), Some("backing_dev"), None) => {
            device.show_attr("backing_dev").map(|a| match link {
                Some(c) => format!("{a}\nstore {}: {}", c.uri(), c.status()),
                None => a,
            })
        }
        (Some("set"), Some("save"), _) => {
            return match state {
                None => "error: the server was started without --state PATH\n".into(),
                Some(path) => match super::store::save_state(device, path, false) {
                    Ok(line) => format!("{line}\n"),
                    Err(e) => format!("error: {e:#}\n"),
                },
            }
        }
        (Some("set"), Some("reconnect"), _) => {
            return match link {
                None => "error: no remote backing store to reconnect to\n".into(),
                Some(c) => match c.reconnect() {
                    Ok(()) => format!("store {}: {}\n", c.uri(), c.status()),
                    Err(e) => format!("error: {e}\n"),
                },
            }
        }
        (Some("get"), Some(attr), None) => device.show_attr(attr),
        (Some("set"), Some(attr), value) => device.store_attr(attr, value.unwrap_or("")),
        _ => {
            return format!(
                "error: unknown request '{request}' (stat, stat json, get ATTR, set ATTR VALUE)\n"
            )
        }
    };
    match r {
        Ok(text) => format!("{text}\n"),
        Err(e) => format!("error: {e}\n"),
    }
}
