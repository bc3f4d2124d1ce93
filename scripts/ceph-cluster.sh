#!/usr/bin/env bash
# A throwaway Ceph cluster on this machine, for the tests, scripts/ceph-bench.sh and anyone
# trying ztier's far tier on Ceph: one mon, one mgr, N bluestore OSDs on sparse files,
# everything on 127.0.0.1 with cephx on, an RBD pool with one image or more, each exported
# over NBD by qemu-storage-daemon (librbd, from qemu-block-extra) on one Unix socket.
# Everything lives in DIR: configuration, keys, daemons' data and logs, the sockets.
#
#   ceph-cluster.sh up DIR [--osds N] [--size S] [--replicas R] [--pg-num P]
#                   [--images NAME[,NAME...]] [--image-size S] [--secure]
#                                   make and start it; prints each image's NBD URI
#                                   (--secure: msgr2's secure mode, the wire encrypted, on
#                                   every connection: daemons and clients refuse crc mode)
#   ceph-cluster.sh down DIR        kill every daemon it started, remove DIR
#   ceph-cluster.sh uri DIR [NAME]  the NBD URI of an image (default: the first)
#   ceph-cluster.sh conf DIR        the ceph.conf path (ceph -c, rados -c, rbd -c)
#   ceph-cluster.sh osd-stop|osd-cont|osd-kill DIR N   SIGSTOP, SIGCONT or SIGKILL osd.N
#   ceph-cluster.sh osd-start DIR N                    start osd.N again, wait until up
#   ceph-cluster.sh osd-state DIR N                    "up" or "down", as the mon says
#   ceph-cluster.sh wait-osd DIR N up|down [SECONDS]   until the mon says so
#   ceph-cluster.sh export-kill|export-start|export-restart DIR [EXPORT=IMAGE,...]
#                                   SIGKILL the NBD export, start it again, or both;
#                                   started with a map, an export serves another image
#   ceph-cluster.sh wait-clean DIR [SECONDS]           until every PG is active+clean
#
# Defaults: 2 OSDs of 8G (sparse), replicas min(N, 3), 32 PGs, one image "img" of 1G.
# A daemon that fails to start makes `up` fail at once with its log's errors, not a
# timeout, and stop the daemons it had started.
#
# Settings, and why (each met as a problem done by hand):
# - keyrings per section: a `keyring` line in [global] hides the mon's own;
# - client admin sockets named with $pid: clients started at once collide on one name;
# - `bluestore block path` outside the OSD's directory: it must not be the OSD's own
#   `block` link; bluestore on a sparse file (memstore never gives memory back and blocks
#   when full);
# - `mon data avail warn/crit` low: the defaults fire on a full-ish disk;
# - `mon osd min down reporters = 1`, heartbeat grace 10 s: with every OSD on one host a
#   hung OSD is otherwise never marked down, and with the default grace (20 s) it takes
#   24-28 s, too near the client's 30 s timeout;
# - PG autoscaling off: a pool resized under a running test re-peers it;
# - images without exclusive-lock (layering, striping): with it a restarted export waits
#   for the killed one's watch to time out before it may write;
# - images striped in 64 KiB units over 16 objects: with the default (4 MiB objects, no
#   striping) the 64 KiB segments a read-back reads ahead together all sit in one object,
#   so one PG on one OSD serves them one after another;
# - the export with cache.direct=on: librbd's cache off, so a write is acknowledged once
#   every replica has it (ztier sends no flush after a writeback).
set -euo pipefail

