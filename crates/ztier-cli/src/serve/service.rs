//! How `ztier serve` runs as a service, with the conventions NBD servers share: where it
//! listens (sockets systemd hands over, `--socket`, a private socket for `--run`, or TCP
//! for NBD; `--vhost-user-blk`'s socket),
//! Unix sockets made private from the start, readiness and status for systemd, the captive
//! command of `--run`, and the socket files removed however the server ends.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use ztier_nbd::Listener;

use super::{ServeArgs, Store};
use crate::error::CliError;

/// Socket files `ztier serve` made, and private directories it made for them, removed
/// when it ends however it ends: at the end of `serve` (the first handle's drop) or by the
/// signal thread before it ends the process at once. Shared by both.
#[derive(Clone, Default)]
pub(super) struct SocketFiles(Arc<Mutex<MadeFiles>>);

#[derive(Default)]
struct MadeFiles {
    sockets: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

impl SocketFiles {
    fn add_socket(&self, p: PathBuf) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sockets
            .push(p);
    }

    pub(super) fn add_dir(&self, d: PathBuf) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dirs
            .push(d);
    }

    /// Removes every file and directory made, now.
    pub(super) fn remove_all(&self) {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for p in made.sockets.drain(..) {
            let _ = std::fs::remove_file(p);
        }
        for d in made.dirs.drain(..) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Removes what `files` names when dropped: however `serve` ends, its early returns
/// included.
pub(super) struct RemovedAtEnd(pub(super) SocketFiles);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        self.0.remove_all();
    }
}

/// Removes a socket file left behind by a server that is gone (a `kill -9`, a crash): one
/// nobody answers on, as nbdkit and qemu-nbd do. One a server answers on is in use, and
/// anything else at the path is left alone: both are errors that say so.
fn clear_stale_socket(path: &std::path::Path, flag: &'static str) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        bail!(
            "{} exists and is not a socket; remove it or name another path",
            path.display()
        );
    }
    // Not blocking: a live server whose queue of connections is full would hold a blocking
    // connect; it is in use all the same.
    let probe = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .context("making a socket to look at the old one")?;
    let addr = rustix::net::SocketAddrUnix::new(path)
        .with_context(|| format!("{} as a socket address", path.display()))?;
    match rustix::net::connect(&probe, &addr).map_err(std::io::Error::from) {
        Ok(()) => Err(CliError::SocketInUse {
            path: path.to_owned(),
            how: "answers on it",
            flag,
        }
        .into()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(CliError::SocketInUse {
            path: path.to_owned(),
            how: "is there, too busy to answer",
            flag,
        }
        .into()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path)
                .with_context(|| format!("removing the stale socket {}", path.display()))?;
            eprintln!(
                "ztier serve: removed the stale socket {} (no server answers on it)",
                path.display()
            );
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("looking whether {} is in use", path.display())),
    }
}

/// Binds a Unix socket at `path` with permissions `mode` from the start: made under a umask
/// that lets no one else in, so no other user can connect between the bind and the chmod.
/// `flag` is the flag that names the path, for an error's remedy.
pub(super) fn bind_private(
    path: &std::path::Path,
    flag: &'static str,
    mode: u32,
    files: &SocketFiles,
) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    clear_stale_socket(path, flag)?;
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let l = match (bound, dir) {
        (Err(e), Some(dir)) if e.kind() == std::io::ErrorKind::NotFound && !dir.exists() => {
            return Err(CliError::DirMissing {
                path: path.to_owned(),
                dir: dir.to_owned(),
                flag,
            }
            .into())
        }
        (bound, _) => bound.with_context(|| format!("binding {}", path.display()))?,
    };
    files.add_socket(path.to_owned());
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting {}'s mode to {mode:o}", path.display()))?;
    Ok(l)
}

/// Where the NBD server listens, and how a client names it.
pub(super) struct Place {
    pub(super) listener: Listener,
    pub(super) uri: String,
    unix_socket: Option<PathBuf>,
    port: Option<u16>,
}

