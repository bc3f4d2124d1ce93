//! `ztier serve --device SPEC ... | --config FILE`: one server as the host of many devices.
//! The devices, their states and the memory budget are `ztier_host`'s; this module wires
//! each device to its front ends (an NBD export by its name, a vhost-user-blk socket
//! `DIR/NAME.sock`), answers the control socket's host requests (`devices`, `create`,
//! `destroy`, a device's `stat`, `get` and `set`), serves the metrics, and reads the config
//! file.
//!
//! Invariants: a device is served by a front end only while it is in the host's table (a
//! vhost-user socket is made after the device and removed before it is destroyed); a
//! device a client holds is destroyed only when forced, its clients cut off first.
//!
//! Locks, outer first: `Hosted::changing` (one create or destroy at a time, so a name is
//! never half made while it is ended), `Hosted::vhost` (the sockets' table, held to add,
//! take out or read one, never across a server's stop or a device's work), then the host's
//! own (`ztier_host`'s header). The metrics and `stat` read without `changing`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ztier_host::metrics::{FrontFigures, MetricsEndpoint};
use ztier_host::{DeviceSpec, Host, HostDevice};

use crate::size::{parse_positive_duration, parse_size};

use super::config::settings;
use super::control::{self, Answerer, ServerCounts, Snapshot, VhostCounts, NOT_THE_OWNER};
use super::frontends::Frontends;
use super::service::{bind_private, listen, notify, RemovedAtEnd, SocketFiles};
use super::{ServeArgs, Stopping};
use crate::error::CliError;

/// The flags of a host of devices (any of `--device`, `--config` or `--state-dir` makes
/// `ztier serve` one).
#[derive(Args, Debug, Clone, Default)]
pub struct HostArgs {
    /// A device of the host: `NAME,size=64G[,compressor=lz4,allocator=zblock,mem_limit=2G,
    /// mem_low=256M,store_limit=8G,writeback_idle=10m,read_only=true,serial=...]`; repeat for more. Each is
    /// an NBD export by its name and, with --vhost-user-dir, a vhost-user-blk socket.
    #[arg(long = "device", value_name = "SPEC", conflicts_with_all = HOST_ONLY)]
    pub devices: Vec<DeviceSpec>,
    /// The host's devices and settings in a TOML file: a `[host]` table (target, limit,
    /// interval, state_dir, store_dir, shared_store, shared_store_size, vhost_user_dir, socket,
    /// listen, control, metrics, max_connections)
    /// and a `[[device]]` table per device (the keys of --device). Flags win over it.
    #[arg(long, value_name = "FILE", conflicts_with_all = HOST_ONLY)]
    pub config: Option<PathBuf>,
    /// Keep every device across restarts: each device's spec and state in DIR (NAME.spec,
    /// NAME.state), saved at a stop and made again at the next start.
    #[arg(long, value_name = "DIR", conflicts_with_all = HOST_ONLY)]
    pub state_dir: Option<PathBuf>,
    /// Each device's backing store for writeback: DIR/NAME.store (sparse, private, removed
    /// with the device). Needed by --host-target and by a device's writeback.
    #[arg(long, value_name = "DIR")]
    pub store_dir: Option<PathBuf>,
    /// Or one backing store for every device: a file (made sparse and private at
    /// --shared-store-size if missing) or an NBD export (nbd://HOST:PORT/NAME,
    /// nbd+unix:///NAME?socket=PATH). Each device's written-back pages go to 1 MiB extents
    /// of its own, never read by another device and given back when it is destroyed; with
    /// --state-dir they are kept across restarts.
    #[arg(long, value_name = "PATH|URI", conflicts_with = "store_dir")]
    pub shared_store: Option<String>,
    /// The --shared-store file's size when ztier makes it (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub shared_store_size: Option<u64>,
    /// Keep the devices' pools together under this (K, M, G): the coldest pages across all
    /// devices are written back first, a device's mem_low protected while another is above
    /// its own.
    #[arg(long, value_parser = parse_size)]
    pub host_target: Option<u64>,
    /// No write takes the devices' pools together past this (ENOSPC on the write that
    /// would). 0: none.
    #[arg(long, value_parser = parse_size)]
    pub host_limit: Option<u64>,
    /// How often the host's budget looks at its target.
    #[arg(long, value_parser = parse_positive_duration)]
    pub budget_interval: Option<Duration>,
    /// Serve each device to a VMM as vhost-user-blk on DIR/NAME.sock.
    #[arg(long, value_name = "DIR")]
    pub vhost_user_dir: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR:PORT/metrics (PORT alone: 127.0.0.1).
    #[arg(long, value_name = "[ADDR:]PORT")]
    pub metrics: Option<String>,
}

