#!/usr/bin/env bash
# Installs what building, testing, fuzzing and benchmarking ztier needs on a Debian machine
# with a Rust toolchain (run as root, or as a user who may sudo). Safe to run again.
#
#   bash scripts/setup.sh           install what is missing, then check
#   bash scripts/setup.sh --check   install nothing; list what is missing, exit 1 if anything
#
# What each package is for:
#   - build-essential: the C compiler and linker (lz4-sys builds liblz4 from source)
#   - pkg-config: found by -sys build scripts
#   - zstd: the command-line tool, to make and inspect corpus files
#   - liblzo2-dev: liblzo2, the C reference the LZO benches and fuzz targets compare with
#     (only they link it: `cargo test` does not need it)
#   - shellcheck: the lint CI runs on every shell script
#   - libnbd-bin, python3-libnbd, qemu-utils, fio, fuse3: the NBD clients (nbdcopy,
#     nbdinfo, nbdsh, nbdfuse, qemu-img, fio's nbd engine) the tests of `ztier serve` drive
#   - python3-prometheus-client: Prometheus's own parser of the text exposition, which
#     the test of `ztier serve --metrics` reads the endpoint with
#   - nbdkit: the reference server scripts/nbd-bench.sh measures against, and the remote
#     store zram's writeback tests write to
#   - nbdkit-plugin-dev, liblz4-dev: the header and library scripts/nbd-bench.sh builds its
#     "nbdkit lz4" reference with (scripts/nbdkit-lz4.c: nbdkit doing ztier lz4's work)
#   - iproute2: `ip netns` and `tc netem`, for the far-memory test (two namespaces, a veth
#     pair, a delay)
#   - qemu-system-x86: the virtual machine whose swap disk is a `ztier serve` export
#     (scripts/vm-swap.sh, the vm_swap test); it must match qemu-utils's version, so where
#     qemu-utils came from backports it comes from there too (see install_qemu below)
#   - linux-image-amd64: that guest's kernel (/boot/vmlinuz-*) and its virtio and zram
#     modules (/lib/modules)
#   - busybox-static: the guest's whole userland (sh, mkswap, swapon, insmod)
#   - cpio, kmod: to pack the guest's initramfs, and to list its modules' dependencies in
#     order (modprobe --show-depends); the workload is built with build-essential's static
#     libc
#   - openssl: the certificates the TLS tests make (a CA, a server and a client)
#   - systemd: systemd-socket-activate, which the socket-activation test starts
#     `ztier serve` under
#   - ceph-mon, ceph-mgr, ceph-osd, ceph-common: the throwaway Ceph cluster on loopback
#     (scripts/ceph-cluster.sh) the Ceph tests and scripts/ceph-bench.sh write back to;
#     ceph-common has the ceph, rados and rbd tools
#   - qemu-system-common (qemu-storage-daemon) and qemu-block-extra (its rbd driver, built
#     on librbd): the NBD export of the cluster's RBD image. qemu-block-extra's modules load
#     only into the QEMU build they came with, so both come from where qemu-utils came from
#     (backports, see install_qemu below)
#   - librsvg2-bin: rsvg-convert, which renders `ztier plot`'s SVG to PNG in the plot test
#     (a real renderer: the picture must draw, not only parse)
#   - postgresql: the server (initdb, postgres, pg_isready) whose postmaster and backends
#     the capture test captures, shared_buffers included, for the kernel zram comparison
#   - postgresql-contrib: pgbench, the database and the load that fill shared_buffers (in
#     the server package itself since PostgreSQL 10; in this one before)
#   - patchelf: gives libztier_uffd its SONAME in the Debian package (packaging/build-deb.sh;
#     dpkg-deb and dpkg-shlibdeps come with build-essential's dpkg-dev)
#   - man-db: `man -w`, with which scripts/package-check.sh finds the installed pages
#   - curl: what docs/host.md's commands read the Prometheus endpoint with (the docs test
#     runs every guide's commands)
set -euo pipefail

PACKAGES=(build-essential pkg-config zstd liblzo2-dev shellcheck libnbd-bin python3-libnbd python3-prometheus-client qemu-utils fio fuse3 nbdkit nbdkit-plugin-dev liblz4-dev iproute2
  qemu-system-x86 linux-image-amd64 busybox-static cpio kmod openssl systemd
  ceph-mon ceph-mgr ceph-osd ceph-common qemu-system-common qemu-block-extra librsvg2-bin
  postgresql postgresql-contrib patchelf man-db curl)

# The packages that must be the same QEMU build as qemu-utils.
QEMU_PACKAGES=(qemu-system-x86 qemu-system-common qemu-block-extra)