/// Where the vhost-user-blk server listens.
pub(super) struct VhostPlace {
    pub(super) listener: UnixListener,
    pub(super) path: PathBuf,
}

/// Where each front end listens: NBD's, vhost-user-blk's, or both.
pub(super) struct Places {
    pub(super) nbd: Option<Place>,
    pub(super) vhost: Option<VhostPlace>,
}

impl Places {
    /// Where a client finds the disk, said in a line.
    pub(super) fn describe(&self) -> String {
        let vhost = self
            .vhost
            .as_ref()
            .map(|v| format!("vhost-user-blk at {}", v.path.display()));
        match (&self.nbd, vhost) {
            (Some(p), Some(v)) => format!("{} and {v}", p.uri),
            (Some(p), None) => p.uri.clone(),
            (None, Some(v)) => v,
            (None, None) => "nowhere".into(),
        }
    }
}

/// The listeners: the sockets systemd handed over, `--socket`, a private socket for `--run`,
/// or `--listen` (default 127.0.0.1:10809) for NBD, unless only `--vhost-user-blk` is given;
/// `--vhost-user-blk`'s socket (`-`: one handed over, after NBD's if there are two).
pub(super) fn listen(
    args: &ServeArgs,
    mut activated: listenfd::ListenFd,
    files: &SocketFiles,
) -> anyhow::Result<Places> {
    let handed = activated.len();
    let vhost_handed = args.vhost_user_blk.as_deref() == Some(std::path::Path::new("-"));
    if vhost_handed && handed == 0 {
        bail!(
            "--vhost-user-blk - takes the socket systemd hands over (LISTEN_FDS), and none was \
             handed over"
        );
    }
    if handed > 0 {
        if args.socket.is_some() || args.listen.is_some() {
            bail!("--socket and --listen cannot be given under socket activation (LISTEN_FDS)");
        }
        let nbd_handed = !vhost_handed || handed == 2;
        let expected = usize::from(nbd_handed) + usize::from(vhost_handed);
        if handed != expected {
            bail!(
                "socket activation handed {handed} sockets; ztier serve takes {expected} here \
                 (NBD's, then with --vhost-user-blk - the vhost-user-blk one)"
            );
        }
        let nbd = if nbd_handed {
            Some(handed_nbd(args, &mut activated)?)
        } else {
            None
        };
        let vhost = if vhost_handed {
            let l = match activated.take_unix_listener(expected - 1) {
                Ok(Some(l)) => l,
                _ => bail!(
                    "the socket handed over for vhost-user-blk (LISTEN_FDS) is no listening \
                     Unix socket"
                ),
            };
            let path = l
                .local_addr()?
                .as_pathname()
                .map_or_else(|| PathBuf::from("(unnamed)"), |p| p.to_owned());
            Some(VhostPlace { listener: l, path })
        } else {
            bind_vhost(args, files)?
        };
        return Ok(Places { nbd, vhost });
    }
    let vhost = bind_vhost(args, files)?;
    let nbd = if args.socket.is_some() || args.listen.is_some() || vhost.is_none() {
        Some(nbd_place(args, files)?)
    } else {
        None
    };
    Ok(Places { nbd, vhost })
}

/// `--vhost-user-blk PATH`'s socket, made private as NBD's is.
fn bind_vhost(args: &ServeArgs, files: &SocketFiles) -> anyhow::Result<Option<VhostPlace>> {
    let Some(path) = &args.vhost_user_blk else {
        return Ok(None);
    };
    let listener = bind_private(path, "--vhost-user-blk", args.socket_mode, files)
        .context("the vhost-user-blk socket")?;
    Ok(Some(VhostPlace {
        listener,
        path: path.clone(),
    }))
}

/// How an NBD client names a Unix socket or a TCP address.
fn nbd_unix(args: &ServeArgs, path: &std::path::Path, l: UnixListener) -> Place {
    Place {
        listener: Listener::Unix(l),
        uri: format!(
            "nbd{}+unix:///{}?socket={}",
            tls_s(args),
            args.export_name,
            path.display()
        ),
        unix_socket: Some(path.to_owned()),
        port: None,
    }
}

