#!/usr/bin/env bash
# The same client (nbdcopy, its defaults) and the same real-memory corpus against
# `ztier serve` and against nbdkit's memory plugin, in one run: write MB/s, read MB/s and
# the server's RSS after the write (at rest), each also as a ratio to nbdkit's allocator=zstd. For
# ztier, also its mem_used_total and whether RSS <= 1.05 x mem_used_total + 8 MiB. "ztier
# plain" is the same server over an uncompressed RAM disk: the protocol's own ceiling.
#
# For the reads, also the CPU each side spent a GB (the server's from /proc, nbdcopy's from
# the shell's `time`): on a 2-core machine the two share the cores, so a server that
# decompresses (ztier lz4) against one that copies stored bytes (nbdkit sparse) is capped by
# the sum of the two sides' CPU a GB, whatever its threads do.
#
# "nbdkit lz4" is nbdkit doing ztier lz4's job: scripts/nbdkit-lz4.c, the memory plugin's
# sparse allocator with each 4 KiB page kept as liblz4 compressed it and decompressed on
# read, built here. Its reads against nbdkit sparse's are what decompressing every page
# costs nbdkit's server; ztier lz4's against it, what ztier's server makes of the same work.
#
# Then fio's nbd engine, 4 KiB random 50/50 reads and writes at queue depth 32, buffers 60 %
# compressible, 256 MiB, 10 s, against ztier lz4 and plain and nbdkit zstd and sparse: IOPS,
# and the ratio to nbdkit zstd.
#
# Each server runs ROUNDS times (default 3), the servers taking turns within a round, and
# the median of each figure is printed: on this 2-core VM one nbdcopy run of nbdkit zstd
# moves between 337 and 524 MB/s, so a single round's ratio is mostly noise.
#
# Usage: [ROUNDS=N] scripts/nbd-bench.sh [CORPUS.pages.zst ...]   (default: ../shared/corpus/postgres)
# Needs: nbdkit, libnbd-bin (nbdcopy), fio, zstd, a C compiler, nbdkit-plugin-dev and
# liblz4-dev (for nbdkit lz4); builds ztier in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
corpora=("$@")
rounds=${ROUNDS:-3}
[ ${#corpora[@]} -gt 0 ] || corpora=(../shared/corpus/postgres.pages.zst)
for tool in nbdkit nbdcopy fio zstd; do
  command -v "$tool" >/dev/null || { echo "nbd-bench: $tool is not installed (scripts/setup.sh)" >&2; exit 1; }
done
cargo build --release -q -p ztier-cli
ztier=target/release/ztier
work=$(mktemp -d)
# The corpus is decompressed into memory (tmpfs) where there is one: a file on disk can have
# its page cache dropped between rounds (this VM runs DAMON with a pageout scheme), and
# nbdcopy then reads it from the disk in one round and from memory in the next.
shm=$(mktemp -d -p /dev/shm 2>/dev/null || mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work" "$shm"
}
trap cleanup EXIT
cc -O2 -Wall -shared -fPIC -o "$work/nbdkit-lz4.so" scripts/nbdkit-lz4.c -llz4 || {
  echo "nbd-bench: cannot build scripts/nbdkit-lz4.c (it needs nbdkit-plugin-dev and liblz4-dev: scripts/setup.sh)" >&2
  exit 1
}

# Starts a server (the rest of the arguments) on $work/sock and waits for the socket.
start() {
  rm -f "$work/sock"
  "$@" >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 200); do [ -S "$work/sock" ] && return 0; sleep 0.05; done
  echo "nbd-bench: server did not start: $*" >&2
  cat "$work/server.log" >&2
  exit 1
}

# Starts ztier serve with compressor ALG ("plain": the uncompressed RAM disk).
start_ztier() {
  local alg=$1
  shift
  if [ "$alg" = plain ]; then
    start "$ztier" serve --quiet --socket "$work/sock" --store plain "$@"
  else
    start "$ztier" serve --quiet --socket "$work/sock" --compressor "$alg" "$@"
  fi
}

stop() {
  kill -INT "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

seconds() { # command... -> wall seconds
  local t0 t1
  t0=$(date +%s%N)
  "$@"
  t1=$(date +%s%N)
  calc "($t1 - $t0) / 1e9"
}

calc() { awk "BEGIN { print $1 }"; }

# A process's CPU seconds so far, its exited threads' included (0 if it is gone).
cpu_s() {
  awk -v tck="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) / tck }' "/proc/$1/stat" 2>/dev/null ||
    echo 0
}

# nbdcopy's read of the export to null:, its CPU seconds (user + system) left in
# $work/client.cpu.
read_to_null() {
  local TIMEFORMAT='%U %S' LC_ALL=C
  { time nbdcopy "$1" null: 2>&3; } 3>&2 2>"$work/client.time"
  awk '{ print $1 + $2 }' "$work/client.time" >"$work/client.cpu"
}

# A space-separated list of numbers, one a line, smallest first.
sorted() { tr ' ' '\n' <<<"$1" | grep . | sort -g; }
# The median and the largest of such a list.
median() { sorted "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
largest() { sorted "$1" | tail -n 1; }

for corpus in "${corpora[@]}"; do
  raw="$shm/corpus.raw"
  zstd -d -q -f "$corpus" -o "$raw"
  bytes=$(stat -c %s "$raw")
  size=$(( (bytes + 1048575) / 1048576 * 1048576 ))
  uri="nbd+unix:///?socket=$work/sock"
  printf '%s: %d bytes, nbdcopy in and out\n' "$(basename "$corpus")" "$bytes"
  printf '  %-22s %10s %10s %10s %9s %9s %9s  %s\n' server "write MB/s" "read MB/s" "RSS MiB" "write x" "read x" "RSS x" \
    "mem_used_total MiB, RSS <= 1.05x + 8 MiB"
  declare -A W R M MUT SCPU CCPU BEST
  # zram's answer to small pages, a zstd dictionary (`algorithm_params dict=`), trained here
  # on the corpus itself (the kernel's intended use: pages like those the device will hold).
  "$ztier" train-dict --corpus "$corpus" --sample 16M --size 256K -o "$work/corpus.dict" >/dev/null
  names=("nbdkit zstd" "nbdkit sparse" "nbdkit malloc" "nbdkit lz4" "ztier plain" "ztier lz4" "ztier zstd"
    "ztier zstd:dict=$work/corpus.dict" "ztier zstd:level=2,dict=$work/corpus.dict" "ztier lzo-rle")
  for round in $(seq "$rounds"); do
    for server in "${names[@]}"; do
      read -r kind alg <<<"$server"
      case $server in
        "nbdkit lz4") start nbdkit -f -U "$work/sock" "$work/nbdkit-lz4.so" size="$size" ;;
        nbdkit*) start nbdkit -f -U "$work/sock" memory size="$size" allocator="$alg" ;;
        ztier*) start_ztier "$alg" --size "$size" ;;
      esac
      w=$(seconds nbdcopy "$raw" "$uri")
      # The reference is this script's own code: its first round's pages are read back and
      # compared before any of its figures count.
      if [ "$server" = "nbdkit lz4" ] && [ "$round" = 1 ]; then
        nbdcopy "$uri" "$shm/back.raw"
        cmp -n "$bytes" "$raw" "$shm/back.raw" || { echo "nbd-bench: nbdkit lz4 read back other bytes" >&2; exit 1; }
        rm -f "$shm/back.raw"
      fi
      # RSS at rest: 1.5 s after the write, for every server alike (ztier's page helper
      # gives back its prepared chunk after 1 s without allocations, then trims idle pools).
      sleep 1.5
      rss=$(ps -o rss= -p "$server_pid" | tr -d ' ')
      if [ "$kind" = ztier ] && [ "$alg" != plain ]; then
        MUT[$server]+=" $("$ztier" stat --socket "$work/sock" --json |
          python3 -c 'import json,sys; print(json.load(sys.stdin)["mm_stat"]["mem_used_total"])')"
      fi
      s0=$(cpu_s "$server_pid")
      r=$(seconds read_to_null "$uri")
      s1=$(cpu_s "$server_pid")
      stop
      SCPU[$server]+=" $(calc "($s1 - $s0) / ($bytes / 1e9)")"
      CCPU[$server]+=" $(calc "$(cat "$work/client.cpu") / ($bytes / 1e9)")"
      W[$server]+=" $(calc "$bytes / $w / 1e6")"
      R[$server]+=" $(calc "$bytes / $r / 1e6")"
      M[$server]+=" $(calc "$rss / 1024")"
    done
  done
  for s in "${names[@]}"; do
    W[$s]=$(median "${W[$s]}")
    BEST[$s]=$(largest "${R[$s]}")
    R[$s]=$(median "${R[$s]}")
    M[$s]=$(median "${M[$s]}")
    SCPU[$s]=$(median "${SCPU[$s]}")
    CCPU[$s]=$(median "${CCPU[$s]}")
    if [ -n "${MUT[$s]:-}" ]; then MUT[$s]=$(median "${MUT[$s]}"); fi
  done

  for s in "${names[@]}"; do
    bound=""
    if [ -n "${MUT[$s]:-}" ]; then
      mut=$(calc "${MUT[$s]} / 1048576")
      limit=$(calc "1.05 * $mut + 8")
      verdict=$(awk "BEGIN { print (${M[$s]} <= $limit) ? \"yes\" : \"NO\" }")
      bound=$(printf '%.1f, %s (%.1f)' "$mut" "$verdict" "$limit")
    fi
    label=${s/:dict=*/+dict}
    label=${label/:level=2,dict=*/-2+dict}
    printf '  %-22s %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f  %s\n' "$label" "${W[$s]}" "${R[$s]}" "${M[$s]}" \
      "$(calc "${W[$s]} / ${W[nbdkit zstd]}")" \
      "$(calc "${R[$s]} / ${R[nbdkit zstd]}")" \
      "$(calc "${M[$s]} / ${M[nbdkit zstd]}")" "$bound"
  done
  echo "  (medians of $rounds rounds; zstd+dict: zstd:dict= with a 256 KiB dictionary trained on this corpus by"
  echo "   ztier train-dict, at zram's level 3; zstd-2+dict: the same at level 2)"
  cores=$(nproc)
  echo "  reads, CPU seconds a GB (server's at 10 ms ticks; medians), and the most $cores cores give at that cost:"
  printf '    %-22s %8s %8s %8s %14s\n' server server nbdcopy both "ceiling MB/s"
  for s in "nbdkit sparse" "nbdkit lz4" "ztier plain" "ztier lz4"; do
    both=$(calc "${SCPU[$s]} + ${CCPU[$s]}")
    printf '    %-22s %8.3f %8.3f %8.3f %14.0f\n' "$s" "${SCPU[$s]}" "${CCPU[$s]}" "$both" \
      "$(calc "($both > 0 ? $cores * 1000 / $both : 0)")"
  done
  printf '  reads: ztier lz4 %.2fx nbdkit sparse; nbdkit lz4 %.2fx nbdkit sparse; ztier lz4 %.2fx nbdkit lz4 (the same work)\n' \
    "$(calc "${R[ztier lz4]} / ${R[nbdkit sparse]}")" "$(calc "${R[nbdkit lz4]} / ${R[nbdkit sparse]}")" \
    "$(calc "${R[ztier lz4]} / ${R[nbdkit lz4]}")"
  # The server's read goal (>= 1.0x nbdkit sparse) reads the best round of each server, so each side's luckiest round counts.
  printf '  reads, best of %s rounds: ztier lz4 %.0f MB/s, nbdkit sparse %.0f, nbdkit lz4 %.0f; ztier lz4 %.2fx nbdkit sparse, %.2fx nbdkit lz4\n' \
    "$rounds" "${BEST[ztier lz4]}" "${BEST[nbdkit sparse]}" "${BEST[nbdkit lz4]}" \
    "$(calc "${BEST[ztier lz4]} / ${BEST[nbdkit sparse]}")" "$(calc "${BEST[ztier lz4]} / ${BEST[nbdkit lz4]}")"
  unset W R M MUT SCPU CCPU BEST
