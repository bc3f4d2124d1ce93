#!/usr/bin/env bash
# The same client (nbdcopy, its defaults) and the same real-memory corpus against
# `ztier serve` and against nbdkit's memory plugin, in one run: write MB/s, read MB/s and
# the server's RSS after the write, each also as a ratio to nbdkit's allocator=zstd.
#
# Usage: scripts/nbd-bench.sh [CORPUS.pages.zst ...]   (default: ../shared/corpus/postgres)
# Needs: nbdkit, libnbd-bin (nbdcopy), zstd; builds ztier in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
corpora=("$@")
[ ${#corpora[@]} -gt 0 ] || corpora=(../shared/corpus/postgres.pages.zst)
for tool in nbdkit nbdcopy zstd; do
  command -v "$tool" >/dev/null || { echo "nbd-bench: $tool is not installed (scripts/setup.sh)" >&2; exit 1; }
done
cargo build --release -q -p ztier-cli
ztier=target/release/ztier
work=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

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

for corpus in "${corpora[@]}"; do
  raw="$work/corpus.raw"
  zstd -d -q -f "$corpus" -o "$raw"
  bytes=$(stat -c %s "$raw")
  size=$(( (bytes + 1048575) / 1048576 * 1048576 ))
  uri="nbd+unix:///?socket=$work/sock"
  printf '%s: %d bytes, nbdcopy in and out\n' "$(basename "$corpus")" "$bytes"
  printf '  %-22s %10s %10s %10s %9s %9s %9s\n' server "write MB/s" "read MB/s" "RSS MiB" "write x" "read x" "RSS x"
  declare -A W R M
  names=()
  for server in "nbdkit zstd" "nbdkit sparse" "nbdkit malloc" "ztier lz4" "ztier zstd" "ztier lzo-rle"; do
    read -r kind alg <<<"$server"
    case $kind in
      nbdkit) start nbdkit -f -U "$work/sock" memory size="$size" allocator="$alg" ;;
      ztier) start "$ztier" serve --quiet --socket "$work/sock" --size "$size" --compressor "$alg" ;;
    esac
    w=$(seconds nbdcopy "$raw" "$uri")
    rss=$(ps -o rss= -p "$server_pid" | tr -d ' ')
    r=$(seconds nbdcopy "$uri" null:)
    stop
    W[$server]=$(calc "$bytes / $w / 1e6")
    R[$server]=$(calc "$bytes / $r / 1e6")
    M[$server]=$(calc "$rss / 1024")
    names+=("$server")
  done
  for s in "${names[@]}"; do
    printf '  %-22s %10.1f %10.1f %10.1f %9.2f %9.2f %9.2f\n' "$s" "${W[$s]}" "${R[$s]}" "${M[$s]}" \
      "$(calc "${W[$s]} / ${W[nbdkit zstd]}")" \
      "$(calc "${R[$s]} / ${R[nbdkit zstd]}")" \
      "$(calc "${M[$s]} / ${M[nbdkit zstd]}")"
  done
  unset W R M
done
