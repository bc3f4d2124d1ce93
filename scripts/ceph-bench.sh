#!/usr/bin/env bash
# ztier's far tier on a Ceph cluster against what the cluster itself gives, in one run:
# a throwaway cluster (scripts/ceph-cluster.sh), `rados bench` with 64 KiB objects and 16
# in flight (writes, then random reads of what it wrote), then `ztier bench --writeback-nbd`
# on each corpus (lz4, packed: every page written back to the RBD image through
# qemu-storage-daemon's NBD export, read back and verified), then `rados bench` again. The
# reference is the mean of the two rados runs; everything is compared in compressed bytes a
# second (what crosses to the store), in MB (10^6 bytes):
#   - writeback: bd_stat.bytes_stored / writeback time, against rados bench write;
#   - read-back: bd_stat.bytes_stored / read-back time, against rados bench rand;
#   - store bytes: writeback_bytes (what was written to the store) / bytes_stored.
# The goals for a Ceph store: writeback >= 0.7x, read-back >= 0.5x, store bytes <= 1.02x.
#
# With --store nbdkit, the same ztier bench against nbdkit's memory plugin instead (no
# cluster, no rados): the far tier's speed on a store with no network and no replication.
#
# Usage: [ZTIER=BINARY] scripts/ceph-bench.sh [--store ceph|nbdkit] [--osds N] [--secure]
#                              [--seconds S] [--json FILE]
#                              [CORPUS.pages.zst ...]   (default: every corpus of ../shared/corpus)
# Needs: scripts/setup.sh's packages; builds ztier in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
store=ceph
osds=2
seconds=10
json_out=""
secure=()
corpora=()
while [ $# -gt 0 ]; do
  case $1 in
  --store) store=$2; shift 2 ;;
  --osds) osds=$2; shift 2 ;;
  --seconds) seconds=$2; shift 2 ;;
  --json) json_out=$2; shift 2 ;;
  --secure) secure=(--secure); shift ;;
  -*) sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
  *) corpora+=("$1"); shift ;;
  esac