die() {
  echo "ceph-cluster: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

for tool in ceph ceph-mon ceph-mgr ceph-osd ceph-authtool monmaptool rbd qemu-storage-daemon; do
  command -v "$tool" >/dev/null || die "$tool is not installed (bash scripts/setup.sh installs it)"
done

[ $# -ge 2 ] || usage
cmd=$1
dir=$2
shift 2
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
conf=$dir/ceph.conf

# ceph and rbd against this cluster, as client.admin, never waiting forever.
cephc() { timeout 60 ceph -c "$conf" --connect-timeout 30 "$@"; }
rbdc() { timeout 60 rbd -c "$conf" "$@"; }

# The pid of daemon NAME if it is running and is this cluster's (its command line names
# DIR: a pid reused by another process is left alone); nothing otherwise.
pid_of() {
  local file=$dir/run/$1.pid pid cmdline
  [ -f "$file" ] || return 0
  pid=$(<"$file")
  # Read whole, then matched: no pipe into `grep -q`, whose early exit can fail the pipeline
  # (pipefail) and make a running daemon look gone.
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 0
  if [[ $cmdline == *"$dir/"* ]]; then
    echo "$pid"
  fi
}

# The errors in a Ceph log before any crash dump (the dump repeats the log).
ceph_errors() {
  [ -s "$1" ] || return 0
  sed '/--- begin dump of recent events ---/,$d' "$1" |
    grep -E '^[^ ]+ [0-9a-f]+ +-1 |ceph_abort_msg|FAILED ceph_assert' | tail -n 8 || true
}

# Says why daemon NAME is not running, from its logs: its errors before any crash dump,
# else the start of its stderr, else the end of the log. The export's librbd logs as a
# client of its own (client.ztier.PID.log): a librbd abort leaves its stderr empty.
why_not_running() {
  local name=$1 log=$dir/log/$1.log out=$dir/log/$1.out errors="" pid client
  errors=$(ceph_errors "$log")
  if [ -z "$errors" ] && [ "$name" = export ] && [ -f "$dir/run/export.pid" ]; then
    pid=$(<"$dir/run/export.pid")
    client=$dir/log/client.ztier.$pid.log
    errors=$(ceph_errors "$client")
    [ -z "$errors" ] || log=$client
  fi
  [ -n "$errors" ] || errors=$(grep -v '^ *$' "$out" 2>/dev/null | head -n 15 || true)
  [ -n "$errors" ] || errors=$(tail -n 15 "$log" 2>/dev/null || true)
  [ -n "$errors" ] || errors="(nothing in its logs: it exited or was killed without a word)"
  echo "ceph-cluster: $name is not running; from its log ($log, $out):" >&2
  echo "$errors" >&2
}

why() {
  why_not_running "$1"
  exit 1
}

# Starts daemon NAME (the rest: its command line), detached, its output in log/NAME.out.
start_daemon() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$dir/log/$name.out" 2>&1 &
  local pid=$!
  disown "$pid" # (no "Killed" from this shell when it is stopped)
  echo "$pid" >"$dir/run/$name.pid"
  # Until the fork has exec'd: before, its command line is this script's, which
  # pid_of would take for a process of another.
  while kill -0 "$pid" 2>/dev/null && [ -z "$(pid_of "$name")" ]; do sleep 0.01; done
}

# Waits up to SECONDS for CHECK (a command) to succeed while daemon NAME lives.
wait_for() {
  local name=$1 seconds=$2 what=$3
  shift 3
  local end=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ -n "$(pid_of "$name")" ] || why "$name"
    [ $SECONDS -lt $end ] || die "$what: not after ${seconds} s (logs in $dir/log)"
    sleep 0.5
  done
}

# Runs a command, its output shown only if it fails.
quiet() {
  local out
  out=$("$@" 2>&1) || { echo "$out" >&2; return 1; }
}

osd_state() {
  local line
  line=$(cephc osd dump 2>/dev/null | grep "^osd\.$1 ") || { echo "unknown"; return; }
  case $line in *" up "*) echo up ;; *) echo down ;; esac
}

osd_is() { [ "$(osd_state "$1")" = "$2" ]; }

# Every PG of every pool active+clean (counted against the pools' pg_num: the mgr's report
# lags behind a new pool).
all_clean() {
  local want stat clean
  want=$(cephc osd dump | awk '$1 == "pool" { for (i = 1; i < NF; i++) if ($i == "pg_num") n += $(i + 1) } END { print n + 0 }')
  stat=$(cephc pg stat -f json)
  clean=$(grep -o '"name":"active+clean","num":[0-9]*' <<<"$stat" | grep -o '[0-9]*$' || echo 0)
  [ "$want" -gt 0 ] && [ "$clean" = "$want" ] && grep -q "\"num_pgs\":${want}[,}]" <<<"$stat"
}

images() { tr ',' '\n' <"$dir/images"; }

uri_of() { echo "nbd+unix:///$1?socket=$dir/nbd.sock"; }

# Starts the export: each image under its own name, or as MAP says (EXPORT=IMAGE,...: an
# export name given another image, as a mistaken restart would).
export_start() {
  local map=${1:-} args=() name image
  rm -f "$dir/nbd.sock"
  for name in $(images); do
    image=$name
    if [[ ,$map, =~ ,$name=([A-Za-z0-9_-]+), ]]; then image=${BASH_REMATCH[1]}; fi
    args+=(--blockdev "driver=rbd,node-name=$name,pool=rbd,image=$image,user=ztier,conf=$conf,cache.direct=on,discard=unmap")
    args+=(--export "type=nbd,id=export-$name,node-name=$name,name=$name,writable=on")
  done
  local try
  for try in 1 2; do
    start_daemon export qemu-storage-daemon \
      --nbd-server "addr.type=unix,addr.path=$dir/nbd.sock,max-connections=16" "${args[@]}"
    # Once, on a fresh machine's first cluster, the export died at its start with nothing
    # in its stderr (its logs went with the test's directory): said, and started once more.
    if [ "$try" -eq 1 ] && ! exported; then
      why_not_running export
      # Whether the process is gone or only looked gone (its state, if it is still there).
      local pid
      pid=$(<"$dir/run/export.pid")
      echo "ceph-cluster: export pid $pid: $(ps -o stat=,args= -p "$pid" 2>/dev/null || echo 'no such process')" >&2
      echo "ceph-cluster: starting the export again" >&2
      kill_daemon export
      continue
    fi
    break
  done
  wait_for export 60 "the NBD export" test -S "$dir/nbd.sock"
}

