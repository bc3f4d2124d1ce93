#!/usr/bin/env bash
# A real kernel swaps to ztier: a QEMU guest (Debian's kernel, busybox, a static workload)
# whose swap disk is a `ztier serve` export, and the same guest and workload with the swap
# disk on each alternative. The workload (scripts/vm/swapload.c) fills MIB of anonymous
# memory, more than the guest's RAM, with real memory pages from a corpus (a read-only disk
# of the guest), touches it with a working set, and checks every page against its checksum
# whenever it comes back.
#
# Usage: scripts/vm-swap.sh [--swap KIND]... [--corpus FILE.pages.zst]... [--ram MIB]
#          [--mib MIB] [--touches N] [--compressor ALG] [--mem-target SIZE] [--kvm]
#          [--iothread] [--floor-memcg MIB] [--timeout SECONDS] [--results FILE] [--keep]
#
# KIND (default ztier; `all` = ztier nbdkit-sparse nbdkit-zstd file zram):
#   ztier           `ztier serve` (--compressor, default lz4) over a Unix socket
#   ztier-wb-file   the same with --mem-target (default 8M) and --backing-dev a host file:
#                   the policy writes cold swap pages back, the guest reads them again
#   ztier-wb-nbd    the same with the backing store an NBD export (nbdkit memory)
#   ztier-restart   `ztier serve --state`, stopped and started again from its state in the
#                   middle of the workload (once 64 MiB are swapped out); QEMU's NBD client
#                   waits for it (reconnect-delay), the guest sees no I/O error
#   ztier-vhost     `ztier serve --vhost-user-blk` (--compressor as for ztier): the guest's
#                   virtqueues are run by ztier itself in the guest's shared memory (QEMU's
#                   vhost-user-blk-pci; the guest's RAM a memfd shared with the server)
#   ztier-vhost-restart  the same with --state, stopped (SIGTERM) and started again from
#                   its state in the middle of the workload (once 64 MiB are swapped out);
#                   QEMU dials the socket again (reconnect-ms), the guest sees no I/O error
#   qsd-vhost       qemu-storage-daemon's own vhost-user-blk export of a raw sparse file on
#                   tmpfs (/dev/shm unless TMPDIR is a tmpfs): the same path, no compression
#   nbdkit-sparse   nbdkit memory allocator=sparse (no compression)
#   nbdkit-zstd     nbdkit memory allocator=zstd
#   file            a raw sparse file on the host's disk (cache=none)
#   zram            no swap disk: the guest's own zram (its kernel's module, lzo-rle)
#   guest-ram       no swap disk: a RAM disk of the guest's own (brd), the floor of the
#                   guest's swap path with no device outside it (no I/O round trip; brd is
#                   synchronous, so the kernel reads one page a fault, without readahead).
#                   The guest gets the RAM disk's memory on top of --ram, and the workload
#                   runs in a memory cgroup of --floor-memcg MiB (default: --ram less 64,
#                   which swaps as much as the others' guests do) so that it swaps as
#                   they do
#
# --iothread serves the swap disk from a QEMU iothread instead of the main loop (on this
# project's 2-core VM under TCG it changed nothing measurable).
#
# --timeout (default 900 s) ends a guest that has not finished. A guest still running at
# half of it shows, once, its kernel's blocked tasks, its memory and the requests its disks
# still wait on, then reads one block of each disk: a request the device completed without
# telling the guest is found when that read's completion is, and the run goes on (RESULT's
# guest_watchdog=1 says so); a request the server never answered stays unanswered. At the
# time-out the state of QEMU's virtio queues (not vhost-user's) and of the server follows.
#
# Defaults: 160 MiB of guest RAM, a 320 MiB workload, the bundled sample as corpus
# (../shared/corpus's files are larger and more varied: pass them with --corpus). TCG
# (QEMU's emulation) unless --kvm: a nested KVM guest hangs at boot on some hosts.
#
# Each run prints the guest's lines and one line "RESULT swap=KIND key=value ...": the
# workload's times, its swap-in latency (p50/p99 of the first load of a page mincore() said
# was not in memory), the guest's pswpin/pswpout, pages that came back wrong (mismatches),
# block and swap I/O errors in the guest's kernel log (guest_io_errors: the guest reads its
# own log with dmesg, since loglevel=3 keeps them off the console), whether the guest still
# ran at half the time-out (guest_watchdog, above), the host memory the
# swapped pages held (host_mem_mib: the server's peak RSS less the guest memory it maps
# shared, RssShmem, which is the guest's RAM and not held for the swap; for qemu-storage-
# daemon that plus its tmpfs file's blocks, sampled together; the guest's zram
# mem_used_max, which comes out of the guest's own RAM; none for a file, whose blocks on
# disk are file_blocks_mib; an NBD store's peak RSS apart), host CPU seconds (server and
# QEMU; a restarted server's two processes summed) and per swapped page (cpu_us_per_page:
# (server + QEMU CPU) / (pswpin + pswpout); server_cpu_us_per_page: the server's alone),
# and for ztier what `ztier stat` said at the peak and after the workload exited (its
# discards). A table of all runs closes. The exit status is 1 if any page came back wrong,
# the guest's kernel logged an I/O error, or a guest failed (the guest's zram can run out
# of the guest's RAM: the OOM killer ends the workload).
#
# Needs: qemu-system-x86, linux-image-amd64 (the guest's kernel and modules),
# busybox-static, gcc (static libc), cpio, zstd, nbdkit, qemu-storage-daemon (qemu-utils)
# (scripts/setup.sh installs them); python3 to ask QEMU's monitor after a time-out.
# The ztier binary is $ZTIER, else built here (cargo build --release -p ztier-cli).
set -euo pipefail
cd "$(dirname "$0")/.."

