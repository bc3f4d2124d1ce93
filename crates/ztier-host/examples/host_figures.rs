//! The host's figures, for docs/host.md's cost table and the budget's plot:
//! - `rss`: for 1, 16 and 256 devices of 64 GiB, the process's RSS before any write, then
//!   after N pages of real memory (a corpus) are stored across the devices (in bursts of 32
//!   pages a device, the devices in turn): RSS per stored
//!   page against `mem_used_total` per stored page and the slot tables' resident bytes
//!   (`metadata_bytes`), and store and load speed against the raw compressor on the same
//!   pages in the same process, and the store again once the pools are warm (each page
//!   rewritten with another of the set). Each case runs in a process of its own (this program again, as
//!   `rss-one`), so no case's freed memory counts in the next. The pages go to each device
//!   either packed (its first pages, as a swap device fills its first clusters) or spread
//!   (evenly over all 64 GiB: the slot table's worst case). With stores, it also looks at
//!   what one writeback pass that takes no page (what the budget or a device's policy does
//!   when nothing is old enough) leaves resident, on one device; without stores, packed, the
//!   kernel's zram stores the same pages in the same pattern in the same run (`--kernel`,
//!   root: as many devices, hot-added, of 1 GiB), the reference for what many devices cost.
//! - `budget`: the budget's run of `tests/budget_run.rs` (`tests/scenario`), longer and with
//!   corpus pages: each device's `mem_used_total` and the host's sum over time, kept as a
//!   host's `ztier stat --json` lines, which `ztier plot` draws with the target.
//!
//! `cargo run --release -p ztier-host --example host_figures -- [rss|budget|all]
//! [--pages N] [--corpus FILE] [--seconds S] [--out-dir DIR]` (default: all, the corpus's
//! first 32768 pages of cc1, 45 s, docs/figures). Run it under the build lock: the budget's
//! run is paced by its interval, and other work on the machine holds its thread off.

#[path = "../tests/scenario/mod.rs"]
mod scenario;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use scenario::Scenario;
use ztier_compress::Stream;
use ztier_corpus::Corpus;
use ztier_host::{DeviceSpec, Host, HostConfig};
use ztier_zram::PageSelector;

const PAGE: usize = 4096;
const DEVICE_SIZE: u64 = 64 << 30;

struct Args {
    what: String,
    pages: u64,
    corpus: Option<PathBuf>,
    seconds: u64,
    out_dir: PathBuf,
    // rss-one's own.
    devices: u64,
    spread: bool,
    stores: bool,
    scan: bool,
    kernel: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        what: "all".into(),
        pages: 32768,
        corpus: None,
        seconds: 45,
        out_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/figures"),
        devices: 1,
        spread: false,
        stores: false,
        scan: false,
        kernel: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        match a.as_str() {
            "rss" | "budget" | "all" | "rss-one" => args.what = a,
            "--pages" => args.pages = number(value("--pages")?)?,
            "--corpus" => args.corpus = Some(value("--corpus")?.into()),
            "--seconds" => args.seconds = number(value("--seconds")?)?,
            "--out-dir" => args.out_dir = value("--out-dir")?.into(),
            "--devices" => args.devices = number(value("--devices")?)?,
            "--spread" => args.spread = true,
            "--stores" => args.stores = true,
            "--scan" => args.scan = true,
            "--kernel" => args.kernel = true,
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    Ok(args)
}

fn corpus_path(args: &Args) -> Result<PathBuf, String> {
    match &args.corpus {
        Some(p) => Ok(p.clone()),
        None => ztier_corpus::shared_corpus_dir()
            .map(|d| d.join("cc1.pages.zst"))
            .ok_or_else(|| "no corpus: give --corpus FILE".to_string()),
    }
}

fn rss() -> u64 {
    ztier_base::os::process_rss_bytes().expect("/proc/self/statm")
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("host_figures: {e}");
            std::process::exit(2);
        }
    };
    let r = match args.what.as_str() {
        "rss-one" => rss_one(&args),
        "rss" => rss_table(&args),
        "budget" => budget_run(&args),
        _ => rss_table(&args).and_then(|()| budget_run(&args)),
    };
    if let Err(e) = r {
        eprintln!("host_figures: {e}");
        std::process::exit(1);
    }
}

