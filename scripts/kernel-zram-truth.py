#!/usr/bin/env python3
"""Measures what this machine's kernel zram makes of a corpus file, in the format of
../shared/corpus/*.truth.json (which ztier_corpus::Truth reads): for each algorithm, a fresh
device gets the raw pages by `dd oflag=direct`, then mm_stat, compact, mm_stat; then on
another fresh device, the write, every odd page discarded (BLKDISCARD), mm_stat, then compact
twice, mm_stat after each. Needs root and /sys/class/zram-control.

Usage: sudo scripts/kernel-zram-truth.py CORPUS.pages[.zst] > CORPUS.truth.json"""
import fcntl, hashlib, json, os, struct, subprocess, sys, tempfile, time

FIELDS = ["orig_data_size", "compr_data_size", "mem_used_total", "mem_limit", "mem_used_max",
          "same_pages", "pages_compacted", "huge_pages", "huge_pages_since"]
BLKDISCARD = 0x1277
PAGE = 4096

def mm_stat(dev):
    vals = open(f"/sys/block/{dev}/mm_stat").read().split()
    return dict(zip(FIELDS, map(int, vals[:9])))

def sysfs(dev, attr, value):
    with open(f"/sys/block/{dev}/{attr}", "w") as f:
        f.write(str(value))

def fresh_device(raw_path, size, alg):
    """A new zram device holding the corpus; returns (name, number, write seconds)."""
    n = int(open("/sys/class/zram-control/hot_add").read())
    dev = f"zram{n}"
    sysfs(dev, "comp_algorithm", alg)
    sysfs(dev, "disksize", (size + (1 << 20) - 1) // (1 << 20) * (1 << 20))
    t = time.monotonic()
    subprocess.run(["dd", f"if={raw_path}", f"of=/dev/{dev}", "bs=1M", "oflag=direct",
                    "conv=fsync", "status=none"], check=True)
    return dev, n, time.monotonic() - t

def remove_device(dev, n):
    sysfs(dev, "reset", 1)
    with open("/sys/class/zram-control/hot_remove", "w") as f:
        f.write(str(n))

def measure(raw_path, size, alg):
    dev, n, write_s = fresh_device(raw_path, size, alg)
    try:
        after_write = mm_stat(dev)
        sysfs(dev, "compact", 1)
        after_compact_only = mm_stat(dev)
    finally:
        remove_device(dev, n)
    dev, n, _ = fresh_device(raw_path, size, alg)
    try:
        after_write = mm_stat(dev)
        fd = os.open(f"/dev/{dev}", os.O_RDWR)
        try:
            for i in range(1, size // PAGE, 2):
                fcntl.ioctl(fd, BLKDISCARD, struct.pack("QQ", i * PAGE, PAGE))
        finally:
            os.close(fd)
        after_discard = mm_stat(dev)
        sysfs(dev, "compact", 1)
        after_compact = mm_stat(dev)
        sysfs(dev, "compact", 1)
        after_second = mm_stat(dev)
        return {
            "mm_stat": after_write,
            "mm_stat_after_compact": after_compact_only,
            "write_MBps": round(size / write_s / 1e6, 1),
            "discard_odd_pages_then_compact": {
                "pages_discarded": len(range(1, size // PAGE, 2)),
                "after_write": after_write,
                "after_discard": after_discard,
                "after_compact": after_compact,
                "after_second_compact": after_second,
            },
        }
    finally:
        remove_device(dev, n)

def kernel_config():
    """The configuration the figures depend on, from /proc/config.gz."""
    import gzip
    config = {}
    with gzip.open("/proc/config.gz", "rt") as f:
        for line in f:
            if line.startswith("CONFIG_ZSMALLOC_CHAIN_SIZE="):
                config["CONFIG_ZSMALLOC_CHAIN_SIZE"] = int(line.split("=")[1])
            if line.startswith("CONFIG_ZRAM_DEF_COMP="):
                config["CONFIG_ZRAM_DEF_COMP"] = line.split("=")[1].strip().strip('"')
    config["PAGE_SIZE"] = os.sysconf("SC_PAGE_SIZE")
    config["arch"] = os.uname().machine
    return config

def refuse(why):
    print(f"kernel-zram-truth: cannot run: {why}", file=sys.stderr)
    sys.exit(2)

def main():
    if len(sys.argv) != 2:
        refuse("usage: kernel-zram-truth.py CORPUS.pages[.zst] > CORPUS.truth.json")
    path = sys.argv[1]
    if os.geteuid() != 0:
        refuse("needs root (zram's hot_add, sysfs attributes and its block device)")
    if not os.path.exists("/sys/class/zram-control"):
        subprocess.run(["modprobe", "zram", "num_devices=0"], capture_output=True)
    if not os.path.exists("/sys/class/zram-control"):
        refuse("this kernel has no zram (/sys/class/zram-control; modprobe zram failed)")
    if not os.path.exists("/proc/config.gz"):
        refuse("no /proc/config.gz: the figures need the kernel's CONFIG_ZSMALLOC_CHAIN_SIZE")
    if not os.path.isfile(path):
        refuse(f"{path}: no such file")
    with tempfile.TemporaryDirectory() as tmp:
        raw = path
        if path.endswith(".zst"):
            raw = os.path.join(tmp, "corpus.pages")
            subprocess.run(["zstd", "-q", "-d", path, "-o", raw], check=True)
        data = open(raw, "rb").read()
        name = os.path.basename(path).split(".pages")[0]
        algs = open("/sys/block/zram0/comp_algorithm").read().replace("[", "").replace("]", "").split() \
            if os.path.exists("/sys/block/zram0") else ["lzo-rle", "lzo", "lz4"]
        out = {
            "corpus": name,
            "pages": len(data) // PAGE,
            "raw_sha256": hashlib.sha256(data).hexdigest(),
            "kernel": os.uname().release,
            "kernel_config": kernel_config(),
            "method": "scripts/kernel-zram-truth.py: hot_add; comp_algorithm; disksize; dd oflag=direct bs=1M; "
                      "mm_stat; compact; mm_stat; reset; the same write; BLKDISCARD every odd page; mm_stat; "
                      "compact; mm_stat; compact; mm_stat",
            "zram": {alg: measure(raw, len(data), alg) for alg in algs},
        }
        json.dump(out, sys.stdout, indent=1)
        print()

if __name__ == "__main__":
    main()