kinds=()
corpora=()
ram=160 mib=320 touches=0 compressor=lz4 mem_target=8M kvm=0 timeout=900 results="" keep=0 iothread=0
floor_memcg=""
while [ $# -gt 0 ]; do
  case $1 in
    --swap) kinds+=("$2"); shift ;;
    --corpus) corpora+=("$2"); shift ;;
    --ram) ram=$2; shift ;;
    --mib) mib=$2; shift ;;
    --touches) touches=$2; shift ;;
    --compressor) compressor=$2; shift ;;
    --mem-target) mem_target=$2; shift ;;
    --kvm) kvm=1 ;;
    --iothread) iothread=1 ;;
    --floor-memcg) floor_memcg=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --results) results=$2; shift ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "vm-swap: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#kinds[@]} -gt 0 ] || kinds=(ztier)
if [ "${kinds[*]}" = all ]; then kinds=(ztier nbdkit-sparse nbdkit-zstd file zram); fi
[ ${#corpora[@]} -gt 0 ] || corpora=(samples/sample.pages.zst)
[ -n "$floor_memcg" ] || floor_memcg=$((ram - 64))

die() { echo "vm-swap: $*" >&2; exit 2; }
for tool in qemu-system-x86_64 gcc cpio zstd gzip; do
  command -v "$tool" >/dev/null || die "$tool is not installed (bash scripts/setup.sh)"
done
busybox=/bin/busybox # busybox-static's; the guest has no libc of its own
if [ ! -x "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then
  die "busybox-static is not installed (bash scripts/setup.sh)"
fi
kernel=$(find /boot -maxdepth 1 -name 'vmlinuz-*' 2>/dev/null | sort -V | tail -n 1)
[ -n "$kernel" ] || die "no kernel in /boot (linux-image-amd64; bash scripts/setup.sh)"
kver=${kernel#/boot/vmlinuz-}
[ -r "$kernel" ] || die "$kernel is not readable (run as root)"
[ -d "/lib/modules/$kver" ] || die "no /lib/modules/$kver"
for kind in "${kinds[@]}"; do
  case $kind in
    ztier | ztier-wb-file | ztier-restart | ztier-vhost | ztier-vhost-restart | file | zram | guest-ram) ;;
    qsd-vhost)
      command -v qemu-storage-daemon >/dev/null ||
        die "qemu-storage-daemon is not installed (qemu-utils; bash scripts/setup.sh)" ;;
    ztier-wb-nbd | nbdkit-sparse | nbdkit-zstd)
      command -v nbdkit >/dev/null || die "nbdkit is not installed (bash scripts/setup.sh)" ;;
    *) die "unknown swap kind $kind" ;;
  esac