/// One case of the table, in this process: prints one JSON line.
fn rss_one(args: &Args) -> Result<(), String> {
    let corpus = Corpus::load(&corpus_path(args)?).map_err(|e| e.to_string())?;
    let pages = args.pages.min(corpus.pages() as u64);
    let stores = std::env::temp_dir().join(format!("ztier-host-figures-{}", std::process::id()));
    let host = Host::new(HostConfig {
        store_dir: args.stores.then(|| stores.clone()),
        ..HostConfig::default()
    })
    .map_err(|e| e.to_string())?;
    if args.stores {
        std::fs::create_dir_all(&stores).map_err(|e| e.to_string())?;
    }
    let at_start = rss();
    let devices: Vec<_> = (0..args.devices)
        .map(|i| {
            let spec: DeviceSpec = format!("vm{i},size={DEVICE_SIZE}").parse().expect("a spec");
            host.create(spec).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let before_use = rss();
    // In bursts of 32 pages a device (SWAP_CLUSTER_MAX: reclaim swaps out 32 pages at a
    // time), the devices in turn.
    const BURST: u64 = 32;
    let per_device = pages.div_ceil(args.devices).next_multiple_of(BURST);
    let stride = if args.spread {
        (DEVICE_SIZE / PAGE as u64) / per_device
    } else {
        1
    };
    let place = |j: u64| {
        let burst = j / BURST;
        let in_device = (burst / args.devices) * BURST + j % BURST;
        (
            &devices[(burst % args.devices) as usize],
            in_device * stride,
        )
    };
    let started = Instant::now();
    for (j, page) in corpus.chunks(PAGE).take(pages as usize).enumerate() {
        let (d, index) = place(j as u64);
        d.block_device()
            .write_at(index * PAGE as u64, page, false)
            .map_err(|e| format!("{}: page {index}: {e}", d.name()))?;
    }
    let store_secs = started.elapsed().as_secs_f64();
    let after_store = rss();
    let mut back = vec![0u8; PAGE];
    let started = Instant::now();
    for j in 0..pages {
        let (d, index) = place(j);
        d.block_device()
            .read_at(index * PAGE as u64, &mut back)
            .map_err(|e| format!("{}: page {index}: {e}", d.name()))?;
    }
    let load_secs = started.elapsed().as_secs_f64();
    let mem_used_total: u64 = devices
        .iter()
        .map(|d| d.device().mm_stat().mem_used_total)
        .sum();
    // Warm: every page written again with another page of the same set (the second half's
    // in the first half's places and back), so the pools reuse what the first fill made:
    // the store of a host that has been running, without the first touch of fresh memory.
    let started = Instant::now();
    for j in 0..pages {
        let (d, index) = place(j);
        let other = ((j + pages / 2) % pages) as usize * PAGE;
        d.block_device()
            .write_at(
                index * PAGE as u64,
                &corpus.bytes()[other..other + PAGE],
                false,
            )
            .map_err(|e| format!("{}: page {index}: {e}", d.name()))?;
    }
    let rewrite_secs = started.elapsed().as_secs_f64();
    // The raw compressor on the same pages, in the same process: the reference.
    let algorithm = devices[0].spec().compressor;
    let mut stream = Stream::new(&algorithm, PAGE);
    let mut compressed = Vec::with_capacity(pages as usize);
    let started = Instant::now();
    for page in corpus.chunks(PAGE).take(pages as usize) {
        compressed.push(stream.compress(page).map_err(|e| e.to_string())?.to_vec());
    }
    let raw_compress_secs = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for c in &compressed {
        stream
            .comp
            .decompress_page(c, &mut back)
            .map_err(|e| e.to_string())?;
    }
    let raw_decompress_secs = started.elapsed().as_secs_f64();
    // The OS's share of the store: faulting in as many fresh pages as the pools hold, a
    // zspage's worth (up to 4 pages) at a call, as the arena does when its helper thread
    // had no chunk ready. The kernel's zsmalloc takes its pages from the page allocator
    // unzeroed; a process's fresh pages come zeroed, one fault or populate call at a time.
    let fresh = ztier_base::mapping::Mapping::anonymous(mem_used_total.max(1) as usize)
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    for at in (0..fresh.len()).step_by(4 * PAGE) {
        fresh
            .advise(at, 4 * PAGE, ztier_base::mapping::Advice::PopulateWrite)
            .map_err(|e| e.to_string())?;
    }
    let fault_in_secs = started.elapsed().as_secs_f64();
    drop(fresh);
    let mbps = |secs: f64| (pages * PAGE as u64) as f64 / secs / 1e6;
    let sum = |f: &dyn Fn(&ztier_host::HostDevice) -> u64| devices.iter().map(|d| f(d)).sum();
    let metadata: u64 = sum(&|d| d.device().metadata_bytes());
    let same_pages: u64 = sum(&|d| d.device().mm_stat().same_pages);
    // A writeback pass that takes nothing (no page is an hour old): what the budget's tick
    // does to a device when none of its pages are old enough.
    // Its growth is from just before it: the reference compressor's copies above are
    // this process's, not the pass's.
    let (scan_growth, metadata_after_scan) = if args.stores && args.scan {
        let before_scan = rss();
        for d in &devices {
            d.device()
                .writeback(PageSelector::OlderThan(3600), None, None)
                .map_err(|e| format!("{}: writeback: {e}", d.name()))?;
        }
        (
            Some(rss().saturating_sub(before_scan)),
            Some(sum(&|d| d.device().metadata_bytes())),
        )
    } else {
        (None, None)
    };
    let mut line = serde_json::json!({
        "devices": args.devices,
        "layout": if args.spread { "spread" } else { "packed" },
        "stores": args.stores,
        "pages": pages,
        "same_pages": same_pages,
        "rss_at_start": at_start,
        "rss_before_use": before_use.saturating_sub(at_start),
        "rss_stored": after_store.saturating_sub(before_use),
        "mem_used_total": mem_used_total,
        "metadata_bytes": metadata,
        "rss_scan_growth": scan_growth,
        "metadata_after_scan": metadata_after_scan,
        "store_mbps": mbps(store_secs),
        "rewrite_mbps": mbps(rewrite_secs),
        "load_mbps": mbps(load_secs),
        "raw_compress_mbps": mbps(raw_compress_secs),
        "raw_decompress_mbps": mbps(raw_decompress_secs),
        "store_secs": store_secs,
        "fault_in_secs": fault_in_secs,
    });
    drop(devices);
    host.stop_and_save();
    drop(host);
    let _ = std::fs::remove_dir_all(&stores);
    // The kernel's zram on the same pages in the same pattern, in the same run: the
    // reference for what splitting pages over many devices costs.
    let (kernel_store_mbps, kernel_missing) = if args.kernel {
        match kernel_store_mbps(&corpus, pages, args.devices) {
            Ok(mbps) => (Some(mbps), None),
            Err(why) => (None, Some(why)),
        }
    } else {
        (None, None)
    };
    line["kernel_store_mbps"] = serde_json::json!(kernel_store_mbps);
    line["kernel_store_missing"] = serde_json::json!(kernel_missing);
    println!("{line}");
    Ok(())
}

/// The kernel zram's store speed (MB/s of pages) over `devices` devices of 1 GiB (hot-added,
/// then reset and removed), lzo-rle on zsmalloc: the first `pages` pages written with
/// O_DIRECT in bursts of 32 a device, the devices in turn, as `rss_one` stores them. The
/// devices are smaller than ztier's 64 GiB because the kernel's slot table is allocated
/// whole (256 devices of 64 GiB would take 64 GiB of tables). Needs root and zram.
fn kernel_store_mbps(corpus: &Corpus, pages: u64, devices: u64) -> Result<f64, String> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const BURST: usize = 32;
    let control = Path::new("/sys/class/zram-control");
    if !control.exists() {
        return Err("no /sys/class/zram-control (zram not loaded)".into());
    }
    let sys = |path: String, value: &str| {
        std::fs::write(&path, value).map_err(|e| format!("{path}: {e}"))
    };
    let mut ids = Vec::new();
    let result = (|| {
        for _ in 0..devices {
            let id = std::fs::read_to_string(control.join("hot_add"))
                .map_err(|e| format!("zram hot_add: {e}"))?;
            let id: u32 = id
                .trim()
                .parse()
                .map_err(|e| format!("hot_add said {id:?}: {e}"))?;
            ids.push(id);
            sys(format!("/sys/block/zram{id}/comp_algorithm"), "lzo-rle")?;
            sys(format!("/sys/block/zram{id}/disksize"), "1G")?;
        }
        let files = ids
            .iter()
            .map(|id| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(format!("/dev/zram{id}"))
                    .map_err(|e| format!("/dev/zram{id}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // O_DIRECT wants an aligned buffer.
        let mut raw = vec![0u8; BURST * PAGE + PAGE];
        let at = raw.as_ptr().align_offset(PAGE);
        let buf = &mut raw[at..at + BURST * PAGE];
        let bursts = corpus.chunks(BURST * PAGE).take(pages as usize / BURST);
        let started = Instant::now();
        for (b, chunk) in bursts.enumerate() {
            let (device, round) = (b as u64 % devices, b as u64 / devices);
            buf[..chunk.len()].copy_from_slice(chunk);
            files[device as usize]
                .write_all_at(&buf[..chunk.len()], round * (BURST * PAGE) as u64)
                .map_err(|e| format!("zram{}: {e}", ids[device as usize]))?;
        }
        let secs = started.elapsed().as_secs_f64();
        Ok((pages as usize / BURST * BURST * PAGE) as f64 / secs / 1e6)
    })();
    for id in ids {
        let _ = sys(format!("/sys/block/zram{id}/reset"), "1");
        let _ = sys(format!("{}/hot_remove", control.display()), &id.to_string());
    }
    result
}

/// The table: each case in a process of its own.
fn rss_table(args: &Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let corpus = corpus_path(args)?;
    let mut rows = Vec::new();
    // With stores too (each store's allocator tables, made a chunk of clusters at a time
    // as they are used: ~20 KiB for an unused 64 GiB store, where the kernel's
    // cluster_info is ~1.6 MiB; their maps as they are used). The writeback pass is looked
    // at on one device.
    let cases = [1u64, 16, 256]
        .into_iter()
        .flat_map(|n| [(n, false, false), (n, true, false)])
        .chain([(1, false, true), (16, false, true), (256, false, true)]);
    {
        for (devices, spread, stores) in cases {
            let mut cmd = Command::new(&exe);
            cmd.args(["rss-one", "--devices", &devices.to_string()])
                .args(["--pages", &args.pages.to_string()])
                .arg("--corpus")
                .arg(&corpus);
            if spread {
                cmd.arg("--spread");
            }
            if stores {
                cmd.arg("--stores");
            }
            if stores && devices == 1 {
                cmd.arg("--scan");
            }
            if !stores && !spread {
                cmd.arg("--kernel");
            }
            let out = cmd.output().map_err(|e| e.to_string())?;
            if !out.status.success() {
                return Err(format!(
                    "rss-one {devices}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let row: serde_json::Value =
                serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
            eprintln!("{row}");
            rows.push(row);
        }
    }
    let mib = |v: &serde_json::Value| v.as_f64().map_or(f64::NAN, |b| b / 1048576.0);
    println!(
        "\n| devices of 64 GiB | pages at | stores | RSS before use | RSS per stored page | \
         mem_used_total per stored page | metadata_bytes (per stored page) | after a \
         writeback pass: RSS growth, metadata_bytes | store MB/s (x raw compress) | store \
         once the pools are warm (x raw) | load \
         MB/s (x raw decompress) | kernel zram store MB/s, same pages and pattern (ztier \
         / kernel) | faulting in mem_used_total's pages fresh, against the store's time |"
    );
    println!("|---:|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        let pages = r["pages"].as_f64().unwrap_or(1.0);
        let per_page = |key: &str| r[key].as_f64().unwrap_or(f64::NAN) / pages;
        let scan = if r["rss_scan_growth"].is_u64() {
            format!(
                "{:.1} MiB, {:.1} MiB",
                mib(&r["rss_scan_growth"]),
                mib(&r["metadata_after_scan"])
            )
        } else {
            "-".into()
        };
        let speed = |key: &str, raw: &str| {
            let (v, r) = (
                r[key].as_f64().unwrap_or(f64::NAN),
                r[raw].as_f64().unwrap_or(f64::NAN),
            );
            format!("{v:.0} ({:.2}x)", v / r)
        };
        let kernel = match r["kernel_store_mbps"].as_f64() {
            Some(k) => format!(
                "{k:.0} ({:.2}x)",
                r["store_mbps"].as_f64().unwrap_or(f64::NAN) / k
            ),
            None => "-".into(),
        };
        let fault_in = format!(
            "{:.0} ms of {:.0} ms",
            r["fault_in_secs"].as_f64().unwrap_or(f64::NAN) * 1e3,
            r["store_secs"].as_f64().unwrap_or(f64::NAN) * 1e3
        );
        println!(
            "| {} | {} | {} | {:.2} MiB | {:.0} B | {:.0} B | {:.2} MiB ({:.0} B) | {} | {} | {} | {} | {} | {} |",
            r["devices"],
            r["layout"].as_str().unwrap_or("?"),
            if r["stores"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            mib(&r["rss_before_use"]),
            per_page("rss_stored"),
            per_page("mem_used_total"),
            mib(&r["metadata_bytes"]),
            per_page("metadata_bytes"),
            scan,
            speed("store_mbps", "raw_compress_mbps"),
            speed("rewrite_mbps", "raw_compress_mbps"),
            speed("load_mbps", "raw_decompress_mbps"),
            kernel,
            fault_in,
        );
    }
    if let Some(first) = rows.first() {
        println!(
            "\n{} pages of {} ({} same-filled), a fresh process per row.",
            first["pages"],
            corpus.display(),
            first["same_pages"]
        );
    }
    Ok(())
}

/// The budget's run, long, with corpus pages; its samples (JSON lines) in the output directory.
fn budget_run(args: &Args) -> Result<(), String> {
    let corpus = Corpus::load(&corpus_path(args)?).map_err(|e| e.to_string())?;
    let pages: Vec<&[u8]> = corpus.chunks(PAGE).collect();
    let source = |seed: u64, out: &mut [u8]| {
        out.copy_from_slice(pages[(seed % pages.len() as u64) as usize]);
    };
    let interval = Duration::from_millis(250);
    let mut s = Scenario {
        target: 0,
        interval,
        cold_size: 1 << 30,
        cold_pages: 16384,
        hot_size: 64 << 20,
        hot_start_pages: 1024,
        hot_most_pages: 4096,
        hot_grow_pages: 24,
        rewrite_pages: 1024,
        read_pages: 32,
        low_pages: 2048,
        low_protection: 16 << 20,
        run_ticks: args.seconds * 1000 / interval.as_millis() as u64,
        sample_every: Duration::from_millis(100),
    };
    // The pools' sum once every working set is whole, measured on a host without a target;
    // the run's target is 60 % of it, so the budget has to write back 40 %.
    let whole = pools_for(&s, &source)?;
    s.target = whole / 10 * 6;
    eprintln!(
        "the pools' sum with every working set whole: {:.1} MiB; target {:.1} MiB",
        whole as f64 / 1048576.0,
        s.target as f64 / 1048576.0
    );
    let out = scenario::run(&s, &source);
    let settled = out.settled();
    let ceiling = s.target + s.target / 50;
    let within = settled.iter().filter(|x| x.sum <= ceiling).count();
    let most = settled.iter().map(|x| x.sum).max().unwrap_or(0);
    let least = settled.iter().map(|x| x.sum).min().unwrap_or(0);
    let mean = settled.iter().map(|x| x.sum as f64).sum::<f64>() / settled.len().max(1) as f64;
    println!(
        "\nbudget run: target {:.2} MiB, interval {} ms, {} ticks ({} over the target); {} \
         samples settled: {within} ({:.1} %) at most 2 % over; the sum from {:+.2} % to \
         {:+.2} % of the target, mean {:+.2} %",
        s.target as f64 / 1048576.0,
        interval.as_millis(),
        out.budget.ticks,
        out.budget.over_target_ticks,
        settled.len(),
        within as f64 * 100.0 / settled.len().max(1) as f64,
        (least as f64 / s.target as f64 - 1.0) * 100.0,
        (most as f64 / s.target as f64 - 1.0) * 100.0,
        (mean / s.target as f64 - 1.0) * 100.0,
    );
    println!(
        "budget: {} pages written back ({:.1} MiB to the stores), {} taken under a \
         protection, {} errors, busy {} ms",
        out.budget.written_back_pages,
        out.budget.bytes_written as f64 / 1048576.0,
        out.budget.protected_pages_taken,
        out.budget.errors,
        out.budget.busy_ms
    );
    println!("\n| device | pages written | written back by the budget | store reads | mem_used_total at the end | mem_low | wrong pages |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for d in &out.devices {
        println!(
            "| {} | {} | {} | {} | {:.2} MiB | {:.0} MiB | {} |",
            d.name,
            d.pages_written,
            d.budget_written_back_pages,
            d.bd_reads,
            d.mem_used_total as f64 / 1048576.0,
            d.mem_low as f64 / 1048576.0,
            d.wrong_pages
        );
    }
    std::fs::create_dir_all(&args.out_dir).map_err(|e| e.to_string())?;
    let samples = args.out_dir.join("host-budget.jsonl");
    write_samples(&samples, &out, s.target).map_err(|e| format!("{}: {e}", samples.display()))?;
    println!(
        "\n{}: draw it with `ztier plot {} -o {}`",
        samples.display(),
        samples.display(),
        samples.with_extension("svg").display()
    );
    Ok(())
}

/// The pools' sum with the scenario's pages all written (every working set at its most),
/// on a host of its own without a target.
fn pools_for(s: &Scenario, source: scenario::PageSource) -> Result<u64, String> {
    let host = Host::new(HostConfig::default()).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; PAGE];
    let mut seed = 0u64;
    for (name, size, pages) in [
        ("cold", s.cold_size, s.cold_pages),
        ("hot0", s.hot_size, s.hot_most_pages),
        ("hot1", s.hot_size, s.hot_most_pages),
        ("low", s.hot_size, s.low_pages),
    ] {
        let spec: DeviceSpec = format!("{name},size={size}").parse().expect("a spec");
        let d = host.create(spec).map_err(|e| e.to_string())?;
        for i in 0..pages {
            seed = ztier_base::rng::Rng::new(seed).next_u64();
            source(seed, &mut buf);
            d.block_device()
                .write_at(i * PAGE as u64, &buf, false)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(host.group().used_bytes())
}

/// The run's samples as a host's `ztier stat --json` lines (the fields `ztier plot` draws):
/// each device's `mem_used_total`, the pools' sum and the target, over time.
fn write_samples(path: &Path, out: &scenario::Outcome, target: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let began = now - out.samples.last().map_or(0.0, |x| x.seconds);
    for x in &out.samples {
        let devices: serde_json::Map<String, serde_json::Value> = out
            .names
            .iter()
            .zip(x.devices.iter().zip(&x.written_back))
            .map(|(name, (&mem, &written_back))| {
                let sample = serde_json::json!({
                    "mm_stat": { "mem_used_total": mem },
                    "budget_written_back_pages": written_back,
                });
                (name.clone(), sample)
            })
            .collect();
        let line = serde_json::json!({
            "host": {
                "unix_time": began + x.seconds,
                "budget_ticks": x.tick,
                "mem_used_bytes": x.sum,
                "mem_target_bytes": target,
            },
            "devices": devices,
        });
        writeln!(f, "{line}")?;
    }
    f.flush()
}
