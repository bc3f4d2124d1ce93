#!/bin/bash
# shellcheck disable=SC2317 # (start_NAME and work_NAME are called by name)
# Captures the shared corpora's three programs over time, each in a cgroup of its own, for
# the far tier's judgement (docs/far-tier.md): `ztier capture --cgroup --every 10s --for
# 14m` of each; judge them with `ztier bench --trace --promotion-target ... --corpus
# OUT/NAME.pages.zst`.
#
#   scripts/capture-programs.sh OUT [postgres] [python] [cc1]   (all three by default, at once)
#
# - postgres: PostgreSQL (the newest installed; the corpus's was 15) after `pgbench -i -s 20` and pg_prewarm (shared_buffers 256 MB,
#   data on /dev/shm), pgbench from outside the cgroup at 300 transactions a second with 4
#   clients, two GROUP BY queries every 2 minutes.
# - python: CPython holding the Debian package index, dependency maps, a word counter, a JSON
#   dump and parsed AppStream YAML, as the python corpus's program did, then working as an
#   index service: a minute of dependency closures over a hot set drifting through the names
#   (a bounded cache), one list parsed again, the maps rebuilt, a new JSON dump every third
#   round (scripts/capture-programs-python.py).
# - cc1: gcc's cc1 (the corpus's was GCC 12) compiling the SQLite amalgamation again and again (-O2, -O3, -Os, -O2 -g);
#   the source from $SQLITE_C, else libsqlite3-sys's bundled copy in ~/.cargo/registry
#   (`cargo fetch` of any crate with libsqlite3-sys and the `bundled` feature brings it).
#
# Needs root (cgroups, ptrace), a cgroup v2 hierarchy, ztier on PATH (or $ZTIER), and for
# each program its packages: PostgreSQL (with pg_prewarm, in postgresql's contrib), gcc,
# python3 with PyYAML, lz4, and apt's package lists in /var/lib/apt/lists.
set -euo pipefail

out=${1:?usage: $0 OUT [postgres] [python] [cc1]}
shift
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=(postgres python cc1)
ztier=${ZTIER:-ztier}
minutes=${MINUTES:-14}
secs=$((minutes * 60))
# The programs work on 15 s past the recording, so its last epoch finds them running.
work_secs=$((secs + 15))
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)

command -v "$ztier" > /dev/null || { echo "no $ztier (set ZTIER)" >&2; exit 1; }
# The field after " - " is the filesystem type; the fifth, the mount point.
cgroup2=$(awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break } $(i + 1) == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
[ -n "$cgroup2" ] || { echo "no cgroup v2 hierarchy mounted" >&2; exit 1; }
cgroup_of() { echo "$cgroup2/ztier-capture-$1"; }

run_in() { # CGROUP COMMAND...: runs COMMAND in CGROUP
    local cg=$1
    shift
    mkdir -p "$cg"
    # shellcheck disable=SC2016 # ($$ is the inner shell's)
    bash -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$cg" "$@"
}

pg_bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2> /dev/null | sort -V | tail -1 || true)
pg_data=/dev/shm/ztier-capture-pgdata
start_postgres() {
    [ -x "$pg_bin/postgres" ] || { echo "postgres: PostgreSQL is not installed" >&2; exit 1; }
    rm -rf "$pg_data"
    mkdir -p "$pg_data"
    chown postgres "$pg_data"
    su postgres -c "$pg_bin/initdb -D $pg_data -A trust" > /dev/null
    cat >> "$pg_data/postgresql.conf" <<EOF
shared_buffers = 256MB
unix_socket_directories = '/dev/shm'
listen_addresses = ''
shared_preload_libraries = 'pg_prewarm'
EOF
    run_in "$(cgroup_of postgres)" su postgres -c \
        "$pg_bin/pg_ctl -D $pg_data -l /dev/shm/ztier-capture-pg.log -w start" > /dev/null
    # su's PAM session may move it elsewhere (a systemd host's user slice).
    grep -q ztier-capture-postgres "/proc/$(head -1 "$pg_data/postmaster.pid")/cgroup" || {
        echo "postgres: the postmaster is not in $(cgroup_of postgres) (su moved it?)" >&2
        exit 1
    }
    pgbench -h /dev/shm -U postgres -i -s 20 postgres > /dev/null 2>&1
    psql -h /dev/shm -U postgres -q -c "create extension pg_prewarm" \
        -c "select pg_prewarm('pgbench_accounts')" > /dev/null
}
work_postgres() {
    for _ in $(seq 1 $((secs / 120))); do
        sleep 120
        psql -h /dev/shm -U postgres -q \
            -c "select bid, count(*), sum(abalance) from pgbench_accounts group by bid" \
            -c "select aid % 97, avg(abalance) from pgbench_accounts group by 1 order by 2 desc limit 5" \
            > /dev/null
    done &
    pgbench -h /dev/shm -U postgres -c 4 -j 2 -R 300 -T "$work_secs" postgres > "$out/postgres.pgbench" 2>&1
    wait
}