/// Flags of one device's server that a host's devices take from their specs instead.
const HOST_ONLY: [&str; 9] = [
    "size",
    "state",
    "backing_dev",
    "vhost_user_blk",
    "run",
    "mem_target",
    "writeback_idle",
    "promotion_target",
    "recompress_idle",
];

impl HostArgs {
    /// The first flag given that only a host of devices uses (`--shared-store`,
    /// `--metrics`, ...), for a server of one device to refuse rather than pass by.
    pub(super) fn host_flag_given(&self) -> Option<&'static str> {
        [
            ("--store-dir", self.store_dir.is_some()),
            ("--shared-store", self.shared_store.is_some()),
            ("--shared-store-size", self.shared_store_size.is_some()),
            ("--host-target", self.host_target.is_some()),
            ("--host-limit", self.host_limit.is_some()),
            ("--budget-interval", self.budget_interval.is_some()),
            ("--vhost-user-dir", self.vhost_user_dir.is_some()),
            ("--metrics", self.metrics.is_some()),
        ]
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
    }

    pub(super) fn is_host(&self) -> bool {
        !self.devices.is_empty() || self.config.is_some() || self.state_dir.is_some()
    }
}

/// A directory made private (0700) if missing; one that exists is used as it is.
fn private_dir(path: &Path, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if path.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .with_context(|| format!("making {what} {}", path.display()))
}

/// A device's vhost-user-blk server and the thread that runs it.
struct VhostFront {
    server: Arc<ztier_vhost::Server>,
    path: PathBuf,
    thread: std::thread::JoinHandle<()>,
}

/// The host and its front ends.
pub(super) struct Hosted {
    host: Arc<Host>,
    nbd: Option<Arc<ztier_nbd::Server>>,
    exports: Arc<HostExports>,
    vhost_dir: Option<PathBuf>,
    vhost: Mutex<BTreeMap<String, VhostFront>>,
    changing: Mutex<()>,
    files: SocketFiles,
    socket_mode: u32,
    vhost_queues: u16,
    quiet: bool,
}

impl Hosted {
    /// Makes a device and its vhost-user socket (its NBD export is found by name).
    fn create(&self, spec: DeviceSpec) -> anyhow::Result<Arc<HostDevice>> {
        let _changing = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        let name = spec.name.clone();
        let device = self
            .host
            .create(spec)
            .with_context(|| format!("making device {name}"))?;
        if let Err(e) = self.serve_vhost(&device) {
            // Out of the table, its files kept: a start that fails here loses nothing the
            // last run saved.
            self.host.abandon(&name);
            return Err(e);
        }
        Ok(device)
    }