done
if [ -z "${ZTIER:-}" ]; then
  cargo build --release -q -p ztier-cli
  ZTIER=$PWD/target/release/ztier
fi
ztier=$ZTIER

work=$(mktemp -d "${TMPDIR:-/tmp}/vm-swap.XXXXXX")
shm="" # qemu-storage-daemon's disk's directory, on tmpfs (made by the first qsd-vhost run)
pids=()
# shellcheck disable=SC2317 # (called by the trap)
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
  done
  if [ "$keep" = 1 ]; then
    echo "vm-swap: kept $work${shm:+ and $shm}"
  else
    rm -rf "$work"
    [ -z "$shm" ] || rm -rf "$shm"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
trap 'echo "vm-swap: failed at line $LINENO: $BASH_COMMAND" >&2' ERR

# What a hung run leaves to look at: the guest's CPU (halted or not, where), QEMU's view of
# its disks (requests done on each, and the requests each virtio queue still holds), and the
# server's own counts (requests read against replies sent: a server that owes no reply did
# not lose one). Asked of QEMU's monitor socket $1, of ztier serve on socket $2 (empty for
# other servers). The guest's own view (its blocked tasks, the requests it waits on) is on
# its console, from the watchdog at half the time-out (scripts/vm/init).
dump_hang() {
  local monitor=$1 served=$2
  echo "vm-swap: the state at the time-out:" >&2
  if ! command -v python3 >/dev/null; then
    echo "vm-swap: no python3 to ask QEMU's monitor" >&2
  elif [ -S "$monitor" ]; then
    python3 - "$monitor" <<'PY' >&2 || echo "vm-swap: QEMU's monitor did not answer" >&2
import re, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
# The general registers, RIP and whether the vCPU is halted; not the segment, FPU and
# vector registers. (Lines with escape sequences are the monitor echoing what was typed.)
noise = ("ES =", "CS =", "SS =", "DS =", "FS =", "GS =", "LDT", "TR =", "GDT", "IDT", "DR",
         "EFER", "FCW", "FPR", "XMM", "(qemu)", "QEMU ", "info ")
answered = False


def ask(cmd, show=True):
    """Whatever comes within a second of the command (a slow guest's QEMU answers late),
    shown as it comes: a monitor that goes away keeps what it said before."""
    global answered
    got = b""
    try:
        s.sendall(cmd + b"\n")
        s.settimeout(1)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:  # (socket.timeout among them: the answer is complete)
        pass
    answered |= bool(got)
    for line in got.decode(errors="replace").splitlines():
        if show and line.strip() and not line.lstrip().startswith(noise) and "\x1b" not in line:
            print("  qemu| " + line.rstrip(), flush=True)
    return got


for cmd in (b"info status", b"info registers", b"info blockstats", b"info block"):
    ask(cmd)
# Each virtio disk's first queue as QEMU sees it: requests the guest made available against
# those given back (used) and those still held (inuse), and the ring's indexes in the
# guest's memory (the avail index past QEMU's last_avail_idx: a request QEMU was never told
# of). Not a vhost-user disk: QEMU would ask its server for the ring's base, which stops
# the ring.
for line in ask(b"info virtio", show=False).decode(errors="replace").splitlines():
    m = re.match(r"\s*(/machine/\S+/virtio-backend) \[([\w-]+)\]", line)
    if m and not m.group(2).startswith("vhost"):
        path = m.group(1).encode()
        print("  qemu| virtio queue 0 of " + m.group(1) + ":", flush=True)
        ask(b"info virtio-queue-status " + path + b" 0")
        ask(b"info virtio-queue-element " + path + b" 0")
if not answered:
    sys.exit(1)
PY
  fi
  if [ -n "$served" ] && [ -S "$served.ctl" ]; then
    timeout 10 "$ztier" stat --socket "$served" 2>&1 | grep -E '^(mm_stat|io_stat|bd_stat|policy|server|vhost-user-blk) ' |
      sed 's/^/  server| /' >&2 || true
  fi
}

# Stops a process we started: SIG (default TERM), up to 10 s, then KILL.
stop() {
  local pid=$1 sig=${2:-TERM}
  kill "-$sig" "$pid" 2>/dev/null || true
  timeout 10 tail --pid="$pid" -f /dev/null 2>/dev/null || kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  local p kept=()
  for p in "${pids[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
  pids=("${kept[@]}")
}

