#!/usr/bin/env python3
"""Measures what this machine's kernel zswap makes of corpus files, in the format of
../shared/corpus/zswap-truth.json (which ztier_corpus::Corpus::zswap_truth reads and
`ztier bench --front zswap` compares with).

For each corpus and compressor: zswap enabled on zsmalloc with that compressor, the
shrinker off, max_pool_percent 20 (raised if the corpus needs more), a swap file of its own
at the highest priority; the corpus's pages copied in order into one anonymous private
mapping of this process (no huge pages), swapped out with madvise(MADV_PAGEOUT) (repeated
while it still moves pages: a page still in a per-CPU LRU batch is skipped by one call),
the zswap debugfs counters, /proc/meminfo's Zswap and Zswapped and vmstat's swpout_zero
read before and after; then every page faulted back in and compared with the corpus. The
figures are the differences. zswap's parameters are put back, the swap file switched off
and removed, whatever happens.

A clean run, the only kind whose figures are kept: zswap's pool empty when it starts
(debugfs stored_pages 0 and pool_total_size 0: no other page in zswap whose zspages the
corpus's objects could share, no fragmentation left by a run before; the script waits for
that, and if it does not come, switches its own swap file off and on again, which takes
back every page held on it), and afterwards its stored pages and zero pages adding up to
exactly the corpus's pages (nothing else went through swap meanwhile). A figure is written
only when two consecutive clean runs agree on every counter taken (stored pages,
incompressible pages, pool_total_size, zero pages, written back); otherwise, after six
runs, the script refuses (exit 2) and writes nothing.

Refuses, saying why, where it cannot run: not root, no zswap in this kernel, a compressor
the kernel's crypto API does not offer zswap, a swap file that cannot be switched on,
zswap's pool not emptying (pages of another swap device in it), no two clean runs agreeing.

Usage: sudo scripts/kernel-zswap-truth.py [--compressor ALG]... [--swap-dir DIR]
           CORPUS.pages[.zst]... > DIR/zswap-truth.json
(ALG default: lzo and lzo-rle. The swap file goes in --swap-dir, default /var/tmp: it
cannot be on tmpfs.)"""
import argparse, json, mmap, os, subprocess, sys, tempfile, time

PAGE = 4096
MADV_PAGEOUT = 21
MADV_NOHUGEPAGE = 15
PARAMS = "/sys/module/zswap/parameters"
DEBUGFS = "/sys/kernel/debug"


def refuse(why):
    print(f"kernel-zswap-truth: cannot run: {why}", file=sys.stderr)
    sys.exit(2)


def param(name, value=None):
    path = f"{PARAMS}/{name}"
    if value is None:
        return open(path).read().strip()
    with open(path, "w") as f:
        f.write(str(value))


def debugfs_counters():
    d = f"{DEBUGFS}/zswap"
    return {name: int(open(f"{d}/{name}").read()) for name in os.listdir(d)}


def meminfo():
    out = {}
    for line in open("/proc/meminfo"):
        key, value = line.split(":", 1)
        if key in ("Zswap", "Zswapped", "SwapFree"):
            out[key] = int(value.split()[0])
    return out


def vmstat(key):
    for line in open("/proc/vmstat"):
        k, v = line.split()
        if k == key:
            return int(v)
    return 0


def vm_swap_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmSwap:"):
            return int(line.split()[1])
    return 0


def page_kinds(data):
    zero = same = 0
    for i in range(0, len(data), PAGE):
        page = data[i:i + PAGE]
        if page.count(page[:8]) == PAGE // 8:
            if page[:8] == bytes(8):
                zero += 1
            else:
                same += 1
    return zero, same


# What two clean runs must agree on for a figure to be written.
AGREE = ("stored_pages", "stored_incompressible_pages", "pool_total_size", "swpout_zero",
         "written_back_pages")
RUNS = 6


def pool_empty():
    c = debugfs_counters()
    return c.get("stored_pages", 0) == 0 and c.get("pool_total_size", 0) == 0