    fn serve_vhost(&self, device: &HostDevice) -> anyhow::Result<()> {
        let Some(dir) = &self.vhost_dir else {
            return Ok(());
        };
        let path = dir.join(format!("{}.sock", device.name()));
        let listener = bind_private(&path, "--vhost-user-dir", self.socket_mode, &self.files)
            .with_context(|| format!("device {}'s vhost-user-blk socket", device.name()))?;
        let spec = device.spec();
        let config = ztier_vhost::DeviceConfig {
            num_queues: self.vhost_queues,
            read_only: spec.read_only,
            serial: spec.serial().to_string(),
            ..ztier_vhost::DeviceConfig::default()
        };
        let server = ztier_vhost::Server::new(device.block_device(), config)
            .context("making a vhost-user-blk server")?;
        server.set_log(!self.quiet);
        let running = Arc::clone(&server);
        let name = device.name().to_string();
        let thread = std::thread::Builder::new()
            .name(format!("vhost-{name}"))
            .spawn(move || {
                if let Err(e) = running.serve(listener) {
                    eprintln!("ztier serve: device {name}'s vhost-user-blk server ended: {e}");
                }
            })
            .context("starting a vhost-user-blk thread")?;
        self.vhost.lock().unwrap_or_else(|p| p.into_inner()).insert(
            device.name().to_string(),
            VhostFront {
                server,
                path,
                thread,
            },
        );
        Ok(())
    }

    /// Who holds a device: NBD connections to its export, and whether a VMM is attached.
    fn holders(&self, name: &str) -> (usize, bool) {
        let nbd = self.nbd.as_ref().map_or(0, |s| s.connections_to(name));
        let vmm = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .is_some_and(|v| v.server.is_attached());
        (nbd, vmm)
    }

    /// Closes a device to new clients (NBD handshakes and VMMs are turned away) and says who
    /// holds it now: nobody can take it after this count and be cut off unseen.
    fn close(&self, name: &str) -> (usize, bool) {
        let opened = self.exports.close(name);
        let vmm = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .is_some_and(|v| v.server.close());
        let (nbd, _) = self.holders(name);
        (if opened { nbd.max(1) } else { nbd }, vmm)
    }