# Waits up to 20 s for the sockets named to appear; the log is shown if they do not.
wait_sockets() {
  local log=$1 deadline=$((SECONDS + 20)) s
  shift
  for s in "$@"; do
    until [ -S "$s" ]; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "vm-swap: $s did not appear" >&2
        cat "$log" >&2
        exit 2
      fi
      sleep 0.05
    done
  done
}

cpu_seconds() { # pid -> user+system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0
}
# A process's resident memory less what it maps shared (RssShmem): a vhost-user server maps
# the guest's RAM (a memfd), which is the guest's and not held for its swap.
rss_kib() {
  awk '/^(RssAnon|RssFile):/ { k += $2 } END { print k + 0 }' "/proc/$1/status" 2>/dev/null || echo 0
}
shmem_kib() { awk '/^RssShmem:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }
blocks_kib() { # a file's blocks in KiB (0 if it is gone)
  local b
  b=$(stat -c '%b %B' "$1" 2>/dev/null) || { echo 0; return; }
  echo $((${b% *} * ${b#* } / 1024))
}
mib_of() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# The guest: the workload built statically, busybox, the modules with their dependencies in
# order, and /init, in a gzip'd initramfs.
echo "vm-swap: guest kernel $kver, $ram MiB RAM, workload $mib MiB, $([ "$kvm" = 1 ] && echo KVM || echo TCG)"
root=$work/root
mkdir -p "$root/bin" "$root/proc" "$root/sys" "$root/dev" "$root/modules"
gcc -O2 -static -o "$root/swapload" scripts/vm/swapload.c
cp "$busybox" "$root/bin/busybox"
cp scripts/vm/init "$root/init"
chmod 755 "$root/init"
: >"$root/modules.list"
for mod in virtio_pci virtio_blk zram; do
  modprobe --set-version "$kver" --show-depends "$mod" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r ko; do
  cp "$ko" "$root/modules/"
  echo "/modules/$(basename "$ko")" >>"$root/modules.list"
done
# brd (guest-ram) apart: /init loads it with its size.
modprobe --set-version "$kver" --show-depends brd | awk '$1 == "insmod" { print $2 }' | tail -n 1 |
  while read -r ko; do cp "$ko" "$root/modules/brd.ko"; done
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

# The corpus disk: the corpora's pages, up to the workload's size (an equal share of each).
share=$((mib * 1048576 / ${#corpora[@]} / 4096 * 4096))
for c in "${corpora[@]}"; do
  [ -r "$c" ] || die "no corpus $c"
  (zstd -dcq "$c" || true) | head -c "$share" # (zstd dies of SIGPIPE once head has its share)
done >"$work/corpus.raw"
corpus_pages=$(($(stat -c %s "$work/corpus.raw") / 4096))
[ "$corpus_pages" -gt 0 ] || die "empty corpus"
echo "vm-swap: corpus disk $corpus_pages pages from ${corpora[*]}"
swap_size=$((mib + 64))M

declare -a table=()
failed=0

# One run: the swap disk KIND, the guest, the workload; prints RESULT.
run() {
  local kind=$1 sock=$work/swap.sock server="" store="" drive="" swap=disk
  local log=$work/$kind.server.log console=$work/$kind.console
  rm -f "$sock" "$sock.ctl"
  local vhost=0 qsd_file="" restartable=0
  case $kind in
    ztier-vhost* | qsd-vhost) vhost=1 ;;
  esac
  case $kind in
    ztier-restart | ztier-vhost-restart) restartable=1 ;;
  esac
  case $kind in
    ztier | ztier-wb-file | ztier-wb-nbd | ztier-restart | ztier-vhost | ztier-vhost-restart)
      local args=(serve --size "$swap_size" --compressor "$compressor" --quiet)
      if [ "$vhost" = 1 ]; then
        args+=(--vhost-user-blk "$sock")
      else
        args+=(--socket "$sock")
      fi
      if [ "$restartable" = 1 ]; then
        rm -f "$work/state" "$work/state.loaded"
        args+=(--state "$work/state")
      fi
      if [ "$kind" = ztier-wb-file ]; then
        args+=(--backing-dev "$work/backing.img" --mem-target "$mem_target" --policy-interval 1s)
      elif [ "$kind" = ztier-wb-nbd ]; then
        rm -f "$work/store.sock"
        nbdkit -f -U "$work/store.sock" memory size="$swap_size" allocator=sparse >"$work/store.log" 2>&1 &
        store=$!
        pids+=("$store")
        wait_sockets "$work/store.log" "$work/store.sock"
        args+=(--backing-dev "nbd+unix:///?socket=$work/store.sock" --mem-target "$mem_target" --policy-interval 1s)
      fi
      "$ztier" "${args[@]}" >"$log" 2>&1 &
      server=$!
      pids+=("$server")
      wait_sockets "$log" "$sock" "$sock.ctl"
      ;;
    nbdkit-sparse | nbdkit-zstd)
      nbdkit -f -U "$sock" memory size="$swap_size" allocator="${kind#nbdkit-}" >"$log" 2>&1 &
      server=$!
      pids+=("$server")
      wait_sockets "$log" "$sock"
      ;;
    qsd-vhost)
      # A raw sparse file on tmpfs: the disk is memory, as the RAM servers' disks are, and
      # the guest's discards punch holes in it.
      if [ -z "$shm" ]; then
        if [ "$(stat -f -c %T "$work")" = tmpfs ]; then
          shm=$work/shm
          mkdir "$shm"
        else
          [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] ||
            die "$work is not on a tmpfs, nor is /dev/shm: nowhere to put qemu-storage-daemon's disk"
          shm=$(mktemp -d /dev/shm/vm-swap.XXXXXX)
        fi
      fi
      qsd_file=$shm/swap.raw
      rm -f "$qsd_file"
      truncate -s "$swap_size" "$qsd_file"
      qemu-storage-daemon \
        --blockdev "driver=file,node-name=disk,filename=$qsd_file,discard=unmap" \
        --export "type=vhost-user-blk,id=exp0,node-name=disk,addr.type=unix,addr.path=$sock,writable=on,num-queues=1,logical-block-size=4096" \
        >"$log" 2>&1 &
      server=$!
      pids+=("$server")
      wait_sockets "$log" "$sock"
      ;;
    file)
      rm -f "$work/swap.raw"
      truncate -s "$swap_size" "$work/swap.raw"
      drive="file=$work/swap.raw,format=raw,if=virtio,cache=none,discard=unmap"
      ;;
    zram) swap=zram ;;
    guest-ram) swap=brd ;;
  esac
  [ -z "$server" ] || [ "$vhost" = 1 ] || drive="file=nbd+unix:///?socket=$sock,format=raw,if=virtio,cache=none,discard=unmap"
  if [ "$kind" = ztier-restart ]; then
    # QEMU's NBD client holds requests and dials again for up to a minute when the server
    # goes away.
    drive="file.driver=nbd,file.server.type=unix,file.server.path=$sock,file.reconnect-delay=60,format=raw,if=virtio,cache=none,discard=unmap"
  fi
  local restarts=0 server_cpu_before=0

  local accel=(-accel tcg) machine=pc guest_mib=$ram guest_args=""
  if [ "$kind" = guest-ram ]; then
    # The RAM disk's pages are the guest's: it gets them on top of its RAM, and the cgroup
    # keeps the workload to what it would have without them.
    guest_mib=$((ram + mib + 64))
    guest_args="vmswap.brd_mib=$((mib + 64)) vmswap.memcg=$floor_memcg"
  fi
  [ "$kvm" = 0 ] || accel=(-accel kvm)
  # vhost-user: the server reaches the guest's virtqueues and buffers itself, so the guest's
  # RAM is a memfd QEMU shares with it.
  [ "$vhost" = 0 ] || machine=pc,memory-backend=mem
  local qemu=(qemu-system-x86_64 -nodefaults -machine "$machine" "${accel[@]}" -m "$guest_mib" -smp 1
    -display none -monitor "unix:$work/$kind.monitor,server=on,wait=off"
    -serial "file:$console" -no-reboot -no-shutdown
    -kernel "$kernel" -initrd "$work/initrd.gz"
    -append "console=ttyS0 panic=-1 quiet loglevel=3 transparent_hugepage=never vmswap.swap=$swap vmswap.mib=$mib vmswap.touches=$touches vmswap.watchdog=$((timeout / 2))${guest_args:+ $guest_args}"
    -drive "file=$work/corpus.raw,format=raw,if=none,id=corpus,readonly=on"
    -device "virtio-blk-pci,drive=corpus")
  if [ -n "$drive" ] && [ "$iothread" = 1 ]; then
    qemu+=(-object "iothread,id=io0" -drive "${drive/if=virtio/if=none,id=swap}"
      -device "virtio-blk-pci,drive=swap,iothread=io0")
  elif [ -n "$drive" ]; then
    qemu+=(-drive "$drive")
  fi
  if [ "$vhost" = 1 ]; then
    # After the corpus disk, so the guest names it vdb. QEMU dials the socket again every
    # second while the server is away (reconnect-ms), holding the guest's requests.
    qemu+=(-object "memory-backend-memfd,id=mem,size=${ram}M,share=on"
      -chardev "socket,id=vub0,path=$sock,reconnect-ms=1000"
      -device "vhost-user-blk-pci,chardev=vub0,num-queues=1")
  fi
  : >"$console"
  local t0=$SECONDS
  "${qemu[@]}" >"$work/$kind.qemu.log" 2>&1 &
  local vm=$!
  pids+=("$vm")
  # Wait for the guest's end line (QEMU stays up after the guest powers off), sampling the
  # server's RSS and, for ztier, its statistics at the peak.
  local peak_rss=0 r peak_orig=0 st="" orig store_peak=0 peak_shmem=0 peak_file=0 f
  until grep -q '^VMSWAP-END' "$console"; do
    if ! kill -0 "$vm" 2>/dev/null; then
      echo "vm-swap: QEMU exited before the guest finished" >&2
      cat "$work/$kind.qemu.log" "$console" >&2
      break
    fi
    if grep -q 'Kernel panic' "$console"; then
      echo "vm-swap: the guest's kernel panicked" >&2
      break
    fi
    if [ $((SECONDS - t0)) -ge "$timeout" ]; then
      echo "vm-swap: the guest did not finish in $timeout s" >&2
      local served=""
      [ "$kind" = "${kind#ztier}" ] || served=$sock
      dump_hang "$work/$kind.monitor" "$served"
      break
    fi
    if [ -n "$store" ]; then
      r=$(rss_kib "$store")
      [ "${r:-0}" -le "$store_peak" ] || store_peak=$r
    fi
    if [ -n "$server" ]; then
      r=$(rss_kib "$server")
      if [ -n "$qsd_file" ]; then
        # qemu-storage-daemon's disk is its tmpfs file: what it holds counts with its RSS.
        f=$(blocks_kib "$qsd_file")
        [ "$f" -le "$peak_file" ] || peak_file=$f
        r=$((${r:-0} + f))
      fi
      [ "${r:-0}" -le "$peak_rss" ] || peak_rss=$r
      r=$(shmem_kib "$server")
      [ "${r:-0}" -le "$peak_shmem" ] || peak_shmem=$r
      if [ "$kind" != "${kind#ztier}" ]; then
        st=$("$ztier" stat --socket "$sock" 2>/dev/null | grep -E '^(mm_stat|io_stat|bd_stat|policy|server|vhost-user-blk) ') || true
        orig=$(awk '$1 == "mm_stat" { print $2 }' <<<"$st")
        [ "${orig:-0}" -le "$peak_orig" ] || peak_orig=$orig
      fi
      # Mid-workload, once: stopped (its state saved) and started again from the state.
      if [ "$restartable" = 1 ] && [ "$restarts" = 0 ] && [ "${orig:-0}" -ge $((64 << 20)) ]; then
        echo "vm-swap: restarting ztier serve with ${orig} bytes stored"
        server_cpu_before=$(cpu_seconds "$server") # (not what saving its state then takes)
        # NBD's restart stops it with SIGINT, vhost-user's with SIGTERM (both save the state).
        if [ "$vhost" = 1 ]; then stop "$server" TERM; else stop "$server" INT; fi
        "$ztier" "${args[@]}" >>"$log" 2>&1 &
        server=$!
        pids+=("$server")
        wait_sockets "$log" "$sock" "$sock.ctl"
        restarts=1
      fi
    fi
    sleep 0.5
  done
  local wall=$((SECONDS - t0)) qemu_cpu server_cpu=0 vmline
  qemu_cpu=$(cpu_seconds "$vm")
  stop "$vm" TERM
  sed -e 's/\r$//' -e 's/^/  guest| /' "$console" | grep -v '^  guest| *$' || true
  vmline=$(grep -a '^VMSWAP ' "$console" | tr -d '\r' || true)
  if [ -z "$vmline" ] || ! grep -q '^VMSWAP-END rc=0' "$console"; then
    echo "vm-swap: $kind: the guest failed" >&2
    failed=1
  fi
  # The guest's kernel log, as the guest read it (scripts/vm/init): block and swap I/O
  # errors the console's loglevel hid.
  local io_errors
  io_errors=$(grep -a '^guest io errors: ' "$console" | tr -d '\r' | awk '{ print $4 }' | tail -n 1)
  if [ "${io_errors:-missing}" != 0 ]; then
    echo "vm-swap: $kind: the guest's kernel logged ${io_errors:-missing (no report)} block or swap I/O errors" >&2
    failed=1
  fi
  # Whether the guest's watchdog (scripts/vm/init) found the guest not finished at half the
  # time-out: it showed where the guest waited, and read each of its disks once.
  local watchdog=0
  if grep -q '^vmswap: the guest has not finished' "$console"; then
    watchdog=1
    echo "vm-swap: $kind: the guest still ran at half the time-out; what its watchdog found is above" >&2
  fi
  local host_mem extra=""
  if [ -n "$server" ]; then
    r=$(rss_kib "$server")
    [ -z "$qsd_file" ] || r=$((${r:-0} + $(blocks_kib "$qsd_file")))
    [ "${r:-0}" -le "$peak_rss" ] || peak_rss=$r
    server_cpu=$(awk -v a="$server_cpu_before" -v b="$(cpu_seconds "$server")" 'BEGIN { printf "%.2f", a + b }')
    host_mem=$(mib_of "$peak_rss")
    extra="server_rss_end_mib=$(mib_of "$r")"
    [ "$vhost" = 0 ] || extra+=" server_shmem_peak_mib=$(mib_of "$peak_shmem")"
  fi
  case $kind in
    ztier*)
      extra+=" compressor=$compressor restarts=$restarts"
      [ "$restartable" = 0 ] || extra+=" states_loaded=$(grep -c 'state loaded' "$log" || true)"
      # After the workload exited and swapoff: what the discards left.
      st=$("$ztier" stat --socket "$sock" | grep -E '^(mm_stat|io_stat|bd_stat|policy|server|vhost-user-blk) ')
      while read -r l; do echo "  ztier stat| $l"; done <<<"$st"
      extra+=" $(awk -v peak="$peak_orig" '
        $1 == "mm_stat" { printf "orig_peak_mib=%.1f orig_end_mib=%.1f mem_used_max_mib=%.1f mem_used_end_mib=%.1f ", peak / 1048576, $2 / 1048576, $6 / 1048576, $4 / 1048576 }
        $1 == "io_stat" { printf "failed_reads=%d failed_writes=%d discarded_pages=%d ", $2, $3, $5 }
        $1 == "bd_stat" { printf "bd_count=%d bd_reads=%d bd_writes=%d ", $2, $3, $4 }
        $1 == "policy" { for (i = 2; i < NF; i++) if ($i == "written" && $(i + 1) ~ /^back/) wb = $(i - 1)
                         printf "policy_written_back=%d ", wb }
        $1 == "server" { for (i = 1; i <= NF; i++) { if ($i == "requests,") req = $(i - 1); if ($i == "written,") w = $(i - 2); if ($i ~ /^read,?$/) r = $(i - 1) }
                         printf "nbd_requests=%d nbd_written_mib=%.1f nbd_read_mib=%.1f ", req, w / 1048576, r / 1048576 }
        $1 == "vhost-user-blk" { for (i = 2; i <= NF; i++) { v = $(i - 1); gsub(/[(),]/, "", v)
                                   if ($i == "connections") c = v; if ($i == "ended") pe = v; if ($i == "requests,") req = v
                                   if ($i == "device") de = v; if ($i == "refused,") rf = v; if ($i == "unsupported,") un = v
                                   if ($i == "unanswerable,") ua = v; if ($i == "bad") bh = v }
                                 printf "vhost_connections=%d vhost_protocol_errors=%d vhost_requests=%d vhost_device_errors=%d vhost_refused=%d vhost_unsupported=%d vhost_unanswerable=%d vhost_bad_heads=%d", c, pe, req, de, rf, un, ua, bh }' <<<"$st")"
      stop "$server" INT
      ;;
    nbdkit*) stop "$server" ;;
    qsd-vhost)
      extra+=" tmpfs_file_peak_mib=$(mib_of "$peak_file") tmpfs_file_end_mib=$(mib_of "$(blocks_kib "$qsd_file")")"
      stop "$server"
      rm -f "$qsd_file"
      ;;
    file)
      host_mem=0
      extra="file_blocks_mib=$(mib_of "$(du -k "$work/swap.raw" | cut -f1)")"
      ;;
    guest-ram)
      host_mem=0
      extra="guest_ram_mib=$guest_mib floor_memcg_mib=$floor_memcg"
      ;;
    zram)
      # mm_stat: orig compr mem_used_total mem_limit mem_used_max ...
      host_mem=$(grep -a '^guest zram mm_stat:' "$console" | awk '{ printf "%.1f", $8 / 1048576 }')
      extra="zram_orig_end_mib=$(grep -a '^guest zram mm_stat:' "$console" | awk '{ printf "%.1f", $4 / 1048576 }')"
      ;;
  esac
  [ -z "$store" ] || {
    extra+=" store_peak_rss_mib=$(mib_of "$store_peak") store_rss_end_mib=$(mib_of "$(rss_kib "$store")")"
    stop "$store"
  }
  # Host CPU per page the guest swapped (in or out), microseconds.
  local per_page
  per_page=$(awk -v s="$server_cpu" -v q="$qemu_cpu" -v line="$vmline" 'BEGIN {
    n = split(line, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); v[kv[1]] = kv[2] }
    pages = v["pswpin"] + v["pswpout"]
    if (pages > 0) printf "cpu_us_per_page=%.1f server_cpu_us_per_page=%.2f", (s + q) * 1e6 / pages, s * 1e6 / pages }')
  local line
  line="RESULT swap=$kind wall_s=$wall ${vmline#VMSWAP } guest_io_errors=${io_errors:-missing} guest_watchdog=$watchdog host_mem_mib=${host_mem:-0} server_cpu_s=$server_cpu qemu_cpu_s=$qemu_cpu $per_page $extra"
  echo "$line"
  [ -z "$results" ] || echo "$line" >>"$results"
  table+=("$line")
}

