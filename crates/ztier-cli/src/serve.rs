//! `ztier serve`: a zram device served over NBD. Flags in, the wiring of device and server,
//! a log line per connection, and the device's statistics at shutdown.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use rustix::event::{PollFd, PollFlags};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_nbd::{Client, ClientConfig, LinkState, Listener, Server, ServerConfig};
use ztier_pool::AllocatorKind;
use ztier_zram::{Backing, Device, Policy, PolicyConfig};

use crate::classes::PoolLayoutArgs;
use crate::size::parse_size;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Disk size (K, M, G, T suffixes), a whole number of pages.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Serve on this Unix socket (removed at shutdown) instead of TCP.
    #[arg(long, value_name = "PATH", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,
    /// Serve on this TCP address (default 127.0.0.1:10809, or with --run a private Unix
    /// socket). Anything but loopback only when given explicitly. Under systemd socket
    /// activation (LISTEN_FDS) the socket handed over is served instead.
    #[arg(long, value_name = "ADDR:PORT")]
    pub listen: Option<String>,
    /// Captive mode, as nbdkit's: once the server accepts, run CMD through the shell with
    /// $uri, $unixsocket or $port, and $exportname set; the server lives exactly as long as
    /// CMD and exits with its status. Without --socket or --listen it serves on a private
    /// socket in a private directory.
    #[arg(long, value_name = "CMD")]
    pub run: Option<String>,
    /// Stop when the parent process exits (PR_SET_PDEATHSIG), as nbdkit's.
    #[arg(long)]
    pub exit_with_parent: bool,
    /// Write the server's pid to this file once it accepts connections (not removed at
    /// exit, as nbdkit's).
    #[arg(long, value_name = "PATH")]
    pub pidfile: Option<PathBuf>,
    /// What stores the pages: a zram device, or a plain uncompressed RAM disk (the
    /// protocol's own ceiling, to measure the server against; no compressor, no allocator).
    #[arg(long, value_enum, default_value = "zram")]
    pub store: StoreKind,
    /// Compressor, with optional parameters (lzo-rle, lz4, zstd:level=3, ...).
    #[arg(long, default_value = "lzo-rle")]
    pub compressor: Algorithm,
    /// Allocator under the device.
    #[arg(long, default_value = "zsmalloc")]
    pub allocator: AllocatorKind,
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Memory the device may use (K, M, G suffixes): a write past it fails with ENOSPC and
    /// changes nothing. 0: no limit.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub mem_limit: u64,
    /// The export's name (clients may also ask for the default, "").
    #[arg(long, default_value = "")]
    pub export_name: String,
    /// Refuse writes, trims and zeroing.
    #[arg(long)]
    pub read_only: bool,
    /// Connections served at once; one more is turned away.
    #[arg(long, default_value_t = 16)]
    pub max_connections: usize,
    /// No log line per connection.
    #[arg(long)]
    pub quiet: bool,
    /// The backing store for writeback: a file (made, sparse, if missing) or an NBD export
    /// (nbd://HOST:PORT/NAME, nbd+unix:///NAME?socket=PATH).
    #[arg(long, value_name = "PATH|URI")]
    pub backing_dev: Option<String>,
    /// The backing file's size when ztier makes it. Default: the disk's size and a little.
    #[arg(long, value_parser = parse_size)]
    pub backing_size: Option<u64>,
    /// How pages are laid out on the backing store: packed, compressed or page.
    #[arg(long, default_value = "packed")]
    pub writeback_format: ztier_zram::WbFormat,
    /// 4 KiB blocks writeback may write (writeback_limit); default none.
    #[arg(long)]
    pub writeback_limit: Option<u64>,
    /// Secondary algorithms for recompression, priority 1 first (recomp_algorithm).
    #[arg(long = "recompress-algorithm", value_name = "ALG")]
    pub recompress_algorithms: Vec<Algorithm>,
    /// Policy: recompress pages not accessed for this long (needs --recompress-algorithm).
    #[arg(long, value_parser = crate::size::parse_duration)]
    pub recompress_idle: Option<Duration>,
    /// Policy: write back pages not accessed for this long (needs --backing-dev).
    #[arg(long, value_parser = crate::size::parse_duration)]
    pub writeback_idle: Option<Duration>,
    /// Policy: keep the pool (mem_used_total) under this, writing back the oldest pages.
    #[arg(long, value_parser = parse_size)]
    pub mem_target: Option<u64>,
    /// How often the policy runs.
    #[arg(long, value_parser = crate::size::parse_duration, default_value = "10s")]
    pub policy_interval: Duration,
    /// The control socket `ztier stat` reads the running device's statistics from. Default
    /// with --socket: that path with `.ctl` appended; with --listen: none.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// How long a request to a remote backing store may wait before the store counts as
    /// lost; a lost store is dialed again by itself, with backoff, and checked to be the
    /// same store (its header's random id) before any page is read from it.
    #[arg(long, value_parser = crate::size::parse_duration, default_value = "30s")]
    pub backing_timeout: Duration,
    /// How long a client may take over its handshake before it is cut off (qemu-nbd's
    /// --handshake-limit). Handshakes under way do not count against --max-connections.
    #[arg(long, value_parser = crate::size::parse_duration, default_value = "10s")]
    pub handshake_limit: Duration,
    /// The Unix sockets' permissions (data and control), in octal. They are made 0600
    /// whatever the umask: only the server's user (and root) may connect.
    #[arg(long, value_parser = parse_mode, default_value = "0600")]
    pub socket_mode: u32,
    /// Let any user who can connect to the control socket change the device (writeback,
    /// limits, reconnect, ...). By default only the server's own user and root may; others
    /// may read statistics.
    #[arg(long)]
    pub control_any_user: bool,
}

