//! `ztier serve`: a zram device served over NBD. Flags in, the wiring of device and server,
//! a log line per connection, and the device's statistics at shutdown.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_nbd::{Listener, Server, ServerConfig};
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
    /// Serve on this TCP address. Anything but loopback only when given explicitly.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:10809")]
    pub listen: String,
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Zram,
    Plain,
}

/// What is served.
enum Store {
    Zram(Arc<Device>, Option<Policy>),
    Plain(Arc<MemoryDevice>),
}

impl Store {
    fn block_device(&self) -> Arc<dyn BlockDevice> {
        match self {
            Store::Zram(d, _) => Arc::clone(d) as Arc<dyn BlockDevice>,
            Store::Plain(d) => Arc::clone(d) as Arc<dyn BlockDevice>,
        }
    }
}

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
        });
        let v = match store {
            Store::Zram(device, policy) => serde_json::json!({
                "mm_stat": device.mm_stat(),
                "io_stat": device.io_stat(),
                "bd_stat": device.bd_stat(),
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
        "server {} connections ({} turned away), {} requests, {} errors, {} bytes written, {} read\n",
        load(&s.connections),
        load(&s.refused_connections),
        load(&s.requests),
        load(&s.errors),
        load(&s.bytes_written),
        load(&s.bytes_read),
    );
    match store {
        Store::Zram(device, policy) => {
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
            format!(
                "mm_stat {}\nio_stat {}\n{bd}{pol}{server}{}",
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

/// Answers `stat` and `stat json` on the control socket until the server stops.
fn serve_control(listener: UnixListener, store: Arc<Store>, server: Arc<Server>) {
    use std::io::{BufRead, BufReader, Read, Write};
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !server.is_stopping() {
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(_) => continue,
        };
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        let mut reader = BufReader::new(&conn);
        if reader.by_ref().take(256).read_line(&mut line).is_err() {
            continue;
        }
        let answer = match line.trim() {
            "stat" => stats_text(&store, &server, false),
            "stat json" => stats_text(&store, &server, true),
            other => control(&store, other),
        };
        let _ = (&conn).write_all(answer.as_bytes());
    }
}

/// `get ATTR` and `set ATTR VALUE`: the device's sysfs attributes.
fn control(store: &Store, request: &str) -> String {
    let Store::Zram(device, _) = store else {
        return "error: a plain RAM disk has no attributes\n".into();
    };
    let mut words = request.splitn(3, ' ');
    let r = match (words.next(), words.next(), words.next()) {
        (Some("get"), Some(attr), None) => device.show_attr(attr),
        (Some("set"), Some(attr), Some(value)) => device.store_attr(attr, value),
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

/// The backing store `--backing-dev` names, for a disk of `disksize` bytes.
fn backing_store(args: &ServeArgs) -> anyhow::Result<Option<Backing>> {
    let Some(spec) = &args.backing_dev else {
        return Ok(None);
    };
    let dev: Arc<dyn BlockDevice> = if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://")
    {
        let uri: ztier_nbd::Uri = spec.parse().map_err(anyhow::Error::msg)?;
        Arc::new(
            ztier_nbd::Client::connect(&uri)
                .with_context(|| format!("connecting to the backing export {uri}"))?,
        )
    } else {
        let pages = args.size / ztier_swap::SLOT_BYTES;
        let bytes = args
            .backing_size
            .unwrap_or(((pages + 1).div_ceil(512) + 1) * 512 * ztier_swap::SLOT_BYTES);
        Arc::new(
            ztier_blockdev::file::FileDevice::open(std::path::Path::new(spec), bytes)
                .with_context(|| format!("opening the backing file {spec}"))?,
        )
    };
    Ok(Some(
        Backing::new(dev, args.writeback_format)
            .with_context(|| format!("setting up the backing store {spec}"))?,
    ))
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let made_backing = args
        .backing_dev
        .as_deref()
        .filter(|b| !b.starts_with("nbd://") && !b.starts_with("nbd+unix://"))
        .map(PathBuf::from)
        .filter(|p| !p.exists());
    let r = serve(args);
    if let Some(p) = made_backing {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
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
            device.set_backing(backing_store(args)?)?;
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
            (Store::Zram(device, policy), what)
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
        ..ServerConfig::default()
    };
    let (listener, place) = match &args.socket {
        Some(path) => {
            if path.exists() {
                bail!(
                    "{} exists; remove it if no server is using it",
                    path.display()
                );
            }
            let l =
                UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
            (
                Listener::Unix(l),
                format!("nbd+unix:///{}?socket={}", args.export_name, path.display()),
            )
        }
        None => {
            let l = TcpListener::bind(&args.listen)
                .with_context(|| format!("listening on {}", args.listen))?;
            let addr = l.local_addr()?;
            (
                Listener::Tcp(l),
                format!("nbd://{addr}/{}", args.export_name),
            )
        }
    };
    let server = Server::new(store.block_device(), config);
    let control = args
        .control
        .clone()
        .or_else(|| args.socket.as_deref().map(control_path));
    let control_thread = match &control {
        Some(path) => {
            if path.exists() {
                bail!(
                    "{} exists; remove it if no server is using it",
                    path.display()
                );
            }
            let l = UnixListener::bind(path)
                .with_context(|| format!("binding the control socket {}", path.display()))?;
            let (store, server) = (Arc::clone(&store), Arc::clone(&server));
            Some(std::thread::spawn(move || serve_control(l, store, server)))
        }
        None => None,
    };

    // SIGINT and SIGTERM set a flag; a watcher stops the server, which answers what is in
    // flight and ends its connections.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    let watcher = {
        let (server, stop) = (Arc::clone(&server), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) && !server.is_stopping() {
                std::thread::sleep(Duration::from_millis(50));
            }
            server.stop();
        })
    };
    eprintln!("ztier serve: {} bytes, {what}, at {place}", args.size);
    let served = server.serve(listener);
    server.stop();
    let _ = watcher.join();
    if let Some(t) = control_thread {
        let _ = t.join();
    }
    for path in args.socket.iter().chain(control.iter()) {
        let _ = std::fs::remove_file(path);
    }
    served.context("serving")?;
    eprintln!("ztier serve: stopped");
    print!("{}", stats_text(&store, &server, false));
    Ok(())
}