for kind in "${kinds[@]}"; do
  echo "== $kind"
  run "$kind"
done

field() { tr ' ' '\n' <<<"$1" | awk -F= -v k="$2" '$1 == k { print $2 }'; }
echo
printf '%-19s %8s %8s %8s %10s %10s %8s %8s %9s %9s %8s %8s %4s %6s\n' swap "total s" "touch s" \
  "verify s" "swapin p50" "swapin p99" pswpout pswpin "host MiB" "server s" "QEMU s" "us/page" bad ioerr
for line in "${table[@]}"; do
  printf '%-19s %8s %8s %8s %8sus %8sus %8s %8s %9s %9s %8s %8s %4s %6s\n' "$(field "$line" swap)" \
    "$(field "$line" total_s)" "$(field "$line" touch_s)" "$(field "$line" verify_s)" \
    "$(field "$line" swapin_p50_us)" "$(field "$line" swapin_p99_us)" "$(field "$line" pswpout)" \
    "$(field "$line" pswpin)" "$(field "$line" host_mem_mib)" "$(field "$line" server_cpu_s)" \
    "$(field "$line" qemu_cpu_s)" "$(field "$line" cpu_us_per_page)" "$(field "$line" mismatches)" \
    "$(field "$line" guest_io_errors)"
  [ "$(field "$line" mismatches)" = 0 ] || failed=1
done
exit "$failed"
