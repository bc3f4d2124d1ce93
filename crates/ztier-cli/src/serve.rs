//! `ztier serve`: a zram device served over NBD. Flags in, the wiring of device and server,
//! a log line per connection, and the device's statistics at shutdown.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use ztier_blockdev::memory::MemoryDevice;
use ztier_blockdev::BlockDevice;
use ztier_compress::Algorithm;
use ztier_nbd::{Client, Server, ServerConfig};
use ztier_pool::AllocatorKind;
use ztier_zram::{Device, Policy, PolicyConfig, StateFile};

use crate::classes::PoolLayoutArgs;
use crate::error::CliError;

mod config;
mod control;
mod frontends;
mod host;
mod promotion;
mod service;
mod store;

use crate::size::parse_size;
use control::{control_path, serve_control, stats_text};
pub use control::{ctl, stat, CtlArgs, StatArgs};
use frontends::Frontends;
use service::{
    bind_private, exit_code, listen, notify, start_command, status_line, RemovedAtEnd, SocketFiles,
};
use store::{backing_store, load_state, save_state};

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Disk size (K, M, G, T suffixes), a whole number of pages.
    #[arg(long, value_parser = parse_size, required_unless_present_any = ["devices", "config", "state_dir"])]
    pub size: Option<u64>,
    #[command(flatten)]
    pub host: host::HostArgs,
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
    /// The compression unit: 4K (the kernel's: a page an object, every figure the
    /// kernel's), or a power of two up to 64K such as 16K or 64K (a unit compressed as one
    /// object: denser, a read decompresses its unit; --size a whole number of units).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub unit: u64,
    /// Allocator under the device.
    #[arg(long, default_value = "zsmalloc")]
    pub allocator: AllocatorKind,
    #[command(flatten)]
    pub layout: PoolLayoutArgs,
    /// Memory the device may use (K, M, G suffixes): a write past it fails with ENOSPC. A
    /// page that does not fit is left as it was; of a write of several pages, those before
    /// it are written, as the kernel's zram does with a bio (NBD leaves a failed write's
    /// range undefined). 0: no limit.
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub mem_limit: u64,
    /// The export's name (clients may also ask for the default, "").
    #[arg(long, default_value = "")]
    pub export_name: String,
    /// Refuse writes, trims and zeroing.
    #[arg(long)]
    pub read_only: bool,
    /// Serve the disk to a virtual machine as vhost-user-blk on this Unix socket (QEMU's
    /// vhost-user-blk-pci, Cloud Hypervisor's --disk vhost_user=on, Firecracker's
    /// vhost-user drives, crosvm's --vhost-user block): the guest's virtio-blk queues are
    /// run here, in its shared memory. One VMM is served at a time. Alone, it is the only
    /// front end; with --socket or --listen, NBD is served too. `-` takes the socket
    /// systemd hands over (LISTEN_FDS: the only one, or the second after NBD's).
    #[arg(long, value_name = "PATH")]
    pub vhost_user_blk: Option<PathBuf>,
    /// The vhost-user-blk device's queues (each served by its own thread); the VMM may use
    /// fewer.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub vhost_queues: u16,
    /// What the vhost-user-blk device answers a guest asking for its serial (GET_ID: at most
    /// 20 bytes; /sys/block/vdX/serial in a Linux guest).
    #[arg(long, default_value = "ztier")]
    pub serial: String,
    /// Connections served at once; one more is turned away. Default: 16 for one device,
    /// 1024 for a host of devices (its guests together; `max_connections` in --config).
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// No log line per connection.
    #[arg(long)]
    pub quiet: bool,
    /// The backing store for writeback: a file (made, sparse, if missing) or an NBD export
    /// (nbd://HOST:PORT/NAME, nbd+unix:///NAME?socket=PATH; over TLS nbds://... or
    /// nbds+unix://... with tls-certificates=DIR, as libnbd takes them).
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
    #[command(flatten)]
    pub promotion: promotion::PromotionArgs,
    /// Policy: keep the pool (mem_used_total) under this, writing back the oldest pages.
    #[arg(long, value_parser = parse_size)]
    pub mem_target: Option<u64>,
    /// How often the policy runs.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "10s")]
    pub policy_interval: Duration,
    /// The control socket `ztier stat` reads the running device's statistics from. Default
    /// with --socket: that path with `.ctl` appended; with --listen: none.
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// How long a request to a remote backing store may wait before the store counts as
    /// lost; a lost store is dialed again by itself, with backoff, and checked to be the
    /// same store (its header's random id) before any page is read from it.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "30s")]
    pub backing_timeout: Duration,
    /// How long a client may take over its handshake before it is cut off (qemu-nbd's
    /// --handshake-limit). Handshakes under way do not count against --max-connections.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "10s")]
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
    /// NBD over TLS (NBD_OPT_STARTTLS), as nbdkit's --tls: off, on (for clients that ask)
    /// or require (TLS or nothing).
    #[arg(long, default_value = "off")]
    pub tls: ztier_nbd::TlsMode,
    /// The certificate directory, laid out as nbdkit's: server-cert.pem, server-key.pem, and
    /// ca-cert.pem to verify clients. Default: $HOME/.pki/nbdkit, or /etc/pki/nbdkit for root.
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// With TLS, accept only clients whose certificate the directory's CA signed.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Memory for request and reply buffers, for the whole server (K, M, G): no mix of
    /// clients holds more; a client past its share waits.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub max_in_flight: u64,
    /// Keep the device across restarts: its pages are saved to PATH when the server stops,
    /// and a state found at PATH when it starts is loaded, if it matches the disk's size
    /// and compressor (else the start fails and says why). PATH's directory must be
    /// writable. A loaded state is renamed PATH.loaded until the next clean stop (`ztier
    /// ctl save` writes PATH.loaded): a start that finds only PATH.loaded (the last server
    /// did not stop cleanly) is refused.
    #[arg(long, value_name = "PATH")]
    pub state: Option<PathBuf>,
    /// A client that reads none of its replies for this long is cut off.
    #[arg(long, value_parser = crate::size::parse_positive_duration, default_value = "30s")]
    pub reply_timeout: Duration,
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
    /// The device, its policy, the NBD client of its remote backing store, if any, and
    /// where its state is saved (`--state`).
    Zram(
        Arc<Device>,
        Option<Policy>,
        Option<Arc<Client>>,
        Option<PathBuf>,
    ),
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

