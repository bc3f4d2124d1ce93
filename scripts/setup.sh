#!/usr/bin/env bash
# Installs what building, testing and benchmarking ztier needs on a Debian machine (run as
# root or with sudo available; liblzo2-dev is the C reference the LZO benches measure
# against). Safe to run again.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
need=()
for pkg in build-essential pkg-config zstd liblzo2-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  $SUDO apt-get update -qq
  $SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: no Rust toolchain found; install one with rustup (https://rustup.rs), then rerun" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
echo "setup: ok ($(cargo --version))"