def wait_pool_empty(seconds):
    deadline = time.monotonic() + seconds
    while not pool_empty():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def empty_the_pool(swapfile):
    """zswap's pool empty before a run: a run's own pages leave it as its mapping is
    unmapped; another process's pages on this script's swap file are taken back by switching
    the file off and on again. Refuses if the pool still holds pages (another swap
    device's)."""
    if wait_pool_empty(2):
        return
    subprocess.run(["swapoff", swapfile], check=False)
    r = subprocess.run(["swapon", "-p", "32767", swapfile], capture_output=True, text=True)
    if r.returncode:
        refuse(f"swapon {swapfile} again (to empty zswap's pool): {r.stderr.strip()}")
    if not wait_pool_empty(5):
        c = debugfs_counters()
        refuse(f"zswap's pool does not empty ({c.get('stored_pages')} pages stored, "
               f"pool_total_size {c.get('pool_total_size')}) after swapoff and swapon of "
               f"{swapfile}: pages of another swap device are in it, and a run on a pool "
               "holding other pages is not the corpus's figure")


def measure(data, alg, swapfile):
    """The figures of two consecutive clean runs that agree (see the header). The counters
    are the whole system's: a run on a pool not empty, or during which anything else went
    through swap, is not clean."""
    last = None
    for _ in range(RUNS):
        empty_the_pool(swapfile)
        figures = measure_once(data, alg)
        if figures["stored_pages"] + figures["swpout_zero"] != figures["pages"]:
            print(f"kernel-zswap-truth: {alg}: {figures['stored_pages']} stored and "
                  f"{figures['swpout_zero']} zero pages for {figures['pages']}: something else "
                  "swapped meanwhile, measuring again from an empty pool", file=sys.stderr)
            last = None
            continue
        if last is not None and all(last[k] == figures[k] for k in AGREE):
            return figures
        if last is not None:
            print(f"kernel-zswap-truth: {alg}: two clean runs differ "
                  f"({', '.join(f'{k} {last[k]} then {figures[k]}' for k in AGREE if last[k] != figures[k])}), "
                  "measuring again", file=sys.stderr)
        last = figures
    refuse(f"{alg}: no two consecutive clean runs agreed in {RUNS} (other swapping on this "
           "machine?): no figure written")