# True once the export listens, false as soon as it is not running (up to 60 s).
exported() {
  local end=$((SECONDS + 60))
  until [ -S "$dir/nbd.sock" ]; do
    [ -n "$(pid_of export)" ] || return 1
    [ $SECONDS -lt $end ] || return 0
    sleep 0.2
  done
}

kill_daemon() {
  local pid
  pid=$(pid_of "$1")
  [ -z "$pid" ] && return 0
  kill -KILL "$pid" 2>/dev/null || true
  # Until it is gone or a zombie (dead: its sockets and files closed; reaped by whoever
  # adopted it, in its own time).
  while [ -r "/proc/$pid/stat" ] && [ "$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null)" != Z ]; do
    sleep 0.05
  done
}

start_osd() {
  start_daemon "osd.$1" ceph-osd -c "$conf" -i "$1" -f
}

# After a failed `up`: every daemon it started stopped, the logs kept.
up_failed() {
  local status=$? f
  [ "$status" -ne 0 ] || return 0
  for f in "$dir"/run/*.pid; do
    [ -e "$f" ] || continue
    f=${f##*/}
    kill_daemon "${f%.pid}"
  done
  echo "ceph-cluster: up failed; its daemons are stopped, the logs are in $dir/log" \
    "(ceph-cluster.sh down $dir removes it all)" >&2
}

up() {
  local osds=2 size=8G replicas="" pg_num=32 image_list=img image_size=1G mode="crc secure"
  while [ $# -gt 0 ]; do
    case $1 in
    --secure)
      mode=secure
      shift
      continue
      ;;
    --osds) osds=$2 ;;
    --size) size=$2 ;;
    --replicas) replicas=$2 ;;
    --pg-num) pg_num=$2 ;;
    --images) image_list=$2 ;;
    --image-size) image_size=$2 ;;
    *) usage ;;
    esac
    shift 2
  done
  [[ $osds =~ ^[1-9][0-9]*$ ]] || die "--osds $osds: a count of OSDs"
  [ -n "$replicas" ] || replicas=$((osds < 3 ? osds : 3))
  [ "$replicas" -le "$osds" ] || die "--replicas $replicas: more than the $osds OSDs"
  local bytes
  bytes=$(numfmt --from=iec "$size") || die "--size $size: a size (8G)"
  [ ! -e "$conf" ] || die "$dir already holds a cluster (ceph-cluster.sh down $dir)"
  mkdir -p "$dir/run" "$dir/log" "$dir/mon.a" "$dir/mgr.x"
  trap up_failed EXIT
  tr ',' '\n' <<<"$image_list" | grep -qvE '^[A-Za-z0-9_-]+$' && die "--images $image_list: names of letters, digits, - and _"
  echo "$image_list" >"$dir/images"

  # A free port for the mon (the OSDs and the mgr take theirs from 6800 up, as usual).
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 20000))
    [ -n "$(ss -Hltn "sport = :$port")" ] || break
  done

  local fsid
  fsid=$(uuidgen)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$port]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv6 = false
ms cluster mode = $mode
ms service mode = $mode
ms client mode = $mode
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $dir/run
pid file = $dir/run/\$name.daemon-pid
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
crash dir = $dir/crash
mon data avail warn = 2
mon data avail crit = 1
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon osd min down reporters = 1
mon osd adjust heartbeat grace = false
osd heartbeat interval = 2
osd heartbeat grace = 10
osd crush chooseleaf type = 0
osd pool default size = $replicas
osd pool default min size = 1
osd pool default pg autoscale mode = off
rbd default features = layering

[mon]
mon data = $dir/\$name
keyring = $dir/mon.keyring

[mgr]
mgr data = $dir/\$name
keyring = $dir/\$name/keyring

[osd]
osd data = $dir/\$name
keyring = $dir/\$name/keyring
osd objectstore = bluestore
bluestore block path = $dir/\$name.block
bluestore block create = true
bluestore block size = $bytes
osd memory target = 1073741824

