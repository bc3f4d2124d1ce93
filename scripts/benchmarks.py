#!/usr/bin/env python3
"""Regenerates docs/benchmarks.md: the current figure of each of ztier's headline paths on
this machine, each beside its reference, with the machine, the date and the command that
reproduces it. The figures come from the CLI's own `--json` output, never typed by hand.

    python3 scripts/benchmarks.py [--ztier PATH] [--out docs/benchmarks.md] [--rounds N]

Builds `target/release/ztier` first (`cargo build --release -q -p ztier-cli`; set
ZTIER_BUILD_LOCK to a lock file to build under flock) unless --ztier names a binary. The
corpora are ../shared/corpus/*.pages.zst where that directory exists (or $ZTIER_CORPUS_DIR),
else the bundled sample. The NBD figure (`ztier serve` against nbdkit's memory plugin with
the same client, nbdcopy) has no --json in the CLI: it is timed here, around nbdcopy, and
skipped with a line saying so where nbdkit or nbdcopy is missing.

Standard library only; runs in a few minutes on a 2-core machine.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    """Runs a ztier command with --json; returns its JSON objects, one a line."""
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def shown(cmd, ztier):
    """The command as a user types it (`ztier ...`, paths relative to the checkout)."""
    words = ["ztier" if w == ztier else w for w in cmd]
    words = [os.path.relpath(w, ROOT) if os.path.isabs(w) and os.path.exists(w) else w for w in words]
    return " ".join(words)


def machine():
    model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "kernel": platform.release(),
    }


def corpora():
    base = os.environ.get("ZTIER_CORPUS_DIR") or os.path.join(ROOT, "..", "shared", "corpus")
    found = []
    if os.path.isdir(base):
        found = sorted(
            os.path.realpath(os.path.join(base, n)) for n in os.listdir(base) if n.endswith(".pages.zst")
        )
    return found or [os.path.join(ROOT, "samples", "sample.pages.zst")]


def zram_rows(ztier, corpus_paths):
    rows = []
    for corpus in corpus_paths:
        cmd = [ztier, "bench", "--corpus", corpus, "--compressor", "lzo-rle", "--compressor", "lz4", "--json"]
        for r in run_json(cmd):
            kernel = r.get("kernel") or {}
            equal = kernel.get("equal")
            rows.append([
                f"zram store, {r['corpus']}, {r['compressor']}",
                f"{r['store_mb_s']:.0f} MB/s",
                f"raw compressor {r['raw_compress_mb_s']:.0f} MB/s ({r['store_vs_raw']:.2f}x)"
                + (f"; kernel zram `dd` write {kernel['write_mb_s']:.0f} MB/s recorded with the corpus"
                   " (its truth file: another day, maybe another machine)" if kernel.get("write_mb_s") else ""),
                shown(cmd, ztier),
            ])
            rows.append([
                f"zram load, {r['corpus']}, {r['compressor']}",
                f"{r['load_mb_s']:.0f} MB/s",
                f"raw decompressor {r['raw_decompress_mb_s']:.0f} MB/s ({r['load_vs_raw']:.2f}x)",
                shown(cmd, ztier),
            ])
            ratio = r["mm_stat"]["orig_data_size"] / max(1, r["mm_stat"]["mem_used_total"])
            rows.append([
                f"zram memory, {r['corpus']}, {r['compressor']}",
                f"mem_used_total {r['mm_stat']['mem_used_total']} B (ratio {ratio:.2f})",
                "the kernel zram's: "
                + ("every mm_stat field equal" if equal else "differs" if equal is False else "no truth file beside the corpus")
                + (f" ({kernel['release']})" if kernel.get("release") else ""),
                shown(cmd, ztier),
            ])
    return rows


def zswap_rows(ztier, corpus_paths):
    rows = []
    for corpus in corpus_paths:
        cmd = [ztier, "bench", "zswap", "--corpus", corpus, "--compressor", "lzo-rle", "--json"]
        for r in run_json(cmd):
            kernel = r.get("kernel") or {}
            rows.append([
                f"zswap store / load, {r['corpus']}, {r['compressor']}",
                f"{r['store_mb_s']:.0f} / {r['load_mb_s']:.0f} MB/s",
                f"raw {r['raw_compress_mb_s']:.0f} / {r['raw_decompress_mb_s']:.0f} MB/s "
                f"({r['store_vs_raw']:.2f}x / {r['load_vs_raw']:.2f}x); zram swap-in on the same pages "
                f"{r['zram_swapin_mb_s']:.0f} MB/s"
                + ("; counters equal to the kernel zswap's" if kernel.get("equal") else ""),
                shown(cmd, ztier),
            ])
    return rows


def unit_rows(ztier, corpus):
    cmd = [ztier, "bench", "--corpus", corpus, "--unit-size", "4K,16K,64K", "--compressor", "lz4", "--json"]
    results = run_json(cmd)
    base = next((r for r in results if r["unit_size"] == 4096), None)
    rows = []
    for r in results:
        ref = ""
        if base and r is not base:
            ref = (f"4 KiB units: {base['mm_stat']['mem_used_total']} B "
                   f"({r['mm_stat']['mem_used_total'] / base['mm_stat']['mem_used_total']:.2f}x), "
                   f"random read p50 {base['random_read_p50_us']} µs")
        else:
            ref = "the page as its own unit (zram's)"
        rows.append([
            f"units of {r['unit_size'] // 1024} KiB, {r['corpus']}, lz4",
            f"mem_used_total {r['mm_stat']['mem_used_total']} B; random 4 KiB read p50 {r['random_read_p50_us']} µs",
            ref,
            shown(cmd, ztier),
        ])
    return rows


def region_rows(ztier, corpus):
    cmd = [ztier, "bench", "uffd", "--corpus", corpus, "--compressor", "lz4", "--json"]
    rows = []
    for r in run_json(cmd):
        if not r.get("clean_pages"):
            continue
        kernel = (f"kernel page-out {r['kernel_pageout_mb_s']:.0f} MB/s" if r.get("kernel_pageout_mb_s")
                  else f"kernel not measured: {r.get('kernel_in_run_missing') or 'see the text report'}")
        rows.append([
            f"region single-page fault, {r['corpus']}, lz4",
            f"p50 {r['fault_p50_us']:.1f} µs, p99 {r['fault_p99_us']:.1f} µs",
            f"bare handler placed as the fault thread: p50 {r['floor_placed_p50_us']:.1f} µs, "
            f"p99 {r['floor_placed_p99_us']:.1f} µs",
            shown(cmd, ztier),
        ])
        rows.append([
            f"region evict / sequential fault-in, {r['corpus']}, lz4",
            f"{r['evict_mb_s']:.0f} / {r['seq_faultin_mb_s']:.0f} MB/s",
            kernel,
            shown(cmd, ztier),
        ])
        rows.append([
            f"region memory, {r['corpus']}, lz4",
            f"RSS {r['rss_at_rest_bytes']} B at rest",
            f"allowed {r['rss_allowed_bytes']} B (budget + 64 B a stored page); "
            f"all stored {r['all_mem_used_total']} B against a zram device's {r['zram_mem_used_total']} B",
            shown(cmd, ztier),
        ])
    return rows


def swap_alloc_rows(ztier):
    cmd = [ztier, "swap-alloc-bench", "--workload", "order0", "--threads", "16", "--ops", "1000000", "--json"]
    results = {r["mode"]: r for r in run_json(cmd)}
    cluster, legacy = results.get("cluster"), results.get("legacy")
    if not (cluster and legacy):
        return []
    return [[
        "swap-slot allocator, order 0, 16 threads, cluster mode",
        f"{cluster['ops_per_s'] / 1e6:.1f} M ops/s; {cluster['device_lock_per_slot']:.4f} device-lock acquisitions a slot",
        f"legacy mode: {legacy['ops_per_s'] / 1e6:.1f} M ops/s "
        f"({cluster['ops_per_s'] / legacy['ops_per_s']:.2f}x), {legacy['device_lock_per_slot']:.4f} a slot",
        shown(cmd, ztier),
    ]]


def wait_for(path, seconds=10):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if os.path.exists(path) and os.path.getsize(path) > 0:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{path} did not appear within {seconds} s")


def nbd_rows(ztier, corpus, rounds):
    """nbdcopy in and out of `ztier serve` (lz4) and of nbdkit's memory plugin (sparse): no
    --json exists for this, so it is timed here; medians of `rounds`, servers alternating."""
    if not (shutil.which("nbdkit") and shutil.which("nbdcopy") and shutil.which("zstd")):
        return [], "nbdkit, nbdcopy or zstd is missing (scripts/setup.sh installs them): no NBD row"
    work = tempfile.mkdtemp(prefix="ztier-benchmarks-")
    try:
        image = os.path.join(work, "disk.img")
        subprocess.run(["zstd", "-dqf", corpus, "-o", image], check=True)
        size = os.path.getsize(image)
        size_arg = str(((size + 4095) // 4096) * 4096)
        servers = {
            "ztier serve, lz4": lambda sock, pid: [ztier, "serve", "--size", size_arg, "--socket", sock,
                                                  "--compressor", "lz4", "--pidfile", pid, "--quiet"],
            "nbdkit memory, sparse": lambda sock, pid: ["nbdkit", "-f", "-U", sock, "-P", pid, "memory", size_arg],
        }
        timings = {name: {"write": [], "read": []} for name in servers}
        for _ in range(rounds):
            for name, argv in servers.items():
                sock, pid = os.path.join(work, "s.sock"), os.path.join(work, "s.pid")
                for p in (sock, pid):
                    if os.path.exists(p):
                        os.remove(p)
                server = subprocess.Popen(argv(sock, pid), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                try:
                    wait_for(pid)
                    uri = f"nbd+unix:///?socket={sock}"
                    t = time.monotonic()
                    subprocess.run(["nbdcopy", image, uri], check=True)
                    timings[name]["write"].append(size / (time.monotonic() - t) / 1e6)
                    t = time.monotonic()
                    subprocess.run(["nbdcopy", uri, "null:"], check=True)
                    timings[name]["read"].append(size / (time.monotonic() - t) / 1e6)
                finally:
                    server.terminate()
                    server.wait()
        z, n = timings["ztier serve, lz4"], timings["nbdkit memory, sparse"]
        corpus_name = os.path.basename(corpus).split(".")[0]
        command = f"python3 scripts/benchmarks.py (nbdcopy in and out, {rounds} rounds)"
        rows = []
        for way in ("write", "read"):
            zm, nm = statistics.median(z[way]), statistics.median(n[way])
            rows.append([
                f"NBD {way} (nbdcopy), {corpus_name}, ztier serve lz4",
                f"{zm:.0f} MB/s",
                f"nbdkit memory (sparse, uncompressed) {nm:.0f} MB/s ({zm / nm:.2f}x)",
                command,
            ])
        return rows, None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ztier", help="the ztier binary (default: build target/release/ztier)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    ap.add_argument("--rounds", type=int, default=3, help="NBD rounds (medians)")
    args = ap.parse_args()

    ztier = args.ztier
    if not ztier:
        cargo = ["cargo", "build", "--release", "-q", "-p", "ztier-cli"]
        if os.environ.get("ZTIER_BUILD_LOCK"):
            cargo = ["flock", os.environ["ZTIER_BUILD_LOCK"]] + cargo
        subprocess.run(cargo, check=True, cwd=ROOT)
        target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
        ztier = os.path.join(target, "release", "ztier")
    ztier = os.path.abspath(ztier)

    started = time.monotonic()
    paths = corpora()
    sample = os.path.join(ROOT, "samples", "sample.pages.zst")
    if sample not in paths:
        paths = paths + [sample]
    smallest = min(paths, key=os.path.getsize)
    notes = []
    sections = [
        ("zram: the main job, store and load against the raw compressor, memory against the kernel's",
         zram_rows(ztier, paths)),
        ("zswap: store and load against the raw compressor, and zram's swap-in", zswap_rows(ztier, paths)),
        ("Compression units: larger units against 4 KiB pages", unit_rows(ztier, smallest)),
        ("A userfaultfd region: faults against a bare handler, page-out against the kernel's",
         region_rows(ztier, smallest)),
        ("The swap-slot allocator: the cluster mode against the legacy one", swap_alloc_rows(ztier)),
    ]
    # nbd-bench.sh's default corpus where the shared corpus is here, else the smallest.
    nbd_corpus = next((p for p in paths if os.path.basename(p).startswith("postgres.")), smallest)
    nbd, why = nbd_rows(ztier, nbd_corpus, args.rounds)
    if why:
        notes.append(why)
    sections.append(("The NBD server against nbdkit, the same client", nbd))
    elapsed = time.monotonic() - started

    m = machine()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks: the current figure of each path",
        "",
        "Generated by `python3 scripts/benchmarks.py` from the CLI's `--json` output; do not",
        "edit by hand, run it again. Each figure is one run on the machine below, beside the",
        "reference measured in the same run; the guides say what each path is, and",
        "[diary.md](diary.md) how the figures moved and why.",
        "",
        f"- date: {now}",
        f"- machine: {m['nproc']} CPUs, {m['cpu']}, Linux {m['kernel']}",
        "- corpora: " + ", ".join(f"`{os.path.relpath(p, ROOT)}`" for p in paths),
        f"- the whole run took {elapsed:.0f} s",
        "",
        "The `ztier` of the commands is the binary built from this checkout",
        "(`target/release/ztier`, or the installed one).",
    ]
    for note in notes:
        lines += ["", f"Note: {note}."]
    for title, rows in sections:
        if not rows:
            continue
        lines += ["", f"## {title}", "", "| path | figure | reference | command |", "|---|---|---|---|"]
        for path, figure, reference, command in rows:
            lines.append(f"| {path} | {figure} | {reference} | `{command}` |")
    lines += [
        "",
        "## Not regenerated here",
        "",
        "These take minutes, a guest VM or a Ceph cluster; their scripts print their own tables,",
        "and the guides hold the last figures with the day they were taken:",
        "",
        "| path | command | guide |",
        "|---|---|---|",
        "| a VM's swap on ztier against nbdkit, a host file and the guest's zram | `bash scripts/vm-swap.sh --swap all` | [vm-swap.md](vm-swap.md) |",
        "| the NBD server against nbdkit (sparse, zstd, lz4) with nbdcopy and fio, medians of rounds | `bash scripts/nbd-bench.sh` | [vm-swap.md](vm-swap.md#how-fast-against-nbdkit) |",
        "| the far tier on Ceph against `rados bench` | `bash scripts/ceph-bench.sh` | [far-tier.md](far-tier.md#cold-pages-on-a-ceph-cluster) |",
        "| a host of 1 to 256 devices: RSS, metadata, speed | `cargo run --release -p ztier-host --example host_figures -- rss` | [host.md](host.md) |",
        "| the compressors against liblz4 and liblzo2 (criterion) | `cargo bench -p ztier-pool -p ztier-compress && python3 scripts/bench-summary.py` | [measure.md](measure.md#benchmarks) |",
    ]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.relpath(args.out, ROOT)} in {elapsed:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