    /// Serves a device closed by [`close`](Self::close) again.
    fn reopen(&self, name: &str) {
        self.exports.reopen(name);
        if let Some(v) = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            v.server.reopen();
        }
    }

    /// Ends a device: refused while a client holds it, unless `force` (its clients are cut
    /// off first). Its memory, state, spec and store go.
    fn destroy(&self, name: &str, force: bool) -> anyhow::Result<String> {
        let _changing = self.changing.lock().unwrap_or_else(|p| p.into_inner());
        if self.host.get(name).is_none() {
            bail!("no device named {name}");
        }
        // Closed to new clients first, so what is counted is all that holds it.
        let (nbd, vmm) = self.close(name);
        if (nbd > 0 || vmm) && !force {
            self.reopen(name);
            let mut held = Vec::new();
            if nbd > 0 {
                held.push(format!(
                    "{nbd} NBD connection{}",
                    if nbd == 1 { "" } else { "s" }
                ));
            }
            if vmm {
                held.push("a VMM over vhost-user-blk".to_string());
            }
            bail!(
                "device {name} is held by {}: disconnect first, or `destroy {name} force` to \
                 cut them off",
                held.join(" and ")
            );
        }
        // Out of the table first: from now on no handshake finds it. Then its NBD clients
        // are let go (a handshake half way in is turned away too), then its VMM.
        let gone = match self.host.destroy(name) {
            Ok(gone) => gone,
            Err(e) => {
                self.reopen(name);
                return Err(e.into());
            }
        };
        self.exports.forget(name);
        if let Some(s) = &self.nbd {
            s.disconnect_export(name);
        }
        let front = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        if let Some(v) = front {
            v.server.stop();
            let _ = v.thread.join();
            let _ = std::fs::remove_file(&v.path);
        }
        let freed = gone.device().mm_stat().mem_used_total;
        // Its last holder, unless a connection is still finishing: the heap its tables and
        // buffers held goes back to the OS, not only to the allocator.
        drop(gone);
        ztier_base::os::give_freed_heap_back();
        Ok(format!(
            "destroyed {name}: {freed} bytes of pool given back{}",
            if nbd > 0 || vmm {
                ", its clients cut off"
            } else {
                ""
            }
        ))
    }

    /// Stops every vhost-user server (each finishes the request in hand) and NBD.
    fn stop_fronts(&self) {
        if let Some(s) = &self.nbd {
            s.stop();
        }
        let fronts: Vec<VhostFront> =
            std::mem::take(&mut *self.vhost.lock().unwrap_or_else(|p| p.into_inner()))
                .into_values()
                .collect();
        for v in &fronts {
            v.server.stop();
        }
        for v in fronts {
            let _ = v.thread.join();
        }
    }

    fn front_figures(&self) -> Vec<FrontFigures> {
        let mut figures = Vec::new();
        for d in self.host.devices() {
            let name = d.name();
            if let Some(e) = self.nbd.as_ref().and_then(|s| s.stats_for(name)) {
                figures.push(FrontFigures {
                    device: name.to_string(),
                    front: "nbd",
                    live_connections: e.live_connections,
                    connections: e.connections,
                    requests: e.requests,
                    errors: e.errors,
                    bytes_read: Some(e.bytes_read),
                    bytes_written: Some(e.bytes_written),
                });
            }
        }
        for (name, v) in self.vhost.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let c = VhostCounts::of(&v.server);
            figures.push(FrontFigures {
                device: name.clone(),
                front: "vhost_user_blk",
                live_connections: u64::from(v.server.is_attached()),
                connections: c.connections,
                requests: c.requests,
                errors: c.device_errors + c.refused,
                bytes_read: None,
                bytes_written: None,
            });
        }
        figures
    }

    /// One device's `stat` snapshot.
    fn snapshot(&self, device: &HostDevice) -> Snapshot {
        let name = device.name();
        let vhost = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .map(|v| VhostCounts::of(&v.server));
        let server = self
            .nbd
            .as_ref()
            .and_then(|s| s.stats_for(name))
            .map(|e| ServerCounts::of_export(&e));
        Snapshot::of_device(device.device(), device.policy_stats(), server, vhost)
    }

    /// The host's line: its devices, their pools' sum against the limit and target.
    fn host_line(&self) -> String {
        let group = self.host.group();
        let config = self.host.config();
        let budget = self.host.budget_stats();
        let mut line = format!(
            "host {} devices, {} bytes of pool (limit {}, target {})",
            self.host.devices().len(),
            group.used_bytes(),
            group.limit_bytes(),
            config.target.unwrap_or(0)
        );
        if let Some(b) = budget {
            line += &format!(
                ", budget: {} ticks, {} pages written back ({} under protection), {} errors",
                b.ticks, b.written_back_pages, b.protected_pages_taken, b.errors
            );
        }
        line.push('\n');
        line
    }

    fn stat(&self, json: bool) -> String {
        let devices = self.host.devices();
        if json {
            let by_name: BTreeMap<String, Snapshot> = devices
                .iter()
                .map(|d| (d.name().to_string(), self.snapshot(d)))
                .collect();
            let unix_time = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let host = serde_json::json!({
                "unix_time": unix_time,
                "devices": devices.len(),
                "mem_used_bytes": self.host.group().used_bytes(),
                "mem_limit_bytes": self.host.group().limit_bytes(),
                "mem_target_bytes": self.host.config().target.unwrap_or(0),
                "budget": self.host.budget_stats(),
            });
            let all = serde_json::json!({ "host": host, "devices": by_name });
            return format!("{all}\n");
        }
        let mut text = self.host_line();
        for d in &devices {
            text += &format!("device {}\n{}", d.name(), self.snapshot(d).brief());
        }
        text
    }

    fn list(&self) -> String {
        let mut text = String::new();
        for d in self.host.devices() {
            let (nbd, vmm) = self.holders(d.name());
            let (m, spec) = (d.device().mm_stat(), d.spec());
            text += &format!(
                "{} size={} compressor={} mem_used_total={} orig_data_size={} mem_limit={} \
                 mem_low={} store_limit={} nbd_connections={nbd} vmm={}\n",
                d.name(),
                spec.size,
                spec.compressor,
                m.mem_used_total,
                m.orig_data_size,
                spec.mem_limit,
                spec.mem_low,
                spec.store_limit,
                if vmm { "attached" } else { "none" }
            );
        }
        text
    }

    /// A control request to the host.
    fn answer(&self, request: &str, may_change: bool) -> String {
        let words: Vec<&str> = request.split_whitespace().collect();
        let changes = matches!(words.first(), Some(&"create" | &"destroy"))
            || (words.first() == Some(&"device") && words.get(2) == Some(&"set"));
        if changes && !may_change {
            return NOT_THE_OWNER.to_string();
        }
        let r: anyhow::Result<String> = match words.as_slice() {
            ["stat"] => Ok(self.stat(false)),
            ["stat", "json"] => Ok(self.stat(true)),
            ["devices"] => Ok(self.list()),
            ["create", name, pairs @ ..] => self.create_from_words(name, pairs),
            ["destroy", name] => self.destroy(name, false),
            ["destroy", name, "force"] => self.destroy(name, true),
            ["device", name, rest @ ..] => self.device_request(name, rest),
            _ => Err(anyhow::anyhow!(
                "unknown request '{request}' (stat, stat json, devices, create NAME \
                 size=SIZE ..., destroy NAME [force], device NAME stat|get ATTR|set ATTR \
                 VALUE)"
            )),
        };
        match r {
            Ok(text) if text.ends_with('\n') || text.is_empty() => text,
            Ok(text) => format!("{text}\n"),
            Err(e) => format!("error: {e:#}\n"),
        }
    }

    fn create_from_words(&self, name: &str, words: &[&str]) -> anyhow::Result<String> {
        let mut pairs = Vec::new();
        for w in words
            .iter()
            .flat_map(|w| w.split(','))
            .filter(|w| !w.is_empty())
        {
            let pair = w
                .split_once('=')
                .with_context(|| format!("{w:?} is not key=value"))?;
            pairs.push(pair);
        }
        let spec = DeviceSpec::from_pairs(Some(name), pairs)?;
        let device = self.create(spec)?;
        device.consume_state()?;
        Ok(format!("created {}\n", self.where_served(&device)))
    }

    /// A device and where its clients find it.
    fn where_served(&self, d: &HostDevice) -> String {
        let spec = d.spec();
        let mut at = vec![format!(
            "{} ({} bytes, {} on {})",
            d.name(),
            spec.size,
            spec.compressor,
            spec.allocator
        )];
        if self.nbd.is_some() {
            at.push(format!("NBD export {}", d.name()));
        }
        if let Some(v) = self
            .vhost
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(d.name())
        {
            at.push(format!("vhost-user-blk at {}", v.path.display()));
        }
        at.join(", ")
    }

    fn device_request(&self, name: &str, words: &[&str]) -> anyhow::Result<String> {
        let d = self
            .host
            .get(name)
            .with_context(|| format!("no device named {name}"))?;
        let device = d.device();
        match words {
            ["stat"] => Ok(self.snapshot(&d).to_string()),
            ["stat", "json"] => Ok(format!("{}\n", serde_json::to_string(&self.snapshot(&d))?)),
            ["get", "mem_low"] => Ok(format!("{}\n", d.mem_low())),
            ["get", "store_limit"] => Ok(format!("{}\n", d.spec().store_limit)),
            ["get", attr] => Ok(device.show_attr(attr)?),
            ["set", "save"] => match d.save_state(false) {
                None => bail!("the host keeps no states (start it with --state-dir DIR)"),
                Some(r) => {
                    let s = r?;
                    Ok(format!(
                        "state of {name} saved: {} pages ({} on the backing store), {} bytes",
                        s.pages, s.from_backing_store, s.bytes
                    ))
                }
            },
            ["set", attr, value @ ..] => Ok(self.host.set(name, attr, &value.join(" "))?),
            _ => bail!("device {name}: stat, stat json, get ATTR or set ATTR VALUE"),
        }
    }
}