/// The TLS `--tls` and `--tls-certificates` ask for.
fn server_tls(args: &ServeArgs) -> anyhow::Result<ztier_nbd::ServerTls> {
    if args.tls == ztier_nbd::TlsMode::Off {
        return Ok(ztier_nbd::ServerTls::off());
    }
    let dir = match &args.tls_certificates {
        Some(dir) => dir.clone(),
        None => ztier_nbd::ServerTls::default_dir().context(
            "--tls needs certificates: give --tls-certificates DIR (server-cert.pem, \
             server-key.pem; ca-cert.pem for --tls-verify-peer)",
        )?,
    };
    ztier_nbd::ServerTls::from_dir(args.tls, &dir, args.tls_verify_peer)
        .with_context(|| format!("loading TLS certificates from {}", dir.display()))
}

/// Connections a server of one device serves at once unless told.
const ONE_DEVICE_CONNECTIONS: usize = 16;

/// NBD's settings, from the flags (`description`: what the export is, for the default
/// export; a host's exports each say their own).
fn nbd_config(args: &ServeArgs, description: String) -> anyhow::Result<ServerConfig> {
    Ok(ServerConfig {
        export_name: args.export_name.clone(),
        description: Some(description),
        read_only: args.read_only,
        max_connections: args
            .max_connections
            .unwrap_or(ONE_DEVICE_CONNECTIONS)
            .max(1),
        min_block: 512,
        log: !args.quiet,
        handshake_limit: args.handshake_limit,
        max_in_flight_total: usize::try_from(args.max_in_flight).unwrap_or(usize::MAX),
        // A connection's own share: the whole budget's, up to the default 64 MiB.
        max_in_flight_bytes: usize::try_from(args.max_in_flight)
            .unwrap_or(usize::MAX)
            .min(64 << 20),
        reply_timeout: args.reply_timeout,
        tls: server_tls(args)?,
        ..ServerConfig::default()
    })
}