/// An octal permission mode such as 0600 or 660.
fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal permission mode such as 0600"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Zram,
    Plain,
}

/// What is served.
enum Store {
    /// The device, its policy, and the NBD client of its remote backing store, if any.
    Zram(Arc<Device>, Option<Policy>, Option<Arc<Client>>),
    Plain(Arc<MemoryDevice>),
}

impl Store {
    fn block_device(&self) -> Arc<dyn BlockDevice> {
        match self {
            Store::Zram(d, ..) => Arc::clone(d) as Arc<dyn BlockDevice>,
            Store::Plain(d) => Arc::clone(d) as Arc<dyn BlockDevice>,
        }
    }
}

/// Attributes `ztier ctl` runs with no value (the kernel's write-only files, whose value is
/// ignored, and ztier's own actions).
const ACTIONS: [&str; 2] = ["compact", "reconnect"];

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
    /// The attribute (mm_stat, bd_stat, idle, writeback, recompress, ...), then the value to
    /// write, if any.
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
        .with_context(|| format!("connecting to {} (is ztier serve running?)", path.display()))?;
    conn.write_all(format!("{request}\n").as_bytes())?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    Ok(answer)
}

pub fn ctl(args: &CtlArgs) -> anyhow::Result<()> {
    let request = match args.words.as_slice() {
        [attr] if ACTIONS.contains(&attr.as_str()) => format!("set {attr}"),
        [attr] => format!("get {attr}"),
        [attr, value @ ..] => format!("set {attr} {}", value.join(" ")),
        [] => bail!("name an attribute"),
    };
    let answer = ask(args.control.as_ref(), args.socket.as_ref(), &request)?;
    if let Some(e) = answer.strip_prefix("error: ") {
        bail!("{}", e.trim_end());
    }
    print!("{answer}");
    Ok(())
}

