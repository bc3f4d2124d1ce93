#!/usr/bin/env bash
# How the kernel's zram on this machine scales from one writer to two: a fresh device gets
# a corpus by one `dd oflag=direct`, then (reset) by two, each writing one half; three runs.
# The reference for `ztier bench --threads 1,2`. Needs root and /sys/class/zram-control.
#
# Usage: sudo scripts/kernel-zram-writers.sh CORPUS.pages[.zst] [ALGORITHM (lz4)]
set -euo pipefail
corpus=$1
alg=${2:-lz4}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
case $corpus in
  *.zst) zstd -d -q -f "$corpus" -o "$raw" ;;
  *) cp "$corpus" "$raw" ;;
esac
bytes=$(stat -c %s "$raw")
mib=$(( (bytes + 1048575) / 1048576 ))
half=$(( mib / 2 ))
id=$(cat /sys/class/zram-control/hot_add)
dev=/dev/zram$id
sys=/sys/block/zram$id
trap 'echo 1 > "$sys/reset"; echo "$id" > /sys/class/zram-control/hot_remove; rm -f "$raw"' EXIT
fresh() {
  echo 1 > "$sys/reset"
  echo "$alg" > "$sys/comp_algorithm"
  echo "$(( mib + 1 ))M" > "$sys/disksize"
}
now() { date +%s.%N; }
for run in 1 2 3; do
  fresh
  t0=$(now)
  dd if="$raw" of="$dev" bs=1M oflag=direct status=none
  one=$(echo "$bytes / ($(now) - $t0) / 1000000" | bc -l)
  fresh
  t0=$(now)
  dd if="$raw" of="$dev" bs=1M count="$half" oflag=direct status=none &
  dd if="$raw" of="$dev" bs=1M skip="$half" seek="$half" oflag=direct status=none &
  wait
  two=$(echo "$bytes / ($(now) - $t0) / 1000000" | bc -l)
  printf '%s %s run %d: 1 writer %.0f MB/s, 2 writers %.0f MB/s, %.2fx\n' \
    "$(basename "$corpus")" "$alg" "$run" "$one" "$two" "$(echo "$two / $one" | bc -l)"
done
