//! A host's figures for Prometheus: every device's `mm_stat`, `io_stat` and `bd_stat`, its
//! policy's and the host budget's actions, the front ends' connections (handed in by whoever
//! runs them: this crate knows none), and the host's totals, in the text exposition format
//! (OpenMetrics) written by the Prometheus project's own Rust client; and the small HTTP
//! endpoint a Prometheus server scrapes them from.
//!
//! Names follow Prometheus's conventions: the `ztier_` prefix, base units in the name
//! (`_bytes`), counters ending in `_total`, the device as a label
//! (`ztier_device_compr_data_bytes{device="vm1"}`), a front end's kind as another.
//!
//! Invariants: a scrape reads every figure afresh into a registry of its own, so nothing is
//! kept between scrapes and a destroyed device leaves no series behind; a device's figures
//! are the ones `ztier stat` prints (the same reads). The endpoint answers one request at a
//! time, each bounded (8 KiB of request head, 2 s to send it), so a slow client costs a
//! scrape at most that delay. No locks of its own: a scrape reads the host's device table
//! (`Host::devices`, then each device's counters, as `ztier stat` does).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::host::Host;

/// A front end's figures for one device (NBD's export, a vhost-user-blk socket), as the
/// runner of that front end reads them.
#[derive(Debug, Clone, Default)]
pub struct FrontFigures {
    pub device: String,
    /// `nbd`, `vhost_user_blk`.
    pub front: &'static str,
    /// Connections open now.
    pub live_connections: u64,
    /// Connections served since the start.
    pub connections: u64,
    pub requests: u64,
    pub errors: u64,
    /// Bytes, where the front end counts them.
    pub bytes_read: Option<u64>,
    pub bytes_written: Option<u64>,
}