done

echo "fio nbd engine: 4 KiB randrw 50/50, iodepth 32, 60 % compressible buffers, 10 s"
printf '  %-22s %12s %12s %9s\n' server "read IOPS" "write IOPS" "total x"
declare -A IOPS
for server in "nbdkit zstd" "nbdkit sparse" "ztier plain" "ztier lz4"; do
  read -r kind alg <<<"$server"
  case $kind in
    nbdkit) start nbdkit -f -U "$work/sock" memory size=256M allocator="$alg" ;;
    ztier) start_ztier "$alg" --size 256M ;;
  esac
  fio --name=bench --ioengine=nbd --uri="nbd+unix:///?socket=$work/sock" --rw=randrw \
    --rwmixread=50 --bs=4k --size=256M --iodepth=32 --time_based --runtime=10 \
    --buffer_compress_percentage=60 --refill_buffers --output-format=terse \
    --terse-version=3 >"$work/fio.out" 2>/dev/null
  stop
  # Terse v3: field 8 is read IOPS, field 49 write IOPS.
  line=$(grep -v '^fio' "$work/fio.out" | tail -n 1)
  r=$(cut -d';' -f8 <<<"$line")
  w=$(cut -d';' -f49 <<<"$line")
  IOPS[$server]=$(calc "$r + $w")
  printf '  %-22s %12s %12s %9.2f\n' "$server" "$r" "$w" "$(calc "${IOPS[$server]} / ${IOPS[nbdkit zstd]}")"
done