[client]
admin socket = $dir/run/\$name.\$pid.asok
log file = $dir/log/\$name.\$pid.log

[client.admin]
keyring = $dir/admin.keyring

[client.ztier]
keyring = $dir/ztier.keyring
EOF

  {
    ceph-authtool "$dir/mon.keyring" --create-keyring --gen-key -n mon. --cap mon 'allow *'
    ceph-authtool "$dir/admin.keyring" --create-keyring --gen-key -n client.admin \
      --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *'
    ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/admin.keyring"
    monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$port]" "$dir/monmap"
  } >"$dir/log/keys.out" 2>&1 || { cat "$dir/log/keys.out" >&2; exit 1; }
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/mon.keyring" \
    >"$dir/log/mon.a.out" 2>&1 || { echo "ceph-mon --mkfs failed:" >&2; cat "$dir/log/mon.a.out" >&2; exit 1; }
  start_daemon mon.a ceph-mon -c "$conf" -i a -f
  wait_for mon.a 60 "the mon answering" cephc mon stat

  cephc auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' >"$dir/mgr.x/keyring"
  start_daemon mgr.x ceph-mgr -c "$conf" -i x -f

  local i uuid key id
  for ((i = 0; i < osds; i++)); do
    uuid=$(uuidgen)
    key=$(ceph-authtool --gen-print-key)
    printf '{"cephx_secret": "%s"}\n' "$key" >"$dir/osd-secret.json"
    id=$(cephc osd new "$uuid" -i "$dir/osd-secret.json")
    rm -f "$dir/osd-secret.json"
    mkdir -p "$dir/osd.$id"
    ceph-authtool "$dir/osd.$id/keyring" --create-keyring -n "osd.$id" --add-key "$key" >/dev/null
    ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$uuid" --no-mon-config \
      >"$dir/log/osd.$id.out" 2>&1 || why "osd.$id"
    start_osd "$id"
  done
  for ((i = 0; i < osds; i++)); do
    wait_for "osd.$i" 120 "osd.$i up" osd_is "$i" up
  done

  quiet cephc osd pool create rbd "$pg_num" "$pg_num" replicated
  quiet cephc osd pool set rbd size "$replicas" --yes-i-really-mean-it
  quiet cephc osd pool set rbd min_size 1
  rbdc pool init rbd
  cephc auth get-or-create client.ztier mon 'profile rbd' osd 'profile rbd pool=rbd' \
    mgr 'profile rbd pool=rbd' >"$dir/ztier.keyring"
  local name
  for name in $(images); do
    rbdc create --size "$image_size" --image-feature layering,striping \
      --stripe-unit 65536 --stripe-count 16 "rbd/$name"
  done
  wait_for mgr.x 180 "every PG active+clean" all_clean
  export_start
  trap - EXIT
  for name in $(images); do uri_of "$name"; done
}

down() {
  [ -f "$conf" ] || [ -d "$dir/run" ] || die "$dir holds no cluster"
  local f
  for f in "$dir"/run/*.pid; do
    [ -e "$f" ] || continue
    f=${f##*/}
    kill_daemon "${f%.pid}"
  done
  rm -rf "$dir"
}

osd_pid() {
  local pid
  pid=$(pid_of "osd.$1")
  [ -n "$pid" ] || die "osd.$1 is not running"
  echo "$pid"
}

case $cmd in
up) up "$@" ;;
down) down ;;
uri) uri_of "${1:-$(images | head -n 1)}" ;;
conf) echo "$conf" ;;
osd-stop) kill -STOP "$(osd_pid "$1")" ;;
osd-cont) kill -CONT "$(osd_pid "$1")" ;;
osd-kill) kill_daemon "osd.$1" ;;
osd-start)
  [ -z "$(pid_of "osd.$1")" ] || die "osd.$1 is running"
  start_osd "$1"
  wait_for "osd.$1" 120 "osd.$1 up" osd_is "$1" up
  ;;
osd-state) osd_state "$1" ;;
wait-osd)
  end=$((SECONDS + ${3:-120}))
  until [ "$(osd_state "$1")" = "$2" ]; do
    [ $SECONDS -lt $end ] || die "osd.$1 not $2 after ${3:-120} s"
    sleep 0.5
  done
  ;;
export-kill) kill_daemon export ;;
export-start) export_start "${1:-}" ;;
export-restart)
  kill_daemon export
  export_start "${1:-}"
  ;;
wait-clean) wait_for mgr.x "${1:-180}" "every PG active+clean" all_clean ;;
*) usage ;;
esac