/// Where `--metrics` listens: `PORT` alone is loopback's.
fn metrics_listener(spec: &str) -> anyhow::Result<TcpListener> {
    let addr = if spec.parse::<u16>().is_ok() {
        format!("127.0.0.1:{spec}")
    } else {
        spec.to_string()
    };
    let l = TcpListener::bind(&addr).map_err(|e| CliError::bind(&addr, "--metrics", e))?;
    if !l.local_addr()?.ip().is_loopback() {
        eprintln!(
            "ztier serve: the metrics are served beyond this machine, at {}: anyone who \
             reaches it reads every device's figures",
            l.local_addr()?
        );
    }
    Ok(l)
}

/// `ztier serve` as a host of devices; its exit status.
pub(super) fn serve_host(args: &ServeArgs, activated: listenfd::ListenFd) -> anyhow::Result<u8> {
    let settings = settings(args)?;
    let args = &settings.args;
    for (dir, what) in [
        (&settings.host.state_dir, "--state-dir"),
        (&settings.host.store_dir, "--store-dir"),
        (&settings.vhost_dir, "--vhost-user-dir"),
    ] {
        if let Some(d) = dir {
            private_dir(d, what)?;
        }
    }
    // The devices the last run kept (their specs in the state directory), then the flags'
    // and the config's: a name in both is the flags' (its state must still fit it).
    let mut specs: BTreeMap<String, DeviceSpec> = BTreeMap::new();
    if let Some(dir) = &settings.host.state_dir {
        for s in Host::saved_specs(dir)? {
            specs.insert(s.name.clone(), s);
        }
    }
    for s in settings.specs {
        // The flags and the config describe the device; limits set at runtime (saved in its
        // spec) are runtime's, as sysctl's and a cgroup's are: said, then replaced.
        if let Some(saved) = specs.get(&s.name) {
            for (key, was, now) in [
                ("mem_limit", saved.mem_limit, s.mem_limit),
                ("mem_low", saved.mem_low, s.mem_low),
                ("store_limit", saved.store_limit, s.store_limit),
            ] {
                if was != now {
                    eprintln!(
                        "ztier serve: device {}: {key}={now} from the flags or config replaces \
                         {key}={was} of its last run (set at runtime); `ztier ctl --device {} \
                         {key} VALUE` changes it again",
                        s.name, s.name
                    );
                }
            }
        }
        specs.insert(s.name.clone(), s);
    }
    let mut host_config = settings.host.clone();
    if let Some((store, size)) = &settings.shared_store {
        host_config.shared_store = Some(super::store::open_shared_store(
            &settings.args,
            store,
            *size,
        )?);
    }
    let host = Host::new(host_config).context("starting the host")?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::new(Stopping::default());
    let files = SocketFiles::default();
    let made_files = RemovedAtEnd(files.clone());
    let fronts_slot: Arc<std::sync::OnceLock<Arc<Frontends>>> = Arc::default();
    super::watch_signals(
        Arc::clone(&stop),
        Arc::clone(&stopping),
        files.clone(),
        Arc::clone(&fronts_slot),
        settings.host.state_dir.clone().map(super::Saves::Dir),
    )?;
    super::raise_descriptor_limit();
    let wants_nbd = args.socket.is_some()
        || args.listen.is_some()
        || activated.len() > 0
        || settings.vhost_dir.is_none();
    let places = if wants_nbd {
        Some(listen(args, activated, &files)?)
    } else {
        None
    };
    let exports = Arc::new(HostExports::new(Arc::clone(&host)));
    let nbd = match places.as_ref().and_then(|p| p.nbd.as_ref()) {
        Some(_) => Some(ztier_nbd::Server::with_exports(
            Arc::clone(&exports) as Arc<dyn ztier_nbd::Exports>,
            super::nbd_config(args, String::new())?,
        )),
        None => None,
    };
    let hosted = Arc::new(Hosted {
        host: Arc::clone(&host),
        nbd: nbd.clone(),
        exports,
        vhost_dir: settings.vhost_dir.clone(),
        vhost: Mutex::new(BTreeMap::new()),
        changing: Mutex::new(()),
        files: files.clone(),
        socket_mode: args.socket_mode,
        vhost_queues: args.vhost_queues,
        quiet: args.quiet,
    });
    for (_, spec) in specs {
        let d = hosted.create(spec)?;
        eprintln!(
            "ztier serve: device {}{}",
            hosted.where_served(&d),
            if d.state_loaded() {
                ", its state loaded"
            } else {
                ""
            }
        );
    }
    let _ = fronts_slot.set(Arc::new(Frontends {
        nbd: nbd.clone(),
        vhost: None,
    }));
    let control_path = args.control.clone().or_else(|| {
        args.socket
            .as_deref()
            .map(super::control_path)
            .or_else(|| settings.vhost_dir.as_ref().map(|d| d.join("ztier.ctl")))
    });
    let stop_control = Arc::new(
        rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .context("making the control socket's stop eventfd")?,
    );
    let control_thread = match &control_path {
        Some(path) => {
            let l = bind_private(path, "--control", args.socket_mode, &files)
                .context("the control socket")?;
            l.set_nonblocking(true)?;
            let on = Arc::clone(&hosted);
            let answer: Arc<Answerer> = Arc::new(move |request, may| on.answer(request, may));
            let stop = Arc::clone(&stop_control);
            let any = args.control_any_user;
            Some(std::thread::spawn(move || {
                control::serve_control(l, stop, answer, any)
            }))
        }
        None => None,
    };
    let mut metrics = match &settings.metrics {
        Some(spec) => {
            let on = Arc::clone(&hosted);
            let figures =
                Arc::new(move || ztier_host::metrics::exposition(&on.host, &on.front_figures()));
            let endpoint = MetricsEndpoint::start(metrics_listener(spec)?, figures)
                .context("starting the metrics endpoint")?;
            eprintln!(
                "ztier serve: metrics at http://{}/metrics",
                endpoint.local_addr()
            );
            Some(endpoint)
        }
        None => None,
    };
    if let Some(path) = &args.pidfile {
        std::fs::write(path, format!("{}\n", std::process::id()))
            .with_context(|| format!("writing the pid file {}", path.display()))?;
    }
    // Last before a client is served (every socket and file made, so a start that fails
    // before here leaves the states as they were): each loaded state is consumed (a server that dies from
    // now on leaves no state that would serve stale pages).
    for d in host.devices() {
        d.consume_state()?;
    }
    let mut at = Vec::new();
    if let Some(p) = places.as_ref().and_then(|p| p.nbd.as_ref()) {
        at.push(format!("NBD at {}", p.uri));
    }
    if let Some(d) = &settings.vhost_dir {
        at.push(format!("vhost-user-blk in {}", d.display()));
    }
    if let Some(c) = &control_path {
        at.push(format!("control {}", c.display()));
    }
    let status = format!(
        "a host of {} devices, {}",
        host.devices().len(),
        at.join(", ")
    );
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
    eprintln!("ztier serve: {status}");
    let served = match (nbd.as_ref(), places.and_then(|p| p.nbd)) {
        (Some(server), Some(place)) => {
            let watch = {
                let (stop, server) = (Arc::clone(&stop), Arc::clone(server));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) && !server.is_stopping() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    server.stop();
                })
            };
            let r = server.serve(place.listener).context("serving NBD");
            stop.store(true, Ordering::SeqCst);
            let _ = watch.join();
            r
        }
        _ => {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        }
    };
    notify(&[sd_notify::NotifyState::Stopping]);
    stopping.set(super::Phase::Draining);
    hosted.stop_fronts();
    let _ = rustix::io::write(stop_control.as_ref(), &1u64.to_ne_bytes());
    if let Some(t) = control_thread {
        let _ = t.join();
    }
    if let Some(m) = metrics.as_mut() {
        m.stop();
    }
    drop(made_files);
    stopping.set(super::Phase::Saving);
    let mut failed = 0;
    for (name, saved) in host.stop_and_save() {
        match saved {
            Ok(s) => eprintln!(
                "ztier serve: device {name}'s state saved: {} pages ({} on the backing \
                 store), {} bytes",
                s.pages, s.from_backing_store, s.bytes
            ),
            Err(e) => {
                failed += 1;
                eprintln!("ztier serve: device {name}'s state could not be saved: {e}");
            }
        }
    }
    stopping.set(super::Phase::Done);
    served?;
    eprintln!("ztier serve: stopped");
    print!("{}", hosted.stat(false));
    if failed > 0 {
        bail!("{failed} device states could not be saved: their pages are lost");
    }
    Ok(0)
}