/// `ztier serve`; its exit status (0, or with --run the command's).
pub fn run(args: &ServeArgs) -> anyhow::Result<u8> {
    // First, before any thread starts: listenfd takes LISTEN_PID and LISTEN_FDS out of the
    // environment, so a --run command does not see them.
    let activated = listenfd::ListenFd::from_env();
    // A server's devices come and go: what one frees must leave the process with it.
    ztier_base::os::return_large_frees_to_the_os();
    let made_backing = args
        .backing_dev
        .as_deref()
        .filter(|b| !ztier_nbd::Uri::is_nbd_uri(b))
        .map(PathBuf::from)
        // Kept with a state, which names the pages on it.
        .filter(|p| !p.exists() && args.state.is_none());
    if args.host.is_host() {
        return host::serve_host(args, activated);
    }
    let r = serve(args, activated);
    if let Some(p) = made_backing {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn serve(args: &ServeArgs, activated: listenfd::ListenFd) -> anyhow::Result<u8> {
    // The parent to outlive, read before anything can make it exit unseen.
    let parent = rustix::process::getppid();
    if let Some(flag) = args.host.host_flag_given() {
        return Err(CliError::HostFlagWithoutHost { flag }.into());
    }
    if let Some(dir) = args.state.as_deref().and_then(std::path::Path::parent) {
        if !dir.as_os_str().is_empty() && !dir.is_dir() {
            return Err(CliError::DirMissing {
                path: args.state.clone().unwrap_or_default(),
                dir: dir.to_owned(),
                flag: "--state",
            }
            .into());
        }
    }
    let size = args
        .size
        .context("--size is needed (or --device for a host of devices)")?;
    // Said before anything is bound or made, with the flag that set it.
    let page_size = args.layout.config().page_size;
    if size == 0 || !size.is_multiple_of(page_size as u64) {
        return Err(CliError::NotWholePages {
            flag: "--size",
            bytes: size,
            page_size,
        }
        .into());
    }
    let mut state_loaded = false;
    let (store, what) = match args.store {
        StoreKind::Zram => {
            let unit = usize::try_from(args.unit).unwrap_or(usize::MAX);
            let layout = args.layout.config();
            // Units above a page need the allocator's classes up to the unit's size.
            let layout = if unit > layout.page_size {
                layout.with_max_object(unit)
            } else {
                layout
            };
            layout.validate().map_err(anyhow::Error::msg)?;
            let pool = args
                .allocator
                .make_pool(&layout)
                .map_err(anyhow::Error::msg)?;
            let device = Device::with_unit_size(size, args.compressor.clone(), pool, unit)
                .with_context(|| format!("--unit {}: making a {size}-byte device", args.unit))?;
            device.set_log(|line| eprintln!("ztier serve: {line}"));
            device.set_mem_limit(args.mem_limit);
            device.set_writeback_limit(args.writeback_limit);
            device.set_recomp_algorithms(args.recompress_algorithms.clone())?;
            // Before the policy starts: nothing but the load touches the pages meanwhile.
            let (loaded, mut link) = match &args.state {
                Some(path) => load_state(&device, path, args)?,
                None => (false, None),
            };
            state_loaded = loaded;
            if !loaded || (device.backing().is_none() && args.backing_dev.is_some()) {
                let (backing, made) = backing_store(args)?.unzip();
                device.set_backing(backing)?;
                link = made.flatten();
            }
            let policy = PolicyConfig {
                recompress_idle: args.recompress_idle,
                writeback_idle: args.writeback_idle,
                mem_target: args.mem_target,
                interval: args.policy_interval,
                promotion_target: args.promotion.target(),
            };
            if policy.recompress_idle.is_some() && args.recompress_algorithms.is_empty() {
                bail!("--recompress-idle needs a --recompress-algorithm");
            }
            if (policy.writeback_idle.is_some()
                || policy.mem_target.is_some()
                || policy.promotion_target.is_some())
                && args.backing_dev.is_none()
            {
                bail!("--writeback-idle, --promotion-target and --mem-target need a --backing-dev");
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
            (Store::Zram(device, policy, link, args.state.clone()), what)
        }
        StoreKind::Plain => {
            if args.mem_limit != 0 || args.backing_dev.is_some() || args.state.is_some() {
                bail!(
                    "--mem-limit, --backing-dev and --state are zram's: a plain RAM disk has \
                     none of them"
                );
            }
            let device = MemoryDevice::new(size)
                .with_context(|| format!("making a {size}-byte RAM disk"))?;
            let what = "a plain RAM disk (no compression)".to_string();
            (Store::Plain(Arc::new(device)), what)
        }
    };
    let store = Arc::new(store);
    let config = nbd_config(args, format!("ztier {what}"))?;
    // Before any socket exists: a signal sent as soon as one appears (a service manager's,
    // a test's) stops the server as one sent later does, where before the handlers it would
    // kill it with its socket files left behind.
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::new(Stopping::default());
    let files = SocketFiles::default();
    let made_files = RemovedAtEnd(files.clone());
    let fronts_slot: Arc<std::sync::OnceLock<Arc<Frontends>>> = Arc::default();
    watch_signals(
        Arc::clone(&stop),
        Arc::clone(&stopping),
        files.clone(),
        Arc::clone(&fronts_slot),
        args.state.clone().map(Saves::One),
    )?;
    raise_descriptor_limit();
    let places = listen(args, activated, &files)?;
    // Last, before a client is served: the state loaded (or the lack of one) is consumed, so
    // a server that dies from now on leaves no state that would serve stale pages.
    if let Some(path) = &args.state {
        StateFile::new(path)
            .consume(state_loaded)
            .with_context(|| format!("--state {}", path.display()))?;
    }
    let nbd = places
        .nbd
        .as_ref()
        .map(|_| Server::new(store.block_device(), config));
    let vhost = match &places.vhost {
        Some(_) => {
            let config = ztier_vhost::DeviceConfig {
                num_queues: args.vhost_queues,
                read_only: args.read_only,
                serial: args.serial.clone(),
                ..ztier_vhost::DeviceConfig::default()
            };
            let server = ztier_vhost::Server::new(store.block_device(), config)
                .context("making the vhost-user-blk server")?;
            server.set_log(!args.quiet);
            Some(server)
        }
        None => None,
    };
    let fronts = Arc::new(Frontends { nbd, vhost });
    let _ = fronts_slot.set(Arc::clone(&fronts));
    let control = args.control.clone().or_else(|| {
        args.socket
            .as_deref()
            .or(args
                .vhost_user_blk
                .as_deref()
                .filter(|p| *p != std::path::Path::new("-")))
            .map(control_path)
    });
    let stop_control = Arc::new(
        rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .context("making the control socket's stop eventfd")?,
    );
    let control_thread = match &control {
        Some(path) => {
            let l = bind_private(path, "--control", args.socket_mode, &files)
                .context("the control socket")?;
            l.set_nonblocking(true)?;
            let (store, fronts, stop) = (
                Arc::clone(&store),
                Arc::clone(&fronts),
                Arc::clone(&stop_control),
            );
            let answer: Arc<control::Answerer> = Arc::new(move |request, may_change| {
                control::answer_one_device(&store, &fronts, request, may_change)
            });
            let any = args.control_any_user;
            Some(std::thread::spawn(move || {
                serve_control(l, stop, answer, any)
            }))
        }
        None => None,
    };

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
    let at = places.describe();
    let status = status_line(&store, size, &at);
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    let command = match &args.run {
        Some(cmd) => Some(start_command(cmd, &places, &args.export_name)?),
        None => None,
    };
    let exit = Arc::new(std::sync::Mutex::new(None::<u8>));
    let watcher = {
        let (fronts, stop, store, exit) = (
            Arc::clone(&fronts),
            Arc::clone(&stop),
            Arc::clone(&store),
            Arc::clone(&exit),
        );
        let at = at.clone();
        let mut command = command;
        std::thread::spawn(move || {
            let mut ticks = 0u32;
            while !stop.load(Ordering::Relaxed) && !fronts.is_stopping() {
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
                    let status = status_line(&store, size, &at);
                    notify(&[sd_notify::NotifyState::Status(&status)]);
                }
            }
            notify(&[sd_notify::NotifyState::Stopping]);
            fronts.stop();
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
    eprintln!("ztier serve: {size} bytes, {what}, at {at}");
    let served = serve_all(&fronts, places);
    fronts.stop();
    stopping.set(Phase::Draining);
    let _ = watcher.join();
    let _ = rustix::io::write(stop_control.as_ref(), &1u64.to_ne_bytes());
    if let Some(t) = control_thread {
        let _ = t.join();
    }
    drop(made_files);
    let mut saved = Ok(());
    if let (Store::Zram(device, policy, _, Some(path)), Ok(())) = (&*store, &served) {
        // No writeback from here on (the policy's, or one a control request started is
        // waited for): the state saved is the store's as it stays.
        if let Some(p) = policy {
            p.stop();
        }
        device.close_writeback();
        stopping.set(Phase::Saving);
        match save_state(device, path, true) {
            Ok(line) => eprintln!("ztier serve: {line}"),
            Err(e) => {
                eprintln!(
                    "ztier serve: the state could not be saved, so the device's pages are \
                     lost: {e:#}"
                );
                saved = Err(e);
            }
        }
    }
    stopping.set(Phase::Done);
    served?;
    eprintln!("ztier serve: stopped");
    // In captive mode stdout is the command's: the statistics go to stderr.
    if args.run.is_some() {
        eprint!("{}", stats_text(&store, &fronts, false));
    } else {
        print!("{}", stats_text(&store, &fronts, false));
    }
    saved.context("saving the state")?;
    let code = *exit.lock().unwrap_or_else(|p| p.into_inner());
    Ok(code.unwrap_or(0))
}

/// Runs the front ends on their listeners until they stop: NBD on this thread and
/// vhost-user-blk on its own when there are both. The first to end (a stop, or an error)
/// stops the other; the first error is returned.
fn serve_all(fronts: &Frontends, places: service::Places) -> anyhow::Result<()> {
    let nbd = fronts.nbd.as_ref().zip(places.nbd);
    let vhost = fronts.vhost.as_ref().zip(places.vhost);
    let run_vhost = |server: &ztier_vhost::Server, place: service::VhostPlace| {
        let r = server
            .serve(place.listener)
            .context("serving vhost-user-blk");
        fronts.stop();
        r
    };
    match (nbd, vhost) {
        (Some((server, place)), vhost) => std::thread::scope(|s| {
            let vhost = vhost.map(|(v, place)| s.spawn(move || run_vhost(v, place)));
            let r = server.serve(place.listener).context("serving NBD");
            fronts.stop();
            let v = vhost.map_or(Ok(()), |t| t.join().unwrap_or(Ok(())));
            r.and(v)
        }),
        (None, Some((v, place))) => run_vhost(v, place),
        (None, None) => Ok(()),
    }
}

/// Where a stop is, for the signals that come during it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// Serving (or stopping: the first signal came, clients are being let go).
    #[default]
    Serving,
    /// The connections are ending; the state is saved next.
    Draining,
    /// The state is being written.
    Saving,
    /// Saved (or nothing to save): only the statistics are left to print.
    Done,
}

/// The stop's phase, shared with the signal thread.
#[derive(Default)]
struct Stopping(std::sync::Mutex<Phase>);

impl Stopping {
    fn set(&self, phase: Phase) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }
    fn get(&self) -> Phase {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// SIGINT and SIGTERM, on a thread of their own. The first stops the server: it answers what
/// is in flight, ends its connections, saves its state. The second cuts the connections at
/// once but still saves the state (GNU `timeout` sends its signal twice, to the process and
/// to its group: a stop must not lose the state to that). A third during the save ends the
/// process without it: the unfinished file is removed and a line says the state was not
/// saved; a third before the save ends it the same way.
fn watch_signals(
    stop: Arc<AtomicBool>,
    stopping: Arc<Stopping>,
    files: SocketFiles,
    fronts: Arc<std::sync::OnceLock<Arc<Frontends>>>,
    state: Option<Saves>,
) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("ztier-signals".into())
        .spawn(move || {
            let mut count = 0;
            for sig in signals.forever() {
                count += 1;
                let name = if sig == SIGINT { "SIGINT" } else { "SIGTERM" };
                let phase = stopping.get();
                match count {
                    1 => stop.store(true, Ordering::SeqCst),
                    2 => {
                        let line = match (phase, &state) {
                            (Phase::Saving, Some(_)) => {
                                "the state is being saved; the save goes on (a third signal \
                                 ends the process without it)"
                            }
                            (_, Some(_)) => {
                                "connections are cut now; the state is still saved (a third \
                                 signal ends the process without it)"
                            }
                            (_, None) => {
                                "connections are cut now (a third signal ends the process)"
                            }
                        };
                        eprintln!("ztier serve: a second {name}: {line}");
                        stop.store(true, Ordering::SeqCst);
                        if let Some(s) = fronts.get() {
                            s.stop_now();
                        }
                    }
                    _ => {
                        let lost = match (&state, phase) {
                            (Some(saves), Phase::Serving | Phase::Draining | Phase::Saving) => {
                                saves.remove_unfinished();
                                format!(
                                    "; the state was NOT saved to {} (what the server took \
                                     since it started is lost; the next start refuses the \
                                     consumed state and says so)",
                                    saves.shown().display()
                                )
                            }
                            _ => String::new(),
                        };
                        eprintln!("ztier serve: a third {name}: ended at once{lost}");
                        files.remove_all();
                        std::process::exit(1);
                    }
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Where a stop saves: one device's `--state`, or a host's `--state-dir` (a state per
/// device).
enum Saves {
    One(PathBuf),
    Dir(PathBuf),
}

impl Saves {
    fn shown(&self) -> &std::path::Path {
        match self {
            Saves::One(p) | Saves::Dir(p) => p,
        }
    }

    /// Removes the unfinished file of a save under way (each device's, of a host).
    fn remove_unfinished(&self) {
        match self {
            Saves::One(path) => StateFile::new(path).remove_unfinished_save(),
            // Each device's save under way is NAME.state.tmp (its state may be consumed:
            // NAME.state.loaded, no NAME.state).
            Saves::Dir(dir) => {
                for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    if let Some(device) = name.strip_suffix(".state.tmp") {
                        StateFile::new(dir.join(format!("{device}.state")))
                            .remove_unfinished_save();
                    }
                }
            }
        }
    }
}

/// Raises the soft limit of open files to the hard one, as servers of many connections do:
/// each connection costs a descriptor. Best effort: a limit that cannot be raised stays.
fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}