fn control_path(socket: &std::path::Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// Asks a running server for its statistics and prints them.
pub fn stat(args: &StatArgs) -> anyhow::Result<()> {
    let request = if args.json { "stat json" } else { "stat" };
    print!(
        "{}",
        ask(args.control.as_ref(), args.socket.as_ref(), request)?
    );
    Ok(())
}

/// The statistics, as the control socket and the shutdown report give them.
fn stats_text(store: &Store, server: &Server, json: bool) -> String {
    let s = server.stats();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    if json {
        let server = serde_json::json!({
            "connections": load(&s.connections),
            "refused_connections": load(&s.refused_connections),
            "requests": load(&s.requests),
            "errors": load(&s.errors),
            "bytes_written": load(&s.bytes_written),
            "bytes_read": load(&s.bytes_read),
            "failed_handshakes": load(&s.failed_handshakes),
            "accept_errors": load(&s.accept_errors),
        });
        let v = match store {
            Store::Zram(device, policy, link) => serde_json::json!({
                "mm_stat": device.mm_stat(),
                "io_stat": device.io_stat(),
                "bd_stat": device.bd_stat(),
                "store": link.as_ref().map(|c| link_json(c)),
                "policy": policy.as_ref().map(|p| p.stats()),
                "allocator": device.allocator_stats(),
                "server": server,
            }),
            Store::Plain(device) => serde_json::json!({
                "plain": { "bytes_held": device.bytes_held() },
                "server": server,
            }),
        };
        return format!("{v}\n");
    }
    let server = format!(
        "server {} connections ({} turned away, {} failed handshakes), {} requests, {} errors, \
         {} bytes written, {} read, {} accept errors\n",
        load(&s.connections),
        load(&s.refused_connections),
        load(&s.failed_handshakes),
        load(&s.requests),
        load(&s.errors),
        load(&s.bytes_written),
        load(&s.bytes_read),
        load(&s.accept_errors),
    );
    match store {
        Store::Zram(device, policy, link) => {
            let bd = device.bd_stat().map_or(String::new(), |b| {
                format!(
                    "bd_stat {:>8} {:>8} {:>8}  ({} bytes written, {} live on the store, {} held)\n",
                    b.bd_count, b.bd_reads, b.bd_writes, b.bytes_written, b.bytes_stored, b.bytes_held
                )
            });
            let pol = policy.as_ref().map_or(String::new(), |p| {
                let s = p.stats();
                format!(
                    "policy {} ticks, {} pages recompressed, {} written back ({} for the memory \
                     target), {} bytes written, {} compactions, {} errors{}, {} ms busy\n",
                    s.ticks,
                    s.recompressed_pages,
                    s.written_back_pages,
                    s.target_written_back_pages,
                    s.bytes_written,
                    s.compactions,
                    s.errors,
                    s.last_error
                        .map_or(String::new(), |e| format!(" (last: {e})")),
                    s.busy_ms
                )
            });
            let link = link.as_ref().map_or(String::new(), |c| {
                format!("store {}: {}\n", c.uri(), c.status())
            });
            format!(
                "mm_stat {}\nio_stat {}\n{bd}{link}{pol}{server}{}",
                device.mm_stat(),
                device.io_stat(),
                device.allocator_stats()
            )
        }
        Store::Plain(device) => format!(
            "plain RAM disk: {} bytes of pages held\n{server}",
            device.bytes_held()
        ),
    }
}

/// The remote store's link as `stat json` gives it.
fn link_json(c: &Client) -> serde_json::Value {
    let st = c.status();
    let (state, detail) = match &st.state {
        LinkState::Connected => ("connected", None),
        LinkState::Lost { error, .. } => ("lost", Some(error.clone())),
        LinkState::Refused { reason, .. } => ("refused", Some(reason.clone())),
    };
    serde_json::json!({
        "uri": c.uri().to_string(),
        "state": state,
        "detail": detail,
        "for_s": st.since.elapsed().unwrap_or_default().as_secs_f64(),
        "losses": st.losses,
        "reconnects": st.reconnects,
    })
}

/// Control connections served at once; one more is told so and closed.
const MAX_CONTROL_CONNECTIONS: usize = 32;

/// Answers the control socket until `stop` is written to: each connection on its own
/// thread (a silent client or a long writeback holds up no one else), a line in, the answer
/// out. Requests that change the device are taken only from the server's own user and root,
/// unless `any_user`.
fn serve_control(
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    store: Arc<Store>,
    server: Arc<Server>,
    any_user: bool,
) {
    let busy = Arc::new(std::sync::atomic::AtomicUsize::new(0));
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
        if busy.fetch_add(1, Ordering::SeqCst) >= MAX_CONTROL_CONNECTIONS {
            busy.fetch_sub(1, Ordering::SeqCst);
            let _ = (&conn).write_all(b"error: too many control connections; try again\n");
            continue;
        }
        let (store, server, count) = (Arc::clone(&store), Arc::clone(&server), Arc::clone(&busy));
        let spawned = std::thread::Builder::new()
            .name("ztier-ctl".into())
            .spawn(move || {
                answer_control(&conn, &store, &server, any_user);
                count.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            // The closure (and its count) went with the failed spawn.
            busy.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// One control request and its answer.
fn answer_control(conn: &UnixStream, store: &Store, server: &Server, any_user: bool) {
    use std::io::{BufRead, BufReader};
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut line = String::new();
    let mut reader = BufReader::new(conn);
    if reader.by_ref().take(256).read_line(&mut line).is_err() {
        return;
    }
    let request = line.trim();
    let answer = match request {
        "stat" => stats_text(store, server, false),
        "stat json" => stats_text(store, server, true),
        r if r.starts_with("set ") && !any_user && !may_change(conn) => {
            "error: only the server's own user (or root) may change the device; \
             start it with --control-any-user to let others\n"
                .to_string()
        }
        other => control(store, other),
    };
    let _ = (&*conn).write_all(answer.as_bytes());
}

/// Whether the peer on `conn` runs as the server's user or as root.
fn may_change(conn: &UnixStream) -> bool {
    rustix::net::sockopt::socket_peercred(conn).is_ok_and(|cred| {
        let uid = cred.uid.as_raw();
        uid == 0 || uid == rustix::process::getuid().as_raw()
    })
}

/// `get ATTR` and `set ATTR VALUE`: the device's sysfs attributes.
fn control(store: &Store, request: &str) -> String {
    let Store::Zram(device, _, link) = store else {
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

/// The backing store `--backing-dev` names, and the NBD client under it if it is remote.
fn backing_store(args: &ServeArgs) -> anyhow::Result<Option<(Backing, Option<Arc<Client>>)>> {
    let Some(spec) = &args.backing_dev else {
        return Ok(None);
    };
    if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
        let uri: ztier_nbd::Uri = spec.parse().map_err(anyhow::Error::msg)?;
        let config = ClientConfig {
            io_timeout: args.backing_timeout,
            ..ClientConfig::default()
        };
        let client = Arc::new(
            Client::connect_with(&uri, config)
                .with_context(|| format!("connecting to the backing export {uri}"))?,
        );
        let backing = Backing::new(
            Arc::clone(&client) as Arc<dyn BlockDevice>,
            args.writeback_format,
        )
        .with_context(|| format!("setting up the backing store {spec}"))?;
        // Written by Backing::new: from now on only this store is ever read back.
        let (offset, len) = backing.identity();
        client
            .pin_identity(offset, len)
            .with_context(|| format!("reading back the identity just written to {uri}"))?;
        client.set_log(|line| eprintln!("ztier serve: {line}"));
        return Ok(Some((backing, Some(client))));
    }
    let bytes = args.backing_size.unwrap_or(Backing::size_for(args.size));
    let file = ztier_blockdev::file::FileDevice::open(std::path::Path::new(spec), bytes)
        .with_context(|| format!("opening the backing file {spec}"))?;
    let backing = Backing::new(Arc::new(file), args.writeback_format)
        .with_context(|| format!("setting up the backing store {spec}"))?;
    Ok(Some((backing, None)))
}

/// Socket files `ztier serve` made, and private directories it made for them, removed
/// when it ends however it ends.
struct SocketFiles(Vec<PathBuf>, Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
        for d in &self.1 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Binds a Unix socket at `path` with permissions `mode` from the start: made under a umask
/// that lets no one else in, so no other user can connect between the bind and the chmod.
fn bind_private(
    path: &std::path::Path,
    mode: u32,
    files: &mut SocketFiles,
) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        bail!(
            "{} exists; remove it if no server is using it",
            path.display()
        );
    }
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let l = bound.with_context(|| format!("binding {}", path.display()))?;
    files.0.push(path.to_owned());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting {}'s mode to {mode:o}", path.display()))?;
    Ok(l)
}

/// `ztier serve`; its exit status (0, or with --run the command's).
pub fn run(args: &ServeArgs) -> anyhow::Result<u8> {
    // First, before any thread starts: listenfd takes LISTEN_PID and LISTEN_FDS out of the
    // environment, so a --run command does not see them.
    let activated = listenfd::ListenFd::from_env();
    let made_backing = args
        .backing_dev
        .as_deref()
        .filter(|b| !b.starts_with("nbd://") && !b.starts_with("nbd+unix://"))
        .map(PathBuf::from)
        .filter(|p| !p.exists());
    let r = serve(args, activated);
    if let Some(p) = made_backing {
        let _ = std::fs::remove_file(p);
    }
    r
}

/// Where the server listens, and how a client names it.
struct Place {
    listener: Listener,
    uri: String,
    unix_socket: Option<PathBuf>,
    port: Option<u16>,
}

/// The listener: the socket systemd handed over, `--socket`, a private socket for `--run`,
/// or `--listen` (default 127.0.0.1:10809).
fn listen(
    args: &ServeArgs,
    mut activated: listenfd::ListenFd,
    files: &mut SocketFiles,
) -> anyhow::Result<Place> {
    let export = &args.export_name;
    let unix = |path: &std::path::Path, l: UnixListener| Place {
        listener: Listener::Unix(l),
        uri: format!("nbd+unix:///{export}?socket={}", path.display()),
        unix_socket: Some(path.to_owned()),
        port: None,
    };
    let tcp = |l: TcpListener| -> anyhow::Result<Place> {
        let addr = l.local_addr()?;
        if !addr.ip().is_loopback() {
            eprintln!(
                "ztier serve: WARNING: listening on {addr}, beyond this machine, with no \
                 TLS: anyone who can reach it can read and write the disk"
            );
        }
        Ok(Place {
            listener: Listener::Tcp(l),
            uri: format!("nbd://{addr}/{export}"),
            unix_socket: None,
            port: Some(addr.port()),
        })
    };
    if activated.len() > 0 {
        if args.socket.is_some() || args.listen.is_some() {
            bail!("--socket and --listen cannot be given under socket activation (LISTEN_FDS)");
        }
        if activated.len() > 1 {
            bail!(
                "socket activation handed {} sockets; ztier serve takes one",
                activated.len()
            );
        }
        if let Ok(Some(l)) = activated.take_unix_listener(0) {
            let path = l
                .local_addr()?
                .as_pathname()
                .map_or_else(|| PathBuf::from("(unnamed)"), |p| p.to_owned());
            return Ok(unix(&path, l));
        }
        return match activated.take_tcp_listener(0) {
            Ok(Some(l)) => tcp(l),
            _ => bail!("the socket handed over (LISTEN_FDS) is no listening Unix or TCP socket"),
        };
    }
    if let Some(path) = &args.socket {
        let l = bind_private(path, args.socket_mode, files)?;
        return Ok(unix(path, l));
    }
    if args.run.is_some() && args.listen.is_none() {
        let dir = private_dir()?;
        files.1.push(dir.clone());
        let path = dir.join("nbd.sock");
        let l = bind_private(&path, args.socket_mode, files)?;
        return Ok(unix(&path, l));
    }
    let addr = args.listen.as_deref().unwrap_or("127.0.0.1:10809");
    let l = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    tcp(l)
}

/// A new directory only this user can enter, for --run's private socket.
fn private_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    for n in 0..100u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let dir = base.join(format!("ztier-serve-{}-{nanos:08x}{n}", std::process::id()));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("making {}", dir.display())),
        }
    }
    bail!("no private directory could be made in {}", base.display())
}