/// An export's description, as `NBD_OPT_INFO` and `NBD_OPT_LIST` give it.
fn description(spec: &DeviceSpec) -> String {
    format!("ztier zram, {} on {}", spec.compressor, spec.allocator)
}

/// The host's devices as NBD exports, by name; each export's counters kept while its
/// device lives (a connection's and the next one's count together). A device being
/// destroyed is closed first: no export of it is opened from then on.
struct HostExports {
    host: Arc<Host>,
    state: Mutex<ExportState>,
}

#[derive(Default)]
struct ExportState {
    /// Each export's counters; every export opened (a connection, or a handshake about to
    /// be one) holds a clone while it lives.
    counters: BTreeMap<String, Arc<ztier_nbd::ExportStats>>,
    /// Devices being destroyed: refused to new handshakes.
    closing: BTreeSet<String>,
}

impl HostExports {
    fn new(host: Arc<Host>) -> HostExports {
        HostExports {
            host,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ExportState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Refuses `name` to every handshake from now on; true if an export of it opened before
    /// still lives (held by a connection, or by a handshake that will be one). Under the
    /// lock `open` takes, so no handshake slips between the look and the close.
    fn close(&self, name: &str) -> bool {
        let mut s = self.state();
        s.closing.insert(name.to_string());
        s.counters
            .get(name)
            .is_some_and(|c| Arc::strong_count(c) > 1)
    }

    /// Takes `name` back after a close (a destroy refused).
    fn reopen(&self, name: &str) {
        self.state().closing.remove(name);
    }

    /// A destroyed device's counters go with it (a device made again under its name starts
    /// at zero), and its name is open again.
    fn forget(&self, name: &str) {
        let mut s = self.state();
        s.counters.remove(name);
        s.closing.remove(name);
    }
}

impl ztier_nbd::Exports for HostExports {
    fn open(&self, name: &str) -> Option<ztier_nbd::Export> {
        let mut s = self.state();
        if s.closing.contains(name) {
            return None;
        }
        let d = self.host.get(name)?;
        let stats = Arc::clone(s.counters.entry(name.to_string()).or_default());
        drop(s);
        let spec = d.spec();
        let mut export = ztier_nbd::Export::new(name, d.block_device())
            .with_description(description(&spec))
            .with_read_only(spec.read_only);
        export.stats = stats;
        Some(export)
    }

    fn list(&self) -> Vec<(String, String)> {
        self.host
            .devices()
            .iter()
            .map(|d| (d.name().to_string(), description(&d.spec())))
            .collect()
    }
}