done
if [ ${#corpora[@]} -eq 0 ]; then
  corpora=(../shared/corpus/postgres.pages.zst ../shared/corpus/python.pages.zst ../shared/corpus/cc1.pages.zst)
fi
for c in "${corpora[@]}"; do [ -f "$c" ] || { echo "ceph-bench: no corpus $c" >&2; exit 1; }; done
for tool in python3 rados nbdkit; do
  command -v "$tool" >/dev/null || { echo "ceph-bench: $tool is not installed (scripts/setup.sh)" >&2; exit 1; }
done
if [ -n "${ZTIER:-}" ]; then
  ztier=$ZTIER # a ztier built elsewhere (another commit's), to compare
else
  cargo build --release -q -p ztier-cli
  ztier=$PWD/target/release/ztier
fi

work=$(mktemp -d /tmp/ceph-bench.XXXXXX)
cluster=$work/cluster
nbdkit_pid=""
cleanup() {
  if [ -n "$nbdkit_pid" ]; then kill "$nbdkit_pid" 2>/dev/null || true; fi
  if [ -e "$cluster/ceph.conf" ]; then bash scripts/ceph-cluster.sh down "$cluster" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# rados bench MODE (write, rand) for $seconds; prints bytes a second from its totals (its
# own "MB/sec" is MiB).
rados_bench() {
  local mode=$1 out
  if [ "$mode" = write ]; then
    out=$(rados -c "$conf" -p rbd bench "$seconds" write -b 65536 -O 65536 -t 16 --no-cleanup 2>&1)
  else
    out=$(rados -c "$conf" -p rbd bench "$seconds" rand -t 16 2>&1)
  fi
  awk -F: '/^Total time run/ { t = $2 } /^Total (writes|reads) made/ { n = $2 }
    /^(Write|Read) size/ { s = $2 } END { if (t > 0) printf "%.0f\n", n * s / t; else exit 1 }' <<<"$out" ||
    { echo "ceph-bench: rados bench $mode failed:" >&2; echo "$out" >&2; exit 1; }
}

echo "ceph-bench: load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ "$store" = ceph ]; then
  echo "ceph-bench: a cluster of $osds OSD(s) in $cluster" >&2
  uri=$(bash scripts/ceph-cluster.sh up "$cluster" --osds "$osds" --image-size 2G "${secure[@]}")
  conf=$(bash scripts/ceph-cluster.sh conf "$cluster")
  echo "ceph-bench: rados bench, ${seconds} s each" >&2
  w1=$(rados_bench write)
  r1=$(rados_bench rand)
  rados -c "$conf" -p rbd cleanup >/dev/null
elif [ "$store" = nbdkit ]; then
  nbdkit --foreground --exit-with-parent --unix "$work/nbdkit.sock" memory 2G &
  nbdkit_pid=$!
  for _ in $(seq 200); do [ -S "$work/nbdkit.sock" ] && break; sleep 0.05; done
  uri="nbd+unix:///?socket=$work/nbdkit.sock"
else
  echo "ceph-bench: --store ceph or nbdkit" >&2
  exit 2
fi

: >"$work/runs.json"
for c in "${corpora[@]}"; do
  echo "ceph-bench: ztier bench --writeback-nbd on $c" >&2
  "$ztier" bench --corpus "$c" --compressor lz4 --writeback-nbd "$uri" --writeback-format packed \
    --json >>"$work/runs.json"
done

w2="" r2=""
if [ "$store" = ceph ]; then
  echo "ceph-bench: rados bench again" >&2
  w2=$(rados_bench write)
  r2=$(rados_bench rand)
  rados -c "$conf" -p rbd cleanup >/dev/null
fi

echo "ceph-bench: load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
STORE=$store OSDS=$osds SECURE=${secure:+, msgr2 secure} W1=${w1:-} R1=${r1:-} W2=$w2 R2=$r2 JSON_OUT=$json_out python3 - "$work/runs.json" <<'EOF'
import json, os, sys

runs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
env = os.environ
ceph = env["STORE"] == "ceph"
if ceph:
    w = [float(env["W1"]), float(env["W2"])]
    r = [float(env["R1"]), float(env["R2"])]
    rados_w, rados_r = sum(w) / 2, sum(r) / 2
    print(f"rados bench (64 KiB, 16 in flight): write {w[0]/1e6:.1f} and {w[1]/1e6:.1f} MB/s, "
          f"rand read {r[0]/1e6:.1f} and {r[1]/1e6:.1f} MB/s (before and after ztier)")
    store = f"Ceph, {env['OSDS']} OSD(s), size {min(int(env['OSDS']), 3)}{env['SECURE']}"
else:
    store = "nbdkit memory"
print(f"ztier bench --writeback-nbd ({store}), lz4, packed:")
hdr = ("corpus", "pages wb", "compr MB", "store/compr", "wb MB/s pages", "wb MB/s compr",
       "rb MB/s pages", "rb MB/s compr")
if ceph:
    hdr += ("wb/rados", "rb/rados")
print("  " + "  ".join(f"{h:>13}" for h in hdr))
out = []
for run in runs:
    assert run["verified"], run
    ps = run["page_size"]
    pages = run["pages_written_back"]
    stored = run["bd_stat"]["bytes_stored"]
    wb_s = pages * ps / 1e6 / run["writeback_mb_s"]
    rb_s = run["pages"] * ps / 1e6 / run["readback_mb_s"]
    row = {
        "corpus": run["corpus"], "store": store, "pages_written_back": pages,
        "compressed_bytes": stored, "store_bytes_ratio": run["writeback_bytes"] / stored,
        "writeback_mb_s": run["writeback_mb_s"], "writeback_compressed_mb_s": stored / wb_s / 1e6,
        "readback_mb_s": run["readback_mb_s"], "readback_compressed_mb_s": stored / rb_s / 1e6,
    }
    cells = [row["corpus"], pages, f"{stored/1e6:.1f}", f"{row['store_bytes_ratio']:.3f}",
             f"{row['writeback_mb_s']:.1f}", f"{row['writeback_compressed_mb_s']:.1f}",
             f"{row['readback_mb_s']:.1f}", f"{row['readback_compressed_mb_s']:.1f}"]
    if ceph:
        row["rados_write_mb_s"] = rados_w / 1e6
        row["rados_rand_mb_s"] = rados_r / 1e6
        row["writeback_vs_rados"] = row["writeback_compressed_mb_s"] * 1e6 / rados_w
        row["readback_vs_rados"] = row["readback_compressed_mb_s"] * 1e6 / rados_r
        cells += [f"{row['writeback_vs_rados']:.3f}x", f"{row['readback_vs_rados']:.3f}x"]
    print("  " + "  ".join(f"{c:>13}" for c in cells))
    out.append(row)
if ceph:
    ok = all(r["writeback_vs_rados"] >= 0.7 and r["readback_vs_rados"] >= 0.5
             and r["store_bytes_ratio"] <= 1.02 for r in out)
    print("goals (writeback >= 0.7x, read-back >= 0.5x rados, store <= 1.02x compressed): "
          + ("met" if ok else "NOT met"))
if env["JSON_OUT"]:
    json.dump({"runs": runs, "rows": out}, open(env["JSON_OUT"], "w"), indent=1)
EOF