/// Tells systemd (NOTIFY_SOCKET, if set) how the server is; a failure is only logged.
fn notify(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        eprintln!("ztier serve: telling NOTIFY_SOCKET: {e}");
    }
}

fn status_line(store: &Store, size: u64, uri: &str) -> String {
    match store {
        Store::Zram(device, ..) => format!(
            "serving {size} bytes at {uri}; {} bytes stored in {} of memory",
            device.mm_stat().orig_data_size,
            device.mm_stat().mem_used_total
        ),
        Store::Plain(device) => format!(
            "serving {size} bytes at {uri}; {} bytes of pages held",
            device.bytes_held()
        ),
    }
}

/// Starts `--run`'s command through the shell, with the server's place in its environment.
fn start_command(cmd: &str, place: &Place, export: &str) -> anyhow::Result<std::process::Child> {
    let mut c = std::process::Command::new("sh");
    c.arg("-c").arg(cmd);
    c.env("uri", &place.uri).env("exportname", export);
    match (&place.unix_socket, place.port) {
        (Some(path), _) => {
            c.env("unixsocket", path).env_remove("port");
        }
        (None, Some(port)) => {
            c.env("port", port.to_string()).env_remove("unixsocket");
        }
        (None, None) => {}
    }
    c.spawn()
        .with_context(|| format!("running --run's command {cmd:?}"))
}