start_python() {
    rm -f /dev/shm/ztier-capture-python.stop
    run_in "$(cgroup_of python)" python3 "$here/capture-programs-python.py" \
        /dev/shm/ztier-capture-python.stop > "$out/python.log" 2>&1 &
    local service=$!
    until grep -q ready "$out/python.log" 2> /dev/null; do
        kill -0 "$service" 2> /dev/null || {
            echo "python: the program ended before it was ready ($out/python.log):" >&2
            tail -5 "$out/python.log" >&2
            exit 1
        }
        sleep 1
    done
}
work_python() { sleep "$work_secs"; touch /dev/shm/ztier-capture-python.stop; }

sqlite_c=${SQLITE_C:-$(find ~/.cargo/registry/src -path '*/libsqlite3-sys-*/sqlite3/sqlite3.c' 2> /dev/null | sort -V | tail -1 || true)}
start_cc1() {
    command -v gcc > /dev/null || { echo "cc1: gcc is not installed" >&2; exit 1; }
    [ -f "$sqlite_c" ] || { echo "cc1: no sqlite3.c (set SQLITE_C)" >&2; exit 1; }
    rm -f /dev/shm/ztier-capture-cc1.stop
    # shellcheck disable=SC2016 # (the loop's variables are the inner shell's)
    run_in "$(cgroup_of cc1)" bash -c '
        while [ ! -e /dev/shm/ztier-capture-cc1.stop ]; do
            for f in -O2 -O3 -Os "-O2 -g"; do
                [ -e /dev/shm/ztier-capture-cc1.stop ] && break
                gcc $f -c "$0" -o /dev/shm/ztier-capture-sqlite3.o
            done
        done' "$sqlite_c" &
    sleep 2
}
work_cc1() { sleep "$work_secs"; touch /dev/shm/ztier-capture-cc1.stop; }

# On any way out: this run's own jobs ended, its programs told to stop, PostgreSQL stopped,
# the cgroups removed once empty (python ends at its round's end, a compile at its end).
cleanup() {
    # shellcheck disable=SC2046 # (the job pids are words)
    kill $(jobs -p) 2> /dev/null || true
    for p in "${programs[@]}"; do
        case $p in
            python | cc1) touch "/dev/shm/ztier-capture-$p.stop" ;;
            postgres)
                if [ -d "$pg_data" ]; then
                    su postgres -c "$pg_bin/pg_ctl -D $pg_data -m fast stop" > /dev/null 2>&1 || true
                    rm -rf "$pg_data"
                fi
                ;;
        esac
    done
    for p in "${programs[@]}"; do
        local cg
        cg=$(cgroup_of "$p")
        [ -d "$cg" ] || continue
        # cgroupfs files read as size 0: look at the content.
        for _ in $(seq 1 1200); do grep -q . "$cg/cgroup.procs" || break; sleep 0.1; done
        rmdir "$cg" 2> /dev/null || echo "left behind: $cg (its processes still run)" >&2
    done
}
trap cleanup EXIT

for p in "${programs[@]}"; do
    case $p in
        postgres | python | cc1) "start_$p" ;;
        *) echo "no such program: $p (postgres, python, cc1)" >&2; exit 1 ;;
    esac
done
captures=()
for p in "${programs[@]}"; do
    "$ztier" capture --cgroup "$(cgroup_of "$p")" --every 10s --for "${minutes}m" \
        -o "$out/$p.pages.zst" > "$out/$p.capture.txt" &
    captures+=($!)
done
for p in "${programs[@]}"; do "work_$p" & done
status=0
for c in "${captures[@]}"; do wait "$c" || status=1; done
wait || true
exit $status
