#!/usr/bin/env bash
# The Debian package as a host operator meets it: built from this checkout
# (packaging/build-deb.sh), installed with `apt-get install ./ztier_*.deb`, then
#   - the installed /usr/bin/ztier runs the main job on the installed sample, every field
#     equal to the kernel's;
#   - `ztier serve` started under systemd-socket-activate with the installed ztier@.service's
#     ExecStart (its %i, $ZTIER_ARGS and directories filled in as systemd would) answers
#     nbdinfo on the data socket and `ztier stat` on the control socket, and saves its state
#     at SIGTERM;
#   - crates/ztier-uffd/tests/c/region_test.c, built with
#     `cc $(pkg-config --cflags --libs ztier-uffd)` against the installed library, passes;
#   - `man -w` finds every page, the completions are where bash, zsh and fish look;
#   - `apt-get purge` leaves no path the package had (dpkg -L before, each checked after).
# Run as root (or a user who may sudo). The tools are installed with apt-get; one that cannot
# be makes its check say so and skip, except under CI (set, as the Rust tests read it): then it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=${CI:-}
instance=pkgcheck

as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "package-check: not root and no sudo: cannot run '$*'" >&2
    return 1
  fi
}

# Fails under CI, else says why and returns 1 (the caller skips its check).
skip() {
  if [ -n "$ci" ]; then
    echo "package-check: FAILED: CI must run this: $*" >&2
    exit 1
  fi
  echo "package-check: skipped: $*" >&2
  return 1
}

fail() {
  echo "package-check: FAILED: $*" >&2
  exit 1
}