type Labels = Vec<(&'static str, String)>;

/// One scrape's registry, filled family by family.
struct Scrape {
    registry: Registry,
}

impl Scrape {
    fn gauge(&mut self, name: &str, help: &str, values: impl IntoIterator<Item = (Labels, u64)>) {
        let family = Family::<Labels, Gauge<u64, AtomicU64>>::default();
        for (labels, v) in values {
            family.get_or_create(&labels).set(v);
        }
        // The encoder ends the help with its own full stop.
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }

    /// A gauge of the host's, with no labels (no `{}` after its name).
    fn host_gauge(&mut self, name: &str, help: &str, value: u64) {
        let gauge = Gauge::<u64, AtomicU64>::default();
        gauge.set(value);
        self.registry
            .register(name, help.trim_end_matches('.'), gauge);
    }

    /// A counter of the host's, with no labels.
    fn host_counter(&mut self, name: &str, help: &str, value: u64) {
        let counter = Counter::<u64, AtomicU64>::default();
        counter.inc_by(value);
        self.registry
            .register(name, help.trim_end_matches('.'), counter);
    }

    /// A gauge of a fraction (a `_ratio`).
    fn gauge_f64(
        &mut self,
        name: &str,
        help: &str,
        values: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        for (labels, v) in values {
            family.get_or_create(&labels).set(v);
        }
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }

    /// `name` without `_total`: the encoder appends it, as OpenMetrics names counters.
    fn counter(&mut self, name: &str, help: &str, values: impl IntoIterator<Item = (Labels, u64)>) {
        let family = Family::<Labels, Counter<u64, AtomicU64>>::default();
        for (labels, v) in values {
            family.get_or_create(&labels).inc_by(v);
        }
        // The encoder ends the help with its own full stop.
        self.registry
            .register(name, help.trim_end_matches('.'), family);
    }
}

fn device(name: &str) -> Labels {
    vec![("device", name.to_string())]
}

/// The host's figures, now, as OpenMetrics text (ends in `# EOF`).
pub fn exposition(host: &Host, fronts: &[FrontFigures]) -> String {
    let mut s = Scrape {
        registry: Registry::with_prefix("ztier"),
    };
    let devices = host.devices();
    let mm: Vec<(String, ztier_zram::MmStat)> = devices
        .iter()
        .map(|d| (d.name().to_string(), d.device().mm_stat()))
        .collect();
    let io: Vec<(String, ztier_zram::IoStat)> = devices
        .iter()
        .map(|d| (d.name().to_string(), d.device().io_stat()))
        .collect();
    let bd: Vec<(String, ztier_zram::BdStat)> = devices
        .iter()
        .filter_map(|d| Some((d.name().to_string(), d.device().bd_stat()?)))
        .collect();
    let mm_gauge = |s: &mut Scrape, name: &str, help: &str, f: fn(&ztier_zram::MmStat) -> u64| {
        s.gauge(name, help, mm.iter().map(|(n, m)| (device(n), f(m))));
    };
    s.gauge(
        "device_disk_size_bytes",
        "The device's size (disksize).",
        devices.iter().map(|d| (device(d.name()), d.spec().size)),
    );
    mm_gauge(
        &mut s,
        "device_orig_data_bytes",
        "Bytes of the pages stored, uncompressed (mm_stat orig_data_size).",
        |m| m.orig_data_size,
    );
    mm_gauge(
        &mut s,
        "device_compr_data_bytes",
        "Bytes of the pages stored, compressed (mm_stat compr_data_size).",
        |m| m.compr_data_size,
    );
    mm_gauge(
        &mut s,
        "device_mem_used_bytes",
        "Memory the device's pool holds (mm_stat mem_used_total).",
        |m| m.mem_used_total,
    );
    s.gauge(
        "device_metadata_bytes",
        "The device's slot table and its store's tables resident in memory (beside the pool; given back as they empty).",
        devices
            .iter()
            .map(|d| (device(d.name()), d.device().metadata_bytes())),
    );
    s.gauge(
        "device_mem_low_bytes",
        "The device's protection: the budget takes none of its pool below this while another device is above its own; 0: none.",
        devices.iter().map(|d| (device(d.name()), d.mem_low())),
    );
    s.gauge(
        "device_shared_store_bytes",
        "Bytes of the host's shared store the device's volume holds (devices on a shared store only).",
        devices
            .iter()
            .filter_map(|d| Some((device(d.name()), d.shared_store_use()?.0))),
    );
    s.gauge(
        "device_shared_store_limit_bytes",
        "The most of the shared store the device's volume may hold (store_limit; devices with one only).",
        devices
            .iter()
            .filter_map(|d| Some((device(d.name()), d.shared_store_use()?.1?))),
    );
    mm_gauge(
        &mut s,
        "device_mem_limit_bytes",
        "The device's cap; 0: none (mm_stat mem_limit).",
        |m| m.mem_limit,
    );
    mm_gauge(
        &mut s,
        "device_mem_used_max_bytes",
        "The pool's peak (mm_stat mem_used_max).",
        |m| m.mem_used_max,
    );
    mm_gauge(
        &mut s,
        "device_same_pages",
        "Pages stored as one repeated word, no memory (mm_stat same_pages).",
        |m| m.same_pages,
    );
    mm_gauge(
        &mut s,
        "device_huge_pages",
        "Pages stored uncompressed (mm_stat huge_pages).",
        |m| m.huge_pages,
    );
    s.counter(
        "device_huge_pages_stored",
        "Pages stored uncompressed since the start (mm_stat huge_pages_since).",
        mm.iter().map(|(n, m)| (device(n), m.huge_pages_since)),
    );
    s.counter(
        "device_pages_compacted",
        "Pool pages freed by compaction (mm_stat pages_compacted).",
        mm.iter().map(|(n, m)| (device(n), m.pages_compacted)),
    );
    s.counter(
        "device_failed_reads",
        "Reads that failed (io_stat failed_reads).",
        io.iter().map(|(n, i)| (device(n), i.failed_reads)),
    );
    s.counter(
        "device_failed_writes",
        "Writes that failed (io_stat failed_writes).",
        io.iter().map(|(n, i)| (device(n), i.failed_writes)),
    );
    s.counter(
        "device_invalid_io",
        "Requests refused as malformed (io_stat invalid_io).",
        io.iter().map(|(n, i)| (device(n), i.invalid_io)),
    );
    s.counter(
        "device_notify_free",
        "Pages freed by a discard (io_stat notify_free).",
        io.iter().map(|(n, i)| (device(n), i.notify_free)),
    );
    s.gauge(
        "device_backing_pages",
        "Pages on the backing store (bd_stat bd_count).",
        bd.iter().map(|(n, b)| (device(n), b.bd_count)),
    );
    s.counter(
        "device_backing_read_pages",
        "Pages read from the backing store (bd_stat bd_reads).",
        bd.iter().map(|(n, b)| (device(n), b.bd_reads)),
    );
    s.counter(
        "device_backing_written_pages",
        "Pages written to the backing store (bd_stat bd_writes).",
        bd.iter().map(|(n, b)| (device(n), b.bd_writes)),
    );
    s.counter(
        "device_backing_checksum_failures",
        "Reads from the backing store whose copy failed its checksum.",
        bd.iter().map(|(n, b)| (device(n), b.checksum_failures)),
    );
    let policies: Vec<(String, ztier_zram::PolicyStats)> = devices
        .iter()
        .filter_map(|d| Some((d.name().to_string(), d.policy_stats()?)))
        .collect();
    s.counter(
        "device_policy_recompressed_pages",
        "Pages the device's own policy recompressed.",
        policies
            .iter()
            .map(|(n, p)| (device(n), p.recompressed_pages)),
    );
    s.counter(
        "device_policy_written_back_pages",
        "Pages the device's own policy wrote back.",
        policies
            .iter()
            .map(|(n, p)| (device(n), p.written_back_pages)),
    );
    s.counter(
        "device_policy_errors",
        "Errors of the device's own policy.",
        policies.iter().map(|(n, p)| (device(n), p.errors)),
    );
    let promotions: Vec<(&String, &ztier_zram::PromotionStats)> = policies
        .iter()
        .filter_map(|(n, p)| Some((n, p.promotion.as_ref()?)))
        .collect();
    s.gauge(
        "device_promotion_age_seconds",
        "The idle age the device's policy writes pages back at, chosen for its promotion target.",
        promotions.iter().map(|(n, p)| (device(n), p.age_secs)),
    );
    // SDFM states the target per minute, so the ratios are too (a share of the stored pages).
    s.gauge_f64(
        "device_promotion_minute_ratio",
        "Reads from the store per minute over the pages on it, in the last window decided.",
        promotions
            .iter()
            .map(|(n, p)| (device(n), p.share_per_minute)),
    );
    s.gauge_f64(
        "device_promotion_target_minute_ratio",
        "The device's promotion target: reads from the store per minute over the pages on it.",
        promotions
            .iter()
            .map(|(n, p)| (device(n), p.target_share_per_minute)),
    );
    s.counter(
        "device_promotion_decisions",
        "The promotion controller's decisions, by the way they moved the age.",
        promotions.iter().flat_map(|(n, p)| {
            [
                ("holding", p.holding),
                ("younger", p.younger),
                ("older", p.older),
            ]
            .map(|(step, v)| {
                (
                    vec![("device", n.to_string()), ("step", step.to_string())],
                    v,
                )
            })
        }),
    );
    s.counter(
        "device_budget_written_back_pages",
        "Pages the host's budget wrote back from this device.",
        devices
            .iter()
            .map(|d| (device(d.name()), d.budget_written_back_pages())),
    );
    let front =
        |f: &FrontFigures| vec![("device", f.device.clone()), ("front", f.front.to_string())];
    s.gauge(
        "frontend_live_connections",
        "Connections a front end has open to the device now.",
        fronts.iter().map(|f| (front(f), f.live_connections)),
    );
    s.counter(
        "frontend_connections",
        "Connections a front end served for the device.",
        fronts.iter().map(|f| (front(f), f.connections)),
    );
    s.counter(
        "frontend_requests",
        "Requests a front end took for the device.",
        fronts.iter().map(|f| (front(f), f.requests)),
    );
    s.counter(
        "frontend_errors",
        "Requests a front end answered with an error.",
        fronts.iter().map(|f| (front(f), f.errors)),
    );
    s.counter(
        "frontend_read_bytes",
        "Bytes a front end read from the device for its clients.",
        fronts
            .iter()
            .filter_map(|f| Some((front(f), f.bytes_read?))),
    );
    s.counter(
        "frontend_written_bytes",
        "Bytes a front end wrote to the device for its clients.",
        fronts
            .iter()
            .filter_map(|f| Some((front(f), f.bytes_written?))),
    );
    s.host_gauge(
        "host_devices",
        "Devices the host serves.",
        devices.len() as u64,
    );
    s.host_gauge(
        "host_mem_used_bytes",
        "Memory every device's pool holds, summed (the host's limit and target count this).",
        host.group().used_bytes(),
    );
    s.host_gauge(
        "host_mem_limit_bytes",
        "The host's limit: no write takes the sum past it; 0: none.",
        host.group().limit_bytes(),
    );
    s.host_gauge(
        "host_mem_target_bytes",
        "The host's target the budget keeps the sum under; 0: none.",
        host.config().target.unwrap_or(0),
    );
    let budget = host.budget_stats().unwrap_or_default();
    s.host_counter(
        "host_budget_written_back_pages",
        "Pages the host's budget wrote back, over every device.",
        budget.written_back_pages,
    );
    s.host_counter(
        "host_budget_protected_pages_taken",
        "Pages the budget took from under a device's protection (every device was down to its own).",
        budget.protected_pages_taken,
    );
    s.host_counter(
        "host_budget_ticks",
        "Times the host's budget looked at its target.",
        budget.ticks,
    );
    s.host_counter(
        "host_budget_errors",
        "Errors of the host's budget.",
        budget.errors,
    );
    s.host_counter(
        "host_budget_over_target_ticks",
        "Times the budget found the pools together over the target.",
        budget.over_target_ticks,
    );
    s.host_counter(
        "host_budget_written_bytes",
        "Bytes the host's budget wrote to the stores.",
        budget.bytes_written,
    );
    s.host_counter(
        "host_budget_busy_seconds",
        "Time the host's budget spent working.",
        budget.busy_ms / 1000,
    );
    if let Some(store) = &host.config().shared_store {
        let extent = store.extent_size();
        s.host_gauge(
            "host_shared_store_bytes",
            "The shared store's extents, every volume's and free (the label's included).",
            store.extents() * extent,
        );
        s.host_gauge(
            "host_shared_store_free_bytes",
            "The shared store's extents no device holds.",
            store.free_extents() * extent,
        );
    }
    let mut text = String::new();
    // Writing to a String cannot fail; the encoder's own errors are for labels it cannot
    // write, and these are plain strings.
    let _ = encode(&mut text, &s.registry);
    text
}

/// The content type of OpenMetrics text, as Prometheus negotiates it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The HTTP endpoint: `GET /metrics` answered with the figures `figures` gives.
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Serves `listener` on a thread of its own until [`MetricsEndpoint::stop`] (or drop).
    pub fn start(
        listener: TcpListener,
        figures: Arc<dyn Fn() -> String + Send + Sync>,
    ) -> std::io::Result<MetricsEndpoint> {
        let addr = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopping);
        let thread = std::thread::Builder::new()
            .name("ztier-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        answer(conn, &*figures);
                    } else {
                        // Out of descriptors and the like: a pause, never the end.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })?;
        Ok(MetricsEndpoint {
            addr,
            stopping,
            thread: Some(thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops answering and joins the thread.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // The accept loop wakes for a connection: one of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The most of a request's head read; more is refused.
const MAX_HEAD: usize = 8 << 10;

/// One request and its answer; the connection then closes.
fn answer(mut conn: TcpStream, figures: &dyn Fn() -> String) {
    // One deadline for the whole request head, not for each read of it.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break true;
        }
        if head.len() >= MAX_HEAD {
            break false;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            break false;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break false,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    };
    let line = String::from_utf8_lossy(&head);
    let mut words = line.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let (status, kind, body) = if !complete {
        (
            "400 Bad Request",
            "text/plain",
            "a request head, ended by an empty line\n".to_string(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "GET /metrics\n".to_string(),
        )
    } else if path == "/metrics" || path.starts_with("/metrics?") {
        ("200 OK", CONTENT_TYPE, figures())
    } else if path == "/" {
        (
            "200 OK",
            "text/plain",
            "ztier: the figures are at /metrics\n".to_string(),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "not found: the figures are at /metrics\n".to_string(),
        )
    };
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        reply.push_str(&body);
    }
    let _ = conn.write_all(reply.as_bytes());
}