# The packages not installed. `dpkg -s` is not enough: it succeeds for a package that was
# removed but left its configuration files behind.
missing_packages() {
  local pkg
  for pkg in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$'; then
      echo "$pkg"
    fi
  done
}

# Runs a command as root: directly when we are root, else through sudo.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "setup: not root and no sudo: cannot run '$*'" >&2
    return 1
  fi
}

# Everything the build needs, present or not; prints what is missing.
check() {
  local ok=0 pkg tool
  for pkg in $(missing_packages); do
    echo "setup: missing package: $pkg" >&2
    ok=1
  done
  if qemu_utils_mismatched; then
    echo "setup: qemu-utils is missing or not the backports build the QEMU emulators are" >&2
    ok=1
  fi
  for tool in cargo rustc; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "setup: missing tool: $tool (install a Rust toolchain with rustup)" >&2
      ok=1
    fi
  done
  for sub in fmt clippy; do
    if ! cargo "$sub" --version >/dev/null 2>&1; then
      echo "setup: missing tool: cargo $sub (rustup component add rustfmt clippy)" >&2
      ok=1
    fi
  done
  return "$ok"
}

# The QEMU packages given (of QEMU_PACKAGES) from the backports of this release, when
# qemu-utils is a backports build (this project's machines come with qemu-utils 10 from
# bookworm-backports, which Breaks bookworm's qemu-system-common 7.2: apt would remove
# qemu-utils to install it, which --no-remove forbids; and bookworm's qemu-block-extra 7.2
# wants the 7.2 emulators). The backports suite is added for this one install only,
# beside the machine's own sources (same archive), with package lists of its own: /etc/apt and
# /var/lib/apt/lists are left as they were.
install_qemu() {
  local version
  version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
  if [[ $version != *~bpo* ]]; then
    echo "setup: qemu-system-x86 cannot be installed beside qemu-utils $version" >&2
    return 1
  fi
  from_backports "$@"
}

# Whether qemu-utils is missing or not a backports build while a QEMU package installed is
# one: qemu-utils must be the same build (the archive's own is older, does not match the
# emulators, and lacks qemu-storage-daemon), so it comes from backports too.
qemu_utils_mismatched() {
  local pkg status
  status=$(dpkg-query -W -f='${Status} ${Version}' qemu-utils 2>/dev/null || true)
  [[ $status != "install ok installed "*~bpo* ]] || return 1
  for pkg in "${QEMU_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null || true)
    [[ $status != "install ok installed "*~bpo* ]] || return 0
  done
  return 1
}

# Installs the packages given from this release's backports.
from_backports() {
  local codename uri dir
  codename=$(awk -F= '$1 == "VERSION_CODENAME" { print $2 }' /etc/os-release)
  # shellcheck disable=SC2016 # (apt's own $(FIELD)s)
  uri=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk -v c="$codename" '$2 == c && !n++ { print $1 }')
  [ -n "$uri" ] || { echo "setup: no archive for $codename in the apt sources" >&2; return 1; }
  dir=$(mktemp -d)
  mkdir -p "$dir/lists/partial"
  echo "deb $uri $codename-backports main" >"$dir/sources.list"
  local opts=(-o "Dir::Etc::sourcelist=$dir/sources.list" -o "Dir::State::lists=$dir/lists")
  as_root apt-get "${opts[@]}" update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq --no-install-recommends --no-remove \
    -t "$codename-backports" "$@"
  rm -rf "$dir"
}

if [ "${1:-}" = "--check" ]; then
  check
  echo "setup: every package and tool is here"
  exit 0
fi

if qemu_utils_mismatched; then
  echo "setup: installing qemu-utils from backports, as the QEMU emulators here are"
  from_backports qemu-utils
fi
mapfile -t need < <(missing_packages)
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  as_root apt-get update -qq
  qemu_need=()
  for pkg in "${QEMU_PACKAGES[@]}"; do
    [[ " ${need[*]} " != *" $pkg "* ]] || qemu_need+=("$pkg")
  done
  if [ "${#qemu_need[@]}" -gt 0 ] &&
    ! apt-get install -s -qq --no-install-recommends --no-remove "${qemu_need[@]}" >/dev/null 2>&1; then
    install_qemu "${qemu_need[@]}"
    mapfile -t need < <(missing_packages)
  fi
  [ "${#need[@]}" -eq 0 ] ||
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove "${need[@]}"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: no Rust toolchain found; install one with rustup (https://rustup.rs), then rerun" >&2
  exit 1
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi
check
echo "setup: ok ($(cargo --version))"