# Installs each Debian package given that is not installed; returns 1 if any cannot be.
ensure_packages() {
  local pkg missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  echo "package-check: installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}

# The build's tools and the checks' (each check's own are looked for again where it runs).
ensure_packages dpkg-dev patchelf pkg-config build-essential ||
  fail "cannot install the package build's tools (dpkg-dev patchelf pkg-config build-essential)"
ensure_packages man-db systemd libnbd-bin || skip "man-db, systemd or libnbd-bin cannot be installed" || true

work=$(mktemp -d)
server_pid=
user_existed=$(getent passwd ztier >/dev/null && echo yes || echo no)
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "== the package, built from this checkout"
deb=$(bash packaging/build-deb.sh "$work/deb")
echo "$deb"
if dpkg-query -W -f='${Status}' ztier 2>/dev/null | grep -q 'installed'; then
  echo "package-check: ztier is installed already (an earlier run?): purged first"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ztier >/dev/null
fi

echo "== apt-get install ./$(basename "$deb")"
# A machine may keep parts of every package out (docker's Debian images exclude
# /usr/share/man and most of /usr/share/doc in /etc/dpkg/dpkg.cfg.d/). That is the machine's
# choice, left as it is; this one install takes this package's excluded paths back in
# (--path-include, which wins over the configuration's earlier path-exclude), so the pages
# this check reads are there.
mapfile -t shipped < <(dpkg-deb --fsys-tarfile "$deb" | tar -t | sed 's|^\./|/|; s|/$||' | grep -v '^$')
excludes=()
if compgen -G '/etc/dpkg/dpkg.cfg.d/*' >/dev/null; then
  mapfile -t excludes < <(sed -n 's/^[[:space:]]*path-exclude[[:space:]]*=\?[[:space:]]*//p' /etc/dpkg/dpkg.cfg.d/*)
fi
dpkg_options=()
for path in "${shipped[@]}"; do
  for pattern in "${excludes[@]}"; do
    # shellcheck disable=SC2053 # (the pattern is a glob, as dpkg's are)
    if [[ $path == $pattern ]]; then
      dpkg_options+=(-o "Dpkg::Options::=--path-include=$path")
      break
    fi
  done
done
[ "${#dpkg_options[@]}" -eq 0 ] || echo "package-check: $((${#dpkg_options[@]} / 2)) paths of the package are excluded by /etc/dpkg/dpkg.cfg.d: included for this install"
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${dpkg_options[@]}" "$(realpath "$deb")" >/dev/null
mapfile -t installed < <(dpkg -L ztier | grep -vx '/\.')
for path in "${shipped[@]}"; do
  [ -e "$path" ] || [ -L "$path" ] || fail "$path is in the package but not installed"
done
echo "package-check: ${#installed[@]} paths installed"
[ "$(command -v ztier)" = /usr/bin/ztier ] || fail "ztier on PATH is $(command -v ztier), not /usr/bin/ztier"

echo "== the installed binary's main job (the installed sample)"
(cd "$work" && /usr/bin/ztier bench --corpus /usr/share/ztier/samples/sample.pages.zst) >"$work/bench.out"
grep -q "every field equal to the kernel's" "$work/bench.out" ||
  { cat "$work/bench.out"; fail "the main job's fields are not all the kernel's"; }

echo "== ztier serve under systemd-socket-activate, with the installed ztier@.service's command line"
service=$(printf '%s\n' "${installed[@]}" | grep '/ztier@\.service$') || fail "no ztier@.service installed"
socket_unit=$(printf '%s\n' "${installed[@]}" | grep '/ztier@\.socket$') || fail "no ztier@.socket installed"
exec_start=$(sed -n 's/^ExecStart=//p' "$service")
listen=$(sed -n 's/^ListenStream=//p' "$socket_unit")
[ -n "$exec_start" ] || fail "$service has no ExecStart"
[ -n "$listen" ] || fail "$socket_unit has no ListenStream"
# As systemd runs it: %i the instance, $ZTIER_ARGS from /etc/ztier/%i.env (the unit's own
# example, smaller), /run/ztier and /var/lib/ztier the RuntimeDirectory and StateDirectory
# it would make (here in a scratch directory, so the machine keeps none).
zargs="--size 64M --compressor lz4 --mem-limit 16M"
fill() {
  local s=${1//%i/$instance}
  s=${s//\$ZTIER_ARGS/$zargs}
  s=${s//\/run\/ztier\//$work/run/}
  s=${s//\/var\/lib\/ztier\//$work/state/}
  printf '%s' "$s"
}
read -ra command_line <<<"$(fill "$exec_start")"
data_socket=$(fill "$listen")
[ "${command_line[0]}" = /usr/bin/ztier ] || fail "ExecStart runs ${command_line[0]}, not /usr/bin/ztier"
control=$(printf '%s\n' "${command_line[@]}" | grep '\.sock\.ctl$') || fail "ExecStart has no --control"
state=$(printf '%s\n' "${command_line[@]}" | grep '\.state$') || fail "ExecStart has no --state"
if command -v systemd-socket-activate >/dev/null && command -v nbdinfo >/dev/null || skip "systemd-socket-activate or nbdinfo is missing"; then
  mkdir -p "$work/run" "$work/state"
  systemd-socket-activate -l "$data_socket" "${command_line[@]}" >"$work/serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do [ -S "$data_socket" ] && break; sleep 0.1; done
  [ -S "$data_socket" ] || { cat "$work/serve.log"; fail "systemd-socket-activate never listened on $data_socket"; }
  # The first connection starts the server (systemd-socket-activate execs it then).
  size=$(nbdinfo --size "nbd+unix:///?socket=$data_socket") || { cat "$work/serve.log"; fail "nbdinfo got no answer"; }
  [ "$size" = $((64 << 20)) ] || fail "the export is $size bytes, not the 64 MiB of --size 64M"
  for _ in $(seq 300); do [ -S "$control" ] && break; sleep 0.1; done
  /usr/bin/ztier stat --control "$control" >"$work/stat.out" || { cat "$work/serve.log"; fail "ztier stat on $control failed"; }
  grep -q mm_stat "$work/stat.out" || { cat "$work/stat.out"; fail "ztier stat printed no mm_stat"; }
  kill -TERM "$server_pid"
  wait "$server_pid" || { cat "$work/serve.log"; fail "ztier serve did not stop cleanly at SIGTERM"; }
  server_pid=
  [ -s "$state" ] || fail "ztier serve saved no state at $state"
  echo "package-check: served 64 MiB, stat answered, state saved"
fi

echo "== a C program against the installed library (pkg-config ztier-uffd)"
if command -v cc >/dev/null && command -v pkg-config >/dev/null || skip "cc or pkg-config is missing"; then
  # shellcheck disable=SC2046 # (pkg-config's flags are words)
  cc -std=c11 -Wall -Werror -O1 crates/ztier-uffd/tests/c/region_test.c -o "$work/region_test" \
    $(pkg-config --cflags --libs ztier-uffd)
  readelf -d "$work/region_test" | grep -q 'NEEDED.*\[libztier_uffd\.so\.0\]' ||
    fail "the program does not need libztier_uffd.so.0 (the library's SONAME)"
  status=0
  (cd "$work" && ./region_test) || status=$?
  case $status in
  0) echo "package-check: region_test passed against /usr/lib/$(dpkg-architecture -qDEB_HOST_MULTIARCH)/libztier_uffd.so.0" ;;
  77) skip "userfaultfd is not allowed here (region_test exited 77)" || true ;;
  *) fail "region_test failed (exit $status)" ;;
  esac
fi

echo "== man pages and completions"
if command -v man >/dev/null || skip "man (man-db) is missing"; then
  pages=0
  for page in /usr/share/man/man1/ztier*.1.gz; do
    name=$(basename "$page" .1.gz)
    found=$(man -w "$name") || fail "man -w $name finds nothing"
    [ "$found" = "$page" ] || fail "man -w $name finds $found, not $page"
    pages=$((pages + 1))
  done
  man -w ztier-serve >/dev/null
  [ "$pages" -gt 10 ] || fail "only $pages ztier pages installed"
  MANWIDTH=80 man ztier-serve 2>/dev/null | grep -q -- '--mem-limit' || fail "man ztier-serve does not show --mem-limit"
  echo "package-check: man -w finds all $pages pages"
fi
grep -q 'complete -F _ztier' /usr/share/bash-completion/completions/ztier || fail "no bash completion"
head -1 /usr/share/zsh/vendor-completions/_ztier | grep -q '^#compdef ztier' || fail "no zsh completion"
grep -q 'complete -c ztier' /usr/share/fish/vendor_completions.d/ztier.fish || fail "no fish completion"
if command -v bash >/dev/null; then
  # The completion as bash loads it: `ztier se<TAB>` offers serve.
  offered=$(bash -c 'source /usr/share/bash-completion/completions/ztier
    COMP_WORDS=(ztier se); COMP_CWORD=1; COMP_LINE="ztier se"; COMP_POINT=8
    _ztier ztier se ztier; printf "%s\n" "${COMPREPLY[@]}"')
  grep -qx serve <<<"$offered" || fail "bash completion of 'ztier se' offers: $offered"
fi
[ -f /usr/share/doc/ztier/copyright ] || fail "no copyright file"

echo "== apt-get purge ztier leaves nothing of the package"
as_root env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ztier >/dev/null
for path in "${installed[@]}"; do
  # Directories other packages share (/usr, /usr/share/man/man1) stay; every file and link,
  # and every directory only this package had, goes.
  # (/lib, a link to /usr/lib on a merged /usr, is the system's.)
  if [ -d "$path" ]; then
    if [ -L "$path" ] || dpkg -S "$path" >/dev/null 2>&1; then continue; fi
    fail "$path (a directory only ztier had) is left after remove"
  fi
  { [ -e "$path" ] || [ -L "$path" ]; } && fail "$path is left after apt-get remove"
done
as_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq ztier >/dev/null
dpkg-query -W -f='${Status}' ztier 2>/dev/null | grep -q 'installed\|config-files' &&
  fail "dpkg still knows ztier after purge: $(dpkg-query -W -f='${Status}' ztier)"
! compgen -G '/var/lib/dpkg/info/ztier.*' >/dev/null || fail "dpkg keeps ztier's control files after purge"
# The system user postinst made is kept at purge, as Debian keeps system users; the check
# made it, so the check takes it away, and the machine is as it was.
if [ "$user_existed" = no ] && getent passwd ztier >/dev/null; then
  as_root userdel ztier
  ! getent group ztier >/dev/null || as_root groupdel ztier
fi
echo "package-check: ok (${#installed[@]} paths installed and gone)"
