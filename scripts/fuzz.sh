#!/usr/bin/env bash
# Runs every cargo-fuzz target for a bounded time (default 30 s each, as CI runs it).
# Debug assertions are on: they check the compressors' unchecked reads.
# cargo fuzz needs nightly compiler flags; RUSTC_BOOTSTRAP lets the stable toolchain take them.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds=${1:-30}
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked --quiet
export RUSTC_BOOTSTRAP=1
# The list is taken in a plain assignment, so a failing `cargo fuzz list` stops the script
# (a process substitution would hide its exit status); an empty list is a failure too: a run
# of no target must not pass as a fuzzing run.
list=$(cargo fuzz list)
mapfile -t targets <<<"$list"
if [[ -z $list || ${#targets[@]} -eq 0 ]]; then
  echo "fuzz: cargo fuzz list names no target in $PWD" >&2
  exit 1
fi
cargo fuzz build --release --debug-assertions >/dev/null 2>&1 || cargo fuzz build --release --debug-assertions
for t in "${targets[@]}"; do
  printf 'fuzz %-20s ' "$t"
  if cargo fuzz run --release --debug-assertions "$t" -- -max_total_time="$seconds" -rss_limit_mb=2048 >"/tmp/fuzz-$t.log" 2>&1; then
    grep -Eo 'Done [0-9]+ runs' "/tmp/fuzz-$t.log" | tail -n 1
  else
    echo "FAILED"; tail -n 40 "/tmp/fuzz-$t.log"; exit 1
  fi
done
