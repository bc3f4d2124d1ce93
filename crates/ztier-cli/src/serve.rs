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
use ztier_zram::Device;

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
    Zram(Arc<Device>),
    Plain(Arc<MemoryDevice>),
}

impl Store {
    fn block_device(&self) -> Arc<dyn BlockDevice> {
        match self {
            Store::Zram(d) => Arc::clone(d) as Arc<dyn BlockDevice>,
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

fn control_path(socket: &std::path::Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".ctl");
    PathBuf::from(p)
}

/// Asks a running server for its statistics and prints them.
pub fn stat(args: &StatArgs) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let path = match (&args.control, &args.socket) {
        (Some(c), _) => c.clone(),
        (None, Some(s)) => control_path(s),
        (None, None) => bail!("give --socket or --control"),
    };
    let mut conn = std::os::unix::net::UnixStream::connect(&path)
        .with_context(|| format!("connecting to {} (is ztier serve running?)", path.display()))?;
    conn.write_all(if args.json { b"stat json\n" } else { b"stat\n" })?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    print!("{answer}");
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
            Store::Zram(device) => serde_json::json!({
                "mm_stat": device.mm_stat(),
                "io_stat": device.io_stat(),
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
        Store::Zram(device) => format!(
            "mm_stat {}\nio_stat {}\n{server}{}",
            device.mm_stat(),
            device.io_stat(),
            device.allocator_stats()
        ),
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
        if reader.by_ref().take(64).read_line(&mut line).is_err() {
            continue;
        }
        let answer = match line.trim() {
            "stat" => stats_text(&store, &server, false),
            "stat json" => stats_text(&store, &server, true),
            other => format!("error: unknown request '{other}' (stat, stat json)\n"),
        };
        let _ = (&conn).write_all(answer.as_bytes());
    }
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
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
            let what = format!("zram, {} on {}", args.compressor, args.allocator);
            (Store::Zram(Arc::new(device)), what)
        }
        StoreKind::Plain => {
            if args.mem_limit != 0 {
                bail!("--mem-limit is zram's: a plain RAM disk has none");
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
