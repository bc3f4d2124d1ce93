//! `ztier serve`: a zram device served over NBD. Flags in, the wiring of device and server,
//! a log line per connection, and the device's statistics at shutdown.

use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
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
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let layout = args.layout.config();
    layout.validate().map_err(anyhow::Error::msg)?;
    let pool = args
        .allocator
        .make_pool(&layout)
        .map_err(anyhow::Error::msg)?;
    let device = Arc::new(
        Device::new(args.size, args.compressor, pool)
            .with_context(|| format!("making a {}-byte device", args.size))?,
    );
    device.set_mem_limit(args.mem_limit);
    let config = ServerConfig {
        export_name: args.export_name.clone(),
        description: Some(format!(
            "ztier zram, {} on {}",
            args.compressor, args.allocator
        )),
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
    let server = Server::new(Arc::clone(&device) as Arc<dyn BlockDevice>, config);

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
    eprintln!(
        "ztier serve: {} bytes, {} on {}, at {place}",
        args.size, args.compressor, args.allocator
    );
    let served = server.serve(listener);
    server.stop();
    let _ = watcher.join();
    if let Some(path) = &args.socket {
        let _ = std::fs::remove_file(path);
    }
    served.context("serving")?;
    print_stats(&device, &server);
    Ok(())
}

fn print_stats(device: &Device, server: &Server) {
    let s = server.stats();
    eprintln!(
        "ztier serve: stopped after {} connections ({} turned away), {} requests, {} errors, {} bytes written, {} read",
        s.connections.load(Ordering::Relaxed),
        s.refused_connections.load(Ordering::Relaxed),
        s.requests.load(Ordering::Relaxed),
        s.errors.load(Ordering::Relaxed),
        s.bytes_written.load(Ordering::Relaxed),
        s.bytes_read.load(Ordering::Relaxed),
    );
    println!("mm_stat {}", device.mm_stat());
    println!("io_stat {}", device.io_stat());
    println!("{}", device.allocator_stats());
}
