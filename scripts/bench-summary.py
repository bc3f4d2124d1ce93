#!/usr/bin/env python3
"""Prints criterion results (target/criterion) as a table: mean time per iteration and,
within each group and parameter, the ratio of every function to the group's reference
(memcpy, liblz4, liblzo2...). Usage: scripts/bench-summary.py [GROUP...]"""
import json, os, sys

root = os.path.join(os.path.dirname(__file__), "..", "target", "criterion")
rows = {}
for dirpath, _, files in os.walk(root):
    if "benchmark.json" in files and os.path.basename(dirpath) == "new":
        b = json.load(open(os.path.join(dirpath, "benchmark.json")))
        e = json.load(open(os.path.join(dirpath, "estimates.json")))
        g = b["group_id"]
        if len(sys.argv) > 1 and g not in sys.argv[1:]:
            continue
        tp = b.get("throughput") or {}
        nbytes = tp.get("Bytes") or tp.get("BytesDecimal")
        rows.setdefault((g, b.get("value_str") or ""), {})[b["function_id"]] = (e["mean"]["point_estimate"], nbytes)
REFS = ("memcpy", "memcpy-hot", "liblz4", "liblzo2", "raw")

def reference(fns, f):
    """The reference a function is measured against: its C library where there is one
    (lz4 -> liblz4, lzo and lzo-rle -> liblzo2), else the group's memcpy or raw."""
    for prefix, ref in (("lz4hc", None), ("lz4", "liblz4"), ("lzo", "liblzo2")):
        if f.startswith(prefix):
            return fns[ref][0] if ref in fns else None
    return next((fns[r][0] for r in ("memcpy", "raw") if r in fns), None)

for (g, v), fns in sorted(rows.items()):
    for f, (ns, nbytes) in sorted(fns.items()):
        ref = reference(fns, f)
        mbs = f"{nbytes / ns * 1e3:9.1f} MB/s" if nbytes else ""
        ratio = f"  {ref / ns:5.2f}x ref" if ref and f not in REFS else ""
        print(f"{g:<22} {v:<18} {f:<14} {ns:10.1f} ns {mbs}{ratio}")