def measure_once(data, alg):
    param("compressor", alg)
    if param("compressor") != alg:
        refuse(f"zswap did not take compressor {alg}")
    pages = len(data) // PAGE
    # On one CPU, the pages just written wait in that CPU's LRU batch, which MADV_PAGEOUT
    # drains first: one call then takes them all, in address order.
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    area = mmap.mmap(-1, len(data), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.madvise(MADV_NOHUGEPAGE)
        area[:] = data
        before, mem_before, zero_before = debugfs_counters(), meminfo(), vmstat("swpout_zero")
        t = time.monotonic()
        passes = 0
        swapped = -1
        while passes < 8 and vm_swap_kb() != swapped:
            swapped = vm_swap_kb()
            area.madvise(MADV_PAGEOUT)
            passes += 1
        pageout_s = time.monotonic() - t
        after, mem_after, zero_after = debugfs_counters(), meminfo(), vmstat("swpout_zero")
        if vm_swap_kb() < pages * 4:
            refuse(f"only {vm_swap_kb()} kB of the {pages * 4} kB were swapped out "
                   f"({alg}): is the swap file too small, or memory locked?")
        t = time.monotonic()
        same = area[:] == data
        faultin_s = time.monotonic() - t
        if not same:
            refuse(f"the pages read back through zswap ({alg}) differ from the corpus")
    finally:
        area.close()
    delta = lambda k: after.get(k, 0) - before.get(k, 0)
    zero, nonzero_same = page_kinds(data)
    return {
        "pages": pages,
        "zero_pages": zero,
        "nonzero_same_filled_pages": nonzero_same,
        "stored_pages": delta("stored_pages"),
        "stored_incompressible_pages": delta("stored_incompressible_pages"),
        "pool_total_size": delta("pool_total_size"),
        "written_back_pages": delta("written_back_pages"),
        "Zswap_kB": mem_after["Zswap"] - mem_before["Zswap"],
        "Zswapped_kB": mem_after["Zswapped"] - mem_before["Zswapped"],
        "swpout_zero": zero_after - zero_before,
        "pageout_passes": passes,
        "rejected": {k: delta(k) for k in sorted(after) if k.startswith("reject_") and delta(k)},
        "pageout_MBps_median": round(len(data) / pageout_s / 1e6, 1),
        "faultin_MBps_median": round(len(data) / faultin_s / 1e6, 1),
    }


def read_corpus(path, tmp):
    raw = path
    if path.endswith(".zst"):
        raw = os.path.join(tmp, "corpus.pages")
        subprocess.run(["zstd", "-q", "-f", "-d", path, "-o", raw], check=True)
    data = open(raw, "rb").read()
    if raw != path:
        os.unlink(raw)
    if not data or len(data) % PAGE:
        refuse(f"{path}: not a whole number of {PAGE}-byte pages")
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compressor", action="append", dest="algs")
    ap.add_argument("--swap-dir", default="/var/tmp")
    ap.add_argument("corpora", nargs="+")
    args = ap.parse_args()
    algs = args.algs or ["lzo", "lzo-rle"]
    if os.geteuid() != 0:
        refuse("needs root (zswap's parameters, swapon, debugfs)")
    if not os.path.isdir(PARAMS):
        refuse("this kernel has no zswap (/sys/module/zswap)")
    crypto = {line.split(":", 1)[1].strip() for line in open("/proc/crypto") if line.startswith("name")}
    for alg in algs:
        if alg not in crypto:
            refuse(f"the kernel's crypto API offers no {alg} (it has: "
                   f"{', '.join(sorted(a for a in crypto if a in ('lzo', 'lzo-rle', 'lz4', 'lz4hc', 'zstd', 'deflate', '842')))})")
    if not os.path.isdir(f"{DEBUGFS}/zswap") and not os.listdir(DEBUGFS):
        subprocess.run(["mount", "-t", "debugfs", "none", DEBUGFS], check=False)
    saved = {p: param(p) for p in ("enabled", "compressor", "max_pool_percent", "shrinker_enabled")
             if os.path.exists(f"{PARAMS}/{p}")}
    if os.path.exists(f"{PARAMS}/zpool") and param("zpool") != "zsmalloc":
        refuse(f"zswap's zpool is {param('zpool')}, the figures are zsmalloc's")
    with tempfile.TemporaryDirectory() as tmp:
        corpora = {os.path.basename(p).split(".pages")[0]: read_corpus(p, tmp) for p in args.corpora}
        largest = max(len(d) for d in corpora.values())
        total = os.sysconf("SC_PHYS_PAGES") * PAGE
        swapfile = os.path.join(args.swap_dir, f"ztier-zswap-truth-{os.getpid()}.swap")
        swapped_on = False
        try:
            param("enabled", "N")
            param("shrinker_enabled", "N")
            param("max_pool_percent", max(20, min(100, 2 * largest * 100 // total + 1)))
            size = largest + (16 << 20)
            with open(swapfile, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                try:
                    os.posix_fallocate(f.fileno(), 0, size)
                except OSError:
                    f.truncate(0)
                    chunk = bytes(1 << 20)
                    for _ in range(size >> 20):
                        f.write(chunk)
            r = subprocess.run(["mkswap", swapfile], capture_output=True, text=True)
            if r.returncode:
                refuse(f"mkswap {swapfile}: {r.stderr.strip()}")
            r = subprocess.run(["swapon", "-p", "32767", swapfile], capture_output=True, text=True)
            if r.returncode:
                refuse(f"swapon {swapfile} ({args.swap_dir} must be a disk file system, not tmpfs): "
                       f"{r.stderr.strip()}")
            swapped_on = True
            param("enabled", "Y")
            if not os.path.isdir(f"{DEBUGFS}/zswap"):
                refuse(f"no {DEBUGFS}/zswap (debugfs not mounted, or zswap did not start)")
            out = {
                "kernel": os.uname().release,
                "page_size": PAGE,
                "how": "scripts/kernel-zswap-truth.py: each corpus's pages copied in order into an "
                       "anonymous private mapping of one process (no huge pages) and swapped out with "
                       "madvise(MADV_PAGEOUT) through the kernel's zswap (zsmalloc, shrinker off, no "
                       "writeback) to a swap file of its own; the zswap debugfs counters, /proc/meminfo "
                       "and vmstat swpout_zero differences across the swap-out; every page faulted back "
                       "in and verified.",
                "corpora": {name: {alg: measure(data, alg, swapfile) for alg in algs}
                            for name, data in corpora.items()},
            }
        finally:
            if swapped_on:
                subprocess.run(["swapoff", swapfile], check=False)
            if os.path.exists(swapfile):
                os.unlink(swapfile)
            for p, v in saved.items():
                try:
                    param(p, v)
                except OSError:
                    pass
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
