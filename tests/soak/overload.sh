#!/bin/sh
# overload.sh - the multi-node launcher on an overloaded host (make soak;
# issue 46). Two hosts made of network namespaces (tests/multihost/hosts.sh),
# 2 ranks each, one `kaitian run --nnodes 2` per host with
# KAITIAN_RUN_LOST_MS at its default; the machine loaded on purpose: 4 busy
# processes per CPU and one writing 256 MiB to disk (fsync) in a loop.
# For DURATION seconds, jobs of soak_prog (small and large allreduces, every
# collective, communicators split; every result checked) run one after the
# other: each must end with exit 0 on both nodes, every rank SOAK_OK, and
# node 0 must never declare node 1 lost nor slow. Node 0's heartbeat figures
# of each job (KAITIAN_DEBUG=INFO) are summed up: gaps, longest, the worst
# job's 99th percentile. Then, load still on, a job whose node 1 is killed
# whole (every process of its namespace, SIGKILL): node 0 must name node 1
# within 1 s (its heartbeat connection closed) and exit non-zero.
# Everything it starts is stopped, the namespaces and files removed.
# Args: KAITIAN_CLI SOAK_PROG [DURATION seconds, default 600]
# Exit: 0 passed, 1 failed, 77 skipped (no network namespaces).
set -u
KT=${1:?usage: $0 KAITIAN_CLI SOAK_PROG [DURATION]}
PROG=${2:?usage}
DURATION=${3:-600}
NP=4
# One job: short enough that the run ends near DURATION even on a loaded
# host (about 10-30 s each at load 10 on 2 CPUs); OVERLOAD_JOB overrides.
JOB=${OVERLOAD_JOB:-"small=2000 large=2 large_bytes=1048576 mix=3 churn=5"}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kt_overload.XXXXXX")
LOADPIDS=""
. "$(dirname "$0")/../multihost/hosts.sh"

stop_load() {
  for p in $LOADPIDS; do kill -9 "$p" 2>/dev/null; done
  for p in $LOADPIDS; do wait "$p" 2>/dev/null; done
  LOADPIDS=""
}
trap 'rm -rf "$TMP"' EXIT
hosts_start overload "$NP" 2 "$TMP"
trap 'rc=$?; stop_load; hosts_down || rc=1; rm -rf "$TMP"; exit $rc' EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*" >&2
  for f in "$TMP"/err.*; do [ -f "$f" ] && { echo "---- $(basename "$f")" >&2; grep -v 'KAITIAN INFO' "$f" | tail -n 20 >&2; }; done
  exit 1
}

# The load: 4 busy processes per CPU, and a disk writer.
ncpu=$(nproc)
i=0
while [ $i -lt $((4 * ncpu)) ]; do
  sh -c 'while :; do :; done' &
  LOADPIDS="$LOADPIDS $!"
  i=$((i + 1))
done
sh -c 'while :; do dd if=/dev/zero of="$0/disk" bs=1M count=256 conv=fsync 2>/dev/null; rm -f "$0/disk"; done' "$TMP" &
LOADPIDS="$LOADPIDS $!"
echo "overload: $((4 * ncpu)) busy processes on $ncpu CPUs and a disk writer (256 MiB, fsync, in a loop); jobs for ${DURATION} s"

secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
start_job() { # start_job NAME ARGS...: both nodes in the background
  name=$1
  shift
  for k in 0 1; do
    hosts_exec "$k" env KAITIAN_JOB_SECRET="$secret" KAITIAN_DEBUG=INFO \
      "$KT" run -n $((NP / 2)) --nnodes 2 --node-rank "$k" --master "$HOSTS_NET.1:29400" "$PROG" "$@" \
      >"$TMP/out.$k" 2>"$TMP/err.$k" &
    echo $! >"$TMP/pid.$k"
  done
}

t0=$(date +%s)
jobs=0 gaps=0 longest=0 worst_p99=0
while [ $(($(date +%s) - t0)) -lt "$DURATION" ]; do
  tj=$(date +%s)
  # shellcheck disable=SC2086
  start_job run $JOB
  rc0=0 rc1=0
  wait "$(cat "$TMP/pid.0")" || rc0=$?
  wait "$(cat "$TMP/pid.1")" || rc1=$?
  jobs=$((jobs + 1))
  [ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "job $jobs: launchers exited $rc0 and $rc1"
  ! grep -q 'stopped answering\|slow, not gone' "$TMP/err.0" || fail "job $jobs: node 0 declared node 1 lost or slow"
  [ "$(cat "$TMP"/out.* | grep -c SOAK_OK)" = "$NP" ] || fail "job $jobs: not every rank printed SOAK_OK"
  line=$(grep 'heartbeats of the other' "$TMP/err.0" | tail -n 1)
  [ -n "$line" ] || fail "job $jobs: no heartbeat summary from node 0"
  n=$(echo "$line" | sed -n 's/.*nodes: \([0-9]*\) gaps.*/\1/p')
  mx=$(echo "$line" | sed -n 's/.*longest \([0-9]*\) ms.*/\1/p')
  p99=$(echo "$line" | sed -n 's/.*percentile \([0-9]*\) ms.*/\1/p')
  gaps=$((gaps + n))
  [ "$mx" -gt "$longest" ] && longest=$mx
  [ "$p99" -gt "$worst_p99" ] && worst_p99=$p99
  echo "job $jobs: $(($(date +%s) - tj)) s, heartbeats: $n gaps, longest $mx ms, 99th percentile $p99 ms; load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "overload: $jobs jobs in $(($(date +%s) - t0)) s, no node declared lost or slow; heartbeat gaps: $gaps, longest $longest ms, worst job's 99th percentile $worst_p99 ms"

# A node killed under the same load: named within 1 s.
start_job kill small=100000000
i=0
until [ "$(ip netns pids "$(hosts_ns 0)" | wc -l)" -ge 3 ] && [ "$(ip netns pids "$(hosts_ns 1)" | wc -l)" -ge 3 ]; do
  i=$((i + 1)); [ $i -gt 600 ] && fail "the last job did not start"; sleep 0.1
done
sleep 3
tk=$(date +%s%3N)
for p in $(ip netns pids "$(hosts_ns 1)"); do kill -9 "$p" 2>/dev/null; done
while ! grep -q 'stopped answering' "$TMP/err.0"; do
  [ $(($(date +%s%3N) - tk)) -lt 40000 ] || break
  sleep 0.02
done
tn=$(date +%s%3N)
wait "$(cat "$TMP/pid.0")"
rc0=$?
wait "$(cat "$TMP/pid.1")" 2>/dev/null
l=$(grep -m1 'stopped answering' "$TMP/err.0")
[ -n "$l" ] || fail "node 0 did not name the killed node 1 within 40 s"
echo "node 1 killed: named after $((tn - tk)) ms: $l"
[ "$rc0" != 0 ] || fail "node 0 exited 0 after node 1 was killed"
[ $((tn - tk)) -le 1000 ] || fail "node 1 named $((tn - tk)) ms after it was killed (limit 1000)"
stop_load
for k in 0 1; do
  left=$(hosts_pids "$k")
  [ -z "$left" ] || fail "processes left on host $k: $left"
done
echo PASSED