fn serve(args: &ServeArgs, activated: listenfd::ListenFd) -> anyhow::Result<u8> {
    // The parent to outlive, read before anything can make it exit unseen.
    let parent = rustix::process::getppid();
    let (store, what) = match args.store {
        StoreKind::Zram => {
            let layout = args.layout.config();
            layout.validate().map_err(anyhow::Error::msg)?;
            let pool = args
                .allocator
                .make_pool(&layout)
                .map_err(anyhow::Error::msg)?;
            let device = Device::new(args.size, args.compressor.clone(), pool)
                .with_context(|| format!("making a {}-byte device", args.size))?;
            device.set_mem_limit(args.mem_limit);
            let (backing, link) = backing_store(args)?.unzip();
            device.set_backing(backing)?;
            device.set_writeback_limit(args.writeback_limit);
            device.set_recomp_algorithms(args.recompress_algorithms.clone())?;
            let policy = PolicyConfig {
                recompress_idle: args.recompress_idle,
                writeback_idle: args.writeback_idle,
                mem_target: args.mem_target,
                interval: args.policy_interval,
            };
            if policy.recompress_idle.is_some() && args.recompress_algorithms.is_empty() {
                bail!("--recompress-idle needs a --recompress-algorithm");
            }
            if (policy.writeback_idle.is_some() || policy.mem_target.is_some())
                && args.backing_dev.is_none()
            {
                bail!("--writeback-idle and --mem-target need a --backing-dev");
            }
            let mut what = format!("zram, {} on {}", args.compressor, args.allocator);
            if let Some(b) = &args.backing_dev {
                what += &format!(", writeback to {b} ({:?})", args.writeback_format);
            }
            let device = Arc::new(device);
            let policy = if policy.is_active() {
                what += ", policy on";
                Some(Policy::start(Arc::clone(&device), policy).context("starting the policy")?)
            } else {
                None
            };
            (Store::Zram(device, policy, link.flatten()), what)
        }
        StoreKind::Plain => {
            if args.mem_limit != 0 || args.backing_dev.is_some() {
                bail!("--mem-limit and --backing-dev are zram's: a plain RAM disk has neither");
            }
            let device = MemoryDevice::new(args.size)
                .with_context(|| format!("making a {}-byte RAM disk", args.size))?;
            let what = "a plain RAM disk (no compression)".to_string();
            (Store::Plain(Arc::new(device)), what)
        }
    };
    let store = Arc::new(store);
    let config = ServerConfig {
        export_name: args.export_name.clone(),
        description: Some(format!("ztier {what}")),
        read_only: args.read_only,
        max_connections: args.max_connections.max(1),
        min_block: 512,
        log: !args.quiet,
        handshake_limit: args.handshake_limit,
        ..ServerConfig::default()
    };
    let mut files = SocketFiles(Vec::new(), Vec::new());
    let place = listen(args, activated, &mut files)?;
    let server = Server::new(store.block_device(), config);
    let control = args
        .control
        .clone()
        .or_else(|| args.socket.as_deref().map(control_path));
    let stop_control = Arc::new(
        rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .context("making the control socket's stop eventfd")?,
    );
    let control_thread = match &control {
        Some(path) => {
            let l =
                bind_private(path, args.socket_mode, &mut files).context("the control socket")?;
            l.set_nonblocking(true)?;
            let (store, server, stop) = (
                Arc::clone(&store),
                Arc::clone(&server),
                Arc::clone(&stop_control),
            );
            let any = args.control_any_user;
            Some(std::thread::spawn(move || {
                serve_control(l, stop, store, server, any)
            }))
        }
        None => None,
    };

    // SIGINT and SIGTERM set a flag; a watcher stops the server, which answers what is in
    // flight and ends its connections. A second signal, with the flag already set, ends the
    // process at once (status 1).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&stop))
            .context("installing signal handlers")?;
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    if args.exit_with_parent {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
            .context("--exit-with-parent")?;
        // The parent may have gone before the death signal was set: look once more.
        if rustix::process::getppid() != parent {
            stop.store(true, Ordering::Relaxed);
        }
    }
    // The listener is listening: a client that connects now is served.
    if let Some(path) = &args.pidfile {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing the pid file {}", path.display()))?;
    }
    let status = status_line(&store, args.size, &place.uri);
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    let command = match &args.run {
        Some(cmd) => Some(start_command(cmd, &place, &args.export_name)?),
        None => None,
    };
    let exit = Arc::new(std::sync::Mutex::new(None::<u8>));
    let watcher = {
        let (server, stop, store, exit) = (
            Arc::clone(&server),
            Arc::clone(&stop),
            Arc::clone(&store),
            Arc::clone(&exit),
        );
        let (size, uri) = (args.size, place.uri.clone());
        let mut command = command;
        std::thread::spawn(move || {
            let mut ticks = 0u32;
            while !stop.load(Ordering::Relaxed) && !server.is_stopping() {
                if let Some(c) = command.as_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        *exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(exit_code(status));
                        command = None;
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
                ticks += 1;
                if ticks.is_multiple_of(200) {
                    let status = status_line(&store, size, &uri);
                    notify(&[sd_notify::NotifyState::Status(&status)]);
                }
            }
            notify(&[sd_notify::NotifyState::Stopping]);
            server.stop();
            // Stopped by a signal while the command runs: it goes too.
            if let Some(mut c) = command {
                let pid = rustix::process::Pid::from_child(&c);
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                if let Ok(status) = c.wait() {
                    *exit.lock().unwrap_or_else(|p| p.into_inner()) = Some(exit_code(status));
                }
            }
        })
    };
    eprintln!("ztier serve: {} bytes, {what}, at {}", args.size, place.uri);
    let served = server.serve(place.listener);
    server.stop();
    let _ = watcher.join();
    let _ = rustix::io::write(stop_control.as_ref(), &1u64.to_ne_bytes());
    if let Some(t) = control_thread {
        let _ = t.join();
    }
    drop(files);
    served.context("serving")?;
    eprintln!("ztier serve: stopped");
    // In captive mode stdout is the command's: the statistics go to stderr.
    if args.run.is_some() {
        eprint!("{}", stats_text(&store, &server, false));
    } else {
        print!("{}", stats_text(&store, &server, false));
    }
    let code = *exit.lock().unwrap_or_else(|p| p.into_inner());
    Ok(code.unwrap_or(0))
}

/// A command's exit status as a shell gives it: its code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => 1,
    }
}