fn nbd_tcp(args: &ServeArgs, l: TcpListener) -> anyhow::Result<Place> {
    let addr = l.local_addr()?;
    if !addr.ip().is_loopback() && args.tls != ztier_nbd::TlsMode::Require {
        eprintln!(
            "ztier serve: WARNING: listening on {addr}, beyond this machine, without \
             --tls require: anyone who can reach it can read and write the disk"
        );
    }
    Ok(Place {
        listener: Listener::Tcp(l),
        uri: format!("nbd{}://{addr}/{}", tls_s(args), args.export_name),
        unix_socket: None,
        port: Some(addr.port()),
    })
}

/// nbdkit's way: a server that takes TLS only is named by the TLS scheme.
fn tls_s(args: &ServeArgs) -> &'static str {
    if args.tls == ztier_nbd::TlsMode::Require {
        "s"
    } else {
        ""
    }
}

/// The NBD socket systemd handed over (the first).
fn handed_nbd(args: &ServeArgs, activated: &mut listenfd::ListenFd) -> anyhow::Result<Place> {
    if let Ok(Some(l)) = activated.take_unix_listener(0) {
        let path = l
            .local_addr()?
            .as_pathname()
            .map_or_else(|| PathBuf::from("(unnamed)"), |p| p.to_owned());
        return Ok(nbd_unix(args, &path, l));
    }
    match activated.take_tcp_listener(0) {
        Ok(Some(l)) => nbd_tcp(args, l),
        _ => bail!("the socket handed over (LISTEN_FDS) is no listening Unix or TCP socket"),
    }
}

/// NBD's own listener: `--socket`, a private socket for `--run`, or `--listen`.
fn nbd_place(args: &ServeArgs, files: &SocketFiles) -> anyhow::Result<Place> {
    if let Some(path) = &args.socket {
        let l = bind_private(path, "--socket", args.socket_mode, files)?;
        return Ok(nbd_unix(args, path, l));
    }
    if args.run.is_some() && args.listen.is_none() {
        let dir = private_dir()?;
        files.add_dir(dir.clone());
        let path = dir.join("nbd.sock");
        let l = bind_private(&path, "--socket", args.socket_mode, files)?;
        return Ok(nbd_unix(args, &path, l));
    }
    let addr = args.listen.as_deref().unwrap_or("127.0.0.1:10809");
    let l = TcpListener::bind(addr).map_err(|e| CliError::bind(addr, "--listen", e))?;
    nbd_tcp(args, l)
}

/// A new directory only this user can enter, for --run's private socket.
pub(super) fn private_dir() -> anyhow::Result<PathBuf> {
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
pub(super) fn notify(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        eprintln!("ztier serve: telling NOTIFY_SOCKET: {e}");
    }
}

pub(super) fn status_line(store: &Store, size: u64, uri: &str) -> String {
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

/// Starts `--run`'s command through the shell, with the servers' places in its
/// environment: NBD's as nbdkit sets them ($uri, $unixsocket or $port, $exportname), and
/// the vhost-user-blk socket as $vhost_user_blk.
pub(super) fn start_command(
    cmd: &str,
    places: &Places,
    export: &str,
) -> anyhow::Result<std::process::Child> {
    let mut c = std::process::Command::new("sh");
    c.arg("-c").arg(cmd);
    c.env_remove("uri")
        .env_remove("unixsocket")
        .env_remove("port")
        .env_remove("vhost_user_blk");
    if let Some(place) = &places.nbd {
        c.env("uri", &place.uri).env("exportname", export);
        match (&place.unix_socket, place.port) {
            (Some(path), _) => {
                c.env("unixsocket", path);
            }
            (None, Some(port)) => {
                c.env("port", port.to_string());
            }
            (None, None) => {}
        }
    }
    if let Some(v) = &places.vhost {
        c.env("vhost_user_blk", &v.path);
    }
    c.spawn()
        .with_context(|| format!("running --run's command {cmd:?}"))
}

/// A command's exit status as a shell gives it: its code, or 128 + the signal that ended it.
pub(super) fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => 1,
    }
}
